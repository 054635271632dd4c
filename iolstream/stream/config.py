"""The stream logic's settings: micro-batching, the join buffer's bounds and ttls, catch-up alignment.

``StreamConfig`` validates itself when it is built (a ``ValueError`` naming the key as
``stream.<key>``), whoever builds it: the YAML loader (``iolstream.kafka.config``) or a program.

    >>> StreamConfig(batch_rows=512).batch_rows
    512
    >>> StreamConfig(label_batch_rows=-5)
    Traceback (most recent call last):
    ...
    ValueError: stream.label_batch_rows: must be an integer ≥ 1, got -5
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# the fields of a prediction itself: a passthrough field may not take their names
PREDICTION_FIELDS = ("y_hat", "y_lo", "y_hi", "proba", "model_version", "ts", "event_ts", "mode")

_POSITIVE = (lambda v: v >= 1, "an integer ≥ 1")
_NON_NEGATIVE = (lambda v: v >= 0, "an integer ≥ 0")
_OPTIONAL_POSITIVE = (lambda v: v is None or v >= 1, "null or an integer ≥ 1")
RULES = {  # key -> (predicate, what is allowed)
    "batch_rows": _POSITIVE,
    "label_batch_rows": _POSITIVE,
    "max_batch_latency_ms": _NON_NEGATIVE,
    "max_label_latency_ms": _NON_NEGATIVE,
    "max_message_bytes": (lambda v: v >= 64, "an integer ≥ 64"),
    "max_pending_rows": _POSITIVE,
    "row_ttl_ms": _OPTIONAL_POSITIVE,
    "row_ttl_batches": _OPTIONAL_POSITIVE,
    "early_label_ttl_ms": _NON_NEGATIVE,
    "max_early_labels": _NON_NEGATIVE,
    "remember_done": _NON_NEGATIVE,
    "align_max_wait_ms": (lambda v: v >= 0, "an integer ≥ 0 (0 disables the alignment)"),
    "align_max_queued_messages": _POSITIVE,
    "align_max_queued_bytes": (lambda v: v >= 1024, "an integer ≥ 1024"),
}


@dataclass(frozen=True)
class StreamConfig:
    """The ``stream`` section: batching, the label join's bounds, catch-up alignment; validated when made."""

    batch_rows: int = 256
    max_batch_latency_ms: int = 50
    label_batch_rows: int = 256
    max_label_latency_ms: int = 200
    # Kafka's default max.message.bytes of a topic (1,048,588) less the dead-letter headroom (8,192,
    # kafka.message_limits.DEAD_LETTER_HEADROOM): topics made with the broker's defaults take every dead letter whole
    max_message_bytes: int = 1_040_396
    max_pending_rows: int = 100_000
    row_ttl_ms: int | None = 3_600_000
    row_ttl_batches: int | None = None
    early_label_ttl_ms: int = 60_000
    max_early_labels: int = 100_000
    remember_done: int = 200_000
    forget_expired: bool = (
        False  # downdate the Gram of rows whose label never came (default: keep it, docs/design.md §2)
    )
    emit_scores: bool = (
        False  # classification: each prediction also carries "scores", the raw ensemble output
    )
    align_max_wait_ms: int = 100  # catch-up: longest wait for a partition of unknown lag (0: arrival order)
    align_max_queued_messages: int = (
        20_000  # per partition, consumed but not yet processed: pause it above this ...
    )
    align_max_queued_bytes: int = 16 * 2**20  # ... or above this many bytes

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"stream.{f.name}: must be true or false, got {value!r}")
                continue
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"stream.{f.name}: must be an integer, got {value!r}")
            ok, allowed = RULES[f.name]
            if not ok(value):
                raise ValueError(f"stream.{f.name}: must be {allowed}, got {value!r}")
        if self.label_batch_rows > self.max_pending_rows:
            raise ValueError("stream.label_batch_rows: must not exceed stream.max_pending_rows")

    def join_settings(self, target, width: int) -> dict:
        """The JoinBuffer's keyword arguments: the ``target``, the payload ``width`` and this config's
        bounds."""
        return dict(
            target=target,
            n_features=width,
            max_pending_rows=self.max_pending_rows,
            row_ttl_ms=self.row_ttl_ms,
            row_ttl_batches=self.row_ttl_batches,
            early_label_ttl_ms=self.early_label_ttl_ms,
            max_early_labels=self.max_early_labels,
            remember_done=self.remember_done,
        )


@dataclass(frozen=True)
class EventsConfig:
    """The ``events`` section: where named-field events (a model with ``model.features``) keep their id, label
    and event time, and which of their fields each prediction copies (docs/configuration.md). Field names are
    dotted paths (``meta.order_id``). Validated when made (a ``ValueError`` naming ``events.<key>``).

    >>> EventsConfig(id_field="order_id", label_field="is_fraud", passthrough=["country"]).passthrough
    ('country',)
    >>> EventsConfig(id_field="order_id", label_field="order_id")
    Traceback (most recent call last):
    ...
    ValueError: events.label_field: must differ from events.id_field, got 'order_id'
    """

    id_field: str = "id"  # the row's id: this field of the event (a prediction names its id so too) ...
    id_from_key: bool = False  # ... or the message key (one event per message then)
    label_field: str = "y"  # the label, in the labels topic's events
    time_field: str | None = (
        None  # the event time in ms (null: none; Kafka's timestamps still order catch-up)
    )
    passthrough: tuple = ()  # fields copied from each event into its prediction

    def __post_init__(self):
        for key in ("id_field", "label_field", "time_field"):
            value = getattr(self, key)
            if value is None and key == "time_field":
                continue
            if not _field_name(value):
                raise ValueError(
                    f"events.{key}: must be a field name (a dotted path reaches a nested field), got {value!r}"
                )
        if not isinstance(self.id_from_key, bool):
            raise ValueError(f"events.id_from_key: must be true or false, got {self.id_from_key!r}")
        if self.label_field == self.id_field:
            raise ValueError(
                f"events.label_field: must differ from events.id_field, got {self.label_field!r}"
            )
        passthrough = self.passthrough
        if isinstance(passthrough, str) or not isinstance(passthrough, (list, tuple)):
            raise ValueError(f"events.passthrough: must be a list of field names, got {passthrough!r}")
        object.__setattr__(self, "passthrough", tuple(passthrough))
        for name in self.passthrough:
            if not _field_name(name):
                raise ValueError(f"events.passthrough: {name!r} is not a field name")
            if name in PREDICTION_FIELDS or name == self.id_field:
                raise ValueError(
                    f"events.passthrough: {name!r} is a field of the prediction itself "
                    f"({', '.join((self.id_field, *PREDICTION_FIELDS))})"
                )
        if len(set(self.passthrough)) != len(self.passthrough):
            raise ValueError(f"events.passthrough: a field is listed twice in {list(self.passthrough)}")

    @property
    def is_default(self) -> bool:
        """Whether every key has its default (the only events section an array-format model may have)."""
        return self == EventsConfig()


def _field_name(value) -> bool:
    return isinstance(value, str) and bool(value) and all(value.split("."))
