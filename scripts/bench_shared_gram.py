"""lam: auto with λ candidates sharing the Gram (this branch) against 3 independent learners (before),
same run, bench's core step. Usage: PYTHONPATH=. .venv/bin/python scripts/bench_shared_gram.py [seconds per measurement]"""

import sys

from iolstream.core import learner
from iolstream.core import model as model_mod
from iolstream.tools import bench_core

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0


def unshared(primary, lam):  # what the branch did before: a full learner per λ
    return learner.OnlineLearner(
        primary.n_columns,
        primary.n_outputs,
        primary.n_layers,
        lam=lam,
        mode=primary.mode,
        solver=primary.solver,
        refactor_every=primary.refactor_every,
        track_regret=primary.track_regret,
        half_life=primary.half_life,
    )


for name in ("small", "poker"):
    fixed = bench_core.bench_core_step(name, "float64", seconds=seconds)
    shared = bench_core.bench_core_step(
        name, "float64", seconds=seconds, setting="lam-auto", gemm=fixed.gemm_gflops
    )
    real = model_mod.SharedGramLearner
    model_mod.SharedGramLearner = unshared
    try:
        alone = bench_core.bench_core_step(
            name, "float64", seconds=seconds, setting="lam-auto", gemm=fixed.gemm_gflops
        )
    finally:
        model_mod.SharedGramLearner = real
    print(
        f"{name:6s} fixed {fixed.rows_per_second:9.0f} rows/s | lam auto shared Gram {shared.rows_per_second:9.0f} "
        f"({fixed.rows_per_second / shared.rows_per_second:.2f}x) | 3 own Grams {alone.rows_per_second:9.0f} "
        f"({fixed.rows_per_second / alone.rows_per_second:.2f}x)",
        flush=True,
    )
