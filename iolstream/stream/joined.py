"""What the join buffer hands back: rows joined with their labels (``JoinResult``) and rows that left
unlabelled (``ExpireResult``), with the dead letters of the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from iolstream.stream.rows import BadInput


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
