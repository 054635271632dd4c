"""The access probes: what a worker needs of its cluster, asked before it uses it: by ``iolstream check`` before a first run
(``Access.all``), and by the worker itself at start (``startup``: the same probes of its topics, their configs
and its groups), so that a refusal stops the worker with the very line ``check`` prints. The ACLs probed
are those of ``kafka.required_acls.worker_acls``. Every probe writes nothing into a user topic:

    topics               DescribeTopics with the principal's authorised operations: each topic exists (a
                         missing one: CreateTopics with validate_only when topics.create is on, nothing
                         created) and the principal may Read the inputs and Write the outputs
    partition counts     the features and labels topics have the same (at start: a group refuses to run
                         without, a single worker warns)
    output configs       DescribeConfigs of the predictions and dead-letter topics (their max.message.bytes;
                         a worker refused it runs without knowing the limits: a warning)
    the groups           its description (DescribeGroups) and Read on it (the principal's authorised
                         operations); group learning: also Read on the member's deltas group
    transactional id     exactly-once: init_transactions, only while no member of the group is running
                         (it would fence a running worker that uses the id)

Each finding is a ``Finding``: ``ok`` or not, what was checked, one line (``diagnose``); ``refused`` when the
line is a refusal (exit 6), else a failed finding is a cluster problem (exit 3).
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from iolstream.kafka import diagnose
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import AccessDenied, WorkerError
from iolstream.kafka.required_acls import worker_acls

TIMEOUT = 10.0


@dataclass(frozen=True)
class Finding:
    """One line of ``iolstream check``: whether it passed, what was checked, and what to print."""

    ok: bool
    what: str
    line: str
    warning: bool = False  # ok, but worth a look (a probe that had to be skipped, an ACL the worker can lack)
    missing: bool = False  # a topic that does not exist, topics.create being false

    @property
    def refused(self) -> bool:
        """A failed finding the broker's refusal explains (authentication, TLS trust, a missing ACL)."""
        return not self.ok and getattr(self.line, "refusal", False)


