"""What the processor hands the adapter: each step's predictions and dead letters (``StepOutput``,
``DeadLetter``), and the prequential metric it keeps (``PrequentialMetric``). No Kafka types.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from iolstream.stream import encoding
from iolstream.stream.rows import BadInput


@dataclass
class DeadLetter:
    """A refused input (a message or one row of it) to write to the dead-letter topic, with why."""

    value: bytes
    bad: BadInput
    source: object  # opaque: what the adapter passed in; None when unknown


@dataclass
class StepOutput:
    """What one step asks the adapter to emit.

    ``predictions`` are encoded on first access: a step whose outputs are not emitted
    (a replay) never encodes them.
    """

    dead_letters: list[DeadLetter] = field(default_factory=list)
    rows_predicted: int = 0
    rows_learned: int = 0
    batch_seconds: float = 0.0
    event_ts: np.ndarray | None = None  # input event times of the predicted rows (ms, -1 unknown)
    _unencoded: list[tuple[list, dict]] = field(
        default_factory=list, repr=False
    )  # (ids, encode_predictions kwargs)
    _encoded: list[tuple[str, bytes]] = field(default_factory=list, repr=False)

    def add_predictions(self, ids: list[str], **encode_kwargs) -> None:
        """One predicted batch, kept as arrays until ``predictions`` is read (see
        encoding.encode_predictions)."""
        self._unencoded.append((ids, encode_kwargs))
        self.rows_predicted += len(ids)

    @property
    def predictions(self) -> list[tuple[str, bytes]]:
        """(key = row id, JSON value) per predicted row, in order."""
        if self._unencoded:
            for ids, kwargs in self._unencoded:
                self._encoded.extend(zip(ids, encoding.encode_predictions(ids, **kwargs)))
            self._unencoded = []
        return self._encoded

    def __bool__(self):
        return bool(self.rows_predicted or self.dead_letters or self.rows_learned)


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
