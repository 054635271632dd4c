"""Forget requests in the stream logic, without Kafka (docs/design.md §13): each row is found wherever it is
— not predicted yet, only its label come, waiting for its label, joined and waiting to be folded in, folded
in, expired with its Gram kept — and taken out of there and out of the model, which then holds the closed
form of the rows not forgotten; a later row or label for the id is refused; an id that cannot be forgotten is
a dead letter with its reason; the receipts wait for a snapshot and survive a restart; the retention store
follows the snapshots."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from test_stream import (
    CLASSES,
    NEVER,
    Recorder,
    assert_sums,
    data,
    features,
    labels,
    model_config,
    offline_sums,
    stream_config,
)

from iolstream.core.model import EdRVFL
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.retention import RetentionStore, record_shape


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


WARMUP = 20


def make(tmp_path, retention_rows=10_000, model_kw=None, **stream_kw) -> StreamProcessor:
    cfg = model_config(warmup_rows=WARMUP, **{"mode": "forward", **(model_kw or {})})
    store = RetentionStore(tmp_path / "retention", **record_shape(cfg), rows=retention_rows, segment_rows=64)
    proc = StreamProcessor(EdRVFL(cfg), stream_config(**stream_kw), retention=store)
    proc.erasure.load_state(None)
    return proc


def forget(ids) -> bytes:
    ids = list(ids)
    return orjson.dumps({"id": ids[0]} if len(ids) == 1 else {"ids": ids})


def run(proc, events) -> Recorder:
    """events as Recorder's, plus ("x", bytes, source, now) forget requests."""
    rec = Recorder(proc)
    for kind, value, source, now in events:
        if kind == "x":
            rec._dead(proc.on_forget(value, source, now))
        else:
            rec.feed([(kind, value, source, now)])
    return rec


def the_stream(X, y):
    """Rows 0..63 in batches of 8; labels of rows 0..47 folded in; rows 48..51 joined (queued, not folded: 4 of
    8); rows 52..63 waiting; rows 64..67 in the batcher; an early label for row 70."""
    events = [("f", features(range(s, s + 8), X), "f", s) for s in range(0, 64, 8)]
    events += [("l", labels(range(s, s + 8), y), "l", 100 + s) for s in range(0, 48, 8)]
    events += [("l", labels(range(48, 52), y), "l", 200), ("f", features(range(64, 68), X), "f", 201)]
    events += [("l", labels([70], y), "l", 202)]
    return events


def test_a_row_is_found_wherever_it_is_and_the_model_becomes_the_one_without_it(tmp_path):
    X, y = data(96, seed=11)
    proc = make(tmp_path)
    gone = [3, 20, 49, 60, 65, 70]
    rec = run(proc, the_stream(X, y) + [("x", forget([f"r{i}" for i in gone] + ["nope"]), "x@0", 300)])
    stages = {r["id"]: r["stage"] for r in proc.erasure.waiting}
    assert stages == {
        "r3": "labelled",
        "r20": "labelled",
        "r49": "joined",
        "r60": "waiting",
        "r65": "queued",
        "r70": "label_only",
    }
    assert [(reason, orjson.loads(value)) for reason, value, _ in rec.dead] == [
        ("forget_unknown_id", {"id": "nope"})
    ]
    assert proc.status()["ids_forgotten"] == 6 and proc.status()["rows_erased"] == 4
    # the rest of the stream: the forgotten ids' rows and labels are refused, the others learned
    later = [("l", labels(range(48, 64), y), "l", 400), ("f", features(range(68, 72), X), "f", 401)]
    later += [("l", labels(range(64, 72), y), "l", 402), ("force", None, None, 403)]
    later += [("x", forget(["r3"]), "x@1", 404)]
    rec = run(proc, later)
    refused = sorted((reason, orjson.loads(value)["id"]) for reason, value, _ in rec.dead)
    assert refused == [
        ("forget_already_forgotten", "r3"),
        ("forgotten_id", "r49"),
        ("forgotten_id", "r60"),
        ("forgotten_id", "r65"),
        ("forgotten_id", "r70"),
        ("forgotten_id", "r70"),  # its row came after all, and its label again
    ]
    kept = [i for i in range(72) if i not in gone]
    expected = offline_sums(proc.model.config, X, y, WARMUP, kept, kept)
    assert_sums(proc, expected)
    st = proc.model.learner.state
    assert (st.rows_observed, st.rows_labelled) == (len(kept), len(kept))


