"""Helpers shared by tests that talk to an agent: a scripted fake agent and the real one's command line.

Import from test modules (``from agent_fixtures import FakeAgent``); pytest puts
this directory on ``sys.path``.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Deque, Iterator, List, Optional, Sequence, Tuple

import trio

from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES
from proxy_agent.protocol.dialect import NATIVE, Dialect
from proxy_agent.protocol.messages import (
    AttrDef,
    Command,
    CommandId,
    ElementGroup,
    ElementKind,
    Event,
    NewElements,
    Ok,
)
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import Decoder, FrameError
from leftover_support import RUN_VARIABLE
from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent
AGENT_MAIN = ROOT / "proxy_agent" / "__main__.py"


def agent_present() -> bool:
    """The agent's command line exists (end-to-end tests are skipped until it does)."""
    return AGENT_MAIN.exists()


def agent_argv(*args: str) -> List[str]:
    """The real agent with this interpreter: ``python -m proxy_agent ARGS``."""
    return [sys.executable, "-m", "proxy_agent", *args]


def console_argv(*args: str) -> List[str]:
    return [sys.executable, "-m", "proxy_agent.console", *args]


#: The state homes subprocess_env made, where agents the tests start keep their state (and
#: where the services they start run: see stop_services).
STATE_HOMES: List[str] = []


def subprocess_env(**extra: str) -> dict:
    """The environment for child processes: this checkout importable, no colour, no pager.

    Every agent a test starts gets a state directory of its own (one service per directory),
    and the run's own HOME (for the files agents keep there: batch output spools, tokens),
    both inside the run's area, which is removed when the run ends (see leftover_support)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PROXY_AGENT_TOKEN", None)
    # no configuration file but one a test writes there (never the user's own)
    area = os.environ.get(RUN_VARIABLE)
    if area:
        env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="state-", dir=os.path.join(area, "agents"))
        env["HOME"] = os.path.join(area, "home")
    else:  # imported outside a test run
        env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="proxy-agent-test-state-")
    STATE_HOMES.append(env["XDG_STATE_HOME"])
    env["XDG_CONFIG_HOME"] = env["XDG_STATE_HOME"]
    env.pop("PROXY_AGENT_CONFIG", None)
    env.update(extra)
    return env


def services_under(root: str, depth: int = 4) -> List[str]:
    """The state directories under ``root`` (to ``depth`` levels) held by a running process."""
    from proxy_agent.endpoints import lock_holder

    found = []
    for directory, subdirectories, files in os.walk(root):
        if directory[len(root):].count(os.sep) >= depth:
            subdirectories[:] = []
        subdirectories[:] = [d for d in subdirectories if d not in ("local", "jobs")]
        if "agent.lock" in files and lock_holder(directory) is not None:
            found.append(directory)
    return found


def stop_services(roots: Sequence[str]) -> None:
    """Stop the service of every state directory under ``roots``, ending its local jobs (a
    service outlives the launches that started it: a test must not leave one behind)."""
    import signal

    from proxy_agent.endpoints import lock_holder
    from proxy_agent.launch import LaunchError, stop_service

    def stop(directory: str) -> None:
        try:
            stop_service(directory, end_jobs=True, timeout=scaled(15))
        except LaunchError:
            pid = (lock_holder(directory) or {}).get("pid")
            if isinstance(pid, int):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    roots = [os.path.abspath(str(root)) for root in roots if os.path.isdir(root)]
    for root in roots:
        for directory in services_under(root):
            stop(directory)
    # A service a launch forked just before the test ended does not hold its directory yet:
    # waited for until it does (then stopped) or has left.
    deadline = time.monotonic() + scaled(15)
    while True:
        starting = _agent_processes(roots, "service")
        if not starting:
            break
        if time.monotonic() > deadline:
            for pid, _directory in starting:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        for _pid, directory in starting:
            if lock_holder(directory) is not None:
                stop(directory)
        time.sleep(0.05)
    # A keeper whose service has gone (one that left while starting) would leave by itself
    # once idle for a while; a test ends it now.
    for pid, directory in _agent_processes(roots, "keeper"):
        if lock_holder(directory) is None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _agent_processes(roots: Sequence[str], kind: str) -> List[tuple]:
    """(pid, state directory) of the services (``kind`` "service": ``proxy-agent service
    --state-dir DIR``) or keepers ("keeper": ``proxy_agent.schedulers.keeper DIR/local``) whose
    state directory is under one of ``roots``."""
    found = []
    for pid, words in _command_lines():
        directory = None
        if kind == "service" and "service" in words and "--state-dir" in words:
            index = words.index("--state-dir")
            if index + 1 < len(words) and "service" in words[:index]:
                directory = os.path.abspath(words[index + 1])
        elif kind == "keeper" and "proxy_agent.schedulers.keeper" in words:
            index = words.index("proxy_agent.schedulers.keeper")
            if index + 1 < len(words):
                directory = os.path.dirname(os.path.abspath(words[index + 1]))
        if directory is not None and any(directory == root or directory.startswith(root + os.sep) for root in roots) \
                and not process_gone(pid):
            found.append((pid, directory))
    return found


def _command_lines() -> Iterator[Tuple[int, List[str]]]:
    """(pid, command line as words) of every process that can be read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                yield int(entry), [word.decode(errors="replace") for word in file.read().split(b"\0")]
        except OSError:
            continue


