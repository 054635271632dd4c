"""The rules for one value of an input message, shared by the array codec (``stream.codec``) and the
named-field events (``stream.events``): an id, an event time, a label (docs/design.md §5). Each rule
returns the value or the reason and why it is refused; no I/O, no Kafka types.

    >>> check_id(17), check_id(""), check_ts(None)
    (('17', None, ''), (None, 'missing_id', 'id is empty'), (-1, ''))
    >>> target = TargetSpec.classification((False, True))
    >>> check_label(True, target), check_label("False", target)[0], check_label(1, target)[1]
    ((1, None, ''), 0, 'bad_label')
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from iolstream.stream.rows import TargetSpec

MAX_ID_CHARS = 256  # ids are stored as fixed-width numpy unicode in snapshots: keep the width bounded
MAX_TS_MS = 2**62  # event times beyond this are not milliseconds
_BOOL_TEXT = {"true": True, "false": False}


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_id(v) -> tuple[str | None, str | None, str]:
    """(id, None, "") or (None, reason, why) — the reference rule for one id."""
    t = type(v)
    if t is str:
        if not v:
            return None, "missing_id", "id is empty"
        if len(v) > MAX_ID_CHARS:
            return None, "bad_schema", f"id is {len(v)} characters, limit {MAX_ID_CHARS}"
        if "\x00" in v:
            return None, "bad_schema", "id contains a NUL character"
        return v, None, ""
    if t is int:
        return str(v), None, ""
    if v is None:
        return None, "missing_id", "id is missing or null"
    if t is float:  # 18.0 would be "18.0", never the "18" of its label sent as 18: refused, not guessed
        why = f"id is a number with a decimal point ({short(v)}), not a string or an integer"
        return None, "bad_schema", why
    return None, "bad_schema", f"id is {json_type(v)}, not a string or an integer"


def check_ts(v) -> tuple[int | None, str]:
    """(ms, "") with -1 for absent, or (None, why)."""
    if v is None:
        return -1, ""
    t = type(v)
    if t is int and 0 <= v <= MAX_TS_MS:
        return v, ""
    if t is float and 0.0 <= v <= MAX_TS_MS:  # also rejects nan
        return int(v), ""
    return None, f"ts {short(v)} is not a time in ms (a number from 0 to 2^62; a fraction is dropped)"


def fast_ids(ids: list) -> bool:
    """True when every id is a valid str and ids are unique (the common case), cheaply."""
    if set(map(type, ids)) != {str}:
        return False
    unique = set(ids)
    if len(unique) != len(ids) or "" in unique:
        return False
    return max(map(len, ids)) <= MAX_ID_CHARS and "\x00" not in "".join(ids)


def class_lookup(classes: tuple) -> dict:
    """Class value -> index; int classes also answer to their decimal string (and, by hashing,
    to integral floats: 3.0 == 3), false/true classes to the texts "false"/"true". Bools must be screened
    out before a lookup of int classes (True == 1), and ints before one of bool classes."""
    # cached by the classes' type too: (False, True) == (0, 1), with the same hash, but not the same lookup
    return _class_lookup(type(classes[0]), classes)


@lru_cache(maxsize=32)
def _class_lookup(kind: type, classes: tuple) -> dict:
    lookup = {c: i for i, c in enumerate(classes)}
    if isinstance(classes[0], bool):
        lookup.update({("true" if c else "false"): i for i, c in enumerate(classes)})
    elif isinstance(classes[0], int):
        lookup.update({str(c): i for i, c in enumerate(classes)})
    return lookup


def check_class(v, target: TargetSpec) -> tuple[int | None, str | None, str]:
    """(index, None, "") or (None, reason, why) — the reference rule for one class label. Classes false/true
    take a JSON boolean or the text "true"/"false" (any case)."""
    t = type(v)
    if isinstance(target.classes[0], bool):
        if t is bool:
            return class_lookup(target.classes)[v], None, ""
        if t is str and v.lower() in _BOOL_TEXT:
            return class_lookup(target.classes)[_BOOL_TEXT[v.lower()]], None, ""
        if t is str:
            return None, "unknown_class", f"y {short(v)} is not one of the declared classes (false, true)"
        return None, "bad_label", f"y is {json_type(v)}, not a class label (false or true)"
    if t is bool or v is None or t is list or t is dict:
        return None, "bad_label", f"y is {json_type(v)}, not a class label"
    lookup = class_lookup(target.classes)
    int_classes = isinstance(target.classes[0], int)
    key = v
    if t is float:
        if not math.isfinite(v):
            return None, "non_finite", f"y is {v}"
        key = v if int_classes else None
    elif t is int:
        key = v if int_classes else None
    elif t is str and int_classes and v not in lookup:
        try:
            key = int(v)
        except ValueError:
            key = None
    index = lookup.get(key) if key is not None else None
    if index is None:
        return None, "unknown_class", f"y {short(v)} is not one of the declared classes"
    return index, None, ""


def check_regression(v, m: int) -> tuple[list | None, str | None, str]:
    """(list of m floats, None, "") or (None, reason, why) — the reference rule for one target."""
    values = v if type(v) is list else [v]
    if type(v) is not list and m != 1:
        return None, "bad_label", f"y is {json_type(v)}, expected an array of {m} numbers"
    if len(values) != m:
        return None, "bad_label", f"y has {len(values)} values, expected {m}"
    for j, u in enumerate(values):
        t = type(u)
        if u is None:
            return None, "non_finite", f"y[{j}] is null" if m > 1 else "y is null"
        if t is not int and t is not float:
            return None, "bad_label", f"y[{j}] is {json_type(u)}, not a number"
        if t is float and not math.isfinite(u):
            return None, "non_finite", f"y[{j}] is {u}"
    return [float(u) for u in values], None, ""


def check_label(v, target: TargetSpec):
    if target.task == "classification":
        return check_class(v, target)
    return check_regression(v, target.n_outputs)


def labels_array(values: list, target: TargetSpec) -> np.ndarray:
    if target.task == "classification":
        return np.array(values, dtype=np.int64).reshape(len(values))
    return np.array(values, dtype=np.float64).reshape(len(values), target.n_outputs)


def fast_labels(y: list, target: TargetSpec) -> np.ndarray | None:
    """The labels array when every y is clean (no bools: screened by the caller), else None."""
    if target.task == "classification":
        if isinstance(target.classes[0], bool) and not set(map(type, y)) <= {bool}:
            return None  # texts "true" / "false", or a label that is no boolean: the reference rule says
        try:
            index = list(map(class_lookup(target.classes).get, y))
        except TypeError:  # an unhashable y (list, object)
            return None
        if None in index:
            return None
        return np.array(index, dtype=np.int64)
    m = target.n_outputs
    try:
        Y = np.array(y)
    except ValueError:  # ragged
        return None
    if Y.dtype.kind not in "fiu":
        return None
    if Y.shape == (len(y),) and m == 1:
        Y = Y.reshape(-1, 1)
    if Y.shape != (len(y), m):
        return None
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    return Y if np.isfinite(Y).all() else None


def may_hold_bool(raw: bytes) -> bool:
    """False when ``raw`` surely holds no JSON ``true``/``false`` (numpy would read them as 1.0/0.0).

    Two memchr scans rule out most messages; otherwise the 'u' of "true" and the 'l' of
    "false" are located with numpy and their neighbours checked. A hit inside a string
    (an id "true-1") only sends the message to the exact per-row path.
    """
    if raw.find(b"u") < 0 and raw.find(b"l") < 0:
        return False
    a = np.frombuffer(raw, dtype=np.uint8)
    p = np.flatnonzero(a[2:-1] == ord("u")) + 2  # t r [u] e
    if p.size and ((a[p - 2] == ord("t")) & (a[p - 1] == ord("r")) & (a[p + 1] == ord("e"))).any():
        return True
    p = np.flatnonzero(a[2:-2] == ord("l")) + 2  # f a [l] s e
    if not p.size:
        return False
    f_a = (a[p - 2] == ord("f")) & (a[p - 1] == ord("a"))
    return bool((f_a & (a[p + 1] == ord("s")) & (a[p + 2] == ord("e"))).any())
