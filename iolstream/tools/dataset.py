"""``Dataset``, the one in-memory type every data source of the tools returns (the built-in sets of
``builtin_datasets``, a CSV file by ``csv_file``, the drifting streams of ``drift``): features, targets, task and
classes, checked when made."""

from __future__ import annotations

import dataclasses

import numpy as np

TASKS = ("classification", "regression")


class DataError(ValueError):
    """A data set cannot be loaded; the one-line message names the file, column and row."""


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: comparing numpy fields with == is ambiguous
class Dataset:
    """A data set held in memory, rows in stream order.

    Attributes
    ----------
    name : str
        Built-in name (see ``DATASETS``) or the CSV file name.
    X : ndarray of shape (n_rows, n_features)
        float64, C-contiguous.
    y : ndarray of shape (n_rows,) or (n_rows, n_outputs)
        Class labels (ints or strings) for classification; float64 targets for
        regression, 2-D for multi-output regression.
    task : {"classification", "regression"}
    classes : tuple or None
        Declared classes, sorted, as python ints or strs; every label in ``y``
        is one of them, but a rare class may be absent from a short sample.
        None for regression.
    feature_names : tuple of str of length n_features
    description : str
        One line: source and shape.
    schema : FeatureSchema or None
        Rows encoded from named fields (docs/design.md §11): the schema they were encoded by (X holds NaN
        where a number was missing; ``feature_names`` are its columns). None: X is numbers as given.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    task: str
    classes: tuple | None
    feature_names: tuple[str, ...]
    description: str
    schema: object = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DataError(f"{self.name}: task must be one of {TASKS}, got {self.task!r}")
        if self.X.ndim != 2 or self.X.dtype != np.float64 or not self.X.flags.c_contiguous:
            raise DataError(f"{self.name}: X must be a C-contiguous 2-D float64 array")
        if self.y.ndim not in (1, 2) or len(self.y) != len(self.X):
            raise DataError(f"{self.name}: y has shape {self.y.shape}, X has {self.X.shape[0]} rows")
        if len(self.feature_names) != self.X.shape[1]:
            raise DataError(
                f"{self.name}: {len(self.feature_names)} feature names for {self.X.shape[1]} columns"
            )
        if self.schema is not None and self.schema.width != self.X.shape[1]:
            raise DataError(
                f"{self.name}: the schema encodes {self.schema.width} columns, X has {self.X.shape[1]}"
            )
        if (self.classes is None) != (self.task == "regression"):
            raise DataError(f"{self.name}: classes must be given for classification and only then")

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]


def check_count(what: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def head(ds: Dataset, rows: int | None) -> Dataset:
    """The first ``rows`` rows of ``ds`` (all of it if rows is None or larger)."""
    if rows is None or rows >= ds.n_rows:
        return ds
    return Dataset(
        name=ds.name,
        X=np.ascontiguousarray(ds.X[:rows]),
        y=ds.y[:rows].copy(),
        task=ds.task,
        classes=ds.classes,
        feature_names=ds.feature_names,
        description=f"{ds.description}; first {rows} rows",
        schema=ds.schema,
    )


def classification(name: str, X, y, feature_names, source: str) -> Dataset:
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.asarray(y)
    classes = tuple(np.unique(y).tolist())
    return Dataset(
        name=name,
        X=X,
        y=y,
        task="classification",
        classes=classes,
        feature_names=tuple(feature_names),
        description=f"{source}: {X.shape[0]} rows, {X.shape[1]} features, {len(classes)} classes",
    )
