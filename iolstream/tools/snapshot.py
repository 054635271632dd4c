"""``iolstream snapshot inspect PATH``: what a worker snapshot holds, and whether it is intact.

PATH is a snapshot file, or a snapshot directory (each file, newest first, with its status;
then the newest valid one in detail). The detail is the format version, checksum status,
size, sequence and write time, the model config, the counters, the input offsets, and every
array with its shape and size. Exit code 0 if the snapshot (a directory: its newest valid one)
is valid, 1 if it is damaged or there is none.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

EXIT_DAMAGED = 1


def add_parser(subparsers):
    p = subparsers.add_parser("snapshot", help="inspect worker snapshots")
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    i = actions.add_parser(
        "inspect", help="print what a snapshot holds: format, config, counters, offsets, sizes, checksum"
    )
    i.add_argument("path", help="a snapshot file (snap-*.iolsnap) or a snapshot directory")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    i.set_defaults(func=inspect)
    return p


def describe(path: Path) -> dict:
    """Everything ``inspect`` reports about one file, damaged or not."""
    from iolstream.kafka import snapshots as snapshot

    out: dict = {"path": str(path), "valid": False, "error": None}
    t0 = time.perf_counter()
    try:
        blob = path.read_bytes()
    except OSError as exc:
        out["error"] = f"cannot read: {exc}"
        return out
    out["bytes"] = len(blob)
    try:
        head = snapshot.read_header(blob)
        out.update(format_version=head["version"], checksum_ok=head["checksum_ok"])
        manifest, arrays = snapshot.decode(blob)
    except snapshot.SnapshotError as exc:
        out["error"] = str(exc)
        return out
    out["valid"] = True
    out["read_seconds"] = round(time.perf_counter() - t0, 4)
    out["manifest"] = manifest
    out["arrays"] = {
        k: {"dtype": str(v.dtype), "shape": list(v.shape), "bytes": int(v.nbytes)}
        for k, v in sorted(arrays.items())
    }
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _print_detail(d: dict) -> None:
    print(f"snapshot   {d['path']}")
    if not d["valid"]:
        version = d.get("format_version")
        print(
            f"status     DAMAGED: {d['error']}"
            + (f" (header: format version {version})" if version is not None else "")
        )
        if "bytes" in d:
            print(f"size       {_mb(d['bytes'])} ({d['bytes']:,} bytes)")
        return
    m = d["manifest"]
    print(f"status     valid: format version {d['format_version']}, SHA-256 checksum ok")
    print(
        f"size       {_mb(d['bytes'])} ({d['bytes']:,} bytes), read and verified in {d['read_seconds']:.3f} s"
    )
    written = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(m.get("written_at_ms", 0) / 1000))
    print(f"sequence   {m.get('sequence')}, written {written}")
    if "worker" in m:
        print("worker     " + " ".join(f"{k}={v}" for k, v in m["worker"].items()))
    print("model      " + " ".join(f"{k}={v}" for k, v in _model_keys(m.get("config", {})).items()))
    stream = m.get("stream", {})
    print("counters   " + " ".join(f"{k}={v}" for k, v in stream.get("counters", {}).items()))
    for line in _learners(m):
        print(line)
    dead = {k: v for k, v in stream.get("dead_letters", {}).items() if v}
    print("dead       " + (" ".join(f"{k}={v}" for k, v in dead.items()) or "none"))
    offsets = m.get("offsets", [])
    print(
        "offsets    "
        + ("(none: nothing consumed)" if not offsets else f"next offset to read, {len(offsets)} partitions")
    )
    for topic, partition, offset in offsets:
        print(f"           {topic}[{partition}] {offset}")
    total = sum(a["bytes"] for a in d["arrays"].values())
    print(f"arrays     {len(d['arrays'])} arrays, {_mb(total)}")
    for name, a in d["arrays"].items():
        print(
            f"           {name:<32} {a['dtype']:<8} {'×'.join(map(str, a['shape'])) or 'scalar':<12} {_mb(a['bytes'])}"
        )


_REGRESSION_ONLY = ("n_outputs", "target_scaler", "target_mean", "target_std")


def _model_keys(config: dict) -> dict:
    """The model config as saved, less the keys of the other task (a classifier's outputs are its classes)."""
    if config.get("classes") is None:
        return config
    return {k: v for k, v in config.items() if k not in _REGRESSION_ONLY}


def _learners(m: dict) -> list[str]:
    """One line per learner: its counters (format 1: the one learner; format 2: every candidate of ``auto``,
    its mode, λ and half-life, the one in force marked)."""
    candidates = m.get("candidates")
    if candidates is None:  # format 1: one learner, its counters at the top level
        counters = m.get("counters", {})
        return ["learner    " + (" ".join(f"{k}={v}" for k, v in counters.items()) or "(no counters)")]
    selection = m.get("selection", {})
    grid, modes = selection.get("grid", []), selection.get("modes", [])
    chosen = selection.get("chosen", 0)
    out = []
    for i, cand in enumerate(candidates):
        lam, half_life = grid[i] if i < len(grid) else (None, None)
        what = [f"mode={modes[i]}"] if i < len(modes) else []
        what += [f"lam={lam:g}"] if isinstance(lam, (int, float)) else []
        what += [f"half_life={half_life:g}"] if isinstance(half_life, (int, float)) else []
        head = "learner    " if i == 0 else "           "
        mark = " (in force)" if i == chosen and len(candidates) > 1 else ""
        counters = " ".join(f"{k}={v}" for k, v in cand.get("counters", {}).items())
        out.append(f"{head}{i}{mark}: {' '.join(what)} {counters}".rstrip())
    return out


def inspect(args) -> int:
    from iolstream.kafka.snapshots import PATTERN, sequence_of

    path = Path(args.path)
    if path.is_dir():
        files = sorted(path.glob(PATTERN), key=sequence_of, reverse=True)
        details = [describe(f) for f in files]
        newest = next((d for d in details if d["valid"]), None)
        if args.json:
            print(json.dumps({"directory": str(path), "snapshots": details}, indent=1, default=str))
        else:
            print(f"directory  {path}: {len(files)} snapshots, newest first")
            for d in details:
                status = "valid" if d["valid"] else f"DAMAGED: {d['error']}"
                print(f"           {Path(d['path']).name}  {_mb(d.get('bytes', 0)):>10}  {status}")
            if newest is not None:
                print()
                _print_detail(newest)
        return 0 if newest is not None else EXIT_DAMAGED
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    d = describe(path)
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        _print_detail(d)
    return 0 if d["valid"] else EXIT_DAMAGED
