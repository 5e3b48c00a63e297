"""Several backends in one agent, one of them a real SLURM cluster (see ``slurm_support``)."""

from __future__ import annotations

import subprocess

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from slurm_support import require_cluster
from wait_support import scaled

from proxy_agent.client import AgentClient

pytestmark = pytest.mark.slurm

require_cluster()


async def test_local_and_slurm_in_one_agent():
    argv = agent_argv("--scheduler", "local,slurm", "--slurm-poll-interval", "1")
    slurm_ids = []
    with trio.fail_after(scaled(90)):
        async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
            await client.init(1000)
            await client.model_def()
            await client.start_events()
            queues = {q.name: q for q in client.queues.values()}
            assert {"default", "debug", "long"} <= set(queues)
            local = await client.submit("/bin/echo", ["on this machine"])
            batch = await client.submit("/bin/echo", ["in SLURM"], queue="slurm:debug")
            slurm_ids.append(client.job(batch).get("nativeId"))
            done_local = await client.wait_job_state(local, "COMPLETED", timeout=scaled(30))
            done_batch = await client.wait_job_state(batch, "COMPLETED", timeout=scaled(60))
            # output first, then the final state: it is all there when COMPLETED arrives
            assert client.job_output(local).strip() == "on this machine"
            assert client.job_output(batch).strip() == "in SLURM"
            assert client.element(done_batch.parent).name == "debug"
            assert client.element(done_local.parent).name == "default"
            assert done_local.get("jobStatus") == done_batch.get("jobStatus") == "FINISHED"
            assert done_batch.get("jobNativeState") == "COMPLETED"
            await client.quit()
            assert client.violations == []
    for slurm_id in filter(None, slurm_ids):
        subprocess.run(["scancel", slurm_id], capture_output=True, env=subprocess_env(), timeout=scaled(30))
