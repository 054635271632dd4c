"""Regret against the best offline expert, from the state alone (docs/design.md §3).

    CR_T = Σ_t L_t(β_t) − min_β [½λ‖β‖² + Σ_t L_t(β)]
    min_β[...] = ½ (Σ‖Y‖² − tr(cᵀ A_r⁻¹ c)),   A_r = λI + Σ_labelled DᵀD

and the bounds of Theorems 4 (-R) and 5 (-F).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from iolstream.core import gram_cholesky


@dataclass
class RegretReport:
    """The cumulative regret of each layer against the offline expert, with the paper's bound."""

    cumulative_loss: np.ndarray  # (L,) Σ_t L_{l,t}(β_{l,t})
    expert_loss: np.ndarray  # (L,) min_β over everything labelled
    cumulative_regret: np.ndarray  # (L,)
    bound: float  # Theorem 4 (-R) or 5 (-F), with the smallest λ_l (the loosest: the bounds fall as λ grows)
    extra: dict = field(default_factory=dict)

    @property
    def mean_regret(self) -> float:
        return float(self.cumulative_regret.mean())


def model_report(model, candidate: int | None = None) -> RegretReport:
    """The regret of an ``EdRVFL``: of the candidate in force (``candidate`` None) or of candidate ``candidate``
    (its own predictions, in force or not). With ``mode: auto`` and no forgetting in force, the in-force regret
    counts the predictions the model made: each batch's loss by the candidate in force when its labels came
    (``model.emitted_loss``); -F and -R of one λ share the expert (the same labelled sums). A candidate that did
    not predict every labelled row (scored on some batches, ``candidates.ScoringBudget``) has no regret (NaN):
    its loss sum covers the rows it predicted, ``extra`` says how many."""
    from iolstream.core.learner import as_lams

    j = model.selector.chosen if candidate is None else candidate
    ln, config = model.learners[j], model.config
    st = (
        ln.own_state()
    )  # counters and loss sums; a λ or -R candidate reads its primary's sums (labelled_sums)
    losses, experts = [], []
    for ls, (rhs, labelled) in zip(st.layers, ln.labelled_sums()):
        losses.append(ls.loss_sum)  # A_r None: -F that does not track it, unknown
        experts.append(expert_loss(rhs, labelled, st.sum_y2) if labelled is not None else np.nan)
    losses, experts = np.array(losses), np.array(experts)
    lam, half_life = model.candidates[j]
    if candidate is None and config.mode == "auto" and half_life is None:
        losses = model.emitted_loss.copy()
    elif len(model.learners) > 1 and model.predicted_rows[j] < st.rows_labelled:
        # scored on some batches only (candidates.ScoringBudget): its losses are a part, no regret
        note = {"rows_predicted": int(model.predicted_rows[j]), "rows_labelled": int(st.rows_labelled)}
        nan = np.full(len(losses), np.nan)
        return RegretReport(losses, experts, nan, float("nan"), note)
    if half_life is not None:
        # Every sum decays on the clock, losses too: this is the *discounted* regret, exact, against the
        # fixed β minimising ½λ‖β‖² + Σ wᵢ ½‖dᵢβ − yᵢ‖² (the discounted expert). Theorems 4–5 bound the
        # undiscounted regret against a fixed β; they do not apply, so no bound is reported.
        note = {"regret": "discounted", "half_life": half_life}
        return RegretReport(losses, experts, losses - experts, float("nan"), note)
    if not config.track_regret:  # D_m, Y_m (and A_r for -F) were not kept
        return RegretReport(losses, experts, losses - experts, float("nan"))
    bound_fn = bound_forward if ln.mode == "forward" else bound_ridge
    bound = bound_fn(
        st.y_max,
        st.max_label_batch,
        config.n_nodes + config.n_inputs,
        st.label_batches,
        st.d_max,
        min(as_lams(lam, config.n_layers)),
    )
    return RegretReport(losses, experts, losses - experts, bound)


def expert_loss(rhs: np.ndarray, gram_labelled: np.ndarray, sum_y2: float) -> float:
    """min_β ½λ‖β‖² + Σ_t ½‖D_t β − Y_t‖², from c, A_r (lower triangle) and Σ‖Y‖²."""
    factor = gram_cholesky.cholesky(gram_labelled)
    sol = gram_cholesky.cho_solve(factor, rhs)
    return 0.5 * (sum_y2 - float(np.sum(rhs * sol)))


def bound_ridge(
    y_max: float, batch: int, n_minus_bias: int, batches: int, d_max: float, lam: float, s: float = 1.0
) -> float:
    """γ^r ≤ 2 Y_m² b (N+k) ln(1 + T D_m² b / (λ s))   (Theorem 4)."""
    if batches == 0:
        return 0.0
    return 2.0 * y_max**2 * batch * n_minus_bias * math.log1p(batches * d_max**2 * batch / (lam * s))


def bound_forward(
    y_max: float, batch: int, n_minus_bias: int, batches: int, d_max: float, lam: float, s: float = 1.0
) -> float:
    """γ^f ≤ ½ Y_m² b (N+k) [ln(1 + T D_m² b/(λs)) − ln(1 + (T−1) D_m² b/(λs + 2 D_m² b))]   (Theorem 5)."""
    if batches == 0:
        return 0.0
    g = d_max**2 * batch
    return (
        0.5
        * y_max**2
        * batch
        * n_minus_bias
        * (math.log1p(batches * g / (lam * s)) - math.log1p((batches - 1) * g / (lam * s + 2.0 * g)))
    )
