"""The commands on a table of named fields (no broker): ``schema infer`` prints a config that loads and says
what it inferred; ``evaluate --csv`` and ``seed --csv`` on text and blank cells use the config's schema or
the inferred one and say so; the replay plan sends named-field events; the estimators take a DataFrame or
a list of dicts and encode as the worker does."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import yaml
from tables_util import orders_csv

from iolstream.core.model import EdRVFL
from iolstream.core.snapshot_file import load_snapshot
from iolstream.kafka.config import config_from_dict, load_config
from iolstream.tools import cli
from iolstream.tools.plan import EventShape, PlanOptions, plan


def test_schema_infer_prints_a_config_that_runs(tmp_path, capsys):
    data = orders_csv(tmp_path / "orders.csv")
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud"]) == 0
    text = capsys.readouterr().out
    cfg = config_from_dict(yaml.safe_load(text), environ={})
    assert [(f.name, f.type) for f in cfg.model.features] == [
        ("amount", "number"),
        ("country", "category"),
        ("device.os", "category"),
        ("coupon", "boolean"),
    ]
    assert set(cfg.model.features[1].values) == {"FR", "DE", "US"}
    assert cfg.model.classes == (False, True)
    assert (cfg.events.id_field, cfg.events.label_field) == ("order_id", "is_fraud")  # an id column found
    assert cfg.topics.features == "orders.features" and cfg.kafka.group_id == "orders"
    assert "# 45 of 400 missing" in text  # each field's gaps, said beside it
    out = tmp_path / "orders.yaml"
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud", "-o", str(out)]) == 0
    assert (
        load_config(out, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"}).kafka.bootstrap_servers
        == "b:9"
    )


def test_a_row_number_column_is_the_id_not_an_input(tmp_path, capsys):
    """pandas' ``to_csv`` writes the index as a first column; schema infer takes it as the events' id (the file
    has no ``id``), and evaluate --csv says it left it out."""
    import csv

    orders = orders_csv(tmp_path / "orders.csv")
    with open(orders, newline="") as fh:
        rows = list(csv.reader(fh))
    data = tmp_path / "frame.csv"
    with open(data, "w", newline="") as fh:
        csv.writer(fh).writerows(
            [["Unnamed: 0", *rows[0][1:]]] + [[i, *r[1:]] for i, r in enumerate(rows[1:])]
        )
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud"]) == 0
    cfg = config_from_dict(yaml.safe_load(capsys.readouterr().out), environ={})
    assert cfg.events.id_field == "Unnamed: 0"
    assert [f.name for f in cfg.model.features] == ["amount", "country", "device.os", "coupon"]
    args = [
        "evaluate",
        "--csv",
        str(data),
        "--target",
        "is_fraud",
        "--mode",
        "ridge",
        "--nodes",
        "16",
        "--quiet",
    ]
    assert cli.main(args) == 0
    assert "left out: 'Unnamed: 0', an identifier or a row number: 0..399, each once, rising (400 rows)" in (
        capsys.readouterr().out
    )


def test_evaluate_csv_with_text_and_gaps_infers_a_schema_and_says_so(tmp_path, capsys):
    data = orders_csv(tmp_path / "orders.csv")
    args = ["evaluate", "--csv", str(data), "--target", "is_fraud", "--order", "stream", "--mode", "ridge"]
    assert cli.main([*args, "--nodes", "16", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "schema: inferred from orders.csv (1 numbers, 2 categories, 1 booleans, 3 with gaps" in out
    config = tmp_path / "worker.yaml"
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud", "-o", str(config)]) == 0
    capsys.readouterr()
    assert cli.main([*args, "--nodes", "16", "--quiet", "--schema", str(config)]) == 0
    assert f"schema: model.features of {config} (4 fields" in capsys.readouterr().out


def test_seed_reads_the_csv_by_the_config_schema_or_the_inferred_one(tmp_path, capsys):
    data = orders_csv(tmp_path / "orders.csv")
    config = tmp_path / "worker.yaml"
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud", "-o", str(config)]) == 0
    raw = yaml.safe_load(config.read_text())
    raw["model"].update(n_nodes=16, warmup_rows=64)
    raw["snapshot"] = {"dir": str(tmp_path / "snap")}
    config.write_text(yaml.safe_dump(raw))
    assert cli.main(["seed", "-c", str(config), "--csv", str(data), "--target", "is_fraud"]) == 0
    out = capsys.readouterr()
    assert "schema: model.features of" in out.err and "from 400 rows" in out.out
    model = load_snapshot(tmp_path / "snap")
    assert model.config.schema == load_config(config, environ={}).model.schema
    assert model.predict_batch(model.encode([{"amount": 55.0, "country": "US"}])).proba.shape == (1, 2)
    from iolstream.core.snapshot_file import load_newest
    from iolstream.kafka.resume import restored

    cfg = load_config(config, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"})
    status = restored(cfg, load_newest(tmp_path / "snap"), None).processor.status()
    assert status["rows_in"] == 0 and status["fields"] == {
        "missing": {},
        "undeclared": {},
    }  # the stream's own
    from iolstream import EdRVFLClassifier

    clf = EdRVFLClassifier.from_snapshot(tmp_path / "snap")  # the worker's schema: it takes events too
    np.testing.assert_array_equal(
        clf.predict_proba([{"amount": 55.0, "country": "US"}]),
        model.predict_batch(model.encode([{"amount": 55.0, "country": "US"}])).proba,
    )

    plain = tmp_path / "plain.yaml"
    plain.write_text(
        yaml.safe_dump({"model": {"n_inputs": 4, "classes": [False, True]}, "snapshot": raw["snapshot"]})
    )
    assert cli.main(["seed", "-c", str(plain), "--csv", str(data), "--target", "is_fraud", "--replace"]) == 0
    err = capsys.readouterr().err
    assert "schema: inferred from orders.csv" in err and "{'name': 'country', 'type': 'category'" in err
    assert "before `iolstream run`, put it in the config's model section" in err
    seeded = load_snapshot(tmp_path / "snap")  # the inferred schema is the model's: the same as the config's
    assert seeded.config.schema == model.config.schema


def test_the_plan_sends_named_field_events():
    records = [{"amount": 1.5, "device": {"os": "ios"}}, {"amount": None}]
    shape = EventShape(id_field="order_id", label_field="is_fraud", time_field="meta.ts")
    msgs = plan(records, [True, False], PlanOptions(batch_rows=2, label_delay_rows=0), shape)
    features, labels = msgs[0], msgs[1]
    assert orjson.loads(features.encode(now_ms=5)) == [
        {"amount": 1.5, "device": {"os": "ios"}, "order_id": "r0", "meta": {"ts": 5}},
        {"amount": None, "order_id": "r1", "meta": {"ts": 5}},
    ]
    assert orjson.loads(labels.encode()) == [
        {"is_fraud": True, "order_id": "r0"},
        {"is_fraud": False, "order_id": "r1"},
    ]
    keyed = plan(
        records[:1], [True], PlanOptions(with_ts=False), EventShape(id_from_key=True, label_field="l")
    )
    assert [(m.key, orjson.loads(m.encode())) for m in keyed] == [
        (b"r0", {"amount": 1.5, "device": {"os": "ios"}}),
        (b"r0", {"l": True}),
    ]


def test_produce_sends_the_file_s_own_ids_and_refuses_blank_or_repeated_ones(tmp_path):
    """A CSV holding the config's id field: its ids go out (in the order sent, --id-prefix before each when
    given); a file without it is numbered; a blank or a repeated id is refused before anything is sent, naming
    the column and the rows, as the worker would refuse those rows one by one."""
    from iolstream.tools.csv_file import load_table
    from iolstream.tools.plan import row_ids
    from iolstream.tools.produce import file_ids

    data = orders_csv(tmp_path / "orders.csv", n=30)
    table = load_table(data, "is_fraud")
    shape = EventShape(id_field="order_id", label_field="is_fraud")
    ids = file_ids(table, shape)
    assert ids == [f"o-{i}" for i in range(30)]
    assert file_ids(table, EventShape(id_field="id")) is None  # no such column: produce numbers the rows
    assert file_ids(table, EventShape(id_field="order_id", id_from_key=True)) is None
    assert row_ids(2, PlanOptions(ids=("o-7", "o-3"), id_prefix="")) == ["o-7", "o-3"]
    assert row_ids(2, PlanOptions(ids=("o-7", "o-3"), id_prefix="again-")) == ["again-o-7", "again-o-3"]
    text = data.read_text().splitlines()
    (tmp_path / "blank.csv").write_text("\n".join([text[0], "," + text[1].split(",", 1)[1], *text[2:]]))
    with pytest.raises(ValueError, match=r"column 'order_id' \(events.id_field\) is empty at 1 rows \(1\)"):
        file_ids(load_table(tmp_path / "blank.csv", "is_fraud"), shape)
    (tmp_path / "twice.csv").write_text("\n".join([*text, text[3]]))
    with pytest.raises(ValueError, match=r"repeats 1 ids \('o-2' at rows 3 and 31\)"):
        file_ids(load_table(tmp_path / "twice.csv", "is_fraud"), shape)


def test_estimators_take_a_dataframe_or_dicts_and_encode_as_the_worker():
    pd = pytest.importorskip("pandas")
    from iolstream import EdRVFLClassifier

    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(
        {
            "amount": np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(3, 1, n)),
            "country": rng.choice(["FR", "DE", "US", None], n),
            "vip": rng.choice([True, False], n),
        }
    )
    y = (frame["amount"].fillna(0) > 30) & (frame["country"] != "FR")
    clf = EdRVFLClassifier(n_nodes=32, random_state=0).fit(frame, y)
    assert [(f.name, f.type) for f in clf.schema_.fields] == [
        ("amount", "number"),
        ("country", "category"),
        ("vip", "boolean"),
    ]
    records = frame.to_dict(orient="records")
    np.testing.assert_array_equal(clf.predict_proba(frame), clf.predict_proba(records))
    model: EdRVFL = clf.model_
    np.testing.assert_array_equal(model.encode(records), clf.model_.encoder.encode(records).X)
    assert clf.score(frame, y) > 0.8
    with pytest.raises(ValueError, match="fitted on named fields"):
        clf.predict(np.zeros((2, 3)))
    given = EdRVFLClassifier(n_nodes=8, features=[{"name": "amount", "type": "number"}]).fit(records, y)
    assert given.model_.config.n_inputs == 2


def test_a_dataframe_is_read_as_a_table_by_the_estimators():
    """A DataFrame's cells are read as ``evaluate --csv`` reads a table's: a category's values with spaces,
    numbers written as text, NA texts, a dotted or non-text column name, dates: each encodes as its clean
    frame does (before, spaces sent every value to the other slot, a dotted name read every value as missing,
    and numbers as text were refused by the schema inferred from them). A column sorted by its values stays an
    input (the estimators scale by the whole of X); an identifier is left out with a warning naming it."""
    pd = pytest.importorskip("pandas")
    from iolstream import EdRVFLClassifier

    rng = np.random.default_rng(0)
    n = 300
    x, c = rng.normal(size=n), rng.choice(["a", "b", "c"], n)
    y = (x + (c == "a")) > 0.5
    clean = pd.DataFrame({"x": x, "c": c})
    reference = EdRVFLClassifier(n_nodes=32).fit(clean, y).predict_proba(clean)
    messy = pd.DataFrame({"x": [repr(float(v)) for v in x], "c": [f" {v} " for v in c]})
    for frame in (messy, clean.rename(columns={"x": "x.val"}), pd.DataFrame({0: x, 1: c})):
        np.testing.assert_allclose(EdRVFLClassifier(n_nodes=32).fit(frame, y).predict_proba(frame), reference)
    gaps = clean.assign(c=np.where(np.arange(n) % 7 == 0, "NA", c))
    assert set(EdRVFLClassifier(n_nodes=32).fit(gaps, y).schema_.fields[1].values) == {"a", "b", "c"}
    dated = clean.assign(day=pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(n) % 5, unit="D"))
    day = EdRVFLClassifier(n_nodes=32).fit(dated, y).schema_.fields[2]
    assert (day.type, day.values[0]) == ("category", "2024-01-01T00:00:00")
    order = np.argsort(x)
    ranked = EdRVFLClassifier(n_nodes=32).fit(clean.iloc[order], y[order])
    assert list(ranked.feature_names_in_) == ["x", "c"]
    with pytest.warns(
        UserWarning, match=r"X column 'oid' is not an input: every value distinct, an identifier"
    ):
        keyed = EdRVFLClassifier(n_nodes=32).fit(clean.assign(oid=[f"o{i}" for i in range(n)]), y)
    assert list(keyed.feature_names_in_) == ["x", "c"]
    with pytest.raises(ValueError, match=r"X has no column 'x' for a field of the schema .*; columns: c"):
        keyed.predict(clean[["c"]])
    with pytest.raises(ValueError, match=r"X row 3: bad_field: field 'x' is inf"):
        EdRVFLClassifier(n_nodes=32).fit(clean.assign(x=np.where(np.arange(n) == 3, np.inf, x)), y)


def test_the_estimators_check_y_beside_named_fields_and_refuse_before_learning():
    """As ``validate_data`` checks y beside an array: one label per row, a regressor's finite; a label outside
    the classes is refused before any row of the call enters (-F would have put its Gram in already)."""
    pd = pytest.importorskip("pandas")
    from iolstream import EdRVFLClassifier, EdRVFLRegressor

    rng = np.random.default_rng(1)
    n = 300
    frame = pd.DataFrame({"x": rng.normal(size=n), "c": rng.choice(["a", "b"], n)})
    y = frame["x"].to_numpy() > 0
    target = 3 * frame["x"].to_numpy()
    with pytest.raises(ValueError, match="inconsistent numbers of samples: \\[300, 299\\]"):
        EdRVFLClassifier(n_nodes=16).fit(frame, y[:-1])
    reg = EdRVFLRegressor(n_nodes=16).partial_fit(frame, target)
    before = reg.predict(frame)
    broken = target.copy()
    broken[7] = np.nan
    with pytest.raises(ValueError, match="Input y contains NaN"):
        reg.partial_fit(frame, broken)
    np.testing.assert_array_equal(reg.predict(frame), before)  # nothing of the refused call entered
    labels = y.astype(int)
    clf = EdRVFLClassifier(n_nodes=16, mode="forward")
    clf.partial_fit(frame[:100], labels[:100], classes=[1, 0, 1])
    assert clf.classes_.tolist() == [0, 1]
    before = clf.predict_proba(frame)
    with pytest.raises(ValueError, match=r"y holds 2, not one of the classes \[0, 1\] \(1 unknown\)"):
        clf.partial_fit(frame[100:200], np.r_[labels[100:199], 2])
    np.testing.assert_array_equal(clf.predict_proba(frame), before)
    with pytest.raises(ValueError, match="features: X must hold named fields"):
        EdRVFLClassifier(n_nodes=16, features=[{"name": "x", "type": "number"}]).fit(np.zeros((4, 1)), y[:4])


def test_schema_infer_says_when_integer_classes_may_be_a_number(tmp_path, capsys):
    """A target of a dozen integers is taken as classes (the documented rule); the config says so beside them,
    with the ones in between never seen (a later label of one would be refused) and the way to a number."""
    rows = [f"{i % 7},{c}" for i, c in enumerate([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12] * 5)]
    data = tmp_path / "counts.csv"
    data.write_text("x,visits\n" + "\n".join(rows) + "\n")
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "visits"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("classes:"))
    assert line.endswith(
        "# the values of 'visits': integers 0..12 taken as 12 classes (1 in between never seen: such a label "
        "would be refused); `--task regression` predicts a number instead"
    )
    assert (
        cli.main(["schema", "infer", "--csv", str(data), "--target", "visits", "--task", "regression"]) == 0
    )
    assert "n_outputs: 1  # regression: 'visits' is a number" in capsys.readouterr().out


def test_check_reads_a_csv_by_the_config_s_label_field(tmp_path, capsys):
    """`check -c CONFIG --csv FILE`: named-field events name their label field, so --target is not needed."""
    data = orders_csv(tmp_path / "orders.csv", n=50)
    config = tmp_path / "orders.yaml"
    assert cli.main(["schema", "infer", "--csv", str(data), "--target", "is_fraud", "-o", str(config)]) == 0
    args = ["check", "-c", str(config), "--csv", str(data), "--bootstrap", "127.0.0.1:1", "--timeout", "0.2"]
    cli.main(args)  # the cluster is not there: its lines fail, the file's is checked
    assert "ok    csv: " in capsys.readouterr().out
