"""Worker configuration: frozen dataclasses loaded from YAML, validated at load.

Every key is checked when the file loads (never on the first message); an error
names the key and what is allowed. Environment variables override the file:
``IOLSTREAM_<SECTION>__<KEY>=value`` (double underscore between levels, value
parsed as a YAML scalar), e.g. ``IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS=broker:9092``
or ``IOLSTREAM_STREAM__BATCH_ROWS=512``. A variable that looks like an override but names no key
(``IOLSTREAM_STREAM_BATCH_ROWS``) is refused with the nearest valid name (``check_environment``).
``config/worker.yaml`` documents every key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import socket
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from iolstream.core.model import ModelConfig
from iolstream.stream.config import EventsConfig, StreamConfig
from iolstream.stream.prequential import CLASSIFICATION_METRICS, REGRESSION_METRICS
from iolstream.stream.retention import RetentionConfig

ENV_PREFIX = "IOLSTREAM_"


class ConfigError(ValueError):
    """A configuration value that is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class KafkaConfig:
    """The ``kafka`` section: the broker, the consumer group, librdkafka settings per client kind."""

    bootstrap_servers: str = "127.0.0.1:19092"
    group_id: str = "iolstream"
    client: dict = field(
        default_factory=dict
    )  # librdkafka settings for every client (security.protocol, sasl.*, ssl.*)
    consumer: dict = field(default_factory=dict)  # extra consumer settings
    producer: dict = field(default_factory=dict)  # extra producer settings
    poll_timeout_ms: int = 100
    call_timeout_seconds: float = (
        30.0  # one blocking client call (flush, commit, a transaction step); abandoned 5 s past it
    )
    connect_timeout_seconds: float = 60.0  # at start, wait this long for the broker to answer, then exit 3


@dataclass(frozen=True)
class TopicsConfig:
    """The ``topics`` section: the names of the input, output and model-deltas topics, and whether to
    create them."""

    features: str = "iol.features"
    labels: str = "iol.labels"
    predictions: str = "iol.predictions"
    dead_letters: str = "iol.dead-letters"
    model_deltas: str = "iol.model-deltas"  # group learning: the members' sums (one partition, compacted)
    forget: str | None = None  # forget requests {"id"} / {"ids"} (docs/data-protection.md); None: none taken
    forget_receipts: str = (
        "iol.forget-receipts"  # one receipt per row forgotten, once a snapshot without it is durable
    )
    create: bool = True
    partitions: int = 1
    replication_factor: int = 1


@dataclass(frozen=True)
class SnapshotConfig:
    """The ``snapshot`` section: where snapshots go, how often, how many are kept."""

    dir: str = "snapshots"
    every_batches: int = 200
    every_seconds: float = 60.0
    keep: int = 3
    first_after_seconds: float | None = (
        1.0  # after a (re)start, the first snapshot this soon (null: the cadence above)
    )


@dataclass(frozen=True)
class DurabilityConfig:
    """The ``durability`` section: at-least-once or exactly-once, the shutdown grace, the watchdog."""

    exactly_once: bool = False
    transactional_id: str | None = None  # default: "<group_id>-worker"
    shutdown_grace_seconds: float = 25.0
    watchdog_seconds: float | None = (
        None  # exit 5 when the loop has not ticked this long (null: from the client timeouts)
    )


@dataclass(frozen=True)
class GroupConfig:
    """Group learning (docs/scaling.md): the members of the consumer group share one model."""

    enabled: bool = False
    member_id: str | None = None  # unique in the group and the same after a restart (default: the host name)
    sync_every_ms: int = 1000  # a member publishes its sums this often (and before every checkpoint)
    chunk_bytes: int = (
        900000  # larger records go as chunks of this many bytes (Kafka's default limit is 1 MiB)
    )
    # a forget request for an id this member never saw is passed on to the others; after this long without
    # every answer it is closed, and the ids no answer held are refused (docs/data-protection.md)
    forward_wait_ms: int = 30000


@dataclass(frozen=True)
class MetricsConfig:
    """The ``metrics`` section: the HTTP endpoint (metrics, health) and the prequential window."""

    port: int = 9108  # 0 disables the HTTP endpoint (metrics, /healthz, /readyz)
    host: str = "0.0.0.0"
    window_rows: int = 1000  # sliding window of the prequential metrics
    # the prequential metric the status line leads with (stream.prequential): accuracy, log_loss, brier, roc_auc
    # (two classes), balanced_accuracy; rmse, mae (regression). Null: accuracy, or rmse
    primary: str | None = None


