"""The PBS backend end to end: a real agent (``--scheduler pbs``) over the wire protocol,
running the fake PBS commands of ``tests/fake_pbs`` (both families) through the same code
path as real ones: argv, subprocess, the parsers of the recorded formats.

With ``PROXY_AGENT_PBS_BIN`` naming the directory of a real OpenPBS server's commands (its
server on this host, with queues ``workq`` (the default) and ``long``, and this user a PBS
manager, as root is), the OpenPBS tests run against that server instead (through
``--pbs-commands``), and the Torque ones are skipped."""

from __future__ import annotations

import getpass
import glob
import json
import os
import shutil
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient, CommandFailed
from proxy_agent.protocol.messages import ErrorCode

FAKE_BIN = Path(__file__).parent / "fake_pbs" / "bin"
#: the directory of a real PBS server's commands, when the tests are to run against it
REAL_BIN = os.environ.get("PROXY_AGENT_PBS_BIN") or None
PY = sys.executable
TEST_TIMEOUT = scaled(60)
DEFAULT_QUEUE = {"openpbs": "workq", "torque": "batch"}
OTHER_QUEUE = {"openpbs": "long", "torque": "short"}


def stop_leftovers(state: Path) -> None:
    """End the job processes the fake server started that have not ended."""
    for pgid_file in (state / "jobs").glob("*.pgid"):
        if pgid_file.with_suffix(".exit").exists():
            continue
        try:
            os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@asynccontextmanager
async def server(tmp_path: Path, family: str, commands: str = "path", **settings: str) -> AsyncIterator[AgentClient]:
    """An agent on the fake PBS of ``family`` (its commands first on PATH, or with
    ``commands="option"`` named by ``--pbs-commands`` behind Grid Engine's commands of the
    same names), or on the real server of ``PROXY_AGENT_PBS_BIN``."""
    if REAL_BIN is not None:
        if family != "openpbs" or settings:
            pytest.skip("runs on the fake PBS only (PROXY_AGENT_PBS_BIN names a real OpenPBS)")
        env = subprocess_env(HOME=str(tmp_path))
        argv = agent_argv("--scheduler", "pbs", "--pbs-poll-interval", "0.5", "--pbs-commands", REAL_BIN)
    else:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        env = subprocess_env(
            PATH=f"{FAKE_BIN}:{path}" if commands == "path" else path,
            FAKE_PBS_FAMILY=family, FAKE_PBS_STATE=str(tmp_path / "state"), FAKE_PBS_QUEUE_SECONDS="0.3",
            HOME=str(tmp_path), FAKE_PBS_USER=getpass.getuser(), **settings,
        )
        argv = agent_argv("--scheduler", "pbs", "--pbs-poll-interval", "0.5",
                          *(("--pbs-commands", str(FAKE_BIN)) if commands == "option" else ()))
    try:
        with trio.fail_after(TEST_TIMEOUT):
            async with await AgentClient.spawn(argv, env=env, cwd=str(tmp_path)) as client:
                await client.init()
                await client.model_def()
                await client.start_events()
                await client.wait_for(lambda: client.queues and len(client.nodes) == len(NODES), scaled(30),
                                      description="queues and nodes")
                yield client
                await client.quit()
    finally:
        if REAL_BIN is None:
            stop_leftovers(tmp_path / "state")


def _real_nodes() -> set:
    import subprocess
    shown = subprocess.run([os.path.join(REAL_BIN, "pbsnodes"), "-a"], capture_output=True, text=True, timeout=scaled(30))
    return {line.strip() for line in shown.stdout.splitlines() if line and not line[0].isspace()}


#: the nodes the PBS server has
NODES = _real_nodes() if REAL_BIN is not None else {"fn01", "fn02"}


def status(client: AgentClient, job: str) -> str:
    return client.job(job).get("jobStatus")


async def wait_status(client: AgentClient, job: str, wanted: str, timeout: float = scaled(30)) -> None:
    await client.wait_for(lambda: status(client, job) == wanted, timeout,
                          description=f"job {job} {wanted} (is {status(client, job)})")


@pytest.fixture(params=["openpbs", "torque"])
def family(request) -> str:
    return request.param


