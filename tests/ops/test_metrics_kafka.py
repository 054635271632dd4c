"""Metrics and health endpoints (iolstream.metrics): unit checks of the pieces, then a worker
running against the real broker, scraped while it works and checked against what it did.

The broker tests are marked ``kafka``; the others need no broker.
"""

from __future__ import annotations

import threading
import time
import types
import urllib.error
import urllib.request
from collections import Counter as Tally

import numpy as np
import orjson
import pytest
from kafka_util import STARTUP_SECONDS, consume_all, produce_json, unique_group
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families
from worker_thread import WorkerThread

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka.checkpoints import Checkpoint
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.worker import Compiling
from iolstream.ops.collector import ArrayHistogram
from iolstream.ops.metrics import LATENCY_BUCKETS, Metrics, _Arrivals, _partition_lag
from iolstream.stream import codec
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor

SEED = 20240611
MODEL = {"n_inputs": 4, "classes": [0, 1, 2], "n_nodes": 16, "n_layers": 2, "scaler": "none", "seed": 1}


# ----------------------------------------------------------------------------- helpers
def scrape(port: int) -> dict:
    """{(sample name, frozenset of labels): value} of one /metrics scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset((k, str(v)) for k, v in labels.items()))]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def fake_worker(processor=None, **attrs):
    """What Metrics reads of a Worker, without Kafka."""
    w = types.SimpleNamespace(
        processor=processor or StreamProcessor(EdRVFL(ModelConfig(**MODEL)), StreamConfig(batch_rows=8)),
        checkpoint=Checkpoint(),
        starting=None,
        last_tick=time.monotonic(),
        stopping=False,
        connected=True,
        partitions=1,
        replay_pending=False,
        broker_unreachable_seconds=None,
    )
    vars(w).update(attrs)
    return w


def metrics_config(**metrics):
    return config_from_dict(
        {"model": MODEL, "metrics": {"host": "127.0.0.1", "port": 9108, **metrics}}, environ={}
    )


def rows_message(ids, X, ts=None) -> dict:
    msg = {"ids": list(ids), "x": np.asarray(X).tolist()}
    if ts is not None:
        msg["ts"] = ts
    return msg


# -------------------------------------------------------------------------- unit tests
def test_histogram_matches_prometheus_client():
    """The array-at-a-time histogram gives the buckets and sum prometheus-client's own gives."""
    rng = np.random.default_rng(SEED)
    values = np.concatenate(
        [rng.exponential(0.05, 500), LATENCY_BUCKETS, [0.0, 1e9]]
    )  # bounds themselves: "le"
    ours = ArrayHistogram("h_seconds", "test")
    ours.observe(values[:100])
    ours.observe(values[100:])
    reference = Histogram(
        "iolstream_h_seconds", "test", buckets=LATENCY_BUCKETS, registry=CollectorRegistry()
    )
    for v in values:
        reference.observe(v)
    ref = {
        (s.name, s.labels.get("le")): s.value
        for s in reference.collect()[0].samples
        if not s.name.endswith("_created")
    }
    got = {(s.name, s.labels.get("le")): s.value for s in ours.family().samples}
    assert got.keys() == ref.keys(), f"seed {SEED}"
    for key in ref:
        assert got[key] == pytest.approx(ref[key], rel=1e-12), (key, SEED)


def test_arrivals_follow_the_fifo_of_queued_rows():
    q = _Arrivals(unknown_rows=2)  # restored from a snapshot: no timestamps
    q.push(3, 100)
    q.push(0, 200)  # a message whose rows were all rejected
    q.push(2, 300)
    assert q.pop(4) == [(2, None), (2, 100)]
    q.align(3)  # what the processor still queues: nothing to cut
    assert q.pop(10) == [(1, 100), (2, 300)]
    q.push(5, 400)
    q.align(2)  # 3 rows left the processor without a prediction (duplicates screened late): the oldest go
    assert q.pop(5) == [(2, 400)]
    q.align(1)  # fewer known than queued: the unknown ones are the oldest
    assert (q.rows, q.pop(1)) == (1, [(1, None)])


