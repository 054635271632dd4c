"""The stream logic's output pinned: a fixed stream (arrays with ten classes and ``mode: auto``, named-field
events with gaps, categories and passthrough fields, a regression with intervals) run through the processor, and
everything it gives compared with what it gave when the file ``tests/data/pinned-stream-output.json`` was
written: each prediction (its fields, their order, ids, classes, versions, times), every dead letter (reason,
detail, bytes, source), the status (counters, metrics) and a digest of each snapshot array.

It guards the per-row path's speed work (vectorised decoding, encoding, joins): any of those may change how
the output is made, never what it is. Floats compare to 1e-12 relative (the file was written on one machine;
another BLAS may round the last bit differently); everything else compares exactly.

Written again (only when the output is meant to change) by
``.venv/bin/python tests/stream/test_pinned_output.py --write``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import orjson

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import EventsConfig, StreamConfig
from iolstream.stream.processor import StreamProcessor

PINNED = Path(__file__).resolve().parents[1] / "data" / "pinned-stream-output.json"
CFG = StreamConfig(batch_rows=32, label_batch_rows=32, max_batch_latency_ms=20, max_label_latency_ms=40)
FIELDS = [
    {"name": "amount", "type": "number"},
    {"name": "score", "type": "number", "required": True},
    {"name": "country", "type": "category", "values": ["FR", "DE"]},
    {"name": "device.os", "type": "category", "buckets": 4},
    {"name": "vip", "type": "boolean"},
]
SHAPE = EventsConfig(
    id_field="order_id", label_field="is_fraud", time_field="ts", passthrough=["country", "shop"]
)


def _drive(proc: StreamProcessor, messages) -> dict:
    """Feed (kind, value) messages at a clock of 7 ms a message, labels as they come; everything emitted."""
    predictions, dead = [], []
    for i, (kind, value) in enumerate(messages):
        out = proc.feed(value, (kind, 0, i), i * 7, labels=kind == "labels")
        for o in (out, proc.step(i * 7)):
            if o:
                predictions += [[key, value.decode()] for key, value in o.predictions]
                dead += [
                    [d.bad.reason, d.bad.detail, d.value.decode(), list(d.source or [])]
                    for d in o.dead_letters
                ]
    final = proc.step(len(messages) * 7 + 10_000, force=True)
    predictions += [[key, value.decode()] for key, value in final.predictions]
    dead += [[d.bad.reason, d.bad.detail, d.value.decode(), list(d.source or [])] for d in final.dead_letters]
    manifest, arrays = proc.to_state()
    digest = {}
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        if a.dtype.kind in "fiub":
            f = a.astype(np.float64)
            digest[name] = [a.dtype.str, list(a.shape), float(np.nansum(f)), float(np.nansum(np.abs(f)))]
        else:
            digest[name] = [a.dtype.str, list(a.shape), [str(v) for v in a.reshape(-1).tolist()][:50]]
    status = proc.status()
    return {
        "predictions": predictions,
        "dead_letters": dead,
        "status": status,
        "stream_manifest": manifest["stream"],
        "arrays": digest,
    }


def _labels_late(features: list[bytes], labels: list[bytes]) -> list:
    """Each label message one features message late."""
    out = []
    for i, f in enumerate(features):
        out.append(("features", f))
        if i:
            out.append(("labels", labels[i - 1]))
    out.append(("labels", labels[-1]))
    return out


def arrays_stream(processor=StreamProcessor) -> dict:
    """300 rows of ten classes, ``mode: auto`` (the default), batch and one-row messages, with refusals
    (``processor``: the processor class that runs them)."""
    rng = np.random.default_rng(29)
    X = rng.normal(size=(300, 10))
    y = (np.abs(X[:, :3]).sum(axis=1) * 3).astype(int) % 10
    feats, labs = [], []
    for start in range(0, 300, 25):
        stop = start + 25
        ids = [f"r{i}" for i in range(start, stop)]
        if start % 100 == 50:  # one-row messages for a while
            for i in range(start, stop):
                feats.append(orjson.dumps({"id": f"r{i}", "x": X[i].tolist(), "ts": 1000 + i}))
                labs.append(orjson.dumps({"id": f"r{i}", "y": int(y[i])}))
            continue
        feats.append(
            orjson.dumps(
                {"ids": ids, "x": X[start:stop].tolist(), "ts": [1000 + i for i in range(start, stop)]}
            )
        )
        labs.append(orjson.dumps({"ids": ids, "y": y[start:stop].tolist()}))
    feats[3] = feats[3][:-1] + b"garbage"  # a malformed message
    labs[5] = orjson.dumps({"id": "r130", "y": 42})  # a class unknown
    feats.insert(9, orjson.dumps({"id": "r10", "x": X[10].tolist()}))  # a duplicate id
    labs.insert(9, orjson.dumps({"id": "nobody", "y": 1}))
    model = EdRVFL(
        ModelConfig(n_inputs=10, classes=tuple(range(10)), n_nodes=24, n_layers=3, warmup_rows=64, seed=3)
    )
    return _drive(processor(model, CFG), _labels_late(feats, labs))


def _event(i: int, rng) -> dict:
    e = {
        "order_id": f"o-{i}",
        "amount": None if i % 7 == 0 else round(float(rng.normal(50, 20)), 3),
        "score": float(rng.uniform()),
        "country": ["FR", "DE", "US", None][i % 4],
        "device": {"os": ["ios", "android", "web"][i % 3]},
        "vip": [True, False, None][i % 3],
        "ts": 5000 + i,
        "shop": {"name": f"s{i % 2}"},
    }
    if i % 11 == 0:
        del e["vip"]
    return e


def events_stream() -> dict:
    """300 named-field events with gaps, an undeclared category, nested and passthrough fields, refusals."""
    rng = np.random.default_rng(35)
    events = [_event(i, rng) for i in range(300)]
    labels = [
        {"order_id": e["order_id"], "is_fraud": bool(e["score"] > 0.6 or e["country"] == "US")}
        for e in events
    ]
    events[40]["score"] = "high"  # a wrong type
    del events[41]["score"]  # a required field missing
    events[77]["order_id"] = None  # no id
    feats, labs = [], []
    for start in range(0, 300, 20):
        if start % 100 == 60:  # one event per message for a while
            for i in range(start, start + 20):
                feats.append(orjson.dumps(events[i]))
                labs.append(orjson.dumps(labels[i]))
            continue
        feats.append(orjson.dumps(events[start : start + 20]))
        labs.append(orjson.dumps(labels[start : start + 20]))
    feats.insert(12, orjson.dumps(events[3]))  # a duplicate id
    labs.insert(12, orjson.dumps({"order_id": "o-5", "is_fraud": "maybe"}))
    model = EdRVFL(
        ModelConfig(classes=(False, True), features=FIELDS, n_nodes=16, n_layers=2, warmup_rows=64, seed=5)
    )
    return _drive(StreamProcessor(model, CFG, events=SHAPE), _labels_late(feats, labs))


def regression_stream() -> dict:
    """150 rows of a two-output regression with its intervals."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(150, 6))
    Y = np.stack([X[:, 0] * 2 + np.sin(X[:, 1]), X[:, 2] - X[:, 3] ** 2], axis=1)
    feats, labs = [], []
    for start in range(0, 150, 30):
        ids = [f"q{i}" for i in range(start, start + 30)]
        feats.append(orjson.dumps({"ids": ids, "x": X[start : start + 30].tolist()}))
        labs.append(orjson.dumps({"ids": ids, "y": Y[start : start + 30].tolist()}))
    model = EdRVFL(
        ModelConfig(
            n_inputs=6,
            classes=None,
            n_outputs=2,
            n_nodes=16,
            n_layers=2,
            warmup_rows=60,
            seed=7,
            interval=0.9,
        )
    )
    return _drive(StreamProcessor(model, CFG), _labels_late(feats, labs))


