"""What every backend shares: the agent user, signal names, output line splitting.

Everything here is pure and cheap: no I/O, no clock.
"""

from __future__ import annotations

import getpass
import os
import signal
import time
from typing import AbstractSet, Dict, List, Optional

from ..service.jobs import StateTable
from ..service.model import K

__all__ = [
    "sweep_spool",
    "LineSplitter",
    "MAX_LINE_BYTES",
    "current_user",
    "signal_name",
    "state_attrs",
]


def current_user() -> str:
    """The name of the account the agent runs as (its uid when it has none)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry and no USER/LOGNAME variable
        return str(os.getuid())


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG<n>`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def state_attrs(table: StateTable, native: str) -> Dict[str, str]:
    """The ``state`` and ``nativeState`` attributes of a job or process in a native state."""
    return {K.STATE: table.map(native).value, K.NATIVE_STATE: native}


#: Output lines longer than this many bytes are passed on in pieces.
MAX_LINE_BYTES = 64 * 1024


class LineSplitter:
    """Bytes of one output stream in, text lines out.

    Lines end at ``\n`` (a ``\r`` before it is dropped); bytes are decoded
    as UTF-8 with undecodable bytes replaced.  A line longer than
    ``max_bytes`` is split into pieces of at most ``max_bytes`` (never inside
    a UTF-8 sequence); the pieces are the same however the bytes were chunked
    by the pipe.  :meth:`flush` returns a last line that had no newline.
    """

    __slots__ = ("max_bytes", "_pending")

    def __init__(self, max_bytes: int = MAX_LINE_BYTES) -> None:
        if max_bytes < 4:
            raise ValueError("max_bytes must be at least 4 (one UTF-8 character)")
        self.max_bytes = max_bytes
        self._pending = b""

    def feed(self, data: bytes) -> List[str]:
        lines: List[str] = []
        if self._pending:
            data = self._pending + data
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if end > start and data[end - 1] == 0x0D:  # \r\n
                self._pieces(data[start:end - 1], lines)
            else:
                self._pieces(data[start:end], lines)
            start = end + 1
        pending = data[start:]
        # Cut an overlong unfinished line, keeping one byte more than a piece so a
        # final '\r' can still meet its '\n' (the cuts then match a whole-line split).
        limit = self.max_bytes
        while len(pending) > limit + 1:
            cut = _utf8_boundary(pending, limit)
            lines.append(pending[:cut].decode("utf-8", "replace"))
            pending = pending[cut:]
        self._pending = pending
        return lines

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished last line held back."""
        return len(self._pending)

    def feed_text(self, data: bytes) -> Optional[str]:
        """:meth:`feed`, with the complete lines joined by ``\n`` into one text (None if none).

        The common case (no ``\r``, no line longer than ``max_bytes``) decodes the whole
        block at once instead of line by line: a process writing short lines as fast as it
        can (``yes``) yields tens of thousands of them per read.  Checking that no line is
        too long takes one search per ``max_bytes`` of input, not one per line.
        """
        pending = self._pending
        block = pending + data if pending else data
        if b"\r" not in block:
            limit = self.max_bytes
            end = block.rfind(b"\n")
            if end < 0:
                if len(block) <= limit + 1:
                    self._pending = block
                    return None
            elif len(block) - end - 1 <= limit + 1:
                pos = 0
                while end - pos > limit:
                    newline = block.rfind(b"\n", pos, pos + limit + 1)
                    if newline < 0:
                        break  # a line longer than the limit: cut it the slow way
                    pos = newline + 1
                else:
                    self._pending = block[end + 1:]
                    return block[:end].decode("utf-8", "replace")
        self._pending = b""
        lines = self.feed(block)
        return "\n".join(lines) if lines else None

    def flush_text(self) -> Optional[str]:
        """:meth:`flush` as one text (None if nothing was pending)."""
        lines = self.flush()
        return "\n".join(lines) if lines else None

    def flush(self) -> List[str]:
        pending, self._pending = self._pending, b""
        lines: List[str] = []
        if pending.endswith(b"\r"):
            pending = pending[:-1]
        if pending:
            self._pieces(pending, lines)
        return lines

    def _pieces(self, line: bytes, lines: List[str]) -> None:
        limit = self.max_bytes
        while len(line) > limit:
            cut = _utf8_boundary(line, limit)
            lines.append(line[:cut].decode("utf-8", "replace"))
            line = line[cut:]
        lines.append(line.decode("utf-8", "replace"))


def _utf8_boundary(data: bytes, limit: int) -> int:
    """A cut position at or before ``limit`` that does not split a UTF-8 sequence."""
    cut = limit
    while cut > limit - 3 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


#: Output files in a spool directory older than this are removed (a week).
SPOOL_MAX_AGE = 7 * 24 * 3600.0


def sweep_spool(directory: str, keep: AbstractSet[str], max_age: float = SPOOL_MAX_AGE,
                now: Optional[float] = None) -> List[str]:
    """Remove the output files (``*.out``, ``*.err``) in ``directory`` untouched for ``max_age``
    seconds, except those in ``keep`` (jobs still followed); returns the paths removed.

    Files of jobs the agent saw end are removed when the job is retired; these are the ones
    left behind by an agent that stopped first.  A missing directory is no error.
    """
    now = time.time() if now is None else now
    removed: List[str] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.endswith((".out", ".err")) or entry.path in keep:
            continue
        try:
            if not entry.is_file(follow_symlinks=False) or now - entry.stat(follow_symlinks=False).st_mtime < max_age:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.path)
    return removed
