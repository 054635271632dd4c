"""Group learning: rows waiting for their labels change hands with their partition (no Kafka).

A label goes to the member that holds its partition *now*; the row it belongs to may have been seen by
the member that held the partition before a rebalance (or before it left for good). That member hands
its waiting rows over (``pending_rows``: ids and payloads, the Gram of each already in the group's sums
under -F) and every other member adds them to its join buffer (``adopt_rows``), so the label joins
wherever it lands and is folded in once. Rows of partitions no label will reach here simply expire
(their Gram stays, as for any row never labelled; ``stream.forget_expired`` is refused with group
learning for this reason: two members would take the same Gram out).
"""

from __future__ import annotations

import numpy as np

# A handed-over row's batch: 0 is never a batch of this processor (they count from 1), so the features of
# such rows are recomputed from x, never taken from the cache of a batch of the same number.
HANDED_OVER_BATCH = 0


def pending_rows(proc) -> tuple[list[str], np.ndarray]:
    """(ids, payloads (r, w)) of the rows in ``proc``'s join buffer (``processor.PAYLOAD`` columns)."""
    state = proc.join.to_state()
    return [str(i) for i in state["pending_ids"].tolist()], np.asarray(state["pending_X"], dtype=np.float64)


def adopt_rows(proc, ids: list[str], payload: np.ndarray, now_ms: int) -> int:
    """Add another member's waiting rows to ``proc``'s join buffer (labels already waiting for them join now).
    Rows whose id is pending or done here are left out. Returns how many were added."""
    if not ids:
        return 0
    if payload.shape != (len(ids), proc.join.n_features):
        raise ValueError(
            f"handed-over rows: payload shape {payload.shape}, expected ({len(ids)}, {proc.join.n_features})"
        )
    screened = proc.join.unseen(ids)
    if not screened:
        return 0
    keep = np.array(screened, dtype=np.int64)
    result = proc.join.add_rows(
        [ids[i] for i in screened], np.ascontiguousarray(payload[keep]), HANDED_OVER_BATCH, now_ms
    )
    proc.queue_joined(result, now_ms)
    return len(screened)
