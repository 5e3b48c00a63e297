"""Co-allocated multi-part jobs end to end: the agent as a subprocess, spoken to over the PTP
protocol by the Python client, its parts run by the local scheduler (and SLURM, where marked),
their processes real Python programs that use ``proxy_agent.runtime``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import trio

from agent_fixtures import agent_argv, console_argv, subprocess_env
from wait_support import scaled, scaled_program
from proxy_agent.client import AgentClient
from proxy_agent.client.errors import CommandFailed
from proxy_agent.protocol.messages import CommandId

#: Every process: wait at the barrier, register "INDEX:RANK@host:port" (a listener of its
#: own), rank 0 lets the agent pass the part's data up, read everyone's data from the job's
#: rendezvous, connect to every other process and say so.
MESH = textwrap.dedent(
    """
    import os, socket, sys, threading
    from proxy_agent import runtime
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    heard = []
    def accept():
        while True:
            conn, _ = listener.accept()
            heard.append(conn.recv(64))
            conn.close()
    threading.Thread(target=accept, daemon=True).start()
    passed = runtime.barrier(timeout=60)
    me = "%d:%d@127.0.0.1:%d" % (passed.part_index, runtime.rank(), listener.getsockname()[1])
    runtime.register(me.encode(), timeout=60)
    if runtime.rank() == 0:
        runtime.forward(timeout=60)
    everyone = [item.decode() for item in runtime.rendezvous_items(level=2, timeout=60)]
    connected = 0
    for peer in everyone:
        if peer == me:
            continue
        host, port = peer.split("@")[1].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(me.encode())
        connected += 1
    # stay (and keep listening) until every peer has connected here too: a process that left
    # early would refuse a slower peer
    import time

    def stay(timeout=60):
        deadline = time.monotonic() + timeout
        while len(heard) < connected and time.monotonic() < deadline:
            time.sleep(0.05)

    stay()
    # each line in one write: the processes of a part may share one output file (unbuffered)
    sys.stdout.write(" ".join(["SEEN", me, "|".join(sorted(everyone)), "connected", str(connected)]) + "\\n")
    sys.stdout.write(" ".join(["HANDLES", os.environ["GLOBUS_GRAM_MULTIJOB_HANDLE"],
                               os.environ["GLOBUS_GRAM_JOB_HANDLE"], os.environ["GLOBUS_GRAM_SUBJOB_RANK"]]) + "\\n")
    sys.stdout.flush()
    """
)

#: Waits at the barrier, then prints its part index and rank.
WAITER = textwrap.dedent(
    """
    import sys
    from proxy_agent import runtime
    passed = runtime.barrier(timeout=120)
    sys.stdout.write(f"PASSED {passed.part_index} {passed.parts} {runtime.rank()}\\n")
    sys.stdout.flush()
    """
)


async def _start(client: AgentClient) -> None:
    await client.reply(await client.send_command(CommandId.INIT, ["version=2.0", "baseId=1000"]), scaled(30))
    await client.model_def()
    await client.start_events()


def _script(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(scaled_program(text))
    return str(path)


def _part(script: str, count: int = 1, **more) -> dict:
    return {"queue": "local:default", "count": count, "executable": sys.executable, "arguments": [script], **more}


async def _state(client: AgentClient, job_id: str, status: str, timeout: float = scaled(30)):
    """Wait for the job to be ``status``; fail at once if it ends in another state."""
    def reached() -> bool:
        job = client.job(job_id)
        now = job.get("jobStatus")
        if now != status and now in ("FINISHED", "FAILED", "KILLED"):
            outputs = {part.id: client.job_output(part) + client.job_output(part, "stderr")
                       for part in client.parts_of(job_id)}
            raise AssertionError(f"job {job_id} ended {now} ({job.get('jobStatusMessage')}), not {status}: {outputs}")
        return now == status

    return await client.wait_for(reached, timeout, description=f"job {job_id} to be {status}")


async def _lines(client: AgentClient, parts, prefix: str, count: int) -> list:
    """The parts' output lines starting with ``prefix``, once there are ``count`` of them (the
    output may reach the client a moment after the job's end)."""
    def found() -> list:
        return [line for part in parts for line in client.job_output(part).splitlines() if line.startswith(prefix)]

    try:
        await client.wait_for(lambda: len(found()) >= count, scaled(30), description=f"{count} {prefix} lines")
    except Exception:
        raise AssertionError([client.job_output(p) + client.job_output(p, "stderr") for p in parts]) from None
    return found()


async def _parts(client: AgentClient, job_id: str, count: int):
    await client.wait_for(lambda: len(client.parts_of(job_id)) == count, scaled(30), description=f"{count} parts")
    return client.parts_of(job_id)


