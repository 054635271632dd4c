"""``lam: auto`` / ``forgetting: auto`` / ``mode: auto``: the candidate settings and the selector that puts
one in force.

The candidates all use the same random features and learn every row; the one whose recent prequential
loss is lowest predicts (``CandidateSelector``). The candidates of one half-life share its sums
(``core.shared_gram.SharedGramLearner``: one Gram, a Cholesky per λ; with ``mode: auto`` the -R candidates
solve on the labelled sums A_r that the -F learner keeps beside its A). The candidates not in force predict the
batches a budget pays for (``ScoringBudget``); ``candidate_step`` runs a batch through them all (docs/design.md §10).
"""

from __future__ import annotations

import math

import numpy as np

from iolstream.core import work

LAM_CANDIDATES = (0.05, 0.5, 5.0)
# rows; None: no forgetting. 512 replaced 16384: on rbf-drift (centroids always moving) the candidate
# λ = 0.5, h = 512 reached 0.705 prequential against 0.614 with h = 2048, and no drift stream of
# docs/benchmarks.md had 16384 in force at its end. Still 3 sums to keep: the cost is unchanged.
HALF_LIFE_CANDIDATES = (None, 2048.0, 512.0)
# The grid of snapshots saved before the grid was saved with the selection (state_io reads them with it).
FIRST_GRID = ((0.05, 0.5, 5.0), (None, 16384.0, 2048.0))
# rows: the recent loss weighs rows halving every 512 scored rows (every row when every batch is scored). The
# prequential past was scored by β fitted on fewer rows (on a stationary stream, the early rows favour a large λ):
# a short window judges the candidates as they are now, and the z-test (SELECTION_Z) keeps the noise of few rows
# from switching.
SELECTION_HALF_LIFE = 512.0
MODE_CANDIDATES = ("forward", "ridge")  # mode: auto (-F first: it makes the updates the -R candidates read)
MODES = ("forward", "ridge", "auto")  # model.mode
# mode: auto starts with -R (the selector's default, back in force when the other's edge fades). -F's loss is
# worst early, while a batch's own Gram is a large share of A, before the selector has evidence: starting with
# -F, auto kept digits at 0.9152 prequential against -R's 0.9235; starting with -R, 0.9235 (docs/benchmarks.md).
AUTO_START_MODE = "ridge"
SELECTION_Z = (
    2.0  # a candidate replaces the one in force when better by 2 standard deviations (CandidateSelector)
)
# Another candidate stays in force only while it beats the default (the fixed settings) by half a standard
# deviation; below that the default is back. On digits (-F, seed 0) λ = 5 led λ = 0.5 by 2.5σ mid-stream and
# by 0.9σ at the end: kept to the end, it cost 0.008 test accuracy. 1σ was too much: on segment (-R, seed 0)
# λ = 0.05 (0.013 better on the test set) fell to 0.8σ once and never came back.
SELECTION_KEEP_Z = 0.5
# The candidates not in force are scored on as many batches as 10 % of the step's own work pays for (ScoringBudget),
# a Cholesky counted at the rate it runs (work.CHOLESKY_WEIGHT). 0.15, counted in operations alone, scored the
# default -F and -R pair on every batch of the bench configs: the worker paid its Cholesky on every batch (bench
# --suite kafka: 1.3-1.6x the rows/s of mode: forward). Now the pair is scored on a third of the small config's
# batches and half of poker's, and the 18 candidates of mode, lam and forgetting all auto on 3 % and 4 % of them
# (docs/benchmarks.md, "The price of choosing online").
SCORING_SHARE = 0.1
# ... except on a stream's first rows: every batch that starts within the first 4,096 rows observed is scored (eight
# of the selector's 512-row half-lives), where a short stream's choice is made and λ matters most. On the real
# tables of docs/benchmarks.md (1,309 to 10,000 rows, batches of 100), the budget alone scored the λ candidates of
# `lam: auto` on too few rows for the selector's 2σ: it stayed at λ 0.5 to the end (telco-churn log loss 0.4618);
# with these rows scored it chose as scoring every batch does (0.4415). The default pair's "Which mode" table moved
# by at most 0.0002 (rbf-drift's auto accuracy).
SCORE_ALL_ROWS = 4096
PAIR_CHUNK = 4096  # rows of a labelled batch whose paired differences the selector forms at once


