"""The SLURM backend without a cluster: listing diffs, mappings, output files, and the backend
in a job service driven by a scripted stand-in for SLURM's commands."""

from __future__ import annotations

import gc
import importlib.util
import shlex
from pathlib import Path
from typing import Dict, List, Optional

import attrs
import hypothesis.strategies as st
import pytest
import trio
from hypothesis import given, settings

from proxy_agent.frontends.ptp import mapping
from proxy_agent.protocol.attributes import AttributeRegistry, AttrType, decode_attr_defs, encode_attr_defs
from proxy_agent.protocol.messages import (
    ElementChange,
    ElementKind,
    ErrorCode,
    NewElements,
    ProcessChange,
    RemoveElements,
)
from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.batch.engine import BatchBackend
from proxy_agent.schedulers.common import LineSplitter
from proxy_agent.schedulers.batch.engine import CommandResult, JobTable
from proxy_agent.schedulers.batch.slurm.backend import (
    SlurmBackend,
    SlurmOptions,
    job_attributes,
    node_attributes,
    partition_attributes,
    process_attributes,
)
from proxy_agent.schedulers.batch.slurm.system import clean_message, expand_output_pattern, first_host, native_job, native_word
from proxy_agent.schedulers.batch.slurm.parse import SlurmJob
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, SubmitError
from proxy_agent.service.model import K, Kind, ServiceModel
from test_state_tables import SLURM_PTP_STATES
from service_fixtures import Harness, element_refs, start_backend
from wait_support import wait_until

DATA = Path(__file__).parent / "data" / "slurm"
REAL = DATA / "22.05.8"


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


def listed(job_id: str, state: str = "RUNNING", **fields):
    """A job as the engine's job table sees it."""
    return native_job(job(job_id, state, **fields))


# ------------------------------------------------------------------------------------ JobTable


def test_table_reports_added_changed_and_gone():
    table = JobTable()
    first = table.apply([listed("1"), listed("2", "PENDING", nodes="")], 0)
    assert [j.job_id for j in first.added] == ["1", "2"] and not first.changed and not first.gone
    assert not table.apply([listed("1"), listed("2", "PENDING", nodes="")], 0)

    started = listed("2", "RUNNING")
    second = table.apply([listed("1"), started, listed("3")], 0)
    assert [j.job_id for j in second.added] == ["3"]
    assert second.changed == [started]
    assert second.gone == []

    third = table.apply([listed("3")], 0)
    assert sorted(third.gone) == ["1", "2"]
    assert third.gone and not third.added and not third.changed
    assert "1" not in table and not table.apply([listed("3")], 0)  # reported once


def test_running_clock_alone_is_no_change():
    table = JobTable()
    table.apply([listed("1", time_used="0:05")], 0)
    assert not table.apply([listed("1", time_used="0:06")], 0)
    assert table.record("1").time_used == 6  # the latest record is kept for refreshes


def test_expected_job_is_not_gone_in_a_listing_that_started_before_it():
    table = JobTable()
    table.apply([], generation=1)
    table.expect("7", generation=2)  # submitted while listing 2 was running
    assert table.apply([], generation=2).gone == []
    assert table.apply([], generation=3).gone == ["7"]

    table.expect("8", generation=3)
    changes = table.apply([listed("8", "PENDING")], generation=4)
    assert changes.added == [] and changes.changed == [listed("8", "PENDING")]
    assert table.apply([], generation=4).gone == ["8"]  # once listed, absence counts


def test_retired_job_is_not_added_again_while_listed():
    table = JobTable()
    table.apply([listed("1", "COMPLETED")], 0)
    table.retire("1")
    assert not table.apply([listed("1", "COMPLETED")], 0)
    assert not table.apply([], 0)  # purged by SLURM: forgotten
    again = table.apply([listed("1", "PENDING")], 0)  # the id is reused much later
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
        changes = table.apply([listed(i, s) for i, s in states.items()], 0)
        for added in changes.added:
            assert added.job_id not in mirror
            mirror[added.job_id] = added.native_state
        for current in changes.changed:
            assert mirror[current.job_id] != current.native_state
            mirror[current.job_id] = current.native_state
        for gone in changes.gone:
            del mirror[gone]
        assert mirror == states


# ------------------------------------------------------------------------------------ mappings


