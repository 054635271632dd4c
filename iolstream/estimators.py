"""scikit-learn-style estimators over the online learner (no Kafka).

``fit`` streams the training set through the IOL process in batches of
``batch_size`` (every label in, so -F and -R end on the same sums); ``partial_fit``
continues it; ``predict``/``predict_proba`` are pure. The z-score scaler is fixed
from the first data the estimator sees (all of X in ``fit``, the first batch in
``partial_fit``), because the Gram is only meaningful under one scaling.

X is an array of numbers, or named fields: a pandas DataFrame or a list of dicts (events as a topic
carries them), encoded by the feature schema ``features`` (a list of fields as in ``model.features``), or
by one inferred from the data the first fit sees (``schema_``), the worker's own encoding. A DataFrame is
read as ``evaluate --csv`` reads a table (texts stripped, NA texts and NaN missing, numbers written as text
read as numbers, dates as their ISO text; a column not taken as an input, such as an identifier, is named in
a warning); a list of dicts as the worker reads its events. y is checked beside them as beside an array, and
a call refused for its data learns nothing of it:

    >>> rows = [{"amount": a, "country": c} for a, c in zip(range(40), ["FR", "DE", None, "US"] * 10)]
    >>> clf = EdRVFLClassifier(n_nodes=16, random_state=0).fit(rows, [a % 2 == 0 for a in range(40)])
    >>> [f.name for f in clf.schema_.fields], clf.predict([{"amount": 3, "country": "IT"}]).shape
    (['amount', 'country'], (1,))

    >>> from sklearn.datasets import load_iris
    >>> from sklearn.model_selection import train_test_split
    >>> X, y = load_iris(return_X_y=True)
    >>> X_tr, X_te, y_tr, y_te = train_test_split(X, y, random_state=0, stratify=y)
    >>> clf = EdRVFLClassifier(n_nodes=64, n_layers=3, random_state=0).fit(X_tr, y_tr)
    >>> print(f"accuracy {clf.score(X_te, y_te):.2f}")
    accuracy 1.00
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    check_array,
    check_consistent_length,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from iolstream.core.encoder import RecordEncoder
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.schema import FeatureSchema
from iolstream.core.schema_infer import infer_schema, typed_records
from iolstream.core.snapshot_file import load_snapshot


class _EdRVFLBase(BaseEstimator):
    def __init__(
        self,
        n_nodes=512,
        n_layers=2,
        lam=0.5,
        activation="relu",
        init="auto",
        mode="auto",
        ensemble=None,
        solver="auto",
        dtype="float64",
        batch_size=256,
        random_state=0,
        features=None,
    ):
        self.n_nodes = n_nodes
        self.n_layers = n_layers
        self.lam = lam
        self.activation = activation
        self.init = init
        self.mode = mode
        self.ensemble = ensemble
        self.solver = solver
        self.dtype = dtype
        self.batch_size = batch_size
        self.random_state = random_state
        self.features = features

    def _seed(self) -> int:
        rs = self.random_state
        if rs is None or isinstance(rs, np.random.RandomState):
            return int(np.random.default_rng().integers(2**31)) if rs is None else int(rs.randint(2**31))
        return int(rs)

    def _new_model(self, X, schema=None, **target) -> EdRVFL:
        lam = self.lam if np.isscalar(self.lam) else tuple(self.lam)
        if schema is not None:  # named fields: each number field's mean and deviation over its values present
            scaling = dict(features=_fixed_fields(schema, X))
        else:
            mean, std = X.mean(axis=0), X.std(axis=0)
            std = np.where(std > 1e-12, std, 1.0)
            scaling = dict(scaler_mean=tuple(mean), scaler_std=tuple(std))
        cfg = ModelConfig(
            n_inputs=X.shape[1],
            n_nodes=self.n_nodes,
            n_layers=self.n_layers,
            lam=lam,
            activation=self.activation,
            init=self.init,
            seed=self._seed(),
            mode=self.mode,
            ensemble=self.ensemble,
            solver=self.solver,
            dtype=self.dtype,
            scaler="fixed",
            track_regret=False,
            **scaling,
            **target,
        )
        return EdRVFL(cfg)

    def _rows(self, X, *, first: bool) -> np.ndarray | None:
        """Named fields encoded by the schema: the given ``features``, else (on the first fit) one inferred from X,
        kept in ``schema_``; None for numbers (an array, or a DataFrame of numbers without gaps), which go on
        as they are. Named fields are a list of dicts, or a DataFrame with a text, category or boolean column or
        a gap, or any DataFrame once ``features`` is given.

        A DataFrame is a table, read as ``evaluate --csv`` reads one (``schema_infer.typed_records``): texts
        stripped, NA texts missing, numbers written as text read as numbers, dates as ISO text, a dotted column
        name the nested field it names; every field of the schema must be a column. A list of dicts is events,
        encoded as the worker encodes them."""
        if first:
            if self.features is None and not _named(X):
                return None
            table, events = _table(X), _events(X)
            if table is None and events is None:
                raise ValueError(
                    "features: X must hold named fields (a pandas DataFrame or a list of dicts), got "
                    f"{type(X).__name__}"
                )
            if len(X) == 0:
                raise ValueError("Found X with 0 rows while a minimum of 1 is required.")
            if self.features is not None:
                self.schema_ = FeatureSchema.parse(self.features)
            else:
                columns = table if table is not None else _columns(events)
                self.schema_, notes = infer_schema(columns, counters=False)
                inputs = {f.name for f in self.schema_.fields}
                for name, note in notes.items():
                    if name not in inputs:
                        warnings.warn(
                            f"X column {name!r} is not an input: {note.removeprefix('left out: ')}",
                            UserWarning,
                            stacklevel=4,
                        )
            self.feature_names_in_ = np.asarray([f.name for f in self.schema_.fields], dtype=object)
            self.n_features_in_ = len(self.schema_.fields)
        elif getattr(self, "schema_", None) is None:
            return None
        else:
            table = _table(X)
        records = _named_records(X, table, self.schema_)
        out = RecordEncoder(self.schema_).encode(records)
        if out.refused:
            i, reason, detail = out.refused[0]
            raise ValueError(f"X row {i}: {reason}: {detail}")
        return out.X

    def _stream(self, X, y) -> None:
        """Batch by batch, as a stream: each batch predicted (``observe``; -F puts its Gram in), then its labels
        learned (``learn``; every candidate of ``mode: auto`` judged on what it predicted)."""
        b = int(self.batch_size)
        if b < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {self.batch_size}")
        model = self.model_
        for start in range(0, len(X), b):
            model.learn(model.observe(X[start : start + b]), y[start : start + b])

    def _features_ok(self, X):
        rows = self._rows(X, first=False)
        return rows if rows is not None else validate_data(self, X, reset=False, dtype=np.float64)

    @classmethod
    def _from_model(cls, model: EdRVFL, task: str, path):
        """A fitted estimator around a worker's model: the hyperparameters as its config has them."""
        c = model.config
        if c.task != task:
            other = "EdRVFLRegressor" if task == "classification" else "EdRVFLClassifier"
            raise ValueError(f"{path}: the snapshot holds a {c.task} model; use {other}.from_snapshot")
        if not model.ready:
            raise ValueError(
                f"{path}: the model has not finished its warm-up (model.warmup_rows {c.warmup_rows} rows): "
                "it predicts nothing yet"
            )
        est = cls(
            n_nodes=c.n_nodes,
            n_layers=c.n_layers,
            lam=c.lam,
            activation=c.activation,
            init=c.init,
            mode=c.mode,
            ensemble=c.ensemble,
            solver=c.solver,
            dtype=c.dtype,
            random_state=c.seed,
        )
        est.model_ = model
        est.n_features_in_ = c.n_inputs
        if c.schema is not None:  # the worker's named fields: predict takes them as a DataFrame or dicts
            est.schema_ = c.schema
            est.features = c.schema.to_config()
            est.n_features_in_ = len(c.schema.fields)
        return est


