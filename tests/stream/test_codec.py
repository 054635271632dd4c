"""iolstream.stream.codec and .encoding: every dead-letter reason, row vs batch messages, the fast batch path
against the per-row reference path, and prediction / header encoding."""

from __future__ import annotations

import naive
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolstream.kafka.deadletters import dead_letter_headers
from iolstream.stream import codec, values
from iolstream.stream.codec import decode_features, decode_labels
from iolstream.stream.encoding import encode_predictions
from iolstream.stream.rows import MAX_DETAIL_CHARS, REASONS, BadInput, FeatureRows, LabelRows, TargetSpec

K = 3
MAX = 10_000
INT_CLASSES = TargetSpec.classification((0, 1, 3))
STR_CLASSES = TargetSpec.classification(("cat", "dog"))
REG1 = TargetSpec.regression(1)
REG2 = TargetSpec.regression(2)


def features(obj, k=K, max_bytes=MAX):
    raw = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return decode_features(raw, k, max_bytes=max_bytes)


def labels(obj, target, max_bytes=MAX):
    raw = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return decode_labels(raw, target, max_bytes=max_bytes)


def only_reason(result) -> str:
    rows, bad = result
    assert rows is None and len(bad) == 1, (rows, bad)
    return bad[0][0].reason


def without_row_prefix(detail: str) -> str:
    return detail.split(": ", 1)[1] if detail.startswith("row ") else detail


# ------------------------------------------------------------ message level


@pytest.mark.parametrize("value", [None, b""])
def test_empty_value_is_malformed(value):
    rows, bad = decode_features(value, K, max_bytes=MAX)
    assert rows is None and [(b.reason, raw) for b, raw in bad] == [("malformed_json", b"")]


def test_oversize_is_checked_before_parsing():
    raw = b"{not json at all" + b" " * 100
    rows, bad = decode_features(raw, K, max_bytes=50)
    assert rows is None and bad[0][0].reason == "oversize" and bad[0][1] == raw
    assert "116 bytes, limit 50" in bad[0][0].detail
    assert only_reason(decode_labels(raw, REG1, max_bytes=50)) == "oversize"


@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b'{"id": "a", "x": [1, 2, NaN]}',
        b'{"id": "a", "x": [1, 2, Infinity]}',
        b'{"id": "a", "x": [1, 2, 1e400]}',
    ],
)
def test_not_json_is_malformed_and_keeps_raw_bytes(raw):
    rows, bad = decode_features(raw, K, max_bytes=MAX)
    assert rows is None and bad[0][0].reason == "malformed_json" and bad[0][1] == raw


@pytest.mark.parametrize("obj", [[1, 2, 3], "a", 3, None])
def test_top_level_not_an_object_is_bad_schema(obj):
    assert only_reason(features(obj)) == "bad_schema"
    assert only_reason(labels(obj, REG1)) == "bad_schema"


