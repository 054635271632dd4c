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
route runs as fused kernels over all layers at once (``fused``), on one core or —
when ``parallel`` is set, by ``runtime.StepTuner`` — spread over Numba's threads.
"""

from __future__ import annotations

import numba
import numpy as np

from iolstream.core import gram_cholesky as linalg
from iolstream.core import shared_step_kernels as fused_shared
from iolstream.core import step_kernels as fused
from iolstream.core import work
from iolstream.core.label_fold import LabelFold, raise_for
from iolstream.core.learner_state import LayerArrays, LayerState, LearnerState, solve_stale

MODES = ("forward", "ridge")
SOLVERS = ("auto", "cholesky", "woodbury")

# auto: Woodbury when b·WOODBURY_RATIO ≤ n. Measured (docs/benchmarks.md, "The update's building blocks"): Woodbury wins only
# below b ≈ n/8 to n/4; n/6 sits in between.
WOODBURY_RATIO = 6


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


def as_lams(lam, n_layers: int) -> list[float]:
    lams = [float(lam)] * n_layers if np.isscalar(lam) else [float(v) for v in lam]
    if len(lams) != n_layers:
        raise ValueError(f"lam: expected a scalar or {n_layers} values (one per layer), got {len(lams)}")
    if not all(np.isfinite(v) and v > 0 for v in lams):
        raise ValueError(f"lam: every value must be finite and > 0, got {lams}")
    return lams


class OnlineLearner(LabelFold):
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
        half_life = check_half_life(half_life)
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
        self.parallel = False  # spread the layers over Numba's threads (set by runtime.StepTuner)
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
        features_t = self._kernel_features(features_t)
        a = self.state.arrays
        out = np.empty((self.n_layers, features_t.shape[2], self.n_outputs))
        if a.beta_stale.all() and a.factor_stale.all():
            self.solve_and_predict(features_t, a.gram, a.rhs, np.zeros(self.n_layers), a.beta, out)
            a.beta_stale[:] = False
            return out
        solve_stale(self.state)
        fused.predict_all(features_t, a.beta, out)
        return out

    def solve_and_predict(self, features_t, gram, rhs, shift, beta, out) -> None:
        """β_l = (A_l + shift_l I)⁻¹ c_l from ``gram`` and ``rhs`` (this learner's sums, or the ones it shares,
        ``shared_gram``) into ``beta``, factored in scratch memory; ``out`` (L, b, m) = D_l β_l."""
        info = np.zeros(self.n_layers, dtype=np.int32)
        kernel = fused.solve_predict_parallel if self.parallel else fused.solve_predict_serial
        if kernel(features_t, gram, shift, self.scratch(), rhs, beta, out, info):
            raise_for(info)

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
        if ridge is None:
            kernel = fused_shared.observe_keep_parallel if self.parallel else fused_shared.observe_keep_serial
            failed = kernel(
                *inputs, features_t, a.gram, batch_gram, self.scratch(), a.rhs, a.beta, out, info, solve
            )
        else:
            solve_r = bool(ridge_predicts and ridge.needs_solve())
            out_r = np.empty((self.n_layers, b if ridge_predicts else 0, self.n_outputs))
            sums = (a.gram, a.gram_labelled, batch_gram, a.rhs)
            kernel = fused_shared.observe_pair_parallel if self.parallel else fused_shared.observe_pair_serial
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
            raise_for(info)
        a.factor_inverse[:] = False
        a.woodbury_steps[:] = 0
        a.factor_stale[:] = True  # factored in scratch, as the -F step does
        a.beta_stale[:] = not solve
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
        if inputs is None:
            kernel = fused.forward_parallel if self.parallel else fused.forward_serial
            failed = kernel(features_t, *arrays)
        elif self.parallel:
            failed = fused.observe_parallel(*inputs, *arrays)
        else:
            failed = fused.observe_serial(*inputs, *arrays)
        if failed:
            raise_for(info)
        a.factor_inverse[:] = False
        a.woodbury_steps[:] = 0
        a.factor_stale[:] = True  # factored in scratch: A's own factor is made when read
        a.beta_stale[:] = False
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
        if batch_gram is not None:
            fused_shared.add_lower(batch_gram, a.gram)
        elif self._fusable(features_t):
            (fused.add_grams_parallel if self.parallel else fused.add_grams)(features_t, a.gram)
        else:
            for layer, ls in enumerate(st.layers):
                linalg.gram_update(ls.gram, features_t[layer])
        a.factor_stale[:] = a.beta_stale[:] = True
        a.factor_inverse[:] = False  # a Woodbury P is rebuilt from A when next needed
        a.woodbury_steps[:] = 0
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
        for layer, ls in enumerate(st.layers):
            self._enter_gram(ls, features_t[layer])
        st.arrays.beta_stale[:] = True
        st.rows_observed += b
        st.version += 1
        return None

    # -------------------------------------------------------------- internals
    def _uses_cholesky(self, b: int) -> bool:
        """Gram + Cholesky for a batch of b rows (else Woodbury), by ``solver`` and b against n;
        always with forgetting (A changes by a multiple of I every batch, not by rank b)."""
        return (
            self.solver == "cholesky"
            or self.half_life is not None
            or (self.solver == "auto" and b * WOODBURY_RATIO > self.n_columns)
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

    def _kernel_features(self, features_t: np.ndarray) -> np.ndarray:
        if self._fusable(features_t):
            return features_t
        dtype = features_t.dtype if features_t.dtype in (np.float64, np.float32) else np.float64
        return np.ascontiguousarray(features_t, dtype=dtype)

    def _enter_gram(self, ls: LayerState, d_t: np.ndarray) -> None:
        """A ← A + DᵀD and bring the cached factor up to date, by the cheaper route for this b."""
        linalg.gram_update(ls.gram, d_t)
        if self._uses_cholesky(d_t.shape[1]):
            self._refactor(ls)
            return
        if ls.factor_kind != "inverse" or ls.woodbury_steps >= self.refactor_every:
            # (Re)build P from the exact A, which already holds this batch: nothing left to update.
            ls.factor = linalg.inverse_from_cholesky(linalg.cholesky(ls.gram))
            ls.factor_kind = "inverse"
            ls.woodbury_steps = 0
            return
        fused.woodbury_update(ls.factor, np.ascontiguousarray(d_t, dtype=np.float64))
        ls.woodbury_steps += 1

    @staticmethod
    def _refactor(ls: LayerState) -> None:
        ls.refactor()

    def refresh(self) -> None:
        """Rebuild every factor and β from the exact sums (after a restore, or to drop Woodbury drift)."""
        for ls in self.state.layers:
            self._refactor(ls)
            ls.solve()
