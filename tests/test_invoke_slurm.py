"""The Invoke Server on the real SLURM: a Ninf-G client's jobs in a SLURM partition, with their
output in the client's files, destroyed queued or running, and cancelled by EXIT.

Every job is a script named ``pa-h15-<random>``, so SLURM shows it under that name; the
test cancels only jobs of that name."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import List

import pytest
import trio

from slurm_support import require_cluster, slurm_conf
from wait_support import scaled
from test_invoke_protocol import FACTS_NOTIFIES, FACTS_REPLIES
from test_invoke_server import _final, attributes, invoke_server, script
from proxy_agent.frontends.invoke.protocol import CreateNotify, InvokeStatus, encode_job_create, parse_notify

pytestmark = pytest.mark.slurm

require_cluster()

TIMEOUT = scaled(60)
SERVER_ARGS = ("--scheduler", "slurm", "--agent-option=--slurm-poll-interval=0.5")


def _slurm_env() -> dict:
    return {"SLURM_CONF": slurm_conf() or ""}


def _squeue(name: str) -> List[str]:
    """States of the jobs named ``name`` that SLURM still lists."""
    done = subprocess.run(
        ["squeue", "--noheader", "--name", name, "--format", "%T"],
        capture_output=True, text=True, timeout=scaled(30), env={**_slurm_env(), "PATH": "/usr/bin:/bin:/usr/local/bin"},
    )
    return done.stdout.split()


def _scancel(name: str) -> None:
    subprocess.run(["scancel", "--name", name], capture_output=True, timeout=scaled(30),
                   env={**_slurm_env(), "PATH": "/usr/bin:/bin:/usr/local/bin"})


class Programs:
    """Scripts with names of this test run's own."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.names: List[str] = []

    def make(self, body: str) -> Path:
        name = f"pa-h15-{uuid.uuid4().hex[:8]}"
        self.names.append(name)
        return script(self.directory / name, body)

    def cancel_all(self) -> None:
        for name in self.names:
            _scancel(name)


@pytest.fixture
def programs(tmp_path):
    made = Programs(tmp_path)
    yield made
    made.cancel_all()


async def _gone_from_slurm(name: str) -> None:
    with trio.fail_after(TIMEOUT):
        while any(state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for state in _squeue(name)):
            await trio.sleep(0.5)


async def test_the_facts_sheet_exchange_byte_for_byte_on_slurm(tmp_path, programs):
    program = programs.make('echo "on $(hostname) with $3"\necho "err line" >&2\nsleep 1\n')
    out, err = tmp_path / "ngtmpfile.o9UguW", tmp_path / "ngtmpfile.i7T1TH"
    args = ["--connectbackAddress=ng_tcp://localhost:57007/", "--authNumber=1812930085", "--contextID=1",
            "--jobID=1", "--heartbeat=60", "--connectRetry=4,1,2,random", "--tcpNodelay=0"]
    async with invoke_server(*SERVER_ARGS, env=_slurm_env()) as invoke:
        invoke.timeout = TIMEOUT
        attrs = attributes(str(program), args, workdir=tmp_path, out=out, err=err)
        await invoke.send(b"QUERY_FEATURES\r\n" + encode_job_create(1, attrs))
        for _ in range(9):
            await invoke.reply()
        assert await invoke.notifies_until(_final) == [
            "CREATE_NOTIFY 1 S job-1",
            "STATUS_NOTIFY job-1 PENDING queued",
            "STATUS_NOTIFY job-1 ACTIVE started",
            "STATUS_NOTIFY job-1 DONE exit status 0",
        ]
        # its end was reported: the destroy gets S and nothing more
        await invoke.send(b"JOB_DESTROY job-1\r\n")
        assert await invoke.reply() == "S"
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0
        await invoke.drain()
    assert bytes(invoke.out) == FACTS_REPLIES
    assert bytes(invoke.err) == FACTS_NOTIFIES
    assert out.read_text().startswith("on ") and out.read_text().endswith(" with --contextID=1\n")
    assert err.read_text() == "err line\n"


