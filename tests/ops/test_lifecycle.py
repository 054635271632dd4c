"""The process's life without a broker: client calls with deadlines, signals on their own thread,
the loop watchdog, repeated log lines (iolstream.kafka.calls, iolstream.ops.lifecycle, iolstream.ops.logs)."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.ops.lifecycle import EXIT_STUCK
from iolstream.ops.logs import RepeatFilter


def test_a_call_returns_its_result_or_raises_its_error():
    calls = ClientCalls()
    assert calls.call("add", lambda: 40 + 2, timeout=1.0) == 42
    with pytest.raises(ZeroDivisionError):
        calls.call("divide", lambda: 1 / 0, timeout=1.0)
    assert calls.current is None and calls.abandoned == 0


def test_a_call_past_its_deadline_is_abandoned_and_the_caller_ticks_meanwhile():
    waits = []
    calls = ClientCalls(on_wait=lambda name, seconds: waits.append((name, seconds)))
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(CallTimedOut, match="producer.flush did not return within 0.8 s"):
        calls.call("producer.flush", release.wait, timeout=0.5, grace=0.3)
    assert (
        0.75 <= time.monotonic() - started < 10.0
    )  # after the deadline, not for ever (a busy machine is late)
    assert waits and all(name == "producer.flush" for name, _ in waits)  # the loop ticked while it waited
    assert calls.abandoned == 1
    assert (
        calls.call("next", threading.get_ident, timeout=1.0) != threading.get_ident()
    )  # a fresh helper thread
    release.set()


def test_a_direct_call_is_named_while_it_runs():
    calls = ClientCalls()
    seen = calls.direct("consumer.committed", lambda: calls.current[0])
    assert seen == "consumer.committed" and calls.current is None


def run_python(code: str, timeout: float = 30.0, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def test_sigterm_reaches_its_thread_while_the_main_thread_is_stuck_in_c():
    """The main thread blocks in pthread_cond_wait (as librdkafka's send_offsets_to_transaction did after
    an outage): a Python-level handler would never run; the signal thread does, with NumPy's native
    BLAS threads already started."""
    proc = run_python("""
        import os, sys, numpy
        from iolstream.kafka.calls import hang_in_c
        from iolstream.ops.lifecycle import SignalThread
        def on_signal(signum):
            print("signal", signum, flush=True)
            os._exit(0)
        SignalThread(on_signal).start()
        print("stuck", flush=True)
        hang_in_c()
    """)
    assert proc.stdout.readline().strip() == "stuck"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert proc.stdout.read().strip() == f"signal {int(signal.SIGTERM)}"


def test_watchdog_ends_a_stuck_loop_naming_the_call():
    proc = run_python("""
        import time
        from iolstream.ops import logs
        from iolstream.kafka.calls import ClientCalls, hang_in_c
        from iolstream.ops.lifecycle import LoopWatchdog
        logs.setup("INFO", "text")
        calls = ClientCalls()
        ticked = time.monotonic()
        LoopWatchdog(0.5, lambda: ticked, lambda: calls.current and calls.current[0]).start()
        calls.direct("consumer.committed", hang_in_c)
    """)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == EXIT_STUCK, out
    assert "stuck in consumer.committed" in out


def test_watchdog_names_the_main_threads_frame_when_no_call_is_in_flight():
    proc = run_python("""
        import time
        from iolstream.ops import logs
        from iolstream.kafka.calls import hang_in_c
        from iolstream.ops.lifecycle import LoopWatchdog
        logs.setup("INFO", "text")
        ticked = time.monotonic()
        LoopWatchdog(0.5, lambda: ticked, lambda: None).start()
        def busy_step():
            while True:
                time.sleep(0.01)
        busy_step()
    """)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == EXIT_STUCK, out
    assert "stuck in busy_step (<string>:" in out


def test_watchdog_of_a_loop_on_another_thread_names_its_frame_logs_its_stack_and_calls_on_stuck(caplog):
    """A worker run in a thread of another program (a test): the frame named is the loop thread's, not the
    main thread's, its stack is logged, and ``on_stuck`` is called once instead of ending the process."""
    from iolstream.ops.lifecycle import LoopWatchdog

    stuck, release = [], threading.Event()

    def loop_step():
        LoopWatchdog(0.3, lambda: ticked, lambda: None, on_stuck=stuck.append).start()
        while not release.is_set():
            time.sleep(0.01)

    def outer_loop():
        loop_step()

    caplog.set_level(logging.CRITICAL, logger="iolstream.worker")
    ticked = time.monotonic()
    loop = threading.Thread(target=outer_loop, daemon=True)
    loop.start()
    deadline = time.monotonic() + 20
    while not stuck and time.monotonic() < deadline:
        time.sleep(0.02)
    release.set()
    loop.join(20)
    assert len(stuck) == 1 and stuck[0].startswith("loop_step (test_lifecycle.py:"), stuck
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "stuck"]
    message = record.getMessage()
    assert "giving up on it" in message and "exiting" not in message
    assert "in outer_loop" in message and "in loop_step" in message  # the loop thread's whole stack


def test_repeated_warnings_are_logged_once_per_interval_with_a_count():
    f = RepeatFilter(interval=0.2)

    def record(msg, level=logging.WARNING, name="iolstream.kafka"):
        return logging.makeLogRecord({"name": name, "levelno": level, "levelname": "WARNING", "msg": msg})

    assert f.filter(record("FAIL|rdkafka#producer-1| 127.0.0.1:19092/1: Connect failed (after 0ms)"))
    assert not any(
        f.filter(record(f"FAIL|rdkafka#producer-1| 127.0.0.1:19092/1: Connect failed (after {i}ms)"))
        for i in range(50)
    )
    assert f.filter(record("another kind of trouble"))
    assert f.filter(record("rows=1", level=logging.INFO)) and f.filter(record("rows=1", level=logging.INFO))
    time.sleep(0.25)
    again = record("FAIL|rdkafka#producer-1| 127.0.0.1:19092/1: Connect failed (after 7ms)")
    assert f.filter(again)
    # the seconds since the first of the kind: 0 unless the machine was too busy to wake the sleep on time
    assert re.search(r"\(50 more like it in the last \d+ s\)$", again.getMessage()) and again.repeated == 50
