"""The fused step kernels (``step_kernels``) and the BLAS/LAPACK they call (``numba_blas``) against NumPy
and the twins in tests/naive.py; every parallel entry point against its serial one, bitwise.

Seeds are fixed and appear in every assertion message.
"""

from __future__ import annotations

import naive
import numba
import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)

from iolstream.core import numba_blas, step_kernels
from iolstream.core.learner_state import LayerArrays
from iolstream.core.network import RandomNetwork


def _tol(dtype):
    return 1e-12 if dtype == np.float64 else 2e-5


# --------------------------------------------------------------------------- numba_blas


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_on_blocks_of_larger_matrices(dtype, trans_a, trans_b):
    """c ← α op(a) op(b) + β c on column-major blocks (leading dimension > rows), rest untouched."""
    seed = 5
    rng = np.random.default_rng(seed)
    m, n, k = 7, 5, 6
    a_big = np.asfortranarray(rng.standard_normal((12, 11)).astype(dtype))
    b_big = rng.standard_normal((9, 13)).astype(dtype).T  # F-ordered (13, 9) as a transposed C array
    c_big = np.asfortranarray(rng.standard_normal((15, 8)).astype(dtype))
    a = a_big[2 : 2 + (k if trans_a else m), 1 : 1 + (m if trans_a else k)]
    b = b_big[3 : 3 + (n if trans_b else k), 2 : 2 + (k if trans_b else n)]
    c = c_big[4 : 4 + m, 1 : 1 + n]
    before = c_big.copy()
    want = (
        2.0 * (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
        + 0.5 * c
    )
    numba_blas.gemm(2.0, a, trans_a, b, trans_b, 0.5, c)
    np.testing.assert_allclose(c, want, rtol=_tol(dtype), atol=_tol(dtype), err_msg=f"seed={seed}")
    outside = np.ones(c_big.shape, dtype=bool)
    outside[4 : 4 + m, 1 : 1 + n] = False
    assert np.array_equal(c_big[outside], before[outside]), "gemm wrote outside its block"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_syrk_lower_touches_the_lower_triangle_only(dtype):
    seed = 6
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((20, 9)).astype(dtype)
    c = np.asfortranarray(rng.standard_normal((9, 9)).astype(dtype))
    before = c.copy()
    numba_blas.syrk_lower(1.5, np.asfortranarray(d), 2.0, c)
    want = 1.5 * d.astype(np.float64).T @ d.astype(np.float64) + 2.0 * before
    np.testing.assert_allclose(
        np.tril(c), np.tril(want), rtol=_tol(dtype), atol=_tol(dtype), err_msg=f"seed={seed}"
    )
    assert np.array_equal(np.triu(c, 1), np.triu(before, 1))


def test_potrf_and_potrs_equal_numpy():
    seed = 7
    rng = np.random.default_rng(seed)
    n, m = 11, 3
    x = rng.standard_normal((n, 25))
    spd = x @ x.T + np.eye(n)
    factor = np.asfortranarray(spd)
    assert numba_blas.potrf_lower(factor) == 0
    np.testing.assert_allclose(np.tril(factor), np.linalg.cholesky(spd), rtol=1e-12, err_msg=f"seed={seed}")
    rhs = np.asfortranarray(rng.standard_normal((n, m)))
    want = np.linalg.solve(spd, rhs)
    assert numba_blas.potrs_lower(factor, rhs) == 0
    np.testing.assert_allclose(rhs, want, rtol=1e-10, err_msg=f"seed={seed}")
    not_spd = np.asfortranarray(np.diag([1.0, -1.0, 1.0]))
    assert numba_blas.potrf_lower(not_spd) == 2  # LAPACK: the leading minor of order 2 is not positive


# --------------------------------------------------------------------------- features


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(6, 21, 3), (10, 128, 4), (4, 512, 2)])
def test_parallel_features_equal_serial_bitwise(dtype, shape):
    """Both kernels compute the same two chunks of rows: the same bits for every batch size
    (one long, uneven split of the rows gave other bits, by up to 1 ulp, for most sizes)."""
    seed = 8
    k, n_nodes, n_layers = shape
    net = RandomNetwork.create(k, n_nodes, n_layers, activation="selu", seed=seed, dtype=dtype)
    for b in (1, 15, 16, 17, 33, 100, 130, 256, 257, 500, 1000):
        x = np.random.default_rng(seed + b).standard_normal((b, k)).astype(dtype)
        serial = np.full((n_layers, net.n_columns, b), np.nan, dtype=dtype)
        parallel = np.full_like(serial, np.nan)
        step_kernels.features_serial(x, *net.kernel_weights, serial)
        step_kernels.features_parallel(x, *net.kernel_weights, parallel)
        assert np.array_equal(serial, parallel), (
            f"b={b} {shape} seed={seed}"
        )  # every entry written, same bits
        assert np.array_equal(net.features(x, parallel=True), serial) and np.array_equal(
            net.features(x), serial
        )
        if b in (17, 256):
            want = naive.edrvfl_features(
                x.astype(np.float64),
                [w.astype(np.float64) for w in net.weights_t],
                [v.astype(np.float64) for v in net.biases],
                "selu",
            )
            for layer in range(n_layers):
                np.testing.assert_allclose(
                    serial[layer].T, want[layer], rtol=_tol(dtype), atol=_tol(dtype) * 10
                )


