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
    assert (
        cfg.model.target_scaler == "warmup" and cfg.model.forgetting == 5000
    )  # the group agrees on the scaling


def test_env_overrides_the_member_id():
    cfg = config_from_dict(BASE, environ={"IOLSTREAM_GROUP__MEMBER_ID": "w7"})
    assert cfg.member_id == "w7"


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"stream": {"forget_expired": True}}, "stream.forget_expired"),
        ({"group": {"member_id": "a/b"}}, "group.member_id"),
        ({"group": {"sync_every_ms": 0}}, "group.sync_every_ms"),
        ({"topics": {"model_deltas": "iol.labels"}}, "topics.model_deltas"),
    ],
)
def test_what_group_learning_cannot_take_is_named(sections, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _cfg(**sections)


def test_a_partition_another_member_learned_starts_at_its_committed_offset():
    book = OffsetBook(replay_committed=True, positions={("f", 0): 5}, group=True)
    book.assign(("f", 0), committed=40, by_other=True)  # another member learned 5..40: not again here
    assert book.start(("f", 0)) == 40 and not book.replay_until
    book.assign(("f", 1), committed=30, by_other=True)  # never consumed here
    assert book.start(("f", 1)) == 30
    book.assign(
        ("f", 2), committed=30, by_other=False
    )  # this member's own commit: replayed from the beginning
    assert book.start(("f", 2)) is None and book.replay_until[("f", 2)] == 30
    single = OffsetBook(replay_committed=True, positions={("f", 0): 5})
    single.assign(("f", 0), committed=40, by_other=True)  # without group learning nothing changes
    assert single.start(("f", 0)) == 5 and single.replay_until[("f", 0)] == 40


@pytest.mark.parametrize("exactly_once", [True, False])
def test_a_partition_taken_over_resumes_at_the_take_over_after_a_roll_back_or_restart(exactly_once):
    """This member's state S holds ("f", 0) only. ("f", 1) comes from another member at its commit 200; this one
    learns 200..250 and commits 250 as its own. A roll-back (or a restart) to S, which has no ("f", 1), must not
    read it from its beginning (0..200 is in the other member's sums): the commit names the take-over, 200."""
    from iolstream.kafka.offsets import parse_metadata

    snapshot = {("f", 0): 5}
    book = OffsetBook(replay_committed=exactly_once, positions=snapshot, group=True)
    book.assign(("f", 1), committed=200, by_other=True)
    assert book.start(("f", 1)) == 200 and book.bases == {("f", 1): 200}
    book.processed(("f", 1), 249)
    assert book.metadata("w1", ("f", 1)) == "w1/200" and book.metadata("w1", ("f", 0)) == "w1"
    # a commit made while every row waited for the group's scaling says so, and names the same member and base
    assert parse_metadata(book.metadata("w1", ("f", 1), held=True)) == ("w1", 200)
    book.reset(snapshot)  # the roll-back: the state before the take-over
    book.assign(("f", 1), committed=250, by_other=False)
    assert book.start(("f", 1)) == 200
    assert book.replay_until.get(("f", 1)) == (250 if exactly_once else None)  # re-learned without emitting
    restarted = OffsetBook(
        replay_committed=exactly_once, positions=snapshot, group=True
    )  # a new process: from the commit
    member, base = parse_metadata(book.metadata("w1", ("f", 1)))
    restarted.assign(("f", 1), committed=250, by_other=member != "w1", base=base)
    assert restarted.start(("f", 1)) == 200 and restarted.bases == {("f", 1): 200}
    covered = OffsetBook(replay_committed=exactly_once, positions={**snapshot, ("f", 1): 240}, group=True)
    covered.assign(("f", 1), committed=250, by_other=False, base=200)  # a state that has it: its own position
    assert covered.start(("f", 1)) == 240


def test_commit_metadata_names_the_member_and_the_take_over():
    from iolstream.kafka.offsets import commit_metadata, parse_metadata

    assert parse_metadata(commit_metadata("w1", 200)) == ("w1", 200)
    assert parse_metadata(commit_metadata("w1", None)) == ("w1", None)
    assert parse_metadata("") == parse_metadata(None) == ("", None)  # a commit of an older iolstream, or none
    assert parse_metadata("some/other-tool") == ("some/other-tool", None)
