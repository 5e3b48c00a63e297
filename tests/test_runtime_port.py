"""The runtime port before authentication: what a peer without a job's secret can cost.

* A huge unauthenticated request is refused on its length, before its body is kept: the
  agent's memory does not grow with it (the agent as a subprocess, its RSS read from /proc).
* Held partial requests cost no more than the small first request allowed.
* Idle or slow connections: a handful per peer address are kept, the rest closed, and a
  local multi-part job's processes (on the Unix socket) pass their barrier beside hundreds
  of idle TCP connections.
* A legitimate large request still goes through: the runtime library shows the secret first.
* ``auto`` listens on the addresses compute nodes reach this host by, not on every
  interface; every interface is asked for explicitly.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import textwrap

import pytest
import trio

from agent_fixtures import agent_argv, free_port, service_pid, subprocess_env
from wait_support import scaled, settle, wait_until
from proxy_agent.__main__ import parse_arguments, runtime_settings
from proxy_agent.client import AgentClient
from proxy_agent.protocol.messages import CommandId
from proxy_agent.runtime import Runtime, wire
from proxy_agent.service.coalloc.description import MultiJobDescription, Part
from proxy_agent.service.coalloc.server import AUTH_FRAME, RuntimeServer, auto_addresses, reachable_host

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Unix sockets and /proc")

#: Waits at the barrier, then says so.
WAITER = textwrap.dedent("""
    from proxy_agent import runtime
    passed = runtime.barrier(timeout=120)
    print("PASSED", passed.part_index, runtime.rank(), flush=True)
