"""The step kernels: one learner's whole step fused into few Numba calls (features, Gram + Cholesky or Woodbury
update, β, prediction, fold-in). The steps of learners sharing one set of sums are in ``shared_step_kernels``.

Each kernel does a whole phase of a step in one call (``observe_*``: features and update;
``learn_*``: losses and fold-in), so the per-call Python and f2py overhead is paid once per
phase, not once per layer and routine. Every phase has a serial and a parallel entry point
(Numba ``prange``): the features split the batch's rows into chunks, the updates split the
layers (independent sub-learners), and the results are bitwise those of the serial kernels
(tests/core/test_step_kernels.py). BLAS runs single-threaded in each thread. A parallel region ends at
a barrier that waits for every thread: ~1.5× faster on an idle 2-core machine, 5–15 ms late
whenever another process holds the other core; so whether it pays is decided step by step,
by timing (``step_tuner.StepTuner``).

Array conventions (see ``learner_state.LayerArrays``): stacks are C-ordered with the layer
first; ``gram[l].T`` is A_l (column-major, lower triangle authoritative), ``factor[l].T`` its
lower Cholesky factor, ``rhs[l].T`` is c_l and ``beta[l].T`` is β_l, both (n, m).
``features_t`` is (L, n, b) C-ordered, so ``features_t[l].T`` is D_l (b, n) column-major.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from iolstream.core.activation_kernels import JIT, activate
from iolstream.core.numba_blas import gemm, potrf_lower, potrs_lower, syrk_lower, trsm_right_lower_t

JIT_PARALLEL = dict(JIT, parallel=True)
ROW_ALIGN = 16  # row chunks start on multiples of 16 rows (whole cache lines of float32/float64)
FEATURE_CHUNKS = (
    2  # the features are computed in 2 chunks of rows, serial or parallel (fixed: see features_serial)
)


# ----------------------------------------------------------------------------- features


@nb.njit(**JIT)
def features_rows(x, weights_t, biases, code, bias_column, out, r0, r1, shift):
    """D_lᵀ for rows r0:r1 of ``out`` (the inputs are rows r0 + shift : r1 + shift of ``x``), every
    layer, eqs. (1)-(2). A layer needs only the same rows of the layer below.

    x         : (b, k) C-ordered scaled inputs, the dtype of ``out``
    weights_t : (L, N, N + k) packed W_lᵀ (layer 1 uses the first k columns)
    biases    : (L, N)
    out       : (L, n, rows) C-ordered, n = N + k (+ 1 with the bias column)
    """
    n_layers, n, _ = out.shape
    n_nodes, fan_all = weights_t.shape[1], weights_t.shape[2]
    k = fan_all - n_nodes
    for layer in range(n_layers):
        d_t = out[layer]
        for j in range(k):
            for i in range(r0, r1):
                d_t[n_nodes + j, i] = x[i + shift, j]
        if bias_column:
            for i in range(r0, r1):
                d_t[n - 1, i] = 1.0
        fan_in = k if layer == 0 else fan_all
        source = out[0, n_nodes:fan_all] if layer == 0 else out[layer - 1, :fan_all]  # [H_{l-1} | X]ᵀ
        # H_l (rows × N) = [H_{l-1} | X] (rows × fan_in) · W_l (fan_in × N), column-major views
        gemm(1.0, source.T[r0:r1], False, weights_t[layer].T[:fan_in], False, 0.0, d_t.T[r0:r1, :n_nodes])
        bias = biases[layer]
        if code == 0:  # relu, the common case: a branch-free loop the compiler vectorises
            for j in range(n_nodes):
                bj = bias[j]
                for i in range(r0, r1):
                    d_t[j, i] = max(d_t[j, i] + bj, 0.0)
        else:
            for j in range(n_nodes):
                bj = bias[j]
                for i in range(r0, r1):
                    d_t[j, i] = activate(d_t[j, i] + bj, code)


@nb.njit(**JIT)
def chunk_rows(b, chunk):
    """Rows [r0, r1) of chunk 0 or 1 of a batch of b rows (split at a multiple of ROW_ALIGN)."""
    middle = min(b, (b // 2 + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN)
    return (0, middle) if chunk == 0 else (middle, b)


@nb.njit(**JIT)
def features_serial(x, weights_t, biases, code, bias_column, out):
    """D_lᵀ for every layer, written into ``out`` (L, n, b), chunk by chunk as the parallel
    kernel computes it: OpenBLAS's result for a row can depend on how the rows are split, so
    both kernels split them the same way (FEATURE_CHUNKS) and give the same bits."""
    for chunk in range(FEATURE_CHUNKS):
        r0, r1 = chunk_rows(out.shape[2], chunk)
        if r1 > r0:
            features_rows(x, weights_t, biases, code, bias_column, out, r0, r1, 0)


@nb.njit(**JIT)
def features_chunk(x, weights_t, biases, code, bias_column, out, chunk):
    """One chunk of ``features_serial``, so that threads can share the batch. The first chunk
    is written in place; the second is computed in a private block and then copied into
    ``out``: two threads writing interleaved pieces of the same rows of ``out`` (1 KB apart for
    b = 256) cost ~40 % in cache-line traffic."""
    n_layers, n, b = out.shape
    r0, r1 = chunk_rows(b, chunk)
    if r1 <= r0:
        return
    if chunk == 0:
        features_rows(x, weights_t, biases, code, bias_column, out, r0, r1, 0)
        return
    part = np.empty((n_layers, n, r1 - r0), out.dtype)
    features_rows(x, weights_t, biases, code, bias_column, part, 0, r1 - r0, r0)
    for layer in range(n_layers):  # row by row, contiguous runs (faster than a 3-D slice assignment)
        for j in range(n):
            src, dst = part[layer, j], out[layer, j, r0:r1]
            for i in range(r1 - r0):
                dst[i] = src[i]


@nb.njit(**JIT_PARALLEL)
def features_parallel(x, weights_t, biases, code, bias_column, out):
    """``features_serial`` with its chunks on Numba's threads (the same bits)."""
    for chunk in nb.prange(FEATURE_CHUNKS):
        features_chunk(x, weights_t, biases, code, bias_column, out, chunk)


