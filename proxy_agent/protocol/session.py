"""The agent side of a proxy session: phases and transaction ids, with no I/O.

Feed :meth:`AgentSession.receive` whatever the decoder produced.  It answers
with a :class:`Received`: the command the agent should carry out (if any)
and the events the session itself must send first (errors for illegal
commands, the OK events that phase changes imply).  Everything the agent
sends goes through :meth:`AgentSession.send`, which refuses any event whose
TID is not open, closes commands on their completing event and moves the
phase forward.

Phases (``spec/protocol.md``, "Phases")::

    INITIALIZE --INIT ok--> DISCOVERY --START_EVENTS--> NORMAL <--STOP/START--> SUSPENDED
                                                                  any --QUIT--> SHUTDOWN

* INITIALIZE: INIT, QUIT.  The OK for INIT enters DISCOVERY.
* DISCOVERY: MODEL_DEF, QUIT; START_EVENTS once a MODEL_DEF has completed
  with OK.  START_EVENTS enters NORMAL and stays open: model events carry
  its TID.
* NORMAL: STOP_EVENTS, job commands (SUBMIT_JOB, TERMINATE_JOB, MOVE_JOB,
  CHANGE_JOB), LIST_FILTERS, SET_FILTERS, MODEL_DEF, QUIT.  STOP_EVENTS
  completes the open START_EVENTS with OK, enters SUSPENDED and stays open.
* SUSPENDED: START_EVENTS, the job commands, filters, MODEL_DEF, QUIT.
  START_EVENTS completes the open STOP_EVENTS with OK and enters NORMAL.
* QUIT (any phase): completes an open START_EVENTS or STOP_EVENTS with OK,
  any other open command with ERROR (shutting down), then SHUTDOWN under
  the QUIT TID.

Departures from the design's wording, deliberately:

* An illegal, unknown or malformed command is answered with ERROR under its
  own TID instead of being silently discarded: a discarded command stays
  open forever on the client's side, which is worse than a clear refusal.
* A command reusing the TID of a command still open cannot be answered with
  ERROR under that TID (that would complete the open command).  It is
  refused with a MESSAGE event (level ERROR, code TID_IN_USE) carrying the
  reused TID: MESSAGE does not complete a command, so the open one is
  undisturbed and the client sees the refusal attached to the TID it chose.
"""

from __future__ import annotations

import enum
from typing import Dict, List, Optional, Union

import attrs

from .attributes import split_attribute
from .messages import (
    ArgumentError,
    Command,
    CommandId,
    Error,
    ErrorCode,
    Event,
    EventId,
    InitRequest,
    Message,
    MessageLevel,
    Ok,
    Shutdown,
    SubmitJobError,
    SUPPORTED_VERSIONS,
    parse_init,
)
from .wire import Frame, FrameError

__all__ = ["AgentSession", "Phase", "ProtocolViolation", "Received"]


def _sub_id(args) -> str:
    for arg in args:
        if arg.startswith("jobSubId="):
            return arg[len("jobSubId="):]
    return ""


class Phase(enum.Enum):
    INITIALIZE = "INITIALIZE"
    DISCOVERY = "DISCOVERY"
    NORMAL = "NORMAL"
    SUSPENDED = "SUSPENDED"
    SHUTDOWN = "SHUTDOWN"


_FIRST_MODEL_EVENT = int(EventId.NEW_JOB)
_LAST_MODEL_EVENT = int(EventId.REMOVE_QUEUE)


class ProtocolViolation(RuntimeError):
    """The agent tried to send something the protocol forbids (a bug, not bad input)."""


_JOB_COMMANDS = frozenset(
    {CommandId.SUBMIT_JOB, CommandId.TERMINATE_JOB, CommandId.MOVE_JOB, CommandId.CHANGE_JOB}
)
_FILTER_COMMANDS = frozenset({CommandId.LIST_FILTERS, CommandId.SET_FILTERS})

LEGAL_COMMANDS: Dict[Phase, frozenset] = {
    Phase.INITIALIZE: frozenset({CommandId.INIT, CommandId.QUIT}),
    Phase.DISCOVERY: frozenset({CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.QUIT}),
    Phase.NORMAL: frozenset({CommandId.STOP_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT})
    | _JOB_COMMANDS
    | _FILTER_COMMANDS,
    Phase.SUSPENDED: frozenset({CommandId.START_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT})
    | _JOB_COMMANDS
    | _FILTER_COMMANDS,
    Phase.SHUTDOWN: frozenset(),
}

# Commands whose arguments must all be key=value attributes, with required keys.
_ATTRIBUTE_COMMANDS = {
    # jobSubId ties the job's NEW_JOB (or SUBMITJOB_ERROR) to this submission.
    CommandId.SUBMIT_JOB: ("jobSubId",),
    CommandId.TERMINATE_JOB: ("jobId",),
    CommandId.MOVE_JOB: ("jobId", "queueId"),
    CommandId.CHANGE_JOB: ("jobId",),
    CommandId.SET_FILTERS: (),
}
_NO_ARG_COMMANDS = frozenset(
    {CommandId.QUIT, CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.STOP_EVENTS, CommandId.LIST_FILTERS}
)


