"""What the keeper knows of each job it runs and of the job's processes, and the job's output
files, made when the first output comes."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["KeptJob", "KeptProcess", "add_troubles", "kill_group", "output_file"]


class KeptProcess:
    """A process of a job: its pid, its pipes while open, its exit status once known."""

    __slots__ = ("rank", "pid", "popen", "fds", "code", "exited_at", "reported", "lost")

    def __init__(self, rank: int, pid: int, popen: Optional[subprocess.Popen], fds: Dict[str, int]) -> None:
        self.rank = rank
        self.pid = pid
        #: the Popen object when the process was started through subprocess, else None
        self.popen = popen
        #: stream -> read end of its pipe, while open
        self.fds = fds
        self.code: Optional[int] = None
        self.exited_at: Optional[float] = None
        self.reported = False
        #: why its exit status is not known (it ended with the keeper that ran it), else None
        self.lost: Optional[str] = None


class KeptJob:
    """A job the keeper runs or ran: its processes, output files, what the agent has read of
    them, and how it ended."""

    __slots__ = ("key", "dir", "processes", "files", "sizes", "read", "notified", "pgid", "done",
                 "kill_at", "started", "ended", "stopped", "adopted", "dropped", "error")

    def __init__(self, key: int, directory: str) -> None:
        self.key = key
        self.dir = directory
        self.processes: List[KeptProcess] = []
        #: (rank, stream) -> write fd of its file
        self.files: Dict[Tuple[int, str], int] = {}
        self.sizes: Dict[Tuple[int, str], int] = {}
        #: what the agent has read of each file
        self.read: Dict[Tuple[int, str], int] = {}
        #: files the agent has been told about and not read since
        self.notified: set = set()
        self.pgid: Optional[int] = None
        self.done = False
        self.kill_at: Optional[float] = None
        self.started = time.time()
        self.ended: Optional[float] = None
        self.stopped = False
        #: taken back from an earlier keeper: its files are appended to, never truncated
        self.adopted = False
        #: output the disk had no room for: (rank, stream) -> [bytes, lines, offset of the gap]
        self.dropped: Dict[Tuple[int, str], List[int]] = {}
        #: why the job ended as it did, when not by itself (a keeper that died while starting it)
        self.error: Optional[str] = None


def output_file(job: KeptJob, where: Tuple[int, str]) -> int:
    """The write end of a process's output file, made (with the job's directory) when the
    first output comes: most processes of a busy host write nothing to one stream or both,
    and a job that writes nothing has no directory."""
    fd = job.files.get(where)
    if fd is None:
        rank, stream = where
        path = os.path.join(job.dir, f"{rank}.{'out' if stream == 'stdout' else 'err'}")
        # a job taken back from an earlier keeper goes on where its files end
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if job.adopted else os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            try:
                os.mkdir(job.dir, mode=0o700)
            except FileExistsError:
                pass
            fd = os.open(path, flags, 0o600)
        job.files[where] = fd
    return fd


def add_troubles(described: dict, job: KeptJob) -> None:
    """What went wrong with a job, in its description or status: why it ended so, whose exit
    status is not known, how much output the disk had no room for."""
    if job.error is not None:
        described["error"] = job.error
    lost = {str(p.rank): p.lost for p in job.processes if p.lost is not None}
    if lost:
        described["lost_codes"] = lost
    if job.dropped:
        described["dropped"] = {f"{r}.{s}": list(value) for (r, s), value in job.dropped.items()}


def kill_group(pgid: Optional[int], sig: int) -> None:
    """Signal a process group, if the job has one and it is still there."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
