"""The simulated backend, run in-process in a job service (mostly on a virtual clock)."""

from __future__ import annotations

from collections import Counter
from typing import List

import pytest
import trio

from proxy_agent.frontends.ptp import mapping
from proxy_agent.protocol.attributes import A, AttributeRegistry, AttributeSet, AttrType
from proxy_agent.protocol.messages import AttrDef, ElementChange, ElementKind, ErrorCode, NewElements
from proxy_agent.protocol.wire import encode_frame
from proxy_agent.schedulers.sim import MAX_PROCS, QUEUE_NAMES, SimBackend, SimOptions
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, ServiceError, SubmitError
from proxy_agent.service.model import K, Kind, ServiceModel
from service_fixtures import BASE, Client, Mirror, start_backend


def make(seed: int = 1, nodes: int = 16, jobs: int = 0, churn: float = 0.0, time_scale: float = 1.0,
         process_share: float = 0.1, **kwargs) -> SimBackend:
    options = SimOptions(nodes=nodes, jobs=jobs, churn=churn, seed=seed, time_scale=time_scale,
                         process_share=process_share)
    return SimBackend(ServiceModel(), options, **kwargs)


def snapshot_bytes(sim: SimBackend) -> List[bytes]:
    return [encode_frame(event_id, 3, args) for event_id, args in Client(sim.model).snapshot_wire()]


def job_attrs(*pairs, sub_id: str = "sub-1") -> AttributeSet:
    return AttributeSet([(A.JOB_SUB_ID, sub_id), (A.EXEC_NAME, "app"), *pairs])


async def until(predicate, timeout: float = 60.0, step: float = 0.001) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(step)


# --------------------------------------------------------------------------- the initial model


def test_same_seed_same_cluster():
    first, second = make(seed=7, nodes=40, jobs=500), make(seed=7, nodes=40, jobs=500)
    first.populate()
    second.populate()
    assert snapshot_bytes(first) == snapshot_bytes(second)
    other = make(seed=8, nodes=40, jobs=500)
    other.populate()
    assert snapshot_bytes(other) != snapshot_bytes(first)


def test_counts_and_names():
    sim = make(nodes=120, jobs=2000)
    sim.populate()
    model = sim.model
    [machine] = model.keys(Kind.MACHINE)
    assert model.attrs(machine) == {K.NAME: "sim", K.STATE: "UP", K.NUM_NODES: "120", K.BACKEND: "sim"}
    nodes = model.keys(Kind.NODE)
    assert len(nodes) == 120
    assert [model.attr(n, K.NAME) for n in nodes[:3]] == ["n00000", "n00001", "n00002"]
    assert [model.attr(n, K.NUMBER) for n in nodes[-2:]] == ["118", "119"]
    assert all(model.get(n).parent == machine for n in nodes)
    assert {model.attr(n, K.STATE) for n in nodes} <= {"UP", "DOWN"}
    assert all(int(model.attr(n, K.CPUS)) > 0 for n in nodes)
    queues = {model.attr(q, K.NAME): q for q in model.keys(Kind.QUEUE)}
    assert sorted(queues) == sorted(QUEUE_NAMES)
    assert [model.attr(queues[name], K.DEFAULT) for name in QUEUE_NAMES] == ["true", "false", "false"]
    jobs = model.keys(Kind.JOB)
    assert len(jobs) == 2000
    states = Counter((model.attr(j, K.STATE), model.attr(j, K.NATIVE_STATE)) for j in jobs)
    for pair in [("QUEUING", "PD"), ("HOLD", "H"), ("RUNNING", "R"), ("SUSPENDED", "S"), ("FINISHED", "CD"),
                 ("FAILED", "F"), ("KILLED", "CA")]:
        assert states[pair] > 0, pair
    assert len(states) == 7
    assert {model.get(j).parent for j in jobs} == set(queues.values())
    for job in jobs:
        assert model.attr(job, K.QUEUE) == model.get(job).parent
    with_processes = [j for j in jobs if model.children(j)]
    assert 0 < len(with_processes) < len(jobs) / 4  # a share of the jobs list processes
    for job in with_processes:
        procs = model.processes(job)
        assert len(procs) == int(model.attr(job, K.NUM_PROCS))
        assert [model.get(p).rank for p in procs] == list(range(len(procs)))
        assert {model.attr(p, K.STATE) for p in procs} == {model.attr(job, K.STATE)}
    # what a client is sent: PTP's state derived, the service's in jobStatus, the code beside it
    mirror = Mirror().apply(Client(model).snapshot())
    shown = Counter((a.get("jobState"), a.get("jobStatus"), a.get("jobNativeState"))
                    for kind, _, a in mirror.elements.values() if kind is ElementKind.JOB)
    assert set(shown) == {("STARTING", "QUEUING", "PD"), ("STARTING", "HOLD", "H"), ("RUNNING", "RUNNING", "R"),
                          ("SUSPENDED", "SUSPENDED", "S"), ("COMPLETED", "FINISHED", "CD"),
                          ("COMPLETED", "FAILED", "F"), ("COMPLETED", "KILLED", "CA")}
    job = jobs[0]
    assert mirror.elements[str(BASE + job)][2]["queueId"] == str(BASE + model.get(job).parent)


