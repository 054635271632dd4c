"""Calibrated probabilities (core.calibration), class weights in the sums (Theorem 1 with row weights) and the
binary threshold (docs/design.md §12)."""

from __future__ import annotations

import numpy as np
import pytest

from iolstream.core import calibration, contribution
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.state_io import model_from_arrays, model_to_arrays

SEED = 30
K = 4


def small(**kwargs) -> ModelConfig:
    base = dict(n_inputs=K, classes=(0, 1, 2), n_nodes=12, n_layers=2, scaler="none", seed=SEED)
    return ModelConfig(**{**base, **kwargs})


def stream(seed: int, n: int = 600):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, K))
    y = (x[:, 0] > 0.3).astype(int) + (x[:, 1] > 1.0).astype(int)  # 3 classes, the last rare
    return x, y


# ------------------------------------------------------------------------------ the calibration map


def test_grid_losses_equal_the_log_loss_of_every_map():
    rng = np.random.default_rng(SEED)
    scores = rng.normal(0.4, 0.5, (50, 3))
    labels = rng.integers(0, 3, 50)
    weights = rng.uniform(0.2, 3.0, 50)
    got = calibration.grid_losses(scores, labels, weights)
    c = np.clip(scores, calibration.FLOOR, 1.0)
    want = []
    for kappa in calibration.KAPPAS:
        g = np.log(c) if kappa == 0 else (c**kappa - 1) / kappa
        for t in calibration.TEMPERATURES:
            z = t * g
            log_p = z - z.max(axis=1, keepdims=True)
            log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
            row = np.minimum(
                -log_p[np.arange(50), labels], -np.log(calibration.PROBABILITY_FLOOR)
            )  # as log loss clips
            want.append((weights * row).sum())
    np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"seed={SEED}")


def _every_map(scores):
    """(GRID_SIZE, b, m) the probabilities of every map of the grid, κ major: the formula of docs/design.md §12."""
    c = np.clip(scores, calibration.FLOOR, 1.0)
    out = []
    for kappa in calibration.KAPPAS:
        g = np.log(c) if kappa == 0 else (c**kappa - 1) / kappa
        for t in calibration.TEMPERATURES:
            e = np.exp(t * g)
            out.append(e / e.sum(axis=1, keepdims=True))
    return np.array(out)


def test_before_any_label_every_map_weighs_alike():
    scores = np.array([[1.4, -0.2, 0.3], [0.2, 0.2, 0.2], [0.6, 0.3, 0.1]])
    np.testing.assert_allclose(
        calibration.probabilities(scores, np.zeros(calibration.GRID_SIZE)),
        _every_map(scores).mean(axis=0),
        rtol=1e-12,
    )


def test_the_probabilities_are_the_posterior_mean_over_the_maps():
    rng = np.random.default_rng(SEED)
    scores = rng.normal(0.4, 0.5, (40, 3))
    for spread in (0.5, 5.0, 50.0):  # sums a few nats apart, and far apart (maps left out of the mixture)
        sums = rng.uniform(0.0, spread, calibration.GRID_SIZE) + 100.0
        w = np.exp(-sums)
        want = np.tensordot(w / w.sum(), _every_map(scores), axes=1)
        np.testing.assert_allclose(
            calibration.probabilities(scores, sums), want, rtol=1e-10, err_msg=f"seed={SEED} spread={spread}"
        )
    sums = np.full(calibration.GRID_SIZE, 10.0)
    sums[37] = 1.0
    assert calibration.describe(sums) == {
        "kappa": calibration.setting(37)[0],
        "temperature": round(calibration.setting(37)[1], 4),
        "weight": round(1 / (1 + 50 * np.exp(-9.0)), 4),
    }


def test_row_by_row_the_mixture_loses_at_most_log_grid_size_nats_to_the_best_map():
    """The Bayes mixture: predicting each row before its label is learned, Σ −log p(y) is −log of the maps' mean
    likelihood, −log (Σ_g exp(−S_g) / GRID_SIZE) (the chain rule), so at most min_g S_g + log GRID_SIZE; on scores
    whose best map is a sharp one (rows mostly right) and a soft one (labels noisy)."""
    rng = np.random.default_rng(SEED + 4)
    for noise in (0.05, 0.45):
        labels = rng.integers(0, 3, 300)
        scores = rng.uniform(0.0, 0.4, (300, 3))
        right = rng.random(300) > noise
        scores[np.arange(300), np.where(right, labels, (labels + 1) % 3)] += 0.5
        sums, total = np.zeros(calibration.GRID_SIZE), 0.0
        for i in range(300):
            total -= np.log(calibration.probabilities(scores[i : i + 1], sums)[0, labels[i]])
            sums += calibration.grid_losses(scores[i : i + 1], labels[i : i + 1])
        evidence = -np.log(np.mean(np.exp(-(sums - sums.min())))) + sums.min()
        np.testing.assert_allclose(total, evidence, rtol=1e-9, err_msg=f"seed={SEED + 4} noise={noise}")
        assert total <= sums.min() + np.log(calibration.GRID_SIZE), f"seed={SEED + 4} noise={noise}"


