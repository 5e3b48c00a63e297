"""The batch engine with a scripted batch system: the behaviour every batch backend shares
(races, output before the end, spool removal, back-off, adoption, queue figures, gone jobs),
checked where each can be made to happen on purpose."""

from __future__ import annotations

import getpass
import json
import time
import os
from typing import Dict, List, Optional, Sequence, Tuple

import attrs
from hypothesis import given, strategies as st
import pytest
import trio

from proxy_agent.schedulers.batch.engine import (
    BatchBackend, BatchOptions, BatchSystem, CommandResult, JobTable, Run,
)
from proxy_agent.schedulers.batch.records import NativeJob, NativeQueue
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, JobState, StateTable
from proxy_agent.service.model import ChangeSink, K, Kind, ServiceModel
from proxy_agent.service.store import StoredJob, spec_to_json
from service_fixtures import start_backend, wait_for
from wait_support import wait_until

TABLE = StateTable("fake", {"wait": JobState.QUEUING, "held": JobState.HOLD, "run": JobState.RUNNING,
                            "done": JobState.FINISHED, "fail": JobState.FAILED})


class Scheduler:
    """What the fake commands answer: a listing, accounting records, failures on demand."""

    def __init__(self) -> None:
        self.listed: Dict[str, NativeJob] = {}
        self.finals: Dict[str, NativeJob] = {}
        self.queues = [NativeQueue("q1", total_slots=8), NativeQueue("q2", total_slots=2, free_slots=1, waiting=5)]
        self.failing: Optional[str] = None
        self.garbage = False
        self.calls: List[Tuple[str, ...]] = []
        self.times: List[float] = []  # when each call came
        self.submitted: Dict[str, Tuple[str, str]] = {}
        self.next_id = 100
        #: seconds a submit command takes after the job is listed (0: listed only later)
        self.listed_while_submitting = 0.0
        #: CPU seconds a status query costs
        self.status_cpu = 0.0
        self.user = getpass.getuser()

    async def run(self, argv: Sequence[str], stdin: Optional[bytes], env) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        self.times.append(trio.current_time())
        await trio.sleep(0)
        if self.failing and argv[0] != "submit":
            return CommandResult(argv, 1, b"", self.failing.encode())
        if argv[0] == "status":
            spent = time.process_time() + self.status_cpu
            while time.process_time() < spent:  # what answering costs
                pass
            if self.garbage:
                return CommandResult(argv, 0, b"<<not json", b"")
            data = [attrs.asdict(job) for job in self.listed.values()]
            return CommandResult(argv, 0, json.dumps(data).encode(), b"")
        if argv[0] == "queues":
            return CommandResult(argv, 0, json.dumps([attrs.asdict(q) for q in self.queues]).encode(), b"")
        if argv[0] == "submit":
            self.next_id += 1
            job_id = str(self.next_id)
            self.submitted[job_id] = (argv[1], argv[2])
            if self.listed_while_submitting:
                # the server has the job (and lists it) before the submit command answers
                self.listed[job_id] = NativeJob(job_id, user=self.user, queue="q1", native_state="held")
                await trio.sleep(self.listed_while_submitting)
            return CommandResult(argv, 0, job_id.encode(), b"")
        if argv[0] == "final":
            record = self.finals.get(argv[1])
            return CommandResult(argv, 0, json.dumps(attrs.asdict(record) if record else None).encode(), b"")
        if argv[0] == "delete":
            self.listed.pop(argv[1], None)
            return CommandResult(argv, 0, b"deleted", b"")
        raise AssertionError(f"unexpected command {argv}")


def _job(data: dict) -> NativeJob:
    return NativeJob(**{**data, "hosts": tuple(data["hosts"])})


