"""The bounded label-join buffer (docs/design.md §5). Pure logic, explicit state.

``JoinBuffer`` holds feature rows that were observed (their Gram already in A,
docs/design.md §2 -F) and wait for a label, and labels that came before their row
("early" labels). Every label ends in exactly one place, each counted:

- joined with its row, once (``labels_joined``; ``labels_early_joined`` of those were held early);
- a duplicate of a label already joined or already held early (``labels_duplicate``;
  the first label is the one applied, later ones are counted, not dead-lettered);
- rejected ``expired_id`` — its row expired or was evicted (``labels_expired_id``);
- rejected ``unknown_id`` — held early past ``early_label_ttl_ms`` or pushed out of
  the full early buffer, oldest first, without its row coming (``labels_orphan``);
- still held early (``n_early``);
- handed over with its partition to the member that takes it (group learning, ``hand_over_early``:
  ``labels_handed_over``).

Rows leave the buffer by joining, by expiry (``expire``: age > ttl, in ms and/or
in batches) or by eviction (a full buffer drops its oldest rows; returned in
``JoinResult.evicted`` by the ``add_rows`` call that overflowed it). Expired and
evicted rows are returned with their data — the model keeps their Gram by
default, a caller may downdate — and remembered as expired, so a late label is
told apart from an unknown one. Joined ids are remembered too, so a late
duplicate label is counted as one. That memory is a FIFO of ``remember_done``
ids; past it an id is forgotten and a late label for it ends as ``unknown_id``.
It holds 128-bit fingerprints of the ids in fixed memory allocated up front
(``recent_ids.RecentIds``: ~27 bytes per id, 5.5 MB at the default 200,000, whatever the
stream length), not the ids: a new id is taken for a remembered one with probability at
most ``remember_done`` · 2⁻¹²⁸ (see there).

A feature row whose id is pending, or remembered (labelled or expired), is a
``duplicate_id``. Screen a batch *before* the forward step so a duplicate never
enters A (``refusals``, which the processor's arrival screen asks, ``stream.screen``;
or ``screen_rows``); ``add_rows`` applies the same rule again unless told the
rows were screened.

Ages: a row observed in batch s at time t is expired by ``expire(now, seq)`` once
``seq - s > row_ttl_batches`` or ``now - t > row_ttl_ms`` (so with
``row_ttl_batches=1`` its label may come while the next batch is processed).
Expiry scans from the oldest row and stops at the first young one, which
assumes ``now_ms`` and ``batch_seq`` do not go backwards (if the clock steps
back, rows expire late, never early).

    >>> import numpy as np
    >>> from iolstream.stream.rows import LabelRows, TargetSpec
    >>> buf = JoinBuffer(target=TargetSpec.classification((0, 1)), n_features=2, max_pending_rows=100,
    ...                  row_ttl_ms=None, row_ttl_batches=2, early_label_ttl_ms=60_000,
    ...                  max_early_labels=100, remember_done=1000)
    >>> buf.add_labels(LabelRows(["b"], np.array([1])), now_ms=0).ids     # label before its row: held
    []
    >>> buf.add_rows(["a", "b"], np.ones((2, 2)), batch_seq=1, now_ms=5).ids  # "b" joins on arrival
    ['b']
    >>> res = buf.add_labels(LabelRows(["a", "a"], np.array([0, 0])), now_ms=9)
    >>> res.ids, res.Y.tolist(), res.batch_seq.tolist(), buf.counters["labels_duplicate"]
    (['a'], [0], [1], 1)
"""

from __future__ import annotations

import numpy as np

from iolstream.stream.encoding import feature_message, label_message, row_dead_letter
from iolstream.stream.joined import ExpireResult, JoinResult
from iolstream.stream.recent_ids import RecentIds
from iolstream.stream.rows import BadInput, FeatureRows, LabelRows, TargetSpec
from iolstream.stream.stores import EarlyLabels, PendingRows, id_array

