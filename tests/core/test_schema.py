"""The feature schema and its encoding (docs/design.md §11): the rows equal a reference built with
scikit-learn, bucket indices are pinned (the same on every machine, process and Python version), the batch
path equals the one-record path, the scaler z-scores number columns only and maps a gap to the mean."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from iolstream.core.encoder import RecordEncoder, Refused
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.scaling import Scaler
from iolstream.core.schema import FeatureSchema, SchemaError, bucket_of, category_key
from iolstream.core.schema_infer import id_like, infer_schema

FIELDS = [
    {"name": "amount", "type": "number"},
    {"name": "age", "type": "number", "required": True},
    {"name": "country", "type": "category", "values": ["FR", "DE", "US"]},
    {"name": "device.os", "type": "category", "values": ["ios", "android"]},
    {"name": "merchant", "type": "category", "buckets": 8},
    {"name": "coupon", "type": "boolean"},
]

# (text, buckets) -> bucket: BLAKE2b (8 bytes, little-endian) of the UTF-8 text, modulo the buckets. A change
# here moves every hashed value of every deployed model to another column: never change it.
BUCKETS = {
    ("FR", 64): 44,
    ("ios", 64): 44,
    ("android", 64): 24,
    ("m17", 64): 33,
    ("", 64): 36,
    ("é", 64): 11,
    ("42", 64): 23,
    ("true", 64): 53,
    ("FR", 1000): 860,
    ("android", 1000): 168,
    ("é", 1000): 963,
    ("m17", 1 << 20): 846113,
}


def test_bucket_indices_are_pinned():
    assert {key: bucket_of(*key) for key in BUCKETS} == BUCKETS


def test_bucket_indices_do_not_depend_on_the_process_hash_seed():
    code = (
        "from iolstream.core.schema import bucket_of; print([bucket_of(v, 64) for v in ('FR', 'ios', 'é')])"
    )
    seen = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        seen.add(out.stdout.strip())
    assert seen == {"[44, 44, 11]"}


def test_a_hashed_value_lands_in_its_pinned_column():
    schema = FeatureSchema.parse([{"name": "m", "type": "category", "buckets": 64}])
    row, _, _ = RecordEncoder(schema).encode_one({"m": "m17"})
    assert row.nonzero()[0].tolist() == [33]
    row, missing, _ = RecordEncoder(schema).encode_one({})
    assert row.nonzero()[0].tolist() == [64] and missing == [0]  # the missing slot after the 64 buckets


def test_category_values_compare_as_text():
    assert [category_key(v) for v in ("3", 3, 3.0, True, np.int64(3), np.str_("a"))] == [
        "3",
        "3",
        "3",
        "true",
        "3",
        "a",
    ]
    with pytest.raises(TypeError):
        category_key({"a": 1})


@pytest.mark.parametrize(
    "fields, message",
    [
        ([{"name": "x", "type": "text"}], r"model.features\[0\] \(x\).type: must be one of number"),
        ([{"name": "c", "type": "category"}], r"\(c\): a category field needs either values"),
        ([{"name": "c", "type": "category", "values": ["a"], "buckets": 4}], "either values"),
        ([{"name": "c", "type": "category", "values": ["1", 1]}], "'1' is declared twice"),
        ([{"name": "x", "type": "number", "values": [1]}], r"\(x\).values: not a key of a number field"),
        ([{"name": "x", "type": "number", "required": "yes"}], r"\(x\).required: must be true or false"),
        ([{"name": "a.", "type": "number"}], r"model.features\[0\].name: must be a field name"),
        ([{"name": "x", "type": "number"}, {"name": "x", "type": "boolean"}], "'x' is listed twice"),
        ([{"name": "d", "type": "number"}, {"name": "d.os", "type": "boolean"}], "'d' is a field and also"),
        ([], "must list at least one field"),
    ],
)
def test_a_bad_schema_is_refused_naming_the_field_and_key(fields, message):
    with pytest.raises((SchemaError, ValueError), match=message):
        ModelConfig(classes=(0, 1), features=fields)


def test_the_encoded_width_is_n_inputs_and_a_config_that_disagrees_is_refused():
    cfg = ModelConfig(classes=(0, 1), features=FIELDS)
    assert cfg.n_inputs == 2 + 1 + 5 + 4 + 9 + 2 == FeatureSchema.parse(FIELDS).width
    assert ModelConfig(n_inputs=23, classes=(0, 1), features=FIELDS).n_inputs == 23
    with pytest.raises(
        ValueError, match=r"model.n_inputs: 20 disagrees with model.features, which encode 23"
    ):
        ModelConfig(n_inputs=20, classes=(0, 1), features=FIELDS)


def test_without_a_schema_the_config_is_the_one_of_before():
    cfg = ModelConfig(n_inputs=4, classes=(0, 1))
    assert "features" not in cfg.to_dict() and cfg.schema is None


def events(n: int, seed: int) -> list[dict]:
    """Events with every case: nested fields, nulls, absent fields, undeclared and hashed values."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        e = {"age": float(rng.integers(18, 90))}
        if rng.random() > 0.2:
            e["amount"] = None if rng.random() < 0.3 else float(rng.lognormal(3, 1))
        if rng.random() > 0.1:
            e["country"] = str(rng.choice(["FR", "DE", "US", "IT", None]))
            e["country"] = None if e["country"] == "None" else e["country"]
        if rng.random() > 0.3:
            e["device"] = {"os": str(rng.choice(["ios", "android", "linux"]))} if rng.random() > 0.1 else None
        e["merchant"] = f"m{rng.integers(0, 30)}"
        if rng.random() > 0.3:
            e["coupon"] = bool(rng.random() < 0.5)
        e["unknown_extra"] = {"ignored": [1, 2]}
        out.append(e)
    return out


