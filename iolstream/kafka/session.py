"""The session: the processor, where the input stands for it, and whether it holds replayed input — one owner.

The loop, the commit unit and group learning all ask this object for the processor rather than holding it,
so that a roll-back replaces the processor, its positions and the replay state whole, in one place
(``roll_back``), and nobody is left holding the old one. What the processor hands back goes out from here:
predictions and dead letters produced (``kafka.output``) and counted in the metrics; or, while the input
replayed is one a committed transaction already covered (exactly-once, ``replaying``), counted and dropped:
it was emitted before.
"""

from __future__ import annotations

import logging

from iolstream.kafka.offsets import Key, OffsetBook
from iolstream.kafka.output import Output
from iolstream.stream.processor import StepOutput, StreamProcessor

log = logging.getLogger("iolstream.worker")


class Session:
    """``processor`` (the stream state and its model), ``book`` (``offsets.OffsetBook``: the positions the
    processor covers, the replay bounds) and ``replaying`` (the processor holds replayed input, which is not
    emitted). ``view``: what the metrics follow."""

    def __init__(
        self, processor: StreamProcessor, book: OffsetBook, output: Output, *, metrics=None, view=None
    ):
        self.processor, self.book = processor, book
        self.output, self.metrics, self.view = output, metrics, view
        self._replaying = False
        self._owed: list[StepOutput] = []  # predictions owed from before a restart (``owe``)
        self._owed_open: list[StepOutput] = []  # those sent in the open transaction: owed again if it is lost

    @property
    def replaying(self) -> bool:
        """The processor holds replayed input (set here only: ``take``, ``cycle_ended``, ``roll_back``)."""
        return self._replaying

    # ------------------------------------------------------------ input
    def take(self, key: Key, offset: int, now: int) -> bool:
        """Message ``offset`` of ``key`` comes next: whether it is replayed input (``OffsetBook.replaying``).
        Replayed (already emitted) and new input never share a step: what the processor holds of the other
        kind is stepped first."""
        replay = self.book.replaying(key, offset)
        if replay != self.replaying:
            self.step(now, force=True)
            self._replaying = replay
        return replay

    def cycle_ended(self) -> None:
        """After a cycle's step: once no partition is replayed any more, what the processor holds is new input."""
        if self.replaying and not self.book.replay_until:
            self._replaying = False

    def roll_back(self, processor: StreamProcessor, positions: dict) -> None:
        """A snapshot loaded (a roll-back): its processor and positions replace the current ones whole; the
        replay bounds follow when the partitions are sought back (``assignment.Assignment.seek_back``)."""
        self.processor = processor
        self.book.reset(positions)
        self._replaying = False
        self._owed = self._owed_open + self._owed  # those the lost transaction carried are owed again
        self._owed_open = []

    # ------------------------------------------------------------ output
    def owe(self, outputs: list[StepOutput]) -> None:
        """Predictions a re-learning made of rows a committed transaction covered before any was predicted
        (group learning, exactly-once: ``kafka.relearn``): sent first at the next step that is not a replay, and
        again after a roll-back until a transaction that carries them commits (``committed``)."""
        self._owed.extend(outputs)

    def committed(self) -> None:
        """The open transaction committed (exactly-once): the owed predictions it carried are sent."""
        self._owed_open = []

    def step(self, now: int, *, force: bool = False) -> None:
        """Run what is due (``force``: flush partial batches and queued labels) and emit it."""
        if self._owed and not self.replaying:
            owed, self._owed = self._owed, []
            self._owed_open.extend(owed)
            for out in owed:
                if self.metrics is not None:
                    self.metrics.on_owed(out)
                self.output.emit(out)
        self.emit(self.processor.step(now, force=force))

    def emit(self, out: StepOutput | None) -> None:
        """Produce ``out`` (unless replaying) and count it."""
        if not out:
            return
        if self.metrics is not None:
            self.metrics.on_step(self.view, out, replay=self.replaying)
            if not self.replaying:
                self.metrics.on_dead_letters(out.dead_letters)
        if self.replaying:
            return
        if out.rows_predicted and log.isEnabledFor(logging.DEBUG):
            self._log_batch(out)
        self.output.emit(out)

    def _log_batch(self, out: StepOutput) -> None:
        ids = [key for key, _ in out.predictions]
        log.debug(
            "batch up to #%d: %d predictions (%s .. %s), %d rows learned",
            self.processor.batch_seq,
            len(ids),
            ids[0],
            ids[-1],
            out.rows_learned,
            extra={
                "event": "batch",
                "batch_seq": self.processor.batch_seq,
                "rows": out.rows_predicted,
                "first_id": ids[0],
                "last_id": ids[-1],
                "rows_learned": out.rows_learned,
                "seconds": round(out.batch_seconds, 6),
            },
        )