class Access:
    """The probes of one worker config against its cluster; ``conf``: the client settings (address, security)."""

    def __init__(self, cfg: WorkerConfig, conf: dict, timeout: float = TIMEOUT):
        self.cfg = cfg
        self.conf = conf
        self.timeout = timeout
        self.seen = diagnose.Collector()
        self.admin = AdminClient({**conf, **self.seen.conf()})
        self.address = conf.get("bootstrap.servers")
        self._found: dict | None = None

    def explain(self, err, operation: str, resource: str) -> diagnose.Explanation:
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
        if t.forget:
            names[t.forget] = "topics.forget"
            names[t.forget_receipts] = "topics.forget_receipts"
        return names

    def wanted(self, topic: str) -> list[str]:
        """The operations the worker's ACL list grants on ``topic`` that using it needs (Read, Write)."""
        return [
            a.operation
            for a in worker_acls(self.cfg)
            if a.resource == "topic" and a.name == topic and a.operation in ("Read", "Write")
        ]

    def found(self) -> dict:
        """{topic: its TopicDescription, or the KafkaError describing it gave} (asked once)."""
        if self._found is None:
            names = list(self.topics())
            futures = self.admin.describe_topics(
                TopicCollection(names), include_authorized_operations=True, request_timeout=self.timeout
            )
            self._found = {}
            for name in names:
                try:
                    self._found[name] = futures[name].result(self.timeout)
                except KafkaException as exc:
                    self._found[name] = exc.args[0]
        return self._found

    def topic_ids(self) -> dict[str, str]:
        """{topic: its id} of the topics that exist: a topic deleted and created again under the same name has
        another id, and offsets of the old one mean nothing in it."""
        return {
            name: str(found.topic_id)
            for name, found in self.found().items()
            if not isinstance(found, KafkaError) and getattr(found, "topic_id", None) is not None
        }

    def partitions(self, topic: str) -> int | None:
        """The partition count the topic has, or will have when the worker creates it (None: neither)."""
        found = self.found().get(topic)
        if found is not None and not isinstance(found, KafkaError):
            return len(found.partitions)
        if _missing(found) and self.cfg.topics.create:
            return 1 if topic == self.cfg.topics.model_deltas else self.cfg.topics.partitions
        return None

    def check_topics(self) -> list[Finding]:
        out = []
        for topic, key in self.topics().items():
            found, what = self.found()[topic], f"topic {topic} ({key})"
            ops = self.wanted(topic)
            resource = diagnose.named("topic", topic)
            if _missing(found):
                if self.cfg.topics.create:
                    out.append(self._can_create(topic, what))
                else:
                    line = (
                        f"does not exist at {self.address}, and topics.create is false: create it (iolstream topics "
                        "-c CONFIG prints the commands, --create runs them) or set topics.create: true"
                    )
                    out.append(Finding(False, what, line, missing=True))
            elif isinstance(found, KafkaError):  # refused: the principal may not even describe it
                out.append(
                    Finding(False, what, self.explain(found, " and ".join(ops) or "Describe", resource))
                )
            elif found.authorized_operations is None:
                line = f"exists, {_partitions(len(found.partitions))}; the broker does not report operations"
                out.append(Finding(True, what, line, True))
            else:
                names = {op.name for op in found.authorized_operations}
                missing = [op for op in ops if op.upper() not in names and "ALL" not in names]
                if missing:
                    err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
                    out.append(Finding(False, what, self.explain(err, " and ".join(missing), resource)))
                else:
                    may = f"; {' and '.join(ops)}" if ops else ""
                    out.append(Finding(True, what, f"exists, {_partitions(len(found.partitions))}{may}"))
        return out

    def _can_create(self, topic: str, what: str) -> Finding:
        t = self.cfg.topics
        new = NewTopic(topic, self.partitions(topic), t.replication_factor)
        try:
            self.admin.create_topics([new], validate_only=True, request_timeout=self.timeout)[topic].result(
                self.timeout
            )
        except KafkaException as exc:
            return Finding(False, what, self.explain(exc, "Create", diagnose.named("topic", topic)))
        return Finding(
            True, what, f"does not exist yet; the worker creates it ({_partitions(new.num_partitions)})"
        )

    def check_partition_counts(self) -> Finding:
        t = self.cfg.topics
        f, lab = self.partitions(t.features), self.partitions(t.labels)
        what = "partition counts"
        if f is None or lab is None:
            return Finding(True, what, "features and labels: not known (a topic is missing or refused)", True)
        if f != lab:
            return Finding(
                False,
                what,
                f"features topic {t.features} has {_partitions(f)}, labels topic {t.labels} has {lab}: a row and "
                "its label must meet in the same partition number; give both topics the same count",
            )
        forget = self.partitions(t.forget) if t.forget else None
        if forget is not None and forget != f:  # a request must reach its row's member
            return Finding(
                False,
                what,
                f"features topic {t.features} has {_partitions(f)}, forget topic {t.forget} has {forget}: a request "
                "must reach the partition number of its row; give both topics the same count",
            )
        return Finding(True, what, f"features and labels: {_partitions(f)}")

    def check_output_configs(self) -> list[Finding]:
        """DescribeConfigs of the output topics that exist (the worker reads their max.message.bytes at start)."""
        out = []
        for topic in (self.cfg.topics.predictions, self.cfg.topics.dead_letters):
            what = f"configs of {topic} ({self.topics()[topic]})"
            if isinstance(self.found().get(topic), KafkaError):
                continue  # missing, or refused: check_topics said so
            resource = ConfigResource("topic", topic)
            try:
                entries = self.admin.describe_configs([resource], request_timeout=self.timeout)[
                    resource
                ].result(self.timeout)
            except KafkaException as exc:
                line = self.explain(exc, "DescribeConfigs", diagnose.named("topic", topic))
                # the worker runs without them, not knowing the topic's size limit
                out.append(Finding(line.refusal, what, line, warning=line.refusal))
                continue
            out.append(Finding(True, what, f"max.message.bytes={entries['max.message.bytes'].value}"))
        return out

    # ------------------------------------------------------------------ groups
    def describe_group(self, group: str, with_operations: bool = False):
        """The consumer group's description (its members, and with ``with_operations`` what the principal may do
        on it); KafkaException when it cannot be had. The coordinator may not be known at the first call."""
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

    def check_group(self, group: str, key: str) -> Finding:
        what = f"group {group} ({key})"
        resource = diagnose.named("group", group)
        # Not OffsetFetch (list_consumer_group_offsets): for a group the cluster has not seen yet, librdkafka
        # may answer a NOT_COORDINATOR through a consumer-group handle an admin client does not have, and
        # crash the process. The group's description with the principal's operations says the same.
        try:
            found = self.describe_group(group, with_operations=True)
        except KafkaException as exc:  # Describe (implied by Read) refused, or the coordinator unknown
            return Finding(False, what, self.explain(exc, "Read", resource))
        names = {op.name for op in (found.authorized_operations or [])}
        if found.authorized_operations is not None and not names & {"READ", "ALL"}:
            err = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
            return Finding(False, what, self.explain(err, "Read", resource))
        return Finding(True, what, f"Read; {_members(found.members)}")

    def check_groups(self) -> list[Finding]:
        """The consumer group, and with group learning this member's deltas group (``kafka.group``)."""
        out = [self.check_group(self.cfg.kafka.group_id, "kafka.group_id")]
        if self.cfg.group.enabled:
            deltas = f"{self.cfg.kafka.group_id}.deltas.{self.cfg.member_id}"
            out.append(self.check_group(deltas, "group learning: <kafka.group_id>.deltas.<member_id>"))
        return out

    def check_transactional_id(self) -> Finding | None:
        """Exactly-once only: init_transactions with the worker's transactional id, unless a worker may be using it."""
        if not self.cfg.durability.exactly_once:
            return None
        tid = self.cfg.transactional_id
        what = f"transactional id {tid} (durability.transactional_id)"
        try:
            members = len(self.describe_group(self.cfg.kafka.group_id).members)
        except KafkaException:
            members = None
        if members != 0:
            why = (
                "cannot tell whether a worker uses it"
                if members is None
                else f"the group lists {members} member{'s' * (members != 1)}"
            )
            return Finding(
                True, what, f"not probed: {why}, and init_transactions would fence a running worker", True
            )
        seen = diagnose.Collector()
        producer = Producer({**self.conf, **seen.conf(), "transactional.id": tid})
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            try:
                producer.poll(0)  # the error callbacks queued meanwhile
            except KafkaException:  # a fatal error (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) raises here again
                pass
            resource = diagnose.named("transactional id", tid)
            line = diagnose.explain(exc, self.conf, operation="Write", resource=resource, seen=seen.errors)
            return Finding(False, what, line)
        return Finding(True, what, "init_transactions accepted (no transaction begun)")

    def at_start(self) -> list[Finding]:
        """The probes the worker makes at start (``startup``)."""
        return self.check_topics() + self.check_output_configs() + self.check_groups()

    def all(self) -> list[Finding]:
        """Every probe, in the order a reader fixes things."""
        out = self.check_topics()
        out.append(self.check_partition_counts())
        out += self.check_output_configs()
        out += self.check_groups()
        txn = self.check_transactional_id()
        return out + ([txn] if txn is not None else [])


