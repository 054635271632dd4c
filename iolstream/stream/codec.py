"""Input messages -> validated arrays (``rows``), and dead letters for what is refused (docs/design.md §5).
No I/O, no Kafka types; the way out (predictions, one-row messages) is ``encoding``.

A message carries one row or a batch::

    features  {"id": "a1", "x": [0.1, 2.0], "ts": 123}            ("ts" optional)
              {"ids": ["a1", "a2"], "x": [[...], [...]], "ts": [123, 124]}   ("ts": a list or one int)
    labels    {"id": "a1", "y": 3}
              {"ids": ["a1", "a2"], "y": [3, 0]}
    forget    {"id": "a1"}  {"ids": ["a1", "a2"]}       (x and y may ride along: not read)

Nothing is silently dropped. ``decode_features`` / ``decode_labels`` return the
good rows and a list of ``(BadInput, bytes)`` dead letters:

- a problem with the whole message (empty, oversize, not JSON, not an object,
  ``ids`` and ``x`` of different lengths, ``x`` not a list of lists, empty
  batch) -> one dead letter carrying the raw bytes;
- a problem with one row of a batch (wrong feature count, null or a
  non-number in x, missing/invalid id, unknown class, bad label, an id
  repeated within the message) -> only that row is rejected; its dead letter
  is the row re-encoded as a one-row message (``{"id":..,"x":..}`` /
  ``{"id":..,"y":..}``, plus the row's "ts" if it had one), which decodes on
  its own to the same problem. ``detail`` names the row index in the batch.

Decisions worth knowing:

- ``null`` in x (or in a regression y) is ``non_finite``: orjson and
  JavaScript serialise NaN/Infinity as null. A ``NaN``/``Infinity`` token is
  not JSON, and a literal that overflows a double (``1e400``) is refused by
  orjson, so both make the whole message ``malformed_json``.
- Booleans, strings, lists and objects in x are ``bad_schema`` (a type error).
- Ids: non-empty strings of at most ``MAX_ID_CHARS`` characters without NUL
  (numpy unicode arrays in snapshots drop trailing NULs); ints (not bools)
  become ``str(id)``. Missing, null or "" -> ``missing_id``; another type or
  a too long id -> ``bad_schema``.
- "ts" (event time, ms): int or finite float >= 0 (truncated to int), null or
  absent -> -1. Anything else -> ``bad_schema`` (row-level in a ts list).
- Classification y: the declared class itself; int classes also accept
  integral floats (3.0) and numeric strings ("3", via ``int()``); string
  classes accept only those exact strings; false/true classes accept a
  JSON boolean and the texts "true"/"false" (any case). A scalar that is
  not a class -> ``unknown_class`` (a non-finite float -> ``non_finite``);
  a bool (but for false/true classes), null, list or object -> ``bad_label``.
- Regression y: a number (m = 1; ``[v]`` is accepted too) or a list of m
  numbers; wrong shape/type -> ``bad_label``, null -> ``non_finite``.
- An id repeated within one message (features or labels): the later row is
  ``duplicate_id``. Across messages, repeated labels are the join buffer's
  business (counted and applied once, not dead-lettered).

Batch messages take a vectorised path (one ``np.array`` of the whole x) and
fall back to the per-row reference checks only when something is off, so the
overhead over ``orjson.loads`` stays about one numpy conversion.

    >>> rows, bad = decode_features(b'{"ids": ["a", "b"], "x": [[1, 2], [3]]}', 2, max_bytes=1000)
    >>> rows.ids, rows.X.tolist(), rows.ts.tolist()
    (['a'], [[1.0, 2.0]], [-1])
    >>> [(b.reason, b.detail, raw) for b, raw in bad]
    [('wrong_feature_count', 'row 1: expected 2 features, got 1', b'{"id":"b","x":[3]}')]
    >>> target = TargetSpec.classification(("cat", "dog"))
    >>> labels, bad = decode_labels(b'{"id": "a", "y": "dog"}', target, max_bytes=1000)
    >>> labels.ids, labels.Y.tolist(), bad
    (['a'], [1], [])
"""

from __future__ import annotations

import math

import numpy as np
import orjson