class FakeSystem(BatchSystem):
    label = "Fake"

    @property
    def state_table(self) -> StateTable:
        return TABLE

    async def start(self, run: Run) -> str:
        return "1.0"

    def status_argv(self, user):
        return ["status"]

    def parse_status(self, text: str, user) -> List[NativeJob]:
        return [_job(d) for d in json.loads(text)]

    def queues_argv(self):
        return ["queues"]

    def parse_queues(self, text: str) -> List[NativeQueue]:
        return [NativeQueue(**{**d, "hosts": tuple(d["hosts"])}) for d in json.loads(text)]

    async def final_record(self, job_id: str, run: Run) -> Optional[NativeJob]:
        data = json.loads((await run(["final", job_id])).out)
        return _job(data) if data else None

    def submit_command(self, spec: JobSpec):
        return ["submit", spec.stdout_path, spec.stderr_path], b"script"

    def parse_submitted(self, result: CommandResult) -> str:
        return result.out

    def job_command(self, op: str, job: NativeJob, queue: str = "") -> List[str]:
        if op != "delete":
            raise JobError(f"fake cannot {op}", ErrorKind.NOT_SUPPORTED)
        return ["delete", job.job_id]

    def check_job_command(self, op, job_id, argv, result) -> None:
        pass


class FakeBackend(BatchBackend):
    name = "fake"
    summary = "a scripted batch system"

    def make_system(self) -> BatchSystem:
        return FakeSystem()


class Events(ChangeSink):
    """The order in which a job's output and states reach a subscriber."""

    def __init__(self, model: ServiceModel, job: int = -1) -> None:
        self.model = model
        self.job = job
        self.seen: List[Tuple[str, str]] = []

    def output(self, element, stream, text, offset=None) -> None:
        if element.parent == self.job:
            self.seen.append((stream, text))

    def changed(self, element, slots) -> None:
        if element.key == self.job:
            state = self.model.attr(element.key, K.STATE)
            if not self.seen or self.seen[-1] != ("state", state):
                self.seen.append(("state", state))


async def start(nursery, tmp_path, scheduler: Scheduler, **settings):
    backend = FakeBackend(ServiceModel(), BatchOptions(poll_interval=0.1), runner=scheduler.run,
                          spool_dir=str(tmp_path / "spool"), output_interval=0.02, output_drain_grace=0.1,
                          retention=settings.pop("retention", 60.0), **settings)
    return await start_backend(nursery, backend)


def polls_after(scheduler: Scheduler, count: int) -> List[float]:
    """When the status queries after the first ``count`` calls came."""
    return [at for call, at in zip(scheduler.calls[count:], scheduler.times[count:]) if call[0] == "status"]


def spool(tmp_path) -> List[str]:
    return sorted(os.listdir(tmp_path / "spool")) if (tmp_path / "spool").exists() else []


async def test_a_job_that_ends_before_it_is_listed_delivers_its_output_then_its_end(nursery, tmp_path):
    scheduler = Scheduler()
    harness = await start(nursery, tmp_path, scheduler)
    model = harness.model
    key = await harness.service.submit(JobSpec("prog", client_ref="race"))
    events = Events(model, key)
    model.subscribe(events)
    (job_id, (out, err)), = scheduler.submitted.items()
    assert os.path.dirname(out) == os.path.dirname(err) == str(tmp_path / "spool")
    # The job ran and ended between two listings: it is never listed at all.
    with open(out, "w") as f:
        f.write("line one\nline two\n")
    with open(err, "w") as f:
        f.write("no newline at the end")
    assert len(spool(tmp_path)) == 2
    scheduler.finals[job_id] = NativeJob(job_id, native_state="fail", exit_code=3, signal="")
    await harness.wait_ended(key)
    assert model.attr(key, K.STATE) == "FAILED" and model.attr(key, K.EXIT_CODE) == "3"
    (process,) = model.processes(key)
    assert model.attr(process, K.EXIT_CODE) == "3"
    final = events.seen.index(("state", "FAILED"))
    assert ("stdout", "line one\nline two") in events.seen[:final]
    assert ("stderr", "no newline at the end") in events.seen[:final]
    await wait_for(lambda: not spool(tmp_path))


