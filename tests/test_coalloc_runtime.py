"""The runtime server in-process, and real job processes talking to it through
``proxy_agent.runtime`` and the ``proxy-runtime`` command, over the Unix socket and TCP."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
import trio

from proxy_agent.runtime import wire
from proxy_agent.service.coalloc.description import MultiJobDescription, Part
from proxy_agent.service.coalloc.server import RuntimeServer
from proxy_agent.service.coalloc.state import NotAllowed
from proxy_agent.service.jobs import JobState
from wait_support import scaled, scaled_program, settle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Unix sockets and SO_PEERCRED")

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = scaled(30)
PYTHON39 = Path("/root/.pyenv/versions/3.9.18/bin/python")
RUNTIME_CMD = [sys.executable, "-m", "proxy_agent.runtime"]  # what the proxy-runtime command runs


# --------------------------------------------------------------------------- harness


@pytest.fixture
async def server(nursery, tmp_path):
    runtime_server = RuntimeServer(
        unix_path=str(tmp_path / "runtime.sock"),
        tcp_host="127.0.0.1",
        frame_timeout=0.5,
        max_connections=64,
    )
    await nursery.start(runtime_server.run)
    return runtime_server


def base_env() -> Dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PROXY_AGENT_", "GLOBUS_GRAM_")) and name not in wire.RANK_VARIABLES
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


def process_env(server: RuntimeServer, job: str, part: int, rank: int, *, remote: bool = False) -> Dict[str, str]:
    env = base_env()
    env.update(server.environment(job, part, remote=remote))
    # what the local scheduler gives each process of a job
    env["PROXY_AGENT_PROCESS_INDEX"] = str(rank)
    return env


class Runs:
    """Processes started together; their outcomes by name."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.results: Dict[str, "trio.CompletedProcess[bytes]"] = {}
        self.done = trio.Event()
        self._pending = 0

    def start(self, name: str, argv: Sequence[str], env: Dict[str, str], stdin: bytes = b"", on_exit=None) -> None:
        self._pending += 1

        async def run() -> None:
            with trio.fail_after(TIMEOUT):
                result = await trio.run_process(
                    list(argv), env=env, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
                )
            self.results[name] = result
            if on_exit is not None:
                on_exit(result)
            self._pending -= 1
            if self._pending == 0:
                self.done.set()

        self.nursery.start_soon(run)

    async def wait(self) -> Dict[str, "trio.CompletedProcess[bytes]"]:
        with trio.fail_after(TIMEOUT):
            await self.done.wait()
        return self.results

    def output(self, name: str) -> dict:
        result = self.results[name]
        assert result.returncode == 0, (name, result.returncode, result.stderr.decode())
        return json.loads(result.stdout.decode().strip().splitlines()[-1])


def python(script: str, *args: str, interpreter: Optional[str] = None) -> List[str]:
    return [interpreter or sys.executable, "-c", scaled_program(script), *args]


async def wait_until(predicate, timeout: float = TIMEOUT) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


# --------------------------------------------------------------------------- the processes' programs

# Checks in at the barrier (late, if asked), publishes a TCP listener's host:port through
# the level-1 and level-2 rendezvous, and connects to every other process, which accept.
# Parts use the library, or the proxy-runtime command (argv[2] == "command").
MESH = r"""
import json, os, socket, subprocess, sys, threading, time
from proxy_agent import runtime

hold, style = sys.argv[1], sys.argv[2]  # hold: a file to wait for before checking in ("" for none)
command = [sys.executable, "-m", "proxy_agent.runtime", "--timeout", "30"]

def run_command(*args, data=b""):
    done = subprocess.run(command + list(args), input=data, capture_output=True, timeout=30)
    if done.returncode != 0:
        sys.exit("proxy-runtime %s failed (%d): %s" % (args, done.returncode, done.stderr.decode()))
    return done.stdout

me = (int(os.environ["PROXY_AGENT_PART"]), runtime.rank())
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(32)
contact = "127.0.0.1:%d" % listener.getsockname()[1]

while hold and not os.path.exists(hold):
    time.sleep(0.01)
checked_in = time.time()
if style == "command":
    index, parts = map(int, run_command("barrier").split())
else:
    passed = runtime.barrier(timeout=30)
    index, parts = passed.part_index, passed.parts
passed_at = time.time()

if style == "command":
    run_command("register", data=contact.encode())
    if runtime.rank() == 0:
        run_command("forward")
    peers = run_command("rendezvous", "--level", "2", "--items").decode().split()
else:
    runtime.register(contact.encode(), timeout=30)
    if runtime.rank() == 0:
        # register the part's aggregate at level 2 by hand, at the part's index
        aggregate = runtime.wait_rendezvous(1, timeout=30)
        runtime.register(aggregate, rank=index, level=2, timeout=30)
    peers = [item.decode() for item in runtime.rendezvous_items(level=2, timeout=30)]

others = [peer for peer in peers if peer != contact]
heard = []

def accept_all():
    for _ in others:
        conn, _ = listener.accept()
        heard.append(conn.makefile().readline().strip())
        conn.close()

acceptor = threading.Thread(target=accept_all)
acceptor.start()
for peer in others:
    host, port = peer.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(("%d/%d\n" % me).encode())
acceptor.join(timeout=30)
print(json.dumps({"me": list(me), "index": index, "parts": parts, "checked_in": checked_in,
                  "passed": passed_at, "peers": peers, "heard": sorted(heard)}))
"""


