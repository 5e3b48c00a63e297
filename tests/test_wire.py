"""Framing: bytes <-> frames, malformed input, chunking and memory bounds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy_agent.protocol import wire
from proxy_agent.protocol.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    Decoder,
    ErrorKind,
    Frame,
    FrameError,
    encode_frame,
)

# ----------------------------------------------------------------- helpers


def decode_all(data: bytes, *, eof: bool = False, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list:
    """Everything a fresh decoder produces from ``data`` fed in one piece."""
    decoder = Decoder(max_frame_size=max_frame_size)
    decoder.feed(data)
    if eof:
        decoder.feed_eof()
    return list(decoder)


def decode_chunks(chunks, *, eof: bool = False, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list:
    """Everything a fresh decoder produces when fed ``chunks`` one by one, draining after each."""
    decoder = Decoder(max_frame_size=max_frame_size)
    out = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder)
    if eof:
        decoder.feed_eof()
        out.extend(decoder)
    return out


def split_at(data: bytes, cuts) -> list:
    points = sorted(set(cuts) | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def framed(body: bytes) -> bytes:
    """Prefix a (possibly malformed) body with its correct length field."""
    return b"%08X" % len(body) + body


GOOD = Frame(0x0003, 0x77, ())
GOOD_BYTES = encode_frame(GOOD.msg_id, GOOD.tid, GOOD.args)


# ----------------------------------------------------------------- byte-exact examples

EXAMPLES = [
    (
        b"00000040 0001:00000001:00000002 0000000B:version=2.0 0000000A:baseId=100",
        Frame(1, 1, ("version=2.0", "baseId=100")),
    ),
    (b"00000017 0003:00000003:00000000", Frame(3, 3, ())),
    (
        b"00000075 00DD:00000003:00000006 00000003:100 00000001:1 00000003:101 00000001:2 "
        b"0000000B:name=login1 0000000F:machineState=UP",
        Frame(0xDD, 3, ("100", "1", "101", "2", "name=login1", "machineState=UP")),
    ),
]


@pytest.mark.parametrize("data, frame", EXAMPLES)
def test_reference_examples_encode_exactly(data, frame):
    assert encode_frame(frame.msg_id, frame.tid, frame.args) == data


@pytest.mark.parametrize("data, frame", EXAMPLES)
def test_reference_examples_decode(data, frame):
    assert decode_all(data) == [frame]


def test_reference_examples_concatenated_and_byte_by_byte():
    stream = b"".join(data for data, _ in EXAMPLES)
    expected = [frame for _, frame in EXAMPLES]
    assert decode_all(stream) == expected
    assert decode_chunks([stream[i:i + 1] for i in range(len(stream))], eof=True) == expected


def test_empty_argument_and_zero_arguments():
    data = encode_frame(0x10, 0, [""])
    assert data == b"00000021 0010:00000000:00000001 00000000:"
    assert decode_all(data) == [Frame(0x10, 0, ("",))]


def test_arguments_may_hold_separators_and_newlines():
    args = ("progArgs=-a 2 -b 4", "a:b=c", "line one\nline two", " ", "00000003:abc")
    assert decode_all(encode_frame(5, 9, args)) == [Frame(5, 9, args)]


def test_the_design_string_example():
    assert encode_frame(5, 1, ["progArgs=-a 2 -b 4"]).endswith(b" 00000012:progArgs=-a 2 -b 4")


# ----------------------------------------------------------------- UTF-8 lengths


@pytest.mark.parametrize(
    "arg, nbytes",
    [("\u00e9", 2), ("\u20ac", 3), ("\U0001d11e", 4), ("name=n\u00f8de-\u00e9", 13)],
)
def test_lengths_count_utf8_bytes(arg, nbytes):
    data = encode_frame(1, 2, [arg])
    assert data.endswith(b" %08X:" % nbytes + arg.encode("utf-8"))
    assert int(data[:8], 16) == len(data) - 8
    assert int(data[:8], 16) == 23 + 10 + nbytes
    assert decode_all(data) == [Frame(1, 2, (arg,))]


def test_non_ascii_mixed_with_ascii_arguments():
    args = ("jobSubId=1", "name=\u00fcber", "env=X=\u65e5\u672c", "x")
    assert decode_all(encode_frame(5, 5, args)) == [Frame(5, 5, args)]


# ----------------------------------------------------------------- hex case


def test_encoder_writes_upper_case_hex():
    data = encode_frame(0xABCD, 0xDEADBEEF, ["x" * 0x1F])
    assert data[:31] == b"00000040 ABCD:DEADBEEF:00000001"
    assert b" 0000001F:" in data


def test_lower_case_hex_is_accepted():
    data = b"00000037 00dd:0000abcd:00000002 0000000b:name=login1 00000001:x"
    assert decode_all(data) == [Frame(0xDD, 0xABCD, ("name=login1", "x"))]


def test_encoder_refuses_ids_that_do_not_fit():
    with pytest.raises(ValueError):
        encode_frame(0x10000, 1)
    with pytest.raises(ValueError):
        encode_frame(-1, 1)
    with pytest.raises(ValueError):
        encode_frame(1, 0x100000000)
    with pytest.raises(ValueError):
        encode_frame(1, -1)


# ----------------------------------------------------------------- round trip property

arg_text = st.text(
    alphabet=st.one_of(st.sampled_from(" =:\n\r\t,-0123456789ABCDEFabcdef\u00e9\u20ac\U0001d11e"), st.characters(codec="utf-8")),
    max_size=24,
)
frames = st.builds(
    Frame,
    msg_id=st.integers(0, 0xFFFF),
    tid=st.integers(0, 0xFFFFFFFF),
    args=st.lists(arg_text, max_size=8).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(frames, min_size=1, max_size=6), data=st.data())
def test_round_trip_with_any_chunking(batch, data):
    stream = b"".join(encode_frame(f.msg_id, f.tid, f.args) for f in batch)
    assert decode_all(stream, eof=True) == batch
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    assert decode_chunks(split_at(stream, cuts), eof=True) == batch


@settings(max_examples=25, deadline=None)
@given(batch=st.lists(frames, min_size=1, max_size=3))
def test_round_trip_one_byte_at_a_time(batch):
    stream = b"".join(encode_frame(f.msg_id, f.tid, f.args) for f in batch)
    assert decode_chunks([stream[i:i + 1] for i in range(len(stream))], eof=True) == batch


def test_many_frames_in_one_chunk():
    batch = [Frame(i % 7, i, tuple(str(j) for j in range(i % 5))) for i in range(2000)]
    stream = b"".join(encode_frame(f.msg_id, f.tid, f.args) for f in batch)
    assert decode_all(stream) == batch


# ----------------------------------------------------------------- malformed input: fatal


def only_error(items) -> FrameError:
    assert len(items) == 1, items
    assert isinstance(items[0], FrameError), items
    return items[0]


def test_non_hex_length_is_fatal():
    error = only_error(decode_all(b"0000001G 0003:00000003:00000000" + GOOD_BYTES))
    assert error.kind is ErrorKind.BAD_LENGTH and error.fatal
    assert "length" in error.message and "0000001G" in error.message


def test_signs_and_blanks_are_not_hex():
    # int(..., 16) would take these; the protocol does not.
    for digits in (b"+0000017", b" 0000017", b"0000_017", b"-0000017"):
        assert only_error(decode_all(digits + b" 0003:00000003:00000000")).kind is ErrorKind.BAD_LENGTH


def test_length_above_cap_is_fatal():
    error = only_error(decode_all(framed(b" 0003:00000003:00000001 00000080:" + b"x" * 0x80), max_frame_size=100))
    assert error.kind is ErrorKind.FRAME_TOO_LARGE and error.fatal
    assert "161" in error.message and "100" in error.message


def test_length_above_cap_is_refused_from_the_length_alone():
    decoder = Decoder(max_frame_size=100)
    decoder.feed(b"7FFFFFFF")
    error = decoder.next_event()
    assert isinstance(error, FrameError) and error.kind is ErrorKind.FRAME_TOO_LARGE
    assert str(0x7FFFFFFF) in error.message
    assert decoder.buffered == 0
    assert decoder.failed is error


def test_length_at_cap_is_accepted():
    data = framed(b" 0003:00000003:00000001 00000043:" + b"y" * 0x43)
    assert int(data[:8], 16) == 100
    assert decode_all(data, max_frame_size=100) == [Frame(3, 3, ("y" * 0x43,))]


def test_missing_space_is_fatal():
    error = only_error(decode_all(b"000000170003:00000003:00000000 " + GOOD_BYTES))
    assert error.kind is ErrorKind.MISSING_SPACE and error.fatal
    assert "space" in error.message


def test_zero_length_is_fatal():
    error = only_error(decode_all(b"00000000 " + GOOD_BYTES))
    assert error.kind is ErrorKind.MISSING_SPACE
    assert "length 0" in error.message


def test_truncated_body_at_eof_is_fatal():
    error = only_error(decode_all(GOOD_BYTES[:20], eof=True))
    assert error.kind is ErrorKind.TRUNCATED and error.fatal
    assert "12 of 23" in error.message


def test_truncated_length_at_eof_is_fatal():
    error = only_error(decode_all(b"0000", eof=True))
    assert error.kind is ErrorKind.TRUNCATED
    assert "length" in error.message


def test_clean_eof_is_not_an_error():
    assert decode_all(GOOD_BYTES, eof=True) == [GOOD]
    assert decode_all(b"", eof=True) == []


def test_partial_frame_without_eof_waits():
    decoder = Decoder()
    decoder.feed(GOOD_BYTES[:-1])
    assert decoder.next_event() is None
    decoder.feed(GOOD_BYTES[-1:])
    assert decoder.next_event() == GOOD


def test_nothing_is_produced_after_a_fatal_error():
    decoder = Decoder()
    decoder.feed(b"XXXXXXXX" + GOOD_BYTES)
    first = decoder.next_event()
    assert isinstance(first, FrameError) and first.fatal
    assert decoder.failed is first
    assert decoder.next_event() is None
    decoder.feed(GOOD_BYTES * 3)
    decoder.feed_eof()
    assert decoder.next_event() is None
    assert list(decoder) == []
    assert decoder.buffered == 0


def test_iteration_stops_at_a_fatal_error():
    items = decode_all(GOOD_BYTES + b"zzzzzzzz" + GOOD_BYTES)
    assert items[0] == GOOD
    assert items[1].kind is ErrorKind.BAD_LENGTH
    assert len(items) == 2


# ----------------------------------------------------------------- malformed input: this frame only

NON_FATAL_CASES = [
    # (body, kind, words the message must contain, msg_id, tid)
    (b" 00G3:00000003:00000000", ErrorKind.BAD_HEADER, ["id", "00G3"], None, None),
    (b" 0003:0000000X:00000000", ErrorKind.BAD_HEADER, ["TID", "0000000X"], 3, None),
    (b" 0003:0000002A:0000000Z", ErrorKind.BAD_HEADER, ["argument count", "0000000Z"], 3, 0x2A),
    (b" 0003-0000002A:00000000", ErrorKind.BAD_HEADER, ["separated", "':'"], 3, 0x2A),
    (b" 0003", ErrorKind.BAD_HEADER, ["shorter", "header"], None, None),
    (
        b" 0005:0000002A:00000002 00000001:a",
        ErrorKind.ARG_COUNT_MISMATCH,
        ["declares 2", "after 1"],
        5,
        0x2A,
    ),
    (
        b" 0005:0000002A:00000001 00000001:a 00000001:b",
        ErrorKind.ARG_COUNT_MISMATCH,
        ["declares 1", "carries 2"],
        5,
        0x2A,
    ),
    (
        b" 0005:0000002A:00000001 00000010:abc",
        ErrorKind.ARG_OVERRUN,
        ["argument 1", "16 bytes", "3 remain"],
        5,
        0x2A,
    ),
    (
        b" 0005:0000002A:00000002 00000001:a 0000000G:b",
        ErrorKind.BAD_ARG_LENGTH,
        ["argument 2 of 2", "0000000G"],
        5,
        0x2A,
    ),
    (
        b" 0005:0000002A:00000001-00000001:a",
        ErrorKind.BAD_ARG_LENGTH,
        ["argument 1 of 1"],
        5,
        0x2A,
    ),
    (b" 0005:0000002A:00000000xyz", ErrorKind.TRAILING_BYTES, ["3 unexpected bytes", "xyz"], 5, 0x2A),
    (b" 0005:0000002A:00000001 00000001:ab", ErrorKind.TRAILING_BYTES, ["1 unexpected", "b"], 5, 0x2A),
    (b" 0005:0000002A:00000001 00000002:\xc3(", ErrorKind.BAD_ENCODING, ["UTF-8"], 5, 0x2A),
    (b" 0005:0000002A:00000001 00000001:\xff", ErrorKind.BAD_ENCODING, ["UTF-8"], 5, 0x2A),
    # a character split between two arguments is invalid in both
    (b" 0005:0000002A:00000002 00000001:\xc3 00000001:\xa9", ErrorKind.BAD_ENCODING, ["UTF-8"], 5, 0x2A),
]


@pytest.mark.parametrize("body, kind, words, msg_id, tid", NON_FATAL_CASES)
def test_frame_errors_are_reported_and_the_stream_continues(body, kind, words, msg_id, tid):
    items = decode_all(framed(body) + GOOD_BYTES)
    assert len(items) == 2, items
    error, after = items
    assert isinstance(error, FrameError)
    assert error.kind is kind and not error.fatal
    for word in words:
        assert word in error.message, (word, error.message)
    assert str(error) == error.message
    assert (error.msg_id, error.tid) == (msg_id, tid)
    assert after == GOOD


@pytest.mark.parametrize("body, kind, words, msg_id, tid", NON_FATAL_CASES)
def test_frame_errors_are_the_same_byte_by_byte(body, kind, words, msg_id, tid):
    stream = framed(body) + GOOD_BYTES
    assert decode_chunks([stream[i:i + 1] for i in range(len(stream))], eof=True) == decode_all(stream)


def test_every_error_kind_is_covered_and_classified():
    fatal = {ErrorKind.BAD_LENGTH, ErrorKind.FRAME_TOO_LARGE, ErrorKind.MISSING_SPACE, ErrorKind.TRUNCATED}
    for kind in ErrorKind:
        assert kind.fatal == (kind in fatal)
    covered = {case[1] for case in NON_FATAL_CASES} | fatal
    assert covered == set(ErrorKind)


# ----------------------------------------------------------------- fuzzing


def mutate(stream: bytes, edits) -> bytes:
    data = bytearray(stream)
    for where, what, byte in edits:
        if not data:
            break
        i = where % len(data)
        if what == 0:
            data[i] = byte
        elif what == 1:
            del data[i]
        else:
            data.insert(i, byte)
    return bytes(data)


valid_streams = st.lists(frames, min_size=1, max_size=4).map(
    lambda batch: b"".join(encode_frame(f.msg_id, f.tid, f.args) for f in batch)
)
edits = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2), st.integers(0, 255)), max_size=4)
noisy_streams = st.one_of(
    st.binary(max_size=300),
    st.builds(mutate, valid_streams, edits),
    st.builds(lambda a, b: a + b, valid_streams, st.binary(max_size=40)),
)


# Inputs whose outcome once depended on where the stream was cut.
CHUNKING_CASES = [
    b"00000000\x00",  # length 0, then a byte that is not a space: cut after the digits it differed
    b"00000000",
    b"00000000 0003:00000003:00000000",
    b"0000001Fxyz",
    b"00000017",
    b"00000017 0003",
    b"FFFFFFFF ",
    b"0000001G ",
    GOOD_BYTES + b"00000000\x00",
]


@pytest.mark.parametrize("stream", CHUNKING_CASES)
@pytest.mark.parametrize("eof", [False, True])
@pytest.mark.parametrize("cap", [40, DEFAULT_MAX_FRAME_SIZE])
def test_outcome_does_not_depend_on_chunking(stream, eof, cap):
    whole = decode_all(stream, eof=eof, max_frame_size=cap)
    for cut in range(1, len(stream)):
        assert decode_chunks([stream[:cut], stream[cut:]], eof=eof, max_frame_size=cap) == whole, cut
    assert decode_chunks([stream[i:i + 1] for i in range(len(stream))], eof=eof, max_frame_size=cap) == whole


def test_length_zero_is_refused_from_the_digits_alone():
    (error,) = decode_chunks([b"00000000"])
    assert error.kind is ErrorKind.MISSING_SPACE and "length 0" in error.message
    (error,) = decode_all(b"00000000\x00")
    assert error.kind is ErrorKind.MISSING_SPACE and "length 0" in error.message


def test_missing_space_shows_the_same_bytes_however_much_is_buffered():
    (short,) = decode_chunks([b"0000001Fx"])
    (long,) = decode_all(b"0000001Fxyzabcdefghijklmnop")
    assert short == long and "b'0000001Fx'" in long.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=noisy_streams, cap=st.sampled_from([40, 100, 1000]), eof=st.booleans(), data=st.data())
def test_arbitrary_bytes_never_raise_and_stay_bounded(stream, cap, eof, data):
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10), label="cuts")
    decoder = Decoder(max_frame_size=cap)
    produced = []
    for chunk in split_at(stream, cuts):
        decoder.feed(chunk)
        assert decoder.buffered <= cap + 8 + len(chunk)
        assert len(decoder._buf) <= cap + 8 + len(chunk)  # memory actually held, not just unread
        produced.extend(decoder)
    if eof:
        decoder.feed_eof()
        produced.extend(decoder)
    for index, item in enumerate(produced):
        assert isinstance(item, (Frame, FrameError))
        if isinstance(item, FrameError) and item.fatal:
            assert index == len(produced) - 1
            assert decoder.failed is item
    # chunking never changes the outcome
    assert produced == (decode_all(stream, eof=True, max_frame_size=cap) if eof else
                        decode_all(stream, max_frame_size=cap))


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(
    st.binary(max_size=80),
    st.builds(lambda f, e: mutate(encode_frame(f.msg_id, f.tid, f.args)[8:], e), frames, edits),
))
def test_in_place_parsing_agrees_with_the_reference_parser(body):
    # The decoder parses whole frames straight from its buffer; the body
    # parser is the slow, careful reading that explains errors.  They must
    # agree on every body, valid or not.
    expected = wire._parse_body(body) if body[:1] == b" " else None
    items = decode_all(framed(body))
    if expected is None:
        assert len(items) == 1 and items[0].fatal
    else:
        assert items == [expected]


def test_non_ascii_frames_measure_each_argument_in_bytes():
    args = ["a" * 5000, "é", "plain", "ジョブ" * 2000, ""]
    data = encode_frame(0xE6, 3, args)
    (frame,) = decode_all(data)
    assert frame.args == tuple(args)


def test_a_lone_surrogate_travels_as_the_replacement_character():
    (frame,) = decode_all(encode_frame(0xE6, 3, ["out=\udcff!", "pair=\ud83d\ude42", "ok"]))
    assert frame.args == ("out=\ufffd!", "pair=\U0001f642", "ok")


def test_ascii_frames_encode_the_same_either_way_and_other_text_is_refused():
    from proxy_agent.protocol.wire import encode_ascii_frame

    args = ["1", "12389", "2", "name=a\\b", "x" * 5000]
    assert encode_ascii_frame(0xE6, 3, args) == encode_frame(0xE6, 3, args)
    assert encode_ascii_frame(0xE6, 3, ["name=é"]) is None
    with pytest.raises(ValueError, match="TID"):
        encode_ascii_frame(0xE6, 2**32, [])
