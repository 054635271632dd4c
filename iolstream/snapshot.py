"""Snapshots: the worker's whole state as one checksummed, versioned file (SPEC §6).

File layout (``snap-<sequence>.iolsnap``)::

    b"IOLSNAP\\n"              8-byte magic
    uint32 little-endian       format version
    32 bytes                   SHA-256 of the body
    body                       an .npz archive (loaded with allow_pickle=False):
                               "__manifest__" (UTF-8 JSON) and plain numeric/unicode arrays

Written atomically: temporary file in the same directory, fsync, rename, fsync of
the directory. Loading walks from the newest file back and skips (with a
warning) any that is truncated, fails its checksum, or cannot be parsed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"IOLSNAP\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI32s")
log = logging.getLogger("iolstream.snapshot")


class SnapshotError(ValueError):
    """A snapshot file that is damaged or of an unknown format."""


@dataclass
class Snapshot:
    path: Path
    manifest: dict
    arrays: dict[str, np.ndarray]
    size_bytes: int
    seconds: float = 0.0  # write or read time


def encode(manifest: dict, arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    payload = dict(arrays)
    payload["__manifest__"] = np.frombuffer(json.dumps(manifest, sort_keys=True).encode(), dtype=np.uint8)
    np.savez(buf, **payload)
    body = buf.getvalue()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()) + body


def decode(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """Verify and parse a snapshot; raises SnapshotError naming what is wrong."""
    if len(blob) < _HEADER.size:
        raise SnapshotError(f"truncated: {len(blob)} bytes, shorter than the header")
    magic, version, digest = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise SnapshotError("not an iolstream snapshot (bad magic)")
    if version != FORMAT_VERSION:
        raise SnapshotError(f"format version {version}, this build reads {FORMAT_VERSION}")
    body = blob[_HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("checksum mismatch (truncated or corrupted)")
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # a valid checksum over an unreadable archive: written by something else
        raise SnapshotError(f"unreadable archive: {exc}") from None
    manifest = json.loads(bytes(arrays.pop("__manifest__")).decode())
    return manifest, arrays


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotStore:
    """A directory of snapshots; keeps the newest ``keep``."""

    def __init__(self, directory, keep: int = 3):
        self.dir = Path(directory)
        self.keep = keep
        self.dir.mkdir(parents=True, exist_ok=True)

    def paths(self) -> list[Path]:
        """Snapshot files, newest first."""
        return sorted(self.dir.glob("snap-*.iolsnap"), reverse=True)

    def _next_sequence(self) -> int:
        paths = self.paths()
        return int(paths[0].stem.split("-")[1]) + 1 if paths else 1

    def write(self, manifest: dict, arrays: dict[str, np.ndarray]) -> Snapshot:
        t0 = time.perf_counter()
        seq = self._next_sequence()
        manifest = dict(manifest, sequence=seq, written_at_ms=int(time.time() * 1000))
        blob = encode(manifest, arrays)
        final = self.dir / f"snap-{seq:012d}.iolsnap"
        tmp = self.dir / f".tmp-{seq:012d}-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        for old in self.paths()[self.keep :]:
            old.unlink(missing_ok=True)
        return Snapshot(final, manifest, arrays, len(blob), time.perf_counter() - t0)

    def load_latest(self) -> Snapshot | None:
        """The newest valid snapshot, skipping damaged ones with a warning; None if there is none."""
        for stale in self.dir.glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # a write that never reached its rename
        for path in self.paths():
            t0 = time.perf_counter()
            try:
                blob = path.read_bytes()
                manifest, arrays = decode(blob)
            except (OSError, SnapshotError) as exc:
                log.warning("skipping damaged snapshot %s: %s", path.name, exc)
                continue
            return Snapshot(path, manifest, arrays, len(blob), time.perf_counter() - t0)
        return None


def read(path) -> Snapshot:
    """Read and verify one snapshot file (raises SnapshotError)."""
    t0 = time.perf_counter()
    blob = Path(path).read_bytes()
    manifest, arrays = decode(blob)
    return Snapshot(Path(path), manifest, arrays, len(blob), time.perf_counter() - t0)
