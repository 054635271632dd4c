"""How labelled rows enter a learner's sums (docs/design.md §2, §3, §8): c += DᵀY, and the Gram of rows not in A
yet (-R, or rows never observed); A_r, the labelled rows' Gram that -F keeps for its regret and for ``auto``'s -R
candidates; with forgetting each row at its weight 2^(−age/half-life); the loss of the prediction each row had;
and the downdate of rows whose label never comes. ``OnlineLearner`` takes these from ``LabelFold``.
"""

from __future__ import annotations

import numpy as np

from iolstream.core import gram_cholesky as linalg
from iolstream.core import shared_step_kernels as fused_shared
from iolstream.core import step_kernels as fused


class LabelFold:
    """The label side of ``learner.OnlineLearner`` (its state, solver route and kernels are the learner's)."""

    def learn(
        self,
        features_t: np.ndarray,
        targets: np.ndarray,
        *,
        gram_in: np.ndarray | None = None,
        predicted: np.ndarray | None = None,
        observed_at=None,
        labelled_gram: np.ndarray | None = None,
        sample_weight: np.ndarray | None = None,
    ) -> np.ndarray:
        """Fold labelled rows in: c_l += D_lᵀY (and their Gram, where it has not entered yet).

        features_t : (L, n, b) — D_lᵀ of the labelled rows
        targets    : (b, m) float — Y (one-hot for classification)
        gram_in    : (b,) bool — rows whose Gram is already in A. Default: all (-F), none (-R).
        predicted  : (L, b, m) — the layer outputs that were emitted for these rows (the β that
                     made the prediction); default: computed now, before this update. Rows it holds NaN for
                     (``auto``'s candidates not scored on their batch) are learned but add no loss.
        observed_at : int or (b,) ints — with forgetting, each row's stamp (``state.clock`` right
                     after its batch was seen); the row enters with weight 2^(−(clock − stamp)/half_life).
                     Default: the current clock (weight 1). Ignored without forgetting.
        labelled_gram : (L, n, n) — Σ DᵀD of these rows (lower triangles), formed once for the half-lives of
                     ``auto`` (``candidate_step``): A_r adds it, times the rows' weight (one stamp for all),
                     instead of forming its own. Only for rows whose Gram is in A.
        sample_weight : (b,) float > 0 — each row's weight wᵢ (``model.class_weight``): it enters as wᵢ rows would,
                     A = λI + Σ wᵢ dᵢᵀdᵢ, c = Σ wᵢ dᵢᵀyᵢ (Theorem 1 with row weights). Under -F a row's Gram entered
                     A at weight 1 before its label was known: (wᵢ − 1)·dᵢᵀdᵢ is added now (at the row's decay
                     with forgetting), so a labelled row ends at wᵢ and a row never labelled stays at 1.
        Returns the immediate loss per layer, (L,), ½‖D_l β_l − Y‖² with that β (unweighted; the
        weighted loss is what accumulates in ``loss_sum`` with forgetting).
        β is left stale (solved when read): under -F the next observe replaces it unread.
        """
        b = features_t.shape[2]
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, self.n_outputs)
        predicted = unpredicted_as_targets(predicted, targets)
        if sample_weight is not None and b:
            sample_weight = np.asarray(sample_weight, dtype=np.float64).reshape(b)
            if not (np.isfinite(sample_weight).all() and (sample_weight > 0).all()):
                raise ValueError("sample_weight: every row's weight must be finite and > 0")
            if (sample_weight == 1.0).all():
                sample_weight = None
        if (self.half_life is not None or sample_weight is not None) and b:
            return self._learn_weighted(
                features_t, targets, gram_in, predicted, observed_at, labelled_gram, sample_weight
            )
        return self._learn(features_t, targets, gram_in, predicted, labelled_gram)

    def row_weights(self, observed_at, b: int) -> np.ndarray:
        """(b,) weights 2^(−(clock − stamp)/half_life) of rows stamped ``observed_at`` (all 1 without forgetting)."""
        if self.half_life is None or observed_at is None:
            return np.ones(b)
        stamps = np.broadcast_to(np.asarray(observed_at, dtype=np.float64), (b,))
        ages = self.clock - stamps
        if (ages < 0).any() or not np.isfinite(ages).all():
            raise ValueError(
                f"observed_at: stamps must be ≤ the clock ({self.clock}), got up to {stamps.max()}"
            )
        return np.exp2(-ages / self.half_life)

    def _learn_weighted(
        self, features_t, targets, gram_in, predicted, observed_at, labelled_gram, sample_weight=None
    ) -> np.ndarray:
        """``learn`` with row weights w (forgetting's decay times ``sample_weight``): every row's D, Y and
        prediction are scaled by √w, so the same kernels add Dᵀ w Y to c, Dᵀ w D to A (-R, rows not yet in A) and
        A_r, and Σ w ½‖Dβ − Y‖² to the loss; then -F's rows already in A are brought to their weight there."""
        b = features_t.shape[2]
        if predicted is None:
            predicted = self.layer_outputs(features_t)
        predicted = np.ascontiguousarray(predicted, dtype=np.float64)
        plain = np.empty(self.n_layers)
        fused.label_losses(predicted, targets, plain)
        decay = self.row_weights(observed_at, b)
        weights = decay if sample_weight is None else decay * sample_weight
        if sample_weight is not None:
            if labelled_gram is not None:
                raise ValueError("labelled_gram: not with row weights (each row's Gram enters at its own)")
            self._learn_scaled_rows(features_t, targets, gram_in, predicted, weights)
            if self.mode == "forward":
                self._reweigh_entered(features_t, gram_in, decay * (sample_weight - 1.0))
            return plain
        if labelled_gram is not None and np.ptp(weights):
            raise ValueError("labelled_gram: the rows must share one stamp (one weight)")
        no_gram = self.mode == "forward" and (gram_in is None or np.all(gram_in))  # no Gram enters A now
        if (
            no_gram
            and not np.ptp(weights)
            and (labelled_gram is not None or not len(self.state.arrays.gram_labelled))
        ):
            # one weight w for all, and no Gram to form: c += Dᵀ(wY) from Y and predictions times w, D as it is
            # (no copy); the kernel's losses and ‖Y‖² then come out w² times, and are taken back by 1/w
            w = float(weights[0])
            given = None if labelled_gram is None else labelled_gram * w
            self._learn(features_t, targets * w, gram_in, predicted * w, given, 1.0 / w)
            return plain
        self._learn_scaled_rows(features_t, targets, gram_in, predicted, weights, labelled_gram)
        return plain

    def _learn_scaled_rows(
        self, features_t, targets, gram_in, predicted, weights, labelled_gram=None
    ) -> None:
        """``_learn`` of the rows scaled by √weights (D, Y and the prediction: Dᵀ w Y, Dᵀ w D, w ½‖Dβ − Y‖²)."""
        if not (weights == 1.0).all():
            root = np.sqrt(weights)
            features_t = np.ascontiguousarray(features_t * root.astype(features_t.dtype))
            targets = targets * root[:, None]
            predicted = predicted * root[:, None]
        self._learn(features_t, targets, gram_in, predicted, labelled_gram)

    def _reweigh_entered(self, features_t, gram_in, extra: np.ndarray) -> None:
        """-F: A += Σ extraᵢ·dᵢᵀdᵢ over the rows whose Gram is in A already (``gram_in``; they entered at weight 1,
        decayed since): a labelled row of weight wᵢ ends at wᵢ. extra < 0 (w < 1) is a downdate of a part of what
        the row put in, so A stays positive definite. The factors are rebuilt from A when next read."""
        entered = np.ones(len(extra), dtype=bool) if gram_in is None else np.asarray(gram_in, dtype=bool)
        changed = False
        for sign in (1.0, -1.0):
            rows = np.flatnonzero(entered & (sign * extra > 0))
            if not rows.size:
                continue
            scaled = features_t[:, :, rows] * np.sqrt(np.abs(extra[rows])).astype(features_t.dtype)
            for layer, ls in enumerate(self.state.layers):
                linalg.gram_update(ls.gram, np.ascontiguousarray(scaled[layer]), sign=sign)
            changed = True
        if changed:
            a = self.state.arrays
            a.factor_stale[:] = a.beta_stale[:] = True
            a.factor_inverse[:] = False  # a Woodbury P of the old A is rebuilt from A when next needed
            a.woodbury_steps[:] = 0

    def _learn(self, features_t, targets, gram_in, predicted, labelled_gram=None, scale=1.0) -> np.ndarray:
        """``learn`` of rows at weight 1 (or scaled by the caller); ``scale`` multiplies the losses and ‖Y‖² added
        (``_learn_weighted``)."""
        b = features_t.shape[2]
        if self.mode == "ridge":
            new, n_new = slice(None), b  # -R: no row's Gram is in A
        elif gram_in is None:
            new, n_new = slice(0), 0  # -F: every row's is
        else:
            new = np.flatnonzero(~np.asarray(gram_in, dtype=bool))  # rows whose Gram enters now
            n_new = new.size
        if predicted is None:
            predicted = self.layer_outputs(features_t)
        predicted = np.ascontiguousarray(predicted, dtype=np.float64)
        st = self.state
        a = st.arrays
        losses = np.empty(self.n_layers)
        own_labelled = labelled_gram is None or not len(a.gram_labelled)
        if not own_labelled:
            if n_new:
                raise ValueError("labelled_gram: only for rows whose Gram is in A already")
            fused_shared.add_lower(
                labelled_gram, a.gram_labelled
            )  # its lower triangles (the upper ones are not kept)
        if b and (n_new == 0 or (n_new == b and self._uses_cholesky(b))) and self._fusable(features_t):
            info = np.zeros(self.n_layers, dtype=np.int32)
            kernel = fused.learn_parallel if self.parallel else fused.learn_serial
            labelled = a.gram_labelled if own_labelled else a.gram_labelled[:0]
            state = (a.rhs, a.gram, a.factors() if n_new else a.factor, labelled)  # n_new: A is refactored
            sum_y2 = kernel(features_t, targets, predicted, *state, n_new == b, info, losses)
            if info.any():
                raise_for(info)
            if n_new:  # the kernel factored A into ``factor``
                a.factor_inverse[:] = a.factor_stale[:] = False
                a.woodbury_steps[:] = 0
        else:
            sum_y2 = fused.label_losses(predicted, targets, losses)
            if b == 0:
                return losses
            self._learn_layers(features_t, targets, n_new, new, own_labelled)
        if scale != 1.0:
            losses *= scale
            sum_y2 *= scale
        self.folded(features_t, targets, predicted, n_new, losses, sum_y2)
        return losses

    def folded(self, features_t, targets, predicted, n_new: int, losses: np.ndarray, sum_y2: float) -> None:
        """The bookkeeping of b labelled rows whose sums a kernel has just added (``n_new`` of them entering A):
        their losses (L,) and Σ‖Y‖² into the sums, the counters, D_m and Y_m, β stale, the versions."""
        b = features_t.shape[2]
        st = self.state
        a = st.arrays
        a.loss_sum += losses
        a.beta_stale[:] = True
        st.rows_observed += n_new
        st.rows_labelled += b
        st.label_batches += 1
        st.max_label_batch = max(st.max_label_batch, b)
        st.sum_y2 += sum_y2
        if self.track_regret:  # D_m and Y_m of the bounds: one more pass over D, skipped when not tracked
            st.d_max = max(st.d_max, fused.abs_max(features_t))
            st.y_max = max(st.y_max, float(np.abs(targets).max()), fused.abs_max(predicted))
        st.version += 1
        st.labelled_version += 1

    def _learn_layers(self, features_t, targets, n_new, new, own_labelled=True) -> None:
        """``learn`` layer by layer (any layout; some rows' Gram entering, or the Woodbury route)."""
        b = features_t.shape[2]
        targets_f = np.asfortranarray(targets)
        targets_f32 = targets_f.astype(np.float32) if features_t.dtype == np.float32 else None
        for layer, ls in enumerate(self.state.layers):
            d_t = features_t[layer]
            if n_new:
                self._enter_gram(ls, d_t if n_new == b else np.ascontiguousarray(d_t[:, new]))
            if ls.gram_labelled is not None and own_labelled:
                linalg.gram_update(ls.gram_labelled, d_t)
            ls.rhs += linalg.product(
                d_t.T, targets_f if d_t.dtype == np.float64 else targets_f32, trans_a=True
            )  # c += DᵀY

    def forget(self, features_t: np.ndarray, observed_at=None) -> None:
        """Downdate: remove rows' Gram from A (-F rows whose label will never come; docs/design.md §2 option).

        With forgetting, each row is removed with its present weight (``observed_at`` as in ``learn``).
        The factor is rebuilt from the exact A by Cholesky (a Woodbury downdate is not stable).
        """
        if self.mode == "ridge" or features_t.shape[2] == 0:
            return
        weights = self.row_weights(observed_at, features_t.shape[2])
        if not (weights == 1.0).all():
            features_t = features_t * np.sqrt(weights).astype(features_t.dtype)
        for layer, ls in enumerate(self.state.layers):
            linalg.gram_update(ls.gram, features_t[layer], sign=-1.0)
            self._refactor(ls)
        self.state.arrays.beta_stale[:] = True
        self.state.rows_forgotten += features_t.shape[2]
        self.state.version += 1

    def erase(
        self,
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
        ``linalg.NotPositiveDefinite`` raised: the rows stay, nothing else changed.
        """
        b = features_t.shape[2]
        labelled = np.broadcast_to(np.asarray(labelled, dtype=bool), (b,))
        gram_rows = np.ones(b, dtype=bool) if self.mode == "forward" else labelled
        if b == 0 or not gram_rows.any():
            return
        st, a = self.state, self.state.arrays
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, self.n_outputs)
        weights = self.row_weights(observed_at, b)
        if sample_weight is not None:
            weights = weights * np.where(
                labelled, np.asarray(sample_weight, dtype=np.float64).reshape(b), 1.0
            )
            grams = None  # a Gram by stamp holds the rows at one weight
        root = np.sqrt(weights)
        scaled = self._kernel_features(features_t)
        removed_y2 = float((weights[labelled] * (targets[labelled] ** 2).sum(axis=1)).sum())
        every_gram = gram_rows.all() and (labelled.all() or not len(a.gram_labelled))
        no_grams = np.empty((0, self.n_layers, self.n_columns, self.n_columns))
        if grams is not None and every_gram:  # given by stamp: A (and A_r) lose Σ w(stamp)·G, c loses Dᵀ(wY)
            given, stamps = grams
            given_w = np.array([float(self.row_weights(stamp, 1)[0]) for stamp in stamps])
            y_w = targets[labelled] * weights[labelled, None]
        elif (
            every_gram and labelled.all() and len(a.gram_labelled)
        ):  # A and A_r lose the same Gram: formed once
            if not (weights == 1.0).all():
                scaled = np.ascontiguousarray(scaled * root.astype(scaled.dtype))
            given, given_w, y_w = self.rows_gram(scaled)[None], np.ones(1), targets * root[:, None]
        else:  # the kernel takes each Gram out itself
            if not (weights == 1.0).all():
                scaled = np.ascontiguousarray(scaled * root.astype(scaled.dtype))
            given, given_w = no_grams, np.ones(0)
            y_w = targets[labelled] * root[labelled, None]  # (√w d)ᵀ(√w y) = w dᵀy
        labelled_t = scaled if labelled.all() else np.ascontiguousarray(scaled[:, :, labelled])
        grams_t = scaled if gram_rows.all() else np.ascontiguousarray(scaled[:, :, gram_rows])
        y_w = np.ascontiguousarray(y_w)
        saved = (a.gram.copy(), a.rhs.copy(), a.gram_labelled.copy())
        info = np.zeros(self.n_layers, dtype=np.int32)
        kernel = fused.erase_parallel if self.parallel else fused.erase_serial
        check_labelled = self.keep_labelled and len(a.gram_labelled) > 0  # a -R candidate solves on A_r
        sums = (a.gram, a.factors(), a.rhs, a.gram_labelled, self.scratch())
        stack = (*sums, given, given_w, check_labelled, info)
        if kernel(grams_t, labelled_t, y_w, *stack):
            a.gram[...], a.rhs[...], a.gram_labelled[...] = saved
            a.factor_stale[:] = a.beta_stale[:] = True
            a.factor_inverse[:] = False
            layer = int(np.flatnonzero(info)[0])
            which = "A_r" if info[layer] > self.n_columns else "A"
            raise linalg.NotPositiveDefinite(
                f"layer {layer}: erasing these rows would leave {which} not positive definite (round-off); "
                "nothing was changed"
            )
        a.factor_stale[:] = a.factor_inverse[:] = False  # factored from the sums just now
        a.woodbury_steps[:] = 0
        a.beta_stale[:] = True
        if undo is not None:
            undo.append(_putting_back(st, saved))
        st.sum_y2 = max(st.sum_y2 - removed_y2, 0.0)
        st.rows_observed -= int(gram_rows.sum())
        st.rows_labelled -= int(labelled.sum())
        st.version += 1
        if labelled.any():  # A_r and c moved: a -R candidate solving on them solves again
            st.labelled_version += 1

    def rows_gram(self, features_t: np.ndarray) -> np.ndarray:
        """Σ DᵀD (L, n, n) of rows, lower triangles of A's layout, formed by the fused kernel."""
        gram = np.zeros((self.n_layers, self.n_columns, self.n_columns))
        (fused.add_grams_parallel if self.parallel else fused.add_grams)(features_t, gram)
        return gram


def _putting_back(st, saved: tuple):
    """A function putting ``st``'s sums and row counters back as they are now, with these saved arrays."""
    counters = (st.rows_observed, st.rows_labelled, st.sum_y2, st.version)

    def put_back() -> None:
        a = st.arrays
        a.gram[...], a.rhs[...], a.gram_labelled[...] = saved
        st.rows_observed, st.rows_labelled, st.sum_y2, st.version = counters
        st.labelled_version += 1  # a β solved on the sums taken out is not theirs
        a.factor_stale[:] = a.beta_stale[:] = True
        a.factor_inverse[:] = False

    return put_back


def unpredicted_as_targets(predicted, targets: np.ndarray):
    """``predicted`` (L, b, m) with every row it holds NaN for (a row this learner did not predict) replaced by
    its targets, so that the row's loss is exactly 0; None stays None."""
    if predicted is None:
        return None
    predicted = np.ascontiguousarray(predicted, dtype=np.float64)
    missing = np.isnan(predicted).any(axis=(0, 2))
    if not missing.any():
        return predicted
    return np.where(missing[None, :, None], targets[None], predicted)


def raise_for(info: np.ndarray) -> None:
    """Raise for the first layer whose factorisation (info > 0) or solve (info < 0) failed."""
    layer = int(np.flatnonzero(info)[0])
    if info[layer] > 0:
        raise linalg.NotPositiveDefinite(
            f"layer {layer}: Cholesky failed at column {info[layer]}: the Gram matrix is not positive definite"
        )
    raise ValueError(f"layer {layer}: dpotrs: illegal argument {-info[layer]}")
