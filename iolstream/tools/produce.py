"""``iolstream produce``: replay a data set into the features and labels topics.

The message plan is pure and lives in ``plan`` (``iter_plan``/``plan``, re-exported here); the Kafka part
(``send``, ``create_topics``, ``preflight``) in ``send``. The data is checked against the worker config's
model first (``fit``). ``--follow`` reads the predictions back (``follow.Follower``).

    >>> msgs = plan(np.arange(4.0).reshape(2, 2), ["a", "b"], PlanOptions(with_ts=False))
    >>> plan_summary(msgs)["feature_rows"], msgs[0].encode()
    (2, b'{"id":"r0","x":[0.0,1.0]}')
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from iolstream.stream.rows import REASON_HINTS
from iolstream.tools.follow import Follower, plot_curve
from iolstream.tools.plan import EventShape, PlanOptions, iter_plan, plan, plan_summary, row_ids
from iolstream.tools.progress import Reporter
from iolstream.tools.send import SendFailed, create_topics, ids_sent_before, preflight, send

__all__ = [
    "PlanOptions",
    "iter_plan",
    "plan",
    "plan_summary",
    "send",
    "create_topics",
    "resolve_target",
    "load_rows",
]  # plan: re-exported

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"


# --------------------------------------------------------------------------------- CLI


def add_parser(subparsers):
    from iolstream.tools.arguments import add_data_source, non_negative_float, non_negative_int, positive_int

    p = subparsers.add_parser(
        "produce",
        help="replay a data set into the features and labels topics",
        description=(
            "Send a data set's rows to the features topic and their labels to the labels topic: labels "
            "delayed by rows or seconds, optionally some never sent, duplicated or out of order; at a rate "
            "or as fast as possible; one row or a batch per message. With --follow, read the worker's "
            "predictions meanwhile and report their prequential metric (and --plot its learning curve)."
        ),
    )
    src = add_data_source(p)
    src.add_argument("--rows", type=positive_int, metavar="N", help="send at most N rows (after --shuffle)")
    src.add_argument(
        "--seed", type=int, default=0, help="--shuffle and the label faults (default: %(default)s)"
    )
    src.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle the rows with the seed first (the order `evaluate --seed` streams)",
    )
    src.add_argument(
        "--id-prefix",
        help=(
            "row ids are PREFIX0, PREFIX1, ... (default: r); a CSV holding the config's id field "
            "(events.id_field) sends its own ids, PREFIX before each if given (new ids for a replay)"
        ),
    )

    kafka = p.add_argument_group("kafka")
    kafka.add_argument(
        "-c",
        "--config",
        metavar="YAML",
        help="worker config: bootstrap servers, topic names and kafka.client settings from it",
    )
    kafka.add_argument(
        "--bootstrap", metavar="HOST:PORT", help=f"(default: the config's, else {DEFAULT_BOOTSTRAP})"
    )
    kafka.add_argument("--features-topic", metavar="TOPIC", help="(default: the config's, else iol.features)")
    kafka.add_argument("--labels-topic", metavar="TOPIC", help="(default: the config's, else iol.labels)")
    kafka.add_argument(
        "--predictions-topic",
        metavar="TOPIC",
        help="for --follow (default: the config's, else iol.predictions)",
    )
    kafka.add_argument(
        "--create-topics",
        action="store_true",
        help="create missing topics first: features, labels, predictions (and dead letters with -c)",
    )

    how = p.add_argument_group("replay")
    how.add_argument(
        "--batch-rows",
        type=positive_int,
        default=1,
        metavar="B",
        help="rows per message: 1 = row messages, more = batch messages (default: %(default)s)",
    )
    how.add_argument(
        "--label-delay-rows",
        type=non_negative_int,
        default=0,
        metavar="D",
        help="a label goes out once D later rows went out (default: %(default)s)",
    )
    how.add_argument(
        "--label-delay-seconds",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="... and S seconds after that (default: %(default)s)",
    )
    how.add_argument(
        "--missing-fraction", type=float, default=0.0, metavar="F", help="labels never sent (default: 0)"
    )
    how.add_argument(
        "--duplicate-fraction", type=float, default=0.0, metavar="F", help="labels sent twice (default: 0)"
    )
    how.add_argument(
        "--shuffle-window",
        type=non_negative_int,
        default=0,
        metavar="W",
        help="labels shuffled within windows of W rows: out of order (default: 0)",
    )
    how.add_argument(
        "--rate",
        type=non_negative_float,
        default=0.0,
        metavar="ROWS_PER_S",
        help="feature rows per second; 0 = as fast as possible (default: 0)",
    )
    how.add_argument("--no-ts", dest="with_ts", action="store_false", help="no event time on features")

    out = p.add_argument_group("follow the worker")
    out.add_argument(
        "--follow",
        action="store_true",
        help="read the predictions meanwhile: live prequential metric; wait until every row is predicted",
    )
    out.add_argument(
        "--follow-timeout",
        type=non_negative_float,
        default=30.0,
        metavar="S",
        help="stop waiting after S seconds without a new prediction (default: %(default)s)",
    )
    out.add_argument(
        "--plot", metavar="FILE.png", help="with --follow: the learning curve of the worker's predictions"
    )
    out.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=main)
    return p


@dataclass(frozen=True)
class KafkaTarget:
    """Where a replay goes: resolved from the options, the worker config, then the defaults."""

    client_conf: dict
    features: str
    labels: str
    predictions: str
    dead_letters: str | None
    partitions: int = 1
    replication_factor: int = 1
    model: object = None  # the worker config's ModelConfig (with -c): the data is checked against it
    log_format: str = "text"
    events: object = None  # the worker config's EventsConfig (with -c): its model has a feature schema


def resolve_target(args) -> KafkaTarget:
    from iolstream.kafka.config import TopicsConfig, check_login, load_config

    topics, client, bootstrap = TopicsConfig(), {}, DEFAULT_BOOTSTRAP
    dead = model = events = None
    log_format = "text"
    if args.config:
        cfg = load_config(args.config)
        check_login(cfg.kafka)
        topics, client, bootstrap = cfg.topics, dict(cfg.kafka.client), cfg.kafka.bootstrap_servers
        dead, model, log_format = cfg.topics.dead_letters, cfg.model, cfg.logging.format
        events = cfg.events if cfg.model.schema is not None else None
    conf = {**client, "bootstrap.servers": args.bootstrap or bootstrap}
    target = KafkaTarget(
        conf,
        args.features_topic or topics.features,
        args.labels_topic or topics.labels,
        args.predictions_topic or topics.predictions,
        dead,
        topics.partitions,
        topics.replication_factor,
        model,
        log_format,
        events,
    )
    names = [target.features, target.labels, target.predictions]
    if len(set(names)) != 3:
        raise ValueError(f"the features, labels and predictions topics must differ, got {names}")
    return target


def load_rows(args, model=None, shape: EventShape | None = None):
    """(X, y, task, description, ids) of the data set, shuffled and capped as asked. With ``model`` (a worker's
    ModelConfig) that has a feature schema, X is the rows as records of its named fields (the events sent), and
    ``ids`` the CSV's own ids when it has the id field of ``shape`` (else None: the rows are numbered)."""
    from iolstream.tools import builtin_datasets
    from iolstream.tools.csv_file import load_csv, load_table

    if args.csv is not None and not args.target:
        raise ValueError("--csv needs --target COLUMN")
    if args.csv is None and args.target:
        raise ValueError("--target applies only to --csv")
    if model is not None and model.schema is not None:
        return _load_records(args, model, shape)
    if args.csv is not None:
        table = load_table(args.csv, args.target)
        if table.needs_schema():
            raise ValueError(
                f"{args.csv} has text or blank cells: a worker reads such rows by a feature schema "
                f"(model.features); `iolstream schema infer --csv {args.csv} --target {args.target}` writes a config "
                "with one, then pass it with -c"
            )
        ds = load_csv(args.csv, args.target)
    elif args.dataset not in builtin_datasets.DATASETS:
        raise builtin_datasets.DataError(
            f"unknown data set {args.dataset!r}; valid names: {', '.join(builtin_datasets.DATASETS)}"
        )
    elif args.dataset == "poker":
        ds = builtin_datasets.load("poker", rows=args.rows, seed=args.seed)
    else:
        ds = builtin_datasets.load(args.dataset, seed=args.seed)
    order = _order(args, ds.n_rows)
    return np.ascontiguousarray(ds.X[order]), ds.y[order], ds.task, ds.description, None


