"""Topic creation, one owner: the worker's topics as its config names them (``ensure_topics``, with
``topics.create: true``), and the one call every creator goes through (``create_topics``: the worker, the
model-deltas topic of group learning, ``iolstream produce --create-topics`` and ``iolstream topics --create``).
The model-deltas topic's settings are here too (``delta_topic_config``: compacted, records up to a chunk). The
``max.message.bytes`` a created topic gets is ``kafka.message_limits``'.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from iolstream.kafka import diagnose, message_limits
from iolstream.kafka.clients import client_conf
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import AccessDenied, WorkerError


def ensure_topics(cfg: WorkerConfig, admin: AdminClient | None = None, timeout: float = 30.0) -> list[str]:
    """Create missing topics with the configured partitions; returns the names created. The input and
    dead-letter topics get a max.message.bytes that fits stream.max_message_bytes (``message_limits.topic_configs``)."""
    admin = admin or AdminClient(client_conf(cfg))
    t = cfg.topics
    inputs = [t.features, t.labels, t.dead_letters] + ([t.forget] if t.forget else [])
    configs = message_limits.topic_configs(cfg.stream.max_message_bytes, inputs)
    names = [t.features, t.labels, t.predictions, t.dead_letters]
    if t.forget:  # forget requests keyed by id, as the labels are (a group's member holding the row gets it)
        names += [t.forget, t.forget_receipts]
    try:
        return create_topics(
            admin,
            names,
            partitions=t.partitions,
            replication_factor=t.replication_factor,
            configs=configs,
            timeout=timeout,
        )
    except KafkaException as exc:
        why = diagnose.explain(
            exc, client_conf(cfg), operation="Create", resource=diagnose.named("topic", *names)
        )
        if why.refusal:
            raise AccessDenied(why) from None
        raise WorkerError(f"{why} (topics.create: true; create them beforehand, or allow it)") from None


def delta_topic_config(chunk_bytes: int) -> dict[str, str]:
    """The model-deltas topic: compacted (the newest record per key is the group's state), records up to a
    chunk."""
    return {
        "cleanup.policy": "compact",
        "max.message.bytes": str(
            max(message_limits.KAFKA_TOPIC_MAX_MESSAGE_BYTES, chunk_bytes + message_limits.DELTA_HEADROOM)
        ),
        "segment.ms": "600000",  # compaction works on closed segments: close one every 10 minutes
        "min.cleanable.dirty.ratio": "0.1",
    }


def create_topics(
    admin: AdminClient,
    names,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: dict[str, dict[str, str]] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create those of ``names`` that do not exist yet, each with ``configs.get(name)``; returns those
    created."""
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
