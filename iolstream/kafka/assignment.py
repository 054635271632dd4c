"""The consumer's side of the worker: which partitions it holds, where each resumes, and the consumer
calls (committed offsets, end offsets, commits) that must know whether they run inside a rebalance
callback.

An assignment seeks every partition to the state's position (``offsets.OffsetBook``), never to the
group's offset, which may be ahead of the state (exactly-once, or after a damaged snapshot was skipped);
a revoke checkpoints first (``before_revoke``) and drops the partitions' queued messages, which are read
again from the positions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.clients import CALL_GRACE
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.offsets import OffsetBook, commit_partitions, fmt, parse_metadata
from iolstream.ops.faults import crash_point, fault_point
from iolstream.stream.align import Aligner

log = logging.getLogger("iolstream.worker")

# a worker whose newest input is older than BEHIND_MS, or whose features partitions hold more than
# BEHIND_BATCHES batches of rows not yet consumed, is catching up: its step tuner may then use both cores
# (throughput); otherwise it keeps up with a live stream (latency). 32 batches is far above a live
# stream's lag; a switch on a cycle's worth flipped on every burst and doubled the p99 latency.
BEHIND_MS = 1000
BEHIND_BATCHES = 32


class Assignment:
    """``consumer`` is set by the worker once made (and again when it is replaced); ``before_revoke(keys)``
    checkpoints; ``after_assign()`` follows every assignment (group learning: handed-over labels find their
    member); ``stopping()`` says a stop is under way (no checkpoint then: the shutdown writes the last one)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        book: OffsetBook,
        aligner: Aligner,
        calls: ClientCalls,
        *,
        before_revoke: Callable[[list], object],
        stopping: Callable[[], bool],
        after_assign: Callable[[], object] = lambda: None,
    ):
        self.cfg = cfg
        self.book = book
        self.aligner = aligner
        self.calls = calls
        self.before_revoke = before_revoke
        self.after_assign = after_assign
        self.stopping = stopping
        self.call_timeout = cfg.kafka.call_timeout_seconds
        self.consumer = None
        self.cooperative = False  # partition.assignment.strategy cooperative-sticky: incremental (un)assign
        self.in_rebalance = False  # inside on_assign / on_revoke / on_lost (see consumer_call)
        # group learning: commits carry this member's id as metadata, so that an assignment tells another
        # member's committed offset (its sums hold the input below it) from this member's own
        self.member = member = cfg.member_id if cfg.group.enabled else None
        # (topic, partition), held -> the metadata of this member's commit of it (``offsets.commit_metadata``);
        # None without group learning
        self.commit_metadata = (
            None if member is None else (lambda key, held=False: book.metadata(member, key, held))
        )
        self.committed_by: dict[tuple[str, int], str] = {}
        self.revokes = 0  # partitions revoked or lost so far (the loop drops what it released of them)

    def consumer_call(self, name: str, fn, timeout: float | None = None):
        """A blocking consumer call: on the helper thread with a deadline (``calls``), except inside a rebalance
        callback, where the consumer answers only its own thread (a committed() from the helper thread waited
        for the callback to end, for ever): there it runs directly, bounded by its own timeout and the watchdog."""
        if self.in_rebalance:
            return self.calls.direct(name, fn)
        return self.calls.call(name, fn, self.call_timeout if timeout is None else timeout, grace=CALL_GRACE)

    def committed(self, keys) -> dict[tuple[str, int], int]:
        """The group's committed offsets of ``keys`` (partitions without one are left out)."""
        if not keys:
            return {}
        tps = [TopicPartition(t, p) for t, p in keys]
        for attempt in range(5):
            try:
                got = self.consumer_call(
                    "consumer.committed", lambda: self.consumer.committed(tps, timeout=self.call_timeout)
                )
                self.committed_by.update(
                    {(tp.topic, tp.partition): tp.metadata or "" for tp in got if tp.offset >= 0}
                )
                return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}
            except CallTimedOut as exc:
                raise WorkerError(f"cannot read the group's committed offsets: {exc}") from None
            except KafkaException as exc:  # e.g. the group coordinator is still loading
                if not exc.args[0].retriable() or attempt == 4:
                    raise
                time.sleep(0.5)
        return {}  # not reached

    def end_offset(self, key: tuple[str, int]) -> int | None:
        """The partition's end (high watermark) now, from the broker; None if it cannot be had in time."""
        tp = TopicPartition(key[0], key[1])
        try:
            return self.consumer_call(
                "consumer.get_watermark_offsets",
                lambda: self.consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)[1],
                5.0,
            )
        except (KafkaException, CallTimedOut) as exc:
            log.warning("%s[%d]: cannot read its end offset: %s", key[0], key[1], exc)
            return None

    def _rebalance(self, handler, consumer, partitions) -> None:
        self.in_rebalance = True
        try:
            handler(consumer, partitions)
        finally:
            self.in_rebalance = False

    def on_assign(self, consumer, partitions) -> None:
        self._rebalance(self._assign, consumer, partitions)

    def on_revoke(self, consumer, partitions) -> None:
        self._rebalance(self._revoke, consumer, partitions)

    def on_lost(self, consumer, partitions) -> None:
        self._rebalance(self._lost, consumer, partitions)

    def _assign(self, consumer, partitions) -> None:
        """Seek every assigned partition to the state's position (never to the group's offset, which may be
        ahead of the state in exactly-once mode or after a damaged snapshot was skipped)."""
        if (
            self.consumer is None
        ):  # an assignment delivered while the worker closes its consumer: nothing to read
            log.info("assigned while closing: %d partitions left alone", len(partitions))
            (consumer.incremental_assign if self.cooperative else consumer.assign)(partitions)
            return
        committed = self.committed([(tp.topic, tp.partition) for tp in partitions])
        for tp in partitions:
            key = (tp.topic, tp.partition)
            end = self.end_offset(key)
            if (past := self.book.past_end(key, end)) is not None:
                log.warning(
                    "%s[%d]: the snapshot's position %d is past the partition's end %d: offsets of another topic "
                    "of that name (deleted and created again?); reading it from its beginning",
                    key[0],
                    key[1],
                    past,
                    end,
                    extra={"event": "other_topic"},
                )
            tp.offset = self._place(key, committed.get(key), end)
            self.aligner.assign(
                key, priority=0 if tp.topic == self.cfg.topics.features else 1
            )  # ties: features first
        (consumer.incremental_assign if self.cooperative else consumer.assign)(partitions)
        replay = fmt(self.book.replay_until)
        log.info(
            "assigned %s%s",
            fmt({(p.topic, p.partition): p.offset for p in partitions}),
            f"; replay without emitting until {replay}" if replay else "",
            extra={"event": "assigned"},
        )
        self.after_assign()

    def _place(self, key: tuple[str, int], committed: int | None, end: int | None) -> int:
        """``key`` booked as assigned (the group having committed ``committed``; ``end``: its end when assigned),
        at an assignment and again after a roll-back; the offset to read it from: the state's position, else
        its beginning."""
        self.book.assign(key, committed, end, by_other=self.by_other(key), base=self.base(key))
        start = self.book.start(key)
        return OFFSET_BEGINNING if start is None else start

    def by_other(self, key: tuple[str, int]) -> bool:
        """Group learning: the group's offset of ``key`` was committed by another member (read by ``committed``)."""
        by = parse_metadata(self.committed_by.get(key))[0]
        return self.member is not None and by not in ("", self.member)

    def base(self, key: tuple[str, int]) -> int | None:
        """Group learning: where this member's own commit of ``key`` says it took the partition over (or None)."""
        return None if self.by_other(key) else parse_metadata(self.committed_by.get(key))[1]

    def _revoke(self, consumer, partitions) -> None:
        """Partitions taken away: checkpoint first (at-least-once commits their offsets, exactly-once committed
        them with the last transaction); the positions stay in the state."""
        log.info(
            "partitions revoked: %s", [(p.topic, p.partition) for p in partitions], extra={"event": "revoked"}
        )
        if not self.stopping():
            self.before_revoke([(tp.topic, tp.partition) for tp in partitions])
        self.forget([(tp.topic, tp.partition) for tp in partitions])
        consumer.incremental_unassign(partitions) if self.cooperative else consumer.unassign()

    def _lost(self, consumer, partitions) -> None:
        """Partitions lost (this member was expelled from the group): nothing may be committed for them."""
        log.warning(
            "partitions lost: %s", [(p.topic, p.partition) for p in partitions], extra={"event": "lost"}
        )
        self.forget([(tp.topic, tp.partition) for tp in partitions])
        consumer.incremental_unassign(partitions) if self.cooperative else consumer.unassign()

    def forget(self, keys) -> None:
        """Partitions going away: their queued messages are dropped (not processed, so not covered by the
        positions, from which they are read again) and paused ones resumed (librdkafka keeps a partition
        paused across a reassignment)."""
        self.revokes += 1
        self.resume(self.aligner.revoke(keys))
        for key in keys:
            self.book.forget(key)

    def resume(self, keys) -> None:
        if keys and self.consumer is not None:
            self.consumer.resume([TopicPartition(t, p) for t, p in keys])

    def catching_up(self, newest, rows_per_message: float) -> bool:
        """Whether the worker is behind its input: the newest message consumed is older than BEHIND_MS, or the
        features partitions hold more than BEHIND_BATCHES batches of rows (from the last fetches' watermarks)."""
        kind, ts = newest.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE and time.time() * 1000 - ts > BEHIND_MS:
            return True
        features = self.cfg.topics.features
        messages = sum(lag for key in self.book.assigned if key[0] == features and (lag := self.lag(key)))
        return messages * rows_per_message > BEHIND_BATCHES * self.cfg.stream.batch_rows

    def lag(self, key: tuple[str, int]) -> int | None:
        """Messages of ``key`` in the broker not yet consumed, from the high watermark of the last fetch, or before
        the first fetch from the end read at assignment (None: not known). The consumer's position steps over
        transaction markers; the last offset + 1 does not."""
        tp = TopicPartition(key[0], key[1])
        try:
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            position = self.consumer.position([tp])[0].offset
        except KafkaException:
            return None
        if high < 0 and (high := self.book.ends.get(key, -1)) < 0:
            return None
        if position < 0:  # nothing returned since the assignment: at the state's position
            position = self.book.positions.get(key, max(low, 0))
        return high - position

    def at_end(self) -> bool:
        for key in self.book.assigned - set(self.book.ends):  # an end that could not be read at assignment
            if (end := self.end_offset(key)) is not None:
                self.book.ends[key] = end
        return self.book.at_end(
            lambda key: key in self.aligner.partitions and bool(self.aligner.partitions[key].queue)
        )

    def seek_back(self) -> None:
        """After a roll-back (the book holds the snapshot's positions): every assigned partition sought to its
        position again, the group's committed offsets read anew (what they cover is replayed without emitting)."""
        assigned = sorted(self.book.assigned)
        committed = self.committed(assigned)
        for key in assigned:
            offset = self._place(key, committed.get(key), self.book.ends.get(key))
            try:
                self.consumer.seek(TopicPartition(key[0], key[1], offset))
            except KafkaException as exc:  # e.g. lost in a rebalance meanwhile: its next assignment seeks it
                log.warning("%s[%d]: cannot seek it back: %s", key[0], key[1], exc)

    def commit(self) -> None:
        """At-least-once: commit the positions (the snapshot just written covers them, and never more); a
        failure is logged, and the next checkpoint commits again."""
        if not (offsets := self.book.to_commit()):
            return
        crash_point("before_commit")
        tps = commit_partitions(offsets, self.commit_metadata)
        try:
            if self.calls.faults and fault_point("fail_commit"):  # test-only: a failing commit
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "test: simulated commit failure"))
            result = (
                self.consumer_call(
                    "consumer.commit", lambda: self.consumer.commit(offsets=tps, asynchronous=False)
                )
                or []
            )
            if failed := [tp for tp in result if tp.error is not None]:
                raise KafkaException(failed[0].error)
        except (KafkaException, CallTimedOut) as exc:
            log.warning(
                "offset commit failed (the snapshot covers them; the next checkpoint commits again): %s", exc
            )
            return
        self.book.committed(offsets)