@pytest.mark.parametrize(
    "obj, reason",
    [
        ({"x": [1, 2, 3]}, "missing_id"),
        ({"id": None, "x": [1, 2, 3]}, "missing_id"),
        ({"id": "", "x": [1, 2, 3]}, "missing_id"),
        ({"id": True, "x": [1, 2, 3]}, "bad_schema"),
        ({"id": 1.5, "x": [1, 2, 3]}, "bad_schema"),
        ({"id": ["a"], "x": [1, 2, 3]}, "bad_schema"),
        ({"id": "a" * (codec.MAX_ID_CHARS + 1), "x": [1, 2, 3]}, "bad_schema"),
        ({"id": "a\x00", "x": [1, 2, 3]}, "bad_schema"),
        ({"id": "a"}, "bad_schema"),
        ({"id": "a", "x": 3}, "bad_schema"),
        ({"id": "a", "x": [1, 2]}, "wrong_feature_count"),
        ({"id": "a", "x": [1, 2, 3, 4]}, "wrong_feature_count"),
        ({"id": "a", "x": [1, None, 3]}, "non_finite"),
        ({"id": "a", "x": [1, "2", 3]}, "bad_schema"),
        ({"id": "a", "x": [1, True, 3]}, "bad_schema"),
        ({"id": "a", "x": [1, [2], 3]}, "bad_schema"),
        ({"id": "a", "x": [1, 2, 3], "ts": -5}, "bad_schema"),
        ({"id": "a", "x": [1, 2, 3], "ts": "now"}, "bad_schema"),
        ({"id": "a", "x": [1, 2, 3], "ts": True}, "bad_schema"),
        ({"id": "a", "ids": ["a"], "x": [[1, 2, 3]]}, "bad_schema"),
    ],
)
def test_bad_row_message_rejects_the_raw_message(obj, reason):
    raw = orjson.dumps(obj)
    rows, bad = decode_features(raw, K, max_bytes=MAX)
    assert rows is None and len(bad) == 1
    assert bad[0][0].reason == reason and bad[0][1] == raw
    assert "\n" not in bad[0][0].detail


def test_good_row_message():
    rows, bad = features({"id": "a1", "x": [1, 2.5, -3], "ts": 123})
    assert bad == [] and rows.ids == ["a1"] and rows.ts.tolist() == [123]
    assert rows.X.dtype == np.float64 and rows.X.shape == (1, K) and rows.X.flags.c_contiguous
    assert rows.X.tolist() == [[1.0, 2.5, -3.0]]


@pytest.mark.parametrize("ts, expected", [(None, -1), (0, 0), (1.7e12, 1_700_000_000_000), (12.9, 12)])
def test_event_time_forms(ts, expected):
    obj = {"id": 7, "x": [0, 0, 0]} | ({} if ts is None else {"ts": ts})
    rows, bad = features(obj)
    assert bad == [] and rows.ids == ["7"] and rows.ts.tolist() == [expected]


@pytest.mark.parametrize(
    "obj",
    [
        {"ids": ["a", "b"], "x": [[1, 2, 3]]},
        {"ids": [], "x": []},
        {"ids": "a", "x": [[1, 2, 3]]},
        {"ids": ["a"], "x": [1, 2, 3]},
        {"ids": ["a", "b"], "x": [[1, 2, 3], 4]},
        {"ids": ["a"], "x": {"0": [1, 2, 3]}},
        {"ids": ["a"]},
        {"ids": ["a", "b"], "x": [[1, 2, 3], [4, 5, 6]], "ts": [1]},
        {"ids": ["a", "b"], "x": [[1, 2, 3], [4, 5, 6]], "ts": "x"},
    ],
)
def test_structural_batch_problems_reject_the_whole_message(obj):
    raw = orjson.dumps(obj)
    rows, bad = decode_features(raw, K, max_bytes=MAX)
    assert rows is None and len(bad) == 1 and bad[0][0].reason == "bad_schema" and bad[0][1] == raw


# ------------------------------------------------------------ batch rows


def test_clean_batch():
    rows, bad = features({"ids": ["a", 2], "x": [[1, 2, 3], [4, 5, 6]], "ts": 99})
    assert bad == [] and rows.ids == ["a", "2"] and rows.ts.tolist() == [99, 99]
    assert rows.X.tolist() == [[1, 2, 3], [4, 5, 6]] and rows.X.flags.c_contiguous