@pytest.mark.parametrize(
    ("stats", "lag"),
    [
        (
            {"ls_offset": 10, "hi_offset": 12, "app_offset": 4, "committed_offset": 2},
            6,
        ),  # read_committed: the LSO
        (
            {"ls_offset": -1001, "hi_offset": 12, "app_offset": -1001, "committed_offset": 2},
            10,
        ),  # not read yet
        ({"ls_offset": 7, "hi_offset": 7, "app_offset": -1001, "committed_offset": -1001, "lo_offset": 3}, 4),
        ({"ls_offset": -1001, "hi_offset": -1001, "app_offset": 5}, None),  # end unknown
        ({"ls_offset": 5, "hi_offset": 5, "app_offset": 5}, 0),
        (  # restarted at a snapshot's offsets, at the end of the input: nothing handed over, nothing committed
            {
                "ls_offset": 104,
                "hi_offset": 104,
                "app_offset": -1001,
                "next_offset": 104,
                "committed_offset": -1001,
            },
            0,
        ),
        ({"hi_offset": 104, "app_offset": 90, "next_offset": 104}, 14),  # fetched ahead: the application's
    ],
)
def test_partition_lag(stats, lag):
    assert _partition_lag(stats) == lag


def test_health_and_readiness_endpoints():
    metrics = Metrics(metrics_config(port=0))
    port = metrics.serve()
    try:
        assert get(port, "/healthz") == (503, "starting\n")
        assert get(port, "/readyz") == (503, "starting\n")
        assert get(port, "/nothing")[0] == 404
        metrics.starting = "waiting for the broker"
        assert get(port, "/healthz") == (503, "starting: waiting for the broker\n")
        # a first start compiling its kernels for a minute: starting, never "loop stalled"
        compiling = Compiling(4)  # said from the start of the compile, its seconds counted when read
        w = fake_worker(connected=False, partitions=0, starting=compiling)
        w.last_tick -= 60.0
        metrics.attach(w)
        assert get(port, "/healthz") == (503, "starting: compiling the kernels (0/4 sets, 0 s)\n")
        compiling.done, compiling.since = 1, compiling.since - 31.2
        assert get(port, "/healthz") == (503, "starting: compiling the kernels (1/4 sets, 31 s)\n")
        assert get(port, "/readyz") == (503, "starting\n")
        w.starting, w.last_tick = None, time.monotonic()  # the loop runs
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (503, "not connected\n")
        w.connected = True
        assert get(port, "/readyz") == (503, "no partitions assigned\n")
        w.partitions = 1
        w.replay_pending = True
        assert get(port, "/readyz")[0] == 503
        w.replay_pending = False
        assert get(port, "/readyz") == (200, "ready\n")
        assert value(scrape(port), "iolstream_ready") == 1.0

        down = {
            "brokers": {
                "b:9092/1": {"nodeid": 1, "state": "DOWN"},
                "GroupCoordinator": {"nodeid": -1, "state": "UP"},
            }
        }
        metrics.on_stats(orjson.dumps(down).decode())
        assert get(port, "/readyz") == (503, "broker unreachable\n")
        up = {"brokers": {"b:9092/1": {"nodeid": 1, "state": "UP"}}, "topics": {}}
        metrics.on_stats(orjson.dumps(up).decode())
        assert get(port, "/readyz") == (200, "ready\n")
        metrics.on_stats("{not json")  # a bad statistics payload changes nothing and raises nothing
        assert get(port, "/readyz")[0] == 200
        w.broker_unreachable_seconds = 12.4  # the worker's own view (error callbacks, probes)
        assert get(port, "/readyz") == (503, "broker unreachable for 12 s\n")
        assert get(port, "/healthz")[0] == 200  # waiting for the broker is not a dead loop
        w.broker_unreachable_seconds = None

        w.last_tick -= 30.0  # the loop stopped ticking (poll timeout 100 ms: limit 10 s)
        status, body = get(port, "/healthz")
        assert status == 503 and body.startswith("loop stalled for 3")
        w.last_tick = time.monotonic()
        w.stopping = True
        assert get(port, "/readyz") == (503, "stopping\n")
        assert get(port, "/healthz")[0] == 200
    finally:
        metrics.close()


