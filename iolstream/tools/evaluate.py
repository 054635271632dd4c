"""``iolstream evaluate``: run the IOL process over a data set and measure it as the paper does.

Protocol (pure, in :func:`run`; the CLI wrapper is :func:`add_parser`):

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
Rows per second count training rows over the seconds spent predicting and learning on the
stream; test evaluation is timed apart.

    >>> from iolstream.tools.datasets import load
    >>> from iolstream.tools.evaluate import Protocol, evaluate
    >>> results = evaluate(load("iris"), model={"n_nodes": 32, "n_layers": 2}, modes=("forward", "ridge"))
    >>> [(r.name, r.metric, r.batches) for r in results]
    [('edRVFL-F', 'accuracy', 30), ('edRVFL-R', 'accuracy', 30)]
    >>> abs(results[0].test_metric - results[1].test_metric) < 0.05   # every label in: same sums
    True
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol as TypingProtocol

import numpy as np

from iolstream.core import runtime
from iolstream.tools.baselines import BASELINES, make_baseline
from iolstream.tools.common import pyplot, save_figure
from iolstream.tools.datasets import DataError, Dataset
from iolstream.core.kernels import ACTIVATIONS
from iolstream.core.model import HALF_LIFE_CANDIDATES, LAM_CANDIDATES, EdRVFL, ModelConfig
from iolstream.core.network import INITS

MODES = {"forward": "edRVFL-F", "ridge": "edRVFL-R"}
ORDERS = ("shuffle", "stream")
STREAM_WINDOWS = 50  # --order stream: the windowed prequential curve has this many windows
DEFAULT_BATCH = 0.03  # a fraction of the training set, as the paper's tables give b (Letters: 0.030)
TEST_CHUNK_BYTES = 64 * 2**20  # features of at most this many bytes per test-prediction chunk


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
            raise ValueError(f"batch: must be a number of rows ≥ 1 or a fraction in (0, 1), got {self.batch!r}")
        if self.batch >= 1 and self.batch != int(self.batch):
            raise ValueError(f"batch: a number of rows must be an integer, got {self.batch!r}")
        if not (isinstance(self.label_delay, int) and self.label_delay >= 1):
            raise ValueError(f"label_delay: must be an integer ≥ 1 (1 = the paper's setting), got {self.label_delay!r}")
        if not (0 < self.test_fraction < 1):
            raise ValueError(f"test_fraction: must be in (0, 1), got {self.test_fraction!r}")
        if self.rows is not None and not (isinstance(self.rows, int) and self.rows >= 1):
            raise ValueError(f"rows: must be a positive integer, got {self.rows!r}")
        if not (isinstance(self.curve_points, int) and self.curve_points >= 1):
            raise ValueError(f"curve_points: must be an integer ≥ 1, got {self.curve_points!r}")
        if self.curve_test_rows is not None and not (isinstance(self.curve_test_rows, int) and self.curve_test_rows >= 1):
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
        lookup = {_plain(c): i for i, c in enumerate(declared)}
        index = np.empty(len(y), dtype=np.int64)
        for row, label in enumerate(y.tolist()):
            i = lookup.get(_plain(label), lookup.get(str(label)))
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
        dataset.name, dataset.task, declared, dataset.feature_names,
        np.ascontiguousarray(dataset.X[train]), y[train], np.ascontiguousarray(dataset.X[test]), y[test],
    )  # fmt: skip


def _plain(label):
    return label.item() if hasattr(label, "item") else label


# ---------------------------------------------------------------------------- learners


class StreamLearner(TypingProtocol):
    """What the protocol drives: edRVFL-F/-R here, the comparison learners in ``baselines``."""

    name: str

    def start(self, x_head: np.ndarray) -> None:
        """Before streaming: the first training rows, for a warm-up scaler."""

    def arrive(self, x: np.ndarray) -> tuple[object, np.ndarray]:
        """A new batch: returns (a handle kept until its labels arrive, its prediction)."""

    def label(self, handle, y: np.ndarray) -> float:
        """Labels of an earlier batch; returns its immediate loss."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Pure inference: class indices (b,) or values (b, m)."""

    def regret(self) -> tuple[float | None, float | None]:
        """(cumulative regret, the paper's bound), or (None, None) when not defined."""

    def describe(self) -> dict:
        """Hyperparameters, for the report."""