class EdRVFLClassifier(ClassifierMixin, _EdRVFLBase):
    """edRVFL classifier learning online by -F, -R or both (``mode="auto"``); calibrated probabilities.

    Parameters
    ----------
    n_nodes : int, default=512
        Hidden units per layer (N).
    n_layers : int, default=2
        Hidden layers (L); each layer's output layer is one member of the ensemble.
    lam : float, list of float or "auto", default=0.5
        The ridge penalty λ: one for every layer, one per layer, or "auto" (chosen online among
        ``LAM_CANDIDATES``).
    activation : {"relu", "sigmoid", "tanh", "selu", "swish", "leaky_relu"}, default="relu"
        The hidden units' activation.
    init : {"auto", "normal", "xavier", "kaiming", "uniform", "spread"}, default="auto"
        How the random weights are drawn; "auto" picks the activation's own (Xavier for relu).
    mode : {"auto", "forward", "ridge"}, default="auto"
        How the output layers learn: -F ("forward": a batch's Gram enters before it is predicted), -R
        ("ridge": rows enter with their labels), or "auto", the worker's default: both on the same sums and
        the better of the two, judged online, in force. Once every label is in, all three hold the same sums.
    ensemble : "softmax", "vote", default=None
        How the layers' outputs are combined; None: "softmax".
    solver : {"auto", "cholesky", "woodbury"}, default="auto"
        How each batch updates the output layers: Gram + Cholesky, a Woodbury rank-b update, or by the batch's
        size ("auto").
    dtype : {"float64", "float32"}, default="float64"
        The precision of the features and sums.
    batch_size : int, default=256
        Rows per batch as ``fit`` and ``partial_fit`` stream X through the model.
    random_state : int, RandomState instance or None, default=0
        The seed of the random weights.
    features : list of dict, default=None
        The feature schema of named fields (as ``model.features`` in a worker config) for X given as a
        DataFrame or a list of dicts; None: inferred from the first data ``fit`` sees when X has named fields.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels, sorted.
    n_features_in_ : int
        Features (named fields, with a schema) seen by ``fit``.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        The named fields, when X has them.
    schema_ : FeatureSchema or None
        The feature schema X is encoded by (None: X is an array of numbers).
    model_ : EdRVFL
        The underlying online model.

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> clf = EdRVFLClassifier(n_nodes=64, random_state=0).fit(X[:400], y[:400])
    >>> print(f"accuracy {clf.score(X[400:], y[400:]):.2f}")
    accuracy 0.99
    """

    def fit(self, X, y):
        self.schema_ = None
        rows = self._rows(X, first=True)
        if rows is None:
            X, y = validate_data(self, X, y, dtype=np.float64)
        else:
            X, y = rows, _named_y(rows, y, regression=False)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        classes = tuple(c.item() if hasattr(c, "item") else c for c in self.classes_)
        if len(classes) < 2:
            raise ValueError(f"need at least 2 classes to fit, got {len(classes)} class")
        self.model_ = self._new_model(X, self.schema_, classes=classes)
        self._stream(X, y)
        return self

    def partial_fit(self, X, y, classes=None):
        first = not hasattr(self, "model_")
        if first:
            self.schema_ = None
        rows = self._rows(X, first=first)
        if rows is None:
            X, y = validate_data(self, X, y, dtype=np.float64, reset=first)
        else:
            X, y = rows, _named_y(rows, y, regression=False)
        check_classification_targets(y)
        if first:
            if classes is None:
                raise ValueError("classes must be given on the first call to partial_fit")
            self.classes_ = np.unique(np.asarray(classes))
            self.model_ = self._new_model(
                X, self.schema_, classes=tuple(c.item() if hasattr(c, "item") else c for c in self.classes_)
            )
        known = set(self.classes_.tolist())
        unknown = [c for c in dict.fromkeys(np.asarray(y).tolist()) if c not in known]
        if unknown:  # before any row enters: -F would have put the batch's Gram in already
            raise ValueError(
                f"y holds {unknown[0]!r}, not one of the classes {self.classes_.tolist()} "
                f"({len(unknown)} unknown); the model learned nothing of this call"
            )
        self._stream(X, y)
        return self

    @classmethod
    def from_snapshot(cls, path) -> EdRVFLClassifier:
        """The classifier of a worker's snapshot (a file, or a directory: its newest valid snapshot), fitted:
        ``predict`` and ``predict_proba`` score batches as the worker's model would; ``partial_fit`` learns on
        (with the worker's fixed scaling)."""
        est = cls._from_model(load_snapshot(path), "classification", path)
        est.classes_ = np.asarray(est.model_.config.classes)
        return est

    def predict_proba(self, X):
        check_is_fitted(self, "model_")
        X = self._features_ok(X)
        return self.model_.predict_batch(X).proba

    def predict(self, X):
        proba = self.predict_proba(X)
        return self.classes_[proba.argmax(axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = True
        return tags


class EdRVFLRegressor(RegressorMixin, _EdRVFLBase):
    """edRVFL regressor (one or several outputs) learning online by -F, -R or both (``mode="auto"``).

    Parameters
    ----------
    n_nodes : int, default=512
        Hidden units per layer (N).
    n_layers : int, default=2
        Hidden layers (L); each layer's output layer is one member of the ensemble.
    lam : float, list of float or "auto", default=0.5
        The ridge penalty λ: one for every layer, one per layer, or "auto" (chosen online among
        ``LAM_CANDIDATES``).
    activation : {"relu", "sigmoid", "tanh", "selu", "swish", "leaky_relu"}, default="relu"
        The hidden units' activation.
    init : {"auto", "normal", "xavier", "kaiming", "uniform", "spread"}, default="auto"
        How the random weights are drawn; "auto" picks the activation's own (Xavier for relu).
    mode : {"auto", "forward", "ridge"}, default="auto"
        How the output layers learn: -F ("forward": a batch's Gram enters before it is predicted), -R
        ("ridge": rows enter with their labels), or "auto", the worker's default: both on the same sums and
        the better of the two, judged online, in force. Once every label is in, all three hold the same sums.
    ensemble : "mean", "median", default=None
        How the layers' outputs are combined; None: "mean".
    solver : {"auto", "cholesky", "woodbury"}, default="auto"
        How each batch updates the output layers: Gram + Cholesky, a Woodbury rank-b update, or by the batch's
        size ("auto").
    dtype : {"float64", "float32"}, default="float64"
        The precision of the features and sums.
    batch_size : int, default=256
        Rows per batch as ``fit`` and ``partial_fit`` stream X through the model.
    random_state : int, RandomState instance or None, default=0
        The seed of the random weights.
    features : list of dict, default=None
        The feature schema of named fields (as ``model.features`` in a worker config) for X given as a
        DataFrame or a list of dicts; None: inferred from the first data ``fit`` sees when X has named fields.

    Attributes
    ----------
    n_features_in_ : int
        Features (named fields, with a schema) seen by ``fit``.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        The named fields, when X has them.
    schema_ : FeatureSchema or None
        The feature schema X is encoded by (None: X is an array of numbers).
    model_ : EdRVFL
        The underlying online model; targets are z-scored by the first fit's mean and deviation.

    Examples
    --------
    >>> from sklearn.datasets import make_friedman1
    >>> X, y = make_friedman1(n_samples=2000, noise=0.5, random_state=0)
    >>> reg = EdRVFLRegressor(n_nodes=128, n_layers=2, random_state=0).fit(X[:1500], y[:1500])
    >>> print(f"R2 {reg.score(X[1500:], y[1500:]):.2f}")
    R2 0.86
    """

    def fit(self, X, y):
        self.schema_ = None
        rows = self._rows(X, first=True)
        if rows is None:
            X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True, multi_output=True)
        else:
            X, y = rows, _named_y(rows, y, regression=True)
        self._single_output = y.ndim == 1
        y2 = y.reshape(len(y), -1)
        self.model_ = self._new_model(X, self.schema_, n_outputs=y2.shape[1], **_target_scaling(y2))
        self._stream(X, y2)
        return self

    def partial_fit(self, X, y):
        first = not hasattr(self, "model_")
        if first:
            self.schema_ = None
        rows = self._rows(X, first=first)
        if rows is None:
            X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True, multi_output=True, reset=first)
        else:
            X, y = rows, _named_y(rows, y, regression=True)
        y2 = y.reshape(len(y), -1)
        if first:
            self._single_output = y.ndim == 1
            self.model_ = self._new_model(X, self.schema_, n_outputs=y2.shape[1], **_target_scaling(y2))
        self._stream(X, y2)
        return self

    @classmethod
    def from_snapshot(cls, path) -> EdRVFLRegressor:
        """The regressor of a worker's snapshot (a file, or a directory: its newest valid snapshot), fitted."""
        est = cls._from_model(load_snapshot(path), "regression", path)
        est._single_output = est.model_.config.m == 1
        return est

    def predict(self, X):
        check_is_fitted(self, "model_")
        X = self._features_ok(X)
        value = self.model_.predict_batch(X).value
        return value[:, 0] if self._single_output else value

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


