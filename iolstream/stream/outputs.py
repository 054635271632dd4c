"""What the processor hands the adapter: what to emit (``StepOutput``: predictions, encoded only when read,
and dead letters) and what a refused input becomes (``DeadLetter``, its source passed back untouched).
No Kafka types: the adapter turns them into records (``kafka.output``, ``kafka.deadletters``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iolstream.stream import encoding
from iolstream.stream.rows import BadInput


@dataclass
class DeadLetter:
    """A refused input (a message or one row of it) to write to the dead-letter topic, with why."""

    value: bytes
    bad: BadInput
    source: object  # opaque: what the adapter passed in (the Kafka adapter: with the message's key); None when unknown


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

    def predictions_only(self) -> StepOutput:
        """Its predictions alone (no dead letters, nothing learned): what a re-learning owes (``kafka.relearn``)."""
        out = StepOutput(event_ts=self.event_ts)
        out._unencoded, out._encoded = list(self._unencoded), list(self._encoded)
        out.rows_predicted = self.rows_predicted
        return out

    def __bool__(self):
        return bool(self.rows_predicted or self.dead_letters or self.rows_learned)
