"""The edRVFL model: random hidden layers, a scaler, L online learners and the ensemble.

``EdRVFL`` ties the pieces together for one task (classification with a declared
class list, or regression with m outputs). Arrays in, arrays out, no I/O.

    >>> import numpy as np
    >>> from iolstream.core.model import EdRVFL, ModelConfig
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((300, 4)); y = (x[:, 0] + x[:, 1] > 0).astype(int)
    >>> model = EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1), n_nodes=32, n_layers=2, scaler="none"))
    >>> for start in range(0, 300, 50):                    # -F: observe, predict, then learn
    ...     batch = model.observe(x[start:start + 50])
    ...     _ = model.learn(batch.features_t, model.encode_labels(y[start:start + 50]), predicted=batch.layer_outputs)
    >>> float((model.predict(x) == y).mean()) > 0.9
    True
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass

import numpy as np

from iolstream.core import kernels, learner, regret
from iolstream.core.candidates import (
    AUTO_START_MODE,
    HALF_LIFE_CANDIDATES,
    LAM_CANDIDATES,
    MODES,
    CandidateSelector,
    candidate_grid,
    make_learners,
    observe_candidates,
    with_modes,
)
from iolstream.core.network import INITS, RandomNetwork, resolve_init
from iolstream.core.regret import RegretReport
from iolstream.core.scaling import SCALER_MODES, Scaler, ScalerNotReady, TargetScaler

TASKS = ("classification", "regression")
TARGET_SCALERS = ("warmup", "fixed", "none")
ENSEMBLES = {"classification": ("softmax", "vote"), "regression": ("mean", "median")}
DTYPES = ("float64", "float32")


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters, stored exactly as given and validated at construction.

    Defaults were chosen from measurements over the shipped data sets (docs/benchmarks.md, "Why these defaults").
    """

    n_inputs: int
    classes: tuple | None = None  # classification: the declared class list; None: regression
    n_outputs: int = 1  # regression outputs (ignored for classification: m = len(classes))
    n_nodes: int = 512  # defaults: the most robust of scripts/sweep_defaults.py (docs/benchmarks.md, "Why these defaults")
    n_layers: int = 2
    lam: float | tuple = 0.5
    activation: str = "relu"
    init: str = "auto"  # becomes the activation's own init (network.AUTO_INITS): what configs record
    seed: int = 0
    mode: str = "auto"
    ensemble: str | None = None  # default: softmax (classification) / mean (regression)
    solver: str = "auto"
    dtype: str = "float64"
    bias_column: bool = True
    scaler: str = "warmup"
    warmup_rows: int = 256
    scaler_mean: tuple | None = None
    scaler_std: tuple | None = None
    refactor_every: int = 256
    track_regret: bool = True
    forgetting: float | str | None = (
        None  # half-life in rows (docs/design.md §8); None: never forget; "auto": choose online
    )
    target_scaler: str = "warmup"  # regression: z-score targets by the first warmup_rows labels ("none": raw)
    target_mean: tuple | None = None  # target_scaler "fixed": m means and m deviations
    target_std: tuple | None = None

    def __post_init__(self):
        def bad(key, allowed, got):
            raise ValueError(f"model.{key}: must be {allowed}, got {got!r}")

        if not (isinstance(self.n_inputs, int) and self.n_inputs >= 1):
            bad("n_inputs", "an integer ≥ 1", self.n_inputs)
        if self.classes is not None:
            if len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
                bad("classes", "a list of at least 2 distinct labels", self.classes)
            object.__setattr__(self, "classes", tuple(self.classes))
        elif not (isinstance(self.n_outputs, int) and self.n_outputs >= 1):
            bad("n_outputs", "an integer ≥ 1", self.n_outputs)
        for key in ("n_nodes", "n_layers", "refactor_every", "warmup_rows"):
            value = getattr(self, key)
            if not (isinstance(value, int) and value >= 1):
                bad(key, "an integer ≥ 1", value)
        if self.lam == "auto":
            pass
        elif not isinstance(self.lam, (int, float)):
            try:
                object.__setattr__(self, "lam", tuple(float(v) for v in self.lam))
            except (TypeError, ValueError):
                bad(
                    "lam",
                    "a number > 0, a list of one number > 0 per layer, or auto (chosen online)",
                    self.lam,
                )
        try:
            if self.lam != "auto":
                learner.as_lams(self.lam, self.n_layers)
        except ValueError as exc:
            raise ValueError(f"model.{exc}") from None  # as_lams' message starts with "lam:"
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            bad("seed", "an integer ≥ 0", self.seed)
        for key in ("bias_column", "track_regret"):
            if not isinstance(getattr(self, key), bool):
                bad(key, "true or false", getattr(self, key))
        if self.activation not in kernels.ACTIVATIONS:
            bad("activation", f"one of {kernels.ACTIVATIONS}", self.activation)
        if self.init not in INITS:
            bad("init", f"one of {INITS}", self.init)
        object.__setattr__(self, "init", resolve_init(self.init, self.activation))  # names the weights drawn
        if self.forgetting != "auto":
            try:
                learner.check_half_life(self.forgetting)
            except ValueError:
                bad(
                    "forgetting",
                    "null (never forget), auto (chosen online), or a half-life in rows, a number > 0",
                    self.forgetting,
                )
        if self.forgetting is not None and self.solver == "woodbury":
            bad(
                "solver",
                "'auto' or 'cholesky' with forgetting (it rescales A every batch: no rank-b update)",
                self.solver,
            )
        if self.target_scaler not in TARGET_SCALERS:
            bad("target_scaler", f"one of {TARGET_SCALERS}", self.target_scaler)
        if self.target_scaler == "fixed" and self.task == "regression":
            self._check_fixed_scaling("target", self.n_outputs, bad, store=True)
        if self.mode not in MODES:
            bad("mode", f"one of {MODES} (auto: -F and -R chosen online)", self.mode)
        if self.solver not in learner.SOLVERS:
            bad("solver", f"one of {learner.SOLVERS}", self.solver)
        if self.dtype not in DTYPES:
            bad("dtype", f"one of {DTYPES}", self.dtype)
        if self.scaler not in SCALER_MODES:
            bad("scaler", f"one of {SCALER_MODES}", self.scaler)
        if self.scaler == "warmup" and self.warmup_rows < 2:
            bad("warmup_rows", "an integer ≥ 2 with scaler 'warmup'", self.warmup_rows)
        if self.scaler == "fixed":  # checked here, not when the Scaler is built: fail at config load
            self._check_fixed_scaling("scaler", self.n_inputs, bad, store=False)
        if self.ensemble is not None and self.ensemble not in ENSEMBLES[self.task]:
            bad("ensemble", f"one of {ENSEMBLES[self.task]} for {self.task}", self.ensemble)

    def _check_fixed_scaling(self, prefix: str, n: int, bad, *, store: bool) -> None:
        """``<prefix>_mean`` and ``<prefix>_std`` of a fixed scaling: n finite numbers each, deviations > 0
        (``bad`` raises naming the key); ``store``: kept as tuples of floats."""
        switch = "target_scaler" if prefix == "target" else "scaler"
        for key, low in ((f"{prefix}_mean", -np.inf), (f"{prefix}_std", 0.0)):
            value = getattr(self, key)
            try:
                arr = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                arr = np.empty(0)
            if arr.shape != (n,) or not (np.isfinite(arr).all() and (arr > low).all()):
                positive = " > 0" if low == 0.0 else ""
                bad(key, f"a list of {n} finite numbers{positive} with {switch} 'fixed'", value)
            if store:
                object.__setattr__(self, key, tuple(float(v) for v in arr))

    @property
    def task(self) -> str:
        return "classification" if self.classes is not None else "regression"

    @property
    def m(self) -> int:
        return len(self.classes) if self.classes is not None else self.n_outputs

    @property
    def ensemble_rule(self) -> str:
        return self.ensemble or ENSEMBLES[self.task][0]

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def candidates(self) -> list[tuple]:
        """(lam, half_life) of every learner the model keeps: one, or the grid of ``auto`` settings (with
        ``mode: auto``, each setting twice: see ``candidate_modes``)."""
        grid = candidate_grid(self.lam, self.forgetting, LAM_CANDIDATES, HALF_LIFE_CANDIDATES)
        return with_modes(grid, self.mode)[0]

    @property
    def candidate_modes(self) -> list[str]:
        """The mode of every learner the model keeps ("forward" or "ridge"), beside ``candidates``."""
        grid = candidate_grid(self.lam, self.forgetting, LAM_CANDIDATES, HALF_LIFE_CANDIDATES)
        return with_modes(grid, self.mode)[1]

    @property
    def default_mode(self) -> str:
        """The mode the selector starts with: ``mode``, or with ``auto`` candidates.AUTO_START_MODE."""
        return AUTO_START_MODE if self.mode == "auto" else self.mode

    @property
    def default_candidate(self) -> tuple:
        """(lam, half_life) of today's fixed defaults in place of ``auto``: the selector starts with it."""
        return (
            0.5 if self.lam == "auto" else self.lam,
            None if self.forgetting == "auto" else self.forgetting,
        )


