"""Built-in data streams for ``iolstream evaluate`` and ``iolstream produce``.

Every loader returns a :class:`Dataset`: a float64 feature matrix, the targets,
the task and (for classification) the declared class list. Rows come in their
shipped order; shuffling, scaling and batching are the evaluator's job. This
module is pure: no printing, no network. scikit-learn and river are optional
dependencies (``pip install iolstream[data]``) imported only by the loaders
that need them.

Names (see ``DATASETS``): ``segment`` (river), ``iris``, ``wine``, ``digits``,
``breast_cancer`` (scikit-learn), ``poker`` (UCI Poker Hand, generated) and
``friedman`` (scikit-learn ``make_friedman1``). Any CSV file with a header row
loads through :func:`load_csv`.

Examples
--------
>>> from iolstream.tools.datasets import load
>>> ds = load("iris")
>>> ds.X.shape, ds.task, ds.classes
((150, 4), 'classification', (0, 1, 2))
>>> poker = load("poker", rows=1000, seed=7)
>>> poker.X.shape, poker.feature_names[:4], poker.classes[-1]
((1000, 10), ('S1', 'C1', 'S2', 'C2'), 9)
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os

import numpy as np

from iolstream.tools import drift

__all__ = ["DATASETS", "DataError", "Dataset", "load", "load_csv", "make_poker", "poker_hand_labels"]

DATASETS: dict[str, str] = {
    "segment": "river ImageSegments (UCI Statlog image segmentation): 2310 rows, 18 features, 7 classes",
    "iris": "scikit-learn iris: 150 rows, 4 features, 3 classes",
    "wine": "scikit-learn wine: 178 rows, 13 features, 3 classes",
    "digits": "scikit-learn digits (8x8 images): 1797 rows, 64 features, 10 classes",
    "breast_cancer": "scikit-learn breast cancer (Wisconsin): 569 rows, 30 features, 2 classes",
    "poker": "UCI Poker Hand, generated: 1,025,010 rows by default, 10 features, 10 classes",
    "friedman": "scikit-learn make_friedman1 regression: 20,000 rows by default, 10 features, noise 1.0",
    **drift.STREAMS,  # drifting streams, for evaluate --order stream
}

POKER_N_ROWS = 1_025_010  # UCI poker-hand-training-true (25,010) + poker-hand-testing (1,000,000)
FRIEDMAN_N_ROWS = 20_000
POKER_FEATURES = tuple(f"{kind}{i}" for i in range(1, 6) for kind in ("S", "C"))  # S1, C1, ..., S5, C5
POKER_CLASSES = tuple(range(10))
CSV_MAX_CLASSES = 50  # task="auto": an integer target with more distinct values is regression

_TASKS = ("classification", "regression")


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
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    task: str
    classes: tuple | None
    feature_names: tuple[str, ...]
    description: str

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise DataError(f"{self.name}: task must be one of {_TASKS}, got {self.task!r}")
        if self.X.ndim != 2 or self.X.dtype != np.float64 or not self.X.flags.c_contiguous:
            raise DataError(f"{self.name}: X must be a C-contiguous 2-D float64 array")
        if self.y.ndim not in (1, 2) or len(self.y) != len(self.X):
            raise DataError(f"{self.name}: y has shape {self.y.shape}, X has {self.X.shape[0]} rows")
        if len(self.feature_names) != self.X.shape[1]:
            raise DataError(f"{self.name}: {len(self.feature_names)} feature names for {self.X.shape[1]} columns")
        if (self.classes is None) != (self.task == "regression"):
            raise DataError(f"{self.name}: classes must be given for classification and only then")

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]


# --------------------------------------------------------------------------- load


def load(
    name: str,
    *,
    rows: int | None = None,
    seed: int = 0,
    sort_cards: bool = True,
    n_rows: int | None = None,
) -> Dataset:
    """Load a built-in data set by name.

    Parameters
    ----------
    name : str
        One of ``DATASETS``.
    rows : int, optional
        Keep only the first ``rows`` rows (no shuffling here).
    seed : int, default 0
        Generator seed for ``poker`` and ``friedman``; ignored by shipped sets.
    sort_cards : bool, default True
        ``poker`` only: order the five cards of each hand (see :func:`make_poker`).
    n_rows : int, optional
        Rows to generate for ``poker`` (default 1,025,010; the same cap as
        ``rows``) and ``friedman`` (default 20,000; ``rows`` then keeps a
        prefix). Not accepted by shipped sets.

    Returns
    -------
    Dataset

    Raises
    ------
    DataError
        Unknown name (the message lists the valid ones), bad ``rows`` or
        ``n_rows``, or a missing optional dependency.
    """
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}; valid names: {', '.join(DATASETS)}")
    rows = _check_count("rows", rows)
    n_rows = _check_count("n_rows", n_rows)
    if name == "poker":
        caps = [c for c in (rows, n_rows) if c is not None]
        return make_poker(min(caps) if caps else POKER_N_ROWS, seed=seed, sort_cards=sort_cards)
    if name == "friedman":
        ds = _load_friedman(FRIEDMAN_N_ROWS if n_rows is None else n_rows, seed)
    elif name in drift.STREAMS:
        ds = _load_drift(name, drift.N_ROWS if n_rows is None else n_rows, seed)
    elif n_rows is not None:
        raise DataError(f"n_rows applies only to the generated sets (poker, friedman, the drift streams), not {name!r}; use rows")
    elif name == "segment":
        ds = _load_segment()
    else:
        ds = _load_sklearn(name)
    return _head(ds, rows)


def _load_drift(name: str, n_rows: int, seed: int) -> Dataset:
    X, y, names = drift.make(name, n_rows, seed)
    if name == "friedman-drift":
        return Dataset(name=name, X=X, y=y, task="regression", classes=None, feature_names=names, description=DATASETS[name])
    classes = tuple(int(c) for c in np.unique(y))
    return Dataset(name=name, X=X, y=y, task="classification", classes=classes, feature_names=names, description=DATASETS[name])


def _check_count(what: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _head(ds: Dataset, rows: int | None) -> Dataset:
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
    )


def _classification(name: str, X, y, feature_names, source: str) -> Dataset:
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


def _load_sklearn(name: str) -> Dataset:
    try:
        from sklearn import datasets as skd
    except ImportError as exc:  # optional dependency
        raise DataError(f"data set {name!r} needs scikit-learn: pip install 'iolstream[data]'") from exc
    bunch = getattr(skd, f"load_{name}")()
    y = bunch.target.astype(np.int64)
    return _classification(name, bunch.data, y, bunch.feature_names, f"scikit-learn {name}")


def _load_segment() -> Dataset:
    """River's ImageSegments, read straight from its zipped CSV (feature order = file header order)."""
    try:
        from river.datasets import ImageSegments
    except ImportError as exc:  # optional dependency
        raise DataError("data set 'segment' needs river: pip install 'iolstream[data]'") from exc
    import io
    import zipfile

    path = ImageSegments().path
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            text = archive.read(archive.namelist()[0]).decode("utf-8")
    else:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    ds = _parse_csv(io.StringIO(text), "category", task="classification", rows=None, label=os.path.basename(path))
    description = f"river ImageSegments: {ds.n_rows} rows, {ds.n_features} features, {len(ds.classes)} classes"
    return dataclasses.replace(ds, name="segment", description=description)


