"""iolstream.emitter: order, back-pressure, drain, and errors handed back to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from iolstream.emitter import Emitter, EmitterError


def test_items_are_emitted_in_order_on_another_thread():
    seen, threads = [], set()

    def emit(item):
        seen.append(item)
        threads.add(threading.current_thread().name)

    e = Emitter(emit, depth=3)
    for i in range(100):
        e.submit(i)
    e.drain()
    assert seen == list(range(100)) and threads == {"iolstream-emit"}
    e.close()


def test_depth_bounds_what_waits():
    release = threading.Event()
    e = Emitter(lambda item: release.wait(), depth=2)
    e.submit(0)  # taken by the thread, blocked in emit
    time.sleep(0.05)
    e.submit(1)
    e.submit(2)  # queue full now
    blocked = threading.Thread(target=e.submit, args=(3,))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a fourth item must wait for room"
    release.set()
    blocked.join(5)
    e.drain()
    assert e.idle
    e.close()


def test_drain_waits_for_the_item_being_emitted():
    seen = []

    def slow(item):
        time.sleep(0.1)
        seen.append(item)

    e = Emitter(slow)
    e.submit("a")
    e.drain()
    assert seen == ["a"]
    e.close()


def test_an_error_is_raised_by_drain_and_later_items_are_dropped():
    seen = []

    def emit(item):
        if item == 2:
            raise BufferError("queue full for good")
        seen.append(item)

    e = Emitter(emit, depth=10)
    for i in range(5):
        e.submit(i)
    with pytest.raises(EmitterError, match="queue full for good") as info:
        e.drain()
    assert isinstance(info.value.__cause__, BufferError)
    assert seen == [0, 1]  # nothing after the failure is emitted
    with pytest.raises(EmitterError):
        e.submit(9)
    e.close()


def test_close_emits_what_is_queued_then_refuses():
    seen = []
    e = Emitter(seen.append)
    e.submit(1)
    e.close()
    assert seen == [1]
    with pytest.raises(EmitterError, match="closed"):
        e.submit(2)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Emitter(print, depth=0)


def test_close_can_discard_and_does_not_wait_forever():
    seen, entered, release = [], threading.Event(), threading.Event()

    def emit(item):
        entered.set()
        release.wait()
        seen.append(item)

    e = Emitter(emit, depth=4)
    for i in range(3):
        e.submit(i)
    assert entered.wait(5)
    t0 = time.monotonic()
    e.close(discard=True, timeout=0.2)  # item 0 is stuck in emit: close gives up waiting
    assert time.monotonic() - t0 < 2
    release.set()
    time.sleep(0.1)
    assert seen == [0]  # 1 and 2 were dropped