def _order(args, n: int) -> np.ndarray:
    order = np.random.default_rng(args.seed).permutation(n) if args.shuffle else np.arange(n)
    return order[: args.rows] if args.rows is not None else order


def _load_records(args, model, shape: EventShape | None):
    """``load_rows`` for a worker with a feature schema: the records its events carry (a CSV's columns by the
    schema; a built-in data set's features by their names), the labels typed as its classes, and the CSV's ids
    (``file_ids``)."""
    from iolstream.tools import builtin_datasets
    from iolstream.tools.csv_file import load_table
    from iolstream.tools.records import choose_schema, declared_labels, table_records

    schema = model.schema
    if args.csv is not None:
        table = load_table(args.csv, args.target, task=model.task)
        choose_schema(table, schema, source=args.config)  # every field of the schema is a column
        records, y, task, description = table_records(table, schema), table.y, table.task, table.description
        ids = file_ids(table, shape)
    else:
        if args.dataset not in builtin_datasets.DATASETS:
            raise builtin_datasets.DataError(
                f"unknown data set {args.dataset!r}; valid names: {', '.join(builtin_datasets.DATASETS)}"
            )
        ds = builtin_datasets.load(args.dataset, seed=args.seed)
        names = list(ds.feature_names)
        records = [dict(zip(names, row)) for row in ds.X.tolist()]
        from iolstream.tools.records import check_records

        check_records(records, schema, ds.name)
        y, task, description, ids = ds.y, ds.task, ds.description, None
    order = _order(args, len(records))
    labels = declared_labels(np.asarray(y)[order], model)
    if ids is not None:
        ids = tuple(ids[i] for i in order.tolist())
    return [records[i] for i in order.tolist()], labels, task, description + " (as named-field events)", ids


