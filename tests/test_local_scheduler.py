"""The local scheduler: real processes, run in-process against a Model."""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Tuple

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.model import Model
from proxy_agent.protocol.attributes import A, AttributeRegistry, AttributeSet, AttrType
from proxy_agent.protocol.ids import IdAllocator
from proxy_agent.protocol.messages import AttrDef, ElementKind, ErrorCode, ProcessChange
from proxy_agent.schedulers.base import JobError, SchedulerOptions, SubmitError
from proxy_agent.schedulers.local import MAX_PROCS, LineSplitter, LocalScheduler

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and process groups")

SH = "/bin/sh"
TIMEOUT = 10


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def model() -> Model:
    return Model(IdAllocator(base_id=100))


@pytest.fixture
async def local(nursery, model):
    scheduler = LocalScheduler(model, SchedulerOptions(kill_grace=0.3))
    await nursery.start(scheduler.run)
    yield scheduler
    await scheduler.aclose()


def job_attrs(*pairs: Tuple[str, str], sub_id: Optional[str] = "sub-1") -> AttributeSet:
    items = [(A.JOB_SUB_ID, sub_id)] if sub_id is not None else []
    return AttributeSet(items + list(pairs))


def shell(script: str, *more: Tuple[str, str]) -> AttributeSet:
    """A job running ``/bin/sh -c script`` as the user's program."""
    return job_attrs((A.EXEC_PATH, SH), (A.PROG_ARGS, "-c"), (A.PROG_ARGS, script), *more)


async def wait_for(predicate, timeout: float = TIMEOUT) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