# ----------------------------------------------------------------------- per-layer pieces


@nb.njit(**JIT)
def add_gram(d, gram_l):
    """Lower triangle of A ← A + DᵀD (d: (b, n) column-major D; gram_l: (n, n) column-major).

    float64 features: one dsyrk in place. float32: ssyrk (twice the rate) into a float32
    scratch, accumulated into the float64 A.
    """
    if d.itemsize == 8:
        syrk_lower(1.0, d, 1.0, gram_l)
        return
    n = d.shape[1]
    part = np.empty((n, n), d.dtype).T
    syrk_lower(1.0, d, 0.0, part)
    for j in range(n):
        for i in range(j, n):
            gram_l[i, j] += part[i, j]


@nb.njit(**JIT)
def _sub_gram(d, gram_l):
    """Lower triangle of A ← A − DᵀD (a downdate: ``_add_gram`` with the sign turned)."""
    if d.itemsize == 8:
        syrk_lower(-1.0, d, 1.0, gram_l)
        return
    n = d.shape[1]
    part = np.empty((n, n), d.dtype).T
    syrk_lower(1.0, d, 0.0, part)
    for j in range(n):
        for i in range(j, n):
            gram_l[i, j] -= part[i, j]


@nb.njit(**JIT)
def _cholesky(gram_l, factor_l):
    """factor_l ← lower Cholesky factor of A_l (both C blocks, i.e. transposed column-major
    matrices); returns LAPACK's info (0 on success)."""
    return _cholesky_shifted(gram_l, 0.0, factor_l)


@nb.njit(**JIT)
def _cholesky_shifted(gram_l, shift, factor_l):
    """factor_l ← lower Cholesky factor of A_l + shift·I; returns LAPACK's info. Only the lower triangle is
    copied (all dpotrf reads); the upper one is left as it was. A λ candidate factors its primary's A with
    its own λ on the diagonal this way (``shared_gram``), the same bits as factoring a shifted copy."""
    n = gram_l.shape[0]
    for j in range(n):  # row j of the C blocks = column j of the matrices
        for i in range(j, n):
            factor_l[j, i] = gram_l[j, i]
        factor_l[j, j] = gram_l[j, j] + shift
    return potrf_lower(factor_l.T)


