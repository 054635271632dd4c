"""A model's learners as one learner: ``EdRVFL`` asks the same of the one learner of fixed settings as of the
candidates of ``lam``, ``forgetting`` or ``mode: auto`` (docs/design.md §10) — observe a batch and predict it,
learn its labels, predict without learning, forget or erase rows, the version and the clock. ``make_candidate_set``
makes the one the config calls for: a ``CandidateSet`` of several candidates (the selector puts one in force, the
scoring budget says which batches the others predict, ``candidate_step`` runs a batch through them all), or a
``OneCandidate`` (a set of one: every call is its learner's own, nothing to choose or to score).
"""

from __future__ import annotations

import numpy as np

from iolstream.core import gram_cholesky
from iolstream.core.candidate_step import (
    BatchGrams,
    learn_candidates,
    make_learners,
    observe_candidates,
    record_calibration,
)
from iolstream.core.candidates import CandidateSelector, ScoringBudget
from iolstream.core.row_erasure import grams_by_stamp
from iolstream.core.shared_gram import SharedGramLearner


def make_candidate_set(config, n_columns: int, pairs: list[tuple], modes: list[str]) -> CandidateSet:
    """The learners of a model of ``config`` whose random features have ``n_columns`` columns: one per candidate
    (``pairs``: its (lam, half_life), ``modes``: its mode), the default (``config.default_candidate`` and
    ``config.default_mode``) in force at first. Several: a ``CandidateSet``; one: a ``OneCandidate``."""
    return (CandidateSet if len(pairs) > 1 else OneCandidate)(config, n_columns, pairs, modes)