def test_partial_bad_batch_keeps_good_rows_and_reencodes_bad_ones():
    obj = {
        "ids": ["a", "b", "c", None, "e", "a", "g", "h", "i"],
        "x": [
            [1, 2, 3],
            [1, 2],
            [1, None, 3],
            [1, 2, 3],
            [1, "2", 3],
            [7, 8, 9],
            [4, 5, 6],
            [1, True, 3],
            [0, 0, 0],
        ],
        "ts": [10, 11, 12, 13, 14, 15, 16, 17, None],
    }
    rows, bad = features(obj)
    assert rows.ids == ["a", "g", "i"]
    assert rows.X.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0]] and rows.ts.tolist() == [10, 16, -1]
    got = [(b.reason, b.detail.split(":")[0]) for b, _ in bad]
    assert got == [
        ("wrong_feature_count", "row 1"),
        ("non_finite", "row 2"),
        ("missing_id", "row 3"),
        ("bad_schema", "row 4"),
        ("duplicate_id", "row 5"),
        ("bad_schema", "row 7"),
    ]
    for b, raw in bad:  # each dead letter is a row message that decodes to the same problem
        msg = orjson.loads(raw)
        i = int(b.detail.split(":")[0].split()[1])
        assert msg["x"] == obj["x"][i] and msg["ts"] == obj["ts"][i] and msg.get("id") == obj["ids"][i]
        if b.reason != "duplicate_id":
            again = features(raw)[1][0][0]
            assert (again.reason, again.detail) == (b.reason, without_row_prefix(b.detail))


def test_bad_ts_in_a_list_rejects_only_its_row():
    rows, bad = features({"ids": ["a", "b"], "x": [[1, 2, 3], [4, 5, 6]], "ts": [5, "soon"]})
    assert rows.ids == ["a"] and [b.reason for b, _ in bad] == ["bad_schema"]
    assert orjson.loads(bad[0][1]) == {"id": "b", "x": [4, 5, 6], "ts": "soon"}


def test_all_rows_bad_returns_none():
    rows, bad = features({"ids": ["a", "b"], "x": [[1], [2]]})
    assert rows is None and [b.reason for b, _ in bad] == ["wrong_feature_count"] * 2


def test_bool_detector():
    assert not values.may_hold_bool(b'{"ids":["a"],"x":[[1,2,3]]}')
    assert not values.may_hold_bool(b'{"ids":["null-ish","user"],"x":[[1,2,3]]}')
    assert values.may_hold_bool(b"[true]") and values.may_hold_bool(b"[1,false]")
    assert values.may_hold_bool(b'{"ids":["true"]}')  # a false alarm only costs the reference path


@pytest.mark.parametrize("ids", [["a", "b"], ["true", "false"]])
def test_bool_in_batch_is_caught(ids):
    rows, bad = features({"ids": ids, "x": [[1, 2, 3], [1.5, False, 3]]})
    assert rows.ids == ids[:1] and [b.reason for b, _ in bad] == ["bad_schema"]
    assert "x[1] is a bool" in bad[0][0].detail


# A Hypothesis property: decoding a batch equals decoding its rows one by one, and the
# fast path equals the reference path.
GOOD = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=K, max_size=K)
CELL = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.integers(-(2**40), 2**40),
    st.none(),
    st.booleans(),
    st.just("1"),
)
ROW_X = st.one_of(GOOD, GOOD, st.lists(CELL, min_size=K - 1, max_size=K + 1))
ROW_ID = st.one_of(
    st.sampled_from(["a", "b", "c", "d", "e", "user-1"]), st.integers(0, 5), st.just(""), st.none()
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ROW_ID, ROW_X), min_size=1, max_size=8))
def test_batch_equals_its_rows(row_specs):
    ids = [i for i, _ in row_specs]
    xs = [x for _, x in row_specs]
    raw = orjson.dumps({"ids": ids, "x": xs})
    rows, bad = decode_features(raw, K, max_bytes=MAX)
    with pytest.MonkeyPatch.context() as mp:  # the same message through the reference path only
        mp.setattr(codec, "may_hold_bool", lambda raw: True)
        ref_rows, ref_bad = decode_features(raw, K, max_bytes=MAX)
    assert [(b.reason, b.detail, r) for b, r in bad] == [(b.reason, b.detail, r) for b, r in ref_bad]
    assert (rows is None) == (ref_rows is None)
    if rows is not None:
        assert (
            rows.ids == ref_rows.ids
            and np.array_equal(rows.X, ref_rows.X)
            and np.array_equal(rows.ts, ref_rows.ts)
        )
    # every row accounted for once; good rows equal the one-row decode
    n_good = 0 if rows is None else len(rows)
    assert n_good + len(bad) == len(ids)
    seen = set()
    for i, (row_id, x) in enumerate(row_specs):
        one, one_bad = features({"id": row_id, "x": x})
        if one is not None and one.ids[0] not in seen:
            seen.add(one.ids[0])
            j = rows.ids.index(one.ids[0])
            assert np.array_equal(rows.X[j], one.X[0])
        elif one is None:
            b = next(b for b, _ in bad if b.detail.startswith(f"row {i}:"))
            assert (b.reason, without_row_prefix(b.detail)) == (one_bad[0][0].reason, one_bad[0][0].detail)


