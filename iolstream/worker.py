"""The Kafka adapter: poll, decode, step, produce, snapshot, commit.

The only module that knows topics, partitions and offsets. The loop is short:

    consume → processor.on_features / on_labels → processor.step → produce predictions
    and dead letters → checkpoint when due (flush, snapshot, commit) → status line

Durability (SPEC §6):
- at-least-once (default): offsets are committed only up to the latest durable
  snapshot; after a crash, predictions made since that snapshot may come again.
- exactly-once: every cycle's predictions, dead letters and input offsets commit in
  one Kafka transaction; snapshots are written after commits; on restart the input
  between the snapshot's offsets and the committed ones is replayed into the model
  without emitting anything. An aborted transaction reloads the snapshot and replays.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from . import codec
from .config import WorkerConfig
from .model import EdRVFL
from .snapshot import SnapshotStore
from .stream import DeadLetter, StepOutput, StreamProcessor

log = logging.getLogger("iolstream.worker")

EXIT_OK = 0
EXIT_FATAL = 3  # fenced producer, failed delivery, incompatible snapshot: let the orchestrator restart us


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
    """Create missing topics with the configured partitions; returns the names created."""
    admin = admin or AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers, **cfg.kafka.client})
    existing = set(admin.list_topics(timeout=timeout).topics)
    t = cfg.topics
    wanted = [t.features, t.labels, t.predictions, t.dead_letters]
    new = [NewTopic(name, t.partitions, t.replication_factor) for name in wanted if name not in existing]
    if not new:
        return []
    for name, fut in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            fut.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return [n.topic for n in new]


class Worker:
    """One long-running worker process around one model."""

    def __init__(self, cfg: WorkerConfig, *, metrics=None):
        self.cfg = cfg
        self.metrics = metrics
        self.store = SnapshotStore(cfg.snapshot.dir, cfg.snapshot.keep)
        self.exactly_once = cfg.durability.exactly_once
        self.stop_event = threading.Event()
        self.positions: dict[tuple[str, int], int] = {}  # next offset to read, per consumed partition
        self.replay_until: dict[tuple[str, int], int] = {}  # exactly-once: input a committed txn already covered
        self.assigned: set[tuple[str, int]] = set()
        self.checkpoint = Checkpoint()
        self.delivery_errors = 0
        self.last_tick = time.monotonic()
        self.replaying = False
        self.processor = self._load_state()
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.tx_open = False

    # ------------------------------------------------------------ state
    def _fresh_processor(self) -> StreamProcessor:
        return StreamProcessor(EdRVFL(self.cfg.model), self.cfg.stream, window_rows=self.cfg.metrics.window_rows)

    def _load_state(self) -> StreamProcessor:
        snap = self.store.load_latest()
        if snap is None:
            log.info("no snapshot in %s: starting a fresh model", self.store.dir)
            self.positions = {}
            return self._fresh_processor()
        saved = snap.manifest["config"]
        wanted = self.cfg.model.to_dict()
        diff = [k for k in wanted if _jsonish(wanted[k]) != saved.get(k)]
        if diff:
            raise WorkerError(
                f"snapshot {snap.path} was made with a different model config ({', '.join(f'model.{k}' for k in diff)}): "
                "restore that config, or move the snapshot directory away to start a fresh model"
            )
        proc = StreamProcessor.from_state(snap.manifest, snap.arrays, self.cfg.stream, window_rows=self.cfg.metrics.window_rows)
        self.positions = {(t, int(p)): int(o) for t, p, o in snap.manifest["offsets"]}
        self.checkpoint = Checkpoint(proc.counters["batches"], time.monotonic(), dict(self.positions))
        log.info(
            "loaded snapshot %s (%d bytes, %.3f s): %d rows in, %d labelled, offsets %s",
            snap.path.name, snap.size_bytes, snap.seconds, proc.counters["rows_in"], proc.counters["rows_learned"],
            _fmt_offsets(self.positions),
        )  # fmt: skip
        return proc

    # ------------------------------------------------------------ kafka
    def _client_conf(self) -> dict:
        return {"bootstrap.servers": self.cfg.kafka.bootstrap_servers, **self.cfg.kafka.client}

    def _open(self) -> None:
        if self.cfg.topics.create:
            created = ensure_topics(self.cfg)
            if created:
                log.info("created topics %s", created)
        consumer_conf = {
            **self._client_conf(),
            "group.id": self.cfg.kafka.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            **self.cfg.kafka.consumer,
        }
        if self.metrics is not None:
            consumer_conf.setdefault("statistics.interval.ms", 5000)
            consumer_conf["stats_cb"] = self.metrics.on_stats
        self.consumer = Consumer(consumer_conf)
        producer_conf = {**self._client_conf(), "linger.ms": 5, "enable.idempotence": True, **self.cfg.kafka.producer}
        if self.exactly_once:
            producer_conf["transactional.id"] = self.cfg.transactional_id
        self.producer = Producer(producer_conf)
        if self.exactly_once:
            self.producer.init_transactions(30)
        self.consumer.subscribe([self.cfg.topics.features, self.cfg.topics.labels], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer, partitions) -> None:
        committed = {}
        if self.exactly_once:
            for tp in consumer.committed(partitions, timeout=30):
                if tp.offset >= 0:
                    committed[(tp.topic, tp.partition)] = tp.offset
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in self.positions:
                tp.offset = self.positions[key]  # replay from the snapshot, never from ahead of it
            if self.exactly_once and key in committed:
                start = self.positions.get(key, committed[key])
                if committed[key] > start:
                    self.replay_until[key] = committed[key]
                else:
                    self.replay_until.pop(key, None)
            self.assigned.add(key)
        consumer.assign(partitions)
        log.info("assigned %s; replay until %s", _fmt_offsets({(p.topic, p.partition): p.offset for p in partitions}),
                 _fmt_offsets(self.replay_until) or "-")  # fmt: skip

    def _on_revoke(self, consumer, partitions) -> None:
        log.info("partitions revoked: %s", [(p.topic, p.partition) for p in partitions])
        if not self.stop_event.is_set():
            self._flush_and_checkpoint(force_step=True)
        for tp in partitions:
            self.assigned.discard((tp.topic, tp.partition))
        consumer.unassign()

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.delivery_errors += 1
            log.error("delivery to %s failed: %s", msg.topic(), err)

    def _produce(self, topic: str, value: bytes, key=None, headers=None) -> None:
        while True:
            try:
                self.producer.produce(topic, value, key=key, headers=headers, on_delivery=self._on_delivery)
                return
            except BufferError:  # local queue full: let librdkafka drain it
                self.producer.poll(0.05)

    def _emit(self, out: StepOutput) -> None:
        topic = self.cfg.topics.predictions
        for key, value in out.predictions:
            self._produce(topic, value, key=key.encode())
        self._emit_dead(out.dead_letters)
        if self.metrics is not None:
            self.metrics.on_step(self, out)

    def _emit_dead(self, dead: list[DeadLetter]) -> None:
        for d in dead:
            src_topic, part, off = d.source if d.source is not None else (self.cfg.topics.labels, -1, -1)
            headers = codec.dead_letter_headers(d.bad, src_topic, part, off)
            self._produce(self.cfg.topics.dead_letters, d.value if d.value is not None else b"", headers=headers)

    # ------------------------------------------------------------- loop
    def request_stop(self, *_args) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self, *, max_seconds: float | None = None, idle_stop_seconds: float | None = None) -> int:
        """Run until stopped (signal, ``max_seconds``, or no input for ``idle_stop_seconds``); returns an exit code."""
        started = time.monotonic()
        last_input = time.monotonic()
        last_status = time.monotonic()
        try:
            self._open()
            while not self.stop_event.is_set():
                self.last_tick = time.monotonic()
                consumed = self._poll_once()
                if consumed:
                    last_input = time.monotonic()
                if self.delivery_errors:
                    raise WorkerError(f"{self.delivery_errors} messages could not be delivered; not committing past them")
                if time.monotonic() - last_status >= self.cfg.logging.status_every_seconds:
                    self.log_status()
                    last_status = time.monotonic()
                if max_seconds is not None and time.monotonic() - started >= max_seconds:
                    break
                if idle_stop_seconds is not None and time.monotonic() - last_input >= idle_stop_seconds:
                    break
            self._shutdown()
            return EXIT_OK
        except (WorkerError, KafkaException) as exc:
            log.error("fatal: %s", exc)
            self._close(commit=False)
            return EXIT_FATAL

    def _poll_once(self) -> int:
        proc = self.processor
        due = proc.next_due_ms(now_ms())
        timeout_ms = self.cfg.kafka.poll_timeout_ms if due is None else min(self.cfg.kafka.poll_timeout_ms, due)
        msgs = self.consumer.consume(num_messages=self.cfg.stream.batch_rows * 4, timeout=max(timeout_ms, 0) / 1000.0)
        if self.exactly_once and msgs and not self.tx_open:
            self.producer.begin_transaction()
            self.tx_open = True
        now = now_ms()
        consumed = 0
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise WorkerError(f"consumer: {err}")
                log.warning("consumer error: %s", err)
                continue
            consumed += 1
            key = (msg.topic(), msg.partition())
            replay = key in self.replay_until and msg.offset() < self.replay_until[key]
            if replay != self.replaying:
                # never mix replayed (already emitted) and new input in one batch
                self._step(now, force=True)
                self.replaying = replay
            source = (msg.topic(), msg.partition(), msg.offset())
            if msg.topic() == self.cfg.topics.features:
                dead = proc.on_features(msg.value(), source, now)
            else:
                dead = proc.on_labels(msg.value(), source, now)
            if not self.replaying:
                self._emit_dead(dead)
            self.positions[key] = msg.offset() + 1
            if replay and msg.offset() + 1 >= self.replay_until[key]:
                del self.replay_until[key]
        self._step(now, force=self.exactly_once and bool(msgs))
        if self.exactly_once and self.tx_open:
            self._commit_transaction()
        self.producer.poll(0)
        if self._checkpoint_due():
            self._flush_and_checkpoint()
        return consumed

    def _step(self, now: int, *, force: bool = False) -> None:
        out = self.processor.step(now, force=force)
        if not out:
            return
        if self.replaying:
            if self.metrics is not None:
                self.metrics.on_step(self, out, replay=True)
            return
        self._emit(out)

    # ------------------------------------------------------ transactions
    def _commit_transaction(self) -> None:
        offsets = [TopicPartition(t, p, o) for (t, p), o in self.positions.items() if (t, p) in self.assigned]
        try:
            self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 30)
            self.producer.commit_transaction(30)
            self.tx_open = False
            if self.metrics is not None:
                self.metrics.transactions_committed.inc()
        except KafkaException as exc:
            kerr = exc.args[0]
            if kerr.fatal():
                raise WorkerError(f"transactional producer fenced or failed fatally: {kerr}") from None
            log.warning("transaction failed (%s): aborting and rolling the model back to the last snapshot", kerr)
            self._abort_and_rewind()

    def _abort_and_rewind(self) -> None:
        try:
            self.producer.abort_transaction(30)
        finally:
            self.tx_open = False
        if self.metrics is not None:
            self.metrics.transactions_aborted.inc()
        self.processor = self._load_state()
        committed = self.consumer.committed([TopicPartition(t, p) for t, p in self.assigned], timeout=30)
        self.replay_until = {}
        for tp in committed:
            key = (tp.topic, tp.partition)
            start = self.positions.get(key, tp.offset)
            if tp.offset >= 0 and tp.offset > start:
                self.replay_until[key] = tp.offset
            seek_to = start if start >= 0 else OFFSET_INVALID
            if seek_to != OFFSET_INVALID:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, seek_to))

    # ------------------------------------------------------- checkpoints
    def _checkpoint_due(self) -> bool:
        cp, snap = self.checkpoint, self.cfg.snapshot
        batches = self.processor.counters["batches"] - cp.batches_at
        if self.positions == cp.offsets and batches == 0:
            return False
        return batches >= snap.every_batches or time.monotonic() - cp.time >= snap.every_seconds

    def _flush_and_checkpoint(self, *, force_step: bool = False) -> bool:
        """1. step (optionally flushing partial batches) 2. flush the producer 3. write the snapshot
        4. commit the snapshot's offsets (at-least-once; exactly-once commits them in transactions).
        Returns False, committing nothing, if anything before the commit failed."""
        if force_step and not self.exactly_once:
            self._step(now_ms(), force=True)
        if self.exactly_once and self.tx_open:
            self._commit_transaction()
        remaining = self.producer.flush(30)
        if remaining or self.delivery_errors:
            log.error("checkpoint skipped: %d messages undelivered, %d delivery errors", remaining, self.delivery_errors)
            return False
        manifest, arrays = self.processor.to_state()
        manifest["offsets"] = [[t, p, o] for (t, p), o in sorted(self.positions.items())]
        manifest["worker"] = {"exactly_once": self.exactly_once, "group_id": self.cfg.kafka.group_id}
        snap = self.store.write(manifest, arrays)
        self.checkpoint = Checkpoint(
            self.processor.counters["batches"], time.monotonic(), dict(self.positions), snap.seconds, snap.size_bytes,
            time.time(),
        )  # fmt: skip
        if self.metrics is not None:
            self.metrics.on_snapshot(snap)
        if not self.exactly_once:
            offsets = [TopicPartition(t, p, o) for (t, p), o in self.positions.items() if (t, p) in self.assigned]
            if offsets:
                try:
                    self.consumer.commit(offsets=offsets, asynchronous=False)
                except KafkaException as exc:
                    log.warning("offset commit failed (the snapshot covers it; retried next checkpoint): %s", exc)
        log.info("snapshot %s: %d bytes in %.3f s, offsets %s", snap.path.name, snap.size_bytes, snap.seconds,
                 _fmt_offsets(self.positions))  # fmt: skip
        return True

    def _shutdown(self) -> None:
        log.info("stopping: final batch, flush, snapshot, commit")
        self.stop_event.set()  # no second checkpoint from the revoke that close() triggers
        if self.exactly_once:
            if not self.tx_open:
                self.producer.begin_transaction()
                self.tx_open = True
            self._step(now_ms(), force=True)
            self._commit_transaction()
        ok = self._flush_and_checkpoint(force_step=True)
        self.log_status()
        self._close(commit=ok)

    def _close(self, *, commit: bool) -> None:
        if self.producer is not None and self.exactly_once and self.tx_open:
            try:
                self.producer.abort_transaction(5)
            except KafkaException:
                pass
        if self.consumer is not None:
            try:
                self.consumer.close()
            except (KafkaException, RuntimeError):
                pass
            self.consumer = None

    # ------------------------------------------------------------ status
    def log_status(self) -> None:
        if self.metrics is not None:
            self.metrics.refresh(self)
        s = self.processor.status()
        metric = "acc" if self.cfg.model.task == "classification" else "rmse"
        log.info(
            "rows_in=%d predictions=%d labels_joined=%d pending=%d dead_letters=%d prequential_%s=%.4f (window %.4f) version=%d",
            s["rows_in"], s["predictions_out"], s["rows_learned"], s["pending"], s["dead_letters"], metric, s["metric"],
            s["metric_window"], s["model_version"], extra={"event": "status", "status": s},
        )  # fmt: skip


def _jsonish(value):
    if isinstance(value, tuple):
        return [_jsonish(v) for v in value]
    return value


def _fmt_offsets(offsets: dict) -> str:
    return ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(offsets.items()))