def _named_y(rows: np.ndarray, y, *, regression: bool) -> np.ndarray:
    """y beside rows of named fields, checked as ``validate_data`` checks it beside an array: one label per
    row; a classifier's a column (a (n, 1) one flattened with a warning), a regressor's finite numbers."""
    if regression:
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")
    else:
        y = column_or_1d(y, warn=True)
    check_consistent_length(rows, y)
    return y


def _table(X) -> dict[str, list] | None:
    """A DataFrame's columns (pandas is not a dependency): each name as text -> its cells, a date or time as its
    ISO text, a missing one (NaN, NaT, NA) None; None when X is not a DataFrame."""
    if not (hasattr(X, "columns") and hasattr(X, "to_dict")):
        return None

    def cell(v):
        if v is None or isinstance(v, str):
            return v
        try:
            if v != v:  # NaN and NaT compare unequal to themselves
                return None
        except TypeError:  # pd.NA: its truth is ambiguous, and it is missing
            return None
        return v.isoformat() if hasattr(v, "isoformat") else v

    return {str(name): [cell(v) for v in values] for name, values in X.to_dict(orient="list").items()}


def _events(X) -> list[dict] | None:
    """X as a list of events (dicts of named fields), or None."""
    if isinstance(X, (list, tuple)) and X and all(isinstance(r, dict) for r in X):
        return list(X)
    return None


