"""iolstream.stream.recent_ids: fingerprints of ids, and the bounded FIFO of remembered ids in fixed memory,
checked against an OrderedDict (what the join buffer used before) and a plain-Python hash."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolstream.stream.recent_ids import (
    FINGERPRINT_BATCHES,
    FINGERPRINT_VERSION,
    RecentIds,
    fingerprint,
    fingerprints,
)

MASK = 2**64 - 1


def _murmur(h: int) -> int:
    h ^= h >> 33
    h = h * 0xFF51AFD7ED558CCD & MASK
    h ^= h >> 33
    h = h * 0xC4CEB9FE1A85EC53 & MASK
    return h ^ h >> 33


def _splitmix(h: int) -> int:
    h ^= h >> 30
    h = h * 0xBF58476D1CE4E5B9 & MASK
    h ^= h >> 27
    h = h * 0x94D049BB133111EB & MASK
    return h ^ h >> 31


def naive_fingerprint(s: str) -> tuple[int, int]:
    """The documented hash, in plain Python: two sponges over the code points, then the length."""
    h1, h2 = 0x9E3779B97F4A7C15, 0x6A09E667F3BCC909
    for ch in s:
        c = ord(ch)
        h1 = _murmur(h1 ^ c)
        h2 = _splitmix(h2 ^ (c * 0xD6E8FEB86659FD93 & MASK))
    h1 = _murmur(h1 ^ (len(s) * 0xA0761D6478BD642F & MASK))
    h2 = _splitmix(h2 ^ len(s))
    signed = lambda v: v - 2**64 if v >= 2**63 else v  # noqa: E731
    return signed(h1), signed(h2)


def test_fingerprints_are_pinned():
    """Snapshots store fingerprints: changing the hash needs a new FINGERPRINT_VERSION (and a reader of the old)."""
    assert FINGERPRINT_VERSION == 1
    assert fingerprints(["a", "b0", "row-10-1", "é✓\U0001f600", "x" * 256]).tolist() == [
        [-7904419522214053494, 8472883891359002293],
        [2024160956328923034, 6113955657544732242],
        [-3023781382190100098, -2475203452085305220],
        [-5406522280568284019, 7319637464585264949],
        [-2182429471246697824, 8165519762026705767],
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=20), max_size=8))
def test_fingerprints_equal_the_plain_python_hash(ids):
    assert fingerprints(ids).tolist() == [list(naive_fingerprint(s)) for s in ids]
    assert [fingerprint(s) for s in ids] == [naive_fingerprint(s) for s in ids]  # one id, passed as a str


def test_fingerprints_do_not_depend_on_the_array_width_or_byte_order():
    ids = ["a", "bb", "ccc"]
    want = fingerprints(ids)
    assert want.dtype == np.int64 and want.shape == (3, 2)
    assert np.array_equal(fingerprints(np.array(ids, dtype="<U40")), want)
    assert np.array_equal(fingerprints(np.array(ids, dtype=">U3")), want)
    assert np.array_equal(fingerprints(ids[1:]), want[1:])  # one id's fingerprint ignores its neighbours
    assert fingerprints([]).shape == (0, 2)


def test_fingerprints_of_many_similar_ids_are_distinct():
    ids = (
        [f"b{i}" for i in range(300_000)]
        + [f"{i:08x}" for i in range(300_000)]
        + ["ab", "ba", "a" * 255 + "b"]
    )
    fps = fingerprints(ids)
    for lane in (fps[:, 0], fps[:, 1]):  # each lane alone is collision-free here too
        assert len(np.unique(lane)) == len(ids)


# ------------------------------------------------------------ the FIFO, against an OrderedDict

OP = st.one_of(
    st.tuples(st.just("add_many"), st.lists(st.integers(0, 12), max_size=6), st.sampled_from([1, 2])),
    st.tuples(st.just("add"), st.lists(st.integers(0, 12), min_size=1, max_size=1), st.sampled_from([1, 2])),
    st.tuples(
        st.just("session"),
        st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=8),
        st.sampled_from([1, 2]),
    ),
)


class Reference:
    """What the join buffer did before: an OrderedDict as a FIFO (assignment keeps an id's place)."""

    def __init__(self, capacity: int):
        self.capacity, self.d = capacity, OrderedDict()

    def add(self, key: str, kind: int) -> None:
        self.d[key] = kind
        while len(self.d) > self.capacity:
            self.d.popitem(last=False)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6), st.lists(OP, max_size=30))
