"""Forget on request in a group of two on a real broker (docs/design.md §13, docs/scaling.md).

Two members (``iolstream run`` processes) share one model over 6-partition topics, one-row messages keyed by
id; the forget topic has 6 partitions too and its requests are keyed by id, so each reaches the member that
holds the row's partition. The stream goes in two parts with 200 forget requests between them. Each member
takes the rows it holds out of its own sums and publishes its cumulative sums without them; once the input is
quiet, both members hold the model of one uninterrupted single worker on the stream without those rows (and
the closed form), and every forgotten id has a receipt naming the member that removed it.
"""

from __future__ import annotations

import time

import orjson
import pytest
import yaml
from kafka_util import consume_all, produce_json
from test_group_kafka import (  # noqa: F401 (group_rig: a fixture)
    PARTITIONS,
    Member,
    assert_group_state,
    group_rig,
    make_stream,
    ready,
    send,
    wait_settled,
)

GONE = {f"r{i}" for i in range(1000, 2800, 9)}  # 200 rows of the first part


def wait_for_receipts(
    bootstrap: str, topic: str, ids: set[str], members, timeout: float = 120.0
) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in members:
            assert m.proc.poll() is None, f"{m.member} exited:\n{m.log.read_text()[-3000:]}"
        got = [orjson.loads(v) for _, v, _, _, _ in consume_all(bootstrap, topic, timeout=1)]
        if {r["id"] for r in got} >= ids:
            return got
        time.sleep(1.0)
    raise AssertionError(f"receipts of {len(ids - {r['id'] for r in got})} ids missing after {timeout} s")


@pytest.mark.kafka
def test_two_members_forget_the_rows_they_hold_and_both_end_without_them(
    group_rig, kafka_bootstrap, tmp_path
):
    raw, path, snap_dir, topics = group_rig(False)
    topics = {
        **topics,
        "forget": topics["features"] + "-forget",
        "forget_receipts": topics["features"] + "-rcpt",
    }
    raw["topics"].update(forget=topics["forget"], forget_receipts=topics["forget_receipts"])
    path.write_text(yaml.safe_dump(raw))
    messages = make_stream()
    half = next(i for i, m in enumerate(messages) if m.kind == "features" and m.obj["id"] == "r3000")
    members = [Member(tmp_path, path, f"m{i}") for i in range(2)]
    for m in members:
        m.start()
    # both members assigned before the first row: each learns the rows of its own partitions and holds their
    # retention records (a request for a row learned by a member that no longer holds its partition is
    # refused by the one that does: docs/data-protection.md, "In a group")
    for m in members:
        m.wait(ready, "ready with its partitions")
    send(kafka_bootstrap, topics, messages[:half])
    wait_settled(members, kafka_bootstrap, raw)  # (the forget topic is made by the members: topics.create)
    produce_json(kafka_bootstrap, topics["forget"], [{"id": i} for i in sorted(GONE)], key=lambda v: v["id"])
    receipts = wait_for_receipts(kafka_bootstrap, topics["forget_receipts"], GONE, members)
    send(kafka_bootstrap, topics, messages[half:])
    wait_settled(members, kafka_bootstrap, raw)
    for m in members:
        assert m.stop() == 0, m.log.read_text()[-3000:]

    kept = [m for m in messages if m.obj["id"] not in GONE]
    assert_group_state(members, snap_dir, raw, kept, "2 members, 200 rows forgotten")
    by_member = {r["member"] for r in receipts}
    assert by_member == {"m0", "m1"}, "each member removed the rows of its own partitions"
    assert {r["id"] for r in receipts} == GONE
    assert {r["stage"] for r in receipts} <= {"labelled", "waiting"}  # (2 % of the labels never come)
    dead = consume_all(kafka_bootstrap, topics["dead_letters"], timeout=2)
    reasons = {dict(h)["iolstream.reason"].decode() for _, _, h, _, _ in dead}
    assert not reasons & {"forget_unknown_id", "forget_past_retention", "forget_already_forgotten"}, reasons
    assert PARTITIONS == 6
