"""Regret against the best offline expert, from the state alone (docs/design.md §3).

    CR_T = Σ_t L_t(β_t) − min_β [½λ‖β‖² + Σ_t L_t(β)]
    min_β[...] = ½ (Σ‖Y‖² − tr(cᵀ A_r⁻¹ c)),   A_r = λI + Σ_labelled DᵀD

and the bounds of Theorems 4 (-R) and 5 (-F).
"""

from __future__ import annotations

import math

import numpy as np

from iolstream.core import linalg


def expert_loss(rhs: np.ndarray, gram_labelled: np.ndarray, sum_y2: float) -> float:
    """min_β ½λ‖β‖² + Σ_t ½‖D_t β − Y_t‖², from c, A_r (lower triangle) and Σ‖Y‖²."""
    factor = linalg.cholesky(gram_labelled)
    sol = linalg.cho_solve(factor, rhs)
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
