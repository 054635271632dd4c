"""The edRVFL model: label coding, ensembles, configuration, scaling and regret (docs/design.md §1, §3, §4).

Seeds are fixed and printed in every assertion message.
"""

from __future__ import annotations

import naive
import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)

from iolstream.core import activation_kernels, regret
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.scaling import Scaler, ScalerNotReady
from iolstream.ops import process

K = 5


def small(**kwargs) -> ModelConfig:
    base = dict(n_inputs=K, n_nodes=16, n_layers=3, scaler="none", seed=0)
    return ModelConfig(**{**base, **kwargs})


def rows(seed: int, b: int, k: int = K):
    return np.random.default_rng(seed).standard_normal((b, k))


def state_copy(model: EdRVFL) -> dict:
    st = model.learner.state
    out = {k: v for k, v in vars(st).items() if k not in ("layers", "extra", "arrays")}
    for i, ls in enumerate(st.layers):  # β is read (solved if stale) before anything else is copied
        for k in (
            "beta",
            "gram",
            "rhs",
            "factor",
            "gram_labelled",
            "lam",
            "factor_kind",
            "loss_sum",
            "woodbury_steps",
        ):
            v = getattr(ls, k)
            out[f"{i}/{k}"] = v.copy() if isinstance(v, np.ndarray) else v
    out.update({f"scaler/{k}": v.copy() for k, v in model.scaler.to_state().items()})
    return out


def assert_same(a: dict, b: dict, msg: str):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert np.array_equal(a[key], b[key]), f"{msg}: {key}"
        else:
            assert a[key] == b[key], f"{msg}: {key}"


# --------------------------------------------------------------------------- labels


@pytest.mark.parametrize("classes", [(0, 1, 2), (3, -1, 7, 5), ("cat", "dog", "eel")])
def test_classification_one_hot_and_predictions(classes):
    seed = 1
    model = EdRVFL(small(classes=classes))
    m = len(classes)
    picks = np.random.default_rng(seed).integers(0, m, 40)
    y = [classes[i] for i in picks]
    onehot = model.encode_labels(y)
    np.testing.assert_array_equal(onehot, np.eye(m)[picks])
    np.testing.assert_array_equal(model.encode_labels(np.asarray(y)), onehot)  # NumPy scalars too
    x = rows(seed, 40)
    model.learn_rows(x, y)
    pred = model.predict_batch(x)
    assert pred.proba.shape == (40, m) and pred.index.shape == (40,) and pred.value is None
    assert pred.layer_outputs.shape == (3, 40, m) and pred.features_t.shape == (3, 16 + K + 1, 40)
    labels = model.predict(x)
    assert list(labels) == [classes[i] for i in pred.index] == pred.labels(classes)
    assert float(np.mean(labels == np.asarray(y))) > 0.6, f"fits its own training rows, seed={seed}"


@pytest.mark.parametrize("classes,unknown", [((0, 1, 2), 3), (("cat", "dog"), "cow")])
def test_unknown_class_is_named(classes, unknown):
    model = EdRVFL(small(classes=classes))
    with pytest.raises(ValueError, match=repr(unknown)):
        model.encode_labels([classes[0], unknown])


@pytest.mark.parametrize("m", [1, 3])
def test_regression_outputs(m):
    seed = 2
    rng = np.random.default_rng(seed)
    model = EdRVFL(small(n_outputs=m, n_nodes=32, lam=1e-3))
    x = rng.standard_normal((400, K))
    coef = rng.standard_normal((K, m))
    y = x @ coef  # linear: D = [H | X | 1] holds X itself
    model.learn_rows(x, y[:, 0] if m == 1 else y)
    pred = model.predict_batch(x[:50])
    assert pred.proba is None and pred.index is None and pred.value.shape == (50, m)
    assert pred.layer_outputs.shape == (3, 50, m)
    out = model.predict(x[:50])
    assert out.shape == ((50,) if m == 1 else (50, m))
    np.testing.assert_allclose(out.reshape(50, m), y[:50], atol=1e-2, err_msg=f"m={m} seed={seed}")
    np.testing.assert_array_equal(model.encode_labels(y), y)


# --------------------------------------------------------------------------- ensembles


def _trained(seed: int, **kwargs) -> tuple[EdRVFL, np.ndarray]:
    model = EdRVFL(small(n_layers=5, **kwargs))
    x = rows(seed, 60)
    if model.config.task == "classification":
        y = [model.config.classes[i] for i in np.random.default_rng(seed + 1).integers(0, model.config.m, 60)]
    else:
        y = np.random.default_rng(seed + 1).standard_normal((60, model.config.m))
    model.learn_rows(x, y)
    return model, rows(seed + 2, 30)