def test_an_overconfident_ensemble_is_softened_and_a_timid_one_sharpened():
    """Rows labelled as a coin would: the map learns T < 1 (softer); rows always right: T > 1."""
    rng = np.random.default_rng(SEED)
    scores = np.column_stack([np.full(400, 0.95), np.full(400, 0.05)])
    coin = rng.integers(0, 2, 400)
    soft = calibration.grid_losses(scores, coin)
    assert calibration.probabilities(scores[:1], soft)[0, 0] < 0.7, f"seed={SEED}"
    timid = np.column_stack([np.full(400, 0.6), np.full(400, 0.4)])
    sharp = calibration.grid_losses(timid, np.zeros(400, dtype=int))
    assert calibration.probabilities(timid[:1], sharp)[0, 0] > 0.95


def test_the_ensemble_score_is_the_mean_of_the_clipped_layer_outputs_and_bounds_an_outlier_layer():
    rng = np.random.default_rng(SEED)
    outputs = rng.normal(0.4, 0.8, (4, 30, 3))
    c = calibration.ensemble_scores(outputs)
    np.testing.assert_allclose(c, np.clip(outputs, calibration.FLOOR, 1.0).mean(axis=0), rtol=1e-15)
    wild = outputs.copy()
    wild[2] *= 1e6  # one layer overshoots: it moves each score by at most 1/L
    assert np.abs(calibration.ensemble_scores(wild) - c).max() <= 1.0 / 4 + 1e-12, f"seed={SEED}"


def test_the_class_decided_is_a_most_probable_class_under_every_map_and_their_mixture():
    rng = np.random.default_rng(SEED + 5)
    outputs = rng.normal(0.4, 0.8, (3, 200, 4))
    outputs[:, :20, 1:3] = 1.5  # every layer clipped alike on classes 1 and 2: a tie, broken by s̄
    outputs[0, :10, 2] = 2.0  # ... whose mean is higher for class 2 on the first 10 rows
    decided = calibration.decision(outputs)
    np.testing.assert_array_equal(decided[:10], 2)
    np.testing.assert_array_equal(decided[10:20], 1)
    scores = calibration.ensemble_scores(outputs)
    for index in rng.choice(calibration.GRID_SIZE, 12, replace=False):
        sums = np.full(calibration.GRID_SIZE, 1e3)
        sums[index] = 0.0
        for mixed in (sums, rng.uniform(0.0, 3.0, calibration.GRID_SIZE)):  # one map, and a mixture of all
            proba = calibration.probabilities(scores, mixed)
            np.testing.assert_array_equal(
                proba[np.arange(200), decided],
                proba.max(axis=1),
                err_msg=f"seed={SEED + 5} grid point {index}",
            )


def _numpy_scores_and_classes(outputs):
    """The NumPy form of ``ensemble_scores`` and ``decision`` (what their kernels must give, bit for bit)."""
    c = np.clip(outputs, calibration.FLOOR, 1.0).mean(axis=0)
    tied = c == c.max(axis=1, keepdims=True)
    return c, np.where(tied, outputs.mean(axis=0), -np.inf).argmax(axis=1)


