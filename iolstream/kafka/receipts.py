"""Forget receipts out (docs/design.md §13): one record per row forgotten on request, on
``topics.forget_receipts``, keyed by the row's id, produced once the snapshot that first holds the model
without the row is durable (``checkpoints.Checkpointer`` hands them over).

A restart from that snapshot hands its receipts out again: at-least-once all of them (a receipt may then come
twice, the same both times); exactly-once those whose request no committed transaction covers. For that,
exactly-once holds the commit of a forget partition at the oldest request whose receipt is not out yet
(``hold``): the transaction that carries a receipt is the one that commits its request's offset, so after a
crash the committed offset says whether the receipt went out.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, TopicPartition

from iolstream.kafka.clients import client_conf
from iolstream.stream.encoding import receipt_message

log = logging.getLogger("iolstream.worker")


class Receipts:
    """Produces forget receipts through ``output`` (exactly-once: in its open transaction)."""

    def __init__(self, cfg, output):
        self.cfg = cfg
        self.output = output
        self.sent = 0

    def send(self, receipts: list[dict]) -> None:
        """Produce ``receipts`` (with group learning, each names the member that removed the row)."""
        topic = self.cfg.topics.forget_receipts
        member = self.cfg.member_id if self.cfg.group.enabled else None
        for receipt in receipts:
            body = receipt if member is None else {**receipt, "member": member}
            self.output.produce(topic, receipt_message(body), key=str(receipt["id"]))
        self.sent += len(receipts)
        if receipts:
            log.info(
                "%d forget receipt(s) out, snapshot %s",
                len(receipts),
                receipts[-1].get("snapshot"),
                extra={"event": "forget_receipts", "receipts": len(receipts)},
            )

    def unsent(self, receipts: list[dict], exactly_once: bool) -> list[dict]:
        """The receipts a restart from their snapshot must send: at-least-once all; exactly-once those whose
        request offset the group has not committed past (its commit travels with the receipt, ``hold``)."""
        if not exactly_once or not receipts:
            return receipts
        keys = sorted({_key(r) for r in receipts if _key(r) is not None})
        committed = committed_offsets(self.cfg, keys)
        return [r for r in receipts if _key(r) is None or committed.get(_key(r), -1) <= int(r["request"][2])]


def hold(offsets: list[tuple[str, int, int]], floor: dict) -> list[tuple[str, int, int]]:
    """Exactly-once: ``offsets`` to commit, a forget partition's held at ``floor`` (its oldest request whose
    receipt is not out, ``Erasure.unsent_floor``)."""
    return [(t, p, min(o, floor[(t, p)]) if (t, p) in floor else o) for t, p, o in offsets]


def committed_offsets(cfg, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The consumer group's committed offsets of ``keys`` (absent: none committed)."""
    if not keys:
        return {}
    consumer = Consumer({**client_conf(cfg), "group.id": cfg.kafka.group_id, "enable.auto.commit": False})
    try:
        got = consumer.committed(
            [TopicPartition(t, p) for t, p in keys], timeout=cfg.kafka.call_timeout_seconds
        )
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}


def _key(receipt: dict) -> tuple[str, int] | None:
    source = receipt.get("request")
    if isinstance(source, list) and len(source) == 3:
        return (str(source[0]), int(source[1]))
    return None
