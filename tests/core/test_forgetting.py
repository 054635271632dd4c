"""Forgetting (docs/design.md §8) and the two state operations it is built on, ``scale`` and ``add``.

1. Theorem 1, weighted: with a half-life h, after every observe / learn β equals the closed-form
   weighted ridge (λI + Σ_entered wᵢ dᵢdᵢᵀ)⁻¹ Σ_labelled wᵢ dᵢyᵢ, wᵢ = 2^(−(clock − stampᵢ)/h), for any
   label delay and order, both modes, every solver path (fused Gram + Cholesky, the layer-by-layer
   route, Woodbury's "auto" choice overridden, serial and parallel kernels, float32 features).
2. ``scale`` and ``add``: the prior λI is never scaled nor counted twice; they commute; two learners on
   a shared clock, each fed half the batches, add up to the learner fed all of them.
3. The regret with forgetting is the exact discounted regret against the discounted expert.
4. Numerics: float32 against the float64 weighted closed form on a long stream (measured numbers in
   the docstring; reproduce with ``PYTHONPATH=tests .venv/bin/python tests/core/test_forgetting.py``).

Seeds are fixed and printed in every assertion message.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)
from model_util import stream_one_batch_late
from naive import label_messages
from test_learner import (
    N_COLUMNS,
    N_LAYERS,
    N_NODES,
    SMALL,
    K,
    M,
    assert_close,
    layer_rows,
    make_batches,
    snapshot,
)
from threadpoolctl import threadpool_limits

from iolstream.core import gram_cholesky
from iolstream.core.learner import OnlineLearner
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.network import RandomNetwork

LAMS = (0.5, 1.0, 2.0)
RTOL = 1e-9


def weighted_expert(entered, labelled, lam, clock, half_life, layer):
    """(λI + Σ wᵢ dᵢdᵢᵀ)⁻¹ Σ wᵢ dᵢyᵢ in float64 from the raw rows: ``entered`` = [(features_t, stamps)],
    ``labelled`` = [(features_t, Y, stamps)], wᵢ = 2^(−(clock − stampᵢ)/half_life)."""
    a = lam * np.eye(N_COLUMNS)
    c = np.zeros((N_COLUMNS, M))
    for f, stamps in entered:
        d = layer_rows(f, layer).astype(np.float64)
        w = np.exp2(-(clock - stamps) / half_life)
        a += d.T @ (w[:, None] * d)
    for f, y, stamps in labelled:
        d = layer_rows(f, layer).astype(np.float64)
        w = np.exp2(-(clock - stamps) / half_life)
        c += d.T @ (w[:, None] * y)
    return np.linalg.solve(a, c)


def run_delayed_stream(
    seed_, mode, solver, half_life, check, *, layout="contiguous", parallel=False, dtype=np.float64
):
    """Like test_learner's delayed stream, with forgetting: label delays of 0–5 batches, shuffled and
    split label messages, unobserved batches (seen via ``advance``, their Gram enters with their labels),
    unlabelled rows. ``layout`` "strided" hands the learner non-contiguous features (the layer-by-layer route)."""
    rng = np.random.default_rng(seed_)
    n_batches = 24
    sizes = rng.integers(1, 9, n_batches)
    net = RandomNetwork.create(K, N_NODES, N_LAYERS, activation="tanh", seed=seed_, dtype=dtype)
    feats = [net.features(rng.standard_normal((b, K))) for b in sizes]
    ys = [rng.standard_normal((b, M)) for b in sizes]
    observed = rng.random(n_batches) > 0.2
    due = {}
    for t in range(n_batches):
        for i in range(sizes[t]):
            if rng.random() >= 0.15:
                due.setdefault(t + int(rng.integers(0, 6)), []).append((t, i))
    learner = OnlineLearner(N_COLUMNS, M, N_LAYERS, lam=LAMS, mode=mode, solver=solver, half_life=half_life)
    learner.parallel = parallel

    def hand(f):
        if layout == "strided":  # a view with a step: not fusable, the layer-by-layer route
            wide = np.empty(f.shape[:2] + (2 * f.shape[2],), f.dtype)
            wide[:, :, ::2] = f
            return wide[:, :, ::2]
        return f

    stamps, entered, labelled = {}, [], []
    step = 0
    for s in range(n_batches + 6):
        if s < n_batches:
            if observed[s]:
                learner.observe(hand(feats[s]))
            else:
                learner.advance(int(sizes[s]))  # seen elsewhere: the clock moves on all the same
            stamps[s] = learner.state.clock
            if observed[s] and mode == "forward":
                entered.append((feats[s], np.full(sizes[s], stamps[s], dtype=np.float64)))
            step += 1
            check(learner, entered, labelled, step)
        for picked, f, y, gram_in in label_messages(due.get(s, []), feats, ys, observed, rng):
            at = np.array([stamps[t] for t, _ in picked], dtype=np.float64)
            learner.learn(hand(f), y, gram_in=gram_in, observed_at=at.astype(np.int64))
            labelled.append((f, y, at))
            new = ~gram_in if mode == "forward" else np.ones(len(picked), dtype=bool)
            if new.any():
                entered.append((np.ascontiguousarray(f[:, :, new]), at[new]))
            step += 1
            check(learner, entered, labelled, step)
    return learner


PATHS = {
    "cholesky fused": dict(solver="cholesky"),
    "auto (small b: Woodbury's range)": dict(solver="auto"),
    "layer by layer": dict(solver="cholesky", layout="strided"),
    "parallel kernels": dict(solver="cholesky", parallel=True),
}


@pytest.mark.parametrize("half_life", [6.0, 40.0])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_weighted_theorem_1_at_every_step(mode, path, half_life):
    """β = the closed-form weighted ridge after every call, any delay and order (h = 6 rows: weights
    down to ~1e-7 within the stream, so a wrongly aged row shows)."""
    seed_ = 17
    kwargs = PATHS[path]

    def check(learner, entered, labelled, step):
        msg = f"mode={mode} path={path} h={half_life} step={step} seed={seed_}"
        for layer, lam in enumerate(LAMS):
            want = weighted_expert(entered, labelled, lam, learner.state.clock, half_life, layer)
            assert_close(learner.state.layers[layer].beta, want, f"{msg} layer {layer}")

    learner = run_delayed_stream(
        seed_,
        mode,
        kwargs["solver"],
        half_life,
        check,
        layout=kwargs.get("layout", "contiguous"),
        parallel=kwargs.get("parallel", False),
    )
    assert learner.state.rows_labelled > 0 and learner.state.clock > learner.state.rows_observed - 1


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_weighted_theorem_1_float32_features(mode):
    """float32 features (products in float32, sums in float64): the weighted closed form on the same
    float32 features, to float32 round-off."""
    seed_ = 18

    def check(learner, entered, labelled, step):
        for layer, lam in enumerate(LAMS):
            want = weighted_expert(entered, labelled, lam, learner.state.clock, 20.0, layer)
            assert_close(
                learner.state.layers[layer].beta,
                want,
                f"mode={mode} step={step} layer {layer} seed={seed_}",
                rtol=1e-4,
            )

    run_delayed_stream(seed_, mode, "cholesky", 20.0, check, dtype=np.float32)


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_parallel_equals_serial_bitwise_with_forgetting(mode):
    seed_ = 19
    states = []
    for parallel in (False, True):
        states.append(
            snapshot(run_delayed_stream(seed_, mode, "cholesky", 10.0, lambda *a: None, parallel=parallel))
        )
    for key in states[0]:
        a, b = states[0][key], states[1][key]
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (
            f"{key} differs, mode={mode} seed={seed_}"
        )


# --------------------------------------------------------------------------- scale and add


def _fed(mode, batches, *, half_life=None, own=None, lam=LAMS):
    """A learner fed ``batches`` [(features_t, Y)] in order, labels one batch late; with ``own`` a set of
    batch numbers, the other batches only advance the clock (another member's share: a shared clock)."""
    learner = OnlineLearner(
        N_COLUMNS, M, N_LAYERS, lam=lam, mode=mode, solver="cholesky", half_life=half_life
    )
    stamps = []
    for t, (f, _y) in enumerate(batches):
        mine = own is None or t in own
        if mine:
            learner.observe(f)
        else:
            learner.advance(f.shape[2])
        stamps.append(learner.state.clock)
        if t and (own is None or t - 1 in own):
            learner.learn(batches[t - 1][0], batches[t - 1][1], observed_at=stamps[t - 1])
    return learner


def _assert_same_sums(a: OnlineLearner, b: OnlineLearner, msg: str, rtol=1e-12, losses=True):
    """A, c, β, A_r, Σ‖y‖² (and the loss sums unless ``losses`` is False: those of learners that
    predicted with different βs differ) of two learners, to ``rtol``."""
    for layer, (x, y) in enumerate(zip(a.state.layers, b.state.layers)):
        assert_close(np.tril(x.gram), np.tril(y.gram), f"{msg}: layer {layer} A", rtol=rtol)
        assert_close(x.rhs, y.rhs, f"{msg}: layer {layer} c", rtol=rtol)
        assert_close(x.beta, y.beta, f"{msg}: layer {layer} β", rtol=1e-9)
        if x.gram_labelled is not None:
            assert_close(
                np.tril(x.gram_labelled), np.tril(y.gram_labelled), f"{msg}: layer {layer} A_r", rtol=rtol
            )
        if losses:
            assert_close(x.loss_sum, y.loss_sum, f"{msg}: layer {layer} Σ loss", rtol=rtol)
    assert_close(a.state.sum_y2, b.state.sum_y2, f"{msg}: Σ‖y‖²", rtol=rtol)


@pytest.mark.parametrize("half_life", [None, 30.0])
@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_members_on_a_shared_clock_add_up_to_one_learner(mode, half_life):
    """Two members split the batches (odd / even) and both advance the clock on every batch; adding
    one member's sums to the other's gives the learner that saw every batch (group learning, docs/design.md §9)."""
    seed_ = 21
    feats, ys = make_batches(seed_, [5, 7, 3, 8, 6, 4, 9, 2, 5, 7])
    batches = list(zip(feats, ys))
    whole = _fed(mode, batches, half_life=half_life)
    even = _fed(mode, batches, half_life=half_life, own={0, 2, 4, 6, 8})
    odd = _fed(mode, batches, half_life=half_life, own={1, 3, 5, 7, 9})
    assert even.state.clock == odd.state.clock == whole.state.clock
    even.state.add(odd.state)
    # The last batch's labels are still pending in every learner: counters add up as well.
    for key in ("rows_observed", "rows_labelled", "label_batches"):
        assert getattr(even.state, key) == getattr(whole.state, key), f"{key}, mode={mode} seed={seed_}"
    _assert_same_sums(
        even, whole, f"mode={mode} h={half_life} seed={seed_}", losses=False
    )  # each predicted with its own β


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_scale_and_add_commute_and_keep_the_prior(mode):
    seed_ = 22
    feats, ys = make_batches(seed_, [6, 5, 7, 4])
    first = _fed(mode, list(zip(feats[:2], ys[:2])))
    second = _fed(mode, list(zip(feats[2:], ys[2:])))
    added_then_scaled = _fed(mode, list(zip(feats[:2], ys[:2])))
    added_then_scaled.state.add(second.state)
    added_then_scaled.state.scale(0.3)
    scaled_then_added = _fed(mode, list(zip(feats[:2], ys[:2])))
    scaled_then_added.state.scale(0.3)
    second.state.scale(0.3)
    scaled_then_added.state.add(second.state)
    _assert_same_sums(added_then_scaled, scaled_then_added, f"mode={mode} seed={seed_}")
    first.state.scale(0.0)  # every data sum gone: back to the prior λI, c = 0, β = 0
    for layer, (ls, lam) in enumerate(zip(first.state.layers, LAMS)):
        assert_close(gram_cholesky.symmetric(ls.gram), lam * np.eye(N_COLUMNS), f"layer {layer}", rtol=1e-15)
        assert not ls.rhs.any() and not ls.beta.any(), f"layer {layer} seed={seed_}"


def test_add_with_a_factor_decays_a_state_from_an_earlier_clock():
    """A state that stopped at clock τ₀, added to one at τ₁ with factor 2^(−(τ₁−τ₀)/h), is aged like its rows."""
    seed_ = 23
    feats, ys = make_batches(seed_, [6, 5, 7, 4])
    h = 12.0
    batches = list(zip(feats, ys))
    whole = _fed("ridge", batches, half_life=h)  # labels of batches 0–2 in (3's pending)
    early = _fed("ridge", batches[:2], half_life=h)  # stops at τ₀ after batch 1, batch 0's labels in
    early.learn(feats[1], ys[1], observed_at=early.state.clock)  # and batch 1's
    late = _fed(
        "ridge", batches, half_life=h, own={2, 3}
    )  # the clock of all four batches, batch 2's labels in
    late.state.add(early.state, factor=float(np.exp2(-(late.state.clock - early.state.clock) / h)))
    _assert_same_sums(late, whole, f"seed={seed_}", losses=False)


def test_add_refuses_a_state_of_another_shape():
    a = OnlineLearner(N_COLUMNS, M, N_LAYERS)
    b = OnlineLearner(N_COLUMNS, M + 1, N_LAYERS)
    with pytest.raises(ValueError, match="rhs shapes differ"):
        a.state.add(b.state)
    with pytest.raises(ValueError, match="factor"):
        a.state.scale(float("nan"))


def test_forget_with_stamps_removes_a_row_at_its_present_weight():
    seed_ = 24
    feats, ys = make_batches(seed_, [5, 3, 7, 2])
    h = 8.0
    full = OnlineLearner(N_COLUMNS, M, N_LAYERS, half_life=h)
    without = OnlineLearner(N_COLUMNS, M, N_LAYERS, half_life=h)
    for t, f in enumerate(feats):
        full.observe(f)
        if t == 1:
            stamp = full.state.clock
            without.advance(f.shape[2])
        else:
            without.observe(f)
    full.forget(feats[1], observed_at=stamp)  # expired: out with the weight its Gram has now
    for layer, (a, b) in enumerate(zip(full.state.layers, without.state.layers)):
        assert_close(np.tril(a.gram), np.tril(b.gram), f"layer {layer} seed={seed_}", rtol=1e-12)


def test_learn_rows_held_for_the_target_scaling_enter_at_their_decayed_weight():
    """Regression labels given with ``learn_rows`` before the target scaling is known wait; when it is, they enter at
    the weight their rows have then, as with a scaling fixed from the start."""
    import dataclasses

    rng = np.random.default_rng(31)
    x1, x2, seen = rng.standard_normal((8, 3)), rng.standard_normal((8, 3)), rng.standard_normal((512, 3))
    y1, y2 = 2 * x1[:, :1], -x2[:, :1]
    cfg = ModelConfig(n_inputs=3, n_nodes=8, n_layers=1, scaler="none", forgetting=64.0, warmup_rows=16)
    held = EdRVFL(cfg)
    y = np.concatenate([y1, y2])
    fixed = EdRVFL(
        dataclasses.replace(
            cfg,
            target_scaler="fixed",
            target_mean=tuple(y.mean(axis=0)),
            target_std=tuple(y.std(axis=0, ddof=1)),
        )
    )
    for model in (held, fixed):
        model.learn_rows(x1, y1)  # held: 8 of 16 warm-up labels
        model.observe(seen)  # x1's rows are 512 rows (8 half-lives) old when the scaling is known
        model.learn_rows(x2, y2)
    assert held.targets.frozen and not held.targets.held
    a, b = held.learner.state.layers[0], fixed.learner.state.layers[0]
    assert_close(a.rhs, b.rhs, "seed=31", rtol=1e-12)
    assert_close(a.beta, b.beta, "seed=31", rtol=1e-10)


# --------------------------------------------------------------------------- configuration, regret


@pytest.mark.parametrize("bad", [0, -5.0, float("inf"), "fast", True])
def test_forgetting_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="forgetting"):
        ModelConfig(n_inputs=3, forgetting=bad)


