"""The local backend: real processes, run in-process in a job service, seen by a PTP client."""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Tuple

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.frontends.ptp import mapping
from proxy_agent.protocol.attributes import A, AttributeRegistry, AttributeSet, AttrType
from proxy_agent.protocol.messages import AttrDef, ElementKind, ErrorCode, NewElements
from proxy_agent.schedulers.common import LineSplitter
from proxy_agent.schedulers.local import MAX_PROCS, LocalBackend, LocalOptions
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, ServiceError, SubmitError
from proxy_agent.service.model import ChangeSink, K, Kind, ServiceModel
from service_fixtures import Harness, start_backend, wait_for
from wait_support import scaled

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and process groups")

SH = "/bin/sh"
TIMEOUT = scaled(30)


# --------------------------------------------------------------------------- helpers


@pytest.fixture
async def local(nursery):
    backend = LocalBackend(ServiceModel(), LocalOptions(kill_grace=0.3))
    harness = await start_backend(nursery, backend)
    yield harness
    await backend.aclose()


def job_attrs(*pairs: Tuple[str, str], sub_id: Optional[str] = "sub-1") -> AttributeSet:
    items = [(A.JOB_SUB_ID, sub_id)] if sub_id is not None else []
    return AttributeSet(items + list(pairs))


def shell(script: str, *more: Tuple[str, str]) -> AttributeSet:
    """A job running ``/bin/sh -c script`` as the user's program."""
    return job_attrs((A.EXEC_PATH, SH), (A.PROG_ARGS, "-c"), (A.PROG_ARGS, script), *more)


async def running(local: Harness, job: int) -> None:
    await local.wait_state(job, "RUNNING")


async def ended(local: Harness, job: int, timeout: float = TIMEOUT) -> Dict[str, object]:
    return await local.wait_ended(job, timeout)


def output(local: Harness, process: int, stream: str = "stdout") -> List[str]:
    """Every line of a process the client has been sent (joined lines split again)."""
    local.sync()
    return [piece for chunk in local.output(process, stream) for piece in chunk.split("\n")]


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


def processes(local: Harness, job: int) -> List[int]:
    return local.model.processes(job)


def pid_of(local: Harness, process: int) -> int:
    return int(local.model.attr(process, K.PID))


# --------------------------------------------------------------------------- the model


async def test_model_is_this_host(local):
    model, backend = local.model, local.backend
    [machine] = model.keys(Kind.MACHINE)
    [node] = model.keys(Kind.NODE)
    [queue] = model.keys(Kind.QUEUE)
    assert model.attrs(machine) == {K.NAME: backend.hostname, K.STATE: "UP", K.NUM_NODES: "1", K.BACKEND: "local"}
    node_attrs = model.attrs(node)
    assert node_attrs[K.NAME] == backend.hostname
    assert node_attrs[K.STATE] == "UP" and node_attrs[K.NUMBER] == "0"
    assert int(node_attrs[K.CPUS]) >= 1
    assert model.get(node).parent == machine
    # the load figures brokers rank by: no job yet, every CPU free
    assert model.attrs(queue) == {K.NAME: "default", K.STATE: "NORMAL", K.BACKEND: "local", K.DEFAULT: "true",
                                  K.TOTAL_SLOTS: node_attrs[K.CPUS], K.WAITING: "0", K.RUNNING: "0",
                                  K.FREE_SLOTS: node_attrs[K.CPUS]}
    assert local.service.default_queue() == (backend, queue)
    # as the client was sent them
    assert local.ptp(machine) == {"name": backend.hostname, "machineState": "UP", "numNodes": "1",
                                  "backend": "local"}
    assert local.ptp(node)["nodeState"] == "UP" and local.ptp(node)["nodeNumber"] == "0"
    assert local.ptp(queue)["queueState"] == "NORMAL" and local.ptp(queue)["name"] == "default"


