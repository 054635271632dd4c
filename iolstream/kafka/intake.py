"""The consuming half of a poll cycle: consume → align.

Consumed messages are queued per partition (``stream.align.Aligner``) and released in timestamp order
across the features and labels partitions; a partition whose queue is full is paused, and resumed once
drained. Only processed messages move the positions (``kafka.offsets``): a message still queued is read
again after a restart, a revoke or a roll-back. A cycle takes about four batches of rows, however many
rows a message holds.
"""

from __future__ import annotations

import logging
import math
import time

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, TopicPartition

from iolstream.kafka.assignment import Assignment
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.health import BrokerHealth
from iolstream.kafka.offsets import OffsetBook
from iolstream.stream.align import Aligner

log = logging.getLogger("iolstream.worker")


class Intake:
    """Consumes and aligns for the worker; ``on_error`` gets the consumer's non-fatal errors, a fatal one
    waits in ``consumer_error`` for the loop (which replaces the consumer)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        book: OffsetBook,
        aligner: Aligner,
        assignment: Assignment,
        health: BrokerHealth,
        on_error,
    ):
        self.cfg, self.book, self.aligner, self.assignment = cfg, book, aligner, assignment
        self.health, self.on_error = health, on_error
        self.consumer_error: KafkaError | None = None  # a fatal consumer error, handled by the loop
        self.rows_per_message = 32.0  # in the last cycle, to size the next consume (a guess to begin with)

    def take(self, due_ms: int | None, tuner=None) -> tuple[int, list]:
        """Consume what is fetched (waiting at most until the processor has work, ``due_ms``) and release what
        is ready in timestamp order: (messages consumed, [(partition key, message)] to process)."""
        batch_rows, poll_ms = self.cfg.stream.batch_rows, self.cfg.kafka.poll_timeout_ms
        timeout_ms = poll_ms if due_ms is None else min(poll_ms, due_ms)
        held = self.aligner.wait_ms(time.monotonic() * 1000)  # queued messages: ready (0) or waiting (until)
        if held is not None:
            timeout_ms = min(timeout_ms, math.ceil(held))
        want = max(1, min(4 * batch_rows, round(4 * batch_rows / self.rows_per_message)))
        consumer = self.assignment.consumer
        # take what is already fetched, and block only for the first message when nothing is (latency); a
        # cycle's worth already queued and not waiting is processed first (else the aligner's queues stay full
        # after a burst)
        msgs = []
        if self.aligner.queued < want or self.aligner.blocked:
            msgs = consumer.consume(num_messages=want, timeout=0)
            if not msgs and (first := consumer.poll(max(timeout_ms, 0) / 1000.0)) is not None:
                msgs = [first] + (consumer.consume(num_messages=want - 1, timeout=0) if want > 1 else [])
        consumed = self._queue(msgs)
        if tuner is not None and msgs:  # throughput mode only when behind (see step_tuner.StepTuner.explore)
            tuner.explore = self.assignment.catching_up(msgs[-1], self.rows_per_message)
        ready = self.aligner.release(time.monotonic() * 1000, self.assignment.lag, want)
        revokes = self.assignment.revokes
        while len(ready) < want and self.aligner.blocked:  # one waits for a partition behind: take what else
            self.flow_control()  # is fetched
            if not (msgs := consumer.consume(num_messages=want, timeout=0)):
                break
            consumed += self._queue(msgs)
            ready += self.aligner.release(time.monotonic() * 1000, self.assignment.lag, want - len(ready))
        if self.assignment.revokes != revokes:  # a rebalance in that consume: released messages of
            ready = [(key, msg) for key, msg in ready if key in self.book.assigned]  # partitions gone
        self.flow_control()  # are another member's now
        return consumed, ready

    def processed(self, messages: int, rows: int) -> None:
        """A cycle fed ``messages`` holding ``rows`` rows and labels: the next cycle's size follows."""
        if messages:
            self.rows_per_message = max(1.0, rows / messages)

    def _queue(self, msgs) -> int:
        """Hand the consumed messages to the aligner; returns how many (errors and EOF left out)."""
        consumed = 0
        for msg in msgs:
            if (err := msg.error()) is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.book.eof[(msg.topic(), msg.partition())] = msg.offset()
                elif err.fatal() or err.code() == KafkaError._FATAL:  # librdkafka's fatal consumer errors
                    self.consumer_error = err  # come as _FATAL
                    break
                else:
                    self.on_error(err, source="consumer")
                continue
            if (
                msg.topic(),
                msg.partition(),
            ) not in self.book.assigned:  # fetched before a revoke in this very
                continue  # call: another member's now (it reads the message from the committed offset)
            consumed += 1
            kind, ts = msg.timestamp()
            self.aligner.add(
                (msg.topic(), msg.partition()),
                msg.offset(),
                ts if kind != TIMESTAMP_NOT_AVAILABLE else None,
                len(msg.value() or b""),
                msg,
            )
        if consumed:
            self.health.reachable()
        return consumed

    def flow_control(self) -> None:
        """Pause partitions whose aligner queue is full, resume those it has drained."""
        if full := self.aligner.to_pause():
            self.assignment.consumer.pause([TopicPartition(t, p) for t, p in full])
            log.debug("paused %s (queue full: %s)", full, self.aligner.stats())
        self.assignment.resume(self.aligner.to_resume())
