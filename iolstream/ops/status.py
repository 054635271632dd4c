"""What the metrics and health endpoints read of a running worker, typed.

``WorkerView`` is what the worker exposes (``kafka.worker.Worker`` fills it; ops never imports kafka);
``ModelStatus`` is the copy of the model and stream state a scrape reports, made on the worker thread
(``model_status``) and replaced, never mutated, so an HTTP thread never sees the learner half-updated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from iolstream.stream.processor import StreamProcessor


class CheckpointInfo(Protocol):
    """The last durable checkpoint: when it was written (wall clock, 0: never), its write time and size."""

    written_at: float
    snapshot_seconds: float
    snapshot_bytes: int


class WorkerView(Protocol):
    """A running worker as the metrics and health endpoints see it."""

    processor: StreamProcessor  # the stream state and its model (a roll-back replaces it)
    checkpoint: CheckpointInfo
    starting: str | None  # what the start is doing (compiling the kernels, ...); None once the loop runs
    last_tick: float  # monotonic time of the loop's last tick
    stopping: bool  # a stop was requested
    connected: bool  # the input consumer exists
    partitions: int  # input partitions assigned
    replay_pending: bool  # exactly-once: input a committed transaction covered is being replayed
    broker_unreachable_seconds: float | None  # None: reachable, as far as the worker knows
    group_status: dict | None  # group learning (``ops.group_metrics``); None: off


@dataclass(frozen=True)
class ModelStatus:
    """The gauges a scrape reports of the model, the stream state and the last snapshot."""

    mode: str  # the model's mode (``model.mode``)
    metric_name: str  # accuracy | rmse
    pending: int
    held: int
    warmup_rows: int  # rows the warm-up scaler has of the warmup_target it waits for (equal once it froze)
    warmup_target: int  # model.warmup_rows (0: no warm-up scaler)
    early_labels: int
    model_version: int
    metric: float
    metric_window: float
    immediate_loss: float
    label_batch_rows: int
    cumulative_loss: float
    regret: float
    regret_bound: float
    effective: dict  # the λ and half-life in force (``EdRVFL.effective``)
    metrics: dict  # every prequential metric over all rows (``stream.prequential``; per-class lists)
    metrics_window: dict  # the same over the sliding window
    classes: tuple | None  # the declared classes (per-class metrics), None for regression
    calibration: (
        dict | None
    )  # the heaviest map of the calibration ({"kappa", "temperature", "weight"}), None if not calibrated
    snapshot_written_at: float
    snapshot_seconds: float
    snapshot_bytes: int
    group: dict | None


def model_status(
    proc: StreamProcessor,
    status: dict,
    checkpoint: CheckpointInfo,
    regret: tuple[float, float, float],
    group: dict | None,
) -> ModelStatus:
    """The copy a scrape reads: ``status`` is ``proc.status()``, ``regret`` (cumulative loss, regret,
    bound)."""
    mc = proc.model.config
    return ModelStatus(
        mode=mc.mode,
        metric_name="accuracy" if mc.task == "classification" else "rmse",
        pending=status["pending"],
        held=status["held"],
        warmup_rows=status["warmup_rows"],
        warmup_target=status["warmup_target"],
        early_labels=status["early_labels"],
        model_version=status["model_version"],
        metric=status["metric"],
        metric_window=status["metric_window"],
        immediate_loss=proc.immediate_loss,
        label_batch_rows=proc.last_label_rows,
        cumulative_loss=regret[0],
        regret=regret[1],
        regret_bound=regret[2],
        effective=proc.model.effective,
        metrics=status["metrics"],
        metrics_window=status["metrics_window"],
        classes=mc.classes,
        calibration=proc.model.calibration_in_force(),
        snapshot_written_at=checkpoint.written_at,
        snapshot_seconds=checkpoint.snapshot_seconds,
        snapshot_bytes=checkpoint.snapshot_bytes,
        group=group,
    )


def finite(value) -> float:
    """``value`` as a float, NaN when unknown or not finite."""
    return float(value) if value is not None and math.isfinite(value) else float("nan")
