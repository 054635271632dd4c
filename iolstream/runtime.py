"""Process-wide runtime settings: the BLAS thread pools.

NumPy and SciPy each bundle an OpenBLAS with its own thread pool; alternating
calls between them stalls on a 2-core machine (MEASUREMENTS.md). iolstream's hot
path calls only SciPy's (``linalg`` and Numba's ``np.dot`` both bind it), so the
worker gives NumPy's pool a single thread: an accidental NumPy matmul can then
never wake a second pool that competes for the cores.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_info, threadpool_limits

_limiter = None


def _is_numpy_blas(info: dict) -> bool:
    return info.get("user_api") == "blas" and "numpy" in os.path.basename(os.path.dirname(info.get("filepath", "")))


def configure_blas(numpy_threads: int = 1) -> None:
    """Limit NumPy's own OpenBLAS pool (idempotent); SciPy's keeps its default threads."""
    global _limiter
    import numpy  # noqa: F401  (load the libraries so threadpoolctl sees them)
    import scipy.linalg  # noqa: F401

    if _limiter is None:
        numpy_libs = [i["filepath"] for i in threadpool_info() if _is_numpy_blas(i)]
        if numpy_libs:
            _limiter = threadpool_limits(limits={path: numpy_threads for path in numpy_libs})


def blas_info() -> list[dict]:
    return [
        {"library": os.path.basename(i["filepath"]), "threads": i["num_threads"], "arch": i.get("architecture")}
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


def configure_for_model(model) -> None:
    """Process-wide BLAS policy for ``model`` (an EdRVFL): NumPy's pool to 1 thread; SciPy's to
    1 thread for small models, else chosen step by step by a ThreadTuner attached to the model."""
    configure_blas()
    threads = blas_threads_for(model.network.n_columns)
    if threads is not None:
        threadpool_limits(limits=threads, user_api="blas")
        model.thread_tuner = None
    else:
        model.thread_tuner = ThreadTuner()


class ThreadTuner:
    """Chooses SciPy's BLAS thread count (1 or all cores) by timing the real steps.

    Two OpenBLAS threads are ~1.7× faster on an idle 2-core machine for the paper's
    config, but up to 10× slower when another process holds a core (the threads spin
    waiting for each other). So each step runs with the count that has been faster
    lately, and every ``period`` steps one step tries the other count again.
    """

    def __init__(self, period: int = 32, max_threads: int | None = None):
        self.period = period
        self.max_threads = max_threads or os.cpu_count() or 1
        self.cost = {1: None, self.max_threads: None}  # seconds per row, exponentially averaged
        self.steps = 0
        self._lib = None
        self._last = None
        self._switched = False

    def _controller(self):
        if self._lib is None:
            from threadpoolctl import ThreadpoolController

            libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas" and not _is_numpy_blas(c.info())]
            self._lib = libs[0] if libs else False
        return self._lib

    def choose(self) -> int:
        """The thread count for the next step (and set it)."""
        untried = [n for n, c in self.cost.items() if c is None]
        if untried:
            threads = untried[0]
        else:
            best = min(self.cost, key=self.cost.get)
            explore = self.steps % self.period >= self.period - 3  # three steps: one to wake, two to time
            threads = next(n for n in self.cost if n != best) if explore else best
        lib = self._controller()
        if lib:
            lib.set_num_threads(threads)
        self._switched = threads != self._last
        self._last = threads
        return threads

    def record(self, threads: int, seconds: float, rows: int) -> None:
        self.steps += 1
        if self._switched and self.cost[threads] is not None:
            return  # the first step after a switch pays for waking or parking threads: not representative
        per_row = seconds / max(rows, 1)
        old = self.cost[threads]
        self.cost[threads] = per_row if old is None else 0.5 * old + 0.5 * per_row
