"""``iolstream produce``: replay a data set into the features and labels topics.

The message plan is pure and lives in ``plan`` (``iter_plan``/``plan``, re-exported here). ``send`` is
the thin Kafka part: one idempotent producer, id as key, optional rate limit, event time ("ts", ms)
stamped when a features message is sent. ``--follow`` reads the predictions back (``follow.Follower``).

    >>> msgs = plan(np.arange(4.0).reshape(2, 2), ["a", "b"], PlanOptions(with_ts=False))
    >>> plan_summary(msgs)["feature_rows"], msgs[0].encode()
    (2, b'{"id":"r0","x":[0.0,1.0]}')
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from iolstream.tools.follow import Follower, plot_curve
from iolstream.tools.plan import Message, PlanOptions, iter_plan, plan, plan_summary, row_ids

__all__ = [
    "PlanOptions",
    "iter_plan",
    "plan",
    "send",
    "create_topics",
    "resolve_target",
    "load_rows",
]  # plan: re-exported

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"


# ----------------------------------------------------------------------------- Kafka


def send(
    messages: Iterable[Message],
    *,
    producer_conf: dict,
    features_topic: str,
    labels_topic: str,
    rate: float | None = None,
    label_delay_seconds: float = 0.0,
    progress=None,
    stop: threading.Event | None = None,
) -> dict:
    """Send a plan with one idempotent producer; ``rate`` in feature rows/s (None: as fast as
    possible). ``progress(rows_sent)`` is called after every features message. Returns the
    plan summary of what was sent, plus "seconds". Raises RuntimeError on delivery errors."""
    from confluent_kafka import Producer

    from iolstream.kafka.security_errors import Refusals

    refusals = Refusals(producer_conf)  # authentication, TLS or a missing ACL: one line, exit 6
    producer = Producer(
        {"linger.ms": 5, "enable.idempotence": True, "error_cb": refusals.note, **producer_conf}
    )
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
            refusals.note(err, name=msg.topic())

    started = time.monotonic()
    delayed: deque[tuple[float, Message]] = deque()
    summary = plan_summary([])
    rows_sent = 0

    def produce(m: Message) -> None:
        topic = features_topic if m.kind == "features" else labels_topic
        value = m.encode(int(time.time() * 1000))
        while True:
            try:
                producer.produce(topic, value, key=m.key, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka drain it
                producer.poll(0.05)
        summary[f"{'feature' if m.kind == 'features' else 'label'}_messages"] += 1
        summary[f"{'feature' if m.kind == 'features' else 'label'}_rows"] += m.rows

    for m in messages:
        if stop is not None and stop.is_set():
            break
        if rate:
            wait = started + m.due_row / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        while delayed and delayed[0][0] <= time.monotonic():
            produce(delayed.popleft()[1])
        if m.kind == "labels" and label_delay_seconds > 0:
            delayed.append((time.monotonic() + label_delay_seconds, m))
        else:
            produce(m)
        if m.kind == "features":
            rows_sent += m.rows
            if progress is not None:
                progress(rows_sent)
        producer.poll(0)
        refusals.check()
    while delayed and not (stop is not None and stop.is_set()):
        due, m = delayed.popleft()
        time.sleep(max(0.0, due - time.monotonic()))
        produce(m)
    deadline = time.monotonic() + 60
    while (remaining := producer.flush(0.5)) and time.monotonic() < deadline:
        refusals.check()
    refusals.check()
    if remaining or errors:
        raise RuntimeError(
            f"{remaining} messages undelivered, {len(errors)} delivery errors (first: {errors[:1]})"
        )
    return {**summary, "seconds": time.monotonic() - started}


def create_topics(
    admin_conf: dict,
    names: list[str],
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    timeout: float = 30.0,
    sized=(),
    max_message_bytes: int | None = None,
) -> list[str]:
    """Create the topics of ``names`` that do not exist yet; returns those created (``topics.create_topics``,
    which the worker uses too). Those also in ``sized`` (input and dead letters) get a ``max.message.bytes``
    that fits messages of ``max_message_bytes`` (default: the worker's default stream.max_message_bytes)
    when that is above Kafka's default."""
    from confluent_kafka.admin import AdminClient

    from iolstream.kafka import topics
    from iolstream.stream.config import StreamConfig

    limit = StreamConfig.max_message_bytes if max_message_bytes is None else max_message_bytes
    return topics.create_topics(
        AdminClient(admin_conf),
        names,
        partitions=partitions,
        replication_factor=replication_factor,
        configs=topics.topic_configs(limit, sized),
        timeout=timeout,
    )


# --------------------------------------------------------------------------------- CLI


def add_parser(subparsers):
    from iolstream.tools.common import add_data_source, non_negative_float, non_negative_int, positive_int

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
        "--id-prefix", default="r", help="row ids are PREFIX0, PREFIX1, ... (default: %(default)s)"
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


def resolve_target(args) -> KafkaTarget:
    from iolstream.kafka.config import TopicsConfig, load_config

    topics, client, bootstrap = TopicsConfig(), {}, DEFAULT_BOOTSTRAP
    dead = None
    if args.config:
        cfg = load_config(args.config)
        topics, client, bootstrap = cfg.topics, dict(cfg.kafka.client), cfg.kafka.bootstrap_servers
        dead = cfg.topics.dead_letters
    conf = {**client, "bootstrap.servers": args.bootstrap or bootstrap}
    target = KafkaTarget(
        conf,
        args.features_topic or topics.features,
        args.labels_topic or topics.labels,
        args.predictions_topic or topics.predictions,
        dead,
        topics.partitions,
        topics.replication_factor,
    )
    names = [target.features, target.labels, target.predictions]
    if len(set(names)) != 3:
        raise ValueError(f"the features, labels and predictions topics must differ, got {names}")
    return target


def load_rows(args):
    """(X, y, task, description) of the data set, shuffled and capped as asked."""
    from iolstream.tools import datasets
    from iolstream.tools.csvdata import load_csv

    if args.csv is not None and not args.target:
        raise ValueError("--csv needs --target COLUMN")
    if args.csv is None and args.target:
        raise ValueError("--target applies only to --csv")
    if args.csv is not None:
        ds = load_csv(args.csv, args.target)
    elif args.dataset not in datasets.DATASETS:
        raise datasets.DataError(
            f"unknown data set {args.dataset!r}; valid names: {', '.join(datasets.DATASETS)}"
        )
    elif args.dataset == "poker":
        ds = datasets.load("poker", rows=args.rows, seed=args.seed)
    else:
        ds = datasets.load(args.dataset, seed=args.seed)
    order = np.random.default_rng(args.seed).permutation(ds.n_rows) if args.shuffle else np.arange(ds.n_rows)
    if args.rows is not None:
        order = order[: args.rows]
    return np.ascontiguousarray(ds.X[order]), ds.y[order], ds.task, ds.description


def main(args) -> int:
    import sys

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
        id_prefix=args.id_prefix,
        seed=args.seed,
    )
    target = resolve_target(args)
    X, y, task, description = load_rows(args)
    n = len(X)
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    say(
        f"{description}\nsending {n} rows to {target.features} (labels to {target.labels}) "
        f"via {target.client_conf['bootstrap.servers']}"
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
        follower = Follower(target.client_conf, target.predictions, row_ids(n, options), y, task).start()
    metric_name = "acc" if task == "classification" else "rmse"
    reporter = _Reporter(n, enabled=not args.quiet)

    def status(rows_sent: int) -> str:
        if follower is None:
            return f"{rows_sent}/{n} rows sent"
        return (
            f"{rows_sent}/{n} rows sent, {follower.predicted} predicted, "
            f"prequential {metric_name} {follower.metric():.4f}"
        )

    sent_rows = [0]

    def progress(rows_sent: int) -> None:
        sent_rows[0] = rows_sent
        reporter.update(rows_sent, status(rows_sent))

    try:
        summary = send(
            iter_plan(X, y, options),
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
    if not done:
        print(
            f"iolstream produce: error: {n - follower.predicted} rows got no prediction within "
            f"{args.follow_timeout:.0f} s of the last one",
            file=sys.stderr,
        )
        return 1
    return 0


class _Reporter:
    """A progress bar on a terminal; elsewhere (logs, CI) one plain line every few seconds."""

    def __init__(self, total: int, *, enabled: bool, every_seconds: float = 3.0):
        import sys

        from iolstream.tools.progress import ProgressBar

        self.bar = ProgressBar(total, "produce", enabled=None if enabled else False)  # None: on a terminal
        self.lines = enabled and not self.bar.enabled
        self.every = every_seconds
        self.last = 0.0
        self.stream = sys.stderr

    def update(self, done: int, text: str, *, force: bool = False) -> None:
        if self.bar.enabled:
            self.bar.update(done, text, force=force)
        elif self.lines and (force or time.monotonic() - self.last >= self.every):
            self.last = time.monotonic()
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()
