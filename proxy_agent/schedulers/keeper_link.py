"""The agent's end of the keeper's socket (see :mod:`.keeper`): start it, talk to it.

:func:`open_keeper` connects to the keeper of a directory, starting one (detached, in its
own session) when none answers.  :class:`KeeperLink` sends requests as JSON lines and hands
every message from the keeper to a callback, in order.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Callable, List, Optional

import trio

log = logging.getLogger("proxy_agent.schedulers.keeper")

__all__ = ["KeeperError", "KeeperLink", "open_keeper"]

#: How long a freshly started keeper may take to answer.
_START_TIMEOUT = 10.0
_MAX_LINE = 64 << 20


#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode


class KeeperError(Exception):
    pass


def _package_root() -> str:
    """Where the ``proxy_agent`` package is imported from (a directory or the single file)."""
    import proxy_agent

    return os.path.dirname(os.path.dirname(os.path.abspath(proxy_agent.__file__)))


class KeeperLink:
    def __init__(self, stream: trio.SocketStream, directory: str) -> None:
        self.stream = stream
        self.directory = directory
        self._buffer = b""
        #: requests waiting for the connection, in the order they were made
        self._queue: List[bytes] = []
        #: requests made so far, and how many of them were handed to the connection
        self._made = 0
        self._sent = 0
        #: a write is under way
        self._writing = False
        #: set when a write ends (the tasks whose requests wait for the next one look again)
        self._written: Optional[trio.Event] = None
        self._failure: Optional[str] = None
        self.closed = False

    async def send(self, message: dict) -> None:
        """Send a request.  Requests made while an earlier one is being written go
        together in the next write: one system call (and one wake-up of the keeper) for
        all the jobs a client submitted at once, and one wake-up of all their tasks."""
        await self.send_line(_compact(message).encode() + b"\n")

    async def send_line(self, line: bytes) -> None:
        """Send a request already encoded (one JSON line, with its newline)."""
        self._queue.append(line)
        self._made += 1
        mine = self._made
        while self._sent < mine and self._failure is None:
            if self._writing:  # the write under way took the queue before this joined it
                if self._written is None:
                    self._written = trio.Event()
                await self._written.wait()
            else:
                await self._write()
        if self._sent < mine:
            raise KeeperError(self._failure)

    async def _write(self) -> None:
        self._writing = True
        try:
            while self._queue and self._failure is None:
                data = b"".join(self._queue)
                self._queue.clear()
                upto = self._made
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.closed = True
                    self._failure = f"the keeper of {self.directory} is gone: {exc}"
                finally:
                    if self._failure is None:
                        self._sent = upto  # (also when cancelled: handed to the connection)
                    self._wake()
        finally:
            self._writing = False
            self._wake()

    def _wake(self) -> None:
        if self._written is not None:
            self._written.set()
            self._written = None

    async def receive(self) -> Optional[dict]:
        """The next message (None when the keeper closed the connection)."""
        while b"\n" not in self._buffer:
            if not await self._fill():
                return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    async def _fill(self) -> bool:
        """Read more of what the keeper sent (False when it closed the connection)."""
        try:
            data = await self.stream.receive_some(1 << 16)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.closed = True
            return False
        self._buffer += data
        if len(self._buffer) > _MAX_LINE:
            raise KeeperError("the keeper sent a line too long to be one message")
        return True

    async def serve(self, handle: Callable[[List[dict]], None]) -> None:
        """Hand the keeper's messages to ``handle``, those that arrived together in one list
        (a round of the keeper's news), until the keeper closes the connection."""
        while True:
            while b"\n" not in self._buffer:
                if not await self._fill():
                    return
            end = self._buffer.rindex(b"\n")
            lines, self._buffer = self._buffer[:end].split(b"\n"), self._buffer[end + 1:]
            try:  # one call for the lot: its messages are small and many
                messages = json.loads(b"[" + b",".join(lines) + b"]")
            except ValueError:
                messages = None
            if messages is None or len(messages) != len(lines):
                messages = [json.loads(line) for line in lines]  # raises at the line that is not one
            handle(messages)

    async def aclose(self) -> None:
        self.closed = True
        with trio.move_on_after(1) as scope:
            scope.shield = True
            try:
                await self.stream.aclose()
            except Exception:  # noqa: BLE001
                pass


async def _connect(path: str) -> Optional[trio.SocketStream]:
    try:
        return await trio.open_unix_socket(path)
    except OSError:
        return None


async def open_keeper(directory: str) -> KeeperLink:
    """Connect to the keeper of ``directory``, starting one if none answers."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "keeper.sock")
    stream = await _connect(path)
    if stream is None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
        log_path = os.path.join(directory, "keeper.log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "proxy_agent.schedulers.keeper", directory],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd,
                start_new_session=True, env=env, cwd="/",
            )
        finally:
            os.close(log_fd)
        log.info("started a keeper for %s (pid %d)", directory, process.pid)
        with trio.move_on_after(_START_TIMEOUT):
            while stream is None:
                # A keeper that found another one serving the directory leaves at once, with
                # status 0; that one (its custodian starting a new keeper, say) answers soon.
                if process.poll() is not None and process.returncode != 0:
                    break
                await trio.sleep(0.005)
                stream = await _connect(path)
        if stream is None:
            tail = ""
            try:
                with open(log_path, "rb") as log_file:
                    tail = log_file.read()[-400:].decode("utf-8", "replace").strip()
            except OSError:
                pass
            raise KeeperError(f"the keeper for {directory} did not start" + (f": {tail}" if tail else ""))
        if process.poll() is None and _custodian_of(directory) not in (None, process.pid):
            # it found another keeper serving (the one that answered) and is leaving: reaped
            with trio.move_on_after(2):
                await process.wait()
    return KeeperLink(stream, directory)


def _custodian_of(directory: str) -> Optional[int]:
    """The pid of the custodian serving ``directory``, as its lock file says."""
    try:
        with open(os.path.join(directory, "keeper.lock"), "rb") as lock:
            pid = json.loads(lock.read() or b"{}").get("custodian")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None
