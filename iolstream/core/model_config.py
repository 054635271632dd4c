"""The model's hyperparameters: ``ModelConfig``, stored exactly as given and validated at construction (a bad
value raises naming its key), with what follows from them: the task, m, the ensemble rule and the candidates of
``auto`` (``candidates``). ``core.model`` builds the model from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from iolstream.core import activation_kernels, learner, weighted_rows
from iolstream.core.candidates import (
    AUTO_START_MODE,
    HALF_LIFE_CANDIDATES,
    LAM_CANDIDATES,
    MODES,
    SCORING_SHARE,
    candidate_grid,
    with_modes,
)
from iolstream.core.network import INITS, resolve_init
from iolstream.core.scaling import SCALER_MODES
from iolstream.core.schema import FeatureSchema, SchemaError

TASKS = ("classification", "regression")
TARGET_SCALERS = ("warmup", "fixed", "none")
ENSEMBLES = {"classification": ("softmax", "vote"), "regression": ("mean", "median")}
DTYPES = ("float64", "float32")
CALIBRATIONS = ("online", "none")  # online: core.calibration; none: the mean of the layers' softmax


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters, stored exactly as given and validated at construction.

    Defaults were chosen from measurements over the shipped data sets (docs/benchmarks.md, "Why these defaults").
    """

    n_inputs: int | None = None  # the row's width; with ``features``, their encoded width (may be left out)
    classes: tuple | None = (
        None  # classification: the declared classes (ints, texts or false/true); None: regression
    )
    n_outputs: int = 1  # regression outputs (ignored for classification: m = len(classes))
    n_nodes: int = 512  # defaults: the most robust of benchmarks/why_these_defaults.py (docs/benchmarks.md, "Why these defaults")
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
    # auto: the share of the step's own work (in operations) that scoring the candidates not in force may cost
    # (candidates.ScoringBudget); "all": they predict every batch
    scoring_share: float | str = SCORING_SHARE
    target_scaler: str = "warmup"  # regression: z-score targets by the first warmup_rows labels ("none": raw)
    target_mean: tuple | None = None  # target_scaler "fixed": m means and m deviations
    target_std: tuple | None = None
    # classification: how proba is made from the layers' outputs (CALIBRATIONS; docs/design.md §12)
    calibration: str = "online"
    # classification: None (every row weighs 1), "balanced" (n / (m · n_class) from the labels folded in so far,
    # this batch's included) or one weight per class; given as {class: weight} (a class not named weighs 1) or a
    # list in the order of ``classes``, stored as that tuple of m floats
    class_weight: str | tuple | None = None
    threshold: float | None = None  # binary: y_hat is the second class when its probability ≥ threshold
    # regression: the coverage of the interval (y_lo, y_hi) each prediction carries, from the recent residuals
    # (core.intervals); None: none
    interval: float | None = None
    # the feature schema (docs/design.md §11): the named fields of an event and how each is encoded; None: rows
    # arrive as arrays of n_inputs numbers. Kept as a tuple of core.schema.FieldSpec
    features: tuple | None = None

    def __post_init__(self):
        def bad(key, allowed, got):
            raise ValueError(f"model.{key}: must be {allowed}, got {got!r}")

        if self.features is not None:
            self._check_features()
        if not (
            isinstance(self.n_inputs, int) and not isinstance(self.n_inputs, bool) and self.n_inputs >= 1
        ):
            if self.n_inputs is None:
                raise ValueError(
                    "model.n_inputs: required (the number of features per row), or model.features"
                )
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
        if self.activation not in activation_kernels.ACTIVATIONS:
            bad("activation", f"one of {activation_kernels.ACTIVATIONS}", self.activation)
        if self.init not in INITS:
            bad("init", f"one of {INITS}", self.init)
        object.__setattr__(self, "init", resolve_init(self.init, self.activation))  # names the weights drawn
        if self.forgetting != "auto":
            try:
                weighted_rows.check_half_life(self.forgetting)
            except ValueError:
                bad(
                    "forgetting",
                    "null (never forget), auto (chosen online), or a half-life in rows, a number > 0",
                    self.forgetting,
                )
        share = self.scoring_share
        if share != "all" and not (
            isinstance(share, (int, float))
            and not isinstance(share, bool)
            and np.isfinite(share)
            and share > 0
        ):
            bad("scoring_share", "a number > 0 (a share of the step's work), or all (every batch)", share)
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
        if self.scaler == "fixed" and self.features is not None:  # per number field: its mean and std
            if self.scaler_mean is not None or self.scaler_std is not None:
                bad(
                    "scaler_mean",
                    "left out with model.features (each number field gives its mean and std)",
                    self.scaler_mean,
                )
            try:
                self.schema.fixed_scaling()
            except SchemaError as exc:
                raise ValueError(str(exc)) from None
        elif self.scaler == "fixed":  # checked here, not when the Scaler is built: fail at config load
            self._check_fixed_scaling("scaler", self.n_inputs, bad, store=False)
        if self.ensemble is not None and self.ensemble not in ENSEMBLES[self.task]:
            bad("ensemble", f"one of {ENSEMBLES[self.task]} for {self.task}", self.ensemble)
        if self.calibration not in CALIBRATIONS:
            bad("calibration", f"one of {CALIBRATIONS}", self.calibration)
        self._check_class_weight(bad)
        self._check_interval(bad)
        if self.threshold is not None:
            if self.classes is None or len(self.classes) != 2:
                bad("threshold", "null unless the model has exactly 2 classes", self.threshold)
            if isinstance(self.threshold, bool) or not (
                isinstance(self.threshold, (int, float)) and 0.0 < self.threshold < 1.0
            ):
                bad("threshold", "a number between 0 and 1 (exclusive), or null", self.threshold)
            object.__setattr__(self, "threshold", float(self.threshold))

    def _check_interval(self, bad) -> None:
        """``interval``: null, or a coverage strictly between 0 and 1 for a regression model."""
        if self.interval is None:
            return
        if self.classes is not None:
            bad("interval", "null for a classification model (its proba is the uncertainty)", self.interval)
        if isinstance(self.interval, bool) or not (
            isinstance(self.interval, (int, float)) and 0.0 < self.interval < 1.0
        ):
            bad("interval", "a coverage between 0 and 1 (exclusive, e.g. 0.9), or null", self.interval)
        object.__setattr__(self, "interval", float(self.interval))

    def _check_class_weight(self, bad) -> None:
        """``class_weight``: None / "none", "balanced", {class: weight} or m weights; stored as None, "balanced"
        or a tuple of m floats in the order of ``classes`` (raises through ``bad`` naming the key)."""
        value = self.class_weight
        if value is None or value == "none":
            object.__setattr__(self, "class_weight", None)
            return
        allowed = "none, balanced, {class: weight > 0} or a list of one weight > 0 per class"
        if self.classes is None:
            bad("class_weight", "none for regression", value)
        if value == "balanced":
            return
        if isinstance(value, dict):
            index = {c: i for i, c in enumerate(self.classes)}
            by_text = {str(c): i for i, c in enumerate(self.classes)}
            weights = [1.0] * len(self.classes)
            for key, weight in value.items():
                i = index.get(key, by_text.get(str(key)))
                if i is None:
                    bad("class_weight", f"weights of declared classes {list(self.classes)}", key)
                weights[i] = weight
        elif isinstance(value, (list, tuple)) and len(value) == len(self.classes):
            weights = list(value)
        else:
            bad("class_weight", allowed, value)
        ok = all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and np.isfinite(w) and w > 0
            for w in weights
        )
        if not ok:
            bad("class_weight", allowed, value)
        object.__setattr__(self, "class_weight", tuple(float(w) for w in weights))

    def _check_features(self) -> None:
        """``features`` parsed into FieldSpecs; ``n_inputs`` is their encoded width (a config that gives another
        is refused naming both)."""
        try:
            schema = FeatureSchema.parse(self.features)
        except SchemaError as exc:
            raise ValueError(str(exc)) from None
        object.__setattr__(self, "features", schema.fields)
        if self.n_inputs is None:
            object.__setattr__(self, "n_inputs", schema.width)
        elif self.n_inputs != schema.width:
            raise ValueError(
                f"model.n_inputs: {self.n_inputs!r} disagrees with model.features, which encode {schema.width} "
                f"inputs ({', '.join(f'{f.name}: {f.width}' for f in schema.fields)}); leave n_inputs out"
            )

    @property
    def schema(self) -> FeatureSchema | None:
        """The feature schema (``features``), or None: rows arrive as arrays."""
        return None if self.features is None else FeatureSchema(self.features)

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

    @property
    def calibrated(self) -> bool:
        """Whether ``proba`` is calibrated online (classification, softmax ensemble, ``calibration: online``)."""
        return (
            self.task == "classification" and self.ensemble_rule == "softmax" and self.calibration == "online"
        )

    def to_dict(self) -> dict:
        """Every key as given (``features``: each field's config entry, its keys that differ from their
        defaults); without a schema ``features`` is left out, as configs and snapshots made before it."""
        out = asdict(self)
        if self.features is None:
            del out["features"]
        else:
            out["features"] = [f.to_config() for f in self.features]
        return out

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
    def scoring(self) -> float:
        """``scoring_share`` as a number (inf: every batch)."""
        return math.inf if self.scoring_share == "all" else float(self.scoring_share)

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
