"""The README's quickstart, run as written: its blocks are taken from README.md itself, so the guide cannot rot.

Fenced blocks carry what they are in their info string: ```yaml config/minimal.yaml (the file, verbatim),
```sh quickstart (commands), ```python quickstart (snippets), ```sh kcat (the kcat lines), ```text status and
```text metrics (what the worker shows). The test swaps the README's broker address for the test broker's and
its topic and group names (``quickstart...``) for fresh ones, runs the worker as ``iolstream run -c
config/minimal.yaml`` with those as environment overrides, runs the snippets in their own processes, reads
the predictions back (one per row sent) and compares the log and /metrics with what the README shows.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from kafka_util import STARTUP_SECONDS, consume_all

from iolstream.kafka.config import load_config
from iolstream.tools.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MINIMAL = ROOT / "config" / "minimal.yaml"
README_BROKER = "localhost:9092"
README_NAME = "quickstart"  # topic prefix, group id and snapshot folder of config/minimal.yaml


def blocks(info: str) -> list[str]:
    """The README's fenced blocks whose info string is ``info``, in order."""
    pattern = re.compile(r"^```" + re.escape(info) + r"[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
    return pattern.findall(README.read_text())


def test_the_readme_shows_config_minimal_yaml_verbatim_and_it_loads():
    (shown,) = blocks("yaml config/minimal.yaml")
    assert shown == MINIMAL.read_text()
    assert len(shown.splitlines()) <= 16, "the minimal config is meant to be read at a glance"
    cfg = load_config(MINIMAL, environ={})
    assert cfg.kafka.bootstrap_servers == README_BROKER
    assert cfg.model.n_inputs == 7 and cfg.model.classes == (False, True)  # amount (+ missing), country (5)
    assert [f.name for f in cfg.model.features] == ["amount", "country"] and cfg.events.id_field == "order_id"
    names = [cfg.topics.features, cfg.topics.labels, cfg.topics.predictions, cfg.topics.dead_letters]
    assert all(name.startswith(README_NAME + ".") for name in names)


def test_the_quickstart_blocks_are_there():
    """The guide's steps exist in the README (so that the run below cannot pass on nothing)."""
    (commands,) = blocks("sh quickstart")
    assert "iolstream run -c config/minimal.yaml" in commands
    producer, consumer = blocks("python quickstart")
    assert "Producer(" in producer and "quickstart.features" in producer and "quickstart.labels" in producer
    assert "Consumer(" in consumer and "quickstart.predictions" in consumer
    assert len(blocks("sh kcat")) == 2 and blocks("text status") and blocks("text metrics")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


class Quickstart:
    """The README's names swapped for this run's: broker, topics, groups."""

    def __init__(self, bootstrap: str, tmp_path: Path):
        self.bootstrap = bootstrap
        self.name = f"readme-{uuid.uuid4().hex[:8]}"
        self.tmp_path = tmp_path

    def substitute(self, text: str) -> str:
        text = text.replace(README_BROKER, self.bootstrap)
        return re.sub(rf"\b{README_NAME}\b", self.name, text)

    def env(self, metrics_port: int) -> dict[str, str]:
        cfg = load_config(MINIMAL, environ={})
        overrides = {
            "KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA__GROUP_ID": self.substitute(cfg.kafka.group_id),
            "SNAPSHOT__DIR": str(self.tmp_path / "snapshots"),
            "METRICS__PORT": str(metrics_port),
            "LOGGING__STATUS_EVERY_SECONDS": "1",
        }
        for key in ("features", "labels", "predictions", "dead_letters"):
            overrides[f"TOPICS__{key.upper()}"] = self.substitute(getattr(cfg.topics, key))
        return {**os.environ, **{f"IOLSTREAM_{k}": v for k, v in overrides.items()}}

    def topic(self, key: str) -> str:
        return self.substitute(getattr(load_config(MINIMAL, environ={}).topics, key))


def _iolstream(line: str) -> list[str]:
    """A README command line as argv for this interpreter's iolstream (comments dropped)."""
    argv = shlex.split(line, comments=True)
    assert argv[0] == "iolstream", line
    return [sys.executable, "-m", "iolstream", *argv[1:]]


@pytest.mark.kafka
def test_the_readme_quickstart_runs_as_written(kafka_bootstrap, tmp_path):
    qs = Quickstart(kafka_bootstrap, tmp_path)
    port = _free_port()
    env = qs.env(port)
    (commands,) = blocks("sh quickstart")
    lines = [line for line in commands.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    run_lines = [line for line in lines if shlex.split(line)[1] == "run"]
    assert len(run_lines) == 1
    missing = []  # commands the README shows that this build lacks: the rest still runs, then xfail
    for line in lines[: lines.index(run_lines[0])]:  # what the guide runs before the worker (the check)
        command = shlex.split(line)[1]
        if command not in COMMANDS:
            missing.append(line)
            continue
        done = subprocess.run(
            _iolstream(line), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"`{line}` exited {done.returncode}:\n{done.stdout}{done.stderr}"

    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [*_iolstream(run_lines[0]), "--max-seconds", "600"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while _get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert worker.poll() is None, f"the worker exited {worker.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, (
                f"not ready after {STARTUP_SECONDS:.0f} s:\n{log_path.read_text()}"
            )
            time.sleep(0.5)

        producer, consumer = (qs.substitute(code) for code in blocks("python quickstart"))
        sent = subprocess.run(
            [sys.executable, "-c", producer], cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert sent.returncode == 0, sent.stderr
        expected = {f"o-{i}" for i in range(1000)}  # the snippet's ids

        read = subprocess.run(
            [sys.executable, "-c", consumer], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert read.returncode == 0, read.stderr
        shown = read.stdout.strip()
        assert shown.startswith("{'order_id': 'o-999', 'y_hat': ") and "'proba': [" in shown, shown

        records = consume_all(qs.bootstrap, qs.topic("predictions"), expected=len(expected), timeout=60)
        ids = [r[0].decode() for r in records]
        assert len(ids) == len(set(ids)) == len(expected), "one prediction per row"
        assert set(ids) == expected

        status = blocks("text status")[0].strip()
        keys = re.findall(r"(\w+)=", status)
        assert {"rows_in", "predictions", "labels_joined", "dead_letters"} <= set(keys)
        wanted = re.compile(r"rows_in=1000 predictions=1000 labels_joined=1000 ")
        deadline = time.monotonic() + 60
        while not wanted.search(log_path.read_text()):
            assert time.monotonic() < deadline, "no status line with every row in:\n" + log_path.read_text()
            time.sleep(0.5)
        line = next(x for x in log_path.read_text().splitlines() if wanted.search(x))
        assert re.findall(r"(\w+)=", line)[: len(keys)] == keys, (status, line)

        shown = [line.rsplit(" ", 1)[0] for line in qs.substitute(blocks("text metrics")[0]).splitlines()]
        deadline = time.monotonic() + 60  # the consumer lag comes with librdkafka's periodic statistics
        while True:
            code, metrics = _get(f"http://127.0.0.1:{port}/metrics")
            absent = [series for series in shown if series not in metrics]
            if code == 200 and not absent:
                break
            assert time.monotonic() < deadline, f"/metrics lacks {absent}, which the README shows"
            time.sleep(1)
        assert "iolstream_rows_in_total 1000.0" in metrics
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)  # the README's Ctrl-C: flush, snapshot, commit, exit 0
        rc = worker.wait(timeout=60)
    assert rc == 0, log_path.read_text()
    assert list((tmp_path / "snapshots").glob("*.iolsnap")), "a clean stop leaves a snapshot"
    if missing:
        pytest.xfail(f"the README runs {missing}, which this build does not have; everything else passed")


@pytest.mark.kafka
@pytest.mark.skipif(
    shutil.which("kcat") is None, reason="kcat is not on PATH: the README's kcat lines are not run"
)
def test_the_readme_kcat_lines_send_a_row_and_read_its_prediction(kafka_bootstrap, tmp_path):
    qs = Quickstart(kafka_bootstrap, tmp_path)
    port = _free_port()
    send, read = (qs.substitute(block) for block in blocks("sh kcat"))
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen(
            [*_iolstream("iolstream run -c config/minimal.yaml"), "--max-seconds", "600"],
            cwd=ROOT,
            env={**qs.env(port), "IOLSTREAM_MODEL__SCALER": "none"},  # no warm-up: the one row is predicted
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while _get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            assert worker.poll() is None and time.monotonic() < deadline, (
                tmp_path / "worker.log"
            ).read_text()
            time.sleep(0.5)
        subprocess.run(send, shell=True, check=True, timeout=60)
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(read, shell=True, capture_output=True, text=True, timeout=60).stdout
            if '"order_id":"kcat-1"' in out.replace(" ", ""):
                break
            assert time.monotonic() < deadline, "no prediction for kcat-1"
            time.sleep(1)
        assert len(out.strip().splitlines()) == 1
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
