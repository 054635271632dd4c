"""The message size limits the clients and topics must agree on: the producer's ``message.max.bytes`` made
from ``stream.max_message_bytes``, the ``max.message.bytes`` of created topics, a topic's limit read from the
broker, and the start-up checks of the client settings. The dead-letter path sized from these limits is
``kafka.deadletters``; the topics are created by ``kafka.topics``.
"""

from __future__ import annotations

import logging

from confluent_kafka.admin import AdminClient, ConfigResource

log = logging.getLogger("iolstream.worker")

DEAD_LETTER_HEADROOM = 8192  # above M for a dead letter's headers (≤ ~3 KB) and the record framing
DELTA_HEADROOM = 4096  # above group.chunk_bytes for a model-deltas record's key, headers and framing
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes and batch.size
KAFKA_TOPIC_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default max.message.bytes of a topic
MIN_DEAD_LETTER_BYTES = 8192  # a dead-letter limit below this leaves no room for the headers and an excerpt
RECEIVE_OVERHEAD = 512  # librdkafka: receive.message.max.bytes must exceed the fetch size by this much


def framing_bytes(limit: int, compressed: bool = True) -> int:
    """Bytes of ``limit`` kept free for the record batch and record framing (~100 bytes: 1 KiB kept) and, when
    the producer compresses, for compression, which can grow incompressible data a little (lz4: 0.4 %): 1 %
    more. Uncompressed (librdkafka's default), a dead letter of M bytes and its headers then fits M + 8,192."""
    return 1024 + (limit // 100 if compressed else 0)


def compresses(producer: dict) -> bool:
    """Whether the producer settings compress record batches (``compression.type``, or its alias
    ``compression.codec``; librdkafka's default is none)."""
    value = producer.get("compression.type", producer.get("compression.codec", "none"))
    return str(value).strip().lower() not in ("none", "")


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
    """(value, explicitly set) of a librdkafka size setting; ValueError naming ``where.key`` if not an
    integer."""
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
