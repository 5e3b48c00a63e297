"""Byte streams the protocol runs over: stdio, TCP (connect-back or listen), Unix sockets.

Everything here deals in :class:`trio.abc.Stream`; nothing here knows the
protocol.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket as _socket
import stat
from typing import List, Optional, Tuple

import trio

log = logging.getLogger("proxy_agent.transport")

__all__ = [
    "StdioStream",
    "open_stdio",
    "connect_tcp",
    "open_tcp_listeners",
    "open_unix_listener",
    "parse_host_port",
    "load_or_create_token",
    "os_error_reason",
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


#: What the agent asks of a pipe to its client: room for a megabyte (Linux's default
#: ceiling for unprivileged processes).  With the default 64 KiB, a big initial model makes
#: agent and client take turns many times over; with room they both work at once.
PIPE_BYTES = 1 << 20


def _widen_pipe(fd: int) -> None:
    """Give the pipe on ``fd`` room for PIPE_BYTES where the system allows (a pipe on Linux);
    anything else (a socket, a terminal, another system) is left as it is."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        pass  # over the system's limit, or not allowed: the pipe keeps its size


class StdioStream(trio.abc.HalfCloseableStream):
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
        _widen_pipe(out_fd)
        self._in = trio.lowlevel.FdStream(in_fd)
        self._out = trio.lowlevel.FdStream(out_fd)

    async def send_all(self, data) -> None:
        await self._out.send_all(data)

    def send_now(self, data) -> int:
        """Write what the pipe takes now, without waiting (0 if it takes nothing or fails)."""
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


def open_stdio() -> StdioStream:
    return StdioStream()


def parse_host_port(text: str, default_host: Optional[str] = None, allow_zero: bool = False) -> Tuple[str, int]:
    """``HOST:PORT``, ``[v6addr]:PORT`` or (with a default host) ``PORT``.

    ``allow_zero`` admits port 0 (listen on any free port; the agent prints which).
    """
    host: Optional[str]
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"bad address {text!r}: expected [HOST]:PORT")
        port_text = rest[1:]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    else:
        host, port_text = default_host, text
    if not host:
        if default_host is None:
            raise ValueError(f"bad address {text!r}: expected HOST:PORT")
        host = default_host
    lowest = 0 if allow_zero else 1
    if not (port_text.isascii() and port_text.isdigit()) or not lowest <= int(port_text) < 65536:
        raise ValueError(f"bad port in {text!r}: expected a number from {lowest} to 65535")
    return host, int(port_text)


async def connect_tcp(host: str, port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(host, port)
    stream.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, True)
    return stream


async def open_tcp_listeners(host: str, port: int) -> List[trio.SocketListener]:
    return await trio.open_tcp_listeners(port, host=host)


async def open_unix_listener(path: str) -> trio.SocketListener:
    """A listening Unix socket at ``path``, accessible to its owner only (mode 0600)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        # A stale socket from an earlier run: refuse if something still answers on it.
        probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            raise OSError(errno.EADDRINUSE, f"another process is serving on {path}")
        finally:
            probe.close()
    sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(16)
    return trio.SocketListener(sock)


def load_or_create_token(token_file: Optional[str], given: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """The shared secret for ``--listen``: (token, path it was written to or None).

    ``given`` (the agent's ``PROXY_AGENT_TOKEN``) if set; otherwise generated and written
    to ``token_file`` (default ``~/.proxy-agent/token``) with mode 0600.
    """
    if given:
        return given, None
    path = token_file or os.path.join(os.path.expanduser("~"), ".proxy-agent", "token")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise ValueError(
            f"refusing to write the token into {directory}: others can write to that directory "
            "(choose a private one with --token-file)"
        )
    import secrets  # only for --listen

    token = secrets.token_urlsafe(32)
    # Written to a new file of our own and renamed into place: a symlink or file planted at
    # the path is replaced, never followed or written through.
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, (token + "\n").encode())
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return token, path
