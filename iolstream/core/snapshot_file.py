"""The snapshot file format: the worker's whole state as one checksummed, versioned file.

File layout (``snap-<sequence>.iolsnap``, sequence zero-padded so names sort by age)::

    b"IOLSNAP\\n"              8-byte magic
    uint32 little-endian       format version (FORMAT_VERSION; see READS)
    32 bytes                   SHA-256 of the body
    body                       an .npz archive (read with allow_pickle=False, so no code is loaded):
                               "__manifest__" (UTF-8 JSON) and plain numeric / unicode arrays

Reading lives here, in core, so that the public API reads a worker's model for batch scoring
(``load_snapshot``) without the Kafka adapter; writing a snapshot directory (atomically, keeping the
newest few) is ``kafka.snapshots.SnapshotStore``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iolstream.core import state_io

MAGIC = b"IOLSNAP\n"
# Format versions: 1, the first; 2, forgetting and auto (model clock, candidates and their selector, target
# scaling; pending rows carry their clock stamp and every candidate's outputs). A build writes
# FORMAT_VERSION and reads READS: a reader of version 1 refuses a version-2 file (SnapshotVersionError,
# naming both versions), while version-1 files still load here and continue as they would have. 3: the model
# holds only what cannot be derived (``state_io``: A and A_r packed, c, a Woodbury P; no β, no Cholesky factor,
# no candidate's copy of its primary's sums); versions 1 and 2 load as written.
FORMAT_VERSION = 3
READS = (1, 2, 3)
HEADER = struct.Struct("<8sI32s")
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
    return HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()), body


def encode(manifest: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """Header + body bytes of a snapshot (see ``encode_parts``)."""
    header, body = encode_parts(manifest, arrays)
    return b"".join((header, body))


def read_header(blob: bytes) -> dict:
    """What the header says, without trusting the body: version and checksum status.

    Returns {"bytes", "magic_ok", "version", "checksum_ok"}; raises SnapshotError if there is no header.
    """
    if len(blob) < HEADER.size:
        raise SnapshotError(f"truncated: {len(blob)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, digest = HEADER.unpack_from(blob)
    return {
        "bytes": len(blob),
        "magic_ok": magic == MAGIC,
        "version": version,
        "checksum_ok": magic == MAGIC and hashlib.sha256(memoryview(blob)[HEADER.size :]).digest() == digest,
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
        with np.load(io.BytesIO(memoryview(blob)[HEADER.size :]), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        manifest = json.loads(bytes(arrays.pop("__manifest__")).decode())
    except Exception as exc:  # a valid checksum over an unreadable archive: written by something else
        raise SnapshotError(f"unreadable archive: {type(exc).__name__}: {exc}") from None
    return manifest, arrays


def sequence_of(path: Path) -> int:
    """The sequence number in a snapshot's file name."""
    return int(path.name[len("snap-") : -len(".iolsnap")])


def paths(directory) -> list[Path]:
    """The snapshot files of a directory, newest first."""
    return sorted(Path(directory).glob(PATTERN), key=sequence_of, reverse=True)


def load_newest(directory) -> Snapshot | None:
    """The newest valid snapshot of ``directory``, skipping damaged ones with a warning; None if there is none.

    Raises SnapshotVersionError if a snapshot newer than the one loaded has another format version (rolling
    back to an older one would be silent data loss)."""
    for path in paths(directory):
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


def load_snapshot(path):
    """The model (an ``EdRVFL``) of a worker's snapshot, for batch scoring: ``path`` is a snapshot file, or a
    snapshot directory (its newest valid snapshot). SnapshotError naming the path when there is none or it
    is damaged or not a worker's.

    >>> import tempfile
    >>> from iolstream.core.model import EdRVFL, ModelConfig
    >>> model = EdRVFL(ModelConfig(n_inputs=2, classes=("a", "b"), n_nodes=8, scaler="none"))
    >>> manifest, arrays = state_io.model_to_arrays(model)
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "snap-000000000001.iolsnap").write_bytes(encode(manifest, arrays))
    >>> load_snapshot(folder).config.classes
    ('a', 'b')
    """
    path = Path(path)
    if path.is_dir():
        snap = load_newest(path)
        if snap is None:
            raise SnapshotError(f"{path}: no snapshot ({PATTERN}) in this directory")
    elif path.exists():
        try:
            snap = read(path)
        except SnapshotError as exc:
            raise type(exc)(f"{path}: {exc}") from None
    else:
        raise SnapshotError(f"{path}: no such snapshot file or directory")
    try:
        return state_io.model_from_arrays(snap.manifest, snap.arrays)
    except (state_io.StateFormatError, KeyError) as exc:
        raise SnapshotError(f"{snap.path}: not a worker's model state: {exc}") from None
