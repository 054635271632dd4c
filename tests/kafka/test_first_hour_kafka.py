"""The first hour with a new cluster, as subprocesses of the real commands: a dead address gives one clear
line naming it and kafka.bootstrap_servers (never a raw librdkafka line, never a traceback) within
--max-seconds; data that does not fit the model is refused before anything is sent; ``iolstream check``
answers 0 / 2 / 3 against the real broker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from kafka_util import unique_group

pytestmark = pytest.mark.kafka

DEAD = "127.0.0.1:1"
RAW = re.compile(r"%\d+\|\d+\.\d+\||\|FAIL\|rdkafka|rdkafka#\w+-\d+\|")  # librdkafka's own stderr format


def iolstream(*argv, env=None, timeout=120) -> tuple[int, str, str, float]:
    started = time.monotonic()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("IOLSTREAM_")}, **(env or {})}
    r = subprocess.run(
        [sys.executable, "-m", "iolstream", *argv], capture_output=True, text=True, timeout=timeout, env=env
    )
    return r.returncode, r.stdout, r.stderr, time.monotonic() - started


def assert_clean(out: str, err: str) -> None:
    assert not RAW.search(out + err), f"a raw librdkafka line:\n{out}{err}"
    assert "Traceback" not in out + err, err


def write_config(tmp_path: Path, bootstrap: str, names: list[str] | None = None, **sections) -> str:
    names = names or ["f", "l", "p", "d"]
    raw = {
        "model": {"n_inputs": 4, "classes": ["a", "b"], "n_nodes": 16},
        "kafka": {"bootstrap_servers": bootstrap, "group_id": unique_group("first-hour")},
        "topics": dict(zip(["features", "labels", "predictions", "dead_letters"], names)),
        "metrics": {"port": 0},
        "snapshot": {"dir": str(tmp_path / "snapshots")},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def write_csv(tmp_path: Path, n_features: int, labels=("a", "b"), rows: int = 30) -> str:
    rng = np.random.default_rng(0)
    header = ",".join(f"x{j}" for j in range(n_features)) + ",label"
    lines = [
        ",".join(f"{v:.4f}" for v in rng.standard_normal(n_features)) + f",{labels[i % len(labels)]}"
        for i in range(rows)
    ]
    path = tmp_path / f"data{n_features}.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return str(path)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_run_against_a_dead_address_says_so_and_holds_max_seconds(tmp_path, fmt):
    cfg = write_config(tmp_path, DEAD, logging={"format": fmt})
    rc, out, err, seconds = iolstream("run", "-c", cfg, "--max-seconds", "8")
    assert_clean(out, err)
    assert rc == 3
    assert seconds < 8 + 6, f"--max-seconds 8 took {seconds:.1f} s (the interpreter and imports included)"
    lines = [line for line in err.splitlines() if line.strip()]
    about = [
        line for line in lines if "cannot reach the broker at 127.0.0.1:1 (kafka.bootstrap_servers)" in line
    ]
    assert about and len(about) <= 3, err  # repeated at most every 10 s, and the last one gives up
    if fmt == "json":
        assert all(json.loads(line)["event"] == "broker_unreachable" for line in about)
        assert all(json.loads(line) for line in lines)


def test_run_gives_up_after_kafka_connect_timeout_seconds(tmp_path):
    cfg = write_config(tmp_path, DEAD)
    rc, out, err, seconds = iolstream("run", "-c", cfg, env={"IOLSTREAM_KAFKA__CONNECT_TIMEOUT_SECONDS": "2"})
    assert_clean(out, err)
    assert rc == 3 and seconds < 2 + 8
    assert "gave up after" in err and "127.0.0.1:1" in err


def test_produce_against_a_dead_address_is_one_line_exit_3(tmp_path):
    cfg = write_config(tmp_path, DEAD)
    rc, out, err, _ = iolstream("produce", "-c", cfg, "--csv", write_csv(tmp_path, 4), "--target", "label")
    assert_clean(out, err)
    assert rc == 3
    assert err.strip().splitlines()[-1] == (
        "iolstream produce: error: cannot reach the broker at 127.0.0.1:1 (kafka.bootstrap_servers): "
        "connection refused"
    )


def test_produce_refuses_data_that_does_not_fit_the_model_before_sending(
    tmp_path, kafka_bootstrap, kafka_topics
):
    names = kafka_topics("f", "l", "p", "d")
    cfg = write_config(tmp_path, kafka_bootstrap, names)
    wide = write_csv(tmp_path, 13, labels=("a", "b", "c"))
    rc, out, err, _ = iolstream("produce", "-c", cfg, "--csv", wide, "--target", "label")
    assert_clean(out, err)
    assert rc == 2
    assert (
        "13 features per row, model.n_inputs is 4" in err and "label 'c' is not one of model.classes" in err
    )
    from kafka_util import consume_all

    assert consume_all(kafka_bootstrap, names[0], timeout=3) == [], "nothing was sent"


def test_produce_names_a_missing_topic(tmp_path, kafka_bootstrap):
    cfg = write_config(tmp_path, kafka_bootstrap, [f"missing-{unique_group(s)}" for s in "flpd"])
    rc, out, err, _ = iolstream("produce", "-c", cfg, "--csv", write_csv(tmp_path, 4), "--target", "label")
    assert_clean(out, err)
    assert rc == 3 and "does not exist at" in err and "--create-topics" in err


def test_check_a_ready_setup_exit_0(tmp_path, kafka_bootstrap, kafka_topics):
    cfg = write_config(
        tmp_path, kafka_bootstrap, kafka_topics("f", "l", "p", "d"), durability={"exactly_once": True}
    )
    rc, out, err, _ = iolstream("check", "-c", cfg, "--csv", write_csv(tmp_path, 4), "--target", "label")
    assert_clean(out, err)
    assert rc == 0, out + err
    lines = out.strip().splitlines()
    assert all(line.startswith(("ok", "warn")) for line in lines), out
    for needle in (
        "config:",
        "memory: at most",  # the pod limit of ops.footprint
        "snapshot size:",  # ops.footprint's snapshot formula
        "snapshot:",
        "csv:",
        "broker:",
        "partition counts",
        "(topics.features): exists, 1 partition; Read",
        "(topics.predictions): exists, 1 partition; Write",
        "configs of",
        "group ",
        "transactional id",
    ):
        assert any(needle in line for line in lines), needle


def test_check_a_dead_address_exit_3_naming_it(tmp_path):
    rc, out, err, _ = iolstream("check", "-c", write_config(tmp_path, DEAD), "--timeout", "2")
    assert_clean(out, err)
    assert rc == 3
    assert "FAIL  broker: cannot reach the broker at 127.0.0.1:1 (kafka.bootstrap_servers)" in out


def test_check_a_csv_that_does_not_fit_exit_2(tmp_path, kafka_bootstrap, kafka_topics):
    cfg = write_config(tmp_path, kafka_bootstrap, kafka_topics("f", "l", "p", "d"))
    rc, out, err, _ = iolstream("check", "-c", cfg, "--csv", write_csv(tmp_path, 13), "--target", "label")
    assert_clean(out, err)
    assert rc == 2
    assert "FAIL  csv:" in out and "13 features per row, model.n_inputs is 4" in out


def test_check_features_and_labels_with_different_partition_counts_exit_3(
    tmp_path, kafka_bootstrap, kafka_topics
):
    features = kafka_topics("f", partitions=3)[0]
    others = kafka_topics("l", "p", "d")
    cfg = write_config(tmp_path, kafka_bootstrap, [features, *others])
    rc, out, err, _ = iolstream("check", "-c", cfg)
    assert_clean(out, err)
    assert rc == 3
    line = next(line for line in out.splitlines() if line.startswith("FAIL  partition counts"))
    assert f"{features} has 3 partitions" in line and f"{others[0]} has 1" in line


def test_a_group_refuses_to_start_on_features_and_labels_of_different_partition_counts(
    tmp_path, kafka_bootstrap, kafka_topics, caplog
):
    """A group routes a label to the member of its partition number: with 4 features and 3 labels partitions
    about half the labels never met their rows, and `run` said nothing where `check` failed. A group now stops
    at start with `check`'s line (exit 3); a single worker, which joins them all, warns."""
    import logging

    from iolstream.kafka import access_probes
    from iolstream.kafka.clients import client_conf
    from iolstream.kafka.config import load_config
    from iolstream.kafka.errors import WorkerError

    features = kafka_topics("f", partitions=4)[0]
    labels = kafka_topics("l", partitions=3)[0]
    names = [features, labels, *kafka_topics("p", "d")]
    group = {"enabled": True, "member_id": "m1"}
    deltas = {"model_deltas": f"{features}.deltas"}
    cfg = load_config(write_config(tmp_path, kafka_bootstrap, names, group=group, topics=deltas), environ={})
    log = logging.getLogger("iolstream.test")
    with pytest.raises(WorkerError, match=rf"partition counts: features topic {features} has 4 partitions"):
        access_probes.startup(cfg, client_conf(cfg), log)
    single = load_config(write_config(tmp_path, kafka_bootstrap, names), environ={})
    with caplog.at_level(logging.WARNING, logger="iolstream.test"):
        access_probes.startup(single, client_conf(single), log)
    assert "labels topic" in caplog.text and "one worker joins them all the same" in caplog.text