def test_softmax_ensemble_is_the_mean_of_layer_softmaxes():
    model, x = _trained(3, classes=(0, 1, 2, 3), calibration="none")
    pred = model.predict_batch(x)
    want = np.mean([naive.softmax(out) for out in pred.layer_outputs], axis=0)
    np.testing.assert_allclose(pred.proba, want, rtol=1e-12, err_msg="seed=3")
    np.testing.assert_allclose(pred.proba.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_array_equal(pred.index, want.argmax(axis=1))


def test_vote_ensemble():
    model, x = _trained(4, classes=("a", "b", "c"), ensemble="vote")
    pred = model.predict_batch(x)
    votes = pred.layer_outputs.argmax(axis=2)  # (L, b)
    want = np.stack([(votes == c).mean(axis=0) for c in range(3)], axis=1)
    np.testing.assert_allclose(pred.proba, want, rtol=1e-14, err_msg="seed=4")
    np.testing.assert_allclose(pred.proba.sum(axis=1), 1.0, rtol=1e-14)
    assert (pred.proba[np.arange(30), pred.index] == pred.proba.max(axis=1)).all()
    # a hand-made case: 5 layers vote 2, 0, 2, 1, 2 for row 0 and 1, 1, 0, 0, 1 for row 1
    outputs = np.zeros((5, 2, 3))
    for layer, (a, b) in enumerate([(2, 1), (0, 1), (2, 0), (1, 0), (2, 1)]):
        outputs[layer, 0, a] = outputs[layer, 1, b] = 1.0
    proba, index, value = model.combine(outputs)
    np.testing.assert_allclose(proba, [[0.2, 0.2, 0.6], [0.4, 0.6, 0.0]])
    assert index.tolist() == [2, 1] and value is None


@pytest.mark.parametrize("rule", ["mean", "median"])
def test_regression_ensembles(rule):
    model, x = _trained(5, n_outputs=2, ensemble=rule, target_scaler="none")  # the layers learn the 60 labels
    pred = model.predict_batch(x)
    outs = pred.layer_outputs
    want = np.median(outs, axis=0) if rule == "median" else outs.mean(axis=0)
    np.testing.assert_allclose(pred.value, want, rtol=1e-14, err_msg=f"{rule} seed=5")
    # a hand-made case with L = 5: the median is the middle value, not the mean
    layer_values = np.array([1.0, 100.0, -3.0, 2.0, 0.5]).reshape(5, 1, 1)
    _, _, value = model.combine(layer_values)
    assert value[0, 0] == (1.0 if rule == "median" else 20.1)


def test_default_ensembles():
    assert small(classes=(0, 1)).ensemble_rule == "softmax"
    assert small().ensemble_rule == "mean"


def test_softmax_probabilities_survive_huge_layer_outputs():
    model = EdRVFL(small(classes=(0, 1, 2), calibration="none"))
    outputs = np.array([[[1e6, -1e6, 0.0]], [[800.0, 0.0, 799.0]]])
    proba, index, _ = model.combine(outputs)
    assert np.isfinite(proba).all() and index.tolist() == [0]
    np.testing.assert_allclose(proba.sum(), 1.0)
    np.testing.assert_allclose(proba, np.mean([activation_kernels.softmax_rows(o) for o in outputs], axis=0))


# --------------------------------------------------------------------------- purity


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_predict_batch_is_pure_and_inputs_unchanged(mode):
    seed = 6
    model = EdRVFL(small(classes=(0, 1, 2), mode=mode, scaler="warmup", warmup_rows=20))
    x = rows(seed, 30)
    model.scaler.partial_fit(x)
    batch = model.observe(x)
    model.learn(batch.features_t, model.encode_labels([0, 1, 2] * 10), predicted=batch.layer_outputs)
    x_new = rows(seed + 1, 8)
    x_copy = x_new.copy()
    before = state_copy(model)
    first = model.predict_batch(x_new)
    second = model.predict_batch(x_new)
    model.predict(x_new)
    assert_same(before, state_copy(model), f"predict_batch, mode={mode}, seed={seed}")
    np.testing.assert_array_equal(first.layer_outputs, second.layer_outputs)
    np.testing.assert_array_equal(first.proba, second.proba)
    assert first.version == second.version == model.learner.state.version
    np.testing.assert_array_equal(x_new, x_copy)
    y = model.encode_labels([1] * 8)
    y_copy, f_copy = y.copy(), first.features_t.copy()
    model.observe(x_new)
    model.learn(first.features_t, y)
    np.testing.assert_array_equal(x_new, x_copy)
    np.testing.assert_array_equal(y, y_copy)
    np.testing.assert_array_equal(first.features_t, f_copy)


# --------------------------------------------------------------------------- one way to learn


@pytest.mark.parametrize("classes", [(0, 1, 2), None])
def test_learn_a_prediction_is_the_low_level_learn_of_its_parts(classes):
    """learn(prediction, y) is learn(features_t, encode_labels(y), predicted=Prediction.predicted,
    observed_at=Prediction.clock): the same sums, losses and selector, bitwise (mode auto, forgetting auto)."""
    seed = 11
    target_scaler = "warmup" if classes else "none"  # regression: no labels held for the target scaling
    cfg = small(
        classes=classes, n_outputs=2, forgetting="auto", scoring_share="all", target_scaler=target_scaler
    )
    pair, parts = EdRVFL(cfg), EdRVFL(cfg)
    rng = np.random.default_rng(seed)
    for t in range(6):
        x = rows(seed + t, 20)
        y = rng.integers(0, 3, 20) if classes else rng.standard_normal((20, 2))
        p_pair, p_parts = pair.observe(x), parts.observe(x)
        got = pair.learn(p_pair, y)
        want = parts.learn(
            p_parts.features_t, parts.encode_labels(y), predicted=p_parts.predicted, observed_at=p_parts.clock
        )
        np.testing.assert_array_equal(got, want, err_msg=f"seed={seed} t={t}")
    pair.sync_candidates()
    parts.sync_candidates()
    for j, (a, b) in enumerate(zip(pair.learners, parts.learners)):
        for la, lb in zip(a.state.layers, b.state.layers):
            np.testing.assert_array_equal(la.beta, lb.beta, err_msg=f"seed={seed} candidate {j}")
    np.testing.assert_array_equal(pair.selector.recent(), parts.selector.recent())
    assert pair.effective == parts.effective


def test_learn_refuses_one_candidates_outputs_where_every_candidates_are_needed():
    """With several candidates, the outputs of the one in force (Prediction.layer_outputs) would make learn
    recompute every other candidate's, past the scoring budget: refused, naming what to pass, and nothing changes."""
    model = EdRVFL(small(classes=(0, 1, 2)))  # mode auto: -F and -R
    assert len(model.learners) == 2
    p = model.observe(rows(3, 20))
    before = state_copy(model)
    with pytest.raises(ValueError, match=r"Prediction\.predicted.*scoring budget"):
        model.learn(p.features_t, model.encode_labels([0, 1] * 10), predicted=p.layer_outputs)
    assert_same(before, state_copy(model), "refused learn")
    model.learn(p, [0, 1] * 10)  # the pair, and the low-level form with every candidate's outputs, are taken
    q = model.observe(rows(4, 20))
    model.learn(q.features_t, model.encode_labels([2, 1] * 10), predicted=q.predicted, observed_at=q.clock)
    one = EdRVFL(
        small(classes=(0, 1, 2), mode="forward")
    )  # one learner: its layer outputs are every candidate's
    r = one.observe(rows(3, 20))
    one.learn(r.features_t, one.encode_labels([0, 1] * 10), predicted=r.layer_outputs)


def test_a_model_of_fixed_settings_steps_as_its_one_learner_alone():
    """Fixed settings: the model's learners are a set of one (``core.candidate_set.OneCandidate``). Every batch is
    the learner's own fused step and every label its own ``learn``, bitwise what the bare learner does with the same
    rows, and nothing of a choice between candidates is kept or paid for (no scoring, no selector sums)."""
    import copy

    seed = 12
    model = EdRVFL(small(classes=(0, 1, 2), mode="forward"))
    bare = copy.deepcopy(model.learner)
    rng = np.random.default_rng(seed)
    for t in range(4):
        x, y = rows(seed + t, 20), rng.integers(0, 3, 20)
        p = model.observe(x)
        features_t, outputs = bare.observe_rows(model.network, x)
        assert p.candidate_outputs is None and p.predicted is p.layer_outputs
        np.testing.assert_array_equal(p.layer_outputs, outputs, err_msg=f"seed={seed} t={t}")
        got = model.learn(p, y)
        want = bare.learn(features_t, np.eye(3)[y], predicted=outputs, observed_at=bare.clock)
        np.testing.assert_array_equal(got, want, err_msg=f"seed={seed} t={t}")
    for la, lb in zip(model.learner.state.layers, bare.state.layers):
        np.testing.assert_array_equal(la.beta, lb.beta, err_msg=f"seed={seed}")
    assert model.version == bare.version
    assert model.scoring.rows == 0 and model.selector.rows == 0 and not model.selector.loss.any()
    assert not model.emitted_loss.any() and not model.predicted_rows.any()
    assert set(model.effective) == {"lam", "forgetting", "mode"}


@pytest.mark.parametrize(
    "classes,y,expected",
    [
        ((0, 1, 2), np.zeros((20, 3)), r"y: \(20,\) class labels .* got shape \(20, 3\)"),
        ((0, 1, 2), [0, 1] * 5, r"y: \(20,\) class labels .* got shape \(10,\)"),
        (None, np.zeros((20, 3)), r"y: \(20, 2\) values .* got shape \(20, 3\)"),
    ],
)
def test_learn_a_prediction_names_labels_that_do_not_fit_it(classes, y, expected):
    model = EdRVFL(small(classes=classes, n_outputs=2))
    p = model.observe(rows(5, 20))
    with pytest.raises(ValueError, match=expected):
        model.learn(p, y)
    with pytest.raises(TypeError, match="the prediction carries"):
        model.learn(p, [0] * 20, observed_at=p.clock)


# --------------------------------------------------------------------------- configuration

BAD_CONFIGS = [
    ("n_inputs", dict(n_inputs=0)),
    ("n_inputs", dict(n_inputs=2.5)),
    ("n_inputs", dict(n_inputs="5")),
    ("classes", dict(classes=(1,))),
    ("classes", dict(classes=("a", "b", "a"))),
    ("n_outputs", dict(n_outputs=0)),
    ("n_nodes", dict(n_nodes=0)),
    ("n_nodes", dict(n_nodes=16.0)),
    ("n_layers", dict(n_layers=-1)),
    ("refactor_every", dict(refactor_every=0)),
    ("warmup_rows", dict(warmup_rows=0)),
    ("warmup_rows", dict(scaler="warmup", warmup_rows=1)),
    ("lam", dict(lam=0.0)),
    ("lam", dict(lam=-1.0)),
    ("lam", dict(lam=float("inf"))),
    ("lam", dict(lam=(1.0, 2.0))),  # 3 layers
    ("lam", dict(lam=(1.0, float("nan"), 1.0))),
    ("lam", dict(lam="big")),
    ("lam", dict(lam=None)),
    ("seed", dict(seed=-1)),
    ("seed", dict(seed="0")),
    ("activation", dict(activation="gelu")),
    ("init", dict(init="orthogonal")),
    ("mode", dict(mode="backward")),
    ("solver", dict(solver="qr")),
    ("dtype", dict(dtype="float16")),
    ("scaler", dict(scaler="minmax")),
    ("scaler_mean", dict(scaler="fixed")),
    ("scaler_mean", dict(scaler="fixed", scaler_mean=(0.0,) * 4, scaler_std=(1.0,) * K)),
    ("scaler_std", dict(scaler="fixed", scaler_mean=(0.0,) * K, scaler_std=(1.0,) * (K - 1) + (0.0,))),
    ("scaler_std", dict(scaler="fixed", scaler_mean=(0.0,) * K, scaler_std=None)),
    ("ensemble", dict(ensemble="vote")),  # regression
    ("ensemble", dict(classes=(0, 1), ensemble="median")),
    ("bias_column", dict(bias_column="no")),
    ("track_regret", dict(track_regret=1)),
]


@pytest.mark.parametrize("key,kwargs", BAD_CONFIGS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD_CONFIGS)])
def test_config_errors_name_the_key(key, kwargs):
    with pytest.raises(ValueError, match=rf"^model\.{key}:"):
        small(**kwargs)


