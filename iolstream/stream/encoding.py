"""Stored rows and labels -> one-row messages, predictions -> JSON (docs/design.md §5). No I/O, no Kafka types.

The one-row messages (``{"id":..,"x":..}`` / ``{"id":..,"y":..}``) are what a refused row or label
becomes as a dead letter: each decodes on its own (``codec.decode_features`` / ``decode_labels``)
to the same problem.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import orjson

from iolstream.stream.rows import FeatureRows, TargetSpec


def row_message(id_value, key: str, value, ts=None) -> bytes:
    """``{"id": id_value, key: value[, "ts": ts]}`` as JSON bytes."""
    msg = {"id": id_value, key: value}
    if ts is not None:
        msg["ts"] = ts
    # orjson (3.13) returns its ~4 KB working buffer as the bytes object's memory: a copy holds
    # only the message. Dead letters are held in bulk (100,000 early labels expiring at once: 410 MB)
    return bytes(memoryview(orjson.dumps(msg)))


def row_messages(index: list[int], ids: list, key: str, values: list, ts: list | None = None) -> list[bytes]:
    """``row_message`` of each row at ``index`` of a batch's columns (``ids``, ``values``, ``ts``: as they came;
    ``ts`` None: no row has one), in that order: the refused rows of a batch message as messages of their own."""
    return [row_message(ids[i], key, values[i], None if ts is None else ts[i]) for i in index]


def encode_label(label, target: TargetSpec):
    """The JSON-able y of one stored label: the class itself, a float (m = 1) or a list of floats."""
    if target.task == "classification":
        return target.classes[int(label)]
    values = np.asarray(label, dtype=np.float64).reshape(-1).tolist()
    return values[0] if len(values) == 1 else values


def label_message(row_id: str, label, target: TargetSpec) -> bytes:
    """A one-row label message ``{"id":..,"y":..}`` for a stored label (class index or values)."""
    return row_message(row_id, "y", encode_label(label, target))


def event_label_message(row_id: str, label, target: TargetSpec, events) -> bytes:
    """A one-row label event in the team's shape (``events``: an ``EventsConfig``) for a stored label:
    ``{label_field: the class or value, id_field: the id}`` (a dotted name nests; with ``id_from_key`` no id
    field: the id is the message key), so that it can be sent to the labels topic again as it is."""
    event: dict = {}
    fields = [(events.label_field, encode_label(label, target))]
    if not events.id_from_key:
        fields.append((events.id_field, row_id))
    for path, value in fields:
        node = event
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return bytes(memoryview(orjson.dumps(event)))


def forget_message(row_id: str) -> bytes:
    """A one-id forget request ``{"id":..}`` (the dead letter of one refused id of a request)."""
    return bytes(memoryview(orjson.dumps({"id": row_id})))


def receipt_message(receipt: dict) -> bytes:
    """A forget receipt as JSON (docs/design.md §13)."""
    return bytes(memoryview(orjson.dumps(receipt)))


def feature_message(row_id: str, x: np.ndarray, ts: int = -1) -> bytes:
    """A one-row feature message ``{"id":..,"x":..[,"ts":..]}`` for a stored row."""
    return row_message(row_id, "x", np.asarray(x, dtype=np.float64).tolist(), int(ts) if ts >= 0 else None)


def row_dead_letter(rows: FeatureRows, i: int) -> bytes:
    """Row ``i`` of ``rows`` as a one-row message: its event as it came (named fields), or ``feature_message``."""
    if rows.events is not None:
        return bytes(memoryview(orjson.dumps(rows.events[i])))
    return feature_message(rows.ids[i], rows.X[i], int(rows.ts[i]))


def row_dead_letters(rows: FeatureRows, index: list[int]) -> list[bytes]:
    """``row_dead_letter`` of each row at ``index``, in that order."""
    return [row_dead_letter(rows, i) for i in index]


def encode_predictions(
    ids: list[str],
    y_hat: np.ndarray,
    proba: np.ndarray | None,
    *,
    model_version: int,
    ts_in: np.ndarray | None,
    ts_out_ms: int,
    mode: str,
    classes: tuple | None,
    scores: np.ndarray | None = None,
    id_key: str = "id",
    extra: list[bytes] | None = None,
    interval: tuple | None = None,
) -> list[bytes]:
    """One JSON prediction per row (docs/design.md §5).

    y_hat   : classification (``classes`` given): (b,) int class indices, emitted as the class
              itself; regression: (b,) or (b, m) floats, emitted as a float when m = 1, else a list
    proba   : (b, m) class probabilities (classification) or None
    ts_in   : (b,) int64 event times, -1 where absent (then "event_ts" is left out), or None
    scores  : (b, m) the ensemble's raw outputs (``stream.emit_scores``), or None
    id_key  : the name of the id field (named-field events: the team's own, ``events.id_field``)
    extra   : per row, more fields as a JSON fragment without braces (``"country":"FR"``: the
              passthrough fields of named-field events), or None
    interval: regression: (y_lo, y_hi), each shaped as y_hat (``model.interval``), or None
    Fields: <id_key>, y_hat, [y_lo, y_hi], [proba], [scores], model_version, ts (= ts_out_ms), [event_ts], mode,
    [extra...].
    Non-finite floats are written as null (orjson's rule).

    The whole batch is serialised by a few orjson calls and split, then each row's message is
    one bytes template fill: bytes equal to one orjson.dumps of a dict per row (tests/naive.py), ~3× faster.

    >>> encode_predictions(["a"], np.array([1]), np.array([[0.25, 0.75]]), model_version=3,
    ...                    ts_in=np.array([-1]), ts_out_ms=99, mode="forward", classes=("no", "yes"))
    [b'{"id":"a","y_hat":"yes","proba":[0.25,0.75],"model_version":3,"ts":99,"mode":"forward"}']
    """
    b = len(ids)
    if b == 0:
        return []
    id_json = _split_json_list(orjson.dumps(ids), b)
    if id_json is None:  # an id with a comma in it: one call per id
        id_json = [orjson.dumps(i) for i in ids]
    key = orjson.dumps(id_key).replace(b"%", b"%%")
    head = b"{" + key + b':%b,"y_hat":%b'
    if classes is not None:
        class_json = _class_json(classes)
        y_json = [class_json[i] for i in np.asarray(y_hat).reshape(b).tolist()]
    else:
        values = np.asarray(y_hat, dtype=np.float64).reshape(b, -1)
        if values.shape[1] > 1:
            head = b"{" + key + b':%b,"y_hat":[%b]'
        y_json = _rows_json(values[:, 0] if values.shape[1] == 1 else values)
    parts = [id_json, y_json]
    if interval is not None and classes is None:  # each bound as y_hat is written: a number, or a list
        for name, bound in zip((b"y_lo", b"y_hi"), interval):
            bound = np.asarray(bound, dtype=np.float64).reshape(b, -1)
            head += b',"' + name + (b'":%b' if bound.shape[1] == 1 else b'":[%b]')
            parts.append(_rows_json(bound[:, 0] if bound.shape[1] == 1 else bound))
    for name, values in ((b"proba", proba), (b"scores", scores)):
        if values is not None:
            head += b',"' + name + b'":[%b]'
            parts.append(_rows_json(np.asarray(values, dtype=np.float64).reshape(b, -1)))
    head += b',"model_version":%d,"ts":%d' % (int(model_version), int(ts_out_ms))
    tail = b',"mode":%b}' % orjson.dumps(mode)
    if extra is not None:  # the passthrough fragments: the row's last field(s), one more %b per row
        tail = tail[:-1].replace(b"%", b"%%") + b",%b}"
        return _fill_extra(head, tail, parts, extra, ts_in, b)
    event = np.asarray(ts_in).reshape(b) if ts_in is not None else None
    if event is None or (event < 0).all():
        fill = head + tail.replace(b"%", b"%%")
        return [fill % row for row in zip(*parts)]
    with_event = head + b',"event_ts":%d' + tail.replace(b"%", b"%%")
    without = head + tail.replace(b"%", b"%%")
    events = event.tolist()
    # the fields named, not star-unpacked (``*row, e``): that built a list and a tuple per row, 40 % of the fill
    if len(parts) == 2:
        return [with_event % (i, y, e) if e >= 0 else without % (i, y) for i, y, e in zip(*parts, events)]
    if len(parts) == 3:
        return [
            with_event % (i, y, p, e) if e >= 0 else without % (i, y, p) for i, y, p, e in zip(*parts, events)
        ]
    return [with_event % (*row, e) if e >= 0 else without % row for row, e in zip(zip(*parts), events)]


def _fill_extra(head: bytes, tail: bytes, parts: list, extra: list[bytes], ts_in, b: int) -> list[bytes]:
    """``encode_predictions``' rows with a passthrough fragment each (``tail`` ends in its ``%b``)."""
    parts = [*parts, extra]
    event = np.asarray(ts_in).reshape(b).tolist() if ts_in is not None else [-1] * b
    with_event = head + b',"event_ts":%d' + tail
    without = head + tail
    return [
        with_event % (*row[:-1], e, row[-1]) if e >= 0 else without % row
        for row, e in zip(zip(*parts), event)
    ]


def _split_json_list(raw: bytes, b: int) -> list[bytes] | None:
    """The b elements of a JSON array of scalars, split at its commas (None if an element has one)."""
    items = raw[1:-1].split(b",")
    return items if len(items) == b else None


def _rows_json(values: np.ndarray) -> list[bytes]:
    """Each element of a (b,) float array as JSON, or each row of a (b, m) one without its brackets
    (the message template has them), from one orjson call."""
    raw = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
    if values.ndim == 1:
        return raw[1:-1].split(b",")
    return raw[2:-2].split(b"],[")


def _class_json(classes: tuple) -> list[bytes]:
    # cached by the classes' type too: (False, True) == (0, 1), with the same hash, but not the same JSON
    return _class_json_of(type(classes[0]), classes)


@lru_cache(maxsize=32)
def _class_json_of(kind: type, classes: tuple) -> list[bytes]:
    return [orjson.dumps(c) for c in classes]
