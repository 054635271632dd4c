"""Reported refusals: the first refusal the running worker's clients report, kept until the loop raises it.

librdkafka reports a refusal where it meets it: a wrong password or an untrusted certificate through the error
callback at every reconnect, a missing ACL through a consumer event, a delivery report, a transaction call or
a log line (``diagnose`` lists which). ``Refusals`` is fed from all of these (``note``, ``note_log``,
``handler``), keeps the first line ``diagnose.refusal`` makes of them, and ``check`` raises it between two
loop cycles as ``AccessDenied`` (exit 6), so the worker stops with one line instead of repeating it.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

from iolstream.kafka import diagnose
from iolstream.kafka.errors import AccessDenied

# what a client was doing, by its kind, in ACL words
_OPERATION = {"consumer": "Read", "producer": "Write", "create": "Create"}


class Refusals:
    """The first refusal (``first``) of a worker's clients; the same line is never reported twice."""

    def __init__(self, cfg):
        """``cfg``: a WorkerConfig, or a client's settings (a dict) for a client of no group and no transaction
        (``iolstream produce``)."""
        if isinstance(cfg, dict):
            self.conf, self.group, self.transactional_id = dict(cfg), None, cfg.get("transactional.id")
        else:
            self.conf = {"bootstrap.servers": cfg.kafka.bootstrap_servers, **cfg.kafka.client}
            self.group = cfg.kafka.group_id
            self.transactional_id = cfg.transactional_id
        self.first: diagnose.Explanation | None = None

    def note(self, err: KafkaError, *, source: str = "producer", topics: tuple[str, ...] = ()) -> bool:
        """True if ``err`` is a refusal (kept, unless one came before). ``source``: "consumer" (Read),
        "producer" (Write), "create" (Create); ``topics``: the topic it concerns, or those it may be (a
        transaction's outputs); the group and the transactional id are named from the config."""
        operation, resource = _OPERATION.get(source), diagnose.named("topic", *topics) if topics else None
        code = err.code()
        if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            operation, resource = "Read", self.group and diagnose.named("group", self.group)
        elif code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            tid = self.transactional_id
            operation, resource = "Write", tid and diagnose.named("transactional id", tid)
        elif code == KafkaError.CLUSTER_AUTHORIZATION_FAILED and source == "producer":
            operation, resource = "IdempotentWrite", None
        line = diagnose.refusal(err, self.conf, operation=operation, resource=resource)
        if line is None:
            return False
        if self.first is None:
            self.first = line
        return True

    def note_log(self, message: str) -> bool:
        """``note`` for one of librdkafka's log lines (``diagnose.explain_log``)."""
        line = diagnose.explain_log(message, self.conf)
        if line is not None and self.first is None:
            self.first = line
        return line is not None

    def handler(self) -> logging.Handler:
        """A logging handler feeding ``note_log`` (on the ``iolstream.kafka`` logger while the worker runs)."""
        return diagnose.LineHandler(self.note_log)

    def check(self) -> None:
        if self.first is not None:
            raise AccessDenied(self.first)
