"""``iolstream topics -c CONFIG``: the ``kafka-topics`` commands that create the topics a worker of CONFIG uses, as
the worker would create them itself (``topics.create: true``); ``--create`` creates the missing ones with the
config's own client settings instead (the principal needs Create on them).

For a cluster where the worker may not create topics (``topics.create: false``, docs/operations.md "Secured
Kafka"): an admin runs the printed lines. Partitions and replication come from ``topics.partitions`` and
``topics.replication_factor``; the input and dead-letter topics get a ``max.message.bytes`` that fits
``stream.max_message_bytes`` when Kafka's default does not; with group learning the model-deltas topic is one
partition, compacted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


def add_parser(subparsers):
    p = subparsers.add_parser(
        "topics",
        help="the kafka-topics lines creating a worker config's topics (or --create them)",
        description=(
            "Print one kafka-topics command per topic the worker of CONFIG uses (features, labels, predictions, "
            "dead letters, and the model-deltas topic with group learning), with the partitions, replication and "
            "configs the worker would create it with; --create creates the missing ones with the config's client."
        ),
    )
    p.add_argument("-c", "--config", required=True, help="worker YAML")
    p.add_argument(
        "--create", action="store_true", help="create the missing topics now (needs Create on them)"
    )
    p.add_argument("--bootstrap", help="override kafka.bootstrap_servers (in the lines, and for --create)")
    p.add_argument(
        "--command-config",
        default="admin.properties",
        help="the admin's client settings file named in the lines (default: %(default)s)",
    )
    p.add_argument(
        "--command", default="kafka-topics.sh", dest="tool", help="the tool's name (default: %(default)s)"
    )
    p.set_defaults(func=main)
    return p


@dataclass(frozen=True)
class Planned:
    """One topic as the worker creates it."""

    name: str
    key: str  # the configuration key naming it
    partitions: int
    replication_factor: int
    configs: dict = field(default_factory=dict)


def planned(cfg) -> list[Planned]:
    """The topics of ``cfg`` as the worker creates them (``kafka.topics.ensure_topics``, ``group.GroupSync.open``)."""
    from iolstream.kafka import message_limits
    from iolstream.kafka.topics import delta_topic_config

    t = cfg.topics
    sized = message_limits.topic_configs(cfg.stream.max_message_bytes, [t.features, t.labels, t.dead_letters])
    out = [
        Planned(name, key, t.partitions, t.replication_factor, sized.get(name, {}))
        for name, key in (
            (t.features, "topics.features"),
            (t.labels, "topics.labels"),
            (t.predictions, "topics.predictions"),
            (t.dead_letters, "topics.dead_letters"),
        )
    ]
    if cfg.group.enabled:
        deltas = delta_topic_config(cfg.group.chunk_bytes)
        out.append(Planned(t.model_deltas, "topics.model_deltas", 1, t.replication_factor, deltas))
    return out


def lines(wanted: list[Planned], *, bootstrap: str, command_config: str, command: str) -> list[str]:
    """One kafka-topics command per topic.

    >>> lines([Planned("f", "topics.features", 2, 1, {"max.message.bytes": "2008192"})], bootstrap="b:9093",
    ...       command_config="admin.properties", command="kafka-topics.sh")[0]
    'kafka-topics.sh --bootstrap-server b:9093 --command-config admin.properties --create --if-not-exists --topic f --partitions 2 --replication-factor 1 --config max.message.bytes=2008192'
    """
    out = []
    for p in wanted:
        argv = [
            *shlex.split(command),
            "--bootstrap-server",
            bootstrap,
            *(["--command-config", command_config] if command_config else []),
            "--create",
            "--if-not-exists",
            "--topic",
            p.name,
            "--partitions",
            str(p.partitions),
            "--replication-factor",
            str(p.replication_factor),
        ]
        for key, value in p.configs.items():
            argv += ["--config", f"{key}={value}"]
        out.append(shlex.join(argv))
    return out


def main(args) -> int:
    import dataclasses
    import sys

    from iolstream.kafka.config import load_config

    cfg = load_config(args.config)
    if args.bootstrap:
        cfg = dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=args.bootstrap))
    wanted = planned(cfg)
    if not args.create:
        for line in lines(
            wanted,
            bootstrap=cfg.kafka.bootstrap_servers,
            command_config=args.command_config,
            command=args.tool,
        ):
            print(line)
        return 0
    created = create(cfg, wanted)
    have = [p.name for p in wanted if p.name not in created]
    if created:
        print(f"created {', '.join(created)}")
    if have:
        print(f"{'already there' if created else 'all there already'}: {', '.join(have)}", file=sys.stderr)
    return 0


def create(cfg, wanted: list[Planned]) -> list[str]:
    """Create the missing ones of ``wanted`` with the config's client; returns those created. A refusal is
    ``AccessDenied`` (exit 6), an unreachable broker a ``WorkerError`` (exit 3), one line each."""
    from confluent_kafka import KafkaException

    from iolstream.kafka import diagnose, topics
    from iolstream.kafka.clients import client_conf
    from iolstream.kafka.config import check_login
    from iolstream.kafka.errors import AccessDenied, WorkerError

    check_login(cfg.kafka)
    conf = client_conf(cfg)
    meta, why = diagnose.probe(conf, 10.0)
    if why is not None:
        raise (AccessDenied if why.refusal else WorkerError)(why)
    admin = diagnose.new_admin(conf)
    created = []
    try:
        for p in wanted:
            created += topics.create_topics(
                admin,
                [p.name],
                partitions=p.partitions,
                replication_factor=p.replication_factor,
                configs={p.name: p.configs},
            )
    except KafkaException as exc:
        line = diagnose.explain(exc, conf, operation="Create", resource=diagnose.named("topic", p.name))
        raise (AccessDenied if line.refusal else WorkerError)(line) from None
    return created
