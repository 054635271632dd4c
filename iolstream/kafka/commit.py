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

At-least-once and exactly-once are the two strategies (``AtLeastOnce``, ``ExactlyOnce``), chosen once
(``delivery_mode``); the others ask the strategy rather than the config: how to produce (``make_output``:
``output.Output``, or ``transactions.TransactionalOutput``), whether input the group committed is replayed
without emitting (``replays_committed``: the offset book), when the first checkpoint after a start is due,
what closes a cycle, what happens around a snapshot, what a failed producer means. ``roll_back``
(exactly-once) loads the newest snapshot into the session (``kafka.session``: a new processor, its positions,
no replay) and seeks every assigned partition back; what the group committed since is replayed without
emitting. Group learning takes part through its hooks (``kafka.participant``; a single worker's do nothing).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from iolstream.kafka.assignment import Assignment
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.checkpoints import Checkpointer
from iolstream.kafka.clients import CALL_GRACE
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.offsets import fmt
from iolstream.kafka.output import Output
from iolstream.kafka.participant import Solo
from iolstream.kafka.receipts import Receipts
from iolstream.kafka.session import Session
from iolstream.kafka.stopping import Stopping
from iolstream.kafka.transactions import FENCED, TransactionalOutput, Transactions, fatal_message
from iolstream.ops.faults import crash_point
from iolstream.stream.align import Aligner

log = logging.getLogger("iolstream.worker")


def now_ms() -> int:
    """Wall-clock milliseconds, the processor's clock."""
    return int(time.time() * 1000)


DELIVERY_SLICE = 0.5  # at a revoke or the stop, the outputs are waited for in flushes this long (seconds)


class CommitUnit:
    """The end of a cycle and of a hold on partitions (module docstring); a strategy fills in the hooks."""

    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        session: Session,
        output: Output,
        checkpoints: Checkpointer,
        assignment: Assignment,
        aligner: Aligner,
        stopper: Stopping,
        group: Solo,
        waiting: Callable[[str, float], None] = lambda call, seconds: None,
        metrics=None,
        calls: ClientCalls | None = None,
        new_producer: Callable | None = None,
        sleep: Callable[[float], None] = time.sleep,
        reachable: Callable[[], bool] = lambda: True,
    ):
        """``calls`` (blocking client calls), ``new_producer()`` and ``sleep(seconds)`` (a wait, the loop
        ticking): what the exactly-once strategy's transactions need (``kafka.transactions``); ``new_producer()``
        and ``reachable()`` (whether the broker answers): what at-least-once needs to replace a stalled
        producer (``kafka.stalled_output``)."""
        self.cfg = cfg
        self.session, self.book, self.output = session, session.book, output
        self.checkpoints, self.assignment, self.aligner = checkpoints, assignment, aligner
        self.stopper, self.group, self.waiting, self.metrics = stopper, group, waiting, metrics
        self.calls, self.new_producer, self.sleep, self.reachable = calls, new_producer, sleep, reachable
        self.receipts = Receipts(cfg, output)

    # ------------------------------------------------------------ what the others ask
    replays_committed = False  # input the group committed is replayed without emitting (offsets.OffsetBook)

    @classmethod
    def make_output(cls, cfg: WorkerConfig, **kw) -> Output:
        """The output this mode produces through."""
        return Output(cfg, **kw)

    # ------------------------------------------------------------ the worker's four calls
    def end_cycle(self, now: int, *, processed: bool) -> None:
        """After a poll cycle (``processed``: it fed input): steps 1–5 of the module docstring."""
        self._step_cycle(now, processed)
        self.session.cycle_ended()
        self.group.on_cycle(self.book.positions, replaying=bool(self.book.replay_until))
        self._commit_cycle()
        self.output.producer.poll(0)
        if self.checkpoints.due(self.session.processor, self.book.positions, soon=self._soon_after_start):
            self.checkpoint()

    def checkpoint(self, *, wait: float | None = None, final: bool = False) -> bool:
        """Publish, commit what is open, write the snapshot, commit its offsets; ``wait``: how long to wait
        for deliveries (None: a periodic checkpoint, postponed if they are not done); ``final``: the stop's
        (group learning: the others' records published before it are read first). Whether it was written."""
        self.group.before_checkpoint(self.book.positions, replaying=bool(self.book.replay_until))
        self._before_snapshot()
        if (
            final
        ):  # its last records committed; group learning: the others' published before the stop are read
            self.group.at_stop(
                self.stopper.timeout(self.cfg.kafka.call_timeout_seconds),
                tick=lambda: self.waiting("the model-deltas topic", 0.0),
            )
        written = self.checkpoints.write(
            self.session.processor,
            self.book.positions,
            self.output.producer,
            lambda: self.output.delivery_errors,
            wait=wait,
            group_state=self.group.to_state,
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
            out_before = [r for r in receipts if r not in unsent]  # by the process before the restart
            self.session.processor.erasure.sent(out_before, here=False)
            self._send_receipts(unsent)

    def _send_receipts(self, receipts: list[dict]) -> None:
        if receipts:
            crash_point("before_receipts")  # test-only: the snapshot durable, its receipts not out
            self.receipts.send(receipts)
            self.session.processor.erasure.sent(receipts)
            self._receipts_out()

    def partitions_go(self, partitions=None, *, final: bool = False) -> bool:
        """A revoke of ``partitions`` ((topic, partition) keys; None: all), and the end of ``finish`` (``final``):
        learn every row consumed, hand over the rows waiting for labels and the labels waiting for rows of the
        partitions that go, checkpoint waiting up to the call timeout for deliveries. Whether the snapshot was
        written."""
        self.group.on_revoke(
            partitions,
            self.book.positions,
            replaying=bool(self.book.replay_until),
            step=lambda: self.session.step(now_ms(), force=True),
            timeout=self.stopper.timeout(self.cfg.kafka.call_timeout_seconds),
            tick=lambda: self.waiting("the group's scaling", 0.0),
        )
        return self.checkpoint(wait=self.stopper.timeout(self.cfg.kafka.call_timeout_seconds), final=final)

    def finish(self) -> bool:
        """Shutdown: flush the partial batch, then as ``partitions_go``; the forget receipts the final snapshot
        made true are delivered before the worker stops. False if the final snapshot failed."""
        self._flush_partial()
        ok = self.partitions_go(final=True)
        self._receipts_at_stop()
        return ok

    def roll_back(self, why: str) -> None:
        """Load the newest snapshot into the session and seek every assigned partition to its positions; what
        the group committed is replayed without emitting."""
        self.output.delivery_errors = 0  # those of the aborted transaction
        if self.metrics is not None:
            self.metrics.transactions_aborted.inc()
        loaded = self.checkpoints.load()
        self.session.roll_back(loaded.processor, loaded.positions)
        self.group.attach(loaded.processor, loaded.group)
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
    def _soon_after_start(self, first_due: float) -> bool:
        """Whether the first checkpoint after a (re)start, due soon so that a crash loop makes progress instead
        of replaying from further back, may be written now (``first_due``: monotonic time, after
        ``snapshot.first_after_seconds``)."""
        return not self.book.replay_until and time.monotonic() >= first_due

    def _step_cycle(self, now: int, processed: bool) -> None:
        """Step what is due by the clock."""
        self.session.step(now)

    def _commit_cycle(self) -> None:
        """Close the cycle."""

    def _before_snapshot(self) -> None:
        """Right before the snapshot is written."""

    def _after_snapshot(self) -> None:
        """Once the snapshot is durable."""

    def _flush_partial(self) -> None:
        """Shutdown: the partial batch."""
        self.session.step(now_ms(), force=True)

    def _receipts_out(self) -> None:
        """Forget receipts were just produced."""

    def _receipts_at_stop(self) -> None:
        """After the final snapshot: its forget receipts out before the worker stops."""

    def check_deliveries(self) -> None:
        """Between cycles: what failed deliveries mean."""

    def producer_failed(self, err: KafkaError) -> None:
        """The producer reported a fatal error (librdkafka's error callback)."""
        raise WorkerError(fatal_message(err, self.cfg.transactional_id))

    def lost(self, why: str) -> None:
        """The producer or the consumer failed fatally and was replaced."""

    def close(self, timeout: float) -> None:
        """The worker stops."""


class AtLeastOnce(CommitUnit):
    """Offsets are committed only after a snapshot covering them is durable; a crash replays and emits
    again what came after the last snapshot."""

    def _after_snapshot(self) -> None:
        self.assignment.commit()

    def _receipts_at_stop(self) -> None:
        if (
            self.receipts.sent
        ):  # delivered before the worker stops (exactly-once: their transaction committed)
            self.output.producer.flush(self.stopper.timeout(self.cfg.kafka.call_timeout_seconds))

    def check_deliveries(self) -> None:
        """A failed delivery stops the worker: nothing is committed past it. A producer that stopped delivering
        while the broker answers has its outputs sent again through a new one (``kafka.stalled_output``)."""
        if self.output.delivery_errors:
            raise WorkerError(
                f"{self.output.delivery_errors} messages could not be delivered; not committing past them"
            )
        self._resend_if_stalled()

    def checkpoint(self, *, wait: float | None = None, final: bool = False) -> bool:
        if wait is not None and self.output.stall.suspect:
            # a revoke's or the stop's, the producer suspected of stalling: the outputs waited for first (and
            # sent again through a new producer if it did)
            wait = max(0.0, wait - self._deliver(wait))
        return super().checkpoint(wait=wait, final=final)

    def _deliver(self, wait: float) -> float:
        """Wait up to ``wait`` seconds for the outputs to be delivered, in short flushes, between which a stalled
        producer's outputs are sent again (the checkpoint's own flush then finds what is left); the seconds it
        took."""
        started = time.monotonic()
        while (remaining := started + wait - time.monotonic()) > 0:
            flush = functools.partial(self.output.producer.flush, min(DELIVERY_SLICE, remaining))
            try:
                left = (
                    flush()
                    if self.calls is None
                    else self.calls.call("producer.flush", flush, flush.args[0], grace=CALL_GRACE)
                )
            except CallTimedOut:
                break
            if not left:
                break
            self._resend_if_stalled()
            self.waiting("the outputs' delivery", time.monotonic() - started)
        return time.monotonic() - started

    def _resend_if_stalled(self) -> None:
        if self.new_producer is not None and self.output.stalled(self.reachable(), time.monotonic()):
            self.output.resend_stalled(self.new_producer)


class ExactlyOnce(CommitUnit):
    """Each poll cycle ends with a forced step and one transaction holding its predictions, dead letters and
    input offsets; a lost transaction rolls the model back to the snapshot (failed deliveries abort it)."""

    replays_committed = True  # commits run ahead of the snapshots: on restart, the input between is replayed

    def __init__(self, cfg: WorkerConfig, **collaborators):
        super().__init__(cfg, **collaborators)
        self.txn = Transactions(
            cfg,
            self.output,
            self.calls,
            self.new_producer,
            metrics=self.metrics,
            sleep=self.sleep,
            deadline=lambda: self.stopper.deadline,
        )

    @classmethod
    def make_output(cls, cfg: WorkerConfig, **kw) -> Output:
        return TransactionalOutput(cfg, **kw)

    def _soon_after_start(self, first_due: float) -> bool:
        return not self.book.replay_until  # as soon as the replay is over

    def _step_cycle(self, now: int, processed: bool) -> None:
        self.session.step(now, force=processed)

    def _commit_cycle(self) -> None:
        """Commit the cycle's transaction with the input offsets; roll back if it was lost."""
        offsets = self.book.to_commit()
        assignment = self.assignment
        metadata = assignment.commit_metadata
        if metadata is not None and not self.session.processor.model.ready:
            # group learning: every row read so far waits for the group's scaling, none predicted; should this
            # member die, a restart that re-learns them owes their predictions (kafka.relearn)
            metadata = functools.partial(metadata, held=True)
        why = self.txn.commit(offsets, assignment.consumer.consumer_group_metadata, metadata)
        if why is None:
            self.book.committed(offsets)
            self.session.committed()
        else:
            self.roll_back(why)

    def _before_snapshot(self) -> None:
        if self.txn.open:
            self._commit_cycle()

    def _flush_partial(self) -> None:
        super()._flush_partial()
        self._commit_cycle()

    def producer_failed(self, err: KafkaError) -> None:
        """Fenced by another worker with our transactional.id: fatal; otherwise the transactional producer is
        replaced and the model rolled back (``lost``)."""
        if err.code() in FENCED:
            super().producer_failed(err)
        log.warning(
            "the transactional producer failed fatally (%s): replacing it and rolling the model back",
            err.str(),
        )
        self.lost(err.str())

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


def delivery_mode(cfg: WorkerConfig) -> type[CommitUnit]:
    """The commit strategy of ``durability.exactly_once``: where the worker reads the delivery mode, once."""
    return ExactlyOnce if cfg.durability.exactly_once else AtLeastOnce
