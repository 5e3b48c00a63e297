"""What can go wrong talking to an agent, as exceptions a caller can act on."""

from __future__ import annotations

from typing import Optional

import trio

__all__ = [
    "AgentExited",
    "ClientError",
    "CommandFailed",
    "ConnectError",
    "ConnectionClosed",
    "ProtocolViolationError",
    "TokenRefused",
    "UnknownElementError",
    "WaitFailed",
    "WaitTimeout",
]


class ClientError(Exception):
    """Base of every error the client raises on purpose; ``str()`` is one readable line."""


class ConnectError(ClientError):
    """The agent could not be started or reached."""


class ConnectionClosed(ClientError):
    """The session is over: the agent shut down, closed the connection, or the client closed it."""


class AgentExited(ConnectionClosed):
    """The spawned agent exited without being asked to (or while something was still awaited)."""

    def __init__(self, message: str, returncode: Optional[int] = None, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class CommandFailed(ClientError):
    """The agent answered a command with ERROR, SUBMITJOB_ERROR or TERMINATEJOB_ERROR.

    ``code`` and ``message`` come from the event (``code`` is None when the
    reply could not be decoded); ``event`` is the event itself.
    """

    def __init__(self, command: str, code: Optional[int], message: str, event=None) -> None:
        super().__init__(f"{command} failed: {message}" + (f" (error {code})" if code is not None else ""))
        self.command = command
        self.code = code
        self.message = message
        self.event = event


class TokenRefused(CommandFailed):
    """INIT was refused because the token was missing or wrong."""


class ProtocolViolationError(ClientError):
    """The agent broke a rule of the protocol; ``violation`` says which and how."""

    def __init__(self, violation) -> None:
        super().__init__(f"protocol violation by the agent: {violation}")
        self.violation = violation


class WaitFailed(ClientError):
    """What was awaited can no longer happen (e.g. the job completed without reaching that state)."""


class WaitTimeout(ClientError, trio.TooSlowError, TimeoutError):
    """A wait or a command's reply did not come in time.  Also a :class:`TimeoutError` (as
    plain Python and asyncio code catch timeouts) and a :class:`trio.TooSlowError`."""


class UnknownElementError(ClientError, LookupError):
    """No element (job, queue...) matches the given id or name in the mirrored model."""
