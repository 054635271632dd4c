"""Least privilege on a secured broker (SASL_SSL, SCRAM-SHA-512, ACLs enforced): the worker, the producer and a
two-member group work with exactly the ACLs of ``iolstream.kafka.required_acls`` (the list docs/operations.md shows), and
nothing more is granted."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
from kafka_util import STARTUP_SECONDS, consume_all
from secure_kafka import IOLSTREAM, REPO, lib_dir, run_worker, stream, worker_raw, write_config

from iolstream.kafka import required_acls
from iolstream.kafka.config import config_from_dict

pytestmark = pytest.mark.kafka
ROWS = 60


def topic_names(secure_kafka, *, create: bool) -> dict:
    """The four topics; the input ones made by the admin, the output ones too unless the worker creates them."""
    features, labels, predictions, dead = secure_kafka.topics("features", "labels", "predictions", "dead")
    names = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
    if create:  # the worker makes these (its Create ACLs); new names, never created by anyone yet
        names["predictions"] += "-new"
        names["dead_letters"] += "-new"
    return names


def produce_rows(secure_kafka, topics: dict, tmp_path: Path, rows: int = ROWS, partitions: int = 1) -> None:
    """``iolstream produce`` as user producer, granted ``required_acls.producer_acls`` only."""
    secure_kafka.grant(required_acls.producer_acls(topics["features"], topics["labels"]), "producer")
    raw = worker_raw(secure_kafka, topics, tmp_path / "unused", user="producer")
    config = write_config(raw, tmp_path / "producer.yaml")
    r = subprocess.run(
        [str(IOLSTREAM), "produce", "-c", str(config), "--dataset", "wine", "--rows", str(rows), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def predictions(secure_kafka, topic: str, expected: int) -> dict[str, int]:
    """Row id -> number of predictions for it, read_committed, as admin."""
    got = consume_all(
        secure_kafka.bootstrap, topic, expected=expected, timeout=20, conf=secure_kafka.client("admin")
    )
    counts: dict[str, int] = {}
    for _key, value, *_ in got:
        row = orjson.loads(value)
        counts[row["id"]] = counts.get(row["id"], 0) + 1
    return counts


def assert_quiet_log(text: str) -> None:
    """No authorisation or authentication trouble reported by the worker or librdkafka."""
    lowered = text.lower()
    for word in ("authoriz", "authoris", "authentication", "denied", "fatal"):
        assert word not in lowered, f"{word!r} in the worker's output:\n{text[-4000:]}"


@pytest.mark.parametrize(
    "exactly_once, create",
    [(False, False), (True, True)],
    ids=["at-least-once, topics.create off", "exactly-once, topics.create on"],
)
def test_the_worker_runs_with_exactly_its_acls(secure_kafka, tmp_path, exactly_once, create):
    topics = topic_names(secure_kafka, create=create)
    produce_rows(secure_kafka, topics, tmp_path)
    raw = worker_raw(secure_kafka, topics, tmp_path / "snap")
    raw["topics"]["create"] = create
    raw["durability"] = {"exactly_once": exactly_once}
    cfg = config_from_dict(raw)
    secure_kafka.grant(required_acls.worker_acls(cfg), "worker")
    code, out, _ = run_worker(write_config(raw, tmp_path / "worker.yaml"), "--max-seconds", "90")
    assert code == 0, out[-4000:]
    assert_quiet_log(out)
    ids, _, _ = stream(ROWS)
    assert predictions(secure_kafka, topics["predictions"], ROWS) == dict.fromkeys(ids, 1)


def test_the_topics_lines_make_topics_the_worker_runs_on_without_a_warning(secure_kafka, tmp_path):
    """topics.create off: the admin runs what `iolstream topics` prints (Kafka's own TopicCommand); the worker, with
    the default size limits, runs on them with exactly its ACLs and no warning about the topics' limits."""
    tag = f"t-topics-lines-{int(time.time() * 1000)}"
    topics = {k: f"{tag}-{k}" for k in ("features", "labels", "predictions", "dead_letters")}
    raw = worker_raw(secure_kafka, topics, tmp_path / "snap")
    del raw["stream"]["max_message_bytes"]  # the default: it must agree with Kafka's default topic limit
    config = write_config(raw, tmp_path / "worker.yaml")
    tool = f"java -Xmx256m -cp '{lib_dir()}/*' org.apache.kafka.tools.TopicCommand"
    printed = subprocess.run(
        [str(IOLSTREAM), "topics", "-c", str(config), "--command", tool, "--command-config",
         secure_kafka.properties("admin")],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert len(printed.splitlines()) == 4 and all(t in printed for t in topics.values()), printed
    made = subprocess.run(["sh"], input=printed, capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    produce_rows(secure_kafka, topics, tmp_path)
    secure_kafka.grant(required_acls.worker_acls(config_from_dict(raw)), "worker")
    code, out, _ = run_worker(config, "--max-seconds", "90")
    assert code == 0, out[-4000:]
    assert_quiet_log(out)
    assert "max.message.bytes" not in out, out[-3000:]
    ids, _, _ = stream(ROWS)
    assert predictions(secure_kafka, topics["predictions"], ROWS) == dict.fromkeys(ids, 1)


def test_a_two_member_group_works_with_exactly_its_acls(secure_kafka, tmp_path):
    features, labels, predictions_topic, dead, deltas = secure_kafka.topics(
        "features", "labels", "predictions", "dead", "deltas", partitions=2
    )
    topics = {
        "features": features,
        "labels": labels,
        "predictions": predictions_topic,
        "dead_letters": dead,
        "model_deltas": deltas + "-new",  # created by the members (one partition, compacted)
        "partitions": 2,
        "create": True,
    }
    procs, logs = [], []
    group = None
    for member in ("a", "b"):
        raw = worker_raw(secure_kafka, topics, tmp_path / "snap")
        raw["topics"] = topics
        raw["group"] = {"enabled": True, "member_id": member, "sync_every_ms": 200}
        raw["durability"] = {"exactly_once": True}
        if group is None:
            group = raw["kafka"]["group_id"]
        raw["kafka"]["group_id"] = group
        cfg = config_from_dict(raw)
        if member == "a":
            secure_kafka.grant(required_acls.worker_acls(cfg), "worker")
        config = write_config(raw, tmp_path / f"member-{member}.yaml")
        log = tmp_path / f"member-{member}.log"
        procs.append(
            subprocess.Popen(
                [str(IOLSTREAM), "run", "-c", str(config)],
                cwd=REPO,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        logs.append(log)
    try:
        deadline = (
            time.monotonic() + STARTUP_SECONDS
        )  # both members hold a features partition before rows are sent
        while not all(re.search(r"assigned [^\n]*features\[\d\]", log.read_text()) for log in logs):
            assert time.monotonic() < deadline, "\n----\n".join(log.read_text()[-2000:] for log in logs)
            time.sleep(0.2)
        produce_rows(secure_kafka, topics, tmp_path)
        ids, _, _ = stream(ROWS)
        assert predictions(secure_kafka, predictions_topic, ROWS) == dict.fromkeys(ids, 1)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(90) for p in procs]
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n----\n".join(t[-3000:] for t in texts)
    for text in texts:
        assert_quiet_log(text)
        assert re.search(r"assigned [^\n]*features\[\d\]", text), (
            f"a member never read features:\n{text[-3000:]}"
        )
