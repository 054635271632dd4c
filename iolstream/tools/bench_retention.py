"""``iolstream bench --suite retention``: what the retention store of forget requests costs (docs/design.md §13).

A ``stream.retention.RetentionStore`` of ``--retention-rows`` rows (default 1,000,000, the default
``retention.rows``) in a temporary directory, small config (k = 10 features, a class label): it is filled in
batches of 256 rows (``append``, as the stream writes a predicted batch) and labelled batch by batch
(``label``), then asked for rows again:

- ``bytes_per_row``: a record on disk; ``disk_bytes_per_row``: the segment files' allocated bytes over the rows
  held (the window, plus the segment beyond it); ``index_bytes_per_row``: the in-memory index;
- ``append_rows_per_second``, ``label_rows_per_second``: the writes the stream adds per row;
- ``find_read_us``: finding one id and reading its record (a forget request of one id), warm page cache,
  over random ids of the window; ``find_read_batch_us_per_id``: the same for requests of 256 ids;
- ``cold_read_us``: a record read after its segment's pages were dropped from the page cache
  (``posix_fadvise`` DONTNEED after a flush; a disk read), where the platform allows it;
- ``flush_seconds``: writing the dirty pages of the whole window to disk (what a snapshot's ``flush`` costs
  at most, after a snapshot interval that rewrote the window);
- ``calibrated``: the record of a calibrated classifier (3 classes, the default mode: auto, two candidates: k + 1 + K·m = 17 numbers),
  as the worker writes it: a ``StreamProcessor`` with the store its model asks for (``record_shape``), fed
  ``--retention-rows`` / 8 rows (at least 2 segments) with their labels; ``bytes_per_row``, ``disk_bytes_per_row``
  (allocated bytes of the segment files over the rows held), and ``scored``: the share of labelled records
  whose scores were written (not NaN);
- ``processor``: the worker's stream logic (``StreamProcessor``, messages from memory, labels one batch late)
  with and without a retention store, in turn (best of 3 each), on batch messages of 256 rows and on one-row
  messages: rows/s, and ``cost`` = rows/s without ÷ rows/s with.

Machines here are shared: the rates are of this run, the bytes are exact.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import orjson

from iolstream.stream.retention import LABELLED, RetentionStore

K, BATCH = 10, 256


def run_retention(args) -> dict:
    rows = args.retention_rows
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="iolstream-retention-") as tmp:
        store = RetentionStore(tmp, n_features=K, n_labels=1, rows=rows)
        ids = [f"row-{i}" for i in range(rows)]
        x = rng.standard_normal((BATCH, K))
        append_s = label_s = 0.0
        for start in range(0, rows, BATCH):
            batch = ids[start : start + BATCH]
            t0 = time.perf_counter()
            store.append(batch, x[: len(batch)], stamp=start + len(batch), at_ms=start)
            t1 = time.perf_counter()
            store.label(batch, rng.integers(0, 10, (len(batch), 1)).astype(float))
            t2 = time.perf_counter()
            append_s, label_s = append_s + t1 - t0, label_s + t2 - t1
        t0 = time.perf_counter()
        store.flush()
        flush_s = time.perf_counter() - t0
        picks = rng.integers(0, rows, 2000)
        t0 = time.perf_counter()
        for i in picks.tolist():
            _, seqs = store.find([ids[i]])
            store.read(seqs)
        one_us = (time.perf_counter() - t0) / len(picks) * 1e6
        batches = [[ids[i] for i in rng.integers(0, rows, BATCH).tolist()] for _ in range(50)]
        t0 = time.perf_counter()
        for batch in batches:
            _, seqs = store.find(batch)
            store.read(seqs)
        batch_us = (time.perf_counter() - t0) / (50 * BATCH) * 1e6
        cold = _cold_read_us(store, ids, rng)
        out = {
            "suite": "retention",
            "rows": rows,
            "bytes_per_row": store.bytes_per_row,
            "disk_bytes_per_row": store.disk_bytes() / rows,
            "index_bytes_per_row": store.index.nbytes / rows,
            "append_rows_per_second": rows / append_s,
            "label_rows_per_second": rows / label_s,
            "find_read_us": one_us,
            "find_read_batch_us_per_id": batch_us,
            "cold_read_us": cold,
            "flush_seconds": flush_s,
        }
    out["calibrated"] = _calibrated_record(max(2 * 65_536, rows // 8))
    out["processor"] = {
        "batch_messages": _processor_pair(60_000, 256),
        "one_row_messages": _processor_pair(20_000, 1),
    }
    return out


def _processor_pair(rows: int, per_message: int, rounds: int = 3) -> dict:
    """rows/s of the stream logic without and with a retention store, measured in turn (best of ``rounds``)."""
    best = {"without": 0.0, "with": 0.0}
    for _ in range(rounds):
        for kind in best:
            with tempfile.TemporaryDirectory(prefix="iolstream-retention-") as tmp:
                best[kind] = max(
                    best[kind], _processor_rate(rows, per_message, tmp if kind == "with" else None)
                )
    return {
        "rows_per_second_without": best["without"],
        "rows_per_second_with": best["with"],
        "cost": best["without"] / best["with"],
    }


def _calibrated_record(rows: int) -> dict:
    """The retention record of a calibrated 3-class model, measured on the files the stream logic wrote."""
    from iolstream.core.model import EdRVFL, ModelConfig
    from iolstream.stream.config import StreamConfig
    from iolstream.stream.processor import StreamProcessor
    from iolstream.stream.retention import record_shape

    cfg = ModelConfig(n_inputs=K, classes=(0, 1, 2), n_nodes=32, n_layers=2, warmup_rows=BATCH)
    model = EdRVFL(cfg)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="iolstream-retention-") as tmp:
        store = RetentionStore(tmp, **record_shape(cfg), rows=1_000_000)
        proc = StreamProcessor(model, StreamConfig(batch_rows=BATCH, label_batch_rows=BATCH), retention=store)
        for start in range(0, rows, BATCH):
            ids = [f"r{i}" for i in range(start, start + BATCH)]
            x = rng.standard_normal((BATCH, K))
            proc.on_features(orjson.dumps({"ids": ids, "x": x.tolist()}), ("f", 0, start), 0)
            proc.step(0)
            y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 1).astype(int)
            proc.on_labels(orjson.dumps({"ids": ids, "y": y.tolist()}), ("l", 0, start), 0)
            proc.step(0)
        proc.step(0, force=True)
        store.flush()
        _, seqs = store.find([f"r{i}" for i in range(BATCH, rows, 97)])  # past the warm-up's hold
        records = store.read(seqs)
        labelled = records["status"] == LABELLED
        return {
            "rows": rows,
            "n_scores": store.n_scores,
            "bytes_per_row": store.bytes_per_row,
            "disk_bytes_per_row": store.disk_bytes() / rows,
            "scored": float(np.mean(~np.isnan(records["scores"][labelled]).any(axis=1)))
            if labelled.any()
            else 0.0,
        }


def _processor_rate(rows: int, per_message: int, directory: str | None) -> float:
    from iolstream.core import step_tuner
    from iolstream.core.model import EdRVFL, ModelConfig
    from iolstream.stream.config import StreamConfig
    from iolstream.stream.processor import StreamProcessor

    cfg = ModelConfig(
        n_inputs=K, classes=tuple(range(10)), n_nodes=128, n_layers=4, warmup_rows=256, track_regret=False
    )
    model = EdRVFL(cfg)
    step_tuner.configure_for_model(model)
    store = None if directory is None else RetentionStore(directory, n_features=K, n_labels=1, rows=1_000_000)
    proc = StreamProcessor(model, StreamConfig(batch_rows=BATCH, label_batch_rows=BATCH), retention=store)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((rows, K)), rng.integers(0, 10, rows)
    messages = []
    for start in range(0, rows, per_message):
        ids = [f"r{i}" for i in range(start, min(start + per_message, rows))]
        if per_message == 1:
            messages.append(
                (
                    orjson.dumps({"id": ids[0], "x": x[start].tolist()}),
                    orjson.dumps({"id": ids[0], "y": int(y[start])}),
                )
            )
        else:
            sl = slice(start, start + len(ids))
            messages.append(
                (
                    orjson.dumps({"ids": ids, "x": x[sl].tolist()}),
                    orjson.dumps({"ids": ids, "y": y[sl].tolist()}),
                )
            )
    warm = max(1, 2 * BATCH // per_message)
    t0, late = None, []
    for i, (feat, lab) in enumerate(messages):
        if i == warm:
            t0 = time.perf_counter()
        proc.on_features(feat, ("f", 0, i), 0)
        proc.step(0)
        late.append(lab)
        if len(late) > BATCH // per_message:  # labels a batch late
            proc.on_labels(late.pop(0), ("l", 0, i), 0)
    proc.step(0, force=True)
    return (rows - warm * per_message) / (time.perf_counter() - t0)


def _cold_read_us(store: RetentionStore, ids: list[str], rng) -> float | None:
    """One id found and read after its segment's pages left the page cache (None: the platform cannot drop them)."""
    if not hasattr(os, "posix_fadvise"):
        return None
    store.flush()
    times = []
    for i in rng.integers(0, len(ids), 50).tolist():
        _, seqs = store.find([ids[i]])
        store.close()  # its memory maps go: the read opens the segment again, from a cold file
        for path in store.dir.glob("seg-*.rows"):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        t0 = time.perf_counter()
        store.read(seqs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)
