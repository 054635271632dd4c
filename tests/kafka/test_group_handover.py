"""Handovers of group learning as members read them (no broker): labels that came before their rows go with their
partition to the one member that reads those rows next.

The case that lost labels: a member consumed a labels partition ahead of its features partition (labels may come
first; on a loaded machine the alignment gives up waiting for a slow fetch), held them early, and lost both
partitions in a rebalance. The member that took them read the rows from the committed offset and the labels past
it: the labels stayed stranded where they were, and the group's c never had them.
"""

import numpy as np
import orjson
import pytest
from kafka_fakes import FakeRecord

from iolstream.core import contribution
from iolstream.core.model import EdRVFL
from iolstream.kafka import snapshots
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.group import GroupSync
from iolstream.kafka.group_records import Reassembly
from iolstream.stream.group import HandedOverLabels
from iolstream.stream.processor import StreamProcessor

MODEL = {"n_inputs": 3, "classes": [0, 1], "n_nodes": 8, "scaler": "none", "mode": "forward"}
STREAM = {"batch_rows": 4, "row_ttl_ms": None, "early_label_ttl_ms": 3_600_000}
FEATURES, LABELS = "feat", "lab"


class _Log:
    """The worker's producer as GroupSync's ``output``: keeps what is produced, as messages to read back."""

    def __init__(self):
        self.records = []

    def produce(self, topic, value, key=None, headers=None, partition=None):
        self.records.append((value, headers))

    def messages(self):
        return [FakeRecord(value, headers, offset) for offset, (value, headers) in enumerate(self.records)]


class Member:
    """A member's GroupSync and processor; ``holds``: the (topic, partition) keys its consumer is assigned."""

    def __init__(self, name: str, log: _Log, holds=()):
        cfg = config_from_dict(
            {"model": MODEL, "stream": STREAM, "group": {"enabled": True, "member_id": name}}, environ={}
        )
        self.holds = set(holds)
        self.sync = GroupSync(cfg, log, assigned=lambda: self.holds)
        self.proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, agreement=self.sync)
        self.sync.attach(self.proc, None, start=True)
        self.sync.caught_up = True

    def read(self, messages) -> None:
        """Read records as the deltas consumer hands them over (a fresh reassembly: each read is the first)."""
        self.sync.chunks = Reassembly()
        for msg in messages:
            self.sync._take(msg)

    def assign(self, *keys) -> None:
        self.holds = set(keys)
        self.sync.assignment_changed()

    def rows(self, ids, x, partition: int) -> None:
        for i, row_id in enumerate(ids):
            self.proc.on_features(
                orjson.dumps({"id": row_id, "x": x[i].tolist()}), (FEATURES, partition, i), now_ms=0
            )
        self.proc.step(0, force=True)

    def labels(self, ids, y, partition: int, first_offset: int = 0, keyed: bool = False) -> None:
        """Label messages, each with its source as the worker gives it: (topic, partition, offset), and the
        message key's text after them when the message has one (the worker's producers key by id)."""
        for i, row_id in enumerate(ids):
            source = (LABELS, partition, first_offset + i) + ((row_id,) if keyed else ())
            self.proc.on_labels(orjson.dumps({"id": row_id, "y": int(y[i])}), source, now_ms=0)
        self.proc.step(0, force=True)


