"""A Kafka problem as one line a user can act on: what failed, at which address or on which resource, and
which configuration key to look at. ``run``, ``produce`` and ``check`` all explain errors here.

librdkafka reports a failure twice: the call fails with a generic code ("Failed to get metadata: Local:
Broker transport failure") while the cause ("Connect to ipv4#10.0.0.1:9092 failed: Connection refused")
comes through the client's error callback and log. ``Collector`` gathers both for a client it is given to,
so that nothing reaches the terminal raw, and ``explain`` picks the most telling error and turns it into
a line from ``RULES``, a table read top to bottom (the first rule whose codes or pattern match wins).

    >>> from confluent_kafka import KafkaError
    >>> conf = {"bootstrap.servers": "10.0.0.1:9092"}
    >>> err = KafkaError(KafkaError._TRANSPORT, "10.0.0.1:9092/bootstrap: Connect to ipv4#10.0.0.1:9092 failed: "
    ...                  "Connection refused (after 0ms in state CONNECT)")
    >>> explain(err, conf)
    'cannot reach the broker at 10.0.0.1:9092 (kafka.bootstrap_servers): connection refused'
    >>> conf = {**conf, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "worker", "sasl.password": "s3cret"}
    >>> explain(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: s3cret refused"), conf)
    "authentication failed at 10.0.0.1:9092: SASL SCRAM-SHA-512 as user 'worker' refused (kafka.client.sasl.username, kafka.client.sasl.password): SASL authentication error: *** refused"
    >>> explain(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), conf, operation="write", resource="topic iol.predictions")
    "not authorised to write topic iol.predictions (user 'worker' at 10.0.0.1:9092)"

Another security setup adds rows to ``RULES`` (and, when it has its own keys to name, to ``KEYS``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

ADDRESS_KEY = "kafka.bootstrap_servers"
# the configuration keys a line names, by the librdkafka setting they hold
KEYS = {
    "bootstrap.servers": ADDRESS_KEY,
    "sasl.username": "kafka.client.sasl.username",
    "sasl.password": "kafka.client.sasl.password",
    "ssl.ca.location": "kafka.client.ssl.ca.location",
}


@dataclass(frozen=True)
class Context:
    """What a line may name: the address, the SASL mechanism and user (never the password), and what was
    being attempted (``operation`` on ``resource``, e.g. "write" on "topic iol.predictions")."""

    address: str
    mechanism: str | None = None
    user: str | None = None
    operation: str | None = None
    resource: str | None = None

    @property
    def who(self) -> str:
        return f"user {self.user!r} at {self.address}" if self.user else f"at {self.address}"


@dataclass(frozen=True)
class Rule:
    """One kind of problem: matched by error code or by a pattern of the error's text."""

    name: str
    codes: frozenset = frozenset()
    pattern: re.Pattern | None = None
    line: Callable[[Context, str], str] = lambda ctx, detail: detail

    def matches(self, err: KafkaError) -> bool:
        return err.code() in self.codes or bool(self.pattern and self.pattern.search(err.str() or ""))


def _cause(text: str) -> str:
    """The cause in a librdkafka connection error, short."""
    for pattern, cause in _CAUSES:
        if re.search(pattern, text, re.IGNORECASE):
            return cause
    return text


_CAUSES = (
    (r"connection refused", "connection refused"),
    (r"failed to resolve|name or service not known|nodename nor servname", "host name not resolved"),
    (r"timed out|timeout", "no answer (timed out)"),
    (r"brokers are down", "no broker answers"),
    (r"connection reset|disconnected", "the connection was closed by the other side (a TLS or SASL port?)"),
)

_AUTHORISATION = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)

RULES = (
    Rule(
        "authentication",
        frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}),
        re.compile(r"SASL authentication|authentication failed", re.IGNORECASE),
        lambda ctx, detail: (
            f"authentication failed at {ctx.address}: SASL {ctx.mechanism or 'GSSAPI'} as user {ctx.user!r} refused "
            f"({KEYS['sasl.username']}, {KEYS['sasl.password']}): {detail}"
        ),
    ),
    Rule(
        "certificate",
        frozenset({KafkaError._SSL}),
        re.compile(r"SSL handshake|certificate|SSL routines", re.IGNORECASE),
        lambda ctx, detail: (
            f"TLS with {ctx.address} failed: {detail} (kafka.client.security.protocol, {KEYS['ssl.ca.location']})"
        ),
    ),
    Rule(
        "authorisation",
        _AUTHORISATION,
        None,
        lambda ctx, detail: (
            f"not authorised to {ctx.operation or 'use'} {ctx.resource or 'the cluster'} ({ctx.who})"
        ),
    ),
    Rule(
        "unknown topic",
        frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}),
        None,
        lambda ctx, detail: f"{ctx.resource or 'the topic'} does not exist at {ctx.address}",
    ),
    Rule(
        "unreachable",
        frozenset(
            {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE, KafkaError._TIMED_OUT}
        ),
        None,
        lambda ctx, detail: f"cannot reach the broker at {ctx.address} ({ADDRESS_KEY}): {_cause(detail)}",
    ),
)
FALLBACK = Rule(
    "other", line=lambda ctx, detail: f"{ctx.operation or 'a Kafka call'} failed ({ctx.who}): {detail}"
)