def test_concurrent_scrapes_see_consistent_monotonic_values():
    """8 threads scrape while the worker thread feeds, steps and refreshes: every response parses,
    counters never go back, and a histogram's count always equals its +Inf bucket."""
    metrics = Metrics(metrics_config(port=0))
    port = metrics.serve()
    proc = StreamProcessor(EdRVFL(ModelConfig(**MODEL)), StreamConfig(batch_rows=16, max_batch_latency_ms=0))
    w = fake_worker(proc)
    metrics.attach(w)
    rng = np.random.default_rng(SEED)
    stop, errors, scrapes = threading.Event(), [], Tally()

    def hammer(i):
        last: dict = {}
        try:
            while not stop.is_set():
                s = scrape(port)
                scrapes[i] += 1
                for key, v in s.items():
                    if key[0].endswith("_total") or key[0].endswith("_count"):
                        assert v >= last.get(key, 0.0), (key, v, last.get(key))
                        last[key] = v
                for name in ("iolstream_batch_update_seconds", "iolstream_prediction_latency_seconds"):
                    assert value(s, name + "_count") == value(s, name + "_bucket", le="+Inf")
        except Exception as exc:  # reported in the main thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        n = 0
        for k in range(150):
            X = rng.normal(size=(16, 4))
            ids = [f"r{n + i}" for i in range(16)]
            proc.on_features(orjson.dumps(rows_message(ids, X)), ("f", 0, k), now_ms=k)
            metrics.on_features(w, (1, int(time.time() * 1000)))
            out = proc.step(now_ms=k)
            metrics.on_step(w, out)
            labels = {"ids": ids, "y": rng.integers(0, 3, 16).tolist()}
            proc.on_labels(orjson.dumps(labels), ("l", 0, k), now_ms=k)
            metrics.refresh(w)
            n += 16
        wait_for(lambda: min(scrapes[i] for i in range(8)) >= 3, what="every thread to scrape")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        metrics.close()
    assert not errors, errors[:3]
    final = metrics.registry.get_sample_value
    assert final("iolstream_rows_in_total") == 150 * 16
    assert final("iolstream_predictions_total") == 150 * 16
    assert final("iolstream_prediction_latency_seconds_count") == 150 * 16


def test_counters_count_this_process_only():
    """Counters restored from a snapshot are the baseline (a restart begins at 0 for Prometheus);
    a state that goes back (rolled back after an aborted transaction) counts again what it replays."""
    proc = StreamProcessor(EdRVFL(ModelConfig(**MODEL)), StreamConfig(batch_rows=4))
    proc.counters["rows_in"] = 1000  # as restored
    w = fake_worker(proc)
    metrics = Metrics(metrics_config())
    metrics.attach(w)
    assert metrics.registry.get_sample_value("iolstream_rows_in_total") == 0
    proc.counters["rows_in"] += 7
    metrics.refresh(w)
    assert metrics.registry.get_sample_value("iolstream_rows_in_total") == 7
    proc.counters["rows_in"] -= 5  # rolled back ...
    metrics.refresh(w)
    proc.counters["rows_in"] += 5  # ... and replayed
    metrics.refresh(w)
    assert metrics.registry.get_sample_value("iolstream_rows_in_total") == 12


# ------------------------------------------------------------------- broker tests
class RunningWorker(WorkerThread):
    """A Worker with its Metrics on an ephemeral port, run in a thread."""

    def __init__(self, cfg):
        self.metrics = Metrics(cfg)
        self.port = self.metrics.serve()
        super().__init__(cfg, metrics=self.metrics)
        self.metrics.attach(self.worker)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.metrics.close()


def worker_config(bootstrap, topics, tmp_path, **sections):
    features, labels, predictions, dead = topics
    raw = {
        "model": MODEL,
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": unique_group("metrics"),
            "poll_timeout_ms": 50,
            "consumer": {"statistics.interval.ms": 200},
        },
        "topics": {
            "features": features,
            "labels": labels,
            "predictions": predictions,
            "dead_letters": dead,
            "create": False,
        },
        "stream": {
            "batch_rows": 20,
            "max_batch_latency_ms": 20,
            "label_batch_rows": 50,
            "max_label_latency_ms": 50,
            "row_ttl_ms": 3000,
            "early_label_ttl_ms": 300,
        },
        "snapshot": {"dir": str(tmp_path / "snapshots"), "every_batches": 4, "every_seconds": 1.0},
        "metrics": {"port": 0, "host": "127.0.0.1", "window_rows": 50},
        "logging": {"status_every_seconds": 0.5},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw, environ={})