async def test_attribute_definitions(local):
    queue = local.backend.queue_id
    defs = mapping.attribute_definitions(local.service.attributes(), local.client.id(queue))
    registry = AttributeRegistry(defs)  # no id twice
    for attr_id in (A.JOB_STATE, A.PROCESS_PID, A.NODE_STATE, "jobStatus", "jobNativeState"):
        assert attr_id in registry
    assert registry.get(A.PROG_ARGS).type is AttrType.ARRAY
    assert registry.get(A.ENV).type is AttrType.ARRAY
    procs = registry.get(A.JOB_NUM_PROCS)
    assert procs.type is AttrType.INTEGER and procs.minimum == "1" and procs.maximum == str(MAX_PROCS)
    assert procs.default == "1"
    assert registry.get("suspend").type is AttrType.BOOLEAN
    assert registry.get(A.QUEUE_ID).default == local.client.id(queue)
    for attr_id in (A.JOB_SUB_ID, A.EXEC_NAME, A.EXEC_PATH, A.WORKING_DIR, A.QUEUE_ID, "jobName", "cpus"):
        assert attr_id in registry
    AttrDef(1, defs).encode()


# --------------------------------------------------------------------------- running programs


async def test_arguments_reach_the_program_verbatim(local):
    args = ["hello world", "it's \"quoted\"", "$(echo pwned)", "`id`", "*", "a;b|c&&d", "$HOME", ""]
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/echo"), *[(A.PROG_ARGS, a) for a in args]))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FINISHED" and attrs[K.NATIVE_STATE] == "EXITED"
    assert attrs[K.ARGUMENTS] == tuple(args)
    [new_job] = [e for e in local.sync() if isinstance(e, NewElements) and e.kind is ElementKind.JOB]
    assert [v for k, v in new_job.groups[0].attributes if k == A.PROG_ARGS] == args  # one value each
    [proc] = processes(local, job)
    assert output(local, proc) == [" ".join(args)]


async def test_new_job_attributes(local, tmp_path):
    model, backend = local.model, local.backend
    job = await local.submit_ptp(
        job_attrs((A.EXEC_NAME, "true"), (A.WORKING_DIR, str(tmp_path)), ("jobName", "my job"), sub_id="abc")
    )
    attrs = model.attrs(job)
    assert model.get(job).parent == backend.queue_id and model.owner(job) == "local"
    assert attrs[K.CLIENT_REF] == "abc"
    assert attrs[K.NAME] == "my job"
    assert attrs[K.QUEUE] == backend.queue_id
    assert attrs[K.NUM_PROCS] == "1"
    assert os.path.isabs(attrs[K.EXECUTABLE]) and os.path.basename(attrs[K.EXECUTABLE]) == "true"
    assert attrs[K.WORKING_DIR] == str(tmp_path)
    assert attrs[K.USER]
    [proc] = processes(local, job)
    assert model.get(proc).rank == 0
    assert model.attr(proc, K.NODE) == backend.node_id
    local.sync()
    shown = local.ptp(job)
    assert shown[A.JOB_SUB_ID] == "abc" and shown[A.NAME] == "my job"
    assert shown[A.QUEUE_ID] == local.client.id(backend.queue_id)
    assert shown[A.JOB_NUM_PROCS] == "1" and shown[A.EXEC_NAME] == "true"
    assert os.path.isabs(shown[A.EXEC_PATH]) and shown[A.WORKING_DIR] == str(tmp_path)
    assert shown[A.USER_ID] == attrs[K.USER]
    assert local.client.id(proc) == f"{local.client.id(job)}:0"
    assert local.ptp(proc)[A.PROCESS_NODE_ID] == local.client.id(backend.node_id)
    attrs = await ended(local, job)
    assert int(model.attr(proc, K.PID)) > 0
    assert attrs[K.STATE] == "FINISHED"
    assert model.attr(proc, K.EXIT_CODE) == "0"
    assert model.attr(proc, K.STATE) == "FINISHED"
    local.sync()
    assert local.ptp(proc)[A.PROCESS_STATE] == "COMPLETED"
    assert local.ptp(proc)["processStatus"] == "FINISHED"
    assert local.ptp(job)[A.JOB_STATE] == "COMPLETED" and local.ptp(job)["jobStatus"] == "FINISHED"


