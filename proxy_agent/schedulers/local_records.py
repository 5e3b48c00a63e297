"""What the local backend keeps of a job: its record (:class:`LocalJob`), its output files
as they are read (:class:`OutputFile`), the launch the keeper is asked for (:class:`Launch`);
the local scheduler's state table and the limits its parts share."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import trio

from ..service.jobs import JobState, StateTable
from ..service.model import K
from .common import LineSplitter, signal_name, state_attrs

#: Most processes a local job may ask for.
MAX_PROCS = 1024
#: Name of the single queue.
QUEUE_NAME = "default"

#: The local backend's own state words, and what they mean.
STATE_TABLE = StateTable(
    "local",
    {
        "PENDING": JobState.QUEUING,
        "RUNNING": JobState.RUNNING,
        "STOPPED": JobState.SUSPENDED,
        "EXITED": JobState.FINISHED,
        "FAILED": JobState.FAILED,
        "NOT_STARTED": JobState.FAILED,
        "TERMINATED": JobState.KILLED,
        "LOST": JobState.FAILED,
    },
    not_given={
        JobState.PREPARING: "a local job's processes start as soon as it leaves the queue",
        JobState.HOLD: "the local scheduler holds no job",
        JobState.FINISHING: "a local job has ended once its last process has",
        JobState.DELETED: "the keeper records every local job's end (one it lost is FAILED, saying why)",
    },
)
PENDING_ATTRS = state_attrs(STATE_TABLE, "PENDING")
RUNNING_ATTRS = state_attrs(STATE_TABLE, "RUNNING")
STOPPED_ATTRS = state_attrs(STATE_TABLE, "STOPPED")
ENDED_STATES = frozenset(native for native, state in STATE_TABLE if state.final)

#: Bytes read from an output file at a time.
READ_CHUNK = 1 << 20
#: At most one notice a minute that the disk has no room for output.
DROP_NOTICE_EVERY = 60.0


class OutputFile:
    """One process's output file, read as the keeper writes it."""

    __slots__ = ("path", "fd", "offset", "splitter", "size", "dropped", "gaps")

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.fd: Optional[int] = None
        #: bytes read so far (the lines before it are complete or held in the splitter)
        self.offset = offset
        self.splitter = LineSplitter()
        #: what the keeper last said its size is
        self.size = offset
        #: output the disk had no room for, as the keeper last told: [bytes, lines]
        self.dropped = [0, 0]
        #: where in the file output was dropped, not yet told to the client: [offset, bytes, lines]
        self.gaps: List[List[int]] = []

    @property
    def consumed(self) -> int:
        """Where the text handed on so far ends: what may count as delivered."""
        return self.offset - self.splitter.pending_bytes

    def read(self, limit: int) -> Optional[bytes]:
        if self.fd is None:
            if self.size <= 0 and self.offset <= 0:
                # The keeper has told of no output here (it says when a file first grows,
                # before the process's end): it has made no file, nothing to look up.
                return None
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        data = os.pread(self.fd, limit, self.offset)
        self.offset += len(data)
        return data

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LocalJob:
    """A local job this agent follows (dropped once it has ended and its output is read)."""

    __slots__ = ("key", "process_keys", "files", "canceled", "suspended", "started", "pids", "codes",
                 "reported", "done", "finished", "start_error", "recorded", "spawn_line", "refused", "error", "lost",
                 "waiting")

    def __init__(self, key: int, process_keys: List[int], directory: str) -> None:
        self.key = key
        self.process_keys = process_keys
        count = len(process_keys)
        #: (rank, stream) -> its output file
        self.files: Dict[Tuple[int, str], OutputFile] = {
            (rank, stream): OutputFile(os.path.join(directory, str(key), f"{rank}.{'out' if stream == 'stdout' else 'err'}"))
            for rank in range(count) for stream in ("stdout", "stderr")
        }
        self.canceled = False
        self.suspended = False
        self.started = False
        self.pids: List[int] = []
        self.codes: List[Optional[int]] = [None] * count
        self.reported = [False] * count
        #: the keeper said every process has ended
        self.done = False
        #: set once the job's end is in the model
        self.finished = trio.Event()
        self.start_error: Optional[str] = None
        #: set when the keeper has recorded the job in its journal (or refused it)
        self.recorded = trio.Event()
        #: the spawn request, until the keeper recorded it (sent again to a keeper that
        #: replaced one that died before it recorded the job)
        self.spawn_line: Optional[bytes] = None
        #: why the keeper refused the job (it did not record it: nothing of it ran)
        self.refused: Optional[str] = None
        #: why the job ended as it did, when not by itself (the keeper says)
        self.error: Optional[str] = None
        #: rank -> why its exit status is not known
        self.lost: Dict[int, str] = {}
        #: while its submission is not answered: the keeper's news of it, held (None after)
        self.waiting: Optional[List[dict]] = None


class Launch:
    """A validated submission: what to run, where, with what."""

    __slots__ = ("path", "argv", "cwd", "env", "num_procs", "name")

    def __init__(self, path, argv, cwd, env, num_procs, name) -> None:
        self.path = path
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.num_procs = num_procs
        self.name = name


# --------------------------------------------------------------------------- helpers

#: JSON as the keeper reads it (compact)
compact_json = json.JSONEncoder(separators=(",", ":")).encode


def job_end_status(codes: List[Optional[int]]) -> Dict[str, str]:
    """How a job whose processes failed ended, as one process's would read: the highest exit
    status among them, else the signal that ended the first one killed (as ``srun`` reports)."""
    exited = [code for code in codes if code is not None and code > 0]
    if exited:
        return {K.EXIT_CODE: str(max(exited))}
    killed = [code for code in codes if code is not None and code < 0]
    return {K.SIGNAL: signal_name(-killed[0])} if killed else {}


def stopped_or_exited(pid: int) -> bool:
    """Has this process stopped (or exited)?  Read from /proc: it is the keeper's child."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            state = stat_file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("T", "t", "Z", "X")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1