def test_job_and_process_attributes():
    failed = job("5", "FAILED", exit_code="3:0", reason="NonZeroExitCode")
    attrs_ = job_attributes(failed)
    assert attrs_[K.STATE] == "FAILED" and attrs_[K.NATIVE_STATE] == "FAILED"
    assert attrs_[K.EXIT_CODE] == "3" and attrs_[K.SIGNAL] == "" and attrs_[K.MESSAGE] == "NonZeroExitCode"
    assert attrs_[K.NATIVE_ID] == "5" and attrs_[K.USER] == "alice" and attrs_[K.HOSTS] == "vm"
    assert attrs_[K.TIME_LIMIT] == "600" and attrs_[K.NUM_PROCS] == "1"
    assert process_attributes(failed, 42) == {
        K.STATE: "FAILED", K.NATIVE_STATE: "FAILED", K.NODE: 42, K.EXIT_CODE: "3",
    }
    killed = process_attributes(job("6", "CANCELLED", exit_code="0:9"))
    assert killed[K.STATE] == "KILLED"
    assert killed[K.EXIT_CODE] == "137" and killed[K.SIGNAL] == "SIGKILL"
    running = job_attributes(job("7", "RUNNING"))
    assert running[K.STATE] == "RUNNING" and running[K.EXIT_CODE] == ""
    # no task count from SLURM (pending without --ntasks): process 0 still has a count to be in
    assert job_attributes(job("8", "PENDING", num_tasks=None, nodes=""))[K.NUM_PROCS] == "1"
    assert job_attributes(job("8", "CANCELLED", num_tasks=4294967294, nodes=""))[K.NUM_PROCS] == "1"
    assert job_attributes(job("9", "RUNNING", num_tasks=4))[K.NUM_PROCS] == "4"
    pending = job_attributes(job("8", "PENDING", nodes="", reason="Priority"))
    assert pending[K.STATE] == "QUEUING" and pending[K.NATIVE_STATE] == "PENDING"
    assert job_attributes(job("9", "SUSPENDED"))[K.STATE] == "SUSPENDED"
    assert job_attributes(job("10", "CD"))[K.NATIVE_STATE] == "COMPLETED"  # compact codes spelled out
    odd = job_attributes(job("11", "SOMETHING_NEW"))
    assert odd[K.STATE] == "OTHER" and odd[K.NATIVE_STATE] == "SOMETHING_NEW"  # kept, never an error


@pytest.mark.parametrize("reason", ["JobHeldUser", "JobHeldAdmin"])
def test_a_held_job_is_hold(reason):
    """SLURM lists a held job as PENDING with the hold as its reason."""
    held = job("12", "PENDING", nodes="", reason=reason)
    assert job_attributes(held)[K.STATE] == "HOLD"
    assert job_attributes(held)[K.NATIVE_STATE] == "PENDING" and job_attributes(held)[K.MESSAGE] == reason
    assert process_attributes(held)[K.STATE] == "HOLD"
    assert job_attributes(job("13", "PENDING", nodes="", reason="BeginTime"))[K.STATE] == "QUEUING"
    assert job_attributes(job("14", "RUNNING", reason=reason))[K.STATE] == "RUNNING"


def test_recorded_nodes_and_partitions():
    drained = sp.parse_nodes_json((REAL / "sinfo-drain.json").read_text())
    attrs_ = node_attributes(drained[0])
    assert attrs_[K.STATE] == "DOWN" and "DRAIN" in attrs_[K.NATIVE_STATE]
    assert attrs_[K.REASON]
    (up,) = sp.parse_nodes_json((REAL / "sinfo.json").read_text())
    assert node_attributes(up)[K.STATE] == "UP"
    assert node_attributes(up)[K.CPUS] == str(up.cpus)
    assert node_attributes(up)[K.QUEUES] == ",".join(up.partitions) and "debug" in up.partitions

    parts = {p.name: partition_attributes(p)
             for p in sp.parse_scontrol_partitions((REAL / "scontrol-partitions.txt").read_text())}
    assert parts["debug"][K.STATE] == "NORMAL" and parts["debug"][K.DEFAULT] == "true"
    assert parts["debug"][K.MAX_NODES] == "" and parts["long"][K.DEFAULT] == "false"  # "": unlimited
    assert parts["debug"][K.MAX_TIME] == "3600" and parts["long"][K.MAX_TIME] == str(24 * 3600)
    assert parts["debug"][K.DEFAULT_TIME] == "600" and parts["debug"][K.TOTAL_SLOTS] == "2"
    down = sp.parse_scontrol_partitions((REAL / "scontrol-partitions-down.txt").read_text())
    assert any(partition_attributes(p)[K.STATE] == "STOPPED" for p in down)