# --------------------------------------------------------------------------- the update phases


def _stream(seed, dtype, n_layers=3, n=17, m=4, sizes=(40, 1, 25)):
    rng = np.random.default_rng(seed)
    feats = [np.ascontiguousarray(rng.standard_normal((n_layers, n, b)).astype(dtype)) for b in sizes]
    ys = [rng.standard_normal((b, m)) for b in sizes]
    return feats, ys


def _scratch(n):
    return np.full((numba.config.NUMBA_NUM_THREADS, n, n), np.nan)  # the factors of the -F step


def _arrays(n_layers, n, m, track=True):
    arrays = LayerArrays.initial([0.5 + layer for layer in range(n_layers)], n, m, track)
    arrays.factors()  # the kernels write a factor stack of the full size (a learner allocates it when needed)
    return arrays


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_forward_and_learn_equal_twins_and_parallel_equals_serial(dtype):
    """-F in order, labels one batch late, through the phase kernels: A, c, β and the predictions
    equal naive.forward_layer / naive.fold_labels; the parallel kernels give the same bits."""
    seed = 9
    n_layers, n, m = 3, 17, 4
    feats, ys = _stream(seed, dtype, n_layers, n, m)
    serial, parallel = _arrays(n_layers, n, m), _arrays(n_layers, n, m)
    twins = [(np.eye(n) * (0.5 + layer), np.zeros((n, m))) for layer in range(n_layers)]
    for t, (f, _y) in enumerate(zip(feats, ys)):
        outs = []
        for arrays, shared in ((serial, False), (parallel, True)):
            out, info = np.empty((n_layers, f.shape[2], m)), np.zeros(n_layers, dtype=np.int32)
            forward = step_kernels.forward_parallel if shared else step_kernels.forward_serial
            assert forward(f, arrays.gram, _scratch(n), arrays.rhs, arrays.beta, out, info) == 0
            outs.append(out)
        assert np.array_equal(outs[0], outs[1]), f"t={t}: parallel predictions differ, seed={seed}"
        for layer in range(n_layers):
            d = f[layer].T.astype(np.float64)
            a, beta, pred = naive.forward_layer(twins[layer][0], twins[layer][1], d)
            twins[layer] = (a, twins[layer][1])
            rtol = _tol(dtype) if dtype == np.float64 else 1e-4
            msg = f"t={t} layer {layer} {dtype.__name__} seed={seed}"
            np.testing.assert_allclose(
                np.tril(serial.gram[layer].T), np.tril(a), rtol=rtol, atol=rtol, err_msg=msg
            )
            rtol = 1e-9 if dtype == np.float64 else 1e-3
            np.testing.assert_allclose(serial.beta[layer].T, beta, rtol=rtol, atol=1e-9, err_msg=msg)
            np.testing.assert_allclose(outs[0][layer], pred, rtol=rtol, atol=1e-6, err_msg=msg)
        if t > 0:  # labels of the previous batch
            prev, y_prev = feats[t - 1], ys[t - 1]
            pred_prev = np.zeros((n_layers, y_prev.shape[0], m))
            for arrays, shared in ((serial, False), (parallel, True)):
                info = np.zeros(n_layers, dtype=np.int32)
                learn = step_kernels.learn_parallel if shared else step_kernels.learn_serial
                losses = np.empty(n_layers)
                state = (arrays.rhs, arrays.gram, arrays.factor, arrays.gram_labelled)
                sum_y2 = learn(prev, y_prev, pred_prev, *state, False, info, losses)
                assert not info.any()
                np.testing.assert_allclose(losses, 0.5 * (y_prev**2).sum(), rtol=1e-13)  # predicted 0
                np.testing.assert_allclose(sum_y2, (y_prev**2).sum(), rtol=1e-13)
            for layer in range(n_layers):
                c = naive.fold_labels(twins[layer][1], prev[layer].T.astype(np.float64), y_prev)
                twins[layer] = (twins[layer][0], c)
                np.testing.assert_allclose(
                    serial.rhs[layer].T, c, rtol=_tol(dtype) * 10, atol=_tol(dtype) * 10
                )
        for name in ("gram", "factor", "rhs", "beta", "gram_labelled"):
            assert np.array_equal(getattr(serial, name), getattr(parallel, name)), (
                f"t={t}: {name} differs, seed={seed}"
            )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_observe_kernels_equal_the_phases_bitwise(dtype):
    """observe_serial / observe_parallel = features_serial then forward_serial, bit for bit."""
    seed = 12
    n_layers, m, b = 3, 4, 70
    net = RandomNetwork.create(6, 21, n_layers, activation="relu", seed=seed, dtype=dtype)
    n = net.n_columns
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, 6)).astype(dtype)
    rhs = rng.standard_normal((n_layers, m, n))
    results = []
    for variant in ("phases", "serial", "parallel"):
        arrays = _arrays(n_layers, n, m)
        arrays.rhs[:] = rhs
        f, out, info = (
            np.empty((n_layers, n, b), dtype=dtype),
            np.empty((n_layers, b, m)),
            np.zeros(n_layers, np.int32),
        )
        state = (arrays.gram, _scratch(n), arrays.rhs, arrays.beta, out, info)
        if variant == "phases":
            step_kernels.features_serial(x, *net.kernel_weights, f)
            assert step_kernels.forward_serial(f, *state) == 0
        elif variant == "serial":
            assert step_kernels.observe_serial(x, *net.kernel_weights, f, *state) == 0
        else:
            assert step_kernels.observe_parallel(x, *net.kernel_weights, f, *state) == 0
        results.append((f, out, arrays.gram.copy(), arrays.beta.copy()))
    for variant, got in zip(("serial", "parallel"), results[1:]):
        for name, a, b_ in zip(("features", "outputs", "A", "β"), results[0], got):
            assert np.array_equal(a, b_), f"{variant}: {name} differs, seed={seed}"


