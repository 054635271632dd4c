"""Logging (iolstream.ops.logs): JSON lines for machines, readable lines for terminals, the level
from the config, and the worker's structured events (status counters, batch ids)."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import types

import numpy as np
import orjson
import pytest

from iolstream.kafka.config import config_from_dict
from iolstream.kafka.worker import Worker
from iolstream.ops import logs

MODEL = {"n_inputs": 4, "classes": [0, 1, 2], "n_nodes": 16, "n_layers": 2, "scaler": "none", "seed": 1}


@pytest.fixture
def capture():
    """setup(level, fmt) into a buffer; returns a function giving the lines written so far."""
    buf = io.StringIO()

    def start(level="INFO", fmt="json"):
        logs.setup(level, fmt, stream=buf)
        return lambda: buf.getvalue().splitlines()

    yield start
    logs.reset()


def test_json_lines_carry_event_fields_and_level(capture):
    lines = capture("INFO", "json")
    log = logging.getLogger("iolstream.worker")
    log.debug("not shown at INFO")
    log.info(
        "snapshot %s written",
        "s1",
        extra={
            "event": "snapshot",
            "bytes": 1234,
            "offsets": {("t", 0): 5},
            "arr": np.arange(3),
            "nan": float("nan"),
            "np_int": np.int64(7),
        },
    )
    logging.getLogger("iolstream.kafka").warning("FAIL: broker down")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"event": "fatal"})
    out = [orjson.loads(line) for line in lines()]
    assert len(out) == 3
    first = out[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert (first["level"], first["logger"], first["event"]) == ("info", "iolstream.worker", "snapshot")
    assert first["message"] == "snapshot s1 written"
    assert (
        first["bytes"] == 1234 and first["arr"] == [0, 1, 2] and first["nan"] is None and first["np_int"] == 7
    )
    assert first["offsets"] == {"('t', 0)": 5}  # keys JSON cannot hold become strings
    assert (out[1]["event"], out[1]["level"]) == ("kafka", "warning")  # default event: the logger's last part
    assert out[2]["event"] == "fatal" and "ValueError: boom" in out[2]["exception"]


def test_level_comes_from_the_config(capture):
    lines = capture("DEBUG", "json")
    logging.getLogger("iolstream.worker").debug("shown", extra={"event": "batch"})
    assert [orjson.loads(line)["event"] for line in lines()] == ["batch"]
    lines = capture("ERROR", "json")  # a second setup replaces the first handler (same buffer here)
    logging.getLogger("iolstream.worker").warning("hidden")
    assert [orjson.loads(line)["event"] for line in lines()] == ["batch"]
    assert len(logging.getLogger("iolstream").handlers) == 1


def test_text_format_is_one_readable_line(capture):
    lines = capture("INFO", "text")
    logging.getLogger("iolstream.worker").info("rows_in=%d", 5, extra={"event": "status"})
    (line,) = lines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} INFO    iolstream\.worker: rows_in=5", line), line


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="logging.format"):
        logs.setup("INFO", "xml")


def test_uncaught_exception_is_one_json_line():
    code = "from iolstream.ops import logs; logs.setup('INFO', 'json'); raise RuntimeError('boom')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    rec = orjson.loads(line)
    assert rec["event"] == "crash" and rec["level"] == "critical" and "RuntimeError: boom" in rec["exception"]


def test_worker_status_and_batch_events(capture, tmp_path):
    """The worker's status line carries its counters, and (at DEBUG) each batch its ids."""
    cfg = config_from_dict(
        {"model": MODEL, "snapshot": {"dir": str(tmp_path)}, "metrics": {"port": 0}}, environ={}
    )
    worker = Worker(cfg)  # no Kafka until run()
    sent = []
    worker.output.producer = types.SimpleNamespace(
        produce=lambda topic, value, key=None, **kw: sent.append(topic), poll=lambda t: 0
    )
    proc = worker.processor
    X = np.random.default_rng(0).normal(size=(3, 4))
    proc.on_features(orjson.dumps({"ids": ["a", "b", "c"], "x": X.tolist()}), ("f", 0, 0), now_ms=0)
    lines = capture("DEBUG", "json")
    worker.session.step(0, force=True)  # produces through the stand-in producer above
    worker.log_status()
    events = {rec["event"]: rec for rec in map(orjson.loads, lines())}
    batch = events["batch"]
    assert (batch["first_id"], batch["last_id"], batch["rows"], batch["batch_seq"]) == ("a", "c", 3, 1)
    status = events["status"]["status"]
    assert status["rows_in"] == 3 and status["predictions_out"] == 3 and status["pending"] == 3
    assert sent == [cfg.topics.predictions] * 3
