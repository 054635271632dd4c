"""``iolstream acls -c worker.yaml``: the ``kafka-acls`` commands that grant a worker with this config exactly the
ACLs it needs on a broker that enforces them (``kafka.required_acls``; docs/operations.md "Secured Kafka")."""

from __future__ import annotations


def add_parser(subparsers):
    p = subparsers.add_parser(
        "acls",
        help="the kafka-acls lines granting a worker (or producer) exactly what it needs",
        description=(
            "Print one kafka-acls command per ACL the worker of this config needs (input, consumer group, output, "
            "exactly-once, group learning, topics.create, as configured); with --producer, those of "
            "`iolstream produce` for the config's features and labels topics."
        ),
    )
    p.add_argument("-c", "--config", required=True, help="worker YAML")
    p.add_argument(
        "--principal",
        help="who is granted (default: User:<kafka.client sasl.username>, else User:worker)",
    )
    p.add_argument("--producer", action="store_true", help="the ACLs of `iolstream produce` instead")
    p.add_argument(
        "--create-topics", action="store_true", help="with --producer: also Create (produce --create-topics)"
    )
    p.add_argument("--bootstrap", help="in the lines (default: the config's kafka.bootstrap_servers)")
    p.add_argument(
        "--command-config",
        default="admin.properties",
        help="the admin's client settings file named in the lines (default: %(default)s)",
    )
    p.add_argument(
        "--command", default="kafka-acls.sh", dest="tool", help="the tool's name (default: %(default)s)"
    )
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    from iolstream.kafka import required_acls
    from iolstream.kafka.config import load_config

    cfg = load_config(args.config)
    if args.create_topics and not args.producer:
        raise ValueError("--create-topics goes with --producer (the worker's Create follows topics.create)")
    principal = args.principal or f"User:{cfg.kafka.client.get('sasl.username', 'worker')}"
    if ":" not in principal:
        raise ValueError(f"--principal: expected TYPE:NAME such as User:worker, got {principal!r}")
    wanted = (
        required_acls.producer_acls(cfg.topics.features, cfg.topics.labels, create=args.create_topics)
        if args.producer
        else required_acls.worker_acls(cfg)
    )
    for line in required_acls.kafka_acls_lines(
        wanted,
        principal,
        bootstrap=args.bootstrap or cfg.kafka.bootstrap_servers,
        command_config=args.command_config,
        command=args.tool,
    ):
        print(line)
    return 0