async def test_environment_and_working_directory(local, tmp_path):
    job = await local.submit_ptp(
        job_attrs(
            (A.EXEC_NAME, "sh"),  # found on PATH
            (A.PROG_ARGS, "-c"),
            (A.PROG_ARGS, 'printf "%s\\n" "$GREETING" "$EQUALS" "$PROXY_AGENT_PROCESS_INDEX" '
                          '"$PROXY_AGENT_JOB_KEY"; pwd'),
            (A.ENV, "GREETING=hello there"),
            (A.ENV, "EQUALS=a=b"),
            (A.WORKING_DIR, str(tmp_path)),
        )
    )
    await ended(local, job)
    [proc] = processes(local, job)
    assert output(local, proc) == ["hello there", "a=b", "0", str(job), str(tmp_path)]


async def test_exit_code_and_failure(local):
    job = await local.submit_ptp(shell("echo before; exit 3"))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FAILED" and attrs[K.NATIVE_STATE] == "FAILED"
    assert "exited with code 3" in attrs[K.MESSAGE]
    [proc] = processes(local, job)
    assert local.model.attr(proc, K.EXIT_CODE) == "3"
    assert local.model.attr(proc, K.STATE) == "FAILED"
    assert output(local, proc) == ["before"]
    assert "exited with code 3" in local.ptp(job)[A.JOB_STATUS_MESSAGE]
    assert local.ptp(proc)[A.PROCESS_EXIT_CODE] == "3"


async def test_killed_by_a_signal(local):
    job = await local.submit_ptp(shell("kill -SEGV $$"))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FAILED"
    assert "killed by SIGSEGV" in attrs[K.MESSAGE]
    [proc] = processes(local, job)
    assert local.model.attr(proc, K.SIGNAL) == "SIGSEGV"
    assert local.model.attr(proc, K.EXIT_CODE) is None
    local.sync()
    assert local.ptp(proc)[A.PROCESS_SIGNAL_NAME] == "SIGSEGV"


async def test_stdout_stderr_crlf_and_partial_last_line(local):
    script = "printf 'out1\\nout2\\r\\nno newline'; printf 'err1\\nerr2' >&2"
    job = await local.submit_ptp(shell(script))
    await ended(local, job)
    [proc] = processes(local, job)
    assert output(local, proc, "stdout") == ["out1", "out2", "no newline"]
    assert output(local, proc, "stderr") == ["err1", "err2"]


async def test_undecodable_and_overlong_lines(local):
    script = "printf 'caf\\303\\251 \\377!\\n'; head -c 150000 /dev/zero | tr '\\0' x"
    job = await local.submit_ptp(shell(script))
    await ended(local, job)
    [proc] = processes(local, job)
    local.sync()
    lines = local.output(proc)
    assert lines[0] == "café \ufffd!"
    assert [len(line) for line in lines[1:]] == [65536, 65536, 150000 - 2 * 65536]


async def test_output_precedes_completion(local):
    job = await local.submit_ptp(shell("i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done"))
    [proc] = processes(local, job)
    with trio.fail_after(TIMEOUT):
        while True:
            local.sync()
            if local.ptp(proc).get(A.PROCESS_STATE) == "COMPLETED":
                break
            await trio.sleep(0)
    # everything was delivered no later than the drain that carried the completion
    assert output(local, proc) == [f"line{i}" for i in range(300)]


async def test_several_processes(local):
    model = local.model
    script = 'echo "rank $PROXY_AGENT_PROCESS_INDEX of $PROXY_AGENT_NUM_PROCS"; exec sleep 30'
    job = await local.submit_ptp(shell(script, (A.JOB_NUM_PROCS, "3")))
    procs = processes(local, job)
    assert len(procs) == 3
    assert procs == list(range(procs[0], procs[0] + 3))  # contiguous keys
    assert [model.get(p).rank for p in procs] == [0, 1, 2]
    await running(local, job)
    pids = [pid_of(local, p) for p in procs]
    assert {proc_stat(pid)[1] for pid in pids} == {pids[0]}  # one process group, led by process 0
    await wait_for(lambda: all(output(local, p) for p in procs))
    assert [output(local, p) for p in procs] == [[f"rank {i} of 3"] for i in range(3)]
    await local.change_ptp(job, [f"jobId={local.client.id(job)}", "suspend=true"])
    assert [proc_stat(pid)[0] for pid in pids] == ["T"] * 3
    assert {model.attr(p, K.STATE) for p in procs} == {"SUSPENDED"}
    await local.change_ptp(job, ["suspend=false"])
    assert {model.attr(p, K.STATE) for p in procs} == {"RUNNING"}
    await local.service.terminate(job)
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "KILLED" and attrs[K.NATIVE_STATE] == "TERMINATED"
    assert all(gone(pid) for pid in pids)


