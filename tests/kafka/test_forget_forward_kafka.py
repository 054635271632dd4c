"""Forget requests passed on in a group, on a real broker (docs/design.md §13, "A group"; docs/data-protection.md).

Member m0 learns the first part of the stream alone, holding every partition; then m1 joins and the rebalance
moves half of the partitions to it. The forget requests (keyed by id) for rows of those partitions reach m1,
which never saw the rows: it asks the group on the model-deltas topic, m0 answers that its retention store
holds them and takes them out of its own sums on reading its answer back. Ids nobody ever saw are refused once.
Afterwards both members hold the model of one worker that never learned the forgotten rows (to round-off), every
forgotten id has exactly one receipt, and no id has both a receipt and a refusal. A second test kills the
answering member as it is about to take the rows out, and the asking one as it is about to refuse, and restarts
both (at-least-once and exactly-once): still one receipt or one refusal per id.
"""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest
import yaml
from kafka_util import consume_all, produce_json
from test_forget_group_kafka import wait_for_receipts
from test_group_kafka import (  # noqa: F401 (group_rig: a fixture)
    Member,
    assert_group_state,
    assigned_in,
    group_rig,
    make_stream,
    ready,
    send,
    wait_settled,
)

GONE = {f"r{i}" for i in range(1000, 2800, 9)}  # 200 rows of the first part
NOBODY = {f"nobody-{i}" for i in range(12)}  # never seen by any member: refused, once each


def rig(group_rig, exactly_once: bool, *, session_timeout_ms: int = 10_000, wait_ms: int = 30_000):
    raw, path, snap_dir, topics = group_rig(exactly_once, session_timeout_ms=session_timeout_ms)
    topics = {
        **topics,
        "forget": topics["features"] + "-forget",
        "forget_receipts": topics["features"] + "-rcpt",
    }
    raw["topics"].update(forget=topics["forget"], forget_receipts=topics["forget_receipts"])
    raw["group"]["forward_wait_ms"] = wait_ms
    path.write_text(yaml.safe_dump(raw))
    return raw, path, snap_dir, topics


def first_alone_then_two(
    tmp_path, path, raw, topics, kafka_bootstrap, messages, half, env=None, monkeypatch=None
):
    """m0 learns the first part holding every partition; m1 joins and takes half of them."""
    m0, m1 = Member(tmp_path, path, "m0"), Member(tmp_path, path, "m1")
    start(m0, (env or {}).get("m0"), monkeypatch)
    m0.wait(ready, "ready alone")
    send(kafka_bootstrap, topics, messages[:half])
    wait_settled([m0], kafka_bootstrap, raw)
    start(m1, (env or {}).get("m1"), monkeypatch)
    m1.wait(ready, "ready with its share")
    m1.wait_log(
        lambda text: any(t == topics["forget"] for t, _ in assigned_in(text)),
        "assigned a forget partition",
        120,
    )
    wait_settled([m0, m1], kafka_bootstrap, raw)
    return m0, m1


def start(member: Member, crash: str | None, monkeypatch) -> None:
    """Start ``member``, dying at the test-only crash point ``crash`` if given (``ops.faults``)."""
    if crash:
        monkeypatch.setenv("IOLSTREAM_CRASH_AT", crash)
    try:
        member.start()
    finally:
        if crash:
            monkeypatch.delenv("IOLSTREAM_CRASH_AT")


def request_everything(kafka_bootstrap, topics) -> None:
    ids = sorted(GONE) + sorted(NOBODY)
    produce_json(kafka_bootstrap, topics["forget"], [{"id": i} for i in ids], key=lambda v: v["id"])


def refusals(kafka_bootstrap, topics, timeout=2) -> list[tuple[str, str]]:
    dead = consume_all(
        kafka_bootstrap, topics["dead_letters"], timeout=timeout, isolation_level="read_committed"
    )
    out = []
    for _, value, headers, _, _ in dead:
        reason = dict(headers)["iolstream.reason"].decode()
        if reason.startswith("forget_"):
            out.append((reason, orjson.loads(value)["id"]))
    return out