async def test_three_parts_pass_the_barrier_together_and_connect_through_the_rendezvous(server, nursery, tmp_path):
    description = MultiJobDescription(
        parts=[
            Part("/bin/app", queue="local:default", count=2, label="lib-unix"),
            Part("/bin/app", queue="slurm:debug", count=2, label="lib-tcp"),
            Part("/bin/app", queue="sge:all.q", count=2, label="command"),
        ]
    )
    job = server.register_job(description)
    runs = Runs(nursery)
    late = (2, 1)  # this process checks in last, once all the others wait at the barrier
    go = tmp_path / "go"
    for part, style, remote in ((0, "library", False), (1, "library", True), (2, "command", False)):
        for rank in range(2):
            runs.start(
                f"{part}/{rank}",
                python(MESH, str(go) if (part, rank) == late else "", style),
                process_env(server, job, part, rank, remote=remote),
            )
    await wait_until(lambda: server.job(job).barrier_waiting_for() == [late])
    assert not server.job(job).released
    go.touch()
    results = await runs.wait()
    outputs = [runs.output(name) for name in sorted(results)]
    # nobody passed before the last process had checked in
    last_check_in = max(out["checked_in"] for out in outputs)
    assert all(out["passed"] >= last_check_in for out in outputs)
    assert [out["me"] for out in outputs if out["checked_in"] == last_check_in] == [list(late)]
    contacts = outputs[0]["peers"]
    assert len(contacts) == 6 and len(set(contacts)) == 6
    for out in outputs:
        part, rank = out["me"]
        assert (out["index"], out["parts"]) == (part, 3)
        # every process got the same aggregate, in part then rank order
        assert out["peers"] == contacts
        assert out["heard"] == sorted(f"{p}/{r}" for p in range(3) for r in range(2) if (p, r) != (part, rank))
    assert server.job(job).state is JobState.RUNNING


async def test_the_environment_carries_contact_secret_and_handles(server):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a"), Part("/bin/b", count=3, label="two")]))
    local = server.environment(job, 1)
    remote = server.environment(job, 1, remote=True, rank=2)
    assert local[wire.ENV_CONTACT] == "unix://" + server.unix_path
    assert remote[wire.ENV_CONTACT].startswith("tcp://127.0.0.1:")
    assert len(local[wire.ENV_SECRET]) == 64 and local[wire.ENV_SECRET] == remote[wire.ENV_SECRET]
    assert local[wire.ENV_GRAM_JOB_HANDLE] == f"unix://{server.unix_path}?{job}/1"
    assert local[wire.ENV_GRAM_MULTIJOB_HANDLE] == f"unix://{server.unix_path}?{job}"
    assert wire.split_handle(remote[wire.ENV_GRAM_JOB_HANDLE]) == (remote[wire.ENV_CONTACT], job, 1)
    assert local[wire.ENV_GRAM_SUBJOB_RANK] == local[wire.ENV_PART_INDEX] == "1"
    assert (local[wire.ENV_PART], local[wire.ENV_PART_SIZE], local[wire.ENV_PARTS]) == ("1", "3", "2")
    assert local[wire.ENV_PART_LABEL] == "two" and wire.ENV_RANK not in local
    assert remote[wire.ENV_RANK] == "2"
    other = server.register_job(MultiJobDescription(parts=[Part("/bin/a")]))
    assert server.environment(other, 0)[wire.ENV_SECRET] != local[wire.ENV_SECRET]