def test_forgetting_refuses_woodbury():
    with pytest.raises(ValueError, match="solver"):
        ModelConfig(n_inputs=3, forgetting=100.0, solver="woodbury")
    with pytest.raises(ValueError, match="woodbury"):
        OnlineLearner(N_COLUMNS, M, N_LAYERS, solver="woodbury", half_life=10.0)


def test_regret_with_forgetting_is_the_discounted_regret():
    """Σ wᵢ ½‖pᵢ − yᵢ‖² − min_β [½λ‖β‖² + Σ wᵢ ½‖dᵢβ − yᵢ‖²], recomputed from the raw rows (-F, labels
    one batch late; each batch's loss with the β that predicted it)."""
    seed_ = 25
    h = 300.0
    model = EdRVFL(
        ModelConfig(
            n_inputs=4,
            n_nodes=16,
            n_layers=2,
            lam=0.7,
            scaler="none",
            target_scaler="none",
            forgetting=h,
            seed=seed_,
            mode="forward",
        )
    )
    rng = np.random.default_rng(seed_)
    rows = []  # (features_t, Y, predicted, stamp)
    prev = None
    for _ in range(12):
        x = rng.standard_normal((40, 4))
        y = (x[:, :1] - x[:, 1:2]) + 0.1 * rng.standard_normal((40, 1))
        pred = model.observe(x)
        if prev is not None:
            model.learn(
                prev[0].features_t, prev[1], predicted=prev[0].layer_outputs, observed_at=prev[0].clock
            )
            rows.append((prev[0].features_t, prev[1], prev[0].layer_outputs, prev[0].clock))
        prev = (pred, y)
    report = model.regret()
    clock = model.learner.state.clock
    assert np.isnan(report.bound) and report.extra["regret"] == "discounted"
    for layer in range(2):
        n = model.network.n_columns
        a, c, loss, y2 = 0.7 * np.eye(n), np.zeros((n, 1)), 0.0, 0.0
        for f, y, p, stamp in rows:
            w = 2.0 ** (-(clock - stamp) / h)
            d = f[layer].T
            a += w * d.T @ d
            c += w * d.T @ y
            loss += w * 0.5 * np.sum((p[layer] - y) ** 2)
            y2 += w * np.sum(y**2)
        expert = 0.5 * (y2 - float(np.sum(c * np.linalg.solve(a, c))))
        msg = f"layer {layer} seed={seed_}"
        assert_close(report.cumulative_loss[layer], loss, msg, rtol=1e-12)
        assert_close(report.expert_loss[layer], expert, msg, rtol=1e-9)


