"""``iolstream bench --suite kafka``: the worker end to end on a real broker.

For each model config, on fresh topics of the local broker (or ``--bootstrap``), all in one run, at each
``model.mode`` of ``--modes`` (default: ``auto``, the default mode):

1. ``learner``: full steps (observe a batch, fold the labels of the one before) in this process, no I/O (the
   ceiling; ``bench --suite core``);
2. ``processor``: the worker's pure stream logic (decode, micro-batch, join, encode) fed the
   same messages from memory, no broker: what the stream logic costs on top of the learner;
3. ``worker``: the stream pre-produced (batch messages, then row messages, then the same rows as
   named-field events: a JSON array of 256 events per message, ``{"id": "b0", "c0": .., "c9": ..}``, read
   by a schema of ten required numbers, so the model is the same), then ``iolstream run`` started as its
   own process, as in production. Throughput counts from
   the first prediction of the second batch to the last prediction, read from the Kafka
   timestamps of the prediction messages (the worker's produce times), so process start,
   group join and the first fetch are not in it (``bench --suite core`` and the startup
   numbers in docs/benchmarks.md cover those). Its peak RSS is the OS's high-water mark (VmHWM);
4. ``river``: River's ``SoftmaxRegression``, predict-then-learn, as a plain consumer loop on the
   same topics (counted from its first message; ``bench_river``), on the array topics and on the events;
5. ``latency``: the worker process running, a producer paced at half the worker's measured
   throughput for 20 s stamps each message's event time at send; produce-to-prediction latency is the
   broker's append time of the prediction minus that event time (p50 / p99), read after the run;
6. ``memory`` (small config): the worker's peak RSS after 100,000 and after 1,000,000 rows.

Latency, memory and the named-field events are measured at the first mode. With several modes (``--modes auto forward``), the top-level
figures are the first mode's and ``by_mode`` holds every mode's learner, processor and worker rates with
``worker_cost_vs_<mode>``: that mode's worker rows/s ÷ this one's (batch and one-row messages). ``--rounds R``
runs the worker of every mode in turn R times and keeps each one's best: a slow spell of a shared machine then
hits one run of a mode, not all of its runs. Ratios are same-run; machines here are shared and noisy, so
absolute rates are not comparable between runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import yaml
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic

from iolstream.kafka import clients
from iolstream.tools import bench_names
from iolstream.tools.bench_core import bench_core_step
from iolstream.tools.bench_river import river_loop

CONFIGS = {"small": (128, 4), "poker": (989, 5)}  # (N, L); k = 10, m = 10
BATCH = {"small": 256, "poker": 2200}  # the worker's batch_rows, as in the core suite
ROWS = {"small": 120_000, "poker": 22_000}
MEMORY_ROWS = (100_000, 1_000_000)
LATENCY_SECONDS = 20  # of paced stream
K, M = 10, 10


def _data(rows: int, seed: int = 0):
    from iolstream.tools.builtin_datasets import load

    d = load("poker", rows=rows, seed=seed, sort_cards=True)
    return d.X, d.y


def _producer(bootstrap: str) -> Producer:
    return clients.producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "batch.size": 1_000_000}
    )


FIELDS = [f"c{j}" for j in range(K)]  # the named-field events' numbers
EVENTS_SCHEMA = [
    {"name": name, "type": "number", "required": True} for name in FIELDS
]  # width K: the same model
EVENTS_SECTION = {"time_field": "ts"}  # the events section of the named-field events' worker


def _messages(X, y, batch_rows: int, ids_from: int = 0, events: bool = False):
    """(features, labels) message pairs of ``batch_rows`` rows (1 = one-row messages); ``events``: named-field
    events (a JSON array of them per message), labels as events ``{"id", "y"}``."""
    for start in range(0, len(X), batch_rows):
        stop = min(start + batch_rows, len(X))
        ids = [f"b{ids_from + i}" for i in range(start, stop)]
        lab = y[start:stop].tolist()
        if events:
            rows = X[start:stop].tolist()
            feats = [{"id": i, **dict(zip(FIELDS, row))} for i, row in zip(ids, rows)]
            yield feats, [{"id": i, "y": v} for i, v in zip(ids, lab)]
        elif batch_rows == 1:
            yield {"id": ids[0], "x": X[start].tolist()}, {"id": ids[0], "y": lab[0]}
        else:
            yield {"ids": ids, "x": X[start:stop].tolist()}, {"ids": ids, "y": lab}


def _produce_stream(
    p: Producer,
    features,
    labels,
    X,
    y,
    *,
    batch_rows: int,
    rate: float | None = None,
    ids_from: int = 0,
    events: bool = False,
):
    """Features in messages of ``batch_rows`` rows, each label message one message later, event
    time ("ts") stamped at send; paced to ``rate`` rows/s if given. ``events``: named-field events (each
    with its "ts")."""
    t0 = time.monotonic()
    prev = None
    for i, (feat, lab) in enumerate(_messages(X, y, batch_rows, ids_from, events)):
        if rate:
            wait = t0 + i * batch_rows / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        now = int(time.time() * 1000)
        if events:
            for event in feat:
                event["ts"] = now
        else:
            feat["ts"] = now
        _send(p, features, orjson.dumps(feat))
        if prev is not None:
            _send(p, labels, prev)
        prev = orjson.dumps(lab)
        p.poll(0)
    if prev is not None:
        _send(p, labels, prev)
    p.flush(60)


def _send(p: Producer, topic: str, value: bytes) -> None:
    while True:
        try:
            p.produce(topic, value)
            return
        except BufferError:
            p.poll(0.05)


def _worker_cfg(
    bootstrap, topics, n_nodes, n_layers, snap_dir, classes, batch_rows=256, mode=None, events=False
) -> dict:
    """The worker's config (``mode``: model.mode, None: the default; ``events``: named-field events)."""
    inputs = {"features": EVENTS_SCHEMA} if events else {"n_inputs": K}
    return {
        "model": {
            **inputs,
            "classes": list(classes),
            "n_nodes": n_nodes,
            "n_layers": n_layers,
            "warmup_rows": 256,
            "track_regret": False,
            **({} if mode is None else {"mode": mode}),
        },
        **({"events": dict(EVENTS_SECTION)} if events else {}),
        "kafka": {"bootstrap_servers": bootstrap, "group_id": _names.name("worker")},
        "topics": {
            "features": topics[0],
            "labels": topics[1],
            "predictions": topics[2],
            "dead_letters": topics[3],
        },
        "stream": {"batch_rows": batch_rows, "label_batch_rows": batch_rows},
        "snapshot": {"dir": str(snap_dir), "every_seconds": 30, "every_batches": 100_000},
        "metrics": {"port": 0},
        "logging": {"level": "WARNING"},
    }


