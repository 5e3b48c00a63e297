"""Launches as the Eclipse PTP 4.0 IDE makes them, side by side, on every scheduler.

The IDE finishes a launch (opens its console, attaches its debugger) only on a JOB_CHANGE for
the submitted job saying RUNNING; a NEW_JOB never counts.  Its TID allocator hands out TIDs
that earlier commands still hold, and it gives every answer to the oldest command with that
TID.  Each test drives the real agent through ``AgentClient(reference=True)``, which does all
of that (and fails on a NEW_JOB of its own job that does not say STARTING, on a job of its own
that ran and ended without that JOB_CHANGE, and on ERROR TID_IN_USE).

What is checked, on each scheduler (local, sim, SLURM, Grid Engine, PBS through the fake
commands that replay recorded outputs, and local, SLURM and Grid Engine in one agent):

* a ``/bin/true`` launched while a slow submission is in flight (a test backend whose submit
  takes a while: the simulated scheduler's ``--sim-submit-delay``; or Grid Engine's own
  qsub) goes NEW_JOB STARTING, JOB_CHANGE RUNNING, JOB_CHANGE COMPLETED, each an event of
  its own, and so does the slow one;
* four overlapping launches, the fourth on the TID the slow second one still holds, all
  complete and all get their jobs.

SLURM and Grid Engine tests (markers ``slurm``, ``sge``) need the clusters of
``scripts/slurm-up`` and ``scripts/sge-up``.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from contextlib import asynccontextmanager
from typing import AsyncIterator, Dict, List, Optional, Tuple

import attrs
import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled

from proxy_agent.client import AgentClient
from proxy_agent.client.kept import job_attributes
from proxy_agent.client.state import Element, Traffic
from proxy_agent.protocol.messages import CommandId, ElementChange, ElementKind, NewElements

IDE_BASE = 2**24
IDE_EXTRA = ["slurmdPath=", "slurmdArgs="]
#: A simulated job takes 12 to 22 ms at this scale: it ends well within any slow submission.
SIM_FAST = ("--sim-time-scale", "0.01")
#: The slow submissions of the test backend.  Beside a batch scheduler it must outlast a
#: short job there (queued, run, seen ended by a poll), so that a session that held events
#: while it was in flight would merge the short job's states.
SLOW = "0.5"
SLOW_BESIDE_BATCH = "5"


@attrs.frozen
class Setup:
    """One agent to try launches on: its options, where the slow submission goes, where the
    launches beside it go, and how long to wait for a launch there."""

    args: Tuple[str, ...]
    slow: str
    fast: Tuple[str, ...]
    #: seconds between the slow submission and the launch beside it (only where both take
    #: equally long: the first must end while the second is in flight)
    stagger: float = 0.0
    #: the launches are expected to finish while the slow submission is still in flight
    fast_first: bool = False
    wait: float = scaled(30.0)
    needs: Tuple[str, ...] = ()
    pbs: bool = False


SETUPS: Dict[str, Setup] = {
    "local": Setup(("--scheduler", "local,sim", "--sim-submit-delay", SLOW, *SIM_FAST), "sim:debug",
                   ("local:default",), fast_first=True),
    "sim": Setup(("--scheduler", "sim", "--sim-submit-delay", SLOW, *SIM_FAST), "sim:debug", ("sim:debug",),
                 stagger=0.2),
    "slurm": Setup(("--scheduler", "slurm,sim", "--slurm-poll-interval", "1", "--sim-submit-delay",
                    SLOW_BESIDE_BATCH, *SIM_FAST), "sim:debug", ("slurm:debug",), wait=scaled(120), needs=("slurm",)),
    "sge": Setup(("--scheduler", "sge,sim", "--sge-poll-interval", "1", "--sim-submit-delay", SLOW_BESIDE_BATCH,
                  *SIM_FAST), "sim:debug", ("sge:all.q",), wait=scaled(120), needs=("sge",)),
    # Grid Engine's own qsub is the slow submission, a local launch beside it
    "sge-qsub": Setup(("--scheduler", "local,sge", "--sge-poll-interval", "1"), "sge:all.q", ("local:default",),
                      wait=scaled(120), needs=("sge",)),
    "pbs": Setup(("--scheduler", "pbs,sim", "--pbs-poll-interval", "0.5", "--sim-submit-delay", "3", *SIM_FAST),
                 "sim:debug", ("pbs:workq",), wait=scaled(60), pbs=True),
    # the three in one agent, Grid Engine's qsub in flight beside the local and SLURM launches
    "local,slurm,sge": Setup(("--scheduler", "local,slurm,sge", "--slurm-poll-interval", "1",
                              "--sge-poll-interval", "1"), "sge:all.q", ("local:default", "slurm:debug"),
                             wait=scaled(120), needs=("slurm", "sge")),
}


def setup_params():
    marks = {"slurm": pytest.mark.slurm, "sge": pytest.mark.sge}
    return [pytest.param(name, marks=[marks[n] for n in setup.needs], id=name) for name, setup in SETUPS.items()]


def _require(setup: Setup) -> None:
    if "slurm" in setup.needs:
        from slurm_support import require_cluster

        require_cluster()
    if "sge" in setup.needs:
        import sge_support

        sge_support.require_cell()


def _cancel(native_ids: Dict[str, List[str]]) -> None:
    """End what a test left in the shared clusters (the jobs are short; this is for failures)."""
    for native in native_ids.get("slurm", []):
        subprocess.run(["scancel", native], capture_output=True, env=subprocess_env(), timeout=scaled(30),
                       stdin=subprocess.DEVNULL)
    if native_ids.get("sge"):
        import sge_support

        for native in native_ids["sge"]:
            sge_support.run(["qdel", native], timeout=scaled(30))


@asynccontextmanager
async def ide_session(setup: Setup, tmp_path, *, tid_pool: int = 4) -> AsyncIterator[AgentClient]:
    """The agent of ``setup`` over stdio, INIT as the IDE sends it, events started."""
    _require(setup)
    env: Dict[str, str] = {}
    cwd = None
    if setup.pbs:
        from test_pbs_backend import FAKE_BIN

        env = {"PATH": f"{FAKE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "FAKE_PBS_FAMILY": "openpbs",
               "FAKE_PBS_STATE": str(tmp_path / "pbs-state"), "FAKE_PBS_QUEUE_SECONDS": "0.3",
               "HOME": str(tmp_path), "FAKE_PBS_USER": getpass.getuser()}
        cwd = str(tmp_path)
    if "sge" in setup.needs:
        import sge_support

        env.update(sge_support.cell_env())
    natives: Dict[str, List[str]] = {}
    client = await AgentClient.spawn(agent_argv(*setup.args), env=subprocess_env(**env), cwd=cwd, reference=True,
                                     tid_pool=tid_pool)
    try:
        async with client:
            await client.init(base_id=IDE_BASE, extra=IDE_EXTRA)
            await client.model_def()
            await client.start_events()
            wanted = {setup.slow, *setup.fast}
            await client.wait_for(lambda: wanted <= {f"{q.get('backend')}:{q.name}" for q in client.queues.values()},
                                  scaled(30), description=f"the queues {sorted(wanted)}")
            try:
                yield client
            finally:
                for job in client.jobs.values():
                    backend = client.element(job.parent).get("backend") if job.parent in client.state.elements else None
                    if job.sub_id in client.state.submitted and job.get("nativeId") and backend in ("slurm", "sge"):
                        natives.setdefault(backend, []).append(job.get("nativeId"))
            await client.quit()
    finally:
        _cancel(natives)
        if setup.pbs:
            from test_pbs_backend import stop_leftovers

            stop_leftovers(tmp_path / "pbs-state")


def keep_jobs(client: AgentClient) -> Dict[str, Element]:
    """Every job of the client's mirror by jobSubId, kept once it is gone from the mirror too
    (a scheduler's ended jobs leave the model after a while: the simulated one's at once)."""
    kept: Dict[str, Element] = {}
    client.add_listener(lambda traffic: kept.update(client.state.jobs_by_sub))
    return kept


def queue_id(client: AgentClient, ref: str) -> str:
    backend, _, name = ref.partition(":")
    for queue in client.queues.values():
        if queue.get("backend") == backend and queue.name == name:
            return queue.id
    raise AssertionError(f"no queue {ref}")


def told_as_a_launch(client: AgentClient, job: Element) -> None:
    """The job reached the client as NEW_JOB STARTING, then a JOB_CHANGE per state (a change
    of its finer state within one, such as RUNNING to FINISHING, repeats that state)."""
    assert job.states == ["STARTING", "RUNNING", "COMPLETED"], job.states
    assert distinct(job.changed_states) == ["RUNNING", "COMPLETED"], job.changed_states


def distinct(items: list) -> list:
    """``items`` without an item equal to the one before it."""
    return [item for i, item in enumerate(items) if i == 0 or items[i - 1] != item]


def job_events(wire: List[Traffic], job: Element) -> List[Tuple[str, Optional[str]]]:
    """(event, jobState) of every NEW_JOB / JOB_CHANGE naming the job with a state, in arrival
    order."""
    found = []
    for traffic in wire:
        event = traffic.message
        if isinstance(event, (NewElements, ElementChange)) and event.kind is ElementKind.JOB:
            for group in event.groups:
                state = dict(group.attributes).get("jobState")
                if int(job.id) in group.ids and state is not None:
                    found.append((event.event_id.name, state))
    return distinct(found)


async def launch_all(client: AgentClient, launches: List[Tuple[str, float]], cwd: str,
                     wait: float) -> List[Element]:
    """Launch ``/bin/true`` on each (queue, delay) at once, each ``delay`` seconds after the
    first; returns the jobs in that order once every launch is done (kept: a batch scheduler's
    ended jobs leave the model after a while)."""
    done: Dict[int, Element] = {}

    async def one(index: int, queue: str, delay: float) -> None:
        await trio.sleep(delay)
        job = await client.launch("/bin/true", queue=queue, cwd=cwd, jobName=f"pa-ide-launch-{index}", timeout=wait)
        done[index] = client.job(job)

    async with trio.open_nursery() as nursery:
        for index, (queue, delay) in enumerate(launches):
            nursery.start_soon(one, index, queue, delay)
    return [done[i] for i in range(len(launches))]


# --------------------------------------------------------------------------- a launch beside a slow submission


@pytest.mark.parametrize("name", setup_params())
async def test_a_launch_beside_a_slow_submission_completes(name, tmp_path):
    setup = SETUPS[name]
    wire: List[Traffic] = []
    with trio.fail_after(scaled(60) + 2 * setup.wait):
        async with ide_session(setup, tmp_path) as client:
            client.add_listener(lambda traffic: wire.append(traffic) if traffic.direction == "in" else None)
            kept = keep_jobs(client)
            # the slow submission first, as the IDE would send a launch's (not waited for here)
            slow_sub = client.new_sub_id()
            slow = await client.send_command(CommandId.SUBMIT_JOB, job_attributes(
                "/bin/true", queue=queue_id(client, setup.slow), cwd=str(tmp_path), sub_id=slow_sub,
                jobName="pa-ide-slow"))
            await trio.sleep(setup.stagger)
            launched = await launch_all(client, [(queue_id(client, q), 0.0) for q in setup.fast], str(tmp_path),
                                        setup.wait)
            if setup.fast_first:
                # the launches were told RUNNING while the slow submission was still in flight
                assert not slow.done
            await client.reply(slow, setup.wait)
            slow_job = await client.wait_for(lambda: kept.get(slow_sub), setup.wait)
            for job in [*launched, slow_job]:
                element = await client.wait_job_state(job, "COMPLETED", setup.wait)
                told_as_a_launch(client, element)
                assert job_events(wire, element) == [("NEW_JOB", "STARTING"), ("JOB_CHANGE", "RUNNING"),
                                                      ("JOB_CHANGE", "COMPLETED")]
            assert client.violations == []


# --------------------------------------------------------------------------- four launches, one TID reused


@pytest.mark.parametrize("name", setup_params())
async def test_four_overlapping_launches_with_a_reused_tid_all_get_their_jobs(name, tmp_path):
    """A fast, B slow, C and D fast, sent at once: with the IDE's allocator going round two TIDs,
    C gets A's TID and D the TID of B, whose submission is still in flight."""
    setup = SETUPS[name]
    reused: List[Tuple[int, int]] = []
    with trio.fail_after(scaled(60) + 2 * setup.wait):
        async with ide_session(setup, tmp_path, tid_pool=2) as client:

            def note_reuse(traffic: Traffic) -> None:
                if traffic.direction == "out" and traffic.message.command_id is CommandId.SUBMIT_JOB:
                    held = client.state.open_on(traffic.message.tid)
                    if len(held) > 1:
                        reused.append((traffic.message.tid, len(held)))

            client.add_listener(note_reuse)
            fast = [queue_id(client, q) for q in setup.fast]
            slow = queue_id(client, setup.slow)
            jobs = await launch_all(client, [(fast[0], 0.0), (slow, 0.0), (fast[-1], 0.0), (fast[0], 0.0)],
                                    str(tmp_path), setup.wait)
            assert len({job.id for job in jobs}) == 4
            assert reused, "no launch was sent on a TID still open"
            for job in jobs:
                element = await client.wait_job_state(job, "COMPLETED", setup.wait)
                told_as_a_launch(client, element)
            assert client.violations == []


