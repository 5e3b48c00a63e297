"""The SLURM scheduler against a real cluster: end to end (a client, the agent, SLURM), and
in-process for what a client cannot provoke (forgotten jobs, an unreachable controller).

Needs the one-node cluster of ``scripts/slurm-up`` and root, and runs when
PROXY_AGENT_TEST_CLUSTERS asks for it (see ``slurm_support``, ``cluster_support``).
Every test is bounded (60 s, scaled) and cancels the SLURM jobs it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, List

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from slurm_support import node_name, require_cluster, scontrol

from proxy_agent.client import AgentClient, CommandFailed
from proxy_agent.protocol.messages import ErrorCode
from proxy_agent.schedulers.batch.slurm.backend import SlurmBackend, SlurmOptions
from proxy_agent.service.jobs import ErrorKind, JobSpec, SubmitError
from proxy_agent.service.model import K, Kind, ServiceModel
from service_fixtures import start_backend
from wait_support import scaled

pytestmark = pytest.mark.slurm

require_cluster()

TEST_TIMEOUT = scaled(60)
PY = sys.executable


class Cluster:
    """One agent session on the cluster, and the SLURM jobs to cancel afterwards."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.slurm_ids: List[str] = []

    async def submit(self, executable: str, args=(), **kwargs) -> str:
        job_id = await self.client.submit(executable, args, **kwargs)
        slurm_id = self.client.job(job_id).get("nativeId")
        assert slurm_id, f"job {job_id} has no nativeId"
        self.slurm_ids.append(slurm_id)
        return job_id

    def job(self, ref: str):
        return self.client.job(ref)

    async def wait_attr(self, ref: str, key: str, value: str, timeout: float = scaled(30)):
        def reached():
            job = self.client.job(ref)
            return job if job.get(key) == value else None

        return await self.client.wait_for(reached, timeout, description=f"job {ref} to have {key}={value}")

    async def wait_output(self, ref: str, text: str, stream: str = "stdout", timeout: float = scaled(30)) -> str:
        await self.client.wait_for(
            lambda: text in self.client.job_output(ref, stream), timeout,
            description=f"{text!r} in the {stream} of job {ref}",
        )
        return self.client.job_output(ref, stream)


@asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    argv = agent_argv("--scheduler", "slurm", "--poll-interval", "1")
    session = None
    try:
        with trio.fail_after(TEST_TIMEOUT):
            async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
                session = Cluster(client)
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: client.queues and client.nodes, scaled(30), description="queues and nodes")
                yield session
                await client.quit()
    finally:
        if session is not None and session.slurm_ids:
            _cancel_and_wait(session.slurm_ids)


def _cancel_and_wait(slurm_ids: List[str], timeout: float = scaled(30)) -> None:
    """Cancel the test's jobs and wait until SLURM has let them go, so that their CPUs are free
    for the next test (the one-node cluster has only a few)."""
    subprocess.run(["scancel", *slurm_ids], capture_output=True, timeout=scaled(30))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(slurm_ids)],
                              capture_output=True, text=True, timeout=scaled(30)).stdout.split()
        if not left:
            return
        subprocess.run(["scancel", "--signal=KILL", *left], capture_output=True, timeout=scaled(30))
        time.sleep(0.5)


def python_job(code: str) -> List[str]:
    return ["-c", code]


# ------------------------------------------------------------------------------------ tests


async def test_cluster_model_and_definitions():
    async with cluster() as c:
        client = c.client
        (machine,) = client.machines.values()
        assert machine.name == "proxyagent"
        assert machine.get("backend") == "slurm" and machine.get("version")
        node = client.nodes[next(iter(client.nodes))]
        assert node.name == node_name()
        await client.wait_for(lambda: node.get("nodeState") == "UP", scaled(30), description="the node UP")
        await client.wait_for(lambda: machine.get("machineState") == "UP", scaled(30), description="the machine UP")
        assert int(node.get("cpus")) >= 1
        assert set(node.get("queues").split(",")) >= {"debug", "long"}
        # (plus flags, such as RESERVED for the tests' reservation)
        assert node.get("nativeState").split("+")[0] in ("IDLE", "MIXED", "ALLOCATED")
        queues = {q.name: q for q in client.queues.values()}
        assert queues["debug"].get("queueState") == "NORMAL"
        assert queues["debug"].get("default") == "true"
        assert queues["debug"].get("maxTime") == "3600"
        assert queues["long"].get("default") == "false"
        assert queues["long"].get("maxTime") == str(24 * 3600)
        partition = client.attr_defs["partition"]
        assert partition.type.value == "ENUMERATED"
        assert set(partition.values) >= {"debug", "long"}
        assert partition.default == "debug"
        assert client.attr_defs["hold"].type.value == "BOOLEAN"
        assert client.attr_defs["queueId"].default == queues["debug"].id


