"""Rows taken back out of a model as if it had never seen them (docs/design.md §13): the model is sums over rows
(A = λI + Σ w·DᵀD, c = Σ w·DᵀY per layer and candidate), so a row's terms can be subtracted at the weight it has
now. ``EdRVFL.erase`` calls ``erase`` here; each learner's own part is ``OnlineLearner.erase`` (core.label_fold).
Arrays in, arrays out, no I/O.
"""

from __future__ import annotations

import numpy as np

from iolstream.core import calibration, gram_cholesky, step_kernels
from iolstream.core.shared_gram import SharedGramLearner


def erase(model, features_t, targets, labelled, observed_at=None, *, weights=None, scores=None) -> None:
    """Take rows out of the model as if it had never seen them (docs/design.md §13): out of every candidate's
    sums (``OnlineLearner.erase``: their Gram, and their label's terms where ``labelled``), each at the weight
    it has now. ``targets`` (b, m) as ``learn`` takes them (``encode_labels``: one-hot, or the values in their
    own units); ``observed_at``: the rows' ``Prediction.clock``; ``weights`` (b,): the class weight each
    labelled row entered with (``entered_weights``; None: 1); ``scores`` (K, b, m): each candidate's mean
    output for the row when its label came (``entered_scores``, NaN where it made none; None: the calibration
    keeps them). A labelled row leaves the class counts, and, given ``scores``, each candidate's calibration
    sums (its log loss at its weight now). A label still held for the target scaling leaves the hold
    (``TargetScaler.drop``). All or nothing: if round-off would leave a sum not positive definite, every
    candidate keeps its sums and ``gram_cholesky.NotPositiveDefinite`` is raised."""
    b = features_t.shape[2]
    targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, model.config.m)
    labelled = np.array(np.broadcast_to(np.asarray(labelled, dtype=bool), (b,)))
    stamps = None if observed_at is None else np.broadcast_to(np.asarray(observed_at), (b,))
    if weights is not None:
        weights = np.ascontiguousarray(np.broadcast_to(np.asarray(weights, dtype=np.float64), (b,)))
        if not (np.isfinite(weights).all() and (weights > 0).all()):
            raise ValueError("erase: weights: every row's weight must be finite and > 0")
        if (weights[labelled] == 1.0).all():
            weights = None
    keep = np.ones(b, dtype=bool)
    if not model.targets.frozen:  # labels still held for the target scaling: out of the hold
        for i in np.flatnonzero(labelled).tolist():
            in_a = model.targets.drop(features_t[:, :, i], targets[i], None if stamps is None else stamps[i])
            if in_a is None:
                raise ValueError(f"erase: row {i} is labelled, but its label is neither in the sums nor held")
            labelled[i] = False  # never in c
            keep[i] = in_a and model.learner.mode == "forward"  # its Gram: in A under -F
    if not keep.all():
        features_t, targets, labelled = features_t[:, :, keep], targets[keep], labelled[keep]
        stamps = None if stamps is None else stamps[keep]
        weights = None if weights is None else weights[keep]
        scores = None if scores is None else np.asarray(scores)[:, keep]
    scaled = model.targets.transform(targets) if model.targets.frozen else targets
    primaries = [ln for ln in model.learners if not isinstance(ln, SharedGramLearner)]
    undo: list = []  # a learner puts its own sums back if it fails; the ones before it, from these
    grams = None  # rows of a few stamps: their Gram by stamp, formed once for every half-life (each at its weight)
    if len(primaries) > 1 and weights is None and features_t.shape[2] and features_t.flags.c_contiguous:
        grams = _grams_by_stamp(primaries[0], features_t, stamps)
    try:
        for ln in primaries:
            ln.erase(features_t, scaled, labelled, stamps, grams=grams, undo=undo, sample_weight=weights)
    except gram_cholesky.NotPositiveDefinite:
        for put_back in undo:  # the ones already done put back too: all or nothing
            put_back()
        raise
    for ln in model.learners:
        if isinstance(ln, SharedGramLearner):
            ln.erase(features_t, scaled, labelled, stamps)
    model.batch_grams.clear()  # a kept batch Gram may hold these rows
    if model._class_index is not None and labelled.any():
        classes = targets[labelled].argmax(axis=1)
        model.class_counts -= np.bincount(classes, minlength=model.config.m)
        if scores is not None and model.calibrated:
            _erase_calibration(model, np.asarray(scores)[:, labelled], classes, stamps, weights, labelled)


def _erase_calibration(model, scores, classes, stamps, weights, labelled) -> None:
    """Labelled rows out of each candidate's calibration sums: the log loss they added (``grid_losses`` of the
    scores it had for them), at the weight they have now there (decay times class weight)."""
    stamps = None if stamps is None else stamps[labelled]
    weights = None if weights is None else weights[labelled]
    for j, ln in enumerate(model.learners):
        own = np.flatnonzero(~np.isnan(scores[j, :, 0]))
        if not own.size:
            continue
        row_weights = ln.row_weights(None if stamps is None else stamps[own], own.size)
        if weights is not None:
            row_weights = row_weights * weights[own]
        sums = ln.calibration_sums
        sums -= calibration.grid_losses(scores[j, own], classes[own], row_weights)
        np.maximum(sums, 0.0, out=sums)  # round-off: a sum of losses is never below 0


SHARED_GRAM_STAMPS = 4  # up to this many stamps, erase forms one Gram per stamp for every half-life


def _grams_by_stamp(first, features_t, stamps) -> tuple | None:
    """(G (K, L, n, n), stamps (K,)): Σ DᵀD of the rows of each stamp, when the rows have at most SHARED_GRAM_STAMPS
    stamps (each half-life then takes Σ w·G out instead of forming its own weighted Gram), else None."""
    if stamps is None:
        return first.rows_gram(features_t)[None], [None]
    values = np.unique(stamps)
    if len(values) > SHARED_GRAM_STAMPS:
        return None
    if len(values) == 1:
        return first.rows_gram(features_t)[None], values
    given = np.zeros((len(values), first.n_layers, first.n_columns, first.n_columns))
    add = step_kernels.add_grams_parallel if first.parallel else step_kernels.add_grams
    for k, v in enumerate(values.tolist()):
        add(np.ascontiguousarray(features_t[:, :, stamps == v]), given[k])
    return given, values
