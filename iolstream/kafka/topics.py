"""Topic creation and the message size limits of the dead-letter path (issue 12).

Three limits decide whether a dead letter can be written as it is:

- ``stream.max_message_bytes`` (M): input values above it are dead-lettered as ``oversize``;
- the producer's ``message.max.bytes`` (P): librdkafka refuses a larger record at ``produce()``
  and builds no larger batch. Unless ``kafka.producer.message.max.bytes`` is set, the worker sets
  it to ``M + DEAD_LETTER_HEADROOM`` (at least librdkafka's own default, 1,000,000);
- the dead-letter topic's ``max.message.bytes`` (D), read at start with ``describe_configs``: the
  broker refuses a larger record batch (after compression).

A dead letter whose value and headers do not fit ``min(P, D)`` less ``framing_bytes`` is produced as
an excerpt (``codec.dead_letter_excerpt``): its first bytes, with headers naming the original size
and why it was cut. Sizes are decided before producing, so an excerpt never enters an exactly-once
transaction in a form the broker refuses (a refused record fails the whole transaction).

Start-up checks (``check_producer_limits`` when the config loads, ``check_dead_letter_topic`` when the
worker starts); errors name the keys:

- error: ``kafka.producer.message.max.bytes`` set below ``M + DEAD_LETTER_HEADROOM`` (the worker's own
  config then forbids it to dead-letter the messages it accepts);
- error: ``kafka.consumer.receive.message.max.bytes`` set below ``M + 512`` (a message of M bytes
  could not even be fetched);
- error: the dead-letter or predictions topic refuses the batches the producer builds
  (``min(P, kafka.producer.batch.size)`` + framing above its ``max.message.bytes``: lower batch.size);
- error: the dead-letter topic's limit leaves no room for a dead letter's headers (below
  ``MIN_DEAD_LETTER_BYTES``);
- warning: the dead-letter topic allows less than ``M + DEAD_LETTER_HEADROOM`` (the largest dead
  letters go as excerpts), or its limit cannot be read (excerpts are sized to P alone; a record the
  broker refuses is then counted in ``iolstream_dead_letters_dropped_total`` and skipped).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from iolstream.stream import codec

log = logging.getLogger("iolstream.worker")

DEAD_LETTER_HEADROOM = 8192  # above M for a dead letter's headers (≤ ~3 KB) and the record framing
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes and batch.size
KAFKA_TOPIC_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default max.message.bytes of a topic
MIN_DEAD_LETTER_BYTES = 8192  # a dead-letter limit below this leaves no room for the headers and an excerpt
RECEIVE_OVERHEAD = 512  # librdkafka: receive.message.max.bytes must exceed the fetch size by this much


def framing_bytes(limit: int) -> int:
    """Bytes of ``limit`` kept free for the record batch and record framing (~100 bytes) and for
    compression, which can grow incompressible data a little (lz4: 0.4 %): 1 KiB + 1 %."""
    return 1024 + limit // 100


def producer_message_max_bytes(max_message_bytes: int) -> int:
    """The producer's message.max.bytes the worker sets by default: a whole max-size dead letter fits."""
    return max(LIBRDKAFKA_MESSAGE_MAX_BYTES, max_message_bytes + DEAD_LETTER_HEADROOM)


def topic_configs(max_message_bytes: int, names) -> dict[str, dict[str, str]]:
    """``max.message.bytes`` for topics created for input or dead letters of up to ``max_message_bytes``:
    M + DEAD_LETTER_HEADROOM when that is above Kafka's default, else the broker's own default."""
    wanted = max_message_bytes + DEAD_LETTER_HEADROOM
    if wanted <= KAFKA_TOPIC_MAX_MESSAGE_BYTES:
        return {}
    return {name: {"max.message.bytes": str(wanted)} for name in names}