def test_good_configs_are_stored_as_given():
    cfg = small(
        classes=["x", "y"], lam=[0.5, 1, 2], scaler="fixed", scaler_mean=[0.0] * K, scaler_std=[2.0] * K
    )
    assert (
        cfg.classes == ("x", "y")
        and cfg.lam == (0.5, 1.0, 2.0)
        and cfg.m == 2
        and cfg.task == "classification"
    )
    assert small(n_outputs=3).m == 3 and small().task == "regression"
    assert cfg.to_dict()["scaler_mean"] == [0.0] * K


def test_per_layer_lam_reaches_the_layers():
    model = EdRVFL(small(lam=(0.5, 1.0, 2.0)))
    assert [ls.lam for ls in model.learner.state.layers] == [0.5, 1.0, 2.0]
    n = model.network.n_columns
    for ls, lam in zip(model.learner.state.layers, (0.5, 1.0, 2.0)):
        np.testing.assert_array_equal(np.tril(ls.gram), lam * np.eye(n))


# --------------------------------------------------------------------------- scaling


def test_fixed_scaler():
    mean, std = np.arange(K, dtype=float), np.linspace(0.5, 3, K)
    model = EdRVFL(small(scaler="fixed", scaler_mean=tuple(mean), scaler_std=tuple(std)))
    x = rows(7, 10)
    assert model.ready
    np.testing.assert_allclose(model.scaler.transform(x), (x - mean) / std, rtol=1e-15)
    np.testing.assert_array_equal(model.features(x), model.network.features((x - mean) / std))


