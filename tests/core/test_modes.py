"""``mode: auto``: -F and -R as candidates of the online selector (``core.candidates``).

The -R candidates solve on the labelled sums A_r that the -F learner keeps beside its A: each candidate must
hold the state of a model configured with its one mode and fed the same rows; the selector must follow the
mode that predicts better, whichever it starts with; the choice survives a snapshot.
"""

from __future__ import annotations

import io
import math
from dataclasses import replace

import numpy as np
import pytest
from model_util import stream_one_batch_late

from iolstream.core import candidates
from iolstream.core.candidates import CandidateSelector
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.state_io import load_model, save_model


@pytest.fixture
def budget_from_the_start(monkeypatch):
    """The scoring budget without its early rows (``candidates.SCORE_ALL_ROWS``: every batch of a stream's first
    4,096 rows is scored): these streams are shorter than that, and what they test is the budget's share."""
    monkeypatch.setattr(candidates, "SCORE_ALL_ROWS", 0)


def _every_batch(model: EdRVFL) -> EdRVFL:
    """Every candidate scored on every batch (no budget): each one's losses are those of its own run."""
    model.scoring.share = math.inf
    return model


def _classes(seed: int, rows: int = 900):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4))
    return x, (x[:, 0] * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)


@pytest.mark.parametrize(
    "kw", [{}, {"lam": "auto"}, {"forgetting": 300.0}, {"lam": "auto", "forgetting": "auto"}]
)
def test_every_candidate_is_the_model_of_its_one_mode(kw):
    seed = 41
    x, y = _classes(seed)
    base = dict(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", seed=seed, **kw)
    auto = stream_one_batch_late(_every_batch(EdRVFL(ModelConfig(**base, mode="auto"))), x, y, 60)
    assert sorted(set(auto.modes)) == ["forward", "ridge"]
    assert len(auto.learners) == 2 * len(EdRVFL(ModelConfig(**base, mode="forward")).learners)
    for j, ((lam, h), mode) in enumerate(zip(auto.candidates, auto.modes)):
        fixed = stream_one_batch_late(
            EdRVFL(ModelConfig(**{**base, "lam": lam, "forgetting": h}, mode=mode)), x, y, 60
        )
        for layer, (a, b) in enumerate(zip(auto.learners[j].state.layers, fixed.learner.state.layers)):
            np.testing.assert_allclose(
                a.beta, b.beta, rtol=1e-10, atol=1e-12, err_msg=f"{mode} λ={lam} h={h} layer {layer}"
            )
        own, alone = auto.regret(j), fixed.regret()
        np.testing.assert_allclose(own.cumulative_loss, alone.cumulative_loss, rtol=1e-10)
        np.testing.assert_allclose(own.cumulative_regret, alone.cumulative_regret, rtol=1e-8, atol=1e-8)


def test_candidates_scored_on_some_batches_keep_exact_sums_and_score_only_those(budget_from_the_start):
    """Under the scoring budget the candidates not in force predict some batches only: their sums, and so their
    β, are still exactly those of their one-mode models; their loss sums are those models' losses on the batches
    they predicted; their regret is not reported (NaN, with the rows it covers)."""
    seed = 44
    x, y = _classes(seed)
    base = dict(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", seed=seed, lam="auto")
    auto = EdRVFL(ModelConfig(**base, mode="auto"))
    fixed = [
        EdRVFL(ModelConfig(**{**base, "lam": lam, "forgetting": h}, mode=mode))
        for (lam, h), mode in zip(auto.candidates, auto.modes)
    ]
    own = np.zeros((len(fixed), 2))  # each candidate's one-mode losses on the batches it predicted
    prev = None
    for start in range(0, len(x), 60):
        pred = auto.observe(x[start : start + 60])
        alone = [m.observe(x[start : start + 60]) for m in fixed]
        if prev is not None:
            targets = auto.encode_labels(y[start - 60 : start])
            auto.learn(prev[0].features_t, targets, predicted=prev[0].predicted)
            made = ~np.isnan(prev[0].candidate_outputs[:, 0, 0, 0])
            for j, (m, p) in enumerate(zip(fixed, prev[1])):
                losses = m.learn(p.features_t, targets, predicted=p.layer_outputs)
                own[j] += losses if made[j] else 0.0
        prev = (pred, alone)
    share = auto.scoring.scored_share
    assert 0.05 < share < 0.9, share  # else the budget is not what this tests
    auto.sync_candidates()
    for j, m in enumerate(fixed):
        for a, b in zip(auto.learners[j].state.layers, m.learner.state.layers):
            np.testing.assert_allclose(a.beta, b.beta, rtol=1e-10, atol=1e-12, err_msg=f"candidate {j}")
        np.testing.assert_allclose(auto.learners[j].state.arrays.loss_sum, own[j], rtol=1e-10, err_msg=f"{j}")
        report = auto.regret(j)
        if j == auto.selector.start and auto.selector.switches == 0:  # in force all along: every row
            assert np.isfinite(report.mean_regret)
            assert auto.predicted_rows[j] == auto.learner.state.rows_labelled
        else:
            assert (
                np.isnan(report.mean_regret)
                and report.extra["rows_predicted"] < report.extra["rows_labelled"]
            )


def test_the_forward_update_still_enters_every_batch_before_it_is_predicted():
    x, y = _classes(42, 200)
    model = EdRVFL(
        ModelConfig(n_inputs=4, classes=(0, 1, 2), n_nodes=8, n_layers=1, scaler="none", mode="auto")
    )
    forward, ridge = model.learners

    def a(ln):  # A's lower triangle (authoritative)
        return np.tril(ln.state.layers[0].gram)

    before = a(forward)
    pred = model.observe(x[:50])
    gram = np.tril(pred.features_t[0] @ pred.features_t[0].T)
    np.testing.assert_allclose(a(forward), before + gram, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a(ridge), before)  # -R: no label yet, A_r = λI
    model.learn(pred.features_t, model.encode_labels(y[:50]), predicted=pred.predicted)
    ridge.sync()
    np.testing.assert_allclose(a(ridge), before + gram, rtol=1e-12, atol=1e-12)


def _supplement_f(seed: int, rows: int = 600, noise: float = 0.15):
    """Supplementary F's batch stream: large β° ~ N(20, 1), relative noise. -F's prediction is shrunk by its
    own batch's Gram; with this signal the bias dominates and -R predicts better (its CR_T ≈ ½ -F's)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 20))
    beta = rng.normal(20.0, 1.0, 20)
    return x, x @ beta + noise * np.linalg.norm(beta) * rng.standard_normal(rows)


def _paper_regime(seed: int, rows: int = 3000):
    """N(0,1) random weights, λ = 2⁻⁶, a noisy non-linear target: -R overshoots where A is ill-conditioned."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 10))
    return x, np.sin(x @ rng.standard_normal(10)) + 0.5 * rng.standard_normal(rows)


def _regression(**kw) -> ModelConfig:
    return ModelConfig(n_outputs=1, n_layers=2, scaler="none", target_scaler="none", mode="auto", **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("start", ["forward", "ridge"])
def test_auto_follows_ridge_where_ridge_predicts_better(seed, start, budget_from_the_start):
    """From either start, with every batch scored (each candidate's regret is then known) and with the default
    budget (the -F candidate scored on some batches)."""
    x, y = _supplement_f(seed)
    model = _every_batch(EdRVFL(_regression(n_inputs=20, n_nodes=16, seed=seed)))
    budget = EdRVFL(_regression(n_inputs=20, n_nodes=16, seed=seed))
    for m in (model, budget):
        m.selector = CandidateSelector(2, m.modes.index(start))
        stream_one_batch_late(m, x, y, 10)
        assert m.effective["mode"] == "ridge", f"seed={seed} start={start}: {m.effective}"
        assert m.selector.switches == (start == "forward"), f"seed={seed} start={start}"
    forward, ridge = model.regret(0), model.regret(1)
    assert ridge.mean_regret < 0.6 * forward.mean_regret, f"seed={seed}"  # else the stream tests nothing
    assert budget.scoring.scored_share < 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_follows_forward_where_forward_predicts_better(seed):
    x, y = _paper_regime(seed)
    cfg = _regression(n_inputs=10, n_nodes=64, init="normal", lam=2**-6, seed=seed)
    model = EdRVFL(cfg)
    assert model.effective["mode"] == "ridge"  # the default start: it has to move
    stream_one_batch_late(model, x, y, 20)
    assert model.effective["mode"] == "forward", f"seed={seed}: {model.effective}"
    forward, ridge = (
        stream_one_batch_late(EdRVFL(replace(cfg, mode=m)), x, y, 20).regret() for m in ("forward", "ridge")
    )
    emitted = model.regret()
    assert forward.mean_regret < 0.5 * ridge.mean_regret, f"seed={seed}"
    # what the model emitted: -R's early batches, then -F's
    assert forward.mean_regret <= emitted.mean_regret < ridge.mean_regret, f"seed={seed}"
    np.testing.assert_allclose(emitted.expert_loss, forward.expert_loss, rtol=1e-9)  # one expert for both


def test_mode_auto_survives_a_snapshot_and_continues_as_if_never_stopped():
    seed = 43
    x, y = _paper_regime(seed, 2000)
    cfg = _regression(n_inputs=10, n_nodes=32, init="normal", lam=2**-6, seed=seed, forgetting="auto")
    model = stream_one_batch_late(EdRVFL(cfg), x[:1500], y[:1500], 20)
    buf = io.BytesIO()
    save_model(buf, model)
    buf.seek(0)
    restored = load_model(buf)
    assert restored.modes == model.modes and restored.candidates == model.candidates
    assert restored.effective == model.effective
    assert restored.scoring.to_state() == model.scoring.to_state()  # the same batches scored from here on
    np.testing.assert_array_equal(restored.predicted_rows, model.predicted_rows)
    np.testing.assert_array_equal(restored.emitted_loss, model.emitted_loss)
    for a, b in zip(restored.learners, model.learners):
        for la, lb in zip(a.state.layers, b.state.layers):
            np.testing.assert_array_equal(la.beta, lb.beta)
    for m in (model, restored):
        stream_one_batch_late(m, x[1500:], y[1500:], 20)
    np.testing.assert_array_equal(restored.predict(x[:100]), model.predict(x[:100]))
    assert restored.effective == model.effective
    np.testing.assert_allclose(restored.regret().cumulative_regret, model.regret().cumulative_regret)


def test_a_saved_mode_grid_that_lacks_the_start_is_refused():
    from iolstream.core.state_io import StateFormatError, model_from_arrays, model_to_arrays

    model = EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, n_layers=1, scaler="none", mode="auto"))
    manifest, arrays = model_to_arrays(model)
    manifest["selection"]["modes"] = ["forward", "forward"]
    with pytest.raises(StateFormatError, match="lacks the default setting"):
        model_from_arrays(manifest, arrays)
    manifest["selection"]["modes"] = ["forward", "sideways"]
    with pytest.raises(StateFormatError, match="modes"):
        model_from_arrays(manifest, arrays)


def test_fixed_modes_keep_one_learner_and_a_bad_mode_is_named():
    for mode in ("forward", "ridge"):
        model = EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, n_layers=1, mode=mode))
        assert model.modes == [mode] and len(model.learners) == 1
        assert model.effective == {"lam": 0.5, "forgetting": None, "mode": mode}
    with pytest.raises(ValueError, match="model.mode: must be one of"):
        ModelConfig(n_inputs=3, classes=(0, 1), mode="both")


