"""The SLURM backend without a cluster: listing diffs, mappings, output files, Model.move,
and the scheduler driven by a scripted stand-in for SLURM's commands."""

from __future__ import annotations

import importlib.util
import shlex
import time
from pathlib import Path
from typing import Dict, List, Optional

import attrs
import hypothesis.strategies as st
import pytest
import trio
from hypothesis import given, settings

from proxy_agent.model import Model
from proxy_agent.protocol.attributes import AttributeSet, decode_attr_defs, encode_attr_defs
from proxy_agent.protocol.ids import IdAllocator
from proxy_agent.protocol.messages import (
    ElementChange,
    ElementKind,
    ErrorCode,
    MessageLevel,
    NewElements,
    ProcessChange,
    RemoveElements,
    RemoveProcesses,
)
from proxy_agent.schedulers import slurm_parse as sp
from proxy_agent.schedulers.base import JobError, SchedulerOptions, SubmitError
from proxy_agent.schedulers.slurm import (
    CommandResult,
    JobTable,
    SlurmScheduler,
    clean_message,
    expand_output_pattern,
    first_host,
    job_attributes,
    node_attributes,
    partition_attributes,
    process_attributes,
)
from proxy_agent.schedulers.common import LineSplitter
from proxy_agent.schedulers.slurm_parse import SlurmJob

DATA = Path(__file__).parent / "data" / "slurm"
REAL = DATA / "22.05.8"
TID = 9


