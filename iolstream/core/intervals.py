"""Regression intervals from the recent residuals (docs/design.md §12).

Each labelled row's residual |y − ŷ| (ŷ the ensemble the model emitted for it, both in the layers' scaled target
units) adds its weight to one bin of a fixed grid, per output: EDGES are 0 and then geometric, 8 bins per doubling
from 1e-3 to 1e3 of the target's deviation (the last bin open above). The counts are the interval's whole state: a
sum like c, so a group adds them and a snapshot saves them, and they decay with the rows seen, 2^(−age/h), so they
weigh the recent residuals (``half_life``). The interval of a prediction is ŷ ± r_q, r_q the coverage-quantile of
the counted residuals (interpolated geometrically within its bin: at most 9 % wide):

    y_lo, y_hi = ŷ − r_q, ŷ + r_q,   Σ_{r < r_q} w = q · Σ w

Arrays in, arrays out, no I/O.

    >>> import numpy as np
    >>> counts = np.zeros((1, N_BINS))
    >>> record(counts, np.random.default_rng(0).normal(0.0, 1.0, (10_000, 1)), np.ones(10_000))
    >>> round(float(half_width(counts, 0.9)[0]), 2)       # |N(0, 1)|'s 90 % quantile: 1.645
    1.64
"""

from __future__ import annotations

import numpy as np

EDGES = np.concatenate([[0.0], 1e-3 * 2.0 ** (np.arange(161) / 8.0)])  # lower edges; 1e-3 .. 1.05e3
N_BINS = len(EDGES)  # bin i holds [EDGES[i], EDGES[i + 1]); the last is open above
HALF_LIFE = 2048.0  # rows seen: the residuals' half-life unless the model forgets at a fixed rate


def record(counts: np.ndarray, residuals: np.ndarray, weights: np.ndarray) -> None:
    """Add rows' residuals (b, m) at their weights (b,) into ``counts`` (m, N_BINS), in place."""
    magnitude = np.abs(np.asarray(residuals, dtype=np.float64))
    bins = np.searchsorted(EDGES, magnitude, side="right") - 1  # (b, m), every |r| ≥ 0 = EDGES[0]
    for j in range(counts.shape[0]):
        counts[j] += np.bincount(bins[:, j], weights=weights, minlength=N_BINS)


def half_width(counts: np.ndarray, coverage: float) -> np.ndarray:
    """(m,) r_q per output: the ``coverage`` quantile of the counted residual magnitudes; NaN with no count."""
    out = np.full(counts.shape[0], np.nan)
    for j, row in enumerate(counts):
        total = row.sum()
        if total <= 0.0:
            continue
        target = coverage * total
        cumulative = np.cumsum(row)
        i = min(int(np.searchsorted(cumulative, target, side="left")), N_BINS - 1)
        below = cumulative[i - 1] if i else 0.0
        share = (target - below) / row[i] if row[i] > 0 else 1.0
        if i == 0:
            out[j] = share * EDGES[1]
        elif i == N_BINS - 1:
            out[j] = EDGES[-1]  # beyond the grid: its lower edge (1e3 deviations, never reached in practice)
        else:
            out[j] = EDGES[i] * (EDGES[i + 1] / EDGES[i]) ** share
    return out
