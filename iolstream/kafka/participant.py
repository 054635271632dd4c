"""Group learning as a participant in the worker's moments, and its stand-in for a single worker.

The loop and the commit unit call the same hooks whether the worker learns alone or in a group; a single
worker's (``Solo``) do nothing, a group member's (``GroupMember``) move its records through the model-deltas
topic (``kafka.group``):

- at start: ``open`` (the log read to its end before any input; a member with no snapshot takes its own sums
  and positions back), ``before_joining`` (exactly-once: re-learn what it committed past its snapshot,
  ``kafka.relearn``), ``joined`` (a restart: the rows it waits on go where their labels go);
- ``on_cycle``: read the others' sums (and forget requests passed on), publish this member's when due, and the
  asks and answers of forget requests passed on;
- ``before_checkpoint``: publish the sums with the offsets they cover; ``at_stop``: before the final snapshot,
  read the others' records published before the stop; ``to_state``: the group state the snapshot holds;
- ``on_revoke``: learn what waits for the agreed warm-up scaling, hand the waiting rows and labels over;
- ``attach``: the processor of a snapshot just loaded (at start and after a roll-back).

Mid-replay (exactly-once) the sums are behind what this member published before: nothing is published then.
"""

from __future__ import annotations

from collections.abc import Callable

from iolstream.kafka import relearn
from iolstream.kafka.group import GroupSync
from iolstream.kafka.offsets import OffsetBook
from iolstream.stream.outputs import StepOutput
from iolstream.stream.processor import StreamProcessor

Tick = Callable[[], None]


class Solo:
    """A worker that learns alone: no records to read or publish, nothing to hand over."""

    agreement = None  # the warm-up scaling is this worker's own (``stream.scaler_warmup.ScalingAgreement``)

    def attach(
        self, processor: StreamProcessor, saved: tuple[dict, dict] | None, *, start: bool = False
    ) -> None:
        """The processor of the snapshot just loaded and the group state saved with it (None: none)."""

    def open(self, book: OffsetBook, timeout: float, tick: Tick) -> None:
        """At start, before the producer and the input consumer."""

    def before_joining(
        self, processor: StreamProcessor, book: OffsetBook, *, replays: bool, timeout: float
    ) -> list[StepOutput]:
        """At start, the producer made, before the input consumer joins its group. Returns the predictions owed
        (to go out with the first transaction)."""
        return []

    def joined(self) -> None:
        """At start, the input consumer made."""

    def on_cycle(self, positions: dict, *, replaying: bool) -> None:
        """After a cycle's step."""

    def before_checkpoint(self, positions: dict, *, replaying: bool) -> None:
        """First of a checkpoint."""

    def at_stop(self, timeout: float, tick: Tick) -> None:
        """Right before the final snapshot, what the worker produced committed."""

    def on_revoke(
        self, partitions, positions: dict, *, replaying: bool, step, timeout: float, tick: Tick
    ) -> None:
        """Partitions go (``partitions``: (topic, partition) keys; None: all), before their checkpoint."""

    def assignment_changed(self) -> None:
        """The input consumer's assignment changed."""

    def to_state(self) -> tuple[dict, dict] | None:
        """The group state a snapshot holds (None: none)."""
        return None

    def status(self) -> dict | None:
        """For the status line and the metrics (None: no group)."""
        return None

    def close(self) -> None:
        """The worker stops."""


class GroupMember(Solo):
    """One member of a group that shares its sums (docs/scaling.md), over ``sync`` (``kafka.group.GroupSync``)."""

    def __init__(self, cfg, output, *, assigned: Callable[[], set]):
        self.cfg = cfg
        self.sync = GroupSync(cfg, output, assigned=assigned)
        self.agreement = self.sync  # the processor proposes its warm-up scaling to the group
        self.restarted = (
            False  # a snapshot with group state was loaded at start: its partitions may have moved
        )
        # rows still held for the group's scaling when partitions went (or, restarted, in its snapshot): learned
        # later, here, while their labels go to the partitions' next owners, so handed over once learned (``on_cycle``)
        self.handover_owed = False

    def attach(self, processor, saved, *, start=False) -> None:
        if start:
            self.restarted = saved is not None
        self.sync.attach(processor, saved, start=start)

    def open(self, book, timeout, tick) -> None:
        """The group's sums (and, with no snapshot, this member's own and the positions they cover) before input."""
        self.sync.open()
        self.sync.catch_up(timeout, tick=tick)
        if self.sync.adopted_positions is not None:
            book.reset(self.sync.adopted_positions)

    def before_joining(self, processor, book, *, replays, timeout) -> None:
        """Commits that run ahead of the snapshot (exactly-once): what this member committed past it is re-learned
        here, before it joins the group and another member may take its partitions (``kafka.relearn``); also of
        partitions taken over after the snapshot (their commits say where)."""
        if not replays:
            return []
        held: set = set()
        ahead = relearn.own_commits_ahead(self.cfg, book.positions, book.bases, held)
        if not ahead:
            return []
        # every commit past the snapshot made while its rows were all held for the group's scaling (its last
        # among them): none was predicted (kafka.relearn)
        owe = held == set(ahead)
        return relearn.relearn(self.cfg, processor, book.positions, book.bases, ahead, timeout, owe=owe)

    def joined(self) -> None:
        if self.restarted:  # the rows waiting for labels go where their labels go
            self.sync.hand_over()
            # and those its snapshot still holds for the group's scaling, once learned (``on_cycle``): their
            # partitions may have gone to others meanwhile
            self.handover_owed = bool(self.sync.processor.held_rows)

    def on_cycle(self, positions, *, replaying) -> None:
        self.sync.poll()
        self.sync.forward(replaying=replaying)
        if not replaying:
            if self.handover_owed and not self.sync.processor.held_rows:
                self.handover_owed = False
                self.sync.hand_over(())  # the rows waiting for labels (no labels: no partition went now)
            self.sync.publish(positions)

    def before_checkpoint(self, positions, *, replaying) -> None:
        self.sync.forward(replaying=replaying)  # asks and answers with the input and the log they decide on
        if not replaying:  # the sums go with the offsets they cover
            self.sync.publish(positions, force=True)

    def at_stop(self, timeout, tick) -> None:
        """Its own last record committed: the others' published before the stop are read (``GroupSync.complete``)."""
        self.sync.complete(timeout, tick=tick)

    def on_revoke(self, partitions, positions, *, replaying, step, timeout, tick) -> None:
        step()  # the batcher's rows: predicted, or held for the scaling
        self.sync.settle(timeout, tick=tick)
        step()  # the held ones, once the scaling is agreed
        if not replaying:  # partitions go: so do the rows waiting for their labels
            self.sync.publish(positions, force=True)
            self.sync.hand_over(partitions)
            # the scaling not agreed in time (too few rows in the group yet): the rows still held are learned
            # later, their labels may come to the partitions' next owners, which would wait for them as early
            # labels until this member's next handover
            self.handover_owed = self.handover_owed or bool(self.sync.processor.held_rows)

    def assignment_changed(self) -> None:
        self.sync.assignment_changed()

    def to_state(self):
        return self.sync.to_state()

    def status(self):
        return self.sync.status()

    def close(self) -> None:
        self.sync.close()


def participant(cfg, output, *, assigned: Callable[[], set]) -> Solo:
    """This worker's part in group learning: a ``GroupMember`` with ``group.enabled``, else ``Solo``."""
    return GroupMember(cfg, output, assigned=assigned) if cfg.group.enabled else Solo()