def test_recorded_listing_maps_every_job():
    jobs = sp.parse_squeue_text((REAL / "squeue.txt").read_text())
    table = JobTable()
    assert len(table.apply(map(native_job, jobs), 0).added) == len(jobs) > 5
    for record in jobs:
        attrs_ = job_attributes(record)
        state = JobState(attrs_[K.STATE])
        assert state is not JobState.OTHER
        name = native_word(record.state)
        assert mapping.PTP_JOB_STATE[state.value] == SLURM_PTP_STATES[name]
        assert attrs_[K.NATIVE_STATE] == name


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


# ------------------------------------------------------------------------------------ scale


def test_parse_and_diff_of_100k_jobs_run_no_garbage_collection():
    """The per-poll work on a 100,000-job cluster: parse the listing into the engine's
    records, diff it with the last.  What keeps the diff fast at that size: the garbage
    collector is held off while it runs (each collection would walk the records it makes).  How fast it is
    (target 1 s for both) is measured by scripts/bench_slurm_parse.py.
    """
    text = load_make_large().squeue_text(100_000)
    jobs = [native_job(j) for j in sp.parse_squeue_text(text)]
    table = JobTable()
    collections: List[int] = []

    def collection(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(collection)
    try:
        first = table.apply(jobs, 0)
        in_first = list(collections)
        again = sp.parse_squeue_text(text)
        changed = [native_job(attrs.evolve(j, state="COMPLETED") if i % 100 == 0 else j) for i, j in enumerate(again)]
        del collections[:]
        steady = table.apply(changed, 0)
        in_steady = list(collections)
    finally:
        gc.callbacks.remove(collection)
    assert len(first.added) == 100_000
    assert len(steady.changed) == sum(1 for j in again[::100] if j.state != "COMPLETED")
    # (one young collection may start as the diff begins, before it holds the collector off;
    # left on, the collector runs about 140 times in the first diff)
    assert len(in_first) <= 1 and len(in_steady) <= 1


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


async def start(nursery, fake: FakeSlurm, **kwargs) -> Harness:
    kwargs.setdefault("user", "alice")
    backend = SlurmBackend(ServiceModel(), SlurmOptions(poll_interval=1.0), runner=fake, **kwargs)
    return await start_backend(nursery, backend)


def job_element(model: ServiceModel, slurm_id: str) -> int:
    (found,) = [e for e in model.keys(Kind.JOB) if model.attr(e, K.NATIVE_ID) == slurm_id]
    return found


def queues_of(slurm: Harness) -> Dict[str, int]:
    return {slurm.model.attr(q, K.NAME): q for q in slurm.model.keys(Kind.QUEUE)}


async def test_fill_and_poll_only_differences(nursery, autojump_clock):
    fake = FakeSlurm()
    fake.jobs = {"1": job("1", "RUNNING"), "2": job("2", "PENDING", nodes="", partition="long"),
                 "3": job("3", "COMPLETED")}
    slurm = await start(nursery, fake)
    model = slurm.model
    (machine,) = model.keys(Kind.MACHINE)
    assert model.attr(machine, K.NAME) == "fakecluster" and model.attr(machine, K.VERSION) == "22.05.8"
    assert model.attr(machine, K.BACKEND) == "slurm"
    assert isinstance(slurm.backend, BatchBackend)  # SLURM runs on the batch engine
    (node,) = model.keys(Kind.NODE)
    assert model.attr(node, K.STATE) == "UP" and model.attr(machine, K.STATE) == "UP"
    queues = queues_of(slurm)
    assert set(queues) == {"debug", "long"}
    assert slurm.service.default_queue() == (slurm.backend, queues["debug"])
    assert model.get(job_element(model, "2")).parent == queues["long"]
    assert model.attr(job_element(model, "2"), K.QUEUE) == queues["long"]
    running = job_element(model, "1")
    (process,) = model.processes(running)
    assert model.attr(process, K.NODE) == node and model.get(process).rank == 0
    assert model.attr(job_element(model, "3"), K.STATE) == "FINISHED"
    # as the client was sent them
    assert slurm.ptp(running)["jobNativeState"] == "RUNNING" and slurm.ptp(running)["nativeId"] == "1"
    assert slurm.ptp(process)["processNodeId"] == slurm.client.id(node)
    assert slurm.ptp(job_element(model, "3"))["jobState"] == "COMPLETED"
    definitions = mapping.attribute_definitions(slurm.service.attributes(), slurm.client.id(queues["debug"]))
    AttributeRegistry(definitions)  # no id twice
    assert decode_attr_defs(encode_attr_defs(definitions)) == definitions
    by_id = {d.id: d for d in definitions}
    partition = by_id["partition"]
    assert partition.type is AttrType.ENUMERATED
    assert partition.values == ("debug", "long") and partition.default == "debug"
    assert by_id["queueId"].default == slurm.client.id(queues["debug"])
    for key in ("hold", "nodes", "cpusPerTask", "memory", "timeLimit", "account", "beginTime",
                "stdoutPath", "stderrPath", "jobName", "nativeId", "nativeState", "jobNativeState", "cpus",
                "queues", "reason", "maxTime"):
        assert key in by_id, key
    assert ("sinfo", "--json") in [argv for _, argv in fake.calls]  # JSON where 22.05 has it

    slurm.sync()
    fake.jobs["2"] = job("2", "RUNNING", partition="long")
    fake.jobs["1"] = job("1", "RUNNING", time_used="0:09")  # only the clock moved
    await trio.sleep(1.5)
    events = slurm.sync()
    changed = {ref for e in events if isinstance(e, (ElementChange, ProcessChange)) for ref in element_refs(e)}
    second = job_element(model, "2")
    queue_refs = {slurm.client.id(q) for q in queues.values()}
    assert changed - queue_refs == {slurm.client.id(second), slurm.client.id(model.processes(second)[0])}
    assert changed & queue_refs == {slurm.client.id(queues["long"])}  # its waiting and running figures
    assert model.attr(queues["long"], K.WAITING) == "0" and model.attr(queues["long"], K.RUNNING) == "1"
    assert slurm.ptp(second)["jobState"] == "RUNNING"

    # A job moved to another partition outside the agent follows in the model.
    fake.jobs["1"] = job("1", "RUNNING", partition="long")
    await trio.sleep(1.5)
    assert model.get(running).parent == queues["long"] and model.attr(running, K.QUEUE) == queues["long"]
    events = slurm.sync()
    assert [type(e) for e in events if getattr(e, "kind", None) is ElementKind.JOB] == [RemoveElements, NewElements]
    assert slurm.mirror.elements[slurm.client.id(running)][1] == slurm.client.id(queues["long"])


async def test_vanished_jobs_get_a_final_state_and_are_retired(nursery, autojump_clock):
    fake = FakeSlurm()
    fake.jobs = {str(i): job(str(i), "RUNNING") for i in (1, 2, 3)}
    slurm = await start(nursery, fake, retention=30)
    model = slurm.model
    elements = {i: job_element(model, i) for i in ("1", "2", "3")}
    fake.details["1"] = job("1", "COMPLETED", exit_code="0:0")
    line = sp.FIELD_SEP.join(["2", "2", "alice(1000)", "", "debug", "FAILED", "", "vm", "1", "1", "",
                              "00:00:07", "10", "2:0", "", "", "", "/w", "job2"]) + "\n"
    fake.sacct = line
    fake.jobs = {}
    await trio.sleep(1.5)
    assert model.attr(elements["1"], K.STATE) == "FINISHED"
    assert model.attr(elements["1"], K.EXIT_CODE) == "0"
    assert model.attr(elements["2"], K.STATE) == "FAILED" and model.attr(elements["2"], K.EXIT_CODE) == "2"
    (process,) = model.processes(elements["2"])
    assert model.attr(process, K.EXIT_CODE) == "2" and model.attr(process, K.STATE) == "FAILED"
    assert any(argv[0] == "sacct" and "--completion" in argv for _, argv in fake.calls)
    # looked up together: scontrol job by job, then one sacct for those it no longer knows
    sacct = [argv for _, argv in fake.calls if argv[0] == "sacct"]
    assert len(sacct) == 1 and "--jobs=2,3" in sacct[0]
    assert sorted(argv[4] for _, argv in fake.calls if argv[:4] == ("scontrol", "--oneliner", "show", "job")) == [
        "1", "2", "3"]
    assert model.attr(elements["3"], K.STATE) == "DELETED"
    assert model.attr(elements["3"], K.NATIVE_STATE) == "UNKNOWN"
    assert "no longer lists" in model.attr(elements["3"], K.MESSAGE)
    slurm.sync()
    assert {slurm.ptp(e)["jobState"] for e in elements.values()} == {"COMPLETED"}
    await trio.sleep(31)
    assert not any(e in model for e in elements.values())
    assert model.keys(Kind.JOB) == []
    slurm.sync()
    assert not any(kind is ElementKind.JOB for kind, _ in slurm.mirror.structure().values())


async def test_failing_and_hanging_commands_are_reported_and_retried(nursery, autojump_clock):
    fake = FakeSlurm()
    slurm = await start(nursery, fake, command_timeout=5, max_backoff=8)
    backend, model, messages = slurm.backend, slurm.model, slurm.notices
    fake.fail["squeue"] = "squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    await trio.sleep(40)
    assert backend.last_error == "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    assert len(messages) == 1 and messages[0][0] == "ERROR"
    assert "Unable to contact slurm controller" in messages[0][1]
    (machine,) = model.keys(Kind.MACHINE)
    assert model.attr(machine, K.STATE) == "ERROR"
    times = fake.command_times("squeue")
    gaps = [round(b - a) for a, b in zip(times, times[1:])]
    assert gaps[:5] == [1, 1, 2, 4, 8] and max(gaps) == 8  # the usual interval, then exponential, capped

    del fake.fail["squeue"]
    fake.hang.add("squeue")
    await trio.sleep(30)
    assert backend.last_error == "squeue --noheader --states=all did not finish within 5 s"
    assert len(messages) == 2

    fake.hang.clear()
    await trio.sleep(20)
    assert backend.last_error is None
    assert messages[-1] == ("INFO", "SLURM answers again")
    assert model.attr(machine, K.STATE) == "UP"
    slurm.sync()
    assert slurm.ptp(machine)["machineState"] == "UP"


async def test_a_slurm_that_cannot_be_used_fails_to_start(nursery, autojump_clock):
    async def missing(argv, stdin, env):
        raise FileNotFoundError(argv[0])

    backend = SlurmBackend(ServiceModel(), SlurmOptions(poll_interval=1.0), runner=missing, user="alice")
    with pytest.raises(ServiceError, match="cannot use SLURM on this machine: sinfo: command not found") as info:
        await nursery.start(backend.run)
    assert info.value.kind is ErrorKind.UNAVAILABLE


async def test_json_that_fails_falls_back_to_text(nursery, autojump_clock):
    fake = FakeSlurm()

    async def runner(argv, stdin, env):
        if tuple(argv[:2]) == ("sinfo", "--json"):
            return CommandResult(tuple(argv), 0, b"not json", b"")
        return await fake(argv, stdin, env)

    model = ServiceModel()
    backend = SlurmBackend(model, SlurmOptions(poll_interval=1.0), runner=runner, user="alice")
    await nursery.start(backend.run)
    assert len(model.keys(Kind.NODE)) == 1
    await trio.sleep(3.5)
    words = [argv[:2] for _, argv in fake.calls if argv[0] == "sinfo" and argv[1] != "--version"]
    assert words and all(w == ("sinfo", "--Node") for w in words)
    assert backend.last_error is None


async def test_submit_builds_a_quoted_script_and_shows_the_job_at_once(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    slurm = await start(nursery, fake, spool_dir=str(tmp_path))
    model = slurm.model
    queues = queues_of(slurm)
    args = ["a b", "$(id) `id` 'q' \"d\"", "x\ny", "-n", ""]
    eid = await slurm.submit_ptp([
        "jobSubId=s-1", "execPath=/bin/echo", *[f"progArgs={a}" for a in args], "env=GREETING=hi there $(x)",
        "jobNumProcs=2", f"queueId={slurm.client.id(queues['long'])}", "hold=true", "timeLimit=5",
        "jobName=my job",
    ])
    argv = [argv for _, argv in fake.calls if argv[0] == "sbatch"][-1]
    assert argv[:2] == ("sbatch", "--parsable")
    assert {"--partition=long", "--ntasks=2", "--hold", "--time=00:05:00", "--job-name=my job"} <= set(argv)
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
    assert attrs_[K.CLIENT_REF] == "s-1" and attrs_[K.STATE] == "HOLD" and attrs_[K.NATIVE_STATE] == "PENDING"
    assert attrs_[K.NATIVE_ID] == "101" and attrs_[K.QUEUE] == queues["long"]
    assert attrs_[K.ARGUMENTS] == tuple(args) and attrs_[K.NUM_PROCS] == "2"
    (process,) = model.processes(eid)
    assert model.get(process).rank == 0
    slurm.sync()
    assert slurm.ptp(eid)["jobSubId"] == "s-1" and slurm.ptp(eid)["jobState"] == "STARTING"
    assert slurm.ptp(eid)["jobStatus"] == "HOLD"

    # The listing confirms it; nothing is added twice.
    fake.jobs["101"] = job("101", "PENDING", partition="long", nodes="", reason="JobHeldUser")
    await trio.sleep(1)
    assert model.keys(Kind.JOB) == [eid]
    assert model.attr(eid, K.MESSAGE) == "JobHeldUser"
    assert model.attr(eid, K.STATE) == "HOLD"  # still held, as SLURM says

    await slurm.change_ptp(eid, ["hold=false"])
    assert ("scontrol", "release", "101") in [argv for _, argv in fake.calls]
    with pytest.raises(JobError) as refused:
        await slurm.change_ptp(eid, ["timeLimit=10"])
    assert refused.value.kind is ErrorKind.NOT_SUPPORTED
    assert mapping.error_code(refused.value.kind) == ErrorCode.NOT_SUPPORTED
    fake.fail["scontrol"] = "scontrol: error: Job is no longer pending execution for job 101"
    with pytest.raises(JobError) as failed:
        await slurm.service.move(eid, queues["debug"])
    assert failed.value.message == ("cannot move SLURM job 101 to partition debug: "
                                    "Job is no longer pending execution for job 101")
    assert failed.value.kind is ErrorKind.OPERATION_FAILED
    assert model.get(eid).parent == queues["long"]
    with pytest.raises(JobError, match="cannot hold SLURM job 101: Job is no longer pending"):
        await slurm.change_ptp(eid, ["hold=true"])
    fake.fail["scancel"] = "scancel: error: Kill job error on job id 101: Access/permission denied"
    with pytest.raises(JobError, match="cannot cancel SLURM job 101: Kill job error") as failed:
        await slurm.service.terminate(eid)
    assert failed.value.kind is ErrorKind.OPERATION_FAILED
    del fake.fail["scontrol"]
    await slurm.service.move(eid, "debug")
    assert ("scontrol", "update", "JobId=101", "Partition=debug") in [argv for _, argv in fake.calls]
    assert model.get(eid).parent == queues["debug"] and model.attr(eid, K.QUEUE) == queues["debug"]


async def test_submit_errors(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    slurm = await start(nursery, fake, spool_dir=str(tmp_path))
    queues = queues_of(slurm)
    fake.sbatch_error = ("sbatch: error: invalid partition specified: nosuch\n"
                         "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    with pytest.raises(SubmitError) as rejected:
        await slurm.submit_ptp(["jobSubId=s", "execName=true", "partition=debug"])
    assert rejected.value.message == ("invalid partition specified: nosuch; "
                                      "Batch job submission failed: Invalid partition name specified")
    assert rejected.value.kind is ErrorKind.SUBMIT_FAILED
    assert mapping.error_code(rejected.value.kind) == ErrorCode.SUBMIT_FAILED
    assert slurm.model.count(Kind.JOB) == 0
    fake.sbatch_error = None
    bad = [
        (["execName=true"], "jobSubId", ErrorKind.BAD_REQUEST),
        (["jobSubId=s"], "no executable given", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "jobNumProcs=0"], "jobNumProcs", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "env=NOVALUE"], "NAME=VALUE", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "env=1BAD=x"], "1BAD", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "timeLimit=1 hour"], "timeLimit", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "memory=lots"], "memory", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "jobName=two\nlines"], "job_name", ErrorKind.BAD_REQUEST),
        (["jobSubId=s", "execName=true", "queueId=424242"], "no queue", ErrorKind.NO_SUCH_QUEUE),
        (["jobSubId=s", "execName=true", "partition=nosuch"], "no queue named 'nosuch'", ErrorKind.NO_SUCH_QUEUE),
        (["jobSubId=s", "execName=true", f"queueId={slurm.client.id(queues['long'])}", "partition=debug"],
         "give one", ErrorKind.BAD_REQUEST),
    ]
    for args, fragment, kind in bad:
        with pytest.raises(ServiceError) as refused:
            await slurm.submit_ptp(args)
        assert fragment in refused.value.message, (args, refused.value.message)
        assert refused.value.kind is kind, (args, refused.value.kind)
    assert len([argv for _, argv in fake.calls if argv[0] == "sbatch"]) == 1  # refused before sbatch
    # the same queue twice is no conflict
    eid = await slurm.submit_ptp(["jobSubId=s", "execName=true", f"queueId={slurm.client.id(queues['long'])}",
                                  "partition=long"])
    assert slurm.model.get(eid).parent == queues["long"]