# --------------------------------------------------------------------------- messages and the exchange

MESSAGES = r"""
import json, os, sys
from proxy_agent import runtime
part, rank = int(os.environ["PROXY_AGENT_PART"]), runtime.rank()
runtime.barrier(timeout=30)
out = {}
if part == 0:
    if rank == 1:
        runtime.send(0, "b", b"b1", timeout=30)
        runtime.send(0, "a", b"a1", timeout=30)
        runtime.send(2, "go", b"", timeout=30)
    elif rank == 2:
        runtime.receive("go", timeout=30)  # so that rank 0 gets b1, a1, a2 in this order
        runtime.send(0, "a", b"a2", timeout=30)
    else:
        # ask for "a" twice, then "b": the "b" that came first waits for its turn
        first = runtime.receive_message("a", timeout=30)
        second = runtime.receive_message("a", timeout=30)
        third = runtime.receive_message("b", timeout=30)
        out["intra"] = [[m.source, m.data.decode()] for m in (first, second, third)]
if rank == 0:
    layout = runtime.structure(timeout=30)
    out["structure"] = [layout.part_index, [[p.index, p.size, p.in_group] for p in layout.parts]]
    if part == 1:
        runtime.part_send(0, "x", b"x-from-1", timeout=30)
        runtime.part_send(0, "y", b"y-from-1", timeout=30)
    else:
        y = runtime.part_receive_message("y", timeout=30)
        x = runtime.part_receive_message("x", timeout=30)
        out["inter"] = [[y.source, y.data.decode()], [x.source, x.data.decode()]]
    out["exchange"] = list(runtime.exchange("text of part %d" % part, timeout=30))
print(json.dumps(out))
"""

# The same over the command line, for part 1's rank 0.
MESSAGES_COMMAND = r"""
set -e
rt() { "$PY" -m proxy_agent.runtime --timeout 30 "$@"; }
rt barrier >/dev/null
[ "$(rt rank)" = 0 ] && [ "$(rt size)" = 1 ]
rt structure > "$OUT.structure"
printf 'x-from-1' | rt part-send 0 x
printf 'y-from-1' | rt part-send 0 y
rt exchange "text of part 1" > "$OUT.exchange"
"""


async def test_messages_within_and_between_parts_and_the_exchange(server, nursery, tmp_path):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=3), Part("/bin/b", count=1)]))
    runs = Runs(nursery)
    for rank in range(3):
        runs.start(f"0/{rank}", python(MESSAGES), process_env(server, job, 0, rank, remote=rank == 2))
    env = process_env(server, job, 1, 0, remote=True)
    env.update(PY=sys.executable, OUT=str(tmp_path / "part1"))
    runs.start("1/0", ["/bin/sh", "-c", scaled_program(MESSAGES_COMMAND)], env)
    results = await runs.wait()
    assert results["1/0"].returncode == 0, results["1/0"].stderr.decode()
    zero = runs.output("0/0")
    assert zero["intra"] == [[1, "a1"], [2, "a2"], [1, "b1"]]
    assert zero["inter"] == [[1, "y-from-1"], [1, "x-from-1"]]
    assert zero["structure"] == [0, [[0, 3, True], [1, 1, True]]]
    assert zero["exchange"] == [0, [0, 1], ["text of part 0", "text of part 1"]]
    assert (tmp_path / "part1.structure").read_text() == "1\n0 3 group\n1 1 group\n"
    assert (tmp_path / "part1.exchange").read_text() == "text of part 0\ntext of part 1\n"
    for rank in (1, 2):
        assert runs.output(f"0/{rank}") == {}


# --------------------------------------------------------------------------- adding and deleting parts

BARRIER = r"""
import json, sys
from proxy_agent import runtime
try:
    passed = runtime.barrier(timeout=30)
except runtime.CoallocError as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}))
    sys.exit(error.exit_code)
print(json.dumps({"index": passed.part_index, "parts": passed.parts}))
"""