@dataclass
class Prediction:
    """What ``observe``/``predict_batch`` return for a batch of b rows.

    features_t    : (L, n, b) — D_lᵀ, reusable by ``learn`` to avoid recomputing features
    layer_outputs : (L, b, m) — D_l β_l with the β in force for this prediction
    proba         : (b, m) — class probabilities (classification) or None
    index         : (b,) int — predicted class index (classification) or None
    value         : (b, m) — regression prediction or None
    version       : model version that made it
    clock         : the learner's clock right after this batch was seen: the rows' stamp for
                    ``learn(observed_at=...)`` under forgetting
    candidate_outputs : (K, L, b, m) — with ``auto``, every candidate's layer outputs (pass them
                    to ``learn(predicted=...)`` so that each is judged on its own prediction), else None
    """

    features_t: np.ndarray
    layer_outputs: np.ndarray
    proba: np.ndarray | None
    index: np.ndarray | None
    value: np.ndarray | None
    version: int
    clock: int = 0
    candidate_outputs: np.ndarray | None = None

    @property
    def predicted(self) -> np.ndarray:
        """What ``learn(predicted=...)`` takes for these rows: every candidate's outputs with ``auto``, else layer_outputs."""
        return self.layer_outputs if self.candidate_outputs is None else self.candidate_outputs

    def labels(self, classes) -> list:
        return [classes[i] for i in self.index]