async def test_many_short_processes_share_one_group(local):
    # process 0 exits at once; the others must still be able to join its group
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "8")))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FINISHED"
    assert [local.model.attr(p, K.EXIT_CODE) for p in processes(local, job)] == ["0"] * 8


async def test_leftovers_are_killed_when_the_job_ends(local):
    job = await local.submit_ptp(shell("sleep 30 & echo $!"))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FINISHED"
    [proc] = processes(local, job)
    [background] = output(local, proc)
    await wait_for(lambda: dead(int(background)))


# --------------------------------------------------------------------------- terminate


async def test_terminate(local):
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "600")))
    await running(local, job)
    [proc] = processes(local, job)
    pgid = pid_of(local, proc)
    with trio.fail_after(scaled(30)):
        await local.service.terminate(job)
        attrs = await ended(local, job)
    assert attrs[K.STATE] == "KILLED"
    assert local.model.attr(proc, K.SIGNAL) == "SIGTERM"
    assert local.model.attr(proc, K.STATE) == "KILLED"
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with pytest.raises(JobError, match="already ended") as info:
        await local.service.terminate(job)
    assert info.value.kind is ErrorKind.OPERATION_FAILED
    local.sync()
    assert local.ptp(job)[A.JOB_STATE] == "COMPLETED" and local.ptp(job)["jobStatus"] == "KILLED"


async def test_terminate_escalates_to_sigkill(local):
    job = await local.submit_ptp(shell('trap "" TERM; echo ready; sleep 30; echo survived'))
    [proc] = processes(local, job)
    await wait_for(lambda: output(local, proc))
    start = trio.current_time()
    await local.service.terminate(job)
    attrs = await ended(local, job)
    assert trio.current_time() - start >= 0.3  # the grace was given
    assert attrs[K.STATE] == "KILLED"
    assert local.model.attr(proc, K.SIGNAL) == "SIGKILL"
    assert output(local, proc) == ["ready"]
    # the shell's sleep was killed with it (and, an orphan now, is left for init to reap)
    await wait_for(lambda: not live_members(pid_of(local, proc)))


# --------------------------------------------------------------------------- change and move


async def test_suspend_and_resume(local):
    model = local.model
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(local, job)
    [proc] = processes(local, job)
    pid = pid_of(local, proc)
    await local.change_ptp(job, AttributeSet([(A.JOB_ID, local.client.id(job)), ("suspend", "true")]))
    assert model.attr(job, K.STATE) == "SUSPENDED" and model.attr(job, K.NATIVE_STATE) == "STOPPED"
    assert model.attr(proc, K.STATE) == "SUSPENDED"
    assert proc_stat(pid)[0] == "T"  # reported once it has taken effect
    local.sync()
    assert local.ptp(job)[A.JOB_STATE] == "SUSPENDED" and local.ptp(proc)[A.PROCESS_STATE] == "SUSPENDED"
    await local.change_ptp(job, AttributeSet([(A.JOB_STATE, "RUNNING")]))
    assert model.attr(job, K.STATE) == "RUNNING"
    assert model.attr(proc, K.STATE) == "RUNNING"
    await wait_for(lambda: proc_stat(pid)[0] in "SR")
    await local.change_ptp(job, AttributeSet([(A.JOB_STATE, "SUSPENDED")]))
    assert proc_stat(pid)[0] == "T"
    # a suspended job can still be terminated
    await local.service.terminate(job)
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "KILLED"
    assert model.attr(proc, K.SIGNAL) == "SIGTERM"


