"""Clients that are not Python: the Java console producer sends features and labels, the Java console consumer
reads the predictions (read_committed) of an exactly-once worker, all over SASL_SSL with least-privilege ACLs."""

from __future__ import annotations

import shlex

import orjson
import pytest
from secure_kafka import feature_and_label_messages, run_worker, stream, worker_raw, write_config

from iolstream.kafka import required_acls
from iolstream.kafka.config import config_from_dict

pytestmark = pytest.mark.kafka
ROWS = 50
PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
ACL_TOOL = "org.apache.kafka.tools.AclCommand"  # what kafka-acls.sh runs


def test_java_console_producer_in_java_console_consumer_out_exactly_once(secure_kafka, tmp_path):
    features, labels, predictions, dead = secure_kafka.topics("features", "labels", "predictions", "dead")
    topics = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
    secure_kafka.grant(required_acls.producer_acls(features, labels), "producer")
    ids, X, y = stream(ROWS)
    feature_lines, label_lines = feature_and_label_messages(ids, X, y)
    for topic, lines in ((features, feature_lines), (labels, label_lines)):
        r = secure_kafka.java(
            PRODUCER,
            "--bootstrap-server",
            secure_kafka.bootstrap,
            "--command-config",
            secure_kafka.properties("producer"),
            "--topic",
            topic,
            "--request-required-acks",
            "all",
            stdin="".join(line.decode() + "\n" for line in lines),
        )
        assert r.returncode == 0, r.stdout + r.stderr

    raw = worker_raw(secure_kafka, topics, tmp_path / "snap", durability={"exactly_once": True})
    secure_kafka.grant(required_acls.worker_acls(config_from_dict(raw)), "worker")
    code, out, _ = run_worker(write_config(raw, tmp_path / "worker.yaml"), "--max-seconds", "90")
    assert code == 0, out[-4000:]

    # the reader's ACLs granted with the Java kafka-acls tool, from the lines iolstream.kafka.required_acls renders
    group = f"java-reader-{predictions}"
    wanted = [required_acls.Acl("topic", predictions, "Read"), required_acls.Acl("group", group, "Read")]
    for line in required_acls.kafka_acls_lines(
        wanted,
        "User:reader",
        bootstrap=secure_kafka.bootstrap,
        command_config=secure_kafka.properties("admin"),
        command=ACL_TOOL,
    ):
        r = secure_kafka.java(*shlex.split(line))
        assert r.returncode == 0, r.stdout + r.stderr
    secure_kafka.wait_listed(wanted, "reader")
    r = secure_kafka.java(
        CONSUMER,
        "--bootstrap-server",
        secure_kafka.bootstrap,
        "--command-config",
        secure_kafka.properties("reader"),
        "--topic",
        predictions,
        "--group",
        group,
        "--from-beginning",
        "--isolation-level",
        "read_committed",
        "--max-messages",
        str(ROWS),
        "--timeout-ms",
        "30000",
    )
    assert r.returncode == 0, r.stderr
    rows = [orjson.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert sorted(row["id"] for row in rows) == sorted(ids)
    assert all(row["y_hat"] in (0, 1, 2) and len(row["proba"]) == 3 for row in rows)