_names = (
    bench_names.Names()
)  # this run's topic and group names (run_kafka sets the prefix); deleted at its end


def _topics(tag: str) -> list[str]:
    u = uuid.uuid4().hex[:8]
    return [_names.topic(tag, u, s) for s in ("features", "labels", "predictions", "dead")]


def _ensure(cfg_dict: dict) -> None:
    from iolstream.kafka.config import config_from_dict
    from iolstream.kafka.worker import ensure_topics

    ensure_topics(config_from_dict(cfg_dict, environ={}))


class WorkerProcess:
    """``iolstream run`` in its own process, on a config written to a temporary file."""

    def __init__(
        self, cfg_dict: dict, workdir: Path, *, stop_at_end: bool = False, command: list[str] | None = None
    ):
        """``command``: what runs the worker, given ``-c CONFIG`` and the options (default
        ``python -m iolstream run``); ``stop_at_end``: it stops once it has worked through the input there was
        when it joined (``--stop-at-end``)."""
        self.path = workdir / f"worker-{uuid.uuid4().hex[:6]}.yaml"
        self.path.write_text(yaml.safe_dump(cfg_dict))
        self.log = workdir / (self.path.stem + ".log")
        argv = [*(command or [sys.executable, "-m", "iolstream", "run"]), "-c", str(self.path)]
        if stop_at_end:
            argv.append("--stop-at-end")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.peak_rss_bytes: int | None = None
        self.cpu_samples: list[
            tuple[float, float]
        ] = []  # (wall clock s, the process's CPU s so far), every 20 ms

    def _high_water_mark(self) -> int | None:
        """The process's peak RSS so far (Linux VmHWM, bytes), None once it is gone."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def _cpu_seconds(self) -> float | None:
        """User + system CPU time of the process, all its threads (Linux), None once it is gone."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu_between(self, t0: float, t1: float) -> float:
        """CPU seconds the process used between wall-clock times t0 and t1 (s), from the samples."""
        if len(self.cpu_samples) < 2:
            return float("nan")
        times, cpu = np.array(self.cpu_samples).T
        return float(np.interp(t1, times, cpu) - np.interp(t0, times, cpu))

    def wait(self, timeout: float) -> int:
        """Exit code; records the process's peak RSS. Kills it after ``timeout`` seconds.

        The peak is VmHWM read every 20 ms while it runs (it misses at most the last 20 ms), not
        wait4's ru_maxrss: that one survives exec, so it counts the forked copy of this process
        (which holds the benchmark's data) and grows with the rows generated here."""
        deadline = time.monotonic() + timeout
        while True:
            hwm, cpu = self._high_water_mark(), self._cpu_seconds()
            if hwm is not None:
                self.peak_rss_bytes = max(self.peak_rss_bytes or 0, hwm)
            if cpu is not None:
                self.cpu_samples.append((time.time(), cpu))
            pid, status, _ = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"the worker did not stop within {timeout:g} s; log: {self.log}")
            time.sleep(0.02)

    def stop(self, timeout: float = 60) -> int:
        """Ask the worker to stop (SIGTERM) and wait for its exit code."""
        self.proc.terminate()
        return self.wait(timeout)

    def check(self, code: int) -> None:
        """Raise with the worker's log when it did not exit cleanly."""
        if code != 0:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the worker exited {code}; its log ends:\n{tail}")


