"""The table "Calibration" of docs/benchmarks.md: maps from the ensemble's outputs to probabilities, compared on
the same emitted outputs, prequentially (each map predicts a batch, then learns the labels of the batch before).

The model runs once per stream at its defaults (``mode: auto``); the layer outputs it emitted for every batch
are recorded with the labels, and every map replays them: it predicts batch t from what it learned of batches
< t (labels one batch late). The maps:

- softmax of the layers: the mean of each layer's softmax (``calibration: none``; before calibration);
- clipped mean: s̄ clipped to [0.005, 1] and normalised;
- temperature: softmax(T·s̄), T of a grid by additive log-loss sums;
- Platt (counts): per class sigmoid(a·logit(clip s̄ⱼ) + b) fitted by Newton on counts of the score in 96 bins
  (additive counts), normalised over the classes;
- histogram and isotonic (counts): the frequency of the class per bin of s̄ⱼ (100 bins, 2 prior rows at the
  bin's clipped score), isotonic by pool-adjacent-violators, interpolated between bin centres, normalised;
- multinomial logistic map: softmax(W·s̄ + b) by Adagrad steps on the log loss, row by row (a stateful fit:
  not a sum, neither added across a group nor decayed exactly);
- shipped: ``core.calibration``, the posterior mean over the maps softmax(T·g_κ(c)) of a grid, each weighed by
  exp(−its additive log-loss sum), c the mean of the layers' outputs each clipped to [0.005, 1]
  (``calibration.ensemble_scores``); beside it the map before, the grid point of the lowest sum plus a prior of
  (log T)² nats alone, on c and on the clipped plain mean s̄ (the map before that), and with an intercept for two
  classes.

    nice -n 10 .venv/bin/python benchmarks/calibration.py                  # every stream (a few minutes)
    nice -n 10 .venv/bin/python benchmarks/calibration.py --sets wine default
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from iolstream.core import calibration as shipped
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.prequential import classification_report
from iolstream.tools import builtin_datasets
from iolstream.tools.protocol import Protocol, make_split, model_config
from iolstream.tools.tabular import load_tabular, table_dataset

BUILT_IN = ("iris", "wine", "breast_cancer", "segment", "digits")
TABULAR = ("credit", "telco-churn", "default", "titanic", "phone-churn")


# ----------------------------------------------------------------------------- the recorded stream


def record_built_in(name: str, seed: int):
    """(layer outputs per batch, labels per batch, m): the shuffled protocol of ``evaluate`` (training part)."""
    protocol = Protocol(seed=seed)
    split = make_split(builtin_datasets.load(name), protocol)
    model = EdRVFL(model_config(split, "auto", {"seed": seed}))
    model.scaler.partial_fit(split.x_train[: model.config.warmup_rows])
    model.scaler.freeze()
    return _record(model, split.x_train, split.y_train, protocol.batch_rows(len(split.x_train)))


def record_tabular(name: str, seed: int, b: int = 100):
    """The same for a binary table of ``tools.tabular`` in its (shuffled once) order, read by its inferred schema."""
    ts = load_tabular(name, seed=seed)
    y = np.array([1 if label == ts.positive else 0 for label in ts.labels])
    ds = table_dataset(ts)
    model = EdRVFL(ModelConfig(classes=(0, 1), features=ds.schema.fields, seed=seed))
    model.scaler.partial_fit(ds.X[: model.config.warmup_rows])
    model.scaler.freeze()
    return _record(model, ds.X, y, b)


def _record(model, x, y, b):
    outputs, labels, prev = [], [], None
    for start in range(0, len(x), b):
        if prev is not None:
            pred, lo = prev
            model.learn(
                pred.features_t,
                model.one_hot(y[lo : lo + b]),
                predicted=pred.predicted,
                observed_at=pred.clock,
            )
        pred = model.observe(x[start : start + b])
        outputs.append(pred.layer_outputs.copy())
        labels.append(y[start : start + b])
        prev = (pred, start)
    return outputs, labels, model.config.m


# ----------------------------------------------------------------------------- the maps


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _normalised(p, m):
    if m == 2:  # one-vs-rest of the second class
        p1 = np.clip(p[:, -1], 1e-6, 1 - 1e-6)
        return np.column_stack([1 - p1, p1])
    p = np.clip(p, 1e-6, None)
    return p / p.sum(axis=1, keepdims=True)


class SoftmaxOfLayers:
    def __init__(self, m):
        pass

    def predict(self, outputs):
        return np.mean([_softmax(layer) for layer in outputs], axis=0)

    def learn(self, outputs, y):
        pass


class ClippedMean(SoftmaxOfLayers):
    def predict(self, outputs):
        c = np.clip(outputs.mean(axis=0), 0.005, 1.0)
        return c / c.sum(axis=1, keepdims=True)


class Temperature:
    def __init__(self, m):
        self.grid = np.geomspace(0.25, 50, 40)
        self.sums = np.zeros(len(self.grid))

    def predict(self, outputs):
        t = self.grid[np.argmin(self.sums)] if self.sums.any() else 5.0
        return _softmax(t * outputs.mean(axis=0))

    def learn(self, outputs, y):
        s = outputs.mean(axis=0)
        for g, t in enumerate(self.grid):
            self.sums[g] -= np.log(np.clip(_softmax(t * s)[np.arange(len(y)), y], 1e-15, 1)).sum()


class _Binned:
    """Per class (the second only with two classes): counts of rows and of hits per bin of a score."""

    bins, low, high = 100, -0.5, 1.5

    def __init__(self, m):
        self.m = m
        self.classes = [1] if m == 2 else list(range(m))
        self.n = np.zeros((m, self.bins))
        self.k = np.zeros((m, self.bins))
        self.centres = self.low + (np.arange(self.bins) + 0.5) * (self.high - self.low) / self.bins

    def feature(self, s):
        return s

    def bin_of(self, v):
        return np.clip(((v - self.low) / (self.high - self.low) * self.bins).astype(int), 0, self.bins - 1)

    def learn(self, outputs, y):
        s = outputs.mean(axis=0)
        for j in self.classes:
            at = self.bin_of(self.feature(s[:, j]))
            self.n[j] += np.bincount(at, minlength=self.bins)
            self.k[j] += np.bincount(at, weights=(y == j).astype(float), minlength=self.bins)

    def predict(self, outputs):
        s = outputs.mean(axis=0)
        p = np.column_stack([self.curve(j, self.feature(s[:, j])) for j in self.classes])
        return _normalised(p if self.m > 2 else np.column_stack([1 - p[:, 0], p[:, 0]]), self.m)


class Histogram(_Binned):
    isotonic = False

    def curve(self, j, v):
        prior = np.clip(self.centres, 0.005, 0.995)
        table = (self.k[j] + 2.0 * prior) / (self.n[j] + 2.0)
        if self.isotonic:
            table = _pav(table, self.n[j] + 2.0)
        return np.interp(v, self.centres, table)


class Isotonic(Histogram):
    isotonic = True


def _pav(values, weights):
    blocks = []
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            a, b = blocks.pop(), blocks.pop()
            blocks.append([(a[0] * a[1] + b[0] * b[1]) / (a[1] + b[1]), a[1] + b[1], a[2] + b[2]])
    return np.concatenate([[v] * c for v, _, c in blocks])


class PlattCounts(_Binned):
    bins, low, high = 96, -6.0, 6.0

    def feature(self, s):
        c = np.clip(s, 0.0025, 0.9975)
        return np.log(c) - np.log1p(-c)

    def curve(self, j, v):
        n, k = self.n[j], self.k[j]
        x = np.column_stack([self.centres, np.ones(self.bins)])
        w0 = np.array([1.0, 0.0])  # the clipped score itself, with a prior of 10 rows' weight
        w = w0.copy()
        for _ in range(30):
            p = 1 / (1 + np.exp(-(x @ w)))
            grad = x.T @ (n * p - k) + 10.0 * (w - w0)
            hess = (x * (n * p * (1 - p))[:, None]).T @ x + 10.0 * np.eye(2)
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.abs(step).max() < 1e-9:
                break
        return 1 / (1 + np.exp(-(w[0] * v + w[1])))


class MultinomialLogistic:
    def __init__(self, m):
        self.w, self.b = 4.0 * np.eye(m), np.zeros(m)
        self.g2 = np.full((m, m + 1), 1e-8)

    def predict(self, outputs):
        return _softmax(outputs.mean(axis=0) @ self.w.T + self.b)

    def learn(self, outputs, y):
        for s, label in zip(outputs.mean(axis=0), y):
            p = _softmax((s @ self.w.T + self.b)[None])[0]
            p[label] -= 1.0
            grad = np.column_stack([np.outer(p, s), p])
            self.g2 += grad * grad
            step = 0.3 * grad / np.sqrt(self.g2)
            self.w -= step[:, :-1]
            self.b -= step[:, -1]


class Shipped:
    def __init__(self, m):
        self.sums = np.zeros(shipped.GRID_SIZE)

    def score(self, outputs):
        return shipped.ensemble_scores(outputs)

    def predict(self, outputs):
        return shipped.probabilities(self.score(outputs), self.sums)

    def learn(self, outputs, y):
        self.sums += shipped.grid_losses(self.score(outputs), y)


PRIOR = np.tile(np.log(shipped.TEMPERATURES) ** 2, len(shipped.KAPPAS))  # the best map's prior, (log T)² nats


class BestMap(Shipped):
    """The map before the mixture: the one grid point of the lowest sum + a prior of (log T)² nats (before any
    label κ = 0, T = 1, the clipped normalised mean)."""

    def predict(self, outputs):
        index = int(np.argmin(self.sums + PRIOR))
        kappa, temperature = shipped.setting(index)
        c = np.clip(self.score(outputs), shipped.FLOOR, 1.0)
        return _softmax(temperature * (np.log(c) if kappa == 0 else (c**kappa - 1.0) / kappa))


class BestMapOfTheMean(BestMap):
    """The same on the plain mean s̄ of the layers (clipped after the mean: the map before that)."""

    def score(self, outputs):
        return outputs.mean(axis=0)


class ShippedWithIntercept(BestMap):
    """Two classes: p₁ = sigmoid(T · (g_κ(c₁) − g_κ(c₀)) + a), a ∈ −2…2 in steps of ¼ with a prior of a² nats, by
    the same additive sums (17 times the grid), the best point in force; more classes: ``BestMap``."""

    intercepts = np.arange(-2.0, 2.01, 0.25)

    def __init__(self, m):
        super().__init__(m)
        self.m = m
        self.grid = np.zeros((len(shipped.KAPPAS), len(shipped.TEMPERATURES), len(self.intercepts)))
        self.prior = (np.log(shipped.TEMPERATURES) ** 2)[None, :, None] + (self.intercepts**2)[None, None, :]

    def margins(self, outputs):
        c = self.score(outputs)
        g = [np.log(c) if k == 0 else (c**k - 1) / k for k in shipped.KAPPAS]
        return np.stack([gk[:, 1] - gk[:, 0] for gk in g])  # (κ, b)

    def predict(self, outputs):
        if self.m != 2:
            return super().predict(outputs)
        k, t, a = np.unravel_index(np.argmin(self.grid + self.prior), self.grid.shape)
        z = shipped.TEMPERATURES[t] * self.margins(outputs)[k] + self.intercepts[a]
        p1 = 1 / (1 + np.exp(-z))
        return np.column_stack([1 - p1, p1])

    def learn(self, outputs, y):
        if self.m != 2:
            return super().learn(outputs, y)
        sign = np.where(y == 1, 1.0, -1.0)
        t = np.asarray(shipped.TEMPERATURES)[:, None, None]
        for k, d in enumerate(self.margins(outputs)):
            z = t * d[None, None, :] + self.intercepts[None, :, None]
            self.grid[k] += np.minimum(np.logaddexp(0.0, -sign * z), shipped._CAP).sum(axis=2)


MAPS = {
    "softmax of the layers (before)": SoftmaxOfLayers,
    "clipped mean": ClippedMean,
    "temperature": Temperature,
    "Platt (counts)": PlattCounts,
    "histogram (counts)": Histogram,
    "isotonic (counts)": Isotonic,
    "multinomial logistic (SGD)": MultinomialLogistic,
    "softmax(T·g_κ(clip s̄)) (before)": BestMapOfTheMean,
    "softmax(T·g_κ(c)), c the mean of the clipped layers (before)": BestMap,
    "the same, and an intercept (two classes)": ShippedWithIntercept,
    "shipped: the posterior mean of the maps softmax(T·g_κ(c))": Shipped,
}


def replay(outputs, labels, m, kind):
    cal = kind(m)
    proba = []
    for t, out in enumerate(outputs):
        if t:
            cal.learn(outputs[t - 1], labels[t - 1])
        proba.append(cal.predict(out))
    proba, y = np.concatenate(proba), np.concatenate(labels)
    return classification_report(y, proba.argmax(axis=1), proba, m)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", nargs="+", default=[*BUILT_IN, *TABULAR], choices=[*BUILT_IN, *TABULAR])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    results = {}
    for name in args.sets:
        print(f"{name}...", file=sys.stderr, flush=True)
        recorded = record_built_in(name, args.seed) if name in BUILT_IN else record_tabular(name, args.seed)
        results[name] = {label: replay(*recorded, kind) for label, kind in MAPS.items()}
    print(
        f"`{' '.join(['python benchmarks/calibration.py', *(argv if argv is not None else sys.argv[1:])])}`\n"
    )
    print("| map | " + " | ".join(args.sets) + " |")
    print("|---|" + "---|" * len(args.sets))
    for label in MAPS:
        cells = []
        for name in args.sets:
            r = results[name][label]
            best = min(results[name][other]["log_loss"] for other in MAPS)
            cell = f"{r['log_loss']:.4f}"
            cells.append(f"**{cell}**" if r["log_loss"] == best else cell)
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nROC AUC (two classes) of the same probabilities:\n")
    binary = [n for n in args.sets if not np.isnan(next(iter(results[n].values()))["roc_auc"])]
    print("| map | " + " | ".join(binary) + " |")
    print("|---|" + "---|" * len(binary))
    for label in MAPS:
        print(f"| {label} | " + " | ".join(f"{results[n][label]['roc_auc']:.4f}" for n in binary) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
