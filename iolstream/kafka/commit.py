"""The commit unit: how a poll cycle ends, and how the worker lets go of its partitions.

One object owns the order of step, group publish, produce, the transaction or the offset commit, the
snapshot and the roll-back (as Quix Streams' ``Checkpoint``). The worker calls it at four points:

- ``end_cycle`` after every poll cycle: 1. step what is due (exactly-once, after input: everything, so
  the cycle's transaction holds its outputs) 2. group learning: read the others' sums, publish this
  member's when due 3. commit the cycle (exactly-once: one transaction with the predictions, dead
  letters and input offsets; a lost one rolls back) 4. serve delivery callbacks 5. checkpoint when due;
- ``checkpoint``: 1. group learning: publish the sums with the offsets they cover 2. exactly-once:
  commit an open transaction 3. wait for deliveries and write the snapshot (``kafka.checkpoints``)
  4. at-least-once: commit the snapshot's offsets 5. the forget receipts the snapshot makes true
  (``kafka.receipts``; exactly-once: in a transaction of their own, committed at once);
- ``partitions_go`` (a revoke): every row consumed is learned first (group learning: the warm-up
  scaling agreed, the rows waiting for labels and the labels waiting for rows of the partitions that go
  handed over), then ``checkpoint``, waiting for deliveries up to the call timeout;
- ``finish`` (shutdown): the partial batch is flushed (exactly-once: in a last transaction), then as
  ``partitions_go`` for every partition; group learning: once its last record is committed, the member
  reads the others' records published before the stop, up to the call timeout, before the final snapshot.

At-least-once and exactly-once are the two strategies (``AtLeastOnce``, ``ExactlyOnce``): what closes a
cycle, what happens around a snapshot, what a lost producer means. ``roll_back`` (exactly-once) reloads
the newest snapshot into the same processor (``StreamProcessor.restore``: whoever holds it keeps it) and
seeks every assigned partition back; what the group committed since is replayed without emitting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from iolstream.kafka.assignment import Assignment
from iolstream.kafka.checkpoints import Checkpointer
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.emit import Emitter
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.offsets import OffsetBook, fmt
from iolstream.kafka.output import Output
from iolstream.kafka.receipts import Receipts
from iolstream.kafka.stopping import Stopping
from iolstream.kafka.transactions import Transactions
from iolstream.ops.faults import crash_point
from iolstream.stream.align import Aligner

log = logging.getLogger("iolstream.worker")


def now_ms() -> int:
    """Wall-clock milliseconds, the processor's clock."""
    return int(time.time() * 1000)


