"""Grid Engine for real: jobs submitted through the qsub argv and the job script of
``sge_script`` to the cell of ``scripts/sge-up``, watched through ``sge`` queries and
``sge_parse`` parsers, controlled through ``sge`` job commands.

The cell schedules every second, so each test takes a few seconds.  Other jobs may share
the cell: the tests look only at their own, and delete whatever they leave behind.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

import sge_support
from proxy_agent.schedulers.batch.sge import directives as sge_script, parse as sge_parse, system as sge
from wait_support import scaled
from proxy_agent.schedulers.batch.records import NativeJob
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, JobState

pytestmark = pytest.mark.sge

sge_support.require_cell()

HOSTILE = ["plain", "two words", "single ' quote", 'double " quote', "$(touch pwned)", "`touch pwned`",
           "$HOME", "line1\nline2", "-n", "--", "#$ -o /etc/x", "héllo wörld ✓", ""]

submitted: List[str] = []


def run(argv: List[str], stdin: Optional[str] = None, timeout: float = scaled(30)) -> subprocess.CompletedProcess:
    return sge_support.run(argv, timeout=timeout, stdin=stdin)


def submit(spec: JobSpec, user: Optional[str] = None) -> str:
    argv = sge_script.submit_argv(spec)
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    result = run(argv, stdin=sge_script.render_script(spec))
    number, tasks = sge_parse.parse_qsub_terse(result.stdout + result.stderr)
    submitted.append(number)
    return number


def command(argv: List[str]) -> None:
    result = run(argv)
    sge.check_job_command(argv, result.returncode, result.stdout, result.stderr)


def listing() -> Dict[str, NativeJob]:
    result = run(sge.status_argv(all_users=True))
    assert result.returncode == 0, result.stderr
    return {job.job_id: job for job in sge_parse.parse_jobs(result.stdout)}


def mine(number: str) -> Dict[str, NativeJob]:
    """The listed records of job ``number`` (one, or one per array task group)."""
    return {k: v for k, v in listing().items() if k.split(".")[0] == number}


def wait_for(what: str, check: Callable[[], object], limit: float = scaled(30.0)):
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {limit}s waiting for {what} (last: {last!r}; jobs: {listing()})")


def wait_state(number: str, wanted: JobState, limit: float = scaled(30.0)) -> NativeJob:
    def check():
        job = mine(number).get(number)
        return job if job is not None and sge.STATE_TABLE.map(job.native_state) is wanted else None
    return wait_for(f"job {number} to be {wanted.value}", check, limit)


def wait_gone(number: str, limit: float = scaled(30.0)) -> None:
    wait_for(f"job {number} to leave the queue", lambda: not mine(number), limit)


def accounting(job_id: str, records: int = 1) -> List[NativeJob]:
    def check():
        result = run(sge.accounting_argv(job_id))
        found = sge_parse.parse_qacct(result.stdout) if result.returncode == 0 else []
        return found if len(found) >= records else None
    return wait_for(f"accounting of {job_id}", check)


@pytest.fixture(autouse=True)
def delete_leftovers():
    yield
    leftovers = [n for n in submitted if any(k.split(".")[0] == n for k in listing())]
    if leftovers:
        run(["qdel", "-f", *leftovers])
    submitted.clear()


# --------------------------------------------------------------------------- tests


def test_job_runs_and_ends_with_its_exit_code(tmp_path: Path):
    out, err = tmp_path / "out", tmp_path / "err"
    spec = JobSpec("/bin/sh", ["-c", 'printf "%s\\0" "$@"; printf "%s" "$GREETING" >&2; sleep 1.5; exit 3',
                               "sh", *HOSTILE],
                   name="cell_exit3", stdout_path=str(out), stderr_path=str(err), working_dir=str(tmp_path),
                   environment={"GREETING": "hi $(there) 'you'"}, prologue=("echo prologue >&2",))
    number = submit(spec)
    running = wait_state(number, JobState.RUNNING)
    assert (running.name, running.user, running.num_procs) == ("cell_exit3", "root", 1)
    assert running.queue in ("all.q", "short.q") and running.hosts
    wait_gone(number)
    [record] = accounting(number)
    assert (record.exit_code, record.name) == (3, "cell_exit3")
    assert sge.accounting_state(record) is JobState.FAILED
    assert out.read_bytes().decode("utf-8").split("\0")[:-1] == HOSTILE
    assert err.read_text(encoding="utf-8") == "prologue\nhi $(there) 'you'"
    assert not list(tmp_path.glob("pwned*"))


def test_hold_then_release(tmp_path: Path):
    number = submit(JobSpec("/bin/sleep", ["1"], name="cell_hold", hold=True,
                            stdout_path="/dev/null", stderr_path="/dev/null"))
    held = wait_state(number, JobState.HOLD)
    assert held.native_state == "hqw"
    command(sge.hold_argv(number))  # already held: Grid Engine says nothing, which is fine
    command(sge.release_argv(number))
    wait_gone(number)
    [record] = accounting(number)
    assert record.exit_code == 0 and sge.accounting_state(record) is JobState.FINISHED


def test_suspend_resume_delete():
    number = submit(JobSpec("/bin/sleep", ["60"], name="cell_suspend", stdout_path="/dev/null",
                            stderr_path="/dev/null"))
    wait_state(number, JobState.RUNNING)
    command(sge.suspend_argv(number))
    assert wait_state(number, JobState.SUSPENDED).native_state == "s"
    command(sge.suspend_argv(number))  # "already suspended" counts as done
    command(sge.resume_argv(number))
    assert wait_state(number, JobState.RUNNING).native_state == "r"
    command(sge.delete_argv(number))
    wait_gone(number)
    [record] = accounting(number)
    assert sge.accounting_state(record) is JobState.KILLED
    assert record.signal == "SIGKILL" and record.reason.startswith("100")


def test_move_a_waiting_job_but_not_a_running_one():
    number = submit(JobSpec("/bin/sleep", ["30"], name="cell_move", hold=True, queue="all.q",
                            stdout_path="/dev/null", stderr_path="/dev/null"))
    held = wait_state(number, JobState.HOLD)
    assert held.queue == "all.q"
    command(sge.move_argv(number, "short.q", held.native_state))
    assert mine(number)[number].queue == "short.q"
    [detail] = sge_parse.parse_job_detail(run(sge.detail_argv([number])).stdout)
    assert detail.queue == "short.q"
    command(sge.release_argv(number))
    running = wait_state(number, JobState.RUNNING)
    assert running.queue == "short.q"
    with pytest.raises(JobError, match="only while it waits"):
        sge.move_argv(number, "all.q", running.native_state)
    with pytest.raises(JobError) as err:
        command(sge.move_argv(number, "nosuch.q", "qw"))
    assert err.value.kind is ErrorKind.NO_SUCH_QUEUE


def test_error_state_shows_why():
    number = submit(JobSpec("/bin/true", name="cell_eqw", stdout_path="/nonexistent-sge-test/dir/out",
                            stderr_path="/dev/null"))
    job = wait_state(number, JobState.HOLD)
    assert job.native_state == "Eqw"
    [detail] = sge_parse.parse_job_detail(run(sge.detail_argv([number])).stdout)
    assert "/nonexistent-sge-test/dir/out" in detail.reason and "open" in detail.reason
    command(sge.delete_argv(number))
    wait_gone(number)


def test_refusals_are_read_from_the_answers():
    with pytest.raises(JobError) as err:
        command(sge.delete_argv("999999999"))
    assert err.value.kind is ErrorKind.NO_SUCH_JOB
    number = submit(JobSpec("/bin/true", name="cell_refuse", hold=True, stdout_path="/dev/null",
                            stderr_path="/dev/null"))
    wait_state(number, JobState.HOLD)
    with pytest.raises(JobError) as err:  # qmod exits 0 here
        command(sge.suspend_argv(number))
    assert err.value.kind is ErrorKind.OPERATION_FAILED
    assert not sge_parse.parse_job_detail(run(sge.detail_argv(["999999999"])).stdout)
    result = run(sge_script.submit_argv(JobSpec("/bin/true", queue="nosuch.q")), stdin="#!/bin/sh\n")
    with pytest.raises(sge_parse.SgeParseError, match="unknown queue"):
        sge_parse.parse_qsub_terse(result.stdout + result.stderr)


def test_batch_attributes_reach_the_cell():
    spec = JobSpec("/bin/sleep", ["30"], name="cell_attrs", hold=True, num_procs=2, wall_time=120, memory=300,
                   account="acct_x", gpus=1, constraint="ssd", exclusive=True, queue="all.q",
                   stdout_path="/dev/null", stderr_path="/dev/null", native_options=("-m", "n", "-notify"))
    number = submit(spec)
    job = wait_state(number, JobState.HOLD)
    assert (job.num_procs, job.time_limit, job.queue) == (2, 120, "all.q")
    raw = run(sge.detail_argv([number])).stdout
    [detail] = sge_parse.parse_job_detail(raw)
    assert (detail.account, detail.num_procs, detail.time_limit) == ("acct_x", 2, 120)
    for resource in ("<CE_name>gpu</CE_name>", "<CE_name>ssd</CE_name>", "<CE_name>exclusive</CE_name>",
                     "<CE_stringval>150M</CE_stringval>", "<JB_pe>smp</JB_pe>"):
        assert resource in raw, resource


def test_constraint_runs_and_missing_gpu_waits():
    fast = submit(JobSpec("/bin/true", name="cell_ssd", constraint="ssd", stdout_path="/dev/null",
                          stderr_path="/dev/null"))
    gpu = submit(JobSpec("/bin/true", name="cell_gpu", gpus=1, stdout_path="/dev/null", stderr_path="/dev/null"))
    wait_gone(fast)
    assert accounting(fast)[0].exit_code == 0
    # No host offers a GPU: after several scheduling rounds it still waits.  Each job
    # submitted after it and run to its end took a round that passed it over.
    for round_ in range(3):
        wait_gone(submit(JobSpec("/bin/true", name=f"cell_round{round_}", stdout_path="/dev/null",
                                 stderr_path="/dev/null")))
    assert mine(gpu)[gpu].native_state == "qw"


def test_array_tasks(tmp_path: Path):
    number = submit(JobSpec("/bin/sh", ["-c", "sleep 1; exit $SGE_TASK_ID"], name="cell_array", array="1-4%2",
                            stdout_path="/dev/null", stderr_path="/dev/null"))
    seen = wait_for("array tasks to run", lambda: [k for k, v in mine(number).items()
                                                   if v.native_state == "r" and v.array_index.isdigit()])
    assert len(seen) <= 2 and all(k.startswith(number + ".") for k in seen)
    wait_gone(number, limit=40)
    for task in range(1, 5):
        [record] = accounting(f"{number}.{task}")
        assert (record.job_id, record.exit_code) == (f"{number}.{task}", task)


def test_other_users_jobs():
    number = submit(JobSpec("/bin/true", name="cell_other", hold=True, stdout_path="/dev/null",
                            stderr_path="/dev/null"), user=sge_support.OTHER_USER)
    job = wait_state(number, JobState.HOLD)
    assert job.user == sge_support.OTHER_USER
    own = sge_parse.parse_jobs(run(sge.status_argv()).stdout)
    assert number not in {j.job_id for j in own}
    theirs = sge_parse.parse_jobs(run(sge.status_argv(user=sge_support.OTHER_USER)).stdout)
    assert number in {j.job_id for j in theirs}
    command(sge.delete_argv(number))  # root is a manager
    wait_gone(number)


def test_queues_and_hosts():
    queues = {q.name: q for q in sge_parse.parse_queues(run(sge.queues_argv()).stdout)}
    assert queues["all.q"].total_slots >= 4 and queues["short.q"].total_slots >= 1
    assert queues["all.q"].state == "NORMAL"
    nodes = sge_parse.parse_hosts(run(sge.hosts_argv()).stdout)
    assert nodes and all(n.name != "global" for n in nodes)
    node = [n for n in nodes if "all.q" in n.queues][0]
    assert node.state == "UP" and node.cpus == os.cpu_count() and node.memory_mb > 0
    short = sge_parse.parse_queue_config(run(sge.queue_config_argv("short.q")).stdout)
    assert sge_parse.queue_max_time(short) == 600
