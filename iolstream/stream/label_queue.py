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


class LabelQueue:
    """Joined rows in arrival order: (payload (j, w), Y, batch_seq) chunks, ``rows`` in all, the oldest
    queued at ``since_ms`` (None: empty)."""

    def __init__(self, label_batch_rows: int, max_latency_ms: int):
        self.label_batch_rows, self.max_latency_ms = label_batch_rows, max_latency_ms
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.rows = 0
        self.since_ms: int | None = None

    def add(self, payload: np.ndarray, y: np.ndarray, batch_seq, now_ms: int) -> None:
        """Queue joined rows: their payloads, labels and the batch each was predicted in."""
        if len(y) == 0:
            return
        self.chunks.append((payload, y, np.asarray(batch_seq, dtype=np.int64)))
        self.rows += len(y)
        if self.since_ms is None:
            self.since_ms = now_ms

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

    def take(self, everything: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(payloads, labels, batch_seqs) of one label batch: all queued rows, or (``everything`` False) all
        but the trailing rows of the batch queued last when the queue spans several batches."""
        payload = np.concatenate([q[0] for q in self.chunks])
        y = np.concatenate([q[1] for q in self.chunks])
        seqs = np.concatenate([q[2] for q in self.chunks])
        cut = len(seqs)
        if not everything and seqs[0] != seqs[-1]:
            cut = len(seqs) - int(np.argmax(seqs[::-1] != seqs[-1]))  # where the trailing run begins
        if cut < len(seqs):
            self.chunks = [(payload[cut:], y[cut:], seqs[cut:])]
            self.rows = len(seqs) - cut
            return payload[:cut], y[:cut], seqs[:cut]
        self.chunks, self.rows, self.since_ms = [], 0, None
        return payload, y, seqs

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The queued rows as the state's ``queue/*`` arrays (none when empty)."""
        if not self.chunks:
            return {}
        return {
            "queue/payload": np.concatenate([q[0] for q in self.chunks]),
            "queue/y": np.concatenate([q[1] for q in self.chunks]),
            "queue/seq": np.concatenate([q[2] for q in self.chunks]),
        }

    def load_arrays(self, arrays: dict, since_ms: int | None) -> None:
        """Back from ``to_arrays`` (and the age the manifest kept)."""
        if "queue/payload" in arrays:
            self.chunks = [(arrays["queue/payload"], arrays["queue/y"], arrays["queue/seq"])]
            self.rows = len(arrays["queue/y"])
            self.since_ms = since_ms
