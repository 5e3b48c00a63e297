"""The SLURM backend: a cluster's nodes, partitions and jobs, kept current by polling.

What the model shows
--------------------
* One machine, the cluster (``ClusterName`` from ``scontrol show config``, else ``slurm``).
  Its ``state`` is UP when every node is up, ALERT when some are not, DOWN when none is,
  ERROR while SLURM's commands fail.
* Its nodes, with ``state`` mapped from SLURM's state (``slurm_parse.map_node_state``)
  and SLURM's own word in ``nativeState``, ``cpus``, ``cpusUsed``, ``memoryMB``,
  ``queues`` (its partitions) and ``reason``.
* One queue per partition: ``state`` NORMAL when the partition is UP, else STOPPED, with
  its limits (``maxTime`` and ``defaultTime`` in seconds, ``maxNodes``, ``default``,
  ``totalNodes``, ``totalSlots``).
* The user's jobs (everyone's with ``--all-users``), each under its partition's queue.
  ``state`` is the service's word for SLURM's state (:data:`STATE_TABLE`, every state and
  flag SLURM documents), ``nativeState`` SLURM's own, ``message`` SLURM's reason;
  ``nativeId``, ``hosts``, ``timeUsed`` and ``timeLimit`` (seconds), ``exitCode``,
  ``user``... Each job has one process (rank 0) carrying the followed output of jobs
  submitted here and, at the end, ``exitCode`` (128 + signal number when a signal ended it,
  as shells do) and ``signal``.

How it is kept current
----------------------
One ``squeue`` for all jobs per poll interval (every 0.5 s for ten seconds after a submit,
cancel, change or move), one node query per poll interval and the partitions every 30 s or
six intervals. :class:`JobTable` compares each listing with the previous one, so only jobs
whose record changed touch the model. ``slurmTimeUsed`` is refreshed with a job's other
changes and otherwise once a minute, so a cluster of running jobs does not turn every poll
into one JOB_CHANGE per job. A job that vanishes from the listing without a final state is
looked up once more (``scontrol show job`` while the controller remembers it, then ``sacct``
from the accounting database or the job-completion log) and reported COMPLETED; completed
jobs are removed from the model after ``retention`` seconds.

Every command runs from an argv list with a timeout; big outputs are parsed in a worker
thread. A failing or hanging command is logged, kept in :attr:`SlurmBackend.last_error`,
told to the clients through the backend context, and retried with exponential back-off; the
agent keeps serving meanwhile.

JSON or text
------------
Node, partition, single-job and ``sacct`` queries use ``--json`` where the installed SLURM
has it (``slurm_parse.json_support``) and fall back to the text formats for good once the
JSON query fails where the text query works. ``squeue`` uses the text format unless
``squeue_json=True``: up to 22.05 ``squeue --json`` ignores ``--user``/``--states`` and prints
about 2.7 KB per job (measured on 22.05.8), ten times the text listing, for every job of
every user, on every poll.

Submitting
----------
The batch script comes from :mod:`.batch` (every user value shell-quoted; options are argv
elements of ``sbatch --parsable``, the script goes on stdin). Output goes to
``~/.proxy-agent/slurm/<name>.<random>.out`` / ``.err`` unless the submission names output
files, and those files are followed while the job runs.  The agent's own files are removed
when the ended job is retired; any an earlier agent left there are removed after a week.
"""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import operator
import os
import re
import secrets
import time
from collections import deque
from contextlib import contextmanager
from typing import (
    Any, Awaitable, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple,
)

import attrs
import trio

from ..service.attributes import AttrInfo, ValueType
from ..service.jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, StateTable, SubmitError
from ..service.model import K, Kind, ServiceModel
from . import batch
from . import common
from . import slurm_parse as sp
from .base import Backend, BackendContext
from .slurm_parse import SlurmJob, SlurmNode, SlurmPartition

__all__ = [
    "CommandResult",
    "JobChanges",
    "JobTable",
    "STATE_TABLE",
    "SlurmBackend",
    "SlurmCommandError",
    "SlurmOptions",
    "clean_message",
    "job_attributes",
    "job_service_state",
    "node_attributes",
    "partition_attributes",
    "process_attributes",
    "run_command",
]

log = logging.getLogger("proxy_agent.schedulers.slurm")


def _state_key(raw: str) -> str:
    """SLURM's state text -> the table's key: the long name that decides the meaning.

    Accepts long names, squeue's compact codes, flag combinations from newer JSON
    (``COMPLETED+COMPLETING``, ``PENDING+REQUEUE_HOLD``) and sacct's ``CANCELLED by 0``.  A
    flag that changes the meaning wins over the base state: COMPLETING (processes still
    end), the hold flags, STAGE_OUT, CONFIGURING, SIGNALING, RESIZING, REQUEUED, STOPPED.
    """
    words = raw.strip().split()
    if not words:
        return ""
    names = [sp.JOB_STATE_CODES.get(token, token) for token in words[0].upper().split("+")]
    for flag in _FLAG_PRECEDENCE:
        if flag in names:
            return flag
    return names[0]


_FLAG_PRECEDENCE = (
    "COMPLETING", "STAGE_OUT", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT", "REQUEUE_FED",
    "REQUEUED", "CONFIGURING", "SIGNALING", "RESIZING", "STOPPED", "REVOKED",
)

#: Every job state and state flag SLURM documents, mapped into the service's states.
STATE_TABLE = StateTable(
    "slurm",
    {
        "PENDING": JobState.QUEUING,
        "CONFIGURING": JobState.PREPARING,
        "REQUEUED": JobState.QUEUING,
        "REQUEUE_FED": JobState.QUEUING,
        "REQUEUE_HOLD": JobState.HOLD,
        "RESV_DEL_HOLD": JobState.HOLD,
        "SPECIAL_EXIT": JobState.HOLD,
        "RUNNING": JobState.RUNNING,
        "RESIZING": JobState.RUNNING,
        "SIGNALING": JobState.RUNNING,
        "POWER_UP_NODE": JobState.PREPARING,
        "LAUNCH_FAILED": JobState.FAILED,
        "UPDATE_DB": JobState.FINISHING,
        "RECONFIG_FAIL": JobState.FAILED,
        "COMPLETING": JobState.FINISHING,
        "STAGE_OUT": JobState.FINISHING,
        "SUSPENDED": JobState.SUSPENDED,
        "STOPPED": JobState.SUSPENDED,
        "COMPLETED": JobState.FINISHED,
        "FAILED": JobState.FAILED,
        "CANCELLED": JobState.KILLED,
        "PREEMPTED": JobState.KILLED,
        "TIMEOUT": JobState.FAILED,
        "NODE_FAIL": JobState.FAILED,
        "OUT_OF_MEMORY": JobState.FAILED,
        "BOOT_FAIL": JobState.FAILED,
        "DEADLINE": JobState.FAILED,
        "REVOKED": JobState.DELETED,
    },
    normalize=_state_key,
)

_ACTIVE_STATES = frozenset({JobState.RUNNING, JobState.SUSPENDED, JobState.FINISHING})


def job_state(raw: str) -> JobState:
    return STATE_TABLE.map(raw)


def native_word(raw: str) -> str:
    """SLURM's state as one upper-case long name (``CD`` -> ``COMPLETED``)."""
    key = _state_key(raw)
    return key or "UNKNOWN"


def _info(name: str, type_: ValueType, label: str, description: str, **more: Any) -> AttrInfo:
    return AttrInfo(name, type_, label, description, **more)


#: Settings of a SLURM submission beyond the common ones (their names in the service).
PARTITION = "partition"
NODES = "nodes"
CPUS_PER_TASK = "cpusPerTask"
MEMORY = "memory"
BEGIN_TIME = "beginTime"
STDOUT_PATH = "stdoutPath"
STDERR_PATH = "stderrPath"

