"""The table "Which mode: -F, -R or `auto`" of docs/benchmarks.md: -F, -R and ``mode: auto`` side by side.

Every data set is streamed by ``iolstream evaluate``'s protocol (``tools.protocol``) three times, once per mode,
on the same split and the same random features: the shipped sets shuffled with a held-out test set (batches of
3 % of the training rows, labels one batch late), the drift streams in their own order (test-then-train, no
test set, batches of 100 rows); at the model defaults and in the paper's regime (N(0,1) random weights,
λ = 2⁻⁶, N = 256, L = 4, the setting of the paper's segment runs). The Supplement F simulation
(``iolstream simulate``) adds its single and batch streams, where ``auto`` is the model's selector run over
the -F and -R predictions of each repetition.

Columns: the prequential metric (accuracy, or RMSE for regression), the prequential log loss of the emitted
probabilities (classification), the cumulative squared-loss regret
against the offline expert (docs/design.md §3, mean over layers; for auto, the loss of what it emitted), the final test
metric, and training rows per second (the stream's predict + learn time; on the small sets it is mostly fixed
per-batch cost). The output is the markdown table, preceded by the command that made it.

    nice -n 5 .venv/bin/python benchmarks/which_mode.py                  # everything (about 15 min on 2 cores)
    nice -n 5 .venv/bin/python benchmarks/which_mode.py --sets iris wine --regimes default --no-simulation
"""

from __future__ import annotations

import argparse
import math
import sys

from iolstream.tools import builtin_datasets, drift
from iolstream.tools.protocol import Protocol, evaluate
from iolstream.tools.simulate import SimulationConfig, simulate

SETS = ("segment", "iris", "wine", "digits", "breast_cancer", "diabetes", "sea", "rbf-drift")
REGIMES = {
    "default": {},
    "paper": {"init": "normal", "lam": 2.0**-6, "n_nodes": 256, "n_layers": 4},
}
MODES = ("forward", "ridge", "auto")
NAMES = {"forward": "-F", "ridge": "-R", "auto": "auto"}


def run_set(name: str, regime: str, *, seed: int, drift_rows: int, calibration: str = "online") -> list[dict]:
    """One row per mode: the metrics of ``name`` in ``regime``."""
    stream = name in drift.STREAMS
    data = (
        builtin_datasets.load(name, n_rows=drift_rows, seed=seed)
        if stream
        else builtin_datasets.load(name, seed=seed)
    )
    protocol = Protocol(order="stream", batch=100, seed=seed) if stream else Protocol(seed=seed)
    model = {**REGIMES[regime], "seed": seed}
    if data.task == "classification":
        model["calibration"] = calibration
    results = evaluate(data, model=model, modes=MODES, protocol=protocol)
    rows = []
    for mode, r in zip(MODES, results):
        rows.append(
            {
                "set": name,
                "regime": regime,
                "mode": mode,
                "metric": r.metric,
                "prequential": r.prequential_metric,
                "log_loss": math.nan if r.log_loss is None else r.log_loss,
                "regret": r.cumulative_regret,
                "test": r.test_metric,
                "rows_per_second": r.rows_per_second,
                "in_force": r.config["effective"]["mode"] if mode == "auto" else None,
                "rows": r.rows,
            }
        )
    return rows


def run_simulation(repetitions: int, seed: int) -> list[dict]:
    """Supplement F at λ = 0.01 (the paper's middle value): mean CR_T over the repetitions, per stream."""
    cfg = SimulationConfig(lams=(0.01,), repetitions=repetitions, seed=seed)
    rows = []
    for r in simulate(cfg):
        rows.append(
            {
                "set": f"Supplement F, {r.stream} stream",
                "regime": f"λ = 0.01, {repetitions} reps",
                "mode": r.mode,
                "metric": "-",
                "prequential": math.nan,
                "log_loss": math.nan,
                "regret": r.cumulative_regret,
                "test": math.nan,
                "rows_per_second": math.nan,
                "in_force": None,
                "rows": cfg.horizon * cfg.rows_per_step(r.stream),
            }
        )
    return rows


def _cell(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def markdown(rows: list[dict]) -> str:
    """One line per (set, regime): each column shows -F / -R / auto; the better of -F and -R in bold."""
    out = [
        "| data (rows streamed) | regime | metric | prequential -F / -R / auto | log loss -F / -R / auto "
        "| cum. regret -F / -R / auto | final test -F / -R / auto | rows/s -F / -R / auto | auto's mode at the end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["set"], r["regime"]) for r in rows))
    for key in keys:
        group = {r["mode"]: r for r in rows if (r["set"], r["regime"]) == key}
        first = next(iter(group.values()))
        higher = first["metric"] == "accuracy"

        def triple(field: str, spec: str, best: str | None, group=group) -> str:
            values = [group[m][field] for m in MODES]
            cells = [_cell(v, spec) for v in values]
            f_r = values[:2]
            if best is not None and not any(v is None or math.isnan(v) for v in f_r) and f_r[0] != f_r[1]:
                win = (f_r[0] > f_r[1]) == (best == "high")
                cells[0 if win else 1] = f"**{cells[0 if win else 1]}**"
            return " / ".join(cells)

        spec = ".4f" if first["metric"] == "accuracy" else ".2f"
        in_force = group["auto"]["in_force"]
        out.append(
            f"| {key[0]} ({first['rows']:,}) | {key[1]} | {first['metric']} "
            f"| {triple('prequential', spec, 'high' if higher else 'low')} "
            f"| {triple('log_loss', '.4f', 'low')} "
            f"| {triple('regret', '.4g', 'low')} | {triple('test', spec, None)} "
            f"| {triple('rows_per_second', ',.0f', None)} | {NAMES.get(in_force, '—')} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument(
        "--drift-rows", type=int, default=20_000, help="rows of each drift stream (default: %(default)s)"
    )
    p.add_argument(
        "--repetitions", type=int, default=50, help="Supplement F repetitions (default: %(default)s)"
    )
    p.add_argument("--no-simulation", dest="simulation", action="store_false")
    p.add_argument(
        "--calibration",
        choices=("online", "none"),
        default="online",
        help="model.calibration of the classification sets; none: the softmax of the layers, and auto's selector "
        "judging by 0/1 loss, as before calibration (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = []
    for name in args.sets:
        for regime in args.regimes:
            print(f"{name} ({regime})...", file=sys.stderr, flush=True)
            rows += run_set(
                name, regime, seed=args.seed, drift_rows=args.drift_rows, calibration=args.calibration
            )
    if args.simulation:
        print("Supplement F...", file=sys.stderr, flush=True)
        rows += run_simulation(args.repetitions, args.seed)
    print(
        f"`{' '.join(['python benchmarks/which_mode.py', *(argv if argv is not None else sys.argv[1:])])}`\n"
    )
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
