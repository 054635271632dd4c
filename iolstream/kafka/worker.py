"""The Kafka adapter: poll, decode, step, produce, snapshot, commit.

The only module that knows topics, partitions and offsets. The loop is short:

    consume → align (timestamp order across partitions) → processor.on_features / on_labels
    → processor.step → produce predictions and dead letters → checkpoint when due (flush,
    snapshot, commit) → status line

Catch-up ordering: consumed messages are queued per partition and processed in timestamp order
across the features and labels partitions (``align.Aligner``); on a backlog, messages of one
topic wait up to ``stream.align_max_wait_ms`` for a partition of the other that is behind, so
neither topic races ahead and overflows the join buffer. A partition whose queue is full is
paused (librdkafka then drops what it prefetched and resumes after the last message returned,
so nothing is skipped or delivered twice). Only processed messages move ``positions``: snapshots
and commits never cover a message that is still queued, which is simply read again after a
restart, a revoke or a rollback.

Durability (SPEC §6). A snapshot holds the state and ``positions``, the next offset of every
partition the state has consumed, and the worker always resumes from a snapshot's positions:

- at-least-once (default): offsets are committed only after a snapshot covering them is
  durable, and only those; after a crash, predictions made since that snapshot may come again.
- exactly-once: each poll cycle ends with a forced step (every row processed is predicted in
  the cycle that processed it), and the cycle's predictions, dead letters and input offsets
  commit in one Kafka transaction; the snapshot is written after the commit, so committed
  offsets run ahead of it. On restart the input between the snapshot's positions and the
  committed offsets is replayed into the model without emitting (it was emitted before); a
  forced step separates replayed from new input. An aborted transaction reloads the snapshot
  and replays; fencing and other fatal producer errors end the process with EXIT_FATAL.
- A partition the state has never consumed (not in the snapshot) starts at its beginning,
  whatever the group committed: the model must see every row (exactly-once replays the part
  below the committed offset without emitting).
- Commits never go backwards: a partition still below the offset the group had committed
  when it was assigned (being replayed) is left out of commits.
- Rebalances: a revoke writes a snapshot (at-least-once: and commits its offsets) before the
  partitions go; an assignment seeks every partition to the state's own position.
- Shutdown (SIGTERM/SIGINT): finish the batch, flush, commit, final snapshot, close, exit 0,
  all within ``durability.shutdown_grace_seconds``; a watchdog exits EXIT_FATAL if it overruns.

Limits of "same model after a crash" (the sums are the same, so are the row/label counters):
- expiry runs on the wall clock: a row whose ``row_ttl_ms`` (or an early label whose
  ``early_label_ttl_ms``) runs out while the worker is down or replaying expires at restart,
  though its label would have joined in an uninterrupted run; ``row_ttl_batches`` counts
  batches, whose boundaries move with restarts. Keep ttls well above outage + replay time;
- a warm-up scaler takes the first W rows consumed: with several feature partitions their
  interleaving, hence the scaler, may differ between runs (use one feature partition or a
  fixed scaler when that matters).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING, TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, Producer, TopicPartition,
)  # fmt: skip
from confluent_kafka.admin import AdminClient

from iolstream.stream import codec
from iolstream.core import runtime
from iolstream.kafka import topics
from iolstream.stream import warm
from iolstream.stream.align import Aligner
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.ops.lifecycle import EXIT_FATAL, EXIT_OK, EXIT_SHUTDOWN_OVERRUN, LoopWatchdog, exit_after
from iolstream.kafka.config import WorkerConfig
from iolstream.core.model import EdRVFL
from iolstream.ops.faults import CRASH_ENV, crash_point, fault_point
from iolstream.ops.process import freeze_startup_objects
from iolstream.kafka.snapshots import SnapshotError, SnapshotStore
from iolstream.core.state_io import StateFormatError
from iolstream.stream.processor import DeadLetter, StepOutput, StreamProcessor

log = logging.getLogger("iolstream.worker")

# a worker whose newest input is older than this, or whose features partitions hold more than
# BEHIND_BATCHES batches of rows not yet consumed, is catching up: its step tuner may then retry
# settings and use both cores (throughput); otherwise it keeps up with a live stream (latency). The
# lag counts too: a backlog produced moments ago (a burst, a replay, a benchmark) is fresh by its
# timestamps, and was worked through on one core. 32 batches is far above a live stream's lag (a
# few messages); a switch on a cycle's worth (4 batches) flipped into throughput mode on every
# burst and doubled the p99 latency at half load.
BEHIND_MS = 1000
BEHIND_BATCHES = 32
CALL_GRACE = 5.0  # a client call still running this long after its own timeout is abandoned (calls.ClientCalls)
CHECKPOINT_FLUSH_SECONDS = 1.0  # a periodic checkpoint waits this long for deliveries, then tries again later
BROKER_PROBE_SECONDS = 2.0  # while the broker is unreachable, ask it for metadata this often
_UNREACHABLE = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
MAX_ABORTS_IN_A_ROW = 3  # a transaction that keeps failing (an undeliverable output) is not retried for ever
MAX_PRODUCER_ATTEMPTS = 10  # exactly-once: tries at a fresh transactional producer (each up to kafka.call_timeout_seconds) ...
PRODUCER_RETRY_SECONDS = 3.0  # ... this far apart, before the process gives up
SNAPSHOT_BYTES_PER_SECOND = 50e6  # a conservative write rate (encode, checksum, write, fsync) for the timing checks
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class WorkerError(RuntimeError):
    """A condition the worker cannot continue from; the process exits non-zero."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Checkpoint:
    """Bookkeeping of the last durable checkpoint."""

    batches_at: int = 0
    time: float = field(default_factory=time.monotonic)
    offsets: dict = field(default_factory=dict)
    snapshot_seconds: float = 0.0
    snapshot_bytes: int = 0
    written_at: float = 0.0


def ensure_topics(cfg: WorkerConfig, admin: AdminClient | None = None, timeout: float = 30.0) -> list[str]:
    """Create missing topics with the configured partitions; returns the names created. The input and
    dead-letter topics get a max.message.bytes that fits stream.max_message_bytes (topics.topic_configs)."""
    admin = admin or AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers, **cfg.kafka.client})
    t = cfg.topics
    configs = topics.topic_configs(cfg.stream.max_message_bytes, [t.features, t.labels, t.dead_letters])
    return topics.create_topics(admin, [t.features, t.labels, t.predictions, t.dead_letters], partitions=t.partitions,
                                replication_factor=t.replication_factor, configs=configs, timeout=timeout)  # fmt: skip


def estimated_snapshot_bytes(cfg: WorkerConfig) -> int:
    """Upper estimate of a snapshot: per layer A, its factor and A_r (n×n), c and β; a full join buffer."""
    mc = cfg.model
    n = mc.n_nodes + mc.n_inputs + int(mc.bias_column)
    pending = cfg.stream.max_pending_rows * (mc.n_inputs + 1 + mc.n_layers * mc.m)
    return 8 * (mc.n_layers * (3 * n * n + 2 * n * mc.m) + pending)