async def test_model_output_and_exit_codes(tmp_path, family):
    async with server(tmp_path, family) as client:
        (machine,) = client.machines.values()
        assert machine.get("backend") == "pbs"
        assert ("Torque" if family == "torque" else "OpenPBS") in machine.get("version")
        queues = {q.name: q for q in client.queues.values()}
        assert set(queues) == {DEFAULT_QUEUE[family], OTHER_QUEUE[family]}
        assert queues[DEFAULT_QUEUE[family]].get("default") == "true"
        assert {n.name for n in client.nodes.values()} == NODES

        code = "import sys; print('out line'); sys.stderr.write('err line\\n'); sys.exit(3)"
        job = await client.submit(PY, ["-c", code], name="pa-pbs-fail")
        native = client.job(job).get("nativeId")
        assert native.endswith(".fake-head") if REAL_BIN is None else native.split(".")[0].isdigit()
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        # All output is delivered before the final state (Torque copies it at the end).
        assert client.job_output(job, "stdout") == "out line\n"
        assert client.job_output(job, "stderr") == "err line\n"
        assert status(client, job) == "FAILED" and client.job(job).get("exitCode") == "3"
        await client.wait_for(lambda: not glob.glob(str(tmp_path / ".proxy-agent" / "pbs" / "*")), scaled(30),
                              description="spool files removed")

        args = ["two words", "$(touch pwned)", "it's", "", "héllo ✓"]
        ok = await client.submit(PY, ["-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *args],
                                 name="pa-pbs-ok", env={"PA_X": "a 'b'"})
        await client.wait_job_state(ok, "COMPLETED", timeout=scaled(30))
        assert json.loads(client.job_output(ok, "stdout")) == args
        assert status(client, ok) == "FINISHED" and client.job(ok).get("exitCode") == "0"
        assert not (tmp_path / "pwned").exists()
        # where it ran stays known after its end (a real server without job history blanks it)
        assert client.job(ok).get("hosts") in NODES, client.job(ok).get("hosts")


async def test_cancel_hold_release_move(tmp_path, family):
    async with server(tmp_path, family) as client:
        running = await client.submit(PY, ["-c", "import time; time.sleep(60)"], name="pa-pbs-cancel")
        await wait_status(client, running, "RUNNING")
        if REAL_BIN is None:  # (on a real server this user is a manager: it may suspend)
            with pytest.raises(CommandFailed) as failed:
                await client.change_job(running, jobState="SUSPENDED")
            assert "operator or manager" in failed.value.message
        with pytest.raises(CommandFailed) as failed:
            await client.move_job(running, OTHER_QUEUE[family])
        assert "not started" in failed.value.message
        await client.terminate(running)
        await wait_status(client, running, "KILLED")

        held = await client.submit(PY, ["-c", "print('released')"], name="pa-pbs-held", hold=True)
        await client.wait_for(lambda: client.job(held).get("jobNativeState") == "H", scaled(30), description="held")
        assert status(client, held) == "HOLD"
        await client.move_job(held, OTHER_QUEUE[family])
        await client.wait_for(lambda: client.job(held).get("queueId") == client.queue(OTHER_QUEUE[family]).id, scaled(30),
                              description="moved")
        await client.change_job(held, hold=False)
        await client.wait_job_state(held, "COMPLETED", timeout=scaled(30))
        assert status(client, held) == "FINISHED"
        assert client.job_output(held, "stdout") == "released\n"


async def test_suspend_resume_when_privileged(tmp_path):
    async with server(tmp_path, "openpbs", **({} if REAL_BIN else {"FAKE_PBS_PRIVILEGED": "1"})) as client:
        job = await client.submit(PY, ["-c", "import time; time.sleep(60)"], name="pa-pbs-suspend")
        await wait_status(client, job, "RUNNING")
        await client.change_job(job, jobState="SUSPENDED")
        await wait_status(client, job, "SUSPENDED")
        await client.change_job(job, jobState="RUNNING")
        await wait_status(client, job, "RUNNING")
        await client.terminate(job)
        await wait_status(client, job, "KILLED")


async def test_refusals_are_clear_and_the_agent_serves_on(tmp_path):
    async with server(tmp_path, "openpbs") as client:
        with pytest.raises(CommandFailed) as failed:
            await client.submit("true", qos="high", sub_id="pa-pbs-qos")
        assert failed.value.code == ErrorCode.NOT_SUPPORTED
        assert "qos" in failed.value.message.lower()
        job = await client.submit("true", name="pa-pbs-after")
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert status(client, job) == "FINISHED"


async def test_the_commands_are_found_where_the_option_says(tmp_path):
    """Grid Engine's qstat and qsub share PBS's names: with PBS's directory named, the agent
    runs PBS's commands whatever comes first on PATH."""
    if REAL_BIN is None and shutil.which("qstat") in (None, str(FAKE_BIN / "qstat")):
        pytest.skip("no other qstat on PATH here")
    async with server(tmp_path, "openpbs", commands="option") as client:
        (machine,) = client.machines.values()
        assert "OpenPBS" in machine.get("version")
        job = await client.submit(PY, ["-c", "print('from PBS')"], name="pa-pbs-dir")
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert client.job_output(job, "stdout") == "from PBS\n" and status(client, job) == "FINISHED"


async def test_a_job_that_can_never_run_says_so_in_the_schedulers_words(tmp_path):
    async with server(tmp_path, "openpbs") as client:
        job = await client.submit("/bin/true", name="pa-pbs-never", count=64)  # more than every node has
        await client.wait_for(lambda: "Can Never Run" in (client.job(job).get("jobStatusMessage") or ""), scaled(30),
                              description="the scheduler's comment")
        message = client.job(job).get("jobStatusMessage")
        assert message.startswith("will not start as submitted: Can Never Run: Insufficient amount of resource")
        assert status(client, job) == "QUEUING"
        await client.terminate(job)
        await wait_status(client, job, "KILLED")


async def test_a_queue_changed_with_qmgr_reaches_the_client_at_the_next_poll(tmp_path):
    import subprocess

    queue = OTHER_QUEUE["openpbs"]
    env = dict(os.environ, FAKE_PBS_FAMILY="openpbs", FAKE_PBS_STATE=str(tmp_path / "state"))

    def qmgr(setting: str) -> None:
        done = subprocess.run([os.path.join(REAL_BIN or str(FAKE_BIN), "qmgr"), "-c", f"set queue {queue} {setting}"],
                              capture_output=True, text=True, env=env, timeout=scaled(30))
        assert done.returncode == 0, done.stderr

    async with server(tmp_path, "openpbs") as client:
        was = client.queue(queue).get("maxTime")
        try:
            qmgr("resources_max.walltime = 30:00:00")
            # the queues are listed at every poll (0.5 s here)
            await client.wait_for(lambda: client.queue(queue).get("maxTime") == str(30 * 3600), scaled(30),
                                  description=f"maxTime of {queue} (is {client.queue(queue).get('maxTime')})")
            qmgr("enabled = False")
            await client.wait_for(lambda: client.queue(queue).get("queueState") == "STOPPED", scaled(30),
                                  description=f"{queue} stopped")
        finally:
            qmgr("enabled = True")
            if was:
                hours, rest = divmod(int(was), 3600)
                qmgr(f"resources_max.walltime = {hours:02d}:{rest // 60:02d}:{rest % 60:02d}")


async def test_torque_final_state_from_tracejob(tmp_path):
    # Torque forgets completed jobs at once here: the end comes from tracejob.
    async with server(tmp_path, "torque", FAKE_PBS_KEEP_COMPLETED="0") as client:
        job = await client.submit(PY, ["-c", "raise SystemExit(4)"], name="pa-pbs-trace")
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert status(client, job) == "FAILED" and client.job(job).get("exitCode") == "4"


async def test_no_pbs_here_is_a_clear_error_and_other_schedulers_serve_on(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qstat").write_text("#!/bin/sh\necho 'SGE 8.1.9'\nexit 1\n")
    (bin_dir / "qstat").chmod(0o755)
    env = subprocess_env(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", HOME=str(tmp_path))
    argv = agent_argv("--scheduler", "local,pbs")
    with trio.fail_after(TEST_TIMEOUT):
        async with await AgentClient.spawn(argv, env=env, cwd=str(tmp_path)) as client:
            await client.init()
            await client.model_def()
            await client.start_events()
            await client.wait_for(lambda: "cannot tell which PBS" in client.process.stderr_tail(200), scaled(30),
                                  description="the error")
            assert "SGE 8.1.9" in client.process.stderr_tail(200)  # what the probe saw
            job = await client.submit("/bin/echo", ["still here"])
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            assert client.job_output(job) == "still here\n"
            await client.quit()
        assert "Traceback" not in client.process.stderr_tail(200)
