"""The replay's message plan, pure and testable without Kafka: features go out in order (row or batch
messages); each label becomes due ``label_delay_rows`` rows after its features (and, when sending,
``label_delay_seconds`` later still), and may be dropped (never sent), duplicated, or shuffled within
a window (out of order). ``produce.send`` sends a plan.

Rows are arrays (``{"id", "x"}`` messages) or, for a worker with a feature schema, records sent as
named-field events in the worker's ``EventShape`` (``{"order_id": "r0", "amount": 4.5, ...}``, a batch as
a JSON array of them; labels ``{"order_id": "r0", "is_fraud": true}``).

    >>> import numpy as np
    >>> msgs = plan(np.arange(6.0).reshape(3, 2), ["a", "b", "a"], PlanOptions(label_delay_rows=1, with_ts=False))
    >>> [(m.kind, m.encode()) for m in msgs][:4]  # doctest: +NORMALIZE_WHITESPACE
    [('features', b'{"id":"r0","x":[0.0,1.0]}'), ('features', b'{"id":"r1","x":[2.0,3.0]}'),
     ('labels', b'{"id":"r0","y":"a"}'), ('features', b'{"id":"r2","x":[4.0,5.0]}')]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import orjson


@dataclass(frozen=True)
class PlanOptions:
    """How a data set is turned into a stream of messages: batching, label delays and faults."""

    batch_rows: int = 1  # rows per message: 1 = row messages {"id", "x"}, more = batch messages {"ids", "x"}
    label_delay_rows: int = 0  # a label is sent once this many later rows have been sent
    label_delay_seconds: float = 0.0  # ... and this long after it became due (applied by ``send``)
    missing_fraction: float = 0.0  # labels never sent
    duplicate_fraction: float = 0.0  # labels sent twice
    shuffle_window: int = 0  # labels shuffled within windows of this many (out of order)
    with_ts: bool = True  # event time on features (the wall clock when sent)
    id_prefix: str = "r"  # numbered rows' ids: PREFIX0, PREFIX1, ...; with ``ids``, put before each
    seed: int = 0
    ids: tuple[str, ...] | None = None  # the rows' own ids (a file's id column), in the order sent

    def __post_init__(self):
        for key in ("missing_fraction", "duplicate_fraction"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"--{key.replace('_', '-')}: must be in [0, 1), got {value}")
        for key in ("batch_rows", "label_delay_rows", "shuffle_window"):
            if getattr(self, key) < (1 if key == "batch_rows" else 0):
                raise ValueError(f"--{key.replace('_', '-')}: out of range: {getattr(self, key)}")
        if not (math.isfinite(self.label_delay_seconds) and self.label_delay_seconds >= 0):
            raise ValueError(f"--label-delay-seconds: must be ≥ 0, got {self.label_delay_seconds}")
        if not self.id_prefix and self.ids is None:
            raise ValueError("--id-prefix: must not be empty")


@dataclass(frozen=True)
class EventShape:
    """Where named-field events keep their id, label and event time: a worker's ``events`` section."""

    id_field: str = "id"
    label_field: str = "y"
    time_field: str | None = None
    id_from_key: bool = False  # the id goes in the message key only (one event per message)

    @classmethod
    def of(cls, events) -> EventShape:
        """The shape of a worker's ``EventsConfig``."""
        return cls(events.id_field, events.label_field, events.time_field, events.id_from_key)

    def event(self, row_id: str, record: dict) -> dict:
        """The features event of a row: its record and, unless it is the key, its id."""
        return record if self.id_from_key else _with(record, self.id_field, row_id)

    def label(self, row_id: str, y) -> dict:
        """The labels event of a row."""
        event = _with({}, self.label_field, y)
        return event if self.id_from_key else _with(event, self.id_field, row_id)


def _with(record: dict, path: str, value) -> dict:
    """A copy of ``record`` with ``value`` at the dotted ``path`` (the objects on the way copied too)."""
    head, _, rest = path.partition(".")
    out = dict(record)
    out[head] = (
        _with(out.get(head) if isinstance(out.get(head), dict) else {}, rest, value) if rest else value
    )
    return out


