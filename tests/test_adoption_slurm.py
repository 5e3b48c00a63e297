"""A killed agent's SLURM and local jobs, 20 of each, adopted by the next agent on the same
state directory: every job reaches its end with its exit status, every output line arrives
exactly once across the two agents, and the second agent terminates one of each on request
(see ``adoption_support``; the cluster is ``slurm_support``'s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio

from adoption_support import PlannedJob, check_every_line_once, ended, kill_and_adopt
from agent_fixtures import subprocess_env
from slurm_support import require_cluster
from wait_support import scaled
from test_adoption import every_job_started, local_plan

pytestmark = pytest.mark.slurm

require_cluster()


def slurm_plan(prefix: str, count: int = 20) -> list:
    """Short jobs, some instant, on the cluster's two CPUs (so some wait in the queue while
    the agent dies); the first runs until the second agent cancels it."""
    plan = [PlannedJob(f"{prefix}-00", "slurm:debug", 600, 0.5, 0, terminate=True)]
    plan += [PlannedJob(f"{prefix}-{i:02d}", "slurm:debug", 4, (0, 0.2)[i % 2], i % 5) for i in range(1, count)]
    return plan


def _cancel(prefix: str, count: int) -> None:
    for i in range(count):
        subprocess.run(["scancel", f"--name={prefix}-{i:02d}"], capture_output=True, timeout=scaled(30),
                       env=subprocess_env(), stdin=subprocess.DEVNULL)


async def test_killed_agent_local_and_slurm_jobs_adopted_every_line_once(tmp_path):
    prefix = f"pa-h13-{os.getpid()}"
    local = local_plan()
    slurm = slurm_plan(prefix)
    plan = local + slurm
    state = str(tmp_path / "state")
    listed = {}

    submitted = []

    def first_in_line(client, subs) -> None:
        # The cluster may be shared with other jobs of the same user: these go first, so that
        # the test takes seconds whatever waits in the queue.
        submitted.append(trio.current_time())
        for job in slurm:
            native = client.state.jobs_by_sub[subs[job.tag]].get("nativeId")
            subprocess.run(["scontrol", "update", f"jobid={native}", "priority=4294967000"], capture_output=True,
                           timeout=scaled(30), env=subprocess_env(), stdin=subprocess.DEVNULL)

    def kill_when(client, subs) -> bool:
        # local jobs both ended and running, and SLURM jobs unfinished, some ended if the
        # cluster is quick enough
        local_done = sum(ended(client, subs[job.tag]) for job in local)
        slurm_done = sum(ended(client, subs[job.tag]) for job in slurm)
        waited = trio.current_time() - submitted[0]
        return (2 <= local_done < len(local) and (1 <= slurm_done or waited > 8) and slurm_done < len(slurm)
                and every_job_started(client, subs, [job.tag for job in local]))

    def list_jobs() -> None:
        # the job list, with no agent running
        result = subprocess.run([sys.executable, "-m", "proxy_agent", "jobs", "--state-dir", state, "--json"],
                                capture_output=True, text=True, timeout=scaled(30), env=subprocess_env())
        assert result.returncode == 0, result.stderr
        listed.update({row["name"]: row for row in map(json.loads, result.stdout.splitlines())})

    try:
        seen = await kill_and_adopt(state, plan, ["--scheduler", "local,slurm", "--slurm-poll-interval", "0.5"],
                                    before_kill=kill_when, timeout=scaled(60), between=list_jobs,
                                    after_submit=first_in_line)
    finally:
        _cancel(prefix, len(slurm))
    check_every_line_once(plan, seen)
    assert set(listed) == {job.tag for job in plan}
    for job in slurm:
        assert listed[job.tag]["scheduler"] == "slurm" and listed[job.tag]["native_id"] == seen[job.tag]["native"]
        assert seen[job.tag]["attributes"]["nativeId"] == seen[job.tag]["native"]
    assert all(s["first_id"] == s["id"] for s in seen.values())
    # the kill came while SLURM jobs were unfinished, some of them with output still to come
    assert any(not seen[job.tag]["first_ended"] for job in slurm)
