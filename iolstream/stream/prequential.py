"""The prequential (test-then-train) metrics of the emitted predictions: each prediction is scored when its
label comes, against what was emitted for it (its class, its probabilities, its value), over the whole stream
and over a sliding window of the last rows.

Classification: accuracy, log loss, Brier score, balanced accuracy, per-class precision and recall and, with two
classes, ROC AUC of the second class's probability. Regression: RMSE and MAE. The metric functions below are
pure (arrays in, a number out) and shared with ``iolstream evaluate`` (``tools.protocol``).

- Log loss: −log p(y), p clipped at 1e-15 (scikit-learn's ``log_loss``).
- Brier: with two classes (p₁ − [y = 1])² (scikit-learn's ``brier_score_loss``); with m > 2 classes
  Σⱼ (pⱼ − [y = j])², Brier's original score (twice the binary one on two classes).
- Balanced accuracy: the mean recall of the classes that occurred.
- ROC AUC over the window: exact (ranks, ties counted half). Over the whole stream, from counts of the positive
  and negative rows in AUC_BINS equal bins of p₁: exact but for pairs that share a bin, which count half (the
  error is at most half the share of such pairs: with 1,000 bins, well below 0.001 unless the probabilities
  crowd into a few bins).
"""

from __future__ import annotations

import math

import numpy as np

PROBABILITY_FLOOR = 1e-15
AUC_BINS = 1000
CLASSIFICATION_METRICS = ("accuracy", "log_loss", "brier", "roc_auc", "balanced_accuracy")
REGRESSION_METRICS = ("rmse", "mae")
HIGHER_IS_BETTER = {"accuracy", "roc_auc", "balanced_accuracy"}


# ----------------------------------------------------------------------------- pure metrics