def test_wide_node_numbers_and_no_processes():
    sim = make(nodes=100001, jobs=10, process_share=0.0)
    sim.populate()
    nodes = sim.model.keys(Kind.NODE)
    assert sim.model.attr(nodes[0], K.NAME) == "n000000"
    assert sim.model.count(Kind.PROCESS) == 0


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="time_scale"):
        make(time_scale=0)
    with pytest.raises(ValueError, match="process_share"):
        make(process_share=1.5)


async def test_attribute_definitions(nursery):
    sim = await start_backend(nursery, make())
    backend, queue = sim.service.default_queue()
    assert backend is sim.backend and queue == sim.backend.queue_ids["batch"]
    defs = mapping.attribute_definitions(sim.service.attributes(), sim.client.id(queue))
    registry = AttributeRegistry(defs)
    assert registry.get("hold").type is AttrType.BOOLEAN
    assert registry.get("suspend").type is AttrType.BOOLEAN
    assert registry.get(A.PROG_ARGS).type is AttrType.ARRAY
    assert registry.get(A.QUEUE_ID).default == str(BASE + sim.backend.queue_ids["batch"])
    procs = registry.get(A.JOB_NUM_PROCS)
    assert procs.maximum == str(MAX_PROCS) and procs.minimum == "1"
    AttrDef(1, defs).encode()


# --------------------------------------------------------------------------- submitted jobs


@pytest.fixture
async def sim(nursery):
    return await start_backend(nursery, make(nodes=8))


async def test_submitted_job_runs_to_completion(sim, autojump_clock):
    model, backend = sim.model, sim.backend
    job = await sim.submit_ptp(job_attrs((A.JOB_NUM_PROCS, "2"), (A.PROG_ARGS, "-v")))
    attrs = model.attrs(job)
    assert attrs[K.STATE] == "QUEUING" and attrs[K.NATIVE_STATE] == "PD"
    assert attrs[K.CLIENT_REF] == "sub-1" and attrs[K.NAME] == "app" and attrs[K.ARGUMENTS] == ("-v",)
    assert attrs[K.QUEUE] == backend.queue_ids["batch"] and model.get(job).parent == backend.queue_ids["batch"]
    sim.sync()
    shown = sim.ptp(job)
    assert shown[A.JOB_STATE] == "STARTING" and shown["jobStatus"] == "QUEUING"
    assert shown[A.JOB_SUB_ID] == "sub-1" and shown[A.QUEUE_ID] == sim.client.id(backend.queue_ids["batch"])
    procs = model.processes(job)
    assert len(procs) == 2
    await until(lambda: model.attr(job, K.STATE) == "RUNNING")
    assert {model.attr(p, K.STATE) for p in procs} == {"RUNNING"}
    assert all(model.attr(p, K.NODE) in backend.node_ids for p in procs)
    await until(lambda: model.attr(job, K.STATE) == "FINISHED")
    assert model.attr(job, K.NATIVE_STATE) == "CD"
    assert {model.attr(p, K.EXIT_CODE) for p in procs} == {"0"}
    sim.sync()
    assert [len(sim.output(p)) for p in procs] == [3, 3]
    assert sim.output(procs[1])[0] == "app rank 1: step 1 of 3"
    assert sim.ptp(procs[0])[A.PROCESS_NODE_ID] == sim.client.id(model.attr(procs[0], K.NODE))
    assert sim.ptp(job)[A.JOB_STATE] == "COMPLETED"
    # ended jobs are removed after the retention period
    shown_as = sim.client.id(job)
    await until(lambda: job not in model, step=0.5)
    sim.sync()
    assert shown_as not in sim.mirror.elements and f"{shown_as}:0" not in sim.mirror.elements


