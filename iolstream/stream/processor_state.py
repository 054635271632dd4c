"""A ``StreamProcessor``'s snapshot: what it consumed, written as (manifest, arrays) and read back — the model
(``core.state_io``), the warm-up hold, the batcher, the join buffer, the label queue, the prequential metric,
counters, forget requests' state. The feature cache is not kept: it is recomputed. Old formats are upgraded on
read (``stream.payload.upgrade``).
"""

from __future__ import annotations

import numpy as np

from iolstream.core import state_io
from iolstream.stream import payload
from iolstream.stream.batcher import MicroBatcher
from iolstream.stream.joinbuffer import JoinBuffer
from iolstream.stream.payload import PAYLOAD


def to_state(proc) -> tuple[dict, dict[str, np.ndarray]]:
    """(manifest, arrays) of everything ``proc`` consumed so far; the feature cache is not kept (recomputable)."""
    manifest, arrays = state_io.model_to_arrays(proc.model)
    arrays.update(proc.held.to_arrays())
    arrays.update({f"batcher/{k}": v for k, v in proc.batcher.to_state().items()})
    arrays.update({f"join/{k}": v for k, v in proc.join.to_state().items()})
    arrays.update(proc.label_queue.to_arrays())
    metric_manifest, metric_arrays = proc.metric.to_state()
    arrays.update(metric_arrays)
    arrays["last_losses"] = proc.last_losses
    manifest["stream"] = {
        "batch_seq": proc.batch_seq,
        "counters": proc.counters,
        "dead_letters": proc.dead_letters,
        "metric": metric_manifest,
        "label_queue_since_ms": proc.label_queue.since_ms,
        "last_label_rows": proc.last_label_rows,
        "early_sources": [
            [row_id, source] for row_id, _, _, source in proc.join.early_labels() if source is not None
        ],
        "payload": list(PAYLOAD),
        "erasure": proc.erasure.to_state(),
    }
    if proc.events is not None:
        manifest["stream"]["fields"] = proc.events.counts()
    return manifest, arrays


def load_state(proc, manifest: dict, arrays: dict) -> None:
    """``proc`` (new, of the state's model and config) brought to where ``to_state`` left it."""
    cfg = proc.cfg
    st = manifest["stream"]
    if proc.events is not None:
        proc.events.load_counts(st.get("fields"))
    proc.batch_seq = int(st["batch_seq"])
    proc.counters.update(st["counters"])
    proc.dead_letters.update(st["dead_letters"])
    proc.metric.load_state(st["metric"], arrays)
    proc.last_losses = np.array(arrays["last_losses"], dtype=float)
    proc.last_label_rows = int(st.get("last_label_rows", 0))
    arrays = payload.upgrade(arrays, manifest["format_version"], st.get("payload"), proc.model)
    proc.held.load_arrays(arrays)
    proc.batcher = MicroBatcher.from_state(
        {k[len("batcher/") :]: v for k, v in arrays.items() if k.startswith("batcher/")},
        max_rows=cfg.batch_rows,
        max_latency_ms=cfg.max_batch_latency_ms,
    )
    proc._queued_ids = proc.held.ids()
    if "batcher/ids" in arrays:
        proc._queued_ids.update(str(i) for i in arrays["batcher/ids"].tolist())
    proc._rescreen = set(
        proc._queued_ids
    )  # screened before the state was written: looked up again, to be safe
    proc.join = JoinBuffer.from_state(
        {k[len("join/") :]: v for k, v in arrays.items() if k.startswith("join/")},
        **cfg.join_settings(proc.target, proc.layout.width),
    )
    proc.join.set_early_sources((row_id, _tuples(source)) for row_id, source in st.get("early_sources", []))
    proc.label_queue.load_arrays(arrays, st.get("label_queue_since_ms"))
    proc.erasure.load_state(st.get("erasure", {}))


def _tuples(value):
    """JSON lists back to the tuples they were written from (sources are tuples or scalars)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
