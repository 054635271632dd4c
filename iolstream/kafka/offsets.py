"""The offset book: where each partition stands, in plain ``(topic, partition)`` keys and int offsets; the
partitions of a commit, at-least-once's or a transaction's, are made from them in one place
(``commit_partitions``).

- ``positions``: the next offset to read of every partition the state has consumed (in snapshots);
- ``committed_floor``: the group's committed offset per assigned partition; commits never go below it;
- ``replay_until``: input the group committed that the state does not hold (exactly-once, where commits run
  ahead of the snapshots: the commit strategy says so, ``replay_committed``), processed into the model again
  without emitting;
- ``ends`` / ``eof``: each assigned partition's end when it was assigned, and where its last
  end-of-partition event came (``iolstream run --stop-at-end``).

    >>> book = OffsetBook(replay_committed=True)
    >>> book.assign(("f", 0), committed=9)  # never consumed by this state: from its beginning, replaying to 9
    >>> book.replay_until, book.start(("f", 0))
    ({('f', 0): 9}, None)
    >>> book.processed(("f", 0), 8)  # the last replayed offset: the replay of ("f", 0) is over
    True
    >>> book.to_commit()  # 9 is not past the committed floor
    []
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import TopicPartition

log = logging.getLogger("iolstream.worker")

Key = tuple[str, int]


class OffsetBook:
    """Where each input partition stands: processed positions, committed floors, replay bounds, ends."""

    def __init__(
        self, *, replay_committed: bool, positions: dict[Key, int] | None = None, group: bool = False
    ):
        self.replay_committed = replay_committed  # the commit strategy's ``replays_committed``
        self.group = (
            group  # group learning: what another member committed is in the group's sums (``assign``)
        )
        self.positions: dict[Key, int] = dict(positions or {})
        self.committed_floor: dict[Key, int] = {}
        self.replay_until: dict[Key, int] = {}
        self.assigned: set[Key] = set()
        self.ends: dict[Key, int] = {}
        self.eof: dict[Key, int] = {}
        # group learning: where this member took a partition over from another (that one's commit), kept
        # through roll-backs and named in this member's commits: a state that predates the take-over resumes
        # there
        self.bases: dict[Key, int] = {}

    def past_end(self, key: Key, end: int | None) -> int | None:
        """Forget ``key``'s position when it lies past the partition's ``end`` (high watermark): offsets of
        another topic of that name (a snapshot older than topic ids), never of this one. Returns it, if so."""
        position = self.positions.get(key)
        if end is None or position is None or position <= end:
            return None
        del self.positions[key]
        return position

    def reset(self, positions: dict[Key, int]) -> None:
        """The positions of a state just loaded (a roll-back)."""
        self.positions = dict(positions)

    def metadata(self, member: str, key: Key, held: bool = False) -> str:
        """The metadata of this member's commit of ``key`` (``commit_metadata``)."""
        return commit_metadata(member, self.bases.get(key), held)

    def start(self, key: Key) -> int | None:
        """Where ``key`` resumes: the state's position (None: the partition's beginning, never read by this
        state)."""
        return self.positions.get(key)

    def assign(
        self,
        key: Key,
        committed: int | None,
        end: int | None = None,
        *,
        by_other: bool = False,
        base: int | None = None,
    ) -> None:
        """``key`` assigned, the group having committed ``committed`` for it (None: nothing). Below that, a
        commit never goes, and (``replay_committed``, exactly-once) input is replayed without emitting: a
        committed transaction emitted its outputs already. Group learning, ``by_other`` (another member committed it): that member's
        sums hold the input up to ``committed``, so this state goes on from there, never re-learning it.
        ``base``: this member's own commit names where it took the partition over; a state without the
        partition (older than the take-over) resumes there, not at the partition's beginning."""
        start = self.positions.get(key)
        if self.group and by_other and committed is not None and (start is None or committed > start):
            log.info(
                "%s[%d]: another member learned it up to %d: going on from there", key[0], key[1], committed
            )
            self.positions[key] = start = self.bases[key] = committed
        elif self.group and not by_other:
            base = self.bases.get(key, base)
            if start is None and base is not None:
                log.info(
                    "%s[%d]: taken over from another member at %d: going on from there", key[0], key[1], base
                )
                self.positions[key] = start = self.bases[key] = base
        self.assigned.add(key)
        self.eof.pop(key, None)
        if end is not None:
            self.ends[key] = end
        if committed is None:
            self.committed_floor.pop(key, None)
        else:
            self.committed_floor[key] = committed
            if start is None:
                log.warning(
                    "%s[%d]: no snapshot covers it; reading from its beginning although the group "
                    "committed offset %d",
                    key[0],
                    key[1],
                    committed,
                )
        if self.replay_committed and committed is not None and committed > (start or 0):
            self.replay_until[key] = committed
        else:
            self.replay_until.pop(key, None)

    def forget(self, key: Key) -> None:
        """``key`` revoked or lost (its position stays: it is the state's)."""
        self.assigned.discard(key)
        for book in (self.ends, self.eof, self.replay_until, self.committed_floor):
            book.pop(key, None)

    def replaying(self, key: Key, offset: int) -> bool:
        """Whether ``offset`` of ``key`` is input a committed transaction already covered."""
        until = self.replay_until.get(key)
        return until is not None and offset < until

    def processed(self, key: Key, offset: int) -> bool:
        """``offset`` of ``key`` is in the state now; True when that ended the partition's replay."""
        self.positions[key] = offset + 1
        until = self.replay_until.get(key)
        if until is not None and offset + 1 >= until:
            del self.replay_until[key]
            log.info("%s[%d]: replayed up to the committed offset %d", key[0], key[1], offset + 1)
            return True
        return False

    def to_commit(self) -> list[tuple[str, int, int]]:
        """The positions of the assigned partitions past the group's committed offset: a commit never
        moves an offset backwards (a partition being replayed is left out)."""
        return [
            (t, p, o)
            for (t, p), o in sorted(self.positions.items())
            if (t, p) in self.assigned and o > self.committed_floor.get((t, p), -1)
        ]

    def committed(self, offsets) -> None:
        """``(topic, partition, offset)`` committed: the new floor."""
        for t, p, o in offsets:
            self.committed_floor[(t, p)] = o

    def at_end(self, queued) -> bool:
        """Every assigned partition has reached the end it had when assigned, and none has messages
        ``queued(key)`` unprocessed. Past transaction markers a position stays below the end: the
        end-of-partition event's offset counts then."""
        if not self.assigned:
            return False
        for key in self.assigned:
            end = self.ends.get(key)
            if end is None or max(self.positions.get(key, -1), self.eof.get(key, -1)) < end or queued(key):
                return False
        return True