def _named_records(X, table: dict | None, schema: FeatureSchema) -> list[dict]:
    """The records ``schema`` encodes: a DataFrame's rows (``table``, as ``_table`` read them) typed as a table's
    (every field of the schema must be a column), or the events of a list of dicts as they are."""
    if table is not None:
        missing = [f.name for f in schema.fields if f.name not in table]
        if missing:
            raise ValueError(
                f"X has no column {missing[0]!r} for a field of the schema this estimator learns by "
                f"({len(missing)} missing); columns: {', '.join(table)}"
            )
        return typed_records(table, schema)
    events = _events(X)
    if events is None:
        raise ValueError(
            "this estimator was fitted on named fields: pass a pandas DataFrame or a list of dicts"
        )
    return events


def _named(X) -> bool:
    """Whether X holds named fields to encode: a list of dicts, or a DataFrame with a column that is not numbers
    or with a gap (a DataFrame of numbers is an array, as scikit-learn takes it)."""
    if isinstance(X, (list, tuple)):
        return bool(X) and all(isinstance(r, dict) for r in X)
    if hasattr(X, "columns") and hasattr(X, "dtypes") and hasattr(X, "isna"):
        numeric = all(getattr(d, "kind", "O") in "iuf" for d in X.dtypes)
        return not numeric or bool(X.isna().to_numpy().any())
    return False


def _columns(records: list[dict]) -> dict[str, list]:
    """Each field's values (None where a record lacks it), fields in the order they first appear."""
    names = list(dict.fromkeys(k for r in records for k in r))
    return {name: [r.get(name) for r in records] for name in names}


def _fixed_fields(schema: FeatureSchema, X: np.ndarray) -> tuple:
    """The schema's fields, each number with the mean and deviation of its values present in X."""
    out = []
    for f, at in zip(schema.fields, schema.offsets()):
        if f.type == "number":
            present = X[:, at][~np.isnan(X[:, at])]
            mean = float(present.mean()) if len(present) else 0.0
            std = float(present.std()) if len(present) > 1 else 0.0
            f = dataclasses.replace(f, mean=mean, std=std if std > 1e-12 else 1.0)
        out.append(f)
    return tuple(out)


def _target_scaling(y2: np.ndarray) -> dict:
    """Targets z-scored by the first fit's mean and deviation, as the inputs are (ModelConfig target_scaler "fixed")."""
    std = y2.std(axis=0)
    return dict(
        target_scaler="fixed",
        target_mean=tuple(y2.mean(axis=0)),
        target_std=tuple(np.where(std > 1e-12, std, 1.0)),
    )
