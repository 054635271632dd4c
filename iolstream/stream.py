"""The worker's pure stream logic: micro-batch, forward step, predict, join labels, fold in.

No Kafka here: messages come in as bytes with an opaque ``source`` (the adapter's
topic/partition/offset, passed back untouched on dead letters), and every step
returns what to emit. The whole state (model, batcher, join buffer, queues,
counters) is explicit and round-trips through ``to_state``/``from_state`` so a
snapshot taken between two messages resumes exactly.

One step (``step``):
1. a due feature batch is taken; -F: ``model.observe`` puts its Gram in A, then
   it is predicted (-R: predicted with the β in force);
2. its rows wait in the join buffer with the layer outputs that predicted them;
3. joined labels are folded in as batches (``label_batch_rows`` or
   ``max_label_latency_ms``), reusing cached features where the batch is still cached;
4. expired rows and orphan labels are settled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import codec, state_io
from .codec import BadInput, FeatureRows, LabelRows, TargetSpec
from .config import StreamConfig
from .joinbuffer import JoinBuffer, MicroBatcher
from .model import EdRVFL

FEATURE_CACHE_BYTES = 256 * 2**20  # features of recent batches kept for their labels (bounded)


@dataclass
class DeadLetter:
    value: bytes
    bad: BadInput
    source: object  # opaque: what the adapter passed in


@dataclass
class StepOutput:
    """What one step asks the adapter to emit."""

    predictions: list[tuple[str, bytes]] = field(default_factory=list)  # (key = row id, JSON value)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    rows_predicted: int = 0
    rows_learned: int = 0
    batch_seconds: float = 0.0
    event_ts: np.ndarray | None = None  # input event times of the predicted rows (ms, -1 unknown)

    def __bool__(self):
        return bool(self.predictions or self.dead_letters or self.rows_learned)


class PrequentialMetric:
    """Accuracy (classification) or RMSE (regression) of the emitted predictions, overall and over a window."""

    def __init__(self, task: str, window: int):
        self.task = task
        self.n = 0
        self.total = 0.0
        self.window = deque(maxlen=window)

    def update(self, errors: np.ndarray) -> None:
        """errors: per row, 1/0 correctness (classification) or squared error (regression)."""
        self.n += len(errors)
        self.total += float(errors.sum())
        self.window.extend(errors.tolist())

    def _value(self, total, n):
        if n == 0:
            return float("nan")
        return total / n if self.task == "classification" else float(np.sqrt(total / n))

    @property
    def value(self) -> float:
        return self._value(self.total, self.n)

    @property
    def window_value(self) -> float:
        return self._value(sum(self.window), len(self.window))


class StreamProcessor:
    """Pure stream logic around one EdRVFL model (SPEC §5)."""

    def __init__(self, model: EdRVFL, cfg: StreamConfig, *, window_rows: int = 1000):
        self.model = model
        self.cfg = cfg
        mc = model.config
        self.target = TargetSpec(mc.task, mc.classes, mc.m)
        self.n_features = mc.n_inputs
        # Per pending row: x (k), its column in its batch (1), the layer outputs that predicted it (L·m).
        self._payload_width = mc.n_inputs + 1 + mc.n_layers * mc.m
        self.batcher = MicroBatcher(cfg.batch_rows, cfg.max_batch_latency_ms)
        self.join = JoinBuffer(
            target=self.target, n_features=self._payload_width, max_pending_rows=cfg.max_pending_rows, row_ttl_ms=cfg.row_ttl_ms,
            row_ttl_batches=cfg.row_ttl_batches, early_label_ttl_ms=cfg.early_label_ttl_ms,
            max_early_labels=cfg.max_early_labels, remember_done=cfg.remember_done,
        )  # fmt: skip
        self.held: list[FeatureRows] = []  # batches waiting for the warm-up scaler
        self.label_queue: list = []  # joined rows waiting to be folded in: (payload (j, w), Y, batch_seq)
        self.label_queue_rows = 0
        self.label_queue_since_ms: int | None = None
        self.batch_seq = 0
        self.counters: dict[str, int] = {
            "messages_features": 0, "messages_labels": 0, "rows_in": 0, "predictions_out": 0,
            "labels_in": 0, "rows_learned": 0, "batches": 0, "label_batches": 0, "rows_forgotten": 0,
        }  # fmt: skip
        self.dead_letters: dict[str, int] = {reason: 0 for reason in codec.REASONS}
        self.metric = PrequentialMetric(mc.task, window_rows)
        self.last_losses = np.zeros(mc.n_layers)
        self.last_label_rows = 0
        self._cache: dict[int, tuple[np.ndarray, int]] = {}  # batch_seq -> (features_t, rows still pending)
        self._cache_bytes = 0

    # ------------------------------------------------------------ input
    def _dead(self, rejected, source) -> list[DeadLetter]:
        out = []
        for bad, raw in rejected:
            self.dead_letters[bad.reason] = self.dead_letters.get(bad.reason, 0) + 1
            out.append(DeadLetter(raw, bad, source))
        return out

    def on_features(self, value: bytes | None, source, now_ms: int) -> list[DeadLetter]:
        """Decode a features message into the batcher; bad rows come back as dead letters."""
        self.counters["messages_features"] += 1
        rows, rejected = codec.decode_features(value, self.n_features, max_bytes=self.cfg.max_message_bytes)
        if rows is not None and len(rows.ids):
            rows, duplicates = self.join.screen_rows(rows)  # an id already pending or done never enters A
            rejected = rejected + duplicates
        if rows is not None and len(rows.ids):
            self.counters["rows_in"] += len(rows.ids)
            self.batcher.add(rows, now_ms)
        return self._dead(rejected, source)

    def on_labels(self, value: bytes | None, source, now_ms: int) -> list[DeadLetter]:
        """Decode a labels message and join what can be joined; the rest waits or is rejected."""
        self.counters["messages_labels"] += 1
        labels, rejected = codec.decode_labels(value, self.target, max_bytes=self.cfg.max_message_bytes)
        dead = self._dead(rejected, source)
        if labels is not None and len(labels.ids):
            self.counters["labels_in"] += len(labels.ids)
            result = self.join.add_labels(labels, now_ms)
            self._queue_joined(result, now_ms)
            dead += self._dead(result.rejected, source)
        return dead

    # ------------------------------------------------------------- step
    def next_due_ms(self, now_ms: int) -> int | None:
        """Milliseconds until ``step`` has work (None: nothing waiting)."""
        waits = [self.batcher.time_to_due(now_ms)]
        if self.label_queue_rows:
            waits.append(max(0, self.label_queue_since_ms + self.cfg.max_label_latency_ms - now_ms))
        waits = [w for w in waits if w is not None]
        return min(waits) if waits else None

    def step(self, now_ms: int, *, force: bool = False) -> StepOutput:
        """Run whatever is due; ``force`` flushes partial batches (shutdown, snapshot, end of replay)."""
        import time

        out = StepOutput()
        t0 = time.perf_counter()
        while len(self.batcher) and (force or self.batcher.due(now_ms)):
            rows = self.batcher.take()
            if not self.model.ready:
                self._warm_up(rows, force=force)
                if self.model.ready:
                    self._release_held(now_ms, out)
                continue
            self._predict_batch(rows, now_ms, out)
            self._fold_if_due(now_ms, out, force=False)  # labels that joined meanwhile count before the next batch
        if force and self.held and not self.model.ready:
            self._warm_up(None, force=True)
            self._release_held(now_ms, out)
        self._fold_if_due(now_ms, out, force=force)
        self._expire(now_ms, out)
        out.batch_seconds = time.perf_counter() - t0
        return out

    def _fold_if_due(self, now_ms: int, out: StepOutput, *, force: bool) -> None:
        if self.label_queue_rows and (
            force
            or self.label_queue_rows >= self.cfg.label_batch_rows
            or now_ms - self.label_queue_since_ms >= self.cfg.max_label_latency_ms
        ):
            out.rows_learned += self._fold_labels()

    def _release_held(self, now_ms: int, out: StepOutput) -> None:
        held, self.held = self.held, []
        for rows in held:
            self._predict_batch(rows, now_ms, out)
            self._fold_if_due(now_ms, out, force=False)

    def _warm_up(self, rows: FeatureRows | None, *, force: bool) -> None:
        if rows is not None:
            self.held.append(rows)
            self.model.scaler.partial_fit(rows.X)
        if force and not self.model.ready and self.model.scaler.count >= 2:
            self.model.scaler.freeze()

    def _predict_batch(self, rows: FeatureRows, now_ms: int, out: StepOutput) -> None:
        rows, duplicates = self.join.screen_rows(rows)  # repeats across messages still in the batcher
        out.dead_letters += self._dead(duplicates, None)
        if rows is None:
            return
        self.batch_seq += 1
        pred = self.model.observe(rows.X)  # -F: Gram in before the prediction; -R: β in force
        self.counters["batches"] += 1
        b = len(rows.ids)
        values = codec.encode_predictions(
            rows.ids, pred.index if pred.index is not None else pred.value, pred.proba, model_version=pred.version,
            ts_in=rows.ts, ts_out_ms=now_ms, mode=self.model.config.mode, classes=self.model.config.classes,
        )  # fmt: skip
        out.predictions.extend(zip(rows.ids, values))
        out.rows_predicted += b
        out.event_ts = rows.ts if out.event_ts is None else np.concatenate([out.event_ts, rows.ts])
        self.counters["predictions_out"] += b
        position = np.arange(b, dtype=np.float64)[:, None]
        payload = np.hstack([rows.X, position, pred.layer_outputs.transpose(1, 0, 2).reshape(b, -1)])
        self._cache_put(self.batch_seq, pred.features_t, b)
        result = self.join.add_rows(list(rows.ids), payload, self.batch_seq, now_ms)
        self._queue_joined(result, now_ms)
        out.dead_letters += self._dead(result.rejected, None)
        self._settle_unlabelled(result.evicted)

    def _queue_joined(self, result, now_ms: int) -> None:
        if len(result.ids) == 0:
            return
        self.label_queue.append((result.X, result.Y, np.asarray(result.batch_seq, dtype=np.int64)))
        self.label_queue_rows += len(result.ids)
        if self.label_queue_since_ms is None:
            self.label_queue_since_ms = now_ms

    def _fold_labels(self) -> int:
        """Learn every queued joined row: c += DᵀY (-F) or Gram and c (-R), in one batch."""
        payload = np.concatenate([q[0] for q in self.label_queue])
        y = np.concatenate([q[1] for q in self.label_queue])
        seqs = np.concatenate([q[2] for q in self.label_queue])
        self.label_queue, self.label_queue_rows, self.label_queue_since_ms = [], 0, None
        mc = self.model.config
        k, b = mc.n_inputs, len(y)
        targets = self.model.one_hot(y) if mc.task == "classification" else np.asarray(y, float).reshape(b, mc.m)
        predicted = payload[:, k + 1 :].reshape(b, mc.n_layers, mc.m).transpose(1, 0, 2)
        features_t = self._features_for(payload[:, :k], seqs, payload[:, k].astype(np.int64))
        self.last_losses = self.model.learn(features_t, targets, predicted=predicted)
        self.counters["rows_learned"] += b
        self.last_label_rows = b
        self.counters["label_batches"] += 1
        proba, index, value = self.model.combine(predicted)
        if index is not None:
            self.metric.update((index == y).astype(float))
        else:
            self.metric.update(((value - targets) ** 2).mean(axis=1))
        return b

    # ------------------------------------------------------ feature cache
    def _cache_put(self, seq: int, features_t: np.ndarray, rows: int) -> None:
        self._cache[seq] = (features_t, rows)
        self._cache_bytes += features_t.nbytes
        while self._cache_bytes > FEATURE_CACHE_BYTES and self._cache:
            oldest = next(iter(self._cache))
            self._cache_release(oldest, None)

    def _cache_release(self, seq: int, rows: int | None) -> None:
        """Count ``rows`` of batch ``seq`` as settled (None: drop the whole entry)."""
        entry = self._cache.get(seq)
        if entry is None:
            return
        left = 0 if rows is None else entry[1] - rows
        if left <= 0:
            del self._cache[seq]
            self._cache_bytes -= entry[0].nbytes
        else:
            self._cache[seq] = (entry[0], left)

    def _features_for(self, x: np.ndarray, seqs: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """D_lᵀ of joined rows: gathered from cached batches where possible, recomputed otherwise."""
        first = int(seqs[0])
        if first in self._cache and (seqs == first).all():
            feats, pending = self._cache[first]
            if feats.shape[2] == len(seqs) and (positions == np.arange(len(seqs))).all():
                self._cache_release(first, len(seqs))
                return feats  # the in-order case: a whole batch labelled together, no copy
        out = None
        missing = np.ones(len(seqs), dtype=bool)
        for seq, count in zip(*np.unique(seqs, return_counts=True)):
            entry = self._cache.get(int(seq))
            if entry is not None:
                rows = np.flatnonzero(seqs == seq)
                if out is None:
                    out = np.empty(entry[0].shape[:2] + (len(seqs),), dtype=entry[0].dtype)
                out[:, :, rows] = entry[0][:, :, positions[rows]]
                missing[rows] = False
            self._cache_release(int(seq), int(count))
        if out is None:
            return self.model.features(x)
        if missing.any():
            out[:, :, missing] = self.model.features(x[missing])
        return out

    def _expire(self, now_ms: int, out: StepOutput) -> None:
        result = self.join.expire(now_ms, self.batch_seq)
        self._settle_unlabelled(result)
        out.dead_letters += self._dead(result.rejected, None)

    def _settle_unlabelled(self, result) -> None:
        """Rows that left the buffer without a label: their Gram stays in A unless forget_expired."""
        if len(result.ids):
            for seq, count in zip(*np.unique(np.asarray(result.batch_seq), return_counts=True)):
                self._cache_release(int(seq), int(count))
            if self.cfg.forget_expired and self.model.config.mode == "forward":
                self.model.learner.forget(self.model.features(result.X[:, : self.n_features]))  # Gram out again
                self.counters["rows_forgotten"] += len(result.ids)

    # ------------------------------------------------------------ status
    @property
    def pending_rows(self) -> int:
        return len(self.join)

    def status(self) -> dict:
        c = dict(self.counters)
        c.update({f"join_{k}": v for k, v in self.join.counters.items()})
        c["pending"] = self.pending_rows
        c["dead_letters"] = sum(self.dead_letters.values())
        c["metric"] = self.metric.value
        c["metric_window"] = self.metric.window_value
        c["model_version"] = self.model.learner.state.version
        return c

    # ------------------------------------------------------------- state
    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(manifest, arrays) of everything consumed so far; the feature cache is not kept (recomputable)."""
        manifest, arrays = state_io.model_to_arrays(self.model)
        held = _concat_rows(self.held, self.n_features)
        arrays.update({f"held/{k}": v for k, v in held.items()})
        arrays.update({f"batcher/{k}": v for k, v in self.batcher.to_state().items()})
        arrays.update({f"join/{k}": v for k, v in self.join.to_state().items()})
        if self.label_queue:
            arrays["queue/payload"] = np.concatenate([q[0] for q in self.label_queue])
            arrays["queue/y"] = np.concatenate([q[1] for q in self.label_queue])
            arrays["queue/seq"] = np.concatenate([q[2] for q in self.label_queue])
        arrays["metric/window"] = np.asarray(self.metric.window, dtype=np.float64)
        arrays["last_losses"] = self.last_losses
        manifest["stream"] = {
            "batch_seq": self.batch_seq,
            "counters": self.counters,
            "dead_letters": self.dead_letters,
            "metric": {"n": self.metric.n, "total": self.metric.total},
            "label_queue_since_ms": self.label_queue_since_ms,
        }
        return manifest, arrays

    @classmethod
    def from_state(cls, manifest: dict, arrays: dict, cfg: StreamConfig, *, window_rows: int = 1000) -> StreamProcessor:
        model = state_io.model_from_arrays(manifest, arrays)
        proc = cls(model, cfg, window_rows=window_rows)
        st = manifest["stream"]
        proc.batch_seq = int(st["batch_seq"])
        proc.counters.update(st["counters"])
        proc.dead_letters.update(st["dead_letters"])
        proc.metric.n, proc.metric.total = int(st["metric"]["n"]), float(st["metric"]["total"])
        proc.metric.window.extend(arrays["metric/window"].tolist())
        proc.last_losses = np.array(arrays["last_losses"], dtype=float)
        held = {k[len("held/") :]: v for k, v in arrays.items() if k.startswith("held/")}
        if len(held.get("ids", ())):
            proc.held = [FeatureRows([str(i) for i in held["ids"]], np.ascontiguousarray(held["X"]), held["ts"])]
        proc.batcher = MicroBatcher.from_state(
            {k[len("batcher/") :]: v for k, v in arrays.items() if k.startswith("batcher/")},
            max_rows=cfg.batch_rows, max_latency_ms=cfg.max_batch_latency_ms,
        )  # fmt: skip
        proc.join = JoinBuffer.from_state(
            {k[len("join/") :]: v for k, v in arrays.items() if k.startswith("join/")},
            target=proc.target, n_features=proc._payload_width, max_pending_rows=cfg.max_pending_rows, row_ttl_ms=cfg.row_ttl_ms,
            row_ttl_batches=cfg.row_ttl_batches, early_label_ttl_ms=cfg.early_label_ttl_ms,
            max_early_labels=cfg.max_early_labels, remember_done=cfg.remember_done,
        )  # fmt: skip
        if "queue/payload" in arrays:
            proc.label_queue = [(arrays["queue/payload"], arrays["queue/y"], arrays["queue/seq"])]
            proc.label_queue_rows = len(arrays["queue/y"])
            proc.label_queue_since_ms = st["label_queue_since_ms"]
        return proc


def _concat_rows(rows: list[FeatureRows], k: int) -> dict[str, np.ndarray]:
    if not rows:
        return {"ids": np.array([], dtype="U1"), "X": np.empty((0, k)), "ts": np.empty(0, dtype=np.int64)}
    ids = [i for r in rows for i in r.ids]
    return {
        "ids": np.array(ids, dtype=str),
        "X": np.concatenate([r.X for r in rows]),
        "ts": np.concatenate([r.ts for r in rows]).astype(np.int64),
    }
