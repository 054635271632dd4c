"""Group learning, exactly-once: after a restart, re-learn what this member committed past its snapshot.

Exactly-once commits the input offsets with every transaction, snapshots come less often, so a member
that dies holds, in its last state, input between its newest snapshot (S) and its last commit (C) that
no snapshot has. A single worker replays [S, C) without emitting when it gets its partitions back
(``offsets.OffsetBook``). In a group the partition may go to another member instead, which starts at C
(another member's sums hold what is below it): [S, C) would then be in nobody's sums. So at start, before
it joins the group, a member reads the committed offsets of every input partition; where the commit is its
own (commit metadata = member id) and ahead of the snapshot, it re-learns [S, C) here (a partition it took
over from another member after its snapshot: from the take-over offset its commit names),
without emitting, with a consumer of its own (outside the group). Its positions then stand at C, and
the rows of that range still waiting for labels are handed over with the next checkpoint's records.

Rows committed while held for the group's warm-up scaling were never predicted: a member commits every row it
reads, and predicts none until the group agrees the scaling. Its commits say so (``offsets.commit_metadata``,
``held``); when every commit of its ahead of the snapshot does, the predictions the re-learning makes (the
scaling agreed meanwhile) are owed, and go out with the member's first transaction (``Session.owe``).

Not covered: a member that comes back after another member has taken its partitions *and committed
past C* (it was away longer than the session timeout): its own commit is gone; the range [S, C) of
those partitions stays out of the group's sums (docs/scaling.md).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from iolstream.kafka import output
from iolstream.kafka.clients import client_conf
from iolstream.kafka.offsets import held_at_commit, parse_metadata
from iolstream.stream.outputs import StepOutput

log = logging.getLogger("iolstream.group")


def own_commits_ahead(
    cfg, positions: dict, bases: dict, held: set | None = None
) -> dict[tuple[str, int], int]:
    """{key: committed offset} of the input partitions whose group commit is this member's own and ahead of
    the state: of the snapshot's position, or, for a partition the snapshot does not hold (first read after it
    was written), of the offset the commit names as the take-over from another member
    (``offsets.commit_metadata``; ``bases`` gets it), else of the partition's beginning (this member read it
    from there). ``held`` gets the keys of those whose commit says none of the member's rows was predicted yet."""
    consumer = Consumer({**client_conf(cfg), "group.id": cfg.kafka.group_id, "enable.auto.commit": False})
    try:
        keys = set(positions)
        for topic in (cfg.topics.features, cfg.topics.labels, cfg.topics.forget):
            if topic is None:
                continue
            meta = consumer.list_topics(topic, timeout=cfg.kafka.call_timeout_seconds).topics.get(topic)
            if meta is not None and meta.error is None:
                keys.update((topic, p) for p in meta.partitions)
        tps = [TopicPartition(t, p) for t, p in sorted(keys)]
        got = consumer.committed(tps, timeout=cfg.kafka.call_timeout_seconds) if tps else []
    finally:
        consumer.close()
    ahead = {}
    for tp in got:
        key, (member, base) = (tp.topic, tp.partition), parse_metadata(tp.metadata)
        if tp.offset < 0 or member != cfg.member_id:
            continue
        if key in positions:
            if tp.offset > positions[key]:
                ahead[key] = tp.offset
        else:
            if base is not None:
                bases[key] = base
            if tp.offset > (base or 0):
                ahead[key] = tp.offset
        if key in ahead and held is not None and held_at_commit(tp.metadata):
            held.add(key)
    return ahead


def relearn(
    cfg,
    processor,
    positions: dict,
    bases: dict,
    ranges: dict[tuple[str, int], int],
    timeout: float,
    *,
    owe: bool = False,
) -> list[StepOutput]:
    """Feed ``processor`` the messages from ``positions[key]`` (else ``bases[key]``, else the partition's
    beginning) up to ``ranges[key]`` (exclusive) of every key, in timestamp order, outputs dropped (they were
    emitted before); positions move to the range ends. ``owe``: the rows were committed before any was
    predicted (``own_commits_ahead``'s ``held``), so the predictions made here are returned, to be sent (the
    dead letters were)."""
    conf = {
        **client_conf(cfg),
        "group.id": f"{cfg.kafka.group_id}.relearn.{cfg.member_id}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    }
    consumer = Consumer(conf)
    consumer.assign(
        [TopicPartition(t, p, positions.get((t, p), bases.get((t, p), OFFSET_BEGINNING))) for t, p in ranges]
    )
    msgs, left, deadline = [], dict(ranges), time.monotonic() + timeout
    try:
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                key = (msg.topic(), msg.partition())
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF and key in left:
                        del left[key]  # nothing more to read (the range ends at the end of the partition)
                    continue
                if key in left and msg.offset() < left[key]:
                    msgs.append(msg)
                if key in left and msg.offset() + 1 >= left[key]:
                    del left[key]
    finally:
        consumer.close()
    if left:
        log.warning("re-learning %s did not finish within %.0f s", sorted(left), timeout)
    features = cfg.topics.features
    now = int(time.time() * 1000)
    owed: list[StepOutput] = []

    def keep(out: StepOutput | None) -> None:
        if owe and out is not None and out.rows_predicted:
            owed.append(out.predictions_only())

    for msg in sorted(msgs, key=lambda m: (m.timestamp()[1], m.topic() != features, m.offset())):
        key, mkey = (msg.topic(), msg.partition()), msg.key()
        source = (
            (key[0], key[1], msg.offset()) if mkey is None else (*key, msg.offset(), output.key_text(mkey))
        )
        if key[0] == cfg.topics.forget:  # a forget request: the same removal again
            processor.on_forget(msg.value(), source, now, mkey)
        else:
            keep(processor.feed(msg.value(), source, now, labels=key[0] != features, key=mkey))
        positions[key] = msg.offset() + 1
    keep(processor.step(now, force=True))
    for key, end in ranges.items():
        if key not in left:
            positions[key] = max(positions[key], end)
    owed_rows = sum(o.rows_predicted for o in owed)
    if owed_rows:
        note = f"; {owed_rows} rows committed before any was predicted are predicted now (sent with the next output)"
    elif owe:
        note = "; none of its rows predicted yet: they wait for the group's scaling"
    else:
        note = ""
    log.info(
        "re-learned %d messages this member had committed past its snapshot: %s%s",
        len(msgs),
        ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(ranges.items())),
        note,
        extra={"event": "group_relearned"},
    )
    return owed
