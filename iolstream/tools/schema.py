"""``iolstream schema infer --csv FILE --target COL``: a worker config for a CSV of named fields, ready to run.

It reads the file, infers each column's type (``core.schema_infer``: numbers, booleans, categories with
their values up to ``--max-values`` and hashed ``--buckets`` beyond, which columns have gaps) and prints a
worker config: the schema (``model.features``), the classes or the regression output, the label field, an id
field if the file has one (``--id``, default a column named ``id``), topics, consumer group and snapshot
directory named after the file. Every other key keeps its default (``config/worker.yaml``); the broker and
the paths come from the environment overrides as usual (``IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS``,
``IOLSTREAM_SNAPSHOT__DIR``). ``produce -c CONFIG --csv FILE --target COL`` then sends the file's rows as
named-field events, and ``run -c CONFIG`` learns from them.
"""

from __future__ import annotations

import os
import re

MAX_VALUES_DEFAULT = 20
BUCKETS_DEFAULT = 64
COMMENT_COLUMN = 72  # the fields' comments line up here (a longer field's follows it)


def add_parser(subparsers):
    from iolstream.tools.arguments import positive_int

    p = subparsers.add_parser(
        "schema",
        help="infer a worker config (the feature schema) from a CSV of named fields",
        description="Feature schemas: `schema infer` prints a worker config for a CSV file, ready to run.",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    infer = sub.add_parser(
        "infer",
        help="print a worker config for a CSV: the schema, the label, topics named after the file",
        description=(
            "Read a CSV with a header row and print a worker config for it: each column's type (number, "
            "category, boolean) and gaps, the label column, topics named after the file; every other key at "
            "its default."
        ),
    )
    infer.add_argument("--csv", required=True, metavar="FILE", help="a CSV file with a header row")
    infer.add_argument("--target", required=True, metavar="COLUMN", help="the label column")
    infer.add_argument(
        "--id",
        metavar="COLUMN",
        help=(
            "the id column (default: a column named 'id'; else the first whose every value is a distinct text, "
            "or a distinct integer counting the rows; else none: `produce` numbers the rows)"
        ),
    )
    infer.add_argument(
        "--task",
        choices=("auto", "classification", "regression"),
        default="auto",
        help="of the target (default: auto: text, or integers with at most 50 values, are classes)",
    )
    infer.add_argument(
        "--max-values",
        type=positive_int,
        default=MAX_VALUES_DEFAULT,
        metavar="N",
        help="a text column with at most N distinct values declares them; more: hashed buckets (default: %(default)s)",
    )
    infer.add_argument(
        "--buckets",
        type=positive_int,
        default=BUCKETS_DEFAULT,
        metavar="N",
        help="hashed slots of a column with more values (default: %(default)s)",
    )
    infer.add_argument("--rows", type=positive_int, metavar="N", help="read only the first N rows")
    infer.add_argument("-o", "--output", metavar="YAML", help="write the config there (default: print it)")
    p.set_defaults(func=main)
    return p


def topic_stem(path: str) -> str:
    """The file's name without extension, as a topic and group name (other characters become '-')."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "events"


def inferred_config(args):
    """(the config's YAML text, the schema, the table) for ``args`` (schema infer's options)."""
    from iolstream.core.schema_infer import id_like, infer_schema
    from iolstream.tools.csv_file import load_table

    table = load_table(args.csv, args.target, task=args.task, rows=args.rows)
    columns = dict(table.columns)
    id_column = args.id if args.id is not None else ("id" if "id" in columns else None)
    if id_column is not None and id_column not in columns:
        raise ValueError(f"--id: no column {id_column!r} in {args.csv}; columns: {', '.join(columns)}")
    if id_column is not None:
        del columns[id_column]
    if not columns:
        raise ValueError(f"{args.csv}: no column besides the target and the id to learn from")
    try:
        schema, notes = infer_schema(columns, max_values=args.max_values, buckets=args.buckets)
    except ValueError as exc:
        raise ValueError(f"{args.csv}: {exc}") from None
    if id_column is None and id_like(notes):  # an identifier column: the events' id
        id_column = id_like(notes)[0]
        notes.pop(id_column)
    return render(args.csv, args.target, id_column, table, schema, notes), schema, table


def class_values(table) -> list:
    """The target's classes as the config declares them: false/true for a column of booleans, ints, or texts."""
    from iolstream.core.schema_infer import as_boolean

    values = list(table.classes)
    if all(as_boolean(v) is not None for v in map(str, values)) and len(values) == 2:
        return [False, True]
    return values


def render(csv_path, target, id_column, table, schema, notes) -> str:
    """The config's YAML: the schema's fields one per line, each with its note."""
    import yaml

    stem = topic_stem(csv_path)

    def flow(value) -> str:  # one line of YAML; a scalar without the end-of-document mark safe_dump adds
        text = yaml.safe_dump([value], default_flow_style=True, width=10**9, sort_keys=False).strip()
        return text[1:-1]

    out = [
        f"# A worker for {os.path.basename(csv_path)} ({table.n_rows} rows), written by `iolstream schema infer`.",
        "# Every key not here keeps its default (config/worker.yaml); the broker and the paths come from the",
        "# environment overrides as usual (IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS, IOLSTREAM_SNAPSHOT__DIR, ...).",
        "model:",
    ]
    if table.task == "classification":
        classes = class_values(table)
        note = f"the values of {target!r}"
        if len(classes) > 2 and all(type(c) is int for c in classes):  # a count or a rating, maybe
            missing = max(classes) - min(classes) + 1 - len(classes)
            note += (
                f": integers {min(classes)}..{max(classes)} taken as {len(classes)} classes"
                + (f" ({missing} in between never seen: such a label would be refused)" if missing else "")
                + "; `--task regression` predicts a number instead"
            )
        out.append(f"  classes: {flow(classes)}  # {note}")
    else:
        out.append(f"  n_outputs: 1  # regression: {target!r} is a number")
    out.append(f"  features:  # {schema.width} inputs")
    entries = [flow(f.to_config()) for f in schema.fields]
    width = min(max(len(e) for e in entries), COMMENT_COLUMN)  # a long field's comment follows it, unaligned
    for f, entry in zip(schema.fields, entries):
        out.append(f"    - {entry.ljust(width)}  # {notes[f.name]}")
    out += [f"  # {name}: {note}" for name, note in notes.items() if note.startswith("left out")]
    out.append("events:")
    if id_column is not None:
        out.append(
            f"  id_field: {flow(id_column)}  # a column of the file: `iolstream produce` sends its ids"
        )
    else:
        out.append("  id_field: id  # the file has no id column: `iolstream produce` numbers the rows")
    out.append(f"  label_field: {flow(target)}")
    out += [
        "kafka:",
        f"  group_id: {flow(stem)}",
        "topics:",
        f"  features: {flow(stem + '.features')}",
        f"  labels: {flow(stem + '.labels')}",
        f"  predictions: {flow(stem + '.predictions')}",
        f"  dead_letters: {flow(stem + '.dead-letters')}",
        "snapshot:",
        f"  dir: {flow('snapshots/' + stem)}",
    ]
    return "\n".join(out) + "\n"


def main(args) -> int:
    import sys

    from iolstream.kafka.config import config_from_dict

    text, schema, table = inferred_config(args)
    import yaml

    config_from_dict(yaml.safe_load(text), environ={})  # what is printed loads: a bug here, not bad data
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(
            f"wrote {args.output}: {len(schema.fields)} fields, {schema.width} inputs, from {table.n_rows} rows",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0