def test_rows_forgotten_before_the_warm_up_froze_never_enter_the_scaling(tmp_path):
    X, y = data(64, seed=12)
    proc = make(tmp_path)
    events = [("f", features(range(s, s + 8), X), "f", s) for s in range(0, 16, 8)]  # held: 16 < 20
    events += [("x", forget(["r2", "r9"]), "x@0", 20)]
    events += [("f", features(range(s, s + 8), X), "f", 30 + s) for s in range(16, 48, 8)]
    events += [("l", labels(range(0, 48), y), "l", 100), ("force", None, None, 101)]
    run(proc, events)
    kept = [i for i in range(48) if i not in (2, 9)]
    np.testing.assert_allclose(proc.model.scaler.mean, X[kept[:WARMUP]].mean(axis=0), rtol=1e-12)
    cfg = model_config(warmup_rows=WARMUP)
    model = EdRVFL(cfg)
    model.scaler.partial_fit(X[kept[:WARMUP]])
    for layer, ls in enumerate(proc.model.learner.state.layers):
        d = model.features(X[kept])[layer].T
        a = float(cfg.lam) * np.eye(d.shape[1]) + d.T @ d
        np.testing.assert_allclose(np.tril(ls.gram), np.tril(a), rtol=1e-9, atol=1e-9 * np.abs(a).max())


@pytest.mark.parametrize("forget_expired", [False, True])
def test_an_expired_row_keeps_its_gram_until_forgotten(tmp_path, forget_expired):
    X, y = data(64, seed=13)
    proc = make(tmp_path, row_ttl_batches=1, forget_expired=forget_expired)
    events = [("f", features(range(s, s + 8), X), "f", s) for s in range(0, 40, 8)]
    # rows 0..23 are predicted together once the scaler froze, and expire two batches later
    events += [("l", labels(range(24, 40), y), "l", 100), ("force", None, None, 101)]
    events += [("x", forget(["r3", "r30"]), "x@0", 102)]
    run(proc, events)
    stages = {r["id"]: r["stage"] for r in proc.erasure.waiting}
    assert stages == {"r3": "left" if forget_expired else "observed", "r30": "labelled"}
    assert proc.join.counters["rows_expired"] == 24
    observed = [i for i in range(40) if i not in (3, 30) and (i >= 24 or not forget_expired)]
    labelled = [i for i in range(24, 40) if i != 30]
    assert_sums(proc, offline_sums(proc.model.config, X, y, WARMUP, observed, labelled))


def test_past_the_retention_window_a_learned_row_is_refused_with_its_reason(tmp_path):
    X, y = data(64, seed=14)
    proc = make(tmp_path, retention_rows=16)
    events = [("f", features(range(s, s + 8), X), "f", s) for s in range(0, 48, 8)]
    events += [("l", labels(range(0, 40), y), "l", 100), ("x", forget(["r1", "r41"]), "x@0", 101)]
    rec = run(proc, events)
    assert [(r, orjson.loads(v)["id"]) for r, v, _ in rec.dead] == [("forget_past_retention", "r1")]
    assert [r["id"] for r in proc.erasure.waiting] == ["r41"]


def test_receipts_wait_for_a_snapshot_and_a_restart_from_it_finds_them_and_the_store(tmp_path):
    X, y = data(96, seed=15)
    proc = make(tmp_path)
    run(proc, the_stream(X, y) + [("x", forget(["r3", "r60"]), ("forget", 0, 7), 300)])
    version = proc.model.version
    proc.erasure.seal("snap-000000000002.iolsnap")
    proc.erasure.flush()
    manifest, arrays = written(proc)
    receipts = proc.erasure.durable("snap-000000000002.iolsnap", manifest["stream"]["erasure"])
    assert [(r["id"], r["stage"], r["model_version"], r["snapshot"], r["request"]) for r in receipts] == [
        ("r3", "labelled", version, "snap-000000000002.iolsnap", ["forget", 0, 7]),
        ("r60", "waiting", version, "snap-000000000002.iolsnap", ["forget", 0, 7]),
    ]
    store = RetentionStore(
        tmp_path / "retention", **record_shape(proc.model.config), rows=10_000, segment_rows=64
    )
    again = StreamProcessor.from_state(manifest, arrays, stream_config(), retention=store)
    assert [r["id"] for r in again.erasure.due()] == ["r3", "r60"]
    # the store came back to the snapshot: a labelled row is found again, a forgotten one is refused
    rec = run(again, [("x", forget(["r20", "r3"]), "x@1", 400)])
    assert [(r, orjson.loads(v)["id"]) for r, v, _ in rec.dead] == [("forget_already_forgotten", "r3")]
    assert [r["id"] for r in again.erasure.waiting] == ["r20"]
    kept = [i for i in range(64) if i not in (3, 60, 20)]
    labelled = [i for i in range(48) if i not in (3, 20)]  # 48..51 joined, not folded in yet
    assert_sums(again, offline_sums(again.model.config, X, y, WARMUP, kept, labelled))
    # r3's receipt went out before the restart (the commit unit finds it on the topic): no longer held, and not
    # counted as this process's; r60's goes out now and is
    before = again.status()["receipts_out"]
    r3, r60 = [r for r in again.erasure.due() if r["id"] in ("r3", "r60")]
    again.erasure.sent([r3], here=False)
    again.erasure.sent([r60])
    assert again.status()["receipts_out"] == before + 1 and not {"r3", "r60"} & {
        r["id"] for r in again.erasure.due()
    }