def check_timing(cfg: WorkerConfig) -> list[str]:
    """Refuse Kafka timeouts the loop could overrun (WorkerError naming the key); return warnings.

    Between two polls the worker may flush, commit and write a snapshot: the group expels a
    consumer that takes longer than ``max.poll.interval.ms``. In exactly-once mode one
    transaction spans one poll cycle (poll, decode, forced step, produce, commit), which must
    end within ``transaction.timeout.ms``.
    """
    snapshot_s = estimated_snapshot_bytes(cfg) / SNAPSHOT_BYTES_PER_SECOND
    poll_ms = int(cfg.kafka.consumer.get("max.poll.interval.ms", 300_000))
    call_s = cfg.kafka.call_timeout_seconds
    need_ms = 1000 * (2 * (call_s + CALL_GRACE) + snapshot_s)
    if poll_ms < need_ms:
        raise WorkerError(
            f"kafka.consumer.max.poll.interval.ms: {poll_ms} is below the {need_ms:.0f} ms one checkpoint may take "
            f"(flush and commit up to kafka.call_timeout_seconds + {CALL_GRACE:.0f} = {call_s + CALL_GRACE:.0f} s each, a snapshot of up to "
            f"{estimated_snapshot_bytes(cfg) / 1e6:.0f} MB ≈ {snapshot_s:.1f} s)"
        )
    warnings = []
    if cfg.durability.exactly_once:
        txn_ms = int(cfg.kafka.producer.get("transaction.timeout.ms", 60_000))
        cycle_ms = cfg.kafka.poll_timeout_ms + max(cfg.stream.max_batch_latency_ms, cfg.stream.max_label_latency_ms)
        need_txn_ms = max(10_000, 10 * cycle_ms)
        if txn_ms < need_txn_ms:
            raise WorkerError(
                f"kafka.producer.transaction.timeout.ms: {txn_ms} leaves too little room for one poll cycle "
                f"(kafka.poll_timeout_ms + the larger stream latency = {cycle_ms} ms, plus processing); "
                f"use at least {need_txn_ms}"
            )
        if txn_ms > poll_ms:
            warnings.append(
                f"kafka.producer.transaction.timeout.ms ({txn_ms}) exceeds kafka.consumer.max.poll.interval.ms "
                f"({poll_ms}): a worker expelled from the group could hold a transaction open that long, "
                "stalling read_committed readers"
            )
    if snapshot_s > cfg.durability.shutdown_grace_seconds / 2:
        warnings.append(
            f"durability.shutdown_grace_seconds ({cfg.durability.shutdown_grace_seconds:g}) may not fit the final "
            f"snapshot (up to {estimated_snapshot_bytes(cfg) / 1e6:.0f} MB ≈ {snapshot_s:.1f} s)"
        )
    return warnings


