"""Naming the cause when a session cannot start because the stream is not the protocol.

The usual cause over ssh: a shell start-up file on the remote host (``~/.bashrc``,
``~/.profile``, ``~/.cshrc``, a site file under ``/etc``) prints a banner to stdout even for
non-interactive shells, so the client reads text before the agent's first frame.  Every
frame starts with its length as 8 hex digits and a space; anything else in front of the
first frame is such garbage.
"""

from __future__ import annotations

from typing import Optional

from ..protocol.first_bytes import looks_like_frame_start, shown_bytes

__all__ = ["looks_like_frame_start", "garbage_before_first_frame", "shown_bytes"]


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
