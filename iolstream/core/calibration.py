"""Calibrated class probabilities from the ensemble's outputs, learned online (docs/design.md §12).

The layers learn one-hot targets by ridge regression, so the mean of their outputs s̄ (b, m) estimates each
class's probability on a linear scale: near [0, 1], never summing to a distribution, and over- or
under-confident by a margin that depends on the stream. The map to probabilities is one member of a small
family, chosen online by the log loss it would have had on every labelled row:

    p = softmax(T · g_κ(c)),   c = (1/L) Σ_l clip(s_l, FLOOR, 1),   g_κ(c) = (c^κ − 1)/κ,  g_0(c) = log c

c, the mean of the layers' clipped outputs (``ensemble_scores``), is the ensemble's score: a layer whose output
overshoots (a small λ early in a stream: far above 1, far below 0) moves it by at most 1/L, as the layers' softmax
bounds each layer's vote, where the plain mean s̄ follows the outlier. The class emitted is the highest c (ties to
the higher s̄): the map keeps the order of the classes, so it is the most probable class.

κ ∈ KAPPAS bends the scale (κ = 1: linear in the score, a temperature on s̄; κ = 0: the log of the clipped score,
whose T = 1 is the clipped normalised mean); T ∈ TEMPERATURES sharpens or softens. Every (κ, T) of the grid keeps
one sum, Σ wᵢ · (−log p(yᵢ)) over the labelled rows at their weights; the pair with the lowest sum plus PRIOR,
(log T)² nats, is in force (before any label: κ = 0, T = 1). The prior keeps the first few dozen rows from
putting an extreme T in force (on the streams of docs/benchmarks.md, "Calibration", it lowered the log loss on
every multi-class set by 0.02–0.05) and is soon outweighed. The sums are the calibration's whole state: they add across the members of a
group and decay with forgetting exactly as c does (``LearnerState.calibration``), so every member that holds the
same sums maps scores to the same probabilities. For m = 2, p₁ = sigmoid(T · (g_κ(c₁) − g_κ(c₀))): the order of the
rows by p₁ is their order by that margin, whatever (κ, T) is in force.

Arrays in, arrays out, no I/O; the sums' kernel is ``activation_kernels.calibration_losses`` (its twin: the NumPy log loss of
every map, tests/core/test_probabilities.py).

    >>> import numpy as np
    >>> sums = np.zeros(GRID_SIZE)
    >>> s = np.array([[0.9, 0.1], [0.2, 0.8]])
    >>> probabilities(s, sums).round(3)            # no label yet: the clipped normalised mean
    array([[0.9, 0.1],
           [0.2, 0.8]])
    >>> for _ in range(20):                         # rows it is right about: it grows confident
    ...     sums += grid_losses(s, np.array([0, 1]))
    >>> bool(probabilities(s, sums)[0, 0] > 0.99)
    True
"""

from __future__ import annotations

import numpy as np

from iolstream.core import activation_kernels

KAPPAS = (0.0, 0.5, 1.0)
TEMPERATURES = tuple(float(t) for t in np.geomspace(0.25, 64.0, 17))  # steps of √2, 1.0 among them (the 5th)
GRID_SIZE = len(KAPPAS) * len(TEMPERATURES)  # κ major, T minor
PRIOR = np.tile(np.log(TEMPERATURES) ** 2, len(KAPPAS))  # nats added to each grid point's sum when choosing
_KAPPAS, _TEMPERATURES = np.asarray(KAPPAS), np.asarray(TEMPERATURES)
# the sums' kernel squares exp(T·d) to get exp(2T·d): every temperature is twice the one two steps before
assert np.allclose(_TEMPERATURES[2:], 2.0 * _TEMPERATURES[:-2], rtol=1e-12)
FLOOR = 0.005  # the smallest score a class keeps (the issue's clipped mean, and g_0's lower end)
START = (0.0, 1.0)  # (κ, T) before any label: the clipped normalised mean
PROBABILITY_FLOOR = 1e-15  # a log loss never takes the log of a smaller probability (scikit-learn's eps)
_CAP = -float(np.log(PROBABILITY_FLOOR))


def ensemble_scores(layer_outputs: np.ndarray) -> np.ndarray:
    """c (b, m): the mean over the layers of their outputs (L, b, m), each clipped to [FLOOR, 1] first."""
    outputs = np.ascontiguousarray(layer_outputs, dtype=np.float64)
    out = np.empty(outputs.shape[1:])
    activation_kernels.clipped_mean(outputs, FLOOR, out)  # np.clip(outputs, FLOOR, 1).mean(axis=0), one pass
    return out


def decision(layer_outputs: np.ndarray, scores: np.ndarray | None = None) -> np.ndarray:
    """The class index (b,) of the highest ensemble score c (``ensemble_scores``; given as ``scores`` if already
    computed), ties (every layer clipped alike) to the highest mean output s̄: a class of the highest probability."""
    outputs = np.ascontiguousarray(layer_outputs, dtype=np.float64)
    c = ensemble_scores(outputs) if scores is None else np.ascontiguousarray(scores, dtype=np.float64)
    out = np.empty(outputs.shape[1], dtype=np.int64)
    activation_kernels.top_class(outputs, c, out)  # the tied classes' mean output decides, in one pass
    return out


def _transformed(mean_scores: np.ndarray, kappas=KAPPAS) -> np.ndarray:
    """(len(kappas), b, m): g_κ(clip(c)) for every κ of ``kappas`` (default: KAPPAS)."""
    c = np.clip(np.asarray(mean_scores, dtype=np.float64), FLOOR, 1.0)
    return np.stack([np.log(c) if kappa == 0.0 else (c**kappa - 1.0) / kappa for kappa in kappas])


def choice(sums: np.ndarray) -> int:
    """The grid index in force for these sums (GRID_SIZE,): the lowest sum + PRIOR, the first of equals (START
    before any label: the prior is 0 there, > 0 elsewhere, and κ = 0 comes first)."""
    return int(np.argmin(np.asarray(sums) + PRIOR))


def setting(index: int) -> tuple[float, float]:
    """(κ, T) of a grid index."""
    return KAPPAS[index // len(TEMPERATURES)], TEMPERATURES[index % len(TEMPERATURES)]


def probabilities(mean_scores: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Class probabilities (b, m) of the ensemble's scores c (b, m), by the grid point the sums choose."""
    kappa, temperature = setting(choice(sums))
    z = temperature * _transformed(mean_scores, (kappa,))[0]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def grid_losses(mean_scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(GRID_SIZE,) Σᵢ wᵢ · (−log pᵢ(yᵢ)) of every grid point over b labelled rows: c (b, m), labels (b,) class
    indices, weights (b,) (default 1). What the calibration's sums add for these rows."""
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    b = len(labels)
    weights = np.ones(b) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    out = np.zeros(GRID_SIZE)
    if b:
        scores = np.ascontiguousarray(mean_scores, dtype=np.float64)
        activation_kernels.calibration_losses(
            scores, labels, weights, _KAPPAS, _TEMPERATURES, FLOOR, _CAP, out
        )
    return out


def describe(sums: np.ndarray) -> dict:
    """The map in force, for status and reports: {"kappa", "temperature"}."""
    kappa, temperature = setting(choice(sums))
    return {"kappa": kappa, "temperature": round(temperature, 4)}
