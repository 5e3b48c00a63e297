"""The agent side of a proxy session: phases, transactions and the dialect, with no I/O.

Feed :meth:`AgentSession.receive` whatever the decoder produced.  It answers
with a :class:`Received`: the command the agent should carry out (if any),
its :class:`Transaction`, and the events the session itself must send first
(errors for refused commands, the OK events that phase changes imply).
Everything the agent sends goes through :meth:`AgentSession.write` (or
:meth:`AgentSession.send` plus the dialect's encoder), which refuses any event
whose command is not open, closes commands on their completing event, moves
the phase forward, and encodes in the session's dialect.

Phases (``spec/protocol.md``, "Phases")::

    INITIALIZE --INIT ok--> DISCOVERY --START_EVENTS--> NORMAL <--STOP/START--> SUSPENDED
                                                                  any --QUIT--> SHUTDOWN

* INITIALIZE: INIT, QUIT.  The OK for INIT enters DISCOVERY.  INIT chooses
  the dialect (:mod:`.dialect`); until then, and for an INIT refused before
  its dialect is known, the default dialect applies.
* DISCOVERY: MODEL_DEF, QUIT; START_EVENTS once a MODEL_DEF has completed
  with OK.  START_EVENTS enters NORMAL and stays open: model events carry
  its TID.
* NORMAL: STOP_EVENTS, job commands (SUBMIT_JOB, TERMINATE_JOB, MOVE_JOB,
  CHANGE_JOB), LIST_FILTERS, SET_FILTERS, MODEL_DEF, QUIT.  STOP_EVENTS
  completes the open START_EVENTS with OK and enters SUSPENDED.  In the
  default dialect STOP_EVENTS is then completed with OK at once; in the
  native dialect it stays open until the next START_EVENTS.
* SUSPENDED: START_EVENTS, the job commands, filters, MODEL_DEF, QUIT.
  START_EVENTS completes a STOP_EVENTS still open with OK and enters NORMAL.
* QUIT (any phase): completes an open START_EVENTS or STOP_EVENTS with OK,
  any other open command with ERROR (shutting down), then SHUTDOWN under
  the QUIT TID.

Every command gets exactly one completing event under its own TID:

* An illegal, unknown or malformed command is answered with ERROR under its
  own TID (the design says to discard it, but a discarded command stays open
  forever on the client's side).
* A command (or a malformed frame) arriving under the TID of a command still
  open is refused with ERROR ``TID_IN_USE`` under that TID (a well-formed QUIT
  excepted: it is carried out, and its SHUTDOWN completes it).  The client takes
  that ERROR as completing whatever it last sent under the TID, so the command
  that held the TID is *abandoned*: it may still finish inside the agent (a
  job submitted stays submitted, an INIT that succeeds still initialises the
  session), but no event is sent for it any more.  When that command was the
  open START_EVENTS, model events stop (phase SUSPENDED) until the next
  START_EVENTS.  Give :meth:`AgentSession.send` the command's
  :class:`Transaction` so that a late answer for an abandoned command is
  never mistaken for the answer to a new command on the same TID.
"""

from __future__ import annotations

import enum
from typing import Dict, List, Optional, Union

import attrs

from .attributes import split_attribute
from .dialect import DEFAULT, Dialect, DialectError, dialect_named
from .ids import is_decimal, MAX_DECIMAL_DIGITS
from .messages import (
    ArgumentError,
    Command,
    CommandId,
    Error,
    ErrorCode,
    Event,
    EventId,
    InitRequest,
    MessageLevel,
    Ok,
    SUPPORTED_VERSIONS,
    parse_init,
)
from .first_bytes import first_line, shown_bytes
from .wire import Frame, FrameError

__all__ = ["Abandoned", "AgentSession", "Phase", "ProtocolViolation", "Received", "Transaction"]


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
_COMPLETING = frozenset(
    int(e) for e in (EventId.OK, EventId.ERROR, EventId.SHUTDOWN, EventId.SUBMITJOB_ERROR, EventId.TERMINATEJOB_ERROR)
)