# --------------------------------------------------------------------------- long streams


def measure_float32_forgetting(checkpoints, half_life=50_000.0, data_seed=1, batch=256):
    """test_learner.measure_float32 with forgetting: float32 model (k=10, m=10, N=128, L=4, b=256, λ=1),
    -F, labels in the same step; against the float64 weighted closed form on the same features, its sums
    decayed in float64 as S ← 2^(−b/h) S. Returns {batches: max over layers of ‖β − β*‖/‖β*‖}."""
    model = EdRVFL(ModelConfig(**SMALL, dtype="float32", forgetting=half_life))
    n = model.network.n_columns
    data64 = [np.zeros((n, n)) for _ in range(SMALL["n_layers"])]  # S, full, float64
    rhs64 = [np.zeros((n, 10)) for _ in range(SMALL["n_layers"])]
    rng = np.random.default_rng(data_seed)
    decay = 2.0 ** (-batch / half_life)
    errors = {}
    for t in range(1, max(checkpoints) + 1):
        x = rng.standard_normal((batch, 10))
        y = model.one_hot(rng.integers(0, 10, batch))
        pred = model.observe(x)
        model.learn(pred.features_t, y, predicted=pred.predicted, observed_at=pred.clock)
        f64 = pred.features_t.astype(np.float64)
        for layer in range(SMALL["n_layers"]):
            data64[layer] = decay * data64[layer] + f64[layer] @ f64[layer].T
            rhs64[layer] = decay * rhs64[layer] + f64[layer] @ y
        if t in checkpoints:
            errs = []
            for ls, s, c in zip(model.learner.state.layers, data64, rhs64):
                ref = np.linalg.solve(np.eye(n) + s, c)
                errs.append(float(np.linalg.norm(ls.beta - ref) / np.linalg.norm(ref)))
            errors[t] = max(errs)
    return errors


