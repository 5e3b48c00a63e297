"""Tests for proxy_agent.protocol.ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy_agent.protocol.ids import STRING_ID_SEPARATOR, IdAllocator
from proxy_agent.protocol.rangeset import RangeSet, RangeSetError


def test_first_id_follows_base_and_base_is_never_handed_out():
    alloc = IdAllocator(100)
    assert alloc.base_id == 100
    first = alloc.allocate_one("machine")
    assert first == 101
    handed = [first] + [alloc.allocate_one(kind) for kind in ("node", "job", "queue") * 50]
    assert 100 not in handed
    assert all(n > 100 for n in handed)


def test_base_zero():
    alloc = IdAllocator(0, block_size=2)
    assert list(alloc.allocate("x", 3)) == [1, 2, 3]


def test_allocate_returns_contiguous_ranges():
    alloc = IdAllocator(10, block_size=8)
    got = alloc.allocate("node", 5)
    assert isinstance(got, range) and got == range(11, 16)
    assert alloc.allocate("node", 3) == range(16, 19)


def test_interleaved_kinds_each_stay_contiguous():
    alloc = IdAllocator(1000)
    nodes, jobs = [], []
    for i in range(1000):
        nodes.append(alloc.allocate_one("node"))
        if i % 3 == 0:
            jobs.append(alloc.allocate_one("job"))
    assert len(RangeSet.from_ids(nodes).intervals) == 1
    assert len(RangeSet.from_ids(jobs).intervals) == 1
    assert not set(nodes) & set(jobs)


def test_a_kind_allocating_alone_grows_its_block_without_gaps():
    alloc = IdAllocator(7, block_size=16)
    ids = [alloc.allocate_one("proc") for _ in range(1000)]
    assert ids == list(range(8, 1008))
    more = alloc.allocate("proc", 100)
    assert more.start == 1008


def test_exhausted_block_after_other_reservations_moves_to_a_fresh_block():
    alloc = IdAllocator(0, block_size=4)
    a = [alloc.allocate_one("a") for _ in range(3)]  # block 1-4
    b = alloc.allocate("b", 2)  # block 5-8
    a += alloc.allocate("a", 2)  # 1 left in a's block: does not fit -> fresh block 9-12
    assert a == [1, 2, 3, 9, 10]
    assert list(b) == [5, 6]
    assert alloc.allocate_one("b") == 7
    assert alloc.allocate_one("a") == 11


def test_large_counts_reserve_whole_blocks():
    alloc = IdAllocator(50, block_size=4096)
    procs = alloc.allocate("process", 1_000_000)
    assert len(procs) == 1_000_000 and procs.start == 51
    node = alloc.allocate_one("node")
    # 1,000,000 rounded up to whole blocks of 4096 is 245 blocks.
    assert node == 51 + 245 * 4096
    assert node not in procs
    assert RangeSet.from_ids(procs).intervals == ((51, 1_000_050),)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        IdAllocator(-1)
    with pytest.raises(ValueError):
        IdAllocator(1, block_size=0)
    with pytest.raises(TypeError):
        IdAllocator(1.5)  # type: ignore[arg-type]
    alloc = IdAllocator(1)
    for bad in (0, -3):
        with pytest.raises(ValueError):
            alloc.allocate("node", bad)
    with pytest.raises(TypeError):
        alloc.allocate("node", 2.0)  # type: ignore[arg-type]


def test_string_ids():
    alloc = IdAllocator(100)
    assert STRING_ID_SEPARATOR == ":"
    assert alloc.string_id("login1") == "100:login1"
    assert alloc.string_id("job-7.2") == "100:job-7.2"
    assert alloc.string_id("42") == "100:42"
    assert alloc.string_id("x") == alloc.string_id("x")  # deterministic


@pytest.mark.parametrize("bad", ["", " ", "a b", "a,b", ",", "tab\there", "new\nline", "nul\0", "caf\u00e9"])
def test_string_id_rejects_bad_unique_parts(bad):
    with pytest.raises(ValueError):
        IdAllocator(5).string_id(bad)


def test_string_id_rejects_non_strings():
    with pytest.raises(TypeError):
        IdAllocator(5).string_id(7)  # type: ignore[arg-type]


@given(
    st.integers(0, 10**9),
    st.text(alphabet=[chr(c) for c in range(0x21, 0x7F) if chr(c) != ","], min_size=1, max_size=12),
)
def test_string_ids_never_look_numeric_or_like_range_sets(base, unique):
    sid = IdAllocator(base).string_id(unique)
    assert sid.startswith(f"{base}:")
    assert not sid.isdigit()
    with pytest.raises(RangeSetError):
        RangeSet.parse(sid)
    with pytest.raises(ValueError):
        int(sid)


@given(
    st.integers(0, 10**6),
    st.integers(1, 16),
    st.lists(st.tuples(st.sampled_from(["node", "job", "process", "queue"]), st.integers(1, 40)), max_size=80),
)
def test_ids_are_unique_and_above_the_base(base, block_size, requests):
    alloc = IdAllocator(base, block_size=block_size)
    seen = set()
    per_kind = {}
    for kind, count in requests:
        got = alloc.allocate(kind, count)
        assert len(got) == count and got.step == 1
        assert got.start > base
        assert seen.isdisjoint(got)
        seen.update(got)
        per_kind.setdefault(kind, []).extend(got)
    assert base not in seen
    for ids in per_kind.values():
        assert ids == sorted(ids)  # each kind's ids only ever increase
