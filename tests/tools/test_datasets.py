"""Tests for iolstream.tools.builtin_datasets: built-in sets, the poker generator and the CSV loader."""

from collections import Counter
from itertools import chain, combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolstream.tools.builtin_datasets import DATASETS, DataError, Dataset, load, make_poker, poker_hand_labels
from iolstream.tools.csv_file import load_csv

# name -> (n_rows, n_features, n_classes or None for regression), poker at a small size
SHAPES = {
    "segment": (2310, 18, 7),
    "iris": (150, 4, 3),
    "wine": (178, 13, 3),
    "digits": (1797, 64, 10),
    "breast_cancer": (569, 30, 2),
    "diabetes": (442, 10, None),
    "poker": (5000, 10, 10),
    "friedman": (20_000, 10, None),
}

# Exact counts of the C(52, 5) = 2,598,960 five-card hands, classes 0..9.
POKER_COUNTS = [1_302_540, 1_098_240, 123_552, 54_912, 10_200, 5_108, 3_744, 624, 36, 4]
POKER_PROBABILITIES = [
    0.501177,
    0.422569,
    0.047539,
    0.021128,
    0.003925,
    0.001965,
    0.001441,
    0.000240,
    0.0000139,
    0.00000154,
]
N_HANDS = 2_598_960


def _load(name, **kwargs):
    if name == "poker":
        kwargs.setdefault("n_rows", SHAPES["poker"][0])
    return load(name, **kwargs)


# --------------------------------------------------------------------------- built-in sets


def test_names_match_the_shapes_table():
    assert set(DATASETS) == set(SHAPES) | set(DRIFT_SHAPES)


# drift streams (iolstream.tools.drift) -> (n_features, n_classes or None), generated at 3,000 rows here
DRIFT_SHAPES = {
    "hyperplane": (10, 2),
    "sea": (3, 2),
    "agrawal": (9, 2),
    "rbf-drift": (10, 5),
    "friedman-drift": (10, None),
}


@pytest.mark.parametrize("name", list(DRIFT_SHAPES))
def test_drift_streams_are_seeded_and_shaped(name):
    n_features, n_classes = DRIFT_SHAPES[name]
    ds = load(name, n_rows=3000, seed=5)
    assert ds.X.shape == (3000, n_features) and ds.X.dtype == np.float64 and np.isfinite(ds.X).all()
    if n_classes is None:
        assert ds.task == "regression" and ds.y.dtype == np.float64
    else:
        assert ds.task == "classification" and len(ds.classes) == n_classes, f"{name}: classes {ds.classes}"
    again = load(name, n_rows=3000, seed=5)
    assert np.array_equal(ds.X, again.X) and np.array_equal(ds.y, again.y), (
        f"{name}: not reproducible with seed 5"
    )
    other = load(name, n_rows=3000, seed=6)
    assert not np.array_equal(ds.X, other.X), f"{name}: the seed is ignored"


@pytest.mark.parametrize("name", list(SHAPES))
def test_shapes_dtypes_and_classes(name):
    n_rows, n_features, n_classes = SHAPES[name]
    ds = _load(name)
    assert isinstance(ds, Dataset) and ds.name == name
    assert ds.X.shape == (n_rows, n_features)
    assert ds.X.dtype == np.float64 and ds.X.flags.c_contiguous
    assert np.isfinite(ds.X).all()
    assert ds.y.shape == (n_rows,)
    assert len(ds.feature_names) == n_features and all(isinstance(f, str) for f in ds.feature_names)
    assert len(set(ds.feature_names)) == n_features
    assert ds.description and "\n" not in ds.description and str(n_rows) in ds.description.replace(",", "")
    if n_classes is None:
        assert ds.task == "regression" and ds.classes is None and ds.y.dtype == np.float64
        return
    assert ds.task == "classification"
    assert len(ds.classes) == n_classes and list(ds.classes) == sorted(ds.classes)
    assert all(type(c) in (int, str) for c in ds.classes)  # python scalars, not numpy ones
    assert set(np.unique(ds.y).tolist()) <= set(ds.classes)


