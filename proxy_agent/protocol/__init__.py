"""The proxy protocol as plain Python: no I/O, no clock, no concurrency.

* :mod:`.wire` -- frames <-> bytes (incremental decoder, encoder)
* :mod:`.messages` -- typed commands and events
* :mod:`.rangeset` -- range-set notation for element ids
* :mod:`.attributes` -- attribute definitions and values
* :mod:`.ids` -- element-id allocation from the base id
* :mod:`.session` -- phases and transaction ids on the agent's side
* :mod:`.dialect` -- every rule that differs between the default and native dialects
"""

from .wire import DEFAULT_MAX_FRAME_SIZE, Decoder, ErrorKind, Frame, FrameError, encode_frame
from .messages import (
    ArgumentError,
    AttrDef,
    Command,
    CommandId,
    ElementChange,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    Event,
    EventId,
    FilterDef,
    InitRequest,
    Message,
    MessageLevel,
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
    encode_event,
    parse_init,
)
from .dialect import DEFAULT, NATIVE, Dialect, DialectError, EscapeError, ValueRule, dialect_named
from .session import Abandoned, AgentSession, Phase, ProtocolViolation, Received, Transaction

__all__ = [name for name in dir() if not name.startswith("_")]