def test_learn_with_gram_entering_refactors():
    """enter_gram (-R, or rows never observed): A += DᵀD and the factor follows, in one call."""
    seed = 10
    n_layers, n, m = 2, 9, 3
    (f,), (y,) = _stream(seed, np.float64, n_layers, n, m, sizes=(30,))
    arrays = _arrays(n_layers, n, m, track=False)
    info = np.zeros(n_layers, dtype=np.int32)
    args = (arrays.rhs, arrays.gram, arrays.factor, arrays.gram_labelled)
    step_kernels.learn_serial(f, y, np.zeros((n_layers, 30, m)), *args, True, info, np.empty(n_layers))
    assert not info.any()
    for layer in range(n_layers):
        a = (0.5 + layer) * np.eye(n) + f[layer] @ f[layer].T
        np.testing.assert_allclose(
            np.tril(arrays.factor[layer].T), np.linalg.cholesky(a), rtol=1e-12, err_msg=f"seed={seed}"
        )
        np.testing.assert_allclose(arrays.rhs[layer].T, f[layer] @ y, rtol=1e-12, err_msg=f"seed={seed}")


def test_failed_cholesky_is_reported_per_layer():
    n_layers, n, m = 2, 4, 1
    arrays = _arrays(n_layers, n, m, track=False)
    arrays.gram[1] = -np.eye(n)  # layer 1 can never be factored
    info = np.zeros(n_layers, dtype=np.int32)
    f = np.zeros((n_layers, n, 3))
    assert (
        step_kernels.forward_serial(
            f, arrays.gram, _scratch(n), arrays.rhs, arrays.beta, np.empty((n_layers, 3, m)), info
        )
        == 1
    )
    assert info[0] == 0 and info[1] == 1


