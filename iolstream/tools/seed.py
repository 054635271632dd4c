"""``iolstream seed -c CONFIG --csv FILE --target COL``: a worker's starting state, learned from history.

The CSV's rows go through the worker's own stream logic (``StreamProcessor``) with the config's model and
stream settings, as batch messages of ``stream.batch_rows`` rows each followed by its labels: the same
sums an offline fit in batches of that size gives (each batch's Gram, then its labels). The state is
written as a snapshot into ``snapshot.dir``; ``iolstream run`` with the same config resumes from it and
reads every input partition from its beginning (the seed covers no offsets). A directory that already
holds snapshots is refused unless ``--replace`` (the worker would otherwise resume from the seed and
read its topics again from their beginning).

The seed's rows get ids ``iolstream-seed-<n>``, which the worker remembers as learned
(``stream.remember_done``): stream ids must not take that form. The Python API reads the model back for
batch scoring: ``iolstream.load_snapshot(snapshot.dir)``.
"""

from __future__ import annotations

import time

SEED_ID_PREFIX = "iolstream-seed-"


def add_parser(subparsers):
    from iolstream.tools.arguments import positive_int

    p = subparsers.add_parser(
        "seed",
        help="learn a worker's starting state from a CSV (a snapshot the worker resumes from)",
        description=(
            "Learn a worker's starting state from a CSV of history with the config's model and write it as a "
            "snapshot into snapshot.dir; `iolstream run -c CONFIG` resumes from it."
        ),
    )
    p.add_argument("-c", "--config", required=True, help="worker YAML (see config/worker.yaml)")
    p.add_argument("--csv", required=True, metavar="FILE", help="a CSV file with a header row")
    p.add_argument("--target", required=True, metavar="COLUMN", help="the CSV's label column")
    p.add_argument("--rows", type=positive_int, metavar="N", help="learn only the first N rows")
    p.add_argument(
        "--replace",
        action="store_true",
        help="write the seed even if snapshot.dir holds snapshots (the worker resumes from the seed)",
    )
    p.set_defaults(func=main)
    return p


def seed_processor(cfg, X, y):
    """A StreamProcessor that has learned (X, y) as the worker would have, batch by batch: ``X`` rows of numbers,
    or, for a model with a feature schema, records of named fields sent as its events. Fewer rows than a
    warm-up scaler waits for fix the scaling themselves (at least 2): held for a warm-up the stream would go on
    with, they would be predicted there, and their predictions emitted under the seed's ids."""
    import numpy as np

    from iolstream.core.model import EdRVFL
    from iolstream.stream.processor import StreamProcessor
    from iolstream.tools.plan import EventShape, PlanOptions, iter_plan

    proc = StreamProcessor(
        EdRVFL(cfg.model), cfg.stream, window_rows=cfg.metrics.window_rows, events=cfg.events
    )
    options = PlanOptions(batch_rows=cfg.stream.batch_rows, with_ts=False, id_prefix=SEED_ID_PREFIX)
    shape = EventShape.of(cfg.events) if cfg.model.schema is not None else None
    if shape is not None and shape.id_from_key:  # one event per message, its id the key
        options = PlanOptions(batch_rows=1, with_ts=False, id_prefix=SEED_ID_PREFIX)
    now_ms = int(time.time() * 1000)
    dead = 0
    for message in iter_plan(X, y, options, shape):
        feed = proc.on_features if message.kind == "features" else proc.on_labels
        dead += len(feed(message.encode(), None, now_ms, message.key))
        proc.step(now_ms, force=True)  # a batch's Gram in and predicted, then its labels folded in
    if dead:  # the rows were checked against the model first: a refusal here is a bug, not bad data
        raise RuntimeError(f"{dead} seed rows or labels were refused by the stream logic")
    if proc.held and not proc.model.ready:  # fewer rows than the warm-up waits for: they fix the scaling
        scaler = proc.model.scaler
        scaler.partial_fit(np.concatenate([rows.X for rows in proc.held.batches])[scaler.count :])
        scaler.freeze()
        proc.step(now_ms, force=True)  # the held batches predicted in order, their labels folded in
    return proc