def create_topics(
    admin: AdminClient,
    names,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: dict[str, dict[str, str]] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create those of ``names`` that do not exist yet, each with ``configs.get(name)``; returns those created."""
    existing = set(admin.list_topics(timeout=timeout).topics)
    configs = configs or {}
    new = [
        NewTopic(name, partitions, replication_factor, config=dict(configs.get(name, {})))
        for name in dict.fromkeys(names)
        if name not in existing
    ]
    if not new:
        return []
    for _name, fut in admin.create_topics(new, operation_timeout=timeout).items():
        try:
            fut.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return [t.topic for t in new]


def describe_max_message_bytes(admin: AdminClient, topic: str, timeout: float = 10.0) -> int | None:
    """The topic's effective ``max.message.bytes`` (None: the topic does not exist or cannot be described)."""
    resource = ConfigResource("topic", topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout
        )
        return int(entries["max.message.bytes"].value)
    except (
        Exception
    ) as exc:  # KafkaException (no such topic, no permission), a timeout: the limit stays unknown
        log.debug("cannot read max.message.bytes of %s: %s", topic, exc)
        return None


def _int_setting(section: dict, key: str, where: str, default: int) -> tuple[int, bool]:
    """(value, explicitly set) of a librdkafka size setting; ValueError naming ``where.key`` if not an integer."""
    if key not in section:
        return default, False
    try:
        return int(section[key]), True
    except (TypeError, ValueError):
        raise ValueError(f"{where}.{key}: must be an integer, got {section[key]!r}") from None


def check_producer_limits(max_message_bytes: int, producer: dict, consumer: dict) -> None:
    """Refuse client settings that contradict ``stream.max_message_bytes`` (ValueError naming the keys)."""
    p, explicit = _int_setting(
        producer, "message.max.bytes", "kafka.producer", producer_message_max_bytes(max_message_bytes)
    )
    need = max_message_bytes + DEAD_LETTER_HEADROOM
    if explicit and p < need:
        raise ValueError(
            f"kafka.producer.message.max.bytes ({p}) is below stream.max_message_bytes ({max_message_bytes}) + "
            f"{DEAD_LETTER_HEADROOM} bytes for a dead letter's headers: a bad message of the largest accepted size "
            f"could not be dead-lettered whole; raise it to at least {need}, lower stream.max_message_bytes, "
            "or leave message.max.bytes out (the worker then sets it)"
        )
    receive, explicit = _int_setting(consumer, "receive.message.max.bytes", "kafka.consumer", 100_000_000)
    if explicit and receive < max_message_bytes + RECEIVE_OVERHEAD:
        raise ValueError(
            f"kafka.consumer.receive.message.max.bytes ({receive}) is below stream.max_message_bytes "
            f"({max_message_bytes}) + {RECEIVE_OVERHEAD}: a message of the largest accepted size could not be fetched"
        )


class DeadLetterLimit:
    """How large a dead letter the worker produces: ``min(P, D)`` less the framing.

    producer_bytes : the producer's message.max.bytes (P)
    topic_bytes    : the dead-letter topic's max.message.bytes (D), None while unknown
    """

    def __init__(
        self, producer_bytes: int, topic: str, topic_bytes: int | None = None, admin_conf: dict | None = None
    ):
        self.producer_bytes = producer_bytes
        self.topic = topic
        self.topic_bytes = topic_bytes
        self.admin_conf = admin_conf
        self.refresh_due = False  # the broker refused a dead letter: read the topic's limit again
        self.logged: set[tuple[str, str]] = set()
        self.counts = {
            "truncated": 0,
            "dropped": 0,
        }  # dead letters produced as excerpts / not produced at all

    @property
    def limit(self) -> int:
        return self.producer_bytes if self.topic_bytes is None else min(self.producer_bytes, self.topic_bytes)

    @property
    def source(self) -> str:
        if self.topic_bytes is not None and self.topic_bytes < self.producer_bytes:
            return f"max.message.bytes of topic {self.topic}"
        return "kafka.producer.message.max.bytes"

    def fit(
        self, value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[bytes, list[tuple[str, bytes]]] | None:
        """The dead letter as it is when it fits, else an excerpt that does; None if not even its headers fit."""
        budget = self.limit - framing_bytes(self.limit)
        why = f"value of {len(value)} bytes and its headers over the dead-letter limit of {self.limit} bytes ({self.source})"
        return codec.dead_letter_excerpt(value, headers, budget, why)

    def refused(self) -> None:
        """The broker refused a dead-letter batch (its limit was lowered since the start, or it could not be
        read): read the topic's limit again before the next dead letter."""
        self.refresh_due = True

    def refresh(self) -> None:
        """Read the topic's limit again after a refusal; if it cannot be read, assume half of the limit used so far
        (each refusal halves it, so a broker that keeps refusing ends with every dead letter dropped, not a loop)."""
        self.refresh_due = False
        now = (
            describe_max_message_bytes(AdminClient(self.admin_conf), self.topic, timeout=5.0)
            if self.admin_conf
            else None
        )
        self.topic_bytes = now if now is not None else self.limit // 2
        log.warning(
            "dead-letter topic %s refused a dead letter; its limit is now taken as %d bytes (%s): larger "
            "dead letters go as excerpts",
            self.topic,
            self.topic_bytes,
            "read from the broker" if now is not None else "a guess",
        )

    def note(self, kind: str, reason: str) -> bool:
        """Count a dead letter ``kind`` ("truncated" or "dropped"); True the first time ``(kind, reason)`` is seen:
        what is cut or dropped is logged once per kind and reason, however many messages follow."""
        self.counts[kind] += 1
        if (kind, reason) in self.logged:
            return False
        self.logged.add((kind, reason))
        return True


def producer_bytes(producer: dict) -> int:
    """The message.max.bytes the producer made from ``producer`` (kafka.producer) uses."""
    return int(producer.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))


def start_limit(cfg, admin_conf: dict) -> tuple[DeadLetterLimit, list[str]]:
    """The dead-letter limit at start, from the producer's settings and the output topics' limits read from
    the broker (ValueError naming the keys when they contradict, see the module docstring); and the warnings."""
    producer = cfg.kafka.producer
    admin = AdminClient(admin_conf)
    p = producer_bytes(producer)
    limit = DeadLetterLimit(
        p, cfg.topics.dead_letters, describe_max_message_bytes(admin, cfg.topics.dead_letters), admin_conf
    )
    batch = min(p, int(producer.get("batch.size", LIBRDKAFKA_MESSAGE_MAX_BYTES)))
    warnings = check_dead_letter_topic(
        limit,
        batch_bytes=batch,
        predictions_topic=cfg.topics.predictions,
        predictions_bytes=describe_max_message_bytes(admin, cfg.topics.predictions),
        max_message_bytes=cfg.stream.max_message_bytes,
    )
    return limit, warnings


def check_dead_letter_topic(
    limit: DeadLetterLimit,
    *,
    batch_bytes: int,
    predictions_topic: str,
    predictions_bytes: int | None,
    max_message_bytes: int,
) -> list[str]:
    """Refuse output topics that would refuse what the producer sends (ValueError naming the keys); return warnings.

    batch_bytes : the largest batch the producer builds, min(message.max.bytes, batch.size)
    """
    if limit.topic_bytes is not None and limit.topic_bytes < MIN_DEAD_LETTER_BYTES:
        raise ValueError(
            f"dead-letter topic {limit.topic} (topics.dead_letters) has max.message.bytes={limit.topic_bytes}: "
            f"no room for a dead letter's headers and an excerpt; raise it to at least {MIN_DEAD_LETTER_BYTES} "
            f"(to {max_message_bytes + DEAD_LETTER_HEADROOM} for whole dead letters up to stream.max_message_bytes)"
        )
    for topic, allowed in ((limit.topic, limit.topic_bytes), (predictions_topic, predictions_bytes)):
        if allowed is not None and batch_bytes + framing_bytes(batch_bytes) > allowed:
            room = allowed - framing_bytes(allowed)
            fix = (
                f"set kafka.producer.batch.size to at most {room}, or raise the topic's max.message.bytes"
                if room > 0
                else f"raise the topic's max.message.bytes to at least {batch_bytes + framing_bytes(batch_bytes)}"
            )
            raise ValueError(
                f"topic {topic} allows batches of max.message.bytes={allowed} bytes, but the producer builds batches of "
                f"up to {batch_bytes} bytes (the smaller of kafka.producer.message.max.bytes and kafka.producer.batch.size): "
                f"the broker would refuse them; {fix}"
            )
    warnings = []
    if limit.topic_bytes is None:
        warnings.append(
            f"cannot read max.message.bytes of the dead-letter topic {limit.topic} (topics.dead_letters): dead letters "
            f"are sized to kafka.producer.message.max.bytes ({limit.producer_bytes}); one the broker refuses is counted "
            "in iolstream_dead_letters_dropped_total and skipped (exactly-once: its transaction aborts first)"
        )
    elif limit.topic_bytes < max_message_bytes + DEAD_LETTER_HEADROOM:
        warnings.append(
            f"dead-letter topic {limit.topic} (topics.dead_letters) has max.message.bytes={limit.topic_bytes}, below "
            f"stream.max_message_bytes ({max_message_bytes}) + {DEAD_LETTER_HEADROOM}: dead letters over "
            f"{limit.limit - framing_bytes(limit.limit)} bytes (value and headers) go to it as excerpts"
        )
    return warnings
