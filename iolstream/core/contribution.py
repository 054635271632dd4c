"""A model's learned sums as one flat set of arrays, to be added to another model's (group learning).

Every output layer's state is a pair of sums, A_l = λ_l I + Σ DᵀD and c_l = Σ DᵀY (docs/design.md §2), so the
states of models that share their random features (same config, same seed) add up: what two models
learned from disjoint rows is what one model learns from all of them. ``sums(model)`` reads the data
part of every learner that makes its own updates (the λ candidates of ``lam: auto`` share their
primary's sums), without the prior λI; ``add(model, delta)`` adds such a set into a model; both are
arrays in, arrays out (no I/O).

Keys, per primary learner p (its index in ``model.learners``), L layers of n columns, m outputs,
T = n(n+1)/2 entries of a symmetric n×n matrix (upper triangle, row by row):

    p<p>.gram      (L, T)  A_l − λ_l I
    p<p>.rhs       (L, m, n)  c_lᵀ
    p<p>.labelled  (L, T)  A_r − λ_l I (-F with regret tracking only)
    p<p>.loss      (L,)    Σ_t L_{l,t}
    p<p>.counts    (5,)    rows observed, labelled, forgotten, label batches, Σ‖Y‖² (added)
    p<p>.maxes     (3,)    largest label batch, D_m, Y_m (their maximum is taken, not their sum)

With ``auto`` (several candidates) the selector's recent losses are sums too, on a clock of labelled rows:

    sel.loss (K,), sel.pair (K, K), sel.rows (1,)   ``candidates.CandidateSelector``'s sums

Classification adds the labelled rows per class (``class_weight: balanced`` weighs by them) and, with
``calibration: online``, every candidate's calibration sums (each decays with its own half-life, as its c):

    cls.counts (m,)    cal.sums (K, G)   ``core.calibration``'s grid of log-loss sums, one row per candidate

Regression adds the residual counts behind its intervals (``core.intervals``), valued at the learners' clock:

    res.counts (m, B)  Σ w per output and bin of |residual|, decaying with ``model.residual_half_life``

With forgetting (``model.forgetting``) every sum decays on the learner's clock of rows seen, the selector's
on its clock of labelled rows; a set read at clocks (C₀, S₀) is worth ``decayed(model, sums, C − C₀, S − S₀)``
at (C, S) (``stream.group`` keeps the clocks).
"""

from __future__ import annotations

import numpy as np

COUNTS = ("rows_observed", "rows_labelled", "rows_forgotten", "label_batches", "sum_y2")
MAXES = ("max_label_batch", "d_max", "y_max")
_INTEGER = {"rows_observed", "rows_labelled", "rows_forgotten", "label_batches", "max_label_batch"}


def primaries(model) -> list:
    """The learners that make their own updates (the others copy a primary's sums)."""
    return model.candidate_set.primaries()


def _upper(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n)


def sums(model) -> dict[str, np.ndarray]:
    """The model's data sums (module docstring), fresh arrays."""
    out = {}
    for p, ln in enumerate(primaries(model)):
        st, a = ln.state, ln.state.arrays
        rows, cols = _upper(a.gram.shape[1])
        lams = np.array([ls.lam for ls in st.layers])
        # gram[l] is C-ordered with A_l = gram[l].T: A's authoritative lower triangle is gram[l]'s upper one
        gram = a.gram[:, rows, cols]
        gram[:, rows == cols] -= lams[:, None]
        out[f"p{p}.gram"] = gram
        out[f"p{p}.rhs"] = a.rhs.copy()
        if len(a.gram_labelled):
            labelled = a.gram_labelled[:, rows, cols]
            labelled[:, rows == cols] -= lams[:, None]
            out[f"p{p}.labelled"] = labelled
        out[f"p{p}.loss"] = a.loss_sum.copy()
        out[f"p{p}.counts"] = np.array([float(getattr(st, k)) for k in COUNTS])
        out[f"p{p}.maxes"] = np.array([float(getattr(st, k)) for k in MAXES])
    if len(model.learners) > 1:
        sel = model.selector
        out.update(
            {"sel.loss": sel.loss.copy(), "sel.pair": sel.pair.copy(), "sel.rows": np.array([sel.rows])}
        )
    if len(model.class_counts):
        out["cls.counts"] = model.class_counts.copy()
    if model.calibrated:
        out["cal.sums"] = np.stack([ln.calibration_sums for ln in model.learners])
    if len(model.residual_counts):
        out["res.counts"] = model.current_residual_counts().copy()
    return out


def clock(model) -> int:
    """The learners' clock: rows seen (every learner's is the same)."""
    return model.learners[0].state.clock


def label_clock(model) -> int:
    """The selector's clock: labelled rows scored (0 with a single candidate)."""
    return model.selector.clock


def advance(model, rows: int, label_rows: int = 0) -> None:
    """``rows`` more rows seen elsewhere, ``label_rows`` more labelled: every learner's clock moves on and, with
    forgetting, its sums decay; the selector's sums decay likewise."""
    model.candidate_set.advance(rows)
    if len(model.learners) > 1:
        model.selector.advance(label_rows)