def test_label_losses_and_abs_max_equal_numpy():
    seed = 11
    rng = np.random.default_rng(seed)
    predicted, targets = rng.standard_normal((3, 20, 4)), rng.standard_normal((20, 4))
    losses = np.empty(3)
    sum_y2 = step_kernels.label_losses(predicted, targets, losses)
    np.testing.assert_allclose(
        losses, 0.5 * ((predicted - targets) ** 2).sum(axis=(1, 2)), rtol=1e-13, err_msg=f"seed={seed}"
    )
    np.testing.assert_allclose(sum_y2, (targets**2).sum(), rtol=1e-13)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    assert step_kernels.abs_max(x) == np.abs(x).max()
    assert step_kernels.abs_max(x[:, ::2]) == np.abs(x[:, ::2]).max()  # any layout
    assert step_kernels.abs_max(np.empty((2, 0))) == 0.0


def test_parallel_kernels_are_compiled_parallel():
    """The parallel entry points really run prange loops (else the tuner would time a no-op)."""
    for kernel in (
        step_kernels.features_parallel,
        step_kernels.forward_parallel,
        step_kernels.learn_parallel,
    ):
        assert kernel.targetoptions.get("parallel"), kernel


# --------------------------------------------------------------------------- shared sums (mode: auto)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_kept_gram_and_pair_kernels_equal_the_separate_ones_bitwise(dtype):
    """``shared_step_kernels``: the -F step keeping the batch's Gram (A += G, G kept) and the pair step (the same, then the
    -R candidate solved on A_r with its λ shift and predicted) equal ``step_kernels``'s separate kernels bit for bit,
    serial and parallel; a -R candidate whose sums did not move predicts with the β it has."""
    from iolstream.core import shared_step_kernels

    seed = 13
    n_layers, m, b = 3, 4, 70
    net = RandomNetwork.create(6, 21, n_layers, activation="relu", seed=seed, dtype=dtype)
    n = net.n_columns
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, 6)).astype(dtype)
    rhs = rng.standard_normal((n_layers, m, n))
    labelled = _arrays(n_layers, n, m).gram  # A_r: λI plus an earlier batch's Gram
    step_kernels.add_grams(np.ascontiguousarray(rng.standard_normal((n_layers, n, 30))), labelled)
    shift = np.array([0.25, 1.0, 2.5])

    # the separate kernels: features, A += DᵀD, -F solve and predict; -R solve and predict from A_r + shift
    f, gram = np.empty((n_layers, n, b), dtype=dtype), _arrays(n_layers, n, m).gram
    beta, out, beta_r, out_r = (
        np.zeros((n_layers, m, n)),
        np.empty((n_layers, b, m)),
        np.zeros((n_layers, m, n)),
        np.empty((n_layers, b, m)),
    )
    info = np.zeros(n_layers, np.int32)
    step_kernels.features_serial(x, *net.kernel_weights, f)
    step_kernels.add_grams(f, gram)
    assert (
        step_kernels.solve_predict_serial(f, gram, np.zeros(n_layers), _scratch(n), rhs, beta, out, info) == 0
    )
    assert step_kernels.solve_predict_serial(f, labelled, shift, _scratch(n), rhs, beta_r, out_r, info) == 0
    gram_alone = np.zeros_like(gram)
    step_kernels.add_grams(f, gram_alone)

    for variant in ("serial", "parallel"):
        tag = f"{variant} {np.dtype(dtype).name} seed={seed}"
        for pair in (False, True):
            g, kept = _arrays(n_layers, n, m).gram, np.zeros((n_layers, n, n))
            f2, info = np.empty((n_layers, n, b), dtype=dtype), np.zeros(n_layers, np.int32)
            b2, o2, br2, or2 = (
                np.zeros_like(beta),
                np.empty_like(out),
                np.zeros_like(beta_r),
                np.empty_like(out_r),
            )
            if pair:
                kernel = getattr(shared_step_kernels, f"observe_pair_{variant}")
                sums, forward, ridge = (g, labelled, kept, rhs), (b2, o2, True), (br2, or2, shift, True)
                assert kernel(x, *net.kernel_weights, f2, sums, forward, ridge, _scratch(n), info) == 0, tag
                assert np.array_equal(br2, beta_r) and np.array_equal(or2, out_r), f"-R: {tag}"
            else:
                kernel = getattr(shared_step_kernels, f"observe_keep_{variant}")
                assert (
                    kernel(x, *net.kernel_weights, f2, g, kept, _scratch(n), rhs, b2, o2, info, True) == 0
                ), tag
            for name, got, want in (("D", f2, f), ("A", g, gram), ("β", b2, beta), ("D β", o2, out)):
                assert np.array_equal(got, want), f"{name}, pair={pair}: {tag}"
            assert np.array_equal(np.tril(kept[0].T), np.tril(gram_alone[0].T)), (
                f"kept Gram, pair={pair}: {tag}"
            )
    # the -R candidate's sums did not move: no solve, the β it has predicts (and the -F side still solves)
    g, kept, info = _arrays(n_layers, n, m).gram, np.zeros((n_layers, n, n)), np.zeros(n_layers, np.int32)
    stale_r, or3 = np.full_like(beta_r, 0.5), np.empty_like(out_r)
    sums, forward, ridge = (
        (g, labelled, kept, rhs),
        (np.zeros_like(beta), np.empty_like(out), True),
        (stale_r, or3, shift, False),
    )
    assert (
        shared_step_kernels.observe_pair_serial(
            x, *net.kernel_weights, f2, sums, forward, ridge, _scratch(n), info
        )
        == 0
    )
    assert np.array_equal(stale_r, np.full_like(beta_r, 0.5))
    want = np.empty_like(out_r)
    step_kernels.predict_all(f, stale_r, want)
    assert np.array_equal(or3, want), f"seed={seed}"


def test_add_lower_adds_the_lower_triangles_only():
    from iolstream.core import shared_step_kernels

    rng = np.random.default_rng(14)
    src, dst = rng.standard_normal((2, 5, 5)), rng.standard_normal((2, 5, 5))
    before = dst.copy()
    shared_step_kernels.add_lower(src, dst)
    for layer in range(2):  # the C block's upper triangle is the matrix's lower one
        np.testing.assert_array_equal(np.triu(dst[layer]), np.triu(before[layer] + src[layer]))
        np.testing.assert_array_equal(np.tril(dst[layer], -1), np.tril(before[layer], -1))
