"""``iolstream bench --suite group``: one worker against a group of workers sharing one model (issue 15).

All in one run, on the local broker (or ``--bootstrap``), default model config (n_nodes 512, 2 layers):

1. ``throughput``: generated poker rows pre-produced once to fresh ``--partitions``-partition features and
   labels topics (batch messages of 256 rows keyed by batch, its labels one message later with the same
   key: the same partition, so the same member); then ``iolstream run --stop-at-end`` as one plain worker,
   then as ``--group-workers`` processes in one consumer group with ``group.enabled`` (each its own
   predictions topic, consumer group and deltas topic). Rows/s = predictions ÷ (last − first prediction's
   Kafka timestamp) over every partition, and the same from the moment every worker holds partitions (a member
   whose join lost the race to the first one is start-up, not throughput); the workers' CPU seconds over each
   window give the cores used.
   The broker runs on the same cores (``cpu_count`` is the machine's): compare ratios within the run;
2. ``sync_costs``: per config (default, and the paper's poker N=989, L=5), in this process, on a model
   that learned some rows: the record's bytes (a ``kafka.snapshots`` blob, as ``kafka.group`` sends it),
   building the record (own sums) + encoding it, producing it (chunked at 900,000 bytes) and flushing it
   to a real topic, decoding it, applying it (``GroupState.apply``: the merge) and the re-solve that
   follows (every layer refactored and solved: the upper bound; a -F step that factors A + DᵀD anyway
   absorbs it), and the per-row cost of a plain -F step on the same config (batch 256; poker 2,200);
3. ``quality``: ``tools.group_sim.quality_table`` on segment (and poker with ``--group-poker-rows``):
   group and independent members against one worker, prequential accuracy in stream order.

Ratios are same-run; the machine is shared and noisy, absolute rates are not comparable across runs.
"""

from __future__ import annotations

import calendar
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
from confluent_kafka import KafkaError, Producer, TopicPartition

from iolstream.core import step_tuner
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka import clients, snapshots
from iolstream.stream.group import GroupState
from iolstream.tools import bench_names
from iolstream.tools.bench_kafka import WorkerProcess
from iolstream.tools.group_sim import quality_table

BATCH = 256  # rows per input message and the worker's batch_rows
CHUNK_BYTES = 900_000  # group.chunk_bytes' default
SYNC_CONFIGS = {
    "default": (512, 2, 256),
    "poker": (989, 5, 2200),
}  # (n_nodes, n_layers, batch_rows); k = 10, m = 10


def _poker(rows: int, seed: int = 0):
    from iolstream.tools.builtin_datasets import load

    d = load("poker", rows=rows, seed=seed, sort_cards=True)
    return d.X, d.y, d.classes


# ---------------------------------------------------------------------------------------------- throughput


def _worker_cfg(
    bootstrap: str,
    topics: dict,
    group_id: str,
    snap_dir: Path,
    partitions: int,
    group: bool,
    scaling: tuple | None = None,
) -> dict:
    """``scaling``: (mean, std) of a fixed scaler. The group suite fixes it, the same for both runs: with a warm-up
    scaler a group member holds its rows until the group's scaling has gone round the deltas topic."""
    model = {"n_inputs": 10, "classes": list(range(10)), "track_regret": False}
    if scaling is not None:
        model.update(
            scaler="fixed",
            scaler_mean=[float(v) for v in scaling[0]],
            scaler_std=[float(v) for v in scaling[1]],
        )
    return {
        "model": model,
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group_id},
        "topics": {**topics, "create": True, "partitions": partitions},
        "stream": {"batch_rows": BATCH, "label_batch_rows": BATCH},
        "snapshot": {"dir": str(snap_dir), "every_seconds": 30, "every_batches": 100_000},
        "group": {"enabled": group},
        "metrics": {"port": 0},
        "logging": {
            "level": "INFO",
            "format": "json",
            "status_every_seconds": 5,
        },  # INFO: when it was assigned
    }


