"""A feature schema inferred from example data (``iolstream schema infer``, ``evaluate --csv`` and ``seed
--csv`` on a table with text and gaps, the estimators fitted on a DataFrame or a list of dicts).

Per column, over the values present (missing: absent, null, NaN, a blank text, or one of ``NA_TEXTS``):

- none at all -> left out (nothing tells its type);
- only booleans, or the texts true/false (any case) -> ``boolean``;
- only numbers, or texts that read as numbers -> ``number`` (an infinite one is refused with its row later);
- anything else -> ``category``: its values, most frequent first, when there are at most ``max_values``
  distinct ones, else ``buckets`` hashed slots; but a text column whose every value is present and
  distinct (``MIN_ID_ROWS`` rows or more) is an identifier, not an input: it is left out (``id_like``).

A number column without a gap whose every value is distinct (``MIN_ID_ROWS`` rows or more) is left out too when
it counts rows: integers that are each of lo..hi once (a row number, in any order: pandas' ``Unnamed: 0``, R's
``rownames``), or values rising (or falling) from row to row (an auto-increment id, a clock; from
``MONOTONIC_SHARE`` of the rows to the next). Such a field says where a row sits in the stream, nothing about
it, and a stream takes it past the warm-up's range for ever after (a row number scaled on rows 1..256 has a
z-score of 93 at row 7,000). Integers left out so are identifiers too (``id_like``: ``schema infer`` names the
first as the events' id when the file has no ``id`` column); a clock of fractions is only left out.

A number or boolean column without a gap gets ``indicator: false`` (its missing-indicator column would be
constant); a value missing later becomes the warm-up mean, and is counted per field.

    >>> schema, notes = infer_schema({"amount": ["1.5", "", "3"], "country": ["FR", "DE", "FR"],
    ...                               "vip": [True, False, None]})
    >>> [f.to_config() for f in schema.fields]  # doctest: +NORMALIZE_WHITESPACE
    [{'name': 'amount', 'type': 'number'}, {'name': 'country', 'type': 'category', 'values': ['FR', 'DE']},
     {'name': 'vip', 'type': 'boolean'}]
    >>> notes["amount"]
    '1 of 3 missing'
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from iolstream.core.schema import FeatureSchema, FieldSpec, category_key

MAX_VALUES = 20  # declared category values, at most; more distinct values: hashed buckets
MIN_ID_ROWS = 20  # a text column all distinct over at least this many rows is an identifier
MONOTONIC_SHARE = 0.95  # distinct numbers rising from this share of the rows to the next count them
BUCKETS = 64
NA_TEXTS = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})  # compared stripped and lower-case
BOOL_TEXTS = {"true": True, "false": False}


def is_missing(value) -> bool:
    """Whether an example value means "missing": None, NaN, a blank text or an NA marker (``NA_TEXTS``)."""
    if value is None:
        return True
    if isinstance(value, (float, np.floating)):
        return math.isnan(value)
    if isinstance(value, str):
        return value.strip().lower() in NA_TEXTS
    return False


def as_number(value) -> float | None:
    """An example value as a finite number (a number, or a text that reads as one), else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        x = float(value)
        return x if math.isfinite(x) else None
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def as_boolean(value) -> bool | None:
    """An example value as a boolean (a boolean, or the text true/false in any case), else None."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        return BOOL_TEXTS.get(value.strip().lower())
    return None


def reads_as_number(value) -> bool:
    """Whether an example value is a number, finite or not, or a text that reads as one: its column is a number
    field (an infinite value is then refused by the encoder with its row, not taken for a category)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    try:
        float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return False
    return True


def infer_field(
    name: str, values, *, max_values: int = MAX_VALUES, buckets: int = BUCKETS, counters: bool = True
) -> tuple[FieldSpec | None, str]:
    """(the field, a note: how many values are missing and, for a category, how many distinct ones); the field
    is None for an identifier (every value a distinct text) and, with ``counters``, for numbers that count rows
    (``counts_rows``)."""
    present = [v for v in values if not is_missing(v)]
    n, gaps = len(values), len(values) - len(present)
    note = f"{gaps} of {n} missing" if gaps else "no gaps"
    if not present:
        return None, f"left out: every value missing ({n} rows)"
    if all(as_boolean(v) is not None for v in present):
        return FieldSpec(name, "boolean", indicator=bool(gaps)), note
    if all(reads_as_number(v) for v in present):
        numbers = [as_number(v) for v in present]
        if counters and not gaps and None not in numbers and (counter := counts_rows(numbers)) is not None:
            return None, f"left out: {counter} ({n} rows)"
        return FieldSpec(name, "number", indicator=bool(gaps)), note
    keys = Counter()
    for v in present:
        try:
            key = category_key(v.strip() if isinstance(v, str) else v)
        except TypeError:
            key = str(v)
        keys[key] += 1
    note += f", {len(keys)} distinct values"
    if not gaps and len(keys) == n >= MIN_ID_ROWS:
        return None, f"left out: every value distinct, an identifier ({n} rows)"
    if keys and len(keys) <= max_values:
        ordered = sorted(keys, key=lambda k: (-keys[k], k))
        return FieldSpec(name, "category", values=tuple(ordered)), note
    return FieldSpec(name, "category", buckets=buckets), note + f" (over {max_values}: hashed)"