from iolstream.stream.encoding import row_messages
from iolstream.stream.rows import REASONS, BadInput, FeatureRows, LabelRows, TargetSpec
from iolstream.stream.values import (
    MAX_ID_CHARS,
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

__all__ = [
    "MAX_ID_CHARS",
    "REASONS",
    "ArrayCodec",
    "decode_features",
    "decode_forget",
    "decode_labels",
    "forget_ids",
]

_NUMBER_TYPES = frozenset((int, float))  # exact types: bool is not a number here


# ---------------------------------------------------------------- helpers


def _whole(reason: str, detail: str, raw: bytes) -> list[tuple[BadInput, bytes]]:
    return [(BadInput(reason, detail), raw)]


def _parse(value: bytes | None, max_bytes: int):
    """(obj, raw, None) or (None, raw, dead letters) for the message-level checks (both "id" and "ids":
    bad_schema)."""
    raw = value if type(value) is bytes else bytes(value or b"")
    if not raw:
        return None, raw, _whole("malformed_json", "empty value (null or zero bytes)", raw)
    if len(raw) > max_bytes:
        return None, raw, _whole("oversize", f"value is {len(raw)} bytes, limit {max_bytes}", raw)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, raw, _whole("malformed_json", f"not valid JSON: {exc}", raw)
    if type(obj) is not dict:
        return None, raw, _whole("bad_schema", f"top level is {json_type(obj)}, not an object", raw)
    if "ids" in obj and "id" in obj:
        return None, raw, _whole("bad_schema", "both 'id' and 'ids' given", raw)
    return obj, raw, None


def _row_dead_letters(bad: list, ids: list, key: str, values: list, ts: list | None = None):
    """(BadInput, bytes) of each refused row of a batch, (index, BadInput) in ``bad``: the row as a one-row
    message (``encoding.row_messages``)."""
    if not bad:
        return []
    letters = row_messages([i for i, _ in bad], ids, key, values, ts)
    return [(why, letter) for (_, why), letter in zip(bad, letters)]


def _batch_columns(obj: dict, raw: bytes, key: str):
    """(ids, values, None) or (None, None, dead letters): a batch's "ids" and ``key`` arrays, of one non-zero
    length."""
    ids, values = obj["ids"], obj.get(key)
    if type(ids) is not list or type(values) is not list:
        which = "ids" if type(ids) is not list else key
        return (
            None,
            None,
            _whole("bad_schema", f"'{which}' is {json_type(obj.get(which))}, not an array", raw),
        )
    if len(ids) != len(values):
        return (
            None,
            None,
            _whole("bad_schema", f"'ids' has {len(ids)} entries but '{key}' has {len(values)}", raw),
        )
    if not ids:
        return None, None, _whole("bad_schema", "empty batch", raw)
    return ids, values, None


def _batch_ts(obj: dict, b: int, raw: bytes):
    """(ts_values, ts_raw_per_row, None) or (None, None, dead letters) for a batch's "ts"."""
    ts = obj.get("ts")
    if ts is None:
        return np.full(b, -1, dtype=np.int64), None, None
    if type(ts) is list:
        if len(ts) != b:
            return None, None, _whole("bad_schema", f"'ts' has {len(ts)} entries but 'x' has {b}", raw)
        arr = np.array(ts) if ts else np.empty(0, dtype=np.int64)
        if arr.dtype.kind in "iu" and arr.size and arr.min() >= 0 and arr.max() <= MAX_TS_MS:
            return arr.astype(np.int64), ts, None
        return None, ts, None  # per-row check by the caller
    value, why = check_ts(ts)
    if value is None:
        return None, None, _whole("bad_schema", why, raw)
    return np.full(b, value, dtype=np.int64), [ts] * b, None


# ---------------------------------------------------------------- features


def _check_x_row(row, k: int) -> tuple[str | None, str]:
    """(None, "") or (reason, why) — the reference rule for one feature row (a list)."""
    if len(row) != k:
        return "wrong_feature_count", f"expected {k} features, got {len(row)}"
    if _NUMBER_TYPES.issuperset(map(type, row)):  # the common case; orjson never yields nan/inf floats
        return None, ""
    for j, v in enumerate(row):
        t = type(v)
        if t is float:
            if not math.isfinite(v):  # unreachable from orjson, kept for completeness
                return "non_finite", f"x[{j}] is {v}"
        elif t is not int:
            if v is None:
                return "non_finite", f"x[{j}] is null"
            return "bad_schema", f"x[{j}] is {json_type(v)}, not a number"
    return None, ""


def decode_features(
    value: bytes | None, n_features: int, *, max_bytes: int
) -> tuple[FeatureRows | None, list[tuple[BadInput, bytes]]]:
    """Validated rows of ``n_features`` floats, or None when no row is good, plus the dead letters."""
    obj, raw, dead = _parse(value, max_bytes)
    if dead:
        return None, dead
    if "ids" in obj:
        return _decode_feature_batch(obj, raw, n_features)
    # one row: any problem rejects the raw message
    x = obj.get("x")
    if type(x) is not list:
        why = "'x' is missing" if x is None else f"'x' is {json_type(x)}, not an array"
        return None, _whole("bad_schema", why, raw)
    row_id, reason, why = check_id(obj.get("id"))
    if reason is None:
        reason, why = _check_x_row(x, n_features)
    if reason is None:
        ts, why = check_ts(obj.get("ts"))
        reason = "bad_schema" if ts is None else None
    if reason is not None:
        return None, _whole(reason, why, raw)
    X = np.array(x, dtype=np.float64).reshape(1, n_features)
    return FeatureRows([row_id], X, np.array([ts], dtype=np.int64)), []


def _decode_feature_batch(obj: dict, raw: bytes, k: int):
    ids, x, dead = _batch_columns(obj, raw, "x")
    if dead:
        return None, dead
    b = len(ids)
    if set(map(type, x)) != {list}:
        j = next(j for j, row in enumerate(x) if type(row) is not list)
        return None, _whole("bad_schema", f"x[{j}] is {json_type(x[j])}: 'x' must be an array of arrays", raw)
    ts_values, ts_raw, dead = _batch_ts(obj, b, raw)
    if dead:
        return None, dead

    # fast path: every id a unique valid string, x a clean (b, k) numeric block, ts fine
    if ts_values is not None and fast_ids(ids) and not may_hold_bool(raw):
        try:
            X = np.array(x)
        except ValueError:  # ragged
            X = None
        if X is not None and X.shape == (b, k) and X.dtype.kind in "fiu":
            X = np.ascontiguousarray(X, dtype=np.float64)
            if np.isfinite(X).all():
                return FeatureRows(ids, X, ts_values), []

    # reference path, row by row; the refused rows' dead letters made at the end, in one call
    good_ids, good_x, good_ts, bad, first_row = [], [], [], [], {}
    for i in range(b):
        row_ts = None if ts_raw is None else ts_raw[i]
        row_id, reason, why = check_id(ids[i])
        if reason is None:
            reason, why = _check_x_row(x[i], k)
        if reason is None:
            ts, why = check_ts(row_ts)
            reason = "bad_schema" if ts is None else None
        if reason is None and row_id in first_row:
            reason, why = "duplicate_id", f"duplicate id {short(row_id)} (first at row {first_row[row_id]})"
        if reason is not None:
            bad.append((i, BadInput(reason, f"row {i}: {why}")))
            continue
        first_row[row_id] = i
        good_ids.append(row_id)
        good_x.append(x[i])
        good_ts.append(ts)
    dead = _row_dead_letters(bad, ids, "x", x, ts_raw)
    if not good_ids:
        return None, dead
    X = np.array(good_x, dtype=np.float64).reshape(len(good_ids), k)
    return FeatureRows(good_ids, X, np.array(good_ts, dtype=np.int64)), dead


# ---------------------------------------------------------------- labels


def decode_labels(
    value: bytes | None, target: TargetSpec, *, max_bytes: int
) -> tuple[LabelRows | None, list[tuple[BadInput, bytes]]]:
    """Validated labels (class indices or regression values), or None, plus the dead letters."""
    obj, raw, dead = _parse(value, max_bytes)
    if dead:
        return None, dead
    if "ids" in obj:
        return _decode_label_batch(obj, raw, target)
    if "y" not in obj:
        return None, _whole("bad_schema", "'y' is missing", raw)
    row_id, reason, why = check_id(obj.get("id"))
    if reason is None:
        y, reason, why = check_label(obj["y"], target)
    if reason is not None:
        return None, _whole(reason, why, raw)
    return LabelRows([row_id], labels_array([y], target)), []


def _decode_label_batch(obj: dict, raw: bytes, target: TargetSpec):
    ids, y, dead = _batch_columns(obj, raw, "y")
    if dead:
        return None, dead
    b = len(ids)

    y_types = set(map(type, y))  # a flat y shows its bools here; a nested one needs the raw scan
    if fast_ids(ids) and bool not in y_types and (list not in y_types or not may_hold_bool(raw)):
        Y = fast_labels(y, target)
        if Y is not None:
            return LabelRows(ids, Y), []

    good_ids, good_y, bad, first_row = [], [], [], {}
    for i in range(b):
        row_id, reason, why = check_id(ids[i])
        if reason is None:
            value, reason, why = check_label(y[i], target)
        if reason is None and row_id in first_row:
            reason, why = "duplicate_id", f"duplicate id {short(row_id)} (first at row {first_row[row_id]})"
        if reason is not None:
            bad.append((i, BadInput(reason, f"row {i}: {why}")))
            continue
        first_row[row_id] = i
        good_ids.append(row_id)
        good_y.append(value)
    dead = _row_dead_letters(bad, ids, "y", y)
    if not good_ids:
        return None, dead
    return LabelRows(good_ids, labels_array(good_y, target)), dead


# ---------------------------------------------------------------- forget requests


def decode_forget(
    value: bytes | None, *, max_bytes: int
) -> tuple[list[str] | None, list[tuple[BadInput, bytes]]]:
    """The ids of a forget request (docs/design.md §13), or None when none is good, plus the dead letters. The
    shapes of the other topics: ``{"id": "a1"}`` or ``{"ids": ["a1", "a2"]}``; the row's "x" and "y" may ride
    along (the worker takes a row out from what it kept of it, never from what a request says it was)."""
    obj, raw, dead = _parse(value, max_bytes)
    if dead:
        return None, dead
    if "ids" not in obj:
        row_id, reason, why = check_id(obj.get("id"))
        return ([row_id], []) if reason is None else (None, _whole(reason, why, raw))
    return forget_ids(obj["ids"], raw, "ids")


def forget_ids(
    ids, raw: bytes, name: str, id_field: str = "id"
) -> tuple[list[str] | None, list[tuple[BadInput, bytes]]]:
    """The good ids of a request's array ``ids`` (its field ``name``) and a dead letter for each bad or repeated
    one: a request for that id alone, ``{id_field: id}``."""
    if type(ids) is not list:
        return None, _whole("bad_schema", f"{name!r} is {json_type(ids)}, not an array", raw)
    if not ids:
        return None, _whole("bad_schema", "empty batch", raw)
    good, dead, first = [], [], {}
    for i, v in enumerate(ids):
        row_id, reason, why = check_id(v)
        if reason is None and row_id in first:
            reason, why = "duplicate_id", f"duplicate id {short(row_id)} (first at row {first[row_id]})"
        if reason is not None:
            dead.append((BadInput(reason, f"row {i}: {why} (field {name!r})"), orjson.dumps({id_field: v})))
            continue
        first[row_id] = i
        good.append(row_id)
    return (good or None), dead


class ArrayCodec:
    """The array format of one model (``decode_features`` / ``decode_labels`` with its width, target and size
    limit), with the interface of the named-field format (``stream.events.EventCodec``): the processor holds
    one of the two. The message key plays no part here."""

    def __init__(self, n_features: int, target: TargetSpec, *, max_bytes: int):
        self.n_features, self.target, self.max_bytes = n_features, target, max_bytes

    def features(self, value: bytes | None, key=None):
        return decode_features(value, self.n_features, max_bytes=self.max_bytes)

    def labels(self, value: bytes | None, key=None):
        return decode_labels(value, self.target, max_bytes=self.max_bytes)

    def forget(self, value: bytes | None, key=None):
        """A forget request's ids (``decode_forget``)."""
        return decode_forget(value, max_bytes=self.max_bytes)
