"""The job service: its layering, routing over several backends, and life beyond connections."""

from __future__ import annotations

import ast
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from agent_fixtures import agent_argv, stored_jobs, subprocess_env
from wait_support import scaled, wait_until
from proxy_agent.client import AgentClient
from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.schedulers.sim import SimBackend, SimOptions
from proxy_agent.service.jobs import ErrorKind, JobSpec, JobState, ServiceError
from proxy_agent.service.model import BACKLOG_LIMIT, K, Kind
from proxy_agent.service.service import JobService

ROOT = Path(__file__).resolve().parent.parent / "proxy_agent"


# --------------------------------------------------------------------------- layering


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module or ""


@pytest.mark.parametrize("layer", ["service", "schedulers"])
def test_service_and_backends_know_no_protocol_and_no_front_end(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name in _imports(path):
            if name.startswith(("proxy_agent.protocol", "proxy_agent.frontends", "proxy_agent.client",
                                "proxy_agent.console", "proxy_agent.server")):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_the_import_check_sees_relative_imports():
    # the check above must catch the form the code base uses
    names = list(_imports(ROOT / "frontends" / "ptp" / "session.py"))
    assert "proxy_agent.protocol.messages" in names and "proxy_agent.service.service" in names


# --------------------------------------------------------------------------- routing, in process


async def _service(*backends):
    service = JobService()
    for cls, options in backends:
        service.add_backend(cls(service.model, options, service.context()))
    return service


async def test_submissions_go_to_the_backend_that_owns_the_queue(nursery):
    service = await _service((LocalBackend, None), (SimBackend, SimOptions(time_scale=0.01)))
    await nursery.start(service.run)
    await service.ready.wait()
    model = service.model
    machines = {model.attr(k, K.BACKEND): k for k in model.keys(Kind.MACHINE)}
    assert set(machines) == {"local", "sim"}
    # no queue named: the first backend's default queue
    key = await service.submit(JobSpec("/bin/true"))
    assert model.owner(key) == "local"
    # a sim queue by name, and by BACKEND:NAME
    key = await service.submit(JobSpec("/bin/true", queue="debug"))
    assert model.owner(key) == "sim" and model.attr(model.get(key).parent, K.NAME) == "debug"
    key = await service.submit(JobSpec("/bin/true", queue="sim:long"))
    assert model.attr(model.get(key).parent, K.NAME) == "long"
    # by key
    local_queue = next(k for k in model.keys(Kind.QUEUE) if model.owner(k) == "local")
    key = await service.submit(JobSpec("/bin/true", queue=local_queue))
    assert model.owner(key) == "local"
    with pytest.raises(ServiceError) as failure:
        await service.submit(JobSpec("/bin/true", queue="nosuch"))
    assert failure.value.kind is ErrorKind.NO_SUCH_QUEUE and "local:default" in failure.value.message
    with pytest.raises(ServiceError) as failure:
        await service.submit(JobSpec("/bin/true", queue="slurm:debug"))
    assert failure.value.kind is ErrorKind.NO_SUCH_QUEUE
    # a job cannot move to another backend's queue
    with pytest.raises(ServiceError) as failure:
        await service.move(key, "sim:batch")
    assert "another scheduler" in failure.value.message
    with trio.fail_after(scaled(30)):
        while not all(JobState(model.attr(j, K.STATE)).final for j in model.keys(Kind.JOB)):
            await trio.sleep(0.02)


# --------------------------------------------------------------------------- end to end


async def _start(client, base_id=1000):
    await client.init(base_id)
    await client.model_def()
    await client.start_events()


async def test_local_and_sim_in_one_agent():
    argv = agent_argv("--scheduler", "local,sim", "--sim-nodes", "4", "--sim-time-scale", "0.02")
    async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
        await _start(client)
        names = sorted(m.name for m in client.machines.values())
        assert len(names) == 2 and "sim" in names
        assert sorted(q.name for q in client.queues.values()) == ["batch", "debug", "default", "long"]
        local = await client.submit("/bin/echo", ["from local"])
        sim = await client.submit("/bin/true", queue="sim:debug")
        done_local = await client.wait_job_state(local, "COMPLETED", timeout=scaled(30))
        done_sim = await client.wait_job_state(sim, "COMPLETED", timeout=scaled(30))
        assert client.job_output(local).strip() == "from local"
        assert client.element(done_local.parent).name == "default"
        assert client.element(done_sim.parent).name == "debug"
        assert done_sim.get("jobNativeState") == "CD" and done_local.get("jobNativeState") == "EXITED"
        assert done_sim.get("jobStatus") == done_local.get("jobStatus") == "FINISHED"
        await client.quit()
        assert client.violations == []


def test_unknown_and_repeated_schedulers_are_refused_in_one_line():
    for value, needle in (("local,lsf", "unknown scheduler 'lsf'"), ("sim,sim", "given twice"), ("local,", "empty")):
        run = subprocess.run(agent_argv("--scheduler", value), capture_output=True, text=True, env=subprocess_env(),
                             stdin=subprocess.DEVNULL, timeout=scaled(30))
        assert run.returncode == 2, run.stderr
        assert needle in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    run = subprocess.run(agent_argv("--help"), capture_output=True, text=True, env=subprocess_env(), timeout=scaled(30))
    assert run.returncode == 0
    assert "--sim-nodes" in run.stdout and "--slurm-poll-interval" in run.stdout
    assert "--sge-poll-interval" in run.stdout and "--pbs-poll-interval" in run.stdout


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _listening(*args, env=None):
    process = await trio.lowlevel.open_process(
        agent_argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env or subprocess_env(),
    )
    banner = b""
    with trio.fail_after(scaled(30)):
        while b"listening on" not in banner:
            data = await process.stderr.receive_some(4096)
            assert data, banner
            banner += data
    return process


async def test_memory_does_not_grow_from_session_to_session(tmp_path):
    path = str(tmp_path / "agent.sock")
    process = await _listening("--unix", path, "--scheduler", "sim", "--sim-jobs", "50000", "--sim-nodes", "1000")
    try:
        sizes = []
        for round_ in range(6):
            async with await AgentClient.connect_unix(path) as client:
                await _start(client, base_id=1000 + round_)
                await client.wait_for(lambda: len(client.jobs) == 50000, timeout=scaled(60))
                await client.quit()
            if sizes:  # what a session took is given back once it has ended
                await wait_until(lambda: _rss_kb(process.pid) <= sizes[0] * 1.15,
                                 what=f"the agent's memory after session {round_} back within 15 % of {sizes}")
            sizes.append(_rss_kb(process.pid))
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(scaled(30)):
            await process.wait()


async def test_a_client_leaving_in_the_middle_of_the_initial_model_ends_only_its_session(tmp_path):
    path = str(tmp_path / "agent.sock")
    process = await _listening("--unix", path, "--scheduler", "sim", "--sim-jobs", "100000", "--sim-nodes", "2000")
    try:
        for _ in range(3):
            stream = await trio.open_unix_socket(path)
            from proxy_agent.protocol.wire import encode_frame

            await stream.send_all(encode_frame(1, 1, ["version=2.0", "baseId=1000"]) + encode_frame(2, 2, [])
                                  + encode_frame(3, 3, []))
            received = 0
            while received < 300_000:  # well into the model, far from its end
                data = await stream.receive_some(65536)
                assert data
                received += len(data)
            await stream.aclose()
        assert process.returncode is None
        async with await AgentClient.connect_unix(path) as client:  # (the agent serves on)
            await _start(client)
            await client.wait_for(lambda: len(client.jobs) == 100000, timeout=scaled(60))
            await client.quit()
            assert client.violations == []
        stderr = b""
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(scaled(30)):
            await process.wait()
        with trio.fail_after(scaled(30)):
            while True:
                data = await process.stderr.receive_some(65536)
                if not data:
                    break
                stderr += data
        assert b"Traceback" not in stderr
        assert process.returncode == 0
    finally:
        if process.returncode is None:
            process.kill()


async def test_output_written_while_nobody_listens_is_bounded_and_the_loss_is_told(tmp_path):
    path = str(tmp_path / "agent.sock")
    env = subprocess_env()
    process = await _listening("--unix", path, env=env)
    marker = tmp_path / "go"
    try:
        async with await AgentClient.connect_unix(path) as client:
            await _start(client)
            # 30,000 lines of 100 bytes (3 MB) once the client has gone
            script = (f"while [ ! -e {marker} ]; do sleep 0.05; done; "
                      "i=0; while [ $i -lt 30000 ]; do printf '%099d\\n' $i; i=$((i+1)); done")
            job = await client.submit("/bin/sh", ["-c", script])
            await client.wait_job_state(job, "RUNNING", timeout=scaled(30))
            sub_id = client.job(job).get("jobSubId")
        marker.touch()
        await wait_until(lambda: any(j["client_ref"] == sub_id and j["ended"] for j in stored_jobs(env)), 60,
                         interval=0.5, what="the job to print and end while no client is there")
        async with await AgentClient.connect_unix(path) as client:
            await _start(client)
            (job,) = [j for j in client.jobs.values() if j.get("jobSubId") == sub_id]
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            # it ended before the client came: its output follows the NEW_JOB that says so
            await client.wait_for(lambda: client.job_output(job).endswith(f"{29999:099d}\n")
                                  and "dropped" in client.job_output(job, "stderr"), timeout=scaled(30))
            out = client.job_output(job).splitlines()
            err = client.job_output(job, "stderr")
            # the newest lines are there, in order, and the oldest went with a count
            assert out[-1] == f"{29999:099d}"
            assert out == [f"{i:099d}" for i in range(30000 - len(out), 30000)]
            # bounded by the backlog's size (whole blocks of lines go first, so how much of the
            # bound is in use depends on how the lines were read: on a busy machine, in bigger blocks)
            assert 0 < len(out) < 30000 and len(out) * 100 <= BACKLOG_LIMIT
            assert f"{30000 - len(out)} earlier lines of output were dropped (no client had events started)" in err
            await client.quit()
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(scaled(30)):
            await process.wait()


def test_architecture_document_names_the_layers():
    text = (ROOT.parent / "docs" / "architecture.md").read_text().lower()
    for needle in ("service", "frontends", "schedulers", "batch", "co-allocation", "store"):
        assert needle in text

