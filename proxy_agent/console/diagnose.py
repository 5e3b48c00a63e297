"""Naming the cause when a session cannot start because the stream is not the protocol.

The usual cause over ssh: a shell start-up file on the remote host (``~/.bashrc``,
``~/.profile``, ``~/.cshrc``, a site file under ``/etc``) prints a banner to stdout even for
non-interactive shells, so the client reads text before the agent's first frame.  Every
frame starts with its length as 8 hex digits and a space; anything else in front of the
first frame is such garbage.
"""

from __future__ import annotations

import string
from typing import Optional

__all__ = ["looks_like_frame_start", "garbage_before_first_frame", "shown_bytes"]

_HEX = set(string.hexdigits.encode())
#: How much of the garbage the message quotes.
SHOWN_LIMIT = 120


def looks_like_frame_start(data: bytes) -> bool:
    """Whether ``data`` can be the start of a frame (as far as it goes)."""
    head = data[:9]
    if any(byte not in _HEX for byte in head[:8]):
        return False
    return len(head) < 9 or head[8:9] == b" "


def shown_bytes(data: bytes, limit: int = SHOWN_LIMIT) -> str:
    """The bytes as readable text, control characters escaped, cut at ``limit`` characters."""
    text = data.decode("utf-8", "replace")
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    shown = "".join(out)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def garbage_before_first_frame(data: bytes, where: str = "the agent's host") -> Optional[str]:
    """A one-line explanation when ``data`` (what arrived before any frame) is not a frame, else None."""
    if not data or looks_like_frame_start(data):
        return None
    return (
        f"the agent's output began with text that is not the protocol: '{shown_bytes(data)}'. "
        f"Most likely a shell start-up file on {where} (~/.bashrc, ~/.profile, ~/.cshrc or one "
        "under /etc) writes to stdout in non-interactive shells: make it print only when the "
        "shell is interactive (for example: [ -t 1 ] && echo ..., or case $- in *i*) ...)"
    )
