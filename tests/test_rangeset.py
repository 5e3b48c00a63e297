"""Tests for proxy_agent.protocol.rangeset."""

from __future__ import annotations

import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.protocol.rangeset import RangeSet, RangeSetError

UNIVERSE = 64
small_sets = st.sets(st.integers(min_value=0, max_value=UNIVERSE))
nonempty_small_sets = st.sets(st.integers(min_value=0, max_value=UNIVERSE), min_size=1)


def _assert_canonical(rs: RangeSet) -> None:
    previous_last = -2
    for first, last in rs.intervals:
        assert type(first) is int and type(last) is int
        assert 0 <= first <= last
        assert first > previous_last + 1, rs.intervals
        previous_last = last


# --------------------------------------------------------------------------- examples


def test_seed_examples():
    assert str(RangeSet.parse("1,2,3,4,5,6,7,34,35,36,37,38,41,55,56,57")) == "1-7,34-38,41,55-57"
    assert RangeSet.parse("1-10,4-12,3") == RangeSet.from_range(1, 12)
    assert len(RangeSet.parse("1-10,4-12,3")) == 12
    assert RangeSet.parse("1-7,34-38,55-57") == RangeSet.from_ids(
        [1, 2, 3, 4, 5, 6, 7, 34, 35, 36, 37, 38, 55, 56, 57]
    )


def test_formatting():
    assert str(RangeSet.EMPTY) == ""
    assert RangeSet.EMPTY.format() == ""
    assert str(RangeSet.single(41)) == "41"
    assert str(RangeSet.from_range(3, 4)) == "3-4"
    assert RangeSet.parse("5,3,4").format() == "3-5"
    assert str(RangeSet.parse("0")) == "0"
    assert repr(RangeSet.parse("1-3,7")) == "RangeSet('1-3,7')"


def test_adjacent_parts_merge():
    assert RangeSet.parse("1-3,4-6").intervals == ((1, 6),)
    assert RangeSet.parse("4-6,1-3,7").intervals == ((1, 7),)
    assert RangeSet.parse("1-3,5-6").intervals == ((1, 3), (5, 6))
    assert RangeSet.parse("9,9,9").intervals == ((9, 9),)


def test_leading_zeros_are_read_as_decimal():
    assert RangeSet.parse("007-010") == RangeSet.from_range(7, 10)


def test_constructor_canonicalizes_and_validates():
    assert RangeSet([(5, 6), (1, 3), (4, 4)]) == RangeSet.parse("1-6")
    assert RangeSet() == RangeSet.EMPTY
    assert not RangeSet()
    for bad in ([(-1, 2)], [(3, 2)], [(1.5, 2)], [(1,)], ["ab"]):
        with pytest.raises(RangeSetError):
            RangeSet(bad)


def test_first_last_and_empty():
    rs = RangeSet.parse("40-45,3,17")
    assert rs.first == 3 and rs.last == 45
    with pytest.raises(ValueError):
        RangeSet.EMPTY.first
    with pytest.raises(ValueError):
        RangeSet.EMPTY.last
    assert len(RangeSet.EMPTY) == 0
    assert list(RangeSet.EMPTY) == []
    assert not RangeSet.EMPTY and RangeSet.single(0)


def test_membership_edges():
    rs = RangeSet.parse("3-5,10")
    assert [n for n in range(12) if n in rs] == [3, 4, 5, 10]
    assert -1 not in rs
    assert "3" not in rs
    assert 3.0 not in rs  # ids are integers; floats are never members
    assert None not in rs
    assert True not in rs and True in RangeSet.single(1)


def test_from_range_and_single_reject_bad_input():
    with pytest.raises(RangeSetError):
        RangeSet.from_range(5, 3)
    with pytest.raises(RangeSetError):
        RangeSet.from_range(-1, 3)
    with pytest.raises(RangeSetError):
        RangeSet.single(-7)
    with pytest.raises(TypeError):
        RangeSet.single(1.0)