def _load_friedman(n_rows: int, seed: int) -> Dataset:
    try:
        from sklearn.datasets import make_friedman1
    except ImportError as exc:  # optional dependency
        raise DataError("data set 'friedman' needs scikit-learn: pip install 'iolstream[data]'") from exc
    X, y = make_friedman1(n_samples=n_rows, n_features=10, noise=1.0, random_state=seed)
    return Dataset(
        name="friedman",
        X=np.ascontiguousarray(X, dtype=np.float64),
        y=np.asarray(y, dtype=np.float64),
        task="regression",
        classes=None,
        feature_names=tuple(f"x{i}" for i in range(10)),  # sklearn's X[:, i]; only x0..x4 enter y
        description=f"scikit-learn make_friedman1 (noise 1.0, seed {seed}): {n_rows} rows, 10 features",
    )


# --------------------------------------------------------------------------- poker


def make_poker(n_rows: int = POKER_N_ROWS, *, seed: int = 0, sort_cards: bool = True) -> Dataset:
    """Generate poker hands laid out exactly like the UCI Poker Hand data set.

    Each row is five distinct cards drawn uniformly from a 52-card deck. Card i
    gives two features, ``Si`` (suit 1-4) and ``Ci`` (rank 1-13: 1 = Ace,
    11 = Jack, 12 = Queen, 13 = King), in UCI column order S1, C1, ..., S5, C5.
    Labels follow UCI's ten classes (see :func:`poker_hand_labels`).

    Parameters
    ----------
    n_rows : int, default 1,025,010
    seed : int, default 0
        The first k rows do not depend on ``n_rows``: a longer stream extends
        a shorter one with the same seed.
    sort_cards : bool, default True
        Order the five cards within each row by ascending rank (Ace = 1 first),
        ties by ascending suit. False keeps the (uniformly random) draw order.
        Labels do not depend on the order.

    Returns
    -------
    Dataset
        ``X`` of shape (n_rows, 10), ``y`` of shape (n_rows,) with int64
        labels 0-9, ``classes`` = (0, ..., 9) even if a rare class is absent.
    """
    n_rows = _check_count("n_rows", n_rows)
    rng = np.random.default_rng(seed)
    # Card code k in 0..51, rank-major: rank = k // 4 + 1, suit = k % 4 + 1, so
    # sorting codes sorts by (rank, suit). Draw i picks the j-th of the 52 - i
    # cards still in the deck (j uniform), then steps j past every card already
    # drawn, in ascending order. One row-major call: row r uses only the first
    # draws of the stream, so a prefix of a longer stream is the shorter one.
    picks = rng.integers(0, np.array([52, 51, 50, 49, 48]), size=(n_rows, 5)).astype(np.int8)
    cards = np.empty_like(picks)
    cards[:, 0] = picks[:, 0]
    for i in range(1, 5):
        drawn = np.sort(cards[:, :i], axis=1)
        k = picks[:, i].copy()
        for j in range(i):
            k += k >= drawn[:, j]
        cards[:, i] = k
    if sort_cards:
        cards.sort(axis=1)
    suits = cards % 4 + 1
    ranks = cards // 4 + 1
    X = np.empty((n_rows, 10), dtype=np.float64)
    X[:, 0::2] = suits
    X[:, 1::2] = ranks
    order = "sorted by (rank, suit)" if sort_cards else "in draw order"
    source = f"UCI Poker Hand layout, generated (seed {seed}, cards {order})"
    return Dataset(
        name="poker",
        X=X,
        y=_hand_labels(suits, ranks).astype(np.int64),
        task="classification",
        classes=POKER_CLASSES,
        feature_names=POKER_FEATURES,
        description=f"{source}: {n_rows} rows, 10 features, 10 classes",
    )


