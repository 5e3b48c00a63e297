"""The agent end to end: a real subprocess, real sockets, real jobs.

Every client here runs the protocol checker in strict mode, so an event
with a TID that is not open, a CHANGE for an unknown element or a malformed
frame fails the test that caused it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

from agent_fixtures import agent_argv, free_port, model_difference, stored_jobs, subprocess_env
from wait_support import scaled, wait_until
from proxy_agent.frontends.ptp import PtpSession
from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.schedulers.sim import SimBackend, SimOptions
from proxy_agent.service.service import JobService
from proxy_agent.client import AgentClient, CommandFailed, TokenRefused
from proxy_agent.protocol.messages import CommandId, ErrorCode, EventId
from proxy_agent.protocol.wire import Decoder, Frame, encode_frame




def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class RawPeer:
    """Bare frames over a spawned agent's stdio, for checking exact event sequences."""

    def __init__(self, process: trio.Process, env: dict) -> None:
        self.process = process
        self.env = env
        self.decoder = Decoder()
        self.frames: list = []

    @classmethod
    async def spawn(cls, *args: str) -> "RawPeer":
        env = subprocess_env()
        process = await trio.lowlevel.open_process(
            agent_argv(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        return cls(process, env)

    async def send(self, cid: int, tid: int, *args: str) -> None:
        await self.process.stdin.send_all(encode_frame(cid, tid, list(args)))

    async def next(self, timeout: float = scaled(30)) -> Frame:
        with trio.fail_after(timeout):
            while not self.frames:
                data = await self.process.stdout.receive_some(65536)
                assert data, "agent closed its output"
                self.decoder.feed(data)
                for item in self.decoder:
                    assert isinstance(item, Frame), item
                    self.frames.append(item)
        return self.frames.pop(0)

    async def until(self, predicate, timeout: float = scaled(30)) -> list:
        seen = []
        while True:
            frame = await self.next(timeout)
            seen.append(frame)
            if predicate(frame):
                return seen

    async def stderr(self) -> str:
        """All the agent wrote on stderr, to its end."""
        chunks = []
        with trio.fail_after(scaled(30)):
            while True:
                data = await self.process.stderr.receive_some(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")


async def test_seed_phase_example_over_stdio():
    """The design's phase example, frame by frame, against the real agent."""
    peer = await RawPeer.spawn("--scheduler", "local")
    await peer.send(CommandId.INIT, 1, "version=2.0", "baseId=100", "dialect=native")
    assert await peer.next() == Frame(EventId.OK, 1, ())
    await peer.send(CommandId.MODEL_DEF, 2)
    seen = await peer.until(lambda f: f.msg_id == EventId.OK)
    assert [f.tid for f in seen] == [2] * len(seen)
    assert {f.msg_id for f in seen[:-1]} == {EventId.ATTR_DEF} and len(seen) >= 3
    await peer.send(CommandId.START_EVENTS, 3)
    model = [await peer.next() for _ in range(3)]
    assert [f.msg_id for f in model] == [EventId.NEW_MACHINE, EventId.NEW_QUEUE, EventId.NEW_NODE]
    assert all(f.tid == 3 for f in model)
    await peer.send(CommandId.STOP_EVENTS, 4)
    assert await peer.next() == Frame(EventId.OK, 3, ())
    # held while suspended: a job submitted now appears only after START_EVENTS
    await peer.send(CommandId.SUBMIT_JOB, 7, "jobSubId=held", "execPath=/bin/true")
    assert await peer.next() == Frame(EventId.OK, 7, ())
    # once the agent has seen the job end (its store says so), anything it sent while
    # suspended would come before the answer to START_EVENTS
    await wait_until(lambda: any(j["client_ref"] == "held" and j["ended"] for j in stored_jobs(peer.env)),
                     what="the held job's end in the store")
    await peer.send(CommandId.START_EVENTS, 5)
    assert await peer.next() == Frame(EventId.OK, 4, ())
    new_job = await peer.next()
    assert new_job.msg_id == EventId.NEW_JOB and new_job.tid == 5
    assert "jobSubId=held" in new_job.args
    await peer.send(CommandId.QUIT, 6)
    tail = await peer.until(lambda f: f.msg_id == EventId.SHUTDOWN)
    assert tail[-2:] == [Frame(EventId.OK, 5, ()), Frame(EventId.SHUTDOWN, 6, ())]
    assert all(f.tid == 5 for f in tail[:-2])
    await _exits_cleanly(peer.process)
    assert "Traceback" not in await peer.stderr()


async def test_bad_input_gets_errors_and_agent_keeps_serving():
    peer = await RawPeer.spawn()
    await peer.send(0x77, 1)
    frame = await peer.next()
    assert frame.msg_id == EventId.ERROR and frame.tid == 1 and f"errorCode={ErrorCode.UNKNOWN_COMMAND}" in frame.args
    await peer.send(CommandId.START_EVENTS, 2)  # illegal before INIT
    frame = await peer.next()
    assert frame.msg_id == EventId.ERROR and frame.tid == 2 and "INITIALIZE" in frame.args[2]
    await peer.send(CommandId.INIT, 3, "version=9.9", "baseId=1")
    frame = await peer.next()
    assert frame.msg_id == EventId.ERROR and "9.9" in frame.args[2]
    await peer.send(CommandId.INIT, 4, "version=2.0")
    frame = await peer.next()
    assert frame.msg_id == EventId.ERROR and "base id" in frame.args[2]
    # a frame whose body is broken but whose length is sound: ERROR under its TID
    await peer.process.stdin.send_all(b"00000017 0001:00000005:0000000Z")
    frame = await peer.next()
    assert frame.msg_id == EventId.ERROR and frame.tid == 5 and "argument count" in frame.args[2]
    await peer.send(CommandId.INIT, 6, "2.0", "500")  # the design's bare form
    assert await peer.next() == Frame(EventId.OK, 6, ())
    await peer.send(CommandId.QUIT, 7)
    assert (await peer.next()).msg_id == EventId.SHUTDOWN
    await _exits_cleanly(peer.process)


def rank(process) -> int:
    """A process's rank within its job: the id the agent names it by."""
    return process.rank


async def start(client: AgentClient, base_id: int = 1000, token=None) -> None:
    await client.init(base_id, token=token)
    await client.model_def()
    await client.start_events()


async def test_submit_output_exit_on_local(tmp_path):
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await start(client)
        tricky = ["two words", "it's", '"quoted"', "$(echo no)", "`echo no`", "héllo ✓"]
        job = await client.submit("/bin/echo", tricky)
        done = await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert client.job_output(job).strip() == " ".join(tricky)
        assert done.get("jobStatus") == "FINISHED"
        assert done.get("jobSubId", "").startswith("sub-")
        (proc,) = client.children(job, "process")
        assert proc.get("processExitCode") == "0"
        # The job's first event follows the OK of SUBMIT_JOB with its state at that moment:
        # STARTING, or RUNNING when the keeper said so before the submission was answered.
        assert done.states[0] in ("STARTING", "RUNNING") and "RUNNING" in done.states

        script = "echo out; echo err >&2; printf partial; exit 3"
        job = await client.submit("/bin/sh", ["-c", script], cwd=str(tmp_path), env={"GREETING": "hi"})
        done = await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert done.get("jobStatus") == "FAILED"
        assert client.job_output(job).splitlines() == ["out", "partial"]
        assert client.job_output(job, "stderr").strip() == "err"
        (proc,) = client.children(job, "process")
        assert proc.get("processExitCode") == "3"

        job = await client.submit("/bin/sh", ["-c", 'echo "$GREETING from $(pwd) #$PROXY_AGENT_PROCESS_INDEX"'], cwd=str(tmp_path), env={"GREETING": "hi"}, count=3)
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        procs = client.children(job, "process")
        assert sorted(rank(p) for p in procs) == [0, 1, 2]
        assert sorted(client.job_output(job).splitlines()) == [f"hi from {tmp_path} #{i}" for i in range(3)]
        await client.quit()
        assert client.violations == []


async def test_terminate_suspend_resume_on_local():
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await start(client)
        job = await client.submit("/bin/sleep", ["600"])
        await client.wait_job_state(job, "RUNNING", timeout=scaled(30))
        (proc,) = client.children(job, "process")
        pid = int(proc.get("processPID"))
        await client.change_job(job, suspend="true")
        await client.wait_job_state(job, "SUSPENDED", timeout=scaled(30))
        with open(f"/proc/{pid}/stat") as stat:
            assert stat.read().rsplit(")", 1)[1].split()[0] == "T"
        await client.change_job(job, suspend="false")
        await client.wait_job_state(job, "RUNNING", timeout=scaled(30))
        await client.terminate(job)
        done = await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert done.get("jobStatus") == "KILLED"  # ended by the agent, not by itself
        assert not _alive(pid)
        with pytest.raises(CommandFailed) as failure:
            await client.terminate("999999")
        assert failure.value.event.event_id == EventId.TERMINATEJOB_ERROR
        with pytest.raises(CommandFailed) as failure:
            await client.move_job(job, "default")
        assert failure.value.event.event_id == EventId.ERROR
        await client.quit()
        assert client.violations == []


BAD_SUBMISSIONS = [
    (["execPath=/bin/true"], "jobSubId"),
    (["jobSubId=x1"], "executable"),
    (["jobSubId=x2", "execPath=/no/such/program"], "not found"),
    (["jobSubId=x3", "execPath={plain_file}"], "not executable"),
    (["jobSubId=x4", "execPath=/bin/true", "workingDir=/no/such/dir"], "/no/such/dir"),
    (["jobSubId=x5", "execPath=/bin/true", "jobNumProcs=many"], "jobNumProcs"),
    (["jobSubId=x6", "execPath=/bin/true", "jobNumProcs=0"], "jobNumProcs"),
]


async def test_bad_submissions_get_submitjob_error(tmp_path):
    plain_file = tmp_path / "data.txt"
    plain_file.write_text("not a program")
    plain_file.chmod(0o644)
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await start(client)
        for args, needle in BAD_SUBMISSIONS:
            args = [a.format(plain_file=plain_file) for a in args]
            command = await client.raw(CommandId.SUBMIT_JOB, args)
            event = command.completion
            assert event.event_id == EventId.SUBMITJOB_ERROR, (args, event)
            assert needle.lower() in event.message.lower(), (args, event.message)
            sub = dict(a.split("=", 1) for a in args).get("jobSubId", "")
            assert event.job_sub_id == sub
        assert client.jobs == {}
        job = await client.submit("/bin/true")  # still serving
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        await client.quit()
        assert client.violations == []


async def _exits_cleanly(process: trio.Process) -> None:
    """The agent ends by itself, with status 0 (after QUIT)."""
    with trio.fail_after(scaled(30)):
        assert await process.wait() == 0


def _reap(process: trio.Process) -> None:
    """End an agent a failed test left running: SIGTERM first, so that its jobs end with it."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            deadline = time.monotonic() + scaled(30)
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                process.kill()


async def _listening_agent(*args: str, env=None):
    process = await trio.lowlevel.open_process(
        agent_argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env or subprocess_env()
    )
    banner = b""
    with trio.fail_after(scaled(30)):
        while b"listening on" not in banner:
            data = await process.stderr.receive_some(4096)
            assert data, banner
            banner += data
    return process


async def test_tcp_listen_token_and_concurrent_sessions(tmp_path):
    port = free_port()
    token_file = tmp_path / "token"
    process = await _listening_agent("--listen", str(port), "--token-file", str(token_file))
    try:
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = token_file.read_text().strip()
        # wrong token: ERROR, then the connection is closed
        async with await AgentClient.connect_tcp("127.0.0.1", port, strict=False) as bad:
            with pytest.raises(TokenRefused):
                await bad.init(token="wrong")
            with trio.fail_after(scaled(30)):
                while bad.ended is None:
                    await trio.sleep(0.05)
        # missing token likewise
        async with await AgentClient.connect_tcp("127.0.0.1", port, strict=False) as bad:
            with pytest.raises(TokenRefused):
                await bad.init()
        async with await AgentClient.connect_tcp("127.0.0.1", port) as client:
            await start(client, token=token)
            assert len(client.queues) == 1
            # a second client is served at the same time, with ids from its own base id
            async with await AgentClient.connect_tcp("127.0.0.1", port) as second:
                await start(second, base_id=70000, token=token)
                job = await client.wait_job_state(await client.submit("/bin/echo", ["over tcp"]), "COMPLETED", timeout=scaled(30))
                sub_id = job.get("jobSubId")
                assert client.job_output(job).strip() == "over tcp"
                # the second client sees the same job under its own id, with the same output
                seen = await second.wait_for(
                    lambda: next((j for j in second.jobs.values() if j.get("jobSubId") == sub_id), None),
                    timeout=scaled(30),
                )
                assert int(seen.id) - 70000 == int(job.id) - 1000
                await second.wait_job_state(seen, "COMPLETED", timeout=scaled(30))
                assert second.job_output(seen).strip() == "over tcp"
                await second.quit()  # ends that session only
                assert second.violations == []
            job = await client.submit("/bin/echo", ["still served"])
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            await client.quit()
            assert client.violations == []
        assert process.returncode is None  # QUIT ends a session, not the agent
        process.send_signal(signal.SIGTERM)
        await _exits_cleanly(process)
    finally:
        _reap(process)


async def test_unix_socket_mode_and_sessions_in_turn(tmp_path):
    path = str(tmp_path / "agent.sock")
    process = await _listening_agent("--unix", path, "--scheduler", "sim", "--sim-nodes", "8")
    try:
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        async with await AgentClient.connect_unix(path) as client:
            await start(client)
            await client.wait_for(lambda: len(client.nodes) == 8, timeout=scaled(30))
        # first session dropped without QUIT: the agent serves the next one
        async with await AgentClient.connect_unix(path) as client:
            await start(client, base_id=5000)
            await client.wait_for(lambda: len(client.nodes) == 8, timeout=scaled(30))
            assert all(int(n) > 5000 for n in client.nodes)
            await client.quit()
            assert client.violations == []
        process.send_signal(signal.SIGTERM)
        await _exits_cleanly(process)
        assert not os.path.exists(path)
    finally:
        _reap(process)


async def test_connect_back():
    from proxy_agent.client import listen_for_agent

    listener = await listen_for_agent("127.0.0.1", 0)
    process = await trio.lowlevel.open_process(
        agent_argv("--connect", listener.address), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=subprocess_env()
    )
    try:
        with trio.fail_after(scaled(30)):
            client = await listener.accept()
        async with client:
            await start(client)
            assert len(client.machines) == 1
            await client.quit()
        await _exits_cleanly(process)
    finally:
        _reap(process)


@asynccontextmanager
async def in_process_session(*backends):
    """A PTP session served in this process over a memory stream, over a service running
    ``backends`` (classes or (class, options) pairs), with a client on the other end.

    Yields (session, client); the client has not sent INIT yet.
    """
    service = JobService()
    for backend in backends:
        cls, options = backend if isinstance(backend, tuple) else (backend, None)
        service.add_backend(cls(service.model, options, service.context()))
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    session = PtpSession(agent_stream, service)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        nursery.start_soon(session.run)
        async with AgentClient.from_stream(client_stream) as client:
            yield session, client
        nursery.cancel_scope.cancel()


async def test_suspended_changes_are_held_and_coalesced(tmp_path):
    env = subprocess_env()
    async with await AgentClient.spawn(agent_argv(), env=env) as client:
        await start(client)
        traffic = []
        client.add_listener(lambda t: traffic.append(t))
        await client.stop_events()
        sub_id = await client.submit_nowait("/bin/sh", ["-c", "echo one; echo two"])
        await wait_until(lambda: any(j["client_ref"] == sub_id and j["ended"] for j in stored_jobs(env)),
                         what="the agent to see the job end")
        held_start = len(traffic)
        await client.start_events()
        job = await client.wait_for(lambda: client.state.jobs_by_sub.get(sub_id), timeout=scaled(30))
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        # the job appeared once; its process already COMPLETED, its intermediate states coalesced
        # away; the job's own states kept one by one, as for every job a client submitted
        (process,) = client.children(job, "process")
        assert process.states == ["COMPLETED"]
        assert job.states == ["STARTING", "RUNNING", "COMPLETED"]
        assert client.job_output(job).splitlines() == ["one", "two"]
        incoming = [t for t in traffic[held_start:] if t.direction == "in"]
        new_jobs = [t for t in incoming if t.message is not None and t.message.event_id == EventId.NEW_JOB]
        job_changes = [t for t in incoming if t.message is not None and t.message.event_id == EventId.JOB_CHANGE]
        assert len(new_jobs) == 1 and len(job_changes) == 2
        await client.quit()
        assert client.violations == []


async def test_long_suspension_delivers_exactly_the_current_model():
    """Churn while events are stopped; after START_EVENTS the mirror equals the agent's model."""
    options = SimOptions(nodes=200, jobs=300, churn=2000, seed=7)
    async with in_process_session((SimBackend, options)) as (session, client):
        changes = []
        client.add_listener(lambda t: changes.append(t) if t.direction == "in" else None)
        await start(client)
        seen = len(changes)
        await wait_until(lambda: len(changes) >= seen + 10, what="changes while events flow")
        await client.stop_events()
        model = session.service.model
        # many changes happen while suspended, held one per element
        pending = await wait_until(lambda: len(session.view._pending) >= 100 and len(session.view._pending),
                                   what="changes while suspended")
        assert pending <= len(model)
        await client.start_events()
        # freeze the cluster, then compare once everything the agent had to say has arrived
        (sim,) = session.service.backends
        sim.options = attrs.evolve(options, churn=0)
        await client.stop_events()
        await wait_until(lambda: not (session.view.has_pending or session._out), what="everything the agent had to say")
        await client.start_events()
        # Timers of jobs already running may still fire: a mismatch must not last.
        await wait_until(lambda: model_difference(model, client, 1000) is None,
                         what=f"the mirror to equal the model ({model_difference(model, client, 1000)})")
        assert client.violations == []
        await client.quit()


@pytest.mark.parametrize("how", ["quit", "sigterm", "sigint", "eof"])
async def test_no_processes_left_behind(how, tmp_path):
    argv = agent_argv()
    client = await AgentClient.spawn(argv, env=subprocess_env(), exit_grace=5)
    async with client:
        await start(client)
        # a job whose process ignores SIGTERM and has a child of its own
        job = await client.submit("/bin/sh", ["-c", "trap '' TERM; sleep 300 & echo $!; wait"], count=2)
        await client.wait_for(lambda: len(client.job_output(job).split()) == 2, timeout=scaled(30))
        pids = [int(p.get("processPID")) for p in client.children(job, "process")]
        pids += [int(x) for x in client.job_output(job).split()]
        assert all(_alive(p) for p in pids)
        agent = client.process
        if how == "quit":
            await client.quit()
        elif how == "sigterm":
            os.kill(agent.pid, signal.SIGTERM)
        elif how == "sigint":
            os.kill(agent.pid, signal.SIGINT)
        else:
            await agent.process.stdin.aclose()
        with trio.fail_after(scaled(30)):
            code = await agent.wait()
        assert code == 0, agent.stderr_tail()
        await wait_until(lambda: not [p for p in pids if _alive(p)], what="the job's processes to end")
        assert "Traceback" not in agent.stderr_tail(200)


async def test_processes_entering_running_share_one_event_and_range():
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await start(client)
        traffic = []
        client.add_listener(traffic.append)
        job = await client.submit("/bin/sleep", ["300"], count=64)
        await client.wait_job_state(job, "RUNNING", timeout=scaled(30))
        procs = sorted(rank(p) for p in client.children(job, "process"))
        assert procs == list(range(64))
        running = [
            t.message
            for t in traffic
            if t.direction == "in" and t.message is not None and t.message.event_id == EventId.PROCESS_CHANGE
            and any(("processState", "RUNNING") in g.attributes for g in t.message.groups)
        ]
        assert len(running) == 1, running
        (group,) = [g for g in running[0].groups if ("processState", "RUNNING") in g.attributes]
        assert str(group.ids) == f"{procs[0]}-{procs[-1]}"
        await client.terminate(job)
        await client.quit()
        assert client.violations == []


async def test_jobs_outlive_a_dropped_connection_and_their_output_waits(tmp_path):
    """In --unix mode a client that vanishes ends its own session only: its jobs run on, and
    what they print meanwhile is delivered to the next client."""
    path = str(tmp_path / "agent.sock")
    marker = tmp_path / "go"
    process = await _listening_agent("--unix", path)
    try:
        async with await AgentClient.connect_unix(path) as client:
            await start(client)
            script = f"echo before; while [ ! -e {marker} ]; do sleep 0.05; done; echo after; sleep 300"
            job = await client.submit("/bin/sh", ["-c", script], count=2)
            await client.wait_for(lambda: client.job_output(job).count("before") == 2, timeout=scaled(30))
            pids = [int(p.get("processPID")) for p in client.children(job, "process")]
            sub_id = client.job(job).get("jobSubId")
        # the connection is gone without QUIT; the job prints while nobody listens (and is
        # still running when the next client comes, below)
        marker.touch()
        assert all(_alive(p) for p in pids)
        assert process.returncode is None
        async with await AgentClient.connect_unix(path) as client:
            await start(client)
            found = [j for j in client.jobs.values() if j.get("jobSubId") == sub_id]
            assert len(found) == 1, (sub_id, {k: dict(v.attributes) for k, v in client.jobs.items()})
            (job,) = found
            assert job.get("jobState") == "RUNNING"
            await client.wait_for(lambda: client.job_output(job).count("after") == 2, timeout=scaled(30))
            assert "before" not in client.job_output(job)  # delivered once, to the first client
            await client.terminate(job)
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            await client.quit()
            assert client.violations == []
        with trio.fail_after(scaled(30)):
            while any(_alive(p) for p in pids):
                await trio.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        await _exits_cleanly(process)
    finally:
        _reap(process)


class _BrokenBackend(LocalBackend):
    """A backend whose job commands fail in ways the agent must contain."""

    name = "broken"

    async def submit(self, spec, queue, key=None):
        raise RuntimeError("disk on fire")

    async def terminate(self, job):
        raise KeyError(job)


async def test_internal_error_in_a_command_is_an_error_event_and_the_session_goes_on(caplog):
    async with in_process_session(_BrokenBackend) as (session, client):
        await start(client)
        command = await client.raw(CommandId.SUBMIT_JOB, ["jobSubId=s1", "execPath=/bin/true"])
        event = command.completion
        assert event.event_id == EventId.SUBMITJOB_ERROR and event.code == ErrorCode.INTERNAL
        assert "disk on fire" in event.message
        assert "disk on fire" in caplog.text  # logged with its cause
        # the session still works
        assert len(client.queues) == 1
        await client.quit()
        assert client.violations == []


class _DyingBackend(LocalBackend):
    """Starts fine, then its background work dies (when the test sets ``die``)."""

    name = "dying"
    die: trio.Event

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        async with trio.open_nursery() as nursery:
            await nursery.start(super().run)
            task_status.started()
            await self.die.wait()
            raise OSError("lost contact with the controller")


async def test_scheduler_dying_after_start_is_told_and_the_session_goes_on():
    _DyingBackend.die = trio.Event()
    async with in_process_session(_DyingBackend, SimBackend) as (session, client):
        await start(client)
        _DyingBackend.die.set()  # once the client has events started
        await client.wait_for(lambda: client.messages, timeout=scaled(30))
        message = client.messages[0]
        assert message.level == "ERROR" and "lost contact with the controller" in message.text
        # still serving: commands are answered, the other backend works
        command = await client.raw(CommandId.TERMINATE_JOB, ["jobId=424242"])
        assert command.completion.event_id == EventId.TERMINATEJOB_ERROR
        job = await client.submit("/bin/true", queue="sim:batch")
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        await client.quit()
        assert client.violations == []
