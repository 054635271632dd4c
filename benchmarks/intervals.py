"""The table "Regression intervals" of docs/benchmarks.md: how much of a regression stream the intervals
(``model.interval``, ``core.intervals``) cover, against the coverage asked.

Each set is shuffled once (``--seed``) and streamed in batches of ``--batch`` rows, labels one batch late, by the
model at its defaults with ``model.interval`` set; every row predicted once its interval exists (after the first
labelled batch past the target warm-up) is scored: inside [y_lo, y_hi] or not, and the interval's width.

    nice -n 10 .venv/bin/python benchmarks/intervals.py
    nice -n 10 .venv/bin/python benchmarks/intervals.py --sets diabetes --coverages 0.9
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.tools import builtin_datasets
from iolstream.tools.tabular import load_tabular, table_dataset

SETS = ("diabetes", "friedman", "loans")


def load(name: str, seed: int):
    """(x, y, config fields) of a regression set: the shipped ones as arrays, ``loans`` by its inferred schema."""
    if name == "loans":
        ds = table_dataset(load_tabular(name, seed=seed))
        return ds.X, np.asarray(ds.y, dtype=np.float64), {"features": ds.schema.fields}
    ds = builtin_datasets.load(name, seed=seed)
    order = np.random.default_rng(seed).permutation(len(ds.X))
    return ds.X[order], np.asarray(ds.y, dtype=np.float64)[order], {"n_inputs": ds.X.shape[1]}


def stream(x, y, b: int, config: ModelConfig) -> dict:
    """Coverage, mean width and RMSE of the rows predicted with an interval, labels one batch late."""
    model = EdRVFL(config)
    model.scaler.partial_fit(x[: config.warmup_rows])
    model.scaler.freeze()
    inside, width, errors, previous = [], [], [], None
    for start in range(0, len(x), b):
        if previous is not None:
            p, lo, hi = previous
            model.learn(
                p.features_t, y[lo:hi].reshape(hi - lo, -1), predicted=p.predicted, observed_at=p.clock
            )
        pred = model.observe(x[start : start + b])
        y_lo, y_hi = pred.interval
        truth = y[start : start + b].reshape(len(y_lo), -1)
        known = np.isfinite(y_lo).all(axis=1)
        inside.append(((truth >= y_lo) & (truth <= y_hi)).all(axis=1)[known])
        width.append((y_hi - y_lo)[known].mean(axis=1))
        errors.append((truth - pred.value)[known].ravel())
        previous = (pred, start, start + b)
    inside, width, errors = np.concatenate(inside), np.concatenate(width), np.concatenate(errors)
    return {
        "scored": len(inside),
        "coverage": float(inside.mean()),
        "width": float(width.mean()),
        "rmse": float(np.sqrt((errors**2).mean())),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    p.add_argument("--coverages", nargs="+", type=float, default=[0.5, 0.8, 0.9, 0.95])
    p.add_argument("--batch", type=int, default=100, help="rows per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(
        f"`{' '.join(['python benchmarks/intervals.py', *(argv if argv is not None else sys.argv[1:])])}`\n"
    )
    print(
        "| set (rows, target deviation) | coverage asked | covered | mean width | RMSE |\n|---|---|---|---|---|"
    )
    for name in args.sets:
        x, y, fields = load(name, args.seed)
        for coverage in args.coverages:
            config = ModelConfig(seed=args.seed, interval=coverage, **fields)
            r = stream(x, y, args.batch, config)
            print(
                f"| {name} ({len(y):,}, {y.std():.4g}) | {coverage:.2f} | {r['coverage']:.4f} | {r['width']:.4g} "
                f"| {r['rmse']:.4g} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
