"""The local-process job gateway of the Invoke Server, on its own."""

from __future__ import annotations

import os

import pytest
import trio

from proxy_agent.frontends.invoke.local import MAX_PROCS, LocalJobs
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, JobState, SubmitError


async def updates(jobs: LocalJobs, key: int, limit: float = 10):
    seen = []
    with trio.fail_after(limit):
        async for update in jobs.watch(key):
            seen.append((update.state, update.message))
    return seen


async def test_a_job_goes_accepted_running_finished():
    async with LocalJobs.open() as jobs:
        key = await jobs.submit(JobSpec("/bin/true"))
        assert await updates(jobs, key) == [
            (JobState.ACCEPTED, "queued"),
            (JobState.RUNNING, "started"),
            (JobState.FINISHED, "exit status 0"),
        ]
        # A second watcher sees the same history.
        assert (await updates(jobs, key))[-1] == (JobState.FINISHED, "exit status 0")


async def test_exit_status_and_signal_are_reported():
    async with LocalJobs.open() as jobs:
        key = await jobs.submit(JobSpec("/bin/sh", ["-c", "exit 7"]))
        assert (await updates(jobs, key))[-1] == (JobState.FAILED, "exit status 7")
        key = await jobs.submit(JobSpec("/bin/sh", ["-c", "kill -SEGV $$"]))
        assert (await updates(jobs, key))[-1] == (JobState.FAILED, "killed by signal SIGSEGV")


async def test_wall_time_ends_the_job():
    async with LocalJobs.open(kill_grace=0.2) as jobs:
        key = await jobs.submit(JobSpec("/bin/sleep", ["30"], wall_time=1))
        start = trio.current_time()
        assert (await updates(jobs, key))[-1] == (JobState.FAILED, "exceeded its wall time of 1 s")
        assert trio.current_time() - start < 3


async def test_cancel_a_job_that_ignores_sigterm():
    async with LocalJobs.open(kill_grace=0.3) as jobs:
        key = await jobs.submit(JobSpec("/bin/sh", ["-c", "trap '' TERM; sleep 30"]))
        seen = []
        async for update in jobs.watch(key):
            seen.append(update.state)
            if update.state is JobState.RUNNING:
                await trio.sleep(0.1)  # let the shell set its trap
                await jobs.cancel(key)
        assert seen[-1] is JobState.KILLED
        await jobs.cancel(key)  # ended already: no error


async def test_program_in_no_executable_format_fails_the_job(tmp_path):
    program = tmp_path / "text"
    program.write_text("not a program\n")
    program.chmod(0o755)
    async with LocalJobs.open() as jobs:
        key = await jobs.submit(JobSpec(str(program)))
        state, message = (await updates(jobs, key))[-1]
        assert state is JobState.FAILED and message == f"cannot start {program}: Exec format error"


@pytest.mark.parametrize(
    "spec, words",
    [
        (JobSpec("/nonexistent/prog"), "program /nonexistent/prog: No such file or directory"),
        (JobSpec("/tmp"), "program /tmp is not a regular file"),
        (JobSpec("/etc/passwd"), "program /etc/passwd is not executable"),
        (JobSpec("/bin/true", working_dir="/nonexistent"), "working directory /nonexistent does not exist"),
        (JobSpec("/bin/true", num_procs=MAX_PROCS + 1), f"1 to {MAX_PROCS} processes"),
        (JobSpec("/bin/true", nodes=2), "this host is one node"),
        (JobSpec("/bin/true", queue="slurm:debug"), "no queue slurm:debug here"),
        (JobSpec("/bin/true", extra=[("scheduler", "pbs")]), "scheduler 'pbs' is not available"),
        (JobSpec("/bin/true", stdout_path="/nonexistent/out"), "cannot open output file /nonexistent/out"),
    ],
)
async def test_submissions_that_cannot_run_are_refused(spec, words):
    async with LocalJobs.open() as jobs:
        with pytest.raises(SubmitError) as info:
            await jobs.submit(spec)
        assert words in info.value.message


async def test_queue_names_of_this_host_are_accepted():
    async with LocalJobs.open() as jobs:
        for spec in (
            JobSpec("/bin/true", queue="default"),
            JobSpec("/bin/true", queue="local:default"),
            JobSpec("/bin/true", candidates=["slurm:x", "local:default"]),
        ):
            key = await jobs.submit(spec)
            assert (await updates(jobs, key))[-1][0] is JobState.FINISHED


async def test_slots_queue_jobs_and_cancel_reaches_a_waiting_one():
    async with LocalJobs.open(slots=1) as jobs:
        first = await jobs.submit(JobSpec("/bin/sleep", ["30"]))
        second = await jobs.submit(JobSpec("/bin/true"))
        await trio.sleep(0.2)
        await jobs.cancel(second)
        assert await updates(jobs, second) == [
            (JobState.ACCEPTED, "queued"),
            (JobState.QUEUING, "waiting for a free slot"),
            (JobState.KILLED, "cancelled before it started"),
        ]
        await jobs.cancel(first)
        assert (await updates(jobs, first))[-1] == (JobState.KILLED, "cancelled")


async def test_closing_ends_every_job():
    async with LocalJobs.open(kill_grace=0.3) as jobs:
        keys = [await jobs.submit(JobSpec("/bin/sleep", ["30"])) for _ in range(3)]
        await trio.sleep(0.2)
        pids = [p.pid for k in keys for p in jobs._jobs[k].procs]
    assert len(pids) == 3
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_unknown_job_keys():
    async with LocalJobs.open() as jobs:
        with pytest.raises(JobError) as info:
            await jobs.cancel(99)
        assert info.value.kind is ErrorKind.NO_SUCH_JOB
        with pytest.raises(JobError):
            jobs.watch(99)
