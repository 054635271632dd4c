"""The table "Real tables with categories and gaps" of docs/benchmarks.md: edRVFL reading a team's events by
the schema inferred from them, against River's pipelines, on real tabular data sets (tools/tabular.py:
categories, gaps, rare outcomes), in stream order with labels one batch late, prequential.

Every learner sees the same events in the same order, in batches of ``--batch`` rows: each batch is
predicted (the probabilities of its rows kept), then the labels of the batch before are learned.

- ``edRVFL``: the model the worker runs (``ModelConfig`` defaults: N = 512, L = 2, mode auto), with the
  feature schema inferred from the table (``tabular.table_schema``, as ``iolstream schema infer`` does):
  numbers z-scored by the first ``warmup_rows`` events (a gap: the mean and a 0/1 column), categories
  one-hot (or hashed), booleans 0/1;
- ``River LR``: River's pipeline for such events, OneHotEncoder on the text fields and StandardScaler on
  the numbers (a gap is a feature left out, River's way), into LogisticRegression;
- ``River HT``: River's HoeffdingTreeClassifier on the events as they are (text fields nominal).

Accuracy, log loss and AUC are computed with scikit-learn from the probabilities emitted, over every row.

    python benchmarks/real_tables.py                 # the five binary sets
    python benchmarks/real_tables.py --sets titanic --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.tools.tabular import TABULAR, load_tabular, table_dataset

SETS = ("credit", "telco-churn", "titanic", "default", "phone-churn")  # binary: AUC of the positive class


def batches(n: int, b: int):
    return [(start, min(start + b, n)) for start in range(0, n, b)]


def run_edrvfl(ts, b: int, seed: int) -> np.ndarray:
    """Probabilities (n, classes) emitted by the worker's model, labels one batch late."""
    ds = table_dataset(ts)
    model = EdRVFL(ModelConfig(classes=ts.classes, features=ds.schema.fields, seed=seed))
    X, y = ds.X, model.encode_labels(ts.labels)
    model.scaler.partial_fit(X[: model.config.warmup_rows])  # the warm-up rows fix the scaling
    model.scaler.freeze()
    proba = np.empty((len(X), len(ts.classes)))
    previous = None
    for start, stop in batches(len(X), b):
        pred = model.observe(
            X[start:stop]
        )  # -F: the batch's Gram in, then predicted (auto: the mode in force)
        proba[start:stop] = pred.proba
        if previous is not None:
            p, (a, z) = previous
            model.learn(p.features_t, y[a:z], predicted=p.predicted)
        previous = (pred, (start, stop))
    return proba


def river_events(ts) -> list[dict]:
    """The events as River takes them: a gap is a key left out."""
    return [{k: v for k, v in e.items() if v is not None} for e in ts.events]


def river_pipeline(kind: str, ts):
    from river import compose, linear_model, preprocessing, tree

    if kind == "ht":
        return tree.HoeffdingTreeClassifier()
    texts = [f for f in ts.fields if any(isinstance(e.get(f), str) for e in ts.events)]
    numbers = [f for f in ts.fields if f not in texts]

    def pick(names):  # the fields present (River's Select wants every one of them)
        return compose.FuncTransformer(lambda x: {k: x[k] for k in names if k in x})

    parts = [pick(texts) | preprocessing.OneHotEncoder()] if texts else []
    if numbers:
        parts.append(pick(numbers) | preprocessing.StandardScaler())
    union = parts[0] if len(parts) == 1 else compose.TransformerUnion(*parts)
    return union | linear_model.LogisticRegression()


def run_river(kind: str, ts, b: int) -> np.ndarray:
    """Probabilities emitted by a River pipeline, one event at a time, labels one batch late. LogisticRegression
    is binary: it learns "the positive class or not"."""
    model = river_pipeline(kind, ts)
    events = river_events(ts)
    classes = list(ts.classes)
    if kind == "lr":
        labels = [v == ts.positive for v in ts.labels]
        keys = [c == ts.positive for c in classes]
    else:
        labels, keys = list(ts.labels), classes
    proba = np.empty((len(events), len(classes)))
    previous = None
    for start, stop in batches(len(events), b):
        for i in range(start, stop):
            p = model.predict_proba_one(events[i])
            total = sum(p.values())
            proba[i] = [p.get(k, 0.0) / total if total > 0 else 1.0 / len(classes) for k in keys]
        if previous is not None:
            for i in range(*previous):
                model.learn_one(events[i], labels[i])
        previous = (start, stop)
    return proba


def scores(ts, proba: np.ndarray) -> dict:
    from sklearn.metrics import log_loss, roc_auc_score

    classes = list(ts.classes)
    y = np.array([classes.index(v) for v in ts.labels])
    clipped = np.clip(proba, 1e-15, 1.0)
    clipped /= clipped.sum(axis=1, keepdims=True)
    out = {
        "accuracy": float((proba.argmax(axis=1) == y).mean()),
        "log_loss": float(log_loss(y, clipped, labels=list(range(len(classes))))),
    }
    if ts.positive is not None and len(classes) == 2:
        positive = classes.index(ts.positive)
        out["auc"] = float(roc_auc_score(y == positive, proba[:, positive]))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=sorted(TABULAR))
    p.add_argument(
        "--batch", type=int, default=256, help="rows per batch; labels one batch late (default 256)"
    )
    p.add_argument("--seed", type=int, default=0, help="the tables' shuffle and the random weights")
    p.add_argument("--json", action="store_true", help="one JSON object per set and learner")
    args = p.parse_args(argv)
    learners = {
        "edRVFL": lambda ts: run_edrvfl(ts, args.batch, args.seed),
        "River LR": lambda ts: run_river("lr", ts, args.batch),
        "River HT": lambda ts: run_river("ht", ts, args.batch),
    }
    rows = []
    for name in args.sets:
        ts = load_tabular(name, seed=args.seed)
        width = table_dataset(ts).schema.width
        for learner, run in learners.items():
            t0 = time.perf_counter()
            proba = run(ts)
            seconds = time.perf_counter() - t0
            result = {
                "set": name,
                "rows": len(ts.events),
                "inputs": width,
                "learner": learner,
                **scores(ts, proba),
            }
            result["rows_per_second"] = len(ts.events) / seconds
            rows.append(result)
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print(
                    f"{name:12s} {learner:9s} acc {result['accuracy']:.4f}  log loss {result['log_loss']:.4f}  "
                    f"AUC {result.get('auc', float('nan')):.4f}  {result['rows_per_second']:,.0f} rows/s",
                    file=sys.stderr,
                    flush=True,
                )
    if not args.json:
        print("| set | rows | inputs | learner | accuracy | log loss | AUC |\n|---|---|---|---|---|---|---|")
        for r in rows:
            auc = f"{r['auc']:.3f}" if "auc" in r else "-"
            print(
                f"| {r['set']} | {r['rows']:,} | {r['inputs']} | {r['learner']} | {r['accuracy']:.4f} | "
                f"{r['log_loss']:.4f} | {auc} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
