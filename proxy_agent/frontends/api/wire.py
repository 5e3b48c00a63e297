"""The service interface on the wire: JSON objects, one per line, with no I/O of its own
beyond :func:`call` (a one-shot blocking request).  Standard library only: the launching
process uses it without loading the agent.

A connection to ``STATE_DIR/agent.sock`` whose first byte is ``{`` speaks this interface;
anything else is a PTP session (every PTP frame begins with 8 hex digits).  A client sends
requests, each ``{"op": NAME, "id": N, ...}``; the service answers each with
``{"id": N, "ok": true, ...}`` or ``{"id": N, "ok": false, "error": {"kind": KIND,
"message": TEXT}}`` (``kind`` is one of the service's neutral error kinds), and sends events
(``{"event": NAME, ...}``) for what a client asked to watch.  The first request of a
connection is ``hello`` (``launch`` and ``session`` are the launching process's own, see
``docs/architecture.md``).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "FIRST_BYTE",
    "MAX_LINE",
    "VERSION",
    "Refused",
    "LineReader",
    "ask",
    "call",
    "encode",
    "socket_path",
]

#: The interface's version: a client and a service agree on it in ``hello``/``launch``.
VERSION = 1
#: What a connection speaking this interface begins with (a JSON object).
FIRST_BYTE = b"{"
#: The longest line either side accepts (checked before a line is kept).
MAX_LINE = 16 * 1024 * 1024
#: The socket's name in the state directory.
SOCKET_NAME = "agent.sock"
#: The last event on a launch's anchor: the service has ended the launch (and what it had to
#: end of its clients' jobs); an anchor that closes without it belonged to a service that died.
DOOR_CLOSED = "launch-ended"


def socket_path(state_dir: str) -> str:
    return os.path.join(state_dir, SOCKET_NAME)


class Refused(Exception):
    """The service answered a request with an error: ``kind`` (a neutral error kind's name)
    and ``message`` (one line, fit for a user)."""

    def __init__(self, message: str, kind: str = "OPERATION_FAILED", detail: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.detail = detail or {}


def encode(message: Dict[str, Any]) -> bytes:
    """One message as its line (compact JSON, non-ASCII kept as UTF-8, a newline at the end)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n"


class LineReader:
    """Splits bytes into messages; a line over :data:`MAX_LINE` or one that is not a JSON
    object raises ValueError saying so."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        self._buffer += data
        messages = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > self._limit:
                    raise ValueError(f"a line longer than {self._limit} bytes")
                return messages
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if len(line) > self._limit:
                raise ValueError(f"a line longer than {self._limit} bytes")
            if line.strip():
                messages.append(decode(line))

    @property
    def pending(self) -> bytes:
        """What follows the last complete line (bytes of another protocol, after a handover)."""
        return bytes(self._buffer)


def decode(line: bytes) -> Dict[str, Any]:
    try:
        value = json.loads(line.decode("utf-8", "surrogateescape"))
    except ValueError:
        raise ValueError("a line that is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError("a line that is not a JSON object")
    return value


def answer(reply: Dict[str, Any]) -> Dict[str, Any]:
    """The result of a reply; :class:`Refused` for an error reply."""
    if reply.get("ok"):
        return reply
    error = reply.get("error")
    if not isinstance(error, dict):
        error = {}
    raise Refused(str(error.get("message") or "the service refused the request"),
                  str(error.get("kind") or "OPERATION_FAILED"), error)


def call(path: str, request: Dict[str, Any], *, timeout: Optional[float] = 30.0,
         fds: Sequence[int] = (), keep: bool = False) -> Tuple[Dict[str, Any], Optional[socket.socket]]:
    """Connect to the service at ``path``, send one request (with ``fds`` passed along) and
    read its answer.  Returns (the reply's fields, the connected socket when ``keep``, else
    None: closed).  OSError when the service cannot be reached or goes away before it
    answers; :class:`Refused` when it answers with an error."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        data = encode(dict(request, id=1))
        if fds:
            sent = socket.send_fds(sock, [data], list(fds))
            if sent < len(data):
                sock.sendall(data[sent:])
        else:
            sock.sendall(data)
        reply = read_reply(sock)
    except BaseException:
        sock.close()
        raise
    if not keep:
        sock.close()
        return answer(reply), None
    try:
        answer(reply)
    except Refused:
        sock.close()
        raise
    sock.settimeout(None)
    return reply, sock


def ask(path: str, op: str, *, timeout: Optional[float] = 30.0, **fields: Any) -> Dict[str, Any]:
    """One request of a tool that says hello first (the job list commands): its answer;
    OSError or ValueError when no service of this interface answers, :class:`Refused`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(encode({"op": "hello", "id": 1, "version": VERSION}) + encode(dict(fields, op=op, id=2)))
        reader = LineReader()
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError("the service closed the connection before it answered")
            for reply in reader.feed(data):
                if reply.get("id") == 1:
                    answer(reply)
                elif reply.get("id") == 2:
                    return answer(reply)
    finally:
        sock.close()


def read_reply(sock: socket.socket) -> Dict[str, Any]:
    """Read one line from ``sock`` and nothing after it (what follows may be another
    protocol's bytes): the bytes are looked at first, and only the line is taken."""
    line = bytearray()
    while True:
        seen = sock.recv(1 << 16, socket.MSG_PEEK)
        if not seen:
            raise ConnectionResetError("the service closed the connection before it answered")
        end = seen.find(b"\n")
        taken = sock.recv(end + 1 if end >= 0 else len(seen))
        line += taken
        if taken.endswith(b"\n"):
            return decode(bytes(line[:-1]))
        if len(line) > MAX_LINE:
            raise ConnectionResetError("the service's answer is too long")
