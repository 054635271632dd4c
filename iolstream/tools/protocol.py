"""The evaluation protocol: run the IOL process over a data set and measure it as the paper does.

Protocol (pure, in :func:`run_protocol`; the CLI is ``tools.evaluate``):

1. shuffle the rows with the seed, cap them at ``rows``, hold out ``test_fraction`` of them;
2. the warm-up scaler sees the first ``warmup_rows`` training rows (they are still streamed);
3. stream the training rows in batches of b. Batch t arrives, is predicted (the prequential
   prediction: -F puts its Gram into A first, -R predicts with the β in force), and its
   labels arrive ``label_delay`` batches later, just before batch t + delay is predicted.
   Delay 1 is the paper's setting: batch t+1 is predicted with β_{t+1}, which holds the
   labels of batches ≤ t (and, for -F, the Gram of batch t+1);
4. after batch t, at logarithmically spaced t, the test metric of the current model;
   when the stream ends every outstanding label arrives and the final test metric is taken.

Per batch it records the prequential metric (accuracy, or RMSE for regression) and the
immediate loss ½‖D_l β_l − Y‖² (mean over layers) with the β that made the prediction.
Regression: the rows predicted before the target scaling is known (the first ``warmup_rows``
labels are held until then, and the model predicts their mean so far) are left out of the prequential
metric and counted in ``warmup_rows_excluded``; so are the same rows of the baselines beside it.
Rows per second count training rows over the seconds spent predicting and learning on the
stream; the Numba kernels are compiled (or loaded from the cache) on a tiny model of the same
kind before the clock starts (``compile_seconds``), and test evaluation is timed apart.

    >>> from iolstream.tools.builtin_datasets import load
    >>> from iolstream.tools.protocol import Protocol, evaluate
    >>> results = evaluate(load("iris"), model={"n_nodes": 32, "n_layers": 2}, modes=("forward", "ridge"))
    >>> [(r.name, r.metric, r.batches) for r in results]
    [('edRVFL-F', 'accuracy', 30), ('edRVFL-R', 'accuracy', 30)]
    >>> abs(results[0].test_metric - results[1].test_metric) < 0.05   # every label in: same sums
    True
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iolstream.core.model import ModelConfig
from iolstream.stream.prequential import classification_report
from iolstream.tools.baselines import make_baseline
from iolstream.tools.dataset import DataError, Dataset
from iolstream.tools.learners import EdRVFLLearner, StreamLearner  # noqa: F401 (public here too)
from iolstream.tools.results import (  # noqa: F401 (score: public here too)
    CurvePoint,
    EvaluationResult,
    candidate_results,
    error_sums,
    finite_or_none,
    metric_from,
    score,
)

ORDERS = ("shuffle", "stream")
STREAM_WINDOWS = 50  # --order stream: the windowed prequential curve has this many windows
DEFAULT_BATCH = 0.03  # a fraction of the training set, as the paper's tables give b (Letters: 0.030)


# --------------------------------------------------------------------------- protocol


@dataclass(frozen=True)
class Protocol:
    """How the stream is cut and measured.

    batch           : rows per batch (≥ 1) or a fraction of the training set (< 1, e.g. 0.0027)
    label_delay     : labels of batch t arrive just before batch t + label_delay is predicted (≥ 1)
    test_fraction   : share of the (capped) rows held out as the test set
    seed            : shuffling (and, through the CLI, the random weights)
    rows            : cap on the rows used (after shuffling), None for all
    curve_points    : about this many logarithmically spaced time points on the test curve
    curve_test_rows : the curve is measured on at most this many test rows (a fixed subset;
                      None: all). The final ``test_metric`` always uses the whole test set.
    """

    batch: float = DEFAULT_BATCH
    label_delay: int = 1
    test_fraction: float = 0.2
    seed: int = 0
    rows: int | None = None
    curve_points: int = 20
    curve_test_rows: int | None = 20_000
    order: str = "shuffle"  # "stream": no shuffle, no test set: test-then-train over the stream's own order

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order: must be one of {ORDERS}, got {self.order!r}")
        if not (isinstance(self.batch, (int, float)) and math.isfinite(self.batch) and self.batch > 0):
            raise ValueError(
                f"batch: must be a number of rows ≥ 1 or a fraction in (0, 1), got {self.batch!r}"
            )
        if self.batch >= 1 and self.batch != int(self.batch):
            raise ValueError(f"batch: a number of rows must be an integer, got {self.batch!r}")
        if not (isinstance(self.label_delay, int) and self.label_delay >= 1):
            raise ValueError(
                f"label_delay: must be an integer ≥ 1 (1 = the paper's setting), got {self.label_delay!r}"
            )
        if not (0 < self.test_fraction < 1):
            raise ValueError(f"test_fraction: must be in (0, 1), got {self.test_fraction!r}")
        if self.rows is not None and not (isinstance(self.rows, int) and self.rows >= 1):
            raise ValueError(f"rows: must be a positive integer, got {self.rows!r}")
        if not (isinstance(self.curve_points, int) and self.curve_points >= 1):
            raise ValueError(f"curve_points: must be an integer ≥ 1, got {self.curve_points!r}")
        if self.curve_test_rows is not None and not (
            isinstance(self.curve_test_rows, int) and self.curve_test_rows >= 1
        ):
            raise ValueError(f"curve_test_rows: must be a positive integer, got {self.curve_test_rows!r}")

    def batch_rows(self, n_train: int) -> int:
        """b in rows for a training set of ``n_train`` rows."""
        if self.batch >= 1:
            return int(self.batch)
        return max(1, int(round(self.batch * n_train)))


def time_points(n_batches: int, n_points: int) -> list[int]:
    """About ``n_points`` batch indices in 1..T, logarithmically spaced, with 1 and T (only T if n_points = 1).

    >>> time_points(371, 6)
    [1, 3, 11, 35, 114, 371]
    """
    if n_points == 1:
        return [n_batches]
    if n_batches <= n_points:
        return list(range(1, n_batches + 1))
    points = np.unique(np.round(np.geomspace(1, n_batches, n_points)).astype(int))
    return [int(p) for p in points]


# ------------------------------------------------------------------------------ split


@dataclass(frozen=True)
class Split:
    """A shuffled data set cut into a stream and a test set.

    x_train, x_test : (n, k) float64
    y_train, y_test : (n,) int class indices into ``classes``, or (n, m) float64 regression targets
    """

    name: str
    task: str
    classes: tuple | None
    feature_names: tuple
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    schema: object = None  # the feature schema the rows were encoded by (docs/design.md §11), or None

    @property
    def n_outputs(self) -> int:
        return len(self.classes) if self.classes is not None else self.y_train.shape[1]

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "classification" else "rmse"


def make_split(dataset: Dataset, protocol: Protocol, *, classes=None) -> Split:
    """Shuffle with the seed, cap at ``protocol.rows``, hold out the test set.

    ``classes`` declares the class list (default: the data set's); a label outside it raises
    DataError naming the label and its row.
    """
    y = dataset.y
    if dataset.task == "classification":
        declared = tuple(dataset.classes if classes is None else classes)
        if len(declared) < 2 or len(set(declared)) != len(declared):
            raise DataError(f"classes: need at least 2 distinct classes, got {list(declared)}")
        lookup = {plain_label(c): i for i, c in enumerate(declared)}
        index = np.empty(len(y), dtype=np.int64)
        for row, label in enumerate(y.tolist()):
            i = lookup.get(plain_label(label), lookup.get(str(label)))
            if i is None:
                raise DataError(
                    f"{dataset.name}: unknown class {label!r} in row {row + 1}; declared classes: {list(declared)}"
                )
            index[row] = i
        y = index
    else:
        if classes is not None:
            raise DataError(f"{dataset.name}: classes were declared but the task is regression")
        declared = None
        y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    if protocol.order == "stream":  # the stream's own order, every row streamed, none held out
        order = np.arange(dataset.n_rows if protocol.rows is None else min(protocol.rows, dataset.n_rows))
    else:
        order = np.random.default_rng(protocol.seed).permutation(dataset.n_rows)
    if protocol.rows is not None:
        order = order[: protocol.rows]
    n_test = 0 if protocol.order == "stream" else int(round(protocol.test_fraction * len(order)))
    n_train = len(order) - n_test
    if (n_test < 1 and protocol.order == "shuffle") or n_train < 2:
        raise DataError(
            f"{dataset.name}: {len(order)} rows with test fraction {protocol.test_fraction} leave {n_train} "
            f"training and {n_test} test rows; need at least 2 and 1"
        )
    train, test = order[:n_train], order[n_train:]
    return Split(
        dataset.name,
        dataset.task,
        declared,
        dataset.feature_names,
        np.ascontiguousarray(dataset.X[train]),
        y[train],
        np.ascontiguousarray(dataset.X[test]),
        y[test],
        dataset.schema,
    )


def plain_label(label):
    return label.item() if hasattr(label, "item") else label


# ------------------------------------------------------------------------------ result


def run_protocol(
    learner: StreamLearner,
    split: Split,
    protocol: Protocol,
    *,
    on_point: Callable[[CurvePoint], None] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    scored_from_label: int = 0,
) -> EvaluationResult:
    """Stream ``split`` through ``learner`` by the protocol (module docstring) and measure it.
    ``scored_from_label``: for a learner without a warm-up of its own (a baseline), the rows predicted before
    this many labels arrived are left out as the model's are (the regression warm-up), so that every learner of
    one evaluation is scored on the same rows."""
    task = split.task
    n_train = len(split.x_train)
    b = protocol.batch_rows(n_train)
    n_batches = -(-n_train // b)
    stream_order = protocol.order == "stream"
    points = set() if stream_order else set(time_points(n_batches, protocol.curve_points))
    delay = protocol.label_delay
    curve_x, curve_y = split.x_test, split.y_test
    if protocol.curve_test_rows is not None and len(curve_x) > protocol.curve_test_rows:
        curve_x, curve_y = curve_x[: protocol.curve_test_rows], curve_y[: protocol.curve_test_rows]

    sizes = {min(b, n_train), n_train - (n_batches - 1) * b}  # every batch has b rows but the last
    learner.start(split.x_train, batch_sizes=sizes)  # untimed: a warm-up scaler, compiled kernels
    learner.predict(split.x_train[:1])  # untimed: the inference kernels
    delivered = [0]  # labels that have arrived
    warming_up = getattr(learner, "warming_up", lambda: delivered[0] < scored_from_label)

    batch_prequential = np.full(n_batches, np.nan)
    batch_errors, batch_counts = np.zeros(n_batches), np.zeros(n_batches)
    scored = np.ones(n_batches, dtype=bool)  # False: predicted during the target warm-up (a placeholder)
    batch_loss = np.full(n_batches, np.nan)
    pending: deque = deque()  # (batch index, handle, labels), in arrival order
    error_sum, count = 0.0, 0
    learn_seconds = test_seconds = 0.0
    curve, curve_rows = [], []

    seen = []  # classification: (labels, predicted, probabilities or None) of every scored batch
    abs_error = 0.0  # regression: Σ |error| over every output of the scored batches
    probabilities = getattr(learner, "probabilities", lambda handle: None)

    def deliver(upto: int) -> None:
        while pending and pending[0][0] <= upto:
            index, handle, y = pending.popleft()
            batch_loss[index] = learner.label(handle, y)
            delivered[0] += len(y)

    for t in range(1, n_batches + 1):
        x = split.x_train[(t - 1) * b : t * b]
        y = split.y_train[(t - 1) * b : t * b]
        tic = time.perf_counter()
        deliver(t - 1 - delay)  # labels of batch t - delay (index t-1-delay) arrive before batch t
        scored[t - 1] = not warming_up()
        handle, pred = learner.arrive(x)
        pending.append((t - 1, handle, y))
        if t == n_batches:
            deliver(n_batches)  # end of stream: every outstanding label arrives
        learn_seconds += time.perf_counter() - tic
        errors, n = error_sums(task, pred, y)
        if scored[t - 1]:
            error_sum, count = error_sum + errors, count + n
            if task == "classification":
                seen.append((y, np.asarray(pred), probabilities(handle)))
            else:
                abs_error += float(np.abs(np.asarray(pred, dtype=np.float64).reshape(y.shape) - y).sum())
        batch_prequential[t - 1] = metric_from(task, errors, n)
        batch_errors[t - 1], batch_counts[t - 1] = errors, n
        if t in points:
            tic = time.perf_counter()
            test_value = score(task, learner.predict(curve_x), curve_y)
            test_seconds += time.perf_counter() - tic
            rows_seen = min(t * b, n_train)
            curve.append((t, test_value))
            curve_rows.append(rows_seen)
            if on_point is not None:
                on_point(
                    CurvePoint(
                        learner.name,
                        t,
                        n_batches,
                        rows_seen,
                        test_value,
                        metric_from(task, error_sum, count),
                        rows_seen / max(learn_seconds, 1e-12),
                    )
                )
        if on_batch is not None:
            on_batch(t, n_batches)

    tic = time.perf_counter()
    test_metric = score(task, learner.predict(split.x_test), split.y_test) if len(split.x_test) else math.nan
    test_seconds += time.perf_counter() - tic
    regret, bound = learner.regret()
    extra = {}
    if stream_order:
        ends = np.minimum(np.arange(1, n_batches + 1) * b, n_train)  # rows seen after each batch

        def over(lo: int, hi: int) -> float:  # prequential metric of the batches ending in (lo, hi]
            sel = (ends > lo) & (ends <= hi) & scored
            return metric_from(task, float(batch_errors[sel].sum()), int(batch_counts[sel].sum()))

        warm = getattr(getattr(learner, "config", None), "warmup_rows", 0)
        fifth = n_train // 5
        window = max(n_train // STREAM_WINDOWS, b)
        extra = dict(
            order="stream",
            prequential_first20=over(warm, warm + fifth),
            prequential_last20=over(n_train - fifth, n_train),
            window_curve=[(hi, over(hi - window, hi)) for hi in range(window, n_train + 1, window)],
        )
    extra.update(_prequential_report(split, seen, abs_error, count))
    return EvaluationResult(
        name=learner.name,
        dataset=split.name,
        task=task,
        metric=split.metric,
        test_metric=test_metric,
        prequential_metric=metric_from(task, error_sum, count),
        cumulative_regret=regret,
        regret_bound=bound,
        rows_per_second=n_train / max(learn_seconds, 1e-12),
        seconds=learn_seconds,
        test_seconds=test_seconds,
        rows=n_train,
        test_rows=len(split.x_test),
        batch=b,
        batches=n_batches,
        label_delay=delay,
        seed=protocol.seed,
        curve=curve,
        curve_rows=curve_rows,
        curve_test_rows=len(curve_x),
        batch_prequential=batch_prequential,
        batch_loss=batch_loss,
        config=learner.describe(),
        warmup_rows_excluded=int(np.diff(np.minimum(np.arange(n_batches + 1) * b, n_train))[~scored].sum()),
        compile_seconds=float(getattr(learner, "compile_seconds", 0.0)),
        **extra,
    )


def _prequential_report(split: Split, seen: list, abs_error: float, count: int) -> dict:
    """The metrics beside accuracy or RMSE over every scored prediction (``stream.prequential``): log loss,
    Brier, ROC AUC (two classes; exact), balanced accuracy and per-class precision and recall; MAE."""
    if split.task != "classification":
        return {"mae": abs_error / count if count else math.nan}
    if not seen:
        return {}
    labels = np.concatenate([y for y, _, _ in seen])
    predicted = np.concatenate([p for _, p, _ in seen])
    with_proba = all(p is not None for _, _, p in seen)
    proba = np.concatenate([p for _, _, p in seen]) if with_proba else None
    report = classification_report(labels, predicted, proba, len(split.classes))
    classes = [str(plain_label(c)) for c in split.classes]
    return {
        "log_loss": report["log_loss"],
        "brier": report["brier"],
        "roc_auc": report["roc_auc"],
        "balanced_accuracy": report["balanced_accuracy"],
        "per_class": {
            c: {"precision": finite_or_none(p), "recall": finite_or_none(r)}
            for c, p, r in zip(classes, report["precision"], report["recall"])
        },
    }


def model_config(split: Split, mode: str, model: dict | None = None) -> ModelConfig:
    """A ModelConfig for ``split``: ModelConfig's defaults, overridden by ``model``.

    ``scaler="fixed"`` without a mean and std takes them from the whole training part (an
    offline choice, never the test rows).
    """
    kwargs = dict(model or {})
    kwargs["mode"] = mode
    if split.task == "classification":
        kwargs["classes"] = tuple(plain_label(c) for c in split.classes)
    else:
        kwargs["n_outputs"] = split.n_outputs
    if split.schema is not None:  # named fields: the model encodes by the schema and scales its numbers only
        kwargs["features"] = _fixed_fields(split) if kwargs.get("scaler") == "fixed" else split.schema.fields
    elif kwargs.get("scaler") == "fixed" and kwargs.get("scaler_mean") is None:
        std = split.x_train.std(axis=0, ddof=1)
        kwargs["scaler_mean"] = tuple(split.x_train.mean(axis=0))
        kwargs["scaler_std"] = tuple(np.where(std > 0, std, 1.0))
    return ModelConfig(n_inputs=split.x_train.shape[1], **kwargs)


def _fixed_fields(split: Split) -> tuple:
    """The schema's fields, each number with the mean and deviation of its values present in the training part."""
    out = []
    for f, at in zip(split.schema.fields, split.schema.offsets()):
        if f.type == "number":
            column = split.x_train[:, at]
            present = column[~np.isnan(column)]
            mean = float(present.mean()) if len(present) else 0.0
            std = float(present.std(ddof=1)) if len(present) > 1 else 0.0
            f = dataclasses.replace(f, mean=mean, std=std if std > 0 else 1.0)
        out.append(f)
    return tuple(out)


def baselines_scored_from(config, modes) -> int:
    """``run_protocol``'s ``scored_from_label`` for the baselines beside the models of ``modes`` (``config``: one
    of them): the labels a regression model holds for its target scaling, its rows before them left out of its
    prequential metric and so of theirs; 0 without a model beside them or without that warm-up."""
    if modes and config.task == "regression" and config.target_scaler == "warmup":
        return config.warmup_rows
    return 0


def evaluate(
    dataset: Dataset,
    *,
    model: dict | None = None,
    modes=("forward", "ridge"),
    baselines=(),
    protocol: Protocol | None = None,
    classes=None,
    on_point=None,
    on_batch=None,
) -> list[EvaluationResult]:
    """Run every mode and baseline over the same split; one result each, in that order."""
    protocol = protocol or Protocol()
    split = make_split(dataset, protocol, classes=classes)
    learners = [EdRVFLLearner(model_config(split, mode, model)) for mode in modes]  # validate all first
    held = 0
    if baselines:
        config = model_config(split, "ridge", model)
        learners += [make_baseline(name, split, config) for name in baselines]
        held = baselines_scored_from(config, modes)
    return [
        run_protocol(learner, split, protocol, on_point=on_point, on_batch=on_batch, scored_from_label=held)
        for learner in learners
    ]


# --------------------------------------------------------------------------------- CLI


__all__ = [
    "EvaluationResult",
    "Protocol",
    "Split",
    "evaluate",
    "make_split",
    "model_config",
    "run_protocol",
    "baselines_scored_from",
    "time_points",
]