#: Attributes the backend shows on machines, nodes, queues and jobs.
DISPLAY_ATTRIBUTES: Tuple[AttrInfo, ...] = (
    _info(K.VERSION, ValueType.STRING, "Version", "Version of the scheduler installation"),
    _info(K.NATIVE_STATE, ValueType.STRING, "Native State",
          "The element's state in the scheduler's own words (IDLE, MIXED+DRAIN, PENDING...)"),
    _info(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
    _info(K.CPUS_USED, ValueType.INTEGER, "CPUs Allocated", "CPUs of the node allocated to jobs", default="0"),
    _info(K.MEMORY, ValueType.INTEGER, "Memory (MB)", "Memory the node has, in megabytes", default="0"),
    _info(K.QUEUES, ValueType.STRING, "Partitions", "Partitions the node belongs to, comma-separated"),
    _info(K.REASON, ValueType.STRING, "Reason", "Why the node is down, drained or failing"),
    _info(K.DEFAULT, ValueType.BOOLEAN, "Default Queue", "Whether jobs that name no queue go here", default="false"),
    _info(K.MAX_TIME, ValueType.INTEGER, "Maximum Time (s)",
          "Longest time limit a job of the queue may have, in seconds (absent: unlimited)", default="0"),
    _info(K.DEFAULT_TIME, ValueType.INTEGER, "Default Time (s)",
          "Time limit of a job of the queue that sets none, in seconds", default="0"),
    _info(K.MAX_NODES, ValueType.INTEGER, "Maximum Nodes",
          "Most nodes one job of the queue may use (absent: unlimited)", default="0"),
    _info(K.TOTAL_NODES, ValueType.INTEGER, "Total Nodes", "Nodes in the queue", default="0"),
    _info(K.TOTAL_SLOTS, ValueType.INTEGER, "Total Slots", "Processor slots (CPUs) in the queue", default="0"),
    _info(K.HOSTS, ValueType.STRING, "Hosts", "Nodes of the queue, or nodes the job runs on, in SLURM's notation"),
    _info(K.NATIVE_ID, ValueType.STRING, "Native Job ID", "The job's id in its scheduler (for squeue, scontrol...)"),
    _info(K.NUM_NODES, ValueType.INTEGER, "Nodes", "Nodes the job uses or asked for", default="0"),
    _info(K.NUM_CPUS, ValueType.INTEGER, "CPUs Used", "CPUs the job uses or asked for", default="0"),
    _info(K.TIME_USED, ValueType.INTEGER, "Time Used (s)",
          "Run time so far in seconds (refreshed at least once a minute)", default="0"),
    _info(K.TIME_LIMIT, ValueType.INTEGER, "Time Limit (s)", "The job's time limit in seconds", default="0"),
    _info(K.ACCOUNT, ValueType.STRING, "Account", "Account the job is charged to"),
    _info(K.EXIT_CODE, ValueType.INTEGER, "Exit Code", "How the job or process ended", default="0"),
)

#: Submission settings other than the partition (whose legal values come from the cluster).
SUBMIT_ATTRIBUTES: Tuple[AttrInfo, ...] = (
    _info(K.ACCOUNT, ValueType.STRING, "Account",
          "Account the job is charged to (sbatch --account); empty: your default", settable=True),
    _info(K.TIME_LIMIT, ValueType.STRING, "Time Limit",
          "Time limit (sbatch --time): minutes, or [D-]HH:MM:SS; empty: the partition's default", settable=True),
    _info(NODES, ValueType.INTEGER, "Nodes", "Nodes to run on (sbatch --nodes); 0 lets SLURM decide",
          default="0", minimum="0", settable=True),
    _info(CPUS_PER_TASK, ValueType.INTEGER, "CPUs per Task", "CPUs for each process (sbatch --cpus-per-task)",
          default="1", minimum="1", settable=True),
    _info(MEMORY, ValueType.STRING, "Memory",
          "Memory per node (sbatch --mem): megabytes, or 500M, 4G; empty: the partition's default", settable=True),
    _info(K.HOLD, ValueType.BOOLEAN, "Hold",
          "Submit the job held (sbatch --hold); hold and release act on a pending job", default="false",
          settable=True),
    _info(BEGIN_TIME, ValueType.STRING, "Begin Time",
          "Do not start before this time (sbatch --begin): 2030-01-31T10:00, now+1hour, tomorrow...",
          settable=True),
    _info(STDOUT_PATH, ValueType.STRING, "Standard Output File",
          "Where the job's standard output goes (sbatch --output, %j is the job id); "
          "empty: a file in ~/.proxy-agent/slurm that the agent follows", settable=True),
    _info(STDERR_PATH, ValueType.STRING, "Standard Error File",
          "Where the job's standard error goes (sbatch --error); empty: next to the standard output",
          settable=True),
)


# --------------------------------------------------------------------------------------------
# Pure mapping: SLURM records -> model attributes
# --------------------------------------------------------------------------------------------


def _text(n: Optional[int]) -> str:
    return "" if n is None else str(n)


#: SLURM's "no value" marker for a 32-bit count (and "infinite" above it).
_NO_VALUE = 0xFFFFFFFE


def _task_count(n: Optional[int]) -> str:
    """A job's process count.  The job always has its process 0, so there always is one: 1
    while SLURM has none (a pending job without --ntasks lists N/A or its "no value" marker
    4294967294), so that rank 0 is within it."""
    return str(n) if n and 0 < n < _NO_VALUE else "1"


def _seconds(duration: str) -> str:
    """SLURM duration text as seconds (``""`` for none or unlimited)."""
    if not duration:
        return ""
    seconds = sp.duration_seconds(duration)
    return "" if seconds is None else str(seconds)


def split_exit_code(text: str) -> Tuple[Optional[int], int]:
    """``"3:0"`` -> (3, 0), ``"0:9"`` -> (0, 9), anything else -> (None, 0)."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None, 0
    return int(code), int(sig) if sig.isdigit() else 0


def _exit_attrs(exit_code: str) -> Dict[str, str]:
    code, sig = split_exit_code(exit_code)
    if code is None:
        return {}
    out = {K.EXIT_CODE: str(128 + sig if sig else code)}
    if sig:
        out[K.SIGNAL] = common.signal_name(sig)
    return out


#: SLURM's reasons for a pending job that waits to be released, not for resources.
_HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})


def job_service_state(job: SlurmJob) -> JobState:
    """The service state of a job's record: SLURM lists a held job as PENDING and says why
    in its reason, so a pending job held by its user or an administrator is HOLD."""
    state = job_state(job.state)
    if state is JobState.QUEUING and job.reason in _HELD_REASONS:
        return JobState.HOLD
    return state


def job_attributes(job: SlurmJob) -> Dict[str, str]:
    """A job's model attributes (every key, empty when SLURM has no value; no time used)."""
    state = job_service_state(job)
    attrs_ = {
        K.NAME: job.name,
        K.STATE: state.value,
        K.NATIVE_STATE: native_word(job.state),
        K.MESSAGE: sp.job_message(job.reason, pending=state in (JobState.QUEUING, JobState.HOLD)),
        K.USER: job.user,
        K.NATIVE_ID: job.job_id,
        K.ACCOUNT: job.account,
        K.HOSTS: job.nodes,
        K.NUM_NODES: _text(job.num_nodes),
        K.NUM_CPUS: _text(job.num_cpus),
        K.NUM_PROCS: _task_count(job.num_tasks),
        K.TIME_LIMIT: _seconds(job.time_limit),
        K.WORKING_DIR: job.work_dir,
        K.EXIT_CODE: "",
        K.SIGNAL: "",
    }
    if state.final:
        attrs_.update(_exit_attrs(job.exit_code))
    return attrs_


#: The SlurmJob fields job_attributes() reads: a listing record whose key is unchanged
#: changes nothing in the model (time used is refreshed separately).
_JOB_KEY = operator.attrgetter(
    "state", "reason", "nodes", "partition", "exit_code", "name", "num_nodes", "num_cpus",
    "num_tasks", "time_limit", "user", "account", "work_dir",
)


def process_attributes(job: SlurmJob, node_id: Optional[int] = None) -> Dict[str, Any]:
    """The attributes of a job's process 0 that follow from the job's record."""
    state = job_service_state(job)
    out: Dict[str, Any] = {K.STATE: state.value, K.NATIVE_STATE: native_word(job.state)}
    if node_id is not None:
        out[K.NODE] = node_id
    if state.final:
        out.update(_exit_attrs(job.exit_code))
    return out


def node_attributes(node: SlurmNode) -> Dict[str, str]:
    """A node's model attributes (every key; the node number is the caller's)."""
    state, raw = sp.map_node_state(node.state)
    return {
        K.NAME: node.name,
        K.STATE: state,
        K.NATIVE_STATE: raw,
        K.CPUS: _text(node.cpus),
        K.CPUS_USED: _text(node.alloc_cpus),
        K.MEMORY: _text(node.memory_mb),
        K.QUEUES: ",".join(node.partitions),
        K.REASON: node.reason,
    }


def partition_attributes(part: SlurmPartition) -> Dict[str, str]:
    """A partition's queue attributes (every key)."""
    state, raw = sp.map_partition_state(part.state)
    return {
        K.NAME: part.name,
        K.STATE: state,
        K.NATIVE_STATE: raw,
        K.DEFAULT: "true" if part.is_default else "false",
        K.MAX_TIME: _seconds(part.max_time),
        K.DEFAULT_TIME: _seconds(part.default_time),
        K.MAX_NODES: "" if part.max_nodes is None else str(part.max_nodes),
        K.TOTAL_NODES: _text(part.total_nodes),
        K.TOTAL_SLOTS: _text(part.total_cpus),
        K.HOSTS: part.nodes,
    }


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: ``node[003-005,9]`` -> ``node003``,
    ``rack[1-2]-n[1-4],x`` -> ``rack1-n1``."""
    host: List[str] = []
    i, end = 0, len(nodelist)
    while i < end:
        char = nodelist[i]
        if char == ",":
            break
        if char == "[":
            close = nodelist.find("]", i)
            if close < 0:
                break
            host.append(nodelist[i + 1:close].split(",", 1)[0].split("-", 1)[0])
            i = close + 1
            continue
        host.append(char)
        i += 1
    return "".join(host)


# --------------------------------------------------------------------------------------------
# The diff of job listings
# --------------------------------------------------------------------------------------------


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around bulk work.

    A big listing makes ~100,000 key tuples, records and model rows, none in a cycle; the
    collections their allocation would trigger scan the whole heap for nothing and can
    double the time taken. Collection resumes, if it was on, at the end.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@attrs.frozen
class JobChanges:
    """What one listing changed: new jobs, changed ones as (previous, current) and the ids
    of jobs no longer listed. ``previous`` is None for a job announced with
    :meth:`JobTable.expect` and listed for the first time."""

    added: List[SlurmJob]
    changed: List[Tuple[Optional[SlurmJob], SlurmJob]]
    gone: List[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.gone)


class JobTable:
    """SLURM's job listing as last seen, and what each new listing changes. Pure: no I/O.

    * :meth:`apply` takes a full listing and returns :class:`JobChanges`; a record counts
      as changed only when a field the model shows differs (``_JOB_KEY``), so the running
      clock of a job does not make it a change.
    * :meth:`expect` announces a job that was just submitted: a listing that started before
      the submission may lack it, so it is not reported gone by listings of an earlier
      ``generation`` than the one it was announced in.
    * Jobs reported gone leave the table (``expect`` them again to hear of them once more).
    * :meth:`retire` forgets a job whose element is gone from the model; while SLURM keeps
      listing it (finished jobs stay for MinJobAge) it is not reported as new again.
    """

    __slots__ = ("_records", "_keys", "_expected", "_retired")

    def __init__(self) -> None:
        self._records: Dict[str, Optional[SlurmJob]] = {}
        self._keys: Dict[str, Optional[tuple]] = {}
        self._expected: Dict[str, int] = {}
        self._retired: Set[str] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._keys

    def record(self, job_id: str) -> Optional[SlurmJob]:
        """The latest listed record of a job (None if never listed or not tracked)."""
        return self._records.get(job_id)

    def expect(self, job_id: str, generation: int = 0) -> None:
        if job_id in self._keys:
            return
        self._retired.discard(job_id)
        self._keys[job_id] = None
        self._records[job_id] = None
        self._expected[job_id] = generation

    def discard(self, job_id: str) -> None:
        self._keys.pop(job_id, None)
        self._records.pop(job_id, None)
        self._expected.pop(job_id, None)

    def retire(self, job_id: str) -> None:
        self.discard(job_id)
        self._retired.add(job_id)

    def apply(self, jobs: Iterable[SlurmJob], generation: int = 0) -> JobChanges:
        """Take a complete listing (made by a query started in ``generation``)."""
        with gc_paused():
            return self._apply(jobs, generation)

    def _apply(self, jobs: Iterable[SlurmJob], generation: int) -> JobChanges:
        keys = self._keys
        records = self._records
        retired = self._retired
        key_of = _JOB_KEY
        missing = _MISSING
        added: List[SlurmJob] = []
        changed: List[Tuple[Optional[SlurmJob], SlurmJob]] = []
        seen: Set[str] = set()
        see = seen.add
        for job in jobs:
            job_id = job.job_id
            see(job_id)
            key = key_of(job)
            old = keys.get(job_id, missing)
            if old is missing:
                if retired and job_id in retired:
                    continue
                added.append(job)
            elif old != key:
                changed.append((records[job_id], job))
            keys[job_id] = key
            records[job_id] = job
        expected = self._expected
        if expected:
            for job_id in [j for j in expected if j in seen]:
                del expected[job_id]
        if len(seen) == len(keys):
            gone: List[str] = []  # every tracked job was listed
        else:
            gone = [
                job_id for job_id in keys
                if job_id not in seen and not (job_id in expected and expected[job_id] >= generation)
            ]
            for job_id in gone:
                del keys[job_id], records[job_id]
                expected.pop(job_id, None)
        if retired:
            self._retired = {job_id for job_id in retired if job_id in seen}
        return JobChanges(added, changed, gone)


_MISSING: Any = object()


# --------------------------------------------------------------------------------------------
# Output files
# --------------------------------------------------------------------------------------------


_READ_CHUNK = 1 << 18


def _read_new(path: str, offset: int, stale: Optional[tuple]) -> Tuple[Optional[tuple], int, bytes]:
    """(signature of the file or None if missing, its size, bytes from ``offset``).

    Nothing is read while the file still has the ``stale`` signature it had before the job
    started (a file left by an earlier run under the same name).
    """
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            sig = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
            if stale is not None and sig == stale:
                return sig, st.st_size, b""
            if st.st_size <= offset:
                return sig, st.st_size, b""
            f.seek(offset)
            return sig, st.st_size, f.read(_READ_CHUNK)
    except OSError:
        return None, 0, b""


def _file_signature(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


_PATTERN = re.compile(r"%(\d*)([%a-zA-Z])")


def expand_output_pattern(path: str, job_id: str, job_name: str, user: str) -> Optional[str]:
    """SLURM's file name pattern with what is known at submission, or None if it needs more
    (``%N`` node name, ``%t`` task...). A backslash turns patterns off, as in SLURM."""
    if "\\" in path:
        return path.replace("\\", "")
    values = {"j": job_id, "A": job_id, "x": job_name, "u": user, "a": "4294967294", "J": job_id}
    unknown = False

    def sub(match: "re.Match[str]") -> str:
        nonlocal unknown
        width, letter = match.group(1), match.group(2)
        if letter == "%":
            return "%"
        value = values.get(letter)
        if value is None:
            unknown = True
            return match.group(0)
        return value.zfill(int(width)) if width and value.isdigit() else value

    expanded = _PATTERN.sub(sub, path)
    return None if unknown else expanded


# --------------------------------------------------------------------------------------------
# Running SLURM's commands
# --------------------------------------------------------------------------------------------


@attrs.frozen
class CommandResult:
    argv: Tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes


#: Runs one command: (argv, stdin bytes or None, env or None) -> CommandResult.  Raises
#: OSError when it cannot start.  Timeouts are applied around it by the scheduler.
Runner = Callable[[Sequence[str], Optional[bytes], Optional[Mapping[str, str]]], Awaitable[CommandResult]]


async def run_command(argv: Sequence[str], stdin: Optional[bytes] = None,
                      env: Optional[Mapping[str, str]] = None) -> CommandResult:
    """Run argv (never through a shell), stdin given or empty, stdout/stderr captured.

    The child never inherits the agent's stdin: in stdio mode that is the protocol stream.
    """
    process = await trio.run_process(
        list(argv),
        stdin=stdin if stdin is not None else b"",
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )
    return CommandResult(tuple(argv), process.returncode, process.stdout, process.stderr)


class SlurmCommandError(ServiceError):
    """A SLURM command failed, hung or could not be started; ``message`` is SLURM's words."""

    def __init__(
        self, argv: Sequence[str], message: str, returncode: Optional[int] = None, timed_out: bool = False
    ) -> None:
        super().__init__(message, ErrorKind.UNAVAILABLE)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.timed_out = timed_out


_MESSAGE_PREFIX = re.compile(
    r"^(?:(?:sbatch|squeue|sinfo|scontrol|scancel|sacct|srun|salloc|sacctmgr): )?(?:(?:error|fatal): )?"
)


def clean_message(stderr: str, limit: int = 600) -> str:
    """A command's stderr as one line for the client: ``sbatch: error:`` prefixes dropped,
    blank and repeated lines skipped, lines joined with ``"; "``, at most ``limit`` chars."""
    lines: List[str] = []
    for line in stderr.splitlines():
        line = _MESSAGE_PREFIX.sub("", line.strip(), count=1).strip()
        if line and line not in lines:
            lines.append(line)
    text = "; ".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# The scheduler
# --------------------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Job:
    """A job in the model: its SLURM id, its element, its process and its queue."""

    slurm_id: str
    element: int
    process: int
    queue: int
    sub_id: Optional[str] = None
    completed: bool = False
    retire_at: Optional[float] = None
    gone_polls: int = 0
    node: Optional[int] = None
    #: for jobs whose output is followed: set when it first runs / when it has completed
    started: Optional[trio.Event] = None
    done: Optional[trio.Event] = None
    #: output files the agent chose itself (in its spool directory): deleted with the job
    spool_files: Tuple[str, ...] = ()
    #: output files still being followed; while any is, a final state waits in ``held``
    followers: int = 0
    #: the final state's attributes (job, process), shown once all output is delivered
    held: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None
    #: the output files followed, by stream (kept in the job store for a later agent)
    outputs: Dict[str, str] = attrs.Factory(dict)


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


#: Attributes of a job's end, held back while its output is still being delivered.
_FINAL_KEYS = (K.STATE, K.NATIVE_STATE, K.EXIT_CODE, K.SIGNAL, K.MESSAGE)


def _has_started(state: Any) -> bool:
    """A job whose ``state`` attribute says its processes have begun (or ended)."""
    if not isinstance(state, str):
        return False
    try:
        parsed = JobState(state)
    except ValueError:
        return False
    return parsed.started or parsed.final or parsed is JobState.FINISHING


def _is_state(state: str) -> bool:
    try:
        JobState(state)
    except ValueError:
        return False
    return True


def _is_final(state: str) -> bool:
    return _is_state(state) and JobState(state).final


def _slurm_duration(seconds: int) -> str:
    """Seconds in sbatch's ``[D-]HH:MM:SS``."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text
# trio 0.23 renamed to_thread.run_sync's "cancellable" to "abandon_on_cancel".
_ABANDON = (
    "abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
    else "cancellable"
)


@attrs.frozen
class SlurmOptions:
    #: seconds between two polls of the cluster
    poll_interval: float = 5.0


class SlurmBackend(Backend):
    """A SLURM cluster (see the module documentation)."""

    name = "slurm"
    summary = "a SLURM cluster (squeue, sinfo, sbatch, scancel, scontrol, sacct)"

    #: Jobs looked up one by one with scontrol when they vanish (the rest go to one sacct).
    MAX_SCONTROL_LOOKUPS = 20
    #: Polls a vanished job may wait for a final state while lookups fail.
    MAX_GONE_POLLS = 3

    def __init__(
        self,
        model: ServiceModel,
        options: Optional[SlurmOptions] = None,
        context: Optional[BackendContext] = None,
        *,
        retention: float = 60.0,
        command_timeout: float = 30.0,
        fast_poll_interval: float = 0.5,
        fast_poll_duration: float = 10.0,
        partition_interval: Optional[float] = None,
        time_used_interval: float = 60.0,
        output_interval: float = 0.5,
        output_drain_grace: float = 1.0,
        max_backoff: float = 60.0,
        spool_dir: Optional[str] = None,
        prefer_json: bool = True,
        squeue_json: bool = False,
        parse_in_thread_above: int = 256 * 1024,
        parse_timeout: float = 60.0,
        user: Optional[str] = None,
        runner: Optional[Runner] = None,
    ) -> None:
        super().__init__(model, options, context)
        self.poll_interval = max(0.1, float(self.options.poll_interval))
        self.all_users = self.context.all_users
        self.retention = retention
        self.command_timeout = command_timeout
        self.fast_poll_interval = min(fast_poll_interval, self.poll_interval)
        self.fast_poll_duration = fast_poll_duration
        self.partition_interval = (
            partition_interval if partition_interval is not None else max(30.0, 6 * self.poll_interval)
        )
        self.time_used_interval = time_used_interval
        self.output_interval = output_interval
        self.output_drain_grace = output_drain_grace
        self.max_backoff = max(max_backoff, self.poll_interval)
        self.spool_dir = spool_dir or os.path.join(os.path.expanduser("~"), ".proxy-agent", "slurm")
        #: output files in the spool directory older than this, and followed by no job, are removed
        self.spool_max_age = common.SPOOL_MAX_AGE
        self.prefer_json = prefer_json
        self.squeue_json = squeue_json
        self.parse_in_thread_above = parse_in_thread_above
        self.parse_timeout = parse_timeout
        self.user = user or common.current_user()
        self._runner: Runner = runner or run_command

        #: the last failure of a SLURM query (None while they work), for the agent to show
        self.last_error: Optional[str] = None

        self.version: Optional[Tuple[int, int, int]] = None
        self.version_text = ""
        self.config: Dict[str, str] = {}
        self.cluster_name = "slurm"
        self._json: Dict[str, bool] = {}
        self._sacct_mode: Optional[str] = None  # "accounting", "completion" or None

        self._machine: Optional[int] = None
        self._queues: Dict[str, int] = {}
        self._partitions: Dict[str, SlurmPartition] = {}
        self._default_partition: Optional[str] = None
        self._partitions_stale = False
        self._nodes: Dict[str, Tuple[int, SlurmNode]] = {}
        self._node_numbers: Dict[str, int] = {}
        self._table = JobTable()
        self._jobs: Dict[str, _Job] = {}
        self._by_element: Dict[int, _Job] = {}
        self._retire: Deque[Tuple[float, str]] = deque()
        self._generation = 0
        self._failures = 0
        self._failing = False
        self._reported_error: Optional[str] = None
        self._wake = trio.Event()
        self._fast_until = 0.0
        self._nursery: Optional[trio.Nursery] = None
        self._query_env = dict(os.environ, SLURM_TIME_FORMAT="standard")

    # ------------------------------------------------------------------ options

    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group("SLURM (slurm)")
        group.add_argument("--slurm-poll-interval", "--poll-interval", dest="slurm_poll_interval", type=float,
                           default=5.0, metavar="SECONDS",
                           help="seconds between two polls of the cluster (default: %(default)s)")

    @classmethod
    def options_from_args(cls, args) -> SlurmOptions:
        interval = getattr(args, "slurm_poll_interval", 5.0)
        if not 0.1 <= interval <= 3600:
            raise ValueError(f"--slurm-poll-interval must be between 0.1 and 3600 seconds, got {interval:g}")
        return SlurmOptions(poll_interval=interval)

    @classmethod
    def default_options(cls) -> SlurmOptions:
        return SlurmOptions()

    # ------------------------------------------------------------------ definitions

    def attributes(self) -> List[AttrInfo]:
        return [*DISPLAY_ATTRIBUTES, self._partition_attribute(), *SUBMIT_ATTRIBUTES]

    def default_queue(self) -> Optional[int]:
        if self._default_partition is None:
            return None
        return self._queues.get(self._default_partition)

    def _partition_attribute(self) -> AttrInfo:
        description = "Partition to submit to (sbatch --partition); a queue names one too"
        names = tuple(name for name in self._partitions if name)
        if not names:
            return _info(PARTITION, ValueType.STRING, "Partition", description, settable=True)
        default = self._default_partition if self._default_partition in names else names[0]
        return _info(PARTITION, ValueType.ENUMERATED, "Partition", description, default=default,
                     choices=names, settable=True)

    # ------------------------------------------------------------------ commands

    async def _command(
        self,
        argv: Sequence[str],
        *,
        stdin: Optional[bytes] = None,
        check: bool = True,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> CommandResult:
        limit = self.command_timeout if timeout is None else timeout
        shown = " ".join(argv[:3])
        try:
            with trio.fail_after(limit):
                result = await self._runner(argv, stdin, env if env is not None else self._query_env)
        except trio.TooSlowError:
            raise SlurmCommandError(argv, f"{shown} did not finish within {limit:g} s", timed_out=True) from None
        except FileNotFoundError:
            raise SlurmCommandError(argv, f"{argv[0]}: command not found (is SLURM installed and on PATH?)") from None
        except OSError as exc:
            raise SlurmCommandError(argv, f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        if check and result.returncode != 0:
            text = clean_message(result.stderr.decode("utf-8", "replace"))
            raise SlurmCommandError(
                argv, text or f"{shown} failed with exit status {result.returncode}", result.returncode
            )
        return result

    async def _parse(self, parser: Callable[[str], Any], data: bytes, what: str) -> Any:
        """Parse a command's output; a large one in a worker thread, bounded in time."""

        def work() -> Any:
            return parser(data.decode("utf-8", "replace"))

        if len(data) <= self.parse_in_thread_above:
            return work()
        try:
            with trio.fail_after(self.parse_timeout):
                return await trio.to_thread.run_sync(work, **{_ABANDON: True})
        except trio.TooSlowError:
            raise SlurmCommandError((what,), f"parsing the output of {what} took more than {self.parse_timeout:g} s") from None

    async def _query(
        self,
        kind: str,
        text_argv: Sequence[str],
        text_parser: Callable[[str], Any],
        json_argv: Optional[Sequence[str]] = None,
        json_parser: Optional[Callable[[str], Any]] = None,
    ) -> Any:
        """Run one query in JSON if this SLURM has it for ``kind``, else (or if JSON turns out
        not to work while text does) in text."""
        if json_argv is not None and json_parser is not None and self._json.get(kind):
            try:
                result = await self._command(json_argv)
                return await self._parse(json_parser, result.stdout, " ".join(json_argv[:3]))
            except (SlurmCommandError, sp.SlurmError) as exc:
                json_error = exc
            result = await self._command(text_argv)  # raises if SLURM itself is failing
            parsed = await self._parse(text_parser, result.stdout, " ".join(text_argv[:3]))
            log.warning("%s --json does not work here (%s); using the text format from now on",
                        " ".join(json_argv[:3]), json_error)
            self._json[kind] = False
            return parsed
        result = await self._command(text_argv)
        return await self._parse(text_parser, result.stdout, " ".join(text_argv[:3]))

    # ------------------------------------------------------------------ life cycle

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        try:
            result = await self._command(sp.version_argv())
            text = result.stdout.decode("utf-8", "replace").strip()
            self.version = sp.parse_version(text)
            self.version_text = text.split()[-1] if text else ""
        except (SlurmCommandError, sp.SlurmError) as exc:
            raise ServiceError(f"cannot use SLURM on this machine: {exc}", ErrorKind.UNAVAILABLE) from None
        support = sp.json_support(self.version if self.prefer_json else None)
        self._json = {
            "nodes": support["nodes"],
            "partitions": support["partitions"],
            "job": support["job"],
            "squeue": support["squeue"] and self.squeue_json,
            "sacct": False,  # decided with the configuration: needs slurmdbd
        }
        log.info("SLURM %s; JSON for %s", self.version_text,
                 ", ".join(k for k, v in self._json.items() if v) or "nothing")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            errors = await self._poll(nodes=True, partitions=True)
            self._report(errors)
            task_status.started()
            nursery.start_soon(self._sweep_spool_loop)
            await self._poll_loop()

    async def _sweep_spool_loop(self) -> None:
        """Now and then, remove old output files of jobs no agent follows any more."""
        while True:
            keep = {path for tracked in self._jobs.values() for path in tracked.spool_files}
            for path in common.sweep_spool(self.spool_dir, keep, self.spool_max_age):
                log.info("removed old output file %s", path)
            await trio.sleep(3600)

    async def aclose(self) -> None:
        # Jobs stay with SLURM; only our polling and output followers stop.
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _poke(self) -> None:
        """Poll now and often for a while (after a submit, cancel, change or move)."""
        self._fast_until = trio.current_time() + self.fast_poll_duration
        self._wake.set()

    async def _poll_loop(self) -> None:
        now = trio.current_time()
        next_nodes = now + self.poll_interval
        next_partitions = now + self.partition_interval
        next_time_used = now + self.time_used_interval
        while True:
            if self._failures:
                delay = min(self.poll_interval * 2 ** (self._failures - 1), self.max_backoff)
            elif trio.current_time() < self._fast_until:
                delay = self.fast_poll_interval
            else:
                delay = self.poll_interval
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            nodes = now >= next_nodes
            partitions = now >= next_partitions or self._partitions_stale
            try:
                errors = await self._poll(nodes=nodes, partitions=partitions)
                now = trio.current_time()
                if now >= next_time_used:
                    self._refresh_time_used()
                    next_time_used = now + self.time_used_interval
                self._retire_due()
            except Exception as exc:  # noqa: BLE001 - a bug in one poll must not end the agent
                log.exception("polling SLURM failed")
                errors = [SlurmCommandError((), f"internal error while polling: {type(exc).__name__}: {exc}")]
            self._report(errors)
            now = trio.current_time()
            if nodes:
                next_nodes = now + self.poll_interval
            if partitions:
                next_partitions = now + self.partition_interval

    async def _poll(self, *, nodes: bool, partitions: bool) -> List[SlurmCommandError]:
        """One round of queries, run side by side (a hanging controller costs one timeout,
        not one per query), then applied in order: partitions, nodes, jobs."""
        results: Dict[str, Any] = {}
        errors: Dict[str, SlurmCommandError] = {}

        async def fetch(what: str, query: Callable[[], Awaitable[Any]]) -> None:
            try:
                results[what] = await query()
            except SlurmCommandError as exc:
                errors[what] = exc
            except sp.SlurmError as exc:
                errors[what] = SlurmCommandError((), f"unreadable SLURM output: {exc}")

        self._generation += 1  # the squeue below starts in this generation
        generation = self._generation
        async with trio.open_nursery() as nursery:
            if not self.config:
                nursery.start_soon(fetch, "config", self._fetch_config)
            if partitions:
                nursery.start_soon(fetch, "partitions", self._fetch_partitions)
            if nodes:
                nursery.start_soon(fetch, "nodes", self._fetch_nodes)
            nursery.start_soon(fetch, "jobs", self._fetch_jobs)
        if "config" in results:
            self._apply_config(results["config"])
        if self._machine is None:
            self._add_machine()
        if "partitions" in results:
            self._apply_partitions(results["partitions"])
        if "nodes" in results:
            self._apply_nodes(results["nodes"])
        if "jobs" in results:
            await fetch("final states", functools.partial(self._apply_listing, results["jobs"], generation))
        self._failing = bool(errors)
        self._update_machine()
        order = ("partitions", "nodes", "jobs", "final states", "config")
        return [errors[what] for what in order if what in errors]

    def _report(self, errors: List[SlurmCommandError]) -> None:
        if errors:
            self._failures += 1
            text = "; ".join(dict.fromkeys(e.message for e in errors))
            self.last_error = text
            delay = min(self.poll_interval * 2 ** (self._failures - 1), self.max_backoff)
            if text != self._reported_error:
                self._reported_error = text
                log.warning("SLURM query failed (retrying in %g s): %s", delay, text)
                self._message("ERROR", f"SLURM query failed (retrying): {text}")
            else:
                log.debug("SLURM query failed again (attempt %d, retrying in %g s): %s", self._failures, delay, text)
        elif self._failures:
            log.info("SLURM answers again after %d failed polls", self._failures)
            self._message("INFO", "SLURM answers again")
            self._failures = 0
            self.last_error = None
            self._reported_error = None

    def _message(self, level: str, text: str) -> None:
        try:
            self.context.notify(level, text)
        except Exception:  # noqa: BLE001 - reporting must not break polling
            log.exception("a notice could not be delivered")

    # ------------------------------------------------------------------ machine and config

    async def _fetch_config(self) -> Dict[str, str]:
        result = await self._command(sp.config_argv())
        config = sp.parse_scontrol_config(result.stdout.decode("utf-8", "replace"))
        if not config:
            raise sp.SlurmError("scontrol show config printed no settings")
        return config

    def _apply_config(self, config: Dict[str, str]) -> None:
        self.config = config
        name = config.get("ClusterName", "")
        if name and name != "(null)":
            self.cluster_name = name
            if self._machine is not None:
                self.model.update(self._machine, {K.NAME: name})
        storage = config.get("AccountingStorageType", "accounting_storage/none")
        if storage and storage != "accounting_storage/none":
            self._sacct_mode = "accounting"
            self._json["sacct"] = sp.json_support(self.version if self.prefer_json else None)["sacct"]
        elif config.get("JobCompType") == "jobcomp/filetxt":
            self._sacct_mode = "completion"
        else:
            self._sacct_mode = None

    def _add_machine(self) -> None:
        version = self.version_text
        self._machine = self.model.add(Kind.MACHINE, None, {
            K.NAME: self.cluster_name, K.STATE: "UNKNOWN", K.NUM_NODES: "0", K.VERSION: version,
            K.BACKEND: self.name,
        }, owner=self.name)

    def _update_machine(self) -> None:
        if self._machine is None:
            return
        if self._failing:
            state = "ERROR"
        elif not self._nodes:
            state = "UNKNOWN"
        else:
            up = sum(1 for _eid, node in self._nodes.values() if sp.map_node_state(node.state)[0] == "UP")
            state = "UP" if up == len(self._nodes) else ("ALERT" if up else "DOWN")
        self.model.update(self._machine, {K.STATE: state, K.NUM_NODES: str(len(self._nodes))})

    def _set(self, eid: int, attrs: Mapping[str, str]) -> None:
        """Update an element; an empty value clears a key only if it was ever set."""
        model = self.model
        model.update(eid, {k: (v if v != "" else None) for k, v in attrs.items()
                           if v != "" or model.attr(eid, k) is not None})

    # ------------------------------------------------------------------ partitions

    async def _fetch_partitions(self) -> List[SlurmPartition]:
        return await self._query(
            "partitions",
            sp.partitions_argv(False), sp.parse_scontrol_partitions,
            sp.partitions_argv(True), sp.parse_partitions_json,
        )

    def _apply_partitions(self, parts: Sequence[SlurmPartition]) -> None:
        model = self.model
        listed: Dict[str, SlurmPartition] = {}
        default = None
        for part in parts:
            if not part.name or part.name in listed:
                continue
            listed[part.name] = part
            if part.is_default and default is None:
                default = part.name
            attrs_ = partition_attributes(part)
            eid = self._queues.get(part.name)
            if eid is None:
                attrs_[K.BACKEND] = self.name
                self._queues[part.name] = model.add(
                    Kind.QUEUE, None, {k: v for k, v in attrs_.items() if v}, owner=self.name
                )
            elif self._partitions.get(part.name) != part:
                self._set(eid, attrs_)
        for name, eid in list(self._queues.items()):
            if name not in listed and not model.children(eid):
                model.remove(eid)
                del self._queues[name]
        self._partitions = listed
        self._default_partition = default or next(iter(listed), None)
        self._partitions_stale = False

    def _queue_for(self, partition: str) -> int:
        """The queue of a job's partition (``debug,long`` for a job pending in either: the
        first known one); a partition not listed (hidden) gets a queue of its own."""
        names = [p for p in partition.split(",") if p]
        for name in names:
            eid = self._queues.get(name)
            if eid is not None:
                return eid
        name = names[0] if names else (self._default_partition or "unknown")
        eid = self._queues.get(name)
        if eid is None:
            eid = self._queues[name] = self.model.add(
                Kind.QUEUE, None, {K.NAME: name, K.STATE: "NORMAL", K.BACKEND: self.name}, owner=self.name
            )
            self._partitions_stale = True
        return eid

    # ------------------------------------------------------------------ nodes

    async def _fetch_nodes(self) -> List[SlurmNode]:
        return await self._query(
            "nodes",
            sp.nodes_argv(False), sp.parse_sinfo_nodes_text,
            sp.nodes_argv(True, self.version), sp.parse_nodes_json,
        )

    def _apply_nodes(self, nodes: Sequence[SlurmNode]) -> None:
        model = self.model
        assert self._machine is not None
        listed: Set[str] = set()
        new: List[SlurmNode] = []
        for node in nodes:
            if not node.name or node.name in listed:
                continue
            listed.add(node.name)
            known = self._nodes.get(node.name)
            if known is None:
                new.append(node)
            elif known[1] != node:
                self._set(known[0], node_attributes(node))
                self._nodes[node.name] = (known[0], node)
        if new:
            attrs_list = []
            for node in new:
                number = self._node_numbers.setdefault(node.name, len(self._node_numbers))
                attrs_ = {k: v for k, v in node_attributes(node).items() if v}
                attrs_[K.NUMBER] = str(number)
                attrs_list.append(attrs_)
            for eid, node in zip(model.add_many(Kind.NODE, self._machine, attrs_list, owner=self.name), new):
                self._nodes[node.name] = (eid, node)
        for name in [n for n in self._nodes if n not in listed]:
            model.remove(self._nodes.pop(name)[0])

    def _node_id(self, nodelist: str) -> Optional[int]:
        known = self._nodes.get(first_host(nodelist))
        return known[0] if known is not None else None

    # ------------------------------------------------------------------ jobs

    async def _fetch_jobs(self) -> List[SlurmJob]:
        user = None if self.all_users else self.user
        return await self._query(
            "squeue",
            sp.squeue_argv(user), sp.parse_squeue_text,
            sp.squeue_argv(user, json=True),
            lambda text: sp.parse_squeue_json(text, user, int(time.time())),
        )

    async def _apply_listing(self, jobs: List[SlurmJob], generation: int) -> None:
        changes = self._table.apply(jobs, generation)
        if changes.added or changes.changed:
            await self._apply_jobs(changes)
        if changes.gone:
            await self._finish_gone(changes.gone)

    #: Jobs put into the model between two checkpoints, so a first listing of 100,000 jobs
    #: (some seconds of model work) does not stop the agent from answering meanwhile.
    APPLY_CHUNK = 5000

    async def _apply_jobs(self, changes: JobChanges) -> None:
        chunk = self.APPLY_CHUNK
        added = changes.added
        for start in range(0, len(added), chunk):
            with gc_paused():
                self._add_or_update(added[start:start + chunk])
            await trio.lowlevel.checkpoint()
        changed = [job for _previous, job in changes.changed]
        for start in range(0, len(changed), chunk):
            with gc_paused():
                self._add_or_update(changed[start:start + chunk])
            await trio.lowlevel.checkpoint()

    def _add_or_update(self, jobs: Sequence[SlurmJob]) -> None:
        by_queue: Dict[int, List[SlurmJob]] = {}
        for job in jobs:
            tracked = self._jobs.get(job.job_id)
            if tracked is not None:
                self._update_job(tracked, job)
            else:
                by_queue.setdefault(self._queue_for(job.partition), []).append(job)
        for queue, new in by_queue.items():
            self._add_jobs(queue, new)

    def _add_jobs(self, queue: int, jobs: List[SlurmJob]) -> None:
        model = self.model
        attrs_list = []
        for job in jobs:
            attrs_: Dict[str, Any] = {k: v for k, v in job_attributes(job).items() if v}
            attrs_[K.QUEUE] = queue
            if job.time_used:
                attrs_[K.TIME_USED] = _seconds(job.time_used)
            attrs_list.append(attrs_)
        with model.batch():
            for eid, job in zip(model.add_many(Kind.JOB, queue, attrs_list, owner=self.name), jobs):
                node = self._node_id(job.nodes)
                process = process_attributes(job, node)
                pid = model.add(Kind.PROCESS, eid, process, owner=self.name)
                tracked = _Job(job.job_id, eid, pid, queue, node=node)
                self._jobs[job.job_id] = tracked
                self._by_element[eid] = tracked
                if job_state(job.state).final:
                    self._completed(tracked)

    def _update_job(self, tracked: _Job, job: SlurmJob) -> None:
        model = self.model
        with model.batch():
            queue = self._queue_for(job.partition)
            if queue != tracked.queue:
                model.move(tracked.element, queue)
                tracked.queue = queue
            attrs_: Dict[str, Any] = job_attributes(job)
            attrs_[K.QUEUE] = queue
            if job.time_used:
                attrs_[K.TIME_USED] = _seconds(job.time_used)
            if job.nodes:
                tracked.node = self._node_id(job.nodes)
            process = process_attributes(job, tracked.node)
            state = job_state(job.state)
            if state.final and tracked.followers:
                # Its output files are still being read: the end is shown after the output.
                tracked.held = (
                    {k: attrs_.pop(k) for k in _FINAL_KEYS if k in attrs_},
                    {k: process.pop(k) for k in _FINAL_KEYS if k in process},
                )
                attrs_[K.STATE] = process[K.STATE] = JobState.FINISHING.value
            elif not state.final:
                tracked.held = None
            # The process first, so that a job's end follows its process's.
            self._set(tracked.process, process)
            self._set(tracked.element, attrs_)
        if state.started or state is JobState.FINISHING:
            if tracked.started is not None:
                tracked.started.set()
        if state.final:
            if not tracked.completed:
                self._completed(tracked)
        elif tracked.completed:
            # Requeued: it is back in the queue under the same id.
            tracked.completed = False
            tracked.retire_at = None

    def _completed(self, tracked: _Job) -> None:
        tracked.completed = True
        tracked.retire_at = trio.current_time() + self.retention
        self._retire.append((tracked.retire_at, tracked.slurm_id))
        if tracked.done is not None:
            tracked.done.set()

    def _retire_due(self) -> None:
        now = trio.current_time()
        while self._retire and self._retire[0][0] <= now:
            at, slurm_id = self._retire.popleft()
            tracked = self._jobs.get(slurm_id)
            if tracked is None or not tracked.completed or tracked.retire_at != at:
                continue
            del self._jobs[slurm_id]
            self._by_element.pop(tracked.element, None)
            if tracked.element in self.model:
                self.model.remove(tracked.element)
            self._table.retire(slurm_id)
            for path in tracked.spool_files:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _refresh_time_used(self) -> None:
        for tracked in self._jobs.values():
            if tracked.completed:
                continue
            record = self._table.record(tracked.slurm_id)
            if record is not None and record.time_used and tracked.element in self.model:
                self.model.update(tracked.element, {K.TIME_USED: _seconds(record.time_used)})

    async def _finish_gone(self, gone: List[str]) -> None:
        """Jobs SLURM no longer lists: find how they ended and report them COMPLETED."""
        todo = [t for t in map(self._jobs.get, gone) if t is not None and not t.completed]
        if not todo:
            return
        try:
            finals = await self._final_records([t.slurm_id for t in todo])
        except SlurmCommandError as exc:
            log.warning("cannot look up how %d jobs ended: %s", len(todo), exc.message)
            finals = None
        for tracked in todo:
            record = finals.get(tracked.slurm_id) if finals is not None else None
            if record is not None and job_state(record.state).final:
                self._update_job(tracked, record)
                continue
            tracked.gone_polls += 1
            if tracked.gone_polls < self.MAX_GONE_POLLS and (finals is None or record is not None):
                # The lookup failed, or SLURM still calls the job active although squeue left it
                # out: the next listing is to mention it, or it is looked up again.
                if record is not None:
                    self._update_job(tracked, record)
                self._table.expect(tracked.slurm_id, self._generation)
                continue
            gone = {K.STATE: JobState.DELETED.value, K.NATIVE_STATE: "UNKNOWN"}
            job_gone = {**gone, K.MESSAGE: "SLURM no longer lists the job and has no record of how it ended"}
            if tracked.followers:
                tracked.held = (job_gone, dict(gone))  # shown once its output is delivered
            else:
                with self.model.batch():
                    self._set(tracked.process, gone)
                    self._set(tracked.element, job_gone)
            self._completed(tracked)

    async def _final_records(self, job_ids: List[str]) -> Dict[str, SlurmJob]:
        """Last known records of jobs: ``scontrol show job`` (while the controller remembers
        them), then one ``sacct`` for the rest when accounting or the completion log exists."""
        found: Dict[str, SlurmJob] = {}
        for slurm_id in job_ids[: self.MAX_SCONTROL_LOOKUPS]:
            if self._json.get("job"):
                argv, parser = sp.scontrol_job_argv(slurm_id, json=True), sp.parse_scontrol_jobs_json
            else:
                argv, parser = sp.scontrol_job_argv(slurm_id), sp.parse_scontrol_jobs
            result = await self._command(argv, check=False)
            if result.returncode != 0:
                continue  # "Invalid job id specified": purged already
            try:
                for record in await self._parse(parser, result.stdout, "scontrol show job"):
                    if record.job_id == slurm_id:
                        found[slurm_id] = record
            except sp.SlurmError:
                continue
        rest = [j for j in job_ids if j not in found]
        if rest and self._sacct_mode is not None:
            use_json = bool(self._json.get("sacct"))
            argv = sp.sacct_argv(rest, json=use_json, completion=self._sacct_mode == "completion")
            result = await self._command(argv, check=False)
            if result.returncode == 0:
                parser = sp.parse_sacct_json if use_json else sp.parse_sacct_text
                try:
                    records = await self._parse(parser, result.stdout, "sacct")
                except sp.SlurmError:
                    records = []
                wanted = set(rest)
                for record in records:  # a requeued job has several: the last one wins
                    if record.job_id in wanted:
                        found[record.job_id] = record
            else:
                log.info("sacct could not say how jobs ended: %s",
                         clean_message(result.stderr.decode("utf-8", "replace")))
        return found

    def _tracked(self, job_id: int) -> _Job:
        tracked = self._by_element.get(job_id)
        if tracked is None:
            raise JobError("the job is not a SLURM job this agent follows", ErrorKind.NO_SUCH_JOB)
        return tracked

    # ------------------------------------------------------------------ adoption

    def job_extra(self, job: int) -> Dict[str, Any]:
        """The output files followed (and those the agent chose itself): a later agent
        reads them on from where delivery stopped, and removes its own with the job."""
        tracked = self._by_element.get(job)
        if tracked is None:
            return {}
        return {"outputs": dict(tracked.outputs), "spool": list(tracked.spool_files)}

    def adopt(self, stored) -> List[int]:
        """Take back the jobs an earlier agent submitted here (their store records), by SLURM
        job id, once the first listing is in:

        * still listed (queued, running, or ended less than MinJobAge ago): followed on
          under the job's stored key, as if this agent had submitted it;
        * no longer listed and not known to have ended: the next poll finds it gone and
          asks ``scontrol show job``, then accounting (``sacct``), how it ended;
        * no longer listed and recorded as ended: its recorded end (state, exit status).

        Output files are read on from where delivery to a client had stopped, and a job's
        end is shown after its output, as for a job submitted here.  A record without a
        SLURM id (the agent ended before sbatch answered) is shown ended, saying so."""
        adopted: List[int] = []
        for record in stored:
            if record.key in self.model:
                continue
            try:
                if record.native_id:
                    self._adopt_job(record)
                else:
                    self._adopt_unsubmitted(record)
            except Exception:  # noqa: BLE001 - one bad record must not keep the others out
                log.exception("cannot adopt stored job %s (SLURM job %r)", record.key, record.native_id)
                continue
            adopted.append(record.key)
        if adopted:
            self._poke()
        return adopted

    def _stored_attributes(self, record, state: Mapping[str, str]) -> Dict[str, Any]:
        spec = record.job_spec
        attrs_: Dict[str, Any] = {K.NAME: record.name, K.USER: self.user, **state}
        if record.client_ref:
            attrs_[K.CLIENT_REF] = record.client_ref
        if record.native_id:
            attrs_[K.NATIVE_ID] = record.native_id
        if spec is not None:
            attrs_[K.NUM_PROCS] = str(spec.num_procs)
            attrs_[K.EXECUTABLE] = spec.executable
            if spec.arguments:
                attrs_[K.ARGUMENTS] = tuple(spec.arguments)
            if spec.working_dir:
                attrs_[K.WORKING_DIR] = spec.working_dir
        return attrs_

    def _stored_queue(self, record) -> int:
        """The queue of a stored job: its partition, from ``SCHEDULER:PARTITION``."""
        partition = record.queue.split(":", 1)[1] if ":" in record.queue else record.queue
        return self._queue_for(partition)

    def _adopt_unsubmitted(self, record) -> None:
        gone = {K.STATE: JobState.DELETED.value, K.NATIVE_STATE: "UNKNOWN"}
        message = ("the agent ended before sbatch answered: whether SLURM took the job is not known "
                   f"(look for a job named {record.name!r} in squeue or sacct)")
        queue = self._stored_queue(record)
        with self.model.batch():
            eid = self.model.add(Kind.JOB, queue, {**self._stored_attributes(record, gone), K.MESSAGE: message,
                                                   K.QUEUE: queue}, owner=self.name, key=record.key)
            self.model.add(Kind.PROCESS, eid, dict(gone), owner=self.name)

    def _adopt_job(self, record) -> None:
        model = self.model
        slurm_id = record.native_id
        listed = self._table.record(slurm_id)
        earlier = self._jobs.pop(slurm_id, None)
        if earlier is not None:
            # The first listing showed it under a key of its own: it takes back its stored one.
            self._by_element.pop(earlier.element, None)
            if earlier.element in model:
                model.remove(earlier.element)
        if listed is not None:
            queue = self._queue_for(listed.partition)
        elif earlier is not None:
            queue = earlier.queue
        else:
            queue = self._stored_queue(record)
        final = record.ended is not None and _is_final(record.state)
        if final:
            state = JobState.FINISHING.value
        elif _is_state(record.state):
            state = record.state
        else:  # the submission was recorded, no state change yet
            state = JobState.QUEUING.value
        shown = {K.STATE: state, K.NATIVE_STATE: record.native_state or "PENDING"}
        with model.batch():
            eid = model.add(Kind.JOB, queue, {**self._stored_attributes(record, shown), K.QUEUE: queue},
                            owner=self.name, key=record.key)
            pid = model.add(Kind.PROCESS, eid, dict(shown), owner=self.name)
        tracked = _Job(slurm_id, eid, pid, queue)
        extras = record.extras
        tracked.spool_files = tuple(p for p in extras.get("spool", ()) if isinstance(p, str))
        outputs = extras.get("outputs")
        if isinstance(outputs, dict):
            tracked.outputs = {k: v for k, v in outputs.items() if k in ("stdout", "stderr") and isinstance(v, str)}
        self._jobs[slurm_id] = tracked
        self._by_element[eid] = tracked
        tracked.started = trio.Event()
        tracked.done = trio.Event()
        delivered = record.delivered_offsets
        if self._nursery is not None:
            for stream, path in tracked.outputs.items():
                tracked.followers += 1
                self._nursery.start_soon(self._follow, tracked, path, stream, None, delivered.get(f"0.{stream}", 0))
        if listed is not None:
            # SLURM's word, through the same path as every listing (an end waits for the output)
            self._update_job(tracked, listed)
        elif final:
            ended = {K.STATE: record.state, K.NATIVE_STATE: record.native_state, K.EXIT_CODE: record.exit_code,
                     K.SIGNAL: record.signal}
            job_end = {**ended, K.MESSAGE: record.message}
            if tracked.followers:
                tracked.held = (job_end, ended)
            else:
                with model.batch():
                    self._set(pid, ended)
                    self._set(eid, job_end)
            self._completed(tracked)
        else:
            # Gone from the listing while this agent was away: the next poll reports it gone
            # and looks up how it ended; its output is read meanwhile.
            tracked.started.set()
            self._table.expect(slurm_id, self._generation)

    # ------------------------------------------------------------------ submit

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> int:
        script_spec, follow, spool_files = self._script_spec(spec, queue)
        try:
            script = batch.render_script(script_spec).encode("utf-8")
            argv = batch.submit_argv(script_spec)
        except batch.BatchScriptError as exc:
            raise SubmitError(str(exc), ErrorKind.BAD_REQUEST) from None
        stale = {path: _file_signature(path) for path in follow.values() if path}
        try:
            # sbatch passes its environment to the job: no query settings in it.
            result = await self._command(argv, stdin=script, env=dict(os.environ))
        except SlurmCommandError as exc:
            message = exc.message
            if exc.timed_out:
                message += "; the job may or may not have been submitted"
            raise SubmitError(message) from None
        try:
            slurm_id = sp.parse_sbatch_parsable(result.stdout.decode("utf-8", "replace"))
        except sp.SlurmError as exc:
            raise SubmitError(f"{exc}; sbatch said: {clean_message(result.stderr.decode('utf-8', 'replace'))}") from None
        warnings = clean_message(result.stderr.decode("utf-8", "replace"))
        if warnings:
            log.info("sbatch for %s (SLURM job %s): %s", script_spec.job_name, slurm_id, warnings)
        tracked = self._register_submitted(slurm_id, spec, script_spec, queue, key)
        tracked.spool_files = spool_files
        if self._nursery is not None:
            tracked.started = trio.Event()
            tracked.done = trio.Event()
            if _has_started(self.model.attr(tracked.element, K.STATE)):
                tracked.started.set()  # the listing saw it start before sbatch's answer came
            if tracked.completed:
                tracked.done.set()
            for stream, pattern in follow.items():
                path = expand_output_pattern(pattern, slurm_id, script_spec.job_name or "", self.user) if pattern else None
                if path is None:
                    log.info("cannot follow %s of SLURM job %s: %r needs the node to expand", stream, slurm_id, pattern)
                    continue
                tracked.outputs[stream] = path
                tracked.followers += 1
                self._nursery.start_soon(self._follow, tracked, path, stream, stale.get(pattern))
        self._poke()
        log.info("submitted %s as SLURM job %s (key %d)", script_spec.job_name, slurm_id, tracked.element)
        return tracked.element

    def _register_submitted(self, slurm_id: str, spec: JobSpec, script_spec: batch.ScriptSpec, queue: int,
                            key: Optional[int] = None) -> _Job:
        model = self.model
        attrs_: Dict[str, Any] = {
            K.CLIENT_REF: spec.client_ref,
            K.NAME: script_spec.job_name or "",
            K.NATIVE_ID: slurm_id,
            K.USER: self.user,
            K.NUM_PROCS: str(spec.num_procs),
            K.EXECUTABLE: spec.executable,
        }
        if spec.arguments:
            attrs_[K.ARGUMENTS] = spec.arguments
        if spec.working_dir:
            attrs_[K.WORKING_DIR] = spec.working_dir
        tracked = self._jobs.get(slurm_id)
        if tracked is not None:
            # The listing saw the job before sbatch's answer came back.
            self._set(tracked.element, attrs_)
            return tracked
        native = "PENDING"
        state = JobState.HOLD if spec.hold else JobState.QUEUING
        attrs_.update({K.STATE: state.value, K.NATIVE_STATE: native, K.QUEUE: queue})
        with model.batch():
            eid = model.add(Kind.JOB, queue, attrs_, owner=self.name, key=key)
            pid = model.add(Kind.PROCESS, eid, {K.STATE: state.value, K.NATIVE_STATE: native}, owner=self.name)
        tracked = _Job(slurm_id, eid, pid, queue, spec.client_ref)
        self._jobs[slurm_id] = tracked
        self._by_element[eid] = tracked
        self._table.expect(slurm_id, self._generation)
        return tracked

    def _script_spec(self, spec: JobSpec, queue: int) -> Tuple[batch.ScriptSpec, Dict[str, str], Tuple[str, ...]]:
        """The batch script a submission describes, the output files to follow by stream, and
        those of them the agent chose itself (deleted with the job)."""
        if not spec.executable:
            raise SubmitError("the submission names no program", ErrorKind.BAD_REQUEST)
        extra = ["--hold"] if spec.hold else []
        if spec.begin_time:
            extra.append("--begin=" + spec.begin_time)
        working_dir = spec.working_dir or None
        stdout_path = spec.stdout_path or None
        stderr_path = spec.stderr_path or None
        spool_files: Tuple[str, ...] = ()
        if stdout_path is None:
            stdout_path, default_err = self._spool_paths(spec.client_ref or spec.display_name)
            spool_files = (stdout_path,)
            if stderr_path is None:
                stderr_path = default_err
                spool_files += (default_err,)
        elif stderr_path is None:
            stderr_path = stdout_path  # SLURM's own default: both streams in one file
        partition = self.model.attr(queue, K.NAME)
        if not isinstance(partition, str) or not partition:
            raise SubmitError("the queue has no partition name", ErrorKind.NO_SUCH_QUEUE)
        named = spec.extra_value(PARTITION)
        if named and named != partition:
            raise SubmitError(
                f"the queue given is partition {partition!r} but partition is {named!r}; give one of them",
                ErrorKind.BAD_REQUEST,
            )
        try:
            script_spec = batch.ScriptSpec(
                executable=spec.executable,
                arguments=spec.arguments,
                environment=spec.environment,
                working_dir=working_dir,
                num_procs=spec.num_procs,
                nodes=spec.nodes or None,
                cpus_per_task=spec.cpus_per_task,
                memory=str(spec.memory) if spec.memory else None,
                time_limit=_slurm_duration(spec.wall_time) if spec.wall_time else None,
                queue=partition,
                account=spec.account or None,
                job_name=spec.display_name,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
                extra_options=extra,
            )
            batch.scheduler_options(script_spec)  # validates every value now, with its name
        except (batch.BatchScriptError, ValueError) as exc:
            raise SubmitError(str(exc), ErrorKind.BAD_REQUEST) from None
        base = working_dir or os.getcwd()
        follow = {"stdout": os.path.join(base, stdout_path)}
        if stderr_path != stdout_path:
            follow["stderr"] = os.path.join(base, stderr_path)
        return script_spec, follow, tuple(path.replace("%%", "%") for path in spool_files)

    def _spool_paths(self, sub_id: str) -> Tuple[str, str]:
        try:
            os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SubmitError(f"cannot create the output directory {self.spool_dir}: {exc.strerror or exc}") from None
        stem = f"{_SAFE_NAME.sub('_', sub_id)[:80] or 'job'}.{secrets.token_hex(4)}"
        # '%' would be a SLURM file name pattern: double it in the directory part.
        base = os.path.join(self.spool_dir, stem).replace("%", "%%")
        return base + ".out", base + ".err"

    # ------------------------------------------------------------------ output

    async def _follow(self, tracked: _Job, path: str, stream: str, stale: Optional[tuple], offset: int = 0) -> None:
        """Pass the lines of a job's output file to its process while the job runs, then what
        is left once it has completed (waiting ``output_drain_grace`` for late writes);
        from ``offset`` on (an adopted job: what a client already has is not sent again)."""
        assert tracked.started is not None and tracked.done is not None
        try:
            await self._follow_file(tracked, path, stream, stale, offset)
        finally:
            tracked.followers -= 1
            if tracked.followers == 0 and tracked.held is not None and tracked.element in self.model:
                job_attrs, process_attrs = tracked.held
                tracked.held = None
                with self.model.batch():
                    self._set(tracked.process, process_attrs)
                    self._set(tracked.element, job_attrs)

    async def _follow_file(self, tracked: _Job, path: str, stream: str, stale: Optional[tuple],
                           offset: int = 0) -> None:
        assert tracked.started is not None and tracked.done is not None
        splitter = common.LineSplitter()
        inode = None
        quiet_since: Optional[float] = None
        model = self.model
        pid = tracked.process
        # Nothing to read before the job starts (its file may be left from an earlier run).
        while not (tracked.started.is_set() or tracked.done.is_set()):
            await trio.sleep(self.output_interval)
        while pid in model:
            done = tracked.done.is_set()
            # A regular file: reading it does not block (and a worker thread would let a
            # virtual clock run ahead of the read).
            signature, size, data = _read_new(path, offset, stale)
            await trio.lowlevel.checkpoint()
            if pid not in model:
                break  # the job was retired while the file was being read
            if signature is not None and signature != stale:
                stale = None
                if size < offset or (inode is not None and signature[:2] != inode):
                    # truncated or replaced: start over
                    offset, inode = 0, None
                    splitter = common.LineSplitter()
                    continue
                inode = signature[:2]
            if data:
                offset += len(data)
                text = splitter.feed_text(data)
                if text is not None:
                    # where the text ends in the file: what counts as delivered once sent
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

    # ------------------------------------------------------------------ job commands

    async def terminate(self, job: int) -> None:
        tracked = self._tracked(job)
        try:
            await self._command(sp.scancel_argv(tracked.slurm_id))
        except SlurmCommandError as exc:
            raise JobError(f"cannot cancel SLURM job {tracked.slurm_id}: {exc.message}") from None
        self._poke()

    async def hold(self, job: int, held: bool) -> None:
        """scontrol hold / release."""
        tracked = self._tracked(job)
        slurm_id = tracked.slurm_id
        argv, what = (sp.hold_job_argv(slurm_id), "hold") if held else (sp.release_job_argv(slurm_id), "release")
        await self._job_command(argv, what, slurm_id)

    async def suspend(self, job: int, suspended: bool) -> None:
        """scontrol suspend / resume (SLURM lets only operators)."""
        tracked = self._tracked(job)
        slurm_id = tracked.slurm_id
        if suspended:
            argv, what = sp.suspend_job_argv(slurm_id), "suspend"
        else:
            argv, what = sp.resume_job_argv(slurm_id), "resume"
        await self._job_command(argv, what, slurm_id)

    async def _job_command(self, argv: Sequence[str], what: str, slurm_id: str) -> None:
        try:
            await self._command(argv)
        except SlurmCommandError as exc:
            raise JobError(f"cannot {what} SLURM job {slurm_id}: {exc.message}") from None
        finally:
            self._poke()

    async def move(self, job: int, queue: int) -> None:
        tracked = self._tracked(job)
        if queue == tracked.queue:
            return
        partition = self.model.attr(queue, K.NAME)
        if not isinstance(partition, str) or not partition:
            raise JobError("the queue has no partition name", ErrorKind.NO_SUCH_QUEUE)
        try:
            argv = sp.move_job_argv(tracked.slurm_id, partition)
        except ValueError as exc:
            raise JobError(str(exc), ErrorKind.BAD_REQUEST) from None
        try:
            await self._command(argv)
        except SlurmCommandError as exc:
            raise JobError(f"cannot move SLURM job {tracked.slurm_id} to partition {partition}: {exc.message}") from None
        if tracked.element in self.model:
            with self.model.batch():
                self.model.move(tracked.element, queue)
                tracked.queue = queue
                self.model.update(tracked.element, {K.QUEUE: queue})
        self._poke()
