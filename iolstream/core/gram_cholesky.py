"""The Gram and its Cholesky factor from Python: A += DᵀD, the factor, solves, the inverse, a product, and
``NotPositiveDefinite``; thin wrappers over SciPy's BLAS/LAPACK (the kernels' own binding is ``numba_blas``).

All matrices here are Fortran-ordered (n, n) with the *lower* triangle
authoritative, as BLAS ``?syrk`` and LAPACK ``?potrf`` leave them. Only SciPy's
OpenBLAS is called (the same one Numba's ``np.dot`` uses), never NumPy's.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas, lapack


class NotPositiveDefinite(np.linalg.LinAlgError):
    """A matrix that must be symmetric positive definite is not (numerically)."""


def raise_for(info: np.ndarray) -> None:
    """Raise for the first layer whose factorisation (info > 0) or solve (info < 0) failed in a fused kernel
    (``info``: one entry per layer)."""
    layer = int(np.flatnonzero(info)[0])
    if info[layer] > 0:
        raise NotPositiveDefinite(
            f"layer {layer}: Cholesky failed at column {info[layer]}: the Gram matrix is not positive definite"
        )
    raise ValueError(f"layer {layer}: dpotrs: illegal argument {-info[layer]}")


def gram_update(gram: np.ndarray, d_t: np.ndarray, sign: float = 1.0) -> None:
    """A ← A + sign · DᵀD on the lower triangle, in place (one symmetric rank-b update).

    gram : (n, n) float64, F-ordered, lower triangle authoritative
    d_t  : (n, b) C-contiguous Dᵀ (so ``d_t.T`` is an F-ordered D), float32 or float64
    Cost b·n² flops (syrk), half of a general DᵀD product.
    """
    if d_t.shape[1] == 0:
        return
    d_f = d_t.T  # (b, n) F-ordered view, no copy
    if d_t.dtype == np.float64:
        res = blas.dsyrk(sign, d_f, beta=1.0, c=gram, trans=1, lower=1, overwrite_c=1)
        if res is not gram:  # not updated in place (gram not F-ordered float64): copy back
            gram[...] = res
    else:
        # float32 features: product in float32 (twice the GEMM rate), accumulated in float64.
        part = blas.ssyrk(sign, d_f, trans=1, lower=1)  # lower triangle filled, upper left at zero
        gram += part


def symmetric(lower: np.ndarray) -> np.ndarray:
    """Full symmetric matrix from one whose lower triangle is authoritative."""
    return np.tril(lower) + np.tril(lower, -1).T


def cholesky(gram: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Lower Cholesky factor C of A (A = C Cᵀ), n³/3 flops. Raises NotPositiveDefinite."""
    factor, info = lapack.dpotrf(gram, lower=1, clean=0, overwrite_a=0)
    if info != 0:
        raise NotPositiveDefinite(
            f"Cholesky failed at column {info}: the Gram matrix is not positive definite"
        )
    if out is not None:
        out[...] = factor
        return out
    return factor


def cho_solve(factor: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """A⁻¹ · rhs from the lower Cholesky factor of A (two triangular solves, 2n²m flops)."""
    sol, info = lapack.dpotrs(factor, rhs, lower=1)
    if info != 0:
        raise ValueError(f"dpotrs: illegal argument {-info}")
    return sol


def inverse_from_cholesky(factor: np.ndarray) -> np.ndarray:
    """P = A⁻¹ (full symmetric, F-ordered) from the lower Cholesky factor of A."""
    inv, info = lapack.dpotri(factor, lower=1)
    if info != 0:
        raise NotPositiveDefinite(f"dpotri failed ({info})")
    return np.asfortranarray(symmetric(inv))


def product(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False) -> np.ndarray:
    """a · b (or aᵀ · b) through SciPy's BLAS (keeps one OpenBLAS pool busy, not two).

    Pass F-ordered operands: f2py copies a C-ordered one first. For Dᵀ·Y with Dᵀ held
    C-ordered as ``d_t``, call ``product(d_t.T, y, trans_a=True)``: no copy of D.
    """
    if a.dtype == np.float32 and b.dtype == np.float32:
        return blas.sgemm(1.0, a, b, trans_a=int(trans_a))
    return blas.dgemm(1.0, a, b, trans_a=int(trans_a))