async def test_submitted_through_the_service_without_a_client(nursery, autojump_clock, tmp_path):
    """A job described neutrally (no PTP attributes) gets the batch settings it names."""
    fake = FakeSlurm()
    slurm = await start(nursery, fake, spool_dir=str(tmp_path))
    spec = JobSpec("/bin/hostname", num_procs=4, queue="slurm:long", name="neutral", wall_time=90 * 60,
                   memory=2048, nodes=2, cpus_per_task=3, account="proj", begin_time="now+1hour")
    eid = await slurm.service.submit(spec)
    argv = set([argv for _, argv in fake.calls if argv[0] == "sbatch"][-1])
    assert {"--partition=long", "--ntasks=4", "--time=01:30:00", "--mem=2048", "--nodes=2",
            "--cpus-per-task=3", "--account=proj", "--begin=now+1hour", "--job-name=neutral"} <= argv
    assert slurm.model.attr(eid, K.STATE) == "QUEUING" and slurm.model.attr(eid, K.NAME) == "neutral"


async def test_output_files_are_followed_line_by_line(nursery, tmp_path):
    fake = FakeSlurm()
    backend = SlurmBackend(
        ServiceModel(), SlurmOptions(poll_interval=0.1), runner=fake, user="alice", spool_dir=str(tmp_path),
        output_interval=0.02, output_drain_grace=0.1, fast_poll_interval=0.05,
    )
    slurm = await start_backend(nursery, backend)
    model = slurm.model
    out = tmp_path / "job.out"
    out.write_text("left from an earlier run\n")
    eid = await slurm.submit_ptp(
        ["jobSubId=f", "execName=prog", f"stdoutPath={out}", f"stderrPath={tmp_path}/job.err"])
    (process,) = model.processes(eid)
    slurm_id = model.attr(eid, K.NATIVE_ID)

    def lines(stream: str) -> List[str]:
        slurm.sync()
        return slurm.output(process, stream)

    polls = len(fake.command_times("squeue"))
    await wait_until(lambda: len(fake.command_times("squeue")) >= polls + 3, what="three polls of the pending job")
    assert lines("stdout") == []  # the old file is not the job's output
    fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    with out.open("w") as f:  # SLURM truncates the file when the job starts
        f.write("first\nsec")
        f.flush()
        assert await wait_until(lambda: lines("stdout"), what="the first line") == ["first"]
        f.write("ond ✓\nno newline at the end")
    (tmp_path / "job.err").write_text("oops\n")
    # followed while the job runs: every whole line before the job ends
    await wait_until(lambda: lines("stdout") == ["first", "second ✓"] and lines("stderr") == ["oops"],
                     what="the whole lines while the job runs")
    fake.jobs[slurm_id] = job(slurm_id, "COMPLETED")
    await wait_until(lambda: "no newline at the end" in lines("stdout"), what="the last line once the job ended")
    assert lines("stdout") == ["first", "second ✓", "no newline at the end"]
    assert lines("stderr") == ["oops"]


