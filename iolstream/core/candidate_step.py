"""A batch through the candidates of ``auto`` (``lam``, ``forgetting`` and ``mode``; docs/design.md §10).

The learners are made once (``make_learners``): per half-life one primary keeps the sums, the others share them
(``shared_gram``). A new batch (``observe_candidates``): the features once; its Gram once, added to every
half-life's A (each decays its own first); then the candidates that predict it solve and predict: the one in
force always, the others on the batches the scoring budget pays for (``candidates.ScoringBudget``). Labels
(``learn_candidates``): every primary folds them in, every candidate scores the rows it predicted, and the
selector is given the rows every candidate predicted.
"""

from __future__ import annotations

import numpy as np

from iolstream.core import calibration, shared_step_kernels, step_kernels
from iolstream.core.learner import OnlineLearner
from iolstream.core.shared_gram import SharedGramLearner


def make_learners(config, n_columns: int, pairs: list[tuple], modes: list[str]) -> list:
    """One learner per candidate (``pairs``: (lam, half_life), ``modes``: its mode). The first candidate of each
    half-life makes every update (Gram, labels, decay); the others share its sums (``SharedGramLearner``): one
    Gram, one Cholesky per λ; half-lives differ in sums. With ``mode: auto`` that first one is -F and keeps A_r
    beside A, the -R candidates' A."""
    if len(pairs) != len(modes):
        raise ValueError(f"{len(pairs)} candidate settings but {len(modes)} modes")
    learners, primaries = [], {}
    for (lam, half_life), mode in zip(pairs, modes):
        if half_life in primaries:
            learners.append(SharedGramLearner(primaries[half_life], lam, mode=mode))
            continue
        primaries[half_life] = ln = OnlineLearner(
            n_columns,
            config.m,
            config.n_layers,
            lam=lam,
            mode=mode,
            solver=config.solver,
            refactor_every=config.refactor_every,
            track_regret=config.track_regret,
            half_life=half_life,
            keep_labelled=config.mode == "auto",
        )
        learners.append(ln)
    return learners


class BatchGrams:
    """The Gram Σ DᵀD (L, n, n) of the last ``keep`` batches observed, kept for their labels: the -F learners of
    ``mode: auto`` keep A_r, the labelled rows' Gram, beside A; when a batch's labels come for all of its rows
    at once (the same ``features_t``: evaluate, bench, the stream's feature cache) A_r adds the Gram formed
    when the batch entered A, instead of a second one. Batches whose labels come later or apart form theirs.

    The buffers are reused, never more than ``keep`` of them: a batch's Gram is formed in the buffer of one whose
    labels came (``release``) or of the oldest kept, dropped then. They start zeroed, and only their lower
    triangles are ever written (the Gram's authoritative part), so the upper ones stay 0."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._kept: list[tuple[np.ndarray, np.ndarray]] = []  # (features_t, its Gram), newest last
        self._free: list[np.ndarray] = []

    def buffer(self, shape: tuple) -> np.ndarray:
        """A buffer (``shape``) for the next batch's Gram: a free one, or the oldest kept one's."""
        if len(self._kept) >= self.keep:
            self._free.append(self._kept.pop(0)[1])
        while self._free:
            gram = self._free.pop()
            if gram.shape == shape:
                return gram
        return np.zeros(shape)

    def put(self, features_t: np.ndarray, gram: np.ndarray) -> None:
        self._kept.append((features_t, gram))
        while len(self._kept) > self.keep:
            self._free.append(self._kept.pop(0)[1])

    def clear(self) -> None:
        """Keep none (rows were taken out of the model: a kept Gram may hold them)."""
        self._kept = []

    def take(self, features_t: np.ndarray) -> np.ndarray | None:
        """The Gram of this very ``features_t`` if kept (then no longer: ``release`` it once added), else None."""
        for i, (kept, gram) in enumerate(self._kept):
            if kept is features_t:
                del self._kept[i]
                return gram
        return None

    def release(self, gram: np.ndarray) -> None:
        """A taken Gram has been added: its buffer serves the next batch."""
        self._free.append(gram)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers held (kept and free)."""
        return sum(g.nbytes for _, g in self._kept) + sum(g.nbytes for g in self._free)


