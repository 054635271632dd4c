"""The second hour with a real broker, as subprocesses of the real commands: a missing topic stops ``run`` as
``check`` says; the warm-up shows its progress; a replay of the same ids is named by ``produce``, by the worker's
log and status line, and its dead letters keep their keys; ``check`` reports the snapshot ``run`` would refuse and
where a key came from; a topic deleted and created again is read from its beginning; a first start with an empty
kernel cache says it compiles and /healthz says "starting", never "loop stalled"."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml
from kafka_util import consume_all, create_topics, delete_topics, unique_group

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]


def clean_env(extra=None) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("IOLSTREAM_")}, **(extra or {})}


def iolstream(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "iolstream", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(env),
        cwd=REPO,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, bootstrap: str, names: list[str], **sections) -> Path:
    raw = {
        "model": {"n_inputs": 13, "classes": [0, 1, 2], "n_nodes": 16, "warmup_rows": 64},
        "kafka": {"bootstrap_servers": bootstrap, "group_id": unique_group("second-hour")},
        "topics": dict(zip(["features", "labels", "predictions", "dead_letters"], names)),
        "stream": {"batch_rows": 16},
        "snapshot": {"dir": str(path.parent / "snapshots")},
        "metrics": {"port": 0},
        "logging": {"status_every_seconds": 1},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    path.write_text(yaml.safe_dump(raw))
    return path


class Worker:
    """``iolstream run -c CONFIG`` in the background, its log in a file."""

    def __init__(self, config: Path, log: Path, *args: str, env=None):
        self.log = log
        self.handle = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "iolstream", "run", "-c", str(config), *args],
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            env=clean_env(env),
            cwd=REPO,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 300.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.text())
            if m:
                return m
            assert self.proc.poll() is None, (
                f"the worker exited ({self.proc.returncode}):\n{self.text()[-4000:]}"
            )
            assert time.monotonic() < deadline, (
                f"no {pattern!r} within {timeout:.0f} s:\n{self.text()[-4000:]}"
            )
            time.sleep(0.2)

    def stop(self, timeout: float = 120.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.handle.close()
        return code


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_run_refuses_a_missing_topic_as_check_does(tmp_path, kafka_bootstrap, kafka_topics):
    names = kafka_topics("l", "p", "d")
    missing = f"t-second-hour-missing-{time.time_ns()}"
    cfg = write_config(tmp_path / "w.yaml", kafka_bootstrap, [missing, *names], topics={"create": False})
    checked = iolstream("check", "-c", str(cfg), "--timeout", "20")
    assert checked.returncode == 3, checked.stdout + checked.stderr
    (fail,) = [line for line in checked.stdout.splitlines() if line.startswith("FAIL")]
    assert "does not exist at" in fail and "topics.create is false" in fail and "iolstream topics" in fail
    assert "None partitions" not in checked.stdout
    run = iolstream("run", "-c", str(cfg), "--max-seconds", "60")
    assert run.returncode == 3, run.stderr[-3000:]
    (fatal,) = [line for line in run.stderr.splitlines() if "fatal:" in line]
    assert fatal.endswith(fail.split("FAIL  ", 1)[1]), (fatal, fail)
    assert "Traceback" not in run.stderr


def test_duplicates_warm_up_snapshot_mismatch_and_a_recreated_topic(tmp_path, kafka_bootstrap, kafka_topics):
    names = kafka_topics("f", "l", "p", "d")
    port = free_port()
    cfg = write_config(
        tmp_path / "w.yaml", kafka_bootstrap, names, metrics={"port": port, "host": "127.0.0.1"}
    )
    worker = Worker(cfg, tmp_path / "worker.log")
    try:
        worker.wait_for(r"assigned ")
        # the warm-up's progress: 40 rows of the 64 it waits for
        sent = iolstream(
            "produce", "-c", str(cfg), "--dataset", "wine", "--shuffle", "--rows", "40", "--id-prefix", "a"
        )
        assert sent.returncode == 0, sent.stderr
        worker.wait_for(r"warming up 40/64 \(no prediction before model.warmup_rows rows\)")
        _, scrape = http(port, "/metrics")
        assert re.search(r"^iolstream_warmup_rows 40\.0$", scrape, re.M), scrape[:2000]
        assert re.search(r"^iolstream_warmup_target_rows 64\.0$", scrape, re.M)
        # a replay: every row predicted
        first = iolstream("produce", "-c", str(cfg), "--dataset", "wine", "--shuffle", "--id-prefix", "b", "--follow",
                          "--follow-timeout", "120")  # fmt: skip
        assert first.returncode == 0, first.stderr[-3000:]
        assert "are in" not in first.stderr, "new ids: no warning"
        # the same replay again: produce says the ids were sent before; the worker refuses and names them
        again = iolstream("produce", "-c", str(cfg), "--dataset", "wine", "--shuffle", "--id-prefix", "b", "--follow",
                          "--follow-timeout", "120")  # fmt: skip
        assert again.returncode == 1, again.stderr[-3000:]
        assert f"178 of the 178 ids to send (b0 .. b177) are in {names[0]} already" in again.stderr
        assert "--id-prefix" in again.stderr
        assert "178 rows were refused by the worker" in again.stderr and "all duplicate_id" in again.stderr
        assert again.stderr.strip().endswith(
            "178 rows got no prediction: 178 refused as dead letters (duplicate_id)"
        )
        worker.wait_for(
            rf"dead letters to {re.escape(names[3])}: 1 duplicate_id, e\.g\. id 'b\d+' was already"
        )
        # the status lines say the refusals as they came: on a busy machine they span several lines
        worker.wait_for(r"dead_letters=178 ")
        step = r"dead_letters=\d+ \(\+(\d+) since the last line, (\w+ \w+): ids the worker has seen"
        steps = re.findall(step, worker.text())
        assert sum(int(n) for n, _ in steps) == 178, steps
        assert {reason for _, reason in steps} == {"all duplicate_id"}, steps
        dead = consume_all(kafka_bootstrap, names[3], expected=178, timeout=30)
        keys = {key.decode() if isinstance(key, bytes) else key for key, *_ in dead}
        assert keys == {f"b{i}" for i in range(178)}, "each dead letter keeps its message's key"
        assert worker.stop() == 0, worker.text()[-3000:]
    finally:
        if worker.proc.poll() is None:
            worker.stop()
    text = worker.text()
    assert "half_life=None" not in text and "@-2" not in text and "until -" not in text

    # check loads the newest snapshot and says what run would; and where n_inputs came from
    env = {"IOLSTREAM_MODEL__N_INPUTS": "5"}
    checked = iolstream("check", "-c", str(cfg), "--timeout", "20", env=env)
    assert checked.returncode == 3, checked.stdout
    assert "from the environment: model.n_inputs (IOLSTREAM_MODEL__N_INPUTS)" in checked.stdout
    (fail,) = [line for line in checked.stdout.splitlines() if line.startswith("FAIL  snapshot: ")]
    assert "model.n_inputs (13 there, 5 here)" in fail, fail
    run = iolstream("run", "-c", str(cfg), "--max-seconds", "60", env=env)
    assert run.returncode == 3 and fail.split("FAIL  snapshot: ", 1)[1] in run.stderr, run.stderr[-3000:]

    # the features topic deleted and created again: its offsets do not apply, it is read from its beginning
    delete_topics(kafka_bootstrap, [names[0]])
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(kafka_bootstrap, [names[0]], timeout=10)
            break
        except RuntimeError:  # still being deleted
            assert time.monotonic() < deadline, "the topic was not deleted"
            time.sleep(0.5)
    sent = iolstream(
        "produce", "-c", str(cfg), "--dataset", "wine", "--shuffle", "--rows", "30", "--id-prefix", "c"
    )
    assert sent.returncode == 0, sent.stderr
    rerun = iolstream("run", "-c", str(cfg), "--stop-at-end", "--max-seconds", "120")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(
        rf"topic {re.escape(names[0])} is not the one the snapshot read \(topic id \S+, now \S+", rerun.stderr
    )
    predicted = {orjson.loads(v)["id"] for _, v, *_ in consume_all(kafka_bootstrap, names[2], timeout=20)}
    assert {f"c{i}" for i in range(30)} <= predicted, "every row of the new topic is read and predicted"


@pytest.mark.slow
def test_a_first_start_says_it_compiles_and_healthz_says_starting(tmp_path, kafka_bootstrap, kafka_topics):
    names = kafka_topics("f", "l", "p", "d")
    port = free_port()
    cfg = write_config(
        tmp_path / "w.yaml", kafka_bootstrap, names, metrics={"port": port, "host": "127.0.0.1"}
    )
    cache = tmp_path / "numba-cache"
    env = {"NUMBA_CACHE_DIR": str(cache)}
    worker = Worker(cfg, tmp_path / "cold.log", env=env)
    answers = []
    try:
        worker.wait_for(
            r"compiling the kernels this model takes into \S+ \(nothing cached there yet\): usually"
        )
        while "kernels compiled in" not in worker.text():
            assert worker.proc.poll() is None, worker.text()[-3000:]
            answers.append(http(port, "/healthz"))
            time.sleep(0.5)
        worker.wait_for(r"assigned ")
        deadline = time.monotonic() + 60
        while http(port, "/healthz") != (200, "ok\n"):
            assert time.monotonic() < deadline, worker.text()[-3000:]
            time.sleep(0.2)
    finally:
        assert worker.stop() == 0, worker.text()[-3000:]
    assert answers and all(status in (0, 503) for status, _ in answers), answers
    bodies = [body for status, body in answers if status == 503]
    assert all(body.startswith("starting") for body in bodies) and not any("stalled" in b for b in bodies), (
        bodies
    )
    assert any(body.startswith("starting: compiling the kernels (") for body in bodies), bodies
    # the cache is there: warmup finds it, and the next start loads the kernels instead of compiling them
    warm = iolstream("warmup", "-c", str(cfg), env=env)
    assert warm.returncode == 0 and "kernels cached there already" in warm.stderr, warm.stderr
    again = iolstream("run", "-c", str(cfg), "--stop-at-end", "--max-seconds", "120", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "kernels loaded in" in again.stderr and "nothing cached there yet" not in again.stderr


@pytest.mark.kafka
def test_two_workers_with_one_member_id_stop_one_of_them_naming_it(
    tmp_path, kafka_bootstrap, kafka_topics, caplog
):
    """Two live workers with the same group.instance.id (a member id copied to a second deployment) fence each
    other's consumers for ever, each replacing its own and predicting every row again. Fenced three times within
    five minutes, a worker stops (exit 3) with a line naming the id; the other goes on alone."""
    from worker_thread import WorkerThread

    from iolstream.kafka.config import config_from_dict

    names = kafka_topics("f", "l", "p", "d")
    group = unique_group("same-id")

    def cfg(i: int):
        raw = {
            "model": {"n_inputs": 3, "classes": [0, 1], "n_nodes": 8},
            "kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": group},
            "durability": {"transactional_id": f"{group}-copied"},
            "topics": dict(zip(["features", "labels", "predictions", "dead_letters"], names)),
            "metrics": {"port": 0},
            "snapshot": {"dir": str(tmp_path / f"snap-{i}")},
        }
        return config_from_dict(raw, environ={})

    a, b = WorkerThread(cfg(0)).start(), WorkerThread(cfg(1)).start()
    try:
        deadline = time.monotonic() + 240
        while a.thread.is_alive() and b.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        stopped = [w for w in (a, b) if not w.thread.is_alive()]
        assert len(stopped) == 1, "neither stopped: they fence each other for ever"
        assert stopped[0].exit_code == 3
        assert (
            f"same group.instance.id ('{group}-copied'): another worker runs with this member id"
            in caplog.text
        )
        survivor = b if stopped[0] is a else a
        survivor.wait_assigned(2)  # the other goes on, alone in the group
    finally:
        for w in (a, b):
            if w.thread.is_alive():
                w.stop()