def test_no_scaler():
    model = EdRVFL(small(scaler="none"))
    x = rows(8, 10)
    assert model.ready
    model.scaler.partial_fit(x)  # a no-op
    np.testing.assert_array_equal(model.scaler.transform(x), x)
    np.testing.assert_array_equal(model.features(x), model.network.features(x))


@pytest.mark.parametrize("sizes", [[256], [100, 100, 100], [1] * 5 + [300], [255, 2]])
def test_warmup_scaler_freezes_on_the_first_w_rows(sizes):
    """Estimated from exactly the first W = 256 rows whatever the batch boundaries; frozen after."""
    seed = 9
    x = np.random.default_rng(seed).standard_normal((sum(sizes), K)) * [1, 2, 3, 4, 5] + [0, 1e3, -5, 0, 7]
    x[:, 3] = 4.25  # a zero-spread column: centred, not divided by zero
    model = EdRVFL(small(scaler="warmup", warmup_rows=256))
    assert not model.ready
    with pytest.raises(ScalerNotReady):
        model.features(x[:3])
    start = 0
    for b in sizes:
        if model.ready:
            break
        assert model.scaler.rows_needed == 256 - start
        model.scaler.partial_fit(x[start : start + b])
        start += b
    assert model.ready and model.scaler.rows_needed == 0 and model.scaler.count == 256, f"sizes={sizes}"
    head = x[:256]
    std = head.std(axis=0, ddof=1)
    std[3] = 1.0
    np.testing.assert_allclose(
        model.scaler.mean, head.mean(axis=0), rtol=1e-12, err_msg=f"sizes={sizes} seed={seed}"
    )
    np.testing.assert_allclose(model.scaler.scale, std, rtol=1e-10, err_msg=f"sizes={sizes} seed={seed}")
    z = model.scaler.transform(head)
    assert np.isfinite(z).all() and (z[:, 3] == 0).all()
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-9)
    frozen = model.scaler.to_state()
    model.scaler.partial_fit(rows(seed + 1, 50) * 100)  # frozen: nothing changes any more
    assert_same(frozen, model.scaler.to_state(), f"scaler changed after freezing, sizes={sizes}")
    assert np.isfinite(model.features(x[:5])).all()


