"""The worker process's life: signals on a thread of their own, and a watchdog on the loop.

Python runs a signal handler only on the main thread, between two bytecodes: a main thread
blocked in a C call (a Kafka client call that ignores its timeout) never sees SIGTERM. So
``SignalThread`` takes SIGTERM and SIGINT on a daemon thread that nothing else runs on. Its
handler only sets flags and starts timers; the exit deadline is kept by a timer thread, never
by the loop.

``LoopWatchdog`` ends a process whose loop has not ticked for ``bound`` seconds, naming what the
loop thread is doing (the client call in flight, else its innermost Python frame) and its stack.

Exit codes of ``iolstream run`` (also in README "Operations"):

====  =========================================================================================
0     stopped cleanly: flushed, final snapshot written, offsets committed
3     fatal: fenced producer, undeliverable output, incompatible snapshot, bad config
4     a stop (SIGTERM/SIGINT) could not finish within ``durability.shutdown_grace_seconds``
5     the loop was stuck (no tick within the watchdog bound): a client call that never returns
6     the broker refused the worker: authentication failed, its TLS certificate is not trusted, or an ACL
      is missing (the one line logged names the mechanism and user, the certificate, or the resource and
      operation; see ``kafka.diagnose``); ``iolstream check`` and ``iolstream produce`` exit 6 too
====  =========================================================================================
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("iolstream.worker")

EXIT_OK = 0
EXIT_FATAL = 3
EXIT_SHUTDOWN_OVERRUN = 4
EXIT_STUCK = 5
EXIT_ACCESS = 6
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalThread:
    """SIGTERM/SIGINT handled on a dedicated thread: ``handler(signum)`` runs there.

    Python's own C-level signal handler, which runs on whatever thread the kernel picks, writes the
    signal's number to a wakeup descriptor (``signal.set_wakeup_fd``); this thread waits on the other end
    of it with the GIL released, so a main thread stuck in a C call does not hold the signal up. (Blocking
    the signals with ``pthread_sigmask`` and taking them with ``sigwait`` is not enough here: native threads
    started before, such as OpenBLAS's pool when NumPy loads, keep the default mask, and SIGTERM delivered to
    one of them ended the process at once.) The Python-level handlers left on the main thread do nothing.
    ``start()`` must run on the main thread."""

    def __init__(self, handler: Callable[[int], None]):
        self.handler = handler
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalThread.start() must run on the main thread")
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, _ignore)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._sockets = (reader, writer)  # kept open for the life of the process
        self.thread = threading.Thread(
            target=self._wait, args=(reader,), name="iolstream-signals", daemon=True
        )
        self.thread.start()

    def _wait(self, reader: socket.socket) -> None:
        while True:
            for signum in reader.recv(64):
                if signum not in STOP_SIGNALS:
                    continue
                try:
                    self.handler(signum)
                except Exception:  # the thread must go on taking signals
                    log.exception("signal handler failed")


def _ignore(_signum, _frame) -> None:
    """The main thread's Python-level handler: the signal thread has acted on it already."""


def exit_after(seconds: float, code: int, message: str) -> threading.Timer:
    """A daemon timer that logs ``message`` and ends the process with ``code`` after ``seconds``."""

    def fire():
        log.error("%s: exiting with %d", message, code, extra={"event": "exit", "code": code})
        _flush_logs()
        os._exit(code)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


class LoopWatchdog:
    """Ends the process with EXIT_STUCK when ``last_tick()`` is older than ``bound`` seconds.

    ``doing()`` names what the loop is in (e.g. the client call in flight); when it returns None the
    loop thread's innermost frame is named. The loop thread is the one that calls ``start()``; its whole
    stack is logged too. Checks every ``bound / 10`` s (at most 1 s) on a daemon thread. ``on_stuck``
    replaces the exit (a worker run inside another program, such as a test, must not end that program):
    it is called once with the place named, and the watch ends."""

    def __init__(
        self,
        bound: float,
        last_tick: Callable[[], float],
        doing: Callable[[], str | None],
        on_stuck: Callable[[str], None] | None = None,
    ):
        self.bound = bound
        self.last_tick = last_tick
        self.doing = doing
        self.on_stuck = on_stuck
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None

    def start(self) -> None:
        self._loop_ident = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="iolstream-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.bound / 10)):
            stalled = time.monotonic() - self.last_tick()
            if stalled > self.bound and not self._stop.is_set():
                frame = sys._current_frames().get(self._loop_ident)
                where = self.doing() or frame_name(frame)
                log.critical(
                    "the loop has not ticked for %.1f s (bound %.1f s), stuck in %s: %s\n%s",
                    stalled,
                    self.bound,
                    where,
                    f"exiting with {EXIT_STUCK}" if self.on_stuck is None else "giving up on it",
                    "".join(traceback.format_stack(frame)).rstrip() if frame else "(no Python stack)",
                    extra={"event": "stuck", "stuck_in": where, "seconds": round(stalled, 1)},
                )
                _flush_logs()
                if self.on_stuck is not None:
                    self.on_stuck(where)
                    return
                os._exit(EXIT_STUCK)


def frame_name(frame) -> str:
    """``function (file:line)`` of a Python frame (None: unknown)."""
    if frame is None:
        return "an unknown place"
    return f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


def _flush_logs() -> None:
    for handler in logging.getLogger("iolstream").handlers:
        try:
            handler.flush()
        except Exception:  # exiting anyway
            pass