def observe_candidates(
    learners: list, network, x_scaled: np.ndarray, parallel: bool, predicting: np.ndarray, grams: BatchGrams
):
    """A new batch seen by every candidate: (features_t (L, n, b), layer outputs (K, L, b, m), NaN for the
    candidates ``predicting`` (K,) bool leaves out). ``parallel``: the thread setting of the one in force, for
    all. One primary that predicts and keeps no A_r: the fused -F step (features, Gram, Cholesky, prediction in
    one call). An -F primary that keeps A_r (``mode: auto``): one call too, which also keeps the batch's Gram in
    ``grams`` for A_r (the other half-lives' primaries add it to their A) and, with the default -F and -R pair
    alone, solves and predicts the -R candidate as well (``shared_step_kernels``). Else the features, the batch's Gram
    once, added to each -F primary's A."""
    for ln in learners:
        ln.parallel = parallel
    first = learners[0]  # a primary: the first candidate of the first half-life
    prim = [ln for ln in learners if not isinstance(ln, SharedGramLearner)]
    b = x_scaled.shape[0]
    n_layers, n = first.n_layers, first.n_columns
    outputs = np.empty((len(learners), n_layers, b, first.n_outputs))
    done = set()
    keeping = any(len(ln.state.arrays.gram_labelled) for ln in prim)
    if len(prim) == 1 and predicting[0] and not keeping:
        features_t, outputs[0] = first.observe_rows(network, x_scaled)
        done.add(0)
    elif keeping and first.mode == "forward" and b and first._uses_cholesky(b) and network.n_columns == n:
        # the default mode: auto: -F and its -R candidate (on A_r) in one call
        ridge = ridge_pair(learners)
        pair = ridge is not None
        batch_gram = grams.buffer((n_layers, n, n))
        features_t, out, out_r = first.observe_keeping(
            network, x_scaled, batch_gram, bool(predicting[0]), ridge, pair and bool(predicting[1])
        )
        grams.put(features_t, batch_gram)
        for j, got in ((0, out), (1, out_r)):
            if got is not None:
                outputs[j] = got
                done.add(j)
        if pair:
            ridge.advance(b)  # after its primary: the counters are level with it
            done.add(1)
            if out_r is None:
                outputs[1] = np.nan
        for ln in prim[1:]:
            ln.observe_sums(features_t, batch_gram)
    else:
        features_t = network.features(x_scaled, parallel=parallel)
        forward = [ln for ln in prim if ln.mode == "forward"]
        batch_gram = None
        if (len(forward) > 1 or keeping) and b and features_t.flags.c_contiguous:
            batch_gram = grams.buffer((n_layers, n, n)) if keeping else np.zeros((n_layers, n, n))
            (shared_step_kernels.grams_into_parallel if parallel else shared_step_kernels.grams_into)(
                features_t, batch_gram
            )
            if keeping:
                grams.put(features_t, batch_gram)
        for ln in prim:
            ln.observe_sums(features_t, batch_gram)
    for j, ln in enumerate(learners):
        if j in done:
            continue
        if isinstance(ln, SharedGramLearner):
            ln.advance(b)  # after its primary: the counters are level with it
        if predicting[j]:
            outputs[j] = ln.layer_outputs(features_t)
        else:
            outputs[j] = np.nan
    return features_t, outputs


