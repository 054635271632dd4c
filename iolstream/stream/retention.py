"""The retention store: what the worker keeps of each row it learned, to take the row out again on request
(docs/design.md §13).

A row's contribution to the model can be subtracted only by recomputing it, from the row as the model saw
it. The store keeps, for the last ``rows`` rows observed (and, with ``ms``, only those younger than that),
one fixed-size record each, on disk:

    fp      (2,) int64   the id's 128-bit fingerprint (``recent_ids.fingerprints``), not the id
    seq     int64        the record's number: its place in the store (a record a restart does not cover
                         has another, and is never read as a row of the window)
    stamp   int64        the model's clock right after the row's batch was seen: its weight now, 2^(−age/h)
    at_ms   int64        when it was observed (time retention)
    status  int8         OBSERVED (seen, predicted: its Gram is in A under -F), LABELLED (its label is in c
                         too), LEFT (its Gram left with ``stream.forget_expired``: nothing of it in the model)
                         or ERASED (taken out on request)
    weight  float64      the class weight its label entered with (``model.class_weight``; 1 without, and until
                         its label comes: its Gram entered at 1)
    x       (k,) float64 the raw features, as the model saw them (its scaler is frozen: the same D again)
    y       (my,) float64 the label as it came: a class's index (my = 1) or the m regression values
    scores  (K·m,) float64 with calibrated probabilities only: each candidate's mean output for the row when its
                         label came (NaN: the candidate did not predict it), what that candidate's calibration
                         sums learned from it

so 49 + 8·k + 8·my (+ 8·K·m) bytes a row (``bytes_per_row``), in segment files of ``SEGMENT_ROWS`` records
(``seg-<first seq>.rows``, written through a memory map). In memory, an index of the window's fingerprints
(``recent_ids.RecentIds``: ~27 bytes a row, allocated at start) gives a record's number from an id.

Consistency with the snapshots. The store is written as the stream goes; a snapshot records the store's
``tail`` (the next record's number) and the rows erased since the snapshot before (``to_state``), and the
store's pages are flushed before a snapshot is written (``flush``). A worker that restarts from a snapshot
reads the store back up to that tail and rebuilds the index (``load``): records past the tail belong to
input the snapshot does not cover, which the replay reads and writes again. A row erased is marked at once
in the index; its record keeps its data until a snapshot without the row is durable (``durable``): until
then a restart from the snapshot before, whose model still holds the row, needs the data to take it out
again when the replay comes to the request. Then x, y and the stamp are zeroed (the fingerprint stays,
so that a repeated request is told apart). Segments older than the window of the newest durable snapshot
are deleted: on disk the store holds the window, the rows since that snapshot, and up to one segment more.

    >>> import tempfile
    >>> store = RetentionStore(tempfile.mkdtemp(), n_features=2, n_labels=1, rows=100)
    >>> store.append(["a", "b"], np.array([[1.0, 2.0], [3.0, 4.0]]), stamp=2, at_ms=10)
    >>> store.label(["b"], np.array([[1.0]]))
    1
    >>> status, seqs = store.find(["a", "b", "c"]); status.tolist(), seqs.tolist()
    ([1, 2, 0], [0, 1, -1])
    >>> rec = store.read(seqs[:2]); rec["x"].tolist(), rec["y"][:, 0].tolist()
    ([[1.0, 2.0], [3.0, 4.0]], [0.0, 1.0])
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iolstream.stream.recent_ids import RecentIds, fingerprints

OBSERVED, LABELLED, LEFT, ERASED = 1, 2, 3, 4  # a record's status (and the index's kind)
VACANT = 5  # a place in the window whose record a restart did not find (keeps the index in order)
STATUS_NAMES = {OBSERVED: "observed", LABELLED: "labelled", LEFT: "left", ERASED: "erased"}
SEGMENT_ROWS = 65_536  # records per segment file
OPEN_SEGMENTS = 64  # memory maps kept open (address space, not memory: 4 M rows at the default segment size)


@dataclass(frozen=True)
class RetentionConfig:
    """The ``retention`` section: how many rows (and how old) the store keeps for forget requests; used only
    when ``topics.forget`` is set. ``dir``: where (null: ``retention`` below the snapshot directory)."""

    rows: int = 1_000_000
    ms: int | None = None
    dir: str | None = None

    def __post_init__(self):
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0:
            raise ValueError(f"retention.rows: must be an integer ≥ 0, got {self.rows!r}")
        if self.rows >= 2**31:
            raise ValueError(f"retention.rows: must be below 2**31, got {self.rows!r}")
        if self.ms is not None and (isinstance(self.ms, bool) or not isinstance(self.ms, int) or self.ms < 1):
            raise ValueError(f"retention.ms: must be null or an integer ≥ 1, got {self.ms!r}")


def record_dtype(n_features: int, n_labels: int, n_scores: int = 0) -> np.dtype:
    """One record (module docstring), packed: 49 + 8·n_features + 8·n_labels (+ 8·n_scores) bytes."""
    fields = [
        ("fp", "<i8", (2,)),
        ("seq", "<i8"),
        ("stamp", "<i8"),
        ("at_ms", "<i8"),
        ("status", "i1"),
        ("weight", "<f8"),
        ("x", "<f8", (n_features,)),
        ("y", "<f8", (n_labels,)),
    ]
    if n_scores:
        fields.append(("scores", "<f8", (n_scores,)))
    return np.dtype(fields)


def record_shape(model_config) -> dict:
    """The record sizes of a model (``ModelConfig``): n_features (k), n_labels (1: a class index, or m values),
    n_scores (K·m with calibrated probabilities: each candidate's mean output for the row when labelled, what
    its calibration learned from; else 0)."""
    mc = model_config
    return {
        "n_features": mc.n_inputs,
        "n_labels": 1 if mc.task == "classification" else mc.m,
        "n_scores": len(mc.candidates) * mc.m if mc.calibrated else 0,
    }


class RetentionStore:
    """The rows of the window, on disk, with an in-memory index id -> record (module docstring).

    directory : where the segment files go (created)
    n_features, n_labels : k, and 1 (a class index) or m (regression values)
    n_scores : K·m with calibrated probabilities (``record_shape``), else 0
    rows : the window in rows (records older than the last ``rows`` are past retention)
    ms : and in time: a record observed more than ``ms`` before is past retention (None: rows only)
    """

    def __init__(
        self,
        directory,
        *,
        n_features: int,
        n_labels: int,
        rows: int,
        ms: int | None = None,
        segment_rows: int = SEGMENT_ROWS,
        n_scores: int = 0,
    ):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dtype = record_dtype(n_features, n_labels, n_scores)
        self.n_features, self.n_labels, self.n_scores = n_features, n_labels, n_scores
        self.rows, self.ms = int(rows), ms
        self.segment_rows = int(segment_rows)
        self.index = RecentIds(
            self.rows
        )  # the window's fingerprints, oldest first: rank r is record tail − n + r
        self.tail = 0  # the next record's number
        self.erased: list[int] = []  # records erased since the last snapshot (zeroed once one is durable)
        self.kept_from = 0  # the oldest record a restart from the newest durable snapshot may read
        self._maps: OrderedDict[int, np.memmap] = OrderedDict()  # segment -> its memory map, newest used last
        self._dirty: set[int] = set()
        self._new_files = False

    @property
    def bytes_per_row(self) -> int:
        """Bytes of one record on disk."""
        return self.dtype.itemsize

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return f"RetentionStore({self.dir}, {len(self)} of {self.rows} rows, tail {self.tail})"

    # ------------------------------------------------------------ segments
    def _path(self, segment: int) -> Path:
        return self.dir / f"seg-{segment * self.segment_rows:015d}.rows"

    def _segment(self, segment: int, *, create: bool = True) -> np.memmap | None:
        mm = self._maps.get(segment)
        if mm is not None:
            self._maps.move_to_end(segment)
            return mm
        path = self._path(segment)
        if not path.exists():
            if not create:
                return None
            size = self.segment_rows * self.dtype.itemsize
            with open(path, "wb") as fh:  # its blocks allocated now, not page by page as the stream writes
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fh.fileno(), 0, size)
                else:
                    fh.truncate(size)
            mm = np.memmap(path, dtype=self.dtype, mode="r+", shape=(self.segment_rows,))
            self._new_files = True
        else:
            if path.stat().st_size != self.segment_rows * self.dtype.itemsize:
                raise ValueError(
                    f"retention segment {path} has {path.stat().st_size} bytes, not a whole segment"
                )
            mm = np.memmap(path, dtype=self.dtype, mode="r+", shape=(self.segment_rows,))
        self._maps[segment] = mm
        while len(self._maps) > OPEN_SEGMENTS:
            old, old_mm = self._maps.popitem(last=False)
            if old in self._dirty:
                old_mm.flush()
                self._dirty.discard(old)
        return mm

    def _runs(self, seqs: np.ndarray):
        """(segment, offsets in it, positions in ``seqs``) for each segment the records ``seqs`` fall in."""
        segments = seqs // self.segment_rows
        for segment in np.unique(segments).tolist():
            where = np.flatnonzero(segments == segment)
            yield segment, seqs[where] - segment * self.segment_rows, where

    def _write(self, seqs: np.ndarray, records: np.ndarray, fields: tuple[str, ...] | None = None) -> None:
        """Fields of existing records (a segment deleted for its age is not made again)."""
        for segment, offsets, where in self._runs(seqs):
            mm = self._segment(segment, create=False)
            if mm is None:
                continue
            if fields is None:
                mm[offsets] = records[where]
            else:
                for name in fields:
                    mm[name][offsets] = records[name][where]
            self._dirty.add(segment)

    def _write_range(self, first: int, records: np.ndarray) -> None:
        """Records of the numbers first, first + 1, ... (slices of one or two segments)."""
        done = 0
        while done < len(records):
            segment, offset = divmod(first + done, self.segment_rows)
            n = min(len(records) - done, self.segment_rows - offset)
            self._segment(segment)[offset : offset + n] = records[done : done + n]
            self._dirty.add(segment)
            done += n

    # ------------------------------------------------------------ the stream's writes
    def append(self, ids: list[str], X: np.ndarray, *, stamp: int, at_ms: int) -> None:
        """Rows just observed (their batch predicted): one record each, OBSERVED, in order."""
        b = len(ids)
        if not b or not self.rows:
            return
        fps = self.index.fingerprints_of(ids)  # (the id lists of the last batches: hashed once)
        records = np.zeros(b, dtype=self.dtype)
        records["seq"] = seqs = np.arange(self.tail, self.tail + b)
        records["fp"], records["stamp"], records["at_ms"] = fps, stamp, at_ms
        records["status"], records["weight"], records["x"] = OBSERVED, 1.0, X
        if self.n_scores:
            records["scores"] = np.nan  # no candidate's scores until the label comes
        # an id held already is screened as a duplicate_id before, so never; should one come all the same, it is
        # not kept (a record per place keeps the index in order)
        repeated = self.index.kinds(fps) > 0
        if len(set(ids)) < b:
            repeated |= _repeated_within(fps)
        if repeated.any():
            records[repeated] = np.zeros(int(repeated.sum()), dtype=self.dtype)
            records["seq"][repeated] = seqs[repeated]
            records["fp"][repeated, 0], records["fp"][repeated, 1] = -1, -1 - seqs[repeated]
            records["status"][repeated] = VACANT
        self._write_range(self.tail, records)
        self.index.add_many(records["fp"], records["status"])
        self.tail += b

    def find(self, ids: list[str], fps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """((n,) int8 status, (n,) int64 record numbers) of ``ids`` in the window (0 and -1: not held)."""
        fps = self.index.fingerprints_of(ids) if fps is None else fps
        kinds, ranks = self.index.lookup(fps)
        seqs = np.where(ranks >= 0, self.tail - len(self.index) + ranks, -1)
        kinds = np.where(kinds == VACANT, 0, kinds).astype(np.int8)
        return kinds, np.where(kinds > 0, seqs, -1)

    def label(self, ids: list[str], y: np.ndarray, weights=None, scores=None) -> int:
        """Labels folded in: each held OBSERVED row's label (``y`` (n, my)), the class weight it entered with
        (``weights`` (n,), None: 1) and its candidates' scores (``scores`` (n, K·m), with ``n_scores``), status
        LABELLED. Returns how many were held."""
        if not self.rows or not len(ids):
            return 0
        fps = self.index.fingerprints_of(ids)
        status, seqs = self.find(ids, fps)
        held = np.flatnonzero(status == OBSERVED)
        if not held.size:
            return 0
        y = np.asarray(y, dtype=np.float64).reshape(len(ids), self.n_labels)[held]
        w = None if weights is None else np.asarray(weights, dtype=np.float64).reshape(len(ids))[held]
        if self.n_scores and scores is None:
            raise ValueError("label: scores are needed (the store keeps each candidate's scores)")
        s = None if not self.n_scores else np.asarray(scores, dtype=np.float64).reshape(len(ids), -1)[held]
        for segment, offsets, where in self._runs(seqs[held]):
            mm = self._segment(segment, create=False)
            if mm is not None:  # (not deleted for its age)
                mm["y"][offsets] = y[where]
                if w is not None:
                    mm["weight"][offsets] = w[where]
                if s is not None:
                    mm["scores"][offsets] = s[where]
                mm["status"][offsets] = LABELLED
                self._dirty.add(segment)
        self.index.add_many(fps[held], LABELLED)  # remembered already: the kind changes, the place stays
        return int(held.size)

    def left(self, ids: list[str]) -> None:
        """Rows whose Gram left the model unlabelled (``stream.forget_expired``): nothing of them remains to be
        taken out, so their data goes now (status LEFT)."""
        if not self.rows or not len(ids):
            return
        fps = fingerprints(ids)
        status, seqs = self.find(ids, fps)
        held = np.flatnonzero(status == OBSERVED)
        if held.size:
            self._zero(seqs[held], LEFT)
            self.index.add_many(fps[held], LEFT)

    def read(self, seqs: np.ndarray) -> np.ndarray:
        """The records of ``seqs`` (copies), in order; one whose segment is gone (deleted for its age,
        ``retention.ms``) comes back with ``seq`` -1 and no data."""
        seqs = np.asarray(seqs, dtype=np.int64)
        out = np.zeros(len(seqs), dtype=self.dtype)
        out["seq"] = -1
        for segment, offsets, where in self._runs(seqs):
            mm = self._segment(segment, create=False)
            if mm is not None:
                out[where] = mm[offsets]
        wrong = (out["seq"] != seqs) & (out["seq"] != -1)
        if wrong.any():
            bad = int(seqs[np.flatnonzero(wrong)[0]])
            raise ValueError(f"retention store {self.dir}: record {bad} is not where the index says")
        return out

    def past_time(self, records: np.ndarray, now_ms: int) -> np.ndarray:
        """(n,) bool: records observed more than ``ms`` before ``now_ms`` (past retention in time)."""
        if self.ms is None:
            return np.zeros(len(records), dtype=bool)
        return records["at_ms"] < now_ms - self.ms

    def erase(self, ids: list[str], seqs: np.ndarray) -> None:
        """Rows taken out of the model on request: ERASED in the index now; their records are zeroed once a
        snapshot without them is durable (``durable``)."""
        if len(ids):
            self.index.add_many(fingerprints(ids), ERASED)
            self.erased.extend(int(s) for s in np.asarray(seqs).tolist())

    def _zero(self, seqs: np.ndarray, status: int) -> None:
        """Records' data zeroed (x, y, stamp, time, weight, scores); their number and fingerprint stay."""
        records = np.zeros(len(seqs), dtype=self.dtype)
        records["status"] = status
        data = ("stamp", "at_ms", "status", "weight", "x", "y") + (("scores",) if self.n_scores else ())
        self._write(np.asarray(seqs, dtype=np.int64), records, data)

    # ------------------------------------------------------------ snapshots
    def flush(self) -> None:
        """Everything written so far onto the disk (before a snapshot that covers it is written)."""
        for segment in sorted(self._dirty):
            mm = self._maps.get(segment)
            if mm is not None:
                mm.flush()
        self._dirty.clear()
        if self._new_files:
            _fsync_dir(self.dir)
            self._new_files = False

    def to_state(self) -> dict:
        """What a snapshot keeps of the store: its tail, and the records erased since the snapshot before."""
        return {"tail": self.tail, "erased": list(self.erased)}

    def durable(self, state: dict, now_ms: int | None = None) -> None:
        """The snapshot that holds ``state`` (``to_state``) is durable: the records it names as erased are
        zeroed, segments before its window deleted, and (``retention.ms``, at ``now_ms``) whole segments older
        than the time bound (a restart's replay would refuse their rows as past retention anyway)."""
        named = set(state["erased"])
        if named:
            self._zero(np.array(sorted(named), dtype=np.int64), ERASED)
            self.flush()
            self.erased = [s for s in self.erased if s not in named]
        self.kept_from = max(0, int(state["tail"]) - self.rows)
        self._delete_before(self.kept_from)
        if self.ms is not None and now_ms is not None:
            self._delete_older_than(now_ms - self.ms)

    def _delete_older_than(self, at_ms: int) -> None:
        """Delete the whole segments (not the one written to) whose every record was observed before ``at_ms``."""
        current = self.tail // self.segment_rows
        for path in sorted(self.dir.glob("seg-*.rows")):
            segment = int(path.stem.split("-")[1]) // self.segment_rows
            if segment >= current:
                continue
            newest = self._segment(segment, create=False)[-1]
            if int(newest["at_ms"]) < at_ms and int(newest["seq"]) == (segment + 1) * self.segment_rows - 1:
                self._forget_segment(segment, path)

    def load(self, state: dict | None) -> None:
        """Back to a snapshot's ``to_state`` (None: a fresh model, nothing kept): records past its tail are
        dropped, the window's fingerprints indexed again, its erased records zeroed (again)."""
        self.close()
        self.tail = 0 if state is None else int(state["tail"])
        self.erased = []
        self.index = RecentIds(self.rows)
        for path in self.dir.glob("seg-*.rows"):
            first = int(path.stem.split("-")[1])
            if first >= self.tail or first + self.segment_rows <= self.tail - self.rows:
                path.unlink()  # past the snapshot (the replay writes it again), or before its window
        start = max(0, self.tail - self.rows)
        seqs = np.arange(start, self.tail, dtype=np.int64)
        fps = np.empty((len(seqs), 2), dtype=np.int64)
        kinds = np.full(len(seqs), VACANT, dtype=np.int8)
        for segment, offsets, where in self._runs(seqs):
            mm = self._segment(segment, create=False)
            if mm is None:
                continue
            rec = mm[offsets]
            found = rec["seq"] == seqs[where]
            fps[where[found]] = rec["fp"][found]
            kinds[where[found]] = rec["status"][found]
        vacant = kinds == VACANT
        fps[vacant, 0], fps[vacant, 1] = -1, -1 - seqs[vacant]  # never an id's: keeps every place in order
        kinds[(kinds < OBSERVED) | (kinds > ERASED)] = VACANT
        self.index.add_many(fps, kinds)
        if state is not None and state.get("erased"):
            self.durable(state)
        self.kept_from = start

    def _delete_before(self, seq: int) -> None:
        """Delete the segment files whose records all come before ``seq``."""
        for path in sorted(self.dir.glob("seg-*.rows")):
            segment = int(path.stem.split("-")[1]) // self.segment_rows
            if (segment + 1) * self.segment_rows <= seq:
                self._forget_segment(segment, path)

    def _forget_segment(self, segment: int, path: Path) -> None:
        mm = self._maps.pop(segment, None)
        self._dirty.discard(segment)
        del mm
        path.unlink(missing_ok=True)

    def close(self) -> None:
        """Flush, and let go of the memory maps (they are opened again when needed)."""
        self.flush()
        self._maps.clear()

    def disk_bytes(self) -> int:
        """Bytes of the segment files on disk (allocated, not their apparent size)."""
        return sum(p.stat().st_blocks * 512 for p in self.dir.glob("seg-*.rows"))


