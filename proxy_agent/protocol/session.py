"""The agent side of a proxy session: phases, transactions and the dialect, with no I/O.

Feed :meth:`AgentSession.receive` whatever the decoder produced.  It answers
with a :class:`Received`: the command the agent should carry out (if any),
its :class:`Transaction`, and the events the session itself must send first
(errors for refused commands, the OK events that phase changes imply).
Everything the agent sends goes through :meth:`AgentSession.write` (or
:meth:`AgentSession.send` plus the dialect's encoder), which refuses any event
whose command is not open, closes commands on their completing event, moves
the phase forward, and encodes in the session's dialect.

Phases (``spec/protocol.md``, "Phases"; the table that moves them is :mod:`.phases`)::

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
  open is handled as the dialect says (``Dialect.open_tid_reuse``):

  - default dialect: it is carried out and answered like any other, as the
    PTP 4.0 client's own proxies do.  Its client hands out TIDs that are
    still open and gives every event to the *oldest* open command with that
    TID, so what counts is how many commands each TID holds: every command
    gets its one completing event, and a TID stays open (for model events
    too) until the last of its commands is answered.  Commands on one TID
    are kept oldest first; an answer names the command it belongs to, and
    the client simply takes it for the oldest.
  - native dialect: it is refused with ERROR ``TID_IN_USE`` under that TID (a
    well-formed QUIT excepted: it is carried out, and its SHUTDOWN completes
    it).  The client takes that ERROR as completing whatever it last sent
    under the TID, so the command that held the TID is *abandoned*: it may
    still finish inside the agent (a job submitted stays submitted, an INIT
    that succeeds still initialises the session), but no event is sent for
    it any more.  When that command was the open START_EVENTS, model events
    stop (phase SUSPENDED) until the next START_EVENTS.

  Give :meth:`AgentSession.send` the command's :class:`Transaction` so that an
  answer is never mistaken for the answer to another command on the same TID;
  the replies of :class:`Received` name theirs (:meth:`Received.answers`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

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
from .phases import ALLOWED, Phase, PhaseMachine, Step
from .wire import Frame, FrameError

__all__ = ["Abandoned", "AgentSession", "Phase", "ProtocolViolation", "Received", "Transaction"]


def _sub_id(args) -> str:
    for arg in args:
        if arg.startswith("jobSubId="):
            return arg[len("jobSubId="):]
    return ""


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


#: The commands each phase accepts (the table lives in :mod:`.phases`).
LEGAL_COMMANDS = ALLOWED

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
    before anything else, each with the transaction it answers
    (:meth:`answers`).  ``command`` is a legal command for the agent to
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
    #: the transaction each reply answers, in the order of ``replies`` (None: the
    #: oldest command open on its TID, or none for an event that completes nothing)
    owners: List[Optional[Transaction]] = attrs.Factory(list)

    def answers(self) -> List[Tuple[Event, Optional[Transaction]]]:
        """Each reply with the transaction it answers (None where it names none)."""
        owners = self.owners + [None] * (len(self.replies) - len(self.owners))
        return list(zip(self.replies, owners))


class AgentSession:
    """Phase, transaction and dialect bookkeeping for one client connection."""

    def __init__(self) -> None:
        self._phases = PhaseMachine()
        #: the session's phase: moved only by :meth:`_step`, through the table in :mod:`.phases`
        self.phase = Phase.INITIALIZE
        #: the dialect of this session: the default until an INIT names another
        self.dialect: Dialect = DEFAULT
        #: open commands by TID: the oldest on each TID
        self.open: Dict[int, Transaction] = {}
        # newer commands open on a TID, oldest first (default dialect: a TID still open reused)
        self._later: Dict[int, List[Transaction]] = {}
        #: TID of the open START_EVENTS (model events carry it), if any
        self.events_tid: Optional[int] = None
        #: TID of the open STOP_EVENTS (native dialect only), if any
        self.stop_tid: Optional[int] = None
        # the open START_EVENTS and STOP_EVENTS themselves (their TID may hold others too)
        self._events: Optional[Transaction] = None
        self._stop: Optional[Transaction] = None
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
        refused = self._open(0, -1)
        return Received(replies=[Error(0, ErrorCode.MALFORMED_FRAME, text)], owners=[refused], close=True,
                        log=text + "; session closed")

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
        if error.tid in self.open and not self.dialect.open_tid_reuse:
            return self._reused(error.tid, msg_id, f"a malformed frame ({error.message})")
        refused = self._open(error.tid, msg_id)
        return Received(replies=[Error(error.tid, ErrorCode.MALFORMED_FRAME, text)], owners=[refused])

    def _open(self, tid: int, command_id: Union[CommandId, int]) -> Transaction:
        """A new open command; on a TID that holds others already, it queues behind them."""
        transaction = Transaction(tid, command_id)
        if tid in self.open:
            self._later.setdefault(tid, []).append(transaction)
        else:
            self.open[tid] = transaction
        return transaction

    def open_count(self, tid: int) -> int:
        """How many commands are open on ``tid`` (what the client counts)."""
        if tid not in self.open:
            return 0
        return 1 + len(self._later.get(tid, ()))

    def open_on(self, tid: int) -> List[Transaction]:
        """The commands open on ``tid``, oldest first."""
        if tid not in self.open:
            return []
        return [self.open[tid], *self._later.get(tid, ())]

    def _holds(self, transaction: Transaction) -> bool:
        tid = transaction.tid
        return self.open.get(tid) is transaction or transaction in self._later.get(tid, ())

    def _close(self, transaction: Transaction) -> None:
        """Take a completed command off its TID (the next one on the TID, if any, is now the oldest)."""
        tid = transaction.tid
        later = self._later.get(tid)
        if self.open.get(tid) is transaction:
            if later:
                self.open[tid] = later.pop(0)
            else:
                del self.open[tid]
        elif later is not None:
            later.remove(transaction)
        if later is not None and not later:
            del self._later[tid]

    def _reused(self, tid: int, command_id: Union[CommandId, int], what: str) -> Received:
        """Native dialect: refuse what came under an open TID with ERROR there, abandoning the open command."""
        holder = self.open.pop(tid)
        self._abandon(holder)
        refused = self._open(tid, command_id)
        return Received(
            replies=[
                Error(
                    tid,
                    ErrorCode.TID_IN_USE,
                    f"{what} was refused: TID {tid} was still in use by an open {holder.name}, "
                    f"which is now abandoned (no further events are sent for it)",
                )
            ],
            owners=[refused],
        )

    def _abandon(self, holder: Transaction) -> None:
        tid = holder.tid
        holder.abandoned = True
        self._abandoned.setdefault(tid, []).append(holder)
        if holder is self._events:
            # The client now takes this TID for completed: a model event under it
            # would name a TID it does not know.  Events stop until START_EVENTS.
            self._events = None
            self.events_tid = None
            self._step(Step.EVENTS_ENDED)
        if holder is self._stop:
            self._stop = None
            self.stop_tid = None

    def _refuse(self, command: Command, code: ErrorCode, text: str) -> Received:
        from .messages import SubmitJobError, TerminateJobError

        # Open the TID briefly so the ERROR passes send()'s check and closes it.
        refused = self._open(command.tid, command.command_id)
        if command.command_id is CommandId.SUBMIT_JOB and code is ErrorCode.BAD_ARGUMENTS:
            # A submission's problems are reported the way the client matches them: by jobSubId.
            reply: Event = SubmitJobError(command.tid, _sub_id(command.args), code, text)
        elif command.command_id is CommandId.TERMINATE_JOB and code is ErrorCode.BAD_ARGUMENTS:
            # Likewise a termination's, by the jobId it named (the IDE's launch code reads those).
            job_id = next((a[len("jobId="):] for a in command.args if a.startswith("jobId=")), "")
            reply = TerminateJobError(command.tid, job_id, code, text)
        else:
            reply = Error(command.tid, code, text)
        return Received(replies=[reply], owners=[refused])

    def _command(self, command: Command) -> Received:
        tid = command.tid
        if self.phase is Phase.SHUTDOWN:
            return Received(log=f"{command.name} (TID {tid}) after QUIT ignored")
        if tid in self.open and not self.dialect.open_tid_reuse:
            if command.command_id is CommandId.QUIT and not command.args:
                # QUIT is never refused: the command holding its TID is abandoned
                # without a word, and SHUTDOWN under the TID completes the QUIT.
                self._abandon(self.open.pop(tid))
            else:
                return self._reused(tid, command.command_id, command.name)
        if not command.known:
            return self._refuse(command, ErrorCode.UNKNOWN_COMMAND, f"unknown command id 0x{command.command_id:04X}")
        cid = command.command_id
        refusal = self._phases.refusal(cid)
        if refusal is not None:
            return self._refuse(command, ErrorCode.ILLEGAL_IN_PHASE, refusal)
        problem = self._check_arguments(command)
        if problem is not None:
            return self._refuse(command, ErrorCode.BAD_ARGUMENTS, f"{cid.name}: {problem}")

        if cid is CommandId.INIT:
            return self._init(command)
        if cid is CommandId.MODEL_DEF:
            transaction = self._open(tid, cid)
            return Received(command=command, transaction=transaction)
        if cid is CommandId.START_EVENTS:
            replies: List[Event] = []
            owners: List[Optional[Transaction]] = []
            if self._stop is not None:
                replies.append(Ok(self._stop.tid))
                owners.append(self._stop)
            transaction = self._open(tid, cid)
            self._step(Step.EVENTS_STARTED)
            self.events_tid = tid
            self._events = transaction
            return Received(command=command, replies=replies, owners=owners, transaction=transaction)
        if cid is CommandId.STOP_EVENTS:
            events = self._events
            assert events is not None and self.events_tid is not None  # NORMAL always has an open START_EVENTS
            replies = [Ok(events.tid)]
            owners = [events]
            transaction = self._open(tid, cid)
            self._step(Step.EVENTS_STOPPED)
            if self.dialect.stop_events_at_once:
                replies.append(Ok(tid))
                owners.append(transaction)
            else:
                self.stop_tid = tid
                self._stop = transaction
            return Received(command=command, replies=replies, owners=owners, transaction=transaction)
        if cid is CommandId.QUIT:
            replies = []
            owners = []
            for open_tid in list(self.open):
                for held in self.open_on(open_tid):
                    if held is self._events or held is self._stop:
                        replies.append(Ok(open_tid))
                        owners.append(held)
                        continue
                    # The session answers for the agent: whatever the agent says
                    # about this command later is withheld, like an abandoned one's.
                    stand_in = self._stand_in(held)
                    replies.append(
                        Error(open_tid, ErrorCode.SHUTTING_DOWN, f"{held.name} abandoned: the agent is quitting")
                    )
                    owners.append(stand_in)
            transaction = self._open(tid, cid)
            from .messages import Shutdown

            replies.append(Shutdown(tid))
            owners.append(transaction)
            return Received(command=command, replies=replies, owners=owners, transaction=transaction)
        transaction = self._open(tid, cid)
        return Received(command=command, transaction=transaction)

    def _stand_in(self, held: Transaction) -> Transaction:
        """Put a transaction in the place of ``held``, which is withdrawn from the agent (its
        later events are withheld): the session's own answer completes the stand-in."""
        held.done = held.abandoned = True
        stand_in = Transaction(held.tid, held.command_id)
        if self.open.get(held.tid) is held:
            self.open[held.tid] = stand_in
        else:
            later = self._later[held.tid]
            later[later.index(held)] = stand_in
        return stand_in

    def _init(self, command: Command) -> Received:
        pending = [t for t in self.open for held in self.open_on(t) if held.command_id is CommandId.INIT]
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
            if not self._holds(transaction):  # pragma: no cover - open transactions are always held
                raise ProtocolViolation(f"refusing to send {eid.name} for TID {tid}: not the open command")
            held = transaction
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
            if eid is EventId.OK and transaction.command_id is CommandId.INIT:
                # The agent is initialised whether or not the client heard of it.
                self._step(Step.INITIALISED)
            # An abandoned MODEL_DEF does not count: the client did not get all definitions.
        raise Abandoned(
            f"not sending {eid.name} for TID {transaction.tid}: {transaction.name} was abandoned when the TID was reused"
        )

    def _complete(self, transaction: Transaction, eid: EventId) -> None:
        self._close(transaction)
        transaction.done = True
        if transaction is self._events:
            # Ended other than by STOP_EVENTS (e.g. the agent failed it):
            # events stop flowing until the next START_EVENTS.
            self._events = None
            self.events_tid = None
            self._step(Step.EVENTS_ENDED)
        if transaction is self._stop:
            self._stop = None
            self.stop_tid = None
        what = transaction.command_id
        if eid is EventId.OK and what is CommandId.INIT:
            self._step(Step.INITIALISED)
        elif eid is EventId.OK and what is CommandId.MODEL_DEF:
            self._step(Step.MODEL_DEFINED)
        elif eid is EventId.SHUTDOWN:
            self._step(Step.SHUT_DOWN)
            for tid in list(self.open):
                for other in self.open_on(tid):
                    other.done = True
            self.open.clear()
            self._later.clear()
            self._abandoned.clear()
            self.events_tid = self.stop_tid = None
            self._events = self._stop = None

    def _step(self, step: Step) -> None:
        """Move the phase as the table says ``step`` does (IllegalTransition: a bug)."""
        self.phase = self._phases.step(step)

    @property
    def model_defined(self) -> bool:
        """A MODEL_DEF has completed with OK (START_EVENTS may then leave DISCOVERY)."""
        return self._phases.has(Step.MODEL_DEFINED)

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
