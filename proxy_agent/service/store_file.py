"""The job store's database file: its schema and how an older one is brought up to date, the
errors of the store, SQLite's errors told apart (cannot be used now, or damaged), and what is
at the store's path made, checked and moved aside.  Nothing here is followed through a
symbolic link."""

from __future__ import annotations

import os
import sqlite3
import stat
import time

from .stored_job import COLUMNS

__all__ = ["SCHEMA_VERSION", "StoreDamaged", "StoreError", "StoreUnwritable", "check_content", "check_file",
           "check_pages", "check_version", "create_file", "explained", "make_private", "migrate", "move_aside",
           "read_only", "transient"]

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


def read_only(exc: BaseException) -> bool:
    """Does this SQLite error say the connection was opened read-only?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 8  # SQLITE_READONLY and its extended codes
    return "readonly" in str(exc).lower()


def explained(exc: BaseException, path: str) -> str:
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


def check_version(db: sqlite3.Connection, path: str = "") -> int:
    """The schema version of the database; :class:`StoreDamaged` if a newer agent wrote it."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise StoreDamaged(f"the job store {path} cannot be used: it was written by a newer proxy-agent "
                           f"(schema {version}; this one knows {SCHEMA_VERSION})")
    return version


def migrate(db: sqlite3.Connection) -> None:
    """The database brought to :data:`SCHEMA_VERSION`, in one transaction."""
    version = check_version(db)
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


def create_file(path: str) -> None:
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
            migrate(db)
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


def make_private(path: str) -> None:
    """Mode 0600 for the file at ``path`` if there is one, never following a symbolic link
    (:func:`check_file` refused one; this holds even if one is put there since)."""
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


def check_file(path: str) -> None:
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


def check_pages(db: sqlite3.Connection) -> None:
    """Every page of the database is sound (sqlite3.Error if not)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise sqlite3.DatabaseError(f"database disk image is malformed ({'; '.join(map(str, problems[:3]))})")


def check_content(db: sqlite3.Connection) -> None:
    """The jobs read back (sqlite3.Error if not)."""
    db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs").fetchall()


def move_aside(path: str, why: str) -> str:
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