def sklearn_reference(records: list[dict], warmup: int) -> np.ndarray:
    """The scaled rows built with scikit-learn: OneHotEncoder over the declared values (an undeclared value and
    a missing one as two more categories), hashed slots by their pinned hash, the warm-up scaler (mean and
    deviation of the values present among the first ``warmup`` records, ddof 1) with a gap at the mean, and
    0/1 missing indicators (MissingIndicator)."""
    from sklearn.impute import MissingIndicator
    from sklearn.preprocessing import OneHotEncoder

    def get(r, path):
        for part in path.split("."):
            r = r.get(part) if isinstance(r, dict) else None
        return r

    def numbers(name):
        return np.array([np.nan if get(r, name) is None else get(r, name) for r in records], dtype=float)

    def slots(name, declared):
        values = [get(r, name) for r in records]
        column = [["<missing>" if v is None else v if v in declared else "<other>"] for v in values]
        enc = OneHotEncoder(categories=[[*declared, "<other>", "<missing>"]], sparse_output=False)
        return enc.fit_transform(column)

    def zscore(x):
        head = x[:warmup][~np.isnan(x[:warmup])]
        z = (x - head.mean()) / head.std(ddof=1)
        return np.where(np.isnan(z), 0.0, z)

    def indicator(x):
        return MissingIndicator(features="all").fit_transform(x.reshape(-1, 1)).astype(float)

    amount, age = numbers("amount"), numbers("age")
    merchants = [get(r, "merchant") for r in records]
    hashed = OneHotEncoder(categories=[list(range(9))], sparse_output=False).fit_transform(
        [[8 if m is None else bucket_of(m, 8)] for m in merchants]
    )
    coupon = np.array([np.nan if get(r, "coupon") is None else float(get(r, "coupon")) for r in records])
    return np.hstack(
        [
            zscore(amount)[:, None],
            indicator(amount),
            zscore(age)[:, None],
            slots("country", ["FR", "DE", "US"]),
            slots("device.os", ["ios", "android"]),
            hashed,
            np.nan_to_num(coupon)[:, None],
            indicator(coupon),
        ]
    )


def test_the_model_encodes_rows_as_the_scikit_learn_reference_does():
    records = events(400, seed=1)
    warmup = 100
    model = EdRVFL(ModelConfig(classes=(0, 1), features=FIELDS, warmup_rows=warmup, n_nodes=8))
    X = model.encode(records)
    model.scaler.partial_fit(X[:warmup])
    assert model.ready
    got = model.scaler.transform(X)
    np.testing.assert_allclose(got, sklearn_reference(records, warmup), rtol=1e-12, atol=1e-12)


