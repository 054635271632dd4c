"""``Worker(cfg).run()`` in a thread of the test process (one process, warm JIT).

The worker's loop watchdog would end the whole test session with exit 5 and its captured output
lost; here it fails the test instead, naming the stuck call: the watchdog's log line, with the loop
thread's stack, is in the failed test's captured log, and one line goes to the real stderr at once."""

from __future__ import annotations

import sys
import threading
import time

from kafka_util import STARTUP_SECONDS

from iolstream.kafka.worker import Worker


class WorkerThread:
    """``Worker(cfg).run()`` in a thread; ``wait`` polls its counters, ``stop`` ends it cleanly.
    ``metrics``: an ``ops.metrics.Metrics`` the worker reports to."""

    def __init__(self, cfg, *, metrics=None):
        self.cfg = cfg
        self.worker = Worker(cfg) if metrics is None else Worker(cfg, metrics=metrics)
        self.exit_code = None
        self.stuck: str | None = None  # where the watchdog found the loop stuck
        self.thread = threading.Thread(target=self._run, name="worker", daemon=True)

    def _run(self):
        self.exit_code = self.worker.run(on_stuck=self._stuck)

    def _stuck(self, where: str) -> None:
        self.stuck = where
        print(f"\nthe in-process worker's loop is stuck in {where}", file=sys.__stderr__, flush=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.thread.is_alive() and self.stuck is None:
            self.stop()

    def start(self) -> WorkerThread:
        self.thread.start()
        return self

    def status(self) -> dict:
        return self.worker.processor.status()

    def alive(self, what: str) -> None:
        """Fails if the worker stopped or its loop is stuck."""
        assert self.stuck is None, f"the worker's loop got stuck in {self.stuck} while waiting for {what}"
        assert self.thread.is_alive(), f"the worker stopped (exit {self.exit_code}) while waiting for {what}"

    def wait(self, condition, timeout: float, what: str) -> dict:
        """Until ``condition(status)``; returns that status."""
        return self.wait_for(lambda w: s if condition(s := w.processor.status()) else None, timeout, what)

    def wait_for(self, condition, timeout: float, what: str):
        """Until ``condition(worker)`` is true; returns what it returned."""
        deadline = time.monotonic() + timeout
        while not (met := condition(self.worker)):
            self.alive(what)
            assert time.monotonic() < deadline, (
                f"timed out after {timeout:.0f} s waiting for {what}; status {self.status()}"
            )
            time.sleep(0.05)
        return met

    def wait_assigned(self, partitions: int = 2, timeout: float = STARTUP_SECONDS) -> None:
        """Until the group gave the worker its partitions and its consumer has fetched from each of them once (a
        fetch's high watermark known: then it reads new input as it comes). Without the second condition, a
        partition whose first fetch is slow (its leader still being looked up on a busy machine) lets the other
        topic's rows run ahead of it, as after any stall longer than the alignment's wait."""
        self.wait_for(
            lambda w: (
                w.partitions >= partitions
                and all(w.assignment.lag(key) is not None for key in list(w.book.assigned))
            ),
            timeout,
            "the worker's partitions, each fetched from once",
        )

    def stop(self, timeout: float = 60.0) -> int:
        assert self.stuck is None, f"the worker's loop got stuck in {self.stuck}"
        self.worker.request_stop()
        self.thread.join(timeout)
        assert self.stuck is None, f"the worker's loop got stuck in {self.stuck} while stopping"
        assert not self.thread.is_alive(), "the worker did not stop"
        return self.exit_code
