"""Test-only fault injection: the durability tests choose where a worker dies or a call fails.

``IOLSTREAM_CRASH_AT="name:n[,other:m]"`` makes ``fault_point(name)`` true at its n-th hit;
``crash_point(name)`` then ends the process at once, as kill -9 would. Without the variable both
cost one dictionary look-up and do nothing.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("iolstream.faults")

CRASH_ENV = "IOLSTREAM_CRASH_AT"
CRASH_EXIT_CODE = 137  # what a SIGKILL looks like to a shell
_hits: dict[str, int] = {}


def fault_point(name: str) -> bool:
    """Test-only: True at the n-th hit of ``name`` when IOLSTREAM_CRASH_AT="name:n[,other:m]"; else False."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return False
    wanted = dict(item.rsplit(":", 1) for item in spec.split(",") if ":" in item)
    if name not in wanted:
        return False
    _hits[name] = _hits.get(name, 0) + 1
    return _hits[name] == int(wanted[name])


def crash_point(name: str) -> None:
    """Test-only: die at once, as kill -9 would (no cleanup, no flush), at the chosen hit of ``name``."""
    if fault_point(name):
        log.warning("test crash point %r reached: exiting with %d", name, CRASH_EXIT_CODE)
        os._exit(CRASH_EXIT_CODE)
