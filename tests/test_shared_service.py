"""One service per state directory, which every launch joins, end to end.

The IDE's own launch form (``--proxy=tcp --host= --port=``, connecting back), stdio launches,
``--unix`` launches, the console and the Invoke Server, all on one state directory, in several
orders of starting and stopping: each is a session of the one service (one process holds the
directory), sees what an agent of its own would show (INIT, MODEL_DEF, START_EVENTS under its
own base id and dialect) and the same jobs as every other.  Then what a launch asks of the
service (schedulers added, options it cannot apply told in one MESSAGE), what becomes of a
departed client's local jobs, how the service leaves (idle, stopped, killed), races of launches
on an empty directory, and what the launched process does with its stdio.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import List, Optional

import pytest
import trio

from wait_support import scaled
from agent_fixtures import BackgroundAgent, agent_argv, console_argv, service_pid, subprocess_env
from proxy_agent.client import AgentClient, AgentProcess, listen_for_agent
from proxy_agent.endpoints import lock_holder
from proxy_agent.frontends.invoke.protocol import InvokeStatus
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.wire import Decoder, encode_frame

from test_invoke_server import InvokeClient, alive, attributes, processes_of
from test_reference_client_e2e import IDE_BASE, check_default_dialect, ide_handshake

#: Generous: a loaded two-core machine starts Pythons slowly.
DEADLINE = scaled(60)


def _services(state: Path) -> List[int]:
    """The service processes of a state directory (found by their command lines)."""
    found = []
    for pid in processes_of(state):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"service" in words:
            found.append(pid)
    return found


@asynccontextmanager
async def ide_session(state: Path, *args: str, base_id: int = IDE_BASE, dialect: Optional[str] = None):
    """A launch as the IDE makes it (connecting back to a port it listens on), driven by the
    reference client (the default dialect) or a native one; yields (client, launch process)."""
    async with await listen_for_agent("127.0.0.1", 0) as listener:
        argv = agent_argv("--proxy=tcp", "--host=localhost", f"--port={listener.port}", "--state-dir", str(state),
                          *args)
        process = await AgentProcess.start(argv, env=subprocess_env(), stdio=False)
        client = await listener.accept(process=process, timeout=DEADLINE, reference=dialect is None, dialect=dialect)
    async with client:
        yield client, process


async def _handshake(client: AgentClient, base_id: int) -> None:
    await client.init(base_id=base_id)
    await client.model_def()
    await client.start_events()
    await client.wait_for(lambda: client.queues and client.nodes, DEADLINE, description="the initial model")


@asynccontextmanager
async def invoke_server(state: Path):
    """The Invoke Server as a Ninf-G client starts it, on ``state``."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "proxy_agent.invoke", "--state-dir", str(state)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(),
    )
    client = InvokeClient(proc)
    client.timeout = DEADLINE
    try:
        yield client
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()


def _job_by_sub(client: AgentClient, sub: str):
    return client.state.jobs_by_sub.get(sub)


async def _runs_a_job(client: AgentClient, text: str) -> str:
    job = await client.submit("/bin/echo", [text])
    done = await client.wait_job_state(job, "COMPLETED", DEADLINE)
    assert client.job_output(done) == text + "\n"
    return done.sub_id


# --------------------------------------------------------------------------- all together


