"""The job store: every job this agent submitted, kept on disk so that it outlives the agent.

One SQLite database per user in the state directory (``--state-dir``, default
``$XDG_STATE_HOME/proxy-agent``, that is ``~/.local/state/proxy-agent``), through the standard
library.  A submission is written before the scheduler is called and completed with the
scheduler's own job id after; state changes and how much of each output stream has been
delivered to a client are recorded as they happen.  A new agent on the same directory reads it
back and adopts the jobs (:class:`~proxy_agent.service.service.JobService`).

WAL mode; a schema version (``PRAGMA user_version``) with migration on open.  A database that
cannot be opened or read is moved aside, never deleted (:func:`open_store` says where), and
the agent goes on without a store.

Only one agent uses a state directory at a time: :class:`StateLock` holds an exclusive lock
on ``agent.lock`` (with the holder's pid and how to reach it written inside) for the agent's
life.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import sqlite3
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import attrs

from ..endpoints import default_state_dir, holder_of
from ..endpoints import read_lock_holder as _read_holder
from .jobs import JobSpec

log = logging.getLogger("proxy_agent.service.store")

__all__ = [
    "SCHEMA_VERSION",
    "StateLock",
    "StateDirInUse",
    "StoreError",
    "StoredJob",
    "JobStore",
    "default_state_dir",
    "open_store",
    "spec_from_json",
    "spec_to_json",
]

#: The schema this code writes; older ones are migrated on open.
SCHEMA_VERSION = 2

#: Schema 1: the statements that create it in an empty database.
_SCHEMA_1 = (
    """CREATE TABLE IF NOT EXISTS jobs (
        key INTEGER PRIMARY KEY,
        backend TEXT NOT NULL,
        queue TEXT NOT NULL DEFAULT '',
        native_id TEXT NOT NULL DEFAULT '',
        name TEXT NOT NULL DEFAULT '',
        client_ref TEXT NOT NULL DEFAULT '',
        spec TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL DEFAULT 'ACCEPTED',
        native_state TEXT NOT NULL DEFAULT '',
        message TEXT NOT NULL DEFAULT '',
        submitted REAL NOT NULL,
        ended REAL,
        delivered TEXT NOT NULL DEFAULT '{}',
        extra TEXT NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX IF NOT EXISTS jobs_ended ON jobs (ended)",
)

#: version -> the statements that take a database of the version before to it.  A new
#: database is made as schema 1 and migrated like any old one, so every step runs everywhere.
_MIGRATIONS = {
    # how a job ended, so that a job its scheduler has forgotten still shows its exit status
    # after a restart
    2: (
        "ALTER TABLE jobs ADD COLUMN exit_code TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN signal TEXT NOT NULL DEFAULT ''",
    ),
}


#: Every how many flushes the write-ahead log is checkpointed.
_CHECKPOINT_EVERY = 20


