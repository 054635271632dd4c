"""Compile iolstream's Numba kernels into ``NUMBA_CACHE_DIR`` (run by docker/Dockerfile at build).

The worker then starts without JIT compilation. Tiny models go through the paths the worker
takes (forward step, Woodbury and Cholesky updates, softmax, a label fold-in that recomputes
the features, the regret), in both dtypes and both modes, classification and regression,
with the serial and the parallel kernels (runtime.StepTuner tries both while streaming), and
the join buffer's id memory (``recent_ids``), whose row-by-row paths a plain run may not take.

    NUMBA_CACHE_DIR=/tmp/numba python docker/warmup.py
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import orjson

from iolstream.config import StreamConfig
from iolstream.model import EdRVFL, ModelConfig
from iolstream.recent_ids import RecentIds, fingerprint, fingerprints
from iolstream.stream import StreamProcessor


def exercise(config: ModelConfig, rng: np.random.Generator, *, parallel: bool) -> None:
    proc = StreamProcessor(EdRVFL(config), StreamConfig(batch_rows=8, max_batch_latency_ms=0, label_batch_rows=4))
    proc.model.learner.parallel = parallel  # the kernels runtime.StepTuner may pick; compiled here, not mid-stream
    for start in (0, 8):
        ids = [f"r{start + i}" for i in range(8)]
        x = rng.normal(size=(8, config.n_inputs)).tolist()
        proc.on_features(orjson.dumps({"ids": ids, "x": x}), None, now_ms=start)
        proc.step(now_ms=start)
        y = rng.integers(0, 2, 8).tolist() if config.classes else rng.normal(size=8).tolist()
        proc.on_labels(orjson.dumps({"ids": ids[:3], "y": y[:3]}), None, now_ms=start)  # part of a batch: recomputed
        proc.on_labels(orjson.dumps({"ids": ids[3:], "y": y[3:]}), None, now_ms=start)
        proc.step(now_ms=start, force=True)
    proc.model.regret()


def exercise_recent_ids() -> None:
    """Every kernel of the remembered-id memory (batch lookups, the row-by-row session, scalar calls)."""
    mem = RecentIds(4)
    fps = fingerprints(["a", "b", "c", "d", "e"])
    mem.add_many(fps[:3], 1)
    mem.add(*fps[3].tolist(), 2)
    mem.get(*fps[0].tolist())
    mem.kinds(fps), mem.any(fps), mem.lookup(fps)
    session = mem.session(["e", "a"])
    session.add("e", session.get("a") or 1)
    session.commit()
    one = mem.session(["f"])  # one id (one-row messages): scalar calls
    one.add("f", one.get("f") or 1)
    fingerprint("g")


def main() -> int:
    if not os.environ.get("NUMBA_CACHE_DIR"):
        print("warmup: set NUMBA_CACHE_DIR (the directory the worker will read the compiled kernels from)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for dtype in ("float64", "float32"):
        for mode in ("forward", "ridge"):
            for solver in ("woodbury", "cholesky"):
                for target in ({"classes": (0, 1)}, {"n_outputs": 1}):
                    config = ModelConfig(n_inputs=3, n_nodes=8, n_layers=2, scaler="none", dtype=dtype, mode=mode,
                                         solver=solver, **target)  # fmt: skip
                    for parallel in (False, True):
                        exercise(config, rng, parallel=parallel)
    exercise_recent_ids()
    print(f"warmup: kernels compiled into {os.environ['NUMBA_CACHE_DIR']} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
