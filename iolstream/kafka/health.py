"""Whether the broker answers, as the worker sees it: librdkafka's errors say it went away, a consumed
message or a metadata probe says it is back. The status line and ``/readyz`` report how long it
has been unreachable; ``/healthz`` does not depend on it (a worker waiting for its broker is alive)."""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException

from iolstream.kafka.calls import CallTimedOut, ClientCalls

log = logging.getLogger("iolstream.worker")

PROBE_SECONDS = 2.0  # while the broker is unreachable, ask it for metadata this often
UNREACHABLE = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
GRACE = 5.0


class BrokerHealth:
    """``down_since``: monotonic time the broker was found unreachable (None: reachable, as far as known)."""

    def __init__(self, calls: ClientCalls):
        self.calls = calls
        self.down_since: float | None = None
        self.probe_at = 0.0

    def note(self, err: KafkaError) -> None:
        """A (non-fatal) client error: one that means the broker is gone marks it unreachable."""
        if err.code() in UNREACHABLE:
            self.unreachable()

    def unreachable(self) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.probe_at = self.down_since + PROBE_SECONDS
            log.warning("the broker is unreachable; waiting for it", extra={"event": "broker_down"})

    def reachable(self) -> None:
        if self.down_since is not None:
            log.info(
                "the broker is reachable again after %.1f s",
                time.monotonic() - self.down_since,
                extra={"event": "broker_up"},
            )
            self.down_since = None

    def unreachable_seconds(self) -> float | None:
        return None if self.down_since is None else time.monotonic() - self.down_since

    def probe(self, consumer, topic: str) -> None:
        """While unreachable: ask for ``topic``'s metadata now and then (a short call)."""
        if self.down_since is None or time.monotonic() < self.probe_at or consumer is None:
            return
        self.probe_at = time.monotonic() + PROBE_SECONDS
        try:
            meta = self.calls.call(
                "consumer.list_topics", lambda: consumer.list_topics(topic, timeout=1.0), 1.0, grace=GRACE
            )
        except (KafkaException, CallTimedOut):
            return
        if meta.brokers:
            self.reachable()
