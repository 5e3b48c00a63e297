"""Typed events and commands: layouts, round trips, malformed arguments, INIT."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES, AttributeDefinition, AttrType
from proxy_agent.protocol.messages import (
    ArgumentError,
    AttrDef,
    Command,
    CommandId,
    ElementChange,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    EventId,
    FilterDef,
    InitRequest,
    Message,
    MessageLevel,
    NewElements,
    Ok,
    OutputEvent,
    ProcessChange,
    RemoveAll,
    RemoveElements,
    RemoveProcesses,
    Shutdown,
    SubmitJobError,
    TerminateJobError,
    decode_event,
    encode_event,
    parse_init,
)
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import Decoder, Frame, encode_frame


def rs(text: str) -> RangeSet:
    return RangeSet.parse(text)


def through_the_wire(event):
    """Encode, decode the bytes into a frame, then into a typed event."""
    decoder = Decoder()
    decoder.feed(event.encode())
    (frame,) = list(decoder)
    assert isinstance(frame, Frame)
    return decode_event(frame)


def frame_of(event_id: int, *args: str, tid: int = 9) -> Frame:
    return Frame(int(event_id), tid, tuple(args))


STATE = next(d for d in STANDARD_ATTRIBUTES if d.id == "machineState")
PROCS = next(d for d in STANDARD_ATTRIBUTES if d.id == "jobNumProcs")

# One sample per event id of the protocol table (and FILTER_DEF).
SAMPLES = {
    EventId.OK: Ok(1),
    EventId.MESSAGE: Message(2, MessageLevel.WARNING, ErrorCode.TID_IN_USE, "TID 2 is busy"),
    EventId.ERROR: Error(3, ErrorCode.BAD_ARGUMENTS, "SUBMIT_JOB: missing jobSubId=..."),
    EventId.SHUTDOWN: Shutdown(4),
    EventId.SUBMITJOB_ERROR: SubmitJobError(5, "sub-1", ErrorCode.SUBMIT_FAILED, "sbatch: invalid partition"),
    EventId.TERMINATEJOB_ERROR: TerminateJobError(6, "1042", ErrorCode.NO_SUCH_JOB, "no job 1042"),
    EventId.NEW_JOB: NewElements(
        7, ElementKind.JOB, "110", [ElementGroup(rs("1042"), [("jobSubId", "sub-1"), ("jobState", "STARTING")])]
    ),
    EventId.NEW_MACHINE: NewElements(
        7, ElementKind.MACHINE, "100", [ElementGroup(rs("101"), [("name", "login1"), ("machineState", "UP")])]
    ),
    EventId.NEW_NODE: NewElements(
        7,
        ElementKind.NODE,
        "101",
        [
            ElementGroup(rs("200-263"), [("nodeState", "UP")]),
            ElementGroup(rs("264,266"), [("nodeState", "DOWN"), ("name", "n64")]),
        ],
    ),
    EventId.NEW_PROCESS: NewElements(
        7, ElementKind.PROCESS, "1042", [ElementGroup(rs("5000-5003"), [("processState", "STARTING")])]
    ),
    EventId.NEW_QUEUE: NewElements(
        7, ElementKind.QUEUE, "100", [ElementGroup(rs("110"), [("name", "batch"), ("queueState", "NORMAL")])]
    ),
    EventId.JOB_CHANGE: ElementChange(7, ElementKind.JOB, [ElementGroup(rs("1042"), [("jobState", "RUNNING")])]),
    EventId.MACHINE_CHANGE: ElementChange(
        7, ElementKind.MACHINE, [ElementGroup(rs("101"), [("machineState", "ALERT")])]
    ),
    EventId.NODE_CHANGE: ElementChange(
        7, ElementKind.NODE, [ElementGroup(rs("200-210,212"), [("nodeState", "DOWN")])]
    ),
    EventId.PROCESS_CHANGE: ProcessChange(
        7, "1042", [ElementGroup(rs("5000"), [("processStdout", "hello\nworld"), ("processState", "RUNNING")])]
    ),
    EventId.QUEUE_CHANGE: ElementChange(7, ElementKind.QUEUE, [ElementGroup(rs("110"), [("queueState", "STOPPED")])]),
    EventId.RM_CHANGE: ElementChange(7, None, [ElementGroup(rs("100"), [("name", "cluster")])]),
    EventId.REMOVE_ALL: RemoveAll(7),
    EventId.REMOVE_JOB: RemoveElements(7, ElementKind.JOB, rs("1042")),
    EventId.REMOVE_MACHINE: RemoveElements(7, ElementKind.MACHINE, rs("101")),
    EventId.REMOVE_NODE: RemoveElements(7, ElementKind.NODE, rs("200-263,265")),
    EventId.REMOVE_PROCESS: RemoveProcesses(7, "1042", rs("5000-5003")),
    EventId.REMOVE_QUEUE: RemoveElements(7, ElementKind.QUEUE, rs("110")),
    EventId.FILTER_DEF: FilterDef(8, ["opaque", "filter=x"]),
    EventId.ATTR_DEF: AttrDef(8, [STATE, PROCS]),
    EventId.OUTPUT: OutputEvent(9, "1042", 1, "stderr", 12, 0, "a line\nwith = and : in it\n\nafter an empty one"),
}


def test_every_event_id_has_a_sample():
    assert set(SAMPLES) == set(EventId)


@pytest.mark.parametrize("event_id", list(EventId), ids=lambda e: e.name)
def test_event_round_trip(event_id):
    event = SAMPLES[event_id]
    assert event.event_id == event_id
    data = event.encode()
    assert data == encode_event(event)
    assert data[9:13] == b"%04X" % event_id
    decoded = through_the_wire(event)
    assert decoded == event
    assert type(decoded) is type(event)
    assert decoded.encode() == data


def test_event_ids_match_the_reference_numbering():
    expected = {
        "OK": 0, "MESSAGE": 1, "ERROR": 5, "SHUTDOWN": 6,
        "SUBMITJOB_ERROR": 211, "TERMINATEJOB_ERROR": 212,
        "NEW_JOB": 220, "NEW_MACHINE": 221, "NEW_NODE": 222, "NEW_PROCESS": 223, "NEW_QUEUE": 224,
        "JOB_CHANGE": 230, "MACHINE_CHANGE": 231, "NODE_CHANGE": 232, "PROCESS_CHANGE": 233,
        "QUEUE_CHANGE": 234, "RM_CHANGE": 235,
        "REMOVE_ALL": 240, "REMOVE_JOB": 241, "REMOVE_MACHINE": 242, "REMOVE_NODE": 243,
        "REMOVE_PROCESS": 244, "REMOVE_QUEUE": 245,
        "FILTER_DEF": 250, "ATTR_DEF": 251,
        "OUTPUT": 260,  # this agent's own (answers GET_OUTPUT)
    }
    assert {e.name: int(e) for e in EventId} == expected
    assert {c.name: int(c) for c in CommandId} == {
        "QUIT": 0, "INIT": 1, "MODEL_DEF": 2, "START_EVENTS": 3, "STOP_EVENTS": 4, "SUBMIT_JOB": 5,
        "TERMINATE_JOB": 6, "MOVE_JOB": 7, "CHANGE_JOB": 8, "LIST_FILTERS": 9, "SET_FILTERS": 10,
        "GET_OUTPUT": 16,  # this agent's own, clear of the PTP 4.0 client's 7..13
    }


def test_completing_events():
    completing = {e for e, sample in SAMPLES.items() if sample.completes}
    assert completing == {
        EventId.OK, EventId.ERROR, EventId.SHUTDOWN, EventId.SUBMITJOB_ERROR, EventId.TERMINATEJOB_ERROR
    }


# ----------------------------------------------------------------- exact layouts


def test_new_machine_is_byte_exact():
    assert SAMPLES[EventId.NEW_MACHINE].encode().replace(b"00000007", b"00000003", 1) == (
        b"00000075 00DD:00000003:00000006 00000003:100 00000001:1 00000003:101 00000001:2 "
        b"0000000B:name=login1 0000000F:machineState=UP"
    )


def test_status_event_layouts():
    assert Ok(1).to_args() == []
    assert Shutdown(1).to_args() == []
    assert RemoveAll(1).to_args() == []
    assert Error(1, ErrorCode.BAD_ARGUMENTS, "no = here?").to_args() == [
        "2", "errorCode=4", "errorMsg=no = here?"
    ]
    assert Message(1, MessageLevel.ERROR, ErrorCode.TID_IN_USE, "busy").to_args() == [
        "3", "messageLevel=ERROR", "messageCode=5", "messageText=busy"
    ]
    assert Message(1, "DEBUG", 0, "").to_args() == ["3", "messageLevel=DEBUG", "messageCode=0", "messageText="]
    assert SubmitJobError(1, "s7", ErrorCode.SUBMIT_FAILED, "bad").to_args() == [
        "3", "jobSubId=s7", "errorCode=9", "errorMsg=bad"
    ]
    assert TerminateJobError(1, "1042", 10, "gone").to_args() == [
        "3", "jobId=1042", "errorCode=10", "errorMsg=gone"
    ]


def test_new_node_from_parent_and_groups():
    event = NewElements(
        3,
        ElementKind.NODE,
        "101",
        [
            ElementGroup(RangeSet.from_ids(range(102, 106)), [("nodeState", "UP"), ("nodeNumber", "0")]),
            ElementGroup(RangeSet.from_ids([106]), ["name=n4", "nodeState=DOWN"]),
            ElementGroup(rs("110-111,107"), []),
        ],
    )
    assert event.event_id is EventId.NEW_NODE
    assert event.to_args() == [
        "101", "3",
        "102-105", "2", "nodeState=UP", "nodeNumber=0",
        "106", "2", "name=n4", "nodeState=DOWN",
        "107,110-111", "0",
    ]
    assert through_the_wire(event) == event


def test_change_and_remove_layouts():
    change = ElementChange(4, ElementKind.NODE, [ElementGroup(rs("1-3"), [("nodeState", "DOWN")])])
    assert change.to_args() == ["1", "1-3", "1", "nodeState=DOWN"]
    proc = ProcessChange(4, "1042", [ElementGroup(rs("7"), [("processStdout", "a=b")])])
    assert proc.to_args() == ["1042", "1", "7", "1", "processStdout=a=b"]
    assert RemoveElements(4, ElementKind.JOB, rs("9,3-4")).to_args() == ["3-4,9"]
    assert RemoveProcesses(4, "1042", rs("7-9")).to_args() == ["1042", "7-9"]
    assert ElementChange(4, None, []).event_id is EventId.RM_CHANGE


def test_process_changes_need_their_own_class():
    with pytest.raises(ValueError):
        ElementChange(4, ElementKind.PROCESS, [])


def test_attribute_values_split_at_the_first_equals():
    event = decode_event(frame_of(EventId.JOB_CHANGE, "1", "5", "3", "env=PATH=/bin:/usr/bin", "progArgs=-x", "progArgs="))
    assert event.groups[0].attributes == (("env", "PATH=/bin:/usr/bin"), ("progArgs", "-x"), ("progArgs", ""))


def test_string_element_ids_round_trip():
    event = NewElements(7, ElementKind.JOB, "100", [ElementGroup("100:job-7", [("jobSubId", "s1")])])
    decoded = through_the_wire(event)
    assert decoded == event
    assert decoded.groups[0].ids == "100:job-7"
    assert RemoveElements(7, ElementKind.JOB, "100:job-7") == through_the_wire(
        RemoveElements(7, ElementKind.JOB, "100:job-7")
    )


def test_attr_def_layout():
    args = AttrDef(2, [PROCS, STATE]).to_args()
    assert args[:10] == [
        "2",
        "8", "jobNumProcs", "INTEGER", PROCS.name, PROCS.description, "true", "1", "1", "2147483647",
    ]
    assert args[10:17] == [
        str(6 + len(STATE.values)), "machineState", "ENUMERATED", STATE.name, STATE.description, "true", "UNKNOWN"
    ]
    assert args[17:] == ["UP", "DOWN", "ALERT", "ERROR", "UNKNOWN"]


def test_attr_def_with_every_type_round_trips():
    defs = [
        AttributeDefinition("flag", AttrType.BOOLEAN, "Flag", "a flag", False, "false"),
        AttributeDefinition("load", AttrType.DOUBLE, "Load", "", True, "0.5", minimum="0.0", maximum="64.0"),
        AttributeDefinition("tags", AttrType.ARRAY, "Tags", "labels"),
        AttributeDefinition("note", AttrType.STRING, "Note", "free text \u00e9"),
    ]
    event = AttrDef(2, defs + list(STANDARD_ATTRIBUTES))
    assert through_the_wire(event) == event


# ----------------------------------------------------------------- malformed event arguments

BAD_EVENTS = [
    (frame_of(2), "unknown event id 2"),
    (frame_of(0x1234), "unknown event id"),
    (frame_of(EventId.OK, "x"), "OK takes no arguments"),
    (frame_of(EventId.SHUTDOWN, "x"), "SHUTDOWN takes no arguments"),
    (frame_of(EventId.REMOVE_ALL, "1"), "REMOVE_ALL takes no arguments"),
    (frame_of(EventId.ERROR), "missing ERROR argument count"),
    (frame_of(EventId.ERROR, "two", "errorCode=1", "errorMsg=x"), "decimal number"),
    (frame_of(EventId.ERROR, "2", "errorCode=1"), "takes 2 attributes"),
    (frame_of(EventId.ERROR, "3", "errorCode=1", "errorMsg=x", "extra=1"), "takes 2 attributes"),
    (frame_of(EventId.ERROR, "2", "errorMsg=x", "errorCode=1"), "expected errorCode="),
    (frame_of(EventId.ERROR, "2", "errorCode", "errorMsg=x"), "expected errorCode="),
    (frame_of(EventId.ERROR, "2", "errorCode=bad", "errorMsg=x"), "errorCode must be an integer"),
    (frame_of(EventId.MESSAGE, "3", "messageLevel=LOUD", "messageCode=1", "messageText=x"), "messageLevel"),
    (frame_of(EventId.MESSAGE, "3", "messageLevel=INFO", "messageCode=x", "messageText=x"), "messageCode"),
    (frame_of(EventId.SUBMITJOB_ERROR, "3", "jobId=1", "errorCode=1", "errorMsg=x"), "expected jobSubId="),
    (frame_of(EventId.TERMINATEJOB_ERROR, "2", "jobId=1", "errorCode=1"), "takes 3 attributes"),
    (frame_of(EventId.NEW_NODE), "missing parent id"),
    (frame_of(EventId.NEW_NODE, "101"), "missing number of ranges"),
    (frame_of(EventId.NEW_NODE, "101", "x"), "number of ranges must be a decimal number"),
    (frame_of(EventId.NEW_NODE, "101", "2", "5", "0"), "range group 2 of 2 is missing"),
    (frame_of(EventId.NEW_NODE, "101", "1", "5", "2", "name=a"), "declares 2 attributes, 1 present"),
    (frame_of(EventId.NEW_NODE, "101", "1", "5", "-1"), "attribute count of group 1"),
    (frame_of(EventId.NEW_NODE, "101", "1", "9-5", "0"), "range group 1: bad element ids"),
    (frame_of(EventId.NEW_NODE, "101", "1", "1,,2", "0"), "range group 1: bad element ids"),
    (frame_of(EventId.NEW_NODE, "101", "1", "", "0"), "empty element id"),
    (frame_of(EventId.NEW_NODE, "101", "1", "5", "1", "no-equals"), "range group 1"),
    (frame_of(EventId.NEW_NODE, "101", "1", "5", "1", "=value"), "empty key"),
    (frame_of(EventId.NEW_NODE, "101", "1", "5", "0", "stray"), "1 arguments after the last range group"),
    (frame_of(EventId.NODE_CHANGE, "1", "5", "0", "x", "y"), "2 arguments after the last range group"),
    (frame_of(EventId.PROCESS_CHANGE), "missing job id"),
    (frame_of(EventId.PROCESS_CHANGE, "1042", "1", "5-", "0"), "bad element ids"),
    (frame_of(EventId.REMOVE_NODE), "takes one id range"),
    (frame_of(EventId.REMOVE_NODE, "1", "2"), "takes one id range"),
    (frame_of(EventId.REMOVE_NODE, "3-1"), "REMOVE_NODE"),
    (frame_of(EventId.REMOVE_PROCESS, "1042"), "takes a job id and an id range"),
    (frame_of(EventId.REMOVE_PROCESS, "1042", "1--2"), "REMOVE_PROCESS"),
    (frame_of(EventId.ATTR_DEF), "ATTR_DEF"),
    (frame_of(EventId.ATTR_DEF, "1", "6", "x", "COLOUR", "X", "", "true", ""), "unknown attribute type"),
    (frame_of(EventId.ATTR_DEF, "2", "6", "x", "STRING", "X", "", "true", ""), "declares 2 definitions"),
]


@pytest.mark.parametrize("frame, words", BAD_EVENTS, ids=[w for _, w in BAD_EVENTS])
def test_malformed_event_arguments(frame, words):
    with pytest.raises(ArgumentError) as info:
        decode_event(frame)
    assert words in str(info.value)


# ----------------------------------------------------------------- commands and INIT


def test_command_from_frame():
    command = Command.from_frame(Frame(5, 12, ("jobSubId=a",)))
    assert command.command_id is CommandId.SUBMIT_JOB and command.known and command.name == "SUBMIT_JOB"
    assert command.encode() == encode_frame(5, 12, ["jobSubId=a"])
    unknown = Command.from_frame(Frame(0x42, 1, ()))
    assert not unknown.known and unknown.command_id == 0x42 and "0x0042" in unknown.name


def test_init_reference_form():
    assert parse_init(["version=2.0", "baseId=100"]) == InitRequest("2.0", 100)


def test_init_bare_form():
    assert parse_init(["2.0", "100"]) == InitRequest("2.0", 100)


def test_init_keeps_extra_attributes_and_any_order():
    init = parse_init(["baseId=7", "token=abc=def", "version=2.0"])
    assert (init.version, init.base_id) == ("2.0", 7)
    assert init.get("token") == "abc=def" and init.get("nope") is None


def test_init_keeps_unknown_attributes_and_names_the_dialect():
    init = parse_init(["version=2.0", "baseId=16777216", "slurmdPath=", "slurmdArgs=-D", "dialect=native"])
    assert init.dialect == "native" and init.get("slurmdPath") == "" and init.get("slurmdArgs") == "-D"
    assert parse_init(["2.0", "1"]).dialect is None


@pytest.mark.parametrize("code", ["1_0", "\u0661", " 1", "+1", "1.0", "", "9" * 21])
def test_numbers_in_events_are_ascii_decimal_only(code):
    with pytest.raises(ArgumentError, match="errorCode must be an integer"):
        decode_event(frame_of(EventId.ERROR, "2", f"errorCode={code}", "errorMsg=x"))
    assert decode_event(frame_of(EventId.ERROR, "2", "errorCode=-3", "errorMsg=x")).code == -3


def test_init_returns_unsupported_versions_for_the_session_to_refuse():
    assert parse_init(["version=9.9", "baseId=1"]).version == "9.9"


@pytest.mark.parametrize(
    "args, words",
    [
        (["version=2.0"], "missing the base id"),
        (["2.0"], "missing the base id"),
        ([], "missing the protocol version"),
        (["baseId=100"], "missing the protocol version"),
        (["version=2.0", "baseId=abc"], "non-negative decimal integer"),
        (["version=2.0", "baseId=-5"], "non-negative decimal integer"),
        (["version=2.0", "baseId="], "non-negative decimal integer"),
        (["version=2.0", "baseId=\u0661\u0662"], "non-negative decimal integer"),
        (["2.0", "1x0"], "non-negative decimal integer"),
        (["2.0", "100", "7"], "3 bare arguments"),
        (["version=2.0", "baseId=1", "baseId=2"], "given twice"),
        (["version=2.0", "baseId=1", "=x"], "empty key"),
        (["version=2.0", "baseId=1_0"], "non-negative decimal integer"),
        (["version=2.0", "baseId= 10"], "non-negative decimal integer"),
        (["version=2.0", "baseId=" + "1" * 21], "at most 20"),
        (["version=2.0", "baseId=1", "dialect=native", "dialect=default"], "'dialect' given twice"),
    ],
)
def test_init_errors(args, words):
    with pytest.raises(ArgumentError) as info:
        parse_init(args)
    assert words in str(info.value)


# ----------------------------------------------------------------- properties

keys = st.text(st.characters(codec="utf-8", exclude_characters="="), min_size=1, max_size=10)
values = st.text(st.characters(codec="utf-8"), max_size=15)
range_sets = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 50)), min_size=1, max_size=5).map(
    lambda pairs: RangeSet([(a, a + n) for a, n in pairs])
)
groups = st.builds(
    ElementGroup,
    ids=st.one_of(range_sets, st.from_regex(r"[0-9]{1,4}:[!-+\--~]{1,8}", fullmatch=True)),
    attributes=st.lists(st.tuples(keys, values), max_size=4),
)
element_events = st.one_of(
    st.builds(NewElements, tid=st.integers(0, 0xFFFFFFFF), kind=st.sampled_from(ElementKind),
              parent_id=st.from_regex(r"[0-9]{1,6}", fullmatch=True), groups=st.lists(groups, max_size=4)),
    st.builds(ElementChange, tid=st.integers(0, 0xFFFFFFFF),
              kind=st.sampled_from([None, ElementKind.JOB, ElementKind.NODE, ElementKind.MACHINE, ElementKind.QUEUE]),
              groups=st.lists(groups, max_size=4)),
    st.builds(ProcessChange, tid=st.integers(0, 0xFFFFFFFF), job_id=st.from_regex(r"[0-9]{1,6}", fullmatch=True),
              groups=st.lists(groups, max_size=4)),
    st.builds(Error, tid=st.integers(0, 0xFFFFFFFF), code=st.sampled_from(ErrorCode), message=values),
    st.builds(Message, tid=st.integers(0, 0xFFFFFFFF), level=st.sampled_from(MessageLevel),
              code=st.integers(0, 100), text=values),
)


@settings(max_examples=150, deadline=None)
@given(event=element_events)
def test_typed_round_trip_property(event):
    assert through_the_wire(event) == event
