"""Small helpers for integration tests against a real Kafka broker.

Import them as ``from kafka_util import produce_json, consume_all, ...`` (tests/ is on
sys.path: tests/conftest.py makes sure of it). The broker comes from the ``kafka_bootstrap``
fixture in tests/conftest.py; topics from the ``kafka_topics`` fixture.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

__all__ = [
    "STARTUP_SECONDS",
    "Record",
    "admin_client",
    "assert_one_prediction_per_row",
    "committed_offsets",
    "consume_all",
    "create_topics",
    "delete_topics",
    "produce_json",
    "unique_group",
    "wait_for_broker",
    "warm_up",
]

#: How long a test waits for a worker to be ready, or for what takes a worker's start: a bound for a slow, busy
#: machine, not an expectation. A cold start compiles the kernels (65-86 s measured; more with the machine busy);
#: tests/conftest.py compiles them once before the first worker, so a start normally takes seconds.
STARTUP_SECONDS = float(os.environ.get("IOLSTREAM_TEST_STARTUP_SECONDS", "600"))

#: One consumed message: (key, value_bytes, headers, partition, offset).
#: ``key`` is bytes or None; ``headers`` is a list of (name, bytes) pairs (empty if none).
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int, int]


def unique_group(prefix: str = "g") -> str:
    """A consumer-group id no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def admin_client(bootstrap: str, **conf: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **conf})


def wait_for_broker(bootstrap: str, timeout: float = 30.0) -> int:
    """Block until a metadata request lists at least one broker; returns the broker count.

    Raises RuntimeError (with the last error) if it does not happen within ``timeout`` s.
    """
    admin = admin_client(bootstrap, **{"socket.connection.setup.timeout.ms": 5000})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            md = admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if md.brokers:
                return len(md.brokers)
            last = RuntimeError("metadata lists no brokers yet")
        except KafkaException as e:
            last = e
        if time.monotonic() >= deadline:
            raise RuntimeError(f"Kafka broker at {bootstrap} does not answer within {timeout:.0f}s: {last}")
        time.sleep(0.3)