class ProtocolViolation(RuntimeError):
    """The agent tried to send something the protocol forbids (a bug, not bad input)."""


class Abandoned(ProtocolViolation):
    """The event belongs to a command the client no longer waits for: drop it.

    Not a bug: the client reused the command's TID, which abandoned it (see
    the module docstring).  The session has applied what the event means for
    the agent (a completed INIT still enters DISCOVERY); only the bytes must
    not go out.
    """


@attrs.define(eq=False)
class Transaction:
    """One command from the moment the session accepts it until its completion.

    Identity matters, not value: two commands on the same TID are two
    transactions.
    """

    tid: int
    command_id: Union[CommandId, int]
    #: a completing event has been sent (or withheld, if abandoned)
    done: bool = False
    #: the client reused the TID while this was open: nothing more is sent for it
    abandoned: bool = False

    @property
    def name(self) -> str:
        if isinstance(self.command_id, CommandId):
            return self.command_id.name
        return f"command 0x{self.command_id:04X}" if self.command_id >= 0 else "a malformed frame"


_JOB_COMMANDS = frozenset(
    {CommandId.SUBMIT_JOB, CommandId.TERMINATE_JOB, CommandId.MOVE_JOB, CommandId.CHANGE_JOB}
)
_FILTER_COMMANDS = frozenset({CommandId.LIST_FILTERS, CommandId.SET_FILTERS})
#: This agent's own commands that ask about jobs (see spec/protocol.md, "Kept output").
_QUERY_COMMANDS = frozenset({CommandId.GET_OUTPUT})

LEGAL_COMMANDS: Dict[Phase, frozenset] = {
    Phase.INITIALIZE: frozenset({CommandId.INIT, CommandId.QUIT}),
    Phase.DISCOVERY: frozenset({CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.QUIT}),
    Phase.NORMAL: frozenset({CommandId.STOP_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT})
    | _JOB_COMMANDS
    | _FILTER_COMMANDS
    | _QUERY_COMMANDS,
    Phase.SUSPENDED: frozenset({CommandId.START_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT})
    | _JOB_COMMANDS
    | _FILTER_COMMANDS
    | _QUERY_COMMANDS,
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
    CommandId.GET_OUTPUT: ("jobId",),
}
# Keys that may appear once only, with a decimal element id as value.  (A submission's
# queueId may also name queues, or list several for a broker: the front-end reads it.)
_ID_KEYS = {
    CommandId.SUBMIT_JOB: ("jobSubId",),
    CommandId.TERMINATE_JOB: ("jobId",),
    CommandId.MOVE_JOB: ("jobId", "queueId"),
    CommandId.CHANGE_JOB: ("jobId",),
    CommandId.GET_OUTPUT: ("jobId",),
}
_NOT_IDS = frozenset({"jobSubId"})  # once only, but any text
# Commands that take exactly their required keys and nothing else.
_EXACT_COMMANDS = frozenset({CommandId.TERMINATE_JOB, CommandId.MOVE_JOB})
_NO_ARG_COMMANDS = frozenset(
    {CommandId.QUIT, CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.STOP_EVENTS, CommandId.LIST_FILTERS}
)


@attrs.define
class Received:
    """What the agent must do about one piece of input.

    ``replies`` are to be sent (in order, through :meth:`AgentSession.write`)
    before anything else.  ``command`` is a legal command for the agent to
    carry out, ``transaction`` its open transaction (for QUIT, and for
    STOP_EVENTS in the default dialect, ``replies`` already complete it).
    ``close`` means the session is over.  ``log`` is a human-readable note for
    the agent's log when input was refused and nothing could be sent about it.
    """

    command: Optional[Command] = None
    replies: List[Event] = attrs.Factory(list)
    init: Optional[InitRequest] = None
    close: bool = False
    log: Optional[str] = None
    transaction: Optional[Transaction] = None


