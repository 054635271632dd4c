"""`iolstream produce`: the message plan (pure), the command line, and one replay on a real broker."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import orjson
import pytest
import yaml

from iolstream.tools import cli, produce
from iolstream.tools.builtin_datasets import load
from iolstream.tools.follow import learning_curve
from iolstream.tools.plan import PlanOptions, iter_plan, plan, plan_summary
from iolstream.tools.protocol import Protocol, make_split


def rows(n: int, k: int = 3):
    X = np.arange(n * k, dtype=float).reshape(n, k)
    y = np.arange(n) % 4
    return X, y


def label_events(messages):
    """[(position in the plan, row index)] of every label sent, in send order."""
    out = []
    for pos, m in enumerate(messages):
        if m.kind == "labels":
            ids = m.obj["ids"] if "ids" in m.obj else [m.obj["id"]]
            out += [(pos, int(i[1:])) for i in ids]
    return out


def rows_sent_before(messages, pos: int) -> int:
    return sum(m.rows for m in messages[:pos] if m.kind == "features")


def test_features_go_out_once_in_order_as_rows_or_batches():
    X, y = rows(23)
    single = plan(X, y, PlanOptions(with_ts=False))
    assert [m.obj for m in single if m.kind == "features"] == [
        {"id": f"r{i}", "x": X[i].tolist()} for i in range(23)
    ]
    batched = plan(X, y, PlanOptions(batch_rows=5, with_ts=False, id_prefix="q"))
    feats = [m for m in batched if m.kind == "features"]
    assert [m.rows for m in feats] == [5, 5, 5, 5, 3] and feats[-1].obj["ids"] == ["q20", "q21", "q22"]
    assert np.array_equal(np.concatenate([m.obj["x"] for m in feats]), X)
    assert plan_summary(batched) == {
        "feature_messages": 5,
        "feature_rows": 23,
        "label_messages": 5,
        "label_rows": 23,
    }


@pytest.mark.parametrize("delay", [0, 1, 7])
def test_label_delay_in_rows(delay):
    X, y = rows(40)
    messages = plan(X, y, PlanOptions(label_delay_rows=delay))
    events = label_events(messages)
    assert [i for _, i in events] == list(range(40))
    for pos, i in events:
        sent = rows_sent_before(messages, pos)
        assert sent >= min(i + delay + 1, 40), f"label {i} went out after only {sent} rows"
        assert sent == 40 or sent == i + delay + 1, f"label {i} held back too long"
    assert all(messages[pos].obj["y"] == int(y[i]) for pos, i in events)


def test_missing_duplicated_and_shuffled_labels():
    X, y = rows(2000)
    options = PlanOptions(
        label_delay_rows=10, missing_fraction=0.1, duplicate_fraction=0.2, shuffle_window=25, seed=4
    )
    messages = plan(X, y, options)
    events = label_events(messages)
    counts = Counter(i for _, i in events)
    missing = 2000 - len(counts)
    twice = sum(c == 2 for c in counts.values())
    assert set(counts.values()) <= {1, 2}
    assert 150 < missing < 250 and 0.15 < twice / len(counts) < 0.25, (missing, twice)
    first = list(dict.fromkeys(i for _, i in events))  # first copies, in send order
    assert first != sorted(first), "labels must come out of order"
    assert all(i // 25 == j // 25 for i, j in zip(first, sorted(first))), "shuffled only within windows of 25"
    for pos, i in events:  # never before its features (plus the delay)
        assert rows_sent_before(messages, pos) > i
    for i, c in counts.items():  # a duplicate goes out in a later message than the first copy
        if c == 2:
            a, b = [pos for pos, j in events if j == i]
            assert b > a
    assert plan(X, y, options)[-1].obj == messages[-1].obj, "the plan is a function of the seed"


def test_encode_stamps_event_time_on_features_only():
    X, y = rows(4)
    msgs = plan(X, y, PlanOptions(batch_rows=2))
    feats = [orjson.loads(m.encode(1234)) for m in msgs if m.kind == "features"]
    labs = [orjson.loads(m.encode(1234)) for m in msgs if m.kind == "labels"]
    assert [f["ts"] for f in feats] == [1234, 1234] and all("ts" not in lab for lab in labs)
    assert msgs[0].key == b"r0"


def test_regression_and_string_labels():
    X = np.zeros((3, 2))
    assert [m.obj["y"] for m in plan(X, np.array([1.5, 2.0, -1.0]), PlanOptions()) if m.kind == "labels"] == [
        1.5,
        2.0,
        -1.0,
    ]
    two = plan(X, np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), PlanOptions(batch_rows=3))
    assert [m.obj["y"] for m in two if m.kind == "labels"] == [[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]
    strs = plan(X, np.array(["cat", "dog", "cat"]), PlanOptions())
    assert [m.encode() for m in strs if m.kind == "labels"][1] == b'{"id":"r1","y":"dog"}'


class FakeProducer:
    """Records (monotonic time, topic, value) of every produce call."""

    sent: list = []

    def __init__(self, conf):
        self.conf = conf
        FakeProducer.sent = []

    def produce(self, topic, value, key=None, on_delivery=None):
        FakeProducer.sent.append((time.monotonic(), topic, orjson.loads(value)))

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=None):
        return 0

    def purge(self):
        pass


def test_send_keeps_the_rate_and_delays_labels_by_seconds(monkeypatch):
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    X, y = rows(20)
    started = time.monotonic()
    summary = produce.send(
        iter_plan(X, y, PlanOptions()),
        producer_conf={},
        features_topic="F",
        labels_topic="L",
        rate=100.0,
        label_delay_seconds=0.3,
    )
    assert summary["feature_rows"] == summary["label_rows"] == 20
    feature_at = {m["id"]: t for t, topic, m in FakeProducer.sent if topic == "F"}
    label_at = {m["id"]: t for t, topic, m in FakeProducer.sent if topic == "L"}
    assert feature_at["r19"] - started >= 0.19 - 1e-3, "20 rows at 100 rows/s take 0.19 s"
    assert all(label_at[i] - feature_at[i] >= 0.3 for i in feature_at), "every label 0.3 s after its features"
    assert all(isinstance(m["ts"], int) for _, topic, m in FakeProducer.sent if topic == "F")


@pytest.mark.parametrize(
    "bad",
    [
        dict(missing_fraction=1.0),
        dict(duplicate_fraction=-0.1),
        dict(batch_rows=0),
        dict(label_delay_seconds=float("nan")),
        dict(id_prefix=""),
    ],
)
def test_plan_options_are_validated(bad):
    with pytest.raises(ValueError):
        PlanOptions(**bad)


def test_learning_curve_cumulative_and_windowed():
    errors = np.array([0.0, 1.0, np.nan, 1.0, 1.0])
    rows_, cumulative, windowed = learning_curve(errors, "classification", window=2)
    assert rows_.tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(cumulative, [0.0, 0.5, 2 / 3, 0.75])
    np.testing.assert_allclose(windowed, [0.0, 0.5, 1.0, 1.0])
    _, rmse, _ = learning_curve(np.array([4.0, 0.0]), "regression")
    np.testing.assert_allclose(rmse, [2.0, np.sqrt(2.0)])


def test_shuffle_sends_evaluates_training_rows_first():
    """--shuffle --seed S streams the rows in the order `evaluate --seed S` does (training part first)."""

    class Args:
        csv = target = None
        dataset, shuffle, seed, rows = "wine", True, 3, None

    X, y, task, _, ids = produce.load_rows(Args)
    split = make_split(load("wine"), Protocol(seed=3))
    n = len(split.x_train)
    assert task == "classification" and ids is None and np.array_equal(X[:n], split.x_train)
    assert np.array_equal(np.searchsorted(split.classes, y[:n]), split.y_train)


def test_cli_errors_are_one_line_exit_2(capsys):
    assert cli.main(["produce", "--dataset", "nosuch"]) == 2
    assert "unknown data set 'nosuch'" in capsys.readouterr().err
    assert cli.main(["produce", "--dataset", "iris", "--plot", "x.png"]) == 2
    assert "--plot needs --follow" in capsys.readouterr().err
    assert cli.main(["produce", "--csv", "x.csv"]) == 2
    assert cli.main(["produce", "--dataset", "iris", "--missing-fraction", "1.5"]) == 2
    assert "--missing-fraction" in capsys.readouterr().err
    assert cli.main(["produce", "--dataset", "iris", "--rate", "-1"]) == 2


def test_target_from_worker_config_and_options(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"n_inputs": 4, "classes": [0, 1, 2]},
                "kafka": {"bootstrap_servers": "broker:9", "client": {"security.protocol": "SSL"}},
                "topics": {
                    "features": "f1",
                    "labels": "l1",
                    "predictions": "p1",
                    "dead_letters": "d1",
                    "partitions": 3,
                },
            }
        )
    )
    parser = cli.build_parser("produce")
    t = produce.resolve_target(parser.parse_args(["produce", "--dataset", "iris", "-c", str(path)]))
    assert t.client_conf == {"security.protocol": "SSL", "bootstrap.servers": "broker:9"}
    assert (t.features, t.labels, t.predictions, t.dead_letters, t.partitions) == ("f1", "l1", "p1", "d1", 3)
    args = parser.parse_args(
        ["produce", "--dataset", "iris", "-c", str(path), "--bootstrap", "other:1", "--labels-topic", "L"]
    )
    t = produce.resolve_target(args)
    assert (t.client_conf["bootstrap.servers"], t.labels) == ("other:1", "L")
    t = produce.resolve_target(parser.parse_args(["produce", "--dataset", "iris"]))
    assert (t.client_conf, t.features, t.dead_letters) == (
        {"bootstrap.servers": "127.0.0.1:19092"},
        "iol.features",
        None,
    )


@pytest.mark.kafka
def test_produce_command_replays_into_kafka(kafka_bootstrap, kafka_topics):
    from kafka_util import consume_all

    prefix = kafka_topics("x")[0][:-2]  # a unique name stem; --create-topics makes the real ones
    f, lab, p = f"{prefix}-features", f"{prefix}-labels", f"{prefix}-predictions"
    code = cli.main(
        [
            "produce",
            "--dataset",
            "iris",
            "--bootstrap",
            kafka_bootstrap,
            "--features-topic",
            f,
            "--labels-topic",
            lab,
            "--predictions-topic",
            p,
            "--create-topics",
            "--batch-rows",
            "10",
            "--label-delay-rows",
            "20",
            "--duplicate-fraction",
            "0.1",
            "--rate",
            "2000",
            "--quiet",
        ]
    )
    try:
        assert code == 0
        feats = consume_all(kafka_bootstrap, f, timeout=10)
        labs = consume_all(kafka_bootstrap, lab, timeout=10)
        assert len(feats) == 15 and len(consume_all(kafka_bootstrap, p, timeout=5)) == 0
        objs = [orjson.loads(v) for _, v, _, _, _ in feats]
        assert [i for o in objs for i in o["ids"]] == [f"r{i}" for i in range(150)]
        assert all(isinstance(o["ts"], int) and o["ts"] > 1.7e12 for o in objs)
        assert [k for k, _, _, _, _ in feats][:2] == [b"r0", b"r10"]
        label_ids = [i for _, v, _, _, _ in labs for i in orjson.loads(v)["ids"]]
        assert set(label_ids) == {f"r{i}" for i in range(150)} and len(label_ids) > 150
    finally:
        from kafka_util import delete_topics

        delete_topics(kafka_bootstrap, [f, lab, p])


class RefusingProducer(FakeProducer):
    """Every delivery fails as a broker without WRITE on the topic answers."""

    def produce(self, topic, value, key=None, on_delivery=None):
        from confluent_kafka import KafkaError

        class Msg:
            def topic(self):
                return topic

        on_delivery(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), Msg())


def test_a_refused_delivery_stops_the_send_in_one_line_naming_the_topic_exit_6(monkeypatch):
    import confluent_kafka

    from iolstream.tools.send import SendFailed

    monkeypatch.setattr(confluent_kafka, "Producer", RefusingProducer)
    X, y = rows(3)
    conf = {
        "bootstrap.servers": "b:9",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "secret-pw",
    }
    with pytest.raises(SendFailed) as caught:
        produce.send(iter_plan(X, y, PlanOptions()), producer_conf=conf, features_topic="F", labels_topic="L")
    assert str(caught.value) == (
        "not authorised: user 'alice' (PLAIN) may not Write topic 'F' "
        "(a missing ACL: iolstream acls prints those iolstream needs)"
    )
    assert caught.value.exit_code == 6
    assert len(FakeProducer.sent) == 0 and "secret-pw" not in str(caught.value)
