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
    decode_event,
)
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.session import AgentSession, Phase, ProtocolViolation
from proxy_agent.protocol.wire import Decoder, ErrorKind, Frame, FrameError

INIT_ARGS = ("version=2.0", "baseId=100")


def cmd(command_id: int, tid: int, *args: str) -> Frame:
    return Frame(int(command_id), tid, tuple(args))


def send_all(session: AgentSession, events) -> list:
    return [session.send(event) for event in events]


def session_in(phase: Phase) -> AgentSession:
    """A session driven legally into ``phase`` (DISCOVERY with its MODEL_DEF done), using TIDs 1..5."""
    session = AgentSession()
    if phase is Phase.INITIALIZE:
        return session
    session.receive(cmd(CommandId.INIT, 1, *INIT_ARGS))
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
    assert r.replies == [] and r.init == InitRequest("2.0", 100)
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
    # A refused submission is reported the way clients match submissions: by jobSubId.
    expected = SubmitJobError if command_id is CommandId.SUBMIT_JOB else Error
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
def test_tid_reuse_while_open_gets_message_and_keeps_the_open_command(reuse):
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=a"))
    assert r.command is not None
    r = session.receive(cmd(reuse, 9, "jobSubId=b"))
    assert r.command is None
    (message,) = r.replies
    assert isinstance(message, Message) and message.tid == 9
    assert message.code == ErrorCode.TID_IN_USE and message.level == MessageLevel.ERROR
    assert not message.completes
    assert "TID 9" in message.text and "SUBMIT_JOB" in message.text
    send_all(session, r.replies)
    assert session.is_open(9) and session.open[9] is CommandId.SUBMIT_JOB
    assert session.phase is Phase.NORMAL
    session.send(SubmitJobError(9, "a", ErrorCode.SUBMIT_FAILED, "no"))
    assert not session.is_open(9)
    # now free again
    assert session.receive(cmd(CommandId.SUBMIT_JOB, 9, "jobSubId=c")).command is not None


def test_reusing_the_events_tid_does_not_stop_events():
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.STOP_EVENTS, 3))
    assert [type(e) for e in r.replies] == [Message] and r.replies[0].tid == 3
    send_all(session, r.replies)
    assert session.events_flowing and session.events_tid == 3
    session.send(RemoveAll(3))


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
    assert [type(e) for e in r.replies] == [Message] and r.replies[0].code == ErrorCode.TID_IN_USE
    send_all(session, r.replies)
    assert session.events_flowing


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
    (Phase.NORMAL, Phase.SUSPENDED),  # STOP_EVENTS
}
SEND_TRANSITIONS = {
    (Phase.INITIALIZE, Phase.DISCOVERY),  # OK for INIT
    (Phase.NORMAL, Phase.SUSPENDED),  # START_EVENTS completed by the agent
} | {(p, Phase.SHUTDOWN) for p in Phase}

command_ids = st.one_of(st.sampled_from(list(CommandId)), st.integers(0, 0xFFFF))
arguments = st.lists(
    st.one_of(
        st.sampled_from(["jobSubId=s", "jobId=7", "queueId=1", "version=2.0", "baseId=100", "2.0", "100", "x", "=", ""]),
        st.text(max_size=6),
    ),
    max_size=3,
).map(tuple)