def test_label_types():
    assert load("segment").classes == ("brickface", "cement", "foliage", "grass", "path", "sky", "window")
    assert load("iris").y.dtype == np.int64
    assert load("poker", rows=10).classes == tuple(range(10))  # all ten even when rare ones are absent


def test_segment_features_keep_the_file_order():
    names = load("segment").feature_names
    assert names[:3] == ("region-centroid-col", "region-centroid-row", "short-line-density-5")
    assert names[-1] == "hue-mean" and "category" not in names


@pytest.mark.parametrize("name", list(SHAPES))
def test_rows_keeps_a_prefix(name):
    full, head = _load(name), _load(name, rows=7)
    assert head.X.shape == (7, full.X.shape[1]) and head.X.flags.c_contiguous
    np.testing.assert_array_equal(head.X, full.X[:7])
    np.testing.assert_array_equal(head.y, full.y[:7])
    assert head.classes == full.classes


def test_rows_larger_than_the_set_returns_everything():
    assert load("iris", rows=10_000).X.shape == (150, 4)


def test_friedman_n_rows_and_seed():
    a, b, c = (load("friedman", n_rows=100, seed=s) for s in (1, 1, 2))
    assert a.X.shape == (100, 10)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(DataError, match="unknown data set 'nope'") as info:
        load("nope")
    for name in DATASETS:
        assert name in str(info.value)


@pytest.mark.parametrize("kwargs", [{"rows": 0}, {"rows": -3}, {"rows": 2.5}, {"n_rows": 0}, {"rows": True}])
def test_bad_counts(kwargs):
    with pytest.raises(DataError, match="positive integer"):
        load("poker", **kwargs)


def test_n_rows_is_refused_for_shipped_sets():
    with pytest.raises(DataError, match="n_rows applies only"):
        load("iris", n_rows=10)


# --------------------------------------------------------------------------- poker rules


def _hand(*cards):
    """One UCI row from cards like "10H", "AS", "QD": rank then suit (H=1, S=2, D=3, C=4 as in UCI)."""
    ranks = {"A": 1, "J": 11, "Q": 12, "K": 13}
    suits = {"H": 1, "S": 2, "D": 3, "C": 4}
    row = []
    for card in cards:
        rank, suit = card[:-1], card[-1]
        row += [suits[suit], ranks.get(rank) or int(rank)]
    return row


@pytest.mark.parametrize(
    ("cards", "label"),
    [
        (("10H", "JH", "QH", "KH", "AH"), 9),  # royal flush: ace high, suited
        (("AS", "KS", "QS", "JS", "10S"), 9),  # same, any order
        (("9C", "10C", "JC", "QC", "KC"), 8),  # straight flush, king high
        (("AD", "2D", "3D", "4D", "5D"), 8),  # ace low straight flush (the "steel wheel")
        (("10H", "JS", "QH", "KH", "AH"), 4),  # ace high straight
        (("AH", "2S", "3H", "4H", "5H"), 4),  # ace low straight
        (("2H", "3S", "4H", "5H", "6H"), 4),
        (("QH", "KS", "AH", "2H", "3H"), 0),  # no wrap-around
        (("KH", "AS", "2H", "3H", "4H"), 0),
        (("JH", "QS", "KH", "AH", "2D"), 0),
        (("QH", "KH", "AH", "2H", "3H"), 5),  # wrap-around suited is only a flush
        (("2C", "4C", "6C", "8C", "10C"), 5),
        (("AH", "AS", "AD", "AC", "KH"), 7),
        (("AH", "AS", "AD", "KC", "KH"), 6),
        (("2H", "2S", "2D", "KC", "AH"), 3),
        (("2H", "2S", "KD", "KC", "AH"), 2),
        (("AH", "AS", "2D", "3C", "4H"), 1),  # a pair beats the A-2-3-4 near-straight
        (("AH", "3S", "5D", "7C", "9H"), 0),
    ],
)
def test_ace_and_hand_rules(cards, label):
    assert poker_hand_labels([_hand(*cards)]).tolist() == [label]


