"""A bounded FIFO memory of ids, in fixed memory: 128-bit fingerprints in a NumPy ring, with an index.

The join buffer remembers the last ``capacity`` ids that were labelled or expired (docs/design.md §5), to
tell a duplicate label or a duplicate row from a new one. Kept as an ``OrderedDict[str, int]`` that
memory grew with the stream until the FIFO was full, to ~200 bytes per id (the dict, its linked
list and the id strings; ~40 MB at the default 200,000), and its resizes doubled it for a moment.
Here it is allocated once, whatever the stream does:

- a ring of ``capacity`` fingerprints (two int64 each) and kinds (int8), oldest first from ``head``;
- an open-addressing index (linear probing, backward-shift deletion, no tombstones) of int32 ring
  positions, a power of two with at least twice ``capacity`` slots (load ≤ ½);

so 17 + 8 to 16 bytes per id: 5.5 MB for 200,000 ids, 27 bytes per id on average.

Fingerprints. An id is hashed from its Unicode code points (as NumPy's fixed-width ``U`` dtype
holds them; ids never contain NUL, see ``codec``) by two independent lanes, each a sponge over a
bijective 64-bit mixer (MurmurHash3's and SplitMix64's finalisers) seeded differently, finished
with the length. Two ids that differ in one code point never collide in a lane. The fingerprint
is a function of the id alone, so it is stable across processes and machines and goes into
snapshots in place of the id. Two different ids share a fingerprint with probability ~2⁻¹²⁸, so
a new id is mistaken for a remembered one (a row dead-lettered ``duplicate_id``, a label counted
as a duplicate or rejected ``expired_id``) with probability at most ``capacity`` · 2⁻¹²⁸ —
≈ 6·10⁻³⁴ per id at 200,000 ids: never, in practice (a random bit flip in RAM is some 10²⁰ times
likelier). Ids are not adversarial input here (they are the producer's own keys), and even then
a forged collision only dead-letters that row.

    >>> mem = RecentIds(capacity=3)
    >>> mem.add_many(fingerprints(["a", "b", "c", "d"]), 1)       # "a" is pushed out
    >>> len(mem), mem.kinds(fingerprints(["a", "b", "d", "zz"])).tolist()
    (3, [0, 1, 1, 0])
    >>> h1, h2 = fingerprints(["b"])[0].tolist()
    >>> mem.get(h1, h2), mem.add(*fingerprints(["e"])[0].tolist(), 2), mem.get(h1, h2)
    (1, None, 0)
"""

from __future__ import annotations

import numba as nb
import numpy as np

FINGERPRINT_VERSION = (
    1  # stored with the fingerprints in snapshots: a change of the hash must not load silently
)
_JIT = dict(cache=True, nogil=True)
_EMPTY = -1
FINGERPRINT_BATCHES = 4  # id lists whose fingerprints RecentIds.fingerprints_of keeps


# ------------------------------------------------------------------ fingerprints
@nb.njit(**_JIT)
def _murmur_mix(h):
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@nb.njit(**_JIT)
def _splitmix_mix(h):
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


@nb.njit(**_JIT)
def _fingerprint_codes(codes):
    """``_fingerprints`` of one id given as its (length,) uint32 code points (no padding)."""
    h1 = np.uint64(0x9E3779B97F4A7C15)
    h2 = np.uint64(0x6A09E667F3BCC909)
    for j in range(len(codes)):
        c = np.uint64(codes[j])
        h1 = _murmur_mix(h1 ^ c)
        h2 = _splitmix_mix(h2 ^ (c * np.uint64(0xD6E8FEB86659FD93)))
    n_chars = np.uint64(len(codes))
    return np.int64(_murmur_mix(h1 ^ (n_chars * np.uint64(0xA0761D6478BD642F)))), np.int64(
        _splitmix_mix(h2 ^ n_chars)
    )