@pytest.mark.parametrize(
    "changes, kind, code, message",
    [
        ([("queueId", "5")], ErrorKind.NOT_SUPPORTED, ErrorCode.NOT_SUPPORTED, "cannot change queueId"),
        ([("hold", "true")], ErrorKind.NOT_SUPPORTED, ErrorCode.NOT_SUPPORTED, "cannot hold"),
        ([(A.JOB_STATE, "COMPLETED")], ErrorKind.NOT_SUPPORTED, ErrorCode.NOT_SUPPORTED, "SUSPENDED or RUNNING"),
        ([("suspend", "maybe")], ErrorKind.BAD_REQUEST, ErrorCode.BAD_ARGUMENTS, "true or false"),
        ([], ErrorKind.BAD_REQUEST, ErrorCode.BAD_ARGUMENTS, "nothing to change"),
    ],
)
async def test_unsupported_changes(local, changes, kind, code, message):
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await running(local, job)
    with pytest.raises(JobError, match=message) as info:
        await local.change_ptp(job, AttributeSet(changes))
    assert info.value.kind is kind
    assert mapping.error_code(info.value.kind) == code
    assert local.model.attr(job, K.STATE) == "RUNNING"


async def test_move_is_refused(local):
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true")))
    with pytest.raises(JobError, match="single queue") as info:
        await local.service.move(job, local.backend.queue_id)
    assert info.value.kind is ErrorKind.NOT_SUPPORTED
    assert mapping.error_code(info.value.kind) == ErrorCode.NOT_SUPPORTED


async def test_change_of_an_ended_job(local):
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true")))
    await ended(local, job)
    with pytest.raises(JobError, match="already ended") as info:
        await local.change_ptp(job, AttributeSet([("suspend", "true")]))
    assert info.value.kind is ErrorKind.OPERATION_FAILED


async def test_a_job_of_no_backend(local):
    with pytest.raises(JobError, match="no such job") as info:
        await local.service.terminate(4242)
    assert info.value.kind is ErrorKind.NO_SUCH_JOB
    with pytest.raises(JobError) as info:
        await local.backend.terminate(local.backend.queue_id)  # not a job of the backend
    assert info.value.kind is ErrorKind.NO_SUCH_JOB


# --------------------------------------------------------------------------- bad submissions


@pytest.fixture
def files(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    return {"dir": str(tmp_path), "plain": str(plain)}


BAD = ErrorKind.BAD_REQUEST
REFUSED = ErrorKind.SUBMIT_FAILED
BAD_SUBMISSIONS = {
    "no jobSubId": ([(A.EXEC_PATH, "/bin/true")], "jobSubId", True, BAD),
    "empty jobSubId": ([(A.JOB_SUB_ID, ""), (A.EXEC_PATH, "/bin/true")], "jobSubId", True, BAD),
    "no executable": ([], "no executable given", False, BAD),
    "missing file": ([(A.EXEC_PATH, "/nonexistent/prog")], "not found", False, REFUSED),
    "missing in directory": ([(A.EXEC_PATH, "/nonexistent"), (A.EXEC_NAME, "prog")], "/nonexistent/prog", False,
                             REFUSED),
    "not on PATH": ([(A.EXEC_NAME, "no-such-program-4711")], "not found on PATH", False, REFUSED),
    "not executable": ([(A.EXEC_PATH, "{plain}")], "not executable", False, REFUSED),
    "directory": ([(A.EXEC_PATH, "{dir}")], "is a directory", False, REFUSED),
    "working dir missing": ([(A.EXEC_PATH, "/bin/true"), (A.WORKING_DIR, "/nonexistent/dir")], "does not exist",
                            False, REFUSED),
    "working dir a file": ([(A.EXEC_PATH, "/bin/true"), (A.WORKING_DIR, "{plain}")], "not a directory", False,
                           REFUSED),
    "procs not a number": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "two")], "whole number", False, BAD),
    "procs zero": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "0")], "between 1 and", False, BAD),
    "procs negative": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "-3")], "whole number", False, BAD),
    "procs too many": ([(A.EXEC_PATH, "/bin/true"), (A.JOB_NUM_PROCS, "100000")], "at most 1024", False, BAD),
    "unknown queue": ([(A.EXEC_PATH, "/bin/true"), (A.QUEUE_ID, "999999")], "no queue with id", False,
                      ErrorKind.NO_SUCH_QUEUE),
    "unknown queue name": ([(A.EXEC_PATH, "/bin/true"), (A.QUEUE_ID, "nope")], "no queue named 'nope'", False,
                           ErrorKind.NO_SUCH_QUEUE),
    "bad env": ([(A.EXEC_PATH, "/bin/true"), (A.ENV, "NOEQUALS")], "NAME=VALUE", False, BAD),
    "NUL in argument": ([(A.EXEC_PATH, "/bin/true"), (A.PROG_ARGS, "a\0b")], "NUL", False, BAD),
    "NUL in environment": ([(A.EXEC_PATH, "/bin/true"), (A.ENV, "A=a\0b")], "NUL", False, BAD),
}