def load_make_large():
    spec = importlib.util.spec_from_file_location("make_large", DATA / "make_large.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def job(job_id: str, state: str = "RUNNING", **fields) -> SlurmJob:
    defaults = dict(name=f"job{job_id}", user="alice", partition="debug", nodes="vm", time_used="0:05",
                    time_limit="10:00", exit_code="0:0", num_nodes=1, num_cpus=1, num_tasks=1)
    defaults.update(fields)
    return SlurmJob(job_id, state=state, **defaults)


# ------------------------------------------------------------------------------------ JobTable


def test_table_reports_added_changed_and_gone():
    table = JobTable()
    first = table.apply([job("1"), job("2", "PENDING", nodes="")])
    assert [j.job_id for j in first.added] == ["1", "2"] and not first.changed and not first.gone
    assert not table.apply([job("1"), job("2", "PENDING", nodes="")])

    started = job("2", "RUNNING")
    second = table.apply([job("1"), started, job("3")])
    assert [j.job_id for j in second.added] == ["3"]
    assert second.changed == [(job("2", "PENDING", nodes=""), started)]
    assert second.gone == []

    third = table.apply([job("3")])
    assert sorted(third.gone) == ["1", "2"]
    assert third.gone and not third.added and not third.changed
    assert "1" not in table and not table.apply([job("3")])  # reported once


def test_running_clock_alone_is_no_change():
    table = JobTable()
    table.apply([job("1", time_used="0:05")])
    assert not table.apply([job("1", time_used="0:06")])
    assert table.record("1").time_used == "0:06"  # the latest record is kept for refreshes


def test_expected_job_is_not_gone_in_a_listing_that_started_before_it():
    table = JobTable()
    table.apply([], generation=1)
    table.expect("7", generation=2)  # submitted while listing 2 was running
    assert table.apply([], generation=2).gone == []
    assert table.apply([], generation=3).gone == ["7"]

    table.expect("8", generation=3)
    listed = table.apply([job("8", "PENDING")], generation=4)
    assert listed.added == [] and listed.changed == [(None, job("8", "PENDING"))]
    assert table.apply([], generation=4).gone == ["8"]  # once listed, absence counts


def test_retired_job_is_not_added_again_while_listed():
    table = JobTable()
    table.apply([job("1", "COMPLETED")])
    table.retire("1")
    assert not table.apply([job("1", "COMPLETED")])
    assert not table.apply([])  # purged by SLURM: forgotten
    again = table.apply([job("1", "PENDING")])  # the id is reused much later
    assert [j.job_id for j in again.added] == ["1"]


listing = st.dictionaries(
    st.sampled_from([str(i) for i in range(12)]),
    st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED"]),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(listing, min_size=1, max_size=8))
def test_table_changes_replay_the_listings(listings):
    """Applying the reported changes to a mirror always reproduces the latest listing."""
    table = JobTable()
    mirror: Dict[str, str] = {}
    for states in listings:
        changes = table.apply([job(i, s) for i, s in states.items()])
        for added in changes.added:
            assert added.job_id not in mirror
            mirror[added.job_id] = added.state
        for previous, current in changes.changed:
            assert mirror[current.job_id] == previous.state != current.state
            mirror[current.job_id] = current.state
        for gone in changes.gone:
            del mirror[gone]
        assert mirror == states


# ------------------------------------------------------------------------------------ mappings


def test_job_and_process_attributes():
    failed = job("5", "FAILED", exit_code="3:0", reason="NonZeroExitCode")
    attrs_ = job_attributes(failed)
    assert attrs_["jobState"] == "COMPLETED" and attrs_["jobStatus"] == "FAILED"
    assert attrs_["slurmExitCode"] == "3:0" and attrs_["jobStatusMessage"] == "NonZeroExitCode"
    assert attrs_["slurmJobId"] == "5" and attrs_["partition"] == "debug" and attrs_["userId"] == "alice"
    assert process_attributes(failed, 42) == {
        "processState": "COMPLETED", "processStatus": "FAILED", "processNodeId": "42", "processExitCode": "3",
    }
    killed = process_attributes(job("6", "CANCELLED", exit_code="0:9"))
    assert killed["processExitCode"] == "137" and killed["processSignalName"] == "SIGKILL"
    running = job_attributes(job("7", "RUNNING"))
    assert running["jobState"] == "RUNNING" and running["slurmExitCode"] == ""
    pending = job_attributes(job("8", "PENDING", nodes="", reason="Priority"))
    assert pending["jobState"] == "STARTING" and pending["jobStatus"] == "PENDING"
    assert job_attributes(job("9", "SUSPENDED"))["jobState"] == "SUSPENDED"


def test_recorded_nodes_and_partitions():
    drained = sp.parse_nodes_json((REAL / "sinfo-drain.json").read_text())
    attrs_ = node_attributes(drained[0])
    assert attrs_["nodeState"] == "DOWN" and "DRAIN" in attrs_["slurmNodeState"]
    assert attrs_["slurmReason"]
    (up,) = sp.parse_nodes_json((REAL / "sinfo.json").read_text())
    assert node_attributes(up)["nodeState"] == "UP"
    assert node_attributes(up)["cpus"] == str(up.cpus)

    parts = {p.name: partition_attributes(p) for p in sp.parse_scontrol_partitions((REAL / "scontrol-partitions.txt").read_text())}
    assert parts["debug"]["queueState"] == "NORMAL" and parts["debug"]["slurmDefault"] == "true"
    assert parts["debug"]["slurmMaxNodes"] == "UNLIMITED" and parts["long"]["slurmDefault"] == "false"
    down = sp.parse_scontrol_partitions((REAL / "scontrol-partitions-down.txt").read_text())
    assert any(partition_attributes(p)["queueState"] == "STOPPED" for p in down)


def test_recorded_listing_maps_every_job():
    jobs = sp.parse_squeue_text((REAL / "squeue.txt").read_text())
    table = JobTable()
    assert len(table.apply(jobs).added) == len(jobs) > 5
    for record in jobs:
        attrs_ = job_attributes(record)
        assert attrs_["jobState"] in ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED")
        assert attrs_["jobStatus"] == sp.map_job_state(record.state)[1]


@pytest.mark.parametrize("text, first", [
    ("", ""), ("vm", "vm"), ("a,b", "a"), ("node[003-005,9]", "node003"),
    ("rack[1-2]-n[1-4],x", "rack1-n1"), ("gpu[7]", "gpu7"), ("broken[1", "broken"),
])
def test_first_host(text, first):
    assert first_host(text) == first


def test_clean_message():
    stderr = ("sbatch: error: invalid partition specified: nosuch\n"
              "sbatch: error: Batch job submission failed: Invalid partition name specified\n\n")
    assert clean_message(stderr) == ("invalid partition specified: nosuch; "
                                     "Batch job submission failed: Invalid partition name specified")
    assert clean_message("x\n" * 3) == "x"
    assert len(clean_message("y" * 5000, limit=100)) == 100


def test_expand_output_pattern():
    assert expand_output_pattern("/o/%x-%j.out", "42", "run", "al") == "/o/run-42.out"
    assert expand_output_pattern("/o/%5j-%u-%%.out", "42", "run", "al") == "/o/00042-al-%.out"
    assert expand_output_pattern("/o/%N.out", "42", "run", "al") is None
    assert expand_output_pattern("/o/plain.out", "42", "run", "al") == "/o/plain.out"


# ------------------------------------------------------------------------------------ output lines


def test_line_splitter_holds_partial_lines_and_split_characters():
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntw") == ["one"]
    data = "o ✓\r\nthree".encode()
    cut = data.index("✓".encode()) + 1  # in the middle of the character
    assert splitter.feed(data[:cut]) == []
    assert splitter.feed(data[cut:]) == ["two ✓"]
    assert splitter.flush() == ["three"]
    assert splitter.flush() == []
    assert LineSplitter().feed(b"bad \xff byte\n") == ["bad \ufffd byte"]
    long = LineSplitter(max_bytes=4)
    assert long.feed(b"abcdefghij") == ["abcd", "efgh"]
    assert long.flush() == ["ij"]


# ------------------------------------------------------------------------------------ Model.move


def apply_events(events, mirror):
    """Apply events to a {id: (kind, parent)} mirror the way a client does."""
    for event in events:
        if isinstance(event, NewElements):
            for group in event.groups:
                for eid in group.id_list():
                    assert eid not in mirror, f"NEW for known element {eid}"
                    mirror[eid] = (event.kind, event.parent_id)
        elif isinstance(event, (ElementChange, ProcessChange)):
            for group in event.groups:
                for eid in group.id_list():
                    assert eid in mirror, f"CHANGE for unknown element {eid}"
        elif isinstance(event, RemoveProcesses):
            for eid in (str(i) for i in event.ids):
                assert mirror.pop(eid)[1] == event.job_id
        elif isinstance(event, RemoveElements):
            for eid in (str(i) for i in event.ids):
                assert eid in mirror, f"REMOVE for unknown element {eid}"
                assert not any(parent == eid for _, parent in mirror.values()), f"{eid} removed before its children"
                del mirror[eid]


def truth(model):
    return {str(eid): (kind, str(model.get(eid).parent)) for kind in ElementKind for eid in model.ids(kind)}


def make_model():
    model = Model(IdAllocator(100))
    debug = model.add(ElementKind.QUEUE, None, {"name": "debug"})
    long_ = model.add(ElementKind.QUEUE, None, {"name": "long"})
    return model, debug, long_


def test_move_of_a_known_job_is_remove_then_new_under_the_new_queue():
    model, debug, long_ = make_model()
    job_id = model.add(ElementKind.JOB, debug, {"name": "j", "jobState": "STARTING"})
    process = model.add(ElementKind.PROCESS, job_id, {"processIndex": "0"})
    mirror: Dict[str, tuple] = {}
    apply_events(model.snapshot(TID), mirror)
    model.update(job_id, {"jobState": "RUNNING"})
    model.move(job_id, long_)
    model.output(process, "hello")
    events = model.drain(TID)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:2] == ["RemoveProcesses", "RemoveElements"]
    assert kinds[2:4] == ["NewElements", "NewElements"]
    new_job = events[2]
    assert new_job.kind is ElementKind.JOB and new_job.parent_id == str(long_)
    assert dict(new_job.groups[0].attributes)["jobState"] == "RUNNING"
    assert events[3].kind is ElementKind.PROCESS and events[3].parent_id == str(job_id)
    apply_events(events, mirror)
    assert mirror == truth(model)
    assert model.children(long_) == [job_id] and model.children(debug) == []
    assert not model.drain(TID)


def test_move_of_an_unsent_job_is_just_new_and_other_cases():
    model, debug, long_ = make_model()
    mirror: Dict[str, tuple] = {}
    apply_events(model.snapshot(TID), mirror)
    job_id = model.add(ElementKind.JOB, debug, {"name": "j"})
    model.add(ElementKind.PROCESS, job_id, {"processIndex": "0"})
    model.move(job_id, long_)
    events = model.drain(TID)
    assert [type(e).__name__ for e in events] == ["NewElements", "NewElements"]
    assert events[0].parent_id == str(long_)
    apply_events(events, mirror)
    model.move(job_id, long_)  # no-op
    assert not model.has_pending
    model.move(job_id, debug)
    model.remove(job_id)  # moved, then removed before a drain: one REMOVE
    events = model.drain(TID)
    apply_events(events, mirror)
    assert mirror == truth(model)
    with pytest.raises(ValueError):
        model.move(debug, long_)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "move", "update", "remove", "drain"]),
                          st.integers(0, 5)), max_size=40))
