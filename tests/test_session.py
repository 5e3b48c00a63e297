"""The agent-side session: phases, TIDs, refusals, and a rule-based model check."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES
from proxy_agent.protocol.messages import (
    AttrDef,
    Command,
    CommandId,
    ElementChange,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    EventId,
    InitRequest,
    Message,
    MessageLevel,
    NewElements,
    Ok,
    RemoveAll,
    Shutdown,
    SubmitJobError,
    TerminateJobError,
    decode_event,
)
from proxy_agent.protocol.dialect import DEFAULT, KEY_SPACE, NATIVE
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.session import Abandoned, AgentSession, Phase, ProtocolViolation
from proxy_agent.protocol.wire import Decoder, ErrorKind, Frame, FrameError

#: The tests below were written for the native dialect (the design's phase example).
INIT_ARGS = ("version=2.0", "baseId=100", "dialect=native")
DEFAULT_INIT_ARGS = ("version=2.0", "baseId=100")


def cmd(command_id: int, tid: int, *args: str) -> Frame:
    return Frame(int(command_id), tid, tuple(args))


def send_all(session: AgentSession, events) -> list:
    return [session.send(event) for event in events]


def session_in(phase: Phase, init_args=INIT_ARGS) -> AgentSession:
    """A session driven legally into ``phase`` (DISCOVERY with its MODEL_DEF done), using TIDs 1..5."""
    session = AgentSession()
    if phase is Phase.INITIALIZE:
        return session
    session.receive(cmd(CommandId.INIT, 1, *init_args))
    session.send(Ok(1))
    session.receive(cmd(CommandId.MODEL_DEF, 2))
    session.send(Ok(2))
    if phase is Phase.DISCOVERY:
        return session
    send_all(session, session.receive(cmd(CommandId.START_EVENTS, 3)).replies)
    if phase is Phase.NORMAL:
        return session
    send_all(session, session.receive(cmd(CommandId.STOP_EVENTS, 4)).replies)
    if phase is Phase.SUSPENDED:
        return session
    send_all(session, session.receive(cmd(CommandId.QUIT, 5)).replies)
    assert session.phase is Phase.SHUTDOWN
    return session


# ----------------------------------------------------------------- the design's phase example


def test_phase_example_literally():
    """INIT(1) .. SHUTDOWN(6), every event and TID in order, checked on the wire."""
    session = AgentSession()
    wire_out = bytearray()

    def emit(*events):
        for event in events:
            wire_out.extend(session.send(event).encode())

    # -- initialize phase --
    assert session.phase is Phase.INITIALIZE
    r = session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
    assert r.command is not None and r.command.command_id is CommandId.INIT and r.command.tid == 1
    assert r.replies == [] and r.init == InitRequest("2.0", 100, (("dialect", "native"),))
    emit(Ok(1))
    # -- definition phase --
    assert session.phase is Phase.DISCOVERY
    r = session.receive(cmd(CommandId.MODEL_DEF, 2))
    assert r.command.command_id is CommandId.MODEL_DEF and r.replies == []
    emit(AttrDef(2, STANDARD_ATTRIBUTES[:3]), AttrDef(2, STANDARD_ATTRIBUTES[3:]), Ok(2))
    assert session.phase is Phase.DISCOVERY
    # -- normal phase --
    r = session.receive(cmd(CommandId.START_EVENTS, 3))
    assert r.command.command_id is CommandId.START_EVENTS and r.replies == []
    assert session.phase is Phase.NORMAL and session.events_tid == 3 and session.events_flowing
    emit(
        NewElements(3, ElementKind.MACHINE, "100", [ElementGroup(RangeSet.parse("101"), ["name=login1", "machineState=UP"])]),
        NewElements(3, ElementKind.NODE, "101", [ElementGroup(RangeSet.parse("102-109"), ["nodeState=UP"])]),
    )
    r = session.receive(cmd(CommandId.STOP_EVENTS, 4))
    assert r.command.command_id is CommandId.STOP_EVENTS
    assert r.replies == [Ok(3)]
    emit(*r.replies)
    # -- suspended phase --
    assert session.phase is Phase.SUSPENDED and not session.events_flowing
    r = session.receive(cmd(CommandId.START_EVENTS, 5))
    assert r.command.command_id is CommandId.START_EVENTS
    assert r.replies == [Ok(4)]
    emit(*r.replies)
    # -- normal phase --
    assert session.phase is Phase.NORMAL and session.events_tid == 5
    emit(NewElements(5, ElementKind.QUEUE, "100", [ElementGroup(RangeSet.parse("110"), ["name=batch"])]))
    r = session.receive(cmd(CommandId.QUIT, 6))
    assert r.command.command_id is CommandId.QUIT
    assert r.replies == [Ok(5), Shutdown(6)]
    emit(*r.replies)
    assert session.phase is Phase.SHUTDOWN and session.open == {}

    decoder = Decoder()
    decoder.feed(bytes(wire_out))
    decoder.feed_eof()
    seen = [(decode_event(frame).event_id.name, frame.tid) for frame in decoder]
    assert seen == [
        ("OK", 1),
        ("ATTR_DEF", 2),
        ("ATTR_DEF", 2),
        ("OK", 2),
        ("NEW_MACHINE", 3),
        ("NEW_NODE", 3),
        ("OK", 3),
        ("OK", 4),
        ("NEW_QUEUE", 5),
        ("OK", 5),
        ("SHUTDOWN", 6),
    ]


# ----------------------------------------------------------------- refusals

ALL_PHASES = [Phase.INITIALIZE, Phase.DISCOVERY, Phase.NORMAL, Phase.SUSPENDED]
VALID_ARGS = {
    CommandId.INIT: INIT_ARGS,
    CommandId.SUBMIT_JOB: ("jobSubId=s1", "execName=/bin/true"),
    CommandId.TERMINATE_JOB: ("jobId=1042",),
    CommandId.MOVE_JOB: ("jobId=1042", "queueId=110"),
    CommandId.CHANGE_JOB: ("jobId=1042", "jobState=SUSPENDED"),
    CommandId.SET_FILTERS: ("nodeState=UP",),
}
LEGAL = {
    Phase.INITIALIZE: {CommandId.INIT, CommandId.QUIT},
    Phase.DISCOVERY: {CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.QUIT},
    Phase.NORMAL: set(CommandId) - {CommandId.INIT, CommandId.START_EVENTS},
    Phase.SUSPENDED: set(CommandId) - {CommandId.INIT, CommandId.STOP_EVENTS},
}


@pytest.mark.parametrize("phase", ALL_PHASES, ids=lambda p: p.name)
@pytest.mark.parametrize("command_id", list(CommandId), ids=lambda c: c.name)
def test_legal_and_illegal_commands_per_phase(phase, command_id):
    session = session_in(phase)
    r = session.receive(cmd(command_id, 77, *VALID_ARGS.get(command_id, ())))
    if command_id in LEGAL[phase]:
        assert r.command is not None and r.command.tid == 77
        assert session.is_open(77)
        assert not any(isinstance(e, Error) and e.tid == 77 for e in r.replies)
    else:
        assert r.command is None
        assert r.replies == [Error(77, ErrorCode.ILLEGAL_IN_PHASE, r.replies[0].message)]
        assert command_id.name in r.replies[0].message and phase.value in r.replies[0].message
        before = session.phase
        send_all(session, r.replies)
        assert not session.is_open(77) and session.phase is before


def test_start_events_needs_a_completed_model_def():
    session = AgentSession()
    session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
    session.send(Ok(1))
    r = session.receive(cmd(CommandId.START_EVENTS, 3))
    assert r.command is None and r.replies[0].code == ErrorCode.ILLEGAL_IN_PHASE
    assert "MODEL_DEF" in r.replies[0].message
    send_all(session, r.replies)
    session.receive(cmd(CommandId.MODEL_DEF, 4))
    assert session.receive(cmd(CommandId.START_EVENTS, 5)).replies[0].code == ErrorCode.ILLEGAL_IN_PHASE
    session.send(Ok(4))
    assert session.receive(cmd(CommandId.START_EVENTS, 6)).command is not None


@pytest.mark.parametrize("phase", ALL_PHASES, ids=lambda p: p.name)
@pytest.mark.parametrize("command_id", [0xB, 0x0D, 0x1234, 0xFFFF])
def test_unknown_command_gets_error(phase, command_id):
    session = session_in(phase)
    r = session.receive(cmd(command_id, 42, "x=1"))
    assert r.command is None
    (error,) = r.replies
    assert isinstance(error, Error) and error.tid == 42 and error.code == ErrorCode.UNKNOWN_COMMAND
    assert "0x%04X" % command_id in error.message
    send_all(session, r.replies)
    assert not session.is_open(42)


@pytest.mark.parametrize(
    "phase, command_id, args, words",
    [
        (Phase.NORMAL, CommandId.STOP_EVENTS, ("x",), "takes no arguments"),
        (Phase.DISCOVERY, CommandId.MODEL_DEF, ("a", "b"), "got 2"),
        (Phase.NORMAL, CommandId.QUIT, ("now",), "takes no arguments"),
        (Phase.NORMAL, CommandId.SUBMIT_JOB, ("execName=/bin/true",), "jobSubId"),
        (Phase.NORMAL, CommandId.SUBMIT_JOB, ("jobSubId=s1", "no-equals"), "'no-equals'"),
        (Phase.NORMAL, CommandId.TERMINATE_JOB, (), "jobId"),
        (Phase.SUSPENDED, CommandId.TERMINATE_JOB, ("1042",), "'1042'"),
        (Phase.NORMAL, CommandId.MOVE_JOB, ("jobId=1",), "queueId"),
        (Phase.NORMAL, CommandId.CHANGE_JOB, ("jobState=RUNNING",), "jobId"),
        (Phase.NORMAL, CommandId.SET_FILTERS, ("=x",), "'=x'"),
        (Phase.INITIALIZE, CommandId.INIT, ("version=2.0", "baseId=x"), "base id"),
        (Phase.INITIALIZE, CommandId.INIT, ("1", "2", "3"), "3 bare arguments"),
    ],
)
def test_bad_arguments_get_error(phase, command_id, args, words):
    session = session_in(phase)
    r = session.receive(cmd(command_id, 50, *args))
    assert r.command is None
    (error,) = r.replies
    # A refused submission (termination) is reported the way clients match them: by jobSubId (jobId).
    expected = {CommandId.SUBMIT_JOB: SubmitJobError, CommandId.TERMINATE_JOB: TerminateJobError}.get(command_id, Error)
    assert type(error) is expected and error.tid == 50 and error.code == ErrorCode.BAD_ARGUMENTS
    assert words in error.message and command_id.name in error.message
    if command_id is CommandId.SUBMIT_JOB:
        assert error.job_sub_id == dict(a.split("=", 1) for a in args if "=" in a).get("jobSubId", "")
    send_all(session, r.replies)
    assert session.phase is phase and not session.is_open(50)


@pytest.mark.parametrize(
    "args, code, words",
    [
        (("version=1.0", "baseId=100"), ErrorCode.UNSUPPORTED_VERSION, "'1.0'"),
        (("3.0", "100"), ErrorCode.UNSUPPORTED_VERSION, "2.0"),
        (("version=2.0",), ErrorCode.BAD_ARGUMENTS, "base id"),
        (("2.0",), ErrorCode.BAD_ARGUMENTS, "base id"),
        ((), ErrorCode.BAD_ARGUMENTS, "version"),
    ],
)
def test_bad_init_keeps_initialize(args, code, words):
    session = AgentSession()
    r = session.receive(cmd(CommandId.INIT, 1, *args))
    assert r.command is None and r.init is None
    (error,) = r.replies
    assert error.tid == 1 and error.code == code and words in error.message
    send_all(session, r.replies)
    assert session.phase is Phase.INITIALIZE and session.init is None
    # the client may try again, even with the same TID
    r = session.receive(cmd(CommandId.INIT, 1, "2.0", "100"))
    assert r.command is not None and r.init == InitRequest("2.0", 100)
    session.send(Ok(1))
    assert session.phase is Phase.DISCOVERY


def test_only_one_init_at_a_time():
    session = AgentSession()
    assert session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS)).command is not None
    r = session.receive(cmd(CommandId.INIT, 2, *INIT_ARGS))
    assert r.command is None and r.replies[0].code == ErrorCode.ILLEGAL_IN_PHASE
    assert "TID 1" in r.replies[0].message
    send_all(session, r.replies)
    session.send(Ok(1))
    assert session.phase is Phase.DISCOVERY


def test_check_is_send_by_id():
    session = session_in(Phase.NORMAL)
    session.check(EventId.NODE_CHANGE, 3)
    with pytest.raises(ProtocolViolation):
        session.check(EventId.NODE_CHANGE, 4)
    send_all(session, session.receive(cmd(CommandId.STOP_EVENTS, 4)).replies)
    with pytest.raises(ProtocolViolation):
        session.check(EventId.NODE_CHANGE, 3)
    session.check(EventId.OK, 4)
    assert not session.is_open(4)


def test_agent_may_fail_init():
    session = AgentSession()
    session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
    session.send(Error(1, ErrorCode.AUTHENTICATION, "bad token"))
    assert session.phase is Phase.INITIALIZE


# ----------------------------------------------------------------- TID reuse


@pytest.mark.parametrize("reuse", [CommandId.SUBMIT_JOB, CommandId.STOP_EVENTS, 0x99, CommandId.INIT])
def test_tid_reuse_while_open_gets_error_and_abandons_the_open_command(reuse):
    session = session_in(Phase.NORMAL)
    first = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    assert first.command is not None and first.transaction.tid == 9
    r = session.receive(cmd(reuse, 9, "jobSubId=b"))
    assert r.command is None
    (error,) = r.replies
    assert isinstance(error, Error) and error.tid == 9 and error.code == ErrorCode.TID_IN_USE
    assert "TID 9" in error.message and "SUBMIT_JOB" in error.message and "abandoned" in error.message
    send_all(session, r.replies)
    assert not session.is_open(9) and session.phase is Phase.NORMAL
    assert first.transaction.abandoned
    # the abandoned submission may still finish inside the agent: nothing goes out for it
    with pytest.raises(Abandoned):
        session.send(SubmitJobError(9, "a", ErrorCode.SUBMIT_FAILED, "no"), first.transaction)
    assert session.write(Ok(9), first.transaction) == b""
    # now free again
    assert session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=c")).command is not None


def test_default_dialect_carries_out_a_command_on_an_open_tid():
    """As the PTP 4.0 client's own proxies do: both commands run, each gets its answer on the
    TID, in whatever order the agent finishes them; the TID is open until both are answered."""
    session = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    first = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    second = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=b"))
    assert second.command is not None and second.replies == []
    assert not first.transaction.abandoned and session.open_on(9) == [first.transaction, second.transaction]
    assert session.open_count(9) == 2
    assert session.write(Ok(9), second.transaction) == Ok(9).encode()
    assert session.is_open(9) and session.open_on(9) == [first.transaction]
    assert session.write(SubmitJobError(9, "a", ErrorCode.SUBMIT_FAILED, "no"), first.transaction)
    assert not session.is_open(9)
    with pytest.raises(ProtocolViolation, match="already completed"):
        session.send(Ok(9), second.transaction)


def test_default_dialect_a_command_on_the_events_tid_leaves_events_on():
    session = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    listed = session.receive(cmd(CommandId.LIST_FILTERS, 3))
    assert listed.command is not None and listed.replies == []
    session.send(Ok(3), listed.transaction)
    assert session.events_flowing and session.events_tid == 3
    session.send(RemoveAll(3))  # still open for the client: its START_EVENTS is not answered
    r = session.receive(cmd(CommandId.STOP_EVENTS, 3))
    assert r.replies == [Ok(3), Ok(3)]
    assert [owner.command_id for owner in r.owners] == [CommandId.START_EVENTS, CommandId.STOP_EVENTS]
    for reply, owner in r.answers():
        session.send(reply, owner)
    assert not session.is_open(3) and session.phase is Phase.SUSPENDED


def test_default_dialect_quit_on_an_open_tid_answers_its_holder_first():
    session = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    submit = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    r = session.receive(cmd(CommandId.QUIT, 9))
    assert r.command is not None
    assert [(type(e), e.tid) for e in r.replies] == [(Ok, 3), (Error, 9), (Shutdown, 9)]
    for reply, owner in r.answers():
        session.send(reply, owner)
    assert session.phase is Phase.SHUTDOWN and session.open == {}
    assert submit.transaction.abandoned and session.write(Ok(9), submit.transaction) == b""


def test_default_dialect_a_malformed_frame_on_an_open_tid_leaves_the_holder_alone():
    session = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    submit = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    r = session.receive(FrameError(ErrorKind.BAD_HEADER, "broken", 5, 9))
    ((error, owner),) = r.answers()
    assert error.code == ErrorCode.MALFORMED_FRAME and owner is not submit.transaction
    session.send(error, owner)
    assert session.open_on(9) == [submit.transaction]
    assert session.write(Ok(9), submit.transaction) == Ok(9).encode()


def test_a_late_answer_is_not_taken_for_the_next_command_on_the_tid():
    session = session_in(Phase.NORMAL)
    first = session.receive(cmd(CommandId.TERMINATE_JOB, 9, "jobId=1"))
    send_all(session, session.receive(cmd(CommandId.LIST_FILTERS, 9)).replies)  # refused: 9 is in use
    third = session.receive(cmd(CommandId.TERMINATE_JOB, 9, "jobId=2"))
    assert third.transaction is not first.transaction
    # the first terminate finishes now: its OK must not complete the third
    assert session.write(Ok(9), first.transaction) == b""
    assert session.is_open(9) and session.open[9] is third.transaction
    assert session.write(Ok(9), third.transaction) == Ok(9).encode()
    assert not session.is_open(9)
    with pytest.raises(ProtocolViolation, match="already completed"):
        session.send(Ok(9), third.transaction)


def test_a_late_answer_by_tid_alone_is_withheld_when_the_tid_is_free():
    session = session_in(Phase.NORMAL)
    session.receive(cmd(CommandId.TERMINATE_JOB, 9, "jobId=1"))
    send_all(session, session.receive(cmd(CommandId.LIST_FILTERS, 9)).replies)
    with pytest.raises(Abandoned):
        session.send(Message(9, MessageLevel.INFO, 0, "still working"))
    with pytest.raises(Abandoned):
        session.send(Ok(9))
    # once its completion was withheld, nothing more is expected for it
    with pytest.raises(ProtocolViolation) as info:
        session.send(Ok(9))
    assert not isinstance(info.value, Abandoned)


def test_reusing_the_events_tid_stops_events():
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.STOP_EVENTS, 3))
    assert r.command is None
    assert [type(e) for e in r.replies] == [Error] and r.replies[0].tid == 3
    assert r.replies[0].code == ErrorCode.TID_IN_USE and "START_EVENTS" in r.replies[0].message
    send_all(session, r.replies)
    # the client took TID 3 for completed: a model event under it would name a TID it does not know
    assert not session.events_flowing and session.events_tid is None and session.phase is Phase.SUSPENDED
    with pytest.raises(Abandoned):
        session.send(RemoveAll(3))
    assert session.write(RemoveAll(3)) == b""
    r = session.receive(cmd(CommandId.START_EVENTS, 3))
    assert r.command is not None and r.replies == [] and session.events_flowing
    session.send(RemoveAll(3))


def test_reusing_the_stop_events_tid_abandons_it():
    session = session_in(Phase.SUSPENDED)
    assert session.stop_tid == 4
    send_all(session, session.receive(cmd(CommandId.MODEL_DEF, 4)).replies)
    assert session.stop_tid is None and not session.is_open(4)
    r = session.receive(cmd(CommandId.START_EVENTS, 5))
    assert r.replies == []  # no OK for the abandoned STOP_EVENTS


def test_an_abandoned_init_still_initialises_but_an_abandoned_model_def_does_not_count():
    session = AgentSession()
    init = session.receive(cmd(CommandId.INIT, 0, *INIT_ARGS))
    send_all(session, session.receive(cmd(CommandId.MODEL_DEF, 0)).replies)  # refused: 0 is INIT's
    r = session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
    assert r.replies[0].code == ErrorCode.ILLEGAL_IN_PHASE and "in progress" in r.replies[0].message
    send_all(session, r.replies)
    assert session.write(Ok(0), init.transaction) == b""
    assert session.phase is Phase.DISCOVERY
    model_def = session.receive(cmd(CommandId.MODEL_DEF, 2))
    send_all(session, session.receive(cmd(CommandId.LIST_FILTERS, 2)).replies)  # refused, abandons MODEL_DEF
    assert session.write(Ok(2), model_def.transaction) == b""
    assert not session.model_defined
    r = session.receive(cmd(CommandId.START_EVENTS, 3))
    assert r.replies[0].code == ErrorCode.ILLEGAL_IN_PHASE


def test_quit_on_an_open_tid_is_carried_out():
    session = session_in(Phase.NORMAL)
    submit = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    r = session.receive(cmd(CommandId.QUIT, 3))  # the START_EVENTS' TID
    assert r.command is not None and r.command.command_id is CommandId.QUIT
    # START_EVENTS is abandoned without a word; the submission is abandoned by QUIT
    assert [(type(e), e.tid) for e in r.replies] == [(Error, 9), (Shutdown, 3)]
    send_all(session, r.replies)
    assert session.phase is Phase.SHUTDOWN
    assert session.write(Ok(9), submit.transaction) == b""


def test_a_malformed_quit_on_an_open_tid_is_refused_like_any_command():
    # found by random exploration: QUIT with an argument, on the START_EVENTS' TID
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.QUIT, 3, "jobSubId=s"))
    assert r.command is None and [(type(e), e.tid, e.code) for e in r.replies] == [(Error, 3, ErrorCode.TID_IN_USE)]
    send_all(session, r.replies)
    assert session.phase is Phase.SUSPENDED


def test_send_refuses_an_answer_for_another_tids_transaction():
    session = session_in(Phase.NORMAL)
    submit = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    with pytest.raises(ProtocolViolation, match="answers SUBMIT_JOB of TID 9"):
        session.send(Ok(10), submit.transaction)


def test_tids_may_be_reused_after_completion_and_need_no_order():
    session = session_in(Phase.NORMAL)
    for tid in (0xFFFFFFFF, 0, 12, 5, 12, 0):
        assert session.receive(cmd(CommandId.TERMINATE_JOB, tid, "jobId=1")).command is not None
        session.send(Ok(tid))


# ----------------------------------------------------------------- what send() refuses


def test_send_refuses_tids_that_are_not_open():
    session = session_in(Phase.NORMAL)
    for event in (Ok(99), Error(99, 1, "x"), Message(99, "INFO", 0, "x"), Shutdown(99), Ok(1)):
        with pytest.raises(ProtocolViolation):
            session.send(event)
    session.receive(cmd(CommandId.TERMINATE_JOB, 99, "jobId=1"))
    session.send(Ok(99))
    with pytest.raises(ProtocolViolation, match="no such open command"):
        session.send(Ok(99))


def test_send_refuses_model_events_while_suspended():
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.STOP_EVENTS, 4))
    # Even before the OK for START_EVENTS has gone out, events have stopped.
    with pytest.raises(ProtocolViolation, match="NORMAL"):
        session.send(RemoveAll(3))
    send_all(session, r.replies)
    assert session.phase is Phase.SUSPENDED
    for event in (RemoveAll(3), RemoveAll(4), ElementChange(4, ElementKind.NODE, [])):
        with pytest.raises(ProtocolViolation):
            session.send(event)
    # other TIDs still work while suspended
    session.receive(cmd(CommandId.SUBMIT_JOB, 8, "jobSubId=x"))
    session.send(Ok(8))


def test_send_refuses_model_events_under_other_tids():
    session = session_in(Phase.NORMAL)
    session.receive(cmd(CommandId.SUBMIT_JOB, 8, "jobSubId=x"))
    with pytest.raises(ProtocolViolation):
        session.send(NewElements(8, ElementKind.JOB, "110", [ElementGroup(RangeSet.parse("1"), ["jobSubId=x"])]))
    session.send(NewElements(3, ElementKind.JOB, "110", [ElementGroup(RangeSet.parse("1"), ["jobSubId=x"])]))
    session.send(Ok(8))


def test_agent_failing_start_events_stops_events():
    session = session_in(Phase.NORMAL)
    session.send(Error(3, ErrorCode.SCHEDULER, "lost the scheduler"))
    assert session.phase is Phase.SUSPENDED and session.events_tid is None
    with pytest.raises(ProtocolViolation):
        session.send(RemoveAll(3))
    assert session.receive(cmd(CommandId.STOP_EVENTS, 4)).replies[0].code == ErrorCode.ILLEGAL_IN_PHASE
    r = session.receive(cmd(CommandId.START_EVENTS, 5))
    assert r.command is not None and r.replies == []
    assert session.events_flowing and session.events_tid == 5


# ----------------------------------------------------------------- dialects


def test_default_dialect_answers_stop_events_at_once():
    session = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    assert session.dialect is DEFAULT
    r = session.receive(cmd(CommandId.STOP_EVENTS, 4))
    assert r.command.command_id is CommandId.STOP_EVENTS
    assert r.replies == [Ok(3), Ok(4)]
    send_all(session, r.replies)
    assert session.phase is Phase.SUSPENDED and session.open == {} and session.stop_tid is None
    # two launches while events are stopped, then events again: nothing waits
    for tid in (4, 5):
        submit = session.receive(cmd(CommandId.SUBMIT_JOB, tid, f"jobSubId=s{tid}"))
        session.send(Ok(tid), submit.transaction)
    r = session.receive(cmd(CommandId.START_EVENTS, 4))
    assert r.replies == [] and session.events_tid == 4 and session.events_flowing


def test_native_dialect_completes_stop_events_at_the_next_start_events():
    session = session_in(Phase.NORMAL)
    assert session.dialect is NATIVE
    r = session.receive(cmd(CommandId.STOP_EVENTS, 4))
    assert r.replies == [Ok(3)] and session.stop_tid == 4
    send_all(session, r.replies)
    assert session.is_open(4)
    assert session.receive(cmd(CommandId.START_EVENTS, 5)).replies == [Ok(4)]


@pytest.mark.parametrize(
    "args, dialect",
    [
        (("version=2.0", "baseId=100"), DEFAULT),
        (("version=2.0", "baseId=100", "dialect=default"), DEFAULT),
        (("version=2.0", "baseId=100", "dialect=native"), NATIVE),
        (("2.0", "100", "dialect=native"), NATIVE),
        # the PTP 4.0 client's SLURM resource manager adds attributes of its own
        (("version=2.0", "baseId=16777216", "slurmdPath=", "slurmdArgs=-D -v", "x=a=b"), DEFAULT),
    ],
)
def test_init_picks_the_dialect_and_ignores_unknown_attributes(args, dialect):
    session = AgentSession()
    r = session.receive(cmd(CommandId.INIT, 0, *args))
    assert r.command is not None and r.replies == [] and r.transaction.tid == 0
    assert session.dialect is dialect
    assert ("slurmdPath", "") in r.init.attributes or "slurmdPath=" not in args


@pytest.mark.parametrize(
    "args, words",
    [
        (("version=2.0", "baseId=100", "dialect=klingon"), "unknown dialect 'klingon'; this agent speaks default, native"),
        (("version=2.0", "baseId=100", "dialect=native", "dialect=native"), "'dialect' given twice"),
        (("version=2.0", "baseId=\u0661\u0662"), "decimal"),
        (("version=2.0", "baseId=1_0"), "decimal"),
        (("version=2.0", "baseId=" + "9" * 5000), "at most 20"),
    ],
)
def test_bad_init_attributes_get_error_in_the_default_dialect(args, words):
    session = AgentSession()
    r = session.receive(cmd(CommandId.INIT, 1, *args))
    (error,) = r.replies
    assert isinstance(error, Error) and error.code == ErrorCode.BAD_ARGUMENTS and words in error.message
    assert session.dialect is DEFAULT and r.init is None
    send_all(session, r.replies)
    assert session.phase is Phase.INITIALIZE


def test_default_dialect_refuses_a_base_id_whose_ids_would_not_fit_a_java_int():
    largest = 2**31 - KEY_SPACE
    session = AgentSession()
    r = session.receive(cmd(CommandId.INIT, 1, "version=2.0", f"baseId={largest + 1}"))
    (error,) = r.replies
    assert error.code == ErrorCode.BAD_ARGUMENTS
    assert f"at most {largest}" in error.message and "Java int" in error.message and "dialect=native" in error.message
    send_all(session, r.replies)
    assert session.receive(cmd(CommandId.INIT, 2, "version=2.0", f"baseId={largest}")).command is not None
    # 10^30 was once taken; the native dialect takes up to a 64-bit id
    native = AgentSession()
    assert native.receive(cmd(CommandId.INIT, 1, "version=2.0", "baseId=16777216", "dialect=native")).command
    for huge, words in ((10**19, "64-bit"), (10**30, "at most 20")):
        native = AgentSession()
        (error,) = native.receive(cmd(CommandId.INIT, 1, "version=2.0", f"baseId={huge}", "dialect=native")).replies
        assert error.code == ErrorCode.BAD_ARGUMENTS and words in error.message


def test_write_encodes_in_the_sessions_dialect():
    default = session_in(Phase.NORMAL, DEFAULT_INIT_ARGS)
    native = session_in(Phase.NORMAL)
    change = ElementChange(3, ElementKind.NODE, [ElementGroup(RangeSet.parse("101"), ["name=Überprüfung\\x"])])
    data = default.write(change)
    assert data.isascii() and b"name=\\xdcberpr\\xfcfung\\\\x" in data
    assert native.write(change) == change.encode()
    assert default.model_frame(EventId.NODE_CHANGE, change.to_args()) == data
    send_all(default, default.receive(cmd(CommandId.STOP_EVENTS, 4)).replies)
    with pytest.raises(ProtocolViolation):
        default.model_frame(EventId.NODE_CHANGE, change.to_args())
    # replies too: an error message quoting what the client sent
    session = AgentSession()
    (error,) = session.receive(cmd(CommandId.INIT, 1, "version=2.0", "baseId=x\u00e9")).replies
    assert session.write(error).isascii()


# ----------------------------------------------------------------- job commands


@pytest.mark.parametrize(
    "command_id, args, words",
    [
        # the PTP 4.0 client's own command 7 (event filters)
        (CommandId.MOVE_JOB, ("jobState=RUNNING", "filterChildren=true", "id=5"), "command 7 is MOVE_JOB here"),
        (CommandId.MOVE_JOB, ("jobId=5", "queueId=6", "filterChildren=true"), "takes only jobId= and queueId="),
        (CommandId.MOVE_JOB, ("jobId=5", "queueId=6", "jobId=7"), "jobId= given 2 times"),
        (CommandId.MOVE_JOB, ("jobId=5", "queueId=q1"), "queueId must be an element id"),
        (CommandId.TERMINATE_JOB, ("jobId=\u0661\u0662\u0663",), "plain decimal digits"),
        (CommandId.TERMINATE_JOB, ("jobId=1_0_1",), "plain decimal digits"),
        (CommandId.TERMINATE_JOB, ("jobId= 101",), "plain decimal digits"),
        (CommandId.TERMINATE_JOB, ("jobId=+101",), "plain decimal digits"),
        (CommandId.TERMINATE_JOB, ("jobId=101", "force=true"), "takes only jobId="),
        (CommandId.CHANGE_JOB, ("jobId=0x10", "jobState=SUSPENDED"), "plain decimal digits"),
        (CommandId.SUBMIT_JOB, ("jobSubId=s", "jobSubId=t"), "jobSubId= given 2 times"),
    ],
)
def test_job_commands_take_only_well_formed_decimal_ids(command_id, args, words):
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(command_id, 30, *args))
    assert r.command is None
    (error,) = r.replies
    assert error.tid == 30 and error.code == ErrorCode.BAD_ARGUMENTS and words in error.message, error.message
    send_all(session, r.replies)
    assert not session.is_open(30)


def test_well_formed_move_job_is_handed_over():
    session = session_in(Phase.SUSPENDED)
    r = session.receive(cmd(CommandId.MOVE_JOB, 30, "queueId=0008293", "jobId=12389"))
    assert r.command is not None and r.transaction.command_id is CommandId.MOVE_JOB


# ----------------------------------------------------------------- QUIT


def test_quit_from_suspended_completes_stop_events():
    session = session_in(Phase.SUSPENDED)
    assert session.stop_tid == 4
    r = session.receive(cmd(CommandId.QUIT, 5))
    assert r.replies == [Ok(4), Shutdown(5)]
    send_all(session, r.replies)
    assert session.phase is Phase.SHUTDOWN and session.open == {}


def test_quit_abandons_open_commands_with_error():
    session = session_in(Phase.NORMAL)
    session.receive(cmd(CommandId.SUBMIT_JOB, 10, "jobSubId=a"))
    session.receive(cmd(CommandId.MODEL_DEF, 11))
    r = session.receive(cmd(CommandId.QUIT, 12))
    assert r.replies[-1] == Shutdown(12)
    by_tid = {e.tid: e for e in r.replies[:-1]}
    assert by_tid[3] == Ok(3)
    assert by_tid[10].code == ErrorCode.SHUTTING_DOWN and "SUBMIT_JOB" in by_tid[10].message
    assert by_tid[11].code == ErrorCode.SHUTTING_DOWN
    send_all(session, r.replies)
    assert session.phase is Phase.SHUTDOWN
    with pytest.raises(ProtocolViolation):
        session.send(Ok(10))


def test_quit_in_initialize():
    session = AgentSession()
    r = session.receive(cmd(CommandId.QUIT, 0))
    assert r.replies == [Shutdown(0)]
    send_all(session, r.replies)
    assert session.phase is Phase.SHUTDOWN


def test_input_after_shutdown_is_ignored():
    session = session_in(Phase.SHUTDOWN)
    r = session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
    assert r.command is None and r.replies == [] and r.log
    r = session.receive(FrameError(ErrorKind.BAD_HEADER, "bad", 3, 9))
    assert r.replies == [] and r.log


# ----------------------------------------------------------------- malformed frames


def test_malformed_frame_with_readable_tid_gets_error():
    session = session_in(Phase.NORMAL)
    r = session.receive(FrameError(ErrorKind.ARG_OVERRUN, "argument 1 of 1 claims 16 bytes", 5, 21))
    (error,) = r.replies
    assert error == Error(21, ErrorCode.MALFORMED_FRAME, error.message) and "claims 16 bytes" in error.message
    send_all(session, r.replies)
    assert not session.is_open(21) and not r.close


def test_malformed_frame_without_tid_gets_message_under_events_tid():
    session = session_in(Phase.NORMAL)
    r = session.receive(FrameError(ErrorKind.BAD_HEADER, "header command/event id is not 4 hex digits"))
    (message,) = r.replies
    assert isinstance(message, Message) and message.tid == 3 and message.code == ErrorCode.MALFORMED_FRAME
    send_all(session, r.replies)
    assert session.events_flowing


def test_malformed_frame_without_tid_before_events_is_only_logged():
    session = session_in(Phase.DISCOVERY)
    r = session.receive(FrameError(ErrorKind.BAD_HEADER, "header too short"))
    assert r.replies == [] and "header too short" in r.log and not r.close


def test_malformed_frame_reusing_an_open_tid():
    session = session_in(Phase.NORMAL)
    r = session.receive(FrameError(ErrorKind.BAD_ENCODING, "not UTF-8", 5, 3))
    assert [type(e) for e in r.replies] == [Error] and r.replies[0].code == ErrorCode.TID_IN_USE
    assert "malformed frame" in r.replies[0].message and "not UTF-8" in r.replies[0].message
    send_all(session, r.replies)
    assert not session.events_flowing and not session.is_open(3)


@pytest.mark.parametrize("phase", [Phase.DISCOVERY, Phase.NORMAL], ids=lambda p: p.name)
def test_fatal_framing_error_closes(phase):
    session = session_in(phase)
    r = session.receive(FrameError(ErrorKind.FRAME_TOO_LARGE, "frame length 99999 exceeds the limit"))
    assert r.close and "framing lost" in r.log
    if phase is Phase.NORMAL:
        (message,) = r.replies
        assert message.tid == 3 and message.level == MessageLevel.FATAL and "99999" in message.text
    else:
        assert r.replies == []
    send_all(session, r.replies)


def test_session_accepts_frames_and_commands():
    session = AgentSession()
    r = session.receive(Command(CommandId.INIT, 1, INIT_ARGS))
    assert r.command == Command(CommandId.INIT, 1, INIT_ARGS)


# ----------------------------------------------------------------- model check

#: Allowed phase changes, by what caused them.
RECEIVE_TRANSITIONS = {
    (Phase.DISCOVERY, Phase.NORMAL),  # START_EVENTS
    (Phase.SUSPENDED, Phase.NORMAL),  # START_EVENTS
    (Phase.NORMAL, Phase.SUSPENDED),  # STOP_EVENTS, or (native) the START_EVENTS abandoned by a reused TID
}
SEND_TRANSITIONS = {
    (Phase.INITIALIZE, Phase.DISCOVERY),  # OK for INIT (also an abandoned INIT's, withheld)
    (Phase.NORMAL, Phase.SUSPENDED),  # START_EVENTS completed by the agent
} | {(p, Phase.SHUTDOWN) for p in Phase}

command_ids = st.one_of(st.sampled_from(list(CommandId)), st.integers(0, 0xFFFF))
arguments = st.lists(
    st.one_of(
        st.sampled_from(["jobSubId=s", "jobId=7", "queueId=1", "version=2.0", "baseId=100", "2.0", "100", "x", "=",
                         "", "dialect=native", "dialect=default", "dialect=x", "jobId=\u0667"]),
        st.text(max_size=6),
    ),
    max_size=3,
).map(tuple)
init_args = st.sampled_from([INIT_ARGS, DEFAULT_INIT_ARGS, DEFAULT_INIT_ARGS + ("slurmdPath=",)])


class SessionModel(RuleBasedStateMachine):
    """Random commands and agent behaviour against a tally of open commands kept here.

    The agent side behaves as the session asks: it sends every reply at once
    and, for each command handed over, later sends anything it likes for it,
    through the command's transaction or by TID alone.  The checks are the
    protocol's promises: nothing goes out under a TID that is not open, no
    command is completed twice, every TID gets as many completing events as
    commands were sent under it (the client counts them, oldest first), every
    refused command is completed by the session's own reply, a command on a
    TID still open is carried out in the default dialect and refused in the
    native one (where nothing more goes out for the command it abandons),
    every command handed over and not abandoned can still be completed,
    phases only move as documented, STOP_EVENTS is answered as the dialect
    says, and model events only flow in NORMAL under the START_EVENTS TID.
    """

    @initialize(steps=st.integers(0, 4), init=init_args)
    def start(self, steps=0, init=INIT_ARGS):
        self.session = AgentSession()
        self.init_args = init
        self.open: dict = {}  # tid -> open transactions on it, oldest first, as far as this model knows
        self.handed_over: list = []  # transactions given to the agent, in order
        self.abandoned: set = set()  # transactions abandoned by a reused TID (native) or by QUIT
        self.completions: dict = {}  # transaction -> completing events written for it
        for _ in range(steps):
            self.advance()

    # -- helpers

    def deliver(self, event, transaction=None):
        """Send one event as the agent would, checking it against the model."""
        session = self.session
        tid = event.tid
        before = session.phase
        model_event = EventId.NEW_JOB <= event.event_id <= EventId.REMOVE_QUEUE
        holders = self.open.get(tid, [])
        if transaction is not None:
            allowed = transaction in holders and transaction not in self.abandoned
        else:
            allowed = bool(holders)
        allowed = allowed and (not model_event or (before is Phase.NORMAL and session.events_tid == tid))
        if model_event and before is Phase.NORMAL and session.events_tid == tid:
            allowed = True
        self.open_tids_agree()
        try:
            data = session.write(event, transaction)
        except ProtocolViolation:
            assert not allowed, event
            assert session.phase is before
            return False
        if not data:
            # withheld: only ever for an abandoned command
            assert not allowed, event
            withheld = transaction if transaction is not None else None
            assert withheld is None or withheld in self.abandoned
            if session.phase is not before:
                assert (before, session.phase) == (Phase.INITIALIZE, Phase.DISCOVERY), event
            return False
        assert allowed, event
        decoded = decode_event(Decoder_one(data))
        assert decoded.tid == tid and decoded.event_id == event.event_id
        if event.completes:
            done = transaction if transaction is not None else holders[0]
            holders.remove(done)
            if not holders:
                del self.open[tid]
            self.completions.setdefault(done, []).append(event)
            assert len(self.completions[done]) == 1, "completed twice"
            if event.event_id is EventId.SHUTDOWN:
                assert session.phase is Phase.SHUTDOWN
                assert self.open == {}, "SHUTDOWN left commands open"
        after = session.phase
        if after is not before:
            assert (before, after) in SEND_TRANSITIONS, (before, after, event)
        return True

    def take(self, received, tid, was_open, reuse, command_id, args=()):
        session = self.session
        quit_ = command_id is CommandId.QUIT and not args and received.command is not None
        if was_open and not reuse:
            (held,) = self.open.pop(tid)
            self.abandoned.add(held)
            assert held.abandoned
            if command_id is CommandId.QUIT and not args:
                assert received.command is not None and received.replies[-1] == Shutdown(tid)
            else:
                # A reused TID: refused with ERROR under it, the open command abandoned.
                assert received.command is None
                assert [type(e) for e in received.replies] == [Error]
                assert received.replies[0].code == ErrorCode.TID_IN_USE and received.replies[0].tid == tid
        elif was_open:
            # Carried out (or refused for what it is) like any command on a free TID: nothing abandoned.
            assert not any(held.abandoned for held in self.open[tid]) or quit_
            assert not any(r.event_id is EventId.ERROR and r.code == ErrorCode.TID_IN_USE for r in received.replies)
        if quit_:
            # QUIT answers every open command: START/STOP_EVENTS with OK, the others with ERROR for a
            # stand-in, the command itself withdrawn from the agent
            for open_tid, holders in self.open.items():
                current = session.open_on(open_tid)
                for i, held in enumerate(holders):
                    if held is not current[i]:
                        assert held.abandoned and held.done and current[i].command_id == held.command_id
                        self.abandoned.add(held)
                        holders[i] = current[i]
        if received.command is not None:
            transaction = received.transaction
            assert received.command.tid == tid and transaction.tid == tid
            assert session.open_on(tid)[-1] is transaction and not transaction.done
            self.open.setdefault(tid, []).append(transaction)
            self.handed_over.append(transaction)
        refused = received.command is None and received.replies
        answers = received.answers()
        assert len(answers) == len(received.replies)
        own = [owner for reply, owner in answers if owner is not None and reply.tid == tid and reply.completes]
        for reply, owner in answers:
            if owner is not None and owner not in self.open.get(reply.tid, []):
                assert session.open_on(reply.tid)[-1] is owner  # opened just to be refused
                self.open.setdefault(reply.tid, []).append(owner)
            assert reply.tid in session.open, reply
            assert self.deliver(reply, owner), reply
        if refused and tid >= 0:
            # every refused command is completed by the session's own reply, under its TID
            assert own and all(owner.done and owner not in session.open_on(tid) for owner in own)
        if received.close:
            # The connection is over; carry on with a fresh one.
            self.start()

    # -- rules

    @rule(command_id=command_ids, tid=st.integers(0, 6), args=arguments)
    def command(self, command_id, tid, args):
        self.receive(Frame(int(command_id), tid, args))

    @rule(command_id=st.sampled_from([CommandId.INIT, CommandId.MODEL_DEF, CommandId.START_EVENTS,
                                      CommandId.STOP_EVENTS, CommandId.QUIT, CommandId.SUBMIT_JOB]),
          tid=st.integers(0, 6))
    def plausible_command(self, command_id, tid):
        args = {CommandId.INIT: self.init_args, CommandId.SUBMIT_JOB: ("jobSubId=j",)}.get(command_id, ())
        self.receive(Frame(int(command_id), tid, args))

    @rule(kind=st.sampled_from(list(ErrorKind)), tid=st.one_of(st.none(), st.integers(0, 6)))
    def malformed(self, kind, tid):
        self.receive(FrameError(kind, f"broken ({kind.value})", None if tid is None else 5, tid))

    @rule()
    def advance(self):
        """Move one phase on the legal way, with free TIDs from the same small pool."""
        session = self.session
        free = [tid for tid in range(7) if tid not in session.open]
        if session.phase is Phase.SHUTDOWN:
            self.start(init=self.init_args)
        elif not free:
            return
        elif session.phase is Phase.INITIALIZE:
            if any(t.command_id is CommandId.INIT and not t.done for t in self.handed_over):
                return  # one is in progress (perhaps abandoned): the agent will answer it
            self.receive(Frame(CommandId.INIT, free[0], self.init_args))
            transaction = self.session.open.get(free[0])
            if transaction is not None:
                self.deliver(Ok(free[0]), transaction)
        elif session.phase is Phase.DISCOVERY:
            if not session.model_defined:
                self.receive(Frame(CommandId.MODEL_DEF, free[0], ()))
                self.deliver(Ok(free[0]), self.session.open.get(free[0]))
            else:
                self.receive(Frame(CommandId.START_EVENTS, free[0], ()))
        elif session.phase is Phase.NORMAL:
            self.receive(Frame(CommandId.STOP_EVENTS, free[0], ()))
        else:
            self.receive(Frame(CommandId.START_EVENTS, free[0], ()))

    def receive(self, item):
        tid = getattr(item, "tid", None)
        fatal = isinstance(item, FrameError) and item.fatal
        was_open = tid is not None and tid in self.session.open and not fatal and self.session.phase is not Phase.SHUTDOWN
        # the dialect the command arrives in decides (an INIT changes it only for what follows)
        reuse = self.session.dialect.open_tid_reuse
        command_id = None
        if isinstance(item, Frame):
            try:
                command_id = CommandId(item.msg_id)
            except ValueError:
                command_id = item.msg_id
        before = self.session.phase
        events_tid = self.session.events_tid
        received = self.session.receive(item)
        after = self.session.phase
        if after is not before:
            assert (before, after) in RECEIVE_TRANSITIONS, (before, after, item)
            abandoned_events = was_open and tid == events_tid and not reuse
            if not abandoned_events:
                assert received.command is not None
                expected = CommandId.START_EVENTS if after is Phase.NORMAL else CommandId.STOP_EVENTS
                assert received.command.command_id is expected
        if before is Phase.SHUTDOWN:
            assert received.replies == [] and received.command is None
        if received.command is not None and received.command.command_id is CommandId.START_EVENTS:
            assert after is Phase.NORMAL and self.session.events_tid == tid
        if received.command is not None and received.command.command_id is CommandId.STOP_EVENTS:
            assert after is Phase.SUSPENDED
            if self.session.dialect.stop_events_at_once:
                # answered at once: OK for START_EVENTS, then OK for STOP_EVENTS itself
                assert received.replies == [Ok(events_tid), Ok(tid)] and self.session.stop_tid is None
            else:
                assert received.replies == [Ok(events_tid)] and self.session.stop_tid == tid
        answerable = tid is not None and not fatal and before is not Phase.SHUTDOWN
        self.take(received, tid if answerable else -1, was_open, reuse, command_id, getattr(item, "args", ()))

    @precondition(lambda self: self.handed_over)
    @rule(pick=st.integers(0, 100), outcome=st.sampled_from(["ok", "error", "submit_error", "message", "attr_def"]),
          by_tid=st.booleans())
    def agent_answers(self, pick, outcome, by_tid):
        transaction = self.handed_over[pick % len(self.handed_over)]
        tid = transaction.tid
        event = {
            "ok": Ok(tid),
            "error": Error(tid, ErrorCode.SCHEDULER, "failed"),
            "submit_error": SubmitJobError(tid, "j", ErrorCode.SUBMIT_FAILED, "failed"),
            "message": Message(tid, MessageLevel.INFO, 0, "progress"),
            "attr_def": AttrDef(tid, STANDARD_ATTRIBUTES[:1]),
        }[outcome]
        if by_tid:
            # The TID alone: the oldest command open on it (the old way of sending).
            self.deliver(event, None)
        else:
            self.deliver(event, transaction)

    @rule(tid=st.one_of(st.integers(0, 6), st.none()))
    def agent_model_event(self, tid):
        if tid is None:
            tid = self.session.events_tid if self.session.events_tid is not None else 0
        self.deliver(ElementChange(tid, ElementKind.NODE, [ElementGroup(RangeSet.parse("1-4"), ["nodeState=UP"])]))

    # -- invariants

    @invariant()
    def open_tids_agree(self):
        """The client's count of open commands per TID is the session's."""
        if hasattr(self, "session"):
            assert {tid: len(held) for tid, held in self.open.items()} == {
                tid: self.session.open_count(tid) for tid in self.session.open}
            for tid, held in self.open.items():
                assert set(map(id, held)) == set(map(id, self.session.open_on(tid)))

    @invariant()
    def nothing_handed_over_is_lost(self):
        """A command handed over and neither completed nor abandoned can still be answered."""
        if not hasattr(self, "session"):
            return
        for transaction in self.handed_over:
            if transaction in self.abandoned:
                assert transaction.abandoned
                assert transaction not in self.session.open_on(transaction.tid)
            elif transaction not in self.completions and self.session.phase is not Phase.SHUTDOWN:
                if transaction.command_id is CommandId.QUIT:
                    continue
                assert transaction in self.session.open_on(transaction.tid), transaction

    @invariant()
    def events_tid_is_open(self):
        if not hasattr(self, "session"):
            return
        session = self.session
        if session.events_tid is not None:
            assert session.events_tid in session.open
            assert any(t.command_id is CommandId.START_EVENTS for t in session.open_on(session.events_tid))
        if session.stop_tid is not None:
            assert session.stop_tid in session.open
            assert not session.dialect.stop_events_at_once
        if session.events_flowing:
            assert session.phase is Phase.NORMAL
        if session.phase is Phase.NORMAL:
            assert session.events_tid is not None
        if session.phase is Phase.SHUTDOWN:
            assert session.open == {}


def Decoder_one(data: bytes) -> Frame:
    decoder = Decoder()
    decoder.feed(data)
    (frame,) = list(decoder)
    return frame


TestSessionModel = SessionModel.TestCase
TestSessionModel.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
