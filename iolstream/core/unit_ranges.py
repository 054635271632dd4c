"""Where the hidden units work on a set of rows: in a bent range of their activation, or not.

A random hidden unit adds to the model only where its activation bends over the pre-activations the
data give it. Units whose output is an affine function of their pre-activation (sigmoid or tanh on a
narrow range, a ReLU that is always on) are linear in the layer's input; units whose output barely
moves (a ReLU that is always off, a saturated sigmoid) are constant. When almost every unit is one or
the other, the hidden layers add nothing to the direct link and the model is a linear one — silently,
unless someone measures it. ``measure`` does, on the scaled warm-up rows; the worker and
``iolstream evaluate`` report it (pure here: arrays in, numbers out).

    >>> import numpy as np
    >>> from iolstream.core.network import RandomNetwork
    >>> x = np.random.default_rng(0).standard_normal((256, 19))
    >>> narrow = measure(RandomNetwork.create(19, 512, 2, activation="sigmoid", init="xavier"), x)
    >>> narrow.mostly_linear, narrow.linear, narrow.flat
    (True, (512, 512), (0, 0))
    >>> measure(RandomNetwork.create(19, 512, 2, activation="sigmoid", init="auto"), x).mostly_linear
    False
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iolstream.core.network import resolve_init

# A unit is linear when an affine function of its pre-activation explains all but this share of its output's
# variance over the rows (1 − r²). Over N(0, σ²) pre-activations that share is about σ⁴/24 for sigmoid and
# 2σ⁴/3 for tanh: linear up to σ ≈ 1.05 and 0.52. At 0.05 the units' nonlinear part is under 22 % of their
# spread; tanh with Xavier weights on segment (95 % linear by it) lost 4 points of accuracy to init auto.
LINEAR_TOL = 0.05
# A unit is flat (dead or saturated) when its output's spread is below this share of its pre-activation's.
FLAT_TOL = 0.01
# "Almost every unit": at or above this share of linear and flat units, the hidden layers add next to nothing.
MOSTLY_LINEAR = 0.9


@dataclass(frozen=True)
class UnitRanges:
    """Per layer, how many of its N units are linear or flat on the rows measured.

    linear, flat : tuples of L counts;  n_nodes : N;  rows : rows measured
    """

    activation: str
    init: str
    n_nodes: int
    rows: int
    linear: tuple
    flat: tuple

    @property
    def share(self) -> float:
        """Share of all hidden units (every layer) that are linear or flat."""
        return (sum(self.linear) + sum(self.flat)) / (self.n_nodes * len(self.linear))

    def layer_share(self, layer: int) -> float:
        return (self.linear[layer] + self.flat[layer]) / self.n_nodes

    @property
    def mostly_linear(self) -> bool:
        return self.share >= MOSTLY_LINEAR

    def remedy(self, spelling: str) -> str:
        """The setting to change, as ``spelling`` (e.g. "model.{}: {}") writes a key and value: init auto where
        it draws otherwise, else the paper's N(0, 1)."""
        value = "auto" if self.init != resolve_init("auto", self.activation) else "normal"
        return spelling.format("init", value)

    @property
    def fields(self) -> dict:
        """Structured log fields."""
        return {"event": "linear_units", "share": self.share, "linear": self.linear, "flat": self.flat}

    def describe(self) -> str:
        """One sentence with the numbers (callers add the setting to change, in their own spelling)."""
        layers = ", ".join(f"layer {i + 1}: {self.layer_share(i):.0%}" for i in range(len(self.linear)))
        return (
            f"{self.share:.0%} of the hidden units ({layers}) of activation {self.activation} with init "
            f"{self.init} are linear ({sum(self.linear)}) or flat ({sum(self.flat)}: dead or saturated) on "
            f"the {self.rows} warm-up rows: the hidden layers add almost nothing to a linear model"
        )


def measure(network, x_scaled: np.ndarray) -> UnitRanges:
    """Count the linear and the flat units of every layer of ``network`` over the rows ``x_scaled`` (b, k),
    scaled as the model scales them (b ≥ 2)."""
    x = np.asarray(x_scaled, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != network.n_inputs or x.shape[0] < 2:
        raise ValueError(f"x_scaled: expected at least 2 rows of {network.n_inputs} inputs, got {x.shape}")
    features_t = network.features(x)  # (L, n, b): H_lᵀ in rows :N, [H_l | X]ᵀ in rows :N + k
    n_nodes, linear, flat = network.n_nodes, [], []
    for layer, (w_t, bias) in enumerate(zip(network.weights_t, network.biases)):
        layer_in = x if layer == 0 else features_t[layer - 1, : n_nodes + network.n_inputs].T
        pre = layer_in @ np.asarray(w_t, dtype=np.float64).T + bias  # (b, N): X W_1 + b_1, [H | X] W_l + b_l
        out = np.asarray(features_t[layer, :n_nodes].T, dtype=np.float64)  # (b, N): g(pre)
        pre_c, out_c = pre - pre.mean(axis=0), out - out.mean(axis=0)
        pre_ss, out_ss = (pre_c**2).sum(axis=0), (out_c**2).sum(axis=0)
        is_flat = out_ss <= FLAT_TOL**2 * pre_ss
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = (pre_c * out_c).sum(axis=0) ** 2 / (pre_ss * out_ss)
        is_linear = ~is_flat & (1.0 - r2 <= LINEAR_TOL)
        linear.append(int(is_linear.sum()))
        flat.append(int(is_flat.sum()))
    return UnitRanges(network.activation, network.init, n_nodes, len(x), tuple(linear), tuple(flat))


def of_model(model, x_head: np.ndarray) -> UnitRanges | None:
    """``measure`` over the first ``warmup_rows`` of the raw rows ``x_head``, scaled by the model's (frozen)
    scaler, as the model will see them; None with fewer than 2 rows."""
    x = np.asarray(x_head, dtype=np.float64)[: model.config.warmup_rows]
    return measure(model.network, model.scaler.transform(x)) if len(x) >= 2 else None
