"""Oversized bad messages are no poison pill (issue 12, item 1), on a real broker, in both modes.

Among 2,000 good rows (8 features, 3 classes, 50-row batch messages): (a) 1.1 MB of JSON and (c) 5 MB on a
features topic that allows 8 MB, (b) 1.02 MB of non-JSON on a labels topic with Kafka's default limit. The
worker (in-process, a thread) keeps running; every good row is predicted (exactly once under exactly-once,
read with read_committed); (a) and (c) are on the dead-letter topic as excerpts with their headers, (b) as it
is (it fits); then the dead-letter topic's limit is lowered under the worker's feet to 200 bytes: the next
bad messages are counted as dropped, logged once, and the worker goes on. The final model equals one pass of
the good traffic alone (A, c, β at rtol 1e-9). Also: the start-up checks of the limits, naming the keys.
"""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np
import orjson
import pytest
from kafka_util import consume_all, produce_json, set_topic_limit, unique_group
from worker_thread import WorkerThread

from iolstream.core.model import EdRVFL
from iolstream.kafka import deadletters, message_limits
from iolstream.kafka.config import ConfigError, config_from_dict
from iolstream.kafka.worker import EXIT_FATAL, EXIT_OK, Worker, WorkerError, ensure_topics
from iolstream.stream import codec
from iolstream.stream.processor import StreamProcessor
from iolstream.tools import produce

N_ROWS = 2000
BIG_TOPIC = {"max.message.bytes": "8388608"}
MODEL_ARRAYS = ("gram", "rhs", "beta")


def raw_config(bootstrap: str, names: dict, snap_dir, *, exactly_once: bool, **stream) -> dict:
    return {
        "model": {"n_inputs": 8, "classes": [0, 1, 2], "n_nodes": 32, "n_layers": 2, "warmup_rows": 100},
        "kafka": {"bootstrap_servers": bootstrap, "group_id": unique_group("poison")},
        "topics": {**names, "create": False},
        "stream": {"batch_rows": 64, "row_ttl_ms": None, "early_label_ttl_ms": 3_600_000, **stream},
        "snapshot": {"dir": str(snap_dir), "every_batches": 10, "every_seconds": 0.5},
        "durability": {"exactly_once": exactly_once, "transactional_id": f"poison-{uuid.uuid4().hex[:10]}"},
        "metrics": {"port": 0},
        "logging": {"status_every_seconds": 60},
    }


def good_stream():
    rng = np.random.default_rng(12)
    X = rng.normal(size=(N_ROWS, 8))
    y = (X @ rng.normal(size=(8, 3))).argmax(axis=1)
    return produce.plan(X, y, produce.PlanOptions(batch_rows=50, label_delay_rows=100, seed=12))


def reference_model(cfg, messages) -> EdRVFL:
    """One uninterrupted pass over the good messages alone (no Kafka, no clock)."""
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, window_rows=cfg.metrics.window_rows)
    for i, m in enumerate(messages):
        (proc.on_features if m.kind == "features" else proc.on_labels)(m.encode(), (m.kind, 0, i), 0)
        proc.step(0)
    proc.step(0, force=True)
    return proc.model


def assert_same_model(got: EdRVFL, want: EdRVFL) -> None:
    np.testing.assert_array_equal(got.scaler.mean, want.scaler.mean)
    for layer, (a, b) in enumerate(zip(got.learner.state.layers, want.learner.state.layers)):
        for name in MODEL_ARRAYS:
            x, z = getattr(a, name), getattr(b, name)
            x, z = (np.tril(x), np.tril(z)) if name == "gram" else (x, z)
            np.testing.assert_allclose(
                x, z, rtol=1e-9, atol=1e-9 * np.abs(z).max(), err_msg=f"layer {layer} {name}"
            )
    assert got.learner.state.rows_labelled == want.learner.state.rows_labelled


def send(bootstrap: str, names: dict, messages) -> None:
    produce.send(
        messages,
        producer_conf={"bootstrap.servers": bootstrap},
        features_topic=names["features"],
        labels_topic=names["labels"],
    )


