"""The worker on a real broker says once, as its warm-up scaler freezes, that sigmoid with Xavier weights
leaves its hidden units linear; at init auto it says nothing. The kernel preload's tiny models (their own
warm-ups on random rows) say nothing either."""

from __future__ import annotations

import logging

import pytest
from test_worker_kafka import segment, send, worker_raw
from worker_thread import WorkerThread

from iolstream.kafka.config import config_from_dict
from iolstream.tools import produce

pytestmark = pytest.mark.kafka
ROWS = 400


def run_worker(bootstrap, topics, tmp_path, caplog, **model) -> list[logging.LogRecord]:
    raw = worker_raw(bootstrap, topics, tmp_path, model=model)  # N = 512: Xavier's narrowest
    cfg = config_from_dict(raw, environ={})
    X, y = segment(ROWS)
    send(bootstrap, cfg, X, y, produce.PlanOptions(batch_rows=20, label_delay_rows=20))
    logger = logging.getLogger("iolstream.processor")  # the worker's log set-up may stop propagation
    logger.addHandler(caplog.handler)
    try:
        with WorkerThread(cfg) as w:
            w.wait(lambda s: s["predictions_out"] == ROWS, 60, "every prediction")
            assert w.stop() == 0
    finally:
        logger.removeHandler(caplog.handler)
    said = {id(r): r for r in caplog.records if getattr(r, "event", None) == "linear_units"}
    return list(said.values())  # a record reaches caplog's handler twice while propagation is on


def test_sigmoid_with_xavier_is_said_once(kafka_bootstrap, kafka_topics, tmp_path, caplog):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    (record,) = run_worker(kafka_bootstrap, topics, tmp_path, caplog, activation="sigmoid", init="xavier")
    assert record.levelno == logging.WARNING and record.share >= 0.9
    message = record.getMessage()
    assert "activation sigmoid with init xavier" in message and message.endswith("set model.init: auto")


def test_nothing_is_said_at_init_auto(kafka_bootstrap, kafka_topics, tmp_path, caplog):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    assert run_worker(kafka_bootstrap, topics, tmp_path, caplog, activation="sigmoid") == []
