"""The worker's pure stream logic: micro-batch, forward step, predict, join labels, fold in.

No Kafka here: messages come in as bytes with an opaque, JSON-able ``source`` (the
adapter's topic/partition/offset, passed back untouched on dead letters). ``feed`` takes one
message and returns what to emit (its dead letters, and the predictions of a batch it filled);
``step`` runs what is due by the clock. The whole state (model, batcher, join buffer, queues,
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
- While the warm-up scaler is not frozen, batches are held (``stream.scaler_warmup``); once it
  freezes they are predicted in order, each after the labels of the ones before.
- A feature row whose id is pending, done, or already waiting in the batcher or the
  warm-up hold is a ``duplicate_id`` at arrival: it never enters A.
- The features D of a label batch are recomputed from the stored rows, except when the batch is
  exactly one observed batch in order (``stream.feature_cache``): the same bits either way.
- A pending row waits with its payload (``stream.payload``): with forgetting, its label enters and
  an expired row's Gram leaves at the weight its Gram has in A (its stamp), so β stays the
  closed-form weighted ridge for any label delay and order; with ``auto`` each candidate is judged
  on the prediction it made.
- A forget request (``on_forget``, docs/design.md §13) takes each row out of wherever it waits and out of the
  model (``stream.erasure``); its id is remembered as forgotten, so a later row or label for it is refused.
  With a retention store, every predicted row is recorded there and its label when folded in.
- A dead letter of a one-row message carries the message's raw bytes; one row of a
  batch message carries that row re-encoded (codec). An early label given up on
  (``unknown_id``) carries the source of the message that brought it.

    >>> import numpy as np
    >>> from iolstream.stream.config import StreamConfig
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

import functools
import time

import numpy as np

from iolstream.core import state_io
from iolstream.core.model import EdRVFL
from iolstream.stream import codec, encoding, processor_state
from iolstream.stream.batcher import MicroBatcher
from iolstream.stream.config import EventsConfig, StreamConfig
from iolstream.stream.erasure import Erasure, Located
from iolstream.stream.events import EventCodec
from iolstream.stream.feature_cache import FeatureCache
from iolstream.stream.joinbuffer import EXPIRED, FORGOTTEN, JoinBuffer
from iolstream.stream.label_queue import LabelQueue
from iolstream.stream.outputs import DeadLetter, StepOutput
from iolstream.stream.payload import PAYLOAD, PayloadLayout
from iolstream.stream.prequential import PrequentialMetric
from iolstream.stream.retention import RetentionStore
from iolstream.stream.rows import FeatureRows, LabelRows, TargetSpec
from iolstream.stream.scaler_warmup import ScalingAgreement, WarmUpHold, warn_if_linear
from iolstream.stream.screen import screen

# the step's outputs and the payload's fields, re-exported for the adapter
__all__ = ["PAYLOAD", "DeadLetter", "ScalingAgreement", "StepOutput", "StreamProcessor"]

# A handed-over row's batch: 0 is never a batch of this processor (they count from 1), so the features of
# such rows are recomputed from x, never taken from the cache of a batch of the same number.
HANDED_OVER_BATCH = 0


class StreamProcessor:
    """Pure stream logic around one EdRVFL model (docs/design.md §5)."""

    def __init__(
        self,
        model: EdRVFL,
        cfg: StreamConfig,
        *,
        window_rows: int = 1000,
        agreement: ScalingAgreement | None = None,
        events: EventsConfig | None = None,
        retention: RetentionStore | None = None,
    ):
        self.model = model
        self.cfg = cfg
        mc = model.config
        self.target = TargetSpec(mc.task, mc.classes, mc.m)
        # named-field events (a model with a feature schema, docs/design.md §11), or None: array messages
        self.event_shape = events or EventsConfig()
        if mc.features is None and not self.event_shape.is_default:
            raise ValueError("events: named-field events need model.features (without it, rows are arrays)")
        self.events = (
            None
            if mc.features is None
            else EventCodec(mc.schema, self.event_shape, self.target, max_bytes=cfg.max_message_bytes)
        )
        # what decodes the input: the named-field events, or the arrays (both: features / labels (value, key))
        self.decoder = self.events or codec.ArrayCodec(
            mc.n_inputs, self.target, max_bytes=cfg.max_message_bytes
        )
        self.n_features = mc.n_inputs
        self.n_candidates = len(model.learners)
        self.layout = PayloadLayout(mc.n_inputs, self.n_candidates, mc.n_layers, mc.m)  # pending rows' fields
        self.batcher = MicroBatcher(cfg.batch_rows, cfg.max_batch_latency_ms)
        # a refused label is written in the team's shape when the labels are named-field events
        as_event = (
            None
            if self.events is None
            else functools.partial(encoding.event_label_message, target=self.target, events=self.event_shape)
        )
        self.join = JoinBuffer(
            **cfg.join_settings(self.target, self.layout.width), label_dead_letter=as_event
        )
        self.held = WarmUpHold(mc.n_inputs)  # batches waiting for the warm-up scaler
        # group learning: gets the warm-up rows (and the model its target scaling); the group freezes them
        self.agreement = agreement
        if agreement is not None:
            model.targets.propose = agreement.propose_targets
        self._queued_ids: set[str] = set()  # ids in the batcher or held: not yet in the join buffer
        # queued ids the join buffer may know since they were screened (adopted rows, group learning): looked up
        # again as their batch enters it; every other queued id is taken as screened (``JoinBuffer.add_rows``)
        self._rescreen: set[str] = set()
        self.label_queue = LabelQueue(cfg.label_batch_rows, cfg.max_label_latency_ms)  # joined, to fold in
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
            "messages_forget": 0,
            "values_clipped": 0,  # input values beyond the scaling's ±Z_LIMIT deviations (core.scaling)
        }
        self.dead_letters: dict[str, int] = {reason: 0 for reason in codec.REASONS}
        self.metric = PrequentialMetric(mc.task, window_rows, mc.m)
        self.last_losses = np.zeros(mc.n_layers)
        self.last_label_rows = 0
        self.feature_cache = FeatureCache()  # recent batches' features, for labels folded batch by batch
        self.erasure = Erasure(model, self.layout, retention)  # forget requests, the rows kept for them
        # dead letters of adopted labels (group learning), emitted with the next step's
        self._adoption_dead: list[DeadLetter] = []

    # ------------------------------------------------------------ input
    def feed(
        self, value: bytes | None, source, now_ms: int, labels: bool = False, accepted=None, key=None
    ) -> StepOutput | None:
        """One message in (features, or ``labels``): decoded, batched or joined. Returns what to emit: its
        dead letters, and the predictions of the batch it filled; None when there is nothing. A full batch is
        predicted at once, before the labels that follow it come, so that (aligned) each label message folds
        in its batch alone. ``accepted()``: called once the message is taken in, before a batch it filled is
        predicted (the adapter notes when its rows arrived). ``key``: the message key (named-field events
        may take their id from it; a dead letter keeps what the adapter put in its ``source``)."""
        if labels:
            dead = self.on_labels(value, source, now_ms, key)
        else:
            dead = self.on_features(value, source, now_ms, key)
        if accepted is not None:
            accepted()
        if len(self.batcher) < self.cfg.batch_rows:
            return StepOutput(dead_letters=dead) if dead else None
        out = self.step(now_ms)
        out.dead_letters[:0] = dead
        return out

    def _dead(self, rejected, source, raw: bytes | None = None) -> list[DeadLetter]:
        """Count and wrap rejections; ``raw``: the message's bytes, used when it held this one row only."""
        out = []
        for bad, value in rejected:
            self.dead_letters[bad.reason] = self.dead_letters.get(bad.reason, 0) + 1
            out.append(DeadLetter(raw if raw is not None else value, bad, source))
        return out

    def on_features(self, value: bytes | None, source, now_ms: int, key=None) -> list[DeadLetter]:
        """A features message in one pass: decoded (the codec), screened once (``stream.screen``: an id
        already pending, done, waiting in the batcher or kept by the retention store never enters A), then into
        the batcher; what either refuses comes back as dead letters, the decoder's first."""
        self.counters["messages_features"] += 1
        rows, rejected = self.decoder.features(value, key)
        dead = self._dead(rejected, source)
        if rows is None or not len(rows.ids):
            return dead
        single = len(rows.ids) == 1 and not rejected
        screened = screen(rows, self.join, self._queued_ids, self.erasure, raw=value if single else None)
        if screened.index:
            if self.events is not None:  # counted when decoded: a duplicate is no event of the stream
                self.events.uncount([rows.events[i] for i in screened.index])
            dead += self._dead(screened.refused, source)
        rows = screened.rows
        if rows is not None:
            self.counters["rows_in"] += len(rows.ids)
            self._queued_ids.update(rows.ids)
            self.batcher.add(rows, now_ms)
        return dead

    def on_forget(self, value: bytes | None, source, now_ms: int, key=None) -> list[DeadLetter]:
        """A forget request (docs/design.md §13): each id's row taken out of wherever it is and out of the model
        (``stream.erasure``); its receipt waits for a snapshot without it. Ids that cannot be forgotten come back
        as dead letters with their reason. The ids are where the features' are (``events.id_field``, or the
        message ``key`` with ``events.id_from_key``)."""
        self.counters["messages_forget"] += 1
        ids, rejected = self.decoder.forget(value, key)
        dead = self._dead(rejected, source)
        ids = self.erasure.forwarding.not_asked(ids, source)  # (group: a request read again)
        if not ids:
            return dead
        refused = self._forget(self.erasure.ask_for_copies(ids, source), source, now_ms)
        single = len(ids) == 1 and not rejected
        return dead + self._dead(refused, source, raw=value if single else None)

    def _forget(self, ids: list[str], source, now_ms: int, *, hold: bool = False) -> list:
        """The rows of ``ids`` out (``Erasure.forget``); returns the refusals (none with ``hold``: held)."""
        done, blocked, failed, refused = self.erasure.forget(
            ids, self._take_out(ids), self.join.remembered(ids), source, now_ms, hold=hold
        )
        self.join.remember(done + blocked, FORGOTTEN)  # never seen: kept out should its row come after all
        self.join.remember(failed, EXPIRED)  # out of the buffer, their Gram still in A: as expired rows
        return refused

    def forward_decided(self, decision, now_ms: int) -> None:
        """What reading the group's log decided here (``stream.forwarding.Decision``; ``Erasure.decided``)."""
        if decision.remove:
            self._forget(decision.remove, tuple(decision.source), now_ms, hold=True)
        self._take_out(decision.drop)  # copies of handed-over rows another member took out: sums unchanged
        self.join.remember(decision.drop, FORGOTTEN)
        self.erasure.decided(decision, now_ms)

    def _take_out(self, ids: list[str]) -> Located:
        """The rows of ``ids`` out of the processor's own stores: not predicted yet (batcher, warm-up hold),
        early labels, waiting for their label (join buffer) or for their fold-in (label queue)."""
        queued = self.batcher.drop(ids) + self.held.drop(ids)
        self._queued_ids.difference_update(queued)
        self._rescreen.difference_update(queued)
        early = self.join.drop_early(ids)
        pending = self.join.take_rows(ids)
        joined_ids, joined, _, joined_seqs = self.label_queue.take_ids(ids)
        self.feature_cache.drop_batches(np.concatenate([pending.batch_seq, joined_seqs]))
        payload = (
            pending.X if not joined_ids else np.concatenate([pending.X.reshape(-1, joined.shape[1]), joined])
        )
        return Located(queued, early, pending.ids + joined_ids, payload, len(joined_ids))

    def on_labels(self, value: bytes | None, source, now_ms: int, key=None) -> list[DeadLetter]:
        """Decode a labels message and join what can be joined; the rest waits or is rejected."""
        self.counters["messages_labels"] += 1
        labels, rejected = self.decoder.labels(value, key)
        dead = self._dead(rejected, source)
        if labels is None or not len(labels.ids):
            return dead
        self.counters["labels_in"] += len(labels.ids)
        result = self.join.add_labels(
            labels, now_ms, waiting=self._queued_ids, source=source
        )  # held early: kept with its source
        self._queue_joined(result, now_ms)
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
        waits.append(self.label_queue.due_in(now_ms))
        waits = [w for w in waits if w is not None]
        return min(waits) if waits else None

    def step(self, now_ms: int, *, force: bool = False) -> StepOutput:
        """Run whatever is due; ``force`` flushes partial batches and queued labels (shutdown,
        snapshot, end of a transaction) — but never freezes a warm-up scaler early."""
        out = StepOutput()
        if self._adoption_dead:
            out.dead_letters, self._adoption_dead = self._adoption_dead, []
        t0 = time.perf_counter()
        if self.held and self.model.ready:  # frozen from outside (group learning): the held batches go first
            self._release_held(now_ms, out)
        self._fold_if_due(
            now_ms, out, force=False
        )  # labels that came since the last batch, before the next one
        while len(self.batcher) and (force or self.batcher.due(now_ms)):
            rows = self.batcher.take()
            if not self.model.ready:
                self.held.add(rows)
                self.held.warm_up(self.model.scaler, self.agreement)
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
        the batch queued last begin if the queue spans several batches (``stream.label_queue``)."""
        while (everything := self.label_queue.due(now_ms, force=force)) is not None:
            out.rows_learned += self._fold_labels(everything)

    def _release_held(self, now_ms: int, out: StepOutput) -> None:
        """Predict the held batches in order. Their labels that came meanwhile (early) join as each
        batch enters the buffer and are folded in before the next one: the held batches spanned the
        whole warm-up, far beyond the label latency."""
        held = self.held.take()
        warn_if_linear(self.model, held)  # said once: the warm-up ends here
        for rows in held:
            self._predict_batch(rows, now_ms, out)
            self._fold_if_due(now_ms, out, force=True)

    def _predict_batch(self, rows: FeatureRows, now_ms: int, out: StepOutput) -> None:
        self._queued_ids.difference_update(rows.ids)  # on_features screened every id (pending, done, queued)
        self.batch_seq += 1
        pred = self.model.observe(rows.X)  # -F: Gram in before the prediction (Algorithm 2); -R: β in force
        self.counters["batches"] += 1
        self.counters["values_clipped"] += self.model.scaler.beyond(rows.X)
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
            scores=pred.scores if self.cfg.emit_scores and pred.proba is not None else None,
            interval=pred.interval,
            id_key=self.event_shape.id_field,
            extra=None if self.events is None else self.events.passthrough(rows.events),
        )
        out.event_ts = rows.ts if out.event_ts is None else np.concatenate([out.event_ts, rows.ts])
        self.counters["predictions_out"] += b
        mc = self.model.config
        outputs = np.asarray(pred.predicted).reshape(self.n_candidates, mc.n_layers, b, mc.m)  # (K, L, b, m)
        rows_payload = self.layout.build(
            rows.X,
            stamp=pred.clock,
            candidate=self.model.selector.chosen,
            outputs=outputs,
            emitted=pred.proba if pred.proba is not None else pred.value,
        )
        self.feature_cache.put(
            self.batch_seq, pred.features_t, pred.index if pred.index is not None else pred.value
        )
        self.erasure.observed(list(rows.ids), rows.X, pred.clock, now_ms)
        screened = not self._rescreen or self._rescreen.isdisjoint(rows.ids)
        if not screened:
            self._rescreen.difference_update(rows.ids)
        result = self.join.add_rows(list(rows.ids), rows_payload, self.batch_seq, now_ms, screened=screened)
        self._queue_joined(result, now_ms)
        out.dead_letters += self._dead(result.rejected, None)
        self._settle_unlabelled(result.evicted)

    # ------------------------------------------------------------ handover (group learning)
    def waiting_rows(self) -> tuple[list[str], np.ndarray]:
        """(ids, payloads (r, w)) of the rows waiting for their labels (``stream.payload``): a member hands
        them over when its partitions go, for whichever member gets their labels."""
        state = self.join.to_state()
        return [str(i) for i in state["pending_ids"].tolist()], np.asarray(
            state["pending_X"], dtype=np.float64
        )

    def adopt_rows(self, ids: list[str], rows_payload: np.ndarray, now_ms: int) -> int:
        """Take another member's waiting rows (labels already waiting for them join now), so a label joins
        wherever it lands and is folded in once. Rows whose id is pending or done here are left out. Returns
        how many were added. Rows no label reaches here expire (their Gram stays, as for any unlabelled
        row)."""
        if not ids:
            return 0
        if rows_payload.shape != (len(ids), self.layout.width):
            raise ValueError(
                f"handed-over rows: payload shape {rows_payload.shape}, "
                f"expected ({len(ids)}, {self.layout.width})"
            )
        screened = self.join.unseen(ids)
        if not screened:
            return 0
        keep = np.array(screened, dtype=np.int64)
        adopted = [ids[i] for i in screened]
        self._rescreen.update(self._queued_ids.intersection(adopted))  # now pending: their batch looks again
        result = self.join.add_rows(
            adopted, np.ascontiguousarray(rows_payload[keep]), HANDED_OVER_BATCH, now_ms
        )
        x = self.layout.x(rows_payload[keep])
        self.erasure.observed(adopted, x, self.layout.stamp(rows_payload[keep]), now_ms, adopted=True)
        self._queue_joined(result, now_ms)
        return len(screened)

    def hand_over_labels(self, which) -> tuple[list[str], np.ndarray, list]:
        """(ids, labels, sources) of the labels held early whose source ``which`` accepts, taken out: their
        partition goes to another member (group learning), which will see their rows, and adopts them there
        (``adopt_labels``). Labels as the join buffer keeps them: class indices (n,) or targets (n, m)."""
        return self.join.hand_over_early(which)

    def adopt_labels(self, ids: list[str], labels: np.ndarray, sources: list, now_ms: int) -> int:
        """Take labels another member held early for rows of a partition this member now holds: each joins its
        row if it waits here, else is held early with its ``source`` (a duplicate counts as one, as from the
        topic). What they give to dead letters (a row that expired here unlabelled) goes out with the next
        ``step``. Returns how many joined now."""
        if len(ids) != len(labels) or len(ids) != len(sources):
            raise ValueError(
                f"handed-over labels: {len(ids)} ids, {len(labels)} labels, {len(sources)} sources"
            )
        joined, start = 0, 0
        while start < len(ids):  # one call per source: a batch label message hands over together
            end = start + 1
            while end < len(ids) and sources[end] == sources[start]:
                end += 1
            rows = LabelRows(list(ids[start:end]), labels[start:end])
            result = self.join.add_labels(rows, now_ms, waiting=self._queued_ids, source=sources[start])
            self._queue_joined(result, now_ms)
            joined += len(result.ids)
            self._adoption_dead += self._dead(
                [(bad, raw) for bad, raw in result.rejected if bad.reason != "unknown_id"], sources[start]
            )
            if result.orphan_sources:
                self._adoption_dead += self._orphans(result.rejected, result.orphan_sources)
            start = end
        return joined

    def _queue_joined(self, result, now_ms: int) -> None:
        """Rows joined with their labels wait in the label queue until they are folded in."""
        self.label_queue.add(result.X, result.Y, result.batch_seq, now_ms, result.ids)

    def _fold_labels(self, everything: bool = True) -> int:
        """Learn queued joined rows in one batch: c += DᵀY (-F, the Gram is in A already) or Gram
        and c together (-R): all of them, or (``everything`` False) up to the trailing rows of the
        batch queued last (``LabelQueue.take``)."""
        rows, y, seqs, ids = self.label_queue.take(everything)
        mc, layout = self.model.config, self.layout
        b = len(y)
        targets = (
            self.model.one_hot(y) if mc.task == "classification" else np.asarray(y, float).reshape(b, mc.m)
        )
        outputs = layout.outputs(rows)  # (K, L, b, m)
        stamps = layout.stamp(rows)
        features_t, cached = self._features_for(layout.x(rows), seqs, layout.position(rows))
        predicted = outputs[0] if self.n_candidates == 1 else outputs
        self.last_losses = self.model.learn(features_t, targets, predicted=predicted, observed_at=stamps)
        self.erasure.labelled(
            ids, y, predicted
        )  # the retention store keeps the label as it came, and its weight
        self.counters["rows_learned"] += b
        self.last_label_rows = b
        self.counters["label_batches"] += 1
        emitted = layout.emitted(rows)  # what was sent for these rows: probabilities, or values
        if mc.task == "classification":
            # the classes emitted: the cached batch's (``decide`` gave them from the same bits), else decided again
            # from each row's outputs of the candidate in force when it was predicted
            index = cached
            if index is None:
                chosen = layout.candidate(rows)
                emitted_outputs = (
                    outputs[0]
                    if self.n_candidates == 1
                    else outputs[chosen, :, np.arange(b), :].transpose(1, 0, 2)
                )
                index = self.model.decide(emitted, emitted_outputs)
            self.metric.update_classes(
                y, index, emitted if self.model.config.ensemble_rule == "softmax" else None
            )
        else:
            self.metric.update_values(emitted, targets)
        return b

    def _features_for(self, x: np.ndarray, seqs: np.ndarray, positions: np.ndarray):
        """(D_lᵀ of joined rows, their emitted predictions or None): the cached D and predictions of
        their batch when they are that whole batch in order, else D recomputed from x and None.
        (``stream.feature_cache``)."""
        entry = self.feature_cache.whole_batch(seqs, positions)
        return entry if entry is not None else (self.model.features(x), None)

    def _expire(self, now_ms: int, out: StepOutput) -> None:
        result = self.join.expire(now_ms, self.batch_seq)
        self._settle_unlabelled(result)
        out.dead_letters += self._orphans(result.rejected, result.orphan_sources)

    def _settle_unlabelled(self, result) -> None:
        """Rows that left the buffer without a label: their Gram stays in A unless forget_expired."""
        if len(result.ids):
            self.feature_cache.drop_batches(result.batch_seq)
            if self.cfg.forget_expired and self.model.config.mode != "ridge":
                # Gram out again, of every candidate, at the weight it has now
                x, stamps = self.layout.x(result.X), self.layout.stamp(result.X)
                self.model.forget(self.model.features(x), observed_at=stamps)
                self.counters["rows_forgotten"] += len(result.ids)
                self.erasure.left(result.ids)

    # ------------------------------------------------------------ status
    @property
    def pending_rows(self) -> int:
        """Rows predicted and waiting for their labels (the join buffer)."""
        return len(self.join)

    @property
    def held_rows(self) -> int:
        """Rows waiting for the warm-up scaler (not predicted yet)."""
        return self.held.rows

    @property
    def queued_rows(self) -> int:
        """Rows accepted and not predicted yet: in the batcher or the warm-up hold, oldest first."""
        return len(self.batcher) + self.held.rows

    @property
    def unlearned(self) -> int:
        """Rows and labels taken in that the model has not learned yet: rows in the batcher or the warm-up
        hold, joined rows waiting to be folded in, labels held for the target scaling. Zero: every change
        this input makes is in the model."""
        held_targets = sum(len(h[1]) for h in self.model.targets.held)
        return self.queued_rows + self.label_queue.rows + held_targets

    @property
    def immediate_loss(self) -> float:
        """docs/design.md §3 L_t of the last label batch, mean over layers (NaN before the first)."""
        if len(self.last_losses) and self.last_label_rows:
            return float(self.last_losses.mean())
        return float("nan")

    def status(self) -> dict:
        """The counters and the state's sizes, for the status line and the metrics (a copy)."""
        c = dict(self.counters)
        c.update({f"join_{k}": v for k, v in self.join.counters.items()})
        c["pending"] = self.pending_rows
        c["held"] = self.held_rows
        # the warm-up scaler: rows it has (batched or held, none predicted) of the rows it waits for; 0 of 0 without one
        scaler = self.model.scaler
        c["warmup_target"] = 0 if scaler.mode != "warmup" else scaler.warmup_rows
        c["warmup_rows"] = c["warmup_target"] if scaler.frozen else min(self.queued_rows, c["warmup_target"])
        c["early_labels"] = self.join.n_early
        c["dead_letters"] = sum(self.dead_letters.values())
        c["metric"] = self.metric.value
        c["metric_window"] = self.metric.window_value
        c["metrics"] = self.metric.values()
        c["metrics_window"] = self.metric.values(sliding=True)
        c["model_version"] = self.model.version
        c.update(self.erasure.status())
        if (
            self.events is not None
        ):  # named fields: per field, events with it missing / with an undeclared value
            c["fields"] = self.events.counts()
        return c

    # ------------------------------------------------------------- state
    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(manifest, arrays) of everything consumed so far (``stream.processor_state``)."""
        return processor_state.to_state(self)

    @classmethod
    def from_state(
        cls,
        manifest: dict,
        arrays: dict,
        cfg: StreamConfig,
        *,
        window_rows: int = 1000,
        agreement: ScalingAgreement | None = None,
        events: EventsConfig | None = None,
        retention: RetentionStore | None = None,
    ) -> StreamProcessor:
        """A processor resuming from ``to_state``'s (manifest, arrays); ``retention``: its retention store, read
        back to the state's tail (``RetentionStore.load``)."""
        proc = cls(
            state_io.model_from_arrays(manifest, arrays),
            cfg,
            window_rows=window_rows,
            agreement=agreement,
            events=events,
            retention=retention,
        )
        processor_state.load_state(proc, manifest, arrays)
        return proc
