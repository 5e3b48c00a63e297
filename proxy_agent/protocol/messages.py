"""Commands and events of the proxy protocol as typed values.

Commands travel from the client (the IDE's resource manager, or the test
console) to the agent; events travel back.  Both share the frame layout of
:mod:`proxy_agent.protocol.wire`.  This module turns frames into typed values
and back, following the argument layouts in ``spec/protocol.md``.

:meth:`Event.encode` writes the text as it is (UTF-8): that is the native
dialect.  An agent encodes through its session's dialect
(:meth:`proxy_agent.protocol.dialect.Dialect.encode`), which escapes text for
the default dialect; a client unescapes arguments before decoding them here.

Element ids in events are decimal range sets (or, in the native dialect only,
single string ids).  Process events are the exception: the ids of
NEW_PROCESS, PROCESS_CHANGE and REMOVE_PROCESS are the *ranks* of the
processes within their job (0 .. n-1), scoped by the job id the event
carries (the parent of NEW_PROCESS, the first argument of the other two).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import attrs

from .attributes import AttributeDefinition, decode_attr_defs, encode_attr_defs, split_attribute
from .ids import MAX_DECIMAL_DIGITS, is_decimal
from .event_base import (COMPLETING_EVENTS, ArgumentError, CommandId, ElementKind, ErrorCode, Event, EventId,
                         MessageLevel, as_tuple, expect_attrs, int_value)
from .wire import Frame, encode_frame

__all__ = [
    "ArgumentError",
    "AttrDef",
    "Command",
    "CommandId",
    "ElementChange",
    "ElementGroup",
    "ElementKind",
    "Error",
    "ErrorCode",
    "Event",
    "EventId",
    "FilterDef",
    "InitRequest",
    "Message",
    "MessageLevel",
    "NewElements",
    "Ok",
    "OutputEvent",
    "ProcessChange",
    "RemoveAll",
    "RemoveElements",
    "RemoveProcesses",
    "Shutdown",
    "SubmitJobError",
    "TerminateJobError",
    "COMPLETING_EVENTS",
    "SUPPORTED_VERSIONS",
    "decode_event",
    "encode_event",
    "parse_init",
]

#: Protocol versions this agent speaks.
SUPPORTED_VERSIONS = ("2.0",)


# --------------------------------------------------------------------------- commands


@attrs.frozen(slots=True)
class Command:
    """A command as received.  ``command_id`` is an int when the id is unknown."""

    command_id: Union[CommandId, int]
    tid: int
    args: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if isinstance(self.command_id, CommandId):
            return self.command_id.name
        return f"command 0x{self.command_id:04X}"

    @property
    def known(self) -> bool:
        return isinstance(self.command_id, CommandId)

    @classmethod
    def from_frame(cls, frame: Frame) -> "Command":
        try:
            cid: Union[CommandId, int] = CommandId(frame.msg_id)
        except ValueError:
            cid = frame.msg_id
        return cls(cid, frame.tid, frame.args)

    def encode(self) -> bytes:
        return encode_frame(int(self.command_id), self.tid, self.args)


@attrs.frozen(slots=True)
class InitRequest:
    version: str
    base_id: int
    #: Any further ``key=value`` arguments (``dialect=...``, ``token=...``, and
    #: whatever else a client sends, such as the PTP client's ``slurmdPath=``).
    attributes: Tuple[Tuple[str, str], ...] = ()

    def get(self, key: str) -> Optional[str]:
        for k, v in self.attributes:
            if k == key:
                return v
        return None

    @property
    def dialect(self) -> Optional[str]:
        """The dialect asked for (None: the default dialect)."""
        return self.get("dialect")


# INIT keys that may appear once only.
_INIT_SINGLE_KEYS = ("version", "baseId", "dialect")


def parse_init(args: Sequence[str]) -> InitRequest:
    """Parse INIT arguments in either accepted form.

    ``version=2.0 baseId=100 [key=value...]`` (reference client) or
    ``2.0 100 [key=value...]`` (the design's bare form).  Further attributes are
    kept whatever their key.  Raises :class:`ArgumentError` for a missing or
    non-numeric base id (ASCII digits only, at most 20) or a repeated
    ``version``/``baseId``/``dialect``; the version and the dialect are
    returned as given (the session decides whether they are spoken).
    """
    version: Optional[str] = None
    base: Optional[str] = None
    extra = []
    bare = [a for a in args if "=" not in a]
    keyed = [a for a in args if "=" in a]
    if bare:
        if len(bare) > 2:
            raise ArgumentError(f"INIT takes a version and a base id, got {len(bare)} bare arguments")
        version = bare[0]
        if len(bare) == 2:
            base = bare[1]
    for arg in keyed:
        try:
            key, value = split_attribute(arg)
        except ValueError as exc:
            raise ArgumentError(f"INIT: {exc}") from None
        if key == "version" and version is None:
            version = value
        elif key == "baseId" and base is None:
            base = value
        elif key in _INIT_SINGLE_KEYS:
            if key != "dialect" or any(k == key for k, _ in extra):
                raise ArgumentError(f"INIT argument {key!r} given twice")
            extra.append((key, value))
        else:
            extra.append((key, value))
    if version is None:
        raise ArgumentError("INIT is missing the protocol version (version=2.0)")
    if base is None:
        raise ArgumentError("INIT is missing the base id (baseId=N)")
    if not is_decimal(base):
        shown = base if len(base) <= 40 else base[:40] + "..."
        raise ArgumentError(f"INIT base id must be a non-negative decimal integer, got {shown!r}")
    if len(base) > MAX_DECIMAL_DIGITS:
        raise ArgumentError(f"INIT base id has {len(base)} digits; at most {MAX_DECIMAL_DIGITS} are accepted")
    return InitRequest(version, int(base), tuple(extra))


# --------------------------------------------------------------------------- events


@attrs.frozen(slots=True)
class Ok(Event):
    tid: int
    event_id = EventId.OK

    def to_args(self) -> list:
        return []

    @classmethod
    def from_args(cls, tid, args, event_id):
        if args:
            raise ArgumentError(f"OK takes no arguments, got {len(args)}")
        return cls(tid)


@attrs.frozen(slots=True)
class Error(Event):
    tid: int
    code: int
    message: str
    event_id = EventId.ERROR

    def to_args(self) -> list:
        return ["2", f"errorCode={int(self.code)}", f"errorMsg={self.message}"]

    @classmethod
    def from_args(cls, tid, args, event_id):
        code, msg = expect_attrs(args, ("errorCode", "errorMsg"), "ERROR")
        return cls(tid, int_value(code, "errorCode"), msg)


@attrs.frozen(slots=True)
class AttrDef(Event):
    tid: int
    definitions: Tuple[AttributeDefinition, ...] = attrs.field(converter=as_tuple)
    event_id = EventId.ATTR_DEF

    def to_args(self) -> list:
        return list(encode_attr_defs(self.definitions))

    @classmethod
    def from_args(cls, tid, args, event_id):
        try:
            return cls(tid, decode_attr_defs(args))
        except ValueError as exc:
            raise ArgumentError(f"ATTR_DEF: {exc}") from None


@attrs.frozen(slots=True)
class OutputEvent(Event):
    """Lines a job's process wrote, as the agent keeps them (an answer to GET_OUTPUT):
    ``lines`` (joined by newlines) from the line numbered ``first`` (0: the first the
    process wrote to ``stream``), and how many of its later lines were not kept."""

    tid: int
    job_id: str
    rank: int
    stream: str
    first: int
    dropped: int
    lines: str
    event_id = EventId.OUTPUT

    _KEYS = ("jobId", "rank", "stream", "first", "dropped", "lines")

    def to_args(self) -> list:
        return ["6", f"jobId={self.job_id}", f"rank={self.rank}", f"stream={self.stream}", f"first={self.first}",
                f"dropped={self.dropped}", f"lines={self.lines}"]

    @classmethod
    def from_args(cls, tid, args, event_id):
        job_id, rank, stream, first, dropped, lines = expect_attrs(args, cls._KEYS, "OUTPUT")
        if stream not in ("stdout", "stderr"):
            raise ArgumentError(f"OUTPUT: stream must be stdout or stderr, got {stream!r}")
        numbers = [int_value(text, name) for text, name in ((rank, "rank"), (first, "first"), (dropped, "dropped"))]
        if min(numbers) < 0:
            raise ArgumentError("OUTPUT: rank, first and dropped must not be negative")
        return cls(tid, job_id, numbers[0], stream, numbers[1], numbers[2], lines)

    @property
    def texts(self) -> list:
        """The lines it carries (none for an empty value)."""
        return self.lines.split("\n") if self.lines else []


#: The events of the model's elements (and FILTER_DEF), which an agent only writes through
#: its view: their classes are in :mod:`.element_events`.
ELEMENT_EVENT_NAMES = ("ElementChange", "ElementGroup", "FilterDef", "NewElements", "ProcessChange", "RemoveAll",
                       "RemoveElements", "RemoveProcesses")
#: The events an agent sends only when something goes wrong or ends: in :mod:`.notices`.
NOTICE_NAMES = ("Message", "Shutdown", "SubmitJobError", "TerminateJobError")
#: Names of this module whose classes are in another, loaded the first time one is asked for
#: (an agent answers INIT without them).
LATER_NAMES = ELEMENT_EVENT_NAMES + NOTICE_NAMES


def __getattr__(name: str):
    if name in ELEMENT_EVENT_NAMES:
        from . import element_events as module
    elif name in NOTICE_NAMES:
        from . import notices as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


_EVENT_CLASSES: dict = {}


def _event_classes() -> dict:
    """Every event's class by its id."""
    if not _EVENT_CLASSES:
        from .element_events import (ElementChange, FilterDef, NewElements, ProcessChange, RemoveAll, RemoveElements,
                                     RemoveProcesses)
        from .notices import Message, Shutdown, SubmitJobError, TerminateJobError

        classes = {
            EventId.OK: Ok,
            EventId.MESSAGE: Message,
            EventId.ERROR: Error,
            EventId.SHUTDOWN: Shutdown,
            EventId.SUBMITJOB_ERROR: SubmitJobError,
            EventId.TERMINATEJOB_ERROR: TerminateJobError,
            EventId.ATTR_DEF: AttrDef,
            EventId.OUTPUT: OutputEvent,
            EventId.FILTER_DEF: FilterDef,
            EventId.REMOVE_ALL: RemoveAll,
            EventId.PROCESS_CHANGE: ProcessChange,
            EventId.REMOVE_PROCESS: RemoveProcesses,
            EventId.RM_CHANGE: ElementChange,
        }
        for kind in ElementKind:
            classes[kind.new_event] = NewElements
            if kind is not ElementKind.PROCESS:
                classes[kind.change_event] = ElementChange
                classes[kind.remove_event] = RemoveElements
        _EVENT_CLASSES.update(classes)
    return _EVENT_CLASSES


def decode_event(frame: Frame) -> Event:
    """Interpret a frame as an event; :class:`ArgumentError` if it is not one."""
    try:
        event_id = EventId(frame.msg_id)
    except ValueError:
        raise ArgumentError(f"unknown event id {frame.msg_id} (0x{frame.msg_id:04X})") from None
    return _event_classes()[event_id].from_args(frame.tid, frame.args, event_id)


def encode_event(event: Event) -> bytes:
    return event.encode()