class AgentSession:
    """Phase, transaction and dialect bookkeeping for one client connection."""

    def __init__(self) -> None:
        self.phase = Phase.INITIALIZE
        #: the dialect of this session: the default until an INIT names another
        self.dialect: Dialect = DEFAULT
        #: open commands by TID
        self.open: Dict[int, Transaction] = {}
        #: TID of the open START_EVENTS (model events carry it), if any
        self.events_tid: Optional[int] = None
        #: TID of the open STOP_EVENTS (native dialect only), if any
        self.stop_tid: Optional[int] = None
        self.model_defined = False
        self.init: Optional[InitRequest] = None
        # abandoned commands not yet finished by the agent, by TID, oldest first
        self._abandoned: Dict[int, List[Transaction]] = {}
        #: frames received so far (commands or malformed but delimited frames); while 0, a
        #: fatal framing error means the input began with something that is not the protocol
        self.frames_received = 0

    # ------------------------------------------------------------------ input

    def receive(self, item: Union[Frame, FrameError, Command]) -> Received:
        if not (isinstance(item, FrameError) and item.fatal):
            self.frames_received += 1
        if isinstance(item, FrameError):
            return self._frame_error(item)
        command = item if isinstance(item, Command) else Command.from_frame(item)
        return self._command(command)

    def not_the_protocol(self, head: bytes) -> Received:
        """The input began with ``head``, which is not a frame (a person typing, a greeting
        written into the agent's input): ERROR under TID 0 naming what arrived, and close.

        Nothing after such text can be framed again, so the session ends; the ERROR is
        for whoever reads the agent's output, the log line for whoever reads its log.
        """
        text = (
            f"the input began with text that is not the protocol: '{shown_bytes(first_line(head))}' "
            "(a frame starts with its length as 8 hex digits and a space; is something other "
            "than a proxy-protocol client writing to the agent?)"
        )
        if self.phase is Phase.SHUTDOWN or 0 in self.open:
            return Received(close=True, log=text + "; session closed")
        self._open(0, -1)
        return Received(replies=[Error(0, ErrorCode.MALFORMED_FRAME, text)], close=True, log=text + "; session closed")

    def _frame_error(self, error: FrameError) -> Received:
        from .messages import Message  # loaded when first needed (see messages.LATER_NAMES)

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
        msg_id = error.msg_id if error.msg_id is not None else -1
        if error.tid in self.open:
            return self._reused(error.tid, msg_id, f"a malformed frame ({error.message})")
        self._open(error.tid, msg_id)
        return Received(replies=[Error(error.tid, ErrorCode.MALFORMED_FRAME, text)])

    def _open(self, tid: int, command_id: Union[CommandId, int]) -> Transaction:
        transaction = Transaction(tid, command_id)
        self.open[tid] = transaction
        return transaction

    def _reused(self, tid: int, command_id: Union[CommandId, int], what: str) -> Received:
        """Refuse what came under an open TID with ERROR there, abandoning the open command."""
        holder = self.open.pop(tid)
        self._abandon(holder)
        self._open(tid, command_id)
        return Received(
            replies=[
                Error(
                    tid,
                    ErrorCode.TID_IN_USE,
                    f"{what} was refused: TID {tid} was still in use by an open {holder.name}, "
                    f"which is now abandoned (no further events are sent for it)",
                )
            ]
        )

    def _abandon(self, holder: Transaction) -> None:
        tid = holder.tid
        holder.abandoned = True
        self._abandoned.setdefault(tid, []).append(holder)
        if tid == self.events_tid:
            # The client now takes this TID for completed: a model event under it
            # would name a TID it does not know.  Events stop until START_EVENTS.
            self.events_tid = None
            if self.phase is Phase.NORMAL:
                self.phase = Phase.SUSPENDED
        if tid == self.stop_tid:
            self.stop_tid = None

    def _refuse(self, command: Command, code: ErrorCode, text: str) -> Received:
        from .messages import SubmitJobError, TerminateJobError

        # Open the TID briefly so the ERROR passes send()'s check and closes it.
        self._open(command.tid, command.command_id)
        if command.command_id is CommandId.SUBMIT_JOB and code is ErrorCode.BAD_ARGUMENTS:
            # A submission's problems are reported the way the client matches them: by jobSubId.
            return Received(replies=[SubmitJobError(command.tid, _sub_id(command.args), code, text)])
        if command.command_id is CommandId.TERMINATE_JOB and code is ErrorCode.BAD_ARGUMENTS:
            # Likewise a termination's, by the jobId it named (the IDE's launch code reads those).
            job_id = next((a[len("jobId="):] for a in command.args if a.startswith("jobId=")), "")
            return Received(replies=[TerminateJobError(command.tid, job_id, code, text)])
        return Received(replies=[Error(command.tid, code, text)])

    def _command(self, command: Command) -> Received:
        tid = command.tid
        if self.phase is Phase.SHUTDOWN:
            return Received(log=f"{command.name} (TID {tid}) after QUIT ignored")
        if tid in self.open:
            if command.command_id is CommandId.QUIT and not command.args:
                # QUIT is never refused: the command holding its TID is abandoned
                # without a word, and SHUTDOWN under the TID completes the QUIT.
                self._abandon(self.open.pop(tid))
            else:
                return self._reused(tid, command.command_id, command.name)
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
            return self._init(command)
        if cid is CommandId.MODEL_DEF:
            transaction = self._open(tid, cid)
            return Received(command=command, transaction=transaction)
        if cid is CommandId.START_EVENTS:
            if self.phase is Phase.DISCOVERY and not self.model_defined:
                return self._refuse(
                    command, ErrorCode.ILLEGAL_IN_PHASE, "START_EVENTS before MODEL_DEF has completed"
                )
            replies: List[Event] = []
            if self.stop_tid is not None:
                replies.append(Ok(self.stop_tid))
            transaction = self._open(tid, cid)
            self.phase = Phase.NORMAL
            self.events_tid = tid
            return Received(command=command, replies=replies, transaction=transaction)
        if cid is CommandId.STOP_EVENTS:
            assert self.events_tid is not None  # NORMAL always has an open START_EVENTS
            replies = [Ok(self.events_tid)]
            transaction = self._open(tid, cid)
            self.phase = Phase.SUSPENDED
            if self.dialect.stop_events_at_once:
                replies.append(Ok(tid))
            else:
                self.stop_tid = tid
            return Received(command=command, replies=replies, transaction=transaction)
        if cid is CommandId.QUIT:
            replies = []
            for open_tid, held in list(self.open.items()):
                if open_tid in (self.events_tid, self.stop_tid):
                    replies.append(Ok(open_tid))
                else:
                    # The session answers for the agent: whatever the agent says
                    # about this command later is withheld, like an abandoned one's.
                    held.done = held.abandoned = True
                    self._open(open_tid, held.command_id)
                    replies.append(
                        Error(open_tid, ErrorCode.SHUTTING_DOWN, f"{held.name} abandoned: the agent is quitting")
                    )
            transaction = self._open(tid, cid)
            from .messages import Shutdown

            replies.append(Shutdown(tid))
            return Received(command=command, replies=replies, transaction=transaction)
        transaction = self._open(tid, cid)
        return Received(command=command, transaction=transaction)

    def _init(self, command: Command) -> Received:
        pending = [t for t, held in self.open.items() if held.command_id is CommandId.INIT]
        pending += [t for t, stale in self._abandoned.items() for held in stale if held.command_id is CommandId.INIT]
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
        try:
            dialect = dialect_named(init.dialect)
        except DialectError as exc:
            return self._refuse(command, ErrorCode.BAD_ARGUMENTS, f"INIT: {exc}")
        # From here on, this INIT's own answer is in the dialect it asked for.
        self.dialect = dialect
        if init.version not in SUPPORTED_VERSIONS:
            return self._refuse(
                command,
                ErrorCode.UNSUPPORTED_VERSION,
                f"unsupported protocol version {init.version!r}; this agent speaks {', '.join(SUPPORTED_VERSIONS)}",
            )
        problem = dialect.base_id_problem(init.base_id)
        if problem is not None:
            return self._refuse(command, ErrorCode.BAD_ARGUMENTS, f"INIT: {problem}")
        transaction = self._open(command.tid, CommandId.INIT)
        return Received(command=command, init=init, transaction=transaction)

    def _check_arguments(self, command: Command) -> Optional[str]:
        cid = command.command_id
        if cid in _NO_ARG_COMMANDS and command.args:
            return f"takes no arguments, got {len(command.args)}"
        required = _ATTRIBUTE_COMMANDS.get(cid)
        if required is None:
            return None
        counts: Dict[str, int] = {}
        values: Dict[str, str] = {}
        for arg in command.args:
            try:
                key, value = split_attribute(arg)
            except ValueError:
                return f"argument {_shown(arg)} is not a key=value attribute" + _move_hint(cid)
            counts[key] = counts.get(key, 0) + 1
            values[key] = value
        for key in required:
            if key not in counts:
                return f"missing required attribute {key}=..." + _move_hint(cid)
        if cid in _EXACT_COMMANDS:
            extra = [key for key in counts if key not in required]
            if extra:
                wanted = " and ".join(f"{key}=" for key in required)
                return f"takes only {wanted}, got {', '.join(map(repr, extra))}" + _move_hint(cid)
        for key in _ID_KEYS.get(cid, ()):
            if counts.get(key, 0) > 1:
                return f"attribute {key}= given {counts[key]} times"
            value = values.get(key)
            if value is None or key in _NOT_IDS:
                continue
            if not is_decimal(value) or len(value) > MAX_DECIMAL_DIGITS:
                return f"{key} must be an element id of plain decimal digits 0-9, got {_shown(value)}" + _move_hint(cid)
        return None

    # ------------------------------------------------------------------ output

    def is_open(self, tid: int) -> bool:
        return tid in self.open

    def send(self, event: Event, transaction: Optional[Transaction] = None) -> Event:
        """Check that ``event`` may be sent now and update the state for it.

        ``transaction`` is the command the event answers (None: whichever
        command holds the TID now).  Raises :class:`Abandoned` for an event
        of an abandoned command (drop it), :class:`ProtocolViolation` if its
        TID is not open, or for a model event while events are stopped.
        """
        self.check(event.event_id, event.tid, transaction)
        return event

    def write(self, event: Event, transaction: Optional[Transaction] = None) -> bytes:
        """:meth:`send`, then encode in the session's dialect; ``b""`` for an abandoned command's event."""
        try:
            self.check(event.event_id, event.tid, transaction)
        except Abandoned:
            return b""
        return self.dialect.encode(event)

    def model_frame(self, event_id: int, args) -> bytes:
        """One model event (NEW/CHANGE/REMOVE) under the open START_EVENTS, encoded in the dialect.

        Raises :class:`ProtocolViolation` unless events flow.
        """
        tid = self.events_tid
        if tid is None or self.phase is not Phase.NORMAL or not _FIRST_MODEL_EVENT <= event_id <= _LAST_MODEL_EVENT:
            raise ProtocolViolation(
                f"refusing to send model event {event_id}: model events need the open START_EVENTS in NORMAL phase"
            )
        return self.dialect.encode_frame(event_id, tid, args)

    def check(self, event_id: int, tid: int, transaction: Optional[Transaction] = None) -> None:
        """:meth:`send` for an event given by id and TID (the bulk path for model events)."""
        if tid == self.events_tid and self.phase is Phase.NORMAL and _FIRST_MODEL_EVENT <= event_id <= _LAST_MODEL_EVENT:
            return  # a model event under the open START_EVENTS (events_tid is set only while open)
        eid = EventId(event_id)
        if transaction is not None:
            if transaction.tid != tid:
                raise ProtocolViolation(
                    f"refusing to send {eid.name} for TID {tid}: it answers {transaction.name} of TID {transaction.tid}"
                )
            if transaction.abandoned:
                self._withhold(transaction, eid)
            if transaction.done:
                raise ProtocolViolation(f"refusing to send {eid.name} for TID {tid}: {transaction.name} is already completed")
            held = self.open.get(tid)
            if held is not transaction:  # pragma: no cover - open transactions are always held
                raise ProtocolViolation(f"refusing to send {eid.name} for TID {tid}: not the open command")
        else:
            held = self.open.get(tid)
            if held is None:
                stale = self._abandoned.get(tid)
                if stale:
                    self._withhold(stale[0], eid)
                raise ProtocolViolation(f"refusing to send {eid.name} for TID {tid}: no such open command")
        if _FIRST_MODEL_EVENT <= event_id <= _LAST_MODEL_EVENT:
            if tid != self.events_tid or self.phase is not Phase.NORMAL:
                raise ProtocolViolation(
                    f"refusing to send {eid.name} for TID {tid}: model events need the open START_EVENTS in NORMAL phase"
                )
        if event_id in _COMPLETING:
            self._complete(held, eid)

    def _withhold(self, transaction: Transaction, eid: EventId) -> None:
        """An abandoned command's event: apply what it means, then refuse to send it."""
        if int(eid) in _COMPLETING and not transaction.done:
            transaction.done = True
            stale = self._abandoned.get(transaction.tid, [])
            if transaction in stale:
                stale.remove(transaction)
                if not stale:
                    del self._abandoned[transaction.tid]
            if eid is EventId.OK and transaction.command_id is CommandId.INIT and self.phase is Phase.INITIALIZE:
                # The agent is initialised whether or not the client heard of it.
                self.phase = Phase.DISCOVERY
            # An abandoned MODEL_DEF does not count: the client did not get all definitions.
        raise Abandoned(
            f"not sending {eid.name} for TID {transaction.tid}: {transaction.name} was abandoned when the TID was reused"
        )

    def _complete(self, transaction: Transaction, eid: EventId) -> None:
        tid = transaction.tid
        del self.open[tid]
        transaction.done = True
        if tid == self.events_tid:
            # Ended other than by STOP_EVENTS (e.g. the agent failed it):
            # events stop flowing until the next START_EVENTS.
            self.events_tid = None
            if self.phase is Phase.NORMAL:
                self.phase = Phase.SUSPENDED
        if tid == self.stop_tid:
            self.stop_tid = None
        what = transaction.command_id
        if eid is EventId.OK and what is CommandId.INIT and self.phase is Phase.INITIALIZE:
            self.phase = Phase.DISCOVERY
        elif eid is EventId.OK and what is CommandId.MODEL_DEF:
            self.model_defined = True
        elif eid is EventId.SHUTDOWN:
            self.phase = Phase.SHUTDOWN
            for other in self.open.values():
                other.done = True
            self.open.clear()
            self._abandoned.clear()
            self.events_tid = self.stop_tid = None

    @property
    def events_flowing(self) -> bool:
        """True while model events may be sent (NORMAL phase with START_EVENTS open)."""
        return self.phase is Phase.NORMAL and self.events_tid is not None


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:60] + "...")


def _move_hint(cid) -> str:
    if cid is CommandId.MOVE_JOB:
        # The PTP 4.0 client numbers its event filter command 7 too; say what 7 is here.
        return " (command 7 is MOVE_JOB here: jobId=<id> queueId=<id>; event filters are not supported)"
    return ""