async def test_spool_files_are_deleted_with_the_job_but_chosen_paths_are_kept(nursery, autojump_clock, tmp_path):
    fake = FakeSlurm()
    spool = tmp_path / "spool"
    slurm = await start(nursery, fake, spool_dir=str(spool), retention=30)
    model, backend = slurm.model, slurm.backend
    kept = tmp_path / "mine.out"
    mine = await slurm.submit_ptp(["jobSubId=mine", "execName=prog", f"stdoutPath={kept}"])
    ours = await slurm.submit_ptp(["jobSubId=ours", "execName=prog"])
    spool_files = backend._by_element[ours].spool_files
    assert len(spool_files) == 2 and all(path.startswith(str(spool) + "/ours.") for path in spool_files)
    assert backend._by_element[mine].spool_files == ()
    for eid in (mine, ours):
        slurm_id = model.attr(eid, K.NATIVE_ID)
        fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    await trio.sleep(1.5)
    # SLURM writes the files; the agent follows them
    kept.write_text("mine\n")
    for path in spool_files:
        with open(path, "w") as f:
            f.write("ours\n")
    for eid in (mine, ours):
        slurm_id = model.attr(eid, K.NATIVE_ID)
        fake.jobs[slurm_id] = job(slurm_id, "COMPLETED")
    await trio.sleep(5)
    assert mine in model and ours in model
    slurm.sync()
    assert slurm.output(model.processes(mine)[0]) == ["mine"]
    assert slurm.output(model.processes(ours)[0]) == ["ours"]
    assert slurm.output(model.processes(ours)[0], "stderr") == ["ours"]
    await trio.sleep(40)
    assert mine not in model and ours not in model
    assert kept.exists()
    assert [p for p in spool.iterdir()] == []


