"""Drifting streams, made locally by River's seeded generators, for ``evaluate --order stream``.

Each stream is a fixed recipe (generator, parameters, seed) and its drift points in rows, so that a
plot can mark them. 50,000 rows by default; rows in stream order (never shuffle them).

- hyperplane : rotating hyperplane, 10 features, 5 drifting (magnitude 0.001 per row), 5 % label noise
- sea        : SEA, concept 0 then concept 2, abrupt change at the middle row (over 143 rows of 50,000)
- agrawal    : Agrawal, function 0 then function 2, gradual change over 5,000 rows centred at the middle
- rbf-drift  : random RBF, 5 classes, 10 features, 50 centroids all moving (speed 0.001)
- friedman-drift : Friedman with global recurring abrupt drift (River's "gra") at 1/3 and 2/3 (regression)
"""

from __future__ import annotations

import numpy as np

N_ROWS = 50_000

STREAMS = {
    "hyperplane": "River Hyperplane, rotating: 10 features (5 drifting, 0.001/row), 5 % noise; 50,000 rows",
    "sea": "River SEA, concept 0 -> 2 abruptly at the middle; 50,000 rows, 3 features",
    "agrawal": "River Agrawal, function 0 -> 2 gradually over 5,000 rows at the middle; 50,000 rows, 9 features",
    "rbf-drift": "River RandomRBFDrift: 5 classes, 10 features, 50 moving centroids (speed 0.001); 50,000 rows",
    "friedman-drift": "River FriedmanDrift 'gra' (global recurring abrupt) at 1/3 and 2/3; 50,000 rows, 10 features, regression",
}


def drift_points(name: str, n_rows: int) -> list[int]:
    """Rows at which the concept changes (empty for a continuous drift)."""
    if name in ("sea", "agrawal"):
        return [n_rows // 2]
    if name == "friedman-drift":
        return [n_rows // 3, 2 * n_rows // 3]
    return []


def _generator(name: str, n_rows: int, seed: int):
    from river.datasets import synth

    if name == "hyperplane":
        return synth.Hyperplane(
            seed=seed, n_features=10, n_drift_features=5, mag_change=0.001, noise_percentage=0.05
        )
    if name == "sea":
        # River's sigmoid overflows math.exp for 4·position/width > 709: the narrowest change it can make
        width = max(1, -(-4 * (n_rows // 2) // 700))  # 143 rows of 50,000
        return synth.ConceptDriftStream(
            synth.SEA(variant=0, seed=seed),
            synth.SEA(variant=2, seed=seed + 1),
            position=n_rows // 2,
            width=width,
            seed=seed,
        )
    if name == "agrawal":
        return synth.ConceptDriftStream(
            synth.Agrawal(classification_function=0, seed=seed),
            synth.Agrawal(classification_function=2, seed=seed + 1),
            position=n_rows // 2,
            width=5000,
            seed=seed,
        )
    if name == "rbf-drift":
        return synth.RandomRBFDrift(
            seed_model=seed,
            seed_sample=seed + 1,
            n_classes=5,
            n_features=10,
            n_centroids=50,
            change_speed=0.001,
            n_drift_centroids=50,
        )
    return synth.FriedmanDrift(drift_type="gra", position=(n_rows // 3, 2 * n_rows // 3), seed=seed)


def make(name: str, n_rows: int = N_ROWS, seed: int = 0):
    """(X (n, k) float64, y (n,) ints or floats, feature names) of the stream ``name``, in stream order."""
    try:
        gen = _generator(name, n_rows, seed)
    except ImportError:
        raise ValueError(f"the drift stream {name!r} needs river: pip install 'iolstream[data]'") from None
    xs, ys = [], []
    for x, y in gen.take(n_rows):
        xs.append(list(x.values()))
        ys.append(y)
        names = tuple(str(k) for k in x)
    X = np.ascontiguousarray(np.asarray(xs, dtype=np.float64))
    y = np.asarray(ys, dtype=np.float64 if name == "friedman-drift" else np.int64)
    return X, y, names
