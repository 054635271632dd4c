"""A producer that stopped delivering while the broker answers (kafka.stalled_output, librdkafka issue #5430):
noticed only after librdkafka named a partition without a leader, and its outputs sent again, in order,
through a new producer, at-least-once. No broker: the stalled producer is a fake that holds what it is given."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError
from kafka_fakes import commit_unit
from test_commit_unit import _cfg

from iolstream.kafka.commit import AtLeastOnce
from iolstream.kafka.output import Output
from iolstream.kafka.stalled_output import STALL_SECONDS, StallWatch

LINE = (
    "METADATAUPDATE [rdkafka#producer-8] [thrd:main]: Partition p(xoGy0szaQNOkZcNTcqjtRg)[0]: "
    "new leader-1 not found in cache"
)


class Msg:
    def __init__(self, topic, value, key, headers, partition):
        self._fields = (topic, value, key, headers, partition)

    def topic(self):
        return self._fields[0]

    def value(self):
        return self._fields[1]

    def key(self):
        return self._fields[2]

    def headers(self):
        return self._fields[3]

    def partition(self):
        return self._fields[4]


class StuckProducer:
    """Holds every message it is given and delivers none; a purge fails them all (_PURGE_QUEUE), in order,
    through their own callback or the producer's (served by the next poll)."""

    def __init__(self, on_delivery):
        self.on_delivery = on_delivery
        self.held: list = []
        self.reports: list = []

    def produce(self, topic, value, key=None, headers=None, on_delivery=None, partition=-1):
        self.held.append((Msg(topic, value, key, headers, partition), on_delivery))

    def __len__(self):
        return len(self.held) + len(self.reports)

    def purge(self, in_queue=True, in_flight=True, blocking=True):
        self.reports, self.held = self.held, []

    def poll(self, timeout):
        served, self.reports = self.reports, []
        for msg, callback in served:
            (callback or self.on_delivery)(KafkaError(KafkaError._PURGE_QUEUE), msg)
        return len(served)

    def flush(self, timeout):
        return len(self)


class Delivering(StuckProducer):
    """A new producer: delivers at once (``held`` keeps what it was given, in order)."""

    def __len__(self):
        return 0


def test_the_watch_suspects_only_after_librdkafka_names_a_partition_without_a_leader():
    w = StallWatch()
    assert not w.stalled(produced=10, waiting=10, reachable=True, now=0.0)
    assert not w.stalled(produced=10, waiting=10, reachable=True, now=100.0)  # no such line: never
    w.note_log("METADATAUPDATE [rdkafka#producer-8] [thrd:main]: Partition p[0]: new leader2 not found")
    assert not w.suspect
    w.note_log(LINE)
    assert w.suspect


def test_the_watch_stalls_when_nothing_is_delivered_for_stall_seconds_while_the_broker_answers():
    w = StallWatch()
    w.note_log(LINE)
    assert not w.stalled(produced=10, waiting=10, reachable=True, now=0.0)  # the clock starts
    assert not w.stalled(produced=12, waiting=12, reachable=True, now=STALL_SECONDS - 0.1)  # more waiting
    assert w.stalled(produced=12, waiting=12, reachable=True, now=STALL_SECONDS)
    assert not w.stalled(produced=12, waiting=11, reachable=True, now=STALL_SECONDS + 1)  # one delivered
    assert not w.stalled(produced=12, waiting=11, reachable=False, now=3 * STALL_SECONDS)  # broker gone
    assert not w.stalled(produced=12, waiting=11, reachable=True, now=3 * STALL_SECONDS + 1)  # clock again
    assert w.stalled(produced=12, waiting=11, reachable=True, now=4 * STALL_SECONDS + 1)
    assert not w.stalled(produced=12, waiting=0, reachable=True, now=9 * STALL_SECONDS)  # all delivered:
    assert not w.suspect  # the suspicion ends


def test_a_stalled_producer_s_outputs_are_sent_again_in_order_through_a_new_one(tmp_path):
    out = Output(_cfg(tmp_path, exactly_once=False))
    out.producer = StuckProducer(out.on_delivery)
    out.produce("p", b"a", key=b"r0")
    out.produce("d", b"bad", key=None, headers=[("iolstream.reason", b"bad_json")], partition=0)
    out.produce("p", b"b", key=b"r1", on_delivery=out._dead_delivery("bad_json"))
    assert not out.stalled(reachable=True, now=0.0)  # nothing suspected
    out.stall.note_log(LINE)
    assert not out.stalled(reachable=True, now=0.0)
    assert out.stalled(reachable=True, now=STALL_SECONDS)
    fresh = []
    assert out.resend_stalled(lambda: fresh.append(Delivering(out.on_delivery)) or fresh[0]) == 3
    sent = [(m.topic(), m.value(), m.key(), m.headers(), m.partition()) for m, _ in fresh[0].held]
    assert sent == [
        ("p", b"a", b"r0", None, -1),
        ("d", b"bad", None, [("iolstream.reason", b"bad_json")], 0),
        ("p", b"b", b"r1", None, -1),
    ]
    assert out.producer is fresh[0] and out.delivery_errors == 0 and out.resent == 3
    assert not out.stall.suspect and out.produced == 3


