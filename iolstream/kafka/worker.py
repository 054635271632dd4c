"""The worker loop: poll → align → step → emit → checkpoint.

    consume → align (timestamp order across partitions, ``stream.align``) → processor.on_features /
    on_labels → processor.step → emit predictions and dead letters (``output``) → exactly-once: commit the
    cycle's transaction (``transactions``) → checkpoint when due (``checkpoints``) → status line

The collaborators hold the clients and their own state: ``offsets.OffsetBook`` (positions, committed
floor, replay bounds, ends), ``output.Output`` (the producer), ``transactions.Transactions``
(exactly-once), ``checkpoints.Checkpointer`` (the snapshot store), ``calls.ClientCalls`` (blocking client
calls with a deadline, the loop ticking while they wait), ``health.BrokerHealth``.

Catch-up ordering: consumed messages are queued per partition and released in timestamp order across
the features and labels partitions; a partition whose queue is full is paused. Only processed messages
move the positions: snapshots and commits never cover a message still queued, which is read again
after a restart, a revoke or a roll-back.

Durability (docs/design.md §6; docs/operations.md). A snapshot holds the state and the positions; the worker
always resumes from them. At-least-once: offsets are committed only after a snapshot covering them is
durable. Exactly-once: each poll cycle ends with a forced step and one transaction holding its
predictions, dead letters and input offsets; on restart the input between the snapshot and the
committed offsets is replayed without emitting; a lost transaction rolls the model back to the
snapshot. A partition the state never consumed starts at its beginning. Rebalances: a revoke
checkpoints first; an assignment seeks every partition to the state's position. Shutdown
(SIGTERM/SIGINT): finish the batch, flush, commit, final snapshot, close, exit 0 within
``durability.shutdown_grace_seconds`` (else exit 4); a loop that stops ticking ends with exit 5.
"""

from __future__ import annotations

import logging
import math
import os
import time

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from iolstream.kafka import access, clients, diagnose, relearn
from iolstream.kafka.assignment import Assignment
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.checkpoints import Checkpointer
from iolstream.kafka.clients import check_timing, ensure_topics
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.group import GroupSync
from iolstream.kafka.health import BrokerHealth
from iolstream.kafka.offsets import OffsetBook, fmt
from iolstream.kafka.output import Output
from iolstream.kafka.refusals import Refusals
from iolstream.kafka.stopping import Stopping
from iolstream.kafka.transactions import FENCED, Transactions, fatal_message
from iolstream.ops.faults import CRASH_ENV, crash_point
from iolstream.ops.lifecycle import EXIT_ACCESS, EXIT_FATAL, EXIT_OK, LoopWatchdog
from iolstream.ops.logs import log_status_line
from iolstream.ops.process import freeze_startup_objects
from iolstream.stream import warm
from iolstream.stream.align import Aligner
from iolstream.stream.processor import StepOutput

__all__ = ["EXIT_FATAL", "EXIT_OK", "Worker", "WorkerError", "check_timing", "ensure_topics"]
log = logging.getLogger("iolstream.worker")


def now_ms() -> int:
    return int(time.time() * 1000)