async def test_job_prints_and_exits_zero():
    code = "import time; print('hello from slurm', flush=True); time.sleep(3); print('done')"
    async with cluster() as c:
        job_id = await c.submit(PY, python_job(code), name="pa-ok")
        job = c.job(job_id)
        assert job.get("jobSubId") and job.get("jobStatus") in ("QUEUING", "RUNNING")
        await c.client.wait_job_state(job_id, "RUNNING", timeout=scaled(30))
        await c.wait_output(job_id, "hello from slurm")  # while it still runs
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(30))
        out = await c.wait_output(job_id, "done")
        assert out == "hello from slurm\ndone\n"
        job = c.job(job_id)
        assert job.get("jobStatus") == "FINISHED" and job.get("jobNativeState") == "COMPLETED"
        assert job.get("exitCode") == "0"
        assert job.get("queueId") == c.client.queue("debug").id
        (process,) = c.client.children(job, "process")
        assert process.get("processExitCode") == "0"
        assert process.id == "0"  # a process is named by its rank in its job
        # A finished job cannot be held: SLURM says so, through the agent.
        with pytest.raises(CommandFailed) as failed:
            await c.client.change_job(job_id, hold=True)
        assert "finished" in failed.value.message.lower()


async def test_failing_job_reports_exit_code():
    code = "import sys, time; time.sleep(2); sys.stderr.write('going down\\n'); sys.exit(3)"
    async with cluster() as c:
        job_id = await c.submit(PY, python_job(code), name="pa-fail")
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(40))
        await c.wait_output(job_id, "going down", "stderr")
        job = c.job(job_id)
        assert job.get("jobStatus") == "FAILED" and job.get("jobNativeState") == "FAILED"
        assert job.get("exitCode") == "3"
        (process,) = c.client.children(job, "process")
        assert process.get("processExitCode") == "3"


async def test_cancel_running_job():
    async with cluster() as c:
        job_id = await c.submit("sleep", ["300"], name="pa-cancel")
        await c.client.wait_job_state(job_id, "RUNNING", timeout=scaled(30))
        await c.client.terminate(job_id)
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(30))
        assert c.job(job_id).get("jobStatus") == "KILLED"
        assert c.job(job_id).get("jobNativeState") == "CANCELLED"


async def test_hold_and_release():
    code = "print('released and ran')"
    async with cluster() as c:
        # Submitted held: it stays pending until released.
        job_id = await c.submit(PY, python_job(code), name="pa-held", hold=True)
        await c.wait_attr(job_id, "jobStatusMessage", "JobHeldUser")
        assert c.job(job_id).get("jobState") == "STARTING"
        assert c.job(job_id).get("jobStatus") == "HOLD" and c.job(job_id).get("jobNativeState") == "PENDING"
        await c.client.change_job(job_id, hold=False)
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(30))
        await c.wait_output(job_id, "released and ran")

        # A job pending for its begin time, held and released again (as root, scontrol
        # hold is an administrator's hold).
        later = await c.submit("true", name="pa-later", beginTime="now+1hour")
        await c.wait_attr(later, "jobStatusMessage", "BeginTime")
        assert c.job(later).get("jobStatus") == "QUEUING"
        await c.client.change_job(later, hold=True)
        await c.client.wait_for(lambda: c.job(later).get("jobStatusMessage") in ("JobHeldUser", "JobHeldAdmin"),
                                scaled(30), description="the job held")
        assert c.job(later).get("jobStatus") == "HOLD"
        await c.client.change_job(later, hold=False)
        await c.client.wait_for(lambda: not c.job(later).get("jobStatusMessage", "").startswith("JobHeld"),
                                scaled(30), description="the job released")
        assert c.job(later).get("jobState") == "STARTING" and c.job(later).get("jobStatus") == "QUEUING"


async def test_suspend_and_resume():
    async with cluster() as c:
        job_id = await c.submit("sleep", ["300"], name="pa-suspend")
        await c.client.wait_job_state(job_id, "RUNNING", timeout=scaled(30))
        await c.client.change_job(job_id, jobState="SUSPENDED")
        await c.client.wait_job_state(job_id, "SUSPENDED", timeout=scaled(30))
        assert c.job(job_id).get("jobStatus") == "SUSPENDED" and c.job(job_id).get("jobNativeState") == "SUSPENDED"
        await c.client.change_job(job_id, jobState="RUNNING")
        await c.wait_attr(job_id, "jobState", "RUNNING", timeout=scaled(30))
        await c.wait_attr(job_id, "jobNativeState", "RUNNING", timeout=scaled(30))  # as SLURM itself sees it
        await c.client.terminate(job_id)
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(30))


