"""A batch job's output: its standard output and error files, followed while the job runs.

A job submitted here writes them in the spool directory (``~/.proxy-agent/BACKEND``) unless the
submission names files.  Its final state is shown only once all of its output has been
delivered, and the spool files are removed then.  Output carries its file offsets, so the job
store records how far delivery got."""


import os
from typing import Dict, Optional, Tuple

import trio

from ...service.jobs import JobState
from ...service.model import K
from .. import common
from .tracked import TrackedJob
from .values import ran_or_ended

_READ_CHUNK = 1 << 18


class OutputFollowing:
    """How a batch backend follows its jobs' output files."""

    def _start_followers(self, tracked: TrackedJob, streams: Dict[str, Tuple[int, Optional[tuple]]]) -> None:
        if self._nursery is None:
            return
        tracked.started = trio.Event()
        tracked.done = trio.Event()
        state = self.model.attr(tracked.element, K.STATE)
        try:
            parsed = JobState(state) if isinstance(state, str) else JobState.UNDEFINED
        except ValueError:
            parsed = JobState.UNDEFINED
        if ran_or_ended(parsed):
            tracked.started.set()
        if tracked.completed:
            tracked.done.set()
        for stream, (offset, stale) in streams.items():
            tracked.followers += 1
            self._nursery.start_soon(self._follow, tracked, tracked.paths[stream], stream, offset, stale)
        if not streams and tracked.completed:
            self._remove_spool(tracked)

    async def _follow(self, tracked: TrackedJob, path: str, stream: str, offset: int, stale: Optional[tuple]) -> None:
        try:
            await self._follow_file(tracked, path, stream, offset, stale)
        finally:
            tracked.followers -= 1
            if tracked.followers == 0:
                if tracked.held is not None and tracked.element in self.model:
                    job_values, process_values = tracked.held
                    tracked.held = None
                    with self.model.batch():
                        self._set(tracked.process, process_values)
                        self._set(tracked.element, job_values)
                if tracked.completed:
                    self._remove_spool(tracked)

    async def _follow_file(self, tracked: TrackedJob, path: str, stream: str, offset: int, stale: Optional[tuple]) -> None:
        assert tracked.started is not None and tracked.done is not None
        splitter = common.LineSplitter()
        inode = None
        quiet_since: Optional[float] = None
        model = self.model
        pid = tracked.process
        while not (tracked.started.is_set() or tracked.done.is_set()):
            await trio.sleep(self.output_interval)
        while pid in model:
            done = tracked.done.is_set()
            signature, size, data = _read_new(path, offset, stale)
            await trio.lowlevel.checkpoint()
            if pid not in model:
                break
            if signature is not None and signature != stale:
                stale = None
                if size < offset or (inode is not None and signature[:2] != inode):
                    offset, inode, splitter = 0, None, common.LineSplitter()  # truncated or replaced
                    continue
                inode = signature[:2]
            if data:
                offset += len(data)
                text = splitter.feed_text(data)
                if text is not None:
                    model.output(pid, stream, text, offset - splitter.pending_bytes)
                quiet_since = None
                if not model.output_room_available():
                    await model.output_room()
                if len(data) == _READ_CHUNK:
                    continue
            if done:
                now = trio.current_time()
                if quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= self.output_drain_grace:
                    break
            await trio.sleep(self.output_interval)
        if pid in model:
            text = splitter.flush_text()
            if text is not None:
                model.output(pid, stream, text, offset)

    @staticmethod
    def _remove_spool(tracked: TrackedJob) -> None:
        for path in tracked.spool_files:
            try:
                os.unlink(path)
            except OSError:
                pass
        tracked.spool_files = ()


def file_signature(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


def _read_new(path: str, offset: int, stale: Optional[tuple]) -> Tuple[Optional[tuple], int, bytes]:
    """(signature or None if missing, size, bytes from ``offset``); nothing while the file
    still has the ``stale`` signature it had before the job (left by an earlier run)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            sig = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
            if (stale is not None and sig == stale) or st.st_size <= offset:
                return sig, st.st_size, b""
            f.seek(offset)
            return sig, st.st_size, f.read(_READ_CHUNK)
    except OSError:
        return None, 0, b""
