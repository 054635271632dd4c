"""Candidates of one half-life sharing its sums (``lam: auto``, ``mode: auto``): one learner makes the updates
(Gram, labels, decay); the others read its sums with their own λ on the diagonal, A_j = A_p + (λ_j − λ_p)I and
c_j = c_p, and solve for their own β (a Cholesky per λ, no second Gram, no copy). An -R candidate of an -F learner holds
its labelled sums instead, A_j = A_r + (λ_j − λ_p)I: -R's A is exactly the Gram of the labelled rows
(Algorithm 1), which -F keeps beside its own A (docs/design.md §3).
"""

from __future__ import annotations

import numpy as np

from iolstream.core import step_kernels, work
from iolstream.core.learner import OnlineLearner, unpredicted_as_targets
from iolstream.core.learner_state import COUNTERS


class SharedGramLearner(OnlineLearner):
    """A λ (or -R) candidate that shares another learner's sums: same random features, same rows, same
    half-life, so its A = A_primary + (λ − λ_primary)I (A_r for an -R candidate of an -F primary) and its
    c = c_primary. The primary makes every update (Gram, labels, decay, downdates); this one factors the
    primary's sums with its shift on the diagonal when its β is next read (``layer_outputs``: a Cholesky +
    solve per layer, no second Gram, no copy). Its own are: λ, β, the loss sum of its own predictions
    (weighted like the primary's with forgetting) and the counters.

    Its ``state`` holds a copy of the sums, made when read (``sync``: the same bits as the primary's, shifted, in
    arrays allocated at the first read); its own steps use the state as it is (``_state``: β, the loss sums and
    the counters) and read the primary's sums. Its β is solved again only when the sums it reads changed: an -R
    candidate of an -F learner reads A_r and c, which move with labels, not with features
    (``LearnerState.labelled_version``).
    """

    def __init__(self, primary: OnlineLearner, lam, mode: str | None = None):
        self.primary = primary
        mode = primary.mode if mode is None else mode
        if mode != primary.mode and not (mode == "ridge" and len(primary.state.arrays.gram_labelled)):
            raise ValueError(
                f"a {mode} candidate cannot share the sums of a {primary.mode} learner"
                + (" that keeps no labelled Gram" if mode == "ridge" else "")
            )
        self._labelled_only = mode != primary.mode  # -R of -F: A_r, not A
        super().__init__(
            primary.n_columns,
            primary.n_outputs,
            primary.n_layers,
            lam=lam,
            mode=mode,
            solver="cholesky",
            refactor_every=primary.refactor_every,
            track_regret=primary.track_regret,
            half_life=primary.half_life,
        )
        self._shift = np.array(
            [ls.lam - pls.lam for ls, pls in zip(self._state.layers, primary.state.layers)]
        )
        self._synced = None  # the primary's version the copied sums are (None: not copied yet)
        self._solved = None  # the version of the sums this β was solved from (None: not since a restore)

    def initial_state(self):
        """β = 0, the counters and loss sums; no sums of its own (A and A_r are allocated if ``state`` is read)."""
        from iolstream.core.learner import as_lams
        from iolstream.core.learner_state import LayerArrays, LayerState, LearnerState

        lams = as_lams(self.lam, self.n_layers)
        arrays = LayerArrays.initial(lams, self.n_columns, self.n_outputs, False, sums=False)
        return LearnerState([LayerState(arrays, i, lam) for i, lam in enumerate(lams)], arrays=arrays)

    def _sums_version(self) -> int:
        """The version of the sums this candidate solves on: the primary's A_r and c (-R of -F), or all of them."""
        p = self.primary.state
        return p.labelled_version if self._labelled_only else p.version

    @property
    def state(self):
        """The learner's state, its sums level with the primary's (copied now if they changed)."""
        self.sync()
        return self._state

    @state.setter
    def state(self, value) -> None:
        self._state = value

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def clock(self) -> int:
        return self.primary.clock

    def scoring_flops(self, b: int) -> float:
        return work.scoring_flops(self.n_columns, self.n_outputs, self.n_layers, b)  # a Cholesky every time

    def scratch(self) -> np.ndarray:
        return self.primary.scratch()  # the candidates solve one after another: one scratch for all

    @property
    def calibration_sums(self) -> np.ndarray:
        return self._state.calibration  # its own (reading it syncs none of the primary's sums)

    def own_state(self):
        """Its counters (level with the primary's), loss sums and β; no copy of the sums."""
        self._sync_counters()
        return self._state

    def labelled_sums(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """The primary's labelled sums with this λ on A_r's diagonal (a fresh A_r per layer, c a view)."""
        out = []
        for (rhs, labelled), shift in zip(self.primary.labelled_sums(), self._shift):
            if labelled is not None:
                labelled = np.array(labelled, order="F")
                labelled[np.diag_indices(self.n_columns)] += shift
            out.append((rhs, labelled))
        return out

    def _sync_counters(self) -> None:
        p, st = self.primary.state, self._state
        for key in COUNTERS:
            setattr(st, key, getattr(p, key))  # the clock moves without a new version when nothing decays

    def sync(self) -> None:
        """Copy the primary's sums (A and A_r with this λ on the diagonal, c) and counters if they changed."""
        self._sync_counters()
        p, st = self.primary.state, self._state
        if self._synced == p.version:
            return
        a, pa = st.arrays, p.arrays
        if a.gram.shape[1] != self.n_columns:  # the first read: the copy's arrays
            shape = (self.n_layers, self.n_columns, self.n_columns)
            a.gram = np.empty(shape)
            a.rhs = np.empty_like(pa.rhs)
            if self.mode == "forward" and len(pa.gram_labelled):  # an -F candidate's A_r (its regret)
                a.gram_labelled = np.empty(shape)
        diag = np.arange(self.n_columns)
        # a β solved from the primary's sums is theirs; the version stays: reading the state changes nothing it predicts
        with st.changing_gram(solved=self._solved == self._sums_version()):
            np.copyto(a.gram, pa.gram_labelled if self._labelled_only else pa.gram)
            a.gram[:, diag, diag] += self._shift[:, None]
            if len(a.gram_labelled):
                np.copyto(a.gram_labelled, pa.gram_labelled)
                a.gram_labelled[:, diag, diag] += self._shift[:, None]
            np.copyto(a.rhs, pa.rhs)
        self._synced = p.version

    def mark_synced(self) -> None:
        """These sums are the primary's as they are now (after a restore of both): a copy restored with them, if
        any; β is solved again when next read."""
        self._synced = self.primary.state.version if self._state.arrays.gram.shape[1] else None
        self._solved = None
        self._state.arrays.beta_stale[:] = True

    @property
    def reads_labelled(self) -> bool:
        """Whether it solves on its primary's A_r (an -R candidate of an -F learner), not on its A."""
        return self._labelled_only

    def needs_solve(self) -> bool:
        """Whether its β must be solved again before it predicts: the sums it reads changed since it was."""
        return self._solved != self._sums_version() or bool(self._state.arrays.beta_stale.any())

    def mark_solved(self) -> None:
        """Its β was just solved from the primary's sums as they are (``shared_step_kernels.pair_layer``)."""
        self._state.arrays.beta_stale[:] = False
        self._solved = self._sums_version()

    def solve_target(self, out: np.ndarray, solve: bool) -> tuple:
        """What a fused kernel needs to solve (if ``solve``) and predict into ``out`` for it: (β stack, outputs,
        λ − λ_primary per layer, solve) — ``shared_step_kernels``'s ``ridge`` argument."""
        return self._state.arrays.beta, out, self._shift, solve

    def __getstate__(self) -> dict:
        """Pickle with β solved from the primary's sums, as ``LearnerState`` pickles its own: a read-only copy
        (a memory map) then predicts without writing."""
        if self._solved != self.primary.state.version or self._state.arrays.beta_stale.any():
            self.layer_outputs(np.zeros((self.n_layers, self.n_columns, 0)))
        return self.__dict__.copy()

    def layer_outputs(self, features_t: np.ndarray) -> np.ndarray:
        """D_l β_l (L, b, m), β solved from the primary's sums when they changed since it last was."""
        features_t = self.kernel_features(features_t)
        out = np.empty((self.n_layers, features_t.shape[2], self.n_outputs))
        p, a = self.primary.state, self._state.arrays
        if not self.needs_solve():
            step_kernels.predict_all(features_t, a.beta, out)
            return out
        gram = p.arrays.gram_labelled if self._labelled_only else p.arrays.gram
        self.solve_and_predict(features_t, gram, p.arrays.rhs, self._shift, a.beta, out)
        self.mark_solved()
        return out

    def observe(self, features_t: np.ndarray) -> None:
        self._own_tick(features_t.shape[2])

    def observe_sums(self, features_t: np.ndarray, batch_gram=None) -> None:
        self._own_tick(features_t.shape[2])

    def observe_and_predict(self, features_t: np.ndarray) -> np.ndarray:
        self._own_tick(features_t.shape[2])
        return self.layer_outputs(features_t)

    def observe_rows(self, network, x_scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        features_t = network.features(x_scaled, parallel=self.parallel)
        return features_t, self.observe_and_predict(features_t)

    def advance(self, b: int) -> None:
        if b > 0:
            self._own_tick(b)

    def _own_tick(self, b: int) -> None:
        """The primary has seen these b rows: its sums decayed; this loss sum decays the same. (Its counters are
        the primary's: copied when read, ``own_state``.)"""
        if self.half_life is not None and b:
            decay = float(np.exp2(-b / self.half_life))
            self._state.arrays.loss_sum *= decay
            self._state.calibration *= decay

    def learn(
        self,
        features_t,
        targets,
        *,
        gram_in=None,
        predicted=None,
        observed_at=None,
        sample_weight=None,
        complete=False,
    ) -> np.ndarray:
        """The primary has folded these labels in; this one scores its own prediction of them (rows it did not
        predict, NaN, add no loss; ``complete``: it predicted every row, nothing to look for), each at its weight
        in the sums (forgetting's decay times ``sample_weight``)."""
        b = features_t.shape[2]
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, self.n_outputs)
        if predicted is None:
            predicted = self.layer_outputs(features_t)
        elif not complete:
            predicted = unpredicted_as_targets(predicted, targets)
        plain = np.empty(self.n_layers)
        step_kernels.label_losses(predicted, targets, plain)
        if sample_weight is None and (self.half_life is None or observed_at is None):
            self._state.arrays.loss_sum += plain
        else:  # Σ w ½‖Dβ − Y‖², as the primary accumulates it
            w = self.row_weights(observed_at, b)
            if sample_weight is not None:
                w = w * np.asarray(sample_weight, dtype=np.float64)
            self._state.arrays.loss_sum += 0.5 * (
                w[None, :] * ((predicted - targets[None]) ** 2).sum(axis=2)
            ).sum(axis=1)
        return plain

    def scored(self, losses: np.ndarray) -> None:
        """Its immediate losses (L,) on labelled rows it predicted, computed by the pair's kernel (weight 1)."""
        self._state.arrays.loss_sum += losses

    def forget(self, features_t: np.ndarray, observed_at=None) -> None:
        """The primary has taken these rows' Gram out: nothing of its own changes."""

    def erase(self, features_t: np.ndarray, targets: np.ndarray, labelled, observed_at=None) -> None:
        self._sync_counters()  # the primary has taken the rows out of the sums this one reads

    def refresh(self) -> None:
        self.sync()
        super().refresh()
