"""Group learning simulated in one process (no Kafka): K members sharing their sums against one worker.

The stream is cut the way a consumer group cuts it: row i's id ("r<i>") hashes to one of ``partitions``
partitions (CRC-32, as stable as Kafka's key hash), and partition p belongs to member p mod K. Every
member micro-batches its own rows in stream order (``batch_rows``) and runs the worker's -F step: the
labels of its previous batch are folded in, then the batch enters A and is predicted (labels one batch
late, docs/design.md §2). Every ``sync_rows`` rows of its own, a member publishes its own cumulative sums
(``stream.group.GroupState``, the Kafka worker's bookkeeping); before each of its batches it applies
the newest record of every other member published so far, as the worker does every poll cycle: the
others' rows reach it with a lag of up to ``sync_rows`` of theirs.
With ``exchange=False`` the members publish nothing: today's independent per-member models.

The warm-up scaler: one worker fits it on the stream's first ``warmup_rows`` rows; a group agrees on the
first proposal in the log (``GroupState.agree_scaling``): the member whose ``warmup_rows``-th own row
comes first; independent members each fit their own.

The prequential metric is the accuracy of every row's prediction (made before its label is learned),
over the whole stream in stream order; K = 1 is the single worker.

    >>> import numpy as np
    >>> from iolstream.core.model import ModelConfig
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((600, 4)); y = (x[:, 0] > 0).astype(int)
    >>> cfg = ModelConfig(n_inputs=4, classes=(0, 1), n_nodes=16, n_layers=2, track_regret=False)
    >>> one = simulate_group(x, y, cfg, members=1, batch_rows=50)
    >>> two = simulate_group(x, y, cfg, members=2, batch_rows=50, sync_rows=100)
    >>> two.rows == one.rows == 600 and two.records_applied > 0
    True
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from iolstream.core import contribution, step_tuner
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.group import GroupState

__all__ = ["GroupSimResult", "final_sums_gap", "owners", "quality_table", "simulate_group"]


@dataclass
class GroupSimResult:
    """One simulated run.

    accuracy        : prequential accuracy over every row (the group's, all members' predictions together)
    member_rows     : (K,) rows each member saw
    records_applied : sums records applied, all members together
    seconds         : wall-clock seconds of the whole run; ``sync_seconds`` of it in publish + apply
    models          : the members' final models (after a last exchange when ``exchange``)
    correct         : (n,) bool, whether each row's prediction was right (stream order)
    """

    members: int
    exchange: bool
    sync_rows: int | None
    batch_rows: int
    rows: int
    accuracy: float
    member_rows: list
    records_published: int
    records_applied: int
    seconds: float
    sync_seconds: float
    models: list = field(default_factory=list, repr=False)
    correct: np.ndarray | None = field(default=None, repr=False)

    def summary(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("models", "correct")}
        out["rows_per_second"] = self.rows / max(self.seconds, 1e-12)
        if (
            self.correct is not None and len(self.correct) >= 2
        ):  # early rows weigh the most where learning is steep
            out["accuracy_second_half"] = float(self.correct[len(self.correct) // 2 :].mean())
        return out


def owners(n_rows: int, members: int, partitions: int | None = None) -> np.ndarray:
    """(n_rows,) the member of every row: CRC-32 of its id "r<i>" mod ``partitions`` (default K), mod K."""
    if members < 1:
        raise ValueError(f"members: must be ≥ 1, got {members!r}")
    partitions = members if partitions is None else partitions
    if partitions < members:
        raise ValueError(f"partitions: must be ≥ members ({members}), got {partitions!r}")
    part = (
        np.fromiter((zlib.crc32(f"r{i}".encode()) for i in range(n_rows)), dtype=np.int64, count=n_rows)
        % partitions
    )
    return part % members


def _fit_scaler(model: EdRVFL, head: np.ndarray) -> None:
    scaler = model.scaler
    if scaler.mode != "warmup" or scaler.frozen:
        return
    scaler.partial_fit(head[: model.config.warmup_rows])
    scaler.freeze()  # fewer rows than warmup_rows: freeze on what there is


def simulate_group(
    x: np.ndarray,
    y: np.ndarray,
    config: ModelConfig,
    *,
    members: int,
    batch_rows: int,
    sync_rows: int | None = None,
    exchange: bool = True,
    partitions: int | None = None,
) -> GroupSimResult:
    """Run the stream (x: (n, k) float, y: (n,) labels in ``config.classes``) through K members (module docstring).

    sync_rows : a member publishes and applies every this many rows of its own (required when K > 1 and exchange)
    """
    if config.task != "classification":
        raise ValueError("simulate_group: classification configs only (the metric is accuracy)")
    if batch_rows < 1:
        raise ValueError(f"batch_rows: must be ≥ 1, got {batch_rows!r}")
    exchange = exchange and members > 1
    if exchange and (sync_rows is None or sync_rows < 1):
        raise ValueError(f"sync_rows: must be ≥ 1 for a group that exchanges its sums, got {sync_rows!r}")
    n = len(x)
    owner = owners(n, members, partitions)
    own_rows = [np.flatnonzero(owner == j) for j in range(members)]
    models = [EdRVFL(config) for _ in range(members)]
    step_tuner.configure_for_model(models[0])
    warm = config.warmup_rows
    if exchange:  # the first proposal in the log: the member whose warm-up rows are in first
        first = min(
            range(members),
            key=lambda j: own_rows[j][min(warm, len(own_rows[j])) - 1] if len(own_rows[j]) else n,
        )
        _fit_scaler(models[first], x[own_rows[first]])
        state = models[first].scaler.to_state()
        for m in models:
            if m is not models[first] and m.scaler.mode == "warmup":
                m.scaler.load_state(state)
    else:
        for j, m in enumerate(models):
            _fit_scaler(m, x[own_rows[j]])
    states = [GroupState(f"m{j}", m) for j, m in enumerate(models)] if exchange else []
    log: dict[str, tuple] = {}  # member -> its newest published (seq, sums, meta): a compacted topic
    # the batch events in stream order: (position of the batch's last row, member, the batch's rows)
    events = []
    for j, rows in enumerate(own_rows):
        for start in range(0, len(rows), batch_rows):
            chunk = rows[start : start + batch_rows]
            events.append((int(chunk[-1]), j, chunk))
    events.sort(key=lambda e: e[0])
    label_index = {c: i for i, c in enumerate(config.classes)}
    y_index = np.fromiter((label_index[v] for v in y.tolist()), dtype=np.int64, count=n)
    pending: list = [None] * members
    since_sync = [0] * members
    hits = np.zeros(n, dtype=bool)
    published = applied = 0
    sync_seconds = 0.0
    models[0].predict(x[:1])  # loads the JIT-compiled kernels outside the timed part
    t0 = time.perf_counter()

    def take(j: int, clock: int) -> None:
        """Member j applies every other member's newest record not applied yet (the worker polls every cycle)."""
        nonlocal applied, sync_seconds
        tic = time.perf_counter()
        st = states[j]
        for member, (seq, sums, meta) in log.items():
            if (
                member != st.member
                and st.apply(member, seq, sums, published_ms=clock, now_ms=clock, **meta) == "applied"
            ):
                applied += 1
        sync_seconds += time.perf_counter() - tic

    def sync(j: int, clock: int) -> None:
        nonlocal published, sync_seconds
        tic = time.perf_counter()
        st = states[j]
        if st.changed():
            seq, sums, meta = st.next_record()  # meta: the member's clocks, for apply
            st.published(seq)
            log[st.member] = (seq, sums, meta)
            published += 1
        sync_seconds += time.perf_counter() - tic
        take(j, clock)

    for pos, j, chunk in events:
        m = models[j]
        if exchange:
            take(j, pos)
        if pending[j] is not None:
            pred, rows = pending[j]
            m.learn(pred.features_t, m.one_hot(y_index[rows]), predicted=pred.predicted)
        pred = m.observe(x[chunk])
        hits[chunk] = pred.index == y_index[chunk]
        pending[j] = (pred, chunk)
        since_sync[j] += len(chunk)
        if exchange and since_sync[j] >= sync_rows:
            sync(j, pos)
            since_sync[j] = 0
    for j, m in enumerate(models):  # end of stream: every outstanding label arrives
        if pending[j] is not None:
            pred, rows = pending[j]
            m.learn(pred.features_t, m.one_hot(y_index[rows]), predicted=pred.predicted)
    if exchange:  # a last exchange: every member's final sums reach every other
        for j in range(members):
            sync(j, n)
        for j in range(members):
            sync(j, n)
    seconds = time.perf_counter() - t0
    return GroupSimResult(
        members=members,
        exchange=exchange,
        sync_rows=sync_rows if exchange else None,
        batch_rows=batch_rows,
        rows=n,
        accuracy=float(hits.mean()) if n else 0.0,
        member_rows=[len(r) for r in own_rows],
        records_published=published,
        records_applied=applied,
        seconds=seconds,
        sync_seconds=sync_seconds,
        models=models,
        correct=hits,
    )


