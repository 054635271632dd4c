"""The worker's pure stream logic: micro-batch, forward step, predict, join labels, fold in.

No Kafka here: messages come in as bytes with an opaque, JSON-able ``source`` (the
adapter's topic/partition/offset, passed back untouched on dead letters), and every
step returns what to emit. The whole state (model, batcher, join buffer, queues,
counters) is explicit and round-trips through ``to_state``/``from_state`` so a
snapshot taken between two messages resumes bit for bit.

One step (``step``):
1. joined labels that are due (``label_batch_rows`` rows queued, or the oldest waited
   ``max_label_latency_ms``) are folded in as one batch;
2. each due feature batch is taken; -F: ``model.observe`` puts its Gram in A, then it
   is predicted (-R: predicted with the β in force); its rows wait in the join buffer
   with the layer outputs that predicted them; labels joined meanwhile are folded in
   when due, before the next batch;
3. expired rows and orphan labels are settled.
With labels one batch late and ``label_batch_rows`` = ``batch_rows`` this is the
paper's recursion (evaluate's protocol), step for step.

Rules worth knowing:
- While the warm-up scaler is not frozen, batches are held (no prediction, no Gram); once
  it freezes they are predicted in order, each after the labels of the ones before. A
  forced step (shutdown, rebalance) never freezes it early: the scaling would then
  depend on when the worker stopped.
- A feature row whose id is pending, done, or already waiting in the batcher or the
  warm-up hold is a ``duplicate_id`` at arrival: it never enters A.
- The features D of a label batch are recomputed from the stored rows, except when
  the batch is exactly one observed batch in its order: then the cached D of that
  batch is reused. Both give the same bits (same rows, same shapes), so a run
  restored from a snapshot (no cache) continues bitwise like one that never stopped.
- With forgetting (``model.forgetting``), each pending row keeps its stamp (the model's clock right
  after its batch was seen, ``Prediction.clock``); its label enters, and an expired row's Gram leaves,
  at the weight 2^(−age/half-life) its Gram has in A, so β stays the closed-form weighted ridge for any
  label delay and order. With ``auto`` every candidate's layer outputs wait with the row, so each
  candidate is judged on the prediction it made; expiry reaches every candidate.
- A dead letter of a one-row message carries the message's raw bytes; one row of a
  batch message carries that row re-encoded (codec). An early label given up on
  (``unknown_id``) carries the source of the message that brought it.

    >>> import numpy as np
    >>> from iolstream.kafka.config import StreamConfig
    >>> from iolstream.core.model import EdRVFL, ModelConfig
    >>> model = EdRVFL(ModelConfig(n_inputs=2, classes=(0, 1), n_nodes=8, n_layers=2, scaler="none"))
    >>> proc = StreamProcessor(model, StreamConfig(batch_rows=2, max_batch_latency_ms=10))
    >>> proc.on_features(b'{"ids": ["a", "b"], "x": [[0, 1], [1, 0]]}', "src@0", now_ms=0)
    []
    >>> out = proc.step(now_ms=0)
    >>> [key for key, _ in out.predictions], out.rows_predicted
    (['a', 'b'], 2)
    >>> dead = proc.on_labels(b'{"id": "a", "y": 7}', "src@1", now_ms=1)
    >>> [(d.bad.reason, d.value, d.source) for d in dead]
    [('unknown_class', b'{"id": "a", "y": 7}', 'src@1')]
"""

from __future__ import annotations

import logging
import time

import numpy as np

from iolstream.core import state_io, unit_ranges
from iolstream.stream import codec, encoding
from iolstream.stream.batcher import MicroBatcher
from iolstream.stream.config import StreamConfig
from iolstream.stream.joinbuffer import JoinBuffer
from iolstream.stream.outputs import DeadLetter, PrequentialMetric, StepOutput
from iolstream.stream.rows import BadInput, FeatureRows, TargetSpec

