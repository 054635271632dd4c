"""The catch-up aligner (iolstream/align.py): pure, no Kafka, no clock (times are passed in)."""

from __future__ import annotations

import random

import pytest

from iolstream.stream.align import DATA_WAIT_MS, Aligner

F, L = ("features", 0), ("labels", 0)
CAUGHT_UP = lambda key: 0  # noqa: E731


def aligner(max_wait_ms=500, max_messages=100, max_bytes=1 << 20) -> Aligner:
    a = Aligner(max_wait_ms, max_messages, max_bytes)
    a.assign(F, priority=0)
    a.assign(L, priority=1)
    return a


def add(a: Aligner, key, offsets, timestamps, size=10):
    for offset, ts in zip(offsets, timestamps):
        assert a.add(key, offset, ts, size, (key, offset))


def items(released):
    return [item for _, item in released]


def test_merge_by_timestamp_keeps_each_partition_in_offset_order():
    """Two partitions filled one after the other come out merged by timestamp; a partition whose
    timestamps go backwards (producer-set CreateTime) still comes out in offset order."""
    a = aligner()
    add(a, L, range(4), [15, 25, 35, 45])  # labels all consumed first, as on a backlog
    add(a, F, range(4), [10, 20, 40, 30])  # features: 40 then 30
    out = items(a.release(0, CAUGHT_UP, limit=100))
    assert out == [(F, 0), (L, 0), (F, 1), (L, 1), (L, 2), (F, 2), (F, 3), (L, 3)]
    assert a.queued == 0


def test_ties_alternate_between_partitions_the_lower_priority_first():
    """Several messages per ms: equal timestamps alternate (as a producer interleaving the two topics
    sent them), starting with the lower priority; within a partition offset order stays."""
    a = aligner()
    add(a, L, [0, 1, 2], [10, 10, 10])
    add(a, F, [0, 1, 2], [10, 10, 10])
    assert items(a.release(0, CAUGHT_UP, limit=10)) == [(F, 0), (L, 0), (F, 1), (L, 1), (F, 2), (L, 2)]
    add(a, L, [3], [11])
    add(a, F, [3], [11])
    assert items(a.release(0, CAUGHT_UP, limit=10)) == [(F, 3), (L, 3)]  # L2 was released last


def fetched_in_random_order(stream, seed: int):
    """(aligner, released items) after the (key, offset, ts) messages of ``stream`` were fetched
    partition by partition in random chunks of 1–9, releasing after each with the lag known."""
    rng = random.Random(seed)
    a = aligner(max_messages=1000)
    broker = {F: [m for m in stream if m[0] == F], L: [m for m in stream if m[0] == L]}
    out = []
    while broker[F] or broker[L]:
        key = rng.choice([k for k in broker if broker[k]])
        n = rng.randint(1, 9)
        for m in broker[key][:n]:
            a.add(m[0], m[1], m[2], 1, m)
        broker[key] = broker[key][n:]
        out += items(a.release(0, lambda k: len(broker[k]), limit=1000))
    return a, out


