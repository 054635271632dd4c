"""Group learning's records as a member reads them (no broker): what it takes, and what it refuses without stopping.

The compacted deltas topic keeps every member's newest records for ever, so a record a member cannot take must
be skipped (logged, counted as refused) and change nothing: raised, it would stop the worker at every start.
"""

import numpy as np
import pytest
from confluent_kafka import TopicPartition
from kafka_fakes import FakeRecord

from iolstream.core import contribution
from iolstream.core.candidates import FIRST_GRID, candidate_grid
from iolstream.core.model import EdRVFL
from iolstream.kafka import snapshots
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.group import GroupSync
from iolstream.stream.group import model_digest
from iolstream.stream.processor import StreamProcessor

MODEL = {"n_inputs": 3, "classes": [0, 1], "n_nodes": 8, "scaler": "none"}
CLOCKS = {"clock": 10, "rows": 10, "label_clock": 0, "label_rows": 0}


def _cfg(member="w1", chunk_bytes=None, **model):
    group = {"enabled": True, "member_id": member, **({"chunk_bytes": chunk_bytes} if chunk_bytes else {})}
    return config_from_dict({"model": {**MODEL, **model}, "group": group}, environ={})


def _headers(kind: str, member: str, seq: int, chunk: str, size: int) -> list:
    return [
        ("iolstream.kind", kind.encode()),
        ("iolstream.member", member.encode()),
        ("iolstream.seq", str(seq).encode()),
        ("iolstream.chunk", chunk.encode()),
        ("iolstream.size", str(size).encode()),
    ]


def _record(
    sync, member: str, seq: int, arrays: dict, digest: str | None = None, kind: str = "sums", **manifest
) -> FakeRecord:
    fields = {"published_ms": 1, "positions": [], **CLOCKS} if kind == "sums" else {"published_ms": 1}
    fields.update(manifest)
    blob = snapshots.encode(
        {
            **fields,
            "kind": kind,
            "member": member,
            "seq": seq,
            "model": sync.model_digest if digest is None else digest,
        },
        arrays,
    )
    return FakeRecord(blob, _headers(kind, member, seq, "0/1", len(blob)))


def _attached(cfg, candidates=None, saved=None):
    sync = GroupSync(cfg, output=None)
    proc = StreamProcessor(EdRVFL(cfg.model, candidates=candidates), cfg.stream, agreement=sync)
    sync.attach(proc, saved, start=True)
    sync.caught_up = True
    return sync, proc


def _ones(proc) -> dict:
    return {k: np.ones(v) for k, v in contribution.layout(proc.model).items()}


class _Log:
    """The worker's producer as GroupSync's ``output``: keeps what is produced, in order."""

    def __init__(self):
        self.records = []

    def produce(self, topic, value, key=None, headers=None, partition=None):
        self.records.append((key, value, headers))

    def messages(self, start: int = 0) -> list[FakeRecord]:
        return [FakeRecord(v, h, offset) for offset, (_, v, h) in enumerate(self.records) if offset >= start]


def test_sums_of_another_model_config_are_skipped_not_fatal():
    """After a model change the old records must not stop the new members (or crash-loop them): skipped, logged
    once, counted as refused."""
    sync, proc = _attached(_cfg())
    before = contribution.sums(proc.model)["p0.gram"].copy()
    assert sync._take(_record(sync, "old", 1, _ones(proc), "0123456789abcdef")) == 0
    assert sync.records[("sums", "refused")] == 1
    np.testing.assert_array_equal(contribution.sums(proc.model)["p0.gram"], before)
    assert sync._take(_record(sync, "w2", 1, _ones(proc))) == 1  # the same config: applied
    assert sync.state.members["w2"].seq == 1
    np.testing.assert_allclose(contribution.sums(proc.model)["p0.gram"], before + 1.0)


