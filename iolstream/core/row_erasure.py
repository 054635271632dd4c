"""Rows taken back out of a model as if it had never seen them (docs/design.md §13): the model is sums over rows
(A = λI + Σ w·DᵀD, c = Σ w·DᵀY per layer and candidate), so a row's terms can be subtracted at the weight it has
now. ``EdRVFL.erase`` calls ``erase`` here, which takes the rows out of the model's candidates
(``CandidateSet.erase``), each learner's own sums by ``erase_rows`` here (``OnlineLearner.erase``). Arrays in, arrays
out, no I/O.
"""

from __future__ import annotations

import numpy as np

from iolstream.core import calibration, gram_cholesky, step_kernels


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
    model.candidate_set.erase(features_t, scaled, labelled, stamps, sample_weight=weights)
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


def grams_by_stamp(first, features_t, stamps) -> tuple | None:
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


def erase_rows(
    ln,
    features_t: np.ndarray,
    targets: np.ndarray,
    labelled,
    observed_at=None,
    *,
    grams=None,
    undo=None,
    sample_weight=None,
) -> None:
    """Take rows out of the sums entirely, as if they had never come (docs/design.md §13): every term a row
    put in, at the weight it has now.

        A   −= Σ w dᵢdᵢᵀ   rows whose Gram is in A: every row under -F, the labelled ones under -R
        c   −= Σ w dᵢᵀyᵢ   labelled rows;  A_r −= Σ w dᵢdᵢᵀ and Σ‖y‖² −= Σ w‖yᵢ‖² likewise
        w    = 2^(−(clock − stamp)/half_life) (1 without forgetting), times a labelled row's class weight

    features_t : (L, n, b) — D_lᵀ of the rows, as ``learn`` takes them
    targets    : (b, m) — Y as the layers learned it (one-hot, or scaled regression targets); rows not
                 labelled are not read
    labelled   : (b,) bool — whose label is in c
    observed_at : the rows' stamps, as in ``learn``
    grams      : (G (K, L, n, n), stamps (K,)) — the rows' Gram by stamp, unweighted (lower triangles), formed
                 once for the half-lives of ``auto``: A loses Σ w(stamp)·G instead of a Gram formed again
                 (every row's Gram in A; every row labelled, or no A_r)
    sample_weight : (b,) — the class weight each labelled row entered with (``learn``'s ``sample_weight``;
                 under -F its Gram ended at that weight too); None: 1. Rows not labelled left at 1
    undo       : a list; once the rows are out, a function putting this learner's sums back is appended (a
                 model taking rows out of several learners, all or nothing)

    The row counters go back (``rows_observed`` by the Gram rows, ``rows_labelled`` by the labelled ones);
    the clock does not (it is time: the other rows keep their age). A is then factored again from the
    sums, by Cholesky (a factor is never downdated; a Woodbury P is rebuilt from A when next needed). Should
    round-off leave A or A_r not positive definite, every sum is put back as it was and
    ``gram_cholesky.NotPositiveDefinite`` raised: the rows stay, nothing else changed.
    """
    b = features_t.shape[2]
    labelled = np.broadcast_to(np.asarray(labelled, dtype=bool), (b,))
    gram_rows = np.ones(b, dtype=bool) if ln.mode == "forward" else labelled
    if b == 0 or not gram_rows.any():
        return
    st, a = ln.state, ln.state.arrays
    targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, ln.n_outputs)
    weights = ln.row_weights(observed_at, b)
    if sample_weight is not None:
        weights = weights * np.where(labelled, np.asarray(sample_weight, dtype=np.float64).reshape(b), 1.0)
        grams = None  # a Gram by stamp holds the rows at one weight
    root = np.sqrt(weights)
    scaled = ln.kernel_features(features_t)
    removed_y2 = float((weights[labelled] * (targets[labelled] ** 2).sum(axis=1)).sum())
    every_gram = gram_rows.all() and (labelled.all() or not len(a.gram_labelled))
    no_grams = np.empty((0, ln.n_layers, ln.n_columns, ln.n_columns))
    if grams is not None and every_gram:  # given by stamp: A (and A_r) lose Σ w(stamp)·G, c loses Dᵀ(wY)
        given, stamps = grams
        given_w = np.array([float(ln.row_weights(stamp, 1)[0]) for stamp in stamps])
        y_w = targets[labelled] * weights[labelled, None]
    elif every_gram and labelled.all() and len(a.gram_labelled):  # A and A_r lose the same Gram: formed once
        if not (weights == 1.0).all():
            scaled = np.ascontiguousarray(scaled * root.astype(scaled.dtype))
        given, given_w, y_w = ln.rows_gram(scaled)[None], np.ones(1), targets * root[:, None]
    else:  # the kernel takes each Gram out itself
        if not (weights == 1.0).all():
            scaled = np.ascontiguousarray(scaled * root.astype(scaled.dtype))
        given, given_w = no_grams, np.ones(0)
        y_w = targets[labelled] * root[labelled, None]  # (√w d)ᵀ(√w y) = w dᵀy
    labelled_t = scaled if labelled.all() else np.ascontiguousarray(scaled[:, :, labelled])
    grams_t = scaled if gram_rows.all() else np.ascontiguousarray(scaled[:, :, gram_rows])
    y_w = np.ascontiguousarray(y_w)
    saved = (a.gram.copy(), a.rhs.copy(), a.gram_labelled.copy())
    info = np.zeros(ln.n_layers, dtype=np.int32)
    kernel = step_kernels.erase_parallel if ln.parallel else step_kernels.erase_serial
    check_labelled = ln.keep_labelled and len(a.gram_labelled) > 0  # a -R candidate solves on A_r
    sums = (a.gram, a.factors(), a.rhs, a.gram_labelled, ln.scratch())
    stack = (*sums, given, given_w, check_labelled, info)
    with st.changing_gram(factor="made"):  # factored from the sums just now (or put back, all stale)
        if kernel(grams_t, labelled_t, y_w, *stack):
            a.gram[...], a.rhs[...], a.gram_labelled[...] = saved
            layer = int(np.flatnonzero(info)[0])
            which = "A_r" if info[layer] > ln.n_columns else "A"
            raise gram_cholesky.NotPositiveDefinite(
                f"layer {layer}: erasing these rows would leave {which} not positive definite (round-off); "
                "nothing was changed"
            )
    if undo is not None:
        undo.append(_putting_back(st, saved))
    st.sum_y2 = max(st.sum_y2 - removed_y2, 0.0)
    st.rows_observed -= int(gram_rows.sum())
    st.rows_labelled -= int(labelled.sum())
    st.version += 1
    if labelled.any():  # A_r and c moved: a -R candidate solving on them solves again
        st.labelled_version += 1


def _putting_back(st, saved: tuple):
    """A function putting ``st``'s sums and row counters back as they are now, with these saved arrays."""
    counters = (st.rows_observed, st.rows_labelled, st.sum_y2, st.version)

    def put_back() -> None:
        a = st.arrays
        with st.changing_gram():
            a.gram[...], a.rhs[...], a.gram_labelled[...] = saved
        st.rows_observed, st.rows_labelled, st.sum_y2, st.version = counters
        st.labelled_version += 1  # a β solved on the sums taken out is not theirs

    return put_back
