"""The simulated scheduler, run in-process against a Model (mostly on a virtual clock)."""

from __future__ import annotations

from collections import Counter
from typing import List

import pytest
import trio

from proxy_agent.model import Model
from proxy_agent.protocol.attributes import A, AttributeRegistry, AttributeSet, AttrType
from proxy_agent.protocol.ids import IdAllocator
from proxy_agent.protocol.messages import AttrDef, ElementChange, ElementKind, ErrorCode, NewElements, ProcessChange
from proxy_agent.schedulers.base import JobError, SchedulerOptions, SubmitError
from proxy_agent.schedulers.sim import QUEUE_NAMES, SimScheduler


def make(seed: int = 1, nodes: int = 16, jobs: int = 0, churn: float = 0.0, **kwargs) -> SimScheduler:
    options = SchedulerOptions(sim_nodes=nodes, sim_jobs=jobs, sim_churn=churn, sim_seed=seed)
    return SimScheduler(Model(IdAllocator(base_id=100)), options, **kwargs)


def snapshot_bytes(scheduler: SimScheduler) -> List[bytes]:
    return [event.encode() for event in scheduler.model.snapshot(3)]


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
    [machine] = model.ids(ElementKind.MACHINE)
    assert model.attrs(machine) == {"name": "sim", "machineState": "UP", "numNodes": "120"}
    nodes = model.ids(ElementKind.NODE)
    assert len(nodes) == 120
    assert [model.attr(n, A.NAME) for n in nodes[:3]] == ["n00000", "n00001", "n00002"]
    assert [model.attr(n, A.NODE_NUMBER) for n in nodes[-2:]] == ["118", "119"]
    assert all(model.get(n).parent == machine for n in nodes)
    assert {model.attr(n, A.NODE_STATE) for n in nodes} <= {"UP", "DOWN"}
    assert all(int(model.attr(n, "cpus")) > 0 for n in nodes)
    queues = {model.attr(q, A.NAME): q for q in model.ids(ElementKind.QUEUE)}
    assert sorted(queues) == sorted(QUEUE_NAMES)
    jobs = model.ids(ElementKind.JOB)
    assert len(jobs) == 2000
    states = Counter((model.attr(j, A.JOB_STATE), model.attr(j, A.JOB_STATUS)) for j in jobs)
    for pair in [("STARTING", "PENDING"), ("STARTING", "HELD"), ("RUNNING", "RUNNING"),
                 ("SUSPENDED", "SUSPENDED"), ("COMPLETED", "FINISHED")]:
        assert states[pair] > 0, pair
    assert {model.get(j).parent for j in jobs} == set(queues.values())
    for job in jobs:
        assert model.attr(job, A.QUEUE_ID) == str(model.get(job).parent)
    with_processes = [j for j in jobs if model.children(j)]
    assert 0 < len(with_processes) < len(jobs) / 4  # a share of the jobs list processes
    for job in with_processes:
        procs = model.children(job, ElementKind.PROCESS)
        assert len(procs) == int(model.attr(job, A.JOB_NUM_PROCS))
        assert [model.attr(p, A.PROCESS_INDEX) for p in procs] == [str(i) for i in range(len(procs))]
        assert {model.attr(p, A.PROCESS_STATE) for p in procs} == {model.attr(job, A.JOB_STATE)}


def test_wide_node_numbers_and_no_processes():
    sim = make(nodes=100001, jobs=10, process_share=0.0)
    sim.populate()
    nodes = sim.model.ids(ElementKind.NODE)
    assert sim.model.attr(nodes[0], A.NAME) == "n000000"
    assert sim.model.count(ElementKind.PROCESS) == 0


def test_attribute_definitions():
    sim = make()
    sim.populate()
    defs = sim.attribute_definitions()
    registry = AttributeRegistry(defs)
    assert registry.get("hold").type is AttrType.BOOLEAN
    assert registry.get("suspend").type is AttrType.BOOLEAN
    assert registry.get(A.PROG_ARGS).type is AttrType.ARRAY
    assert registry.get(A.QUEUE_ID).default == str(sim.queue_ids["batch"])
    AttrDef(1, defs).encode()


# --------------------------------------------------------------------------- submitted jobs


@pytest.fixture
async def sim(nursery):
    scheduler = make(nodes=8)
    await nursery.start(scheduler.run)
    return scheduler