def startup(cfg: WorkerConfig, conf: dict, log: logging.Logger, timeout: float = TIMEOUT) -> dict[str, str]:
    """At the worker's start, before any blocking call: ``check``'s probes of what it uses (``at_start``). The
    first refusal is raised as ``AccessDenied`` (exit 6), one the worker can run with is logged as a warning; a
    topic missing while topics.create is false is a ``WorkerError`` (exit 3, the line ``check`` prints). An
    unreachable broker is left to the worker, which meets it as before. What only using a resource shows (a
    transaction's outputs, the transactional id) its clients report (``reported_refusals.Refusals``). Returns the ids of
    the topics that exist (``Access.topic_ids``; none when the probes could not run)."""
    with no_collection():
        meta, why = diagnose.probe(conf, timeout)
        if why is not None:
            if why.refusal:
                raise AccessDenied(why)
            return {}
        access = Access(cfg, conf, timeout)
        findings = access.at_start()
        counts = access.check_partition_counts()
        ids = access.topic_ids()
    for finding in findings:
        if finding.refused:
            raise AccessDenied(finding.line)
    for finding in findings:
        if finding.missing:
            raise WorkerError(f"{finding.what}: {finding.line}")
        if finding.warning and getattr(finding.line, "refusal", False):
            log.warning("%s: %s", finding.what, finding.line, extra={"event": "access"})
    # a group routes a label to the member of its partition number: there it would never meet its row
    if not counts.ok:
        if cfg.group.enabled:
            raise WorkerError(f"{counts.what}: {counts.line}")
        log.warning(  # one worker holds every partition and joins a label to its row wherever they are
            "%s: %s (one worker joins them all the same; a group of workers would lose labels)",
            counts.what,
            counts.line,
            extra={"event": "access"},
        )
    return ids


def topic_ids(cfg: WorkerConfig, conf: dict, timeout: float = TIMEOUT) -> dict[str, str]:
    """{topic: id} of the worker's topics that exist (``Access.topic_ids``)."""
    with no_collection():
        return Access(cfg, conf, timeout).topic_ids()


@contextmanager
def no_collection():
    """No garbage collection while the probes run: librdkafka runs an admin result's Python callback on its own
    thread, and a collection started there that finalises an unreachable client (one a finished worker left
    in a reference cycle, in a process running several) destroys it from librdkafka's thread, which crashes
    the process (confluent-kafka-python pull request 2129). What is garbage is collected first, here."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _missing(found) -> bool:
    return isinstance(found, KafkaError) and found.code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
    )


def _members(members) -> str:
    """The group's members in words. A worker is a static member (group.instance.id): the broker lists it until
    session.timeout.ms after it stopped, so "listed" is not "running"."""
    if not members:
        return "no member listed (no worker of the group runs)"
    static = sum(1 for m in members if getattr(m, "group_instance_id", None))
    line = f"{len(members)} member{'s' * (len(members) != 1)} listed"
    if static:
        line += (
            f" ({static} static: a worker stays listed for session.timeout.ms, 45 s by default, after it stops, so "
            "one that just stopped still counts)"
        )
    return line


def _partitions(n: int) -> str:
    return f"{n} partition{'s' * (n != 1)}"
