"""The online output-layer learners of edRVFL: -F and -R on one state (docs/design.md §2).

Each layer l keeps sufficient statistics, never past data:

    A_l = λ_l I + Σ DᵀD over every row whose Gram has entered   (P_l = A_l⁻¹ is the paper's η)
    c_l = Σ DᵀY over every labelled row
    β_l = A_l⁻¹ c_l

-F (Algorithm 2, Theorem 3): ``observe`` puts a batch's Gram into A before the
batch is predicted; ``learn`` later adds only DᵀY to c.
-R (Algorithm 1, Theorem 2): ``observe`` changes nothing; ``learn`` adds the
Gram and DᵀY together.

Because A and c are sums, any label delay and any arrival order give the same
state; in order with labels one batch late this is exactly the paper's
recursions (tests/naive.py transcribes them). A β is never obtained by inverting
A per batch: either the Cholesky factor of A is recomputed (Gram + Cholesky,
O(b·n² + n³), best for large batches) or P is updated by Woodbury (O(b·n² + b²·n + b³),
best for b well below n), with P rebuilt from the exact A every
``refactor_every`` Woodbury steps so that round-off cannot accumulate.

β is solved lazily: ``learn`` only marks it stale, since under -F the next
``observe`` changes A and solves again before any prediction; whoever reads β
(a prediction, the regret, a snapshot) gets A⁻¹c. Likewise the -F step factors A
in scratch memory and the stored factor is made when read. The Gram + Cholesky
route runs as fused kernels over all layers at once (``step_kernels``), on one core or —
when ``parallel`` is set, by ``step_tuner.StepTuner`` — spread over Numba's threads.
"""

from __future__ import annotations

import numba
import numpy as np

from iolstream.core import gram_cholesky, row_erasure, shared_step_kernels, step_kernels, weighted_rows, work
from iolstream.core.learner_state import LayerArrays, LayerState, LearnerState, solve_stale

MODES = ("forward", "ridge")
SOLVERS = ("auto", "cholesky", "woodbury")

# auto: Woodbury when b·WOODBURY_RATIO ≤ n. Measured (docs/benchmarks.md, "The update's building blocks"): Woodbury wins only
# below b ≈ n/8 to n/4; n/6 sits in between.
WOODBURY_RATIO = 6


def as_lams(lam, n_layers: int) -> list[float]:
    lams = [float(lam)] * n_layers if np.isscalar(lam) else [float(v) for v in lam]
    if len(lams) != n_layers:
        raise ValueError(f"lam: expected a scalar or {n_layers} values (one per layer), got {len(lams)}")
    if not all(np.isfinite(v) and v > 0 for v in lams):
        raise ValueError(f"lam: every value must be finite and > 0, got {lams}")
    return lams