def test_from_ids_inputs():
    assert RangeSet.from_ids([]) is RangeSet.EMPTY
    assert RangeSet.from_ids(range(0)) is RangeSet.EMPTY
    assert RangeSet.from_ids(range(5, 10)) == RangeSet.from_range(5, 9)
    assert RangeSet.from_ids(range(0, 10, 3)) == RangeSet.parse("0,3,6,9")
    assert RangeSet.from_ids(range(9, -1, -1)) == RangeSet.from_range(0, 9)
    assert RangeSet.from_ids(x for x in (4, 2, 3)) == RangeSet.from_range(2, 4)
    assert RangeSet.from_ids((1, 2, 5)) == RangeSet.parse("1-2,5")
    assert RangeSet.from_ids({8, 7}) == RangeSet.from_range(7, 8)
    rs = RangeSet.parse("1-3")
    assert RangeSet.from_ids(rs) is rs
    # bools are ints, but the intervals must hold plain ints
    assert RangeSet.from_ids([False, True]).intervals == ((0, 1),)
    assert str(RangeSet.from_ids([True, 2])) == "1-2"


def test_from_ids_duplicates_hidden_in_sorted_input():
    # Sorted with duplicates: a dup next to a gap must not fake a full run.
    assert RangeSet.from_ids([1, 2, 2, 4]) == RangeSet.parse("1-2,4")
    assert RangeSet.from_ids([0, 2, 2, 2, 4]) == RangeSet.parse("0,2,4")
    ids = list(range(16))
    ids[9] = 8
    ids[10] = 8
    assert RangeSet.from_ids(ids) == RangeSet.from_ids(set(ids))


def test_from_ids_rejects_bad_ids():
    with pytest.raises(RangeSetError):
        RangeSet.from_ids([3, -1, 4])
    with pytest.raises(RangeSetError):
        RangeSet.from_ids([-2, -1])
    with pytest.raises(TypeError):
        RangeSet.from_ids([1, 2.5, 3])
    with pytest.raises(TypeError):
        RangeSet.from_ids([1, 2.0, 3])  # sorted, but not ints
    with pytest.raises(TypeError):
        RangeSet.from_ids(["1", "2"])
    with pytest.raises(TypeError):
        RangeSet.from_ids([1, "2"])


def test_iteration_is_lazy():
    huge = RangeSet.parse("0-4000000000,4000000005")
    iterator = iter(huge)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]


# --------------------------------------------------------------------------- rejections

REJECTED = [
    ("", None),
    ("1-", "'1-'"),
    ("-3", "'-3'"),
    ("5-3", "'5-3'"),
    ("a", "'a'"),
    ("1,,2", "part 2 ''"),
    ("1,", "part 2 ''"),
    (",1", "part 1 ''"),
    (",", "part 1 ''"),
    (" 1", "' 1'"),
    ("1 ", "'1 '"),
    ("1 -2", "'1 -2'"),
    ("1- 2", "'1- 2'"),
    ("1-2 ,3", "'1-2 '"),
    ("+1", "'+1'"),
    ("1-+2", "'1-+2'"),
    ("1-2-3", "'1-2-3'"),
    ("1--2", "'1--2'"),
    ("-", "'-'"),
    ("\u0661", repr("\u0661")),  # ARABIC-INDIC DIGIT ONE
    ("1-\u0662", repr("1-\u0662")),
    ("\uff11", repr("\uff11")),  # FULLWIDTH DIGIT ONE
    ("\u00b2", repr("\u00b2")),  # SUPERSCRIPT TWO
    ("1\n", repr("1\n")),
    ("0x10", "'0x10'"),
    ("1.5", "'1.5'"),
    ("1;2", "'1;2'"),
    ("3,4,x", "part 3 'x'"),
]


