"""Group learning's configuration and offset rules (no broker)."""

import pytest

from iolstream.kafka.config import ConfigError, config_from_dict
from iolstream.kafka.offsets import OffsetBook

BASE = {"model": {"n_inputs": 3, "classes": [0, 1]}, "group": {"enabled": True, "member_id": "w1"}}


def _cfg(**sections):
    raw = {**BASE, **{k: {**BASE.get(k, {}), **v} for k, v in sections.items()}}
    return config_from_dict(raw, environ={})


def test_member_id_gives_the_transactional_id_and_the_snapshot_directory():
    cfg = _cfg(kafka={"group_id": "g"}, snapshot={"dir": "snaps"})
    assert cfg.transactional_id == "g-w1"
    assert cfg.snapshot_dir == "snaps/w1"
    off = config_from_dict({"model": BASE["model"], "kafka": {"group_id": "g"}}, environ={})
    assert off.transactional_id == "g-worker" and off.snapshot_dir == "snapshots"


def test_regression_and_forgetting_are_group_learning_too():
    cfg = _cfg(model={"classes": None, "n_outputs": 1, "forgetting": 5000})
    assert cfg.model.target_scaler == "warmup" and cfg.model.forgetting == 5000  # the group agrees on the scaling


def test_env_overrides_the_member_id():
    cfg = config_from_dict(BASE, environ={"IOLSTREAM_GROUP__MEMBER_ID": "w7"})
    assert cfg.member_id == "w7"


@pytest.mark.parametrize(("sections", "key"), [
    ({"stream": {"forget_expired": True}}, "stream.forget_expired"),
    ({"group": {"member_id": "a/b"}}, "group.member_id"),
    ({"group": {"sync_every_ms": 0}}, "group.sync_every_ms"),
    ({"topics": {"model_deltas": "iol.labels"}}, "topics.model_deltas"),
])  # fmt: skip
def test_what_group_learning_cannot_take_is_named(sections, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _cfg(**sections)


def test_a_partition_another_member_learned_starts_at_its_committed_offset():
    book = OffsetBook(exactly_once=True, positions={("f", 0): 5}, group=True)
    book.assign(("f", 0), committed=40, by_other=True)  # another member learned 5..40: not again here
    assert book.start(("f", 0)) == 40 and not book.replay_until
    book.assign(("f", 1), committed=30, by_other=True)  # never consumed here
    assert book.start(("f", 1)) == 30
    book.assign(("f", 2), committed=30, by_other=False)  # this member's own commit: replayed from the beginning
    assert book.start(("f", 2)) is None and book.replay_until[("f", 2)] == 30
    single = OffsetBook(exactly_once=True, positions={("f", 0): 5})
    single.assign(("f", 0), committed=40, by_other=True)  # without group learning nothing changes
    assert single.start(("f", 0)) == 5 and single.replay_until[("f", 0)] == 40


class _Msg:
    """What GroupSync reads of a consumed record."""

    def __init__(self, value: bytes, headers):
        self._value, self._headers = value, headers

    def value(self):
        return self._value

    def headers(self):
        return self._headers

    def partition(self):
        return 0

    def offset(self):
        return 7


def _record(sync, member: str, seq: int, sums: dict, model_digest: str) -> _Msg:
    from iolstream.kafka import snapshots

    clocks = {"clock": 10, "rows": 10, "label_clock": 0, "label_rows": 0}
    blob = snapshots.encode({"published_ms": 1, "positions": [], "kind": "sums", "member": member, "seq": seq,
                             "model": model_digest, **clocks}, sums)  # fmt: skip
    headers = [("iolstream.kind", b"sums"), ("iolstream.member", member.encode()), ("iolstream.seq", str(seq).encode()),
               ("iolstream.chunk", b"0/1"), ("iolstream.size", str(len(blob)).encode())]  # fmt: skip
    return _Msg(blob, headers)


def test_sums_of_another_model_config_are_skipped_not_fatal():
    """A compacted deltas topic keeps every member's last record: after a model change the old ones must not stop
    the new members (or crash-loop them); they are skipped, logged once, counted as refused."""
    import numpy as np

    from iolstream.core import contribution
    from iolstream.core.model import EdRVFL
    from iolstream.kafka.group import GroupSync
    from iolstream.stream.processor import StreamProcessor

    cfg = _cfg(model={"n_nodes": 8, "scaler": "none"})
    sync = GroupSync(cfg, output=None)
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream)
    sync.attach(proc, None, start=True)
    sync.caught_up = True
    sums = {k: np.ones(v) for k, v in contribution.layout(proc.model).items()}
    before = contribution.sums(proc.model)["p0.gram"].copy()
    assert sync._take(_record(sync, "old", 1, sums, "0123456789abcdef")) == 0
    assert sync.records[("sums", "refused")] == 1
    np.testing.assert_array_equal(contribution.sums(proc.model)["p0.gram"], before)
    assert sync._take(_record(sync, "w2", 1, sums, sync.model_digest)) == 1  # the same config: applied
    assert sync.state.members["w2"].seq == 1
    np.testing.assert_allclose(contribution.sums(proc.model)["p0.gram"], before + 1.0)


