"""The numbers of "Recovery" in docs/benchmarks.md: the worker's restart time and replay rate with a large state.

    .venv/bin/python benchmarks/recovery.py [--nodes 566 --layers 5] [--exactly-once] [--bootstrap HOST:PORT]

1. build the state: stream ``--rows`` rows (k=10, 10 classes, labels 500 rows late) through a
   worker that snapshots only at its clean shutdown;
2. restart time: with one new message (100 rows) waiting, start a worker and time process start → first
   prediction produced (its record timestamp), with the snapshot load, group join and first
   batch from the worker's log;
3. replay rate: that worker then takes ``--rows`` more rows (no snapshot) and is killed with
   SIGKILL; the next one resumes from the old snapshot and replays them (exactly-once: without
   emitting, up to the committed offsets; at-least-once: re-emitting) — rows / seconds.

Needs a broker (``bash scripts/kafka.sh start``). Prints one summary line per phase.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iolstream.tools import produce

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "crash_worker.py"


def log_time(log: str, pattern: str) -> float:
    """Wall-clock time (today, local) of the first log line matching ``pattern``."""
    m = re.search(r"^(\d\d:\d\d:\d\d\.\d\d\d) .*" + pattern, log, re.M)
    if m is None:
        raise RuntimeError(f"{pattern!r} not in the log:\n{log[-2000:]}")
    clock = datetime.strptime(m.group(1), "%H:%M:%S.%f").time()
    return datetime.combine(datetime.now().date(), clock).timestamp()


def first_prediction_after(bootstrap: str, topic: str, start_offset: int, timeout: float = 120.0) -> float:
    """Record timestamp (s) of the first prediction at or after ``start_offset`` (read_committed)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, start_offset)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                return msg.timestamp()[1] / 1000.0
    finally:
        c.close()
    raise RuntimeError("no prediction")


