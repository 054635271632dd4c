"""The arrival screen (``stream.screen``): each row of a features message is refused by the first place that
knows its id — the join buffer (pending, or remembered done), then the batcher (waiting to be predicted), then
the retention store (learned, past the id memory) — the refusals in that order, each a one-row message; the
rows it passed are not looked up again, except those another member handed over while they waited."""

from __future__ import annotations

import numpy as np
from test_stream import data, features, labels, model_config, stream_config

from iolstream.core.model import EdRVFL
from iolstream.stream.encoding import feature_message
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.retention import RetentionStore, record_shape


def _processor(tmp_path) -> StreamProcessor:
    """Rows r0..r15 predicted; labels of r0..r7 folded in, of which the id memory (4 ids) keeps r4..r7 and the
    retention store all; r8..r15 waiting for their labels; r16, r17 in the batcher."""
    X, y = data(64)
    cfg = model_config(warmup_rows=8, mode="forward")
    store = RetentionStore(tmp_path / "retention", **record_shape(cfg), rows=10_000, segment_rows=64)
    proc = StreamProcessor(EdRVFL(cfg), stream_config(remember_done=4), retention=store)
    proc.erasure.load_state(None)
    proc.feed(features(range(0, 8), X), "f", 0)
    proc.feed(features(range(8, 16), X), "f", 1)
    proc.feed(labels(range(0, 8), y), "l", 2, labels=True)
    proc.step(3, force=True)
    proc.feed(features([16, 17], X), "f", 4)
    assert proc.pending_rows == 8 and proc.queued_rows == 2 and proc.counters["rows_learned"] == 8
    return proc


def test_each_row_is_refused_by_the_first_that_knows_its_id_in_that_order(tmp_path):
    proc = _processor(tmp_path)
    X, _ = data(64)
    order = [1, 16, 9, 40, 6, 41]  # retention only, queued, pending, new, labelled (remembered), new
    before = dict(proc.join.counters)
    out = proc.feed(features(order, X), "src", 5)
    got = [(d.bad.reason, d.bad.detail, d.value, d.source) for d in out.dead_letters]
    assert got == [
        ("duplicate_id", "id 'r9' is already pending", feature_message("r9", X[9]), "src"),
        ("duplicate_id", "id 'r6' was already labelled", feature_message("r6", X[6]), "src"),
        ("duplicate_id", "id 'r16' is already waiting to be predicted", feature_message("r16", X[16]), "src"),
        (
            "duplicate_id",
            "id 'r1' was already learned (the retention store holds it)",
            feature_message("r1", X[1]),
            "src",
        ),
    ]
    assert proc.join.counters["rows_duplicate"] == before["rows_duplicate"] + 4
    assert proc.queued_rows == 4 and proc.counters["rows_in"] == 18 + 2  # r40, r41 joined the batch
    assert proc.dead_letters["duplicate_id"] == 4


def test_a_one_row_message_refused_is_its_own_bytes(tmp_path):
    proc = _processor(tmp_path)
    raw = b'{"id": "r2", "x": [1, 2, 3, 4, 5]}'
    (letter,) = proc.feed(raw, "src", 5).dead_letters
    assert (letter.bad.reason, letter.value) == ("duplicate_id", raw)


def test_a_row_handed_over_while_its_id_waits_here_is_looked_up_again_when_its_batch_is_stepped(tmp_path):
    """Group learning: another member's waiting row is adopted while a row of the same id waits in the batcher
    (screened before the adopted one was pending): when that batch enters the join buffer its ids are looked up
    again, and the second is refused as before (``duplicate_id``), not taken in over the first."""
    proc = _processor(tmp_path)
    X, _ = data(64)
    payload = np.zeros((1, proc.layout.width))
    payload[0, : X.shape[1]] = X[16]
    assert proc.adopt_rows(["r16"], payload, now_ms=5) == 1 and proc.pending_rows == 9
    out = proc.feed(features(range(18, 24), X), "f", 6)  # fills the batch: r16, r17, r18..r23
    assert [(d.bad.reason, d.bad.detail) for d in out.dead_letters] == [
        ("duplicate_id", "id 'r16' is already pending")
    ]
    assert proc.pending_rows == 9 + 7 and proc.join.counters["rows_added"] == 8 + 8 + 1 + 7
