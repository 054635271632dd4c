"""What the model returns for a batch of rows it predicted (``EdRVFL.observe``, ``predict_batch``): the
features it computed, every layer's and candidate's outputs, the probabilities, classes or values, and the
version and clock that ``learn`` needs to fold the rows' labels in as they were predicted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iolstream.core import activation_kernels


@dataclass
class Prediction:
    """What ``observe``/``predict_batch`` return for a batch of b rows.

    features_t    : (L, n, b) — D_lᵀ, reusable by ``learn`` to avoid recomputing features
    layer_outputs : (L, b, m) — D_l β_l with the β in force for this prediction
    proba         : (b, m) — class probabilities (classification; calibrated, ``core.calibration``) or None
    index         : (b,) int — predicted class index (classification) or None
    value         : (b, m) — regression prediction or None
    version       : model version that made it
    clock         : the learner's clock right after this batch was seen: the rows' stamp for
                    ``learn(observed_at=...)`` under forgetting
    candidate_outputs : (K, L, b, m) — with ``auto``, every candidate's layer outputs, NaN for the candidates
                    that did not predict this batch (``ScoringBudget``; pass them to ``learn(predicted=...)``
                    so that each is judged on its own prediction), else None
    interval      : (y_lo, y_hi), each (b, m) — regression with ``model.interval`` (``core.intervals``; NaN
                    before any residual), else None
    """

    features_t: np.ndarray
    layer_outputs: np.ndarray
    proba: np.ndarray | None
    index: np.ndarray | None
    value: np.ndarray | None
    version: int
    clock: int = 0
    candidate_outputs: np.ndarray | None = None
    interval: tuple | None = None

    @property
    def scores(self) -> np.ndarray:
        """(b, m) the ensemble's raw output s̄: the mean of the layers' outputs (``proba`` calibrates the mean of
        their clipped outputs, ``calibration.ensemble_scores``)."""
        return activation_kernels.layer_mean(np.ascontiguousarray(self.layer_outputs, dtype=np.float64))

    @property
    def predicted(self) -> np.ndarray:
        """What ``learn(predicted=...)`` takes for these rows: every candidate's outputs with ``auto``, else layer_outputs."""
        return self.layer_outputs if self.candidate_outputs is None else self.candidate_outputs

    def labels(self, classes) -> list:
        return [classes[i] for i in self.index]
