"""core.unit_ranges: the count of linear and flat hidden units equals a plain per-unit count, and tells a
sigmoid drawn with Xavier weights (every unit in its linear range) from the same sigmoid with init auto.

Seeds are fixed and printed in the assertion messages.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from iolstream.core import unit_ranges
from iolstream.core.activation_kernels import ACTIVATIONS
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.network import RandomNetwork

K = 19  # about segment's width (18 inputs)


def rows(seed: int, b: int = 256, k: int = K) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((b, k))


def naive_counts(net: RandomNetwork, x: np.ndarray) -> tuple[list, list]:
    """One unit at a time: pre-activation from the weights, output from the activation formulas."""
    act = {
        "relu": lambda v: np.maximum(v, 0.0),
        "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
        "tanh": np.tanh,
    }[net.activation]
    linear, flat, layer_in = [], [], x
    for w_t, bias in zip(net.weights_t, net.biases):
        pre = layer_in @ w_t.T + bias
        out = act(pre)
        n_lin = n_flat = 0
        for j in range(net.n_nodes):
            if out[:, j].std() <= unit_ranges.FLAT_TOL * pre[:, j].std():
                n_flat += 1
            elif 1.0 - np.corrcoef(pre[:, j], out[:, j])[0, 1] ** 2 <= unit_ranges.LINEAR_TOL:
                n_lin += 1
        linear.append(n_lin)
        flat.append(n_flat)
        layer_in = np.hstack([out, x])  # [H_l | X]
    return linear, flat


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("init", ["xavier", "normal", "kaiming", "auto"])
def test_counts_equal_a_plain_per_unit_count(activation, init):
    seed = 5
    net = RandomNetwork.create(K, 48, 3, activation=activation, init=init, seed=seed)
    x = rows(seed)
    got = unit_ranges.measure(net, x)
    linear, flat = naive_counts(net, x)
    assert (list(got.linear), list(got.flat)) == (linear, flat), f"{activation}/{init} seed={seed}"
    assert got.rows == 256 and got.n_nodes == 48


def test_sigmoid_with_xavier_is_a_linear_model_and_auto_is_not():
    """The issue's case: over 19 standardised inputs Xavier's pre-activations stay within ±1, where the
    sigmoid is a straight line; auto's spread bends every layer."""
    for seed in range(3):
        x = rows(seed)
        xavier = unit_ranges.measure(
            RandomNetwork.create(K, 512, 2, activation="sigmoid", init="xavier", seed=seed), x
        )
        assert xavier.mostly_linear and xavier.share > 0.99, f"seed={seed}: {xavier}"
        assert "sigmoid with init xavier" in xavier.describe()
        assert xavier.remedy("model.{}: {}") == "model.init: auto"
        auto = unit_ranges.measure(RandomNetwork.create(K, 512, 2, activation="sigmoid", seed=seed), x)
        assert auto.init == "spread" and auto.share < 0.2, f"seed={seed}: {auto}"


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_no_activation_is_mostly_linear_at_its_auto_init(activation):
    seed = 2
    report = unit_ranges.measure(
        RandomNetwork.create(K, 256, 2, activation=activation, seed=seed), rows(seed)
    )
    assert not report.mostly_linear, f"{activation} seed={seed}: {report}"


def test_dead_and_always_on_relus_are_counted():
    """Inputs all positive with positive weights: every ReLU is always on (linear); negate the weights and
    biases and every one is always off (flat)."""
    net = RandomNetwork.create(3, 10, 1, activation="relu", init="normal", seed=0)
    w, b = np.abs(net.weights_t[0]), np.abs(net.biases[0])
    x = np.random.default_rng(0).uniform(0.1, 1.0, size=(50, 3))

    def with_weights(w, b):
        packed = np.zeros((1, 10, 13))  # (L, N, N + k): layer 1 in the first k columns
        packed[0, :, :3] = w
        return dataclasses.replace(
            net, weights_t=(w,), biases=(b,), packed_weights_t=packed, packed_biases=b[None]
        )

    on, off = with_weights(w, b), with_weights(-w, -b)
    assert unit_ranges.measure(on, x).linear == (10,) and unit_ranges.measure(on, x).flat == (0,)
    assert unit_ranges.measure(off, x).flat == (10,) and unit_ranges.measure(off, x).linear == (0,)
    report = unit_ranges.measure(off, x)
    assert report.mostly_linear and report.remedy("--{} {}") == "--init auto"


def test_at_auto_init_the_remedy_is_the_papers_normal():
    net = RandomNetwork.create(3, 10, 1, activation="sigmoid", seed=0)
    assert unit_ranges.measure(net, rows(0, 20, 3)).remedy("{}={}") == "init=normal"


def test_of_model_scales_the_warm_up_rows_as_the_model_does():
    cfg = ModelConfig(
        n_inputs=K, classes=(0, 1), n_nodes=32, activation="sigmoid", init="xavier", warmup_rows=40
    )
    model = EdRVFL(cfg)
    x = rows(1, 100) * 50.0 + 7.0  # raw rows far from unit scale
    model.scaler.partial_fit(x[:40])
    got = unit_ranges.of_model(model, x)
    assert got == unit_ranges.measure(model.network, model.scaler.transform(x[:40]))
    assert got.rows == 40
    assert unit_ranges.of_model(model, x[:1]) is None


def test_bad_rows_are_refused():
    net = RandomNetwork.create(3, 4, 1)
    with pytest.raises(ValueError, match="at least 2 rows of 3 inputs"):
        unit_ranges.measure(net, np.zeros((5, 4)))
    with pytest.raises(ValueError, match="at least 2 rows"):
        unit_ranges.measure(net, np.zeros((1, 3)))
