"""``iolstream bench --suite kafka``: the worker end to end on a real broker.

For each model config, on fresh topics of the local broker (or ``--bootstrap``):
1. learner only: full -F steps in this process (the ceiling);
2. worker throughput: the stream pre-produced (batch messages, then row messages),
   the worker started, rows/s until the last prediction is out;
3. River SoftmaxRegression: a plain consumer loop on the same topics doing
   predict_one then learn_one when a row's label arrives;
4. latency: the producer paced at half the worker's maximum, event time stamped
   at send; produce-to-prediction = the time a predictions consumer receives the
   prediction minus the row's event time; p50/p99.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import orjson
from confluent_kafka import Consumer, Producer

from .bench import bench_core_step
from .config import config_from_dict

CONFIGS = {"small": (128, 4), "poker": (989, 5)}  # (N, L); k = 10, m = 10
BATCH = {"small": 256, "poker": 2200}  # the worker's batch_rows, as in the core suite
K, M = 10, 10


def _data(rows: int, seed: int = 0):
    from .datasets import load

    d = load("poker", rows=rows, seed=seed, sort_cards=True)
    return d.X, d.y


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "batch.size": 1_000_000})


def _produce_stream(bootstrap, features, labels, X, y, *, batch_rows: int, rate: float | None = None, ids_from: int = 0):
    """Features in messages of ``batch_rows`` (1 = row messages), each label one message later."""
    p = _producer(bootstrap)
    n = len(X)
    t0 = time.monotonic()
    prev = None
    for start in range(0, n, batch_rows):
        stop = min(start + batch_rows, n)
        if rate:
            wait = t0 + start / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        ts = int(time.time() * 1000)
        ids = [f"b{ids_from + i}" for i in range(start, stop)]
        if batch_rows == 1:
            value = orjson.dumps({"id": ids[0], "x": X[start].tolist(), "ts": ts})
        else:
            value = orjson.dumps({"ids": ids, "x": X[start:stop].tolist(), "ts": ts})
        _send(p, features, value)
        if prev is not None:
            _send(p, labels, prev)
        lab = y[start:stop].tolist()
        prev = orjson.dumps({"id": ids[0], "y": lab[0]} if batch_rows == 1 else {"ids": ids, "y": lab})
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


def _worker_cfg(bootstrap, topics, n_nodes, n_layers, snap_dir, classes, batch_rows=256):
    return config_from_dict(
        {
            "model": {"n_inputs": K, "classes": list(classes), "n_nodes": n_nodes, "n_layers": n_layers,
                      "warmup_rows": 256, "track_regret": False},
            "kafka": {"bootstrap_servers": bootstrap, "group_id": f"bench-{uuid.uuid4().hex[:8]}"},
            "topics": {"features": topics[0], "labels": topics[1], "predictions": topics[2], "dead_letters": topics[3]},
            "stream": {"batch_rows": batch_rows, "label_batch_rows": batch_rows},
            "snapshot": {"dir": snap_dir, "every_seconds": 30, "every_batches": 100_000},
            "metrics": {"port": 0},
            "logging": {"level": "WARNING"},
        },
        environ={},
    )  # fmt: skip


def _topics(tag: str) -> list[str]:
    u = uuid.uuid4().hex[:8]
    return [f"bench-{tag}-{u}-{s}" for s in ("features", "labels", "predictions", "dead")]


def _run_worker_until(cfg, rows: int, timeout: float) -> tuple[float, object]:
    from .worker import Worker

    w = Worker(cfg)
    th = threading.Thread(target=w.run, kwargs={"max_seconds": timeout}, daemon=True)
    th.start()
    while not w.assigned and th.is_alive():  # start the clock once the group has given us the partitions
        time.sleep(0.005)
    t0 = time.monotonic()
    while w.processor.counters["predictions_out"] < rows and th.is_alive():
        time.sleep(0.005)
    seconds = time.monotonic() - t0
    w.request_stop()
    th.join(60)
    return seconds, w


def _river_loop(bootstrap, features, labels, rows: int, timeout: float) -> float:
    """River SoftmaxRegression, predict-then-learn, as a plain consumer loop."""
    from river import linear_model, optim, preprocessing

    model = preprocessing.StandardScaler() | linear_model.SoftmaxRegression(optimizer=optim.SGD(0.01))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"river-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([features, labels])
    pending: dict[str, dict] = {}
    early: dict[str, object] = {}
    done = 0
    t0 = time.monotonic()
    while done < rows and time.monotonic() - t0 < timeout:
        for msg in c.consume(500, 0.5):
            if msg.error():
                continue
            obj = orjson.loads(msg.value())
            ids = obj["ids"] if "ids" in obj else [obj["id"]]
            if msg.topic() == features:
                xs = obj["x"] if "ids" in obj else [obj["x"]]
                for i, x in zip(ids, xs):
                    xd = dict(enumerate(x))
                    model.predict_one(xd)
                    if i in early:
                        model.learn_one(xd, early.pop(i))
                        done += 1
                    else:
                        pending[i] = xd
            else:
                ys = obj["y"] if "ids" in obj else [obj["y"]]
                for i, yv in zip(ids, ys):
                    xd = pending.pop(i, None)
                    if xd is None:
                        early[i] = yv
                    else:
                        model.learn_one(xd, yv)
                        done += 1
    seconds = time.monotonic() - t0
    c.close()
    return done / seconds


def _latency(bootstrap, cfg, X, y, rate: float, batch_rows: int) -> dict:
    from .worker import Worker

    w = Worker(cfg)
    th = threading.Thread(target=w.run, kwargs={"max_seconds": 600}, daemon=True)
    th.start()
    while not w.assigned:
        time.sleep(0.05)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "latest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([cfg.topics.predictions])
    while not c.assignment():
        c.poll(0.1)
    prod = threading.Thread(target=_produce_stream, args=(bootstrap, cfg.topics.features, cfg.topics.labels, X, y),
                            kwargs={"batch_rows": batch_rows, "rate": rate, "ids_from": 10**9})  # fmt: skip
    prod.start()
    latencies = []
    t0 = time.monotonic()
    while len(latencies) < len(X) and time.monotonic() - t0 < 120:
        for msg in c.consume(1000, 0.2):
            if msg.error():
                continue
            received = time.time() * 1000.0
            event = orjson.loads(msg.value()).get("event_ts")
            if event is not None:
                latencies.append(received - event)
    prod.join()
    c.close()
    w.request_stop()
    th.join(60)
    lat = np.asarray(latencies[len(latencies) // 10 :])  # drop the first tenth (connection warm-up)
    return {"rate_rows_per_second": rate, "rows": len(latencies), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}  # fmt: skip


def run_kafka(args) -> dict:
    import tempfile

    bootstrap = args.bootstrap or "127.0.0.1:19092"
    plan = {"small": 120_000, "poker": 20_000}
    results = {}
    for name in args.configs:
        n_nodes, n_layers = CONFIGS[name]
        rows = plan[name]
        X, y = _data(rows + 256)
        X, y = X[:rows], y[:rows]
        classes = tuple(range(10))
        learner = bench_core_step(name, "float64", seconds=4.0)
        entry = {"learner_rows_per_second": learner.rows_per_second}
        for label, batch_rows, n in (("batch_messages", 256, rows), ("row_messages", 1, rows // 4)):
            topics = _topics(f"{name}-{label}")
            cfg = _worker_cfg(bootstrap, topics, n_nodes, n_layers, tempfile.mkdtemp(), classes, BATCH[name])
            from .worker import ensure_topics

            ensure_topics(cfg)
            _produce_stream(bootstrap, topics[0], topics[1], X[:n], y[:n], batch_rows=batch_rows)
            seconds, _ = _run_worker_until(cfg, n, timeout=600)
            entry[f"worker_{label}_rows_per_second"] = n / seconds
            if label == "batch_messages":
                entry["river_softmax_rows_per_second"] = _river_loop(bootstrap, topics[0], topics[1], min(n, 40_000), 120)
        entry["worker_vs_learner"] = entry["worker_batch_messages_rows_per_second"] / entry["learner_rows_per_second"]
        entry["worker_vs_river"] = entry["worker_batch_messages_rows_per_second"] / entry["river_softmax_rows_per_second"]
        entry["batch_vs_row_messages"] = entry["worker_batch_messages_rows_per_second"] / entry["worker_row_messages_rows_per_second"]
        rate = entry["worker_batch_messages_rows_per_second"] / 2
        topics = _topics(f"{name}-latency")
        cfg = _worker_cfg(bootstrap, topics, n_nodes, n_layers, tempfile.mkdtemp(), classes, BATCH[name])
        from .worker import ensure_topics

        ensure_topics(cfg)
        n_lat = int(min(rows, rate * 20))
        entry["latency_at_half_max"] = _latency(bootstrap, cfg, X[:n_lat], y[:n_lat], rate, 256)
        results[name] = entry
        if not args.json:
            print(name, orjson.dumps(entry, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return {"suite": "kafka", "bootstrap": bootstrap, "results": results}
