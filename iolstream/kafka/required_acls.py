"""The required ACLs: what a worker needs on a broker that enforces them, one list in three forms.

``worker_acls(cfg)`` derives them from a worker config; ``kafka_acls_lines`` renders them as
``kafka-acls`` commands (docs/operations.md shows them, ``iolstream acls`` prints them for a config),
``acl_bindings`` as confluent-kafka ``AclBinding`` objects (the tests grant exactly these and nothing
more). ``producer_acls`` is the same for ``iolstream produce``.

What each one is for (Kafka's own implications apply: Read and Write imply Describe, and since Kafka 3.0
Write on any topic implies the cluster's IdempotentWrite, which the idempotent producers need):

- input: Read on the features and labels topics, Read on the consumer group (joins, offset commits);
- output: Write on the predictions and dead-letter topics, DescribeConfigs on them (the size limits
  of dead letters are read at start, ``deadletters.start_limit``);
- exactly-once: Write on the transactional id (Describe implied), used with the group's Read above
  for the offsets committed in each transaction;
- ``topics.create``: Create on each topic the worker creates when missing;
- group learning: Read and Write on the model-deltas topic, Read on the members' deltas groups
  (``<group_id>.deltas.<member>``, prefixed), and with exactly-once Write on the members' transactional
  ids (``<group_id>-<member>``, prefixed, unless ``durability.transactional_id`` names one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from iolstream.kafka.config import WorkerConfig

# kafka-acls option of each resource type (cluster takes no name)
_RESOURCE_OPTION = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}


@dataclass(frozen=True)
class Acl:
    """One allow rule: ``operation`` (kafka-acls spelling: Read, Write, Create, DescribeConfigs, ...) on a
    resource of type ``resource`` ("topic", "group", "transactional-id", "cluster") named ``name``,
    matched literally or as a prefix (``pattern``); ``why`` says what needs it."""

    resource: str
    name: str
    operation: str
    pattern: str = "literal"
    why: str = ""


def worker_acls(cfg: WorkerConfig) -> list[Acl]:
    """Every ACL ``iolstream run`` needs with this config, nothing more (module docstring)."""
    t, group = cfg.topics, cfg.kafka.group_id
    acls = [
        Acl("topic", t.features, "Read", why="input"),
        Acl("topic", t.labels, "Read", why="input"),
        Acl("group", group, "Read", why="consumer group: join, commit offsets"),
        Acl("topic", t.predictions, "Write", why="output"),
        Acl("topic", t.dead_letters, "Write", why="output"),
        Acl("topic", t.predictions, "DescribeConfigs", why="size limits read at start"),
        Acl("topic", t.dead_letters, "DescribeConfigs", why="size limits read at start"),
    ]
    if t.forget:
        acls += [
            Acl("topic", t.forget, "Read", why="forget requests"),
            Acl("topic", t.forget_receipts, "Write", why="forget receipts"),
        ]
    if cfg.group.enabled:
        acls += [
            Acl("topic", t.model_deltas, "Read", why="group learning"),
            Acl("topic", t.model_deltas, "Write", why="group learning"),
            Acl(
                "group",
                f"{group}.deltas.",
                "Read",
                "prefixed",
                why="group learning: each member's deltas reader",
            ),
        ]
    if cfg.durability.exactly_once:
        if cfg.group.enabled and not cfg.durability.transactional_id:
            acls.append(
                Acl("transactional-id", f"{group}-", "Write", "prefixed", why="exactly-once, per member")
            )
        else:
            acls.append(Acl("transactional-id", cfg.transactional_id, "Write", why="exactly-once"))
    if t.create:
        created = [t.features, t.labels, t.predictions, t.dead_letters]
        if cfg.group.enabled:
            created.append(t.model_deltas)
        if t.forget:
            created += [t.forget, t.forget_receipts]
        acls += [Acl("topic", name, "Create", why="topics.create") for name in created]
    return acls


def producer_acls(features: str, labels: str, *, create: bool = False) -> list[Acl]:
    """The ACLs of ``iolstream produce`` (an idempotent producer): Write on both topics, and Create on them
    with ``--create-topics``."""
    acls = [Acl("topic", features, "Write", why="features"), Acl("topic", labels, "Write", why="labels")]
    if create:
        acls += [Acl("topic", name, "Create", why="--create-topics") for name in (features, labels)]
    return acls


def kafka_acls_lines(
    acls: list[Acl],
    principal: str,
    *,
    bootstrap: str = "$BOOTSTRAP",
    command_config: str = "admin.properties",
    command: str = "kafka-acls.sh",
) -> list[str]:
    """One ``kafka-acls --add`` command per ACL, for ``principal`` (e.g. "User:worker")."""
    lines = []
    for acl in acls:
        target = "--cluster" if acl.resource == "cluster" else f"{_RESOURCE_OPTION[acl.resource]} {acl.name}"
        pattern = "" if acl.pattern == "literal" else f" --resource-pattern-type {acl.pattern}"
        lines.append(
            f"{command} --bootstrap-server {bootstrap} --command-config {command_config} --add "
            f"--allow-principal {principal} --operation {acl.operation} {target}{pattern}"
        )
    return lines


def acl_bindings(acls: list[Acl], principal: str, host: str = "*") -> list:
    """The same ACLs as confluent-kafka ``AclBinding`` objects, for ``AdminClient.create_acls``."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    types = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional-id": ResourceType.TRANSACTIONAL_ID,
        "cluster": ResourceType.BROKER,
    }
    return [
        AclBinding(
            types[acl.resource],
            "kafka-cluster" if acl.resource == "cluster" else acl.name,
            ResourcePatternType[acl.pattern.upper()],
            principal,
            host,
            AclOperation[_snake(acl.operation).upper()],
            AclPermissionType.ALLOW,
        )
        for acl in acls
    ]


