"""Exactly-once: the transactional producer's life, one transaction per poll cycle.

``commit`` ends the cycle's transaction: 1. add the input offsets 2. commit, calling again while it
fails retriably (librdkafka's way to resume a commit that timed out), up to the transaction's own
timeout 3. on an abortable error abort it; when the producer cannot go on — a call that overran its
deadline (librdkafka #5456/#5511), an abort that fails, a fatal error other than fencing — replace it
with a fresh one (``init_transactions`` fences the old one and aborts what it left open). Either way
the caller rolls the model back to its snapshot. Fencing by another worker with our transactional.id
raises WorkerError: the process ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from iolstream.kafka.calls import CallTimedOut, ClientCalls
from iolstream.kafka.clients import CALL_GRACE
from iolstream.kafka.errors import AccessDenied, WorkerError
from iolstream.kafka.offsets import commit_partitions
from iolstream.kafka.output import Output
from iolstream.ops.faults import crash_point, fault_point

log = logging.getLogger("iolstream.worker")

FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
MAX_ABORTS_IN_A_ROW = 3  # a transaction that keeps failing (an undeliverable output) is not retried for ever
MAX_PRODUCER_ATTEMPTS = (
    10  # tries at a fresh transactional producer (each up to kafka.call_timeout_seconds) ...
)
PRODUCER_RETRY_SECONDS = 3.0  # ... this far apart, before the process gives up


class TransactionalOutput(Output):
    """Exactly-once output: every record goes into the cycle's transaction, begun by the first produce of the
    cycle (``begin``). A produce the client refuses (an earlier output of the transaction failed, e.g. too
    large, leaving it in an error state) marks the transaction lost (``failed``): nothing more is produced into
    it, and the cycle's commit aborts it; a dead letter the broker refuses as too large fails its transaction
    too, and the replay cuts it to the new limit."""

    fast_path = False

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.open = False  # a transaction is open
        self.failed: KafkaError | None = None  # a produce refused: the open transaction is lost, abort it
        self.started = 0.0  # when the open transaction began (monotonic)

    def begin(self) -> bool:
        """Open the cycle's transaction if none is; False if the open one is lost already."""
        if not self.open:
            self.producer.begin_transaction()
            self.open = True
            self.started = time.monotonic()
        return self.failed is None

    def ended(self) -> None:
        """The open transaction was committed, aborted, or left with its producer."""
        self.open, self.failed = False, None

    def _ready(self) -> bool:
        return self.begin()

    def _refused(self, err: KafkaError) -> bool:
        if err.code() != KafkaError._STATE:
            return False
        log.warning("produce refused, the transaction has failed: %s", err)
        self.failed = err
        return True

    def _too_large(self, err: KafkaError, msg, reason: str) -> None:
        self.on_delivery(err, msg)


