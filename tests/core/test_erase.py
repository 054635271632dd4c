"""Erasure (docs/design.md §13): rows taken back out of the model, exactly.

After learning rows R and erasing S ⊂ R, in any interleaving (a row erased while it waits for its label, or
after its label was folded in), every candidate's sums — A, c, A_r, Σ‖y‖², the row counters — and so its β
equal those of a model that learned R∖S from the start, to round-off: for -F, -R and ``mode: auto``, with
``lam``/``forgetting`` candidates, with forgetting (each row leaves at the weight it has now; the reference
sees the erased rows' clock ticks, so the others keep their age), with the regression target scaling (rows
erased before the warm-up scaling froze leave nothing of themselves in it), with half the rows erased.
A downdate that round-off would leave indefinite changes nothing and raises.

Seeds are fixed and printed in every assertion message.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)

from iolstream.core import gram_cholesky
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.shared_gram import SharedGramLearner

B = 40  # rows per batch


def _data(seed: int, rows: int, task: str):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4))
    if task == "classification":
        return x, (x[:, 0] * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    return x, np.c_[x[:, 0] - 2 * x[:, 1] + 0.1 * rng.standard_normal(rows), 3.0 + x[:, 2]]


def _config(task: str, seed: int, **kw) -> ModelConfig:
    base = dict(n_inputs=4, n_nodes=24, n_layers=2, scaler="none", seed=seed, lam=0.5)
    if task == "classification":
        base["classes"] = (0, 1, 2)
    else:
        base.update(n_outputs=2, target_scaler="none")
    base.update(kw)
    return ModelConfig(**base)


def _every_batch(model: EdRVFL) -> EdRVFL:
    model.scoring.share = math.inf  # every candidate predicts every batch (any share gives the same sums)
    return model


def _stream(model, x, y, erased_when: dict[int, int], *, reference: bool):
    """Batches of B rows, labels one batch late. ``erased_when``: row -> the step after which it is erased
    (a row erased before its batch's labels come is erased pending; after, labelled). ``reference``: the model
    never sees the erased rows (their batches' other rows only; the clock still ticks for them)."""
    gone = set(erased_when)
    n_batches = math.ceil(len(x) / B)
    batches = {}  # t -> (Prediction or None, rows of it, targets, labelled yet)
    for t in range(n_batches):
        rows = np.arange(t * B, min((t + 1) * B, len(x)))
        seen = rows if not reference else rows[[r not in gone for r in rows]]
        if len(seen) < len(rows):
            for ln in model.learners:
                ln.advance(len(rows) - len(seen))  # the erased rows' ticks: the others keep their age
        pred = model.observe(x[seen]) if len(seen) else None
        batches[t] = (pred, seen, model.encode_labels(y[seen]) if len(seen) else None)
        if t > 0 and batches[t - 1][0] is not None:  # the previous batch's labels, less rows erased pending
            prev, prev_rows, targets = batches[t - 1]
            # rows erased at step t − 1 or before were erased pending: their labels never enter
            keep = np.array([reference or erased_when.get(r, n_batches) >= t for r in prev_rows.tolist()])
            if keep.any():
                model.learn(
                    prev.features_t[:, :, keep],
                    targets[keep],
                    predicted=prev.predicted[..., keep, :],
                    observed_at=prev.clock,
                )
        if not reference:
            _erase_at(model, t, batches, erased_when)
    return model


def _erase_at(model, t: int, batches: dict, erased_when: dict[int, int]) -> None:
    """Erase the rows due after step t, in one call: labelled ones (batches before t) and pending ones
    (batch t, whose labels come at step t + 1)."""
    cols, targets, labelled, stamps = [], [], [], []
    for s in range(t + 1):
        pred, rows, y_enc = batches[s]
        for i, r in enumerate(rows.tolist()):
            if erased_when.get(r) == t:
                cols.append(pred.features_t[:, :, i])
                targets.append(y_enc[i])
                labelled.append(s < t)
                stamps.append(pred.clock)
    if cols:
        model.erase(np.stack(cols, axis=2), np.array(targets), np.array(labelled), np.array(stamps))


def _plan(seed: int, rows: int, share: float) -> dict[int, int]:
    """A random ``share`` of the rows, each erased at a random step from its own batch's to the end."""
    rng = np.random.default_rng(seed + 1)
    chosen = rng.choice(rows, int(share * rows), replace=False)
    n_batches = math.ceil(rows / B)
    return {int(r): int(rng.integers(r // B, n_batches)) for r in chosen}


def _assert_same_sums(model, reference, msg: str, rtol: float = 1e-9) -> None:
    for j, (ln, ref) in enumerate(zip(model.learners, reference.learners)):
        st, rst = ln.state, ref.state
        if not isinstance(ln, SharedGramLearner):
            a, ra = st.arrays, rst.arrays
            scale = np.abs(ra.gram).max()
            np.testing.assert_allclose(
                np.tril(a.gram[:, :, :].transpose(0, 2, 1)),
                np.tril(ra.gram.transpose(0, 2, 1)),
                rtol=rtol,
                atol=rtol * scale,
                err_msg=f"{msg}: A of learner {j}",
            )
            np.testing.assert_allclose(
                a.rhs, ra.rhs, rtol=rtol, atol=rtol * np.abs(ra.rhs).max(), err_msg=f"{msg}: c of learner {j}"
            )
            if len(ra.gram_labelled):
                np.testing.assert_allclose(
                    np.tril(a.gram_labelled.transpose(0, 2, 1)),
                    np.tril(ra.gram_labelled.transpose(0, 2, 1)),
                    rtol=rtol,
                    atol=rtol * scale,
                    err_msg=f"{msg}: A_r of learner {j}",
                )
            assert math.isclose(st.sum_y2, rst.sum_y2, rel_tol=rtol, abs_tol=1e-9), f"{msg}: Σ‖y‖² of {j}"
        for key in ("rows_observed", "rows_labelled", "clock"):
            assert getattr(st, key) == getattr(rst, key), f"{msg}: {key} of learner {j}"
        for layer, (ls, rls) in enumerate(zip(st.layers, rst.layers)):
            np.testing.assert_allclose(
                ls.beta, rls.beta, rtol=1e-7, atol=1e-9, err_msg=f"{msg}: β of learner {j}, layer {layer}"
            )


SETTINGS = [
    {"mode": "forward"},
    {"mode": "ridge"},
    {"mode": "forward", "solver": "woodbury"},
    {"mode": "forward", "forgetting": 300.0},
    {"mode": "ridge", "forgetting": 300.0},
    {"mode": "auto"},
    {"mode": "auto", "lam": "auto", "forgetting": "auto"},
    {"mode": "forward", "lam": "auto"},
]


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_erasing_rows_leaves_the_model_that_never_learned_them(kw, task):
    seed = 71
    x, y = _data(seed, 600, task)
    plan = _plan(seed, len(x), 0.3)
    model = _stream(_every_batch(EdRVFL(_config(task, seed, **kw))), x, y, plan, reference=False)
    ref = _stream(_every_batch(EdRVFL(_config(task, seed, **kw))), x, y, plan, reference=True)
    _assert_same_sums(model, ref, f"seed {seed}, {kw}, {task}")
    assert model.learners[0].state.rows_labelled == len(x) - B - len(plan) + sum(
        1 for r in plan if r >= len(x) - B
    ), "the last batch is never labelled"


@pytest.mark.parametrize(
    "kw", [{"mode": "forward"}, {"mode": "auto", "forgetting": 500.0}, {"mode": "ridge"}]
)
def test_half_the_rows_erased_in_one_call_each_batch_keeps_every_sum_positive_definite(kw):
    """Half of 4,000 rows, each erased soon after it came: A and A_r are refactored from the sums after every
    downdate (never a downdated factor) and stay positive definite; β is the reference's."""
    seed = 72
    x, y = _data(seed, 4000, "classification")
    rng = np.random.default_rng(seed)
    n_batches = len(x) // B
    plan = {int(r): min(int(r // B + rng.integers(0, 3)), n_batches - 1) for r in range(0, len(x), 2)}
    model = _stream(_every_batch(EdRVFL(_config("classification", seed, **kw))), x, y, plan, reference=False)
    ref = _stream(_every_batch(EdRVFL(_config("classification", seed, **kw))), x, y, plan, reference=True)
    _assert_same_sums(model, ref, f"seed {seed}, {kw}, half erased", rtol=1e-8)
    for ln in model.learners:
        for ls in ln.state.layers:
            gram_cholesky.cholesky(ls.gram)  # positive definite
            np.testing.assert_allclose(
                gram_cholesky.symmetric(ls.gram) @ ls.beta, ls.rhs, rtol=1e-8, atol=1e-8
            )


def test_erasing_every_row_returns_the_prior():
    """All rows erased: A = λI, c = 0, β = 0 (to round-off), counters 0: the model never learned."""
    seed = 73
    x, y = _data(seed, 200, "classification")
    plan = {r: math.ceil(len(x) / B) - 1 for r in range(len(x))}
    model = _stream(EdRVFL(_config("classification", seed, mode="forward")), x, y, plan, reference=False)
    st = model.learner.state
    np.testing.assert_allclose(
        np.tril(st.layers[0].gram), 0.5 * np.eye(st.layers[0].gram.shape[0]), atol=1e-10
    )
    np.testing.assert_allclose(st.layers[0].beta, 0.0, atol=1e-10)
    assert (st.rows_observed, st.rows_labelled) == (0, 0)
    assert abs(st.sum_y2) < 1e-9


def test_regression_rows_erased_while_their_labels_wait_for_the_target_scaling_leave_nothing():
    """Target scaling by warm-up: rows erased while their labels are held (before the W-th label) leave the
    hold, so the scaling is that of the first W labels of R∖S — the reference's, who never saw them."""
    seed = 74
    x, y = _data(seed, 600, "regression")
    kw = dict(mode="forward", target_scaler="warmup", warmup_rows=200)
    plan = {r: r // B + 1 for r in range(3, 160, 7)}  # erased labelled, before the 200th label came
    model = _stream(EdRVFL(_config("regression", seed, **kw)), x, y, plan, reference=False)
    ref = _stream(EdRVFL(_config("regression", seed, **kw)), x, y, plan, reference=True)
    np.testing.assert_allclose(model.targets.mean, ref.targets.mean, rtol=1e-12)
    np.testing.assert_allclose(model.targets.std, ref.targets.std, rtol=1e-12)
    _assert_same_sums(model, ref, f"seed {seed}, held labels erased")


def test_regression_rows_erased_after_the_scaling_froze_match_a_model_with_that_scaling_fixed():
    """Rows erased after the warm-up target scaling froze: their terms leave A and c; the scaling keeps their
    share in the first W labels' mean and deviation (docs/data-protection.md), so the reference is a model
    with that scaling fixed."""
    seed = 75
    x, y = _data(seed, 600, "regression")
    plan = {r: 12 for r in range(0, 400, 3)}  # after step 12 every row of them is labelled, scaling frozen
    model = _stream(
        EdRVFL(_config("regression", seed, mode="forward", target_scaler="warmup", warmup_rows=100)),
        x,
        y,
        plan,
        reference=False,
    )
    fixed = dict(
        target_scaler="fixed", target_mean=tuple(model.targets.mean), target_std=tuple(model.targets.std)
    )
    ref = _stream(EdRVFL(_config("regression", seed, mode="forward", **fixed)), x, y, plan, reference=True)
    _assert_same_sums(model, ref, f"seed {seed}, erased after the scaling froze")


def test_a_downdate_round_off_would_leave_indefinite_changes_nothing():
    """Erasing a row that never entered (its Gram far larger than what A holds) would leave A indefinite: the
    erase raises and every candidate's sums stay as they were, bit for bit."""
    seed = 76
    x, y = _data(seed, 200, "classification")
    model = _stream(
        EdRVFL(_config("classification", seed, mode="auto", lam="auto")), x, y, {}, reference=False
    )
    before = [
        (ln.state.arrays.gram.copy(), ln.state.arrays.rhs.copy(), ln.state.rows_observed)
        for ln in model.learners
    ]
    version = model.version
    huge = model.features(100.0 * np.ones((1, 4)))
    with pytest.raises(gram_cholesky.NotPositiveDefinite):
        model.erase(huge, model.encode_labels([1]), [True], [model.learner.clock])
    for ln, (gram, rhs, rows) in zip(model.learners, before):
        assert np.array_equal(ln.state.arrays.gram, gram) and np.array_equal(ln.state.arrays.rhs, rhs)
        assert ln.state.rows_observed == rows
    assert model.version == version
    model.predict(x[:5])  # solves from the sums put back


@pytest.mark.parametrize("kw", [{"mode": "auto", "lam": "auto", "forgetting": "auto"}, {"mode": "ridge"}])
def test_whole_batches_of_one_stamp_take_one_gram_out_of_every_half_life(kw):
    """Rows of one stamp (a batch learned together) are taken out with one Gram formed for all the half-lives,
    each at its own weight; the model is the reference's all the same."""
    seed = 77
    x, y = _data(seed, 800, "classification")
    plan = {r: r // B + 2 for r in range(B, 600) if (r // B) % 3 == 1}  # batches 1, 4, 7, ... two steps later
    model = _stream(_every_batch(EdRVFL(_config("classification", seed, **kw))), x, y, plan, reference=False)
    ref = _stream(_every_batch(EdRVFL(_config("classification", seed, **kw))), x, y, plan, reference=True)
    _assert_same_sums(model, ref, f"seed {seed}, {kw}, whole batches")


@pytest.mark.parametrize(
    "kw",
    [{"mode": "forward"}, {"mode": "ridge", "forgetting": 300.0}, {"mode": "auto", "forgetting": 400.0}],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_class_weighted_rows_leave_at_their_weight_with_their_class_counts_and_calibration_terms(kw):
    """A labelled row of class weight w (``model.class_weight``) leaves A, c, A_r at w times its decay, the class
    counts by one, and (given the scores each candidate had for it) every candidate's calibration sums by the log
    loss it added: the last label batch erased leaves the model that never had those labels, its clock moved on."""
    seed = 79
    x, y = _data(seed, 5 * B, "classification")
    cfg = _config("classification", seed, class_weight=[1.0, 3.0, 0.5], **kw)
    model, ref = _every_batch(EdRVFL(cfg)), _every_batch(EdRVFL(cfg))
    assert model.calibrated
    for t in range(4):  # both learn the first four batches alike
        for m in (model, ref):
            rows = slice(t * B, (t + 1) * B)
            pred = m.observe(x[rows])
            m.learn(
                pred.features_t, m.encode_labels(y[rows]), predicted=pred.predicted, observed_at=pred.clock
            )
    last = slice(4 * B, 5 * B)
    pred = model.observe(x[last])
    targets = model.encode_labels(y[last])
    model.learn(pred.features_t, targets, predicted=pred.predicted, observed_at=pred.clock)
    weights, scores = model.entered_weights, model.calibration_scores(pred.predicted)
    np.testing.assert_array_equal(weights, np.array([1.0, 3.0, 0.5])[y[last]])
    for ln in ref.learners:
        ln.advance(B)  # the reference sees the erased batch's ticks only
    for _ in range(7):  # time passes: the rows leave at the weight they have now
        model.observe(x[:3])
        ref.observe(x[:3])
    model.erase(pred.features_t, targets, True, pred.clock, weights=weights, scores=scores)
    msg = f"seed {seed}, {kw}"
    _assert_same_sums(model, ref, msg)
    np.testing.assert_array_equal(model.class_counts, ref.class_counts, err_msg=msg)
    for j, (ln, rln) in enumerate(zip(model.learners, ref.learners)):
        np.testing.assert_allclose(
            ln.calibration_sums, rln.calibration_sums, rtol=1e-9, atol=1e-9, err_msg=f"{msg}: learner {j}"
        )
    assert model.calibration_in_force() == ref.calibration_in_force()
