"""A user's CSV file with a header row (``--csv PATH --target COLUMN``): read as a ``dataset.Dataset`` of numbers, or,
where a cell is text or blank, as text columns for a feature schema (``records`` encodes them).

Every cell is checked: an empty, non-numeric or non-finite value, a repeated column, a ragged row or a
missing target column is a ``DataError`` naming the file, the column and the row.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

import numpy as np

from iolstream.tools.dataset import TASKS, DataError, Dataset, check_count, classification

CSV_MAX_CLASSES = 50  # task="auto": an integer target with more distinct values is regression
MIXED_TARGET_TEXTS = 0.05  # task="auto": numbers but for this share of texts: refused (see below)


def load_csv(path, target: str, *, task: str = "auto", rows: int | None = None) -> Dataset:
    """Load a CSV file with a header row; every column but ``target`` is a feature.

    Parameters
    ----------
    path : str or os.PathLike
    target : str
        Name of the target column.
    task : {"auto", "classification", "regression"}, default "auto"
        "auto" picks classification if the target is non-numeric, or
        integer-valued with at most 50 distinct values; regression otherwise.
    rows : int, optional
        Read only the first ``rows`` data rows.

    Returns
    -------
    Dataset
        ``X`` of shape (n_rows, n_columns - 1). For classification ``y`` holds
        int64 labels if every target is an integer, else the target strings
        (whitespace stripped); regression ``y`` is float64 of shape (n_rows,).

    Raises
    ------
    DataError
        Unreadable or empty file, no data rows, duplicate column names, a
        missing target column (the message lists the columns), a row with the
        wrong number of cells, a non-numeric, empty, NaN or infinite feature
        cell, an empty target cell or a non-numeric regression target. Row
        numbers in messages count data rows from 1 (the header is line 1).
    """
    if task not in ("auto", *TASKS):
        raise DataError(f"task must be 'auto', 'classification' or 'regression', got {task!r}")
    rows = check_count("rows", rows)
    label = os.fspath(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return parse_csv(fh, target, task=task, rows=rows, label=label)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{label}: cannot read: {exc}") from exc


def parse_csv(fh, target: str, *, task: str, rows: int | None, label: str) -> Dataset:
    feature_names, features, targets = read_cells(fh, target, rows=rows, label=label)
    X = _parse_features(features, feature_names, label)
    y, task = _parse_target(targets, target, task, label)
    n, k = X.shape
    if task == "classification":
        return classification(os.path.basename(label), X, y, feature_names, f"CSV {label}, target {target!r}")
    return Dataset(
        name=os.path.basename(label),
        X=X,
        y=y,
        task="regression",
        classes=None,
        feature_names=feature_names,
        description=f"CSV {label}, target {target!r}: {n} rows, {k} features, regression",
    )


def read_cells(
    fh, target: str, *, rows: int | None, label: str
) -> tuple[tuple[str, ...], list[list[str]], list[str]]:
    """(feature column names, the feature cells of each row as text, the target cells stripped)."""
    reader = csv.reader(fh)
    header = next((line for line in reader if line), None)  # skip leading blank lines
    if header is None:
        raise DataError(f"{label}: empty file, a header row is required")
    header = [name.strip() for name in header]
    if len(set(header)) != len(header):
        dup = next(name for name in header if header.count(name) > 1)
        raise DataError(f"{label}: column {dup!r} appears twice in the header")
    if target not in header:
        if all(_is_number(name) for name in header):
            raise DataError(f"{label}: the first line looks like data, a header row is required")
        if len(header) == 1 and ";" in header[0]:
            raise DataError(
                f"{label}: no target column {target!r}: the header is one column, {header[0]!r}; columns are "
                "separated by commas here (a file written with ';' needs saving with ',')"
            )
        raise DataError(f"{label}: no target column {target!r}; columns: {', '.join(header)}")
    t = header.index(target)
    feature_names = tuple(name for i, name in enumerate(header) if i != t)

    features: list[list[str]] = []
    targets: list[str] = []
    for line in reader:
        if not line:  # blank line
            continue
        if len(line) != len(header):
            where = f"row {len(targets) + 1} (line {reader.line_num})"
            raise DataError(f"{label}: {where} has {len(line)} cells, header has {len(header)}")
        targets.append(line[t].strip())
        del line[t]
        features.append(line)
        if rows is not None and len(targets) == rows:
            break
    if not targets:
        raise DataError(f"{label}: no data rows after the header")
    return feature_names, features, targets


def _parse_features(cells: list[list[str]], names: tuple[str, ...], label: str) -> np.ndarray:
    """Strings (n, k) -> float64 (n, k); any bad cell raises a DataError naming its column and row."""
    if not names:
        return np.empty((len(cells), 0), dtype=np.float64)
    try:  # fast path: numpy parses the whole block at once
        X = np.array(cells, dtype=np.str_).astype(np.float64)
        bad = not np.isfinite(X).all()
    except ValueError:
        bad = True
    if not bad:
        return X
    X = np.empty((len(cells), len(names)), dtype=np.float64)
    for i, row in enumerate(cells, start=1):  # slow path, to name the first bad cell
        for j, (name, cell) in enumerate(zip(names, row)):
            value = cell.strip()
            if not value:
                raise DataError(f"{label}: column {name!r}, row {i}: empty cell")
            try:
                number = float(value)
            except ValueError:
                raise DataError(f"{label}: column {name!r}, row {i}: non-numeric value {value!r}") from None
            if not math.isfinite(number):
                raise DataError(f"{label}: column {name!r}, row {i}: non-finite value {value!r}")
            X[i - 1, j] = number
    return X  # numpy and float() disagreed on some cell; float() is the reference


def _parse_target(values: list[str], name: str, task: str, label: str) -> tuple[np.ndarray, str]:
    """Target strings -> (y, task), resolving task="auto"."""
    numbers = []
    for i, value in enumerate(values, start=1):
        if not value:
            raise DataError(f"{label}: target column {name!r}, row {i}: empty cell")
        number = _to_float(value)
        if number is not None and not math.isfinite(number):
            raise DataError(f"{label}: target column {name!r}, row {i}: non-finite value {value!r}")
        if number is None:
            if task == "regression":
                raise DataError(f"{label}: target column {name!r}, row {i}: non-numeric value {value!r}")
            numbers = None
            break
        numbers.append(number)
    if numbers is None:  # some label is not a number: string classes
        if task == "auto":
            _refuse_numbers_with_a_few_texts(values, name, label)
        return np.array(values), "classification"
    y = np.array(numbers, dtype=np.float64)
    integer = bool(np.all(y == np.round(y))) and bool(np.all(np.abs(y) < 2**53))
    if task == "auto":
        few = integer and np.unique(y).size <= CSV_MAX_CLASSES
        task = "classification" if few else "regression"
    if task == "regression":
        return y, task
    return (y.astype(np.int64) if integer else np.array(values)), task


def _refuse_numbers_with_a_few_texts(values: list[str], name: str, label: str) -> None:
    """task "auto": a target of numbers but for a few texts (at most ``MIXED_TARGET_TEXTS`` of the rows) with more
    distinct values than ``CSV_MAX_CLASSES`` is a number to predict with bad cells, not that many classes:
    DataError naming the texts and the way to take them as classes."""
    texts = [(i, v) for i, v in enumerate(values, start=1) if _to_float(v) is None]
    distinct = len(set(values))
    if len(texts) > MIXED_TARGET_TEXTS * len(values) or distinct <= CSV_MAX_CLASSES:
        return
    named = "; ".join(f"row {i}: {v!r}" for i, v in texts[:3]) + ("; ..." if len(texts) > 3 else "")
    raise DataError(
        f"{label}: target column {name!r}: {len(values) - len(texts)} of {len(values)} values are numbers and "
        f"{len(texts)} are not ({named}): a number to predict with bad cells? fix or drop those rows; "
        f"--task classification takes its {distinct} distinct values as classes"
    )


def _to_float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _is_number(value: str) -> bool:
    return _to_float(value.strip()) is not None


@dataclass(frozen=True, eq=False)
class Table:
    """A CSV read as text, for a feature schema: each feature column's cells, and the parsed target.

    columns : column name -> its cells, in row order (text as in the file)
    y, task, classes : as a Dataset's
    """

    name: str
    columns: dict
    y: np.ndarray
    task: str
    classes: tuple | None
    description: str

    @property
    def n_rows(self) -> int:
        return len(self.y)

    def needs_schema(self) -> bool:
        """Whether some feature cell is not a finite number (text, or blank): then the rows are named fields
        for a schema, not an array of numbers."""
        for cells in self.columns.values():
            try:
                values = np.array(cells, dtype=np.str_).astype(np.float64)
            except ValueError:
                return True
            if not np.isfinite(values).all():
                return True
        return False


def load_table(path, target: str, *, task: str = "auto", rows: int | None = None) -> Table:
    """A CSV with a header row as text columns and its parsed target (``load_csv``'s rules for the target
    and the file; no cell of a feature column is refused here: the schema decides what it must be)."""
    if task not in ("auto", *TASKS):
        raise DataError(f"task must be 'auto', 'classification' or 'regression', got {task!r}")
    rows = check_count("rows", rows)
    label = os.fspath(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            names, cells, targets = read_cells(fh, target, rows=rows, label=label)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{label}: cannot read: {exc}") from exc
    y, task = _parse_target(targets, target, task, label)
    columns = {name: [row[j] for row in cells] for j, name in enumerate(names)}
    classes = tuple(np.unique(y).tolist()) if task == "classification" else None
    kind = f"{len(classes)} classes" if classes is not None else "regression"
    return Table(
        os.path.basename(label),
        columns,
        y,
        task,
        classes,
        f"CSV {label}, target {target!r}: {len(y)} rows, {len(columns)} columns, {kind}",
    )
