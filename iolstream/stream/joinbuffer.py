"""The bounded label-join buffer and the micro-batcher (SPEC §5). Pure logic, explicit state.

``JoinBuffer`` holds feature rows that were observed (their Gram already in A,
SPEC §2 -F) and wait for a label, and labels that came before their row
("early" labels). Every label ends in exactly one place, each counted:

- joined with its row, once (``labels_joined``; ``labels_early_joined`` of those were held early);
- a duplicate of a label already joined or already held early (``labels_duplicate``;
  the first label is the one applied, later ones are counted, not dead-lettered);
- rejected ``expired_id`` — its row expired or was evicted (``labels_expired_id``);
- rejected ``unknown_id`` — held early past ``early_label_ttl_ms`` or pushed out of
  the full early buffer, oldest first, without its row coming (``labels_orphan``);
- still held early (``n_early``).

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
``duplicate_id``. Call ``screen_rows`` on a batch *before* the forward step so
a duplicate never enters A; ``add_rows`` applies the same rule as a safety net.

Ages: a row observed in batch s at time t is expired by ``expire(now, seq)`` once
``seq - s > row_ttl_batches`` or ``now - t > row_ttl_ms`` (so with
``row_ttl_batches=1`` its label may come while the next batch is processed).
Expiry scans from the oldest row and stops at the first young one, which
assumes ``now_ms`` and ``batch_seq`` do not go backwards (if the clock steps
back, rows expire late, never early).

    >>> import numpy as np
    >>> from iolstream.stream.codec import LabelRows, TargetSpec
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

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from iolstream.stream.codec import BadInput, FeatureRows, LabelRows, TargetSpec, feature_message, label_message
from iolstream.stream.recent_ids import FINGERPRINT_VERSION, RecentIds, fingerprints

LABELLED, EXPIRED = 1, 2  # kinds of remembered ids

COUNTERS = (
    "rows_added",  # rows accepted by add_rows (joined on arrival, held, or evicted at once)
    "rows_duplicate",  # rows rejected as duplicate_id (screen_rows or add_rows)
    "rows_expired",  # pending rows past their ttl
    "rows_evicted",  # pending rows dropped because the buffer was full
    "labels_received",
    "labels_joined",  # joined with their row (on label arrival or later from the early store)
    "labels_early_held",
    "labels_early_joined",
    "labels_duplicate",
    "labels_orphan",  # early labels rejected as unknown_id (ttl or capacity)
    "labels_expired_id",  # labels rejected as expired_id
)


def _id_array(ids) -> np.ndarray:
    return np.array(list(ids), dtype=str) if ids else np.empty(0, dtype="U1")


@dataclass
class ExpireResult:
    """Rows that left the buffer unlabelled, and early labels given up on.

    ids       : list of e str, oldest first
    X         : (e, k) float64 — the rows as added
    batch_seq : (e,) int64 — the batch each row was observed in
    rejected  : [(BadInput("unknown_id"), label message bytes)] — orphan early labels
    orphan_sources : the source each of those labels was added with, in the same order
    """

    ids: list[str]
    X: np.ndarray
    batch_seq: np.ndarray
    rejected: list[tuple[BadInput, bytes]] = field(default_factory=list)
    orphan_sources: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class JoinResult:
    """Rows joined with their labels by one call, plus what the call rejected or evicted.

    ids       : list of j str
    X         : (j, k) float64
    Y         : classification (j,) int64 class indices; regression (j, m) float64
    batch_seq : (j,) int64 — the batch each joined row was observed in
    rejected  : [(BadInput, bytes)] — duplicate_id rows, expired_id labels, unknown_id
                early labels pushed out by capacity; bytes re-encode the row / label
    evicted   : rows pushed out of a full buffer by this add_rows (empty for add_labels)
    orphan_sources : the source each unknown_id label in ``rejected`` was added with, in order
    """

    ids: list[str]
    X: np.ndarray
    Y: np.ndarray
    batch_seq: np.ndarray
    rejected: list[tuple[BadInput, bytes]]
    evicted: ExpireResult
    orphan_sources: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


class ArrivalOrder:
    """Slots of a store in arrival order, oldest first, beside a plain dict id -> slot.

    The stores were OrderedDicts: a linked-list node and a second table per entry, and under a
    steady churn (one in, one out) their tables were rebuilt at 3x the live entries: 515 bytes
    per waiting label where ~250 were documented. Here: a ring of int32 slots, and per slot its
    ring position (-1: not in the store). A slot taken out anywhere (joined) leaves a stale ring
    entry that ``oldest`` skips; a full ring is compacted, and grown only while the live entries
    fill more than 3/4 of it: at most ~2.7 ring entries (11 bytes) per live slot, plus 4 bytes a slot.

        >>> order = ArrivalOrder()
        >>> order.push_many(np.array([3, 0, 2]))
        >>> order.drop(np.array([0])); order.oldest(), order.pop(), order.oldest(), len(order)
        (3, 3, 2, 1)
    """

    def __init__(self):
        self._ring = np.empty(16, dtype=np.int32)
        self._at = np.full(16, -1, dtype=np.int32)  # per slot: its ring position, -1 when not in the store
        self._head = self._tail = 0  # stale or live entries in [head, tail); all before head are gone
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return self._ring.nbytes + self._at.nbytes

    def _fit_slots(self, high: int) -> None:
        if high > len(self._at):
            at = np.full(max(high, 2 * len(self._at)), -1, dtype=np.int32)
            at[: len(self._at)] = self._at
            self._at = at

    def _compact(self, extra: int) -> None:
        """Live entries to the front, with room for ``extra`` more and at least a quarter free."""
        pos = np.arange(self._head, self._tail, dtype=np.int32)
        ring = self._ring[self._head : self._tail]
        live = ring[self._at[ring] == pos]
        size = len(self._ring)
        while 4 * (len(live) + extra) > 3 * size:
            size *= 2
        if size != len(self._ring):
            self._ring = np.empty(size, dtype=np.int32)
        self._ring[: len(live)] = live
        self._at[live] = np.arange(len(live), dtype=np.int32)
        self._head, self._tail = 0, len(live)

    def push(self, slot: int) -> None:
        """One slot, the newest."""
        if self._tail == len(self._ring):
            self._compact(1)
        if slot >= len(self._at):
            self._fit_slots(slot + 1)
        self._ring[self._tail] = slot
        self._at[slot] = self._tail
        self._tail += 1
        self._n += 1

    def push_many(self, slots: np.ndarray) -> None:
        """(n,) int slots in arrival order, after every slot already in."""
        n = len(slots)
        if not n:
            return
        if self._tail + n > len(self._ring):
            self._compact(n)
        self._fit_slots(int(slots.max()) + 1)
        self._ring[self._tail : self._tail + n] = slots
        self._at[slots] = np.arange(self._tail, self._tail + n, dtype=np.int32)
        self._tail += n
        self._n += n

    def drop(self, slots: np.ndarray) -> None:
        """Take (n,) slots, each in the store, out wherever they are."""
        self._at[slots] = -1
        self._n -= len(slots)

    def drop_one(self, slot: int) -> None:
        self._at[slot] = -1
        self._n -= 1

    def oldest(self) -> int:
        """The oldest slot in the store, -1 when empty (stale entries before it are passed for good)."""
        ring, at, h, t = self._ring, self._at, self._head, self._tail
        while h < t:
            slot = int(ring[h])
            if at[slot] == h:
                break
            h += 1
        self._head = h
        return slot if h < t else -1

    def pop(self) -> int:
        """Take the oldest slot out (the store is not empty)."""
        slot = self.oldest()
        self._at[slot] = -1
        self._head += 1
        self._n -= 1
        return slot


class EarlyLabels:
    """Labels that came before their row, oldest first: a plain dict id -> slot, the slots' label,
    arrival ms and message source in arrays and lists, their order in an ``ArrivalOrder``. Slots
    are reused; the arrays grow to the most labels held at once (``max_early_labels`` + 1).
    Per label: the id (49 bytes + its length as a str), its dict entry (~40–80 bytes), its slot
    int (32), the label (8 · m), the ms (8), two list pointers (16) and the order (≤ 15).

        >>> early = EarlyLabels(np.dtype(np.int64), ())
        >>> early.add("a", 1, 10, "src@1"); early.add("b", 0, 11, None); "a" in early, len(early)
        (True, 2)
        >>> early.pop("a"), early.oldest(), early.pop_oldest(), len(early)
        ((1, 'src@1'), ('b', 11), ('b', 0, 11, None), 0)
    """

    def __init__(self, y_dtype: np.dtype, y_tail: tuple):
        self.index: dict[str, int] = {}
        self._y = np.empty((16,) + y_tail, dtype=y_dtype)
        self._ms = np.empty(16, dtype=np.int64)
        self._ids: list = [None] * 16  # per slot: the id (the dict's key object), None when free
        self._sources: list = [None] * 16  # per slot: the source of the message that brought it
        self._free: list[int] = list(range(15, -1, -1))
        self._order = ArrivalOrder()

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, row_id) -> bool:
        return row_id in self.index

    @property
    def capacity(self) -> int:
        """Slots allocated (they never shrink): the most labels held at once, rounded up."""
        return len(self._ms)

    def _grow(self) -> None:
        old = len(self._ms)
        size = 2 * old
        y = np.empty((size,) + self._y.shape[1:], dtype=self._y.dtype)
        y[:old] = self._y
        ms = np.empty(size, dtype=np.int64)
        ms[:old] = self._ms
        self._y, self._ms = y, ms
        self._ids.extend([None] * old)
        self._sources.extend([None] * old)
        self._free.extend(range(size - 1, old - 1, -1))

    def add(self, row_id: str, y, now_ms: int, source) -> None:
        """Hold a label (its id is not held)."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.index[row_id] = slot
        self._y[slot] = y
        self._ms[slot] = now_ms
        self._ids[slot] = row_id
        self._sources[slot] = source
        self._order.push(slot)

    def _take(self, slot: int):
        y, source = self._y[slot].tolist(), self._sources[slot]
        self._ids[slot] = self._sources[slot] = None
        self._free.append(slot)
        return y, source

    def pop(self, row_id: str):
        """(label, source) of a held id, taken out; None when not held."""
        slot = self.index.pop(row_id, None)
        if slot is None:
            return None
        self._order.drop_one(slot)
        return self._take(slot)

    def pop_many(self, ids: list[str]) -> np.ndarray:
        """The labels of held ids (each held once), taken out: (n,) or (n, m) (their sources are dropped)."""
        slots = [self.index.pop(row_id) for row_id in ids]
        rows = np.array(slots, dtype=np.intp)
        y = self._y[rows]
        self._order.drop(rows)
        ids_, sources = self._ids, self._sources
        for slot in slots:
            ids_[slot] = sources[slot] = None
        self._free.extend(slots)
        return y

    def oldest(self) -> tuple[str, int] | None:
        """(id, arrival ms) of the oldest label, None when empty."""
        slot = self._order.oldest()
        return None if slot < 0 else (self._ids[slot], int(self._ms[slot]))

    def pop_oldest(self) -> tuple[str, object, int, object]:
        """(id, label, arrival ms, source) of the oldest label, taken out (not empty)."""
        slot = self._order.pop()
        row_id, ms = self._ids[slot], int(self._ms[slot])
        del self.index[row_id]
        y, source = self._take(slot)
        return row_id, y, ms, source

    def items(self) -> list[tuple[str, object, int, object]]:
        """(id, label, arrival ms, source) of every held label, oldest first (the dict keeps arrival order)."""
        slots = np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index))
        sources = [self._sources[s] for s in slots.tolist()]
        return list(zip(self.index, self._y[slots].tolist(), self._ms[slots].tolist(), sources))


