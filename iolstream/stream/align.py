"""Timestamp alignment of the input partitions during catch-up (no Kafka here).

A worker started on a backlog (after downtime, or a new group on old topics) gets the features
and the labels topics in whatever order the client fetches them: the small label messages may
all come first, overflow the early-label store and be dead-lettered, or the features may run so
far ahead that pending rows are evicted before their labels come. Kafka Streams solves this by
synchronising a task's partitions (``PartitionGroup``, ``max.task.idle.ms``); so does this
class:

- messages consumed but not yet processed wait in one queue per partition, in offset order;
- the next message processed is the queue head with the smallest timestamp, so the two topics
  interleave as they were produced. Timestamps have ms resolution and a fast producer sends
  several messages per ms: ties go to the partition that was released from longest ago (they
  alternate, as a producer interleaving the topics sent them), then to the lower ``priority``;
- while an assigned partition has an empty queue but may still have data in the broker and its
  next message may be older than the candidate (the candidate's timestamp is not below the
  partition's largest timestamp seen), the candidate waits for it:
  - if the partition is known to hold data not yet consumed (``lag`` > 0), until that data comes —
    as Kafka Streams does at ``max.task.idle.ms`` = 0 — however long the fetch takes on a loaded
    machine: a backlog's small label messages, let past the features, would overflow the
    early-label store. Only a partition that cannot be fetched at all (no leader, or an open
    transaction) stops being waited for, after ``DATA_WAIT_MS`` (logged as a warning);
  - if its lag is not known (``lag`` None), at most ``max_wait_ms`` of wall-clock time;
  once given up on, messages go anyway until that partition gets data or catches up (or, its lag
  unknown, the lag becomes known), or until one queue's worth (``max_messages`` or ``max_bytes``)
  went past it: then it is waited for again. A message without a timestamp never waits;
- a partition whose queue holds more than ``max_messages`` or ``max_bytes`` is to be paused,
  and resumed once it is down to half of both, so memory stays bounded.

Live (no lag) nothing waits. ``max_wait_ms`` = 0 disables the alignment: messages are released
in arrival order, and nothing waits. What a message is (``item``) and how lag is measured are the
caller's.

    >>> a = Aligner(max_wait_ms=500, max_messages=100, max_bytes=2**20)
    >>> a.assign("features"); a.assign("labels", priority=1)
    >>> for key, offset, ts in [("labels", 0, 20), ("labels", 1, 40), ("features", 0, 10), ("features", 1, 30)]:
    ...     _ = a.add(key, offset, ts, size=1, item=f"{key}@{offset}")
    >>> [item for _, item in a.release(now_ms=0, lag=lambda key: 0, limit=10)]
    ['features@0', 'labels@0', 'features@1', 'labels@1']
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger("iolstream.align")

NO_TIME = float("-inf")  # the partition time of a partition that has shown no timestamp yet
DATA_WAIT_MS = 30_000  # the longest wait for messages known to be in the broker (then the others go on)


@dataclass
class _Partition:
    priority: int = 0
    queue: deque = field(default_factory=deque)  # (sort time, seq, offset, size, item)
    bytes: int = 0
    time: float = NO_TIME  # largest timestamp seen: its next message is not expected to be older
    next_offset: int | None = None  # the offset after the last message queued
    released: int = -1  # when its last message was released (a count of releases): ties alternate


class Aligner:
    """Per-partition queues released in timestamp order; see the module docstring.

    Parameters
    ----------
    max_wait_ms : int
        Longest wall-clock wait for an empty partition whose lag is not known (0: no alignment); one
        known to hold data in the broker is waited for until the data comes (up to ``DATA_WAIT_MS``).
    max_messages, max_bytes : int
        A partition's queue above either bound is to be paused (``to_pause``).
    """

    def __init__(self, max_wait_ms: int, max_messages: int, max_bytes: int):
        self.max_wait_ms = max_wait_ms
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.enabled = max_wait_ms > 0
        self.partitions: dict[Hashable, _Partition] = {}
        self.paused: set = set()
        self.queued = 0  # messages queued over all partitions
        self._seq = 0  # arrival order
        self._releases = 0
        # empty partition behind -> when something began to wait for it; those known to hold data
        # in the broker are in ``_for_data`` too (waited for up to DATA_WAIT_MS)
        self._wait_since: dict[Hashable, float] = {}
        self._for_data: set = set()
        # gave up waiting for these: not again until they get data or catch up, or until the messages
        # / bytes left here went past them (or, given up on while their lag was unknown, it is known):
        # key -> [messages, bytes, whether it was a wait for data]
        self._gave_up: dict[Hashable, list[int]] = {}
        self.blocked = False  # the last release stopped on a message that waits (not on its limit)
        self.counters = {"waits": 0, "timeouts": 0, "duplicates_dropped": 0, "pauses": 0}

    # ----------------------------------------------------------- assignment
    def assign(self, key, priority: int = 0) -> None:
        """Start tracking ``key`` (empty); ``priority`` breaks timestamp ties (lower first)."""
        self._drop(key)
        self.partitions[key] = _Partition(priority)

    def revoke(self, keys) -> list:
        """Forget ``keys`` and their queued messages; returns those of them paused (to resume)."""
        paused = [key for key in keys if key in self.paused]
        for key in keys:
            self._drop(key)
            self.partitions.pop(key, None)
        return paused

    def clear(self) -> list:
        """Drop every queued message (the caller seeks back); returns the paused partitions (to resume)."""
        paused = sorted(self.paused, key=repr)
        for key, part in self.partitions.items():
            self._drop(key)
            self.partitions[key] = _Partition(part.priority)
        return paused

    def _drop(self, key) -> None:
        part = self.partitions.get(key)
        if part is not None:
            self.queued -= len(part.queue)
        self.paused.discard(key)
        self._end_wait(key)
        self._gave_up.pop(key, None)

    def _end_wait(self, key) -> None:
        self._wait_since.pop(key, None)
        self._for_data.discard(key)

    # ---------------------------------------------------------------- input
    def add(self, key, offset: int, timestamp: int | None, size: int, item) -> bool:
        """Queue a consumed message (``timestamp`` in ms, None if it has none; ``size`` in bytes).

        Returns False, dropping it, if ``offset`` is below the partition's next one: a message
        delivered again (none should be, not even after a pause: the client resumes fetching
        after the last message it returned)."""
        part = self.partitions.get(key)
        if part is None:  # not assigned through ``assign``: tracked from here on
            part = self.partitions[key] = _Partition()
        if part.next_offset is not None and offset < part.next_offset:
            self.counters["duplicates_dropped"] += 1
            log.warning(
                "%s: offset %d delivered again (next expected %d): dropped", key, offset, part.next_offset
            )
            return False
        part.next_offset = offset + 1
        sort_time = NO_TIME if timestamp is None else timestamp
        part.queue.append((sort_time, self._seq, offset, size, item))
        self._seq += 1
        part.bytes += size
        self.queued += 1
        if timestamp is not None and timestamp > part.time:
            part.time = timestamp
        self._end_wait(key)  # it has data now: nothing waits for it
        self._gave_up.pop(key, None)
        return True

    # -------------------------------------------------------------- release
    def release(self, now_ms: float, lag: Callable[[Hashable], int | None], limit: int) -> list[tuple]:
        """Up to ``limit`` (key, item) in processing order; stops early where a message must wait.

        ``now_ms``: a monotonic clock in ms; ``lag(key)``: messages of ``key`` in the broker not
        yet consumed (None: unknown). It is asked for empty partitions only, at most once per call."""
        out: list[tuple] = []
        lags: dict = {}

        def lag_of(key):
            if key not in lags:
                lags[key] = lag(key)
            return lags[key]

        self.blocked = False
        while len(out) < limit and self.queued:
            key, part = self._head()
            sort_time = part.queue[0][0]
            if self.enabled and sort_time != NO_TIME and self._must_wait(key, sort_time, now_ms, lag_of):
                self.blocked = True
                break
            _, _, _, size, item = part.queue.popleft()
            part.bytes -= size
            if self._gave_up:
                self._passed(key, size)
            part.released = self._releases
            self._releases += 1
            self.queued -= 1
            out.append((key, item))
        return out

    def _head(self) -> tuple:
        """The partition whose head goes next: smallest (time, last release, priority, arrival); by
        arrival only when disabled."""
        best, best_rank = None, None
        for key, part in self.partitions.items():
            if part.queue:
                time, seq = part.queue[0][:2]
                rank = (time, part.released, part.priority, seq) if self.enabled else (seq,)
                if best_rank is None or rank < best_rank:
                    best, best_rank = (key, part), rank
        return best

    def _must_wait(self, key, sort_time: float, now_ms: float, lag_of) -> bool:
        """Whether a head with timestamp ``sort_time`` waits for an empty, lagging partition.
        Every such partition's wait starts now if it has not already (so waits run concurrently)."""
        wait = False
        for other, part in self.partitions.items():
            if other == key or part.queue or part.time > sort_time:
                continue  # has a head (ordered above) or its next message is younger (a tie may go first)
            behind = lag_of(other)
            if behind is not None and behind <= 0:  # caught up
                self._end_wait(other)
                self._gave_up.pop(other, None)
                continue
            for_data = behind is not None  # its messages are in the broker: the fetch is waited for
            if (gave_up := self._gave_up.get(other)) is not None:
                if gave_up[2] or not for_data:
                    continue  # given up on: a queue's worth goes past it first
                del self._gave_up[other]  # its lag became known: waited for again
            if other in self._wait_since and (other in self._for_data) != for_data:
                self._end_wait(other)  # the kind of wait changed: it starts again
            bound = self._bound(for_data)
            since = self._wait_since.get(other)
            if since is None:
                since = self._wait_since[other] = now_ms
                if for_data:
                    self._for_data.add(other)
                self.counters["waits"] += 1
                log.debug(
                    "waiting up to %d ms for %s (lag %s) before messages from %s",
                    bound,
                    other,
                    "unknown" if behind is None else behind,
                    key,
                )
            if now_ms - since < bound:
                wait = True
                continue
            self._end_wait(other)
            self._gave_up[other] = [self.max_messages, self.max_bytes, for_data]
            self.counters["timeouts"] += 1
            if for_data:
                log.warning(
                    "%s: waited %.0f s for %d messages the broker holds, not fetched (no leader, or an open "
                    "transaction?): up to %d messages of the other partitions go ahead, then it is waited for again",
                    other,
                    bound / 1000,
                    behind,
                    self.max_messages,
                )
            else:
                log.debug("gave up waiting for %s after %d ms", other, bound)
        return wait

    def _bound(self, for_data: bool) -> float:
        """How long a wait may last: for messages known to be in the broker, or for a partition of unknown lag."""
        return max(self.max_wait_ms, DATA_WAIT_MS) if for_data else self.max_wait_ms

    def _passed(self, key, size: int) -> None:
        """A message of ``size`` bytes from ``key`` went past the partitions given up on; those past
        a queue's worth are waited for again."""
        for other in list(self._gave_up):
            if other != key:
                budget = self._gave_up[other]
                budget[0] -= 1
                budget[1] -= size
                if budget[0] <= 0 or budget[1] <= 0:
                    del self._gave_up[other]

    def wait_ms(self, now_ms: float) -> float | None:
        """How long the caller may block for input: None if nothing is queued, 0 if queued messages
        are ready (the last release stopped on its limit), else until the first wait runs out."""
        if not self.queued:
            return None
        if not self.blocked or not self._wait_since:
            return 0.0
        ends = [since + self._bound(key in self._for_data) for key, since in self._wait_since.items()]
        return max(0.0, min(ends) - now_ms)

    # ------------------------------------------------------- flow control
    def to_pause(self) -> list:
        """Partitions whose queue went over a bound since the last call: the caller pauses them."""
        out = []
        for key, part in self.partitions.items():
            if key not in self.paused and (
                len(part.queue) > self.max_messages or part.bytes > self.max_bytes
            ):
                self.paused.add(key)
                self.counters["pauses"] += 1
                out.append(key)
        return out

    def to_resume(self) -> list:
        """Paused partitions down to half of both bounds: the caller resumes them."""
        out = []
        for key in list(self.paused):
            part = self.partitions.get(key)
            if part is None or (
                2 * len(part.queue) <= self.max_messages and 2 * part.bytes <= self.max_bytes
            ):
                self.paused.discard(key)
                out.append(key)
        return out

    def stats(self) -> dict:
        return {"queued": self.queued, "paused": sorted(map(repr, self.paused)), **self.counters}