class Worker:
    """One long-running worker process around one model."""

    def __init__(self, cfg: WorkerConfig, *, metrics=None):
        self.cfg = cfg
        self.metrics = metrics
        self.store = SnapshotStore(cfg.snapshot.dir, cfg.snapshot.keep)
        self.exactly_once = cfg.durability.exactly_once
        self.stop_event = threading.Event()
        self.positions: dict[tuple[str, int], int] = {}  # next offset to read, per partition the state consumed
        self.replay_until: dict[tuple[str, int], int] = {}  # exactly-once: input a committed txn already covered
        self.committed_floor: dict[tuple[str, int], int] = {}  # the group's committed offset, per assigned partition
        self.assigned: set[tuple[str, int]] = set()
        self.checkpoint = Checkpoint()
        self.delivery_errors = 0
        # the largest dead letter produced as it is (larger ones go as excerpts); the topic's limit is read at start
        self.dead_letter_limit = topics.DeadLetterLimit(topics.producer_bytes(cfg.kafka.producer), cfg.topics.dead_letters)
        self.crash_points = bool(os.environ.get(CRASH_ENV))  # test-only hooks; the per-message one costs ~5 % on one-row messages
        self.fatal_error: KafkaError | None = None  # reported by librdkafka's error callback
        self.aborts_in_a_row = 0
        self.replaced_in_a_row = 0  # producers replaced since the last committed transaction
        self.last_tick = time.monotonic()
        self.last_status = time.monotonic()
        self.replaying = False
        self.signalled = False
        self.stop_deadline: float | None = None  # monotonic time by which a shutdown must be over
        self._watchdog: threading.Timer | None = None
        # blocking client calls run with a deadline on a helper thread; the loop ticks while it waits
        self.calls = ClientCalls(on_wait=self._waiting, faults=self.crash_points)
        self.call_timeout = cfg.kafka.call_timeout_seconds  # for one blocking client call (flush, commit, transaction step)
        self.broker_down_since: float | None = None  # monotonic time the broker was found unreachable
        self.broker_probe_at = 0.0
        self.producers_replaced = 0  # exactly-once: transactional producers re-created after a failure
        self.consumers_replaced = 0  # consumers re-created after a fatal consumer error
        self.consumer_error: KafkaError | None = None  # a fatal consumer error, handled by the loop
        self._abandoned_producers: list = []  # kept alive: a thread may still be inside one of their calls
        self.ends: dict[tuple[str, int], int] = {}  # per assigned partition: its end offset when it was assigned
        self.eof: dict[tuple[str, int], int] = {}  # per partition: the offset of its last end-of-partition event
        self.stop_at_end = False
        self.in_rebalance = False  # inside on_assign / on_revoke / on_lost (see _consumer_call)
        self.first_checkpoint_due: float | None = None  # after a start: the early checkpoint (snapshot.first_after_seconds)
        for warning in check_timing(cfg):
            log.warning("%s", warning)
        self.processor = self._load_state()
        runtime.configure_for_model(self.processor.model)  # BLAS threads (MEASUREMENTS.md trap)
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.tx_open = False
        self.tx_failed: KafkaError | None = None  # a produce refused: the open transaction is lost, abort it
        self.tx_started = 0.0
        self.rows_per_message = 32.0  # in the last cycle, to size the next consume (a guess to begin with)
        self.cooperative = False  # partition.assignment.strategy cooperative-sticky: incremental (un)assign
        sc = cfg.stream
        # consumed, not yet processed messages, released in timestamp order across partitions (catch-up)
        self.aligner = Aligner(sc.align_max_wait_ms, sc.align_max_queued_messages, sc.align_max_queued_bytes)

    # ------------------------------------------------------------ state
    def _fresh_processor(self) -> StreamProcessor:
        return StreamProcessor(EdRVFL(self.cfg.model), self.cfg.stream, window_rows=self.cfg.metrics.window_rows)

    def _load_state(self) -> StreamProcessor:
        """The newest valid snapshot's processor (a fresh one if there is none); sets ``positions``."""
        try:
            snap = self.store.load_latest()
        except SnapshotError as exc:  # another format version: never skipped silently
            raise WorkerError(f"cannot load the snapshots in {self.store.dir}: {exc}") from None
        if snap is None:
            log.info("no snapshot in %s: starting a fresh model", self.store.dir)
            self.positions = {}
            self.checkpoint = Checkpoint()
            return self._fresh_processor()
        saved = snap.manifest["config"]
        wanted = self.cfg.model.to_dict()
        diff = [k for k in wanted if _jsonish(wanted[k]) != saved.get(k)]
        if diff:
            raise WorkerError(
                f"snapshot {snap.path} was made with a different model config ({', '.join(f'model.{k}' for k in diff)}): "
                "restore that config, or move the snapshot directory away to start a fresh model"
            )
        try:
            proc = StreamProcessor.from_state(
                snap.manifest, snap.arrays, self.cfg.stream, window_rows=self.cfg.metrics.window_rows
            )
        except (StateFormatError, KeyError, ValueError) as exc:  # checksum fine, contents not ours
            raise WorkerError(f"snapshot {snap.path} cannot be restored: {exc}") from None
        self.positions = {(t, int(p)): int(o) for t, p, o in snap.manifest["offsets"]}
        self.checkpoint = Checkpoint(
            proc.counters["batches"], time.monotonic(), dict(self.positions), snapshot_bytes=snap.size_bytes,
            written_at=snap.manifest.get("written_at_ms", 0) / 1000.0,  # the snapshot's age counts from its write
        )  # fmt: skip
        log.info(
            "loaded snapshot %s (%d bytes, %.3f s): %d rows in, %d labelled, offsets %s",
            snap.path.name, snap.size_bytes, snap.seconds, proc.counters["rows_in"], proc.counters["rows_learned"],
            _fmt_offsets(self.positions), extra={"event": "snapshot_loaded", "snapshot": snap.path.name},
        )  # fmt: skip
        return proc

    # ------------------------------------------------------------ kafka
    def _client_conf(self) -> dict:
        # librdkafka's own log lines go through logging too (JSON when logging.format is json)
        return {"bootstrap.servers": self.cfg.kafka.bootstrap_servers, "logger": logging.getLogger("iolstream.kafka"),
                **self.cfg.kafka.client}  # fmt: skip

    def _open(self) -> None:
        tuner = self.processor.model.thread_tuner
        seconds = warm.preload(self.processor.model.config, parallel=tuner is not None and any(s.parallel for s in tuner.settings))
        log.info("kernels loaded in %.2f s", seconds)  # before the first message, not in the middle of the stream
        if self.cfg.topics.create:
            created = ensure_topics(self.cfg)
            if created:
                log.info("created topics %s", created)
        self._check_dead_letter_limits()
        self.consumer = self._new_consumer()
        self.producer = self._new_producer()

    def _new_consumer(self) -> Consumer:
        """The input consumer, subscribed to the features and labels topics."""
        consumer_conf = {
            **self._client_conf(),
            "group.id": self.cfg.kafka.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # static membership: a restarted worker gets its partitions back at once, instead of
            # waiting session.timeout.ms for the broker to expel the member it was before a crash
            "group.instance.id": self.cfg.transactional_id,
            # prefetch at most 16 MB (librdkafka's default is 64 MB): the aligner holds what runs ahead,
            # and memory stays flat however long the backlog
            "queued.max.messages.kbytes": 16384,
            # and at most 10,000 messages a partition (librdkafka's default is 100,000): with one-row
            # messages the default ran past the aligner's queue bound (align_max_messages, 20,000), whose
            # pause made librdkafka drop what it had fetched and fetch it again; one-row stream:
            # +4-5 % rows/s and 20 MB less peak RSS (batch messages hit the kbytes bound first)
            "queued.min.messages": 10000,
            # with the prefetch bounded that low, a full local queue postponed the next fetch of a
            # partition by librdkafka's default 1000 ms: a catch-up on one-row messages stalled for
            # up to a second each time the aligner paused and resumed a partition (librdkafka >= 2.4)
            "fetch.queue.backoff.ms": 50,
            **self.cfg.kafka.consumer,
        }
        if self.stop_at_end:  # an event when a partition reaches its end (iolstream run --stop-at-end)
            consumer_conf["enable.partition.eof"] = True
        if self.metrics is not None:
            consumer_conf.setdefault("statistics.interval.ms", 5000)
            consumer_conf["stats_cb"] = self.metrics.on_stats
        consumer = Consumer(consumer_conf)
        self.cooperative = "cooperative" in str(consumer_conf.get("partition.assignment.strategy", ""))
        consumer.subscribe(
            [self.cfg.topics.features, self.cfg.topics.labels],
            on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost,
        )  # fmt: skip
        return consumer

    def _replace_consumer(self, err: KafkaError) -> None:
        """The consumer failed fatally (e.g. after an outage longer than the session timeout, the broker fenced
        our static member, FENCED_INSTANCE_ID): drop its partitions and queued input, close it, start a new
        one (its assignment seeks to the state's positions). Exactly-once, the open transaction belonged to
        the old consumer's group generation: the producer is replaced and the model rolled back first."""
        log.warning("the consumer failed fatally (%s): replacing it", err.str(), extra={"event": "consumer_replaced"})
        old, self.consumer = self.consumer, None
        self._forget([TopicPartition(t, p) for t, p in sorted(self.assigned)])
        try:  # its revoke/lost callbacks find no partitions left to forget
            self.calls.call("consumer.close", old.close, 5.0, grace=1.0)
        except (KafkaException, RuntimeError, CallTimedOut):
            pass
        if self.exactly_once:
            self._replace_producer(f"the consumer failed: {err.str()}")
            self._rewind(f"the consumer failed: {err.str()}")
        self.consumer = self._new_consumer()
        self.consumers_replaced += 1

    def _new_producer(self) -> Producer:
        """A producer (exactly-once: transactional, its transactions initialised, which fences any older
        instance with our transactional.id and aborts the transaction it left open)."""
        producer_conf = {
            **self._client_conf(), "linger.ms": 5, "enable.idempotence": True, "error_cb": self._on_error,
            # one prediction message per row: a Python callback per delivered message cost ~6 % of
            # the worker's throughput, and only failures matter (flush() covers the rest)
            "delivery.report.only.error": True, "on_delivery": self._on_delivery, **self.cfg.kafka.producer,
        }  # fmt: skip
        if not self.exactly_once:
            return Producer(producer_conf)
        producer_conf["transactional.id"] = self.cfg.transactional_id
        producer = Producer(producer_conf)
        try:
            self.calls.call("producer.init_transactions", lambda: producer.init_transactions(self.call_timeout),
                            self.call_timeout, grace=CALL_GRACE)  # fmt: skip
        except KafkaException as exc:
            raise WorkerError(
                f"init_transactions for transactional.id {self.cfg.transactional_id!r} failed: {exc.args[0]} "
                "(kafka.producer.transaction.timeout.ms must not exceed the broker's transaction.max.timeout.ms)"
            ) from None
        except CallTimedOut as exc:
            self._abandoned_producers.append(producer)
            raise WorkerError(f"init_transactions for transactional.id {self.cfg.transactional_id!r}: {exc}") from None
        return producer

    def _consumer_call(self, name: str, fn, timeout: float | None = None):
        """A blocking consumer call: on the helper thread with a deadline (``calls``), except inside a
        rebalance callback, where the consumer answers only its own thread (a committed() from the helper
        thread waited for the callback to end, for ever); there it runs directly (it has its own timeout,
        and the loop watchdog bounds it)."""
        if self.in_rebalance:
            return self.calls.direct(name, fn)
        return self.calls.call(name, fn, self.call_timeout if timeout is None else timeout, grace=CALL_GRACE)

    def _committed(self, keys) -> dict[tuple[str, int], int]:
        """The group's committed offsets of ``keys`` (partitions without one are left out)."""
        if not keys:
            return {}
        for attempt in range(5):
            try:
                tps = [TopicPartition(t, p) for t, p in keys]
                tps = self._consumer_call("consumer.committed", lambda: self.consumer.committed(tps, timeout=self.call_timeout))
                return {(tp.topic, tp.partition): tp.offset for tp in tps if tp.offset >= 0}
            except CallTimedOut as exc:
                raise WorkerError(f"cannot read the group's committed offsets: {exc}") from None
            except KafkaException as exc:  # e.g. the group coordinator is still loading
                if not exc.args[0].retriable() or attempt == 4:
                    raise
                time.sleep(0.5)
        return {}  # not reached

    def _start_offset(self, key: tuple[str, int], committed: dict) -> int:
        """Where ``key`` resumes: the state's position, or the partition's beginning if the state never read it.

        Notes the group's committed offset, below which commits never go and (exactly-once) input is
        replayed without emitting: a committed transaction emitted its outputs already."""
        start = self.positions.get(key)
        floor = committed.get(key)
        if floor is None:
            self.committed_floor.pop(key, None)
        else:
            self.committed_floor[key] = floor
            if start is None:
                log.warning("%s[%d]: no snapshot covers it; reading from its beginning although the group "
                            "committed offset %d", key[0], key[1], floor)  # fmt: skip
        if self.exactly_once and floor is not None and floor > (start or 0):
            self.replay_until[key] = floor
        else:
            self.replay_until.pop(key, None)
        return start if start is not None else OFFSET_BEGINNING

    def _on_assign(self, consumer, partitions) -> None:
        self.in_rebalance = True
        try:
            self._on_assign_now(consumer, partitions)
        finally:
            self.in_rebalance = False

    def _on_assign_now(self, consumer, partitions) -> None:
        """Seek every assigned partition to the state's position (never to the group's offset, which
        may be ahead of the state in exactly-once mode or after a damaged snapshot was skipped)."""
        committed = self._committed([(tp.topic, tp.partition) for tp in partitions])
        for tp in partitions:
            key = (tp.topic, tp.partition)
            tp.offset = self._start_offset(key, committed)
            self.assigned.add(key)
            self.eof.pop(key, None)
            end = self._end_offset(key)
            if end is not None:
                self.ends[key] = end
            self.aligner.assign(key, priority=0 if tp.topic == self.cfg.topics.features else 1)  # ties: features first
        if self.cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        log.info("assigned %s; replay without emitting until %s",
                 _fmt_offsets({(p.topic, p.partition): p.offset for p in partitions}),
                 _fmt_offsets(self.replay_until) or "-", extra={"event": "assigned"})  # fmt: skip

    def _end_offset(self, key: tuple[str, int]) -> int | None:
        """The partition's end (high watermark) now, from the broker; None if it cannot be had in time."""
        tp = TopicPartition(key[0], key[1])
        try:
            return self._consumer_call("consumer.get_watermark_offsets",
                                       lambda: self.consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)[1], 5.0)
        except (KafkaException, CallTimedOut) as exc:
            log.warning("%s[%d]: cannot read its end offset: %s", key[0], key[1], exc)
            return None

    def at_end(self) -> bool:
        """Every assigned partition has reached the end it had when it was assigned, and nothing consumed
        waits unprocessed (``iolstream run --stop-at-end``). Past transaction markers, a partition's
        position stays below its end: the end-of-partition event's offset counts then."""
        if not self.assigned:
            return False
        for key in self.assigned:
            end = self.ends.get(key)
            if end is None:
                end = self._end_offset(key)
                if end is None:
                    return False
                self.ends[key] = end
            reached = max(self.positions.get(key, -1), self.eof.get(key, -1))
            queued = self.aligner.partitions.get(key)
            if reached < end or (queued is not None and queued.queue):
                return False
        return True

    def _on_revoke(self, consumer, partitions) -> None:
        self.in_rebalance = True
        try:
            self._on_revoke_now(consumer, partitions)
        finally:
            self.in_rebalance = False

    def _on_revoke_now(self, consumer, partitions) -> None:
        """Partitions taken away: checkpoint first (at-least-once commits their offsets, exactly-once
        committed them with the last transaction); the positions stay in the state."""
        log.info("partitions revoked: %s", [(p.topic, p.partition) for p in partitions], extra={"event": "revoked"})
        if not self.stop_event.is_set():
            self._flush_and_checkpoint(final=True)
        self._forget(partitions)
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _on_lost(self, consumer, partitions) -> None:
        self.in_rebalance = True
        try:
            self._on_lost_now(consumer, partitions)
        finally:
            self.in_rebalance = False

    def _on_lost_now(self, consumer, partitions) -> None:
        """Partitions lost (this member was expelled from the group): nothing may be committed for them."""
        log.warning("partitions lost: %s", [(p.topic, p.partition) for p in partitions], extra={"event": "lost"})
        self._forget(partitions)
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _forget(self, partitions) -> None:
        """Partitions going away: their queued messages are dropped (not processed, so not covered by
        the state's positions, from which they are read again) and paused ones resumed (librdkafka
        keeps a partition paused across a reassignment)."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        dropped = sum(len(self.aligner.partitions[k].queue) for k in keys if k in self.aligner.partitions)
        self._resume(self.aligner.revoke(keys))
        if dropped:
            log.debug("dropped %d queued messages of revoked partitions", dropped)
        for key in keys:
            self.assigned.discard(key)
            self.ends.pop(key, None)
            self.eof.pop(key, None)
            self.replay_until.pop(key, None)
            self.committed_floor.pop(key, None)

    def _resume(self, keys) -> None:
        if keys and self.consumer is not None:
            self.consumer.resume([TopicPartition(t, p) for t, p in keys])
            log.debug("resumed %s", keys)

    def _catching_up(self, newest) -> bool:
        """Whether the worker is behind its input (BEHIND_MS, BEHIND_BATCHES), given the newest message
        consumed: older than BEHIND_MS, or more than BEHIND_BATCHES batches of rows still in the
        features partitions (from the high watermarks of the last fetches; an unknown lag counts 0)."""
        kind, ts = newest.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE and now_ms() - ts > BEHIND_MS:
            return True
        features = self.cfg.topics.features
        messages = sum(lag for key in self.assigned if key[0] == features and (lag := self._lag(key)))
        return messages * self.rows_per_message > BEHIND_BATCHES * self.cfg.stream.batch_rows

    def _lag(self, key: tuple[str, int]) -> int | None:
        """Messages of ``key`` in the broker not yet consumed, from the high watermark of the last fetch
        (None: not known yet). The consumer's position steps over transaction markers, which the
        offset after the last message returned does not."""
        tp = TopicPartition(key[0], key[1])
        try:
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            position = self.consumer.position([tp])[0].offset
        except KafkaException:
            return None
        if high < 0:
            return None
        if position < 0:  # nothing returned since the assignment: at the state's position
            position = self.positions.get(key, max(low, 0))
        return high - position

    def _on_error(self, err: KafkaError, source: str = "producer") -> None:
        """librdkafka's error callback (and the consumer's error events): a fatal error is raised by the
        loop; an unreachable broker is noted (status, /readyz); the rest is logged (RepeatFilter: once
        per kind per interval, with a count)."""
        if err.fatal():
            self.fatal_error = err  # librdkafka cannot continue (e.g. fenced)
            return
        if err.code() in _UNREACHABLE:
            self._broker_unreachable()
        log.warning("kafka %s: %s", source, err)

    def _broker_unreachable(self) -> None:
        if self.broker_down_since is None:
            self.broker_down_since = time.monotonic()
            self.broker_probe_at = time.monotonic() + BROKER_PROBE_SECONDS
            log.warning("the broker is unreachable; waiting for it", extra={"event": "broker_down"})

    def _broker_reachable(self) -> None:
        if self.broker_down_since is not None:
            log.info("the broker is reachable again after %.1f s", time.monotonic() - self.broker_down_since,
                     extra={"event": "broker_up"})  # fmt: skip
            self.broker_down_since = None

    def broker_unreachable_seconds(self) -> float | None:
        """How long the broker has been unreachable (None: it is reachable, as far as the worker knows)."""
        return None if self.broker_down_since is None else time.monotonic() - self.broker_down_since

    def _probe_broker(self) -> None:
        """While the broker is unreachable: ask it for a topic's metadata now and then (a short call)."""
        if self.broker_down_since is None or time.monotonic() < self.broker_probe_at or self.consumer is None:
            return
        self.broker_probe_at = time.monotonic() + BROKER_PROBE_SECONDS
        topic = self.cfg.topics.features
        try:
            meta = self.calls.call("consumer.list_topics", lambda: self.consumer.list_topics(topic, timeout=1.0),
                                   1.0, grace=CALL_GRACE)  # fmt: skip
        except (KafkaException, CallTimedOut):
            return
        if meta.brokers:
            self._broker_reachable()

    def _waiting(self, call: str, seconds: float) -> None:
        """Runs every WAIT_SLICE while a client call is in flight: the loop is alive, waiting for Kafka."""
        self.last_tick = time.monotonic()
        if self.metrics is not None:
            self.metrics.tick(self)
        if time.monotonic() - self.last_status >= self.cfg.logging.status_every_seconds:
            self.log_status(waiting_for=f"{call} for {seconds:.0f} s")

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.delivery_errors += 1
            if err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):  # not a transaction abort's
                log.error("delivery to %s failed: %s", msg.topic(), err)

    def _produce(self, topic: str, value: bytes, key=None, headers=None, on_delivery=None) -> None:
        if self.exactly_once:
            self._ensure_txn()
            if self.tx_failed is not None:
                return  # the transaction is lost: the cycle's commit aborts it and rolls the model back
        extra = {} if on_delivery is None else {"on_delivery": on_delivery}  # default: the config's (_on_delivery)
        while True:
            try:
                self.producer.produce(topic, value, key=key, headers=headers, **extra)
                return
            except BufferError:  # local queue full (e.g. the broker is unreachable): let librdkafka drain it
                waited = time.monotonic()
                self.producer.poll(0.05)
                self._waiting("room in the producer's queue", time.monotonic() - waited)
            except KafkaException as exc:
                # exactly-once: an earlier output of this transaction failed (e.g. too large), which
                # left it in an error state; at-least-once: a refused produce is fatal as ever
                if not self.exactly_once or exc.args[0].code() != KafkaError._STATE:
                    raise
                log.warning("produce refused, the transaction has failed: %s", exc.args[0])
                self.tx_failed = exc.args[0]
                return

    def _emit(self, out: StepOutput) -> None:
        """Produce a step's predictions (encoded here, on first access) and dead letters."""
        topic, predictions = self.cfg.topics.predictions, out.predictions
        done = 0
        if not self.exactly_once:  # the common path: one C call per row, no per-row Python frame
            produce = self.producer.produce
            try:
                for key, value in predictions:
                    produce(topic, value, key)  # a str key is encoded (UTF-8) by the client
                    done += 1
            except BufferError:  # the local queue is full: the rest goes through _produce, which waits
                pass
        for key, value in predictions[done:]:
            self._produce(topic, value, key=key)
        self._emit_dead(out.dead_letters, count=False)
        if out.rows_predicted:
            crash_point("after_produce")

    def _emit_dead(self, dead: list[DeadLetter], *, count: bool = True) -> None:
        """Produce dead letters: as they are when they fit the dead-letter limit, else as excerpts (sized before
        producing: a record the broker refuses would fail an exactly-once transaction); one whose headers alone
        do not fit is counted, logged once per reason and skipped."""
        limit = self.dead_letter_limit
        if limit.refresh_due:
            limit.refresh()
        for d in dead:
            src_topic, part, off = d.source if d.source is not None else (self.cfg.topics.labels, -1, -1)
            headers = codec.dead_letter_headers(d.bad, src_topic, part, off)
            fitted = limit.fit(d.value if d.value is not None else b"", headers)
            if fitted is None:
                self._dead_letter_dropped(d.bad.reason, f"its headers alone exceed the dead-letter limit of {limit.limit} bytes")
                continue
            value, headers = fitted
            if d.value is not None and len(value) < len(d.value):
                self._dead_letter_truncated(d, len(value))
            try:
                self._produce(self.cfg.topics.dead_letters, value, headers=headers, on_delivery=self._dead_delivery(d.bad.reason))
            except KafkaException as exc:  # refused before it was queued (over message.max.bytes): nothing sent
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                self._dead_letter_dropped(d.bad.reason, f"refused by the producer: {exc.args[0].str()}")
        if count and dead and self.metrics is not None:
            self.metrics.on_dead_letters(dead)

    def _dead_delivery(self, reason: str):
        """The delivery callback of one dead letter (called on failures only): one the broker refused as too
        large (the topic's limit was lowered since the start) makes the worker read the limit again; at-least-once
        it is counted as dropped and skipped, exactly-once its transaction aborts and the replay cuts it to the
        new limit. Other failures go to ``_on_delivery``."""

        def delivered(err, msg) -> None:
            if err is None or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                self._on_delivery(err, msg)
                return
            self.dead_letter_limit.refused()
            if self.exactly_once:
                self._on_delivery(err, msg)
            else:
                self._dead_letter_dropped(reason, f"refused by the broker: {err.str()}")

        return delivered

    def _dead_letter_truncated(self, d: DeadLetter, kept: int) -> None:
        if self.dead_letter_limit.note("truncated", d.bad.reason):
            log.warning("a %d-byte %s dead letter goes to %s as an excerpt of its first %d bytes (%s); further "
                        "excerpts of this reason are counted, not logged", len(d.value), d.bad.reason,
                        self.cfg.topics.dead_letters, kept, self.dead_letter_limit.source)  # fmt: skip
        if self.metrics is not None:
            self.metrics.dead_letters_truncated.labels(d.bad.reason).inc()

    def _dead_letter_dropped(self, reason: str, why: str) -> None:
        if self.dead_letter_limit.note("dropped", reason):
            log.error("a %s dead letter could not be written to %s (%s): skipped; further ones are counted in "
                      "iolstream_dead_letters_dropped_total, not logged", reason, self.cfg.topics.dead_letters, why)  # fmt: skip
        if self.metrics is not None:
            self.metrics.dead_letters_dropped.labels(reason).inc()

    def _check_dead_letter_limits(self) -> None:
        """At start: the dead-letter topic's max.message.bytes (and the predictions topic's) against the producer's
        limits (topics.start_limit); WorkerError naming the keys when they contradict, warnings logged."""
        try:
            limit, warnings = topics.start_limit(self.cfg, self._client_conf())
        except ValueError as exc:
            raise WorkerError(str(exc)) from None
        for warning in warnings:
            log.warning("%s", warning)
        self.dead_letter_limit = limit

    # ------------------------------------------------------------- loop
    def request_stop(self, signum=None, _frame=None) -> None:
        """Stop after the current cycle. From a signal (``lifecycle.SignalThread``, never the main thread):
        the stop must be over within ``durability.shutdown_grace_seconds`` (else exit 4), and a second
        signal exits at once."""
        if signum is not None:
            if self.signalled:
                log.error("second %s: exiting now, without a final snapshot", signal.Signals(signum).name)
                os._exit(EXIT_SHUTDOWN_OVERRUN)
            self.signalled = True
            log.info("%s: stopping within %g s", signal.Signals(signum).name, self.cfg.durability.shutdown_grace_seconds)
            self._start_watchdog()
        self.stop_event.set()

    def _start_watchdog(self) -> None:
        """Exit EXIT_SHUTDOWN_OVERRUN if the shutdown is not over within the grace period (an orchestrator kills us anyway)."""
        if self._watchdog is not None:
            return
        grace = self.cfg.durability.shutdown_grace_seconds
        self.stop_deadline = time.monotonic() + grace
        self._watchdog = exit_after(
            grace, EXIT_SHUTDOWN_OVERRUN, f"shutdown took longer than durability.shutdown_grace_seconds={grace:g}; "
            "the last durable snapshot and the offsets committed with it stand",
        )  # fmt: skip

    def _timeout(self, seconds: float) -> float:
        """``seconds``, cut to what is left of the shutdown grace period (keeping 1 s for the rest)."""
        if self.stop_deadline is None:
            return seconds
        return max(0.5, min(seconds, self.stop_deadline - time.monotonic() - 1.0))

    def watchdog_seconds(self) -> float:
        """How long the loop may go without a tick before the watchdog ends the process. Client calls tick
        while they wait (``_waiting``), so the bound covers the main thread's own work between ticks: a
        snapshot (twice its estimated time), plus one client call's timeout and grace for the calls that
        cannot tick (those inside a rebalance callback) and a margin; at least 60 s."""
        if self.cfg.durability.watchdog_seconds is not None:
            return self.cfg.durability.watchdog_seconds
        snapshot_s = estimated_snapshot_bytes(self.cfg) / SNAPSHOT_BYTES_PER_SECOND
        return max(60.0, self.call_timeout + CALL_GRACE + 2 * snapshot_s + 10.0)

    def doing(self) -> str | None:
        """The client call in flight, for the watchdog's last words (None: none)."""
        current = self.calls.current
        return None if current is None else f"{current[0]} (called {time.monotonic() - current[1]:.1f} s ago)"

    def run(
        self, *, max_seconds: float | None = None, idle_stop_seconds: float | None = None, stop_at_end: bool = False,
        freeze_startup: bool = False,
    ) -> int:  # fmt: skip
        """Run until stopped (signal, ``max_seconds``, no input for ``idle_stop_seconds`` while partitions are
        assigned — joining the group, which can take seconds on a fresh broker, does not count — or, with
        ``stop_at_end``, once every assigned partition has reached the end it had when assigned); returns an
        exit code. ``freeze_startup``: once the kernels and clients are up, freeze what exists then for the
        garbage collector (``ops.process.freeze_startup_objects``; the worker process does, a test process does not)."""
        started = time.monotonic()
        last_input = time.monotonic()
        self.stop_at_end = stop_at_end
        watchdog = LoopWatchdog(self.watchdog_seconds(), lambda: self.last_tick, self.doing)
        try:
            self._open()
            if freeze_startup:
                log.debug("%d start-up objects frozen for the garbage collector", freeze_startup_objects())
            self.last_tick = time.monotonic()
            first = self.cfg.snapshot.first_after_seconds
            self.first_checkpoint_due = None if first is None else time.monotonic() + first
            watchdog.start()
            while not self.stop_event.is_set():
                self.last_tick = time.monotonic()
                consumed = self._poll_once()
                if consumed or not self.assigned:  # the idle clock runs only while partitions are assigned
                    last_input = time.monotonic()
                if self.metrics is not None:
                    self.metrics.tick(self)
                if self.consumer_error is not None:
                    err, self.consumer_error = self.consumer_error, None
                    self._replace_consumer(err)
                if self.fatal_error is not None:
                    self._on_fatal_error()
                if self.delivery_errors and not self.exactly_once:  # exactly-once: the transaction aborts instead
                    raise WorkerError(f"{self.delivery_errors} messages could not be delivered; not committing past them")
                self._probe_broker()
                if time.monotonic() - self.last_status >= self.cfg.logging.status_every_seconds:
                    self.log_status()
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                if idle_stop_seconds is not None and time.monotonic() - last_input >= idle_stop_seconds:
                    break
                if stop_at_end and not consumed and self.at_end():
                    log.info("every assigned partition is at the end it had when assigned: stopping",
                             extra={"event": "at_end"})  # fmt: skip
                    break
            return EXIT_OK if self._shutdown() else EXIT_FATAL
        except (WorkerError, KafkaException) as exc:
            log.error("fatal: %s", exc, extra={"event": "fatal"})
            self.stop_event.set()  # no checkpoint from the revoke that close() triggers: the state may be ahead of Kafka
            self._close()
            return EXIT_FATAL
        finally:
            watchdog.stop()
            self.calls.close()
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _poll_once(self) -> int:
        """One cycle: consume, align, feed the processor, step, (exactly-once) commit, checkpoint when due.
        Returns the number of messages consumed or processed (0: idle)."""
        proc = self.processor
        due = proc.next_due_ms(now_ms())
        timeout_ms = self.cfg.kafka.poll_timeout_ms if due is None else min(self.cfg.kafka.poll_timeout_ms, due)
        held = self.aligner.wait_ms(time.monotonic() * 1000)  # queued messages: ready (0) or waiting (until when)
        if held is not None:
            timeout_ms = min(timeout_ms, math.ceil(held))
        # a cycle (one transaction in exactly-once mode) takes about 4 batches of rows, however many per message
        want = max(1, min(4 * self.cfg.stream.batch_rows, round(4 * self.cfg.stream.batch_rows / self.rows_per_message)))
        # consume(n, timeout) waits out the whole timeout unless n messages come: take what is
        # already fetched, and block only for the first message when nothing is (latency, not batching).
        # A cycle's worth already queued and not waiting: process it first. Consuming anyway would keep
        # the aligner's queues at their high-water mark for ever after a burst (on a backlog, the labels
        # fetched ahead of their features), while librdkafka goes on prefetching meanwhile.
        if self.aligner.queued >= want and not self.aligner.blocked:
            msgs = []
        else:
            msgs = self.consumer.consume(num_messages=want, timeout=0)
            if not msgs:
                first = self.consumer.poll(max(timeout_ms, 0) / 1000.0)
                if first is not None:
                    msgs = [first] + (self.consumer.consume(num_messages=want - 1, timeout=0) if want > 1 else [])
        consumed = self._queue(msgs)
        tuner = proc.model.thread_tuner
        if tuner is not None and msgs:  # throughput mode only when behind (see runtime.StepTuner.explore)
            tuner.explore = self._catching_up(msgs[-1])
        ready = self.aligner.release(time.monotonic() * 1000, self._lag, want)
        while len(ready) < want and self.aligner.blocked:
            # a message waits for a partition that is behind: take what else is fetched already
            # (its data may be there), so that a cycle holds about as much as before aligning
            self._flow_control()
            msgs = self.consumer.consume(num_messages=want, timeout=0)
            if not msgs:
                break
            consumed += self._queue(msgs)
            ready += self.aligner.release(time.monotonic() * 1000, self._lag, want - len(ready))
        self._flow_control()
        now = now_ms()
        rows_before = proc.counters["rows_in"] + proc.counters["labels_in"]
        features_topic, batch_rows, metrics, positions = self.cfg.topics.features, self.cfg.stream.batch_rows, self.metrics, self.positions
        for key, msg in ready:  # per message: one-row messages make this loop hot, so it is kept lean
            topic, offset = key[0], msg.offset()
            replay = key in self.replay_until and offset < self.replay_until[key]
            if replay != self.replaying:
                self._step(now, force=True)  # never mix replayed (already emitted) and new input in one step
                self.replaying = replay
            if topic == features_topic:
                dead = proc.on_features(msg.value(), (topic, key[1], offset), now)
                if metrics is not None:
                    metrics.on_features(self, msg.timestamp())  # produce time, for the latency histogram
            else:
                dead = proc.on_labels(msg.value(), (topic, key[1], offset), now)
            if dead and not self.replaying:
                self._emit_dead(dead)
            positions[key] = offset + 1  # processed: only now may a snapshot or commit cover it
            if replay and offset + 1 >= self.replay_until[key]:
                del self.replay_until[key]
                log.info("%s[%d]: replayed up to the committed offset %d", topic, key[1], offset + 1)
            if self.crash_points:
                crash_point("mid_batch")
            if len(proc.batcher) >= batch_rows:  # a full batch: predict it before the labels that follow
                self._step(now)  # it come, so that (aligned) each label message folds in its batch alone
        if ready:
            self.rows_per_message = max(1.0, (proc.counters["rows_in"] + proc.counters["labels_in"] - rows_before) / len(ready))
        self._step(now, force=self.exactly_once and bool(ready))
        if self.replaying and not self.replay_until:  # replay over: what the processor holds now is new input
            self.replaying = False
        if self.exactly_once:
            self._commit_transaction()
        self.producer.poll(0)
        if self._checkpoint_due():
            self._flush_and_checkpoint()
        return max(consumed, len(ready))

    def _queue(self, msgs) -> int:
        """Hand the consumed messages to the aligner; returns how many (errors and EOF left out)."""
        consumed = 0
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.eof[(msg.topic(), msg.partition())] = msg.offset()
                    continue
                if err.fatal() or err.code() == KafkaError._FATAL:  # librdkafka's fatal consumer errors come as _FATAL
                    self.consumer_error = err
                    break
                self._on_error(err, source="consumer")
                continue
            consumed += 1
            kind, ts = msg.timestamp()
            self.aligner.add((msg.topic(), msg.partition()), msg.offset(), ts if kind != TIMESTAMP_NOT_AVAILABLE else None,
                             len(msg.value() or b""), msg)  # fmt: skip
        if consumed:
            self._broker_reachable()
        return consumed

    def _flow_control(self) -> None:
        """Pause partitions whose aligner queue is full, resume those it has drained."""
        full = self.aligner.to_pause()
        if full:
            self.consumer.pause([TopicPartition(t, p) for t, p in full])
            log.debug("paused %s (queue full: %s)", full, self.aligner.stats())
        self._resume(self.aligner.to_resume())

    def _step(self, now: int, *, force: bool = False) -> None:
        out = self.processor.step(now, force=force)
        if not out:
            return
        if self.replaying:
            if self.metrics is not None:
                self.metrics.on_step(self, out, replay=True)
            return
        if self.metrics is not None:
            self.metrics.on_step(self, out)
            self.metrics.on_dead_letters(out.dead_letters)
        if out.rows_predicted and log.isEnabledFor(logging.DEBUG):
            ids = [key for key, _ in out.predictions]
            log.debug("batch up to #%d: %d predictions (%s .. %s), %d rows learned, model version %d",
                      self.processor.batch_seq, len(ids), ids[0], ids[-1], out.rows_learned,
                      self.processor.model.learner.state.version,
                      extra={"event": "batch", "batch_seq": self.processor.batch_seq, "rows": out.rows_predicted,
                             "first_id": ids[0], "last_id": ids[-1], "rows_learned": out.rows_learned,
                             "seconds": round(out.batch_seconds, 6)})  # fmt: skip
        self._emit(out)

    def _offsets_to_commit(self) -> list[TopicPartition]:
        """The positions of the assigned partitions, except those not past the group's committed
        offset (being replayed): a commit never moves an offset backwards."""
        return [
            TopicPartition(t, p, o) for (t, p), o in sorted(self.positions.items())
            if (t, p) in self.assigned and o > self.committed_floor.get((t, p), -1)
        ]  # fmt: skip

    # ------------------------------------------------------ transactions
    def _ensure_txn(self) -> None:
        if not self.tx_open:
            self.producer.begin_transaction()
            self.tx_open = True
            self.tx_started = time.monotonic()

    def _commit_transaction(self) -> None:
        """End the cycle's transaction: 1. add the input offsets 2. commit, retrying retriable errors
        3. on an abortable error (or retries running out) abort and roll the model back; when the
        producer cannot go on (a call that overran its deadline, an abort that fails, a fatal error
        other than fencing) replace it with a fresh one and roll back. Fencing (another worker with our
        transactional.id) raises WorkerError: the process ends."""
        offsets = self._offsets_to_commit()
        if not self.tx_open and not offsets:
            return  # nothing emitted and nothing new consumed (a replay-only cycle, an idle poll)
        self._ensure_txn()
        try:
            if self.tx_failed is not None:  # never commit a transaction that misses an output
                raise KafkaException(KafkaError(KafkaError._STATE, f"a produce failed: {self.tx_failed.str()}",
                                                txn_requires_abort=True))  # fmt: skip
            if offsets:
                group = self.consumer.consumer_group_metadata()
                self._txn_call("send_offsets_to_transaction",
                               lambda t: self.producer.send_offsets_to_transaction(offsets, group, t))  # fmt: skip
            if fault_point("abort_txn"):  # test-only: an abortable failure
                raise KafkaException(KafkaError(KafkaError._STATE, "test: simulated abortable error", txn_requires_abort=True))
            crash_point("before_txn_commit")
            self._txn_call("commit_transaction", self.producer.commit_transaction)
        except CallTimedOut as exc:
            log.warning("transaction failed (%s): replacing the producer and rolling the model back", exc)
            self._replace_producer(str(exc))
            self._rewind(f"{exc.name} overran its deadline")
            return
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() and err.code() in _FENCED:
                raise WorkerError(self._fatal_message(err)) from None
            if err.fatal() or not err.txn_requires_abort():
                # fatal, or still retriable when the transaction ran out of time (librdkafka then refuses an
                # abort while the commit is in progress: _CONFLICT): the producer cannot go on
                log.warning("transaction failed (%s): replacing the producer and rolling the model back", err)
                self._replace_producer(err.str())
                self._rewind(err.str())
                return
            log.warning("transaction failed (%s): aborting it and rolling the model back to the last snapshot", err)
            self._abort_and_rewind(err)
            return
        self.tx_open = False
        self.aborts_in_a_row = 0
        self.replaced_in_a_row = 0
        for tp in offsets:
            self.committed_floor[(tp.topic, tp.partition)] = tp.offset
        seconds = time.monotonic() - self.tx_started
        if seconds * 1000 > int(self.cfg.kafka.producer.get("transaction.timeout.ms", 60_000)) / 2:
            log.warning("a transaction took %.1f s, over half of transaction.timeout.ms", seconds)
        if self.metrics is not None:
            self.metrics.transactions_committed.inc()
        crash_point("after_txn_commit")

    def _txn_call(self, name: str, op) -> None:
        """A blocking transactional call ``op(timeout)`` (on the helper thread, each attempt within
        ``kafka.call_timeout_seconds``), called again while it fails retriably — librdkafka's way to resume
        a commit that timed out — until the transaction's own timeout (``transaction.timeout.ms`` since it
        began, after which the coordinator aborts it anyway) or the shutdown deadline."""
        txn_s = int(self.cfg.kafka.producer.get("transaction.timeout.ms", 60_000)) / 1000.0
        deadline = max(self.tx_started + txn_s, time.monotonic() + self.call_timeout)
        if self.stop_deadline is not None:
            deadline = min(deadline, self.stop_deadline - 1.0)
        while True:
            timeout = max(0.1, min(self.call_timeout, deadline - time.monotonic()))
            try:
                self.calls.call("producer." + name, lambda: op(timeout), timeout, grace=CALL_GRACE)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.txn_requires_abort() or time.monotonic() >= deadline:
                    raise
                log.warning("retrying after a retriable transaction error: %s", err)
                self._sleep_ticking(0.2)

    def _fatal_message(self, err: KafkaError) -> str:
        if err.code() in _FENCED:
            return (f"producer fenced: another worker with transactional.id {self.cfg.transactional_id!r} has started "
                    f"({err.str()}); this one stops")  # fmt: skip
        return f"the transactional producer failed fatally: {err.str()} ({err.name()})"

    def _on_fatal_error(self) -> None:
        """A fatal error reported by librdkafka's callback. Exactly-once, unless fenced: a fresh producer
        and a roll-back; otherwise the process ends."""
        err, self.fatal_error = self.fatal_error, None
        if not self.exactly_once or err.code() in _FENCED:
            raise WorkerError(self._fatal_message(err))
        log.warning("the transactional producer failed fatally (%s): replacing it and rolling the model back", err.str())
        self._replace_producer(err.str())
        self._rewind(err.str())

    def _replace_producer(self, why: str) -> None:
        """Exactly-once: give the producer up and start a fresh one with the same transactional.id, whose
        init_transactions fences the old one and aborts its open transaction. The old producer is destroyed
        on the helper thread (it may be stuck in a call there: it then stays until that call returns).
        While the broker does not answer, tried again every few seconds, the loop ticking; a stop
        request or MAX_PRODUCER_ATTEMPTS failures end the process."""
        old, self.producer = [self.producer], None
        self.tx_open, self.tx_failed, self.fatal_error = False, None, None
        try:
            self.calls.call("producer.close", old.clear, 1.0, grace=1.0)
        except CallTimedOut:
            pass  # the helper thread is stuck in the old producer: the next call gets a new one
        self.replaced_in_a_row += 1
        if self.replaced_in_a_row > MAX_ABORTS_IN_A_ROW:  # a fresh producer did not help: every transaction fails
            raise WorkerError(f"{self.replaced_in_a_row} producers in a row failed their first transaction ({why}); giving up")
        for attempt in range(1, MAX_PRODUCER_ATTEMPTS + 1):
            try:
                self.producer = self._new_producer()
                break
            except WorkerError as exc:
                if self.stop_event.is_set() or attempt == MAX_PRODUCER_ATTEMPTS:
                    raise WorkerError(f"cannot replace the transactional producer ({why}): {exc}") from None
                log.warning("a fresh transactional producer failed (attempt %d of %d): %s",
                            attempt, MAX_PRODUCER_ATTEMPTS, exc)  # fmt: skip
                self._broker_unreachable()
                self._sleep_ticking(PRODUCER_RETRY_SECONDS)
        self.producers_replaced += 1
        log.info("transactional producer replaced (%d so far)", self.producers_replaced, extra={"event": "producer_replaced"})

    def _sleep_ticking(self, seconds: float) -> None:
        """Wait ``seconds`` (less if a stop is requested), the loop ticking meanwhile."""
        until = time.monotonic() + seconds
        while not self.stop_event.is_set() and (left := until - time.monotonic()) > 0:
            self.stop_event.wait(min(0.25, left))
            self._waiting("a retry", seconds - left)

    def _abort_and_rewind(self, why: KafkaError) -> None:
        """Abort the open transaction (if the abort fails too, replace the producer), then roll the model back."""
        try:
            self._txn_call("abort_transaction", self.producer.abort_transaction)
        except (KafkaException, CallTimedOut) as exc:
            if isinstance(exc, KafkaException) and exc.args[0].code() in _FENCED:
                raise WorkerError(self._fatal_message(exc.args[0])) from None
            log.warning("aborting a failed transaction failed too (%s): replacing the producer", exc)
            self._replace_producer(f"abort failed: {exc}")
        self.tx_open = False
        self.tx_failed = None
        self.aborts_in_a_row += 1
        if self.aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise WorkerError(f"{self.aborts_in_a_row} transactions in a row aborted (last: {why.str()}); giving up")
        self._rewind(why.str())

    def _rewind(self, why: str) -> None:
        """Roll the model back after a lost transaction: reload the newest snapshot and seek every assigned
        partition to its positions; what the group committed is replayed without emitting."""
        self.delivery_errors = 0  # those of the aborted transaction
        if self.metrics is not None:
            self.metrics.transactions_aborted.inc()
        self.processor = self._load_state()
        runtime.configure_for_model(self.processor.model)
        self.replaying = False
        self._resume(self.aligner.clear())  # queued messages are read again from the snapshot's positions
        committed = self._committed(sorted(self.assigned))
        for key in sorted(self.assigned):
            try:
                self.consumer.seek(TopicPartition(key[0], key[1], self._start_offset(key, committed)))
            except KafkaException as exc:  # e.g. lost in a rebalance meanwhile: its next assignment seeks it
                log.warning("%s[%d]: cannot seek it back: %s", key[0], key[1], exc)
        log.info("rolled back to offsets %s; replay without emitting until %s (%s)", _fmt_offsets(self.positions) or "-",
                 _fmt_offsets(self.replay_until) or "-", why)  # fmt: skip

    # ------------------------------------------------------- checkpoints
    def _checkpoint_due(self) -> bool:
        cp, snap = self.checkpoint, self.cfg.snapshot
        batches = self.processor.counters["batches"] - cp.batches_at
        if self.positions == cp.offsets and batches == 0:
            return False
        if batches >= snap.every_batches or time.monotonic() - cp.time >= snap.every_seconds:
            return True
        # after a (re)start, soon: exactly-once as soon as the replay is over, at-least-once a moment after
        # input is processed, so that a crash loop makes progress instead of replaying from further back
        early = self.first_checkpoint_due
        return early is not None and not self.replay_until and (self.exactly_once or time.monotonic() >= early)

    def _flush_and_checkpoint(self, *, force_step: bool = False, final: bool = False) -> bool:
        """1. (shutdown) step, flushing the partial batch 2. exactly-once: commit an open transaction
        3. flush the producer 4. write the snapshot 5. at-least-once: commit the snapshot's offsets.
        Returns False, writing and committing nothing, if an output could not be delivered: a periodic
        checkpoint waits CHECKPOINT_FLUSH_SECONDS for deliveries (during an outage it is postponed, the loop
        going on), a ``final`` one (revoke, shutdown) up to ``kafka.call_timeout_seconds``."""
        if force_step and not self.exactly_once:
            self._step(now_ms(), force=True)
        if self.exactly_once and self.tx_open:
            self._commit_transaction()
        wait = self._timeout(self.call_timeout) if final else CHECKPOINT_FLUSH_SECONDS
        try:
            remaining = self.calls.call("producer.flush", lambda: self.producer.flush(wait), wait, grace=CALL_GRACE)
        except CallTimedOut as exc:
            log.error("checkpoint skipped, nothing committed: %s", exc)
            return False
        if self.delivery_errors or (remaining and final):
            log.error("checkpoint skipped, nothing committed: %d messages undelivered, %d delivery errors",
                      remaining, self.delivery_errors)  # fmt: skip
            return False
        if remaining:
            log.warning("checkpoint postponed: %d messages not delivered yet", remaining, extra={"event": "postponed"})
            return False
        manifest, arrays = self.processor.to_state()
        manifest["offsets"] = [[t, p, o] for (t, p), o in sorted(self.positions.items())]
        manifest["worker"] = {"exactly_once": self.exactly_once, "group_id": self.cfg.kafka.group_id}
        try:
            snap = self.store.write(manifest, arrays)
        except OSError as exc:
            raise WorkerError(f"cannot write a snapshot to {self.store.dir}: {exc}") from None
        self.checkpoint = Checkpoint(
            self.processor.counters["batches"], time.monotonic(), dict(self.positions), snap.seconds, snap.size_bytes,
            time.time(),
        )  # fmt: skip
        self.first_checkpoint_due = None
        if self.metrics is not None:
            self.metrics.on_snapshot(snap)
        log.info("snapshot %s: %.1f MB in %.3f s, offsets %s", snap.path.name, snap.size_bytes / 1e6, snap.seconds,
                 _fmt_offsets(self.positions), extra={"event": "snapshot", "bytes": snap.size_bytes,
                                                      "seconds": round(snap.seconds, 4)})  # fmt: skip
        if snap.seconds * 1000 > int(self.cfg.kafka.consumer.get("max.poll.interval.ms", 300_000)) / 4:
            log.warning("the snapshot took %.1f s, over a quarter of max.poll.interval.ms", snap.seconds)
        if not self.exactly_once:
            self._commit_offsets()
        return True

    def _commit_offsets(self) -> None:
        """At-least-once: commit the offsets the snapshot just written covers (and never more)."""
        offsets = self._offsets_to_commit()
        if not offsets:
            return
        crash_point("before_commit")
        try:
            if fault_point("fail_commit"):  # test-only: a failing commit
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "test: simulated commit failure"))
            result = self._consumer_call("consumer.commit",
                                         lambda: self.consumer.commit(offsets=offsets, asynchronous=False)) or []
            failed = [tp for tp in result if tp.error is not None]
            if failed:
                raise KafkaException(failed[0].error)
        except (KafkaException, CallTimedOut) as exc:
            log.warning("offset commit failed (the snapshot covers them; the next checkpoint commits again): %s", exc)
            return
        for tp in offsets:
            self.committed_floor[(tp.topic, tp.partition)] = tp.offset

    def _shutdown(self) -> bool:
        """Stop: finish the current batch, emit and flush it, commit, write the final snapshot, close.
        Returns False if the final checkpoint failed (the process then exits non-zero)."""
        log.info("stopping: final batch, flush, commit, snapshot", extra={"event": "stopping"})
        self.stop_event.set()  # no second checkpoint from the revoke that close() triggers
        self._start_watchdog()
        if self.exactly_once:
            self._step(now_ms(), force=True)
            self._commit_transaction()
        ok = self._flush_and_checkpoint(force_step=True, final=True)
        self.log_status()
        self._close()
        log.info("stopped%s", "" if ok else ": the final checkpoint failed", extra={"event": "stopped", "ok": ok})
        return ok

    def _close(self) -> None:
        if self.producer is not None and self.exactly_once and self.tx_open:
            wait = self._timeout(5.0)
            try:
                self.calls.call("producer.abort_transaction", lambda: self.producer.abort_transaction(wait), wait, grace=1.0)
            except (KafkaException, CallTimedOut):
                pass
            self.tx_open = False
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            try:  # leaves the group; waits for the broker, so bounded like any client call
                self.calls.call("consumer.close", consumer.close, self._timeout(self.call_timeout), grace=1.0)
            except (KafkaException, RuntimeError, CallTimedOut):
                pass

    # ------------------------------------------------------------ status
    def log_status(self, *, waiting_for: str | None = None) -> None:
        """The status line; it also says how long the broker has been unreachable and what the loop waits for."""
        self.last_status = time.monotonic()
        if self.metrics is not None:
            self.metrics.refresh(self)
        s = self.processor.status()
        metric = "acc" if self.cfg.model.task == "classification" else "rmse"
        down = self.broker_unreachable_seconds()
        s["broker_unreachable_seconds"] = None if down is None else round(down, 1)
        tail = "" if down is None else f" broker unreachable for {down:.0f} s"
        tail += "" if waiting_for is None else f" waiting for {waiting_for}"
        log.info(
            "rows_in=%d predictions=%d labels_joined=%d pending=%d dead_letters=%d prequential_%s=%.4f (window %.4f) "
            "version=%d%s",
            s["rows_in"], s["predictions_out"], s["rows_learned"], s["pending"], s["dead_letters"], metric, s["metric"],
            s["metric_window"], s["model_version"], tail, extra={"event": "status", "status": s},
        )  # fmt: skip


def _jsonish(value):
    if isinstance(value, tuple):
        return [_jsonish(v) for v in value]
    return value


def _fmt_offsets(offsets: dict) -> str:
    return ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(offsets.items()))