class StoreError(Exception):
    """The store cannot be used; ``message`` says why in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StateDirInUse(StoreError):
    """Another agent holds the state directory."""

    def __init__(self, message: str, holder: Dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


# --------------------------------------------------------------------------- the lock


class StateLock:
    """The one agent of a state directory: an exclusive ``flock`` on ``agent.lock``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "agent.lock")
        self._fd: Optional[int] = None

    def acquire(self, about: Dict[str, Any]) -> None:
        """Take the lock, writing ``about`` (pid, how to reach this agent) into the file;
        :class:`StateDirInUse` naming the holder when another agent has it."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the state directory {self.directory}: {exc.strerror or exc}") from None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                pid = holder.get("pid", "another process")
                where = holder.get("unix")
                hint = f"; connect to it: proxy-console --unix {where}" if where else ""
                raise StateDirInUse(
                    f"the state directory {self.directory} is in use by proxy-agent process {pid}{hint}", holder
                ) from None
            raise StoreError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(about).encode())
        self._fd = fd

    def update(self, about: Dict[str, Any]) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps(about).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --------------------------------------------------------------------------- specs as JSON


#: JobSpec's fields, in order.  Their values are strings, numbers, booleans, None and tuples
#: of those (or of pairs): JSON writes them as attrs.asdict would give them, without its
#: walk over every value (a submission is written for every job).
_SPEC_FIELDS = tuple(field.name for field in attrs.fields(JobSpec))


#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode


def spec_to_json(spec: JobSpec) -> str:
    return _compact({name: getattr(spec, name) for name in _SPEC_FIELDS})


def spec_from_json(text: str) -> Optional[JobSpec]:
    """The JobSpec stored as ``text`` (None if it cannot be read back)."""
    try:
        data = json.loads(text)
        fields = {f.name for f in attrs.fields(JobSpec)}
        return JobSpec(**{k: v for k, v in data.items() if k in fields})
    except (ValueError, TypeError, AttributeError):
        return None


# --------------------------------------------------------------------------- the store


def _offsets(text: str) -> Dict[str, int]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, int)}


@attrs.frozen
class StoredJob:
    key: int
    backend: str
    queue: str
    native_id: str
    name: str
    client_ref: str
    spec: str
    state: str
    native_state: str
    message: str
    submitted: float
    ended: Optional[float]
    delivered: str
    extra: str
    #: the exit status (decimal text) or the signal name of an ended job ('' if not known)
    exit_code: str = ""
    signal: str = ""

    @property
    def job_spec(self) -> Optional[JobSpec]:
        return spec_from_json(self.spec)

    @property
    def delivered_offsets(self) -> Dict[str, int]:
        """How much output reached a client: ``"RANK.STREAM"`` -> bytes of its file."""
        try:
            value = json.loads(self.delivered)
        except ValueError:
            return {}
        if not isinstance(value, dict):
            return {}
        return {k: int(v) for k, v in value.items() if isinstance(v, int)}

    @property
    def extras(self) -> Dict[str, Any]:
        try:
            value = json.loads(self.extra)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


_COLUMNS = [f.name for f in attrs.fields(StoredJob)]


class JobStore:
    """The database of one state directory (see the module documentation)."""

    FILE = "jobs.sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._check_version()  # before anything is changed in a newer agent's file
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=2000")
            # No checkpoint inside a commit: a delivery is committed just before its output is
            # written, and that time is all an agent killed in between could lose.  The
            # periodic flush checkpoints instead.
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate()
            self._db.execute("SELECT count(*) FROM jobs").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"the job store {path} cannot be used: {exc}") from None
        os.chmod(path, 0o600)
        self._pending: Dict[int, Dict[str, Any]] = {}
        #: submissions noted and not yet written: key -> the row's values
        self._submissions: Dict[int, tuple] = {}
        #: transactions that wrote submissions (see :meth:`write_submissions`)
        self.submission_commits = 0
        self._flushes = 0

    def _check_version(self) -> int:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            self._db.close()
            raise sqlite3.DatabaseError(
                f"it was written by a newer proxy-agent (schema {version}; this one knows {SCHEMA_VERSION})"
            )
        return version

    def _migrate(self) -> None:
        version = self._check_version()
        if version == SCHEMA_VERSION:
            return
        # One transaction: a migration that fails half-way leaves the old schema as it was.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if version < 1:
                for statement in _SCHEMA_1:
                    self._db.execute(statement)
                version = 1
            while version < SCHEMA_VERSION:
                version += 1
                for statement in _MIGRATIONS[version]:
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """What the block writes, committed as one transaction; rolled back if SQLite fails."""
        self._db.execute("BEGIN")
        try:
            yield
            self._db.execute("COMMIT")
        except sqlite3.Error:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the transaction is gone already: the first error is the one to tell
            raise

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()

    # ------------------------------------------------------------------ writes

    def record_submission(self, key: int, backend: str, queue: str, spec: JobSpec, extra: Optional[dict] = None) -> None:
        """Written (committed) before the scheduler is called."""
        self.note_submission(key, backend, queue, spec, extra)
        self.write_submissions()

    def note_submission(self, key: int, backend: str, queue: str, spec: JobSpec, extra: Optional[dict] = None) -> None:
        """A submission to be written by the next :meth:`write_submissions` (which must have
        returned before the scheduler is called): submissions that arrive together are
        committed in one transaction."""
        self._submissions[key] = (key, backend, queue, spec.display_name, spec.client_ref or "", spec_to_json(spec),
                                  time.time(), json.dumps(extra) if extra else "{}")

    def submission_noted(self, key: int) -> bool:
        """Is this submission noted and not yet written?"""
        return key in self._submissions

    def write_submissions(self) -> None:
        """Commit the submissions noted so far, in one transaction (nothing if there are none)."""
        if not self._submissions:
            return
        rows, self._submissions = list(self._submissions.values()), {}
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO jobs (key, backend, queue, name, client_ref, spec, state, submitted, extra)"
                " VALUES (?, ?, ?, ?, ?, ?, 'SUBMITTING', ?, ?)", rows)
        self.submission_commits += 1

    def record_native_id(self, key: int, native_id: str, extra: Optional[dict] = None) -> None:
        """The scheduler took the job: its own id (committed at once)."""
        self.write_submissions()
        if extra:
            self._db.execute("UPDATE jobs SET native_id=?, extra=? WHERE key=?", (native_id, json.dumps(extra), key))
        else:
            self._db.execute("UPDATE jobs SET native_id=? WHERE key=?", (native_id, key))

    def rekey(self, old: int, new: int) -> None:
        """The scheduler's job turned out to be in the model under another key already."""
        self.write_submissions()
        self._db.execute("UPDATE jobs SET key=? WHERE key=?", (new, old))

    def record_refused(self, key: int, why: str) -> None:
        """The scheduler refused the submission: nothing of it exists anywhere."""
        if self._submissions.pop(key, None) is not None:
            return  # never written
        self._db.execute("DELETE FROM jobs WHERE key=?", (key,))

    def note_state(self, key: int, state: str, native_state: str, message: Optional[str], final: bool,
                   exit_code: str = "", signal: str = "") -> None:
        """A state change; written with the next :meth:`flush` (the scheduler knows it too).
        ``exit_code`` and ``signal`` say how an ended job ended."""
        change = self._pending.setdefault(key, {})
        change["state"] = state
        change["native_state"] = native_state
        if message is not None:
            change["message"] = message
        if final:
            change.setdefault("ended", time.time())
            change["exit_code"] = exit_code
            change["signal"] = signal

    def mark_lost(self, key: int, message: str) -> None:
        """A job no agent will follow again: ended, its outcome not known (committed at once)."""
        self.write_submissions()
        self._db.execute("UPDATE jobs SET state='DELETED', native_state='UNKNOWN', message=?,"
                         " ended=coalesce(ended, ?) WHERE key=?", (message, time.time(), key))

    def record_delivered(self, offsets: Dict[int, Dict[str, int]]) -> Dict[int, Dict[str, int]]:
        """Output is handed to a client: job key -> {``"RANK.STREAM"``: bytes of its file}.
        Committed at once, just before the bytes are written: a restarted agent delivers from
        there.  Returns the offsets it replaced, for :meth:`restore_delivered` should the
        write fail."""
        previous: Dict[int, Dict[str, int]] = {}
        if not offsets:
            return previous
        self.write_submissions()
        with self._transaction():
            for key, where in offsets.items():
                row = self._db.execute("SELECT delivered FROM jobs WHERE key=?", (key,)).fetchone()
                if row is None:
                    continue
                current = _offsets(row[0])
                before = previous.setdefault(key, {})
                for name, offset in where.items():
                    if offset > current.get(name, -1):
                        before[name] = current.get(name, 0)
                        current[name] = offset
                self._db.execute("UPDATE jobs SET delivered=? WHERE key=?", (json.dumps(current), key))
        return previous

    def restore_delivered(self, previous: Dict[int, Dict[str, int]]) -> None:
        """Put back offsets :meth:`record_delivered` replaced (the output never got there)."""
        with self._transaction():
            for key, where in previous.items():
                row = self._db.execute("SELECT delivered FROM jobs WHERE key=?", (key,)).fetchone()
                if row is None or not where:
                    continue
                current = _offsets(row[0])
                current.update(where)
                self._db.execute("UPDATE jobs SET delivered=? WHERE key=?", (json.dumps(current), key))

    def flush(self) -> None:
        """Write what was noted, in one transaction; move the log into the database now and
        then."""
        self.write_submissions()
        self._flushes += 1
        if self._flushes % _CHECKPOINT_EVERY == 0:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        # changes of the same columns go in one statement (a busy round ends many jobs alike)
        alike: Dict[Tuple[str, ...], List[tuple]] = {}
        for key, change in pending.items():
            alike.setdefault(tuple(change), []).append((*change.values(), key))
        with self._transaction():
            for names, rows in alike.items():
                # a job keeps the time it was first seen ended (a new agent reports it again)
                columns = ", ".join("ended=coalesce(ended, ?)" if name == "ended" else f"{name}=?" for name in names)
                self._db.executemany(f"UPDATE jobs SET {columns} WHERE key=?", rows)

    # ------------------------------------------------------------------ reads

    def jobs(self, *, ended: Optional[bool] = None) -> List[StoredJob]:
        self.write_submissions()
        query = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
        if ended is True:
            query += " WHERE ended IS NOT NULL"
        elif ended is False:
            query += " WHERE ended IS NULL"
        query += " ORDER BY key"
        return [StoredJob(*row) for row in self._db.execute(query)]

    def job(self, key: int) -> Optional[StoredJob]:
        self.write_submissions()
        row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE key=?", (key,)).fetchone()
        return StoredJob(*row) if row else None

    def max_key(self) -> int:
        self.write_submissions()
        (value,) = self._db.execute("SELECT coalesce(max(key), 0) FROM jobs").fetchone()
        return int(value)

    # ------------------------------------------------------------------ forgetting

    def forget(self, keys: Iterable[int]) -> Tuple[List[int], List[int]]:
        """Remove entries of ended jobs; returns (forgotten, refused because still active)."""
        self.write_submissions()
        forgotten, refused = [], []
        for key in keys:
            row = self._db.execute("SELECT ended FROM jobs WHERE key=?", (key,)).fetchone()
            if row is None:
                continue
            if row[0] is None:
                refused.append(key)
                continue
            self._db.execute("DELETE FROM jobs WHERE key=?", (key,))
            forgotten.append(key)
        return forgotten, refused

    def forget_ended_before(self, when: float) -> List[int]:
        self.write_submissions()
        keys = [k for (k,) in self._db.execute("SELECT key FROM jobs WHERE ended IS NOT NULL AND ended < ?", (when,))]
        self._db.execute("DELETE FROM jobs WHERE ended IS NOT NULL AND ended < ?", (when,))
        return keys


def open_store(directory: str) -> JobStore:
    """The store of ``directory``.  A file that cannot be used is moved aside (never deleted)
    and a fresh one made; :class:`StoreError` if even that fails (the message says where the
    old file went)."""
    path = os.path.join(directory, JobStore.FILE)
    try:
        return JobStore(path)
    except StoreError as first:
        if not os.path.exists(path):
            raise
        aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        number = 1
        while os.path.lexists(aside):  # an earlier copy is never replaced
            number += 1
            aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{number}"
        try:
            os.replace(path, aside)
            for suffix in ("-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.replace(path + suffix, aside + suffix)
        except OSError as exc:
            raise StoreError(f"{first.message}; it could not be moved aside: {exc.strerror or exc}") from None
        log.warning("%s; kept as %s, starting a new store", first.message, aside)
        try:
            store = JobStore(path)
        except StoreError as second:
            raise StoreError(f"{second.message} (the damaged store was kept as {aside})") from None
        store.damaged_copy = aside  # type: ignore[attr-defined]
        return store
