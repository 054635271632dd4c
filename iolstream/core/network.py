"""The edRVFL hidden layers (docs/design.md §1, eqs. 1–2): random, seeded, never trained.

    H_1 = g(X W_1 + b_1),  H_l = g([H_{l-1} | X] W_l + b_l),  D_l = [H_l | X | 1]

Features are returned as one block ``features_t`` of shape (L, n, b), C-ordered:
``features_t[l]`` is D_lᵀ. That layout makes every piece a contiguous slice —
H_lᵀ is ``features_t[l, :N]`` (written in place by the kernel), the next
layer's input [H_l | X]ᵀ is ``features_t[l, :N + k]``, and ``features_t[l].T``
is an F-ordered D_l that BLAS takes without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iolstream.core import activation_kernels, step_kernels

INITS = ("auto", "normal", "xavier", "kaiming", "uniform", "spread")

# init "auto": the weights each activation takes, chosen from measurements (docs/benchmarks.md, "Random
# weights and the activation"): relu and leaky_relu keep Xavier, selu and swish take Kaiming (Xavier left
# selu almost linear), sigmoid and tanh take "spread" (Xavier left them almost linear, N(0, 1) saturates
# them on wide inputs).
AUTO_INITS = {
    "relu": "xavier",
    "leaky_relu": "xavier",
    "selu": "kaiming",
    "swish": "kaiming",
    "sigmoid": "spread",
    "tanh": "spread",
}
# init "spread": weights N(0, s²/fan_in), biases N(0, s²). Over unit-variance inputs a unit's pre-activation
# then spreads over about ±s whatever the fan-in (N(0, 1) weights give ±√fan_in), and the bias puts each
# unit's bend (at 0) somewhere else within ±s. s is in the activation's own units: sigmoid(v) =
# (1 + tanh(v / 2)) / 2 bends over twice tanh's range.
SPREAD = {"sigmoid": 3.0, "tanh": 1.5}
SPREAD_OTHERS = 1.0  # the ReLU family, spread on request


def resolve_init(init: str, activation: str) -> str:
    """The init that draws the weights: ``init`` itself, or for "auto" the activation's (AUTO_INITS)."""
    if init == "auto":
        return AUTO_INITS[activation]
    return init


def _scales(init: str, activation: str, fan_in: int, fan_out: int) -> tuple[float, float]:
    """(weight scale, bias scale): standard deviations, or for "uniform" the bound a of U(-a, a)."""
    if init == "normal":  # the paper's N(0, 1)
        return 1.0, 1.0
    if init == "xavier":  # Glorot & Bengio (2010), normal variant: Var = 2 / (fan_in + fan_out)
        scale = float(np.sqrt(2.0 / (fan_in + fan_out)))
    elif init == "kaiming":  # He et al. (2015): Var = 2 / fan_in
        scale = float(np.sqrt(2.0 / fan_in))
    elif init == "uniform":  # LeCun uniform U(-a, a), a = sqrt(3 / fan_in): unit-variance pre-activations
        scale = float(np.sqrt(3.0 / fan_in))
    elif init == "spread":  # see SPREAD
        spread = SPREAD.get(activation, SPREAD_OTHERS)
        return spread / float(np.sqrt(fan_in)), spread
    else:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    return scale, scale


CACHE_LINE = 64  # bytes


def _aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """np.empty starting on a cache line (NumPy aligns to 16 bytes only), so that the row chunks
    the parallel features kernel writes from different threads share no line (false sharing)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    raw = np.empty(size * dtype.itemsize + CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start : start + size * dtype.itemsize].view(dtype).reshape(shape)


@dataclass(frozen=True)
class RandomNetwork:
    """Random weights of an edRVFL network.

    weights_t : list of L arrays, (N, k) for layer 1 and (N, N + k) after — W_lᵀ (views of packed_weights_t)
    biases    : list of L arrays of shape (N,)
    packed_weights_t : (L, N, N + k) — the same W_lᵀ in one block (layer 1 in the first k
                       columns, zeros after), as the features kernel takes them
    packed_biases    : (L, N)
    """

    n_inputs: int
    n_nodes: int
    n_layers: int
    activation: str
    init: str
    seed: int
    dtype: np.dtype
    bias_column: bool
    weights_t: tuple
    biases: tuple
    packed_weights_t: np.ndarray
    packed_biases: np.ndarray

    @classmethod
    def create(
        cls,
        n_inputs,
        n_nodes,
        n_layers,
        *,
        activation="relu",
        init="auto",
        seed=0,
        dtype=np.float64,
        bias_column=True,
    ):
        if activation not in activation_kernels.ACTIVATION_CODES:
            raise ValueError(
                f"activation must be one of {activation_kernels.ACTIVATIONS}, got {activation!r}"
            )
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        init = resolve_init(init, activation)  # "auto": the activation's own; the network records which
        rng = np.random.default_rng(seed)
        weights_t, biases = [], []
        for layer in range(n_layers):
            fan_in = n_inputs if layer == 0 else n_nodes + n_inputs
            w_scale, b_scale = _scales(init, activation, fan_in, n_nodes)
            if init == "uniform":
                w = rng.uniform(-w_scale, w_scale, size=(n_nodes, fan_in))
                b = rng.uniform(-b_scale, b_scale, size=n_nodes)
            else:
                w = rng.standard_normal((n_nodes, fan_in)) * w_scale
                b = rng.standard_normal(n_nodes) * b_scale
            weights_t.append(np.ascontiguousarray(w, dtype=dtype))
            biases.append(np.ascontiguousarray(b, dtype=dtype))
        packed = np.zeros((n_layers, n_nodes, n_nodes + n_inputs), dtype=dtype)
        for layer, w in enumerate(weights_t):
            packed[layer, :, : w.shape[1]] = w
        weights_t = [packed[layer, :, : w.shape[1]] for layer, w in enumerate(weights_t)]  # views: one copy
        return cls(
            n_inputs,
            n_nodes,
            n_layers,
            activation,
            init,
            seed,
            np.dtype(dtype),
            bool(bias_column),
            tuple(weights_t),
            tuple(biases),
            packed,
            np.array(biases),
        )

    @property
    def n_columns(self) -> int:
        """n = N + k + 1: columns of D_l ([H_l | X | 1]); N + k without the bias column."""
        return self.n_nodes + self.n_inputs + int(self.bias_column)

    @property
    def kernel_weights(self) -> tuple:
        """What the features kernels take after the inputs: (W_lᵀ packed, b_l, activation code, bias column)."""
        return (
            self.packed_weights_t,
            self.packed_biases,
            activation_kernels.ACTIVATION_CODES[self.activation],
            self.bias_column,
        )

    def empty_features(self, b: int) -> np.ndarray:
        """An uninitialised (L, n, b) block for the features of b rows (cache-line aligned)."""
        return _aligned_empty((self.n_layers, self.n_columns, b), self.dtype)

    def features(self, x_scaled: np.ndarray, *, parallel: bool = False) -> np.ndarray:
        """D_lᵀ for every layer: (L, n, b) array of ``dtype`` from scaled inputs (b, k).

        parallel : compute the two chunks of rows on two of Numba's threads (same result, bitwise).
        """
        b = x_scaled.shape[0]
        out = self.empty_features(b)
        if b == 0:
            return out
        args = (np.ascontiguousarray(x_scaled, dtype=self.dtype), *self.kernel_weights, out)
        if parallel:
            step_kernels.features_parallel(*args)
        else:
            step_kernels.features_serial(*args)
        return out
