"""Regression intervals from the recent residuals (core.intervals, docs/design.md §12): the quantile of the counts,
the coverage on real regression streams, and the counts' state (snapshot, group, decay)."""

from __future__ import annotations

import numpy as np
import pytest

from iolstream.core import contribution, intervals
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.state_io import model_from_arrays, model_to_arrays
from iolstream.tools import builtin_datasets
from iolstream.tools.tabular import load_tabular, table_dataset

SEED = 31


def test_the_half_width_is_the_quantile_of_the_counted_residuals_within_a_bin():
    rng = np.random.default_rng(SEED)
    residuals = rng.standard_t(3, (5000, 2)) * np.array([0.1, 7.0])  # heavy tails, two scales
    weights = rng.uniform(0.5, 2.0, 5000)
    counts = np.zeros((2, intervals.N_BINS))
    intervals.record(counts, residuals, weights)
    np.testing.assert_allclose(counts.sum(axis=1), weights.sum(), rtol=1e-12)
    for coverage in (0.5, 0.8, 0.9, 0.95):
        got = intervals.half_width(counts, coverage)
        for j in range(2):
            magnitude = np.abs(residuals[:, j])
            order = np.argsort(magnitude)
            share = np.cumsum(weights[order]) / weights.sum()
            want = magnitude[order][np.searchsorted(share, coverage)]
            assert abs(got[j] / want - 1) < 0.09, f"seed={SEED} coverage={coverage} output {j}"
    assert np.isnan(intervals.half_width(np.zeros((1, intervals.N_BINS)), 0.9)).all()  # no residual yet


def _stream(model, x, y, b=100):
    """Prequential, labels one batch late: the share of rows inside their interval once it exists, and the
    intervals' mean width."""
    inside, width, previous = [], [], None
    for start in range(0, len(x), b):
        if previous is not None:
            p, lo, hi = previous
            model.learn(
                p.features_t, y[lo:hi].reshape(hi - lo, -1), predicted=p.predicted, observed_at=p.clock
            )
        pred = model.observe(x[start : start + b])
        y_lo, y_hi = pred.interval
        truth = y[start : start + b].reshape(len(y_lo), -1)
        known = np.isfinite(y_lo).all(axis=1)
        inside.append(((truth >= y_lo) & (truth <= y_hi)).all(axis=1)[known])
        width.append((y_hi - y_lo)[known])
        previous = (pred, start, start + b)
    inside = np.concatenate(inside)
    return float(inside.mean()), float(np.concatenate(width).mean()), len(inside)


def _near(got: float, asked: float, n: int) -> bool:
    """Within 3 binomial deviations of the coverage asked over n rows, and 0.02 (the model improves as it goes,
    so the residuals behind an interval are a little larger than the next rows')."""
    return abs(got - asked) <= 3 * np.sqrt(asked * (1 - asked) / n) + 0.02


@pytest.mark.parametrize("name", ["diabetes", "friedman", "loans"])
def test_the_interval_covers_what_it_says_on_real_regression_streams(name):
    """90 % and 50 % intervals hold about that share of the rows they are given for (``_near``), the 50 % ones
    narrower."""
    if name == "loans":
        ts = load_tabular(name, seed=SEED, rows=2000)
        ds = table_dataset(ts)
        x, y, features = ds.X, np.asarray(ds.y, dtype=np.float64), ds.schema.fields
        config = ModelConfig(features=features, n_nodes=128, seed=SEED, interval=0.9, mode="forward")
    else:
        ds = builtin_datasets.load(name, seed=SEED, rows=2000)
        x, y = ds.X, np.asarray(ds.y, dtype=np.float64)
        config = ModelConfig(n_inputs=x.shape[1], n_nodes=128, seed=SEED, interval=0.9, mode="forward")
    order = np.random.default_rng(SEED).permutation(len(x))
    model = EdRVFL(config)
    model.scaler.partial_fit(x[order][: config.warmup_rows])
    model.scaler.freeze()
    coverage, width, n = _stream(model, x[order], y[order])
    assert _near(coverage, 0.9, n), f"{name}: coverage {coverage:.3f} of {n} rows (seed={SEED})"
    narrower = EdRVFL(ModelConfig(**{**config.to_dict(), "interval": 0.5, "features": config.features}))
    narrower.scaler.partial_fit(x[order][: config.warmup_rows])
    narrower.scaler.freeze()
    half, half_width, n = _stream(narrower, x[order], y[order])
    assert _near(half, 0.5, n) and half_width < width, (
        f"{name}: 50 % coverage {half:.3f} of {n} (seed={SEED})"
    )


def _regression(**kwargs) -> EdRVFL:
    base = dict(n_inputs=3, n_nodes=16, n_layers=2, scaler="none", seed=SEED, interval=0.8, warmup_rows=32)
    return EdRVFL(ModelConfig(**{**base, **kwargs}))


def _rows(seed, n=300):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    return x, np.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.2 * rng.standard_normal(n)


def test_the_counts_are_restored_exactly_and_decay_with_the_rows_seen():
    x, y = _rows(SEED + 1)
    model = _regression()
    prev = None
    for start in range(0, 300, 30):
        if prev is not None:
            model.learn(prev[0].features_t, y[prev[1] : prev[1] + 30], predicted=prev[0].predicted)
        prev = (model.observe(x[start : start + 30]), start)
    assert model.residual_counts.sum() > 0
    restored = model_from_arrays(*model_to_arrays(model))
    np.testing.assert_array_equal(restored.residual_counts, model.residual_counts)
    assert restored.residual_clock == model.residual_clock
    np.testing.assert_array_equal(
        model.predict_batch(x[:20]).interval, restored.predict_batch(x[:20]).interval
    )
    before = model.current_residual_counts().copy()
    model.observe(x[:64])  # 64 more rows seen: every count halves per residual_half_life rows
    np.testing.assert_allclose(
        model.current_residual_counts(), before * 2 ** (-64 / model.residual_half_life), rtol=1e-12
    )
    assert _regression(forgetting=256.0).residual_half_life == 256.0


def test_the_counts_add_across_a_group_and_age_on_its_clock():
    x, y = _rows(SEED + 2)
    a = _regression()
    a.learn_rows(x[:100], y[:100])
    p = a.observe(x[100:150])
    a.learn(p.features_t, y[100:150], predicted=p.predicted, observed_at=p.clock)
    sums = contribution.sums(a)
    assert "res.counts" in contribution.layout(a)
    b = _regression()
    contribution.advance(b, contribution.clock(a))
    contribution.add(b, sums)
    np.testing.assert_array_equal(b.current_residual_counts(), a.current_residual_counts())
    aged = contribution.decayed(a, sums, a.residual_half_life)
    np.testing.assert_allclose(aged["res.counts"], sums["res.counts"] / 2, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(interval=1.0), "model.interval"),
        (dict(interval=0.0), "model.interval"),
        (dict(interval=True), "model.interval"),
        (dict(interval=0.9, classes=(0, 1)), "model.interval"),
    ],
)
def test_a_bad_interval_is_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(n_inputs=3, **kwargs)