def candidate_grid(lam, forgetting, lams=LAM_CANDIDATES, half_lives=HALF_LIFE_CANDIDATES) -> list[tuple]:
    """(lam, half_life) of every learner a model keeps: one, or the grid of its ``auto`` settings
    (half-life major, λ minor: the first λ of each half-life holds the sums the others share)."""
    return [
        (c_lam, h)
        for h in (half_lives if forgetting == "auto" else (forgetting,))
        for c_lam in (lams if lam == "auto" else (lam,))
    ]


def with_modes(grid: list[tuple], mode: str) -> tuple[list[tuple], list[str]]:
    """``grid`` ((lam, half_life) pairs, half-life major) crossed with the modes of ``mode``: (pairs, modes), K each,
    half-life major, then mode (-F before -R), then λ. One mode: ``grid`` itself."""
    if mode != "auto":
        return list(grid), [mode] * len(grid)
    pairs, modes = [], []
    for h in dict.fromkeys(h for _, h in grid):
        for m in MODE_CANDIDATES:
            for lam, h2 in grid:
                if h2 == h:
                    pairs.append((lam, h))
                    modes.append(m)
    return pairs, modes


class CandidateSelector:
    """Which of K candidate learners predicts: the lowest recent prequential loss.

    Each candidate's loss on a labelled batch is the loss of what it would have emitted, the ensemble
    of its layers with the β that predicted the batch *before* its labels entered (test-then-train),
    in the metric the stream is scored by: classification, the rows it got wrong (0/1 loss); regression,
    the squared error summed over rows and outputs. Not the layers' ½‖D_l β_l − Y‖²: on one-hot
    targets that favours the smoothest candidate, not the most accurate one (hyperplane stream: the
    h = 2048 candidates had the larger squared loss and the higher accuracy). The recent loss is
    Σ wᵢ lossᵢ with weights halving every ``half_life`` rows (all candidates see the same rows, so the
    weighted sums compare directly).

    The one in force (``start`` at first: the fixed defaults) gives way only to a candidate whose recent
    loss is lower by more than ``z`` standard deviations of the paired difference, Σ wᵢ²(ℓ_cᵢ − ℓ_jᵢ)²
    (for 0/1 losses, McNemar's test on the rows where the two disagree), and then to the lowest such
    loss. Without it, a few rows (iris: 4 per batch) made the selector follow noise; after a drift the
    gap grows with every batch and is significant within a few hundred rows. A candidate other than
    ``start`` stays in force only while its recent loss is below ``start``'s by more than ``keep_z``
    of their standard deviations; once its edge fades, ``start`` is back (the defaults are the prior:
    an edge that was significant for a while on a stationary stream is often the early rows' bias).

    loss : (K,) float64 — the weighted loss sums; pair : (K, K) — Σ wᵢ² (ℓ_jᵢ − ℓ_kᵢ)²;
    chosen : index of the candidate in force; start : the default's index
    """

    def __init__(
        self,
        n_candidates: int,
        start: int,
        half_life: float = SELECTION_HALF_LIFE,
        z: float = SELECTION_Z,
        keep_z: float = SELECTION_KEEP_Z,
    ):
        self.loss = np.zeros(n_candidates)
        self.pair = np.zeros((n_candidates, n_candidates))
        self.rows = 0.0  # Σ wᵢ over rows: loss / rows is the recent loss per row
        self.clock = 0  # labelled rows scored so far (group learning: the group's, see advance)
        self.chosen = self.start = start
        self.switches = 0  # times another candidate took over
        self.half_life = half_life
        self.z = z
        self.keep_z = keep_z

    def record(self, row_losses: np.ndarray) -> None:
        """row_losses: (K, b) each candidate's loss on each row of one labelled batch that every candidate
        predicted (``ScoringBudget``: the half-life counts these rows)."""
        row_losses = np.asarray(row_losses, dtype=np.float64)
        b = row_losses.shape[1]
        self.advance(b)
        self.loss += row_losses.sum(axis=1)
        for start in range(
            0, b, PAIR_CHUNK
        ):  # (K, K, chunk) at a time: a batch of a million rows stays small
            diff = (
                row_losses[:, None, start : start + PAIR_CHUNK]
                - row_losses[None, :, start : start + PAIR_CHUNK]
            )
            self.pair += np.einsum("jkb,jkb->jk", diff, diff)
        self.rows += b
        self.decide()

    def advance(self, rows: int) -> None:
        """``rows`` more labelled rows scored (here, or by other members of a group): the sums decay."""
        if rows > 0:
            decay = float(np.exp2(-rows / self.half_life))
            self.loss *= decay
            self.pair *= decay * decay
            self.rows *= decay
            self.clock += rows

    def decide(self) -> None:
        """Put in force the candidate the sums call for (after ``record``, or after a group's sums were added)."""
        chosen = self.chosen
        gap = self.loss[chosen] - self.loss  # > 0: lower recent loss than the one in force
        better = gap > self.z * np.sqrt(self.pair[chosen])
        if better.any():
            chosen = int(np.flatnonzero(better)[np.argmin(self.loss[better])])
        start = self.start
        if chosen != start and not self.loss[start] - self.loss[chosen] > self.keep_z * np.sqrt(
            self.pair[start, chosen]
        ):
            chosen = start
        if chosen != self.chosen:
            self.chosen = chosen
            self.switches += 1

    def recent(self) -> np.ndarray:
        """(K,) recent prequential loss per row of every candidate (NaN before any label)."""
        return self.loss / self.rows if self.rows > 0 else np.full(len(self.loss), np.nan)


