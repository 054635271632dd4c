"""The section "Drift: what λ and the half-life cannot reach" of docs/benchmarks.md: what choosing λ and the
half-life cannot reach on the drift streams. Everything runs through the product's protocol (``iolstream
evaluate --order stream --mode forward --batch 256``: labels one batch late), fixed settings only.

- ``hyperplane``: every fixed (λ, half-life) of a grid wider than ``auto``'s, against River's linear model;
  then the reason: on a *stationary* noisy hyperplane, the least-squares fit of 0/1 targets (what the output
  layer is) against a logistic fit (what River's SoftmaxRegression follows by SGD), by rows seen.
- ``agrawal``: each of the two concepts alone, as a stream of its own (function 0, seed 0 and function 2,
  seed 1, as ``tools/drift.py`` joins them): accuracy per 5,000-row window, to show where the random
  features level off on each concept, and the drift stream's last 20 % next to function 2 alone.

    nice -n 5 .venv/bin/python benchmarks/drift_limits.py [hyperplane] [agrawal]   (about 5 minutes)
"""

from __future__ import annotations

import sys

import numpy as np

from iolstream.tools import builtin_datasets, dataset, protocol
from iolstream.tools.baselines import make_baseline

PROTOCOL = protocol.Protocol(seed=0, order="stream", batch=256)


def run(ds, model: dict | None = None, baseline: str | None = None):
    split = protocol.make_split(ds, PROTOCOL)
    cfg = protocol.model_config(split, "forward", {"seed": 0, **(model or {})})
    learner = make_baseline(baseline, split, cfg) if baseline else protocol.EdRVFLLearner(cfg)
    return protocol.run_protocol(learner, split, PROTOCOL)


def line(label: str, res) -> str:
    return f"{label:34s} {res.prequential_metric:.4f} / {res.prequential_first20:.4f} / {res.prequential_last20:.4f}"


def hyperplane() -> None:
    ds = builtin_datasets.load("hyperplane")
    print("hyperplane, prequential accuracy overall / first 20 % after warm-up / last 20 %")
    print(line("River StandardScaler | Softmax", run(ds, baseline="river-softmax")))
    for lam in (0.05, 0.5, 5.0, 50.0, 500.0):
        for half_life in (None, 2048.0, 1024.0, 512.0):
            print(
                line(f"-F λ {lam:g}, half-life {half_life}", run(ds, {"lam": lam, "forgetting": half_life})),
                flush=True,
            )
    from river.datasets import synth
    from sklearn.linear_model import LogisticRegression

    rows = list(
        synth.Hyperplane(
            seed=0, n_features=10, n_drift_features=5, mag_change=0.0, noise_percentage=0.0
        ).take(40_000)
    )
    X = np.array([list(x.values()) for x, _ in rows])
    truth = np.array([y for _, y in rows])
    noisy = np.where(
        np.random.default_rng(0).random(len(truth)) < 0.04, 1 - truth, truth
    )  # River's 5 % is 4 % flips
    test = slice(30_000, None)
    print(
        "stationary hyperplane, 4 % of labels flipped, accuracy against the true boundary on 10,000 later rows:"
    )
    for n in (300, 1000, 3000):
        xb = np.c_[X[:n], np.ones(n)]
        beta = np.linalg.solve(xb.T @ xb + 1e-3 * np.eye(11), xb.T @ np.c_[1 - noisy[:n], noisy[:n]])
        ls = float(((np.c_[X[test], np.ones(10_000)] @ beta).argmax(1) == truth[test]).mean())
        logistic = float(
            (
                LogisticRegression(C=1e4, max_iter=5000).fit(X[:n], noisy[:n]).predict(X[test]) == truth[test]
            ).mean()
        )
        print(f"  {n:5d} rows: least squares {ls:.4f}, logistic {logistic:.4f}")


def agrawal_concept(function: int, seed: int) -> dataset.Dataset:
    from river.datasets import synth

    rows = list(synth.Agrawal(classification_function=function, seed=seed).take(50_000))
    X = np.ascontiguousarray([list(x.values()) for x, _ in rows], dtype=np.float64)
    y = np.array([y for _, y in rows], dtype=np.int64)
    names = tuple(str(k) for k in rows[0][0])
    return dataset.classification(f"agrawal-f{function}", X, y, names, f"Agrawal function {function} alone")


def windows(res, per: int = 5) -> str:
    """The windowed curve (1,000-row windows at 50,000 rows) averaged over ``per`` windows at a time."""
    values = [v for _, v in res.window_curve]
    return " ".join(f"{np.mean(values[i : i + per]):.3f}" for i in range(0, len(values) - per + 1, per))


def agrawal() -> None:
    settings = [
        {},
        {"lam": 0.05, "forgetting": 2048.0},
        {"lam": 0.05, "forgetting": 4096.0},
        {"lam": 5.0, "forgetting": 4096.0},
    ]
    drift = builtin_datasets.load("agrawal")
    print("agrawal: overall / first 20 % / last 20 %, then accuracy per 5,000 rows")
    for model in settings:
        label = ", ".join(f"{k} {v:g}" for k, v in model.items()) or "defaults (λ 0.5, no forgetting)"
        for ds in (drift, agrawal_concept(0, 0), agrawal_concept(2, 1)):
            res = run(ds, model)
            print(line(f"{ds.name:14s} {label}", res), "|", windows(res), flush=True)


if __name__ == "__main__":
    for part in sys.argv[1:] or ["hyperplane", "agrawal"]:
        {"hyperplane": hyperplane, "agrawal": agrawal}[part]()
