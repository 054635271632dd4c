"""Records (events as dicts) -> the model's raw input rows, by the feature schema (``core.schema``;
docs/design.md §11). One encoding for the worker, the tools, the estimators and a loaded snapshot.

The raw row holds a number as it came (NaN when missing: the scaler maps it to the warm-up mean), one-hot,
boolean and indicator columns as 0/1. A record the schema cannot encode is refused with a reason and a
detail naming the field:

- ``bad_field``: a field of the wrong type (text for a number, an object for a category, a path through
  something that is not an object), or not a finite number (±inf: from the Python API, JSON has none);
- ``missing_field``: a ``required`` field absent, null or NaN;
- ``bad_schema``: the record is not an object.

Unknown extra fields are ignored. Values are checked by one reference rule per type (``_number``,
``_boolean``, ``_category``); ``encode`` takes a field's whole column at once where the column is clean
(the common case: a few list comprehensions and one numpy conversion per field), and the reference rule
value by value where it is not, so both give the same rows.

    >>> from iolstream.core.schema import FeatureSchema
    >>> enc = RecordEncoder(FeatureSchema.parse([
    ...     {"name": "amount", "type": "number"},
    ...     {"name": "country", "type": "category", "values": ["FR", "DE"]},
    ... ]))
    >>> out = enc.encode([{"amount": 2.5, "country": "DE"}, {"country": "US"}, {"amount": "3"}])
    >>> out.X.tolist()
    [[2.5, 0.0, 0.0, 1.0, 0.0, 0.0], [nan, 1.0, 0.0, 0.0, 1.0, 0.0]]
    >>> out.refused, out.missing.tolist(), out.undeclared.tolist()
    ([(2, 'bad_field', "field 'amount' is a string, not a number")], [1, 0], [0, 1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter

import numpy as np

from iolstream.core.schema import FeatureSchema, FieldSpec, bucket_of, category_key

BAD_FIELD = "bad_field"
MISSING_FIELD = "missing_field"
BUCKET_CACHE = 1 << 16  # remembered buckets per hashed field (cleared when full)
# below this many top-level number fields the block is read as one list per field, from this many as one flat
# list of every record's values (per field, a pass over the records costs more than it saves once they are many)
BLOCK_COLUMNS_BELOW = 8
MISSING = object()  # what ``resolve`` returns for a value absent or null on the way
_NO_OBJECT = object()  # a path through something that is not an object (fast columns)
_NUMBER_TYPES = frozenset((int, float, type(None)))
_TEXT_TYPES = frozenset((str, type(None)))
_BOOL_TYPES = frozenset((bool, type(None)))
_TRUE_TEXT = {"true": 1.0, "false": 0.0}


class Refused(Exception):
    """A record (or one value of it) the schema cannot encode: reason and detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


@dataclass
class Encoded:
    """What ``RecordEncoder.encode`` makes of a list of records.

    X          : ndarray of shape (r, width), float64 — the rows of the records kept, in order
    kept       : the indices of those records (r of them)
    refused    : (index, reason, detail) of every record refused, in order
    missing    : ndarray of shape (n_fields,), int64 — per field, the kept rows where it was missing
    undeclared : ndarray of shape (n_fields,), int64 — per field, the kept rows with a value not declared
    empty      : ndarray of shape (r,), bool — the kept rows where every field was missing
    """

    X: np.ndarray
    kept: list[int]
    refused: list[tuple[int, str, str]]
    missing: np.ndarray
    undeclared: np.ndarray
    empty: np.ndarray


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return "a boolean"
    if isinstance(v, (int, float, np.number)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple)):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return f"a {type(v).__name__}"


def resolve(record, path: tuple[str, ...]):
    """The value at ``path`` in ``record``, or MISSING (absent or null on the way); Refused(bad_field)
    when the path goes through something that is not an object."""
    node = record
    for depth, part in enumerate(path):
        if node is None:
            return MISSING
        if type(node) is not dict:
            where = ".".join(path[:depth])
            raise Refused(
                BAD_FIELD, f"field {'.'.join(path)!r}: {where!r} is {_json_type(node)}, not an object"
            )
        node = node.get(part)
    return MISSING if node is None else node


# ---------------------------------------------------------------- the reference rules, one value each


