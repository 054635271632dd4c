"""StreamProcessor with forgetting and ``auto`` (docs/design.md §8): the weighted Theorem 1 through the stream.

1. Any arrival (late, shuffled, duplicated, missing labels; messages of every size): every candidate's
   β is the closed-form weighted ridge (λI + Σ_entered wᵢ dᵢdᵢᵀ)⁻¹ Σ_labelled wᵢ dᵢyᵢ with
   wᵢ = 2^(−(T − sᵢ)/h), sᵢ the rows seen when row i's batch was predicted, both modes. The stamps sᵢ
   are computed here from the sizes of the batches the model observed, not read from the processor.
2. Expired rows (forget_expired) leave A at their present weight, in every candidate.
3. Labels one batch late: the processor with ``auto`` is evaluate's protocol bitwise (each candidate
   judged on its own prediction: the same selector losses, the same candidate in force).
4. A snapshot anywhere mid-stream restores the stamps (join buffer, label queue): the run continues bitwise.

Seeds are fixed and named in the assertion messages.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from test_stream import (
    CLASSES,
    K,
    Recorder,
    data,
    faulty_events,
    features,
    ids_of,
    labels,
    model_config,
    paper_events,
    run_with_restart,
    stream_config,
)

from iolstream.core import model_config as model_mod
from iolstream.core.model import EdRVFL
from iolstream.stream.processor import StreamProcessor
from iolstream.tools.protocol import EdRVFLLearner, Protocol, Split, run_protocol


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture
def short_half_lives(monkeypatch):
    """forgetting auto with half-lives short enough that a wrongly aged row shows within 260 rows."""
    monkeypatch.setattr(model_mod, "HALF_LIFE_CANDIDATES", (None, 60.0, 15.0))


def stamped(proc: StreamProcessor) -> list[int]:
    """Record the size of every batch the model observes (in order): their running sums are the stamps."""
    sizes: list[int] = []
    observe = proc.model.observe
    proc.model.observe = lambda x: sizes.append(len(x)) or observe(x)
    return sizes


def row_stamps(predicted_ids: list[str], sizes: list[int]) -> dict[str, int]:
    """id -> rows seen once its batch was observed (batches predicted in order, ``sizes`` rows each)."""
    ends = np.cumsum(sizes)
    assert ends[-1] == len(predicted_ids)
    batch_of = np.repeat(np.arange(len(sizes)), sizes)
    return {row_id: int(ends[batch_of[i]]) for i, row_id in enumerate(predicted_ids)}


def weighted_closed_form(proc, X, y, warmup_rows, entered, labelled, stamps, clock):
    """Per candidate, per layer, the closed-form weighted ridge β from the raw rows."""
    cfg = proc.model.config
    ref = EdRVFL(cfg)
    ref.scaler.partial_fit(X[:warmup_rows])
    out = []
    for lam, h in ref.candidates:

        def w(rows, h=h):
            ages = clock - np.array([stamps[f"r{i}"] for i in rows], dtype=np.float64)
            return np.ones(len(rows)) if h is None else np.exp2(-ages / h)

        betas = []
        for layer in range(cfg.n_layers):
            d_in = ref.features(X[entered])[layer].T
            d_lab = ref.features(X[labelled])[layer].T
            A = lam * np.eye(d_in.shape[1]) + d_in.T @ (w(entered)[:, None] * d_in)
            c = d_lab.T @ (w(labelled)[:, None] * ref.one_hot(np.asarray(y)[labelled]))
            betas.append(np.linalg.solve(A, c))
        out.append(((lam, h), betas))
    return out


def assert_candidates(proc, expected, msg):
    for ln, ((lam, h), betas) in zip(proc.model.learners, expected):
        for layer, want in enumerate(betas):
            got = ln.state.layers[layer].beta
            np.testing.assert_allclose(
                got,
                want,
                rtol=1e-7,
                atol=1e-9 * np.abs(want).max(),
                err_msg=f"{msg}: λ={lam} h={h} layer {layer}",
            )


SETTINGS = {"fixed h=20": dict(forgetting=20.0), "auto (9 candidates)": dict(lam="auto", forgetting="auto")}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("mode", ["forward", "ridge"])
@pytest.mark.parametrize("seed", [0, 1])
def test_any_arrival_equals_the_weighted_closed_form(mode, seed, setting, short_half_lives):
    X, y = data(260, seed=seed)
    proc = StreamProcessor(
        EdRVFL(model_config(mode=mode, **SETTINGS[setting])),
        stream_config(batch_rows=16, label_batch_rows=12, max_batch_latency_ms=40, max_label_latency_ms=30),
    )
    sizes = stamped(proc)
    events, labelled = faulty_events(X, y, seed)
    rec = Recorder(proc).feed(events)
    msg = f"mode={mode} {setting} seed={seed}"
    assert rec.dead == [], msg
    predicted = [k for k, _ in rec.predictions]
    assert sorted(predicted) == sorted(ids_of(range(len(X)))), msg
    assert proc.counters["rows_learned"] == len(labelled) and len(sizes) > 10, msg
    stamps = row_stamps(predicted, sizes)
    clock = sum(sizes)
    assert all(ln.state.clock == clock for ln in proc.model.learners), msg
    entered = list(range(len(X))) if mode == "forward" else labelled
    assert_candidates(proc, weighted_closed_form(proc, X, y, 20, entered, labelled, stamps, clock), msg)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_expired_rows_leave_every_candidate_at_their_present_weight(setting, short_half_lives):
    """-F, forget_expired: rows unlabelled after 2 batches expire and their Gram leaves A, weighted as it is
    in A by then, in every candidate; labels come 0 or 1 batches late, in shuffled messages."""
    X, y = data(160, seed=9)
    proc = StreamProcessor(
        EdRVFL(model_config(scaler="none", mode="forward", **SETTINGS[setting])),
        stream_config(batch_rows=16, label_batch_rows=16, row_ttl_batches=2, forget_expired=True),
    )
    sizes = stamped(proc)
    rng = np.random.default_rng(9)
    never = set(rng.choice(160, 30, replace=False).tolist())
    events, late = [], []
    for t, start in enumerate(range(0, 160, 16)):
        events.append(("f", features(range(start, start + 16), X), ("f", 0, t), 10 * t))
        rows = [i for i in range(start, start + 16) if i not in never]
        rng.shuffle(rows)
        now, later = rows[: len(rows) // 2], rows[len(rows) // 2 :]
        for part in (late, now):
            if part:
                events.append(("l", labels(part, y), ("l", 0, t), 10 * t + 1))
        late = later
    events.append(("l", labels(late, y), ("l", 0, 99), 200))
    rec = Recorder(proc).feed(events + [("force", None, None, 201)])
    msg = f"{setting} seed=9"
    expired = proc.join.counters["rows_expired"]
    assert rec.dead == [] and expired == proc.counters["rows_forgotten"] > 10, msg
    pending = set(proc.join._pending)
    gone = sorted(
        i for i in never if f"r{i}" not in pending
    )  # the never-labelled rows no longer pending expired
    assert len(gone) == expired, msg
    labelled = sorted(set(range(160)) - never)
    entered = sorted(set(range(160)) - set(gone))
    stamps = row_stamps([k for k, _ in rec.predictions], sizes)
    assert_candidates(proc, weighted_closed_form(proc, X, y, 0, entered, labelled, stamps, sum(sizes)), msg)


def delayed_events(X, y, b: int, delay: int):
    """Batch t-delay's labels, then batch t's features (evaluate's label_delay), the rest at the end."""
    starts = list(range(0, len(X), b))
    events, now = [], 0
    for t, start in enumerate(starts + [None] * delay):
        now += 10
        if t >= delay:
            prev = starts[t - delay]
            events.append(("l", labels(range(prev, min(prev + b, len(X))), y), ("l", 0, t - delay), now))
        if start is not None:
            events.append(("f", features(range(start, min(start + b, len(X))), X), ("f", 0, t), now))
    return events + [("force", None, None, now + 10)]


@pytest.mark.parametrize("delay", [1, 3])
def test_auto_with_late_labels_is_evaluates_protocol_bitwise(delay, short_half_lives):
    """Each candidate judged on its own prediction (not on its β when the label comes, which has moved
    on when labels are more than one batch late): the processor's candidates, selector losses and
    candidate in force equal evaluate's (which passes Prediction.predicted and .clock), to the bit."""
    X, y = data(
        400 + (delay == 1) * 3, seed=4
    )  # delayed_events: whole batches (a partial last one waits for the force)
    b = 8
    cfg = model_config(lam="auto", forgetting="auto", scaler="none")
    proc = StreamProcessor(EdRVFL(cfg), stream_config(batch_rows=b, label_batch_rows=b))
    learner = EdRVFLLearner(cfg)
    if delay == 1:  # every candidate on every batch; delay 3: the scoring budget's batches, the same in both
        proc.model.scoring.share = learner.model.scoring.share = np.inf
    rec = Recorder(proc).feed(paper_events(X, y, b) if delay == 1 else delayed_events(X, y, b, delay))

    split = Split("synthetic", "classification", CLASSES, tuple("x" * K), X, y, X[:3], y[:3])
    result = run_protocol(learner, split, Protocol(batch=b, label_delay=delay, curve_points=1))
    y_hat = np.array([CLASSES.index(orjson.loads(v)["y_hat"]) for _, v in rec.predictions])
    per_batch = [(y_hat[s : s + b] == y[s : s + b]).mean() for s in range(0, len(X), b)]
    assert np.array_equal(per_batch, result.batch_prequential), "the per-batch prequential accuracy differs"
    ours, theirs = proc.model, learner.model
    assert (
        np.array_equal(ours.selector.loss, theirs.selector.loss)
        and ours.selector.chosen == theirs.selector.chosen
    )
    assert (
        np.array_equal(ours.selector.pair, theirs.selector.pair) and ours.selector.pair.any()
    )  # judged apart
    assert ours.scoring.to_state() == theirs.scoring.to_state() and ours.scoring.scored_rows > 0
    for j, (a, b_) in enumerate(zip(ours.learners, theirs.learners)):
        for layer, (la, lb) in enumerate(zip(a.state.layers, b_.state.layers)):
            for name in ("gram", "rhs", "beta"):
                assert np.array_equal(getattr(la, name), getattr(lb, name)), (
                    f"candidate {j} layer {layer} {name}"
                )


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_restore_mid_stream_keeps_the_stamps_and_continues_bitwise(mode, tmp_path, short_half_lives):
    X, y = data(200, seed=5)
    events, _ = faulty_events(X, y, seed=5)

    def make():
        return StreamProcessor(
            EdRVFL(model_config(mode=mode, lam="auto", forgetting="auto")),
            stream_config(
                batch_rows=16,
                label_batch_rows=12,
                max_batch_latency_ms=40,
                max_label_latency_ms=30,
                row_ttl_batches=3,
                forget_expired=True,
            ),
        )

    whole = Recorder(make()).feed(events)
    assert whole.proc.counters["label_batches"] > 5
    for cut in (5, len(events) // 3, len(events) // 2, len(events) - 9):
        predictions, dead, restored = run_with_restart(events, cut, tmp_path, make)
        msg = f"mode={mode} cut {cut}"
        assert predictions == whole.predictions and dead == whole.dead, msg
        assert restored.counters == whole.proc.counters, msg
        sel_a, sel_b = restored.model.selector, whole.proc.model.selector
        assert np.array_equal(sel_a.loss, sel_b.loss) and np.array_equal(sel_a.pair, sel_b.pair), msg
        assert sel_a.chosen == sel_b.chosen, msg
        for j, (a, b) in enumerate(zip(restored.model.learners, whole.proc.model.learners)):
            assert a.state.clock == b.state.clock, msg
            for layer, (la, lb) in enumerate(zip(a.state.layers, b.state.layers)):
                for name in ("gram", "rhs", "beta"):
                    assert np.array_equal(getattr(la, name), getattr(lb, name)), (
                        f"{msg}: candidate {j} layer {layer} {name}"
                    )
