"""``iolstream produce``: replay a data set into the features and labels topics.

The message plan is pure (``plan``) and testable without Kafka: features go out in
order (row or batch messages); each label becomes due ``label_delay_rows`` rows
(or ``label_delay_seconds``) after its features, and may be dropped (never sent),
duplicated, or shuffled within a window (out of order). ``send`` is the thin
Kafka part: one idempotent producer, id as key, optional rate limit.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import orjson


@dataclass(frozen=True)
class PlanOptions:
    batch_rows: int = 1  # rows per message: 1 = row messages {"id", "x"}, more = batch messages {"ids", "x"}
    label_delay_rows: int = 0  # a label is sent once this many later rows have been sent
    label_delay_seconds: float = 0.0  # ... or this long after its features (with a rate)
    missing_fraction: float = 0.0  # labels never sent
    duplicate_fraction: float = 0.0  # labels sent twice
    shuffle_window: int = 0  # labels shuffled within windows of this many (out of order)
    with_ts: bool = True  # event time on features
    id_prefix: str = "r"
    seed: int = 0

    def __post_init__(self):
        for key in ("missing_fraction", "duplicate_fraction"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"--{key.replace('_', '-')}: must be in [0, 1), got {value}")
        for key in ("batch_rows", "label_delay_rows", "shuffle_window"):
            if getattr(self, key) < (1 if key == "batch_rows" else 0):
                raise ValueError(f"--{key.replace('_', '-')}: out of range: {getattr(self, key)}")


@dataclass
class Message:
    kind: str  # "features" or "labels"
    key: bytes
    value: bytes
    rows: int
    due_row: int  # send after this many feature rows have been sent (for rate-limited replays)


def _label_value(y):
    return y.item() if hasattr(y, "item") else y


def plan(X: np.ndarray, y, options: PlanOptions) -> list[Message]:
    """The exact sequence of messages a replay sends (features and labels interleaved)."""
    rng = np.random.default_rng(options.seed)
    n = len(X)
    ids = [f"{options.id_prefix}{i}" for i in range(n)]
    y_list = [_label_value(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist() for v in y]
    send = rng.random(n) >= options.missing_fraction
    twice = rng.random(n) < options.duplicate_fraction
    label_order = np.arange(n)
    if options.shuffle_window > 1:
        for start in range(0, n, options.shuffle_window):
            rng.shuffle(label_order[start : start + options.shuffle_window])
    messages: list[Message] = []
    pending: deque[int] = deque()  # label rows in send order, waiting for their delay
    repeats: list[int] = []  # duplicates go out with the next flush, never in the same message
    label_queue = deque(int(i) for i in label_order)
    sent_rows = 0
    now_ts = 1_700_000_000_000

    def flush_labels(limit_row: int | None) -> None:
        # labels whose features went out at least label_delay_rows rows ago, in (shuffled) order
        pending.extend(repeats)
        repeats.clear()
        while label_queue and (limit_row is None or label_queue[0] + options.label_delay_rows < limit_row):
            i = label_queue.popleft()
            if send[i]:
                pending.append(i)
                if twice[i]:
                    repeats.append(i)
        while pending:
            chunk = [pending.popleft() for _ in range(min(options.batch_rows, len(pending)))]
            if options.batch_rows == 1:
                value = orjson.dumps({"id": ids[chunk[0]], "y": y_list[chunk[0]]})
            else:
                value = orjson.dumps({"ids": [ids[i] for i in chunk], "y": [y_list[i] for i in chunk]})
            messages.append(Message("labels", ids[chunk[0]].encode(), value, len(chunk), sent_rows))

    for start in range(0, n, options.batch_rows):
        stop = min(start + options.batch_rows, n)
        rows = X[start:stop]
        if options.batch_rows == 1:
            obj = {"id": ids[start], "x": rows[0].tolist()}
            if options.with_ts:
                obj["ts"] = now_ts + start
        else:
            obj = {"ids": ids[start:stop], "x": rows.tolist()}
            if options.with_ts:
                obj["ts"] = [now_ts + i for i in range(start, stop)]
        messages.append(Message("features", ids[start].encode(), orjson.dumps(obj), stop - start, start))
        sent_rows = stop
        flush_labels(sent_rows)
    flush_labels(None)
    flush_labels(None)  # the last repeats
    return messages


def plan_summary(messages: list[Message]) -> dict:
    out = {"feature_messages": 0, "feature_rows": 0, "label_messages": 0, "label_rows": 0}
    for m in messages:
        if m.kind == "features":
            out["feature_messages"] += 1
            out["feature_rows"] += m.rows
        else:
            out["label_messages"] += 1
            out["label_rows"] += m.rows
    return out


def send(
    messages: list[Message],
    *,
    producer_conf: dict,
    features_topic: str,
    labels_topic: str,
    rate: float | None = None,
    label_delay_seconds: float = 0.0,
    progress=None,
) -> dict:
    """Send a plan with one idempotent producer; ``rate`` in rows/s (None: as fast as possible)."""
    from confluent_kafka import Producer

    producer = Producer({"linger.ms": 5, "enable.idempotence": True, **producer_conf})
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    started = time.monotonic()
    delayed: deque[tuple[float, Message]] = deque()
    rows_sent = 0

    def produce(m: Message) -> None:
        topic = features_topic if m.kind == "features" else labels_topic
        while True:
            try:
                producer.produce(topic, m.value, key=m.key, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    for m in messages:
        if rate:
            wait = started + m.due_row / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        if m.kind == "labels" and label_delay_seconds > 0:
            delayed.append((time.monotonic() + label_delay_seconds, m))
        else:
            produce(m)
        while delayed and delayed[0][0] <= time.monotonic():
            produce(delayed.popleft()[1])
        if m.kind == "features":
            rows_sent += m.rows
            if progress is not None:
                progress(rows_sent)
        producer.poll(0)
    while delayed:
        due, m = delayed.popleft()
        time.sleep(max(0.0, due - time.monotonic()))
        produce(m)
    remaining = producer.flush(60)
    if remaining or errors:
        raise RuntimeError(f"{remaining} messages undelivered, {len(errors)} delivery errors (first: {errors[:1]})")
    return {**plan_summary(messages), "seconds": time.monotonic() - started}
