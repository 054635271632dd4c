"""The commit unit without a broker (kafka.commit): the order in which a cycle's end, a revoke and a shutdown
call the session, group learning, the producer, the transaction, the snapshot store and the offset commit, for
both delivery modes; what each mode answers the others; a roll-back replacing the processor whole.

The clients are the fakes of tests/kafka_fakes.py, which journal every call; everything else is the worker's
own (session, offset book, outputs, transactions, assignment, snapshot store on disk). The same orders hold
against a real broker in test_durability_kafka.py and test_group_kafka.py, which assert their outcomes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from confluent_kafka import KafkaError
from kafka_fakes import JournalGroup, commit_unit
from test_paths import modules_called

from iolstream.kafka.commit import AtLeastOnce, ExactlyOnce, delivery_mode
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.output import Output
from iolstream.kafka.participant import Solo
from iolstream.kafka.transactions import TransactionalOutput
from iolstream.stream.outputs import StepOutput

F0 = ("f", 0)


def _cfg(tmp_path, exactly_once: bool, **snapshot):
    raw = {
        "model": {"n_inputs": 4, "classes": [0, 1], "n_nodes": 8, "n_layers": 1, "scaler": "none"},
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
        "topics": {"features": "f", "labels": "l", "predictions": "p", "dead_letters": "d", "create": False},
        "stream": {"batch_rows": 4},
        "snapshot": {"dir": str(tmp_path), "every_batches": 1, **snapshot},
        "durability": {"exactly_once": exactly_once, "transactional_id": "g-txn"},
        "metrics": {"port": 0},
    }
    return config_from_dict(raw, environ={})


def _consume(unit, rows: int) -> None:
    """``rows`` one-row features messages of ("f", 0) processed (not stepped): the positions cover them."""
    unit.book.assign(F0, None)
    for offset in range(rows):
        value = orjson.dumps({"ids": [f"r{offset}"], "x": [[0.1 * offset, 1.0, -1.0, 0.5]]})
        unit.session.processor.on_features(value, ("f", 0, offset), now_ms=0)
        unit.book.processed(F0, offset)


def _produced(n: int) -> list[str]:
    return ["produce p"] * n


@pytest.mark.parametrize("exactly_once", [False, True])
def test_end_cycle_steps_publishes_commits_then_checkpoints_in_order(tmp_path, exactly_once):
    journal = []
    unit = commit_unit(_cfg(tmp_path, exactly_once), journal)
    _consume(unit, 4)  # a full batch: stepped at the cycle's end
    unit.end_cycle(int(time.time() * 1000), processed=True)
    checkpoint = ["group.before_checkpoint", "flush", "snapshot"]
    if (
        exactly_once
    ):  # one transaction: the predictions and the input offsets, committed before the checkpoint
        assert journal == [
            "step(force)",
            "begin",
            *_produced(4),
            "group.on_cycle",
            ("offsets", [("f", 0, 4)]),
            "commit",
            "poll",
            *checkpoint,
        ]
    else:  # the offsets committed only once the snapshot covering them is written
        assert journal == [
            "step",
            *_produced(4),
            "group.on_cycle",
            "poll",
            *checkpoint,
            ("consumer.commit", [("f", 0, 4)]),
        ]
    assert unit.book.committed_floor == {F0: 4}


@pytest.mark.parametrize("exactly_once", [False, True])
def test_partitions_go_learn_hand_over_then_checkpoint(tmp_path, exactly_once):
    journal = []
    unit = commit_unit(_cfg(tmp_path, exactly_once), journal)
    _consume(unit, 3)  # a partial batch, waiting in the batcher
    assert unit.partitions_go([F0])
    # group learning steps what waits (a member's hook does), then the checkpoint: exactly-once commits the
    # transaction those outputs opened before the snapshot, at-least-once commits the offsets after it
    eos = ["group.before_checkpoint", ("offsets", [("f", 0, 3)]), "commit"]
    alo = ["group.before_checkpoint"]
    expected = ["group.on_revoke", "step(force)", *(["begin"] if exactly_once else []), *_produced(3)]
    expected += [*(eos if exactly_once else alo), "flush", "snapshot"]
    expected += [] if exactly_once else [("consumer.commit", [("f", 0, 3)])]
    assert journal == expected


@pytest.mark.parametrize("exactly_once", [False, True])
def test_finish_flushes_the_partial_batch_before_the_final_checkpoint(tmp_path, exactly_once):
    journal = []
    unit = commit_unit(_cfg(tmp_path, exactly_once), journal)
    _consume(unit, 3)
    assert unit.finish()
    flushed = ["step(force)"]
    if exactly_once:  # in a last transaction of its own
        flushed += ["begin", *_produced(3), ("offsets", [("f", 0, 3)]), "commit"]
    else:
        flushed += _produced(3)
    tail = ["group.before_checkpoint", "group.at_stop", "flush", "snapshot"]
    tail += [] if exactly_once else [("consumer.commit", [("f", 0, 3)])]
    assert journal == [*flushed, "group.on_revoke", "step(force)", *tail]


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_single_worker_does_not_step_at_a_revoke(tmp_path, exactly_once):
    """Solo, group learning's stand-in, does nothing at any hook: a revoke checkpoints the partial batch as it
    is (the snapshot holds the rows waiting in the batcher, their positions with them)."""
    journal = []
    unit = commit_unit(_cfg(tmp_path, exactly_once), journal, group=Solo())
    _consume(unit, 3)
    assert unit.partitions_go([F0])
    assert journal == ["flush", "snapshot", *([] if exactly_once else [("consumer.commit", [("f", 0, 3)])])]
    assert unit.session.processor.counters["predictions_out"] == 0


def test_a_lost_transaction_rolls_back_to_a_new_processor_and_checkpoints_nothing(tmp_path):
    journal = []
    unit = commit_unit(_cfg(tmp_path, True), journal, committed={F0: 2})
    unit.output.producer.commit_errors.append(KafkaError(KafkaError._STATE, "lost", txn_requires_abort=True))
    attached = []
    unit.group.attach = lambda processor, saved, start=False: attached.append(processor)
    _consume(unit, 4)
    before = unit.session.processor
    unit.end_cycle(int(time.time() * 1000), processed=True)
    assert journal[-3:] == ["commit", "abort", "poll"] and "snapshot" not in journal
    # the roll-back replaced the processor, its positions and the replay state whole, in the session
    after = unit.session.processor
    assert after is not before and attached == [after] and after.counters["rows_in"] == 0
    assert unit.book.positions == {} and unit.book.replay_until == {F0: 2} and not unit.session.replaying
    assert unit.assignment.consumer.seeks == [("f", 0, -2)]  # read again from its beginning


def test_each_mode_answers_how_to_produce_whether_to_replay_and_when_the_first_checkpoint_is_due(tmp_path):
    alo, eos = _cfg(tmp_path, False), _cfg(tmp_path, True)
    assert delivery_mode(alo) is AtLeastOnce and delivery_mode(eos) is ExactlyOnce
    assert type(AtLeastOnce.make_output(alo)) is Output
    assert isinstance(ExactlyOnce.make_output(eos), TransactionalOutput)
    assert not AtLeastOnce.replays_committed and ExactlyOnce.replays_committed
    later = time.monotonic() + 3600  # snapshot.first_after_seconds not reached yet
    for cfg, due in ((alo, False), (eos, True)):
        cfg = _cfg(tmp_path / str(due), cfg.durability.exactly_once, every_batches=1000, every_seconds=3600)
        unit = commit_unit(cfg, [], group=JournalGroup([]))
        _consume(unit, 1)
        unit.checkpoints.first_due = later
        # exactly-once: as soon as the replay is over; at-least-once: a moment after the start
        assert (
            unit.checkpoints.due(unit.session.processor, unit.book.positions, soon=unit._soon_after_start)
            is due
        )
        unit.book.replay_until[F0] = 5  # mid-replay: never the early one
        assert not unit.checkpoints.due(
            unit.session.processor, unit.book.positions, soon=unit._soon_after_start
        )


def test_the_modules_one_commit_crosses_are_the_ones_docs_architecture_names(tmp_path):
    """The end of a cycle that steps a batch, commits it and writes a checkpoint, traced in both modes: the
    modules it enters are those docs/architecture.md lists for the path of one commit, no more, no fewer."""
    crossed = {}
    for exactly_once in (False, True):
        unit = commit_unit(_cfg(tmp_path / str(exactly_once), exactly_once), [], group=Solo())
        _consume(unit, 4)
        now = int(time.time() * 1000)
        crossed[exactly_once] = {
            m
            for m in modules_called(lambda u=unit, t=now: u.end_cycle(t, processed=True))
            if m.startswith("iolstream/kafka/")
        }
        assert unit.checkpoints.last.offsets == {F0: 4}  # it did write the checkpoint
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## The path of one commit") :]
    listed = section[section.index("The module files of the path above") :].split("\n\n")[0]
    named = set(re.findall(r"`(iolstream/kafka/[a-z_]+\.py)`", listed))
    assert crossed[False] | crossed[True] == named, (sorted(crossed[False]), sorted(crossed[True]))
    assert {"iolstream/kafka/transactions.py"} == crossed[True] - crossed[False]
    assert {"iolstream/kafka/assignment.py"} == crossed[False] - crossed[True]  # the offsets' commit


def test_owed_predictions_go_out_once_and_again_after_a_lost_transaction(tmp_path):
    """Predictions a re-learning owes (kafka.relearn: rows committed before any was predicted) go out at the
    first step, in its transaction; that transaction lost, the roll-back owes them again, and the next one that
    commits carries them: sent once to a read_committed reader."""
    journal = []
    unit = commit_unit(_cfg(tmp_path, True), journal, committed={F0: 2})
    owed = StepOutput()
    owed.add_predictions(
        ["a", "b"],
        y_hat=np.array([0, 1]),
        proba=np.array([[0.8, 0.2], [0.3, 0.7]]),
        model_version=1,
        ts_in=None,
        ts_out_ms=0,
        mode="forward",
        classes=(0, 1),
    )
    unit.session.owe([owed.predictions_only()])
    unit.output.producer.commit_errors.append(KafkaError(KafkaError._STATE, "lost", txn_requires_abort=True))
    unit.end_cycle(int(time.time() * 1000), processed=False)
    assert journal.count("produce p") == 2 and journal[-3:] == ["commit", "abort", "poll"]
    del journal[:]
    # the roll-back: the group's committed input is replayed without emitting; the owed go out after it
    unit.book.replay_until.clear()
    unit.end_cycle(int(time.time() * 1000), processed=False)
    assert journal.count("produce p") == 2 and "commit" in journal and "abort" not in journal
    del journal[:]
    unit.end_cycle(int(time.time() * 1000), processed=False)
    assert "produce p" not in journal  # sent, committed: no longer owed
