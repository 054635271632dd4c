"""Forget on request (docs/design.md §13): rows taken back out of the model, exactly, with a receipt.

A request names ids. The processor finds each row where it is and takes it out of there (``Located``):

- not predicted yet (the micro-batcher, the warm-up hold): dropped; it never entered the model;
- only its label came (an early label): dropped;
- predicted and waiting for its label (the join buffer), or joined and waiting to be folded in (the label
  queue): taken out, and its Gram out of A (-F);
- folded in, or expired unlabelled with its Gram kept: from its record in the retention store
  (``stream.retention``): its Gram, and its label's terms if it was labelled.

Each row leaves every candidate's sums at the weight it has now (``EdRVFL.erase``), in one call per
request; its record is marked erased, the id memory remembers it as forgotten (a later row or label for it
is refused, ``forgotten_id``), the feature cache drops its batch. An id found nowhere is refused with its
reason: ``forget_already_forgotten``, ``forget_past_retention`` (learned, but its record is gone: past the
retention's rows or time), ``forget_unknown_id`` (never seen, or past both the retention and the id memory).

The proof. A completed removal waits for the snapshot that first holds the model without it: its receipt
(the id, where the row was, the model version after the removal, the request's source) is named by that
snapshot when it is written (``seal``), kept in it, and handed out once it is durable (``durable``); the
adapter then produces it and deletes the older snapshots, which hold the row. A restart from that
snapshot hands its receipts out again (``due``): at-least-once they may go twice, exactly-once the adapter
sends those whose request offset no committed transaction covers.

In a group (docs/design.md §13, "A group"), an id this member never saw, or holds only a copy of (a row handed
over at a rebalance while it waited for its label), is not refused or taken out here: the other members are
asked (``stream.forwarding``). What reading their answers decides comes back as a ``Decision``: rows taken out
here for the request (``forget`` with ``hold``), ids refused (``refuse_held``), copies dropped
(``drop_copies``); refusals so decided wait for a snapshot as receipts do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

from iolstream.core import gram_cholesky
from iolstream.stream import joinbuffer
from iolstream.stream import retention as store
from iolstream.stream.encoding import forget_message
from iolstream.stream.forwarding import Forwarding
from iolstream.stream.retention import RetentionStore
from iolstream.stream.rows import BadInput

# where a forgotten row was: not predicted yet; only its label had come; predicted, waiting for its label; joined
# with its label, not folded in yet; labelled (folded in); expired unlabelled, its Gram kept; expired, its Gram gone
STAGES = ("queued", "label_only", "waiting", "joined", "labelled", "observed", "left")


@dataclass
class Located:
    """What the processor took out of its own stores for a request's ids.

    queued : ids of rows not predicted yet (dropped: never in the model)
    early  : ids whose label came before the row (dropped)
    ids, payload : rows predicted and waiting for their label (the join buffer), then rows joined with it, not
             folded in yet (the label queue): ids and payloads (``stream.payload``); their Gram is in A under -F
    joined : how many of ``ids`` (the last ones) were joined
    """

    queued: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    payload: np.ndarray | None = None
    joined: int = 0

    def found(self) -> set[str]:
        return set(self.queued) | set(self.early) | set(self.ids)


class Erasure:
    """The processor's side of forget requests: the retention store, the receipts, the counters.

    model, layout : the processor's model and its payload layout (``stream.payload``)
    retention : the retention store (None: no rows kept beyond the join buffer: a labelled row is past it)

    Receipts and the refusals decided on the group's log (``refuse_held``) wait alike for the snapshot that
    first holds their decision: a refusal is a dict with ``refused`` (its reason) and ``detail``.
    """

    def __init__(self, model, layout, retention: RetentionStore | None):
        self.model, self.layout, self.retention = model, layout, retention
        self.forwarding = Forwarding()  # asks to the group (bound by group learning only)
        # group learning: copies of rows handed over while waiting for their labels, not labelled here (id ->
        # "gram": handed over by this member, its Gram in its sums; "bare": adopted, nothing in its sums)
        self.copies: dict[str, str] = {}
        self.waiting: list[dict] = []  # receipts of removals done, waiting for a snapshot without them
        self.sealed: list[dict] = []  # receipts named by the snapshot being written, until handed out
        self.counters = {
            "forget_requests": 0,  # request messages with at least one good id
            "ids_forgotten": 0,  # ids forgotten (each gets a receipt)
            "ids_refused": 0,  # ids of requests refused (dead letters forget_*)
            "rows_erased": 0,  # rows whose terms left the model
            "receipts_out": 0,  # receipts handed out (a snapshot without their rows durable)
        }

    def status(self) -> dict:
        """The counters, and in a group those of the forget requests passed on (``stream.forwarding``)."""
        if self.forwarding.member is None:
            return dict(self.counters)
        return {**self.counters, **self.forwarding.counters}

    # ------------------------------------------------------------ the stream's hooks
    def observed(self, ids: list[str], x: np.ndarray, stamp, now_ms: int, *, adopted: bool = False) -> None:
        """A batch predicted: its rows' records (``adopted``: rows another member handed over, group learning)."""
        if adopted:
            self.handed_over(ids, adopted=True)
        if self.retention is not None:
            self.retention.append(ids, x, stamp=stamp, at_ms=now_ms)

    def labelled(self, ids: list[str], y: np.ndarray, predicted=None) -> None:
        """Labels folded in (``EdRVFL.learn`` just took them): into their rows' records (class indices, or
        regression values), with the class weight each entered with (``EdRVFL.entered_weights``) and, with
        calibrated probabilities, each candidate's scores of the row (from ``predicted`` as ``learn`` took it)."""
        for row_id in ids:  # labelled here: this member's record holds the row whole
            self.copies.pop(row_id, None)
        if self.retention is None:
            return
        scores = None
        if self.retention.n_scores:  # (K, b, m) -> (b, K·m)
            scores = self.model.calibration_scores(predicted).transpose(1, 0, 2).reshape(len(ids), -1)
        y = np.asarray(y, dtype=np.float64).reshape(len(ids), -1)
        self.retention.label(ids, y, self.model.entered_weights, scores)

    def left(self, ids: list[str]) -> None:
        """Rows whose Gram left the model unlabelled (``stream.forget_expired``)."""
        if self.retention is not None:
            self.retention.left(ids)

    def held(self, ids: list[str]) -> np.ndarray:
        """(n,) int8: each id's status in the retention store (0: none), for the processor's screen of new rows."""
        if self.retention is None or not len(self.retention):
            return np.zeros(len(ids), dtype=np.int8)
        return self.retention.find(ids)[0]

    def holds(self, ids: list[str]) -> tuple[list[str], list[str]]:
        """This member's answer to another group member's ask (``stream.forwarding``): the ids of ``ids`` whose
        rows it holds whole (its retention store has their record, not a copy of a handed-over row), and those
        it holds as a handed-over copy whose Gram is in its sums."""
        status = self.held(ids)
        kept = [i for i, st in zip(ids, status.tolist()) if st in (store.OBSERVED, store.LABELLED)]
        labelled = {i for i, st in zip(ids, status.tolist()) if st == store.LABELLED}
        whole = [i for i in kept if i in labelled or i not in self.copies]
        return whole, [i for i in kept if i not in labelled and self.copies.get(i) == "gram"]

    def handed_over(self, ids: list[str], *, adopted: bool) -> None:
        """Group learning: rows waiting for their labels handed over at a rebalance (by this member, or
        ``adopted`` from another): until a label joins one here, this member holds a copy of it."""
        kind = "bare" if adopted else "gram"
        for row_id in ids:
            self.copies.setdefault(row_id, kind)
        while self.retention is not None and len(self.copies) > max(self.retention.rows, 1):
            del self.copies[next(iter(self.copies))]  # past the window: nothing of it can be taken out anyway

    def ask_for_copies(self, ids: list[str], source) -> list[str]:
        """A request in a group: the ids this member holds only a copy of are asked about (``stream.forwarding``)
        rather than taken out here; returns the others."""
        if not self.copies or self.forwarding.member is None:
            return ids
        status = self.held(ids)
        copies = {
            i: self.copies[i]
            for i, st in zip(ids, status.tolist())
            if i in self.copies and st == store.OBSERVED
        }
        if not copies or not self.forwarding.ask(list(copies), source, copies=copies):
            return ids
        return [i for i in ids if i not in copies]

    def drop_copies(self, ids: list[str]) -> None:
        """Copies of rows another member took out: their records marked erased; the sums do not change."""
        for row_id in ids:
            self.copies.pop(row_id, None)
        if self.retention is not None and ids:
            status, seqs = self.retention.find(ids)
            held = status > 0
            self.retention.erase([i for i, h in zip(ids, held.tolist()) if h], seqs[held])

    # ------------------------------------------------------------ a request
    def refusals(self, ids: list[str], counters: dict) -> list[tuple[int, BadInput]]:
        """(index, why) of each of arriving ``ids`` whose id the retention store holds, in order: refused as
        learned already (``duplicate_id``, past the id memory) or forgotten on request (``forgotten_id``), each
        counted in ``counters`` (the join buffer's). None without a retention store, or when it holds no id."""
        if self.retention is None or not self.retention.index.remembers_any(ids):
            return []
        held = self.held(ids)
        out = []
        for i in np.flatnonzero(held).tolist():
            row_id = ids[i]
            if held[i] == store.ERASED:
                bad = BadInput(
                    "forgotten_id", f"id {row_id!r} was forgotten on request: its rows are not learned"
                )
                counters["rows_forgotten_id"] += 1
            else:
                bad = BadInput(
                    "duplicate_id", f"id {row_id!r} was already learned (the retention store holds it)"
                )
                counters["rows_duplicate"] += 1
            out.append((i, bad))
        return out

    def forget(
        self,
        ids: list[str],
        located: Located,
        remembered: np.ndarray,
        source,
        now_ms: int,
        *,
        hold: bool = False,
    ):
        """Take the rows of ``ids`` out (module docstring). ``located``: what the processor took out of its
        stores; ``remembered``: the id memory's kinds of ``ids`` (``JoinBuffer.remembered``). Returns
        (ids forgotten, ids never seen, ids left in the model because the downdate failed, refusals
        [(BadInput, bytes)], each refused id's dead letter a one-id request). An id never seen is refused, and
        remembered as forgotten all the same: a request that overtook its row (the topics are aligned by time
        only over what is already in the broker) still keeps the row out. In a group, ids never seen
        are asked about instead (``stream.forwarding``): they are returned as never seen, and not refused here.
        ``hold``: the request was decided on the group's log (an answer read back): its refusals wait for a
        snapshot as its receipts do (``refuse_held``) rather than being returned."""
        self.counters["forget_requests"] += not hold  # (a request passed on counts where it came in)
        found = located.found()
        status, seqs = self._find(ids)
        where = dict(zip(ids, zip(status.tolist(), seqs.tolist())))
        stage = dict.fromkeys(located.early, "label_only")
        stage.update(dict.fromkeys(located.queued, "queued"))  # a queued row's early label went with it
        waiting = len(located.ids) - located.joined
        stage.update(dict.fromkeys(located.ids[:waiting], "waiting"))
        stage.update(dict.fromkeys(located.ids[waiting:], "joined"))
        refused, records, kept_ids, blocked, unknown = [], [], [], [], []
        for row_id, kind in zip(ids, remembered.tolist()):
            if row_id in found:
                continue
            st, seq = where[row_id]
            why = None
            if st == store.ERASED or (kind == joinbuffer.FORGOTTEN and st == 0):
                why = BadInput("forget_already_forgotten", f"id {row_id!r} was forgotten before")
            elif st in (store.OBSERVED, store.LABELLED):
                record = self.retention.read(np.array([seq]))
                if (
                    record["seq"][0] != seq or self.retention.past_time(record, now_ms)[0]
                ):  # gone with its age
                    why = BadInput(
                        "forget_past_retention",
                        f"id {row_id!r} was learned over retention.ms ({self.retention.ms}) ago: its record is gone",
                    )
                else:
                    records.append(record)
                    kept_ids.append(row_id)
                    stage[row_id] = "labelled" if st == store.LABELLED else "observed"
            elif st == store.LEFT:
                stage[row_id] = "left"  # its Gram left already; its data went then
            elif kind in (joinbuffer.LABELLED, joinbuffer.EXPIRED):
                why = BadInput(
                    "forget_past_retention",
                    f"id {row_id!r} was learned, but its record is past the retention "
                    f"({'none kept' if self.retention is None else f'the last {self.retention.rows} rows'})",
                )
            else:  # remembered as forgotten all the same: its row, should it come later, is refused
                blocked.append(row_id)
                unknown.append(row_id)
                continue
            if why is not None:
                refused.append((why, forget_message(row_id)))
        asked = not hold and self.forwarding.ask(unknown, source)  # in a group: the other members are asked
        if unknown and not asked:  # nobody to ask: refused now
            refused += [(_unknown(row_id), forget_message(row_id)) for row_id in unknown]
        failed = self._erase(located, kept_ids, records)
        if failed:
            for row_id in failed:
                stage.pop(row_id, None)
            refused += [
                (
                    BadInput(
                        "forget_failed",
                        f"id {row_id!r}: taking it out would leave the model not positive definite "
                        "(round-off); it stays learned",
                    ),
                    forget_message(row_id),
                )
                for row_id in failed
            ]
        done = [row_id for row_id in ids if row_id in stage]
        for row_id in done:
            self.copies.pop(row_id, None)
        if self.retention is not None and done:
            st_done, seq_done = self._find(done)
            marked = st_done > 0
            self.retention.erase([i for i, m in zip(done, marked.tolist()) if m], seq_done[marked])
        version = self.model.version
        for row_id in done:
            self.waiting.append(
                {
                    "id": row_id,
                    "stage": stage[row_id],
                    "model_version": version,
                    "request": _jsonable(source),
                    "forgotten_ms": now_ms,
                }
            )
        self.counters["ids_forgotten"] += len(done)
        if hold:
            for bad, raw in refused:  # each a one-id request (``forget_message``)
                self._hold_refusal(orjson.loads(raw)["id"], bad, source, now_ms)
            return done, blocked, failed, []
        self.counters["ids_refused"] += len(refused)
        return done, blocked, failed, refused

    def decided(self, decision, now_ms: int) -> None:
        """The rest of what reading the group's log decided here (``stream.forwarding.Decision``; the processor
        took the rows to remove and the copies to drop out of its buffers): ids this member asked about and
        nobody holds refused, the records of its copies another member took out marked erased. Rows taken out
        here for another member's request and refusals both wait for a snapshot holding the decision."""
        self.refuse_held(decision.refuse, decision.source, now_ms)
        self.drop_copies(decision.drop)

    def refuse_held(self, ids: list[str], source, now_ms: int) -> None:
        """Ids this member asked the group about and nobody holds (``stream.forwarding``): refused
        ``forget_unknown_id``, the refusal held until a snapshot holding the decision is durable (the decision
        was taken on reading the group's log, which a restart from an older snapshot reads again)."""
        for row_id in ids:
            self._hold_refusal(row_id, _unknown(row_id, group=True), tuple(source), now_ms)

    def _hold_refusal(self, row_id: str, bad: BadInput, source, now_ms: int) -> None:
        self.waiting.append(
            {
                "id": row_id,
                "refused": bad.reason,
                "detail": bad.detail,
                "request": _jsonable(source),
                "refused_ms": now_ms,
            }
        )
        self.counters["ids_refused"] += 1

    def _find(self, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.retention is None:
            return np.zeros(len(ids), dtype=np.int8), np.full(len(ids), -1, dtype=np.int64)
        return self.retention.find(ids)

    def _erase(self, located: Located, kept_ids: list[str], records: list[np.ndarray]) -> list[str]:
        """Every row with terms in the model out of it, in one ``EdRVFL.erase``; returns the ids left in it
        because the downdate failed (none, but for round-off beyond λ)."""
        layout, model = self.layout, self.model
        xs, stamps, labelled, targets, weights, scores = [], [], [], [], [], []
        n_scores = 0 if self.retention is None else self.retention.n_scores
        if located.ids:  # not labelled yet: their Gram at 1, no calibration
            n = len(located.ids)
            xs.append(layout.x(located.payload))
            stamps.append(layout.stamp(located.payload))
            labelled.append(np.zeros(n, dtype=bool))
            targets.append(np.zeros((n, model.config.m)))
            weights.append(np.ones(n))
            scores.append(np.full((n, n_scores), np.nan))
        if records:
            rec = np.concatenate(records)
            xs.append(rec["x"])
            stamps.append(rec["stamp"])
            is_labelled = rec["status"] == store.LABELLED
            labelled.append(is_labelled)
            targets.append(self._targets(rec["y"], is_labelled))
            weights.append(np.where(is_labelled, rec["weight"], 1.0))
            scores.append(rec["scores"] if n_scores else np.full((len(rec), 0), np.nan))
        ids = located.ids + kept_ids
        if not ids:
            return []
        x = np.concatenate(xs)
        b = len(x)
        given = None  # (K, b, m): each candidate's scores of the labelled rows, for their calibration sums
        if n_scores:
            given = np.concatenate(scores).reshape(b, -1, model.config.m).transpose(1, 0, 2)
        try:
            model.erase(
                model.features(x),
                np.concatenate(targets),
                np.concatenate(labelled),
                np.concatenate(stamps),
                weights=np.concatenate(weights),
                scores=given,
            )
        except gram_cholesky.NotPositiveDefinite:
            return ids
        self.counters["rows_erased"] += len(ids)
        return []

    def _targets(self, y: np.ndarray, labelled: np.ndarray) -> np.ndarray:
        """(b, m) targets as ``EdRVFL.learn`` takes them from the records' labels (unlabelled rows: zeros)."""
        mc = self.model.config
        if mc.task == "classification":
            out = np.zeros((len(y), mc.m))
            rows = np.flatnonzero(labelled)
            out[rows, y[rows, 0].astype(np.int64)] = 1.0
            return out
        return np.where(labelled[:, None], y, 0.0)

    # ------------------------------------------------------------ receipts and snapshots
    def seal(self, snapshot: str) -> None:
        """The snapshot ``snapshot`` is about to be written: it holds the model without every row removed so far,
        so it names their receipts."""
        for receipt in self.waiting:
            receipt["snapshot"] = snapshot
        self.sealed += self.waiting
        self.waiting = []

    def flush(self) -> None:
        """The retention store onto the disk (before a snapshot that covers it is written)."""
        if self.retention is not None:
            self.retention.flush()

    def durable(self, snapshot: str, state: dict, now_ms: int | None = None) -> list[dict]:
        """The snapshot ``snapshot``, holding ``state`` (``to_state``), is durable: the records it names erased
        are zeroed; returns the receipts to send (the caller produces them, then calls ``sent``)."""
        if self.retention is not None and "retention" in state:
            self.retention.durable(state["retention"], now_ms)
        return list(self.sealed)  # this snapshot's, and any an earlier one named and are not out yet

    def sent(self, receipts: list[dict], *, here: bool = True) -> None:
        """``receipts`` were produced: no longer held. ``here``: by this process (counted); not: by the one
        before a restart, after the snapshot it left (they went out then, and count there)."""
        gone = {id(r) for r in receipts}
        self.sealed = [r for r in self.sealed if id(r) not in gone]
        if here:  # refusals are dead letters, not receipts
            self.counters["receipts_out"] += sum("refused" not in r for r in receipts)

    def due(self) -> list[dict]:
        """Receipts a restart from a snapshot hands out again (the ones it was the first to hold)."""
        return list(self.sealed)

    def to_state(self) -> dict:
        """The manifest's ``erasure``: receipts waiting and sealed, the retention store's tail and erased rows."""
        state = {"waiting": self.waiting, "sealed": self.sealed, "counters": dict(self.counters)}
        if self.forwarding.member is not None:
            state["forwarding"] = self.forwarding.to_state()
            state["copies"] = dict(self.copies)
        if self.retention is not None:
            state["retention"] = self.retention.to_state()
        return state

    def load_state(self, state: dict | None) -> None:
        """Back from ``to_state`` (None: a fresh model; the retention store empties)."""
        if state is not None:
            self.waiting = [dict(r) for r in state.get("waiting", [])]
            self.sealed = [dict(r) for r in state.get("sealed", [])]
            self.counters.update(state.get("counters", {}))
        self.forwarding.load_state(None if state is None else state.get("forwarding"))
        self.copies = {} if state is None else {str(k): str(v) for k, v in state.get("copies", {}).items()}
        if self.retention is not None:
            self.retention.load(None if state is None else state.get("retention"))


def _unknown(row_id: str, *, group: bool = False) -> BadInput:
    where = "in the group: no member's retention store holds it" if group else "here (or is past retention)"
    return BadInput(
        "forget_unknown_id",
        f"id {row_id!r} was never seen {where}: nothing to take out; a row with this id coming later is refused",
    )


def _jsonable(source):
    """A request's source as JSON can hold it: [topic, partition, offset] (the message key an adapter may add
    is the id, which the receipt names already)."""
    if isinstance(source, tuple):
        return [_jsonable(v) for v in source[:3]]
    return source