async def test_parts_added_and_deleted_before_the_release_and_refused_after(server, nursery):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", label="a"), Part("/bin/b", label="b")]))
    runs = Runs(nursery)
    runs.start("a", python(BARRIER), process_env(server, job, 0, 0))
    await wait_until(lambda: server.job(job).barrier_waiting_for() == [(1, 0)])
    added = server.add_part(job, Part("/bin/c", label="c", count=2))
    assert server.delete_part(job, "b") == 1
    # a process of the deleted part is told so
    deleted_env = process_env(server, job, 0, 0)
    deleted_env[wire.ENV_PART] = "1"
    runs.start("b", python(BARRIER), deleted_env)
    assert not server.job(job).released
    for rank in range(2):
        runs.start(f"c/{rank}", python(BARRIER), process_env(server, job, added, rank, remote=True))
    results = await runs.wait()
    assert runs.output("a") == {"index": 0, "parts": 2}
    assert runs.output("c/0") == runs.output("c/1") == {"index": 1, "parts": 2}
    assert results["b"].returncode == 1
    assert "part #1 was deleted" in json.loads(results["b"].stdout)["message"]
    with pytest.raises(NotAllowed, match="released"):
        server.add_part(job, Part("/bin/d"))
    with pytest.raises(NotAllowed, match="released"):
        server.delete_part(job, "c")


# --------------------------------------------------------------------------- a strict part ending early


async def test_a_strict_part_ending_before_the_barrier_fails_the_job_and_the_waiting_barriers(server, nursery):
    job = server.register_job(
        MultiJobDescription(parts=[Part("/bin/a", count=2, label="waits"), Part("/bin/b", label="dies")])
    )
    verdicts = []
    runs = Runs(nursery)
    runs.start("waits/0", python(BARRIER), process_env(server, job, 0, 0))
    runs.start(
        "waits/1",
        RUNTIME_CMD + ["barrier"],
        process_env(server, job, 0, 1, remote=True),
    )
    await wait_until(lambda: server.job(job).barrier_waiting_for() == [(1, 0)])

    def died(result) -> None:
        # what the service does when the scheduler reports the process's end
        verdicts.append(server.process_ended(job, 1, 0, failed=result.returncode != 0))

    runs.start("dies/0", python("import sys; sys.exit(3)"), process_env(server, job, 1, 0), on_exit=died)
    results = await runs.wait()
    (verdict,) = verdicts
    assert verdict.failed and set(verdict.cancel_parts) == {0, 1}
    assert "process 0 of part 1 ('dies') failed before the start barrier was released" in verdict.reason
    assert server.job(job).state is JobState.FAILED
    library = results["waits/0"]
    assert library.returncode == 5
    assert json.loads(library.stdout) == {
        "error": "JobEnded",
        "message": f"the multi-part job failed: {verdict.reason}",
    }
    command = results["waits/1"]
    assert command.returncode == 5
    assert "proxy-runtime: barrier: the multi-part job failed: process 0 of part 1" in command.stderr.decode()


async def test_cancelling_fails_waiting_calls_and_forgetting_refuses_the_secret(server):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=2)]))
    env = process_env(server, job, 0, 0)
    waiting = await trio.lowlevel.open_process(
        RUNTIME_CMD + ["barrier"], env=env, stdout=-1, stderr=-1
    )
    try:
        await wait_until(lambda: server.job(job).barrier_waiting_for() == [(0, 1)])
        verdict = server.cancel(job, "no longer wanted")
        assert verdict.cancelled and verdict.cancel_parts == (0,)
        with trio.fail_after(TIMEOUT):
            assert await waiting.wait() == 5
        assert b"cancelled: no longer wanted" in await waiting.stderr.receive_some(4096)
    finally:
        waiting.kill()
    server.forget(job)
    after = await trio.run_process(RUNTIME_CMD + ["info"], env=env, capture_stderr=True, check=False)
    assert after.returncode == 3 and b"secret" in after.stderr


# --------------------------------------------------------------------------- other interpreters