async def running(model: Model, job_id: int) -> None:
    await wait_for(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")


async def completed(model: Model, job_id: int, timeout: float = TIMEOUT) -> Dict[str, object]:
    await wait_for(lambda: model.attr(job_id, A.JOB_STATE) == "COMPLETED", timeout)
    return model.attrs(job_id)


class Output:
    """Process output collected from drained events."""

    def __init__(self) -> None:
        self.lines: Dict[Tuple[int, str], List[str]] = {}

    def collect(self, events) -> None:
        for event in events:
            if not isinstance(event, ProcessChange):
                continue
            for group in event.groups:
                for key, value in group.attributes:
                    if key in (A.PROCESS_STDOUT, A.PROCESS_STDERR):
                        for pid in group.ids:
                            self.lines.setdefault((pid, key), []).append(value)

    def of(self, pid: int, key: str = A.PROCESS_STDOUT) -> List[str]:
        return self.lines.get((pid, key), [])


def drained_output(model: Model) -> Output:
    out = Output()
    out.collect(model.drain(7))
    return out


def proc_stat(pid: int) -> Tuple[str, int]:
    """(state letter, process group) of a live process from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its parent (orphans are reaped by init, at its own pace)."""
    try:
        return proc_stat(pid)[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def live_members(pgid: int) -> List[int]:
    """Processes of group ``pgid`` that are neither gone nor zombies."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                state, group = proc_stat(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if group == pgid and state != "Z":
                members.append(int(entry))
    return members


def processes(model: Model, job_id: int) -> List[int]:
    return model.children(job_id, ElementKind.PROCESS)


def pid_of(model: Model, process_id: int) -> int:
    return int(model.attr(process_id, A.PROCESS_PID))


# --------------------------------------------------------------------------- the model


async def test_model_is_this_host(local, model):
    [machine] = model.ids(ElementKind.MACHINE)
    [node] = model.ids(ElementKind.NODE)
    [queue] = model.ids(ElementKind.QUEUE)
    assert model.attrs(machine) == {"name": local.hostname, "machineState": "UP", "numNodes": "1"}
    node_attrs = model.attrs(node)
    assert node_attrs["name"] == local.hostname
    assert node_attrs["nodeState"] == "UP" and node_attrs["nodeNumber"] == "0"
    assert int(node_attrs["cpus"]) >= 1
    assert model.get(node).parent == machine
    assert model.attrs(queue) == {"name": "default", "queueState": "NORMAL"}


def test_attribute_definitions(model):
    defs = LocalScheduler(model, SchedulerOptions()).attribute_definitions()
    registry = AttributeRegistry(defs)  # no id twice
    for attr_id in (A.JOB_STATE, A.PROCESS_PID, A.NODE_STATE):
        assert attr_id in registry
    assert registry.get(A.PROG_ARGS).type is AttrType.ARRAY
    assert registry.get(A.ENV).type is AttrType.ARRAY
    procs = registry.get(A.JOB_NUM_PROCS)
    assert procs.type is AttrType.INTEGER and procs.minimum == "1" and procs.maximum == str(MAX_PROCS)
    assert procs.default == "1"
    assert registry.get("suspend").type is AttrType.BOOLEAN
    for attr_id in (A.JOB_SUB_ID, A.EXEC_NAME, A.EXEC_PATH, A.WORKING_DIR, A.QUEUE_ID, "jobName", "cpus"):
        assert attr_id in registry
    AttrDef(1, defs).encode()


# --------------------------------------------------------------------------- running programs


async def test_arguments_reach_the_program_verbatim(local, model):
    args = ["hello world", "it's \"quoted\"", "$(echo pwned)", "`id`", "*", "a;b|c&&d", "$HOME", ""]
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/echo"), *[(A.PROG_ARGS, a) for a in args]))
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FINISHED"
    assert attrs[A.PROG_ARGS] == tuple(args)
    [proc] = processes(model, job_id)
    assert drained_output(model).of(proc) == [" ".join(args)]


async def test_new_job_attributes(local, model, tmp_path):
    job_id = await local.submit(
        job_attrs((A.EXEC_NAME, "true"), (A.WORKING_DIR, str(tmp_path)), ("jobName", "my job"), sub_id="abc")
    )
    attrs = model.attrs(job_id)
    assert model.get(job_id).parent == local.queue_id
    assert attrs[A.JOB_SUB_ID] == "abc"
    assert attrs[A.NAME] == "my job"
    assert attrs[A.QUEUE_ID] == str(local.queue_id)
    assert attrs[A.JOB_NUM_PROCS] == "1"
    assert attrs[A.EXEC_NAME] == "true"
    assert os.path.isabs(attrs[A.EXEC_PATH])
    assert attrs[A.WORKING_DIR] == str(tmp_path)
    assert attrs[A.USER_ID]
    [proc] = processes(model, job_id)
    assert model.attr(proc, A.PROCESS_INDEX) == "0"
    assert model.attr(proc, A.PROCESS_NODE_ID) == str(local.node_id)
    attrs = await completed(model, job_id)
    assert int(model.attr(proc, A.PROCESS_PID)) > 0
    assert attrs[A.JOB_STATUS] == "FINISHED"
    assert model.attr(proc, A.PROCESS_EXIT_CODE) == "0"
    assert model.attr(proc, A.PROCESS_STATE) == "COMPLETED"
    assert model.attr(proc, A.PROCESS_STATUS) == "FINISHED"


async def test_environment_and_working_directory(local, model, tmp_path):
    job_id = await local.submit(
        job_attrs(
            (A.EXEC_NAME, "sh"),  # found on PATH
            (A.PROG_ARGS, "-c"),
            (A.PROG_ARGS, 'printf "%s\\n" "$GREETING" "$EQUALS" "$PROXY_AGENT_PROCESS_INDEX"; pwd'),
            (A.ENV, "GREETING=hello there"),
            (A.ENV, "EQUALS=a=b"),
            (A.WORKING_DIR, str(tmp_path)),
        )
    )
    await completed(model, job_id)
    [proc] = processes(model, job_id)
    assert drained_output(model).of(proc) == ["hello there", "a=b", "0", str(tmp_path)]


async def test_exit_code_and_failure(local, model):
    job_id = await local.submit(shell("echo before; exit 3"))
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FAILED"
    assert "exited with code 3" in attrs[A.JOB_STATUS_MESSAGE]
    [proc] = processes(model, job_id)
    assert model.attr(proc, A.PROCESS_EXIT_CODE) == "3"
    assert model.attr(proc, A.PROCESS_STATUS) == "FAILED"
    assert drained_output(model).of(proc) == ["before"]


async def test_killed_by_a_signal(local, model):
    job_id = await local.submit(shell("kill -SEGV $$"))
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FAILED"
    [proc] = processes(model, job_id)
    assert model.attr(proc, A.PROCESS_SIGNAL_NAME) == "SIGSEGV"
    assert model.attr(proc, A.PROCESS_EXIT_CODE) is None


async def test_stdout_stderr_crlf_and_partial_last_line(local, model):
    script = "printf 'out1\\nout2\\r\\nno newline'; printf 'err1\\nerr2' >&2"
    job_id = await local.submit(shell(script))
    await completed(model, job_id)
    [proc] = processes(model, job_id)
    out = drained_output(model)
    assert out.of(proc, A.PROCESS_STDOUT) == ["out1", "out2", "no newline"]
    assert out.of(proc, A.PROCESS_STDERR) == ["err1", "err2"]


async def test_undecodable_and_overlong_lines(local, model):
    script = "printf 'caf\\303\\251 \\377!\\n'; head -c 150000 /dev/zero | tr '\\0' x"
    job_id = await local.submit(shell(script))
    await completed(model, job_id)
    [proc] = processes(model, job_id)
    lines = drained_output(model).of(proc)
    assert lines[0] == "café \ufffd!"
    assert [len(line) for line in lines[1:]] == [65536, 65536, 150000 - 2 * 65536]


async def test_output_precedes_completion(local, model):
    out = Output()
    job_id = await local.submit(shell("i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done"))
    [proc] = processes(model, job_id)
    with trio.fail_after(TIMEOUT):
        while True:
            out.collect(model.drain(7))
            if model.attr(proc, A.PROCESS_STATE) == "COMPLETED":
                break
            await trio.sleep(0)
    # everything was delivered no later than the drain that carried the completion
    lines = [line for chunk in out.of(proc) for line in chunk.split("\n")]
    assert lines == [f"line{i}" for i in range(300)]


async def test_several_processes(local, model):
    script = 'echo "rank $PROXY_AGENT_PROCESS_INDEX of $PROXY_AGENT_NUM_PROCS"; exec sleep 30'
    job_id = await local.submit(shell(script, (A.JOB_NUM_PROCS, "3")))
    procs = processes(model, job_id)
    assert len(procs) == 3
    assert procs == list(range(procs[0], procs[0] + 3))  # contiguous ids
    assert [model.attr(p, A.PROCESS_INDEX) for p in procs] == ["0", "1", "2"]
    await wait_for(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")
    pids = [pid_of(model, p) for p in procs]
    assert {proc_stat(pid)[1] for pid in pids} == {pids[0]}  # one process group, led by process 0
    out = Output()
    await wait_for(lambda: (out.collect(model.drain(7)), all(out.of(p) for p in procs))[1])
    assert [out.of(p) for p in procs] == [[f"rank {i} of 3"] for i in range(3)]
    await local.change(job_id, AttributeSet([("suspend", "true")]))
    assert [proc_stat(pid)[0] for pid in pids] == ["T"] * 3
    assert {model.attr(p, A.PROCESS_STATE) for p in procs} == {"SUSPENDED"}
    await local.change(job_id, AttributeSet([("suspend", "false")]))
    assert {model.attr(p, A.PROCESS_STATE) for p in procs} == {"RUNNING"}
    await local.terminate(job_id)
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "CANCELED"
    assert all(gone(pid) for pid in pids)


async def test_many_short_processes_share_one_group(local, model):
    # process 0 exits at once; the others must still be able to join its group
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "8")))
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FINISHED"
    assert [model.attr(p, A.PROCESS_EXIT_CODE) for p in processes(model, job_id)] == ["0"] * 8


async def test_leftovers_are_killed_when_the_job_ends(local, model):
    job_id = await local.submit(shell("sleep 30 & echo $!"))
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FINISHED"
    [proc] = processes(model, job_id)
    [background] = drained_output(model).of(proc)
    await wait_for(lambda: dead(int(background)), 2)


# --------------------------------------------------------------------------- terminate


async def test_terminate(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(model, job_id)
    [proc] = processes(model, job_id)
    pgid = pid_of(model, proc)
    with trio.fail_after(2):
        await local.terminate(job_id)
        attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "CANCELED"
    assert model.attr(proc, A.PROCESS_SIGNAL_NAME) == "SIGTERM"
    assert model.attr(proc, A.PROCESS_STATUS) == "CANCELED"
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with pytest.raises(JobError, match="already completed"):
        await local.terminate(job_id)


async def test_terminate_escalates_to_sigkill(local, model):
    job_id = await local.submit(shell('trap "" TERM; echo ready; sleep 30; echo survived'))
    [proc] = processes(model, job_id)
    out = Output()
    await wait_for(lambda: (out.collect(model.drain(7)), out.of(proc))[1])
    start = trio.current_time()
    await local.terminate(job_id)
    attrs = await completed(model, job_id)
    assert trio.current_time() - start >= 0.3  # the grace was given
    assert attrs[A.JOB_STATUS] == "CANCELED"
    assert model.attr(proc, A.PROCESS_SIGNAL_NAME) == "SIGKILL"
    # the shell's sleep was killed with it (and, an orphan now, is left for init to reap)
    await wait_for(lambda: not live_members(pid_of(model, proc)), 2)


# --------------------------------------------------------------------------- change and move


async def test_suspend_and_resume(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(model, job_id)
    [proc] = processes(model, job_id)
    pid = pid_of(model, proc)
    await local.change(job_id, AttributeSet([(A.JOB_ID, str(job_id)), ("suspend", "true")]))
    assert model.attr(job_id, A.JOB_STATE) == "SUSPENDED"
    assert model.attr(proc, A.PROCESS_STATE) == "SUSPENDED"
    assert proc_stat(pid)[0] == "T"  # reported once it has taken effect
    await local.change(job_id, AttributeSet([(A.JOB_STATE, "RUNNING")]))
    assert model.attr(job_id, A.JOB_STATE) == "RUNNING"
    assert model.attr(proc, A.PROCESS_STATE) == "RUNNING"
    await wait_for(lambda: proc_stat(pid)[0] in "SR")
    await local.change(job_id, AttributeSet([(A.JOB_STATE, "SUSPENDED")]))
    assert proc_stat(pid)[0] == "T"
    # a suspended job can still be terminated
    await local.terminate(job_id)
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "CANCELED"
    assert model.attr(proc, A.PROCESS_SIGNAL_NAME) == "SIGTERM"


@pytest.mark.parametrize(
    "changes, code, message",
    [
        ([("queueId", "5")], ErrorCode.NOT_SUPPORTED, "cannot change queueId"),
        ([("hold", "true")], ErrorCode.NOT_SUPPORTED, "cannot change hold"),
        ([(A.JOB_STATE, "COMPLETED")], ErrorCode.NOT_SUPPORTED, "SUSPENDED or RUNNING"),
        ([("suspend", "maybe")], ErrorCode.BAD_ARGUMENTS, "true or false"),
        ([], ErrorCode.BAD_ARGUMENTS, "nothing to change"),
    ],
)
async def test_unsupported_changes(local, model, changes, code, message):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(model, job_id)
    with pytest.raises(JobError, match=message) as info:
        await local.change(job_id, AttributeSet(changes))
    assert info.value.code == code
    assert model.attr(job_id, A.JOB_STATE) == "RUNNING"


async def test_move_is_refused(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/true")))
    with pytest.raises(JobError, match="single queue") as info:
        await local.move(job_id, local.queue_id)
    assert info.value.code == ErrorCode.NOT_SUPPORTED


async def test_change_of_a_completed_job(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/true")))
    await completed(model, job_id)
    with pytest.raises(JobError, match="already completed"):
        await local.change(job_id, AttributeSet([("suspend", "true")]))


# --------------------------------------------------------------------------- bad submissions


@pytest.fixture
def files(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    return {"dir": str(tmp_path), "plain": str(plain)}


BAD_SUBMISSIONS = {
    "no jobSubId": ([(A.EXEC_PATH, "/bin/true")], "jobSubId", True),
    "empty jobSubId": ([(A.JOB_SUB_ID, ""), (A.EXEC_PATH, "/bin/true")], "jobSubId", True),
    "no executable": ([], "no executable", False),
    "missing file": ([(A.EXEC_PATH, "/nonexistent/prog")], "not found", False),
    "missing in directory": ([(A.EXEC_PATH, "/nonexistent"), (A.EXEC_NAME, "prog")], "/nonexistent/prog", False),
    "not on PATH": ([(A.EXEC_NAME, "no-such-program-4711")], "not found on PATH", False),
    "not executable": ([(A.EXEC_PATH, "{plain}")], "not executable", False),
    "directory": ([(A.EXEC_PATH, "{dir}")], "is a directory", False),
    "working dir missing": ([(A.EXEC_PATH, "/bin/true"), (A.WORKING_DIR, "/nonexistent/dir")], "does not exist", False),
    "working dir a file": ([(A.EXEC_PATH, "/bin/true"), (A.WORKING_DIR, "{plain}")], "not a directory", False),
    "procs not a number": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "two")], "whole number", False),
    "procs zero": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "0")], "at least 1", False),
    "procs negative": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "-3")], "at least 1", False),
    "procs too many": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "100000")], "at most 1024", False),
    "unknown queue": ([(A.EXEC_PATH, "/bin/true"), (A.QUEUE_ID, "999999")], "unknown queue", False),
    "bad env": ([(A.EXEC_PATH, "/bin/true"), (A.ENV, "NOEQUALS")], "NAME=VALUE", False),
    "NUL in argument": ([(A.EXEC_PATH, "/bin/true"), (A.PROG_ARGS, "a\0b")], "NUL", False),
}


@pytest.mark.parametrize("case", sorted(BAD_SUBMISSIONS))
async def test_bad_submissions(local, model, files, case):
    pairs, message, no_sub_id = BAD_SUBMISSIONS[case]
    pairs = [(key, value.format(**files)) for key, value in pairs]
    jobs_before = model.count(ElementKind.JOB)
    attrs = AttributeSet(pairs) if no_sub_id else job_attrs(*pairs)
    with pytest.raises(SubmitError) as info:
        await local.submit(attrs)
    assert message in info.value.message
    assert model.count(ElementKind.JOB) == jobs_before
    assert model.count(ElementKind.PROCESS) == 0


async def test_a_program_that_cannot_be_executed_fails_the_job(local, model, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 no executable format")
    garbage.chmod(0o755)
    job_id = await local.submit(job_attrs((A.EXEC_PATH, str(garbage)), (A.JOB_NUM_PROCS, "2")))
    assert model.attr(job_id, A.JOB_STATE) == "STARTING"
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "FAILED"
    assert "Exec format error" in attrs[A.JOB_STATUS_MESSAGE]
    for proc in processes(model, job_id):
        assert model.attr(proc, A.PROCESS_STATE) == "COMPLETED"
        assert model.attr(proc, A.PROCESS_STATUS) == "FAILED"


async def test_submit_adds_a_starting_job_then_starts_it(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    [proc] = processes(model, job_id)
    assert model.attr(job_id, A.JOB_STATE) == "STARTING"
    assert model.attr(proc, A.PROCESS_STATE) == "STARTING"
    [new_job] = [e for e in model.drain(7) if getattr(e, "kind", None) is ElementKind.JOB]
    assert dict(new_job.groups[0].attributes)[A.JOB_STATE] == "STARTING"
    await wait_for(lambda: model.attr(job_id, A.JOB_STATE) == "RUNNING")
    assert model.attr(proc, A.PROCESS_STATE) == "RUNNING"
    await local.terminate(job_id)
    assert (await completed(model, job_id))[A.JOB_STATUS] == "CANCELED"


async def test_terminate_before_start(local, model):
    job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await local.terminate(job_id)  # its task has not run yet
    attrs = await completed(model, job_id)
    assert attrs[A.JOB_STATUS] == "CANCELED"
    [proc] = processes(model, job_id)
    assert model.attr(proc, A.PROCESS_STATUS) == "CANCELED"
    assert model.attr(proc, A.PROCESS_PID) is None


async def test_queue_may_be_named(local, model):
    for queue in (str(local.queue_id), "default"):
        job_id = await local.submit(job_attrs((A.EXEC_PATH, "/bin/true"), (A.QUEUE_ID, queue)))
        assert (await completed(model, job_id))[A.JOB_STATUS] == "FINISHED"


async def test_exec_path_forms(local, model):
    for pairs in (
        [(A.EXEC_PATH, "/bin"), (A.EXEC_NAME, "true")],  # directory + name
        [(A.EXEC_PATH, "/bin/true"), (A.EXEC_NAME, "true")],  # full path + name
        [(A.EXEC_NAME, "/bin/true")],  # a path in execName
    ):
        job_id = await local.submit(job_attrs(*pairs))
        assert (await completed(model, job_id))[A.JOB_STATUS] == "FINISHED"


# --------------------------------------------------------------------------- shutdown


async def test_aclose_terminates_and_reaps_everything(nursery, model):
    scheduler = LocalScheduler(model, SchedulerOptions(kill_grace=30.0))  # shutdown must not wait that long
    await nursery.start(scheduler.run)
    stubborn = await scheduler.submit(shell('trap "" TERM; echo ready; sleep 30', (A.JOB_NUM_PROCS, "2")))
    polite = await scheduler.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(model, polite)
    out = Output()
    stubborn_procs = processes(model, stubborn)
    await wait_for(lambda: (out.collect(model.drain(7)), all(out.of(p) for p in stubborn_procs))[1])
    pids = [pid_of(model, p) for job in (stubborn, polite) for p in processes(model, job)]
    start = trio.current_time()
    await scheduler.aclose()
    assert trio.current_time() - start < 1.8
    for pid in pids:
        assert gone(pid)  # not even a zombie: reaped
    for job in (stubborn, polite):  # and nothing they started survives
        await wait_for(lambda: not live_members(pid_of(model, processes(model, job)[0])), 1)
    for job in (stubborn, polite):
        assert model.attr(job, A.JOB_STATE) == "COMPLETED"
        assert model.attr(job, A.JOB_STATUS) == "CANCELED"
    with pytest.raises(SubmitError, match="shutting down"):
        await scheduler.submit(job_attrs((A.EXEC_PATH, "/bin/true")))


async def test_aclose_while_jobs_are_starting(nursery, model):
    scheduler = LocalScheduler(model, SchedulerOptions(kill_grace=0.2))
    await nursery.start(scheduler.run)
    job_ids = [
        await scheduler.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30"), sub_id=f"s{i}"))
        for i in range(20)
    ]
    await trio.sleep(0.005)  # some have started, some have not
    started = [pid_of(model, p) for j in job_ids for p in processes(model, j) if model.attr(p, A.PROCESS_PID)]
    await scheduler.aclose()
    assert {model.attr(j, A.JOB_STATUS) for j in job_ids} == {"CANCELED"}
    assert all(model.attr(p, A.PROCESS_STATE) == "COMPLETED" for j in job_ids for p in processes(model, j))
    assert all(gone(pid) for pid in started)
    assert not scheduler._jobs


async def test_cancelling_run_reaps_everything(model):
    scheduler = LocalScheduler(model, SchedulerOptions(kill_grace=0.2))
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        job_id = await scheduler.submit(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
        await running(model, job_id)
        pid = pid_of(model, processes(model, job_id)[0])
        nursery.cancel_scope.cancel()
    assert gone(pid)
    assert model.attr(job_id, A.JOB_STATUS) == "CANCELED"


async def test_submit_throughput_smoke(local, model):
    # not a benchmark: many short jobs, all completing, none lost
    job_ids = [await local.submit(job_attrs((A.EXEC_PATH, "/bin/true"), sub_id=f"s{i}")) for i in range(100)]
    await wait_for(lambda: all(model.attr(j, A.JOB_STATE) == "COMPLETED" for j in job_ids))
    assert {model.attr(j, A.JOB_STATUS) for j in job_ids} == {"FINISHED"}
    assert not local._jobs


# --------------------------------------------------------------------------- line splitting


def reference_lines(data: bytes, limit: int) -> List[str]:
    """What LineSplitter must produce for ``data`` delivered in any chunks."""
    segments = data.split(b"\n")
    last = segments.pop()  # after the final newline
    lines = [s[:-1] if s.endswith(b"\r") else s for s in segments]
    if last.endswith(b"\r"):
        last = last[:-1]
    if last:
        lines.append(last)
    out = []
    for line in lines:
        while len(line) > limit:
            cut = limit
            while cut > limit - 3 and line[cut] & 0xC0 == 0x80:
                cut -= 1
            out.append(line[:cut].decode("utf-8", "replace"))
            line = line[cut:]
        out.append(line.decode("utf-8", "replace"))
    return out


line_bytes = st.lists(
    st.one_of(
        st.sampled_from([b"\n", b"\r", b"\r\n", b"a", "é".encode(), "€".encode(), "𝄞".encode(), b"\xff"]),
        st.binary(max_size=12),
    ),
    max_size=40,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(data=line_bytes, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_line_splitter_ignores_chunking(data, cuts):
    limit = 8
    splitter = LineSplitter(limit)
    lines: List[str] = []
    previous = 0
    for cut in sorted(set(c for c in cuts if c <= len(data))) + [len(data)]:
        lines.extend(splitter.feed(data[previous:cut]))
        previous = cut
    lines.extend(splitter.flush())
    assert lines == reference_lines(data, limit)


def test_line_splitter_examples():
    splitter = LineSplitter(8)
    assert splitter.feed(b"one\r\ntw") == ["one"]
    assert splitter.feed(b"o\n\nthree") == ["two", ""]
    assert splitter.flush() == ["three"]
    assert splitter.flush() == []
    assert LineSplitter(8).feed(b"0123456789abcdefXY\n") == ["01234567", "89abcdef", "XY"]
    assert LineSplitter(4).feed("aaaé\n".encode()) == ["aaa", "é"]  # not inside the UTF-8 sequence