def test_poker_hand_labels_validates():
    with pytest.raises(DataError, match="row 2 repeats a card"):
        poker_hand_labels([_hand("AH", "2H", "3H", "4H", "5H"), _hand("AH", "AH", "3H", "4H", "5H")])
    with pytest.raises(DataError, match="shape"):
        poker_hand_labels(np.ones((3, 8)))
    with pytest.raises(DataError, match="suits 1-4 and ranks 1-13"):
        poker_hand_labels([[5, 1, 1, 2, 1, 3, 1, 4, 1, 5]])


def _naive_label(row):
    """Plain-Python reference for one UCI row, straight from the rule book."""
    suits, ranks = row[0::2], sorted(row[1::2])
    counts = sorted(Counter(ranks).values(), reverse=True)
    flush = len(set(suits)) == 1
    royal = ranks == [1, 10, 11, 12, 13]
    straight = royal or (counts[0] == 1 and ranks[4] - ranks[0] == 4)
    if straight and flush:
        return 9 if royal else 8
    if counts[0] == 4:
        return 7
    if counts[:2] == [3, 2]:
        return 6
    if flush:
        return 5
    if straight:
        return 4
    return {3: 3, 2: 2 if counts[1] == 2 else 1}.get(counts[0], 0)


def _row(cards):
    """Card codes 0..51 (rank-major, the generator's encoding) -> UCI row."""
    return [x for code in cards for x in (code % 4 + 1, code // 4 + 1)]


hands = st.lists(st.integers(0, 51), min_size=5, max_size=5, unique=True)


@settings(max_examples=300, deadline=None)
@given(hands, st.permutations(range(5)), st.permutations([1, 2, 3, 4]))
def test_labels_match_the_reference_and_ignore_order_and_suit_names(cards, order, suit_map):
    row = _row(cards)
    label = poker_hand_labels([row])[0]
    assert label == _naive_label(row)
    shuffled = _row([cards[i] for i in order])
    renamed = [suit_map[v - 1] if i % 2 == 0 else v for i, v in enumerate(row)]
    assert poker_hand_labels([shuffled, renamed]).tolist() == [label, label]


def test_exact_counts_over_all_five_card_hands():
    codes = np.fromiter(chain.from_iterable(combinations(range(52), 5)), dtype=np.int8, count=5 * N_HANDS)
    codes = codes.reshape(N_HANDS, 5)
    X = np.empty((N_HANDS, 10), dtype=np.int8)
    X[:, 0::2] = codes % 4 + 1
    X[:, 1::2] = codes // 4 + 1
    counts = np.bincount(poker_hand_labels(X), minlength=10)
    assert counts.tolist() == POKER_COUNTS
    # the published probabilities are rounded to 3-6 significant figures
    np.testing.assert_allclose(counts / N_HANDS, POKER_PROBABILITIES, rtol=4e-3)


# --------------------------------------------------------------------------- poker generator


def test_sorted_and_unsorted_are_the_same_hands():
    a, b = make_poker(20_000, seed=3, sort_cards=True), make_poker(20_000, seed=3, sort_cards=False)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(poker_hand_labels(b.X), b.y)

    def codes(X):
        return (X[:, 1::2] - 1) * 4 + (X[:, 0::2] - 1)

    np.testing.assert_array_equal(codes(a.X), np.sort(codes(b.X), axis=1))
    # sorted by rank, ties by suit
    assert (np.diff(codes(a.X), axis=1) > 0).all()
    assert not (np.diff(codes(b.X), axis=1) > 0).all()


def test_poker_is_deterministic_in_seed():
    a, b, c = make_poker(1000, seed=5), make_poker(1000, seed=5), make_poker(1000, seed=6)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)


def test_poker_rows_and_n_rows_are_one_cap():
    a = load("poker", rows=50, seed=1)
    b = load("poker", n_rows=50, seed=1)
    c = load("poker", rows=80, n_rows=50, seed=1)
    assert a.X.shape == b.X.shape == c.X.shape == (50, 10)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.X, c.X)