class CommitUnit:
    """The end of a cycle and of a hold on partitions (module docstring); a strategy fills in the hooks."""

    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        book: OffsetBook,
        emitter: Emitter,
        output: Output,
        checkpoints: Checkpointer,
        assignment: Assignment,
        aligner: Aligner,
        stopper: Stopping,
        group=None,
        waiting: Callable[[str, float], None] = lambda call, seconds: None,
        metrics=None,
    ):
        self.cfg = cfg
        self.book, self.emitter, self.output = book, emitter, output
        self.processor = emitter.processor
        self.checkpoints, self.assignment, self.aligner = checkpoints, assignment, aligner
        self.stopper, self.group, self.waiting, self.metrics = stopper, group, waiting, metrics
        self.receipts = Receipts(cfg, output)

    # ------------------------------------------------------------ the worker's four calls
    def end_cycle(self, now: int, *, processed: bool) -> None:
        """After a poll cycle (``processed``: it fed input): steps 1–5 of the module docstring."""
        self._step_cycle(now, processed)
        if self.emitter.replaying and not self.book.replay_until:  # replay over: what it holds is new input
            self.emitter.replaying = False
        if self.group is not None:
            self.group.poll()
            if not self.book.replay_until:  # mid-replay the sums are behind what this member published before
                self.group.publish(self.book.positions)
        self._commit_cycle()
        self.output.producer.poll(0)
        replaying = bool(self.book.replay_until)
        if self.checkpoints.due(self.processor, self.book.positions, replaying, self.exactly_once):
            self.checkpoint()

    def checkpoint(self, *, wait: float | None = None, final: bool = False) -> bool:
        """Publish, commit what is open, write the snapshot, commit its offsets; ``wait``: how long to wait
        for deliveries (None: a periodic checkpoint, postponed if they are not done); ``final``: the stop's
        (group learning: the others' records published before it are read first). Whether it was written."""
        if self.group is not None and not self.book.replay_until:  # the sums go with the offsets they cover
            self.group.publish(self.book.positions, force=True)
        self._before_snapshot()
        if final and self.group is not None:  # its own last record committed: the others' before the stop
            self.group.complete(
                self.stopper.timeout(self.cfg.kafka.call_timeout_seconds),
                tick=lambda: self.waiting("the model-deltas topic", 0.0),
            )
        written = self.checkpoints.write(
            self.processor,
            self.book.positions,
            self.output.producer,
            lambda: self.output.delivery_errors,
            wait=wait,
            group=self.group,
        )
        if written:
            self._after_snapshot()
            self._send_receipts(self.checkpoints.take_receipts())
        return written

    def receipts_after_load(self) -> None:
        """After a snapshot was loaded (start, roll-back): the forget receipts it names that must go out again
        (``Receipts.unsent``)."""
        receipts = self.checkpoints.take_receipts()
        if receipts:
            unsent = self.receipts.unsent(receipts, self.checkpoints.last_written_ms)
            self.processor.erasure.sent([r for r in receipts if r not in unsent])  # out before the restart
            self._send_receipts(unsent)

    def _send_receipts(self, receipts: list[dict]) -> None:
        if receipts:
            crash_point("before_receipts")  # test-only: the snapshot durable, its receipts not out
            self.receipts.send(receipts)
            self.processor.erasure.sent(receipts)
            self._receipts_out()

    def partitions_go(self, partitions=None, *, final: bool = False) -> bool:
        """A revoke of ``partitions`` ((topic, partition) keys; None: all), and the end of ``finish`` (``final``):
        learn every row consumed, hand over the rows waiting for labels and the labels waiting for rows of the
        partitions that go, checkpoint waiting up to the call timeout for deliveries. Whether the snapshot was
        written."""
        if self.group is not None:
            self.emitter.step(now_ms(), force=True)  # the batcher's rows: predicted, or held for the scaling
            self.group.settle(
                self.stopper.timeout(self.cfg.kafka.call_timeout_seconds),
                tick=lambda: self.waiting("the group's scaling", 0.0),
            )
            self.emitter.step(now_ms(), force=True)  # the held ones, once the scaling is agreed
            if not self.book.replay_until:  # partitions go: so do the rows waiting for their labels
                self.group.publish(self.book.positions, force=True)
                self.group.hand_over(partitions)
        return self.checkpoint(wait=self.stopper.timeout(self.cfg.kafka.call_timeout_seconds), final=final)

    def finish(self) -> bool:
        """Shutdown: flush the partial batch, then as ``partitions_go``; the forget receipts the final snapshot
        made true are delivered before the worker stops. False if the final snapshot failed."""
        self._flush_partial()
        ok = self.partitions_go(final=True)
        if self.receipts.sent and not self.exactly_once:  # (exactly-once: their transaction committed them)
            self.output.producer.flush(self.stopper.timeout(self.cfg.kafka.call_timeout_seconds))
        return ok

    def roll_back(self, why: str) -> None:
        """Reload the newest snapshot into the processor and seek every assigned partition to its positions;
        what the group committed is replayed without emitting."""
        self.output.delivery_errors = 0  # those of the aborted transaction
        if self.metrics is not None:
            self.metrics.transactions_aborted.inc()
        loaded = self.checkpoints.load()
        self.processor.restore(loaded.processor)
        if self.group is not None:
            self.group.reload(loaded.group)
        self.book.reset(loaded.positions)
        self.emitter.replaying = False
        self.assignment.resume(self.aligner.clear())  # queued messages are read again from the positions
        self.assignment.seek_back()
        self.receipts_after_load()
        log.info(
            "rolled back to offsets %s; replay without emitting until %s (%s)",
            fmt(self.book.positions) or "-",
            fmt(self.book.replay_until) or "-",
            why,
        )

    # ------------------------------------------------------------ the strategy's hooks
    exactly_once = False

    def _step_cycle(self, now: int, processed: bool) -> None:
        """Step what is due by the clock."""
        self.emitter.step(now)

    def _commit_cycle(self) -> None:
        """Close the cycle."""

    def _before_snapshot(self) -> None:
        """Right before the snapshot is written."""

    def _after_snapshot(self) -> None:
        """Once the snapshot is durable."""

    def _flush_partial(self) -> None:
        """Shutdown: the partial batch."""

    def _receipts_out(self) -> None:
        """Forget receipts were just produced."""

    def check_deliveries(self) -> None:
        """Between cycles: what failed deliveries mean."""

    def lost(self, why: str) -> None:
        """The producer or the consumer failed fatally and was replaced."""

    def close(self, timeout: float) -> None:
        """The worker stops."""


class AtLeastOnce(CommitUnit):
    """Offsets are committed only after a snapshot covering them is durable; a crash replays and emits
    again what came after the last snapshot."""

    def _after_snapshot(self) -> None:
        self.assignment.commit()

    def _flush_partial(self) -> None:
        if self.group is None:  # group learning steps in partitions_go
            self.emitter.step(now_ms(), force=True)

    def check_deliveries(self) -> None:
        """A failed delivery stops the worker: nothing is committed past it."""
        if self.output.delivery_errors:
            raise WorkerError(
                f"{self.output.delivery_errors} messages could not be delivered; not committing past them"
            )


class ExactlyOnce(CommitUnit):
    """Each poll cycle ends with a forced step and one transaction holding its predictions, dead letters and
    input offsets; a lost transaction rolls the model back to the snapshot (failed deliveries abort it)."""

    exactly_once = True

    def __init__(self, cfg: WorkerConfig, *, transactions: Transactions, **collaborators):
        super().__init__(cfg, **collaborators)
        self.txn = transactions

    def _step_cycle(self, now: int, processed: bool) -> None:
        self.emitter.step(now, force=processed)

    def _commit_cycle(self) -> None:
        """Commit the cycle's transaction with the input offsets; roll back if it was lost."""
        offsets = self.book.to_commit()
        member = self.cfg.member_id
        metadata = (lambda key: self.book.metadata(member, key)) if self.group is not None else None
        why = self.txn.commit(offsets, self.assignment.consumer.consumer_group_metadata, metadata)
        if why is None:
            self.book.committed(offsets)
        else:
            self.roll_back(why)

    def _before_snapshot(self) -> None:
        if self.txn.open:
            self._commit_cycle()

    def _flush_partial(self) -> None:
        self.emitter.step(now_ms(), force=True)
        self._commit_cycle()

    def _receipts_out(self) -> None:
        """The receipts' transaction commits now, with their requests' offsets: out as soon as the snapshot is
        durable (also at shutdown, after the last one)."""
        self._commit_cycle()

    def lost(self, why: str) -> None:
        """The open transaction belonged to the failed client: a new producer, and the model rolled back."""
        self.txn.replace(why)
        self.roll_back(why)

    def close(self, timeout: float) -> None:
        """Abort an open transaction and close the producer within ``timeout``."""
        self.txn.close(timeout)
