"""iolstream.stream.joinbuffer (its stores, the micro-batcher): joining labels to rows in any order, expiry, bounds, state round trip,
and the micro-batcher."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolstream.stream.batcher import MicroBatcher
from iolstream.stream.codec import decode_features, decode_labels
from iolstream.stream.joinbuffer import JoinBuffer
from iolstream.stream.recent_ids import fingerprints
from iolstream.stream.rows import FeatureRows, LabelRows, TargetSpec

K = 2
CLASSES = TargetSpec.classification(("no", "yes", "maybe"))
REG2 = TargetSpec.regression(2)


def make(target=CLASSES, **overrides) -> JoinBuffer:
    kwargs = dict(
        target=target,
        n_features=K,
        max_pending_rows=100,
        row_ttl_ms=None,
        row_ttl_batches=None,
        early_label_ttl_ms=1000,
        max_early_labels=100,
        remember_done=1000,
    )
    kwargs.update(overrides)
    return JoinBuffer(**kwargs)


def rows_x(ids) -> np.ndarray:
    """A distinct row per id, so joined X can be checked against the id."""
    return np.array([[float(sum(map(ord, i))), float(len(i))] for i in ids]).reshape(len(ids), K)


def add_rows(buf, ids, seq=0, now=0):
    return buf.add_rows(list(ids), rows_x(ids), seq, now)


def add_labels(buf, ids, ys, now=0):
    return buf.add_labels(LabelRows(list(ids), np.array(ys, dtype=np.int64)), now)


def check_identities(buf: JoinBuffer) -> None:
    """Counter bookkeeping: every row and every label is somewhere, once."""
    c = buf.counters
    assert c["rows_added"] == c["labels_joined"] + c["rows_expired"] + c["rows_evicted"] + len(buf)
    assert (
        c["labels_early_held"]
        == c["labels_early_joined"] + c["labels_orphan"] + c["labels_handed_over"] + buf.n_early
    )
    direct = c["labels_joined"] - c["labels_early_joined"]
    assert (
        c["labels_received"]
        == direct + c["labels_early_held"] + c["labels_duplicate"] + c["labels_expired_id"]
    )


# ------------------------------------------------------------ joins


@pytest.mark.parametrize("target", [CLASSES, REG2], ids=["classes", "regression"])
@pytest.mark.parametrize("n", [3, 40])
def test_a_message_of_labels_whose_rows_all_wait_is_held_at_once_as_one_by_one(n, target):
    """Labels whose rows all wait for their batch (``waiting``) are held in one call: the labels, their order,
    times, sources, slots and counters are those the label-by-label path gives (with free slots to reuse first,
    and, for 40, the store grown on the way); the rows then join them as before."""

    def scenario(hint: bool):
        buf = make(target=target)
        y0 = np.zeros((1, 2)) if target is REG2 else np.array([0])
        buf.add_labels(LabelRows(["d"], y0), 0)
        buf.add_labels(LabelRows(["e"], y0), 0)
        buf.add_rows(["d"], rows_x(["d"]), 0, 0)  # "d" joins its row: a free slot, reused first
        ids = [f"w{i}" for i in range(n)]
        y = np.arange(2 * n, dtype=float).reshape(n, 2) if target is REG2 else np.arange(n) % 3
        res = buf.add_labels(LabelRows(ids, y), 5, waiting=set(ids) if hint else frozenset(), source=("l", n))
        return buf, res, ids

    (plain, r1, ids), (hinted, r2, _) = scenario(False), scenario(True)
    assert r1.ids == r2.ids == [] and r1.rejected == r2.rejected == []
    assert plain.counters == hinted.counters and hinted.n_early == n + 1
    assert plain.early_labels() == hinted.early_labels()
    assert plain._early.index == hinted._early.index
    joined = [buf.add_rows(ids, rows_x(ids), 1, 9) for buf in (plain, hinted)]
    assert joined[0].ids == joined[1].ids == ids and np.array_equal(joined[0].Y, joined[1].Y)
    check_identities(hinted)


@pytest.mark.parametrize("fast_paths", [True, False])
def test_labels_of_waiting_rows_are_held_early_as_without_the_hint(fast_paths):
    """``waiting`` (ids whose rows the caller still batches: neither pending nor remembered) only
    skips the id memory: the results are those of the same call without it, one label at a time
    or several, joined, held, duplicate or expired_id alike."""

    def scenario(hint: bool):
        buf = make(max_pending_rows=3)
        buf.fast_paths = fast_paths
        add_rows(buf, ["a", "x", "y", "z"])  # "a" evicted (expired): remembered; "x" next, by "b"
        add_rows(buf, ["b"], seq=1)
        add_labels(buf, ["b"], [1])  # "b" labelled: remembered
        add_labels(buf, ["d"], [0])  # "d" held early
        waiting = {"c", "e"} if hint else frozenset()
        out = [buf.add_labels(LabelRows(["c"], np.array([2])), 5, waiting=waiting)]
        out.append(
            buf.add_labels(
                LabelRows(["x", "a", "b", "d", "e", "c"], np.array([0, 1, 2, 0, 1, 2])), 6, waiting=waiting
            )
        )
        return buf, out

    plain, hinted = scenario(False), scenario(True)
    for r1, r2 in zip(plain[1], hinted[1]):
        assert (
            r1.ids == r2.ids
            and r1.Y.tolist() == r2.Y.tolist()
            and r1.batch_seq.tolist() == r2.batch_seq.tolist()
        )
        assert [(bad.reason, raw) for bad, raw in r1.rejected] == [
            (bad.reason, raw) for bad, raw in r2.rejected
        ]
    assert plain[0].counters == hinted[0].counters and list(plain[0]._early.items()) == list(
        hinted[0]._early.items()
    )
    assert (
        hinted[0].counters["labels_expired_id"] == 2 and hinted[0].counters["labels_duplicate"] == 3
    )  # a, x evicted; b, d, c
    check_identities(hinted[0])


def test_row_then_label_joins_with_the_row_data():
    buf = make()
    res = add_rows(buf, ["a", "b", "c"], seq=3)
    assert res.ids == [] and res.Y.shape == (0,) and res.X.shape == (0, K) and len(res.evicted) == 0
    res = add_labels(buf, ["c", "a"], [2, 0], now=5)
    assert res.ids == ["c", "a"] and res.Y.tolist() == [2, 0] and res.Y.dtype == np.int64
    assert np.array_equal(res.X, rows_x(["c", "a"])) and res.batch_seq.tolist() == [3, 3]
    assert len(buf) == 1 and buf.counters["labels_joined"] == 2
    check_identities(buf)


def test_early_label_joins_when_its_row_comes():
    buf = make()
    res = add_labels(buf, ["b"], [1])
    assert res.ids == [] and buf.n_early == 1 and buf.counters["labels_early_held"] == 1
    res = add_rows(buf, ["a", "b"], seq=7)
    assert res.ids == ["b"] and res.Y.tolist() == [1] and res.batch_seq.tolist() == [7]
    assert np.array_equal(res.X, rows_x(["b"]))
    assert len(buf) == 1 and buf.n_early == 0 and buf.counters["labels_early_joined"] == 1
    check_identities(buf)


def test_duplicate_labels_are_applied_once():
    buf = make()
    add_labels(buf, ["early", "early"], [0, 1])  # second is a duplicate of a held label; the first wins
    add_rows(buf, ["a", "early"])
    res = add_labels(buf, ["a", "a"], [2, 2])  # within one call
    assert res.ids == ["a"]
    res = add_labels(buf, ["a", "early"], [1, 1])  # after the join
    assert res.ids == [] and res.rejected == []
    assert buf.counters["labels_duplicate"] == 4 and buf.counters["labels_joined"] == 2
    check_identities(buf)


def test_early_labels_of_a_partition_that_goes_are_handed_over_with_their_sources():
    """Group learning: labels waiting for rows of partitions that go to another member leave the buffer (counted),
    with their label and the source that names their partition; the others stay."""
    buf = make()
    for row_id, y, partition in (("a", 0, 1), ("b", 2, 2), ("c", 1, 1)):
        buf.add_labels(LabelRows([row_id], np.array([y])), 0, source=("labels", partition, 10))
    ids, ys, sources = buf.hand_over_early(lambda source: source[1] == 1)
    assert ids == ["a", "c"] and ys.tolist() == [0, 1] and sources == [("labels", 1, 10)] * 2
    assert buf.n_early == 1 and buf.counters["labels_handed_over"] == 2
    assert buf.hand_over_early(lambda source: False)[0] == []
    res = add_rows(buf, ["a", "b"])  # "a" went: it waits for a label now, "b" joins
    assert res.ids == ["b"] and len(buf) == 1
    check_identities(buf)


def test_early_label_that_never_finds_its_row_is_rejected_unknown_id():
    buf = make(early_label_ttl_ms=100)
    add_labels(buf, ["ghost"], [2], now=0)
    assert buf.expire(now_ms=100, batch_seq=0).rejected == []  # age == ttl: still waiting
    exp = buf.expire(now_ms=101, batch_seq=0)
    ((bad, raw),) = exp.rejected
    assert bad.reason == "unknown_id" and "ghost" in bad.detail and buf.n_early == 0
    labels, dead = decode_labels(raw, CLASSES, max_bytes=1000)  # the dead letter is a decodable label message
    assert dead == [] and orjson.loads(raw) == {"id": "ghost", "y": "maybe"} and labels.Y.tolist() == [2]
    assert buf.counters["labels_orphan"] == 1
    check_identities(buf)


def test_full_early_buffer_rejects_the_oldest_label():
    buf = make(max_early_labels=2)
    res = add_labels(buf, ["e1", "e2", "e3"], [0, 1, 2])
    assert [(b.reason, orjson.loads(raw)["id"]) for b, raw in res.rejected] == [("unknown_id", "e1")]
    assert buf.n_early == 2 and buf.counters["labels_orphan"] == 1
    check_identities(buf)


# ------------------------------------------------------------ expiry and bounds


def test_rows_expire_by_time():
    buf = make(row_ttl_ms=50)
    add_rows(buf, ["a"], now=0)
    add_rows(buf, ["b"], now=30)
    assert len(buf.expire(now_ms=50, batch_seq=0)) == 0
    exp = buf.expire(now_ms=51, batch_seq=0)
    assert exp.ids == ["a"] and np.array_equal(exp.X, rows_x(["a"])) and exp.batch_seq.tolist() == [0]
    res = add_labels(buf, ["a", "b"], [0, 1], now=60)
    assert res.ids == ["b"]
    ((bad, raw),) = res.rejected
    assert bad.reason == "expired_id" and orjson.loads(raw) == {"id": "a", "y": "no"}
    assert buf.counters["rows_expired"] == 1 and buf.counters["labels_expired_id"] == 1
    check_identities(buf)


def test_rows_expire_by_batches():
    buf = make(row_ttl_batches=1)
    add_rows(buf, ["a"], seq=1)
    add_rows(buf, ["b"], seq=2)
    assert len(buf.expire(now_ms=0, batch_seq=2)) == 0  # a row may wait one further batch
    assert buf.expire(now_ms=0, batch_seq=3).ids == ["a"]
    assert buf.expire(now_ms=0, batch_seq=4).ids == ["b"]
    check_identities(buf)


def test_full_buffer_evicts_oldest_rows_and_counts_them():
    buf = make(max_pending_rows=3)
    add_rows(buf, ["a", "b"], seq=1)
    res = add_rows(buf, ["c", "d", "e"], seq=2)
    assert res.evicted.ids == ["a", "b"] and np.array_equal(res.evicted.X, rows_x(["a", "b"]))
    assert res.evicted.batch_seq.tolist() == [1, 1] and len(buf) == 3
    res = add_rows(
        buf, ["f", "g", "h", "i", "j"], seq=3
    )  # a batch bigger than the buffer evicts some of itself
    assert res.evicted.ids == list("cdefg") and np.array_equal(res.evicted.X, rows_x(list("cdefg")))
    res = add_labels(buf, ["a", "h"], [0, 1])
    assert res.ids == ["h"] and [b.reason for b, _ in res.rejected] == ["expired_id"]
    assert buf.counters["rows_evicted"] == 7
    check_identities(buf)


def test_remembered_ids_are_bounded():
    buf = make(remember_done=3)
    for i in range(10):
        add_rows(buf, [f"r{i}"])
        add_labels(buf, [f"r{i}"], [0])
    assert len(buf._done) == 3
    add_labels(buf, ["r9", "r0"], [0, 0])  # r9 remembered: duplicate; r0 forgotten: held as early
    assert buf.counters["labels_duplicate"] == 1 and buf.n_early == 1
    check_identities(buf)


# ------------------------------------------------------------ duplicate rows


def test_screen_rows_rejects_known_ids():
    buf = make(row_ttl_batches=0)
    add_rows(buf, ["labelled", "expired"], seq=0)
    add_labels(buf, ["labelled"], [0])
    assert buf.expire(now_ms=0, batch_seq=1).ids == ["expired"]
    add_rows(buf, ["pending"], seq=1)
    ids = ["new", "pending", "labelled", "expired", "new", "other"]
    rows = FeatureRows(ids, rows_x(ids), np.arange(6))
    kept, rejected = buf.screen_rows(rows)
    assert kept.ids == ["new", "other"] and kept.ts.tolist() == [0, 5]
    assert np.array_equal(kept.X, rows_x(["new", "other"]))
    assert [b.reason for b, _ in rejected] == ["duplicate_id"] * 4
    details = [b.detail for b, _ in rejected]
    assert "already pending" in details[0] and "already labelled" in details[1]
    assert "expired" in details[2] and "repeated" in details[3]
    back, dead = decode_features(rejected[0][1], K, max_bytes=1000)
    assert dead == [] and back.ids == ["pending"] and back.ts.tolist() == [1]
    assert buf.screen_rows(kept) == (kept, [])


def test_add_rows_rejects_duplicates_as_a_safety_net():
    buf = make()
    add_rows(buf, ["a"])
    res = add_rows(buf, ["a", "b", "b"])
    assert [b.reason for b, _ in res.rejected] == ["duplicate_id", "duplicate_id"] and len(buf) == 2
    assert buf.counters["rows_duplicate"] == 2
    check_identities(buf)


# ------------------------------------------------------------ regression and validation


def test_regression_labels():
    buf = make(REG2)
    buf.add_labels(LabelRows(["b"], np.array([[1.0, 2.0]])), 0)
    res = add_rows(buf, ["a", "b"])
    assert res.Y.shape == (1, 2) and res.Y.tolist() == [[1.0, 2.0]]
    res = buf.add_labels(LabelRows(["a"], np.array([[3.0, 4.5]])), 0)
    assert res.Y.tolist() == [[3.0, 4.5]] and res.Y.dtype == np.float64
    assert add_rows(buf, ["c"]).Y.shape == (0, 2)
    buf.add_labels(LabelRows(["z"], np.array([[0.5, -1.0]])), 0)
    ((bad, raw),) = buf.expire(now_ms=10_000, batch_seq=0).rejected
    assert orjson.loads(raw) == {"id": "z", "y": [0.5, -1.0]}


def test_input_validation():
    with pytest.raises(ValueError):
        make(max_pending_rows=0)
    with pytest.raises(ValueError):
        make(row_ttl_ms=-1)
    buf = make()
    with pytest.raises(ValueError):
        buf.add_rows(["a"], np.zeros((1, K + 1)), 0, 0)
    with pytest.raises(ValueError):
        buf.add_labels(LabelRows(["a"], np.zeros((1, 3))), 0)
    with pytest.raises(ValueError):  # a class index out of range
        buf.add_labels(LabelRows(["a"], np.array([3])), 0)


# ------------------------------------------------------------ state


def busy_buffer() -> JoinBuffer:
    buf = make(max_pending_rows=5, row_ttl_batches=2, max_early_labels=3, remember_done=6)
    for seq in range(6):
        add_rows(buf, [f"r{seq}a", f"r{seq}b", f"r{seq}c"], seq=seq, now=seq * 10)
        add_labels(buf, [f"r{seq}a", f"e{seq}", f"r{seq - 1}b"], [seq % 3, 1, 2], now=seq * 10)
        buf.expire(now_ms=seq * 10, batch_seq=seq)
    assert len(buf) and buf.n_early and buf._done
    return buf


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_state_round_trip_and_identical_future():
    buf = busy_buffer()
    state = buf.to_state()
    assert all(v.dtype != object for v in state.values())
    kwargs = dict(
        target=CLASSES,
        n_features=K,
        max_pending_rows=5,
        row_ttl_ms=None,
        row_ttl_batches=2,
        early_label_ttl_ms=1000,
        max_early_labels=3,
        remember_done=6,
    )
    file = io.BytesIO()
    np.savez(file, **state)
    file.seek(0)
    with np.load(file, allow_pickle=False) as loaded:
        restored = JoinBuffer.from_state(dict(loaded), **kwargs)
    assert_same_state(state, restored.to_state())
    assert restored.counters == buf.counters and len(restored) == len(buf) and restored.n_early == buf.n_early
    for b in (buf, restored):  # both continue identically
        r1 = add_rows(b, ["r9a", "e5", "r5c"], seq=9, now=90)
        r2 = add_labels(b, ["r5b", "r4c", "r0a", "r9a"], [0, 1, 2, 0], now=95)
        r3 = b.expire(now_ms=5000, batch_seq=20)
        b.result = (
            r1.ids,
            r1.Y.tolist(),
            r1.evicted.ids,
            r2.ids,
            r2.X.tolist(),
            [x.reason for x, _ in r2.rejected],
            r3.ids,
            [raw for _, raw in r3.rejected],
        )
    assert buf.result == restored.result
    assert_same_state(buf.to_state(), restored.to_state())


def test_empty_state_round_trip():
    buf = make(REG2)
    state = buf.to_state()
    assert state["early_Y"].shape == (0, 2) and state["pending_X"].shape == (0, K)
    assert_same_state(
        state,
        JoinBuffer.from_state(
            state,
            **dict(
                target=REG2,
                n_features=K,
                max_pending_rows=100,
                row_ttl_ms=None,
                row_ttl_batches=None,
                early_label_ttl_ms=1000,
                max_early_labels=100,
                remember_done=1000,
            ),
        ).to_state(),
    )


def test_from_state_with_smaller_limits_evicts_on_next_add():
    state = busy_buffer().to_state()
    buf = JoinBuffer.from_state(
        state,
        **dict(
            target=CLASSES,
            n_features=K,
            max_pending_rows=1,
            row_ttl_ms=None,
            row_ttl_batches=2,
            early_label_ttl_ms=1000,
            max_early_labels=3,
            remember_done=6,
        ),
    )
    n = len(buf)
    res = add_rows(buf, ["new"], seq=10)
    assert len(res.evicted) == n and len(buf) == 1


def test_remembered_ids_are_stored_as_fingerprints_and_old_states_with_ids_load():
    buf = busy_buffer()
    state = buf.to_state()
    assert "done_ids" not in state and state["done_fingerprints"].shape == (buf.n_remembered, 2)
    assert state["done_fingerprints"].dtype == np.int64 and int(state["done_fingerprint_version"]) == 1
    # the same buffer as a state of the code before fingerprints: the ids themselves
    fps, kinds = buf._done.to_arrays()
    remembered = [
        i
        for i in (f"r{s}{c}" for s in range(6) for c in "abc")
        if buf._done.get(*fingerprints([i])[0].tolist())
    ]
    by_fp = {tuple(fingerprints([i])[0].tolist()): i for i in remembered}
    old = {k: v for k, v in state.items() if not k.startswith("done_fingerprint")}
    old["done_ids"] = np.array([by_fp[tuple(fp)] for fp in fps.tolist()])
    kwargs = dict(
        target=CLASSES,
        n_features=K,
        max_pending_rows=5,
        row_ttl_ms=None,
        row_ttl_batches=2,
        early_label_ttl_ms=1000,
        max_early_labels=3,
        remember_done=6,
    )
    assert_same_state(JoinBuffer.from_state(old, **kwargs).to_state(), state)
    # a smaller remember_done keeps the newest; an unknown fingerprint version is refused
    assert (
        JoinBuffer.from_state(old, **{**kwargs, "remember_done": 2})._done.to_arrays()[0].tolist()
        == fps[-2:].tolist()
    )
    with pytest.raises(ValueError, match="version 2"):
        JoinBuffer.from_state({**state, "done_fingerprint_version": np.array(2)}, **kwargs)


def test_remembered_ids_take_fixed_memory_however_long_the_stream():
    buf = make(max_pending_rows=1000, remember_done=500, row_ttl_batches=0)
    size = buf._done.nbytes
    for seq in range(40):
        ids = [f"s{seq}-{i}" for i in range(100)]
        add_rows(buf, ids, seq=seq)
        add_labels(buf, ids[:90], [0] * 90)
        buf.expire(now_ms=0, batch_seq=seq + 1)  # the 10 unlabelled expire
    assert buf.n_remembered == 500 and buf._done.nbytes == size
    assert buf.counters["labels_joined"] == 3600 and buf.counters["rows_expired"] == 400
    res = add_labels(buf, ["s39-0", "s39-95", "s0-0"], [1, 1, 1])  # labelled; expired; forgotten
    assert res.ids == [] and [b.reason for b, _ in res.rejected] == ["expired_id"]
    assert buf.counters["labels_duplicate"] == 1 and buf.n_early == 1
    check_identities(buf)


def test_growth_keeps_rows():
    buf = make(max_pending_rows=5000)
    ids = [f"r{i}" for i in range(3000)]
    for chunk in range(0, 3000, 700):
        add_rows(buf, ids[chunk : chunk + 700])
    res = add_labels(buf, ids[::-1], [0] * 3000)
    assert res.ids == ids[::-1] and np.array_equal(res.X, rows_x(ids[::-1]))


# ------------------------------------------------------------ the property


ID = st.sampled_from([f"id{i}" for i in range(8)])
EVENT = st.one_of(
    st.tuples(st.just("row"), ID, st.integers(0, 99)), st.tuples(st.just("label"), ID, st.integers(0, 2))
)


def chunked(events, chunk_sizes):
    """(kind, events) runs of one kind, at most the next of ``chunk_sizes`` (cycled) long each."""
    sizes = iter(chunk_sizes * (len(events) + 1))
    i = 0
    while i < len(events):
        kind, size = events[i][0], next(sizes)
        chunk = []
        while i < len(events) and events[i][0] == kind and len(chunk) < size:
            chunk.append(events[i])
            i += 1
        yield kind, chunk


def run(events, chunk_sizes):
    """Feed events in runs of the same kind (at most chunk_size per call), as a worker would:
    screen_rows before add_rows; then expire everything that is still early."""
    buf = make(max_pending_rows=1000, max_early_labels=1000, early_label_ttl_ms=10, remember_done=1000)
    joined, rejected_labels = {}, []
    for kind, chunk in chunked(events, chunk_sizes):
        if kind == "row":
            ids = [e[1] for e in chunk]
            X = np.array([[e[2], 0.0] for e in chunk])
            rows, _ = buf.screen_rows(FeatureRows(ids, X, np.full(len(ids), -1)))
            res = buf.add_rows(rows.ids, rows.X, 0, 0) if rows is not None else None
        else:
            res = add_labels(buf, [e[1] for e in chunk], [e[2] for e in chunk])
            rejected_labels += res.rejected
        if res is not None:
            assert len(res.evicted) == 0
            for row_id, x, y in zip(res.ids, res.X.tolist(), res.Y.tolist()):
                assert row_id not in joined, "joined twice"
                joined[row_id] = (x[0], y)
    rejected_labels += buf.expire(now_ms=1000, batch_seq=0).rejected
    check_identities(buf)
    return buf, joined, rejected_labels


@settings(max_examples=200, deadline=None)
@given(
    st.lists(EVENT, max_size=40),
    st.randoms(use_true_random=False),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
)
def test_any_arrival_order_joins_each_label_once(events, rnd, chunk_sizes):
    shuffled = list(events)
    rnd.shuffle(shuffled)
    results = [run(evs, chunk_sizes) for evs in (events, shuffled)]
    for evs, (buf, joined, rejected) in zip((events, shuffled), results):
        labels = [e for e in evs if e[0] == "label"]
        rows = [e for e in evs if e[0] == "row"]
        c = buf.counters
        # every label is joined once, counted duplicate, or rejected: none lost, none twice
        assert len(joined) + c["labels_duplicate"] + len(rejected) == len(labels) == c["labels_received"]
        assert buf.n_early == 0 and all(b.reason == "unknown_id" for b, _ in rejected)
        # the joined pairs are the first row and the first label of each id
        first_row, first_label = {}, {}
        for _, row_id, v in rows:
            first_row.setdefault(row_id, float(v))
        for _, row_id, v in labels:
            first_label.setdefault(row_id, v)
        assert joined == {i: (first_row[i], first_label[i]) for i in first_row.keys() & first_label.keys()}
        assert sorted(orjson.loads(raw)["id"] for _, raw in rejected) == sorted(
            first_label.keys() - first_row.keys()
        )
        assert len(buf) == len(first_row.keys() - first_label.keys())
    # which ids join does not depend on the order
    assert results[0][1].keys() == results[1][1].keys()


WIDE_ID = st.sampled_from([f"id{i}" for i in range(40)])
WIDE_EVENT = st.one_of(
    st.tuples(st.just("row"), WIDE_ID, st.integers(0, 99)),
    st.tuples(st.just("label"), WIDE_ID, st.integers(0, 2)),
)


def trace(events, chunk_sizes) -> list:
    """Everything a buffer returns and holds along ``events``."""
    buf = make(max_pending_rows=12, max_early_labels=6, remember_done=9, row_ttl_batches=3)
    out, seq = [], 0
    for kind, chunk in chunked(events, chunk_sizes):
        ids = [e[1] for e in chunk]
        if kind == "row":
            seq += 1
            screened, dup = buf.screen_rows(FeatureRows(ids, rows_x(ids), np.full(len(ids), -1)))
            out.append(
                ("screen", None if screened is None else screened.ids, [(b.reason, raw) for b, raw in dup])
            )
            res = buf.add_rows(ids, rows_x(ids), seq, seq)  # unscreened: the safety net's rules too
        else:
            res = add_labels(buf, ids, [e[2] for e in chunk], now=seq)
        out.append(
            (
                kind,
                res.ids,
                res.X.tolist(),
                res.Y.tolist(),
                res.batch_seq.tolist(),
                [(b.reason, raw) for b, raw in res.rejected],
                res.evicted.ids,
                res.evicted.X.tolist(),
            )
        )
        gone = buf.expire(now_ms=seq, batch_seq=seq)
        out.append(("expire", gone.ids, gone.X.tolist(), [(b.reason, raw) for b, raw in gone.rejected]))
        check_identities(buf)
    out.append({k: v.tolist() for k, v in buf.to_state().items()})
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(WIDE_EVENT, max_size=80), st.lists(st.integers(1, 10), min_size=1, max_size=4))
def test_bulk_paths_equal_the_row_by_row_paths(events, chunk_sizes):
    fast = trace(events, chunk_sizes)
    JoinBuffer.fast_paths = False
    try:
        assert fast == trace(events, chunk_sizes)
    finally:
        JoinBuffer.fast_paths = True


# ------------------------------------------------------------ micro-batcher


def frows(ids, ts=-1) -> FeatureRows:
    return FeatureRows(list(ids), rows_x(ids), np.full(len(ids), ts, dtype=np.int64))


def test_micro_batcher_due_by_size_and_latency():
    mb = MicroBatcher(max_rows=4, max_latency_ms=100)
    assert not mb.due(0) and mb.time_to_due(0) is None and mb.take() is None
    mb.add(frows(["a", "b"]), now_ms=10)
    mb.add(None, now_ms=11)
    assert not mb.due(109) and mb.time_to_due(50) == 60 and mb.due(110) and mb.time_to_due(500) == 0
    mb.add(frows(["c", "d", "e"]), now_ms=20)
    assert mb.due(20) and mb.time_to_due(20) == 0 and len(mb) == 5
    batch = mb.take()
    assert (
        batch.ids == ["a", "b", "c", "d"]
        and np.array_equal(batch.X, rows_x("abcd"))
        and batch.X.flags.c_contiguous
    )
    assert len(mb) == 1 and mb.time_to_due(20) == 100  # "e" arrived at 20
    assert mb.take().ids == ["e"] and len(mb) == 0


def test_micro_batcher_state_round_trip():
    mb = MicroBatcher(max_rows=3, max_latency_ms=100)
    mb.add(frows(["a", "b"], ts=5), now_ms=10)
    mb.add(frows(["c", "d"]), now_ms=10)
    mb.add(frows(["e"], ts=7), now_ms=30)
    mb.take()
    state = mb.to_state()
    file = io.BytesIO()
    np.savez(file, **state)
    file.seek(0)
    with np.load(file, allow_pickle=False) as loaded:
        back = MicroBatcher.from_state(dict(loaded), max_rows=3, max_latency_ms=100)
    assert_same_state(state, back.to_state())
    assert len(back) == 2 and back.time_to_due(50) == mb.time_to_due(50) == 60
    a, b = mb.take(), back.take()
    assert (
        a.ids == b.ids == ["d", "e"]
        and np.array_equal(a.X, b.X)
        and a.ts.tolist() == b.ts.tolist() == [-1, 7]
    )
    empty = MicroBatcher.from_state(back.to_state(), max_rows=3, max_latency_ms=100)
    assert len(empty) == 0 and empty.to_state()["X"].shape == (0, K)


# ------------------------------------------------------------ memory bounds (issue 12, item 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "drop", "pop"]), st.integers(0, 40)), max_size=300))
def test_arrival_order_is_a_list_in_arrival_order(ops):
    """ArrivalOrder (ring with stale entries, compaction) answers as a plain list would."""
    from iolstream.stream.stores import ArrivalOrder

    order, model = ArrivalOrder(), []
    for op, slot in ops:
        if op == "push" and slot not in model:
            order.push(slot) if slot % 2 else order.push_many(np.array([slot]))
            model.append(slot)
        elif op == "drop" and slot in model:
            order.drop(np.array([slot]))
            model.remove(slot)
        elif op == "pop" and model:
            assert order.pop() == model.pop(0)
        assert len(order) == len(model) and order.oldest() == (model[0] if model else -1)
    assert len(order._ring) <= max(16, 4 * len(ops))


def _flood(buf, n: int, start: int, batch: int, now: int) -> list:
    """n labels whose rows never come (one per call when batch is 1), and n rows whose labels never
    come, with every tenth row labelled (joins take entries out of the middle of both stores)."""
    sources = []
    for i in range(start, start + n, batch):
        ids = [f"lab-{j}" for j in range(i, min(i + batch, start + n))]
        res = buf.add_labels(LabelRows(ids, np.arange(len(ids)) % 3), now, source=("l", 0, i))
        sources += res.orphan_sources
        rows = [f"row-{j}" for j in range(i, min(i + batch, start + n))]
        add_rows(buf, rows, seq=i, now=now)
        tenth = [r for r in rows if int(r[4:]) % 10 == 0]
        if tenth:
            add_labels(buf, tenth, [1] * len(tenth), now=now)
    return sources


def _container_sizes(buf) -> dict:
    import sys

    return {
        "early_dict": sys.getsizeof(buf._early.index),
        "early_slots": buf._early.capacity,
        "early_ring": len(buf._early._order._ring),
        "pending_dict": sys.getsizeof(buf._pending),
        "pending_slots": len(buf._rows.seq),
        "pending_ring": len(buf._rows.order._ring),
        "free": len(buf._rows.free),
    }


@pytest.mark.parametrize("batch", [1, 37])
def test_stores_stay_at_their_bound_after_a_flood_six_times_the_bound(batch):
    """After a flood 6x the bound no container is larger than after a flood 2x the bound (dicts
    rebuilt under churn, slots, rings, free list), and every slot count is within 2x the bound."""
    bound = 500
    buf = make(max_pending_rows=bound, max_early_labels=bound, remember_done=10 * bound, row_ttl_batches=1)
    sources = _flood(buf, 2 * bound, 0, batch, now=0)
    assert (
        len(sources) == bound and buf.n_early == bound and bound - batch < len(buf) <= bound
    )  # the last rows' labels joined
    after_2x = _container_sizes(buf)
    sources += _flood(buf, 4 * bound, 2 * bound, batch, now=1)
    after_6x = _container_sizes(buf)
    varying = (
        "pending_slots",
        "free",
    )  # up to bound + batch: the slots of a batch are taken before the oldest are evicted
    assert {k: v for k, v in after_6x.items() if k not in varying} == {
        k: v for k, v in after_2x.items() if k not in varying
    }
    assert (
        after_6x["pending_slots"] <= max(1024, bound + batch) and after_6x["free"] <= batch + bound // 10 + 1
    )
    assert buf.n_early == bound and bound - batch < len(buf) <= bound
    assert after_6x["early_slots"] <= 2 * (bound + 1)
    assert after_6x["early_ring"] <= 4 * (bound + 1) and after_6x["pending_ring"] <= 4 * (bound + batch)
    # every label pushed out came back with the source of the message that brought it, oldest first
    last_batch = 2 * bound + (3 * bound - 1) // batch * batch  # where the batch of label 5 * bound - 1 began
    assert len(sources) == 5 * bound and sources[0] == ("l", 0, 0) and sources[-1] == ("l", 0, last_batch)
    assert buf.counters["labels_orphan"] == 5 * bound
    check_identities(buf)
    # the stores drain completely and keep working
    exp = buf.expire(now_ms=10**6, batch_seq=10**6)
    assert (
        buf.n_early == 0
        and len(buf) == 0
        and len(exp.orphan_sources) == len(exp.rejected) == bound
        and len(exp.ids)
    )
    assert {b.reason for b, _ in exp.rejected} == {"unknown_id"}
    check_identities(buf)


def test_waiting_labels_memory_is_bounded_and_does_not_grow_with_the_flood():
    """tracemalloc, as a generous structural bound (not a measurement; ``iolstream bench --suite
    memory`` measures): the labels held cost under 400 bytes each, and a flood 3x longer adds
    (almost) nothing once the store is full."""
    import gc
    import tracemalloc

    bound = 5000
    buf = make(max_early_labels=bound, remember_done=10)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]

        def flood(start, n):
            for i in range(start, start + n):
                buf.add_labels(LabelRows([f"label-{i}"], np.array([i % 3])), 0, source=("labels", 0, i))
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - base

        at_2x = flood(0, 2 * bound)
        at_6x = flood(2 * bound, 4 * bound)
    finally:
        tracemalloc.stop()
    assert buf.n_early == bound
    assert at_2x < 400 * bound, at_2x / bound
    assert at_6x < at_2x + 16 * bound, (at_2x / bound, at_6x / bound)


def test_restored_buffer_takes_the_sources_back():
    buf = make(max_early_labels=3)
    buf.add_labels(LabelRows(["a", "b"], np.array([0, 1])), 0, source="m1")
    restored = JoinBuffer.from_state(
        buf.to_state(),
        **{
            k: getattr(buf, k)
            for k in (
                "target",
                "n_features",
                "max_pending_rows",
                "row_ttl_ms",
                "row_ttl_batches",
                "early_label_ttl_ms",
                "max_early_labels",
                "remember_done",
            )
        },
    )
    assert [s for *_, s in restored.early_labels()] == [None, None]
    restored.set_early_sources([("b", "m1"), ("zz", "m2")])
    assert restored.early_labels() == [("a", 0, 0, None), ("b", 1, 0, "m1")]
    exp = restored.expire(now_ms=2000, batch_seq=0)
    assert exp.orphan_sources == [None, "m1"] and [orjson.loads(raw)["id"] for _, raw in exp.rejected] == [
        "a",
        "b",
    ]
