"""Process set-up of the worker (``iolstream run``): OpenMP's spin, the garbage collector's freeze."""

from __future__ import annotations

import gc
import os

# Iterations an idle thread of Numba's OpenMP pool (libgomp) spins after a parallel region before it
# sleeps, in the worker. libgomp's default (300,000, about a millisecond) suits back-to-back parallel
# kernels: the learner alone is ~15 % slower at 3,000. In the worker the main thread runs Python
# (decoding, joining, encoding, producing) between the kernels for half of each step, and the spinning
# thread burnt a core meanwhile: 25-30 % of the worker's CPU time on the small config, at the same
# or better throughput and the same latency (`iolstream bench --suite kafka` reports CPU seconds per
# 100k rows).
WORKER_OMP_SPINCOUNT = 3000


def configure_worker_threads(environ=os.environ) -> str | None:
    """Set GOMP_SPINCOUNT for the worker process, unless the user set it or OMP_WAIT_POLICY; returns
    what was set (None: nothing). libgomp reads it when it loads, at the first parallel kernel: call
    this before any (a pool already running keeps its setting)."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return None
    environ["GOMP_SPINCOUNT"] = str(WORKER_OMP_SPINCOUNT)
    return environ["GOMP_SPINCOUNT"]


def freeze_startup_objects() -> int:
    """Collect, then put every object alive now out of the cyclic garbage collector's reach
    (``gc.freeze``); returns how many were frozen. For the worker process once it has started
    (``iolstream run``): its modules, compiled kernels, clients and loaded state are ~120k tracked
    objects, and every full collection traversed them all again: a 26–38 ms stall of the stream,
    every second or two on one-row messages (~2 ms after the freeze). What is created later is
    collected as before, and a frozen object is still freed when its last reference goes: only a
    frozen reference cycle stays for good. Not for a process that keeps making and dropping workers."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
