"""Local processes, SLURM and Grid Engine in one agent: a job submitted to each, the same
service states for the same outcome on every backend."""

from __future__ import annotations

import subprocess

import pytest
import trio

import sge_support
from agent_fixtures import agent_argv, subprocess_env
from slurm_support import require_cluster
from wait_support import scaled

from proxy_agent.client import AgentClient

pytestmark = [pytest.mark.slurm, pytest.mark.sge]

require_cluster()
sge_support.require_cell()


async def test_local_slurm_and_grid_engine_in_one_agent():
    argv = agent_argv("--scheduler", "local,slurm,sge", "--slurm-poll-interval", "1", "--sge-poll-interval", "1")
    slurm_ids, sge_ids = [], []
    try:
        with trio.fail_after(scaled(90)):
            async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
                await client.init(1000)
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: {"default", "debug", "all.q"} <= {q.name for q in client.queues.values()},
                                      scaled(30), description="the queues of all three")
                jobs = {}
                for queue in ("local:default", "slurm:debug", "sge:all.q"):
                    jobs[queue] = await client.submit("/bin/sh", ["-c", f"echo ran in {queue}; exit 4"],
                                                      queue=queue)
                slurm_ids.append(client.job(jobs["slurm:debug"]).get("nativeId"))
                sge_ids.append(client.job(jobs["sge:all.q"]).get("nativeId"))
                for queue, job in jobs.items():
                    done = await client.wait_job_state(job, "COMPLETED", timeout=scaled(60))
                    assert client.job_output(job).strip() == f"ran in {queue}"
                    assert client.element(done.parent).name == queue.split(":")[1]
                    (process,) = client.children(done, "process")
                    assert (done.get("jobStatus"), process.get("processExitCode")) == ("FAILED", "4"), queue
                await client.quit()
                assert client.violations == []
    finally:
        for slurm_id in filter(None, slurm_ids):
            subprocess.run(["scancel", slurm_id], capture_output=True, env=subprocess_env(), timeout=scaled(30))
        for sge_id in filter(None, sge_ids):
            sge_support.run(["qdel", sge_id])
