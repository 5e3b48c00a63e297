"""An acknowledged job is never lost, whatever is killed after the acknowledgement.

A client sends 200 SUBMIT_JOBs in one write; at a random moment of the burst something is
killed with SIGKILL: the agent, the keeper, both, or everything of the agent's (agent,
keeper, custodian and the jobs' processes: what losing the machine's power does to
processes).  Then (after starting a new agent where the agent died) every job that had been
answered OK must be there and end: FINISHED, having run exactly once, or FAILED with the
reason; never missing, never run twice.  Each job appends its own tag to one file, which says
how often it ran.  "The agent" is the service of the state directory (the process that holds
the jobs; the launch only passes its client on); the same holds for the jobs a tool submits
through the service interface, as the Invoke Server does.

The runs: ``PROXY_AGENT_KILL_RUNS`` (default 20, the victims in turn); each run is bounded,
and so is the whole.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import trio

from adoption_support import spawn_agent, start
from agent_fixtures import service_pid
from wait_support import scaled
from proxy_agent.client import AgentClient
from proxy_agent.client.kept import job_attributes
from proxy_agent.frontends.api.client import ServiceClient, ServiceGone
from proxy_agent.protocol.messages import CommandId, Ok
from proxy_agent.service.jobs import JobSpec, ServiceError

BURST = 200
RUNS = int(os.environ.get("PROXY_AGENT_KILL_RUNS", "20"))
VICTIMS = ("agent", "keeper", "both", "power")
#: bound of one run (a loaded 2-core machine), and of the whole test
RUN_BOUND = scaled(120.0)


async def send_together(client: AgentClient, commands: List[List[str]]):
    """Several SUBMIT_JOBs in one write; their open commands."""
    sent = []
    raw = []
    for args in commands:
        command, traffic = client.state.send(CommandId.SUBMIT_JOB, args, None)
        sent.append(command)
        raw.append(traffic.raw)
    await client.stream.send_all(b"".join(raw))
    return sent


def keeper_pids(state_dir: Path) -> Dict[str, Optional[int]]:
    """The custodian's and the keeper's pids (the custodian writes them into keeper.lock)."""
    try:
        return json.loads((state_dir / "local" / "keeper.lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def session_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def kill_session(sid: int) -> None:
    """SIGKILL every process of a session (the custodian's: it, its keeper, the jobs)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and session_of(int(entry)) == sid:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def ok_subs(commands) -> List[str]:
    return [c.attribute("jobSubId") for c in commands if c.done and isinstance(c.completion, Ok)]


async def wait_until(predicate, timeout: float, what: str) -> None:
    with trio.fail_after(scaled(timeout)):
        while not predicate():
            await trio.sleep(0.01)


def check_ends(client: AgentClient, acknowledged: List[str], ran: Path, victim: str) -> Dict[str, int]:
    """Every acknowledged job ended FINISHED having run once, or FAILED saying why."""
    counts: Dict[str, int] = {}
    if ran.exists():
        for tag in ran.read_text().split():
            counts[tag] = counts.get(tag, 0) + 1
    twice = {tag: n for tag, n in counts.items() if n > 1}
    assert not twice, f"{victim}: jobs that ran more than once: {twice}"
    outcome: dict = {"FINISHED": 0, "FAILED": 0, "reasons": set()}
    for sub in acknowledged:
        job = client.state.jobs_by_sub.get(sub)
        assert job is not None, f"{victim}: acknowledged job {sub} is missing"
        status = job.get("jobStatus")
        assert job.get("jobState") == "COMPLETED", (victim, sub, job.attributes)
        if status == "FINISHED":
            assert counts.get(sub) == 1, f"{victim}: {sub} FINISHED but ran {counts.get(sub, 0)} times"
        else:
            assert status == "FAILED", (victim, sub, job.attributes)
            assert job.get("jobStatusMessage"), f"{victim}: {sub} FAILED without a reason: {job.attributes}"
            outcome["reasons"].add(job.get("jobStatusMessage"))
        outcome[status] += 1
    outcome["reasons"] = sorted(outcome["reasons"])
    return outcome


async def one_run(base: Path, number: int, victim: str) -> dict:
    state = base / f"state-{number}"
    ran = base / f"ran-{number}"
    kill_after = random.randint(1, BURST - 1)
    async with await spawn_agent(str(state)) as first:
        await start(first)
        commands = await send_together(first, [
            job_attributes("/bin/sh", ["-c", f'echo {sub} >> "{ran}"'], sub_id=sub)
            for sub in (f"k{number}-{i}" for i in range(BURST))])
        await wait_until(lambda: len(ok_subs(commands)) >= kill_after or all(c.done for c in commands), 60,
                         "OKs before the kill")
        await trio.sleep(random.uniform(0, 0.02))
        pids = keeper_pids(state)
        custodian_session = session_of(pids["custodian"]) if pids.get("custodian") else None
        if victim in ("keeper", "both"):
            os.kill(pids["keeper"], signal.SIGKILL)
        if victim in ("agent", "both", "power"):
            os.kill(service_pid(state), signal.SIGKILL)  # the process that holds the jobs
        if victim == "power":
            os.kill(first.process.pid, signal.SIGKILL)  # the launch goes with the power too
        if victim == "power":
            assert custodian_session is not None
            kill_session(custodian_session)
        if victim == "keeper":
            # the same agent goes on: every submission is answered, every accepted job ends
            await wait_until(lambda: all(c.done for c in commands), 60, "every submission answered")
            acknowledged = ok_subs(commands)
            await wait_until(lambda: all(
                (first.state.jobs_by_sub.get(s) is not None
                 and first.state.jobs_by_sub[s].get("jobState") == "COMPLETED") for s in acknowledged),
                60, "every accepted job's end")
            outcome = check_ends(first, acknowledged, ran, victim)
            assert first.violations == []
            await first.quit()
            return {"victim": victim, "acknowledged": len(acknowledged), **outcome}
        while first.ended is None:
            await trio.sleep(0.01)
        acknowledged = ok_subs(commands)
    async with await spawn_agent(str(state)) as second:
        await start(second)
        await wait_until(lambda: all(
            (second.state.jobs_by_sub.get(s) is not None
             and second.state.jobs_by_sub[s].get("jobState") == "COMPLETED") for s in acknowledged),
            60, "every accepted job's end in the next agent")
        outcome = check_ends(second, acknowledged, ran, victim)
        assert second.violations == []
        await second.quit()
    return {"victim": victim, "acknowledged": len(acknowledged), **outcome}


@pytest.mark.skipif(RUNS < 1, reason="PROXY_AGENT_KILL_RUNS is 0")
async def test_an_acknowledged_job_is_never_lost_whatever_is_killed(tmp_path):
    results = []
    with trio.fail_after(RUN_BOUND * RUNS):
        for number in range(RUNS):
            victim = VICTIMS[number % len(VICTIMS)]
            with trio.fail_after(RUN_BOUND):
                results.append(await one_run(tmp_path, number, victim))
    print("\n".join(json.dumps(r) for r in results))
    # every victim was tried, and the kills fell in the burst (some jobs were accepted)
    assert {r["victim"] for r in results} == set(VICTIMS[:RUNS])
    assert all(r["acknowledged"] >= 1 for r in results)


async def _interface_run(base: Path, number: int, victim: str) -> dict:
    """As :func:`one_run`, for jobs a tool submits through the service interface (as the
    Invoke Server does): a key in the answer is the acknowledgement."""
    state = base / f"tool-state-{number}"
    ran = base / f"tool-ran-{number}"
    kill_after = random.randint(1, BURST - 1)
    acknowledged: Dict[str, int] = {}

    async def submit(tool: ServiceClient, tag: str) -> None:
        try:
            acknowledged[tag] = await tool.submit(JobSpec("/bin/sh", ("-c", f'echo {tag} >> "{ran}"'), client_ref=tag))
        except (ServiceError, ServiceGone):
            pass  # refused, or the service died first: not acknowledged

    async with ServiceClient.open(str(state), options=["--scheduler", "local"]) as tool:
        async with trio.open_nursery() as nursery:
            for i in range(BURST):
                nursery.start_soon(submit, tool, f"t{number}-{i}")
            await wait_until(lambda: len(acknowledged) >= kill_after, 60, "keys before the kill")
            await trio.sleep(random.uniform(0, 0.02))
            pids = keeper_pids(state)
            custodian_session = session_of(pids["custodian"]) if pids.get("custodian") else None
            if victim == "both":
                os.kill(pids["keeper"], signal.SIGKILL)
            os.kill(service_pid(state), signal.SIGKILL)
            if victim == "power":
                assert custodian_session is not None
                kill_session(custodian_session)
    async with ServiceClient.open(str(state), options=["--scheduler", "local"]) as tool:
        final = {"FINISHED", "FAILED", "KILLED", "DELETED"}

        async def rows() -> Dict[int, dict]:
            return {row["key"]: row for row in await tool.jobs()}

        with trio.fail_after(scaled(60)):
            while True:
                known = await rows()
                if all(known.get(key, {}).get("state") in final for key in acknowledged.values()):
                    break
                await trio.sleep(0.1)
    counts: Dict[str, int] = {}
    if ran.exists():
        for tag in ran.read_text().split():
            counts[tag] = counts.get(tag, 0) + 1
    assert not {tag: n for tag, n in counts.items() if n > 1}, f"{victim}: jobs that ran more than once"
    outcome: dict = {"FINISHED": 0, "FAILED": 0, "reasons": set()}
    for tag, key in acknowledged.items():
        row = known[key]
        assert row["client_ref"] == tag, (victim, tag, row)
        if row["state"] == "FINISHED":
            assert counts.get(tag) == 1, f"{victim}: {tag} FINISHED but ran {counts.get(tag, 0)} times"
        else:
            assert row["state"] == "FAILED" and row.get("message"), (victim, tag, row)
            outcome["reasons"].add(row["message"])
        outcome[row["state"]] += 1
    outcome["reasons"] = sorted(outcome["reasons"])
    return {"victim": victim, "acknowledged": len(acknowledged), **outcome}


@pytest.mark.skipif(RUNS < 1, reason="PROXY_AGENT_KILL_RUNS is 0")
async def test_a_job_the_service_interface_acknowledged_is_never_lost(tmp_path):
    """The service answers a tool's submission (the Invoke Server's) only once the job is
    recorded too: killing the service, with its keeper or with everything, loses none."""
    victims = ("agent", "both", "power")
    results = []
    with trio.fail_after(RUN_BOUND * len(victims)):
        for number, victim in enumerate(victims):
            with trio.fail_after(RUN_BOUND):
                results.append(await _interface_run(tmp_path, number, victim))
    print("\n".join(json.dumps(r) for r in results))
    assert all(r["acknowledged"] >= 1 for r in results)
