"""The learners the evaluation protocol (``tools.protocol``) drives: edRVFL-F/-R here, the comparison
learners in ``tools.baselines``; and the tiny run that compiles an edRVFL's kernels before the clock starts."""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol as TypingProtocol

import numpy as np

from iolstream.core import step_tuner, unit_ranges
from iolstream.core.learner import WOODBURY_RATIO
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.tools.results import candidate_results, error_sums

MODES = {"forward": "edRVFL-F", "ridge": "edRVFL-R", "auto": "edRVFL-auto"}
MODE_SHORT = {"forward": "-F", "ridge": "-R"}
TEST_CHUNK_BYTES = 64 * 2**20  # features of at most this many bytes per test-prediction chunk


class StreamLearner(TypingProtocol):
    """What the protocol drives: edRVFL-F/-R here, the comparison learners in ``baselines``."""

    name: str

    def start(self, x_head: np.ndarray, batch_sizes=()) -> None:
        """Before streaming (untimed): the first training rows, for a warm-up scaler, and the batch sizes
        the stream will bring (to compile what they will call)."""

    def warming_up(self) -> bool:
        """Optional: True while a prediction would be a placeholder (regression: the target scaling is
        not yet known). The protocol leaves such batches out of the prequential metric."""

    def arrive(self, x: np.ndarray) -> tuple[object, np.ndarray]:
        """A new batch: returns (a handle kept until its labels arrive, its prediction)."""

    def label(self, handle, y: np.ndarray) -> float:
        """Labels of an earlier batch; returns its immediate loss."""

    def probabilities(self, handle) -> np.ndarray | None:
        """Optional: the class probabilities (b, m) emitted with the prediction behind ``handle`` (None:
        regression, or a learner without them)."""

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
        self.compile_seconds = 0.0
        self.units: unit_ranges.UnitRanges | None = None  # measured by start
        # auto: every candidate's own prequential errors (what it would have emitted), beside the model's
        self._candidate_errors = np.zeros((len(self.model.learners), 2))

    def start(self, x_head: np.ndarray, batch_sizes=()) -> None:
        step_tuner.configure_for_model(self.model)  # BLAS threads as the worker sets them
        # A tiny model of the same kind runs the kernels this stream takes (serial, and parallel when the
        # step tuner may pick them) so that their compilation or cache load is not timed as learning.
        tuner = self.model.thread_tuner
        parallel = tuner is not None and any(s.parallel for s in tuner.settings)
        solvers = {self._solver_for(b) for b in batch_sizes} or None
        self.compile_seconds = compile_kernels(self.config, parallel=parallel, solvers=solvers)
        scaler = self.model.scaler
        if not scaler.frozen:
            scaler.partial_fit(x_head[: self.config.warmup_rows])
            scaler.freeze()  # fewer training rows than warmup_rows: freeze on what there is
        self.units = unit_ranges.of_model(self.model, x_head)  # linear or flat units on the warm-up rows
        targets = self.model.targets
        targets.warmup_rows = min(
            targets.warmup_rows, max(len(x_head), 2)
        )  # and the targets on every label there is

    def _solver_for(self, b: int) -> str:
        """The solver a b-row batch takes (core.learner's rule: Woodbury when b · WOODBURY_RATIO ≤ n)."""
        if self.config.solver != "auto":
            return self.config.solver
        if self.config.forgetting is not None or b * WOODBURY_RATIO > self.model.network.n_columns:
            return "cholesky"
        return "woodbury"

    def warming_up(self) -> bool:
        return not self.model.targets.frozen

    def arrive(self, x):
        # -F: the Gram enters, then the prediction. -R: observe leaves the learner alone and only
        # predicts (= predict_batch), but it runs under the model's step_tuner.StepTuner as in the worker.
        scored = not self.warming_up()  # as the protocol scores the model's own predictions
        pred = self.model.observe(x)
        own = None
        if scored and pred.candidate_outputs is not None:  # each candidate's ensemble, scored with the labels
            own = [  # None: not scored on this batch (candidates.ScoringBudget)
                None if np.isnan(out[0, 0, 0]) else self.model.combine(out)[1 if self._classification else 2]
                for out in pred.candidate_outputs
            ]
        return (pred, own), (pred.index if self._classification else pred.value)

    def probabilities(self, handle):
        return handle[0].proba

    def label(self, handle, y) -> float:
        pred, own = handle
        if own is not None:
            for j, guess in enumerate(own):
                if guess is not None:
                    self._candidate_errors[j] += error_sums(self.config.task, guess, y)
        targets = self.model.one_hot(y) if self._classification else y
        losses = self.model.learn(pred.features_t, targets, predicted=pred.predicted, observed_at=pred.clock)
        return float(losses.mean())

    def predict(self, x):
        out = []
        for chunk in _chunks(
            x, TEST_CHUNK_BYTES // (8 * self.config.n_layers * self.model.network.n_columns)
        ):
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
        # λ, half-life and mode in force (auto: each candidate's recent loss)
        cfg["effective"] = self.model.effective
        if len(self.model.learners) > 1:  # auto: each candidate's own run, measured in this one
            cfg["candidate_results"] = candidate_results(self.model, self._candidate_errors)
        if self.units is not None:  # share of hidden units linear or flat on the warm-up rows
            cfg["linear_units"] = round(self.units.share, 4)
        return cfg


def _chunks(x: np.ndarray, rows: int):
    rows = max(int(rows), 1)
    for start in range(0, len(x), rows):
        yield x[start : start + rows]


def compile_kernels(config: ModelConfig, *, parallel: bool, solvers=None, batches: int = 3) -> float:
    """Run a tiny model of ``config``'s kind (dtype, mode, λ and forgetting candidates, activation, task)
    through the protocol's own calls — observe, learn with the prediction, predict, regret — with each
    solver "auto" may pick (or those in ``solvers``), serial and (if ``parallel``) parallel, so that Numba
    compiles or loads every kernel the real stream will call. Numba specialises on dtypes and layouts, not
    sizes: 8 nodes and 8-row batches do. Returns the seconds it took."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    small = dict(n_nodes=8, warmup_rows=8, refactor_every=1)  # Woodbury: the periodic rebuild runs too
    if solvers is None:
        auto = config.solver == "auto" and config.forgetting is None
        solvers = ("woodbury", "cholesky") if auto else (config.solver,)
    for solver in sorted(solvers):
        for par in (False, True) if parallel else (False,):
            learner = EdRVFLLearner(dataclasses.replace(config, solver=solver, **small))
            model = learner.model
            model.learner.parallel = par
            x = rng.standard_normal((8 * batches, config.n_inputs))
            if not model.scaler.frozen:
                model.scaler.partial_fit(x)
                model.scaler.freeze()
            pending = []
            for t in range(batches):
                pred, _ = learner.arrive(x[8 * t : 8 * t + 8])
                pending.append(pred)
                if t:
                    learner.label(pending.pop(0), _random_targets(config, rng, 8))
            learner.label(pending.pop(0), _random_targets(config, rng, 8))
            learner.predict(x[:5])
            if config.track_regret:
                learner.regret()
    return time.perf_counter() - t0


def _random_targets(config: ModelConfig, rng, n: int) -> np.ndarray:
    """Class indices (n,) or regression targets (n, m), as the protocol passes them to ``label``."""
    if config.task == "classification":
        return rng.integers(0, len(config.classes), n)
    return rng.standard_normal((n, config.m))
