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

Only one agent uses a state directory at a time (:mod:`.state_lock`).  The database file, its
schema and the store's errors are :mod:`.store_file`'s; a job's row is :mod:`.stored_job`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ..endpoints import default_state_dir, holder_of
from .jobs import JobSpec
from .state_lock import StateDirInUse, StateLock
from .store_file import (SCHEMA_VERSION, StoreDamaged, StoreError, StoreUnwritable, check_content, check_file,
                         check_pages, check_version, create_file, explained, make_private, migrate, move_aside,
                         read_only, transient)
from .stored_job import COLUMNS, StoredJob, offsets_of, spec_from_json, spec_to_json

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

#: Every how many flushes the write-ahead log is checkpointed.
_CHECKPOINT_EVERY = 20


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
            create_file(path)
        check_file(path)
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._failure(exc, "written") from None
        try:
            check_version(db, path)  # before anything is changed in a newer agent's file
            check_pages(db)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=2000")
            # No checkpoint inside a commit: a delivery is committed just before its output is
            # written, and that time is all an agent killed in between could lose.  The
            # periodic flush checkpoints instead.
            db.execute("PRAGMA wal_autocheckpoint=0")
            migrate(db)
            check_content(db)
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
            make_private(name)  # what an older agent made with the umask's mode
        return db

    def _failure(self, exc: sqlite3.Error, doing: str) -> Exception:
        if transient(exc):
            return StoreUnwritable(f"the job store {self.path} cannot be {doing} now: {explained(exc, self.path)}")
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
        if check_version(store._db, path) < SCHEMA_VERSION:
            store._db.close()
            return None
        store._reading_only = True
        return store

    def _connect_reading(self) -> sqlite3.Connection:
        path = self.path
        check_file(path)
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
                version = check_version(db, path)
                check_pages(db)
                if version == SCHEMA_VERSION:
                    check_content(db)
                return db
            except sqlite3.Error as exc:
                db.close()
                if not transient(exc):
                    raise StoreDamaged(f"the job store {path} cannot be used: {exc}") from None
                last = exc
        raise StoreUnwritable(f"the job store {path} cannot be read now: {last}")


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
        if read_only(exc):
            self._reading_only = True  # the connection stays read-only: a new one is needed
        self._set_unwritable(f"the job store {self.path} cannot be written now: {explained(exc, self.path)}")

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
                        current = offsets_of(row[0])
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
                    current = offsets_of(row[0])
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
                    current = offsets_of(row[0])
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
        query = f"SELECT {', '.join(COLUMNS)} FROM jobs"
        if ended is True:
            query += " WHERE ended IS NOT NULL"
        elif ended is False:
            query += " WHERE ended IS NULL"
        query += " ORDER BY key"
        return [StoredJob(*row) for row in self._db.execute(query)]

    def job(self, key: int) -> Optional[StoredJob]:
        self._write_noted()
        row = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs WHERE key=?", (key,)).fetchone()
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
    aside = move_aside(path, first)
    log.warning("%s; kept as %s, starting a new store", first, aside)
    try:
        store = JobStore(path)
    except StoreError as second:
        raise StoreError(f"{second.message} (the damaged store was kept as {aside})") from None
    store.damaged_copy = aside
    store.damage = first
    return store
