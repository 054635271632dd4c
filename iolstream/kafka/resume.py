"""What a worker resumes with: the processor and input positions of the newest snapshot, or a fresh processor when
there is none. A snapshot made with another model config is refused (``mismatch``, which ``iolstream check`` says
too). Every processor made here gets the config's retention store and group learning's scaling agreement;
the checkpointer (``kafka.checkpoints``) reads the snapshot and keeps its own bookkeeping from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from iolstream.core import state_io
from iolstream.core.model import EdRVFL
from iolstream.core.state_io import StateFormatError
from iolstream.kafka.config import WorkerConfig
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.offsets import fmt
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.retention import RetentionStore, record_shape
from iolstream.stream.scaler_warmup import ScalingAgreement

log = logging.getLogger("iolstream.worker")
# model keys a restart may change: how much the candidates not in force are scored, not what the sums hold
FREE_MODEL_KEYS = ("scoring_share",)


@dataclass
class Loaded:
    """What a worker resumes with: the processor, the input positions it covers, and the group learning state
    saved with it (None: none)."""

    processor: StreamProcessor
    positions: dict
    group: tuple[dict, dict] | None = None
    topic_ids: dict = field(default_factory=dict)  # {topic: id} the positions are of (older snapshots: none)


def retention_store(cfg: WorkerConfig) -> RetentionStore | None:
    """The retention store of forget requests (docs/design.md §13), None without ``topics.forget``."""
    directory = cfg.retention_dir
    if directory is None:
        return None
    return RetentionStore(
        directory,
        **record_shape(cfg.model),
        rows=cfg.retention.rows,
        ms=cfg.retention.ms,
    )


def fresh(cfg: WorkerConfig, agreement: ScalingAgreement | None) -> Loaded:
    """A fresh processor of ``cfg``'s model, no position yet."""
    proc = StreamProcessor(
        EdRVFL(cfg.model),
        cfg.stream,
        window_rows=cfg.metrics.window_rows,
        agreement=agreement,
        retention=retention_store(cfg),
        events=cfg.events,
    )
    proc.erasure.load_state(None)  # a fresh model: no row of an earlier one is kept
    return Loaded(proc, {})


def restored(cfg: WorkerConfig, snap, agreement: ScalingAgreement | None) -> Loaded:
    """The processor, positions, group state and topic ids ``snap`` holds; ``WorkerError`` if this worker cannot
    resume from it (``mismatch``, or contents that are not ours)."""
    if (why := mismatch(cfg, snap)) is not None:
        raise WorkerError(why)
    try:
        proc = StreamProcessor.from_state(
            snap.manifest,
            snap.arrays,
            cfg.stream,
            window_rows=cfg.metrics.window_rows,
            agreement=agreement,
            retention=retention_store(cfg),
            events=cfg.events,
        )
    except (StateFormatError, KeyError, ValueError) as exc:  # checksum fine, contents not ours
        raise WorkerError(f"snapshot {snap.path} cannot be restored: {exc}") from None
    proc.model.set_scoring_share(cfg.model.scoring_share)  # this config's, whatever the snapshot's
    positions = {(t, int(p)): int(o) for t, p, o in snap.manifest["offsets"]}
    seeded = snap.manifest.get("worker", {}).get("seeded_from")
    log.info(
        "loaded snapshot %s (%d bytes, %.3f s): %s%d rows in, %d labelled, offsets %s",
        snap.path.name,
        snap.size_bytes,
        snap.seconds,
        "" if not seeded else f"seeded from {seeded.get('rows')} rows of {seeded.get('csv')}; since: ",
        proc.counters["rows_in"],
        proc.counters["rows_learned"],
        fmt(positions) or "none (every partition is read from its beginning)",
        extra={"event": "snapshot_loaded", "snapshot": snap.path.name},
    )
    loaded = Loaded(proc, positions)
    loaded.topic_ids = dict(snap.manifest.get("worker", {}).get("topic_ids", {}))
    if "group" in snap.manifest:
        group_arrays = {k: v for k, v in snap.arrays.items() if k.startswith("group/")}
        loaded.group = (snap.manifest["group"], group_arrays)
    return loaded


def mismatch(cfg: WorkerConfig, snap) -> str | None:
    """Why the worker of ``cfg`` cannot resume from ``snap`` (its model config differs in a key a restart may not
    change, or its config cannot be read), else None. ``run`` stops with this line (exit 3); ``check`` says it."""
    try:  # as this build spells it: a version-1 snapshot has no forgetting / target_scaler keys
        saved_config = state_io.saved_config(snap.manifest)
    except StateFormatError as exc:
        return f"snapshot {snap.path} cannot be restored: {exc}"
    saved, wanted = saved_config.to_dict(), cfg.model.to_dict()
    # a default spelled out is the same model: ensemble null is the task's rule (softmax, mean)
    saved["ensemble"], wanted["ensemble"] = saved_config.ensemble_rule, cfg.model.ensemble_rule
    keys = list(wanted) + (["features"] if "features" in saved and "features" not in wanted else [])
    diff = [k for k in keys if k not in FREE_MODEL_KEYS and _jsonish(wanted.get(k)) != _jsonish(saved.get(k))]
    if not diff:
        return None
    named = [f"model.{k} ({_short(saved.get(k))} there, {_short(wanted.get(k))} here)" for k in diff]
    if "features" in diff:  # a schema changes the encoded width too: the schema says what changed
        schema = cfg.model.schema
        what = (
            schema.changes(saved_config.schema)
            if schema is not None
            else ["the saved model reads named fields, this config has no model.features"]
        )
        named = [n for k, n in zip(diff, named) if k not in ("features", "n_inputs")]
        named.append(f"model.features: {'; '.join(what)}")
    return (
        f"snapshot {snap.path} was made with a different model config ({', '.join(named)}): restore that config, "
        "or move the snapshot directory away to start a fresh model"
    )


def _short(value) -> str:
    text = repr(_jsonish(value))
    return text if len(text) <= 40 else text[:37] + "..."


def _jsonish(value):
    if isinstance(value, tuple):
        return [_jsonish(v) for v in value]
    return value