@pytest.mark.parametrize("n_layers", [1, 4, 9])
def test_the_scores_and_classes_kernels_give_numpys_bits(n_layers):
    """``ensemble_scores`` and ``decision`` run as kernels (one pass each): the same bits as NumPy's clip, mean over
    the layers and tie-broken argmax, on rows with ties, outliers, infinities and NaN (a candidate's rows it did not
    predict), in any memory layout."""
    rng = np.random.default_rng(SEED + n_layers)
    outputs = rng.normal(0.4, 0.8, (n_layers, 300, 6)) * rng.choice([1.0, 1e-3, 1e4], (n_layers, 300, 1))
    outputs[:, :20, 1:3] = 1.5  # clipped alike: ties broken by the mean output
    outputs[0, 20:30, 4] = np.inf
    outputs[-1, 30:40, 0] = -np.inf
    outputs[:, 40:50, :] = np.nan  # not predicted
    outputs[0, 50:55, 3] = np.nan
    outputs[:, 60:70, :] = -3.0  # every class at the floor: all tied
    for layout in (
        outputs,
        np.ascontiguousarray(outputs.transpose(1, 0, 2)).transpose(1, 0, 2),
        outputs[:, ::2],
    ):
        expected_c, expected_class = _numpy_scores_and_classes(layout)
        c = calibration.ensemble_scores(layout)
        np.testing.assert_array_equal(
            c.view(np.int64), expected_c.view(np.int64), err_msg=f"seed={SEED + n_layers}"
        )
        np.testing.assert_array_equal(calibration.decision(layout), expected_class)
        np.testing.assert_array_equal(calibration.decision(layout, c), expected_class)


@pytest.mark.parametrize("mode", ["forward", "ridge", "auto"])
def test_proba_is_calibrated_on_the_emitted_predictions_and_restored_exactly(mode):
    x, y = stream(SEED + 1)
    model = EdRVFL(small(mode=mode))
    prev = None
    for start in range(0, 500, 50):
        if prev is not None:
            model.learn(prev[0].features_t, model.encode_labels(prev[1]), predicted=prev[0].predicted)
        pred = model.observe(x[start : start + 50])
        prev = (pred, y[start : start + 50])
        np.testing.assert_allclose(pred.proba.sum(axis=1), 1.0, rtol=1e-12)
        assert (pred.proba[np.arange(50), pred.index] == pred.proba.max(axis=1)).all()
    assert any(ln.calibration_sums.any() for ln in model.learners)
    restored = model_from_arrays(*model_to_arrays(model))
    for a, b in zip(model.learners, restored.learners):
        np.testing.assert_array_equal(a.calibration_sums, b.calibration_sums)
    np.testing.assert_array_equal(model.predict_batch(x[500:]).proba, restored.predict_batch(x[500:]).proba)


def test_calibration_sums_decay_with_forgetting_and_add_across_a_group():
    x, y = stream(SEED + 2)
    a = EdRVFL(small(mode="forward", forgetting=256.0))
    a.learn_rows(x[:100], y[:100])
    before = a.learner.calibration_sums.copy()
    a.observe(x[100:228])  # 128 rows seen: every data sum decays by 2^(−128/256)
    np.testing.assert_allclose(a.learner.calibration_sums, before * 2**-0.5, rtol=1e-12)
    b = EdRVFL(small(mode="forward", forgetting=256.0))
    sums = contribution.sums(a)
    contribution.add(b, sums)
    np.testing.assert_array_equal(b.learner.calibration_sums, a.learner.calibration_sums)
    np.testing.assert_array_equal(b.class_counts, a.class_counts)
    aged = contribution.decayed(b, sums, 256.0)
    np.testing.assert_allclose(aged["cal.sums"], sums["cal.sums"] / 2, rtol=1e-12)


def test_selection_loss_is_the_log_loss_of_the_calibrated_probabilities():
    x, y = stream(SEED + 3)
    model = EdRVFL(small(mode="auto"))
    model.learn_rows(x[:200], y[:200])
    outputs = model.learners[1].layer_outputs(model.features(x[200:260]))
    targets = model.encode_labels(y[200:260])
    proba, _, _ = model.combine(outputs, 1)
    want = -np.log(proba[np.arange(60), y[200:260]])
    np.testing.assert_allclose(model.selection_loss(outputs, targets, 1), want, rtol=1e-12)


# ------------------------------------------------------------------------------ class weights


def _offline(model, ln, x_all, observed, labelled, weights, stamps, clock, half_life):
    """The closed form, layer by layer: A = λI + Σ ωᵢ vᵢ dᵢdᵢᵀ, c = Σ ωᵢ wᵢ dᵢyᵢᵀ, ω the decay of row i, vᵢ = wᵢ if
    labelled else 1 (-F: every observed row's Gram is in A; -R: only labelled rows)."""
    features_t = model.features(x_all)
    m = model.config.m
    out = []
    for layer, ls in enumerate(ln.state.layers):
        d = features_t[layer].T
        decay = np.ones(len(x_all)) if half_life is None else 2.0 ** (-(clock - stamps) / half_life)
        in_a = np.where(labelled >= 0, weights, 1.0) * decay
        if ln.mode == "ridge":
            in_a = np.where(labelled >= 0, in_a, 0.0)
        in_a = np.where(observed, in_a, 0.0)
        a = ls.lam * np.eye(d.shape[1]) + (d * in_a[:, None]).T @ d
        onehot = np.zeros((len(x_all), m))
        onehot[labelled >= 0, labelled[labelled >= 0]] = 1.0
        c = (d * (np.where(labelled >= 0, weights, 0.0) * decay)[:, None]).T @ onehot
        out.append(np.linalg.solve(a, c))
    return out


