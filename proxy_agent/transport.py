"""Byte streams the protocol runs over: stdio, TCP (connect-back or listen), Unix sockets.

Everything here deals in :class:`trio.abc.Stream`; nothing here knows the
protocol.
"""

from __future__ import annotations

import logging
import os
import socket as _socket
from typing import List

import trio

from .endpoints import bind_unix_listener, load_or_create_token, parse_host_port, widen_pipe

log = logging.getLogger("proxy_agent.transport")

__all__ = [
    "SplitStream",
    "StdioStream",
    "open_stdio",
    "connect_tcp",
    "open_tcp_listeners",
    "open_unix_listener",
    "parse_host_port",
    "load_or_create_token",
    "os_error_reason",
    "write_now",
]


def os_error_reason(exc: OSError) -> str:
    """The most specific reason in an OSError chain: trio's "all attempts to connect to H:P
    failed" hides each address's own error (Connection refused, No route to host) in its cause."""
    seen: BaseException = exc
    for _ in range(5):
        inner = getattr(seen.__cause__, "exceptions", None)  # a group of per-address attempts
        if inner:
            seen = inner[-1]
        elif isinstance(seen.__cause__, OSError):
            seen = seen.__cause__
        else:
            break
    if isinstance(seen, OSError) and isinstance(seen.errno, int) and seen.errno > 0:
        return os.strerror(seen.errno)  # trio's strerror also repeats the address (gaierror's are negative)
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror
    return str(seen)


class SplitStream(trio.abc.HalfCloseableStream):
    """A client's bytes in from one stream and out to a descriptor (a pipe, a socket, a
    terminal) written directly: the agent's own stdin and stdout, or a launch's client whose
    output the launch handed to the service while it passes the client's input on."""

    def __init__(self, receive: trio.abc.ReceiveStream, out_fd: int) -> None:
        self._in = receive
        self._out = trio.lowlevel.FdStream(out_fd)

    async def send_all(self, data) -> None:
        await self._out.send_all(data)

    def send_now(self, data) -> int:
        """Write what the descriptor takes now, without waiting (0 if it takes nothing or fails)."""
        try:
            return os.write(self._out.fileno(), data)
        except OSError:
            return 0

    async def wait_send_all_might_not_block(self) -> None:
        await self._out.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self._in.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._out.aclose()

    async def aclose(self) -> None:
        await self._out.aclose()
        await self._in.aclose()


class StdioStream(SplitStream):
    """The protocol on the process's stdin/stdout.

    The original descriptors are duplicated for the protocol's own use and
    then replaced: fd 1 by stderr, so that a stray write to stdout (from a
    library, a child process) can never corrupt the protocol stream, and fd 0
    by /dev/null, so that children never read the client's commands.
    """

    def __init__(self) -> None:
        in_fd = os.dup(0)
        out_fd = os.dup(1)
        os.dup2(2, 1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        widen_pipe(out_fd)
        super().__init__(trio.lowlevel.FdStream(in_fd), out_fd)


def open_stdio() -> StdioStream:
    return StdioStream()


async def connect_tcp(host: str, port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(host, port)
    stream.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, True)
    return stream


async def open_tcp_listeners(host: str, port: int) -> List[trio.SocketListener]:
    return await trio.open_tcp_listeners(port, host=host)


async def open_unix_listener(path: str) -> trio.SocketListener:
    """A listening Unix socket at ``path``, accessible to its owner only (mode 0600)."""
    return trio.SocketListener(trio.socket.from_stdlib_socket(bind_unix_listener(path)))


def write_now(stream: trio.abc.Stream, data: bytes) -> int:
    """Write as much of ``data`` as the stream takes without waiting, and without letting
    another task run first (``send_all`` checkpoints before it writes); 0 when the stream
    cannot do that or the write fails (``send_all`` then writes, or says why it cannot)."""
    send_now = getattr(stream, "send_now", None)
    if send_now is not None:
        return send_now(data)
    if not isinstance(stream, trio.SocketStream):
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:
        return 0
