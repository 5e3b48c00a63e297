"""The job store on its own: schema and migration, damaged files kept aside, the state
directory's lock, delivery records, forgetting."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from agent_fixtures import subprocess_env
from wait_support import scaled
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.store import (
    SCHEMA_VERSION,
    JobStore,
    StateDirInUse,
    StateLock,
    StoreError,
    holder_of,
    open_store,
)

#: A store as the first released schema wrote it, written here by hand (not by the code
#: under test), with one job in it.
SCHEMA_1 = """
CREATE TABLE jobs (
    key INTEGER PRIMARY KEY, backend TEXT NOT NULL, queue TEXT NOT NULL DEFAULT '',
    native_id TEXT NOT NULL DEFAULT '', name TEXT NOT NULL DEFAULT '', client_ref TEXT NOT NULL DEFAULT '',
    spec TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL DEFAULT 'ACCEPTED', native_state TEXT NOT NULL DEFAULT '',
    message TEXT NOT NULL DEFAULT '', submitted REAL NOT NULL, ended REAL, delivered TEXT NOT NULL DEFAULT '{}',
    extra TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX jobs_ended ON jobs (ended);
INSERT INTO jobs (key, backend, queue, native_id, name, spec, state, native_state, submitted, ended, delivered)
VALUES (7, 'slurm', 'slurm:debug', '4242', 'old', '{"executable": "/bin/true"}', 'FINISHED', 'COMPLETED',
        1000.0, 1010.0, '{"0.stdout": 12}');
PRAGMA user_version = 1;
"""


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _columns(path) -> list:
    db = sqlite3.connect(path)
    try:
        return [row[1] for row in db.execute("PRAGMA table_info(jobs)")]
    finally:
        db.close()


def _version(path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_a_new_store_has_the_current_schema_in_wal_mode(tmp_path):
    store = open_store(str(tmp_path))
    store.close()
    path = tmp_path / JobStore.FILE
    assert _version(path) == SCHEMA_VERSION == 2
    assert {"exit_code", "signal"} <= set(_columns(path))
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def _mode(path) -> int:
    return os.lstat(path).st_mode & 0o777


def test_a_new_store_and_its_log_are_the_users_alone_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        store = open_store(str(tmp_path))
        store.record_submission(1, "local", "local:default", JobSpec("/bin/true"))
        path = tmp_path / JobStore.FILE
        names = [path, tmp_path / (JobStore.FILE + "-wal"), tmp_path / (JobStore.FILE + "-shm")]
        assert all(name.exists() for name in names)
        assert [oct(_mode(name)) for name in names] == ["0o600"] * 3
        store.close()
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == [JobStore.FILE]  # nothing left of the store's making


def test_an_older_agents_store_and_its_log_are_made_the_users_alone(tmp_path):
    """An agent that gave the store the umask's mode left it (and its log and shared-memory
    file, which SQLite makes with the store's mode) readable by others."""
    open_store(str(tmp_path)).close()
    path = tmp_path / JobStore.FILE
    os.chmod(path, 0o644)
    older = sqlite3.connect(path)  # an older agent, still writing: its log and shared memory are there
    try:
        older.execute("PRAGMA journal_mode=WAL")
        older.execute("INSERT INTO jobs (key, backend, submitted) VALUES (5, 'local', 1000.0)")
        older.commit()
        names = [path, tmp_path / (JobStore.FILE + "-wal"), tmp_path / (JobStore.FILE + "-shm")]
        for name in names:
            os.chmod(name, 0o644)
        store = open_store(str(tmp_path))
        assert [oct(_mode(name)) for name in names] == ["0o600"] * 3
        assert [job.key for job in store.jobs()] == [5]
        store.close()
    finally:
        older.close()


def test_a_linked_log_is_never_followed_to_change_what_it_points_to(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    open_store(str(state)).close()
    elsewhere = tmp_path / "somebody-elses"
    elsewhere.write_bytes(b"not the store's log")
    os.chmod(elsewhere, 0o644)
    os.symlink(elsewhere, state / (JobStore.FILE + "-wal"))
    store = open_store(str(state))  # the store and its linked log are moved aside, a new one made
    assert store.damaged_copy and "symbolic link" in store.damage
    store.close()
    assert _mode(elsewhere) == 0o644 and elsewhere.read_bytes() == b"not the store's log"
    assert _mode(state / JobStore.FILE) == 0o600


def test_a_schema_1_store_is_migrated_on_open_and_keeps_its_jobs(tmp_path):
    path = tmp_path / JobStore.FILE
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.close()
    assert "exit_code" not in _columns(path)
    store = open_store(str(tmp_path))
    (job,) = store.jobs()
    assert (job.key, job.native_id, job.state, job.ended, job.delivered_offsets) == (7, "4242", "FINISHED", 1010.0,
                                                                                     {"0.stdout": 12})
    assert job.exit_code == "" and job.job_spec.executable == "/bin/true"
    store.note_state(7, "FAILED", "FAILED", "boom", True, "3", "")
    store.flush()
    assert store.job(7).exit_code == "3"
    assert store.job(7).ended == 1010.0  # the first end seen is kept
    store.close()
    assert _version(path) == SCHEMA_VERSION
    assert not list(tmp_path.glob("*.damaged-*"))


def test_a_store_from_a_newer_agent_is_kept_aside_not_overwritten(tmp_path):
    path = tmp_path / JobStore.FILE
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1 + "PRAGMA user_version = 99;")
    db.close()
    with pytest.raises(StoreError, match="newer proxy-agent"):
        JobStore(str(path))
    store = open_store(str(tmp_path))
    assert store.jobs() == []
    aside = tmp_path / os.path.basename(store.damaged_copy)
    assert [p for p in tmp_path.glob("jobs.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))] == [aside]
    assert _version(aside) == 99
    store.close()


def test_a_damaged_store_is_moved_aside_with_its_log_never_deleted(tmp_path):
    path = tmp_path / JobStore.FILE
    garbage = b"this is not a database" * 100
    path.write_bytes(garbage)
    (tmp_path / "jobs.sqlite-wal").write_bytes(b"log")
    store = open_store(str(tmp_path))
    aside = store.damaged_copy
    assert _read(aside) == garbage and _read(aside + "-wal") == b"log"
    store.record_submission(1, "local", "local:default", JobSpec("/bin/true"))
    assert [j.key for j in store.jobs()] == [1]
    store.close()
    # damaged again within the same second: the first copy stays as it was
    path.write_bytes(b"damaged twice")
    second = open_store(str(tmp_path))
    assert second.damaged_copy != aside and _read(second.damaged_copy) == b"damaged twice"
    assert _read(aside) == garbage
    second.close()


def test_delivery_is_recorded_forward_only_and_can_be_taken_back(tmp_path):
    store = open_store(str(tmp_path))
    store.record_submission(1, "local", "local:default", JobSpec("/bin/true"))
    assert store.record_delivered({1: {"0.stdout": 10}}) == {1: {"0.stdout": 0}}
    previous = store.record_delivered({1: {"0.stdout": 25, "0.stderr": 4}})
    assert previous == {1: {"0.stdout": 10, "0.stderr": 0}}
    assert store.record_delivered({1: {"0.stdout": 20}}) == {1: {}}  # never backwards
    assert store.job(1).delivered_offsets == {"0.stdout": 25, "0.stderr": 4}
    store.restore_delivered(previous)  # the write failed
    assert store.job(1).delivered_offsets == {"0.stdout": 10, "0.stderr": 0}
    store.close()


def test_forget_removes_ended_jobs_only(tmp_path):
    store = open_store(str(tmp_path))
    for key in (1, 2, 3):
        store.record_submission(key, "local", "local:default", JobSpec("/bin/true"))
    store.note_state(1, "FINISHED", "EXITED", None, True, "0")
    store.note_state(2, "RUNNING", "RUNNING", None, False)
    store.flush()
    assert store.forget([1, 2, 9]) == ([1], [2])
    assert [j.key for j in store.jobs()] == [2, 3]
    store.close()


def test_one_agent_per_state_directory(tmp_path):
    first = StateLock(str(tmp_path))
    first.acquire({"pid": 1234, "unix": "/somewhere/agent.sock"})
    assert holder_of(str(tmp_path)) == {"pid": 1234, "unix": "/somewhere/agent.sock"}
    # another process tries (flock is per open file, so a second process is the honest test)
    code = ("import sys; from proxy_agent.service.store import StateLock, StateDirInUse\n"
            f"try:\n    StateLock({str(tmp_path)!r}).acquire({{'pid': 1}})\n"
            "except StateDirInUse as exc:\n    print(exc.message); sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                            timeout=scaled(30))
    assert result.returncode == 3
    assert "in use by proxy-agent process 1234" in result.stdout
    assert "proxy-console --unix /somewhere/agent.sock" in result.stdout
    first.release()
    assert holder_of(str(tmp_path)) == {}
    StateLock(str(tmp_path)).acquire({"pid": 5})


def test_a_state_directory_that_cannot_be_made_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="cannot create the state directory .*/file/state"):
        StateLock(str(tmp_path / "file" / "state")).acquire({"pid": 1})
    assert not isinstance(StoreError("x"), StateDirInUse)


async def test_jobs_a_backend_cannot_take_back_end_in_the_store(tmp_path):
    """The simulated cluster's jobs die with the agent: the next one marks them ended."""
    import trio

    from proxy_agent.schedulers.sim import SimBackend
    from proxy_agent.service.service import JobService

    store = open_store(str(tmp_path))
    store.record_submission(3, "sim", "sim:debug", JobSpec("/bin/true"))
    store.record_native_id(3, "")
    service = JobService(store=store)
    service.add_backend(SimBackend(service.model, None, service.context(state_dir=str(tmp_path))))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(scaled(30)):
            await service.ready.wait()
        nursery.cancel_scope.cancel()
    reopened = open_store(str(tmp_path))
    job = reopened.job(3)
    reopened.close()
    assert job.state == "DELETED" and job.ended is not None
    assert "sim scheduler could not take the job back" in job.message