def file_ids(table, shape: EventShape | None) -> list[str] | None:
    """The table's own ids: the column named as the events' id field (its text, stripped), or None when the
    table has no such column (or the id is the message key). ValueError naming the column and the first rows
    (1-based, as in the file) when an id is missing or repeated: the worker would refuse those rows."""
    from iolstream.core.schema_infer import is_missing

    if shape is None or shape.id_from_key or shape.id_field not in table.columns:
        return None
    name = shape.id_field
    ids = [str(v).strip() for v in table.columns[name]]
    blank = [i + 1 for i, v in enumerate(table.columns[name]) if is_missing(v)]
    if blank:
        rows = ", ".join(map(str, blank[:5]))
        raise ValueError(
            f"{table.name}: column {name!r} (events.id_field) is empty at {len(blank)} rows ({rows}"
            f"{', ...' if len(blank) > 5 else ''}): every event needs its id"
        )
    first: dict[str, int] = {}
    repeated = []
    for i, v in enumerate(ids):
        if v in first:
            repeated.append(f"{v!r} at rows {first[v]} and {i + 1}")
        else:
            first[v] = i + 1
    if repeated:
        raise ValueError(
            f"{table.name}: column {name!r} (events.id_field) repeats {len(repeated)} ids ({'; '.join(repeated[:3])}"
            f"{'; ...' if len(repeated) > 3 else ''}): the worker takes a repeated id for the same row sent "
            "again (a duplicate_id dead letter)"
        )
    return ids


def main(args) -> int:
    """Exit 0 when sent (and, with --follow, predicted); 1 when rows got no prediction in time; 2 for bad
    arguments or data (the data checked against the config's model first); 3 for a cluster problem; 6 when the
    broker refused us (authentication, TLS trust, a missing ACL)."""
    try:
        return replay(args)
    except SendFailed as exc:
        return _cluster_error(exc)


def _cluster_error(failed: SendFailed) -> int:
    import sys

    print(f"iolstream produce: error: {failed}", file=sys.stderr)
    return failed.exit_code