def test_the_batch_path_equals_the_one_record_path_and_refuses_the_same_records():
    enc = RecordEncoder(FeatureSchema.parse(FIELDS))
    records = events(300, seed=2)
    records += [
        {"age": 30, "amount": "12.5"},  # text for a number
        {"age": 30, "country": {"code": "FR"}},  # an object for a category
        {"amount": 3.0},  # a required field missing
        {"age": None},  # ... or null
        {"age": 30, "device": "ios"},  # a path through a text
        {"age": 30, "coupon": "maybe"},
        {"age": float("inf")},
        "not an event",
        {"age": 41, "coupon": "TRUE", "country": 7, "merchant": 17.0, "amount": 4},  # coerced, not refused
    ]
    batch = enc.encode(records)
    rows, refused, missing, undeclared = [], [], np.zeros(6, int), np.zeros(6, int)
    for i, r in enumerate(records):
        try:
            row, miss, undecl = enc.encode_one(r)
        except Refused as exc:
            refused.append((i, exc.reason, exc.detail))
            continue
        rows.append(row)
        missing[miss] += 1
        undeclared[undecl] += 1
    np.testing.assert_array_equal(batch.X, np.array(rows))
    assert batch.refused == refused
    assert [r for _, r, _ in refused] == ["bad_field", "bad_field", "missing_field", "missing_field"] + [
        "bad_field"
    ] * 3 + ["bad_schema"]
    assert refused[0][2] == "field 'amount' is a string, not a number"
    assert refused[1][2] == "field 'country' is an object, not a category value"
    assert refused[4][2] == "field 'device.os': 'device' is a string, not an object"
    np.testing.assert_array_equal(batch.missing, missing)
    np.testing.assert_array_equal(batch.undeclared, undeclared)
    assert undeclared[2] > 0 and undeclared[3] > 0  # IT, linux: counted per field


@pytest.mark.parametrize(
    "odd",
    [[1, 2], {"a": 1}, [3], "12.5", None, 2**70, 2**63, float("inf"), 7, 7.5],
    ids=["array", "object", "one-element array", "text", "null", "huge int", "2**63", "inf", "int", "float"],
)
@pytest.mark.parametrize("no_bools", [True, False])
@pytest.mark.parametrize("more", [0, 10], ids=["a list per field", "one flat list"])
def test_the_number_block_equals_the_one_record_path_whatever_one_value_is(odd, no_bools, more):
    """Records that all hold the top-level number fields (read as one block, ``BLOCK_COLUMNS_BELOW``): one value
    of another kind in one record is refused, or taken, as the one-record path does it, the others' rows
    unchanged; an array among the numbers was a crash (a block of no shape)."""
    fields = FIELDS + [{"name": f"extra{j}", "type": "number"} for j in range(more)]
    enc = RecordEncoder(FeatureSchema.parse(fields))
    records = [{"amount": float(i), "age": 20 + i, "country": "FR"} for i in range(6)]
    for j, r in enumerate(records):
        r.update({f"extra{k}": k * j - 0.5 for k in range(more)})
    records[3]["amount"] = odd
    batch = enc.encode(records, no_bools=no_bools)
    rows, refused = [], []
    for i, r in enumerate(records):
        try:
            rows.append(enc.encode_one(r)[0])
        except Refused as exc:
            refused.append((i, exc.reason, exc.detail))
    assert batch.refused == refused
    np.testing.assert_array_equal(batch.X, np.array(rows))


def test_the_warmup_scaler_skips_gaps_and_leaves_one_hot_columns_alone():
    scaled = np.array([True, False, True])
    s = Scaler("warmup", 3, warmup_rows=4, scaled=scaled)
    s.partial_fit(np.array([[1.0, 1.0, np.nan], [3.0, 0.0, 2.0], [np.nan, 1.0, 4.0], [5.0, 0.0, np.nan]]))
    assert s.frozen
    np.testing.assert_allclose(s.mean, [3.0, 0.0, 3.0])
    np.testing.assert_allclose(s.scale, [2.0, 1.0, np.sqrt(2.0)])
    np.testing.assert_allclose(s.transform(np.array([[np.nan, 1.0, 3.0 + np.sqrt(2)]])), [[0.0, 1.0, 1.0]])
    state = s.to_state()
    again = Scaler("warmup", 3, warmup_rows=4, scaled=scaled)
    again.load_state(state)
    np.testing.assert_array_equal(again.transform(np.array([[7.0, 0.0, np.nan]])), [[2.0, 0.0, 0.0]])