@pytest.mark.skipif(not PYTHON39.exists(), reason="no Python 3.9 interpreter here")
async def test_the_runtime_works_on_python_39_without_trio(server, nursery):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=2)]))
    script = r"""
import json, sys
from proxy_agent import runtime
runtime.barrier(timeout=30)
runtime.register(b"rank %d" % runtime.rank(), rank=runtime.rank(), timeout=30)
items = runtime.rendezvous_items(1, timeout=30)
print(json.dumps({"version": list(sys.version_info[:2]), "trio": "trio" in sys.modules,
                  "attrs": "attr" in sys.modules, "items": [i.decode() for i in items]}))
"""
    runs = Runs(nursery)
    for rank in range(2):
        runs.start(str(rank), python(script, interpreter=str(PYTHON39)), process_env(server, job, 0, rank))
    await runs.wait()
    for rank in range(2):
        assert runs.output(str(rank)) == {
            "version": [3, 9],
            "trio": False,
            "attrs": False,
            "items": ["rank 0", "rank 1"],
        }


# --------------------------------------------------------------------------- hostile clients


class RawClient:
    """Speaks to the server byte by byte, as no well-behaved process would."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = wire.FrameDecoder()

    @classmethod
    async def unix(cls, server: RuntimeServer) -> "RawClient":
        return cls(await trio.open_unix_socket(server.unix_path))

    @classmethod
    async def tcp(cls, server: RuntimeServer) -> "RawClient":
        host, port = wire.parse_contact(server.tcp_contact)[1]
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self) -> Optional[dict]:
        """The next reply, or None when the server closed the connection."""
        with trio.fail_after(scaled(30)):
            while True:
                message = self.decoder.next()
                if message is not None:
                    return message
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.decoder.feed(data)

    async def closed(self) -> bool:
        with trio.fail_after(scaled(30)):
            try:
                return await self.stream.receive_some(1) == b""
            except trio.BrokenResourceError:
                return True


def request(server: RuntimeServer, for_job: str, op: str = "hello", **fields) -> dict:
    message = {"v": 1, "id": 1, "op": op, "job": for_job, "part": 0, "rank": 0, "secret": server.secret(for_job)}
    message.update(fields)
    return message


async def healthy(server: RuntimeServer, job: str) -> None:
    client = await RawClient.tcp(server)
    await client.send(wire.encode_frame(request(server, job)))
    reply = await client.reply()
    assert reply["ok"] and reply["job"] == job


async def test_hostile_clients_are_refused_and_the_server_keeps_serving(server):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=2)]))
    before = server.violations

    # text where a length should be: 'GET ' is a length of over a gigabyte
    client = await RawClient.tcp(server)
    await client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = await client.reply()
    assert reply["error"]["kind"] == "protocol" and "frame length" in reply["error"]["message"]
    assert await client.closed()
    await healthy(server, job)

    # a huge declared length, and then nothing: refused at once, nothing allocated
    client = await RawClient.unix(server)
    await client.send(struct.pack(">I", 0xFFFFFFFF))
    assert (await client.reply())["error"]["kind"] == "protocol"

    # a frame that is not JSON, and one that is JSON but not an object
    for body in (b"\xff\xfe{", b"[1, 2]"):
        client = await RawClient.tcp(server)
        await client.send(struct.pack(">I", len(body)) + body)
        assert (await client.reply())["error"]["kind"] == "protocol"
        assert await client.closed()

    # the wrong secret, and a job that does not exist, get the same answer
    for fields in ({"secret": "0" * 64}, {"job": "mj-nope"}, {"secret": "\udcff"}):
        client = await RawClient.tcp(server)
        message = request(server, job, **fields)
        await client.send(_raw_frame(message))
        reply = await client.reply()
        assert reply["error"] == {
            "kind": "unauthorized",
            "message": "the job's secret does not match (or there is no such job)",
        }
        assert await client.closed()

    # unknown operation, wrong version, missing fields: protocol errors
    for fields in ({"op": "explode"}, {"v": 2}, {"part": "zero"}):
        client = await RawClient.unix(server)
        await client.send(wire.encode_frame(request(server, job, **fields)))
        assert (await client.reply())["error"]["kind"] == "protocol"

    # bad arguments are refused, and the same connection goes on
    client = await RawClient.tcp(server)
    for fields, words in (
        ({"op": "send", "dest": 1, "tag": "t", "data": "***"}, "not valid base64"),
        ({"op": "send", "dest": "one", "tag": "t", "data": ""}, "'dest' must be a whole number"),
        ({"op": "send", "dest": 5, "tag": "t", "data": ""}, "destination rank 5 is outside part 0"),
        ({"op": "receive", "tag": 7}, "'tag' must be str"),
        ({"rank": 9}, "rank 9 is outside part 0"),
        ({"op": "register", "level": 7, "data": ""}, "level is 1"),
    ):
        await client.send(wire.encode_frame(request(server, job, **fields)))
        reply = await client.reply()
        assert reply["ok"] is False and reply["error"]["kind"] == "bad-request", reply
        assert words in reply["error"]["message"]
    await client.send(wire.encode_frame(request(server, job)))
    assert (await client.reply())["ok"]

    # a frame that starts and stalls is cut off after the frame timeout
    client = await RawClient.unix(server)
    await client.send(struct.pack(">I", 100) + b'{"v": 1')
    assert await client.closed()

    # a client that goes away while it waits at the barrier: the server carries on
    client = await RawClient.tcp(server)
    await client.send(wire.encode_frame(request(server, job, op="barrier")))
    await wait_until(lambda: server.job(job).barrier_waiting_for() == [(0, 1)])
    await client.stream.aclose()
    # a client that sends more while it waits is cut off
    client = await RawClient.unix(server)
    await client.send(wire.encode_frame(request(server, job, op="receive", tag="never")))
    await settle()
    await client.send(wire.encode_frame(request(server, job)))
    assert await client.closed()

    # a flood of garbage over many connections at once
    async def garbage(n: int) -> None:
        flood = await RawClient.tcp(server)
        await flood.send(os.urandom(64) + bytes([n]))
        await flood.closed()

    async with trio.open_nursery() as nursery:
        for n in range(40):
            nursery.start_soon(garbage, n)

    assert server.violations - before >= 50
    await healthy(server, job)
    assert not server.job(job).released  # nothing hostile moved the job


def _raw_frame(message: dict) -> bytes:
    body = json.dumps(message).encode()  # escapes the lone surrogate as \udcff
    return struct.pack(">I", len(body)) + body


async def test_too_many_connections_are_closed_and_service_resumes(nursery, tmp_path):
    small = RuntimeServer(unix_path=str(tmp_path / "small.sock"), max_connections=2)
    await nursery.start(small.run)
    job = small.register_job(MultiJobDescription(parts=[Part("/bin/a")]))
    idle = [await trio.open_unix_socket(small.unix_path) for _ in range(2)]
    await settle()
    extra = RawClient(await trio.open_unix_socket(small.unix_path))
    assert await extra.closed()
    for stream in idle:
        await stream.aclose()
    await settle()
    client = RawClient(await trio.open_unix_socket(small.unix_path))
    await client.send(wire.encode_frame(request(small, job)))
    assert (await client.reply())["ok"]


async def test_a_unix_socket_left_behind_is_replaced_but_a_file_is_not(nursery, tmp_path):
    path = tmp_path / "stale.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    fresh = RuntimeServer(unix_path=str(path))
    await nursery.start(fresh.run)
    assert (os.stat(path).st_mode & 0o777) == 0o600
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me")
    with pytest.raises(OSError, match="not a socket"):
        await nursery.start(RuntimeServer(unix_path=str(regular)).run)
    assert regular.read_text() == "keep me"


# --------------------------------------------------------------------------- the documented example

EXAMPLES = ROOT / "docs" / "examples" / "coalloc"


@pytest.mark.parametrize("description_file", ["mesh.json", "hello.rsl"])
async def test_the_documented_example_runs_as_the_local_scheduler_would_run_it(
    server, nursery, tmp_path, description_file
):
    """Set up as docs/coallocation.md says (the example and a copy of the runtime in one
    directory), then start each part's processes the way the local scheduler does."""
    from proxy_agent.service.coalloc.description import parse_description
    import shutil

    demo = tmp_path / "coalloc-demo"
    shutil.copytree(EXAMPLES, demo)
    (demo / "proxy_agent").mkdir()
    shutil.copy(ROOT / "proxy_agent" / "__init__.py", demo / "proxy_agent")
    shutil.copytree(ROOT / "proxy_agent" / "runtime", demo / "proxy_agent" / "runtime")
    text = (demo / description_file).read_text().replace("/tmp/coalloc-demo", str(demo))
    description = parse_description(text)
    job = server.register_job(description)
    runs = Runs(nursery)
    for part_id, part in enumerate(description.parts):
        assert part.queue == "local:default"
        for rank in range(part.count):
            env = process_env(server, job, part_id, rank)
            del env["PYTHONPATH"]  # the copied runtime is all the processes have
            env.update(part.environment)
            env["MESH_HOST"] = "127.0.0.1"
            runs.start(f"{part_id}/{rank}", [part.executable, *part.arguments], env)
    results = await runs.wait()
    lines = {}
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stdout.decode(), result.stderr.decode())
        lines[name] = result.stdout.decode()
    if description_file == "mesh.json":
        for name, out in lines.items():
            part, rank = name.split("/")
            assert out.startswith(f"part {part} rank {rank} at 127.0.0.1:")
            assert out.rstrip().endswith("connected to 5 peers, heard from 5")
    else:
        for name, out in lines.items():
            part, rank = name.split("/")
            header, *seen = out.splitlines()
            assert header == f"part {part} rank {rank} sees:"
            assert [line.split(" is ")[1] for line in seen] == [
                "rank 0 of part 0 (of 2)",
                "rank 1 of part 0 (of 2)",
                "rank 0 of part 1 (of 2)",
                "rank 1 of part 1 (of 2)",
            ]


