"""Named-field events on a real broker (docs/design.md §11): the worker reads a team's own events (nested
fields, nulls, a value not declared, booleans as labels), dead-letters a wrong type and a missing required
field naming the field, loses nothing else; a restart with a changed schema is refused naming the field; two
members of a group with one schema hold one model.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from kafka_util import consume_all, produce_json, unique_group
from worker_thread import WorkerThread

from iolstream.kafka.config import config_from_dict
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.snapshots import SnapshotStore
from iolstream.kafka.worker import EXIT_OK, Worker
from iolstream.stream.group import model_digest

pytestmark = pytest.mark.kafka

FIELDS = [
    {"name": "amount", "type": "number"},
    {"name": "country", "type": "category", "values": ["FR", "DE", "US"]},
    {"name": "device.os", "type": "category", "buckets": 8},
    {"name": "coupon", "type": "boolean"},
    {"name": "age", "type": "number", "required": True},
]


def raw_config(bootstrap, names, snap_dir, fields=FIELDS, **sections) -> dict:
    features, labels, predictions, dead = names[:4]
    raw = {
        "model": {"classes": [False, True], "features": fields, "n_nodes": 16, "warmup_rows": 32},
        "events": {
            "id_field": "order_id",
            "label_field": "is_fraud",
            "time_field": "ts",
            "passthrough": ["shop"],
        },
        "kafka": {"bootstrap_servers": bootstrap, "group_id": unique_group("events")},
        "topics": {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead},
        "stream": {"batch_rows": 16, "label_batch_rows": 16, "max_batch_latency_ms": 20},
        "snapshot": {"dir": str(snap_dir)},
        "metrics": {"port": 0},
        "logging": {"status_every_seconds": 1},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


def order(i: int, rng) -> dict:
    """An event as a team's topic has it: nested device, a null coupon now and then, an undeclared country
    (IT), a field the model does not read (shop, passed through)."""
    return {
        "order_id": f"o-{i}",
        "amount": None if i % 7 == 0 else round(float(rng.lognormal(3, 1)), 2),
        "country": ["FR", "DE", "US", "IT"][i % 4],
        "device": {"os": ["ios", "android", "web"][i % 3]},
        "coupon": None if i % 5 == 0 else bool(i % 2),
        "age": int(rng.integers(18, 80)),
        "ts": 1_764_000_000_000 + i,
        "shop": f"s{i % 3}",
    }


BAD = [
    (
        {"order_id": "bad-1", "amount": "12.5", "age": 30},
        "bad_field",
        "field 'amount' is a string, not a number",
    ),
    ({"order_id": "bad-2", "amount": 3.0}, "missing_field", "field 'age' is required, but missing or null"),
    (
        {"order_id": "bad-3", "country": {"code": "FR"}, "age": 30},
        "bad_field",
        "field 'country' is an object",
    ),
    ({"amount": 1.0, "age": 30}, "missing_id", "(field 'order_id')"),
]


def test_a_team_s_events_end_to_end(kafka_bootstrap, kafka_topics, tmp_path):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    cfg = config_from_dict(raw_config(kafka_bootstrap, topics, tmp_path / "snap"), environ={})
    rng = np.random.default_rng(0)
    n = 200
    events = [order(i, rng) for i in range(n)]
    truth = {e["order_id"]: e["amount"] is not None and e["amount"] > 30 for e in events}
    # one event per message for the first half, batches (JSON arrays) of 10 for the rest; bad ones among them
    messages = [orjson.dumps(e) for e in events[:100]] + [
        orjson.dumps(events[i : i + 10]) for i in range(100, n, 10)
    ]
    messages[3:3] = [orjson.dumps(bad) for bad, _, _ in BAD[:2]]
    messages.append(orjson.dumps([events[150], BAD[2][0], BAD[3][0]]))  # o-150 again: a duplicate
    labels = [orjson.dumps({"order_id": i, "is_fraud": y}) for i, y in truth.items()]
    with WorkerThread(cfg) as w:
        w.wait_assigned(2)
        produce_json(kafka_bootstrap, topics[0], messages)
        produce_json(kafka_bootstrap, topics[1], labels)
        status = w.wait(
            lambda s: s["rows_learned"] == n and s["predictions_out"] == n, 90, "every row learned"
        )
        assert w.stop() == EXIT_OK
    assert status["rows_in"] == n and status["labels_in"] == n
    assert status["fields"]["undeclared"] == {"country": n // 4}  # IT, counted per field
    assert status["fields"]["missing"] == {"amount": len(range(0, n, 7)), "coupon": n // 5}
    predictions = [orjson.loads(v) for _, v, _, _, _ in consume_all(kafka_bootstrap, topics[2], expected=n)]
    assert sorted(p["order_id"] for p in predictions) == sorted(truth)  # one each, under the team's id field
    assert all(
        p["shop"] == f"s{int(p['order_id'][2:]) % 3}" and isinstance(p["y_hat"], bool) for p in predictions
    )
    assert {p["event_ts"] - 1_764_000_000_000 for p in predictions} == set(range(n))
    dead = consume_all(kafka_bootstrap, topics[3], expected=len(BAD) + 1)
    got = {}
    for _, value, headers, _, _ in dead:
        h = dict(headers)
        got[orjson.loads(value).get("order_id")] = (
            h["iolstream.reason"].decode(),
            h["iolstream.detail"].decode(),
        )
    assert got["o-150"][0] == "duplicate_id"
    for bad, reason, detail in BAD:
        assert got[bad.get("order_id")][0] == reason and detail in got[bad.get("order_id")][1], got
    assert status["dead_letters"] == len(BAD) + 1  # nothing else refused, nothing lost


def test_a_restart_with_another_schema_is_refused_naming_the_field(
    kafka_bootstrap, kafka_topics, tmp_path, caplog
):
    topics = kafka_topics("features", "labels", "predictions", "dead")
    raw = raw_config(kafka_bootstrap, topics, tmp_path / "snap")
    rng = np.random.default_rng(1)
    with WorkerThread(config_from_dict(raw, environ={})) as w:
        w.wait_assigned(2)
        produce_json(kafka_bootstrap, topics[0], [order(i, rng) for i in range(40)])
        w.wait(lambda s: s["predictions_out"] == 40, 60, "the rows predicted")
        assert w.stop() == EXIT_OK
    assert SnapshotStore(tmp_path / "snap", 3).load_latest() is not None
    changed = [dict(f) for f in FIELDS]
    changed[1]["values"] = ["FR", "DE", "US", "IT"]
    raw["model"]["features"] = changed
    with pytest.raises(WorkerError) as refused:
        Worker(config_from_dict(raw, environ={}))
    assert "(model.features: field 'country': values ['FR', 'DE', 'US'] -> ['FR', 'DE', 'US', 'IT'])" in str(
        refused.value
    )


def test_the_schema_is_in_the_group_s_model_digest(tmp_path):
    base = config_from_dict(raw_config("127.0.0.1:1", ["f", "l", "p", "d"], tmp_path), environ={})
    same = config_from_dict(raw_config("127.0.0.1:1", ["f", "l", "p", "d"], tmp_path), environ={})
    changed = [dict(f) for f in FIELDS]
    changed[2]["buckets"] = 16
    other = config_from_dict(raw_config("127.0.0.1:1", ["f", "l", "p", "d"], tmp_path, changed), environ={})
    assert model_digest(base.model) == model_digest(same.model) != model_digest(other.model)
    plain = config_from_dict({"model": {"n_inputs": 3, "classes": [0, 1]}}, environ={})
    assert "features" not in plain.model.to_dict()  # the digest of a model without a schema is as before


def test_a_group_of_two_with_one_schema_holds_one_model(kafka_bootstrap, kafka_topics, tmp_path):
    inputs = kafka_topics("features", "labels", partitions=2)
    outputs = kafka_topics("predictions", "dead", "deltas")
    topics = [*inputs, *outputs[:2]]
    group = unique_group("events-group")

    def member(name: str):
        raw = raw_config(
            kafka_bootstrap,
            topics,
            tmp_path / "snap",
            kafka={"group_id": group},
            topics={"model_deltas": outputs[2] + "-g", "partitions": 2},
            group={"enabled": True, "member_id": name, "sync_every_ms": 200},
        )
        return WorkerThread(config_from_dict(raw, environ={}))

    rng = np.random.default_rng(2)
    n = 240
    events = [order(i, rng) for i in range(n)]
    labels = [{"order_id": e["order_id"], "is_fraud": e["age"] > 50} for e in events]
    with member("a") as a, member("b") as b:
        a.wait_assigned(1)
        b.wait_assigned(1)
        produce_json(kafka_bootstrap, topics[0], events, key=lambda e: e["order_id"])
        produce_json(kafka_bootstrap, topics[1], labels, key=lambda e: e["order_id"])

        def learned_everything(_):
            sums = [w.worker.processor.model.learner.state for w in (a, b)]
            return all(s.rows_labelled == n and s.rows_observed == n for s in sums)

        a.wait(learned_everything, 120, "both members to hold every row and label")
        assert a.stop() == EXIT_OK and b.stop() == EXIT_OK
    ma, mb = a.worker.processor.model, b.worker.processor.model
    assert model_digest(ma.config) == model_digest(mb.config)
    np.testing.assert_array_equal(ma.scaler.mean, mb.scaler.mean)  # the scaling the group agreed on
    for la, lb in zip(ma.learner.state.layers, mb.learner.state.layers):
        np.testing.assert_allclose(la.beta, lb.beta, rtol=1e-9, atol=1e-12)
    assert a.status()["rows_in"] + b.status()["rows_in"] == n


def test_schema_infer_then_produce_csv_then_run(kafka_bootstrap, kafka_topics, tmp_path, capsys):
    """A table to a running worker with no hand-written config: `schema infer` writes it, `produce --csv`
    sends the rows as named-field events (the id and label fields of the config, the ids the file's own), every
    row is predicted under its id."""
    import yaml
    from tables_util import orders_csv

    from iolstream.tools import cli

    data = orders_csv(tmp_path / "orders.csv", n=300)
    config = tmp_path / "orders.yaml"
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud", "-o", str(config)]) == 0
    topics = kafka_topics("features", "labels", "predictions", "dead")
    raw = yaml.safe_load(config.read_text())  # what the environment overrides would set, written in
    raw["kafka"].update(bootstrap_servers=kafka_bootstrap, group_id=unique_group("infer"))
    raw["topics"] = dict(zip(("features", "labels", "predictions", "dead_letters"), topics))
    raw["snapshot"] = {"dir": str(tmp_path / "snap")}
    raw["model"].update(n_nodes=16, warmup_rows=64)
    raw["metrics"] = {"port": 0}
    config.write_text(yaml.safe_dump(raw))
    cfg = config_from_dict(raw, environ={})
    with WorkerThread(cfg) as w:
        w.wait_assigned(2)
        args = [
            "produce",
            "-c",
            str(config),
            "--csv",
            str(data),
            "--target",
            "is_fraud",
            "--batch-rows",
            "20",
        ]
        assert cli.main([*args, "--label-delay-rows", "20", "--follow", "--quiet"]) == 0
        status = w.wait(lambda s: s["rows_learned"] == 300, 60, "every label")
        assert w.stop() == EXIT_OK
    assert (status["rows_in"], status["predictions_out"], status["dead_letters"]) == (300, 300, 0)
    predictions = [orjson.loads(v) for _, v, _, _, _ in consume_all(kafka_bootstrap, topics[2], expected=300)]
    assert {p["order_id"] for p in predictions} == {f"o-{i}" for i in range(300)}  # the file's own ids
    capsys.readouterr()
    assert cli.main([*args, "--quiet"]) == 0  # the same file again: its ids are on the topic, and it says so
    assert f"300 of the 300 ids to send (o-0 .. o-299) are in {topics[0]} already" in capsys.readouterr().err
