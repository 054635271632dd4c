"""Blocking Kafka client calls with a deadline the client cannot overrun.

A librdkafka call may wait past the timeout it was given (``rd_kafka_send_offsets_to_transaction``
after a broker outage waits on a condition variable with no deadline: librdkafka issues #5456 and
#5511). Python cannot interrupt a C call, so ``ClientCalls.call`` runs it on a helper thread and
waits for it in short slices; between slices the caller's ``on_wait`` hook runs (the worker keeps
its loop ticking: health, status line, metrics). A call still running at its deadline is left to
its thread (a fresh thread serves the next call) and ``CallTimedOut`` is raised: the caller then
gives up on that client object (a transactional producer is replaced, see ``worker``).

    >>> calls = ClientCalls()
    >>> calls.call("sum", lambda: 1 + 2, timeout=1.0)
    3
    >>> import threading
    >>> stuck = threading.Event()
    >>> try:
    ...     calls.call("stuck", stuck.wait, timeout=0.05, grace=0.05)
    ... except CallTimedOut as exc:
    ...     print(exc)
    stuck did not return within 0.1 s
    >>> calls.abandoned, calls.call("next", lambda: "a new thread serves it", timeout=1.0)
    (1, 'a new thread serves it')
    >>> stuck.set()
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable

from iolstream.ops.faults import fault_point

log = logging.getLogger("iolstream.worker")

WAIT_SLICE = 0.25  # seconds between two ``on_wait`` calls while a call runs
HANG_FAULT = (
    "hang_"  # test-only fault point prefix: ``IOLSTREAM_CRASH_AT=hang_<call name>:<hit>`` blocks that call
)


class CallTimedOut(RuntimeError):
    """A client call did not return within its deadline; it may still be running on its thread."""

    def __init__(self, name: str, seconds: float):
        super().__init__(f"{name} did not return within {seconds:.1f} s")
        self.name = name
        self.seconds = seconds


class _Job:
    __slots__ = ("fn", "done", "result", "error")

    def __init__(self, fn: Callable):
        self.fn = fn
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None


class ClientCalls:
    """Runs blocking calls on one helper thread (a new one after a call overran), with deadlines.

    ``current`` is ``(name, monotonic start)`` of the call in progress (None between calls): the
    loop watchdog and the status line name it. ``faults``: honour the test-only hang fault points."""

    def __init__(self, on_wait: Callable[[str, float], None] | None = None, *, faults: bool = False):
        self.on_wait = on_wait
        self.faults = faults
        self.current: tuple[str, float] | None = None
        self.abandoned = 0  # calls left running past their deadline
        self._jobs: queue.SimpleQueue | None = None

    def call(self, name: str, fn: Callable, timeout: float, *, grace: float = 5.0):
        """``fn()`` (which should itself give up after ``timeout`` s), waiting at most ``timeout + grace``;
        returns its result or raises its exception, or ``CallTimedOut``."""
        if self.faults and fault_point(HANG_FAULT + name):
            log.warning("test fault point %r reached: the call never returns", HANG_FAULT + name)
            fn = hang_in_c
        job = _Job(fn)
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(self._jobs,), name="iolstream-client-calls", daemon=True
            ).start()
        started = time.monotonic()
        deadline = started + timeout + grace
        self.current = (name, started)
        try:
            self._jobs.put(job)
            while not job.done.wait(max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    self._jobs.put(None)  # the stuck thread ends once its call returns, if ever
                    self._jobs = None
                    self.abandoned += 1
                    raise CallTimedOut(name, deadline - started)
                if self.on_wait is not None:
                    self.on_wait(name, time.monotonic() - started)
        finally:
            self.current = None
        if job.error is not None:
            raise job.error
        return job.result

    def direct(self, name: str, fn: Callable):
        """``fn()`` on the calling thread (where a client answers only its own thread, e.g. a consumer call
        inside a rebalance callback): no deadline but the call's own timeout; named in ``current`` for the
        loop watchdog."""
        if self.faults and fault_point(HANG_FAULT + name):
            log.warning("test fault point %r reached: the call never returns", HANG_FAULT + name)
            fn = hang_in_c
        self.current = (name, time.monotonic())
        try:
            return fn()
        finally:
            self.current = None

    def close(self) -> None:
        """End the helper thread (after the call it may be stuck in)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.result = job.fn()
        except BaseException as exc:  # handed to the caller
            job.error = exc
        job.done.set()


def hang_in_c() -> None:
    """Test-only fault: never return, as librdkafka's stuck calls do: a ``pthread_cond_wait`` with no
    deadline in C, the GIL released, signals not ending it."""
    libc = ctypes.CDLL(None, use_errno=True)
    mutex = ctypes.create_string_buffer(
        64
    )  # zeroed: PTHREAD_MUTEX_INITIALIZER / PTHREAD_COND_INITIALIZER (glibc)
    cond = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    while True:
        libc.pthread_cond_wait(cond, mutex)  # nobody signals it