@pytest.mark.kafka
def test_scrape_matches_what_the_worker_processed(kafka_bootstrap, kafka_topics, tmp_path):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    features, labels, predictions, dead_topic = topics
    cfg = worker_config(kafka_bootstrap, topics, tmp_path)
    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(200, 4))
    y = (X @ rng.normal(size=(4, 3))).argmax(axis=1)
    ids = [f"a{i}" for i in range(200)]

    with RunningWorker(cfg) as rw:
        port = rw.port
        assert wait_for(lambda: get(port, "/readyz")[0] == 200, STARTUP_SECONDS, what="/readyz 200")
        assert get(port, "/healthz")[0] == 200
        stop, errors = threading.Event(), []

        def hammer():  # concurrent scrapes all along
            while not stop.is_set():
                try:
                    scrape(port)
                except Exception as exc:
                    errors.append(repr(exc))

        scrapers = [threading.Thread(target=hammer) for _ in range(3)]
        for t in scrapers:
            t.start()

        # A: 200 rows in 10 messages, a repeated id, malformed JSON, a wrong feature count
        now = int(time.time() * 1000)
        msgs = [rows_message(ids[i : i + 20], X[i : i + 20], ts=now) for i in range(0, 200, 20)]
        msgs += [{"id": "a5", "x": X[5].tolist()}, "{not json", {"id": "b0", "x": [1.0, 2.0]}]
        produce_json(kafka_bootstrap, features, msgs)
        wait_for(
            lambda: scrape(port).get(("iolstream_predictions_total", frozenset())) == 200,
            what="200 predictions",
        )

        # B: labels of a0..a149, a0..a4 again, one for an id that never comes
        label_msgs = [{"ids": ids[i : i + 50], "y": y[i : i + 50].tolist()} for i in range(0, 150, 50)]
        label_msgs += [{"ids": ids[:5], "y": y[:5].tolist()}, {"id": "ghost", "y": 1}]
        produce_json(kafka_bootstrap, labels, label_msgs)
        wait_for(
            lambda: (
                value(scrape(port), "iolstream_labels_total", outcome="orphan") == 1
                and value(scrape(port), "iolstream_rows_learned_total") == 150
            ),
            what="labels joined",
        )

        # C: a150..a199 expire unlabelled (row_ttl_ms 3 s); then labels for 10 of them come too late
        wait_for(
            lambda: value(scrape(port), "iolstream_rows_unlabelled_total", why="expired") == 50, what="expiry"
        )
        produce_json(kafka_bootstrap, labels, [{"ids": ids[150:160], "y": y[150:160].tolist()}])
        wait_for(
            lambda: value(scrape(port), "iolstream_labels_total", outcome="expired") == 10, what="late labels"
        )
        wait_for(
            lambda: (
                all(v == 0 for (name, _), v in scrape(port).items() if name == "iolstream_consumer_lag")
                and sum(name == "iolstream_consumer_lag" for name, _ in scrape(port)) == 2
            ),
            what="lag 0",
        )

        stop.set()
        for t in scrapers:
            t.join(10)
        rw.stop()
        assert rw.exit_code == 0
        s = scrape(port)  # the final values: the shutdown refreshed them
        assert get(port, "/readyz")[0] == 503
        proc = rw.worker.processor
        report = proc.model.regret()

    assert not errors, errors[:3]
    # what went out, read back from the topics
    preds = {
        orjson.loads(v)["id"]: orjson.loads(v)
        for _, v, _, _, _ in consume_all(kafka_bootstrap, predictions, expected=200)
    }
    dead = Tally(
        dict(h)["iolstream.reason"].decode()
        for _, _, h, _, _ in consume_all(kafka_bootstrap, dead_topic, expected=14)
    )
    assert len(preds) == 200
    assert dead == {
        "duplicate_id": 1,
        "malformed_json": 1,
        "wrong_feature_count": 1,
        "unknown_id": 1,
        "expired_id": 10,
    }

    assert value(s, "iolstream_rows_in_total") == 200
    assert value(s, "iolstream_predictions_total") == len(preds)
    assert value(s, "iolstream_rows_replayed_total") == 0
    assert value(s, "iolstream_batches_total") == proc.counters["batches"] >= 10
    assert value(s, "iolstream_labels_received_total") == 150 + 5 + 1 + 10
    assert value(s, "iolstream_labels_total", outcome="joined") == 150
    assert value(s, "iolstream_labels_total", outcome="duplicate") == 5
    assert value(s, "iolstream_labels_total", outcome="orphan") == 1
    assert value(s, "iolstream_labels_total", outcome="expired") == 10
    assert value(s, "iolstream_rows_unlabelled_total", why="expired") == 50
    assert value(s, "iolstream_rows_unlabelled_total", why="evicted") == 0
    assert value(s, "iolstream_rows_learned_total") == 150
    for reason in codec.REASONS:
        assert value(s, "iolstream_dead_letters_total", reason=reason) == dead.get(reason, 0), reason
    assert value(s, "iolstream_pending_rows") == 0
    assert value(s, "iolstream_early_labels") == 0
    assert (
        value(s, "iolstream_transactions_total", outcome="committed") == 0
    )  # at-least-once: no transactions

    # prequential accuracy of what was emitted, overall and over the last 50 labelled rows (label mode: the config's)
    correct = np.array([preds[ids[i]]["y_hat"] == y[i] for i in range(150)], dtype=float)
    assert value(
        s, "iolstream_prequential", metric="accuracy", window="all", mode=proc.model.config.mode
    ) == pytest.approx(correct.mean())
    assert value(
        s, "iolstream_prequential", metric="accuracy", window="sliding", mode=proc.model.config.mode
    ) == pytest.approx(correct[100:].mean())
    assert value(s, "iolstream_model_version") == proc.model.version
    # mode: auto (the default): the update in force, and each candidate's recent loss by mode
    eff = proc.model.effective
    assert value(s, "iolstream_effective_mode", mode=eff["mode"]) == 1
    for c in eff["candidates"]:
        key = {"lam": f"{c['lam']:g}", "half_life": "none", "mode": c["mode"]}
        assert value(s, "iolstream_candidate_recent_loss", **key) == pytest.approx(c["recent_loss"])

    # loss and regret (docs/design.md §3) as the state computes them
    assert value(s, "iolstream_immediate_loss", mode=proc.model.config.mode) == pytest.approx(
        proc.last_losses.mean(), rel=1e-12
    )
    assert value(s, "iolstream_label_batch_rows") == proc.last_label_rows > 0
    assert value(s, "iolstream_cumulative_loss", mode=proc.model.config.mode) == pytest.approx(
        report.cumulative_loss.mean(), rel=1e-12
    )
    assert value(s, "iolstream_cumulative_regret", mode=proc.model.config.mode) == pytest.approx(
        report.mean_regret, rel=1e-9
    )
    assert value(s, "iolstream_regret_bound", mode=proc.model.config.mode) == pytest.approx(
        report.bound, rel=1e-12
    )

    # histograms: one latency per prediction (produce timestamp, and the rows' ts), seconds, not years
    for name in ("iolstream_prediction_latency_seconds", "iolstream_event_latency_seconds"):
        assert value(s, name + "_count") == 200
        assert 0 < value(s, name + "_sum") / 200 < 10.0
    # one observation per step that did work; a step may run several batches when input piles up
    assert (
        1
        <= value(s, "iolstream_batch_update_seconds_count")
        <= proc.counters["batches"] + proc.counters["label_batches"]
    )

    # snapshots: the newest file on disk
    newest = max((tmp_path / "snapshots").glob("snap-*.iolsnap"))
    assert value(s, "iolstream_snapshot_bytes") == newest.stat().st_size
    assert 0 <= value(s, "iolstream_snapshot_age_seconds") < 30
    assert value(s, "iolstream_snapshot_duration_seconds") > 0
    assert value(s, "iolstream_consumer_lag", topic=features, partition=0) == 0
    assert value(s, "iolstream_consumer_lag", topic=labels, partition=0) == 0