class CandidateSet:
    """The candidates of ``auto`` as one learner: every candidate sees every row, the one in force predicts every
    batch, and what the model emits is its prediction.

    pairs, modes   : each candidate's (lam, half_life) and its mode, -F "forward" or -R "ridge"
    learners       : one ``OnlineLearner`` per candidate (``candidate_step.make_learners``: the first of each
                     half-life makes the updates, the others share its sums)
    selector       : ``candidates.CandidateSelector`` — which candidate is in force
    scoring        : ``candidates.ScoringBudget`` — which batches the candidates not in force predict
    batch_grams    : ``candidate_step.BatchGrams`` — the last batches' Gram, for A_r when their labels come
    emitted_loss   : (L,) Σ_t L_{l,t} of what was emitted, by the candidate in force at each batch (regret)
    predicted_rows : (K,) labelled rows each candidate predicted
    """

    def __init__(self, config, n_columns: int, pairs: list[tuple], modes: list[str]):
        self.pairs, self.modes = list(pairs), list(modes)
        self.learners = make_learners(config, n_columns, self.pairs, self.modes)
        start = list(zip(self.pairs, self.modes)).index((config.default_candidate, config.default_mode))
        self.selector = CandidateSelector(len(self.learners), start)
        dims = (config.n_inputs, config.m, config.n_nodes, config.n_layers, config.bias_column)
        self.scoring = ScoringBudget(dims, config.scoring)
        self.batch_grams = BatchGrams()
        self.emitted_loss = np.zeros(config.n_layers)
        self.predicted_rows = np.zeros(len(self.learners), dtype=np.int64)
        self.calibrated = config.calibrated  # each candidate's calibration sums learn from its predictions
        self._scoring_costs: dict[tuple[int, int], float] = {}

    @property
    def learner(self):
        """The learner in force."""
        return self.learners[self.selector.chosen]

    @property
    def version(self) -> int:
        """Bumped at every change of the β in force: the sum of every candidate's version and the selector's
        switches (it never goes back when another candidate takes over)."""
        return sum(ln.version for ln in self.learners) + self.selector.switches

    @property
    def clock(self) -> int:
        """Rows seen so far (every candidate's clock is the same)."""
        return self.learner.clock

    def primaries(self) -> list:
        """The learners that make their own updates (the others read a primary's sums)."""
        return [ln for ln in self.learners if not isinstance(ln, SharedGramLearner)]

    # ------------------------------------------------------------------ a batch
    def observe_rows(self, network, x_scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A new batch of scaled rows (b, k) seen by every candidate, predicted by the one in force and, on the
        batches the budget pays for, by the others: (features_t (L, n, b), the layer outputs of the one in force
        (L, b, m), every candidate's (K, L, b, m), NaN for those that did not predict it)."""
        b, chosen = len(x_scaled), self.selector.chosen
        cost = self._scoring_costs.get((b, chosen))
        if cost is None:  # what the others cost to score, per batch size and candidate in force
            cost = sum(ln.scoring_flops(b) for j, ln in enumerate(self.learners) if j != chosen)
            if len(self._scoring_costs) > 4096:  # batches of many sizes: start again
                self._scoring_costs.clear()
            self._scoring_costs[(b, chosen)] = cost
        predicting = np.full(len(self.learners), self.scoring.take(b, cost))
        predicting[chosen] = True
        features_t, outputs = observe_candidates(
            self.learners, network, x_scaled, self.learner.parallel, predicting, self.batch_grams
        )
        return features_t, outputs[chosen], outputs

    def check_predicted(self, predicted) -> None:
        """ValueError unless ``predicted`` is what ``learn`` takes: every candidate's outputs (K, L, b, m). The
        layer outputs of one are refused: recomputing the others' would bypass the scoring budget."""
        if np.ndim(predicted) != 4:
            raise ValueError(
                f"predicted: this model keeps {len(self.learners)} candidates (mode, lam or forgetting auto): "
                f"pass Prediction.predicted, every candidate's outputs (K, L, b, m), not outputs of shape "
                f"{np.shape(predicted)} (Prediction.layer_outputs): recomputing the other candidates' outputs "
                "would bypass the scoring budget (model.scoring_share); or call learn(prediction, y)"
            )

    def learn(
        self,
        features_t,
        targets,
        *,
        gram_in=None,
        predicted=None,
        observed_at=None,
        sample_weight=None,
        judge,
    ) -> np.ndarray:
        """Labels (scaled targets (b, m)) into every candidate, each judged on what it predicted
        (``candidate_step.learn_candidates``); returns the loss per layer (L,) of what was emitted. ``predicted``
        (K, L, b, m) as ``observe_rows`` gave it; ``judge(predicted, targets)``: each candidate's loss per row (K, b)
        in the metric the selector compares (``EdRVFL.selection_losses``)."""
        return learn_candidates(
            self, features_t, targets, gram_in, predicted, observed_at, sample_weight, judge
        )

    def layer_outputs(self, features_t: np.ndarray) -> np.ndarray:
        """D_l β_l (L, b, m) of the candidate in force. Pure."""
        return self.learner.layer_outputs(features_t)

    def advance(self, rows: int) -> None:
        """``rows`` rows seen that ``observe_rows`` does not see: every candidate's clock moves on."""
        for ln in self.learners:
            ln.advance(rows)

    # ------------------------------------------------------------- rows out
    def forget(self, features_t: np.ndarray, observed_at=None) -> None:
        """Rows' Gram out of A again, of every candidate (``OnlineLearner.forget``)."""
        for ln in self.learners:
            ln.forget(features_t, observed_at)

    def erase(self, features_t, targets, labelled, observed_at=None, *, sample_weight=None) -> None:
        """Rows out of every candidate's sums as if they had never come (``OnlineLearner.erase``: ``targets`` as
        the layers learned them, ``observed_at`` the rows' stamps (b,) or None). All or nothing: should one
        primary's sums fail to stay positive definite, the ones already done are put back and
        ``gram_cholesky.NotPositiveDefinite`` is raised."""
        primaries = self.primaries()
        undo: list = []  # a learner puts its own sums back if it fails; the ones before it, from these
        grams = None  # rows of a few stamps: their Gram by stamp, formed once for every half-life (each at its weight)
        if (
            len(primaries) > 1
            and sample_weight is None
            and features_t.shape[2]
            and features_t.flags.c_contiguous
        ):
            grams = grams_by_stamp(primaries[0], features_t, observed_at)
        try:
            for ln in primaries:
                ln.erase(
                    features_t,
                    targets,
                    labelled,
                    observed_at,
                    grams=grams,
                    undo=undo,
                    sample_weight=sample_weight,
                )
        except gram_cholesky.NotPositiveDefinite:
            for put_back in undo:  # the ones already done put back too: all or nothing
                put_back()
            raise
        for ln in self.learners:
            if isinstance(ln, SharedGramLearner):
                ln.erase(features_t, targets, labelled, observed_at)
        self.batch_grams.clear()  # a kept batch Gram may hold these rows

    def sync(self) -> None:
        """Every candidate's ``state`` holds its sums (a λ or -R candidate reads its primary's when solving: a
        snapshot or a regret report reads the copy)."""
        for ln in self.learners:
            if isinstance(ln, SharedGramLearner):
                ln.sync()

    def describe(self) -> dict:
        """Every candidate's settings and recent loss per row (``CandidateSelector.recent``), and the share of the
        rows every candidate predicted (``ScoringBudget``)."""
        return {
            "candidates": [
                {"lam": lam, "forgetting": h, "mode": mode, "recent_loss": float(v)}
                for (lam, h), mode, v in zip(self.pairs, self.modes, self.selector.recent())
            ],
            "scored_share": self.scoring.scored_share,
        }


class OneCandidate(CandidateSet):
    """The one learner of fixed ``mode``, ``lam`` and ``forgetting`` as a set of one: every batch is its learner's
    fused step, every label its learner's ``learn``; nothing to choose or to score (the selector stays on it, the
    budget and ``emitted_loss`` are not used: its ``loss_sum`` is what was emitted)."""

    def observe_rows(self, network, x_scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        """(features_t (L, n, b), its layer outputs (L, b, m), None): ``OnlineLearner.observe_rows``."""
        features_t, outputs = self.learner.observe_rows(network, x_scaled)
        return features_t, outputs, None

    def check_predicted(self, predicted) -> None:
        """Nothing to refuse: its layer outputs (L, b, m), as ``observe_rows`` gave them, or None (predicted now)."""

    def learn(
        self,
        features_t,
        targets,
        *,
        gram_in=None,
        predicted=None,
        observed_at=None,
        sample_weight=None,
        judge,
    ) -> np.ndarray:
        """``OnlineLearner.learn``, and the calibration sums learn from what was predicted (``judge`` is not used:
        there is no choice to make)."""
        ln = self.learner
        if self.calibrated and predicted is None:  # what the learner predicts for these rows before them
            predicted = ln.layer_outputs(features_t)
        losses = ln.learn(
            features_t,
            targets,
            gram_in=gram_in,
            predicted=predicted,
            observed_at=observed_at,
            sample_weight=sample_weight,
        )
        if self.calibrated:
            record_calibration(ln, predicted, targets.argmax(axis=1), observed_at, sample_weight)
        return losses

    def describe(self) -> dict:
        """Nothing beyond the settings in force (``EdRVFL.effective``)."""
        return {}
