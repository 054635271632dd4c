"""The Kafka part of ``iolstream produce``: one idempotent producer sends a plan (id as key, optional rate
limit, event time stamped when a features message goes out), missing topics are created, and before
anything is sent ``preflight`` checks that the broker answers and the topics exist. A cluster problem is
one line (``kafka.diagnose``), never a traceback: exit 6 when the broker refused us (authentication, TLS trust,
a missing ACL), else 3.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable

from iolstream.kafka.clients import LOGGER
from iolstream.tools.plan import Message, plan_summary

EXIT_CLUSTER = 3  # the broker cannot be reached or lacks a topic (2: bad arguments or data)
EXIT_ACCESS = 6  # the broker refused us: authentication, TLS trust, a missing ACL (ops.lifecycle.EXIT_ACCESS)
CONNECT_SECONDS = 10.0  # the broker must answer a metadata request within this before anything is sent


class SendFailed(RuntimeError):
    """Messages the cluster did not take; the message is one line naming why (``kafka.diagnose``), and
    ``exit_code`` says whether the broker refused us (6) or another cluster problem stopped us (3)."""

    def __init__(self, line: str, refused: bool | None = None):
        super().__init__(line)
        self.exit_code = (
            EXIT_ACCESS if (getattr(line, "refusal", False) if refused is None else refused) else 3
        )


def send(
    messages: Iterable[Message],
    *,
    producer_conf: dict,
    features_topic: str,
    labels_topic: str,
    rate: float | None = None,
    label_delay_seconds: float = 0.0,
    progress=None,
    stop: threading.Event | None = None,
    flush_seconds: float = 60.0,
) -> dict:
    """Send a plan with one idempotent producer; ``rate`` in feature rows/s (None: as fast as
    possible). ``progress(rows_sent)`` is called after every features message; ``flush_seconds``: how long
    the last deliveries may take once everything is produced. Returns the plan summary of what was sent,
    plus "seconds". Raises SendFailed on delivery errors."""
    from confluent_kafka import KafkaException, Producer

    from iolstream.kafka import diagnose, stalled_output
    from iolstream.kafka.reported_refusals import Refusals

    # a producer that stopped delivering to a partition while the broker answers (kafka.stalled_output): its
    # messages are taken back and sent again through a new one
    stall = stalled_output.StallWatch()
    seen = diagnose.Collector(forward=stall.tee(logging.getLogger(LOGGER)))
    refusals = Refusals(producer_conf)  # the first refusal stops the send (exit 6)

    def on_error(err) -> None:
        seen.error(err)
        refusals.note(err)

    conf = {"linger.ms": 5, "enable.idempotence": True, **producer_conf, **seen.conf(), "error_cb": on_error}
    producer = Producer(conf)
    errors: list = []  # (error, topic) of the failed deliveries
    produced = 0  # messages given to the current producer
    taking: list | None = None  # while a stalled producer is purged: what its delivery reports hand back

    def on_delivery(err, msg):
        if taking is not None and (record := stalled_output.taken_back(err, msg)) is not None:
            taking.append(record)
            return
        if err is not None:
            errors.append((err, msg.topic()))
            refusals.note(err, topics=(msg.topic(),))

    def refused() -> None:
        if refusals.first is not None:
            producer.purge()
            raise SendFailed(refusals.first)

    started = time.monotonic()
    delayed: deque[tuple[float, Message]] = deque()
    summary = plan_summary([])
    rows_sent = 0

    def send_one(topic: str, value: bytes, key, headers=None, partition: int = -1) -> None:
        nonlocal produced
        extra = {} if partition < 0 else {"partition": partition}
        if headers:
            extra["headers"] = headers
        while True:
            try:
                producer.produce(topic, value, key=key, on_delivery=on_delivery, **extra)
                produced += 1
                return
            except BufferError:  # local queue full: let librdkafka drain it
                producer.poll(0.05)

    probe = None  # the client that asks, made on first need and kept for the rest of the send

    def answers() -> bool:
        """Whether the broker answers a client of its own (not the producer under suspicion, whose view of the
        cluster is what is in doubt)."""
        nonlocal probe
        if probe is None:
            probe = Producer({**producer_conf, **diagnose.Collector().conf()})
        try:
            return bool(probe.list_topics(timeout=2.0).brokers)
        except KafkaException:
            return False

    def resend_stalled() -> None:
        """The producer stalled: purge it, its reports handing back what it held, and send that again."""
        nonlocal producer, produced, taking
        taken, taking = [], []
        try:
            left = stalled_output.purge(producer)
        finally:
            taken, taking = taking, None
        producer, produced = Producer(conf), 0
        stall.reset()
        for record in taken:
            send_one(*record)
        stalled_output.report_resent(logging.getLogger(LOGGER), len(taken), left)

    def produce(m: Message) -> None:
        topic = features_topic if m.kind == "features" else labels_topic
        send_one(topic, m.encode(int(time.time() * 1000)), m.key)
        summary[f"{'feature' if m.kind == 'features' else 'label'}_messages"] += 1
        summary[f"{'feature' if m.kind == 'features' else 'label'}_rows"] += m.rows

    for m in messages:
        if stop is not None and stop.is_set():
            break
        if rate:
            wait = started + m.due_row / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        while delayed and delayed[0][0] <= time.monotonic():
            produce(delayed.popleft()[1])
        if m.kind == "labels" and label_delay_seconds > 0:
            delayed.append((time.monotonic() + label_delay_seconds, m))
        else:
            produce(m)
        if m.kind == "features":
            rows_sent += m.rows
            if progress is not None:
                progress(rows_sent)
        producer.poll(0)
        refused()
    while delayed and not (stop is not None and stop.is_set()):
        due, m = delayed.popleft()
        time.sleep(max(0.0, due - time.monotonic()))
        produce(m)
    deadline = time.monotonic() + flush_seconds
    try:
        while (remaining := producer.flush(0.5)) and time.monotonic() < deadline:
            refused()
            if stall.suspect and stall.stalled(produced, remaining, answers(), time.monotonic()):
                resend_stalled()
    except KafkaException as exc:  # a fatal producer error
        errors.append((exc.args[0], None))
        remaining = len(producer)
    refused()
    if remaining or errors:
        first, topic = errors[0] if errors else (diagnose.best(seen.errors) or "delivery timed out", None)
        why = diagnose.explain(
            first,
            producer_conf,
            operation="Write",
            resource=topic and diagnose.named("topic", topic),
            seen=seen.errors,
        )
        failed = remaining + sum(1 for _, topic in errors if topic is not None)
        raise SendFailed(f"{failed} messages not delivered: {why}", why.refusal)
    return {**summary, "seconds": time.monotonic() - started}


def create_topics(
    admin_conf: dict,
    names: list[str],
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    timeout: float = 30.0,
    sized=(),
    max_message_bytes: int | None = None,
) -> list[str]:
    """Create the topics of ``names`` that do not exist yet; returns those created (``topics.create_topics``,
    which the worker uses too). Those also in ``sized`` (input and dead letters) get a ``max.message.bytes``
    that fits messages of ``max_message_bytes`` (default: the worker's default stream.max_message_bytes)
    when that is above Kafka's default."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from iolstream.kafka import diagnose, message_limits, topics
    from iolstream.kafka.clients import logged
    from iolstream.stream.config import StreamConfig

    limit = StreamConfig.max_message_bytes if max_message_bytes is None else max_message_bytes
    try:
        return topics.create_topics(
            AdminClient(logged(admin_conf)),
            names,
            partitions=partitions,
            replication_factor=replication_factor,
            configs=message_limits.topic_configs(limit, sized),
            timeout=timeout,
        )
    except KafkaException as exc:
        resource = diagnose.named("topic", *names)
        raise SendFailed(diagnose.explain(exc, admin_conf, operation="Create", resource=resource)) from None


def preflight(
    conf: dict,
    topic_names: list[str],
    create: bool,
    timeout: float = CONNECT_SECONDS,
    operations: dict[str, str] | None = None,
) -> str | None:
    """Why nothing can be sent (one line, a ``diagnose.Explanation`` when Kafka said why), or None: the broker at
    ``conf`` answers within ``timeout`` and each of ``topic_names`` exists (or will be created, ``create``) and
    the principal has its operation of ``operations`` (default Write) on it."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    from iolstream.kafka import diagnose

    meta, why = diagnose.probe(conf, timeout)
    if why is not None:
        return why
    seen = diagnose.Collector()
    admin = AdminClient({**conf, **seen.conf()})
    futures = admin.describe_topics(
        TopicCollection(list(topic_names)), include_authorized_operations=True, request_timeout=timeout
    )
    for name in topic_names:
        operation = (operations or {}).get(name, "Write")
        resource = diagnose.named("topic", name)
        try:
            found = futures[name].result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                if create:
                    continue
                return f"topic {name} does not exist at {conf['bootstrap.servers']}: create it, or pass --create-topics"
            return diagnose.explain(exc, conf, operation=operation, resource=resource, seen=seen.errors)
        allowed = found.authorized_operations
        if allowed is not None and not {operation.upper(), "ALL"} & {op.name for op in allowed}:
            err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
            return diagnose.explain(err, conf, operation=operation, resource=resource)
    return None


SEEN_SCAN_MESSAGES = 20_000  # at most this many of the features topic's newest messages are read for ids
SEEN_SCAN_SECONDS = 5.0


def message_ids(value, key: bytes | None, shape=None) -> list[str]:
    """The row ids a features message carries, as text: an array message's ``id``/``ids``, or (``shape``) each
    named-field event's id field (a dotted path), or the message key (``id_from_key``).

        >>> from iolstream.tools.plan import EventShape
        >>> message_ids({"ids": ["r0", "r1"], "x": [[1], [2]]}, None)
        ['r0', 'r1']
        >>> message_ids([{"meta": {"oid": "o-1"}}, {"meta": {"oid": 7}}], None, EventShape(id_field="meta.oid"))
        ['o-1', '7']
    """
    if shape is None:
        if not isinstance(value, dict):
            return []
        got = value.get("ids") if isinstance(value.get("ids"), list) else [value.get("id")]
        return [i for i in got if isinstance(i, str)]
    if shape.id_from_key:
        return [key.decode("utf-8", "replace")] if key else []
    out = []
    for event in value if isinstance(value, list) else [value]:
        node = event
        for part in shape.id_field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) or (isinstance(node, int) and not isinstance(node, bool)):
            out.append(str(node))
    return out


def ids_sent_before(
    conf: dict,
    topic: str,
    ids: list[str],
    *,
    messages: int = SEEN_SCAN_MESSAGES,
    seconds: float = SEEN_SCAN_SECONDS,
    shape=None,
) -> tuple[int, int]:
    """(how many of ``ids`` are in the features ``topic`` already, how many messages were read): its newest
    ``messages`` messages (spread over its partitions), for at most ``seconds``. A worker refuses a row whose id
    it has seen (``duplicate_id``); a replay of the same data set sends the same ids unless ``--id-prefix``
    changes them. ``shape`` (``plan.EventShape``): the messages are named-field events, their id under its
    field (or the message key); else array messages. Best effort: (0, 0) when the topic cannot be read."""
    import orjson
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from iolstream.kafka.clients import logged

    wanted = set(ids)
    consumer = Consumer(
        logged({"group.id": f"iolstream-produce-scan-{time.time_ns()}", "enable.auto.commit": False, **conf})
    )
    try:
        meta = consumer.list_topics(topic, timeout=seconds)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return 0, 0
        share = max(1, messages // len(found.partitions))
        ends, assign = {}, []
        for p in found.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=seconds)
            if high > low:
                ends[p] = high
                assign.append(TopicPartition(topic, p, max(low, high - share)))
        if not assign:
            return 0, 0
        consumer.assign(assign)
        seen, read, deadline = set(), 0, time.monotonic() + seconds
        done: set[int] = set()
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is not None:
                    continue
                read += 1
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
                try:
                    value = orjson.loads(msg.value())
                except (orjson.JSONDecodeError, TypeError):
                    continue
                seen.update(i for i in message_ids(value, msg.key(), shape) if i in wanted)
        return len(seen), read
    except KafkaException:
        return 0, 0
    finally:
        consumer.close()