def outputs() -> dict:
    return {"arrays": arrays_stream(), "events": events_stream(), "regression": regression_stream()}


def _same(got, want, where: str) -> None:
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(want, (int, float)), (
            f"{where}: {got!r} != {want!r}"
        )
        if math.isnan(want):
            assert math.isnan(got), f"{where}: {got!r} != nan"
        else:
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, str) and want.startswith("{") and isinstance(got, str) and _json(want) is not None:
        _same(_json(got), _json(want), f"{where}(json)")  # a prediction or an event
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _json(text: str):
    """``text`` parsed as JSON, None if it is not (a malformed message's dead letter)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _plain(obj):
    """JSON's view of ``obj`` (tuples as lists, numpy scalars as numbers)."""
    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))


def test_the_output_of_a_fixed_stream_is_what_was_pinned():
    want = orjson.loads(PINNED.read_bytes())
    got = _plain(outputs())
    assert len(got["arrays"]["predictions"]) == 299 and len(got["events"]["predictions"]) == 297
    _same(got, want, "output")


class DecidingAgain(StreamProcessor):
    """A processor whose label batches never take the classes emitted from the feature cache: they are decided
    again from the rows' stored outputs (``model.decide``), as for rows that are not one whole cached batch."""

    def _features_for(self, x, seqs, positions):
        features_t, _ = super()._features_for(x, seqs, positions)
        return features_t, None


def test_the_classes_scored_from_the_feature_cache_are_the_ones_decided_again():
    """A label batch that is one whole cached batch scores the classes cached when it was predicted (no second
    ``decide``): every prediction, dead letter, metric and array is the same, to the bit, as when they are decided
    again."""
    cached, again = arrays_stream(), arrays_stream(DecidingAgain)
    assert cached["status"]["metrics"] == again["status"]["metrics"]
    assert orjson.dumps(_plain(cached)) == orjson.dumps(_plain(again))


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    PINNED.write_bytes(orjson.dumps(_plain(outputs()), option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote {PINNED}")
