"""Logging setup: human-readable lines for terminals, or one JSON object per line.

``setup(level, fmt)`` configures the ``iolstream`` logger tree (the worker, the metrics
server, and librdkafka's own messages as ``iolstream.kafka``) from ``logging.level`` and
``logging.format`` of the worker config.

A JSON line has ``ts`` (UTC, ms), ``level``, ``logger``, ``event`` and ``message``, then
every structured field the call passed with ``extra=`` (counters, batch ids, offsets)::

    log.info("snapshot %s written", name, extra={"event": "snapshot", "bytes": 1234})
    {"ts":"2026-01-02T03:04:05.678Z","level":"info","logger":"iolstream.worker","event":"snapshot",
     "message":"snapshot snap-000000000001.iolsnap written","bytes":1234}

``event`` defaults to the last part of the logger's name. Values JSON cannot hold become
strings (NaN becomes null), so a log call never fails because of its fields.

    >>> import io, logging
    >>> out = io.StringIO()
    >>> setup("INFO", "json", stream=out)
    >>> logging.getLogger("iolstream.worker").info("rows=%d", 3, extra={"event": "status", "rows": 3})
    >>> line = orjson.loads(out.getvalue())
    >>> line["event"], line["message"], line["rows"], line["level"]
    ('status', 'rows=3', 3, 'info')
    >>> reset()
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time

import orjson

from iolstream.stream.prequential import CLASSIFICATION_METRICS, REGRESSION_METRICS
from iolstream.stream.rows import REASON_HINTS

# attributes every LogRecord has: anything else on a record came from ``extra=``
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
FORMATS = ("text", "json")


def _utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


def _plain(value):
    """``value`` with what orjson refuses made JSON-able (tuple keys, sets, ...)."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, float, bool)) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", record.name.rsplit(".", 1)[-1]),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = record.stack_info
        try:
            return orjson.dumps(out, default=str, option=_JSON_OPTIONS).decode()
        except TypeError:  # e.g. a dict keyed by tuples
            return orjson.dumps(_plain(out), default=str, option=_JSON_OPTIONS).decode()


class TextFormatter(logging.Formatter):
    """``12:34:56.789 INFO    iolstream.worker: message`` (local time), for terminals."""

    def __init__(self):
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")