def scan(
    directory, ids: list[str], *, n_features: int, n_labels: int, n_scores: int = 0
) -> dict[str, list[dict]]:
    """What the segment files of a store's ``directory`` hold of ``ids``, read only (a running worker's store is
    left as it is): per id, every record with its fingerprint: its number, status name and whether its
    features and label are still there (``iolstream forget --verify``)."""
    dtype = record_dtype(n_features, n_labels, n_scores)
    wanted = {tuple(fp): row_id for row_id, fp in zip(ids, fingerprints(ids).tolist())}
    found: dict[str, list[dict]] = {row_id: [] for row_id in ids}
    for path in sorted(Path(directory).glob("seg-*.rows")):
        records = np.memmap(path, dtype=dtype, mode="r")
        hits = np.flatnonzero(np.isin(records["fp"][:, 0], [fp[0] for fp in wanted]))
        for i in hits.tolist():
            row_id = wanted.get(tuple(records["fp"][i].tolist()))
            if row_id is not None:
                rec = records[i]
                found[row_id].append(
                    {
                        "seq": int(rec["seq"]),
                        "status": STATUS_NAMES.get(int(rec["status"]), str(int(rec["status"]))),
                        "data": bool(
                            rec["x"].any()
                            or rec["y"].any()
                            or rec["stamp"]
                            or (n_scores and np.nan_to_num(rec["scores"], nan=1.0).any())
                        ),
                        "file": path.name,
                    }
                )
        del records
    return found


def _repeated_within(fps: np.ndarray) -> np.ndarray:
    """(n,) bool: fingerprints equal to an earlier one in ``fps``."""
    if len(fps) < 2:
        return np.zeros(len(fps), dtype=bool)
    _, first = np.unique(fps, axis=0, return_index=True)
    out = np.ones(len(fps), dtype=bool)
    out[first] = False
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