async def test_the_ides_launch_joins_a_directory_held_by_a_unix_launch_the_invoke_server_and_another_ide(tmp_path):
    state = tmp_path / "state"
    ninfg_out = tmp_path / "ninfg.out"
    with trio.fail_after(4 * DEADLINE):
        # The Invoke Server starts the service in the background; its job runs on.
        async with invoke_server(state) as invoke:
            go = tmp_path / "go"
            body = f'echo ninfg started; while [ ! -e "{go}" ]; do sleep 0.05; done; echo ninfg done'
            ninfg = await invoke.created_job(1, attributes("/bin/sh", ["-c", body], workdir=tmp_path, out=ninfg_out))
            await invoke.find_notify(lambda line: line == f"STATUS_NOTIFY {ninfg} ACTIVE started")
            service = service_pid(state)
            # A --unix launch joins, and a console is its client.
            unix_path = str(tmp_path / "mine.sock")
            async with BackgroundAgent("--unix", unix_path, "--state-dir", str(state)):
                console = await AgentClient.connect_unix(unix_path)
                async with console:
                    await _handshake(console, 3000)
                    # Another IDE session (the design's own dialect), then the IDE's launch form.
                    async with ide_session(state, dialect="native") as (other_ide, other_launch):
                        await _handshake(other_ide, 7000)
                        async with ide_session(state) as (ide, launch):
                            wire = await ide_handshake(ide)
                            assert service_pid(state) == service and _services(state) == [service]
                            # Each sees the Invoke Server's running job, under its own ids.
                            seen = {}
                            for client, base in ((ide, IDE_BASE), (other_ide, 7000), (console, 3000)):
                                job = await client.wait_for(
                                    lambda c=client: next((j for j in c.jobs.values()
                                                           if (j.sub_id or "").startswith("ninfg-")), None),
                                    DEADLINE, description="the Invoke Server's job")
                                seen[base] = int(job.id) - base
                                assert job.get("jobStatus") == "RUNNING"
                            assert len(set(seen.values())) == 1  # one job key, each client's base id
                            # What the IDE submits, the others see; each its own id of it.
                            sub = await _runs_a_job(ide, "from the ide")
                            for client, base in ((other_ide, 7000), (console, 3000)):
                                job = await client.wait_for(lambda c=client: _job_by_sub(c, sub), DEADLINE,
                                                            description="the IDE's job")
                                assert int(job.id) - base == int(_job_by_sub(ide, sub).id) - IDE_BASE
                                await client.wait_job_state(job, "COMPLETED", DEADLINE)
                            assert ide.violations == []
                            await ide.quit()
                        check_default_dialect(wire, ide)
                        assert await launch.wait() == 0  # the IDE's launch ended with its client
                        # The others go on.
                        await _runs_a_job(other_ide, "after the ide left")
                        go.touch()
                        final = await invoke.final_status(ninfg)
                        assert (final.status, final.text) == (InvokeStatus.DONE, "exit status 0")
                        await other_ide.quit()
                    await _runs_a_job(console, "the console still")
                    await console.quit()
            # The --unix launch has ended (SIGTERM); the Invoke Server still reaches the service.
            ninfg2 = await invoke.created_job(2, attributes("/bin/echo", ["again"], workdir=tmp_path, out=ninfg_out))
            assert (await invoke.final_status(ninfg2)).status is InvokeStatus.DONE
            assert service_pid(state) == service
            await invoke.send(b"EXIT\r\n")
            assert await invoke.reply() == "S"
    assert ninfg_out.read_text() == "ninfg started\nninfg done\nagain\n"


ORDERS = [
    # (who starts in turn, who stops in turn)
    (["invoke", "ide", "console"], ["invoke", "ide", "console"]),
    (["console", "invoke", "ide"], ["console", "ide", "invoke"]),
    (["ide", "console", "invoke"], ["ide", "invoke", "console"]),
]


