"""Jobs outlive the agent: a killed agent's local jobs are adopted by the next one on the same
state directory, with every output line delivered once (see ``adoption_support``)."""

from __future__ import annotations

import pytest

from adoption_support import PlannedJob, check_every_line_once, ended, job_of, kill_and_adopt
from wait_support import scaled


def local_plan(count: int = 20) -> list:
    """Jobs that end at once, soon, a little later and much later; one runs until the second
    agent terminates it."""
    pauses = (0, 0.05, 0.4, 1.0)
    plan = [PlannedJob(f"L{i:02d}", "local:default", 6, pauses[i % 4], i % 6) for i in range(count - 1)]
    plan.append(PlannedJob(f"L{count - 1:02d}", "local:default", 400, 0.1, 0, terminate=True))
    return plan


def every_job_started(client, subs, tags) -> bool:
    """(An agent killed before the keeper heard of a job leaves it never started.)"""
    return all(job_of(client, subs[t]).get("jobState") in ("RUNNING", "COMPLETED") for t in tags)


def some_ended_some_running(tags):
    def check(client, subs) -> bool:
        done = [t for t in tags if ended(client, subs[t])]
        return 2 <= len(done) < len(tags) and every_job_started(client, subs, tags)
    return check


@pytest.mark.parametrize("stop, options", [
    # half the jobs name no queue: the broker's choice must survive the agent too
    ("SIGKILL", ["--broker", "FastestQueue"]),
    # an agent that can choose ends its jobs unless told to keep them
    ("SIGTERM", ["--on-disconnect", "keep"]),
    ("drop", ["--on-disconnect", "keep"]),
])
async def test_stopped_agent_local_jobs_adopted_every_line_once(tmp_path, stop, options):
    plan = local_plan()
    brokered = "--broker" in options
    if brokered:
        for job in plan[::2]:
            job.queue = None
    seen = await kill_and_adopt(str(tmp_path / "state"), plan, ["--scheduler", "local", *options],
                                before_kill=some_ended_some_running([j.tag for j in plan]), timeout=scaled(45), stop=stop)
    check_every_line_once(plan, seen)
    # the kill came while jobs ran and output was still coming
    assert any(not s["first_ended"] for s in seen.values())
    assert any(s["first"] and s["second"] for s in seen.values()), "no job's output was split between the agents"
    # each job keeps its id
    assert all(s["first_id"] == s["id"] for s in seen.values())
    if brokered:
        for job in plan[::2]:
            first, second = seen[job.tag]["first_attributes"], seen[job.tag]["attributes"]
            assert first["broker"] == "FastestQueue" and first["brokerReason"].startswith("FastestQueue: ")
            assert {k: second.get(k) for k in ("broker", "brokerQueue", "brokerReason")} == \
                {k: first[k] for k in ("broker", "brokerQueue", "brokerReason")}
        assert "broker" not in seen[plan[1].tag]["attributes"]
