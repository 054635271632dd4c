"""What the processor hands back, out to Kafka: predictions and dead letters produced (``kafka.output``),
counted in the metrics; or, while the input replayed is one a committed transaction already covered
(``replaying``), counted and dropped: it was emitted before.
"""

from __future__ import annotations

import logging

from iolstream.kafka.output import Output
from iolstream.stream.processor import StepOutput, StreamProcessor

log = logging.getLogger("iolstream.worker")


class Emitter:
    """Steps the processor and emits what a step or a message gives (``view``: what the metrics follow)."""

    def __init__(self, processor: StreamProcessor, output: Output, *, metrics=None, view=None):
        self.processor, self.output, self.metrics, self.view = processor, output, metrics, view
        self.replaying = False  # the processor holds replayed input (exactly-once: not emitted)

    def step(self, now: int, *, force: bool = False) -> None:
        """Run what is due (``force``: flush partial batches and queued labels) and emit it."""
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