class ScoringBudget:
    """Which batches the candidates not in force predict, to be judged on (``CandidateSelector``).

    The one in force predicts every batch; the others cost a Cholesky (unless A⁻¹ is kept by Woodbury), a
    solve and a prediction per layer each time they do (``OnlineLearner.scoring_flops``). They do on every batch
    that starts within the stream's first ``early_rows`` rows (default ``SCORE_ALL_ROWS``) and then whenever the
    credit pays for it: every batch earns ``share`` × the FLOPs of one -F step of its rows (``work.step_flops``),
    and a scored batch spends what scoring it costs (``share`` inf: every batch). After the early rows that is a
    third of the default -F and -R pair's batches on the small config of ``bench --suite core`` and half on
    poker's; with 18 candidates, a few in a hundred. The selector's half-life counts the rows it is given: with a
    share q scored it judges on as many rows as with every batch, the last ~512/q labelled ones, and reacts to a
    drift 1/q times later. Deterministic: the same batches, the same choice (the rows seen and the credit are in
    the snapshot).

    dims : (k, m, N, L, bias_column) of the model.
    """

    def __init__(self, dims: tuple, share: float = SCORING_SHARE, early_rows: int | None = None):
        self.dims, self.share = tuple(dims), share
        self.early_rows = SCORE_ALL_ROWS if early_rows is None else int(early_rows)
        self.credit = math.inf  # FLOPs earned and not spent (inf: the first batch after the early rows)
        self.rows = 0  # rows observed
        self.scored_rows = 0  # rows the candidates not in force predicted

    def step(self, b: int) -> float:
        """FLOPs of one -F step of b rows."""
        return work.step_flops(*self.dims[:4], b, self.dims[4])

    def take(self, b: int, cost: float) -> bool:
        """Whether the batch of b rows now observed is scored, ``cost`` FLOPs (then spent; within the early rows
        nothing is spent or earned)."""
        early = self.rows < self.early_rows
        self.rows += b
        if not early:
            self.credit = min(
                self.credit + self.share * self.step(b), cost
            )  # no saving up beyond one scoring
            if self.credit < cost:
                return False
            self.credit -= cost
        self.scored_rows += b
        return True

    @property
    def scored_share(self) -> float:
        """The share of the rows observed that every candidate predicted (1.0 before any row)."""
        return self.scored_rows / self.rows if self.rows else 1.0

    def to_state(self) -> dict:
        return {
            "credit": None if math.isinf(self.credit) else self.credit,
            "rows": self.rows,
            "scored_rows": self.scored_rows,
        }

    def load_state(self, state: dict | None) -> None:
        """As ``to_state`` gave it; None (a snapshot saved when every batch was scored): the first batch next."""
        state = state or {}
        credit = state.get("credit")
        self.credit = math.inf if credit is None else float(credit)
        self.rows, self.scored_rows = int(state.get("rows", 0)), int(state.get("scored_rows", 0))