def learn_candidates(
    cands, features_t, targets, gram_in, predicted, observed_at, weights, judge
) -> np.ndarray:
    """Labels (scaled targets (b, m)) into every candidate of ``cands`` (a ``candidate_set.CandidateSet``); returns the loss per layer (L,) of what
    was emitted for these rows: each row's prediction by the one candidate that made it, or, on rows every
    candidate predicted, by the one in force now. ``predicted`` (K, L, b, m) as ``observe_candidates`` gave it
    (NaN: not predicted); None: every candidate's present β predicts them (these labels are not in it yet
    either). ``weights``: the rows' class weights (None: 1). The selector judges the rows every candidate
    predicted by each one's calibrated probabilities as they were; then each candidate's calibration learns
    from the rows it predicted. ``judge(predicted, targets)``: each candidate's loss per row (K, b), the selector's
    measure (``EdRVFL.selection_losses``)."""
    learners, b = cands.learners, features_t.shape[2]
    if predicted is None or np.ndim(predicted) != 4:
        predicted = np.stack([ln.layer_outputs(features_t) for ln in learners])
    predicted = np.ascontiguousarray(predicted, dtype=np.float64)
    # (K, b): which candidate predicted which row (a candidate predicts all of a row's outputs, or none)
    made = ~np.isnan(predicted[:, 0, :, 0])
    chosen = cands.selector.chosen
    made_all, made_any = made.all(axis=1), made.any(axis=1)
    every = bool(made_all.all())  # the common case: a batch every candidate predicted
    if b and not made.any(axis=0).all():
        raise ValueError(
            "predicted: rows that no candidate predicted (every row has the outputs it was emitted by)"
        )
    if every or not b:
        scored, emitter = None, chosen  # every row, emitted by the one in force
    elif (
        made_all == made_any
    ).all():  # a batch some candidates predicted, whole: one emitter for all its rows
        scored = np.empty(0, dtype=np.int64)
        emitter = chosen if made_all[chosen] else int(np.argmax(made_all))
    else:  # rows of batches scored differently
        scored = np.flatnonzero(made.all(axis=0))
        emitter = np.where(made.all(axis=0) | made[chosen], chosen, made.argmax(axis=0))
    labelled_gram, kept = (
        (None, False) if weights is not None else _labelled_gram(cands, features_t, gram_in, observed_at)
    )
    pair_losses = None
    if weights is None and not isinstance(
        emitter, np.ndarray
    ):  # each candidate predicted all the rows or none
        pair_losses = _fold_pair(learners, features_t, targets, gram_in, predicted, made_all, labelled_gram)
    if pair_losses is None:
        for j, ln in enumerate(learners):
            if isinstance(ln, SharedGramLearner):
                if made_any[j]:  # its loss on the rows it predicted; the sums are its primary's
                    ln.learn(
                        features_t,
                        targets,
                        predicted=predicted[j],
                        observed_at=observed_at,
                        sample_weight=weights,
                        complete=made_all[j],
                    )
                continue
            ln.learn(
                features_t,
                targets,
                gram_in=gram_in,
                predicted=predicted[j],
                observed_at=observed_at,
                labelled_gram=labelled_gram,
                sample_weight=weights,
            )
    if kept:
        cands.batch_grams.release(labelled_gram)
    if pair_losses is not None:  # every row emitted by one candidate: its losses
        losses = pair_losses[emitter].copy()
    else:
        if isinstance(emitter, np.ndarray):
            emitted = np.ascontiguousarray(
                predicted[emitter, :, np.arange(b), :].transpose(1, 0, 2)
            )  # (L, b, m)
        else:
            emitted = predicted[emitter]
        losses = np.empty(learners[0].n_layers)
        step_kernels.label_losses(emitted, targets, losses)
    if scored is None:
        row_losses = judge(predicted, targets) if b else np.empty((len(learners), 0))
    elif scored.size:
        row_losses = judge(predicted[:, :, scored], targets[scored])
    else:
        row_losses = np.empty((len(learners), 0))
    if cands.calibrated:  # after the selector's losses: they judge the probabilities as they were emitted
        labels = targets.argmax(axis=1)
        stamps = None if observed_at is None else np.broadcast_to(np.asarray(observed_at), (b,))
        for j in range(len(learners)):
            if made_all[j]:  # every row (no copy)
                record_calibration(learners[j], predicted[j], labels, stamps, weights)
            elif made_any[j]:
                own = np.flatnonzero(made[j])
                record_calibration(
                    learners[j],
                    predicted[j][:, own],
                    labels[own],
                    None if stamps is None else stamps[own],
                    None if weights is None else weights[own],
                )
    cands.emitted_loss += losses
    cands.predicted_rows += made.sum(axis=1)
    cands.selector.record(row_losses)
    return losses


