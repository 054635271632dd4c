"""What a team meets once the quickstart works, without a broker: a SASL login without its password, a key typo,
a YAML syntax error and settings librdkafka refuses are one line and exit 2 in every command that connects; the
topics command prints without a password; a seed's counters start from 0; ``snapshot inspect`` shows every
learner; the status line's words; each dead-letter reason logged once a minute."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka import diagnose
from iolstream.kafka.deadletters import ReasonLog
from iolstream.ops.logs import log_status_line
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.rows import BadInput
from iolstream.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
SECURE = REPO / "config" / "secure-example.yaml"


def iolstream(*argv, env=None, timeout=120) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("IOLSTREAM_")}, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "iolstream", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def one_line(r: subprocess.CompletedProcess) -> str:
    """The one line a refused command prints (stderr, or check's FAIL on stdout), never a traceback."""
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = [
        line for line in (r.stderr + r.stdout).splitlines() if "error:" in line or line.startswith("FAIL")
    ]
    assert len(lines) == 1, r.stdout + r.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["run", "check", "produce"])
def test_a_missing_sasl_password_is_one_line_naming_the_key_and_the_variable(command):
    argv = [command, "-c", str(SECURE)] + (["--dataset", "wine"] if command == "produce" else [])
    r = iolstream(*argv)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r)
    assert "kafka.client.sasl.password: not set" in line, line
    assert "IOLSTREAM_KAFKA__CLIENT__sasl.password" in line, line


def test_the_topics_and_acls_lines_need_no_password():
    r = iolstream("topics", "-c", str(SECURE))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and all(
        line.startswith("kafka-topics.sh --bootstrap-server 127.0.0.1:19192") for line in lines
    )
    assert "--topic iol.features --partitions 1 --replication-factor 1" in lines[0]
    assert "max.message.bytes" not in r.stdout, "the default size limit fits Kafka's default topic limit"
    assert iolstream("acls", "-c", str(SECURE)).returncode == 0


def test_the_topics_lines_of_group_learning_and_a_large_limit(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"n_inputs": 4, "classes": [0, 1]},
                "topics": {"partitions": 3, "replication_factor": 2},
                "stream": {"max_message_bytes": 2_000_000},
                "group": {"enabled": True, "member_id": "m1"},
            }
        )
    )
    r = iolstream("topics", "-c", str(cfg), "--command", "kt", "--command-config", "")
    assert r.returncode == 0, r.stderr
    by_topic = {line.split("--topic ")[1].split()[0]: line for line in r.stdout.splitlines()}
    assert (
        "--partitions 3 --replication-factor 2 --config max.message.bytes=2008192" in by_topic["iol.features"]
    )
    assert "max.message.bytes" not in by_topic["iol.predictions"]
    deltas = by_topic["iol.model-deltas"]
    assert (
        "--partitions 1 " in deltas and "cleanup.policy=compact" in deltas and deltas.startswith("kt --boot")
    )


def test_a_key_typo_names_the_nearest_key_and_a_yaml_error_its_line(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  n_input: 4\n  clases: [a, b]\n")
    r = iolstream("check", "-c", str(typo))
    assert r.returncode == 2
    line = one_line(r)
    assert "model.clases: unknown key; did you mean model.classes?" in line, line
    assert "model.n_input: unknown key; did you mean model.n_inputs?" in line, line
    assert "known:" not in line, "no list of every key when the nearest one is found"
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  n_inputs: 4\n   classes: [a, b]\n")
    r = iolstream("run", "-c", str(broken))
    assert r.returncode == 2
    assert "not valid YAML at line 3, column 11: mapping values are not allowed here" in one_line(r)


def test_settings_librdkafka_refuses_name_the_key(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"n_inputs": 4, "classes": [0, 1]},
                "kafka": {"client": {"sasl.pasword": "x"}},
                "metrics": {"port": 0},
            }
        )
    )
    for command in ("check", "run"):
        r = iolstream(command, "-c", str(cfg))
        assert r.returncode == 2, r.stdout + r.stderr
        assert (
            'kafka.client.sasl.pasword: librdkafka refuses the client settings: No such configuration property: "sasl.pasword"'
            in one_line(r)
        )


