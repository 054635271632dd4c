"""The test broker itself: topics, round trips, transactions, and scripts/kafka.sh restarts."""

from __future__ import annotations

import os
import subprocess
import uuid

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_util import (
    committed_offsets,
    consume_all,
    create_topics,
    produce_json,
    unique_group,
    warm_up,
)

pytestmark = pytest.mark.kafka

KAFKA_SH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "kafka.sh"
)


def test_kafka_topics_creates_fresh_topics(kafka_topics, kafka_admin):
    a, b = kafka_topics("in", "out", partitions=3)
    (c,) = kafka_topics("in")
    assert len({a, b, c}) == 3
    assert a.startswith("t-test_kafka_topics_creates_fresh_topics-") and a.endswith("-in")
    md = kafka_admin.list_topics(timeout=10)
    assert len(md.topics[a].partitions) == 3
    assert len(md.topics[b].partitions) == 3
    assert len(md.topics[c].partitions) == 1
    assert all(p.leader >= 0 for p in md.topics[a].partitions.values())


def test_produce_consume_round_trip(kafka_bootstrap, kafka_topics):
    (topic,) = kafka_topics("features")
    rows = [{"id": f"a{i}", "x": [i * 0.5, -1.0, 2.0]} for i in range(20)]
    delivered = produce_json(kafka_bootstrap, topic, rows, key=[r["id"] for r in rows])
    assert [off for _, off in delivered] == list(range(20))
    produce_json(kafka_bootstrap, topic, ["{not json"], headers=[("src", b"test")])

    got = consume_all(kafka_bootstrap, topic, expected=21, timeout=20)
    assert len(got) == 21
    assert [orjson.loads(v) for _, v, _, _, _ in got[:20]] == rows
    assert [k for k, _, _, _, _ in got[:20]] == [r["id"].encode() for r in rows]
    key, value, headers, partition, offset = got[20]
    assert (key, value, headers, partition, offset) == (None, b"{not json", [("src", b"test")], 0, 20)

    # expected=None: "what is there", stops at the end of the partition instead of waiting.
    assert len(consume_all(kafka_bootstrap, topic, timeout=20)) == 21


def test_consume_as_group_commits_offsets(kafka_bootstrap, kafka_topics):
    (topic,) = kafka_topics("labels", partitions=2)
    produce_json(kafka_bootstrap, topic, [{"id": "a", "y": 1}] * 3, partition=0)
    produce_json(kafka_bootstrap, topic, [{"id": "b", "y": 0}] * 2, partition=1)
    group = unique_group()
    assert committed_offsets(kafka_bootstrap, group, topic, 2) == {0: None, 1: None}
    assert len(consume_all(kafka_bootstrap, topic, group=group, timeout=20)) == 5
    assert committed_offsets(kafka_bootstrap, group, topic, [0, 1]) == {0: 3, 1: 2}
    # the group continues where it stopped
    produce_json(kafka_bootstrap, topic, [{"id": "c", "y": 2}], partition=1)
    rest = consume_all(kafka_bootstrap, topic, group=group, expected=1, timeout=20)
    assert [(p, o) for _, _, _, p, o in rest] == [(1, 2)]


def _txn_producer(bootstrap: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex[:12]}"})
    p.init_transactions(30)
    return p


def test_transactions_commit_and_abort(kafka_bootstrap, kafka_topics):
    """Exactly-once needs transactions on this broker: read_committed sees only committed ones."""
    (topic,) = kafka_topics("predictions")
    p = _txn_producer(kafka_bootstrap)
    for batch, commit in ((["c1", "c2"], True), (["a1"], False), (["c3"], True)):
        p.begin_transaction()
        for v in batch:
            p.produce(topic, value=orjson.dumps({"id": v}))
        if commit:
            p.commit_transaction(30)
        else:
            p.flush(30)  # really written to the log, then aborted
            p.abort_transaction(30)

    committed = consume_all(kafka_bootstrap, topic, timeout=20)
    assert [orjson.loads(v)["id"] for _, v, _, _, _ in committed] == ["c1", "c2", "c3"]
    everything = consume_all(kafka_bootstrap, topic, isolation_level="read_uncommitted", timeout=20)
    assert [orjson.loads(v)["id"] for _, v, _, _, _ in everything] == ["c1", "c2", "a1", "c3"]


def test_transactional_offset_commit(kafka_bootstrap, kafka_topics):
    """Consume-transform-produce: input offsets commit with the output, or not at all."""
    src, dst = kafka_topics("src", "dst")
    produce_json(kafka_bootstrap, src, [{"id": f"r{i}"} for i in range(4)])
    group = unique_group()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(src, 0)])
    p = _txn_producer(kafka_bootstrap)
    try:
        msgs = []
        while len(msgs) < 4:
            m = consumer.poll(10)
            assert m is not None, "input not consumed"
            assert m.error() is None, m.error()
            msgs.append(m)

        def process(batch, commit):
            p.begin_transaction()
            for m in batch:
                p.produce(dst, value=m.value())
            p.send_offsets_to_transaction(
                [TopicPartition(src, 0, batch[-1].offset() + 1)], consumer.consumer_group_metadata(), 30
            )
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)

        process(msgs[:2], commit=True)
        assert committed_offsets(kafka_bootstrap, group, src) == {0: 2}
        process(msgs[2:], commit=False)
        assert committed_offsets(kafka_bootstrap, group, src) == {0: 2}
        process(msgs[2:], commit=True)
        assert committed_offsets(kafka_bootstrap, group, src) == {0: 4}
    finally:
        consumer.close()
    out = consume_all(kafka_bootstrap, dst, timeout=20)
    assert [orjson.loads(v)["id"] for _, v, _, _, _ in out] == ["r0", "r1", "r2", "r3"]


def test_kafka_sh_restart_keeps_data(tmp_path, kafka_bootstrap):
    """A second broker on another port, via scripts/kafka.sh: idempotent start/stop, status codes,
    and data (messages, committed offsets) survive a stop/start."""
    port = int(os.environ.get("IOLSTREAM_TEST_RESTART_PORT", "19192"))
    if kafka_bootstrap.endswith(f":{port}") or kafka_bootstrap.endswith(f":{port + 1}"):
        port += 100
    state = tmp_path / "kafka"
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_CONTROLLER_PORT"}
    env.update(KAFKA_PORT=str(port), IOLSTREAM_KAFKA_DATA=str(state))
    bootstrap = f"127.0.0.1:{port}"

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", KAFKA_SH, cmd], env=env, capture_output=True, text=True, timeout=600)

    def ok(cmd: str) -> str:
        r = sh(cmd)
        assert r.returncode == 0, f"kafka.sh {cmd} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout + r.stderr

    topic = f"t-restart-{uuid.uuid4().hex[:8]}"
    group = unique_group()
    try:
        assert sh("status").returncode == 3
        ok("start")
        assert "already running" in ok("start")
        assert sh("status").returncode == 0
        create_topics(bootstrap, [topic])
        produce_json(bootstrap, topic, [{"id": "before-restart"}], key="k1")
        warm_up(bootstrap)
        committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        committer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        committer.close()
        assert committed_offsets(bootstrap, group, topic) == {0: 1}

        ok("stop")
        assert sh("status").returncode == 3
        assert "not running" in ok("stop")
        ok("start")

        got = consume_all(bootstrap, topic, timeout=20)
        assert [(k, orjson.loads(v)) for k, v, _, _, _ in got] == [(b"k1", {"id": "before-restart"})]
        assert committed_offsets(bootstrap, group, topic) == {0: 1}
    finally:
        sh("wipe")
    assert sh("status").returncode == 3
    assert not state.exists()