@dataclass
class Message:
    """One message of a planned stream: features or labels, its key, JSON object(s) and rows."""

    kind: str  # "features" or "labels"
    key: bytes
    obj: dict | list  # the JSON object (a named-field batch: a list of events), without the event time
    rows: int
    due_row: int  # feature rows sent before this message (for rate-limited replays)
    stamp: bool = False  # features with event time
    time_field: str | None = "ts"  # where the event time goes: "ts" of an array message; an event's field

    def encode(self, now_ms: int | None = None) -> bytes:
        """The message value; stamped features get ``now_ms`` as their event time (an array message: one
        "ts" for the batch; named-field events: each event's time field, if the worker reads one)."""
        if self.stamp and now_ms is not None and self.time_field is not None:
            if isinstance(self.obj, list):
                return orjson.dumps([_with(e, self.time_field, int(now_ms)) for e in self.obj])
            return orjson.dumps(_with(self.obj, self.time_field, int(now_ms)))
        return orjson.dumps(self.obj)


def label_value(y):
    """A label as JSON takes it: a numpy scalar as its Python value."""
    return y.item() if hasattr(y, "item") else y


def row_ids(n: int, options: PlanOptions) -> list[str]:
    """The ids of ``n`` rows: ``options.id_prefix`` and the row's index, or before each of ``options.ids``."""
    if options.ids is None:
        return [f"{options.id_prefix}{i}" for i in range(n)]
    if len(options.ids) != n:
        raise ValueError(f"{len(options.ids)} ids for {n} rows")
    return [f"{options.id_prefix}{i}" for i in options.ids]


def iter_plan(X, y, options: PlanOptions, shape: EventShape | None = None) -> Iterator[Message]:
    """The exact sequence of messages a replay sends (features and labels interleaved), lazily. ``X``: the rows
    as an array, or with ``shape`` as records (dicts of named fields) sent as events."""
    rng = np.random.default_rng(options.seed)
    n = len(X)
    ids = row_ids(n, options)
    send = rng.random(n) >= options.missing_fraction
    twice = rng.random(n) < options.duplicate_fraction
    label_order = np.arange(n)
    if options.shuffle_window > 1:
        for start in range(0, n, options.shuffle_window):
            rng.shuffle(label_order[start : start + options.shuffle_window])
    label_queue = deque(label_order.tolist())
    pending: deque[int] = deque()  # label rows due, in send order
    repeats: list[int] = []  # duplicates go out with the next flush, never in the same message
    b = options.batch_rows

    def y_of(i: int):
        v = y[i]
        return label_value(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist()

    def flush_labels(limit_row: int | None, sent_rows: int) -> Iterator[Message]:
        # labels whose features went out at least label_delay_rows rows ago, in (shuffled) order
        pending.extend(repeats)
        repeats.clear()
        while label_queue and (limit_row is None or label_queue[0] + options.label_delay_rows < limit_row):
            i = label_queue.popleft()
            if send[i]:
                pending.append(i)
                if twice[i]:
                    repeats.append(i)
        while pending:
            chunk = [pending.popleft() for _ in range(min(b, len(pending)))]
            if shape is not None:
                events = [shape.label(ids[i], y_of(i)) for i in chunk]
                obj = events[0] if b == 1 else events
            elif b == 1:
                obj = {"id": ids[chunk[0]], "y": y_of(chunk[0])}
            else:
                obj = {"ids": [ids[i] for i in chunk], "y": [y_of(i) for i in chunk]}
            yield Message("labels", ids[chunk[0]].encode(), obj, len(chunk), sent_rows)

    time_field = "ts" if shape is None else shape.time_field
    for start in range(0, n, b):
        stop = min(start + b, n)
        if shape is not None:
            events = [shape.event(ids[i], X[i]) for i in range(start, stop)]
            obj = events[0] if b == 1 else events
        elif b == 1:
            obj = {"id": ids[start], "x": np.asarray(X[start], dtype=np.float64).tolist()}
        else:
            obj = {"ids": ids[start:stop], "x": np.asarray(X[start:stop], dtype=np.float64).tolist()}
        yield Message(
            "features",
            ids[start].encode(),
            obj,
            stop - start,
            start,
            stamp=options.with_ts,
            time_field=time_field,
        )
        yield from flush_labels(stop, stop)
    yield from flush_labels(None, n)
    yield from flush_labels(None, n)  # the last repeats


def plan(X, y, options: PlanOptions, shape: EventShape | None = None) -> list[Message]:
    """``iter_plan`` as a list."""
    return list(iter_plan(X, y, options, shape))


def plan_summary(messages: Iterable[Message]) -> dict:
    """Messages and rows of each kind in a plan."""
    out = {"feature_messages": 0, "feature_rows": 0, "label_messages": 0, "label_rows": 0}
    for m in messages:
        if m.kind == "features":
            out["feature_messages"] += 1
            out["feature_rows"] += m.rows
        else:
            out["label_messages"] += 1
            out["label_rows"] += m.rows
    return out