def _number(f: FieldSpec, v) -> float:
    """The raw value of a number field (NaN: missing)."""
    if v is MISSING:
        return math.nan
    t = type(v)
    if t is not int and t is not float:
        if isinstance(v, np.generic) and not isinstance(v, np.bool_):
            return _number(f, v.item())
        raise Refused(BAD_FIELD, f"field {f.name!r} is {_json_type(v)}, not a number")
    try:
        x = float(v)
    except OverflowError:  # an integer beyond a double
        x = math.inf
    if math.isinf(x):
        raise Refused(BAD_FIELD, f"field {f.name!r} is {x}, not a finite number")
    return x  # NaN (Python callers): missing


def _boolean(f: FieldSpec, v) -> float:
    """1.0 / 0.0, or NaN when missing. true/false, 1/0 and the texts "true"/"false" (any case)."""
    if v is MISSING:
        return math.nan
    t = type(v)
    if t is bool:
        return 1.0 if v else 0.0
    if isinstance(v, np.generic):
        return _boolean(f, v.item())
    if (t is int or t is float) and v in (0, 1):
        return float(v)
    if t is float and v != v:
        return math.nan
    if t is str and v.lower() in _TRUE_TEXT:
        return _TRUE_TEXT[v.lower()]
    raise Refused(BAD_FIELD, f"field {f.name!r} is {_json_type(v)} {_short(v)}, not a boolean")


def _category(f: FieldSpec, v) -> str | None:
    """The value as text (``category_key``), None when missing."""
    if v is MISSING:
        return None
    try:
        return category_key(v)
    except TypeError:
        raise Refused(BAD_FIELD, f"field {f.name!r} is {_json_type(v)}, not a category value") from None


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- the compiled plan


class _Buckets(dict):
    """Category text -> slot of a hashed field, remembered (bounded); None -> the missing slot."""

    def __init__(self, n: int, missing_slot: int | None):
        super().__init__()
        self.n, self.missing_slot = n, missing_slot
        self[None] = missing_slot

    def __missing__(self, key):
        if len(self) >= BUCKET_CACHE:
            self.clear()
            self[None] = self.missing_slot
        slot = self[key] = bucket_of(key, self.n)
        return slot


class _Field:
    """One field of the plan: its spec, first column, and for categories the slot lookups."""

    def __init__(self, spec: FieldSpec, at: int):
        self.spec, self.at, self.path = spec, at, spec.path
        self.key = spec.path[0] if len(spec.path) == 1 else None
        self.required = spec.required
        self.indicator = spec.has_missing_slot  # number / boolean: a missing column follows the value
        if spec.type == "category":
            slots = len(spec.values) + 1 if spec.values is not None else spec.buckets
            self.other = len(spec.values) if spec.values is not None else None
            self.missing_slot = None if spec.required else slots
            if spec.values is not None:
                self.lookup = {v: i for i, v in enumerate(spec.values)}
                if not spec.required:
                    self.lookup[None] = self.missing_slot
            else:
                self.lookup = _Buckets(spec.buckets, self.missing_slot)

    def slot(self, key: str | None) -> int:
        """The one-hot slot of a category text (None: missing, required fields refuse it first)."""
        if self.spec.values is None:
            return self.lookup[key]
        return self.lookup.get(key, self.other)