@nb.njit(**JIT)
def refactor_layer(layer, gram, factor):
    """factor_l ← Cholesky(A_l), in the stack; returns info."""
    return _cholesky(gram[layer], factor[layer])


@nb.njit(**JIT)
def solve_layer(layer, factor, rhs, beta):
    """β_l = A_l⁻¹ c_l from the Cholesky factor in the stack (Theorem 1); returns info."""
    return _solve(factor[layer], layer, rhs, beta)


@nb.njit(**JIT)
def _solve(factor_l, layer, rhs, beta):
    _copy(rhs[layer], beta[layer])
    return potrs_lower(factor_l.T, beta[layer].T)


@nb.njit(**JIT)
def _copy(src, dst):
    """dst ← src for two 2-D arrays of one shape (the dtype of ``dst``), element by element. A slice
    assignment (``dst[:] = src``) compiles NumPy's shape-mismatch message with it (f-strings and
    ``str.join`` for every kernel that inlines it): about a third of a cold start's compile time."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@nb.njit(**JIT)
def predict_layer(features_t, layer, beta, out):
    """out[l] = D_l β_l, (b, m), computed as the column-major (m, b) product β_lᵀ D_lᵀ.

    float32 features: β is rounded to float32 and the product runs in float32.
    """
    d = features_t[layer].T
    n_outputs, n = beta.shape[1], beta.shape[2]
    if d.itemsize == 8:
        gemm(1.0, beta[layer].T, True, d, True, 0.0, out[layer].T)
        return
    beta32 = np.empty((n_outputs, n), d.dtype)
    _copy(beta[layer], beta32)
    part = np.empty((d.shape[0], n_outputs), d.dtype)
    gemm(1.0, beta32.T, True, d, True, 0.0, part.T)
    _copy(part, out[layer])


@nb.njit(**JIT)
def woodbury_update(inverse, d_t):
    """P ← P − P Dᵀ (I + D P Dᵀ)⁻¹ D P, in place (Algorithms 1–2, Sherman–Morrison–Woodbury).

    inverse : (n, n) float64, symmetric positive definite P = A⁻¹ (η in the paper), either order
    d_t     : (n, b) float64 C-ordered, Dᵀ of the batch entering A
    S = I + D P Dᵀ = L Lᵀ by Cholesky, then with K = L⁻¹ D P the update is KᵀK; the result is
    re-symmetrised, which keeps P positive definite over long streams (float32 without it
    diverges: docs/benchmarks.md, "The update's building blocks"). Only BLAS and LAPACK calls
    (``numba_blas``): NumPy's ``linalg`` in a kernel costs ~20 s of compilation at a cold start. P is passed to BLAS as it lies in memory: read
    either way it is P, being symmetric.
    """
    n, b = d_t.shape
    d = d_t.T  # D, (b, n) column-major
    p_dt = np.empty((b, n)).T  # P Dᵀ, (n, b) column-major
    gemm(1.0, inverse, False, d, True, 0.0, p_dt)
    s = np.empty((b, b)).T  # S = I + D P Dᵀ
    gemm(1.0, d, False, p_dt, False, 0.0, s)
    for i in range(b):
        s[i, i] += 1.0
    if potrf_lower(s) != 0:
        raise ValueError("woodbury_update: I + D P Dᵀ is not positive definite (P lost definiteness)")
    trsm_right_lower_t(s, p_dt)  # P Dᵀ L⁻ᵀ = Kᵀ, (n, b)
    update = np.empty((n, n)).T
    gemm(1.0, p_dt, False, p_dt, True, 0.0, update)  # KᵀK = P Dᵀ S⁻¹ D P
    for i in range(n):
        for j in range(i, n):
            v = 0.5 * ((inverse[i, j] - update[i, j]) + (inverse[j, i] - update[j, i]))
            inverse[i, j] = v
            inverse[j, i] = v
    return inverse


@nb.njit(**JIT)
def fold_labels(d, targets, rhs_l):
    """c_l ← c_l + D_lᵀ Y: the product (Yᵀ D)ᵀ in the dtype of D, then the sum in float64.

    targets : (b, m) C-ordered float64 (so ``targets.T`` is a column-major Yᵀ)
    """
    if d.itemsize == 8:
        rhs_l += _yt_d(targets.T, d)
    else:
        rhs_l += _yt_d(targets.astype(d.dtype).T, d)


@nb.njit(**JIT)
def _unfold_labels(d, targets, rhs_l):
    """c_l ← c_l − D_lᵀ Y (``_fold_labels`` with the sign turned)."""
    if d.itemsize == 8:
        rhs_l -= _yt_d(targets.T, d)
    else:
        rhs_l -= _yt_d(targets.astype(d.dtype).T, d)


@nb.njit(**JIT)
def _yt_d(y_t, d):
    """(Yᵀ D)ᵀ, (n, m), of a column-major Yᵀ (m, b) and D (b, n) of one dtype."""
    part = np.empty((d.shape[1], y_t.shape[0]), d.dtype)  # C (n, m) = column-major (m, n)
    gemm(1.0, y_t, False, d, False, 0.0, part.T)
    return part


# ------------------------------------------------------------------------- whole phases


@nb.njit(**JIT)
def solve_predict_layer(features_t, layer, gram, shift, scratch, rhs, beta, out, info):
    """β_l = (A_l + shift·I)⁻¹ c_l by a Cholesky factor in ``scratch``, then, if ``out`` has rows,
    out[l] = D_l β_l. ``gram`` and ``rhs`` may be another learner's (a λ candidate reads its primary's sums,
    ``shared_gram``); info[l] as in ``forward_layer``."""
    info[layer] = _cholesky_shifted(gram[layer], shift, scratch)
    if info[layer] != 0:
        return
    info[layer] = _solve(scratch, layer, rhs, beta)
    if out.shape[1] > 0:
        predict_layer(features_t, layer, beta, out)


@nb.njit(**JIT)
def forward_layer(features_t, layer, gram, scratch, rhs, beta, out, info):
    """-F for one layer (Algorithm 2): A_l += D_lᵀD_l, β_l = A_l⁻¹c_l by a Cholesky factor in
    ``scratch`` (n, n), and, if ``out`` has rows, the prediction D_l β_l. info[l]: 0, LAPACK's
    column of a failed Cholesky (> 0), or an illegal-argument code of dpotrs (< 0).

    The factor is not kept: until A changes again only β is used, and the scratch block stays in
    cache where a per-layer factor would cost a round trip to memory for each layer (~5 %).
    """
    add_gram(features_t[layer].T, gram[layer].T)
    solve_predict_layer(features_t, layer, gram, 0.0, scratch, rhs, beta, out, info)


@nb.njit(**JIT)
def forward_serial(features_t, gram, scratch, rhs, beta, out, info):
    """``forward_layer`` for every layer (scratch: (threads, n, n)); returns how many failed."""
    for layer in range(features_t.shape[0]):
        forward_layer(features_t, layer, gram, scratch[0], rhs, beta, out, info)
    return np.count_nonzero(info)


@nb.njit(**JIT_PARALLEL)
def forward_parallel(features_t, gram, scratch, rhs, beta, out, info):
    """``forward_serial`` with the layers spread over Numba's threads, one scratch block each."""
    for layer in nb.prange(features_t.shape[0]):
        forward_layer(features_t, layer, gram, scratch[nb.get_thread_id()], rhs, beta, out, info)
    return np.count_nonzero(info)


