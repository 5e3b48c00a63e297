"""A client for the proxy protocol: used by the test console and by the tests.

* :class:`AgentClient` -- a trio session with an agent (spawned, TCP, Unix
  socket, connect-back, or any stream), with commands, waits, a mirrored
  model and a protocol checker;
* :class:`ClientState` -- the same bookkeeping without I/O, for feeding
  bytes by hand.
"""

from .connection import AgentClient, connect_tcp, connect_unix, from_stream, spawn
from .kept import KeptOutput, KeptStream, job_attributes
from .listener import AgentListener, listen_for_agent
from .process import AgentProcess, default_agent_argv
from .errors import (
    AgentExited,
    ClientError,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
    UnknownElementError,
    WaitFailed,
    WaitTimeout,
)
from .state import ClientState, Element, OpenCommand, OutputLine, Traffic, Violation, canonical_id

__all__ = [
    "AgentClient",
    "AgentExited",
    "AgentListener",
    "AgentProcess",
    "ClientError",
    "ClientState",
    "CommandFailed",
    "ConnectError",
    "ConnectionClosed",
    "Element",
    "KeptOutput",
    "KeptStream",
    "OpenCommand",
    "OutputLine",
    "ProtocolViolationError",
    "TokenRefused",
    "Traffic",
    "UnknownElementError",
    "Violation",
    "WaitFailed",
    "WaitTimeout",
    "canonical_id",
    "connect_tcp",
    "connect_unix",
    "default_agent_argv",
    "from_stream",
    "job_attributes",
    "listen_for_agent",
    "spawn",
]