# --------------------------------------------------------------------------- the service's API


async def test_explicit_release_and_watching_the_job_through_the_service_api(server, nursery):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a")], barrier_release="explicit"))
    waiting = await RawClient.unix(server)
    await waiting.send(wire.encode_frame(request(server, job, op="barrier")))
    await wait_until(lambda: server.job(job).barrier_waiting_for() == [])
    version = server.job(job).version
    changes = []

    async def watch() -> None:
        changes.append(await server.wait_changed(job, version, timeout=TIMEOUT))

    nursery.start_soon(watch)
    await settle()
    assert changes == [] and server.job(job).state is JobState.PREPARING
    assert server.release_barrier(job) is True
    reply = await waiting.reply()
    assert reply["ok"] and (reply["part_index"], reply["parts"], reply["final"]) == (0, 1, True)
    await wait_until(lambda: changes)
    assert changes[0] > version and server.job(job).state is JobState.RUNNING


async def test_a_part_that_cannot_be_submitted_fails_the_job_and_its_waiting_processes(server):
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=2), Part("/bin/b")]))
    receiver = await RawClient.tcp(server)
    await receiver.send(wire.encode_frame(request(server, job, op="receive", tag="t")))
    await settle()
    verdict = server.fail(job, "part 1 could not be submitted: no queue 'nowhere'")
    assert verdict.failed and verdict.cancel_parts == (0, 1)
    reply = await receiver.reply()
    assert reply["error"] == {
        "kind": "job-ended",
        "message": "the multi-part job failed: part 1 could not be submitted: no queue 'nowhere'",
    }
    with pytest.raises(Exception, match="no multi-part job"):
        server.part_ended("mj-unknown", 0)


# --------------------------------------------------------------------------- the TCP contact


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


async def test_tcp_contact_names_this_host_as_other_hosts_reach_it(nursery):
    """Listening on every interface, the contact given to processes on other hosts names
    this host by a name or address that is not loopback (a host whose own name resolves to
    127.0.0.1 must not send compute nodes to themselves), and the runtime answers there."""
    from proxy_agent.service.coalloc.contact import _interface_addresses
    if not _interface_addresses():
        pytest.skip("this machine has no address other than loopback")
    server = RuntimeServer(tcp_host="0.0.0.0")
    await nursery.start(server.run)
    scheme, (host, port) = wire.parse_contact(server.tcp_contact)
    assert scheme == "tcp" and host != "localhost"
    addresses = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    assert addresses and not any(_loopback(a) for a in addresses), (host, addresses)
    client = await RawClient.tcp(server)
    await client.stream.aclose()


async def test_an_advertised_name_wins(nursery):
    server = RuntimeServer(tcp_host="0.0.0.0", advertise_host="gateway.cluster.example")
    await nursery.start(server.run)
    assert wire.parse_contact(server.tcp_contact)[1][0] == "gateway.cluster.example"
