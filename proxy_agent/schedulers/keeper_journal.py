"""The keeper's journal (``jobs.jsonl``, see :mod:`proxy_agent.service.journal`): jobs
recorded before they start and their ends, the state of jobs an older keeper left in
directories of their own, and whether the disk has room for a new job."""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Dict, List, Optional

from .keeper_jobs import KeptJob, add_troubles
from ..service.journal import journal_line, read_journal

__all__ = ["JobJournal", "MIN_FREE", "NO_ROOM"]

#: Free bytes the state directory's disk must have for a new job to be accepted.
MIN_FREE = 1 << 20
#: Seconds after the disk refused output during which new jobs are refused (for a quota,
#: which the free space does not show).
_FULL_MEMORY = 5.0
#: Errors of a write that mean the disk has no room (the data is dropped and counted).
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class JobJournal:
    """What the keeper writes of its jobs to the disk: a part of :class:`~.keeper.Keeper`, whose
    state it uses."""

    def _record_started(self, requests: list, lines: List[bytes]) -> Dict[int, str]:
        """Journal the jobs about to start, with their requests as the agent sent them (a
        keeper that replaces one that died before it started them starts them), synced to the
        disk; the keys that could not be recorded (nothing of them runs), with why."""
        entries = []
        keys = []
        head = f'{{"started":{time.time()!r},"mark":{json.dumps(self.reaper.instance)},"key":'.encode()
        for request, line in zip(requests, lines):
            if isinstance(request, dict) and request.get("op") == "spawn":
                key = request.get("key")
                if isinstance(key, int) and key not in self.jobs and isinstance(request.get("argv"), list):
                    entries.append(b"%s%d,\"request\":%s}\n" % (head, key, line.strip()))
                    keys.append(key)
        if not entries:
            return {}
        error = self._no_room()
        if error is None and self.journal_pending:
            error = self._write_journal()  # what is pending goes first, whole
        if error is None:
            error = self._append_journal(b"".join(entries), sync=True)
        if error:
            return {key: error for key in keys}
        self.recorded = keys
        return {}

    def _no_room(self) -> Optional[str]:
        """Why a new job cannot be taken now for lack of disk space (None: it can)."""
        try:
            info = os.statvfs(self.dir)
            free = info.f_bavail * info.f_frsize
        except OSError:
            return None
        recent = self.disk_full_at is not None and time.monotonic() - self.disk_full_at < _FULL_MEMORY
        if free >= MIN_FREE and not recent:
            return None
        return (f"no space left on the disk of {self.dir} ({free // 1024} KiB free): new jobs are refused until "
                "space is freed")

    def _write_journal(self) -> Optional[str]:
        """Append what is pending to the journal (kept to try again if the disk refuses it);
        why it failed, if it did."""
        data = b"".join(self.journal_pending)
        self.journal_pending = []
        error = self._append_journal(data)
        if error is not None:
            self.journal_pending = [data]
        return error

    def _append_journal(self, data: bytes, sync: bool = False) -> Optional[str]:
        """Append whole lines to the journal (synced to the disk if ``sync``); on failure the
        journal is cut back to where it was, so that no torn line is left for the next write
        to run into.  Why it failed, if it did."""
        try:
            size = os.fstat(self.journal).st_size
        except OSError as exc:
            return f"cannot record the job in {self.journal_path}: {exc.strerror or exc}"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.journal, view):]
            if sync:
                os.fdatasync(self.journal)
        except OSError as exc:
            try:
                os.ftruncate(self.journal, size)
            except OSError:
                pass
            if exc.errno in NO_ROOM:
                self.disk_full_at = time.monotonic()
            return f"cannot record the job in {self.journal_path}: {exc.strerror or exc}"
        return None

    def _ended_on_disk(self) -> List[dict]:
        """Jobs ended under an earlier keeper (in the journal, or the ``status.json`` of an
        older keeper), not in memory now."""
        found = []
        if self.journal_pending:
            self._write_journal()
        journal = read_journal(self.journal_path)
        for key, entry in journal.items():
            if key in self.jobs or entry.get("forgotten"):
                continue
            if not entry.get("done"):
                # started but never finished here (the keeper itself was killed): lost
                entry = {"key": key, "done": True, "lost": True, "codes": [], "pids": []}
            found.append(entry)
        try:
            names = os.listdir(self.jobs_dir)
        except OSError:
            return found
        for name in names:
            if not name.isdigit() or int(name) in self.jobs or int(name) in journal:
                continue
            try:
                with open(os.path.join(self.jobs_dir, name, "status.json")) as status:
                    data = json.load(status)
            except (OSError, ValueError):
                # started but never finished here (the keeper itself was killed): lost
                data = {"key": int(name), "done": True, "lost": True, "codes": [], "pids": []}
            data["done"] = True
            found.append(data)
        return found


    def _write_status(self, job: KeptJob, error: Optional[str] = None) -> None:
        status = {
            "key": job.key,
            "done": True,
            "pids": [p.pid for p in job.processes],
            "codes": [p.code for p in job.processes],
            "sizes": {f"{r}.{s}": n for (r, s), n in job.sizes.items()},
            "started": job.started,
            "ended": job.ended,
        }
        if error is not None:
            job.error = error
        add_troubles(status, job)
        # written with the round's other entries, before the "done" that tells of it
        self.journal_pending.append(journal_line(status))

    def _forget(self, key: int) -> None:
        job = self.jobs.get(key)
        if job is not None and not job.done:
            return
        self.jobs.pop(key, None)
        self.journal_pending.append(journal_line({"key": key, "forgotten": True}))
        self._write_journal()
        directory = os.path.join(self.jobs_dir, str(key))
        try:
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            os.rmdir(directory)
        except OSError:
            pass
