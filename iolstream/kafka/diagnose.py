"""A Kafka problem as one line a user can act on: what failed, at which address or on which resource, and
which configuration key to look at. ``run``, ``produce`` and ``check`` all explain errors here, so that
``check`` says before a run exactly what the worker would say.

librdkafka reports a failure twice: the call fails with a generic code ("Failed to get metadata: Local:
Broker transport failure") while the cause ("Connect to ipv4#10.0.0.1:9092 failed: Connection refused")
comes through the client's error callback and log. ``Collector`` gathers both for a client it is given to,
so that nothing reaches the terminal raw, and ``explain`` picks the most telling error and turns it into
a line from ``RULES``, a table read top to bottom (the first rule whose codes or pattern match wins).
The line is an ``Explanation``: a str that also says which rule made it and whether it is a refusal
(authentication, TLS trust, a missing ACL), which ends ``run``, ``produce`` and ``check`` with exit 6
(``ops.lifecycle.EXIT_ACCESS``; every other cluster problem is 3).

    >>> from confluent_kafka import KafkaError
    >>> conf = {"bootstrap.servers": "10.0.0.1:9092"}
    >>> err = KafkaError(KafkaError._TRANSPORT, "10.0.0.1:9092/bootstrap: Connect to ipv4#10.0.0.1:9092 failed: "
    ...                  "Connection refused (after 0ms in state CONNECT)")
    >>> explain(err, conf)
    'cannot reach the broker at 10.0.0.1:9092 (kafka.bootstrap_servers): connection refused'
    >>> conf = {**conf, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
    ...         "sasl.username": "worker", "sasl.password": "s3cret"}
    >>> line = explain(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: s3cret refused"), conf)
    >>> line, line.refusal
    ("authentication failed at 10.0.0.1:9092: SASL SCRAM-SHA-512 as user 'worker' refused: SASL authentication error: *** refused (kafka.client.sasl.username, kafka.client.sasl.password)", True)
    >>> explain(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), conf, operation="Write",
    ...         resource=named("topic", "iol.predictions"))
    "not authorised: user 'worker' (SCRAM-SHA-512) may not Write topic 'iol.predictions' (a missing ACL: iolstream acls prints those iolstream needs)"

What librdkafka reports for each refusal (confluent-kafka 2.16.1, librdkafka 2.16.0, against Kafka 4.3.1 with
SCRAM-SHA-512 over TLS and StandardAuthorizer; tests/kafka/test_diagnose_recorded.py keeps these texts):

=========================  ==============================  =================================================
case                       where it comes                  code: text
=========================  ==============================  =================================================
wrong password / user      error callback, at every        _AUTHENTICATION (-169): "<broker>: SASL
                           reconnect (not fatal)           authentication error: Authentication failed
                                                           during authentication due to invalid credentials
                                                           with SASL mechanism SCRAM-SHA-512 (after ...)"
untrusted CA               error callback, at every        _SSL (-181): "<broker>: SSL handshake failed:
                           reconnect (not fatal)           error:0A000086:SSL routines::certificate verify
                                                           failed: broker certificate could not be
                                                           verified, ..." (sometimes _TRANSPORT (-195))
no Read on an input topic  consumer event, once            TOPIC_AUTHORIZATION_FAILED (29): "Subscribed
                                                           topic not available: <topic>: Broker: Topic
                                                           authorization failed"
no Read on the group       consumer event, once            GROUP_AUTHORIZATION_FAILED (30): "FindCoordinator
                                                           response error: Group authorization failed."
no Write on an output      delivery report of each         TOPIC_AUTHORIZATION_FAILED (29): "Broker: Topic
topic                      message                         authorization failed"
no Write on the            init_transactions raises        TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53),
transactional id           (fatal)                         fatal: "Failed to find transaction coordinator:
                                                           ...: Transactional Id authorization failed."
no Read on the group,      send_offsets_to_transaction     GROUP_AUTHORIZATION_FAILED (30), abortable
exactly-once               raises
no Create (topics.create)  create_topics future            TOPIC_AUTHORIZATION_FAILED (29)
=========================  ==============================  =================================================

Since Kafka 3.0 Write on a topic implies the cluster's IdempotentWrite: an idempotent producer without it was
never refused here (CLUSTER_AUTHORIZATION_FAILED (31) is explained all the same, for older brokers). A
transaction's refused output topic is named only in a log line (ADDPARTS), which ``explain_log`` reads.
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

from iolstream.kafka.config import ConfigError
from iolstream.kafka.errors import AccessDenied

ADDRESS_KEY = "kafka.bootstrap_servers"
# the configuration keys a line names, by the librdkafka setting they hold
KEYS = {
    "bootstrap.servers": ADDRESS_KEY,
    "security.protocol": "kafka.client.security.protocol",
    "sasl.username": "kafka.client.sasl.username",
    "sasl.password": "kafka.client.sasl.password",
    "ssl.ca.location": "kafka.client.ssl.ca.location",
}
ACL_HINT = "a missing ACL: iolstream acls prints those iolstream needs"


@dataclass(frozen=True)
class Context:
    """What a line may name: the client's settings (the address, the SASL mechanism and user, never the
    password), the broker the error came from, and what was being attempted (``operation`` on ``resource``:
    "Write" on "topic 'iol.predictions'")."""

    conf: dict
    broker: str
    operation: str | None = None
    resource: str | None = None

    @property
    def address(self) -> str:
        return self.conf.get("bootstrap.servers", "?")

    @property
    def mechanism(self) -> str:
        return self.conf.get("sasl.mechanism") or self.conf.get("sasl.mechanisms") or "GSSAPI"

    @property
    def user(self) -> str | None:
        return self.conf.get("sasl.username")

    @property
    def protocol(self) -> str:
        """The client's security.protocol (PLAINTEXT unless set)."""
        return str(self.conf.get("security.protocol", "plaintext")).upper()

    @property
    def principal(self) -> str:
        """Who the client authenticates as, in words."""
        protocol = str(self.conf.get("security.protocol", "plaintext")).lower()
        if protocol.startswith("sasl"):
            return f"user {self.user or '?'!r} ({self.mechanism})"
        if protocol == "ssl":
            return f"the client certificate {self.conf.get('ssl.certificate.location', '(none)')}"
        return "the anonymous principal (security.protocol plaintext)"