@pytest.mark.trio
async def test_two_local_parts_pass_the_barrier_and_find_each_other_through_the_rendezvous(tmp_path):
    mesh = _script(tmp_path, "mesh.py", MESH)
    # a queue may be named by its scheduler alone: that scheduler's default queue
    description = json.dumps({"name": "mesh", "parts": [_part(mesh, 2, label="a"),
                                                        _part(mesh, 1, label="b", queue="local")]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            job = client.job(job_id)
            assert job.get("coallocId", "").startswith("mj-")
            parts = await _parts(client, job_id, 2)
            # each part is a job of the local scheduler, linked to the multi-part job
            for index, part in enumerate(parts):
                assert client.element(part.get("queueId")).name == "default"
                assert part.get("coallocPart") == str(index)
            await _state(client, job_id, "FINISHED")
            lines = await _lines(client, parts, "SEEN", 3)
            assert len(lines) == 3, lines
            views = {line.split()[2] for line in lines}
            assert len(views) == 1  # every process saw the same three registrations
            everyone = views.pop().split("|")
            assert sorted(item.split("@")[0] for item in everyone) == ["0:0", "0:1", "1:0"]
            assert all(line.endswith("connected 2") for line in lines), lines
            # the handles: the job's, the part's (the job's and the part's id), the part's index
            multi = job.get("coallocId")
            handles = sorted(line.split()[1:] for line in await _lines(client, parts, "HANDLES", 3))
            assert [h[0].rpartition("?")[2] for h in handles] == [multi] * 3
            assert [(h[1].rpartition("?")[2], h[2]) for h in handles] == [
                (f"{multi}/0", "0"), (f"{multi}/0", "0"), (f"{multi}/1", "1")]
            assert handles[0][0].startswith("unix://")
            for part in parts:
                assert part.get("jobStatus") == "FINISHED"


@pytest.mark.trio
async def test_a_failing_part_cancels_the_others_and_the_job_fails(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"parts": [_part(waiter, 2, label="waits"),
                                         {"queue": "local:default", "executable": "/bin/false", "label": "fails"}]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            await _state(client, job_id, "FAILED", scaled(30))
            job = client.job(job_id)
            assert "part 1 ('fails')" in job.get("jobStatusMessage", ""), job.attributes
            assert "before the start barrier was released" in job.get("jobStatusMessage", "")
            parts = await _parts(client, job_id, 2)
            # the waiting part is cancelled in its scheduler within seconds; no process passed
            await client.wait_for(lambda: parts[0].get("jobState") == "COMPLETED", scaled(30),
                                  description="the waiting part to be cancelled")
            assert parts[0].get("jobStatus") == "KILLED"
            assert "PASSED" not in client.job_output(parts[0])


@pytest.mark.trio
async def test_one_process_dying_before_the_barrier_fails_the_job_while_its_part_still_runs(tmp_path):
    half = _script(tmp_path, "half.py", "import sys\nfrom proxy_agent import runtime\n"
                                        "if runtime.rank() == 1:\n    sys.exit(4)\n" + WAITER)
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"parts": [_part(waiter, 1, label="other"), _part(half, 2, label="half")]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            await _state(client, job_id, "FAILED", scaled(30))
            assert client.job(job_id).get("jobStatusMessage") == (
                "process 1 of part 1 ('half') failed before the start barrier was released")
            parts = await _parts(client, job_id, 2)
            await client.wait_for(lambda: all(p.get("jobState") == "COMPLETED" for p in parts), scaled(30),
                                  description="both parts ended")
            assert [p.get("jobStatus") for p in parts] == ["KILLED", "KILLED"]
            assert not any("PASSED" in client.job_output(p) for p in parts)

@pytest.mark.trio
async def test_a_part_that_cannot_be_submitted_fails_the_job_and_bad_descriptions_are_refused(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"parts": [_part(waiter, 1), {"queue": "local:nosuchqueue", "executable": "/bin/true"}]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            await _state(client, job_id, "FAILED", scaled(30))
            message = client.job(job_id).get("jobStatusMessage", "")
            assert "part 1 could not be submitted" in message and "nosuchqueue" in message, message
            parts = await _parts(client, job_id, 1)
            await client.wait_for(lambda: parts[0].get("jobStatus") == "KILLED", scaled(30), description="part 0 cancelled")
            # a malformed description is refused with the part and the field; the agent serves on
            with pytest.raises(CommandFailed) as refused:
                await client.cosubmit('{"parts": [{"executable": "/bin/true", "count": "lots", "label": "x"}]}')
            assert "part 0 ('x')" in str(refused.value) and "count" in str(refused.value)
            with pytest.raises(CommandFailed) as refused:
                await client.cosubmit("+( &(executable=/bin/true)(subjobStartType=sometimes) )")
            assert "part 0" in str(refused.value) and "start" in str(refused.value).lower()
            assert (await client.submit("/bin/true"))  # still serving


@pytest.mark.trio
async def test_cancelling_the_multi_part_job_cancels_every_part(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"barrier_release": "explicit",
                              "parts": [_part(waiter, 2), _part(waiter, 1)]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            parts = await _parts(client, job_id, 2)
            await client.wait_for(lambda: all(p.get("jobStatus") == "RUNNING" for p in parts), scaled(30),
                                  description="both parts running")
            assert client.job(job_id).get("jobStatus") == "PREPARING"
            # bad changes are refused clearly, and change nothing
            with pytest.raises(CommandFailed) as refused:
                await client.change_job(job_id, coallocRelease="sometime")
            assert "now or wait" in str(refused.value)
            with pytest.raises(CommandFailed) as refused:
                await client.change_job(job_id, hold="true")
            assert "cannot be held" in str(refused.value)
            with pytest.raises(CommandFailed) as refused:
                await client.add_part(parts[0], json.dumps(_part(waiter)))
            assert "name the multi-part job" in str(refused.value)
            assert client.job(job_id).get("jobStatus") == "PREPARING"
            await client.terminate(job_id)
            await _state(client, job_id, "KILLED", scaled(30))
            await client.wait_for(lambda: all(p.get("jobStatus") == "KILLED" for p in parts), scaled(30),
                                  description="every part cancelled")
            assert not any("PASSED" in client.job_output(p) for p in parts)


@pytest.mark.trio
async def test_parts_are_added_and_deleted_until_the_release_and_not_after(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"barrier_release": "explicit",
                              "parts": [_part(waiter, 1, label="first"), _part(waiter, 1, label="second")]})
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--scheduler", "local"), env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            first, second = await _parts(client, job_id, 2)
            added = await client.add_part(job_id, json.dumps(_part(waiter, 2, label="third")))
            assert client.job(added).get("coallocJob") == job_id
            assert client.job(added).get("coallocPart") == "2"
            await client.delete_part(second)
            await client.wait_for(lambda: second.get("jobStatus") == "KILLED", scaled(30), description="second cancelled")
            await client.wait_for(lambda: client.job(job_id).get("coallocParts") == "2", scaled(30),
                                  description="the job to have two parts")
            await client.release_barrier(job_id, wait_for_parts=True)
            await _state(client, job_id, "FINISHED", scaled(30))
            # the parts left are indexes 0 and 1 of two; every process passed
            assert await _lines(client, [first], "PASSED", 1) == ["PASSED 0 2 0"]
            await _lines(client, [added], "PASSED", 2)
            assert sorted(client.job_output(added).splitlines()) == ["PASSED 1 2 0", "PASSED 1 2 1"]
            assert "PASSED" not in client.job_output(second)
            # after the release the parts are fixed
            with pytest.raises(CommandFailed) as refused:
                await client.add_part(job_id, json.dumps(_part(waiter, 1)))
            assert "released" in str(refused.value) or "ended" in str(refused.value)


# --------------------------------------------------------------------------- the console


def _console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(console_argv(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(90),
                          env=subprocess_env())


def test_console_cosubmit_runs_a_multi_request_job_and_shows_its_parts_output(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    path = tmp_path / "job.rsl"
    path.write_text(textwrap.dedent(f"""\
        &(name = pair)
         ( +( &(resourceManagerContact = "local:default")(count = 2)
               (executable = "{sys.executable}")(arguments = "{waiter}")(label = left) )
            ( &(resourceManagerContact = "local:default")
               (executable = "{sys.executable}")(arguments = "{waiter}")(label = right) ) )
        """))
    run = _console("-c", f"quiet on; cosubmit {path}")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "submitted multi-part job" in out
    assert sorted(line.split("] ", 1)[1] for line in out.splitlines() if "PASSED" in line) == [
        "PASSED 0 2 0", "PASSED 0 2 1", "PASSED 1 2 0"]
    assert "part 0: job" in out and "pair.left" in out and "FINISHED" in out


def test_console_cosubmit_fails_with_the_reason_and_release_opens_an_explicit_barrier(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps({"parts": [_part(waiter, 1), {"queue": "local:default", "executable": "/bin/false",
                                                                "label": "bad"}]}))
    run = _console("-c", f"quiet on; cosubmit {failing}")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED: process 0 of part 1 ('bad') failed before the start barrier was released" in run.stderr
    assert "PASSED" not in run.stdout

    explicit = tmp_path / "explicit.json"
    explicit.write_text(json.dumps({"barrier_release": "explicit", "parts": [_part(waiter, 1), _part(waiter, 1)]}))
    run = _console("-c", f"quiet on; cosubmit --no-wait {explicit}; sleep 1; show .; release .; wait . FINISHED")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "jobStatus" in run.stdout and "PREPARING" in run.stdout  # held at the barrier until released

    run = _console("-c", f"cosubmit {tmp_path / 'missing.json'}")
    assert run.returncode == 1 and "cannot read" in run.stderr


# --------------------------------------------------------------------------- the agent's options


def test_the_runtime_listens_where_the_options_say(tmp_path):
    from proxy_agent.__main__ import StateDir, build_parser, runtime_settings

    state = StateDir(str(tmp_path))
    state.usable = True

    def settings(*argv, names=("local",)):
        return runtime_settings(build_parser().parse_args(list(argv)), names, state)

    assert settings().unix_path == str(tmp_path / "runtime.sock")
    assert settings().tcp_host is None  # only local processes: no TCP
    # with a batch scheduler: where compute nodes reach this host (see RuntimeServer)
    assert settings(names=("local", "slurm")).tcp_host == "auto"
    assert settings("--runtime-tcp", "0.0.0.0", names=("local", "slurm")).tcp_host == "0.0.0.0"
    assert settings("--runtime-tcp", "none", names=("slurm",)).tcp_host is None
    chosen = settings("--runtime-tcp", "127.0.0.1:4711", "--runtime-advertise", "login1", "--runtime-socket", "x.sock")
    assert (chosen.tcp_host, chosen.tcp_port, chosen.advertise_host) == ("127.0.0.1", 4711, "login1")
    assert chosen.unix_path.endswith("/x.sock") and chosen.unix_path.startswith("/")
    for bad in ("host:port", "host:70000"):
        with pytest.raises(ValueError, match="--runtime-tcp"):
            settings("--runtime-tcp", bad)
    state.usable = False
    assert settings().unix_path is None  # a private directory of the agent's instead


@pytest.mark.trio
async def test_a_no_barrier_part_on_the_simulated_cluster_runs_on_its_own(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    description = json.dumps({"parts": [
        _part(waiter, 1, label="real"),
        {"queue": "sim:debug", "count": 4, "executable": "/bin/app", "label": "simulated", "start_type": "no-barrier"},
    ]})
    argv = agent_argv("--scheduler", "local,sim", "--sim-nodes", "4", "--sim-time-scale", "0.05")
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
            await _start(client)
            job_id = await client.cosubmit(description)
            real, simulated = await _parts(client, job_id, 2)
            assert client.element(simulated.get("queueId")).get("backend") == "sim"
            assert simulated.get("coallocJob") == job_id
            await _state(client, job_id, "FINISHED", scaled(30))
            # the simulated part ran nothing and never checked in; the real one passed alone
            assert await _lines(client, [real], "PASSED", 1) == ["PASSED 0 2 0"]
            assert simulated.get("jobStatus") == "FINISHED"


# --------------------------------------------------------------------------- the PTP mapping


def test_submissions_and_changes_of_multi_part_jobs_map_to_the_service():
    from proxy_agent.frontends.ptp import mapping
    from proxy_agent.protocol.attributes import AttributeSet
    from proxy_agent.service.jobs import JobError, ServiceError

    def spec(*args: str):
        return mapping.job_spec(AttributeSet.parse(list(args)), str, lambda ref: int(ref) - 1000)

    text = '{"parts": [{"executable": "/bin/true"}]}\n'
    whole = spec("jobSubId=s1", "jobName=demo", f"coallocDescription={text}")
    assert (whole.client_ref, whole.name, whole.extra_value("coallocDescription")) == ("s1", "demo", text)
    assert whole.extra_value("coallocJob") is None
    added = spec("jobSubId=s2", "coallocDescription=&(executable=/bin/true)", "coallocJob=1042")
    assert added.extra_value("coallocJob") == "42"  # the element id turned into the service key
    with pytest.raises(ServiceError, match="jobSubId"):
        spec("coallocDescription=[]")
    assert mapping.job_change(AttributeSet.parse(["jobId=1042", "coallocRelease=now"])) == ("release", False)
    assert mapping.job_change(AttributeSet.parse(["jobId=1042", "coallocRelease=WAIT"])) == ("release", True)
    with pytest.raises(JobError, match="now or wait"):
        mapping.job_change(AttributeSet.parse(["jobId=1042", "coallocRelease=later"]))
    with pytest.raises(JobError, match="cannot be changed together"):
        mapping.job_change(AttributeSet.parse(["jobId=1042", "coallocRelease=now", "hold=false"]))
