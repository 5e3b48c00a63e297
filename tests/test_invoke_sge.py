"""The Invoke Server on the real Grid Engine cell: a Ninf-G client's job runs as a Grid Engine
job, its output reaches the client's files, and a running job is destroyed in the cell.

Every job is a script named ``pa-inv-<random>``, the name Grid Engine lists it under; only jobs
of those names are deleted afterwards."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import List

import pytest
import trio

from sge_support import cell_env, require_cell
from wait_support import scaled
from test_invoke_server import _final, attributes, invoke_server, script
from proxy_agent.frontends.invoke.protocol import InvokeStatus

pytestmark = pytest.mark.sge

require_cell()

TIMEOUT = scaled(90)
SERVER_ARGS = ("--scheduler", "sge", "--agent-option=--sge-poll-interval=1")


def _listed(name: str) -> List[str]:
    """Grid Engine's states of the jobs named ``name`` that qstat still lists."""
    done = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True, timeout=scaled(30),
                          env={**cell_env(), "PATH": "/usr/bin:/bin:/usr/local/bin"})
    # qstat truncates names to 10 characters in its table
    return [line.split()[4] for line in done.stdout.splitlines()[2:] if line.split()[2:3] == [name[:10]]]


@pytest.fixture
def programs(tmp_path):
    made: List[Path] = []

    def make(body: str) -> Path:
        path = script(tmp_path / f"pa-inv-{uuid.uuid4().hex[:3]}", body)
        made.append(path)
        return path

    yield make
    for path in made:
        subprocess.run(["qdel", path.name], capture_output=True, timeout=scaled(30),
                       env={**cell_env(), "PATH": "/usr/bin:/bin:/usr/local/bin"})


async def test_a_job_runs_on_grid_engine_with_its_output_in_the_clients_files(tmp_path, programs):
    program = programs('echo "argument $1 in $(pwd)"\necho "err line" >&2\n')
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    async with invoke_server(*SERVER_ARGS, env=cell_env()) as invoke:
        invoke.timeout = TIMEOUT
        job = await invoke.created_job(1, attributes(str(program), ["first"], workdir=tmp_path, out=out, err=err))
        with trio.fail_after(TIMEOUT):
            notifies = await invoke.notifies_until(_final)
        assert notifies[-1] == f"STATUS_NOTIFY {job} DONE exit status 0", notifies
        assert out.read_text() == f"argument first in {tmp_path}\n"
        assert err.read_text() == "err line\n"
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        assert await invoke.wait() == 0


async def test_destroy_of_a_running_grid_engine_job(tmp_path, programs):
    program = programs("sleep 300\n")
    async with invoke_server(*SERVER_ARGS, env=cell_env()) as invoke:
        invoke.timeout = TIMEOUT
        job = await invoke.created_job(1, attributes(str(program), ["x"], workdir=tmp_path))
        with trio.fail_after(TIMEOUT):
            await invoke.find_notify(lambda line: line.startswith(f"STATUS_NOTIFY {job} ACTIVE"))
        assert _listed(program.name) == ["r"]
        await invoke.send(f"JOB_DESTROY {job}\r\n".encode())
        assert await invoke.reply() == "S"
        with trio.fail_after(TIMEOUT):
            final = await invoke.final_status(job)
        assert (final.status, final.text) == (InvokeStatus.DONE, "destroyed")
        with trio.fail_after(TIMEOUT):
            while _listed(program.name):
                await trio.sleep(0.5)
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
