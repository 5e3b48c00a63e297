"""What the client's state is made of: the elements of the mirrored model, the commands
open, the traffic records and the violations found, and the protocol's constants the client
keeps to."""

from __future__ import annotations

from typing import Dict, Hashable, Iterator, List, Optional, Sequence, Tuple, Union

import attrs

from ..protocol.attributes import STANDARD_ATTRIBUTES, AttrType
from ..protocol.dialect import DEFAULT, Dialect, DialectError, dialect_named
from ..protocol.ids import is_decimal
from ..protocol.messages import (
    COMPLETING_EVENTS, ArgumentError, Command, CommandId, ElementKind, Event, EventId, Ok, Shutdown, parse_init,
)
from ..protocol.rangeset import RangeSet
from ..protocol.wire import Frame, FrameError

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

PARENT_KIND = {
    ElementKind.MACHINE: RM,
    ElementKind.QUEUE: RM,
    ElementKind.NODE: "machine",
    ElementKind.JOB: "queue",
    ElementKind.PROCESS: "job",
}
MODEL_EVENTS = frozenset(e for e in EventId if EventId.NEW_JOB <= e <= EventId.REMOVE_QUEUE)
COMPLETING_IDS = frozenset(int(e) for e in COMPLETING_EVENTS)
# INTEGER attributes the PTP 4.0 client knows without being told (its own definitions).
STANDARD_INTEGERS = frozenset(d.id for d in STANDARD_ATTRIBUTES if d.type is AttrType.INTEGER)


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


def id_count(ids: Union[RangeSet, str]) -> int:
    return 1 if isinstance(ids, str) else len(ids)


def ids_of(ids: Union[RangeSet, str]) -> Iterator[str]:
    if isinstance(ids, str):
        yield canonical_id(ids)
    else:
        for n in ids:
            yield str(n)


def id_rule(highest: int) -> str:
    return f"the default dialect's element ids are decimal numbers up to {highest} (a Java int)"


def event_id_sets(event: Event) -> Iterator[Union[RangeSet, str]]:
    groups = getattr(event, "groups", None)
    if groups is not None:
        for group in groups:
            yield group.ids
    ids = getattr(event, "ids", None)
    if ids is not None:
        yield ids


def event_name(msg_id: int) -> str:
    try:
        return EventId(msg_id).name
    except ValueError:
        return f"event {msg_id}"


def type_name(definition) -> str:
    value = getattr(definition, "type", None)
    value = getattr(value, "value", value)
    return str(value).upper() if value is not None else ""


def base_id_of(args: Sequence[str]) -> Optional[str]:
    bare = [a for a in args if "=" not in a]
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key == "baseId":
            return canonical_id(value)
    if len(bare) >= 2:
        return canonical_id(bare[1])
    return None


def dialect_of(args: Sequence[str]) -> Dialect:
    """The dialect an INIT asks for, decided as the agent decides it."""
    try:
        return dialect_named(parse_init(args).dialect)
    except (ArgumentError, DialectError, ValueError):
        # The agent refuses such an INIT, and answers it in the default dialect.
        return DEFAULT