class EdRVFL:
    """An ensemble deep RVFL network learning online by -F or -R."""

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
        self.scaler = Scaler(
            config.scaler,
            config.n_inputs,
            warmup_rows=config.warmup_rows,
            mean=config.scaler_mean,
            std=config.scaler_std,
        )
        self.candidates = config.candidates if candidates is None else [(lam, h) for lam, h in candidates]
        self.modes = config.candidate_modes if modes is None else list(modes)  # each candidate's -F / -R
        self.learners = make_learners(config, self.network.n_columns, self.candidates, self.modes)
        start = list(zip(self.candidates, self.modes)).index((config.default_candidate, config.default_mode))
        self.selector = CandidateSelector(len(self.learners), start)
        self.emitted_loss = np.zeros(config.n_layers)  # auto: Σ_t L_{l,t} of the candidate in force (regret)
        self._class_index = (
            {c: i for i, c in enumerate(config.classes)} if config.classes is not None else None
        )
        scale_targets = config.task == "regression" and config.target_scaler == "warmup"
        self.targets = TargetScaler(config.m, config.warmup_rows, scale_targets)
        if config.task == "regression" and config.target_scaler == "fixed":
            self.targets.mean, self.targets.std = np.array(config.target_mean), np.array(config.target_std)
        self.thread_tuner = None  # set by runtime.configure_for_model: threads chosen by timing

    @property
    def learner(self) -> learner.OnlineLearner:
        """The learner in force (the only one, or the candidate ``auto`` has chosen)."""
        return self.learners[self.selector.chosen]

    @property
    def version(self) -> int:
        """Bumped at every change of the β in force: the learner's version; with ``auto``, the sum of every
        candidate's plus the selector's switches (never goes back when another candidate takes over)."""
        if len(self.learners) == 1:
            return self.learner.state.version
        return sum(ln.state.version for ln in self.learners) + self.selector.switches

    @property
    def effective(self) -> dict:
        """The λ, half-life and mode (-F "forward" or -R "ridge") in force and, with ``auto``, every candidate's
        recent loss per row (error rate, or squared error, of its ensemble: see CandidateSelector)."""
        chosen = self.selector.chosen
        lam, half_life = self.candidates[chosen]
        out = {"lam": lam, "forgetting": half_life, "mode": self.modes[chosen]}
        if len(self.learners) > 1:
            out["candidates"] = [
                {"lam": c_lam, "forgetting": c_h, "mode": c_mode, "recent_loss": float(v)}
                for (c_lam, c_h), c_mode, v in zip(self.candidates, self.modes, self.selector.recent())
            ]
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
    def combine(self, layer_outputs: np.ndarray):
        """Ensemble of the layer outputs (L, b, m) -> (proba, index, value)."""
        rule = self.config.ensemble_rule
        if self._class_index is None:  # the layers learn scaled targets: their ensemble is mapped back
            if rule == "median":
                return None, None, self.targets.inverse(np.median(layer_outputs, axis=0))
            return (
                None,
                None,
                self.targets.inverse(
                    kernels.layer_mean(np.ascontiguousarray(layer_outputs, dtype=np.float64))
                ),
            )
        n_layers, b, m = layer_outputs.shape
        if rule == "softmax":
            proba = kernels.softmax_mean(np.ascontiguousarray(layer_outputs, dtype=np.float64))
        else:  # majority vote; proba = share of layers voting for each class
            votes = layer_outputs.argmax(axis=2)
            proba = np.zeros((b, m))
            for layer_votes in votes:
                proba[np.arange(b), layer_votes] += 1.0 / n_layers
        return proba, proba.argmax(axis=1), None

    def predict_batch(self, x=None, *, features_t=None) -> Prediction:
        """Pure inference: changes nothing."""
        features_t = self.features(x) if features_t is None else features_t
        outputs = self.learner.layer_outputs(features_t)
        proba, index, value = self.combine(outputs)
        return Prediction(features_t, outputs, proba, index, value, self.version, self.learner.state.clock)

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
        candidate_outputs = None
        if len(self.learners) == 1:
            features_t, outputs = self.learner.observe_rows(self.network, self._scaled(x))
        else:  # the same features for every candidate; each primary before the candidates sharing its sums
            features_t, candidate_outputs = observe_candidates(
                self.learners, self.network, self._scaled(x), self.learner.parallel
            )
            outputs = candidate_outputs[self.selector.chosen]
        proba, index, value = self.combine(outputs)
        if tuner is not None:
            tuner.record(setting, time.perf_counter() - started, features_t.shape[2])
        st = self.learner.state
        return Prediction(features_t, outputs, proba, index, value, self.version, st.clock, candidate_outputs)

    def learn(self, features_t, targets, *, gram_in=None, predicted=None, observed_at=None) -> np.ndarray:
        """Fold labelled rows in (see OnlineLearner.learn). ``targets`` is (b, m) (see encode_labels);
        ``observed_at``: the rows' ``Prediction.clock`` (needed with forgetting, else ignored)."""
        # (b,) for one output, as ``predict`` gives it: (b, m) here, or the selector's row losses would broadcast
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(features_t.shape[2], self.config.m)
        if not self.targets.frozen:  # regression warm-up: labels wait until the target scaling is known
            held = self.targets.hold(features_t, targets, gram_in, predicted, observed_at)
            if self.targets.frozen:
                for args in self.targets.release():
                    self._learn_scaled(*args)
            return held
        return self._learn_scaled(
            features_t, self.targets.transform(targets), gram_in, predicted, observed_at
        )

    def release_held_labels(self) -> None:
        """Labels held for a target scaling decided elsewhere (group learning) enter once it is known."""
        if self.targets.frozen and self.targets.held:
            for args in self.targets.release():
                self._learn_scaled(*args)

    def _learn_scaled(self, features_t, targets, gram_in, predicted, observed_at) -> np.ndarray:
        if len(self.learners) == 1:
            return self.learner.learn(
                features_t, targets, gram_in=gram_in, predicted=predicted, observed_at=observed_at
            )
        # auto: ``predicted`` (K, L, b, m) from Prediction.candidate_outputs judges each candidate on the
        # prediction it made; otherwise each one's present β (these labels are not in it yet either).
        if predicted is None or np.ndim(predicted) != 4:
            predicted = [ln.layer_outputs(features_t) for ln in self.learners]
        chosen = self.selector.chosen
        row_losses = np.empty((len(self.learners), features_t.shape[2]))
        for j, ln in enumerate(self.learners):
            losses = ln.learn(
                features_t, targets, gram_in=gram_in, predicted=predicted[j], observed_at=observed_at
            )
            row_losses[j] = self._selection_loss(predicted[j], targets)
            if j == chosen:
                result = losses
        self.emitted_loss += result
        self.selector.record(row_losses)
        return result

    def forget(self, features_t, observed_at=None) -> None:
        """Take rows' Gram out of A again, of every candidate (see OnlineLearner.forget); ``observed_at``:
        the rows' ``Prediction.clock`` (with forgetting, each leaves at the weight it has now)."""
        for ln in self.learners:
            ln.forget(features_t, observed_at)

    def _selection_loss(self, layer_outputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """A candidate's loss per row (b,) for CandidateSelector: 1 where its ensemble misclassified the
        row, or its ensemble's squared error (original units); ``targets`` as the layers learn them."""
        _, index, value = self.combine(np.asarray(layer_outputs))
        if index is not None:
            return (index != targets.argmax(axis=1)).astype(np.float64)
        return ((value - self.targets.inverse(targets)) ** 2).sum(axis=1)

    def learn_rows(self, x, y) -> np.ndarray:
        """Labelled rows never observed before: seen now (the clock moves on), Gram and labels enter together."""
        features_t = self.features(x)
        for ln in self.learners:
            ln.advance(len(x))
        # stamped now: labels held for the target scaling enter later at the weight they have then
        return self.learn(
            features_t,
            self.encode_labels(y),
            gram_in=np.zeros(len(x), dtype=bool),
            observed_at=self.learner.state.clock,
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


__all__ = ["EdRVFL", "ModelConfig", "Prediction", "RegretReport", "ScalerNotReady"]