""")


def closed_now(stream: trio.SocketStream) -> bool:
    """Has the other end closed the connection (looked at without waiting)?"""
    with socket.socket(fileno=os.dup(stream.socket.fileno())) as peek:
        try:
            return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:  # reset
            return True


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _start(client: AgentClient) -> None:
    await client.reply(await client.send_command(CommandId.INIT, ["version=2.0", "baseId=1000"]), scaled(30))
    await client.model_def()
    await client.start_events()


def _parts(script: str, count: int) -> str:
    part = {"queue": "local:default", "count": count, "executable": sys.executable, "arguments": [script]}
    return json.dumps({"parts": [part, dict(part, count=1)]})


async def _runtime_listening(port: int) -> None:
    with trio.fail_after(scaled(30)):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def test_unauthenticated_peers_cost_bounded_memory_and_never_lock_out_local_processes(tmp_path):
    port = free_port()
    waiter = tmp_path / "waiter.py"
    waiter.write_text(WAITER)
    argv = agent_argv("--scheduler", "local", "--runtime-tcp", f"127.0.0.1:{port}")
    env = subprocess_env()
    with trio.fail_after(scaled(120)):
        async with await AgentClient.spawn(argv, env=env) as client:
            await _start(client)
            first = await client.cosubmit(_parts(str(waiter), 1))  # starts the runtime server
            await _runtime_listening(port)
            await client.wait_for(lambda: client.job(first).get("jobStatus") == "FINISHED", scaled(60),
                                  description="a first multi-part job")
            pid = service_pid(os.path.join(env["XDG_STATE_HOME"], "proxy-agent"))  # the runtime port's process
            before = rss_kib(pid)

            # one request of 24 MiB, and twenty held half-way, all without a secret
            big = await trio.open_tcp_stream("127.0.0.1", port)
            await big.send_all(struct.pack(">I", wire.MAX_FRAME))
            refused = await big.receive_some(65536)
            assert refused, "the agent did not answer a request it will not take"
            reply = json.loads(refused[4:])
            assert reply["error"]["kind"] == "protocol" and str(AUTH_FRAME) in reply["error"]["message"]
            try:
                for _ in range(24 * 16):  # what the old agent read and kept: it goes nowhere now
                    await big.send_all(b"x" * 65536)
            except trio.BrokenResourceError:
                pass  # closed by the agent, as it should be
            held = []
            for _ in range(20):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(struct.pack(">I", AUTH_FRAME) + b"{" + b" " * (AUTH_FRAME - 100))
                held.append(stream)
            await trio.sleep(0.5)
            grown = rss_kib(pid) - before
            print(f"agent RSS {before} KiB before, grew by {grown} KiB")
            assert grown < 16 * 1024, f"the agent grew by {grown} KiB"

            # hundreds of idle connections: a handful stay, the rest are closed
            idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(300)]
            # (closed once past the grace a connection has to show its secret)
            await wait_until(lambda: sum(not closed_now(stream) for stream in idle + held) <= 8, interval=0.2,
                             what="all but a handful of the idle connections closed")

            # a local multi-part job's processes, on the Unix socket, pass their barrier
            job = await client.cosubmit(_parts(str(waiter), 3))
            await client.wait_for(lambda: client.job(job).get("jobStatus") in ("FINISHED", "FAILED"), scaled(60),
                                  description="the job beside the idle connections")
            assert client.job(job).get("jobStatus") == "FINISHED", client.job(job).attributes
            passed = [line for part in client.parts_of(job) for line in client.job_output(part).splitlines()
                      if line.startswith("PASSED")]
            assert len(passed) == 4, passed
            for stream in idle + held + [big]:
                await stream.aclose()
            await client.quit()


async def test_a_handful_of_idle_connections_per_peer_are_kept_and_slow_ones_end(nursery, tmp_path):
    server = RuntimeServer(unix_path=str(tmp_path / "runtime.sock"), tcp_host="127.0.0.1", auth_timeout=scaled(6.0))
    await nursery.start(server.run)
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a")]))
    host, port = wire.parse_contact(server.tcp_contact)[1]
    idle = [await trio.open_tcp_stream(host, port) for _ in range(30)]
    slow = await trio.open_tcp_stream(host, port)

    async def closed(stream) -> bool:
        await settle()
        return closed_now(stream)

    # past AUTH_GRACE the extra idle ones are closed (and the rest at the auth timeout)
    await wait_until(lambda: sum(not closed_now(stream) for stream in idle) <= server.slow_per_peer,
                     what="the idle connections beyond a handful closed")
    kept = [stream for stream in idle if not closed_now(stream)]
    assert len(kept) == server.slow_per_peer - 1 or len(kept) == server.slow_per_peer, len(kept)
    # one that sends a byte now and then is closed once its time to authenticate is over
    with trio.fail_after(scaled(30)):
        while True:
            try:
                await slow.send_all(b"\x00")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if await closed(slow):
                break
            await trio.sleep(0.2)
    # a process with the job's secret is served meanwhile
    env = server.environment(job, 0, remote=True)
    env["PROXY_AGENT_PROCESS_INDEX"] = "0"
    answer = await trio.to_thread.run_sync(lambda: Runtime(env, timeout=scaled(30)).info())
    assert answer["part"] == 0
    for stream in idle + [slow]:
        await stream.aclose()


async def test_a_large_request_goes_through_after_the_secret(nursery, tmp_path):
    server = RuntimeServer(unix_path=str(tmp_path / "runtime.sock"), tcp_host="127.0.0.1")
    await nursery.start(server.run)
    job = server.register_job(MultiJobDescription(parts=[Part("/bin/a", count=2)]))
    environments = []
    for rank in (0, 1):
        env = server.environment(job, 0, remote=True)
        env["PROXY_AGENT_PROCESS_INDEX"] = str(rank)
        environments.append(env)
    payload = os.urandom(3 * AUTH_FRAME)  # base64 in a request several times the first-request limit

    def exchange() -> bytes:
        sender, receiver = Runtime(environments[0], timeout=scaled(30)), Runtime(environments[1], timeout=scaled(30))
        sender.send(1, "big", payload)
        return receiver.receive("big")

    assert await trio.to_thread.run_sync(exchange) == payload
    # the same request without the secret first is refused on its length
    raw = socket.create_connection(wire.parse_contact(server.tcp_contact)[1], timeout=scaled(30))
    try:
        body = json.dumps({"v": 1, "op": "send", "job": job, "secret": "x", "part": 0, "rank": 0,
                           "dest": 1, "tag": "t", "data": "A" * (2 * AUTH_FRAME)}).encode()
        raw.sendall(struct.pack(">I", len(body)))
        reply = await trio.to_thread.run_sync(lambda: raw.recv(65536))
        assert json.loads(reply[4:])["error"]["kind"] == "protocol"
    finally:
        raw.close()


async def test_auto_listens_where_compute_nodes_connect_and_every_interface_is_asked_for(nursery, tmp_path):
    args = parse_arguments(["--scheduler", "local,slurm"])

    class _State:
        usable = False
        directory = str(tmp_path)

    settings = runtime_settings(args, ["local", "slurm"], _State())
    assert settings.tcp_host == "auto"
    server = RuntimeServer(unix_path=str(tmp_path / "runtime.sock"), tcp_host=settings.tcp_host)
    await nursery.start(server.run)
    name = reachable_host()
    assert server.tcp_contact.startswith(f"tcp://{name}:")
    assert name != "localhost" and "127.0.0.1" not in await auto_addresses(name)
    assert server.tcp_addresses == await auto_addresses(name) != []
    assert not {"0.0.0.0", "::"} & set(server.tcp_addresses)
    # every interface, when asked
    everywhere = runtime_settings(parse_arguments(["--scheduler", "local,slurm", "--runtime-tcp", "0.0.0.0"]),
                                  ["local", "slurm"], _State())
    assert everywhere.tcp_host == "0.0.0.0"
    # a name that is not this host's is said plainly
    nowhere = RuntimeServer(unix_path=str(tmp_path / "other.sock"), tcp_host="auto", advertise_host="192.0.2.254")
    with pytest.raises(OSError, match="resolves to no address of this host"):
        await nursery.start(nowhere.run)
