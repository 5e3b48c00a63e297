"""The job list for people: ``proxy-agent jobs`` and ``proxy-agent forget``, no agent needed.

``proxy-agent jobs [--state-dir DIR] [--json]`` lists the jobs the store keeps (id, name,
scheduler, queue, native id, state, submitted, ended); ``proxy-agent forget JOB... |
--ended-before DATE`` removes entries of jobs that have ended (a running job is never
forgotten), and a local job's output files with it.  Both read the store of a running agent safely (SQLite in WAL mode).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sqlite3
import sys
from typing import List, NoReturn, Optional

from .service.store import JobStore, StoreError, StoreUnwritable, default_state_dir

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser(command: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"proxy-agent {command}")
    parser.add_argument("--state-dir", metavar="DIR", help="the agent's state directory (default: %(default)s)",
                        default=default_state_dir())
    if command == "jobs":
        parser.description = "List the jobs the agent keeps, with or without an agent running."
        parser.add_argument("--json", action="store_true", help="one JSON object per job")
    else:
        parser.description = "Remove ended jobs from the agent's job list."
        parser.add_argument("jobs", nargs="*", metavar="JOB", help="job ids (as `proxy-agent jobs` shows them)")
        parser.add_argument("--ended-before", metavar="DATE",
                            help="forget every job that ended before DATE (YYYY-MM-DD or YYYY-MM-DDTHH:MM)")
    return parser


def _time(value: Optional[float]) -> str:
    if value is None:
        return ""
    return _dt.datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def _open(directory: str, writing: bool = False) -> JobStore:
    """The store of ``directory``, as it is (a damaged one is a StoreError saying so, never
    moved or followed); one that cannot be written now is read as it is, unless ``writing``."""
    path = os.path.join(directory, JobStore.FILE)
    if not os.path.lexists(path):
        raise StoreError(f"no job store in {directory} (no agent has kept jobs there)")
    try:
        return JobStore(path)
    except StoreUnwritable as exc:
        if writing:
            raise
        return JobStore.reading_only(path, exc.message)


def _visible(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _list(args: argparse.Namespace) -> int:
    store = _open(args.state_dir)
    try:
        jobs = store.jobs()
    finally:
        store.close()
    if args.json:
        for job in jobs:
            print(json.dumps({
                "id": job.key, "name": job.name, "scheduler": job.backend, "queue": job.queue,
                "native_id": job.native_id, "state": job.state, "native_state": job.native_state,
                "submitted": _time(job.submitted), "ended": _time(job.ended) or None, "message": job.message,
                "client_ref": job.client_ref,
            }))
        return 0
    rows = [("ID", "NAME", "SCHEDULER", "QUEUE", "NATIVE ID", "STATE", "SUBMITTED", "ENDED")]
    for job in jobs:
        rows.append((str(job.key), _visible(job.name), job.backend, _visible(job.queue), _visible(job.native_id),
                     job.state, _time(job.submitted), _time(job.ended)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _forget(args: argparse.Namespace) -> int:
    if not args.jobs and not args.ended_before:
        print("proxy-agent forget: name jobs, or give --ended-before DATE", file=sys.stderr)
        return 2
    keys = []
    for text in args.jobs:
        if not (text.isascii() and text.isdigit()):
            print(f"proxy-agent forget: {text!r} is not a job id", file=sys.stderr)
            return 2
        keys.append(int(text))
    when = None
    if args.ended_before:
        try:
            when = _dt.datetime.fromisoformat(args.ended_before).timestamp()
        except ValueError:
            print(f"proxy-agent forget: {args.ended_before!r} is not a date like 2026-01-31 or 2026-01-31T12:00",
                  file=sys.stderr)
            return 2
    store = _open(args.state_dir, writing=True)
    try:
        backends = {job.key: job.backend for job in store.jobs()}
        forgotten, refused = store.forget(keys)
        if when is not None:
            forgotten += store.forget_ended_before(when)
    finally:
        store.close()
    _remove_local_files(args.state_dir, [key for key in forgotten if backends.get(key) == "local"])
    missing = [k for k in keys if k not in forgotten and k not in refused]
    for key in refused:
        print(f"proxy-agent forget: job {key} has not ended; it is kept", file=sys.stderr)
    for key in missing:
        print(f"proxy-agent forget: no job {key} in the list", file=sys.stderr)
    print(f"forgot {len(forgotten)} job{'s' if len(forgotten) != 1 else ''}")
    return 1 if refused or missing else 0


def _remove_local_files(state_dir: str, keys: List[int]) -> None:
    """Forgotten local jobs' output files, kept by the keeper until now (only once the
    keeper has recorded their end: in its journal, or an older keeper's ``status.json``)."""
    if not keys:
        return
    from .schedulers.keeper import JOURNAL, forget_in_journal, read_journal

    local = os.path.join(state_dir, "local")
    journal = read_journal(os.path.join(local, JOURNAL))
    for key in keys:
        directory = os.path.join(local, "jobs", str(key))
        if journal.get(key, {}).get("done") or os.path.isfile(os.path.join(directory, "status.json")):
            shutil.rmtree(directory, ignore_errors=True)
    forget_in_journal(local, [key for key in keys if journal.get(key, {}).get("done")])


def main(argv: List[str]) -> int:
    command, rest = argv[0], argv[1:]
    args = _parser(command).parse_args(rest)
    try:
        return _list(args) if command == "jobs" else _forget(args)
    except StoreError as exc:
        print(f"proxy-agent {command}: {exc.message}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # found damaged while reading
        print(f"proxy-agent {command}: the job store in {args.state_dir} cannot be read: {exc}", file=sys.stderr)
        return 2
