"""Forget requests passed on in a group, without Kafka (docs/design.md §13, "A group"; ``stream.forwarding``).

A member asked to forget an id it never saw asks the others on the group's log; each decision is taken on reading
that log, in its one order: the first answer holding an id decides it (its member takes the row out on reading its
own answer back), the answers of every member asked decide the rest (refused by the asking member), and so does
the asking member's close after the wait. Records read twice decide nothing more, and a member restored from
a snapshot taken mid-way takes the same decisions again. The log here is a list every member reads in order.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from test_stream import assert_sums, data, features, labels, model_config, offline_sums, stream_config

from iolstream.core.model import EdRVFL
from iolstream.stream.forwarding import ANSWER, ASK, CLOSE, Forwarding
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.retention import RetentionStore, record_shape

WAIT_MS = 1_000
PAIR = ["m0", "m1"]  # the members of a group of two


class Log:
    """The model-deltas topic: records in one order; each member reads from its own position."""

    def __init__(self):
        self.records: list[tuple[str, str, dict]] = []  # (kind, member, body)

    def publish(self, member: str, forwarding: Forwarding, *, asks: bool = True) -> None:
        self.records += [(kind, member, body) for kind, body in forwarding.take_outbox(asks=asks)]


class Member:
    """A member's ``Forwarding`` alone: ``held`` the ids its retention store holds whole, ``gram`` those it holds as
    a handed-over copy whose Gram is in its sums."""

    def __init__(self, name: str, peers, held=(), gram=()):
        self.name, self.held, self.gram = name, set(held), set(gram)
        self.fw = Forwarding()
        self.fw.bind(name, lambda: peers, WAIT_MS)
        self.at = 0  # next record to read
        self.removed: list[str] = []
        self.refused: list[str] = []
        self.dropped: list[str] = []

    def holds(self, ids):
        return [i for i in ids if i in self.held], [i for i in ids if i in self.gram]

    def read(self, log: Log, now_ms: int = 0) -> None:
        while self.at < len(log.records):
            kind, member, body = log.records[self.at]
            self.at += 1
            d = self.fw.read(kind, member, body, self.holds, now_ms)
            self.removed += d.remove
            self.refused += d.refuse
            self.dropped += d.drop
            if d.remove or d.refuse or d.drop:
                assert d.source == ["forget", 3, 17]


def group(*holdings):
    names = [f"m{i}" for i in range(len(holdings))]
    return [Member(n, names, held) for n, held in zip(names, holdings)]


def read_all(log, members, now_ms=0, rounds=3):
    for _ in range(rounds):  # answers are published after reading, then read by everyone
        for m in members:
            m.read(log, now_ms)
            log.publish(m.name, m.fw)


def test_the_first_answer_holding_an_id_decides_it_and_the_asker_refuses_what_nobody_holds():
    log = Log()
    m0, m1, m2 = group((), {"a", "c"}, {"b", "c"})
    assert m0.fw.ask(["a", "b", "c", "z"], ("forget", 3, 17))
    log.publish("m0", m0.fw)
    assert [k for k, _, _ in log.records] == [ASK]
    assert log.records[0][2]["asked"] == ["m1", "m2"]
    read_all(log, [m0, m1, m2])
    assert [k for k, _, _ in log.records] == [ASK, ANSWER, ANSWER]
    assert m1.removed == ["a", "c"]  # m1 answered first: "c" is its
    assert m2.removed == ["b"]  # its "c" came second and decides nothing
    assert m0.refused == ["z"] and m0.removed == [] and m1.refused == m2.refused == []
    assert m0.fw.waiting() == m1.fw.waiting() == m2.fw.waiting() == 0
    assert m0.fw.counters["asks_sent"] == 1 and m1.fw.counters["asks_answered"] == 1


def test_a_member_that_does_not_answer_in_time_is_closed_out_and_its_late_answer_decides_nothing():
    log = Log()
    m0, m1, m2 = group((), {"a"}, {"b"})
    m0.fw.ask(["a", "b"], ("forget", 3, 17))
    log.publish("m0", m0.fw)
    m1.read(log)
    log.publish("m1", m1.fw)  # m1 answers; m2 is slow
    m0.read(log, now_ms=10)
    m0.fw.overdue(10 + WAIT_MS - 1)
    assert not m0.fw.outbox  # not yet
    m0.fw.overdue(10 + WAIT_MS)
    m0.fw.overdue(10 + 2 * WAIT_MS)  # one close
    log.publish("m0", m0.fw)
    m2.read(
        log
    )  # m2 reads the ask, the answer and the close before it answers: it answers, then reads it back
    log.publish("m2", m2.fw)
    read_all(log, [m0, m1, m2])
    assert [k for k, _, _ in log.records] == [ASK, ANSWER, CLOSE, ANSWER]
    assert m1.removed == ["a"] and m0.refused == ["b"] and m2.removed == []
    assert m0.fw.counters["asks_closed"] == 1


def test_records_published_twice_decide_once():
    log = Log()
    m0, m1 = group((), {"a"})
    m0.fw.ask(["a", "z"], ("forget", 3, 17))
    log.publish("m0", m0.fw)
    log.records.append(log.records[0])  # the ask again (an at-least-once restart published it twice)
    m1.read(log)
    log.publish("m1", m1.fw)
    assert [k for k, _, _ in log.records] == [ASK, ASK, ANSWER]  # answered once
    log.records.append(log.records[-1])  # and the answer twice
    read_all(log, [m0, m1])
    assert m1.removed == ["a"] and m0.refused == ["z"]


@pytest.mark.parametrize("cut", range(1, 4))
def test_a_member_restored_from_a_snapshot_takes_the_same_decisions_again(cut):
    """Each member's state saved after ``cut`` records, then read again from there (the snapshot holds the log's
    position with the state): the decisions after the snapshot are taken again, and none before it."""
    log = Log()
    m0, m1, m2 = group((), {"a"}, {"b"})
    m0.fw.ask(["a", "b", "z"], ("forget", 3, 17))
    log.publish("m0", m0.fw)
    read_all(log, [m0, m1, m2])
    assert len(log.records) == 3
    for m in (m0, m1, m2):  # every member again, from a snapshot after `cut` records, reading the same log
        replay = Member(m.name, ["m0", "m1", "m2"], m.held)
        replay.read(_prefix(log, cut))
        saved = replay.fw.to_state()
        again = Member(m.name, ["m0", "m1", "m2"], m.held)
        again.fw.load_state(orjson.loads(orjson.dumps(saved)))
        again.at = cut
        again.read(log)
        assert sorted(replay.removed + again.removed) == sorted(m.removed)
        assert sorted(replay.refused + again.refused) == sorted(m.refused)


def _prefix(log: Log, n: int) -> Log:
    out = Log()
    out.records = log.records[:n]
    return out


def test_copies_of_a_handed_over_row_go_to_whoever_holds_it_whole_else_to_the_holder_of_its_gram():
    """m0 handed the row over (its Gram in m0's sums: a "gram" copy), m2 adopted it ("bare"), m1 joined its label
    (whole). Asked by m2, m1 takes it out; without m1's label, m0 does; m2 drops its copy either way."""
    for labelled in (True, False):
        log = Log()
        names = ["m0", "m1", "m2"]
        m0 = Member("m0", names, gram={"a"})
        m1 = Member("m1", names, held={"a"} if labelled else ())
        m2 = Member("m2", names)
        assert m2.fw.ask(["a"], ("forget", 3, 17), copies={"a": "bare"})
        log.publish("m2", m2.fw)
        read_all(log, [m0, m1, m2])
        remover = m1 if labelled else m0
        assert remover.removed == ["a"], labelled
        assert [m.removed for m in (m0, m1, m2) if m is not remover] == [[], []]
        assert m2.dropped == ["a"] and m2.refused == [] and m2.fw.waiting() == 0


def test_a_request_read_again_after_its_ask_asks_nothing_and_does_nothing(tmp_path):
    """At least once, a member restarted from a snapshot older than its ask reads the log (its ask, the answers:
    decided) before it reads the request again: the request then finds nothing to ask and nothing to do here."""
    X, y = data(32, seed=24)
    m0, m1 = pair_where_m0_learned(tmp_path, X, y, 32)
    saved = orjson.loads(orjson.dumps(m1.erasure.to_state()))  # m1's snapshot, before the request
    request = orjson.dumps({"ids": ["r4", "nope"]})
    assert m1.on_forget(request, ("forget", 3, 17), 200) == []
    log = Log()
    pass_records(log, {"m0": m0, "m1": m1}, {"m0": 0, "m1": 0}, 201)
    assert [r["id"] for r in m0.erasure.waiting] == ["r4"] and [r["id"] for r in m1.erasure.waiting] == [
        "nope"
    ]
    m1.erasure.load_state(saved)  # restarted: the log read again first, then the request again
    m1.erasure.forwarding.bind("m1", lambda: PAIR, WAIT_MS)
    for kind, member, body in log.records:
        m1.forward_decided(m1.erasure.forwarding.read(kind, member, body, m1.erasure.holds, 300), 300)
    assert m1.on_forget(request, ("forget", 3, 17), 301) == []
    assert not m1.erasure.forwarding.outbox  # asked nothing again
    assert [r["id"] for r in m1.erasure.waiting] == ["nope"]  # one refusal


def test_a_single_worker_asks_nobody():
    fw = Forwarding()
    assert not fw.ask(["a"], ("forget", 0, 1)) and not fw.outbox
    alone = Forwarding()
    alone.bind("m0", lambda: ["m0"], WAIT_MS)  # alone in its group
    assert not alone.ask(["a"], ("forget", 0, 1))


# ------------------------------------------------------------------ two processors sharing a log

WARMUP = 20


def make(tmp_path, name: str, peers):
    cfg = model_config(warmup_rows=WARMUP, mode="forward")
    store = RetentionStore(tmp_path / name, **record_shape(cfg), rows=10_000, segment_rows=64)
    proc = StreamProcessor(EdRVFL(cfg), stream_config(), retention=store)
    proc.erasure.load_state(None)
    proc.erasure.forwarding.bind(name, lambda: peers, WAIT_MS)
    return proc


def pair_where_m0_learned(tmp_path, X, y, n: int):
    """Members m0 and m1, m0 having learned rows r0..r(n-1), each batch of 8 labelled as it came."""
    m0, m1 = make(tmp_path, "m0", PAIR), make(tmp_path, "m1", PAIR)
    for s in range(0, n, 8):
        m0.on_features(features(range(s, s + 8), X), "f", s)
        m0.on_labels(labels(range(s, s + 8), y), "l", s)
    m0.step(100, force=True)
    return m0, m1


def pass_records(log: Log, procs: dict, positions: dict, now_ms: int) -> None:
    """Every member publishes what it has, then reads the log on, acting on each decision, until quiet."""
    while True:
        for name, proc in procs.items():
            log.publish(name, proc.erasure.forwarding)
        moved = False
        for name, proc in procs.items():
            while positions[name] < len(log.records):
                kind, member, body = log.records[positions[name]]
                positions[name] += 1
                moved = True
                d = proc.erasure.forwarding.read(kind, member, body, proc.erasure.holds, now_ms)
                proc.forward_decided(d, now_ms)
        if not moved and not any(p.erasure.forwarding.outbox for p in procs.values()):
            return


def test_the_member_that_learned_a_row_takes_it_out_for_the_member_its_partition_moved_to(tmp_path):
    X, y = data(64, seed=21)
    peers = ["m0", "m1"]
    m0, m1 = make(tmp_path, "m0", peers), make(tmp_path, "m1", peers)
    for s in range(0, 48, 8):  # m0 learns rows 0..47, labelled; then their partition moves to m1
        m0.on_features(features(range(s, s + 8), X), "f", s)
        m0.step(s)
    for s in range(0, 48, 8):
        m0.on_labels(labels(range(s, s + 8), y), "l", 100 + s)
    m0.step(200, force=True)
    gone = ["r3", "r30"]
    dead = m1.on_forget(orjson.dumps({"ids": gone + ["nope"]}), ("forget", 3, 17), 300)
    assert dead == []  # not refused at once: asked
    log, positions = Log(), {"m0": 0, "m1": 0}
    pass_records(log, {"m0": m0, "m1": m1}, positions, 301)
    assert [k for k, _, _ in log.records] == [ASK, ANSWER]
    receipts = m0.erasure.waiting
    assert [(r["id"], r["stage"], r["request"]) for r in receipts] == [
        ("r3", "labelled", ["forget", 3, 17]),
        ("r30", "labelled", ["forget", 3, 17]),
    ]
    refusals = m1.erasure.waiting
    assert [(r["id"], r["refused"], r["request"]) for r in refusals] == [
        ("nope", "forget_unknown_id", ["forget", 3, 17])
    ]
    assert m1.status()["ids_refused"] == 1 and m0.status()["ids_forgotten"] == 2
    assert m0.status()["ids_removed_for_others"] == 2 and m1.status()["asks_sent"] == 1
    kept = [i for i in range(48) if i not in (3, 30)]
    assert_sums(m0, offline_sums(m0.model.config, X, y, WARMUP, kept, kept))
    # the refusal waits for a snapshot as a receipt does, and is handed out once it is durable
    m1.erasure.seal("snap-1")
    out = m1.erasure.durable("snap-1", m1.erasure.to_state())
    assert [(r["id"], r["snapshot"]) for r in out] == [("nope", "snap-1")]
    m1.erasure.sent(out)
    assert m1.status()["receipts_out"] == 0 and not m1.erasure.due()
    # the id is remembered as forgotten at both: a row for it later is refused
    for proc in (m0, m1):
        assert proc.join.remembered(["r3"]).tolist() == [3]


def test_an_ask_decided_after_a_restart_from_a_snapshot_in_between(tmp_path):
    """m0 answers, then is restored from a snapshot taken before it read its own answer back: reading the log on
    from the snapshot's position it removes the rows once."""
    X, y = data(48, seed=22)
    m0, m1 = pair_where_m0_learned(tmp_path, X, y, 32)
    m1.on_forget(orjson.dumps({"id": "r5"}), ("forget", 3, 17), 200)
    log = Log()
    log.publish("m1", m1.erasure.forwarding)
    kind, member, body = log.records[0]
    m0.erasure.forwarding.read(kind, member, body, m0.erasure.holds, 201)  # m0 reads the ask and answers
    saved_model = m0.model.learner.state.layers[0].gram.copy()
    state = orjson.loads(orjson.dumps(m0.erasure.forwarding.to_state()))
    log.publish("m0", m0.erasure.forwarding)
    # the snapshot holds the forwarding state after the ask (position 1), and the outbox was published
    restored = Forwarding()
    restored.bind("m0", lambda: PAIR, WAIT_MS)
    restored.load_state(state)
    m0.erasure.forwarding = restored
    restored.outbox = []  # published before the crash
    for kind, member, body in log.records[1:]:
        m0.forward_decided(restored.read(kind, member, body, m0.erasure.holds, 202), 202)
    assert [r["id"] for r in m0.erasure.waiting] == ["r5"]
    assert not np.allclose(m0.model.learner.state.layers[0].gram, saved_model)
    kept = [i for i in range(32) if i != 5]
    assert_sums(m0, offline_sums(m0.model.config, X, y, WARMUP, kept, kept))
