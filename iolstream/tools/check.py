"""``iolstream check -c CONFIG [--csv FILE --target COL]``: is everything ready for a first ``run``?

One line per finding, ``ok``, ``warn`` or ``FAIL``, then the exit code:

    0   ready
    2   a config or data problem: the config does not load or contradicts itself, or the CSV does not
        fit the model (its width against model.n_inputs, its labels against model.classes)
    3   a cluster problem (and the config and data are fine): the broker does not answer within
        --timeout, a topic is missing (topics.create false), or the features and labels topics differ
        in partition count; or the newest snapshot was made with another model config (``run`` would stop
        with the same line and code)
    6   the broker refused (and the config and data are fine): authentication fails, its TLS certificate
        is not trusted, or an ACL of the worker's list (``iolstream acls``) is missing: Read on the inputs
        and the group, Write on the outputs, Create on a topic to create, Write on the transactional id
        (exactly-once); the line is the one ``iolstream run`` would stop with (same code)

Both 3 and 6 found: 6. The cluster probes (``kafka.access_probes``, the worker's own at start) write nothing into a
user topic. The broker's address comes from the config (``kafka.bootstrap_servers``, or ``--bootstrap``)
and its client settings from ``kafka.client``.
"""

from __future__ import annotations

EXIT_READY, EXIT_CONFIG, EXIT_CLUSTER, EXIT_ACCESS = 0, 2, 3, 6


def add_parser(subparsers):
    from iolstream.tools.arguments import non_negative_float

    p = subparsers.add_parser(
        "check",
        help="check a config, its cluster and a CSV before a first run",
        description=(
            "Check a worker config before its first run: the config itself, the broker, the topics and their "
            "partition counts, what the principal may do, and a CSV sample against the model. One line per "
            "finding; exit 0 ready, 2 config or data problem, 3 cluster problem, 6 refused by the broker "
            "(authentication, TLS trust, a missing ACL)."
        ),
    )
    p.add_argument("-c", "--config", required=True, help="worker YAML (see config/worker.yaml)")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="override kafka.bootstrap_servers")
    p.add_argument("--csv", metavar="FILE", help="a CSV sample of the data to send")
    p.add_argument(
        "--target", metavar="COLUMN", help="the CSV's label column (default: the config's events.label_field)"
    )
    p.add_argument(
        "--rows", type=int, default=10_000, metavar="N", help="CSV rows read (default: %(default)s)"
    )
    p.add_argument(
        "--timeout",
        type=non_negative_float,
        default=10.0,
        metavar="S",
        help="the broker must answer within S seconds (default: %(default)s)",
    )
    p.set_defaults(func=main)
    return p


class Report:
    """Prints findings as they come; remembers whether any config/data or cluster check failed."""

    def __init__(self, stream=None):
        import sys

        self.stream = stream or sys.stdout
        self.config_failed = self.cluster_failed = self.refused = False

    def say(self, ok: bool, what: str, line: str, *, warning: bool = False, cluster: bool = True) -> None:
        status = "FAIL" if not ok else ("warn" if warning else "ok")
        print(f"{status:<4}  {what}: {line}", file=self.stream, flush=True)
        if not ok:
            if not cluster:
                self.config_failed = True
            elif getattr(line, "refusal", False):  # a diagnose.Explanation
                self.refused = True
            else:
                self.cluster_failed = True

    @property
    def code(self) -> int:
        if self.config_failed:
            return EXIT_CONFIG
        return EXIT_ACCESS if self.refused else EXIT_CLUSTER if self.cluster_failed else EXIT_READY


def main(args) -> int:
    import dataclasses

    from iolstream.kafka.config import ConfigError, check_login, load_config
    from iolstream.ops import logs

    report = Report()
    if args.target and not args.csv:
        raise ValueError("--target applies to --csv")
    try:
        cfg = load_config(args.config)
        check_login(cfg.kafka)
    except ConfigError as exc:
        report.say(False, "config", str(exc), cluster=False)
        return report.code
    target = args.target
    if args.csv and not target:  # named-field events name their label field; arrays have none to name
        if cfg.model.schema is None:
            raise ValueError(
                "--csv needs --target COLUMN (the config's rows are arrays: no label field to take)"
            )
        target = cfg.events.label_field
    if args.bootstrap:
        cfg = dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=args.bootstrap))
    logs.setup("WARNING", cfg.logging.format)  # librdkafka's complaints through the repeat filter, never raw
    check_config(cfg, args.config, report)
    check_snapshot(cfg, report)
    if args.csv:
        check_csv(cfg, args.csv, target, args.rows, report)
    try:
        check_cluster(cfg, args.timeout, report)
    except ConfigError as exc:  # client settings librdkafka refuses (diagnose.settings_refused)
        report.say(False, "config", str(exc), cluster=False)
    return report.code


def check_config(cfg, path: str, report: Report) -> None:
    from iolstream.kafka.clients import check_timing
    from iolstream.kafka.config import env_overrides
    from iolstream.kafka.errors import WorkerError

    try:
        warnings = check_timing(cfg)
    except WorkerError as exc:
        report.say(False, "config", str(exc), cluster=False)
        return
    m = cfg.model
    target = f"classes {', '.join(map(str, m.classes))}" if m.classes else f"{m.n_outputs} regression outputs"
    exactly = "exactly-once" if cfg.durability.exactly_once else "at-least-once"
    report.say(
        True, "config", f"{path}: {m.n_inputs} inputs, {target}; mode {m.mode}, {exactly}", cluster=False
    )
    overrides = env_overrides()
    if overrides:
        keys = ", ".join(f"{key} ({name})" for key, name in overrides.items())
        report.say(True, "config", f"from the environment: {keys}", cluster=False)
    for warning in warnings:
        report.say(True, "config", warning, warning=True, cluster=False)
    memory, snapshot = footprint_lines(cfg)
    report.say(True, "memory", memory, cluster=False)
    report.say(True, "snapshot size", snapshot, cluster=False)