@pytest.mark.parametrize("starts, stops", ORDERS, ids=["-".join(s) + "/" + "-".join(t) for s, t in ORDERS])
async def test_the_ide_the_invoke_server_and_the_console_in_any_order(tmp_path, starts, stops):
    """Whoever comes first starts the service, the others join it; each works while the others
    come and go; the last one leaves the service to its idle end."""
    state = tmp_path / "state"
    with trio.fail_after(4 * DEADLINE):
        async with trio.open_nursery() as nursery:
            running = {}
            stop_events = {name: trio.Event() for name in starts}
            done_events = {name: trio.Event() for name in starts}
            check = {}

            async def ide() -> None:
                async with ide_session(state) as (client, launch):
                    await ide_handshake(client)
                    check["ide"] = lambda: _runs_a_job(client, "ide")
                    running["ide"].set()
                    await stop_events["ide"].wait()
                    await client.quit()
                assert await launch.wait() == 0

            async def console() -> None:
                # the console spawns its agent: a stdio launch on the same directory
                argv = console_argv("-q", "--spawn", *agent_argv("--state-dir", str(state)))
                process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                           stderr=subprocess.PIPE, env=subprocess_env())
                output = bytearray()

                async def read() -> None:
                    while True:
                        data = await process.stdout.receive_some(65536)
                        if not data:
                            return
                        output.extend(data)

                async def run(line: str) -> None:
                    before = len(output)
                    await process.stdin.send_all(line.encode() + b"\n")
                    with trio.fail_after(DEADLINE):
                        while b"FINISHED" not in output[before:]:
                            await trio.sleep(0.05)

                async with trio.open_nursery() as inner:
                    inner.start_soon(read)
                    check["console"] = lambda: run("submit /bin/echo console --wait")
                    running["console"].set()
                    await stop_events["console"].wait()
                    await process.stdin.send_all(b"quit\n")
                    await process.stdin.aclose()
                    assert await process.wait() == 0

            async def invoke() -> None:
                async with invoke_server(state) as server:
                    numbers = iter(range(1, 100))

                    async def job() -> None:
                        number = next(numbers)
                        created = await server.created_job(number, attributes("/bin/true", ["x"], workdir=tmp_path))
                        assert (await server.final_status(created)).status is InvokeStatus.DONE

                    check["invoke"] = job
                    running["invoke"].set()
                    await stop_events["invoke"].wait()
                    await server.send(b"EXIT\r\n")
                    assert await server.reply() == "S"
                    assert await server.wait() == 0

            roles = {"ide": ide, "console": console, "invoke": invoke}

            async def role(name: str) -> None:
                try:
                    await roles[name]()
                finally:
                    done_events[name].set()

            services = set()
            for name in starts:
                running[name] = trio.Event()
                nursery.start_soon(role, name)
                await running[name].wait()
                for other in check:  # everyone that runs works
                    await check[other]()
                services.add(service_pid(state))
            assert len(services) == 1 and _services(state) == list(services)
            for name in stops:
                stop_events[name].set()
                await done_events[name].wait()
                check.pop(name)
                for other in check:
                    await check[other]()
                assert service_pid(state) in services  # the service stays for the others, and after


# --------------------------------------------------------------------------- what a launch asks


def _launch(state: Path, *args: str, env: Optional[dict] = None):
    return AgentClient.spawn(agent_argv("--state-dir", str(state), *args), env=env or subprocess_env())