@dataclass(frozen=True)
class LoggingConfig:
    """The ``logging`` section: level, text or JSON lines, how often the status line is written."""

    level: str = "INFO"
    format: str = "text"  # text | json
    status_every_seconds: float = 5.0


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's whole configuration, one frozen section per YAML section, validated when loaded."""

    model: ModelConfig
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    events: EventsConfig = field(default_factory=EventsConfig)  # named-field events (model.features)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    durability: DurabilityConfig = field(default_factory=DurabilityConfig)
    group: GroupConfig = field(default_factory=GroupConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def member_id(self) -> str:
        """This worker's id in group learning (``group.member_id``, else the host name)."""
        return self.group.member_id or socket.gethostname()

    @property
    def transactional_id(self) -> str:
        """``durability.transactional_id``, else "<group_id>-worker" (group learning:
        "<group_id>-<member_id>", one per member: members sharing one would fence each other)."""
        if self.durability.transactional_id:
            return self.durability.transactional_id
        return (
            f"{self.kafka.group_id}-{self.member_id}"
            if self.group.enabled
            else f"{self.kafka.group_id}-worker"
        )

    @property
    def snapshot_dir(self) -> str:
        """Where this worker's snapshots go: ``snapshot.dir``, with group learning its ``<member_id>`` below
        it."""
        return os.path.join(self.snapshot.dir, self.member_id) if self.group.enabled else self.snapshot.dir

    @property
    def retention_dir(self) -> str | None:
        """Where the retention store of forget requests goes: ``retention.dir`` (group learning: its
        ``<member_id>`` below it), else ``retention`` below the snapshot directory; None without
        ``topics.forget``, or with ``retention.rows`` 0 (no rows kept)."""
        if self.topics.forget is None or not self.retention.rows:
            return None
        if self.retention.dir is None:
            return os.path.join(self.snapshot_dir, "retention")
        return os.path.join(self.retention.dir, self.member_id) if self.group.enabled else self.retention.dir


_SECTIONS = {
    "kafka": KafkaConfig,
    "topics": TopicsConfig,
    "stream": StreamConfig,
    "events": EventsConfig,
    "snapshot": SnapshotConfig,
    "durability": DurabilityConfig,
    "group": GroupConfig,
    "retention": RetentionConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
}

# Range rules: key -> (predicate, description)
_POSITIVE = (lambda v: v >= 1, "an integer ≥ 1")
_RULES = {
    "kafka.poll_timeout_ms": _POSITIVE,
    "kafka.call_timeout_seconds": (lambda v: v >= 1, "a number ≥ 1"),
    "kafka.connect_timeout_seconds": (lambda v: v >= 1, "a number ≥ 1"),
    "topics.partitions": _POSITIVE,
    "topics.replication_factor": _POSITIVE,
    "snapshot.every_batches": _POSITIVE,
    "snapshot.every_seconds": (lambda v: v > 0, "a number > 0"),
    "snapshot.keep": _POSITIVE,
    "snapshot.first_after_seconds": (lambda v: v is None or v >= 0, "null or a number ≥ 0"),
    "durability.shutdown_grace_seconds": (lambda v: v > 0, "a number > 0"),
    "durability.watchdog_seconds": (lambda v: v is None or v > 0, "null or a number > 0"),
    "group.sync_every_ms": _POSITIVE,
    "group.chunk_bytes": (lambda v: v >= 1024, "an integer ≥ 1024"),
    "group.forward_wait_ms": _POSITIVE,
    "group.member_id": (
        lambda v: v is None or (0 < len(v) <= 200 and "/" not in v),
        "null or a name without '/' (≤ 200 chars)",
    ),
    "metrics.port": (lambda v: 0 <= v <= 65535, "a port number 0–65535 (0 disables)"),
    "metrics.window_rows": _POSITIVE,
    "logging.level": (
        lambda v: v in ("DEBUG", "INFO", "WARNING", "ERROR"),
        "one of DEBUG, INFO, WARNING, ERROR",
    ),
    "logging.format": (lambda v: v in ("text", "json"), "one of text, json"),
    "logging.status_every_seconds": (lambda v: v > 0, "a number > 0"),
}


def _check_type(key: str, value, annotation):
    """Coerce/validate one scalar against its annotation; raise ConfigError naming the key."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    hints = typing.get_args(annotation) if union else (annotation,)
    if value is None:
        if type(None) in hints:
            return None
        raise ConfigError(f"{key}: must not be null")
    for hint in hints:
        if hint is bool and isinstance(value, bool):
            return value
        if hint is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if hint is str and isinstance(value, str):
            return value
        if hint is dict and isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        if hint is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
    names = " or ".join("null" if h is type(None) else "a list" if h is tuple else h.__name__ for h in hints)
    raise ConfigError(f"{key}: must be {names}, got {value!r}")


def _build_section(name: str, cls, raw) -> object:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError("; ".join(_unknown(f"{name}.{key}", key, known, "key") for key in unknown))
    values = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        value = _check_type(full, value, hints[key])
        rule = _RULES.get(full)
        if rule and not rule[0](value):
            raise ConfigError(f"{full}: must be {rule[1]}, got {value!r}")
        values[key] = value
    try:
        return cls(**values)
    except ValueError as exc:  # a section that validates itself (StreamConfig)
        raise ConfigError(str(exc)) from None


def _build_model(raw) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(
            "model: required mapping (at least model.n_inputs and model.classes or model.n_outputs)"
        )
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError("; ".join(_unknown(f"model.{key}", key, known, "key") for key in unknown))
    if "n_inputs" not in raw and raw.get("features") is None:
        raise ConfigError(
            "model.n_inputs: required (the number of features per row), or model.features (named fields)"
        )
    if raw.get("classes") is not None and "n_outputs" in raw:
        raise ConfigError(
            "model.n_outputs: not with model.classes (classification has one output per class); "
            "keep classes for classification, or n_outputs for regression"
        )
    raw = dict(raw)
    for key in ("classes", "scaler_mean", "scaler_std", "target_mean", "target_std"):
        if raw.get(key) is not None:
            if not isinstance(raw[key], list):
                raise ConfigError(f"model.{key}: must be a list, got {raw[key]!r}")
            raw[key] = tuple(raw[key])
    if isinstance(raw.get("lam"), list):
        raw["lam"] = tuple(raw["lam"])
    for key in ("lam", "forgetting"):  # "auto" in any case; numbers YAML 1.1 leaves as strings (1e4)
        if isinstance(raw.get(key), str):
            text = raw[key].strip().lower()
            try:
                raw[key] = "auto" if text == "auto" else float(text)
            except ValueError:
                pass  # ModelConfig names the key and the bad value
    if raw.get("forgetting") is False:  # YAML reads off / no / false as False: never forget, like null
        raw["forgetting"] = None
    try:
        return ModelConfig(**raw)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith("model.") else f"model: {msg}") from None


def override_names() -> list[str]:
    """Every environment override a key allows, ``IOLSTREAM_<SECTION>__<KEY>``."""
    sections = {"model": ModelConfig, **_SECTIONS}
    return [
        f"{ENV_PREFIX}{name.upper()}__{f.name.upper()}"
        for name, cls in sections.items()
        for f in dataclasses.fields(cls)
    ]


def _dict_keys() -> set[tuple[str, str]]:
    """(section, key) of the keys holding free mappings (kafka.client, ...): any key below them is allowed."""
    sections = {"model": ModelConfig, **_SECTIONS}
    return {
        (name, key)
        for name, cls in sections.items()
        for key, hint in typing.get_type_hints(cls).items()
        if hint is dict
    }


def check_environment(environ) -> None:
    """Refuse an ``IOLSTREAM_`` variable that looks like an override but names no key (ConfigError with the
    nearest valid name): one with a double underscore, or a section's name and one underscore before a key of
    that section or a name close to one (``IOLSTREAM_STREAM_BATCH_ROWS``). Other names are left alone: the
    project's own variables (``IOLSTREAM_KAFKA_DATA`` of scripts/kafka.sh, the tests' and the containers')."""
    names = override_names()
    free = _dict_keys()
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        path = rest.lower().split("__")
        if "__" in rest:
            if name.upper() in names or (len(path) >= 3 and (path[0], path[1]) in free):
                continue  # a key, or a key below kafka.client / kafka.consumer / kafka.producer
        elif not _looks_like_a_key(rest.lower()):
            continue
        near = difflib.get_close_matches(name.upper(), names, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else f"; overrides are {ENV_PREFIX}<SECTION>__<KEY>"
        raise ConfigError(f"environment variable {name}: names no configuration key{hint}")


def _looks_like_a_key(rest: str) -> bool:
    """``<section>_<key>`` with one underscore where the override takes two: the key one of that section's, or
    close to one (as ``check_environment``'s hint finds the nearest)."""
    sections = {"model": ModelConfig, **_SECTIONS}
    for section, cls in sections.items():
        if rest.startswith(f"{section}_"):
            key, keys = rest[len(section) + 1 :], [f.name for f in dataclasses.fields(cls)]
            if key in keys or difflib.get_close_matches(key, keys, n=1, cutoff=0.6):
                return True
    return False


def env_overrides(environ=None) -> dict[str, str]:
    """{configuration key: the variable that sets it} of the ``IOLSTREAM_<SECTION>__<KEY>`` overrides in
    ``environ`` (default: this process' environment), for saying where a value came from.

    >>> env_overrides({"IOLSTREAM_MODEL__N_INPUTS": "5", "IOLSTREAM_KAFKA__CLIENT__sasl.password": "x", "HOME": "/"})
    {'kafka.client.sasl.password': 'IOLSTREAM_KAFKA__CLIENT__sasl.password', 'model.n_inputs': 'IOLSTREAM_MODEL__N_INPUTS'}
    """
    environ = os.environ if environ is None else environ
    found = {}
    for name in sorted(environ):
        rest = name[len(ENV_PREFIX) :]
        if name.startswith(ENV_PREFIX) and "__" in rest:
            found[".".join(rest.lower().split("__"))] = name
    return dict(sorted(found.items()))


def _apply_env(raw: dict, environ) -> dict:
    check_environment(environ)
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name[len(ENV_PREFIX) :]:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {'.'.join(path)} does not name a key inside a section")
        try:
            node[path[-1]] = yaml.safe_load(value) if value != "" else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not a YAML scalar: {exc}") from None
    return raw


def config_from_dict(raw: dict, environ=None) -> WorkerConfig:
    """Build and validate a WorkerConfig from a parsed mapping, applying IOLSTREAM_* overrides."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a YAML mapping of sections")
    raw = _apply_env(raw, os.environ if environ is None else environ)
    unknown = sorted(set(raw) - set(_SECTIONS) - {"model"}, key=str)
    if unknown:
        raise ConfigError(_unknown(str(unknown[0]), str(unknown[0]), {"model", *_SECTIONS}, "section"))
    sections = {name: _build_section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()}
    cfg = WorkerConfig(model=_build_model(raw.get("model")), **sections)
    names = [cfg.topics.features, cfg.topics.labels, cfg.topics.predictions, cfg.topics.dead_letters]
    if len(set(names)) != 4:
        raise ConfigError(
            f"topics: features, labels, predictions and dead_letters must be four different topics, got {names}"
        )
    if cfg.topics.forget is not None:
        for key in ("forget", "forget_receipts"):
            name = getattr(cfg.topics, key)
            if name in names or (cfg.group.enabled and name == cfg.topics.model_deltas):
                raise ConfigError(f"topics.{key}: must differ from the other topics, got {name!r}")
        if cfg.topics.forget == cfg.topics.forget_receipts:
            raise ConfigError("topics.forget_receipts: must differ from topics.forget")
    if cfg.group.enabled:
        _check_group(cfg, names)
    _check_primary(cfg)
    _check_events(cfg)
    return _with_size_limits(cfg)


def _check_primary(cfg: WorkerConfig) -> None:
    """``metrics.primary`` names a prequential metric of the model's task (roc_auc: two classes only)."""
    primary = cfg.metrics.primary
    if primary is None:
        return
    task = cfg.model.task
    allowed = CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS
    if task == "classification" and cfg.model.m != 2:
        allowed = tuple(name for name in allowed if name != "roc_auc")
    if primary not in allowed:
        raise ConfigError(
            f"metrics.primary: must be null or one of {', '.join(allowed)} for this model, got {primary!r}"
        )


def _check_events(cfg: WorkerConfig) -> None:
    """The events section against the model: named fields need a schema, and the label is no input."""
    events, schema = cfg.events, cfg.model.schema
    if schema is None:
        if not events.is_default:
            changed = next(
                f.name
                for f in dataclasses.fields(events)
                if getattr(events, f.name) != getattr(EventsConfig(), f.name)
            )
            raise ConfigError(
                f"events.{changed}: named-field events need model.features (without a schema, messages are "
                'arrays: {"id": ..., "x": [...]} and {"id": ..., "y": ...})'
            )
        return
    for f in schema.fields:
        if f.name == events.label_field:
            raise ConfigError(
                f"model.features: {f.name!r} is events.label_field, the label: it cannot be an input too"
            )


def _unknown(full: str, name: str, known, what: str) -> str:
    """The line for an unknown key (or section): the nearest known one when there is one, else all of them.

    >>> _unknown("model.n_input", "n_input", {"n_inputs", "n_nodes", "classes"}, "key")
    'model.n_input: unknown key; did you mean model.n_inputs?'
    """
    near = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
    if near:
        return f"{full}: unknown {what}; did you mean {full[: len(full) - len(str(name))]}{near[0]}?"
    return f"{full}: unknown {what}; known: {', '.join(sorted(known))}"


SASL_WITH_PASSWORD = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def check_login(kafka: KafkaConfig) -> None:
    """A SASL login that needs a user and a password has both (librdkafka would refuse to make a client): else a
    ConfigError naming the key and the environment variable that sets it. Called by the commands that connect
    (``run``, ``check``, ``produce``, ``topics --create``); ``acls`` and ``topics`` print lines without one."""
    client = {str(k).lower(): v for k, v in kafka.client.items()}
    protocol = str(client.get("security.protocol", "plaintext")).upper()
    mechanism = str(client.get("sasl.mechanism") or client.get("sasl.mechanisms") or "GSSAPI").upper()
    if not protocol.startswith("SASL") or mechanism not in SASL_WITH_PASSWORD:
        return
    for key in ("sasl.username", "sasl.password"):
        if client.get(key) in (None, ""):
            raise ConfigError(
                f"kafka.client.{key}: not set, and security.protocol {protocol} with sasl.mechanism {mechanism} needs "
                f"it; set it in the environment: {ENV_PREFIX}KAFKA__CLIENT__{key}=..."
            )


def _check_group(cfg: WorkerConfig, names: list[str]) -> None:
    """What group learning needs of the rest of the config (ConfigError naming the key)."""
    if cfg.topics.model_deltas in names:
        raise ConfigError(
            f"topics.model_deltas: must differ from the other topics, got {cfg.topics.model_deltas!r}"
        )
    if cfg.stream.forget_expired:
        raise ConfigError(
            "stream.forget_expired: not with group learning (rows handed over at a rebalance wait on "
            "several members, and each would take the same Gram out); set it to false"
        )


def _with_size_limits(cfg: WorkerConfig) -> WorkerConfig:
    """Check the client size settings against stream.max_message_bytes (ConfigError naming the keys) and set
    the producer's message.max.bytes when it is not given: librdkafka's default (1,000,000) is below the
    default stream.max_message_bytes, so a bad message of an accepted size could not be dead-lettered (issue
    12)."""
    from iolstream.kafka import (
        message_limits,  # imports confluent_kafka: not at module level, the config loads without it
    )

    try:
        message_limits.check_producer_limits(
            cfg.stream.max_message_bytes, cfg.kafka.producer, cfg.kafka.consumer
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if "message.max.bytes" in cfg.kafka.producer:
        return cfg
    producer = {
        "message.max.bytes": message_limits.producer_message_max_bytes(cfg.stream.max_message_bytes),
        **cfg.kafka.producer,
    }
    return dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, producer=producer))


def load_config(path, environ=None) -> WorkerConfig:
    """Read, override from the environment, and validate a worker YAML file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML{_where(exc)}") from None
    return config_from_dict(raw, environ)


def _where(exc: yaml.YAMLError) -> str:
    """Where a YAML error is and what it is, on one line: " at line L, column C: problem (context)"."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return ": " + " ".join(str(exc).split())
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and (start.line, start.column) != (mark.line, mark.column):
        context += f" that starts at line {start.line + 1}, column {start.column + 1}"
    return f" at line {mark.line + 1}, column {mark.column + 1}: {problem}" + (
        f" ({context})" if context else ""
    )