def test_moves_keep_a_client_mirror_exact(ops):
    model, debug, long_ = make_model()
    queues = [debug, long_]
    mirror: Dict[str, tuple] = {}
    apply_events(model.snapshot(TID), mirror)
    jobs: List[int] = []
    for op, n in ops:
        if op == "add":
            jid = model.add(ElementKind.JOB, queues[n % 2], {"name": str(n)})
            model.add(ElementKind.PROCESS, jid, {"processIndex": "0"})
            jobs.append(jid)
        elif op == "move" and jobs:
            model.move(jobs[n % len(jobs)], queues[n % 2])
        elif op == "update" and jobs:
            model.update(jobs[n % len(jobs)], {"jobState": str(n)})
        elif op == "remove" and jobs:
            model.remove(jobs.pop(n % len(jobs)))
        elif op == "drain":
            apply_events(model.drain(TID), mirror)
    apply_events(model.drain(TID), mirror)
    assert mirror == truth(model)


# ------------------------------------------------------------------------------------ scale


def test_parse_and_diff_of_100k_jobs_is_fast():
    """The per-poll work on a 100,000-job cluster: parse the listing, diff it with the last.

    The project's target is 1 s for both; the bound here is loose so a busy CI machine does
    not fail it, and the times are printed (pytest -s) for the record.
    """
    text = load_make_large().squeue_text(100_000)
    t0 = time.perf_counter()
    jobs = sp.parse_squeue_text(text)
    t1 = time.perf_counter()
    table = JobTable()
    first = table.apply(jobs)
    t2 = time.perf_counter()
    again = sp.parse_squeue_text(text)
    changed = [attrs.evolve(j, state="COMPLETED") if i % 100 == 0 else j for i, j in enumerate(again)]
    t3 = time.perf_counter()
    steady = table.apply(changed)
    t4 = time.perf_counter()
    assert len(first.added) == 100_000
    assert len(steady.changed) == sum(1 for j in again[::100] if j.state != "COMPLETED")
    print(f"\n100k jobs: parse {t1 - t0:.3f} s, first diff {t2 - t1:.3f} s, steady diff {t4 - t3:.3f} s")
    assert (t1 - t0) + (t4 - t3) < 5.0