def poker_hand_labels(X) -> np.ndarray:
    """UCI Poker Hand class of each row.

    0 nothing, 1 one pair, 2 two pairs, 3 three of a kind, 4 straight, 5 flush,
    6 full house, 7 four of a kind, 8 straight flush, 9 royal flush. A straight
    is five consecutive ranks; the Ace plays high (10-J-Q-K-A, which suited is
    a royal flush, 9) or low (A-2-3-4-5, suited a straight flush, 8), but a
    straight never wraps around (Q-K-A-2-3 is nothing).

    Parameters
    ----------
    X : array-like of shape (n_rows, 10)
        Columns S1, C1, ..., S5, C5: suit 1-4, rank 1-13 (1 = Ace), five
        distinct cards per row, in any order.

    Returns
    -------
    labels : ndarray of shape (n_rows,), int8
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != 10:
        raise DataError(f"poker hands must have shape (n_rows, 10), got {X.shape}")
    suits, ranks = X[:, 0::2], X[:, 1::2]
    if np.any(X != np.round(X)) or np.any((suits < 1) | (suits > 4)) or np.any((ranks < 1) | (ranks > 13)):
        raise DataError("poker hands need integer suits 1-4 and ranks 1-13")
    suits, ranks = suits.astype(np.int8), ranks.astype(np.int8)
    codes = np.sort((ranks - 1) * 4 + (suits - 1), axis=1)
    bad = np.flatnonzero((codes[:, 1:] == codes[:, :-1]).any(axis=1))
    if bad.size:
        raise DataError(f"poker hand in row {bad[0] + 1} repeats a card")
    return _hand_labels(suits, ranks)


def _hand_labels(suits: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Kernel of :func:`poker_hand_labels`: (n, 5) valid suits and ranks -> (n,) int8, no validation."""
    r = np.sort(ranks, axis=1)
    same = r[:, 1:] == r[:, :-1]  # (n, 4): neighbours of equal rank
    n_same = same.sum(axis=1)  # 0 distinct, 1 pair, 2 two pair / trips, 3 full house / quads
    three = same[:, :-1] & same[:, 1:]  # (n, 3): three equal ranks in a row
    four = (three[:, :-1] & three[:, 1:]).any(axis=1)
    three = three.any(axis=1)
    flush = (suits == suits[:, :1]).all(axis=1)  # distinct cards of one suit have distinct ranks
    ace_high = (r[:, 0] == 1) & (r[:, 1] == 10) & (r[:, 4] == 13) & (n_same == 0)  # A 10 J Q K
    straight = (n_same == 0) & ((r[:, 4] - r[:, 0] == 4) | ace_high)  # covers A-2-3-4-5; no wrap
    conditions = [  # the first true condition wins
        straight & flush & ace_high,  # 9 royal flush
        straight & flush,  # 8 straight flush
        four,  # 7 four of a kind
        n_same == 3,  # 6 full house (3 equal neighbours, not 4 in a row)
        flush,  # 5 flush
        straight,  # 4 straight
        three,  # 3 three of a kind (2 equal neighbours, in a row)
        n_same == 2,  # 2 two pairs
        n_same == 1,  # 1 one pair
    ]
    return np.select(conditions, np.arange(9, 0, -1, dtype=np.int8), default=0).astype(np.int8)


