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
    print("model      " + " ".join(f"{k}={v}" for k, v in m.get("config", {}).items()))
    stream = m.get("stream", {})
    print("counters   " + " ".join(f"{k}={v}" for k, v in stream.get("counters", {}).items()))
    print("learner    " + " ".join(f"{k}={v}" for k, v in m.get("counters", {}).items()))
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
