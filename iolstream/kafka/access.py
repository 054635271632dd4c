"""Can this worker reach its broker and use its topics and group? Asked once at start, before any blocking call.

``problems(cfg)`` connects with the worker's ``kafka.client`` settings and returns one line per refusal
(``security_errors.explain``): authentication or TLS trust first (nothing else can be asked then), then each
topic the broker will not even describe to this principal (so it lacks the Read or Write the worker needs on
it) and the consumer group. ``probe(cfg)`` raises the first as ``AccessDenied`` (``iolstream run`` exits 6).
What only using a resource shows (Write on an output topic, Write on the transactional id, Create) is reported
by the running worker's clients (``security_errors.Refusals``).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.security_errors import AccessDenied, explain

# librdkafka's own lines of the probe's client (a refused login repeats at every retry) are dropped: what
# they say comes back as the probe's one line per refusal
_quiet = logging.getLogger("iolstream.kafka.access")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def problems(cfg: WorkerConfig, timeout: float = 15.0) -> list[str]:
    """Refusals met connecting, describing the worker's topics and its consumer group (module docstring).
    An unreachable broker is not a refusal: then this returns [] and the worker waits for it as usual."""
    client = dict(cfg.kafka.client)
    refused: list[str] = []

    def on_error(err: KafkaError) -> None:
        line = explain(err, client)
        if line is not None and line not in refused:
            refused.append(line)

    admin = AdminClient(
        {
            "bootstrap.servers": cfg.kafka.bootstrap_servers,
            **client,
            "error_cb": on_error,
            "logger": _quiet,
            "log_level": 3,
        }
    )
    deadline = time.monotonic() + timeout
    metadata = None
    while metadata is None and not refused and time.monotonic() < deadline:
        try:
            metadata = admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException:
            admin.poll(0.1)  # error callbacks
    admin.poll(0)
    if refused or metadata is None:
        return refused
    t = cfg.topics
    roles = [(t.features, "Read"), (t.labels, "Read"), (t.predictions, "Write"), (t.dead_letters, "Write")]
    if cfg.group.enabled:
        roles.append((t.model_deltas, "Read"))
    for topic, operation in roles:
        try:
            found = admin.list_topics(topic, timeout=max(1.0, deadline - time.monotonic())).topics.get(topic)
        except KafkaException:
            continue
        if found is not None and found.error is not None:
            # a topic that does not exist yet is refused alike unless Create is granted on it
            asked = f"{operation} or Create" if cfg.topics.create else operation
            line = explain(found.error, client, operation=asked, name=topic)
            if line is not None:
                refused.append(line)
    try:
        futures = admin.describe_consumer_groups(
            [cfg.kafka.group_id], request_timeout=min(5.0, max(1.0, deadline - time.monotonic()))
        )
        futures[cfg.kafka.group_id].result()
    except KafkaException as exc:
        line = explain(exc.args[0], client, operation="Read", name=cfg.kafka.group_id)
        if line is not None:
            refused.append(line)
    admin.poll(0)  # its last events served here, not purged with a log line when the client goes
    return refused


def probe(cfg: WorkerConfig, timeout: float = 15.0) -> None:
    """Raise the first of ``problems(cfg)`` as ``AccessDenied``."""
    found = problems(cfg, timeout)
    if found:
        raise AccessDenied(found[0])
