"""Snapshots: the worker's whole state as one checksummed, versioned file (SPEC §6).

File layout (``snap-<sequence>.iolsnap``, sequence zero-padded so names sort by age)::

    b"IOLSNAP\\n"              8-byte magic
    uint32 little-endian       format version (FORMAT_VERSION; see READS)
    32 bytes                   SHA-256 of the body
    body                       an .npz archive (read with allow_pickle=False, so no code is loaded):
                               "__manifest__" (UTF-8 JSON) and plain numeric / unicode arrays

Written atomically: temporary file in the same directory, fsync, rename, fsync of
the directory; the newest ``keep`` files are kept. Loading walks from the newest
file back and skips, with a warning, any that is truncated, fails its checksum or
cannot be parsed. A file of another format version is never skipped: it stops the
load (rolling the model back to an older snapshot would be silent data loss).

The write has a test-only crash point (``iolstream.ops.faults``).
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

from iolstream.ops.faults import crash_point

MAGIC = b"IOLSNAP\n"
# Format versions: 1, the first; 2, forgetting and auto (model clock, candidates and their selector, target
# scaling; pending rows carry their clock stamp and every candidate's outputs). A build writes
# FORMAT_VERSION and reads READS: a reader of version 1 refuses a version-2 file (SnapshotVersionError,
# naming both versions), while version-1 files still load here and continue as they would have.
FORMAT_VERSION = 2
READS = (1, 2)
_HEADER = struct.Struct("<8sI32s")
PATTERN = "snap-*.iolsnap"
log = logging.getLogger("iolstream.snapshot")


class SnapshotError(ValueError):
    """A snapshot file that is damaged (truncated, corrupted, unparsable)."""


class SnapshotVersionError(SnapshotError):
    """A snapshot of a format version this build does not read."""


@dataclass
class Snapshot:
    """One snapshot as read or written: its file, manifest, arrays, size and the time it took."""

    path: Path
    manifest: dict
    arrays: dict[str, np.ndarray]
    size_bytes: int
    seconds: float = 0.0  # write time (encode, write, fsync, rename) or read time (read, verify, parse)


def encode_parts(manifest: dict, arrays: dict[str, np.ndarray]) -> tuple[bytes, memoryview]:
    """(header, body) of a snapshot, the body a view of the archive buffer: a writer writes
    both without first joining them, a copy of the whole snapshot less in memory at once.
    Arrays must be plain (no object dtype: nothing that pickles)."""
    for name, value in arrays.items():
        if np.asarray(value).dtype.hasobject:
            raise TypeError(
                f"snapshot array {name!r} has an object dtype; only numeric and unicode arrays are stored"
            )
    buf = io.BytesIO()
    payload = dict(arrays)
    payload["__manifest__"] = np.frombuffer(json.dumps(manifest, sort_keys=True).encode(), dtype=np.uint8)
    np.savez(buf, **payload)
    body = buf.getbuffer()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()), body


def encode(manifest: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """Header + body bytes of a snapshot (see ``encode_parts``)."""
    header, body = encode_parts(manifest, arrays)
    return b"".join((header, body))


def read_header(blob: bytes) -> dict:
    """What the header says, without trusting the body: version and checksum status.

    Returns {"bytes", "magic_ok", "version", "checksum_ok"}; raises SnapshotError if there is no header.
    """
    if len(blob) < _HEADER.size:
        raise SnapshotError(f"truncated: {len(blob)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, digest = _HEADER.unpack_from(blob)
    return {
        "bytes": len(blob),
        "magic_ok": magic == MAGIC,
        "version": version,
        "checksum_ok": magic == MAGIC and hashlib.sha256(memoryview(blob)[_HEADER.size :]).digest() == digest,
    }


def decode(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """Verify and parse a snapshot; raises SnapshotError (or SnapshotVersionError) naming what is wrong."""
    head = read_header(blob)
    if not head["magic_ok"]:
        raise SnapshotError("not an iolstream snapshot (bad magic)")
    if head["version"] not in READS:
        raise SnapshotVersionError(
            f"format version {head['version']}; this build reads versions {READS[0]} to {READS[-1]} (writes {FORMAT_VERSION})"
        )
    if not head["checksum_ok"]:
        raise SnapshotError("checksum mismatch (truncated or corrupted)")
    try:
        with np.load(io.BytesIO(memoryview(blob)[_HEADER.size :]), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        manifest = json.loads(bytes(arrays.pop("__manifest__")).decode())
    except Exception as exc:  # a valid checksum over an unreadable archive: written by something else
        raise SnapshotError(f"unreadable archive: {type(exc).__name__}: {exc}") from None
    return manifest, arrays


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sequence_of(path: Path) -> int:
    """The sequence number in a snapshot's file name."""
    return int(path.name[len("snap-") : -len(".iolsnap")])