class EdRVFLLearner:
    """edRVFL driven as the stream drives it (-F: ``observe`` then later ``learn``; -R: predict, learn)."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.model = EdRVFL(config)
        self.name = MODES[config.mode]
        self._classification = config.task == "classification"

    def start(self, x_head: np.ndarray) -> None:
        runtime.configure_for_model(self.model)  # BLAS threads as the worker sets them (MEASUREMENTS.md trap)
        scaler = self.model.scaler
        if not scaler.frozen:
            scaler.partial_fit(x_head[: self.config.warmup_rows])
            scaler.freeze()  # fewer training rows than warmup_rows: freeze on what there is
        targets = self.model.targets
        targets.warmup_rows = min(targets.warmup_rows, max(len(x_head), 2))  # and the targets on every label there is

    def arrive(self, x):
        # -F: the Gram enters, then the prediction. -R: observe leaves the learner alone and only
        # predicts (= predict_batch), but it runs under the model's runtime.StepTuner as in the worker.
        pred = self.model.observe(x)
        return pred, (pred.index if self._classification else pred.value)

    def label(self, pred, y) -> float:
        targets = self.model.one_hot(y) if self._classification else y
        losses = self.model.learn(pred.features_t, targets, predicted=pred.predicted, observed_at=pred.clock)
        return float(losses.mean())

    def predict(self, x):
        out = []
        for chunk in _chunks(x, TEST_CHUNK_BYTES // (8 * self.config.n_layers * self.model.network.n_columns)):
            pred = self.model.predict_batch(chunk)
            out.append(pred.index if self._classification else pred.value)
        return np.concatenate(out)

    def regret(self):
        report = self.model.regret()
        return report.mean_regret, report.bound

    def describe(self) -> dict:
        cfg = self.config.to_dict()
        for key in ("scaler_mean", "scaler_std"):
            if cfg[key] is not None:
                cfg[key] = "(from the training rows)"
        cfg["effective"] = self.model.effective  # λ and half-life in force (auto: each candidate's recent loss)
        return cfg


def _chunks(x: np.ndarray, rows: int):
    rows = max(int(rows), 1)
    for start in range(0, len(x), rows):
        yield x[start : start + rows]


# ------------------------------------------------------------------------------ result


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
    prequential_first20: float | None = None  # --order stream: over the first 20 % of the rows after the warm-up
    prequential_last20: float | None = None  # --order stream: over the last 20 % of the rows
    window_curve: list = field(default_factory=list)  # --order stream: [(rows seen, prequential metric of the window)]

    def to_json(self, per_batch: bool = False) -> dict:
        """A JSON-ready dict (NaN becomes None); per-batch arrays only when asked."""
        out = {
            key: getattr(self, key)
            for key in (
                "name", "dataset", "task", "metric", "test_metric", "prequential_metric", "cumulative_regret",
                "regret_bound", "rows_per_second", "seconds", "test_seconds", "rows", "test_rows", "batch",
                "batches", "label_delay", "seed", "curve", "curve_rows", "curve_test_rows", "config",
                "order", "prequential_first20", "prequential_last20",
            )
        }  # fmt: skip
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


def _errors(task: str, pred: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """(sum of errors, count): misclassified rows, or squared errors over every output."""
    if task == "classification":
        return float(np.count_nonzero(pred != y)), len(y)
    diff = np.asarray(pred, dtype=np.float64).reshape(y.shape) - y
    return float(np.sum(diff * diff)), diff.size


def _metric(task: str, error_sum: float, count: int) -> float:
    if count == 0:
        return math.nan
    if task == "classification":
        return 1.0 - error_sum / count
    return math.sqrt(error_sum / count)


def score(task: str, pred: np.ndarray, y: np.ndarray) -> float:
    """Accuracy (classification) or RMSE (regression)."""
    return _metric(task, *_errors(task, pred, y))


# ------------------------------------------------------------------------------- run


def run(
    learner: StreamLearner,
    split: Split,
    protocol: Protocol,
    *,
    on_point: Callable[[CurvePoint], None] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> EvaluationResult:
    """Stream ``split`` through ``learner`` by the protocol (module docstring) and measure it."""
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

    learner.start(split.x_train)
    learner.predict(split.x_train[:1])  # untimed: loads the JIT-compiled kernels

    batch_prequential = np.full(n_batches, np.nan)
    batch_errors, batch_counts = np.zeros(n_batches), np.zeros(n_batches)
    batch_loss = np.full(n_batches, np.nan)
    pending: deque = deque()  # (batch index, handle, labels), in arrival order
    error_sum, count = 0.0, 0
    learn_seconds = test_seconds = 0.0
    curve, curve_rows = [], []

    def deliver(upto: int) -> None:
        while pending and pending[0][0] <= upto:
            index, handle, y = pending.popleft()
            batch_loss[index] = learner.label(handle, y)

    for t in range(1, n_batches + 1):
        x = split.x_train[(t - 1) * b : t * b]
        y = split.y_train[(t - 1) * b : t * b]
        tic = time.perf_counter()
        deliver(t - 1 - delay)  # labels of batch t - delay (index t-1-delay) arrive before batch t
        handle, pred = learner.arrive(x)
        pending.append((t - 1, handle, y))
        if t == n_batches:
            deliver(n_batches)  # end of stream: every outstanding label arrives
        learn_seconds += time.perf_counter() - tic
        errors, n = _errors(task, pred, y)
        error_sum, count = error_sum + errors, count + n
        batch_prequential[t - 1] = _metric(task, errors, n)
        batch_errors[t - 1], batch_counts[t - 1] = errors, n
        if t in points:
            tic = time.perf_counter()
            test_value = score(task, learner.predict(curve_x), curve_y)
            test_seconds += time.perf_counter() - tic
            rows_seen = min(t * b, n_train)
            curve.append((t, test_value))
            curve_rows.append(rows_seen)
            if on_point is not None:
                on_point(CurvePoint(learner.name, t, n_batches, rows_seen, test_value, _metric(task, error_sum, count),
                                    rows_seen / max(learn_seconds, 1e-12)))  # fmt: skip
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
            sel = (ends > lo) & (ends <= hi)
            return _metric(task, float(batch_errors[sel].sum()), int(batch_counts[sel].sum()))

        warm = getattr(getattr(learner, "config", None), "warmup_rows", 0)
        fifth = n_train // 5
        window = max(n_train // STREAM_WINDOWS, b)
        extra = dict(
            order="stream", prequential_first20=over(warm, warm + fifth), prequential_last20=over(n_train - fifth, n_train),
            window_curve=[(hi, over(hi - window, hi)) for hi in range(window, n_train + 1, window)],
        )  # fmt: skip
    return EvaluationResult(
        name=learner.name, dataset=split.name, task=task, metric=split.metric, test_metric=test_metric,
        prequential_metric=_metric(task, error_sum, count), cumulative_regret=regret, regret_bound=bound,
        rows_per_second=n_train / max(learn_seconds, 1e-12), seconds=learn_seconds, test_seconds=test_seconds,
        rows=n_train, test_rows=len(split.x_test), batch=b, batches=n_batches, label_delay=delay, seed=protocol.seed,
        curve=curve, curve_rows=curve_rows, curve_test_rows=len(curve_x), batch_prequential=batch_prequential,
        batch_loss=batch_loss, config=learner.describe(), **extra,
    )  # fmt: skip


def model_config(split: Split, mode: str, model: dict | None = None) -> ModelConfig:
    """A ModelConfig for ``split``: ModelConfig's defaults, overridden by ``model``.

    ``scaler="fixed"`` without a mean and std takes them from the whole training part (an
    offline choice, never the test rows).
    """
    kwargs = dict(model or {})
    kwargs["mode"] = mode
    if split.task == "classification":
        kwargs["classes"] = tuple(_plain(c) for c in split.classes)
    else:
        kwargs["n_outputs"] = split.n_outputs
    if kwargs.get("scaler") == "fixed" and kwargs.get("scaler_mean") is None:
        std = split.x_train.std(axis=0, ddof=1)
        kwargs["scaler_mean"] = tuple(split.x_train.mean(axis=0))
        kwargs["scaler_std"] = tuple(np.where(std > 0, std, 1.0))
    return ModelConfig(n_inputs=split.x_train.shape[1], **kwargs)


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
    if baselines:
        learners += [make_baseline(name, split, model_config(split, "ridge", model)) for name in baselines]
    return [run(learner, split, protocol, on_point=on_point, on_batch=on_batch) for learner in learners]


# --------------------------------------------------------------------------------- CLI


def add_parser(subparsers):
    """``iolstream evaluate``: the protocol above, as a command."""
    from iolstream.tools.common import add_data_source, model_defaults, positive_float, positive_int

    defaults = model_defaults()
    p = subparsers.add_parser(
        "evaluate",
        help="run the IOL process over a data set and report it as the paper does",
        description=(
            "Shuffle with the seed, hold out a test set, stream the rest in batches: predict each batch "
            "(the prequential metric), learn its labels label-delay batches later, and measure the test "
            "metric at logarithmically spaced time points. Model defaults come from ModelConfig."
        ),
    )
    src = add_data_source(p)
    src.add_argument("--task", choices=("auto", "classification", "regression"), default="auto",
                     help="--csv only: classification or regression (default: auto)")  # fmt: skip
    src.add_argument("--classes", metavar="A,B,...",
                     help="declare the class list (comma-separated); a label outside it is an error")  # fmt: skip
    src.add_argument("--rows", type=positive_int, metavar="N", help="use at most N rows (after shuffling; poker: generate N)")
    src.add_argument("--no-sort-cards", dest="sort_cards", action="store_false",
                     help="poker: keep the cards in draw order (default: sorted, as the paper did)")  # fmt: skip

    mdl = p.add_argument_group("model (defaults: ModelConfig)")
    mdl.add_argument("--mode", choices=("forward", "ridge", "both"), default="both", help="-F, -R or both (default: both)")
    mdl.add_argument("--layers", type=positive_int, default=defaults["n_layers"], metavar="L",
                     help="hidden layers L (default: %(default)s)")  # fmt: skip
    mdl.add_argument("--nodes", type=positive_int, default=defaults["n_nodes"], metavar="N",
                     help="nodes per layer N (default: %(default)s)")  # fmt: skip
    lam = mdl.add_mutually_exclusive_group()
    lam.add_argument("--lam", type=_auto_or(positive_float), metavar="λ",
                     help=f"ridge prior λ, or auto (chosen online among {', '.join(map(str, LAM_CANDIDATES))}) "
                          f"(default: {defaults['lam']})")  # fmt: skip
    lam.add_argument("--log2-inv-lam", type=float, metavar="V", help="λ = 2^-V, as in the paper's tables")
    mdl.add_argument("--forgetting", type=_auto_or(positive_float), metavar="H",
                     help="half-life in rows: a row seen H rows ago weighs 1/2; auto: chosen online among "
                          f"{', '.join(map(str, HALF_LIFE_CANDIDATES))} (default: none, never forget)")  # fmt: skip
    mdl.add_argument("--activation", choices=ACTIVATIONS, default=defaults["activation"], help="(default: %(default)s)")
    mdl.add_argument("--init", choices=INITS, default=defaults["init"], help="random weights (default: %(default)s)")
    mdl.add_argument("--scaler", choices=("warmup", "fixed", "none"), default=defaults["scaler"],
                     help="z-score from the first --warmup-rows training rows, from the whole training part "
                          "(fixed), or none (default: %(default)s)")  # fmt: skip
    mdl.add_argument("--warmup-rows", type=positive_int, default=defaults["warmup_rows"], metavar="W",
                     help="(default: %(default)s)")  # fmt: skip
    mdl.add_argument("--dtype", choices=("float64", "float32"), default=defaults["dtype"], help="(default: %(default)s)")
    mdl.add_argument("--no-regret", dest="track_regret", action="store_false",
                     help="do not track the regret (-F then skips one Gram update per labelled batch: faster; "
                          "its cumulative regret and both bounds are reported as null)")  # fmt: skip

    prot = p.add_argument_group("protocol")
    prot.add_argument("--batch", type=_batch, default=DEFAULT_BATCH, metavar="B",
                      help="rows per batch, or a fraction of the training set if < 1, e.g. 0.0027 "
                           "(default: %(default)s)")  # fmt: skip
    prot.add_argument("--label-delay", type=int, default=1, metavar="D",
                      help="labels of batch t arrive before batch t+D is predicted; 1 is the paper's "
                           "(default: 1)")  # fmt: skip
    prot.add_argument("--order", choices=ORDERS, default="shuffle",
                      help="shuffle (test set held out, the paper's protocol) or stream: the rows in their own order, "
                           "test-then-train, no test set; reports the prequential metric overall, over the first 20 %% "
                           "after the warm-up, over the last 20 %%, and a windowed curve (default: %(default)s)")  # fmt: skip
    prot.add_argument("--test-fraction", type=float, default=0.2, metavar="F", help="(default: %(default)s)")
    prot.add_argument("--seed", type=int, default=defaults["seed"],
                      help="shuffle, random weights and generated data (default: %(default)s)")  # fmt: skip
    prot.add_argument("--curve-points", type=positive_int, default=20, metavar="P",
                      help="about P log-spaced test points (default: %(default)s)")  # fmt: skip
    prot.add_argument("--curve-test-rows", type=int, default=20_000, metavar="R",
                      help="test rows used for the curve, 0 = all; the final metric uses all "
                           "(default: %(default)s)")  # fmt: skip
    prot.add_argument("--baseline", action="append", default=[], metavar="NAME", choices=BASELINES,
                      help="also run a comparison learner on the same stream (repeatable): "
                           + ", ".join(BASELINES))  # fmt: skip

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true",
                     help="one JSON object per mode/baseline on stdout (the table goes to stderr)")  # fmt: skip
    out.add_argument("--per-batch", action="store_true", help="with --json: add the per-batch prequential metric and loss")
    out.add_argument("--plot", metavar="FILE.png", help="draw the test-metric curves over rows seen")
    out.add_argument("--quiet", action="store_true", help="no table, no progress bar")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    """The ``evaluate`` command: validate everything, then run and report."""
    import json
    import sys

    from iolstream.tools import datasets
    from iolstream.tools import drift
    from iolstream.tools.common import model_defaults
    from iolstream.tools.progress import ProgressBar, Table

    defaults = model_defaults()
    if args.csv is not None and not args.target:
        raise ValueError("--csv needs --target COLUMN")
    if args.csv is None and args.target:
        raise ValueError("--target applies only to --csv")
    if args.csv is None and args.task != "auto":
        raise ValueError("--task applies only to --csv")
    if args.csv is None and args.dataset not in datasets.DATASETS:
        raise DataError(f"unknown data set {args.dataset!r}; valid names: {', '.join(datasets.DATASETS)}")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        raise ValueError(f"--plot: expected a .png file name, got {args.plot!r}")
    try:
        protocol = Protocol(
            batch=args.batch, label_delay=args.label_delay, test_fraction=args.test_fraction, seed=args.seed,
            rows=args.rows, curve_points=args.curve_points, curve_test_rows=args.curve_test_rows or None, order=args.order,
        )  # fmt: skip
    except ValueError as exc:  # "label_delay: ..." -> "--label-delay: ..."
        key, _, rest = str(exc).partition(":")
        raise ValueError(f"--{key.replace('_', '-')}:{rest}") from None
    model = dict(
        n_nodes=args.nodes, n_layers=args.layers, activation=args.activation, init=args.init, seed=args.seed,
        scaler=args.scaler, warmup_rows=args.warmup_rows, dtype=args.dtype, track_regret=args.track_regret,
    )  # fmt: skip
    if args.forgetting is not None:
        model["forgetting"] = args.forgetting
    if args.lam is not None:
        model["lam"] = args.lam
    elif args.log2_inv_lam is not None:
        model["lam"] = 2.0 ** (-args.log2_inv_lam)
    modes = ("forward", "ridge") if args.mode == "both" else (args.mode,)
    classes = _parse_classes(args.classes) if args.classes else None

    if args.csv is not None:
        dataset = datasets.load_csv(args.csv, args.target, task=args.task)
    elif args.dataset == "poker":
        dataset = datasets.load("poker", rows=args.rows, seed=args.seed, sort_cards=args.sort_cards)
    elif args.dataset in ("friedman", *drift.STREAMS) and args.rows is not None:
        dataset = datasets.load(args.dataset, n_rows=args.rows, seed=args.seed)
    else:
        dataset = datasets.load(args.dataset, seed=args.seed)
    if classes is not None and dataset.task == "classification":
        classes = _match_classes(classes, dataset)

    # Validate every learner before the first batch runs (a bad value fails here, not mid-run).
    split = make_split(dataset, protocol, classes=classes)
    learners = [EdRVFLLearner(model_config(split, mode, model)) for mode in modes]
    if args.baseline:
        learners += [make_baseline(name, split, model_config(split, "ridge", model)) for name in args.baseline]

    table_stream = sys.stderr if args.json else sys.stdout
    b = protocol.batch_rows(len(split.x_train))
    n_batches = -(-len(split.x_train) // b)
    if not args.quiet:
        print(
            f"{dataset.description}\n{len(split.x_train)} training rows in {n_batches} batches of {b}, "
            f"{len(split.x_test)} test rows, label delay {protocol.label_delay}, seed {protocol.seed}",
            file=table_stream,
        )
    results = []
    metric = split.metric
    for learner in learners:
        bar = ProgressBar(n_batches, learner.name, enabled=None if not args.quiet else False)
        table = Table(
            [("model", 9), ("batch", 11), ("rows", 9), (f"test {metric[:3]}", 8, ".4f"),
             (f"preq {metric[:3]}", 8, ".4f"), ("rows/s", 9, ",.0f")],
            stream=table_stream, bar=bar,
        )  # fmt: skip
        if not args.quiet:
            print(file=table_stream)
            table.header()

        def on_point(pt, table=table):
            if not args.quiet:
                table.row(pt.name, f"{pt.t}/{pt.n_batches}", pt.rows_seen, pt.test_metric, pt.prequential_metric,
                          pt.rows_per_second)  # fmt: skip

        def on_batch(t, total, bar=bar):
            bar.update(t, f"batch {t}/{total}")

        try:
            result = run(learner, split, protocol, on_point=on_point, on_batch=on_batch)
        except np.linalg.LinAlgError as exc:  # the Gram lost positive definiteness: features ≫ λ
            raise ValueError(
                f"{learner.name}: {exc} (the hidden features are too large for λ = {model.get('lam', defaults['lam'])}: "
                "try a larger --lam, or --init xavier/kaiming)"
            ) from None
        finally:
            bar.close()
        results.append(result)
        if args.json:
            print(json.dumps(result.to_json(per_batch=args.per_batch), allow_nan=False), flush=True)

    if not args.quiet:
        _summary(results, table_stream)
    if args.plot and protocol.order == "stream":
        plot_windows(results, args.plot, drift.drift_points(dataset.name, len(split.x_train)) if dataset.name in drift.STREAMS else [],
                     title=f"{dataset.name}: prequential {metric} per window, stream order")  # fmt: skip
    elif args.plot:
        plot_curves(results, args.plot, title=f"{dataset.name}: test {metric} over the stream")
        if not args.quiet:
            print(f"plot written to {args.plot}", file=table_stream)
    return 0


def _summary(results, stream) -> None:
    from iolstream.tools.progress import Table

    metric = results[0].metric
    print(file=stream)
    table = Table(
        [("model", 9), (f"test {metric}", 13, ".4f"), (f"preq {metric}", 13, ".4f"), ("cum. regret", 12, ".4g"),
         ("bound", 10, ".4g"), ("rows/s", 9, ",.0f"), ("seconds", 8, ".2f")],
        stream=stream,
    )  # fmt: skip
    table.header()
    for r in results:
        table.row(r.name, r.test_metric, r.prequential_metric, r.cumulative_regret, r.regret_bound,
                  r.rows_per_second, r.seconds)  # fmt: skip
    if results[0].order == "stream":
        print(file=stream)
        table = Table([("model", 14), ("preq all", 10, ".4f"), ("first 20%", 10, ".4f"), ("last 20%", 10, ".4f"),
                       ("in force", 30)], stream=stream)  # fmt: skip
        table.header()
        for r in results:
            eff = r.config.get("effective", {})
            force = f"lam={eff.get('lam')} h={eff.get('forgetting')}" if eff else ""
            table.row(r.name, r.prequential_metric, r.prequential_first20, r.prequential_last20, force)


def plot_curves(results, path: str, *, title: str = "") -> None:
    """Test metric over rows seen (log x), one line per mode/baseline (the paper's Figs. 4, 6, 9)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.plot(r.curve_rows, [v for _, v in r.curve], marker="o", markersize=3, label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("training rows seen")
    ax.set_ylabel(f"test {results[0].metric}")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def plot_windows(results, path: str, drift_rows: list[int], *, title: str = "") -> None:
    """The windowed prequential metric over rows (linear x), one line per learner, drift points as dashed lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        eff = r.config.get("effective")
        label = r.name + (f" (λ {r.config.get('lam')}, h {r.config.get('forgetting')})" if eff else "")
        ax.plot([x for x, _ in r.window_curve], [v for _, v in r.window_curve], label=label)
    for row in drift_rows:
        ax.axvline(row, color="k", linestyle="--", alpha=0.5)
    ax.set_xlabel("rows")
    ax.set_ylabel(f"prequential {results[0].metric} per window")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


# ------------------------------------------------------------------------ arg helpers


def _auto_or(kind):
    """An argparse type: the word ``auto``, or a value of ``kind``."""

    def parse(text: str):
        return "auto" if text.strip().lower() == "auto" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _batch(text: str) -> float:
    import argparse

    from iolstream.tools.common import positive_float

    value = positive_float(text)
    if value >= 1:
        if value != int(value):
            raise argparse.ArgumentTypeError(f"expected whole rows (≥ 1) or a fraction (< 1), got {text!r}")
        return int(value)
    return value


def _parse_classes(text: str) -> list[str]:
    classes = [c.strip() for c in text.split(",") if c.strip()]
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ValueError(f"--classes: need at least 2 distinct comma-separated classes, got {text!r}")
    return classes


def _match_classes(classes: list[str], dataset: Dataset) -> list:
    """Declared classes as given on the command line, typed like the data set's labels."""
    if all(isinstance(_plain(c), (int, np.integer)) for c in dataset.classes):
        try:
            return [int(c) for c in classes]
        except ValueError:
            raise DataError(f"--classes: the labels of {dataset.name} are integers, got {','.join(classes)!r}") from None
    return classes


__all__ = ["EvaluationResult", "Protocol", "Split", "evaluate", "make_split", "model_config", "run", "time_points"]