class Transactions:
    """The transactions of ``output`` (its ``producer`` the transactional producer); ``new_producer()`` makes
    one (its transactions initialised, WorkerError if that fails). ``sleep(seconds)`` waits with the loop
    ticking; ``deadline()`` is the monotonic time a shutdown must end by (None: not stopping)."""

    def __init__(
        self,
        cfg,
        output: TransactionalOutput,
        calls: ClientCalls,
        new_producer: Callable,
        *,
        metrics=None,
        sleep: Callable[[float], None] = time.sleep,
        deadline: Callable[[], float | None] = lambda: None,
    ):
        self.cfg = cfg
        self.output = output
        self.calls = calls
        self.new_producer = new_producer
        self.metrics = metrics
        self.sleep = sleep
        self.deadline = deadline
        self.call_timeout = cfg.kafka.call_timeout_seconds
        self.aborts_in_a_row = 0
        self.replaced_in_a_row = 0  # producers replaced since the last committed transaction
        self.replaced = 0

    open = property(lambda self: self.output.open, doc="A transaction is open.")
    failed = property(
        lambda self: self.output.failed, doc="Why the open transaction is lost (None: it is not)."
    )

    def commit(
        self, offsets: list[tuple[str, int, int]], group_metadata: Callable, metadata: Callable | None = None
    ) -> str | None:
        """Commit the cycle's transaction with the input ``offsets``; None when committed, else why the model
        must be rolled back (the transaction was aborted, or the producer replaced). ``metadata``: group learning,
        (topic, partition) -> the commit's metadata (``offsets.OffsetBook.metadata``)."""
        if not self.open and not offsets:
            return None  # nothing emitted and nothing new consumed (a replay-only cycle, an idle poll)
        self.output.begin()
        producer = self.output.producer
        try:
            if self.failed is not None:  # never commit a transaction that misses an output
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE, f"a produce failed: {self.failed.str()}", txn_requires_abort=True
                    )
                )
            if offsets:
                group = group_metadata()
                tps = commit_partitions(offsets, metadata)
                self._call(
                    "send_offsets_to_transaction",
                    lambda t: producer.send_offsets_to_transaction(tps, group, t),
                )
            if fault_point("abort_txn"):  # test-only: an abortable failure
                raise KafkaException(
                    KafkaError(KafkaError._STATE, "test: simulated abortable error", txn_requires_abort=True)
                )
            crash_point("before_txn_commit")
            self._call("commit_transaction", producer.commit_transaction)
        except CallTimedOut as exc:
            log.warning("transaction failed (%s): replacing the producer and rolling the model back", exc)
            self.replace(str(exc))
            return f"{exc.name} overran its deadline"
        except KafkaException as exc:
            err = exc.args[0]
            outputs = (self.cfg.topics.predictions, self.cfg.topics.dead_letters)
            if self.output.refusals is not None and self.output.refusals.note(err, topics=outputs):
                raise AccessDenied(
                    self.output.refusals.first
                ) from None  # a missing ACL: exit 6, nothing committed
            if err.fatal() and err.code() in FENCED:
                raise WorkerError(fatal_message(err, self.cfg.transactional_id)) from None
            if err.fatal() or not err.txn_requires_abort():
                # fatal, or still retriable when the transaction ran out of time (librdkafka then refuses an
                # abort while the commit is in progress: _CONFLICT): the producer cannot go on
                log.warning("transaction failed (%s): replacing the producer and rolling the model back", err)
                self.replace(err.str())
                return err.str()
            log.warning(
                "transaction failed (%s): aborting it and rolling the model back to the last snapshot", err
            )
            return self.abort(err)
        self.output.ended()
        self.aborts_in_a_row = self.replaced_in_a_row = 0
        seconds = time.monotonic() - self.output.started
        if seconds * 1000 > self._timeout_ms() / 2:
            log.warning("a transaction took %.1f s, over half of transaction.timeout.ms", seconds)
        if self.metrics is not None:
            self.metrics.transactions_committed.inc()
        crash_point("after_txn_commit")
        return None

    def abort(self, why: KafkaError) -> str:
        """Abort the open transaction (if the abort fails too, replace the producer); returns why."""
        try:
            self._call("abort_transaction", self.output.producer.abort_transaction)
        except (KafkaException, CallTimedOut) as exc:
            if isinstance(exc, KafkaException) and exc.args[0].code() in FENCED:
                raise WorkerError(fatal_message(exc.args[0], self.cfg.transactional_id)) from None
            log.warning("aborting a failed transaction failed too (%s): replacing the producer", exc)
            self.replace(f"abort failed: {exc}")
        self.output.ended()
        self.aborts_in_a_row += 1
        if self.aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise WorkerError(
                f"{self.aborts_in_a_row} transactions in a row aborted (last: {why.str()}); giving up"
            )
        return why.str()

    def replace(self, why: str) -> None:
        """Give the producer up and start a fresh one with the same transactional.id. The old one is destroyed
        on the helper thread (it may be stuck in a call there: it then stays until that call returns). While
        the broker does not answer, tried again every few seconds, the loop ticking; a stop or
        MAX_PRODUCER_ATTEMPTS failures end the process."""
        old, self.output.producer = [self.output.producer], None
        self.output.ended()
        try:
            self.calls.call("producer.close", old.clear, 1.0, grace=1.0)
        except CallTimedOut:
            pass  # the helper thread is stuck in the old producer: the next call gets a new one
        self.replaced_in_a_row += 1
        if (
            self.replaced_in_a_row > MAX_ABORTS_IN_A_ROW
        ):  # a fresh producer did not help: every transaction fails
            raise WorkerError(
                f"{self.replaced_in_a_row} producers in a row failed their first transaction ({why}); giving up"
            )
        for attempt in range(1, MAX_PRODUCER_ATTEMPTS + 1):
            try:
                self.output.producer = self.new_producer()
                break
            except WorkerError as exc:
                if self.deadline() is not None or attempt == MAX_PRODUCER_ATTEMPTS:
                    raise WorkerError(f"cannot replace the transactional producer ({why}): {exc}") from None
                log.warning(
                    "a fresh transactional producer failed (attempt %d of %d): %s",
                    attempt,
                    MAX_PRODUCER_ATTEMPTS,
                    exc,
                )
                self.sleep(PRODUCER_RETRY_SECONDS)
        self.replaced += 1
        log.info(
            "transactional producer replaced (%d so far)", self.replaced, extra={"event": "producer_replaced"}
        )

    def close(self, wait: float) -> None:
        """Abort an open transaction, best effort (the process is ending)."""
        if self.open and self.output.producer is not None:
            try:
                self.calls.call(
                    "producer.abort_transaction",
                    lambda: self.output.producer.abort_transaction(wait),
                    wait,
                    grace=1.0,
                )
            except (KafkaException, CallTimedOut):
                pass
        self.output.ended()

    def _timeout_ms(self) -> int:
        return int(self.cfg.kafka.producer.get("transaction.timeout.ms", 60_000))

    def _call(self, name: str, op) -> None:
        """A blocking transactional call ``op(timeout)`` (on the helper thread, each attempt within
        ``kafka.call_timeout_seconds``), called again while it fails retriably, until the transaction's own
        timeout (``transaction.timeout.ms`` since it began: the coordinator aborts it then anyway) or the
        shutdown deadline."""
        deadline = max(
            self.output.started + self._timeout_ms() / 1000.0, time.monotonic() + self.call_timeout
        )
        if (stop := self.deadline()) is not None:
            deadline = min(deadline, stop - 1.0)
        while True:
            timeout = max(0.1, min(self.call_timeout, deadline - time.monotonic()))
            try:
                self.calls.call("producer." + name, lambda t=timeout: op(t), timeout, grace=CALL_GRACE)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.txn_requires_abort() or time.monotonic() >= deadline:
                    raise
                log.warning("retrying after a retriable transaction error: %s", err)
                self.sleep(0.2)


def fatal_message(err: KafkaError, transactional_id: str) -> str:
    if err.code() in FENCED:
        return (
            f"producer fenced: another worker with transactional.id {transactional_id!r} has started "
            f"({err.str()}); this one stops"
        )
    return f"the transactional producer failed fatally: {err.str()} ({err.name()})"
