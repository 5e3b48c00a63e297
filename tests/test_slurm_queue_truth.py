"""What a client sees of SLURM's partitions is what SLURM says, within one poll: a limit or
state changed with ``scontrol update PartitionName=...`` reaches the client at the next poll.

The test makes a throwaway partition of its own on the cluster of ``scripts/slurm-up``
(``scontrol create partition``) and deletes it at its end; the cluster's own partitions are
left alone.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.client import AgentClient
from slurm_support import node_name, require_cluster, scontrol
from wait_support import scaled

pytestmark = pytest.mark.slurm

require_cluster()


@contextmanager
def throwaway_partition() -> Iterator[str]:
    name = f"pa{os.getpid()}"
    result = scontrol("create", f"PartitionName={name}", f"Nodes={node_name()}", "MaxTime=60",
                      "State=UP")
    assert result.returncode == 0, result.stderr
    try:
        yield name
    finally:
        scontrol("delete", f"PartitionName={name}")


def _queue(client: AgentClient, name: str):
    return next((q for q in client.queues.values() if q.name == name), None)


async def _attribute(client: AgentClient, queue: str, name: str, value: str, timeout: float) -> None:
    await client.wait_for(lambda: _queue(client, queue) is not None and _queue(client, queue).get(name) == value,
                          timeout, description=f"{name}={value} on {queue} "
                          f"(is {_queue(client, queue) and _queue(client, queue).get(name)})")


async def test_a_partition_changed_with_scontrol_update_reaches_the_client_at_the_next_poll(tmp_path):
    argv = agent_argv("--scheduler", "slurm", "--slurm-poll-interval", "1", "--slurm-definitions-interval", "300")
    with throwaway_partition() as partition, trio.fail_after(scaled(120)):
        async with await AgentClient.spawn(argv, env=subprocess_env(HOME=str(tmp_path)), cwd=str(tmp_path)) as client:
            await client.init(1000)
            await client.model_def()
            await client.start_events()
            await _attribute(client, partition, "maxTime", "3600", scaled(60))
            # Each change shows within a few polls of one second (the partitions are listed at
            # every poll; before, only every half minute).
            assert scontrol("update", f"PartitionName={partition}", "MaxTime=83").returncode == 0
            await _attribute(client, partition, "maxTime", str(83 * 60), scaled(30))
            assert scontrol("update", f"PartitionName={partition}", "State=DOWN").returncode == 0
            await _attribute(client, partition, "queueState", "STOPPED", scaled(30))
            assert scontrol("update", f"PartitionName={partition}", "State=UP").returncode == 0
            await _attribute(client, partition, "queueState", "NORMAL", scaled(30))
            await client.quit()