# --------------------------------------------------------------------------- whose jobs are told state by state


async def test_each_client_is_told_its_own_jobs_state_by_state_and_others_merged(tmp_path):
    """The rule holds in both dialects, for the jobs a client submitted itself: this project's
    console (the native dialect) gets every state of its launch beside a slow submission too.
    Jobs a client did not submit may be merged as before: an IDE whose events were stopped
    while another client's job ran gets that job as one NEW_JOB saying COMPLETED."""
    from agent_fixtures import BackgroundAgent

    path = str(tmp_path / "agent.sock")
    async with BackgroundAgent("--unix", path, "--scheduler", "local,sim", "--sim-submit-delay", SLOW, *SIM_FAST):
        async with await AgentClient.connect_unix(path, reference=True) as ide:
            await ide.init(base_id=IDE_BASE, extra=IDE_EXTRA)
            await ide.model_def()
            await ide.start_events()
            await ide.stop_events()
            async with await AgentClient.connect_unix(path) as console:
                assert console.dialect == "native"
                await console.init(base_id=1000)
                await console.model_def()
                await console.start_events()
                slow = await console.send_command(CommandId.SUBMIT_JOB, job_attributes(
                    "/bin/true", queue="sim:debug", sub_id=console.new_sub_id()))
                job = await console.submit("/bin/true", queue="local:default")
                done = await console.wait_job_state(job, "COMPLETED", scaled(30))
                assert not slow.done  # all of it while the slow submission was in flight
                assert done.states == ["STARTING", "RUNNING", "COMPLETED"]
                assert distinct(done.changed_states) == ["RUNNING", "COMPLETED"]
                await console.reply(slow, scaled(30))
                await console.quit()
            await ide.start_events()
            theirs = await ide.wait_for(lambda: ide.find_job(done.sub_id), scaled(30))
            assert theirs.states == ["COMPLETED"] and theirs.changed_states == []
            await ide.quit()
            assert ide.violations == []