@pytest.mark.parametrize("sizes", [[8], [4, 4], [3, 5], [1, 1, 6]])
def test_target_scaling_is_the_first_w_labels_wherever_the_label_batches_end(sizes):
    """As the input scaler: label batches cut elsewhere (a replay after a restart) freeze the same scaling."""
    x = rows(3, 8)
    y = np.arange(8.0) ** 2
    model = EdRVFL(small(scaler="none", classes=None, n_outputs=1, warmup_rows=4))
    start = 0
    for b in sizes:
        model.learn_rows(x[start : start + b], y[start : start + b])
        start += b
    assert model.targets.frozen, f"sizes={sizes}"
    np.testing.assert_allclose(model.targets.mean, [y[:4].mean()], rtol=1e-15)
    np.testing.assert_allclose(model.targets.std, [y[:4].std(ddof=1)], rtol=1e-15)


def test_before_the_target_scaling_a_regression_predicts_the_labels_mean_so_far():
    """Until warmup_rows labels are in, every label waits and the layers know none: a prediction is the mean of
    the labels held so far (0 before the first), not the 0 of the untouched layers mapped back (a house priced
    at $0 for its first 512 rows), with no interval; the first after the scaling is the model's own."""
    rng = np.random.default_rng(2)
    model = EdRVFL(small(scaler="none", classes=None, n_outputs=2, warmup_rows=24, interval=0.9))
    assert (model.observe(rng.standard_normal((8, K))).value == 0).all()
    seen = []
    for _ in range(2):
        x = rng.standard_normal((8, K))
        p = model.observe(x)
        y = np.c_[1000 + 10 * x[:, 0], -5 + x[:, 1]]
        model.learn(p.features_t, y, predicted=p.predicted, observed_at=p.clock)
        seen.append(y)
        after = model.observe(rng.standard_normal((5, K)))
        np.testing.assert_allclose(
            after.value, np.tile(np.concatenate(seen).mean(axis=0), (5, 1)), rtol=1e-12
        )
        assert after.interval is None or np.isnan(after.interval[0]).all()
    x = rng.standard_normal((8, K))
    p = model.observe(x)
    model.learn(p.features_t, np.c_[1000 + 10 * x[:, 0], -5 + x[:, 1]], predicted=p.predicted)
    assert model.targets.frozen
    value = model.observe(rng.standard_normal((5, K))).value
    assert np.ptp(value[:, 0]) > 1  # the layers' own now, row by row


def test_one_output_regression_targets_of_shape_b_are_one_column():
    """``predict`` gives (b,) for one output, and users pass labels back the same way: learned as (b, 1), the
    same β and the same choice among the auto candidates (the row losses must not broadcast to (b, b))."""
    models = [
        EdRVFL(small(scaler="none", classes=None, n_outputs=1, lam="auto", warmup_rows=32)) for _ in range(2)
    ]
    rng = np.random.default_rng(0)
    for _ in range(30):
        x = rng.standard_normal((16, K))
        y = 3 * x[:, 0] + 1
        for model, targets in zip(models, (y, y[:, None])):
            p = model.observe(x)
            model.learn(p.features_t, targets, predicted=p.predicted, observed_at=p.clock)
    one, two = models
    assert one.targets.mean.shape == (1,)
    np.testing.assert_array_equal(one.selector.loss, two.selector.loss)
    assert one.selector.chosen == two.selector.chosen
    np.testing.assert_array_equal(one.learner.state.layers[0].beta, two.learner.state.layers[0].beta)


def test_warmup_scaler_explicit_freeze_and_errors():
    s = Scaler("warmup", 2, warmup_rows=10)
    s.partial_fit(np.ones((1, 2)))
    with pytest.raises(ScalerNotReady):
        s.freeze()  # needs 2 rows
    s.partial_fit(np.array([[3.0, 1.0]]))
    s.freeze()
    np.testing.assert_allclose(s.mean, [2.0, 1.0])
    np.testing.assert_allclose(s.scale, [np.sqrt(2.0), 1.0])
    with pytest.raises(ValueError, match="mean and std"):
        Scaler("fixed", 2)


