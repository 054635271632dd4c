"""A producer that stopped delivering to a partition while the broker answers (at-least-once).

When a broker shuts down in order, a produce request it refuses may name no leader for the partition;
librdkafka 2.16 then logs ``METADATAUPDATE ... new leader-1 not found in cache`` and may never send to that
partition again, not even once the broker is back (librdkafka issue #5430): its messages wait until
``message.timeout.ms`` fails them, and the worker with them. ``StallWatch`` notices the case: once that line
has been seen, outputs wait and none is delivered for ``STALL_SECONDS`` while the broker answers. The
output (``kafka.output.Output.resend_stalled``) then purges that producer, whose delivery reports hand the
purged messages back in order, and sends them again through a new producer, which learns the leaders
afresh. ``iolstream produce`` does the same while it waits for its last deliveries (``tools.send``).
Exactly-once has no need of it: a transaction that cannot deliver is aborted and its producer replaced
(``kafka.transactions``).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

from iolstream.kafka import diagnose

LEADERLESS = "new leader-1 not found in cache"  # librdkafka's METADATAUPDATE warning (rdkafka_metadata.c)
STALL_SECONDS = 5.0  # after that line, this long with outputs waiting, none delivered, the broker answering
PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)  # a purged message's delivery report


class StallWatch:
    """Whether a producer has stalled: ``suspect`` once librdkafka named a partition without a leader, then
    ``stalled`` from the counts of messages produced and still waiting (pure: the caller passes the clock)."""

    def __init__(self, stall_seconds: float | None = None):
        self.stall_seconds = STALL_SECONDS if stall_seconds is None else stall_seconds
        self.suspect = False  # librdkafka named a partition without a leader since the last reset
        self._delivered: int | None = None  # messages delivered (or failed) when the clock last restarted
        self._since: float | None = None

    def note_log(self, message: str) -> None:
        """One of librdkafka's log lines."""
        if LEADERLESS in message:
            self.suspect = True

    def handler(self) -> logging.Handler:
        """A logging handler feeding ``note_log`` (on the ``iolstream.kafka`` logger while the worker runs)."""
        return diagnose.LineHandler(self.note_log)

    def tee(self, logger: logging.Logger) -> _Tee:
        """``logger`` as a client's log sink sees it (``diagnose.Collector``'s ``forward``): each line noted here,
        then logged."""
        return _Tee(self, logger)

    def stalled(self, produced: int, waiting: int, reachable: bool, now: float) -> bool:
        """Whether the producer holding ``waiting`` of the ``produced`` messages has stalled (``now``: monotonic
        seconds; ``reachable``: the broker answers). Any delivery, an unreachable broker or nothing waiting
        restarts the clock; nothing waiting also ends the suspicion."""
        if not self.suspect:
            return False
        delivered = produced - waiting
        if waiting <= 0:
            self.reset()
            return False
        if not reachable or self._since is None or delivered != self._delivered:
            self._delivered, self._since = delivered, now
            return False
        return now - self._since >= self.stall_seconds

    def reset(self) -> None:
        """A new producer: nothing is suspected of it."""
        self.suspect = False
        self._delivered = self._since = None


class _Tee:
    def __init__(self, watch: StallWatch, logger: logging.Logger):
        self.watch, self.logger = watch, logger

    def log(self, level, msg, *args, **kwargs) -> None:
        self.watch.note_log(msg % args if args else msg)
        self.logger.log(level, msg, *args, **kwargs)


def purge(producer) -> int:
    """Purge what ``producer`` holds, queued and in flight, serving the delivery reports that hand each message
    back to its callback (``taken_back``); returns how many it still holds."""
    producer.purge(in_queue=True, in_flight=True, blocking=True)
    while producer.poll(0):
        pass
    return len(producer)


def taken_back(err, msg) -> tuple | None:
    """A purged message's delivery report: (topic, value, key, headers, partition) to produce again (None: the
    report is not a purge's)."""
    if err is None or err.code() not in PURGED:
        return None
    return msg.topic(), msg.value(), msg.key(), msg.headers(), msg.partition()


def report_resent(logger: logging.Logger, sent: int, left: int = 0) -> None:
    """The warning a resend logs: how many messages went through the new producer, how many stayed behind."""
    logger.warning(
        "the producer stopped delivering while the broker answers (librdkafka issue #5430): %d messages "
        "taken back and sent again through a new producer%s",
        sent,
        f"; {left} could not be taken back" if left else "",
        extra={"event": "producer_resend", "messages": sent},
    )
