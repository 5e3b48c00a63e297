"""Every job's output, kept in the state directory until the job is forgotten.

Live delivery hands each line to the clients connected at the time, once.  What a job wrote
is also *kept*, whatever the clients did, so that it can be read again later in full
(``proxy-agent output JOB``, the console's ``output``, the client's ``Job.stdout``), as a
batch system keeps ``slurm-N.out``.  Every backend's output passes through the service's
model; :class:`OutputHistory` hears it there (:meth:`~.model.ServiceModel.record_output`)
and appends it to files, synchronously, before any client is handed the same lines.

Layout, in ``STATE_DIR/output/KEY/`` (mode 0700, files 0600):

* ``RANK.out`` and ``RANK.err``: the lines process RANK wrote to stdout and stderr, in order,
  each ending with a newline, as UTF-8 (a file exists once its stream wrote something);
* ``RANK.out.at`` (``RANK.err.at``): where each block read from the backend's own file ends
  there and here: pairs of 8-byte little-endian numbers (offset in the backend's file, size
  of ``RANK.out`` after the block).  A later agent that reads a job's file again from where
  delivery to a client stopped first cuts the kept output back to that point, so that no
  line is kept twice;
* ``dropped.json``: lines not kept, per stream (``{"RANK.stream": [lines, offset, why]}``;
  ``why`` is empty for lines past the bound, else what stopped them being written).

**The bound.**  The first :data:`LIMIT` bytes of a job's output (all its processes and
streams together) are kept; lines past it are counted, not kept, and whoever reads the
output is told how many.

**A full disk.**  A block of lines the disk refuses (no room, or any other write error) is
taken back whole (the files are cut back to where they were: no half line stays) and counted
as not kept, with the reason, as are the stream's later lines: what is kept of a stream is
always its first lines, in order, with the count of the rest.  The agent and the job carry
on.  The counts are written once the disk takes them; until then the agent answers with the
counts it holds.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Tuple

import attrs

log = logging.getLogger("proxy_agent.service.history")

__all__ = [
    "DIRECTORY",
    "LIMIT",
    "JobOutput",
    "OutputHistory",
    "StreamOutput",
    "job_directory",
    "read_job_output",
    "remove_job_output",
]

#: The directory of kept output in the state directory.
DIRECTORY = "output"
#: Bytes of output kept per job (every process and stream together).
LIMIT = 64 << 20
#: File name suffix of each stream.
SUFFIX = {"stdout": "out", "stderr": "err"}
_STREAM_OF = {value: key for key, value in SUFFIX.items()}
#: One checkpoint: offset in the backend's file, size of the kept file.
_CHECKPOINT = struct.Struct("<QQ")
_DROPPED = "dropped.json"
#: Kept files held open at once (the oldest closes first; a busy host has many processes).
_OPEN_FILES = 64
#: Errors of a write that mean the disk has no room.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def job_directory(state_dir: str, key: int) -> str:
    return os.path.join(state_dir, DIRECTORY, str(int(key)))


def _file_name(rank: int, stream: str) -> str:
    return f"{int(rank)}.{SUFFIX[stream]}"


# --------------------------------------------------------------------------- reading


@attrs.frozen
class StreamOutput:
    """What one process wrote to one stream, as kept: ``lines`` in order (from the line
    numbered ``first``: 0 for all of them) and how many later lines were not kept, and why
    (``why_dropped``: empty for lines past the bound, else what refused them, such as a full
    disk)."""

    rank: int
    stream: str
    lines: Tuple[str, ...]
    first: int = 0
    dropped: int = 0
    why_dropped: str = ""

    @property
    def total(self) -> int:
        """Lines kept so far, counting those before ``first``."""
        return self.first + len(self.lines)


@attrs.frozen
class JobOutput:
    """A job's kept output: one :class:`StreamOutput` per process and stream that wrote
    something, by rank, stdout before stderr."""

    key: int
    streams: Tuple[StreamOutput, ...] = ()

    def text(self, stream: str = "stdout", rank: Optional[int] = None) -> str:
        """The lines of one stream, every process's (rank by rank) or one's, each ending in a newline."""
        return "".join(line + "\n" for part in self.streams
                       if part.stream == stream and (rank is None or part.rank == rank) for line in part.lines)

    def dropped(self, stream: Optional[str] = None) -> int:
        return sum(part.dropped for part in self.streams if stream is None or part.stream == stream)


#: Lines not kept of a stream: (lines, the offset in the backend's file they reach, why).
Dropped = Tuple[int, int, str]


def _read_dropped(directory: str) -> Dict[str, Dropped]:
    try:
        with open(os.path.join(directory, _DROPPED), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    found: Dict[str, Dropped] = {}
    if isinstance(data, dict):
        for name, value in data.items():
            if (isinstance(value, list) and len(value) in (2, 3) and all(isinstance(v, int) for v in value[:2])
                    and all(isinstance(v, str) for v in value[2:])):
                found[name] = (value[0], value[1], value[2] if len(value) == 3 else "")
    return found


def _split_lines(data: bytes) -> List[str]:
    text = data.decode("utf-8", "replace")
    if not text:
        return []
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def read_job_output(state_dir: str, key: int, *, rank: Optional[int] = None, streams: Iterable[str] = ("stdout", "stderr"),
                    skip: Optional[Dict[Tuple[int, str], int]] = None,
                    dropped_now: Optional[Dict[str, Dropped]] = None) -> JobOutput:
    """A job's kept output as it is on disk now (an empty :class:`JobOutput` when none is
    kept).  ``skip`` leaves out the first N lines of a stream (``{(rank, stream): N}``: those
    a reader has already).  ``dropped_now``: the counts of lines not kept as the writer holds
    them (:meth:`OutputHistory.dropped`), newer than ``dropped.json`` when a full disk has
    not taken them yet."""
    directory = job_directory(state_dir, key)
    wanted = set(streams)
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
        if not dropped_now:
            return JobOutput(key)
    dropped = _read_dropped(directory)
    dropped.update(dropped_now or {})
    # every stream with a file, and those whose every line was past the bound
    present = {(int(number), _STREAM_OF[suffix]) for number, dot, suffix in (n.partition(".") for n in names)
               if dot and number.isdigit() and suffix in _STREAM_OF}
    for name in dropped:
        number, _, stream = name.partition(".")
        if number.isdigit() and stream in SUFFIX:
            present.add((int(number), stream))
    found = []
    for number, stream in present:
        if stream not in wanted or (rank is not None and number != rank):
            continue
        try:
            with open(os.path.join(directory, _file_name(number, stream)), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            data = b""
        except OSError:
            continue
        lines = _split_lines(data)
        first = min((skip or {}).get((number, stream), 0), len(lines))
        lost, _, why = dropped.get(f"{number}.{stream}", (0, 0, ""))
        found.append(StreamOutput(number, stream, tuple(lines[first:]), first, lost, why))
    found.sort(key=lambda part: (part.rank, part.stream != "stdout"))
    return JobOutput(key, tuple(found))


def remove_job_output(state_dir: str, key: int) -> None:
    shutil.rmtree(job_directory(state_dir, key), ignore_errors=True)


# --------------------------------------------------------------------------- writing


class _Stream:
    """One process's stream of a job being written."""

    __slots__ = ("name", "size", "dropped", "dropped_at", "why", "rollback", "skip_until")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        #: bytes in the kept file
        self.size = size
        #: lines not kept, and the offset in the backend's file they reach
        self.dropped = 0
        self.dropped_at = 0
        #: why they were not kept ('': past the bound)
        self.why = ""
        #: a later agent reads the backend's file again from this offset: cut back first
        self.rollback: Optional[int] = None
        #: blocks ending at or before this offset were counted already (past the limit)
        self.skip_until = -1


