"""A forget request for a row handed over at a rebalance, as group members read their records (no broker;
docs/design.md §13, "A group").

A row predicted by m0 (its Gram in m0's sums) and still waiting for its label when m0's partitions went is
handed over; m1 adopts it and joins its label (the label's term in m1's sums, the row's record labelled in m1's
retention store). The group's model is the sum of the members' sums. A request reaching m1 takes the Gram and the
label's term out of m1's sums: the group's model is the one without the row. A request reaching m0 (the
partition back with it), which holds only its copy of the row (still waiting for a label there), or m2, which
adopted a copy too, does not take it out alone: it asks the group (``stream.forwarding``), m1 answers holding it
whole and takes both terms out, the asking member drops its copy. A row never labelled goes with its Gram, from
m0's sums, wherever the request lands.
"""

import numpy as np
import orjson
import pytest
from test_group_handover import FEATURES, LABELS, MODEL, STREAM, _Log, _stream

from iolstream.core import contribution
from iolstream.core.model import EdRVFL
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.group import GroupSync
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.retention import RetentionStore, record_shape


class Member:
    """A member's GroupSync and processor with a retention store; reads the shared log from its own position."""

    def __init__(self, name: str, log: _Log, tmp_path, holds=()):
        cfg = config_from_dict(
            {"model": MODEL, "stream": STREAM, "group": {"enabled": True, "member_id": name}}, environ={}
        )
        self.log, self.holds, self.at = log, set(holds), 0
        self.sync = GroupSync(cfg, log, assigned=lambda: self.holds)
        store = RetentionStore(tmp_path / name, **record_shape(cfg.model), rows=1000, segment_rows=64)
        self.proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, agreement=self.sync, retention=store)
        self.proc.erasure.load_state(None)
        self.sync.attach(self.proc, None, start=True)
        self.sync.caught_up = True

    def read(self) -> None:
        messages = self.log.messages()
        for msg in messages[self.at :]:
            self.sync._take(msg)
        self.at = len(messages)

    def publish(self) -> None:
        self.sync.forward(replaying=False)
        self.sync.publish({}, force=True)

    def rows(self, ids, x, partition: int) -> None:
        for i, row_id in enumerate(ids):
            self.proc.on_features(
                orjson.dumps({"id": row_id, "x": x[i].tolist()}), (FEATURES, partition, i), 0
            )
        self.proc.step(0, force=True)

    def labels(self, ids, y, partition: int) -> None:
        for i, row_id in enumerate(ids):
            self.proc.on_labels(orjson.dumps({"id": row_id, "y": int(y[i])}), (LABELS, partition, i), 0)
        self.proc.step(0, force=True)


def settle(members, rounds: int = 4) -> None:
    for _ in range(rounds):
        for m in members:
            m.publish()
        for m in members:
            m.read()


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "never-labelled"])
@pytest.mark.parametrize("where", ["labeller", "giver", "third"])
def test_a_row_handed_over_while_waiting_for_its_label_leaves_the_group_model_whole(
    tmp_path, where, labelled
):
    ids, x, y = _stream(n=12, seed=8)
    log = _Log()
    m0 = Member("w0", log, tmp_path, holds={(FEATURES, 2), (LABELS, 2)})
    m1, m2 = Member("w1", log, tmp_path), Member("w2", log, tmp_path)
    members = [m0, m1, m2]
    m0.rows(ids, x, partition=2)
    m0.labels(ids[:6], y[:6], partition=2)
    settle(members)  # every member holds the others' sums before the rebalance
    m0.sync.hand_over([(FEATURES, 2), (LABELS, 2)])  # rows 6..11 wait for their labels: handed over
    m1.holds, m0.holds = {(FEATURES, 2), (LABELS, 2)}, set()
    settle(members)
    gone = ids[8]
    labels_at_m1 = ids[6:] if labelled else [i for i in ids[6:] if i != gone]
    m1.labels(labels_at_m1, y[[ids.index(i) for i in labels_at_m1]], partition=2)  # joined at m1
    settle(members)
    asked = {"labeller": m1, "giver": m0, "third": m2}[where]
    dead = asked.proc.on_forget(orjson.dumps({"id": gone}), ("forget", 2, 0), 0)
    assert dead == [], [(d.bad.reason, d.bad.detail) for d in dead]
    settle(members)
    receipts = [(m.sync.member, r["stage"]) for m in members for r in m.proc.erasure.waiting]
    remover = "w1" if labelled else "w0"
    assert [who for who, _ in receipts] == [remover], receipts  # one receipt, no refusal

    cfg = config_from_dict({"model": MODEL, "stream": STREAM}, environ={})
    single = StreamProcessor(EdRVFL(cfg.model), cfg.stream)  # one worker without the row
    keep = [i for i, row_id in enumerate(ids) if row_id != gone]
    for i in keep:
        single.on_features(orjson.dumps({"id": ids[i], "x": x[i].tolist()}), (FEATURES, 0, i), 0)
    single.step(0, force=True)
    for i in keep:
        single.on_labels(orjson.dumps({"id": ids[i], "y": int(y[i])}), (LABELS, 0, i), 0)
    single.step(0, force=True)
    want = contribution.sums(single.model)
    for m in members:
        got = contribution.sums(m.proc.model)
        for name in ("p0.gram", "p0.rhs"):
            np.testing.assert_allclose(
                got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=f"{m.sync.member} {name}"
            )