class JoinBuffer:
    """Pending feature rows waiting for labels, and early labels waiting for rows.

    Pending rows: a plain dict id -> slot (insertion = arrival order) over growable preallocated
    arrays X / batch_seq / added_ms, their ids per slot, and an ``ArrivalOrder`` for the
    oldest-first scans. Early labels: ``EarlyLabels``, the same way. Remembered ids: a bounded
    FIFO of fingerprints -> LABELLED | EXPIRED (``RecentIds``, fixed memory).

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
    ):
        for name, value, low in (
            ("n_features", n_features, 1), ("max_pending_rows", max_pending_rows, 1),
            ("early_label_ttl_ms", early_label_ttl_ms, 0), ("max_early_labels", max_early_labels, 0),
            ("remember_done", remember_done, 0), ("row_ttl_ms", row_ttl_ms, 0), ("row_ttl_batches", row_ttl_batches, 0),
        ):  # fmt: skip
            if value is None and name.startswith("row_ttl"):
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(target, TargetSpec):
            raise TypeError(f"target must be a TargetSpec, got {type(target).__name__}")
        self.target = target
        self.n_features = int(n_features)
        self.max_pending_rows = int(max_pending_rows)
        self.row_ttl_ms = None if row_ttl_ms is None else int(row_ttl_ms)
        self.row_ttl_batches = None if row_ttl_batches is None else int(row_ttl_batches)
        self.early_label_ttl_ms = int(early_label_ttl_ms)
        self.max_early_labels = int(max_early_labels)
        self.remember_done = int(remember_done)

        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._pending: dict[str, int] = {}  # id -> slot, in arrival order
        self._order = ArrivalOrder()  # the pending slots, oldest first
        y_shape = (0,) if self.target.task == "classification" else (0, self.target.n_outputs)
        y_dtype = np.dtype(np.int64 if self.target.task == "classification" else np.float64)
        self._early = EarlyLabels(y_dtype, y_shape[1:])
        self._done = RecentIds(self.remember_done)
        self._free: list[int] = []  # slots released by joined / expired rows
        self._high = 0  # slots [0, _high) have been handed out at least once
        capacity = min(self.max_pending_rows, 1024)
        self._X = np.empty((capacity, self.n_features))
        self._seq = np.empty(capacity, dtype=np.int64)
        self._added_ms = np.empty(capacity, dtype=np.int64)
        self._ids = np.empty(capacity, dtype=object)  # per slot: the pending row's id, None when free
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
        return len(self._early)

    @property
    def n_remembered(self) -> int:
        return len(self._done)

    def early_labels(self) -> list[tuple[str, object, int, object]]:
        """(id, label, arrival ms, source) of the labels held early, oldest first."""
        return self._early.items()

    def set_early_sources(self, pairs) -> None:
        """(id, source) pairs: the sources of labels held early (a restored buffer has none); ids not held are passed over."""
        early = self._early
        for row_id, source in pairs:
            slot = early.index.get(row_id)
            if slot is not None:
                early._sources[slot] = source

    def __repr__(self) -> str:
        return f"JoinBuffer(pending={len(self)}, early={self.n_early}, remembered={len(self._done)})"

    # ----------------------------------------------------------- helpers
    def _grow(self, needed: int) -> None:
        capacity = len(self._seq)
        if needed <= capacity:
            return
        capacity = max(needed, min(2 * capacity, self.max_pending_rows))
        for name in ("_X", "_seq", "_added_ms", "_ids"):
            old = getattr(self, name)
            new = np.empty((capacity,) + old.shape[1:], dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _take_slots(self, n: int) -> list[int]:
        """n free slots: released ones first, then fresh ones (the arrays grow to fit)."""
        free = self._free
        reuse = min(n, len(free))
        slots = free[len(free) - reuse :]
        del free[len(free) - reuse :]
        if reuse < n:
            slots.extend(range(self._high, self._high + n - reuse))
            self._high += n - reuse
            self._grow(self._high)
        return slots

    def _unseen(self, ids: list[str]) -> bool:
        """No id is pending, remembered, or repeated (some may have early labels): checked in C loops."""
        return len(set(ids)) == len(ids) and self._pending.keys().isdisjoint(ids) and not self._done.remembers_any(ids)

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
        rows = np.array(slots, dtype=np.intp)
        result = ExpireResult(ids, self._X[rows], self._seq[rows], rejected or [], sources or [])
        if ordered:
            self._order.drop(rows)
        self._ids[rows] = None
        self._free.extend(slots)
        return result

    def _add_pending(self, ids: list[str], slots: list[int]) -> None:
        """Slots (already filled) of new pending rows, in arrival order."""
        rows = np.array(slots, dtype=np.intp)
        self._pending.update(zip(ids, slots))
        self._ids[rows] = ids if len(ids) > 1 else ids[0]  # (a list of one str would not be taken as one object)
        self._order.push_many(rows)

    def _duplicate_why(self, row_id: str, kind: int) -> str:
        """Why ``row_id`` (remembered as ``kind``, 0 if not) is a duplicate_id."""
        if row_id in self._pending:
            return f"id {row_id!r} is already pending"
        if kind == LABELLED:
            return f"id {row_id!r} was already labelled"
        if kind == EXPIRED:
            return f"id {row_id!r} already expired unlabelled"
        return f"id {row_id!r} is repeated within the batch"

    # ------------------------------------------------------------- rows
    def screen_rows(self, rows: FeatureRows) -> tuple[FeatureRows | None, list[tuple[BadInput, bytes]]]:
        """Split off the rows ``add_rows`` would reject as duplicate_id; call it before the forward step."""
        pending = self._pending
        if (
            self.fast_paths and len(set(rows.ids)) == len(rows.ids) and pending.keys().isdisjoint(rows.ids)
            and not self._done.remembers_any(rows.ids)
        ):  # fmt: skip
            return rows, []
        kinds = self._done.kinds(self._done.fingerprints_of(rows.ids)).tolist()
        seen: set[str] = set()
        keep, rejected = [], []
        for i, row_id in enumerate(rows.ids):
            if row_id in pending or kinds[i] or row_id in seen:
                bad = BadInput("duplicate_id", self._duplicate_why(row_id, kinds[i]))
                rejected.append((bad, feature_message(row_id, rows.X[i], int(rows.ts[i]))))
            else:
                seen.add(row_id)
                keep.append(i)
        if not rejected:
            return rows, []
        self.counters["rows_duplicate"] += len(rejected)
        if not keep:
            return None, rejected
        return FeatureRows([rows.ids[i] for i in keep], rows.X[keep], rows.ts[keep]), rejected

    def add_rows(self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int) -> JoinResult:
        """Rows just observed (already forward-updated). Early labels waiting for them join now.

        Rows beyond ``max_pending_rows`` push the oldest pending rows out (possibly some of
        these very rows, if the batch alone is larger); they are returned in ``.evicted``.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.shape != (len(ids), self.n_features):
            raise ValueError(f"X must have shape ({len(ids)}, {self.n_features}), got {X.shape}")
        if self.fast_paths and len(self._pending) + len(ids) <= self.max_pending_rows and self._unseen(ids):
            if not self._early or self._early.index.keys().isdisjoint(ids):
                return self._add_new_rows(ids, X, batch_seq, now_ms)
            return self._add_rows_joining_early(ids, X, batch_seq, now_ms)
        pending, early, free = self._pending, self._early, self._free
        done = self._done.session(ids)
        new_rows, new_slots, join_rows, join_y, rejected = [], [], [], [], []
        for i, row_id in enumerate(ids):
            kind = done.get(row_id)
            if row_id in pending or kind:
                rejected.append((BadInput("duplicate_id", self._duplicate_why(row_id, kind)), feature_message(row_id, X[i])))
                continue
            held = early.pop(row_id)
            if held is not None:
                join_rows.append(i)
                join_y.append(held[0])
                done.add(row_id, LABELLED)
                continue
            if free:
                slot = free.pop()
            else:
                slot = self._high
                self._high += 1
            pending[row_id] = slot
            new_rows.append(i)
            new_slots.append(slot)
        if new_slots:
            self._grow(self._high)
            self._X[new_slots] = X[new_rows]
            self._seq[new_slots] = batch_seq
            self._added_ms[new_slots] = now_ms
            self._add_pending([ids[i] for i in new_rows], new_slots)

        done.commit()
        evicted = self._empty_rows()
        over = len(pending) - self.max_pending_rows
        if over > 0:
            out_slots = [self._order.pop() for _ in range(over)]
            out_ids = [str(row_id) for row_id in self._ids[out_slots].tolist()]
            for row_id in out_ids:
                del pending[row_id]
            self._done.remember(out_ids, EXPIRED)
            evicted = self._release(out_ids, out_slots, ordered=False)
            self.counters["rows_evicted"] += over

        c = self.counters
        c["rows_added"] += len(new_rows) + len(join_rows)
        c["rows_duplicate"] += len(rejected)
        c["labels_joined"] += len(join_rows)
        c["labels_early_joined"] += len(join_rows)
        return JoinResult(
            [ids[i] for i in join_rows], X[join_rows], self._y_array(join_y),
            np.full(len(join_rows), batch_seq, dtype=np.int64), rejected, evicted,
        )  # fmt: skip

    def _add_new_rows(self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int) -> JoinResult:
        """add_rows when every id is new and the buffer has room: no per-row Python."""
        slots = self._take_slots(len(ids))
        rows = np.array(slots, dtype=np.intp)  # one conversion for the three scatters (a list is converted each time)
        self._X[rows] = X
        self._seq[rows] = batch_seq
        self._added_ms[rows] = now_ms
        self._add_pending(ids, slots)
        self.counters["rows_added"] += len(ids)
        empty = self._empty_rows()
        return JoinResult([], empty.X, self._no_y, empty.batch_seq, [], empty)

    def _add_rows_joining_early(self, ids: list[str], X: np.ndarray, batch_seq: int, now_ms: int) -> JoinResult:
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
        return JoinResult(join_ids, X[join_rows], y, np.full(len(join_ids), batch_seq, dtype=np.int64), [], self._empty_rows())

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
        if self.fast_paths and (ids[0] in pending if len(ids) == 1 else len(set(ids)) == len(ids) and pending.keys() >= set(ids)):  # all pending, once each
            slots = list(map(pending.pop, ids))
            self._done.remember(ids, LABELLED)
            joined = self._release(list(ids), slots)
            self.counters["labels_received"] += len(ids)
            self.counters["labels_joined"] += len(ids)
            y = np.array(Y, dtype=np.int64 if self.target.task == "classification" else np.float64)
            return JoinResult(joined.ids, joined.X, y, joined.batch_seq, [], self._empty_rows())
        held_at_once = len(ids) == 1 and ids[0] in waiting and ids[0] not in early and len(early) < self.max_early_labels
        if self.fast_paths and held_at_once:  # one label of a row waiting for its batch: held, nothing else
            early.add(ids[0], Y.tolist()[0], now_ms, source)
            self.counters["labels_received"] += 1
            self.counters["labels_early_held"] += 1
            return JoinResult([], self._no_X, self._no_y, self._no_seq, [], self._empty_rows())
        join_ids, join_slots, join_y, rejected, orphan_sources = [], [], [], [], []
        n_duplicate = n_held = n_orphan = n_expired = 0
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
                rejected.append((bad, label_message(row_id, y, self.target)))
            else:
                early.add(row_id, y, now_ms, source)
                n_held += 1
                while len(early) > self.max_early_labels:
                    old_id, old_y, _, old_source = early.pop_oldest()
                    n_orphan += 1
                    bad = BadInput("unknown_id", f"label for id {old_id!r} pushed out of the full early-label buffer "
                                                 f"({self.max_early_labels}) before its row came")  # fmt: skip
                    rejected.append((bad, label_message(old_id, old_y, self.target)))
                    orphan_sources.append(old_source)
        if done is not None:
            done.commit()
        joined = self._release(join_ids, join_slots)
        c = self.counters
        c["labels_received"] += len(labels.ids)
        c["labels_joined"] += len(join_ids)
        c["labels_duplicate"] += n_duplicate
        c["labels_expired_id"] += n_expired
        c["labels_early_held"] += n_held
        c["labels_orphan"] += n_orphan
        return JoinResult(joined.ids, joined.X, self._y_array(join_y), joined.batch_seq, rejected, self._empty_rows(),
                          orphan_sources)  # fmt: skip

    # ----------------------------------------------------------- expiry
    def expire(self, now_ms: int, batch_seq: int) -> ExpireResult:
        """Rows older than their ttl (returned, remembered as expired) and early labels older than
        ``early_label_ttl_ms`` (rejected as unknown_id)."""
        pending, ttl_ms, ttl_batches = self._pending, self.row_ttl_ms, self.row_ttl_batches
        out_ids, out_slots = [], []
        while pending:
            slot = self._order.oldest()
            young_ms = ttl_ms is None or now_ms - int(self._added_ms[slot]) <= ttl_ms
            young_batches = ttl_batches is None or batch_seq - int(self._seq[slot]) <= ttl_batches
            if young_ms and young_batches:
                break
            self._order.pop()
            row_id = self._ids[slot]
            del pending[row_id]
            out_ids.append(row_id)
            out_slots.append(slot)
        self._done.remember(out_ids, EXPIRED)
        self.counters["rows_expired"] += len(out_ids)

        early, rejected, sources = self._early, [], []
        while early:
            row_id, added_ms = early.oldest()
            if now_ms - added_ms <= self.early_label_ttl_ms:
                break
            _, y, _, source = early.pop_oldest()
            bad = BadInput("unknown_id", f"label for id {row_id!r} waited {now_ms - added_ms} ms "
                                         f"(limit {self.early_label_ttl_ms}) and its row never came")  # fmt: skip
            rejected.append((bad, label_message(row_id, y, self.target)))
            sources.append(source)
        self.counters["labels_orphan"] += len(rejected)
        return self._release(out_ids, out_slots, rejected, sources, ordered=False)

    # ------------------------------------------------------------ state
    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (no objects: loads with allow_pickle=False), every sequence oldest first.

        Remembered ids are stored as their fingerprints (``done_fingerprints``, (n, 2) int64, with
        ``done_fingerprint_version``); a state of an older version holds the ids (``done_ids``)
        instead, which ``from_state`` reads too."""
        slots = np.fromiter(self._pending.values(), dtype=np.int64, count=len(self._pending))
        early = self._early.items()
        early_y = self._y_array([y for _, y, _, _ in early])
        done_fps, done_kinds = self._done.to_arrays()
        return {
            "pending_ids": _id_array(self._pending),
            "pending_X": self._X[slots],
            "pending_batch_seq": self._seq[slots],
            "pending_added_ms": self._added_ms[slots],
            "early_ids": _id_array([row_id for row_id, _, _, _ in early]),
            "early_Y": early_y,
            "early_added_ms": np.array([t for _, _, t, _ in early], dtype=np.int64),
            "done_fingerprints": done_fps,
            "done_fingerprint_version": np.array(FINGERPRINT_VERSION, dtype=np.int64),
            "done_kind": done_kinds,
            "counter_names": _id_array(self.counters),
            "counter_values": np.fromiter(self.counters.values(), dtype=np.int64, count=len(self.counters)),
        }

    @classmethod
    def from_state(cls, state, **kwargs) -> JoinBuffer:
        """A buffer equal to the one that wrote ``state`` (kwargs as for __init__). Limits that
        shrank since are enforced by the next add (evictions are returned and counted then)."""
        buf = cls(**kwargs)
        ids = [str(s) for s in state["pending_ids"].tolist()]
        X = np.asarray(state["pending_X"], dtype=np.float64)
        n = len(ids)
        seq, added = np.asarray(state["pending_batch_seq"]), np.asarray(state["pending_added_ms"])
        if X.shape != (n, buf.n_features) or seq.shape != (n,) or added.shape != (n,):
            raise ValueError(f"inconsistent pending rows in state: {n} ids, X {X.shape}, n_features {buf.n_features}")
        buf._grow(n)
        buf._X[:n], buf._seq[:n], buf._added_ms[:n] = X, seq, added
        buf._high = n
        if n:
            buf._add_pending(ids, list(range(n)))

        early_ids = [str(s) for s in state["early_ids"].tolist()]
        early_y, early_ms = np.asarray(state["early_Y"]), np.asarray(state["early_added_ms"])
        if early_y.shape != (len(early_ids),) + buf._no_y.shape[1:]:
            raise ValueError(f"early labels in state of shape {early_y.shape} do not fit {buf.target}")
        if early_ms.shape != (len(early_ids),):
            raise ValueError("inconsistent early labels in state")
        for row_id, y, added_ms in zip(early_ids, early_y.tolist(), early_ms.tolist()):
            buf._early.add(row_id, y, added_ms, None)

        if "done_fingerprints" in state:
            version = int(np.asarray(state.get("done_fingerprint_version", -1)))
            if version != FINGERPRINT_VERSION:
                raise ValueError(f"remembered ids in state are fingerprints of version {version}; "
                                 f"this build reads version {FINGERPRINT_VERSION}")  # fmt: skip
            fps = np.asarray(state["done_fingerprints"])
            if fps.ndim != 2 or fps.shape[1] != 2 or fps.dtype.kind not in "iu":
                raise ValueError(f"remembered ids in state: fingerprints of shape {fps.shape} and dtype {fps.dtype}")
            fps = np.ascontiguousarray(fps).view(np.int64) if fps.dtype.itemsize == 8 else fps.astype(np.int64)
        else:  # written before fingerprints: the ids themselves
            fps = fingerprints(np.asarray(state["done_ids"]))
        kinds = np.asarray(state["done_kind"])
        if kinds.shape != (len(fps),) or not set(np.unique(kinds).tolist()) <= {LABELLED, EXPIRED}:
            raise ValueError("inconsistent remembered ids in state")
        buf._done.add_many(fps, kinds.astype(np.int8))  # oldest first: past remember_done the oldest are forgotten

        names = [str(s) for s in state["counter_names"].tolist()]
        buf.counters.update(zip(names, (int(v) for v in np.asarray(state["counter_values"]).tolist())))
        return buf


class MicroBatcher:
    """Feature rows waiting to form a batch: up to ``max_rows``, or whatever is there once
    the oldest row has waited ``max_latency_ms``.

    >>> import numpy as np
    >>> mb = MicroBatcher(max_rows=3, max_latency_ms=50)
    >>> mb.add(FeatureRows(["a", "b"], np.zeros((2, 1)), np.array([-1, -1])), now_ms=0)
    >>> mb.due(10), mb.time_to_due(10), mb.due(50)
    (False, 40, True)
    >>> mb.take().ids, len(mb)
    (['a', 'b'], 0)
    """

    def __init__(self, max_rows: int, max_latency_ms: int):
        if max_rows < 1 or max_latency_ms < 0:
            raise ValueError(f"need max_rows >= 1 and max_latency_ms >= 0, got {max_rows}, {max_latency_ms}")
        self.max_rows = int(max_rows)
        self.max_latency_ms = int(max_latency_ms)
        self._chunks: deque[tuple[FeatureRows, int]] = deque()  # (rows, arrival ms), oldest first
        self._n = 0
        self._n_features = 0  # remembered for the shape of an empty state

    def __len__(self) -> int:
        return self._n

    def add(self, rows: FeatureRows | None, now_ms: int) -> None:
        if rows is None or len(rows) == 0:
            return
        self._chunks.append((rows, int(now_ms)))
        self._n += len(rows)
        self._n_features = rows.X.shape[1]

    def due(self, now_ms: int) -> bool:
        """Full, or the oldest row has waited at least max_latency_ms."""
        return self._n >= self.max_rows or (self._n > 0 and now_ms - self._chunks[0][1] >= self.max_latency_ms)

    def time_to_due(self, now_ms: int) -> int | None:
        """Milliseconds until due (0 when due), None when empty: a poll timeout."""
        if self._n == 0:
            return None
        if self._n >= self.max_rows:
            return 0
        return max(0, self._chunks[0][1] + self.max_latency_ms - int(now_ms))

    def take(self) -> FeatureRows | None:
        """The oldest rows, at most max_rows (whether due or not), or None when empty."""
        if self._n == 0:
            return None
        if self._n <= self.max_rows:  # all of it (one-row messages: 256 chunks), without a loop per chunk
            parts = [rows for rows, _ in self._chunks]
            self._chunks.clear()
        else:
            parts, need = [], self.max_rows
            while need and self._chunks:
                rows, arrived = self._chunks[0]
                n = len(rows.ids)
                if n <= need:
                    self._chunks.popleft()
                    parts.append(rows)
                    need -= n
                else:
                    parts.append(_slice(rows, 0, need))
                    self._chunks[0] = (_slice(rows, need, n), arrived)
                    need = 0
        batch = parts[0] if len(parts) == 1 else _concat(parts)
        self._n -= len(batch.ids)
        return batch

    def to_state(self) -> dict[str, np.ndarray]:
        rows = _concat([r for r, _ in self._chunks]) if self._chunks else None
        arrival = [t for r, t in self._chunks for _ in range(len(r))]
        return {
            "ids": _id_array(rows.ids if rows else []),
            "X": rows.X if rows else np.empty((0, self._n_features)),
            "ts": rows.ts if rows else np.empty(0, dtype=np.int64),
            "arrival_ms": np.array(arrival, dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state, **kwargs) -> MicroBatcher:
        mb = cls(**kwargs)
        ids = [str(s) for s in state["ids"].tolist()]
        X = np.ascontiguousarray(state["X"], dtype=np.float64)
        ts, arrival = np.asarray(state["ts"], dtype=np.int64), np.asarray(state["arrival_ms"], dtype=np.int64)
        if X.ndim != 2 or len(X) != len(ids) or ts.shape != (len(ids),) or arrival.shape != (len(ids),):
            raise ValueError("inconsistent micro-batcher state")
        mb._n_features = X.shape[1]
        # one chunk per run of equal arrival times (batch boundaries depend only on row counts)
        starts = [0] + [i for i in range(1, len(ids)) if arrival[i] != arrival[i - 1]] + [len(ids)]
        for a, b in zip(starts[:-1], starts[1:]):
            if b > a:
                mb.add(FeatureRows(ids[a:b], X[a:b], ts[a:b].copy()), int(arrival[a]))
        return mb


def _slice(rows: FeatureRows, a: int, b: int) -> FeatureRows:
    return FeatureRows(rows.ids[a:b], rows.X[a:b], rows.ts[a:b])


def _concat(parts: list[FeatureRows]) -> FeatureRows:
    ids = [row_id for p in parts for row_id in p.ids]
    return FeatureRows(ids, np.concatenate([p.X for p in parts]), np.concatenate([p.ts for p in parts]))