def drop_other_topics(positions: dict[Key, int], saved: dict[str, str], now: dict[str, str]) -> list[str]:
    """Forget the ``positions`` of every topic whose id ``now`` differs from the one they were ``saved`` with: a
    topic deleted and created again under its name (its offsets are not the old ones). Returns those topics.

    >>> positions = {("f", 0): 9, ("l", 0): 4}
    >>> drop_other_topics(positions, {"f": "id-1", "l": "id-2"}, {"f": "id-3", "l": "id-2"}), positions
    (['f'], {('l', 0): 4})
    """
    other = sorted(t for t, i in saved.items() if t in now and now[t] != i)
    for key in [k for k in positions if k[0] in other]:
        del positions[key]
    return other


def commit_partitions(
    offsets: list[tuple[str, int, int]], metadata: Callable[[tuple[str, int]], str] | None
) -> list[TopicPartition]:
    """The partitions of a commit, the consumer's (at-least-once) or the transaction's (exactly-once):
    ``(topic, partition, offset)`` each, with group learning the metadata naming the member that committed
    it (``Assignment.by_other`` reads it back) and where it took the partition over (``OffsetBook.assign``).

    >>> [(tp.topic, tp.offset, tp.metadata) for tp in commit_partitions([("f", 0, 7)], lambda key: "w1")]
    [('f', 7, 'w1')]
    """
    if metadata is None:
        return [TopicPartition(t, p, o) for t, p, o in offsets]
    return [TopicPartition(t, p, o, metadata=metadata((t, p))) for t, p, o in offsets]


HELD = "held"


def commit_metadata(member: str, base: int | None, held: bool = False) -> str:
    """``member``, or ``member/base`` for a partition this member took over from another at offset ``base``
    (member ids have no '/'); ``held``: the member had predicted none of its rows yet, all held for the group's
    warm-up scaling (``/held`` at the end; ``kafka.relearn`` owes their predictions after a restart)."""
    text = member if base is None else f"{member}/{base}"
    return f"{text}/{HELD}" if held else text


def parse_metadata(text: str | None) -> tuple[str, int | None]:
    """(member, base) of a commit's metadata (``commit_metadata``); other metadata is (the text, None).

    >>> parse_metadata("w1/200"), parse_metadata("w1"), parse_metadata(None), parse_metadata("a/b")
    (('w1', 200), ('w1', None), ('', None), ('a/b', None))
    >>> parse_metadata("w1/200/held"), parse_metadata("w1/held")
    (('w1', 200), ('w1', None))
    """
    text = text or ""
    rest = text[: -len(HELD) - 1] if held_at_commit(text) else text
    member, slash, base = rest.rpartition("/")
    return (member, int(base)) if slash and base.isdigit() else (rest, None)


def held_at_commit(text: str | None) -> bool:
    """Whether a commit's metadata says its member had predicted none of its rows yet (``commit_metadata``).

    >>> held_at_commit("w1/200/held"), held_at_commit("w1/held"), held_at_commit("w1/200"), held_at_commit(None)
    (True, True, False, False)
    """
    text = text or ""
    return text.endswith("/" + HELD) and len(text) > len(HELD) + 1


def fmt(offsets: dict) -> str:
    """Positions as ``topic[partition]@offset``, sorted, for log lines (``@beginning`` for librdkafka's
    OFFSET_BEGINNING, -2).

    >>> fmt({("f", 1): 7, ("f", 0): -2})
    'f[0]@beginning, f[1]@7'
    """
    return ", ".join(f"{t}[{p}]@{'beginning' if o == -2 else o}" for (t, p), o in sorted(offsets.items()))
