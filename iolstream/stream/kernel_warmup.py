"""The kernel warm-up: load (or compile) the Numba kernels a worker's stream takes, before its first message.

A kernel is read from Numba's cache on its first call, 0.05–0.2 s each: without this the first
batches of a stream (and each kernel variant the step tuner first tries) pay for it, in the
middle of the stream. ``preload`` runs a tiny model of the same kind (dtype, mode, solver,
activation, task) through the paths a stream takes — batch and one-row messages, the forward
step, label folds (whole batches and recomputed features), the id memory — serial and parallel.
``iolstream warmup`` runs the same ahead of time (``every_kind`` with ``--all``, as the container image's build
does), into the cache the worker then reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import NamedTuple

import numpy as np
import orjson
from numba.core import event

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor


class _QuietThreads(logging.Filter):
    """Drops the records of the threads running a tiny model's warm-up, and only theirs: a worker's thread may
    preload while another thread's processor logs (two workers in one process, a test's). Toggling the
    logger's ``disabled`` instead raced: two preloads overlapping could leave it disabled for good."""

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.threads


_QUIET = _QuietThreads()
logging.getLogger("iolstream.processor").addFilter(_QUIET)


@contextlib.contextmanager
def _processor_quiet():
    """The tiny model's warm-up is not the stream's: what the processor would log of it (its hidden units
    on 8 random rows) is not said, from this thread."""
    me = threading.get_ident()
    _QUIET.threads.add(me)
    try:
        yield
    finally:
        _QUIET.threads.discard(me)


def exercise(config: ModelConfig, rng: np.random.Generator, *, parallel: bool) -> None:
    """One tiny stream through a processor of ``config``: batch and one-row messages, labels
    folded whole and in parts (recomputed features), ids remembered and looked up."""
    with _processor_quiet():
        _exercise(config, rng, parallel=parallel)


def _exercise(config: ModelConfig, rng: np.random.Generator, *, parallel: bool) -> None:
    if config.features is not None:  # the kernels are those of the encoded rows: exercised as array rows
        scaler = "none" if config.scaler == "fixed" else config.scaler
        config = dataclasses.replace(config, features=None, scaler=scaler)
    proc = StreamProcessor(
        EdRVFL(config), StreamConfig(batch_rows=8, max_batch_latency_ms=0, label_batch_rows=4)
    )
    proc.model.learner.parallel = parallel  # the kernels step_tuner.StepTuner may pick
    for ln in proc.model.learners:  # and the parallel folds of a model large enough for them (tiny here)
        ln.parallel_fold_flops = 0.0
    k = config.n_inputs

    def label(n):
        return (
            rng.integers(0, len(config.classes), n).tolist()
            if config.classes
            else rng.normal(size=n).tolist()
        )

    for start in (0, 8, 16):
        ids = [f"r{start + i}" for i in range(8)]
        proc.on_features(
            orjson.dumps({"ids": ids, "x": rng.normal(size=(8, k)).tolist()}), None, now_ms=start
        )
        proc.step(now_ms=start)
        y = label(8)
        proc.on_labels(
            orjson.dumps({"ids": ids[:3], "y": y[:3]}), None, now_ms=start
        )  # part of a batch: recomputed
        proc.on_labels(orjson.dumps({"ids": ids[3:], "y": y[3:]}), None, now_ms=start)
        proc.step(now_ms=start, force=True)
    # one-row messages (the id memory's one-id paths): half the labels come before their batch is
    # predicted (held early, joined as it enters), half after (joined at once)
    for i in range(24, 32):
        proc.on_features(orjson.dumps({"id": f"r{i}", "x": rng.normal(size=k).tolist()}), None, now_ms=24)
    for i in range(24, 32):
        if i == 28:
            proc.step(now_ms=24)
        proc.on_labels(orjson.dumps({"id": f"r{i}", "y": label(1)[0]}), None, now_ms=24)
    proc.step(now_ms=24, force=True)
    proc.on_labels(
        orjson.dumps({"id": "r0", "y": label(1)[0]}), None, now_ms=40
    )  # a duplicate label: remembered
    proc.on_features(
        orjson.dumps({"ids": ["r40", "r41"], "x": rng.normal(size=(2, k)).tolist()}), None, now_ms=40
    )
    proc.step(now_ms=40, force=True)
    y = label(2)
    proc.on_labels(
        orjson.dumps({"ids": ["r40", "r50"], "y": y}), None, now_ms=40
    )  # one pending, one not: row by row
    duplicate = orjson.dumps(
        {"ids": ["r1", "r99"], "x": rng.normal(size=(2, k)).tolist()}
    )  # r1: a duplicate row
    proc.on_features(duplicate, None, now_ms=40)
    proc.step(now_ms=40, force=True)
    if config.track_regret:
        proc.model.regret()


