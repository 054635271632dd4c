"""The metric families a scrape yields (``ops.metrics`` lists them), built from the last copy the worker
thread made (``ops.status.ModelStatus``, the counters, the lag), and the histograms the worker observes a
whole array at a time.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from iolstream.ops.group_metrics import group_families
from iolstream.ops.status import ModelStatus, finite

PREFIX = "iolstream_"
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
# label value -> state counter; labels_early_held is no outcome (those end joined, orphan or handed over)
LABEL_OUTCOMES = {
    "joined": "join_labels_joined",
    "duplicate": "join_labels_duplicate",
    "expired": "join_labels_expired_id",
    "orphan": "join_labels_orphan",
    "handed_over": "join_labels_handed_over",  # group learning: held early, gone with their partition
}
UNLABELLED = {"expired": "join_rows_expired", "evicted": "join_rows_evicted"}
FIELD_COUNTS = {  # named-field events: status()["fields"][kind] -> the family <kind>_values_total{field}
    "missing": "Events with a named input field absent or null (a number: the warm-up mean), by field",
    "undeclared": "Events with a category value not declared in model.features, by field",
}
PLAIN_COUNTERS = {  # state counter -> (metric, help)
    "rows_in": ("rows_in", "Feature rows accepted"),
    "rows_learned": ("rows_learned", "Labelled rows folded into the model"),
    "batches": ("batches", "Forward steps (feature batches)"),
    "label_batches": ("label_batches", "Label batches folded in"),
    "labels_in": ("labels_received", "Labels decoded (before the join)"),
    "values_clipped": (
        "values_clipped",
        "Input values beyond 1,000 deviations of the feature scaling, clipped to it (docs/design.md §4)",
    ),
    "ids_forgotten": ("forgotten_ids", "Ids forgotten on request: out of the model and the worker's stores"),
    "ids_refused": ("forget_refused_ids", "Ids of forget requests refused (dead letters by forget_* reason)"),
    "rows_erased": ("forgotten_rows_erased", "Rows forgotten on request whose terms left the model's sums"),
    "receipts_out": ("forget_receipts", "Forget receipts produced (a snapshot without their rows durable)"),
    "asks_sent": (
        "forget_asks_sent",
        "Group: forget requests for ids never seen here, passed on to the others",
    ),
    "asks_answered": ("forget_asks_answered", "Group: other members' passed-on forget requests answered"),
    "asks_closed": (
        "forget_asks_closed",
        "Group: passed-on forget requests closed, answers missing after the wait",
    ),
    "ids_removed_for_others": (
        "forget_ids_removed_for_others",
        "Group: ids taken out here for a forget request another member passed on",
    ),
}


class ArrayHistogram:
    """A histogram observed a whole array at a time (one step can predict thousands of rows)."""

    def __init__(self, name: str, doc: str, buckets=LATENCY_BUCKETS):
        self.name, self.doc = name, doc
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # last: above the largest bound
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values) -> None:
        """Count every value of ``values`` (seconds) into its bucket."""
        values = np.asarray(values, dtype=np.float64).ravel()
        if not len(values):
            return
        index = np.searchsorted(self.bounds, values, side="left")  # first bound ≥ value: Prometheus' "le"
        add = np.bincount(index, minlength=len(self.counts))
        with self._lock:
            self.counts += add
            self.sum += float(values.sum())

    def family(self) -> HistogramMetricFamily:
        """The histogram as a Prometheus family (cumulative buckets)."""
        with self._lock:
            cumulative, total = np.cumsum(self.counts).tolist(), self.sum
        les = [repr(float(b)) for b in self.bounds] + ["+Inf"]
        return HistogramMetricFamily(
            PREFIX + self.name, self.doc, buckets=list(zip(les, cumulative)), sum_value=total
        )


def _counter(name: str, doc: str, value) -> CounterMetricFamily:
    c = CounterMetricFamily(PREFIX + name, doc)
    c.add_metric([], value)
    return c


def _gauge(name: str, doc: str, value, **labels) -> GaugeMetricFamily:
    g = GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), finite(value))
    return g


class WorkerCollector:
    """Yields the metric families of one ``ops.metrics.Metrics``, from its last copy of the worker's state."""

    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        """The families of one scrape, in a fixed order."""
        m = self.metrics
        status, totals, lag = m.scrape_copy()
        for hist in (m.batch_seconds, m.latency, m.event_latency):
            yield hist.family()
        yield _gauge("ready", "1 when /readyz answers 200", float(m.ready()[0]))
        if status is None:  # no worker attached yet (the model is loading)
            return
        yield from counter_families(totals)
        yield from model_families(status)
        yield from snapshot_families(status)
        yield lag_family(lag)
        yield from group_families(status.group)


def counter_families(totals: dict[str, int]):
    """This process' counters of the stream state (from 0 at its start)."""
    for key, (name, doc) in PLAIN_COUNTERS.items():
        yield _counter(name, doc, totals.get(key, 0))
    labels = CounterMetricFamily(PREFIX + "labels", "Labels by outcome of the join", labels=["outcome"])
    for outcome, key in LABEL_OUTCOMES.items():
        labels.add_metric([outcome], totals.get(key, 0))
    yield labels
    unlabelled = CounterMetricFamily(
        PREFIX + "rows_unlabelled", "Rows that left the join buffer unlabelled", labels=["why"]
    )
    for why, key in UNLABELLED.items():
        unlabelled.add_metric([why], totals.get(key, 0))
    yield unlabelled
    for kind, doc in FIELD_COUNTS.items():  # named-field events, per field (fields seen so far)
        family = CounterMetricFamily(PREFIX + f"{kind}_values", doc, labels=["field"])
        for key, value in sorted(totals.items()):
            if key.startswith(f"{kind}/"):
                family.add_metric([key[len(kind) + 1 :]], value)
        yield family


