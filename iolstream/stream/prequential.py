"""The prequential (test-then-train) metric of the emitted predictions: each prediction is scored when its
label comes, against what was emitted for it. Accuracy for classification, RMSE for regression; over the
whole stream and over a sliding window of the last rows.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class PrequentialMetric:
    """Accuracy (classification) or RMSE (regression) of the emitted predictions, overall and over a
    window."""

    def __init__(self, task: str, window: int):
        self.task = task
        self.n = 0
        self.total = 0.0
        self.window = deque(maxlen=window)

    def update(self, errors: np.ndarray) -> None:
        """errors: per row, 1/0 correctness (classification) or squared error (regression)."""
        self.n += len(errors)
        self.total += float(errors.sum())
        self.window.extend(errors.tolist())

    def _value(self, total, n):
        if n == 0:
            return float("nan")
        return total / n if self.task == "classification" else float(np.sqrt(total / n))

    @property
    def value(self) -> float:
        """Over every emitted prediction labelled so far (NaN before the first)."""
        return self._value(self.total, self.n)

    @property
    def window_value(self) -> float:
        """Over the last ``window`` of them (NaN before the first)."""
        return self._value(sum(self.window), len(self.window))
