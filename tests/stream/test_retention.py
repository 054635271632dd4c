"""The retention store (``stream.retention``, docs/design.md §13): one record per row observed, found again by
id; bounded by rows (and time) on disk; consistent with the snapshots after a crash: a restart from a snapshot
sees exactly the records that snapshot covers, a row erased keeps its data until a snapshot without it is
durable, and nothing of it after."""

from __future__ import annotations

import numpy as np
import pytest

from iolstream.stream.recent_ids import fingerprints
from iolstream.stream.retention import (
    ERASED,
    LABELLED,
    LEFT,
    OBSERVED,
    RetentionConfig,
    RetentionStore,
    record_dtype,
)


def _store(tmp_path, rows=100, segment_rows=16, **kw) -> RetentionStore:
    return RetentionStore(
        tmp_path / "ret", n_features=3, n_labels=1, rows=rows, segment_rows=segment_rows, **kw
    )


def _ids(a: int, b: int) -> list[str]:
    return [f"r{i}" for i in range(a, b)]


def _x(a: int, b: int) -> np.ndarray:
    return np.arange(a, b, dtype=float)[:, None] * np.array([1.0, 10.0, 100.0])


def test_bytes_per_row_is_the_packed_record():
    assert record_dtype(10, 1).itemsize == 49 + 80 + 8
    assert record_dtype(18, 1).itemsize == 201  # config/worker.yaml's default model
    assert record_dtype(4, 3).itemsize == 49 + 32 + 24


def test_rows_are_found_by_id_with_their_features_label_and_stamp(tmp_path):
    store = _store(tmp_path)
    store.append(_ids(0, 20), _x(0, 20), stamp=20, at_ms=5)
    store.append(_ids(20, 30), _x(20, 30), stamp=30, at_ms=6)
    assert store.label(["r3", "r25", "nope"], np.array([[2.0], [1.0], [0.0]])) == 2
    status, seqs = store.find(["r3", "r25", "r7", "nope"])
    assert status.tolist() == [LABELLED, LABELLED, OBSERVED, 0] and seqs.tolist() == [3, 25, 7, -1]
    rec = store.read(seqs[:3])
    np.testing.assert_array_equal(rec["x"], _x(0, 30)[[3, 25, 7]])
    assert rec["y"][:, 0].tolist() == [2.0, 1.0, 0.0] and rec["stamp"].tolist() == [20, 30, 20]
    assert rec["fp"].tolist() == fingerprints(["r3", "r25", "r7"]).tolist()


def test_the_window_is_the_last_rows_and_old_segments_go_once_no_snapshot_needs_them(tmp_path):
    store = _store(tmp_path, rows=40, segment_rows=16)
    for start in range(0, 200, 10):
        store.append(_ids(start, start + 10), _x(start, start + 10), stamp=start + 10, at_ms=start)
    status, _ = store.find(["r159", "r160", "r199"])
    assert status.tolist() == [0, OBSERVED, OBSERVED]  # the last 40 rows only
    store.flush()
    store.durable(store.to_state())  # a snapshot at tail 200: its window starts at 160
    files = sorted(p.name for p in (tmp_path / "ret").glob("seg-*.rows"))
    assert files == [f"seg-{160:015d}.rows", f"seg-{176:015d}.rows", f"seg-{192:015d}.rows"]
    assert store.disk_bytes() <= (40 + 2 * 16) * store.bytes_per_row + 4 * 4096


def test_time_retention_says_which_records_are_too_old(tmp_path):
    store = _store(tmp_path, ms=1000)
    store.append(_ids(0, 2), _x(0, 2), stamp=2, at_ms=0)
    store.append(_ids(2, 4), _x(2, 4), stamp=4, at_ms=5000)
    rec = store.read(store.find(_ids(0, 4))[1])
    assert store.past_time(rec, now_ms=5500).tolist() == [True, True, False, False]


def test_a_restart_from_a_snapshot_sees_what_it_covers_and_the_replay_writes_the_rest_again(tmp_path):
    """Records written after the snapshot belong to input its replay reads again: after ``load`` they are not in
    the window, and the replay's records take their places."""
    store = _store(tmp_path)
    store.append(_ids(0, 20), _x(0, 20), stamp=20, at_ms=0)
    store.label(_ids(0, 5), np.ones((5, 1)))
    store.flush()
    saved = store.to_state()
    store.append(_ids(20, 40), _x(20, 40), stamp=40, at_ms=1)  # after the snapshot, then a crash
    store.label(_ids(5, 10), np.ones((5, 1)))
    restarted = _store(tmp_path)
    restarted.load(saved)
    status, seqs = restarted.find(["r0", "r19", "r20", "r39"])
    assert status.tolist()[2:] == [0, 0] and seqs.tolist()[:2] == [0, 19]
    # a label folded after the snapshot was written to its record: the replay folds it again, the same
    restarted.append(_ids(20, 40), _x(20, 40), stamp=40, at_ms=1)
    assert restarted.find(["r39"])[1].tolist() == [39]
    np.testing.assert_array_equal(restarted.read(np.arange(40))["x"], _x(0, 40))