async def test_unknown_partition_is_refused_naming_the_queues():
    async with cluster() as c:
        with pytest.raises(CommandFailed) as failed:
            await c.client.submit("true", partition="nosuch", sub_id="pa-nosuch")
        assert failed.value.code == ErrorCode.NO_SUCH_QUEUE
        assert failed.value.event.event_id.name == "SUBMITJOB_ERROR"
        assert failed.value.event.job_sub_id == "pa-nosuch"
        assert "nosuch" in failed.value.message and "slurm:debug" in failed.value.message
        assert all(j.get("jobSubId") != "pa-nosuch" for j in c.client.jobs.values())


async def test_a_submission_slurm_refuses_is_refused_with_slurms_message():
    async with cluster() as c:
        with pytest.raises(CommandFailed) as failed:
            await c.client.submit("true", memory="99999999", sub_id="pa-toobig")
        assert failed.value.code == ErrorCode.SUBMIT_FAILED
        assert failed.value.event.event_id.name == "SUBMITJOB_ERROR"
        assert failed.value.event.job_sub_id == "pa-toobig"
        assert "Memory specification can not be satisfied" in failed.value.message
        assert "Batch job submission failed" in failed.value.message
        assert all(j.get("jobSubId") != "pa-toobig" for j in c.client.jobs.values())


async def test_arguments_and_environment_arrive_verbatim():
    args = [
        "two words",
        "it's \"quoted\"",
        "$(touch /tmp/pa-injected) `touch /tmp/pa-injected` $HOME ${PATH}",
        "first line\nsecond line",
        "; rm -rf / #",
        "",
        "-n",
        "héllo wörld ✓ 日本",
        "back\\slash * ? [a-z]",
    ]
    code = ("import json, os, sys; "
            "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('PA_VALUE')}, ensure_ascii=False))")
    env = {"PA_VALUE": "a b $(nope) 'x' \"y\" ✓", "PYTHONIOENCODING": "utf-8"}
    if os.path.exists("/tmp/pa-injected"):
        os.unlink("/tmp/pa-injected")
    async with cluster() as c:
        job_id = await c.submit(PY, ["-c", code, *args], env=env, name="pa-verbatim $(x)")
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(40))
        out = await c.wait_output(job_id, "argv")
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen == {"argv": args, "env": env["PA_VALUE"]}
        assert c.job(job_id).get("jobStatus") == "FINISHED"
        assert not os.path.exists("/tmp/pa-injected")


async def test_drained_node_shows_up_as_node_change():
    node = node_name()
    async with cluster() as c:
        (element,) = [n for n in c.client.nodes.values() if n.name == node]
        try:
            result = scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=proxy-agent test")
            assert result.returncode == 0, result.stderr
            await c.client.wait_for(lambda: element.get("nodeState") == "DOWN", scaled(30), description="the node DOWN")
            assert "DRAIN" in element.get("nativeState").upper()
            assert element.get("reason") == "proxy-agent test"
        finally:
            scontrol("update", f"NodeName={node}", "State=RESUME")
        await c.client.wait_for(lambda: element.get("nodeState") == "UP", scaled(30), description="the node UP again")
        assert not element.get("reason")


async def test_move_pending_job_between_partitions():
    async with cluster() as c:
        debug, long_ = c.client.queue("debug"), c.client.queue("long")
        job_id = await c.submit("true", name="pa-move", beginTime="now+1hour", queue="debug")
        sub_id = c.job(job_id).sub_id
        await c.wait_attr(job_id, "jobStatusMessage", "BeginTime")
        assert c.job(job_id).parent == debug.id
        await c.client.move_job(job_id, "long")
        await c.client.wait_for(lambda: c.job(sub_id).parent == long_.id, scaled(30), description="the job under long")
        job = c.job(sub_id)
        assert job.id == job_id and job.get("queueId") == long_.id
        assert len(c.client.children(job, "process")) == 1
        shown = scontrol("show", "job", job.get("nativeId")).stdout
        assert "Partition=long" in shown
        # SLURM's listing agrees after a few polls: the job stays under long.  (A job submitted
        # later shows SLURM's reason for it only once a poll has listed both.)
        for round_ in range(2):
            later = await c.submit("true", name=f"pa-move-poll{round_}", beginTime="now+1hour", queue="debug")
            await c.wait_attr(later, "jobStatusMessage", "BeginTime")
            assert c.job(sub_id).parent == long_.id
        await c.client.move_job(job_id, "debug")
        await c.client.wait_for(lambda: c.job(sub_id).parent == debug.id, scaled(30), description="the job back under debug")
        assert c.client.violations == []