async def test_hundred_concurrent_jobs_on_slurm(tmp_path, programs):
    """A hundred jobs at once all become SLURM jobs and are followed; EXIT cancels them all.
    (How soon they run depends on the other users of the one-node cluster: the end of a job
    on SLURM is shown by the other tests.)"""
    n = 100
    program = programs.make("sleep 2\n")
    async with invoke_server(*SERVER_ARGS, env=_slurm_env()) as invoke:
        invoke.timeout = TIMEOUT
        await invoke.send(b"".join(encode_job_create(i, attributes(str(program), [str(i)], workdir=tmp_path))
                                   for i in range(1, n + 1)))
        for _ in range(n):
            assert await invoke.reply() == "S"
        created = set()
        with trio.fail_after(TIMEOUT):
            while len(created) < n:
                notify = parse_notify(await invoke.notify())
                if isinstance(notify, CreateNotify):
                    assert notify.ok, notify
                    created.add(notify.job_id)
            while len(_squeue(program.name)) + len(_finals(invoke)) < n:
                await trio.sleep(0.5)
        assert created == {f"job-{i}" for i in range(1, n + 1)}
        await invoke.send(b"".join(f"JOB_STATUS job-{i}\r\n".encode() for i in range(1, n + 1)))
        statuses = {await invoke.reply() for _ in range(n)}
        assert statuses <= {"S PENDING", "S ACTIVE", "S DONE"}, statuses
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0
        await invoke.drain()
        finals = _finals(invoke)
        assert set(finals) == created
        assert set(finals.values()) <= {"DONE exit status 0", "DONE cancelled"}, set(finals.values())
    await _gone_from_slurm(program.name)


def _finals(invoke) -> dict:
    """job id -> its final status and text, from every notify read so far."""
    finals = {}
    for line in bytes(invoke.err).decode().split("\r\n"):
        if line and _final(line):
            words = line.split(" ", 2)
            finals[words[1]] = words[2]
    return finals


async def test_client_death_cancels_its_slurm_jobs(tmp_path, programs):
    program = programs.make("sleep 300\n")
    async with invoke_server(*SERVER_ARGS, env=_slurm_env()) as invoke:
        invoke.timeout = TIMEOUT
        job = await invoke.created_job(1, attributes(str(program), ["x"], workdir=tmp_path))
        await invoke.find_notify(lambda l: l.startswith(f"STATUS_NOTIFY {job} ACTIVE"))
        assert _squeue(program.name) == ["RUNNING"]
        await invoke.close_requests()
        with trio.fail_after(TIMEOUT):
            assert await invoke.proc.wait() == 0
    await _gone_from_slurm(program.name)


async def test_destroy_of_a_queued_and_of_a_running_slurm_job(tmp_path, programs):
    queued = programs.make("sleep 300\n")
    running = programs.make("sleep 300\n")
    async with invoke_server(*SERVER_ARGS, env=_slurm_env()) as invoke:
        invoke.timeout = TIMEOUT
        job2 = await invoke.created_job(1, attributes(str(running), ["x"], workdir=tmp_path))
        with trio.fail_after(TIMEOUT):
            await invoke.find_notify(lambda l: l.startswith(f"STATUS_NOTIFY {job2} ACTIVE"))
        # Two nodes from a one-node partition: SLURM keeps it pending.
        job1 = await invoke.created_job(2, attributes(str(queued), ["x"], workdir=tmp_path) + [("host_count", "2")])
        with trio.fail_after(TIMEOUT):
            while _squeue(queued.name) != ["PENDING"]:
                await trio.sleep(0.5)
        await invoke.send(f"JOB_STATUS {job1}\r\nJOB_DESTROY {job1}\r\n".encode())
        assert await invoke.reply() == "S PENDING"
        assert await invoke.reply() == "S"
        with trio.fail_after(TIMEOUT):
            final = await invoke.final_status(job1)
        assert (final.status, final.text) == (InvokeStatus.DONE, "destroyed")
        await _gone_from_slurm(queued.name)
        assert _squeue(running.name) == ["RUNNING"]
        await invoke.send(f"JOB_DESTROY {job2}\r\n".encode())
        assert await invoke.reply() == "S"
        with trio.fail_after(TIMEOUT):
            final = await invoke.final_status(job2)
        assert (final.status, final.text) == (InvokeStatus.DONE, "destroyed")
        await _gone_from_slurm(running.name)
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"


async def test_exit_cancels_the_slurm_jobs_still_running(tmp_path, programs):
    program = programs.make("sleep 300\n")
    async with invoke_server(*SERVER_ARGS, env=_slurm_env()) as invoke:
        invoke.timeout = TIMEOUT
        job = await invoke.created_job(1, attributes(str(program), ["x"], workdir=tmp_path))
        with trio.fail_after(TIMEOUT):
            await invoke.find_notify(lambda l: l.startswith(f"STATUS_NOTIFY {job} ACTIVE"))
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        with trio.fail_after(TIMEOUT):
            assert await invoke.proc.wait() == 0
    await _gone_from_slurm(program.name)