@pytest.mark.parametrize("text,mentioned", REJECTED)
def test_rejections_name_the_bad_part(text, mentioned):
    with pytest.raises(RangeSetError) as info:
        RangeSet.parse(text)
    message = str(info.value)
    assert repr(text) in message
    if mentioned is not None:
        assert mentioned in message


def test_rejection_messages_say_why():
    def why(text):
        with pytest.raises(RangeSetError) as info:
            RangeSet.parse(text)
        return str(info.value)

    assert why("1-,3") == "range set '1-,3': part 1 '1-' has no upper bound"
    assert "no lower bound" in why("-3")
    assert "reversed" in why("5-3")
    assert "empty" in why("")
    assert "empty" in why("1,,2")
    assert "more than one '-'" in why("1-2-3")
    assert "' '" in why("1 -2")


def test_rejects_non_string_and_absurdly_long_numbers():
    with pytest.raises(TypeError):
        RangeSet.parse(5)  # type: ignore[arg-type]
    with pytest.raises(RangeSetError):
        RangeSet.parse("9" * 5000)


def test_long_rejected_text_is_shortened_in_the_message():
    text = ",".join(str(n) for n in range(1000)) + ",x"
    with pytest.raises(RangeSetError) as info:
        RangeSet.parse(text)
    assert len(str(info.value)) < 300
    assert "part 1001 'x'" in str(info.value)


# --------------------------------------------------------------------------- huge ranges