class Explanation(str):
    """One line (a str), with the name of the ``RULES`` row that made it (``rule``) and whether the broker
    refused the client (``refusal``: authentication, TLS trust or a missing ACL, exit 6)."""

    rule: str

    def __new__(cls, line: str, rule: str) -> Explanation:
        made = super().__new__(cls, line)
        made.rule = rule
        return made

    @property
    def refusal(self) -> bool:
        return self.rule in REFUSALS


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


# the broker closed the connection at the client's first request (ApiVersion): it expected another protocol
_FIRST_REQUEST = re.compile(r"Disconnected.*in state APIVERSION_QUERY")
_CAUSES = (
    (r"connection refused", "connection refused"),
    (r"failed to resolve|name or service not known|nodename nor servname", "host name not resolved"),
    (r"timed out|timeout", "no answer (timed out)"),
    (r"brokers are down", "no broker answers"),
    (r"connection reset|disconnected", "the connection was closed by the other side (a TLS or SASL port?)"),
)

_RESOURCE = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "a topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "a group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "a transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the cluster",
}
_SUBSCRIBED = re.compile(r"Subscribed topic not available: (\S+):")
_OPENSSL = re.compile(r"(error:[0-9A-F]{8}):SSL routines::([^:(]+)")
_ADDPARTS = re.compile(
    r'Failed to add partition "([^"]+)" \[\d+\] to transaction: Broker: Topic authorization failed'
)
_BROKER = re.compile(
    r"^(?:[A-Za-z]+: )?(?:[a-z_]+://)?([^/\s:]+:\d+)/"
)  # "sasl_ssl://127.0.0.1:19192/bootstrap: "


def named(kind: str, *names: str) -> str:
    """A resource in words: ``named("topic", "p", "d")`` is "topic 'p' or 'd'"."""
    return f"{kind} " + " or ".join(repr(n) for n in names)


def _authentication(ctx: Context, detail: str) -> str:
    why = "wrong password or no such user" if "invalid credentials" in detail else detail
    return (
        f"authentication failed at {ctx.broker}: SASL {ctx.mechanism} as user {ctx.user!r} refused: {why} "
        f"({KEYS['sasl.username']}, {KEYS['sasl.password']})"
    )


