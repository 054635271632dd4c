"""Emit a step's outputs on a background thread while the next step computes.

The worker's compute (Numba kernels and BLAS, which release the GIL) and its output work
(encoding predictions to JSON, one produce call per row: Python, holding the GIL) can
overlap on two cores. ``Emitter`` runs ``emit(item)`` for submitted items on one thread,
in submission order; at most ``depth`` items wait, so a slow broker slows the worker down
instead of growing memory.

Durability needs to know when everything submitted has been handed to the producer:
``drain()`` waits for that (before a flush, a transaction commit, a snapshot, a rebalance
or a shutdown) and raises the first error ``emit`` raised, if any. After an error the
emitter drops what is still queued (the worker stops on it: nothing past the failure may
be committed).

    >>> seen = []
    >>> emitter = Emitter(seen.append, depth=2)
    >>> for i in range(5):
    ...     emitter.submit(i)
    >>> emitter.drain(); seen
    [0, 1, 2, 3, 4]
    >>> emitter.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

_STOP = object()


class EmitterError(RuntimeError):
    """``emit`` failed on the emitter thread; the original exception is the ``__cause__``."""


class Emitter:
    def __init__(self, emit: Callable[[object], None], *, depth: int = 2, name: str = "iolstream-emit"):
        if depth < 1:
            raise ValueError(f"depth must be ≥ 1, got {depth}")
        self._emit = emit
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._discard = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item) -> None:
        """Queue ``item`` (blocks while ``depth`` items wait). Raises a pending emit error first."""
        self._raise()
        if not self._thread.is_alive():
            raise EmitterError("the emitter is closed")
        self._queue.put(item)

    def drain(self) -> None:
        """Wait until every submitted item was emitted (or dropped after an error); raise that error."""
        self._queue.join()
        self._raise()

    @property
    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def close(self, *, discard: bool = False, timeout: float | None = None) -> None:
        """Stop the thread after emitting what is queued (``discard``: dropping it). Waits at most
        ``timeout`` seconds for an emit in progress (the thread is a daemon). Errors stay for ``drain``."""
        if discard:
            self._discard = True
        if self._thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:
                return
            self._thread.join(timeout)

    def _raise(self) -> None:
        if self._error is not None:
            raise EmitterError(f"emitting failed: {self._error}") from self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None and not self._discard:
                    self._emit(item)
            except BaseException as exc:  # noqa: BLE001 — handed to the submitting thread by drain/submit
                self._error = exc
            finally:
                self._queue.task_done()
