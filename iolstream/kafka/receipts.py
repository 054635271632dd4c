"""Forget receipts out (docs/design.md §13): one record per row forgotten on request, on
``topics.forget_receipts``, keyed by the row's id, produced once the snapshot that first holds the model
without the row is durable (``checkpoints.Checkpointer`` hands them over); exactly-once in a transaction
committed at once.

A restart from that snapshot (or an exactly-once roll-back to it) finds the receipts it names again. Which
went out before is read back from the receipts topic itself (``read_committed``, from the snapshot's write
time on): those are not sent again. Exactly-once, a receipt is out when its transaction committed, so a reader
sees each once; at-least-once, a receipt delivered but not yet acknowledged when the worker died may come
twice, the same both times.
"""

from __future__ import annotations

import logging
import time
import uuid

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from iolstream.kafka.clients import client_conf
from iolstream.stream.encoding import receipt_message

log = logging.getLogger("iolstream.worker")

SKEW_MS = 1_000  # receipts are read back from this long before their snapshot was written


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

    def unsent(self, receipts: list[dict], since_ms: int) -> list[dict]:
        """The receipts of a snapshot just loaded (written at ``since_ms``) that are not on the receipts topic yet."""
        if not receipts:
            return receipts
        out = already_out(self.cfg, since_ms - SKEW_MS)
        member = self.cfg.member_id if self.cfg.group.enabled else None
        return [r for r in receipts if (str(r["id"]), r.get("snapshot"), member) not in out]


def already_out(cfg, since_ms: int) -> set[tuple[str, str | None, str | None]]:
    """(id, snapshot, member) of the receipts a ``read_committed`` reader finds on ``topics.forget_receipts``
    from ``since_ms`` to the end (member: None without group learning; two members' snapshots may share a
    name)."""
    topic = cfg.topics.forget_receipts
    consumer = Consumer(
        {
            **client_conf(cfg),
            "group.id": f"{cfg.kafka.group_id}.receipts.{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    timeout = cfg.kafka.call_timeout_seconds
    found: set[tuple[str, str | None, str | None]] = set()
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return found  # not made yet: nothing out
        wanted = [TopicPartition(topic, p, since_ms) for p in meta.partitions]
        starts = [tp for tp in consumer.offsets_for_times(wanted, timeout=timeout) if tp.offset >= 0]
        if not starts:
            return found
        consumer.assign(starts)
        left = {tp.partition for tp in starts}
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                continue
            try:
                body = orjson.loads(msg.value())
                found.add((str(body["id"]), body.get("snapshot"), body.get("member")))
            except (ValueError, KeyError, TypeError):
                continue
        if left:
            log.warning("reading back the forget receipts did not reach the end within %.0f s", timeout)
    finally:
        consumer.close()
    return found