def test_a_restart_from_the_snapshot_before_the_removal_replays_it_the_same(tmp_path):
    """The record of a row removed after the snapshot keeps its data until a snapshot without it is durable: a
    crash before that, and the replay from the snapshot before takes it out again."""
    X, y = data(96, seed=16)
    proc = make(tmp_path)
    run(proc, the_stream(X, y))
    proc.erasure.flush()
    manifest, arrays = written(proc)
    run(proc, [("x", forget(["r3"]), "x@0", 300)])
    after = {k: v.copy() for k, v in _sums(proc).items()}
    store = RetentionStore(
        tmp_path / "retention", **record_shape(proc.model.config), rows=10_000, segment_rows=64
    )
    replayed = StreamProcessor.from_state(manifest, arrays, stream_config(), retention=store)
    run(replayed, [("x", forget(["r3"]), "x@0", 300)])
    for key, value in _sums(replayed).items():
        np.testing.assert_array_equal(value, after[key], err_msg=key)


def written(proc) -> tuple[dict, dict]:
    """The processor's state as a snapshot holds it: a copy (``to_state`` hands out views of the live sums)."""
    manifest, arrays = proc.to_state()
    return orjson.loads(orjson.dumps(manifest)), {k: np.array(v) for k, v in arrays.items()}


def _sums(proc) -> dict:
    return {
        f"{name}{i}": np.tril(getattr(ls, name)) if name == "gram" else getattr(ls, name).copy()
        for i, ls in enumerate(proc.model.learner.state.layers)
        for name in ("gram", "rhs")
    }


def test_bad_requests_are_dead_letters_and_change_nothing(tmp_path):
    X, y = data(64, seed=17)
    proc = make(tmp_path)
    run(proc, [("f", features(range(0, 24), X), "f", 0)])
    before = _sums(proc)
    rec = run(
        proc, [("x", b"{", "x@0", 1), ("x", b'{"ids": []}', "x@1", 2), ("x", b'{"id": null}', "x@2", 3)]
    )
    assert [r for r, _, _ in rec.dead] == ["malformed_json", "bad_schema", "missing_id"]
    for key, value in _sums(proc).items():
        assert np.array_equal(value, before[key])
    assert not proc.erasure.waiting
    assert NEVER and CLASSES  # the shared stream helpers


@pytest.mark.parametrize("mode", ["forward", "auto"])
def test_a_class_weighted_row_leaves_at_its_weight_with_its_calibration_terms_and_class_count(tmp_path, mode):
    """The retention record keeps the class weight a row's label entered with and each candidate's scores of it;
    forgetting the rows of the last label batch puts c, the class counts and every candidate's calibration sums
    back where they were before those labels came (docs/design.md §13)."""
    X, y = data(64, seed=23)
    weights = (1.0, 4.0, 0.25)
    proc = make(tmp_path, model_kw={"mode": mode, "class_weight": list(weights)})
    assert proc.model.calibrated and proc.erasure.retention.n_scores == len(proc.model.learners) * 3
    events = [("f", features(range(s, s + 8), X), "f", s) for s in range(0, 48, 8)]
    events += [("l", labels(range(0, 40), y), "l", 100), ("force", None, None, 101)]
    run(proc, events)
    rhs = [ls.rhs.copy() for ls in proc.model.learner.state.layers]
    counts = proc.model.class_counts.copy()
    cal = [ln.calibration_sums.copy() for ln in proc.model.learners]
    assert counts.sum() == 40 and all(c.any() for c in cal)
    run(proc, [("l", labels(range(40, 48), y), "l", 102), ("force", None, None, 103)])
    store = proc.erasure.retention
    status, seqs = store.find([f"r{i}" for i in range(40, 48)])
    rec = store.read(seqs)
    np.testing.assert_array_equal(rec["weight"], np.array(weights)[y[40:48]])
    assert (
        np.isfinite(rec["scores"]).any(axis=1).all()
    )  # every row: the scores of the candidates that scored it
    run(proc, [("x", forget([f"r{i}" for i in range(40, 48)]), "x@0", 104)])
    assert proc.erasure.counters["rows_erased"] == 8
    np.testing.assert_array_equal(proc.model.class_counts, counts)
    for ls, before in zip(proc.model.learner.state.layers, rhs):
        np.testing.assert_allclose(ls.rhs, before, rtol=1e-9, atol=1e-9)
    for j, (ln, before) in enumerate(zip(proc.model.learners, cal)):
        np.testing.assert_allclose(
            ln.calibration_sums, before, rtol=1e-9, atol=1e-9, err_msg=f"candidate {j}"
        )