def _attached(cfg, candidates=None):
    from iolstream.core.model import EdRVFL
    from iolstream.kafka.group import GroupSync
    from iolstream.stream.processor import StreamProcessor

    sync = GroupSync(cfg, output=None)
    proc = StreamProcessor(EdRVFL(cfg.model, candidates=candidates), cfg.stream)
    sync.attach(proc, None, start=True)
    sync.caught_up = True
    return sync, proc


def test_a_member_restored_with_another_candidate_grid_refuses_and_is_refused():
    """A snapshot keeps the auto grid it was saved with. After a release that changed the grid, a restored member's
    sums and a fresh member's (and the records of members still on the old release) have the same shapes but other
    settings (half-life 16384 is not 512): they are refused both ways, not added."""
    import numpy as np

    from iolstream.core import contribution
    from iolstream.core.candidates import FIRST_GRID, candidate_grid
    from iolstream.kafka.group import model_digest

    cfg = _cfg(model={"n_nodes": 8, "scaler": "none", "lam": "auto", "forgetting": "auto"})
    fresh, fresh_proc = _attached(cfg)
    old, old_proc = _attached(cfg, candidates=candidate_grid("auto", "auto", *FIRST_GRID))
    assert contribution.layout(fresh_proc.model) == contribution.layout(old_proc.model)  # alike: shapes tell nothing
    assert fresh.model_digest != old.model_digest
    assert fresh.model_digest != model_digest(cfg.model)  # records of a release whose default grid was another
    fixed = _cfg(model={"n_nodes": 8, "scaler": "none"})
    assert _attached(fixed)[0].model_digest == model_digest(fixed.model)  # one candidate: the config's digest, as before
    sums = {k: np.ones(v) for k, v in contribution.layout(fresh_proc.model).items()}
    before = contribution.sums(fresh_proc.model)["p0.gram"].copy()
    assert fresh._take(_record(fresh, "restored", 1, sums, old.model_digest)) == 0
    assert old._take(_record(old, "fresh", 1, sums, fresh.model_digest)) == 0
    assert fresh.records[("sums", "refused")] == old.records[("sums", "refused")] == 1
    np.testing.assert_array_equal(contribution.sums(fresh_proc.model)["p0.gram"], before)


def test_sums_that_do_not_fit_the_model_are_refused_not_fatal(caplog):
    """A record with this model's digest whose arrays do not fit (written by another iolstream version): skipped and
    counted; the worker goes on."""
    import numpy as np

    from iolstream.core import contribution

    sync, proc = _attached(_cfg(model={"n_nodes": 8, "scaler": "none"}))
    sums = {k: np.ones(v) for k, v in contribution.layout(proc.model).items()}
    sums["p0.gram"] = np.ones((3, 3))
    with caplog.at_level("ERROR", logger="iolstream.group"):
        assert sync._take(_record(sync, "w2", 1, sums, sync.model_digest)) == 0
    assert sync.records[("sums", "refused")] == 1 and "w2" not in sync.state.members
    assert "p0.gram has shape (3, 3)" in caplog.text