def footprint_lines(cfg) -> tuple[str, str]:
    """The memory formula's value for ``cfg`` and a snapshot's size (``ops.footprint``), as two findings."""
    import os

    from iolstream.ops import footprint

    est = footprint.memory(cfg, threads=os.cpu_count() or 1)
    mb = lambda v: f"{v / 2**20:,.{1 if v < 10 * 2**20 else 0}f} MB"  # noqa: E731
    parts = est.parts
    model = sum(v for k, v in parts.items() if k.startswith("model."))
    memory = (
        f"at most {mb(est.total)}: set the pod's memory limit above it (process {mb(parts['process'])}, model "
        f"{mb(model)}, remembered ids {mb(parts['remembered_ids'])}, snapshot writing {mb(parts['snapshot_write'])}, "
        f"stores at their bounds {mb(est.total - est.fixed)}); about {mb(est.fixed)} while it keeps up with its "
        "input (docs/operations.md#memory-bounds)"
    )
    if cfg.group.enabled:
        each = footprint.snapshot_model_bytes(cfg.model, cfg.stream.batch_rows)
        memory += f"; with group learning {mb(each)} more for each other member"
    model_snapshot = footprint.snapshot_model_bytes(cfg.model, cfg.stream.batch_rows)
    snapshot = (
        f"{mb(model_snapshot)} of model sums, up to {mb(footprint.snapshot_bytes(cfg))} with every store full; "
        f"{cfg.snapshot.keep} kept in {cfg.snapshot.dir}"
    )
    return memory, snapshot


def check_snapshot(cfg, report: Report) -> None:
    """The newest valid snapshot in the worker's directory, as ``run`` would load it: a model config it was not
    made with is the line ``run`` stops with (exit 3, as run's)."""
    from iolstream.kafka.resume import mismatch
    from iolstream.kafka.snapshots import SnapshotError, SnapshotStore

    store = SnapshotStore(cfg.snapshot_dir, cfg.snapshot.keep)
    try:
        snap = store.load_latest()
    except SnapshotError as exc:
        report.say(False, "snapshot", f"cannot load the snapshots in {store.dir}: {exc}")
        return
    if snap is None:
        report.say(True, "snapshot", f"none in {store.dir}: the worker starts a fresh model")
        return
    why = mismatch(cfg, snap)
    if why is not None:
        report.say(False, "snapshot", why)
        return
    counters = snap.manifest.get("stream", {}).get("counters", {})
    report.say(
        True,
        "snapshot",
        f"{snap.path}: its model config is this one; the worker resumes from it "
        f"({counters.get('rows_in', 0)} rows in, {counters.get('rows_learned', 0)} labelled)",
    )


def check_csv(cfg, path: str, target: str, rows: int, report: Report) -> None:
    from iolstream.tools.csv_file import load_csv
    from iolstream.tools.dataset import DataError
    from iolstream.tools.fit import mismatches

    try:
        if cfg.model.schema is not None:  # named fields: every row through the schema, as produce sends it
            X, y, task, n, width = _schema_rows(cfg, path, target, rows)
        else:
            ds = load_csv(path, target, task=cfg.model.task, rows=rows)
            X, y, task, n, width = ds.X, ds.y, ds.task, ds.n_rows, ds.X.shape[1]
    except DataError as exc:
        report.say(False, "csv", str(exc), cluster=False)
        return
    found = mismatches(X, y, task, cfg.model)
    for line in found:
        report.say(False, "csv", f"{path}: {line}", cluster=False)
    if not found:
        report.say(True, "csv", f"{path}: {n} rows fit the model ({width} features)", cluster=False)


def _schema_rows(cfg, path: str, target: str, rows: int):
    """(records, labels, task, rows, inputs) of a CSV read by the config's feature schema; DataError naming a
    missing column or the rows the schema refuses."""
    from iolstream.tools.csv_file import load_table
    from iolstream.tools.records import choose_schema, declared_labels, table_records

    table = load_table(path, target, task=cfg.model.task, rows=rows)
    schema = choose_schema(table, cfg.model.schema, source="the config")
    records = table_records(table, schema)
    return records, declared_labels(table.y, cfg.model), table.task, table.n_rows, schema.width


def check_cluster(cfg, timeout: float, report: Report) -> None:
    from iolstream.kafka import diagnose
    from iolstream.kafka.access_probes import Access, no_collection
    from iolstream.kafka.clients import client_conf

    conf = client_conf(cfg)
    meta, why = diagnose.probe(conf, timeout)
    if why is not None:
        report.say(False, "broker", why)
        return
    brokers = len(meta.brokers)
    report.say(
        True, "broker", f"{conf['bootstrap.servers']} answers ({brokers} broker{'s' * (brokers != 1)})"
    )
    with no_collection():  # kafka.access_probes: no collection on librdkafka's thread
        findings = Access(cfg, conf, timeout=max(timeout, 1.0)).all()
    for f in findings:
        report.say(f.ok, f.what, f.line, warning=f.warning)