def test_fixed_and_none_scalers_with_a_schema():
    fields = [{"name": "x", "type": "number", "mean": 10.0, "std": 2.0}, {"name": "b", "type": "boolean"}]
    fixed = EdRVFL(ModelConfig(classes=(0, 1), features=fields, scaler="fixed", n_nodes=8))
    X = fixed.encode([{"x": 14, "b": True}, {"b": None}])
    np.testing.assert_allclose(fixed.scaler.transform(X), [[2.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    with pytest.raises(
        ValueError, match=r"model.features \(x\): with scaler 'fixed' every number field needs"
    ):
        ModelConfig(classes=(0, 1), features=[{"name": "x", "type": "number"}], scaler="fixed")
    none = EdRVFL(
        ModelConfig(
            classes=(0, 1), features=fields[1:] + [{"name": "y", "type": "number"}], scaler="none", n_nodes=8
        )
    )
    X = none.encode([{"b": False, "y": 7.5}, {"b": True}])
    np.testing.assert_allclose(none.scaler.transform(X), [[0.0, 0.0, 7.5, 0.0], [1.0, 0.0, 0.0, 1.0]])


def test_a_schema_model_round_trips_through_its_state():
    import io

    from iolstream.core import state_io

    model = EdRVFL(ModelConfig(classes=(False, True), features=FIELDS, warmup_rows=50, n_nodes=8))
    X = model.encode(events(120, seed=3))
    model.scaler.partial_fit(X[:50])
    pred = model.observe(X)
    model.learn(pred.features_t, model.encode_labels(np.arange(120) % 3 == 0), predicted=pred.predicted)
    buf = io.BytesIO()
    state_io.save_model(buf, model)
    buf.seek(0)
    restored = state_io.load_model(buf)
    assert restored.config == model.config and restored.config.classes == (False, True)
    np.testing.assert_array_equal(restored.predict_batch(X).proba, model.predict_batch(X).proba)
    np.testing.assert_array_equal(restored.encode(events(5, seed=4)), model.encode(events(5, seed=4)))


def test_inference_types_gaps_values_and_identifiers():
    n = 40
    columns = {
        "order_id": [f"o-{i}" for i in range(n)],
        "amount": ["1.5", "", "3", "NA"] * (n // 4),
        "vip": ["true", "False", "", "TRUE"] * (n // 4),
        "city": [f"c{i % 25}" for i in range(n)],
        "plan": ["a", "b", "b", "?"] * (n // 4),
        "count": [1, 2, 3, 4] * (n // 4),
        "blank": ["", None, "NA", float("nan")] * (n // 4),  # nothing to learn from: no type to give it
    }
    schema, notes = infer_schema(columns, max_values=20, buckets=16)
    assert notes["blank"] == f"left out: every value missing ({n} rows)"
    assert [f.to_config() for f in schema.fields] == [
        {"name": "amount", "type": "number"},
        {"name": "vip", "type": "boolean"},
        {"name": "city", "type": "category", "buckets": 16},
        {"name": "plan", "type": "category", "values": ["b", "a"]},
        {"name": "count", "type": "number", "indicator": False},
    ]
    assert notes["order_id"].startswith("left out") and notes["amount"] == "20 of 40 missing"


def test_inference_leaves_out_numbers_that_count_rows():
    """A row number (in any order), an auto-increment id with a break, a clock: distinct numbers that say where a
    row sits, not what it is, are left out; the integers among them are identifiers, the clock is not. Distinct
    measurements in no order, a sorted column with a repeat, and a short column stay inputs."""
    rng = np.random.default_rng(0)
    n = 60
    columns = {
        "amount": rng.lognormal(3, 1, n).round(4).tolist(),  # distinct, in no order: an input
        "rownames": rng.permutation(np.arange(1, n + 1)).tolist(),
        "order_no": list(range(1000, 1030)) + list(range(7, 37)),  # two runs: rising in 58 of 59 steps
        "ts": (1.7e9 + np.cumsum(rng.uniform(0.1, 2.0, n))).tolist(),
        "level": sorted(rng.integers(0, 5, n).tolist()),  # sorted, but repeats: an input
    }
    schema, notes = infer_schema(columns)
    assert [f.name for f in schema.fields] == ["amount", "level"]
    assert (
        notes["rownames"]
        == f"left out: an identifier or a row number: 1..{n}, each once, in no order ({n} rows)"
    )
    assert (
        notes["order_no"]
        == f"left out: an identifier or a counter: every value distinct, rising in 58 of 59 steps ({n} rows)"
    )
    assert notes["ts"] == f"left out: a clock: every value distinct, rising ({n} rows)"
    assert id_like(notes) == ["rownames", "order_no"]
    short = {"rownames": list(range(10)), "amount": columns["amount"][:10]}
    assert [f.name for f in infer_schema(short)[0].fields] == ["rownames", "amount"]  # too few rows to tell
