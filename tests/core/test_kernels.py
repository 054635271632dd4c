"""Every kernel against its plain-NumPy twin in tests/naive.py (STYLE.md, "Testing habits").

Covers ``activation_kernels`` (activations, Woodbury update, softmax), ``step_kernels`` (hidden layers), ``network``
(features, weight inits, seeding) and ``gram_cholesky`` (Gram update, Cholesky helpers).
Seeds are fixed and appear in every assertion message.
"""

from __future__ import annotations

import warnings

import naive
import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)

from iolstream.core import activation_kernels, gram_cholesky, step_kernels
from iolstream.core.network import INITS, RandomNetwork


def _tol(dtype):
    """(rtol, atol) for a result of ``dtype`` against a float64 twin."""
    return (1e-12, 1e-12) if dtype == np.float64 else (2e-5, 2e-5)


# --------------------------------------------------------------------------- hidden layer (step_kernels.features_serial)


def _forward(weights_t, inputs_t, bias, activation):
    """g(W·input + b) through ``step_kernels.features_serial`` on a one-layer network whose input is ``inputs_t``."""
    n_nodes, fan_in = weights_t.shape
    b = inputs_t.shape[1]
    packed = np.zeros((1, n_nodes, n_nodes + fan_in), dtype=weights_t.dtype)
    packed[0, :, :fan_in] = weights_t
    out = np.empty((1, n_nodes + fan_in, b), dtype=weights_t.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid warnings from the kernel
        code = activation_kernels.ACTIVATION_CODES[activation]
        step_kernels.features_serial(np.ascontiguousarray(inputs_t.T), packed, bias[None], code, False, out)
    assert np.array_equal(out[0, n_nodes:], inputs_t), "the input columns X of D"
    return out[0, :n_nodes]


def test_every_activation_has_a_twin():
    z = np.linspace(-3, 3, 7)
    for name in activation_kernels.ACTIVATIONS:
        assert naive.activation(z, name).shape == z.shape


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", activation_kernels.ACTIVATIONS)
def test_hidden_layer_equals_twin(activation, dtype):
    seed = 11
    rng = np.random.default_rng(seed)
    n_nodes, fan_in, b = 13, 7, 9
    w_t = rng.standard_normal((n_nodes, fan_in)).astype(dtype)
    x_t = (3 * rng.standard_normal((fan_in, b))).astype(dtype)
    bias = rng.standard_normal(n_nodes).astype(dtype)
    got = _forward(w_t, x_t, bias, activation)
    assert got.dtype == dtype
    want = naive.activation(
        x_t.T.astype(np.float64) @ w_t.T.astype(np.float64) + bias.astype(np.float64), activation
    ).T
    rtol, atol = _tol(dtype)
    np.testing.assert_allclose(
        got, want, rtol=rtol, atol=atol, err_msg=f"{activation} {dtype.__name__} seed={seed}"
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", activation_kernels.ACTIVATIONS)
def test_hidden_layer_extreme_inputs(activation, dtype):
    """Pre-activations of ±700 (and ±1e4, beyond exp's range) give finite values, no warnings."""
    z = np.array([-1e4, -700.0, -100.0, -1.0, -1e-30, 0.0, 1e-30, 1.0, 100.0, 700.0, 1e4])
    w_t = np.eye(z.size, dtype=dtype)  # the pre-activation is the input itself
    got = _forward(w_t, z[:, None].astype(dtype), np.zeros(z.size, dtype=dtype), activation)[:, 0]
    assert np.isfinite(got).all(), f"{activation} {dtype.__name__}: {got}"
    inner = np.abs(z) <= 700  # the twin's exp overflows beyond that
    with np.errstate(over="ignore"):
        want = naive.activation(z, activation)
    tiny = np.finfo(dtype).tiny  # float32 results below it are subnormal: absolute precision only
    np.testing.assert_allclose(
        got[inner], want[inner], rtol=_tol(dtype)[0], atol=tiny, err_msg=f"{activation} {dtype}"
    )
    limits = {  # g(-1e4), g(1e4)
        "relu": (0.0, 1e4),
        "sigmoid": (0.0, 1.0),
        "tanh": (-1.0, 1.0),
        "selu": (-naive.SELU_SCALE * naive.SELU_ALPHA, naive.SELU_SCALE * 1e4),
        "swish": (0.0, 1e4),
        "leaky_relu": (-100.0, 1e4),
    }[activation]
    np.testing.assert_allclose(got[[0, -1]], limits, rtol=1e-6, atol=tiny, err_msg=f"{activation} {dtype}")


# --------------------------------------------------------------------------- woodbury_update


@pytest.mark.parametrize("b", [1, 3, 25])
def test_woodbury_update_equals_twin(b):
    seed = 100 + b
    rng = np.random.default_rng(seed)
    n = 17
    a = rng.standard_normal((n, 2 * n))
    eta = np.linalg.inv(a @ a.T / n + 0.5 * np.eye(n))
    eta = np.asfortranarray((eta + eta.T) / 2)
    d = rng.standard_normal((b, n))
    want = naive.woodbury(eta, d)
    got = eta.copy(order="F")
    step_kernels.woodbury_update(got, np.ascontiguousarray(d.T))
    np.testing.assert_allclose(
        got, want, rtol=1e-10, atol=1e-12 * np.abs(want).max(), err_msg=f"b={b} seed={seed}"
    )
    assert np.array_equal(got, got.T), f"P not exactly symmetric, seed={seed}"
    np.linalg.cholesky(got)  # still positive definite
    # η_new = (η⁻¹ + DᵀD)⁻¹: the identity the update stands for
    np.testing.assert_allclose(
        got @ (np.linalg.inv(eta) + d.T @ d), np.eye(n), atol=1e-9, err_msg=f"seed={seed}"
    )


# --------------------------------------------------------------------------- softmax_rows


def test_softmax_rows_equals_twin_and_is_stable():
    seed = 5
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((6, 4)) * 10
    z[1] = [1e300, -1e300, 0.0, 1e300]  # huge scores: shift by the row maximum
    z[2] = [800.0, 799.0, -800.0, 0.0]  # exp(800) alone would overflow
    z[3] = [-1e308, -1e308, -1e308, -1e308]
    z[4] = [1e-300, 0.0, -1e-300, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = activation_kernels.softmax_rows(z)
    assert np.isfinite(got).all() and (got >= 0).all(), f"seed={seed}: {got}"
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(got, naive.softmax(z), rtol=1e-13, atol=1e-300, err_msg=f"seed={seed}")
    np.testing.assert_allclose(got[1], [0.5, 0.0, 0.0, 0.5])
    np.testing.assert_allclose(got[3], [0.25] * 4)
    shifted = activation_kernels.softmax_rows(z[[0, 5]] + 1e3)  # invariant to a constant shift per row
    np.testing.assert_allclose(shifted, got[[0, 5]], rtol=1e-10, atol=1e-15)


# --------------------------------------------------------------------------- RandomNetwork


@pytest.mark.parametrize("bias_column", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", activation_kernels.ACTIVATIONS)
def test_network_features_equal_twin(activation, dtype, bias_column):
    seed = 3
    k, n_nodes, n_layers, b = 6, 11, 3, 20
    net = RandomNetwork.create(
        k,
        n_nodes,
        n_layers,
        activation=activation,
        init="xavier",
        seed=seed,
        dtype=dtype,
        bias_column=bias_column,
    )
    x = np.random.default_rng(seed + 1).standard_normal((b, k))
    got = net.features(x)
    assert got.shape == (n_layers, n_nodes + k + int(bias_column), b) and got.dtype == dtype
    assert got.flags.c_contiguous
    assert net.n_columns == got.shape[1]
    w64 = [w.astype(np.float64) for w in net.weights_t]
    b64 = [v.astype(np.float64) for v in net.biases]
    # The twin in float64 on the same (dtype-rounded) weights and inputs.
    want = naive.edrvfl_features(
        x.astype(dtype).astype(np.float64), w64, b64, activation, bias_column=bias_column
    )
    rtol, atol = _tol(dtype)
    for layer in range(n_layers):
        np.testing.assert_allclose(
            got[layer].T,
            want[layer],
            rtol=rtol,
            atol=atol * max(1.0, np.abs(want[layer]).max()),
            err_msg=f"layer {layer}, {activation}, {dtype.__name__}, bias_column={bias_column}, seed={seed}",
        )


@pytest.mark.parametrize("init", INITS)
def test_init_scales(init):
    """Empirical scale of every layer's weights and biases (≥ 30,000 draws per layer: ±3 % holds easily)."""
    seed = 21
    k, n_nodes = 150, 200
    net = RandomNetwork.create(k, n_nodes, 2, init=init, seed=seed)
    for layer, (w_t, bias) in enumerate(zip(net.weights_t, net.biases)):
        fan_in = k if layer == 0 else n_nodes + k
        assert w_t.shape == (n_nodes, fan_in) and bias.shape == (n_nodes,)
        expected_std = {
            "auto": np.sqrt(2.0 / (fan_in + n_nodes)),  # ReLU (the default activation): xavier
            "spread": 1.0 / np.sqrt(fan_in),  # ReLU: pre-activations spread over ±1 (network.SPREAD_OTHERS)
            "normal": 1.0,
            "xavier": np.sqrt(2.0 / (fan_in + n_nodes)),
            "kaiming": np.sqrt(2.0 / fan_in),
            "uniform": np.sqrt(3.0 / fan_in) / np.sqrt(3.0),  # U(-a, a) has std a/√3
        }[init]
        msg = f"{init} layer {layer} seed={seed}"
        assert abs(w_t.std() / expected_std - 1) < 0.03, f"{msg}: std {w_t.std()} vs {expected_std}"
        assert abs(w_t.mean()) < 0.03 * expected_std, msg
        if init == "uniform":
            bound = np.sqrt(3.0 / fan_in)
            assert np.abs(w_t).max() <= bound and np.abs(bias).max() <= bound, msg
            assert np.abs(w_t).max() > 0.99 * bound, msg


def test_one_seed_reproduces_the_whole_network():
    kw = dict(activation="tanh", init="kaiming", dtype=np.float64)
    one, two = RandomNetwork.create(4, 9, 3, seed=7, **kw), RandomNetwork.create(4, 9, 3, seed=7, **kw)
    other = RandomNetwork.create(4, 9, 3, seed=8, **kw)
    for layer in range(3):
        assert np.array_equal(one.weights_t[layer], two.weights_t[layer]), f"layer {layer}, seed=7"
        assert np.array_equal(one.biases[layer], two.biases[layer]), f"layer {layer}, seed=7"
        assert not np.array_equal(one.weights_t[layer], other.weights_t[layer]), (
            f"layer {layer}, seeds 7 vs 8"
        )
    x = np.random.default_rng(0).standard_normal((5, 4))
    assert np.array_equal(one.features(x), two.features(x))
    # float32 weights are the float64 draws rounded: the dtype does not change the random stream.
    net32 = RandomNetwork.create(4, 9, 3, seed=7, activation="tanh", init="kaiming", dtype=np.float32)
    assert np.array_equal(net32.weights_t[2], one.weights_t[2].astype(np.float32))


def test_network_rejects_unknown_names():
    with pytest.raises(ValueError, match="activation"):
        RandomNetwork.create(3, 4, 1, activation="gelu")
    with pytest.raises(ValueError, match="init"):
        RandomNetwork.create(3, 4, 1, init="orthogonal")


def test_ensemble_kernels_equal_numpy_bitwise():
    """layer_mean and softmax_mean give the bits of the NumPy expressions they replace."""
    seed = 51
    outputs = 5 * np.random.default_rng(seed).standard_normal((4, 33, 7))
    assert np.array_equal(activation_kernels.layer_mean(outputs), outputs.mean(axis=0)), f"seed={seed}"
    want = sum(activation_kernels.softmax_rows(out) for out in outputs) / 4
    assert np.array_equal(activation_kernels.softmax_mean(outputs), want), f"seed={seed}"
    np.testing.assert_allclose(
        activation_kernels.softmax_mean(outputs),
        np.mean([naive.softmax(o) for o in outputs], axis=0),
        rtol=1e-14,
    )


# --------------------------------------------------------------------------- linalg


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gram_update_equals_dtd(dtype, order):
    seed = 31
    rng = np.random.default_rng(seed)
    n = 15
    gram = np.asarray(np.eye(n) * 2.0, order=order)
    batches = [rng.standard_normal((b, n)) for b in (1, 4, 40)]
    want = 2.0 * np.eye(n)
    for d in batches:
        d = d.astype(dtype)
        gram_cholesky.gram_update(gram, np.ascontiguousarray(d.T))
        want = want + d.astype(np.float64).T @ d.astype(np.float64)
    assert gram.dtype == np.float64
    rtol = 1e-13 if dtype == np.float64 else 1e-6  # float32 products, accumulated in float64
    np.testing.assert_allclose(
        np.tril(gram), np.tril(want), rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=f"seed={seed}"
    )
    np.testing.assert_allclose(gram_cholesky.symmetric(gram), want, rtol=rtol, atol=rtol * np.abs(want).max())
    # sign = -1 removes a batch again (the downdate of ``forget``)
    d = batches[1].astype(dtype)
    gram_cholesky.gram_update(gram, np.ascontiguousarray(d.T), sign=-1.0)
    want = want - d.astype(np.float64).T @ d.astype(np.float64)
    np.testing.assert_allclose(
        np.tril(gram), np.tril(want), rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=f"seed={seed}"
    )
    # an empty batch changes nothing
    before = gram.copy()
    gram_cholesky.gram_update(gram, np.empty((n, 0), dtype=dtype))
    assert np.array_equal(gram, before)


def test_gram_update_is_in_place_for_f_ordered_float64():
    gram = np.asfortranarray(np.eye(4))
    address = gram.__array_interface__["data"][0]
    gram_cholesky.gram_update(gram, np.ones((4, 2)))
    assert gram.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(np.tril(gram), np.tril(np.eye(4) + 2.0))


def test_cholesky_helpers_equal_numpy():
    seed = 41
    rng = np.random.default_rng(seed)
    n, m = 12, 3
    a = rng.standard_normal((n, 30))
    spd = a @ a.T + np.eye(n)
    lower_only = np.asfortranarray(np.tril(spd))  # only the lower triangle is read
    factor = gram_cholesky.cholesky(lower_only)
    np.testing.assert_allclose(np.tril(factor), np.linalg.cholesky(spd), rtol=1e-12, err_msg=f"seed={seed}")
    rhs = rng.standard_normal((n, m))
    np.testing.assert_allclose(
        gram_cholesky.cho_solve(factor, rhs), np.linalg.solve(spd, rhs), rtol=1e-10, err_msg=f"seed={seed}"
    )
    inv = gram_cholesky.inverse_from_cholesky(factor)
    assert inv.flags.f_contiguous and np.array_equal(inv, inv.T)
    np.testing.assert_allclose(inv, np.linalg.inv(spd), rtol=1e-10, atol=1e-13, err_msg=f"seed={seed}")
    np.testing.assert_allclose(gram_cholesky.product(spd, rhs), spd @ rhs, rtol=1e-13)
    np.testing.assert_allclose(
        gram_cholesky.product(spd.astype(np.float32), rhs.astype(np.float32)), spd @ rhs, rtol=1e-4
    )
    with pytest.raises(gram_cholesky.NotPositiveDefinite):
        gram_cholesky.cholesky(np.asfortranarray(np.diag([1.0, -1.0, 1.0])))


@pytest.mark.parametrize("cache_dir", [False, True], ids=["in-tree", "NUMBA_CACHE_DIR"])
def test_an_edit_of_any_kernel_file_recompiles_every_cached_kernel(tmp_path, cache_dir):
    """Numba stamps a cached kernel with its own file only; kernel_cache adds a digest of all the
    kernel files, so that a kernel is recompiled when a function it calls from another file changes
    (here: activation_kernels.layer_mean after an edit of numba_blas.py), and only then (an edit of codec.py: loaded)."""
    import os
    import shutil
    import subprocess
    import sys

    from iolstream.core import kernel_cache

    assert isinstance(
        step_kernels.observe_serial._cache._impl._locator,
        (kernel_cache.InTreeLocator, kernel_cache.UserDirLocator),
    )
    package = tmp_path / "copy" / "iolstream"
    shutil.copytree(kernel_cache.HERE.parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PYTHONPATH=str(package.parent), NUMBA_DEBUG_CACHE="1")
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    code = "import numpy as np\nfrom iolstream.core import activation_kernels\nactivation_kernels.layer_mean(np.ones((2, 3, 4)))\n"

    def run() -> str:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
        )
        assert out.returncode == 0, out.stderr
        lines = [line for line in out.stdout.splitlines() if "layer_mean" in line and "data " in line]
        return (
            lines[0].split()[1] + " " + lines[0].split()[2] if lines else "?"
        )  # "data saved" / "data loaded"

    assert run() == "data saved"
    assert run() == "data loaded"
    with open(package / "stream" / "codec.py", "a") as f:
        f.write("\n# an edit outside the kernels\n")
    assert run() == "data loaded"
    with open(package / "core" / "numba_blas.py", "a") as f:
        f.write("\n# an edit of another kernel file\n")
    assert run() == "data saved"
    assert run() == "data loaded"