@pytest.mark.parametrize(
    "mode,half_life,weight",
    [
        ("forward", None, {2: 5.0, 0: 0.5}),
        ("ridge", None, {2: 5.0, 0: 0.5}),
        ("auto", None, "balanced"),
        ("forward", 300.0, "balanced"),
        ("ridge", 300.0, {1: 3.0}),
    ],
)
def test_class_weights_give_the_offline_weighted_ridge(mode, half_life, weight):
    """Theorem 1 with row weights: after any stream (labels one batch late, the last batch never labelled) every
    candidate's β is the weighted ridge's, each labelled row at its class weight (balanced: from the class counts
    of the labels folded in so far, its own batch included), an unlabelled row at 1 under -F."""
    x, y = stream(SEED + 4, 450)
    model = EdRVFL(small(mode=mode, forgetting=half_life, class_weight=weight))
    b = 50
    labelled = np.full(len(x), -1)
    weights = np.ones(len(x))
    stamps = np.zeros(len(x))
    counts = np.zeros(3)
    prev = None
    for start in range(0, len(x), b):
        if prev is not None:
            pred, lo = prev
            yy = y[lo : lo + b]
            model.learn(
                pred.features_t, model.encode_labels(yy), predicted=pred.predicted, observed_at=pred.clock
            )
            counts += np.bincount(yy, minlength=3)
            labelled[lo : lo + b] = yy
            if weight == "balanced":
                weights[lo : lo + b] = (counts.sum() / (3 * np.maximum(counts, 1)))[yy]
            else:
                weights[lo : lo + b] = [weight.get(int(v), 1.0) for v in yy]
        pred = model.observe(x[start : start + b])
        stamps[start : start + b] = pred.clock
        prev = (pred, start)
    clock = model.learner.clock
    for j, ln in enumerate(model.learners):
        want = _offline(model, ln, x, np.ones(len(x), bool), labelled, weights, stamps, clock, half_life)
        for layer, ls in enumerate(ln.state.layers):
            np.testing.assert_allclose(
                ls.beta,
                want[layer],
                rtol=1e-7,
                atol=1e-9,
                err_msg=f"candidate {j} layer {layer} seed={SEED + 4}",
            )
    np.testing.assert_array_equal(model.class_counts, counts)


@pytest.mark.parametrize(
    "value,match",
    [
        ("heavy", "class_weight"),
        ({9: 2.0}, "class_weight"),
        ({0: -1.0}, "class_weight"),
        ([1.0, 2.0], "class_weight"),
    ],
)
def test_bad_class_weights_are_refused_naming_the_key(value, match):
    with pytest.raises(ValueError, match=match):
        small(class_weight=value)


def test_class_weights_are_stored_as_one_weight_per_class():
    assert small(class_weight={"2": 4}).class_weight == (1.0, 1.0, 4.0)
    assert small(class_weight=[1, 2, 3]).class_weight == (1.0, 2.0, 3.0)
    assert small(class_weight="none").class_weight is None
    with pytest.raises(ValueError, match="regression"):
        ModelConfig(n_inputs=K, class_weight="balanced")


# ------------------------------------------------------------------------------ threshold


def test_threshold_sets_the_class_from_the_second_class_probability():
    x, y = stream(SEED + 5)
    y = (y > 0).astype(int)
    model = EdRVFL(small(classes=("ok", "fraud"), threshold=0.2))
    model.learn_rows(x[:400], np.array(["ok", "fraud"])[y[:400]])
    pred = model.predict_batch(x[400:])
    np.testing.assert_array_equal(pred.index, (pred.proba[:, 1] >= 0.2).astype(int))
    assert pred.index.sum() > (pred.proba[:, 1] >= 0.5).sum()  # a lower threshold flags more rows
    for bad in (0.0, 1.0, "half", True):
        with pytest.raises(ValueError, match="threshold"):
            small(classes=("ok", "fraud"), threshold=bad)
    with pytest.raises(ValueError, match="threshold"):
        small(threshold=0.5)  # three classes