# --------------------------------------------------------------------------- regret


def _stream_with_regret(mode: str, seed: int, classification: bool, lam=(0.5, 1.0, 2.0)):
    """-F: observe, then labels two batches late with the predictions made at observe time.
    -R: predict with the β in force, then learn. Returns the model and the stored stream."""
    rng = np.random.default_rng(seed)
    kwargs = (
        dict(classes=(0, 1, 2)) if classification else dict(n_outputs=2, target_scaler="none")
    )  # regret in the units of the raw targets
    model = EdRVFL(small(mode=mode, lam=lam, **kwargs))
    stored = []  # (features_t, Y, [β_l used for the prediction])
    pending = []
    for _ in range(14):
        b = int(rng.integers(1, 12))
        x = rng.standard_normal((b, K))
        y = model.one_hot(rng.integers(0, 3, b)) if classification else rng.standard_normal((b, 2))
        pred = model.observe(x) if mode == "forward" else model.predict_batch(x)
        betas = [ls.beta.copy() for ls in model.learner.state.layers]
        pending.append((pred, y, betas))
        if mode == "ridge" or len(pending) > 2:
            pred, y, betas = pending.pop(0)
            model.learn(pred.features_t, y, predicted=pred.layer_outputs)
            stored.append((pred.features_t, y, betas))
    return model, stored


@pytest.mark.parametrize("classification", [True, False])
@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_regret_equals_brute_force(mode, classification):
    seed = 10
    lam = (0.5, 1.0, 2.0)
    model, stored = _stream_with_regret(mode, seed, classification, lam)
    report = model.regret()
    for layer in range(3):
        msg = f"mode={mode} classification={classification} layer {layer} seed={seed}"
        ds = [f[layer].T for f, _, _ in stored]
        ys = [y for _, y, _ in stored]
        losses = sum(0.5 * float(((d @ betas[layer] - y) ** 2).sum()) for d, (_, y, betas) in zip(ds, stored))
        expert = naive.expert_objective(ds, ys, lam[layer])
        np.testing.assert_allclose(report.cumulative_loss[layer], losses, rtol=1e-10, err_msg=msg)
        np.testing.assert_allclose(report.expert_loss[layer], expert, rtol=1e-9, err_msg=msg)
        np.testing.assert_allclose(
            report.cumulative_regret[layer], losses - expert, rtol=1e-9, atol=1e-9 * losses, err_msg=msg
        )
    assert np.isfinite(report.bound) and report.bound >= 0
    assert np.isfinite(report.mean_regret)
    st = model.learner.state
    # The reported bound holds for every layer: the largest of the per-layer bounds (smallest λ_l).
    bound_fn = regret.bound_forward if mode == "forward" else regret.bound_ridge
    per_layer = [
        bound_fn(st.y_max, st.max_label_batch, 16 + K, st.label_batches, st.d_max, lam_l) for lam_l in lam
    ]
    assert report.bound == max(per_layer), f"{report.bound} vs per layer {per_layer}"
    assert (report.cumulative_regret <= np.array(per_layer)).all(), f"Theorems 4–5 violated? seed={seed}"
    assert st.label_batches == len(stored) and st.rows_labelled == sum(y.shape[0] for _, y, _ in stored)
    d_max = max(float(np.abs(f).max()) for f, _, _ in stored)
    assert st.d_max == d_max


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_regret_bound_edge_cases(mode):
    model = EdRVFL(small(mode=mode, n_outputs=1))
    report = model.regret()  # nothing labelled yet
    assert report.bound == 0.0
    np.testing.assert_array_equal(report.cumulative_regret, 0.0)
    model.learn_rows(rows(11, 1), [0.5])  # T = 1, b = 1
    report = model.regret()
    assert np.isfinite(report.bound) and report.bound >= 0 and np.isfinite(report.cumulative_regret).all()


def test_regret_without_tracking_is_unknown_for_forward():
    model = EdRVFL(small(track_regret=False, n_outputs=1, mode="forward"))
    batch = model.observe(rows(12, 6))
    model.learn(batch.features_t, np.ones((6, 1)), predicted=batch.layer_outputs)
    report = model.regret()
    assert np.isnan(report.expert_loss).all() and np.isfinite(report.cumulative_loss).all()