class SessionModel(RuleBasedStateMachine):
    """Random commands and agent behaviour against a tally of open TIDs kept here.

    The agent side behaves as the session asks: it sends every reply at once
    and, for each command handed over, later sends anything it likes.  The
    checks are the protocol's promises: nothing goes out under a TID that is
    not open, nothing is completed twice, phases only move as documented,
    and model events only flow in NORMAL under the START_EVENTS TID.
    """

    @initialize(steps=st.integers(0, 4))
    def start(self, steps=0):
        self.session = AgentSession()
        self.open: dict = {}  # tid -> command id, as far as this model knows
        self.handed_over: list = []  # TIDs of commands given to the agent
        for _ in range(steps):
            self.advance()

    # -- helpers

    def deliver(self, event):
        """Send one event as the agent would, checking it against the model."""
        session = self.session
        tid = event.tid
        before = session.phase
        model_event = EventId.NEW_JOB <= event.event_id <= EventId.REMOVE_QUEUE
        allowed = tid in self.open and (
            not model_event or (before is Phase.NORMAL and session.events_tid == tid)
        )
        assert (tid in session.open) == (tid in self.open)
        try:
            session.send(event)
        except ProtocolViolation:
            assert not allowed, event
            assert session.phase is before
            return False
        assert allowed, event
        if event.completes:
            del self.open[tid]  # KeyError would mean a second completion
            if event.event_id is EventId.SHUTDOWN:
                assert session.phase is Phase.SHUTDOWN
                assert self.open == {}, "SHUTDOWN left commands open"
        after = session.phase
        if after is not before:
            assert (before, after) in SEND_TRANSITIONS, (before, after, event)
        return True

    def take(self, received, tid, was_open):
        session = self.session
        if was_open:
            # A reused TID: refused with a MESSAGE, the open command untouched.
            assert received.command is None
            assert [type(e) for e in received.replies] == [Message]
            assert received.replies[0].code == ErrorCode.TID_IN_USE and received.replies[0].tid == tid
        if received.command is not None:
            assert received.command.tid == tid and tid in session.open and not was_open
            self.open[tid] = received.command.command_id
            self.handed_over.append(tid)
        for reply in received.replies:
            if reply.tid == tid and tid not in self.open:
                self.open[tid] = session.open[tid]  # opened just to be refused
            assert reply.tid in session.open, reply
            assert self.deliver(reply), reply
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
        args = {CommandId.INIT: INIT_ARGS, CommandId.SUBMIT_JOB: ("jobSubId=j",)}.get(command_id, ())
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
            self.start()
        elif not free:
            return
        elif session.phase is Phase.INITIALIZE:
            self.receive(Frame(CommandId.INIT, free[0], INIT_ARGS))
            self.deliver(Ok(free[0]))
        elif session.phase is Phase.DISCOVERY:
            if not session.model_defined:
                self.receive(Frame(CommandId.MODEL_DEF, free[0], ()))
                self.deliver(Ok(free[0]))
            else:
                self.receive(Frame(CommandId.START_EVENTS, free[0], ()))
        elif session.phase is Phase.NORMAL:
            self.receive(Frame(CommandId.STOP_EVENTS, free[0], ()))
        else:
            self.receive(Frame(CommandId.START_EVENTS, free[0], ()))

    def receive(self, item):
        tid = getattr(item, "tid", None)
        fatal = isinstance(item, FrameError) and item.fatal
        was_open = tid is not None and tid in self.session.open and not fatal
        before = self.session.phase
        received = self.session.receive(item)
        after = self.session.phase
        if after is not before:
            assert (before, after) in RECEIVE_TRANSITIONS, (before, after, item)
            assert received.command is not None
            expected = CommandId.START_EVENTS if after is Phase.NORMAL else CommandId.STOP_EVENTS
            assert received.command.command_id is expected
        if before is Phase.SHUTDOWN:
            assert received.replies == [] and received.command is None
        if received.command is not None and received.command.command_id is CommandId.START_EVENTS:
            assert after is Phase.NORMAL and self.session.events_tid == tid
        if received.command is not None and received.command.command_id is CommandId.STOP_EVENTS:
            assert after is Phase.SUSPENDED and self.session.stop_tid == tid
        self.take(received, tid if tid is not None else -1, was_open)

    @precondition(lambda self: self.handed_over)
    @rule(pick=st.integers(0, 100), outcome=st.sampled_from(["ok", "error", "submit_error", "message", "attr_def"]))
    def agent_answers(self, pick, outcome):
        tid = self.handed_over[pick % len(self.handed_over)]
        event = {
            "ok": Ok(tid),
            "error": Error(tid, ErrorCode.SCHEDULER, "failed"),
            "submit_error": SubmitJobError(tid, "j", ErrorCode.SUBMIT_FAILED, "failed"),
            "message": Message(tid, MessageLevel.INFO, 0, "progress"),
            "attr_def": AttrDef(tid, STANDARD_ATTRIBUTES[:1]),
        }[outcome]
        self.deliver(event)

    @rule(tid=st.one_of(st.integers(0, 6), st.none()))
    def agent_model_event(self, tid):
        if tid is None:
            tid = self.session.events_tid if self.session.events_tid is not None else 0
        self.deliver(ElementChange(tid, ElementKind.NODE, [ElementGroup(RangeSet.parse("1-4"), ["nodeState=UP"])]))

    # -- invariants

    @invariant()
    def open_tids_agree(self):
        if hasattr(self, "session"):
            assert set(self.session.open) == set(self.open)

    @invariant()
    def events_tid_is_open(self):
        if not hasattr(self, "session"):
            return
        session = self.session
        if session.events_tid is not None:
            assert session.events_tid in session.open
        if session.stop_tid is not None:
            assert session.stop_tid in session.open
        if session.events_flowing:
            assert session.phase is Phase.NORMAL
        if session.phase is Phase.NORMAL:
            assert session.events_tid is not None
        if session.phase is Phase.SHUTDOWN:
            assert session.open == {}


TestSessionModel = SessionModel.TestCase
TestSessionModel.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