# ------------------------------------------------------------------------------------ with a stand-in SLURM


def squeue_record(record: SlurmJob) -> str:
    values = {attr: getattr(record, attr) for _field, attr in sp.SQUEUE_FIELDS}
    values["exit_code"] = values["exit_code"] or "0"
    if not record.array_task_id:
        values["array_job_id"], values["array_task_id"] = record.job_id, "N/A"
    fields = ["" if v is None else str(v) for v in values.values()]
    return sp.FIELD_SEP.join(fields) + sp.RECORD_SEP + "\n"


class FakeSlurm:
    """Answers the scheduler's commands from recorded output and a job list the test edits."""

    def __init__(self) -> None:
        self.jobs: Dict[str, SlurmJob] = {}
        self.details: Dict[str, SlurmJob] = {}  # what scontrol show job knows
        self.sacct = ""
        self.calls: List[tuple] = []
        self.stdin: Dict[str, bytes] = {}
        self.fail: Dict[str, str] = {}  # command word -> stderr
        self.hang: set = set()
        self.next_id = 100
        self.sbatch_error: Optional[str] = None

    async def __call__(self, argv, stdin, env) -> CommandResult:
        argv = tuple(argv)
        self.calls.append((trio.current_time(), argv))
        word = argv[0]
        if word in self.hang:
            await trio.sleep_forever()
        if word in self.fail:
            return CommandResult(argv, 1, b"", self.fail[word].encode())
        out = self.answer(argv, stdin)
        if isinstance(out, tuple):
            return CommandResult(argv, out[0], b"", out[1].encode())
        return CommandResult(argv, 0, out.encode(), b"")

    def answer(self, argv, stdin):
        if argv[:2] == ("sinfo", "--version"):
            return (REAL / "version.txt").read_text()
        if argv[:3] == ("scontrol", "show", "config"):
            return "ClusterName             = fakecluster\nJobCompType             = jobcomp/filetxt\n"
        if argv[:2] == ("sinfo", "--json"):
            return (REAL / "sinfo.json").read_text()
        if argv[0] == "sinfo":
            return (REAL / "sinfo-nodes.txt").read_text()
        if argv[:4] == ("scontrol", "--oneliner", "show", "partition"):
            return (REAL / "scontrol-partitions.txt").read_text()
        if argv[0] == "squeue":
            return "".join(squeue_record(j) for j in self.jobs.values())
        if argv[:4] == ("scontrol", "--oneliner", "show", "job"):
            record = self.details.get(argv[4])
            if record is None:
                return (1, "slurm_load_jobs error: Invalid job id specified")
            return (f"JobId={record.job_id} JobName={record.name} UserId=alice(1000) JobState={record.state} "
                    f"Reason=None ExitCode={record.exit_code} RunTime=00:00:07 Partition={record.partition} "
                    f"NodeList={record.nodes}\n")
        if argv[0] == "sacct":
            return self.sacct
        if argv[0] == "sbatch":
            self.stdin["sbatch"] = stdin
            if self.sbatch_error:
                return (1, self.sbatch_error)
            self.next_id += 1
            job_id = str(self.next_id)
            self.jobs[job_id] = job(job_id, "PENDING", nodes="")
            return f"{job_id}\n"
        return ""

    def command_times(self, word: str) -> List[float]:
        return [t for t, argv in self.calls if argv[0] == word]


