"""Checkpoints: when one is due, and writing the state and the input positions it covers to the snapshot store.

A checkpoint is due every ``snapshot.every_batches`` batches or ``snapshot.every_seconds``, and after a
(re)start soon (``snapshot.first_after_seconds``; exactly-once as soon as the replay is over), so that
a crash loop makes progress. Writing one: 1. wait for the producer's deliveries (a periodic checkpoint
``FLUSH_SECONDS``, then it is postponed, the loop going on; a final one up to the call timeout)
2. write the snapshot (the processor's state and the positions) atomically. Nothing is written if an
output could not be delivered. What a worker resumes with (the newest snapshot's processor, or a fresh one) is
``kafka.resume``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from iolstream.core import step_tuner
from iolstream.kafka import resume
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.clients import CALL_GRACE
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.offsets import drop_other_topics, fmt
from iolstream.kafka.resume import Loaded
from iolstream.kafka.snapshots import SnapshotError, SnapshotStore
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.scaler_warmup import ScalingAgreement

log = logging.getLogger("iolstream.worker")

FLUSH_SECONDS = 1.0  # a periodic checkpoint waits this long for deliveries, then tries again later


@dataclass
class Checkpoint:
    """Bookkeeping of the last durable checkpoint."""

    batches_at: int = 0
    time: float = field(default_factory=time.monotonic)
    offsets: dict = field(default_factory=dict)
    snapshot_seconds: float = 0.0
    snapshot_bytes: int = 0
    written_at: float = 0.0


class Checkpointer:
    """The snapshot store seen from the worker: loads the newest snapshot, says when the next one is due,
    writes one. ``agreement``: group learning's scaling agreement, given to every processor it makes."""

    def __init__(
        self,
        cfg: WorkerConfig,
        calls: ClientCalls,
        *,
        metrics=None,
        agreement: ScalingAgreement | None = None,
    ):
        self.cfg = cfg
        self.agreement = agreement
        self.calls = calls
        self.metrics = metrics
        self.store = SnapshotStore(cfg.snapshot_dir, cfg.snapshot.keep)
        self.last = Checkpoint()
        self.first_due: float | None = (
            None  # after a start: the early checkpoint (snapshot.first_after_seconds)
        )
        # forget receipts whose snapshot is durable, to be produced (``take_receipts``): after a write, or the
        # ones the snapshot just loaded names (a restart may send them again)
        self.receipts: list[dict] = []
        self.last_written_ms = 0  # when the snapshot loaded or written last was written (its manifest's time)
        self.topic_ids: dict[str, str] = {}  # {topic: id} of the topics read (written with their positions)

    def take_receipts(self) -> list[dict]:
        """The forget receipts to produce now (then no longer held here)."""
        receipts, self.receipts = self.receipts, []
        return receipts

    def started(self) -> None:
        """The loop begins: the first checkpoint is due ``snapshot.first_after_seconds`` from now."""
        first = self.cfg.snapshot.first_after_seconds
        self.first_due = None if first is None else time.monotonic() + first

    def load(self) -> Loaded:
        """The newest valid snapshot's processor, positions and group state (a fresh processor and none if
        there is none, ``resume``), and this checkpointer's bookkeeping from it."""
        try:
            snap = self.store.load_latest()
        except SnapshotError as exc:  # another format version: never skipped silently
            raise WorkerError(f"cannot load the snapshots in {self.store.dir}: {exc}") from None
        if snap is None:
            log.info("no snapshot in %s: starting a fresh model", self.store.dir)
            self.last = Checkpoint()
            loaded = resume.fresh(self.cfg, self.agreement)
        else:
            loaded = resume.restored(self.cfg, snap, self.agreement)
            self.last = Checkpoint(
                loaded.processor.counters["batches"],
                time.monotonic(),
                dict(loaded.positions),
                snapshot_bytes=snap.size_bytes,
                written_at=snap.manifest.get("written_at_ms", 0)
                / 1000.0,  # the snapshot's age counts from its write
            )
            self.last_written_ms = int(snap.manifest.get("written_at_ms", 0))
            self.receipts = loaded.processor.erasure.due()
            if self.receipts:  # it is the first without those rows: the older ones hold them
                self._delete_older(snap.path.name)
        step_tuner.configure_for_model(loaded.processor.model)  # BLAS threads (docs/operations.md)
        if self.topic_ids:  # a roll-back: the topics' ids are known by now
            self.forget_other_topics(loaded.positions, loaded.topic_ids)
        return loaded

    def forget_other_topics(self, positions: dict, saved: dict[str, str]) -> None:
        """Never carry offsets across topics: drop the ``positions`` of a topic that has another id now than the
        snapshot ``saved`` (deleted and created again under its name), which is then read from its beginning; the
        model keeps what it learned."""
        for topic in drop_other_topics(positions, saved, self.topic_ids):
            log.warning(
                "topic %s is not the one the snapshot read (topic id %s, now %s: deleted and created again?): its "
                "offsets do not apply, it is read from its beginning; the model keeps what it learned",
                topic,
                saved[topic],
                self.topic_ids[topic],
                extra={"event": "other_topic"},
            )

    def _delete_older(self, name: str) -> None:
        """Snapshots older than ``name`` hold rows forgotten since: deleted (docs/design.md §13)."""
        gone = self.store.delete_older(name)
        if gone:
            log.info(
                "deleted %d older snapshot(s) that held forgotten rows: %s",
                len(gone),
                ", ".join(gone),
                extra={"event": "snapshots_deleted", "snapshot": name},
            )

    def due(self, processor: StreamProcessor, positions: dict, *, soon: Callable[[float], bool]) -> bool:
        """Whether a checkpoint is due: every ``snapshot.every_batches`` or ``every_seconds`` (if input moved, or
        forget receipts or refusals wait for a snapshot), or soon after a
        start, when ``soon(first_due)`` says it may be written (the delivery mode's rule, ``kafka.commit``;
        ``first_due``: ``snapshot.first_after_seconds`` after the start, monotonic)."""
        cp, snap = self.last, self.cfg.snapshot
        batches = processor.counters["batches"] - cp.batches_at
        # removals and refusals decided on reading the group's log (no input moved) wait for a snapshot too
        if positions == cp.offsets and batches == 0 and not processor.erasure.waiting:
            return False
        if batches >= snap.every_batches or time.monotonic() - cp.time >= snap.every_seconds:
            return True
        return self.first_due is not None and soon(self.first_due)

    def write(
        self,
        processor: StreamProcessor,
        positions: dict,
        producer,
        delivery_errors: Callable[[], int],
        *,
        wait: float | None = None,
        group_state: Callable[[], tuple[dict, dict] | None] = lambda: None,
    ) -> bool:
        """Steps 1 and 2 (module docstring); ``wait``: how long to wait for deliveries (None: FLUSH_SECONDS,
        postponing if they are not done); ``group_state()``: group learning's state (manifest, arrays) that goes
        into the snapshot (None: none). Returns whether the snapshot was written."""
        final = wait is not None
        wait = FLUSH_SECONDS if wait is None else wait
        try:
            remaining = self.calls.call(
                "producer.flush", lambda: producer.flush(wait), wait, grace=CALL_GRACE
            )
        except CallTimedOut as exc:
            log.error("checkpoint skipped, nothing committed: %s", exc)
            return False
        if delivery_errors() or (remaining and final):
            log.error(
                "checkpoint skipped, nothing committed: %d messages undelivered, %d delivery errors",
                remaining,
                delivery_errors(),
            )
            return False
        if remaining:
            log.warning(
                "checkpoint postponed: %d messages not delivered yet", remaining, extra={"event": "postponed"}
            )
            return False
        name = self.store.next_name()
        erasure = processor.erasure
        erasure.seal(name)  # rows forgotten so far: this snapshot is the first without them
        erasure.flush()  # the retention store's records this snapshot covers, on disk first
        manifest, arrays = processor.to_state()
        manifest["offsets"] = [[t, p, o] for (t, p), o in sorted(positions.items())]
        manifest["worker"] = {
            "exactly_once": self.cfg.durability.exactly_once,
            "group_id": self.cfg.kafka.group_id,
            # a topic deleted and created again under its name gets another id: its positions then mean nothing
            "topic_ids": {
                t: i for t, i in sorted(self.topic_ids.items()) if any(t == k[0] for k in positions)
            },
        }
        if (group := group_state()) is not None:
            manifest["group"], group_arrays = group
            arrays.update(group_arrays)
        try:
            snap = self.store.write(manifest, arrays)
        except OSError as exc:
            raise WorkerError(f"cannot write a snapshot to {self.store.dir}: {exc}") from None
        state = manifest["stream"]["erasure"]
        self.last_written_ms = int(snap.manifest["written_at_ms"])
        self.receipts = erasure.durable(
            snap.path.name, state, int(time.time() * 1000)
        )  # every receipt not out
        if self.receipts or state.get("retention", {}).get("erased"):
            self._delete_older(snap.path.name)
        self.last = Checkpoint(
            processor.counters["batches"],
            time.monotonic(),
            dict(positions),
            snap.seconds,
            snap.size_bytes,
            time.time(),
        )
        self.first_due = None
        if self.metrics is not None:
            self.metrics.on_snapshot(snap)
        log.info(
            "snapshot %s: %.1f MB in %.3f s, offsets %s",
            snap.path.name,
            snap.size_bytes / 1e6,
            snap.seconds,
            fmt(positions),
            extra={"event": "snapshot", "bytes": snap.size_bytes, "seconds": round(snap.seconds, 4)},
        )
        if snap.seconds * 1000 > int(self.cfg.kafka.consumer.get("max.poll.interval.ms", 300_000)) / 4:
            log.warning("the snapshot took %.1f s, over a quarter of max.poll.interval.ms", snap.seconds)
        return True
