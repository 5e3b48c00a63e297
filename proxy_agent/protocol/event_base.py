"""What every message module of the protocol shares: the command and event ids, the error
codes and message levels, the element kinds with their events, the :class:`Event` base, and
the checks that read an event's arguments.

:mod:`.messages` gives all of it under its own names, beside the commands and the events an
agent answers with; the model's events (:mod:`.element_events`) and the notices
(:mod:`.notices`) are built on it without loading :mod:`.messages`, which loads them only
when they are first needed.
"""

from __future__ import annotations

import enum
from typing import Sequence

from .attributes import split_attribute
from .ids import MAX_DECIMAL_DIGITS, is_decimal
from .wire import encode_frame

__all__ = [
    "COMPLETING_EVENTS",
    "KIND_BY_EVENT",
    "ArgumentError",
    "CommandId",
    "ElementKind",
    "ErrorCode",
    "Event",
    "EventId",
    "MessageLevel",
    "as_tuple",
    "count_arg",
    "expect_attrs",
    "int_value",
]


def as_tuple(values):  # unannotated: the field's own type stays the one __init__ shows
    """Field converter: a tuple of the values.  (A function of ours rather than ``tuple``:
    attrs reads a converter's signature, and the first built-in's costs start-up milliseconds.)"""
    return tuple(values)


class ArgumentError(ValueError):
    """A command's or event's arguments do not have the documented layout."""


class CommandId(enum.IntEnum):
    QUIT = 0x0
    INIT = 0x1
    MODEL_DEF = 0x2
    START_EVENTS = 0x3
    STOP_EVENTS = 0x4
    SUBMIT_JOB = 0x5
    TERMINATE_JOB = 0x6
    MOVE_JOB = 0x7
    CHANGE_JOB = 0x8
    LIST_FILTERS = 0x9
    SET_FILTERS = 0xA
    #: This agent's own: a job's kept output (answered by OUTPUT events, then OK).  Clear of
    #: 7..13, which the PTP 4.0 client numbers otherwise (it never sends them).
    GET_OUTPUT = 0x10


class EventId(enum.IntEnum):
    OK = 0
    MESSAGE = 1
    ERROR = 5
    SHUTDOWN = 6
    SUBMITJOB_ERROR = 211
    TERMINATEJOB_ERROR = 212
    NEW_JOB = 220
    NEW_MACHINE = 221
    NEW_NODE = 222
    NEW_PROCESS = 223
    NEW_QUEUE = 224
    JOB_CHANGE = 230
    MACHINE_CHANGE = 231
    NODE_CHANGE = 232
    PROCESS_CHANGE = 233
    QUEUE_CHANGE = 234
    RM_CHANGE = 235
    REMOVE_ALL = 240
    REMOVE_JOB = 241
    REMOVE_MACHINE = 242
    REMOVE_NODE = 243
    REMOVE_PROCESS = 244
    REMOVE_QUEUE = 245
    #: Not numbered by the reference client; chosen from the unused range.
    FILTER_DEF = 250
    ATTR_DEF = 251
    #: This agent's own, answering GET_OUTPUT (clear of 252 and 253, which the PTP 4.0 client uses).
    OUTPUT = 260


#: Events that complete the command whose TID they carry.
COMPLETING_EVENTS = frozenset(
    {EventId.OK, EventId.ERROR, EventId.SHUTDOWN, EventId.SUBMITJOB_ERROR, EventId.TERMINATEJOB_ERROR}
)


class ErrorCode(enum.IntEnum):
    """Values of ``errorCode=`` / ``messageCode=`` sent by this agent."""

    MALFORMED_FRAME = 1
    UNKNOWN_COMMAND = 2
    ILLEGAL_IN_PHASE = 3
    BAD_ARGUMENTS = 4
    TID_IN_USE = 5
    UNSUPPORTED_VERSION = 6
    AUTHENTICATION = 7
    BUSY = 8
    SUBMIT_FAILED = 9
    NO_SUCH_JOB = 10
    NOT_SUPPORTED = 11
    SCHEDULER = 12
    INTERNAL = 13
    SHUTTING_DOWN = 14
    NO_SUCH_QUEUE = 15
    OPERATION_FAILED = 16


