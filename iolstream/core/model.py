"""The edRVFL model: random hidden layers, a scaler, L online learners and the ensemble.

``EdRVFL`` ties the pieces together for one task (classification with a declared
class list, or regression with m outputs). Arrays in, arrays out, no I/O.

    >>> import numpy as np
    >>> from iolstream.core.model import EdRVFL, ModelConfig
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((300, 4)); y = (x[:, 0] + x[:, 1] > 0).astype(int)
    >>> model = EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1), n_nodes=32, n_layers=2, scaler="none"))
    >>> for start in range(0, 300, 50):            # predict a batch, then learn its labels
    ...     prediction = model.observe(x[start:start + 50])
    ...     _ = model.learn(prediction, y[start:start + 50])
    >>> float((model.predict(x) == y).mean()) > 0.9
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

import numpy as np

from iolstream.core import activation_kernels, calibration, intervals, learner, regret, row_erasure
from iolstream.core.candidate_set import make_candidate_set
from iolstream.core.candidates import HALF_LIFE_CANDIDATES, LAM_CANDIDATES
from iolstream.core.encoder import RecordEncoder
from iolstream.core.model_config import DTYPES, ENSEMBLES, TARGET_SCALERS, TASKS, ModelConfig
from iolstream.core.network import RandomNetwork
from iolstream.core.prediction import Prediction
from iolstream.core.regret import RegretReport
from iolstream.core.scaling import Scaler, ScalerNotReady, TargetScaler


def _of_candidate_set(name: str, doc: str, settable: bool = False) -> property:
    """A property reading (and, if ``settable``, writing) ``candidate_set.<name>``."""

    def put(self, value) -> None:
        setattr(self.candidate_set, name, value)

    return property(lambda self: getattr(self.candidate_set, name), put if settable else None, doc=doc)


def make_scaler(config: ModelConfig) -> Scaler:
    """The input scaler of ``config`` (docs/design.md §4); with a feature schema (§11) it z-scores the number
    columns only, and a fixed scaling comes from each number field's mean and std."""
    schema = config.schema
    mean, std = config.scaler_mean, config.scaler_std
    if schema is not None and config.scaler == "fixed":
        mean, std = schema.fixed_scaling()
    return Scaler(
        config.scaler,
        config.n_inputs,
        warmup_rows=config.warmup_rows,
        mean=mean,
        std=std,
        scaled=None if schema is None else schema.scaled,
    )


