"""The tables of "Random weights and the activation" in docs/benchmarks.md: every activation × init, measured.

Part 1 runs the ``iolstream evaluate`` protocol (default batch and label delay, ModelConfig's defaults
otherwise) once per data set, activation and init on seed 0, -F and -R, and prints per data set the test
metric, the prequential metric of -F and of -R, and the rows/s of both. Part 2 repeats the init ``auto``
picks for every activation on seeds 0..S-1 over segment and digits (-R only: the final test metric of -F
and -R is the same once every label is in, both hold the same sums), the mean against the best activation.
Part 3 prints the share of hidden units that ``core.unit_ranges`` finds linear or flat on the warm-up rows
(the worker and ``evaluate`` warn at 90 %). Part 4 runs the default model (relu, init auto) on every set
over the same seeds and checks that its random weights are bitwise the former default's (relu, xavier).
Part 5 runs, on part 2's seeds and sets, what init auto's picks were chosen against: other inits for
relu, selu and swish, other spreads s for sigmoid and tanh.

Usage (about 45 min on a shared 2-core machine; --parts, --sets and --seeds cut it):

    OPENBLAS_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/random_weights.py
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from iolstream.core import network
from iolstream.core.activation_kernels import ACTIVATIONS
from iolstream.core.model import EdRVFL
from iolstream.core.network import AUTO_INITS, INITS
from iolstream.tools.builtin_datasets import load
from iolstream.tools.protocol import EdRVFLLearner, Protocol, evaluate, make_split, model_config

EXPLICIT = tuple(i for i in INITS if i != "auto")
SETS = ("segment", "poker", "friedman", "digits", "wine", "breast_cancer", "iris")
TARGET_SETS = ("segment", "digits")


def load_set(name: str, seed: int, poker_rows: int, friedman_rows: int):
    if name == "poker":
        return load("poker", rows=poker_rows, seed=seed)
    if name == "friedman":
        return load("friedman", n_rows=friedman_rows, seed=seed)
    return load(name, seed=seed)


def run(dataset, activation: str, init: str, seed: int, modes) -> list:
    model = {"activation": activation, "init": init, "seed": seed}
    return evaluate(dataset, model=model, modes=modes, protocol=Protocol(seed=seed))


def part1(args) -> None:
    print("## Part 1: seed 0, -F and -R; cells: test · preq -F · preq -R (init auto: *)\n")
    for name in args.sets:
        ds = load_set(name, 0, args.poker_rows, args.friedman_rows)
        t0 = time.perf_counter()
        cells, speed = {}, {}
        for activation in ACTIVATIONS:
            for init in EXPLICIT:
                forward, ridge = run(ds, activation, init, 0, ("forward", "ridge"))
                cells[activation, init] = (
                    forward.test_metric,
                    forward.prequential_metric,
                    ridge.prequential_metric,
                )
                if init == AUTO_INITS[activation]:
                    speed[activation] = (forward.rows_per_second, ridge.rows_per_second)
        metric = forward.metric
        print(f"### {name} ({len(ds.X)} rows, {metric}; {time.perf_counter() - t0:.0f} s)\n")
        print("| activation | " + " | ".join(EXPLICIT) + " | rows/s -F / -R (auto) |")
        print("|---" * (len(EXPLICIT) + 2) + "|")
        for activation in ACTIVATIONS:
            row = []
            for init in EXPLICIT:
                test, preq_f, preq_r = cells[activation, init]
                star = "*" if init == AUTO_INITS[activation] else ""
                row.append(f"{star}{test:.4f} · {preq_f:.4f} · {preq_r:.4f}")
            f, r = speed[activation]
            print(f"| {activation} | " + " | ".join(row) + f" | {f:,.0f} / {r:,.0f} |")
        print(flush=True)


def part2(args) -> None:
    seeds = range(args.seeds)
    print(f"## Part 2: init auto, test accuracy, mean over seeds {seeds[0]}–{seeds[-1]} (-R)\n")
    means = {}
    for name in TARGET_SETS:
        for activation in ACTIVATIONS:
            accs = [
                run(
                    load_set(name, s, args.poker_rows, args.friedman_rows), activation, "auto", s, ("ridge",)
                )[0].test_metric
                for s in seeds
            ]
            means[name, activation] = (float(np.mean(accs)), accs)
    print("| activation (auto init) | " + " | ".join(f"{n} mean (gap to best)" for n in TARGET_SETS) + " |")
    print("|---" * (len(TARGET_SETS) + 1) + "|")
    best = {n: max(means[n, a][0] for a in ACTIVATIONS) for n in TARGET_SETS}
    for activation in ACTIVATIONS:
        cells = [
            f"{means[n, activation][0]:.4f} ({means[n, activation][0] - best[n]:+.4f})" for n in TARGET_SETS
        ]
        print(f"| {activation} ({AUTO_INITS[activation]}) | " + " | ".join(cells) + " |")
    within = all(means[n, a][0] >= best[n] - 0.01 for n in TARGET_SETS for a in ACTIVATIONS)
    print(
        f"\nevery activation within 0.01 of the best on {', '.join(TARGET_SETS)}: {'yes' if within else 'no'}"
    )
    for (name, activation), (_, accs) in means.items():
        print(f"  {name} {activation}: " + " ".join(f"{a:.4f}" for a in accs), file=sys.stderr)
    print(flush=True)


def part3(args) -> None:
    print("## Part 3: share of hidden units linear or flat on the warm-up rows (seed 0; warning at 90 %)\n")
    sets = [n for n in args.sets if n in TARGET_SETS] or list(TARGET_SETS)
    print("| activation | " + " | ".join(f"{n}: " + " / ".join(EXPLICIT) for n in sets) + " |")
    print("|---" * (len(sets) + 1) + "|")
    protocol = Protocol(seed=0)
    splits = {n: make_split(load_set(n, 0, args.poker_rows, args.friedman_rows), protocol) for n in sets}
    for activation in ACTIVATIONS:
        cells = []
        for n in sets:
            shares = []
            for init in EXPLICIT:
                cfg = model_config(splits[n], "ridge", {"activation": activation, "init": init})
                learner = EdRVFLLearner(cfg)
                learner.start(splits[n].x_train)  # freezes the scaler on the warm-up rows and measures
                shares.append(f"{learner.units.share:.0%}")
            cells.append(" / ".join(shares))
        print(f"| {activation} | " + " | ".join(cells) + " |")
    print(flush=True)


def part4(args) -> None:
    """The default model (relu, init auto) against the former default (relu, xavier), every set."""
    seeds = range(args.seeds)
    print(
        f"## Part 4: the defaults (init auto) against the former (xavier), mean over seeds {seeds[0]}–{seeds[-1]} (-R)\n"
    )
    print("| data set | metric | default (relu, auto) mean | random weights equal to xavier's |")
    print("|---|---|---|---|")
    for name in args.sets:
        values, same = [], True
        for s in seeds:
            ds = load_set(name, s, args.poker_rows, args.friedman_rows)
            (result,) = evaluate(ds, model={"seed": s}, modes=("ridge",), protocol=Protocol(seed=s))
            values.append(result.test_metric)
            split = make_split(ds, Protocol(seed=s))
            auto = EdRVFL(model_config(split, "ridge", {"seed": s}))
            xavier = EdRVFL(model_config(split, "ridge", {"seed": s, "init": "xavier"}))
            same &= auto.weights_digest() == xavier.weights_digest()
        print(f"| {name} | {result.metric} | {np.mean(values):.4f} | {'yes' if same else 'NO'} |")
        print(f"  {name} default: " + " ".join(f"{v:.4f}" for v in values), file=sys.stderr)
    print(flush=True)


# Part 5: the alternatives to init auto's picks, on the same seeds: (activation, init, spread s or None)
ALTERNATIVES = (
    ("relu", "kaiming", None),
    ("relu", "uniform", None),
    ("selu", "xavier", None),
    ("swish", "xavier", None),
    ("sigmoid", "spread", 2.0),
    ("sigmoid", "spread", 4.0),
    ("tanh", "spread", 1.0),
    ("tanh", "spread", 2.0),
)


def part5(args) -> None:
    """What init auto was chosen against: other inits, and other spreads s (network.SPREAD, set here)."""
    seeds = range(args.seeds)
    print(f"## Part 5: alternatives, test accuracy, mean over seeds {seeds[0]}–{seeds[-1]} (-R)\n")
    print("| activation, init | " + " | ".join(f"{n} mean" for n in TARGET_SETS) + " |")
    print("|---" * (len(TARGET_SETS) + 1) + "|")
    for activation, init, spread in ALTERNATIVES:
        saved = network.SPREAD.get(activation)
        if spread is not None:
            network.SPREAD[activation] = spread
        try:
            means = []
            for name in TARGET_SETS:
                accs = [
                    run(
                        load_set(name, s, args.poker_rows, args.friedman_rows),
                        activation,
                        init,
                        s,
                        ("ridge",),
                    )[0].test_metric
                    for s in seeds
                ]
                means.append(float(np.mean(accs)))
                print(
                    f"  {name} {activation} {init} {spread}: " + " ".join(f"{a:.4f}" for a in accs),
                    file=sys.stderr,
                )
        finally:
            if saved is not None:
                network.SPREAD[activation] = saved
        label = f"{activation}, {init}" + (f" s = {spread:g}" if spread is not None else "")
        print(f"| {label} | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    print(flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    p.add_argument("--seeds", type=int, default=5, help="part 2: seeds 0..S-1 (default 5)")
    p.add_argument("--poker-rows", type=int, default=10_000)
    p.add_argument("--friedman-rows", type=int, default=5_000)
    p.add_argument("--parts", nargs="+", type=int, default=[1, 2, 3, 4, 5], choices=[1, 2, 3, 4, 5])
    args = p.parse_args()
    print(f"# init_table: {' '.join(sys.argv[1:]) or '(defaults)'}\n")
    for part in args.parts:
        (part1, part2, part3, part4, part5)[part - 1](args)


if __name__ == "__main__":
    main()
