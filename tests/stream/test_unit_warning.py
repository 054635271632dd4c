"""The processor says once, when the warm-up scaler freezes, that the hidden units stay linear: sigmoid
with Xavier weights over 19 inputs is a linear model; the same sigmoid at init auto is not.

Seeds are fixed and printed in the assertion messages.
"""

from __future__ import annotations

import logging

import numpy as np
import orjson

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor

K, WARMUP, SEED = 19, 64, 3
NEVER = 10**12


def run(caplog, **model_kw) -> list[logging.LogRecord]:
    cfg = ModelConfig(
        n_inputs=K, classes=(0, 1), n_nodes=256, n_layers=2, warmup_rows=WARMUP, seed=SEED, **model_kw
    )
    proc = StreamProcessor(
        EdRVFL(cfg),
        StreamConfig(
            batch_rows=16,
            max_batch_latency_ms=NEVER,
            label_batch_rows=16,
            max_label_latency_ms=NEVER,
            row_ttl_ms=None,
        ),
    )
    x = np.random.default_rng(SEED).standard_normal((160, K)) * 4.0 + 1.0  # the scaler standardises them
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="iolstream.processor"):
        for start in range(0, len(x), 16):
            ids = [f"r{i}" for i in range(start, start + 16)]
            proc.on_features(
                orjson.dumps({"ids": ids, "x": x[start : start + 16].tolist()}), "features/0", start
            )
            proc.step(start)
            if start + 16 < WARMUP:
                assert not proc.model.ready and not caplog.records, (
                    f"warned before the warm-up ended, seed={SEED}"
                )
    assert proc.model.ready and proc.counters["batches"] == 10  # the held batches were predicted after it
    return [r for r in caplog.records if r.name == "iolstream.processor"]


def test_sigmoid_with_xavier_is_said_once_with_its_share_and_the_setting(caplog):
    (record,) = run(caplog, activation="sigmoid", init="xavier")
    assert record.levelno == logging.WARNING and record.event == "linear_units"
    message = record.getMessage()
    assert "activation sigmoid with init xavier" in message and "warm-up rows" in message, message
    assert f"on the {WARMUP} warm-up rows" in message and "set model.init: auto" in message, message
    assert record.share > 0.9 and len(record.linear) == 2, f"seed={SEED}: {record.share}"
    assert f"{record.share:.0%} of the hidden units" in message


def test_nothing_is_said_at_init_auto(caplog):
    for activation in ("sigmoid", "tanh", "relu"):
        assert run(caplog, activation=activation) == [], f"{activation} seed={SEED}"


def test_overlapping_kernel_warmups_leave_the_processor_log_on(caplog):
    """Two threads preloading kernels at once (two workers in one process) while the main thread's processor
    logs: each warm-up quiets only its own thread, and the log is on again once both end. (Toggling the
    logger's ``disabled`` left it off for good when the two overlapped: enter A, enter B, leave A, leave B.)"""
    import threading

    from iolstream.stream import kernel_warmup

    log = logging.getLogger("iolstream.processor")
    entered, leave_a, a_left = threading.Event(), threading.Event(), threading.Event()

    def a():
        with kernel_warmup._processor_quiet():
            entered.set()
            leave_a.wait(10)
        a_left.set()

    def b():
        entered.wait(10)
        with kernel_warmup._processor_quiet():
            leave_a.set()
            a_left.wait(10)
            log.warning("from a warm-up")  # quiet: this thread is warming up

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    with caplog.at_level(logging.WARNING, logger="iolstream.processor"):
        for t in threads:
            t.start()
        entered.wait(10)
        log.warning("the stream's own, during a warm-up")
        for t in threads:
            t.join(10)
        log.warning("the stream's own, after")
    said = [r.getMessage() for r in caplog.records if r.name == "iolstream.processor"]
    assert said == ["the stream's own, during a warm-up", "the stream's own, after"], said