async def test_time_scale(nursery, autojump_clock):
    sim = await start_backend(nursery, make(time_scale=0.01))
    start = trio.current_time()
    job = await sim.submit_ptp(job_attrs())
    await until(lambda: sim.ended(job))
    assert trio.current_time() - start < 0.03


async def test_same_seed_same_submissions(autojump_clock):
    async def run_once():
        timeline = []
        async with trio.open_nursery() as nursery:
            sim = await start_backend(nursery, make(seed=3))
            start = trio.current_time()
            job = await sim.submit_ptp(job_attrs())
            for state in ("RUNNING", "FINISHED"):
                await until(lambda: sim.state(job) == state)
                timeline.append(round(trio.current_time() - start, 3))
            nursery.cancel_scope.cancel()
        return timeline

    first, second = await run_once(), await run_once()
    assert first[0] >= 0.2 and first[1] >= first[0] + 1.0
    # equal up to the 1 ms polling of until()
    assert all(abs(a - b) <= 0.003 for a, b in zip(first, second))


@pytest.mark.parametrize(
    "pairs, message, kind, code",
    [
        ([(A.EXEC_NAME, "app")], "jobSubId", ErrorKind.BAD_REQUEST, ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s")], "no executable given", ErrorKind.BAD_REQUEST, ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "x")], "whole number", ErrorKind.BAD_REQUEST,
         ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "0")], "between 1 and", ErrorKind.BAD_REQUEST,
         ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "99999")], "1 to 4096 processes",
         ErrorKind.BAD_REQUEST, ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.QUEUE_ID, "nope")], "no queue named 'nope'",
         ErrorKind.NO_SUCH_QUEUE, ErrorCode.NO_SUCH_QUEUE),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.QUEUE_ID, "999999")], "no queue with id",
         ErrorKind.NO_SUCH_QUEUE, ErrorCode.NO_SUCH_QUEUE),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.QUEUE_ID, "local:batch")], "no scheduler named 'local'",
         ErrorKind.NO_SUCH_QUEUE, ErrorCode.NO_SUCH_QUEUE),
    ],
)
async def test_bad_submissions(sim, pairs, message, kind, code, autojump_clock):
    with pytest.raises(ServiceError, match=message) as info:
        await sim.submit_ptp(AttributeSet(pairs))
    assert info.value.kind is kind
    assert mapping.error_code(info.value.kind) == code
    assert sim.model.count(Kind.JOB) == 0


async def test_the_backend_checks_what_it_is_given(sim, autojump_clock):
    with pytest.raises(SubmitError, match="not running") as info:
        await make().submit(JobSpec("app"), 1)
    assert info.value.kind is ErrorKind.UNAVAILABLE
    [machine] = sim.model.keys(Kind.MACHINE)
    with pytest.raises(SubmitError, match="not a queue") as info:
        await sim.backend.submit(JobSpec("app"), machine)
    assert info.value.kind is ErrorKind.NO_SUCH_QUEUE
    with pytest.raises(SubmitError, match="no executable") as info:
        await sim.backend.submit(JobSpec(""), sim.backend.queue_ids["batch"])
    assert info.value.kind is ErrorKind.BAD_REQUEST
    with pytest.raises(JobError, match="no such job") as info:
        await sim.backend.terminate(machine)
    assert info.value.kind is ErrorKind.NO_SUCH_JOB
    assert sim.model.count(Kind.JOB) == 0