async def test_submitted_job_runs_to_completion(sim, autojump_clock):
    model = sim.model
    model.snapshot(1)
    job_id = await sim.submit(job_attrs((A.JOB_NUM_PROCS, "2"), (A.PROG_ARGS, "-v")))
    attrs = model.attrs(job_id)
    assert attrs[A.JOB_STATE] == "STARTING" and attrs[A.JOB_STATUS] == "PENDING"
    assert attrs[A.JOB_SUB_ID] == "sub-1" and attrs[A.NAME] == "app"
    assert attrs[A.QUEUE_ID] == str(sim.queue_ids["batch"]) and model.get(job_id).parent == sim.queue_ids["batch"]
    procs = model.children(job_id, ElementKind.PROCESS)
    assert len(procs) == 2
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")
    assert {model.attr(p, A.PROCESS_STATE) for p in procs} == {"RUNNING"}
    assert all(model.attr(p, A.PROCESS_NODE_ID) in {str(n) for n in sim.node_ids} for p in procs)
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "COMPLETED")
    assert model.attr(job_id, A.JOB_STATUS) == "FINISHED"
    assert {model.attr(p, A.PROCESS_EXIT_CODE) for p in procs} == {"0"}
    lines = Counter()
    for event in model.drain(2):
        if isinstance(event, ProcessChange):
            for group in event.groups:
                for key, _ in group.attributes:
                    if key == A.PROCESS_STDOUT:
                        lines.update(group.ids)
    assert lines == {procs[0]: 3, procs[1]: 3}
    # completed jobs are removed after the retention period
    await until(lambda: job_id not in model, step=0.5)


async def test_time_scale(nursery, autojump_clock):
    sim = make(time_scale=0.01)
    await nursery.start(sim.run)
    start = trio.current_time()
    job_id = await sim.submit(job_attrs())
    await until(lambda: sim.model.attr(job_id, A.JOB_STATE) == "COMPLETED")
    assert trio.current_time() - start < 0.03


async def test_same_seed_same_submissions(autojump_clock):
    async def run_once():
        sim = make(seed=3)
        timeline = []
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run)
            start = trio.current_time()
            job_id = await sim.submit(job_attrs())
            for state in ("RUNNING", "COMPLETED"):
                await until(lambda: sim.model.attr(job_id, A.JOB_STATE) == state)
                timeline.append(round(trio.current_time() - start, 3))
            nursery.cancel_scope.cancel()
        return timeline

    first, second = await run_once(), await run_once()
    assert first[0] >= 0.2 and first[1] >= first[0] + 1.0
    # equal up to the 1 ms polling of until()
    assert all(abs(a - b) <= 0.003 for a, b in zip(first, second))


@pytest.mark.parametrize(
    "pairs, message, code",
    [
        ([(A.EXEC_NAME, "app")], "jobSubId", ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s")], "no executable", ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "x")], "whole number", ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "0")], "at least 1", ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.JOB_NUM_PROCS, "99999")], "at most", ErrorCode.BAD_ARGUMENTS),
        ([(A.JOB_SUB_ID, "s"), (A.EXEC_NAME, "a"), (A.QUEUE_ID, "nope")], "unknown queue", ErrorCode.NO_SUCH_QUEUE),
    ],
)
async def test_bad_submissions(sim, pairs, message, code, autojump_clock):
    with pytest.raises(SubmitError, match=message) as info:
        await sim.submit(AttributeSet(pairs))
    assert info.value.code == code
    assert sim.model.count(ElementKind.JOB) == 0


async def test_submit_to_a_named_queue(sim, autojump_clock):
    job_id = await sim.submit(job_attrs((A.QUEUE_ID, "debug")))
    assert sim.model.get(job_id).parent == sim.queue_ids["debug"]
    job_id = await sim.submit(job_attrs((A.QUEUE_ID, str(sim.queue_ids["long"]))))
    assert sim.model.get(job_id).parent == sim.queue_ids["long"]


async def test_terminate(sim, autojump_clock):
    model = sim.model
    pending = await sim.submit(job_attrs())
    await sim.terminate(pending)
    assert model.attr(pending, A.JOB_STATUS) == "CANCELED"
    running = await sim.submit(job_attrs(sub_id="2"))
    await until(lambda: model.attr(running, A.JOB_STATE) == "RUNNING")
    await sim.terminate(running)
    assert model.attr(running, A.JOB_STATE) == "COMPLETED"
    assert model.attr(running, A.JOB_STATUS) == "CANCELED"
    [proc] = model.children(running)
    assert model.attr(proc, A.PROCESS_SIGNAL_NAME) == "SIGTERM"
    with pytest.raises(JobError, match="already completed"):
        await sim.terminate(running)
    await trio.sleep(5)  # stale timers of the canceled jobs change nothing
    assert model.attr(running, A.JOB_STATUS) == "CANCELED"


async def test_hold_and_release(sim, autojump_clock):
    model = sim.model
    job_id = await sim.submit(job_attrs())
    await sim.change(job_id, AttributeSet([("hold", "true")]))
    assert model.attr(job_id, A.JOB_STATUS) == "HELD"
    await trio.sleep(5)
    assert model.attr(job_id, A.JOB_STATE) == "STARTING"
    await sim.change(job_id, AttributeSet([("hold", "false")]))
    assert model.attr(job_id, A.JOB_STATUS) == "PENDING"
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "COMPLETED")
    with pytest.raises(JobError, match="not started"):
        await sim.change(job_id, AttributeSet([("hold", "true")]))