def _produce_input(bootstrap: str, features: str, labels: str, X, y) -> None:
    """Batch messages of BATCH rows keyed by batch; each batch's labels one message later, same key."""
    p = clients.producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "batch.size": 1_000_000}
    )
    prev = None
    for i, start in enumerate(range(0, len(X), BATCH)):
        ids = [f"r{j}" for j in range(start, min(start + BATCH, len(X)))]
        key = f"k{i}".encode()
        _send(p, features, orjson.dumps({"ids": ids, "x": X[start : start + len(ids)].tolist()}), key)
        if prev is not None:
            _send(p, labels, *prev)
        prev = (orjson.dumps({"ids": ids, "y": y[start : start + len(ids)].tolist()}), key)
    _send(p, labels, *prev)
    p.flush(60)


def _send(p: Producer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            p.produce(topic, value, key=key)
            p.poll(0)
            return
        except BufferError:
            p.poll(0.05)


def _prediction_window(
    bootstrap: str, topic: str, names: bench_names.Names
) -> tuple[int, float, float, np.ndarray]:
    """(predicted rows, first and last Kafka timestamp in s, (messages, 2) array of [timestamp s, rows]) over every
    partition of ``topic``."""
    c = clients.consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": names.name("read"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        rows, first, last, eof, stamps = 0, float("inf"), 0.0, set(), []
        deadline = time.monotonic() + 120
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for msg in c.consume(5000, 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(msg.partition())
                    continue
                eof.discard(msg.partition())
                obj = orjson.loads(msg.value())
                n = len(obj["ids"]) if "ids" in obj else 1
                ts = msg.timestamp()[1] / 1000.0
                rows, first, last = rows + n, min(first, ts), max(last, ts)
                stamps.append((ts, n))
        return rows, first, last, np.array(stamps, dtype=np.float64).reshape(-1, 2)
    finally:
        c.close()


def _run_workers(
    bootstrap, topics, workdir: Path, partitions: int, n_workers: int, tag: str, n_rows: int, scaling, names
) -> dict:
    group_id = names.name("group", tag, random=6)
    cfg = _worker_cfg(
        bootstrap, topics, group_id, workdir / f"snap-{tag}", partitions, group=n_workers > 1, scaling=scaling
    )
    workers = []
    for i in range(n_workers):
        member_cfg = dict(
            cfg, group={**cfg["group"], "member_id": f"m{i}"} if n_workers > 1 else cfg["group"]
        )
        workers.append(WorkerProcess(member_cfg, workdir, stop_at_end=True))
    codes = [None] * n_workers

    def wait(
        i: int,
    ) -> None:  # each sampled while it runs (CPU, RSS): waited for side by side, not one after the other
        codes[i] = workers[i].wait(timeout=1800)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w, code in zip(workers, codes):
        w.check(-1 if code is None else code)
    rows, t0, t1, stamps = _prediction_window(bootstrap, topics["predictions"], names)
    if rows < n_rows:
        raise RuntimeError(
            f"{tag}: {rows} predictions for {n_rows} rows; logs: {[str(w.log) for w in workers]}"
        )
    cpu = sum(w.cpu_between(t0, t1) for w in workers)
    seconds = max(t1 - t0, 1e-3)
    # from the moment every worker holds partitions: a member that joins late (its group join lost the race to
    # the first one) is no part of a group's throughput, only of its start-up
    firsts = [_first_assignment(w.log) for w in workers]
    joined = float("inf") if None in firsts else max(firsts)
    after = stamps[stamps[:, 0] >= joined]
    steady_seconds = t1 - max(joined, t0)
    if (
        steady_seconds < 1.0
    ):  # a member got partitions only once (nearly) every row was predicted, or never: no group at work
        steady_rate = steady_cores = None
    else:
        steady_rate = after[:, 1].sum() / steady_seconds
        steady_cores = sum(w.cpu_between(max(joined, t0), t1) for w in workers) / steady_seconds
    return {
        "workers": n_workers,
        "rows_predicted": rows,
        "seconds": seconds,
        "rows_per_second": n_rows / seconds,
        "worker_cpu_seconds": cpu,
        "cores_used_by_workers": cpu / seconds,
        "all_joined_after_first_prediction_s": None if joined == float("inf") else max(joined - t0, 0.0),
        "rows_after_all_joined": int(after[:, 1].sum()),
        "rows_per_second_after_all_joined": steady_rate,
        "cores_used_after_all_joined": steady_cores,
        "peak_rss_mb": [round((w.peak_rss_bytes or 0) / 2**20, 1) for w in workers],
    }


def _first_assignment(log_path: Path) -> float | None:
    """Epoch seconds of the worker's first "assigned" log line (JSON log lines, ``ts`` in UTC); None: never assigned."""
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        rec = orjson.loads(line)
        if str(rec.get("message", "")).startswith("assigned"):
            stamp, ms = rec["ts"].rstrip("Z").split(".")
            return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000.0
    return None


def run_throughput(
    bootstrap: str, rows: int, partitions: int, group_workers: int, workdir: Path, names: bench_names.Names
) -> dict:
    X, y, _ = _poker(rows, seed=1)
    head = X[:256]
    scaling = (head.mean(axis=0), np.where(head.std(axis=0, ddof=1) > 0, head.std(axis=0, ddof=1), 1.0))
    u = uuid.uuid4().hex[:8]
    features, labels = names.topic("group", u, "features"), names.topic("group", u, "labels")
    base = _worker_cfg(
        bootstrap, {"features": features, "labels": labels}, "x", workdir, partitions, group=False
    )
    from iolstream.kafka.config import config_from_dict
    from iolstream.kafka.topics import ensure_topics

    base["topics"].update(
        predictions=names.topic("group", u, "unused"), dead_letters=names.topic("group", u, "dead")
    )
    ensure_topics(config_from_dict(base, environ={}))
    _produce_input(bootstrap, features, labels, X, y)
    out = {
        "rows": rows,
        "partitions": partitions,
        "cpu_count": os.cpu_count(),
        "note": "the broker and the benchmark process share these cores with the workers",
    }
    for n_workers in (1, group_workers):
        tag = f"w{n_workers}"
        topics = {
            "features": features,
            "labels": labels,
            "predictions": names.topic("group", u, tag, "predictions"),
            "dead_letters": names.topic("group", u, tag, "dead"),
            "model_deltas": names.topic("group", u, tag, "deltas"),
        }
        out[tag] = _run_workers(bootstrap, topics, workdir, partitions, n_workers, tag, rows, scaling, names)
        print(
            f"group bench: {n_workers} worker(s): {out[tag]['rows_per_second']:.0f} rows/s, "
            f"{out[tag]['cores_used_by_workers']:.2f} cores",
            file=sys.stderr,
            flush=True,
        )
    group, one = out[f"w{group_workers}"], out["w1"]
    out["ratio_vs_one_worker"] = group["rows_per_second"] / one["rows_per_second"]
    steady = group["rows_per_second_after_all_joined"], one["rows_per_second_after_all_joined"]
    if None not in steady:
        out["ratio_vs_one_worker_after_all_joined"] = steady[0] / steady[1]
    return out


# ---------------------------------------------------------------------------------------------- sync costs


def _timed(fn, repeat: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        tic = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - tic)
    return best, value


def sync_costs(name: str, bootstrap: str | None, names: bench_names.Names, repeat: int = 3) -> dict:
    """One record of config ``name`` (SYNC_CONFIGS): bytes and the seconds of each step (best of ``repeat``)."""
    n_nodes, n_layers, batch = SYNC_CONFIGS[name]
    cfg = ModelConfig(
        n_inputs=10, classes=tuple(range(10)), n_nodes=n_nodes, n_layers=n_layers, track_regret=False
    )
    X, y, _ = _poker(max(4 * BATCH, batch), seed=2)
    sender, receiver = EdRVFL(cfg), EdRVFL(cfg)
    step_tuner.configure_for_model(sender)
    for m in (sender, receiver):
        m.scaler.partial_fit(X[: cfg.warmup_rows])
        m.learn_rows(X, y)
    a, b = GroupState("a", sender), GroupState("b", receiver)
    seq, sums, meta = a.next_record()
    manifest = {"published_ms": 0, "kind": "sums", "member": "a", "seq": seq, **meta}
    build_s, _ = _timed(lambda: a.next_record(), repeat)
    encode_s, blob = _timed(lambda: snapshots.encode(manifest, sums), repeat)
    decode_s, (_, arrays) = _timed(lambda: snapshots.decode(blob), repeat)
    n = receiver.network.n_columns
    grams = 1 + bool(len(receiver.learners[0].state.arrays.gram_labelled))
    out = {
        "config": name,
        "n_nodes": n_nodes,
        "n_layers": n_layers,
        "n_columns": n,
        "record_bytes": len(blob),
        # per layer A (a triangle), A_r too where kept (mode: auto, or -F with track_regret), and c
        "formula_bytes": n_layers * (grams * n * (n + 1) // 2 + n * 10) * 8,
        "build_own_sums_ms": build_s * 1e3,
        "encode_ms": encode_s * 1e3,
        "decode_ms": decode_s * 1e3,
    }
    if bootstrap is not None:
        topic = names.topic("group", "sync", uuid.uuid4().hex[:8])
        from iolstream.kafka import topics as topics_mod
        from iolstream.kafka.topics import delta_topic_config

        topics_mod.create_topics(
            clients.admin({"bootstrap.servers": bootstrap}),
            [topic],
            partitions=1,
            replication_factor=1,
            configs={topic: delta_topic_config(CHUNK_BYTES)},
        )
        p = clients.producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})

        def produce():
            for i in range(0, len(blob), CHUNK_BYTES):
                _send(p, topic, blob[i : i + CHUNK_BYTES], f"a/sums/{i // CHUNK_BYTES}".encode())
            p.flush(30)

        produce()  # the producer's id and metadata first: not the record's cost
        out["produce_ms"], _ = _timed(produce, repeat)
        out["produce_ms"] *= 1e3
    applied = [0]

    def apply():
        applied[0] += 1
        b.apply("a", applied[0], arrays, published_ms=applied[0], now_ms=applied[0], **meta)

    out["apply_ms"] = _timed(apply, repeat)[0] * 1e3
    resolve = _timed(lambda: [ln.refresh() for ln in receiver.learners], repeat)[0]
    out["resolve_ms"] = resolve * 1e3
    out["apply_and_resolve_ms"] = out["apply_ms"] + out["resolve_ms"]
    out["batch_rows"] = batch
    out["row_us"] = _row_cost(cfg, X, y, batch) * 1e6
    return out


def _row_cost(cfg: ModelConfig, X, y, batch: int, seconds: float = 3.0) -> float:
    """Seconds per row of a plain -F step at ``batch`` rows (features, Gram, predict, label fold-in)."""
    model = EdRVFL(cfg)
    step_tuner.configure_for_model(model)
    model.scaler.partial_fit(X[: cfg.warmup_rows])
    model.scaler.freeze()
    targets = model.encode_labels(y[:batch])
    x = X[:batch]
    pred = model.observe(x)
    model.learn(pred.features_t, targets, predicted=pred.predicted)
    rows, tic = 0, time.perf_counter()
    while time.perf_counter() - tic < seconds:
        pred = model.observe(x)
        model.learn(pred.features_t, targets, predicted=pred.predicted)
        rows += batch
    return (time.perf_counter() - tic) / rows


def projection(cost: dict, members=(4, 16, 64), sync_seconds: float = 1.0) -> list[dict]:
    """What K members of config ``cost`` (a ``sync_costs`` entry) can do, each on the cores one worker has, syncing
    every ``sync_seconds``: per interval a member publishes once (own sums, encode, produce), decodes and merges
    K−1 records and re-solves once (the upper bound); the rest of the interval goes to rows at ``row_us`` each.
    The deltas partition takes K records per interval and hands each to K−1 readers; every member holds K
    copies of the sums (the others' newest and its model's)."""
    publish = (cost["build_own_sums_ms"] + cost["encode_ms"] + cost.get("produce_ms", 0.0)) / 1e3
    merge = (cost["decode_ms"] + cost["apply_ms"]) / 1e3
    out = []
    for k in members:
        busy = publish + (k - 1) * merge + cost["resolve_ms"] / 1e3
        share = max(0.0, 1.0 - busy / sync_seconds)
        per_member = share / (cost["row_us"] / 1e6)
        out.append(
            {
                "members": k,
                "sync_share": min(busy / sync_seconds, 1.0),
                "rows_per_second_per_member": per_member,
                "rows_per_second_total": k * per_member,
                "vs_one_worker": k * share,
                "deltas_in_mb_per_s": k * cost["record_bytes"] / sync_seconds / 1e6,
                "deltas_out_mb_per_s": k * (k - 1) * cost["record_bytes"] / sync_seconds / 1e6,
                "memory_mb_per_member": k * cost["record_bytes"] / 1e6,
                "members_where_merging_fills_the_interval": 1
                + (sync_seconds - publish - cost["resolve_ms"] / 1e3) / merge,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------- quality


def quality(poker_rows: int, sync_rows: int) -> dict:
    from iolstream.tools.builtin_datasets import load

    out = {}
    segment = load("segment")
    # segment (2,310 rows): every member syncs after each of its batches, which hold 64 rows of its own
    # ("same_batch") or 64 // K ("split_batch": a batch spans as many stream rows as the single worker's)
    sets = [("segment_same_batch", segment, 64, 64, False), ("segment_split_batch", segment, 64, None, True)]
    if poker_rows:
        sets.append(("poker", load("poker", rows=poker_rows, seed=0), BATCH, sync_rows, False))
    for name, d, batch, sync, split in sets:
        cfg = ModelConfig(n_inputs=d.X.shape[1], classes=d.classes, track_regret=False)
        out[name] = {
            "rows": len(d.y),
            "batch_rows": batch,
            "sync_rows": sync,
            "split_batch": split,
            **quality_table(d.X, d.y, cfg, batch_rows=batch, sync_rows=sync, split_batch=split),
        }
    return out


# ---------------------------------------------------------------------------------------------- the suite


def run_group(args) -> dict:
    bootstrap = args.bootstrap or f"127.0.0.1:{os.environ.get('KAFKA_PORT', '19092')}"
    scale = getattr(args, "kafka_scale", 1.0)
    workdir = Path(tempfile.mkdtemp(prefix="iolstream-bench-group-"))
    names = bench_names.Names(getattr(args, "prefix", bench_names.DEFAULT_PREFIX))
    out = {"suite": "group", "bootstrap": bootstrap, "cpu_count": os.cpu_count()}
    try:
        rows = max(int(args.group_rows * scale), 8 * BATCH)
        out["throughput"] = run_throughput(
            bootstrap, rows, args.partitions, args.group_workers, workdir, names
        )
        out["sync_costs"] = [sync_costs(name, bootstrap, names) for name in SYNC_CONFIGS]
        out["projection"] = {c["config"]: projection(c) for c in out["sync_costs"]}
        if args.group_quality:
            out["quality"] = quality(args.group_poker_rows, args.group_sync_rows)
    finally:
        bench_names.delete_topics(bootstrap, names.created)
    shutil.rmtree(workdir, ignore_errors=True)  # kept after a failure: the error names a worker log in it
    return out


__all__ = ["projection", "quality", "run_group", "run_throughput", "sync_costs"]
