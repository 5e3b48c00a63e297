"""The synchronous client face (proxy_agent.client.sync) with the real agent: from plain code,
from inside asyncio.run(...), with failures, cancellation and an agent that goes away."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentExited, CommandFailed, ConnectError, ConnectionClosed, WaitTimeout
from proxy_agent.client.sync import Agent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spawn(*args: str) -> Agent:
    return Agent.spawn(agent_argv(*args), env=subprocess_env())


def test_submit_wait_output_from_plain_code():
    with spawn() as agent:
        job = agent.submit("/bin/sh", ["-c", 'echo "out $PROXY_AGENT_PROCESS_INDEX"; echo err >&2'], count=2)
        assert job.wait(timeout=scaled(30)) == "FINISHED"
        assert job.done and job.state == "COMPLETED"
        assert sorted(job.stdout.splitlines()) == ["out 0", "out 1"]
        assert job.stderr == "err\nerr\n"
        assert job.exit_codes == [0, 0]
        assert job.states[0] == "STARTING" and job.states[-1] == "COMPLETED"
        assert job.sub_id and agent.job(job.sub_id).id == job.id
        assert [j.id for j in agent.jobs()] == [job.id]
        failed = agent.submit("/bin/sh", ["-c", "exit 4"])
        failed.wait(scaled(30))
        assert failed.exit_codes == [4] and failed.status == "FAILED"
    assert not agent.alive
    with pytest.raises(ConnectError, match="closed"):
        job.state


def test_cancel_and_timeouts():
    with spawn() as agent:
        job = agent.submit("/bin/sleep", ["600"])
        job.wait(timeout=scaled(30), state="RUNNING")
        with pytest.raises(WaitTimeout):
            job.wait(timeout=scaled(0.3))
        job.cancel()
        job.wait(timeout=scaled(30))  # (the job would sleep 600 s)
        assert job.status in ("KILLED", "CANCELED")
        with pytest.raises(CommandFailed, match="no job with id 999999"):
            agent.job(job.id)._agent._run(lambda: agent._client_now().terminate("999999"))


def test_inside_a_running_asyncio_program():
    ticks = []

    async def main() -> str:
        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.05)

        task = asyncio.create_task(ticker())
        with spawn() as agent:
            job = agent.submit("/bin/sh", ["-c", "sleep 1; echo done"])  # a direct call from a coroutine
            before = len(ticks)
            status = await asyncio.to_thread(job.wait, 30)  # the loop keeps running meanwhile
            assert len(ticks) - before >= 5
            quick = agent.submit("/bin/echo", ["direct"])
            quick.wait(scaled(30))  # blocking the loop briefly does not deadlock: the session has its own thread
            assert quick.stdout == "direct\n"
            output = job.stdout
        task.cancel()
        return f"{status} {output}"

    assert asyncio.run(main()) == "FINISHED done\n"


def test_from_several_threads_at_once():
    with spawn() as agent:
        results = {}

        def one(index: int) -> None:
            job = agent.submit("/bin/echo", [f"thread {index}"])
            job.wait(scaled(30))
            results[index] = job.stdout

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(scaled(60))
        assert results == {i: f"thread {i}\n" for i in range(4)}


def test_calling_from_the_sessions_own_thread_is_refused():
    with spawn() as agent:
        client = agent._client_now()
        caught = []

        def listener(traffic) -> None:
            if not caught:
                try:
                    agent.jobs()
                except RuntimeError as exc:
                    caught.append(str(exc))

        agent._sync(lambda: client.add_listener(listener))
        agent.submit("/bin/true").wait(scaled(30))
        assert caught and "own thread" in caught[0]


def test_start_failures_are_clear():
    with pytest.raises(ConnectError, match="cannot start the agent '/nonexistent/agent'"):
        Agent.spawn(["/nonexistent/agent"])
    with pytest.raises(ConnectError, match="shell start-up file"):
        Agent.spawn(["/bin/sh", "-c", "echo 'Welcome to the cluster'; exec " + " ".join(agent_argv())], env=subprocess_env())


def test_an_agent_that_goes_away_ends_waits():
    env = subprocess_env()
    # (its jobs outlive the launch that goes: the service keeps them for the next client)
    with Agent.spawn(agent_argv("--on-disconnect", "keep"), env=env) as agent:
        job = agent.submit("/bin/sleep", ["600"])
        sub_id = job.sub_id
        pid = agent._client_now().process.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ConnectionClosed) as caught:
            job.wait(timeout=scaled(30))
        assert isinstance(caught.value, AgentExited) and "SIGKILL" in str(caught.value)
        assert not agent.alive
    with Agent.spawn(agent_argv(), env=env) as again:  # the job outlived the agent: the next one ends it
        again.job(sub_id).cancel()


def test_the_package_is_marked_as_typed():
    assert os.path.exists(os.path.join(ROOT, "proxy_agent", "py.typed"))
