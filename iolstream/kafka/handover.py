"""Handovers of group learning: what a member waits on when its partitions go, passed on through the
model-deltas topic (docs/scaling.md).

A member holds two kinds of input its sums do not have yet: rows predicted and waiting for their labels, and
labels that came before their rows ("early": labels may come first, and during a catch-up on a loaded
machine the alignment gives up waiting for a slow features fetch). Before its partitions go (a revoke, a
stop, and at a restart, whose partitions may have moved meanwhile) it publishes them as one ``rows`` record:

- **rows waiting for labels** go to every member, which adds them to its join buffer: the member that reads
  their labels joins them, once (a labels partition has one holder); the other copies expire unlabelled;
- **labels waiting for rows**, of the partitions that go, are taken out of its state and go to the member that
  holds their labels partition next — the one that reads their rows, rows and labels being keyed alike — and
  to no other: a label adopted twice could join two copies of a handed-over row. A member that reads them
  while it does not hold the partition keeps them until its next assignment, then adopts them if the
  partition is in it and lets them go if not (``stream.group.HandedOverLabels``). The member that handed them
  over reads its own record too, and takes them back if the partition comes back to it (an eager rebalance
  revokes everything first; a member restarted after a stop).

Which records are for this member (one older than its membership is not) is ``kafka.group``'s decision.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from iolstream.stream.group import HandedOverLabels

log = logging.getLogger("iolstream.group")


class Handovers:
    """One member's handovers out and in. ``produce(kind, seq, manifest, arrays)`` puts a record on the deltas
    topic (``GroupSync``'s); ``assigned()`` gives the (topic, partition) keys the input consumer holds now.
    ``attach`` binds the processor and the group state (whose ``handovers`` numbers the records)."""

    def __init__(self, produce, assigned):
        self._produce = produce
        self.assigned = assigned
        self.labels = HandedOverLabels()  # handed-over labels until an assignment says whose they are
        self.closing = False  # a stop is under way: labels handed over now are for the members that stay
        self.processor = self.state = None

    def attach(self, processor, state) -> None:
        self.processor, self.state = processor, state
        self.labels.clear()

    def stop(self) -> None:
        """A stop is under way: labels handed over from now on are for the members that take the partitions."""
        self.closing = True
        self.labels.clear()

    # ------------------------------------------------------------ out
    def hand_over(self, partitions=None) -> None:
        """The rows waiting for labels, for whoever gets their labels; the labels waiting for rows of the
        partitions that go (``partitions``: (topic, partition) keys; None: all), taken out of the state, for
        whoever gets their partition."""
        ids, payload = self.processor.waiting_rows()
        going = None if partitions is None else set(partitions)
        label_ids, labels, sources = self.processor.hand_over_labels(
            lambda s: isinstance(s, tuple) and len(s) >= 3 and (going is None or s[:2] in going)
        )
        if not ids and not label_ids:
            return
        self.state.handovers += 1
        arrays = {"ids": np.array(ids, dtype=str), "payload": payload}
        if label_ids:
            arrays.update(
                label_ids=np.array(label_ids, dtype=str),
                label_y=labels,
                label_topics=np.array([s[0] for s in sources], dtype=str),
                label_partitions=np.array([s[1] for s in sources], dtype=np.int64),
                label_offsets=np.array([s[2] for s in sources], dtype=np.int64),
                # a keyed message's source carries its key (kafka.output keeps it on a dead letter)
                label_keyed=np.array([len(s) > 3 for s in sources], dtype=bool),
                label_keys=np.array([s[3] if len(s) > 3 else "" for s in sources], dtype=str),
            )
        self._produce("rows", self.state.handovers, {"published_ms": _now_ms()}, arrays)
        log.info(
            "handed over %d rows waiting for labels and %d labels waiting for rows",
            len(ids),
            len(label_ids),
            extra={"event": "group_handover"},
        )

    # ------------------------------------------------------------ in
    def adopt_rows(self, member: str, ids: np.ndarray, payload: np.ndarray) -> None:
        """Another member's rows waiting for labels, into the join buffer (those already here are left out)."""
        ids = [str(i) for i in ids.tolist()]
        if not ids:
            return
        added = self.processor.adopt_rows(ids, payload, _now_ms())
        log.info(
            "%d rows waiting for labels handed over by member %s (%d new here)",
            len(ids),
            member,
            added,
            extra={"event": "group_handover"},
        )

    def receive_labels(self, member: str, arrays: dict) -> None:
        """The labels of a handover (any member's, this one's too): adopted now for the partitions this member
        holds, the others kept until its next assignment."""
        if self.closing or "label_ids" not in arrays:
            return
        ids = [str(i) for i in arrays["label_ids"].tolist()]
        keyed = arrays.get("label_keyed", np.zeros(len(ids), dtype=bool)).tolist()
        keys = arrays.get("label_keys", np.full(len(ids), "", dtype=str)).tolist()
        sources = [
            (str(t), int(p), int(o), str(k)) if has_key else (str(t), int(p), int(o))
            for t, p, o, has_key, k in zip(
                arrays["label_topics"].tolist(),
                arrays["label_partitions"].tolist(),
                arrays["label_offsets"].tolist(),
                keyed,
                keys,
            )
        ]
        if len(sources) != len(ids) or len(arrays["label_y"]) != len(ids):
            raise ValueError(
                f"handed-over labels: {len(ids)} ids, {len(arrays['label_y'])} labels, {len(sources)} sources"
            )
        self.labels.add(member, ids, np.asarray(arrays["label_y"]), sources)
        self._settle(assigned=False)

    def assignment_changed(self) -> None:
        """The input consumer's assignment changed (``kafka.assignment``): handed-over labels of the partitions it
        gave here are adopted, the others let go (another member holds their partition)."""
        self._settle(assigned=True)

    def _settle(self, *, assigned: bool) -> None:
        held = self.assigned()
        adopt, let_go = self.labels.settle(lambda source: source[:2] in held, assigned=assigned)
        for member, ids, labels, sources in adopt:
            joined = self.processor.adopt_labels(ids, labels, sources, _now_ms())
            log.info(
                "%d labels waiting for their rows handed over by member %s, of partitions now here (%d joined)",
                len(ids),
                member,
                joined,
                extra={"event": "group_handover"},
            )
        for member, n in let_go:
            log.info(
                "%d labels handed over by member %s are another member's: their partitions went elsewhere",
                n,
                member,
            )


def _now_ms() -> int:
    return int(time.time() * 1000)
