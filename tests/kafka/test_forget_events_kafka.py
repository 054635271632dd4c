"""Forget requests for named-field events on a real broker (docs/design.md §11, §13): the request names its
row where the features do, by the configured id field (``events.id_field``) or by the message key
(``events.id_from_key``). The rows leave the model, exactly: it ends as a model fed the events without them,
and each forgotten id has one receipt."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from kafka_util import consume_all, produce_json
from test_events_kafka import order, raw_config
from worker_thread import WorkerThread

from iolstream.core.model import EdRVFL
from iolstream.kafka.config import config_from_dict
from iolstream.kafka.worker import EXIT_OK
from iolstream.stream.processor import StreamProcessor

pytestmark = pytest.mark.kafka

N = 160
GONE = [f"o-{i}" for i in range(40, N, 7)]  # after the warm-up's 32 rows: the scaler is the reference's


def _reference(cfg, events, labels, keys):
    """One processor fed the events and labels without the forgotten rows (no Kafka); ``keys``: the messages'
    keys (None: unkeyed)."""
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, events=cfg.events)
    for i, e in enumerate(events):
        proc.on_features(orjson.dumps(e), ("f", 0, i), 0, key=keys and keys[i].encode())
        proc.step(0)
    for i, label in enumerate(labels):
        proc.on_labels(orjson.dumps(label), ("l", 0, i), 0, key=keys and keys[i].encode())
        proc.step(0)
    proc.step(0, force=True)
    return proc.model


@pytest.mark.parametrize("by_key", [False, True], ids=["id-field", "message-key"])
def test_rows_of_named_field_events_are_forgotten_by_their_id_field_or_key(
    kafka_bootstrap, kafka_topics, tmp_path, by_key
):
    names = kafka_topics("features", "labels", "predictions", "dead", "forget", "receipts")
    raw = raw_config(kafka_bootstrap, names, tmp_path / "snap")
    raw["topics"].update(forget=names[4], forget_receipts=names[5])
    raw["snapshot"]["every_seconds"] = 1
    if by_key:  # the id is the message key only: the events carry none
        raw["events"] = {"id_from_key": True, "label_field": "is_fraud", "time_field": "ts"}
    cfg = config_from_dict(raw, environ={})
    rng = np.random.default_rng(11)
    events = [order(i, rng) for i in range(N)]
    labels = [{"order_id": e["order_id"], "is_fraud": e["age"] > 50} for e in events]

    def strip(obj: dict) -> dict:  # with the key as the id, the value need not name it
        return {k: v for k, v in obj.items() if k != "order_id"} if by_key else obj

    keys = [e["order_id"] for e in events] if by_key else None
    with WorkerThread(cfg) as w:
        w.wait_assigned(3)
        produce_json(kafka_bootstrap, names[0], [strip(e) for e in events], key=keys)
        produce_json(kafka_bootstrap, names[1], [strip(y) for y in labels], key=keys)
        w.wait(lambda s: s["rows_learned"] == N, 120, "every row learned")
        if by_key:  # the request: its key; its value is not read (here an empty object)
            produce_json(kafka_bootstrap, names[4], [{} for _ in GONE], key=GONE)
        else:
            requests = [{"order_id": i} for i in GONE[:-3]] + [{"ids": GONE[-3:]}]
            produce_json(kafka_bootstrap, names[4], requests)
        w.wait(lambda s: s["receipts_out"] == len(GONE), 120, "a receipt for every forgotten row")
        assert w.stop() == EXIT_OK
    model = w.worker.processor.model

    receipts = [orjson.loads(v) for _, v, _, _, _ in consume_all(kafka_bootstrap, names[5], timeout=2)]
    assert sorted(r["id"] for r in receipts) == sorted(GONE)
    assert {r["stage"] for r in receipts} == {"labelled"}
    dead = consume_all(kafka_bootstrap, names[3], timeout=1)
    assert not dead, [dict(h)["iolstream.reason"] for _, _, h, _, _ in dead]

    gone = set(GONE)
    kept = [i for i, e in enumerate(events) if e["order_id"] not in gone]
    reference = _reference(
        cfg,
        [strip(events[i]) for i in kept],
        [strip(labels[i]) for i in kept],
        [keys[i] for i in kept] if by_key else None,
    )
    assert model.learner.state.rows_labelled == reference.learner.state.rows_labelled == N - len(GONE)
    for ours, theirs in zip(model.learner.state.layers, reference.learner.state.layers):
        a, ref = np.tril(ours.gram), np.tril(theirs.gram)  # (the lower triangle holds A)
        np.testing.assert_allclose(a, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
        np.testing.assert_allclose(ours.beta, theirs.beta, rtol=1e-7, atol=1e-9)