async def start(nursery, fake: FakeSlurm, **kwargs):
    model = Model(IdAllocator(1000))
    kwargs.setdefault("user", "alice")
    scheduler = SlurmScheduler(model, SchedulerOptions(poll_interval=1.0), runner=fake, **kwargs)
    await nursery.start(scheduler.run)
    return model, scheduler


def job_element(model: Model, slurm_id: str) -> int:
    (found,) = [e for e in model.ids(ElementKind.JOB) if model.attr(e, "slurmJobId") == slurm_id]
    return found


async def test_fill_and_poll_only_differences(nursery, autojump_clock):
    fake = FakeSlurm()
    fake.jobs = {"1": job("1", "RUNNING"), "2": job("2", "PENDING", nodes="", partition="long"), "3": job("3", "COMPLETED")}
    model, scheduler = await start(nursery, fake)
    (machine,) = model.ids(ElementKind.MACHINE)
    assert model.attr(machine, "name") == "fakecluster" and model.attr(machine, "slurmVersion") == "22.05.8"
    (node,) = model.ids(ElementKind.NODE)
    assert model.attr(node, "nodeState") == "UP" and model.attr(machine, "machineState") == "UP"
    queues = {model.attr(q, "name"): q for q in model.ids(ElementKind.QUEUE)}
    assert set(queues) == {"debug", "long"}
    assert model.get(job_element(model, "2")).parent == queues["long"]
    running = job_element(model, "1")
    (process,) = model.children(running)
    assert model.attr(process, "processNodeId") == str(node)
    assert model.attr(job_element(model, "3"), "jobState") == "COMPLETED"
    definitions = scheduler.attribute_definitions()
    assert len({d.id for d in definitions}) == len(definitions)
    assert decode_attr_defs(encode_attr_defs(definitions)) == definitions
    by_id = {d.id: d for d in definitions}
    partition = by_id["partition"]
    assert partition.values == ("debug", "long") and partition.default == "debug"
    assert by_id["queueId"].default == str(queues["debug"])
    for key in ("hold", "nodes", "cpusPerTask", "memory", "timeLimit", "account", "beginTime",
                "stdoutPath", "stderrPath", "jobName", "slurmJobId", "slurmNodeState", "cpus"):
        assert key in by_id, key
    assert ("sinfo", "--json") in [argv for _, argv in fake.calls]  # JSON where 22.05 has it

    model.snapshot(TID)
    fake.jobs["2"] = job("2", "RUNNING", partition="long")
    fake.jobs["1"] = job("1", "RUNNING", time_used="0:09")  # only the clock moved
    await trio.sleep(1.5)
    events = model.drain(TID)
    changed = {eid for e in events if isinstance(e, (ElementChange, ProcessChange)) for g in e.groups for eid in g.id_list()}
    assert changed == {str(job_element(model, "2")), str(model.children(job_element(model, "2"))[0])}

    # A job moved to another partition outside the agent follows in the model.
    fake.jobs["1"] = job("1", "RUNNING", partition="long")
    await trio.sleep(1.5)
    assert model.get(running).parent == queues["long"]


