"""The job store: every job this agent submitted, kept on disk so that it outlives the agent.

One SQLite database per user in the state directory (``--state-dir``, default
``$XDG_STATE_HOME/proxy-agent``, that is ``~/.local/state/proxy-agent``), through the standard
library.  A submission is written before the scheduler is called and completed with the
scheduler's own job id after; state changes and how much of each output stream has been
delivered to a client are recorded as they happen.  A new agent on the same directory reads it
back and adopts the jobs (:class:`~proxy_agent.service.service.JobService`).

WAL mode; a schema version (``PRAGMA user_version``) with migration on open.  What is found
at the store's path is checked before it is used: a file that cannot be read as a store of a
known schema (damaged, truncated, written by a newer agent, a symbolic link, a directory) is
moved aside, never deleted and never followed (:func:`open_store` says where), and a new
store is started.  A store that is sound but cannot be written *now* (a full disk, a
read-only file, an I/O error) is kept as it is: it is read as far as it can be, what the agent
would have written is owed and written once it can be (:attr:`JobStore.unwritable` says why it
cannot), and new submissions are refused meanwhile (:class:`StoreUnwritable`), since a job is
only accepted once it is recorded.

A new submission is committed with a full sync (``PRAGMA synchronous=FULL``): it survives the
machine losing power.  Everything else is committed with the cheaper ``NORMAL``, which a
killed agent never loses either.

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
import stat
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import attrs

from ..endpoints import default_state_dir, holder_of
from ..endpoints import read_lock_holder as _read_holder
from .jobs import JobSpec

log = logging.getLogger("proxy_agent.service.store")

__all__ = [
    "SCHEMA_VERSION",
    "StateLock",
    "StateDirInUse",
    "StoreDamaged",
    "StoreError",
    "StoreUnwritable",
    "StoredJob",
    "JobStore",
    "default_state_dir",
    "holder_of",
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


class StoreUnwritable(StoreError):
    """The store is sound but cannot be written now (a full disk, a read-only file, an I/O
    error): kept as it is, and written once it can be."""


class StoreDamaged(StoreError):
    """What is at the store's path cannot be read as a store of a schema this agent knows
    (damaged, truncated, a newer agent's, not a plain file): :func:`open_store` moves it aside."""


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
        self._fd = fd
        self.update(about)

    def update(self, about: Dict[str, Any]) -> None:
        """Say who holds the lock; the lock holds without it (a full disk may refuse the
        bytes: then a second agent is told the directory is in use, without the pid)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, json.dumps(about).encode(), 0)
            except OSError as exc:
                log.warning("cannot write who holds %s: %s", self.path, exc.strerror or exc)

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


#: The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"

#: SQLite's primary result codes that say the store cannot be used *now*, not that it is
#: damaged: full, I/O error (extended codes too), read-only, cannot open, busy, locked, no
#: permission, out of memory, a locking protocol error.
_TRANSIENT_CODES = frozenset({13, 10, 8, 14, 5, 6, 3, 7, 15})
#: The same as SQLite's message texts (for Pythons without ``sqlite_errorcode``).
_TRANSIENT_TEXTS = ("disk is full", "disk i/o error", "readonly database", "unable to open", "is locked",
                    "not authorized", "out of memory", "locking protocol", "access permission denied")


def transient(exc: BaseException) -> bool:
    """Does this SQLite error say the store cannot be used now (rather than that it is
    damaged)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _TRANSIENT_CODES
    text = str(exc).lower()
    return any(part in text for part in _TRANSIENT_TEXTS)


def _read_only(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 8  # SQLITE_READONLY and its extended codes
    return "readonly" in str(exc).lower()


def _explained(exc: BaseException, path: str) -> str:
    """SQLite's words for an error, and what lies behind a vague one: SQLite calls a full
    disk an I/O error when the file it cannot grow is its shared-memory file."""
    text = str(exc)
    if "full" in text:
        return text
    try:
        info = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        return text
    if info.f_bavail * info.f_frsize < 64 * 1024:
        return f"{text}: no space left on the disk of {os.path.dirname(path)}"
    return text


class _OwedBefore(dict):
    """What :meth:`JobStore.record_delivered` replaced among offsets still owed (None: none
    was owed), for :meth:`JobStore.restore_delivered`."""


class JobStore:
    """The database of one state directory (see the module documentation).

    Writes the store cannot take now are owed: :meth:`flush` writes them once it can, and
    :attr:`unwritable` says why it cannot meanwhile (None when it can).  ``on_change`` is
    called with the new value whenever that changes."""

    FILE = "jobs.sqlite"

    def __init__(self, path: str) -> None:
        self._init_state(path)
        self._db = self._connect()

    def _init_state(self, path: str) -> None:
        self.path = path
        #: why the store cannot be written now (None: it can)
        self.unwritable: Optional[str] = None
        #: told when :attr:`unwritable` changes
        self.on_change: Optional[Callable[[Optional[str]], None]] = None
        #: where a damaged store this one replaced was moved, and what was wrong with it
        #: (:func:`open_store`; None: it replaced none)
        self.damaged_copy: Optional[str] = None
        self.damage: Optional[str] = None
        #: the store's jobs were read with a connection that cannot write: reopened to write
        self._reading_only = False
        self._pending: Dict[int, Dict[str, Any]] = {}
        #: submissions noted and not yet written: key -> the row's values
        self._submissions: Dict[int, tuple] = {}
        #: submissions a failed transaction did not write: key -> why
        self._unwritten: Dict[int, StoreError] = {}
        #: writes owed while the store could not take them, in the order they are written
        self._owed_rekeys: List[Tuple[int, int]] = []
        self._owed_native: Dict[int, Tuple[str, Optional[str]]] = {}
        self._owed_lost: Dict[int, Tuple[str, float]] = {}
        self._owed_delivered: Dict[int, Dict[str, int]] = {}
        self._owed_deleted: Set[int] = set()
        #: transactions that wrote submissions (see :meth:`write_submissions`)
        self.submission_commits = 0
        self._flushes = 0

    # ------------------------------------------------------------------ opening

    def _connect(self) -> sqlite3.Connection:
        """Open the database as a store, creating it if there is none; :class:`StoreDamaged` if
        what is there is not a store this agent can read, :class:`StoreUnwritable` if it
        cannot be opened for writing now (see :meth:`reading_only`)."""
        path = self.path
        if not os.path.lexists(path):
            _create(path)
        _check_file(path)
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._failure(exc, "written") from None
        try:
            self._check_version(db, path)  # before anything is changed in a newer agent's file
            _check_pages(db)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=2000")
            # No checkpoint inside a commit: a delivery is committed just before its output is
            # written, and that time is all an agent killed in between could lose.  The
            # periodic flush checkpoints instead.
            db.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate(db)
            _check_content(db)
            # SQLite opens a file it may not write read-only, without a word: a change that is
            # taken back says so now
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            finally:
                db.execute("ROLLBACK")
        except BaseException as exc:
            db.close()
            if isinstance(exc, sqlite3.Error):
                raise self._failure(exc, "written") from None
            raise
        for name in (path, path + "-wal", path + "-shm"):
            _make_private(name)  # what an older agent made with the umask's mode
        return db

    def _failure(self, exc: sqlite3.Error, doing: str) -> Exception:
        if transient(exc):
            return StoreUnwritable(f"the job store {self.path} cannot be {doing} now: {_explained(exc, self.path)}")
        return StoreDamaged(f"the job store {self.path} cannot be used: {exc}")

    @classmethod
    def reading_only(cls, path: str, why: str) -> "JobStore":
        """A sound store that cannot be written now, read without writing anything: its
        jobs can be adopted; every write is owed until :meth:`flush` can reopen it.
        :class:`StoreUnwritable` if it cannot even be read now."""
        store = cls.__new__(cls)
        store._init_state(path)
        store._db = store._connect_reading()
        store._reading_only = True
        store.unwritable = why
        return store

    @classmethod
    def reader(cls, path: str) -> Optional["JobStore"]:
        """The store at ``path`` opened to be read only, by a tool beside a running agent
        (``proxy-agent jobs``): it takes no write lock, and writes nothing, even when closed.
        None when the store has an older schema (it must be opened to be brought up to date);
        :class:`StoreDamaged` or :class:`StoreUnwritable` as :meth:`reading_only`."""
        store = cls.__new__(cls)
        store._init_state(path)
        store._db = store._connect_reading()
        if store._check_version(store._db, path) < SCHEMA_VERSION:
            store._db.close()
            return None
        store._reading_only = True
        return store

    def _connect_reading(self) -> sqlite3.Connection:
        path = self.path
        _check_file(path)
        from urllib.parse import quote

        uri = "file:" + quote(os.path.abspath(path))
        attempts = [uri + "?mode=ro"]
        try:
            wal = os.lstat(path + "-wal").st_size
        except FileNotFoundError:
            wal = 0
        except OSError:
            wal = 1
        if wal == 0:
            # Without a log the file is the whole store: it can be read without the shared
            # memory file SQLite would otherwise make (which a full disk refuses).
            attempts.append(uri + "?immutable=1")
        last: Optional[sqlite3.Error] = None
        for attempt in attempts:
            try:
                db = sqlite3.connect(attempt, uri=True, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                last = exc
                continue
            try:
                version = self._check_version(db, path)
                _check_pages(db)
                if version == SCHEMA_VERSION:
                    _check_content(db)
                return db
            except sqlite3.Error as exc:
                db.close()
                if not transient(exc):
                    raise StoreDamaged(f"the job store {path} cannot be used: {exc}") from None
                last = exc
        raise StoreUnwritable(f"the job store {path} cannot be read now: {last}")

    @staticmethod
    def _check_version(db: sqlite3.Connection, path: str = "") -> int:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreDamaged(f"the job store {path} cannot be used: it was written by a newer proxy-agent "
                               f"(schema {version}; this one knows {SCHEMA_VERSION})")
        return version

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        version = JobStore._check_version(db)
        if version == SCHEMA_VERSION:
            return
        # One transaction: a migration that fails half-way leaves the old schema as it was.
        db.execute("BEGIN IMMEDIATE")
        try:
            if version < 1:
                for statement in _SCHEMA_1:
                    db.execute(statement)
                version = 1
            while version < SCHEMA_VERSION:
                version += 1
                for statement in _MIGRATIONS[version]:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False) -> Iterator[None]:
        """What the block writes, committed as one transaction (synced to the disk itself
        when ``durable``); rolled back if SQLite fails."""
        if durable:
            self._db.execute("PRAGMA synchronous=FULL")
        try:
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
        finally:
            if durable:
                try:
                    self._db.execute("PRAGMA synchronous=NORMAL")
                except sqlite3.Error:
                    pass

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()

    # ------------------------------------------------------------------ what is owed

    def _set_unwritable(self, why: Optional[str]) -> None:
        if why == self.unwritable:
            return
        was = self.unwritable
        self.unwritable = why
        if why is not None and was is None:
            log.warning("%s; what the agent writes there is kept until it can be written", why)
        elif why is None:
            log.warning("the job store %s can be written again; what was owed is written", self.path)
        if self.on_change is not None and (was is None) != (why is None):
            self.on_change(why)

    def _write_failed(self, exc: sqlite3.Error) -> None:
        """A write failed: owed if the store cannot be written now, raised if it is damaged."""
        if not transient(exc):
            raise exc
        if _read_only(exc):
            self._reading_only = True  # the connection stays read-only: a new one is needed
        self._set_unwritable(f"the job store {self.path} cannot be written now: {_explained(exc, self.path)}")

    @property
    def owes(self) -> bool:
        """Are there writes the store has not taken yet?"""
        return bool(self._pending or self._owed_rekeys or self._owed_native or self._owed_lost
                    or self._owed_delivered or self._owed_deleted)

    def _reopen_for_writing(self) -> bool:
        """A store read without writing: open it for writing now if that works."""
        try:
            db = self._connect()
        except StoreUnwritable:
            return False
        except StoreDamaged as exc:
            raise sqlite3.DatabaseError(exc.message) from None
        self._db.close()
        self._db = db
        self._reading_only = False
        return True

    # ------------------------------------------------------------------ writes

    def record_submission(self, key: int, backend: str, queue: str, spec: JobSpec, extra: Optional[dict] = None) -> None:
        """Written (committed) before the scheduler is called."""
        self.note_submission(key, backend, queue, spec, extra)
        self.commit_submission(key)

    def note_submission(self, key: int, backend: str, queue: str, spec: JobSpec, extra: Optional[dict] = None) -> None:
        """A submission to be written by the next :meth:`write_submissions` (which must have
        returned before the scheduler is called): submissions that arrive together are
        committed in one transaction."""
        self._unwritten.pop(key, None)
        self._submissions[key] = (key, backend, queue, spec.display_name, spec.client_ref or "", spec_to_json(spec),
                                  time.time(), json.dumps(extra) if extra else "{}")

    def commit_submission(self, key: int) -> None:
        """Make sure this submission is committed (with those noted with it): returns once it
        is; :class:`StoreUnwritable` if the store cannot take it now (it is then not
        recorded at all), sqlite3.Error if the store is damaged."""
        if key in self._submissions:
            self.write_submissions()
        failed = self._unwritten.pop(key, None)
        if failed is not None:
            raise failed

    def write_submissions(self) -> None:
        """Commit the submissions noted so far, in one transaction, synced to the disk
        (nothing if there are none).  If the store cannot take them now, none of them is
        recorded: :class:`StoreUnwritable` (each one's :meth:`commit_submission` says so too)."""
        if not self._submissions:
            return
        rows, self._submissions = list(self._submissions.values()), {}
        if self.unwritable is not None and not self._retry_owed():
            failure = StoreUnwritable(self.unwritable)
            self._unwritten.update((row[0], failure) for row in rows)
            raise failure
        try:
            with self._transaction(durable=True):
                self._db.executemany(
                    "INSERT OR REPLACE INTO jobs (key, backend, queue, name, client_ref, spec, state, submitted, extra)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'SUBMITTING', ?, ?)", rows)
        except sqlite3.Error as exc:
            if not transient(exc):
                raise
            self._write_failed(exc)
            failure = StoreUnwritable(self.unwritable or str(exc))
            self._unwritten.update((row[0], failure) for row in rows)
            raise failure from None
        self.submission_commits += 1

    def _write_now(self, statement: str, values: tuple) -> bool:
        """One statement committed at once; False (owed by the caller) if the store cannot
        take it now."""
        if self.unwritable is not None:
            return False
        try:
            self._db.execute(statement, values)
        except sqlite3.Error as exc:
            self._write_failed(exc)
            return False
        return True

    def record_native_id(self, key: int, native_id: str, extra: Optional[dict] = None) -> None:
        """The scheduler took the job: its own id (committed at once, or owed)."""
        self._write_noted()
        extra_json = json.dumps(extra) if extra else None
        if extra_json is not None:
            done = self._write_now("UPDATE jobs SET native_id=?, extra=? WHERE key=?", (native_id, extra_json, key))
        else:
            done = self._write_now("UPDATE jobs SET native_id=? WHERE key=?", (native_id, key))
        if not done:
            self._owed_native[key] = (native_id, extra_json)

    def rekey(self, old: int, new: int) -> None:
        """The scheduler's job turned out to be in the model under another key already."""
        self._write_noted()
        if not self._write_now("UPDATE jobs SET key=? WHERE key=?", (new, old)):
            self._owed_rekeys.append((old, new))

    def record_refused(self, key: int, why: str) -> None:
        """The scheduler refused the submission: nothing of it exists anywhere."""
        if self._submissions.pop(key, None) is not None or self._unwritten.pop(key, None) is not None:
            return  # never written
        if not self._write_now("DELETE FROM jobs WHERE key=?", (key,)):
            self._owed_deleted.add(key)

    def note_state(self, key: int, state: str, native_state: str, message: Optional[str], final: bool,
                   exit_code: str = "", signal: str = "", native_id: str = "") -> None:
        """A state change; written with the next :meth:`flush` (the scheduler knows it too).
        ``exit_code`` and ``signal`` say how an ended job ended; ``native_id``, when given, is
        the scheduler's id of the job (one that has it only once it runs)."""
        change = self._pending.setdefault(key, {})
        change["state"] = state
        change["native_state"] = native_state
        if native_id:
            change["native_id"] = native_id
        if message is not None:
            change["message"] = message
        if final:
            change.setdefault("ended", time.time())
            change["exit_code"] = exit_code
            change["signal"] = signal

    def mark_lost(self, key: int, message: str) -> None:
        """A job no agent will follow again: ended, its outcome not known (committed at once,
        or owed)."""
        self._write_noted()
        now = time.time()
        if not self._write_now("UPDATE jobs SET state='DELETED', native_state='UNKNOWN', message=?,"
                               " ended=coalesce(ended, ?) WHERE key=?", (message, now, key)):
            self._owed_lost[key] = (message, now)

    def record_delivered(self, offsets: Dict[int, Dict[str, int]]) -> Dict[int, Dict[str, int]]:
        """Output is handed to a client: job key -> {``"RANK.STREAM"``: bytes of its file}.
        Committed at once, just before the bytes are written: a restarted agent delivers from
        there.  Returns the offsets it replaced, for :meth:`restore_delivered` should the
        write fail.  While the store cannot be written the offsets are owed (written later);
        an agent killed before then delivers those lines again."""
        previous: Dict[int, Dict[str, int]] = {}
        if not offsets:
            return previous
        self._write_noted()
        if self.unwritable is None:
            try:
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
            except sqlite3.Error as exc:
                self._write_failed(exc)
        owed_before = _OwedBefore()
        for key, where in offsets.items():
            owed = self._owed_delivered.setdefault(key, {})
            before = owed_before.setdefault(key, {})
            for name, offset in where.items():
                if offset > owed.get(name, -1):
                    before[name] = owed.get(name)
                    owed[name] = offset
        return owed_before

    def restore_delivered(self, previous: Dict[int, Dict[str, int]]) -> None:
        """Put back offsets :meth:`record_delivered` replaced (the output never got there)."""
        if isinstance(previous, _OwedBefore):
            for key, where in previous.items():
                owed = self._owed_delivered.get(key)
                for name, value in where.items():
                    if owed is None:
                        break
                    if value is None:
                        owed.pop(name, None)
                    else:
                        owed[name] = value
            return
        if self.unwritable is not None:
            return  # what was recorded stays: the lines are not sent again (as after a kill)
        try:
            with self._transaction():
                for key, where in previous.items():
                    row = self._db.execute("SELECT delivered FROM jobs WHERE key=?", (key,)).fetchone()
                    if row is None or not where:
                        continue
                    current = _offsets(row[0])
                    current.update(where)
                    self._db.execute("UPDATE jobs SET delivered=? WHERE key=?", (json.dumps(current), key))
        except sqlite3.Error as exc:
            self._write_failed(exc)

    def _write_noted(self) -> None:
        """Submissions noted and not yet written go first (a write that names them must
        find them); if the store cannot take them they are refused (see
        :meth:`commit_submission`)."""
        if self._submissions:
            try:
                self.write_submissions()
            except StoreUnwritable:
                pass

    def flush(self) -> None:
        """Write what was noted or owed, in one transaction; move the log into the database
        now and then.  While the store cannot be written, each flush tries again."""
        self._write_noted()
        self._flushes += 1
        if self.unwritable is not None:
            self._retry_owed()
            return
        if self._flushes % _CHECKPOINT_EVERY == 0:
            try:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                self._write_failed(exc)
                return
        if self.owes:
            self._write_owed()

    def _retry_owed(self) -> bool:
        """Try to write what is owed; True if the store can be written again."""
        if self._reading_only and not self._reopen_for_writing():
            return False
        if self._write_owed():
            self._set_unwritable(None)
            return True
        return False

    def _write_owed(self) -> bool:
        """Everything owed in one transaction; True if it was written (else it stays owed)."""
        pending, self._pending = self._pending, {}
        rekeys, native, lost = list(self._owed_rekeys), dict(self._owed_native), dict(self._owed_lost)
        delivered, deleted = {k: dict(v) for k, v in self._owed_delivered.items()}, set(self._owed_deleted)
        # changes of the same columns go in one statement (a busy round ends many jobs alike)
        alike: Dict[Tuple[str, ...], List[tuple]] = {}
        for key, change in pending.items():
            alike.setdefault(tuple(change), []).append((*change.values(), key))
        try:
            with self._transaction():
                for old, new in rekeys:
                    self._db.execute("UPDATE jobs SET key=? WHERE key=?", (new, old))
                for key, (native_id, extra_json) in native.items():
                    if extra_json is not None:
                        self._db.execute("UPDATE jobs SET native_id=?, extra=? WHERE key=?", (native_id, extra_json, key))
                    else:
                        self._db.execute("UPDATE jobs SET native_id=? WHERE key=?", (native_id, key))
                for key, (message, when) in lost.items():
                    self._db.execute("UPDATE jobs SET state='DELETED', native_state='UNKNOWN', message=?,"
                                     " ended=coalesce(ended, ?) WHERE key=?", (message, when, key))
                for names, rows in alike.items():
                    # a job keeps the time it was first seen ended (a new agent reports it again)
                    columns = ", ".join("ended=coalesce(ended, ?)" if name == "ended" else f"{name}=?"
                                        for name in names)
                    self._db.executemany(f"UPDATE jobs SET {columns} WHERE key=?", rows)
                for key, where in delivered.items():
                    row = self._db.execute("SELECT delivered FROM jobs WHERE key=?", (key,)).fetchone()
                    if row is None:
                        continue
                    current = _offsets(row[0])
                    for name, offset in where.items():
                        current[name] = max(offset, current.get(name, 0))
                    self._db.execute("UPDATE jobs SET delivered=? WHERE key=?", (json.dumps(current), key))
                for key in deleted:
                    self._db.execute("DELETE FROM jobs WHERE key=?", (key,))
        except sqlite3.Error as exc:
            for key, change in pending.items():  # what was noted meanwhile is newer
                change.update(self._pending.get(key, {}))
                self._pending[key] = change
            self._write_failed(exc)
            return False
        del self._owed_rekeys[:len(rekeys)]
        for key, value in native.items():
            if self._owed_native.get(key) == value:
                del self._owed_native[key]
        for key in lost:
            self._owed_lost.pop(key, None)
        for key, where in delivered.items():
            owed = self._owed_delivered.get(key, {})
            for name, offset in where.items():
                if owed.get(name) == offset:
                    del owed[name]
            if not owed:
                self._owed_delivered.pop(key, None)
        self._owed_deleted -= deleted
        return True

    # ------------------------------------------------------------------ reads

    def jobs(self, *, ended: Optional[bool] = None) -> List[StoredJob]:
        self._write_noted()
        query = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
        if ended is True:
            query += " WHERE ended IS NOT NULL"
        elif ended is False:
            query += " WHERE ended IS NULL"
        query += " ORDER BY key"
        return [StoredJob(*row) for row in self._db.execute(query)]

    def job(self, key: int) -> Optional[StoredJob]:
        self._write_noted()
        row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE key=?", (key,)).fetchone()
        return StoredJob(*row) if row else None

    def max_key(self) -> int:
        self._write_noted()
        (value,) = self._db.execute("SELECT coalesce(max(key), 0) FROM jobs").fetchone()
        return int(value)

    # ------------------------------------------------------------------ forgetting

    def forget(self, keys: Iterable[int]) -> Tuple[List[int], List[int]]:
        """Remove entries of ended jobs; returns (forgotten, refused because still active).
        All or none, in one transaction: :class:`StoreUnwritable` (and nothing forgotten) if
        the store cannot be written now."""
        keys = list(keys)
        if not keys:
            return [], []
        with self._forgetting():
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
        """Remove the entries of jobs that ended before ``when``; their keys.
        :class:`StoreUnwritable` (and nothing forgotten) if the store cannot be written now."""
        keys = [k for (k,) in self._db.execute("SELECT key FROM jobs WHERE ended IS NOT NULL AND ended < ?", (when,))]
        if keys:  # (an agent looks every hour: most looks write nothing)
            with self._forgetting():
                self._db.execute("DELETE FROM jobs WHERE ended IS NOT NULL AND ended < ?", (when,))
        return keys

    @contextlib.contextmanager
    def _forgetting(self) -> Iterator[None]:
        """The block's deletions in one transaction, after what is noted or owed (an entry
        owed its end must have it first); a store that cannot be written now raises
        :class:`StoreUnwritable` saying why, and is marked so (its writes are owed)."""
        self.flush()
        if self.unwritable is not None:
            raise StoreUnwritable(f"{self.unwritable}; no job is forgotten until it can be")
        try:
            with self._transaction():
                yield
        except sqlite3.Error as exc:
            self._write_failed(exc)  # raised again if the store is damaged
            raise StoreUnwritable(f"{self.unwritable}; no job is forgotten until it can be") from None


def _create(path: str) -> None:
    """A new, empty store at ``path``: made under another name and renamed into place, so
    that the path never holds a half-made (or empty) database; :class:`StoreUnwritable` if
    the disk refuses it."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.new-{os.getpid()}")
    for leftover in (temporary, temporary + "-wal", temporary + "-shm", temporary + "-journal"):
        try:
            os.unlink(leftover)
        except OSError:
            pass
    try:
        # made 0600 before SQLite writes a byte into it: SQLite gives the log and the
        # shared-memory file the database's mode, and the umask's would let others read the
        # user's jobs (an empty file is an empty database to SQLite)
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        db = sqlite3.connect(temporary, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            JobStore._migrate(db)
        finally:
            db.close()  # the last connection: its log goes into the file
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException as exc:
        for leftover in (temporary, temporary + "-wal", temporary + "-shm", temporary + "-journal"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        if not isinstance(exc, (sqlite3.Error, OSError)):
            raise  # (a signal stopping the agent, say: nothing is left behind)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise StoreUnwritable(f"the job store {path} cannot be made now: {why}") from None


def _make_private(path: str) -> None:
    """Mode 0600 for the file at ``path`` if there is one, never following a symbolic link
    (:func:`_check_file` refused one; this holds even if one is put there since)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # none there (or not ours to open): nothing to change
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
    except OSError:
        pass  # a read-only file system, say: the mode stays as it is
    finally:
        os.close(fd)


def _check_file(path: str) -> None:
    """What is at the store's path is a plain file that begins like a database (with a
    plain log and shared-memory file if any); :class:`StoreDamaged` saying what it is otherwise.
    Nothing is followed through a symbolic link."""
    for name in (path, path + "-wal", path + "-shm"):
        try:
            info = os.lstat(name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreUnwritable(f"the job store {path} cannot be looked at now: {exc.strerror or exc}") from None
        what = os.path.basename(name)
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.readlink(name)
            except OSError:
                target = "?"
            raise StoreDamaged(f"{what} in {os.path.dirname(path)} is a symbolic link (to {target}), not the job store; "
                           "it is not followed")
        if stat.S_ISDIR(info.st_mode):
            raise StoreDamaged(f"{what} in {os.path.dirname(path)} is a directory, not the job store")
        if not stat.S_ISREG(info.st_mode):
            raise StoreDamaged(f"{what} in {os.path.dirname(path)} is not a plain file, not the job store")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreUnwritable(f"the job store {path} cannot be opened now: {exc.strerror or exc}") from None
    try:
        head = os.read(fd, len(_SQLITE_HEADER))
    except OSError as exc:
        raise StoreUnwritable(f"the job store {path} cannot be read now: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if not head:
        raise StoreDamaged(f"the job store {path} is empty (it was truncated): the jobs it held are gone")
    if head != _SQLITE_HEADER:
        raise StoreDamaged(f"the job store {path} cannot be used: file is not a database")


def _check_pages(db: sqlite3.Connection) -> None:
    """Every page of the database is sound (sqlite3.Error if not)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise sqlite3.DatabaseError(f"database disk image is malformed ({'; '.join(map(str, problems[:3]))})")


def _check_content(db: sqlite3.Connection) -> None:
    """The jobs read back (sqlite3.Error if not)."""
    db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs").fetchall()


def open_store(directory: str) -> JobStore:
    """The store of ``directory``.

    * Nothing there: a new store.
    * A store that cannot be read as one (damaged, truncated, a newer agent's, a symbolic
      link, a directory): moved aside (never deleted, never followed) and a new store made;
      ``damaged_copy`` names where the old one went and ``damage`` says what was wrong.
    * A sound store that cannot be written now: kept, read as far as it can be, with
      :attr:`JobStore.unwritable` saying why (its writes are owed).

    :class:`StoreError` if none of that works (the message says why, and where an old file
    went)."""
    path = os.path.join(directory, JobStore.FILE)
    try:
        return JobStore(path)
    except StoreUnwritable as exc:
        try:
            return JobStore.reading_only(path, exc.message)
        except StoreDamaged as damaged:
            first = damaged.message
        except StoreUnwritable:
            raise exc from None
    except StoreDamaged as damaged:
        first = damaged.message
    aside = _move_aside(path, first)
    log.warning("%s; kept as %s, starting a new store", first, aside)
    try:
        store = JobStore(path)
    except StoreError as second:
        raise StoreError(f"{second.message} (the damaged store was kept as {aside})") from None
    store.damaged_copy = aside
    store.damage = first
    return store


def _move_aside(path: str, why: str) -> str:
    """Rename what is at ``path`` (and its log and shared-memory files) to a name of its own;
    where it went.  A symbolic link is renamed itself, never what it points to."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = f"{path}.damaged-{stamp}"
    number = 1
    while any(os.path.lexists(aside + suffix) for suffix in ("", "-wal", "-shm")):  # never replaced
        number += 1
        aside = f"{path}.damaged-{stamp}-{number}"
    try:
        if os.path.lexists(path):
            os.rename(path, aside)
        for suffix in ("-wal", "-shm"):
            if os.path.lexists(path + suffix):
                os.rename(path + suffix, aside + suffix)
    except OSError as exc:
        raise StoreError(f"{why}; it could not be moved aside: {exc.strerror or exc}") from None
    return aside
