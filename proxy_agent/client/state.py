"""The client's side of a session as plain Python: no I/O, no clock, no concurrency.

:class:`ClientState` is told what the client sends (:meth:`ClientState.send`)
and fed the bytes the agent sends back (:meth:`ClientState.receive_data`).
For every frame it returns a :class:`Traffic` record saying what the frame
was, which open command it belongs to, whether it completed that command,
and which rules of the protocol the agent broke by sending it.  Along the
way it keeps a mirror of the agent's model (machines, nodes, queues, jobs,
processes and their attributes, process output): the model events are
applied in :mod:`.mirror_events`, and what the state is made of is in :mod:`.records`.

The dialect is the one the client asked for in its INIT (``dialect=...``;
none: the default dialect).  In the default dialect every argument received
is unescaped (:func:`proxy_agent.protocol.dialect.unescape`) before it is
read, so the mirror always holds the real text.

The rules checked here are the ones a client depends on:

* every event carries the TID of a command that is still open, and a
  completing event (OK, ERROR, SHUTDOWN, SUBMITJOB_ERROR, TERMINATEJOB_ERROR)
  closes it.  A command sent under a TID still open is, in the default
  dialect, carried out like any other: the TID then holds several commands,
  each gets one completing event, and an event is taken for the oldest command
  on its TID that it can answer (in reference mode simply the oldest, as the
  PTP 4.0 client does).  In the native dialect it is refused with ERROR
  ``TID_IN_USE`` under that TID, which abandons the command that held it (no
  later event may name it);
* model events carry the TID of the open START_EVENTS; ATTR_DEF belongs to a
  MODEL_DEF, SUBMITJOB_ERROR to a SUBMIT_JOB (with its jobSubId),
  TERMINATEJOB_ERROR to a TERMINATE_JOB (with its jobId), SHUTDOWN to a QUIT;
* START_EVENTS completes with OK only once STOP_EVENTS or QUIT was sent after
  it; in the native dialect likewise STOP_EVENTS with a later START_EVENTS or
  QUIT, while in the default dialect STOP_EVENTS is answered at once (its OK
  right after the START_EVENTS' OK); by SHUTDOWN nothing else is left open;
* NEW events name ids not in the model and a parent of the right kind
  (machines and queues under the resource manager, nodes under machines,
  jobs under queues, processes under jobs); CHANGE and REMOVE events name
  elements that exist and are of the kind the event is about; process
  events name a known job and processes of that job, by rank;
* frames are well formed and events have their documented layout;
* in the default dialect: every byte is US-ASCII and every escape valid,
  ATTR_DEF uses only the seven types the PTP 4.0 client parses, no NEW or
  CHANGE event carries an array value (a repeated key, ``progArgs``, ``env``
  or another ARRAY attribute), INTEGER values and element ids fit a Java
  int, and element ids are numbers.

With ``reference=True`` the state also holds the agent to what the Eclipse
PTP 4.0 client itself needs (it then speaks the default dialect only):
process ranks below the job's ``jobNumProcs``, ENUMERATED values from the
declared list, no MESSAGE standing in for a refusal (that client would wait
for ever), no ERROR ``TID_IN_USE`` (that client gives it to the oldest
command on the TID and puts its resource manager into ERROR), no FILTER_DEF
(unknown to it), no command left unanswered when the agent ends the
connection (:meth:`ClientState.unanswered`), and for every job it submitted
a NEW_JOB saying STARTING and, if the job ran, a JOB_CHANGE saying RUNNING
before its end (that client finishes a launch only on such a JOB_CHANGE).
It also behaves as that client does: INIT, MODEL_DEF and the first
START_EVENTS go on TID 0, and other commands take TIDs from a small ring
(``tid_pool``) whether or not the TID is still open (:meth:`ClientState.new_tid`).

Breaking a rule is recorded as a :class:`Violation`; the I/O layer decides
how loudly to complain.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, Optional, Sequence, Set, Tuple, Union

import attrs

from ..protocol.dialect import DEFAULT, Dialect, EscapeError
from ..protocol.ids import is_decimal
from ..protocol.messages import (
    COMPLETING_EVENTS, ArgumentError, Command, CommandId, Error, ErrorCode, Event, EventId, FilterDef, Message,
    SubmitJobError, TerminateJobError, decode_event,
)
from ..protocol.wire import DEFAULT_MAX_FRAME_SIZE, Decoder, ErrorKind, Frame, FrameError, encode_frame
from .mirror_events import ModelEvents
from .records import (
    COMPLETING_IDS, DEFAULT_ARRAY_KEYS, Element, MODEL_EVENTS, OUTPUT_KEYS, OpenCommand, OutputLine,
    PROTOCOL_VERSION, REFERENCE_TID_POOL, RM, STANDARD_INTEGERS, STATE_KEYS, Traffic, Violation, base_id_of,
    canonical_id, dialect_of, event_name, type_name,
)

# The state's face: the records' names its users need come from here too.
__all__ = [
    "ClientState",
    "Element",
    "OpenCommand",
    "OutputLine",
    "Traffic",
    "Violation",
    "canonical_id",
    "RM",
    "PROTOCOL_VERSION",
    "OUTPUT_KEYS",
    "REFERENCE_TID_POOL",
    "STATE_KEYS",
]


class ClientState(ModelEvents):
    """Session bookkeeping, protocol checks and the mirrored model, without I/O.

    ``reference``: also check what the Eclipse PTP 4.0 client needs, and
    behave as it does (see the module docstring); such a state speaks only the
    default dialect.  ``tid_pool``: how many TIDs its allocator goes round (reference
    mode only).
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, *, reference: bool = False,
                 tid_pool: int = REFERENCE_TID_POOL) -> None:
        if tid_pool < 1:
            raise ValueError(f"tid_pool must be at least 1, not {tid_pool}")
        self._decoder = Decoder(max_frame_size)
        self._raw = bytearray()
        self._next_tid = 1
        self.reference = reference
        self.tid_pool = tid_pool
        #: the first START_EVENTS has been sent (reference mode: the handshake on TID 0 is over)
        self._handshake_over = False
        #: the jobSubIds of the jobs this client submitted
        self.submitted: Set[str] = set()
        #: the dialect of the session: the one the last INIT sent asked for
        self.dialect: Dialect = DEFAULT
        self.open: Dict[int, OpenCommand] = {}
        #: the agent ended the session on its own (SHUTDOWN not answering a QUIT)
        self.agent_stopped = False
        self.base_id: Optional[str] = None
        self.initialized = False
        self.shutdown = False
        self.violations: List[Violation] = []
        self.messages: List[Message] = []
        self.attr_defs: Dict[str, object] = {}
        self.filter_defs: List[FilterDef] = []
        #: every element by its key: element id, or (job id, rank) for processes
        self.elements: Dict[Hashable, Element] = {}
        self.by_kind: Dict[str, Dict[Hashable, Element]] = {k: {} for k in (RM, *STATE_KEYS)}
        self.jobs_by_sub: Dict[str, Element] = {}
        self._array_keys = set(DEFAULT_ARRAY_KEYS)
        self._integer_keys: Set[str] = set(STANDARD_INTEGERS)
        # commands sent under a TID still open, oldest first (native dialect: on purpose, to be refused)
        self._reusing: Dict[int, List[OpenCommand]] = {}
        # default dialect: the TID of the STOP_EVENTS whose OK must be the very next frame
        self._stop_due: Optional[int] = None
        #: count of model events applied (handy for "something happened" waits)
        self.model_events = 0
        #: frames received so far (well delimited, if not always well formed);
        #: while 0, a fatal framing error means the stream began with something
        #: that is not the protocol
        self.frames_received = 0

    # ------------------------------------------------------------------ queries

    @property
    def rm(self) -> Optional[Element]:
        return self.elements.get(self.base_id) if self.base_id is not None else None

    def open_commands(self) -> List[OpenCommand]:
        """Every open command, those sharing a TID oldest first."""
        found: List[OpenCommand] = []
        for tid, command in self.open.items():
            found.append(command)
            found.extend(self._reusing.get(tid, ()))
        return found

    def open_on(self, tid: int) -> List[OpenCommand]:
        """The commands open on ``tid``, oldest first."""
        command = self.open.get(tid)
        return [] if command is None else [command, *self._reusing.get(tid, ())]

    @property
    def events_started(self) -> bool:
        """A START_EVENTS is open and no STOP_EVENTS/QUIT has been sent after it."""
        return any(c.command_id == CommandId.START_EVENTS and not c.released for c in self.open_commands())

    def open_command(self, command_id: CommandId) -> Optional[OpenCommand]:
        """The most recent open command with that id, if any."""
        found = None
        for command in self.open_commands():
            if command.command_id == command_id:
                found = command
        return found

    def job_key(self, element_id: str) -> Optional[int]:
        """A job's id everywhere outside the protocol (``proxy-agent jobs``, logs, the
        console): its element id less the base id the client gave in INIT (None when that
        does not make a positive number)."""
        if self.base_id is None or not is_decimal(self.base_id) or not is_decimal(str(element_id)):
            return None
        key = int(element_id) - int(self.base_id)
        return key if key > 0 else None

    def job_element_id(self, key: int) -> Optional[str]:
        """The element id of the job whose id (see :meth:`job_key`) is ``key``."""
        if self.base_id is None or not is_decimal(self.base_id) or key <= 0:
            return None
        return str(int(self.base_id) + key)

    def job_by_key(self, key: int) -> Optional[Element]:
        element_id = self.job_element_id(key)
        return self.by_kind["job"].get(element_id) if element_id is not None else None

    def is_array(self, key: str) -> bool:
        return key in self._array_keys

    def process(self, job_id: str, rank: Union[int, str]) -> Optional[Element]:
        """The process of rank ``rank`` in job ``job_id``, if the mirror has it."""
        return self.elements.get((canonical_id(str(job_id)), canonical_id(str(rank))))

    def unanswered(self) -> List[Violation]:
        """Commands still waiting for their completing event, as violations (recorded too).

        For when the agent has ended the connection: a command it never
        answered would wait for ever in the PTP 4.0 client.
        """
        found = [
            Violation(
                "unanswered",
                f"{command.name} (TID {command.tid}) never got a completing event before the connection ended",
                command.tid,
            )
            for command in self.open_commands()
            if not command.done
        ]
        self.violations.extend(found)
        return found

    # ------------------------------------------------------------------ output

    def new_tid(self, command_id: Union[CommandId, int, None] = None) -> int:
        """A TID for a new command.

        Normally one no open command holds.  In reference mode, as the PTP 4.0
        client: INIT, MODEL_DEF and the first START_EVENTS on TID 0, then TIDs
        1 to ``tid_pool`` in turn, whether or not a command still holds one
        (only a TID holding the open START_EVENTS is passed over)."""
        if self.reference:
            if not self._handshake_over and command_id in (CommandId.INIT, CommandId.MODEL_DEF, CommandId.START_EVENTS):
                return 0
            for _ in range(self.tid_pool):
                tid = self._next_tid if 1 <= self._next_tid <= self.tid_pool else 1
                self._next_tid = tid % self.tid_pool + 1
                if not any(c.command_id == CommandId.START_EVENTS for c in self.open_on(tid)):
                    return tid
            return self._free_tid(self.tid_pool + 1)
        tid = self._free_tid(self._next_tid)
        self._next_tid = tid % 0xFFFFFFFF + 1
        return tid

    def _free_tid(self, tid: int) -> int:
        while tid in self.open:
            tid = tid % 0xFFFFFFFF + 1
        return tid

    def send(self, command_id: Union[CommandId, int], args: Sequence[str] = (), tid: Optional[int] = None) -> Tuple[OpenCommand, Traffic]:
        """Record a command about to be sent; returns it and its frame.

        ``tid`` may be given to choose one (protocol testing).  A command sent
        under the TID of a command still open does not replace it.  In the
        default dialect the agent carries it out like any other, and the TID
        stays open until each of its commands is answered.  In the native
        dialect the agent refuses it with ERROR ``TID_IN_USE`` under that TID,
        which completes the returned command and abandons the one that held
        the TID (QUIT is the exception: it is carried out, and the held
        command is abandoned).
        """
        if tid is None:
            tid = self.new_tid(command_id)
        try:
            cid: Union[CommandId, int] = CommandId(command_id)
        except ValueError:
            cid = int(command_id)
        args = tuple(args)
        if cid == CommandId.START_EVENTS:
            self._handshake_over = True
            for other in self.open_commands():
                if other.command_id == CommandId.STOP_EVENTS:
                    other.released = True
        elif cid == CommandId.STOP_EVENTS:
            for other in self.open_commands():
                if other.command_id == CommandId.START_EVENTS and not other.released:
                    other.released = True
                    other.released_by = tid
        elif cid == CommandId.QUIT:
            for other in self.open_commands():
                if other.command_id in (CommandId.START_EVENTS, CommandId.STOP_EVENTS):
                    other.released = True
        elif cid == CommandId.INIT:
            self.base_id = base_id_of(args)
            self.dialect = dialect_of(args)
            if self.reference and self.dialect is not DEFAULT:
                raise ValueError(f"a reference-mode client speaks the default dialect only, not {self.dialect.name!r}")
        if cid == CommandId.SUBMIT_JOB:
            sub_id = next((a[len("jobSubId="):] for a in args if a.startswith("jobSubId=")), None)
            if sub_id is not None:
                self.submitted.add(sub_id)
        command = OpenCommand(tid, cid, args)
        if tid in self.open:
            self._reusing.setdefault(tid, []).append(command)
        else:
            self.open[tid] = command
        raw = encode_frame(int(cid), tid, args)
        frame = Frame(int(cid), tid, args)
        return command, Traffic("out", raw, frame, Command(cid, tid, args), command)

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> List[Traffic]:
        self._decoder.feed(data)
        if self._decoder.failed is None:
            self._raw += data
        return self._drain()

    def receive_eof(self) -> List[Traffic]:
        self._decoder.feed_eof()
        return self._drain()

    def _drain(self) -> List[Traffic]:
        out = []
        for item in self._decoder:
            if isinstance(item, FrameError) and item.fatal:
                # Only the bytes the decoder judged, so the record does not
                # depend on how much else happened to arrive with them.
                size = {ErrorKind.BAD_LENGTH: 8, ErrorKind.FRAME_TOO_LARGE: 8, ErrorKind.MISSING_SPACE: 9}.get(item.kind, 256)
                raw = bytes(self._raw[:size])
                self._raw.clear()
            else:
                length = int(self._raw[:8], 16)
                raw = bytes(self._raw[: 8 + length])
                del self._raw[: 8 + length]
                self.frames_received += 1
            out.append(self._frame(item, raw))
        return out

    def _frame(self, item: Union[Frame, FrameError], raw: bytes) -> Traffic:
        problems: List[Violation] = []
        tid = item.tid
        default = self.dialect.ascii_only
        if default and not raw.isascii():
            offset = next(i for i, byte in enumerate(raw) if byte > 0x7F)
            problems.append(
                Violation(
                    "non-ascii",
                    f"byte 0x{raw[offset]:02X} at offset {offset} of a frame (TID {tid}): the default dialect "
                    "sends US-ASCII only (the PTP 4.0 client disconnects on any other byte)",
                    tid,
                    raw,
                )
            )
        if self._stop_due is not None:
            due, self._stop_due = self._stop_due, None
            if not (isinstance(item, Frame) and item.msg_id == EventId.OK and item.tid == due):
                problems.append(
                    Violation(
                        "stop-events-late",
                        f"STOP_EVENTS (TID {due}) was not answered at once: its OK must follow the "
                        "START_EVENTS' OK directly in the default dialect",
                        due,
                        raw,
                    )
                )
        if isinstance(item, FrameError):
            where = f" (event {item.msg_id}, TID {item.tid})" if item.tid is not None else ""
            rule = "framing" if item.fatal else "malformed-frame"
            problems.append(Violation(rule, f"malformed frame from the agent{where}: {item.message}", item.tid, raw))
            command, completed = self._complete_broken(item.msg_id, item.tid, f"malformed reply: {item.message}")
            self.violations.extend(problems)
            return Traffic("in", raw, item, None, command, completed, tuple(problems))
        if default and b"\\" in raw:
            try:
                item = Frame(item.msg_id, item.tid, tuple(self.dialect.unescape(arg) for arg in item.args))
            except EscapeError as exc:
                problems.append(Violation("bad-escape", f"{event_name(item.msg_id)} (TID {tid}): {exc}", tid, raw))
        try:
            event = decode_event(item)
        except (ArgumentError, ValueError) as exc:
            name = event_name(item.msg_id)
            problems.append(Violation("malformed-event", f"malformed {name} (TID {item.tid}): {exc}", item.tid, raw))
            command, completed = self._complete_broken(item.msg_id, item.tid, f"malformed {name}: {exc}")
            self.violations.extend(problems)
            return Traffic("in", raw, item, None, command, completed, tuple(problems))
        command, completed = self._event(event, problems)
        for p in range(len(problems)):
            if not problems[p].raw:
                problems[p] = attrs.evolve(problems[p], raw=raw)
        self.violations.extend(problems)
        return Traffic("in", raw, item, event, command, completed, tuple(problems))

    def _complete_broken(self, msg_id: Optional[int], tid: Optional[int], why: str) -> Tuple[Optional[OpenCommand], bool]:
        # A malformed reply that would have completed an open command still
        # completes it, so that nobody waits forever for a reply already sent.
        command = self.open.get(tid) if tid is not None else None
        if command is None or msg_id not in COMPLETING_IDS:
            return command, False
        self._close(command)
        command.failure = why
        return command, True

    def _close(self, command: OpenCommand) -> None:
        """Take a completed command off its TID; a command queued behind it on that TID takes its place."""
        tid = command.tid
        command.done = True
        queued = self._reusing.get(tid)
        if self.open.get(tid) is command:
            if queued:
                self.open[tid] = queued.pop(0)
            else:
                del self.open[tid]
        elif queued is not None and command in queued:
            queued.remove(command)
        if queued is not None and not queued:
            del self._reusing[tid]

    def _owner(self, event: Event) -> Optional[OpenCommand]:
        """The open command an event is taken for.

        One command on the TID: that one.  Several (a TID reused while open, in the default
        dialect): in reference mode the oldest, as the PTP 4.0 client takes it; otherwise
        the oldest that the event can belong to, so that the mirror stays right whichever
        of them the agent answers first."""
        held = self.open_on(event.tid)
        if len(held) <= 1 or self.reference or not self.dialect.open_tid_reuse:
            return held[0] if held else None
        eid = event.event_id
        if eid in MODEL_EVENTS:
            fits = [c for c in held if c.command_id == CommandId.START_EVENTS]
        elif eid is EventId.ATTR_DEF:
            fits = [c for c in held if c.command_id == CommandId.MODEL_DEF]
        elif eid is EventId.SHUTDOWN:
            fits = [c for c in held if c.command_id == CommandId.QUIT]
        elif isinstance(event, SubmitJobError):
            fits = [c for c in held if c.command_id == CommandId.SUBMIT_JOB
                    and c.attribute("jobSubId") == event.job_sub_id]
        elif eid is EventId.TERMINATEJOB_ERROR:
            fits = [c for c in held if c.command_id == CommandId.TERMINATE_JOB]
        elif eid in (EventId.OK, EventId.ERROR):
            # not a START_EVENTS (or native STOP_EVENTS) that nothing has released yet
            fits = [c for c in held if c.released or c.command_id not in (CommandId.START_EVENTS, CommandId.STOP_EVENTS)]
        else:
            fits = []
        return fits[0] if fits else held[0]

    # ------------------------------------------------------------------ events

    def _reuse_refusal(self, event: Event) -> Optional[OpenCommand]:
        """The queued command this completing event answers, if it is the refusal of a reused TID
        (native dialect)."""
        queued = self._reusing.get(event.tid)
        if not queued or self.dialect.open_tid_reuse:
            return None
        if isinstance(event, Error) and event.code == ErrorCode.TID_IN_USE:
            return queued[0]
        if event.event_id is EventId.SHUTDOWN:
            for command in queued:
                if command.command_id == CommandId.QUIT:
                    return command
        return None

    def _event(self, event: Event, problems: List[Violation]) -> Tuple[Optional[OpenCommand], bool]:
        eid = event.event_id
        tid = event.tid
        name = eid.name
        command = self._owner(event)
        if command is None:
            after = " after SHUTDOWN" if self.shutdown else ""
            problems.append(
                Violation("unknown-tid", f"{name} with TID {tid}{after}, which matches no open command", tid)
            )
            return None, False
        if eid not in COMPLETING_EVENTS:
            self._progress(command, event, problems)
            return command, False
        command = self._answered_by_reuse(command, event)
        self._check_completion(command, event, problems)
        self._close(command)
        command.completion = event
        return command, True

    def _answered_by_reuse(self, command: OpenCommand, event: Event) -> OpenCommand:
        """A completing event for a command queued on a reused TID: the command that held the
        TID is abandoned, and the event is the queued one's (see ``_reuse_refusal``)."""
        tid = event.tid
        refused = self._reuse_refusal(event)
        if refused is not None:
            # The command that held the TID is abandoned: the agent says no more about it.
            del self.open[tid]
            command.done = command.abandoned = True
            command.failure = f"abandoned: TID {tid} was reused by {refused.name} while it was open"
            queued = self._reusing[tid]
            queued.remove(refused)
            if not queued:
                del self._reusing[tid]
            self.open[tid] = refused
            command = refused
        return command

    def _progress(self, command: OpenCommand, event: Event, problems: List[Violation]) -> None:
        """An event that completes nothing: model events, messages, definitions, output."""
        eid = event.event_id
        tid = event.tid
        name = eid.name
        cid = command.command_id
        if eid in MODEL_EVENTS:
            if cid != CommandId.START_EVENTS:
                problems.append(
                    Violation(
                        "model-event-tid",
                        f"{name} carries TID {tid} of {command.name}; model events belong to the open START_EVENTS",
                        tid,
                    )
                )
            command.events.append(event)
            self._apply(event, problems)
            return
        if eid is EventId.MESSAGE:
            assert isinstance(event, Message)  # decode_event makes a Message of every MESSAGE
            self.messages.append(event)
            if self.reference and event.code == ErrorCode.TID_IN_USE and event.level in ("ERROR", "FATAL"):
                problems.append(
                    Violation(
                        "message-refusal",
                        f"MESSAGE (TID {tid}) refuses a command: a MESSAGE completes nothing, so the PTP 4.0 "
                        "client would wait for ever; a refusal must be an ERROR",
                        tid,
                    )
                )
            command.events.append(event)
            return
        if eid is EventId.ATTR_DEF:
            if cid != CommandId.MODEL_DEF:
                problems.append(Violation("attr-def-tid", f"ATTR_DEF under TID {tid} of {command.name}, not MODEL_DEF", tid))
            for definition in event.definitions:
                self.attr_defs[definition.id] = definition
                kind = type_name(definition)
                if kind == "ARRAY":
                    self._array_keys.add(definition.id)
                elif kind == "INTEGER":
                    self._integer_keys.add(definition.id)
                if self.dialect.ascii_only and definition.type not in self.dialect.attribute_types:
                    problems.append(
                        Violation(
                            "attr-type",
                            f"ATTR_DEF (TID {tid}) defines {definition.id!r} as {kind}: the default dialect "
                            f"sends only {', '.join(sorted(t.value for t in self.dialect.attribute_types))}",
                            tid,
                        )
                    )
            command.events.append(event)
            return
        if eid is EventId.OUTPUT:
            if cid != CommandId.GET_OUTPUT:
                problems.append(Violation("output-tid", f"OUTPUT under TID {tid} of {command.name}, not GET_OUTPUT", tid))
            command.events.append(event)
            return
        if eid is EventId.FILTER_DEF:
            if cid not in (CommandId.MODEL_DEF, CommandId.LIST_FILTERS):
                problems.append(Violation("filter-def-tid", f"FILTER_DEF under TID {tid} of {command.name}", tid))
            if self.reference:
                problems.append(
                    Violation("unknown-event", f"FILTER_DEF (TID {tid}): event 250 is unknown to the PTP 4.0 client", tid)
                )
            self.filter_defs.append(event)
            command.events.append(event)
            return
        problems.append(Violation("unexpected-event", f"unexpected {name} (TID {tid})", tid))  # pragma: no cover

    def _check_completion(self, command: OpenCommand, event: Event, problems: List[Violation]) -> None:
        """What a completing event (OK, ERROR, SHUTDOWN, the job errors) must agree with, and what it does."""
        eid = event.event_id
        tid = event.tid
        cid = command.command_id
        if eid is EventId.ERROR and self.reference and isinstance(event, Error) and event.code == ErrorCode.TID_IN_USE:
            problems.append(
                Violation(
                    "tid-refused",
                    f"ERROR TID_IN_USE (TID {tid}): the PTP 4.0 client gives it to the oldest command on the TID "
                    f"({command.name}), fails every pending submission and puts its resource manager into ERROR; "
                    "a command on a TID still open must be carried out",
                    tid,
                )
            )
        if eid is EventId.OK:
            at_once = self.dialect.stop_events_at_once and cid == CommandId.STOP_EVENTS
            # (on a TID that holds several commands the OK may be another's: the client cannot tell)
            shared = len(self.open_on(tid)) > 1
            if cid in (CommandId.START_EVENTS, CommandId.STOP_EVENTS) and not command.released and not at_once \
                    and not shared:
                later = "STOP_EVENTS" if cid == CommandId.START_EVENTS else "START_EVENTS"
                problems.append(
                    Violation(
                        "early-ok",
                        f"OK for {command.name} (TID {tid}) before the client sent {later} or QUIT",
                        tid,
                    )
                )
            if cid == CommandId.START_EVENTS and self.dialect.stop_events_at_once and command.released_by is not None:
                stop = self.open.get(command.released_by)
                if stop is not None and stop.command_id == CommandId.STOP_EVENTS:
                    self._stop_due = stop.tid
            if cid == CommandId.INIT:
                self._initialized()
        elif eid is EventId.SHUTDOWN:
            self._shut_down(command, tid, problems)
        elif eid is EventId.SUBMITJOB_ERROR:
            if cid != CommandId.SUBMIT_JOB:
                problems.append(Violation("error-tid", f"SUBMITJOB_ERROR under TID {tid} of {command.name}", tid))
            elif event.job_sub_id != (command.attribute("jobSubId") or ""):
                problems.append(
                    Violation(
                        "error-subject",
                        f"SUBMITJOB_ERROR (TID {tid}) names jobSubId {event.job_sub_id!r}, "
                        f"the command submitted {command.attribute('jobSubId')!r}",
                        tid,
                    )
                )
        elif isinstance(event, TerminateJobError):
            if cid != CommandId.TERMINATE_JOB:
                problems.append(Violation("error-tid", f"TERMINATEJOB_ERROR under TID {tid} of {command.name}", tid))
            elif canonical_id(event.job_id) != canonical_id(command.attribute("jobId") or ""):
                problems.append(
                    Violation(
                        "error-subject",
                        f"TERMINATEJOB_ERROR (TID {tid}) names job {event.job_id!r}, "
                        f"the command named {command.attribute('jobId')!r}",
                        tid,
                    )
                )

    def _shut_down(self, command: OpenCommand, tid: int, problems: List[Violation]) -> None:
        """SHUTDOWN (under ``tid``), under QUIT or (the agent stopping on its own) under another
        open command."""
        cid = command.command_id
        left = [c for c in self.open_commands() if c is not command]
        if cid == CommandId.QUIT and left:
            names = ", ".join(f"{c.name} (TID {c.tid})" for c in left)
            problems.append(Violation("shutdown-open", f"SHUTDOWN while commands were still open: {names}", tid))
        # Under another open command it is the agent stopping on its own (a signal, after a
        # MESSAGE saying so): every command still open ends with it.
        self.agent_stopped = cid != CommandId.QUIT
        for other in left:
            other.done = True
            other.failure = "the agent shut down without answering it"
        for queued in self._reusing.values():
            for other in queued:
                other.done = True
                other.failure = "the agent shut down without answering it"
        self._reusing.clear()
        self.open = {tid: command}
        self.shutdown = True

    def _initialized(self) -> None:
        self.initialized = True
        if self.base_id is not None and self.base_id not in self.elements:
            rm = Element(self.base_id, RM, None, {"id": self.base_id})
            self.elements[rm.id] = rm
            self.by_kind[RM][rm.id] = rm