async def test_vanished_jobs_get_a_final_state_and_are_retired(nursery, autojump_clock):
    fake = FakeSlurm()
    fake.jobs = {str(i): job(str(i), "RUNNING") for i in (1, 2, 3)}
    model, scheduler = await start(nursery, fake, retention=30)
    elements = {i: job_element(model, i) for i in ("1", "2", "3")}
    fake.details["1"] = job("1", "COMPLETED", exit_code="0:0")
    line = sp.FIELD_SEP.join(["2", "2", "alice(1000)", "", "debug", "FAILED", "", "vm", "1", "1", "",
                              "00:00:07", "10", "2:0", "", "", "", "/w", "job2"]) + "\n"
    fake.sacct = line
    fake.jobs = {}
    await trio.sleep(1.5)
    assert model.attr(elements["1"], "jobStatus") == "COMPLETED"
    assert model.attr(elements["2"], "jobStatus") == "FAILED" and model.attr(elements["2"], "slurmExitCode") == "2:0"
    (process,) = model.children(elements["2"])
    assert model.attr(process, "processExitCode") == "2"
    assert any(argv[0] == "sacct" and "--completion" in argv for _, argv in fake.calls)
    assert model.attr(elements["3"], "jobState") == "COMPLETED"
    assert model.attr(elements["3"], "jobStatus") == "UNKNOWN"
    await trio.sleep(31)
    assert not any(e in model for e in elements.values())
    assert model.ids(ElementKind.JOB) == []


async def test_failing_and_hanging_commands_are_reported_and_retried(nursery, autojump_clock):
    fake = FakeSlurm()
    model, scheduler = await start(nursery, fake, command_timeout=5, max_backoff=8)
    messages = []
    scheduler.on_message = lambda level, code, text: messages.append((level, code, text))
    fake.fail["squeue"] = "squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    await trio.sleep(40)
    assert scheduler.last_error == "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    assert len(messages) == 1 and messages[0][0] is MessageLevel.ERROR and messages[0][1] == ErrorCode.SCHEDULER
    assert "Unable to contact slurm controller" in messages[0][2]
    (machine,) = model.ids(ElementKind.MACHINE)
    assert model.attr(machine, "machineState") == "ERROR"
    times = fake.command_times("squeue")
    gaps = [round(b - a) for a, b in zip(times, times[1:])]
    assert gaps[:5] == [1, 1, 2, 4, 8] and max(gaps) == 8  # the usual interval, then exponential, capped

    del fake.fail["squeue"]
    fake.hang.add("squeue")
    await trio.sleep(30)
    assert scheduler.last_error == "squeue --noheader --states=all did not finish within 5 s"
    assert len(messages) == 2

    fake.hang.clear()
    await trio.sleep(20)
    assert scheduler.last_error is None
    assert messages[-1][0] is MessageLevel.INFO
    assert model.attr(machine, "machineState") == "UP"


async def test_json_that_fails_falls_back_to_text(nursery, autojump_clock):
    fake = FakeSlurm()

    async def runner(argv, stdin, env):
        if tuple(argv[:2]) == ("sinfo", "--json"):
            return CommandResult(tuple(argv), 0, b"not json", b"")
        return await fake(argv, stdin, env)

    model = Model(IdAllocator(1000))
    scheduler = SlurmScheduler(model, SchedulerOptions(poll_interval=1.0), runner=runner, user="alice")
    await nursery.start(scheduler.run)
    assert len(model.ids(ElementKind.NODE)) == 1
    await trio.sleep(3.5)
    words = [argv[:2] for _, argv in fake.calls if argv[0] == "sinfo" and argv[1] != "--version"]
    assert words and all(w == ("sinfo", "--Node") for w in words)
    assert scheduler.last_error is None