def final_sums_gap(result: GroupSimResult, single: GroupSimResult) -> float:
    """Largest relative difference between any member's final Gram and right-hand-side sums and the single
    worker's (scale: the largest entry of each array)."""
    want = contribution.sums(single.models[0])
    gap = 0.0
    for m in result.models:
        got = contribution.sums(m)
        for key in want:
            if key.endswith((".gram", ".rhs", ".labelled")):
                scale = max(float(np.abs(want[key]).max()), 1e-300)
                gap = max(gap, float(np.abs(got[key] - want[key]).max()) / scale)
    return gap


def quality_table(
    x: np.ndarray,
    y: np.ndarray,
    config: ModelConfig,
    *,
    batch_rows: int,
    sync_rows: int | None,
    member_counts=(2, 3),
    split_batch: bool = False,
    on_result=None,
) -> dict:
    """The single worker, then for every K in ``member_counts`` the group (syncing every ``sync_rows`` own rows)
    and the independent members, on the same stream. Returns {"single": summary, "runs": [summary + gaps]}, where
    ``gap`` = the single worker's accuracy − this run's (positive: behind it); ``on_result(summary)`` after each.

    ``split_batch``: a member cuts batches of batch_rows // K rows of its own (and, with ``sync_rows`` None,
    syncs after every batch), so that a batch spans as many stream rows as the single worker's and the labels
    are as late in stream rows; otherwise every member cuts ``batch_rows`` rows of its own, K times as many
    stream rows: its labels arrive K times later in the stream."""
    single = simulate_group(x, y, config, members=1, batch_rows=batch_rows)
    out = {"single": single.summary(), "runs": []}
    if on_result is not None:
        on_result(out["single"])
    for k in member_counts:
        member_batch = max(1, batch_rows // k) if split_batch else batch_rows
        sync = member_batch if sync_rows is None else sync_rows
        for exchange in (True, False):
            r = simulate_group(
                x, y, config, members=k, batch_rows=member_batch, sync_rows=sync, exchange=exchange
            )
            summary = r.summary()
            summary["gap"] = single.accuracy - r.accuracy
            summary["gap_second_half"] = (
                out["single"]["accuracy_second_half"] - summary["accuracy_second_half"]
            )
            summary["kind"] = "group" if exchange else "independent"
            if exchange:
                summary["final_sums_gap"] = final_sums_gap(r, single) if config.scaler == "none" else None
            out["runs"].append(summary)
            if on_result is not None:
                on_result(summary)
            del r
    return out
