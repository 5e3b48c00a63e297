"""Brokers across the partitions of a real SLURM cluster (see ``slurm_support``: partitions
``debug``, at most one hour, the default, and ``long``, at most a day; both on one node)."""

from __future__ import annotations

import re
import subprocess

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from slurm_support import require_cluster, scontrol
from wait_support import scaled

from proxy_agent.client import AgentClient
from proxy_agent.client.errors import CommandFailed

pytestmark = pytest.mark.slurm

require_cluster()


def _label(queue) -> str:
    return f"{queue.get('backend')}:{queue.name}"


async def _brokered(client: AgentClient, job_id: str):
    return await client.wait_for(lambda: client.job(job_id).get("brokerReason") and client.job(job_id), scaled(30),
                                 description="the job's broker attributes")


def _partition_in_slurm(native_id: str) -> str:
    """The partition SLURM itself says the job is in."""
    shown = scontrol("show", "job", native_id).stdout
    for word in shown.split():
        if word.startswith("Partition="):
            return word.split("=", 1)[1]
    return ""


async def test_brokering_across_slurm_partitions(tmp_path):
    config = tmp_path / "brokers.ini"
    config.write_text("[slurm:debug]\nspecint2000 = 500\n\n[slurm:long]\nspecint2000 = 1500\n")
    argv = agent_argv("--scheduler", "local,slurm", "--slurm-poll-interval", "1", "--broker-config", str(config))
    native_ids = []
    try:
        with trio.fail_after(scaled(60)):
            async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
                await client.init(1000)
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: {"debug", "long"} <= {q.name for q in client.queues.values()}, scaled(30),
                                      description="the SLURM partitions")
                queues = {_label(q): q for q in client.queues.values()}
                slots = int(queues["slurm:debug"].get("totalSlots"))
                assert queues["slurm:long"].get("benchmark.specint2000") == "1500"

                # a wall time above debug's maximum: the next partition that allows it
                job = await _brokered(client, await client.submit("/bin/true", queue="slurm:debug,slurm:long",
                                                                  timeLimit="2:00:00"))
                native_ids.append(job.get("nativeId"))
                assert _label(client.element(job.parent)) == "slurm:long"
                assert job.get("brokerReason") == ("Null: first in the order given; left out slurm:debug (wall time "
                                                   "2:00:00 above the queue's maximum 1:00:00)")
                assert _partition_in_slurm(job.get("nativeId")) == "long"

                # Benchmark: the faster partition, though named second
                job = await _brokered(client, await client.submit("/bin/true", queue="slurm:debug,slurm:long",
                                                                  broker="Benchmark"))
                native_ids.append(job.get("nativeId"))
                assert _label(client.element(job.parent)) == "slurm:long"
                assert job.get("brokerReason") == "Benchmark: specint2000 1500"
                assert _partition_in_slurm(job.get("nativeId")) == "long"

                # FastestQueue: SLURM's partitions publish their waiting and running jobs as the
                # local queue does; the reason gives the figures that decided
                for choices in ("slurm:long,local:default", "slurm:long,slurm:debug"):
                    job = await _brokered(client, await client.submit("/bin/true", queue=choices,
                                                                      broker="FastestQueue"))
                    chosen = _label(client.element(job.parent))
                    assert chosen in choices.split(",")
                    assert re.fullmatch(r"FastestQueue: \d+ waiting of \d+ slots(, \d+ free)?",
                                        job.get("brokerReason")), job.get("brokerReason")
                    if chosen.startswith("slurm:"):
                        native_ids.append(job.get("nativeId"))
                        assert _partition_in_slurm(job.get("nativeId")) == chosen.partition(":")[2]

                # more processes than either partition has slots
                with pytest.raises(CommandFailed) as failure:
                    await client.submit("/bin/true", queue="slurm:debug,slurm:long", count=slots + 1)
                assert failure.value.message == (
                    f"no queue can run this job (slurm:debug: {slots + 1} slots needed, the queue has {slots}; "
                    f"slurm:long: {slots + 1} slots needed, the queue has {slots})"
                )
                # (the jobs need not run: where SLURM holds them is the point, and the cluster
                # may be busy; they are cancelled below)
                assert client.violations == []
                await client.quit()
    finally:
        for native in filter(None, native_ids):
            subprocess.run(["scancel", native], capture_output=True, env=subprocess_env(), timeout=scaled(30))
