"""The agent under hostile peers, output floods and faults, and keeping its secret.

Every test runs the agent as a subprocess and talks to it over real pipes and sockets.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess

import pytest
import trio

from agent_fixtures import agent_argv, free_port, subprocess_env
from leftover_support import RUN_VARIABLE
from wait_support import scaled, wait_until, wait_until_blocking
from proxy_agent.client import AgentClient, CommandFailed
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.wire import Decoder, Frame, FrameError, encode_frame

TOKEN = "s3cret-for-this-test-only"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before or while /proc was read
        return False


def _yes_processes() -> set:
    """This run's ``yes`` processes (others may run the same tests on the machine)."""
    found = set()
    mark = f"{RUN_VARIABLE}={os.environ.get(RUN_VARIABLE, '')}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmd, open(f"/proc/{entry}/environ", "rb") as env:
                    if cmd.read().split(b"\0")[0] == b"/usr/bin/yes" and mark in env.read().split(b"\0"):
                        found.add(int(entry))
            except OSError:
                pass
    return found


#: How much output may come between a command and its answer while jobs flood the agent: no
#: more than the agent holds for a reading client (events queued for writing, output waiting,
#: one read from each job), never everything the jobs print meanwhile.
AHEAD_OF_AN_ANSWER = 8 << 20


async def _start(client: AgentClient, base_id: int = 1000, token=None) -> None:
    await client.init(base_id, token=token)
    await client.model_def()
    await client.start_events()


async def _listening(*args: str, env=None) -> trio.Process:
    process = await trio.lowlevel.open_process(
        agent_argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env or subprocess_env(),
    )
    banner = b""
    with trio.fail_after(scaled(30)):
        while b"listening on" not in banner:
            data = await process.stderr.receive_some(4096)
            assert data, banner
            banner += data
    return process


