"""The console's two ends: where lines are printed and where commands are read.

Printing keeps the interactive prompt intact: a line arriving while the user
is typing is printed above the prompt, and the prompt with what was typed so
far is drawn again below it.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any, Callable, Iterable, List, Optional, TextIO

import trio

from .render import json_text, visible

_readline: Optional[ModuleType]
try:  # line editing and history when the platform has it
    import readline

    _readline = readline
except ImportError:  # pragma: no cover - e.g. a Python built without readline
    _readline = None

_ABANDON = (
    {"abandon_on_cancel": True}
    if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
    else {"cancellable": True}
)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking call in a worker thread; cancelling abandons the thread."""
    return await trio.to_thread.run_sync(fn, *args, **_ABANDON)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """Lines to stdout/stderr (or JSON records to stdout), safe to use under a live prompt.

    Every line passes through :func:`~proxy_agent.console.render.visible` on its way out, so
    no text from the agent reaches the terminal with a control character in it.  The prompt
    and the escape sequences that redraw it go to :attr:`prompt_stream`: stdout when it is a
    terminal, else stderr when that is one, else nowhere.
    """

    def __init__(self, json_mode: bool = False, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        #: the prompt currently shown (set by the line reader while it waits)
        self.prompt: Optional[str] = None
        self._broken = False

    @property
    def prompt_stream(self) -> Optional[TextIO]:
        if _is_terminal(self.stdout):
            return self.stdout
        if _is_terminal(self.stderr):
            return self.stderr
        return None

    def _write(self, stream: TextIO, text: str) -> None:
        if self._broken:
            return
        try:
            prompt_stream = self.prompt_stream if self.prompt is not None else None
            if prompt_stream is not None:
                prompt_stream.write("\r\x1b[K")
                prompt_stream.flush()
            stream.write(text + "\n")
            stream.flush()
            if prompt_stream is not None:
                typed = _readline.get_line_buffer() if _readline is not None else ""
                prompt_stream.write((self.prompt or "") + typed)
                prompt_stream.flush()
        except BrokenPipeError:
            self._broken = True
        except ValueError:  # stream closed during shutdown
            self._broken = True

    def line(self, text: str = "") -> None:
        """A line of results or events (stdout)."""
        self._write(self.stdout, visible(text, keep_tab=True))

    def lines(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.line(text)

    def note(self, text: str) -> None:
        """Diagnostics and trace (stderr)."""
        self._write(self.stderr, visible(text, keep_tab=True))

    def record(self, record: dict) -> None:
        """One JSON line (stdout)."""
        self._write(self.stdout, json_text(record))


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
        # input() writes its prompt to stdout; when stdout is not a terminal (output sent to
        # a file) the prompt goes to stderr if that is one, and otherwise nowhere.
        stream = self.output.prompt_stream
        try:
            if stream is sys.stdout:
                return input(self.prompt)
            if stream is not None:
                stream.write(self.prompt)
                stream.flush()
            return input()
        except EOFError:
            return None

    async def read(self) -> Optional[str]:
        self.output.prompt = self.prompt
        try:
            line = await in_thread(self._input)
        finally:
            self.output.prompt = None
        if line is None and self.output.prompt_stream is not None:
            self.output.prompt_stream.write("\n")  # end the prompt's line
            self.output.prompt_stream.flush()
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