# Measured (this machine, one BLAS thread), data_seed=1, after 100 / 1,000 / 5,000 batches of 256 rows:
#   h = 50,000 rows: 8.0e-6 / 5.4e-6 / 5.7e-6;   h = 5,000 rows: 8.6e-6 / 8.4e-6 / 9.1e-6
# (without forgetting, test_learner: 8.2e-6 / 4.7e-6 / 3.4e-6): flat in the stream length.
FLOAT32_FORGETTING_MEASURED = {100: 8.0e-6, 1000: 5.4e-6, 5000: 5.7e-6}


def test_float32_with_forgetting_stays_close_to_float64_weighted_closed_form():
    """float32 features, sums in float64 decayed every batch, against the float64 weighted closed form.

    Relative error of β, max over layers, measured with ``PYTHONPATH=tests .venv/bin/python tests/core/test_forgetting.py``:
    see FLOAT32_FORGETTING_MEASURED. With forgetting the error cannot grow with the stream: each
    batch's float32 rounding is scaled down by every later decay. This test runs 1,000 batches and
    asserts 10× the measured value.
    """
    errors = measure_float32_forgetting((100, 1000))
    for t, err in errors.items():
        want = FLOAT32_FORGETTING_MEASURED[t]
        assert err <= 10 * want, f"after {t} batches: {err:.2e} (measured {want:.1e}), data_seed=1"


