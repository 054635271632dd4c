"""Secrets never leave the config: after a run over SASL_SSL with known passwords, neither they nor the CA's
private key appear in the worker's logs (text and JSON, status lines and errors included), its /metrics,
/healthz and /readyz, the dead letters (values and headers), the predictions, or the snapshot files."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from kafka_util import consume_all, produce_json
from secure_kafka import IOLSTREAM, REPO, feature_and_label_messages, stream, worker_raw, write_config

from iolstream.kafka import required_acls
from iolstream.kafka.config import config_from_dict

pytestmark = pytest.mark.kafka
ROWS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secrets_of(secure_kafka) -> list[bytes]:
    """Every password kafka.sh made, and the lines of the CA's private key."""
    key_lines = [
        line
        for line in (secure_kafka.secure_dir / "ca.key").read_text().splitlines()
        if "PRIVATE KEY" not in line
    ]
    return [p.encode() for p in secure_kafka.passwords.values()] + [line.encode() for line in key_lines[:3]]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_secret_in_logs_metrics_dead_letters_or_snapshots(secure_kafka, tmp_path, log_format):
    features, labels, predictions, dead = secure_kafka.topics("features", "labels", "predictions", "dead")
    topics = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
    secure_kafka.grant(required_acls.producer_acls(features, labels), "producer")
    f, lab = feature_and_label_messages(*stream(ROWS))
    bad = [b"{not json", b'{"id": "short", "x": [1, 2]}']  # dead letters, with their source in the headers
    produce_json(secure_kafka.bootstrap, features, f + bad, conf=secure_kafka.client("producer"))
    produce_json(
        secure_kafka.bootstrap,
        labels,
        lab,
        conf=secure_kafka.client("producer"),
    )

    port = free_port()
    raw = worker_raw(
        secure_kafka,
        topics,
        tmp_path / "snap",
        metrics={"port": port, "host": "127.0.0.1"},
        logging={"level": "DEBUG", "format": log_format, "status_every_seconds": 0.5},
        durability={"exactly_once": True},
    )
    secure_kafka.grant(required_acls.worker_acls(config_from_dict(raw)), "worker")
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                str(IOLSTREAM),
                "run",
                "-c",
                str(write_config(raw, tmp_path / "worker.yaml")),
                "--idle-stop-seconds",
                "3",
            ],
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
        pages = []
        try:
            got = consume_all(
                secure_kafka.bootstrap,
                predictions,
                expected=ROWS,
                timeout=30,
                conf=secure_kafka.client("admin"),
            )
            assert len(got) == ROWS, log_path.read_text()[-3000:]
            for page in ("metrics", "healthz", "readyz"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{page}", timeout=5) as r:
                        pages.append(r.read())
                except urllib.error.HTTPError as exc:  # 503 is an answer too
                    pages.append(exc.read())
        finally:
            code = proc.wait(60)
    assert code == 0, log_path.read_text()[-3000:]
    assert b"iolstream_" in pages[0]

    dead_letters = consume_all(
        secure_kafka.bootstrap, dead, expected=2, timeout=20, conf=secure_kafka.client("admin")
    )
    assert len(dead_letters) == 2
    places: dict[str, bytes] = {
        "log": log_path.read_bytes(),
        "/metrics, /healthz, /readyz": b"\n".join(pages),
        "dead letters": b"\n".join(
            (value or b"") + b"".join(k.encode() + v for k, v in headers)
            for _k, value, headers, *_ in dead_letters
        ),
        "predictions": b"\n".join(value for _k, value, *_ in got),
    }
    snapshots = sorted(Path(raw["snapshot"]["dir"]).glob("*"))
    assert snapshots
    for snap in snapshots:
        places[f"snapshot {snap.name}"] = snap.read_bytes()
    assert b"status" in places["log"] or b"rows_in=" in places["log"]
    for secret in secrets_of(secure_kafka):
        for where, content in places.items():
            assert secret not in content, f"a secret is in the {where}"