def decayed(model, sums: dict[str, np.ndarray], age: float, label_age: float = 0.0) -> dict[str, np.ndarray]:
    """``sums`` (keys as ``sums``) aged by ``age`` rows and ``label_age`` labelled rows: each primary's decaying
    parts (A, c, A_r, Σ loss, Σ‖Y‖²) times 2^(−age/half-life), the selector's by its own half-life (its pair sum
    twice), the residual counts by theirs; counts and maxes as they are. At ages 0, ``sums`` itself."""
    out = dict(sums)
    if "sel.loss" in sums and label_age:
        f = float(np.exp2(-label_age / model.selector.half_life))
        out.update(
            {
                "sel.loss": sums["sel.loss"] * f,
                "sel.pair": sums["sel.pair"] * f * f,
                "sel.rows": sums["sel.rows"] * f,
            }
        )
    if "res.counts" in sums and age:
        out["res.counts"] = sums["res.counts"] * float(np.exp2(-age / model.residual_half_life))
    if "cal.sums" in sums and age:
        factors = [
            1.0 if ln.half_life is None else float(np.exp2(-age / ln.half_life)) for ln in model.learners
        ]
        out["cal.sums"] = sums["cal.sums"] * np.asarray(factors)[:, None]
    for p, ln in enumerate(primaries(model)):
        if ln.half_life is None or age == 0:
            continue
        f = float(np.exp2(-age / ln.half_life))
        for name in ("gram", "rhs", "labelled", "loss"):
            if f"p{p}.{name}" in sums:
                out[f"p{p}.{name}"] = sums[f"p{p}.{name}"] * f
        counts = sums[f"p{p}.counts"].copy()
        counts[COUNTS.index("sum_y2")] *= f
        out[f"p{p}.counts"] = counts
    return out


def layout(model) -> dict[str, tuple]:
    """Every key of ``sums(model)`` and its shape (to check a received set against), read from the stacks' shapes
    (no copy of the sums)."""
    out = {}
    for p, ln in enumerate(primaries(model)):
        a = ln.state.arrays
        n_layers, n = a.gram.shape[:2]
        tri = (n_layers, n * (n + 1) // 2)
        out.update({f"p{p}.gram": tri, f"p{p}.rhs": a.rhs.shape})
        if len(a.gram_labelled):
            out[f"p{p}.labelled"] = tri
        out.update(
            {f"p{p}.loss": a.loss_sum.shape, f"p{p}.counts": (len(COUNTS),), f"p{p}.maxes": (len(MAXES),)}
        )
    if len(model.learners) > 1:
        k = len(model.learners)
        out.update({"sel.loss": (k,), "sel.pair": (k, k), "sel.rows": (1,)})
    if len(model.class_counts):
        out["cls.counts"] = model.class_counts.shape
    if model.calibrated:
        out["cal.sums"] = (len(model.learners), len(model.learner.calibration_sums))
    if len(model.residual_counts):
        out["res.counts"] = model.residual_counts.shape
    return out


def difference(new: dict, old: dict | None) -> dict[str, np.ndarray]:
    """new − old key by key (old None: new itself); maxes are taken from ``new``."""
    if old is None:
        return {k: v.copy() for k, v in new.items()}
    return {k: (v.copy() if k.endswith(".maxes") else v - old[k]) for k, v in new.items()}


def add(model, delta: dict[str, np.ndarray], sign: float = 1.0) -> None:
    """Add ``sign`` × ``delta`` (keys as ``sums``) into every primary learner's sums (and the selector's, which then
    decides again); maxes become the larger ones. Factors and β become stale (solved when next read), the
    learners' versions move on (the λ and -R candidates solve again from the new sums when next read)."""
    for p, ln in enumerate(primaries(model)):
        st, a = ln.state, ln.state.arrays
        n = a.gram.shape[1]
        rows, cols = _upper(n)
        off = rows != cols
        with st.changing_gram():  # factors and β made from the new sums when next read
            for name, stack in (("gram", a.gram), ("labelled", a.gram_labelled)):
                tri = delta.get(f"p{p}.{name}")
                if tri is None or not len(stack):
                    continue
                stack[:, rows, cols] += sign * tri
                stack[:, cols[off], rows[off]] += (
                    sign * tri[:, off]
                )  # both triangles: whichever a kernel reads
            a.rhs += sign * delta[f"p{p}.rhs"]
        a.loss_sum += sign * delta[f"p{p}.loss"]
        for key, value in zip(COUNTS, delta[f"p{p}.counts"].tolist()):
            total = getattr(st, key) + sign * value
            setattr(st, key, int(round(total)) if key in _INTEGER else total)
        for key, value in zip(MAXES, delta[f"p{p}.maxes"].tolist()):
            setattr(st, key, max(getattr(st, key), int(value) if key in _INTEGER else value))
        st.version += 1
        st.labelled_version += 1
    if "cls.counts" in delta:
        model.class_counts += sign * delta["cls.counts"]
    if "res.counts" in delta:
        counts = model.current_residual_counts()  # in place, at the clock the delta is valued at
        counts += sign * delta["res.counts"]
    if "cal.sums" in delta:
        for ln, part in zip(model.learners, delta["cal.sums"]):
            sums = ln.calibration_sums  # in place: the learner's state holds them
            sums += sign * part
    if "sel.loss" in delta:
        sel = model.selector
        sel.loss += sign * delta["sel.loss"]
        sel.pair += sign * delta["sel.pair"]
        sel.rows += sign * float(delta["sel.rows"][0])
        sel.decide()


def check_layout(model, received: dict[str, np.ndarray]) -> None:
    """ValueError naming the first key whose presence or shape differs from this model's sums."""
    wanted = layout(model)
    for key, shape in wanted.items():
        if key not in received:
            raise ValueError(f"sums: key {key!r} missing")
        if tuple(received[key].shape) != tuple(shape):
            raise ValueError(
                f"sums: {key} has shape {tuple(received[key].shape)}, this model's is {tuple(shape)}"
            )
    extra = sorted(set(received) - set(wanted))
    if extra:
        raise ValueError(f"sums: unexpected key {extra[0]!r}")