@nb.njit(**JIT)
def observe_serial(x, weights_t, biases, code, bias_column, features_t, gram, scratch, rhs, beta, out, info):
    """``features_serial`` then ``forward_serial``: a whole -F observe step in one call."""
    features_serial(x, weights_t, biases, code, bias_column, features_t)
    return forward_serial(features_t, gram, scratch, rhs, beta, out, info)


@nb.njit(**JIT)
def observe_parallel(
    x, weights_t, biases, code, bias_column, features_t, gram, scratch, rhs, beta, out, info
):
    """``observe_serial`` on Numba's threads: the rows in chunks, then the layers (two parallel
    regions, one after the other; the same bits)."""
    features_parallel(x, weights_t, biases, code, bias_column, features_t)
    return forward_parallel(features_t, gram, scratch, rhs, beta, out, info)


@nb.njit(**JIT)
def add_grams(features_t, gram):
    """A_l += D_lᵀD_l for every layer, and nothing else (the sums of a learner that does not predict this batch,
    or one batch Gram that several learners then add, ``candidate_step``)."""
    for layer in range(features_t.shape[0]):
        add_gram(features_t[layer].T, gram[layer].T)


@nb.njit(**JIT_PARALLEL)
def add_grams_parallel(features_t, gram):
    for layer in nb.prange(features_t.shape[0]):
        add_gram(features_t[layer].T, gram[layer].T)