async def test_jobs_of_other_backends_are_not_this_ones(nursery, autojump_clock):
    fake = FakeSlurm()
    slurm = await start(nursery, fake)
    with pytest.raises(JobError, match="not a SLURM job") as info:
        await slurm.backend.terminate(424242)
    assert info.value.kind is ErrorKind.NO_SUCH_JOB


async def test_time_used_is_refreshed_once_a_minute(nursery, autojump_clock):
    """The running clock alone changes nothing at each poll; it is brought up to date once a
    minute, together for every job."""
    fake = FakeSlurm()
    fake.jobs = {"1": job("1", "RUNNING", time_used="0:05")}
    slurm = await start(nursery, fake)
    model = slurm.model
    element = job_element(model, "1")
    assert model.attr(element, K.TIME_USED) == "5"
    slurm.sync()
    for seconds in range(6, 50, 2):
        fake.jobs["1"] = job("1", "RUNNING", time_used=f"0:{seconds:02d}")
        await trio.sleep(2)
    assert model.attr(element, K.TIME_USED) == "5"
    assert not [e for e in slurm.sync() if isinstance(e, ElementChange) and e.kind is ElementKind.JOB]
    await trio.sleep(20)
    assert model.attr(element, K.TIME_USED) == "48"
    assert [e for e in slurm.sync() if isinstance(e, ElementChange) and e.kind is ElementKind.JOB]