def _prediction_times(bootstrap: str, topic: str, skip: int) -> tuple[int, float, tuple[float, float]]:
    """(predictions on ``topic``, rows/s between the prediction at offset ``skip`` and the last, the
    wall-clock times (s) of those two), from the messages' Kafka timestamps (the worker's produce
    times), reading just those two."""
    c = clients.consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _names.name("read"),
            "enable.auto.commit": False,
        }
    )
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        n = high - low
        if n < skip + 2:  # too few to time (the caller reports the count)
            return n, 0.0, (0.0, 0.0)
        stamps = []
        for offset in (low + skip, high - 1):
            c.assign([TopicPartition(topic, 0, offset)])
            msg = None
            deadline = time.monotonic() + 10
            while msg is None or msg.error():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot read {topic}[0]@{offset}")
                msg = c.poll(1.0)
            stamps.append(msg.timestamp()[1])
        seconds = max(stamps[1] - stamps[0], 1) / 1000.0
        return n, (n - skip - 1) / seconds, (stamps[0] / 1000.0, stamps[1] / 1000.0)
    finally:
        c.close()


def _worker_run(
    bootstrap, name, X, y, workdir: Path, *, batch_rows: int, tag: str, mode=None, events: bool = False
) -> dict:
    """Pre-produce X, y (``events``: as named-field events), run a worker process (at ``mode``; None: the default)
    over them; rows/s and peak RSS."""
    n_nodes, n_layers = CONFIGS[name]
    topics = _topics(f"{name}-{tag}")
    snap_dir = workdir / f"snap-{name}-{tag}-{uuid.uuid4().hex[:6]}"
    cfg = _worker_cfg(
        bootstrap, topics, n_nodes, n_layers, snap_dir, tuple(range(M)), BATCH[name], mode, events
    )
    _ensure(cfg)
    _produce_stream(_producer(bootstrap), topics[0], topics[1], X, y, batch_rows=batch_rows, events=events)
    worker = WorkerProcess(cfg, workdir, stop_at_end=True)
    worker.check(worker.wait(timeout=900))
    n, rate, (t0, t1) = _prediction_times(bootstrap, topics[2], skip=BATCH[name])
    if n != len(X):
        raise RuntimeError(f"{tag}: {n} predictions for {len(X)} rows; worker log: {worker.log}")
    cpu = worker.cpu_between(t0, t1)  # over the timed rows only: no start-up, no idle tail
    timed_rows = n - BATCH[name] - 1
    return {
        "rows": n,
        "rows_per_second": rate,
        "peak_rss_mb": (worker.peak_rss_bytes or 0) / 2**20,
        "cpu_seconds_per_100k_rows": cpu / timed_rows * 1e5,
        "cores_used": cpu / max(t1 - t0, 1e-3),
        "topics": topics,
    }


