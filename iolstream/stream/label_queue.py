"""Rows joined with their labels, waiting to be folded into the model as one label batch.

A label batch is due when ``label_batch_rows`` rows are queued or the oldest has waited
``max_label_latency_ms`` (or a step is forced). A batch taken while the queue spans several feature
batches stops where the rows of the batch queued last begin: those stay queued (with the queue's age),
so that label batches fall on feature batches. One-row label messages one row behind their features
would otherwise fold rows 255..510, 511..766, …: never a whole batch, so never the cached features
(``stream.feature_cache``). The cut depends on the queued rows alone, never on the cache, so a restored
run folds the same groups.
"""

from __future__ import annotations

import numpy as np

from iolstream.stream.stores import id_array


class LabelQueue:
    """Joined rows in arrival order: (payload (j, w), Y, batch_seq, ids) chunks, ``rows`` in all, the oldest
    queued at ``since_ms`` (None: empty)."""

    def __init__(self, label_batch_rows: int, max_latency_ms: int):
        self.label_batch_rows, self.max_latency_ms = label_batch_rows, max_latency_ms
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = []
        self.rows = 0
        self.since_ms: int | None = None

    def add(self, payload: np.ndarray, y: np.ndarray, batch_seq, now_ms: int, ids: list[str]) -> None:
        """Queue joined rows: their payloads, labels, the batch each was predicted in, and their ids."""
        if len(y) == 0:
            return
        self.chunks.append((payload, y, np.asarray(batch_seq, dtype=np.int64), list(ids)))
        self.rows += len(y)
        if self.since_ms is None:
            self.since_ms = now_ms

    def _joined(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        payload = np.concatenate([q[0] for q in self.chunks])
        y = np.concatenate([q[1] for q in self.chunks])
        seqs = np.concatenate([q[2] for q in self.chunks])
        return payload, y, seqs, [i for q in self.chunks for i in q[3]]

    def take_ids(self, ids) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(ids, payloads, labels, batch_seqs) of the queued rows among ``ids``, taken out of the queue (a
        row forgotten on request before its label was folded in); the others stay, in order."""
        wanted = set(ids)
        if not self.rows or not any(i in wanted for q in self.chunks for i in q[3]):
            return [], np.empty((0, 0)), np.empty(0), np.empty(0, dtype=np.int64)
        payload, y, seqs, queued = self._joined()
        out = np.array([i in wanted for i in queued])
        keep = ~out
        self.chunks = [(payload[keep], y[keep], seqs[keep], [i for i, k in zip(queued, keep) if k])]
        self.rows = int(keep.sum())
        if not self.rows:
            self.chunks, self.since_ms = [], None
        return [i for i, o in zip(queued, out) if o], payload[out], y[out], seqs[out]

    def due_in(self, now_ms: int) -> int | None:
        """Milliseconds until the oldest row has waited ``max_latency_ms`` (None: empty)."""
        return None if not self.rows else max(0, self.since_ms + self.max_latency_ms - now_ms)

    def due(self, now_ms: int, *, force: bool) -> bool | None:
        """None: nothing to fold now; else whether to fold everything (forced, or the oldest is due) or not
        (``label_batch_rows`` are queued: fold up to the trailing rows of the batch queued last)."""
        if not self.rows:
            return None
        everything = force or now_ms - self.since_ms >= self.max_latency_ms
        if not everything and self.rows < self.label_batch_rows:
            return None
        return everything

    def take(self, everything: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """(payloads, labels, batch_seqs, ids) of one label batch: all queued rows, or (``everything`` False)
        all but the trailing rows of the batch queued last when the queue spans several batches."""
        payload, y, seqs, ids = self._joined()
        cut = len(seqs)
        if not everything and seqs[0] != seqs[-1]:
            cut = len(seqs) - int(np.argmax(seqs[::-1] != seqs[-1]))  # where the trailing run begins
        if cut < len(seqs):
            self.chunks = [(payload[cut:], y[cut:], seqs[cut:], ids[cut:])]
            self.rows = len(seqs) - cut
            return payload[:cut], y[:cut], seqs[:cut], ids[:cut]
        self.chunks, self.rows, self.since_ms = [], 0, None
        return payload, y, seqs, ids

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The queued rows as the state's ``queue/*`` arrays (none when empty)."""
        if not self.chunks:
            return {}
        payload, y, seqs, ids = self._joined()
        return {"queue/payload": payload, "queue/y": y, "queue/seq": seqs, "queue/ids": id_array(ids)}

    def load_arrays(self, arrays: dict, since_ms: int | None) -> None:
        """Back from ``to_arrays`` (and the age the manifest kept; a state saved before the queue kept its ids
        has none: such rows are not found by a forget request until folded in, then by the retention store)."""
        if "queue/payload" in arrays:
            n = len(arrays["queue/y"])
            ids = [str(i) for i in arrays["queue/ids"].tolist()] if "queue/ids" in arrays else [""] * n
            self.chunks = [(arrays["queue/payload"], arrays["queue/y"], arrays["queue/seq"], ids)]
            self.rows = n
            self.since_ms = since_ms
