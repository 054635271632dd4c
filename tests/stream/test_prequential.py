"""The prequential metrics (stream.prequential) against scikit-learn's, overall and over the window, and their
state in a snapshot."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from iolstream.stream.prequential import PrequentialMetric, binned_auc, roc_auc

SEED = 31


def _rows(seed: int, n: int, m: int):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, m, n)
    logits = rng.normal(size=(n, m)) + 1.5 * np.eye(m)[labels]
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return labels, proba.argmax(axis=1), proba


@pytest.mark.parametrize("m", [2, 4])
def test_metrics_equal_scikit_learn_overall_and_over_the_window(m):
    labels, predicted, proba = _rows(SEED + m, 3000, m)
    metric = PrequentialMetric("classification", window=700, m=m)
    for start in range(0, 3000, 256):  # batches of any size, the window cut mid-batch
        sl = slice(start, start + 256)
        metric.update_classes(labels[sl], predicted[sl], proba[sl])
    for values, rows in ((metric.values(), slice(None)), (metric.values(sliding=True), slice(-700, None))):
        y, p, q = labels[rows], predicted[rows], proba[rows]
        assert values["accuracy"] == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
        assert values["log_loss"] == pytest.approx(skm.log_loss(y, q, labels=range(m)), rel=1e-9)
        brier = skm.brier_score_loss(y, q[:, 1]) if m == 2 else ((q - np.eye(m)[y]) ** 2).sum(axis=1).mean()
        assert values["brier"] == pytest.approx(brier, rel=1e-9)
        assert values["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, p), rel=1e-12)
        np.testing.assert_allclose(values["recall"], skm.recall_score(y, p, average=None), rtol=1e-12)
        np.testing.assert_allclose(values["precision"], skm.precision_score(y, p, average=None), rtol=1e-12)
        if m == 2:
            exact = skm.roc_auc_score(y, q[:, 1])
            tolerance = 1e-12 if rows != slice(None) else 2e-3  # overall: from 1,000 bins (module docstring)
            assert values["roc_auc"] == pytest.approx(exact, abs=tolerance), f"seed={SEED + m}"
        else:
            assert np.isnan(values["roc_auc"])


def test_auc_counts_ties_half_and_needs_both_classes():
    assert roc_auc(np.array([0.3, 0.3, 0.3]), np.array([True, False, False])) == 0.5
    assert np.isnan(roc_auc(np.array([0.1, 0.9]), np.array([True, True])))
    assert binned_auc(np.array([0.0, 2.0]), np.array([2.0, 0.0])) == 1.0


def test_regression_rmse_and_mae():
    rng = np.random.default_rng(SEED)
    values, targets = rng.normal(size=(500, 2)), rng.normal(size=(500, 2))
    metric = PrequentialMetric("regression", window=100, m=2)
    metric.update_values(values, targets)
    assert metric.values()["rmse"] == pytest.approx(np.sqrt(((values - targets) ** 2).mean()), rel=1e-12)
    assert metric.values()["mae"] == pytest.approx(np.abs(values - targets).mean(), rel=1e-12)
    assert metric.values(sliding=True)["mae"] == pytest.approx(
        np.abs(values - targets)[-100:].mean(), rel=1e-12
    )


def test_state_round_trip_and_an_old_state_keeps_its_accuracy():
    labels, predicted, proba = _rows(SEED, 900, 2)
    metric = PrequentialMetric("classification", window=300, m=2)
    metric.update_classes(labels, predicted, proba)
    manifest, arrays = metric.to_state()
    again = PrequentialMetric("classification", window=300, m=2)
    again.load_state(manifest, arrays)
    assert again.values(sliding=True) == metric.values(sliding=True)
    assert again.values() == metric.values()
    old = PrequentialMetric("classification", window=300, m=2)
    old.load_state({"n": 10, "total": 7.0}, {})  # a snapshot from before these metrics
    assert old.value == 0.7 and np.isnan(old.values()["log_loss"]) and len(old.ring) == 0
    # an older `iolstream seed`'s emptied metric of a three-class model: two classes
    empty = PrequentialMetric("classification", window=300, m=2).to_state()
    three = PrequentialMetric("classification", window=300, m=3)
    three.load_state(*empty)
    assert three.confusion.shape == (3, 3) and three.n == 0
    with pytest.raises(ValueError, match="cannot reshape"):  # rows were scored: a shape that is not ours
        three.load_state(*metric.to_state())


def test_the_window_is_read_at_one_moment_while_the_loop_adds_rows():
    """A status or /metrics scrape reads the window on another thread while the loop adds rows: every array it
    gets has the same length, and they are copies (rows added afterwards do not change them)."""
    import threading

    metric = PrequentialMetric("classification", window=64, m=3)
    rng = np.random.default_rng(0)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            labels = rng.integers(0, 3, 7)
            metric.update_classes(labels, labels, np.full((7, 3), 1 / 3))

    adder = threading.Thread(target=loop)
    adder.start()
    try:
        for _ in range(2000):
            out = metric.values(sliding=True)  # raised on arrays of two lengths before
            assert 0.0 <= out["accuracy"] <= 1.0 or np.isnan(out["accuracy"])
    finally:
        stop.set()
        adder.join()
    metric.update_classes(np.full(70, 2), np.full(70, 2), None)  # the window full, whatever the loop added
    labels, predicted = metric.ring.rows("label", "predicted")
    assert len(labels) == len(predicted) == 64
    metric.update_classes(np.zeros(64, dtype=np.int64), np.ones(64, dtype=np.int64), None)
    assert (labels == predicted).all()  # a copy of that moment
