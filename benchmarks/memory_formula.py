"""The worker's memory and snapshot formulas (``iolstream.ops.footprint``) against a real worker's peak RSS and its
snapshots: the table of docs/benchmarks.md, "Memory" (the formulas: docs/operations.md, Memory bounds, Snapshot size).

For each config (the quickstart's ``config/minimal.yaml``, its ``lam: auto``, and the poker config: k = 10,
m = 10, N = 989, L = 5, b = 2200; all at the default ``mode: auto``; ``tiny`` and ``tiny-forward``, a 16-node
model, measure the process itself) on fresh topics of a local broker: pre-produce
``--rows`` rows and their labels (one message later, as ``bench --suite kafka`` does), run ``iolstream run
--stop-at-end`` on them (its kernels in Numba's cache beforehand, as after a first start), and report its peak
RSS (VmHWM, read every 20 ms), the size of the snapshot it wrote at
the end, and the formulas' values: the snapshot's model part plus 17 bytes per remembered id, the memory's
``fixed`` part (what does not wait in a store), and its total with every store at its bound (the pod limit).

    nice -n 10 .venv/bin/python benchmarks/memory_formula.py [--configs minimal lam-auto poker] [--bootstrap HOST:PORT]
    # another build's worker (e.g. a checkout of an older commit), for a before/after comparison:
    nice -n 10 .venv/bin/python benchmarks/memory_formula.py --worker-pythonpath /path/to/checkout

Needs a broker (``bash scripts/kafka.sh start``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import orjson
import yaml

from iolstream.kafka.config import config_from_dict
from iolstream.ops import footprint
from iolstream.tools import bench_kafka, bench_names
from iolstream.tools.bench_kafka import WorkerProcess

REPO = Path(__file__).resolve().parent.parent


def configs(bootstrap: str, snap_root: Path) -> dict[str, dict]:
    """name -> the worker's raw config, on fresh topics of ``bootstrap``."""
    minimal = yaml.safe_load((REPO / "config" / "minimal.yaml").read_text())
    out = {
        "minimal": {**minimal},
        "lam-auto": {**minimal, "model": {**minimal["model"], "lam": "auto"}},
        # a 16-node model: the process's own RSS (footprint.PROCESS_BYTES)
        "tiny": {**minimal, "model": {**minimal["model"], "n_nodes": 16, "n_layers": 1}},
        "tiny-forward": {
            **minimal,
            "model": {**minimal["model"], "n_nodes": 16, "n_layers": 1, "mode": "forward"},
        },
        "poker": {
            **{k: v for k, v in minimal.items() if k != "events"},  # arrays: {"ids", "x"}
            "model": {
                "n_inputs": 10,
                "classes": list(range(10)),
                "n_nodes": 989,
                "n_layers": 5,
                "warmup_rows": 256,
            },
            "stream": {"batch_rows": 2200, "label_batch_rows": 2200},
        },
    }
    for name, raw in out.items():
        u = uuid.uuid4().hex[:8]
        raw["kafka"] = {"bootstrap_servers": bootstrap, "group_id": f"footprint-{u}"}
        raw["topics"] = {
            t: f"footprint-{name}-{u}-{t}" for t in ("features", "labels", "predictions", "dead_letters")
        }
        raw["snapshot"] = {"dir": str(snap_root / name), "every_seconds": 3600, "every_batches": 10**6}
        raw["metrics"] = {"port": 0}
        raw["durability"] = {"watchdog_seconds": 900}  # a poker step on a busy 2-core machine took over 60 s
        raw["logging"] = {"level": "WARNING"}
    return out


def data(name: str, rows: int):
    if name == "poker":
        return bench_kafka._data(rows)
    rng = np.random.default_rng(1)  # the quickstart's events: an amount, a country, is_fraud
    amount = rng.lognormal(3.0, 1.0, rows).round(2)
    country = rng.choice(["FR", "DE", "US", "GB"], rows)
    return np.column_stack([amount, country]), (amount > 80.0) & (country != "FR")


