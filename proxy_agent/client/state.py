"""The client's side of a session as plain Python: no I/O, no clock, no concurrency.

:class:`ClientState` is told what the client sends (:meth:`ClientState.send`)
and fed the bytes the agent sends back (:meth:`ClientState.receive_data`).
For every frame it returns a :class:`Traffic` record saying what the frame
was, which open command it belongs to, whether it completed that command,
and which rules of the protocol the agent broke by sending it.  Along the
way it keeps a mirror of the agent's model (machines, nodes, queues, jobs,
processes and their attributes, process output).

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

from typing import Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import attrs

from ..protocol.attributes import STANDARD_ATTRIBUTES, AttrType
from ..protocol.dialect import CLIENT_ARRAY_ATTRIBUTES, DEFAULT, Dialect, DialectError, EscapeError, dialect_named
from ..protocol.ids import is_decimal
from ..protocol.messages import (
    COMPLETING_EVENTS,
    ArgumentError,
    AttrDef,
    Command,
    CommandId,
    ElementChange,
    ElementKind,
    Error,
    ErrorCode,
    Event,
    EventId,
    FilterDef,
    Message,
    NewElements,
    Ok,
    ProcessChange,
    RemoveAll,
    RemoveElements,
    RemoveProcesses,
    Shutdown,
    SubmitJobError,
    TerminateJobError,
    decode_event,
    parse_init,
)
from ..protocol.rangeset import RangeSet
from ..protocol.wire import DEFAULT_MAX_FRAME_SIZE, Decoder, ErrorKind, Frame, FrameError, encode_frame

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
]

PROTOCOL_VERSION = "2.0"
#: Kind name of the resource-manager element (the base id).
RM = "rm"
#: Attributes that carry process output rather than state.
OUTPUT_KEYS = {"processStdout": "stdout", "processStderr": "stderr"}
#: Attributes known to repeat (one value per argument / variable) before MODEL_DEF says so.
DEFAULT_ARRAY_KEYS = frozenset({"progArgs", "env"})
#: The attribute holding each kind's state.
STATE_KEYS = {
    "machine": "machineState",
    "node": "nodeState",
    "queue": "queueState",
    "job": "jobState",
    "process": "processState",
}
#: Element ids one event may make the client expand; more is treated as hostile.
MAX_IDS_PER_EVENT = 1_000_000
#: How many TIDs a reference-mode client goes round (see :meth:`ClientState.new_tid`).
REFERENCE_TID_POOL = 4
#: Job states (``jobStatus``) that say the job ran: its launch must have seen RUNNING.
RAN_STATUSES = frozenset({"RUNNING", "SUSPENDED", "FINISHING", "FINISHED", "FAILED"})
#: How a process is keyed in the mirror: (job id, rank).
ProcessKey = Tuple[str, str]

_PARENT_KIND = {
    ElementKind.MACHINE: RM,
    ElementKind.QUEUE: RM,
    ElementKind.NODE: "machine",
    ElementKind.JOB: "queue",
    ElementKind.PROCESS: "job",
}
_MODEL_EVENTS = frozenset(e for e in EventId if EventId.NEW_JOB <= e <= EventId.REMOVE_QUEUE)
_COMPLETING_IDS = frozenset(int(e) for e in COMPLETING_EVENTS)
# INTEGER attributes the PTP 4.0 client knows without being told (its own definitions).
_STANDARD_INTEGERS = frozenset(d.id for d in STANDARD_ATTRIBUTES if d.type is AttrType.INTEGER)


def canonical_id(text: str) -> str:
    """Element ids as the mirror keys them: decimal ids without leading zeros."""
    if is_decimal(text):
        return str(int(text))
    return text


@attrs.frozen
class Violation:
    """One rule of the protocol the agent broke."""

    rule: str
    message: str
    tid: Optional[int] = None
    raw: bytes = b""

    def __str__(self) -> str:
        return self.message


@attrs.frozen
class OutputLine:
    #: the process's key in the mirror: (job id, rank)
    process: ProcessKey
    stream: str  # "stdout" or "stderr"
    text: str


@attrs.define(eq=False, repr=False)
class Element:
    """One element of the mirrored model.

    ``id`` is the id the agent uses on the wire: an element id, or for a
    process its rank within its job.  ``key`` is how the mirror holds it:
    the id, or for a process ``(job id, rank)``.  ``attributes`` maps
    attribute ids to strings, or to lists of strings for ARRAY attributes
    (``progArgs``, ``env``...).  Processes and jobs collect ``output`` (a
    job's holds the lines of all its processes in arrival order).
    ``states`` is the sequence of distinct states the element went through,
    as seen by the client; ``changed_states`` the states carried by its
    CHANGE events, one per event, in order (a launch in the PTP 4.0 client
    completes only on a JOB_CHANGE saying RUNNING).
    """

    id: str
    kind: str
    parent: Optional[str]
    attributes: Dict[str, Union[str, List[str]]] = attrs.Factory(dict)
    children: Dict[Hashable, None] = attrs.Factory(dict)
    output: List[OutputLine] = attrs.Factory(list)
    states: List[str] = attrs.Factory(list)
    removed: bool = False
    changed_states: List[str] = attrs.Factory(list)

    @property
    def key(self) -> Hashable:
        if self.kind == "process":
            return (self.parent, self.id)
        return self.id

    @property
    def rank(self) -> Optional[int]:
        """A process's rank within its job (None for other kinds)."""
        return int(self.id) if self.kind == "process" and is_decimal(self.id) else None

    def get(self, key: str, default=None):
        return self.attributes.get(key, default)

    @property
    def name(self) -> str:
        value = self.attributes.get("name", "")
        return value if isinstance(value, str) else " ".join(value)

    @property
    def state(self) -> Optional[str]:
        key = STATE_KEYS.get(self.kind)
        value = self.attributes.get(key) if key else None
        return value if isinstance(value, str) else None

    @property
    def sub_id(self) -> Optional[str]:
        value = self.attributes.get("jobSubId")
        return value if isinstance(value, str) else None

    def text(self, stream: str = "stdout") -> str:
        """Output of one stream, one line per received line, newline-terminated."""
        return "".join(line.text + "\n" for line in self.output if line.stream == stream)

    def __repr__(self) -> str:
        extra = f" {self.name!r}" if self.name else ""
        state = f" {self.state}" if self.state else ""
        gone = " (removed)" if self.removed else ""
        where = f" of job {self.parent}" if self.kind == "process" else ""
        return f"<{self.kind} {self.id}{where}{extra}{state}{gone}>"


@attrs.define(eq=False)
class OpenCommand:
    """A command sent to the agent, with what came back for it so far."""

    tid: int
    command_id: Union[CommandId, int]
    args: Tuple[str, ...]
    #: non-completing events received under this TID (ATTR_DEF, MESSAGE, model events)
    events: List[Event] = attrs.Factory(list)
    #: the event that completed it (None while open, or if the completion was malformed)
    completion: Optional[Event] = None
    done: bool = False
    #: why it completed without a usable event (malformed reply, abandoned, session over)
    failure: Optional[str] = None
    #: START_EVENTS: a STOP_EVENTS or QUIT was sent after it (so OK is now due);
    #: STOP_EVENTS (native dialect): a START_EVENTS or QUIT was sent after it.
    released: bool = False
    #: START_EVENTS: the TID of the STOP_EVENTS that released it (default dialect)
    released_by: Optional[int] = None
    #: a later command reused this one's TID while it was open, so the agent
    #: sends nothing more for it
    abandoned: bool = False

    @property
    def name(self) -> str:
        if isinstance(self.command_id, CommandId):
            return self.command_id.name
        return f"command 0x{int(self.command_id):04X}"

    def attribute(self, key: str) -> Optional[str]:
        for arg in self.args:
            k, sep, v = arg.partition("=")
            if sep and k == key:
                return v
        return None

    @property
    def ok(self) -> bool:
        return self.done and isinstance(self.completion, (Ok, Shutdown))


@attrs.frozen(eq=False)
class Traffic:
    """One frame on the wire, in either direction, with what it meant."""

    direction: str  # "out" (client to agent) or "in"
    raw: bytes
    frame: Union[Frame, FrameError, None] = None
    #: the decoded Command (out) or Event (in), None if it could not be decoded
    message: Union[Command, Event, None] = None
    #: the open command an incoming event belongs to
    command: Optional[OpenCommand] = None
    completed: bool = False
    violations: Tuple[Violation, ...] = ()

    @property
    def fatal(self) -> bool:
        """The stream can no longer be decoded after this."""
        return isinstance(self.frame, FrameError) and self.frame.fatal


def _id_count(ids: Union[RangeSet, str]) -> int:
    return 1 if isinstance(ids, str) else len(ids)


def _ids(ids: Union[RangeSet, str]) -> Iterator[str]:
    if isinstance(ids, str):
        yield canonical_id(ids)
    else:
        for n in ids:
            yield str(n)


class ClientState:
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
        self._integer_keys: Set[str] = set(_STANDARD_INTEGERS)
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
            self.base_id = _base_id_of(args)
            self.dialect = _dialect_of(args)
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
                problems.append(Violation("bad-escape", f"{_event_name(item.msg_id)} (TID {tid}): {exc}", tid, raw))
        try:
            event = decode_event(item)
        except (ArgumentError, ValueError) as exc:
            name = _event_name(item.msg_id)
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
        if command is None or msg_id not in _COMPLETING_IDS:
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
        if eid in _MODEL_EVENTS:
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
        if eid in COMPLETING_EVENTS:
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
        cid = command.command_id
        if eid in _MODEL_EVENTS:
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
            return command, False
        if isinstance(event, Error) and self.reference and event.code == ErrorCode.TID_IN_USE:
            problems.append(
                Violation(
                    "tid-refused",
                    f"ERROR TID_IN_USE (TID {tid}): the PTP 4.0 client gives it to the oldest command on the TID "
                    f"({command.name}), fails every pending submission and puts its resource manager into ERROR; "
                    "a command on a TID still open must be carried out",
                    tid,
                )
            )
        if isinstance(event, Message):
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
            return command, False
        if isinstance(event, AttrDef):
            if cid != CommandId.MODEL_DEF:
                problems.append(Violation("attr-def-tid", f"ATTR_DEF under TID {tid} of {command.name}, not MODEL_DEF", tid))
            for definition in event.definitions:
                self.attr_defs[definition.id] = definition
                kind = _type_name(definition)
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
            return command, False
        if eid is EventId.OUTPUT:
            if cid != CommandId.GET_OUTPUT:
                problems.append(Violation("output-tid", f"OUTPUT under TID {tid} of {command.name}, not GET_OUTPUT", tid))
            command.events.append(event)
            return command, False
        if eid is EventId.FILTER_DEF:
            if cid not in (CommandId.MODEL_DEF, CommandId.LIST_FILTERS):
                problems.append(Violation("filter-def-tid", f"FILTER_DEF under TID {tid} of {command.name}", tid))
            if self.reference:
                problems.append(
                    Violation("unknown-event", f"FILTER_DEF (TID {tid}): event 250 is unknown to the PTP 4.0 client", tid)
                )
            self.filter_defs.append(event)
            command.events.append(event)
            return command, False
        if eid not in COMPLETING_EVENTS:  # pragma: no cover - every event id is covered above
            problems.append(Violation("unexpected-event", f"unexpected {name} (TID {tid})", tid))
            return command, False
        # completing events
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
        elif isinstance(event, SubmitJobError):
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
        self._close(command)
        command.completion = event
        return command, True

    def _initialized(self) -> None:
        self.initialized = True
        if self.base_id is not None and self.base_id not in self.elements:
            rm = Element(self.base_id, RM, None, {"id": self.base_id})
            self.elements[rm.id] = rm
            self.by_kind[RM][rm.id] = rm

    # ------------------------------------------------------------------ model

    def _apply(self, event: Event, problems: List[Violation]) -> None:
        self.model_events += 1
        name = event.event_id.name
        total = 0
        for ids in _event_id_sets(event):
            total += _id_count(ids)
        if total > MAX_IDS_PER_EVENT:
            problems.append(
                Violation("too-many-ids", f"{name} names {total} elements (more than {MAX_IDS_PER_EVENT}); not applied")
            )
            return
        if self.dialect.ascii_only:
            self._check_ids(event, problems)
        if isinstance(event, NewElements):
            if event.kind is ElementKind.PROCESS:
                self._new_processes(event, problems)
            else:
                self._new(event, problems)
        elif isinstance(event, ProcessChange):
            self._process_change(event, problems)
        elif isinstance(event, ElementChange):
            self._change(event, problems)
        elif isinstance(event, RemoveProcesses):
            self._remove_processes(event, problems)
        elif isinstance(event, RemoveElements):
            for eid in _ids(event.ids):
                element = self._expect(eid, event.kind.value, name, problems)
                if element is not None:
                    self._remove(element)
        elif isinstance(event, RemoveAll):
            for element in list(self.elements.values()):
                if element.kind != RM:
                    self._remove(element)

    def _check_ids(self, event: Event, problems: List[Violation]) -> None:
        """Default dialect: element ids are numbers the client can hold as a Java int."""
        name = event.event_id.name
        highest = self.dialect.max_element_id
        scoped = isinstance(event, (ProcessChange, RemoveProcesses)) or (
            isinstance(event, NewElements) and event.kind is ElementKind.PROCESS
        )
        # The id in front (parent, or the job of a process event) is an element id too.
        head = getattr(event, "parent_id", None) or getattr(event, "job_id", None)
        texts = [head] if head is not None else []
        for text in texts:
            if not is_decimal(text) or int(text) > highest:
                problems.append(Violation("element-id", f"{name} names element {text!r}: {_id_rule(highest)}"))
        for ids in _event_id_sets(event):
            if isinstance(ids, str):
                problems.append(Violation("element-id", f"{name} names element {ids!r}: {_id_rule(highest)}"))
            elif ids and ids.last > highest:
                what = "process rank" if scoped else "element id"
                problems.append(Violation("element-id", f"{name} names {what} {ids.last}: {_id_rule(highest)}"))

    def _expect(self, eid: Hashable, kind: str, event: str, problems: List[Violation]) -> Optional[Element]:
        element = self.elements.get(eid)
        if element is None:
            problems.append(Violation("unknown-element", f"{event} for unknown {kind} {eid}"))
            return None
        if element.kind != kind:
            problems.append(Violation("wrong-kind", f"{event} for {eid}, which is a {element.kind}, not a {kind}"))
            return None
        return element

    def _parent(self, event: NewElements, problems: List[Violation]) -> Tuple[str, Optional[Element]]:
        name = event.event_id.name
        kind = event.kind.value
        parent_id = canonical_id(event.parent_id)
        parent = self.elements.get(parent_id)
        wanted = _PARENT_KIND[event.kind]
        if parent is None:
            problems.append(Violation("unknown-parent", f"{name} with unknown parent {parent_id}"))
        elif parent.kind != wanted:
            what = "the resource manager" if wanted == RM else f"a {wanted}"
            problems.append(
                Violation("wrong-parent", f"{name} with parent {parent_id}, a {parent.kind}; a {kind}'s parent is {what}")
            )
            parent = None
        return parent_id, parent

    def _new(self, event: NewElements, problems: List[Violation]) -> None:
        name = event.event_id.name
        kind = event.kind.value
        parent_id, parent = self._parent(event, problems)
        for group in event.groups:
            values = self._values(group.attributes, name, problems)
            for eid in _ids(group.ids):
                existing = self.elements.get(eid)
                if existing is not None:
                    problems.append(Violation("duplicate-id", f"{name} for id {eid}, already a {existing.kind} in the model"))
                    if existing.kind != kind:
                        continue
                    self._set(existing, values)
                    continue
                element = Element(eid, kind, parent_id)
                self.elements[eid] = element
                self.by_kind[kind][eid] = element
                if parent is not None:
                    parent.children[eid] = None
                self._set(element, values)
                if self.reference and kind == "job" and element.sub_id in self.submitted:
                    self._check_launch(element, name, problems)

    def _new_processes(self, event: NewElements, problems: List[Violation]) -> None:
        job_id, job = self._parent(event, problems)
        if job is None:
            return
        for group in event.groups:
            values = self._values(group.attributes, "NEW_PROCESS", problems)
            self._check_ranks(job, group.ids, "NEW_PROCESS", problems)
            for rank in _ids(group.ids):
                key = (job_id, rank)
                existing = self.elements.get(key)
                if existing is not None:
                    problems.append(Violation("duplicate-id", f"NEW_PROCESS for rank {rank} of job {job_id}, already in the model"))
                    self._set(existing, values)
                    continue
                process = Element(rank, "process", job_id)
                self.elements[key] = process
                self.by_kind["process"][key] = process
                job.children[key] = None
                self._set(process, values)

    def _check_ranks(self, job: Element, ids: Union[RangeSet, str], event: str, problems: List[Violation]) -> None:
        """Reference mode: ranks are below the job's process count, as the PTP 4.0 client indexes them."""
        if not self.reference or isinstance(ids, str) or not ids:
            return
        count_text = job.get("jobNumProcs")
        if not isinstance(count_text, str) or not is_decimal(count_text):
            problems.append(
                Violation(
                    "process-rank",
                    f"{event} for job {job.id}, whose process count (jobNumProcs) the client was not told",
                )
            )
            return
        if ids.last >= int(count_text):
            problems.append(
                Violation(
                    "process-rank",
                    f"{event} names rank {ids.last} of job {job.id}, which has {count_text} processes "
                    f"(ranks 0..{int(count_text) - 1})",
                )
            )

    def _change(self, event: ElementChange, problems: List[Violation]) -> None:
        name = event.event_id.name
        kind = RM if event.kind is None else event.kind.value
        for group in event.groups:
            values = self._values(group.attributes, name, problems)
            state = values.get(STATE_KEYS.get(kind, ""))
            for eid in _ids(group.ids):
                element = self._expect(eid, kind, name, problems)
                if element is not None:
                    self._set(element, values)
                    if isinstance(state, str):
                        element.changed_states.append(state)
                        if self.reference and kind == "job" and element.sub_id in self.submitted:
                            self._check_launch(element, name, problems)

    def _check_launch(self, job: Element, event: str, problems: List[Violation]) -> None:
        """Reference mode, a job this client submitted: the PTP 4.0 client finishes its launch
        only on a JOB_CHANGE saying RUNNING, so its NEW_JOB must say STARTING, and a job that
        ran must have had that JOB_CHANGE by the time its end arrives."""
        state = job.state
        status = job.get("jobStatus")
        if event == "NEW_JOB":
            if state != "STARTING":
                problems.append(
                    Violation(
                        "launch-state",
                        f"NEW_JOB for job {job.id} (jobSubId {job.sub_id}), submitted by this client, says "
                        f"jobState={state}: it must say STARTING, then a JOB_CHANGE must say RUNNING "
                        "(the PTP 4.0 client's launch waits for that JOB_CHANGE)",
                    )
                )
            return
        if state == "COMPLETED" and status in RAN_STATUSES and "RUNNING" not in job.changed_states:
            problems.append(
                Violation(
                    "launch-hangs",
                    f"job {job.id} (jobSubId {job.sub_id}), submitted by this client, ended ({status}) "
                    "without a JOB_CHANGE saying RUNNING: the PTP 4.0 client's launch of it would wait until "
                    "cancelled",
                )
            )

    def _process_change(self, event: ProcessChange, problems: List[Violation]) -> None:
        job = self._expect(canonical_id(event.job_id), "job", "PROCESS_CHANGE", problems)
        if job is None:
            return
        for group in event.groups:
            output = [(OUTPUT_KEYS[k], v) for k, v in group.attributes if k in OUTPUT_KEYS]
            if self.dialect.ascii_only and len({stream for stream, _ in output}) != len(output):
                problems.append(
                    Violation(
                        "array-value",
                        f"PROCESS_CHANGE for job {job.id} repeats an output attribute in one group: the default "
                        "dialect joins a process's lines into one value",
                    )
                )
            values = self._values([(k, v) for k, v in group.attributes if k not in OUTPUT_KEYS], "PROCESS_CHANGE", problems)
            self._check_ranks(job, group.ids, "PROCESS_CHANGE", problems)
            for rank in _ids(group.ids):
                key = (job.id, rank)
                process = self._expect(key, "process", "PROCESS_CHANGE", problems)
                if process is None:
                    continue
                self._set(process, values)
                for stream, value in output:
                    for text in value.split("\n"):
                        line = OutputLine(key, stream, text)
                        process.output.append(line)
                        job.output.append(line)

    def _remove_processes(self, event: RemoveProcesses, problems: List[Violation]) -> None:
        job = self._expect(canonical_id(event.job_id), "job", "REMOVE_PROCESS", problems)
        if job is None:
            return
        self._check_ranks(job, event.ids, "REMOVE_PROCESS", problems)
        for rank in _ids(event.ids):
            process = self._expect((job.id, rank), "process", "REMOVE_PROCESS", problems)
            if process is not None:
                self._remove(process)

    def _remove(self, element: Element) -> None:
        key = element.key
        for child in list(element.children):
            node = self.elements.get(child)
            if node is not None and node.parent == element.id:
                self._remove(node)
        self.elements.pop(key, None)
        self.by_kind[element.kind].pop(key, None)
        parent = self.elements.get(element.parent) if element.parent is not None else None
        if parent is not None:
            parent.children.pop(key, None)
        sub = element.sub_id
        if sub is not None and self.jobs_by_sub.get(sub) is element:
            del self.jobs_by_sub[sub]
        element.removed = True

    def _values(
        self, pairs: Iterable[Tuple[str, str]], event: str = "", problems: Optional[List[Violation]] = None
    ) -> Dict[str, Union[str, List[str]]]:
        grouped: Dict[str, List[str]] = {}
        for key, value in pairs:
            grouped.setdefault(key, []).append(value)
        if problems is not None and (self.dialect.ascii_only or self.reference):
            self._check_values(grouped, event, problems)
        return {
            key: (values if len(values) > 1 or key in self._array_keys else values[0])
            for key, values in grouped.items()
        }

    def _check_values(self, grouped: Dict[str, List[str]], event: str, problems: List[Violation]) -> None:
        """Default dialect (and reference mode): the values of one group of a NEW or CHANGE event."""
        dialect = self.dialect
        for key, values in grouped.items():
            if len(values) > 1 or key in CLIENT_ARRAY_ATTRIBUTES or _type_name(self.attr_defs.get(key)) == "ARRAY":
                problems.append(
                    Violation(
                        "array-value",
                        f"{event} carries {key!r} ({len(values)} value{'s' if len(values) > 1 else ''}): the default "
                        "dialect sends no multi-valued attribute in element events (the PTP 4.0 client's merge "
                        "of array values stops its event thread)",
                    )
                )
            if key in self._integer_keys:
                for value in values:
                    if dialect.integer_text(value) != value:
                        problems.append(
                            Violation(
                                "integer-range",
                                f"{event} carries {key}={value!r}: INTEGER values are plain decimal within a Java int "
                                f"({dialect.integer_bounds[0]}..{dialect.integer_bounds[1]})",  # type: ignore[index]
                            )
                        )
            if self.reference:
                definition = self.attr_defs.get(key)
                legal = getattr(definition, "values", ())
                if legal and _type_name(definition) == "ENUMERATED":
                    for value in values:
                        if value not in legal:
                            problems.append(
                                Violation(
                                    "enum-value",
                                    f"{event} carries {key}={value!r}, not one of the declared values "
                                    f"({', '.join(legal)}): the PTP 4.0 client drops it",
                                )
                            )

    def _set(self, element: Element, values: Dict[str, Union[str, List[str]]]) -> None:
        element.attributes.update((k, list(v) if isinstance(v, list) else v) for k, v in values.items())
        key = STATE_KEYS.get(element.kind)
        if key is not None:
            state = values.get(key)
            if isinstance(state, str) and (not element.states or element.states[-1] != state):
                element.states.append(state)
        sub = values.get("jobSubId")
        if element.kind == "job" and isinstance(sub, str):
            self.jobs_by_sub[sub] = element


def _id_rule(highest: int) -> str:
    return f"the default dialect's element ids are decimal numbers up to {highest} (a Java int)"


def _event_id_sets(event: Event) -> Iterator[Union[RangeSet, str]]:
    groups = getattr(event, "groups", None)
    if groups is not None:
        for group in groups:
            yield group.ids
    ids = getattr(event, "ids", None)
    if ids is not None:
        yield ids


def _event_name(msg_id: int) -> str:
    try:
        return EventId(msg_id).name
    except ValueError:
        return f"event {msg_id}"


def _type_name(definition) -> str:
    value = getattr(definition, "type", None)
    value = getattr(value, "value", value)
    return str(value).upper() if value is not None else ""


def _base_id_of(args: Sequence[str]) -> Optional[str]:
    bare = [a for a in args if "=" not in a]
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key == "baseId":
            return canonical_id(value)
    if len(bare) >= 2:
        return canonical_id(bare[1])
    return None


def _dialect_of(args: Sequence[str]) -> Dialect:
    """The dialect an INIT asks for, decided as the agent decides it."""
    try:
        return dialect_named(parse_init(args).dialect)
    except (ArgumentError, DialectError, ValueError):
        # The agent refuses such an INIT, and answers it in the default dialect.
        return DEFAULT
