"""Candidates of one half-life sharing its sums (``lam: auto``, ``mode: auto``): one learner makes the updates
(Gram, labels, decay); the others hold its sums with their own λ on the diagonal, A_j = A_p + (λ_j − λ_p)I and
c_j = c_p, and solve for their own β (a Cholesky per λ, no second Gram). An -R candidate of an -F learner holds
its labelled sums instead, A_j = A_r + (λ_j − λ_p)I: -R's A is exactly the Gram of the labelled rows
(Algorithm 1), which -F keeps beside its own A (docs/design.md §3).
"""

from __future__ import annotations

import numpy as np

from iolstream.core import fused
from iolstream.core.learner import OnlineLearner


class SharedGramLearner(OnlineLearner):
    """A λ candidate that shares another learner's sums (``lam: auto``): same random features, same
    rows, same half-life, so its A = A_primary + (λ − λ_primary)I and its c = c_primary. The primary
    makes every update (Gram, labels, decay, downdates); this one copies the sums when they changed
    (``sync``: an n×n copy per layer) and pays one Cholesky + solve per layer when its β is next read,
    instead of its own Gram update, label update and decay. Its own are: λ, β and factor, the loss
    sum of its own predictions (weighted like the primary's with forgetting), and its version.

    The model updates the primary first; every public update here then brings this one level with it.
    ``state`` is a full LearnerState (saved and restored as any learner's).
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
        self._synced = (
            primary.state.version
        )  # the primary's version these sums are a copy of (λI, c = 0: level)

    def sync(self) -> None:
        """Copy the primary's sums (A and A_r with this λ on the diagonal, c, counters) if they changed."""
        p, st = self.primary.state, self.state
        for key in (
            "rows_observed",
            "rows_labelled",
            "rows_forgotten",
            "label_batches",
            "max_label_batch",
            "sum_y2",
            "d_max",
            "y_max",
            "clock",
        ):
            setattr(st, key, getattr(p, key))  # the clock moves without a new version when nothing decays
        if self._synced == p.version:
            return
        a, pa = st.arrays, p.arrays
        shift = np.array([ls.lam - pls.lam for ls, pls in zip(st.layers, p.layers)])
        diag = np.arange(self.n_columns)
        np.copyto(a.gram, pa.gram_labelled if self._labelled_only else pa.gram)
        a.gram[:, diag, diag] += shift[:, None]
        if len(a.gram_labelled):
            np.copyto(a.gram_labelled, pa.gram_labelled)
            a.gram_labelled[:, diag, diag] += shift[:, None]
        np.copyto(a.rhs, pa.rhs)
        a.factor_stale[:] = a.beta_stale[:] = True
        a.factor_inverse[:] = False
        a.woodbury_steps[:] = 0
        st.version += 1
        self._synced = p.version

    def mark_synced(self) -> None:
        """These sums are the primary's as they are now (after a restore of both)."""
        self._synced = self.primary.state.version

    def layer_outputs(self, features_t: np.ndarray) -> np.ndarray:
        self.sync()
        return super().layer_outputs(features_t)

    def observe(self, features_t: np.ndarray) -> None:
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
        """The primary has seen these b rows: its sums decayed; this loss sum decays the same."""
        if self.half_life is not None and b:
            self.state.arrays.loss_sum *= float(np.exp2(-b / self.half_life))
        self.sync()

    def learn(self, features_t, targets, *, gram_in=None, predicted=None, observed_at=None) -> np.ndarray:
        """The primary has folded these labels in; this one scores its own prediction of them and syncs."""
        b = features_t.shape[2]
        targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, self.n_outputs)
        if predicted is None:
            predicted = self.layer_outputs(features_t)
        predicted = np.ascontiguousarray(predicted, dtype=np.float64)
        plain = np.empty(self.n_layers)
        fused.label_losses(predicted, targets, plain)
        if self.half_life is None or observed_at is None:
            self.state.arrays.loss_sum += plain
        else:  # Σ w ½‖Dβ − Y‖², as the primary accumulates it
            w = self.row_weights(observed_at, b)
            self.state.arrays.loss_sum += 0.5 * (
                w[None, :] * ((predicted - targets[None]) ** 2).sum(axis=2)
            ).sum(axis=1)
        self.sync()
        return plain

    def forget(self, features_t: np.ndarray, observed_at=None) -> None:
        self.sync()
