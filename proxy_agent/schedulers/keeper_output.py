"""The keeper's copying of its jobs' output from their pipes into files, held back while a file
runs too far ahead of what the agent has read, and dropped (and counted) when the disk has no
room."""

from __future__ import annotations

import errno
import os
import selectors
import time
from typing import Optional, Tuple

from .custodian import say
from .keeper_jobs import KeptJob, output_file
from .keeper_journal import NO_ROOM

__all__ = ["AHEAD", "AHEAD_DETACHED", "OutputCopying"]

#: How far (bytes) an output file may run ahead of what the connected agent has read.
AHEAD = 8 << 20
#: The same while no agent is connected.
AHEAD_DETACHED = 256 << 20
_READ = 1 << 16

#: Move output from pipe to file in the kernel where it can (no copy, and a keeper killed
#: in between cannot have taken bytes out of the pipe without writing them).
_SPLICE = hasattr(os, "splice")


class OutputCopying:
    """Output from pipes to files: a part of :class:`~.keeper.Keeper`, whose state it uses."""

    def _pipe_readable(self, fd: int) -> None:
        entry = self.by_fd.get(fd)
        if entry is None:
            return
        job, process, stream = entry
        where = (process.rank, stream)
        taken = self._take_output(job, where, fd)
        if taken is None:
            return
        if taken == 0:
            self._close_pipe(fd)
            return
        self._notify_output(job, where)
        limit = AHEAD if self.agent is not None else AHEAD_DETACHED
        if job.sizes[where] - job.read.get(where, 0) > limit:
            self.selector.unregister(fd)
            self.paused.add(fd)

    def _take_output(self, job: KeptJob, where: Tuple[int, str], fd: int) -> Optional[int]:
        """Move what the pipe holds into the process's file (what the disk has no room for
        is dropped and counted); the bytes taken from the pipe, 0 at its end, None if it
        holds nothing now."""
        global _SPLICE
        out = job.files.get(where)
        if _SPLICE and out is not None:
            try:
                moved = os.splice(fd, out, _READ)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EXDEV):
                    _SPLICE = False  # not for this file system: copy through the keeper instead
                elif exc.errno not in NO_ROOM and exc.errno != errno.EIO:
                    return 0
            else:
                job.sizes[where] += moved
                return moved
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data:
            self._write_output(job, where, data)
        return len(data)

    def _write_output(self, job: KeptJob, where: Tuple[int, str], data: bytes) -> None:
        """Append to a process's file; what the disk does not take is dropped and counted."""
        view = memoryview(data)
        try:
            out = output_file(job, where)
            while view:
                view = view[os.write(out, view):]
        except OSError as exc:
            job.sizes[where] += len(data) - len(view)
            self._drop(job, where, view.tobytes(), exc)
            return
        job.sizes[where] += len(data)

    def _drop(self, job: KeptJob, where: Tuple[int, str], data: bytes, exc: OSError) -> None:
        """Output the disk did not take: counted, with where the file stops (the gap)."""
        at = job.sizes[where]
        dropped = job.dropped.setdefault(where, [0, 0, at])
        dropped[0] += len(data)
        dropped[1] += data.count(b"\n")
        dropped[2] = at
        self.drops_untold[(job.key, where)] = None
        if exc.errno in NO_ROOM:
            self.disk_full_at = time.monotonic()
        if not self.drop_logged:
            self.drop_logged = True
            say(f"keeper: output of job {job.key} dropped: {exc.strerror or exc}")

    def _tell_drops(self) -> None:
        """Tell the agent how much output each file has lost so far (totals, and where the
        latest loss is in the file)."""
        untold, self.drops_untold = self.drops_untold, {}
        for key, where in untold:
            job = self.jobs.get(key)
            if job is None or where not in job.dropped:
                continue
            size, lines, at = job.dropped[where]
            self._send({"op": "dropped", "key": key, "rank": where[0], "stream": where[1], "bytes": size,
                        "lines": lines, "at": at})

    def _maybe_resume(self, fd: int) -> None:
        entry = self.by_fd.get(fd)
        if entry is None:
            self.paused.discard(fd)
            return
        job, process, stream = entry
        where = (process.rank, stream)
        limit = AHEAD if self.agent is not None else AHEAD_DETACHED
        if job.sizes[where] - job.read.get(where, 0) <= limit:
            self.paused.discard(fd)
            self.selector.register(fd, selectors.EVENT_READ, ("pipe", None))

    def _notify_output(self, job: KeptJob, where: Tuple[int, str]) -> None:
        if self.agent is None or where in job.notified:
            return
        job.notified.add(where)
        self._send({"op": "output", "key": job.key, "rank": where[0], "stream": where[1], "size": job.sizes[where]})

    def _release_pipe(self, fd: int):
        """Stop watching a process's pipe and close it; what it was (None: unknown)."""
        entry = self.by_fd.pop(fd, None)
        if fd in self.paused:
            self.paused.discard(fd)
        else:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
        os.close(fd)
        if entry is not None:
            entry[1].fds.pop(entry[2], None)
        return entry

    def _close_pipe(self, fd: int) -> None:
        entry = self._release_pipe(fd)
        if entry is not None:
            self._check_process(entry[0], entry[1])
