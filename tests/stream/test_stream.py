"""StreamProcessor without Kafka: equal to the offline learner, bitwise restartable, and robust.

Messages are built as bytes, time is passed explicitly (``now_ms``), so every run is
deterministic; seeds are fixed and named in the assertion messages.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka.snapshots import SnapshotStore
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor
from iolstream.tools.protocol import EdRVFLLearner, Protocol, Split, run_protocol


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """Bitwise comparisons need the same BLAS configuration on both sides: evaluate's run switches
    SciPy's pool to one thread (step_tuner.configure_for_model), so the processor must run with one too."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


K = 5
CLASSES = ("a", "b", "c")
NEVER = 10**12  # a latency no test reaches


def data(n: int, seed: int = 0):
    """Rows and learnable labels (class = argmax of a fixed linear map)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, K)) * [1.0, 2.0, 0.5, 3.0, 1.0] + [0.0, 1.0, -2.0, 5.0, 0.0]
    y = (X @ rng.standard_normal((K, len(CLASSES)))).argmax(axis=1)
    return X, y


def model_config(**kw) -> ModelConfig:
    base = dict(n_inputs=K, classes=CLASSES, n_nodes=24, n_layers=2, scaler="warmup", warmup_rows=20, seed=3)
    return ModelConfig(**{**base, **kw})


def stream_config(**kw) -> StreamConfig:
    base = dict(
        batch_rows=8,
        max_batch_latency_ms=NEVER,
        label_batch_rows=8,
        max_label_latency_ms=NEVER,
        row_ttl_ms=None,
    )
    return StreamConfig(**{**base, **kw})


def processor(model_kw=None, **stream_kw) -> StreamProcessor:
    return StreamProcessor(EdRVFL(model_config(**(model_kw or {}))), stream_config(**stream_kw))


def ids_of(rows) -> list[str]:
    return [f"r{i}" for i in rows]


def features(rows, X) -> bytes:
    rows = list(rows)
    if len(rows) == 1:
        return orjson.dumps({"id": f"r{rows[0]}", "x": X[rows[0]].tolist()})
    return orjson.dumps({"ids": ids_of(rows), "x": X[rows].tolist()})


def labels(rows, y) -> bytes:
    rows = list(rows)
    if len(rows) == 1:
        return orjson.dumps({"id": f"r{rows[0]}", "y": CLASSES[y[rows[0]]]})
    return orjson.dumps({"ids": ids_of(rows), "y": [CLASSES[y[i]] for i in rows]})


class Recorder:
    """Drives a processor through events and keeps everything it emitted."""

    def __init__(self, proc: StreamProcessor):
        self.proc = proc
        self.predictions: list[tuple[str, bytes]] = []
        self.dead: list[tuple[str, bytes, object]] = []

    def feed(self, events) -> Recorder:
        """events: ("f" | "l", bytes, source, now_ms) or ("step", None, None, now_ms) or ("force", ...)."""
        for kind, value, source, now in events:
            if kind == "f":
                self._dead(self.proc.on_features(value, source, now))
            elif kind == "l":
                self._dead(self.proc.on_labels(value, source, now))
            if kind in ("f", "l", "step", "force"):
                out = self.proc.step(now, force=kind == "force")
                self.predictions += out.predictions
                self._dead(out.dead_letters)
        return self

    def _dead(self, dead) -> None:
        self.dead += [(d.bad.reason, d.value, d.source) for d in dead]


def state_arrays(proc: StreamProcessor) -> dict[str, np.ndarray]:
    st = proc.model.learner.state
    out = {}
    for i, ls in enumerate(st.layers):
        out[f"A{i}"], out[f"c{i}"], out[f"beta{i}"] = np.tril(ls.gram), ls.rhs.copy(), ls.beta.copy()
    out["version"] = np.array(st.version)
    return out


def assert_bitwise(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), (
            f"{what}: {key} differs (max |Δ| {np.abs(a[key] - b[key]).max():.3g})"
        )


def offline_sums(cfg: ModelConfig, X, y, warmup_rows, observed, labelled):
    """A = λI + Σ_observed DᵀD and c = Σ_labelled DᵀY, β = A⁻¹c per layer (docs/design.md §2): the closed form."""
    model = EdRVFL(cfg)
    lam = float(cfg.lam)  # the configs here use one λ for every layer
    model.scaler.partial_fit(X[:warmup_rows])
    out = []
    for layer in range(cfg.n_layers):
        d_obs = model.features(X[observed])[layer].T
        d_lab = model.features(X[labelled])[layer].T
        A = lam * np.eye(d_obs.shape[1]) + d_obs.T @ d_obs
        c = d_lab.T @ model.one_hot(np.asarray(y)[labelled])
        out.append((A, c, np.linalg.solve(A, c)))
    return out


def assert_sums(proc: StreamProcessor, expected, rtol=1e-9) -> None:
    for layer, (A, c, beta) in enumerate(expected):
        ls = proc.model.learner.state.layers[layer]
        np.testing.assert_allclose(np.tril(ls.gram), np.tril(A), rtol=rtol, atol=rtol * np.abs(A).max())
        np.testing.assert_allclose(ls.rhs, c, rtol=rtol, atol=rtol * np.abs(c).max())
        np.testing.assert_allclose(ls.beta, beta, rtol=1e-7, atol=1e-9 * np.abs(beta).max())


# ------------------------------------------------------------------ the offline learner


def paper_events(X, y, b: int):
    """Batch t-1's labels, then batch t's features: labels one batch late (evaluate's label_delay=1)."""
    n = len(X)
    starts = list(range(0, n, b))
    events, now = [], 0
    for t, start in enumerate(starts):
        now += 10
        if t:
            prev = starts[t - 1]
            events.append(("l", labels(range(prev, prev + b), y), ("l", 0, t - 1), now))
        events.append(("f", features(range(start, min(start + b, n)), X), ("f", 0, t), now))
    last = starts[-1]
    events.append(("l", labels(range(last, n), y), ("l", 0, len(starts)), now + 10))
    events.append(("force", None, None, now + 20))
    return events


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_processor_equals_evaluate_protocol_bitwise(mode):
    """Labels one batch late, label batches = feature batches: the processor is evaluate's protocol
    (the paper's recursion), step for step — same predictions, same β, to the bit."""
    X, y = data(203, seed=1)
    b = 8
    cfg = model_config(mode=mode)
    proc = StreamProcessor(EdRVFL(cfg), stream_config(batch_rows=b, label_batch_rows=b))
    rec = Recorder(proc).feed(paper_events(X, y, b))

    learner = EdRVFLLearner(cfg)
    split = Split("synthetic", "classification", CLASSES, tuple("x" * K), X, y, X[:3], y[:3])
    result = run_protocol(learner, split, Protocol(batch=b, label_delay=1, curve_points=1))
    assert [k for k, _ in rec.predictions] == ids_of(range(len(X)))
    y_hat = np.array([CLASSES.index(orjson.loads(v)["y_hat"]) for _, v in rec.predictions])
    per_batch = [(y_hat[s : s + b] == y[s : s + b]).mean() for s in range(0, len(X), b)]
    assert np.array_equal(per_batch, result.batch_prequential), "the per-batch prequential accuracy differs"
    assert proc.metric.value == pytest.approx(result.prequential_metric, abs=1e-12)
    assert_bitwise(
        state_arrays(proc), {**state_arrays_of(learner.model), "version": state_arrays(proc)["version"]}, mode
    )


def state_arrays_of(model: EdRVFL) -> dict:
    out = {}
    for i, ls in enumerate(model.learner.state.layers):
        out[f"A{i}"], out[f"c{i}"], out[f"beta{i}"] = np.tril(ls.gram), ls.rhs.copy(), ls.beta.copy()
    return out


def faulty_events(
    X, y, seed: int, *, row_batches=(1, 7), label_batches=(1, 5), delay=30, dup=0.15, missing=0.1
):
    """Features in messages of random sizes, labels late, shuffled, some twice, some never."""
    rng = np.random.default_rng(seed)
    n = len(X)
    events, now, i, sent_label = [], 0, 0, 0
    order = np.arange(n)
    for start in range(0, n, 17):
        rng.shuffle(order[start : start + 17])
    order = [j for j in order.tolist() if rng.random() >= missing]
    order += [j for j in order if rng.random() < dup]  # duplicates, sent after everything else
    offset = {"f": 0, "l": 0}
    while i < n or sent_label < len(order):
        now += int(rng.integers(1, 15))
        if i < n and (sent_label >= len(order) or rng.random() < 0.55):
            size = int(rng.integers(*row_batches))
            events.append(("f", features(range(i, min(i + size, n)), X), ("f", 0, offset["f"]), now))
            offset["f"] += 1
            i = min(i + size, n)
        else:
            size = int(rng.integers(*label_batches))
            chunk = [j for j in order[sent_label : sent_label + size] if j < i + delay]
            if not chunk:
                events.append(("step", None, None, now))
                continue
            if len(set(chunk)) < len(chunk):
                chunk = chunk[:1]
            events.append(("l", labels(chunk, y), ("l", 0, offset["l"]), now))
            offset["l"] += 1
            sent_label += len(chunk)
    events.append(("force", None, None, now + 1))
    return events, sorted(set(order))


@pytest.mark.parametrize("mode", ["forward", "ridge"])
@pytest.mark.parametrize("seed", [0, 1])
def test_any_arrival_equals_closed_form(mode, seed):
    """Late, shuffled, duplicated and missing labels, messages of every size: A holds every observed
    row's Gram (-F) or every labelled row's (-R), c every joined label once (docs/design.md §2)."""
    X, y = data(260, seed=seed)
    proc = processor(
        {"mode": mode}, batch_rows=16, label_batch_rows=12, max_batch_latency_ms=40, max_label_latency_ms=30
    )
    events, labelled = faulty_events(X, y, seed)
    rec = Recorder(proc).feed(events)
    assert sorted(k for k, _ in rec.predictions) == sorted(ids_of(range(len(X)))), f"seed {seed}"
    assert rec.dead == [], f"seed {seed}"
    c = proc.counters
    assert (c["rows_in"], c["predictions_out"], c["rows_learned"]) == (len(X), len(X), len(labelled))
    assert proc.join.counters["labels_duplicate"] == c["labels_in"] - len(labelled)
    observed = np.arange(len(X)) if mode == "forward" else np.array(labelled)
    assert_sums(proc, offline_sums(proc.model.config, X, y, 20, observed, labelled))


# --------------------------------------------------------------------- state round trip


def run_with_restart(events, cut: int, tmp_path, make):
    """Feed events[:cut], snapshot to disk and back, feed the rest to the restored processor."""
    first = Recorder(make()).feed(events[:cut])
    manifest, arrays = first.proc.to_state()
    manifest["offsets"] = []
    store = SnapshotStore(tmp_path / f"cut{cut}", keep=1)
    store.write(manifest, arrays)
    snap = store.load_latest()
    restored = StreamProcessor.from_state(snap.manifest, snap.arrays, first.proc.cfg)
    second = Recorder(restored).feed(events[cut:])
    return first.predictions + second.predictions, first.dead + second.dead, restored


@pytest.mark.parametrize("mode", ["forward", "ridge", "auto"])
def test_state_round_trip_mid_stream_continues_bitwise(mode, tmp_path):
    """Cut anywhere (warm-up hold, partial batches, queued labels, early labels): restored and
    continued, the processor emits the same bytes and ends with the same β, bit for bit. With
    ``mode: auto`` also every candidate's sums and β, the selector's recent losses and the loss of
    what was emitted: given the same batches, a restart changes nothing the selector sees."""
    X, y = data(180, seed=5)
    events, _ = faulty_events(X, y, seed=5)

    def make():
        return processor(
            {"mode": mode},
            batch_rows=16,
            label_batch_rows=12,
            max_batch_latency_ms=40,
            max_label_latency_ms=30,
        )

    whole = Recorder(make()).feed(events)
    assert whole.proc.counters["label_batches"] > 5
    for cut in (3, 11, len(events) // 3, len(events) // 2, len(events) - 7):
        predictions, dead, restored = run_with_restart(events, cut, tmp_path, make)
        assert predictions == whole.predictions, f"cut {cut}"
        assert dead == whole.dead, f"cut {cut}"
        assert restored.counters == whole.proc.counters, f"cut {cut}"
        assert restored.join.counters == whole.proc.join.counters, f"cut {cut}"
        assert_bitwise(state_arrays(restored), state_arrays(whole.proc), f"{mode}, cut {cut}")
        if mode == "auto":
            assert_same_selection(restored.model, whole.proc.model, f"cut {cut}")


def assert_same_selection(got: EdRVFL, want: EdRVFL, what: str) -> None:
    """Every candidate's A, A_r, c and β, and the selector's state, bit for bit (``mode: auto``)."""
    assert got.modes == want.modes == ["forward", "ridge"], what
    for j, (a, b) in enumerate(zip(got.learners, want.learners)):
        for i, (la, lb) in enumerate(zip(a.state.layers, b.state.layers)):
            for name in ("gram", "gram_labelled", "rhs", "beta"):
                va, vb = getattr(la, name), getattr(lb, name)
                assert (va is None) == (vb is None), f"{what}: candidate {j} layer {i} {name}"
                if va is not None:
                    assert np.array_equal(np.tril(va), np.tril(vb)), f"{what}: candidate {j} layer {i} {name}"
    sa, sb = got.selector, want.selector
    assert (sa.chosen, sa.switches, sa.clock) == (sb.chosen, sb.switches, sb.clock), what
    for name in ("loss", "pair", "rows"):
        assert np.array_equal(getattr(sa, name), getattr(sb, name)), f"{what}: selector {name}"
    assert np.array_equal(got.emitted_loss, want.emitted_loss), what


def test_one_row_labels_one_row_behind_fold_whole_batches_from_the_cache(monkeypatch):
    """One-row messages, each label one message after its features: label batches fall on feature
    batches (the fold stops where the newest batch's rows begin), so after the warm-up every fold
    is one whole batch and reuses its cached features; the sums are the closed form's."""
    X, y = data(200, seed=6)
    proc = processor(batch_rows=16, label_batch_rows=16)
    recomputed = []
    features_of = proc.model.features
    monkeypatch.setattr(proc.model, "features", lambda x: recomputed.append(len(x)) or features_of(x))
    events, now = [], 0
    for i in range(len(X)):
        now += 1
        events.append(("f", features([i], X), ("f", 0, i), now))
        if i:
            events.append(("l", labels([i - 1], y), ("l", 0, i - 1), now))
    Recorder(proc).feed(events)
    folds = proc.counters["label_batches"]
    assert (
        proc.counters["rows_learned"] == 192 and folds >= 12
    )  # 12 batches predicted and labelled (labels of 192.. wait as early)
    assert sum(recomputed) <= 16 + 4, f"features recomputed for {recomputed} rows: the folds missed the cache"
    Recorder(proc).feed([("l", labels([199], y), ("l", 0, 199), now + 1), ("force", None, None, now + 2)])
    assert_sums(proc, offline_sums(proc.model.config, X, y, 20, list(range(200)), list(range(200))))


# --------------------------------------------------------------------------- warm-up


def test_warm_up_holds_rows_until_the_scaler_freezes():
    X, y = data(40, seed=2)
    proc = processor(batch_rows=8, label_batch_rows=8)
    rec = Recorder(proc)
    rec.feed([("f", features(range(0, 8), X), None, 1), ("f", features(range(8, 16), X), None, 2)])
    rec.feed(
        [("l", labels(range(0, 8), y), None, 3), ("force", None, None, 4)]
    )  # a forced step does not freeze
    assert rec.predictions == [] and not proc.model.ready and proc.held_rows == 16
    assert proc.model.learner.state.rows_observed == 0 and proc.join.n_early == 8
    rec.feed(
        [("f", features(range(16, 24), X), None, 5)]
    )  # 24 ≥ warmup_rows = 20: frozen, held rows released
    assert proc.model.ready and proc.held_rows == 0
    assert [k for k, _ in rec.predictions] == ids_of(range(24))
    np.testing.assert_array_equal(proc.model.scaler.mean, X[:20].mean(axis=0))  # the first W rows, not 24
    assert proc.counters["rows_learned"] == 8  # the early labels joined on release, folded before batch 2
    versions = [orjson.loads(v)["model_version"] for _, v in rec.predictions]
    assert versions[0] < versions[8] < versions[16], "batch 2 must be predicted after batch 1's labels"


def test_duplicate_of_a_waiting_row_is_rejected_at_arrival():
    X, _ = data(30, seed=4)
    proc = processor()
    rec = Recorder(proc).feed([("f", features(range(0, 5), X), ("f", 0, 0), 1)])
    dup = orjson.dumps({"id": "r3", "x": X[3].tolist()})
    rec.feed([("f", dup, ("f", 0, 1), 2), ("f", features(range(5, 30), X), ("f", 0, 2), 3)])
    assert rec.dead == [("duplicate_id", dup, ("f", 0, 1))]  # one-row message: its raw bytes
    assert (
        proc.counters["rows_in"] == 30 and proc.model.learner.state.rows_observed == 24
    )  # 6 left in the batcher
    rec.feed([("force", None, None, 4)])
    assert sorted(k for k, _ in rec.predictions) == sorted(ids_of(range(30)))


# ----------------------------------------------------------------------------- ridge


def test_ridge_predicts_with_the_beta_in_force_and_learns_gram_with_labels():
    X, y = data(64, seed=6)
    proc = processor({"mode": "ridge", "scaler": "none"}, batch_rows=16, label_batch_rows=16)
    rec = Recorder(proc).feed([("f", features(range(0, 16), X), None, 1)])
    assert {orjson.loads(v)["model_version"] for _, v in rec.predictions} == {0}  # -R: β = 0, no Gram yet
    assert proc.model.learner.state.rows_observed == 0
    reference = EdRVFL(proc.model.config)
    first = reference.predict_batch(X[:16])
    for start in (16, 32, 48):
        rec.feed(
            [
                ("l", labels(range(start - 16, start), y), None, start),
                ("f", features(range(start, start + 16), X), None, start),
            ]
        )
    got = np.array([orjson.loads(v)["proba"] for _, v in rec.predictions[:16]])
    np.testing.assert_array_equal(got, first.proba)
    rec.feed([("force", None, None, 99)])  # rows 48-63 are never labelled: never in A
    assert proc.model.learner.state.rows_observed == 48 and proc.counters["rows_learned"] == 48
    assert_sums(proc, offline_sums(proc.model.config, X, y, 0, np.arange(48), np.arange(48)))


# ---------------------------------------------------------------------------- expiry


@pytest.mark.parametrize("forget", [False, True])
def test_expiry_by_batches_and_forget_expired(forget):
    """Rows unlabelled after row_ttl_batches batches expire; forget_expired takes their Gram out of A;
    a label that comes later is dead-lettered as expired_id, with its source and raw bytes."""
    X, y = data(96, seed=7)
    proc = processor(
        {"scaler": "none", "mode": "forward"},
        batch_rows=16,
        label_batch_rows=16,
        row_ttl_batches=2,
        forget_expired=forget,
    )
    never = set(range(0, 96, 5))  # every fifth row never gets its label in time
    events = []
    for t, start in enumerate(range(0, 96, 16)):
        events.append(("f", features(range(start, start + 16), X), ("f", 0, t), 10 * t))
        events.append(
            ("l", labels([i for i in range(start, start + 16) if i not in never], y), ("l", 0, t), 10 * t + 1)
        )
    rec = Recorder(proc).feed(events + [("step", None, None, 100)])
    late = labels([0], y)
    rec.feed([("l", late, ("l", 0, 99), 101), ("force", None, None, 102)])
    expired = proc.join.counters["rows_expired"]
    assert expired == len([i for i in never if i < 48])  # at batch 6, batches 1-3 are older than 2 batches
    assert rec.dead == [("expired_id", late, ("l", 0, 99))]
    assert proc.counters["rows_forgotten"] == (expired if forget else 0)
    labelled = sorted(set(range(96)) - never)
    observed = sorted(set(range(96)) - {i for i in never if i < 48}) if forget else list(range(96))
    assert_sums(proc, offline_sums(proc.model.config, X, y, 0, observed, labelled))


def test_expiry_by_time_and_orphan_labels_keep_their_source(tmp_path):
    X, y = data(16, seed=8)
    proc = processor({"scaler": "none"}, batch_rows=8, row_ttl_ms=1000, early_label_ttl_ms=500)
    ghost = orjson.dumps({"id": "ghost", "y": "b"})
    rec = Recorder(proc).feed(
        [
            ("f", features(range(8), X), ("f", 0, 0), 0),
            ("l", ghost, ("l", 0, 7), 10),  # no such row: held early, then given up on
            ("l", labels(range(4), y), ("l", 0, 8), 20),
        ]
    )
    manifest, arrays = proc.to_state()  # the early label's source survives a restart
    proc = StreamProcessor.from_state(manifest, arrays, proc.cfg)
    rec.proc = proc
    rec.feed([("step", None, None, 400)])
    assert rec.dead == [] and proc.join.n_early == 1
    rec.feed([("step", None, None, 511)])
    assert rec.dead == [("unknown_id", ghost, ("l", 0, 7))]
    rec.feed([("step", None, None, 1001)])
    assert proc.join.counters["rows_expired"] == 4 and len(proc.join) == 0


# ------------------------------------------------------------------------- bad input


def bad_messages(X) -> list[tuple[str, bytes, str]]:
    """(topic kind, raw bytes, expected reason): every kind of docs/design.md §5 bad input but the
    id-dependent ones (built in the test)."""
    x = X[0].tolist()
    return [
        ("f", b'{"id": "m1", "x": [1, 2', "malformed_json"),
        ("f", b"", "malformed_json"),
        ("f", orjson.dumps({"x": x}), "missing_id"),
        ("f", orjson.dumps({"id": "w1", "x": x[:-1]}), "wrong_feature_count"),
        ("f", orjson.dumps({"id": "n1", "x": [None] + x[1:]}), "non_finite"),
        ("f", b'{"id": "n2", "x": [NaN, 1, 2, 3, 4]}', "malformed_json"),
        ("f", b'{"id": "n3", "x": [Infinity, 1, 2, 3, 4]}', "malformed_json"),
        ("f", orjson.dumps({"id": "o1", "x": x, "pad": "z" * 600}), "oversize"),
        ("f", orjson.dumps({"id": "s1", "x": [True] + x[1:]}), "bad_schema"),
        ("f", orjson.dumps({"id": "r3", "x": x}), "duplicate_id"),  # r3 is pending
        ("l", orjson.dumps({"id": "r4", "y": "zebra"}), "unknown_class"),
        ("l", orjson.dumps({"id": "r4", "y": [1, 2]}), "bad_label"),
        ("l", b"{]", "malformed_json"),
        ("l", orjson.dumps({"y": "a"}), "missing_id"),
        ("l", orjson.dumps({"id": "r4", "y": "a", "pad": "z" * 600}), "oversize"),
    ]


def test_bad_input_leaves_the_model_bitwise_unchanged():
    X, y = data(60, seed=9)
    proc = processor(
        {"scaler": "none"},
        batch_rows=8,
        label_batch_rows=1,
        max_message_bytes=512,
        row_ttl_batches=3,
        early_label_ttl_ms=100,
    )
    events = [("l", labels(range(0, 3), y), ("l", 0, 0), 0)]  # early labels, joined with batch 1
    events += [
        ("f", features(range(i, i + 2), X), ("f", 0, i), 1) for i in range(0, 56, 2)
    ]  # under 512 bytes
    rec = Recorder(proc).feed(events)
    assert rec.dead == [] and proc.counters["rows_learned"] == 3
    assert proc.join.counters["rows_expired"] == 21 and len(proc.join) == 32  # 7 batches: rows of 1-3 expired
    before = state_arrays(proc)
    kinds = bad_messages(X) + [
        ("l", labels([5], y), "expired_id"),  # its row expired unlabelled
        ("l", orjson.dumps({"id": "nobody", "y": "c"}), "unknown_id"),  # held early, orphaned after 100 ms
        ("l", labels([1], y), None),  # a duplicate label: counted, applied once, not a dead letter
    ]
    for offset, (kind, raw, _) in enumerate(kinds):
        rec.feed([(kind, raw, (kind, 0, 100 + offset), 4 + offset)])
    rec.feed([("step", None, None, 1000)])
    assert proc.join.counters["labels_orphan"] == 1
    expected = [(reason, raw, (kind, 0, 100 + i)) for i, (kind, raw, reason) in enumerate(kinds) if reason]
    assert sorted(rec.dead, key=lambda d: d[2]) == expected
    assert_bitwise(state_arrays(proc), before, "after bad input")
    assert proc.join.counters["labels_duplicate"] == 1
    assert sum(proc.dead_letters.values()) == len(expected)
    rec.feed(
        [("f", features(range(56, 60), X), ("f", 0, 2), 1001), ("force", None, None, 1002)]
    )  # still works
    assert [k for k, _ in rec.predictions][-4:] == ids_of(range(56, 60))
