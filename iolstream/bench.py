"""``iolstream bench``: throughput against baselines measured in the same run.

Suites:
- ``core``: one full -F step (features, forward update, prediction, label fold-in)
  for the "small" and the paper's "poker" configs, float64 and float32: rows/s, the
  algorithm's minimal FLOPs per row, the GEMM rate NumPy reaches on the same shapes
  and dtype in this run, and ``efficiency`` = achieved minimal-FLOP rate ÷ GEMM rate.
  Each config also runs with ``lam: auto`` (3 λ candidates sharing one Gram: one Cholesky
  and solve per λ), ``forgetting: auto`` (3 half-lives, their own sums) and both (9
  candidates, 3 sets of sums), with ``cost_vs_fixed`` = fixed rows/s ÷ these rows/s, same run
  (their minimal FLOPs and efficiency are the fixed model's accounting).
- ``poker``: the paper's largest run (Table 13 configuration) on generated poker hands.
- ``kafka``: end to end through the local broker (see ``bench_kafka``).

Machines here are shared and noisy: compare ratios within one run, not seconds across runs.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from .model import EdRVFL, ModelConfig

# setting name -> ModelConfig overrides (``--settings``)
SETTINGS = {
    "fixed": {},
    "lam-auto": {"lam": "auto"},
    "forgetting-auto": {"forgetting": "auto"},
    "auto": {"lam": "auto", "forgetting": "auto"},
}

CONFIGS = {
    # name: (k, m, N, L, b)
    "small": (10, 10, 128, 4, 256),
    "poker": (10, 10, 989, 5, 2200),
}


def minimal_flops_per_row(k: int, m: int, n_nodes: int, n_layers: int, b: int, bias_column: bool = True) -> dict:
    """FLOPs per row of one -F step, the least the algorithm needs (issue #5's accounting).

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


def gemm_rate(shape_mk_kn: list[tuple[int, int, int]], dtype, seconds: float = 0.6) -> float:
    """GFLOP/s NumPy's matmul reaches on these (M, K, N) shapes: the better of one thread and
    all cores (on a shared machine either can win), each shape weighted like the workload."""
    import os

    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    operands = [
        (rng.standard_normal((m_, k_)).astype(dtype), rng.standard_normal((k_, n_)).astype(dtype))
        for m_, k_, n_ in shape_mk_kn
    ]
    best = 0.0
    for threads in sorted({1, os.cpu_count() or 1}):
        with threadpool_limits(limits=threads, user_api="blas"):
            total_flops, total_time = 0.0, 0.0
            for a, b in operands:
                a @ b  # warm
                reps, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds / len(operands):
                    a @ b
                    reps += 1
                total_time += time.perf_counter() - t0
                total_flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1] * reps
        best = max(best, total_flops / total_time / 1e9)
    return best


@dataclass
class CoreResult:
    config: str
    dtype: str
    k: int
    m: int
    n_nodes: int
    n_layers: int
    batch: int
    rows_per_second: float
    minimal_flops_per_row: float
    achieved_gflops: float
    gemm_gflops: float
    efficiency: float
    seconds: float
    flops_breakdown: dict
    setting: str = "fixed"
    candidates: int = 1
    cost_vs_fixed: float | None = None  # fixed rows/s ÷ these rows/s, same config and dtype, same run


def bench_core_step(
    name: str, dtype: str, *, seconds: float = 5.0, solver: str = "auto", setting: str = "fixed", gemm: float | None = None
) -> CoreResult:
    """One config, dtype and setting (SETTINGS); ``gemm``: the GEMM rate if already measured in this run."""
    k, m, n_nodes, n_layers, b = CONFIGS[name]
    cfg = ModelConfig(
        n_inputs=k, n_outputs=m, n_nodes=n_nodes, n_layers=n_layers, scaler="none", dtype=dtype, solver=solver,
        track_regret=False, **SETTINGS[setting],
    )  # fmt: skip
    model = EdRVFL(cfg)
    from . import runtime

    runtime.configure_for_model(model)
    rows_s, elapsed = _time_steps(model, k, m, b, seconds)
    flops = minimal_flops_per_row(k, m, n_nodes, n_layers, b)
    if gemm is None:
        shapes = [(b, k, n_nodes)] + [(b, n_nodes + k, n_nodes)] * (n_layers - 1)
        gemm = gemm_rate(shapes, np.float64 if dtype == "float64" else np.float32)
    achieved = flops["total"] * rows_s / 1e9
    return CoreResult(
        name, dtype, k, m, n_nodes, n_layers, b, rows_s, flops["total"], achieved, gemm, achieved / gemm, elapsed, flops,
        setting, len(model.learners),
    )  # fmt: skip


def _time_steps(model: EdRVFL, k: int, m: int, b: int, seconds: float) -> tuple[float, float]:
    """rows/s of full -F steps (observe batch t+1, learn batch t), after warm-up steps that load
    every kernel and let the model's StepTuner time each of its settings once."""
    rng = np.random.default_rng(0)
    pool = 8
    xs = [rng.standard_normal((b, k)) for _ in range(pool)]
    ys = [np.eye(m)[rng.integers(0, m, b)] for _ in range(pool)]
    prev = model.observe(xs[0])
    steps, t0 = 0, time.perf_counter()
    tuner = model.thread_tuner
    warm = 2 + (2 * len(tuner.settings) if tuner is not None else 0)
    while True:
        if steps == warm:
            t0 = time.perf_counter()
        i = steps + 1
        pred = model.observe(xs[i % pool])  # -F: Gram in, then predict
        # labels one batch late; each candidate (auto) judged on its own prediction, rows at their stamps
        model.learn(prev.features_t, ys[(i - 1) % pool], predicted=prev.predicted, observed_at=prev.clock)
        prev = pred
        steps += 1
        if steps > warm + 2 and time.perf_counter() - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    return (steps - warm) * b / elapsed, elapsed


