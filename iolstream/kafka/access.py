"""What a worker needs of its cluster, asked before its first run (``iolstream check``): its topics exist
or can be created, the features and labels topics have the same partition count, and its principal may
do what the worker does. Every probe writes nothing into a user topic:

    topics               metadata; a missing one: CreateTopics with validate_only (nothing is created)
    read the inputs      the topics' authorised operations (DescribeTopics), READ
    the group            its committed offsets (OffsetFetch) and its authorised operations, READ
    write the outputs    the topics' authorised operations, WRITE
    dead-letter configs  DescribeConfigs of the dead-letter topic (the worker reads its max.message.bytes)
    transactional id     exactly-once: init_transactions, only while no member of the group is running
                         (it would fence a running worker that uses the id)

Each finding is a ``Finding``: ``ok`` or not, what was checked, one line (``diagnose``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
)
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource, NewTopic

from iolstream.kafka import diagnose
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.security_errors import AccessDenied, explain

TIMEOUT = 10.0


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    line: str
    warning: bool = False  # ok, but worth a look (a probe that had to be skipped)


class Access:
    """The probes of one worker config against its cluster; ``conf``: the client settings (address, security)."""

    def __init__(self, cfg: WorkerConfig, conf: dict, metadata, timeout: float = TIMEOUT):
        self.cfg = cfg
        self.conf = conf
        self.meta = metadata
        self.timeout = timeout
        self.seen = diagnose.Collector()
        self.admin = AdminClient({**conf, **self.seen.conf()})
        self.address = conf.get("bootstrap.servers")

    def explain(self, err, operation: str, resource: str) -> str:
        self.admin.poll(0)
        return diagnose.explain(err, self.conf, operation=operation, resource=resource, seen=self.seen.errors)

    # ------------------------------------------------------------------ topics
    def topics(self) -> dict[str, str]:
        """{topic: its configuration key} of the topics this worker uses."""
        t = self.cfg.topics
        names = {
            t.features: "topics.features",
            t.labels: "topics.labels",
            t.predictions: "topics.predictions",
            t.dead_letters: "topics.dead_letters",
        }
        if self.cfg.group.enabled:
            names[t.model_deltas] = "topics.model_deltas"
        return names

    def partitions(self, topic: str) -> int | None:
        """The partition count the topic has, or will have when the worker creates it (None: neither)."""
        found = self.meta.topics.get(topic)
        if found is not None and found.error is None:
            return len(found.partitions)
        if found is None and self.cfg.topics.create:
            return 1 if topic == self.cfg.topics.model_deltas else self.cfg.topics.partitions
        return None

    def check_topics(self) -> list[Finding]:
        out = []
        for topic, key in self.topics().items():
            found = self.meta.topics.get(topic)
            what = f"topic {topic} ({key})"
            if found is not None and found.error is not None:
                out.append(Finding(False, what, self.explain(found.error, "describe", f"topic {topic}")))
            elif found is not None:
                out.append(Finding(True, what, f"exists, {_partitions(len(found.partitions))}"))
            elif not self.cfg.topics.create:
                out.append(
                    Finding(False, what, f"does not exist at {self.address}, and topics.create is false")
                )
            else:
                out.append(self._can_create(topic, what))
        return out

    def _can_create(self, topic: str, what: str) -> Finding:
        t = self.cfg.topics
        new = NewTopic(topic, self.partitions(topic), t.replication_factor)
        try:
            self.admin.create_topics([new], validate_only=True, request_timeout=self.timeout)[topic].result(
                self.timeout
            )
        except KafkaException as exc:
            return Finding(False, what, self.explain(exc, "create", f"topic {topic}"))
        return Finding(
            True, what, f"does not exist yet; the worker creates it ({_partitions(new.num_partitions)})"
        )

    def check_partition_counts(self) -> Finding:
        t = self.cfg.topics
        f, lab = self.partitions(t.features), self.partitions(t.labels)
        what = "partition counts"
        if f is None or lab is None or f == lab:
            return Finding(
                True, what, f"features and labels: {_partitions(f) if f == lab else 'not known yet'}"
            )
        return Finding(
            False,
            what,
            f"features topic {t.features} has {_partitions(f)}, labels topic {t.labels} has {lab}: a row and its "
            "label must meet in the same partition number; give both topics the same count",
        )

    # ------------------------------------------------------------------ permissions
    def check_operations(self) -> list[Finding]:
        """READ on the inputs (and model deltas), WRITE on the outputs (and model deltas), from the operations the
        broker says the principal has on each existing topic."""
        t = self.cfg.topics
        wanted = {
            t.features: ["READ"],
            t.labels: ["READ"],
            t.predictions: ["WRITE"],
            t.dead_letters: ["WRITE"],
        }
        if self.cfg.group.enabled:
            wanted[t.model_deltas] = ["READ", "WRITE"]
        existing = [n for n in wanted if n in self.meta.topics and self.meta.topics[n].error is None]
        if not existing:
            return []
        futures = self.admin.describe_topics(
            TopicCollection(existing), include_authorized_operations=True, request_timeout=self.timeout
        )
        out = []
        for topic in existing:
            what = f"access to topic {topic}"
            try:
                allowed = futures[topic].result(self.timeout).authorized_operations
            except KafkaException as exc:
                out.append(Finding(False, what, self.explain(exc, "describe", f"topic {topic}")))
                continue
            if allowed is None:
                out.append(Finding(True, what, "the broker does not report operations; not checked", True))
                continue
            names = {op.name for op in allowed}
            missing = [op for op in wanted[topic] if op not in names and AclOperation.ALL.name not in names]
            if missing:
                err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
                ops = " and ".join(op.lower() for op in missing)
                out.append(Finding(False, what, self.explain(err, ops, f"topic {topic}")))
            else:
                out.append(Finding(True, what, " and ".join(op.lower() for op in wanted[topic])))
        return out

    def check_dead_letter_configs(self) -> Finding:
        topic = self.cfg.topics.dead_letters
        what = f"configs of {topic} (topics.dead_letters)"
        if topic not in self.meta.topics:
            return Finding(
                True, what, "not checked: the topic does not exist yet (the worker creates it)", True
            )
        resource = ConfigResource("topic", topic)
        try:
            entries = self.admin.describe_configs([resource], request_timeout=self.timeout)[resource].result(
                self.timeout
            )
        except KafkaException as exc:
            return Finding(False, what, self.explain(exc, "describe the configs of", f"topic {topic}"))
        return Finding(True, what, f"max.message.bytes={entries['max.message.bytes'].value}")

    def describe_group(self, with_operations: bool = False):
        """The consumer group's description (its members, and with ``with_operations`` what the principal may do
        on it); KafkaException when it cannot be had. The coordinator may not be known at the first call."""
        group = self.cfg.kafka.group_id
        for attempt in range(3):
            futures = self.admin.describe_consumer_groups(
                [group], include_authorized_operations=with_operations, request_timeout=self.timeout
            )
            try:
                return futures[group].result(self.timeout)
            except KafkaException as exc:
                retriable = exc.args[0].code() in (
                    KafkaError.NOT_COORDINATOR,
                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                )
                if not retriable or attempt == 2:
                    raise
                time.sleep(1.0)

    def check_group(self) -> Finding:
        group = self.cfg.kafka.group_id
        what = f"group {group} (kafka.group_id)"
        request = [ConsumerGroupTopicPartitions(group)]
        try:
            self.admin.list_consumer_group_offsets(request, request_timeout=self.timeout)[group].result(
                self.timeout
            )
        except KafkaException as exc:
            return Finding(False, what, self.explain(exc, "read the committed offsets of", f"group {group}"))
        try:
            found = self.describe_group(with_operations=True)
        except KafkaException as exc:
            return Finding(False, what, self.explain(exc, "describe", f"group {group}"))
        names = {op.name for op in (found.authorized_operations or [])}
        if found.authorized_operations is not None and not names & {"READ", "ALL"}:
            err = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
            return Finding(False, what, self.explain(err, "read (join and commit to)", f"group {group}"))
        return Finding(True, what, f"read; {len(found.members)} members running now")

    def check_transactional_id(self) -> Finding | None:
        """Exactly-once only: init_transactions with the worker's transactional id, unless a worker may be using it."""
        if not self.cfg.durability.exactly_once:
            return None
        tid = self.cfg.transactional_id
        what = f"transactional id {tid} (durability.transactional_id)"
        try:
            members = len(self.describe_group().members)
        except KafkaException:
            members = None
        if members != 0:
            why = (
                "cannot tell whether a worker uses it" if members is None else f"{members} group members run"
            )
            return Finding(
                True, what, f"not probed: {why}, and init_transactions would fence a running worker", True
            )
        seen = diagnose.Collector()
        producer = Producer({**self.conf, **seen.conf(), "transactional.id": tid})
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            producer.poll(0)
            line = diagnose.explain(
                exc, self.conf, operation="use", resource=f"transactional id {tid}", seen=seen.errors
            )
            return Finding(False, what, line)
        return Finding(True, what, "init_transactions accepted (no transaction begun)")

    def all(self) -> list[Finding]:
        """Every probe, in the order a reader fixes things."""
        out = self.check_topics()
        out.append(self.check_partition_counts())
        out += self.check_operations()
        out.append(self.check_dead_letter_configs())
        out.append(self.check_group())
        txn = self.check_transactional_id()
        return out + ([txn] if txn is not None else [])


def _partitions(n: int) -> str:
    return f"{n} partition{'s' * (n != 1)}"


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
