"""SciPy's BLAS and LAPACK bound for Numba: the few routines the step kernels call from inside a kernel.

Each routine's address comes from ``scipy.linalg.cython_blas`` / ``cython_lapack`` and is
registered with LLVM under a fixed symbol name, so compiled kernels call it by name and
stay cacheable (a ctypes pointer baked into the code would pin one process's address).
Only SciPy's OpenBLAS is reached — the same library ``gram_cholesky`` and Numba's ``np.dot`` use —
never NumPy's (two copies fight over 2 cores: docs/benchmarks.md, "The update's building blocks").

The wrappers take column-major *views*: a 2-D array whose first axis has unit stride (an
F-ordered array, the transpose of a C-ordered one, or a slice of either). The leading
dimension comes from the second stride, so a block of rows of a larger matrix is passed
without a copy. float32 and float64 share one wrapper (chosen by ``itemsize``); LAPACK is
float64 only.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from numba import types
from numba.extending import get_cython_function_address

from iolstream.core.activation_kernels import JIT

_ROUTINES = {"blas": ("dgemm", "sgemm", "dsyrk", "ssyrk", "dtrsm"), "lapack": ("dpotrf", "dpotrs")}
for _module, _names in _ROUTINES.items():
    for _name in _names:
        llvm.add_symbol(
            f"iolstream_{_name}", get_cython_function_address(f"scipy.linalg.cython_{_module}", _name)
        )


def _extern(name: str, n_args: int):
    # Fortran calling convention: every argument is a pointer, nothing is returned.
    return types.ExternalFunction(f"iolstream_{name}", types.void(*([types.voidptr] * n_args)))


_dgemm, _sgemm = _extern("dgemm", 13), _extern("sgemm", 13)
_dsyrk, _ssyrk = _extern("dsyrk", 10), _extern("ssyrk", 10)
_dtrsm = _extern("dtrsm", 11)
_dpotrf, _dpotrs = _extern("dpotrf", 5), _extern("dpotrs", 8)

_N, _T, _L, _R = 78, 84, 76, 82  # ASCII 'N', 'T', 'L', 'R'


@nb.njit(**JIT)
def leading_dim(a):
    """Leading dimension of a column-major view (its first axis must have unit stride)."""
    return max(a.strides[1] // a.itemsize, a.shape[0], 1)


@nb.njit(**JIT)
def gemm(alpha, a, trans_a, b, trans_b, beta, c):
    """c ← alpha · op(a) · op(b) + beta · c, op(x) = xᵀ when trans_x (BLAS ?gemm, 2·M·N·K flops).

    a, b, c : column-major views of one dtype; c is (M, N). With beta = 0, c is not read.
    """
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    chars = np.empty(2, np.uint8)
    chars[0] = _T if trans_a else _N
    chars[1] = _T if trans_b else _N
    ints = np.empty(6, np.int32)
    ints[0], ints[1], ints[2] = m, n, k
    ints[3], ints[4], ints[5] = leading_dim(a), leading_dim(b), leading_dim(c)
    scal = np.empty(2, c.dtype)
    scal[0], scal[1] = alpha, beta
    args = (
        chars[0:].ctypes,
        chars[1:].ctypes,
        ints[0:].ctypes,
        ints[1:].ctypes,
        ints[2:].ctypes,
        scal[0:].ctypes,
    )
    tail = (ints[3:].ctypes, b.ctypes, ints[4:].ctypes, scal[1:].ctypes, c.ctypes, ints[5:].ctypes)
    if c.itemsize == 8:
        _dgemm(*args, a.ctypes, *tail)
    else:
        _sgemm(*args, a.ctypes, *tail)


@nb.njit(**JIT)
def syrk_lower(alpha, a, beta, c):
    """Lower triangle of c ← alpha · aᵀa + beta · c (BLAS ?syrk, trans = 'T'; K·N² flops).

    a : (K, N) column-major view, c : (N, N) column-major view; the upper triangle is untouched.
    """
    k, n = a.shape
    chars = np.empty(2, np.uint8)
    chars[0], chars[1] = _L, _T
    ints = np.empty(4, np.int32)
    ints[0], ints[1], ints[2], ints[3] = n, k, leading_dim(a), leading_dim(c)
    scal = np.empty(2, c.dtype)
    scal[0], scal[1] = alpha, beta
    args = (chars[0:].ctypes, chars[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, scal[0:].ctypes, a.ctypes)
    tail = (ints[2:].ctypes, scal[1:].ctypes, c.ctypes, ints[3:].ctypes)
    if c.itemsize == 8:
        _dsyrk(*args, *tail)
    else:
        _ssyrk(*args, *tail)


@nb.njit(**JIT)
def potrf_lower(a):
    """In place: the lower triangle of a (N, N, float64, column-major) becomes its Cholesky
    factor C, A = C Cᵀ (LAPACK dpotrf, N³/3 flops). Returns LAPACK's info: 0, or the column
    at which A was found not positive definite."""
    n = a.shape[0]
    chars = np.empty(1, np.uint8)
    chars[0] = _L
    ints = np.empty(3, np.int32)
    ints[0], ints[1], ints[2] = n, leading_dim(a), 0
    _dpotrf(chars.ctypes, ints[0:].ctypes, a.ctypes, ints[1:].ctypes, ints[2:].ctypes)
    return ints[2]


@nb.njit(**JIT)
def potrs_lower(factor, b):
    """In place: b ← A⁻¹ b from the lower Cholesky factor of A (LAPACK dpotrs, 2·N²·M flops).

    factor : (N, N) float64 column-major; b : (N, M) float64 column-major. Returns info.
    """
    n, m = b.shape
    chars = np.empty(1, np.uint8)
    chars[0] = _L
    ints = np.empty(5, np.int32)
    ints[0], ints[1], ints[2], ints[3], ints[4] = n, m, leading_dim(factor), leading_dim(b), 0
    dims = (ints[0:].ctypes, ints[1:].ctypes)
    _dpotrs(chars.ctypes, *dims, factor.ctypes, ints[2:].ctypes, b.ctypes, ints[3:].ctypes, ints[4:].ctypes)
    return ints[4]


@nb.njit(**JIT)
def trsm_right_lower_t(factor, b):
    """In place: b ← b · L⁻ᵀ, L the lower triangle of ``factor`` (BLAS dtrsm, side 'R', transa 'T'; M·N² flops).

    factor : (N, N) float64 column-major; b : (M, N) float64 column-major.
    """
    m, n = b.shape
    chars = np.empty(4, np.uint8)
    chars[0], chars[1], chars[2], chars[3] = _R, _L, _T, _N
    ints = np.empty(4, np.int32)
    ints[0], ints[1], ints[2], ints[3] = m, n, leading_dim(factor), leading_dim(b)
    scal = np.empty(1, np.float64)
    scal[0] = 1.0
    sides = (chars[0:].ctypes, chars[1:].ctypes, chars[2:].ctypes, chars[3:].ctypes)
    _dtrsm(
        *sides,
        ints[0:].ctypes,
        ints[1:].ctypes,
        scal.ctypes,
        factor.ctypes,
        ints[2:].ctypes,
        b.ctypes,
        ints[3:].ctypes,
    )