class RecordEncoder:
    """The schema compiled once: field paths split, column offsets and category lookups ready."""

    def __init__(self, schema: FeatureSchema):
        self.schema = FeatureSchema.parse(schema)
        self.width = self.schema.width
        self.fields = [_Field(f, at) for f, at in zip(self.schema.fields, self.schema.offsets())]
        self.names = [f.name for f in self.schema.fields]
        # the top-level number fields, read together when every record has them (``_number_block``)
        self._block = [
            (j, f) for j, f in enumerate(self.fields) if f.spec.type == "number" and f.key is not None
        ]
        self._block_getters = [itemgetter(f.key) for _, f in self._block]
        self._block_getter = itemgetter(*(f.key for _, f in self._block)) if len(self._block) > 1 else None

    # ------------------------------------------------------------ one record (the reference)
    def encode_one(self, record) -> tuple[np.ndarray, list[int], list[int]]:
        """(row of width, indices of the fields missing, indices of the categories not declared); raises
        Refused."""
        if type(record) is not dict:
            if isinstance(record, dict):
                record = dict(record)
            else:
                raise Refused("bad_schema", f"the event is {_json_type(record)}, not an object")
        row = [0.0] * self.width
        missing, undeclared = [], []
        for j, fld in enumerate(self.fields):
            if fld.key is not None:
                v = record.get(fld.key)
                v = MISSING if v is None else v
            else:
                v = resolve(record, fld.path)
            kind, at = fld.spec.type, fld.at
            if kind == "number":
                t = type(v)
                if (t is float or t is int) and v - v == 0:  # the common case: a finite number
                    row[at] = v
                    continue
            elif kind == "category" and type(v) is str and fld.spec.values is not None:
                slot = fld.lookup.get(v, fld.other)
                if slot == fld.other:
                    undeclared.append(j)
                row[at + slot] = 1.0
                continue
            if v is MISSING and fld.required:
                raise Refused(MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null")
            if kind == "category":
                key = _category(fld.spec, v)
                if key is None:
                    if fld.required:
                        raise Refused(
                            MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null"
                        )
                    missing.append(j)
                slot = fld.slot(key)
                if key is not None and slot == fld.other:
                    undeclared.append(j)
                row[at + slot] = 1.0
                continue
            x = _number(fld.spec, v) if kind == "number" else _boolean(fld.spec, v)
            if x != x:
                if fld.required:
                    raise Refused(MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null")
                missing.append(j)
                row[at] = x if kind == "number" else 0.0
                if fld.indicator:
                    row[at + 1] = 1.0
            else:
                row[at] = x
        return np.array(row), missing, undeclared

    # ------------------------------------------------------------ many records
    def encode(self, records, *, no_bools: bool = False) -> Encoded:
        """Every record of ``records`` (a list of dicts) encoded or refused (class docstring of Encoded).
        ``no_bools``: the caller knows that no value is a boolean (JSON without a true or false token), which
        lets numbers skip a type check."""
        records = records if isinstance(records, list) else list(records)
        b = len(records)
        n_fields = len(self.fields)
        if b == 1 or set(map(type, records)) != {dict}:
            return self._one_by_one(records)
        X = np.zeros((b, self.width))
        problems: dict[int, tuple[str, str]] = {}
        missing = np.zeros((n_fields, b), dtype=bool)
        undeclared = np.zeros((n_fields, b), dtype=bool)
        rows = np.arange(b)
        done = self._number_block(records, X, missing, problems, no_bools)
        for j, fld in enumerate(self.fields):
            if j in done:
                continue
            col = self._column(records, fld)
            kind, at = fld.spec.type, fld.at
            types = set(map(type, col))
            if kind == "number":
                values = None
                if types <= _NUMBER_TYPES:
                    try:
                        values = np.array(col, dtype=np.float64)
                    except OverflowError:  # an integer beyond a double: the reference rule says which
                        values = None
                if values is None or np.isinf(values).any():
                    values = self._slow_values(records, fld, _number, problems)
                miss = np.isnan(values)
                X[:, at] = values
            elif kind == "boolean":
                if types <= _BOOL_TYPES:
                    miss = np.fromiter((v is None for v in col), dtype=bool, count=b)
                    values = np.fromiter((v is True for v in col), dtype=np.float64, count=b)
                else:
                    values = self._slow_values(records, fld, _boolean, problems)
                    miss = np.isnan(values)
                    values[miss] = 0.0
                X[:, at] = values
            else:
                if types <= _TEXT_TYPES and not (fld.required and type(None) in types):
                    slots = (
                        np.fromiter(map(fld.lookup.__getitem__, col), dtype=np.int64, count=b)
                        if (fld.spec.values is None)
                        else np.fromiter(
                            map(fld.lookup.get, col, repeat(fld.other, b)), dtype=np.int64, count=b
                        )
                    )
                else:
                    slots = self._slow_slots(records, fld, problems)
                miss = slots == fld.missing_slot if fld.missing_slot is not None else np.zeros(b, dtype=bool)
                if fld.other is not None:
                    undeclared[j] = slots == fld.other
                ok = slots >= 0
                X[rows[ok], at + slots[ok]] = 1.0
            if kind != "category":
                if fld.required and miss.any():
                    for i in np.flatnonzero(miss).tolist():
                        problems.setdefault(
                            i, (MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null")
                        )
                elif fld.indicator:
                    X[:, at + 1] = miss
            missing[j] = miss
        if not problems:
            return Encoded(
                X, list(range(b)), [], missing.sum(axis=1), undeclared.sum(axis=1), missing.all(axis=0)
            )
        kept = [i for i in range(b) if i not in problems]
        refused = [(i, *problems[i]) for i in sorted(problems)]
        missing, undeclared = missing[:, kept], undeclared[:, kept]
        return Encoded(
            X[kept], kept, refused, missing.sum(axis=1), undeclared.sum(axis=1), missing.all(axis=0)
        )

    def _number_block(
        self, records: list[dict], X: np.ndarray, missing: np.ndarray, problems: dict, no_bools: bool
    ) -> set[int]:
        """The number fields at the top level of the records, all at once when every record has each of them as a
        number or null: the values read in C loops (one list per field, or with many fields one flat list, no
        tuple per record: ``BLOCK_COLUMNS_BELOW``), one conversion of them all and one type check (NumPy's, when
        the message holds no boolean): the indices of the fields done, or none (then each goes its own way, by
        the reference rule where a value is not a number)."""
        block = self._block
        if len(block) < 2:
            return set()
        flat = len(block) >= BLOCK_COLUMNS_BELOW
        try:
            if flat:
                values = list(chain.from_iterable(map(self._block_getter, records)))
            else:
                values = [list(map(getter, records)) for getter in self._block_getters]
        except KeyError:  # a field absent from some record: field by field
            return set()
        arr = None
        if no_bools:  # numbers only: an int or float block (a text: 'U', a null or a huge int: 'O')
            try:
                arr = np.array(values)
            except ValueError:  # an array or object among the values (no block shape): field by field
                return set()
            if arr.dtype.kind not in "fiu" or arr.ndim != (1 if flat else 2):
                arr = None
        if arr is None:
            if not set(map(type, values if flat else chain.from_iterable(values))) <= _NUMBER_TYPES:
                return set()
            try:
                arr = np.array(values, dtype=np.float64)
            except OverflowError:
                return set()
        arr = arr.astype(np.float64, copy=False)
        if flat:
            arr = arr.reshape(len(records), len(block)).T  # (fields, records), as the lists per field
        if np.isinf(arr).any():
            return set()
        miss = np.isnan(arr)
        for c, (j, fld) in enumerate(block):
            X[:, fld.at] = arr[c]
            missing[j] = miss[c]
            if fld.required and miss[c].any():
                for i in np.flatnonzero(miss[c]).tolist():
                    problems.setdefault(
                        i, (MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null")
                    )
            elif fld.indicator:
                X[:, fld.at + 1] = miss[c]
        return {j for j, _ in block}

    def _column(self, records: list[dict], fld: _Field) -> list:
        """The field's values, one per record: None where missing, _NO_OBJECT where the path is broken."""
        if fld.key is not None:
            key = fld.key
            return [r.get(key) for r in records]
        col = records
        for part in fld.path:
            col = [d.get(part) if type(d) is dict else (None if d is None else _NO_OBJECT) for d in col]
        return col

    def _slow_values(self, records, fld: _Field, rule, problems) -> np.ndarray:
        """A number or boolean column by the reference rule, value by value (refusals into ``problems``)."""
        out = np.empty(len(records))
        for i, r in enumerate(records):
            try:
                out[i] = rule(fld.spec, resolve(r, fld.path))
            except Refused as exc:
                problems.setdefault(i, (exc.reason, exc.detail))
                out[i] = 0.0
        return out

    def _slow_slots(self, records, fld: _Field, problems) -> np.ndarray:
        """A category column's slots by the reference rule (-1 where refused)."""
        out = np.empty(len(records), dtype=np.int64)
        for i, r in enumerate(records):
            try:
                key = _category(fld.spec, resolve(r, fld.path))
                if key is None and fld.required:
                    raise Refused(MISSING_FIELD, f"field {fld.spec.name!r} is required, but missing or null")
                out[i] = fld.slot(key)
            except Refused as exc:
                problems.setdefault(i, (exc.reason, exc.detail))
                out[i] = -1
        return out

    def _one_by_one(self, records: list) -> Encoded:
        n_fields = len(self.fields)
        rows, kept, refused, empty = [], [], [], []
        missing, undeclared = np.zeros(n_fields, dtype=np.int64), np.zeros(n_fields, dtype=np.int64)
        for i, r in enumerate(records):
            try:
                row, miss, undecl = self.encode_one(r)
            except Refused as exc:
                refused.append((i, exc.reason, exc.detail))
                continue
            rows.append(row)
            kept.append(i)
            missing[miss] += 1
            undeclared[undecl] += 1
            empty.append(len(miss) == n_fields)
        X = np.array(rows) if rows else np.empty((0, self.width))
        return Encoded(X, kept, refused, missing, undeclared, np.array(empty, dtype=bool))
