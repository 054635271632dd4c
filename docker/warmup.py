"""Compile iolstream's Numba kernels into ``NUMBA_CACHE_DIR`` (run by docker/Dockerfile at build).

The worker then starts without JIT compilation. Tiny models go through the paths the worker
takes (forward step, Woodbury and Cholesky updates, softmax, a label fold-in that recomputes
the features, the regret), in both dtypes and both modes, classification and regression,
with the serial and the parallel kernels (runtime.StepTuner tries both while streaming), with
batch and one-row messages (the join buffer's id memory, ``recent_ids``, has one-id paths);
see ``iolstream.stream.warm``, which the worker also runs at start for its own model.

    NUMBA_CACHE_DIR=/tmp/numba python docker/warmup.py
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from iolstream.core.model import ModelConfig
from iolstream.stream.warm import exercise


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
    print(f"warmup: kernels compiled into {os.environ['NUMBA_CACHE_DIR']} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
