"""The shared step kernels: a batch through learners that share one set of sums (``mode: auto``, docs/design.md §10).

An -F learner of ``mode: auto`` keeps A_r, the labelled rows' Gram, beside A (the -R candidates solve on it): a
batch's Gram G = DᵀD enters A when its features arrive and A_r when its labels come, so it is formed once and
kept until then (``candidate_step.BatchGrams``). ``observe_keep_*`` is the -F step with G kept: features, G, A +=
G, and the -F β and prediction when it predicts. ``observe_pair_*`` is the same step of the default ``mode:
auto``, one -F learner and its one -R candidate, which also solves the -R β from A_r when its sums moved and
predicts with it: a batch in one call (one parallel region for the rows, one for the layers). The results are
the bits of the separate kernels (``step_kernels``), serial or parallel (tests/core/test_step_kernels.py).

Conventions as in ``step_kernels``: stacks C-ordered, layer first; gram[l].T is A_l (lower triangle authoritative),
features_t[l].T is D_l. The grouped arguments of the pair:

    sums    = (gram, labelled, batch_gram, rhs)   A, A_r, the batch's G (written), c
    forward = (beta, out, solve)                  -F: its β, outputs (L, b, m), whether it solves and predicts
    ridge   = (beta, out, shift, solve)           -R: its β, outputs (L, b or 0, m), λ_r − λ_f per layer, whether
                                                  its β is solved again (else it predicts with the one it has)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from iolstream.core.numba_blas import syrk_lower
from iolstream.core.step_kernels import (
    JIT,
    JIT_PARALLEL,
    add_gram,
    features_parallel,
    features_serial,
    fold_labels,
    half_squared_error,
    predict_layer,
    solve_predict_layer,
    squared_norm,
)


@nb.njit(**JIT)
def _gram_into(d, out_l):
    """Lower triangle of out_l ← DᵀD, what ``step_kernels.add_gram`` adds (float32 features: ssyrk into a float32 block,
    then its float64 copy); the upper triangle is left as it was."""
    if d.itemsize == 8:
        syrk_lower(1.0, d, 0.0, out_l)
        return
    n = d.shape[1]
    part = np.empty((n, n), d.dtype).T
    syrk_lower(1.0, d, 0.0, part)
    for j in range(n):
        for i in range(j, n):
            out_l[i, j] = part[i, j]


@nb.njit(**JIT)
def _add_lower(src_l, dst_l):
    """Lower triangle of dst_l += src_l's (column-major (n, n) blocks: the inner loop runs down a column)."""
    n = src_l.shape[0]
    for j in range(n):
        for i in range(j, n):
            dst_l[i, j] += src_l[i, j]


@nb.njit(**JIT)
def keep_layer(features_t, layer, gram, batch_gram, scratch, rhs, beta, out, info, solve):
    """-F with the batch's Gram kept, one layer: G_l = D_lᵀD_l into batch_gram[l], A_l += G_l (the bits of
    ``step_kernels.forward_layer``'s A), and if ``solve`` β_l = A_l⁻¹c_l and, if ``out`` has rows, D_l β_l (else β is
    left as it was). info[l] as in ``step_kernels.forward_layer``."""
    _gram_into(features_t[layer].T, batch_gram[layer].T)
    _add_lower(batch_gram[layer].T, gram[layer].T)
    if solve:
        solve_predict_layer(features_t, layer, gram, 0.0, scratch, rhs, beta, out, info)


@nb.njit(**JIT)
def observe_keep_serial(
    x,
    weights_t,
    biases,
    code,
    bias_column,
    features_t,
    gram,
    batch_gram,
    scratch,
    rhs,
    beta,
    out,
    info,
    solve,
):
    """The features, then ``keep_layer`` for every layer (scratch: (threads, n, n)); returns how many failed."""
    features_serial(x, weights_t, biases, code, bias_column, features_t)
    for layer in range(features_t.shape[0]):
        keep_layer(features_t, layer, gram, batch_gram, scratch[0], rhs, beta, out, info, solve)
    return np.count_nonzero(info)


@nb.njit(**JIT_PARALLEL)
def _keep_parallel(features_t, gram, batch_gram, scratch, rhs, beta, out, info, solve):
    for layer in nb.prange(features_t.shape[0]):
        keep_layer(
            features_t, layer, gram, batch_gram, scratch[nb.get_thread_id()], rhs, beta, out, info, solve
        )
    return np.count_nonzero(info)


@nb.njit(**JIT)
def observe_keep_parallel(
    x,
    weights_t,
    biases,
    code,
    bias_column,
    features_t,
    gram,
    batch_gram,
    scratch,
    rhs,
    beta,
    out,
    info,
    solve,
):
    """``observe_keep_serial`` on Numba's threads: the rows in chunks, then the layers (the same bits)."""
    features_parallel(x, weights_t, biases, code, bias_column, features_t)
    return _keep_parallel(features_t, gram, batch_gram, scratch, rhs, beta, out, info, solve)


