"""Dead letters as Kafka records: their headers (reason, detail, source topic, partition, offset) and their
size. Three limits decide whether a dead letter can be written as it is:

- ``stream.max_message_bytes`` (M): input values above it are dead-lettered as ``oversize``;
- the producer's ``message.max.bytes`` (P): librdkafka refuses a larger record at ``produce()``
  and builds no larger batch. Unless ``kafka.producer.message.max.bytes`` is set, the worker sets
  it to ``M + DEAD_LETTER_HEADROOM`` (at least librdkafka's own default, 1,000,000);
- the dead-letter topic's ``max.message.bytes`` (D), read at start with ``describe_configs``: the
  broker refuses a larger record batch (after compression).

A dead letter whose value and headers do not fit ``min(P, D)`` less ``framing_bytes`` (1 KiB, and 1 % more when
the producer compresses) is produced as an excerpt (``dead_letter_excerpt``): its first bytes, with headers
naming the original size and why it was cut. Sizes are decided before producing, so an excerpt never enters an exactly-once
transaction in a form the broker refuses (a refused record fails the whole transaction).

Start-up checks (``message_limits.check_producer_limits`` when the config loads, ``check_dead_letter_topic`` when the
worker starts); errors name the keys:

- error: ``kafka.producer.message.max.bytes`` set below ``M + DEAD_LETTER_HEADROOM`` (the worker's own
  config then forbids it to dead-letter the messages it accepts);
- error: ``kafka.consumer.receive.message.max.bytes`` set below ``M + 512`` (a message of M bytes
  could not even be fetched);
- error: the dead-letter or predictions topic refuses the batches the producer builds
  (``min(P, kafka.producer.batch.size)`` + framing above its ``max.message.bytes``: lower batch.size);
- error: the dead-letter topic's limit leaves no room for a dead letter's headers (below
  ``MIN_DEAD_LETTER_BYTES``);
- warning: the dead-letter topic allows less than ``M + DEAD_LETTER_HEADROOM`` (the largest dead
  letters go as excerpts), or its limit cannot be read (excerpts are sized to P alone; a record the
  broker refuses is then counted in ``iolstream_dead_letters_dropped_total`` and skipped).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka.admin import AdminClient

from iolstream.kafka.message_limits import (
    DEAD_LETTER_HEADROOM,
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
    MIN_DEAD_LETTER_BYTES,
    compresses,
    describe_max_message_bytes,
    framing_bytes,
)
from iolstream.stream.rows import MAX_DETAIL_CHARS, REASON_HINTS, BadInput

log = logging.getLogger("iolstream.worker")


def dead_letter_headers(
    bad: BadInput, source_topic: str, partition: int, offset: int
) -> list[tuple[str, bytes]]:
    """Kafka headers for a dead letter; its value is the raw (or re-encoded row) bytes.

    >>> dead_letter_headers(BadInput("missing_id", "row 2: id is empty"), "features", 0, 41)[:2]
    [('iolstream.reason', b'missing_id'), ('iolstream.detail', b'row 2: id is empty')]
    """
    return [
        ("iolstream.reason", bad.reason.encode()),
        ("iolstream.detail", bad.detail.encode("utf-8", "replace")),
        ("iolstream.source.topic", str(source_topic).encode("utf-8", "replace")),
        ("iolstream.source.partition", str(int(partition)).encode()),
        ("iolstream.source.offset", str(int(offset)).encode()),
    ]


def headers_bytes(headers: list[tuple[str, bytes]]) -> int:
    """An upper bound of the bytes ``headers`` take in a Kafka record (key, value and two varint lengths
    each)."""
    return sum(len(k.encode()) + len(v) + 10 for k, v in headers)


def dead_letter_excerpt(
    value: bytes, headers: list[tuple[str, bytes]], budget: int, why: str
) -> tuple[bytes, list[tuple[str, bytes]]] | None:
    """``(value, headers)`` as they are when value and headers fit ``budget`` bytes, else an excerpt that
    does: the first bytes of ``value``, with the headers plus ``iolstream.original.size`` (the value's
    length), ``iolstream.truncated: true`` and ``iolstream.truncated.reason`` (``why``). None if not even the
    headers fit.

    >>> v, h = dead_letter_excerpt(b"x" * 1000, [("iolstream.reason", b"oversize")], 300, "too large")
    >>> len(v), h[1:3]
    (151, [('iolstream.original.size', b'1000'), ('iolstream.truncated', b'true')])
    """
    if len(value) + headers_bytes(headers) <= budget:
        return value, headers
    headers = headers + [
        ("iolstream.original.size", str(len(value)).encode()),
        ("iolstream.truncated", b"true"),
        ("iolstream.truncated.reason", why.encode("utf-8", "replace")[:MAX_DETAIL_CHARS]),
    ]
    keep = budget - headers_bytes(headers)
    if keep < 0:
        return None
    return value[:keep], headers


class ReasonLog:
    """The worker's log of its dead letters: a reason's first one at once, then at most one line a reason every
    ``every`` seconds, with how many came since its last line and one example (detail and source), so that an
    input refused thousands of times is named without a line per message.

    >>> lines = []
    >>> log = ReasonLog("iol.dead-letters", say=lambda *a: lines.append(a[0] % a[1:]), clock=lambda: 0.0)
    >>> for i in range(3):
    ...     log.note(BadInput("duplicate_id", f"id 'r{i}' is already known"), ("iol.features", 0, i))
    >>> lines[0][:108]
    "dead letters to iol.dead-letters: 1 duplicate_id, e.g. id 'r0' is already known (iol.features[0]@0); usually"
    """

    def __init__(self, topic: str, *, every: float = 60.0, say=None, clock=time.monotonic):
        self.topic = topic
        self.every = every
        self.say = say or (lambda *args: log.warning(*args, extra={"event": "dead_letters"}))
        self.clock = clock
        self.pending: dict[str, list] = {}  # reason -> [count since its last line, example detail, source]
        self.said: dict[str, float] = {}  # reason -> when its last line was logged

    def note(self, bad: BadInput, source) -> None:
        """One dead letter; a reason not seen before is logged at once."""
        entry = self.pending.get(bad.reason)
        if entry is None:
            entry = self.pending[bad.reason] = [0, bad.detail, source]
        entry[0] += 1
        if bad.reason not in self.said:
            self._say(bad.reason, self.clock())

    def tick(self) -> None:
        """Log the reasons whose last line is ``every`` seconds old and that have dead letters since."""
        now = self.clock()
        for reason in [r for r in self.pending if now - self.said.get(r, -self.every) >= self.every]:
            self._say(reason, now)

    def _say(self, reason: str, now: float) -> None:
        count, detail, source = self.pending.pop(reason)
        since = f" in the last {now - self.said[reason]:.0f} s" if reason in self.said else ""
        where = "" if source is None else f" ({source[0]}[{source[1]}]@{source[2]})"
        self.say(
            "dead letters to %s: %d %s%s, e.g. %s%s; usually %s (each dead letter names its reason in the header "
            "iolstream.reason: docs/operations.md#reading-dead-letters)",
            self.topic,
            count,
            reason,
            since,
            detail,
            where,
            REASON_HINTS[reason],
        )
        self.said[reason] = now


class DeadLetterLimit:
    """How large a dead letter the worker produces: ``min(P, D)`` less the framing.

    producer_bytes : the producer's message.max.bytes (P)
    topic_bytes    : the dead-letter topic's max.message.bytes (D), None while unknown
    """

    def __init__(
        self,
        producer_bytes: int,
        topic: str,
        topic_bytes: int | None = None,
        admin_conf: dict | None = None,
        *,
        compressed: bool = True,
    ):
        self.producer_bytes = producer_bytes
        self.compressed = compressed  # the producer compresses: room for compression's growth (framing_bytes)
        self.topic = topic
        self.topic_bytes = topic_bytes
        self.admin_conf = admin_conf
        self.refresh_due = False  # the broker refused a dead letter: read the topic's limit again
        self.logged: set[tuple[str, str]] = set()
        self.counts = {
            "truncated": 0,
            "dropped": 0,
        }  # dead letters produced as excerpts / not produced at all

    @property
    def limit(self) -> int:
        """The largest dead letter produced as it is: min(P, D), bytes."""
        return self.producer_bytes if self.topic_bytes is None else min(self.producer_bytes, self.topic_bytes)

    @property
    def source(self) -> str:
        """Which setting the limit comes from, for messages that name it."""
        if self.topic_bytes is not None and self.topic_bytes < self.producer_bytes:
            return f"max.message.bytes of topic {self.topic}"
        if self.topic_bytes == self.producer_bytes:  # the defaults: Kafka's topic limit is the producer's too
            return f"max.message.bytes of topic {self.topic} and kafka.producer.message.max.bytes"
        return "kafka.producer.message.max.bytes"

    def fit(
        self, value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[bytes, list[tuple[str, bytes]]] | None:
        """The dead letter as it is when it fits, else an excerpt that does; None if not even its headers
        fit."""
        budget = self.limit - framing_bytes(self.limit, self.compressed)
        why = f"value of {len(value)} bytes and its headers over the dead-letter limit of {self.limit} bytes ({self.source})"
        return dead_letter_excerpt(value, headers, budget, why)

    def refused(self) -> None:
        """The broker refused a dead-letter batch (its limit was lowered since the start, or it could not be
        read): read the topic's limit again before the next dead letter."""
        self.refresh_due = True

    def refresh(self) -> None:
        """Read the topic's limit again after a refusal; if it cannot be read, assume half of the limit used
        so far (each refusal halves it, so a broker that keeps refusing ends with every dead letter dropped,
        not a loop)."""
        self.refresh_due = False
        now = (
            describe_max_message_bytes(AdminClient(self.admin_conf), self.topic, timeout=5.0)
            if self.admin_conf
            else None
        )
        self.topic_bytes = now if now is not None else self.limit // 2
        log.warning(
            "dead-letter topic %s refused a dead letter; its limit is now taken as %d bytes (%s): larger "
            "dead letters go as excerpts",
            self.topic,
            self.topic_bytes,
            "read from the broker" if now is not None else "a guess",
        )

    def note(self, kind: str, reason: str) -> bool:
        """Count a dead letter ``kind`` ("truncated" or "dropped"); True the first time ``(kind, reason)`` is
        seen: what is cut or dropped is logged once per kind and reason, however many messages follow."""
        self.counts[kind] += 1
        if (kind, reason) in self.logged:
            return False
        self.logged.add((kind, reason))
        return True


