"""Kafka's refusals, each in one line naming what failed: authentication (the mechanism and the user), TLS
trust (the broker's certificate and the CA file), authorisation (the principal, the operation, the resource).

What librdkafka reports (confluent-kafka 2.16.1, librdkafka 2.16.0, against Kafka 4.3.1 with SCRAM-SHA-512 over
TLS and StandardAuthorizer):

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
never refused here (CLUSTER_AUTHORIZATION_FAILED (31) is explained all the same, for older brokers).

``explain`` turns one KafkaError into the line (None: not a refusal); ``Refusals`` keeps the first one the
worker's clients report, and ``check`` raises it as ``AccessDenied``, which ends ``iolstream run`` with
exit code 6 (``ops.lifecycle.EXIT_ACCESS``). Passwords never enter a line: only the user name does.
"""

from __future__ import annotations

import logging
import re

from confluent_kafka import KafkaError

from iolstream.kafka.errors import WorkerError
from iolstream.ops.lifecycle import EXIT_ACCESS

_AUTHENTICATION = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)
_TLS = (KafkaError._SSL, KafkaError._TRANSPORT)
_RESOURCE = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
_BROKER = re.compile(
    r"^(?:[A-Za-z]+: )?(?:[a-z_]+://)?([^/\s:]+:\d+)"
)  # "sasl_ssl://127.0.0.1:19192/bootstrap: ..."
_SUBSCRIBED = re.compile(r"Subscribed topic not available: (\S+):")
_OPENSSL = re.compile(r"(error:[0-9A-F]{8}):SSL routines::([^:(]+)")
_ADDPARTS = re.compile(
    r'Failed to add partition "([^"]+)" \[\d+\] to transaction: Broker: Topic authorization failed'
)


class AccessDenied(WorkerError):
    """The broker refused the worker (authentication, TLS trust or a missing ACL): nothing to retry."""

    exit_code = EXIT_ACCESS


def who(client: dict) -> str:
    """The principal the client settings authenticate as, in words (never the password)."""
    protocol = str(client.get("security.protocol", "plaintext")).lower()
    if protocol.startswith("sasl"):
        return f"user {client.get('sasl.username', '?')!r} ({client.get('sasl.mechanism', client.get('sasl.mechanisms', 'GSSAPI'))})"
    if protocol == "ssl":
        return f"the client certificate {client.get('ssl.certificate.location', '(none)')}"
    return "the anonymous principal (security.protocol plaintext)"


def broker_of(text: str) -> str:
    """The broker address a librdkafka error text starts with, else "the broker"."""
    m = _BROKER.match(text)
    return m.group(1) if m else "the broker"


def explain(
    err: KafkaError,
    client: dict,
    *,
    operation: str | None = None,
    name: str | None = None,
    names: tuple[str, ...] = (),
) -> str | None:
    """One line for a refusal, None for any other error. ``client``: the kafka.client settings (who asked);
    ``operation`` (Read, Write, Create, ...) and ``name`` (the topic, group or transactional id): what was asked,
    when the caller knows it (a consumer's topic is also read from librdkafka's text); ``names``: the resources
    it may be, when librdkafka does not say which (a transaction's outputs)."""
    code, text = err.code(), err.str()
    if code in _AUTHENTICATION:
        mechanism = client.get("sasl.mechanism", client.get("sasl.mechanisms", "?"))
        return (
            f"authentication failed: {broker_of(text)} refused {mechanism} for user "
            f"{client.get('sasl.username', '?')!r} (wrong password or no such user: kafka.client sasl.username, "
            "sasl.password)"
        )
    if code in _TLS and "certificate verify failed" in text:
        m = _OPENSSL.search(text)
        reason = f"{m.group(2).strip()} ({m.group(1)})" if m else "certificate verify failed"
        ca = client.get("ssl.ca.location", "the system's CA store")
        return (
            f"TLS: the certificate of {broker_of(text)} is not trusted: {reason} "
            f"against kafka.client ssl.ca.location {ca}"
        )
    resource = _RESOURCE.get(code)
    if resource is None:
        return None
    if name is None and (m := _SUBSCRIBED.search(text)):
        name = m.group(1)
    if resource == "cluster":
        target = "the cluster"
    elif name or names:
        target = f"{resource} " + " or ".join(repr(n) for n in ([name] if name else names))
    else:
        target = f"a {resource}"
    return (
        f"not authorised: {who(client)} may not {operation or 'use'} {target} "
        "(a missing ACL: docs/operations.md lists the worker's)"
    )


def explain_log(message: str, client: dict) -> str | None:
    """The same for one of librdkafka's log lines (``iolstream.kafka`` logger): a refused login, an untrusted
    certificate, or a transaction's output topic refused (ADDPARTS names the topic, the error does not)."""
    body = message.split("]: ", 1)[-1]  # after "FAC [rdkafka#producer-1] [thrd:...]: "
    if m := _ADDPARTS.search(body):
        err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, body)
        return explain(err, client, operation="Write", name=m.group(1))
    if "SASL authentication error" in body:
        return explain(KafkaError(KafkaError._AUTHENTICATION, body), client)
    if "certificate verify failed" in body:
        return explain(KafkaError(KafkaError._SSL, body), client)
    return None


class Refusals:
    """The first refusal the worker's clients report (``note``), raised by ``check`` between two loop cycles;
    the same line is never reported twice."""

    def __init__(self, cfg):
        """``cfg``: a WorkerConfig, or a client's settings (a dict) for a client of no group and no transaction."""
        if isinstance(cfg, dict):
            self.client, self.group, self.transactional_id = dict(cfg), None, cfg.get("transactional.id")
        else:
            self.client = dict(cfg.kafka.client)
            self.group = cfg.kafka.group_id
            self.transactional_id = cfg.transactional_id
        self.first: str | None = None

    def note(
        self,
        err: KafkaError,
        *,
        source: str = "producer",
        name: str | None = None,
        names: tuple[str, ...] = (),
    ) -> bool:
        """True if ``err`` is a refusal (kept, unless one came before). ``source``: "consumer" (Read),
        "producer" (Write), "create" (Create); the group and the transactional id are named from the config;
        ``name``/``names``: the topic (``explain``)."""
        operation = {"consumer": "Read", "producer": "Write", "create": "Create"}.get(source)
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            operation, name = "Read", self.group
        elif err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            operation, name = "Write", self.transactional_id
        elif err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED and source == "producer":
            operation = "IdempotentWrite"
        line = explain(err, self.client, operation=operation, name=name, names=names)
        if line is None:
            return False
        if self.first is None:
            self.first = line
        return True

    def note_log(self, message: str) -> bool:
        """``note`` for a librdkafka log line (``explain_log``)."""
        line = explain_log(message, self.client)
        if line is not None and self.first is None:
            self.first = line
        return line is not None

    def handler(self) -> logging.Handler:
        """A logging handler feeding ``note_log`` (add it to the ``iolstream.kafka`` logger while the worker runs)."""
        refusals = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                refusals.note_log(record.getMessage())

        return _Handler(logging.WARNING)

    def check(self) -> None:
        if self.first is not None:
            raise AccessDenied(self.first)