@pytest.mark.kafka
def test_exactly_once_counts_transactions_and_restart_resumes_from_zero(
    kafka_bootstrap, kafka_topics, tmp_path
):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    cfg = worker_config(kafka_bootstrap, topics, tmp_path, durability={"exactly_once": True})
    rng = np.random.default_rng(SEED + 1)
    X = rng.normal(size=(60, 4))
    produce_json(
        kafka_bootstrap,
        topics[0],
        [rows_message([f"e{i}" for i in range(i, i + 20)], X[i : i + 20]) for i in range(0, 60, 20)],
    )
    with RunningWorker(cfg) as rw:
        wait_for(
            lambda: scrape(rw.port).get(("iolstream_predictions_total", frozenset())) == 60,
            STARTUP_SECONDS,
            what="60 predictions",
        )
        rw.stop()
        s = scrape(rw.port)
    assert rw.exit_code == 0
    assert value(s, "iolstream_transactions_total", outcome="committed") >= 1
    assert value(s, "iolstream_transactions_total", outcome="aborted") == 0
    assert len(consume_all(kafka_bootstrap, topics[2], expected=60)) == 60

    # a restart from the final snapshot: the counters of the new process start at 0, the state's gauges go on
    with RunningWorker(cfg) as rw:
        assert wait_for(
            lambda: get(rw.port, "/readyz")[0] == 200, STARTUP_SECONDS, what="/readyz 200 after the restart"
        )
        s = scrape(rw.port)
        assert value(s, "iolstream_rows_in_total") == 0
        assert value(s, "iolstream_predictions_total") == 0
        assert value(s, "iolstream_model_version") == rw.worker.processor.model.version
        assert value(s, "iolstream_snapshot_bytes") > 0
        assert 0 <= value(s, "iolstream_snapshot_age_seconds") < 30
