"""How the agent ends: always with whole frames and a SHUTDOWN, within a bound, however
slowly its client reads; and cleanly at any moment of its start-up.

* QUIT, and SIGTERM to the launch or to the service of its state directory, while the client
  reads at 32 or 256 KB/s behind a flood of output: the stream the client reads to its end is
  whole frames ending with SHUTDOWN (after a MESSAGE saying why, for SIGTERM), and the launch
  is gone within its documented bound.
* SIGTERM, SIGINT or SIGHUP at a random moment of a launch's start-up (from when its own code
  runs), or right after it says it is listening: exit status 0, no traceback, its socket file
  removed; the service it started removes the directory's socket as it ends in turn.
* The same signals at a random moment of the service's own start-up, or right after it
  serves: exit status 0, no traceback (on its stderr or in its log), its socket removed and
  the state directory free.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import trio

from agent_fixtures import agent_argv, process_gone, processes_of, service_pid, subprocess_env
from proxy_agent.endpoints import lock_holder
from wait_support import scaled, wait_until
from proxy_agent.frontends.ptp.session import CLOSE_BOUND
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.wire import Decoder, FrameError, encode_frame


PIPE_SIZE = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class SlowClient:
    """A client on a spawned agent's stdio that reads at the pace it is told."""

    def __init__(self, process: trio.Process, state_dir: str = "") -> None:
        self.process = process
        #: the state directory of its launch (where its service runs)
        self.state_dir = state_dir
        self.decoder = Decoder(max_frame_size=1 << 30)
        self.frames: list = []
        self.errors: list = []
        self.tid = 0
        self.received = 0

    @classmethod
    async def spawn(cls, *args: str) -> "SlowClient":
        env = subprocess_env()
        process = await trio.lowlevel.open_process(
            agent_argv(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        return cls(process, os.path.join(env["XDG_STATE_HOME"], "proxy-agent"))

    async def send(self, cid: int, *args: str) -> int:
        self.tid += 1
        await self.process.stdin.send_all(encode_frame(cid, self.tid, list(args)))
        return self.tid

    async def read(self, size: int) -> bool:
        """Read up to ``size`` bytes; False at the end of the stream."""
        data = await self.process.stdout.receive_some(size)
        if not data:
            self.decoder.feed_eof()
            self.errors.extend(self.decoder)
            return False
        self.received += len(data)
        self.decoder.feed(data)
        for item in self.decoder:
            (self.errors if isinstance(item, FrameError) else self.frames).append(item)
        return True

    def unread(self) -> int:
        """What waits in the pipe from the agent, not read yet, and how much the pipe holds."""
        fd = self.process.stdout.fileno()
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0], fcntl.fcntl(fd, PIPE_SIZE)

    async def read_at(self, rate: int, seconds: float) -> bool:
        """Read at ``rate`` bytes a second for ``seconds``; False at the end of the stream."""
        step = max(1024, rate // 20)
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            if not await self.read(step):
                return False
            await trio.sleep(step / rate)
        return True


async def _flooded(client: SlowClient) -> int:
    """Start a session with four jobs writing as fast as they can; read until the output
    flows, then stop reading until everything in between is full.  The events TID."""
    await client.send(CommandId.INIT, "version=2.0", "baseId=1000")
    await client.send(CommandId.MODEL_DEF)
    events = await client.send(CommandId.START_EVENTS)
    for i in range(4):
        await client.send(CommandId.SUBMIT_JOB, f"jobSubId=flood{i}", "execPath=/usr/bin/yes",
                          "progArgs=output that the client will not read in time")
    while client.received < 4 << 20:
        assert await client.read(1 << 20)
    # the pipe fills up (no room for another event of output) and, behind it, the agent's queue
    await wait_until(lambda: client.unread()[0] >= client.unread()[1] - (128 << 10), what="the pipe from the agent full")
    return events


@pytest.mark.parametrize(("how", "rate"), [
    ("QUIT", 32_000), ("QUIT", 256_000), ("SIGTERM", 32_000), ("SIGTERM", 256_000),
    ("SIGTERM to the service", 32_000),
])
async def test_the_stream_ends_with_whole_frames_and_shutdown_whatever_the_readers_speed(how, rate):
    client = await SlowClient.spawn()
    try:
        with trio.fail_after(scaled(120)):
            events = await _flooded(client)
            ending = trio.current_time()
            if how == "QUIT":
                tid = await client.send(CommandId.QUIT)
            elif how == "SIGTERM":
                client.process.send_signal(signal.SIGTERM)
                tid = events
            else:
                os.kill(service_pid(client.state_dir), signal.SIGTERM)
                tid = events
            gone_at = None
            reading = await client.read_at(rate, CLOSE_BOUND + 3)
            if client.process.poll() is not None:
                gone_at = trio.current_time()
            while reading:  # the rest of what the agent handed over, read at once
                reading = await client.read(1 << 20)
            if gone_at is None:
                await client.process.wait()
                gone_at = trio.current_time()
            assert client.process.returncode == 0
            # the agent ended its side within its bound (and a margin for a loaded machine);
            # a reader this slow would take minutes to be given everything
            assert gone_at - ending < scaled(CLOSE_BOUND + 10)
    finally:
        if client.process.returncode is None:
            client.process.kill()
            await client.process.wait()
    assert client.errors == []  # whole frames, to the very end
    last = client.frames[-1]
    assert (last.msg_id, last.tid) == (EventId.SHUTDOWN, tid), last
    if how != "QUIT":
        message = client.frames[-2]
        assert message.msg_id == EventId.MESSAGE and "SIGTERM" in " ".join(message.args), message


def _catches(pid: int, signum: int) -> bool:
    """Has the process a handler of its own for the signal (its code is running)?"""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def _end_keeper(state: Path) -> None:
    """A keeper the stopped agent had started, ended (it would leave by itself when idle)."""
    try:
        pids = json.loads((state / "local" / "keeper.lock").read_text() or "{}")
    except (OSError, ValueError):
        return
    if pids.get("custodian"):
        try:
            os.killpg(pids["custodian"], signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


RUNS = 24


async def _stop_services_of(state: Path, signum: int) -> None:
    """The service a launch started for ``state`` (in the background), stopped by ``signum``
    whatever it is doing, and waited for; the launch itself has ended."""
    seen = set()
    signalled = set()
    with trio.fail_after(scaled(60)):
        while True:
            found = processes_of(state)
            for pid, service in found:
                seen.add(pid)
                if service and pid not in signalled:
                    signalled.add(pid)
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        pass
            # a process that is ending has no command line any more, but is not gone yet
            if not found and all(process_gone(pid) for pid in seen):
                return
            await trio.sleep(0.01)


async def test_a_signal_at_any_moment_of_start_up_ends_the_agent_cleanly(tmp_path):
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    outcomes = []
    for run in range(RUNS):
        signum = signals[run % 3]
        sock = tmp_path / f"agent-{run}.sock"
        state = tmp_path / f"state-{run}"
        process = await trio.lowlevel.open_process(
            agent_argv("--unix", str(sock), "--state-dir", str(state)), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env())
        stderr = b""
        try:
            with trio.fail_after(scaled(60)):
                if run % 4 == 3:  # right after it says it listens
                    while b"listening on" not in stderr:
                        data = await process.stderr.receive_some(4096)
                        assert data, stderr
                        stderr += data
                else:  # anywhere in the start-up (once the agent's code runs), or a little after
                    # (SIGINT is caught by Python itself from its start: the agent's SIGTERM
                    # handler says when the agent's own code runs)
                    while not _catches(process.pid, signal.SIGTERM):
                        assert process.poll() is None, "the agent ended by itself"
                        await trio.sleep(0.001)
                    await trio.sleep(random.uniform(0, 0.25))
                process.send_signal(signum)
                while True:
                    data = await process.stderr.receive_some(4096)
                    if not data:
                        break
                    stderr += data
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            _end_keeper(state)
        text = stderr.decode(errors="replace")
        outcomes.append((signal.Signals(signum).name, code, "listening on" in text))
        assert code == 0, (signal.Signals(signum).name, code, text)
        assert "Traceback" not in text, text
        assert not sock.exists(), (run, text)
        # The directory's socket is its service's (which the launch started, in the
        # background, to outlive it): it goes as the service ends, by the same signal.
        await _stop_services_of(state, signum)
        _end_keeper(state)
        assert not (state / "agent.sock").exists() and lock_holder(str(state)) is None, (run, text)
        log = state / "agent.log"
        assert not log.exists() or "Traceback" not in log.read_text(errors="replace"), log.read_text()
    print(outcomes)
    assert any(listening for _, _, listening in outcomes) and not all(listening for _, _, listening in outcomes)


async def test_a_signal_at_any_moment_of_the_services_start_up_ends_it_cleanly(tmp_path):
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    outcomes = []
    for run in range(RUNS):
        signum = signals[run % 3]
        state = tmp_path / f"state-{run}"
        process = await trio.lowlevel.open_process(
            agent_argv("service", "--state-dir", str(state), "--idle-exit", "never"), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env())
        stderr = b""
        try:
            with trio.fail_after(scaled(60)):
                if run % 4 == 3:  # right after it serves
                    while lock_holder(str(state)) is None or not (state / "agent.sock").exists():
                        assert process.poll() is None, "the service ended by itself"
                        await trio.sleep(0.005)
                else:  # anywhere in its start-up (once its own code runs), or a little after
                    while not _catches(process.pid, signal.SIGTERM):
                        assert process.poll() is None, "the service ended by itself"
                        await trio.sleep(0.001)
                    await trio.sleep(random.uniform(0, 0.4))
                serving = (state / "agent.sock").exists()
                process.send_signal(signum)
                while True:
                    data = await process.stderr.receive_some(4096)
                    if not data:
                        break
                    stderr += data
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            _end_keeper(state)
        text = stderr.decode(errors="replace")
        log = state / "agent.log"
        logged = log.read_text(errors="replace") if log.exists() else ""
        outcomes.append((signal.Signals(signum).name, code, serving))
        assert code == 0, (signal.Signals(signum).name, code, text, logged)
        assert "Traceback" not in text and "Traceback" not in logged, (text, logged)
        assert not (state / "agent.sock").exists() and lock_holder(str(state)) is None, (run, text, logged)
    print(outcomes)
    assert any(serving for _, _, serving in outcomes) and not all(serving for _, _, serving in outcomes)


def test_a_launch_gives_its_clients_the_sessions_own_bound():
    """The launch (which loads nothing of the agent) waits on a client that takes nothing for as
    long as a session does."""
    from proxy_agent import launch

    assert launch.CLOSE_BOUND == CLOSE_BOUND


def test_a_signal_that_lands_in_a_finalizer_still_stops_the_start_up(tmp_path):
    """Python prints and forgets an exception raised in a ``__del__``: a signal that arrives
    while one runs during start-up stops the start-up a moment later all the same, silently."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, signal, sys, threading, time\n"
        "from proxy_agent.launch import Signals, Stopped\n"
        "class Slow:\n"
        "    def __del__(self):\n"
        "        until = time.monotonic() + 0.5\n"
        "        while time.monotonic() < until:\n"
        "            pass\n"
        "signals = Signals().install()\n"
        "try:\n"
        "    finalized = Slow()\n"
        "    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "    del finalized  # the signal arrives while its __del__ runs\n"
        "    time.sleep(5)\n"
        "    print('not stopped')\n"
        "except Stopped:\n"
        "    print('stopped')\n")
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=subprocess_env(),
                          timeout=scaled(60))
    assert done.stdout == "stopped\n" and done.stderr == "", done
