"""The worker's footprint from its config alone: the bytes of a snapshot and of the process (docs/operations.md,
"Snapshot size" and "Memory bounds"), one formula each.

With k inputs, m outputs, L layers of N nodes, n = N + k + 1 columns (N + k without the bias column), T = n(n+1)/2,
b = ``stream.batch_rows``, K candidates and H learners that make their own updates (``learners``: one, or with
``auto`` 2 modes × 3 λ × 3 half-lives at most, one primary per half-life):

    snapshot  =  H · 8L (T + [A_r] T + n m + [Woodbury] n²)              the model: only what cannot be derived
               + 8 (51 K + m)                                            calibration sums per candidate, rows per class
               + 8 (k + 3 + K·L·m) + id per waiting row  +  17 per remembered id  +  ~80 per early label

    process   =  PROCESS_BYTES                                           Python, NumPy, SciPy, Numba's kernels,
                                                                         librdkafka: measured, fixed
               + model arrays (``model_memory``)                         weights, sums, scratch, the batch
               + 27 per remembered id                                    allocated at start
               + 3 × the model's snapshot                                while one is encoded and written
               + the stores at their bounds (``store_bounds``)           what waits: rows, labels, queues, and
                                                                         3 × its part of a snapshot

[A_r]: the -F learner keeps the labelled rows' Gram (``mode: auto``, or -F with ``track_regret``). [Woodbury]: an -F
learner on the Woodbury route (batches of b·6 ≤ n rows, no forgetting) keeps P = A⁻¹, written once updated (two
small batches in a row: a partial batch alone makes P again from A, which a snapshot need not keep). Arrays in core, ops
reads only configs: no model is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from iolstream.core.calibration import GRID_SIZE
from iolstream.core.learner import WOODBURY_RATIO

# Peak RSS of a worker process before its model and its stores: the interpreter, NumPy, SciPy, Numba with the
# kernels of a step loaded, confluent-kafka (librdkafka's threads), the metrics server. Measured on a worker with
# a 16-node model (235-241 MiB, -F or auto; benchmarks/memory_formula.py, docs/benchmarks.md "Memory").
PROCESS_BYTES = 240 * 2**20
PENDING_ROW_BYTES = 220  # besides its payload: id string, index entry, slot (docs/benchmarks.md, "Memory")
EARLY_LABEL_BYTES = 340  # a label waiting for its row, measured (ibid.)
REMEMBERED_ID_BYTES = 27  # a fingerprint, its kind and its index entry (stream.recent_ids)
SNAPSHOT_WRITE_COPIES = 3  # a snapshot's arrays, then its archive growing in memory, before the write
FEATURE_CACHE_BYTES = 256 * 2**20  # stream.feature_cache's bound
CLIENT_PREFETCH_BYTES = 16384 * 1024  # kafka.clients: queued.max.messages.kbytes


def learners(model) -> tuple[int, int]:
    """(K candidates, H learners that make their own updates) of a ``ModelConfig``."""
    return len(model.candidates), len({h for _, h in model.candidates})


def _sizes(model) -> tuple[int, int, int, int, int]:
    n = model.n_nodes + model.n_inputs + int(model.bias_column)
    return model.n_inputs, model.m, model.n_nodes, model.n_layers, n


def keeps_labelled(model) -> bool:
    """Whether the -F learners keep A_r, the labelled rows' Gram (``mode: auto``, or -F with regret tracking)."""
    return model.mode == "auto" or (model.mode == "forward" and model.track_regret)


def woodbury(model, batch_rows: int) -> bool:
    """Whether -F keeps P = A⁻¹ by Woodbury at full batches of ``batch_rows`` (``learner._uses_cholesky``)."""
    n = _sizes(model)[4]
    if model.mode == "ridge" or model.forgetting is not None or model.solver == "cholesky":
        return False
    return model.solver == "woodbury" or batch_rows * WOODBURY_RATIO <= n


def snapshot_model_bytes(model, batch_rows: int) -> int:
    """Bytes of a model's arrays in a snapshot (state_io format 3): per learner that makes its own updates, A and
    A_r (lower triangles), c, and P on the Woodbury route; per candidate its calibration sums (``GRID_SIZE``);
    classification, the labelled rows per class."""
    _, m, _, n_layers, n = _sizes(model)
    k_candidates, h = learners(model)
    tri = n * (n + 1) // 2
    per = tri * (1 + keeps_labelled(model)) + n * m + (n * n if woodbury(model, batch_rows) else 0)
    return 8 * (n_layers * h * per + k_candidates * GRID_SIZE + (m if model.task == "classification" else 0))


def pending_row_bytes(model) -> int:
    """A waiting row's payload in memory and in a snapshot: k features, position, stamp, candidate, and every
    candidate's L·m layer outputs (stream.payload)."""
    k, m, _, n_layers, _ = _sizes(model)
    return 8 * (k + 3 + learners(model)[0] * n_layers * m)


