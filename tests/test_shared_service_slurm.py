"""A launch with ``--scheduler local,slurm`` joining a service that runs ``local`` gives every
session SLURM too, with the launch's own SLURM options; a later launch asking for another
poll interval is told in one MESSAGE that it was not applied (the cluster is
``slurm_support``'s)."""

from __future__ import annotations

import pytest
import trio

from wait_support import scaled
from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.client import AgentClient
from slurm_support import require_cluster

pytestmark = pytest.mark.slurm

require_cluster()

DEADLINE = scaled(60)


def _launch(state, *args: str):
    return AgentClient.spawn(agent_argv("--state-dir", str(state), *args), env=subprocess_env())


async def _handshake(client: AgentClient, base_id: int) -> None:
    await client.init(base_id=base_id)
    await client.model_def()
    await client.start_events()
    await client.wait_for(lambda: client.queues, DEADLINE, description="the initial model")


def _backends(client: AgentClient) -> set:
    return {queue.get("backend") for queue in client.queues.values()}


async def test_a_launch_adds_slurm_to_a_local_service_for_every_session(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(3 * DEADLINE):
        async with await _launch(state, "--scheduler", "local") as local:
            await _handshake(local, 1000)
            assert _backends(local) == {"local"}
            async with await _launch(state, "--scheduler", "local,slurm", "--slurm-poll-interval", "1") as both:
                await _handshake(both, 5000)
                assert _backends(both) == {"local", "slurm"}
                await local.wait_for(lambda: _backends(local) == {"local", "slurm"}, DEADLINE,
                                     description="SLURM's queues in the first session")
                async with await _launch(state, "--scheduler", "slurm", "--slurm-poll-interval", "2") as other:
                    await _handshake(other, 9000)
                    await other.wait_for(lambda: other.messages, DEADLINE, description="the MESSAGE")
                    assert len(other.messages) == 1
                    assert "--slurm-poll-interval=2.0 (the service's slurm scheduler has 1.0)" in other.messages[0].text
                    await other.quit()
                assert local.messages == [] and both.messages == []
                await both.quit()
            await local.quit()
