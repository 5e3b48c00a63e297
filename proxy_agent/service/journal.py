"""The local jobs' journal in the state directory: written by the keeper, which runs the
local scheduler's jobs, and read (and marked) by whoever forgets jobs, the service or the
``proxy-agent forget`` command, without the keeper.  The format lives here, beside the rest of
the state directory, so that forgetting a job needs nothing of the schedulers."""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable

__all__ = ["JOURNAL", "compact_journal", "forget_in_journal", "journal_line", "read_journal"]


#: The keeper's journal, in its directory: one JSON object a line, the last line of a key
#: counting.  ``{"key", "started", "mark"}`` is written (and synced to the disk) before the
#: job's processes start, ``mark`` being the job marker of its processes (see :mod:`proxy_agent.schedulers.reaper`);
#: the job's status (``"done": true``, pids, codes, sizes, started, ended, error) when it has
#: ended; ``{"key", "forgotten": true}`` once its files are removed.  Older keepers wrote the
#: status as ``jobs/KEY/status.json``; those are still read.
JOURNAL = "jobs.jsonl"


#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode


def journal_line(entry: dict) -> bytes:
    return _compact(entry).encode() + b"\n"


def read_journal(path: str) -> Dict[int, dict]:
    """The last entry of each key in a journal (nothing if there is none)."""
    entries: Dict[int, dict] = {}
    try:
        with open(path, "rb") as journal:
            data = journal.read()
    except OSError:
        return entries
    for line in data.split(b"\n"):
        try:
            entry = json.loads(line)
            entries[int(entry["key"])] = entry
        except (ValueError, KeyError, TypeError):
            continue  # an empty or torn line
    return entries


def forget_in_journal(directory: str, keys: Iterable[int]) -> None:
    """Record that the files of these jobs were removed (by a command, without the keeper)."""
    path = os.path.join(directory, JOURNAL)
    journal = read_journal(path)
    data = b"".join(journal_line({"key": key, "forgotten": True}) for key in keys if key in journal)
    if data:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def compact_journal(path: str) -> Dict[int, dict]:
    """Rewrite the journal with the last entry of each key remembered (none for a forgotten
    job) when that makes it shorter; those entries."""
    entries = read_journal(path)
    kept = {key: entry for key, entry in entries.items() if not entry.get("forgotten")}
    data = b"".join(journal_line(entry) for entry in kept.values())
    try:
        size = os.path.getsize(path)
    except OSError:
        return kept
    if len(data) < size:
        temporary = path + ".new"
        try:
            # the journal's own mode (0600), whatever the umask: it names the user's jobs
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, 0o600)  # a copy left by an older keeper may have another mode
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        except OSError:
            pass
    return kept
