"""Work counted in floating-point operations: the least one -F step needs, and what scoring one more candidate
adds. ``bench --suite core`` divides its measured rate by the first (``minimal_flops_per_row``); the scoring
budget of ``auto`` (``candidates.ScoringBudget``) weighs the second against the first in FLOP-equivalents, a
Cholesky counted at the rate it runs (``CHOLESKY_WEIGHT``; docs/design.md §10).
"""

from __future__ import annotations

from functools import lru_cache

# FLOP-equivalents of the fixed costs besides the arithmetic, at the ~30 GFLOP/s a step reaches on the small config
# of ``bench --suite core``. Measured on a tiny model (N = 24, b = 10, where calls are all there is): a step of a
# model with candidates (``auto``) takes ~100 µs of calls before any candidate not in force is scored, and scoring
# one more ~12 µs (the calls that solve and predict, its share of the selector's sums).
STEP_CALL_FLOPS = 3.0e6
CALL_FLOPS = 3.6e5
# What the scoring budget counts a Cholesky factorisation as, in operations of the step's products: LAPACK's dpotrf
# on these sizes (n = 139 to 1000) runs at 1/2.3 to 1/2.9 of the rate of the step's features (GEMM) and Gram (SYRK)
# measured beside it (one thread, bench configs). Counted at its operations alone, scoring a candidate was
# a third of what it took in time, and the default -F and -R pair was scored on every batch.
CHOLESKY_WEIGHT = 2.5
# A label fold (c += DᵀY, and A_r += the batch's Gram, or the rows' Gram into A with its Cholesky) runs on Numba's
# threads only from this much work per layer: a parallel region after the stream's Python work waits for its
# sleeping thread (the worker's short libgomp spin). Measured on 2 cores, GOMP_SPINCOUNT=3000, 3 ms of Python before
# each call: the small config's fold (0.7 MFLOP a layer) took 0.99-1.06 ms on two threads, 0.73-0.80 ms on one;
# poker's (45 MFLOP a layer) is worth the threads.
PARALLEL_FOLD_FLOPS = 1.0e7


def minimal_flops_per_row(
    k: int, m: int, n_nodes: int, n_layers: int, b: int, bias_column: bool = True
) -> dict:
    """FLOPs per row of one -F step, the least the algorithm needs.

    Per layer: features 2·fan_in·N; Gram n² (symmetric rank-b update, b·n² per batch);
    Cholesky n³/3 per batch; one β solve 2n²m per batch (two triangular solves: the β that
    predicts the batch; the β after its labels is never used before the next batch's Gram
    changes A, so it need not be solved); prediction 2nm; label fold-in DᵀY 2nm.
    """
    n = n_nodes + k + int(bias_column)
    parts = {"features": 0.0, "gram": 0.0, "cholesky": 0.0, "solves": 0.0, "predict_and_fold": 0.0}
    for layer in range(n_layers):
        fan_in = k if layer == 0 else n_nodes + k
        parts["features"] += 2.0 * fan_in * n_nodes
        parts["gram"] += float(n * n)
        parts["cholesky"] += n**3 / 3.0 / b
        parts["solves"] += 2.0 * n * n * m / b
        parts["predict_and_fold"] += 4.0 * n * m
    parts["total"] = sum(parts.values())
    return parts


@lru_cache(maxsize=1024)  # every batch asks (candidates.ScoringBudget), with a few batch sizes
def step_flops(k: int, m: int, n_nodes: int, n_layers: int, b: int, bias_column: bool = True) -> float:
    """The work of one -F step of a b-row batch, in FLOP-equivalents: ``minimal_flops_per_row`` × b with its
    Cholesky counted ``CHOLESKY_WEIGHT`` times, plus ``STEP_CALL_FLOPS``."""
    parts = minimal_flops_per_row(k, m, n_nodes, n_layers, max(b, 1), bias_column)
    per_row = parts["total"] + (CHOLESKY_WEIGHT - 1.0) * parts["cholesky"]
    return per_row * b + STEP_CALL_FLOPS


@lru_cache(maxsize=1024)
def scoring_flops(n_columns: int, m: int, n_layers: int, b: int, cholesky: bool = True) -> float:
    """The work of scoring one candidate not in force on a b-row batch, in FLOP-equivalents (as ``step_flops``):
    per layer a Cholesky of its A (n³/3, counted ``CHOLESKY_WEIGHT`` times; none when it keeps A⁻¹ current by
    Woodbury, ``cholesky`` False), its β (2n²m), its prediction and loss (2nm·b + m·b), plus ``CALL_FLOPS``."""
    n = n_columns
    per_layer = (CHOLESKY_WEIGHT * n**3 / 3.0 if cholesky else 0.0) + 2.0 * n * n * m + (2.0 * n * m + m) * b
    return n_layers * per_layer + CALL_FLOPS


def fold_flops(n_columns: int, m: int, b: int, entering: bool = False) -> float:
    """The work of folding b labelled rows into one layer: c += DᵀY (2nbm) and A_r += the batch's Gram (n²), or, when
    the rows' Gram ``entering`` A now (-R), its symmetric rank-b update and A's Cholesky (b·n² + n³/3)."""
    n = n_columns
    return 2.0 * n * b * m + (b * n * n + n**3 / 3.0 if entering else float(n * n))
