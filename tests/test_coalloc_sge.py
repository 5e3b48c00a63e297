"""A multi-part job across the local scheduler, SLURM and Grid Engine, two processes each.

Nothing in the co-allocation knows Grid Engine: these tests run as soon as the agent has a
Grid Engine backend (``sge`` among ``--scheduler``'s choices) and a cell answers.  Grid
Engine starts a part's program once for all its slots, so the Grid Engine part's program is
a small shell launcher that starts its two processes with ``PROXY_AGENT_RANK`` set.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from agent_fixtures import ROOT, agent_argv, subprocess_env
from wait_support import scaled, wait_until
from proxy_agent.client import AgentClient
from proxy_agent.schedulers.registry import BACKENDS

if "sge" not in BACKENDS:
    pytest.skip("the agent has no Grid Engine backend yet", allow_module_level=True)

from sge_support import require_cell  # noqa: E402
from slurm_support import require_cluster  # noqa: E402
from test_coalloc_agent import MESH, WAITER, _lines, _parts, _script, _start, _state  # noqa: E402

pytestmark = [pytest.mark.sge, pytest.mark.slurm]

require_cluster()
require_cell()

AGENT = ("--scheduler", "local,slurm,sge", "--slurm-poll-interval", "1")
ENVIRONMENT = {"PYTHONPATH": str(ROOT)}


def _parts_across(script: str, sge_launcher: str) -> list:
    python = {"executable": sys.executable, "arguments": [script], "environment": ENVIRONMENT}
    return [
        {"queue": "local:default", "count": 2, "label": "local", **python},
        {"queue": "slurm:debug", "count": 2, "label": "slurm", "max_wall_time": 5, **python},
        {"queue": "sge:all.q", "count": 2, "label": "sge", "executable": "/bin/sh", "arguments": [sge_launcher],
         "environment": ENVIRONMENT},
    ]


def _launcher(tmp_path, script: str) -> str:
    return _script(tmp_path, "launch.sh", "\n".join([
        "#!/bin/sh",
        f"PROXY_AGENT_RANK=0 '{sys.executable}' '{script}' &",
        f"PROXY_AGENT_RANK=1 '{sys.executable}' '{script}' &",
        "wait",
        "",
    ]))


def _still_queued(client: AgentClient, parts) -> list:
    """Native ids of the batch parts their schedulers still list as waiting or running."""
    alive = []
    for part in parts:
        native = part.get("nativeId")
        backend = client.element(part.get("queueId")).get("backend")
        if not native or backend == "local":
            continue
        if backend == "slurm":
            shown = subprocess.run(["squeue", "-h", "-j", native], capture_output=True, text=True,
                                   env=subprocess_env(), timeout=scaled(30)).stdout
        else:
            shown = subprocess.run(["qstat", "-j", native], capture_output=True, text=True, env=subprocess_env(),
                                   timeout=scaled(30))
            shown = shown.stdout if shown.returncode == 0 else ""
        if shown.strip():
            alive.append(native)
    return alive


def _cancel(client: AgentClient, parts) -> None:
    for part in parts:
        native = part.get("nativeId")
        backend = client.element(part.get("queueId")).get("backend")
        if native and backend in ("slurm", "sge"):
            command = ["scancel", native] if backend == "slurm" else ["qdel", native]
            subprocess.run(command, capture_output=True, env=subprocess_env(), timeout=scaled(30))


async def test_three_parts_on_three_schedulers_pass_the_barrier_and_connect_to_each_other(tmp_path):
    mesh = _script(tmp_path, "mesh.py", MESH)
    description = json.dumps({"name": "pa-h14-three", "parts": _parts_across(mesh, _launcher(tmp_path, mesh))})
    with trio.fail_after(scaled(240)):
        async with await AgentClient.spawn(agent_argv(*AGENT), env=subprocess_env()) as client:
            await _start(client)
            await client.wait_for(lambda: {"debug", "all.q"} <= {q.name for q in client.queues.values()}, scaled(60),
                                  description="the SLURM partitions and Grid Engine queues")
            job_id = await client.cosubmit(description)
            parts = await _parts(client, job_id, 3)
            try:
                await _state(client, job_id, "FINISHED", scaled(200))
                lines = await _lines(client, parts, "SEEN", 6)
                assert len(lines) == 6, [client.job_output(p) for p in parts]
                assert len({line.split()[2] for line in lines}) == 1
                everyone = lines[0].split()[2].split("|")
                assert sorted(item.split("@")[0] for item in everyone) == ["0:0", "0:1", "1:0", "1:1", "2:0", "2:1"]
                assert all(line.endswith("connected 5") for line in lines), lines
            finally:
                _cancel(client, parts)


async def test_a_part_failing_before_the_barrier_leaves_nothing_in_any_scheduler(tmp_path):
    waiter = _script(tmp_path, "waiter.py", WAITER)
    fail = tmp_path / "fail"  # the local part fails once the test has seen the others in their schedulers
    description = json.dumps({"name": "pa-h14-gone", "parts": _parts_across(waiter, _launcher(tmp_path, waiter))[1:] + [
        {"queue": "local:default", "executable": "/bin/sh", "label": "fails",
         "arguments": ["-c", f"while [ ! -e '{fail}' ]; do sleep 0.1; done; exit 1"]}]})
    with trio.fail_after(scaled(120)):
        async with await AgentClient.spawn(agent_argv(*AGENT), env=subprocess_env()) as client:
            await _start(client)
            await client.wait_for(lambda: {"debug", "all.q"} <= {q.name for q in client.queues.values()}, scaled(60),
                                  description="the SLURM partitions and Grid Engine queues")
            job_id = await client.cosubmit(description)
            parts = await _parts(client, job_id, 3)
            try:
                await wait_until(lambda: len(_still_queued(client, parts)) == 2, 60, interval=0.5,
                                 what="the SLURM and Grid Engine parts in their schedulers")
                fail.touch()
                await _state(client, job_id, "FAILED", scaled(60))
                assert "('fails')" in client.job(job_id).get("jobStatusMessage", "")
                await wait_until(lambda: not _still_queued(client, parts), 60, interval=0.5,
                                 what="the parts to leave their schedulers after the failure")
            finally:
                _cancel(client, parts)


async def test_a_part_waiting_when_an_earlier_part_is_deleted_starts_with_its_new_index(tmp_path):
    """The indexes renumber when a part is deleted before the release: a part whose job was
    still waiting in its queue then starts with the index the barrier gives it, in
    ``GLOBUS_GRAM_SUBJOB_RANK`` and ``PROXY_AGENT_PART_INDEX``."""
    from test_sge_queue_truth import throwaway_queues

    show = "echo index $GLOBUS_GRAM_SUBJOB_RANK $PROXY_AGENT_PART_INDEX of $PROXY_AGENT_PARTS"
    native_ids: list = []
    with throwaway_queues(tmp_path, native_ids, w={"slots": "2"}) as (queue,):
        sge_support_run(["qmod", "-d", queue])  # its jobs wait until it is enabled
        # (barrier parts whose processes never check in: the barrier stays closed, and parts
        # can be deleted, for the whole test)
        part = {"count": 1, "executable": "/bin/sh", "arguments": ["-c", show], "start_type": "loose-barrier",
                "environment": ENVIRONMENT}
        description = json.dumps({"name": "pa-renumber", "parts": [
            {"queue": "local:default", "label": "first", **part},
            {"queue": f"sge:{queue}", "label": "deleted", **part},
            {"queue": f"sge:{queue}", "label": "last", **part}]})
        with trio.fail_after(scaled(150)):
            async with await AgentClient.spawn(agent_argv("--scheduler", "local,sge", "--sge-poll-interval", "1"),
                                               env=subprocess_env(HOME=str(tmp_path)), cwd=str(tmp_path)) as client:
                await _start(client)
                await client.wait_for(lambda: any(q.name == queue for q in client.queues.values()), scaled(30),
                                      description="the queue")
                job_id = await client.cosubmit(description)
                first, deleted, last = await _parts(client, job_id, 3)
                native_ids += [client.job(p).get("nativeId") for p in (deleted, last)]
                await client.delete_part(deleted)
                sge_support_run(["qmod", "-e", queue])
                await client.wait_job_state(last, "COMPLETED", timeout=scaled(90))
                (line,) = await _lines(client, [last], "index", 1)
                assert line == "index 1 1 of 3", (client.job_output(last), client.job_output(last, "stderr"))
                (line,) = await _lines(client, [first], "index", 1)
                assert line == "index 0 0 of 3"
                await client.quit()


def sge_support_run(argv):
    import sge_support
    result = sge_support.run(argv)
    assert result.returncode == 0, result.stderr