async def test_submit_to_a_named_queue(sim, autojump_clock):
    backend = sim.backend
    job = await sim.submit_ptp(job_attrs((A.QUEUE_ID, "debug")))
    assert sim.model.get(job).parent == backend.queue_ids["debug"]
    job = await sim.submit_ptp(job_attrs((A.QUEUE_ID, sim.client.id(backend.queue_ids["long"]))))
    assert sim.model.get(job).parent == backend.queue_ids["long"]
    job = await sim.submit_ptp(job_attrs((A.QUEUE_ID, "sim:long")))
    assert sim.model.get(job).parent == backend.queue_ids["long"]
    job = await sim.submit_ptp(job_attrs(("hold", "true")))
    assert sim.model.get(job).parent == backend.queue_ids["batch"]
    assert sim.state(job) == "HOLD" and sim.native(job) == "H"


async def test_terminate(sim, autojump_clock):
    model = sim.model
    pending = await sim.submit_ptp(job_attrs())
    await sim.service.terminate(pending)
    assert sim.state(pending) == "KILLED" and sim.native(pending) == "CA"
    (never_ran,) = model.processes(pending)
    assert model.attr(never_ran, K.SIGNAL) is None and sim.state(never_ran) == "KILLED"
    running = await sim.submit_ptp(job_attrs(sub_id="2"))
    await until(lambda: sim.state(running) == "RUNNING")
    await sim.service.terminate(running)
    assert sim.state(running) == "KILLED"
    [proc] = model.processes(running)
    assert model.attr(proc, K.SIGNAL) == "SIGTERM"
    with pytest.raises(JobError, match="already ended") as info:
        await sim.service.terminate(running)
    assert info.value.kind is ErrorKind.OPERATION_FAILED
    await trio.sleep(5)  # stale timers of the terminated jobs change nothing
    assert sim.state(running) == "KILLED"
    sim.sync()
    assert sim.ptp(running)[A.JOB_STATE] == "COMPLETED" and sim.ptp(running)["jobStatus"] == "KILLED"
    assert sim.ptp(proc)[A.PROCESS_SIGNAL_NAME] == "SIGTERM"


async def test_hold_and_release(sim, autojump_clock):
    job = await sim.submit_ptp(job_attrs())
    await sim.change_ptp(job, AttributeSet([("hold", "true")]))
    assert sim.state(job) == "HOLD" and sim.native(job) == "H"
    await trio.sleep(5)
    assert sim.state(job) == "HOLD"
    sim.sync()
    assert sim.ptp(job)[A.JOB_STATE] == "STARTING" and sim.ptp(job)["jobStatus"] == "HOLD"
    await sim.change_ptp(job, AttributeSet([("hold", "false")]))
    assert sim.state(job) == "QUEUING"
    await until(lambda: sim.state(job) == "FINISHED")
    with pytest.raises(JobError, match="not started") as info:
        await sim.change_ptp(job, AttributeSet([("hold", "true")]))
    assert info.value.kind is ErrorKind.OPERATION_FAILED


async def test_suspend_and_resume(sim, autojump_clock):
    model = sim.model
    job = await sim.submit_ptp(job_attrs())
    with pytest.raises(JobError, match="only a running job") as info:
        await sim.change_ptp(job, AttributeSet([("suspend", "true")]))
    assert info.value.kind is ErrorKind.OPERATION_FAILED
    await until(lambda: sim.state(job) == "RUNNING")
    await sim.change_ptp(job, AttributeSet([(A.JOB_STATE, "SUSPENDED")]))
    [proc] = model.processes(job)
    assert sim.state(proc) == "SUSPENDED" and sim.native(job) == "S"
    await trio.sleep(10)
    assert sim.state(job) == "SUSPENDED"
    await sim.change_ptp(job, AttributeSet([("suspend", "false")]))
    assert sim.state(proc) == "RUNNING"
    await sim.service.suspend(job, False)  # resuming a running job changes nothing
    assert sim.state(job) == "RUNNING"
    pending = await sim.submit_ptp(job_attrs(sub_id="p"))
    with pytest.raises(JobError, match="only a suspended job"):
        await sim.service.suspend(pending, False)
    await until(lambda: sim.state(job) == "FINISHED")


