"""Stand-ins for the Kafka clients and for group learning, for tests of the adapter without a broker.

Each fake writes what it is asked into one shared journal (a list), so that a test reads the order in which
the commit unit calls its collaborators: ``step``/``step(force)`` (the session), ``produce <topic>``,
``begin``, ``offsets``, ``commit``, ``abort``, ``poll``, ``flush`` (the producer), ``consumer.commit``
(at-least-once offsets), ``snapshot`` (a checkpoint written) and ``group.<hook>`` (group learning's part).
The clients here are only ever fakes of what the adapter calls; integration tests use a real broker.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, TopicPartition

from iolstream.kafka.assignment import Assignment
from iolstream.kafka.calls import ClientCalls
from iolstream.kafka.checkpoints import Checkpointer
from iolstream.kafka.commit import CommitUnit, delivery_mode
from iolstream.kafka.offsets import OffsetBook
from iolstream.kafka.participant import Solo
from iolstream.kafka.session import Session
from iolstream.kafka.stopping import Stopping
from iolstream.stream.align import Aligner


class FakeProducer:
    """Records the producer calls in ``calls``; ``commit_errors`` are raised by successive commits."""

    def __init__(self, commit_errors=(), calls: list | None = None):
        self.calls = [] if calls is None else calls
        self.commit_errors = list(commit_errors)

    def begin_transaction(self):
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets, group, timeout):
        self.calls.append(("offsets", [(tp.topic, tp.partition, tp.offset) for tp in offsets]))

    def commit_transaction(self, timeout):
        self.calls.append("commit")
        if self.commit_errors:
            raise KafkaException(self.commit_errors.pop(0))

    def abort_transaction(self, timeout):
        self.calls.append("abort")

    def produce(self, topic, value, key=None, headers=None, **kw):
        self.calls.append(f"produce {topic}")

    def poll(self, timeout):
        self.calls.append("poll")
        return 0

    def flush(self, timeout):
        self.calls.append("flush")
        return 0


class FakeConsumer:
    """The group's committed offsets ``committed``; seeks and commits recorded (``seeks``; ``calls``)."""

    def __init__(self, committed: dict, calls: list | None = None):
        self.committed_offsets = committed
        self.seeks = []
        self.calls = [] if calls is None else calls

    def consumer_group_metadata(self):
        return "group-metadata"

    def committed(self, tps, timeout):
        return [
            TopicPartition(
                tp.topic, tp.partition, self.committed_offsets.get((tp.topic, tp.partition), -1001)
            )
            for tp in tps
        ]

    def seek(self, tp):
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def resume(self, tps):
        pass

    def commit(self, offsets, asynchronous):
        self.calls.append(("consumer.commit", [(tp.topic, tp.partition, tp.offset) for tp in offsets]))
        return offsets


class FakeMessage:
    """A consumed message of partition 0: topic, offset, value, a create time of ``1000 + offset`` ms, no key."""

    def __init__(self, topic: str, offset: int, value: bytes):
        self._topic, self._offset, self._value = topic, offset, value

    def error(self):
        return None

    def topic(self):
        return self._topic

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def value(self):
        return self._value

    def key(self):
        return None

    def timestamp(self):
        return (1, 1000 + self._offset)  # TIMESTAMP_CREATE_TIME


class FeedingConsumer(FakeConsumer):
    """A consumer whose fetched messages are ``queue`` (``send`` appends one): ``consume`` hands them out in
    order, ``poll`` finds nothing more, and a partition's high watermark is what was sent to it."""

    def __init__(self, committed: dict | None = None, calls: list | None = None):
        super().__init__(committed or {}, calls)
        self.queue: list[FakeMessage] = []
        self.sent: dict[str, int] = {}

    def send(self, topic: str, value: bytes) -> None:
        self.queue.append(FakeMessage(topic, self.sent.get(topic, 0), value))
        self.sent[topic] = self.sent.get(topic, 0) + 1

    def consume(self, num_messages, timeout):
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def poll(self, timeout):
        return None

    def pause(self, tps):
        pass

    def get_watermark_offsets(self, tp, cached=True):
        return 0, self.sent.get(tp.topic, 0)

    def position(self, tps):
        return tps


class JournalSession(Session):
    """The session, its steps journaled."""

    def __init__(self, *args, journal: list, **kw):
        super().__init__(*args, **kw)
        self.journal = journal

    def step(self, now, *, force=False):
        self.journal.append("step(force)" if force else "step")
        super().step(now, force=force)


class JournalCheckpointer(Checkpointer):
    """The snapshot store, each snapshot written journaled."""

    def __init__(self, *args, journal: list, **kw):
        super().__init__(*args, **kw)
        self.journal = journal

    def write(self, *args, **kw):
        written = super().write(*args, **kw)
        if written:
            self.journal.append("snapshot")
        return written


class JournalGroup(Solo):
    """Group learning's part, each hook the commit unit calls journaled (``on_revoke`` steps, as a member's
    does)."""

    def __init__(self, journal: list):
        self.journal = journal

    def on_cycle(self, positions, *, replaying):
        self.journal.append("group.on_cycle")

    def before_checkpoint(self, positions, *, replaying):
        self.journal.append("group.before_checkpoint")

    def at_stop(self, timeout, tick):
        self.journal.append("group.at_stop")

    def on_revoke(self, partitions, positions, *, replaying, step, timeout, tick):
        self.journal.append("group.on_revoke")
        step()


def commit_unit(
    cfg, journal: list, *, group: Solo | None = None, committed: dict | None = None
) -> CommitUnit:
    """The commit unit of ``cfg``'s delivery mode over the real session, offset book, outputs, transactions,
    assignment and snapshot store, with a fake producer and consumer writing into ``journal``; the processor is
    the snapshot directory's newest (a fresh one if empty)."""
    mode = delivery_mode(cfg)
    output = mode.make_output(cfg)
    output.producer = FakeProducer(calls=journal)
    calls = ClientCalls()
    checkpoints = JournalCheckpointer(cfg, calls, journal=journal)
    loaded = checkpoints.load()
    book = OffsetBook(replay_committed=mode.replays_committed, positions=loaded.positions)
    session = JournalSession(loaded.processor, book, output, journal=journal)
    aligner = Aligner(100, 100, 2**20)
    unit = None
    assignment = Assignment(
        cfg,
        book,
        aligner,
        calls,
        before_revoke=lambda keys: unit.partitions_go(keys),
        stopping=lambda: False,
    )
    assignment.consumer = FakeConsumer(committed or {}, calls=journal)
    unit = mode(
        cfg,
        session=session,
        output=output,
        checkpoints=checkpoints,
        assignment=assignment,
        aligner=aligner,
        stopper=Stopping(cfg),
        group=JournalGroup(journal) if group is None else group,
        calls=calls,
        new_producer=lambda: FakeProducer(calls=journal),
        sleep=lambda seconds: None,
    )
    return unit


class FakeRecord:
    """A consumed record as GroupSync reads it: value, headers, partition 0, offset."""

    def __init__(self, value: bytes, headers, offset: int = 7):
        self._value, self._headers, self._offset = value, headers, offset

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def partition(self):
        return 0

    def offset(self):
        return self._offset
