"""The Grid Engine backend end to end: a real agent (``--scheduler sge``) on the cell of
``scripts/sge-up``, driven over the wire protocol.

Every test's jobs are named ``pa-sge-*`` and deleted at its end; other jobs on the cell are
left alone.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from contextlib import asynccontextmanager
from typing import AsyncIterator, List

import pytest
import trio

import sge_support
from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient, CommandFailed
from proxy_agent.protocol.messages import ErrorCode

pytestmark = pytest.mark.sge

sge_support.require_cell()

TEST_TIMEOUT = scaled(90)
PY = sys.executable


class Cell:
    def __init__(self, client: AgentClient, home: str) -> None:
        self.client = client
        self.home = home
        self.native_ids: List[str] = []

    async def submit(self, executable: str, args=(), **kwargs) -> str:
        job_id = await self.client.submit(executable, args, **kwargs)
        native = self.client.job(job_id).get("nativeId")
        assert native, f"job {job_id} has no nativeId"
        self.native_ids.append(native)
        return job_id

    def job(self, ref: str):
        return self.client.job(ref)

    async def wait_status(self, ref: str, status: str, timeout: float = scaled(40)):
        return await self.client.wait_for(lambda: self.job(ref).get("jobStatus") == status, timeout,
                                          description=f"job {ref} to be {status} (is {self.job(ref).get('jobStatus')})")

    async def wait_output(self, ref: str, text: str, stream: str = "stdout", timeout: float = scaled(40)) -> str:
        await self.client.wait_for(lambda: text in self.client.job_output(ref, stream), timeout,
                                   description=f"{text!r} in the {stream} of job {ref}")
        return self.client.job_output(ref, stream)


@asynccontextmanager
async def cell(tmp_path) -> AsyncIterator[Cell]:
    home = str(tmp_path)
    argv = agent_argv("--scheduler", "sge", "--sge-poll-interval", "1")
    session = None
    try:
        with trio.fail_after(TEST_TIMEOUT):
            async with await AgentClient.spawn(argv, env=subprocess_env(HOME=home), cwd=home) as client:
                session = Cell(client, home)
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: client.queues and client.nodes, scaled(30), description="queues and nodes")
                yield session
                await client.quit()
    finally:
        if session is not None and session.native_ids:
            sge_support.run(["qdel", *session.native_ids])


def spool_files(home: str) -> List[str]:
    return glob.glob(os.path.join(home, ".proxy-agent", "sge", "*"))


async def test_cell_model(tmp_path):
    async with cell(tmp_path) as c:
        client = c.client
        (machine,) = client.machines.values()
        assert machine.get("backend") == "sge" and machine.get("version") == "8.1.9"
        await client.wait_for(lambda: machine.get("machineState") == "UP", scaled(30), description="the machine UP")
        queues = {q.name: q for q in client.queues.values()}
        assert set(queues) >= {"all.q", "short.q"}
        assert queues["all.q"].get("totalSlots") == "4" and queues["short.q"].get("totalSlots") == "2"
        assert queues["short.q"].get("maxTime") == "600" and queues["all.q"].get("maxTime") is None
        assert queues["all.q"].get("default") == "true"
        for name in ("freeSlots", "waitingJobs", "runningJobs"):
            assert queues["all.q"].get(name) is not None, name
        (node,) = client.nodes.values()
        assert node.get("nodeState") == "UP" and int(node.get("cpus")) >= 1
        assert "all.q" in node.get("queues")


async def test_output_exit_code_and_spool(tmp_path):
    go = tmp_path / "go"  # the job goes on once the test has seen its first line
    code = (f"import os, sys, time; print('first', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
            "print('second'); sys.stderr.write('bad end\\n'); sys.exit(3)")
    async with cell(tmp_path) as c:
        job_id = await c.submit(PY, ["-c", code], name="pa-sge-out")
        await c.wait_status(job_id, "RUNNING")
        await c.wait_output(job_id, "first")  # while it runs
        assert c.job(job_id).get("jobStatus") == "RUNNING"
        assert spool_files(c.home)
        go.touch()
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(40))
        # Everything was delivered before the final state.
        assert c.client.job_output(job_id, "stdout") == "first\nsecond\n"
        assert c.client.job_output(job_id, "stderr") == "bad end\n"
        job = c.job(job_id)
        assert job.get("jobStatus") == "FAILED" and job.get("exitCode") == "3"
        (process,) = c.client.children(job, "process")
        assert process.get("processExitCode") == "3"
        await c.client.wait_for(lambda: not spool_files(c.home), scaled(30), description="spool files removed")

        ok = await c.submit(PY, ["-c", "print('fine')"], name="pa-sge-ok")
        await c.client.wait_job_state(ok, "COMPLETED", timeout=scaled(40))
        assert c.client.job_output(ok, "stdout") == "fine\n"
        assert c.job(ok).get("jobStatus") == "FINISHED" and c.job(ok).get("exitCode") == "0"
        assert c.job(ok).get("jobNativeState") == "exited"


async def test_cancel_hold_release(tmp_path):
    async with cell(tmp_path) as c:
        running = await c.submit("sleep", ["300"], name="pa-sge-cancel")
        await c.wait_status(running, "RUNNING")
        await c.client.terminate(running)
        await c.wait_status(running, "KILLED")

        held = await c.submit(PY, ["-c", "print('released and ran')"], name="pa-sge-held", hold=True)
        await c.client.wait_for(lambda: c.job(held).get("jobNativeState") == "hqw", scaled(30), description="hqw")
        assert c.job(held).get("jobStatus") == "HOLD"
        await c.client.change_job(held, hold=False)
        await c.client.wait_job_state(held, "COMPLETED", timeout=scaled(40))
        assert c.job(held).get("jobStatus") == "FINISHED"
        assert c.client.job_output(held, "stdout") == "released and ran\n"

        # A job deleted before it ever ran leaves no accounting record: still KILLED.
        waiting = await c.submit("true", name="pa-sge-never", hold=True)
        await c.client.wait_for(lambda: c.job(waiting).get("jobNativeState") == "hqw", scaled(30), description="hqw")
        await c.client.terminate(waiting)
        await c.wait_status(waiting, "KILLED")
        with pytest.raises(CommandFailed) as failed:
            await c.client.terminate(waiting)
        assert "ended" in failed.value.message


async def test_suspend_and_resume(tmp_path):
    async with cell(tmp_path) as c:
        job_id = await c.submit("sleep", ["300"], name="pa-sge-suspend")
        await c.wait_status(job_id, "RUNNING")
        await c.client.change_job(job_id, jobState="SUSPENDED")
        await c.wait_status(job_id, "SUSPENDED")
        assert "s" in c.job(job_id).get("jobNativeState")
        await c.client.change_job(job_id, jobState="RUNNING")
        await c.wait_status(job_id, "RUNNING")
        await c.client.terminate(job_id)
        await c.wait_status(job_id, "KILLED")


async def test_arguments_and_environment_verbatim(tmp_path):
    args = ["two words", "it's \"quoted\"", "$(touch /tmp/pa-sge-injected) `touch /tmp/pa-sge-injected` $HOME",
            "first line\nsecond line", "; rm -rf / #", "", "-n", "héllo wörld ✓ 日本", "#$ -o /etc/x"]
    code = ("import json, os, sys; "
            "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('PA_VALUE')}, ensure_ascii=False))")
    env = {"PA_VALUE": "a b $(nope) 'x' \"y\" ✓", "PYTHONIOENCODING": "utf-8"}
    if os.path.exists("/tmp/pa-sge-injected"):
        os.unlink("/tmp/pa-sge-injected")
    async with cell(tmp_path) as c:
        job_id = await c.submit(PY, ["-c", code, *args], env=env, name="pa-sge-verbatim")
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(40))
        seen = json.loads(c.client.job_output(job_id, "stdout").strip().splitlines()[-1])
        assert seen == {"argv": args, "env": env["PA_VALUE"]}
        assert not os.path.exists("/tmp/pa-sge-injected")


async def test_queues_moves_and_errors(tmp_path):
    async with cell(tmp_path) as c:
        with pytest.raises(CommandFailed) as failed:
            await c.client.submit("true", queueId="sge:nosuch", sub_id="pa-sge-nosuch")
        assert failed.value.code == ErrorCode.NO_SUCH_QUEUE
        assert "sge:all.q" in failed.value.message

        # A Grid Engine refusal comes back in its own words.
        with pytest.raises(CommandFailed) as failed:
            await c.client.submit("true", gres="pa_nosuch=1", sub_id="pa-sge-badres")
        assert failed.value.code == ErrorCode.SUBMIT_FAILED
        assert "qsub" in failed.value.message and "pa_nosuch" in failed.value.message

        held = await c.submit("true", name="pa-sge-move", hold=True)
        await c.client.wait_for(lambda: c.job(held).get("jobNativeState") == "hqw", scaled(30), description="hqw")
        await c.client.move_job(held, "short.q")
        await c.client.wait_for(lambda: c.job(held).get("queueId") == c.client.queue("short.q").id, scaled(30),
                                description="the job in short.q")
        out = sge_support.run(["qstat", "-j", c.job(held).get("nativeId")]).stdout
        assert "short.q" in out

        running = await c.submit("sleep", ["300"], name="pa-sge-nomove")
        await c.wait_status(running, "RUNNING")
        with pytest.raises(CommandFailed) as failed:
            await c.client.move_job(running, "short.q")
        assert "only while it waits" in failed.value.message


async def test_job_attributes_reach_qsub(tmp_path):
    async with cell(tmp_path) as c:
        job_id = await c.submit("true", name="pa-sge-attrs", hold=True, account="proj42", timeLimit="00:05:00",
                                gpus="1", jobNumProcs="2", prologue="export PA_PRE=1")
        await c.wait_status(job_id, "HOLD")
        detail = sge_support.run(["qstat", "-j", c.job(job_id).get("nativeId")]).stdout
        assert "proj42" in detail
        assert "h_rt=300" in detail and "gpu=1" in detail
        assert "smp" in detail  # two slots through the parallel environment
        assert c.job(job_id).get("account") == "proj42"


async def test_error_state_shows_its_reason(tmp_path):
    async with cell(tmp_path) as c:
        job_id = await c.submit("true", name="pa-sge-eqw", workingDir="/nonexistent/pa-sge")
        await c.wait_status(job_id, "HOLD")
        await c.client.wait_for(lambda: "nonexistent" in (c.job(job_id).get("jobStatusMessage") or ""), scaled(30),
                                description="the error's reason")
        assert "E" in c.job(job_id).get("jobNativeState")
        await c.client.terminate(job_id)
        # Its accounting record tells of the failed start.
        await c.wait_status(job_id, "FAILED")
        assert "working directory" in c.job(job_id).get("jobStatusMessage")


async def test_a_new_agent_adopts_the_jobs_of_the_last_one(tmp_path):
    """Jobs outlive the agent: the next agent on the same state directory finds them by
    their Grid Engine ids, with their output delivered on from where it stopped."""
    env = subprocess_env(HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))
    argv = agent_argv("--scheduler", "sge", "--sge-poll-interval", "1")
    go = tmp_path / "go"  # the job goes on once the first agent has gone
    code = (f"import os, time; print('before', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
            "print('after', flush=True)")
    native = None
    try:
        with trio.fail_after(TEST_TIMEOUT):
            async with await AgentClient.spawn(argv, env=env, cwd=str(tmp_path)) as client:
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: client.queues, scaled(30), description="queues")
                job_id = await client.submit(PY, ["-c", code], name="pa-sge-adopt")
                native = client.job(job_id).get("nativeId")
                await client.wait_for(lambda: "before" in client.job_output(job_id, "stdout"), scaled(40),
                                      description="the first line")
                await client.quit()
            go.touch()
            async with await AgentClient.spawn(argv, env=env, cwd=str(tmp_path)) as client:
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: job_id in client.jobs, scaled(30),
                                      description=f"the adopted job {job_id} in {list(client.jobs)}: {client.process.stderr_tail(30)}")
                assert client.job(job_id).get("nativeId") == native
                await client.wait_job_state(job_id, "COMPLETED", timeout=scaled(40))
                assert client.job(job_id).get("jobStatus") == "FINISHED"
                # Only what the first agent had not delivered.
                assert client.job_output(job_id, "stdout") == "after\n"
                await client.quit()
    finally:
        if native:
            sge_support.run(["qdel", native])


async def test_other_users_jobs_only_with_all_users(tmp_path):
    script = "#!/bin/sh\nsleep 120\n"
    argv = ["runuser", "-u", sge_support.OTHER_USER, "--", "qsub", "-terse", "-h", "-N", "pa-sge-other",
            "-o", "/dev/null", "-e", "/dev/null", "-S", "/bin/sh"]
    other = sge_support.run(argv, stdin=script).stdout.strip()
    assert other.isdigit(), other
    try:
        for all_users in (False, True):
            flags = ["--all-users"] if all_users else []
            argv = agent_argv("--scheduler", "sge", "--sge-poll-interval", "1", *flags)
            with trio.fail_after(TEST_TIMEOUT):
                async with await AgentClient.spawn(argv, env=subprocess_env(HOME=str(tmp_path))) as client:
                    await client.init()
                    await client.model_def()
                    await client.start_events()
                    await client.wait_for(lambda: client.queues, scaled(30), description="queues")
                    mine = await client.submit("true", name="pa-sge-mine", hold=True)
                    mine_native = client.job(mine).get("nativeId")
                    # One poll later the listing has been applied.
                    await client.wait_for(lambda: client.job(mine).get("jobNativeState") == "hqw", scaled(30),
                                          description="my job listed")
                    seen = {job.get("nativeId"): job for job in client.jobs.values()}
                    if all_users:
                        assert seen[other].get("jobStatus") == "HOLD" and seen[other].name == "pa-sge-other"
                    else:
                        assert other not in seen
                    sge_support.run(["qdel", mine_native])
                    await client.quit()
    finally:
        sge_support.run(["qdel", other])


async def test_array_job_ends_when_its_last_task_has(tmp_path):
    async with cell(tmp_path) as c:
        job_id = await c.submit("/bin/sh", ["-c", "echo task $SGE_TASK_ID"], name="pa-sge-array", array="1-3")
        native = c.job(job_id).get("nativeId")
        await c.client.wait_job_state(job_id, "COMPLETED", timeout=scaled(60))
        assert c.job(job_id).get("jobStatus") == "FINISHED"
        # Every task ran and is accounted for by then.
        out = sge_support.run(["qacct", "-j", native]).stdout
        assert out.count("taskid") == 3