# ------------------------------------------------------------ labels


@pytest.mark.parametrize(
    "y, result",
    [
        (3, 2),
        (0, 0),
        (3.0, 2),
        ("3", 2),
        ("03", 2),
        (3.5, "unknown_class"),
        (7, "unknown_class"),
        ("cat", "unknown_class"),
        (True, "bad_label"),
        (None, "bad_label"),
        ([3], "bad_label"),
        ({"c": 3}, "bad_label"),
    ],
)
def test_int_classes(y, result):
    got, bad = labels({"id": "a", "y": y}, INT_CLASSES)
    if isinstance(result, int):
        assert bad == [] and got.Y.dtype == np.int64 and got.Y.tolist() == [result]
    else:
        assert got is None and bad[0][0].reason == result


@pytest.mark.parametrize(
    "y, result",
    [("dog", 1), ("cat", 0), ("DOG", "unknown_class"), (1, "unknown_class"), (False, "bad_label")],
)
def test_string_classes(y, result):
    got, bad = labels({"id": "a", "y": y}, STR_CLASSES)
    if isinstance(result, int):
        assert bad == [] and got.Y.tolist() == [result]
    else:
        assert got is None and bad[0][0].reason == result


@pytest.mark.parametrize(
    "target, y, result",
    [
        (REG1, 2.5, [[2.5]]),
        (REG1, [2.5], [[2.5]]),
        (REG1, 3, [[3.0]]),
        (REG1, "2.5", "bad_label"),
        (REG1, None, "non_finite"),
        (REG1, [1, 2], "bad_label"),
        (REG1, True, "bad_label"),
        (REG2, [1, 2.5], [[1.0, 2.5]]),
        (REG2, 1.0, "bad_label"),
        (REG2, [1, None], "non_finite"),
        (REG2, [1, 2, 3], "bad_label"),
        (REG2, [1, [2]], "bad_label"),
    ],
)
def test_regression_labels(target, y, result):
    got, bad = labels({"id": "a", "y": y}, target)
    if isinstance(result, list):
        assert bad == [] and got.Y.dtype == np.float64 and got.Y.tolist() == result
    else:
        assert got is None and bad[0][0].reason == result


@pytest.mark.parametrize(
    "obj",
    [
        {"id": "a"},
        {"ids": ["a"], "y": 1},
        {"ids": ["a", "b"], "y": [1]},
        {"ids": [], "y": []},
        {"id": "a", "ids": ["a"], "y": 1},
    ],
)
def test_label_structural_problems(obj):
    assert only_reason(labels(obj, INT_CLASSES)) == "bad_schema"


def test_label_missing_id():
    assert only_reason(labels({"y": 1}, INT_CLASSES)) == "missing_id"