def model_families(v: ModelStatus):
    """The stream state's sizes, the prequential metric, losses and regret, the settings in force."""
    mode = v.mode
    yield _gauge("pending_rows", "Rows waiting for their label", v.pending)
    yield _gauge("held_rows", "Rows waiting for the warm-up scaler (not predicted yet)", v.held)
    yield _gauge(
        "warmup_rows", "Rows the warm-up scaler has (no prediction before warmup_target_rows)", v.warmup_rows
    )
    yield _gauge(
        "warmup_target_rows",
        "Rows the warm-up scaler waits for (model.warmup_rows; 0: none)",
        v.warmup_target,
    )
    yield _gauge("early_labels", "Labels waiting for their feature row", v.early_labels)
    yield _gauge("model_version", "Model version (changes of β)", v.model_version)
    preq = GaugeMetricFamily(
        PREFIX + "prequential",
        "Prequential metric of the emitted predictions",
        labels=["metric", "window", "mode"],
    )
    preq.add_metric([v.metric_name, "all", mode], finite(v.metric))
    preq.add_metric([v.metric_name, "sliding", mode], finite(v.metric_window))
    for window, values in (("all", v.metrics), ("sliding", v.metrics_window)):
        for name, value in values.items():
            if name != v.metric_name and not isinstance(value, list):
                preq.add_metric([name, window, mode], finite(value))
    yield preq
    yield from class_families(v)
    yield _gauge(
        "immediate_loss",
        "½‖Dβ − Y‖² of the last label batch, mean over layers (docs/design.md §3)",
        v.immediate_loss,
        mode=mode,
    )
    yield _gauge("label_batch_rows", "Rows in the last label batch", v.label_batch_rows)
    yield _gauge("cumulative_loss", "Σ_t ½‖D_t β_t − Y_t‖², mean over layers", v.cumulative_loss, mode=mode)
    yield _gauge(
        "cumulative_regret",
        "Cumulative regret vs the offline expert, mean over layers (docs/design.md §3)",
        v.regret,
        mode=mode,
    )
    yield _gauge(
        "regret_bound", "Theorem 4 (-R) / 5 (-F) bound on the cumulative regret", v.regret_bound, mode=mode
    )
    eff = v.effective  # the λ, half-life and mode in force (model.lam / model.forgetting: auto picks them)
    yield _gauge("effective_lambda", "The ridge λ in force", eff["lam"])
    yield _gauge(
        "effective_half_life_rows",
        "The forgetting half-life in force, in rows (NaN: no forgetting)",
        float("nan") if eff["forgetting"] is None else eff["forgetting"],
    )
    yield _gauge(
        "effective_mode",
        "1, labelled with the update in force: forward (-F) or ridge (-R)",
        1,
        mode=eff["mode"],
    )
    loss = GaugeMetricFamily(
        PREFIX + "candidate_recent_loss",
        "auto: each candidate's recent loss per row",
        labels=["lam", "half_life", "mode"],
    )
    for c in eff.get("candidates", []):
        half_life = "none" if c["forgetting"] is None else f"{c['forgetting']:g}"
        loss.add_metric([f"{c['lam']:g}", half_life, c["mode"]], finite(c["recent_loss"]))
    yield loss
    if "scored_share" in eff:
        yield _gauge(
            "candidate_scored_share",
            "auto: share of the rows every candidate predicted (the rest, only the one in force)",
            eff["scored_share"],
        )


def class_families(v: ModelStatus):
    """Classification: each class's prequential precision and recall, and the heaviest map of the calibration (the
    families are there for every model, empty or NaN when they do not apply)."""
    for kind in ("precision", "recall"):
        family = GaugeMetricFamily(
            PREFIX + f"class_{kind}",
            f"Prequential {kind} of each class, over all rows or the sliding window",
            labels=["class", "window"],
        )
        for window, values in (("all", v.metrics), ("sliding", v.metrics_window)):
            for cls, value in zip(v.classes or (), values.get(kind, [])):
                family.add_metric([str(cls), window], finite(value))
        yield family
    cal = v.calibration or {"temperature": float("nan"), "kappa": float("nan")}
    yield _gauge(
        "calibration_temperature",
        "The heaviest map of the calibration's mixture: softmax(T·g_κ(clipped mean output)), labelled with κ "
        "(docs/design.md §12)",
        cal["temperature"],
        kappa=f"{cal['kappa']:g}",
    )


def snapshot_families(v: ModelStatus):
    """The newest durable snapshot: its age, write time and size."""
    written = v.snapshot_written_at
    yield _gauge(
        "snapshot_age_seconds",
        "Seconds since the newest durable snapshot",
        time.time() - written if written else float("nan"),
    )
    yield _gauge("snapshot_duration_seconds", "Write time of the last snapshot", v.snapshot_seconds)
    yield _gauge("snapshot_bytes", "Size of the last snapshot", v.snapshot_bytes)


def lag_family(lag: dict[tuple[str, int], int]) -> GaugeMetricFamily:
    """Messages behind the end of each consumed partition."""
    family = GaugeMetricFamily(
        PREFIX + "consumer_lag",
        "Messages behind the end of each consumed partition (librdkafka statistics)",
        labels=["topic", "partition"],
    )
    for (topic, part), value in sorted(lag.items()):
        family.add_metric([topic, str(part)], value)
    return family