def _stream(n=12, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    return [f"r{i}" for i in range(n)], x, (x[:, 0] > 0).astype(int)


def _rhs(proc) -> np.ndarray:
    return contribution.sums(proc.model)["p0.rhs"]


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_labels_before_their_rows_go_with_their_partition_and_join_where_the_rows_are_read(keyed):
    ids, x, y = _stream()
    log = _Log()
    giver = Member("w1", log, holds={(FEATURES, 2), (LABELS, 2), (LABELS, 3)})
    giver.labels(ids[:8], y[:8], partition=2, keyed=keyed)  # partition 2's labels came before their rows
    giver.labels(ids[8:], y[8:], partition=3, first_offset=100, keyed=keyed)  # partition 3 stays with it
    assert giver.proc.join.n_early == 12

    giver.sync.hand_over([(FEATURES, 2), (LABELS, 2)])  # a revoke of partition 2
    assert giver.proc.join.n_early == 4  # partition 3's stay
    assert giver.proc.join.counters["labels_handed_over"] == 8
    record = snapshots.decode(b"".join(v for v, _ in log.records))[1]
    assert record["label_ids"].tolist() == ids[:8] and record["label_partitions"].tolist() == [2] * 8
    assert record["label_offsets"].tolist() == list(range(8)) and record["label_y"].tolist() == y[:8].tolist()
    assert record["label_keyed"].tolist() == [keyed] * 8  # a key goes with its label (a dead letter keeps it)
    assert record["label_keys"].tolist() == (ids[:8] if keyed else [""] * 8)

    taker = Member("w2", log, holds={(FEATURES, 2), (LABELS, 2)})
    other = Member("w3", log, holds={(FEATURES, 4), (LABELS, 4)})
    taker.read(log.messages())
    other.read(log.messages())
    assert taker.proc.join.n_early == 8 and other.proc.join.n_early == 0
    taker.rows(ids[:8], x[:8], partition=2)  # the rows come to the member that holds partition 2 now
    assert taker.proc.counters["rows_learned"] == 8 and taker.proc.join.n_early == 0

    single = Member("w0", _Log())  # one worker that saw these rows and labels
    single.rows(ids[:8], x[:8], partition=2)
    single.labels(ids[:8], y[:8], partition=2)
    np.testing.assert_allclose(_rhs(taker.proc), _rhs(single.proc), rtol=1e-12)
    other.assign((FEATURES, 4), (LABELS, 4))  # its assignment did not give it partition 2: let go
    assert not len(other.sync.handovers.labels) and other.proc.join.n_early == 0


def test_labels_read_during_a_rebalance_wait_for_the_assignment():
    """Read between the revoke and the assignment (an eager rebalance takes everything first): kept aside, adopted
    by the member the assignment gives the partition to, let go by the others."""
    ids, _, y = _stream()
    log = _Log()
    giver = Member("w1", log, holds={(LABELS, 2)})
    giver.labels(ids[:5], y[:5], partition=2)
    giver.sync.hand_over([(LABELS, 2)])
    giver.holds = set()
    members = [Member(f"w{i}", log) for i in (2, 3)]
    for m in members:
        m.read(log.messages())
        assert len(m.sync.handovers.labels) == 5 and m.proc.join.n_early == 0
    members[0].assign((FEATURES, 2), (LABELS, 2))
    members[1].assign((FEATURES, 0), (LABELS, 0))
    assert members[0].proc.join.n_early == 5 and not len(members[0].sync.handovers.labels)
    assert members[1].proc.join.n_early == 0 and not len(members[1].sync.handovers.labels)
    giver.read(log.messages())  # its own record: the partition went elsewhere
    giver.assign((FEATURES, 0), (LABELS, 0))
    assert giver.proc.join.n_early == 0


def test_a_member_takes_its_own_labels_back_when_the_partition_comes_back():
    """An eager rebalance revokes every partition and may give them back: the labels it handed over return."""
    ids, x, y = _stream()
    log = _Log()
    member = Member("w1", log, holds={(FEATURES, 1), (LABELS, 1)})
    member.labels(ids[:6], y[:6], partition=1)
    member.sync.hand_over(None)  # a stop, or a restart: every partition
    assert member.proc.join.n_early == 0
    member.holds = set()
    member.read(log.messages())
    member.assign((FEATURES, 1), (LABELS, 1))
    assert member.proc.join.n_early == 6
    member.rows(ids[:6], x[:6], partition=1)
    assert member.proc.counters["rows_learned"] == 6


def test_a_stopping_member_leaves_handed_over_labels_to_the_others():
    ids, _, y = _stream()
    log = _Log()
    giver = Member("w1", log, holds={(LABELS, 2)})
    giver.labels(ids[:3], y[:3], partition=2)
    giver.sync.hand_over([(LABELS, 2)])
    stopping = Member("w2", log, holds={(FEATURES, 2), (LABELS, 2)})
    stopping.sync.handovers.stop()
    stopping.read(log.messages())
    assert stopping.proc.join.n_early == 0 and not len(stopping.sync.handovers.labels)


def test_an_adopted_label_of_a_row_that_expired_here_is_a_dead_letter_of_the_next_step():
    ids, x, y = _stream()
    log = _Log()
    giver = Member("w1", log, holds={(LABELS, 2)})
    giver.labels(ids[:2], y[:2], partition=2)
    giver.sync.hand_over([(LABELS, 2)])
    taker = Member("w2", log, holds={(FEATURES, 2), (LABELS, 2)})
    taker.proc.join.row_ttl_ms = 0
    taker.rows(ids[:1], x[:1], partition=2)
    taker.proc.step(now_ms=10)  # its row expired unlabelled
    taker.read(log.messages())
    out = taker.proc.step(now_ms=10)
    assert [(d.bad.reason, d.source) for d in out.dead_letters] == [("expired_id", (LABELS, 2, 0))]
    assert taker.proc.join.n_early == 1  # the other waits for its row


def test_handed_over_labels_settle_by_partition():
    waiting = HandedOverLabels()
    waiting.add("w1", ["a", "b", "c"], np.array([0, 1, 0]), [("l", 1, 5), ("l", 2, 6), ("l", 1, 7)])
    waiting.add("w2", [], np.array([]), [])  # nothing: not kept
    assert len(waiting) == 3 and len(waiting.waiting) == 1
    adopt, let_go = waiting.settle(lambda s: s[:2] == ("l", 1), assigned=False)
    assert [(m, ids, y.tolist()) for m, ids, y, _ in adopt] == [("w1", ["a", "c"], [0, 0])]
    assert let_go == [] and len(waiting) == 1  # "b" waits for an assignment
    adopt, let_go = waiting.settle(lambda s: False, assigned=True)
    assert adopt == [] and let_go == [("w1", 1)] and len(waiting) == 0