async def test_a_launch_adds_the_schedulers_the_service_lacks_for_every_session(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(2 * DEADLINE):
        async with await _launch(state, "--scheduler", "local") as first:
            await _handshake(first, 1000)
            assert {q.get("backend") for q in first.queues.values()} == {"local"}
            async with await _launch(state, "--scheduler", "sim,local", "--sim-nodes", "3") as second:
                await _handshake(second, 5000)
                # the new session has both, and its default queue is its first scheduler's
                assert {q.get("backend") for q in second.queues.values()} == {"sim", "local"}
                job = await second.submit("/bin/true")
                assert second.element(second.job(job).parent).get("backend") == "sim"
                # the first session sees the simulated machine and its three nodes arrive
                await first.wait_for(lambda: {q.get("backend") for q in first.queues.values()} == {"local", "sim"},
                                     DEADLINE, description="the added scheduler's queues")
                await first.wait_for(lambda: len(first.nodes) == 1 + 3, DEADLINE, description="its nodes")
                # and its own submissions still go to its own first scheduler
                own = await first.submit("/bin/true")
                assert first.element(first.job(own).parent).get("backend") == "local"
                assert first.messages == [] and second.messages == []
                await second.quit()
            await first.quit()


async def test_options_the_service_cannot_apply_are_told_in_one_message_and_on_stderr(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(2 * DEADLINE):
        async with await _launch(state, "--scheduler", "sim", "--sim-nodes", "3") as first:
            await _handshake(first, 1000)
            # the same options again: nothing to say
            async with await _launch(state, "--scheduler", "sim", "--sim-nodes", "3") as same:
                await _handshake(same, 3000)
                await same.quit()
            assert same.messages == []
            async with await _launch(state, "--scheduler", "sim", "--sim-nodes", "5", "--runtime-tcp", "none",
                                     "--idle-exit", "30") as other:
                await _handshake(other, 5000)
                await other.wait_for(lambda: other.messages, DEADLINE, description="the MESSAGE")
                await other.quit()
            assert len(other.messages) == 1, other.messages
            text = other.messages[0].text
            assert "not applied" in text and str(state) in text
            assert "--sim-nodes=5 (the service's sim scheduler has 3)" in text
            assert "--runtime-tcp=none (the service has auto)" in text
            assert "--idle-exit=30 (the service has 600)" in text
            stderr = other.process.stderr_tail(lines=100)
            assert "--sim-nodes=5" in stderr and "Traceback" not in stderr
            # the service kept its own: three simulated nodes
            assert len(first.nodes) == 3 and first.messages == []
            await first.quit()


async def test_a_command_line_the_service_cannot_use_is_one_line_and_status_2(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(DEADLINE):
        async with await _launch(state) as first:  # a running service reads the line
            await _handshake(first, 1000)
            bad = await trio.to_thread.run_sync(lambda: subprocess.run(
                agent_argv("--state-dir", str(state), "--sim-nodes", "-1"), stdin=subprocess.DEVNULL,
                capture_output=True, text=True, env=subprocess_env(), timeout=DEADLINE))
            assert bad.returncode == 2 and bad.stdout == ""
            assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "--sim-nodes" in bad.stderr
            await _runs_a_job(first, "still serving")
            await first.quit()
    # and with no service yet, none is left behind for a line that cannot be used
    empty = tmp_path / "empty"
    bad = subprocess.run(agent_argv("--state-dir", str(empty), "--no-such-option"), stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, env=subprocess_env(), timeout=DEADLINE)
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-option" in bad.stderr
    assert lock_holder(str(empty)) is None


# --------------------------------------------------------------------------- a client that goes


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _running_sleeper(client: AgentClient) -> int:
    job = await client.submit("/bin/sleep", ["120"])
    running = await client.wait_job_state(job, "RUNNING", DEADLINE)
    return int(client.job_process(running, 0).get("processPID"))


async def test_on_disconnect_terminate_ends_the_local_jobs_of_the_session_that_goes_and_only_those(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state) as watcher:
            await _handshake(watcher, 9000)
            async with await _launch(state, "--on-disconnect", "keep") as keeper:
                await _handshake(keeper, 5000)
                kept = await _running_sleeper(keeper)
                async with await _launch(state) as leaver:
                    await _handshake(leaver, 1000)
                    ended = await _running_sleeper(leaver)
                    await leaver.stream.send_stream.aclose()  # its client goes away
                    while leaver.ended is None:
                        await trio.sleep(0.02)
                assert leaver.process.returncode == 0
                # its job ended before its launch did; the other session's runs on
                assert not _process_alive(ended) and _process_alive(kept)
                await keeper.quit()
            assert keeper.process.returncode == 0 and _process_alive(kept)
            # the watcher saw one killed and sees the other running
            statuses = sorted(j.get("jobStatus") for j in watcher.jobs.values())
            await watcher.wait_for(lambda: sorted(j.get("jobStatus") for j in watcher.jobs.values())
                                   == ["KILLED", "RUNNING"], DEADLINE, description="one killed, one running")
            assert statuses is not None
            for job in list(watcher.jobs.values()):
                if job.get("jobStatus") == "RUNNING":
                    await watcher.terminate(job)
                    await watcher.wait_job_state(job, "COMPLETED", DEADLINE)
            await watcher.quit()
    assert not _process_alive(kept)


# --------------------------------------------------------------------------- the service's own life


async def test_the_service_outlives_its_first_launch_and_leaves_when_idle(tmp_path):
    state = tmp_path / "state"
    log = state / "agent.log"
    go = tmp_path / "go"
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state, "--idle-exit", "1", "--on-disconnect", "keep") as first:
            await _handshake(first, 1000)
            service = service_pid(state)
            assert service != first.process.pid
            await first.submit("/bin/sh", ["-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done'])
            await first.quit()
        assert first.process.returncode == 0
        # no client, but a local job runs: the service stays (three times its idle time)
        await trio.sleep(3)
        assert _process_alive(service) and lock_holder(str(state)) is not None
        go.touch()
        while lock_holder(str(state)) is not None:
            await trio.sleep(0.05)
    assert not (state / "agent.sock").exists()
    text = log.read_text()
    assert f"proxy-agent[{service}] INFO proxy_agent.daemon: stopping: no client and no running local job for 1 s" in text


def test_idle_exit_takes_seconds_or_never():
    from proxy_agent.__main__ import DEFAULT_IDLE_EXIT, idle_exit_seconds

    assert idle_exit_seconds(None) == DEFAULT_IDLE_EXIT == 600
    assert idle_exit_seconds("never") is None and idle_exit_seconds("0") == 0 and idle_exit_seconds("2.5") == 2.5
    for bad in ("soon", "-1", "1e12"):
        with pytest.raises(ValueError, match="--idle-exit"):
            idle_exit_seconds(bad)


async def test_proxy_agent_stop_stops_the_service_and_its_jobs_go_on_for_the_next(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state, "--on-disconnect", "keep") as first:
            await _handshake(first, 1000)
            pid = await _running_sleeper(first)
            sub = next(iter(first.jobs.values())).sub_id
            service = service_pid(state)
            stop = await trio.to_thread.run_sync(lambda: subprocess.run(
                agent_argv("stop", "--state-dir", str(state)), capture_output=True, text=True,
                env=subprocess_env(), timeout=DEADLINE))
            assert stop.returncode == 0 and f"stopped the service of {state} (process {service})" in stop.stdout
            # its client is told, and its launch ends
            await first.wait_for(lambda: first.ended is not None, DEADLINE, description="the end of the session")
        assert any("stop" in m.text for m in first.messages), first.messages
        assert _process_alive(pid) and lock_holder(str(state)) is None
        again = subprocess.run(agent_argv("stop", "--state-dir", str(state)), capture_output=True, text=True,
                               env=subprocess_env(), timeout=DEADLINE)
        assert again.returncode == 0 and "no service runs on" in again.stdout
        # the next launch starts a service, which adopts the job
        async with await _launch(state) as second:
            await _handshake(second, 1000)
            job = await second.wait_for(lambda: _job_by_sub(second, sub), DEADLINE, description="the adopted job")
            assert job.get("jobStatus") == "RUNNING" and service_pid(state) != service
            await second.terminate(job)
            await second.wait_job_state(job, "COMPLETED", DEADLINE)
            await second.quit()
    assert not _process_alive(pid)


async def test_a_killed_service_ends_its_relays_and_the_next_launch_takes_over_its_socket_and_jobs(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state) as first:
            await _handshake(first, 1000)
            job = await first.submit("/bin/sh", ["-c", "echo one; sleep 1; echo two"])
            await first.wait_for(lambda: first.job(job).output, DEADLINE, description="the first line")
            service = service_pid(state)
            os.kill(service, signal.SIGKILL)
            while first.ended is None:
                await trio.sleep(0.02)
            await first.process.wait()
        # the launch says what happened, and leaves
        assert first.process.returncode == 1
        assert f"the service of {state} (process {service}) ended" in first.process.stderr_tail(lines=20)
        # what the dead service left: its socket file (nobody answers) and its lock file
        assert (state / "agent.sock").exists() and lock_holder(str(state)) is None
        async with await _launch(state) as second:
            await _handshake(second, 1000)
            assert service_pid(state) != service
            adopted = await second.wait_for(lambda: _job_by_sub(second, first.job(job).sub_id), DEADLINE,
                                            description="the adopted job")
            done = await second.wait_job_state(adopted, "COMPLETED", DEADLINE)
            # every line once, across the two
            lines = [line.text for line in first.job(job).output] + [line.text for line in done.output]
            assert lines == ["one", "two"], lines
            await second.quit()


def test_launches_at_the_same_moment_on_an_empty_directory_share_one_service(tmp_path):
    state = tmp_path / "state"
    init = encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"])
    quit_ = encode_frame(int(CommandId.QUIT), 2, [])
    launches = [subprocess.Popen(agent_argv("--state-dir", str(state)), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
                for _ in range(4)]
    try:
        for launch in launches:  # each is answered, by the one service
            launch.stdin.write(init)
            launch.stdin.flush()
            decoder = Decoder()
            while not decoder.buffered and not list(decoder):
                data = os.read(launch.stdout.fileno(), 4096)
                assert data, launch.stderr.read()
                decoder.feed(data)
        assert _services(state) == [service_pid(state)]
        for launch in launches:
            out, err = launch.communicate(quit_, timeout=DEADLINE)
            assert launch.returncode == 0, err
            assert b"Traceback" not in err
    finally:
        for launch in launches:
            if launch.poll() is None:
                launch.kill()
                launch.wait()


# --------------------------------------------------------------------------- the launched process


def test_the_launch_holds_nothing_of_its_stdio_in_the_service(tmp_path):
    """A launch that started the service ends, and its stdin, stdout and stderr are closed for
    good (an ssh channel would close): the service kept none of them."""
    env = subprocess_env()
    init = encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"])
    quit_ = encode_frame(int(CommandId.QUIT), 2, [])
    process = subprocess.Popen(agent_argv("--state-dir", str(tmp_path / "state"), "-v"), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = process.communicate(init + quit_, timeout=DEADLINE)  # reads both to their end
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    decoder = Decoder()
    decoder.feed(out)
    assert [(frame.msg_id, frame.tid) for frame in decoder][0] == (0, 1) and decoder.buffered == 0
    assert lock_holder(str(tmp_path / "state")) is not None  # while the service runs on
    assert b"started the service" in err


def test_a_launch_on_regular_files_reads_its_input_and_writes_its_output_there(tmp_path):
    """A client's output that the service cannot take over (a regular file, which cannot be
    waited on) is written by the launch; input from a file is read to its end as a pipe's."""
    frames = (encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"])
              + encode_frame(int(CommandId.MODEL_DEF), 2, [])
              + encode_frame(int(CommandId.QUIT), 3, []))
    given = tmp_path / "in"
    given.write_bytes(frames)
    written = tmp_path / "out"
    with open(given, "rb") as stdin, open(written, "wb") as stdout:
        done = subprocess.run(agent_argv("--state-dir", str(tmp_path / "state")), stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, env=subprocess_env(), timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    decoder = Decoder()
    decoder.feed(written.read_bytes())
    answers = [(frame.msg_id, frame.tid) for frame in decoder]
    assert decoder.buffered == 0 and answers[0] == (0, 1), answers  # whole frames: OK for INIT first
    assert answers[-1] == (int(EventId.SHUTDOWN), 3) and (0, 2) in answers, answers


async def test_a_unix_launch_stopped_tells_its_clients_and_leaves_the_service_to_the_others(tmp_path):
    state = tmp_path / "state"
    path = str(tmp_path / "mine.sock")
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state) as other:
            await _handshake(other, 9000)
            unix = BackgroundAgent("--unix", path, "--state-dir", str(state))
            async with unix:
                client = await AgentClient.connect_unix(path)
                async with client:
                    await _handshake(client, 1000)
                    unix.process.process.send_signal(signal.SIGTERM)
                    await client.wait_for(lambda: client.ended is not None, DEADLINE, description="the end")
                    assert any("SIGTERM" in m.text for m in client.messages), client.messages
                assert await unix.process.wait() == 0
            assert not os.path.exists(path)
            await _runs_a_job(other, "the service serves on")
            await other.quit()


def test_the_invoke_server_imports_nothing_of_the_ptp_client():
    probe = ("import sys, proxy_agent.frontends.invoke.__main__, proxy_agent.frontends.invoke.agent; "
             "print(sorted(m for m in sys.modules if m.startswith(('proxy_agent.client', 'proxy_agent.protocol', "
             "'proxy_agent.frontends.ptp'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=subprocess_env(),
                          timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_output_a_departed_client_never_got_goes_to_the_next(tmp_path):
    """Lines held for a client that stopped events and then left are given to the next
    client of the service (as lines written while nobody listened are): none is lost."""
    state = tmp_path / "state"
    go, done = tmp_path / "go", tmp_path / "done"
    script = f'echo one; while [ ! -e "{go}" ]; do sleep 0.05; done; echo two; echo three; touch "{done}"'
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state, "--on-disconnect", "keep") as first:
            await _handshake(first, 1000)
            job = await first.submit("/bin/sh", ["-c", script])
            await first.wait_for(lambda: first.job(job).output, DEADLINE, description="the first line")
            sub = first.job(job).sub_id
            await first.stop_events()
            go.touch()
            while not done.exists():
                await trio.sleep(0.05)
            await first.stream.send_stream.aclose()  # it leaves without reading on
            while first.ended is None:
                await trio.sleep(0.02)
        assert [line.text for line in first.job(job).output] == ["one"]
        async with await _launch(state) as second:
            await _handshake(second, 1000)
            element = await second.wait_for(lambda: _job_by_sub(second, sub), DEADLINE, description="the job")
            done_job = await second.wait_job_state(element, "COMPLETED", DEADLINE)
            await second.wait_for(lambda: len(done_job.output) == 2, DEADLINE, description="the lines it held")
            assert [line.text for line in done_job.output] == ["two", "three"]
            await second.quit()