@nb.njit(**JIT)
def pair_layer(features_t, layer, sums, forward, ridge, scratch, info):
    """``keep_layer`` for the -F learner, then, from the same layer's sums, its -R candidate: if it solves
    β_r = (A_r + shift_l·I)⁻¹c, then D β_r if its outputs have rows (the bits of ``step_kernels.solve_predict_layer``
    and ``step_kernels.predict_layer`` called apart)."""
    gram, labelled, batch_gram, rhs = sums
    beta, out, solve = forward
    beta_r, out_r, shift_r, solve_r = ridge
    keep_layer(features_t, layer, gram, batch_gram, scratch, rhs, beta, out, info, solve)
    if info[layer] != 0:
        return
    if solve_r:
        solve_predict_layer(features_t, layer, labelled, shift_r[layer], scratch, rhs, beta_r, out_r, info)
    elif out_r.shape[1] > 0:
        predict_layer(features_t, layer, beta_r, out_r)


@nb.njit(**JIT)
def observe_pair_serial(
    x, weights_t, biases, code, bias_column, features_t, sums, forward, ridge, scratch, info
):
    """The features, then ``pair_layer`` for every layer: a batch of the default ``mode: auto`` in one call;
    returns how many layers failed."""
    features_serial(x, weights_t, biases, code, bias_column, features_t)
    for layer in range(features_t.shape[0]):
        pair_layer(features_t, layer, sums, forward, ridge, scratch[0], info)
    return np.count_nonzero(info)


@nb.njit(**JIT_PARALLEL)
def _pair_parallel(features_t, sums, forward, ridge, scratch, info):
    for layer in nb.prange(features_t.shape[0]):
        pair_layer(features_t, layer, sums, forward, ridge, scratch[nb.get_thread_id()], info)
    return np.count_nonzero(info)


@nb.njit(**JIT)
def observe_pair_parallel(
    x, weights_t, biases, code, bias_column, features_t, sums, forward, ridge, scratch, info
):
    """``observe_pair_serial`` on Numba's threads: the rows in chunks, then the layers (the same bits)."""
    features_parallel(x, weights_t, biases, code, bias_column, features_t)
    return _pair_parallel(features_t, sums, forward, ridge, scratch, info)


@nb.njit(**JIT)
def learn_pair_layer(features_t, layer, targets, predicted, made, rhs, labelled, kept, losses):
    """The labels of the pair's rows, one layer: each candidate's immediate loss ½‖D_l β_l − Y‖² of its prediction
    (predicted (2, L, b, m): -F's, -R's) into losses[:, l], 0 for one that did not predict them (``made`` (2,)
    bool); A_r += the batch's kept Gram (``kept`` (L, n, n); or D_lᵀD_l when it has no layers); c_l += D_lᵀY. The
    bits of ``step_kernels.learn_layer`` and ``step_kernels.label_losses``."""
    for j in range(2):
        losses[j, layer] = half_squared_error(predicted[j, layer], targets) if made[j] else 0.0
    d = features_t[layer].T
    if kept.shape[0] > 0:
        _add_lower(kept[layer].T, labelled[layer].T)
    else:
        add_gram(d, labelled[layer].T)
    fold_labels(d, targets, rhs[layer].T)


@nb.njit(**JIT)
def learn_pair_serial(features_t, targets, predicted, made, rhs, labelled, kept, losses):
    """``learn_pair_layer`` for every layer; returns ‖Y‖²."""
    for layer in range(features_t.shape[0]):
        learn_pair_layer(features_t, layer, targets, predicted, made, rhs, labelled, kept, losses)
    return squared_norm(targets)


@nb.njit(**JIT_PARALLEL)
def learn_pair_parallel(features_t, targets, predicted, made, rhs, labelled, kept, losses):
    for layer in nb.prange(features_t.shape[0]):
        learn_pair_layer(features_t, layer, targets, predicted, made, rhs, labelled, kept, losses)
    return squared_norm(targets)


@nb.njit(**JIT)
def grams_into(features_t, batch_gram):
    """batch_gram_l ← D_lᵀD_l (lower triangles) for every layer: one batch's Gram, formed once for the learners
    that add it (``candidate_step``)."""
    for layer in range(features_t.shape[0]):
        _gram_into(features_t[layer].T, batch_gram[layer].T)


@nb.njit(**JIT_PARALLEL)
def grams_into_parallel(features_t, batch_gram):
    for layer in nb.prange(features_t.shape[0]):
        _gram_into(features_t[layer].T, batch_gram[layer].T)


@nb.njit(**JIT)
def add_lower(src, dst):
    """dst_l += src_l for every layer, lower triangles (a kept batch Gram into another half-life's A, or into A_r
    when the batch's labels come)."""
    for layer in range(src.shape[0]):
        _add_lower(src[layer].T, dst[layer].T)