async def test_listed_jobs_become_model_changes_and_queue_figures(nursery, tmp_path):
    scheduler = Scheduler()
    scheduler.listed = {
        "1": NativeJob("1", name="a", user="u", queue="q1", native_state="wait"),
        "2": NativeJob("2", name="b", user="u", queue="q1", native_state="wait"),
        "3": NativeJob("3", name="c", user="u", queue="q1", native_state="run", num_procs=3, time_used=5),
        "4": NativeJob("4", name="d", user="u", queue="q2", native_state="run"),
    }
    harness = await start(nursery, tmp_path, scheduler)
    model = harness.model
    queues = {model.attr(k, K.NAME): k for k in model.keys(Kind.QUEUE)}
    q1, q2 = queues["q1"], queues["q2"]
    jobs = {model.attr(k, K.NATIVE_ID): k for k in model.keys(Kind.JOB)}
    assert set(jobs) == {"1", "2", "3", "4"} and model.get(jobs["4"]).parent == q2
    assert (model.attr(q1, K.WAITING), model.attr(q1, K.RUNNING), model.attr(q1, K.FREE_SLOTS)) == ("2", "1", "5")
    # The scheduler's own figures win where it gives them.
    assert (model.attr(q2, K.WAITING), model.attr(q2, K.RUNNING), model.attr(q2, K.FREE_SLOTS)) == ("5", "1", "1")
    assert model.attr(q1, K.DEFAULT) == "true" and model.attr(q1, K.TOTAL_SLOTS) == "8"

    # Only a change of what the model shows is a change: the running clock is not.
    version = model.version
    scheduler.listed["3"] = attrs.evolve(scheduler.listed["3"], time_used=99)
    before = len(scheduler.calls)
    await wait_until(lambda: len(polls_after(scheduler, before)) >= 3, what="three polls")
    assert model.version == version
    scheduler.listed["1"] = attrs.evolve(scheduler.listed["1"], native_state="run", hosts=("n1",))
    await wait_for(lambda: model.attr(jobs["1"], K.STATE) == "RUNNING")
    assert model.attr(jobs["1"], K.HOSTS) == "n1"
    assert model.attr(q1, K.WAITING) == "1" and model.attr(q1, K.RUNNING) == "2"


async def test_a_job_listed_before_its_submit_command_answers_appears_once_as_submitted(nursery, tmp_path):
    """A listing that shows the job while the submit command still runs does not make it
    somebody's job first (then taken over as the submitted one): the clients see the
    submitted job once, with its reference, from the start."""
    scheduler = Scheduler()
    scheduler.listed_while_submitting = 0.5  # five polls of 0.1 s run meanwhile
    harness = await start(nursery, tmp_path, scheduler, fast_poll_interval=0.1, user=scheduler.user)
    model = harness.model

    class Created(ChangeSink):
        def __init__(self) -> None:
            self.jobs: List[Tuple[int, object]] = []

        def created(self, element) -> None:
            if element.kind is Kind.JOB:
                self.jobs.append((element.key, model.attr(element.key, K.CLIENT_REF)))

    created = Created()
    model.subscribe(created)
    key = await harness.service.submit(JobSpec("prog", client_ref="held-one", hold=True))
    before = len(scheduler.calls)
    await wait_until(lambda: len(polls_after(scheduler, before)) >= 3, what="more listings that show it")
    assert created.jobs == [(key, "held-one")]
    assert [k for k in model.keys(Kind.JOB)] == [key]
    assert model.attr(key, K.NATIVE_STATE) == "held" and model.attr(key, K.STATE) == "HOLD"


async def test_idle_polls_that_cost_much_are_spaced_to_the_cpu_budget(nursery, tmp_path):
    """With a CPU budget (the default without a poll interval given), a listing that costs
    50 ms to poll is polled about once a second at 5 % of a core, not every 0.1 s."""
    scheduler = Scheduler()
    scheduler.status_cpu = 0.05
    backend = FakeBackend(ServiceModel(), BatchOptions(poll_interval=0.1, cpu_budget=0.05), runner=scheduler.run,
                          spool_dir=str(tmp_path / "spool"))
    await start_backend(nursery, backend)
    await wait_until(lambda: len(polls_after(scheduler, 0)) >= 2, what="the first polls, which set the pace")
    before = len(scheduler.calls)
    polls = await wait_until(lambda: len(polls_after(scheduler, before)) >= 3 and polls_after(scheduler, before),
                             what="three more polls")
    gaps = [later - earlier for earlier, later in zip(polls, polls[1:])]
    assert all(gap >= 0.5 for gap in gaps), gaps  # about a second apart; every 0.1 s without the budget