def counts_rows(numbers: list[float]) -> str | None:
    """Why a column of numbers (no gap, in the table's order) counts rows rather than describing them, or None:
    ``MIN_ID_ROWS`` values or more, all distinct, and either the integers lo..hi once each or monotonic (rising,
    or falling, from at least ``MONOTONIC_SHARE`` of the rows to the next: a file of two runs of ids is one).
    The reason starts "an identifier" (integers) or "a clock" (fractions).

        >>> counts_rows([float(i) for i in range(5, 45)])
        'an identifier or a row number: 5..44, each once, rising'
        >>> counts_rows([float((7 * i) % 40) for i in range(40)])  # 0, 7, 14, ..., 33, 0 + 40k: a shuffle
        'an identifier or a row number: 0..39, each once, in no order'
        >>> counts_rows([float(i * i) for i in range(30, 60)] + [float(i * i) for i in range(30)])
        'an identifier or a counter: every value distinct, rising in 58 of 59 steps'
        >>> counts_rows([i * 0.5 for i in range(40)][::-1])
        'a clock: every value distinct, falling'
        >>> counts_rows([float(i % 25) for i in range(40)]), counts_rows([float(i) for i in range(19)])
        (None, None)
    """
    n = len(numbers)
    if n < MIN_ID_ROWS or len(set(numbers)) < n:
        return None
    steps = np.diff(np.asarray(numbers))
    order = None
    for name, count in (("rising", int((steps > 0).sum())), ("falling", int((steps < 0).sum()))):
        if count >= MONOTONIC_SHARE * (n - 1):
            order = name if count == n - 1 else f"{name} in {count} of {n - 1} steps"
    if all(x.is_integer() for x in numbers):
        lo, hi = int(min(numbers)), int(max(numbers))
        if hi - lo == n - 1:
            return f"an identifier or a row number: {lo}..{hi}, each once, {order or 'in no order'}"
        return f"an identifier or a counter: every value distinct, {order}" if order else None
    return f"a clock: every value distinct, {order}" if order else None


def infer_schema(
    columns: dict, *, max_values: int = MAX_VALUES, buckets: int = BUCKETS, counters: bool = True
) -> tuple[FeatureSchema, dict[str, str]]:
    """The schema of ``columns`` (name -> its values, in the table's order) and a note per column (those left
    out too: ``id_like``). ``counters``: leave out numbers that count rows (a stream's order is the file's); the
    estimators, which scale by the whole of X and learn in the order they are given, keep them."""
    fields, notes = [], {}
    for name, values in columns.items():
        spec, note = infer_field(
            str(name), list(values), max_values=max_values, buckets=buckets, counters=counters
        )
        notes[str(name)] = note
        if spec is not None:
            fields.append(spec)
    if not fields:
        raise ValueError(f"no column to learn from: {'; '.join(f'{n}: {v}' for n, v in notes.items())}")
    return FeatureSchema(tuple(fields)), notes


def id_like(notes: dict[str, str]) -> list[str]:
    """The columns ``infer_schema`` left out as identifiers: texts first, then integers (a clock is not one)."""
    texts = [name for name, note in notes.items() if note.startswith("left out: every value distinct")]
    numbers = [name for name, note in notes.items() if note.startswith("left out: an identifier")]
    return texts + numbers


def typed_value(spec: FieldSpec, value):
    """A table's cell as the event would carry it under ``spec``: None when missing, a number or boolean
    when it reads as one, a category's text stripped; anything else as it is (the encoder refuses it and
    names the field)."""
    if is_missing(value):
        return None
    if spec.type == "number":
        x = as_number(value)
        return value if x is None else x
    if spec.type == "boolean":
        b = as_boolean(value)
        return value if b is None else b
    return value.strip() if isinstance(value, str) else value


def typed_records(columns: dict, schema: FeatureSchema) -> list[dict]:
    """The rows of ``columns`` (name -> values; a table read as text) as records typed by ``schema``: what a
    team's events would hold (the columns the schema does not name are left out). A dotted field name
    becomes a nested object, as ``core.encoder`` reads it."""
    specs = [(f, list(columns[f.name])) for f in schema.fields if f.name in columns]
    n = len(specs[0][1]) if specs else 0
    out = []
    for i in range(n):
        record: dict = {}
        for spec, values in specs:
            value = typed_value(spec, values[i])
            if value is None:
                continue
            node = record
            *parents, leaf = spec.path
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        out.append(record)
    return out