def _certificate(ctx: Context, detail: str) -> str:
    m = _OPENSSL.search(detail)
    reason = f"{m.group(2).strip()} ({m.group(1)})" if m else "certificate verify failed"
    ca = ctx.conf.get("ssl.ca.location", "the system's CA store")
    return (
        f"TLS with {ctx.broker} failed: its certificate is not trusted: {reason} against the CA file {ca} "
        f"({KEYS['ssl.ca.location']})"
    )


def _authorisation(ctx: Context, detail: str) -> str:
    resource = ctx.resource
    if resource is None and (m := _SUBSCRIBED.search(detail)):
        resource = named("topic", m.group(1))
    return f"not authorised: {ctx.principal} may not {ctx.operation or 'use'} {resource or 'it'} ({ACL_HINT})"


RULES = (
    Rule(
        "authentication",
        frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}),
        re.compile(r"SASL authentication|authentication failed", re.IGNORECASE),
        _authentication,
    ),
    Rule("certificate", frozenset(), re.compile(r"certificate verify failed"), _certificate),
    Rule(
        "tls",
        frozenset({KafkaError._SSL}),
        re.compile(r"SSL handshake|SSL routines", re.IGNORECASE),
        lambda ctx, detail: (
            f"TLS with {ctx.broker} failed: {detail} ({KEYS['security.protocol']}, {KEYS['ssl.ca.location']})"
        ),
    ),
    Rule("authorisation", frozenset(_RESOURCE), None, _authorisation),
    Rule(
        "unknown topic",
        frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}),
        None,
        lambda ctx, detail: f"{ctx.resource or 'the topic'} does not exist at {ctx.address}",
    ),
    Rule(
        "protocol",
        frozenset(),
        _FIRST_REQUEST,
        lambda ctx, detail: (
            f"cannot reach the broker at {ctx.address} ({ADDRESS_KEY}): it closed the connection at the first "
            f"request, as a TLS or SASL port does to a {ctx.protocol} client: set {KEYS['security.protocol']} "
            "(and the sasl.* and ssl.* settings) to what the port speaks"
        ),
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
    "other",
    line=lambda ctx, detail: (
        f"{' '.join(filter(None, (ctx.operation, ctx.resource))) or 'a Kafka call'} failed "
        f"({'user ' + repr(ctx.user) + ' at ' if ctx.user else 'at '}{ctx.address}): {detail}"
    ),
)
REFUSALS = frozenset({"authentication", "certificate", "authorisation"})  # exit 6; the rest of a cluster: 3


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


def explain(
    err: KafkaError | BaseException, conf: dict, *, operation=None, resource=None, seen=()
) -> Explanation:
    """One line for ``err`` (a KafkaError, or an exception carrying one), preferring a more telling error
    among ``seen`` (what the client's error callback reported meanwhile). ``conf``: the client's settings
    (``bootstrap.servers`` and ``kafka.client``); ``operation`` (an ACL operation: Read, Write, Create, ...)
    and ``resource`` (``named``): what was asked, when the caller knows it. Never shows ``sasl.password``."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if not isinstance(err, KafkaError):
        err = KafkaError(KafkaError._FAIL, str(err))
    chosen = best([*seen, err])
    text = chosen.str() or chosen.name()
    m = _BROKER.match(text)
    ctx = Context(conf, m.group(1) if m else conf.get("bootstrap.servers", "?"), operation, resource)
    rule = rule_of(chosen)
    return Explanation(rule.line(ctx, _redact(_detail(text), conf.get("sasl.password"))), rule.name)


def _redact(detail: str, password: str | None) -> str:
    """librdkafka's text with the password (as a whole word) replaced by ***; the line around it is ours and never
    holds it, so a password that is also a word ("wrong") leaves the line's own words alone.

    >>> _redact("SASL authentication error: wrong refused", "wrong")
    'SASL authentication error: *** refused'
    >>> _redact("a wrongful refusal", "wrong")
    'a wrongful refusal'
    """
    if not password:
        return detail
    return re.sub(rf"(?<!\w){re.escape(str(password))}(?!\w)", "***", detail)


def refusal(err: KafkaError, conf: dict, **what) -> Explanation | None:
    """``explain(err, conf, **what)`` if it is a refusal, else None."""
    line = explain(err, conf, **what)
    return line if line.refusal else None


def explain_log(message: str, conf: dict) -> Explanation | None:
    """A refusal in one of librdkafka's log lines (``iolstream.kafka`` logger), else None: a refused login, an
    untrusted certificate, or a transaction's output topic refused (ADDPARTS names the topic, the error
    the transaction call raises does not)."""
    body = message.split("]: ", 1)[-1]  # after "FAC [rdkafka#producer-1] [thrd:...]: "
    if m := _ADDPARTS.search(body):
        err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, body)
        return explain(err, conf, operation="Write", resource=named("topic", m.group(1)))
    if "SASL authentication error" in body:
        return explain(KafkaError(KafkaError._AUTHENTICATION, body), conf)
    if "certificate verify failed" in body:
        return explain(KafkaError(KafkaError._SSL, body), conf)
    return None


def _detail(text: str) -> str:
    text = re.sub(r"^\S+/(bootstrap|\d+): ", "", text)  # "host:port/bootstrap: " prefix
    return re.sub(r" \(after \d+ms in state \w+\)", "", text)


class LineHandler(logging.Handler):
    """A logging handler passing each line at ``level`` and above to ``note(text)`` (librdkafka's lines, on the
    ``iolstream.kafka`` logger while the worker runs)."""

    def __init__(self, note, level: int = logging.WARNING):
        super().__init__(level)
        self.note = note

    def emit(self, record: logging.LogRecord) -> None:
        self.note(record.getMessage())


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
        text = msg % args if args else msg
        if _FIRST_REQUEST.search(text):  # logged at INFO, and the only word of a protocol mismatch
            self.error(KafkaError(KafkaError._TRANSPORT, text.split("]: ", 1)[-1]))
        if level >= logging.WARNING:
            with self._lock:
                if len(self.lines) < 200:
                    self.lines.append(text)

    def conf(self) -> dict:
        """The settings that route a client's reports here."""
        return {"logger": self, "error_cb": self.error}


