"""The producing side of the worker: predictions and dead letters out, delivery failures counted.

Dead letters are sized before they are produced: one larger than the dead-letter limit (the smaller of
the producer's ``message.max.bytes`` and the dead-letter topic's ``max.message.bytes``, read at start,
``deadletters.DeadLetterLimit``) goes as an excerpt; one the broker refuses anyway is counted in
``iolstream_dead_letters_dropped_total``, logged once per reason and skipped (exactly-once: its
transaction aborts and the replay cuts it to the new limit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from iolstream.kafka import deadletters, stalled_output
from iolstream.kafka.clients import client_conf
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import AccessDenied, WorkerError
from iolstream.kafka.message_limits import compresses
from iolstream.kafka.stalled_output import StallWatch
from iolstream.ops.faults import crash_point
from iolstream.stream.processor import DeadLetter, StepOutput

log = logging.getLogger("iolstream.worker")


def key_text(key: bytes) -> str:
    """A message key as text that round-trips to its exact bytes (``key_bytes``) through a snapshot's JSON: one
    character per byte (Latin-1), whatever the bytes."""
    return key.decode("latin-1")


def key_bytes(text: str) -> bytes:
    """The key ``key_text`` made text.

    >>> key_bytes(key_text("row-7 é".encode())) == "row-7 é".encode()
    True
    """
    return text.encode("latin-1")


class Output:
    """Produces through ``producer`` (at-least-once; ``transactions.TransactionalOutput``, exactly-once).
    ``waiting(what, seconds)`` ticks the loop while the local queue is full."""

    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        metrics=None,
        waiting: Callable[[str, float], None] = lambda *_: None,
    ):
        self.cfg = cfg
        self.metrics = metrics
        self.waiting = waiting
        self.producer = None
        self.delivery_errors = 0
        # a producer that stopped delivering to a partition (kafka.stalled_output): the messages given to the
        # current producer (with len(producer): how many it delivered), how many were taken back from a stalled
        # one and sent again, and while one is purged, what its delivery reports hand back
        self.stall = StallWatch()
        self.produced = self.resent = 0
        self._taking: list | None = None
        self.refusals = None  # reported_refusals.Refusals: a refused write is fatal, named once
        # the largest dead letter produced as it is (larger ones go as excerpts); the topic's limit is read at
        # start
        self.dead_letter_limit = deadletters.DeadLetterLimit(
            deadletters.producer_bytes(cfg.kafka.producer),
            cfg.topics.dead_letters,
            compressed=compresses(cfg.kafka.producer),
        )
        self.reasons = deadletters.ReasonLog(cfg.topics.dead_letters)  # each reason logged once a minute

    def read_limits(self) -> None:
        """At start: the dead-letter topic's max.message.bytes (and the predictions topic's) against the
        producer's limits (``deadletters.start_limit``); WorkerError naming the keys when they contradict,
        warnings logged."""
        try:
            self.dead_letter_limit, warnings = deadletters.start_limit(self.cfg, client_conf(self.cfg))
        except ValueError as exc:
            raise WorkerError(str(exc)) from None
        for warning in warnings:
            log.warning("%s", warning)

    def on_delivery(self, err, msg) -> None:
        """The producer's delivery callback (failures only: ``delivery.report.only.error``)."""
        if self._take_back(err, msg):
            return
        if err is not None:
            self.delivery_errors += 1
            if self.refusals is not None and self.refusals.note(
                err, source="producer", topics=(msg.topic(),)
            ):
                return
            if err.code() not in (
                KafkaError._PURGE_QUEUE,
                KafkaError._PURGE_INFLIGHT,
            ):  # not a transaction abort's
                log.error("delivery to %s failed: %s", msg.topic(), err)

    def produce(
        self, topic: str, value: bytes, key=None, headers=None, on_delivery=None, partition: int | None = None
    ) -> None:
        """Produce one record; a full local queue is waited out (the loop ticking)."""
        if not self._ready():
            return  # exactly-once, the transaction is lost: the cycle's commit aborts it and rolls back
        extra = (
            {} if on_delivery is None else {"on_delivery": on_delivery}
        )  # default: the config's (on_delivery)
        if partition is not None:
            extra["partition"] = partition
        waited = None
        while True:
            try:
                self.producer.produce(topic, value, key=key, headers=headers, **extra)
                self.produced += 1
                return
            except BufferError:  # local queue full (e.g. the broker is unreachable): let librdkafka drain it
                waited = waited or time.monotonic()
                self.producer.poll(0.05)
                self.waiting("room in the producer's queue", time.monotonic() - waited)
            except KafkaException as exc:
                if self.refusals is not None and self.refusals.note(exc.args[0], topics=(topic,)):
                    raise AccessDenied(self.refusals.first) from None  # no Write on the topic: exit 6
                if not self._refused(exc.args[0]):  # at-least-once: a refused produce is fatal
                    raise
                return

    def emit(self, out: StepOutput) -> None:
        """Produce a step's predictions (encoded here, on first access) and dead letters."""
        topic, predictions = self.cfg.topics.predictions, out.predictions
        done = 0
        if self.fast_path:  # one C call per row, no per-row Python frame
            produce = self.producer.produce
            try:
                for key, value in predictions:
                    produce(topic, value, key)  # a str key is encoded (UTF-8) by the client
                    done += 1
            except BufferError:  # the local queue is full: the rest goes through produce(), which waits
                pass
            except KafkaException as exc:  # no Write on the topic: exit 6 (refusals)
                if self.refusals is not None and self.refusals.note(exc.args[0], topics=(topic,)):
                    raise AccessDenied(self.refusals.first) from None
                raise
            finally:
                self.produced += done
        for key, value in predictions[done:]:
            self.produce(topic, value, key=key)
        self.emit_dead(out.dead_letters, count=False)
        if out.rows_predicted:
            crash_point("after_produce")

    def emit_dead(self, dead: list[DeadLetter], *, count: bool = True) -> None:
        """Produce dead letters: as they are when they fit the dead-letter limit, else as excerpts (sized
        before producing: a record the broker refuses would fail an exactly-once transaction); one whose
        headers alone do not fit is counted, logged once per reason and skipped."""
        limit = self.dead_letter_limit
        if limit.refresh_due:
            limit.refresh()
        for d in dead:
            source = d.source if d.source is not None else (self.cfg.topics.labels, -1, -1)
            src_topic, part, off = source[:3]
            key = key_bytes(source[3]) if len(source) > 3 else None  # the input message's own key
            self.reasons.note(d.bad, source)
            headers = deadletters.dead_letter_headers(d.bad, src_topic, part, off)
            fitted = limit.fit(d.value if d.value is not None else b"", headers)
            if fitted is None:
                self._dropped(
                    d.bad.reason, f"its headers alone exceed the dead-letter limit of {limit.limit} bytes"
                )
                continue
            value, headers = fitted
            if d.value is not None and len(value) < len(d.value):
                self._truncated(d, len(value))
            try:
                self.produce(
                    self.cfg.topics.dead_letters,
                    value,
                    key=key,
                    headers=headers,
                    on_delivery=self._dead_delivery(d.bad.reason),
                )
            except (
                KafkaException
            ) as exc:  # refused before it was queued (over message.max.bytes): nothing sent
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                self._dropped(d.bad.reason, f"refused by the producer: {exc.args[0].str()}")
        if count and dead and self.metrics is not None:
            self.metrics.on_dead_letters(dead)

    def _dead_delivery(self, reason: str):
        """The delivery callback of one dead letter (called on failures only): one the broker refused as too
        large (the topic's limit was lowered since the start) makes the worker read the limit again;
        at-least-once it is counted as dropped and skipped, exactly-once its transaction aborts and the replay
        cuts it to the new limit. Other failures go to ``on_delivery``."""

        def delivered(err, msg) -> None:
            if self._take_back(err, msg):
                return
            if err is None or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                self.on_delivery(err, msg)
                return
            self.dead_letter_limit.refused()
            self._too_large(err, msg, reason)

        return delivered

    # ------------------------------------------------------------ a stalled producer (kafka.stalled_output)
    def stalled(self, reachable: bool, now: float) -> bool:
        """Whether the producer stopped delivering while the broker answers (``now``: monotonic seconds)."""
        if self.producer is None or not self.stall.suspect:
            return False
        return self.stall.stalled(self.produced, len(self.producer), reachable, now)

    def resend_stalled(self, new_producer: Callable) -> int:
        """Purge the stalled producer, its delivery reports handing back what it held (in order), and send that
        again through ``new_producer()``; returns how many. Messages in flight are taken back too: the broker
        may have written some of them already, so they may be delivered twice (at-least-once)."""
        stalled, taken = self.producer, []
        self._taking = taken
        try:
            left = stalled_output.purge(stalled)
        finally:
            self._taking = None
        self.producer, self.produced = new_producer(), 0
        self.stall.reset()
        for topic, value, key, headers, partition in taken:
            self.produce(
                topic, value, key=key, headers=headers, partition=partition if partition >= 0 else None
            )
        self.resent += len(taken)
        stalled_output.report_resent(log, len(taken), left)
        return len(taken)

    def _take_back(self, err, msg) -> bool:
        """While a stalled producer is purged: keep a purged message to send again (True: it was one)."""
        if self._taking is None or (record := stalled_output.taken_back(err, msg)) is None:
            return False
        self._taking.append(record)
        return True

    # ------------------------------------------------------------ what exactly-once produces otherwise
    fast_path = True  # predictions straight to the client (a transaction begins in ``produce``)

    def _ready(self) -> bool:
        """Before each produce: whether it may go (at-least-once: always)."""
        return True

    def _refused(self, err: KafkaError) -> bool:
        """A produce the client refused: whether that is taken care of (at-least-once: no, it is fatal)."""
        return False

    def _too_large(self, err: KafkaError, msg, reason: str) -> None:
        """A dead letter the broker refused as too large: counted as dropped and skipped."""
        self._dropped(reason, f"refused by the broker: {err.str()}")

    def _truncated(self, d: DeadLetter, kept: int) -> None:
        if self.dead_letter_limit.note("truncated", d.bad.reason):
            log.warning(
                "a %d-byte %s dead letter goes to %s as an excerpt of its first %d bytes (%s); further "
                "excerpts of this reason are counted, not logged",
                len(d.value),
                d.bad.reason,
                self.cfg.topics.dead_letters,
                kept,
                self.dead_letter_limit.source,
            )
        if self.metrics is not None:
            self.metrics.dead_letters_truncated.labels(d.bad.reason).inc()

    def _dropped(self, reason: str, why: str) -> None:
        if self.dead_letter_limit.note("dropped", reason):
            log.error(
                "a %s dead letter could not be written to %s (%s): skipped; further ones are counted in "
                "iolstream_dead_letters_dropped_total, not logged",
                reason,
                self.cfg.topics.dead_letters,
                why,
            )
        if self.metrics is not None:
            self.metrics.dead_letters_dropped.labels(reason).inc()