def create_topics(
    bootstrap_or_admin: str | AdminClient,
    names: Iterable[str],
    *,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create topics (replication factor 1) and wait until every partition has a leader."""
    admin = admin_client(bootstrap_or_admin) if isinstance(bootstrap_or_admin, str) else bootstrap_or_admin
    names = list(names)
    new = [
        NewTopic(n, num_partitions=partitions, replication_factor=1, config=dict(config or {})) for n in names
    ]
    for name, fut in admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating topic {name!r} failed: {e}") from e
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        md = admin.list_topics(timeout=5)
        for name in list(pending):
            t = md.topics.get(name)
            if (
                t is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
            ):
                pending.discard(name)
        if not pending:
            break
        if time.monotonic() >= deadline:
            raise RuntimeError(f"topics not ready after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(0.1)
    return names


def delete_topics(bootstrap_or_admin: str | AdminClient, names: Iterable[str], timeout: float = 10.0) -> None:
    """Delete topics, best effort (errors are ignored)."""
    names = list(names)
    if not names:
        return
    admin = admin_client(bootstrap_or_admin) if isinstance(bootstrap_or_admin, str) else bootstrap_or_admin
    try:
        futs = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    except Exception:
        return
    for fut in futs.values():
        try:
            fut.result(timeout=timeout)
        except Exception:
            pass


def _encode(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):  # already-serialised text (e.g. deliberately malformed JSON)
        return value.encode()
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def produce_json(
    bootstrap: str,
    topic: str,
    values: Iterable[Any],
    key: str | bytes | Sequence[str | bytes | None] | Callable[[Any], str | bytes | None] | None = None,
    *,
    partition: int | None = None,
    headers: Sequence[tuple[str, bytes | str]] | None = None,
    timeout: float = 30.0,
    conf: Mapping[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Produce each value as one message and wait for all deliveries.

    Values are serialised with orjson (numpy arrays allowed); ``bytes`` and ``str`` values are
    sent as they are (to test malformed input), ``None`` as a tombstone. ``key`` is one key for
    every message, a sequence of keys (one per value), or a function value -> key.
    Returns the (partition, offset) of every message, in order. Raises RuntimeError on any
    delivery error or if not all messages are delivered within ``timeout`` s.
    The producer is not idempotent (that costs ~0.5 s per call); pass
    ``conf={"enable.idempotence": True}`` if a test needs it.
    """
    values = list(values)
    if isinstance(key, (str, bytes)) or key is None:
        keys: list[Any] = [key] * len(values)
    elif callable(key):
        keys = [key(v) for v in values]
    else:
        keys = list(key)
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2, **(conf or {})})
    results: list[tuple[int, int] | None] = [None] * len(values)
    errors: list[str] = []

    def on_delivery(i: int) -> Callable[[KafkaError | None, Any], None]:
        def cb(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append(f"message {i}: {err}")
            else:
                results[i] = (msg.partition(), msg.offset())

        return cb

    extra: dict[str, Any] = {}
    if partition is not None:
        extra["partition"] = partition
    if headers is not None:
        extra["headers"] = list(headers)
    for i, (v, k) in enumerate(zip(values, keys)):
        while True:
            try:
                producer.produce(topic, value=_encode(v), key=k, on_delivery=on_delivery(i), **extra)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(timeout)
    if errors:
        raise RuntimeError(f"produce to {topic!r} failed: " + "; ".join(errors[:5]))
    if remaining:
        raise RuntimeError(f"produce to {topic!r}: {remaining} message(s) not delivered after {timeout:.0f}s")
    return [r for r in results if r is not None]


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    timeout: float = 30.0,
    isolation_level: str = "read_committed",
    group: str | None = None,
    stop_at_eof: bool | None = None,
    conf: Mapping[str, Any] | None = None,
) -> list[Record]:
    """Read messages of ``topic`` from the beginning; returns [(key, value, headers, partition, offset)].

    Stops as soon as ``expected`` messages have been read, or when ``timeout`` seconds pass
    without a new message. With ``expected=None`` (and unless ``stop_at_eof=False``) it also
    stops once every partition has been read to its end (for read_committed: to the last
    stable offset), so "read what is there" is fast.

    ``group=None``: all partitions are assigned directly, nothing is committed, no group
    is joined. ``group="..."``: the consumer subscribes as that group (starting at its committed
    offsets, else at the beginning) and commits what it read before returning.
    Records are ordered by arrival; within a partition that is offset order.
    """
    if stop_at_eof is None:
        stop_at_eof = expected is None
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or unique_group("consume-all"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation_level,
            "fetch.wait.max.ms": 100,  # end-of-partition is noticed after one empty fetch
            **(conf or {}),
        }
    )
    out: list[Record] = []
    eof: set[int] = set()
    try:
        if group is None:
            md = consumer.list_topics(topic, timeout=10)
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                raise RuntimeError(f"topic {topic!r} not found: {t.error if t else 'no metadata'}")
            parts = sorted(t.partitions)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        else:
            consumer.subscribe([topic])
            parts = None
        last_progress = time.monotonic()
        while expected is None or len(out) < expected:
            msg = consumer.poll(0.2)
            now = time.monotonic()
            if msg is None:
                if now - last_progress >= timeout:
                    break
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    assigned = parts if parts is not None else [tp.partition for tp in consumer.assignment()]
                    if stop_at_eof and assigned and eof.issuperset(assigned):
                        break
                    continue
                raise RuntimeError(f"consuming {topic!r} failed: {err}")
            eof.discard(msg.partition())
            out.append((msg.key(), msg.value(), list(msg.headers() or []), msg.partition(), msg.offset()))
            last_progress = now
        if group is not None and out:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return out