def row_log_loss(proba: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """−log p(y) per row: proba (b, m), labels (b,) class indices."""
    picked = np.asarray(proba, dtype=np.float64)[np.arange(len(labels)), labels]
    return -np.log(np.clip(picked, PROBABILITY_FLOOR, 1.0))


def row_brier(proba: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The Brier score per row (module docstring): (p₁ − [y = 1])² with two classes, else Σⱼ (pⱼ − [y = j])²."""
    proba = np.asarray(proba, dtype=np.float64)
    if proba.shape[1] == 2:
        return (proba[:, 1] - (labels == 1)) ** 2
    onehot = np.zeros_like(proba)
    onehot[np.arange(len(labels)), labels] = 1.0
    return ((proba - onehot) ** 2).sum(axis=1)


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Exact ROC AUC of ``scores`` (b,) for the rows where ``positive`` (b,) bool, ties counted half; NaN unless
    both kinds of rows are present."""
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = np.asarray(scores)[order]
    ranks = np.empty(len(order))
    # average ranks of ties (1-based)
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(order)]
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def binned_auc(pos_counts: np.ndarray, neg_counts: np.ndarray) -> float:
    """ROC AUC from counts of positive and negative rows per score bin (ascending): pairs in one bin count half."""
    n_pos, n_neg = pos_counts.sum(), neg_counts.sum()
    if n_pos <= 0 or n_neg <= 0:
        return math.nan
    below = np.cumsum(neg_counts) - neg_counts  # negatives in lower bins
    return float((pos_counts * (below + 0.5 * neg_counts)).sum() / (n_pos * n_neg))


def per_class(confusion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) per class from a confusion matrix [true, predicted]; NaN where undefined."""
    confusion = np.asarray(confusion, dtype=np.float64)
    hits = np.diag(confusion)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(confusion.sum(axis=0) > 0, hits / confusion.sum(axis=0), np.nan)
        recall = np.where(confusion.sum(axis=1) > 0, hits / confusion.sum(axis=1), np.nan)
    return precision, recall


def balanced_accuracy(confusion: np.ndarray) -> float:
    """The mean recall over the classes that occurred (NaN before any row)."""
    recall = per_class(confusion)[1]
    return float(np.nanmean(recall)) if np.isfinite(recall).any() else math.nan


def confusion_of(labels: np.ndarray, predicted: np.ndarray, m: int) -> np.ndarray:
    """(m, m) counts [true, predicted]."""
    return (
        np.bincount(np.asarray(labels) * m + np.asarray(predicted), minlength=m * m)
        .reshape(m, m)
        .astype(float)
    )


def classification_report(labels, predicted, proba, m: int) -> dict:
    """Every classification metric of a set of rows (the whole of an ``evaluate`` run): accuracy, log_loss, brier,
    roc_auc (two classes; NaN else), balanced_accuracy, precision and recall per class (lists)."""
    labels, predicted = np.asarray(labels, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    confusion = confusion_of(labels, predicted, m)
    precision, recall = per_class(confusion)
    out = {
        "accuracy": float((labels == predicted).mean()) if len(labels) else math.nan,
        "log_loss": math.nan,
        "brier": math.nan,
        "roc_auc": math.nan,
        "balanced_accuracy": balanced_accuracy(confusion),
        "precision": precision.tolist(),
        "recall": recall.tolist(),
    }
    if proba is not None and len(labels):
        proba = np.asarray(proba, dtype=np.float64)
        out["log_loss"] = float(row_log_loss(proba, labels).mean())
        out["brier"] = float(row_brier(proba, labels).mean())
        if m == 2:
            out["roc_auc"] = roc_auc(proba[:, 1], labels == 1)
    return out


# ----------------------------------------------------------------------------- the stream's tracker


class _Ring:
    """The last ``size`` rows of a few named per-row arrays."""

    def __init__(self, size: int, names: tuple[str, ...]):
        self.size, self.names = size, names
        self.data = {name: np.zeros(size) for name in names}
        self.count = 0  # rows ever added (the newest is at (count - 1) % size)

    def extend(self, **columns) -> None:
        b = len(next(iter(columns.values())))
        if b >= self.size:  # only the last ``size`` rows stay
            columns = {k: np.asarray(v)[-self.size :] for k, v in columns.items()}
            self.count += b - self.size
            b = self.size
        at = np.arange(self.count, self.count + b) % self.size
        for name in self.names:
            self.data[name][at] = columns[name]
        self.count += b

    def rows(self, *names: str) -> tuple[np.ndarray, ...]:
        """The rows held of each of ``names``, oldest first, copies of one moment: ``count`` is read once, so
        a reader on another thread (a status or /metrics scrape) gets arrays of one length while the loop
        adds rows."""
        count = self.count
        n = min(count, self.size)
        if count <= self.size:
            return tuple(self.data[name][:n].copy() for name in names)
        start = count % self.size
        return tuple(np.concatenate([self.data[name][start:], self.data[name][:start]]) for name in names)

    def __len__(self) -> int:
        return min(self.count, self.size)


class PrequentialMetric:
    """The prequential metrics of the emitted predictions (module docstring), overall and over the last
    ``window`` labelled rows. ``update_classes`` / ``update_values`` take a labelled batch; ``values()`` reads them
    all; ``value`` / ``window_value`` are the primary one (accuracy, or RMSE) as the status line has long shown it.

    m : classes (classification) or outputs (regression)
    """

    def __init__(self, task: str, window: int, m: int = 2):
        self.task = task
        self.m = m
        self.window_rows = window
        self.n = 0  # labelled rows scored
        self.total = 0.0  # correct rows, or Σ squared error (mean over outputs)
        self.sums = {"log_loss": 0.0, "brier": 0.0, "abs_error": 0.0, "proba_rows": 0.0}
        self.confusion = np.zeros((m, m)) if task == "classification" else np.zeros((0, 0))
        self.auc_counts = np.zeros((2, AUC_BINS))  # negatives, positives per bin of p₁ (two classes)
        names = (
            ("label", "predicted", "log_loss", "brier", "score")
            if task == "classification"
            else ("sq", "abs")
        )
        self.ring = _Ring(window, names)

    @property
    def window(self) -> int:
        return self.window_rows

    def update_classes(self, labels: np.ndarray, predicted: np.ndarray, proba: np.ndarray | None) -> None:
        """A labelled batch: true class indices (b,), the emitted ones (b,), the emitted probabilities (b, m)."""
        labels = np.asarray(labels, dtype=np.int64)
        predicted = np.asarray(predicted, dtype=np.int64)
        b = len(labels)
        if not b:
            return
        self.n += b
        self.total += float((labels == predicted).sum())
        self.confusion += confusion_of(labels, predicted, self.m)
        loss = brier = score = np.full(b, np.nan)
        if proba is not None:
            loss, brier = row_log_loss(proba, labels), row_brier(proba, labels)
            self.sums["log_loss"] += float(loss.sum())
            self.sums["brier"] += float(brier.sum())
            self.sums["proba_rows"] += b
            if self.m == 2:
                score = np.asarray(proba, dtype=np.float64)[:, 1]
                bins = np.clip((score * AUC_BINS).astype(np.int64), 0, AUC_BINS - 1)
                np.add.at(self.auc_counts, (labels.clip(0, 1), bins), 1.0)
        self.ring.extend(label=labels, predicted=predicted, log_loss=loss, brier=brier, score=score)

    def update_values(self, values: np.ndarray, targets: np.ndarray) -> None:
        """A labelled batch of regression rows: emitted values and targets, (b, m)."""
        diff = np.asarray(values, dtype=np.float64) - np.asarray(targets, dtype=np.float64)
        diff = diff.reshape(len(diff), -1)
        sq, ab = (diff**2).mean(axis=1), np.abs(diff).mean(axis=1)
        self.n += len(sq)
        self.total += float(sq.sum())
        self.sums["abs_error"] += float(ab.sum())
        self.ring.extend(sq=sq, abs=ab)

    # ------------------------------------------------------------------ reading
    def _primary(self, total, n):
        if n == 0:
            return math.nan
        return total / n if self.task == "classification" else float(np.sqrt(total / n))

    @property
    def value(self) -> float:
        """Accuracy or RMSE over every emitted prediction labelled so far (NaN before the first)."""
        return self._primary(self.total, self.n)

    @property
    def window_value(self) -> float:
        """The same over the last ``window`` of them (NaN before the first)."""
        if self.task == "classification":
            labels, predicted = self.ring.rows("label", "predicted")
            return self._primary(float((labels == predicted).sum()), len(labels))
        (sq,) = self.ring.rows("sq")
        return self._primary(float(sq.sum()), len(sq))

    def values(self, sliding: bool = False) -> dict:
        """Every metric of the task, overall or over the window: {name: value} (NaN where unknown), with
        "precision" and "recall" lists per class (classification)."""
        if self.task != "classification":
            if sliding:
                sq, ab = self.ring.rows("sq", "abs")
                n = len(sq)
                return {"rmse": self._primary(float(sq.sum()), n), "mae": float(ab.mean()) if n else math.nan}
            n = self.n
            return {"rmse": self.value, "mae": self.sums["abs_error"] / n if n else math.nan}
        if sliding:
            labels, predicted, loss, brier, score = self.ring.rows(
                "label", "predicted", "log_loss", "brier", "score"
            )
            labels, predicted = labels.astype(np.int64), predicted.astype(np.int64)
            known = np.isfinite(loss)
            confusion = confusion_of(labels, predicted, self.m)
            auc = math.nan
            if self.m == 2 and known.any():
                auc = roc_auc(score[known], labels[known] == 1)
            out = {
                "accuracy": self._primary(float((labels == predicted).sum()), len(labels)),
                "log_loss": float(loss[known].mean()) if known.any() else math.nan,
                "brier": float(brier[known].mean()) if known.any() else math.nan,
                "roc_auc": auc,
            }
        else:
            confusion = self.confusion
            rows = self.sums["proba_rows"]
            out = {
                "accuracy": self.value,
                "log_loss": self.sums["log_loss"] / rows if rows else math.nan,
                "brier": self.sums["brier"] / rows if rows else math.nan,
                "roc_auc": binned_auc(self.auc_counts[1], self.auc_counts[0]) if self.m == 2 else math.nan,
            }
        precision, recall = per_class(confusion)
        out["balanced_accuracy"] = balanced_accuracy(confusion)
        out["precision"], out["recall"] = precision.tolist(), recall.tolist()
        return out

    # ------------------------------------------------------------------ state
    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(manifest part, arrays) for a snapshot."""
        manifest = {"n": self.n, "total": self.total, "sums": dict(self.sums), "ring_count": self.ring.count}
        arrays = {"metrics/confusion": self.confusion, "metrics/auc_counts": self.auc_counts}
        arrays.update({f"metrics/ring/{k}": v for k, v in self.ring.data.items()})
        return manifest, arrays

    def load_state(self, manifest: dict, arrays: dict) -> None:
        """As ``to_state`` gave it. A state saved before these metrics (only "n" and "total"): accuracy or RMSE
        carries on; the others, and the window, start from the next labelled row."""
        self.n, self.total = int(manifest["n"]), float(manifest["total"])
        if "sums" not in manifest:
            return
        if self.n == 0 and np.size(arrays["metrics/confusion"]) != self.confusion.size:
            return  # nothing scored yet, kept at another shape (an older `iolstream seed`'s, two classes): fresh
        self.sums.update({k: float(v) for k, v in manifest["sums"].items()})
        self.confusion = np.array(arrays["metrics/confusion"], dtype=np.float64).reshape(self.confusion.shape)
        self.auc_counts = np.array(arrays["metrics/auc_counts"], dtype=np.float64).reshape(
            self.auc_counts.shape
        )
        saved = {
            name: np.asarray(arrays[f"metrics/ring/{name}"], dtype=np.float64) for name in self.ring.names
        }
        if any(v.shape != (self.ring.size,) for v in saved.values()):
            return  # saved with another metrics.window_rows: the window starts from the next labelled row
        self.ring.count = int(manifest["ring_count"])
        self.ring.data = {name: v.copy() for name, v in saved.items()}