def test_an_erased_row_keeps_its_data_until_a_snapshot_without_it_is_durable_then_nothing(tmp_path):
    store = _store(tmp_path)
    store.append(_ids(0, 20), _x(0, 20), stamp=20, at_ms=0)
    store.label(_ids(0, 20), np.full((20, 1), 2.0))
    before = store.to_state()
    status, seqs = store.find(["r4", "r11"])
    store.erase(["r4", "r11"], seqs)
    assert store.find(["r4", "r11"])[0].tolist() == [ERASED, ERASED]
    # not durable yet: a restart from the snapshot before needs the data to take the rows out again
    assert (store.read(seqs)["x"] != 0).any()
    crashed = _store(tmp_path)
    crashed.load(before)
    assert crashed.find(["r4"])[0].tolist() == [LABELLED]
    # the snapshot without them: durable, so their data goes, their fingerprints stay
    store.load(before)
    store.erase(["r4", "r11"], seqs)
    after = store.to_state()
    assert after["erased"] == [4, 11]
    store.flush()
    store.durable(after)
    rec = store.read(seqs)
    assert (rec["x"] == 0).all() and (rec["y"] == 0).all() and (rec["stamp"] == 0).all()
    assert rec["status"].tolist() == [ERASED, ERASED] and store.to_state()["erased"] == []
    raw = b"".join(p.read_bytes() for p in (tmp_path / "ret").glob("seg-*.rows"))
    for value in (4.0, 40.0, 400.0, 11.0, 110.0, 1100.0):  # their features are nowhere in the files
        assert np.float64(value).tobytes() not in raw
    # a crash between the durable snapshot and the zeroing: loading it zeroes them
    again = _store(tmp_path)
    again.load(after)
    assert again.find(["r4", "r11", "r5"])[0].tolist() == [ERASED, ERASED, LABELLED]


def test_rows_that_left_the_model_unlabelled_keep_nothing(tmp_path):
    store = _store(tmp_path)
    store.append(_ids(0, 4), _x(0, 4), stamp=4, at_ms=0)
    store.left(["r1"])
    status, seqs = store.find(["r1"])
    assert status.tolist() == [LEFT] and (store.read(seqs)["x"] == 0).all()


def test_a_fresh_model_starts_with_an_empty_store(tmp_path):
    store = _store(tmp_path)
    store.append(_ids(0, 20), _x(0, 20), stamp=20, at_ms=0)
    store.flush()
    fresh = _store(tmp_path)
    fresh.load(None)
    assert len(fresh) == 0 and not list((tmp_path / "ret").glob("seg-*.rows"))


def test_an_id_held_already_is_not_kept_twice(tmp_path):
    """The processor screens ids held here as duplicates; should one come anyway, the index stays in order."""
    store = _store(tmp_path)
    store.append(["a", "b"], _x(0, 2), stamp=2, at_ms=0)
    store.append(["c", "a", "c"], _x(2, 5), stamp=5, at_ms=0)
    status, seqs = store.find(["a", "b", "c"])
    assert seqs.tolist() == [0, 1, 2] and status.tolist() == [OBSERVED] * 3
    store.append(["d"], _x(5, 6), stamp=6, at_ms=0)
    assert store.find(["d"])[1].tolist() == [5]
    store.flush()
    again = _store(tmp_path)
    again.load(store.to_state())
    assert again.find(["a", "c", "d"])[1].tolist() == [0, 2, 5]


@pytest.mark.parametrize("bad", [{"rows": -1}, {"rows": True}, {"ms": 0}, {"rows": 2**31}])
def test_the_config_names_the_bad_key(bad):
    with pytest.raises(ValueError, match=f"retention.{next(iter(bad))}"):
        RetentionConfig(**bad)


def test_segments_past_the_time_bound_go_and_their_rows_are_past_retention(tmp_path):
    store = _store(tmp_path, ms=1000)
    store.append(_ids(0, 40), _x(0, 40), stamp=40, at_ms=0)
    store.append(_ids(40, 80), _x(40, 80), stamp=80, at_ms=10_000)
    store.flush()
    store.durable(store.to_state(), now_ms=10_500)
    files = sorted(p.name for p in (tmp_path / "ret").glob("seg-*.rows"))
    assert files == [
        f"seg-{32:015d}.rows",
        f"seg-{48:015d}.rows",
        f"seg-{64:015d}.rows",
    ]  # 32..47 holds new rows
    status, seqs = store.find(["r5", "r35", "r50"])
    rec = store.read(seqs)
    assert rec["seq"].tolist() == [-1, 35, 50] and not rec["x"][0].any()  # r5's record is gone
    assert store.past_time(rec, now_ms=10_500).tolist() == [True, True, False]
    store.label(["r5"], np.ones((1, 1)))  # its segment is not made again
    assert f"seg-{0:015d}.rows" not in {p.name for p in (tmp_path / "ret").glob("seg-*.rows")}