class _Job:
    __slots__ = ("key", "directory", "streams", "total", "dropped_dirty", "refused")

    def __init__(self, key: int, directory: str) -> None:
        self.key = key
        self.directory = directory
        self.streams: Dict[str, _Stream] = {}
        self.total = 0
        self.dropped_dirty = False
        #: a write of this job's output failed (said once in the log)
        self.refused = False


class OutputHistory:
    """Appends every stored job's output to its files (see the module documentation).

    A write that fails (a full disk) is logged once per job; what it would have written is
    counted as not kept, with the reason (see the module documentation); the agent and the job
    carry on."""

    def __init__(self, state_dir: str, limit: int = LIMIT) -> None:
        self.state_dir = state_dir
        self.root = os.path.join(state_dir, DIRECTORY)
        self.limit = limit
        self._jobs: Dict[int, _Job] = {}
        #: adopted jobs whose backend reads their files again: key -> {"RANK.stream": offset}
        self._rereading: Dict[int, Dict[str, int]] = {}
        #: (key, file name) -> open descriptor, the least recently used first
        self._files: "OrderedDict[Tuple[int, str], int]" = OrderedDict()
        #: ended jobs whose counts of lines not kept the disk has not taken yet
        self._unsaved: Dict[int, _Job] = {}

    # ------------------------------------------------------------------ jobs

    def _job(self, key: int) -> _Job:
        job = self._jobs.get(key)
        if job is None:
            job = self._jobs[key] = _Job(key, job_directory(self.state_dir, key))
            self._load(job)
            delivered = self._rereading.pop(key, None)
            if delivered is not None:
                for name, stream in job.streams.items():
                    rank, _, suffix = name.partition(".")
                    stream.rollback = delivered.get(f"{rank}.{_STREAM_OF[suffix]}", 0)
        return job

    def _load(self, job: _Job) -> None:
        """What an earlier agent kept of the job: sizes and counts."""
        try:
            names = os.listdir(job.directory)
        except OSError:
            return
        dropped = _read_dropped(job.directory)
        for name in names:
            number, dot, suffix = name.partition(".")
            if dot and number.isdigit() and suffix in _STREAM_OF:
                try:
                    size = os.path.getsize(os.path.join(job.directory, name))
                except OSError:
                    continue
                stream = job.streams[name] = _Stream(name, size)
                job.total += size
        for name, (lines, offset, why) in dropped.items():
            number, _, stream_name = name.partition(".")
            if number.isdigit() and stream_name in SUFFIX:
                stream = self._stream(job, _file_name(int(number), stream_name))
                stream.dropped, stream.dropped_at, stream.why = lines, offset, why

    def _stream(self, job: _Job, name: str) -> _Stream:
        stream = job.streams.get(name)
        if stream is None:
            stream = job.streams[name] = _Stream(name, 0)
        return stream

    def expect_rereading(self, key: int, delivered: Dict[str, int]) -> None:
        """A job adopted from the store: its backend reads its files again from where delivery
        stopped (``{"RANK.stream": offset}``; 0 where nothing was delivered).  Whatever was
        kept past that point is cut back when the first block read again arrives."""
        job = self._job(key)
        for name, stream in job.streams.items():
            rank, _, suffix = name.partition(".")
            stream.rollback = delivered.get(f"{rank}.{_STREAM_OF[suffix]}", 0)

    def ended(self, key: int) -> None:
        """The job has ended: its files are closed (their content stays)."""
        for name in [n for (k, n) in self._files if k == key]:
            os.close(self._files.pop((key, name)))
        job = self._jobs.pop(key, None)
        self._rereading.pop(key, None)
        if job is not None and job.dropped_dirty:
            self._write_dropped(job)
            if job.dropped_dirty:  # the disk has no room for them yet
                self._unsaved[key] = job

    def forget(self, key: int) -> None:
        """The job is forgotten: everything kept of it goes."""
        for name in [n for (k, n) in self._files if k == key]:
            os.close(self._files.pop((key, name)))
        self._jobs.pop(key, None)
        self._unsaved.pop(key, None)
        self._rereading.pop(key, None)
        remove_job_output(self.state_dir, key)

    def flush(self) -> None:
        """Counts of lines not kept, written out (the lines themselves are written at once);
        those the disk refuses are tried again at the next flush."""
        for job in self._jobs.values():
            if job.dropped_dirty:
                self._write_dropped(job)
        for key, job in list(self._unsaved.items()):
            self._write_dropped(job)
            if not job.dropped_dirty:
                del self._unsaved[key]

    def dropped(self, key: int) -> Dict[str, Dropped]:
        """The counts of lines of job ``key`` not kept, as this writer holds them
        (``{"RANK.stream": (lines, offset, why)}``; {} for a job it does not hold)."""
        job = self._jobs.get(key) or self._unsaved.get(key)
        if job is None:
            return {}
        counts = {}
        for name, kept in job.streams.items():
            if kept.dropped:
                rank, _, suffix = name.partition(".")
                counts[f"{rank}.{_STREAM_OF[suffix]}"] = (kept.dropped, kept.dropped_at, kept.why)
        return counts

    def close(self) -> None:
        self.flush()
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._jobs.clear()

    # ------------------------------------------------------------------ output

    def record(self, key: int, rank: int, stream: str, text: str, offset: Optional[int]) -> None:
        """Lines (joined by ``\n``) of one process's stream; ``offset``: where they end in the
        backend's own file, when it keeps one."""
        try:
            self._record(key, rank, stream, text, offset)
        except OSError as exc:
            self._refused(key, rank, stream, text, offset, exc)

    def _refused(self, key: int, rank: int, stream: str, text: str, offset: Optional[int], exc: OSError) -> None:
        """The disk refused a block: nothing of it stays, and it and the stream's later lines
        are counted as not kept, saying why."""
        job = self._jobs.get(key)
        if job is None:  # (even the job's directory could not be looked at)
            job = self._jobs[key] = _Job(key, job_directory(self.state_dir, key))
        kept = self._stream(job, _file_name(rank, stream))
        if exc.errno in _NO_ROOM:
            why = f"the disk of {self.state_dir} had no room for them"
        else:
            why = f"they could not be written in {self.root}: {exc.strerror or exc}"
        if not kept.dropped:
            kept.why = why
        self._drop(job, kept, text.count("\n") + 1, offset)
        if not job.refused:
            job.refused = True
            log.warning("the output of job %d is no longer kept in full: %s; what is not kept is counted", key,
                        f"the disk of {self.state_dir} has no room" if exc.errno in _NO_ROOM else exc.strerror or exc)

    def _record(self, key: int, rank: int, stream: str, text: str, offset: Optional[int]) -> None:
        job = self._job(key)
        name = _file_name(rank, stream)
        kept = self._stream(job, name)
        if kept.rollback is not None:
            self._roll_back(job, kept, kept.rollback)
            kept.rollback = None
        if offset is not None and offset <= kept.skip_until:
            return  # counted already by the agent before
        data = text.encode("utf-8", "surrogatepass") + b"\n"
        room = self.limit - job.total
        if kept.dropped or room <= 0:
            self._drop(job, kept, text.count("\n") + 1, offset)
            return
        if len(data) > room:
            cut = data.rfind(b"\n", 0, room) + 1  # whole lines only
            if cut:  # the block's end is not kept: no checkpoint for it
                self._append(job, kept, name, data[:cut], None)
            self._drop(job, kept, data.count(b"\n", cut), offset)
            return
        self._append(job, kept, name, data, offset)

    def _append(self, job: _Job, kept: _Stream, name: str, data: bytes, offset: Optional[int]) -> None:
        """The block and its checkpoint, or (OSError) neither: a block the disk takes only
        part of is cut off again, so that no half line is kept."""
        fd = self._open(job, name)
        try:
            _write_all(fd, data)
            if offset is not None:
                _write_all(self._open(job, name + ".at"), _CHECKPOINT.pack(offset, kept.size + len(data)))
        except OSError:
            self._cut_back(job, kept, name)
            raise
        kept.size += len(data)
        job.total += len(data)

    def _cut_back(self, job: _Job, kept: _Stream, name: str) -> None:
        """A stream's files back to what was kept before a write that failed (cutting a file
        shorter needs no room on the disk)."""
        fd = self._files.get((job.key, name))
        at = self._files.get((job.key, name + ".at"))
        try:
            if fd is not None:
                os.ftruncate(fd, kept.size)
            if at is not None:
                size = os.fstat(at).st_size
                os.ftruncate(at, size - size % _CHECKPOINT.size)
        except OSError as exc:
            log.warning("cannot cut %s back after a failed write: %s", os.path.join(job.directory, name),
                        exc.strerror or exc)

    def _drop(self, job: _Job, kept: _Stream, lines: int, offset: Optional[int]) -> None:
        kept.dropped += lines
        if offset is not None:
            kept.dropped_at = max(kept.dropped_at, offset)
        job.dropped_dirty = True

    def _open(self, job: _Job, name: str) -> int:
        entry = (job.key, name)
        fd = self._files.get(entry)
        if fd is not None:
            self._files.move_to_end(entry)
            return fd
        path = os.path.join(job.directory, name)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(job.directory, mode=0o700, exist_ok=True)
            os.chmod(os.path.join(self.state_dir, DIRECTORY), 0o700)
            fd = os.open(path, flags, 0o600)
        self._files[entry] = fd
        while len(self._files) > _OPEN_FILES:
            _, old = self._files.popitem(last=False)
            os.close(old)
        return fd

    def _roll_back(self, job: _Job, kept: _Stream, offset: int) -> None:
        """Cut a stream's kept lines back to where the backend's file is read again from."""
        path = os.path.join(job.directory, kept.name)
        checkpoints = _read_checkpoints(path + ".at")
        last = checkpoints[-1] if checkpoints else (0, 0)
        if offset > last[0] and (kept.dropped or kept.size > last[1]):
            # Read again from past the last checkpoint: the lines kept (or counted) up to
            # there stay, and blocks the earlier agent had counted are not counted again.
            kept.skip_until = kept.dropped_at if kept.dropped else last[0]
            return
        keep_size, keep_count = 0, 0
        for index, (source, size) in enumerate(checkpoints):
            if source > offset:
                break
            keep_size, keep_count = size, index + 1
        for entry in ((job.key, kept.name), (job.key, kept.name + ".at")):
            fd = self._files.pop(entry, None)
            if fd is not None:
                os.close(fd)
        try:
            os.truncate(path, keep_size)
            os.truncate(path + ".at", keep_count * _CHECKPOINT.size)
        except FileNotFoundError:
            pass
        job.total -= kept.size - keep_size
        kept.size = keep_size
        if kept.dropped:
            kept.dropped, kept.dropped_at, kept.why = 0, 0, ""
            job.dropped_dirty = True

    def _write_dropped(self, job: _Job) -> None:
        """The job's counts of lines not kept, replacing the file whole; left dirty (to be
        tried again) if the disk refuses it."""
        counts = {}
        for name, kept in job.streams.items():
            if kept.dropped:
                rank, _, suffix = name.partition(".")
                counts[f"{rank}.{_STREAM_OF[suffix]}"] = [kept.dropped, kept.dropped_at, kept.why]
        path = os.path.join(job.directory, _DROPPED)
        temporary = path + ".new"
        try:
            if not counts:
                if os.path.exists(path):
                    os.unlink(path)
            else:
                os.makedirs(job.directory, mode=0o700, exist_ok=True)
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(counts, handle)
                os.replace(temporary, path)
        except OSError as exc:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            if not job.refused:  # (a full disk is said once per job, here or in record)
                job.refused = True
                log.warning("cannot write %s: %s; tried again later", path, exc.strerror or exc)
            return
        job.dropped_dirty = False


def _read_checkpoints(path: str) -> List[Tuple[int, int]]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    usable = len(data) - len(data) % _CHECKPOINT.size
    return [_CHECKPOINT.unpack_from(data, at) for at in range(0, usable, _CHECKPOINT.size)]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