@pytest.fixture(scope="module")
def full_poker():
    return load("poker", seed=0)


def test_full_size_generation(full_poker):
    ds = full_poker  # how fast is the benchmarks' business (iolstream bench), not a timed test's
    n = 1_025_010
    assert ds.X.shape == (n, 10) and ds.y.shape == (n,) and ds.y.dtype == np.int64
    suits, ranks = ds.X[:, 0::2], ds.X[:, 1::2]
    assert suits.min() == 1 and suits.max() == 4 and ranks.min() == 1 and ranks.max() == 13
    codes = np.sort((ranks - 1) * 4 + (suits - 1), axis=1)
    assert (np.diff(codes, axis=1) > 0).all(), "a hand repeats a card"
    # every card equally likely: each of the 52 appears 5n/52 times, binomial spread
    per_card = np.bincount(codes.astype(np.int64).ravel(), minlength=52)
    expected = 5 * n / 52
    assert np.abs(per_card - expected).max() < 5 * np.sqrt(expected)


def test_full_size_class_frequencies(full_poker):
    ds = full_poker
    n = len(ds.y)
    counts = np.bincount(ds.y, minlength=10)
    p = np.array(POKER_COUNTS) / N_HANDS
    sigma = np.sqrt(n * p * (1 - p))
    z = (counts - n * p) / sigma
    assert np.abs(z).max() < 5, f"seed 0: counts {counts.tolist()}, z-scores {np.round(z, 2).tolist()}"


# --------------------------------------------------------------------------- CSV