def _processor_rate(name: str, X, y, mode=None, events: bool = False) -> float:
    """The worker's stream logic alone (StreamProcessor) at ``mode`` (None: the default), messages from memory,
    after 8 warm-up batches, fed as the worker feeds them: the messages the worker reads (each row with its event
    time), its events section, the predictions encoded; ``events``: the same rows as named-field events."""
    from iolstream.core import step_tuner
    from iolstream.core.model import EdRVFL, ModelConfig
    from iolstream.stream.config import EventsConfig, StreamConfig
    from iolstream.stream.processor import StreamProcessor

    n_nodes, n_layers = CONFIGS[name]
    b = BATCH[name]
    inputs = {"features": EVENTS_SCHEMA} if events else {"n_inputs": K}
    model = EdRVFL(
        ModelConfig(
            **inputs,
            classes=tuple(range(M)),
            n_nodes=n_nodes,
            n_layers=n_layers,
            warmup_rows=256,
            track_regret=False,
            **({} if mode is None else {"mode": mode}),
        )
    )
    step_tuner.configure_for_model(model)
    shape = EventsConfig(**EVENTS_SECTION) if events else None
    proc = StreamProcessor(model, StreamConfig(batch_rows=b, label_batch_rows=b), events=shape)
    pairs = []
    for feat, lab in _messages(X, y, b, events=events):
        for row in feat if events else [feat]:
            row["ts"] = 1_764_000_000_000  # as _produce_stream stamps them
        pairs.append((orjson.dumps(feat), orjson.dumps(lab)))
    warm = min(8, len(pairs) // 2)  # a short stream (--kafka-scale) keeps half its batches timed
    t0, prev = None, None
    for i, (feat, lab) in enumerate(pairs):
        if i == warm:
            t0 = time.perf_counter()
        for value, labels in ((feat, False), (prev, True)):
            out = None if value is None else proc.feed(value, ("l" if labels else "f", 0, i), 0, labels)
            if out is not None:
                _ = out.predictions  # encoded, as the worker's output does
        prev = lab
    seconds = time.perf_counter() - t0
    return (len(X) - warm * b) / seconds


def _wait_for(bootstrap: str, topic: str, count: int, timeout: float) -> int:
    """Wait until ``topic``[0] holds ``count`` messages (or ``timeout`` passes); returns how many it holds."""
    c = clients.consumer({"bootstrap.servers": bootstrap, "group.id": _names.name("hw")})
    try:
        deadline = time.monotonic() + timeout
        while (
            n := c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        ) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        return n
    finally:
        c.close()


def _latency(bootstrap, name, X, y, rate: float, workdir: Path, mode=None) -> dict:
    """p50/p99 produce-to-prediction latency with the producer paced at ``rate`` rows/s.

    Latency = when the broker appended the prediction (the predictions topic of this run is
    created with message.timestamp.type=LogAppendTime) minus the row's event time, stamped by
    the producer just before it sends the features message: the time from a row's send until
    its prediction is in Kafka, readable by any consumer. The predictions are read after the
    run: a consumer reading them live would share these 2 cores with the worker and the broker
    (in one run it alone raised p99 from ~30 to ~70 ms) and add its own fetch wait."""
    n_nodes, n_layers = CONFIGS[name]
    topics = _topics(f"{name}-latency")
    cfg = _worker_cfg(
        bootstrap,
        topics,
        n_nodes,
        n_layers,
        workdir / f"snap-{name}-latency",
        tuple(range(M)),
        BATCH[name],
        mode,
    )
    admin = clients.admin({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(topics[2], 1, 1, config={"message.timestamp.type": "LogAppendTime"})]
    )
    created[topics[2]].result(30)
    _ensure(cfg)
    worker = WorkerProcess(cfg, workdir)
    warm = 1024
    try:
        # warm the worker up (process start, Numba cache, group join) before the paced stream, and
        # the producer too: a new idempotent producer's first messages wait ~60 ms for its
        # producer id and metadata, which is not the worker's latency
        producer = _producer(bootstrap)
        _produce_stream(producer, topics[0], topics[1], X[:warm], y[:warm], batch_rows=256, ids_from=-(10**6))
        if _wait_for(bootstrap, topics[2], warm, 120) < warm:
            raise RuntimeError(f"latency: the worker did not predict the warm-up rows; log: {worker.log}")
        _produce_stream(producer, topics[0], topics[1], X, y, batch_rows=256, rate=rate)
        _wait_for(bootstrap, topics[2], warm + len(X), 60)
    finally:
        code = worker.stop()
    worker.check(code)
    latencies = []
    c = clients.consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _names.name("latency"),
            "enable.auto.commit": False,
        }
    )
    try:
        c.assign([TopicPartition(topics[2], 0, warm)])
        deadline = time.monotonic() + 60
        while len(latencies) < len(X) and time.monotonic() < deadline:
            for msg in c.consume(10_000, 1.0):
                if msg.error():
                    continue
                kind, appended = msg.timestamp()
                if kind != TIMESTAMP_LOG_APPEND_TIME:
                    raise RuntimeError(f"latency: {topics[2]} does not carry the broker's append time")
                event = orjson.loads(msg.value()).get("event_ts")
                if event is not None:
                    latencies.append(appended - event)
    finally:
        c.close()
    if len(latencies) < len(X):
        raise RuntimeError(
            f"latency: {len(latencies)} predictions of {len(X)} rows; worker log: {worker.log}"
        )
    lat = np.asarray(latencies, dtype=np.float64)
    return {
        "rate_rows_per_second": rate,
        "rows": len(latencies),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "measured": "broker append time of the prediction - event time stamped at send",
    }