def _snake(operation: str) -> str:
    """ "DescribeConfigs" -> "describe_configs"."""
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(operation))


def settings(cfg: WorkerConfig) -> list[tuple[str, list[Acl]]]:
    """The worker's ACLs setting by setting, for the docs: the at-least-once base (``topics.create`` off), then
    what each setting adds to it. ``cfg`` gives the names (topics, group id, transactional id)."""

    def variant(*, exactly_once=False, group=False, create=False) -> list[Acl]:
        return worker_acls(
            replace(
                cfg,
                durability=replace(cfg.durability, exactly_once=exactly_once),
                group=replace(cfg.group, enabled=group),
                topics=replace(cfg.topics, create=create),
            )
        )

    base = variant()

    def adds(acls: list[Acl]) -> list[Acl]:
        return [a for a in acls if a not in base]

    return [
        ("At-least-once, `topics.create` off", base),
        ("Exactly-once adds", adds(variant(exactly_once=True))),
        ("Group learning adds", adds(variant(group=True))),
        (
            "Group learning with exactly-once: instead of the exactly-once line",
            [a for a in adds(variant(group=True, exactly_once=True)) if a not in variant(group=True)],
        ),
        ("With `topics.create` on, add", adds(variant(create=True))),
        (
            "With `topics.create` on and group learning, also",
            [
                a
                for a in adds(variant(group=True, create=True))
                if a not in variant(group=True) + variant(create=True)
            ],
        ),
    ]


def render_markdown(cfg: WorkerConfig, principal: str = "User:worker") -> str:
    """``settings(cfg)`` as the Markdown docs/operations.md shows (a test keeps the two equal)."""
    parts = []
    for title, acls in settings(cfg):
        parts.append(
            f"{title[0].upper()}{title[1:]}:\n\n```sh\n"
            + "\n".join(kafka_acls_lines(acls, principal))
            + "\n```"
        )
    return "\n\n".join(parts) + "\n"