# --------------------------------------------------------------------------- parallel steps and the tuner


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_parallel_steps_equal_serial_steps_bitwise(dtype):
    """A model whose tuner picked the parallel kernels predicts and learns the same bits."""
    seed = 21
    serial, parallel = EdRVFL(small(dtype=dtype, n_outputs=3)), EdRVFL(small(dtype=dtype, n_outputs=3))
    parallel.learner.parallel = True
    rng = np.random.default_rng(seed)
    pending = []
    for b in (64, 40, 1, 100, 64):
        x, y = rng.standard_normal((b, K)), rng.standard_normal((b, 3))
        preds = [model.observe(x) for model in (serial, parallel)]
        assert np.array_equal(preds[0].features_t, preds[1].features_t), f"b={b} features, seed={seed}"
        assert np.array_equal(preds[0].value, preds[1].value), f"b={b} predictions, seed={seed}"
        pending.append((preds, y))
        if len(pending) > 1:
            (p_serial, p_parallel), y_old = pending.pop(0)
            serial.learn(p_serial.features_t, y_old, predicted=p_serial.predicted)
            parallel.learn(p_parallel.features_t, y_old, predicted=p_parallel.predicted)
    assert_same(state_copy(serial), state_copy(parallel), f"{dtype} seed={seed}")


def test_step_settings_by_size_and_cores():
    from iolstream.core.blas_pools import SINGLE_THREAD_BELOW_COLUMNS
    from iolstream.core.step_tuner import StepSetting, step_settings

    assert step_settings(139, cores=1) == [StepSetting(1, False)]
    assert step_settings(139, cores=2) == [
        StepSetting(1, False),
        StepSetting(1, True),
    ]  # small: BLAS stays single
    large = step_settings(SINGLE_THREAD_BELOW_COLUMNS, cores=2)
    assert large == [StepSetting(1, False), StepSetting(1, True), StepSetting(2, False)]


def test_step_tuner_runs_the_fastest_and_retries_the_others():
    """Each setting is timed first (on its second step: the first after a switch is not timed);
    then the cheapest runs, and a loser is retried (1 + TRIAL_STEPS steps) after 8, 16, 32 … steps,
    doubling each time it loses again; when it wins, it takes over."""
    from iolstream.core.step_tuner import TRIAL_STEPS, StepSetting, StepTuner

    settings = [StepSetting(1, False), StepSetting(1, True), StepSetting(2, False)]
    seconds = {settings[0]: 2.0, settings[1]: 1.0, settings[2]: 10.0}
    tuner = StepTuner(settings, period=8, max_period=64)
    tuner._lib = False  # do not touch the process's BLAS threads in a test
    chosen = []
    for _ in range(400):
        setting = tuner.choose()
        chosen.append(setting)
        tuner.record(setting, seconds[setting], rows=1)
    assert chosen[:6] == [settings[0]] * 2 + [settings[1]] * 2 + [settings[2]] * 2
    retries = [i for i in range(6, 400) if chosen[i] != chosen[i - 1] and chosen[i] != settings[1]]
    assert len(retries) <= 2 * 5 + 2 * (400 // 64), retries  # backed off to one retry per 64 steps each
    assert {chosen[i] for i in retries} == {settings[0], settings[2]}  # both losers are retried
    assert chosen[-64:].count(settings[1]) >= 64 - 2 * (1 + TRIAL_STEPS)
    seconds[settings[2]] = 0.1  # the neighbour left: the BLAS threads now win
    for _ in range(200):
        setting = tuner.choose()
        tuner.record(setting, seconds[setting], rows=1)
    assert min(tuner.cost, key=tuner.cost.get) == settings[2]
    assert tuner.choose() == settings[2] or tuner._trial is not None


def test_a_retry_is_not_lost_to_one_stalled_step():
    """The faster setting, retried after it lost to a slowdown, takes over again although one of its
    trial steps stalled (another process held the core: 10× as long): the median of its timed steps
    decides, not their mean. Two stalls in a row are a slowdown, and it stays the loser."""
    from iolstream.core.step_tuner import TRIAL_STEPS, StepSetting, StepTuner

    serial, parallel = StepSetting(1, False), StepSetting(1, True)
    for stalls, parallel_wins in ((1, True), (2, False)):
        tuner = StepTuner([serial, parallel], period=8, max_period=64)
        tuner._lib = False
        tuner.cost = {serial: 2.0, parallel: 5.0}  # parallel lost to a slowdown that has passed
        tuner._due[parallel] = 0  # and its retry is due
        seconds = [1.0] + [10.0] * stalls + [1.0] * (TRIAL_STEPS - stalls)  # the first step is not timed
        for step_seconds in seconds:
            setting = tuner.choose()
            assert setting == parallel
            tuner.record(setting, step_seconds, rows=1)
        assert tuner._trial is None  # decided
        assert (min(tuner.cost, key=tuner.cost.get) == parallel) == parallel_wins


@pytest.mark.parametrize("parallel_wins", [False, True])
def test_step_tuner_live_runs_short_steps_serially_and_never_retries(parallel_wins):
    """A worker keeping up with a live stream sets ``explore`` False: no retry of a loser stalls
    the stream, and a step shorter than ``live_serial_seconds`` serially runs serially even when
    both cores were faster (a parallel region waits for a thread another process parked); a long
    step still takes the fastest setting. With a backlog again the tuner times and retries."""
    from iolstream.core.step_tuner import StepSetting, StepTuner

    serial, parallel = StepSetting(1, False), StepSetting(1, True)
    per_row = {serial: 2e-6, parallel: 1e-6 if parallel_wins else 2e-5}
    tuner = StepTuner([serial, parallel], period=8, max_period=64)
    tuner._lib = False
    chosen = []
    for i in range(400):
        tuner.explore = i < 4 or i >= 300  # the first timings are taken anyway
        rows = 256 if i < 200 or i >= 300 else 20_000  # 0.5 ms steps, then 40 ms ones
        setting = tuner.choose()
        chosen.append(setting)
        tuner.record(setting, per_row[setting] * rows, rows=rows)
    assert chosen[:4] == [serial] * 2 + [parallel] * 2
    assert chosen[4:201] == [serial] * 197  # live, short steps: serial, no retry
    assert chosen[202:300] == [parallel if parallel_wins else serial] * 98  # live, long steps: the fastest
    assert parallel in chosen[300:]  # a backlog again: timed and retried


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, {"GOMP_SPINCOUNT": "3000"}),
        ({"GOMP_SPINCOUNT": "77"}, {"GOMP_SPINCOUNT": "77"}),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}),
    ],
)
def test_worker_omp_spin_is_short_unless_the_user_chose(environ, expected):

    env = dict(environ)
    set_to = process.configure_worker_threads(env)
    assert env == expected and set_to == (None if environ else "3000")


