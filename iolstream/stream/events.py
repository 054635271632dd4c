"""Named-field events -> validated rows and labels, and dead letters for what is refused (docs/design.md §11).
The format of a model with a feature schema (``model.features``); the array format is ``stream.codec``'s.

A message carries one event (a JSON object) or a batch (a JSON array of objects)::

    features  {"order_id": "o-17", "amount": 42.5, "country": "FR", "device": {"os": "ios"}, "ts": 1764}
              [{"order_id": "o-17", ...}, {"order_id": "o-18", ...}]
    labels    {"order_id": "o-17", "is_fraud": false}
              [{"order_id": "o-17", "is_fraud": false}, ...]

The id comes from ``events.id_field`` (a dotted path, ``id`` by default) or, with ``events.id_from_key``,
from the message key (then a message carries one event); the label from ``events.label_field``; the event
time from ``events.time_field`` if set. The model's inputs are encoded by its schema (``core.encoder``);
every other field is ignored. Decoded in one pass: parse, then per field a column of the batch.

Refused, each with its reason and a detail naming the field (the same rules as the array format's for
ids, times and labels, ``stream.values``):

- the whole message: empty, oversize, not JSON (``malformed_json``, ``oversize``); not an object or an
  array of objects, an empty array, several events with the id from the key (``bad_schema``);
- one event: no id (``missing_id``), a field of the wrong type (``bad_field``), a required field missing
  or none of the schema's fields at all (``missing_field``: another format or topic), a bad time (``bad_schema``), a label that is not a class (``unknown_class``,
  ``bad_label``), an id repeated within the message (``duplicate_id``). Its dead letter is the message
  itself when it held that event alone, else the event re-encoded as a message of its own (which decodes
  to the same problem), with ``event <i>:`` in the detail.

Per field, the events with the field missing and (categories with declared values) with a value not
declared are counted: ``missing`` and ``undeclared`` (the status line and /metrics report them).

    >>> from iolstream.core.schema import FeatureSchema
    >>> from iolstream.stream.config import EventsConfig
    >>> schema = FeatureSchema.parse([{"name": "amount", "type": "number", "required": True},
    ...                               {"name": "country", "type": "category", "values": ["FR", "DE"]}])
    >>> codec = EventCodec(schema, EventsConfig(id_field="order_id", label_field="is_fraud"),
    ...                    TargetSpec.classification((False, True)), max_bytes=10_000)
    >>> rows, dead = codec.features(b'[{"order_id": "o-1", "amount": 4, "country": "US"}, {"order_id": "o-2"}]')
    >>> rows.ids, rows.X.tolist(), codec.undeclared.tolist()
    (['o-1'], [[4.0, 0.0, 0.0, 1.0, 0.0]], [0, 1])
    >>> [(b.reason, b.detail, raw) for b, raw in dead]
    [('missing_field', "event 1: field 'amount' is required, but missing or null", b'{"order_id":"o-2"}')]
    >>> labels, dead = codec.labels(b'{"order_id": "o-1", "is_fraud": true}')
    >>> labels.ids, labels.Y.tolist(), dead
    (['o-1'], [1], [])
"""

from __future__ import annotations

import numpy as np
import orjson

from iolstream.core.encoder import MISSING, RecordEncoder, Refused, resolve
from iolstream.core.schema import FeatureSchema
from iolstream.stream.codec import forget_ids
from iolstream.stream.config import EventsConfig
from iolstream.stream.rows import BadInput, FeatureRows, LabelRows, TargetSpec
from iolstream.stream.values import (
    MAX_TS_MS,
    check_id,
    check_label,
    check_ts,
    fast_ids,
    fast_labels,
    json_type,
    labels_array,
    may_hold_bool,
    short,
)

_MISSING_KEY = object()  # no id (no message key), or no label
_BAD_KEY = object()  # a message key that is not UTF-8 text


def _one(reason: str, detail: str, raw: bytes) -> list[tuple[BadInput, bytes]]:
    return [(BadInput(reason, detail), raw)]


def _dumps(event) -> bytes:
    return bytes(
        memoryview(orjson.dumps(event))
    )  # a copy: orjson's 4 KB buffer is not held (encoding.row_message)


