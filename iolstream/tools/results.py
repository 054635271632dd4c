"""What an evaluation reports: the result of one learner over one split, its test curve, and the metric
(accuracy, or RMSE for regression) computed from error sums."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class CurvePoint:
    """One time point of the test curve, as reported while running."""

    name: str
    t: int  # batches streamed
    n_batches: int
    rows_seen: int
    test_metric: float
    prequential_metric: float  # over every batch predicted so far
    rows_per_second: float


@dataclass
class EvaluationResult:
    """Everything measured on one learner's pass over the stream.

    curve              : [(t, test metric)] at log-spaced batch counts t (on ``curve_test_rows`` test rows)
    curve_rows         : rows streamed at each curve point (t · b, the last batch may be short)
    batch_prequential  : (T,) the prequential metric of each batch
    batch_loss         : (T,) immediate loss of each batch, mean over layers, ½‖Dβ − Y‖² summed over rows
    """

    name: str
    dataset: str
    task: str
    metric: str
    test_metric: float
    prequential_metric: float
    cumulative_regret: float | None
    regret_bound: float | None
    rows_per_second: float
    seconds: float
    test_seconds: float
    rows: int
    test_rows: int
    batch: int
    batches: int
    label_delay: int
    seed: int
    curve: list
    curve_rows: list
    curve_test_rows: int
    batch_prequential: np.ndarray
    batch_loss: np.ndarray
    config: dict = field(default_factory=dict)
    order: str = "shuffle"
    prequential_first20: float | None = (
        None  # --order stream: over the first 20 % of the rows after the warm-up
    )
    prequential_last20: float | None = None  # --order stream: over the last 20 % of the rows
    window_curve: list = field(
        default_factory=list
    )  # --order stream: [(rows seen, prequential metric of the window)]
    warmup_rows_excluded: int = 0  # regression: rows predicted before the target scaling was known
    # prequential, over the same rows as prequential_metric (stream.prequential); None: not measured
    log_loss: float | None = None  # classification, with the learner's probabilities
    brier: float | None = None
    roc_auc: float | None = None  # two classes: of the second class's probability, exact
    balanced_accuracy: float | None = None
    per_class: dict = field(default_factory=dict)  # class -> {"precision", "recall"}
    mae: float | None = None  # regression
    compile_seconds: float = 0.0  # Numba kernels compiled or loaded before the clock started

    def to_json(self, per_batch: bool = False) -> dict:
        """A JSON-ready dict (NaN becomes None); per-batch arrays only when asked."""
        out = {
            key: getattr(self, key)
            for key in (
                "name",
                "dataset",
                "task",
                "metric",
                "test_metric",
                "prequential_metric",
                "log_loss",
                "brier",
                "roc_auc",
                "balanced_accuracy",
                "mae",
                "per_class",
                "cumulative_regret",
                "regret_bound",
                "rows_per_second",
                "seconds",
                "test_seconds",
                "rows",
                "test_rows",
                "batch",
                "batches",
                "label_delay",
                "seed",
                "curve",
                "curve_rows",
                "curve_test_rows",
                "config",
                "order",
                "prequential_first20",
                "prequential_last20",
                "warmup_rows_excluded",
                "compile_seconds",
            )
        }
        out["curve"] = [[int(t), finite_or_none(v)] for t, v in self.curve]
        out["window_curve"] = [[int(r), finite_or_none(v)] for r, v in self.window_curve]
        if per_batch:
            out["batch_prequential"] = [finite_or_none(v) for v in self.batch_prequential]
            out["batch_loss"] = [finite_or_none(v) for v in self.batch_loss]
        return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in out.items()}


def finite_or_none(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------- metrics


def error_sums(task: str, pred: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """(sum of errors, count): misclassified rows, or squared errors over every output."""
    if task == "classification":
        return float(np.count_nonzero(pred != y)), len(y)
    diff = np.asarray(pred, dtype=np.float64).reshape(y.shape) - y
    return float(np.sum(diff * diff)), diff.size


def metric_from(task: str, error_sum: float, count: int) -> float:
    if count == 0:
        return math.nan
    if task == "classification":
        return 1.0 - error_sum / count
    return math.sqrt(error_sum / count)


def candidate_results(model, errors: np.ndarray) -> list[dict]:
    """With ``auto``: every candidate's own prequential metric (``errors`` (K, 2): its error sum and count, of
    what it would have emitted, on the batches it predicted: ``scored_rows``) and cumulative regret (None unless
    it predicted every labelled row), beside the setting it stands for."""
    task = model.config.task
    return [
        {
            "lam": lam,
            "forgetting": h,
            "mode": mode,
            "prequential_metric": finite_or_none(metric_from(task, error_sum, int(count))),
            "scored_rows": int(model.predicted_rows[j]),
            "cumulative_regret": finite_or_none(model.regret(j).mean_regret),
        }
        for j, ((lam, h), mode, (error_sum, count)) in enumerate(zip(model.candidates, model.modes, errors))
    ]


def score(task: str, pred: np.ndarray, y: np.ndarray) -> float:
    """Accuracy (classification) or RMSE (regression)."""
    return metric_from(task, *error_sums(task, pred, y))


# ------------------------------------------------------------------------------- run