def test_recent_ids_behave_as_an_ordered_dict_fifo(capacity, ops):
    mem, ref = RecentIds(capacity), Reference(capacity)
    for op, args, kind in ops:
        if op == "session":  # interleaved lookups and additions, one row at a time, then one commit
            ids = [f"id{i}" for _, i in args]
            session = mem.session(ids)
            for is_add, i in args:
                if is_add:
                    session.add(f"id{i}", kind)
                    ref.add(f"id{i}", kind)
                else:
                    assert session.get(f"id{i}") == ref.d.get(f"id{i}", 0)
            session.commit()
        else:
            ids = [f"id{i}" for i in args]
            if op == "add_many":
                mem.add_many(fingerprints(ids), kind)
            else:
                mem.add(*fingerprints(ids)[0].tolist(), kind)
            for key in ids:
                ref.add(key, kind)
        probe = [f"id{i}" for i in range(13)]
        assert mem.kinds(fingerprints(probe)).tolist() == [ref.d.get(key, 0) for key in probe]
        assert mem.any(fingerprints(probe)) == bool(ref.d)
        assert len(mem) == len(ref.d)
        fps, kinds = mem.to_arrays()
        assert fps.tolist() == fingerprints(list(ref.d)).tolist() and kinds.tolist() == list(ref.d.values())
        _, ranks = mem.lookup(fingerprints(list(ref.d)))
        assert ranks.tolist() == list(range(len(ref.d)))


def test_a_session_forgets_the_oldest_as_its_additions_overflow():
    mem = RecentIds(2)
    mem.add_many(fingerprints(["x", "y"]), 1)
    s = mem.session(["x", "y", "z", "w"])
    assert s.get("x") == 1
    s.add("z", 2)  # pushes "x" out at once
    assert (s.get("x"), s.get("y"), s.get("z")) == (0, 1, 2)
    s.add("x", 1)  # back in, as the newest: "y" goes
    assert (s.get("x"), s.get("y"), s.get("z"), s.get("w")) == (1, 0, 2, 0)
    assert len(mem) == 2 and mem.kinds(fingerprints(["x", "y", "z"])).tolist() == [
        1,
        1,
        0,
    ]  # nothing applied yet
    s.commit()
    assert mem.kinds(fingerprints(["x", "y", "z"])).tolist() == [1, 0, 2]


def test_memory_is_allocated_once_and_stays_fixed():
    mem = RecentIds(200_000)
    before = mem.nbytes
    assert before <= 6 * 2**20  # ~27 bytes per id, allocated up front
    arrays = (mem._table, mem._ring, mem._kinds)
    for start in range(0, 1_000_000, 50_000):
        mem.add_many(fingerprints([f"r{i}" for i in range(start, start + 50_000)]), 1)
    assert len(mem) == 200_000 and mem.nbytes == before
    assert all(a is b for a, b in zip(arrays, (mem._table, mem._ring, mem._kinds)))  # never reallocated
    kinds = mem.kinds(fingerprints([f"r{i}" for i in (0, 799_999, 800_000, 999_999)]))
    assert kinds.tolist() == [0, 0, 1, 1]  # exactly the last 200,000


def test_zero_capacity_remembers_nothing():
    mem = RecentIds(0)
    mem.add_many(fingerprints(["a"]), 1)
    mem.add(1, 2, 1)
    s = mem.session(["a"])
    s.add("a", 1)
    assert s.get("a") == 0
    s.commit()
    assert (
        len(mem) == 0 and mem.kinds(fingerprints(["a"])).tolist() == [0] and not mem.any(fingerprints(["a"]))
    )


@pytest.mark.parametrize("ids", [[], ["a"], ["a", "b", "a", "c"]])
def test_remember_by_id_equals_the_fingerprint_calls(ids):
    """``remember`` / ``remembers_any`` (ids in; one id takes the scalar path) answer as
    ``add_many`` / ``any`` on the fingerprints."""
    by_id, by_fp = RecentIds(3), RecentIds(3)
    by_id.remember(ids, 2)
    by_fp.add_many(fingerprints(ids), 2)
    assert by_id.to_arrays()[0].tolist() == by_fp.to_arrays()[0].tolist()
    assert by_id.to_arrays()[1].tolist() == by_fp.to_arrays()[1].tolist()
    for probe in (["a"], ["zz"], ["zz", "c"], []):
        assert by_id.remembers_any(probe) == (bool(probe) and by_fp.any(fingerprints(probe)))
    assert not RecentIds(0).remembers_any(["a"])


def test_fingerprints_of_reuses_the_last_batches_by_their_content():
    """A batch's ids are hashed once however often they are asked for (a new list with the same ids
    included); the answer is always ``fingerprints`` of them, and only FINGERPRINT_BATCHES lists are kept."""
    mem = RecentIds(10)
    batches = [[f"{start}-{i}" for i in range(5)] for start in range(FINGERPRINT_BATCHES + 2)]
    first = mem.fingerprints_of(batches[0])
    assert mem.fingerprints_of(list(batches[0])) is first  # same ids, another list: not hashed again
    assert mem.fingerprints_of(batches[0][::-1]) is not first  # order matters
    for ids in batches:
        assert mem.fingerprints_of(ids).tolist() == fingerprints(ids).tolist()
    assert len(mem._recent_fps) == FINGERPRINT_BATCHES
    assert mem.fingerprints_of(batches[0]) is not first  # pushed out, hashed again: the same values
    assert mem.fingerprints_of(batches[0]).tolist() == first.tolist()