async def test_submit_builds_a_quoted_script_and_shows_the_job_at_once(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    model, scheduler = await start(nursery, fake, spool_dir=str(tmp_path))
    queues = {model.attr(q, "name"): q for q in model.ids(ElementKind.QUEUE)}
    args = ["a b", "$(id) `id` 'q' \"d\"", "x\ny", "-n", ""]
    submission = AttributeSet.parse([
        "jobSubId=s-1", "execPath=/bin/echo", *[f"progArgs={a}" for a in args], "env=GREETING=hi there $(x)",
        "jobNumProcs=2", f"queueId={queues['long']}", "hold=true", "timeLimit=5", "jobName=my job",
    ])
    eid = await scheduler.submit(submission)
    argv = [argv for _, argv in fake.calls if argv[0] == "sbatch"][-1]
    assert argv[:2] == ("sbatch", "--parsable")
    assert {"--partition=long", "--ntasks=2", "--hold", "--time=5", "--job-name=my job"} <= set(argv)
    assert f"--output={tmp_path}/s-1." in next(a for a in argv if a.startswith("--output=")).rsplit(".", 2)[0] + "."
    script = fake.stdin["sbatch"].decode()
    exec_line = [ln for ln in script.splitlines() if ln.startswith("exec ")]
    assert exec_line, script
    # shlex reads the script the way bash does for these quoting forms.
    words = shlex.split(script[script.index("exec "):])
    assert words[words.index("--") + 1:] == ["/bin/echo", *args]
    assert "export GREETING='hi there $(x)'" in script
    assert model.get(eid).parent == queues["long"]
    attrs_ = model.attrs(eid)
    assert attrs_["jobSubId"] == "s-1" and attrs_["jobState"] == "STARTING" and attrs_["jobStatus"] == "PENDING"
    assert attrs_["slurmJobId"] == "101" and attrs_["partition"] == "long"
    (process,) = model.children(eid)
    assert model.attr(process, "processIndex") == "0"

    # The listing confirms it; nothing is added twice.
    fake.jobs["101"] = job("101", "PENDING", partition="long", nodes="", reason="JobHeldUser")
    await trio.sleep(1)
    assert model.ids(ElementKind.JOB) == [eid]
    assert model.attr(eid, "jobStatusMessage") == "JobHeldUser"

    await scheduler.change(eid, AttributeSet.parse(["hold=false"]))
    assert ("scontrol", "release", "101") in [argv for _, argv in fake.calls]
    with pytest.raises(JobError) as refused:
        await scheduler.change(eid, AttributeSet.parse(["timeLimit=10"]))
    assert refused.value.code == ErrorCode.NOT_SUPPORTED
    fake.fail["scontrol"] = "scontrol: error: Job is no longer pending execution for job 101"
    with pytest.raises(JobError) as failed:
        await scheduler.move(eid, queues["debug"])
    assert failed.value.message == "cannot move SLURM job 101 to partition debug: Job is no longer pending execution for job 101"
    assert model.get(eid).parent == queues["long"]


async def test_submit_errors(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    model, scheduler = await start(nursery, fake, spool_dir=str(tmp_path))
    queues = {model.attr(q, "name"): q for q in model.ids(ElementKind.QUEUE)}
    fake.sbatch_error = ("sbatch: error: invalid partition specified: nosuch\n"
                         "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    with pytest.raises(SubmitError) as rejected:
        await scheduler.submit(AttributeSet.parse(["jobSubId=s", "execName=true", "partition=nosuch"]))
    assert rejected.value.message == ("invalid partition specified: nosuch; "
                                      "Batch job submission failed: Invalid partition name specified")
    assert rejected.value.code == ErrorCode.SUBMIT_FAILED
    fake.sbatch_error = None
    bad = [
        (["execName=true"], "jobSubId"),
        (["jobSubId=s"], "no program"),
        (["jobSubId=s", "execName=true", "jobNumProcs=0"], "jobNumProcs"),
        (["jobSubId=s", "execName=true", "env=NOVALUE"], "NAME=VALUE"),
        (["jobSubId=s", "execName=true", "env=1BAD=x"], "1BAD"),
        (["jobSubId=s", "execName=true", "timeLimit=1 hour"], "time limit"),
        (["jobSubId=s", "execName=true", "jobName=two\nlines"], "job_name"),
        (["jobSubId=s", "execName=true", "queueId=424242"], "no queue"),
        (["jobSubId=s", "execName=true", f"queueId={queues['long']}", "partition=debug"], "give one"),
    ]
    for args, fragment in bad:
        with pytest.raises(SubmitError) as refused:
            await scheduler.submit(AttributeSet.parse(args))
        assert fragment in refused.value.message, (args, refused.value.message)
    assert len([argv for _, argv in fake.calls if argv[0] == "sbatch"]) == 1  # refused before sbatch


async def test_output_files_are_followed_line_by_line(nursery, tmp_path):
    fake = FakeSlurm()
    model = Model(IdAllocator(1000))
    scheduler = SlurmScheduler(
        model, SchedulerOptions(poll_interval=0.1), runner=fake, user="alice", spool_dir=str(tmp_path),
        output_interval=0.02, output_drain_grace=0.1, fast_poll_interval=0.05,
    )
    await nursery.start(scheduler.run)
    out = tmp_path / "job.out"
    out.write_text("left from an earlier run\n")
    eid = await scheduler.submit(AttributeSet.parse(
        ["jobSubId=f", "execName=prog", f"stdoutPath={out}", f"stderrPath={tmp_path}/job.err"]))
    (process,) = model.children(eid)
    slurm_id = model.attr(eid, "slurmJobId")
    lines: List[tuple] = []
    original = model.output
    model.output = lambda pid, line, stream="stdout": (lines.append((pid, line, stream)), original(pid, line, stream))
    await trio.sleep(0.3)
    assert lines == []  # the old file is not the job's output
    fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    with out.open("w") as f:  # SLURM truncates the file when the job starts
        f.write("first\nsec")
        f.flush()
        await trio.sleep(0.3)
        assert lines == [(process, "first", "stdout")]
        f.write("ond ✓\nno newline at the end")
    (tmp_path / "job.err").write_text("oops\n")
    await trio.sleep(0.3)
    fake.jobs[slurm_id] = job(slurm_id, "COMPLETED")
    with trio.fail_after(5):
        while ("no newline at the end" not in [l for _, l, _ in lines]):
            await trio.sleep(0.05)
    assert [(l, s) for _, l, s in lines if s == "stdout"] == [("first", "stdout"), ("second ✓", "stdout"),
                                                              ("no newline at the end", "stdout")]
    assert [(l, s) for _, l, s in lines if s == "stderr"] == [("oops", "stderr")]


def test_move_while_a_chunked_snapshot_is_being_sent():
    """The snapshot may be consumed chunk by chunk while the model changes: a job moved
    after its NEW went out but before its process's chunk still reaches the client once,
    in order (REMOVE, NEW job, NEW process)."""
    model, debug, long_ = make_model()
    jobs = [model.add(ElementKind.JOB, debug, {"name": str(i)}) for i in range(3)]
    for jid in jobs:
        model.add(ElementKind.PROCESS, jid, {"processIndex": "0"})
    mirror: Dict[str, tuple] = {}
    chunks = model.snapshot_wire(TID, chunk=1)
    from proxy_agent.model import _typed  # the typed view of wire events

    def take(n):
        for _ in range(n):
            apply_events([_typed(TID, w) for w in next(chunks)], mirror)

    take(2 + 3)  # both queues and the three jobs
    model.move(jobs[0], long_)  # its process has not been sent yet
    model.move(jobs[1], long_)
    for rest in chunks:
        apply_events([_typed(TID, w) for w in rest], mirror)
    apply_events(model.drain(TID), mirror)
    assert mirror == truth(model)
    assert model.children(long_) == jobs[:2]


async def test_spool_files_are_deleted_with_the_job_but_chosen_paths_are_kept(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    spool = tmp_path / "spool"
    model, scheduler = await start(nursery, fake, spool_dir=str(spool), retention=30)
    kept = tmp_path / "mine.out"
    mine = await scheduler.submit(AttributeSet.parse(["jobSubId=mine", "execName=prog", f"stdoutPath={kept}"]))
    ours = await scheduler.submit(AttributeSet.parse(["jobSubId=ours", "execName=prog"]))
    spool_files = scheduler._by_element[ours].spool_files
    assert len(spool_files) == 2 and all(path.startswith(str(spool) + "/ours.") for path in spool_files)
    assert scheduler._by_element[mine].spool_files == ()
    for eid in (mine, ours):
        slurm_id = model.attr(eid, "slurmJobId")
        fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    await trio.sleep(1.5)
    # SLURM writes the files; the agent follows them
    kept.write_text("mine\n")
    for path in spool_files:
        with open(path, "w") as f:
            f.write("ours\n")
    for eid in (mine, ours):
        slurm_id = model.attr(eid, "slurmJobId")
        fake.jobs[slurm_id] = job(slurm_id, "COMPLETED")
    await trio.sleep(5)
    assert mine in model and ours in model
    await trio.sleep(40)
    assert mine not in model and ours not in model
    assert kept.exists()
    assert [p for p in spool.iterdir()] == []
