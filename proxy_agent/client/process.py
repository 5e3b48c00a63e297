"""An agent the client started: its process, its standard error kept for messages, its end."""

from __future__ import annotations

import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

import trio

from .errors import ConnectError

#: Bytes read from the agent at a time.
READ_SIZE = 1 << 16
#: Bytes of the agent's stderr kept for error messages.
STDERR_TAIL_BYTES = 64 * 1024
#: How long a spawned agent gets to exit by itself once its input is closed.
EXIT_GRACE = 3.0


# --------------------------------------------------------------------------- processes


class AgentProcess:
    """A spawned agent: the trio process plus a bounded tail of its stderr."""

    def __init__(self, process: trio.Process, argv: Sequence[str], capture_stderr: bool, exit_grace: float = EXIT_GRACE) -> None:
        self.process = process
        #: how long the agent gets to exit by itself once its input is closed
        self.exit_grace = exit_grace
        self.argv = list(argv)
        self.capture_stderr = capture_stderr
        self._tail = bytearray()
        self._stderr_eof = trio.Event()
        if not capture_stderr:
            self._stderr_eof.set()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        *,
        capture_stderr: bool = True,
        stdio: bool = True,
        exit_grace: float = EXIT_GRACE,
    ) -> "AgentProcess":
        """Start the agent; with ``stdio`` its stdin/stdout are pipes for the protocol."""
        if not argv:
            raise ConnectError("cannot start the agent: empty command line")
        pipe = subprocess.PIPE if stdio else subprocess.DEVNULL
        try:
            process = await trio.lowlevel.open_process(
                list(argv),
                stdin=pipe,
                stdout=pipe,
                stderr=subprocess.PIPE if capture_stderr else None,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                # Its own session: a Ctrl-C meant for the client's terminal must not reach the
                # agent; the client decides when it ends (closing its input, then signals).
                start_new_session=True,
            )
        except OSError as exc:
            raise ConnectError(f"cannot start the agent {argv[0]!r}: {exc.strerror or exc}") from None
        return cls(process, argv, capture_stderr, exit_grace)

    @property
    def returncode(self) -> Optional[int]:
        return self.process.returncode

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self, lines: int = 15) -> str:
        """The last lines the agent wrote to stderr (captured mode only)."""
        text = self._tail.decode("utf-8", "replace")
        return "\n".join(text.rstrip("\n").splitlines()[-lines:])

    async def pump_stderr(self) -> None:
        """Read stderr until EOF, keeping only the last :data:`STDERR_TAIL_BYTES`."""
        stream = self.process.stderr
        if stream is None or self._stderr_eof.is_set():
            return
        try:
            while True:
                data = await stream.receive_some(READ_SIZE)
                if not data:
                    break
                self._tail += data
                if len(self._tail) > STDERR_TAIL_BYTES:
                    del self._tail[: len(self._tail) - STDERR_TAIL_BYTES]
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._stderr_eof.set()

    async def wait_stderr(self) -> None:
        await self._stderr_eof.wait()

    async def wait(self) -> int:
        return await self.process.wait()

    def exit_description(self) -> str:
        """``exited with status 2`` / ``was killed by SIGTERM``."""
        code = self.returncode
        if code is None:
            return "is still running"
        if code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with status {code}"

    async def reap(self, grace: Optional[float] = None) -> None:
        """Wait for the agent to exit; terminate it after ``grace`` s, kill it 2 s later."""
        if grace is None:
            grace = self.exit_grace
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace):
                await self.process.wait()
            if self.returncode is None:
                try:
                    self.process.terminate()
                except OSError:
                    pass
                with trio.move_on_after(2.0):
                    await self.process.wait()
            if self.returncode is None:
                try:
                    self.process.kill()
                except OSError:
                    pass
                await self.process.wait()
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    try:
                        await stream.aclose()
                    except Exception:  # noqa: BLE001 - closing is best effort
                        pass


def default_agent_argv(*extra: str) -> List[str]:
    """``python -m proxy_agent`` with this interpreter, plus ``extra`` arguments."""
    return [sys.executable, "-m", "proxy_agent", *extra]

