"""The worker loop: consume → align → feed → emit → commit.

    consume (``intake``: the consumer's messages, queued per partition) → align (released in timestamp
    order across partitions, ``stream.align``) → feed (``StreamProcessor.feed``: one message in, what to
    emit out) → emit (``session.Session``: predictions and dead letters, ``output``) → commit (``commit``:
    step, group publish, the transaction or the offsets, the snapshot when due) → status line

The collaborators hold the clients and their own state: ``session.Session`` (the processor, the offset
book ``offsets.OffsetBook`` of positions, committed floors, replay bounds and ends, whether it replays),
``output.Output`` (the producer), ``commit.CommitUnit`` (the end of a cycle: the delivery mode's strategy,
``AtLeastOnce`` or ``ExactlyOnce``, chosen once), ``checkpoints.Checkpointer`` (the snapshot store),
``calls.ClientCalls`` (blocking client calls with a deadline, the loop ticking while they wait),
``health.BrokerHealth``, ``participant.Solo`` or ``participant.GroupMember`` (group learning's part).

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
import os
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from iolstream.core import kernel_cache
from iolstream.kafka import access_probes, clients, diagnose, output
from iolstream.kafka.assignment import Assignment
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.checkpoints import Checkpointer
from iolstream.kafka.clients import check_timing
from iolstream.kafka.commit import delivery_mode, now_ms
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.health import BrokerHealth
from iolstream.kafka.intake import Intake
from iolstream.kafka.offsets import OffsetBook
from iolstream.kafka.participant import participant
from iolstream.kafka.reported_refusals import Refusals
from iolstream.kafka.session import Session
from iolstream.kafka.stopping import Stopping
from iolstream.kafka.topics import ensure_topics
from iolstream.ops.faults import CRASH_ENV, crash_point
from iolstream.ops.lifecycle import EXIT_ACCESS, EXIT_FATAL, EXIT_OK, LoopWatchdog
from iolstream.ops.logs import log_status_line
from iolstream.ops.process import freeze_startup_objects
from iolstream.stream import kernel_warmup
from iolstream.stream.align import Aligner
from iolstream.stream.outputs import StepOutput

__all__ = ["EXIT_FATAL", "EXIT_OK", "Worker", "WorkerError", "check_timing", "ensure_topics"]
log = logging.getLogger("iolstream.worker")
# fenced this often within the window by a consumer with our group.instance.id: another live worker has our id
# (an outage longer than the session timeout fences a stale member once, and the new consumer joins)
FENCED_TIMES, FENCED_WINDOW_SECONDS = 3, 300.0


def fenced_by_our_instance_id(err: KafkaError) -> bool:
    """Whether the consumer's fatal error is the broker fencing it for another consumer with its group.instance.id
    (FENCED_INSTANCE_ID; librdkafka reports it as _FATAL, the cause in the text).

        >>> fenced_by_our_instance_id(KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer "
        ...     "fenced by other consumer with same group.instance.id"))
        True
        >>> fenced_by_our_instance_id(KafkaError(KafkaError._FATAL, "Fatal error: out of memory"))
        False
    """
    if err.code() == KafkaError.FENCED_INSTANCE_ID:
        return True
    text = err.str()
    return err.code() == KafkaError._FATAL and "fenced" in text.lower() and "group.instance.id" in text


class Compiling:
    """What /healthz says while the kernels compile: the sets done so far, and the seconds since the compile
    began, counted when it is read (a set can take a minute)."""

    def __init__(self, total: int):
        self.done, self.total, self.since = 0, total, time.monotonic()

    def __str__(self) -> str:
        return f"compiling the kernels ({self.done}/{self.total} sets, {time.monotonic() - self.since:.0f} s)"


class Worker:
    """One long-running worker process around one model: the loop, and the collaborators it calls.

    What the metrics and health endpoints read is ``ops.status.WorkerView``: ``processor``, ``checkpoint``,
    ``starting``, ``last_tick``, ``stopping``, ``connected``, ``partitions``, ``replay_pending``,
    ``broker_unreachable_seconds``, ``group_status``."""

    def __init__(self, cfg: WorkerConfig, *, metrics=None):
        self.cfg = cfg
        self.metrics = metrics
        mode = delivery_mode(cfg)  # AtLeastOnce or ExactlyOnce: asked, never the config again
        self.stopper = Stopping(cfg)
        self.stop_event = self.stopper.event
        # test-only hooks; the per-message one costs ~5 % on one-row messages
        self.crash_points = bool(os.environ.get(CRASH_ENV))
        self.last_tick = self.last_status = time.monotonic()
        # what the start is doing, for /healthz ("starting: ..."); None once the loop runs
        self.starting: str | Compiling | None = "loading the snapshot"
        self.fatal_error: KafkaError | None = None  # reported by librdkafka's error callback
        self.consumers_replaced = 0
        self.fenced_at: list[float] = []  # when another consumer with our group.instance.id fenced ours
        self.stop_at_end = False
        self.call_timeout = cfg.kafka.call_timeout_seconds
        self.calls = ClientCalls(on_wait=self._waiting, faults=self.crash_points)
        self.health = BrokerHealth(self.calls)
        for warning in check_timing(cfg):
            log.warning("%s", warning)
        self.output = mode.make_output(cfg, metrics=metrics, waiting=self._waiting)
        # authentication, TLS trust, ACLs: one line and exit 6 (kafka.reported_refusals)
        self.refusals = self.output.refusals = Refusals(cfg)
        # group learning's part (kafka.participant; a single worker's does nothing): the processor proposes its
        # warm-up scaling to the group
        self.group = participant(cfg, self.output, assigned=lambda: self.book.assigned)
        self.checkpoints = Checkpointer(cfg, self.calls, metrics=metrics, agreement=self.group.agreement)
        loaded = self.checkpoints.load()
        self.book = OffsetBook(
            replay_committed=mode.replays_committed, positions=loaded.positions, group=cfg.group.enabled
        )
        self.session = Session(loaded.processor, self.book, self.output, metrics=metrics, view=self)
        self.loaded_topic_ids = loaded.topic_ids
        self._dead_seen = dict(self.processor.dead_letters)  # dead letters per reason at the last status line
        self.group.attach(self.processor, loaded.group, start=True)
        sc = cfg.stream
        # consumed, not yet processed messages, released in timestamp order across partitions (catch-up)
        self.aligner = Aligner(sc.align_max_wait_ms, sc.align_max_queued_messages, sc.align_max_queued_bytes)
        self.assignment = Assignment(
            cfg,
            self.book,
            self.aligner,
            self.calls,
            before_revoke=lambda keys: self.commit.partitions_go(keys),
            stopping=self.stop_event.is_set,
            after_assign=self.group.assignment_changed,
        )
        self.intake = Intake(cfg, self.book, self.aligner, self.assignment, self.health, self._on_error)
        self.commit = mode(
            cfg,
            session=self.session,
            output=self.output,
            checkpoints=self.checkpoints,
            assignment=self.assignment,
            aligner=self.aligner,
            stopper=self.stopper,
            group=self.group,
            waiting=self._waiting,
            metrics=metrics,
            calls=self.calls,
            new_producer=self._new_producer,
            sleep=self._sleep_ticking,
            reachable=lambda: self.health.down_since is None,
        )

    @property
    def consumer(self) -> Consumer | None:
        """The input consumer (None until opened, and while it is replaced)."""
        return self.assignment.consumer

    @consumer.setter
    def consumer(self, consumer: Consumer | None) -> None:
        self.assignment.consumer = consumer

    # ------------------------------------------------------------ the view (ops.status.WorkerView)
    processor = property(lambda self: self.session.processor)
    checkpoint = property(lambda self: self.checkpoints.last)
    stopping = property(lambda self: self.stop_event.is_set())
    connected = property(lambda self: self.consumer is not None)
    partitions = property(lambda self: len(self.book.assigned))
    replay_pending = property(lambda self: bool(self.book.replay_until))
    broker_unreachable_seconds = property(lambda self: self.health.unreachable_seconds())
    group_status = property(lambda self: self.group.status())

    # ------------------------------------------------------------ clients
    def _open(self) -> None:
        # check's probes of the topics and groups: a refusal is one line and exit 6, not a wait in the calls
        # below; a missing topic with topics.create false is exit 3 (as check says); before the kernels, which
        # may take a minute to compile at a first start
        self.starting = "probing the topics and groups"
        topic_ids = access_probes.startup(self.cfg, clients.client_conf(self.cfg), log)
        if self.cfg.topics.create:
            self.starting = "creating topics"
            created = ensure_topics(self.cfg)
            if created:
                log.info("created topics %s", created)
                topic_ids = access_probes.topic_ids(self.cfg, clients.client_conf(self.cfg))
        # the ids go into every snapshot; a topic with another id than the snapshot's is read from its beginning
        self.checkpoints.topic_ids = topic_ids
        self.checkpoints.forget_other_topics(self.book.positions, self.loaded_topic_ids)
        self._load_kernels()
        self.starting = "connecting"
        self.output.read_limits()
        # group learning: the group's sums (and, with no snapshot, this member's own) before input
        self.group.open(
            self.book, self.call_timeout, tick=lambda: self._waiting("the model-deltas topic", 0.0)
        )
        # the producer first: exactly-once, init_transactions fences a previous incarnation and aborts its
        # open transaction, whose pending offsets would keep the group's committed offsets unstable (a
        # committed() waits for them) until the transaction timed out
        self.output.producer = self._new_producer()
        # before this member joins the group, nobody has taken its partitions yet: what it committed past its
        # snapshot is re-learned now (group learning, exactly-once: kafka.relearn)
        owed = self.group.before_joining(
            self.processor, self.book, replays=self.commit.replays_committed, timeout=self.call_timeout
        )
        # predictions of rows it committed before it had predicted any: they go out with its first output
        self.session.owe(owed)
        self.consumer = self._new_consumer()
        self.group.joined()  # a restart: its partitions may have moved while it was away (kafka.handover)
        self.commit.receipts_after_load()  # forget receipts of the snapshot loaded, not out before a restart

    def _load_kernels(self) -> None:
        """The compiled kernels, before the first message (not in the middle of the stream): loaded from the cache
        in about a second, or compiled when nothing is cached (a first start), which is said before it begins."""
        tuner = self.processor.model.thread_tuner
        parallel = tuner is not None and any(s.parallel for s in tuner.settings)
        where = kernel_cache.cache_dir()
        cold = kernel_cache.cached_kernels() == 0
        if cold:
            log.info(
                "compiling the kernels this model takes into %s (nothing cached there yet): usually %s, "
                "once; the next start loads them in about a second (iolstream warmup -c CONFIG compiles them ahead)",
                where,
                kernel_warmup.COLD_COMPILE_SECONDS,
                extra={"event": "compiling"},
            )
        compiling = Compiling(len(kernel_warmup.kernel_runs(self.processor.model.config, parallel=parallel)))
        self.starting = compiling if cold else "loading the compiled kernels"

        def progress(done: int, total: int, seconds: float, compiled: int) -> None:
            if compiled:
                compiling.done = done
                self.starting = compiling
                if done < total:
                    log.info(
                        "kernels: %d/%d sets ready (%.0f s)",
                        done,
                        total,
                        seconds,
                        extra={"event": "compiling"},
                    )

        warmed = kernel_warmup.preload(self.processor.model.config, parallel=parallel, progress=progress)
        if warmed.compiled:
            log.info(
                "kernels compiled in %.0f s (%d compilations), cached in %s",
                warmed.seconds,
                warmed.compiled,
                where,
                extra={"event": "kernels"},
            )
        else:
            log.info("kernels loaded in %.2f s", warmed.seconds, extra={"event": "kernels"})

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
        t = self.cfg.topics
        consumer.subscribe(
            [t.features, t.labels] + ([t.forget] if t.forget else []),
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
        """The consumer failed fatally (e.g. after an outage longer than the session timeout, the broker
        fenced our static member, FENCED_INSTANCE_ID): drop its partitions and queued input, close it, start a
        new one (its assignment seeks to the state's positions). Exactly-once, the open transaction belonged
        to the old consumer's group generation: the producer is replaced and the model rolled back first."""
        if fenced_by_our_instance_id(err):
            now = time.monotonic()
            self.fenced_at = [t for t in self.fenced_at if now - t < FENCED_WINDOW_SECONDS] + [now]
            if len(self.fenced_at) >= FENCED_TIMES:  # not an outage's stale member: a live one fences us
                raise WorkerError(
                    f"the consumer was fenced {len(self.fenced_at)} times in {FENCED_WINDOW_SECONDS:.0f} s by another "
                    f"consumer of group {self.cfg.kafka.group_id!r} with the same group.instance.id "
                    f"({self.cfg.transactional_id!r}): another worker runs with this member id "
                    "(group.member_id, or durability.transactional_id): give each worker its own"
                )
        log.warning(
            "the consumer failed fatally (%s): replacing it", err.str(), extra={"event": "consumer_replaced"}
        )
        old, self.consumer = self.consumer, None
        self.assignment.forget(sorted(self.book.assigned))
        try:  # its revoke/lost callbacks find no partitions left to forget
            self.calls.call("consumer.close", old.close, 5.0, grace=1.0)
        except (KafkaException, RuntimeError, CallTimedOut):
            pass
        self.commit.lost(f"the consumer failed: {err.str()}")
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
        on_stuck: Callable[[str], None] | None = None,
    ) -> int:
        """Run until stopped (signal, ``max_seconds``, no input for ``idle_stop_seconds`` while partitions are
        assigned — joining the group does not count — or, with ``stop_at_end``, once every assigned partition
        has reached the end it had when assigned); returns an exit code. ``freeze_startup``: once the kernels
        and clients are up, freeze what exists then for the garbage collector (the worker process does).
        ``on_stuck``: called with the stuck call when the loop watchdog fires, instead of ending the process
        with exit 5 (a worker run in a thread of another program)."""
        started = last_input = time.monotonic()
        self.stop_at_end = stop_at_end
        watchdog = LoopWatchdog(self.stopper.watchdog_seconds(), lambda: self.last_tick, self.doing, on_stuck)
        refused_lines = (
            self.refusals.handler()
        )  # librdkafka's log lines that name a refusal (kafka.reported_refusals)
        stall_lines = self.output.stall.handler()  # a partition without a leader (kafka.stalled_output)
        for handler in (refused_lines, stall_lines):
            logging.getLogger("iolstream.kafka").addHandler(handler)
        try:
            self._open()
            if freeze_startup:
                log.debug("%d start-up objects frozen for the garbage collector", freeze_startup_objects())
            self.last_tick = time.monotonic()
            self.starting = None  # /healthz: the loop's ticks from now on
            self.checkpoints.started()
            watchdog.start()
            while not self.stop_event.is_set():
                self.last_tick = time.monotonic()
                consumed = self._cycle()
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
            # no checkpoint from the revoke that close() triggers: the state may be ahead of Kafka
            self.stop_event.set()
            self._close()
            return code
        finally:
            for handler in (refused_lines, stall_lines):
                logging.getLogger("iolstream.kafka").removeHandler(handler)
            watchdog.stop()
            self.calls.close()
            self.stopper.cancel()

    def _cycle(self) -> int:
        """One cycle: consume → align (``intake``) → feed → emit → commit (``commit``). Returns the number of
        messages consumed or processed (0: idle)."""
        proc = self.processor
        consumed, ready = self.intake.take(proc.next_due_ms(now_ms()), proc.model.thread_tuner)
        now = now_ms()
        rows_before = proc.counters["rows_in"] + proc.counters["labels_in"]
        self._feed(ready, now)
        rows = proc.counters["rows_in"] + proc.counters["labels_in"] - rows_before
        self.intake.processed(len(ready), rows)
        self.commit.end_cycle(now, processed=bool(ready))
        return max(consumed, len(ready))

    def _feed(self, ready: list, now: int) -> None:
        """Feed the released messages to the processor and emit what each gives; only now may a snapshot or a
        commit cover them. One-row messages make this loop hot, so it is kept lean."""
        session, book, metrics = self.session, self.book, self.metrics
        features, forget = self.cfg.topics.features, self.cfg.topics.forget
        for key, msg in ready:
            topic, offset = key[0], msg.offset()
            session.take(key, offset, now)  # replayed input (not emitted) or new: never both in one step
            accepted = None
            if metrics is not None and topic == features:  # produce time, for the latency histogram
                accepted = lambda msg=msg: metrics.on_features(self, msg.timestamp())  # noqa: E731
            # the source a dead letter names (kafka.output): with the message key, if any, which it keeps
            mkey = msg.key()
            source = (
                (topic, key[1], offset) if mkey is None else (topic, key[1], offset, output.key_text(mkey))
            )
            if topic == forget:  # a forget request (docs/design.md §13): its refusals are its only output
                dead = session.processor.on_forget(msg.value(), source, now, mkey)
                out = StepOutput(dead_letters=dead) if dead else None
                if self.crash_points:
                    crash_point("after_forget")
            else:
                # positional: (value, source, now, labels, accepted, key), the hot path; the key is also data:
                # an event's id may be its message key
                out = session.processor.feed(msg.value(), source, now, topic != features, accepted, mkey)
            if out is not None:
                session.emit(out)
            book.processed(key, offset)
            if self.crash_points:
                crash_point("mid_batch")

    def _after_cycle(self) -> None:
        """Between two cycles: metrics, client errors, the broker probe, the status line."""
        if self.metrics is not None:
            self.metrics.tick(self)
        self.refusals.check()
        if self.intake.consumer_error is not None:
            err, self.intake.consumer_error = self.intake.consumer_error, None
            self._replace_consumer(err)
        if self.fatal_error is not None:
            err, self.fatal_error = self.fatal_error, None
            self.commit.producer_failed(err)  # at-least-once: fatal; exactly-once: replaced, unless fenced
        self.commit.check_deliveries()  # at-least-once: never past a failed one (exactly-once: it aborted)
        self.health.probe(self.consumer, self.cfg.topics.features)
        if time.monotonic() - self.last_status >= self.cfg.logging.status_every_seconds:
            self.log_status()

    # ------------------------------------------------------------ errors, waiting
    def _on_error(self, err: KafkaError, source: str = "producer") -> None:
        """librdkafka's error callback (and the consumer's error events): a fatal error is handled by the
        loop; an unreachable broker is noted; the rest is logged (RepeatFilter: once per kind per
        interval)."""
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
        ok = self.commit.finish()
        self.log_status()
        self._close()
        log.info(
            "stopped%s", "" if ok else ": the final checkpoint failed", extra={"event": "stopped", "ok": ok}
        )
        return ok

    def _close(self) -> None:
        self.group.close()
        self.commit.close(self.stopper.timeout(5.0))
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            try:  # leaves the group; waits for the broker, so bounded like any client call
                self.calls.call(
                    "consumer.close", consumer.close, self.stopper.timeout(self.call_timeout), grace=1.0
                )
            except (KafkaException, RuntimeError, CallTimedOut):
                pass

    def log_status(self, *, waiting_for: str | None = None) -> None:
        """The status line; it also says how long the broker has been unreachable and what the loop waits
        for."""
        self.last_status = time.monotonic()
        if self.metrics is not None:
            self.metrics.refresh(self)
        group = self.group.status()
        dead = self.processor.dead_letters  # per reason, the state's (a roll-back may lower it)
        new = {r: n - self._dead_seen.get(r, 0) for r, n in dead.items() if n > self._dead_seen.get(r, 0)}
        self._dead_seen = dict(dead)
        log_status_line(
            log,
            self.processor,
            self.broker_unreachable_seconds,
            waiting_for,
            group=group,
            dead_new=new,
            primary=self.cfg.metrics.primary,
        )
        self.output.reasons.tick()
