"""The learned state of ``learner.OnlineLearner``: per-layer sufficient statistics, stacked.

All layers' matrices live in one ``LayerArrays`` (so that one kernel call updates every
layer); ``LayerState`` is one layer's view of it, ``LearnerState`` the whole state with its
counters. Plain numbers and arrays only: ``state_io`` writes and reads them as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from iolstream.core import gram_cholesky, step_kernels
from iolstream.core.calibration import GRID_SIZE


@dataclass
class LayerArrays:
    """The state of all L sub-learners, stacked layer first (C-ordered), so that one kernel call
    updates every layer. A layer's matrix is the *transpose* of its block: column-major, as
    BLAS/LAPACK take it and as ``LayerState`` hands it out.

    gram           : (L, n, n) — gram[l].T = A_l, lower triangle authoritative
    factor         : (L, n, n) — factor[l].T = lower Cholesky factor of A_l, or P_l = A_l⁻¹
                     (not up to date where ``factor_stale``). Allocated when first needed (``factors``): the -F
                     step factors A in scratch memory, so a -F learner on the Cholesky route never needs it;
                     (L, 0, 0) until then, every layer stale
    rhs            : (L, m, n) — rhs[l].T = c_l
    beta           : (L, m, n) — beta[l].T = β_l (not up to date where ``beta_stale``)
    gram_labelled  : (L, n, n) — A_r of docs/design.md §3 (-F with regret tracking), else (0, n, n)
    loss_sum       : (L,) — Σ_t L_{l,t}(β_{l,t})
    beta_stale     : (L,) bool — β_l must be solved from the factor before it is used
    factor_stale   : (L,) bool — the Cholesky factor must be recomputed from A_l before it is used
    factor_inverse : (L,) bool — ``factor`` holds P_l (Woodbury), not a Cholesky factor
    woodbury_steps : (L,) int — Woodbury updates of P_l since it was last rebuilt from A_l
    """

    gram: np.ndarray
    factor: np.ndarray
    rhs: np.ndarray
    beta: np.ndarray
    gram_labelled: np.ndarray
    loss_sum: np.ndarray
    beta_stale: np.ndarray
    factor_stale: np.ndarray
    factor_inverse: np.ndarray
    woodbury_steps: np.ndarray

    @classmethod
    def initial(
        cls, lams: list[float], n: int, m: int, track_labelled: bool, sums: bool = True
    ) -> LayerArrays:
        """A_0 = λ_l I, c = 0, β = 0 for every layer (the factor is made when first needed). ``sums`` False: A, A_r
        and c are empty too, for a learner that reads another's (``shared_gram``, which allocates them if its own
        copy is ever asked for)."""
        n_layers = len(lams)
        none = np.empty((n_layers, 0, 0))
        gram = np.eye(n)[None] * np.asarray(lams)[:, None, None] if sums else none
        labelled = gram.copy() if track_labelled and sums else np.empty((0, n, n))
        flags = np.zeros(n_layers, dtype=bool)
        steps = np.zeros(n_layers, dtype=np.int64)
        return cls(
            gram,
            none.copy(),
            np.zeros((n_layers, m, n if sums else 0)),  # c
            np.zeros((n_layers, m, n)),  # β
            labelled,
            np.zeros(n_layers),
            flags,
            np.ones(n_layers, dtype=bool),  # no factor yet
            flags.copy(),
            steps,
        )

    def factors(self) -> np.ndarray:
        """The factor stack (L, n, n), allocated now if it was not yet (every layer stays stale until factored)."""
        n = self.beta.shape[2]
        if self.factor.shape[1] != n:
            self.factor = np.zeros((len(self.factor_stale), n, n))
            self.factor_stale[:] = True
        return self.factor


def _stacked(name: str, doc: str):
    """A property reading layer ``_index`` of ``_arrays.<name>`` as a column-major view; assigning
    to it copies into the stack."""

    def get(self):
        return getattr(self._arrays, name)[self._index].T

    def put(self, value):
        getattr(self._arrays, name)[self._index].T[...] = value

    return property(get, put, doc=doc)


def _scalar(name: str, kind: type, doc: str):
    """A property reading and writing element ``_index`` of ``_arrays.<name>`` as a plain ``kind``."""

    def get(self):
        return kind(getattr(self._arrays, name)[self._index])

    def put(self, value):
        getattr(self._arrays, name)[self._index] = value

    return property(get, put, doc=doc)


class LayerState:
    """One sub-learner's share of ``LayerArrays``: views, so reading costs no copy and assigning
    copies into the stack.

    gram           : (n, n) float64, F-ordered view, lower triangle authoritative — A_l
    rhs            : (n, m) float64 — c_l
    beta           : (n, m) float64 — β_l = A_l⁻¹ c_l. Lazy: an update whose β nobody uses (a
                     label fold-in, whose β the next observe replaces unread) only marks it
                     stale, and reading it solves — whoever reads β sees A_l⁻¹ c_l.
    factor         : (n, n) float64 — lower Cholesky factor of A_l, or P_l = A_l⁻¹ (``factor_kind``).
                     Lazy too: the fused -F step factors A in scratch memory and only marks
                     this one stale; reading it factors A again.
    gram_labelled  : (n, n) float64 or None — λI + Σ DᵀD over labelled rows (A_r of docs/design.md §3), -F only
    loss_sum       : Σ_t L_{l,t}(β_{l,t}), immediate losses with the β that made each prediction
    factor_kind    : "cholesky" or "inverse"
    woodbury_steps : Woodbury updates since P_l was rebuilt from A_l
    """

    gram = _stacked("gram", "A_l, (n, n) F-ordered view, lower triangle authoritative")
    rhs = _stacked("rhs", "c_l, (n, m) F-ordered view")
    loss_sum = _scalar("loss_sum", float, "Σ_t L_{l,t}(β_{l,t})")
    beta_stale = _scalar("beta_stale", bool, "β_l is solved when next read")
    woodbury_steps = _scalar("woodbury_steps", int, "Woodbury updates since P_l was rebuilt")

    def __init__(self, arrays: LayerArrays, index: int, lam: float):
        self._arrays, self._index = arrays, index
        self.lam = lam

    def __repr__(self) -> str:
        return f"LayerState(index={self._index}, lam={self.lam}, factor_kind={self.factor_kind!r}, loss_sum={self.loss_sum})"

    @property
    def factor_kind(self) -> str:
        return "inverse" if self._arrays.factor_inverse[self._index] else "cholesky"

    @factor_kind.setter
    def factor_kind(self, value: str) -> None:
        if value not in ("cholesky", "inverse"):
            raise ValueError(f"factor_kind must be 'cholesky' or 'inverse', got {value!r}")
        self._arrays.factor_inverse[self._index] = value == "inverse"

    @property
    def gram_labelled(self) -> np.ndarray | None:
        stack = self._arrays.gram_labelled
        return stack[self._index].T if len(stack) else None

    @gram_labelled.setter
    def gram_labelled(self, value) -> None:
        if not len(self._arrays.gram_labelled):
            raise ValueError("this learner does not track A_r (track_regret=False or mode 'ridge')")
        self._arrays.gram_labelled[self._index].T[...] = value

    @property
    def factor(self) -> np.ndarray:
        if self._arrays.factor_stale[self._index]:
            self.refactor()
        return self._arrays.factor[self._index].T

    @factor.setter
    def factor(self, value) -> None:
        self._arrays.factors()[self._index].T[...] = value
        self._arrays.factor_stale[self._index] = False

    def refactor(self) -> None:
        """The Cholesky factor of A into ``factor`` (``factor_kind`` becomes "cholesky")."""
        arrays, index = self._arrays, self._index
        factors = arrays.factors()
        if arrays.gram.shape[1:] != factors.shape[1:]:  # the kernel does not check its bounds
            raise ValueError("refactor: this state keeps no A of its own (a shared candidate's: shared_gram)")
        info = step_kernels.refactor_layer(index, arrays.gram, factors)
        if info != 0:
            raise gram_cholesky.NotPositiveDefinite(
                f"Cholesky failed at column {info}: the Gram matrix is not positive definite"
            )
        arrays.factor_stale[index] = arrays.factor_inverse[index] = False
        arrays.woodbury_steps[index] = 0

    @property
    def beta(self) -> np.ndarray:
        if self._arrays.beta_stale[self._index]:
            self.solve()
        return self._arrays.beta[self._index].T

    @beta.setter
    def beta(self, value) -> None:
        self._arrays.beta[self._index].T[...] = value
        self._arrays.beta_stale[self._index] = False

    def solve(self) -> None:
        """β = A⁻¹ c with the cached factor (Theorem 1: β equals the offline expert)."""
        arrays, index = self._arrays, self._index
        if arrays.factor_inverse[index]:
            arrays.beta[index].T[...] = gram_cholesky.product(self.factor, self.rhs)
        else:
            if arrays.factor_stale[index]:
                self.refactor()
            info = step_kernels.solve_layer(index, arrays.factors(), arrays.rhs, arrays.beta)
            if info != 0:
                raise ValueError(f"dpotrs: illegal argument {-info}")
        arrays.beta_stale[index] = False


# The learner's counters besides its version (what a λ or -R candidate takes from the learner whose sums it shares).
COUNTERS = (
    "rows_observed",
    "rows_labelled",
    "rows_forgotten",
    "label_batches",
    "max_label_batch",
    "sum_y2",
    "d_max",
    "y_max",
    "clock",
)


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
    version: int = 0  # bumped at every change of the sums (so of β)
    # bumped at every change of c or A_r (labels, decay, added sums), not of A alone: the -R candidates of an -F
    # learner solve on these (shared_gram); not saved (a restored candidate solves again)
    labelled_version: int = 0
    clock: int = 0  # rows seen (observed, or labelled without being observed): the time forgetting runs on
    extra: dict = field(default_factory=dict)
    # Σ wᵢ·(−log pᵢ(yᵢ)) of every map of the calibration grid over this learner's predictions of labelled rows
    # (``core.calibration``; classification): a data sum like c, scaled and added with it
    calibration: np.ndarray = field(default_factory=lambda: np.zeros(GRID_SIZE))
    arrays: LayerArrays | None = field(default=None, repr=False)  # the stacks ``layers`` view

    def __getstate__(self) -> dict:
        """Pickle with every β up to date, and every factor this state has made, so that a read-only copy (a
        memory map) predicts without writing. A factor never made stays unmade (a -F step factors in scratch
        memory), and a state without sums of its own (a ``shared_gram`` candidate's) has none to factor."""
        solve_stale(self)
        a = self.arrays
        if a.gram.shape[1] and a.factor.shape[1]:
            for ls in self.layers:
                if a.factor_stale[ls._index]:
                    ls.refactor()
        return self.__dict__.copy()

    # The two operations forgetting and group learning are built on (docs/design.md §8). Write every sum as
    # A = λI + S: only the data part S = Σ wᵢ dᵢdᵢᵀ (and c, A_r − λI, the loss sums) is scaled or added;
    # the prior λI is never scaled and never counted twice. scale and add commute: f(S + S') = fS + fS'.

    def scale(self, factor: float) -> None:
        """Every data sum times ``factor`` (0 < factor ≤ 1 to forget): S, c, A_r − λI, Σ loss, Σ‖y‖², the
        calibration's sums.

        A_l ← λ_l I + factor·(A_l − λ_l I), computed as factor·A_l + (1 − factor)·λ_l on the diagonal.
        Rounding adds ~ε·|A| per call, and every later call scales it again by its factor, so the
        error stays bounded by ε·|A|/(1 − factor) on a stream of any length. Factors and β become stale.
        """
        if not (np.isfinite(factor) and factor >= 0.0):
            raise ValueError(f"scale: factor must be finite and ≥ 0, got {factor!r}")
        if factor == 1.0:
            return
        a = self.arrays
        lams = np.array([ls.lam for ls in self.layers])
        with self.changing_gram():
            _scale_data(a.gram, lams, factor)
            if len(a.gram_labelled):
                _scale_data(a.gram_labelled, lams, factor)
            a.rhs *= factor
        a.loss_sum *= factor
        self.sum_y2 *= factor
        self.calibration *= factor
        self.version += 1
        self.labelled_version += 1

    def add(self, other: LearnerState, factor: float = 1.0) -> None:
        """Add ``factor`` × another state's data sums to these (its prior λI is not added): S, c,
        A_r − λI, Σ loss, Σ‖y‖², the calibration's sums, and its row counters. The clocks are not touched: a caller holding a
        state from another clock decays it first (``factor`` = 2^(−Δclock/half-life))."""
        a, b = self.arrays, other.arrays
        for name in ("gram", "rhs", "gram_labelled"):
            if getattr(a, name).shape != getattr(b, name).shape:
                raise ValueError(
                    f"add: {name} shapes differ: {getattr(a, name).shape} and {getattr(b, name).shape}"
                )
        if not (np.isfinite(factor) and factor >= 0.0):
            raise ValueError(f"add: factor must be finite and ≥ 0, got {factor!r}")
        other_lams = np.array([ls.lam for ls in other.layers])
        n = a.gram.shape[1]
        diag = np.arange(n)
        with self.changing_gram():
            a.gram += factor * b.gram
            a.gram[:, diag, diag] -= factor * other_lams[:, None]  # other's prior out
            if len(a.gram_labelled):
                a.gram_labelled += factor * b.gram_labelled
                a.gram_labelled[:, diag, diag] -= factor * other_lams[:, None]
            a.rhs += factor * b.rhs
        a.loss_sum += factor * b.loss_sum
        self.sum_y2 += factor * other.sum_y2
        self.calibration += factor * other.calibration
        for key in ("rows_observed", "rows_labelled", "rows_forgotten", "label_batches"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        for key in ("max_label_batch", "d_max", "y_max"):
            setattr(self, key, max(getattr(self, key), getattr(other, key)))
        self.version += 1
        self.labelled_version += 1

    @contextmanager
    def changing_gram(self, *, factor: str = "stale", solved: bool = False) -> Iterator[None]:
        """Change A (the body of the ``with``: a Gram in or out, a scaling, sums added or restored) keeping the
        invariant of the stacks: a layer's factor is the Cholesky factor of its A (or P = A⁻¹ where
        ``factor_inverse``, ``woodbury_steps`` updates since it was rebuilt), and β = A⁻¹c, except where marked
        stale (made from A and c when next read). Every change of A goes through here.

        factor : what the change left in the factor stack — "stale" (default: made from A when next read; the
                 -F step factors A in scratch memory), "made" (the change wrote the Cholesky factor of the new A
                 into it) or "kept" (the change brought each layer's factor up to date itself: ``LayerState.refactor``,
                 a Woodbury update of P). A Woodbury P of the old A is of no use after any other change.
        solved : the change solved every β from the new A and c (else β is stale).

        Should the change raise, whatever it left is not trusted: every factor and β are stale."""
        if factor not in ("stale", "made", "kept"):
            raise ValueError(f"changing_gram: factor must be 'stale', 'made' or 'kept', got {factor!r}")
        a = self.arrays
        try:
            yield
        except BaseException:
            a.factor_stale[:] = a.beta_stale[:] = True
            a.factor_inverse[:] = False
            a.woodbury_steps[:] = 0
            raise
        if factor != "kept":
            a.factor_stale[:] = factor == "stale"
            a.factor_inverse[:] = False
            a.woodbury_steps[:] = 0
        a.beta_stale[:] = not solved


def _scale_data(stack: np.ndarray, lams: np.ndarray, factor: float) -> None:
    """stack[l] ← λ_l I + factor·(stack[l] − λ_l I) for every layer, in place (stack: (L, n, n))."""
    diag = np.arange(stack.shape[1])
    stack *= factor
    stack[:, diag, diag] += (1.0 - factor) * lams[:, None]


def solve_stale(state: LearnerState) -> None:
    """Solve every β that an update left stale."""
    if state.arrays.beta_stale.any():
        for ls in state.layers:
            if ls.beta_stale:
                ls.solve()
