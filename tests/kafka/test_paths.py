"""The path of one message and of one label through the worker, traced without a broker: the modules of the
adapter (kafka), of the stream logic and of ops that they enter are those docs/architecture.md lists for each
path, no more, no fewer; the core modules it lists are entered too (which of the model's modules a step enters
also depends on what the candidates' scoring budget allows, so core is not held to the exact set). The path of
one commit is checked in test_commit_unit.py.

The loop's own part of a cycle (``Worker._feed``) runs over the worker's real intake, aligner, session, offset
book and output; the clients are the fakes of tests/kafka_fakes.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
from kafka_fakes import FeedingConsumer, commit_unit

from iolstream.kafka.config import config_from_dict
from iolstream.kafka.health import BrokerHealth
from iolstream.kafka.intake import Intake
from iolstream.kafka.participant import Solo
from iolstream.kafka.worker import Worker

DOC = Path(__file__).parents[2] / "docs" / "architecture.md"
EXACT = ("kafka", "stream", "ops")  # the rooms whose modules on a path must be exactly those listed


def modules_called(call) -> set[str]:
    """The iolstream modules entered while ``call()`` runs (every Python call, traced)."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and "/iolstream/" in (path := frame.f_code.co_filename):
            seen.add("iolstream/" + path.rsplit("/iolstream/", 1)[1])

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def _listed(title: str) -> set[str]:
    """The module files docs/architecture.md lists under ``title`` ("The module files of the path above")."""
    doc = DOC.read_text()
    section = doc[doc.index(title) :]
    listed = section[section.index("The module files of the path above") :].split("\n\n")[0]
    return set(re.findall(r"`(iolstream/[a-z_]+/[a-z_]+\.py)`", listed))


def _room(module: str) -> str:
    return module.split("/")[1]


class _Loop:
    """A worker's cycle without its clients: consume → align (``Intake``) → feed → emit (``Worker._feed``)."""

    def __init__(self, tmp_path):
        raw = {
            "model": {"n_inputs": 4, "classes": [0, 1], "n_nodes": 8, "n_layers": 2, "scaler": "none"},
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
            "topics": {
                "features": "f",
                "labels": "l",
                "predictions": "p",
                "dead_letters": "d",
                "create": False,
            },
            "stream": {"batch_rows": 4, "label_batch_rows": 4},
            "snapshot": {"dir": str(tmp_path)},
            "metrics": {"port": 0},
        }
        cfg = config_from_dict(raw, environ={})
        self.unit = unit = commit_unit(cfg, [], group=Solo())
        self.consumer = unit.assignment.consumer = FeedingConsumer()
        for key in (("f", 0), ("l", 0)):
            unit.book.assign(key, None)
        self.intake = Intake(
            cfg, unit.book, unit.aligner, unit.assignment, BrokerHealth(unit.calls), lambda *a, **k: None
        )
        self.loop = SimpleNamespace(
            session=unit.session, book=unit.book, metrics=None, cfg=cfg, crash_points=False
        )

    @property
    def counters(self) -> dict:
        return self.unit.session.processor.counters

    def features(self, ids: list[str], shift: float) -> None:
        x = [[0.1 * i + shift, 1.0, -1.0, 0.5] for i in range(len(ids))]
        self.consumer.send("f", orjson.dumps({"ids": ids, "x": x}))

    def labels(self, ids: list[str]) -> None:
        self.consumer.send("l", orjson.dumps({"ids": ids, "y": [i % 2 for i in range(len(ids))]}))

    def cycle(self, now: int) -> None:
        """One cycle's consume → align → feed → emit (``Worker._cycle`` but for the commit unit's end)."""
        before = self.counters["rows_in"] + self.counters["labels_in"]
        _, ready = self.intake.take(None)
        Worker._feed(self.loop, ready, now)
        self.intake.processed(len(ready), self.counters["rows_in"] + self.counters["labels_in"] - before)

    def drain(self, now: int) -> None:
        """Cycles until every message sent is fed, each cycle's end stepping what is due."""
        while self.consumer.queue or self.unit.aligner.queued:
            self.cycle(now)
            self.unit.session.step(now, force=True)


def test_the_modules_one_message_and_one_label_cross_are_the_ones_docs_architecture_names(tmp_path):
    loop = _Loop(tmp_path)
    for k in range(3):  # the kernels loaded, the candidates past their first batches
        ids = [f"w{k}-{i}" for i in range(4)]
        loop.features(ids, k)
        loop.labels(ids)
        loop.drain(k)
    ids = ["a1", "a2", "a3", "a4"]
    predicted, learned = loop.counters["predictions_out"], loop.counters["rows_learned"]
    loop.features(ids, 0.5)  # a whole batch: stepped and emitted in the cycle that feeds it
    message = modules_called(lambda: loop.cycle(100))
    assert loop.counters["predictions_out"] == predicted + 4
    loop.labels(ids)  # joined in the cycle that feeds it, learned at the step after (the cycle's end)
    label = modules_called(lambda: (loop.cycle(101), loop.unit.session.step(102)))
    assert loop.counters["rows_learned"] == learned + 4
    for title, crossed in (("## The path of one message", message), ("## The path of one label", label)):
        listed = _listed(title)
        exact = {m for m in crossed if _room(m) in EXACT}
        assert exact == {m for m in listed if _room(m) in EXACT}, (title, sorted(exact))
        assert {m for m in listed if _room(m) == "core"} <= crossed, (title, sorted(crossed))