if __name__ == "__main__":
    with threadpool_limits(1):
        for h in (50_000.0, 5_000.0):
            start = time.perf_counter()
            errs = measure_float32_forgetting((100, 1000, 5000), half_life=h)
            print(
                f"float32 -F, h={h:g}: "
                + " / ".join(f"{t}: {e:.2e}" for t, e in errs.items())
                + f"  ({time.perf_counter() - start:.1f} s)"
            )
            sys.stdout.flush()


# --------------------------------------------------------------------------- auto


def test_auto_candidates_are_the_fixed_settings_on_the_same_features():
    """Every candidate of lam/forgetting auto holds bit for bit... to round-off the state of a model
    configured with that one setting and fed the same rows."""
    seed_ = 31
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((900, 4))
    y = (x[:, 0] * x[:, 1] > 0).astype(int)
    base = dict(n_inputs=4, classes=(0, 1), n_nodes=24, n_layers=2, scaler="none", seed=seed_, mode="forward")
    auto = stream_one_batch_late(EdRVFL(ModelConfig(**base, lam="auto", forgetting="auto")), x, y, 100)
    assert len(auto.learners) == 9
    for (lam, h), ln in zip(auto.candidates, auto.learners):
        fixed = stream_one_batch_late(EdRVFL(ModelConfig(**base, lam=lam, forgetting=h)), x, y, 100)
        for layer, (a, b) in enumerate(zip(ln.state.layers, fixed.learner.state.layers)):
            assert_close(a.beta, b.beta, f"lam={lam} h={h} layer {layer} seed={seed_}", rtol=1e-12)