def snapshot_bytes(cfg, *, pending_rows: int | None = None, id_chars: int = 16) -> int:
    """Upper estimate of a snapshot of a worker with ``cfg`` (a WorkerConfig): the model, and what waits at the
    stores' bounds (``pending_rows``: that many rows waiting instead; ids of up to ``id_chars`` characters, stored
    as fixed-width unicode, 4 bytes a character)."""
    model, stream = cfg.model, cfg.stream
    rows = stream.max_pending_rows if pending_rows is None else pending_rows
    waiting = rows * (pending_row_bytes(model) + 4 * id_chars)
    early = min(stream.max_early_labels, rows) * (4 * id_chars + 8 * model.m + 16)
    return snapshot_model_bytes(model, stream.batch_rows) + waiting + early + 17 * stream.remember_done


def model_memory(model, batch_rows: int, threads: int, *, downdates: bool = False) -> dict[str, int]:
    """Bytes of a model's arrays while a worker runs it, by part: the random weights, every learner's sums (A, A_r,
    c and β), its factors where kept (-R, Woodbury, or ``downdates``: ``stream.forget_expired``), the candidates'
    own β, the kept batch Grams of ``auto`` with A_r (two), the scratch of the Cholesky factors (one block per
    thread), and the batch in flight (its features and every candidate's outputs). A λ or -R candidate holds no
    sums of its own (it reads its primary's)."""
    k, m, n_nodes, n_layers, n = _sizes(model)
    n_candidates, h = learners(model)
    item = 4 if model.dtype == "float32" else 8
    square = 8 * n_layers * n * n
    factors = model.mode == "ridge" or woodbury(model, batch_rows) or downdates
    return {
        "weights": item * n_layers * n_nodes * (n_nodes + k + 1),
        "sums": h * (square * (1 + keeps_labelled(model)) + 16 * n_layers * n * m),
        "factors": h * square if factors else 0,
        "candidates": (n_candidates - h) * 8 * n_layers * n * m,
        "batch_grams": 2 * square if n_candidates > 1 and keeps_labelled(model) else 0,
        # the -F step on the Cholesky route and the candidates factor in scratch memory; a lone -R learner factors
        # A in its own stack, a lone -F learner on the Woodbury route keeps P
        "scratch": h * threads * 8 * n * n
        if n_candidates > h or not (model.mode == "ridge" or woodbury(model, batch_rows))
        else 0,
        "batch": item * n_layers * n * batch_rows + 8 * n_candidates * n_layers * batch_rows * m,
    }


def store_bounds(cfg, *, members: int = 1) -> dict[str, int]:
    """Bytes of what waits, each store at its bound (a WorkerConfig ``cfg``): rows for their labels (their payload,
    and their features in the cache of predicted batches), labels for their rows, the catch-up queues of the input
    partitions, the client's prefetch, the waiting part of a snapshot while it is written; with group learning,
    the sums of ``members`` − 1 others."""
    model, stream = cfg.model, cfg.stream
    _, _, _, n_layers, n = _sizes(model)
    item = 4 if model.dtype == "float32" else 8
    partitions = 2 * cfg.topics.partitions  # features and labels
    waiting = snapshot_bytes(cfg) - snapshot_model_bytes(model, stream.batch_rows)
    out = {
        "pending_rows": stream.max_pending_rows * (pending_row_bytes(model) + PENDING_ROW_BYTES),
        "feature_cache": min(FEATURE_CACHE_BYTES, stream.max_pending_rows * n_layers * n * item),
        "early_labels": stream.max_early_labels * EARLY_LABEL_BYTES,
        "catch_up_queues": partitions * stream.align_max_queued_bytes,
        "client_prefetch": int(cfg.kafka.consumer.get("queued.max.messages.kbytes", 16384)) * 1024,
        "snapshot_write": SNAPSHOT_WRITE_COPIES * waiting,
    }
    if cfg.group.enabled:
        out["group_sums"] = (members - 1) * snapshot_model_bytes(model, stream.batch_rows)
    return out


@dataclass
class MemoryEstimate:
    """The process's bytes by part (``memory``); ``total`` the sum: a pod's memory limit with headroom above it."""

    parts: dict[str, int]

    @property
    def fixed(self) -> int:
        """Everything but the stores: about the RSS of a worker keeping up with its input."""
        return sum(v for k, v in self.parts.items() if not k.startswith("stores."))

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def memory(cfg, *, threads: int = 2, members: int = 1) -> MemoryEstimate:
    """The worker's memory formula (module docstring) for a WorkerConfig ``cfg``: ``threads`` Numba threads (the
    cores), ``members`` of a group (group learning)."""
    model, stream = cfg.model, cfg.stream
    arrays = model_memory(model, stream.batch_rows, threads, downdates=stream.forget_expired)
    parts = {"process": PROCESS_BYTES, **{f"model.{k}": v for k, v in arrays.items()}}
    parts["remembered_ids"] = stream.remember_done * REMEMBERED_ID_BYTES  # allocated at start
    parts["snapshot_write"] = SNAPSHOT_WRITE_COPIES * snapshot_model_bytes(model, stream.batch_rows)
    parts.update({f"stores.{k}": v for k, v in store_bounds(cfg, members=members).items()})
    return MemoryEstimate(parts)


__all__ = [
    "MemoryEstimate",
    "learners",
    "memory",
    "model_memory",
    "snapshot_bytes",
    "snapshot_model_bytes",
    "store_bounds",
]