async def test_a_spool_directory_with_a_percent_sign_is_taken_literally(nursery, autojump_clock, tmp_path):
    """sbatch would expand ``%x`` in a file name: the agent's own files have it doubled."""
    fake = FakeSlurm()
    spool = tmp_path / "50%x"
    slurm = await start(nursery, fake, spool_dir=str(spool), retention=5)
    eid = await slurm.submit_ptp(["jobSubId=pct", "execName=prog"])
    argv = [argv for _, argv in fake.calls if argv[0] == "sbatch"][-1]
    output = next(a for a in argv if a.startswith("--output="))
    assert output.startswith(f"--output={tmp_path}/50%%x/pct.")
    tracked = slurm.backend._by_element[eid]
    assert all(path.startswith(f"{spool}/pct.") for path in tracked.spool_files)
    assert tracked.paths["stdout"] == tracked.spool_files[0]
    slurm_id = slurm.model.attr(eid, K.NATIVE_ID)
    fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    await trio.sleep(1.5)
    with open(tracked.spool_files[0], "w") as f:
        f.write("written where sbatch was told\n")
    fake.jobs[slurm_id] = job(slurm_id, "COMPLETED")
    await trio.sleep(3)
    slurm.sync()
    assert slurm.output(slurm.model.processes(eid)[0]) == ["written where sbatch was told"]
    await trio.sleep(10)
    assert list(spool.iterdir()) == []