class MessageLevel(str, enum.Enum):
    FATAL = "FATAL"
    ERROR = "ERROR"
    WARNING = "WARNING"
    INFO = "INFO"
    DEBUG = "DEBUG"


class ElementKind(enum.Enum):
    """Model element kinds, with the events that create, change and remove them."""

    MACHINE = "machine"
    NODE = "node"
    QUEUE = "queue"
    JOB = "job"
    PROCESS = "process"

    @property
    def new_event(self) -> EventId:
        return _NEW_EVENTS[self]

    @property
    def change_event(self) -> EventId:
        return _CHANGE_EVENTS[self]

    @property
    def remove_event(self) -> EventId:
        return _REMOVE_EVENTS[self]


_NEW_EVENTS = {
    ElementKind.JOB: EventId.NEW_JOB,
    ElementKind.MACHINE: EventId.NEW_MACHINE,
    ElementKind.NODE: EventId.NEW_NODE,
    ElementKind.PROCESS: EventId.NEW_PROCESS,
    ElementKind.QUEUE: EventId.NEW_QUEUE,
}
_CHANGE_EVENTS = {
    ElementKind.JOB: EventId.JOB_CHANGE,
    ElementKind.MACHINE: EventId.MACHINE_CHANGE,
    ElementKind.NODE: EventId.NODE_CHANGE,
    ElementKind.PROCESS: EventId.PROCESS_CHANGE,
    ElementKind.QUEUE: EventId.QUEUE_CHANGE,
}
_REMOVE_EVENTS = {
    ElementKind.JOB: EventId.REMOVE_JOB,
    ElementKind.MACHINE: EventId.REMOVE_MACHINE,
    ElementKind.NODE: EventId.REMOVE_NODE,
    ElementKind.PROCESS: EventId.REMOVE_PROCESS,
    ElementKind.QUEUE: EventId.REMOVE_QUEUE,
}
KIND_BY_EVENT = {}
for _table in (_NEW_EVENTS, _CHANGE_EVENTS, _REMOVE_EVENTS):
    for _kind, _eid in _table.items():
        KIND_BY_EVENT[_eid] = _kind



# --------------------------------------------------------------------------- events


def count_arg(args: Sequence[str], pos: int, what: str) -> int:
    if pos >= len(args):
        raise ArgumentError(f"missing {what}")
    text = args[pos]
    if not (text.isascii() and text.isdigit()):
        raise ArgumentError(f"{what} must be a decimal number, got {text!r}")
    return int(text)


def expect_attrs(args: Sequence[str], keys: Sequence[str], event: str) -> list:
    count = count_arg(args, 0, f"{event} argument count")
    if count != len(keys) or len(args) != count + 1:
        raise ArgumentError(f"{event} takes {len(keys)} attributes, got {len(args) - 1} (declared {count})")
    values = []
    for key, arg in zip(keys, args[1:]):
        try:
            k, v = split_attribute(arg)
        except ValueError:
            raise ArgumentError(f"{event}: expected {key}=..., got {arg!r}") from None
        if k != key:
            raise ArgumentError(f"{event}: expected {key}=..., got {arg!r}")
        values.append(v)
    return values


def int_value(text: str, what: str) -> int:
    digits = text[1:] if text[:1] == "-" else text
    if not is_decimal(digits) or len(digits) > MAX_DECIMAL_DIGITS:
        raise ArgumentError(f"{what} must be an integer (ASCII digits, optional '-'), got {text!r}")
    return int(text)


class Event:
    """Base of all typed events: ``tid`` plus an argument layout."""

    __slots__ = ()
    event_id: EventId
    tid: int

    def to_args(self) -> list:
        raise NotImplementedError

    @classmethod
    def from_args(cls, tid: int, args: Sequence[str], event_id: EventId) -> "Event":
        raise NotImplementedError

    def encode(self) -> bytes:
        return encode_frame(int(self.event_id), self.tid, self.to_args())

    @property
    def completes(self) -> bool:
        return self.event_id in COMPLETING_EVENTS