def run_kafka(args) -> dict:
    """The kafka suite (module docstring) on fresh topics of the local broker."""
    bootstrap = args.bootstrap or f"127.0.0.1:{os.environ.get('KAFKA_PORT', '19092')}"
    scale = getattr(args, "kafka_scale", 1.0)
    global _names
    _names = bench_names.Names(getattr(args, "prefix", bench_names.DEFAULT_PREFIX))
    workdir = Path(tempfile.mkdtemp(prefix="iolstream-bench-"))
    try:
        results = _run_kafka(args, bootstrap, scale, workdir)
    finally:
        bench_names.delete_topics(bootstrap, _names.created)
    shutil.rmtree(workdir, ignore_errors=True)  # kept after a failure: the error names a worker log in it
    return {"suite": "kafka", "bootstrap": bootstrap, "results": results}


def _best_runs(bootstrap, name, X, y, workdir: Path, modes: list, rounds: int, *, batch_rows: int, tag: str):
    """{mode: its fastest worker run of ``rounds``}, the modes run in turn in every round."""
    best: dict = {}
    for _ in range(rounds):
        for mode in modes:
            run = _worker_run(bootstrap, name, X, y, workdir, batch_rows=batch_rows, tag=tag, mode=mode)
            if mode not in best or run["rows_per_second"] > best[mode]["rows_per_second"]:
                best[mode] = run
    return best


