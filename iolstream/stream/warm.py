"""Load (or compile) the Numba kernels a worker's stream takes, before its first message.

A kernel is read from Numba's cache on its first call, 0.05–0.2 s each: without this the first
batches of a stream (and each kernel variant the step tuner first tries) pay for it, in the
middle of the stream. ``preload`` runs a tiny model of the same kind (dtype, mode, solver,
activation, task) through the paths a stream takes — batch and one-row messages, the forward
step, label folds (whole batches and recomputed features), the id memory — serial and parallel.
docker/warmup.py calls ``exercise`` for every kind, at image build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import numpy as np
import orjson

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor


@contextlib.contextmanager
def _processor_quiet():
    """The tiny model's warm-up is not the stream's: what the processor would log of it (its hidden units
    on 8 random rows) is not said."""
    logger = logging.getLogger("iolstream.processor")
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


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
    proc.model.learner.parallel = parallel  # the kernels runtime.StepTuner may pick
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


def preload(config: ModelConfig, *, parallel: bool = True) -> float:
    """Load the kernels a stream of a model like ``config`` takes (both solvers when "auto",
    the parallel variants too if ``parallel``); returns the seconds it took."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    small = {"n_nodes": 8, "warmup_rows": 8} if config.scaler == "warmup" else {"n_nodes": 8}
    # with forgetting, "auto" always takes Gram + Cholesky (A is rescaled every batch: no rank-b update)
    solvers = (
        ("woodbury", "cholesky")
        if config.solver == "auto" and config.forgetting is None
        else (config.solver,)
    )
    for solver in solvers:
        tiny = dataclasses.replace(config, solver=solver, **small)
        for par in (False, True) if parallel else (False,):
            exercise(tiny, rng, parallel=par)
    return time.perf_counter() - t0
