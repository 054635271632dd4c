"""The table "Real tables with categories and gaps" of docs/benchmarks.md: edRVFL reading a team's events by the
schema inferred from them, against River's logistic pipeline, a Hoeffding tree and an adaptive random forest, on
real binary tables (``tools.tabular``: categories, gaps, a rare outcome), every learner in the same run.

Each table's rows are shuffled once (``--seed``) and streamed in that order in batches of ``--batch`` rows. Every
batch is predicted, then its labels arrive just before the next batch is predicted (labels one batch late), and
every prediction is scored when its label comes (prequential, every row, the probabilities as they were emitted).

- ``edRVFL``: the model the worker runs, at its defaults (``ModelConfig``: N = 512, L = 2, ``mode: auto``,
  ``calibration: online``), reading the events by the schema inferred from the table (``tabular.table_dataset``,
  as ``iolstream schema infer`` does): numbers z-scored by the first ``warmup_rows`` events (a gap: the mean and
  a 0/1 column), categories one-hot (or hashed), booleans 0/1. ``inputs`` is the width of its input row.
- ``River logistic``: River's pipeline for such events, OneHotEncoder on the text fields and StandardScaler on
  the numbers, into LogisticRegression; a gap is a key left out (River's convention), a boolean a number.
- ``River Hoeffding tree`` and ``River ARF`` (``ARFClassifier``, seed ``--seed``): the events as they are.

Metrics (``stream.prequential.classification_report``, the worker's own): accuracy, log loss, ROC AUC of the
positive class (the one a team scores: bad credit, churn, default, survival), Brier score, balanced accuracy,
the recall of the positives; rows/s is predict + learn time, one learner at a time.

    nice -n 10 .venv/bin/python benchmarks/real_tables.py                  # the five binary tables
    nice -n 10 .venv/bin/python benchmarks/real_tables.py --sets titanic --no-arf --json
    nice -n 10 .venv/bin/python benchmarks/real_tables.py --no-river --variant '{"lam": 5}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.prequential import classification_report
from iolstream.tools.learners import compile_kernels
from iolstream.tools.tabular import load_tabular, table_dataset

BINARY = ("credit", "telco-churn", "default", "titanic", "phone-churn")


def batches(n: int, b: int) -> list[tuple[int, int]]:
    return [(start, min(start + b, n)) for start in range(0, n, b)]


def river_models(seed: int, arf: bool) -> dict:
    from river import compose, forest, linear_model, preprocessing, tree

    numbers = compose.SelectType(int, float) | preprocessing.StandardScaler()
    categories = compose.SelectType(str) | preprocessing.OneHotEncoder()
    models = {
        "River logistic": (numbers + categories) | linear_model.LogisticRegression(),
        "River Hoeffding tree": tree.HoeffdingTreeClassifier(),
    }
    if arf:
        models["River ARF"] = forest.ARFClassifier(seed=seed)
    return models


def river_event(event: dict) -> dict:
    """A gap is an absent key (River's convention); booleans are numbers."""
    return {k: (float(v) if isinstance(v, bool) else v) for k, v in event.items() if v is not None}


def run_edrvfl(x: np.ndarray, y: np.ndarray, b: int, features, seed: int, **model):
    """Prequential probabilities (n, 2) and classes (n,) of edRVFL, labels one batch late; rows per second. ``x``:
    the rows encoded by the schema ``features`` (gaps NaN: the warm-up scaler maps them to the mean)."""
    cfg = ModelConfig(classes=(0, 1), features=features, **{"seed": seed, **model})
    m = EdRVFL(cfg)
    m.scaler.partial_fit(x[: cfg.warmup_rows])  # the warm-up rows fix the scaling (streamed all the same)
    m.scaler.freeze()
    proba, index = np.empty((len(y), 2)), np.empty(len(y), dtype=np.int64)
    previous = None
    tic = time.perf_counter()
    for start, stop in batches(len(y), b):
        if previous is not None:  # the labels of the batch before, just before this one is predicted
            p, lo, hi = previous
            m.learn(p.features_t, m.one_hot(y[lo:hi]), predicted=p.predicted, observed_at=p.clock)
        pred = m.observe(x[start:stop])  # -F: the batch's Gram in, then predicted (auto: the mode in force)
        proba[start:stop], index[start:stop] = pred.proba, pred.index
        previous = (pred, start, stop)
    return proba, index, len(y) / (time.perf_counter() - tic)


def run_river(model, events: list[dict], y: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The same protocol for a River classifier, one row at a time."""
    proba = np.empty((len(y), 2))
    previous = None
    tic = time.perf_counter()
    for start, stop in batches(len(y), b):
        if previous is not None:
            for i in range(*previous):
                model.learn_one(events[i], int(y[i]))
        for i in range(start, stop):
            p = model.predict_proba_one(events[i])
            p1 = float(p.get(1, 0.0)) if p else 0.5
            total = p1 + float(p.get(0, 0.0)) if p else 1.0
            p1 = p1 / total if total > 0 else 0.5
            proba[i] = (1.0 - p1, p1)
        previous = (start, stop)
    return proba, proba.argmax(axis=1), len(y) / (time.perf_counter() - tic)


def variant_label(settings: dict) -> str:
    """``edRVFL`` and the settings that differ from the defaults: ``edRVFL (lam: auto, scoring_share: all)``."""
    return "edRVFL" + (f" ({', '.join(f'{k}: {v}' for k, v in settings.items())})" if settings else "")


def measure(name: str, b: int, seed: int, *, arf: bool = True, river: bool = True, variants=({},)):
    """One row per learner on table ``name``: its prequential metrics and rows/s. ``variants``: the edRVFL settings
    measured (each a dict of ``ModelConfig`` fields; ``{}`` the defaults)."""
    ts = load_tabular(name, seed=seed)
    y = np.array([1 if label == ts.positive else 0 for label in ts.labels], dtype=np.int64)
    ds = table_dataset(ts)
    x, features = ds.X, ds.schema.fields
    runs = {}
    for settings in variants:
        compile_kernels(ModelConfig(classes=(0, 1), features=features, **settings), parallel=False)
        runs[variant_label(settings)] = lambda settings=settings: run_edrvfl(
            x, y, b, features, seed, **settings
        )
    if river:
        events = [river_event(e) for e in ts.events]
        for label, river_model in river_models(seed, arf).items():
            runs[label] = lambda river_model=river_model: run_river(river_model, events, y, b)
    rows = []
    for label, run in runs.items():
        print(f"  {name}: {label}...", file=sys.stderr, flush=True)
        proba, index, rate = run()
        report = classification_report(y, index, proba, 2)
        rows.append(
            {
                "set": name,
                "learner": label,
                "rows": len(y),
                "inputs": ds.schema.width,
                "positives": float(y.mean()),
                "rows_per_second": rate,
                **{k: v for k, v in report.items() if k not in ("precision", "recall")},
                "recall_positive": report["recall"][1],
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| table (rows, inputs, positives) | learner | accuracy | log loss | ROC AUC | Brier | balanced accuracy "
        "| recall of the positives | rows/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['set']} ({r['rows']:,}, {r['inputs']}, {r['positives']:.1%}) | {r['learner']} "
            f"| {r['accuracy']:.4f} | {r['log_loss']:.4f} | {r['roc_auc']:.4f} | {r['brier']:.4f} "
            f"| {r['balanced_accuracy']:.4f} | {r['recall_positive']:.4f} | {r['rows_per_second']:,.0f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=list(BINARY), choices=list(BINARY))
    p.add_argument("--batch", type=int, default=100, help="rows per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the tables' shuffle, the random weights, ARF's seed")
    p.add_argument("--no-arf", dest="arf", action="store_false", help="leave out River's ARF (the slowest)")
    p.add_argument(
        "--no-river",
        dest="river",
        action="store_false",
        help="edRVFL alone (River's rows do not depend on it)",
    )
    p.add_argument(
        "--variant",
        type=json.loads,
        action="append",
        help="an edRVFL setting measured beside the defaults (JSON of model fields, repeatable): '{\"lam\": 5}'",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per table and learner, no table")
    args = p.parse_args(argv)
    rows = []
    for name in args.sets:
        variants = ({}, *(args.variant or ()))
        for row in measure(name, args.batch, args.seed, arf=args.arf, river=args.river, variants=variants):
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        command = ["python benchmarks/real_tables.py", *(argv if argv is not None else sys.argv[1:])]
        print(f"`{' '.join(command)}`\n")
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