def context(conf: dict, *, operation: str | None = None, resource: str | None = None) -> Context:
    return Context(
        conf.get("bootstrap.servers", "?"),
        conf.get("sasl.mechanism") or conf.get("sasl.mechanisms"),
        conf.get("sasl.username"),
        operation,
        resource,
    )


def rule_of(err: KafkaError) -> Rule:
    return next((r for r in RULES if r.matches(err)), FALLBACK)


def best(errors: list[KafkaError]) -> KafkaError | None:
    """The most telling of ``errors``: the first one matching the earliest rule of ``RULES`` (an authentication
    failure explains the transport failures that follow it; a refused connection says more than "1/1
    brokers are down")."""

    def rank(err: KafkaError) -> tuple[int, bool]:
        rule = rule_of(err)
        return (
            RULES.index(rule) if rule in RULES else len(RULES),
            err.code() == KafkaError._ALL_BROKERS_DOWN,
        )

    return min(errors, key=rank, default=None)


def explain(err: KafkaError | BaseException, conf: dict, *, operation=None, resource=None, seen=()) -> str:
    """One line for ``err`` (a KafkaError, or an exception carrying one), preferring a more telling error
    among ``seen`` (what the client's error callback reported meanwhile). Never shows ``sasl.password``."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if not isinstance(err, KafkaError):
        err = KafkaError(KafkaError._FAIL, str(err))
    chosen = best([*seen, err])
    detail = _detail(chosen)
    line = rule_of(chosen).line(context(conf, operation=operation, resource=resource), detail)
    password = conf.get("sasl.password")
    return line.replace(password, "***") if password else line


def _detail(err: KafkaError) -> str:
    text = err.str() or err.name()
    text = re.sub(r"^\S+/(bootstrap|\d+): ", "", text)  # "host:port/bootstrap: " prefix
    return re.sub(r" \(after \d+ms in state \w+\)", "", text)


class Collector:
    """A client's ``logger`` and ``error_cb`` at once: keeps what librdkafka reports (errors, and log lines at
    warning and above as text) instead of printing it, for ``explain``; passes log lines on to ``forward``
    (a logger) when given."""

    def __init__(self, forward: logging.Logger | None = None):
        self.errors: list[KafkaError] = []
        self.lines: list[str] = []
        self.forward = forward
        self._lock = threading.Lock()

    def error(self, err: KafkaError) -> None:
        with self._lock:
            if len(self.errors) < 200:
                self.errors.append(err)

    def log(self, level, msg, *args, **kwargs) -> None:  # the logging.Logger.log signature librdkafka calls
        if self.forward is not None:
            self.forward.log(level, msg, *args, **kwargs)
        if level >= logging.WARNING:
            with self._lock:
                if len(self.lines) < 200:
                    self.lines.append(msg % args if args else msg)

    def conf(self) -> dict:
        """The settings that route a client's reports here."""
        return {"logger": self, "error_cb": self.error}


DEFINITIVE = ("authentication", "certificate")  # rules whose errors waiting longer does not mend


def probe(conf: dict, timeout: float) -> tuple[object | None, str | None]:
    """Ask the cluster at ``conf``'s address for its metadata within ``timeout`` seconds: (metadata, None), or
    (None, one line saying why not). An authentication or TLS failure answers at once."""
    seen = Collector()
    admin = AdminClient({**conf, **seen.conf()})
    deadline = time.monotonic() + max(0.5, timeout)
    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(2.0, deadline - time.monotonic()))), None
        except KafkaException as exc:
            admin.poll(0)  # serve the error callbacks queued meanwhile
            definitive = any(rule_of(e).name in DEFINITIVE for e in seen.errors)
            if definitive or time.monotonic() >= deadline:
                return None, explain(exc, conf, operation="get the cluster's metadata", seen=seen.errors)


def wait_for_broker(
    conf: dict,
    deadline: float,
    log: logging.Logger,
    *,
    every_seconds: float = 10.0,
    probe_seconds: float = 5.0,
):
    """Probe until the cluster answers (returns its metadata) or ``deadline`` (time.monotonic) passes (returns
    None, having logged why). While it does not answer, one line says why, repeated at most every
    ``every_seconds``."""
    started = time.monotonic()
    said_at = None
    while True:
        first = said_at is None  # a short first probe: the first line comes soon
        meta, why = probe(conf, min(2.0 if first else probe_seconds, max(0.5, deadline - time.monotonic())))
        if meta is not None:
            if said_at is not None:
                log.info(
                    "the broker at %s answers after %.0f s",
                    conf.get("bootstrap.servers"),
                    time.monotonic() - started,
                )
            return meta
        now = time.monotonic()
        if now >= deadline:
            log.error("%s; gave up after %.0f s", why, now - started, extra={"event": "broker_unreachable"})
            return None
        if said_at is None or (now - said_at >= every_seconds and deadline - now > probe_seconds):
            said_at = now
            log.warning(
                "%s; retrying for %.0f s more", why, deadline - now, extra={"event": "broker_unreachable"}
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