@nb.njit(**_JIT)
def _fingerprints(codes, out):
    """codes: (n, w) uint32 code points, zero-padded on the right; out: (n, 2) int64."""
    n, w = codes.shape
    for i in range(n):
        length = w
        while length > 0 and codes[i, length - 1] == 0:
            length -= 1
        out[i, 0], out[i, 1] = _fingerprint_codes(codes[i, :length])


@nb.njit(**_JIT)
def _fingerprint_bytes(buf):
    """``_fingerprint_codes`` of one id given as its UTF-32-LE bytes (``_code_bytes``)."""
    return _fingerprint_codes(np.frombuffer(buf, dtype=np.uint32))


def _code_bytes(row_id: str) -> bytes:
    """The id's code points as NumPy's U dtype holds them (lone surrogates too), as bytes: one-row
    messages make one id a per-row cost, and bytes cost a fraction of a NumPy str array (or of
    passing a str to Numba, whose dispatch types a str slowly)."""
    return row_id.encode("utf-32-le", "surrogatepass")


def fingerprint(row_id: str) -> tuple[int, int]:
    """The fingerprint of one id, as ``fingerprints([row_id])[0]``."""
    return _fingerprint_bytes(_code_bytes(row_id))


def fingerprints(ids) -> np.ndarray:
    """(n, 2) int64 fingerprints of the ids (str), in order."""
    arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.str_)
    if not arr.dtype.isnative:  # e.g. read from a file written on a big-endian machine
        arr = arr.astype(arr.dtype.newbyteorder("="))
    out = np.empty((len(arr), 2), dtype=np.int64)
    if len(arr) and arr.dtype.itemsize:
        codes = np.ascontiguousarray(arr).view(np.uint32).reshape(len(arr), -1)
        _fingerprints(codes, out)
    elif len(arr):  # only empty strings (U0)
        _fingerprints(np.zeros((len(arr), 1), dtype=np.uint32), out)
    return out


# ------------------------------------------------------------------ the index
@nb.njit(**_JIT)
def _find(table, ring, h1, h2):
    """The ring position holding (h1, h2), or -1."""
    mask = len(table) - 1
    i = h1 & mask
    while True:
        r = table[i]
        if r == _EMPTY:
            return -1
        if ring[r, 0] == h1 and ring[r, 1] == h2:
            return r
        i = (i + 1) & mask


