"""Prometheus metrics and the health endpoints of a running worker.

One small HTTP server (a daemon thread) answers:

- ``/metrics``: Prometheus text format (names below);
- ``/healthz``: 200 while the loop has ticked within ``max(5 × kafka.poll_timeout_ms, 10 s)``
  (the loop ticks every poll timeout; the margin covers a snapshot or a long batch); 503 "starting: <what>"
  until the loop runs (waiting for the broker, loading the snapshot, compiling the kernels);
- ``/readyz``: 200 once partitions are assigned, the exactly-once replay is over, the
  broker is reachable and no stop was requested; else 503 and the reason.

What it reads of the worker is typed in ``ops.status``: ``WorkerView`` (``kafka.worker.Worker`` fills it;
ops never imports kafka), and the copy a scrape reports, ``ModelStatus``. The families are built in
``ops.collector`` (group learning's in ``ops.group_metrics``).

Threads: the worker thread writes, HTTP threads read. Everything a scrape reads is either
a prometheus-client object (locked), or a dict/array the worker thread *replaces* (never
mutates) under a lock, so a scrape never sees the learner's live state half-updated.
The worker calls ``tick`` every loop, which refreshes that copy at most every
``REFRESH_SECONDS`` (and the regret, a factorisation per layer, at most every
``REGRET_SECONDS``); ``refresh`` forces it (status lines, snapshots, shutdown).

Counters (``*_total``) count what *this process* did, from 0 at its start, so Prometheus'
``rate()`` is right across restarts; rows replayed after an aborted transaction count again.
Gauges (pending rows, prequential metric, regret, ...) describe the model state, which a
snapshot carries across restarts.

name                                   type        labels; meaning
=====================================  ==========  =============================================
rows_in_total                          counter     feature rows accepted
predictions_total                      counter     predictions produced
rows_replayed_total                    counter     rows predicted again but not emitted (replay)
rows_learned_total                     counter     labelled rows folded into the model
batches_total / label_batches_total    counter     forward steps / label fold-ins
labels_received_total                  counter     labels decoded
values_clipped_total                   counter     input values beyond 1,000 deviations of the scaling, clipped to it
labels_total                           counter     outcome = joined | duplicate | expired | orphan | handed_over
rows_unlabelled_total                  counter     why = expired | evicted
dead_letters_total                     counter     reason (every codec.REASONS value)
missing_values_total                   counter     field: named-field events with that input missing or null
undeclared_values_total                counter     field: named-field events with a category value not declared
dead_letters_truncated_total           counter     reason: dead letters written as an excerpt (too large)
dead_letters_dropped_total             counter     reason: dead letters not written (refused even as excerpts)
transactions_total                     counter     outcome = committed | aborted
pending_rows, held_rows, early_labels  gauge       join buffer, warm-up hold, early labels
model_version                          gauge       changes of β
prequential                            gauge       metric = accuracy | log_loss | brier | roc_auc | balanced_accuracy
                                                   (classification) | rmse | mae, window = all | sliding, mode
class_precision, class_recall          gauge       class, window: prequential precision and recall of each class
calibration_temperature                gauge       kappa: the heaviest map of the calibration's mixture (docs/design.md §12)
immediate_loss                         gauge       mode: docs/design.md §3 L_t of the last label batch, mean over layers
label_batch_rows                       gauge       rows of that batch (loss per row = ratio)
cumulative_loss                        gauge       mode: Σ_t L_t (mean over layers)
cumulative_regret, regret_bound        gauge       mode: CR_T and Theorem 4/5 bound (docs/design.md §3)
effective_lambda                       gauge       the λ in force (model.lam; auto: the chosen candidate's)
effective_half_life_rows               gauge       the forgetting half-life in force, rows (NaN: none)
effective_mode                         gauge       mode = forward | ridge: 1, labelled with the update in force
candidate_recent_loss                  gauge       lam, half_life, mode: auto, each candidate's recent loss per row
candidate_scored_share                 gauge       auto: share of the rows every candidate predicted (scoring budget)
snapshot_age_seconds                   gauge       since the newest durable snapshot
snapshot_duration_seconds, _bytes      gauge       write time and size of the last snapshot
consumer_lag                           gauge       topic, partition: last stable offset − position
ready                                  gauge       1 when /readyz answers 200
batch_update_seconds                   histogram   one step: forward update, predict, fold-in
prediction_latency_seconds             histogram   Kafka produce time of the features → prediction produced
event_latency_seconds                  histogram   the row's "ts" (event time) → prediction produced
=====================================  ==========  =============================================
=======
The names, types and labels exported are listed for users in docs/operations.md ("Health, readiness,
metrics, logs"); tests/ops/test_metrics_documented.py keeps that table equal to what a scrape returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import orjson
from prometheus_client import CollectorRegistry, Counter, generate_latest

from iolstream.ops.collector import (
    LABEL_OUTCOMES,
    LATENCY_BUCKETS,
    PLAIN_COUNTERS,
    PREFIX,
    UNLABELLED,
    ArrayHistogram,
    WorkerCollector,
)
from iolstream.ops.status import ModelStatus, WorkerView, model_status
from iolstream.stream import codec

__all__ = ["LATENCY_BUCKETS", "Metrics"]
log = logging.getLogger("iolstream.metrics")

REFRESH_SECONDS = 0.5  # staleness of the state copy a scrape sees
REGRET_SECONDS = 5.0  # the regret costs one Cholesky per layer: recomputed at most this often
HEALTH_MIN_SECONDS = 10.0


class _Arrivals:
    """Kafka timestamps (ms, None unknown) of the rows accepted but not yet predicted, oldest first.

    Rows are predicted in the order they were accepted (the micro-batcher is FIFO), so a step
    that predicts n rows takes the n oldest. After each step the queue is cut to the processor's
    queued row count, which re-aligns it if rows were dropped in between (or restored from a
    snapshot: those have no timestamp here)."""

    def __init__(self, unknown_rows: int = 0):
        self.chunks: deque[list] = deque()  # [rows, ts]
        self.rows = 0
        self.push(unknown_rows, None)

    def push(self, rows: int, ts) -> None:
        if rows > 0:
            self.chunks.append([rows, ts])
            self.rows += rows

    def pop(self, rows: int) -> list[tuple[int, object]]:
        out = []
        while rows > 0 and self.chunks:
            chunk = self.chunks[0]
            take = min(rows, chunk[0])
            out.append((take, chunk[1]))
            chunk[0] -= take
            rows -= take
            self.rows -= take
            if chunk[0] == 0:
                self.chunks.popleft()
        return out

    def align(self, queued_rows: int) -> None:
        if self.rows > queued_rows:
            self.pop(self.rows - queued_rows)
        elif self.rows < queued_rows:
            self.chunks.appendleft([queued_rows - self.rows, None])
            self.rows = queued_rows


class Metrics:
    """The worker's metrics registry plus the HTTP endpoints (see the module docstring)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.registry = CollectorRegistry()
        self.predictions = Counter(PREFIX + "predictions", "Predictions produced", registry=self.registry)
        self.rows_replayed = Counter(
            PREFIX + "rows_replayed",
            "Rows predicted during replay and not emitted (a committed transaction already covered them)",
            registry=self.registry,
        )
        by_reason = {"labelnames": ["reason"], "registry": self.registry}
        self.dead_letters = Counter(PREFIX + "dead_letters", "Dead letters produced, by reason", **by_reason)
        self.dead_letters_truncated = Counter(
            PREFIX + "dead_letters_truncated",
            "Dead letters written as an excerpt (too large as they were), by reason",
            **by_reason,
        )
        self.dead_letters_dropped = Counter(
            PREFIX + "dead_letters_dropped",
            "Dead letters not written (the limits refused even an excerpt), by reason",
            **by_reason,
        )
        for reason in codec.REASONS:
            self.dead_letters.labels(reason)
            self.dead_letters_truncated.labels(reason)
            self.dead_letters_dropped.labels(reason)
        self.transactions = Counter(
            PREFIX + "transactions", "Kafka transactions", ["outcome"], registry=self.registry
        )
        self.transactions_committed = self.transactions.labels("committed")
        self.transactions_aborted = self.transactions.labels("aborted")
        self.batch_seconds = ArrayHistogram(
            "batch_update_seconds", "Duration of one step (forward update, predict, fold-in)"
        )
        self.latency = ArrayHistogram(
            "prediction_latency_seconds",
            "Kafka produce timestamp of the features message to prediction produced",
        )
        self.event_latency = ArrayHistogram(
            "event_latency_seconds", "Event time (ts on the feature row) to prediction produced"
        )
        self.registry.register(WorkerCollector(self))

        self._lock = threading.Lock()
        self._status: ModelStatus | None = None  # replaced, never mutated (read by HTTP threads)
        self._totals: dict[str, int] = {}  # process-local counter values
        self._lag: dict[tuple[str, int], int] = {}
        self._last_raw: dict[str, int] = {}
        self._refreshed_at = 0.0
        self._regret_at = -math.inf
        self._regret_version = -1
        self._regret = (float("nan"), float("nan"), float("nan"))  # (cumulative loss, regret, bound)
        self._proc = None  # the processor the arrival queue follows
        self._arrivals = _Arrivals()
        self._rows_in_seen = 0
        self.broker_up: bool | None = None  # None: no statistics yet
        self.worker = None
        self.starting = ""  # before there is a worker: what the start is doing (``iolstream run`` says)
        self.server: ThreadingHTTPServer | None = None

    # ---------------------------------------------------- worker thread
    def attach(self, worker: WorkerView) -> None:
        """Follow ``worker``: its restored counters are the baseline of this process' counters."""
        self.worker = worker
        self._follow(worker)
        self.refresh(worker)

    def _follow(self, worker):
        """The processor to read; a new one (a roll-back loads another after an aborted transaction) resets the
        arrival queue."""
        proc = worker.processor
        if proc is not self._proc:
            self._proc = proc
            self._rows_in_seen = proc.counters["rows_in"]
            self._arrivals = _Arrivals(proc.queued_rows)
        return proc

    def on_features(self, worker: WorkerView, timestamp) -> None:
        """Once the processor took a features message in (before a batch it filled is predicted);
        ``timestamp``: confluent-kafka's (type, ms)."""
        proc = self._follow(worker)
        accepted = proc.counters["rows_in"] - self._rows_in_seen
        self._rows_in_seen = proc.counters["rows_in"]
        kind, ts = timestamp if timestamp is not None else (0, 0)
        self._arrivals.push(accepted, ts if kind and ts > 0 else None)  # kind 0: TIMESTAMP_NOT_AVAILABLE

    def on_step(self, worker: WorkerView, out, replay: bool = False) -> None:
        """A step's outputs (``replay``: not emitted): its duration, predictions and their latencies."""
        proc = self._follow(worker)
        if out.batch_seconds and (out.rows_predicted or out.rows_learned):
            self.batch_seconds.observe([out.batch_seconds])
        taken = self._arrivals.pop(out.rows_predicted)
        self._arrivals.align(proc.queued_rows)
        if replay:
            self.rows_replayed.inc(out.rows_predicted)
            return
        self.predictions.inc(out.rows_predicted)
        now_ms = time.time() * 1000.0
        known = [
            (n, ts) for n, ts in taken if ts is not None
        ]  # one entry per message: 256 for one-row messages
        if known:
            counts, stamps = zip(*known)
            waited = np.repeat(now_ms - np.array(stamps, dtype=np.float64), counts)
            self.latency.observe(np.maximum(waited, 0.0) / 1000.0)
        if out.event_ts is not None and len(out.event_ts):
            ts = np.asarray(out.event_ts, dtype=np.float64)
            self.event_latency.observe(np.maximum(now_ms - ts[ts >= 0], 0.0) / 1000.0)

    def on_owed(self, out) -> None:
        """Predictions of rows read before a restart, sent now (``kafka.session.Session.owe``): counted, with no
        latency (when their rows came is not known here)."""
        self.predictions.inc(out.rows_predicted)

    def on_dead_letters(self, dead) -> None:
        """Dead letters emitted, by reason."""
        for d in dead:
            self.dead_letters.labels(d.bad.reason).inc()

    def on_snapshot(self, snap) -> None:
        """A snapshot was written: its age and size are reported at once."""
        if self.worker is not None:
            self.refresh(self.worker)

    def on_stats(self, stats_json: str) -> None:
        """librdkafka statistics callback (consumer): lag per assigned partition, broker state."""
        try:
            stats = orjson.loads(stats_json)
            lag = {}
            for topic, t in stats.get("topics", {}).items():
                for part, p in t.get("partitions", {}).items():
                    value = _partition_lag(p)
                    if part != "-1" and p.get("desired") and value is not None:
                        lag[(topic, int(part))] = value
            brokers = [b for b in stats.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
            with self._lock:
                self._lag = lag
            self.broker_up = any(b.get("state") == "UP" for b in brokers) if brokers else self.broker_up
        except Exception:  # a callback must never break the consumer
            log.exception("cannot read librdkafka statistics")

    def tick(self, worker: WorkerView) -> None:
        """Called every loop: refresh the copy a scrape reads when it is older than REFRESH_SECONDS."""
        if time.monotonic() - self._refreshed_at >= REFRESH_SECONDS:
            self.refresh(worker, regret_due=time.monotonic() - self._regret_at >= REGRET_SECONDS)

    def refresh(self, worker: WorkerView, *, regret_due: bool = True) -> None:
        """Copy what the collector reports (worker thread only)."""
        proc = self._follow(worker)
        s = proc.status()
        totals = self._count(s)
        version = proc.model.version  # the regret changes with β only
        if regret_due and version != self._regret_version:
            self._regret = _regret(proc.model)
            self._regret_version, self._regret_at = version, time.monotonic()
        group = getattr(worker, "group_status", None)  # group learning (ops.group_metrics); None: off
        status = model_status(proc, s, worker.checkpoint, self._regret, group)
        with self._lock:
            self._status, self._totals = status, totals
        self._refreshed_at = time.monotonic()

    def scrape_copy(self) -> tuple[ModelStatus | None, dict[str, int], dict[tuple[str, int], int]]:
        """What a scrape reports (any thread): the status copy (None: no worker yet), counters and lag."""
        with self._lock:
            return self._status, self._totals, self._lag

    def _count(self, status: dict) -> dict[str, int]:
        """Process-local counters from the state's counters: only increases count (a state reloaded
        after an aborted transaction goes back, and its replay then counts again)."""
        totals = dict(self._totals)
        keys = list(PLAIN_COUNTERS) + list(LABEL_OUTCOMES.values()) + list(UNLABELLED.values())
        raw = {key: status.get(key, 0) for key in keys}
        for kind, counts in status.get("fields", {}).items():  # named fields: missing / undeclared, per field
            raw.update({f"{kind}/{name}": n for name, n in counts.items()})
        for key, value in raw.items():
            # the first look is the baseline; a key that appears later (a field's first missing value) counts from 0
            last = self._last_raw.get(key, 0 if self._last_raw else value)
            totals[key] = totals.get(key, 0) + max(0, value - last)
        self._last_raw = raw
        return totals

    # ------------------------------------------------------------ http
    def healthy(self) -> tuple[bool, str]:
        """``/healthz``: (ok, why): the loop ticked recently."""
        w = self.worker
        if w is None:
            return False, f"starting: {self.starting}" if self.starting else "starting"
        if w.starting is not None:
            return False, f"starting: {w.starting}"
        limit = max(5 * self.cfg.kafka.poll_timeout_ms / 1000.0, HEALTH_MIN_SECONDS)
        idle = time.monotonic() - w.last_tick
        return (True, "ok") if idle <= limit else (False, f"loop stalled for {idle:.1f} s")

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: (ok, why): assigned, replay over, broker reachable, not stopping."""
        w = self.worker
        if w is None or w.starting is not None:
            return False, "starting"
        if w.stopping:
            return False, "stopping"
        if not w.connected:
            return False, "not connected"
        if not w.partitions:
            return False, "no partitions assigned"
        if w.replay_pending:
            return False, "replaying input a committed transaction already covered"
        down = w.broker_unreachable_seconds
        if down is not None:
            return False, f"broker unreachable for {down:.0f} s"
        if self.broker_up is False:
            return False, "broker unreachable"
        return True, "ready"

    def serve(self) -> int:
        """Start the HTTP server (daemon thread); returns the bound port (``metrics.port`` 0: any free
        one)."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, status, ctype = (
                        generate_latest(metrics.registry),
                        200,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                elif path in ("/healthz", "/readyz"):
                    ok, why = metrics.healthy() if path == "/healthz" else metrics.ready()
                    body, status, ctype = (
                        (why + "\n").encode(),
                        (200 if ok else 503),
                        "text/plain; charset=utf-8",
                    )
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain; charset=utf-8"
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
        """Stop the HTTP server."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _partition_lag(p: dict) -> int | None:
    """Messages between the consumer's position and the end of the partition (the last stable
    offset under read_committed). Position: the next offset handed to the application, else the next one to
    fetch (a partition assigned at a snapshot's offset, nothing read since: a worker restarted at the end of
    its input), else the committed offset, else the log start; None while the end is unknown."""
    end = p.get("ls_offset", -1) if p.get("ls_offset", -1) >= 0 else p.get("hi_offset", -1)
    if end < 0:
        return None
    for key in ("app_offset", "next_offset", "committed_offset", "lo_offset"):
        if p.get(key, -1) >= 0:
            return max(0, end - p[key])
    return None


def _regret(model) -> tuple[float, float, float]:
    """(cumulative loss, cumulative regret, bound), means over layers; NaN where unknown."""
    try:
        report = model.regret()
        return float(report.cumulative_loss.mean()), report.mean_regret, float(report.bound)
    except Exception:  # e.g. a factorisation failing: never let metrics break the worker
        log.exception("cannot compute the regret")
        return float("nan"), float("nan"), float("nan")