def main(args) -> int:
    import sys

    from iolstream.kafka.config import load_config
    from iolstream.kafka.snapshots import SnapshotStore
    from iolstream.stream.prequential import PrequentialMetric
    from iolstream.tools.fit import mismatches

    cfg = load_config(args.config)
    if cfg.group.enabled:
        raise ValueError(
            "group.enabled: seeding is for one worker; group learning starts from the group's sums"
        )
    store = SnapshotStore(cfg.snapshot_dir, cfg.snapshot.keep)
    existing = store.paths()
    if existing and not args.replace:
        raise ValueError(
            f"snapshot.dir {store.dir} already holds snapshots (newest {existing[0].name}): the worker resumes from "
            "them; move them away, or pass --replace to write the seed as the newest"
        )
    cfg, X, y, task, n_rows = _rows(args, cfg)
    if cfg.model.scaler == "warmup" and n_rows < 2:
        raise ValueError(f"{args.csv}: {n_rows} rows: a seed needs at least 2 to fix the input scaling")
    found = mismatches(X, y, task, cfg.model)
    if found:
        raise ValueError(f"the data does not fit the model of {args.config}: {'; '.join(found)}")
    started = time.perf_counter()
    proc = seed_processor(cfg, X, y)
    c, metric_value = dict(proc.counters), proc.metric.value
    # the seed's rows never came through Kafka and none of its predictions was emitted: the worker's counters
    # and prequential metric (the status line, the gauges) start from 0, as for a fresh model
    proc.counters.update(dict.fromkeys(proc.counters, 0))
    if proc.events is not None:  # named fields: their missing / undeclared counts too
        proc.events.reset_counts()
    proc.metric = PrequentialMetric(proc.metric.task, cfg.metrics.window_rows, proc.metric.m)
    manifest, arrays = proc.to_state()
    manifest["offsets"] = []  # no input consumed: the worker reads every partition from its beginning
    manifest["worker"] = {
        "exactly_once": cfg.durability.exactly_once,
        "group_id": cfg.kafka.group_id,
        "seeded_from": {"csv": str(args.csv), "target": args.target, "rows": c["rows_learned"]},
    }
    snap = store.write(manifest, arrays)
    metric = "accuracy" if cfg.model.task == "classification" else "RMSE"
    print(
        f"seeded {snap.path} from {n_rows} rows in {time.perf_counter() - started:.1f} s: "
        f"{c['rows_learned']} learned, prequential {metric} {metric_value:.4f}, model version "
        f"{proc.model.version}"
    )
    if n_rows < cfg.model.warmup_rows and cfg.model.scaler == "warmup":
        print(
            f"iolstream seed: warning: {n_rows} rows are fewer than model.warmup_rows "
            f"({cfg.model.warmup_rows}): the input scaling is fixed from these {n_rows}",
            file=sys.stderr,
        )
    return 0


def _rows(args, cfg):
    """(cfg, X, y, task, rows) of the CSV: numbers, or the records of its named fields by the config's feature
    schema or, without one, the schema inferred from the file (said on stderr, with what the config needs: the
    worker resuming from the seed reads its events by the snapshot's schema and refuses a config with another)."""
    import dataclasses
    import sys

    from iolstream.tools.csv_file import load_csv, load_table
    from iolstream.tools.records import choose_schema, declared_labels, table_records

    schema = cfg.model.schema
    table = load_table(args.csv, args.target, task=cfg.model.task, rows=args.rows)
    if schema is None and not table.needs_schema():
        ds = load_csv(args.csv, args.target, task=cfg.model.task, rows=args.rows)
        return cfg, ds.X, ds.y, ds.task, ds.n_rows
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if schema is None:
        inferred = choose_schema(table, None, source=args.csv, say=say)
        say(
            f"{args.csv} has text or blank cells and {args.config} has no model.features: the seed's model reads "
            "events by the inferred schema; before `iolstream run`, put it in the config's model section (a "
            "worker refuses a snapshot whose schema differs from its config's; `iolstream schema infer --csv "
            f"{args.csv} --target {args.target}` writes a whole config):\n  features:"
        )
        for f in inferred.fields:
            say(f"    - {f.to_config()}")
        features = [f.to_config() for f in inferred.fields]
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, features=features, n_inputs=None))
        schema = cfg.model.schema
    else:
        choose_schema(table, schema, source=args.config, say=say)
    records = table_records(table, schema)
    return cfg, records, declared_labels(table.y, cfg.model), table.task, table.n_rows