@nb.njit(**JIT)
def solve_predict_serial(features_t, gram, shift, scratch, rhs, beta, out, info):
    """``solve_predict_layer`` for every layer (scratch: (threads, n, n)); returns how many failed."""
    for layer in range(features_t.shape[0]):
        solve_predict_layer(features_t, layer, gram, shift[layer], scratch[0], rhs, beta, out, info)
    return np.count_nonzero(info)


@nb.njit(**JIT_PARALLEL)
def solve_predict_parallel(features_t, gram, shift, scratch, rhs, beta, out, info):
    for layer in nb.prange(features_t.shape[0]):
        solve_predict_layer(
            features_t, layer, gram, shift[layer], scratch[nb.get_thread_id()], rhs, beta, out, info
        )
    return np.count_nonzero(info)


@nb.njit(**JIT)
def learn_layer(
    features_t, layer, targets, predicted, rhs, gram, factor, gram_labelled, enter_gram, info, losses
):
    """Labelled rows for one layer: the immediate loss ½‖D_l β_l − Y‖² of ``predicted`` into
    losses[l]; c_l += D_lᵀY; if ``enter_gram`` (-R, or rows never observed) also A_l += D_lᵀD_l and
    refactor (info[l] as in ``forward_layer``); A_r += D_lᵀD_l when ``gram_labelled`` has layers.

    targets : (b, m) C-ordered float64; predicted : (L, b, m) float64
    """
    losses[layer] = half_squared_error(predicted[layer], targets)
    d = features_t[layer].T
    if enter_gram:
        add_gram(d, gram[layer].T)
        info[layer] = refactor_layer(layer, gram, factor)
    if gram_labelled.shape[0] > 0:
        add_gram(d, gram_labelled[layer].T)
    fold_labels(d, targets, rhs[layer].T)


@nb.njit(**JIT)
def learn_serial(features_t, targets, predicted, rhs, gram, factor, gram_labelled, enter_gram, info, losses):
    """``learn_layer`` for every layer; returns ‖Y‖²."""
    for layer in range(features_t.shape[0]):
        learn_layer(
            features_t, layer, targets, predicted, rhs, gram, factor, gram_labelled, enter_gram, info, losses
        )
    return squared_norm(targets)


@nb.njit(**JIT_PARALLEL)
def learn_parallel(
    features_t, targets, predicted, rhs, gram, factor, gram_labelled, enter_gram, info, losses
):
    """``learn_serial`` with the layers spread over Numba's threads."""
    for layer in nb.prange(features_t.shape[0]):
        learn_layer(
            features_t, layer, targets, predicted, rhs, gram, factor, gram_labelled, enter_gram, info, losses
        )
    return squared_norm(targets)


@nb.njit(**JIT)
def half_squared_error(predicted_l, targets):
    total = 0.0
    for i in range(targets.shape[0]):
        for j in range(targets.shape[1]):
            r = predicted_l[i, j] - targets[i, j]
            total += r * r
    return 0.5 * total


@nb.njit(**JIT)
def squared_norm(targets):
    total = 0.0
    for i in range(targets.shape[0]):
        for j in range(targets.shape[1]):
            total += targets[i, j] * targets[i, j]
    return total


