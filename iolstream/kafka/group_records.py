"""Records of the model-deltas topic as Kafka messages: a ``kafka.snapshots`` blob (manifest + arrays,
checksummed) cut into chunks of at most ``group.chunk_bytes``, and put back together on the reading side.

Headers: ``iolstream.kind`` (sums | scaling | targets | rows | ask | answer | close), ``iolstream.member``,
``iolstream.seq``, ``iolstream.chunk`` ("i/n"), ``iolstream.size`` (bytes of the whole blob). Keys
``<member>/<kind>/<i>``: compaction keeps every chunk of the newest record of a kind; the records that pass a
forget request on (``stream.forwarding``) are keyed ``<member>/<kind>/<seq>/<i>``, each its own, so that a
member restarted from an older snapshot reads every one again. Chunks are reassembled by (member, sequence,
kind); chunks of an older record of the same member and kind that will not complete (compacted, or cut by
a crash) are dropped when a newer one completes.
"""

from __future__ import annotations

import logging

log = logging.getLogger("iolstream.group")

KINDS = ("sums", "scaling", "targets", "rows", "ask", "answer", "close")
EACH_KEPT = ("ask", "answer", "close")  # kinds whose every record compaction keeps (a key of its own)


class Record:
    """One record read back whole: its kind, member, sequence, blob (not decoded yet) and the size its headers
    announced (``intact``: the blob has it)."""

    __slots__ = ("blob", "kind", "member", "seq", "size")

    def __init__(self, kind: str, member: str, seq: int, blob: bytes, size: int):
        self.kind, self.member, self.seq, self.blob, self.size = kind, member, seq, blob, size

    @property
    def intact(self) -> bool:
        """The blob has the size its headers announced."""
        return len(self.blob) == self.size


def chunked(member: str, kind: str, seq: int, blob: bytes, chunk_bytes: int):
    """(key, value, headers) of each chunk of a record, in order."""
    count = max(1, -(-len(blob) // chunk_bytes))
    for index in range(count):
        headers = [
            ("iolstream.kind", kind.encode()),
            ("iolstream.member", member.encode()),
            ("iolstream.seq", str(seq).encode()),
            ("iolstream.chunk", f"{index}/{count}".encode()),
            ("iolstream.size", str(len(blob)).encode()),
        ]
        key = f"{member}/{kind}/{seq}/{index}" if kind in EACH_KEPT else f"{member}/{kind}/{index}"
        yield key.encode(), blob[index * chunk_bytes : (index + 1) * chunk_bytes], headers


class _Pending:
    """The chunks of one record read so far: ``first`` (partition, offset) of the first one read."""

    def __init__(self, count: int, size: int, first: tuple[int, int]):
        self.count, self.size, self.first = count, size, first
        self.parts: dict[int, bytes] = {}


def _header(headers, name: str) -> str | None:
    for key, value in headers or ():
        if key == name:
            return value.decode() if isinstance(value, bytes) else value
    return None


class Reassembly:
    """Chunks read so far, by (member, seq, kind); ``add`` returns a record once its last chunk is read."""

    def __init__(self):
        self.pending: dict[tuple[str, int, str], _Pending] = {}

    def __len__(self) -> int:
        return len(self.pending)

    def clear(self) -> None:
        """Forget every chunk read in part (a roll-back re-reads them)."""
        self.pending.clear()

    def first_offsets(self) -> list[tuple[int, int]]:
        """(partition, offset) of the first chunk of every record read in part: a snapshot resumes before
        them."""
        return [pending.first for pending in self.pending.values()]

    def add(self, msg) -> Record | None:
        """Take one message of the topic; the whole record when this was its last chunk, else None (also for a
        message that is no iolstream record: logged and skipped)."""
        try:
            headers = msg.headers()
            kind, member = _header(headers, "iolstream.kind"), _header(headers, "iolstream.member")
            seq = int(_header(headers, "iolstream.seq") or 0)
            index, count = (int(v) for v in (_header(headers, "iolstream.chunk") or "0/1").split("/"))
            size = int(_header(headers, "iolstream.size") or len(msg.value() or b""))
            if not (0 <= index < count and size >= 0):
                raise ValueError(f"chunk {index}/{count}, size {size}")
        except ValueError as exc:  # UnicodeDecodeError included
            where = f"{msg.partition()}@{msg.offset()}"
            log.warning("model-deltas %s: unreadable headers (%s), skipped", where, exc)
            return None
        if kind not in KINDS or member is None:
            where = f"{msg.partition()}@{msg.offset()}"
            log.warning("model-deltas %s: not an iolstream record (kind %r), skipped", where, kind)
            return None
        pending = self.pending.get((member, seq, kind))
        if pending is None or (pending.count, pending.size) != (count, size):  # another record, same seq
            pending = self.pending[(member, seq, kind)] = _Pending(
                count, size, (msg.partition(), msg.offset())
            )
        pending.parts[index] = msg.value() or b""
        if len(pending.parts) < count:
            return None
        del self.pending[(member, seq, kind)]
        for key in [k for k in self.pending if k[0] == member and k[2] == kind and k[1] < seq]:
            del self.pending[
                key
            ]  # an older record of it that will not complete (compacted, or cut by a crash)
        return Record(kind, member, seq, b"".join(pending.parts[i] for i in range(count)), size)