__all__ = [
    "StreamProcessor",
    "DeadLetter",
    "StepOutput",
    "PAYLOAD",
]  # the step's outputs, re-exported for the adapter
from iolstream.core.model import EdRVFL

log = logging.getLogger("iolstream.processor")
FEATURE_CACHE_BYTES = 256 * 2**20  # features of recent batches kept for their labels (bounded)
# Columns of a pending row's payload (join buffer, label queue), saved in the state's manifest.
PAYLOAD = ("x", "position", "stamp", "candidate", "outputs")


class StreamProcessor:
    """Pure stream logic around one EdRVFL model (docs/design.md §5)."""

    def __init__(self, model: EdRVFL, cfg: StreamConfig, *, window_rows: int = 1000):
        self.model = model
        self.cfg = cfg
        mc = model.config
        self.target = TargetSpec(mc.task, mc.classes, mc.m)
        self.n_features = mc.n_inputs
        # Per pending row (PAYLOAD): x (k), its column in its batch (1), its clock stamp (1, for forgetting:
        # the weight its Gram has in A), the candidate that emitted its prediction (1), and every candidate's
        # layer outputs (K·L·m; K = 1 without auto) so that each candidate is judged on its own prediction.
        self.n_candidates = len(model.learners)
        self._payload_width = mc.n_inputs + 3 + self.n_candidates * mc.n_layers * mc.m
        self.batcher = MicroBatcher(cfg.batch_rows, cfg.max_batch_latency_ms)
        self.join = JoinBuffer(**self._join_settings())
        self.held: list[FeatureRows] = []  # batches waiting for the warm-up scaler
        self.propose_scaling = (
            None  # group learning: gets the warm-up rows; the group freezes the scaler (stream.group)
        )
        self._queued_ids: set[str] = set()  # ids in the batcher or held: not yet in the join buffer
        self.label_queue: list = []  # joined rows waiting to be folded in: (payload (j, w), Y, batch_seq)
        self.label_queue_rows = 0
        self.label_queue_since_ms: int | None = None
        self.batch_seq = 0
        self.counters: dict[str, int] = {
            "messages_features": 0,
            "messages_labels": 0,
            "rows_in": 0,
            "predictions_out": 0,
            "labels_in": 0,
            "rows_learned": 0,
            "batches": 0,
            "label_batches": 0,
            "rows_forgotten": 0,
        }
        self.dead_letters: dict[str, int] = {reason: 0 for reason in codec.REASONS}
        self.metric = PrequentialMetric(mc.task, window_rows)
        self.last_losses = np.zeros(mc.n_layers)
        self.last_label_rows = 0
        # batch_seq -> (features_t, emitted class indices / values)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._cache_bytes = 0

    # ------------------------------------------------------------ input
    def _dead(self, rejected, source, raw: bytes | None = None) -> list[DeadLetter]:
        """Count and wrap rejections; ``raw``: the message's bytes, used when it held this one row only."""
        out = []
        for bad, value in rejected:
            self.dead_letters[bad.reason] = self.dead_letters.get(bad.reason, 0) + 1
            out.append(DeadLetter(raw if raw is not None else value, bad, source))
        return out

    def on_features(self, value: bytes | None, source, now_ms: int) -> list[DeadLetter]:
        """Decode a features message into the batcher; bad rows come back as dead letters."""
        self.counters["messages_features"] += 1
        rows, rejected = codec.decode_features(value, self.n_features, max_bytes=self.cfg.max_message_bytes)
        dead = self._dead(rejected, source)
        if rows is None or not len(rows.ids):
            return dead
        single = len(rows.ids) == 1 and not rejected
        rows, duplicates = self.join.screen_rows(rows)  # an id already pending or done never enters A
        if rows is not None and self._queued_ids.intersection(rows.ids):
            rows, queued = self._screen_queued(rows)
            duplicates += queued
        dead += self._dead(duplicates, source, raw=value if single else None)
        if rows is not None and len(rows.ids):
            self.counters["rows_in"] += len(rows.ids)
            self._queued_ids.update(rows.ids)
            self.batcher.add(rows, now_ms)
        return dead

    def _screen_queued(self, rows: FeatureRows):
        """Split off rows whose id already waits in the batcher or the warm-up hold."""
        keep = [i for i, row_id in enumerate(rows.ids) if row_id not in self._queued_ids]
        rejected = [
            (
                BadInput("duplicate_id", f"id {row_id!r} is already waiting to be predicted"),
                encoding.feature_message(row_id, rows.X[i], int(rows.ts[i])),
            )
            for i, row_id in enumerate(rows.ids)
            if row_id in self._queued_ids
        ]
        self.join.counters["rows_duplicate"] += len(rejected)
        if not keep:
            return None, rejected
        return FeatureRows([rows.ids[i] for i in keep], rows.X[keep], rows.ts[keep]), rejected

    def on_labels(self, value: bytes | None, source, now_ms: int) -> list[DeadLetter]:
        """Decode a labels message and join what can be joined; the rest waits or is rejected."""
        self.counters["messages_labels"] += 1
        labels, rejected = codec.decode_labels(value, self.target, max_bytes=self.cfg.max_message_bytes)
        dead = self._dead(rejected, source)
        if labels is None or not len(labels.ids):
            return dead
        self.counters["labels_in"] += len(labels.ids)
        result = self.join.add_labels(
            labels, now_ms, waiting=self._queued_ids, source=source
        )  # held early: kept with its source
        self.queue_joined(result, now_ms)
        mine = [
            (bad, raw) for bad, raw in result.rejected if bad.reason != "unknown_id"
        ]  # this message's labels
        if mine:
            single = len(labels.ids) == 1 and not rejected
            dead += self._dead(mine, source, raw=value if single else None)
        if result.orphan_sources:
            dead += self._orphans(result.rejected, result.orphan_sources)
        return dead

    def _orphans(self, rejected, sources) -> list[DeadLetter]:
        """Early labels given up on (unknown_id), each with the source of the message that brought it
        (``sources``: one per unknown_id entry of ``rejected``, in order)."""
        orphans = [(bad, raw) for bad, raw in rejected if bad.reason == "unknown_id"]
        out = []
        for (bad, raw), source in zip(orphans, sources, strict=True):
            out += self._dead([(bad, raw)], source)
        return out

    # ------------------------------------------------------------- step
    def next_due_ms(self, now_ms: int) -> int | None:
        """Milliseconds until ``step`` has work (None: nothing waiting)."""
        waits = [self.batcher.time_to_due(now_ms)]
        if self.label_queue_rows:
            waits.append(max(0, self.label_queue_since_ms + self.cfg.max_label_latency_ms - now_ms))
        waits = [w for w in waits if w is not None]
        return min(waits) if waits else None

    def step(self, now_ms: int, *, force: bool = False) -> StepOutput:
        """Run whatever is due; ``force`` flushes partial batches and queued labels (shutdown,
        snapshot, end of a transaction) — but never freezes a warm-up scaler early."""
        out = StepOutput()
        t0 = time.perf_counter()
        if self.held and self.model.ready:  # frozen from outside (group learning): the held batches go first
            self._release_held(now_ms, out)
        self._fold_if_due(
            now_ms, out, force=False
        )  # labels that came since the last batch, before the next one
        while len(self.batcher) and (force or self.batcher.due(now_ms)):
            rows = self.batcher.take()
            if not self.model.ready:
                self.held.append(rows)
                self._warm_up()
                if self.model.ready:
                    self._release_held(now_ms, out)
                continue
            self._predict_batch(rows, now_ms, out)
            self._fold_if_due(now_ms, out, force=False)  # early labels joined by this batch, before the next
        self._fold_if_due(now_ms, out, force=force)
        self._expire(now_ms, out)
        out.batch_seconds = time.perf_counter() - t0
        return out

    def _fold_if_due(self, now_ms: int, out: StepOutput, *, force: bool) -> None:
        """Fold the queued labels when forced, when the oldest has waited max_label_latency_ms
        (all of them then), or when label_batch_rows are queued: then up to where the rows of
        the batch queued last begin if the queue spans several batches (see ``_fold_labels``)."""
        while self.label_queue_rows:
            everything = force or now_ms - self.label_queue_since_ms >= self.cfg.max_label_latency_ms
            if not everything and self.label_queue_rows < self.cfg.label_batch_rows:
                return
            out.rows_learned += self._fold_labels(everything)

    def _warm_up(self) -> None:
        """Freeze the warm-up scaler once the held batches hold its W rows: fitted on exactly the first
        W rows in one call, so the scaling never depends on where the batch boundaries fell (docs/design.md §4)."""
        scaler = self.model.scaler
        if self.held_rows < scaler.warmup_rows:
            return
        head = np.concatenate([rows.X for rows in self.held])[: scaler.warmup_rows]
        if self.propose_scaling is not None:
            return self.propose_scaling(head)
        scaler.partial_fit(head[scaler.count :])  # count > 0 only in a state saved by an older version
        scaler.freeze()

    def _release_held(self, now_ms: int, out: StepOutput) -> None:
        """Predict the held batches in order. Their labels that came meanwhile (early) join as each
        batch enters the buffer and are folded in before the next one: the held batches spanned the
        whole warm-up, far beyond the label latency."""
        held, self.held = self.held, []
        units = unit_ranges.of_model(self.model, np.concatenate([rows.X for rows in held]))
        if units is not None and units.mostly_linear:  # said once: the warm-up ends here
            log.warning("%s; set %s", units.describe(), units.remedy("model.{}: {}"), extra=units.fields)
        for rows in held:
            self._predict_batch(rows, now_ms, out)
            self._fold_if_due(now_ms, out, force=True)

    def _predict_batch(self, rows: FeatureRows, now_ms: int, out: StepOutput) -> None:
        self._queued_ids.difference_update(rows.ids)  # on_features screened every id (pending, done, queued)
        self.batch_seq += 1
        pred = self.model.observe(rows.X)  # -F: Gram in before the prediction (Algorithm 2); -R: β in force
        self.counters["batches"] += 1
        b = len(rows.ids)
        out.add_predictions(
            rows.ids,
            y_hat=pred.index if pred.index is not None else pred.value,
            proba=pred.proba,
            model_version=pred.version,
            ts_in=rows.ts,
            ts_out_ms=now_ms,
            mode=self.model.modes[self.model.selector.chosen],  # -F or -R (auto: the one in force)
            classes=self.model.config.classes,
        )
        out.event_ts = rows.ts if out.event_ts is None else np.concatenate([out.event_ts, rows.ts])
        self.counters["predictions_out"] += b
        mc = self.model.config
        outputs = np.asarray(pred.predicted).reshape(self.n_candidates, mc.n_layers, b, mc.m)  # (K, L, b, m)
        payload = np.empty((b, self._payload_width))
        k = self.n_features
        payload[:, :k] = rows.X
        payload[:, k] = np.arange(b)
        payload[:, k + 1] = pred.clock  # rows seen so far: exact in float64 below 2⁵³
        payload[:, k + 2] = self.model.selector.chosen
        payload[:, k + 3 :] = outputs.transpose(2, 0, 1, 3).reshape(b, -1)
        self._cache_put(self.batch_seq, pred.features_t, pred.index if pred.index is not None else pred.value)
        result = self.join.add_rows(list(rows.ids), payload, self.batch_seq, now_ms)
        self.queue_joined(result, now_ms)
        out.dead_letters += self._dead(result.rejected, None)
        self._settle_unlabelled(result.evicted)

    def queue_joined(self, result, now_ms: int) -> None:
        if len(result.ids) == 0:
            return
        self.label_queue.append((result.X, result.Y, np.asarray(result.batch_seq, dtype=np.int64)))
        self.label_queue_rows += len(result.ids)
        if self.label_queue_since_ms is None:
            self.label_queue_since_ms = now_ms

    def _fold_labels(self, everything: bool = True) -> int:
        """Learn queued joined rows in one batch: c += DᵀY (-F, the Gram is in A already) or Gram
        and c together (-R). All of them, or (``everything`` False) all but the trailing rows of
        the batch queued last when the queue spans several batches: those stay queued (with the
        queue's age), so that label batches fall on feature batches. One-row label messages one
        row behind their features would otherwise fold rows 255..510, 511..766, …: never a whole
        batch, so never the cached features (``_features_for``). The split depends on the queued
        rows alone, never on the cache, so a restored run folds the same groups."""
        payload = np.concatenate([q[0] for q in self.label_queue])
        y = np.concatenate([q[1] for q in self.label_queue])
        seqs = np.concatenate([q[2] for q in self.label_queue])
        cut = len(seqs)
        if not everything and seqs[0] != seqs[-1]:
            cut = len(seqs) - int(
                np.argmax(seqs[::-1] != seqs[-1])
            )  # where the trailing run of that batch begins
        if cut < len(seqs):
            self.label_queue = [(payload[cut:], y[cut:], seqs[cut:])]
            self.label_queue_rows = len(seqs) - cut
            payload, y, seqs = payload[:cut], y[:cut], seqs[:cut]
        else:
            self.label_queue, self.label_queue_rows, self.label_queue_since_ms = [], 0, None
        mc = self.model.config
        k, b = mc.n_inputs, len(y)
        targets = (
            self.model.one_hot(y) if mc.task == "classification" else np.asarray(y, float).reshape(b, mc.m)
        )
        outputs = (
            payload[:, k + 3 :].reshape(b, self.n_candidates, mc.n_layers, mc.m).transpose(1, 2, 0, 3)
        )  # (K, L, b, m)
        chosen = payload[:, k + 2].astype(np.int64)
        stamps = payload[:, k + 1].astype(np.int64)
        # what was emitted: each row's outputs of the candidate in force when it was predicted
        emitted_outputs = (
            outputs[0] if self.n_candidates == 1 else outputs[chosen, :, np.arange(b), :].transpose(1, 0, 2)
        )
        features_t, emitted = self._features_for(payload[:, :k], seqs, payload[:, k].astype(np.int64))
        predicted = outputs[0] if self.n_candidates == 1 else outputs
        self.last_losses = self.model.learn(features_t, targets, predicted=predicted, observed_at=stamps)
        self.counters["rows_learned"] += b
        self.last_label_rows = b
        self.counters["label_batches"] += 1
        if emitted is None:  # the ensemble of the stored layer outputs: what was emitted for these rows
            _, index, value = self.model.combine(emitted_outputs)
        else:
            index, value = (emitted, None) if mc.task == "classification" else (None, emitted)
        if index is not None:
            self.metric.update((index == y).astype(float))
        else:
            self.metric.update(((value - targets) ** 2).mean(axis=1))
        return b

    # ------------------------------------------------------ feature cache
    def _cache_put(self, seq: int, features_t: np.ndarray, emitted: np.ndarray) -> None:
        self._cache[seq] = (features_t, emitted)
        self._cache_bytes += features_t.nbytes
        while self._cache_bytes > FEATURE_CACHE_BYTES and self._cache:
            oldest = next(iter(self._cache))
            self._cache_drop(oldest)

    def _cache_drop(self, seq: int) -> None:
        """Rows of batch ``seq`` settled (joined and folded, expired or evicted), or the cache is full:
        drop its entry. The cached features are reused only by a fold of the whole batch at
        once (``_features_for``), which can no longer happen once any of its rows has settled; kept
        until the last row settled, a batch with one row whose label never comes stayed cached until
        that row expired, and such batches filled the cache to FEATURE_CACHE_BYTES."""
        entry = self._cache.pop(seq, None)
        if entry is not None:
            self._cache_bytes -= entry[0].nbytes

    def _features_for(self, x: np.ndarray, seqs: np.ndarray, positions: np.ndarray):
        """(D_lᵀ of joined rows, their emitted predictions or None): the cached D and predictions of
        their batch when they are that whole batch in order, else D recomputed from x and None.
        Never a gather from cached batches: BLAS gives other bits for other shapes, and a restored
        run (empty cache) must continue bitwise."""
        first = int(seqs[0])
        entry = self._cache.get(first)
        whole = (
            entry is not None
            and entry[0].shape[2] == len(seqs)
            and (seqs == first).all()
            and (positions == np.arange(len(seqs))).all()
        )
        for seq in np.unique(seqs).tolist():
            self._cache_drop(seq)
        return (entry[0], entry[1]) if whole else (self.model.features(x), None)

    def _expire(self, now_ms: int, out: StepOutput) -> None:
        result = self.join.expire(now_ms, self.batch_seq)
        self._settle_unlabelled(result)
        out.dead_letters += self._orphans(result.rejected, result.orphan_sources)

    def _settle_unlabelled(self, result) -> None:
        """Rows that left the buffer without a label: their Gram stays in A unless forget_expired."""
        if len(result.ids):
            for seq in np.unique(np.asarray(result.batch_seq)).tolist():
                self._cache_drop(seq)
            if self.cfg.forget_expired and self.model.config.mode != "ridge":
                k = self.n_features  # Gram out again, of every candidate, at the weight it has now
                self.model.forget(
                    self.model.features(result.X[:, :k]), observed_at=result.X[:, k + 1].astype(np.int64)
                )
                self.counters["rows_forgotten"] += len(result.ids)

    # ------------------------------------------------------------ status
    @property
    def pending_rows(self) -> int:
        return len(self.join)

    @property
    def held_rows(self) -> int:
        """Rows waiting for the warm-up scaler (not predicted yet)."""
        return sum(len(r) for r in self.held)

    def status(self) -> dict:
        c = dict(self.counters)
        c.update({f"join_{k}": v for k, v in self.join.counters.items()})
        c["pending"] = self.pending_rows
        c["held"] = self.held_rows
        c["early_labels"] = self.join.n_early
        c["dead_letters"] = sum(self.dead_letters.values())
        c["metric"] = self.metric.value
        c["metric_window"] = self.metric.window_value
        c["model_version"] = self.model.version
        return c

    # ------------------------------------------------------------- state
    def _join_settings(self) -> dict:
        """The JoinBuffer's keyword arguments: the target, the payload width and the stream's bounds."""
        cfg = self.cfg
        return dict(
            target=self.target,
            n_features=self._payload_width,
            max_pending_rows=cfg.max_pending_rows,
            row_ttl_ms=cfg.row_ttl_ms,
            row_ttl_batches=cfg.row_ttl_batches,
            early_label_ttl_ms=cfg.early_label_ttl_ms,
            max_early_labels=cfg.max_early_labels,
            remember_done=cfg.remember_done,
        )

    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(manifest, arrays) of everything consumed so far; the feature cache is not kept (recomputable)."""
        manifest, arrays = state_io.model_to_arrays(self.model)
        held = _concat_rows(self.held, self.n_features)
        arrays.update({f"held/{k}": v for k, v in held.items()})
        arrays["held/sizes"] = np.array([len(rows) for rows in self.held], dtype=np.int64)  # one batch each
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
            "last_label_rows": self.last_label_rows,
            "early_sources": [
                [row_id, source] for row_id, _, _, source in self.join.early_labels() if source is not None
            ],
            "payload": list(PAYLOAD),
        }
        return manifest, arrays

    @classmethod
    def from_state(
        cls, manifest: dict, arrays: dict, cfg: StreamConfig, *, window_rows: int = 1000
    ) -> StreamProcessor:
        model = state_io.model_from_arrays(manifest, arrays)
        proc = cls(model, cfg, window_rows=window_rows)
        st = manifest["stream"]
        proc.batch_seq = int(st["batch_seq"])
        proc.counters.update(st["counters"])
        proc.dead_letters.update(st["dead_letters"])
        proc.metric.n, proc.metric.total = int(st["metric"]["n"]), float(st["metric"]["total"])
        proc.metric.window.extend(arrays["metric/window"].tolist())
        proc.last_losses = np.array(arrays["last_losses"], dtype=float)
        proc.last_label_rows = int(st.get("last_label_rows", 0))
        arrays = _payload_of_this_version(arrays, manifest["format_version"], st.get("payload"), model)
        held = {k[len("held/") :]: v for k, v in arrays.items() if k.startswith("held/")}
        if len(held.get("ids", ())):
            rows = FeatureRows([str(i) for i in held["ids"]], np.ascontiguousarray(held["X"]), held["ts"])
            bounds = np.concatenate([[0], np.cumsum(held.get("sizes", [len(rows)]))])
            proc.held = [rows.take(a, b) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
        proc.batcher = MicroBatcher.from_state(
            {k[len("batcher/") :]: v for k, v in arrays.items() if k.startswith("batcher/")},
            max_rows=cfg.batch_rows,
            max_latency_ms=cfg.max_batch_latency_ms,
        )
        proc._queued_ids = {i for rows in proc.held for i in rows.ids}
        if "batcher/ids" in arrays:
            proc._queued_ids.update(str(i) for i in arrays["batcher/ids"].tolist())
        proc.join = JoinBuffer.from_state(
            {k[len("join/") :]: v for k, v in arrays.items() if k.startswith("join/")},
            **proc._join_settings(),
        )
        proc.join.set_early_sources(
            (row_id, _tuples(source)) for row_id, source in st.get("early_sources", [])
        )
        if "queue/payload" in arrays:
            proc.label_queue = [(arrays["queue/payload"], arrays["queue/y"], arrays["queue/seq"])]
            proc.label_queue_rows = len(arrays["queue/y"])
            proc.label_queue_since_ms = st["label_queue_since_ms"]
        return proc


def _payload_of_this_version(arrays: dict, version: int, layout, model: EdRVFL) -> dict:
    """The pending rows' and queued labels' payloads in this version's layout (PAYLOAD). A version-1 state
    (before the stamps) holds x, position, L·m outputs of its one learner: the stamp column gets the
    clock (weight 1; such a state never forgets) and the candidate column 0."""
    if version != 1:
        if layout is None or list(layout) != list(PAYLOAD):
            raise ValueError(
                f"pending rows saved with the payload layout {layout}; this build reads {list(PAYLOAD)}"
            )
        return arrays
    if len(model.learners) != 1 or model.learner.half_life is not None:
        raise ValueError("a version-1 state has no row stamps: it cannot forget nor hold auto candidates")
    k = model.config.n_inputs
    arrays = dict(arrays)
    for key in ("join/pending_X", "queue/payload"):
        if key in arrays:
            old = np.asarray(arrays[key], dtype=np.float64)
            extra = np.column_stack([np.full(len(old), float(model.learner.state.clock)), np.zeros(len(old))])
            arrays[key] = np.hstack([old[:, : k + 1], extra, old[:, k + 1 :]])
    return arrays


def _tuples(value):
    """JSON lists back to the tuples they were written from (sources are tuples or scalars)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _concat_rows(rows: list[FeatureRows], k: int) -> dict[str, np.ndarray]:
    if not rows:
        return {"ids": np.array([], dtype="U1"), "X": np.empty((0, k)), "ts": np.empty(0, dtype=np.int64)}
    ids = [i for r in rows for i in r.ids]
    return {
        "ids": np.array(ids, dtype=str),
        "X": np.concatenate([r.X for r in rows]),
        "ts": np.concatenate([r.ts for r in rows]).astype(np.int64),
    }