REPEAT_INTERVAL_SECONDS = 10.0
_NUMBERS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Warnings and errors of one kind at most once per ``interval`` seconds, with a count.

    A broker outage makes librdkafka and the worker repeat the same complaint (connection refused,
    all brokers down, a failed commit) hundreds of times a minute. The kind of a record is its
    logger, level and message with the numbers taken out; the first record of a kind passes, the
    next ones within ``interval`` are counted and dropped, and the first one after it passes with
    "(N more like it in the last S s)". Records below WARNING always pass.

    >>> f = RepeatFilter(interval=60.0)
    >>> records = [logging.makeLogRecord({"name": "k", "levelno": logging.WARNING, "msg": f"broker {i}: down"})
    ...            for i in range(3)]
    >>> [f.filter(r) for r in records]
    [True, False, False]
    >>> f.suppressed()
    {'k: broker #: down': 2}
    """

    def __init__(self, interval: float = REPEAT_INTERVAL_SECONDS):
        super().__init__()
        self.interval = interval
        self._kinds: dict[tuple[str, int, str], list] = {}  # kind -> [first time in this interval, dropped]
        self._lock = threading.Lock()  # librdkafka logs from its own threads too

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.levelno, _NUMBERS.sub("#", record.getMessage())[:160])
        now = time.monotonic()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return False
            dropped = seen[1] if seen is not None else 0
            self._kinds[kind] = [now, 0]
            if (
                len(self._kinds) > 1000
            ):  # kinds that vary without bound (e.g. ids in messages): forget the oldest
                for old in sorted(self._kinds, key=lambda k: self._kinds[k][0])[:500]:
                    del self._kinds[old]
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} more like it in the last {now - seen[0]:.0f} s)"
            record.args = None
            record.repeated = dropped
        return True

    def suppressed(self) -> dict[str, int]:
        """``logger: message kind`` -> records dropped in the current interval (for tests and status)."""
        with self._lock:
            return {f"{k[0]}: {k[2]}": v[1] for k, v in self._kinds.items() if v[1]}


_BROKERS_DOWN = re.compile(r"\b(\d+)/\d+ brokers are down")


class BrokersDown(logging.Filter):
    """librdkafka's "N/M brokers are down": a warning at most (the worker rides an outage out and says so in its
    status line), and "0/M" (none is down: it comes when a client re-bootstraps, meaning nothing) only at DEBUG.

    >>> f = BrokersDown()
    >>> r = logging.makeLogRecord({"levelno": logging.ERROR, "levelname": "ERROR", "msg": "kafka consumer: 0/2 brokers are down"})
    >>> f.filter(r), r.levelname
    (False, 'DEBUG')
    """

    def filter(self, record: logging.LogRecord) -> bool:
        m = _BROKERS_DOWN.search(record.getMessage()) if record.levelno > logging.INFO else None
        if m is None:
            return True
        level = logging.DEBUG if m.group(1) == "0" else min(record.levelno, logging.WARNING)
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return logging.getLogger(record.name).isEnabledFor(level)


def setup(level: str = "INFO", fmt: str = "text", stream=None) -> None:
    """Configure the ``iolstream`` logger (idempotent: replaces the handler of an earlier call).

    ``fmt="json"`` also logs an uncaught exception as one JSON line before the process ends."""
    if fmt not in FORMATS:
        raise ValueError(f"logging.format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(BrokersDown())
    handler.addFilter(RepeatFilter())
    root = logging.getLogger("iolstream")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    if fmt == "json":
        sys.excepthook = _log_uncaught
    elif sys.excepthook is _log_uncaught:
        sys.excepthook = sys.__excepthook__


def reset() -> None:
    """Undo ``setup``: no handler of ours, records propagate to the root logger again (tests)."""
    root = logging.getLogger("iolstream")
    root.handlers[:] = []
    root.setLevel(logging.NOTSET)
    root.propagate = True
    if sys.excepthook is _log_uncaught:
        sys.excepthook = sys.__excepthook__


def _log_uncaught(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("iolstream").critical(
        "uncaught %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb), extra={"event": "crash"}
    )


def log_status_line(
    log: logging.Logger,
    processor,
    broker_unreachable_seconds: float | None = None,
    waiting_for: str | None = None,
    *,
    group: dict | None = None,
    dead_new: dict[str, int] | None = None,
    primary: str | None = None,
) -> None:
    """The worker's status line (``event: status``, every ``logging.status_every_seconds``): counters, the
    prequential metrics (``primary`` first, with its sliding window: ``metrics.primary``), the model version; the
    warm-up's progress until it is done; the dead letters since the last line and their most frequent reason
    (``dead_new``: reason -> count); the λ and half-life in force when forgetting or ``auto`` is on, how long the
    broker has been unreachable, and what the loop waits for."""
    s = processor.status()
    classification = processor.model.config.task == "classification"
    primary = primary or ("accuracy" if classification else "rmse")
    others = [n for n in (CLASSIFICATION_METRICS if classification else REGRESSION_METRICS) if n != primary]
    values, window = s["metrics"], s["metrics_window"]
    short = {
        "accuracy": "acc",
        "log_loss": "log_loss",
        "brier": "brier",
        "roc_auc": "auc",
        "balanced_accuracy": "bal_acc",
        "rmse": "rmse",
        "mae": "mae",
    }
    if classification and processor.model.config.m != 2:
        others.remove("roc_auc")  # two classes only
    more = "".join(f" {short[n]}={values[n]:.4f}" for n in others)  # nan until known
    down = broker_unreachable_seconds
    s["broker_unreachable_seconds"] = None if down is None else round(down, 1)
    dead = ""
    if dead_new and (new := sum(dead_new.values())):
        reason = max(sorted(dead_new), key=dead_new.get)
        s["dead_letters_new"] = dead_new
        dead = f" (+{new} since the last line, {'all' if dead_new[reason] == new else 'mostly'} {reason}: {REASON_HINTS[reason]})"
    warming = ""
    if s["warmup_rows"] < s["warmup_target"]:
        warming = f" warming up {s['warmup_rows']}/{s['warmup_target']} (no prediction before model.warmup_rows rows)"
    eff, mc = processor.model.effective, processor.model.config
    tail = ""
    if eff["forgetting"] is not None or "candidates" in eff:
        tail = f" lam={eff['lam']:g}"
        if eff["forgetting"] is not None or mc.forgetting is not None:  # forgetting on, or chosen online
            tail += " half_life=" + ("off" if eff["forgetting"] is None else f"{eff['forgetting']:g}")
    if mc.mode == "auto":  # -F or -R, chosen online
        tail += f" mode={eff['mode']}"
    if group is not None:  # group learning: its size and how far the sums applied here are behind
        s["group"] = group
        tail += f" group={group['members']} members (sums up to {max(group['lag_ms'].values(), default=0) / 1000:.1f} s old)"
    if s.get("values_clipped"):  # inputs far outside the scaling (core.scaling.Z_LIMIT)
        tail += f" clipped={s['values_clipped']}"
    fields = s.get("fields", {})  # named-field events: values not declared, and missing, per field
    if fields.get("undeclared"):
        tail += " undeclared=" + ",".join(f"{name}:{n}" for name, n in fields["undeclared"].items())
    if fields.get("missing"):
        tail += " missing=" + ",".join(f"{name}:{n}" for name, n in fields["missing"].items())
    tail += "" if down is None else f" broker unreachable for {down:.0f} s"
    tail += "" if waiting_for is None else f" waiting for {waiting_for}"
    log.info(
        "rows_in=%d predictions=%d labels_joined=%d pending=%d dead_letters=%d%s prequential_%s=%.4f (window %.4f)%s "
        "version=%d%s%s",
        s["rows_in"],
        s["predictions_out"],
        s["rows_learned"],
        s["pending"],
        s["dead_letters"],
        dead,
        short[primary],
        values[primary],
        window[primary],
        more,
        s["model_version"],
        warming,
        tail,
        extra={"event": "status", "status": s},
    )
