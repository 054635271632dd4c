"""The join buffer's stores: feature rows waiting for their label (``PendingRows``), labels that came
before their row (``EarlyLabels``), each with its slots in arrival order (``ArrivalOrder``).
Pure logic over preallocated arrays; memory per entry is documented in each class.
"""

from __future__ import annotations

import numpy as np


def id_array(ids) -> np.ndarray:
    """Ids as a fixed-width numpy unicode array (a snapshot loads it with allow_pickle=False)."""
    return np.array(list(ids), dtype=str) if ids else np.empty(0, dtype="U1")


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
        """Bytes of its arrays."""
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
        """Take the entry of ``slot`` out of the order."""
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


class PendingRows:
    """Feature rows waiting for their label, oldest first: a plain dict ``index`` id -> slot (insertion =
    arrival order) over growable preallocated arrays ``X`` (n, k) float64, ``seq`` / ``added_ms`` (n,)
    int64 (the batch and ms each row was added in), ``ids`` (n,) object (None when free), and an
    ``ArrivalOrder`` for the oldest-first scans. Slots are reused; the arrays grow up to ``max_rows``.

    Slots are handed out by ``take_slots`` / ``take_one``, written by ``fill``, entered by ``add``;
    a row taken out of ``index`` (joined, expired, evicted) gives its slot back by ``release``.

        >>> rows = PendingRows(n_features=1, max_rows=10)
        >>> slots = rows.take_slots(2); rows.fill(slots, np.array([[1.0], [2.0]]), 7, 100); rows.add(["a", "b"], slots)
        >>> rows.expire(now_ms=150, batch_seq=9, ttl_ms=None, ttl_batches=1), len(rows)
        ((['a', 'b'], [0, 1]), 0)
        >>> X, seq = rows.release([0, 1], ordered=False); X.tolist(), seq.tolist()
        ([[1.0], [2.0]], [7, 7])
    """

    def __init__(self, n_features: int, max_rows: int):
        self.index: dict[str, int] = {}  # id -> slot, in arrival order
        self.order = ArrivalOrder()  # the slots, oldest first
        self.max_rows = int(max_rows)
        self.free: list[int] = []  # slots released by joined / expired rows
        self.high = 0  # slots [0, high) have been handed out at least once
        capacity = min(self.max_rows, 1024)
        self.X = np.empty((capacity, int(n_features)))
        self.seq = np.empty(capacity, dtype=np.int64)
        self.added_ms = np.empty(capacity, dtype=np.int64)
        self.ids = np.empty(capacity, dtype=object)  # per slot: the pending row's id, None when free

    def __len__(self) -> int:
        return len(self.index)

    def _grow(self, needed: int) -> None:
        capacity = len(self.seq)
        if needed <= capacity:
            return
        capacity = max(needed, min(2 * capacity, self.max_rows))
        for name in ("X", "seq", "added_ms", "ids"):
            old = getattr(self, name)
            new = np.empty((capacity,) + old.shape[1:], dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def take_slots(self, n: int) -> list[int]:
        """n free slots: released ones first, then fresh ones (``fill`` grows the arrays to fit)."""
        free = self.free
        reuse = min(n, len(free))
        slots = free[len(free) - reuse :]
        del free[len(free) - reuse :]
        if reuse < n:
            slots.extend(range(self.high, self.high + n - reuse))
            self.high += n - reuse
        return slots

    def take_one(self) -> int:
        """One free slot: the last released one, else a fresh one."""
        if self.free:
            return self.free.pop()
        self.high += 1
        return self.high - 1

    def fill(self, slots: list[int], X: np.ndarray, batch_seq: int, now_ms: int) -> None:
        """Write (n, k) rows ``X`` added in ``batch_seq`` at ``now_ms`` into n taken slots."""
        self._grow(self.high)
        rows = np.array(
            slots, dtype=np.intp
        )  # one conversion for the three scatters (a list is converted each time)
        self.X[rows] = X
        self.seq[rows] = batch_seq
        self.added_ms[rows] = now_ms

    def add(self, ids: list[str], slots: list[int]) -> None:
        """Slots (already filled) of new pending rows, in arrival order."""
        rows = np.array(slots, dtype=np.intp)
        self.index.update(zip(ids, slots))
        self.ids[rows] = (
            ids if len(ids) > 1 else ids[0]
        )  # (a list of one str would not be taken as one object)
        self.order.push_many(rows)

    def release(self, slots: list[int], *, ordered: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(X (n, k), batch_seq (n,)) of rows already taken out of ``index``, copied out, and their slots
        freed; ``ordered``: still in the arrival order (False: popped from it already)."""
        rows = np.array(slots, dtype=np.intp)
        X, seq = self.X[rows], self.seq[rows]
        if ordered:
            self.order.drop(rows)
        self.ids[rows] = None
        self.free.extend(slots)
        return X, seq

    def pop_oldest(self, n: int) -> tuple[list[str], list[int]]:
        """(ids, slots) of the n oldest rows, taken out: their data stays until
        ``release(..., ordered=False)``."""
        slots = [self.order.pop() for _ in range(n)]
        ids = [str(row_id) for row_id in self.ids[slots].tolist()]
        for row_id in ids:
            del self.index[row_id]
        return ids, slots

    def expire(
        self, now_ms: int, batch_seq: int, ttl_ms: int | None, ttl_batches: int | None
    ) -> tuple[list, list[int]]:
        """(ids, slots) of the rows older than ``ttl_ms`` or ``ttl_batches``, oldest first, taken out as by
        ``pop_oldest``. The scan stops at the first young row (times do not go backwards)."""
        index, out_ids, out_slots = self.index, [], []
        while index:
            slot = self.order.oldest()
            young_ms = ttl_ms is None or now_ms - int(self.added_ms[slot]) <= ttl_ms
            young_batches = ttl_batches is None or batch_seq - int(self.seq[slot]) <= ttl_batches
            if young_ms and young_batches:
                break
            self.order.pop()
            row_id = self.ids[slot]
            del index[row_id]
            out_ids.append(row_id)
            out_slots.append(slot)
        return out_ids, out_slots

    def to_state(self) -> dict[str, np.ndarray]:
        """The rows oldest first: ``pending_ids``, ``pending_X``, ``pending_batch_seq``,
        ``pending_added_ms``."""
        slots = np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index))
        return {
            "pending_ids": id_array(self.index),
            "pending_X": self.X[slots],
            "pending_batch_seq": self.seq[slots],
            "pending_added_ms": self.added_ms[slots],
        }

    def load(self, state) -> None:
        """The rows of a ``to_state`` into this empty store."""
        ids = [str(s) for s in state["pending_ids"].tolist()]
        X = np.asarray(state["pending_X"], dtype=np.float64)
        n = len(ids)
        seq, added = np.asarray(state["pending_batch_seq"]), np.asarray(state["pending_added_ms"])
        if X.shape != (n, self.X.shape[1]) or seq.shape != (n,) or added.shape != (n,):
            raise ValueError(
                f"inconsistent pending rows in state: {n} ids, X {X.shape}, n_features {self.X.shape[1]}"
            )
        self._grow(n)
        self.X[:n], self.seq[:n], self.added_ms[:n] = X, seq, added
        self.high = n
        if n:
            self.add(ids, list(range(n)))


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

    def add_many(self, ids: list[str], Y: np.ndarray, now_ms: int, source) -> None:
        """Hold the labels ``Y`` of ``ids`` (none held, each once), all from one message: as ``add`` one by
        one, the same slots in the same order, with one array write per field."""
        n, free, slots = len(ids), self._free, []
        while len(slots) < n:
            if not free:
                self._grow()
            k = min(n - len(slots), len(free))
            slots += free[-k:][::-1]  # what k pops would give
            del free[-k:]
        self.index.update(zip(ids, slots))
        rows = np.array(slots, dtype=np.intp)
        self._y[rows] = Y
        self._ms[rows] = now_ms
        for slot, row_id in zip(slots, ids):
            self._ids[slot] = row_id
            self._sources[slot] = source
        self._order.push_many(rows)

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

    def take(self, which) -> list[tuple[str, object, int, object]]:
        """(id, label, arrival ms, source) of every held label whose source ``which`` accepts, oldest first,
        taken out."""
        chosen = [item for item in self.items() if which(item[3])]
        for row_id, _, _, _ in chosen:
            self.pop(row_id)
        return chosen

    def set_sources(self, pairs) -> None:
        """(id, source) pairs: the sources of held labels (a restored store has none); ids not held are passed
        over."""
        for row_id, source in pairs:
            slot = self.index.get(row_id)
            if slot is not None:
                self._sources[slot] = source

    def load_arrays(self, state: dict, target) -> None:
        """Hold the labels of a join buffer state's ``early_*`` arrays, oldest first (``target``: what they
        must fit; their sources are not in a state)."""
        early_ids = [str(s) for s in state["early_ids"].tolist()]
        early_y, early_ms = np.asarray(state["early_Y"]), np.asarray(state["early_added_ms"])
        if early_y.shape != (len(early_ids),) + self._y.shape[1:]:
            raise ValueError(f"early labels in state of shape {early_y.shape} do not fit {target}")
        if early_ms.shape != (len(early_ids),):
            raise ValueError("inconsistent early labels in state")
        for row_id, y, added_ms in zip(early_ids, early_y.tolist(), early_ms.tolist()):
            self.add(row_id, y, added_ms, None)

    def items(self) -> list[tuple[str, object, int, object]]:
        """(id, label, arrival ms, source) of every held label, oldest first (the dict keeps arrival
        order)."""
        slots = np.fromiter(self.index.values(), dtype=np.int64, count=len(self.index))
        sources = [self._sources[s] for s in slots.tolist()]
        return list(zip(self.index, self._y[slots].tolist(), self._ms[slots].tolist(), sources))
