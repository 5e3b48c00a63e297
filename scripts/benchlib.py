"""Small helpers shared by the benchmark scripts: a bare wire-level driver of a spawned agent.

The benchmarks talk raw frames (no mirrored model) so that what they time is
the agent, not a client's bookkeeping.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from proxy_agent.protocol.messages import CommandId, EventId  # noqa: E402
from proxy_agent.protocol.wire import Decoder, Frame, encode_frame  # noqa: E402


#: How an agent of its own is started (what every launch was before the service of a state
#: directory: the whole agent in the launched process).
PRIVATE_AGENT = ["-c", "import sys; from proxy_agent.__main__ import run_private; sys.exit(run_private(sys.argv[1:]))"]


class RawAgent:
    """An agent launched over stdio, driven with raw frames.

    It joins (or starts) the service of a state directory of its own, or of ``state_home``
    when given (``XDG_STATE_HOME``: launches on one share its service); ``command`` replaces
    ``-m proxy_agent`` (:data:`PRIVATE_AGENT`: an agent of its own).  What is measured of
    "the agent" (memory, CPU) is the service's, which does the work."""

    def __init__(self, agent_args: Sequence[str] = (), env: Optional[dict] = None,
                 state_home: Optional[str] = None, command: Sequence[str] = ("-m", "proxy_agent")) -> None:
        # Its own state directory unless told: one service per directory, and others may run.
        self._state = tempfile.TemporaryDirectory(prefix="bench-agent-") if state_home is None else None
        self.state_home = state_home or self._state.name
        self.state_dir = os.path.join(self.state_home, "proxy-agent")
        env = dict(os.environ if env is None else env)
        env["XDG_STATE_HOME"] = self.state_home
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, *command, "--stdio", *agent_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            bufsize=0,
        )
        self.decoder = Decoder(max_frame_size=1 << 30)
        self.bytes_received = 0
        self.tid = 0
        self._pending: List[Frame] = []
        #: when a list, every chunk of bytes received is appended to it
        self.capture: Optional[List[bytes]] = None

    def send(self, cid: CommandId, *args: str) -> int:
        self.tid += 1
        self.proc.stdin.write(encode_frame(int(cid), self.tid, list(args)))
        self.proc.stdin.flush()
        return self.tid

    def send_many(self, frames: List[bytes]) -> None:
        self.proc.stdin.write(b"".join(frames))
        self.proc.stdin.flush()

    def frames(self):
        """Yield frames as they arrive."""
        while True:
            while self._pending:
                yield self._pending.pop(0)
            data = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not data:
                return
            self.bytes_received += len(data)
            if self.capture is not None:
                self.capture.append(data)
            self.decoder.feed(data)
            for item in self.decoder:
                if not isinstance(item, Frame):
                    raise RuntimeError(f"agent sent a malformed frame: {item}")
                self._pending.append(item)

    def wait_for(self, predicate: Callable[[Frame], bool]) -> Frame:
        for frame in self.frames():
            if frame.msg_id == EventId.ERROR:
                raise RuntimeError(f"agent answered ERROR: {frame.args}")
            if predicate(frame):
                return frame
        raise RuntimeError("agent closed its output")

    def complete(self, tid: int) -> Frame:
        return self.wait_for(lambda f: f.tid == tid and f.msg_id in (EventId.OK, EventId.SHUTDOWN))

    def handshake(self, base_id: int = 100, start: bool = True) -> None:
        self.complete(self.send(CommandId.INIT, "version=2.0", f"baseId={base_id}"))
        self.complete(self.send(CommandId.MODEL_DEF))

    @property
    def pid(self) -> int:
        """The process that serves: the state directory's service (else the launched one)."""
        from proxy_agent.endpoints import lock_holder

        holder = lock_holder(self.state_dir) or {}
        pid = holder.get("pid")
        return pid if isinstance(pid, int) else self.proc.pid

    def peak_rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self, children: bool = False) -> float:
        """CPU time of the agent (user + system); with ``children``, also of the
        child processes it has reaped (e.g. the scheduler commands it ran)."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        used = int(fields[11]) + int(fields[12])
        if children:
            used += int(fields[13]) + int(fields[14])
        return used / ticks

    def close(self) -> None:
        try:
            self.send(CommandId.QUIT)
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._state is not None:
            stop_service(self.state_dir)
            self._state.cleanup()


def stop_service(state_dir: str) -> None:
    """Stop the service a benchmark's launches started on ``state_dir`` (it would outlive them)."""
    from proxy_agent.launch import stop_service as stop

    stop(state_dir, end_jobs=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
