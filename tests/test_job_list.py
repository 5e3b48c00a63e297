"""``proxy-agent jobs``: filters, chosen columns and JSON rows that say everything the store
knows (exit code or signal, native id, the broker's choice and reason, times with their zone),
read from a real store the way an agent writes it."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from agent_fixtures import subprocess_env
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.store import JobStore
from wait_support import scaled

HOUR = 3600.0
DAY = 24 * HOUR


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy_agent", *args], capture_output=True, text=True, timeout=scaled(60),
                          env=subprocess_env(), stdin=subprocess.DEVNULL)


@pytest.fixture
def state(tmp_path):
    """A store with jobs of several schedulers, states and ages (as agents record them)."""
    directory = str(tmp_path / "state")
    os.makedirs(directory, mode=0o700)
    store = JobStore(os.path.join(directory, JobStore.FILE))
    now = time.time()
    jobs = [
        # key, backend, queue, name, native id, state, native state, submitted ago, ended ago, exit, signal, extra
        (11, "local", "local:default", "build", "31337", "FINISHED", "EXITED", 3 * DAY, 3 * DAY - 60, "0", "", None),
        (12, "slurm", "slurm:debug", "sweep-a", "4242", "FAILED", "FAILED", 5 * HOUR, 4 * HOUR, "3", "", None),
        (13, "slurm", "slurm:long", "sweep-b", "4243", "RUNNING", "RUNNING", 1 * HOUR, None, "", "", None),
        (14, "local", "local:default", "sleeper", "31400", "KILLED", "TERMINATED", 2 * HOUR, HOUR, "", "SIGKILL",
         None),
        (15, "sge", "sge:all.q", "brokered", "77", "QUEUING", "qw", 10 * 60, None, "", "",
         {"broker": {"broker": "FastestQueue", "brokerQueue": "sge:all.q",
                     "brokerReason": "FastestQueue: 0 waiting of 4 slots, 4 free"}}),
    ]
    for key, backend, queue, name, native, *_rest in jobs:
        store.note_submission(key, backend, queue, JobSpec(executable="/bin/true", name=name, client_ref=f"sub-{key}"),
                              _rest[-1])
    store.write_submissions()
    store.close()
    with sqlite3.connect(os.path.join(directory, JobStore.FILE)) as db:
        for key, _b, _q, _n, native, state_, native_state, submitted, ended, code, sig, _e in jobs:
            db.execute("UPDATE jobs SET native_id=?, state=?, native_state=?, submitted=?, ended=?, exit_code=?,"
                       " signal=? WHERE key=?",
                       (native, state_, native_state, now - submitted, None if ended is None else now - ended, code,
                        sig, key))
    return directory


def _json(state, *args):
    result = _run("jobs", "--state-dir", state, "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _ids(state, *args):
    return [row["id"] for row in _json(state, *args)]


def test_json_rows_say_how_each_job_ended_where_it_runs_and_why_it_went_there(state):
    rows = {row["id"]: row for row in _json(state)}
    assert rows[12]["exit_code"] == 3 and rows[12]["signal"] is None and rows[12]["native_id"] == "4242"
    assert rows[14]["exit_code"] is None and rows[14]["signal"] == "SIGKILL"
    assert rows[11]["exit_code"] == 0 and rows[13]["exit_code"] is None and rows[13]["ended"] is None
    assert rows[15]["broker"] == "FastestQueue" and rows[15]["broker_queue"] == "sge:all.q"
    assert rows[15]["broker_reason"].startswith("FastestQueue: 0 waiting")
    assert rows[12]["broker"] is None and rows[12]["client_ref"] == "sub-12"
    for row in rows.values():
        submitted = dt.datetime.fromisoformat(row["submitted"])
        assert submitted.tzinfo is not None and row["submitted"][10] == "T"
        assert abs(submitted.timestamp() - time.time()) < 4 * DAY
    assert dt.datetime.fromisoformat(rows[12]["ended"]).utcoffset() is not None


def test_filters_by_state_scheduler_queue_name_and_time(state):
    assert _ids(state, "--state", "failed") == [12]
    assert _ids(state, "--state", "FAILED,KILLED") == [12, 14]
    assert _ids(state, "--state", "active") == [13, 15]
    assert _ids(state, "--state", "ended") == [11, 12, 14]
    assert _ids(state, "--scheduler", "slurm") == [12, 13]
    assert _ids(state, "--scheduler", "slurm,sge") == [12, 13, 15]
    assert _ids(state, "--queue", "default") == [11, 14]
    assert _ids(state, "--queue", "slurm:*") == [12, 13]
    assert _ids(state, "--queue", "debug,all.q") == [12, 15]
    assert _ids(state, "--name", "sweep-*") == [12, 13]
    assert _ids(state, "--name", "build") == [11]
    # in any state at or after the time: not ended before it
    assert _ids(state, "--since", "2h") == [13, 14, 15]
    assert _ids(state, "--since", "1d") == [12, 13, 14, 15]
    assert _ids(state, "--until", "3h") == [11, 12]
    yesterday = (dt.datetime.now() - dt.timedelta(days=1)).isoformat(timespec="minutes")
    assert _ids(state, "--since", yesterday) == [12, 13, 14, 15]
    assert _ids(state, "--scheduler", "slurm", "--state", "active", "--since", "2h") == [13]


def test_chosen_columns_in_the_table_and_in_json(state):
    table = _run("jobs", "--state-dir", state, "--format", "id,state,exit,native_id", "--scheduler", "slurm,local")
    assert table.returncode == 0, table.stderr
    lines = [line.split() for line in table.stdout.splitlines()]
    assert lines[0] == ["ID", "STATE", "EXIT", "NATIVE", "ID"]
    assert lines[1:] == [["11", "FINISHED", "0", "31337"], ["12", "FAILED", "3", "4242"], ["13", "RUNNING", "4243"],
                         ["14", "KILLED", "SIGKILL", "31400"]]
    bare = _run("jobs", "--state-dir", state, "--format", "id,name", "--no-header", "--state", "active")
    assert bare.stdout.split() == ["13", "sweep-b", "15", "brokered"]
    assert _json(state, "--format", "id,exit_code,broker", "--name", "brokered") == [
        {"id": 15, "exit_code": None, "broker": "FastestQueue"}]


@pytest.mark.parametrize("args, message", [
    (["--format", "id,stat"], "no column 'stat' (did you mean state?)"),
    (["--state", "RUNING"], "no state 'RUNING' (did you mean RUNNING?)"),
    (["--since", "last tuesday"], "is not a time like"),
])
def test_a_bad_filter_or_column_is_one_line_and_status_2(state, args, message):
    result = _run("jobs", "--state-dir", state, *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout


def test_forget_takes_any_ended_job_and_keeps_the_others(state):
    result = _run("forget", "--state-dir", state, "12", "13", "14", "99")
    assert result.returncode == 1
    assert "job 13 has not ended; it is kept" in result.stderr and "no job 99 in the list" in result.stderr
    assert "forgot 2 jobs" in result.stdout
    assert _ids(state) == [11, 13, 15]
    assert _run("forget", "--state-dir", state, "--ended-before", "2d").stdout.strip() == "forgot 1 job"
    assert _ids(state) == [13, 15]


def test_listing_and_reading_output_change_nothing_in_the_state_directory(state):
    """The tools read the store without a write lock a running agent's writes would wait for,
    and leave the store and its log as they were (not even their mode is set again; readers
    of a log do mark the shared-memory file, as SQLite's readers do)."""
    def snapshot() -> dict:
        found = {}
        for name in sorted(os.listdir(state)):
            info = os.lstat(os.path.join(state, name))
            if name.endswith("-shm"):
                found[name] = info.st_mode
            elif name.endswith("-wal"):  # (SQLite run by root gives it the store's owner again)
                found[name] = (info.st_mode, info.st_size, info.st_mtime_ns)
            else:
                found[name] = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        return found

    before = snapshot()
    time.sleep(0.05)  # (a change now would show in the times)
    for args in (("jobs", "--json"), ("jobs", "--state", "ended"), ("output", "12"), ("output", "sweep-a")):
        result = _run(*args, "--state-dir", state)
        assert result.returncode == 0, (args, result.stderr)
    assert snapshot() == before
    # listed while another process holds the store's write lock (an agent writing a burst)
    writer = sqlite3.connect(os.path.join(state, JobStore.FILE), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        listed = _run("jobs", "--json", "--state-dir", state)
        assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 5, listed.stderr
        writer.execute("ROLLBACK")
    finally:
        writer.close()