@nb.njit(**JIT)
def label_losses(predicted, targets, losses):
    """losses[l] = ½‖predicted[l] − Y‖² (the immediate loss L_{l,t}); returns ‖Y‖².

    predicted : (L, b, m) float64; targets : (b, m) float64; summed row by row in float64.
    """
    for layer in range(predicted.shape[0]):
        losses[layer] = half_squared_error(predicted[layer], targets)
    return squared_norm(targets)


@nb.njit(**JIT)
def abs_max(a):
    """max |a| over every element (0 for an empty array); no temporary array."""
    top = 0.0
    for v in a.flat:
        top = max(top, abs(v))
    return top


@nb.njit(**JIT)
def predict_all(features_t, beta, out):
    for layer in range(features_t.shape[0]):
        predict_layer(features_t, layer, beta, out)


# ------------------------------------------------------------------------- erasure (docs/design.md §13)


@nb.njit(**JIT)
def _sub_given(gram_l, given, layer, weights):
    """Lower triangle of A_l ← A_l − Σ_k w_k G_k,l (``given``: (K, L, n, n) Grams laid out as A's stack)."""
    n = gram_l.shape[0]
    for k in range(given.shape[0]):
        g, w = given[k, layer].T, weights[k]
        for j in range(n):
            for i in range(j, n):
                gram_l[i, j] -= w * g[i, j]


@nb.njit(**JIT)
def erase_layer(
    grams_t,
    labelled_t,
    targets,
    layer,
    gram,
    factor,
    rhs,
    gram_labelled,
    scratch,
    given,
    weights,
    check,
    info,
):
    """Rows out of layer l's sums: A_l −= DᵀD over ``grams_t`` (L, n, bg) and A_r −= DᵀD over ``labelled_t``
    (L, n, bl) (rows scaled by √w) — or, when ``given`` has Grams ((K, L, n, n), their rows' ``weights`` (K,)),
    A_l and A_r (its rows all labelled) −= Σ w_k G_k; then c_l −= DᵀY over ``labelled_t`` with ``targets``
    (bl, m) scaled to match; then A_l factored again from the sums into ``factor`` (and A_r into ``scratch``
    when ``check``). info[l]: 0, or the column of a failed Cholesky (A_l: > 0; A_r: its column + n)."""
    r_layers = gram_labelled.shape[0]
    if given.shape[0] > 0:
        _sub_given(gram[layer].T, given, layer, weights)
        if r_layers > 0 and labelled_t.shape[2] > 0:
            _sub_given(gram_labelled[layer].T, given, layer, weights)
    else:
        _sub_gram(grams_t[layer].T, gram[layer].T)
        if r_layers > 0 and labelled_t.shape[2] > 0:
            _sub_gram(labelled_t[layer].T, gram_labelled[layer].T)
    if labelled_t.shape[2] > 0:
        _unfold_labels(labelled_t[layer].T, targets, rhs[layer].T)
    info[layer] = refactor_layer(layer, gram, factor)
    if info[layer] == 0 and check and r_layers > 0:
        failed = _cholesky(gram_labelled[layer], scratch)
        if failed != 0:
            info[layer] = failed + gram.shape[1]


@nb.njit(**JIT)
def erase_serial(
    grams_t, labelled_t, targets, gram, factor, rhs, gram_labelled, scratch, given, weights, check, info
):
    """``erase_layer`` for every layer (scratch: (threads, n, n)); returns how many failed."""
    for layer in range(gram.shape[0]):
        erase_layer(
            grams_t,
            labelled_t,
            targets,
            layer,
            gram,
            factor,
            rhs,
            gram_labelled,
            scratch[0],
            given,
            weights,
            check,
            info,
        )
    return np.count_nonzero(info)


@nb.njit(**JIT_PARALLEL)
def erase_parallel(
    grams_t, labelled_t, targets, gram, factor, rhs, gram_labelled, scratch, given, weights, check, info
):
    """``erase_serial`` with the layers spread over Numba's threads."""
    for layer in nb.prange(gram.shape[0]):
        erase_layer(
            grams_t,
            labelled_t,
            targets,
            layer,
            gram,
            factor,
            rhs,
            gram_labelled,
            scratch[nb.get_thread_id()],
            given,
            weights,
            check,
            info,
        )
    return np.count_nonzero(info)