class OnlineLearner:
    """L independent ridge learners on the layer features, updated by -F or -R.

    Parameters
    ----------
    n_columns : int — n, columns of every D_l
    n_outputs : int — m
    n_layers : int — L
    lam : float or sequence of L floats — λ_l (the prior A_0 = λ_l I)
    mode : "forward" (-F, default) or "ridge" (-R)
    solver : "auto" (by batch size), "cholesky" (Gram + Cholesky) or "woodbury"
    refactor_every : int — Woodbury steps between exact rebuilds of P from A
    track_regret : bool — keep A_r (labelled rows only) for the exact regret of -F (costs one
        extra symmetric rank-b update per labelled batch; -R gets it for free since A_r = A)
        and the D_m, Y_m of the bounds (one pass over D per labelled batch)
    half_life : float or None — forgetting (docs/design.md §8): a row seen τ rows ago weighs 2^(−τ/half_life)
        in A and c; None (default) = no forgetting, bit for bit the learner without it
    keep_labelled : bool — -F: keep A_r even without ``track_regret`` (``mode: auto``: the -R candidates
        solve on it, ``shared_gram``)

    Forgetting runs on ``state.clock``, the rows seen so far: ``observe`` (both modes) advances it
    by b and first scales every data sum by 2^(−b/half_life) (``LearnerState.scale``; λI stays).
    A row's stamp is the clock right after its batch was seen (``observed_at``); its label, and
    under -R its Gram, enter with weight 2^(−(clock − stamp)/half_life), the weight its Gram has
    in A under -F. So at every step β is the closed-form weighted ridge on what is labelled.
    The scaling changes A by a multiple of I, not by rank b: Woodbury does not apply, and every
    batch refactors A by Cholesky (n³/3 per layer; ``solver`` "woodbury" is refused).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> learner = OnlineLearner(n_columns=3, n_outputs=1, n_layers=1, lam=1.0)
    >>> d_t = rng.standard_normal((1, 3, 8))            # D_1ᵀ of one batch of 8 rows
    >>> learner.observe(d_t)                            # -F: Gram enters first
    >>> loss = learner.learn(d_t, rng.standard_normal((8, 1)))  # labels later: only c changes
    >>> learner.state.rows_observed, learner.state.rows_labelled
    (8, 8)
    """

    # the least work per layer a label fold spreads over Numba's threads (``folds_in_parallel``; the kernel warm-up
    # sets 0 on its tiny model, so that the parallel fold kernels are loaded too)
    parallel_fold_flops = work.PARALLEL_FOLD_FLOPS

    def __init__(
        self,
        n_columns: int,
        n_outputs: int,
        n_layers: int,
        lam=1.0,
        mode: str = "forward",
        solver: str = "auto",
        refactor_every: int = 256,
        track_regret: bool = True,
        half_life: float | None = None,
        keep_labelled: bool = False,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if refactor_every < 1:
            raise ValueError(f"refactor_every must be ≥ 1, got {refactor_every}")
        half_life = weighted_rows.check_half_life(half_life)
        if half_life is not None and solver == "woodbury":
            raise ValueError(
                "solver 'woodbury' cannot forget (forgetting scales A, not a rank-b change): "
                "use 'auto' or 'cholesky'"
            )
        self.n_columns = n_columns
        self.n_outputs = n_outputs
        self.n_layers = n_layers
        self.lam = lam
        self.mode = mode
        self.solver = solver
        self.refactor_every = refactor_every
        self.track_regret = track_regret
        self.keep_labelled = keep_labelled
        self.half_life = half_life
        self.parallel = False  # spread the layers over Numba's threads (set by step_tuner.StepTuner)
        self._scratch = None  # (threads, n, n): Cholesky factors of the fused -F step
        self.state = self.initial_state()

    # ------------------------------------------------------------------ state
    def initial_state(self) -> LearnerState:
        """η_0 = (λI)⁻¹, β = 0 for every layer."""
        lams = as_lams(self.lam, self.n_layers)
        arrays = LayerArrays.initial(
            lams,
            self.n_columns,
            self.n_outputs,
            (self.track_regret or self.keep_labelled) and self.mode == "forward",
        )
        return LearnerState([LayerState(arrays, i, lam) for i, lam in enumerate(lams)], arrays=arrays)

    # ------------------------------------------------------------ prediction
    def layer_outputs(self, features_t: np.ndarray) -> np.ndarray:
        """D_l β_l for every layer: (L, b, m). Pure: changes nothing (but solves a stale β). After A changed
        (every factor and β stale, as ``observe_sums`` leaves them) A is factored in scratch memory, as the
        -F step does, and solved and predicted from in one kernel call."""
        features_t = self.kernel_features(features_t)
        a = self.state.arrays
        out = np.empty((self.n_layers, features_t.shape[2], self.n_outputs))
        if a.beta_stale.all() and a.factor_stale.all():
            self.solve_and_predict(features_t, a.gram, a.rhs, np.zeros(self.n_layers), a.beta, out)
            a.beta_stale[:] = False
            return out
        solve_stale(self.state)
        step_kernels.predict_all(features_t, a.beta, out)
        return out

    def solve_and_predict(self, features_t, gram, rhs, shift, beta, out) -> None:
        """β_l = (A_l + shift_l I)⁻¹ c_l from ``gram`` and ``rhs`` (this learner's sums, or the ones it shares,
        ``shared_gram``) into ``beta``, factored in scratch memory; ``out`` (L, b, m) = D_l β_l."""
        info = np.zeros(self.n_layers, dtype=np.int32)
        kernel = step_kernels.solve_predict_parallel if self.parallel else step_kernels.solve_predict_serial
        if kernel(features_t, gram, shift, self.scratch(), rhs, beta, out, info):
            gram_cholesky.raise_for(info)

    def scoring_flops(self, b: int) -> float:
        """FLOPs of predicting a b-row batch it would not predict otherwise (``candidates.ScoringBudget``): a
        Cholesky per layer, unless -F keeps A⁻¹ by Woodbury for batches of b rows."""
        cholesky = self.mode == "ridge" or self._uses_cholesky(b)
        return work.scoring_flops(self.n_columns, self.n_outputs, self.n_layers, b, cholesky)

    def own_state(self) -> LearnerState:
        """The state this learner keeps itself: all of it (a candidate sharing another's sums: its counters, loss
        sums and β, without a copy of the sums; ``shared_gram``)."""
        return self.state

    def labelled_sums(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Per layer (c_l (n, m), A_r,l (n, n), lower triangle authoritative): the labelled rows' sums, what the
        offline expert of the regret solves on (docs/design.md §3); A_r is None for -F when not kept. Views."""
        return [(ls.rhs, ls.gram_labelled if self.mode == "forward" else ls.gram) for ls in self.state.layers]

    @property
    def calibration_sums(self) -> np.ndarray:
        """(GRID_SIZE,) the calibration's sums of this learner's predictions (``core.calibration``), in place."""
        return self.state.calibration

    @property
    def version(self) -> int:
        """Bumped at every change of the sums."""
        return self.state.version

    @property
    def clock(self) -> int:
        """Rows seen so far (``state.clock``)."""
        return self.state.clock

    def scratch(self) -> np.ndarray:
        """(threads, n, n): the Cholesky factors of the fused kernels, one block per Numba thread."""
        if self._scratch is None:
            self._scratch = np.empty((numba.config.NUMBA_NUM_THREADS, self.n_columns, self.n_columns))
        return self._scratch

    # ----------------------------------------------------------------- update
    def observe(self, features_t: np.ndarray) -> None:
        """A new unlabelled batch. -F: its Gram enters A now (η_{t+1}, Algorithm 2). -R: nothing."""
        self._forward(features_t, predict=False)

    def observe_and_predict(self, features_t: np.ndarray) -> np.ndarray:
        """``observe`` then ``layer_outputs`` (L, b, m), fused into one kernel call where possible."""
        out = self._forward(features_t, predict=True)
        return self.layer_outputs(features_t) if out is None else out

    def observe_rows(self, network, x_scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``network.features`` then ``observe_and_predict``: (features_t, layer outputs), in one
        kernel call on the -F Gram + Cholesky route (``network``: a ``RandomNetwork``)."""
        b = x_scaled.shape[0]
        if (
            self.mode == "ridge"
            or b == 0
            or not self._uses_cholesky(b)
            or network.n_columns != self.n_columns
        ):
            features_t = network.features(x_scaled, parallel=self.parallel)
            return features_t, self.observe_and_predict(features_t)
        self._tick(b)
        features_t = network.empty_features(b)
        args = (np.ascontiguousarray(x_scaled, dtype=network.dtype), *network.kernel_weights, features_t)
        out = self._forward_kernel(features_t, b, args)
        return features_t, out

    def observe_keeping(
        self,
        network,
        x_scaled: np.ndarray,
        batch_gram: np.ndarray,
        solve: bool,
        ridge=None,
        ridge_predicts=False,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The -F step of ``mode: auto`` in one kernel call (-F on the Cholesky route, b > 0): the features, the
        batch's Gram into ``batch_gram`` (L, n, n; kept until its labels come, when A_r adds it:
        ``candidate_step``), A += that Gram and, if ``solve``, the β that predicts the batch and its prediction
        (without: β is left stale). ``ridge``: the -R candidate that reads this learner's A_r (a
        ``SharedGramLearner``), in the same call: its β solved again if its sums moved, and if ``ridge_predicts``
        its prediction. Returns (features_t, layer outputs (L, b, m) or None, the -R candidate's or None)."""
        b = x_scaled.shape[0]
        self._tick(b)
        features_t = network.empty_features(b)
        st, a = self.state, self.state.arrays
        out = np.empty((self.n_layers, b if solve else 0, self.n_outputs))
        info = np.zeros(self.n_layers, dtype=np.int32)
        inputs = (np.ascontiguousarray(x_scaled, dtype=network.dtype), *network.kernel_weights)
        out_r = None
        with st.changing_gram(solved=solve):  # A factored in scratch, as the -F step does
            if ridge is None:
                kernel = (
                    shared_step_kernels.observe_keep_parallel
                    if self.parallel
                    else shared_step_kernels.observe_keep_serial
                )
                failed = kernel(
                    *inputs, features_t, a.gram, batch_gram, self.scratch(), a.rhs, a.beta, out, info, solve
                )
            else:
                solve_r = bool(ridge_predicts and ridge.needs_solve())
                out_r = np.empty((self.n_layers, b if ridge_predicts else 0, self.n_outputs))
                sums = (a.gram, a.gram_labelled, batch_gram, a.rhs)
                kernel = (
                    shared_step_kernels.observe_pair_parallel
                    if self.parallel
                    else shared_step_kernels.observe_pair_serial
                )
                failed = kernel(
                    *inputs,
                    features_t,
                    sums,
                    (a.beta, out, solve),
                    ridge.solve_target(out_r, solve_r),
                    self.scratch(),
                    info,
                )
                if solve_r and not failed:
                    ridge.mark_solved()
            if failed:
                gram_cholesky.raise_for(info)
        st.rows_observed += b
        st.version += 1
        return features_t, (out if solve else None), (out_r if ridge_predicts else None)

    def _forward_kernel(self, features_t: np.ndarray, b: int, inputs: tuple | None) -> np.ndarray:
        """The fused -F forward step (``inputs``: also compute the features first); layer outputs."""
        st = self.state
        a = st.arrays
        out = np.empty((self.n_layers, b, self.n_outputs))
        info = np.zeros(self.n_layers, dtype=np.int32)
        arrays = (a.gram, self.scratch(), a.rhs, a.beta, out, info)
        with st.changing_gram(solved=True):  # factored in scratch: A's own factor is made when read
            if inputs is None:
                kernel = step_kernels.forward_parallel if self.parallel else step_kernels.forward_serial
                failed = kernel(features_t, *arrays)
            elif self.parallel:
                failed = step_kernels.observe_parallel(*inputs, *arrays)
            else:
                failed = step_kernels.observe_serial(*inputs, *arrays)
            if failed:
                gram_cholesky.raise_for(info)
        st.rows_observed += b
        st.version += 1
        return out

    def observe_sums(self, features_t: np.ndarray, batch_gram: np.ndarray | None = None) -> None:
        """``observe`` without solving: the clock moves on and, under -F, the batch's Gram enters A
        (``batch_gram``: its D_lᵀD_l, lower triangles, already formed once for every half-life of ``auto``);
        factors and β are left stale, solved when next read. ``auto``'s learners that do not predict this
        batch, or that predict it after a shared Gram (``candidate_step``)."""
        b = features_t.shape[2]
        if b == 0:
            return
        if self.mode == "forward" and not self._uses_cholesky(b):  # keep a Woodbury P current: O(b·n²)
            self.observe(features_t)
            return
        self._tick(b)
        if self.mode == "ridge":
            return
        st, a = self.state, self.state.arrays
        with st.changing_gram():  # factors and β made when next read
            if batch_gram is not None:
                shared_step_kernels.add_lower(batch_gram, a.gram)
            elif self._fusable(features_t):
                (step_kernels.add_grams_parallel if self.parallel else step_kernels.add_grams)(
                    features_t, a.gram
                )
            else:
                for layer, ls in enumerate(st.layers):
                    gram_cholesky.gram_update(ls.gram, features_t[layer])
        st.rows_observed += b
        st.version += 1

    def _forward(self, features_t: np.ndarray, *, predict: bool) -> np.ndarray | None:
        b = features_t.shape[2]
        if b == 0:
            return None
        self._tick(b)
        if self.mode == "ridge":
            return None
        if self._uses_cholesky(b) and self._fusable(features_t):
            out = self._forward_kernel(features_t, b, None)
            return out if predict else None
        st = self.state
        with st.changing_gram(factor="kept"):
            for layer, ls in enumerate(st.layers):
                self._enter_gram(ls, features_t[layer])
        st.rows_observed += b
        st.version += 1
        return None

    # ----------------------------------------------------------------- labels
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
            return weighted_rows.learn_weighted(
                self, features_t, targets, gram_in, predicted, observed_at, labelled_gram, sample_weight
            )
        return self.learn_rows(features_t, targets, gram_in, predicted, labelled_gram)

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

    def learn_rows(
        self, features_t, targets, gram_in, predicted, labelled_gram=None, scale=1.0
    ) -> np.ndarray:
        """``learn`` of rows at weight 1 (or scaled by the caller); ``scale`` multiplies the losses and ‖Y‖² added
        (``weighted_rows``)."""
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
            shared_step_kernels.add_lower(
                labelled_gram, a.gram_labelled
            )  # its lower triangles (the upper ones are not kept)
        if b and (n_new == 0 or (n_new == b and self._uses_cholesky(b))) and self._fusable(features_t):
            info = np.zeros(self.n_layers, dtype=np.int32)
            kernel = (
                step_kernels.learn_parallel
                if self.folds_in_parallel(b, n_new > 0)
                else step_kernels.learn_serial
            )
            labelled = a.gram_labelled if own_labelled else a.gram_labelled[:0]
            state = (a.rhs, a.gram, a.factors() if n_new else a.factor, labelled)  # n_new: A is refactored
            with st.changing_gram(factor="made" if n_new else "kept"):  # n_new: the kernel factored A
                sum_y2 = kernel(features_t, targets, predicted, *state, n_new == b, info, losses)
                if info.any():
                    gram_cholesky.raise_for(info)
        else:
            sum_y2 = step_kernels.label_losses(predicted, targets, losses)
            if b == 0:
                return losses
            with st.changing_gram(factor="kept"):  # a Gram entering brings each layer's factor up to date
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
            st.d_max = max(st.d_max, step_kernels.abs_max(features_t))
            st.y_max = max(st.y_max, float(np.abs(targets).max()), step_kernels.abs_max(predicted))
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
                gram_cholesky.gram_update(ls.gram_labelled, d_t)
            ls.rhs += gram_cholesky.product(
                d_t.T, targets_f if d_t.dtype == np.float64 else targets_f32, trans_a=True
            )  # c += DᵀY

    # --------------------------------------------------------------- rows out
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
        with self.state.changing_gram(factor="kept"):
            for layer, ls in enumerate(self.state.layers):
                gram_cholesky.gram_update(ls.gram, features_t[layer], sign=-1.0)
                self._refactor(ls)
        self.state.rows_forgotten += features_t.shape[2]
        self.state.version += 1

    def erase(self, features_t: np.ndarray, targets: np.ndarray, labelled, observed_at=None, **given) -> None:
        """Take rows out of the sums entirely, as if they had never come (docs/design.md §13): every term a row
        put in, at the weight it has now (``row_erasure.erase_rows``, whose docstring says what each argument
        is; ``given``: its keyword arguments ``grams``, ``undo``, ``sample_weight``)."""
        row_erasure.erase_rows(self, features_t, targets, labelled, observed_at, **given)

    def rows_gram(self, features_t: np.ndarray) -> np.ndarray:
        """Σ DᵀD (L, n, n) of rows, lower triangles of A's layout, formed by the fused kernel."""
        gram = np.zeros((self.n_layers, self.n_columns, self.n_columns))
        (step_kernels.add_grams_parallel if self.parallel else step_kernels.add_grams)(features_t, gram)
        return gram

    # -------------------------------------------------------------- internals
    def _uses_cholesky(self, b: int) -> bool:
        """Gram + Cholesky for a batch of b rows (else Woodbury), by ``solver`` and b against n;
        always with forgetting (A changes by a multiple of I every batch, not by rank b)."""
        return (
            self.solver == "cholesky"
            or self.half_life is not None
            or (self.solver == "auto" and b * WOODBURY_RATIO > self.n_columns)
        )

    def folds_in_parallel(self, b: int, entering: bool = False) -> bool:
        """Whether a fold of b labelled rows runs on Numba's threads: when the step does (``parallel``) and the fold's
        work per layer is worth waking a thread for (``work.PARALLEL_FOLD_FLOPS``); the bits are the same either way."""
        return self.parallel and (
            work.fold_flops(self.n_columns, self.n_outputs, b, entering) >= self.parallel_fold_flops
        )

    def advance(self, b: int) -> None:
        """b rows seen that ``observe`` does not see (labelled rows never observed): the clock moves on."""
        if b > 0:
            self._tick(b)

    def _tick(self, b: int) -> None:
        """b more rows seen: the clock advances, and with forgetting every data sum decays by 2^(−b/half_life)."""
        self.state.clock += b
        if self.half_life is not None:
            self.state.scale(float(np.exp2(-b / self.half_life)))

    def _fusable(self, features_t: np.ndarray) -> bool:
        """Whether the fused kernels take ``features_t`` as it is (they need no copy of it)."""
        if features_t.ndim != 3 or features_t.shape[:2] != (self.n_layers, self.n_columns):
            raise ValueError(
                f"features_t: expected shape ({self.n_layers}, {self.n_columns}, b), got {features_t.shape}"
            )
        return features_t.dtype in (np.float64, np.float32) and features_t.flags.c_contiguous

    def kernel_features(self, features_t: np.ndarray) -> np.ndarray:
        if self._fusable(features_t):
            return features_t
        dtype = features_t.dtype if features_t.dtype in (np.float64, np.float32) else np.float64
        return np.ascontiguousarray(features_t, dtype=dtype)

    def _enter_gram(self, ls: LayerState, d_t: np.ndarray) -> None:
        """A ← A + DᵀD and bring the cached factor up to date, by the cheaper route for this b."""
        gram_cholesky.gram_update(ls.gram, d_t)
        if self._uses_cholesky(d_t.shape[1]):
            self._refactor(ls)
            return
        if ls.factor_kind != "inverse" or ls.woodbury_steps >= self.refactor_every:
            # (Re)build P from the exact A, which already holds this batch: nothing left to update.
            ls.factor = gram_cholesky.inverse_from_cholesky(gram_cholesky.cholesky(ls.gram))
            ls.factor_kind = "inverse"
            ls.woodbury_steps = 0
            return
        step_kernels.woodbury_update(ls.factor, np.ascontiguousarray(d_t, dtype=np.float64))
        ls.woodbury_steps += 1

    @staticmethod
    def _refactor(ls: LayerState) -> None:
        ls.refactor()

    def refresh(self) -> None:
        """Rebuild every factor and β from the exact sums (after a restore, or to drop Woodbury drift)."""
        for ls in self.state.layers:
            self._refactor(ls)
            ls.solve()


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
