"""Client settings of the worker: what its consumer and producer are told, and the timing checks of the
configured timeouts against what one loop cycle may take. The topics it creates are ``kafka.topics``'.

Every client gets ``kafka.client`` (security, ...) and routes librdkafka's own log lines through the
``iolstream.kafka`` logger (JSON when ``logging.format`` is json).
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from iolstream.kafka import diagnose
from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import AccessDenied, WorkerError
from iolstream.ops import footprint

CALL_GRACE = (
    5.0  # a client call still running this long after its own timeout is abandoned (calls.ClientCalls)
)
SNAPSHOT_BYTES_PER_SECOND = (
    50e6  # a conservative write rate (encode, checksum, write, fsync) for the timing checks
)


LOGGER = (
    "iolstream.kafka"  # librdkafka's own log lines, through the repeat filter and the log format (ops.logs)
)


def logged(conf: dict) -> dict:
    """``conf`` with librdkafka's log lines routed to the ``iolstream.kafka`` logger: without a ``logger``
    a client prints them raw on stderr (``%3|...|FAIL|rdkafka#producer-1| ...``), hundreds a minute while a
    broker is down. Every client any command creates gets its settings through here."""
    return {"logger": logging.getLogger(LOGGER), **conf}


def producer(conf: dict) -> Producer:
    """A producer whose log lines go through ``logged``."""
    return Producer(logged(conf))


def consumer(conf: dict) -> Consumer:
    """A consumer whose log lines go through ``logged``."""
    return Consumer(logged(conf))


def admin(conf: dict) -> AdminClient:
    """An admin client whose log lines go through ``logged``."""
    return AdminClient(logged(conf))


def client_conf(cfg: WorkerConfig) -> dict:
    """Settings every client gets."""
    return logged({"bootstrap.servers": cfg.kafka.bootstrap_servers, **cfg.kafka.client})


def consumer_conf(cfg: WorkerConfig, *, stop_at_end: bool = False, stats_cb=None) -> dict:
    """The input consumer's settings (``kafka.consumer`` overrides them)."""
    conf = {
        **client_conf(cfg),
        "group.id": cfg.kafka.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        # static membership: a restarted worker gets its partitions back at once, instead of
        # waiting session.timeout.ms for the broker to expel the member it was before a crash
        "group.instance.id": cfg.transactional_id,
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
        **cfg.kafka.consumer,
    }
    if stop_at_end:  # an event when a partition reaches its end (iolstream run --stop-at-end)
        conf["enable.partition.eof"] = True
    if stats_cb is not None:
        conf.setdefault("statistics.interval.ms", 5000)
        conf["stats_cb"] = stats_cb
    return conf


def new_producer(cfg: WorkerConfig, calls: ClientCalls, *, error_cb, on_delivery) -> Producer:
    """A producer; exactly-once, its transactions initialised (which fences any older instance with our
    transactional.id and aborts the transaction it left open): WorkerError if that fails."""
    producer = Producer(producer_conf(cfg, error_cb=error_cb, on_delivery=on_delivery))
    if not cfg.durability.exactly_once:
        return producer
    timeout = cfg.kafka.call_timeout_seconds
    try:
        calls.call(
            "producer.init_transactions",
            lambda: producer.init_transactions(timeout),
            timeout,
            grace=CALL_GRACE,
        )
    except (KafkaException, CallTimedOut) as exc:
        refused = isinstance(exc, KafkaException) and diagnose.refusal(
            exc.args[0],
            client_conf(cfg),
            operation="Write",
            resource=diagnose.named("transactional id", cfg.transactional_id),
        )
        if refused:  # no Write on the transactional id: one line, exit 6
            raise AccessDenied(refused) from None
        raise WorkerError(
            f"init_transactions for transactional.id {cfg.transactional_id!r} failed: {exc} "
            "(kafka.producer.transaction.timeout.ms must not exceed the broker's transaction.max.timeout.ms)"
        ) from None
    return producer


def producer_conf(cfg: WorkerConfig, *, error_cb, on_delivery) -> dict:
    """The output producer's settings (``kafka.producer`` overrides them); exactly-once: transactional."""
    conf = {
        **client_conf(cfg),
        "linger.ms": 5,
        "enable.idempotence": True,
        "error_cb": error_cb,
        # one prediction message per row: a Python callback per delivered message cost ~6 % of
        # the worker's throughput, and only failures matter (flush() covers the rest)
        "delivery.report.only.error": True,
        "on_delivery": on_delivery,
        **cfg.kafka.producer,
    }
    if cfg.durability.exactly_once:
        conf["transactional.id"] = cfg.transactional_id
    return conf


def estimated_snapshot_bytes(cfg: WorkerConfig) -> int:
    """Upper estimate of a snapshot: the model's sums and a full join buffer (``ops.footprint.snapshot_bytes``)."""
    return footprint.snapshot_bytes(cfg)


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
            f"(flush and commit up to kafka.call_timeout_seconds + {CALL_GRACE:.0f} = {call_s + CALL_GRACE:.0f} s each, "
            "a snapshot of up to "
            f"{estimated_snapshot_bytes(cfg) / 1e6:.0f} MB ≈ {snapshot_s:.1f} s)"
        )
    warnings = []
    if cfg.durability.exactly_once:
        txn_ms = int(cfg.kafka.producer.get("transaction.timeout.ms", 60_000))
        cycle_ms = cfg.kafka.poll_timeout_ms + max(
            cfg.stream.max_batch_latency_ms, cfg.stream.max_label_latency_ms
        )
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
