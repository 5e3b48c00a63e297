"""The two dialects: the escaping rule, attribute types, values in events, id limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES, AttrType, AttributeDefinition
from proxy_agent.protocol.dialect import (
    DEFAULT,
    DIALECTS,
    KEY_SPACE,
    NATIVE,
    DialectError,
    EscapeError,
    ValueRule,
    dialect_named,
    escape,
    unescape,
)
from proxy_agent.protocol.messages import ElementChange, ElementGroup, ElementKind, Error, decode_event
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import Decoder, encode_frame

# Any code point at all, lone surrogates included (undecodable program output arrives as those).
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()))


# ----------------------------------------------------------------- the escaping rule


@pytest.mark.parametrize(
    "text, escaped",
    [
        ("plain ascii, tabs\tand\nnewlines", "plain ascii, tabs\tand\nnewlines"),
        ("", ""),
        ("C:\\temp", "C:\\\\temp"),
        ("\\x41", "\\\\x41"),  # looks like an escape, is text: the backslash says so
        ("naïve", "na\\xefve"),
        ("Überprüfung", "\\xdcberpr\\xfcfung"),
        ("€ 5", "\\u20ac 5"),
        ("ジョブ", "\\u30b8\\u30e7\\u30d6"),
        ("🙂!", "\\U0001f642!"),
        ("\udcff", "\\udcff"),  # a byte that was not UTF-8, kept as a lone surrogate
        ("\x7f\x80", "\x7f\\x80"),
    ],
)
def test_escape_examples(text, escaped):
    assert escape(text) == escaped
    assert DEFAULT.escape(text) == escaped
    assert unescape(escaped) == text
    assert NATIVE.escape(text) == text and NATIVE.unescape(text) == text


@given(any_text)
@example("\\\\u00e9")
@example("\\")
@example("é\\")
def test_escape_round_trips_and_is_pure_ascii(text):
    escaped = escape(text)
    assert escaped.isascii()
    assert unescape(escaped) == text
    assert DEFAULT.unescape(DEFAULT.escape(text)) == text


@given(st.text(st.characters(min_codepoint=0, max_codepoint=0x7F)))
def test_ascii_without_backslash_is_left_alone(text):
    if "\\" not in text:
        assert escape(text) is text


@pytest.mark.parametrize(
    "text, words",
    [
        ("a\\b", "starts no escape"),
        ("ends with \\", "starts no escape"),
        ("\\x4", "starts no escape"),
        ("\\xE9", "starts no escape"),  # upper-case hex is not what the rule writes
        ("\\x41", "as itself"),
        ("\\u00e9", "shorter form"),
        ("\\U000020ac", "shorter form"),
        ("\\U00110000", "beyond U+10FFFF"),
        ("raw é", "must be ASCII"),
        ("\\\\\\q", "starts no escape"),
    ],
)
def test_unescape_refuses_what_the_rule_cannot_produce(text, words):
    with pytest.raises(EscapeError, match=re.escape(words)):
        unescape(text)


def test_escape_all_returns_the_same_sequence_when_nothing_needs_escaping():
    values = ["a", "b=c", "", "x y"]
    assert DEFAULT.escape_all(values) is values
    assert NATIVE.escape_all(["é"]) == ["é"]
    mixed = ["a", "é", "b\\c"]
    assert DEFAULT.escape_all(mixed) == [escape(v) for v in mixed]


@given(st.lists(any_text, max_size=6), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF))
def test_encoded_frames_are_ascii_and_decode_back_to_the_text(args, msg_id, tid):
    data = DEFAULT.encode_frame(msg_id, tid, args)
    assert data.isascii()
    decoder = Decoder()
    decoder.feed(data)
    (frame,) = list(decoder)
    assert (frame.msg_id, frame.tid) == (msg_id, tid)
    assert [unescape(arg) for arg in frame.args] == args
    if all(arg.isascii() and "\\" not in arg for arg in args):
        assert data == encode_frame(msg_id, tid, args)


def test_typed_events_and_errors_are_escaped_whole():
    change = ElementChange(3, ElementKind.JOB, [ElementGroup(RangeSet.parse("12389"), [("name", "Überprüfung")])])
    data = DEFAULT.encode(change)
    assert data == b"0000005C 00E6:00000003:00000004 00000001:1 00000005:12389 00000001:1 00000016:name=\\xdcberpr\\xfcfung"
    assert NATIVE.encode(change) == change.encode()
    error = Error(7, 4, "jobId must be plain decimal digits 0-9, got '١٢٣'")
    assert DEFAULT.encode(error).isascii() and b"\\u0661\\u0662\\u0663" in DEFAULT.encode(error)


# ----------------------------------------------------------------- MODEL_DEF


def test_default_dialect_sends_the_seven_types_only():
    assert {t.value for t in DEFAULT.attribute_types} == {
        "BOOLEAN", "DATE", "DOUBLE", "ENUMERATED", "INTEGER", "BIGINTEGER", "STRING"
    }
    sent = DEFAULT.attribute_definitions(STANDARD_ATTRIBUTES)
    assert {d.id for d in STANDARD_ATTRIBUTES} - {d.id for d in sent} == {"progArgs", "env"}
    assert all(d.type is not AttrType.ARRAY for d in sent)
    assert NATIVE.attribute_definitions(STANDARD_ATTRIBUTES) == list(STANDARD_ATTRIBUTES)
    big = AttributeDefinition("memory", AttrType.BIGINTEGER, "Memory")
    assert DEFAULT.attribute_definitions([big]) == [big] and DEFAULT.allows_type(AttrType.BIGINTEGER)
    assert not DEFAULT.allows_type(AttrType.ARRAY) and NATIVE.allows_type(AttrType.ARRAY)


# ----------------------------------------------------------------- values in element events


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "0"),
        (2**31 - 1, "2147483647"),
        (-(2**31), "-2147483648"),
        ("007", "7"),
        ("-12", "-12"),
        (2**31, None),
        (4294967294, None),  # SLURM's "no value"
        ("4294967295", None),  # SLURM's "infinite"
        ("UNLIMITED", None),
        ("1_000", None),
        ("\u0661", None),
        (" 1", None),
        ("", None),
        (True, None),
        ("9" * 50, None),
    ],
)
def test_integer_values_fit_a_java_int_or_are_left_out(value, text):
    assert DEFAULT.integer_text(value) == text


def test_native_integer_values_pass_as_given():
    assert NATIVE.integer_text(4294967294) == "4294967294"
    assert NATIVE.integer_text("UNLIMITED") == "UNLIMITED"


def test_value_rules():
    assert DEFAULT.value_rule("progArgs", None) is ValueRule.OMIT  # the IDE holds it as an array
    assert DEFAULT.value_rule("env", AttrType.STRING) is ValueRule.OMIT
    assert DEFAULT.value_rule("gres", AttrType.ARRAY) is ValueRule.OMIT
    assert DEFAULT.value_rule("jobNumProcs", AttrType.INTEGER) is ValueRule.INTEGER
    assert DEFAULT.value_rule("name", AttrType.STRING) is ValueRule.SEND
    assert DEFAULT.value_rule("memory", AttrType.BIGINTEGER) is ValueRule.SEND
    for attr_id, kind in (("progArgs", AttrType.ARRAY), ("jobNumProcs", AttrType.INTEGER), ("name", None)):
        assert NATIVE.value_rule(attr_id, kind) is ValueRule.SEND


def test_event_attributes_per_dialect():
    types = {d.id: d.type for d in STANDARD_ATTRIBUTES}
    attributes = {
        "jobSubId": "s1",
        "name": "hostname",
        "progArgs": ["-s", "--fqdn"],
        "env": ["A=1"],
        "jobNumProcs": 4,
        "processExitCode": 4294967294,
        "queueId": None,
        "features": ["gpu", "fast"],
    }
    assert DEFAULT.event_attributes(attributes, types) == ["jobSubId=s1", "name=hostname", "jobNumProcs=4"]
    assert NATIVE.event_attributes(attributes, types) == [
        "jobSubId=s1", "name=hostname", "progArgs=-s", "progArgs=--fqdn", "env=A=1", "jobNumProcs=4",
        "processExitCode=4294967294", "features=gpu", "features=fast",
    ]
    assert DEFAULT.event_attributes([("name", "a"), ("jobNumProcs", "x")], types) == ["name=a"]


# ----------------------------------------------------------------- ids


def test_base_id_limits():
    largest = 2**31 - KEY_SPACE
    assert DEFAULT.highest_id(largest) == 2**31 - 1
    assert DEFAULT.base_id_problem(0) is None and DEFAULT.base_id_problem(largest) is None
    assert DEFAULT.base_id_problem(2**24) is None  # what the PTP 4.0 client sends
    problem = DEFAULT.base_id_problem(largest + 1)
    assert f"at most {largest}" in problem and "Java int" in problem and "dialect=native" in problem
    assert NATIVE.base_id_problem(largest + 1) is None
    assert "64-bit" in NATIVE.base_id_problem(2**63 - KEY_SPACE + 1)
    assert DEFAULT.base_id_problem(100, key_space=2**31 - 100) is None
    assert DEFAULT.base_id_problem(101, key_space=2**31 - 100) is not None
    assert not DEFAULT.string_element_ids and NATIVE.string_element_ids


def test_dialects_by_name():
    assert dialect_named(None) is DEFAULT
    assert dialect_named("default") is DEFAULT and dialect_named("native") is NATIVE
    assert set(DIALECTS) == {"default", "native"}
    with pytest.raises(DialectError, match="unknown dialect 'NATIVE'; this agent speaks default, native"):
        dialect_named("NATIVE")
    with pytest.raises(DialectError, match=r"\.\.\."):
        dialect_named("x" * 100)


def test_stop_events_rule():
    assert DEFAULT.stop_events_at_once and not NATIVE.stop_events_at_once


def _one_frame(data: bytes):
    decoder = Decoder()
    decoder.feed(data)
    (frame,) = list(decoder)
    return frame


def test_the_same_event_in_both_dialects():
    native = _one_frame(
        b"00000058 00E6:00000003:00000004 00000001:1 00000005:12389 00000001:1 00000012:name=\xc3\x9cberpr\xc3\xbcfung"
    )
    default = _one_frame(
        b"0000005C 00E6:00000003:00000004 00000001:1 00000005:12389 00000001:1 00000016:name=\\xdcberpr\\xfcfung"
    )
    unescaped = type(default)(default.msg_id, default.tid, tuple(DEFAULT.unescape(a) for a in default.args))
    assert decode_event(native) == decode_event(unescaped)
    assert decode_event(native).groups[0].attributes == (("name", "Überprüfung"),)
