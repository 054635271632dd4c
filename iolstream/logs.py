"""Logging setup: human-readable lines for terminals, or one JSON object per line.

JSON lines carry the event name (``extra={"event": ...}``), the logger, the level,
the message, and any structured fields passed as ``extra={"status": {...}}``.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", record.name.rsplit(".", 1)[-1]),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "event":
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def setup(level: str = "INFO", fmt: str = "text", stream=None) -> None:
    """Configure the root ``iolstream`` logger (idempotent)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger("iolstream")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