def _write(tmp_path, text, name="data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_string_target(tmp_path):
    path = _write(tmp_path, "a, b ,label\n1,2.5,cat\n-3, 4e2 ,dog\n0,0, cat\n\n")
    ds = load_csv(path, "label")
    assert ds.name == "data.csv" and ds.task == "classification"
    assert ds.feature_names == ("a", "b")
    np.testing.assert_array_equal(ds.X, [[1, 2.5], [-3, 400], [0, 0]])
    assert ds.X.dtype == np.float64 and ds.X.flags.c_contiguous
    assert ds.y.tolist() == ["cat", "dog", "cat"] and ds.classes == ("cat", "dog")


def test_csv_target_column_anywhere_and_integer_classes(tmp_path):
    path = _write(tmp_path, "y,x1,x2\n2,1,1\n0.0,2,2\n2,3,3\n")
    ds = load_csv(path, "y")
    assert ds.task == "classification" and ds.y.dtype == np.int64
    assert ds.y.tolist() == [2, 0, 2] and ds.classes == (0, 2)
    assert type(ds.classes[0]) is int
    np.testing.assert_array_equal(ds.X, [[1, 1], [2, 2], [3, 3]])


def test_csv_auto_regression(tmp_path):
    floats = _write(tmp_path, "x,y\n1,0.5\n2,1.25\n", "floats.csv")
    ds = load_csv(floats, "y")
    assert ds.task == "regression" and ds.classes is None and ds.y.tolist() == [0.5, 1.25]
    many = _write(tmp_path, "x,y\n" + "".join(f"{i},{i}\n" for i in range(51)), "many.csv")
    assert load_csv(many, "y").task == "regression"  # 51 distinct integers
    fifty = _write(tmp_path, "x,y\n" + "".join(f"{i},{i}\n" for i in range(50)), "fifty.csv")
    assert load_csv(fifty, "y").task == "classification"


def test_csv_task_override_and_rows(tmp_path):
    path = _write(tmp_path, "x,y\n1,1\n2,0\n3,1\n4,7\n")
    reg = load_csv(path, "y", task="regression", rows=2)
    assert reg.task == "regression" and reg.y.dtype == np.float64 and reg.X.shape == (2, 1)
    clf = load_csv(_write(tmp_path, "x,y\n1,0.5\n2,1.5\n", "f.csv"), "y", task="classification")
    assert clf.classes == ("0.5", "1.5")  # non-integer numeric classes keep their text


@pytest.mark.parametrize(
    ("text", "target", "message"),
    [
        ("", "y", "empty file"),
        ("\n\n", "y", "empty file"),
        ("x,y\n", "y", "no data rows"),
        ("x,y\n\n", "y", "no data rows"),
        ("x,y\n1,2\n", "label", "no target column 'label'; columns: x, y"),
        ("1,2\n3,4\n", "y", "header row is required"),
        ("x,x,y\n1,2,3\n", "y", "column 'x' appears twice"),
        ("x,z,y\n1,2,0\n1,oops,1\n", "y", "column 'z', row 2: non-numeric value 'oops'"),
        ("x,z,y\n1,2,0\n1,,1\n", "y", "column 'z', row 2: empty cell"),
        ("x,z,y\n1,2,0\n1,2,1\nnan,2,1\n", "y", "column 'x', row 3: non-finite value 'nan'"),
        ("x,z,y\n1,inf,0\n", "y", "column 'z', row 1: non-finite value 'inf'"),
        ("x,z,y\n1,-Infinity,0\n", "y", "column 'z', row 1: non-finite value '-Infinity'"),
        ("x,z,y\n1,2,0\n1,2\n", "y", r"row 2 \(line 3\) has 2 cells, header has 3"),
        ("x,y\n1,0\n2,\n", "y", "target column 'y', row 2: empty cell"),
        ("x,y\n1,0\n2,nan\n", "y", "target column 'y', row 2: non-finite value 'nan'"),
    ],
)
def test_csv_errors(tmp_path, text, target, message):
    path = _write(tmp_path, text)
    with pytest.raises(DataError, match=message) as info:
        load_csv(path, target)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_csv_regression_target_must_be_numeric(tmp_path):
    path = _write(tmp_path, "x,y\n1,0.5\n2,high\n")
    with pytest.raises(DataError, match="target column 'y', row 2: non-numeric value 'high'"):
        load_csv(path, "y", task="regression")


def test_csv_numbers_with_a_few_texts_are_not_taken_for_classes(tmp_path):
    """task "auto": 97 numbers and 3 texts in the target are a number to predict with bad cells, not 100
    classes (refused, naming the texts and --task classification); --task classification takes them; a target
    of texts with a few numbers, or of few distinct values, stays classes."""
    rows = [f"{i},{i * 1.5:.1f}" for i in range(100)]
    rows[7], rows[20], rows[33] = "7,n/a", "20,abc", "33,?"
    path = _write(tmp_path, "x,y\n" + "\n".join(rows) + "\n")
    message = r"97 of 100 values are numbers and 3 are not \(row 8: 'n/a'; row 21: 'abc'; row 34: '\?'\)"
    with pytest.raises(DataError, match=message):
        load_csv(path, "y")
    assert len(load_csv(path, "y", task="classification").classes) == 100
    few = _write(
        tmp_path, "x,y\n" + "\n".join(f"{i},{i % 3}" for i in range(99)) + "\n1,unknown\n", "few.csv"
    )
    assert load_csv(few, "y").classes == ("0", "1", "2", "unknown")


def test_csv_a_byte_order_mark_and_semicolons(tmp_path):
    """A file saved as Excel's "CSV UTF-8" starts with a byte-order mark: not part of the first column's name.
    A file separated by ';' is named as such, not listed as one column that seems to hold the target."""
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffy,x\n1,0.5\n0,1.5\n".encode())
    assert load_csv(path, "y").feature_names == ("x",)
    with pytest.raises(DataError, match="the header is one column, 'x;y'; columns are separated by commas"):
        load_csv(_write(tmp_path, "x;y\n1;2\n", "semi.csv"), "y")


def test_csv_missing_file_and_bad_task(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        load_csv(tmp_path / "absent.csv", "y")
    with pytest.raises(DataError, match="task must be"):
        load_csv(_write(tmp_path, "x,y\n1,2\n"), "y", task="cluster")