@pytest.mark.kafka
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_oversized_bad_messages_are_dead_lettered_as_excerpts_and_the_worker_goes_on(
    kafka_bootstrap, kafka_topics, kafka_admin, tmp_path, caplog, exactly_once
):
    (features,) = kafka_topics("features", config=BIG_TOPIC)
    labels, predictions, dead = kafka_topics(
        "labels", "predictions", "dead"
    )  # Kafka's default limit (1,048,588)
    names = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
    cfg = config_from_dict(
        raw_config(kafka_bootstrap, names, tmp_path / "snap", exactly_once=exactly_once), environ={}
    )
    messages = good_stream()
    parts = [
        messages[: len(messages) // 3],
        messages[len(messages) // 3 : 2 * len(messages) // 3],
        messages[2 * len(messages) // 3 :],
    ]
    ids = [i for m in messages if m.kind == "features" for i in m.obj["ids"]]
    big_json = orjson.dumps({"id": "big", "x": [0.5] * 8, "pad": "z" * 1_100_000})  # (a) 1.1 MB, valid JSON
    not_json = b"\x00not json " * 102_000  # (b) 1,020,000 bytes
    huge = orjson.dumps({"ids": ["h"], "x": [[1.0] * 8], "pad": "y" * 5_000_000})  # (c) 5 MB

    caplog.set_level(logging.INFO, logger="iolstream.worker")
    run = WorkerThread(cfg).start()
    send(kafka_bootstrap, names, parts[0])
    big_conf = {"message.max.bytes": 8_000_000}
    (where_a,) = produce_json(kafka_bootstrap, features, [big_json], conf=big_conf)
    (where_b,) = produce_json(kafka_bootstrap, labels, [not_json], conf=big_conf)
    (where_c,) = produce_json(kafka_bootstrap, features, [huge], conf=big_conf)
    send(kafka_bootstrap, names, parts[1])
    run.wait_for(
        lambda w: (
            w.processor.counters["predictions_out"] >= 2 * N_ROWS // 3
            and sum(w.processor.dead_letters.values()) == 3
        ),
        90,
        "the first two parts and three dead letters",
    )
    assert run.worker.output.dead_letter_limit.counts == {"truncated": 2, "dropped": 0}

    # the dead-letter topic's limit lowered under the worker's feet: not even the headers fit any more
    set_topic_limit(kafka_admin, dead, 200)
    produce_json(kafka_bootstrap, features, [b"{bad 1", b"{bad 2", b"{bad 3"])
    send(kafka_bootstrap, names, parts[2])
    run.wait_for(
        lambda w: (
            w.processor.counters["predictions_out"] >= N_ROWS
            and w.output.dead_letter_limit.counts["dropped"] >= 3
            and w.processor.counters["rows_learned"] >= N_ROWS
        ),  # every label in too (a loaded machine lags behind)
        90,
        "every row and label, and the last three dead letters dropped",
    )
    assert run.stop() == EXIT_OK
    assert run.worker.output.dead_letter_limit.topic_bytes == 200

    assert_same_model(run.worker.processor.model, reference_model(cfg, messages))
    got = consume_all(
        kafka_bootstrap, predictions, timeout=10
    )  # to the end (read_committed: the last stable offset)
    counts = {}
    for _, value, _, _, _ in got:
        row_id = orjson.loads(value)["id"]
        counts[row_id] = counts.get(row_id, 0) + 1
    assert set(counts) == set(ids)
    if exactly_once:
        assert len(got) == len(ids), f"{len(got) - len(ids)} predictions more than rows"

    letters = consume_all(kafka_bootstrap, dead, timeout=10)
    by_source = {}
    for _, value, headers, _, _ in letters:
        h = dict(headers)
        by_source[(h["iolstream.source.topic"].decode(), int(h["iolstream.source.offset"]))] = (value, h)
    assert len(letters) == len(by_source) == 3, sorted(by_source)  # none of the dropped ones, nothing twice
    for (topic, (_, offset)), raw, reason in (
        ((features, where_a), big_json, "oversize"),
        ((features, where_c), huge, "oversize"),
    ):
        value, h = by_source[(topic, offset)]
        assert h["iolstream.reason"] == reason.encode() and h["iolstream.truncated"] == b"true"
        assert int(h["iolstream.original.size"]) == len(raw)
        assert b"max.message.bytes of topic " + dead.encode() in h["iolstream.truncated.reason"]
        assert 1_000_000 < len(value) < 1_048_588 and raw.startswith(value)
    value, h = by_source[(labels, where_b[1])]
    assert value == not_json and h["iolstream.reason"] == b"malformed_json" and "iolstream.truncated" not in h

    dropped_logs = [r for r in caplog.records if "could not be written to" in r.getMessage()]
    assert len(dropped_logs) == 1, [r.getMessage() for r in dropped_logs]  # once, however many follow
    excerpt_logs = [r for r in caplog.records if "as an excerpt of its first" in r.getMessage()]
    assert len(excerpt_logs) == 1


# ------------------------------------------------------------------------------- start-up checks
def test_producer_and_consumer_limits_below_max_message_bytes_are_config_errors_naming_the_keys():
    base = {"model": {"n_inputs": 3, "classes": [0, 1]}}
    cfg = config_from_dict(base, environ={})
    assert (
        cfg.kafka.producer["message.max.bytes"] == message_limits.KAFKA_TOPIC_MAX_MESSAGE_BYTES
    )  # the default made to fit, and equal to Kafka's default topic limit
    with pytest.raises(
        ConfigError, match=r"kafka\.producer\.message\.max\.bytes \(1000000\).*stream\.max_message_bytes"
    ):
        config_from_dict({**base, "kafka": {"producer": {"message.max.bytes": 1_000_000}}}, environ={})
    small = config_from_dict(
        {
            **base,
            "stream": {"max_message_bytes": 500_000},
            "kafka": {"producer": {"message.max.bytes": 1_000_000}},
        },
        environ={},
    )
    assert small.kafka.producer["message.max.bytes"] == 1_000_000
    with pytest.raises(
        ConfigError, match=r"kafka\.consumer\.receive\.message\.max\.bytes.*stream\.max_message_bytes"
    ):
        config_from_dict(
            {**base, "kafka": {"consumer": {"receive.message.max.bytes": 1_000_000}}}, environ={}
        )
    with pytest.raises(ConfigError, match=r"kafka\.producer\.message\.max\.bytes: must be an integer"):
        config_from_dict({**base, "kafka": {"producer": {"message.max.bytes": "lots"}}}, environ={})


def test_dead_letter_excerpt_keeps_the_first_bytes_and_says_so():
    headers = deadletters.dead_letter_headers(codec.BadInput("oversize", "value is 5000 bytes"), "f", 0, 7)
    assert deadletters.dead_letter_excerpt(b"v" * 100, headers, 1000, "why") == (b"v" * 100, headers)
    value, cut = deadletters.dead_letter_excerpt(bytes(range(256)) * 20, headers, 1000, "too large")
    assert cut[: len(headers)] == headers and dict(cut)["iolstream.original.size"] == b"5120"
    assert (
        dict(cut)["iolstream.truncated.reason"] == b"too large"
        and value == (bytes(range(256)) * 20)[: len(value)]
    )
    assert len(value) + deadletters.headers_bytes(cut) == 1000
    assert deadletters.dead_letter_excerpt(b"v" * 100, headers, 100, "why") is None


def test_a_dead_letter_of_the_largest_input_fits_the_default_topic_whole_unless_compressed():
    """At the defaults (M = 1,040,396; the producer's and the topic's limit 1,048,588), a refused input of M bytes
    goes whole with its headers: the 1 % kept for compression's growth (11.5 KB) is kept only when the producer
    compresses; then the largest inputs go as excerpts, as the start-up warning says."""
    m = 1_040_396
    p = message_limits.producer_message_max_bytes(m)  # what the worker sets unless kafka.producer does
    assert p == 1_048_588 and not message_limits.compresses({})
    assert message_limits.compresses({"compression.type": "lz4"}) and message_limits.compresses(
        {"compression.codec": "zstd"}
    )
    assert not message_limits.compresses({"compression.type": "none"})
    detail = "field 'amount' is a string, not a number (row 0; " + "x" * 300 + ")"
    headers = deadletters.dead_letter_headers(codec.BadInput("bad_field", detail), "iol.features", 11, 2**40)
    value = b"v" * m
    plain = deadletters.DeadLetterLimit(p, "dead", topic_bytes=1_048_588, compressed=False)
    assert plain.fit(value, headers) == (value, headers)
    squeezed = deadletters.DeadLetterLimit(p, "dead", topic_bytes=1_048_588, compressed=True)
    cut, cut_headers = squeezed.fit(value, headers)
    assert len(cut) < m and dict(cut_headers)["iolstream.truncated"] == b"true"


@pytest.mark.kafka
def test_start_up_check_of_the_output_topics_limits(kafka_bootstrap, kafka_topics, tmp_path):
    """A dead-letter topic too small for the headers, or for the producer's batches, stops the worker at start
    with the keys named; one merely below stream.max_message_bytes is a warning (excerpts)."""
    features, labels, predictions = kafka_topics("features", "labels", "predictions")
    (tiny,) = kafka_topics("tiny", config={"max.message.bytes": "4096"})
    (half,) = kafka_topics("half", config={"max.message.bytes": "500000"})

    def cfg(dead, **producer):
        names = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
        raw = raw_config(kafka_bootstrap, names, tmp_path / "snap", exactly_once=False)
        raw["kafka"]["producer"] = producer
        return config_from_dict(raw, environ={})

    conf = {"bootstrap.servers": kafka_bootstrap}
    with pytest.raises(ValueError, match=rf"{tiny} \(topics\.dead_letters\) has max\.message\.bytes=4096"):
        deadletters.start_limit(cfg(tiny), conf)
    with pytest.raises(ValueError, match=rf"topic {half} allows .*=500000.*kafka\.producer\.batch\.size"):
        deadletters.start_limit(cfg(half), conf)
    limit, warnings = deadletters.start_limit(cfg(half, **{"batch.size": 400_000}), conf)
    assert limit.topic_bytes == 500_000 and limit.limit == 500_000
    assert (
        len(warnings) == 1
        and "go to it as excerpts" in warnings[0]
        and "stream.max_message_bytes" in warnings[0]
    )
    limit, warnings = deadletters.start_limit(
        cfg(f"{half}-missing"), conf
    )  # cannot be described: sized to P alone
    assert limit.topic_bytes is None and "cannot read max.message.bytes" in warnings[0]
    worker = Worker(cfg(tiny))
    assert worker.run() == EXIT_FATAL  # the WorkerError ends the run at start
    with pytest.raises(WorkerError, match="max.message.bytes=4096"):
        worker.output.read_limits()


@pytest.mark.kafka
def test_created_topics_get_a_limit_that_fits(kafka_bootstrap, kafka_admin, tmp_path):
    """ensure_topics (the worker) and produce.create_topics (the CLI) share topics.create_topics: input and
    dead-letter topics fit stream.max_message_bytes + headroom, the predictions topic keeps the default."""
    tag = uuid.uuid4().hex[:8]
    names = {k: f"t-created-{tag}-{k}" for k in ("features", "labels", "predictions", "dead_letters")}
    cfg = config_from_dict(
        raw_config(kafka_bootstrap, names, tmp_path, exactly_once=False, max_message_bytes=2_000_000),
        environ={},
    )
    cli = [f"t-created-{tag}-cli-{k}" for k in ("features", "predictions")]
    try:
        assert sorted(ensure_topics(cfg, kafka_admin)) == sorted(names.values())
        assert produce.create_topics({"bootstrap.servers": kafka_bootstrap}, cli, sized=cli[:1]) == cli
        time.sleep(0.5)
        want = 2_000_000 + message_limits.DEAD_LETTER_HEADROOM
        got = {k: message_limits.describe_max_message_bytes(kafka_admin, n) for k, n in names.items()}
        assert got == {"features": want, "labels": want, "predictions": 1_048_588, "dead_letters": want}
        # the default stream.max_message_bytes fits Kafka's default limit: the broker's default it keeps
        assert message_limits.describe_max_message_bytes(kafka_admin, cli[0]) == 1_048_588
        assert message_limits.describe_max_message_bytes(kafka_admin, cli[1]) == 1_048_588
    finally:
        kafka_admin.delete_topics(list(names.values()) + cli)