async def test_hosts_stay_when_the_record_of_the_end_has_none(nursery, tmp_path):
    """PBS without job history blanks a job's hosts when it ends: what the clients were
    shown of where the job ran stays."""
    scheduler = Scheduler()
    scheduler.listed = {"5": NativeJob("5", queue="q1", native_state="run", hosts=("n1", "n2"))}
    harness = await start(nursery, tmp_path, scheduler)
    model = harness.model
    (key,) = [k for k in model.keys(Kind.JOB) if model.attr(k, K.NATIVE_ID) == "5"]
    assert model.attr(key, K.HOSTS) == "n1,n2"
    scheduler.finals["5"] = NativeJob("5", queue="q1", native_state="done", exit_code=0)
    del scheduler.listed["5"]
    await harness.wait_ended(key)
    assert model.attr(key, K.STATE) == "FINISHED" and model.attr(key, K.HOSTS) == "n1,n2"


async def test_a_job_gone_without_a_record_is_deleted_or_killed(nursery, tmp_path):
    scheduler = Scheduler()
    scheduler.listed = {"7": NativeJob("7", queue="q1", native_state="wait"),
                        "8": NativeJob("8", queue="q1", native_state="wait")}
    harness = await start(nursery, tmp_path, scheduler)
    model = harness.model
    jobs = {model.attr(k, K.NATIVE_ID): k for k in model.keys(Kind.JOB)}
    await harness.service.terminate(jobs["8"])
    # deleted before it ran: it ends at once, not at a poll an ending agent may never make
    assert model.attr(jobs["8"], K.STATE) == "KILLED"
    del scheduler.listed["7"]
    for key in jobs.values():
        await harness.wait_ended(key)
    assert model.attr(jobs["7"], K.STATE) == "DELETED"
    assert "no record of how it ended" in model.attr(jobs["7"], K.MESSAGE)
    assert model.attr(jobs["8"], K.STATE) == "KILLED"
    assert "deleted on request" in model.attr(jobs["8"], K.MESSAGE)
    with pytest.raises(JobError) as failed:
        await harness.service.terminate(jobs["8"])
    assert "ended already" in failed.value.message
    # The accounting lookup was tried before giving up, once per poll.
    assert sum(1 for call in scheduler.calls if call == ("final", "7")) == FakeBackend.MAX_GONE_POLLS


async def test_a_failing_scheduler_is_polled_less_and_reported_once(nursery, tmp_path):
    scheduler = Scheduler()
    harness = await start(nursery, tmp_path, scheduler, max_backoff=10.0)
    model = harness.model
    (machine,) = model.keys(Kind.MACHINE)
    scheduler.failing = "controller is down"
    before = len(scheduler.calls)
    polls = await wait_until(lambda: len(polls_after(scheduler, before)) >= 5 and polls_after(scheduler, before),
                             what="five polls of the failing scheduler")
    gaps = [later - earlier for earlier, later in zip(polls, polls[1:])]
    # each failed poll doubles the wait for the next: 0.1, 0.2, 0.4, 0.8 s apart, not 0.1 s each
    assert all(gap >= 0.9 * 0.1 * 2 ** i for i, gap in enumerate(gaps)), gaps
    assert model.attr(machine, K.STATE) == "ERROR"
    errors = [text for level, text in harness.notices if level == "ERROR"]
    assert errors == ["Fake query failed (retrying): controller is down"]
    scheduler.failing = None
    await wait_for(lambda: any(level == "INFO" for level, _ in harness.notices))
    assert model.attr(machine, K.STATE) != "ERROR"
    # Unreadable answers are failures too, and the backend serves on.
    scheduler.garbage = True
    await wait_for(lambda: any("unreadable answer" in text for _, text in harness.notices))
    scheduler.garbage = False
    key = await harness.service.submit(JobSpec("prog"))
    assert model.attr(key, K.STATE) == "QUEUING"


