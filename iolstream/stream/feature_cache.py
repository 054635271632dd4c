"""The features of recently predicted batches, kept for their labels (bounded by bytes).

A label batch that is exactly one observed batch, in order, reuses that batch's features and emitted
predictions instead of recomputing them. Never a gather from cached batches: BLAS gives other bits for
other shapes, and a run restored from a snapshot (empty cache) must continue bitwise.
"""

from __future__ import annotations

import numpy as np

FEATURE_CACHE_BYTES = 256 * 2**20  # features of recent batches kept for their labels (bounded)


class FeatureCache:
    """batch_seq -> (features_t, emitted class indices / values) of recent batches, oldest first."""

    def __init__(self, max_bytes: int = FEATURE_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.entries: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.bytes = 0

    def put(self, seq: int, features_t: np.ndarray, emitted: np.ndarray) -> None:
        """Keep batch ``seq``'s features and predictions; the oldest batches go when over ``max_bytes``."""
        self.entries[seq] = (features_t, emitted)
        self.bytes += features_t.nbytes
        while self.bytes > self.max_bytes and self.entries:
            self.drop(next(iter(self.entries)))

    def drop(self, seq: int) -> None:
        """Rows of batch ``seq`` settled (joined and folded, expired or evicted), or the cache is full:
        drop its entry. The cached features are reused only by a fold of the whole batch at
        once (``whole_batch``), which can no longer happen once any of its rows has settled; kept
        until the last row settled, a batch with one row whose label never comes stayed cached until
        that row expired, and such batches filled the cache to its bound."""
        entry = self.entries.pop(seq, None)
        if entry is not None:
            self.bytes -= entry[0].nbytes

    def drop_batches(self, seqs) -> None:
        """Drop the entries of every batch in ``seqs`` (its rows settled)."""
        for seq in np.unique(np.asarray(seqs)).tolist():
            self.drop(seq)

    def whole_batch(self, seqs: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(features_t, emitted) of the batch the rows (``seqs``, ``positions`` in their batch) are, whole and
        in order; None if they are not one whole cached batch. Their batches' entries are dropped either
        way."""
        first = int(seqs[0])
        entry = self.entries.get(first)
        whole = (
            entry is not None
            and entry[0].shape[2] == len(seqs)
            and (seqs == first).all()
            and (positions == np.arange(len(seqs))).all()
        )
        self.drop_batches(seqs)
        return entry if whole else None