# What a cold start's compile of one model's kernels costs (nothing cached): ~53 CPU seconds measured
# (docs/operations.md "Numba's compiled-kernel cache"); said in the worker's log before it starts compiling.
COLD_COMPILE_SECONDS = "about 50 s on 2 idle cores"


def kernel_runs(config: ModelConfig, *, parallel: bool = True) -> list[tuple[ModelConfig, bool]]:
    """The tiny models (and serial or parallel) whose streams take the kernels a stream of ``config`` takes:
    its dtype, mode, task and candidates; both solvers when "auto" (small batches take Woodbury, large ones
    Gram + Cholesky), the parallel variants too if ``parallel`` (``step_tuner.StepTuner`` tries them)."""
    small = {"n_nodes": 8, "warmup_rows": 8} if config.scaler == "warmup" else {"n_nodes": 8}
    # with forgetting, "auto" always takes Gram + Cholesky (A is rescaled every batch: no rank-b update)
    solvers = (
        ("woodbury", "cholesky")
        if config.solver == "auto" and config.forgetting is None
        else (config.solver,)
    )
    return [
        (dataclasses.replace(config, solver=solver, **small), par)
        for solver in solvers
        for par in ((False, True) if parallel else (False,))
    ]


class Warmed(NamedTuple):
    """What loading the kernels took: seconds, and how many kernels (and their callees, each signature) had to be
    compiled (0: every one came from the cache)."""

    seconds: float
    compiled: int


def preload(config: ModelConfig, *, parallel: bool = True, progress=None) -> Warmed:
    """Load (or compile) the kernels a stream of a model like ``config`` takes (``kernel_runs``).
    ``progress(done, total, seconds, compiled)`` is called after each run."""
    return run_all(kernel_runs(config, parallel=parallel), progress=progress)


def run_all(runs: list[tuple[ModelConfig, bool]], *, progress=None) -> Warmed:
    """``exercise`` each (tiny model, parallel) of ``runs``, counting Numba's compilations."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    with event.install_recorder("numba:compile") as recorded:
        for done, (tiny, par) in enumerate(runs, 1):
            exercise(tiny, rng, parallel=par)
            if progress is not None:
                compiled = sum(1 for _, e in recorded.buffer if e.is_end)
                progress(done, len(runs), time.perf_counter() - t0, compiled)
    return Warmed(time.perf_counter() - t0, sum(1 for _, e in recorded.buffer if e.is_end))


def every_kind() -> list[tuple[ModelConfig, bool]]:
    """The runs of every kind of model a config may ask for: both dtypes, classification and regression, the
    three modes, ``lam`` and ``forgetting`` auto, and ``calibration: none`` (the layers' softmax); serial and
    parallel (an image that serves any config)."""
    runs = []
    for dtype in ("float64", "float32"):
        for target in ({"classes": (0, 1)}, {"n_outputs": 1}):
            base = ModelConfig(n_inputs=3, n_layers=2, scaler="none", dtype=dtype, **target)
            kinds = [dataclasses.replace(base, mode=mode) for mode in ("forward", "ridge", "auto")]
            kinds.append(dataclasses.replace(base, lam="auto", forgetting="auto"))
            kinds.append(dataclasses.replace(base, calibration="none"))
            for kind in kinds:
                runs += kernel_runs(kind)
    return runs