def _flip(x, switch):
    y = (x[:, 0] > 0).astype(int)
    y[switch:] = 1 - y[switch:]
    return y


def test_forgetting_auto_picks_a_half_life_after_a_concept_flip():
    seed_ = 32
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((12_000, 3))
    y = _flip(x, 4000)
    model = EdRVFL(
        ModelConfig(
            n_inputs=3, classes=(0, 1), n_nodes=32, n_layers=2, scaler="none", forgetting="auto", seed=seed_
        )
    )
    stream_one_batch_late(model, x[:4000], y[:4000], 100)
    assert model.effective["forgetting"] is None, f"before the flip: {model.effective}, seed={seed_}"
    stream_one_batch_late(model, x[4000:], y[4000:], 100)
    eff = model.effective
    assert eff["forgetting"] in (2048.0, 512.0), f"after the flip: {eff}, seed={seed_}"
    recent = {c["forgetting"]: c["recent_loss"] for c in eff["candidates"]}
    assert recent[eff["forgetting"]] < recent[None] - 0.005, f"{recent}, seed={seed_}"  # past the keep_z test
    assert (model.predict(x[-1000:]) == y[-1000:]).mean() > 0.9


def test_auto_survives_a_state_round_trip():
    import io

    from iolstream.core.state_io import load_model, save_model

    seed_ = 33
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((3000, 3))
    y = _flip(x, 1500)
    cfg = ModelConfig(
        n_inputs=3,
        classes=(0, 1),
        n_nodes=16,
        n_layers=2,
        scaler="none",
        lam="auto",
        forgetting="auto",
        seed=seed_,
    )
    model = stream_one_batch_late(EdRVFL(cfg), x[:2000], y[:2000], 100)
    buf = io.BytesIO()
    save_model(buf, model)
    buf.seek(0)
    restored = load_model(buf)
    assert restored.selector.chosen == model.selector.chosen and np.array_equal(
        restored.selector.loss, model.selector.loss
    )
    assert np.array_equal(restored.selector.pair, model.selector.pair)
    assert restored.candidates == model.candidates
    assert [ln.half_life for ln in restored.learners] == [h for _, h in model.candidates]
    for m in (model, restored):
        stream_one_batch_late(m, x[2000:], y[2000:], 100)
    assert restored.effective == model.effective, f"seed={seed_}"
    for a, b in zip(model.learners, restored.learners):
        assert np.array_equal(a.state.layers[1].beta, b.state.layers[1].beta), f"seed={seed_}"


