"""The table "Broker outages" of docs/benchmarks.md: does a running worker ride a broker outage out?

    .venv/bin/python benchmarks/broker_outages.py [--runs 10] [--outage 30] [--exactly-once] [--rows 30000] [--rate 1000]

Each run, on a broker of its own (scripts/kafka.sh on --port, data in a temporary directory):
1. a producer sends ``--rows`` rows (labels 200 rows late) at ``--rate`` rows/s; a worker
   (``iolstream run``) predicts them;
2. ``--after`` seconds in, the broker is killed (SIGKILL) and started again ``--outage`` seconds later
   (same data); the producer buffers meanwhile;
3. once every row is predicted (read_committed), the worker gets SIGTERM.
A run passes when the worker never exited before the SIGTERM, exited 0 after it, and every row has
exactly one prediction (at-least-once: at least one). Also reported: /healthz answers other than 200
during the run (polled every 0.5 s), the longest gap between two status lines, and the worker's
log lines at WARNING or above.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import yaml
from confluent_kafka import Consumer, TopicPartition

from iolstream.tools import produce

REPO = Path(__file__).resolve().parent.parent
KAFKA = ["bash", str(REPO / "scripts" / "kafka.sh")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker(cmd: str, env: dict) -> None:
    subprocess.run([*KAFKA, cmd], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_broker(env: dict) -> None:
    pid = int((Path(env["IOLSTREAM_KAFKA_DATA"]) / "kafka.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            os.kill(pid, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            return


def predictions(bootstrap: str, topic: str, expected: int, timeout: float) -> Counter:
    """Prediction ids per count, read_committed, waiting until ``expected`` distinct ids or ``timeout``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"outage-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    counts: Counter = Counter()
    deadline = time.monotonic() + timeout
    idle_until = None
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(1000, 0.5)
            for m in msgs:
                if m.error() is None:
                    counts[orjson.loads(m.value())["id"]] += 1
            if len(counts) >= expected:  # then a short while more, for duplicates
                idle_until = idle_until or time.monotonic() + 3.0
                if time.monotonic() >= idle_until:
                    break
    finally:
        c.close()
    return counts


def one_run(i: int, args, env: dict, bootstrap: str, work: Path) -> dict:
    tag = f"o{i}-{uuid.uuid4().hex[:6]}"
    topics = {k: f"{tag}.{k}" for k in ("features", "labels", "predictions", "dead_letters")}
    port = free_port()
    cfg = {
        "model": {"n_inputs": 8, "classes": [0, 1, 2], "n_nodes": 32, "n_layers": 2},
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{tag}"},
        "topics": topics,
        "snapshot": {"dir": str(work / f"snap-{tag}"), "every_seconds": 5},
        "durability": {"exactly_once": args.exactly_once},
        "metrics": {"port": port, "host": "127.0.0.1"},
        "logging": {"status_every_seconds": 2},
    }
    path = work / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log_path = work / f"{tag}.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "iolstream", "run", "-c", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=open(log_path, "wb"),
        cwd=REPO,
    )
    rng = np.random.default_rng(i)
    X = rng.normal(size=(args.rows, 8))
    y = (X @ rng.normal(size=(8, 3))).argmax(axis=1)
    plan = produce.plan(X, y, produce.PlanOptions(batch_rows=50, label_delay_rows=200, seed=i))
    ids = {r for m in plan if m.kind == "features" for r in m.obj["ids"]}
    health = Counter()
    stop = threading.Event()

    def poll_health():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    health[r.status] += 1
            except urllib.error.HTTPError as e:
                health[e.code] += 1
            except OSError:
                health["down"] += 1
            stop.wait(0.5)

    time.sleep(3.0)  # the worker starts; /healthz answers 503 "starting" until then
    sender = threading.Thread(
        target=produce.send,
        args=(plan,),
        kwargs={
            "producer_conf": {"bootstrap.servers": bootstrap, "message.timeout.ms": 600_000, "log_level": 2},
            "features_topic": topics["features"],
            "labels_topic": topics["labels"],
            "rate": args.rate,
        },
        daemon=True,
    )
    sender.start()
    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    time.sleep(args.after)
    kill_broker(env)
    down_at = time.monotonic()
    time.sleep(args.outage)
    early_exit = worker.poll()
    broker("start", env)
    up_at = time.monotonic()
    sender.join(timeout=args.rows / args.rate + 300)
    counts = predictions(bootstrap, topics["predictions"], len(ids), timeout=300)
    early_exit = early_exit if early_exit is not None else worker.poll()
    worker.send_signal(signal.SIGTERM)
    try:
        code = worker.wait(60)
    except subprocess.TimeoutExpired:
        worker.kill()
        code = "hung"
    stop.set()
    log = log_path.read_text(errors="replace").splitlines()
    status_times = [_t(line) for line in log if "rows_in=" in line]
    gaps = [b - a for a, b in zip(status_times, status_times[1:])]
    loud = [line for line in log if " WARNING " in line or " ERROR " in line or " CRITICAL " in line]
    missing = len(ids - set(counts))
    twice = sum(1 for n in counts.values() if n > 1)
    ok = early_exit is None and code == 0 and not missing and (twice == 0 or not args.exactly_once)
    return {
        "run": i,
        "ok": ok,
        "exit_before_sigterm": early_exit,
        "exit": code,
        "rows": len(ids),
        "missing": missing,
        "predicted_twice": twice,
        "healthz": dict(health),
        "max_status_gap_s": round(max(gaps, default=0), 1),
        "warning_lines": len(loud),
        "outage_s": round(up_at - down_at, 1),
        "producers_replaced": sum("transactional producer replaced" in line for line in log),
        "log": str(log_path),
    }


def _t(line: str) -> float:
    h, m, s = line[:12].split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--outage", type=float, default=30.0, help="seconds the broker is down")
    ap.add_argument("--after", type=float, default=8.0, help="seconds of streaming before the outage")
    ap.add_argument("--rows", type=int, default=30_000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--exactly-once", action="store_true")
    ap.add_argument("--port", type=int, default=28192, help="the outage broker's port (controller: +1)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iolstream-outage-"))
    env = {**os.environ, "KAFKA_PORT": str(args.port), "IOLSTREAM_KAFKA_DATA": str(work / "broker")}
    bootstrap = f"127.0.0.1:{args.port}"
    broker("start", env)
    results = []
    try:
        for i in range(args.runs):
            r = one_run(i, args, env, bootstrap, work)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        broker("stop", env)
    passed = sum(r["ok"] for r in results)
    mode = "exactly-once" if args.exactly_once else "at-least-once"
    print(f"{mode}: {passed} of {len(results)} runs passed ({args.outage:g} s outage each); work dir {work}")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
