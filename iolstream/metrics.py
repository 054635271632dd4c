"""Prometheus metrics and the health endpoints of a running worker.

One small HTTP server (a daemon thread) answers:
- ``/metrics``: Prometheus text format;
- ``/healthz``: 200 while the loop has ticked within ``max(5 × poll timeout, 10 s)``;
- ``/readyz``: 200 once partitions are assigned, replay is over and the broker answered.

Counters mirror the worker's own counters (restored from the snapshot, so they
continue across restarts) and are read from a copy the worker thread refreshes,
never from live state, so a scrape cannot race the learner.
"""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LABEL_OUTCOMES = {
    "joined": "labels_joined",
    "early_held": "labels_early_held",
    "duplicate": "labels_duplicate",
    "orphan": "labels_orphan",
    "expired_id": "labels_expired_id",
}


class _WorkerCollector:
    """Yields metric families from the last refreshed copy of the worker's status."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        s = self.metrics.snapshot_of_status
        if not s:
            return
        p = "iolstream_"

        def counter(name, doc, value):
            c = CounterMetricFamily(p + name, doc)
            c.add_metric([], value)
            return c

        def gauge(name, doc, value, labels=None, label_values=None):
            g = GaugeMetricFamily(p + name, doc, labels=labels)
            g.add_metric(label_values or [], value)
            return g

        yield counter("rows_in", "Feature rows accepted", s["rows_in"])
        yield counter("predictions", "Predictions produced", s["predictions_out"])
        yield counter("rows_learned", "Labelled rows folded into the model", s["rows_learned"])
        yield counter("batches", "Forward steps (feature batches)", s["batches"])
        labels = CounterMetricFamily(p + "labels", "Labels by outcome", labels=["outcome"])
        for outcome, key in LABEL_OUTCOMES.items():
            labels.add_metric([outcome], s.get(f"join_{key}", 0))
        yield labels
        expired = CounterMetricFamily(p + "rows_unlabelled", "Rows that left the join buffer unlabelled", labels=["why"])
        expired.add_metric(["expired"], s.get("join_rows_expired", 0))
        expired.add_metric(["evicted"], s.get("join_rows_evicted", 0))
        yield expired
        dead = CounterMetricFamily(p + "dead_letters", "Dead letters by reason", labels=["reason"])
        for reason, n in s["dead_letters_by_reason"].items():
            dead.add_metric([reason], n)
        yield dead
        yield gauge("pending_rows", "Rows waiting for their label", s["pending"])
        yield gauge("model_version", "Model version (changes of β)", s["model_version"])
        metric = s["metric_name"]
        preq = GaugeMetricFamily(p + "prequential", "Prequential metric of emitted predictions", labels=["metric", "window", "mode"])
        preq.add_metric([metric, "all", s["mode"]], _finite(s["metric"]))
        preq.add_metric([metric, "sliding", s["mode"]], _finite(s["metric_window"]))
        yield preq
        yield gauge("immediate_loss", "Mean over layers of ½‖Dβ − Y‖² per row, last label batch", s["immediate_loss"],
                    ["mode"], [s["mode"]])  # fmt: skip
        yield gauge("cumulative_regret", "Cumulative regret vs the offline expert (mean over layers)", _finite(s["regret"]),
                    ["mode"], [s["mode"]])  # fmt: skip
        yield gauge("regret_bound", "Theorem 4/5 bound on the cumulative regret", _finite(s["regret_bound"]), ["mode"], [s["mode"]])
        yield gauge("snapshot_age_seconds", "Seconds since the last durable snapshot", s["snapshot_age"])
        yield gauge("snapshot_duration_seconds", "Write time of the last snapshot", s["snapshot_seconds"])
        yield gauge("snapshot_bytes", "Size of the last snapshot", s["snapshot_bytes"])
        lag = GaugeMetricFamily(p + "consumer_lag", "Consumer lag per partition (librdkafka statistics)", labels=["topic", "partition"])
        for (topic, part), value in self.metrics.lag.items():
            lag.add_metric([topic, str(part)], value)
        yield lag


def _finite(v: float) -> float:
    return v if v is not None and math.isfinite(v) else float("nan")


class Metrics:
    """The worker's metrics registry plus the HTTP endpoints."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.registry = CollectorRegistry()
        self.batch_seconds = Histogram(
            "iolstream_batch_update_seconds", "Duration of one step (forward update, predict, fold-in)",
            registry=self.registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.latency = Histogram(
            "iolstream_prediction_latency_seconds", "Event time (ts on the feature row) to prediction produced",
            registry=self.registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.transactions = Counter("iolstream_transactions", "Kafka transactions", ["outcome"], registry=self.registry)
        self.transactions_committed = self.transactions.labels("committed")
        self.transactions_aborted = self.transactions.labels("aborted")
        self.registry.register(_WorkerCollector(self))
        self.snapshot_of_status: dict = {}
        self.lag: dict[tuple[str, int], int] = {}
        self.worker = None
        self.server: ThreadingHTTPServer | None = None
        self.broker_ok = False

    # ---------------------------------------------------- worker thread
    def attach(self, worker) -> None:
        self.worker = worker
        self.refresh(worker)

    def on_step(self, worker, out, replay: bool = False) -> None:
        if out.batch_seconds and (out.rows_predicted or out.rows_learned):
            self.batch_seconds.observe(out.batch_seconds)
        if not replay and out.event_ts is not None and len(out.event_ts):
            now = time.time() * 1000.0
            for ts in out.event_ts[out.event_ts >= 0]:
                self.latency.observe(max(0.0, (now - float(ts)) / 1000.0))

    def on_snapshot(self, snap) -> None:
        if self.worker is not None:
            self.refresh(self.worker)

    def on_stats(self, stats_json: str) -> None:
        """librdkafka statistics callback (consumer): per-partition consumer lag."""
        stats = orjson.loads(stats_json)
        lag = {}
        for topic, t in stats.get("topics", {}).items():
            for part, pstats in t.get("partitions", {}).items():
                if part != "-1" and pstats.get("consumer_lag", -1) >= 0:
                    lag[(topic, int(part))] = pstats["consumer_lag"]
        self.lag = lag
        self.broker_ok = True

    def refresh(self, worker) -> None:
        """Copy what the collector reports (called from the worker thread)."""
        proc = worker.processor
        s = proc.status()
        s["dead_letters_by_reason"] = dict(proc.dead_letters)
        s["metric_name"] = "accuracy" if proc.model.config.task == "classification" else "rmse"
        s["mode"] = proc.model.config.mode
        rows = max(proc.last_label_rows, 1)
        s["immediate_loss"] = float(proc.last_losses.mean()) / rows if len(proc.last_losses) else 0.0
        try:
            report = proc.model.regret()
            s["regret"], s["regret_bound"] = report.mean_regret, report.bound
        except Exception:  # regret needs a factorisation; never let metrics break the worker
            s["regret"], s["regret_bound"] = float("nan"), float("nan")
        cp = worker.checkpoint
        s["snapshot_age"] = time.time() - cp.written_at if cp.written_at else float("nan")
        s["snapshot_seconds"] = cp.snapshot_seconds
        s["snapshot_bytes"] = cp.snapshot_bytes
        self.snapshot_of_status = s

    # ------------------------------------------------------------ http
    def healthy(self) -> bool:
        w = self.worker
        limit = max(5 * self.cfg.kafka.poll_timeout_ms / 1000.0, 10.0)
        return w is not None and time.monotonic() - w.last_tick <= limit

    def ready(self) -> tuple[bool, str]:
        w = self.worker
        if w is None:
            return False, "starting"
        if not w.assigned:
            return False, "no partitions assigned"
        if w.replay_until:
            return False, "replaying"
        if w.consumer is None:
            return False, "not connected"
        return True, "ready"

    def serve(self) -> int:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                if self.path.startswith("/metrics"):
                    body, status, ctype = generate_latest(metrics.registry), 200, "text/plain; version=0.0.4"
                elif self.path.startswith("/healthz"):
                    ok = metrics.healthy()
                    body, status, ctype = (b"ok\n" if ok else b"stalled\n"), (200 if ok else 503), "text/plain"
                elif self.path.startswith("/readyz"):
                    ok, why = metrics.ready()
                    body, status, ctype = (why + "\n").encode(), (200 if ok else 503), "text/plain"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep scrapes out of the logs
                pass

        self.server = ThreadingHTTPServer((self.cfg.metrics.host, self.cfg.metrics.port), Handler)
        threading.Thread(target=self.server.serve_forever, name="metrics-http", daemon=True).start()
        return self.server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
