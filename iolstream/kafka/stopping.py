"""How the worker stops: a stop requested (by a signal, on its own thread, or by the loop), the grace period
it must fit in, and the bound of the loop watchdog.

A stop from a signal must be over within ``durability.shutdown_grace_seconds``: a timer thread ends the
process with EXIT_SHUTDOWN_OVERRUN (4) otherwise, whatever the main thread is stuck in; a second signal
exits at once. Blocking calls made during a stop are cut to what is left of the grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from iolstream.kafka.clients import CALL_GRACE, SNAPSHOT_BYTES_PER_SECOND, estimated_snapshot_bytes
from iolstream.kafka.config import WorkerConfig
from iolstream.ops.lifecycle import EXIT_SHUTDOWN_OVERRUN, exit_after

log = logging.getLogger("iolstream.worker")


class Stopping:
    """A stop requested (signal or call), and the grace period the shutdown must fit in."""

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.event = threading.Event()
        self.signalled = False
        self.deadline: float | None = None  # monotonic time by which a shutdown must be over
        self._timer: threading.Timer | None = None

    def request(self, signum: int | None = None) -> None:
        """Stop after the current cycle; from a signal, within the grace period."""
        if signum is not None:
            if self.signalled:
                log.error("second %s: exiting now, without a final snapshot", signal.Signals(signum).name)
                os._exit(EXIT_SHUTDOWN_OVERRUN)
            self.signalled = True
            log.info(
                "%s: stopping within %g s",
                signal.Signals(signum).name,
                self.cfg.durability.shutdown_grace_seconds,
            )
            self.start_timer()
        self.event.set()

    def start_timer(self) -> None:
        """The grace period begins (at the first signal, or when the loop ends by itself)."""
        if self._timer is not None:
            return
        grace = self.cfg.durability.shutdown_grace_seconds
        self.deadline = time.monotonic() + grace
        self._timer = exit_after(
            grace,
            EXIT_SHUTDOWN_OVERRUN,
            f"shutdown took longer than durability.shutdown_"
            f"grace_seconds={grace:g}; the last durable snapshot and its offsets stand",
        )

    def cancel(self) -> None:
        """Cancel the grace-period timer (the worker stopped in time)."""
        if self._timer is not None:
            self._timer.cancel()

    def timeout(self, seconds: float) -> float:
        """``seconds``, cut to what is left of the grace period (keeping 1 s for the rest)."""
        if self.deadline is None:
            return seconds
        return max(0.5, min(seconds, self.deadline - time.monotonic() - 1.0))

    def watchdog_seconds(self) -> float:
        """How long the loop may go without a tick before the watchdog ends the process. Client calls tick
        while they wait, so the bound covers the main thread's own work: twice a snapshot's estimated time,
        one client call (those inside a rebalance callback cannot tick) and a margin; at least 60 s."""
        if self.cfg.durability.watchdog_seconds is not None:
            return self.cfg.durability.watchdog_seconds
        snapshot_s = estimated_snapshot_bytes(self.cfg) / SNAPSHOT_BYTES_PER_SECOND
        return max(60.0, self.cfg.kafka.call_timeout_seconds + CALL_GRACE + 2 * snapshot_s + 10.0)
