"""The online output-layer learners of edRVFL: -F and -R on one state (SPEC §2).

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kernels, linalg

MODES = ("forward", "ridge")
SOLVERS = ("auto", "cholesky", "woodbury")

# auto: Woodbury when b·WOODBURY_RATIO ≤ n. Measured here (MEASUREMENTS.md): Woodbury wins only
# below b ≈ n/8 to n/4; n/6 sits in between.
WOODBURY_RATIO = 6


@dataclass
class LayerState:
    """Sufficient statistics of one sub-learner.

    gram          : (n, n) float64, F-ordered, lower triangle authoritative — A_l
    rhs           : (n, m) float64 — c_l
    beta          : (n, m) float64 — β_l = A_l⁻¹ c_l
    factor        : (n, n) float64 — lower Cholesky factor of A_l, or P_l = A_l⁻¹ (see ``factor_kind``)
    gram_labelled : (n, n) float64 or None — λI + Σ DᵀD over labelled rows (A_r of SPEC §3), -F only
    loss_sum      : Σ_t L_{l,t}(β_{l,t}), immediate losses with the β that made each prediction
    """

    lam: float
    gram: np.ndarray
    rhs: np.ndarray
    beta: np.ndarray
    factor: np.ndarray
    factor_kind: str
    gram_labelled: np.ndarray | None
    loss_sum: float = 0.0
    woodbury_steps: int = 0


@dataclass
class LearnerState:
    """The whole learned state: per-layer statistics plus counters (all plain numbers and arrays)."""

    layers: list[LayerState]
    rows_observed: int = 0  # rows whose Gram entered A (-F: at observe; -R: at learn)
    rows_labelled: int = 0  # rows whose labels entered c
    rows_forgotten: int = 0  # rows whose Gram was removed again (downdate)
    label_batches: int = 0  # T of the regret bounds
    max_label_batch: int = 0  # b of the regret bounds (the largest labelled batch)
    sum_y2: float = 0.0  # Σ‖Y‖²
    d_max: float = 0.0  # D_m = max |D| over labelled rows
    y_max: float = 0.0  # Y_m = max(|Y|, |D β|)
    version: int = 0  # bumped at every change of β
    extra: dict = field(default_factory=dict)


def _as_lams(lam, n_layers: int) -> list[float]:
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
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if refactor_every < 1:
            raise ValueError(f"refactor_every must be ≥ 1, got {refactor_every}")
        self.n_columns = n_columns
        self.n_outputs = n_outputs
        self.n_layers = n_layers
        self.lam = lam
        self.mode = mode
        self.solver = solver
        self.refactor_every = refactor_every
        self.track_regret = track_regret
        self.state = self.initial_state()

    # ------------------------------------------------------------------ state
    def initial_state(self) -> LearnerState:
        """η_0 = (λI)⁻¹, β = 0 for every layer."""
        n, m = self.n_columns, self.n_outputs
        layers = []
        for lam in _as_lams(self.lam, self.n_layers):
            gram = np.asfortranarray(np.eye(n) * lam)
            factor = np.asfortranarray(np.eye(n) * np.sqrt(lam))  # Cholesky factor of λI
            labelled = gram.copy(order="F") if (self.track_regret and self.mode == "forward") else None
            layers.append(LayerState(lam, gram, np.zeros((n, m), order="F"), np.zeros((n, m)), factor, "cholesky", labelled))
        return LearnerState(layers)

    # ------------------------------------------------------------ prediction
    def layer_outputs(self, features_t: np.ndarray) -> np.ndarray:
        """D_l β_l for every layer: (L, b, m). Pure: changes nothing."""
        n_layers, _, b = features_t.shape
        out = np.empty((n_layers, b, self.n_outputs))
        for layer, ls in enumerate(self.state.layers):
            beta = ls.beta if features_t.dtype == np.float64 else ls.beta.astype(features_t.dtype)
            out[layer] = linalg.gemm(features_t[layer].T, beta)
        return out

    # ----------------------------------------------------------------- update
    def observe(self, features_t: np.ndarray) -> None:
        """A new unlabelled batch. -F: its Gram enters A now (η_{t+1}, Algorithm 2). -R: nothing."""
        if self.mode == "ridge" or features_t.shape[2] == 0:
            return
        for layer, ls in enumerate(self.state.layers):
            self._enter_gram(ls, features_t[layer])
            ls.beta = self._solve(ls)
        self.state.rows_observed += features_t.shape[2]
        self.state.version += 1

    def learn(
        self,
        features_t: np.ndarray,
        targets: np.ndarray,
        *,
        gram_in: np.ndarray | None = None,
        predicted: np.ndarray | None = None,
    ) -> np.ndarray:
        """Fold labelled rows in: c_l += D_lᵀY (and their Gram, where it has not entered yet).

        features_t : (L, n, b) — D_lᵀ of the labelled rows
        targets    : (b, m) float — Y (one-hot for classification)
        gram_in    : (b,) bool — rows whose Gram is already in A. Default: all (-F), none (-R).
        predicted  : (L, b, m) — the layer outputs that were emitted for these rows (the β that
                     made the prediction); default: computed now, before this update.
        Returns the immediate loss per layer, (L,), ½‖D_l β_l − Y‖² with that β.
        """
        b = features_t.shape[2]
        targets = np.asarray(targets, dtype=np.float64).reshape(b, self.n_outputs)
        if gram_in is None:
            gram_in = np.full(b, self.mode == "forward")
        gram_in = np.asarray(gram_in, dtype=bool)
        if self.mode == "ridge":
            gram_in = np.zeros(b, dtype=bool)
        if predicted is None:
            predicted = self.layer_outputs(features_t)
        losses = 0.5 * ((predicted - targets[None]) ** 2).sum(axis=(1, 2))
        st = self.state
        if b == 0:
            return losses
        new = np.flatnonzero(~gram_in)
        targets_f = np.asfortranarray(targets)
        targets_f32 = targets_f.astype(np.float32) if features_t.dtype == np.float32 else None
        for layer, ls in enumerate(st.layers):
            d_t = features_t[layer]
            if new.size:
                self._enter_gram(ls, d_t if new.size == b else np.ascontiguousarray(d_t[:, new]))
            if ls.gram_labelled is not None:
                linalg.gram_update(ls.gram_labelled, d_t)
            ls.rhs += linalg.gemm(d_t.T, targets_f if d_t.dtype == np.float64 else targets_f32, trans_a=True)  # c += DᵀY
            ls.loss_sum += float(losses[layer])
            ls.beta = self._solve(ls)
        st.rows_observed += int(new.size)
        st.rows_labelled += b
        st.label_batches += 1
        st.max_label_batch = max(st.max_label_batch, b)
        st.sum_y2 += float((targets**2).sum())
        if self.track_regret:  # D_m and Y_m of the bounds: one more pass over D, skipped when not tracked
            st.d_max = max(st.d_max, float(np.abs(features_t).max()))
            st.y_max = max(st.y_max, float(np.abs(targets).max()), float(np.abs(predicted).max()))
        st.version += 1
        return losses

    def forget(self, features_t: np.ndarray) -> None:
        """Downdate: remove rows' Gram from A (-F rows whose label will never come; SPEC §2 option).

        The factor is rebuilt from the exact A by Cholesky (a Woodbury downdate is not stable).
        """
        if self.mode == "ridge" or features_t.shape[2] == 0:
            return
        for layer, ls in enumerate(self.state.layers):
            linalg.gram_update(ls.gram, features_t[layer], sign=-1.0)
            self._refactor(ls)
            ls.beta = self._solve(ls)
        self.state.rows_forgotten += features_t.shape[2]
        self.state.version += 1

    # -------------------------------------------------------------- internals
    def _enter_gram(self, ls: LayerState, d_t: np.ndarray) -> None:
        """A ← A + DᵀD and bring the cached factor up to date, by the cheaper route for this b."""
        linalg.gram_update(ls.gram, d_t)
        b = d_t.shape[1]
        use_woodbury = self.solver == "woodbury" or (self.solver == "auto" and b * WOODBURY_RATIO <= self.n_columns)
        if not use_woodbury:
            self._refactor(ls)
            return
        if ls.factor_kind != "inverse" or ls.woodbury_steps >= self.refactor_every:
            # (Re)build P from the exact A, which already holds this batch: nothing left to update.
            linalg_factor = linalg.cholesky(ls.gram)
            ls.factor = linalg.inverse_from_cholesky(linalg_factor)
            ls.factor_kind = "inverse"
            ls.woodbury_steps = 0
            return
        kernels.woodbury_update(ls.factor, np.ascontiguousarray(d_t, dtype=np.float64))
        ls.woodbury_steps += 1

    @staticmethod
    def _refactor(ls: LayerState) -> None:
        ls.factor = linalg.cholesky(ls.gram)
        ls.factor_kind = "cholesky"
        ls.woodbury_steps = 0

    @staticmethod
    def _solve(ls: LayerState) -> np.ndarray:
        """β = A⁻¹ c with the cached factor (Theorem 1: β equals the offline expert)."""
        if ls.factor_kind == "inverse":
            return linalg.gemm(ls.factor, ls.rhs)
        return linalg.cho_solve(ls.factor, ls.rhs)

    def refresh(self) -> None:
        """Rebuild every factor and β from the exact sums (after a restore, or to drop Woodbury drift)."""
        for ls in self.state.layers:
            self._refactor(ls)
            ls.beta = self._solve(ls)
