"""``iolstream bench``: throughput against baselines measured in the same run.

Suites:
- ``core``: one full -F step (features, forward update, prediction, label fold-in)
  for the "small" and the paper's "poker" configs, float64 and float32: rows/s, the
  algorithm's minimal FLOPs per row, the GEMM rate NumPy reaches on the same shapes
  and dtype in this run, and ``efficiency`` = achieved minimal-FLOP rate ÷ GEMM rate.
- ``poker``: the paper's largest run (Table 13 configuration) on generated poker hands.
- ``kafka``: end to end through the local broker (see ``bench_kafka``), at one ``model.mode`` or several side by
  side (``--modes auto forward``).
  The core suite also runs each config with ``lam: auto`` (3 λ candidates sharing one Gram: one
  Cholesky and solve per λ), ``forgetting: auto`` (3 half-lives, their own sums) and both (9
  candidates, 3 sets of sums), ``mode: auto`` alone (-F and -R: 2 candidates, one set of sums and A_r), with
  ``lam: auto`` (6) and with both (18), with ``cost_vs_fixed`` = fixed rows/s ÷ these rows/s, same run.
- ``group``: 1 worker against a group of workers sharing one model, the per-sync costs and the group's
  quality against one worker (see ``bench_group``).
- ``memory``: bytes per waiting label and per waiting row of the stream logic, after floods (see ``bench_memory``).
- ``retention``: the retention store of forget requests: bytes per row, its writes, the read of a row asked for
  (see ``bench_retention``).
- ``core`` also times forgetting on request (``--forget``, default on): a learned batch of b rows taken back out
  of the model against a step learning b rows, interleaved in one run (``bench_core.bench_forget_step``).

Machines here are shared and noisy: compare ratios within one run, not seconds across runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

import numpy as np

from iolstream.core.candidates import MODES
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.tools.bench_core import CONFIGS, SETTINGS, bench_core_step, bench_forget_step


def run_core(args) -> list[dict]:
    """Every config, dtype and setting; with ``--rounds R`` the settings are measured R times in turn (fixed,
    then each other, again) and each keeps its best rows/s: a busy machine's slow spells hit one measurement of
    a setting, not all of its. ``cost_vs_fixed`` compares the best with the best."""
    results = []
    settings = ["fixed"] + [s for s in args.settings if s != "fixed"]  # fixed first: the others' yardstick
    for name in args.configs:
        for dtype in args.dtypes:
            best, gemm = {}, None
            for _ in range(args.rounds):
                for setting in settings:
                    r = bench_core_step(name, dtype, seconds=args.seconds, setting=setting, gemm=gemm)
                    gemm = r.gemm_gflops
                    if setting not in best or r.rows_per_second > best[setting].rows_per_second:
                        best[setting] = r
            fixed = best["fixed"].rows_per_second
            for setting in settings:
                r = best[setting]
                r.cost_vs_fixed = fixed / r.rows_per_second
                results.append(asdict(r))
                if not args.json:
                    print(
                        f"{name:6s} {dtype:8s} {setting:15s} b={r.batch:5d}  {r.rows_per_second:10.0f} rows/s  "
                        f"{r.minimal_flops_per_row / 1e6:7.2f} MFLOP/row  {r.achieved_gflops:6.1f} GFLOP/s  "
                        f"GEMM {r.gemm_gflops:6.1f}  efficiency {r.efficiency:.2f}  cost vs fixed {r.cost_vs_fixed:5.2f}x",
                        flush=True,
                    )
            if args.forget:
                results += run_forget(args, name, dtype, settings)
    return results


def run_forget(args, name: str, dtype: str, settings: list[str]) -> list[dict]:
    """Forgetting b rows against learning b rows, per setting (``bench_forget_step``): with ``--rounds R``, each
    setting R times in turn, the round with the median ratio kept (both rates of a round come from one run)."""
    out = []
    cases = [(setting, stamps) for setting in settings for stamps in (1, 2)]
    rounds = {case: [] for case in cases}
    for _ in range(args.rounds):
        for setting, stamps in cases:
            f = bench_forget_step(name, dtype, seconds=args.seconds, setting=setting, stamps=stamps)
            rounds[(setting, stamps)].append(f)
    for case in cases:
        f = sorted(rounds[case], key=lambda r: r.forget_vs_learn)[len(rounds[case]) // 2]
        out.append({"case": "forget", **asdict(f)})
        if not args.json:
            print(
                f"{name:6s} {dtype:8s} {case[0]:15s} b={f.batch:5d}  forget ({f.stamps} stamp{'s' if f.stamps > 1 else ''}) "
                f"{f.forget_rows_per_second:8.0f} rows/s  learn {f.learn_rows_per_second:8.0f} rows/s  "
                f"forget vs learn {f.forget_vs_learn:5.2f}x",
                flush=True,
            )
    return out


def run_poker(args) -> dict:
    """The paper's largest run: N=989, L=5, λ=4, ReLU, xavier, b = 0.0027 of the rows, -F, sorted cards."""
    from iolstream.tools.builtin_datasets import load

    data = load("poker", rows=args.rows, seed=args.seed, sort_cards=True)
    n_test = max(int(round(len(data.y) * args.test_fraction)), 1)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(data.y))
    test, train = order[:n_test], order[n_test:]
    b = max(int(round(args.batch_fraction * len(train))), 1)
    cfg = ModelConfig(
        n_inputs=data.X.shape[1],
        classes=data.classes,
        n_nodes=989,
        n_layers=5,
        lam=4.0,
        activation="relu",
        init="xavier",
        seed=args.seed,
        mode="forward",
        dtype=args.dtype,
        scaler="warmup",
        warmup_rows=min(10_000, len(train)),
        track_regret=False,
    )
    model = EdRVFL(cfg)
    from iolstream.core import step_tuner

    step_tuner.configure_for_model(model)
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
            print(
                f"\r{done:>9d}/{len(train)} rows  {done / (time.perf_counter() - t0):8.0f} rows/s",
                end="",
                file=sys.stderr,
            )
    model.learn(prev.features_t, prev_y, predicted=prev.layer_outputs)
    seconds = time.perf_counter() - t0
    if args.progress:
        print(file=sys.stderr)
    test_pred = np.concatenate(
        [model.predict_batch(data.X[test[i : i + 20_000]]).index for i in range(0, len(test), 20_000)]
    )
    test_acc = float((np.asarray(data.classes)[test_pred] == data.y[test]).mean())
    return {
        "suite": "poker",
        "rows": int(len(data.y)),
        "train_rows": int(len(train)),
        "test_rows": int(n_test),
        "batch": b,
        "dtype": args.dtype,
        "seconds": seconds,
        "minutes": seconds / 60.0,
        "rows_per_second": len(train) / seconds,
        "prequential_accuracy": correct / len(train),
        "test_accuracy": test_acc,
        "paper": {"minutes": 4.91, "test_accuracy_forward": 0.9352, "hardware": "64-core CPU + 4 GPUs"},
    }


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="throughput benchmarks with same-run baselines")
    p.add_argument(
        "--suite", choices=("core", "poker", "kafka", "memory", "group", "retention"), default="core"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"], help="poker suite")
    p.add_argument("--seconds", type=float, default=5.0, help="core suite: seconds per measurement")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="core suite: measure every setting this many times in turn, keep each one's best; kafka suite: run "
        "the worker of every mode (--modes) this many times in turn, keep each one's best (default: 1)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=["auto"],
        choices=list(MODES),
        help="kafka suite: the model.mode of the learner, processor and worker runs, each in the same run, with "
        "their rates side by side (e.g. auto forward; default: auto, the default mode)",
    )
    p.add_argument(
        "--settings",
        nargs="+",
        default=list(SETTINGS),
        choices=list(SETTINGS),
        help="core suite: fixed λ and half-life, and the auto settings measured against it (default: all)",
    )
    p.add_argument(
        "--forget",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="core suite: also time forgetting b rows on request against learning them (default: on)",
    )
    p.add_argument("--rows", type=int, default=1_025_010, help="poker suite: rows to generate")
    p.add_argument("--test-fraction", type=float, default=0.1, help="poker suite")
    p.add_argument(
        "--batch-fraction",
        type=float,
        default=0.0027,
        help="poker suite: b as a fraction of the training rows",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--bootstrap", default=None, help="kafka suite: broker (default: the local one)")
    p.add_argument(
        "--prefix",
        default="bench",
        help="kafka and group suites: the prefix of every topic and consumer group a run makes (default bench; "
        "on a cluster whose ACLs grant topics and groups by prefix, give that one)",
    )
    p.add_argument(
        "--kafka-scale",
        type=float,
        default=1.0,
        help="kafka suite: scale every row count (e.g. 0.1 for a quick run)",
    )
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="kafka suite: skip the 100k vs 1M rows RSS runs",
    )
    p.add_argument(
        "--group-rows", type=int, default=120_000, help="group suite: rows pre-produced (times --kafka-scale)"
    )
    p.add_argument("--partitions", type=int, default=4, help="group suite: partitions of the input topics")
    p.add_argument(
        "--group-workers", type=int, default=2, help="group suite: workers in the group (against 1)"
    )
    p.add_argument(
        "--no-group-quality",
        dest="group_quality",
        action="store_false",
        help="group suite: skip the quality table",
    )
    p.add_argument(
        "--group-poker-rows",
        type=int,
        default=0,
        help="group suite: also the quality table on this many poker rows (1000000: ~30 min on 2 cores)",
    )
    p.add_argument(
        "--group-sync-rows",
        type=int,
        default=10_000,
        help="group suite: poker quality, a member syncs every S rows of its own",
    )
    p.add_argument("--memory-messages", type=int, default=600_000, help="memory suite: messages a flood")
    p.add_argument(
        "--retention-rows",
        type=int,
        default=1_000_000,
        help="retention suite: rows the store keeps (its window)",
    )
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from iolstream.core import blas_pools
    from iolstream.ops import logs

    logs.setup("WARNING", "text")  # librdkafka's complaints through the repeat filter, never raw
    blas_pools.configure_blas()
    if args.suite == "core":
        out = {"suite": "core", "blas": blas_pools.blas_info(), "results": run_core(args)}
    elif args.suite == "poker":
        out = run_poker(args)
    elif args.suite == "group":
        from iolstream.tools.bench_group import run_group

        out = run_group(args)
    elif args.suite == "memory":
        from iolstream.tools.bench_memory import run_memory

        out = run_memory(args)
    elif args.suite == "retention":
        from iolstream.tools.bench_retention import run_retention

        out = run_retention(args)
    else:
        from iolstream.tools.bench_kafka import run_kafka

        out = run_kafka(args)
    if args.json:
        print(json.dumps(out, indent=2))
    elif args.suite != "core":
        print(json.dumps(out, indent=2))
    return 0
