"""What to make of the first bytes of a stream when they are not a frame.

Both ends meet this: a client whose agent's output starts with a login
banner, and an agent whose input starts with a person typing or a wrapper's
greeting.  Every frame starts with its length as 8 hex digits and a space,
so anything else in front of the first frame can be recognised at once; the
decoder stops right there (often after 8 bytes).  For a readable message the
I/O layer reads on, briefly, up to the end of the first line
(:data:`QUOTE_WAIT`, :data:`QUOTE_LIMIT`) and quotes that line
(:func:`first_line`, :func:`shown_bytes`).
"""

from __future__ import annotations

import string

__all__ = ["QUOTE_LIMIT", "QUOTE_WAIT", "SHOWN_LIMIT", "first_line", "looks_like_frame_start", "shown_bytes"]

#: How long the I/O layer reads on for the rest of the first line (seconds).
QUOTE_WAIT = 0.5
#: The most bytes it collects for the quote.
QUOTE_LIMIT = 200
#: How many characters a message quotes.
SHOWN_LIMIT = 120

_HEX = frozenset(string.hexdigits.encode())


def looks_like_frame_start(data: bytes) -> bool:
    """Whether ``data`` can be the start of a frame (as far as it goes)."""
    head = data[:9]
    if any(byte not in _HEX for byte in head[:8]):
        return False
    return len(head) < 9 or head[8:9] == b" "


def first_line(data: bytes, limit: int = QUOTE_LIMIT) -> bytes:
    """``data`` up to and including its first newline, at most ``limit`` bytes."""
    end = data.find(b"\n", 0, limit)
    return bytes(data[: end + 1] if end >= 0 else data[:limit])


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