def wait_for_refusals(kafka_bootstrap, topics, members, timeout: float = 120.0) -> list[tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        got = refusals(kafka_bootstrap, topics, timeout=1)
        if {i for _, i in got} >= NOBODY:
            return got
        for m in members:
            m.alive()
        assert time.monotonic() < deadline, f"refusals missing: {NOBODY - {i for _, i in got}}"
        time.sleep(1.0)


def finish_and_check(
    members, kafka_bootstrap, raw, topics, snap_dir, messages, half, context: str, counted: bool = True
) -> None:
    """The rest of the stream, then: the group's model is the one without the forgotten rows; one receipt per
    forgotten id, one refusal per id nobody saw, never both. ``counted``: the members' metrics (this process's
    counts) show requests passed on and rows taken out for them."""
    receipts = wait_for_receipts(kafka_bootstrap, topics["forget_receipts"], GONE, members)
    refused = wait_for_refusals(kafka_bootstrap, topics, members)
    send(kafka_bootstrap, topics, messages[half:])
    wait_settled(members, kafka_bootstrap, raw)
    scrapes = [m.metrics() for m in members]
    for m in members:
        assert m.stop() == 0, m.log.read_text()[-3000:]
    kept = [m for m in messages if m.obj["id"] not in GONE]
    assert_group_state(members, snap_dir, raw, kept, context)
    receipts = [
        orjson.loads(v)
        for _, v, _, _, _ in consume_all(
            kafka_bootstrap, topics["forget_receipts"], timeout=2, isolation_level="read_committed"
        )
    ]
    counts = Counter(r["id"] for r in receipts)
    assert set(counts) == GONE and set(counts.values()) == {1}, f"{context}: receipts {counts.most_common(3)}"
    refused = refusals(kafka_bootstrap, topics)
    assert Counter(refused) == Counter(("forget_unknown_id", i) for i in NOBODY), f"{context}: {refused}"
    if not counted:  # (their crash points showed it)
        return
    # m1 passed requests on, and m0 took rows out for them: the partition really moved between learning and forgetting
    asked = scrapes[1].get(("iolstream_forget_asks_sent_total",), 0) if scrapes[1] else 0
    removed = scrapes[0].get(("iolstream_forget_ids_removed_for_others_total",), 0) if scrapes[0] else 0
    assert asked >= 1 and removed >= 1, f"{context}: asks {asked}, removed for others {removed}"
    forwarded = [r for r in receipts if r["member"] == "m0" and r["stage"] == "labelled"]
    assert len(forwarded) >= removed, context


@pytest.mark.kafka
def test_a_row_learned_before_its_partition_moved_is_forgotten_by_the_member_that_learned_it(
    group_rig, kafka_bootstrap, tmp_path
):
    raw, path, snap_dir, topics = rig(group_rig, False)
    messages = make_stream()
    half = next(i for i, m in enumerate(messages) if m.kind == "features" and m.obj["id"] == "r3000")
    members = first_alone_then_two(tmp_path, path, raw, topics, kafka_bootstrap, messages, half)
    request_everything(kafka_bootstrap, topics)
    finish_and_check(members, kafka_bootstrap, raw, topics, snap_dir, messages, half, "partitions moved")


@pytest.mark.kafka
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_members_killed_mid_forward_neither_lose_nor_repeat_a_removal_or_a_refusal(
    group_rig, kafka_bootstrap, tmp_path, monkeypatch, exactly_once
):
    """m0 dies as it is about to take out the rows it answered for, m1 as it is about to refuse the ids nobody
    holds (their decisions taken, not held yet); both restart from their snapshots within the session timeout
    (static membership: their partitions wait) and read the log again: the same decisions, once."""
    raw, path, snap_dir, topics = rig(group_rig, exactly_once, session_timeout_ms=45_000, wait_ms=300_000)
    messages = make_stream(seed=9)
    half = next(i for i, m in enumerate(messages) if m.kind == "features" and m.obj["id"] == "r3000")
    env = {"m0": "before_forward_removal:1", "m1": "before_forward_refusal:1"}
    members = first_alone_then_two(
        tmp_path, path, raw, topics, kafka_bootstrap, messages, half, env=env, monkeypatch=monkeypatch
    )
    request_everything(kafka_bootstrap, topics)
    # each dies at its point (m1's refusals wait for m0's answers: m0 may have to be back first), and comes back
    crashed, deadline = set(), time.monotonic() + 300
    while len(crashed) < 2:
        for m in members:
            code = m.proc.poll()
            if code is None or m.member in crashed:
                continue
            assert code == 137, (
                f"{m.member} exited {code}, not at its crash point:\n{m.log.read_text()[-3000:]}"
            )
            assert "test crash point" in m.log.read_text()
            crashed.add(m.member)
            m.start()  # (without the crash point)
        assert time.monotonic() < deadline, f"only {crashed} reached their crash points"
        time.sleep(0.2)
    for m in members:
        m.wait(ready, "ready again after its crash")
    context = f"killed mid-forward, exactly_once={exactly_once}"
    finish_and_check(members, kafka_bootstrap, raw, topics, snap_dir, messages, half, context, counted=False)