def test_a_member_restored_with_another_candidate_grid_refuses_and_is_refused():
    """A snapshot keeps the auto grid it was saved with. After a release that changed the grid, a restored member's
    sums and a fresh member's (and the records of members still on the old release) have the same shapes but other
    settings (half-life 16384 is not 512): they are refused both ways, not added."""
    cfg = _cfg(lam="auto", forgetting="auto", mode="forward")  # the λ / half-life grid of one mode
    fresh, fresh_proc = _attached(cfg)
    old, old_proc = _attached(cfg, candidates=candidate_grid("auto", "auto", *FIRST_GRID))
    assert contribution.layout(fresh_proc.model) == contribution.layout(
        old_proc.model
    )  # alike: shapes tell nothing
    assert fresh.model_digest != old.model_digest
    assert fresh.model_digest != model_digest(
        cfg.model
    )  # records of a release whose default grid was another
    fixed = _cfg(mode="forward")
    assert _attached(fixed)[0].model_digest == model_digest(
        fixed.model
    )  # one candidate: the config's digest, as before
    before = contribution.sums(fresh_proc.model)["p0.gram"].copy()
    assert fresh._take(_record(fresh, "restored", 1, _ones(fresh_proc), old.model_digest)) == 0
    assert old._take(_record(old, "fresh", 1, _ones(old_proc), fresh.model_digest)) == 0
    assert fresh.records[("sums", "refused")] == old.records[("sums", "refused")] == 1
    np.testing.assert_array_equal(contribution.sums(fresh_proc.model)["p0.gram"], before)


def test_sums_that_do_not_fit_the_model_are_refused_not_fatal(caplog):
    """A record with this model's digest whose arrays do not fit (written by another iolstream version)."""
    sync, proc = _attached(_cfg())
    sums = _ones(proc)
    sums["p0.gram"] = np.ones((3, 3))
    with caplog.at_level("ERROR", logger="iolstream.group"):
        assert sync._take(_record(sync, "w2", 1, sums)) == 0
    assert sync.records[("sums", "refused")] == 1 and "w2" not in sync.state.members
    assert "p0.gram has shape (3, 3)" in caplog.text


@pytest.mark.parametrize(
    ("kind", "member", "arrays", "manifest"),
    [
        ("sums", "w2", None, {"label_clock": None}),  # a clock that is not a number
        (
            "sums",
            "w1",
            None,
            {"positions": [["f", 0]]},
        ),  # its own, taken back without a snapshot: positions unreadable
        (
            "scaling",
            "w2",
            {
                "count": np.array(5),
                "sum": np.zeros(2),
                "sumsq_dev": np.zeros(2),
                "mean": np.zeros(2),
                "scale": np.ones(2),
                "frozen": np.array(True),
            },
            {},
        ),  # 2 features, the model has 3
        ("scaling", "w2", {"mean": np.zeros(3)}, {}),
        ("rows", "w2", {"ids": np.array(["a"]), "payload": np.zeros((1, 1))}, {}),  # rows of another width
        ("rows", "w2", {"ids": np.array(["a"]), "payload": np.zeros((1, 3))}, {"published_ms": None}),
    ],
)
def test_a_record_that_does_not_load_changes_nothing_and_stops_nothing(kind, member, arrays, manifest):
    sync, proc = _attached(_cfg(scaler="warmup"))
    sync.restored = False  # a member with no snapshot takes its own newest sums back
    sync.caught_up = member != "w1"
    state = contribution.sums(proc.model)
    msg = _record(sync, member, 1, _ones(proc) if arrays is None else arrays, kind=kind, **manifest)
    assert sync._take(msg) == 0
    assert sync.records[(kind, "refused")] == 1
    for key, value in contribution.sums(proc.model).items():
        np.testing.assert_array_equal(value, state[key])
    assert not proc.model.scaler.frozen and proc.model.scaler.mean.shape == (3,)
    assert not sync.state.members and sync.adopted_positions is None and len(proc.join) == 0


def test_unreadable_headers_are_skipped():
    sync, proc = _attached(_cfg())
    assert sync._take(FakeRecord(b"x", [("iolstream.kind", b"\xff"), ("iolstream.member", b"w2")])) == 0
    assert (
        sync._take(FakeRecord(b"x", _headers("sums", "w2", 1, "5/2", 1))) == 0
    )  # a chunk index past the count
    assert sync._take(FakeRecord(b"x", _headers("sums", "w2", 1, "0/0", 1))) == 0
    assert not sync.chunks and not sync.records