async def test_adopted_jobs_deliver_output_from_where_it_stopped(nursery, tmp_path):
    scheduler = Scheduler()
    harness = await start(nursery, tmp_path, scheduler)
    model = harness.model
    os.makedirs(tmp_path / "spool")
    out = str(tmp_path / "spool" / "adopted.out")
    with open(out, "w") as f:
        f.write("already seen\nnew line\n")
    spec = JobSpec("prog", name="adopted", client_ref="ref-1")
    scheduler.listed["42"] = NativeJob("42", queue="q1", native_state="run")
    record = StoredJob(key=500, backend="fake", queue="fake:q1", native_id="42", name="adopted", client_ref="ref-1",
                       spec=spec_to_json(spec), state="RUNNING", native_state="run", message="", submitted=0.0,
                       ended=None, delivered=json.dumps({"0.stdout": len("already seen\n")}),
                       extra=json.dumps({"paths": {"stdout": out}, "spool": [out]}))
    events = Events(model, 500)
    model.subscribe(events)
    assert harness.backend.adopt([record]) == [500]
    assert model.attr(500, K.NATIVE_ID) == "42" and model.attr(500, K.CLIENT_REF) == "ref-1"
    await wait_for(lambda: ("stdout", "new line") in events.seen)
    del scheduler.listed["42"]
    scheduler.finals["42"] = NativeJob("42", native_state="done", exit_code=0)
    await harness.wait_ended(500)
    assert model.attr(500, K.STATE) == "FINISHED"
    assert [text for stream, text in events.seen if stream == "stdout"] == ["new line"]
    await wait_for(lambda: not os.path.exists(out))


async def test_ended_jobs_leave_the_model_after_the_retention(nursery, tmp_path):
    scheduler = Scheduler()
    scheduler.listed = {"9": NativeJob("9", queue="q1", native_state="done", exit_code=0)}
    harness = await start(nursery, tmp_path, scheduler, retention=0.3)
    model = harness.model
    (key,) = model.keys(Kind.JOB)
    assert model.attr(key, K.STATE) == "FINISHED"
    await wait_for(lambda: key not in model)
    before = len(scheduler.calls)
    await wait_until(lambda: len(polls_after(scheduler, before)) >= 3, what="three polls")
    assert not model.keys(Kind.JOB)  # still listed, but not shown again


def test_job_table_diffs_and_respects_expected_jobs():
    table = JobTable()
    first = [NativeJob("1", native_state="wait"), NativeJob("2", native_state="run", time_used=1)]
    changes = table.apply(first, generation=1)
    assert [j.job_id for j in changes.added] == ["1", "2"] and not changes.changed and not changes.gone
    assert not table.apply([first[0], attrs.evolve(first[1], time_used=9)], 2).changed
    table.expect("3", generation=3)
    # A listing started before the submission does not know the job: not gone.
    assert table.apply(first, 2).gone == []
    assert table.apply(first, 3).gone == []
    assert table.apply(first, 4).gone == ["3"]
    changes = table.apply([attrs.evolve(first[0], native_state="run")], 5)
    assert [j.job_id for j in changes.changed] == ["1"] and changes.gone == ["2"]


LISTINGS = st.lists(st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["wait", "run", "held"]), max_size=6),
                    min_size=1, max_size=8)


@given(LISTINGS)
def test_job_table_reports_exactly_the_differences(listings):
    table = JobTable()
    previous: Dict[str, str] = {}
    for generation, listing in enumerate(listings):
        changes = table.apply([NativeJob(i, native_state=s) for i, s in listing.items()], generation)
        assert {j.job_id for j in changes.added} == set(listing) - set(previous)
        assert {j.job_id for j in changes.changed} == {i for i in listing if i in previous and previous[i] != listing[i]}
        assert set(changes.gone) == set(previous) - set(listing)
        assert {i: table.record(i).native_state for i in listing} == listing
        previous = listing