def replay(args) -> int:
    import sys

    from iolstream.ops import logs
    from iolstream.tools.fit import mismatches

    if args.plot is not None and not args.follow:
        raise ValueError("--plot needs --follow (the curve is drawn from the predictions)")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        raise ValueError(f"--plot: expected a .png file name, got {args.plot!r}")
    options = PlanOptions(
        batch_rows=args.batch_rows,
        label_delay_rows=args.label_delay_rows,
        label_delay_seconds=args.label_delay_seconds,
        missing_fraction=args.missing_fraction,
        duplicate_fraction=args.duplicate_fraction,
        shuffle_window=args.shuffle_window,
        with_ts=args.with_ts,
        seed=args.seed,
    )
    target = resolve_target(args)
    logs.setup("WARNING", target.log_format)  # librdkafka's complaints through the repeat filter, never raw
    shape = None if target.events is None else EventShape.of(target.events)
    X, y, task, description, own_ids = load_rows(args, target.model, shape)
    if own_ids is not None:
        options = dataclasses.replace(options, ids=own_ids, id_prefix=args.id_prefix or "")
        description += f"; ids from its column {shape.id_field!r}"
    elif args.id_prefix is not None:
        options = dataclasses.replace(options, id_prefix=args.id_prefix)
    if shape is not None and shape.id_from_key and args.batch_rows > 1:
        raise ValueError(
            "--batch-rows: the worker takes the id from the message key (events.id_from_key): 1 only"
        )
    if target.model is not None:
        found = mismatches(X, y, task, target.model)
        if found:
            raise ValueError(f"the data does not fit the model of {args.config}: {'; '.join(found)}")
    n = len(X)
    needed = [target.features, target.labels] + ([target.predictions] if args.follow else [])
    reads = {target.predictions: "Read"} if args.follow else {}
    why = preflight(target.client_conf, needed, args.create_topics, operations=reads)
    if why is not None:
        return _cluster_error(SendFailed(why))
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    say(
        f"{description}\nsending {n} rows to {target.features} (labels to {target.labels}) "
        f"via {target.client_conf['bootstrap.servers']}"
    )

    ids = row_ids(n, options)
    repeated, scanned = ids_sent_before(target.client_conf, target.features, ids, shape=shape)
    if repeated:
        print(
            f"iolstream produce: warning: {repeated} of the {n} ids to send ({ids[0]} .. {ids[-1]}) are in "
            f"{target.features} already (its newest {scanned} messages): a worker that saw them refuses these rows "
            "as duplicate_id dead letters; give this replay new ids with --id-prefix",
            file=sys.stderr,
            flush=True,
        )
    if args.create_topics:
        names = [target.features, target.labels, target.predictions] + (
            [target.dead_letters] if target.dead_letters else []
        )
        sized = [
            n for n in names if n != target.predictions
        ]  # input and dead letters: room for the largest message
        created = create_topics(
            target.client_conf,
            names,
            partitions=target.partitions,
            replication_factor=target.replication_factor,
            sized=sized,
        )
        if created:
            say(f"created topics {', '.join(created)}")

    follower = None
    if args.follow:
        id_field = "id" if shape is None else shape.id_field
        follower = Follower(
            target.client_conf,
            target.predictions,
            ids,
            y,
            task,
            id_field,
            dead_letters=target.dead_letters,
            features=target.features,
        ).start()
    metric_name = "acc" if task == "classification" else "rmse"
    reporter = Reporter(n, "produce", enabled=not args.quiet)

    def status(rows_sent: int) -> str:
        if follower is None:
            return f"{rows_sent}/{n} rows sent"
        refused = (
            f", {follower.refused_rows} refused ({follower.dominant()})" if follower.refused_rows else ""
        )
        return (
            f"{rows_sent}/{n} rows sent, {follower.predicted} predicted{refused}, "
            f"prequential {metric_name} {follower.metric():.4f}"
        )

    sent_rows = [0]

    def progress(rows_sent: int) -> None:
        sent_rows[0] = rows_sent
        reporter.update(rows_sent, status(rows_sent))

    try:
        summary = send(
            iter_plan(X, y, options, shape),
            producer_conf=target.client_conf,
            features_topic=target.features,
            labels_topic=target.labels,
            rate=args.rate or None,
            label_delay_seconds=args.label_delay_seconds,
            progress=progress,
        )
        reporter.update(n, status(n), force=True)
        if follower is not None:
            done = follower.wait(
                n, timeout=args.follow_timeout, on_tick=lambda: reporter.update(follower.predicted, status(n))
            )
            reporter.update(follower.predicted, status(n), force=True)
    finally:
        reporter.close()
        if follower is not None:
            follower.stop()
    say(
        f"sent {summary['feature_rows']} rows in {summary['feature_messages']} messages and "
        f"{summary['label_rows']} labels in {summary['label_messages']} messages in {summary['seconds']:.1f} s"
    )
    if follower is None:
        return 0
    modes = ",".join(sorted(follower.modes)) or "-"
    say(
        f"{follower.predicted}/{n} rows predicted (mode {modes}), prequential {metric_name} "
        f"{follower.metric():.4f}, {follower.duplicates} duplicate predictions"
    )
    if args.plot and follower.predicted:
        name = args.dataset or os.path.basename(args.csv)
        plot_curve(follower.errors, task, args.plot, title=f"{name}: the worker's predictions ({modes})")
        say(f"learning curve written to {args.plot}")
    if follower.refused_rows:
        reason = follower.dominant()
        say(
            f"{follower.refused_rows} rows were refused by the worker (dead letters in {target.dead_letters}), "
            f"{'all' if follower.refused[reason] == follower.refused_rows else 'mostly'} {reason}: "
            f"{REASON_HINTS[reason]}"
        )
    if not done:
        missing = n - follower.predicted - follower.refused_rows
        why = f"within {args.follow_timeout:.0f} s of the last one"
        if follower.refused_rows:
            why = f"{follower.refused_rows} refused as dead letters ({follower.dominant()})" + (
                f", {missing} not {why}" if missing else ""
            )
        print(
            f"iolstream produce: error: {n - follower.predicted} rows got no prediction: {why}",
            file=sys.stderr,
        )
        return 1
    return 0