def end_offset(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("IOLSTREAM_TEST_BOOTSTRAP", "127.0.0.1:19092"))
    ap.add_argument("--nodes", type=int, default=566, help="N (566 with L=5, k=10: a ~40 MB snapshot)")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--rows", type=int, default=20_000, help="rows to build the state, and rows to replay")
    ap.add_argument("--exactly-once", action="store_true")
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:8]
    topics = {k: f"recovery-{tag}-{k}" for k in ("features", "labels", "predictions", "dead_letters")}
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()]).values():
        fut.result()
    work = Path(tempfile.mkdtemp(prefix="iolstream-recovery-"))
    cfg = {
        "model": {"n_inputs": 10, "classes": list(range(10)), "n_nodes": args.nodes, "n_layers": args.layers},
        "kafka": {"bootstrap_servers": args.bootstrap, "group_id": f"recovery-{tag}"},
        "topics": {**topics, "create": False},
        "stream": {"batch_rows": 256, "row_ttl_ms": None},
        "snapshot": {
            "dir": str(work / "snapshots"),
            "every_batches": 10**9,
            "every_seconds": 1e9,
            "first_after_seconds": None,
        },  # at shutdown only
        "durability": {"exactly_once": args.exactly_once},
        "metrics": {"port": 0},
    }
    (work / "worker.yaml").write_text(yaml.safe_dump(cfg))
    rng = np.random.default_rng(0)
    n = 2 * args.rows + 1100
    X = rng.normal(size=(n, 10))
    y = (X @ rng.normal(size=(10, 10))).argmax(axis=1)
    msgs = produce.plan(X, y, produce.PlanOptions(batch_rows=100, label_delay_rows=500, seed=1))
    cuts = {args.rows, args.rows + 100, 2 * args.rows + 100, n}  # feature rows sent before each phase
    chunks, chunk, rows = [], [], 0
    for m in msgs:
        chunk.append(m)
        if m.kind == "features":
            rows += m.rows
            if rows in cuts:
                chunks.append(chunk)
                chunk = []
    chunks[-1].extend(chunk)

    def send(part):
        produce.send(
            part,
            producer_conf={"bootstrap.servers": args.bootstrap},
            features_topic=topics["features"],
            labels_topic=topics["labels"],
        )

    def start(name: str, *, stop_at_end: bool):
        log_path = work / f"{name}.log"
        t0 = time.time()
        extra = ["--stop-at-end"] if stop_at_end else ["--idle-stop-seconds", "600"]
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(work / "worker.yaml"), *extra],
            stdout=subprocess.DEVNULL,
            stderr=open(log_path, "wb"),
            cwd=REPO,
        )
        return proc, log_path, t0

    mode = "exactly-once" if args.exactly_once else "at-least-once"
    print(f"{mode}, N={args.nodes} L={args.layers} k=10 m=10, work dir {work}")

    # 1. build the state
    send(chunks[0])
    proc, log_path, t0 = start("build", stop_at_end=True)
    proc.wait()
    log = log_path.read_text()
    snap = re.search(r"snapshot (snap-\d+\.iolsnap): ([\d.]+) MB in ([\d.]+) s", log)
    print(
        f"build: {args.rows} rows in {time.time() - t0:.1f} s; final snapshot {snap.group(2)} MB written in {snap.group(3)} s"
    )

    # 2. restart time, nothing to replay
    send(chunks[1])
    before = end_offset(args.bootstrap, topics["predictions"])
    proc, log_path, t0 = start("restart", stop_at_end=False)
    first = first_prediction_after(args.bootstrap, topics["predictions"], before)
    log = log_path.read_text()
    loaded = re.search(r"loaded snapshot \S+ \((\d+) bytes, ([\d.]+) s\)", log)
    print(
        f"restart: process start → first prediction {first - t0:.2f} s "
        f"(snapshot of {int(loaded.group(1)) / 1e6:.1f} MB read and verified in {float(loaded.group(2)):.2f} s, "
        f"logged 'loaded' at +{log_time(log, 'loaded snapshot') - t0:.2f} s, "
        f"'assigned' at +{log_time(log, 'assigned ') - t0:.2f} s)"
    )

    # 3. replay rate: more rows, no snapshot, kill -9, restart
    send(chunks[2])
    target = 2 * args.rows + 100
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": cfg["kafka"]["group_id"]})
        committed = c.committed([TopicPartition(topics["features"], 0)], timeout=10)[0].offset
        c.close()
        predicted = end_offset(args.bootstrap, topics["predictions"])
        if (args.exactly_once and committed * 100 >= target) or (
            not args.exactly_once and predicted >= target
        ):
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    send(chunks[3])  # new input waiting behind the replay
    before = end_offset(args.bootstrap, topics["predictions"])
    proc, log_path, t0 = start("replay", stop_at_end=True)
    proc.wait()
    log = log_path.read_text()
    assigned = log_time(log, "assigned ")
    replayed = args.rows + 100  # every row since the snapshot
    if args.exactly_once:
        done = log_time(log, rf"{topics['features']}\[0\]: replayed up to the committed offset")
        first = first_prediction_after(args.bootstrap, topics["predictions"], before)
        print(
            f"replay: {replayed} rows replayed without emitting in {done - assigned:.2f} s = "
            f"{replayed / (done - assigned):,.0f} rows/s; process start → first new prediction {first - t0:.2f} s"
        )
    else:
        first = first_prediction_after(args.bootstrap, topics["predictions"], before)
        last = log_time(log, "stopping")
        rows, seconds = replayed + 1000, last - 3 - assigned  # the worker stops 3 s after its last input
        print(
            f"replay: process start → first (re-emitted) prediction {first - t0:.2f} s; {rows} rows "
            f"re-processed and re-emitted in {seconds:.2f} s after assignment ≈ {rows / seconds:,.0f} rows/s"
        )
    admin.delete_topics(list(topics.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