@pytest.mark.parametrize(
    "target, ys",
    [
        (INT_CLASSES, [0, 3, 1.0, "1"]),
        (STR_CLASSES, ["cat", "dog", "dog", "cat"]),
        (REG1, [1.5, 2, [3.0], -4]),
        (REG2, [[1, 2], [3, 4], [5, 6.5], [0, 0]]),
    ],
)
def test_clean_label_batches_match_single_rows(target, ys):
    got, bad = labels({"ids": ["a", "b", "c", "d"], "y": ys}, target)
    assert bad == [] and got.ids == ["a", "b", "c", "d"]
    singles = np.concatenate([labels({"id": i, "y": y}, target)[0].Y for i, y in zip("abcd", ys)])
    assert np.array_equal(got.Y, singles) and got.Y.dtype == singles.dtype


def test_partial_bad_label_batch():
    obj = {"ids": ["a", "b", "c", "", "a", "f"], "y": [1, 2, True, 0, 0, "3"]}
    got, bad = labels(obj, INT_CLASSES)
    assert got.ids == ["a", "f"] and got.Y.tolist() == [1, 2]
    assert [(b.reason, b.detail.split(":")[0]) for b, _ in bad] == [
        ("unknown_class", "row 1"),
        ("bad_label", "row 2"),
        ("missing_id", "row 3"),
        ("duplicate_id", "row 4"),
    ]
    assert [orjson.loads(raw) for _, raw in bad] == [
        {"id": "b", "y": 2},
        {"id": "c", "y": True},
        {"id": "", "y": 0},
        {"id": "a", "y": 0},
    ]
    assert labels(bad[0][1], INT_CLASSES)[1][0][0].reason == "unknown_class"


def test_regression_batch_with_bad_rows():
    got, bad = labels({"ids": ["a", "b", "c"], "y": [[1, 2], [1, None], [3, 4]]}, REG2)
    assert got.ids == ["a", "c"] and got.Y.tolist() == [[1, 2], [3, 4]] and bad[0][0].reason == "non_finite"


def test_ragged_regression_batch_goes_row_by_row():
    got, bad = labels({"ids": ["a", "b"], "y": [[1, 2], [1]]}, REG2)
    assert got.ids == ["a"] and bad[0][0].reason == "bad_label"


# ------------------------------------------------------------ types and output


def test_target_spec_validation():
    assert TargetSpec.classification([1, 2]).classes == (1, 2)
    assert TargetSpec.classification((np.int64(0), np.int64(1))).classes == (0, 1)
    assert TargetSpec.classification((np.True_, False)).classes == (True, False)  # booleans: is_fraud
    for bad in [(1,), (1, 1), (1, "a"), (True, 1), (True, True), (True, False, "a"), ()]:
        with pytest.raises(ValueError):
            TargetSpec.classification(bad)
    with pytest.raises(ValueError):
        TargetSpec("classification", ("a", "b"), 3)
    with pytest.raises(ValueError):
        TargetSpec("regression", None, 0)
    with pytest.raises(ValueError):
        TargetSpec("ranking", None, 1)


def test_bad_input_is_one_line_and_checked():
    b = BadInput("non_finite", "row 1:\n x[0] is null")
    assert b.detail == "row 1: x[0] is null" and str(b) == "non_finite: row 1: x[0] is null"
    assert len(BadInput("bad_schema", "y" * 10_000).detail) == MAX_DETAIL_CHARS
    with pytest.raises(ValueError):
        BadInput("not_a_reason", "x")
    assert len(set(REASONS)) == len(REASONS) == 18


def test_dead_letter_headers():
    headers = dead_letter_headers(BadInput("oversize", "value is 9 bytes, limit 5"), "feat", 2, 1234)
    assert headers == [
        ("iolstream.reason", b"oversize"),
        ("iolstream.detail", b"value is 9 bytes, limit 5"),
        ("iolstream.source.topic", b"feat"),
        ("iolstream.source.partition", b"2"),
        ("iolstream.source.offset", b"1234"),
    ]