LABELLED, EXPIRED, FORGOTTEN = 1, 2, 3  # kinds of remembered ids (FORGOTTEN: on request, docs/design.md §13)

COUNTERS = (
    "rows_added",  # rows accepted by add_rows (joined on arrival, held, or evicted at once)
    "rows_duplicate",  # rows rejected as duplicate_id (on arrival, or by add_rows)
    "rows_expired",  # pending rows past their ttl
    "rows_evicted",  # pending rows dropped because the buffer was full
    "labels_received",
    "labels_joined",  # joined with their row (on label arrival or later from the early store)
    "labels_early_held",
    "labels_early_joined",
    "labels_duplicate",
    "labels_orphan",  # early labels rejected as unknown_id (ttl or capacity)
    "labels_expired_id",  # labels rejected as expired_id
    "labels_forgotten_id",  # labels rejected as forgotten_id (their id was forgotten on request)
    "rows_forgotten_id",  # rows rejected as forgotten_id
    "labels_handed_over",  # early labels given to the member that took their partition (group learning)
)


class JoinBuffer:
    """Pending feature rows waiting for labels, and early labels waiting for rows.

    Pending rows: ``PendingRows`` (a dict id -> slot over preallocated arrays, in arrival order).
    Early labels: ``EarlyLabels``, the same way. Remembered ids: a bounded FIFO of fingerprints ->
    LABELLED | EXPIRED (``RecentIds``, fixed memory).

    The common cases (a batch of new ids; labels that all join) take bulk paths with no per-row
    Python; ``fast_paths = False`` forces the row-by-row paths, which give the same results.
    """

    fast_paths = True

    def __init__(
        self,
        *,
        target: TargetSpec,
        n_features: int,
        max_pending_rows: int,
        row_ttl_ms: int | None,
        row_ttl_batches: int | None,
        early_label_ttl_ms: int,
        max_early_labels: int,
        remember_done: int,
        label_dead_letter=None,
    ):
        for name, value, low in (
            ("n_features", n_features, 1),
            ("max_pending_rows", max_pending_rows, 1),
            ("early_label_ttl_ms", early_label_ttl_ms, 0),
            ("max_early_labels", max_early_labels, 0),
            ("remember_done", remember_done, 0),
            ("row_ttl_ms", row_ttl_ms, 0),
            ("row_ttl_batches", row_ttl_batches, 0),
        ):
            if value is None and name.startswith("row_ttl"):
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(target, TargetSpec):
            raise TypeError(f"target must be a TargetSpec, got {type(target).__name__}")
        self.target = target
        # a refused label as a message of its own: (id, stored label) -> bytes; the array format's by default
        self._label_dead_letter = label_dead_letter or (lambda row_id, y: label_message(row_id, y, target))
        self.n_features = int(n_features)
        self.max_pending_rows = int(max_pending_rows)
        self.row_ttl_ms = None if row_ttl_ms is None else int(row_ttl_ms)
        self.row_ttl_batches = None if row_ttl_batches is None else int(row_ttl_batches)
        self.early_label_ttl_ms = int(early_label_ttl_ms)
        self.max_early_labels = int(max_early_labels)
        self.remember_done = int(remember_done)

        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._rows = PendingRows(self.n_features, self.max_pending_rows)
        self._pending = self._rows.index  # id -> slot, in arrival order
        y_shape = (0,) if self.target.task == "classification" else (0, self.target.n_outputs)
        y_dtype = np.dtype(np.int64 if self.target.task == "classification" else np.float64)
        self._early = EarlyLabels(y_dtype, y_shape[1:])
        self._done = RecentIds(self.remember_done)
        # shared read-only empty results: one-row messages return empty ones per message
        self._no_y = np.empty(y_shape, dtype=y_dtype)
        self._no_X = np.empty((0, self.n_features))
        self._no_seq = np.empty(0, dtype=np.int64)
        for arr in (self._no_y, self._no_X, self._no_seq):
            arr.flags.writeable = False

    # ------------------------------------------------------------- sizes
    def __len__(self) -> int:
        return len(self._pending)

    @property
    def n_early(self) -> int:
        """Labels held until their row comes."""
        return len(self._early)

    @property
    def n_remembered(self) -> int:
        """Ids remembered as labelled or expired."""
        return len(self._done)

    def early_labels(self) -> list[tuple[str, object, int, object]]:
        """(id, label, arrival ms, source) of the labels held early, oldest first."""
        return self._early.items()

    def hand_over_early(self, which) -> tuple[list[str], np.ndarray, list]:
        """(ids, labels, sources) of the labels held early whose source ``which`` accepts, oldest first, taken
        out and counted as handed over: their partition goes to another member, which will see their rows.
        Labels as ``add_labels`` takes them: class indices (n,) or targets (n, m)."""
        taken = self._early.take(which)
        self.counters["labels_handed_over"] += len(taken)
        return (
            [row_id for row_id, _, _, _ in taken],
            self._y_array([y for _, y, _, _ in taken]),
            [source for _, _, _, source in taken],
        )

    def set_early_sources(self, pairs) -> None:
        """(id, source) pairs: the sources of labels held early (a restored buffer has none); ids not held are
        passed over."""
        self._early.set_sources(pairs)

    def __repr__(self) -> str:
        return f"JoinBuffer(pending={len(self)}, early={self.n_early}, remembered={len(self._done)})"

    # ----------------------------------------------------------- helpers
    def _unseen(self, ids: list[str]) -> bool:
        """No id is pending, remembered, or repeated (some may have early labels): checked in C loops."""
        return (
            len(set(ids)) == len(ids)
            and self._pending.keys().isdisjoint(ids)
            and not self._done.remembers_any(ids)
        )

    def _y_array(self, values: list) -> np.ndarray:
        if not values:
            return self._no_y
        if self.target.task == "classification":
            return np.array(values, dtype=np.int64)
        return np.array(values, dtype=np.float64).reshape(len(values), self.target.n_outputs)

    def _empty_rows(self, rejected=None, sources=None) -> ExpireResult:
        return ExpireResult([], self._no_X, self._no_seq, rejected or [], sources or [])

    def _release(self, ids: list[str], slots: list[int], rejected=None, sources=None, *, ordered=True):
        """Copy the rows in ``slots`` (taken out of ``_pending``) out and free the slots; ``ordered``:
        still in the arrival order (False: the caller popped them from it already)."""
        if not slots:
            return self._empty_rows(rejected, sources)
        X, seq = self._rows.release(slots, ordered=ordered)
        return ExpireResult(ids, X, seq, rejected or [], sources or [])

    def _duplicate_why(self, row_id: str, kind: int) -> str:
        """Why ``row_id`` (remembered as ``kind``, 0 if not) is a duplicate_id."""
        if row_id in self._pending:
            return f"id {row_id!r} is already pending"
        if kind == LABELLED:
            return f"id {row_id!r} was already labelled"
        if kind == EXPIRED:
            return f"id {row_id!r} already expired unlabelled"
        return f"id {row_id!r} is repeated within the batch"

    def _row_refusal(self, row_id: str, kind: int) -> BadInput:
        """A feature row refused: its id forgotten on request (forgotten_id), or seen before (duplicate_id)."""
        if kind == FORGOTTEN and row_id not in self._pending:
            self.counters["rows_forgotten_id"] += 1
            return BadInput(
                "forgotten_id", f"id {row_id!r} was forgotten on request: its rows are not learned"
            )
        self.counters["rows_duplicate"] += 1
        return BadInput("duplicate_id", self._duplicate_why(row_id, kind))

    def unseen(self, ids: list[str]) -> list[int]:
        """Indices of ``ids`` neither pending nor remembered here, first occurrences only (group handover)."""
        kinds = self._done.kinds(self._done.fingerprints_of(ids)) if len(self._done) else np.zeros(len(ids))
        seen, out = set(self._pending), []
        for i, (row_id, kind) in enumerate(zip(ids, kinds.tolist())):
            if row_id not in seen and not kind:
                seen.add(row_id)
                out.append(i)
        return out

    # ------------------------------------------------------------- rows
    def refusals(self, ids: list[str]) -> list[tuple[int, BadInput]]:
        """(index, why) of each of ``ids`` (unique) ``add_rows`` would refuse, in order: pending, or remembered
        (``duplicate_id``; ``forgotten_id`` when forgotten on request), each counted. The common case, no id known
        here, is answered by two C loops (the pending dict, the id memory's fingerprints) and no per-row Python."""
        pending = self._pending
        if pending.keys().isdisjoint(ids) and not self._done.remembers_any(ids):
            return []
        kinds = self._done.kinds(self._done.fingerprints_of(ids)).tolist()
        return [
            (i, self._row_refusal(row_id, kinds[i]))
            for i, row_id in enumerate(ids)
            if row_id in pending or kinds[i]
        ]

    def screen_rows(self, rows: FeatureRows) -> tuple[FeatureRows | None, list[tuple[BadInput, bytes]]]:
        """Split off the rows ``add_rows`` would reject as duplicate_id (also an id repeated in ``rows``); call it
        before the forward step. (The processor screens arriving rows once against everything that holds an id,
        ``stream.screen``, over ``refusals``.)"""
        if len(set(rows.ids)) == len(rows.ids):
            refused = self.refusals(rows.ids)
        else:
            pending, seen, refused = self._pending, set(), []
            kinds = self._done.kinds(self._done.fingerprints_of(rows.ids)).tolist()
            for i, row_id in enumerate(rows.ids):
                if row_id in pending or kinds[i] or row_id in seen:
                    refused.append((i, self._row_refusal(row_id, kinds[i] if row_id not in seen else 0)))
                else:
                    seen.add(row_id)
        if not refused:
            return rows, []
        out = {i for i, _ in refused}
        keep = [i for i in range(len(rows.ids)) if i not in out]
        rejected = [(bad, row_dead_letter(rows, i)) for i, bad in refused]
        return (rows.keep(keep) if keep else None), rejected

    def add_rows(
        self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int, *, screened: bool = False
    ) -> JoinResult:
        """Rows just observed (already forward-updated). Early labels waiting for them join now.

        Rows beyond ``max_pending_rows`` push the oldest pending rows out (possibly some of
        these very rows, if the batch alone is larger); they are returned in ``.evicted``.
        ``screened``: the caller vouches that no id is pending, remembered or repeated (it screened them on
        arrival with ``refusals`` and nothing has made them known since), so they are not looked up again;
        otherwise an id seen before is refused here (``duplicate_id``), as ``screen_rows`` would have.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.shape != (len(ids), self.n_features):
            raise ValueError(f"X must have shape ({len(ids)}, {self.n_features}), got {X.shape}")
        room = len(self._pending) + len(ids) <= self.max_pending_rows
        if self.fast_paths and room and (screened or self._unseen(ids)):
            if not self._early or self._early.index.keys().isdisjoint(ids):
                return self._add_new_rows(ids, X, batch_seq, now_ms)
            return self._add_rows_joining_early(ids, X, batch_seq, now_ms)
        pending, early, store = self._pending, self._early, self._rows
        done = self._done.session(ids)
        new_rows, new_slots, join_rows, join_y, rejected = [], [], [], [], []
        for i, row_id in enumerate(ids):
            kind = done.get(row_id)
            if row_id in pending or kind:
                rejected.append((self._row_refusal(row_id, kind), feature_message(row_id, X[i])))
                continue
            held = early.pop(row_id)
            if held is not None:
                join_rows.append(i)
                join_y.append(held[0])
                done.add(row_id, LABELLED)
                continue
            slot = store.take_one()
            pending[row_id] = slot
            new_rows.append(i)
            new_slots.append(slot)
        if new_slots:
            store.fill(new_slots, X[new_rows], batch_seq, now_ms)
            store.add([ids[i] for i in new_rows], new_slots)

        done.commit()
        evicted = self._empty_rows()
        over = len(pending) - self.max_pending_rows
        if over > 0:
            out_ids, out_slots = store.pop_oldest(over)
            self._done.remember(out_ids, EXPIRED)
            evicted = self._release(out_ids, out_slots, ordered=False)
            self.counters["rows_evicted"] += over

        c = self.counters
        c["rows_added"] += len(new_rows) + len(join_rows)
        c["labels_joined"] += len(join_rows)
        c["labels_early_joined"] += len(join_rows)
        return JoinResult(
            [ids[i] for i in join_rows],
            X[join_rows],
            self._y_array(join_y),
            np.full(len(join_rows), batch_seq, dtype=np.int64),
            rejected,
            evicted,
        )

    def _add_new_rows(self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int) -> JoinResult:
        """add_rows when every id is new and the buffer has room: no per-row Python."""
        slots = self._rows.take_slots(len(ids))
        self._rows.fill(slots, X, batch_seq, now_ms)
        self._rows.add(ids, slots)
        self.counters["rows_added"] += len(ids)
        empty = self._empty_rows()
        return JoinResult([], empty.X, self._no_y, empty.batch_seq, [], empty)

    def _add_rows_joining_early(
        self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int
    ) -> JoinResult:
        """add_rows when every id is new, the buffer has room, and some ids have early labels (with
        one-row label messages nearly all do: they come while their rows wait for their batch): those
        join now, the others become pending, without the id memory's row-by-row session."""
        early = self._early.index
        joined = np.fromiter((row_id in early for row_id in ids), dtype=bool, count=len(ids))
        join_rows = np.flatnonzero(joined)
        join_ids = [ids[i] for i in join_rows.tolist()]
        join_y = self._early.pop_many(join_ids)
        new_rows = np.flatnonzero(~joined)
        if len(new_rows):
            self._add_new_rows([ids[i] for i in new_rows.tolist()], X[new_rows], batch_seq, now_ms)
        self._done.remember(join_ids, LABELLED)
        c = self.counters
        c["rows_added"] += len(join_ids)
        c["labels_joined"] += len(join_ids)
        c["labels_early_joined"] += len(join_ids)
        y = join_y if len(join_ids) else self._no_y
        return JoinResult(
            join_ids,
            X[join_rows],
            y,
            np.full(len(join_ids), batch_seq, dtype=np.int64),
            [],
            self._empty_rows(),
        )

    # ----------------------------------------------------------- labels
    def add_labels(self, labels: LabelRows, now_ms: int, waiting=frozenset(), source=None) -> JoinResult:
        """Join the labels whose rows are pending; hold the others as early, or count/reject them.

        ``waiting``: ids whose rows the caller holds, screened but not added yet (its micro-batch):
        neither pending nor remembered, so their labels are held early without asking the id
        memory (one-row messages: a label often comes while its row waits for its batch).
        ``source``: opaque, kept with each label held early and handed back in ``orphan_sources``
        if it is given up on (its dead letter names the message that brought it)."""
        Y = labels.Y
        if self.target.task == "classification":
            if Y.size <= 16:  # NumPy's min/max cost ~1.5 µs whatever the size: one-label messages
                in_range = all(0 <= v < len(self.target.classes) for v in Y.ravel().tolist())
            else:
                in_range = 0 <= Y.min() <= Y.max() < len(self.target.classes)
            ok = Y.ndim == 1 and Y.dtype.kind in "iu" and in_range
        else:
            ok = Y.ndim == 2 and Y.shape[1] == self.target.n_outputs
        if not ok or len(Y) != len(labels.ids):
            raise ValueError(f"labels.Y of shape {Y.shape} and dtype {Y.dtype} does not fit {self.target}")
        pending, early = self._pending, self._early
        ids = labels.ids
        all_pending_once = (
            ids[0] in pending if len(ids) == 1 else len(set(ids)) == len(ids) and pending.keys() >= set(ids)
        )
        if self.fast_paths and all_pending_once:
            slots = list(map(pending.pop, ids))
            self._done.remember(ids, LABELLED)
            joined = self._release(list(ids), slots)
            self.counters["labels_received"] += len(ids)
            self.counters["labels_joined"] += len(ids)
            y = np.array(Y, dtype=np.int64 if self.target.task == "classification" else np.float64)
            return JoinResult(joined.ids, joined.X, y, joined.batch_seq, [], self._empty_rows())
        if len(ids) == 1:
            held_at_once = (
                ids[0] in waiting and ids[0] not in early.index and len(early.index) < self.max_early_labels
            )
        else:  # every row waits for its batch (so none is pending nor remembered), no label held yet, room for all
            held_at_once = (
                len(early) + len(ids) <= self.max_early_labels
                and waiting.issuperset(ids)
                and early.index.keys().isdisjoint(ids)
                and pending.keys().isdisjoint(ids)
                and len(set(ids)) == len(ids)
            )
        if self.fast_paths and held_at_once:  # labels of rows waiting for their batch: held, nothing else
            if len(ids) == 1:
                early.add(ids[0], Y.tolist()[0], now_ms, source)
            else:
                early.add_many(ids, Y, now_ms, source)
            self.counters["labels_received"] += len(ids)
            self.counters["labels_early_held"] += len(ids)
            return JoinResult([], self._no_X, self._no_y, self._no_seq, [], self._empty_rows())
        join_ids, join_slots, join_y, rejected, orphan_sources = [], [], [], [], []
        n_duplicate = n_held = n_orphan = n_expired = n_forgotten = 0
        done = None  # the id memory's session, opened when first needed
        for row_id, y in zip(labels.ids, Y.tolist()):
            slot = pending.pop(row_id, None)
            if slot is not None:
                join_ids.append(row_id)
                join_slots.append(slot)
                join_y.append(y)
                done = done or self._done.session(ids)
                done.add(row_id, LABELLED)
                continue
            if row_id in waiting:
                kind = 0
            else:
                done = done or self._done.session(ids)
                kind = done.get(row_id)
            if kind == LABELLED or (not kind and row_id in early):
                n_duplicate += 1
            elif kind == EXPIRED:
                n_expired += 1
                bad = BadInput("expired_id", f"label for id {row_id!r} came after its row expired unlabelled")
                rejected.append((bad, self._label_dead_letter(row_id, y)))
            elif kind == FORGOTTEN:
                n_forgotten += 1
                bad = BadInput("forgotten_id", f"label for id {row_id!r}, which was forgotten on request")
                rejected.append((bad, self._label_dead_letter(row_id, y)))
            else:
                early.add(row_id, y, now_ms, source)
                n_held += 1
                while len(early) > self.max_early_labels:
                    old_id, old_y, _, old_source = early.pop_oldest()
                    n_orphan += 1
                    bad = BadInput(
                        "unknown_id",
                        f"label for id {old_id!r} pushed out of the full early-label buffer "
                        f"({self.max_early_labels}) before its row came",
                    )
                    rejected.append((bad, self._label_dead_letter(old_id, old_y)))
                    orphan_sources.append(old_source)
        if done is not None:
            done.commit()
        joined = self._release(join_ids, join_slots)
        c = self.counters
        c["labels_received"] += len(labels.ids)
        c["labels_joined"] += len(join_ids)
        c["labels_duplicate"] += n_duplicate
        c["labels_expired_id"] += n_expired
        c["labels_forgotten_id"] += n_forgotten
        c["labels_early_held"] += n_held
        c["labels_orphan"] += n_orphan
        return JoinResult(
            joined.ids,
            joined.X,
            self._y_array(join_y),
            joined.batch_seq,
            rejected,
            self._empty_rows(),
            orphan_sources,
        )

    # ----------------------------------------------------------- forget requests (docs/design.md §13)
    def remembered(self, ids: list[str]) -> np.ndarray:
        """(n,) int8: what each id is remembered as (LABELLED, EXPIRED, FORGOTTEN; 0: not remembered)."""
        if not len(self._done) or not len(ids):
            return np.zeros(len(ids), dtype=np.int8)
        return self._done.kinds(self._done.fingerprints_of(ids))

    def take_rows(self, ids: list[str]) -> ExpireResult:
        """The pending rows among ``ids``, taken out of the buffer with their data (in arrival order)."""
        found = [row_id for row_id in ids if row_id in self._pending]
        if not found:
            return self._empty_rows()
        slots = [self._pending.pop(row_id) for row_id in found]
        return self._release(found, slots)

    def drop_early(self, ids: list[str]) -> list[str]:
        """The early labels of ``ids`` (labels whose row has not come), dropped; returns their ids."""
        return [row_id for row_id in ids if self._early.pop(row_id) is not None]

    def remember(self, ids: list[str], kind: int) -> None:
        """Remember ``ids`` as ``kind``: FORGOTTEN (on request: a later row or label for them is refused,
        forgotten_id), or EXPIRED (rows taken out of the buffer that keep their Gram)."""
        if len(ids):
            self._done.remember(list(ids), kind)

    # ----------------------------------------------------------- expiry
    def expire(self, now_ms: int, batch_seq: int) -> ExpireResult:
        """Rows older than their ttl (returned, remembered as expired) and early labels older than
        ``early_label_ttl_ms`` (rejected as unknown_id)."""
        out_ids, out_slots = self._rows.expire(now_ms, batch_seq, self.row_ttl_ms, self.row_ttl_batches)
        self._done.remember(out_ids, EXPIRED)
        self.counters["rows_expired"] += len(out_ids)

        early, rejected, sources = self._early, [], []
        while early:
            row_id, added_ms = early.oldest()
            if now_ms - added_ms <= self.early_label_ttl_ms:
                break
            _, y, _, source = early.pop_oldest()
            bad = BadInput(
                "unknown_id",
                f"label for id {row_id!r} waited {now_ms - added_ms} ms "
                f"(limit {self.early_label_ttl_ms}) and its row never came",
            )
            rejected.append((bad, self._label_dead_letter(row_id, y)))
            sources.append(source)
        self.counters["labels_orphan"] += len(rejected)
        return self._release(out_ids, out_slots, rejected, sources, ordered=False)

    # ------------------------------------------------------------ state
    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (no objects: loads with allow_pickle=False), every sequence oldest first; remembered
        ids as their fingerprints (``RecentIds.state_arrays``)."""
        early = self._early.items()
        early_y = self._y_array([y for _, y, _, _ in early])
        return {
            **self._rows.to_state(),
            "early_ids": id_array([row_id for row_id, _, _, _ in early]),
            "early_Y": early_y,
            "early_added_ms": np.array([t for _, _, t, _ in early], dtype=np.int64),
            **self._done.state_arrays(),
            "counter_names": id_array(self.counters),
            "counter_values": np.fromiter(self.counters.values(), dtype=np.int64, count=len(self.counters)),
        }

    @classmethod
    def from_state(cls, state, **kwargs) -> JoinBuffer:
        """A buffer equal to the one that wrote ``state`` (kwargs as for __init__). Limits that
        shrank since are enforced by the next add (evictions are returned and counted then)."""
        buf = cls(**kwargs)
        buf._rows.load(state)

        buf._early.load_arrays(state, buf.target)
        buf._done.load_arrays(
            state, kinds={LABELLED, EXPIRED, FORGOTTEN}
        )  # oldest first: past capacity, gone

        names = [str(s) for s in state["counter_names"].tolist()]
        buf.counters.update(zip(names, (int(v) for v in np.asarray(state["counter_values"]).tolist())))
        return buf