DEFINITIVE = ("authentication", "certificate", "tls")  # rules whose errors waiting longer does not mend


_PROPERTY = re.compile(r'configuration property:? "([^"]+)"')


def settings_refused(exc: KafkaException) -> ConfigError:
    """librdkafka refused to make a client from the settings (an unknown property, a bad value, a SASL login
    without its user or password): a ConfigError (exit 2) naming the configuration key, never a traceback.

    >>> from confluent_kafka import KafkaError
    >>> str(settings_refused(KafkaException(KafkaError(KafkaError._INVALID_ARG, 'No such configuration property: "sasl.pasword"'))))
    'kafka.client.sasl.pasword: librdkafka refuses the client settings: No such configuration property: "sasl.pasword"'
    """
    detail = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
    detail = re.sub(r"^Failed to create \w+ client: ", "", detail)
    m = _PROPERTY.search(detail)
    if m:
        key = f"kafka.client.{m.group(1)}"
    elif "sasl.username and sasl.password" in detail:
        key = f"{KEYS['sasl.username']}, {KEYS['sasl.password']}"
        detail += " (from the environment: IOLSTREAM_KAFKA__CLIENT__sasl.password=...)"
    else:
        key = "kafka.client"
    return ConfigError(f"{key}: librdkafka refuses the client settings: {detail}")


def new_admin(conf: dict) -> AdminClient:
    """An admin client of ``conf``; settings librdkafka refuses are a ConfigError naming the key."""
    try:
        return AdminClient(conf)
    except KafkaException as exc:
        if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._INVALID_ARG:
            raise settings_refused(exc) from None
        raise


def probe(conf: dict, timeout: float) -> tuple[object | None, Explanation | None]:
    """Ask the cluster at ``conf``'s address for its metadata within ``timeout`` seconds: (metadata, None), or
    (None, one line saying why not). An authentication or TLS failure answers at once; settings librdkafka
    refuses are a ConfigError (``settings_refused``)."""
    seen = Collector()
    admin = new_admin({**conf, **seen.conf()})
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
    ``every_seconds``. A refusal (authentication, TLS trust) is not waited out: ``AccessDenied``."""
    started = time.monotonic()
    said_at = None
    while True:
        first = said_at is None  # a short first probe: the first line comes soon
        meta, why = probe(conf, min(2.0 if first else probe_seconds, max(0.5, deadline - time.monotonic())))
        if why is not None and getattr(why, "refusal", False):
            raise AccessDenied(why)
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
