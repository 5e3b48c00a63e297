"""What every command-line entry point shares: ending quietly when its reader goes away.

``proxy-agent jobs | head -5`` closes the pipe after five lines; the next write to stdout
raises :class:`BrokenPipeError`, and Python's own flush of stdout at exit would raise it
again.  :func:`entry_point` wraps a ``main(argv)`` so that this ends the program at once,
silently, with the status a program killed by SIGPIPE has (128 + 13), as ``cat`` or
``grep`` would end.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, Optional, Sequence, TypeVar, cast

__all__ = ["BROKEN_PIPE_STATUS", "entry_point", "is_broken_pipe"]

#: The exit status after a closed stdout: what a shell shows for a process killed by SIGPIPE.
BROKEN_PIPE_STATUS = 141

Main = TypeVar("Main", bound=Callable[..., Optional[int]])


def is_broken_pipe(exc: BaseException) -> bool:
    """A closed pipe, alone or inside an exception group (trio's nurseries wrap them)."""
    if isinstance(exc, BrokenPipeError):
        return True
    inner = getattr(exc, "exceptions", None)
    if inner:
        return all(is_broken_pipe(e) for e in inner)
    return False


def _detach_stdout() -> None:
    """Point fd 1 at /dev/null, so that nothing more (not even the final flush) can fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def entry_point(main: Main) -> Main:
    """``main`` (taking ``argv``), ending with :data:`BROKEN_PIPE_STATUS` and no traceback
    when its stdout is closed under it."""

    @functools.wraps(main)
    def run(argv: Optional[Sequence[str]] = None, *args, **kwargs):
        try:
            try:
                return main(argv, *args, **kwargs)
            finally:
                if sys.stdout is not None:
                    sys.stdout.flush()
        except BaseException as exc:  # noqa: BLE001 - only a closed pipe is handled here
            if not is_broken_pipe(exc):
                raise
        _detach_stdout()
        return BROKEN_PIPE_STATUS

    return cast(Main, run)
