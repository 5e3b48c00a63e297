"""Addresses, the ``--listen`` token and Unix socket files: what a launch settles before any I/O.

Standard library only: the launching process (:mod:`.launch`) uses these without loading the
rest of the agent, and :mod:`.transport` builds its trio streams and listeners on them.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from typing import Any, Dict, Optional, Tuple

__all__ = [
    "bind_unix_listener",
    "default_state_dir",
    "holder_of",
    "load_or_create_token",
    "lock_holder",
    "parse_host_port",
    "widen_pipe",
]

#: The lock file of a state directory: held (flock) by the process that serves it.
LOCK_NAME = "agent.lock"

#: What the agent asks of a pipe to its client: room for a megabyte (Linux's default
#: ceiling for unprivileged processes).  With the default 64 KiB, a big initial model makes
#: agent and client take turns many times over; with room they both work at once.
PIPE_BYTES = 1 << 20
#: Longest path a Unix socket address takes (``sun_path`` holds 108 bytes with its NUL).
UNIX_PATH_MAX = 107


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "proxy-agent")


def read_lock_holder(fd: int) -> Dict[str, Any]:
    """What the holder of a lock file wrote about itself (its pid, where to reach it)."""
    try:
        data = os.pread(fd, 4096, 0)
        value = json.loads(data.decode() or "{}")
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def lock_holder(directory: str) -> Optional[Dict[str, Any]]:
    """Whether a process holds the state directory ``directory``: None if none does, else
    what it wrote about itself ({} while it has not written yet)."""
    import fcntl

    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return read_lock_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def holder_of(directory: str) -> Dict[str, Any]:
    """What the agent holding ``directory`` wrote about itself ({} if none holds it)."""
    return lock_holder(directory) or {}


def widen_pipe(fd: int) -> None:
    """Give the pipe on ``fd`` room for PIPE_BYTES where the system allows (a pipe on Linux);
    anything else (a socket, a terminal, another system) is left as it is."""
    import fcntl

    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        pass  # over the system's limit, or not allowed: the pipe keeps its size


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


def bind_unix_listener(path: str, backlog: int = 16, *, replace: bool = False) -> socket.socket:
    """A listening Unix socket at ``path``, accessible to its owner only (mode 0600).

    A socket file already there is taken over when nothing answers on it (left by a process
    that died); with ``replace`` it is taken over in any case (the caller holds a lock that
    makes it the only rightful owner of the path).  Anything else at the path is refused."""
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, f"{path} is too long for a Unix socket ({UNIX_PATH_MAX} bytes at most)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        if not replace:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                pass
            else:
                raise OSError(errno.EADDRINUSE, f"another process is serving on {path}")
            finally:
                probe.close()
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return sock


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