def record_calibration(ln, outputs, labels, observed_at, weights) -> None:
    """Learner ``ln``'s calibration sums learn from its layer outputs (L, b, m) of labelled rows (class indices
    ``labels`` (b,)), at their weight in its sums (forgetting's decay at ``observed_at`` times ``weights``, the class
    weights; None: 1)."""
    row_weights = ln.row_weights(observed_at, len(labels))
    if weights is not None:
        row_weights = row_weights * weights
    scores = calibration.ensemble_scores(outputs)
    sums = ln.calibration_sums  # in place: the learner's state holds them
    sums += calibration.grid_losses(scores, labels, row_weights)


def ridge_pair(learners: list):
    """The -R candidate of the default ``mode: auto`` pair (-F and -R of one λ and half-life, -R on the -F learner's
    A_r), or None for any other set of candidates."""
    if (
        len(learners) == 2
        and getattr(learners[1], "reads_labelled", False)
        and learners[1].primary is learners[0]
    ):
        return learners[1]
    return None


def _fold_pair(learners, features_t, targets, gram_in, predicted, made, labelled_gram) -> np.ndarray | None:
    """The labels of rows of the default pair, each candidate having predicted all of them or none (``made`` (2,)),
    in one kernel call when the -F learner folds them at weight 1 with their Gram in A (no forgetting; the bits of
    the learners' own ``learn``): its A_r and c, and each candidate's losses (0 where it did not predict). Returns
    the losses (2, L), or None when the general path must run."""
    ridge = ridge_pair(learners)
    if ridge is None:
        return None
    first = learners[0]
    b = features_t.shape[2]
    if (
        b == 0
        or first.half_life is not None
        or (gram_in is not None and not np.all(gram_in))
        or not first._fusable(features_t)
    ):
        return None
    targets = np.ascontiguousarray(targets, dtype=np.float64).reshape(b, first.n_outputs)
    a = first.state.arrays
    kept = labelled_gram if labelled_gram is not None else a.gram_labelled[:0]
    losses = np.empty((2, first.n_layers))
    kernel = (
        shared_step_kernels.learn_pair_parallel
        if first.folds_in_parallel(b)
        else shared_step_kernels.learn_pair_serial
    )
    sum_y2 = kernel(features_t, targets, predicted, made, a.rhs, a.gram_labelled, kept, losses)
    # as its own learn: its prediction where it made one, the targets (loss 0) where not (D_m and Y_m)
    first.folded(features_t, targets, predicted[0] if made[0] else targets[None], 0, losses[0], sum_y2)
    if made[1]:
        ridge.scored(losses[1])
    return losses


def _labelled_gram(cands, features_t, gram_in, observed_at) -> tuple[np.ndarray | None, bool]:
    """(Σ DᵀD of labelled rows (L, n, n) for the -F learners that keep A_r (each adds it at its own weight),
    whether it is a ``BatchGrams`` buffer): the one kept since the batch was observed, or formed once when
    several keep A_r; None (each forms its own) when none keeps it, or when the rows' Gram is not in A yet, or
    they have several stamps."""
    keeping = [ln for ln in cands.primaries() if len(ln.state.arrays.gram_labelled)]
    stamps = None if observed_at is None else np.asarray(observed_at, dtype=np.float64)
    if (
        not keeping
        or (gram_in is not None and not np.all(gram_in))
        or (stamps is not None and stamps.size > 1 and np.ptp(stamps) > 0)
    ):
        return None, False
    kept = cands.batch_grams.take(features_t)
    if kept is not None or len(keeping) < 2:
        return kept, kept is not None
    if not (features_t.flags.c_contiguous and features_t.dtype in (np.float64, np.float32)):
        return None, False
    first = keeping[0]
    gram = np.zeros((first.n_layers, first.n_columns, first.n_columns))
    (step_kernels.add_grams_parallel if first.parallel else step_kernels.add_grams)(features_t, gram)
    return gram, False