def run_core(args) -> list[dict]:
    results = []
    settings = ["fixed"] + [s for s in args.settings if s != "fixed"]  # fixed first: the others' yardstick
    for name in args.configs:
        for dtype in args.dtypes:
            fixed = gemm = None
            for setting in settings:
                r = bench_core_step(name, dtype, seconds=args.seconds, setting=setting, gemm=gemm)
                gemm = r.gemm_gflops
                if setting == "fixed":
                    fixed = r.rows_per_second
                r.cost_vs_fixed = fixed / r.rows_per_second
                results.append(asdict(r))
                if not args.json:
                    print(
                        f"{name:6s} {dtype:8s} {setting:15s} b={r.batch:5d}  {r.rows_per_second:10.0f} rows/s  "
                        f"{r.minimal_flops_per_row / 1e6:7.2f} MFLOP/row  {r.achieved_gflops:6.1f} GFLOP/s  "
                        f"GEMM {r.gemm_gflops:6.1f}  efficiency {r.efficiency:.2f}  cost vs fixed {r.cost_vs_fixed:5.2f}x",
                        flush=True,
                    )
    return results


def run_poker(args) -> dict:
    """The paper's largest run: N=989, L=5, λ=4, ReLU, xavier, b = 0.0027 of the rows, -F, sorted cards."""
    from .datasets import load

    data = load("poker", rows=args.rows, seed=args.seed, sort_cards=True)
    n_test = max(int(round(len(data.y) * args.test_fraction)), 1)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(data.y))
    test, train = order[:n_test], order[n_test:]
    b = max(int(round(args.batch_fraction * len(train))), 1)
    cfg = ModelConfig(
        n_inputs=data.X.shape[1], classes=data.classes, n_nodes=989, n_layers=5, lam=4.0, activation="relu",
        init="xavier", seed=args.seed, mode="forward", dtype=args.dtype, scaler="warmup", warmup_rows=min(10_000, len(train)),
        track_regret=False,
    )  # fmt: skip
    model = EdRVFL(cfg)
    from . import runtime

    runtime.configure_for_model(model)
    model.scaler.partial_fit(data.X[train[: cfg.warmup_rows]])
    x_train, y_train = data.X[train], model.encode_labels(data.y[train])
    t0 = time.perf_counter()
    prev, prev_y = None, None
    correct = 0
    for start in range(0, len(train), b):
        pred = model.observe(x_train[start : start + b])
        y = y_train[start : start + b]
        correct += int((pred.index == y.argmax(axis=1)).sum())
        if prev is not None:
            model.learn(prev.features_t, prev_y, predicted=prev.layer_outputs)
        prev, prev_y = pred, y
        if args.progress and (start // b) % 20 == 0:
            done = start + len(y)
            print(f"\r{done:>9d}/{len(train)} rows  {done / (time.perf_counter() - t0):8.0f} rows/s", end="", file=sys.stderr)
    model.learn(prev.features_t, prev_y, predicted=prev.layer_outputs)
    seconds = time.perf_counter() - t0
    if args.progress:
        print(file=sys.stderr)
    test_pred = np.concatenate(
        [model.predict_batch(data.X[test[i : i + 20_000]]).index for i in range(0, len(test), 20_000)]
    )
    test_acc = float((np.asarray(data.classes)[test_pred] == data.y[test]).mean())
    return {
        "suite": "poker", "rows": int(len(data.y)), "train_rows": int(len(train)), "test_rows": int(n_test),
        "batch": b, "dtype": args.dtype, "seconds": seconds, "minutes": seconds / 60.0,
        "rows_per_second": len(train) / seconds, "prequential_accuracy": correct / len(train),
        "test_accuracy": test_acc, "paper": {"minutes": 4.91, "test_accuracy_forward": 0.9352, "hardware": "64-core CPU + 4 GPUs"},
    }  # fmt: skip


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="throughput benchmarks with same-run baselines")
    p.add_argument("--suite", choices=("core", "poker", "kafka"), default="core")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"], help="poker suite")
    p.add_argument("--seconds", type=float, default=5.0, help="core suite: seconds per measurement")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                   help="core suite: fixed λ and half-life, and the auto settings measured against it "
                        "(default: all)")  # fmt: skip
    p.add_argument("--rows", type=int, default=1_025_010, help="poker suite: rows to generate")
    p.add_argument("--test-fraction", type=float, default=0.1, help="poker suite")
    p.add_argument("--batch-fraction", type=float, default=0.0027, help="poker suite: b as a fraction of the training rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--bootstrap", default=None, help="kafka suite: broker (default: the local one)")
    p.add_argument("--kafka-scale", type=float, default=1.0, help="kafka suite: scale every row count (e.g. 0.1 for a quick run)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="kafka suite: skip the 100k vs 1M rows RSS runs")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from . import runtime

    runtime.configure_blas()
    if args.suite == "core":
        out = {"suite": "core", "blas": runtime.blas_info(), "results": run_core(args)}
    elif args.suite == "poker":
        out = run_poker(args)
    else:
        from .bench_kafka import run_kafka

        out = run_kafka(args)
    if args.json:
        print(json.dumps(out, indent=2))
    elif args.suite != "core":
        print(json.dumps(out, indent=2))
    return 0