# --------------------------------------------------------------------------- CSV


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
    if task not in ("auto", *_TASKS):
        raise DataError(f"task must be 'auto', 'classification' or 'regression', got {task!r}")
    rows = _check_count("rows", rows)
    label = os.fspath(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return _parse_csv(fh, target, task=task, rows=rows, label=label)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{label}: cannot read: {exc}") from exc


def _parse_csv(fh, target: str, *, task: str, rows: int | None, label: str) -> Dataset:
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

    X = _parse_features(features, feature_names, label)
    y, task = _parse_target(targets, target, task, label)
    n, k = X.shape
    if task == "classification":
        return _classification(os.path.basename(label), X, y, feature_names, f"CSV {label}, target {target!r}")
    return Dataset(
        name=os.path.basename(label),
        X=X,
        y=y,
        task="regression",
        classes=None,
        feature_names=feature_names,
        description=f"CSV {label}, target {target!r}: {n} rows, {k} features, regression",
    )


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
        return np.array(values), "classification"
    y = np.array(numbers, dtype=np.float64)
    integer = bool(np.all(y == np.round(y))) and bool(np.all(np.abs(y) < 2**53))
    if task == "auto":
        few = integer and np.unique(y).size <= CSV_MAX_CLASSES
        task = "classification" if few else "regression"
    if task == "regression":
        return y, task
    return (y.astype(np.int64) if integer else np.array(values)), task


def _to_float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _is_number(value: str) -> bool:
    return _to_float(value.strip()) is not None
