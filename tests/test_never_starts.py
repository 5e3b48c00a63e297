"""A job its scheduler will never start is named as such, and a wait for it stops at once.

SLURM (without EnforcePartLimits) accepts a job that asks for more than its partition has
and keeps it pending for ever with a reason such as PartitionConfig.  The backend turns
those reasons into a message that begins with ``NEVER_STARTS``; the console's waits stop
as soon as they see it.  The end-to-end check against a real cluster is in
``test_never_starts_slurm.py``.
"""

from __future__ import annotations

import pytest

from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.batch.slurm.backend import job_attributes
from proxy_agent.schedulers.batch.slurm.parse import SlurmJob
from proxy_agent.service.jobs import NEVER_STARTS
from proxy_agent.service.model import K
from wait_support import scaled


def _job(state: str, reason: str) -> SlurmJob:
    return SlurmJob(job_id="7", name="big", user="alice", partition="debug", state=state, reason=reason)


@pytest.mark.parametrize("reason", sorted(sp.NEVER_STARTS_REASONS))
def test_each_never_reason_of_a_pending_job_is_explained(reason):
    message = job_attributes(_job("PENDING", reason))[K.MESSAGE]
    assert message.startswith(NEVER_STARTS)
    assert f"(reason {reason})" in message and sp.NEVER_STARTS_REASONS[reason] in message


@pytest.mark.parametrize("reason", ["Priority", "Resources", "JobHeldUser", "BeginTime", ""])
def test_reasons_that_pass_keep_slurms_word(reason):
    assert job_attributes(_job("PENDING", reason))[K.MESSAGE] == reason


def test_a_job_that_runs_after_all_is_not_called_unstartable():
    assert job_attributes(_job("RUNNING", "PartitionConfig"))[K.MESSAGE] == "PartitionConfig"
    assert sp.job_message("PartitionTimeLimit", pending=False) == "PartitionTimeLimit"


# --------------------------------------------------------------------------- the console's waits

import io  # noqa: E402

import trio  # noqa: E402
import trio.testing  # noqa: E402

from agent_fixtures import FakeAgent, ids  # noqa: E402
from proxy_agent.client import AgentClient  # noqa: E402
from proxy_agent.console.commands import Console  # noqa: E402
from proxy_agent.console.terminal import Output  # noqa: E402
from proxy_agent.protocol.messages import ElementChange, ElementGroup, ElementKind, NewElements  # noqa: E402

STUCK = NEVER_STARTS + "SLURM keeps it pending because it asks for more than its partition offers (reason PartitionConfig)"


# job 10: its element id 1010 less the base id 1000
@pytest.mark.parametrize("command", [["wait", "10"], ["wait", "10", "RUNNING"], ["wait", "10", "FINISHED"]])
async def test_a_wait_for_a_job_that_will_never_start_stops_at_once_and_says_why(command, autojump_clock):
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    fake = FakeAgent(agent_stream)
    client = AgentClient.from_stream(client_stream)
    async with client:
        stderr = io.StringIO()
        shell = Console(client, Output(stdout=io.StringIO(), stderr=stderr))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(shell.startup)
            tid = await fake.handshake()
        await fake.send(NewElements(tid, ElementKind.JOB, "1002", [ElementGroup(ids("1010"), [
            ("name", "big"), ("jobSubId", "sub-big"), ("jobState", "STARTING"), ("jobStatus", "QUEUING")])]))
        await client.wait_for(lambda: client.find_job("1010"), scaled(30))

        async def stuck_later():
            await trio.sleep(0.2)
            await fake.send(ElementChange(tid, ElementKind.JOB, [ElementGroup(ids("1010"), [("jobStatusMessage", STUCK)])]))

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stuck_later)
            assert await shell.execute(command + ["--timeout", "30"]) is False
        assert trio.current_time() - start < 5  # (virtual time: the 30 s were not waited)
        error = stderr.getvalue().strip().splitlines()[-1]
        assert f"job 10 {STUCK}" in error and "terminate 10" in error
        # a wait for a state such a job does reach still works
        assert await shell.execute(["wait", "10", "QUEUING"]) is True