@pytest.mark.parametrize("case", sorted(BAD_SUBMISSIONS))
async def test_bad_submissions(local, files, case):
    pairs, message, no_sub_id, kind = BAD_SUBMISSIONS[case]
    pairs = [(key, value.format(**files)) for key, value in pairs]
    jobs_before = local.model.count(Kind.JOB)
    attrs = AttributeSet(pairs) if no_sub_id else job_attrs(*pairs)
    with pytest.raises(ServiceError) as info:
        await local.submit_ptp(attrs)
    assert message in info.value.message
    assert info.value.kind is kind
    assert local.model.count(Kind.JOB) == jobs_before
    assert local.model.count(Kind.PROCESS) == 0


async def test_the_backend_checks_what_it_is_given(local):
    idle = LocalBackend(ServiceModel())
    with pytest.raises(SubmitError, match="not running") as info:
        await idle.submit(JobSpec("/bin/true"), 1)
    assert info.value.kind is ErrorKind.UNAVAILABLE
    [machine] = local.model.keys(Kind.MACHINE)
    with pytest.raises(SubmitError, match="one queue") as info:
        await local.backend.submit(JobSpec("/bin/true"), machine)
    assert info.value.kind is ErrorKind.NO_SUCH_QUEUE
    with pytest.raises(SubmitError, match="at least 1") as info:
        await local.backend.submit(JobSpec("/bin/true", num_procs=0), local.backend.queue_id)
    assert info.value.kind is ErrorKind.BAD_REQUEST
    assert local.model.count(Kind.JOB) == 0


async def test_a_program_that_cannot_be_executed_fails_the_job(local, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 no executable format")
    garbage.chmod(0o755)
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, str(garbage)), (A.JOB_NUM_PROCS, "2")))
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "FAILED" and attrs[K.NATIVE_STATE] == "NOT_STARTED"
    assert "Exec format error" in attrs[K.MESSAGE]
    local.sync()
    for proc in processes(local, job):
        assert local.model.attr(proc, K.STATE) == "FAILED"
        assert local.ptp(proc)[A.PROCESS_STATE] == "COMPLETED"
        assert local.ptp(proc)["processStatus"] == "FAILED"


class _JobStates(ChangeSink):
    """Every state each job passes through, as the model has it."""

    takes_output = False

    def __init__(self, model) -> None:
        self.model = model
        self.states: dict = {}

    def created(self, element) -> None:
        self.changed(element, ())

    def changed(self, element, slots) -> None:
        if element.kind is Kind.JOB:
            state = (self.model.attr(element.key, K.STATE), self.model.attr(element.key, K.NATIVE_STATE))
            seen = self.states.setdefault(element.key, [])
            if not seen or seen[-1] != state:
                seen.append(state)


async def test_submit_adds_a_pending_job_then_starts_it(local):
    model = local.model
    states = _JobStates(model)
    model.observe(states)
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    [proc] = processes(local, job)
    # answered once the keeper has recorded it, before it runs (or just as it starts)
    assert model.attr(job, K.STATE) in ("QUEUING", "RUNNING")
    await running(local, job)
    assert states.states[job][:2] == [("QUEUING", "PENDING"), ("RUNNING", "RUNNING")]
    assert model.attr(proc, K.STATE) == "RUNNING"
    await local.service.terminate(job)
    assert (await ended(local, job))[K.STATE] == "KILLED"


async def test_terminate_before_start(local):
    job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
    await local.service.terminate(job)  # its task has not run yet
    attrs = await ended(local, job)
    assert attrs[K.STATE] == "KILLED"
    [proc] = processes(local, job)
    assert local.model.attr(proc, K.STATE) == "KILLED"


async def test_queue_may_be_named(local):
    queue = local.backend.queue_id
    for ref in (local.client.id(queue), "default", "local:default"):
        job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true"), (A.QUEUE_ID, ref)))
        assert local.model.get(job).parent == queue
        assert (await ended(local, job))[K.STATE] == "FINISHED"


