"""Tables of named fields for the tools: a CSV's rows as the records a team's events would hold, encoded by a
feature schema (the config's, or one inferred from the table), one way for ``evaluate``, ``seed``,
``produce`` and ``check`` (docs/design.md §11). The encoding itself is the model's (``core.encoder``).
"""

from __future__ import annotations

import numpy as np

from iolstream.core.encoder import RecordEncoder
from iolstream.core.schema import FeatureSchema
from iolstream.core.schema_infer import infer_schema, typed_records
from iolstream.stream.rows import TargetSpec
from iolstream.stream.values import check_label
from iolstream.tools.dataset import DataError, Dataset

MAX_NAMED = 3  # refused rows named in one error


def choose_schema(table, schema: FeatureSchema | None, *, source: str, say=None) -> FeatureSchema:
    """``schema`` (the config's) when given, else the one inferred from ``table``; ``say`` is told which (one
    line). DataError naming a schema field the table lacks."""
    if schema is not None:
        missing = [f.name for f in schema.fields if f.name not in table.columns]
        if missing:
            raise DataError(
                f"{table.name}: no column {missing[0]!r} for the field of model.features in {source}; "
                f"columns: {', '.join(table.columns)}"
            )
        if say is not None:
            say(f"schema: model.features of {source} ({len(schema.fields)} fields, {schema.width} inputs)")
        return schema
    schema, notes = infer_schema(table.columns)
    if say is not None:
        kinds = {k: sum(f.type == k for f in schema.fields) for k in ("number", "category", "boolean")}
        fields = {f.name for f in schema.fields}
        gaps = sum(
            "missing" in notes[f.name] and not notes[f.name].startswith("no gaps") for f in schema.fields
        )
        left_out = [
            f"{name!r}, {note.removeprefix('left out: ')}"
            for name, note in notes.items()
            if name not in fields
        ]
        say(
            f"schema: inferred from {table.name} ({kinds['number']} numbers, {kinds['category']} categories, "
            f"{kinds['boolean']} booleans, {gaps} with gaps: {schema.width} inputs"
            + (f"; left out: {'; '.join(left_out)}" if left_out else "")
            + "); `iolstream schema infer` prints it as a worker config"
        )
    return schema


def table_records(table, schema: FeatureSchema) -> list[dict]:
    """The table's rows as records typed by ``schema``, each checked: DataError naming the first refused rows
    (1-based, as in the file) and why."""
    records = typed_records(table.columns, schema)
    check_records(records, schema, table.name)
    return records


def check_records(records: list[dict], schema: FeatureSchema, name: str) -> np.ndarray:
    """The records' rows (``RecordEncoder``), or DataError naming the first records it refuses."""
    out = RecordEncoder(schema).encode(records)
    if out.refused:
        named = "; ".join(f"row {i + 1}: {reason}: {detail}" for i, reason, detail in out.refused[:MAX_NAMED])
        more = f" (and {len(out.refused) - MAX_NAMED} more)" if len(out.refused) > MAX_NAMED else ""
        raise DataError(f"{name}: {len(out.refused)} rows do not fit the schema: {named}{more}")
    return out.X


def schema_dataset(table, schema: FeatureSchema) -> Dataset:
    """The table encoded by ``schema`` as a Dataset (X: raw rows, NaN where a number is missing)."""
    X = np.ascontiguousarray(check_records(typed_records(table.columns, schema), schema, table.name))
    return Dataset(
        name=table.name,
        X=X,
        y=table.y,
        task=table.task,
        classes=table.classes,
        feature_names=tuple(schema.columns()),
        description=f"{table.description}; {len(schema.fields)} named fields, {schema.width} inputs",
        schema=schema,
    )


def declared_labels(y, model) -> list:
    """The labels of ``y`` as the model declares its classes (the text "true" as true for classes false/true,
    "3" as 3 for integer classes), so that events carry them typed; regression values as floats. A label that
    is no class stays as it is (``fit.mismatches`` names it)."""
    if model.task != "classification":
        return [v.item() if hasattr(v, "item") else v for v in y]
    target = TargetSpec(model.task, model.classes, model.m)
    out = []
    for v in y:
        value = v.item() if hasattr(v, "item") else v
        index, reason, _ = check_label(value, target)
        out.append(model.classes[index] if reason is None else value)
    return out
