"""Tests for iolstream.tools.evaluate (the protocol, as a pure function) and iolstream.tools.baselines."""

import json
import math

import numpy as np
import pytest

from iolstream.tools.baselines import RiverLearner
from iolstream.tools.builtin_datasets import DataError, Dataset, load
from iolstream.tools.protocol import (
    EdRVFLLearner,
    Protocol,
    evaluate,
    make_split,
    model_config,
    run_protocol,
    time_points,
)

SMALL = {"n_nodes": 32, "n_layers": 2}
JSON_KEYS = {
    "name",
    "metric",
    "test_metric",
    "prequential_metric",
    "cumulative_regret",
    "regret_bound",
    "rows_per_second",
    "seconds",
    "curve",
}


def toy(n_rows=400, seed=1) -> Dataset:
    """Three linearly separable-ish classes in 5 features."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, 5))
    y = np.argmax(x @ rng.standard_normal((5, 3)) + 0.3 * rng.standard_normal((n_rows, 3)), axis=1)
    return Dataset(
        "toy",
        np.ascontiguousarray(x),
        y,
        "classification",
        (0, 1, 2),
        tuple(f"f{i}" for i in range(5)),
        "toy",
    )


def toy_regression(n_rows=300, seed=2) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, 4))
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.standard_normal(n_rows)
    return Dataset(
        "toyreg", np.ascontiguousarray(x), y, "regression", None, ("a", "b", "c", "d"), "toy regression"
    )


@pytest.fixture(scope="module")
def both():
    return evaluate(toy(), model=SMALL, protocol=Protocol(batch=10, label_delay=1, seed=0))


# --------------------------------------------------------------------------- protocol


def test_counts_and_curve(both):
    forward, ridge = both
    assert (forward.name, ridge.name) == ("edRVFL-F", "edRVFL-R")
    for r in both:
        assert (r.rows, r.test_rows, r.batch, r.batches) == (320, 80, 10, 32)
        assert r.metric == "accuracy" and r.label_delay == 1
        assert r.batch_prequential.shape == r.batch_loss.shape == (32,)
        assert not np.isnan(r.batch_loss).any(), "every batch's labels must arrive by the end"
        ts = [t for t, _ in r.curve]
        assert ts == sorted(set(ts)) and ts[0] == 1 and ts[-1] == 32
        assert r.curve_rows == sorted(r.curve_rows) and r.curve_rows[-1] == 320
        assert 0.0 <= r.prequential_metric <= 1.0 and r.test_metric > 0.85
        assert r.cumulative_regret is not None and r.regret_bound > 0
        assert r.rows_per_second > 0 and r.seconds > 0
        # The prequential metric is the row-weighted mean of the per-batch ones (all batches are full here).
        assert r.prequential_metric == pytest.approx(r.batch_prequential.mean())


def test_first_point_is_the_untrained_model(both):
    # After batch 1 no label has arrived (delay 1): β = 0 in both modes, the same constant prediction.
    assert both[0].curve[0] == both[1].curve[0]


def test_forward_and_ridge_end_equal_but_stream_differently(both):
    forward, ridge = both
    # Theorem 1: once every label is in, -F and -R hold the same sums, hence the same β.
    assert forward.test_metric == pytest.approx(ridge.test_metric, abs=1e-12)
    assert forward.curve[-1][1] == pytest.approx(ridge.curve[-1][1], abs=1e-12)
    # ... but each batch was predicted with a different β.
    assert forward.prequential_metric != ridge.prequential_metric
    assert not np.allclose(forward.batch_loss, ridge.batch_loss)
    assert forward.cumulative_regret != pytest.approx(ridge.cumulative_regret)


@pytest.mark.parametrize("batch, delay", [(7, 1), (25, 1), (10, 4), (0.05, 2)])
def test_final_model_depends_on_neither_batching_nor_delay(both, batch, delay):
    (result,) = evaluate(
        toy(), model=SMALL, modes=("forward",), protocol=Protocol(batch=batch, label_delay=delay)
    )
    assert result.test_metric == pytest.approx(both[0].test_metric, abs=1e-12)
    assert not np.isnan(result.batch_loss).any()


def test_label_delay_keeps_early_points_untrained():
    (result,) = evaluate(toy(), model=SMALL, modes=("ridge",), protocol=Protocol(batch=10, label_delay=3))
    untrained = result.curve[0][1]
    assert [v for t, v in result.curve if t <= 3] == [untrained] * 3  # no label before batch 4 is predicted


def test_json_is_serialisable_with_the_required_keys(both):
    for r in both:
        obj = json.loads(json.dumps(r.to_json(), allow_nan=False))
        assert JSON_KEYS <= set(obj)
        assert obj["metric"] == "accuracy" and len(obj["curve"]) == len(r.curve)
        assert "batch_loss" not in obj
        full = r.to_json(per_batch=True)
        assert len(full["batch_loss"]) == len(full["batch_prequential"]) == r.batches


def test_regression_reports_rmse():
    # 240 training rows: the target scaling must freeze within them for a prequential RMSE to exist
    results = evaluate(toy_regression(), model={**SMALL, "warmup_rows": 48}, protocol=Protocol(batch=12))
    for r in results:
        assert r.metric == "rmse" and r.task == "regression"
        assert 0 < r.test_metric < 1.0  # the target's std is about 1.2
        assert math.isfinite(r.prequential_metric) and r.prequential_metric > r.test_metric
    assert results[0].test_metric == pytest.approx(results[1].test_metric, rel=1e-9)


def test_regression_warmup_rows_stay_out_of_the_prequential_metric():
    """Until warmup_rows labels are in, the target scaling is unknown and the model predicts 0: those
    batches are counted apart, not scored (with delay 1 and 12-row batches, 50 labels need 5 batches)."""
    (r,) = evaluate(
        toy_regression(),
        model={**SMALL, "warmup_rows": 50},
        modes=("forward",),
        protocol=Protocol(batch=12, label_delay=1),
    )
    assert r.warmup_rows_excluded == 60 and r.to_json()["warmup_rows_excluded"] == 60
    later = r.batch_prequential[5:]  # per-batch RMSE; all these batches have 12 rows
    assert r.prequential_metric == pytest.approx(math.sqrt(np.mean(later**2)))
    everything = math.sqrt(np.mean(r.batch_prequential**2))
    assert r.prequential_metric < everything  # the warm-up's zeros would have inflated it


def test_classification_has_no_warmup_rows_excluded(both):
    assert [r.warmup_rows_excluded for r in both] == [0, 0]


def _kernel_signatures():
    """Every Numba dispatcher of the kernel modules, with the signatures compiled or loaded so far."""
    from numba.core.registry import CPUDispatcher

    from iolstream.core import activation_kernels, numba_blas, step_kernels

    return {
        f"{mod.__name__}.{name}": len(obj.signatures)
        for mod in (activation_kernels, numba_blas, step_kernels)
        for name, obj in vars(mod).items()
        if isinstance(obj, CPUDispatcher)
    }


@pytest.mark.parametrize(
    "kind, batch, extra",
    [
        ("classification", 13, {}),  # 13-row batches: Gram + Cholesky; the last, 8 rows: Woodbury (n = 70)
        ("regression", 13, {}),
        ("classification", 8, {"refactor_every": 4}),  # Woodbury throughout, rebuilt every 4 batches
    ],
)
def test_kernels_are_compiled_before_the_clock_starts(kind, batch, extra):
    """start() runs a tiny model of the same kind: the timed stream then meets no kernel signature
    it has not already compiled or loaded (a first call would be timed as learning)."""
    data = toy() if kind == "classification" else toy_regression()
    protocol = Protocol(batch=batch, label_delay=2)
    split = make_split(data, protocol)
    seen = {}

    class Spy(EdRVFLLearner):
        def start(self, x_head, batch_sizes=()):
            super().start(x_head, batch_sizes)
            seen.update(_kernel_signatures())

    learner = Spy(model_config(split, "forward", {"n_nodes": 64, "n_layers": 2, "lam": "auto", **extra}))
    result = run_protocol(learner, split, protocol)
    assert result.compile_seconds > 0
    assert _kernel_signatures() == seen


def test_curve_test_rows_caps_only_the_curve():
    protocol = Protocol(batch=10, curve_test_rows=20)
    (result,) = evaluate(toy(), model=SMALL, modes=("forward",), protocol=protocol)
    assert result.curve_test_rows == 20 and result.test_rows == 80


def test_time_points():
    assert time_points(5, 20) == [1, 2, 3, 4, 5]
    assert time_points(371, 6) == [1, 3, 11, 35, 114, 371]
    assert time_points(40, 1) == [40]
    pts = time_points(10_000, 20)
    assert pts[0] == 1 and pts[-1] == 10_000 and len(pts) == 20


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"batch": 0}, "batch"),
        ({"batch": 2.5}, "batch"),
        ({"label_delay": 0}, "label_delay"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"rows": 0}, "rows"),
    ],
)
def test_protocol_rejects_bad_values(kwargs, key):
    with pytest.raises(ValueError, match=key):
        Protocol(**kwargs)


def test_split_is_seeded_and_capped():
    ds = toy()
    a, b = make_split(ds, Protocol(seed=3)), make_split(ds, Protocol(seed=3))
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    c = make_split(ds, Protocol(seed=4, rows=100, test_fraction=0.25))
    assert (len(c.x_train), len(c.x_test)) == (75, 25)


def test_unknown_class_is_a_data_error():
    with pytest.raises(DataError, match=r"unknown class 2 in row \d+; declared classes: \[0, 1\]"):
        make_split(toy(), Protocol(), classes=(0, 1))


def test_warmup_scaler_sees_only_training_rows():
    split = make_split(toy(), Protocol(seed=0))
    learner = EdRVFLLearner(model_config(split, "forward", {**SMALL, "warmup_rows": 50}))
    run_protocol(learner, split, Protocol(batch=10, curve_points=1))
    assert np.allclose(learner.model.scaler.mean, split.x_train[:50].mean(axis=0))


def test_fixed_scaler_uses_the_training_part():
    split = make_split(toy(), Protocol(seed=0))
    cfg = model_config(split, "ridge", {**SMALL, "scaler": "fixed"})
    assert np.allclose(cfg.scaler_mean, split.x_train.mean(axis=0))


def test_iris_end_to_end():
    results = evaluate(load("iris"), model=SMALL)
    assert [r.batches for r in results] == [30, 30]
    assert min(r.test_metric for r in results) > 0.85


# --------------------------------------------------------------------------- baselines


@pytest.mark.parametrize("name", ["os-elm", "river-softmax", "river-arf"])
def test_baselines_run_the_same_protocol(name):
    (result,) = evaluate(toy(200), model=SMALL, modes=(), baselines=(name,), protocol=Protocol(batch=20))
    assert result.name == name and result.batches == 8 and result.rows == 160
    assert result.test_metric > 0.6
    assert not np.isnan(result.batch_loss).any()
    if name == "os-elm":
        assert result.cumulative_regret is not None and result.regret_bound > 0
    else:
        assert result.cumulative_regret is None and result.to_json()["regret_bound"] is None


@pytest.mark.parametrize("name", ["river-softmax", "river-arf", "river-hat"])
def test_river_says_uniform_before_its_first_label_and_its_probabilities_sum_to_one(name):
    """Before any label River predicts nothing; scored as zeros that batch alone would cost 34.5 nats a row (the
    floor's) and put River's log loss far above what it is. Its first batch is uniform, every row sums to one."""
    protocol = Protocol(batch=20, order="stream")
    (result,) = evaluate(toy(200), model=SMALL, modes=(), baselines=(name,), protocol=protocol)
    split = make_split(toy(200), protocol)
    learner = RiverLearner(name, split)
    handle, _ = learner.arrive(split.x_train[:5])
    np.testing.assert_allclose(learner.probabilities(handle), 1 / 3)
    learner.label(handle, np.array([0, 1, 2, 0, 1]))
    proba = learner.probabilities(learner.arrive(split.x_train[5:40])[0])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert result.log_loss < 1.2  # uniform is log 3 = 1.10; the first batch as zeros alone made it 3.5


@pytest.mark.parametrize("name", ["os-elm", "river-softmax"])
def test_baselines_do_regression(name):
    (result,) = evaluate(
        toy_regression(), model=SMALL, modes=(), baselines=(name,), protocol=Protocol(batch=30)
    )
    assert result.metric == "rmse" and math.isfinite(result.test_metric)


def test_regression_baselines_are_scored_on_the_model_s_rows():
    """The model's rows predicted before its target scaling are left out of its preq; a baseline beside it
    leaves out the same rows (it was scored on all of them, its cold start included, against the model's rest)."""
    protocol = Protocol(batch=30, order="stream")
    model = {**SMALL, "warmup_rows": 64}
    ridge, river = evaluate(
        toy_regression(), model=model, modes=("ridge",), baselines=("river-softmax",), protocol=protocol
    )
    assert ridge.warmup_rows_excluded == river.warmup_rows_excluded == 90  # labels of 3 batches: 30, 60, 90
    (alone,) = evaluate(
        toy_regression(), model=model, modes=(), baselines=("river-softmax",), protocol=protocol
    )
    assert alone.warmup_rows_excluded == 0  # no model beside it: every row
    per_batch = np.asarray(alone.batch_prequential)[3:]  # RMSE of each batch of 30 rows (the last 30 too)
    np.testing.assert_allclose(river.prequential_metric, np.sqrt((per_batch**2).mean()), rtol=1e-12)
    assert river.prequential_metric != alone.prequential_metric


def test_one_row_one_layer_forward_predicts_the_same_classes_as_ridge():
    """b = 1, L = 1: the -F output is the -R output divided by 1 + x A⁻¹ xᵀ (push-through identity),
    so the predicted classes, hence the prequential accuracy, coincide; the squared losses do not."""
    model = {"n_nodes": 24, "n_layers": 1}
    forward, ridge = evaluate(toy(150), model=model, protocol=Protocol(batch=1, curve_points=1))
    assert np.array_equal(forward.batch_prequential, ridge.batch_prequential)
    assert not np.allclose(forward.batch_loss[1:], ridge.batch_loss[1:])


def test_stream_order_is_test_then_train_over_the_rows_as_they_come():
    """--order stream: no shuffle and no test set; the prequential metric over all rows, the first 20 %
    after the warm-up and the last 20 %, and windowed, all from the same per-batch errors."""
    from iolstream.tools.builtin_datasets import load

    data = load("sea", n_rows=3000, seed=3)
    protocol = Protocol(order="stream", batch=100)
    (r,) = evaluate(data, model={"n_nodes": 32, "warmup_rows": 100}, modes=("forward",), protocol=protocol)
    assert r.order == "stream" and r.rows == 3000 and r.test_rows == 0 and math.isnan(r.test_metric)
    assert r.batches == 30 and r.curve == []
    accuracies = r.batch_prequential
    assert r.prequential_metric == pytest.approx(accuracies.mean())  # equal batches
    assert r.prequential_last20 == pytest.approx(accuracies[-6:].mean())
    assert r.prequential_first20 == pytest.approx(
        accuracies[1:7].mean()
    )  # rows 100..700 after the 100-row warm-up
    assert len(r.window_curve) == 30 and r.window_curve[-1][0] == 3000
    assert r.to_json()["window_curve"][0] == [100, pytest.approx(accuracies[0])]


# --------------------------------------------------------------------------- linear hidden units


def test_a_linear_model_is_said_once_and_the_json_holds_the_share(capsys):
    """sigmoid with Xavier weights over iris's 4 inputs: every unit in the sigmoid's straight middle. Said once
    for -F and -R (the same random units), with the share and the option to change."""
    from iolstream.tools.cli import main

    argv = ["evaluate", "--dataset", "iris", "--nodes", "64", "--layers", "2", "--json", "--quiet"]
    assert main([*argv, "--activation", "sigmoid", "--init", "xavier"]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err
    assert "activation sigmoid with init xavier" in warnings[0] and warnings[0].endswith("try --init auto")
    shares = {json.loads(line)["config"]["linear_units"] for line in out.splitlines()}
    assert len(shares) == 1 and shares.pop() >= 0.9
    assert f"{json.loads(out.splitlines()[0])['config']['linear_units']:.0%}" in warnings[0]

    assert main([*argv, "--activation", "sigmoid"]) == 0  # init auto
    out, err = capsys.readouterr()
    assert "warning:" not in err and json.loads(out.splitlines()[0])["config"]["init"] == "spread"
    assert json.loads(out.splitlines()[0])["config"]["linear_units"] < 0.5


@pytest.mark.parametrize(
    "data", [toy, lambda: toy_regression(n_rows=1000)]
)  # regression: rows past the warm-up
def test_mode_auto_reports_its_candidates_as_the_single_mode_runs(data, capsys):
    """``--mode auto``: one run, the model's metrics and each candidate's own, which are those of -F and -R
    run alone on the same split (the same sums) when every batch is scored (``scoring_share: all``; the
    default budget scores the candidate not in force on some batches only); the mode in force in the JSON."""
    from iolstream.tools import cli

    ds = data()
    single = evaluate(ds, model=SMALL, modes=("forward", "ridge"))
    (auto,) = evaluate(ds, model={**SMALL, "scoring_share": "all"}, modes=("auto",))
    got = {c["mode"]: c for c in auto.config["candidate_results"]}
    for r, mode in zip(single, ("forward", "ridge")):
        assert got[mode]["prequential_metric"] == pytest.approx(r.prequential_metric, rel=1e-12), mode
        assert got[mode]["cumulative_regret"] == pytest.approx(r.cumulative_regret, rel=1e-8), mode
    chosen = auto.config["effective"]["mode"]
    assert chosen in ("forward", "ridge") and auto.name == "edRVFL-auto"
    assert auto.test_metric == pytest.approx(single[0].test_metric, rel=1e-9)  # every label in: the same sums
    assert json.loads(json.dumps(auto.to_json(), allow_nan=False))["config"]["effective"]["mode"] == chosen
    assert cli.main(["evaluate", "--dataset", "iris", "--mode", "auto", "--nodes", "16"]) == 0
    out = capsys.readouterr().out
    assert "edRVFL-auto" in out and "\n  -F " in out and "\n  -R " in out
