"""``Follower`` reads the predictions topic while a replay runs and joins every prediction with the
label the replay knows (sent or not): the prequential metric of what the worker actually emitted,
live, and as a learning curve (``learning_curve``, ``plot_curve``).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import orjson

from iolstream.tools.figures import pyplot, save_figure
from iolstream.tools.plan import label_value


class Follower:
    """Reads the predictions topic (from its end when started) and joins each prediction of
    this replay's ids with the true label: the prequential metric of what the worker emitted.

    errors[i]: 1.0/0.0 for a right/wrong class (classification) or the squared error (regression)
    of row i, NaN until its prediction came. ``duplicates`` counts predictions of an id seen before.
    With ``dead_letters`` (the worker's dead-letter topic, read when it can be) the rows of this replay the
    worker refused are counted by reason (``refused``, header ``iolstream.reason``): they get no prediction.
    """

    def __init__(
        self,
        consumer_conf: dict,
        topic: str,
        ids: list[str],
        y,
        task: str,
        id_field: str = "id",
        *,
        dead_letters=None,
        features: str | None = None,
    ):
        self.consumer_conf = consumer_conf
        self.topic = topic
        self.id_field = id_field  # the predictions' id field: "id", or a named-field worker's events.id_field
        self.dead_letters = dead_letters
        self.features = features  # the features topic: its dead letters are refused rows
        self.refused: dict[str, int] = {}  # reason -> rows of this replay refused (dead-lettered features)
        self.refused_seen = np.zeros(len(ids), dtype=bool)
        self.index = {row_id: i for i, row_id in enumerate(ids)}
        self.task = task
        if task == "classification":
            self.truth = [label_value(v) for v in y]
        else:
            self.truth = np.asarray(y, dtype=np.float64).reshape(len(ids), -1)
        self.errors = np.full(len(ids), np.nan)
        self.seen = np.zeros(len(ids), dtype=bool)
        self.arrival: list[int] = []  # row indices in the order their predictions came
        self.received = 0
        self.duplicates = 0
        self.modes: set[str] = set()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: Exception | None = None

    def start(self, timeout: float = 30.0) -> Follower:
        self._thread = threading.Thread(target=self._run, name="follow-predictions", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"could not start reading {self.topic!r} within {timeout:.0f} s")
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        from iolstream.kafka.clients import logged

        consumer = Consumer(
            logged(
                {
                    "group.id": f"iolstream-produce-follow-{time.time_ns()}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 100,
                    **self.consumer_conf,
                }
            )
        )
        try:
            md = consumer.list_topics(self.topic, timeout=30)
            t = md.topics.get(self.topic)
            if t is None or t.error is not None:
                raise RuntimeError(
                    f"predictions topic {self.topic!r} not found: {t.error if t else 'no metadata'}"
                )
            parts = []
            for p in sorted(t.partitions):
                parts.append(TopicPartition(self.topic, p, _end(consumer, TopicPartition(self.topic, p))))
            parts += self._dead_letter_partitions(consumer)
            consumer.assign(parts)
        except Exception as exc:  # reported by start()
            self.error = exc
            self._ready.set()
            consumer.close()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(num_messages=1000, timeout=0.2):
                    if msg.error() is None and msg.topic() == self.topic:
                        self._on_prediction(msg.value())
                    elif msg.error() is None:
                        self._on_dead_letter(msg.value(), msg.headers())
                    elif msg.error().code() != KafkaError._PARTITION_EOF:
                        pass  # transient: librdkafka retries by itself
        finally:
            consumer.close()

    def _dead_letter_partitions(self, consumer) -> list:
        """The dead-letter topic's partitions from their ends, or none when it cannot be read (missing, no ACL):
        the replay is followed without it."""
        from confluent_kafka import KafkaException, TopicPartition

        if not self.dead_letters:
            return []
        try:
            t = consumer.list_topics(self.dead_letters, timeout=10).topics.get(self.dead_letters)
            if t is None or t.error is not None:
                return []
            return [
                TopicPartition(
                    self.dead_letters, p, _end(consumer, TopicPartition(self.dead_letters, p), 5.0)
                )
                for p in sorted(t.partitions)
            ]
        except KafkaException:
            return []

    def _on_dead_letter(self, value: bytes, headers) -> None:
        """A dead letter: a feature row of this replay the worker refused (its value is the row's message)."""
        named = {k: v.decode("utf-8", "replace") for k, v in headers or () if k.startswith("iolstream.")}
        reason = named.get("iolstream.reason")
        try:
            obj = orjson.loads(value)
        except (orjson.JSONDecodeError, TypeError):
            return
        if reason is None or not isinstance(obj, dict):
            return  # not the worker's
        source = named.get("iolstream.source.topic")
        if not (source == self.features if self.features is not None and source is not None else "x" in obj):
            return  # a label's dead letter (its row may still be predicted)
        ids = obj["ids"] if isinstance(obj.get("ids"), list) else [obj.get(self.id_field)]
        for row_id in ids:
            i = self.index.get(row_id) if isinstance(row_id, str) else None
            if i is not None and not self.refused_seen[i]:
                self.refused_seen[i] = True
                self.refused[reason] = self.refused.get(reason, 0) + 1

    @property
    def refused_rows(self) -> int:
        """Rows of this replay the worker dead-lettered (their features)."""
        return sum(self.refused.values())

    def dominant(self) -> str:
        """The most frequent reason rows were refused for ("" when none was)."""
        return max(sorted(self.refused), key=self.refused.get, default="")

    def _on_prediction(self, value: bytes) -> None:
        try:
            obj = orjson.loads(value)
            i = self.index.get(obj.get(self.id_field))
        except (orjson.JSONDecodeError, AttributeError):
            return
        if i is None:
            return  # another replay's row
        self.received += 1
        if self.seen[i]:
            self.duplicates += 1
            return
        self.seen[i] = True
        if "mode" in obj:
            self.modes.add(obj["mode"])
        if self.task == "classification":
            self.errors[i] = float(obj.get("y_hat") == self.truth[i])
        else:
            y_hat = obj.get("y_hat")
            y_hat = np.asarray([np.nan if y_hat is None else y_hat], dtype=np.float64).reshape(-1)
            self.errors[i] = float(np.mean((y_hat - self.truth[i]) ** 2))
        self.arrival.append(i)

    @property
    def predicted(self) -> int:
        return len(self.arrival)

    def metric(self) -> float:
        """Prequential accuracy (classification) or RMSE (regression) over the rows predicted so far."""
        errors = self.errors[self.arrival] if self.arrival else np.empty(0)
        if not len(errors):
            return math.nan
        return float(errors.mean()) if self.task == "classification" else float(np.sqrt(errors.mean()))

    def wait(self, rows: int, *, timeout: float, on_tick=None) -> bool:
        """Until ``rows`` rows are predicted (True), or every row is predicted or refused, or no new prediction
        or dead letter came for ``timeout`` s (False)."""
        last, last_change = -1, time.monotonic()
        while self.predicted < rows:
            if self.predicted + self.refused_rows >= rows:
                return False
            if self.predicted + self.refused_rows != last:
                last, last_change = self.predicted + self.refused_rows, time.monotonic()
            elif time.monotonic() - last_change > timeout:
                return False
            if on_tick is not None:
                on_tick()
            time.sleep(0.1)
        return True


def learning_curve(
    errors: np.ndarray, task: str, window: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cumulative prequential metric, metric over the last ``window`` rows), in stream order,
    over the rows that have a prediction."""
    e = errors[~np.isnan(errors)]
    rows = np.arange(1, len(e) + 1)
    csum = np.concatenate([[0.0], np.cumsum(e)])
    cumulative = csum[1:] / rows
    lo = np.maximum(rows - window, 0)
    windowed = (csum[rows] - csum[lo]) / (rows - lo)
    if task != "classification":
        cumulative, windowed = np.sqrt(cumulative), np.sqrt(windowed)
    return rows, cumulative, windowed


def plot_curve(errors: np.ndarray, task: str, path: str, *, title: str = "", window: int = 200) -> None:
    """The worker's prequential metric over rows (stream order), cumulative and windowed."""
    plt = pyplot()
    rows, cumulative, windowed = learning_curve(errors, task, window)
    name = "accuracy" if task == "classification" else "RMSE"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rows, windowed, lw=1, alpha=0.6, label=f"last {window} rows")
    ax.plot(rows, cumulative, lw=2, label="cumulative")
    ax.set_xlabel("rows (stream order)")
    ax.set_ylabel(f"prequential {name}")
    if task == "classification":
        ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right" if task == "classification" else "upper right")
    save_figure(fig, path)


def _end(consumer, tp, seconds: float = 30.0) -> int:
    """The partition's end offset, asked again while the broker says it is not ready (a topic just created
    has no leader for a moment: NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + seconds
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=seconds)[1]
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