def test_check_missing_topics_without_topics_create_exit_3(tmp_path, kafka_bootstrap):
    names = [f"missing-{unique_group(s)}" for s in "flpd"]
    cfg = write_config(tmp_path, kafka_bootstrap, names, topics={"create": False})
    rc, out, err, _ = iolstream("check", "-c", cfg)
    assert_clean(out, err)
    assert rc == 3
    assert f"FAIL  topic {names[0]} (topics.features): does not exist at {kafka_bootstrap}" in out


def test_check_a_bad_config_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {n_inputs: 4, classes: [a, b], n_outputs: 2}\n")
    rc, out, err, _ = iolstream("check", "-c", str(path))
    assert rc == 2 and "FAIL  config: model.n_outputs: not with model.classes" in out


def test_run_without_prometheus_client_is_one_line(tmp_path):
    """A core dependency, but an install that lost it gets one line, not a traceback."""
    fake = tmp_path / "site" / "prometheus_client"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\", name='prometheus_client')\n"
    )
    cfg = write_config(tmp_path, DEAD, metrics={"port": 19999})
    rc, out, err, _ = iolstream("run", "-c", cfg, env={"PYTHONPATH": str(tmp_path / "site")})
    assert_clean(out, err)
    assert rc == 3
    assert (
        "metrics.port 19999 needs prometheus_client: pip install prometheus-client, or metrics.port: 0" in err
    )


@pytest.mark.parametrize(
    "client,code,needles",
    [
        ({"security.protocol": "SSL"}, 3, ["TLS with", "kafka.client.security.protocol"]),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "bob",
                "sasl.password": "pw-never-shown",
            },
            6,
            ["authentication failed at", "SCRAM-SHA-512 as user 'bob'", "kafka.client.sasl.password"],
        ),
    ],
)
def test_check_names_a_security_mismatch_at_once(tmp_path, kafka_bootstrap, client, code, needles):
    """TLS or SASL against the plaintext listener: one line naming the setting, the user, never the password,
    without waiting for --timeout; a failed login is a refusal (exit 6, as ``run`` would), TLS against a
    plaintext port a cluster problem (3)."""
    cfg = write_config(tmp_path, kafka_bootstrap, kafka={"client": client})
    rc, out, err, seconds = iolstream("check", "-c", cfg, "--timeout", "20")
    assert_clean(out, err)
    assert rc == code and seconds < 15
    line = next(line for line in out.splitlines() if line.startswith("FAIL  broker:"))
    for needle in needles:
        assert needle in line, line
    assert "pw-never-shown" not in out + err