async def test_moving_a_running_job_fails_with_slurms_message():
    async with cluster() as c:
        job_id = await c.submit("sleep", ["300"], name="pa-nomove")
        await c.client.wait_job_state(job_id, "RUNNING", timeout=scaled(30))
        with pytest.raises(CommandFailed) as failed:
            await c.client.move_job(job_id, "long")
        assert failed.value.message.startswith("cannot move SLURM job")
        assert c.job(job_id).parent == c.client.queue("debug").id
        await c.client.terminate(job_id)


# ------------------------------------------------------------------------------------ in-process


async def wait_model(predicate, timeout: float = scaled(30)):
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.1)


async def test_final_state_lookups_on_the_real_cluster(nursery, tmp_path):
    """How a job ended, asked the ways the backend asks when squeue no longer lists it."""
    backend = SlurmBackend(ServiceModel(), SlurmOptions(poll_interval=0.5), spool_dir=str(tmp_path))
    slurm = await start_backend(nursery, backend)
    model = slurm.model
    assert backend.config["ClusterName"] == "proxyagent"
    eid = await slurm.submit_ptp(["jobSubId=final", "execName=sh", "progArgs=-c", "progArgs=exit 4"])
    slurm_id = model.attr(eid, K.NATIVE_ID)
    try:
        await wait_model(lambda: slurm.ended(eid), scaled(60))
        assert model.attr(eid, K.STATE) == "FAILED" and model.attr(eid, K.NATIVE_STATE) == "FAILED"
        assert model.attr(eid, K.EXIT_CODE) == "4"
        (process,) = model.processes(eid)
        assert model.attr(process, K.EXIT_CODE) == "4"
        by_scontrol = await backend.system.slurm_records([slurm_id], backend.run_cmd)
        assert by_scontrol[slurm_id].state == "FAILED" and by_scontrol[slurm_id].exit_code == "4:0"
        backend.system.MAX_SCONTROL_LOOKUPS = 0  # as if the controller had forgotten it: the completion log
        by_sacct = await backend.system.slurm_records([slurm_id], backend.run_cmd)
        assert by_sacct[slurm_id].state == "FAILED" and by_sacct[slurm_id].exit_code == "4:0"
    finally:
        subprocess.run(["scancel", slurm_id], capture_output=True, timeout=scaled(30))


async def test_unreachable_controller_is_reported_not_fatal(nursery, tmp_path, monkeypatch):
    """SLURM's own error text reaches last_error, the notices and a refused submission; the
    backend keeps running and retrying."""
    conf = tmp_path / "slurm.conf"
    text = open(os.environ["SLURM_CONF"]).read()
    conf.write_text("\n".join("SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
                              for line in text.splitlines()) + "\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    backend = SlurmBackend(ServiceModel(), SlurmOptions(poll_interval=0.5), spool_dir=str(tmp_path))
    with trio.fail_after(scaled(40)):
        slurm = await start_backend(nursery, backend)
    model, messages = slurm.model, slurm.notices
    assert "Unable to contact slurm controller" in (backend.last_error or "")
    (machine,) = model.keys(Kind.MACHINE)
    assert model.attr(machine, K.STATE) == "ERROR"
    assert slurm.ptp(machine)["machineState"] == "ERROR"
    assert [info for info in backend.attributes() if info.name == "partition"]
    await wait_model(lambda: messages)
    assert messages[0][0] == "ERROR" and "Unable to contact slurm controller" in messages[0][1]
    # No partition is known, so nothing can be routed to it ...
    with pytest.raises(SubmitError, match="no scheduler has a queue") as refused:
        await slurm.submit_ptp(["jobSubId=down", "execName=true"])
    assert refused.value.kind is ErrorKind.UNAVAILABLE
    # ... and a queue known from before gets SLURM's own answer.
    queue = model.add(Kind.QUEUE, None, {K.NAME: "debug", K.STATE: "NORMAL"}, owner="slurm")
    with pytest.raises(SubmitError) as refused:
        with trio.fail_after(scaled(40)):
            await slurm.service.submit(JobSpec("true", queue="debug", client_ref="down"))
    assert refused.value.message == "Batch job submission failed: Unable to contact slurm controller (connect failure)"
    assert refused.value.kind is ErrorKind.SUBMIT_FAILED
    assert model.children(queue) == []
    assert len(messages) == 1  # the same failure is told once
