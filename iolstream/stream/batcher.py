"""The micro-batcher: feature rows wait here until a batch is full or its oldest row is due."""

from __future__ import annotations

from collections import deque

import numpy as np

from iolstream.stream.rows import FeatureRows, events_array, events_from_array
from iolstream.stream.stores import id_array


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
        n = 0 if rows is None else len(rows.ids)
        if not n:
            return
        self._chunks.append((rows, int(now_ms)))
        self._n += n
        self._n_features = rows.X.shape[1]

    def due(self, now_ms: int) -> bool:
        """Full, or the oldest row has waited at least max_latency_ms."""
        return self._n >= self.max_rows or (
            self._n > 0 and now_ms - self._chunks[0][1] >= self.max_latency_ms
        )

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
                    parts.append(rows.take(0, need))
                    self._chunks[0] = (rows.take(need, n), arrived)
                    need = 0
        batch = parts[0] if len(parts) == 1 else FeatureRows.concat(parts)
        self._n -= len(batch.ids)
        return batch

    def drop(self, ids) -> list[str]:
        """Take the rows of ``ids`` out (forgotten on request before they were predicted); returns the ids taken.
        The others keep their order and arrival times."""
        wanted = set(ids)
        if not self._n or not any(i in wanted for rows, _ in self._chunks for i in rows.ids):
            return []
        dropped, chunks = [], deque()
        for rows, arrived in self._chunks:
            keep = [i for i, row_id in enumerate(rows.ids) if row_id not in wanted]
            dropped += [row_id for row_id in rows.ids if row_id in wanted]
            if len(keep) == len(rows):
                chunks.append((rows, arrived))
            elif keep:
                chunks.append(
                    (FeatureRows([rows.ids[i] for i in keep], rows.X[keep], rows.ts[keep]), arrived)
                )
        self._chunks, self._n = chunks, self._n - len(dropped)
        return dropped

    def to_state(self) -> dict[str, np.ndarray]:
        rows = FeatureRows.concat([r for r, _ in self._chunks]) if self._chunks else None
        arrival = [t for r, t in self._chunks for _ in range(len(r))]
        state = {
            "ids": id_array(rows.ids if rows else []),
            "X": rows.X if rows else np.empty((0, self._n_features)),
            "ts": rows.ts if rows else np.empty(0, dtype=np.int64),
            "arrival_ms": np.array(arrival, dtype=np.int64),
        }
        if rows is not None and rows.events is not None:  # named-field rows: their events
            state["events"] = events_array(rows.events)
        return state

    @classmethod
    def from_state(cls, state, **kwargs) -> MicroBatcher:
        mb = cls(**kwargs)
        ids = [str(s) for s in state["ids"].tolist()]
        X = np.ascontiguousarray(state["X"], dtype=np.float64)
        ts, arrival = np.asarray(state["ts"], dtype=np.int64), np.asarray(state["arrival_ms"], dtype=np.int64)
        events = events_from_array(state["events"]) if "events" in state else None
        if X.ndim != 2 or len(X) != len(ids) or ts.shape != (len(ids),) or arrival.shape != (len(ids),):
            raise ValueError("inconsistent micro-batcher state")
        if events is not None and len(events) != len(ids):
            raise ValueError("inconsistent micro-batcher state: events")
        mb._n_features = X.shape[1]
        # one chunk per run of equal arrival times (batch boundaries depend only on row counts)
        starts = [0] + [i for i in range(1, len(ids)) if arrival[i] != arrival[i - 1]] + [len(ids)]
        for a, b in zip(starts[:-1], starts[1:]):
            if b > a:
                part = None if events is None else events[a:b]
                mb.add(FeatureRows(ids[a:b], X[a:b], ts[a:b].copy(), part), int(arrival[a]))
        return mb
