"""What a client sees of Grid Engine's queues is what Grid Engine says, within one poll: limits
changed with ``qconf`` (also across a restart of the master), and the waiting, running and
free slots that the brokers rank on.

Each test makes throwaway queues of its own on the cell of ``scripts/sge-up`` (``qconf -Aq``)
and deletes them, with its jobs, at its end; the cell's own queues are left alone.
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Dict, Iterator, List

import pytest
import trio

import sge_support
from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient

pytestmark = pytest.mark.sge

sge_support.require_cell()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _qconf(*args: str, stdin=None) -> subprocess.CompletedProcess:
    result = sge_support.run(["qconf", *args], timeout=scaled(30), stdin=stdin)
    assert result.returncode == 0, f"qconf {' '.join(args)}: {result.stderr or result.stdout}"
    return result


#: The access list (root alone) that scripts/sge-up makes for the queues the tests make.
TEST_ACCESS_LIST = "proxy_agent_tests"


@contextmanager
def throwaway_queues(tmp_path, native_ids: List[str], **queues: Dict[str, str]) -> Iterator[List[str]]:
    """Queues named after the test process, each configured like all.q but for the given
    settings (``slots``, ``h_rt``...) and last in the scheduler's order (a job that names no
    queue goes elsewhere first); disabled and deleted afterwards, once the test's jobs
    (``native_ids``) are gone."""
    template = _qconf("-sq", "all.q").stdout
    names = []
    # only the tests' own jobs run there (scripts/sge-up makes the access list): other users'
    # jobs, however many, cannot fill a queue a test counts on
    queues = {suffix: {"seq_no": "1000", "user_lists": TEST_ACCESS_LIST, **settings} for suffix, settings in queues.items()}
    try:
        for suffix, settings in queues.items():
            name = f"pa{os.getpid()}{suffix}.q"
            lines = []
            for line in template.splitlines():
                key = line.split(None, 1)[0] if line.strip() else ""
                if key == "qname":
                    line = f"qname {name}"
                elif key in settings:
                    line = f"{key} {settings[key]}"
                lines.append(line)
            path = tmp_path / f"{name}.conf"
            path.write_text("\n".join(lines) + "\n")
            _qconf("-Aq", str(path))
            names.append(name)
        yield names
    finally:
        for name in names:
            sge_support.run(["qmod", "-d", name], timeout=scaled(30))
        if native_ids:
            sge_support.run(["qdel", "-f", *native_ids], timeout=scaled(30))
        for name in names:
            deadline = time.monotonic() + scaled(60)
            while sge_support.run(["qconf", "-dq", name], timeout=scaled(30)).returncode != 0 and time.monotonic() < deadline:
                time.sleep(0.5)


@asynccontextmanager
async def agent(tmp_path, *options: str) -> AsyncIterator[AgentClient]:
    argv = agent_argv("--scheduler", "sge", "--sge-poll-interval", "1", *options)
    async with await AgentClient.spawn(argv, env=subprocess_env(HOME=str(tmp_path)), cwd=str(tmp_path)) as client:
        await client.init(1000)
        await client.model_def()
        await client.start_events()
        yield client
        await client.quit()


def _queue(client: AgentClient, name: str):
    return next((q for q in client.queues.values() if q.name == name), None)


async def _attribute(client: AgentClient, queue: str, name: str, value: str, timeout: float = scaled(60)) -> None:
    await client.wait_for(lambda: _queue(client, queue) is not None and _queue(client, queue).get(name) == value,
                          timeout, description=f"{name}={value} on {queue} "
                          f"(is {_queue(client, queue) and _queue(client, queue).get(name)})")


async def test_a_limit_changed_with_qconf_reaches_the_client(tmp_path):
    with throwaway_queues(tmp_path, [], a={"h_rt": "01:00:00", "slots": "2"}) as (queue,):
        with trio.fail_after(scaled(120)):
            async with agent(tmp_path, "--sge-definitions-interval", "2") as client:
                await _attribute(client, queue, "maxTime", "3600")
                _qconf("-mattr", "queue", "h_rt", "01:23:00", queue)
                await _attribute(client, queue, "maxTime", str(83 * 60))
                # a queue disabled and enabled again shows it at the next poll
                sge_support.run(["qmod", "-d", queue])
                await _attribute(client, queue, "queueState", "STOPPED")
                sge_support.run(["qmod", "-e", queue])
                await _attribute(client, queue, "queueState", "NORMAL")


def _master_answers() -> bool:
    try:
        return sge_support.run(["qstat", "-g", "c"], timeout=scaled(30)).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def restart_master() -> None:
    """Stop the master and start it again at once (the cell is shared: as short as it can be)."""
    _qconf("-km")
    deadline = time.monotonic() + scaled(30)
    while _master_answers() and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run(["/etc/init.d/gridengine-master", "start"], capture_output=True, timeout=scaled(60))
    deadline = time.monotonic() + scaled(60)
    while not _master_answers() and time.monotonic() < deadline:
        time.sleep(0.2)


def wait_for_hosts() -> None:
    """Until the execution host has reported to the restarted master (its queues take jobs
    again), so the shared cell is left as it was found."""
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        lines = sge_support.run(["qstat", "-g", "c"], timeout=scaled(30)).stdout.splitlines()
        if any(line.split()[:1] == ["all.q"] and line.split()[4] != "0" for line in lines):
            return
        time.sleep(1)


async def test_limits_are_read_again_after_the_master_restarts(tmp_path):
    """With the definitions interval at its five minutes, a limit changed just before the
    master restarts still reaches the client: it is read again once the master answers."""
    with throwaway_queues(tmp_path, [], r={"h_rt": "01:00:00", "slots": "2"}) as (queue,):
        try:
            with trio.fail_after(scaled(150)):
                async with agent(tmp_path) as client:
                    await _attribute(client, queue, "maxTime", "3600")
                    await _attribute(client, "short.q", "maxTime", _short_max_time())
                    _qconf("-mattr", "queue", "h_rt", "02:00:00", queue)
                    await trio.to_thread.run_sync(restart_master)
                    await _attribute(client, queue, "maxTime", "7200", timeout=scaled(90))
                    # and what it knew of the other queues is still there
                    assert _queue(client, "short.q").get("maxTime") == _short_max_time()
        finally:
            if not _master_answers():
                subprocess.run([os.path.join(ROOT, "scripts", "sge-up")], capture_output=True, timeout=scaled(600))
            wait_for_hosts()


def _short_max_time() -> str:
    for line in _qconf("-sq", "short.q").stdout.splitlines():
        if line.startswith("h_rt"):
            h, m, s = (int(x) for x in line.split()[1].split(":"))
            return str(h * 3600 + m * 60 + s)
    raise AssertionError("short.q has no h_rt")


async def test_queue_figures_follow_the_agents_own_jobs_and_the_broker_ranks_on_them(tmp_path):
    """Three of the four slots of one queue running the agent's jobs: the queue shows them
    at the next poll, and FastestQueue sends the next job to the queue with more free."""
    native_ids: List[str] = []
    with throwaway_queues(tmp_path, native_ids, f={"slots": "4"}, g={"slots": "2"}) as (four, two):
        with trio.fail_after(scaled(150)):
            async with agent(tmp_path) as client:
                await _attribute(client, four, "freeSlots", "4")
                await _attribute(client, two, "freeSlots", "2")
                jobs = []
                for _ in range(3):
                    jobs.append(await client.submit("/bin/sleep", ["300"], queue=f"sge:{four}"))
                    native_ids.append(client.job(jobs[-1]).get("nativeId"))
                await client.wait_for(lambda: all(client.job(j).get("jobStatus") == "RUNNING" for j in jobs), scaled(60),
                                      description="three jobs running")
                await _attribute(client, four, "runningJobs", "3", timeout=scaled(30))
                await _attribute(client, four, "freeSlots", "1", timeout=scaled(30))
                chosen = await client.submit("/bin/true", queue=f"sge:{four},sge:{two}", broker="FastestQueue")
                native_ids.append(client.job(chosen).get("nativeId"))
                job = await client.wait_for(lambda: client.job(chosen).get("brokerReason") and client.job(chosen),
                                            scaled(30), description="the broker's choice")
                assert client.element(job.parent).name == two, job.get("brokerReason")
                assert job.get("brokerReason") == "FastestQueue: 0 waiting of 2 slots, 2 free"


async def test_a_job_no_queue_will_ever_run_says_so_in_grid_engines_words(tmp_path):
    """A job asking for more wall time than its queue allows waits in qw for ever: the
    client hears so at the first poll after the scheduler looked at it, in Grid Engine's
    own words; a job that only waits its turn hears nothing of the kind."""
    native_ids: List[str] = []
    with throwaway_queues(tmp_path, native_ids, n={"h_rt": "01:00:00", "slots": "1"}) as (queue,):
        with trio.fail_after(scaled(120)):
            async with agent(tmp_path) as client:
                await _attribute(client, queue, "maxTime", "3600")
                never = await client.submit("/bin/true", queue=f"sge:{queue}", timeLimit="2:00:00")
                native_ids.append(client.job(never).get("nativeId"))
                waits = await client.submit("/bin/sleep", ["60"], queue=f"sge:{queue}", hold=True)
                native_ids.append(client.job(waits).get("nativeId"))
                await client.wait_for(lambda: "cannot run" in (client.job(never).get("jobStatusMessage") or ""), scaled(60),
                                      description="the reason the job never starts")
                message = client.job(never).get("jobStatusMessage")
                assert message.startswith("will not start as submitted: ")
                assert f'(-l h_rt=7200) cannot run in queue "{queue}"' in message
                assert client.job(never).get("jobStatus") == "QUEUING"
                assert not client.job(waits).get("jobStatusMessage")


def test_which_notes_mean_never():
    from proxy_agent.schedulers.batch.sge.backend import never_runs
    assert never_runs('cannot run in queue "all.q" because it is not contained in its hard queue list (-q); '
                      '(-l h_rt=72000) cannot run in queue "short.q" because of cluster queue')
    assert not never_runs('queue instance "all.q@vm" dropped because it is full')
    assert not never_runs('(-l h_rt=72000) cannot run in queue "short.q" because of cluster queue; '
                          'queue instance "long.q@vm" dropped because it is disabled')
    assert not never_runs("cannot run because it exceeds limit \"/////\" in rule \"max_slots/1\"")
    assert not never_runs("")


async def test_an_array_job_is_one_job_with_its_tasks(tmp_path):
    """An array shows as the job submitted, with its tasks as they run, as SLURM's and PBS's
    do: never a job per group of waiting tasks (``N.2-4:1``), and nothing left DELETED."""
    native_ids: List[str] = []
    with throwaway_queues(tmp_path, native_ids, t={"slots": "2"}) as (queue,):
        with trio.fail_after(scaled(150)):
            async with agent(tmp_path) as client:
                await _attribute(client, queue, "freeSlots", "2")
                job = await client.submit("/bin/sh", ["-c", "sleep 3; echo task $SGE_TASK_ID"], queue=f"sge:{queue}",
                                          name="pa-sge-tasks", array="1-4")
                number = client.job(job).get("nativeId")
                native_ids.append(number)
                seen = set()

                def array_elements():
                    elements = {j.get("nativeId"): j for j in client.jobs.values()
                                if (j.get("nativeId") or "").split(".")[0] == number}
                    seen.update(elements)
                    return elements

                await client.wait_for(lambda: any("." in n for n in array_elements()), scaled(60),
                                      description="a task running")
                assert client.job(job).get("jobStatus") == "RUNNING"
                await client.wait_job_state(job, "COMPLETED", timeout=scaled(120))
                elements = array_elements()
                assert seen <= {number, *(f"{number}.{t}" for t in range(1, 5))}, seen
                assert {e.get("jobStatus") for e in elements.values()} == {"FINISHED"}
                assert client.job(job).get("jobStatus") == "FINISHED"
