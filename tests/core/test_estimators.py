"""scikit-learn conventions for EdRVFLClassifier / EdRVFLRegressor."""

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_regression
from sklearn.utils.estimator_checks import parametrize_with_checks

from iolstream.estimators import EdRVFLClassifier, EdRVFLRegressor

SMALL = dict(n_nodes=16, n_layers=2, batch_size=32)


@parametrize_with_checks([EdRVFLClassifier(**SMALL), EdRVFLRegressor(**SMALL)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_partial_fit_chunking_does_not_matter():
    """Calls of partial_fit cut at batch boundaries give bitwise the β of one call over the same rows."""
    X, y = load_iris(return_X_y=True)
    order = np.random.default_rng(4).permutation(len(y))
    X, y = X[order], y[order]
    kw = dict(SMALL, batch_size=25)
    one = EdRVFLClassifier(**kw).partial_fit(X[:50], y[:50], classes=np.unique(y))
    one.partial_fit(X[50:], y[50:])
    many = EdRVFLClassifier(**kw).partial_fit(X[:50], y[:50], classes=np.unique(y))
    for start in range(50, len(X), 25):
        many.partial_fit(X[start : start + 25], y[start : start + 25])
    for a, b in zip(one.model_.learner.state.layers, many.model_.learner.state.layers):
        np.testing.assert_array_equal(a.beta, b.beta)


@pytest.mark.parametrize("mode", ["forward", "ridge"])
def test_modes_reach_the_same_fit(mode):
    """With every label in, -F and -R hold the same sums (docs/design.md §2), so the fitted models agree."""
    X, y = make_regression(n_samples=300, n_features=5, noise=0.1, random_state=1)
    ref = EdRVFLRegressor(mode="forward", **SMALL).fit(X, y)
    est = EdRVFLRegressor(mode=mode, **SMALL).fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-9, atol=1e-9)


def test_get_set_params_round_trip():
    est = EdRVFLClassifier(n_nodes=32, mode="ridge")
    assert est.get_params()["mode"] == "ridge"
    est.set_params(n_layers=3)
    assert est.n_layers == 3


def test_partial_fit_needs_classes_first():
    X, y = load_iris(return_X_y=True)
    with pytest.raises(ValueError, match="classes"):
        EdRVFLClassifier(**SMALL).partial_fit(X[:10], y[:10])
