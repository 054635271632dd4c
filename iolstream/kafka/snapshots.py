"""Snapshot directories of the worker: written atomically, the newest ``keep`` kept (the file format and
its reading are ``core.snapshot_file``, re-exported here).

Written atomically: temporary file in the same directory, fsync, rename, fsync of
the directory; the newest ``keep`` files are kept. Loading walks from the newest
file back and skips, with a warning, any that is truncated, fails its checksum or
cannot be parsed. A file of another format version is never skipped: it stops the
load (rolling the model back to an older snapshot would be silent data loss).

The write has a test-only crash point (``iolstream.ops.faults``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from iolstream.core.snapshot_file import (
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    PATTERN,
    READS,
    Snapshot,
    SnapshotError,
    SnapshotVersionError,
    decode,
    encode,
    encode_parts,
    load_newest,
    paths,
    read,
    read_header,
    sequence_of,
)
from iolstream.ops.faults import crash_point

__all__ = [
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "PATTERN",
    "READS",
    "Snapshot",
    "SnapshotError",
    "SnapshotStore",
    "SnapshotVersionError",
    "decode",
    "encode",
    "encode_parts",
    "read",
    "read_header",
    "sequence_of",
]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        return paths(self.dir)

    def next_name(self) -> str:
        """The file name the next ``write`` gives its snapshot."""
        paths = self.paths()
        return f"snap-{(sequence_of(paths[0]) + 1 if paths else 1):012d}.iolsnap"

    def delete_older(self, name: str) -> list[str]:
        """Delete every snapshot older than the one named ``name`` (they hold rows forgotten since: docs/design.md
        §13); returns the names deleted."""
        seq = sequence_of(self.dir / name)
        gone = []
        for old in self.paths():
            if sequence_of(old) < seq:
                old.unlink(missing_ok=True)
                gone.append(old.name)
        if gone:
            _fsync_dir(self.dir)
        return gone

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
        return load_newest(self.dir)
