"""SLURM's batch settings end to end: a real agent (``--scheduler slurm``) on the cluster of
``scripts/slurm-up``, a client sending PTP job attributes, and ``scontrol show job`` saying
what SLURM got.  Jobs are named ``pa-h12c-*`` and cancelled at the end of each test.
"""

from __future__ import annotations

import subprocess
from contextlib import asynccontextmanager
from typing import AsyncIterator, Dict, List

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.client import AgentClient, CommandFailed
from slurm_support import require_cluster, scontrol
from wait_support import scaled

pytestmark = pytest.mark.slurm

require_cluster()

TEST_TIMEOUT = scaled(90)


class Cluster:
    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.native_ids: List[str] = []

    async def submit(self, executable: str, args=(), **attributes) -> str:
        job_id = await self.client.submit(executable, args, **attributes)
        native = self.client.job(job_id).get("nativeId")
        assert native, f"job {job_id} has no nativeId"
        self.native_ids.append(native)
        return job_id

    async def refused(self, **attributes) -> str:
        with pytest.raises(CommandFailed) as failed:
            await self.submit("/bin/true", name="pa-h12c-refused", **attributes)
        assert type(failed.value.event).__name__ == "SubmitJobError", failed.value
        return failed.value.message


@asynccontextmanager
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    home = str(tmp_path)
    session = None
    try:
        with trio.fail_after(TEST_TIMEOUT):
            argv = agent_argv("--scheduler", "slurm", "--slurm-poll-interval", "1")
            async with await AgentClient.spawn(argv, env=subprocess_env(HOME=home), cwd=home) as client:
                session = Cluster(client)
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: client.queues, scaled(30), description="partitions")
                yield session
                await client.quit()
    finally:
        if session is not None and session.native_ids:
            subprocess.run(["scancel", *session.native_ids], capture_output=True, timeout=scaled(30))


def job_fields(native_id: str) -> Dict[str, str]:
    out = scontrol("show", "job", native_id).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


async def test_batch_settings_reach_slurm(tmp_path):
    accounting = scontrol("show", "config").stdout
    enforced = "accounting_storage/none" not in accounting
    async with cluster(tmp_path) as c:
        job_id = await c.submit("/bin/true", name="pa-h12c-attrs", hold="true", account="pa-h12c-acct",
                                timeLimit="00:07:00", memory="123", qos="normal", exclusive="true",
                                nativeOptions="--comment=pa-h12c-note --nice=5")
        native = c.client.job(job_id).get("nativeId")
        got = job_fields(native)
        assert got["JobName"] == "pa-h12c-attrs"
        assert got["Account"] == "pa-h12c-acct"
        assert got["TimeLimit"] == "00:07:00"
        assert got["MinMemoryNode"] == "123M"
        assert got["OverSubscribe"] == "NO"  # --exclusive
        assert got["Comment"] == "pa-h12c-note"
        assert got["Nice"] == "5"
        # Without accounting SLURM keeps no QOS for any job; with it, the one asked for.
        assert got["QOS"] == ("normal" if enforced else "(null)")
        assert got["JobState"] == "PENDING" and got["Reason"] == "JobHeldUser"


async def test_refusals_come_back_with_their_reason(tmp_path):
    async with cluster(tmp_path) as c:
        features = scontrol("show", "node").stdout
        if "AvailableFeatures=(null)" in features or "AvailableFeatures= " in features:
            # SLURM's own refusal, passed on
            assert "Invalid feature specification" in await c.refused(constraint="pa-h12c-nofeature")
        assert "--uid=0" in await c.refused(nativeOptions="--uid=0")
        assert "--frobnicate: not an sbatch option" in await c.refused(nativeOptions="--frobnicate")
        assert "gres" in await c.refused(gres="gpu 2")
        assert "array" in await c.refused(array="3-1")
        assert "qos" in await c.refused(qos="no such; qos")
        # The agent keeps serving.
        job_id = await c.submit("/bin/echo", ["still", "here"], name="pa-h12c-after")
        await c.client.wait_for(lambda: "still here" in c.client.job_output(job_id), scaled(40),
                                description="the output of a job after the refusals")


async def test_array_tasks_all_deliver_output_after_the_prologue(tmp_path):
    async with cluster(tmp_path) as c:
        job_id = await c.submit("/bin/sh", ["-c", 'echo "task $SLURM_ARRAY_TASK_ID $PA_PRE"'],
                                name="pa-h12c-array", array="1-3%2",
                                prologue="PA_PRE=prologue-$((40+2))\nexport PA_PRE")
        native = c.client.job(job_id).get("nativeId")
        got = job_fields(native)
        assert got.get("ArrayTaskThrottle") == "2", got
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(60))
        out = c.client.job_output(job_id)
        for task in (1, 2, 3):
            assert f"task {task} prologue-42" in out, out
        assert c.client.job(job_id).get("jobStatus") == "FINISHED"
