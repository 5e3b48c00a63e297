"""Ended jobs do not pile up: clients are shown those that ended within ``--show-ended``
(24 hours), the store forgets them with what it keeps of them after ``--keep-ended`` (14 days),
and ``forget`` takes any ended job, one that never started too."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time

import pytest
import trio

from adoption_support import spawn_agent, start
from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.launch import stop_service
from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.service import history
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.model import K, Kind
from proxy_agent.service.service import KEEP_ENDED, SHOW_ENDED, JobService
from proxy_agent.service.store import JobStore, open_store
from wait_support import scaled

HOUR, DAY = 3600.0, 86400.0


def _rows(state: str):
    result = subprocess.run(agent_argv("jobs", "--json", "--state-dir", state), capture_output=True, text=True,
                            timeout=scaled(60), env=subprocess_env(), stdin=subprocess.DEVNULL)
    return {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}


def _old_jobs(state: str) -> None:
    """Local jobs an earlier agent ran, ended 15 days, 2 days and an hour ago, each with its
    kept output."""
    os.makedirs(state, mode=0o700, exist_ok=True)
    store = JobStore(os.path.join(state, JobStore.FILE))
    now = time.time()
    ages = {"fortnight": 15 * DAY, "two-days": 2 * DAY, "an-hour": HOUR}
    for key, (name, age) in enumerate(ages.items(), start=100):
        store.note_submission(key, "local", "local:default", JobSpec(executable="/bin/echo", name=name))
        kept = history.OutputHistory(state)
        kept.record(key, 0, "stdout", f"output of {name}", None)
        kept.close()
    store.write_submissions()
    store.close()
    with sqlite3.connect(os.path.join(state, JobStore.FILE)) as db:
        for key, (name, age) in enumerate(ages.items(), start=100):
            db.execute("UPDATE jobs SET state='FINISHED', native_state='EXITED', exit_code='0', submitted=?, ended=?"
                       " WHERE key=?", (now - age - 60, now - age, key))


async def _names_in_the_model(client) -> set:
    return {job.name for job in client.jobs.values()}


async def test_clients_see_recent_ended_jobs_and_old_ones_are_forgotten(tmp_path):
    state = str(tmp_path / "state")
    _old_jobs(state)
    with trio.fail_after(scaled(60)):
        async with await spawn_agent(state) as client:
            await start(client)
            assert await _names_in_the_model(client) == {"an-hour"}
            # forgotten at start: the store entry and the kept output
            while "fortnight" in await trio.to_thread.run_sync(lambda: _rows(state)):
                await trio.sleep(0.1)
            assert not os.path.exists(history.job_directory(state, 100))
            assert set(await trio.to_thread.run_sync(lambda: _rows(state))) == {"two-days", "an-hour"}
            assert os.path.exists(history.job_directory(state, 101))  # still listed: still kept
            await client.quit()
        # the directory's service keeps the options it was started with: the next one takes these
        await trio.to_thread.run_sync(lambda: stop_service(state))
        async with await spawn_agent(state, "--show-ended", "3d", "--keep-ended", "never") as client:
            await start(client)
            assert await _names_in_the_model(client) == {"two-days", "an-hour"}
            await client.quit()


def test_the_window_and_the_time_kept_are_options_with_units(tmp_path):
    from proxy_agent.__main__ import parse_arguments

    args = parse_arguments(["--keep-ended", "36h", "--show-ended", "90m"])
    assert (args.keep_ended, args.show_ended) == (36 * HOUR, 90 * 60.0)
    args = parse_arguments([])
    assert (args.keep_ended, args.show_ended) == (KEEP_ENDED, SHOW_ENDED) == (14 * DAY, 24 * HOUR)
    args = parse_arguments(["--keep-ended", "never", "--show-ended", "all", "--keep-ended", "3"])
    assert (args.keep_ended, args.show_ended) == (3 * DAY, None)
    bad = subprocess.run(agent_argv("--keep-ended", "soon"), capture_output=True, text=True, timeout=scaled(30),
                         env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "--keep-ended: invalid duration value: 'soon'" in bad.stderr


async def test_a_running_agent_hides_then_forgets_what_ended_long_ago(tmp_path):
    store = open_store(str(tmp_path))
    service = JobService(store=store)
    service.add_backend(LocalBackend(service.model, None, service.context(state_dir=str(tmp_path))))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(scaled(30)):
            await service.ready.wait()
            key = await service.submit(JobSpec("/bin/echo", ("kept",)))
            while service.model.attr(key, K.STATE) != "FINISHED":
                await trio.sleep(0.05)
        service._write_store()
        assert service.hide_ended(time.time() + SHOW_ENDED / 2) == []
        assert service.hide_ended(time.time() + SHOW_ENDED + 60) == [key]
        assert key not in service.model and service.model.count(Kind.JOB) == 0
        assert store.job(key) is not None and history.read_job_output(str(tmp_path), key).text() == "kept\n"
        assert service.forget_ended(time.time() + KEEP_ENDED / 2) == []
        assert service.forget_ended(time.time() + KEEP_ENDED + 60) == [key]
        assert store.job(key) is None
        assert not os.path.exists(history.job_directory(str(tmp_path), key))
        assert not os.path.exists(os.path.join(str(tmp_path), "local", "jobs", str(key)))
        nursery.cancel_scope.cancel()
    store.close()


@pytest.mark.parametrize("state, native", [("DELETED", "UNKNOWN"), ("KILLED", "TERMINATED"), ("FAILED", "NOT_STARTED")])
def test_forget_takes_an_ended_job_that_never_started(tmp_path, state, native):
    directory = str(tmp_path / "state")
    os.makedirs(directory)
    store = JobStore(os.path.join(directory, JobStore.FILE))
    store.record_submission(7, "slurm", "slurm:debug", JobSpec("/bin/true", name="never"))
    store.mark_lost(7, "the agent ended before sbatch answered")
    store.close()
    with sqlite3.connect(os.path.join(directory, JobStore.FILE)) as db:
        db.execute("UPDATE jobs SET state=?, native_state=? WHERE key=7", (state, native))
    result = subprocess.run(agent_argv("forget", "7", "--state-dir", directory), capture_output=True, text=True,
                            timeout=scaled(30), env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stdout.strip() == "forgot 1 job", result.stderr
    assert _rows(directory) == {}