def _chunked(sync, proc, member: str, seq: int, chunk_bytes: int) -> list[FakeRecord]:
    blob = snapshots.encode(
        {
            "published_ms": 1,
            "positions": [],
            **CLOCKS,
            "kind": "sums",
            "member": member,
            "seq": seq,
            "model": sync.model_digest,
        },
        _ones(proc),
    )
    count = -(-len(blob) // chunk_bytes)
    return [
        FakeRecord(
            blob[i * chunk_bytes : (i + 1) * chunk_bytes],
            _headers("sums", member, seq, f"{i}/{count}", len(blob)),
        )
        for i in range(count)
    ]


def test_chunks_of_two_records_under_one_sequence_are_not_joined():
    """A sequence reused (a restart that did not know its last one) with another chunk count: compaction keeps the old
    record's last chunks (keys <member>/<kind>/<i>) before the new one's. The new record is taken whole."""
    sync, proc = _attached(_cfg())
    old = _chunked(sync, proc, "w2", 1, 200)
    new = _chunked(sync, proc, "w2", 1, 2000)
    assert len(old) > len(new) >= 2
    left = old[len(new) :]  # compaction: the chunks whose keys the new record did not write again
    assert [sync._take(m) for m in left + new] == [0] * (len(left) + len(new) - 1) + [1]
    assert sync.state.members["w2"].seq == 1


def test_a_snapshot_between_two_chunks_resumes_before_the_first():
    """positions move past every chunk read; a snapshot taken between two chunks of a record resumes at its first
    chunk, so that the restored member reads the whole record (and what it already applied is stale)."""
    log = _Log()
    writer, writer_proc = _attached(_cfg(member="w2", chunk_bytes=1024))
    writer.output = log
    writer_proc.model.observe(np.random.default_rng(0).standard_normal((50, 3)))
    assert writer.publish({}, force=True)
    messages = log.messages()
    assert len(messages) >= 3
    reader, reader_proc = _attached(_cfg())
    reader.positions[0] = messages[0].offset() + 1  # as poll moves it
    assert reader._take(messages[0]) == 0
    saved = reader.to_state()
    assert saved[0]["positions"] == [[0, messages[0].offset()]]
    reader.attach(reader_proc, saved, start=True)
    reader.caught_up = True
    assert [reader._take(m) for m in messages if m.offset() >= reader.positions[0]][-1] == 1
    assert "w2" in reader.state.members


def test_the_handover_sequence_survives_a_restart():
    """Saved in the snapshot, and raised by this member's own rows records read from the log (a restart without a
    snapshot): a new handover never reuses a sequence."""
    sync, proc = _attached(_cfg())
    sync.state.handovers = 4
    saved = sync.to_state()
    again, _ = _attached(_cfg(), saved=saved)
    assert again.state.handovers == 4
    fresh, fresh_proc = _attached(_cfg())
    rows = {"ids": np.array(["a"]), "payload": np.zeros((1, fresh_proc.join.n_features))}
    assert fresh._take(_record(fresh, "w1", 7, rows, kind="rows")) == 1
    assert fresh.state.handovers == 7


class _StuckLog:
    """A deltas consumer whose log ends at ``end`` while nothing past ``read`` can be read (another member's
    transaction left open, a broker slow to answer)."""

    def __init__(self, read: int, end: int):
        self.read, self.end = read, end

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return 0, self.end

    def position(self, tps):
        return [TopicPartition(tp.topic, tp.partition, self.read) for tp in tps]

    def consume(self, num_messages=1, timeout=0.0):
        return []


def test_a_stop_that_cannot_read_the_log_to_its_end_says_what_its_snapshot_lacks(caplog):
    """The promise at a stop (docs/scaling.md): the final snapshot holds every record published before it, or says
    which it lacks; a start from it reads those first (it resumes from the snapshot's positions anyway)."""
    sync, proc = _attached(_cfg())
    sync.partitions, sync.positions = {0}, {0: 5}
    sync.consumer = _StuckLog(read=5, end=9)
    with caplog.at_level("WARNING", logger="iolstream.group"):
        assert sync.complete(0.3) is False
    assert "not read to its end at the stop" in caplog.text
    saved = sync.to_state()
    assert saved[0]["stop"] == {"ends": [[0, 9]], "behind": [[0, 5, 9]]}
    sync.consumer = _StuckLog(read=9, end=9)  # read to the end: nothing lacking
    assert sync.complete(0.3) is True and sync.to_state()[0]["stop"]["behind"] == []
    restarted, _ = _attached(_cfg())
    with caplog.at_level("INFO", logger="iolstream.group"):
        restarted.attach(proc, saved, start=True)
    assert "lacks records of the model-deltas topic published before its stop" in caplog.text
    assert restarted.positions == {0: 5}
