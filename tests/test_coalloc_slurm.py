"""Multi-part jobs across the local scheduler and a real SLURM cluster: the SLURM part's
processes (started by srun) reach the agent's runtime over TCP, pass the barrier with the
local part's and find them through the rendezvous; a local part that fails before the
barrier makes the agent cancel the SLURM part in SLURM."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from agent_fixtures import ROOT, agent_argv, subprocess_env
from slurm_support import require_cluster
from wait_support import scaled, wait_until
from test_coalloc_agent import MESH, WAITER, _lines, _parts, _script, _start, _state

from proxy_agent.client import AgentClient

pytestmark = pytest.mark.slurm

require_cluster()

AGENT = ("--scheduler", "local,slurm", "--slurm-poll-interval", "1")


def _part(queue: str, script: str, count: int, label: str, **more) -> dict:
    return {"queue": queue, "count": count, "label": label, "executable": sys.executable, "arguments": [script],
            "environment": {"PYTHONPATH": str(ROOT)}, **more}


def _in_slurm(native_ids) -> list:
    """Those of the jobs SLURM still lists as pending or running."""
    shown = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(native_ids)], capture_output=True,
                           text=True, env=subprocess_env(), timeout=scaled(30))
    return [line for line in shown.stdout.splitlines() if line.split()[-1] in ("PENDING", "RUNNING", "CONFIGURING")]


def _cancel(native_ids) -> None:
    for native in filter(None, native_ids):
        subprocess.run(["scancel", native], capture_output=True, env=subprocess_env(), timeout=scaled(30))


async def test_a_local_and_a_slurm_part_pass_the_barrier_and_find_each_other(tmp_path):
    mesh = _script(tmp_path, "mesh.py", MESH)
    description = json.dumps({"name": "pa-h14-mesh", "parts": [
        _part("local:default", mesh, 2, "here"), _part("slurm:debug", mesh, 2, "there", max_wall_time=5)]})
    native_ids = []
    try:
        with trio.fail_after(scaled(200)):
            async with await AgentClient.spawn(agent_argv(*AGENT), env=subprocess_env()) as client:
                await _start(client)
                await client.wait_for(lambda: "debug" in {q.name for q in client.queues.values()}, scaled(30),
                                      description="the SLURM partitions")
                job_id = await client.cosubmit(description)
                here, there = await _parts(client, job_id, 2)
                native_ids.append(there.get("nativeId"))
                assert client.element(there.get("queueId")).get("backend") == "slurm"
                assert there.get("coallocJob") == job_id
                # the cluster may be busy with others' jobs: the tests' reservation makes room
                await client.wait_for(lambda: there.get("jobStatus") not in (None, "QUEUING"), scaled(120),
                                      description=f"SLURM to start the part ({there.get('jobStatusMessage')})")
                await _state(client, job_id, "FINISHED", scaled(60))
                lines = await _lines(client, [here, there], "SEEN", 4)
                assert len(lines) == 4, [client.job_output(p) for p in (here, there)]
                assert len({line.split()[2] for line in lines}) == 1
                everyone = lines[0].split()[2].split("|")
                assert sorted(item.split("@")[0] for item in everyone) == ["0:0", "0:1", "1:0", "1:1"]
                assert all(line.endswith("connected 3") for line in lines), lines
                # the local part reached the agent by its Unix socket, the SLURM part by TCP
                assert {line.split()[1][:6] for line in await _lines(client, [here], "HANDLES", 2)} == {"unix:/"}
                assert {line.split()[1][:6] for line in await _lines(client, [there], "HANDLES", 2)} == {"tcp://"}
    finally:
        _cancel(native_ids)


async def test_a_failing_local_part_gets_the_slurm_part_cancelled_in_slurm(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    fail = tmp_path / "fail"  # the local part fails once the test has seen the SLURM part in SLURM
    description = json.dumps({"name": "pa-h14-fail", "parts": [
        _part("slurm:debug", waiter, 1, "waits"),
        {"queue": "local:default", "executable": "/bin/sh", "label": "fails",
         "arguments": ["-c", f"while [ ! -e '{fail}' ]; do sleep 0.1; done; exit 3"]}]})
    native_ids = []
    try:
        with trio.fail_after(scaled(150)):
            async with await AgentClient.spawn(agent_argv(*AGENT), env=subprocess_env()) as client:
                await _start(client)
                await client.wait_for(lambda: "debug" in {q.name for q in client.queues.values()}, scaled(30),
                                      description="the SLURM partitions")
                job_id = await client.cosubmit(description)
                waits, fails = await _parts(client, job_id, 2)
                native_ids.append(waits.get("nativeId"))
                assert native_ids[0] and _in_slurm(native_ids), "the SLURM part is in SLURM"
                fail.touch()
                await _state(client, job_id, "FAILED", scaled(30))
                assert "part 1 ('fails')" in client.job(job_id).get("jobStatusMessage", "")
                await wait_until(lambda: not _in_slurm(native_ids), 60, interval=0.5,
                                 what="the SLURM part to leave SLURM after the failure")
                assert "PASSED" not in client.job_output(waits)
                await client.wait_for(lambda: waits.get("jobState") == "COMPLETED", scaled(30),
                                      description="the agent to see the SLURM part end")
    finally:
        _cancel(native_ids)