async def test_unsupported_change(sim, autojump_clock):
    job = await sim.submit_ptp(job_attrs())
    with pytest.raises(JobError, match="cannot change name") as info:
        await sim.change_ptp(job, AttributeSet([("name", "x")]))
    assert info.value.kind is ErrorKind.NOT_SUPPORTED
    assert mapping.error_code(info.value.kind) == ErrorCode.NOT_SUPPORTED


async def test_move(sim, autojump_clock):
    model, backend = sim.model, sim.backend
    job = await sim.submit_ptp(job_attrs())
    sim.sync()
    await sim.service.move(job, backend.queue_ids["long"])
    assert model.attr(job, K.QUEUE) == backend.queue_ids["long"]
    assert model.get(job).parent == backend.queue_ids["long"]
    assert job in model.children(backend.queue_ids["long"])
    assert job not in model.children(backend.queue_ids["batch"])
    # the client sees the job removed and created again under its new queue, same id
    events = sim.sync()
    assert [type(e).__name__ for e in events if getattr(e, "kind", None) is ElementKind.JOB] == [
        "RemoveElements", "NewElements"]
    [new_job] = [e for e in events if isinstance(e, NewElements) and e.kind is ElementKind.JOB]
    assert new_job.parent_id == sim.client.id(backend.queue_ids["long"])
    assert [i for g in new_job.groups for i in g.id_list()] == [sim.client.id(job)]
    assert sim.ptp(job)[A.QUEUE_ID] == sim.client.id(backend.queue_ids["long"])
    await sim.service.move(job, "debug")  # by name
    assert model.get(job).parent == backend.queue_ids["debug"]
    with pytest.raises(ServiceError) as info:
        await sim.service.move(job, job)  # a job is no queue
    assert info.value.kind is ErrorKind.NO_SUCH_QUEUE
    with pytest.raises(JobError) as info:
        await backend.move(job, job)
    assert info.value.kind is ErrorKind.NO_SUCH_QUEUE
    await until(lambda: sim.state(job) == "RUNNING")
    with pytest.raises(JobError, match="not started") as info:
        await sim.service.move(job, backend.queue_ids["batch"])
    assert info.value.kind is ErrorKind.OPERATION_FAILED
    assert model.get(job).parent == backend.queue_ids["debug"]


async def test_existing_jobs_can_be_controlled(nursery, autojump_clock):
    sim = await start_backend(nursery, make(jobs=300))
    model = sim.model
    by_native = {}
    for job in model.keys(Kind.JOB):
        by_native.setdefault(sim.native(job), job)
    await sim.change_ptp(by_native["H"], AttributeSet([("hold", "false")]))
    assert sim.state(by_native["H"]) == "QUEUING"
    await sim.change_ptp(by_native["R"], AttributeSet([("suspend", "true")]))
    assert sim.state(by_native["R"]) == "SUSPENDED"
    await sim.service.terminate(by_native["PD"])
    assert sim.state(by_native["PD"]) == "KILLED"
    with pytest.raises(JobError, match="already ended"):
        await sim.service.terminate(by_native["CD"])
    await sim.service.move(by_native["H"], "long")
    assert model.get(by_native["H"]).parent == sim.backend.queue_ids["long"]


# --------------------------------------------------------------------------- churn


async def test_churn_changes_nodes_and_jobs_and_stays_bounded(nursery, autojump_clock):
    sim = await start_backend(nursery, make(nodes=50, jobs=200, churn=500.0, retention=2.0))
    model = sim.model
    await trio.sleep(1.0)
    kinds = Counter()
    for event in sim.sync():
        if isinstance(event, ElementChange):
            kinds[event.kind] += sum(len(group.ids) for group in event.groups)
    assert kinds[ElementKind.NODE] > 0
    assert kinds[ElementKind.JOB] > 0
    # active jobs are replaced as they end; ended ones stay for the retention period
    bound = 200 + 500 * 2.0
    for _ in range(20):
        await trio.sleep(1.0)
        sim.sync()
        assert 200 <= model.count(Kind.JOB) <= bound
    assert len(sim.mirror.elements) == len(model)


async def test_without_churn_the_cluster_stays_put(nursery, autojump_clock):
    sim = await start_backend(nursery, make(nodes=20, jobs=100))
    await trio.sleep(120)
    assert sim.client.drain() == []
