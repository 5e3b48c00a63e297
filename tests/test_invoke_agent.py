"""The Invoke Server's jobs are the agent's: the server over real pipes, the service of its
state directory (started by the server, or already running), reached through the service
interface; a PTP client of that service on the same socket, the job store, a restart of the
service under a running job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.client import AgentClient
from proxy_agent.frontends.invoke.agent import AgentJobs, AgentSettings
from proxy_agent.frontends.invoke.protocol import InvokeStatus, encode_job_create
from proxy_agent.service.jobs import JobSpec, JobState

from test_invoke_server import (
    TIMEOUT,
    agent_pid,
    alive,
    attributes,
    invoke_server,
    processes_of,
    script,
    sleeper,
    stop_agent,
    wait_for_file,
    wait_gone,
)


async def _ptp_client_of(state_dir: Path):
    client = await AgentClient.connect_unix(str(state_dir / "agent.sock"))
    return client


async def test_a_ptp_client_of_the_agent_sees_the_job_and_can_end_it(tmp_path):
    state = tmp_path / "state"
    args, pidfile = sleeper(tmp_path, "seen")
    async with invoke_server(state_dir=state) as invoke:
        job = await invoke.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        await invoke.find_notify(lambda l: l == f"STATUS_NOTIFY {job} ACTIVE started")
        pid = await wait_for_file(pidfile)
        async with await _ptp_client_of(state) as ptp:
            await ptp.init(base_id=5000)
            await ptp.model_def()
            await ptp.start_events()
            seen = [j for j in ptp.jobs.values() if (j.sub_id or "").startswith("ninfg-")]
            assert len(seen) == 1, ptp.jobs
            element = seen[0]
            assert element.get("progArgs") == args
            assert element.get("workingDir") == str(tmp_path)
            assert (element.get("execPath"), element.get("execName")) == ("/bin", "sh")
            assert element.get("jobStatus") == "RUNNING"
            # The PTP client ends the job; the Ninf-G client hears of it.
            await ptp.terminate(element.id)
            final = await invoke.final_status(job)
            assert (final.status, final.text) == (InvokeStatus.DONE, "cancelled")
            assert not alive(pid)
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0
        # The job store of the state directory keeps it (written within a second).
        with trio.fail_after(TIMEOUT):
            while True:
                listed = subprocess.run(
                    [sys.executable, "-m", "proxy_agent", "jobs", "--state-dir", str(state), "--json"],
                    capture_output=True, text=True, env=subprocess_env(), timeout=TIMEOUT,
                )
                rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
                assert len(rows) == 1, listed
                assert rows[0]["client_ref"].startswith("ninfg-")
                if rows[0]["state"] == "KILLED":
                    break
                await trio.sleep(0.2)


async def test_the_server_uses_the_agent_already_serving_the_state_directory(tmp_path):
    state = tmp_path / "state"
    agent = await trio.lowlevel.open_process(
        agent_argv("--unix", str(tmp_path / "mine.sock"), "--state-dir", str(state)),
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=subprocess_env(),
    )
    try:
        with trio.fail_after(TIMEOUT):
            while not (tmp_path / "mine.sock").exists():
                await trio.sleep(0.05)
        service = agent_pid(state)
        assert service is not None and service != agent.pid  # the launch's service, in the background
        out = tmp_path / "out"
        async with invoke_server(state_dir=state) as invoke:
            job = await invoke.created_job(1, attributes("/bin/echo", ["from", "the agent"], workdir=tmp_path, out=out))
            final = await invoke.final_status(job)
            assert (final.status, final.text) == (InvokeStatus.DONE, "exit status 0")
            await invoke.send(b"EXIT\r\n")
            assert await invoke.reply() == "S"
            assert await invoke.wait() == 0
            assert agent_pid(state) == service  # it started none
        assert out.read_text() == "from the agent\n"
    finally:
        agent.terminate()
        with trio.CancelScope(shield=True):
            await agent.wait()


async def test_two_servers_share_one_agent(tmp_path):
    state = tmp_path / "state"
    async with invoke_server(state_dir=state) as first, invoke_server(state_dir=state) as second:
        # Both start at once, and both may find no agent: one agent wins the directory.
        for client in (first, second):
            await client.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=tmp_path)))
        for client in (first, second):
            assert await client.reply() == "S"
            final = await client.final_status("job-1")
            assert final.status is InvokeStatus.DONE, final
        # An agent started by the other server finds the directory taken and leaves.
        with trio.fail_after(TIMEOUT):
            while [p for p in processes_of(state) if not _is_keeper(p)] != [agent_pid(state)]:
                await trio.sleep(0.1)
        for client in (first, second):
            await client.send(b"EXIT\r\n")
            assert await client.reply() == "S"


def _is_keeper(pid: int) -> bool:
    try:
        return b"keeper" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def test_a_job_survives_a_restart_of_the_agent(tmp_path):
    state = tmp_path / "state"
    out = tmp_path / "out"
    body = 'echo "$$" > "$1"; echo before; while [ ! -e "$2" ]; do sleep 0.05; done; echo after'
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    async with invoke_server(state_dir=state) as invoke:
        job = await invoke.created_job(
            1, attributes("/bin/sh", ["-c", body, "sh", str(pidfile), str(go)], workdir=tmp_path, out=out)
        )
        pid = await wait_for_file(pidfile)
        first_agent = agent_pid(state)
        assert first_agent is not None
        # The agent dies without a word; its keeper keeps the job running.
        os.kill(first_agent, signal.SIGKILL)
        await wait_gone([first_agent])
        assert alive(pid)
        go.touch()
        # The server connects again, starting a new agent, which adopts the job.
        final = await invoke.final_status(job)
        assert (final.status, final.text) == (InvokeStatus.DONE, "exit status 0")
        second_agent = agent_pid(state)
        assert second_agent not in (None, first_agent)
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0
    assert out.read_text() == "before\nafter\n"


async def test_a_job_past_its_wall_time_is_ended_and_failed(tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    try:
        with trio.fail_after(TIMEOUT):
            async with AgentJobs.open(AgentSettings(str(state))) as jobs:
                key = await jobs.submit(JobSpec("/bin/sleep", ("30",), wall_time=1, working_dir=str(tmp_path)))
                updates = [u async for u in jobs.watch(key)]
    finally:
        with trio.CancelScope(shield=True):
            await stop_agent(state)
    states = [u.state for u in updates]
    assert states[0] is JobState.ACCEPTED and JobState.RUNNING in states
    assert (updates[-1].state, updates[-1].message) == (JobState.FAILED, "exceeded its wall time of 1 s")


async def test_slots_hold_jobs_back_in_the_server_not_in_the_agent(tmp_path):
    state = tmp_path / "state"
    first, first_pid = sleeper(tmp_path, "first")
    async with invoke_server("--slots", "1", state_dir=state) as invoke:
        job1 = await invoke.created_job(1, attributes("/bin/sh", first, workdir=tmp_path))
        await wait_for_file(first_pid)
        marker = tmp_path / "second-ran"
        job2 = await invoke.created_job(2, attributes("/bin/sh", ["-c", f'touch "{marker}"'], workdir=tmp_path))
        await invoke.send(f"JOB_STATUS {job2}\r\n".encode())
        assert await invoke.reply() == "S PENDING"
        async with await _ptp_client_of(state) as ptp:
            await ptp.init(base_id=5000)
            await ptp.model_def()
            await ptp.start_events()
            assert len(ptp.jobs) == 1  # the second is not the agent's yet
        await invoke.send(f"JOB_DESTROY {job1}\r\n".encode())
        assert await invoke.reply() == "S"
        assert (await invoke.final_status(job1)).text == "destroyed"
        # The slot is free: the second job goes to the agent and runs.
        assert (await invoke.final_status(job2)).status is InvokeStatus.DONE
        assert marker.exists()
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"


async def test_an_agent_that_cannot_start_fails_the_job_with_its_reason(tmp_path):
    state = tmp_path / "state"
    async with invoke_server("--agent-option=--frobnicate", state_dir=state) as invoke:
        assert await invoke.create(1, attributes("/bin/true", ["x"], workdir=tmp_path)) == "S"
        line = await invoke.find_notify(lambda l: l.startswith("CREATE_NOTIFY 1 "))
        assert line.startswith("CREATE_NOTIFY 1 F cannot reach the agent: proxy-agent: "), line
        assert "unrecognized arguments: --frobnicate" in line
        # The server goes on, and tries again at the next job.
        await invoke.send(b"QUERY_FEATURES\r\n")
        assert await invoke.reply() == "SM"


async def test_the_end_of_each_job_in_words(tmp_path):
    async with invoke_server(state_dir=tmp_path / "state") as invoke:
        cases = {
            1: (["-c", "kill -SEGV $$"], "1", "FAILED killed by signal SIGSEGV"),
            2: (["-c", 'test "$PROXY_AGENT_PROCESS_INDEX" != 1 || exit 4'], "3", "FAILED process 2 of 3: exit status 4"),
            3: (["-c", "exit 0"], "2", "DONE exit status 0"),
        }
        for rid, (args, count, _) in cases.items():
            attrs = [(n, count if n == "count" else v) for n, v in attributes("/bin/sh", args, workdir=tmp_path)]
            job = await invoke.created_job(rid, attrs)
            assert job == f"job-{rid}"
        for rid, (_, _, expected) in cases.items():
            final = await invoke.final_status(f"job-{rid}")
            assert f"{final.status.value} {final.text}" == expected


async def test_scheduler_queue_and_broker_options_reach_the_agent(tmp_path):
    state = tmp_path / "state"
    async with invoke_server("--agent-option=--scheduler=local,sim", state_dir=state) as invoke:
        # a scheduler without a queue, with a broker: the broker ranks that scheduler's queues
        job1 = await invoke.created_job(
            1, attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("scheduler", "sim"), ("broker", "Null")])
        )
        # candidate queues without a broker: the first that can run the job
        job2 = await invoke.created_job(
            2, attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("queue", "sim:long,local:default")])
        )
        # the client's queue_name wins over the queue option
        attrs = attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("queue", "sim:long")])
        job3 = await invoke.created_job(3, attrs + [("queue_name", "local:default")])
        assert [job1, job2, job3] == ["job-1", "job-2", "job-3"]
        async with await _ptp_client_of(state) as ptp:
            await ptp.init(base_id=5000)
            await ptp.model_def()
            await ptp.start_events()

            def placed():
                jobs = sorted((j for j in ptp.jobs.values() if (j.sub_id or "").startswith("ninfg-")),
                              key=lambda j: int(j.sub_id.rsplit("-", 1)[1]))
                if len(jobs) < 3:
                    return None
                return [(ptp.element(j.parent).get("backend"), ptp.element(j.parent).name, j.get("brokerReason"))
                        for j in jobs]

            (q1, q2, q3) = await ptp.wait_for(placed, TIMEOUT)
        assert q1[:2] == ("sim", "batch") and q1[2].startswith("Null: ")
        assert q2[:2] == ("sim", "long") and q2[2].startswith("Null: ")
        assert q3[:2] == ("local", "default")
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0
