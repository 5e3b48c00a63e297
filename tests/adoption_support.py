"""Killing an agent in the middle of its jobs and checking what the next one makes of them.

Each job prints numbered lines (``TAG 1``, ``TAG 2``...) and exits with a status of its own.
A client of the first agent records what it saw; the agent is killed; a second agent on the
same state directory is asked for the rest.  Together the two clients must have seen every
line of every job exactly once, in order, and every job's end with its exit status.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Dict, List, Optional

import attrs
import trio

from agent_fixtures import agent_argv, service_pid, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient


@attrs.define
class PlannedJob:
    tag: str
    #: None: none named (the agent's broker picks)
    queue: Optional[str]
    lines: int
    pause: float
    code: int
    #: ended by the second agent on request (then its output is some first lines)
    terminate: bool = False

    @property
    def command(self) -> List[str]:
        return ["-c", f'i=1; while [ $i -le {self.lines} ]; do echo "{self.tag} $i"; i=$((i+1)); '
                      f'sleep {self.pause}; done; exit {self.code}']

    def expected(self) -> List[str]:
        return [f"{self.tag} {i}" for i in range(1, self.lines + 1)]


def stdout_lines(client: AgentClient, sub_id: str) -> List[str]:
    job = client.state.jobs_by_sub.get(sub_id)
    if job is None:
        return []
    return [line.text for line in job.output if line.stream == "stdout"]


def job_of(client: AgentClient, sub_id: str):
    return client.state.jobs_by_sub.get(sub_id)


def ended(client: AgentClient, sub_id: str) -> bool:
    job = job_of(client, sub_id)
    return job is not None and job.get("jobState") == "COMPLETED"


def spawn_agent(state_dir: str, *args: str, env: Optional[dict] = None):
    """An agent on ``state_dir``, for ``async with``."""
    return AgentClient.spawn(agent_argv("--state-dir", state_dir, *args), env=env or subprocess_env())


async def start(client: AgentClient) -> None:
    await client.init(1000)
    await client.model_def()
    await client.start_events()


async def kill_and_adopt(state_dir: str, plan: List[PlannedJob], agent_args: List[str], *,
                         before_kill, timeout: float, between=None, after_submit=None,
                         stop: str = "SIGKILL") -> Dict[str, dict]:
    """Run ``plan`` on one agent, stop it once ``before_kill(client, subs)`` holds (``stop``:
    ``SIGKILL``: the state directory's service crashes; ``SIGTERM``: the launch is stopped;
    ``drop``: its client's connection goes away), let a second agent adopt the jobs (the
    service that runs on, or the one the second launch starts), terminate those planned for
    it, and wait for every end.
    ``after_submit(client, subs)`` runs once the first agent shows every job, ``between()``
    while no agent runs.  Returns, per tag: what each client saw and how
    the job ended."""
    seen: Dict[str, dict] = {}
    subs: Dict[str, str] = {}
    with trio.fail_after(timeout):
        async with await spawn_agent(state_dir, *agent_args) as first:
            await start(first)
            for job in plan:
                subs[job.tag] = await first.submit_nowait("/bin/sh", job.command, queue=job.queue, jobName=job.tag)
            await first.wait_for(lambda: all(job_of(first, s) for s in subs.values()), scaled(30),
                                 description="every submitted job")
            if after_submit is not None:
                after_submit(first, subs)
            await first.wait_for(lambda: before_kill(first, subs), scaled(30), description="the moment to kill the agent")
            # then a moment later, not right on the output that made the condition true: the
            # agent records a delivery just before it writes it, and a stop timed by what the
            # client has just read falls next to the agent's next write far more often than a
            # real one does
            await trio.sleep(random.uniform(0.05, 0.3))
            if stop == "drop":
                await first.stream.send_stream.aclose()
            elif stop == "SIGKILL":
                os.kill(service_pid(state_dir), signal.SIGKILL)
            else:
                os.kill(first.process.pid, getattr(signal, stop))
            # what the agent wrote before it died is still read, to the end of its output
            while first.ended is None:
                await trio.sleep(0.01)
        for job in plan:
            element = job_of(first, subs[job.tag])
            seen[job.tag] = {"sub": subs[job.tag], "first": stdout_lines(first, subs[job.tag]),
                             "first_ended": ended(first, subs[job.tag]), "first_id": element.id,
                             "first_attributes": dict(element.attributes),
                             "native": element.get("nativeId")}
        if between is not None:
            between()

        async with await spawn_agent(state_dir, *agent_args) as second:
            await start(second)
            await second.wait_for(lambda: all(job_of(second, s) for s in subs.values()), scaled(30),
                                  description="every job adopted by the second agent")
            for job in plan:
                if job.terminate:
                    await second.wait_for(lambda: len(stdout_lines(second, subs[job.tag])) >= 1, scaled(30),
                                          description=f"output of {job.tag} through the second agent")
                    await second.terminate(job_of(second, subs[job.tag]))
            await second.wait_for(lambda: all(ended(second, s) for s in subs.values()), timeout,
                                  description="every job's end")
            for job in plan:
                sub = subs[job.tag]
                element = job_of(second, sub)
                process = second.job_process(element, 0)
                seen[job.tag].update(
                    second=stdout_lines(second, sub), status=element.get("jobStatus"),
                    exit_code=process.get("processExitCode"), id=element.id,
                    attributes=dict(element.attributes),
                )
            assert second.violations == []
            await second.quit()
    return seen


def check_every_line_once(plan: List[PlannedJob], seen: Dict[str, dict]) -> None:
    """Both clients' lines together: each job's, in order, none lost, none twice."""
    for job in plan:
        got = seen[job.tag]["first"] + seen[job.tag]["second"]
        if job.terminate:
            assert got == job.expected()[:len(got)], f"{job.tag}: {got}"
            assert seen[job.tag]["status"] == "KILLED", (job.tag, seen[job.tag]["status"])
        else:
            assert got == job.expected(), f"{job.tag}: first agent {seen[job.tag]['first']}, " \
                                          f"second {seen[job.tag]['second']}"
            assert seen[job.tag]["exit_code"] == str(job.code), (job.tag, seen[job.tag]["exit_code"])
            assert seen[job.tag]["status"] == ("FINISHED" if job.code == 0 else "FAILED"), \
                (job.tag, seen[job.tag]["status"])