def assert_one_prediction_per_row(
    bootstrap: str, topic: str, ids: Sequence[str], context: str, *, nothing_else: bool = False
) -> None:
    """Every row of ``ids`` predicted exactly once on ``topic`` (read committed): none twice, none missing; with
    ``nothing_else``, also no prediction beyond them."""
    got = consume_all(bootstrap, topic, expected=len(ids), timeout=15, isolation_level="read_committed")
    counts = Counter(orjson.loads(value)["id"] for _, value, _, _, _ in got)
    dupes = [i for i, n in counts.items() if n > 1]
    missing = set(ids) - set(counts)
    assert not dupes and not missing, (
        f"{context}: {len(dupes)} rows predicted twice {dupes[:5]}, {len(missing)} missing"
    )
    if nothing_else:
        extra = consume_all(bootstrap, topic, timeout=1, isolation_level="read_committed")
        assert len(extra) == len(ids), f"{context}: {len(extra)} predictions for {len(ids)} rows"


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int | Iterable[int] = 1, timeout: float = 10.0
) -> dict[int, int | None]:
    """The group's committed offsets {partition: next offset to read, or None if never committed}.

    ``partitions`` is a partition count or an iterable of partition numbers.
    The group coordinator may still be loading on a fresh broker (NOT_COORDINATOR,
    COORDINATOR_LOAD_IN_PROGRESS, ...): such retriable errors are retried until ``timeout``.
    """
    parts = range(partitions) if isinstance(partitions, int) else list(partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                left = max(1.0, deadline - time.monotonic())
                tps = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=left)
                break
            except KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                if err is None or not _coordinator_retriable(err) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}


def _coordinator_retriable(err: KafkaError) -> bool:
    return err.retriable() or err.code() in (
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._WAIT_COORD,
        KafkaError._TIMED_OUT,
    )


def warm_up(bootstrap: str, timeout: float = 60.0) -> None:
    """Make the broker's internal topics exist and their coordinators load, so the first
    test using a consumer group or a transaction is not the one paying for it (a few seconds
    on a fresh broker) and racing its own timeouts. Cheap (~0.1 s) on a warm broker."""
    committed_offsets(bootstrap, unique_group("warm-up"), "__warm_up__", 1, timeout=timeout)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"warm-up-{uuid.uuid4().hex[:12]}"}
    )
    producer.init_transactions(timeout)


def set_topic_limit(admin, topic: str, max_message_bytes: int) -> None:
    """Change a topic's max.message.bytes and wait until the broker reports the new value."""
    from iolstream.kafka.message_limits import describe_max_message_bytes

    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(max_message_bytes), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(10)
    deadline = time.monotonic() + 10
    while describe_max_message_bytes(admin, topic) != max_message_bytes:
        assert time.monotonic() < deadline, f"{topic}: max.message.bytes not {max_message_bytes} after 10 s"
        time.sleep(0.1)


# ------------------------------------------------------------------ the uninterrupted reference
# every learned array of a snapshot: per layer, of the one learner or of each candidate (auto)
MODEL_ARRAYS = re.compile(r"model/(cand\d+/)?(gram|rhs|gram_labelled)$")


def reference_state(raw_cfg: dict, messages) -> tuple[dict, dict]:
    """The final state of one uninterrupted pass over ``messages`` (no Kafka, no clock): what a worker
    killed and restarted on the same messages must end with."""
    from iolstream.core.model import EdRVFL
    from iolstream.kafka.config import config_from_dict
    from iolstream.stream.processor import StreamProcessor

    cfg = config_from_dict(raw_cfg, environ={})
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, window_rows=cfg.metrics.window_rows)
    for i, m in enumerate(messages):
        (proc.on_features if m.kind == "features" else proc.on_labels)(m.encode(), (m.kind, 0, i), 0)
        proc.step(0)
    proc.step(0, force=True)
    return proc.to_state()
