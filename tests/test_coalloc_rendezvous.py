"""The rendezvous data format and one rendezvous."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.service.coalloc.rendezvous import (
    FormatError,
    RankOutOfRange,
    RankTaken,
    Rendezvous,
    RendezvousError,
    RendezvousFull,
    RendezvousIncomplete,
    decode,
    encode,
    encode_item,
)


def data_of(level: int):
    """Random data of ``level``: bytes at 0, tuples of level-1 data above."""
    if level == 0:
        return st.binary(max_size=12)
    return st.lists(data_of(level - 1), max_size=4).map(tuple)


leveled = st.integers(0, 3).flatmap(lambda level: st.tuples(st.just(level), data_of(level)))


# --------------------------------------------------------------------------- the format


def test_the_seeds_example_by_hand():
    assert encode_item(b"ab") == b"2 ab"
    assert encode((b"ab", b"c"), 1) == b"2 2 ab1 c"
    assert encode(((b"ab", b"c"), (), (b"",)), 2) == b"3 2 2 ab1 c0 1 0 "
    assert decode(b"2 2 ab1 c", 1) == (b"ab", b"c")
    # bytes inside an item are opaque: spaces and digits included
    assert decode(b"1 5 1 2 3", 1) == (b"1 2 3",)


@settings(max_examples=200, deadline=None)
@given(leveled)
def test_format_round_trips(level_and_datum):
    level, datum = level_and_datum
    encoded = encode(datum, level)
    assert decode(encoded, level) == datum
    assert encode(decode(encoded, level), level) == encoded


@settings(max_examples=300, deadline=None)
@given(leveled, st.data())
def test_damaged_data_is_refused_or_still_canonical(level_and_datum, data):
    """Whatever is done to valid data, decoding either refuses it with FormatError or
    yields a datum that encodes back to exactly the bytes read: nothing else, no crash."""
    level, datum = level_and_datum
    encoded = bytearray(encode(datum, level))
    action = data.draw(st.sampled_from(["flip", "cut", "append", "insert"]))
    if action == "flip" and encoded:
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] = data.draw(st.sampled_from(b"0123456789 -+x\x00"))
    elif action == "cut" and encoded:
        del encoded[data.draw(st.integers(0, len(encoded) - 1)) :]
    elif action == "append":
        encoded += data.draw(st.binary(min_size=1, max_size=4))
    else:
        at = data.draw(st.integers(0, len(encoded)))
        encoded[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    try:
        decoded = decode(bytes(encoded), level)
    except FormatError:
        return
    assert encode(decoded, level) == bytes(encoded)


@pytest.mark.parametrize(
    "data, level, words",
    [
        (b"", 0, "expected the digits of a byte count at byte 0, found the end"),
        (b"3 ab", 0, "runs past the end"),
        (b"2 abc", 0, "1 bytes of trailing garbage"),
        (b"02 ab", 0, "leading zero"),
        (b"+2 ab", 0, "found byte b'+'"),
        (b"-1 ", 0, "found byte b'-'"),
        (b"2ab", 0, "expected a space after the byte count at byte 1"),
        (b"2  ab", 0, "1 bytes of trailing garbage after the datum (from byte 4)"),
        (b"1234567890123 x", 0, "more than 12 digits"),
        (b"999999999 0 ", 1, "more than the 2 bytes left could hold"),
        (b"2 1 a", 1, "the item count 2 at byte 0 is more than the 3 bytes left"),
        (b"2 1 a1 ", 1, "the byte count 1 at byte 7 runs past the end of the data (0 bytes left)"),
        (b"1 1 a ", 1, "trailing garbage"),
        (b"1 1 a", 2, "the item count 1 at byte 2 is more than the 1 bytes left"),
        (b"1 2xab", 1, "expected a space after the byte count at byte 3, found byte b'x'"),
    ],
)
def test_malformed_data_is_refused_with_a_reason(data, level, words):
    with pytest.raises(FormatError) as caught:
        decode(data, level)
    assert words in str(caught.value)


def test_decode_is_bounded():
    with pytest.raises(FormatError, match="more than the 10 allowed"):
        decode(b"20 " + b"x" * 20, 0, max_size=10)
    with pytest.raises(ValueError):
        decode(b"0 ", 99)
    with pytest.raises(TypeError):
        decode("0 ", 0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- one rendezvous


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=10), min_size=1, max_size=8), st.data())
def test_any_order_of_registration_yields_the_same_aggregate(items, data):
    order = data.draw(st.permutations(range(len(items))))
    rendezvous = Rendezvous(len(items), 1)
    for count, rank in enumerate(order):
        assert not rendezvous.complete
        assert rendezvous.register(items[rank], rank) == rank
        assert rendezvous.registered == count + 1
    assert rendezvous.complete
    assert rendezvous.aggregate() == encode(tuple(items), 1)
    assert decode(rendezvous.aggregate(), 1) == tuple(items)


@settings(max_examples=100, deadline=None)
@given(st.lists(data_of(1), min_size=1, max_size=5), st.data())
def test_level_two_takes_level_one_aggregates_in_any_order(aggregates, data):
    order = data.draw(st.permutations(range(len(aggregates))))
    rendezvous = Rendezvous(len(aggregates), 2)
    for rank in order:
        rendezvous.register(encode(aggregates[rank], 1), rank)
    assert rendezvous.aggregate() == encode(tuple(aggregates), 2)


def test_next_free_rank_and_refusals():
    rendezvous = Rendezvous(3, 1)
    assert rendezvous.register(b"b", 1) == 1
    assert rendezvous.register(b"a") == 0
    with pytest.raises(RendezvousIncomplete, match="ranks 2 have not registered"):
        rendezvous.aggregate()
    with pytest.raises(RankTaken, match="rank 1 .* already registered"):
        rendezvous.register(b"x", 1)
    with pytest.raises(RankOutOfRange, match="ranks 0 to 2, or -1"):
        rendezvous.register(b"x", 3)
    with pytest.raises(RankOutOfRange):
        rendezvous.register(b"x", -2)
    assert rendezvous.register(b"c", -1) == 2
    with pytest.raises(RendezvousFull, match="all 3 ranks"):
        rendezvous.register(b"d")
    assert rendezvous.aggregate() == b"3 1 a1 b1 c"


def test_level_two_checks_what_it_is_given():
    rendezvous = Rendezvous(2, 2)
    with pytest.raises(FormatError):
        rendezvous.register(b"not a level-1 datum")
    assert rendezvous.missing() == [0, 1]
    rendezvous.register(b"1 1 x")
    assert rendezvous.missing() == [1]


def test_a_rendezvous_is_bounded():
    rendezvous = Rendezvous(2, 1, max_size=10)
    rendezvous.register(b"12345")
    with pytest.raises(RendezvousError, match="more than 10 bytes"):
        rendezvous.register(b"123456")
    assert rendezvous.registered == 1
