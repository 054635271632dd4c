"""The BLAS thread pools: NumPy's held to one thread, SciPy's threads by the size of a model's matrices.

NumPy and SciPy each bundle an OpenBLAS with its own thread pool; alternating
calls between them stalls on a 2-core machine (docs/benchmarks.md, "The update's building blocks"). iolstream's hot
path calls only SciPy's (``gram_cholesky``, ``numba_blas`` and Numba's ``np.dot`` all bind it),
so the worker gives NumPy's pool a single thread: an accidental NumPy matmul can
then never wake a second pool that competes for the cores. How a step then uses the cores, by timing, is
``step_tuner``'s.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_info, threadpool_limits

_limiter = None


def is_numpy_blas(info: dict) -> bool:
    """Whether threadpoolctl's ``info`` is NumPy's own OpenBLAS (not SciPy's)."""
    return info.get("user_api") == "blas" and "numpy" in os.path.basename(
        os.path.dirname(info.get("filepath", ""))
    )


def configure_blas(numpy_threads: int = 1) -> None:
    """Limit NumPy's own OpenBLAS pool (idempotent); SciPy's keeps its default threads."""
    global _limiter
    import numpy  # noqa: F401  (load the libraries so threadpoolctl sees them)
    import scipy.linalg  # noqa: F401

    if _limiter is None:
        numpy_libs = [i["filepath"] for i in threadpool_info() if is_numpy_blas(i)]
        if numpy_libs:
            _limiter = threadpool_limits(limits={path: numpy_threads for path in numpy_libs})


def blas_info() -> list[dict]:
    """Every BLAS library loaded, with its threads (the bench reports them)."""
    return [
        {
            "library": os.path.basename(i["filepath"]),
            "threads": i["num_threads"],
            "arch": i.get("architecture"),
        }
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]


# Below this many columns n (n = N + k + 1) the per-call matrices are so small that waking a second
# BLAS thread costs more than it saves, and a busy neighbour core makes it far worse: one thread.
SINGLE_THREAD_BELOW_COLUMNS = 384


def blas_threads_for(n_columns: int) -> int | None:
    """The SciPy BLAS threads iolstream uses for a model with ``n_columns`` (None: library default)."""
    return 1 if n_columns < SINGLE_THREAD_BELOW_COLUMNS else None


def blas_threads(n_columns: int):
    """Context manager applying ``blas_threads_for`` to every BLAS pool."""
    threads = blas_threads_for(n_columns)
    return threadpool_limits(limits=threads, user_api="blas")