def test_the_scoring_budget_scores_the_first_batch_then_what_its_credit_pays_for():
    """Each batch earns share × its step's FLOPs; a scored batch spends its cost; no saving beyond one scoring."""
    from iolstream.core.candidates import ScoringBudget

    budget = ScoringBudget((4, 3, 24, 2, True), share=0.5, early_rows=0)
    step = budget.step(10)
    assert step > 0 and budget.take(10, cost=10 * step)  # the first batch, whatever it costs
    taken = [budget.take(10, cost=2 * step) for _ in range(12)]  # 0.5 step a batch, 2 steps a scoring
    assert taken == [False, False, False, True] * 3
    assert budget.scored_rows == 40 and budget.rows == 130
    for _ in range(50):  # cheap: every batch, and the credit never exceeds one scoring
        assert budget.take(10, cost=0.1 * step) and budget.credit <= 0.1 * step
    again = ScoringBudget(budget.dims, early_rows=0)
    again.load_state(budget.to_state())
    assert again.to_state() == budget.to_state()
    fresh = ScoringBudget(budget.dims, early_rows=0)
    fresh.load_state(None)  # a snapshot from before the budget: the next batch is scored
    assert fresh.take(10, cost=1e30)


def test_the_budget_scores_every_batch_of_the_early_rows_then_what_its_credit_pays_for():
    """Every batch that starts within the first ``early_rows`` rows is scored, earning and spending nothing; then the
    budget as from a stream's start (its first batch scored); a budget restored within the early rows goes on
    scoring until they end, one restored after them does not start them again."""
    from iolstream.core.candidates import SCORE_ALL_ROWS, ScoringBudget

    assert ScoringBudget((4, 3, 24, 2, True)).early_rows == SCORE_ALL_ROWS == 4096
    budget = ScoringBudget((4, 3, 24, 2, True), share=0.5, early_rows=35)
    step = budget.step(10)
    early = [budget.take(10, cost=1e30) for _ in range(4)]  # rows 0, 10, 20, 30: within the first 35
    assert early == [True] * 4 and math.isinf(budget.credit)
    assert budget.scored_rows == budget.rows == 40
    mid = ScoringBudget(budget.dims, share=0.5, early_rows=100)
    mid.load_state(budget.to_state())  # restored at row 40 of 100: still early
    assert all(mid.take(10, cost=1e30) for _ in range(6)) and mid.rows == 100
    after = [budget.take(10, cost=2 * step) for _ in range(9)]  # the budget's first batch, then 1 in 4
    assert after == [True, False, False, False, True, False, False, False, True]
    restored = ScoringBudget(budget.dims, share=0.5, early_rows=35)
    restored.load_state(budget.to_state())
    assert [restored.take(10, cost=2 * step) for _ in range(4)] == [False, False, False, True]