def _python_lines(call):
    """``call()``'s result and how many lines of Python ran in it."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, count


def test_huge_range_is_never_expanded():
    tracemalloc.start()
    rs = RangeSet.parse("1-4000000000")
    assert len(rs) == 4000000000
    assert 1 in rs and 4000000000 in rs and 2500000000 in rs
    assert 0 not in rs and 4000000001 not in rs
    assert str(rs) == "1-4000000000"
    other = RangeSet.parse("2000000000-5000000000,7")
    assert str(rs | other) == "1-5000000000"
    assert str(rs - other) == "1-6,8-1999999999"
    assert str(rs & other) == "7,2000000000-4000000000"
    assert RangeSet.parse("2-3999999999").issubset(rs)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20  # kilobytes: four billion ids are never made


def test_from_ids_fast_path_does_python_work_per_run_not_per_id():
    ids = list(range(1, 1_000_001))
    blocks = [n for start in range(0, 2_000_000, 2000) for n in range(start + 1, start + 1001)]
    whole, whole_lines = _python_lines(lambda: RangeSet.from_ids(ids))
    blocked, blocked_lines = _python_lines(lambda: RangeSet.from_ids(blocks))
    assert whole.intervals == ((1, 1_000_000),)
    assert len(blocked.intervals) == 1000 and len(blocked) == 1_000_000
    assert blocked.intervals[1] == (2001, 3000)
    assert RangeSet.parse(str(blocked)) == blocked
    # the runs are found in C: Python lines per run (1 and 1000 of them), not per id (a million)
    assert whole_lines < 1000 and blocked_lines < 50 * 1000, (whole_lines, blocked_lines)


# --------------------------------------------------------------------------- properties


@given(small_sets)
def test_from_ids_matches_python_sets(ids):
    rs = RangeSet.from_ids(ids)
    _assert_canonical(rs)
    assert set(rs) == ids
    assert list(rs) == sorted(ids)
    assert len(rs) == len(ids)
    assert bool(rs) == bool(ids)
    for n in range(-1, UNIVERSE + 2):
        assert (n in rs) == (n in ids)
    if ids:
        assert rs.first == min(ids) and rs.last == max(ids)


@given(small_sets, st.randoms())
def test_from_ids_ignores_order_and_duplicates(ids, rnd):
    listed = list(ids) + list(ids)[: len(ids) // 2]
    rnd.shuffle(listed)
    assert RangeSet.from_ids(listed) == RangeSet.from_ids(sorted(ids))
    assert RangeSet.from_ids(sorted(listed)) == RangeSet.from_ids(ids)


@given(st.lists(st.integers(min_value=0, max_value=3), max_size=200), st.integers(0, 10))
def test_from_ids_on_sorted_lists_with_runs_gaps_and_dups(steps, start):
    # Non-decreasing lists built from steps of 0 (duplicate), 1 (run) or more (gap).
    ids = [start]
    for step in steps:
        ids.append(ids[-1] + step)
    rs = RangeSet.from_ids(ids)
    _assert_canonical(rs)
    assert set(rs) == set(ids)


@given(nonempty_small_sets)
def test_text_round_trip(ids):
    rs = RangeSet.from_ids(ids)
    text = str(rs)
    assert RangeSet.parse(text) == rs
    assert str(RangeSet.parse(text)) == text


@given(small_sets, small_sets)
def test_canonical_text_is_unique(a, b):
    assert (str(RangeSet.from_ids(a)) == str(RangeSet.from_ids(b))) == (a == b)
    assert (RangeSet.from_ids(a) == RangeSet.from_ids(b)) == (a == b)
    if a == b:
        assert hash(RangeSet.from_ids(a)) == hash(RangeSet.from_ids(b))


@given(small_sets, small_sets)
def test_algebra_matches_python_sets(a, b):
    ra, rb = RangeSet.from_ids(a), RangeSet.from_ids(b)
    for result, expected in (
        (ra | rb, a | b),
        (ra - rb, a - b),
        (ra & rb, a & b),
        (ra.union(rb), a | b),
        (ra.difference(rb), a - b),
        (ra.intersection(rb), a & b),
    ):
        _assert_canonical(result)
        assert set(result) == expected
        assert result == RangeSet.from_ids(expected)
    assert ra.issubset(rb) == (a <= b)
    assert ra.issuperset(rb) == (a >= b)
    assert ra.isdisjoint(rb) == a.isdisjoint(b)


@given(
    st.lists(
        st.tuples(st.integers(0, 2000), st.integers(0, 2000)).map(sorted),
        min_size=0,
        max_size=30,
    ),
    st.lists(
        st.tuples(st.integers(0, 2000), st.integers(0, 2000)).map(sorted),
        min_size=0,
        max_size=30,
    ),
)
def test_algebra_on_wide_intervals(xs, ys):
    a = set().union(*(range(lo, hi + 1) for lo, hi in xs))
    b = set().union(*(range(lo, hi + 1) for lo, hi in ys))
    ra, rb = RangeSet(xs), RangeSet(ys)
    assert set(ra) == a and set(rb) == b
    assert set(ra | rb) == a | b
    assert set(ra - rb) == a - b
    assert set(rb - ra) == b - a
    assert set(ra & rb) == a & b
    assert ra.issubset(rb) == (a <= b)
    for result in (ra | rb, ra - rb, ra & rb):
        _assert_canonical(result)


def _interval_text(draw_pair):
    lo, hi = draw_pair
    return str(lo) if lo == hi and hi % 2 else f"{lo}-{hi}"


@given(
    st.lists(
        st.tuples(st.integers(0, UNIVERSE), st.integers(0, UNIVERSE)).map(sorted),
        min_size=1,
        max_size=12,
    ),
    st.randoms(),
)
def test_unsorted_overlapping_text_parses_to_the_union(pairs, rnd):
    parts = [_interval_text(pair) for pair in pairs]
    rnd.shuffle(parts)
    text = ",".join(parts)
    expected = set().union(*(range(lo, hi + 1) for lo, hi in pairs))
    rs = RangeSet.parse(text)
    _assert_canonical(rs)
    assert set(rs) == expected
    assert rs == RangeSet.from_ids(expected)


@settings(max_examples=50)
@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=50))
def test_large_ids_round_trip(ids):
    rs = RangeSet.from_ids(ids)
    assert set(rs) == set(ids)
    assert RangeSet.parse(str(rs)) == rs
