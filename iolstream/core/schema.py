"""The feature schema: which named fields of an event the model reads, and how each becomes columns of its
input row (docs/design.md §11). Part of the model (``ModelConfig.features``): a snapshot and the group's
model digest carry it, and ``core.encoder`` turns records into rows by it.

A field is a dotted path into the event (``device.os`` reaches ``{"device": {"os": ...}}``) with a type:

- ``number``: one column, z-scored by the model's scaler; a missing value (absent, null, NaN) becomes
  NaN in the raw row, which the scaler maps to the warm-up mean (z = 0), and a 0/1 missing indicator
  column follows (``indicator: false`` drops it); ``required: true`` refuses the row instead.
- ``category``: one-hot over the declared ``values``, then a slot for a value not declared and a slot
  for a missing one; or ``buckets: N`` hashed slots for an open set, then the missing slot. A category
  value is compared as text: ``3``, ``3.0`` and ``"3"`` are the same value, ``true`` is ``"true"``.
- ``boolean``: one 0/1 column and its missing indicator (a missing boolean is 0 with the indicator 1).

Only number value columns are z-scored (``scaled``); one-hot, boolean and indicator columns stay 0/1.

    >>> schema = FeatureSchema.parse([
    ...     {"name": "amount", "type": "number"},
    ...     {"name": "country", "type": "category", "values": ["FR", "DE"]},
    ...     {"name": "device.os", "type": "category", "buckets": 4, "required": True},
    ...     {"name": "coupon", "type": "boolean"},
    ... ])
    >>> schema.width, schema.columns()[:6]
    (12, ['amount', 'amount:missing', 'country=FR', 'country=DE', 'country:other', 'country:missing'])
    >>> schema.scaled.nonzero()[0].tolist()
    [0]
    >>> bucket_of("ios", 4)
    0
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields

import numpy as np

FIELD_TYPES = ("number", "category", "boolean")
MAX_BUCKETS = 1 << 20
MAX_VALUES = 10_000  # declared category values of one field
_KEYS = {  # the keys a field of each type may have (besides name and type)
    "number": {"required", "indicator", "mean", "std"},
    "category": {"required", "values", "buckets"},
    "boolean": {"required", "indicator"},
}


class SchemaError(ValueError):
    """A feature schema that cannot be used; the message names the field and the key."""


def category_key(value) -> str | None:
    """A category value as the text it is compared by: a string as it is, an integer (or an integral
    float) in decimal, a boolean as ``true``/``false``; None for a missing value (null, NaN). Raises
    TypeError for anything else (an object, an array).

    >>> [category_key(v) for v in ("FR", 3, 3.0, 2.5, True, None, float("nan"))]
    ['FR', '3', '3', '2.5', 'true', None, None]
    """
    t = type(value)
    if t is str:
        return value
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        if value != value:
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if value is None:
        return None
    if isinstance(value, np.generic):  # numpy scalars (a DataFrame's cells): as the Python value
        return category_key(value.item())
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"not a category value: {type(value).__name__}")


def bucket_of(key: str, n_buckets: int) -> int:
    """The bucket of a category value (its text, ``category_key``) among ``n_buckets``: BLAKE2b (8 bytes,
    little-endian) of its UTF-8 bytes modulo n_buckets, the same on every machine, process and Python
    version (Python's ``hash()`` of a string changes with every process)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n_buckets


@dataclass(frozen=True)
class FieldSpec:
    """One named input field: its dotted path, its type and how it is encoded (module docstring)."""

    name: str
    type: str
    required: bool = False
    indicator: bool = True  # number, boolean: a 0/1 missing-indicator column (unless required)
    values: tuple[str, ...] | None = None  # category: the declared values, as text (category_key)
    buckets: int | None = None  # category: hashed slots for an open set, instead of values
    mean: float | None = None  # number, with scaler "fixed": its mean and deviation
    std: float | None = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.name.split("."))

    @property
    def has_missing_slot(self) -> bool:
        """Whether a column (or slot) says this field was missing."""
        return not self.required and (self.type == "category" or self.indicator)

    @property
    def width(self) -> int:
        """The columns this field takes in the row."""
        if self.type == "category":
            slots = len(self.values) + 1 if self.values is not None else self.buckets
            return slots + (0 if self.required else 1)
        return 1 + (1 if self.has_missing_slot else 0)

    def columns(self) -> list[str]:
        """A name per column: ``amount``, ``amount:missing``, ``country=FR``, ``country:other``,
        ``merchant#3``, ``country:missing``."""
        n = self.name
        if self.type == "category":
            out = (
                [f"{n}={v}" for v in self.values] + [f"{n}:other"]
                if self.values is not None
                else [f"{n}#{i}" for i in range(self.buckets)]
            )
        else:
            out = [n]
        return out + ([f"{n}:missing"] if self.has_missing_slot else [])

    def to_config(self) -> dict:
        """The field as a config entry: name, type and the keys that differ from their defaults."""
        out = {"name": self.name, "type": self.type}
        for f in fields(self):
            if f.name in ("name", "type"):
                continue
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def parse(cls, raw, where: str) -> FieldSpec:
        """A field from its config entry (a mapping, or a FieldSpec); SchemaError naming ``where`` and the key."""
        if isinstance(raw, FieldSpec):
            raw = raw.to_config()
        if not isinstance(raw, dict):
            raise SchemaError(f"{where}: must be a mapping with name and type, got {raw!r}")
        name, kind = raw.get("name"), raw.get("type")
        if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
            raise SchemaError(
                f"{where}.name: must be a field name (a dotted path reaches a nested field), got {name!r}"
            )
        where = f"{where} ({name})"
        if kind not in FIELD_TYPES:
            raise SchemaError(f"{where}.type: must be one of {', '.join(FIELD_TYPES)}, got {kind!r}")
        unknown = sorted(set(raw) - {"name", "type"} - _KEYS[kind])
        if unknown:
            allowed = ", ".join(sorted(_KEYS[kind]))
            raise SchemaError(
                f"{where}.{unknown[0]}: not a key of a {kind} field; its keys: name, type, {allowed}"
            )
        values = {k: raw[k] for k in raw if k not in ("name", "type")}
        for key in ("required", "indicator"):
            if key in values and not isinstance(values[key], bool):
                raise SchemaError(f"{where}.{key}: must be true or false, got {values[key]!r}")
        if kind == "category":
            values.update(_category_slots(values.get("values"), values.get("buckets"), where))
        for key in ("mean", "std"):
            if key in values:
                v = values[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise SchemaError(f"{where}.{key}: must be a finite number, got {v!r}")
                if key == "std" and v <= 0:
                    raise SchemaError(f"{where}.std: must be > 0, got {v!r}")
                values[key] = float(v)
        return cls(name=name, type=kind, **values)


def _category_slots(values, buckets, where: str) -> dict:
    """A category's ``values`` (as text, distinct) or ``buckets`` (1..MAX_BUCKETS): exactly one of them."""
    if (values is None) == (buckets is None):
        raise SchemaError(f"{where}: a category field needs either values: [...] or buckets: N")
    if buckets is not None:
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= MAX_BUCKETS:
            raise SchemaError(f"{where}.buckets: must be an integer from 1 to {MAX_BUCKETS}, got {buckets!r}")
        return {"buckets": buckets}
    if not isinstance(values, (list, tuple)) or not values or len(values) > MAX_VALUES:
        raise SchemaError(f"{where}.values: must be a list of 1 to {MAX_VALUES} values, got {values!r}")
    keys = []
    for v in values:
        try:
            key = category_key(v)
        except TypeError:
            key = None
        if key is None:
            raise SchemaError(f"{where}.values: {v!r} is not a category value (text, a number or a boolean)")
        keys.append(key)
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SchemaError(f"{where}.values: {dup!r} is declared twice (values are compared as text)")
    return {"values": tuple(keys)}


@dataclass(frozen=True)
class FeatureSchema:
    """The model's input fields, in order; the row is their columns one after the other."""

    fields: tuple[FieldSpec, ...]

    def __post_init__(self):
        names = [f.name for f in self.fields]
        if not names:
            raise SchemaError("model.features: must list at least one field")
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SchemaError(f"model.features: field {dup!r} is listed twice")
        paths = {f.path for f in self.fields}
        for p in paths:  # "device" and "device.os": one cannot be a number and an object at once
            for i in range(1, len(p)):
                if p[:i] in paths:
                    raise SchemaError(
                        f"model.features: {'.'.join(p[:i])!r} is a field and also the object holding {'.'.join(p)!r}"
                    )

    @classmethod
    def parse(cls, raw) -> FeatureSchema:
        """The schema of ``model.features`` (a list of field mappings or FieldSpecs)."""
        if isinstance(raw, FeatureSchema):
            return raw
        if not isinstance(raw, (list, tuple)):
            raise SchemaError(f"model.features: must be a list of fields, got {raw!r}")
        return cls(tuple(FieldSpec.parse(f, f"model.features[{i}]") for i, f in enumerate(raw)))

    @property
    def width(self) -> int:
        """The encoded row's width: the model's n_inputs."""
        return sum(f.width for f in self.fields)

    def offsets(self) -> list[int]:
        """Each field's first column."""
        out, at = [], 0
        for f in self.fields:
            out.append(at)
            at += f.width
        return out

    def columns(self) -> list[str]:
        """A name per column of the row (``FieldSpec.columns``)."""
        return [c for f in self.fields for c in f.columns()]

    @property
    def scaled(self) -> np.ndarray:
        """(width,) bool: the columns the scaler z-scores (number values; never one-hot or indicators)."""
        mask = np.zeros(self.width, dtype=bool)
        for f, at in zip(self.fields, self.offsets()):
            if f.type == "number":
                mask[at] = True
        return mask

    @property
    def numbers(self) -> list[FieldSpec]:
        return [f for f in self.fields if f.type == "number"]

    def fixed_scaling(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of every column for scaler "fixed": each number field's ``mean``/``std``, 0/1
        elsewhere. SchemaError naming a number field without them."""
        mean, std = np.zeros(self.width), np.ones(self.width)
        for f, at in zip(self.fields, self.offsets()):
            if f.type != "number":
                continue
            if f.mean is None or f.std is None:
                raise SchemaError(
                    f"model.features ({f.name}): with scaler 'fixed' every number field needs mean and std"
                )
            mean[at], std[at] = f.mean, f.std
        return mean, std

    def to_config(self) -> list[dict]:
        return [f.to_config() for f in self.fields]

    def changes(self, other: FeatureSchema | None) -> list[str]:
        """What differs from ``other`` (the schema a model was saved with), field by field, one line each.

        >>> a = FeatureSchema.parse([{"name": "x", "type": "number"}, {"name": "c", "type": "category", "values": ["a"]}])
        >>> b = FeatureSchema.parse([{"name": "x", "type": "number"}, {"name": "c", "type": "category", "values": ["a", "b"]}])
        >>> b.changes(a)
        ["field 'c': values ['a'] -> ['a', 'b']"]
        """
        if other is None:
            return ["the saved model has no feature schema (array rows), this config has one"]
        mine, theirs = {f.name: f for f in self.fields}, {f.name: f for f in other.fields}
        out = [f"field {n!r} added" for n in mine if n not in theirs]
        out += [f"field {n!r} removed" for n in theirs if n not in mine]
        for name, f in mine.items():
            g = theirs.get(name)
            if g is None or f == g:
                continue
            for key in (x.name for x in fields(FieldSpec)):
                a, b = getattr(g, key), getattr(f, key)
                if a != b:
                    show = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
                    out.append(f"field {name!r}: {key} {show(a)!r} -> {show(b)!r}")
        if not out and [f.name for f in self.fields] != [f.name for f in other.fields]:
            out.append(
                f"the fields' order changed: {[f.name for f in other.fields]} -> {[f.name for f in self.fields]}"
            )
        return out