@nb.njit(**_JIT)
def _unindex(table, ring, r):
    """Take ring position r out of the index (backward-shift deletion keeps every probe chain whole)."""
    mask = len(table) - 1
    i = ring[r, 0] & mask
    while table[i] != r:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        s = table[j]
        if s == _EMPTY:
            break
        home = ring[s, 0] & mask
        # the entry at j may move back to the hole at i unless its home lies cyclically in (i, j]
        if (i < j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        table[i] = s
        i = j
    table[i] = _EMPTY


@nb.njit(**_JIT)
def _add(table, ring, kinds, state, h1, h2, kind):
    """Remember (h1, h2) as ``kind``; a fingerprint already there keeps its place and takes the new kind."""
    capacity = len(kinds)
    r = _find(table, ring, h1, h2)
    if r >= 0:
        kinds[r] = kind
        return
    head, size = state[0], state[1]
    if size == capacity:  # full: forget the oldest
        _unindex(table, ring, head)
        head = (head + 1) % capacity
        size -= 1
    r = (head + size) % capacity
    ring[r, 0] = h1
    ring[r, 1] = h2
    kinds[r] = kind
    mask = len(table) - 1
    i = h1 & mask
    while table[i] != _EMPTY:
        i = (i + 1) & mask
    table[i] = r
    state[0], state[1] = head, size + 1


@nb.njit(**_JIT)
def _add_many(table, ring, kinds, state, fps, new_kinds):
    for i in range(len(fps)):
        _add(table, ring, kinds, state, fps[i, 0], fps[i, 1], new_kinds[i])


@nb.njit(**_JIT)
def _kinds(table, ring, kinds, fps, out):
    for i in range(len(fps)):
        r = _find(table, ring, fps[i, 0], fps[i, 1])
        out[i] = kinds[r] if r >= 0 else 0


@nb.njit(**_JIT)
def _lookup(table, ring, kinds, state, fps, out_kinds, out_ranks):
    """Kinds (0: absent) and ranks (position from the oldest; -1: absent) of fingerprints."""
    capacity = len(kinds)
    for i in range(len(fps)):
        r = _find(table, ring, fps[i, 0], fps[i, 1])
        if r >= 0:
            out_kinds[i] = kinds[r]
            out_ranks[i] = (r - state[0]) % capacity
        else:
            out_kinds[i] = 0
            out_ranks[i] = -1


@nb.njit(**_JIT)
def _any(table, ring, fps):
    for i in range(len(fps)):
        if _find(table, ring, fps[i, 0], fps[i, 1]) >= 0:
            return True
    return False


@nb.njit(**_JIT)
def _get(table, ring, kinds, h1, h2):
    r = _find(table, ring, h1, h2)
    return kinds[r] if r >= 0 else 0


@nb.njit(**_JIT)
def _get_id(table, ring, kinds, buf):
    """``_get`` of one id's ``_code_bytes``: hashed and looked up in one call (one dispatch, not two)."""
    h1, h2 = _fingerprint_bytes(buf)
    return _get(table, ring, kinds, h1, h2)


@nb.njit(**_JIT)
def _add_id(table, ring, kinds, state, buf, kind):
    """``_add`` of one id's ``_code_bytes``: hashed and added in one call."""
    h1, h2 = _fingerprint_bytes(buf)
    _add(table, ring, kinds, state, h1, h2, kind)


class RecentIds:
    """The last ``capacity`` ids remembered, each with a kind (an int 1..127), in fixed memory.

    ``add`` / ``add_many`` remember ids in order, forgetting the oldest past ``capacity`` (an id
    already remembered keeps its place and takes the new kind, as an OrderedDict assignment);
    ``get`` / ``kinds`` answer 0 for an id not remembered. Ids are passed as fingerprints
    (``fingerprints``): a caller hashes a batch once and looks it up in one call.
    """

    def __init__(self, capacity: int):
        if capacity < 0 or capacity >= 2**31:
            raise ValueError(f"capacity must be in [0, 2**31), got {capacity}")
        self.capacity = int(capacity)
        slots = 8
        while slots < 2 * self.capacity:
            slots *= 2
        self._table = np.full(slots if self.capacity else 1, _EMPTY, dtype=np.int32)
        self._ring = np.zeros((max(self.capacity, 1), 2), dtype=np.int64)
        self._kinds = np.zeros(max(self.capacity, 1), dtype=np.int8)
        self._state = np.zeros(2, dtype=np.int64)  # head (oldest), size
        self._recent_fps: dict[
            tuple, np.ndarray
        ] = {}  # ids -> fingerprints, the last few batches (``fingerprints_of``)

    def __len__(self) -> int:
        return int(self._state[1])

    def __repr__(self) -> str:
        return f"RecentIds({len(self)} of {self.capacity})"

    @property
    def nbytes(self) -> int:
        """Bytes of the fixed arrays."""
        return self._table.nbytes + self._ring.nbytes + self._kinds.nbytes + self._state.nbytes

    def get(self, h1: int, h2: int) -> int:
        """The kind of one fingerprint (0: not remembered)."""
        if not self.capacity:
            return 0
        return int(_get(self._table, self._ring, self._kinds, h1, h2))

    def add(self, h1: int, h2: int, kind: int) -> None:
        """Remember one fingerprint as ``kind`` (the oldest is forgotten when full)."""
        if self.capacity:
            _add(self._table, self._ring, self._kinds, self._state, h1, h2, kind)

    def kinds(self, fps: np.ndarray) -> np.ndarray:
        """(n,) int8 kinds of (n, 2) fingerprints (0: not remembered)."""
        out = np.zeros(len(fps), dtype=np.int8)
        if self.capacity and len(fps):
            _kinds(self._table, self._ring, self._kinds, fps, out)
        return out

    def lookup(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """((n,) int8 kinds, (n,) int64 ranks: 0 = the oldest remembered, -1 = not remembered)."""
        kinds = np.zeros(len(fps), dtype=np.int8)
        ranks = np.full(len(fps), -1, dtype=np.int64)
        if self.capacity and len(fps):
            _lookup(self._table, self._ring, self._kinds, self._state, fps, kinds, ranks)
        return kinds, ranks

    def any(self, fps: np.ndarray) -> bool:
        """Whether any of the fingerprints is remembered."""
        return bool(self.capacity and len(self) and len(fps) and _any(self._table, self._ring, fps))

    def add_many(self, fps: np.ndarray, kinds) -> None:
        """Remember (n, 2) fingerprints in order, with one kind each (or one kind for all)."""
        if not self.capacity or not len(fps):
            return
        new_kinds = np.broadcast_to(np.asarray(kinds, dtype=np.int8), (len(fps),))
        _add_many(self._table, self._ring, self._kinds, self._state, fps, np.ascontiguousarray(new_kinds))

    def fingerprints_of(self, ids: list[str]) -> np.ndarray:
        """``fingerprints(ids)``, reusing those of the last FINGERPRINT_BATCHES id lists asked for (the
        array is shared: read it, do not change it). A batch's ids were hashed three times: screened
        on arrival, checked as its rows enter the join buffer, remembered when its labels join
        (~26 µs each for 256 ids; the lookup here ~2 µs)."""
        key = tuple(ids)
        fps = self._recent_fps.get(key)
        if fps is None:
            fps = self._recent_fps[key] = fingerprints(key)
            if len(self._recent_fps) > FINGERPRINT_BATCHES:
                del self._recent_fps[next(iter(self._recent_fps))]
        return fps

    def remember(self, ids: list[str], kind: int) -> None:
        """``add_many`` of the ids' fingerprints (one id: the scalar path, a fraction of the cost)."""
        if not self.capacity:
            return
        if len(ids) == 1:
            _add_id(self._table, self._ring, self._kinds, self._state, _code_bytes(ids[0]), kind)
        elif len(ids):
            self.add_many(self.fingerprints_of(ids), kind)

    def remembers_any(self, ids: list[str]) -> bool:
        """Whether any of the ids is remembered (one id: the scalar path)."""
        if not (self.capacity and len(self) and len(ids)):
            return False
        if len(ids) == 1:
            return _get_id(self._table, self._ring, self._kinds, _code_bytes(ids[0])) != 0
        return self.any(self.fingerprints_of(ids))

    def session(self, ids: list[str], fps: np.ndarray | None = None) -> Session | OneId:
        """Row-by-row lookups and additions over ``ids``, see ``Session``."""
        if len(ids) == 1 and fps is None:
            return OneId(self, ids[0])
        return Session(self, ids, fps)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The remembered ids as a state's ``done_*`` arrays: their fingerprints (``done_fingerprints``, (n,
        2) int64, with ``done_fingerprint_version``) and kinds, oldest first."""
        fps, kinds = self.to_arrays()
        return {
            "done_fingerprints": fps,
            "done_fingerprint_version": np.array(FINGERPRINT_VERSION, dtype=np.int64),
            "done_kind": kinds,
        }

    def load_arrays(self, state: dict, kinds: set[int]) -> None:
        """Remember what ``state_arrays`` wrote (a state older than fingerprints holds the ids themselves,
        ``done_ids``); ValueError on another fingerprint version, or kinds not in ``kinds``."""
        if "done_fingerprints" in state:
            version = int(np.asarray(state.get("done_fingerprint_version", -1)))
            if version != FINGERPRINT_VERSION:
                raise ValueError(
                    f"remembered ids in state are fingerprints of version {version}; "
                    f"this build reads version {FINGERPRINT_VERSION}"
                )
            fps = np.asarray(state["done_fingerprints"])
            if fps.ndim != 2 or fps.shape[1] != 2 or fps.dtype.kind not in "iu":
                raise ValueError(
                    f"remembered ids in state: fingerprints of shape {fps.shape} and dtype {fps.dtype}"
                )
            fps = (
                np.ascontiguousarray(fps).view(np.int64) if fps.dtype.itemsize == 8 else fps.astype(np.int64)
            )
        else:  # written before fingerprints: the ids themselves
            fps = fingerprints(np.asarray(state["done_ids"]))
        done_kinds = np.asarray(state["done_kind"])
        if done_kinds.shape != (len(fps),) or not set(np.unique(done_kinds).tolist()) <= kinds:
            raise ValueError("inconsistent remembered ids in state")
        self.add_many(fps, done_kinds.astype(np.int8))

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """((n, 2) int64 fingerprints, (n,) int8 kinds), oldest first."""
        head, size = int(self._state[0]), int(self._state[1])
        order = (head + np.arange(size)) % max(self.capacity, 1)
        return self._ring[order], self._kinds[order]


class Session:
    """Lookups and additions, one id at a time, answered exactly as if every addition took effect
    at once (the oldest ids are forgotten as the FIFO overflows, an id added is found at once),
    but with one vectorised lookup of ``ids`` up front and one ``add_many`` in ``commit``: a call
    into Numba per id would cost more than the row it serves.

    ``get`` is exact for the ids given up front and for those added since; any other id reads as
    not remembered (the caller passes every id it will ask about).
    """

    def __init__(self, mem: RecentIds, ids: list[str], fps: np.ndarray | None = None):
        self.mem = mem
        fps = mem.fingerprints_of(ids) if fps is None else fps
        kinds, ranks = mem.lookup(fps)
        self._fps = dict(zip(ids, map(tuple, fps.tolist())))
        # id -> (kind, rank in the FIFO: 0 = the oldest at the start, then one per addition)
        self._known = {i: (k, r) for i, k, r in zip(ids, kinds.tolist(), ranks.tolist()) if k}
        self._size0 = len(mem)
        self._inserts = 0
        self._added: list[tuple[tuple[int, int], int]] = []

    def _forgotten(self) -> int:
        """How many of the oldest ids the additions so far pushed out."""
        return max(0, self._size0 + self._inserts - self.mem.capacity)

    def get(self, row_id: str) -> int:
        """The kind ``row_id`` is remembered as (0: not)."""
        hit = self._known.get(row_id)
        if hit is None or hit[1] < self._forgotten():
            return 0
        return hit[0]

    def add(self, row_id: str, kind: int) -> None:
        """Remember ``row_id`` as ``kind``."""
        fp = self._fps.get(row_id)
        if fp is None:
            fp = self._fps[row_id] = tuple(fingerprints([row_id])[0].tolist())
        hit = self._known.get(row_id)
        if hit is not None and hit[1] >= self._forgotten():  # remembered: keeps its place, takes the kind
            self._known[row_id] = (kind, hit[1])
        else:
            self._known[row_id] = (kind, self._size0 + self._inserts)
            self._inserts += 1
        self._added.append((fp, kind))

    def commit(self) -> None:
        """Apply the additions to the memory (in order); the session is spent."""
        if self._added:
            fps = np.array([fp for fp, _ in self._added], dtype=np.int64).reshape(-1, 2)
            self.mem.add_many(fps, np.array([kind for _, kind in self._added], dtype=np.int8))
        self._added = []


class OneId:
    """``Session`` over a single id: its lookups and additions go straight to the memory (for one id
    that is what a session answers), without the vectorised set-up that pays off for a batch."""

    def __init__(self, mem: RecentIds, row_id: str):
        self.mem, self.row_id, self.fp = mem, row_id, fingerprint(row_id)

    def get(self, row_id: str) -> int:
        """The kind ``row_id`` is remembered as (0: not)."""
        return self.mem.get(*self.fp) if row_id == self.row_id else 0

    def add(self, row_id: str, kind: int) -> None:
        """Remember ``row_id`` as ``kind``."""
        self.mem.add(*(self.fp if row_id == self.row_id else fingerprint(row_id)), kind)

    def commit(self) -> None:
        """Nothing to flush for one id."""
        pass