def service_pid(state_dir) -> int:
    """The pid of the service holding a state directory (AssertionError when none does)."""
    from proxy_agent.endpoints import lock_holder

    holder = lock_holder(str(state_dir))
    assert holder is not None and isinstance(holder.get("pid"), int), f"no service holds {state_dir}"
    return holder["pid"]


def processes_of(state_dir) -> List[tuple]:
    """The processes whose command line names a state directory (``--state-dir DIR``), as
    (pid, whether it is that directory's service: ``proxy-agent service``); a service a launch
    has just forked may still show the launch's command line for a moment, and a child the
    service has just forked the service's."""
    wanted = os.path.abspath(str(state_dir))
    found = []
    for pid, words in _command_lines():
        if "--state-dir" in words:
            index = words.index("--state-dir")
            if index + 1 < len(words) and os.path.abspath(words[index + 1]) == wanted and not process_gone(pid):
                found.append((pid, "service" in words[:index]))
    # a service's own child, forked and not yet executing what it runs, shows its command line
    services = {pid for pid, service in found if service}
    return [(pid, service and _parent(pid) not in services) for pid, service in found]


def _parent(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return int(file.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def service_processes(state_dir) -> List[int]:
    """The pids of the services started for a state directory (``proxy-agent service
    --state-dir DIR``), whether or not they hold it yet (one may still be starting)."""
    return [pid for pid, service in processes_of(state_dir) if service]


def process_gone(pid: int) -> bool:
    """Has the process ended (gone, or a zombie waiting for its parent; not while its other
    threads are still being ended, which hold its files)?"""
    try:
        with open(f"/proc/{pid}/stat") as file:
            if file.read().rpartition(")")[2].split()[0] != "Z":
                return False
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


def stored_jobs(env: dict) -> List[dict]:
    """The jobs the store of the agent started with ``env`` holds, as ``proxy-agent jobs
    --json`` lists them (with or without the agent running).  A job's end is in the store
    once the agent has taken it in: a test that must know the agent has seen something
    happen, without being told through events, waits for it here."""
    import json
    import subprocess

    done = subprocess.run(agent_argv("jobs", "--json"), capture_output=True, text=True, env=env, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def start_up_probe(tmp_path: Path, before: Sequence[str], after: Sequence[str], stdin: bytes = b""):
    """Run the service's whole start-up in a child Python, until a stdio launch that sends it
    ``stdin`` has ended and the service has been stopped: the lines ``before`` run first, the
    service next, then the lines ``after``, which write what they found to the file named
    ``OUT``.  Returns (the finished process, its ``stdout`` replaced by what the launch wrote
    to its stdout, and the text written to OUT).  Files are used because the service points
    its own stdio elsewhere as it starts."""
    import subprocess
    import types

    out = tmp_path / "loaded"
    answer = tmp_path / "answer"
    state = tmp_path / "state"
    probe = "\n".join([
        "import runpy, sys, threading, subprocess, os, time",
        *before,
        "def launch():",
        "    while not os.path.exists(os.path.join(STATE, 'agent.sock')):",
        "        time.sleep(0.01)",
        "    done = subprocess.run([sys.executable, '-m', 'proxy_agent', '--stdio', '--state-dir', STATE],",
        "                          input=INPUT, capture_output=True, timeout=60)",
        "    open(ANSWER, 'wb').write(done.stdout)",
        "    from proxy_agent.frontends.api.wire import call",
        "    call(os.path.join(STATE, 'agent.sock'), {'op': 'stop', 'version': 1})",
        "threading.Thread(target=launch, daemon=True).start()",
        "sys.argv = ['proxy-agent', 'service', '--state-dir', STATE, '--idle-exit', 'never']",
        "try:",
        "    runpy.run_module('proxy_agent', run_name='__main__')",
        "except SystemExit:",
        "    pass",
        *after,
    ]).replace("OUT", repr(str(out))).replace("ANSWER", repr(str(answer))).replace("STATE", repr(str(state)))
    probe = probe.replace("INPUT", repr(stdin))
    env = subprocess_env(XDG_STATE_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env, timeout=scaled(90))
    assert done.returncode == 0, done.stderr
    finished = types.SimpleNamespace(returncode=done.returncode, stdout=answer.read_bytes(), stderr=done.stderr)
    return finished, out.read_text()


def free_port() -> int:
    """A TCP port that was free a moment ago (for agents that need a fixed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ids(text: str) -> RangeSet:
    return RangeSet.parse(text)


class FakeAgent:
    """Plays the agent over a stream, one scripted step at a time.

    ``await fake.expect(CommandId.INIT)`` reads the next command and checks
    its id; ``await fake.send(event, ...)`` writes events, encoded in
    ``dialect``; ``send_raw`` writes any bytes (for malformed frames).
    """

    def __init__(self, stream: trio.abc.Stream, dialect: Dialect = NATIVE) -> None:
        self.stream = stream
        self.dialect = dialect
        self.decoder = Decoder()
        self.pending: Deque[Command] = deque()
        self.received: List[Command] = []
        self.base_id = 1000

    async def command(self, timeout: float = scaled(30)) -> Command:
        with trio.fail_after(timeout):
            while not self.pending:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("the client closed the connection")
                self.decoder.feed(data)
                for item in self.decoder:
                    assert not isinstance(item, FrameError), f"client sent a malformed frame: {item}"
                    self.pending.append(Command.from_frame(item))
        command = self.pending.popleft()
        self.received.append(command)
        return command

    async def expect(self, command_id: CommandId, timeout: float = scaled(30)) -> Command:
        command = await self.command(timeout)
        assert command.command_id == command_id, f"expected {command_id.name}, got {command.name} {command.args}"
        return command

    async def send(self, *events: Event) -> None:
        await self.stream.send_all(b"".join(self.dialect.encode(event) for event in events))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    def initial_model(self, tid: int) -> Sequence[Event]:
        """A machine with two nodes and one queue under base id 1000."""
        base = str(self.base_id)
        return [
            NewElements(tid, ElementKind.MACHINE, base, [ElementGroup(ids("1001"), [("name", "m0"), ("machineState", "UP")])]),
            NewElements(tid, ElementKind.QUEUE, base, [ElementGroup(ids("1002"), [("name", "default"), ("queueState", "NORMAL")])]),
            NewElements(
                tid,
                ElementKind.NODE,
                "1001",
                [ElementGroup(ids("1003-1004"), [("nodeState", "UP")])],
            ),
        ]

    async def handshake(self, *, model: bool = True) -> int:
        """Answer INIT, MODEL_DEF and START_EVENTS; returns the START_EVENTS TID."""
        init = await self.expect(CommandId.INIT)
        await self.send(Ok(init.tid))
        model_def = await self.expect(CommandId.MODEL_DEF)
        definitions = self.dialect.attribute_definitions(STANDARD_ATTRIBUTES)
        await self.send(AttrDef(model_def.tid, definitions[:10]), AttrDef(model_def.tid, definitions[10:]), Ok(model_def.tid))
        start = await self.expect(CommandId.START_EVENTS)
        if model:
            await self.send(*self.initial_model(start.tid))
        await self.answer_fence()
        return start.tid

    async def answer_fence(self) -> None:
        """The client follows START_EVENTS with LIST_FILTERS, answered once the initial model is out."""
        fence = await self.expect(CommandId.LIST_FILTERS)
        await self.send(Ok(fence.tid))


def stderr_so_far(process) -> str:
    return process.stderr_tail(lines=1000)


class BackgroundAgent:
    """A real agent serving on a socket (``--listen`` / ``--unix``) for the length of a block.

    ``async with BackgroundAgent("--unix", path) as agent:`` returns once the
    agent says it is listening; the block's end terminates and reaps it.
    """

    def __init__(self, *args: str, env: dict = None) -> None:
        self.args = args
        self.env = env
        self.process = None
        self._nursery_cm = None

    async def __aenter__(self) -> "BackgroundAgent":
        from proxy_agent.client import AgentProcess

        self.process = await AgentProcess.start(agent_argv(*self.args), env=self.env or subprocess_env(), stdio=False)
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        nursery.start_soon(self.process.pump_stderr)
        try:
            with trio.fail_after(scaled(30)):
                while "listening on" not in stderr_so_far(self.process):
                    if self.process.returncode is not None:
                        raise AssertionError(f"the agent exited early: {stderr_so_far(self.process)}")
                    await trio.sleep(0.02)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self.process.returncode is None:
            self.process.process.terminate()
        await self.process.reap(0.0)
        await self._nursery_cm.__aexit__(None, None, None)


def ptp_view(model, base_id: int) -> dict:
    """What a PTP client with ``base_id`` should hold of the service model: id -> (kind,
    parent id, attributes as lists of values), rendered by a fresh view's snapshot."""
    from proxy_agent.frontends.ptp.view import ModelView
    from proxy_agent.protocol.messages import decode_event
    from proxy_agent.protocol.wire import Frame

    view = ModelView(model, base_id)
    seen: dict = {}
    try:
        for chunk in view.subscribe():
            for event_id, args in chunk:
                event = decode_event(Frame(int(event_id), 1, tuple(args)))
                kind = event.kind.value
                parent = str(int(event.parent_id))
                for group in event.groups:
                    attrs: dict = {}
                    for key, value in group.attributes:
                        attrs.setdefault(key, []).append(value)
                    for ref in group.ids:
                        eid = f"{parent}:{ref}" if kind == "process" else str(ref)
                        seen[eid] = (kind, parent, attrs)
    finally:
        view.unsubscribe()
    return seen


def mirror_view(client) -> dict:
    """The client's mirror in the shape of :func:`ptp_view` (output left out)."""
    out = {}
    for element in client.state.elements.values():
        if element.removed or element.kind == "rm":
            continue
        eid = f"{element.parent}:{element.id}" if element.kind == "process" else element.id
        attrs = {
            k: (list(v) if isinstance(v, list) else [v])
            for k, v in element.attributes.items()
            if k not in ("processStdout", "processStderr")
        }
        out[eid] = (element.kind, element.parent, attrs)
    return out


def model_difference(model, client, base_id: int):
    """None if the client's mirror equals what the service model renders to, else the first
    difference found."""
    truth = ptp_view(model, base_id)
    mirror = mirror_view(client)
    if set(mirror) != set(truth):
        only_mirror = sorted(set(mirror) - set(truth))[:5]
        only_agent = sorted(set(truth) - set(mirror))[:5]
        return f"ids differ: only in mirror {only_mirror}, only in agent {only_agent}"
    for eid, expected in truth.items():
        if mirror[eid] != expected:
            return f"element {eid}: mirror {mirror[eid]} != agent {expected}"
    return None