def test_the_budget_scores_the_pair_on_some_batches_and_many_candidates_on_fewer(budget_from_the_start):
    """The default -F and -R pair on batches of the small bench config: one in three (a Cholesky counted at the rate
    it runs, work.CHOLESKY_WEIGHT; counted at its operations alone, every batch was); 18 candidates: fewer."""
    base = dict(n_inputs=10, n_outputs=10, n_nodes=128, n_layers=4, scaler="none")
    rng = np.random.default_rng(0)
    for extra, low, high in (({}, 0.3, 0.4), ({"lam": "auto", "forgetting": "auto"}, 0.02, 0.08)):
        model = EdRVFL(ModelConfig(**base, mode="auto", **extra))
        x = rng.standard_normal((256 * 36, 10))  # the first batch is always scored
        stream_one_batch_late(model, x, rng.standard_normal((len(x), 10)), 256)
        assert low <= model.scoring.scored_share <= high, (extra, model.scoring.scored_share)


def test_scoring_share_is_a_positive_number_or_all(budget_from_the_start):
    base = dict(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", lam="auto")
    for bad in (0, -1.0, "most", True, float("inf")):
        with pytest.raises(ValueError, match="model.scoring_share"):
            ModelConfig(**base, scoring_share=bad)
    x, y = _classes(45, 600)
    every = stream_one_batch_late(EdRVFL(ModelConfig(**base, scoring_share="all")), x, y, 60)
    assert (
        every.scoring.scored_share == 1.0
        and (every.predicted_rows == every.learner.state.rows_labelled).all()
    )
    some = stream_one_batch_late(EdRVFL(ModelConfig(**base)), x, y, 60)
    assert some.scoring.scored_share < 1.0
    more = stream_one_batch_late(EdRVFL(ModelConfig(**base, scoring_share=1.0)), x, y, 60)
    assert some.scoring.scored_share < more.scoring.scored_share


def _auto_state(model: EdRVFL) -> dict:
    """Every array of the -F learner and the -R candidate's β (lower triangles of the sums)."""
    forward, ridge = model.learners
    a = forward.state.arrays
    out = {
        "A": np.tril(a.gram[:, :, :].transpose(0, 2, 1)),
        "A_r": np.tril(a.gram_labelled.transpose(0, 2, 1)),
    }
    out.update(c=a.rhs.copy(), beta_r=np.stack([ls.beta for ls in ridge.state.layers]))
    out["beta_f"] = np.stack([ls.beta for ls in forward.state.layers])
    return out


def test_the_fused_pair_step_is_the_step_of_its_parts_bitwise(monkeypatch, budget_from_the_start):
    """The default -F and -R pair goes through one kernel call per batch (``shared_step_kernels.observe_pair_*``); with
    that path switched off each candidate steps apart (the kept-Gram step, then the -R candidate's own solve):
    the same predictions, sums and β, bit for bit, including the batches the -F learner is not scored on."""
    from iolstream.core.shared_gram import SharedGramLearner

    x, y = _classes(46, 1200)
    base = dict(
        n_inputs=4, classes=(0, 1, 2), n_nodes=40, n_layers=2, scaler="none", seed=46, scoring_share=0.05
    )
    runs = []
    for pair in (True, False):
        if not pair:
            monkeypatch.setattr(SharedGramLearner, "reads_labelled", property(lambda self: False))
        model, preds, prev = EdRVFL(ModelConfig(**base)), [], None
        for start in range(0, len(x), 80):
            pred = model.observe(x[start : start + 80])
            preds.append(pred.candidate_outputs)
            if prev is not None:
                model.learn(
                    prev.features_t, model.encode_labels(y[start - 80 : start]), predicted=prev.predicted
                )
            prev = pred
        runs.append((model, preds))
    (fast, fast_preds), (apart, apart_preds) = runs
    assert 0.1 < fast.scoring.scored_share < 1.0, fast.scoring.scored_share  # both kinds of batch
    for t, (p, q) in enumerate(zip(fast_preds, apart_preds)):
        np.testing.assert_array_equal(p, q, err_msg=f"batch {t}")
    for name, value in _auto_state(fast).items():
        np.testing.assert_array_equal(value, _auto_state(apart)[name], err_msg=name)
    assert fast.selector.chosen == apart.selector.chosen and fast.selector.switches == apart.selector.switches


def test_features_alone_do_not_make_the_ridge_candidate_solve_again():
    """-R solves on A_r and c, which move with labels, not with features: batches that bring no labels leave its β
    as it was (no Cholesky); labels make it solve again."""
    x, y = _classes(47, 600)
    model = _every_batch(
        EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none"))
    )
    forward, ridge = model.learners
    first = model.observe(x[:50])
    model.learn(first.features_t, model.encode_labels(y[:50]), predicted=first.predicted)
    assert ridge.needs_solve()  # labels moved A_r and c
    model.observe(x[50:100])
    assert not ridge.needs_solve()  # solved for that batch
    beta = np.stack([ls.beta for ls in ridge.state.layers])
    for start in (100, 150, 200):  # features only: A moves, A_r and c do not
        before = forward.state.version
        model.observe(x[start : start + 50])
        assert forward.state.version > before and not ridge.needs_solve()
        np.testing.assert_array_equal(np.stack([ls.beta for ls in ridge.state.layers]), beta)


def test_candidates_allocate_no_copy_of_the_sums_and_the_gram_buffers_are_reused():
    """A λ or -R candidate reads its primary's sums: no n×n array of its own until its ``state`` is read (then a
    copy of the primary's, shifted); the kept batch Grams live in at most two buffers, reused batch after batch;
    no factor stack is made on the -F route."""
    x, y = _classes(48, 900)
    model = stream_one_batch_late(
        EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", lam="auto")),
        x,
        y,
        60,
    )
    n = model.network.n_columns
    shared = [ln for ln in model.learners if ln is not model.learners[0]]
    assert len(shared) == 5
    for ln in shared:
        a = ln._state.arrays
        assert a.gram.size == a.factor.size == a.gram_labelled.size == 0
    model.regret(model.selector.chosen)  # the regret reads the primary's labelled sums: still no copy
    assert all(ln._state.arrays.gram.size == 0 for ln in shared)
    assert model.learners[0].state.arrays.factor.size == 0
    assert model.batch_grams.nbytes <= 2 * model.config.n_layers * n * n * 8
    ridge = shared[2]  # -R, λ = 0.05 (the primary's λ): A_r as it is
    assert ridge.reads_labelled and ridge.lam == model.learners[0].lam
    np.testing.assert_array_equal(
        np.tril(ridge.state.layers[1].gram), np.tril(model.learners[0].state.layers[1].gram_labelled)
    )
    assert ridge._state.arrays.gram.shape == (2, n, n)  # allocated by that read


@pytest.mark.parametrize("mode", ["auto", "forward"])
def test_a_model_whose_factor_stack_was_never_made_pickles_erases_and_predicts_the_same(mode):
    """The -F route factors in scratch memory, and a shared candidate keeps no A of its own: pickling solves every
    stale β (a shared candidate's from its primary's sums, nothing factored in its empty A), erasing rows (which
    factors A) makes the stack first; the copy predicts the same bits, and after the erasure the primary's β is
    the copy's again."""
    import pickle

    x, y = _classes(49, 600)
    cfg = ModelConfig(n_inputs=4, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", mode=mode)
    model = stream_one_batch_late(EdRVFL(cfg), x, y, 60)
    assert model.learners[0].state.arrays.factor.size == 0
    copy = pickle.loads(pickle.dumps(model))
    assert all(ln._state.arrays.gram.size == 0 for ln in copy.learners[1:])
    probe = np.random.default_rng(1).standard_normal((30, 4))
    np.testing.assert_array_equal(copy.predict(probe), model.predict(probe))
    fresh = stream_one_batch_late(EdRVFL(cfg), x, y, 60)  # never pickled: no factor stack yet
    pred = fresh.observe(x[:20])
    fresh.learn(pred.features_t, np.eye(3)[y[:20]], predicted=pred.predicted, observed_at=pred.clock)
    assert fresh.learners[0].state.arrays.factor.size == 0
    fresh.erase(pred.features_t, np.eye(3)[y[:20]], True, pred.clock)
    for layer, (ls, before) in enumerate(zip(fresh.learners[0].state.layers, copy.learners[0].state.layers)):
        np.testing.assert_allclose(ls.beta, before.beta, rtol=1e-6, atol=1e-9, err_msg=f"layer {layer}")