def test_redaction_masks_the_password_in_librdkafkas_text_only():
    from confluent_kafka import KafkaError

    conf = {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "worker",
        "sasl.password": "wrong",
    }
    err = KafkaError(
        KafkaError._AUTHENTICATION,
        "b:9093/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512",
    )
    line = diagnose.explain(err, conf)
    assert "refused: wrong password or no such user" in line and "***" not in line, line
    echoed = diagnose.explain(KafkaError(KafkaError._FAIL, "the client said wrong twice: wrong"), conf)
    assert "wrong" not in echoed.split("): ", 1)[1] and echoed.count("***") == 2, echoed


def seeded(tmp_path, rows=300) -> Path:
    """A seed of ``rows`` rows (4 features, 2 classes) in tmp_path/snaps; returns the config."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((rows, 4))
    y = np.where(X[:, 0] + X[:, 1] > 0, "up", "down")
    csv = tmp_path / "history.csv"
    csv.write_text(
        "a,b,c,d,label\n" + "".join(f"{','.join(f'{v:.5f}' for v in x)},{t}\n" for x, t in zip(X, y))
    )
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"n_inputs": 4, "classes": ["down", "up"], "n_nodes": 16, "warmup_rows": 32},
                "snapshot": {"dir": str(tmp_path / "snaps")},
                "metrics": {"port": 0},
            }
        )
    )
    assert main(["seed", "-c", str(cfg), "--csv", str(csv), "--target", "label"]) == 0
    return cfg


def test_a_seed_starts_the_counters_from_zero_and_inspect_shows_every_learner(tmp_path):
    seeded(tmp_path)
    (snap,) = (tmp_path / "snaps").glob("snap-*.iolsnap")
    r = iolstream("snapshot", "inspect", str(snap))
    assert r.returncode == 0, r.stderr
    out = {line.split()[0]: line for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    assert "predictions_out=0" in out["counters"] and "rows_in=0" in out["counters"], out["counters"]
    assert "seeded_from=" in out["worker"] and "'rows': 300" in out["worker"], out["worker"]
    model = out["model"]
    assert "classes=['down', 'up']" in model and "n_outputs" not in model and "target_scaler" not in model
    learners = [line for line in r.stdout.splitlines() if "mode=" in line and "rows_observed=" in line]
    assert len(learners) == 2, r.stdout  # mode auto: the -F and the -R candidate
    assert "0: mode=forward lam=0.5" in learners[0] and "rows_observed=300" in learners[0]
    assert "(in force)" in "".join(learners)


def status_line(proc, caplog, **kwargs) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="t"):
        log_status_line(logging.getLogger("t"), proc, **kwargs)
    (record,) = caplog.records
    return record.getMessage()


def test_the_status_line_says_the_warm_up_the_dead_letters_and_no_none(caplog):
    proc = StreamProcessor(
        EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, warmup_rows=64)), StreamConfig(batch_rows=8)
    )
    for i in range(40):
        proc.on_features(f'{{"id": "r{i}", "x": [0.1, {i}, 2]}}'.encode(), None, now_ms=i)
    line = status_line(proc, caplog)
    assert "warming up 40/64" in line and "None" not in line, line
    assert "half_life" not in line and "lam=0.5 mode=ridge" in line, line
    line = status_line(proc, caplog, dead_new={"duplicate_id": 7, "unknown_class": 1})
    assert (
        "dead_letters=0 (+8 since the last line, mostly duplicate_id: ids the worker has seen before" in line
    )
    assert "--id-prefix" in line
    forgetting = StreamProcessor(
        EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, scaler="none", forgetting=5000)),
        StreamConfig(batch_rows=8),
    )
    line = status_line(forgetting, caplog)
    assert "half_life=5000" in line and "warming up" not in line, line


def test_each_dead_letter_reason_is_logged_at_once_then_once_a_minute():
    lines, now = [], [0.0]
    log = ReasonLog("dl", say=lambda fmt, *args: lines.append(fmt % args), clock=lambda: now[0])
    for i in range(500):
        log.note(BadInput("duplicate_id", f"id 'r{i}' was already labelled"), ("f", 0, i))
    log.note(BadInput("unknown_class", "label 7 is not one of model.classes"), ("l", 0, 3))
    assert len(lines) == 2 and "1 duplicate_id, e.g. id 'r0'" in lines[0] and "1 unknown_class" in lines[1]
    now[0] = 30.0
    log.tick()
    assert len(lines) == 2, "not before a minute"
    now[0] = 61.0
    log.tick()
    assert len(lines) == 3 and "dl: 499 duplicate_id in the last 61 s, e.g. id 'r1'" in lines[2], lines[2]
    log.tick()
    assert len(lines) == 3, "nothing new: nothing said"
