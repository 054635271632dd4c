"""/metrics counts forget requests (docs/design.md §13): ids forgotten, ids refused, rows whose terms left the
model, receipts out — from the processor's counters, like every stream counter."""

from __future__ import annotations

import numpy as np
import orjson

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.ops.collector import counter_families
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor


def test_the_forget_counters_are_metric_families():
    model = EdRVFL(
        ModelConfig(n_inputs=2, classes=(0, 1), n_nodes=8, n_layers=1, scaler="none", mode="forward")
    )
    proc = StreamProcessor(model, StreamConfig(batch_rows=4, max_batch_latency_ms=10**9))
    x = np.arange(8.0).reshape(4, 2)
    proc.on_features(orjson.dumps({"ids": ["a", "b", "c", "d"], "x": x.tolist()}), "f", 0)
    proc.step(0)
    dead = proc.on_forget(orjson.dumps({"ids": ["a", "b", "zz"]}), "x", 1)
    assert [d.bad.reason for d in dead] == ["forget_unknown_id"]
    status = proc.status()
    assert (status["ids_forgotten"], status["ids_refused"], status["rows_erased"]) == (2, 1, 2)
    families = {f.name: f.samples[0].value for f in counter_families(status) if len(f.samples) == 1}
    assert families["iolstream_forgotten_ids"] == 2
    assert families["iolstream_forget_refused_ids"] == 1
    assert families["iolstream_forgotten_rows_erased"] == 2
    assert families["iolstream_forget_receipts"] == 0
