"""Resilience on the real broker: stuck client calls, a crash loop, a finite input that ends by itself.

A client call that never returns (librdkafka issues #5456, #5511), reproduced deterministically on
the real broker with the test-only fault ``IOLSTREAM_CRASH_AT=hang_<call>:<hit>`` (``calls.hang_in_c``:
a pthread_cond_wait with no deadline, as the real one).

- on the helper thread (a transactional call): the worker gives the producer up, starts a fresh one
  and rolls back: no exit, every row predicted exactly once, the model exact;
- on the main thread (a consumer call inside a rebalance callback): the loop watchdog ends the process
  with EXIT_STUCK naming the call; SIGTERM meanwhile ends it within the grace period with
  EXIT_SHUTDOWN_OVERRUN.
"""

from __future__ import annotations

import signal
import threading
import time

import orjson
import pytest
from kafka_util import assert_one_prediction_per_row, consume_all
from test_durability_kafka import (  # noqa: F401  (fixtures)
    WorkerRig,
    assert_same_model,
    backlog,
    outputs,
    reference,
    send_stream,
    stream,
    wait_for,
)

from iolstream.ops.lifecycle import EXIT_OK, EXIT_SHUTDOWN_OVERRUN, EXIT_STUCK

pytestmark = pytest.mark.kafka


def test_exactly_once_stuck_transactional_call_is_recovered_in_process(
    tmp_path,
    kafka_bootstrap,
    backlog,
    outputs,
    stream,
    reference,  # noqa: F811
):
    messages, ids = stream
    rig = WorkerRig(tmp_path, kafka_bootstrap, {**backlog, **outputs}, exactly_once=True)
    rig.raw["kafka"]["call_timeout_seconds"] = 1.0  # abandoned after 1 + 5 s
    rig.write_config()
    proc, log_path = rig.start(
        "hang_producer.send_offsets_to_transaction:3", idle=600, extra_args=["--stop-at-end"]
    )
    rc = proc.wait(120)
    log = log_path.read_text()
    assert rc == EXIT_OK, log[-3000:]
    assert "producer.send_offsets_to_transaction did not return within 6.0 s" in log
    assert "transactional producer replaced (1 so far)" in log and "rolled back to offsets" in log
    assert_one_prediction_per_row(
        kafka_bootstrap, outputs["predictions"], ids, "a stuck send_offsets_to_transaction", nothing_else=True
    )
    assert_same_model(rig.newest(), reference, "after a stuck send_offsets_to_transaction")


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_main_thread_stuck_in_a_client_call_ends_by_watchdog_or_sigterm(
    tmp_path,
    kafka_bootstrap,
    backlog,
    outputs,
    exactly_once,  # noqa: F811
):
    rig = WorkerRig(tmp_path, kafka_bootstrap, {**backlog, **outputs}, exactly_once=exactly_once)
    rig.raw["durability"].update(watchdog_seconds=3.0, shutdown_grace_seconds=2.0)
    rig.write_config()

    # 1. nobody intervenes: the watchdog ends it, naming the call
    proc, log_path = rig.start("hang_consumer.committed:1", idle=600)
    rc = proc.wait(60)
    log = log_path.read_text()
    assert rc == EXIT_STUCK, log[-3000:]
    assert "stuck in consumer.committed (called" in log

    # 2. SIGTERM while stuck: the signal is handled on its own thread, the stop cannot finish, exit 4
    rig.raw["durability"]["watchdog_seconds"] = 600.0
    rig.write_config()
    proc, log_path = rig.start("hang_consumer.committed:1", idle=600)
    wait_for(
        log_path, r"test fault point 'hang_consumer.committed' reached"
    )  # stuck in the rebalance callback
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(30)
    log = log_path.read_text()
    assert rc == EXIT_SHUTDOWN_OVERRUN, log[-3000:]
    # the grace period ends it (exit 4, above), not the 600 s watchdog: a bound with room for a busy machine's exit
    assert time.monotonic() - signalled < 2.0 + 20.0
    assert "SIGTERM: stopping within 2 s" in log and "shutdown took longer than" in log

    # 3. and the next start, not stuck, finishes the work cleanly
    proc, log_path = rig.start(idle=600, extra_args=["--stop-at-end"])
    assert proc.wait(120) == EXIT_OK, log_path.read_text()[-3000:]


def test_a_crash_loop_makes_progress_and_loses_nothing(
    tmp_path,
    kafka_bootstrap,
    kafka_topics,
    outputs,
    stream,
    reference,  # noqa: F811
):
    """At-least-once, the stream produced live (3,000 rows/s), the worker killed (SIGKILL) in each incarnation
    once it has written the snapshot it writes soon after it starts processing (snapshot.first_after_seconds),
    so each resumes further on; the last one, left to finish (--stop-at-end), ends with the model of an
    uninterrupted run and every row predicted."""
    messages, ids = stream
    features, labels = kafka_topics("features", "labels")
    inputs = {"features": features, "labels": labels}
    rig = WorkerRig(tmp_path, kafka_bootstrap, {**inputs, **outputs}, exactly_once=False)
    rig.raw["snapshot"].update(
        every_batches=10**6, every_seconds=3600.0
    )  # only the early snapshot after a start
    rig.write_config()
    reached = []
    sender = threading.Thread(target=send_stream, args=(kafka_bootstrap, inputs, messages, 3_000))
    sender.start()
    for _ in range(4):
        proc, log_path = rig.start(idle=600)
        wait_for(log_path, r"assigned ")
        wait_for(
            log_path, r"snapshot snap-\d+\.iolsnap: "
        )  # its early snapshot written (not the one it loaded)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        snap = rig.store().load_latest()
        assert snap is not None, log_path.read_text()[-3000:]
        reached.append(sum(o for _, _, o in snap.manifest["offsets"]))
    assert all(b > a for a, b in zip(reached, reached[1:])), f"no progress between incarnations: {reached}"
    sender.join()
    proc, log_path = rig.start(idle=600, extra_args=["--stop-at-end"])
    assert proc.wait(120) == EXIT_OK, log_path.read_text()[-3000:]
    assert_same_model(rig.newest(), reference, "after a crash loop")
    got = consume_all(kafka_bootstrap, outputs["predictions"], timeout=2)
    assert {orjson.loads(v)["id"] for _, v, _, _, _ in got} == set(ids)