class SnapshotStore:
    """A directory of snapshots; keeps the newest ``keep``.

    >>> import tempfile, numpy as np
    >>> store = SnapshotStore(tempfile.mkdtemp(), keep=2)
    >>> for i in range(3):
    ...     _ = store.write({"step": i}, {"x": np.arange(3.0) * i})
    >>> [p.name for p in store.paths()]
    ['snap-000000000003.iolsnap', 'snap-000000000002.iolsnap']
    >>> snap = store.load_latest()
    >>> snap.manifest["step"], snap.arrays["x"].tolist()
    (2, [0.0, 2.0, 4.0])
    """

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be ≥ 1, got {keep}")
        self.dir = Path(directory)
        self.keep = keep
        self.dir.mkdir(parents=True, exist_ok=True)

    def paths(self) -> list[Path]:
        """Snapshot files, newest first."""
        return sorted(self.dir.glob(PATTERN), key=sequence_of, reverse=True)

    def write(self, manifest: dict, arrays: dict[str, np.ndarray]) -> Snapshot:
        """1. encode and checksum 2. write a temporary file 3. fsync it 4. rename it into place
        5. fsync the directory 6. delete all but the newest ``keep``. A crash anywhere leaves
        either the previous set of snapshots or the new one, never a half-written snapshot."""
        t0 = time.perf_counter()
        paths = self.paths()
        seq = sequence_of(paths[0]) + 1 if paths else 1
        manifest = dict(manifest, sequence=seq, written_at_ms=int(time.time() * 1000))
        header, body = encode_parts(manifest, arrays)
        size = len(header) + len(body)
        final = self.dir / f"snap-{seq:012d}.iolsnap"
        tmp = self.dir / f".tmp-{seq:012d}-{os.getpid()}"
        with open(tmp, "wb") as fh:
            half = len(body) // 2
            fh.write(header)
            fh.write(body[:half])
            crash_point("in_snapshot")  # test-only: killed in the middle of the write
            fh.write(body[half:])
            fh.flush()
            os.fsync(fh.fileno())
        del body  # the archive buffer goes now, not after the clean-up below
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        for old in self.paths()[self.keep :]:
            old.unlink(missing_ok=True)
        return Snapshot(final, manifest, arrays, size, time.perf_counter() - t0)

    def load_latest(self) -> Snapshot | None:
        """The newest valid snapshot, skipping damaged ones with a warning; None if there is none.

        Raises SnapshotVersionError if a snapshot newer than the one loaded has another format version.
        """
        for stale in self.dir.glob(".tmp-*"):
            stale.unlink(missing_ok=True)  # a write that never reached its rename
        for path in self.paths():
            try:
                return read(path)
            except SnapshotVersionError as exc:
                raise SnapshotVersionError(f"{path}: {exc}") from None
            except (OSError, SnapshotError) as exc:
                log.warning("skipping damaged snapshot %s (%s); trying the previous one", path.name, exc)
        return None


def read(path) -> Snapshot:
    """Read and verify one snapshot file (raises SnapshotError, or OSError if it cannot be read)."""
    t0 = time.perf_counter()
    blob = Path(path).read_bytes()
    manifest, arrays = decode(blob)
    return Snapshot(Path(path), manifest, arrays, len(blob), time.perf_counter() - t0)
