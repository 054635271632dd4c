"""Rows that enter an ``OnlineLearner``'s sums at a weight: forgetting's decay 2^(−age/half_life) (docs/design.md
§8) times a row's own weight (``model.class_weight``, Theorem 1 with row weights). The learner's ``learn`` comes
here when either applies; its kernels do the rest on rows scaled by √w (``OnlineLearner.learn_rows``). Arrays in,
arrays out, no I/O.
"""

from __future__ import annotations

import numpy as np

from iolstream.core import gram_cholesky, step_kernels


def check_half_life(half_life) -> float | None:
    """None (no forgetting) or a finite number of rows > 0; raises ValueError naming ``forgetting``."""
    if half_life is None:
        return None
    if (
        isinstance(half_life, bool)
        or not isinstance(half_life, (int, float))
        or not (np.isfinite(half_life) and half_life > 0)
    ):
        raise ValueError(
            f"forgetting: must be null (off) or a half-life in rows, a number > 0, got {half_life!r}"
        )
    return float(half_life)


def learn_weighted(
    ln, features_t, targets, gram_in, predicted, observed_at, labelled_gram, sample_weight=None
) -> np.ndarray:
    """``OnlineLearner.learn`` with row weights w (forgetting's decay times ``sample_weight``): every row's D, Y and
    prediction are scaled by √w, so the same kernels add Dᵀ w Y to c, Dᵀ w D to A (-R, rows not yet in A) and
    A_r, and Σ w ½‖Dβ − Y‖² to the loss; then -F's rows already in A are brought to their weight there."""
    b = features_t.shape[2]
    if predicted is None:
        predicted = ln.layer_outputs(features_t)
    predicted = np.ascontiguousarray(predicted, dtype=np.float64)
    plain = np.empty(ln.n_layers)
    step_kernels.label_losses(predicted, targets, plain)
    decay = ln.row_weights(observed_at, b)
    weights = decay if sample_weight is None else decay * sample_weight
    if sample_weight is not None:
        if labelled_gram is not None:
            raise ValueError("labelled_gram: not with row weights (each row's Gram enters at its own)")
        _learn_scaled_rows(ln, features_t, targets, gram_in, predicted, weights)
        if ln.mode == "forward":
            _reweigh_entered(ln, features_t, gram_in, decay * (sample_weight - 1.0))
        return plain
    if labelled_gram is not None and np.ptp(weights):
        raise ValueError("labelled_gram: the rows must share one stamp (one weight)")
    no_gram = ln.mode == "forward" and (gram_in is None or np.all(gram_in))  # no Gram enters A now
    if (
        no_gram
        and not np.ptp(weights)
        and (labelled_gram is not None or not len(ln.state.arrays.gram_labelled))
    ):
        # one weight w for all, and no Gram to form: c += Dᵀ(wY) from Y and predictions times w, D as it is
        # (no copy); the kernel's losses and ‖Y‖² then come out w² times, and are taken back by 1/w
        w = float(weights[0])
        given = None if labelled_gram is None else labelled_gram * w
        ln.learn_rows(features_t, targets * w, gram_in, predicted * w, given, 1.0 / w)
        return plain
    _learn_scaled_rows(ln, features_t, targets, gram_in, predicted, weights, labelled_gram)
    return plain


def _learn_scaled_rows(ln, features_t, targets, gram_in, predicted, weights, labelled_gram=None) -> None:
    """``learn_rows`` of the rows scaled by √weights (D, Y and the prediction: Dᵀ w Y, Dᵀ w D, w ½‖Dβ − Y‖²)."""
    if not (weights == 1.0).all():
        root = np.sqrt(weights)
        features_t = np.ascontiguousarray(features_t * root.astype(features_t.dtype))
        targets = targets * root[:, None]
        predicted = predicted * root[:, None]
    ln.learn_rows(features_t, targets, gram_in, predicted, labelled_gram)


def _reweigh_entered(ln, features_t, gram_in, extra: np.ndarray) -> None:
    """-F: A += Σ extraᵢ·dᵢᵀdᵢ over the rows whose Gram is in A already (``gram_in``; they entered at weight 1,
    decayed since): a labelled row of weight wᵢ ends at wᵢ. extra < 0 (w < 1) is a downdate of a part of what
    the row put in, so A stays positive definite. The factors are rebuilt from A when next read."""
    entered = np.ones(len(extra), dtype=bool) if gram_in is None else np.asarray(gram_in, dtype=bool)
    parts = [(sign, np.flatnonzero(entered & (sign * extra > 0))) for sign in (1.0, -1.0)]
    parts = [(sign, rows) for sign, rows in parts if rows.size]
    if not parts:
        return
    with ln.state.changing_gram():
        for sign, rows in parts:
            scaled = features_t[:, :, rows] * np.sqrt(np.abs(extra[rows])).astype(features_t.dtype)
            for layer, ls in enumerate(ln.state.layers):
                gram_cholesky.gram_update(ls.gram, np.ascontiguousarray(scaled[layer]), sign=sign)