def test_encode_predictions_classification():
    out = encode_predictions(
        ["a", "b"],
        np.array([2, 0]),
        np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]),
        model_version=4,
        ts_in=np.array([1000, -1]),
        ts_out_ms=2000,
        mode="forward",
        classes=INT_CLASSES.classes,
    )
    assert [orjson.loads(o) for o in out] == [
        {
            "id": "a",
            "y_hat": 3,
            "proba": [0.1, 0.2, 0.7],
            "model_version": 4,
            "ts": 2000,
            "event_ts": 1000,
            "mode": "forward",
        },
        {
            "id": "b",
            "y_hat": 0,
            "proba": [0.5, 0.25, 0.25],
            "model_version": 4,
            "ts": 2000,
            "mode": "forward",
        },
    ]


@pytest.mark.parametrize(
    "y_hat, expected",
    [
        (np.array([[1.5], [np.nan]]), [1.5, None]),
        (np.array([1.5, 2.0]), [1.5, 2.0]),
        (np.array([[1.0, 2.0], [3.0, 4.0]]), [[1.0, 2.0], [3.0, 4.0]]),
    ],
)
def test_encode_predictions_regression(y_hat, expected):
    out = encode_predictions(
        ["a", "b"], y_hat, None, model_version=1, ts_in=None, ts_out_ms=5, mode="ridge", classes=None
    )
    msgs = [orjson.loads(o) for o in out]
    assert [m["y_hat"] for m in msgs] == expected and all(
        "proba" not in m and m["mode"] == "ridge" for m in msgs
    )


def test_row_types_are_slotted_and_frozen():
    rows = FeatureRows(["a"], np.zeros((1, K)), np.array([-1]))
    with pytest.raises(AttributeError):
        rows.ids = []
    assert len(rows) == 1 and len(LabelRows(["a", "b"], np.array([0, 1]))) == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8, unique=True),
    st.sampled_from([("no", "yes", "maybe"), (3, 0, 7), ("a,b", 'c"d', "e"), None]),
    st.integers(1, 3),
    st.data(),
)
def test_fast_encoder_equals_the_reference(ids, classes, m, data):
    """Bytes equal to one orjson.dumps of a dict per row, for any ids (commas, quotes, unicode),
    class values, regression widths and intervals, non-finite floats and event times present, absent or mixed."""
    b = len(ids)
    floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e300, 1e300))
    if classes is not None:
        y_hat = np.array(data.draw(st.lists(st.integers(0, len(classes) - 1), min_size=b, max_size=b)))
        proba = np.array(
            data.draw(
                st.lists(
                    st.lists(floats, min_size=len(classes), max_size=len(classes)), min_size=b, max_size=b
                )
            )
        )
    else:
        y_hat = np.array(
            data.draw(st.lists(st.lists(floats, min_size=m, max_size=m), min_size=b, max_size=b))
        )
        proba = None
    ts_in = data.draw(st.one_of(st.none(), st.lists(st.integers(-1, 2**53), min_size=b, max_size=b)))
    kwargs = dict(
        model_version=data.draw(st.integers(0, 2**40)),
        ts_in=None if ts_in is None else np.array(ts_in),
        ts_out_ms=123,
        mode=data.draw(st.sampled_from(["forward", "ridge"])),
        classes=classes,
    )
    if classes is not None and data.draw(st.booleans()):  # stream.emit_scores: the raw outputs too
        kwargs["scores"] = proba[::-1].copy()
    if classes is None and data.draw(st.booleans()):  # model.interval: y_lo and y_hi, shaped as y_hat
        kwargs["interval"] = (y_hat - 1.5, y_hat[::-1].copy())
    assert encode_predictions(ids, y_hat, proba, **kwargs) == naive.encode_predictions(
        ids, y_hat, proba, **kwargs
    )


def test_every_reason_has_the_hint_the_lines_naming_it_give():
    from iolstream.stream.rows import REASON_HINTS, REASONS

    assert set(REASON_HINTS) == set(REASONS)