async def _stop(process: trio.Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.fail_after(scaled(30)):
        return await process.wait()


class Raw:
    """Bare frames over a spawned agent's stdio."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.decoder = Decoder(max_frame_size=1 << 30)
        self.tid = 0
        self.errors: list = []

    @classmethod
    async def spawn(cls, *args: str) -> "Raw":
        process = await trio.lowlevel.open_process(
            agent_argv(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=subprocess_env(),
        )
        return cls(process)

    async def send(self, cid: int, *args: str) -> int:
        self.tid += 1
        await self.process.stdin.send_all(encode_frame(cid, self.tid, list(args)))
        return self.tid

    async def frames(self):
        while True:
            data = await self.process.stdout.receive_some(1 << 20)
            if not data:
                self.decoder.feed_eof()
                for item in self.decoder:
                    self.errors.append(item)
                return
            self.decoder.feed(data)
            for item in self.decoder:
                if isinstance(item, FrameError):
                    self.errors.append(item)
                else:
                    yield item

    async def start(self, jobs: int = 0, program: str = "/usr/bin/yes") -> int:
        await self.send(CommandId.INIT, "version=2.0", "baseId=1000")
        await self.send(CommandId.MODEL_DEF)
        events = await self.send(CommandId.START_EVENTS)
        for i in range(jobs):
            await self.send(CommandId.SUBMIT_JOB, f"jobSubId=j{i}", f"execPath={program}")
        return events


# --------------------------------------------------------------------------- availability


async def test_unauthenticated_connections_never_keep_the_owner_out(tmp_path):
    port = free_port()
    env = subprocess_env(PROXY_AGENT_TOKEN=TOKEN)
    process = await _listening("--listen", str(port), "--auth-timeout", f"{scaled(3):g}", env=env)
    try:
        squatters = []
        for i in range(40):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            if i % 3 == 1:
                await stream.send_all(b"00000040 0001:0000")  # half a frame, never finished
            elif i % 3 == 2:
                await stream.send_all(encode_frame(CommandId.LIST_FILTERS, 1, []))  # no INIT
            squatters.append(stream)
        # the owner gets in at once, squatters or not
        with trio.fail_after(scaled(30)):
            async with await AgentClient.connect_tcp("127.0.0.1", port) as client:
                await _start(client, token=TOKEN)
                assert len(client.queues) == 1
                await client.quit()
        # and every squatter is gone after the deadline
        with trio.fail_after(scaled(30)):
            for stream in squatters:
                while True:
                    try:
                        data = await stream.receive_some(4096)
                    except trio.BrokenResourceError:
                        break
                    if not data:
                        break
                await stream.aclose()
        assert process.returncode is None
    finally:
        assert await _stop(process) == 0


async def test_an_output_flood_leaves_commands_and_quit_prompt():
    """What keeps commands and QUIT prompt under a flood, whatever the machine's speed: output
    takes its turn with the answers (a bounded amount of it before each), and travels many
    lines to an event.  How fast it all is: scripts/bench_flood.py."""
    raw = await Raw.spawn()
    await raw.start(jobs=20)
    received = 0
    flooding = False
    output_events = output_lines = 0
    probes = {}  # TID -> bytes received since it was sent
    ahead = []
    quit_tid = None
    ahead_of_shutdown = None
    last = None
    async for frame in raw.frames():
        size = sum(len(arg) for arg in frame.args)
        for tid in probes:
            probes[tid] += size
        if ahead_of_shutdown is not None and frame.msg_id != EventId.SHUTDOWN:
            ahead_of_shutdown += size
        if frame.msg_id == EventId.PROCESS_CHANGE:
            text = [a[len("processStdout="):] for a in frame.args if a.startswith("processStdout=")]
            received += sum(map(len, text))
            if flooding and text:  # (a process's change of state carries no output)
                output_events += 1
                output_lines += sum(t.count("\n") + 1 for t in text)
            flooding = flooding or received > 1_000_000
        elif frame.msg_id == EventId.OK and frame.tid in probes:
            ahead.append(probes.pop(frame.tid))
        if flooding and not probes and quit_tid is None and len(ahead) < 6:
            probes[await raw.send(CommandId.LIST_FILTERS)] = 0
        if flooding and len(ahead) >= 6 and quit_tid is None:
            quit_tid = await raw.send(CommandId.QUIT)
            ahead_of_shutdown = 0
        last = frame
    assert raw.errors == []  # whole frames to the end
    assert last is not None and last.msg_id == EventId.SHUTDOWN and last.tid == quit_tid
    assert max(ahead) <= AHEAD_OF_AN_ANSWER, ahead
    assert ahead_of_shutdown <= AHEAD_OF_AN_ANSWER
    assert output_lines >= 100 * output_events, (output_lines, output_events)  # lines travel together
    with trio.fail_after(scaled(30)):
        assert await raw.process.wait() == 0
    await wait_until(lambda: not _yes_processes(), what="the jobs to end with the agent")


async def test_a_client_that_stops_reading_holds_memory_down_and_is_answered_when_it_reads_again():
    raw = await Raw.spawn()
    await raw.start(jobs=20)
    frames = raw.frames()
    seen = 0
    async for frame in frames:  # let the flood begin
        seen += 1
        if seen > 2000:
            break
    peak = 0
    for _ in range(30):  # not a wait: 6 s without reading a byte, the agent's memory sampled
        with open(f"/proc/{raw.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    peak = max(peak, int(line.split()[1]) // 1024)
        await trio.sleep(0.2)
    assert peak < 400, f"{peak} MB"
    tid = await raw.send(CommandId.LIST_FILTERS)
    ahead = 0
    with trio.fail_after(scaled(30)):
        async for frame in frames:
            if frame.msg_id == EventId.OK and frame.tid == tid:
                break
            ahead += sum(len(arg) for arg in frame.args)
    assert ahead <= AHEAD_OF_AN_ANSWER  # answered once what was already on its way has come
    raw.process.send_signal(signal.SIGTERM)
    async for _ in frames:
        pass
    with trio.fail_after(scaled(30)):
        assert await raw.process.wait() == 0


async def test_nothing_is_dropped_for_a_client_that_keeps_reading():
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await _start(client)
        jobs = [await client.submit("/usr/bin/seq", ["20000"]) for _ in range(10)]
        for job in jobs:
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(60))
        for job in jobs:
            assert client.job_output(job).split("\n")[:-1] == [str(i) for i in range(1, 20001)]
            assert client.job_output(job, "stderr") == ""
        await client.quit()
        assert client.violations == []


@pytest.mark.parametrize("run", range(3))
async def test_quit_while_jobs_print_ends_with_whole_frames_and_shutdown(run):
    raw = await Raw.spawn()
    await raw.start(jobs=10)
    quit_tid = None
    last = None
    count = 0
    async for frame in raw.frames():
        count += 1
        if count == 200 + 100 * run:
            quit_tid = await raw.send(CommandId.QUIT)
        last = frame
    assert raw.errors == []
    assert quit_tid is not None and last.msg_id == EventId.SHUTDOWN and last.tid == quit_tid
    with trio.fail_after(scaled(30)):
        assert await raw.process.wait() == 0
    await wait_until(lambda: not _yes_processes(), what="the jobs to end with the agent")


async def test_a_process_that_leaves_its_job_does_not_outlive_it():
    script = "setsid sleep 300 & echo $!; (setsid sh -c 'sleep 301 & echo $!' &); sleep 300"
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await _start(client)
        job = await client.submit("/bin/sh", ["-c", script])
        await client.wait_for(lambda: len(client.job_output(job).split()) == 2, timeout=scaled(30))
        escaped = [int(p) for p in client.job_output(job).split()]
        assert all(_alive(p) for p in escaped)
        await client.terminate(job)
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        await wait_until(lambda: not any(_alive(p) for p in escaped), what="the escaped processes to end")
        job = await client.submit("/bin/sh", ["-c", script])
        await client.wait_for(lambda: len(client.job_output(job).split()) == 2, timeout=scaled(30))
        escaped = [int(p) for p in client.job_output(job).split()]
        assert all(_alive(p) for p in escaped)
        await client.quit()
    await wait_until(lambda: not any(_alive(p) for p in escaped), what="the escaped processes to end")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signal_is_told_to_the_client_before_the_stream_closes(signum):
    raw = await Raw.spawn()
    events = await raw.start()
    seen = []
    async for frame in raw.frames():
        seen.append(frame)
        if frame.msg_id == EventId.NEW_NODE:
            raw.process.send_signal(signum)
    assert raw.errors == []
    message, shutdown = seen[-2:]
    assert message.msg_id == EventId.MESSAGE and message.tid == events
    assert signal.Signals(signum).name in message.args[-1]
    assert shutdown == Frame(EventId.SHUTDOWN, events, ())
    with trio.fail_after(scaled(30)):
        assert await raw.process.wait() == 0


# --------------------------------------------------------------------------- secrets


async def test_the_token_reaches_no_job_and_no_log(tmp_path):
    port = free_port()
    log_file = tmp_path / "agent.log"
    env = subprocess_env(PROXY_AGENT_TOKEN=TOKEN)
    process = await _listening("--listen", str(port), "-vv", "--log-file", str(log_file), env=env)
    try:
        async with await AgentClient.connect_tcp("127.0.0.1", port) as client:
            await _start(client, token=TOKEN)
            job = await client.submit("/usr/bin/env")
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            output = client.job_output(job)
            assert "PATH=" in output and "PROXY_AGENT_TOKEN" not in output and TOKEN not in output
            await client.quit()
    finally:
        await _stop(process)
    text = log_file.read_text()
    assert "baseId=1000" in text and "token=********" in text  # the INIT frame is logged, masked
    assert TOKEN not in text
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600


def test_the_token_file_is_never_written_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = private / "token"
    link.symlink_to(victim)
    proc = subprocess.Popen(agent_argv("--listen", "0", "--token-file", str(link)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        assert "listening on" in proc.stderr.readline()
        wait_until_blocking(lambda: not link.is_symlink(), what="the token file in place of the link")
        assert victim.read_text() == "precious\n"
        assert not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o600
        assert len(link.read_text().strip()) >= 32
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(scaled(30))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    run = subprocess.run(agent_argv("--listen", "0", "--token-file", str(shared / "token")), capture_output=True,
                         text=True, env=subprocess_env(), timeout=scaled(30), stdin=subprocess.DEVNULL)
    assert run.returncode == 2
    assert "others can write to that directory" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (shared / "token").exists()


# --------------------------------------------------------------------------- input


async def test_ids_and_numbers_are_ascii_decimal_only():
    async with await AgentClient.spawn(agent_argv(), env=subprocess_env()) as client:
        await _start(client)
        job = await client.submit("/bin/sleep", ["30"])
        await client.wait_job_state(job, "RUNNING", timeout=scaled(30))
        arabic = "".join(chr(0x0660 + int(d)) for d in job)
        for text in (arabic, "_".join(job), f" {job}x", f"+{job}"):
            with pytest.raises(CommandFailed) as failure:
                await client.terminate(text)
            assert failure.value.event.event_id == EventId.TERMINATEJOB_ERROR
        assert client.job(job).get("jobState") == "RUNNING"
        for count in ("١", "1_0", "0x10"):
            command = await client.raw(CommandId.SUBMIT_JOB, ["jobSubId=n", "execPath=/bin/true", f"jobNumProcs={count}"])
            assert command.completion.event_id == EventId.SUBMITJOB_ERROR
            assert "digits 0-9" in command.completion.message
        command = await client.raw(CommandId.SUBMIT_JOB, ["jobSubId=big", "execPath=/bin/true", "jobNumProcs=1000000000"])
        assert "at most 1024" in command.completion.message
        command = await client.raw(CommandId.SUBMIT_JOB, ["jobSubId=long", "execPath=/bin/true"]
                                   + ["progArgs=" + "x" * 100_000] * 40)
        assert command.completion.event_id == EventId.SUBMITJOB_ERROR
        assert "bytes" in command.completion.message
        await client.terminate(job)  # (refused, had one of those ended it)
        ended = await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert ended.get("jobStatus") == "KILLED"
        await client.quit()
        assert client.violations == []