def test_a_state_saved_before_the_grid_was_saved_restores_with_the_first_grid():
    """A version-2 state from before the selection saved its grid (half-lives None, 16384, 2048) continues with
    those candidates, not today's: its sums were decayed with them."""
    from iolstream.core.candidates import FIRST_GRID, HALF_LIFE_CANDIDATES, candidate_grid
    from iolstream.core.state_io import StateFormatError, model_from_arrays, model_to_arrays

    seed_ = 36
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((3000, 3))
    y = _flip(x, 1500)
    cfg = ModelConfig(
        n_inputs=3,
        classes=(0, 1),
        n_nodes=16,
        n_layers=2,
        scaler="none",
        lam="auto",
        forgetting="auto",
        seed=seed_,
        mode="forward",  # saved before mode: auto existed
    )
    first = candidate_grid("auto", "auto", *FIRST_GRID)
    assert 16384.0 not in HALF_LIFE_CANDIDATES and first != cfg.candidates  # else this tests nothing
    model = stream_one_batch_late(EdRVFL(cfg, candidates=first), x[:2000], y[:2000], 100)
    manifest, arrays = model_to_arrays(model)
    assert manifest["selection"]["grid"] == [list(c) for c in first]
    del manifest["selection"]["grid"]  # as written before the grid was saved
    restored = model_from_arrays(manifest, arrays)
    assert restored.candidates == first and [ln.half_life for ln in restored.learners] == [
        h for _, h in first
    ]
    for m in (model, restored):
        stream_one_batch_late(m, x[2000:], y[2000:], 100)
    assert restored.effective == model.effective, f"seed={seed_}"
    for a, b in zip(model.learners, restored.learners):
        assert np.array_equal(a.state.layers[1].beta, b.state.layers[1].beta), f"seed={seed_}"
    manifest["selection"]["grid"] = [[0.05, None], [5.0, 2048.0]]  # without the default (0.5, None)
    with pytest.raises(StateFormatError, match="default"):
        model_from_arrays(manifest, arrays)


@pytest.mark.parametrize("key,value", [("lam", "automatic"), ("forgetting", "auto-ish")])
def test_auto_spelling_is_checked(key, value):
    with pytest.raises(ValueError, match=key):
        ModelConfig(n_inputs=3, **{key: value})


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_lam_candidates_share_the_sums_and_only_solve_apart(mode, monkeypatch):
    """lam auto: one learner per half-life makes the updates (labels, decay; the batch's Gram is formed once and
    added to every half-life's A); the other λ hold its sums with their own λ on the diagonal
    (A_j = A_p + (λ_j − λ_p)I, c_j = c_p) and their own β."""
    from iolstream.core import shared_step_kernels, step_kernels
    from iolstream.core.shared_gram import SharedGramLearner

    seed_ = 34
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((1200, 4))
    y = (x[:, 0] * x[:, 1] > 0).astype(int)
    model = EdRVFL(
        ModelConfig(
            n_inputs=4,
            classes=(0, 1),
            n_nodes=24,
            n_layers=2,
            scaler="none",
            lam="auto",
            forgetting="auto",
            mode=mode,
            seed=seed_,
        )
    )
    shared = [ln for ln in model.learners if isinstance(ln, SharedGramLearner)]
    assert len(shared) == 6 and {id(ln.primary) for ln in shared} == {id(ln) for ln in model.learners[::3]}
    calls = []
    for name in (
        "observe_serial",
        "observe_parallel",
        "forward_serial",
        "forward_parallel",
        "learn_serial",
        "learn_parallel",
        "add_grams",
        "add_grams_parallel",
        "grams_into",
        "grams_into_parallel",
        "observe_keep_serial",
        "observe_keep_parallel",
    ):
        module = shared_step_kernels if hasattr(shared_step_kernels, name) else step_kernels
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _k=kernel, _n=name: calls.append(_n) or _k(*a))
    stream_one_batch_late(model, x, y, 100)
    batches = len(range(0, 1200, 100))
    # one Gram per batch: formed alone, or (-F keeping A_r for its regret) by the first half-life's step
    grams = [c for c in calls if c.startswith(("add_grams", "grams_into", "observe_keep"))]
    assert len(grams) == (batches if mode == "forward" else 0), f"{calls}, seed={seed_}"
    assert len(calls) - len(grams) == 3 * (batches - 1), f"{calls}, seed={seed_}"  # labels: each half-life's
    for ln in shared:
        for a, p in zip(ln.state.layers, ln.primary.state.layers):
            np.testing.assert_array_equal(a.rhs, p.rhs)
            shift = (a.lam - p.lam) * np.eye(model.network.n_columns)
            np.testing.assert_allclose(a.gram - p.gram, shift, atol=1e-9 * np.abs(p.gram).max())
        assert ln.state.clock == ln.primary.state.clock == 1200