async def test_suspend_and_resume(sim, autojump_clock):
    model = sim.model
    job_id = await sim.submit(job_attrs())
    with pytest.raises(JobError, match="only a running job"):
        await sim.change(job_id, AttributeSet([("suspend", "true")]))
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")
    await sim.change(job_id, AttributeSet([(A.JOB_STATE, "SUSPENDED")]))
    [proc] = model.children(job_id)
    assert model.attr(proc, A.PROCESS_STATE) == "SUSPENDED"
    await trio.sleep(10)
    assert model.attr(job_id, A.JOB_STATE) == "SUSPENDED"
    await sim.change(job_id, AttributeSet([("suspend", "false")]))
    assert model.attr(proc, A.PROCESS_STATE) == "RUNNING"
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "COMPLETED")


async def test_unsupported_change(sim, autojump_clock):
    job_id = await sim.submit(job_attrs())
    with pytest.raises(JobError, match="cannot change name") as info:
        await sim.change(job_id, AttributeSet([("name", "x")]))
    assert info.value.code == ErrorCode.NOT_SUPPORTED


async def test_move(sim, autojump_clock):
    model = sim.model
    job_id = await sim.submit(job_attrs())
    model.snapshot(1)
    await sim.move(job_id, sim.queue_ids["long"])
    assert model.attr(job_id, A.QUEUE_ID) == str(sim.queue_ids["long"])
    assert model.get(job_id).parent == sim.queue_ids["long"]
    assert job_id in model.children(sim.queue_ids["long"])
    assert job_id not in model.children(sim.queue_ids["batch"])
    # the client sees the job removed and created again under its new queue, same id
    events = model.drain(2)
    assert [type(e).__name__ for e in events if getattr(e, "kind", None) is ElementKind.JOB] == [
        "RemoveElements", "NewElements"]
    [new_job] = [e for e in events if isinstance(e, NewElements) and e.kind is ElementKind.JOB]
    assert new_job.parent_id == str(sim.queue_ids["long"])
    assert [str(i) for g in new_job.groups for i in g.ids] == [str(job_id)]
    with pytest.raises(JobError) as info:
        await sim.move(job_id, job_id)
    assert info.value.code == ErrorCode.NO_SUCH_QUEUE
    await until(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")
    with pytest.raises(JobError, match="not started"):
        await sim.move(job_id, sim.queue_ids["debug"])


async def test_existing_jobs_can_be_controlled(nursery, autojump_clock):
    sim = make(jobs=300)
    await nursery.start(sim.run)
    model = sim.model
    by_status = {}
    for job in model.ids(ElementKind.JOB):
        by_status.setdefault(model.attr(job, A.JOB_STATUS), job)
    await sim.change(by_status["HELD"], AttributeSet([("hold", "false")]))
    assert model.attr(by_status["HELD"], A.JOB_STATUS) == "PENDING"
    await sim.change(by_status["RUNNING"], AttributeSet([("suspend", "true")]))
    assert model.attr(by_status["RUNNING"], A.JOB_STATE) == "SUSPENDED"
    await sim.terminate(by_status["PENDING"])
    assert model.attr(by_status["PENDING"], A.JOB_STATUS) == "CANCELED"
    with pytest.raises(JobError, match="already completed"):
        await sim.terminate(by_status["FINISHED"])


# --------------------------------------------------------------------------- churn


async def test_churn_changes_nodes_and_jobs_and_stays_bounded(nursery, autojump_clock):
    sim = make(nodes=50, jobs=200, churn=500.0, retention=2.0)
    await nursery.start(sim.run)
    model = sim.model
    model.snapshot(1)
    await trio.sleep(1.0)
    kinds = Counter()
    for event in model.drain(2):
        if isinstance(event, ElementChange):
            kinds[event.kind] += sum(len(group.ids) for group in event.groups)
    assert kinds[ElementKind.NODE] > 0
    assert kinds[ElementKind.JOB] > 0
    # active jobs are replaced as they complete; completed ones stay for the retention period
    bound = 200 + 500 * 2.0
    for _ in range(20):
        await trio.sleep(1.0)
        model.drain(2)
        assert 200 <= model.count(ElementKind.JOB) <= bound


async def test_without_churn_the_cluster_stays_put(nursery, autojump_clock):
    sim = make(nodes=20, jobs=100)
    await nursery.start(sim.run)
    sim.model.snapshot(1)
    await trio.sleep(120)
    assert sim.model.drain(2) == []
