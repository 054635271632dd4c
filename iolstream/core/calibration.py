"""Calibrated class probabilities from the ensemble's outputs, learned online (docs/design.md §12).

The layers learn one-hot targets by ridge regression, so the mean of their outputs s̄ (b, m) estimates each
class's probability on a linear scale: near [0, 1], never summing to a distribution, and over- or
under-confident by a margin that depends on the stream. The probabilities come from a small family of maps,
weighed online by the likelihood each gave the labelled rows:

    p = Σ_g w_g · softmax(T_g · g_κg(c)),   c = (1/L) Σ_l clip(s_l, FLOOR, 1),
    g_κ(c) = (c^κ − 1)/κ,  g_0(c) = log c

c, the mean of the layers' clipped outputs (``ensemble_scores``), is the ensemble's score: a layer whose output
overshoots (a small λ early in a stream: far above 1, far below 0) moves it by at most 1/L, as the layers' softmax
bounds each layer's vote, where the plain mean s̄ follows the outlier. The class emitted is the highest c (ties to
the higher s̄): every map keeps the order of the classes, so their mixture does, and it is the most probable class.

κ ∈ KAPPAS bends the scale (κ = 1: linear in the score, a temperature on s̄; κ = 0: the log of the clipped score,
whose T = 1 is the clipped normalised mean); T ∈ TEMPERATURES sharpens or softens. Every map g = (κ, T) of the
grid keeps one sum, S_g = Σ wᵢ · (−log p_g(yᵢ)) over the labelled rows at their weights: its negative
log-likelihood. The probabilities are the posterior mean over the grid, each map at its posterior weight
w_g ∝ exp(−S_g) (``posterior_weights``; the grid's points equally likely before any label). Row by row, each label
learned before the next row, the mixture's cumulative log loss is −log of the maps' mean likelihood, at most the
best map's plus log GRID_SIZE nats (the Bayes mixture's bound). A mixture, not the
best map alone: choosing the lowest sum let the first few dozen rows put an extreme T in force, and the best map
changes as the model learns; the mixture is as confident as the evidence for each map. The sums are the
calibration's whole state: they add across the members of a group and decay with forgetting exactly as c does
(``LearnerState.calibration``), so every member that holds the same sums maps scores to the same probabilities.

Arrays in, arrays out, no I/O; the kernels are ``activation_kernels.clipped_mean`` (c), ``top_class`` (the class
emitted), ``calibration_losses`` (the sums) and
``calibration_mixture`` (the probabilities); their twins, the NumPy log loss and probabilities of every map, are in
tests/core/test_probabilities.py.

    >>> import numpy as np
    >>> sums = np.zeros(GRID_SIZE)
    >>> s = np.array([[0.9, 0.1], [0.2, 0.8]])
    >>> probabilities(s, sums).round(3)            # no label yet: every map alike
    array([[0.888, 0.112],
           [0.139, 0.861]])
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
_KAPPAS, _TEMPERATURES = np.asarray(KAPPAS), np.asarray(TEMPERATURES)
# the sums' kernel squares exp(T·d) to get exp(2T·d): every temperature is twice the one two steps before
assert np.allclose(_TEMPERATURES[2:], 2.0 * _TEMPERATURES[:-2], rtol=1e-12)
FLOOR = 0.005  # the smallest score a class keeps (the issue's clipped mean, and g_0's lower end)
WEIGHT_FLOOR = 1e-12  # maps of a smaller posterior weight than this × the heaviest's leave the mixture
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


def posterior_weights(sums: np.ndarray) -> np.ndarray:
    """(GRID_SIZE,) every map's posterior weight for these sums (GRID_SIZE,), the maps' negative log-likelihoods of
    the labelled rows: exp(−sum), normalised (equal before any label)."""
    a = -np.asarray(sums, dtype=np.float64)
    w = np.exp(a - a.max())
    return w / w.sum()


def choice(sums: np.ndarray) -> int:
    """The heaviest map for these sums (GRID_SIZE,): the lowest sum, the first of equals."""
    return int(np.argmin(np.asarray(sums)))


def setting(index: int) -> tuple[float, float]:
    """(κ, T) of a grid index."""
    return KAPPAS[index // len(TEMPERATURES)], TEMPERATURES[index % len(TEMPERATURES)]


def probabilities(mean_scores: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Class probabilities (b, m) of the ensemble's scores c (b, m): every map's probabilities at its posterior
    weight (``posterior_weights``), the maps lighter than WEIGHT_FLOOR × the heaviest left out."""
    w = posterior_weights(sums)
    w = np.where(w >= WEIGHT_FLOOR * w.max(), w, 0.0)
    scores = np.ascontiguousarray(mean_scores, dtype=np.float64)
    out = np.empty(scores.shape)
    activation_kernels.calibration_mixture(scores, w / w.sum(), _KAPPAS, _TEMPERATURES, FLOOR, out)
    return out


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
    """The heaviest map of the mixture, for status and reports: {"kappa", "temperature", "weight"} (its posterior
    weight: 1/GRID_SIZE before any label, near 1 once the rows single it out)."""
    index = choice(sums)
    kappa, temperature = setting(index)
    weight = float(posterior_weights(sums)[index])
    return {"kappa": kappa, "temperature": round(temperature, 4), "weight": round(weight, 4)}