def test_random_interleavings_release_every_message_once_in_timestamp_order():
    """However the consumer happens to fetch the two partitions, with the lag known the release order
    is the produce order (seed printed on failure)."""
    stream = [(F if i % 2 == 0 else L, i // 2, i) for i in range(200)]  # produced F0 L0 F1 L1 ...
    for seed in range(20):
        a, out = fetched_in_random_order(stream, seed)
        assert a.queued == 0 and out == stream, f"seed {seed}"


def test_ties_with_an_empty_lagging_partition_wait_for_it():
    """A fast producer sends several messages per ms: a label message may have the timestamp of the
    features message it labels, which is still in the broker. It waits for it (a tie may go first),
    whatever the fetch order: no label comes before its row. Stream as ``bench --suite kafka`` sends
    it: F0 F1 L0 F2 L1 …, eight messages a ms. Before, ties did not wait, and 40 % of that bench's
    labels came early (held, then joined on the slow path)."""
    stream = []
    for i in range(100):
        stream.append((F, i, None))
        if i:
            stream.append((L, i - 1, None))
    stream = [(key, offset, n // 8) for n, (key, offset, _) in enumerate(stream)]
    for seed in range(20):
        a, out = fetched_in_random_order(stream, seed)
        at = {(m[0], m[1]): i for i, m in enumerate(out)}
        assert a.queued == 0 and len(out) == len(stream), f"seed {seed}"
        assert all(at[(F, i)] < at[(L, i)] for i in range(99)), f"seed {seed}: a label before its features"


def test_waits_for_data_known_to_be_in_the_broker_however_long_the_fetch_takes():
    """A fetch slower than ``max_wait_ms`` (a loaded machine): while the features partition is known to
    hold messages not yet consumed, the labels wait for them — they never all go ahead and overflow the
    early-label store. The data coming ends the wait."""
    a = aligner(max_wait_ms=100)
    add(a, L, range(3), [20, 30, 40])
    lag = {F: 5, L: 0}.get
    assert a.release(0, lag, limit=10) == []  # features are behind: the labels wait
    assert a.counters["waits"] == 1 and a.wait_ms(0) == DATA_WAIT_MS
    assert a.release(5_000, lag, limit=10) == [] and a.wait_ms(5_000) == DATA_WAIT_MS - 5_000
    assert a.counters == {"waits": 1, "timeouts": 0, "duplicates_dropped": 0, "pauses": 0}
    add(a, F, [0], [10])
    assert items(a.release(5_001, lag, limit=10)) == [(F, 0)]  # then L0 waits again (a new wait)
    assert a.counters["waits"] == 2 and a.blocked
    assert items(a.release(5_002, {F: 0}.get, limit=10)) == [(L, 0), (L, 1), (L, 2)]  # caught up: they go


def test_a_partition_that_cannot_be_fetched_is_given_up_after_data_wait_ms(caplog):
    """Known to hold data that does not come (no leader, an open transaction): after DATA_WAIT_MS a queue's
    worth of the other partitions goes ahead, with a warning, then it is waited for again."""
    a = aligner(max_wait_ms=100, max_messages=2)
    add(a, L, range(4), [20, 30, 40, 50])
    lag = {F: 5, L: 0}.get
    with caplog.at_level("WARNING", logger="iolstream.align"):
        assert a.release(0, lag, limit=10) == [] and a.release(DATA_WAIT_MS - 1, lag, limit=10) == []
        assert not caplog.records
        assert items(a.release(DATA_WAIT_MS, lag, limit=10)) == [(L, 0), (L, 1)]
    assert [r.getMessage() for r in caplog.records] == [
        "('features', 0): waited 30 s for 5 messages the broker holds, not fetched (no leader, or an open"
        " transaction?): up to 2 messages of the other partitions go ahead, then it is waited for again"
    ]
    assert a.counters["timeouts"] == 1 and a.blocked and a.wait_ms(DATA_WAIT_MS) == DATA_WAIT_MS


def test_unknown_lag_waits_at_most_max_wait_ms_then_gives_up():
    a = aligner(max_wait_ms=500)
    add(a, L, range(3), [20, 30, 40])
    lag = {L: 0}.get  # the features' lag is not known (no fetch and no end offset yet)
    assert a.release(1000, lag, limit=10) == []
    assert a.counters["waits"] == 1 and a.wait_ms(1000) == 500
    assert a.release(1300, lag, limit=10) == [] and a.wait_ms(1300) == 200
    assert items(a.release(1500, lag, limit=10)) == [(L, 0), (L, 1), (L, 2)]  # waited 500 ms: they go
    assert a.counters["timeouts"] == 1
    add(a, L, [3], [50])
    assert items(a.release(1600, lag, limit=10)) == [(L, 3)]  # no new wait: still nothing from features
    add(a, F, [0], [10])  # features came: the next time they run dry, messages wait again
    add(a, L, [4], [60])
    assert items(a.release(1700, lag, limit=10)) == [(F, 0)]
    assert a.counters["waits"] == 2 and a.wait_ms(1700) == 500


def test_a_given_up_partition_whose_lag_becomes_known_is_waited_for_again():
    a = aligner(max_wait_ms=100)
    add(a, L, range(4), [20, 30, 40, 50])
    assert a.release(0, {}.get, limit=1) == []
    assert items(a.release(100, {}.get, limit=1)) == [(L, 0)]  # gave up on the features (lag unknown)
    assert a.release(101, {F: 7}.get, limit=10) == []  # now known to hold 7 messages: L1 waits for them
    assert a.wait_ms(101) == DATA_WAIT_MS and a.counters["timeouts"] == 1
    assert a.release(10_000, {F: 7}.get, limit=10) == []  # longer than max_wait_ms


def test_after_giving_up_one_queue_s_worth_goes_ahead_then_it_waits_again():
    """Once given up on (its lag unknown), a partition lets at most a queue's worth of messages
    (``max_messages``, or ``max_bytes``) go past it, then it is waited for again."""
    a = aligner(max_wait_ms=100, max_messages=4, max_bytes=1 << 20)
    add(a, L, range(10), range(20, 30))
    lag = {L: 0}.get
    assert a.release(0, lag, limit=100) == []
    assert items(a.release(100, lag, limit=100)) == [
        (L, i) for i in range(4)
    ]  # timed out: 4 go, then a new wait
    assert (
        a.counters == {"waits": 2, "timeouts": 1, "duplicates_dropped": 0, "pauses": 0}
        and a.wait_ms(100) == 100
    )
    assert items(a.release(200, lag, limit=100)) == [(L, i) for i in range(4, 8)]
    b = aligner(max_wait_ms=100, max_messages=100, max_bytes=25)  # the byte bound: 3 messages of 10 bytes
    add(b, L, range(10), range(20, 30))
    assert b.release(0, lag, limit=100) == []
    assert items(b.release(100, lag, limit=100)) == [(L, 0), (L, 1), (L, 2)]


def test_the_wait_ends_when_the_partition_gets_data_or_catches_up():
    a = aligner()
    add(a, L, [0, 1], [20, 30])
    assert a.release(0, {F: 3}.get, limit=10) == []
    add(a, F, [0], [25])
    assert items(a.release(10, {F: 2}.get, limit=10)) == [
        (L, 0),
        (F, 0),
    ]  # L1 (30) waits: features still behind
    assert items(a.release(20, {F: 0}.get, limit=10)) == [(L, 1)]  # caught up


def test_unknown_lag_waits_and_an_older_message_never_waits():
    a = aligner()
    add(a, F, [0, 1], [10, 50])
    add(a, L, [0], [20])
    assert items(a.release(0, {}.get, limit=10)) == [
        (F, 0),
        (L, 0),
    ]  # lag None (no fetch yet): F1 waits for labels
    assert a.wait_ms(0) == 500
    add(a, L, [1], [60])
    assert items(a.release(1, {}.get, limit=10)) == [
        (F, 1)
    ]  # labels' partition time 60 ≥ 50: F1 need not wait


def test_messages_without_a_timestamp_never_wait():
    a = aligner()
    add(a, L, [0, 1], [None, 20])
    assert items(a.release(0, {F: 9}.get, limit=10)) == [(L, 0)]  # L1 waits for the features, L0 does not


def test_disabled_alignment_is_arrival_order_and_never_waits():
    a = aligner(max_wait_ms=0)
    add(a, L, [0, 1], [30, 40])
    add(a, F, [0, 1], [10, 20])
    add(a, L, [2], [5])
    assert items(a.release(0, {F: 100, L: 100}.get, limit=10)) == [(L, 0), (L, 1), (F, 0), (F, 1), (L, 2)]


def test_release_stops_at_its_limit_and_says_more_is_ready():
    a = aligner()
    add(a, F, range(5), range(5))
    assert len(a.release(0, CAUGHT_UP, limit=2)) == 2
    assert a.queued == 3 and a.wait_ms(0) == 0
    assert len(a.release(0, CAUGHT_UP, limit=10)) == 3 and a.wait_ms(0) is None


@pytest.mark.parametrize("bound", ["messages", "bytes"])
def test_a_full_queue_is_paused_and_resumed_at_half(bound):
    a = (
        aligner(max_messages=10, max_bytes=1000)
        if bound == "messages"
        else aligner(max_messages=1000, max_bytes=100)
    )
    add(a, L, range(10), range(10, 20), size=10)
    assert a.to_pause() == []  # at the bound, not above
    add(a, L, [10], [20], size=10)
    assert a.to_pause() == [L] and a.to_pause() == [] and a.paused == {L}
    assert a.release(0, {F: 1}.get, limit=100) == []  # waiting for the features
    assert a.to_resume() == []
    add(a, F, [0], [100])
    assert len(a.release(0, {F: 0}.get, limit=5)) == 5  # 6 labels left: above half
    assert a.to_resume() == []
    a.release(0, {F: 0}.get, limit=1)
    assert a.to_resume() == [L] and a.paused == set() and a.counters["pauses"] == 1


def test_revoke_drops_the_queues_and_returns_the_paused_partitions():
    a = aligner(max_messages=2)
    add(a, L, range(3), [1, 2, 3])
    add(a, F, [0], [10])
    assert a.to_pause() == [L]
    assert a.revoke([L]) == [L]
    assert a.queued == 1 and a.paused == set() and L not in a.partitions
    assert items(a.release(0, CAUGHT_UP, limit=10)) == [(F, 0)]  # labels are no longer waited for
    a.assign(L, priority=1)
    assert a.add(L, 0, 1, 10, "again")  # re-read from the state's position: not a duplicate


def test_clear_drops_everything_for_a_rewind():
    a = aligner(max_messages=1)
    add(a, F, [5, 6], [1, 2])
    assert a.to_pause() == [F]
    assert a.clear() == [F] and a.queued == 0 and a.paused == set()
    assert a.add(F, 0, 1, 10, "rewound")  # back to an earlier offset after the seek


def test_a_message_delivered_again_is_dropped():
    a = aligner()
    add(a, F, [3, 4], [1, 2])
    assert not a.add(F, 4, 2, 10, "again") and a.counters["duplicates_dropped"] == 1
    assert a.queued == 2
