"""The activation kernels (Numba): the hidden units' activations (``activate``), the output's softmax, and what the
ensemble builds on them: the mean over layers, the selector's 0/1 losses, the calibration's log-loss sums. Also
the flags every kernel file compiles with (``JIT``).

Private, unvalidated, arrays in and arrays out. The public wrappers live in
``network``, ``model`` and ``calibration``; the plain-NumPy twins every kernel is tested
against live in ``tests/naive.py``. The fused kernels of a whole step (hidden
layers, Gram + Cholesky or Woodbury update, prediction, fold-in) are in ``step_kernels``.

``np.dot`` inside these kernels goes through SciPy's BLAS (Numba binds
``scipy.linalg.cython_blas``), as do ``step_kernels`` and the factorisations in
``gram_cholesky``: the hot path uses one OpenBLAS thread pool, never two (two copies fight over 2 cores:
docs/benchmarks.md, "The update's building blocks").
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from iolstream.core import kernel_cache  # noqa: F401  (before the first @njit(cache=True): kernels stamped with all kernel files)

ACTIVATIONS = ("relu", "sigmoid", "tanh", "selu", "swish", "leaky_relu")
ACTIVATION_CODES = {name: code for code, name in enumerate(ACTIVATIONS)}

# SELU constants (Klambauer et al., 2017) and the leaky-ReLU slope.
SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805
LEAKY_SLOPE = 0.01

JIT = dict(cache=True, nogil=True, fastmath=False)


@nb.njit(**JIT)
def activate(v, code):
    if code == 0:  # relu
        return v if v > 0.0 else 0.0 * v
    if code == 1:  # sigmoid, stable on both tails
        if v >= 0.0:
            return 1.0 / (1.0 + math.exp(-v))
        e = math.exp(v)
        return e / (1.0 + e)
    if code == 2:
        return math.tanh(v)
    if code == 3:  # selu
        return SELU_SCALE * (v if v > 0.0 else SELU_ALPHA * (math.exp(v) - 1.0))
    if code == 4:  # swish = v * sigmoid(v)
        if v >= 0.0:
            return v / (1.0 + math.exp(-v))
        e = math.exp(v)
        return v * e / (1.0 + e)
    # leaky_relu
    return v if v > 0.0 else LEAKY_SLOPE * v


@nb.njit(**JIT)
def softmax_rows(z):
    """Row-wise softmax of (b, m) scores, shifted by the row maximum for stability."""
    out = np.empty_like(z)
    b, m = z.shape
    for i in range(b):
        top = z[i, 0]
        for j in range(1, m):
            if z[i, j] > top:
                top = z[i, j]
        total = 0.0
        for j in range(m):
            e = math.exp(z[i, j] - top)
            out[i, j] = e
            total += e
        for j in range(m):
            out[i, j] /= total
    return out


@nb.njit(**JIT)
def layer_mean(outputs):
    """Mean over the layers of (L, b, m) outputs: summed in layer order, then divided (the bits of
    NumPy's ``outputs.mean(axis=0)``). The default regression ensemble."""
    total = outputs[0].copy()
    for layer in range(1, outputs.shape[0]):
        total += outputs[layer]
    return total / outputs.shape[0]


@nb.njit(**JIT)
def softmax_mean(outputs):
    """Mean over the layers of the row-wise softmax of (L, b, m) outputs. The default
    classification ensemble (each layer's scores made probabilities first)."""
    total = softmax_rows(outputs[0])
    for layer in range(1, outputs.shape[0]):
        total += softmax_rows(outputs[layer])
    return total / outputs.shape[0]


@nb.njit(**JIT)
def softmax_errors(predicted, truth, out):
    """out[k, i] = 1.0 where candidate k's softmax ensemble (``softmax_mean`` of predicted[k], (L, b, m)) puts row
    i in another class than truth[i], else 0.0; its class is the first of the largest probabilities (NumPy's
    argmax). The selector's 0/1 losses of K candidates (``predicted`` (K, L, b, m)) in one call."""
    for k in range(predicted.shape[0]):
        proba = softmax_mean(predicted[k])
        for i in range(proba.shape[0]):
            best, top = 0, proba[i, 0]
            for j in range(1, proba.shape[1]):
                if proba[i, j] > top:
                    best, top = j, proba[i, j]
            out[k, i] = 0.0 if best == truth[i] else 1.0


@nb.njit(**JIT)
def _bent_scores(scores, kappa, floor, g):
    """g (m,) = g_κ(clip(scores, floor, 1)) of one row's scores (m,), the calibration's scale (κ = 0: the log);
    returns its largest element (the maps' softmax is taken relative to it). The grid's κ of ½ and 1 take a square
    root and no power (c**½ and √c agreed on every one of 4·10⁷ scores tried; c**1 is c): the power was about a
    quarter of the sums' time on ten classes."""
    m = scores.shape[0]
    for j in range(m):
        c = min(max(scores[j], floor), 1.0)
        if kappa == 0.0:
            g[j] = math.log(c)
        elif kappa == 1.0:
            g[j] = c - 1.0
        elif kappa == 0.5:
            g[j] = (math.sqrt(c) - 1.0) / 0.5
        else:
            g[j] = (c**kappa - 1.0) / kappa
    top = g[0]
    for j in range(1, m):
        if g[j] > top:
            top = g[j]
    return top


@nb.njit(**JIT)
def calibration_losses(scores, labels, weights, kappas, temperatures, floor, cap, out):
    """out[κ·T + t] += Σᵢ wᵢ · min(−log softmax(T_t · g_κ(clip(sᵢ, floor, 1)))[yᵢ], cap): every map of the
    calibration grid (``calibration.grid_losses``) on b rows, scores (b, m), labels (b,), weights (b,).

    The temperatures double every two steps (T_{t+2} = 2·T_t), so exp(T_{t+2}·d) = exp(T_t·d)²: two exponentials
    per class and κ, the others by squaring (relative error ≤ 2^8·ε after the 8 squarings of 17 temperatures)."""
    b, m = scores.shape
    n_t = temperatures.shape[0]
    g = np.empty(m)
    powers = np.empty((2, m))  # exp(T_t·(g_j − top)) of the last two temperatures
    for i in range(b):
        y = labels[i]
        for k in range(kappas.shape[0]):
            top = _bent_scores(scores[i], kappas[k], floor, g)
            for t in range(n_t):
                temp = temperatures[t]
                row = powers[t % 2]
                total = 0.0
                for j in range(m):
                    row[j] = math.exp(temp * (g[j] - top)) if t < 2 else row[j] * row[j]
                    total += row[j]
                loss = math.log(total) - temp * (g[y] - top)
                out[k * n_t + t] += weights[i] * min(loss, cap)
    return out


@nb.njit(**JIT)
def calibration_mixture(scores, weights, kappas, temperatures, floor, out):
    """out (b, m) = Σ_g weights[g] · softmax(T_t · g_κ(clip(sᵢ, floor, 1))), g = κ·T + t: the calibration's
    mixture of the grid's maps (``calibration.probabilities``) on b rows, scores (b, m), weights (GRID_SIZE,)
    (the maps weighing 0 skipped). The temperatures double every two steps, as in ``calibration_losses``."""
    b, m = scores.shape
    n_k, n_t = kappas.shape[0], temperatures.shape[0]
    last = np.full(n_k, -1)  # the last temperature of each κ that weighs
    for k in range(n_k):
        for t in range(n_t):
            if weights[k * n_t + t] > 0.0:
                last[k] = t
    g = np.empty(m)
    powers = np.empty((2, m))
    out[:] = 0.0
    for i in range(b):
        for k in range(n_k):
            if last[k] < 0:
                continue
            top = _bent_scores(scores[i], kappas[k], floor, g)
            for t in range(last[k] + 1):
                row = powers[t % 2]
                total = 0.0
                for j in range(m):
                    row[j] = math.exp(temperatures[t] * (g[j] - top)) if t < 2 else row[j] * row[j]
                    total += row[j]
                w = weights[k * n_t + t]
                if w > 0.0:
                    for j in range(m):
                        out[i, j] += w * row[j] / total
    return out


@nb.njit(**JIT)
def clipped_mean(outputs, floor, out):
    """out (b, m) = the mean over the layers of outputs (L, b, m), each clipped to [floor, 1] first: the calibration's
    ensemble scores (``calibration.ensemble_scores``), the bits of NumPy's ``np.clip(outputs, floor, 1).mean(axis=0)``
    (the layers added in order, then divided by L; NaN stays NaN)."""
    n_layers, b, m = outputs.shape
    for i in range(b):
        for j in range(m):
            total = 0.0
            for layer in range(n_layers):
                v = outputs[layer, i, j]
                if v == v:  # NaN passes through as np.clip passes it
                    v = min(max(v, floor), 1.0)
                total = v if layer == 0 else total + v
            out[i, j] = total / n_layers


@nb.njit(**JIT)
def top_class(outputs, scores, out):
    """out[i] = the class of the highest score of row i (scores (b, m)), ties to the highest mean layer output
    (outputs (L, b, m)): the bits of NumPy's ``np.where(scores == scores.max(1, keepdims=True), outputs.mean(0),
    -inf).argmax(1)`` (``calibration.decision``): a row max of NaN ties nothing (class 0), and argmax takes the
    first NaN, else the first of the largest."""
    n_layers, b, m = outputs.shape
    for i in range(b):
        top = scores[i, 0]
        for j in range(1, m):
            v = scores[i, j]
            if v != v or top != top:
                top = math.nan
            elif v > top:
                top = v
        best, best_value = 0, -math.inf
        for j in range(m):
            if scores[i, j] == top:
                value = outputs[0, i, j]
                for layer in range(1, n_layers):
                    value += outputs[layer, i, j]
                value /= n_layers
            else:
                value = -math.inf
            if value != value:
                best = j
                break
            if j == 0 or value > best_value:
                best, best_value = j, value
        out[i] = best
