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
    ElementKind,
    Error,
    ErrorCode,
    Event,
    EventId,
    InitRequest,
    MessageLevel,
    Ok,
    decode_event,
    encode_event,
    parse_init,
)
from .dialect import DEFAULT, NATIVE, Dialect, DialectError, EscapeError, ValueRule, dialect_named
from .session import Abandoned, AgentSession, Phase, ProtocolViolation, Received, Transaction

from .messages import LATER_NAMES


def __getattr__(name: str):
    if name in LATER_NAMES:  # loaded when first asked for (see .messages)
        from . import messages

        return getattr(messages, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted({name for name in dir() if not name.startswith("_")} - {"LATER_NAMES"} | set(LATER_NAMES))