def produce_events(bootstrap: str, raw: dict, X, y, batch_rows: int) -> None:
    """The quickstart's named-field events (``config/minimal.yaml``), a JSON array of ``batch_rows`` per message,
    each label message one message later."""
    ids, label = raw["events"]["id_field"], raw["events"]["label_field"]
    p = bench_kafka._producer(bootstrap)
    prev = None
    for start in range(0, len(X), batch_rows):
        part = range(start, min(start + batch_rows, len(X)))
        feats = [{ids: f"o{i}", "amount": float(X[i, 0]), "country": str(X[i, 1])} for i in part]
        bench_kafka._send(p, raw["topics"]["features"], orjson.dumps(feats))
        if prev is not None:
            bench_kafka._send(p, raw["topics"]["labels"], prev)
        prev = orjson.dumps([{ids: f"o{i}", label: bool(y[i])} for i in part])
        p.poll(0)
    if prev is not None:
        bench_kafka._send(p, raw["topics"]["labels"], prev)
    p.flush(60)


def run(name: str, raw: dict, rows: int, bootstrap: str, workdir: Path, pythonpath: str | None) -> dict:
    X, y = data(name, rows)
    cfg = config_from_dict(raw, environ={})
    bench_kafka._ensure(raw)
    batch = raw.get("stream", {}).get("batch_rows", 256)
    if "events" in raw:
        produce_events(bootstrap, raw, X, y, batch)
    else:
        bench_kafka._produce_stream(
            bench_kafka._producer(bootstrap),
            raw["topics"]["features"],
            raw["topics"]["labels"],
            X,
            y,
            batch_rows=batch,
        )
    command = [sys.executable, "-m", "iolstream", "run"]
    if pythonpath:  # -P: not the working directory's iolstream first
        command = ["env", f"PYTHONPATH={pythonpath}", sys.executable, "-P", "-m", "iolstream", "run"]
    # the kernels this model takes, compiled into Numba's cache first: the worker loads them, as after its first
    # start (compiling them, the first start peaks tens of MB higher: docs/operations.md, the kernel cache)
    subprocess.run(
        [
            *command[:-3],  # the interpreter (and its PYTHONPATH)
            "-c",
            f"from iolstream.stream import kernel_warmup; from iolstream.kafka.config import config_from_dict; "
            f"kernel_warmup.preload(config_from_dict({raw!r}, environ={{}}).model)",
        ],
        check=True,
    )
    worker = WorkerProcess(raw, workdir, stop_at_end=True, command=command)
    worker.check(worker.wait(timeout=3600))
    snaps = sorted(Path(raw["snapshot"]["dir"]).glob("snap-*.iolsnap"))
    estimate = footprint.memory(cfg, threads=os.cpu_count() or 1)
    model_snapshot = footprint.snapshot_model_bytes(cfg.model, cfg.stream.batch_rows)
    return {
        "config": name,
        "rows": rows,
        "peak_rss_mb": (worker.peak_rss_bytes or 0) / 2**20,
        "snapshot_mb": snaps[-1].stat().st_size / 2**20 if snaps else float("nan"),
        "formula_snapshot_mb": (model_snapshot + 17 * rows) / 2**20,
        "formula_fixed_mb": estimate.fixed / 2**20,
        "formula_total_mb": estimate.total / 2**20,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=["minimal", "lam-auto", "poker"])
    p.add_argument("--rows", type=int, default=20_000, help="rows streamed (poker: at least 10 batches)")
    p.add_argument("--bootstrap", default=f"127.0.0.1:{os.environ.get('KAFKA_PORT', '19092')}")
    p.add_argument("--worker-pythonpath", help="run the worker of another checkout (PYTHONPATH)")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="iolstream-footprint-"))
    all_configs = configs(args.bootstrap, workdir)
    print(
        "| config | rows | peak RSS (MB) | formula: fixed / at the bounds (MB) | snapshot (MB) | formula (MB) |"
    )
    print("|---|---|---|---|---|---|")
    try:
        for name in args.configs:
            rows = max(args.rows, 22_000) if name == "poker" else args.rows
            r = run(name, all_configs[name], rows, args.bootstrap, workdir, args.worker_pythonpath)
            print(
                f"| {name} | {rows:,} | {r['peak_rss_mb']:.0f} | {r['formula_fixed_mb']:.0f} / {r['formula_total_mb']:.0f} "
                f"| {r['snapshot_mb']:.2f} | {r['formula_snapshot_mb']:.2f} |",
                flush=True,
            )
    finally:
        bench_names.delete_topics(
            args.bootstrap, [t for name in args.configs for t in all_configs[name]["topics"].values()]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
