"""The path of one message through ``StreamProcessor.feed``, traced: the modules it stays in below the processor
are those docs/architecture.md counts ("The path of one message"), stay for stay, and each feature row's id is
looked up once, on arrival (the arrival screen, ``stream.screen``), never again when its batch is stepped.

A stay is a run of Python calls inside one module of the package; leaving it for another module and coming
back (a helper returning to its caller) starts a new stay. The processor itself, which calls each stage in turn,
is not counted.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import orjson

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import StreamConfig
from iolstream.stream.joinbuffer import JoinBuffer
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.recent_ids import RecentIds

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _module(frame) -> str | None:
    path = frame.f_code.co_filename.replace("\\", "/")
    if "/iolstream/" not in path:
        return None
    return path.rsplit("/iolstream/", 1)[1][: -len(".py")]


def _traced(call) -> tuple[list[str], Counter]:
    """(the package modules Python ran in, in turn, each run once; the functions called, by qualified name)."""
    runs, functions = [], Counter()

    def profile(frame, event, arg):
        if event == "call":
            module = _module(frame)
            if module is not None:
                functions[frame.f_code.co_qualname] += 1
        elif event == "return" and frame.f_back is not None:
            module = _module(frame.f_back)
        else:
            return
        if module is not None and (not runs or runs[-1] != module):
            runs.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return runs, functions


def _stays(runs: list[str]) -> Counter:
    """Stays per module (by its name in its room, ``joinbuffer``), the processor's left out."""
    below = [m for m in runs if m != "stream/processor"]
    merged = [m for i, m in enumerate(below) if i == 0 or below[i - 1] != m]
    return Counter(m.rsplit("/", 1)[1] for m in merged)


def _documented() -> dict[str, Counter]:
    """The table of docs/architecture.md's path of one message: each row's first cell -> its "after" stays."""
    section = DOC.read_text().split("## The path of one message", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`"):
            pairs = re.findall(r"([a-z_]+) (\d+)", cells[2].split("`")[1])
            out[cells[0]] = Counter({name: int(n) for name, n in pairs})
    return out


def _processor() -> StreamProcessor:
    model = EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1, 2), n_nodes=16, n_layers=2, scaler="none"))
    cfg = StreamConfig(batch_rows=32, label_batch_rows=32, max_batch_latency_ms=20, max_label_latency_ms=40)
    proc = StreamProcessor(model, cfg)
    rng = np.random.default_rng(0)
    for j in range(3):  # kernels compiled, caches warm, ids remembered: the path of a running worker
        ids = [f"w{j}-{i}" for i in range(32)]
        proc.feed(orjson.dumps({"ids": ids, "x": rng.normal(size=(32, 4)).tolist()}), None, j)
        proc.feed(orjson.dumps({"ids": ids, "y": rng.integers(0, 3, 32).tolist()}), None, j, labels=True)
    return proc


def _features(ids) -> bytes:
    return orjson.dumps({"ids": ids, "x": [[0.5, 1.0, -1.0, 2.0]] * len(ids)})


def test_the_stays_of_one_message_are_those_docs_architecture_counts():
    proc = _processor()
    ids = ["a0", "a1", "a2", "a3"]
    traced = {
        "features, a batch of rows": _traced(lambda: proc.feed(_features(ids), None, 100))[0],
        "features, one row": _traced(
            lambda: proc.feed(b'{"id": "a4", "x": [0.5, 1.0, -1.0, 2.0]}', None, 100)
        )[0],
        "labels of rows waiting for their batch": _traced(
            lambda: proc.feed(orjson.dumps({"ids": ids, "y": [0, 1, 2, 0]}), None, 101, labels=True)
        )[0],
    }
    proc.step(1_000, force=True)
    proc.feed(_features(["b0", "b1", "b2", "b3"]), None, 1_001)
    proc.step(2_000, force=True)
    traced["labels of rows waiting for their labels"] = _traced(
        lambda: proc.feed(
            orjson.dumps({"ids": ["b0", "b1", "b2", "b3"], "y": [0, 1, 2, 0]}), None, 2_001, labels=True
        )
    )[0]
    documented = _documented()
    assert set(documented) == set(traced), sorted(documented)
    for name, runs in traced.items():
        assert _stays(runs) == documented[name], (name, runs)
    # decode -> screen -> batch, each once: no stage is entered again after the next one began
    order = [
        m
        for m in traced["features, a batch of rows"]
        if m in ("stream/codec", "stream/screen", "stream/batcher")
    ]
    assert [m for i, m in enumerate(order) if i == 0 or order[i - 1] != m] == [
        "stream/codec",
        "stream/screen",
        "stream/batcher",
    ]


def test_a_rows_id_is_looked_up_once_on_arrival_and_not_again_when_its_batch_is_stepped():
    proc = _processor()
    ids = [f"c{i}" for i in range(32)]
    _, arrival = _traced(lambda: proc.feed(_features(ids[:16]), None, 100))
    assert (
        arrival[RecentIds.remembers_any.__qualname__] == 1 and arrival[JoinBuffer.refusals.__qualname__] == 1
    )
    _, step = _traced(lambda: proc.feed(_features(ids[16:]), None, 101))  # fills the batch: stepped at once
    assert step[JoinBuffer.refusals.__qualname__] == 1  # the second message's own screen
    assert step[RecentIds.remembers_any.__qualname__] == 1
    assert step[JoinBuffer._unseen.__qualname__] == 0 and step[JoinBuffer.add_rows.__qualname__] == 1
    assert proc.join.counters["rows_added"] >= 32 and proc.pending_rows >= 32
