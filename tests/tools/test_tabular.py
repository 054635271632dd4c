"""The real tables of tools/tabular.py: events as a team's topic carries them (named fields, gaps as None,
categories as strings), labels apart, the same order for the same seed."""

import math

import numpy as np
import pytest

from iolstream.tools.dataset import DataError
from iolstream.tools.tabular import TABULAR, load_tabular, table_dataset, table_schema


@pytest.mark.parametrize("name", sorted(TABULAR))
def test_every_table_loads_as_events_with_plain_json_values(name):
    ts = load_tabular(name)
    assert len(ts.events) == len(ts.labels) > 300
    assert ts.label_field not in ts.fields and "rownames" not in ts.fields
    for event in ts.events[:500]:
        assert tuple(event) == ts.fields
        for value in event.values():
            assert value is None or type(value) in (int, float, str, bool), (name, value)
            assert not (type(value) is float and not math.isfinite(value))
    if ts.task == "classification":
        assert set(ts.labels) == set(ts.classes)
        assert ts.positive is None or ts.positive in ts.classes
    else:
        assert all(math.isfinite(v) for v in ts.labels)


def test_the_tables_have_what_real_data_has_gaps_categories_and_a_rare_outcome():
    credit = load_tabular("credit")
    assert sum(e["Income"] is None for e in credit.events) == 381
    assert {e["Home"] for e in credit.events} >= {"rent", "owner", None}
    default = load_tabular("default")
    assert default.labels.count("Yes") / len(default.labels) == pytest.approx(0.0333)


def test_shuffled_once_by_the_seed_and_file_order_on_request():
    a, b = load_tabular("titanic", seed=3), load_tabular("titanic", seed=3)
    assert a.events == b.events and a.labels == b.labels
    assert load_tabular("titanic", seed=4).events != a.events
    in_file = load_tabular("titanic", shuffle=False)
    assert in_file.events[0]["passengerClass"] == "1st"  # the file is sorted by class


def test_each_table_is_encoded_by_the_schema_inferred_from_it():
    ts = load_tabular("titanic", rows=400)
    schema = table_schema(ts)
    kinds = {f.name: f.type for f in schema.fields}
    assert kinds == {"sex": "category", "age": "number", "passengerClass": "category"}
    assert schema.fields[1].indicator  # age has gaps: its missing-indicator column
    ds = table_dataset(ts)
    assert ds.schema == schema and ds.X.shape == (400, schema.width)
    age = schema.offsets()[1]
    gaps = [i for i, e in enumerate(ts.events) if e["age"] is None]
    assert gaps and np.isnan(ds.X[gaps, age]).all() and (ds.X[gaps, age + 1] == 1).all()
    sex = schema.offsets()[0]
    assert (ds.X[:, sex : sex + schema.fields[0].width].sum(axis=1) == 1).all()  # one slot each


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(DataError, match="valid names: credit, telco-churn"):
        load_tabular("adult")