def test_the_run_command_shortens_the_omp_spin_before_any_parallel_kernel(tmp_path):
    """In a fresh process, `iolstream run` sets GOMP_SPINCOUNT before libgomp loads (it reads it then):
    the worker's first kernels (Worker._open) come later. Checked by stopping at Worker()."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from iolstream.tools import cli\nfrom iolstream.kafka import diagnose, worker\n"
        "diagnose.wait_for_broker = lambda *a, **k: 'up'  # no broker: the start-up wait would exit 3\n"
        "class Stop(Exception): pass\n"
        "def stop(*a, **k):\n"
        "    import numba.np.ufunc.parallel as p\n"
        "    print(os.environ.get('GOMP_SPINCOUNT'), p._is_initialized)\n"
        "    raise Stop\n"
        "worker.Worker.__init__ = stop\n"
        "try:\n"
        "    cli.main(['run', '-c', sys.argv[1]])\n"
        "except Stop:\n"
        "    pass\n"
    )
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        "model: {n_inputs: 2, classes: [a, b]}\nkafka: {bootstrap_servers: '127.0.0.1:1'}\nmetrics: {port: 0}\n"
    )
    env = {
        k: v for k, v in __import__("os").environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
    }
    out = subprocess.run(
        [sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.stdout.split() == ["3000", "False"], out.stderr


def test_freezing_the_start_up_objects_collects_garbage_first_and_still_collects_later():
    """process.freeze_startup_objects (fresh process: gc.freeze is process-wide): cyclic garbage made
    before is collected, not frozen; live objects are frozen; cycles made after are collected as usual."""
    import subprocess
    import sys

    code = (
        "import gc, weakref\n"
        "from iolstream.ops import process\n"
        "class Node: pass\n"
        "def cycle():\n"
        "    a, b = Node(), Node(); a.b, b.a = b, a\n"
        "    return weakref.ref(a)\n"
        "gc.disable()\n"
        "before, kept = cycle(), Node()\n"
        "frozen = process.freeze_startup_objects()\n"
        "after = cycle()\n"
        "print(before() is None, frozen > 1000, frozen == gc.get_freeze_count(), after() is None)\n"
        "gc.collect()\n"
        "print(after() is None, len(gc.get_objects(generation=2)) < 100)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "True", "False", "True", "True"], out.stderr


def test_the_run_command_freezes_the_start_up_objects_once_the_kernels_are_loaded(tmp_path):
    """`iolstream run` freezes for the garbage collector after Worker._open (kernels loaded, clients up),
    before the first poll; a Worker run in-process (tests) does not. Checked by stopping at the first poll."""
    import subprocess
    import sys

    code = (
        "import gc, sys\n"
        "from iolstream.tools import cli\nfrom iolstream.kafka import diagnose, worker\n"
        "diagnose.wait_for_broker = lambda *a, **k: 'up'  # no broker: the start-up wait would exit 3\n"
        "class Stop(Exception): pass\n"
        "opened = []\n"
        "def fake_open(self):\n"
        "    opened.append(gc.get_freeze_count())\n"
        "def first_poll(self):\n"
        "    print(opened[0], gc.get_freeze_count() > 1000)\n"
        "    raise Stop\n"
        "worker.Worker._open = fake_open\n"
        "worker.Worker._cycle = first_poll\n"
        "try:\n"
        "    cli.main(['run', '-c', sys.argv[1]])\n"
        "except Stop:\n"
        "    pass\n"
    )
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        f"model: {{n_inputs: 2, classes: [a, b]}}\nkafka: {{bootstrap_servers: '127.0.0.1:1'}}\n"
        f"metrics: {{port: 0}}\nsnapshot: {{dir: '{tmp_path / 'snap'}'}}\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "True"], out.stderr