class Worker:
    """One long-running worker process around one model.

    What the metrics and health endpoints read (``ops.metrics``'s view): ``processor``, ``checkpoint``,
    ``last_tick``, ``stopping``, ``connected``, ``partitions``, ``replay_pending``,
    ``broker_unreachable_seconds``."""

    def __init__(self, cfg: WorkerConfig, *, metrics=None):
        self.cfg = cfg
        self.metrics = metrics
        self.exactly_once = cfg.durability.exactly_once
        self.stopper = Stopping(cfg)
        self.stop_event = self.stopper.event
        self.crash_points = bool(
            os.environ.get(CRASH_ENV)
        )  # test-only hooks; the per-message one costs ~5 % on one-row messages
        self.last_tick = self.last_status = time.monotonic()
        self.replaying = False  # the processor holds replayed input (exactly-once: not emitted)
        self.fatal_error: KafkaError | None = None  # reported by librdkafka's error callback
        self.consumer_error: KafkaError | None = None  # a fatal consumer error, handled by the loop
        self.consumers_replaced = 0
        self.stop_at_end = False
        self.rows_per_message = 32.0  # in the last cycle, to size the next consume (a guess to begin with)
        self.call_timeout = cfg.kafka.call_timeout_seconds
        self.calls = ClientCalls(on_wait=self._waiting, faults=self.crash_points)
        self.health = BrokerHealth(self.calls)
        for warning in check_timing(cfg):
            log.warning("%s", warning)
        self.checkpoints = Checkpointer(cfg, self.calls, metrics=metrics)
        self.processor, positions = self.checkpoints.load()
        self.book = OffsetBook(exactly_once=self.exactly_once, positions=positions, group=cfg.group.enabled)
        self.output = Output(cfg, metrics=metrics, waiting=self._waiting)
        # authentication, TLS trust, ACLs: one line and exit 6 (kafka.refusals)
        self.refusals = self.output.refusals = Refusals(cfg)
        self.group = (
            GroupSync(cfg, self.output) if cfg.group.enabled else None
        )  # group learning (kafka.group)
        if self.group is not None:
            self.group.attach(self.processor, self.checkpoints.loaded_group, start=True)
            self.checkpoints.group = self.group
        self.txn = (
            Transactions(
                cfg,
                self.output,
                self.calls,
                self._new_producer,
                metrics=metrics,
                sleep=self._sleep_ticking,
                deadline=lambda: self.stopper.deadline,
            )
            if self.exactly_once
            else None
        )
        sc = cfg.stream
        # consumed, not yet processed messages, released in timestamp order across partitions (catch-up)
        self.aligner = Aligner(sc.align_max_wait_ms, sc.align_max_queued_messages, sc.align_max_queued_bytes)
        self.assignment = Assignment(
            cfg,
            self.book,
            self.aligner,
            self.calls,
            before_revoke=lambda: self._flush_and_checkpoint(final=True),
            stopping=self.stop_event.is_set,
        )

    @property
    def consumer(self) -> Consumer | None:
        return self.assignment.consumer

    @consumer.setter
    def consumer(self, consumer: Consumer | None) -> None:
        self.assignment.consumer = consumer

    # ------------------------------------------------------------ the view (ops.metrics)
    checkpoint = property(lambda self: self.checkpoints.last)
    stopping = property(lambda self: self.stop_event.is_set())
    connected = property(lambda self: self.consumer is not None)
    partitions = property(lambda self: len(self.book.assigned))
    replay_pending = property(lambda self: bool(self.book.replay_until))
    broker_unreachable_seconds = property(lambda self: self.health.unreachable_seconds())
    group_status = property(lambda self: None if self.group is None else self.group.status())

    # ------------------------------------------------------------ clients
    def _open(self) -> None:
        tuner = self.processor.model.thread_tuner
        parallel = tuner is not None and any(s.parallel for s in tuner.settings)
        seconds = warm.preload(self.processor.model.config, parallel=parallel)
        log.info(
            "kernels loaded in %.2f s", seconds
        )  # before the first message, not in the middle of the stream
        # check's probes of the topics and groups: a refusal is one line and exit 6, not a wait in the calls below
        access.startup(self.cfg, clients.client_conf(self.cfg), log)
        if self.cfg.topics.create:
            created = ensure_topics(self.cfg)
            if created:
                log.info("created topics %s", created)
        self.output.read_limits()
        if (
            self.group is not None
        ):  # the group's sums (and, with no snapshot, this member's own) before any input
            self.group.open()
            self.group.catch_up(self.call_timeout, tick=lambda: self._waiting("the model-deltas topic", 0.0))
            if self.group.adopted_positions is not None:
                self.book.reset(self.group.adopted_positions)
        # the producer first: exactly-once, init_transactions fences a previous incarnation and aborts its open
        # transaction, whose pending offsets would keep the group's committed offsets unstable (a committed()
        # waits for them) until the transaction timed out
        self.output.producer = self._new_producer()
        ahead = {}
        if (
            self.group and self.exactly_once
        ):  # also partitions taken over after the snapshot (their commits say where)
            ahead = relearn.own_commits_ahead(self.cfg, self.book.positions, self.book.bases)
        if ahead:  # before this member joins the group: nobody has taken its partitions yet (kafka.relearn)
            relearn.relearn(
                self.cfg, self.processor, self.book.positions, self.book.bases, ahead, self.call_timeout
            )
        self.consumer = self._new_consumer()
        if (
            self.group is not None and self.checkpoints.loaded_group is not None
        ):  # a restart: its partitions may have
            self.group.hand_over()  # moved while it was away; the rows waiting for labels go wherever their labels go

    def _new_consumer(self) -> Consumer:
        """The input consumer, subscribed to the features and labels topics."""
        conf = clients.consumer_conf(
            self.cfg,
            stop_at_end=self.stop_at_end,
            stats_cb=None if self.metrics is None else self.metrics.on_stats,
        )
        consumer = Consumer(conf)
        self.assignment.cooperative = "cooperative" in str(conf.get("partition.assignment.strategy", ""))
        a = self.assignment
        consumer.subscribe(
            [self.cfg.topics.features, self.cfg.topics.labels],
            on_assign=a.on_assign,
            on_revoke=a.on_revoke,
            on_lost=a.on_lost,
        )
        return consumer

    def _new_producer(self) -> Producer:
        return clients.new_producer(
            self.cfg, self.calls, error_cb=self._on_error, on_delivery=self.output.on_delivery
        )

    def _replace_consumer(self, err: KafkaError) -> None:
        """The consumer failed fatally (e.g. after an outage longer than the session timeout, the broker fenced
        our static member, FENCED_INSTANCE_ID): drop its partitions and queued input, close it, start a new
        one (its assignment seeks to the state's positions). Exactly-once, the open transaction belonged to
        the old consumer's group generation: the producer is replaced and the model rolled back first."""
        log.warning(
            "the consumer failed fatally (%s): replacing it", err.str(), extra={"event": "consumer_replaced"}
        )
        old, self.consumer = self.consumer, None
        self.assignment.forget(sorted(self.book.assigned))
        try:  # its revoke/lost callbacks find no partitions left to forget
            self.calls.call("consumer.close", old.close, 5.0, grace=1.0)
        except (KafkaException, RuntimeError, CallTimedOut):
            pass
        if self.txn is not None:
            self.txn.replace(f"the consumer failed: {err.str()}")
            self._rewind(f"the consumer failed: {err.str()}")
        self.consumer = self._new_consumer()
        self.consumers_replaced += 1

    # ------------------------------------------------------------ the loop
    def run(
        self,
        *,
        max_seconds: float | None = None,
        idle_stop_seconds: float | None = None,
        stop_at_end: bool = False,
        freeze_startup: bool = False,
    ) -> int:
        """Run until stopped (signal, ``max_seconds``, no input for ``idle_stop_seconds`` while partitions are
        assigned — joining the group does not count — or, with ``stop_at_end``, once every assigned partition
        has reached the end it had when assigned); returns an exit code. ``freeze_startup``: once the kernels
        and clients are up, freeze what exists then for the garbage collector (the worker process does)."""
        started = last_input = time.monotonic()
        self.stop_at_end = stop_at_end
        watchdog = LoopWatchdog(self.stopper.watchdog_seconds(), lambda: self.last_tick, self.doing)
        refused_lines = self.refusals.handler()  # librdkafka's log lines that name a refusal (kafka.refusals)
        logging.getLogger("iolstream.kafka").addHandler(refused_lines)
        try:
            self._open()
            if freeze_startup:
                log.debug("%d start-up objects frozen for the garbage collector", freeze_startup_objects())
            self.last_tick = time.monotonic()
            self.checkpoints.started()
            watchdog.start()
            while not self.stop_event.is_set():
                self.last_tick = time.monotonic()
                consumed = self._poll_once()
                if (
                    consumed or not self.book.assigned
                ):  # the idle clock runs only while partitions are assigned
                    last_input = time.monotonic()
                self._after_cycle()
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                if idle_stop_seconds is not None and time.monotonic() - last_input >= idle_stop_seconds:
                    break
                if stop_at_end and not consumed and self.assignment.at_end():
                    log.info(
                        "every assigned partition is at the end it had when assigned: stopping",
                        extra={"event": "at_end"},
                    )
                    break
            return EXIT_OK if self._shutdown() else EXIT_FATAL
        except (WorkerError, KafkaException) as exc:
            if isinstance(exc, WorkerError):
                why, code = exc, exc.exit_code
            else:
                why = diagnose.explain(exc, clients.client_conf(self.cfg))
                code = EXIT_ACCESS if why.refusal else EXIT_FATAL
            log.error("fatal: %s", why, extra={"event": "fatal"})
            self.stop_event.set()  # no checkpoint from the revoke that close() triggers: the state may be ahead of Kafka
            self._close()
            return code
        finally:
            logging.getLogger("iolstream.kafka").removeHandler(refused_lines)
            watchdog.stop()
            self.calls.close()
            self.stopper.cancel()

    def _poll_once(self) -> int:
        """One cycle: consume, align, feed the processor, step, (exactly-once) commit, checkpoint when due.
        Returns the number of messages consumed or processed (0: idle)."""
        proc, cfg = self.processor, self.cfg
        due = proc.next_due_ms(now_ms())
        timeout_ms = cfg.kafka.poll_timeout_ms if due is None else min(cfg.kafka.poll_timeout_ms, due)
        held = self.aligner.wait_ms(
            time.monotonic() * 1000
        )  # queued messages: ready (0) or waiting (until when)
        if held is not None:
            timeout_ms = min(timeout_ms, math.ceil(held))
        # a cycle (one transaction in exactly-once mode) takes about 4 batches of rows, however many per message
        want = max(
            1, min(4 * cfg.stream.batch_rows, round(4 * cfg.stream.batch_rows / self.rows_per_message))
        )
        # take what is already fetched, and block only for the first message when nothing is (latency); a cycle's
        # worth already queued and not waiting is processed first (else the aligner's queues stay full after a burst)
        msgs = []
        if self.aligner.queued < want or self.aligner.blocked:
            msgs = self.consumer.consume(num_messages=want, timeout=0)
            if not msgs and (first := self.consumer.poll(max(timeout_ms, 0) / 1000.0)) is not None:
                msgs = [first] + (self.consumer.consume(num_messages=want - 1, timeout=0) if want > 1 else [])
        consumed = self._queue(msgs)
        tuner = proc.model.thread_tuner
        if tuner is not None and msgs:  # throughput mode only when behind (see runtime.StepTuner.explore)
            tuner.explore = self.assignment.catching_up(msgs[-1], self.rows_per_message)
        ready = self.aligner.release(time.monotonic() * 1000, self.assignment.lag, want)
        revokes = self.assignment.revokes
        while (
            len(ready) < want and self.aligner.blocked
        ):  # one waits for a partition behind: take what else is fetched
            self._flow_control()
            if not (msgs := self.consumer.consume(num_messages=want, timeout=0)):
                break
            consumed += self._queue(msgs)
            ready += self.aligner.release(time.monotonic() * 1000, self.assignment.lag, want - len(ready))
        if (
            self.assignment.revokes != revokes
        ):  # a rebalance in that consume: released messages of partitions gone
            ready = [
                (key, msg) for key, msg in ready if key in self.book.assigned
            ]  # are another member's now
        self._flow_control()
        now = now_ms()
        rows_before = proc.counters["rows_in"] + proc.counters["labels_in"]
        features, batch_rows, metrics, book = (
            cfg.topics.features,
            cfg.stream.batch_rows,
            self.metrics,
            self.book,
        )
        positions, replay_until = book.positions, book.replay_until
        for key, msg in ready:  # per message: one-row messages make this loop hot, so it is kept lean
            topic, offset = key[0], msg.offset()
            replay = key in replay_until and offset < replay_until[key]
            if replay != self.replaying:
                self._step(now, force=True)  # never mix replayed (already emitted) and new input in one step
                self.replaying = replay
            if topic == features:
                dead = proc.on_features(msg.value(), (topic, key[1], offset), now)
                if metrics is not None:
                    metrics.on_features(self, msg.timestamp())  # produce time, for the latency histogram
            else:
                dead = proc.on_labels(msg.value(), (topic, key[1], offset), now)
            if dead and not self.replaying:
                self.output.emit_dead(dead)
            if replay:
                book.processed(key, offset)
            else:
                positions[key] = offset + 1  # processed: only now may a snapshot or commit cover it
            if self.crash_points:
                crash_point("mid_batch")
            if len(proc.batcher) >= batch_rows:  # a full batch: predict it before the labels that follow
                self._step(now)  # it come, so that (aligned) each label message folds in its batch alone
        if ready:
            self.rows_per_message = max(
                1.0, (proc.counters["rows_in"] + proc.counters["labels_in"] - rows_before) / len(ready)
            )
        self._step(now, force=self.exactly_once and bool(ready))
        if self.replaying and not replay_until:  # replay over: what the processor holds now is new input
            self.replaying = False
        if self.group is not None:
            self.group.poll()
            if not replay_until:  # mid-replay the sums are behind what this member published before
                self.group.publish(positions)
        if self.txn is not None:
            self._commit_transaction()
        self.output.producer.poll(0)
        if self.checkpoints.due(
            self.processor, self.book.positions, bool(self.book.replay_until), self.exactly_once
        ):
            self._flush_and_checkpoint()
        return max(consumed, len(ready))

    def _after_cycle(self) -> None:
        """Between two cycles: metrics, client errors, the broker probe, the status line."""
        if self.metrics is not None:
            self.metrics.tick(self)
        self.refusals.check()
        if self.consumer_error is not None:
            err, self.consumer_error = self.consumer_error, None
            self._replace_consumer(err)
        if self.fatal_error is not None:
            err, self.fatal_error = self.fatal_error, None
            if self.txn is None or err.code() in FENCED:
                raise WorkerError(fatal_message(err, self.cfg.transactional_id))
            log.warning(
                "the transactional producer failed fatally (%s): replacing it and rolling the model back",
                err.str(),
            )
            self.txn.replace(err.str())
            self._rewind(err.str())
        if (
            self.output.delivery_errors and not self.exactly_once
        ):  # exactly-once: the transaction aborts instead
            raise WorkerError(
                f"{self.output.delivery_errors} messages could not be delivered; not committing past them"
            )
        self.health.probe(self.consumer, self.cfg.topics.features)
        if time.monotonic() - self.last_status >= self.cfg.logging.status_every_seconds:
            self.log_status()

    def _queue(self, msgs) -> int:
        """Hand the consumed messages to the aligner; returns how many (errors and EOF left out)."""
        consumed = 0
        for msg in msgs:
            if (err := msg.error()) is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.book.eof[(msg.topic(), msg.partition())] = msg.offset()
                elif (
                    err.fatal() or err.code() == KafkaError._FATAL
                ):  # librdkafka's fatal consumer errors come as _FATAL
                    self.consumer_error = err
                    break
                else:
                    self._on_error(err, source="consumer")
                continue
            if (
                msg.topic(),
                msg.partition(),
            ) not in self.book.assigned:  # fetched before a revoke in this very call:
                continue  # the partition is another member's now (it reads the message from the committed offset)
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

    def _flow_control(self) -> None:
        """Pause partitions whose aligner queue is full, resume those it has drained."""
        if full := self.aligner.to_pause():
            self.consumer.pause([TopicPartition(t, p) for t, p in full])
            log.debug("paused %s (queue full: %s)", full, self.aligner.stats())
        self.assignment.resume(self.aligner.to_resume())

    def _step(self, now: int, *, force: bool = False) -> None:
        out = self.processor.step(now, force=force)
        if not out:
            return
        if self.metrics is not None:
            self.metrics.on_step(self, out, replay=self.replaying)
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

    # ------------------------------------------------------------ transactions, checkpoints
    def _commit_transaction(self) -> None:
        """Exactly-once: commit the cycle's transaction with the input offsets; roll back if it was lost."""
        offsets = self.book.to_commit()
        metadata = (
            (lambda key: self.book.metadata(self.cfg.member_id, key)) if self.group is not None else None
        )
        why = self.txn.commit(offsets, self.consumer.consumer_group_metadata, metadata)
        if why is None:
            self.book.committed(offsets)
        else:
            self._rewind(why)

    def _rewind(self, why: str) -> None:
        """Roll the model back after a lost transaction: reload the newest snapshot and seek every assigned
        partition to its positions; what the group committed is replayed without emitting."""
        self.output.delivery_errors = 0  # those of the aborted transaction
        if self.metrics is not None:
            self.metrics.transactions_aborted.inc()
        self.processor, positions = self.checkpoints.load()
        if self.group is not None:
            self.group.attach(self.processor, self.checkpoints.loaded_group)
        self.book.reset(positions)
        self.replaying = False
        self.assignment.resume(
            self.aligner.clear()
        )  # queued messages are read again from the snapshot's positions
        self.assignment.seek_back()
        log.info(
            "rolled back to offsets %s; replay without emitting until %s (%s)",
            fmt(self.book.positions) or "-",
            fmt(self.book.replay_until) or "-",
            why,
        )

    def _flush_and_checkpoint(self, *, force_step: bool = False, final: bool = False) -> bool:
        """1. (shutdown) step, flushing the partial batch 2. exactly-once: commit an open transaction
        3. wait for deliveries and write the snapshot (``checkpoints``) 4. at-least-once: commit the
        snapshot's offsets. ``final`` (revoke, shutdown): wait up to the call timeout for deliveries."""
        if (
            self.group is not None and final
        ):  # partitions go: every row consumed is learned first (kafka.group)
            self._step(
                now_ms(), force=True
            )  # the batcher's rows: predicted, or held for the group's warm-up scaling
            self.group.settle(
                self.stopper.timeout(self.call_timeout),
                tick=lambda: self._waiting("the group's scaling", 0.0),
            )
            self._step(now_ms(), force=True)  # the held ones, once the scaling is agreed
        elif force_step and not self.exactly_once:
            self._step(now_ms(), force=True)
        if self.group is not None and not self.book.replay_until:  # the sums go with the offsets they cover
            self.group.publish(self.book.positions, force=True)
            if final:  # partitions go: so do the rows waiting for their labels (stream.handover)
                self.group.hand_over()
        if self.txn is not None and self.txn.open:
            self._commit_transaction()
        wait = self.stopper.timeout(self.call_timeout) if final else None
        if not self.checkpoints.write(
            self.processor,
            self.book.positions,
            self.output.producer,
            lambda: self.output.delivery_errors,
            wait=wait,
        ):
            return False
        if not self.exactly_once:
            self.assignment.commit()
        return True

    # ------------------------------------------------------------ errors, waiting
    def _on_error(self, err: KafkaError, source: str = "producer") -> None:
        """librdkafka's error callback (and the consumer's error events): a fatal error is handled by the loop;
        an unreachable broker is noted; the rest is logged (RepeatFilter: once per kind per interval)."""
        if self.refusals.note(err, source=source):
            return
        if err.fatal():
            self.fatal_error = err
            return
        self.health.note(err)
        log.warning("kafka %s: %s", source, err)

    def _waiting(self, call: str, seconds: float) -> None:
        """Runs every WAIT_SLICE while a client call is in flight: the loop is alive, waiting for Kafka."""
        self.last_tick = time.monotonic()
        if self.metrics is not None:
            self.metrics.tick(self)
        if time.monotonic() - self.last_status >= self.cfg.logging.status_every_seconds:
            self.log_status(waiting_for=f"{call} for {seconds:.0f} s")

    def _sleep_ticking(self, seconds: float) -> None:
        """Wait ``seconds`` (less if a stop is requested), the loop ticking meanwhile."""
        until = time.monotonic() + seconds
        while not self.stop_event.is_set() and (left := until - time.monotonic()) > 0:
            self.stop_event.wait(min(0.25, left))
            self._waiting("a retry", seconds - left)

    # ------------------------------------------------------------ stopping
    def request_stop(self, signum=None, _frame=None) -> None:
        """Stop after the current cycle (``signum``: from a signal, on ``ops.lifecycle.SignalThread``)."""
        self.stopper.request(signum)

    def doing(self) -> str | None:
        """The client call in flight, for the watchdog's last words (None: none)."""
        current = self.calls.current
        return None if current is None else f"{current[0]} (called {time.monotonic() - current[1]:.1f} s ago)"

    def _shutdown(self) -> bool:
        """Finish the current batch, emit and flush it, commit, write the final snapshot, close. False if the
        final checkpoint failed (the process then exits non-zero)."""
        log.info("stopping: final batch, flush, commit, snapshot", extra={"event": "stopping"})
        self.stop_event.set()  # no second checkpoint from the revoke that close() triggers
        self.stopper.start_timer()
        if self.txn is not None:
            self._step(now_ms(), force=True)
            self._commit_transaction()
        ok = self._flush_and_checkpoint(force_step=True, final=True)
        self.log_status()
        self._close()
        log.info(
            "stopped%s", "" if ok else ": the final checkpoint failed", extra={"event": "stopped", "ok": ok}
        )
        return ok

    def _close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.txn is not None:
            self.txn.close(self.stopper.timeout(5.0))
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            try:  # leaves the group; waits for the broker, so bounded like any client call
                self.calls.call(
                    "consumer.close", consumer.close, self.stopper.timeout(self.call_timeout), grace=1.0
                )
            except (KafkaException, RuntimeError, CallTimedOut):
                pass

    def log_status(self, *, waiting_for: str | None = None) -> None:
        """The status line; it also says how long the broker has been unreachable and what the loop waits for."""
        self.last_status = time.monotonic()
        if self.metrics is not None:
            self.metrics.refresh(self)
        group = None if self.group is None else self.group.status()
        log_status_line(log, self.processor, self.broker_unreachable_seconds, waiting_for, group=group)