def _run_kafka(args, bootstrap: str, scale: float, workdir: Path) -> dict:
    modes = list(dict.fromkeys(getattr(args, "modes", None) or ["auto"]))
    rounds = max(int(getattr(args, "rounds", 1)), 1)
    first = modes[0]
    results = {}
    for name in args.configs:
        rows = max(int(ROWS[name] * scale), 4 * BATCH[name])
        X, y = _data(rows)
        by_mode = {
            mode: {
                "learner_rows_per_second": bench_core_step(
                    name, "float64", seconds=4.0, mode=mode
                ).rows_per_second,
                "processor_rows_per_second": _processor_rate(name, X, y, mode),
            }
            for mode in modes
        }
        batch = _best_runs(bootstrap, name, X, y, workdir, modes, rounds, batch_rows=256, tag="batch")
        river = river_loop(bootstrap, *batch[first]["topics"][:2], min(rows, 40_000), 120)
        # the same rows as named-field events, side by side with the arrays (and River reading the events)
        processor_events = _processor_rate(name, X, y, first, events=True)
        named = _worker_run(
            bootstrap, name, X, y, workdir, batch_rows=256, tag="events", mode=first, events=True
        )
        river_events = river_loop(bootstrap, *named["topics"][:2], min(rows, 40_000), 120)
        n_rows = max(rows // 4, 4 * BATCH[name])
        row = _best_runs(
            bootstrap, name, X[:n_rows], y[:n_rows], workdir, modes, rounds, batch_rows=1, tag="rows"
        )
        for mode, entry in by_mode.items():
            worker_rate = batch[mode]["rows_per_second"]
            entry["worker_batch_messages"] = {k: v for k, v in batch[mode].items() if k != "topics"}
            entry["worker_row_messages"] = {k: v for k, v in row[mode].items() if k != "topics"}
            entry["worker_vs_learner"] = worker_rate / entry["learner_rows_per_second"]
            entry["worker_vs_river"] = worker_rate / river
            entry["batch_vs_row_messages"] = worker_rate / row[mode]["rows_per_second"]
            for other in modes:
                if other != mode:  # > 1: this mode's worker is that much slower than ``other``'s
                    entry[f"worker_cost_vs_{other}"] = {
                        "batch_messages": batch[other]["rows_per_second"] / worker_rate,
                        "row_messages": row[other]["rows_per_second"] / row[mode]["rows_per_second"],
                    }
        entry = {
            **{k: v for k, v in by_mode[first].items() if not k.startswith("worker_cost_vs_")},
            "mode": first,
            "river_softmax_rows_per_second": river,
            "processor_events_rows_per_second": processor_events,
            "worker_events": {k: v for k, v in named.items() if k != "topics"},
            "river_softmax_events_rows_per_second": river_events,
            "events_vs_arrays": named["rows_per_second"] / batch[first]["rows_per_second"],
            "events_vs_river_events": named["rows_per_second"] / river_events,
        }
        if len(modes) > 1:
            entry["by_mode"] = by_mode
        rate = batch[first]["rows_per_second"] / 2
        n_lat = max(int(rate * LATENCY_SECONDS * scale), 4 * BATCH[name])  # its own rows: 20 s of stream
        X_lat, y_lat = _data(n_lat, seed=2)
        entry["latency_at_half_max"] = _latency(bootstrap, name, X_lat, y_lat, rate, workdir, first)
        if name == "small" and getattr(args, "memory", True):
            memory = {}
            for n in (int(r * scale) for r in MEMORY_ROWS):
                Xm, ym = _data(n, seed=1)
                memory[str(n)] = _worker_run(
                    bootstrap, name, Xm, ym, workdir, batch_rows=256, tag=f"mem{n}", mode=first
                )["peak_rss_mb"]
            entry["peak_rss_mb_by_rows"] = memory
        results[name] = entry
        if not args.json:
            print(name, orjson.dumps(entry, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return results