def producer_bytes(producer: dict) -> int:
    """The message.max.bytes the producer made from ``producer`` (kafka.producer) uses."""
    return int(producer.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))


def start_limit(cfg, admin_conf: dict) -> tuple[DeadLetterLimit, list[str]]:
    """The dead-letter limit at start, from the producer's settings and the output topics' limits read from
    the broker (ValueError naming the keys when they contradict, see the module docstring); and the
    warnings."""
    producer = cfg.kafka.producer
    admin = AdminClient(admin_conf)
    p = producer_bytes(producer)
    limit = DeadLetterLimit(
        p,
        cfg.topics.dead_letters,
        describe_max_message_bytes(admin, cfg.topics.dead_letters),
        admin_conf,
        compressed=compresses(producer),
    )
    batch = min(p, int(producer.get("batch.size", LIBRDKAFKA_MESSAGE_MAX_BYTES)))
    warnings = check_dead_letter_topic(
        limit,
        batch_bytes=batch,
        predictions_topic=cfg.topics.predictions,
        predictions_bytes=describe_max_message_bytes(admin, cfg.topics.predictions),
        max_message_bytes=cfg.stream.max_message_bytes,
    )
    return limit, warnings


def check_dead_letter_topic(
    limit: DeadLetterLimit,
    *,
    batch_bytes: int,
    predictions_topic: str,
    predictions_bytes: int | None,
    max_message_bytes: int,
) -> list[str]:
    """Refuse output topics that would refuse what the producer sends (ValueError naming the keys); return
    warnings.

    batch_bytes : the largest batch the producer builds, min(message.max.bytes, batch.size)
    """
    if limit.topic_bytes is not None and limit.topic_bytes < MIN_DEAD_LETTER_BYTES:
        raise ValueError(
            f"dead-letter topic {limit.topic} (topics.dead_letters) has max.message.bytes={limit.topic_bytes}: "
            f"no room for a dead letter's headers and an excerpt; raise it to at least {MIN_DEAD_LETTER_BYTES} "
            f"(to {max_message_bytes + DEAD_LETTER_HEADROOM} for whole dead letters up to stream.max_message_bytes)"
        )
    for topic, allowed in ((limit.topic, limit.topic_bytes), (predictions_topic, predictions_bytes)):
        if allowed is not None and batch_bytes + framing_bytes(batch_bytes) > allowed:
            room = allowed - framing_bytes(allowed)
            fix = (
                f"set kafka.producer.batch.size to at most {room}, or raise the topic's max.message.bytes"
                if room > 0
                else f"raise the topic's max.message.bytes to at least {batch_bytes + framing_bytes(batch_bytes)}"
            )
            raise ValueError(
                f"topic {topic} allows batches of max.message.bytes={allowed} bytes, but the producer builds batches of "
                f"up to {batch_bytes} bytes (the smaller of kafka.producer.message.max.bytes and kafka.producer.batch.size): "
                f"the broker would refuse them; {fix}"
            )
    warnings = []
    if limit.topic_bytes is None:
        warnings.append(
            f"cannot read max.message.bytes of the dead-letter topic {limit.topic} (topics.dead_letters): dead letters "
            f"are sized to kafka.producer.message.max.bytes ({limit.producer_bytes}); one the broker refuses is counted "
            "in iolstream_dead_letters_dropped_total and skipped (exactly-once: its transaction aborts first)"
        )
    elif limit.topic_bytes < max_message_bytes + DEAD_LETTER_HEADROOM:
        warnings.append(
            f"dead-letter topic {limit.topic} (topics.dead_letters) has max.message.bytes={limit.topic_bytes}, below "
            f"stream.max_message_bytes ({max_message_bytes}) + {DEAD_LETTER_HEADROOM}: dead letters over "
            f"{limit.limit - framing_bytes(limit.limit, limit.compressed)} bytes (value and headers) go to it as excerpts"
        )
    return warnings
