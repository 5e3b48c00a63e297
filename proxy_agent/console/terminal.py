"""The console's two ends: where lines are printed and where commands are read.

Printing keeps the interactive prompt intact: a line arriving while the user
is typing is printed above the prompt, and the prompt with what was typed so
far is drawn again below it.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any, Callable, Iterable, List, Optional, TextIO

import trio

try:  # line editing and history when the platform has it
    import readline as _readline
except ImportError:  # pragma: no cover - e.g. a Python built without readline
    _readline = None  # type: ignore[assignment]

_ABANDON = (
    {"abandon_on_cancel": True}
    if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
    else {"cancellable": True}
)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking call in a worker thread; cancelling abandons the thread."""
    return await trio.to_thread.run_sync(fn, *args, **_ABANDON)


class Output:
    """Lines to stdout/stderr (or JSON records to stdout), safe to use under a live prompt."""

    def __init__(self, json_mode: bool = False, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        #: the prompt currently shown (set by the line reader while it waits)
        self.prompt: Optional[str] = None
        self._broken = False

    def _write(self, stream: TextIO, text: str) -> None:
        if self._broken:
            return
        try:
            redraw = self.prompt is not None
            if redraw:
                self.stdout.write("\r\x1b[K")
                self.stdout.flush()
            stream.write(text + "\n")
            stream.flush()
            if redraw:
                typed = _readline.get_line_buffer() if _readline is not None else ""
                self.stdout.write(self.prompt + typed)  # type: ignore[operator]
                self.stdout.flush()
        except BrokenPipeError:
            self._broken = True
        except ValueError:  # stream closed during shutdown
            self._broken = True

    def line(self, text: str = "") -> None:
        """A line of results or events (stdout)."""
        self._write(self.stdout, text)

    def lines(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.line(text)

    def note(self, text: str) -> None:
        """Diagnostics and trace (stderr)."""
        self._write(self.stderr, text)

    def record(self, record: dict) -> None:
        """One JSON line (stdout)."""
        self._write(self.stdout, json.dumps(record, ensure_ascii=False, default=str))


class LineReader:
    """Reads commands one line at a time, None at end of input."""

    async def read(self) -> Optional[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class StreamReader(LineReader):
    """Lines from a non-terminal stdin, without a prompt."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self.stream = stream or sys.stdin

    async def read(self) -> Optional[str]:
        line = await in_thread(self.stream.readline)
        if not line:
            return None
        return line.rstrip("\n")


class TerminalReader(LineReader):
    """Prompted input with line editing, history and tab completion (readline)."""

    def __init__(self, output: Output, prompt: str, completer: Callable[[str, List[str]], List[str]], history: Optional[str]) -> None:
        self.output = output
        self.prompt = prompt
        self.completer = completer
        self.history = history
        self._matches: List[str] = []
        self._saved_tty = None
        try:
            import termios

            self._saved_tty = termios.tcgetattr(sys.stdin.fileno())
        except Exception:  # noqa: BLE001 - not a terminal after all, or no termios
            self._saved_tty = None
        if _readline is not None:
            _readline.set_completer(self._complete)
            _readline.set_completer_delims(" \t;")
            if "libedit" in (getattr(_readline, "__doc__", "") or ""):
                _readline.parse_and_bind("bind ^I rl_complete")
            else:
                _readline.parse_and_bind("tab: complete")
            if history:
                try:
                    _readline.read_history_file(history)
                except OSError:
                    pass
                _readline.set_history_length(1000)

    def _complete(self, text: str, index: int) -> Optional[str]:
        # runs in the input thread: must not raise
        try:
            if index == 0:
                buffer = _readline.get_line_buffer() if _readline is not None else text
                words = buffer[: _readline.get_begidx()].split() if _readline is not None else []
                self._matches = self.completer(text, words)
            return self._matches[index] if index < len(self._matches) else None
        except Exception:  # noqa: BLE001
            return None

    def _input(self) -> Optional[str]:
        try:
            return input(self.prompt)
        except EOFError:
            return None

    async def read(self) -> Optional[str]:
        self.output.prompt = self.prompt
        try:
            line = await in_thread(self._input)
        finally:
            self.output.prompt = None
        if line is None:
            self.output.line()
        return line

    def close(self) -> None:
        if _readline is not None and self.history:
            try:
                _readline.write_history_file(self.history)
            except OSError:
                pass
        if self._saved_tty is not None:
            try:
                import termios

                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved_tty)
            except Exception:  # noqa: BLE001 - best effort
                pass
