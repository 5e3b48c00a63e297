"""spec/protocol.md must agree with the code: its example frames and its tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES, AttrType
from proxy_agent.protocol.dialect import DEFAULT, DIALECTS, KEY_SPACE, NATIVE, unescape
from proxy_agent.protocol.messages import ArgumentError, CommandId, ErrorCode, EventId, decode_event
from proxy_agent.protocol.wire import Decoder, ErrorKind, Frame, encode_frame

SPEC_PATH = Path(__file__).resolve().parent.parent / "spec" / "protocol.md"
SPEC = SPEC_PATH.read_text(encoding="utf-8")

# ```frame (the same in both dialects), ```frame default or ```frame native
_FRAME_BLOCK = re.compile(r"^```frame(?: (default|native))?[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def example_blocks() -> list:
    """(line number, line, dialect name or None) for every line of every frame block."""
    lines = []
    for block in _FRAME_BLOCK.finditer(SPEC):
        start_line = SPEC.count("\n", 0, block.start(2)) + 1
        for offset, line in enumerate(block.group(2).splitlines()):
            lines.append((start_line + offset, line, block.group(1)))
    return lines


BLOCK_LINES = example_blocks()
EXAMPLES = [(lineno, line) for lineno, line, _ in BLOCK_LINES]


def decode_line(line: str) -> Frame:
    data = line.encode("utf-8")
    decoder = Decoder()
    decoder.feed(data)
    decoder.feed_eof()
    items = list(decoder)
    assert len(items) == 1 and isinstance(items[0], Frame), items
    assert decoder.buffered == 0
    return items[0]


def test_the_spec_has_examples():
    assert len(EXAMPLES) >= 40
    dialects = {dialect for _, _, dialect in BLOCK_LINES}
    assert dialects == {None, "default", "native"}


@pytest.mark.parametrize("lineno, line, dialect", BLOCK_LINES, ids=[f"line{n}" for n, _, _ in BLOCK_LINES])
def test_example_frame_is_in_its_dialect(lineno, line, dialect):
    frame = decode_line(line)
    if dialect is None:
        # the same bytes in both dialects: nothing to escape
        assert line.isascii() and "\\" not in line, f"spec line {lineno} differs between the dialects"
    elif dialect == "default":
        assert line.isascii(), f"spec line {lineno}: the default dialect is US-ASCII"
        text = tuple(unescape(arg) for arg in frame.args)
        # re-encoding the text in the default dialect gives the line back
        assert DEFAULT.encode_frame(frame.msg_id, frame.tid, text) == line.encode(), f"spec line {lineno}"


def test_default_dialect_examples_are_native_ones_escaped():
    native = [decode_line(line) for _, line, d in BLOCK_LINES if d == "native"]
    escaped = {DEFAULT.encode_frame(f.msg_id, f.tid, f.args) for f in native}
    default = [line for _, line, d in BLOCK_LINES if d == "default" and "\\" in line]
    assert len(default) >= 2, "the spec shows too little escaped text"
    for line in default:
        assert line.encode() in escaped, line


@pytest.mark.parametrize("lineno, line", EXAMPLES, ids=[f"line{n}" for n, _ in EXAMPLES])
def test_example_frame(lineno, line):
    assert line == line.strip() and line, f"spec line {lineno}: blank or padded line in a frame block"
    frame = decode_line(line)
    data = line.encode("utf-8")
    assert encode_frame(frame.msg_id, frame.tid, frame.args) == data, f"spec line {lineno} is not canonical"
    as_event = None
    if frame.msg_id in EventId._value2member_map_:
        try:
            as_event = decode_event(frame)
        except ArgumentError:
            if frame.msg_id not in CommandId._value2member_map_:
                raise
    if as_event is not None:
        assert as_event.encode() == data, f"spec line {lineno}: typed re-encoding differs"
    else:
        assert frame.msg_id in CommandId._value2member_map_, f"spec line {lineno}: id {frame.msg_id} is neither"


def test_examples_cover_what_a_client_author_needs():
    frames = [decode_line(line) for _, line in EXAMPLES]
    ids = {f.msg_id for f in frames}
    for event_id in (
        EventId.OK, EventId.ERROR, EventId.MESSAGE, EventId.SHUTDOWN, EventId.SUBMITJOB_ERROR,
        EventId.TERMINATEJOB_ERROR, EventId.ATTR_DEF, EventId.NEW_MACHINE, EventId.NEW_NODE,
        EventId.NEW_JOB, EventId.NEW_PROCESS, EventId.JOB_CHANGE, EventId.PROCESS_CHANGE,
        EventId.REMOVE_JOB, EventId.REMOVE_PROCESS, EventId.REMOVE_ALL,
    ):
        assert int(event_id) in ids, event_id.name
    for command_id in CommandId:
        assert int(command_id) in ids, command_id.name
    inits = [f.args for f in frames if f.msg_id == CommandId.INIT]
    assert ("version=2.0", "baseId=100") in inits and ("2.0", "100") in inits
    # (ids 0, 1, 5 and 6 are both a command and an event: tell them apart by their arguments)
    submit = next(f for f in frames if f.msg_id == CommandId.SUBMIT_JOB and f.args[:1] != ("2",))
    assert sum(a.startswith("progArgs=") for a in submit.args) >= 2
    assert sum(a.startswith("env=") for a in submit.args) >= 2
    assert any(not line.isascii() for _, line in EXAMPLES)
    process_change = next(f for f in frames if f.msg_id == EventId.PROCESS_CHANGE)
    assert any(a.startswith("processStdout=") for a in process_change.args)
    new_node = decode_event(next(f for f in frames if f.msg_id == EventId.NEW_NODE))
    assert len(new_node.groups) > 1


def test_reference_frames_appear_verbatim():
    for line in (
        "00000040 0001:00000001:00000002 0000000B:version=2.0 0000000A:baseId=100",
        "00000017 0003:00000003:00000000",
        "00000075 00DD:00000003:00000006 00000003:100 00000001:1 00000003:101 00000001:2 "
        "0000000B:name=login1 0000000F:machineState=UP",
    ):
        assert line in {text for _, text in EXAMPLES}


# ----------------------------------------------------------------- tables and names


def word_present(word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", SPEC) is not None


@pytest.mark.parametrize("name", [e.name for e in EventId] + [c.name for c in CommandId] + [k.name for k in ErrorKind])
def test_every_name_is_in_the_spec(name):
    assert word_present(name), name


def table_rows(first_cell: str) -> list:
    """Cells of every table row whose first cell matches ``first_cell`` (a regex)."""
    rows = []
    for line in SPEC.splitlines():
        if line.startswith("|") and re.match(rf"\|\s*{first_cell}\s*\|", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_error_code_table_matches_the_code():
    documented = {int(row[0]): row[1] for row in table_rows(r"\d+") if row[1] in ErrorCode.__members__}
    assert documented == {code.value: code.name for code in ErrorCode}
    for row in table_rows(r"\d+"):
        if row[1] in ErrorCode.__members__:
            assert len(row) == 3 and row[2], row


def test_event_table_matches_the_code():
    rows = [row for row in table_rows(r"\d+") if len(row) >= 3 and row[2] in EventId.__members__]
    documented = {row[2]: (int(row[0]), int(row[1], 16)) for row in rows}
    assert documented == {e.name: (e.value, e.value) for e in EventId}
    assert "**250** (0x00FA)" in SPEC and EventId.FILTER_DEF == 250


def test_command_table_matches_the_code():
    rows = [row for row in table_rows(r"[0-9A-F]{1,2}") if row[1] in CommandId.__members__]  # ids in hex
    assert {row[1]: int(row[0], 16) for row in rows} == {c.name: c.value for c in CommandId}


def test_standard_attribute_table_matches_the_code():
    rows = {row[0].strip("`"): row for row in table_rows(r"`[a-z][A-Za-z]*`")}
    assert set(rows) == {d.id for d in STANDARD_ATTRIBUTES}
    for definition in STANDARD_ATTRIBUTES:
        row = rows[definition.id]
        assert row[1] == definition.type.value, definition.id
        assert row[2] == (definition.default or "(empty)"), definition.id
        for value in definition.values:
            assert value in row[3].split(), (definition.id, value)
        if not definition.display:
            assert "not displayed" in row[3], definition.id


def test_dialect_table_matches_the_code():
    rows = {row[0]: row[1:] for row in table_rows(r"[a-zA-Z][^|]*") if len(row) == 3}
    default_types, native_types = rows["attribute types in ATTR_DEF"]
    assert set(default_types.replace(",", " ").split()) == {t.value for t in DEFAULT.attribute_types}
    assert set(native_types.replace(",", " ").split()) == {t.value for t in NATIVE.attribute_types}
    assert AttrType.ARRAY not in DEFAULT.attribute_types
    default_ids, native_ids = rows["element ids"]
    assert str(DEFAULT.max_element_id) in default_ids and str(DEFAULT.max_element_id - KEY_SPACE + 1) in default_ids
    assert str(NATIVE.max_element_id) in native_ids
    stop_default, stop_native = rows["STOP_EVENTS"]
    assert DEFAULT.stop_events_at_once and "at once" in stop_default
    assert not NATIVE.stop_events_at_once and "next START_EVENTS" in stop_native
    low, high = DEFAULT.integer_bounds
    assert f"{low} .. {high}" in rows["INTEGER values in events"][0]
    assert KEY_SPACE == 2**24 and "**2^24** (16777216)" in SPEC
    for name in DIALECTS:
        assert f"dialect={name}" in SPEC