def test_a_purge_outside_a_resend_still_counts_as_a_failed_delivery(tmp_path):
    out = Output(_cfg(tmp_path, exactly_once=False))
    out.producer = StuckProducer(out.on_delivery)
    out.produce("p", b"a", key=b"r0")
    out.producer.purge()
    out.producer.poll(0)
    assert out.delivery_errors == 1


def test_at_least_once_resends_a_stalled_producer_s_outputs_between_cycles(tmp_path, caplog):
    unit = commit_unit(_cfg(tmp_path, exactly_once=False), [])
    assert isinstance(unit, AtLeastOnce)
    made = []
    unit.new_producer = lambda: made.append(Delivering(unit.output.on_delivery)) or made[-1]
    unit.output.producer = StuckProducer(unit.output.on_delivery)
    unit.output.produce("p", b"a", key=b"r0")
    unit.check_deliveries()
    assert not made  # nothing suspected
    unit.output.stall.note_log(LINE)
    unit.check_deliveries()  # the clock starts
    unit.output.stall._since -= STALL_SECONDS  # as if STALL_SECONDS went by, nothing delivered
    with caplog.at_level(logging.WARNING, logger="iolstream.worker"):
        unit.check_deliveries()
    assert len(made) == 1 and unit.output.producer is made[0] and len(made[0].held) == 1
    assert "1 messages taken back and sent again through a new producer" in caplog.text


@pytest.mark.parametrize("stalls", [False, True])
def test_the_stop_waits_for_a_suspected_producer_and_resends_if_it_stalled(tmp_path, stalls):
    """At a revoke or the stop, a producer under suspicion is flushed in short slices, its outputs sent again if
    it stalled, so the final snapshot is written; one that delivers is just waited for."""
    unit = commit_unit(_cfg(tmp_path, exactly_once=False), [])
    unit.output.stall = StallWatch(stall_seconds=0.0)
    made = []
    unit.new_producer = lambda: made.append(Delivering(unit.output.on_delivery)) or made[-1]
    unit.output.producer = (StuckProducer if stalls else Delivering)(unit.output.on_delivery)
    unit.output.produce("p", b"a", key=b"r0")
    unit.output.stall.note_log(LINE)
    assert unit.checkpoint(wait=2.0, final=True)
    assert len(made) == (1 if stalls else 0)


class SendingProducer(StuckProducer):
    """``iolstream produce``'s producer, made by ``send`` from its settings: the first one stalls (and says so in
    librdkafka's words through the settings' logger), the next ones deliver; ``given`` keeps what each got.
    A client made only to ask whether the broker answers (no idempotence) is not counted in ``made``."""

    made: list = []

    def __init__(self, conf):
        super().__init__(None)
        self.conf, self.given = conf, []
        self.stuck = not SendingProducer.made
        if conf.get("enable.idempotence"):
            SendingProducer.made.append(self)

    def produce(self, topic, value, key=None, headers=None, on_delivery=None, partition=-1):
        self.given.append((topic, value, key))
        if self.stuck:
            super().produce(topic, value, key, headers, on_delivery, partition)

    def __len__(self):
        return super().__len__() if self.stuck else 0

    def flush(self, timeout):
        if self.stuck:
            self.conf["logger"].log(logging.WARNING, LINE)
        return len(self)

    def list_topics(self, timeout):
        return type("Metadata", (), {"brokers": {1: "127.0.0.1:9092"}})()


def test_produce_sends_a_stalled_producer_s_messages_again_in_order(monkeypatch):
    import confluent_kafka
    import numpy as np

    from iolstream.kafka import stalled_output
    from iolstream.tools.plan import PlanOptions, plan
    from iolstream.tools.send import send

    SendingProducer.made = []
    monkeypatch.setattr(confluent_kafka, "Producer", SendingProducer)
    monkeypatch.setattr(stalled_output, "STALL_SECONDS", 0.0)
    X, y = np.arange(12.0).reshape(6, 2), np.array([0, 1, 0, 1, 0, 1])
    summary = send(
        plan(X, y, PlanOptions(batch_rows=2)),
        producer_conf={"bootstrap.servers": "127.0.0.1:1"},
        features_topic="f",
        labels_topic="l",
        flush_seconds=10,
    )
    first, second = SendingProducer.made
    assert summary["feature_rows"] == 6 and len(first.given) == 6
    assert second.given == first.given  # every message, in the order first given
