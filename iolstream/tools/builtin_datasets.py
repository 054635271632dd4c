"""The built-in data sets by name (``DATASETS``, ``load``), each loaded as a ``dataset.Dataset``, for ``iolstream
evaluate`` and ``iolstream produce``.

Every loader returns a :class:`Dataset`: a float64 feature matrix, the targets,
the task and (for classification) the declared class list. Rows come in their
shipped order; shuffling, scaling and batching are the evaluator's job. This
module is pure: no printing, no network. scikit-learn and river are optional
dependencies (``pip install iolstream[data]``) imported only by the loaders
that need them.

Names (see ``DATASETS``): ``segment`` (river), ``iris``, ``wine``, ``digits``,
``breast_cancer``, ``diabetes`` (regression) (scikit-learn), ``poker`` (UCI Poker Hand, generated) and
``friedman`` (scikit-learn ``make_friedman1``). Any CSV file with a header row
loads through ``tools.csv_file.load_csv``.

Examples
--------
>>> from iolstream.tools.builtin_datasets import load
>>> ds = load("iris")
>>> ds.X.shape, ds.task, ds.classes
((150, 4), 'classification', (0, 1, 2))
>>> poker = load("poker", rows=1000, seed=7)
>>> poker.X.shape, poker.feature_names[:4], poker.classes[-1]
((1000, 10), ('S1', 'C1', 'S2', 'C2'), 9)
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from iolstream.tools import drift
from iolstream.tools.csv_file import parse_csv
from iolstream.tools.dataset import DataError, Dataset, check_count, classification, head

__all__ = ["DATASETS", "DataError", "Dataset", "load", "make_poker", "poker_hand_labels"]

DATASETS: dict[str, str] = {
    "segment": "river ImageSegments (UCI Statlog image segmentation): 2310 rows, 18 features, 7 classes",
    "iris": "scikit-learn iris: 150 rows, 4 features, 3 classes",
    "wine": "scikit-learn wine: 178 rows, 13 features, 3 classes",
    "digits": "scikit-learn digits (8x8 images): 1797 rows, 64 features, 10 classes",
    "breast_cancer": "scikit-learn breast cancer (Wisconsin): 569 rows, 30 features, 2 classes",
    "diabetes": "scikit-learn diabetes (disease progression after one year): 442 rows, 10 features, regression",
    "poker": "UCI Poker Hand, generated: 1,025,010 rows by default, 10 features, 10 classes",
    "friedman": "scikit-learn make_friedman1 regression: 20,000 rows by default, 10 features, noise 1.0",
    **drift.STREAMS,  # drifting streams, for evaluate --order stream
}

POKER_N_ROWS = 1_025_010  # UCI poker-hand-training-true (25,010) + poker-hand-testing (1,000,000)
FRIEDMAN_N_ROWS = 20_000
POKER_FEATURES = tuple(f"{kind}{i}" for i in range(1, 6) for kind in ("S", "C"))  # S1, C1, ..., S5, C5
POKER_CLASSES = tuple(range(10))

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
    rows = check_count("rows", rows)
    n_rows = check_count("n_rows", n_rows)
    if name == "poker":
        caps = [c for c in (rows, n_rows) if c is not None]
        return make_poker(min(caps) if caps else POKER_N_ROWS, seed=seed, sort_cards=sort_cards)
    if name == "friedman":
        ds = _load_friedman(FRIEDMAN_N_ROWS if n_rows is None else n_rows, seed)
    elif name in drift.STREAMS:
        ds = _load_drift(name, drift.N_ROWS if n_rows is None else n_rows, seed)
    elif n_rows is not None:
        raise DataError(
            f"n_rows applies only to the generated sets (poker, friedman, the drift streams), not {name!r}; use rows"
        )
    elif name == "segment":
        ds = _load_segment()
    else:
        ds = _load_sklearn(name)
    return head(ds, rows)


def _load_drift(name: str, n_rows: int, seed: int) -> Dataset:
    X, y, names = drift.make(name, n_rows, seed)
    if name == "friedman-drift":
        return Dataset(
            name=name,
            X=X,
            y=y,
            task="regression",
            classes=None,
            feature_names=names,
            description=DATASETS[name],
        )
    classes = tuple(int(c) for c in np.unique(y))
    return Dataset(
        name=name,
        X=X,
        y=y,
        task="classification",
        classes=classes,
        feature_names=names,
        description=DATASETS[name],
    )


def _load_sklearn(name: str) -> Dataset:
    try:
        from sklearn import datasets as skd
    except ImportError as exc:  # optional dependency
        raise DataError(f"data set {name!r} needs scikit-learn: pip install 'iolstream[data]'") from exc
    bunch = getattr(skd, f"load_{name}")()
    if name == "diabetes":
        return Dataset(
            name=name,
            X=np.asarray(bunch.data, dtype=np.float64),
            y=np.asarray(bunch.target, dtype=np.float64),
            task="regression",
            classes=None,
            feature_names=tuple(bunch.feature_names),
            description=DATASETS[name],
        )
    y = bunch.target.astype(np.int64)
    return classification(name, bunch.data, y, bunch.feature_names, f"scikit-learn {name}")


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
    ds = parse_csv(
        io.StringIO(text), "category", task="classification", rows=None, label=os.path.basename(path)
    )
    description = (
        f"river ImageSegments: {ds.n_rows} rows, {ds.n_features} features, {len(ds.classes)} classes"
    )
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
    n_rows = check_count("n_rows", n_rows)
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