def test_selector_switches_only_on_a_significant_gap():
    """McNemar on 0/1 losses: 3 rows better out of 3 disagreements is noise (z = 3/√3 < 2), the one in force
    stays; 30 better out of 30 is not; the lowest significant loss wins; the decay halves every half-life."""
    from iolstream.core.candidates import CandidateSelector

    sel = CandidateSelector(3, start=0, half_life=512.0)
    losses = np.zeros((3, 40))
    losses[0, :3] = 1.0  # candidate 0 (in force) wrong on 3 rows the others get right
    sel.record(losses)
    assert sel.chosen == 0 and sel.pair[0, 1] == sel.pair[0, 2] == 3.0
    losses[0, :30] = 1.0
    losses[1, 30:35] = 1.0  # candidate 1 wrong on 5 others: 2 stays the best
    sel.record(losses)
    assert sel.chosen == 2, sel.loss
    assert sel.rows == pytest.approx(40 * np.exp2(-40 / 512) + 40)
    np.testing.assert_allclose(sel.recent(), sel.loss / sel.rows)


def test_selector_pair_sums_are_formed_in_chunks(monkeypatch):
    """Σ (ℓ_j − ℓ_k)² over a labelled batch, a chunk of rows at a time (a batch of a million rows would need
    K²·b floats at once): the same sums as at once, and as written out."""
    from iolstream.core import candidates

    losses = np.random.default_rng(5).random((4, 11))
    whole = candidates.CandidateSelector(4, start=0)
    whole.record(losses)
    monkeypatch.setattr(candidates, "PAIR_CHUNK", 3)
    chunked = candidates.CandidateSelector(4, start=0)
    chunked.record(losses)
    np.testing.assert_allclose(chunked.pair, whole.pair, rtol=1e-14)
    np.testing.assert_allclose(
        whole.pair, ((losses[:, None, :] - losses[None, :, :]) ** 2).sum(axis=2), rtol=1e-14
    )


def test_selector_returns_to_the_default_when_the_edge_fades():
    """A candidate in force other than the default stays only while it beats the default by keep_z standard
    deviations: an edge of 30 rows out of 30 disagreements holds, one worn down to 3.4 of 7.2 does not."""
    from iolstream.core.candidates import CandidateSelector

    def batches(*wrong_counts):
        out = []
        for wrong0, wrong1 in wrong_counts:  # each candidate wrong on its own rows (they disagree there)
            losses = np.zeros((2, 60))
            losses[0, :wrong0] = 1.0
            losses[1, 30 : 30 + wrong1] = 1.0
            out.append(losses)
        return out

    for keep_z, wrong1, expect in ((1.0, 5, 1), (1.0, 25, 0), (0.0, 25, 1)):
        sel = CandidateSelector(2, start=0, half_life=512.0, keep_z=keep_z)
        first, second = batches((30, 0), (0, wrong1))
        sel.record(first)
        assert sel.chosen == 1 and sel.switches == 1  # 30 of 30: z = 5.5 > 2
        sel.record(second)
        assert sel.chosen == expect, (keep_z, wrong1, sel.loss, sel.pair)
        assert sel.switches == 1 + (expect == 0)


def test_auto_model_version_never_goes_back_when_the_candidate_changes():
    seed_ = 35
    rng = np.random.default_rng(seed_)
    x = rng.standard_normal((6000, 3))
    y = _flip(x, 2000)
    model = EdRVFL(
        ModelConfig(
            n_inputs=3,
            classes=(0, 1),
            n_nodes=16,
            n_layers=2,
            scaler="none",
            lam="auto",
            forgetting="auto",
            seed=seed_,
        )
    )
    versions, prev = [], None
    for start in range(0, len(x), 100):
        pred = model.observe(x[start : start + 100])
        versions.append(pred.version)
        if prev is not None:
            model.learn(prev[0].features_t, prev[1], predicted=prev[0].predicted, observed_at=prev[0].clock)
        prev = (pred, model.encode_labels(y[start : start + 100]))
    assert model.selector.switches >= 1, f"seed={seed_}"
    assert np.all(np.diff(versions) > 0), f"seed={seed_}: {versions}"
