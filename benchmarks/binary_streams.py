"""The table "Binary streams with categories and gaps" of docs/benchmarks.md: edRVFL's calibrated probabilities
against River's logistic pipeline, a Hoeffding tree and an adaptive random forest, on the same streams in one run.

Each stream is a real table of ``tools.tabular`` (categories, gaps, a rare outcome), its rows shuffled once (seed 0),
streamed in batches of ``--batch`` rows: every batch is predicted, then learned one batch late (its labels arrive
just before the next batch is predicted), and every prediction is scored when its label comes (prequential, every
row). edRVFL takes the table through ``tabular.encode_by_hand`` (numbers z-scored on the first 256 rows, gaps as 0
plus a missing column, categories one-hot) at the model defaults (``mode: auto``, ``calibration: online``,
``scaler: none`` since the encoding scaled); River's models take the events themselves: gaps are absent keys,
the logistic pipeline one-hot encodes the strings and scales the numbers (OneHotEncoder + StandardScaler +
LogisticRegression), the trees split on both.

    nice -n 10 .venv/bin/python benchmarks/binary_streams.py                 # the five binary tables
    nice -n 10 .venv/bin/python benchmarks/binary_streams.py --sets default --no-arf
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.prequential import classification_report
from iolstream.tools.learners import compile_kernels
from iolstream.tools.tabular import TABULAR, load_tabular, table_dataset

BINARY = ("credit", "telco-churn", "default", "titanic", "phone-churn")


def _river_models(seed: int, arf: bool) -> dict:
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


def _river_event(event: dict) -> dict:
    """A gap is an absent key (River's convention); booleans are numbers."""
    return {k: (float(v) if isinstance(v, bool) else v) for k, v in event.items() if v is not None}


def _batches(n: int, b: int):
    return [(start, min(start + b, n)) for start in range(0, n, b)]


def run_edrvfl(x: np.ndarray, y: np.ndarray, b: int, seed: int, features, **model):
    """Prequential probabilities (n, 2) and classes (n,) of edRVFL, labels one batch late; rows per second. ``x``:
    the rows encoded by the schema ``features`` (gaps NaN: the warm-up scaler maps them to the mean)."""
    cfg = ModelConfig(classes=(0, 1), features=features, seed=seed, **model)
    m = EdRVFL(cfg)
    m.scaler.partial_fit(x[: cfg.warmup_rows])  # the warm-up rows fix the scaling (streamed all the same)
    m.scaler.freeze()
    proba, index = np.empty((len(y), 2)), np.empty(len(y), dtype=np.int64)
    prev = None
    tic = time.perf_counter()
    for start, stop in _batches(len(y), b):
        if prev is not None:  # the labels of the batch before, just before this one is predicted
            p, lo, hi = prev
            m.learn(p.features_t, m.one_hot(y[lo:hi]), predicted=p.predicted, observed_at=p.clock)
        pred = m.observe(x[start:stop])
        proba[start:stop], index[start:stop] = pred.proba, pred.index
        prev = (pred, start, stop)
    return proba, index, len(y) / (time.perf_counter() - tic)


def run_river(model, events: list[dict], y: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The same protocol for a River classifier, one row at a time."""
    proba = np.empty((len(y), 2))
    tic = time.perf_counter()
    prev = None
    for start, stop in _batches(len(y), b):
        if prev is not None:
            for i in range(*prev):
                model.learn_one(events[i], int(y[i]))
        for i in range(start, stop):
            p = model.predict_proba_one(events[i])
            p1 = float(p.get(1, 0.0)) if p else 0.5
            total = p1 + float(p.get(0, 0.0)) if p else 1.0
            p1 = p1 / total if total > 0 else 0.5
            proba[i] = (1.0 - p1, p1)
        prev = (start, stop)
    return proba, proba.argmax(axis=1), len(y) / (time.perf_counter() - tic)


def measure(name: str, b: int, seed: int, arf: bool, river: bool = True) -> list[dict]:
    ts = load_tabular(name, seed=seed)
    positive = ts.positive
    y = np.array([1 if label == positive else 0 for label in ts.labels], dtype=np.int64)
    ds = table_dataset(ts)
    x, features = ds.X, ds.schema.fields
    events = [_river_event(e) for e in ts.events]
    rows = []
    compile_kernels(ModelConfig(classes=(0, 1), features=features), parallel=False)
    runs = {"edRVFL": lambda: run_edrvfl(x, y, b, seed, features)}
    for label, model in (_river_models(seed, arf) if river else {}).items():
        runs[label] = lambda model=model: run_river(model, events, y, b)
    for label, run in runs.items():
        print(f"  {name}: {label}...", file=sys.stderr, flush=True)
        proba, index, rate = run()
        report = classification_report(y, index, proba, 2)
        rows.append(
            {
                "set": name,
                "learner": label,
                "rows": len(y),
                "positives": float(y.mean()),
                "rate": rate,
                **report,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| stream (rows, positives) | learner | log loss | ROC AUC | Brier | accuracy | balanced accuracy | recall of the positives | rows/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['set']} ({r['rows']:,}, {r['positives']:.1%}) | {r['learner']} | {r['log_loss']:.4f} | "
            f"{r['roc_auc']:.4f} | {r['brier']:.4f} | {r['accuracy']:.4f} | {r['balanced_accuracy']:.4f} | "
            f"{r['recall'][1]:.4f} | {r['rate']:,.0f} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=list(BINARY), choices=[n for n in TABULAR])
    p.add_argument("--batch", type=int, default=100, help="rows per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-arf", dest="arf", action="store_false", help="leave out River's ARF (the slowest)")
    p.add_argument(
        "--no-river",
        dest="river",
        action="store_false",
        help="edRVFL alone (River's rows do not change with it)",
    )
    args = p.parse_args(argv)
    rows = []
    for name in args.sets:
        rows += measure(name, args.batch, args.seed, args.arf, args.river)
    print(
        f"`{' '.join(['python benchmarks/binary_streams.py', *(argv if argv is not None else sys.argv[1:])])}`\n"
    )
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