async def test_exec_path_forms(local):
    for pairs in (
        [(A.EXEC_PATH, "/bin"), (A.EXEC_NAME, "true")],  # directory + name
        [(A.EXEC_PATH, "/bin/true"), (A.EXEC_NAME, "true")],  # full path + name
        [(A.EXEC_NAME, "/bin/true")],  # a path in execName
    ):
        job = await local.submit_ptp(job_attrs(*pairs))
        assert (await ended(local, job))[K.STATE] == "FINISHED"


# --------------------------------------------------------------------------- shutdown


async def test_aclose_terminates_and_reaps_everything(nursery):
    backend = LocalBackend(ServiceModel(), LocalOptions(kill_grace=600.0))  # shutdown must not wait that long
    local = await start_backend(nursery, backend)
    model = local.model
    stubborn = await local.submit_ptp(shell('trap "" TERM; echo ready; sleep 600', (A.JOB_NUM_PROCS, "2")))
    polite = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "600")))
    await running(local, polite)
    stubborn_procs = processes(local, stubborn)
    await wait_for(lambda: all(output(local, p) for p in stubborn_procs))
    pids = [pid_of(local, p) for job in (stubborn, polite) for p in processes(local, job)]
    with trio.fail_after(scaled(60)):  # far less than the grace or the jobs' own time
        await backend.aclose()
    for pid in pids:
        assert gone(pid)  # not even a zombie: reaped
    for job in (stubborn, polite):  # and nothing they started survives
        await wait_for(lambda: not live_members(pid_of(local, processes(local, job)[0])))
    for job in (stubborn, polite):
        assert model.attr(job, K.STATE) == "KILLED"
    with pytest.raises(SubmitError, match="shutting down") as info:
        await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true")))
    assert info.value.kind is ErrorKind.SHUTTING_DOWN


async def test_aclose_while_jobs_are_starting(nursery):
    backend = LocalBackend(ServiceModel(), LocalOptions(kill_grace=0.2))
    local = await start_backend(nursery, backend)
    model = local.model
    jobs = [
        await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30"), sub_id=f"s{i}"))
        for i in range(20)
    ]
    await trio.sleep(0.005)  # some have started, some have not
    started = [pid_of(local, p) for j in jobs for p in processes(local, j) if model.attr(p, K.PID)]
    await backend.aclose()
    assert {model.attr(j, K.STATE) for j in jobs} == {"KILLED"}
    assert all(local.ended(p) for j in jobs for p in processes(local, j))
    assert all(gone(pid) for pid in started)
    assert not backend._jobs


async def test_cancelling_the_service_reaps_everything():
    backend = LocalBackend(ServiceModel(), LocalOptions(kill_grace=0.2))
    async with trio.open_nursery() as nursery:
        local = await start_backend(nursery, backend)
        job = await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/sleep"), (A.PROG_ARGS, "30")))
        await running(local, job)
        pid = pid_of(local, processes(local, job)[0])
        nursery.cancel_scope.cancel()
    assert gone(pid)
    assert local.model.attr(job, K.STATE) == "KILLED"


async def test_cancelling_run_reaps_everything():
    model = ServiceModel()
    backend = LocalBackend(model, LocalOptions(kill_grace=0.2))
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.run)
        job = (await backend.submit(JobSpec("/bin/sleep", ["30"], num_procs=2), backend.default_queue)).key
        await wait_for(lambda: model.attr(job, K.STATE) == "RUNNING")
        pids = [int(model.attr(p, K.PID)) for p in model.processes(job)]
        nursery.cancel_scope.cancel()
    assert all(gone(pid) for pid in pids)
    assert model.attr(job, K.STATE) == "KILLED"
    assert {model.attr(p, K.STATE) for p in model.processes(job)} == {"KILLED"}


async def test_submit_throughput_smoke(local):
    # not a benchmark: many short jobs, all completing, none lost
    jobs = [await local.submit_ptp(job_attrs((A.EXEC_PATH, "/bin/true"), sub_id=f"s{i}")) for i in range(100)]
    await wait_for(lambda: all(local.ended(j) for j in jobs))
    assert {local.model.attr(j, K.STATE) for j in jobs} == {"FINISHED"}
    assert not local.backend._jobs


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