@attrs.define
class Received:
    """What the agent must do about one piece of input.

    ``replies`` are to be sent (in order, through :meth:`AgentSession.send`)
    before anything else; ``command`` is a legal command for the agent to
    carry out, its TID now open.  ``close`` means the session is over.
    ``log`` is a human-readable note for the agent's log when input was
    refused and nothing could be sent about it.
    """

    command: Optional[Command] = None
    replies: List[Event] = attrs.Factory(list)
    init: Optional[InitRequest] = None
    close: bool = False
    log: Optional[str] = None


class AgentSession:
    """Phase and TID bookkeeping for one client connection."""

    def __init__(self) -> None:
        self.phase = Phase.INITIALIZE
        #: open command TIDs and what they are
        self.open: Dict[int, Union[CommandId, int]] = {}
        #: TID of the open START_EVENTS (model events carry it), if any
        self.events_tid: Optional[int] = None
        #: TID of the open STOP_EVENTS, if any
        self.stop_tid: Optional[int] = None
        self.model_defined = False
        self.init: Optional[InitRequest] = None

    # ------------------------------------------------------------------ input

    def receive(self, item: Union[Frame, FrameError, Command]) -> Received:
        if isinstance(item, FrameError):
            return self._frame_error(item)
        command = item if isinstance(item, Command) else Command.from_frame(item)
        return self._command(command)

    def _frame_error(self, error: FrameError) -> Received:
        text = f"malformed frame: {error.message}"
        if self.phase is Phase.SHUTDOWN:
            return Received(close=error.fatal, log=f"{text} (after QUIT, ignored)")
        if error.fatal:
            replies: List[Event] = []
            if self.events_tid is not None:
                replies.append(Message(self.events_tid, MessageLevel.FATAL, ErrorCode.MALFORMED_FRAME, text))
            return Received(replies=replies, close=True, log=text + " (session closed: framing lost)")
        if error.tid is None:
            if self.events_tid is not None:
                return Received(
                    replies=[Message(self.events_tid, MessageLevel.ERROR, ErrorCode.MALFORMED_FRAME, text)]
                )
            return Received(log=text + " (no TID to answer under)")
        if error.tid in self.open:
            return Received(replies=[self._tid_in_use(error.tid, "a malformed frame")])
        self.open[error.tid] = error.msg_id if error.msg_id is not None else -1
        return Received(replies=[Error(error.tid, ErrorCode.MALFORMED_FRAME, text)])

    def _tid_in_use(self, tid: int, what: str) -> Message:
        holder = self.open[tid]
        holder_name = holder.name if isinstance(holder, CommandId) else f"command {holder}"
        return Message(
            tid,
            MessageLevel.ERROR,
            ErrorCode.TID_IN_USE,
            f"{what} was refused: TID {tid} is still in use by an open {holder_name}",
        )

    def _refuse(self, command: Command, code: ErrorCode, text: str) -> Received:
        # Open the TID briefly so the ERROR passes send()'s check and closes it.
        self.open[command.tid] = command.command_id
        if command.command_id is CommandId.SUBMIT_JOB and code is ErrorCode.BAD_ARGUMENTS:
            # A submission's problems are reported the way the client matches them: by jobSubId.
            return Received(replies=[SubmitJobError(command.tid, _sub_id(command.args), code, text)])
        return Received(replies=[Error(command.tid, code, text)])

    def _command(self, command: Command) -> Received:
        tid = command.tid
        if self.phase is Phase.SHUTDOWN:
            return Received(log=f"{command.name} (TID {tid}) after QUIT ignored")
        if tid in self.open:
            return Received(replies=[self._tid_in_use(tid, command.name)])
        if not command.known:
            return self._refuse(command, ErrorCode.UNKNOWN_COMMAND, f"unknown command id 0x{command.command_id:04X}")
        cid = command.command_id
        if cid not in LEGAL_COMMANDS[self.phase]:
            return self._refuse(
                command, ErrorCode.ILLEGAL_IN_PHASE, f"{cid.name} is not allowed in the {self.phase.value} phase"
            )
        problem = self._check_arguments(command)
        if problem is not None:
            return self._refuse(command, ErrorCode.BAD_ARGUMENTS, f"{cid.name}: {problem}")

        if cid is CommandId.INIT:
            pending = [t for t, what in self.open.items() if what is CommandId.INIT]
            if pending:
                # One initialisation at a time: a second OK for INIT must not
                # re-initialise the agent or move the phase again.
                return self._refuse(
                    command, ErrorCode.ILLEGAL_IN_PHASE, f"INIT is already in progress (TID {pending[0]})"
                )
            try:
                init = parse_init(command.args)
            except (ArgumentError, ValueError) as exc:
                return self._refuse(command, ErrorCode.BAD_ARGUMENTS, f"INIT: {exc}")
            if init.version not in SUPPORTED_VERSIONS:
                return self._refuse(
                    command,
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"unsupported protocol version {init.version!r}; this agent speaks {', '.join(SUPPORTED_VERSIONS)}",
                )
            self.open[tid] = cid
            return Received(command=command, init=init)
        if cid is CommandId.MODEL_DEF:
            self.open[tid] = cid
            return Received(command=command)
        if cid is CommandId.START_EVENTS:
            if self.phase is Phase.DISCOVERY and not self.model_defined:
                return self._refuse(
                    command, ErrorCode.ILLEGAL_IN_PHASE, "START_EVENTS before MODEL_DEF has completed"
                )
            replies: List[Event] = []
            if self.stop_tid is not None:
                replies.append(Ok(self.stop_tid))
            self.open[tid] = cid
            self.phase = Phase.NORMAL
            self.events_tid = tid
            return Received(command=command, replies=replies)
        if cid is CommandId.STOP_EVENTS:
            assert self.events_tid is not None
            replies = [Ok(self.events_tid)]
            self.open[tid] = cid
            self.phase = Phase.SUSPENDED
            self.stop_tid = tid
            return Received(command=command, replies=replies)
        if cid is CommandId.QUIT:
            replies = []
            for open_tid, what in list(self.open.items()):
                if open_tid in (self.events_tid, self.stop_tid):
                    replies.append(Ok(open_tid))
                else:
                    name = what.name if isinstance(what, CommandId) else "command"
                    replies.append(Error(open_tid, ErrorCode.SHUTTING_DOWN, f"{name} abandoned: the agent is quitting"))
            self.open[tid] = cid
            replies.append(Shutdown(tid))
            return Received(command=command, replies=replies)
        self.open[tid] = cid
        return Received(command=command)

    def _check_arguments(self, command: Command) -> Optional[str]:
        cid = command.command_id
        if cid in _NO_ARG_COMMANDS and command.args:
            return f"takes no arguments, got {len(command.args)}"
        required = _ATTRIBUTE_COMMANDS.get(cid)
        if required is None:
            return None
        keys = set()
        for arg in command.args:
            try:
                key, _ = split_attribute(arg)
            except ValueError:
                return f"argument {arg!r} is not a key=value attribute"
            keys.add(key)
        for key in required:
            if key not in keys:
                return f"missing required attribute {key}=..."
        return None

    # ------------------------------------------------------------------ output

    def is_open(self, tid: int) -> bool:
        return tid in self.open

    def send(self, event: Event) -> Event:
        """Check that ``event`` may be sent now and update the state for it.

        Raises :class:`ProtocolViolation` if its TID is not open, or if it is a
        model event while events are stopped.
        """
        self.check(event.event_id, event.tid)
        return event

    def check(self, event_id: int, tid: int) -> None:
        """:meth:`send` for an event given by id and TID (the bulk path for model events)."""
        if tid == self.events_tid and self.phase is Phase.NORMAL and _FIRST_MODEL_EVENT <= event_id <= _LAST_MODEL_EVENT:
            return  # a model event under the open START_EVENTS (events_tid is set only while open)
        what = self.open.get(tid)
        eid = EventId(event_id)
        if what is None:
            raise ProtocolViolation(f"refusing to send {eid.name} for TID {tid}: no such open command")
        if EventId.NEW_JOB <= eid <= EventId.REMOVE_QUEUE:
            if tid != self.events_tid or self.phase is not Phase.NORMAL:
                raise ProtocolViolation(
                    f"refusing to send {eid.name} for TID {tid}: model events need the open START_EVENTS in NORMAL phase"
                )
        if eid in (EventId.OK, EventId.ERROR, EventId.SHUTDOWN, EventId.SUBMITJOB_ERROR, EventId.TERMINATEJOB_ERROR):
            del self.open[tid]
            if tid == self.events_tid:
                # Ended other than by STOP_EVENTS (e.g. the agent failed it):
                # events stop flowing until the next START_EVENTS.
                self.events_tid = None
                if self.phase is Phase.NORMAL:
                    self.phase = Phase.SUSPENDED
            if tid == self.stop_tid:
                self.stop_tid = None
            if eid is EventId.OK and what is CommandId.INIT and self.phase is Phase.INITIALIZE:
                self.phase = Phase.DISCOVERY
            elif eid is EventId.OK and what is CommandId.MODEL_DEF:
                self.model_defined = True
            elif eid is EventId.SHUTDOWN:
                self.phase = Phase.SHUTDOWN
                self.open.clear()
                self.events_tid = self.stop_tid = None

    @property
    def events_flowing(self) -> bool:
        """True while model events may be sent (NORMAL phase with START_EVENTS open)."""
        return self.phase is Phase.NORMAL and self.events_tid is not None