class EdRVFL:
    """An ensemble deep RVFL network learning online by -F or -R (or choosing between them: ``mode: auto``).

    One way to learn a stream, predict then learn, as River's ``predict_one`` / ``learn_one``:

    - ``observe(x) -> Prediction``: a new batch of rows (b, n_inputs); under -F its Gram enters first, then it
      is predicted (``Prediction.index`` / ``.proba`` / ``.value``);
    - ``learn(prediction, y)``: the labels of those rows, when they come (class labels, or regression values
      (b,) or (b, m)); each candidate of ``auto`` is judged on what it predicted.

    ``learn_rows(x, y)`` learns labelled rows never observed (history, a backfill); ``predict`` and
    ``predict_batch`` change nothing. The stream's processor uses the low-level form of ``learn`` (features,
    encoded targets and the outputs it kept for the rows, ``Prediction.predicted``).
    """

    # what the learners hold (``candidate_set.CandidateSet``), read where the model is
    candidates = _of_candidate_set(
        "pairs", "each candidate's (lam, half_life); one of fixed settings: [its own]"
    )
    modes = _of_candidate_set("modes", "each candidate's mode, -F 'forward' or -R 'ridge'")
    learners = _of_candidate_set(
        "learners", "every candidate's learner (one of fixed settings: a list of one)"
    )
    selector = _of_candidate_set(
        "selector", "``candidates.CandidateSelector``: which is in force", settable=True
    )
    scoring = _of_candidate_set("scoring", "``candidates.ScoringBudget``: which batches the others predict")
    batch_grams = _of_candidate_set(
        "batch_grams", "``candidate_step.BatchGrams``: Grams kept for A_r (mode auto)"
    )
    emitted_loss = _of_candidate_set(
        "emitted_loss", "(L,) auto: Σ_t L_{l,t} of what was emitted", settable=True
    )
    predicted_rows = _of_candidate_set(
        "predicted_rows", "(K,) auto: labelled rows each predicted", settable=True
    )

    def __init__(self, config: ModelConfig, candidates: list[tuple] | None = None, modes: list | None = None):
        """``candidates``: the (lam, half_life) grid of ``auto`` and ``modes`` each one's mode (default
        ``config.candidates`` and ``config.candidate_modes``; a restored snapshot passes the grid it was saved
        with)."""
        self.config = config
        self.network = RandomNetwork.create(
            config.n_inputs,
            config.n_nodes,
            config.n_layers,
            activation=config.activation,
            init=config.init,
            seed=config.seed,
            dtype=np.dtype(config.dtype),
            bias_column=config.bias_column,
        )
        self.scaler = make_scaler(config)
        self.encoder = None if config.schema is None else RecordEncoder(config.schema)
        pairs = config.candidates if candidates is None else [(lam, h) for lam, h in candidates]
        modes = config.candidate_modes if modes is None else list(modes)  # each candidate's -F / -R
        # the learners, as one: the one of fixed settings, or the candidates of auto (core.candidate_set)
        self.candidate_set = make_candidate_set(config, self.network.n_columns, pairs, modes)
        self._class_index = (
            {c: i for i, c in enumerate(config.classes)} if config.classes is not None else None
        )
        # classification: labelled rows folded in per class (model.class_weight "balanced" weighs by them)
        self.class_counts = np.zeros(config.m if config.classes is not None else 0)
        scale_targets = config.task == "regression" and config.target_scaler == "warmup"
        self.targets = TargetScaler(config.m, config.warmup_rows, scale_targets)
        # regression: Σ w of the emitted predictions' residuals per output and bin (core.intervals), valued at the
        # learners' clock ``residual_clock``
        self.residual_counts = np.zeros((config.m if config.task == "regression" else 0, intervals.N_BINS))
        self.residual_clock = 0
        if config.task == "regression" and config.target_scaler == "fixed":
            self.targets.mean, self.targets.std = np.array(config.target_mean), np.array(config.target_std)
        self.thread_tuner = None  # set by step_tuner.configure_for_model: threads chosen by timing
        # the class weight of each row the last ``learn`` folded in (None: 1), for a record of what it entered with
        self.entered_weights: np.ndarray | None = None

    def set_scoring_share(self, share) -> None:
        """Another ``model.scoring_share`` (a number > 0, or "all") from now on: it sets which batches the
        candidates not in force are scored on, not what any sums hold (a restart may change it)."""
        self.config = dataclasses.replace(self.config, scoring_share=share)
        self.scoring.share = self.config.scoring

    def sync_candidates(self) -> None:
        """Every candidate's ``state`` holds its sums (they read their primary's when solving: a snapshot or a
        regret report reads the copy)."""
        self.candidate_set.sync()

    @property
    def learner(self) -> learner.OnlineLearner:
        """The learner in force (the only one, or the candidate ``auto`` has chosen)."""
        return self.candidate_set.learner

    @property
    def version(self) -> int:
        """Bumped at every change of the β in force: the learner's version; with ``auto``, the sum of every
        candidate's plus the selector's switches (never goes back when another candidate takes over)."""
        return self.candidate_set.version

    @property
    def effective(self) -> dict:
        """The λ, half-life and mode (-F "forward" or -R "ridge") in force and, with ``auto``, every candidate's
        recent loss per row (error rate, or squared error, of its ensemble: see CandidateSelector) and the share
        of the rows every candidate predicted (``ScoringBudget``)."""
        chosen = self.selector.chosen
        lam, half_life = self.candidates[chosen]
        out = {"lam": lam, "forgetting": half_life, "mode": self.modes[chosen]}
        out.update(self.candidate_set.describe())
        return out

    # ------------------------------------------------------------- encoding
    def encode_labels(self, y) -> np.ndarray:
        """Targets Y (b, m) float64: one-hot of class labels, or regression values."""
        if self._class_index is None:
            return np.asarray(y, dtype=np.float64).reshape(-1, self.config.m)
        try:
            index = np.fromiter(
                (self._class_index[v.item() if hasattr(v, "item") else v] for v in y), dtype=np.int64
            )
        except KeyError as exc:
            raise ValueError(
                f"unknown class {exc.args[0]!r}; declared classes: {list(self.config.classes)}"
            ) from None
        return self.one_hot(index)

    def encode(self, records) -> np.ndarray:
        """Raw input rows (b, n_inputs) of ``records`` (dicts of named fields, as events carry them) by the
        model's feature schema (``model.features``, ``core.encoder``): what ``observe`` and ``predict_batch``
        take. ValueError naming the first record refused and its field."""
        if self.encoder is None:
            raise ValueError(
                "the model has no feature schema (model.features): its rows are arrays of numbers"
            )
        out = self.encoder.encode(records)
        if out.refused:
            i, reason, detail = out.refused[0]
            more = f" (and {len(out.refused) - 1} more records)" if len(out.refused) > 1 else ""
            raise ValueError(f"record {i}: {reason}: {detail}{more}")
        return out.X

    def one_hot(self, index: np.ndarray) -> np.ndarray:
        out = np.zeros((len(index), self.config.m))
        out[np.arange(len(index)), index] = 1.0
        return out

    # ------------------------------------------------------------- features
    @property
    def ready(self) -> bool:
        """False while a warm-up scaler still waits for rows."""
        return self.scaler.frozen

    def features(self, x: np.ndarray) -> np.ndarray:
        """D_lᵀ for every layer, (L, n, b), from raw rows (b, k). Raises ScalerNotReady while warming up."""
        return self.network.features(self._scaled(x), parallel=self.learner.parallel)

    def _scaled(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.config.n_inputs:
            raise ValueError(f"expected rows of {self.config.n_inputs} features, got shape {x.shape}")
        return self.scaler.transform(x)

    # ----------------------------------------------------------- prediction
    @property
    def calibrated(self) -> bool:
        """Whether ``proba`` is calibrated online (classification, softmax ensemble, ``calibration: online``)."""
        return self.config.calibrated

    def calibration_in_force(self, candidate: int | None = None) -> dict | None:
        """The heaviest map of the calibration of the candidate in force (or of ``candidate``):
        ``calibration.describe``."""
        if not self.calibrated:
            return None
        j = self.selector.chosen if candidate is None else candidate
        return calibration.describe(self.learners[j].calibration_sums)

    def combine(self, layer_outputs: np.ndarray, candidate: int | None = None):
        """Ensemble of the layer outputs (L, b, m) -> (proba, index, value). Classification: ``proba`` by the
        calibration of ``candidate`` (default: the one in force), the class of the highest probability
        (``decide``), or with ``threshold`` the second class where its
        probability reaches it."""
        rule = self.config.ensemble_rule
        if self._class_index is None:  # the layers learn scaled targets: their ensemble is mapped back
            if rule == "median":
                return None, None, self.targets.inverse(np.median(layer_outputs, axis=0))
            return (
                None,
                None,
                self.targets.inverse(
                    activation_kernels.layer_mean(np.ascontiguousarray(layer_outputs, dtype=np.float64))
                ),
            )
        n_layers, b, m = layer_outputs.shape
        outputs = np.ascontiguousarray(layer_outputs, dtype=np.float64)
        if self.calibrated:
            j = self.selector.chosen if candidate is None else candidate
            scores = calibration.ensemble_scores(outputs)
            proba = calibration.probabilities(scores, self.learners[j].calibration_sums)
            if self.config.threshold is None:
                return proba, calibration.decision(outputs, scores), None
        elif rule == "softmax":
            proba = activation_kernels.softmax_mean(outputs)
        else:  # majority vote; proba = share of layers voting for each class
            votes = layer_outputs.argmax(axis=2)
            proba = np.zeros((b, m))
            for layer_votes in votes:
                proba[np.arange(b), layer_votes] += 1.0 / n_layers
        return proba, self.decide(proba, outputs), None

    def decide(self, proba: np.ndarray, layer_outputs: np.ndarray) -> np.ndarray:
        """The class index (b,) emitted for rows of these probabilities (b, m) and layer outputs (L, b, m): with
        ``threshold``, the second class where its probability reaches it; calibrated, the highest ensemble score
        (``calibration.decision``: the calibration keeps the classes' order, so the most probable class); else the
        highest probability."""
        if self.config.threshold is not None:
            return (np.asarray(proba)[:, 1] >= self.config.threshold).astype(np.int64)
        if self.calibrated:
            return calibration.decision(layer_outputs)
        return np.asarray(proba).argmax(axis=1)

    def predict_batch(self, x=None, *, features_t=None) -> Prediction:
        """Pure inference: changes nothing."""
        features_t = self.features(x) if features_t is None else features_t
        return self._prediction(features_t, self.candidate_set.layer_outputs(features_t))

    def _prediction(self, features_t, outputs, candidate_outputs=None) -> Prediction:
        """The batch's prediction from the layers' ``outputs`` of the candidate in force (``combine``), at this
        version and clock; ``candidate_outputs``: every candidate's, for learning their labels later."""
        proba, index, value = self.combine(outputs)
        if value is not None and not self.targets.frozen:
            # every label waits for the target scaling, so the layers know none: the labels' mean so far (not the
            # 0 their untouched outputs map back to)
            value = np.tile(self.targets.labels_mean(), (len(value), 1))
        return Prediction(
            features_t,
            outputs,
            proba,
            index,
            value,
            self.version,
            self.learner.clock,
            candidate_outputs,
            self.interval(value),
        )

    def predict(self, x) -> np.ndarray:
        """Predicted class labels (classification) or values (regression; (b,) when m = 1)."""
        pred = self.predict_batch(x)
        if pred.index is not None:
            return np.asarray(self.config.classes)[pred.index]
        return pred.value[:, 0] if self.config.m == 1 else pred.value

    # --------------------------------------------------------------- update
    def observe(self, x) -> Prediction:
        """A new unlabelled batch: -F forward step (its Gram enters first), then its prediction."""
        tuner = self.thread_tuner
        if tuner is not None:
            setting, started = tuner.choose(), time.perf_counter()
            self.learner.parallel = setting.parallel
        # every candidate sees the batch; the others predict the batches the budget pays for
        features_t, outputs, candidate_outputs = self.candidate_set.observe_rows(
            self.network, self._scaled(x)
        )
        prediction = self._prediction(features_t, outputs, candidate_outputs)
        if tuner is not None:
            tuner.record(setting, time.perf_counter() - started, features_t.shape[2])
        return prediction

    def learn(self, features_t, targets, *, gram_in=None, predicted=None, observed_at=None) -> np.ndarray:
        """Fold labelled rows in (see OnlineLearner.learn); returns the loss per layer (L,) of what was emitted.

        ``learn(prediction, y)``: the ``Prediction`` that ``observe`` returned for the rows and their labels ``y``
        as ``predict`` gives them (class labels; regression values).

        The low-level form: ``features_t`` (L, n, b) of the rows, ``targets`` (b, m) (see encode_labels),
        ``predicted`` the rows' ``Prediction.predicted`` (None: rows that were never predicted; the present β
        of every candidate predicts them), ``observed_at`` their ``Prediction.clock`` (needed with forgetting,
        else ignored). With several candidates ``predicted`` must be every candidate's outputs (K, L, b, m): the
        layer outputs of one are refused, since recomputing the others would bypass the scoring budget."""
        if isinstance(features_t, Prediction):
            if gram_in is not None or predicted is not None or observed_at is not None:
                raise TypeError("learn(prediction, y): the prediction carries predicted and observed_at")
            prediction = features_t
            features_t, predicted, observed_at = prediction.features_t, prediction.predicted, prediction.clock
            b, m, shape = features_t.shape[2], self.config.m, np.shape(targets)
            if self._class_index is not None:
                fits, expected = shape == (b,), f"({b},) class labels"
            else:
                fits, expected = shape == (b, m) or (m == 1 and shape == (b,)), f"({b}, {m}) values"
            if not fits:
                raise ValueError(f"y: {expected} for the prediction's {b} rows, got shape {shape}")
            targets = self.encode_labels(targets)
        elif predicted is not None:  # with several candidates, every candidate's outputs
            self.candidate_set.check_predicted(predicted)
        # (b,) for one output, as ``predict`` gives it: (b, m) here, or the selector's row losses would broadcast
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(features_t.shape[2], self.config.m)
        self.entered_weights = None
        if not self.targets.frozen:  # regression warm-up: labels wait until the target scaling is known
            held = self.targets.hold(features_t, targets, gram_in, predicted, observed_at)
            if self.targets.frozen:
                for args in self.targets.release():  # predicted before the scaling: no residual to count
                    self._learn_scaled(*args, residuals=False)
            return held
        return self._learn_scaled(
            features_t, self.targets.transform(targets), gram_in, predicted, observed_at
        )

    def class_weights(self, labels: np.ndarray) -> np.ndarray | None:
        """Each labelled row's weight (b,) by ``model.class_weight`` (None: every row weighs 1), and the class counts
        move on by these rows. "balanced": n / (m · n_c), n_c the rows of class c folded in so far, these included
        (scikit-learn's rule on the labels seen when they arrive; with group learning, the group's)."""
        labels = np.asarray(labels, dtype=np.int64)
        self.class_counts += np.bincount(labels, minlength=self.config.m)
        weight = self.config.class_weight
        if weight is None or not len(labels):
            return None
        if weight == "balanced":
            counts = self.class_counts
            per_class = counts.sum() / (self.config.m * np.maximum(counts, 1.0))
        else:
            per_class = np.asarray(weight, dtype=np.float64)
        return per_class[labels]

    def release_held_labels(self) -> None:
        """Labels held for a target scaling decided elsewhere (group learning) enter once it is known."""
        if self.targets.frozen and self.targets.held:
            for args in self.targets.release():
                self._learn_scaled(*args, residuals=False)

    def _learn_scaled(
        self, features_t, targets, gram_in, predicted, observed_at, residuals: bool = True
    ) -> np.ndarray:
        weights = None
        if self._class_index is not None:
            weights = self.class_weights(targets.argmax(axis=1))
        elif residuals:  # before the update: the residuals of what was predicted
            self.record_residuals(features_t, targets, predicted, observed_at)
        self.entered_weights = weights
        # auto: ``predicted`` (K, L, b, m) from Prediction.candidate_outputs judges each candidate on the
        # prediction it made (NaN where it made none)
        return self.candidate_set.learn(
            features_t,
            targets,
            gram_in=gram_in,
            predicted=predicted,
            observed_at=observed_at,
            sample_weight=weights,
            judge=self.selection_losses,
        )

    def calibration_scores(self, predicted) -> np.ndarray | None:
        """(K, b, m) each candidate's ensemble score for rows (``calibration.ensemble_scores``), from ``predicted``
        as ``learn`` takes it ((L, b, m), or (K, L, b, m) with NaN where a candidate made none): what its
        calibration learns from when their labels come, and loses again if they are erased (``erase(scores=...)``).
        None when ``proba`` is not calibrated."""
        if not self.calibrated:
            return None
        predicted = np.asarray(predicted, dtype=np.float64)
        per = predicted[None] if predicted.ndim == 3 else predicted
        return np.stack([calibration.ensemble_scores(p) for p in per])

    # ------------------------------------------------------------- regression intervals
    @property
    def residual_half_life(self) -> float:
        """Rows seen over which a residual's weight halves: the forgetting half-life when it is fixed, else
        ``intervals.HALF_LIFE``."""
        h = self.config.forgetting
        return float(h) if isinstance(h, (int, float)) and not isinstance(h, bool) else intervals.HALF_LIFE

    def current_residual_counts(self) -> np.ndarray:
        """``residual_counts`` (m, N_BINS) decayed to the learners' clock now (in place)."""
        clock = self.learner.clock
        if clock != self.residual_clock:
            self.residual_counts *= float(np.exp2(-(clock - self.residual_clock) / self.residual_half_life))
            self.residual_clock = clock
        return self.residual_counts

    def record_residuals(self, features_t, targets, predicted, observed_at) -> None:
        """The residuals (scaled units) of what was emitted for these labelled rows enter the interval's counts, each
        at its row's weight 2^(−age/h); with ``auto`` those of the candidate in force, on the rows it predicted."""
        if predicted is None:
            outputs = self.learner.layer_outputs(features_t)
        else:
            predicted = np.asarray(predicted, dtype=np.float64)
            outputs = predicted if predicted.ndim == 3 else predicted[self.selector.chosen]
        emitted = (
            np.median(outputs, axis=0) if self.config.ensemble_rule == "median" else outputs.mean(axis=0)
        )
        rows = np.isfinite(emitted).all(axis=1)  # auto: NaN where the candidate in force did not predict
        b = len(targets)
        weights = np.ones(b)
        if observed_at is not None:
            ages = self.learner.clock - np.broadcast_to(np.asarray(observed_at, dtype=np.float64), (b,))
            weights = np.exp2(-np.maximum(ages, 0.0) / self.residual_half_life)
        counts = self.current_residual_counts()
        intervals.record(counts, (targets - emitted)[rows], weights[rows])

    def interval(self, value) -> tuple | None:
        """(y_lo, y_hi) (b, m) of regression predictions ``value`` (original units) at ``model.interval``'s
        coverage, from the recent residuals (NaN before any); None without ``model.interval``."""
        if self.config.interval is None or value is None:
            return None
        width = intervals.half_width(self.current_residual_counts(), self.config.interval) * self.targets.std
        return value - width, value + width

    def forget(self, features_t, observed_at=None) -> None:
        """Take rows' Gram out of A again, of every candidate (see OnlineLearner.forget); ``observed_at``:
        the rows' ``Prediction.clock`` (with forgetting, each leaves at the weight it has now)."""
        self.candidate_set.forget(features_t, observed_at)

    def selection_losses(self, predicted: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``selection_loss`` of K candidates' layer outputs ``predicted`` (K, L, b, m), each with its own
        calibration: (K, b); the uncalibrated softmax classification ensemble in one kernel call."""
        if self._class_index is not None and self.config.ensemble_rule == "softmax" and not self.calibrated:
            out = np.empty((predicted.shape[0], predicted.shape[2]))
            activation_kernels.softmax_errors(
                np.ascontiguousarray(predicted, dtype=np.float64), targets.argmax(axis=1), out
            )
            return out
        return np.stack([self.selection_loss(outputs, targets, j) for j, outputs in enumerate(predicted)])

    def erase(self, features_t, targets, labelled, observed_at=None, *, weights=None, scores=None) -> None:
        """Take rows out of the model as if it had never seen them (docs/design.md §13): ``core.row_erasure.erase``,
        whose docstring says what each argument is and what leaves where. All or nothing."""
        row_erasure.erase(self, features_t, targets, labelled, observed_at, weights=weights, scores=scores)

    def selection_loss(
        self, layer_outputs: np.ndarray, targets: np.ndarray, candidate: int = 0
    ) -> np.ndarray:
        """Candidate ``candidate``'s loss per row (b,) for CandidateSelector: the log loss of its calibrated
        probabilities (1 where its ensemble misclassified the row when ``proba`` is not calibrated), or its
        ensemble's squared error (original units); ``targets`` as the layers learn them."""
        labels = targets.argmax(axis=1)
        if self.calibrated:  # ``combine``'s probabilities, without the classes it would decide too
            scores = calibration.ensemble_scores(layer_outputs)
            proba = calibration.probabilities(scores, self.learners[candidate].calibration_sums)
            picked = proba[np.arange(len(labels)), labels]
            return -np.log(np.maximum(picked, calibration.PROBABILITY_FLOOR))
        proba, index, value = self.combine(np.asarray(layer_outputs), candidate)
        if index is None:
            return ((value - self.targets.inverse(targets)) ** 2).sum(axis=1)
        return (index != labels).astype(np.float64)

    def learn_rows(self, x, y) -> np.ndarray:
        """Labelled rows never observed before: seen now (the clock moves on), Gram and labels enter together."""
        features_t = self.features(x)
        self.candidate_set.advance(len(x))
        # stamped now: labels held for the target scaling enter later at the weight they have then
        return self.learn(
            features_t,
            self.encode_labels(y),
            gram_in=np.zeros(len(x), dtype=bool),
            observed_at=self.learner.clock,
        )

    # --------------------------------------------------------------- regret
    def regret(self, candidate: int | None = None) -> RegretReport:
        """Cumulative regret of every layer against its offline expert, and the paper's bound: of the
        candidate in force, or of candidate ``candidate`` (its own predictions; see regret.model_report)."""
        return regret.model_report(self, candidate)

    # ---------------------------------------------------------------- state
    def weights_digest(self) -> str:
        h = hashlib.sha256()
        for w, b in zip(self.network.weights_t, self.network.biases):
            h.update(np.ascontiguousarray(w).tobytes())
            h.update(np.ascontiguousarray(b).tobytes())
        return h.hexdigest()


__all__ = [
    "DTYPES",
    "ENSEMBLES",
    "HALF_LIFE_CANDIDATES",
    "LAM_CANDIDATES",
    "TARGET_SCALERS",
    "TASKS",
    "EdRVFL",
    "ModelConfig",
    "Prediction",
    "RegretReport",
    "ScalerNotReady",
]