class EventCodec:
    """The named-field format of one model: its schema compiled once (``core.encoder``), the message shape
    (``EventsConfig``), its label target, and the per-field counts of missing and undeclared values."""

    def __init__(self, schema: FeatureSchema, events: EventsConfig, target: TargetSpec, *, max_bytes: int):
        self.encoder = RecordEncoder(schema)
        self.events, self.target, self.max_bytes = events, target, max_bytes
        self.field_names = list(self.encoder.names)
        self.missing = np.zeros(len(self.field_names), dtype=np.int64)
        self.undeclared = np.zeros(len(self.field_names), dtype=np.int64)
        self._id_path = tuple(events.id_field.split("."))
        self._label_path = tuple(events.label_field.split("."))
        self._time_path = None if events.time_field is None else tuple(events.time_field.split("."))
        self._passthrough = [(name, tuple(name.split("."))) for name in events.passthrough]

    # ------------------------------------------------------------ messages
    def _parse(self, value: bytes | None, key) -> tuple[list | None, bytes, list]:
        """(events, raw, dead letters of the whole message)."""
        raw = value if type(value) is bytes else bytes(value or b"")
        if not raw:
            return None, raw, _one("malformed_json", "empty value (null or zero bytes)", raw)
        if len(raw) > self.max_bytes:
            return None, raw, _one("oversize", f"value is {len(raw)} bytes, limit {self.max_bytes}", raw)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return None, raw, _one("malformed_json", f"not valid JSON: {exc}", raw)
        if type(obj) is dict:
            return [obj], raw, []
        if type(obj) is not list:
            return (
                None,
                raw,
                _one("bad_schema", f"top level is {json_type(obj)}, not an event (an object)", raw),
            )
        if not obj:
            return None, raw, _one("bad_schema", "empty batch (an array of no events)", raw)
        if self.events.id_from_key and len(obj) > 1:
            return (
                None,
                raw,
                _one(
                    "bad_schema",
                    f"{len(obj)} events in one message, but the id is the message key (events.id_from_key): "
                    "one event per message",
                    raw,
                ),
            )
        return obj, raw, []

    def _ids(self, events: list, key) -> list:
        """Each event's id as it came (the key's text with id_from_key; _MISSING_KEY when it has none)."""
        if self.events.id_from_key:
            if key is None:
                return [_MISSING_KEY]
            try:
                return [key.decode("utf-8") if isinstance(key, bytes) else str(key)]
            except UnicodeDecodeError:
                return [_BAD_KEY]
        return self._column(events, self._id_path)

    def _column(self, events: list, path: tuple) -> list:
        """The value at ``path`` of each event, None where it has none (``_get``): a top-level field read with
        one dict lookup per event, not a path walk (a per-row call costs ~0.5 µs a field)."""
        if len(path) == 1:
            name = path[0]
            return [e.get(name) if type(e) is dict else None for e in events]
        return [self._get(e, path) for e in events]

    @staticmethod
    def _get(event, path):
        try:
            value = resolve(event, path) if type(event) is dict else None
        except Refused:
            return None
        return None if value is MISSING else value

    def _check_id(self, v) -> tuple[str | None, str | None, str]:
        if v is _MISSING_KEY:
            return None, "missing_id", "the message has no key, and the id is the key (events.id_from_key)"
        if v is _BAD_KEY:
            return (
                None,
                "bad_schema",
                "the message key is not UTF-8 text, and the id is the key (events.id_from_key)",
            )
        row_id, reason, why = check_id(v)
        if reason is not None:
            where = "message key" if self.events.id_from_key else f"field {self.events.id_field!r}"
            why = f"{why} ({where})"
        return row_id, reason, why

    def _times(self, events: list) -> tuple[np.ndarray | None, list | None]:
        """(event times, None) when clean, else (None, the raw values) for the per-event check."""
        b = len(events)
        if self._time_path is None:
            return np.full(b, -1, dtype=np.int64), None
        values = self._column(events, self._time_path)
        if set(map(type, values)) == {int}:
            arr = np.array(values, dtype=np.int64) if max(values) <= MAX_TS_MS else None
            if arr is not None and arr.min() >= 0:
                return arr, None
        return None, values

    # ------------------------------------------------------------ features
    def features(
        self, value: bytes | None, key=None
    ) -> tuple[FeatureRows | None, list[tuple[BadInput, bytes]]]:
        """The message's rows (None when none is good) and its dead letters."""
        events, raw, dead = self._parse(value, key)
        if events is None:
            return None, dead
        b = len(events)
        single = b == 1
        if single:
            return self._one_event(events[0], raw, key)
        ids = self._ids(events, key)
        ts, ts_raw = self._times(events)
        if ts is not None and fast_ids(ids) and set(map(type, events)) == {dict}:
            good, good_ids = events, ids  # the common case: every id fine and unique, times fine
        else:
            good, good_ids, ts, dead = self._screen(events, ids, ts, ts_raw, raw, single)
            if not good:
                return None, dead
        out = self.encoder.encode(good, no_bools=not may_hold_bool(raw))
        refused, kept, X, missing = out.refused, out.kept, out.X, out.missing
        if out.empty.any():  # none of the model's fields: another format or topic, never a row to learn
            why = self._empty_why()
            refused = sorted(
                refused + [(kept[j], "missing_field", why) for j in np.flatnonzero(out.empty).tolist()]
            )
            keep = np.flatnonzero(~out.empty)
            X, kept = X[keep], [kept[j] for j in keep.tolist()]
            missing = missing - int(out.empty.sum())  # an empty row was counted missing in every field
        if refused:
            for i, reason, detail in refused:
                where = "" if single else f"event {self._index(events, good[i])}: "
                dead.append((BadInput(reason, where + detail), raw if single else _dumps(good[i])))
            if not kept:
                return None, dead
            good = [good[i] for i in kept]
            good_ids = [good_ids[i] for i in kept]
            ts = ts[kept]
        self.missing += missing
        self.undeclared += out.undeclared
        return FeatureRows(good_ids, X, ts, good), dead

    def _one_event(self, event, raw: bytes, key) -> tuple[FeatureRows | None, list[tuple[BadInput, bytes]]]:
        """``features`` of a message with one event (the same rules, without the batch's columns)."""
        if type(event) is not dict:
            return None, _one("bad_schema", f"the event is {json_type(event)}, not an object", raw)
        row_id, reason, why = self._check_id(self._ids([event], key)[0])
        if reason is not None:
            return None, _one(reason, why, raw)
        stamp = -1
        if self._time_path is not None:
            stamp, why = check_ts(self._get(event, self._time_path))
            if stamp is None:
                return None, _one("bad_schema", f"field {self.events.time_field!r}: {why}", raw)
        try:
            row, missing, undeclared = self.encoder.encode_one(event)
        except Refused as exc:
            return None, _one(exc.reason, exc.detail, raw)
        if len(missing) == len(self.field_names):
            return None, _one("missing_field", self._empty_why(), raw)
        for j in missing:
            self.missing[j] += 1
        for j in undeclared:
            self.undeclared[j] += 1
        return FeatureRows([row_id], row.reshape(1, -1), np.array([stamp], dtype=np.int64), [event]), []

    def _empty_why(self) -> str:
        names = ", ".join(self.field_names[:4]) + (", ..." if len(self.field_names) > 4 else "")
        return (
            f"none of the fields of model.features ({names}) has a value in the event (each absent or null)"
        )

    @staticmethod
    def _index(events: list, event) -> int:
        return next(i for i, e in enumerate(events) if e is event)

    def _screen(self, events, ids, ts, ts_raw, raw, single):
        """The events with a good id (unique in the message) and time: (events, ids, times, dead letters)."""
        good, good_ids, good_ts, dead, first = [], [], [], [], {}
        for i, e in enumerate(events):
            where = "" if single else f"event {i}: "
            letter = raw if single else _dumps(e)
            if type(e) is not dict:
                dead.append(
                    (BadInput("bad_schema", f"{where}the event is {json_type(e)}, not an object"), letter)
                )
                continue
            row_id, reason, why = self._check_id(ids[i])
            if reason is None:
                stamp, why = (
                    check_ts(None if ts_raw is None else ts_raw[i]) if ts is None else (int(ts[i]), "")
                )
                if stamp is None:
                    reason, why = "bad_schema", f"field {self.events.time_field!r}: {why}"
            if reason is None and row_id in first:
                reason, why = "duplicate_id", f"duplicate id {short(row_id)} (first at event {first[row_id]})"
            if reason is not None:
                dead.append((BadInput(reason, where + why), letter))
                continue
            first[row_id] = i
            good.append(e)
            good_ids.append(row_id)
            good_ts.append(stamp)
        return good, good_ids, np.array(good_ts, dtype=np.int64), dead

    # ------------------------------------------------------------ labels
    def labels(self, value: bytes | None, key=None) -> tuple[LabelRows | None, list[tuple[BadInput, bytes]]]:
        """The message's labels (class indices or regression values; None when none is good) and its dead
        letters."""
        events, raw, dead = self._parse(value, key)
        if events is None:
            return None, dead
        ids = self._ids(events, key)
        target = self.target
        if len(self._label_path) == 1:
            name = self._label_path[0]
            ys = [e.get(name, _MISSING_KEY) if type(e) is dict else _MISSING_KEY for e in events]
        else:
            ys = [self._label(e) for e in events]
        types = set(map(type, ys))  # a label missing is an object(); a bool is a class only of false/true
        bool_classes = target.task == "classification" and isinstance(target.classes[0], bool)
        if fast_ids(ids) and not types & {object, list, dict} and (bool_classes or bool not in types):
            Y = fast_labels(ys, target)
            if Y is not None:
                return LabelRows(ids, Y), dead
        single = len(events) == 1
        good_ids, good_y, first = [], [], {}
        for i, e in enumerate(events):
            where = "" if single else f"event {i}: "
            letter = raw if single else _dumps(e)
            if type(e) is not dict:
                dead.append(
                    (BadInput("bad_schema", f"{where}the event is {json_type(e)}, not an object"), letter)
                )
                continue
            row_id, reason, why = self._check_id(ids[i])
            if reason is None:
                if ys[i] is _MISSING_KEY or ys[i] is None:
                    reason, why = (
                        "bad_label",
                        f"field {self.events.label_field!r} (the label) is missing or null",
                    )
                else:
                    y, reason, why = check_label(ys[i], target)
                    why = f"field {self.events.label_field!r}: {why}" if reason is not None else why
            if reason is None and row_id in first:
                reason, why = "duplicate_id", f"duplicate id {short(row_id)} (first at event {first[row_id]})"
            if reason is not None:
                dead.append((BadInput(reason, where + why), letter))
                continue
            first[row_id] = i
            good_ids.append(row_id)
            good_y.append(y)
        if not good_ids:
            return None, dead
        return LabelRows(good_ids, labels_array(good_y, target)), dead

    def forget(self, value: bytes | None, key=None) -> tuple[list[str] | None, list[tuple[BadInput, bytes]]]:
        """A forget request's ids (docs/design.md §13), found where this format finds a row's id: with
        ``events.id_from_key`` the message key (the value may be anything, even empty); else the event's
        ``events.id_field``, of one event or each of an array (the other fields are not read: a row is taken
        out from what the worker kept of it), or an array of ids under ``"ids"``."""
        if self.events.id_from_key:
            row_id, reason, why = self._check_id(self._ids([None], key)[0])
            raw = value if type(value) is bytes else bytes(value or b"")
            return ([row_id], []) if reason is None else (None, _one(reason, why, raw))
        events, raw, dead = self._parse(value, key)
        if events is None:
            return None, dead
        if (
            len(events) == 1
            and type(events[0]) is dict
            and "ids" in events[0]
            and self.events.id_field != "ids"
        ):
            if self._get(events[0], self._id_path) is not None:
                return None, _one("bad_schema", f"both {self.events.id_field!r} and 'ids' given", raw)
            return forget_ids(events[0]["ids"], raw, "ids", self.events.id_field)
        ids = [self._get(e, self._id_path) if type(e) is dict else None for e in events]
        return forget_ids(ids, raw, self.events.id_field, self.events.id_field)

    def _label(self, event):
        if type(event) is not dict:
            return _MISSING_KEY
        try:
            value = resolve(event, self._label_path)
        except Refused:
            return _MISSING_KEY
        return _MISSING_KEY if value is MISSING else value

    # ------------------------------------------------------------ predictions
    def passthrough(self, events: list) -> list[bytes] | None:
        """Per event, its ``events.passthrough`` fields as a JSON fragment for its prediction (null where
        absent); None when none is configured."""
        if not self._passthrough:
            return None
        names = [name for name, _ in self._passthrough]
        columns = [self._column(events, path) for _, path in self._passthrough]
        return [orjson.dumps(dict(zip(names, values)))[1:-1] for values in zip(*columns)]

    def uncount(self, events: list) -> None:
        """Take back the counts of events refused after decoding (duplicates the arrival screen refused,
        ``stream.screen``), given as the events ``features`` decoded them from (``FeatureRows.events``)."""
        out = self.encoder.encode([e for e in events if type(e) is dict])
        self.missing -= out.missing
        self.undeclared -= out.undeclared

    def counts(self) -> dict[str, dict[str, int]]:
        """{"missing": {field: n}, "undeclared": {field: n}} of the events decoded so far (fields with n > 0)."""
        return {
            kind: {n: int(c) for n, c in zip(self.field_names, arr.tolist()) if c}
            for kind, arr in (("missing", self.missing), ("undeclared", self.undeclared))
        }

    def reset_counts(self) -> None:
        """Counts from 0 (a seed's rows, which never came through Kafka, are not the stream's)."""
        self.missing[:] = 0
        self.undeclared[:] = 0

    def load_counts(self, counts: dict) -> None:
        """Back from ``counts`` (a snapshot's)."""
        for kind, arr in (("missing", self.missing), ("undeclared", self.undeclared)):
            for name, n in (counts or {}).get(kind, {}).items():
                if name in self.field_names:
                    arr[self.field_names.index(name)] = int(n)
