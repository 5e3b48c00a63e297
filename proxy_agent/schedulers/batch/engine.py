"""The batch engine: what every batch system backend shares.

A batch system (SLURM, Grid Engine, PBS...) is a :class:`BatchSystem`: its commands as argv lists,
parsers of their answers into the neutral records of :mod:`.records`, its state table and
its submission dialect.  :class:`BatchBackend` does the rest, the same way for every system:

* **Polling**: one status query per poll for every job shown (the agent user's, or every
  user's with ``--all-users``) and, in the same poll, one listing of the queues (their
  states, slots and figures, and the limits the listing carries), so what the clients see
  of a queue is never older than one poll; the hosts every ``node_interval`` (a minute, or
  four polls, and at the next poll when a job names a queue not listed).
* **Queue definitions** a second command must read (:meth:`BatchSystem.queue_details`,
  Grid Engine's ``qconf -sq``) are read again every ``info_interval`` (the
  ``--SYSTEM-definitions-interval`` option, five minutes by default), for a queue not read
  yet or whose reading failed at the next poll, and for every queue at the first poll after
  the scheduler answers again (its daemon may have restarted with other definitions).  Queries of one poll run
  side by side; a big answer is parsed in a worker thread.  A system may ask a listing its
  own way (:meth:`BatchSystem.fetch`: SLURM tries JSON, then text).  After a submission
  or a job command the engine polls every ``fast_poll_interval`` for a while.  A job's
  ``timeUsed`` is not a change by itself: it is refreshed for every job once every
  ``time_used_interval`` (a minute).
* **Back-off**: a failing or hanging query is logged, shown as the machine's ERROR state and
  told to the clients once (and once more when the scheduler answers again); polls are then
  spaced twice as far each time, up to ``max_backoff``.
* **Job table**: each listing is compared with the previous one (:class:`JobTable`): only
  jobs whose record changed touch the model, whatever the size of the listing.
* **Final states**: the jobs that leave one listing are looked up together through the
  system's accounting (:meth:`BatchSystem.final_records`, by default one
  :meth:`BatchSystem.final_record` each); while the lookup finds nothing yet it is tried
  again for ``MAX_GONE_POLLS`` polls, then (or at once, when the system says it has no
  record for good) the job is DELETED ("no record of how it ended").
  Jobs that have ended leave the model ``retention`` seconds later.
* **Submission races**: a job announced by its submission is not reported gone by a listing
  that started before the submission (:meth:`JobTable.expect`); a job that ended before it
  was ever listed is found through accounting like any other.
* **Output**: a job submitted here writes its standard output and error to files, in the
  spool directory (``~/.proxy-agent/BACKEND``) unless the submission names files.  They are
  followed while the job runs; a job's final state is shown only once all of its output has
  been delivered, and the spool files are removed then (files an earlier agent left there
  are removed after a week).  Output carries its file offsets, so the job store records
  how far delivery got.  A system whose file names hold patterns expands them once the
  job has its id (:meth:`BatchSystem.follow_path`).
* **Adoption**: jobs an earlier agent submitted come back from the store by their native
  id (:meth:`BatchBackend.adopt`), and their output is delivered from where it stopped; a
  recorded end is shown after that output.
* **Queue figures**: each queue shows ``totalSlots`` and ``freeSlots`` as the scheduler
  reports them and ``waitingJobs``/``runningJobs`` (the scheduler's counts where it gives
  them, else counted from the listed jobs), the names the local backend's figures have.
"""

from __future__ import annotations

import abc
import gc
import inspect
import logging
import operator
import os
import re
import resource
import secrets
import time
from collections import deque
from contextlib import contextmanager
from typing import (
    Any, Awaitable, Callable, ClassVar, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
    Set, Tuple,
)

import attrs
import trio

from ...service.attributes import AttrInfo, ValueType
from ...service.jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, StateTable, SubmitError
from ...service.model import K, Kind, ServiceModel
from .. import common
from ...service.backend import Backend, BackendContext
from .records import NativeJob, NativeNode, NativeQueue

__all__ = [
    "BatchBackend",
    "BatchOptions",
    "BatchSystem",
    "CommandFailed",
    "CommandResult",
    "JobTable",
    "Parse",
    "Run",
    "run_command",
]

log = logging.getLogger("proxy_agent.schedulers.batch")


# --------------------------------------------------------------------------- commands


@attrs.frozen
class CommandResult:
    argv: Tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")


class CommandFailed(ServiceError):
    """A scheduler command failed, hung or could not start: the scheduler is unavailable."""

    def __init__(self, argv: Sequence[str], message: str, timed_out: bool = False) -> None:
        super().__init__(message, ErrorKind.UNAVAILABLE)
        self.argv = tuple(argv)
        self.timed_out = timed_out


#: How a system has an answer parsed: ``await parse(parser, stdout_bytes)`` (a big one in a
#: worker thread).
Parse = Callable[[Callable[[str], Any], bytes], Awaitable[Any]]

#: How the engine and the systems run a command: ``await run(argv, stdin=None, check=True)``.
#: With ``check`` a non-zero exit raises :class:`CommandFailed` with the command's words.
Run = Callable[..., Awaitable[CommandResult]]


async def run_command(argv: Sequence[str], stdin: Optional[bytes] = None,
                      env: Optional[Mapping[str, str]] = None) -> CommandResult:
    """Run argv (never through a shell); the child never inherits the agent's stdin, which
    in stdio mode is the protocol stream."""
    process = await trio.run_process(list(argv), stdin=stdin if stdin is not None else b"",
                                     capture_stdout=True, capture_stderr=True, check=False, env=env)
    return CommandResult(tuple(argv), process.returncode, process.stdout, process.stderr)


def one_line(text: str, limit: int = 500) -> str:
    """A command's message as one line: blank and repeated lines dropped, joined by ``; ``."""
    lines: List[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and line not in lines:
            lines.append(line)
    joined = "; ".join(lines)
    return joined if len(joined) <= limit else joined[:limit - 3] + "..."


# --------------------------------------------------------------------------- the system


class BatchSystem(abc.ABC):
    """One batch system as the engine uses it.  Everything but :meth:`start`,
    :meth:`explain`, :meth:`queue_details` and :meth:`final_record` is pure; those get the
    engine's ``run`` to run whatever commands they need."""

    #: the system's name in messages ("Grid Engine")
    label: ClassVar[str] = "batch system"
    #: the submit command's name in messages
    submit_program: ClassVar[str] = "the submit command"
    #: the native state a job shows between its submission and its first listing
    submitted_state: ClassVar[str] = ""
    #: whether a command on a job that has ended is still sent (the system's answer says why
    #: it cannot be done) rather than refused by the engine
    commands_after_end: ClassVar[bool] = False
    #: the environment of queries (None: the agent's own)
    query_env: Optional[Mapping[str, str]] = None

    @property
    @abc.abstractmethod
    def state_table(self) -> StateTable:
        """Native job states -> service states."""

    @abc.abstractmethod
    async def start(self, run: Run) -> str:
        """Check the system answers and learn what it is; returns its version text."""

    def machine_name(self) -> str:
        """The machine's name ("": the backend's name)."""
        return ""

    def error_text(self, stderr: str) -> str:
        """A failed command's message as one line for clients."""
        return one_line(stderr)

    # listings
    async def fetch(self, what: str, user: Optional[str], run: Run, parse: "Parse") -> Any:
        """The parsed answer of the listing query ``what`` (``jobs``, ``queues`` or ``nodes``),
        None when the system has no such query.  A system that knows several forms of a
        query (JSON and text) chooses here."""
        if what == "jobs":
            argv: Optional[Sequence[str]] = self.status_argv(user)
            parser: Callable[[str], Any] = lambda text: self.parse_status(text, user)  # noqa: E731
        elif what == "queues":
            argv, parser = self.queues_argv(), self.parse_queues
        else:
            argv, parser = self.nodes_argv(), self.parse_nodes
        if argv is None:
            return None
        result = await run(argv)
        return await parse(parser, result.stdout)

    @abc.abstractmethod
    def status_argv(self, user: Optional[str]) -> Sequence[str]:
        """One query for every job shown (``user`` None: everyone's)."""

    @abc.abstractmethod
    def parse_status(self, text: str, user: Optional[str]) -> List[NativeJob]:
        ...

    def queues_argv(self) -> Optional[Sequence[str]]:
        return None

    def parse_queues(self, text: str) -> List[NativeQueue]:
        return []

    #: the fields of a queue's record that :meth:`queue_details` fills in
    detail_fields: ClassVar[Tuple[str, ...]] = ()

    async def queue_details(self, queues: List[NativeQueue], run: Run) -> Dict[str, NativeQueue]:
        """Queues' records completed with what a second command knows (their limits), by
        name; a queue left out could not be read (it is asked again at the next poll)."""
        return {queue.name: queue for queue in queues}

    def nodes_argv(self) -> Optional[Sequence[str]]:
        return None

    def parse_nodes(self, text: str) -> List[NativeNode]:
        return []

    def job_state(self, job: NativeJob) -> JobState:
        """The service state of a record (listing or accounting)."""
        return self.state_table.map(job.native_state)

    def first_host(self, job: NativeJob) -> str:
        """The host of a job's process 0."""
        return job.hosts[0] if job.hosts else ""

    async def explain(self, jobs: List[NativeJob], run: Run) -> List[NativeJob]:
        """New or changed records, with reasons the listing lacks filled in."""
        return jobs

    async def final_record(self, job_id: str, run: Run) -> Optional[NativeJob]:
        """How a job that left the listing ended (None: no record, or none yet)."""
        return None

    async def final_records(self, job_ids: Sequence[str], run: Run) -> Dict[str, Optional[NativeJob]]:
        """How jobs that left the listing ended, looked up together.  A job missing from the
        answer has no record yet (it is asked again); one mapped to None has none for good."""
        found: Dict[str, Optional[NativeJob]] = {}
        for job_id in job_ids:
            record = await self.final_record(job_id, run)
            if record is not None:
                found[job_id] = record
        return found

    # submission and job commands
    @abc.abstractmethod
    def submit_command(self, spec: JobSpec) -> Tuple[List[str], bytes]:
        """(argv, stdin) submitting ``spec``; SubmitError naming what cannot be expressed."""

    @abc.abstractmethod
    def parse_submitted(self, result: CommandResult) -> str:
        """The new job's native id from the submit command's answer; SubmitError with the
        system's words when it refused."""

    @abc.abstractmethod
    def job_command(self, op: str, job: NativeJob, queue: str = "") -> List[str]:
        """argv of ``op`` (delete, hold, release, suspend, resume, move) on ``job`` (its
        latest record); JobError when the system cannot do it in the job's state."""

    @abc.abstractmethod
    def check_job_command(self, op: str, job_id: str, argv: Sequence[str], result: CommandResult) -> None:
        """JobError unless the answer says ``op`` worked."""

    def expandable(self, path: str) -> bool:
        """Whether an output path holds something only the system expands (then it cannot
        be followed)."""
        return "$" in path

    def follow_path(self, path: str, job_id: str, spec: JobSpec, user: str) -> Optional[str]:
        """The file an output path names once the job has its id (None: it cannot be
        followed)."""
        return None if self.expandable(path) else path

    def literal_path(self, path: str) -> str:
        """A file name as the submit command is to take it literally (the agent's own output
        files: no pattern of the system may expand in them)."""
        return path

    def stderr_default(self, stdout: str) -> Optional[str]:
        """Where standard error goes when only standard output is named (None: a file of
        its own in the spool directory)."""
        return None


# --------------------------------------------------------------------------- job table


@contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: The record fields the model shows: a record whose key is unchanged changes nothing (the
#: running clock, ``time_used``, is not among them).
_JOB_KEY = operator.attrgetter(
    "native_state", "reason", "queue", "hosts", "exit_code", "signal", "name", "num_nodes", "num_procs",
    "num_cpus", "time_limit", "user", "account", "start_time", "end_time", "cancelled", "work_dir",
)


@attrs.frozen
class JobChanges:
    added: List[NativeJob]
    changed: List[NativeJob]
    gone: List[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.gone)


class JobTable:
    """The last listing, and what a new one changes.  Pure.

    :meth:`expect` announces a job just submitted: a listing whose query started before
    (an earlier ``generation``) does not report it gone.  Jobs reported gone leave the
    table; :meth:`retire` keeps a job whose element was removed from being reported new
    again while the system still lists it.
    """

    def __init__(self) -> None:
        self._keys: Dict[str, Optional[tuple]] = {}
        self._records: Dict[str, Optional[NativeJob]] = {}
        self._expected: Dict[str, int] = {}
        self._retired: Set[str] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._keys

    def record(self, job_id: str) -> Optional[NativeJob]:
        return self._records.get(job_id)

    def records(self) -> Iterable[NativeJob]:
        return (r for r in self._records.values() if r is not None)

    def expect(self, job_id: str, generation: int) -> None:
        if job_id in self._keys:
            return
        self._retired.discard(job_id)
        self._keys[job_id] = None
        self._records[job_id] = None
        self._expected[job_id] = generation

    def forget(self, job_id: str) -> None:
        """As if the last listing had not shown the job: the next one reports it new."""
        self._keys.pop(job_id, None)
        self._records.pop(job_id, None)

    def retire(self, job_id: str) -> None:
        self._keys.pop(job_id, None)
        self._records.pop(job_id, None)
        self._expected.pop(job_id, None)
        self._retired.add(job_id)

    def apply(self, jobs: Iterable[NativeJob], generation: int) -> JobChanges:
        with _gc_paused():
            keys, records, retired = self._keys, self._records, self._retired
            key_of, missing = _JOB_KEY, _MISSING
            added: List[NativeJob] = []
            changed: List[NativeJob] = []
            seen: Set[str] = set()
            see = seen.add
            stored = 0
            for job in jobs:
                job_id = job.job_id
                if job_id in seen:
                    continue
                see(job_id)
                key = key_of(job)
                old = keys.get(job_id, missing)
                if old is missing:
                    if retired and job_id in retired:
                        continue
                    added.append(job)
                elif old != key:
                    changed.append(job)
                keys[job_id] = key
                records[job_id] = job
                stored += 1
            expected = self._expected
            if expected:
                for job_id in [j for j in expected if j in seen]:
                    del expected[job_id]
            if stored == len(keys):
                gone: List[str] = []  # every job known was listed
            else:
                gone = [j for j in keys if j not in seen and not (j in expected and expected[j] >= generation)]
                for job_id in gone:
                    del keys[job_id], records[job_id]
                    expected.pop(job_id, None)
            if retired:
                self._retired = {j for j in retired if j in seen}
            return JobChanges(added, changed, gone)


_MISSING: Any = object()


# --------------------------------------------------------------------------- the backend


#: Seconds between two polls unless ``--NAME-poll-interval`` says otherwise.
DEFAULT_POLL_INTERVAL = 15.0
#: the share of one core an agent's idle polls take at most when the poll interval is the
#: default one (a big listing is then polled less often)
DEFAULT_CPU_BUDGET = 0.008
#: seconds between two readings of the queues' definitions beyond their listing (at most)
DEFAULT_DEFINITIONS_INTERVAL = 300.0


@attrs.frozen
class BatchOptions:
    #: seconds between two polls
    poll_interval: float = DEFAULT_POLL_INTERVAL
    #: seconds between two readings of the queues' definitions beyond their listing
    definitions_interval: float = DEFAULT_DEFINITIONS_INTERVAL
    #: the directory of the system's commands (None: found on PATH)
    commands_dir: Optional[str] = None
    #: the share of one core idle polling may take (None: no limit; see the engine)
    cpu_budget: Optional[float] = None


@attrs.define(eq=False)
class _Job:
    native_id: str
    element: int
    process: int
    queue: int
    submitted: bool = False
    completed: bool = False
    retire_at: Optional[float] = None
    gone_polls: int = 0
    #: deleted on request: if the system keeps no record of it, it was KILLED
    deleted: bool = False
    node: Optional[int] = None
    started: Optional[trio.Event] = None
    done: Optional[trio.Event] = None
    #: files the agent chose itself: removed once their output is delivered
    spool_files: Tuple[str, ...] = ()
    #: stream -> followed file
    paths: Dict[str, str] = attrs.Factory(dict)
    followers: int = 0
    #: the final attributes (job, process), shown once every output file is delivered
    held: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None


_FINAL_KEYS = (K.STATE, K.NATIVE_STATE, K.EXIT_CODE, K.SIGNAL, K.MESSAGE)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_READ_CHUNK = 1 << 18
_ABANDON = ("abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
            else "cancellable")


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have ended."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _text(value: Optional[int]) -> str:
    return "" if value is None else str(value)


def _signal_text(signal: str) -> str:
    return common.signal_name(int(signal)) if signal.isdigit() else signal


_FINAL_STATE_NAMES = frozenset(state.value for state in JobState if state.final)


def _started(state: JobState) -> bool:
    return state.started or state.final or state is JobState.FINISHING


def job_values(system: BatchSystem, job: NativeJob, submitted: bool = False) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The attributes a record gives a job and its process 0 (``""``: no value).  A job
    ``submitted`` here keeps the name, size and settings it was submitted with."""
    state = system.job_state(job)
    values: Dict[str, Any] = {
        K.STATE: state.value, K.NATIVE_STATE: job.native_state, K.MESSAGE: job.reason,
        K.USER: job.user, K.NATIVE_ID: job.job_id, K.ACCOUNT: job.account, K.HOSTS: ",".join(job.hosts),
        K.NUM_NODES: _text(job.num_nodes), K.NUM_CPUS: _text(job.num_cpus), K.TIME_LIMIT: _text(job.time_limit),
        K.SUBMIT_TIME: job.submit_time, K.START_TIME: job.start_time, K.END_TIME: job.end_time,
    }
    if not submitted:
        values.update({K.NAME: job.name, K.NUM_PROCS: _text(job.num_procs), K.WORKING_DIR: job.work_dir})
    else:
        # where the listing shows none (or a shortened name)
        for name in (K.USER, K.ACCOUNT, K.TIME_LIMIT, K.NUM_NODES, K.NUM_CPUS):
            if values[name] == "":
                del values[name]
    if job.time_used is not None:
        values[K.TIME_USED] = str(job.time_used)
    process: Dict[str, Any] = {K.STATE: state.value, K.NATIVE_STATE: job.native_state}
    if state.final:
        end = {K.EXIT_CODE: _text(job.exit_code), K.SIGNAL: _signal_text(job.signal)}
        values.update(end)
        process.update(end)
    return values, process


def node_values(node: NativeNode) -> Dict[str, str]:
    """A node's attributes (``""``: no value; its number is the caller's)."""
    return {
        K.NAME: node.name, K.STATE: node.state, K.NATIVE_STATE: node.native_state,
        K.CPUS: _text(node.cpus), K.CPUS_USED: _text(node.cpus_used), K.MEMORY: _text(node.memory_mb),
        K.QUEUES: ",".join(node.queues), K.REASON: node.reason,
    }


def queue_values(queue: NativeQueue, is_default: bool) -> Dict[str, str]:
    """A queue's attributes (``""``: no value)."""
    return {
        K.NAME: queue.name, K.STATE: queue.state, K.NATIVE_STATE: queue.native_state,
        K.DEFAULT: "true" if is_default else "false", K.MAX_TIME: _text(queue.max_time),
        K.DEFAULT_TIME: _text(queue.default_time), K.MAX_NODES: _text(queue.max_nodes),
        K.TOTAL_NODES: _text(queue.total_nodes), K.TOTAL_SLOTS: _text(queue.total_slots),
        K.FREE_SLOTS: _text(queue.free_slots), K.HOSTS: ",".join(queue.hosts),
    }


#: Attributes every batch backend shows beyond the standard ones.
DISPLAY_ATTRIBUTES: Tuple[AttrInfo, ...] = (
    AttrInfo(K.VERSION, ValueType.STRING, "Version", "Version of the scheduler installation"),
    AttrInfo(K.NATIVE_STATE, ValueType.STRING, "Native State", "The element's state in the scheduler's own words"),
    AttrInfo(K.NATIVE_ID, ValueType.STRING, "Native Job ID", "The job's id in its scheduler"),
    AttrInfo(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
    AttrInfo(K.CPUS_USED, ValueType.INTEGER, "CPUs Used", "CPUs of the node in use by jobs", default="0"),
    AttrInfo(K.MEMORY, ValueType.INTEGER, "Memory (MB)", "Memory the node has, in megabytes", default="0"),
    AttrInfo(K.QUEUES, ValueType.STRING, "Queues", "Queues of the node, comma-separated"),
    AttrInfo(K.REASON, ValueType.STRING, "Reason", "Why the node is down or failing"),
    AttrInfo(K.DEFAULT, ValueType.BOOLEAN, "Default Queue", "Whether jobs that name no queue go here",
             default="false"),
    AttrInfo(K.MAX_TIME, ValueType.INTEGER, "Maximum Time (s)",
             "Longest wall time a job of the queue may have, in seconds (absent: unlimited)", default="0"),
    AttrInfo(K.TOTAL_NODES, ValueType.INTEGER, "Total Nodes", "Hosts of the queue", default="0"),
    AttrInfo(K.TOTAL_SLOTS, ValueType.INTEGER, "Total Slots", "Processor slots of the queue", default="0"),
    AttrInfo(K.FREE_SLOTS, ValueType.INTEGER, "Free Slots", "Processor slots of the queue not in use",
             default="0"),
    AttrInfo(K.WAITING, ValueType.INTEGER, "Waiting Jobs", "Jobs of the queue waiting to start", default="0"),
    AttrInfo(K.RUNNING, ValueType.INTEGER, "Running Jobs", "Jobs of the queue running", default="0"),
    AttrInfo(K.HOSTS, ValueType.STRING, "Hosts", "Hosts of the queue, or hosts the job runs on"),
    AttrInfo(K.NUM_NODES, ValueType.INTEGER, "Nodes", "Hosts the job uses or asked for", default="0"),
    AttrInfo(K.TIME_USED, ValueType.INTEGER, "Time Used (s)", "Run time so far in seconds", default="0"),
    AttrInfo(K.TIME_LIMIT, ValueType.INTEGER, "Time Limit (s)", "The job's wall-time limit in seconds",
             default="0"),
    AttrInfo(K.ACCOUNT, ValueType.STRING, "Account", "Account or project the job is charged to"),
    AttrInfo(K.EXIT_CODE, ValueType.INTEGER, "Exit Code", "How the job or process ended", default="0"),
)


class BatchBackend(Backend):
    """A backend over one :class:`BatchSystem` (see the module documentation).  A batch
    system's backend is this class with :meth:`make_system` and its options."""

    MAX_GONE_POLLS = 3
    #: jobs put into the model between two checkpoints
    APPLY_CHUNK = 5000

    def __init__(self, model: ServiceModel, options: Any = None, context: Optional[BackendContext] = None, *,
                 retention: float = 60.0, command_timeout: float = 30.0, fast_poll_interval: float = 1.0,
                 fast_poll_duration: float = 10.0, info_interval: Optional[float] = None,
                 node_interval: Optional[float] = None,
                 time_used_interval: float = 60.0,
                 output_interval: float = 0.5, output_drain_grace: float = 1.0, max_backoff: float = 120.0,
                 spool_dir: Optional[str] = None, parse_in_thread_above: int = 256 * 1024,
                 user: Optional[str] = None, runner: Optional[Callable[..., Awaitable[CommandResult]]] = None,
                 system: Optional[BatchSystem] = None) -> None:
        super().__init__(model, options, context)
        self.system = system if system is not None else self.make_system()
        self.poll_interval = max(0.1, float(getattr(self.options, "poll_interval", DEFAULT_POLL_INTERVAL)))
        self.retention = retention
        self.command_timeout = command_timeout
        self.fast_poll_interval = min(fast_poll_interval, self.poll_interval)
        self.fast_poll_duration = fast_poll_duration
        #: seconds between two readings of the queues' definitions (BatchSystem.queue_details)
        self.info_interval = info_interval if info_interval is not None else \
            float(getattr(self.options, "definitions_interval", DEFAULT_DEFINITIONS_INTERVAL))
        #: seconds between two node queries (at most as often as the jobs are polled)
        self.node_interval = node_interval if node_interval is not None else max(60.0, 4 * self.poll_interval)
        self.time_used_interval = time_used_interval
        self.output_interval = output_interval
        self.output_drain_grace = output_drain_grace
        self.max_backoff = max(max_backoff, self.poll_interval)
        #: the share of one core idle polling may take (None: no limit): polls that cost more
        #: are spaced further apart
        self.cpu_budget: Optional[float] = getattr(self.options, "cpu_budget", None)
        self.spool_dir = spool_dir or os.path.join(os.path.expanduser("~"), ".proxy-agent", self.name)
        #: files in the spool directory older than this that no job follows are removed
        self.spool_max_age = common.SPOOL_MAX_AGE
        self.parse_in_thread_above = parse_in_thread_above
        self.user = user or common.current_user()
        #: where the system's commands are (None: found on PATH)
        self.commands_dir: Optional[str] = getattr(self.options, "commands_dir", None)
        self._runner = runner or run_command
        self.version_text = ""
        #: the last failure of a query (None while they work)
        self.last_error: Optional[str] = None
        self._machine: Optional[int] = None
        self._queues: Dict[str, int] = {}
        self._queue_records: Dict[str, NativeQueue] = {}
        #: each queue's definitions as last read by BatchSystem.queue_details
        self._definitions: Dict[str, NativeQueue] = {}
        #: read every queue's definitions at the next poll
        self._definitions_due = False
        self._default: Optional[str] = None
        self._queues_stale = False
        #: whether the queues' job figures may have changed since they were last counted
        self._figures_stale = True
        self._nodes: Dict[str, Tuple[int, NativeNode]] = {}
        self._table = JobTable()
        self._jobs: Dict[str, _Job] = {}
        self._by_element: Dict[int, _Job] = {}
        self._retire: Deque[Tuple[float, str]] = deque()
        self._generation = 0
        self._failures = 0
        self._failing = False
        self._reported: Optional[str] = None
        self._wake = trio.Event()
        self._fast_until = 0.0
        #: submit commands running
        self._submitting = 0
        #: the CPU seconds (the agent's and its commands') of the last polls
        self._poll_costs: Deque[float] = deque(maxlen=3)
        self._nursery: Optional[trio.Nursery] = None

    # ------------------------------------------------------------------ to be given

    def make_system(self) -> BatchSystem:
        raise NotImplementedError

    def submit_attributes(self) -> List[AttrInfo]:
        return []

    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group(f"{cls.summary.split(' (')[0]} ({cls.name})")
        group.add_argument(f"--{cls.name}-poll-interval", dest=f"{cls.name}_poll_interval", type=float,
                           default=None, metavar="SECONDS", help=cls.poll_interval_help())
        cls.add_definitions_argument(group)
        cls.add_commands_argument(group)
        cls.add_more_arguments(group)

    @classmethod
    def add_commands_argument(cls, group) -> None:
        group.add_argument(f"--{cls.name}-commands", dest=f"{cls.name}_commands", metavar="DIR",
                           help="the directory of the scheduler's commands (default: found on PATH; for a host "
                                "where another batch system's commands of the same names come first)")

    #: seconds between two polls unless an option says otherwise
    default_poll_interval: ClassVar[float] = DEFAULT_POLL_INTERVAL

    @classmethod
    def poll_interval_help(cls) -> str:
        return (f"seconds between two polls of the scheduler (default: {cls.default_poll_interval}); without "
                f"this option, idle polls of a long listing are spaced to take at most "
                f"{DEFAULT_CPU_BUDGET * 100:g} %% of a core")

    @classmethod
    def add_definitions_argument(cls, group) -> None:
        group.add_argument(f"--{cls.name}-definitions-interval", dest=f"{cls.name}_definitions_interval", type=float,
                           default=DEFAULT_DEFINITIONS_INTERVAL, metavar="SECONDS",
                           help="seconds between two readings of the queues' definitions (limits) beyond what "
                                "every poll lists, at most 300 (default: %(default)s)")

    @classmethod
    def add_more_arguments(cls, group) -> None:
        """Options of the batch system beyond the poll interval."""

    @classmethod
    def options_from_args(cls, args) -> BatchOptions:
        interval = getattr(args, f"{cls.name}_poll_interval", None)
        budget = DEFAULT_CPU_BUDGET if interval is None else None
        if interval is None:
            interval = cls.default_poll_interval
        if not 0.1 <= interval <= 3600:
            raise ValueError(f"--{cls.name}-poll-interval must be between 0.1 and 3600 seconds, got {interval:g}")
        definitions = getattr(args, f"{cls.name}_definitions_interval", DEFAULT_DEFINITIONS_INTERVAL)
        if not 0.1 <= definitions <= 300:
            raise ValueError(f"--{cls.name}-definitions-interval must be between 0.1 and 300 seconds, "
                             f"got {definitions:g}")
        commands = getattr(args, f"{cls.name}_commands", None)
        if commands is not None and not os.path.isdir(commands):
            raise ValueError(f"--{cls.name}-commands {commands}: no such directory")
        return BatchOptions(poll_interval=interval, definitions_interval=definitions,
                            commands_dir=os.path.abspath(commands) if commands else None, cpu_budget=budget)

    @classmethod
    def default_options(cls) -> BatchOptions:
        return BatchOptions()

    def attributes(self) -> List[AttrInfo]:
        return [*DISPLAY_ATTRIBUTES, *self.submit_attributes()]

    def default_queue(self) -> Optional[int]:
        return self._queues.get(self._default) if self._default is not None else None

    # ------------------------------------------------------------------ commands

    async def run_cmd(self, argv: Sequence[str], stdin: Optional[bytes] = None, check: bool = True,
                      env: Optional[Mapping[str, str]] = None) -> CommandResult:
        if self.commands_dir and "/" not in argv[0]:
            argv = [os.path.join(self.commands_dir, argv[0]), *argv[1:]]
        shown = " ".join(argv[:3])
        try:
            with trio.fail_after(self.command_timeout):
                result = await self._runner(argv, stdin, env if env is not None else self.system.query_env)
        except trio.TooSlowError:
            raise CommandFailed(argv, f"{shown} did not finish within {self.command_timeout:g} s",
                                timed_out=True) from None
        except FileNotFoundError:
            raise CommandFailed(argv, f"{argv[0]}: command not found (is {self.system.label} installed "
                                      "and on PATH?)") from None
        except OSError as exc:
            raise CommandFailed(argv, f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        if check and result.returncode != 0:
            raise CommandFailed(argv, self.system.error_text(result.err)
                                or f"{shown} failed with exit status {result.returncode}")
        return result

    async def _parse(self, parser: Callable[[str], Any], data: bytes) -> Any:
        def work() -> Any:
            return parser(data.decode("utf-8", "replace"))

        if len(data) <= self.parse_in_thread_above:
            return work()
        return await trio.to_thread.run_sync(work, **{_ABANDON: True})

    # ------------------------------------------------------------------ life cycle

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        try:
            self.version_text = await self.system.start(self.run_cmd)
        except ServiceError as exc:
            raise ServiceError(f"cannot use {self.system.label} on this machine: {exc.message}",
                               ErrorKind.UNAVAILABLE) from None
        except ValueError as exc:
            raise ServiceError(f"cannot use {self.system.label} on this machine: {exc}",
                               ErrorKind.UNAVAILABLE) from None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._machine = self.model.add(Kind.MACHINE, None, {
                K.NAME: self.system.machine_name() or self.name, K.STATE: "UNKNOWN", K.NUM_NODES: "0",
                K.VERSION: self.version_text, K.BACKEND: self.name}, owner=self.name)
            self._report(await self._poll(info=True))
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
        # Jobs stay with the scheduler; polling and output followers stop.
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _poke(self) -> None:
        self._fast_until = trio.current_time() + self.fast_poll_duration
        self._wake.set()

    def _delay(self) -> float:
        if self._failures:
            return min(self.poll_interval * 2 ** (self._failures - 1), self.max_backoff)
        if trio.current_time() < self._fast_until:
            return self.fast_poll_interval
        interval = self.poll_interval
        if self.cpu_budget and self._poll_costs:
            # Idle polls are spaced so that they take at most cpu_budget of a core: the cheapest
            # of the last polls' CPU (the agent's and its commands') decides, so that a child
            # of some other part of the agent, reaped meanwhile, does not.
            interval = max(interval, min(min(self._poll_costs) / self.cpu_budget, self.max_backoff))
        return interval

    async def _poll_loop(self) -> None:
        next_info = trio.current_time() + self.info_interval
        next_time_used = trio.current_time() + self.time_used_interval
        next_nodes = trio.current_time() + self.node_interval
        began = trio.current_time()
        while True:
            # Polls start one interval apart (not an interval after the last one ended), so a
            # job's end reaches the client within one interval plus one poll's own time.
            with trio.move_on_at(began + self._delay()):
                await self._wake.wait()
            self._wake = trio.Event()
            began = trio.current_time()
            cpu = _cpu_seconds()
            info = trio.current_time() >= next_info or self._definitions_due
            self._definitions_due = False
            nodes = self._queues_stale or trio.current_time() >= next_nodes
            self._queues_stale = False
            try:
                errors = await self._poll(info=info, nodes=nodes)
                if trio.current_time() >= next_time_used:
                    self._refresh_time_used()
                    next_time_used = trio.current_time() + self.time_used_interval
                self._retire_due()
            except Exception as exc:  # noqa: BLE001 - one bad poll must not end the agent
                log.exception("polling %s failed", self.system.label)
                errors = [f"internal error while polling: {type(exc).__name__}: {exc}"]
            self._poll_costs.append(_cpu_seconds() - cpu)
            self._report(errors)
            if info:
                next_info = trio.current_time() + self.info_interval
            if nodes:
                next_nodes = trio.current_time() + self.node_interval

    async def _poll(self, *, info: bool, nodes: bool = False) -> List[str]:
        results: Dict[str, Any] = {}
        errors: Dict[str, str] = {}
        system = self.system

        self._generation += 1
        generation = self._generation
        user = None if self.context.all_users else self.user

        async def fetch(what: str) -> None:
            try:
                answer = await system.fetch(what, user, self.run_cmd, self._parse)
            except ServiceError as exc:
                errors[what] = exc.message
            except ValueError as exc:
                errors[what] = f"unreadable answer of the {what} query: {exc}"
            else:
                if answer is not None:
                    results[what] = answer

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch, "queues")
            if info or nodes:
                nursery.start_soon(fetch, "nodes")
            nursery.start_soon(fetch, "jobs")
        if "queues" in results:
            await self._apply_queues(results["queues"], reread=info)
        if "nodes" in results:
            self._apply_nodes(results["nodes"])
        if "jobs" in results:
            try:
                if await self._apply_listing(results["jobs"], generation):
                    self._figures_stale = True
            except ServiceError as exc:
                errors["final states"] = exc.message
            if self._figures_stale:
                self._update_figures()
        self._failing = bool(errors)
        self._update_machine()
        return list(dict.fromkeys(errors.values()))

    def _report(self, errors: List[str]) -> None:
        label = self.system.label
        if errors:
            self._failures += 1
            text = "; ".join(errors)
            self.last_error = text
            if text != self._reported:
                self._reported = text
                log.warning("%s query failed (retrying in %g s): %s", label, self._delay(), text)
                self._notify("ERROR", f"{label} query failed (retrying): {text}")
        elif self._failures:
            log.info("%s answers again after %d failed polls", label, self._failures)
            self._definitions_due = True  # it may have restarted with other definitions
            self._notify("INFO", f"{label} answers again")
            self._failures = 0
            self.last_error = self._reported = None

    def _notify(self, level: str, text: str) -> None:
        try:
            self.context.notify(level, text)
        except Exception:  # noqa: BLE001 - reporting must not break polling
            log.exception("a notice could not be delivered")

    def _update_machine(self) -> None:
        if self._machine is None:
            return
        if self._failing:
            state = "ERROR"
        elif not self._nodes:
            state = "UNKNOWN"
        else:
            up = sum(1 for _key, node in self._nodes.values() if node.state == "UP")
            state = "UP" if up == len(self._nodes) else ("ALERT" if up else "DOWN")
        self.model.update(self._machine, {K.STATE: state, K.NUM_NODES: str(len(self._nodes)),
                                          K.NAME: self.system.machine_name() or self.name})

    def _set(self, key: int, values: Mapping[str, Any]) -> None:
        """Update an element; an empty value clears an attribute only if it was ever set."""
        model = self.model
        model.update(key, {k: (v if v != "" else None) for k, v in values.items()
                           if v != "" or model.attr(key, k) is not None})

    # ------------------------------------------------------------------ queues and nodes

    async def _apply_queues(self, queues: List[NativeQueue], reread: bool = False) -> None:
        listed = {q.name: q for q in queues if q.name}
        definitions = self._definitions
        for name in [n for n in definitions if n not in listed]:
            del definitions[name]
        unread = [q for name, q in listed.items() if reread or name not in definitions]
        if unread:
            try:
                definitions.update(await self.system.queue_details(unread, self.run_cmd))
            except (ServiceError, ValueError) as exc:
                log.info("%s queue details unavailable: %s", self.system.label, exc)
        fields = self.system.detail_fields
        if fields:
            listed = {name: attrs.evolve(q, **{f: getattr(definitions[name], f) for f in fields})
                      if name in definitions else q for name, q in listed.items()}
        default = next((q.name for q in listed.values() if q.is_default), None) or next(iter(listed), None)
        with self.model.batch():
            for name, queue in listed.items():
                values = queue_values(queue, name == default)
                if queue.free_slots is None:
                    del values[K.FREE_SLOTS]  # counted from the jobs (_update_figures)
                key = self._queues.get(name)
                if key is None:
                    values[K.BACKEND] = self.name
                    self._queues[name] = self.model.add(Kind.QUEUE, None, {k: v for k, v in values.items() if v},
                                                        owner=self.name)
                else:
                    self._set(key, values)
            for name, key in list(self._queues.items()):
                if name not in listed and not self.model.children(key):
                    self.model.remove(key)
                    del self._queues[name]
        if listed != self._queue_records:
            self._figures_stale = True  # the scheduler's own figures may have changed
        self._queue_records = listed
        self._default = default

    def _queue_for(self, name: str, current: Optional[int] = None) -> int:
        """The queue of a job; one pending in several (``a,b``) is shown in the first known."""
        names = [n for n in name.split(",") if n]
        for each in names:
            key = self._queues.get(each)
            if key is not None:
                return key
        if current is not None:
            return current
        name = names[0] if names else ""
        if not name:
            default = self.default_queue()
            if default is not None:
                return default
            name = "unknown"
        key = self._queues.get(name)
        if key is None:
            key = self._queues[name] = self.model.add(
                Kind.QUEUE, None, {K.NAME: name, K.STATE: "NORMAL", K.BACKEND: self.name}, owner=self.name)
            self._queues_stale = True  # a queue the last listing lacked: asked again
        return key

    def _apply_nodes(self, nodes: List[NativeNode]) -> None:
        assert self._machine is not None
        model = self.model
        listed: Set[str] = set()
        with model.batch():
            for number, node in enumerate(nodes):
                if not node.name or node.name in listed:
                    continue
                listed.add(node.name)
                values = node_values(node)
                known = self._nodes.get(node.name)
                if known is None:
                    values[K.NUMBER] = str(len(self._nodes))
                    key = model.add(Kind.NODE, self._machine, {k: v for k, v in values.items() if v},
                                    owner=self.name)
                    self._nodes[node.name] = (key, node)
                elif known[1] != node:
                    self._set(known[0], values)
                    self._nodes[node.name] = (known[0], node)
            for name in [n for n in self._nodes if n not in listed]:
                model.remove(self._nodes.pop(name)[0])

    def _update_figures(self) -> None:
        """waitingJobs/runningJobs of each queue: the scheduler's counts when it gives them,
        else the listed jobs'; freeSlots from the scheduler, else total less running slots."""
        self._figures_stale = False
        counts: Dict[int, List[int]] = {key: [0, 0, 0] for key in self._queues.values()}
        for tracked in self._jobs.values():
            if tracked.completed:
                continue
            record = self._table.record(tracked.native_id)
            if record is None:
                continue
            state = self.system.job_state(record)
            figures = counts.get(tracked.queue)
            if figures is None:
                continue
            if state is JobState.QUEUING:
                figures[0] += 1
            elif state in (JobState.RUNNING, JobState.FINISHING):
                figures[1] += 1
                figures[2] += record.num_procs or 1
        records = {self._queues[name]: q for name, q in self._queue_records.items() if name in self._queues}
        with self.model.batch():
            for key, (waiting, running, used) in counts.items():
                queue = records.get(key)
                values = {K.WAITING: str(waiting), K.RUNNING: str(running)}
                if queue is not None:
                    if queue.waiting is not None:
                        values[K.WAITING] = str(queue.waiting)
                    if queue.running is not None:
                        values[K.RUNNING] = str(queue.running)
                    if queue.free_slots is None and queue.total_slots is not None:
                        values[K.FREE_SLOTS] = str(max(0, queue.total_slots - used))
                self.model.update(key, values)

    # ------------------------------------------------------------------ jobs

    def _job_values(self, job: NativeJob, tracked: Optional[_Job]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        return job_values(self.system, job, submitted=tracked is not None and tracked.submitted)

    def _node_of(self, job: NativeJob) -> Optional[int]:
        host = self.system.first_host(job)
        known = self._nodes.get(host) if host else None
        return known[0] if known is not None else None

    async def _apply_listing(self, jobs: List[NativeJob], generation: int) -> bool:
        """Apply a listing; whether it changed anything."""
        changes = self._table.apply(jobs, generation)
        added = changes.added
        if self._submitting and added:
            # A job of this user new to the listing while a submit command runs may be that
            # submission's: it is left to the next listing, when the submission has named its
            # job (else it would show as somebody's job, then be taken over as the submitted one).
            mine = [job for job in added if not job.user or job.user == self.user]
            for job in mine:
                self._table.forget(job.job_id)
            added = [job for job in added if job.user and job.user != self.user]
        fresh = added + changes.changed
        if fresh:
            try:
                fresh = await self.system.explain(fresh, self.run_cmd)
            except (ServiceError, ValueError) as exc:
                log.info("%s could not say more about %d jobs: %s", self.system.label, len(fresh), exc)
            for start in range(0, len(fresh), self.APPLY_CHUNK):
                with _gc_paused(), self.model.batch():
                    for job in fresh[start:start + self.APPLY_CHUNK]:
                        self._apply_job(job)
                await trio.lowlevel.checkpoint()
        if changes.gone:
            await self._finish_gone(changes.gone)
        return bool(changes)

    def _apply_job(self, job: NativeJob) -> None:
        tracked = self._jobs.get(job.job_id)
        if tracked is None:
            self._add_job(job)
        else:
            self._update_job(tracked, job)

    def _add_job(self, job: NativeJob) -> None:
        model = self.model
        queue = self._queue_for(job.queue)
        values, process = self._job_values(job, None)
        values[K.QUEUE] = queue
        key = model.add(Kind.JOB, queue, {k: v for k, v in values.items() if v != ""}, owner=self.name)
        node = self._node_of(job)
        if node is not None:
            process[K.NODE] = node
        pid = model.add(Kind.PROCESS, key, {k: v for k, v in process.items() if v != ""}, owner=self.name)
        tracked = _Job(job.job_id, key, pid, queue, node=node)
        self._jobs[job.job_id] = tracked
        self._by_element[key] = tracked
        if self.system.job_state(job).final:
            self._completed(tracked)

    def _update_job(self, tracked: _Job, job: NativeJob) -> None:
        model = self.model
        if tracked.element not in model:
            return
        state = self.system.job_state(job)
        if tracked.deleted and not _started(state) and self._shown_ended(tracked):
            return  # a listing made before it was deleted: a deleted job does not wait again
        queue = self._queue_for(job.queue, tracked.queue)
        if queue != tracked.queue:
            model.move(tracked.element, queue)
            tracked.queue = queue
        values, process = self._job_values(job, tracked)
        values[K.QUEUE] = queue
        if not job.hosts and state not in (JobState.QUEUING, JobState.HOLD):
            # A record of a job that ran or ends without its hosts (PBS blanks them at the end
            # unless it keeps job history) does not say it had none: what was shown stays.
            del values[K.HOSTS]
        node = self._node_of(job)
        if node is not None:
            tracked.node = process[K.NODE] = node
        if state.final and tracked.followers:
            # Output is still being read: the end shows after it.
            tracked.held = ({k: values.pop(k) for k in _FINAL_KEYS if k in values},
                            {k: process.pop(k) for k in _FINAL_KEYS if k in process})
            values[K.STATE] = process[K.STATE] = JobState.FINISHING.value
        elif not state.final:
            tracked.held = None
        self._set(tracked.process, process)  # the process first: a job ends after its process
        self._set(tracked.element, values)
        if _started(state) and tracked.started is not None:
            tracked.started.set()
        if state.final and not tracked.completed:
            self._completed(tracked)
        elif not state.final and tracked.completed:
            tracked.completed = False  # rescheduled: back under the same id
            tracked.retire_at = None

    def _completed(self, tracked: _Job) -> None:
        self._figures_stale = True
        tracked.completed = True
        tracked.retire_at = trio.current_time() + self.retention
        self._retire.append((tracked.retire_at, tracked.native_id))
        if tracked.done is not None:
            tracked.done.set()

    def _retire_due(self) -> None:
        now = trio.current_time()
        while self._retire and self._retire[0][0] <= now:
            at, native_id = self._retire.popleft()
            tracked = self._jobs.get(native_id)
            if tracked is None or not tracked.completed or tracked.retire_at != at or tracked.followers:
                continue
            del self._jobs[native_id]
            self._by_element.pop(tracked.element, None)
            if tracked.element in self.model:
                self.model.remove(tracked.element)
            self._table.retire(native_id)
            self._figures_stale = True
            self._remove_spool(tracked)

    @staticmethod
    def _remove_spool(tracked: _Job) -> None:
        for path in tracked.spool_files:
            try:
                os.unlink(path)
            except OSError:
                pass
        tracked.spool_files = ()

    def _refresh_time_used(self) -> None:
        """Time used of running jobs: a listing that changes nothing else does not touch the
        model, so the clock is brought up to date here, once every ``time_used_interval``."""
        model = self.model
        with model.batch():
            for tracked in self._jobs.values():
                if tracked.completed:
                    continue
                record = self._table.record(tracked.native_id)
                if record is not None and record.time_used and tracked.element in model:
                    model.update(tracked.element, {K.TIME_USED: str(record.time_used)})

    async def _finish_gone(self, gone: List[str]) -> None:
        """Jobs the listing no longer shows: their end from the system's accounting."""
        # An array job lives on while the listing shows any of its tasks.
        arrays = {record.array_id for record in self._table.records() if record.array_id}
        todo: List[_Job] = []
        for native_id in gone:
            tracked = self._jobs.get(native_id)
            if tracked is None or tracked.completed:
                continue
            if native_id in arrays:
                self._table.expect(native_id, self._generation)
                continue
            todo.append(tracked)
        if not todo:
            return
        try:
            found: Dict[str, Optional[NativeJob]] = await self.system.final_records(
                [t.native_id for t in todo], self.run_cmd)
            failed = False
        except (ServiceError, ValueError) as exc:
            log.info("cannot look up how %d %s jobs ended: %s", len(todo), self.system.label, exc)
            found, failed = {}, True
        for tracked in todo:
            native_id = tracked.native_id
            record = found.get(native_id)
            if record is not None:
                self._update_job(tracked, record)
                if not self.system.job_state(record).final:
                    # Still there, although the listing left it out: looked up again.
                    self._table.expect(native_id, self._generation)
                continue
            tracked.gone_polls += 1
            if native_id not in found and tracked.gone_polls < self.MAX_GONE_POLLS:
                self._table.expect(native_id, self._generation)  # asked again after the next listing
                continue
            why = ("the accounting lookup kept failing" if failed else "it has no record of how it ended")
            message = f"{self.system.label} no longer lists the job and {why}"
            state = JobState.DELETED
            if tracked.deleted:
                state, message = JobState.KILLED, f"deleted on request; {message}"
            values = {K.STATE: state.value, K.NATIVE_STATE: "UNKNOWN"}
            if tracked.followers:
                tracked.held = ({**values, K.MESSAGE: message}, dict(values))
                values = {K.STATE: JobState.FINISHING.value}
            with self.model.batch():
                self._set(tracked.process, values)
                self._set(tracked.element, {**values, K.MESSAGE: message} if not tracked.followers else values)
            if not tracked.completed:
                self._completed(tracked)

    def _tracked(self, job: int) -> _Job:
        tracked = self._by_element.get(job)
        if tracked is None:
            raise JobError(f"the job is not a {self.system.label} job this agent follows", ErrorKind.NO_SUCH_JOB)
        return tracked

    # ------------------------------------------------------------------ submission

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> int:
        if not spec.executable:
            raise SubmitError("the submission names no program", ErrorKind.BAD_REQUEST)
        name = self.model.attr(queue, K.NAME)
        if not isinstance(name, str) or not name:
            raise SubmitError("the queue has no name", ErrorKind.NO_SUCH_QUEUE)
        spec = _batch_settings(spec)
        base = spec.working_dir or os.getcwd()
        spool: List[str] = []
        stdout, stderr = spec.stdout_path or None, spec.stderr_path or None
        if stdout is not None and stderr is None:
            stderr = self.system.stderr_default(stdout)
        if stdout is None or stderr is None:
            out, err = self._spool_paths(spec.client_ref or spec.display_name)
            if stdout is None:
                stdout = self.system.literal_path(out)
                spool.append(out)
            if stderr is None:
                stderr = self.system.literal_path(err)
                spool.append(err)
        spec = attrs.evolve(spec, queue=name, stdout_path=stdout, stderr_path=stderr)
        argv, stdin = self.system.submit_command(spec)
        named = {"stdout": stdout}
        if stderr != stdout:
            named["stderr"] = stderr
        # Files left by an earlier run under the same names are not this job's output.
        stale = {stream: _signature(os.path.join(base, path)) for stream, path in named.items()}
        self._submitting += 1
        try:
            # The submit command may pass its environment to the job.
            result = await self.run_cmd(argv, stdin=stdin, check=False, env=dict(os.environ))
        except CommandFailed as exc:
            message = exc.message + ("; the job may or may not have been submitted" if exc.timed_out else "")
            raise SubmitError(message, ErrorKind.UNAVAILABLE) from None
        finally:
            self._submitting -= 1
        native_id = self.system.parse_submitted(result)
        follow = {}
        for stream, path in named.items():
            found = self.system.follow_path(path, native_id, spec, self.user)
            if found is None:
                log.info("cannot follow %s of %s job %s: %r is expanded by %s", stream, self.system.label,
                         native_id, path, self.system.label)
                continue
            follow[stream] = os.path.join(base, found)
            if found != path:
                stale[stream] = None
        tracked = self._register(native_id, spec, queue, key, submitted=True)
        tracked.spool_files = tuple(spool)
        tracked.paths = dict(follow)
        self._start_followers(tracked, {stream: (0, stale[stream]) for stream in follow})
        self._poke()
        log.info("submitted %s as %s job %s (key %d)", spec.display_name, self.system.label, native_id,
                 tracked.element)
        return tracked.element

    def _register(self, native_id: str, spec: JobSpec, queue: int, key: Optional[int], *, submitted: bool,
                  values: Optional[Dict[str, Any]] = None) -> _Job:
        model = self.model
        attrs_: Dict[str, Any] = {
            K.CLIENT_REF: spec.client_ref, K.NAME: spec.display_name, K.NATIVE_ID: native_id, K.USER: self.user,
            K.NUM_PROCS: str(spec.num_procs), K.EXECUTABLE: spec.executable,
        }
        if spec.arguments:
            attrs_[K.ARGUMENTS] = spec.arguments
        if spec.working_dir:
            attrs_[K.WORKING_DIR] = spec.working_dir
        if spec.account:
            attrs_[K.ACCOUNT] = spec.account
        if spec.wall_time:
            attrs_[K.TIME_LIMIT] = str(spec.wall_time)
        tracked = self._jobs.get(native_id)
        if tracked is not None:  # listed before the submit command answered
            tracked.submitted = submitted
            self._set(tracked.element, attrs_)
            return tracked
        state = JobState.HOLD if spec.hold else JobState.QUEUING
        first = {K.STATE: state.value, K.NATIVE_STATE: self.system.submitted_state}
        first.update(values or {})
        attrs_.update(first)
        attrs_[K.QUEUE] = queue
        with model.batch():
            element = model.add(Kind.JOB, queue, {k: v for k, v in attrs_.items() if v not in ("", None)},
                                owner=self.name, key=key)
            process = model.add(Kind.PROCESS, element, {k: v for k, v in first.items() if k in (
                K.STATE, K.NATIVE_STATE, K.EXIT_CODE, K.SIGNAL) and v}, owner=self.name)
        tracked = _Job(native_id, element, process, queue, submitted=submitted)
        self._figures_stale = True
        self._jobs[native_id] = tracked
        self._by_element[element] = tracked
        self._table.expect(native_id, self._generation)
        return tracked

    def _spool_paths(self, label: str) -> Tuple[str, str]:
        try:
            os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SubmitError(f"cannot create the output directory {self.spool_dir}: {exc.strerror or exc}") from None
        stem = os.path.join(self.spool_dir, f"{_SAFE_NAME.sub('_', label)[:80] or 'job'}.{secrets.token_hex(4)}")
        return stem + ".out", stem + ".err"

    def job_extra(self, job: int) -> Dict[str, Any]:
        tracked = self._by_element.get(job)
        if tracked is None:
            return {}
        return {"paths": dict(tracked.paths), "spool": list(tracked.spool_files)}

    # ------------------------------------------------------------------ adoption

    def adopt(self, stored) -> List[int]:
        """Follow again the jobs an earlier agent submitted here, by their native ids:

        * a job still listed goes on from its record, under its stored key (also when the
          first listing showed it under a key of its own);
        * one no longer listed and not known to have ended is reported gone by the next
          poll, which asks the system's accounting how it ended;
        * one no longer listed whose end was recorded shows that end (state, exit status).

        Output files are read on from where delivery to a client stopped, and an end is
        shown after the output, as for a job submitted here.  A record without a native id
        (the agent ended before the submit command answered) is shown DELETED, saying so."""
        adopted: List[int] = []
        for record in stored:
            spec = record.job_spec
            if spec is None or record.key in self.model:
                continue
            try:
                if record.native_id:
                    self._adopt_job(record, spec)
                else:
                    self._adopt_unsubmitted(record, spec)
            except Exception:  # noqa: BLE001 - one bad record must not keep the others out
                log.exception("cannot adopt stored job %s (%s job %r)", record.key, self.system.label,
                              record.native_id)
                continue
            adopted.append(record.key)
        if adopted:
            self._poke()
        return adopted

    def _stored_queue(self, record) -> int:
        return self._queue_for(record.queue.partition(":")[2] or record.queue)

    def _adopt_unsubmitted(self, record, spec: JobSpec) -> None:
        values = {K.STATE: JobState.DELETED.value, K.NATIVE_STATE: "UNKNOWN"}
        message = (f"the agent ended before {self.system.submit_program} answered: whether {self.system.label} "
                   f"took the job is not known (look for a job named {record.name!r})")
        queue = self._stored_queue(record)
        with self.model.batch():
            element = self.model.add(Kind.JOB, queue, {
                K.CLIENT_REF: record.client_ref or spec.client_ref, K.NAME: record.name or spec.display_name,
                K.USER: self.user, K.EXECUTABLE: spec.executable, K.QUEUE: queue, K.MESSAGE: message, **values},
                owner=self.name, key=record.key)
            self.model.add(Kind.PROCESS, element, dict(values), owner=self.name)

    def _adopt_job(self, record, spec: JobSpec) -> None:
        native_id = record.native_id
        listed = self._jobs.get(native_id)
        if listed is not None:
            # The first listing showed it as anybody's job: it becomes the stored one.
            del self._jobs[native_id]
            self._by_element.pop(listed.element, None)
            self.model.remove(listed.element)
        current = self._table.record(native_id)
        queue = self._queue_for(current.queue) if current is not None else (
            listed.queue if listed is not None else self._stored_queue(record))
        try:
            state = JobState(record.state)
        except ValueError:
            state = JobState.QUEUING  # the submission was recorded, no state yet
        final = state.final and record.ended is not None
        values = {K.STATE: JobState.FINISHING.value if final else state.value,
                  K.NATIVE_STATE: record.native_state or self.system.submitted_state}
        tracked = self._register(native_id, spec, queue, record.key, submitted=True, values=values)
        extras = record.extras
        paths = extras.get("paths", extras.get("outputs"))
        paths = paths if isinstance(paths, dict) else {}
        tracked.paths = {s: p for s, p in paths.items() if s in ("stdout", "stderr") and isinstance(p, str)}
        tracked.spool_files = tuple(p for p in extras.get("spool", ()) if isinstance(p, str))
        if current is not None:
            # the system's word, as in every listing (an end waits for the output)
            self._start_followers(tracked, self._delivered(record, tracked))
            self._update_job(tracked, current)
            return
        if final:
            end = {K.STATE: state.value, K.NATIVE_STATE: record.native_state,
                   K.EXIT_CODE: getattr(record, "exit_code", ""), K.SIGNAL: getattr(record, "signal", "")}
            job_end = {**end, K.MESSAGE: record.message or ""}
            self._table.retire(native_id)
            self._completed(tracked)
            if tracked.paths and self._nursery is not None:
                tracked.held = (job_end, end)
            else:
                with self.model.batch():
                    self._set(tracked.process, end)
                    self._set(tracked.element, job_end)
        self._start_followers(tracked, self._delivered(record, tracked))
        if tracked.started is not None:
            # Gone from the listing while no agent ran: it has started (or ended), so its
            # output is read while the next poll looks up how it ended.
            tracked.started.set()

    @staticmethod
    def _delivered(record, tracked: _Job) -> Dict[str, Tuple[int, Optional[tuple]]]:
        delivered = record.delivered_offsets
        return {s: (delivered.get(f"0.{s}", 0), None) for s in tracked.paths}

    # ------------------------------------------------------------------ output

    def _start_followers(self, tracked: _Job, streams: Dict[str, Tuple[int, Optional[tuple]]]) -> None:
        if self._nursery is None:
            return
        tracked.started = trio.Event()
        tracked.done = trio.Event()
        state = self.model.attr(tracked.element, K.STATE)
        try:
            parsed = JobState(state) if isinstance(state, str) else JobState.UNDEFINED
        except ValueError:
            parsed = JobState.UNDEFINED
        if _started(parsed):
            tracked.started.set()
        if tracked.completed:
            tracked.done.set()
        for stream, (offset, stale) in streams.items():
            tracked.followers += 1
            self._nursery.start_soon(self._follow, tracked, tracked.paths[stream], stream, offset, stale)
        if not streams and tracked.completed:
            self._remove_spool(tracked)

    async def _follow(self, tracked: _Job, path: str, stream: str, offset: int, stale: Optional[tuple]) -> None:
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

    async def _follow_file(self, tracked: _Job, path: str, stream: str, offset: int, stale: Optional[tuple]) -> None:
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

    # ------------------------------------------------------------------ job commands

    async def _job_command(self, job: int, op: str, queue: str = "") -> _Job:
        tracked = self._tracked(job)
        label = self.system.label
        if (tracked.completed or self._shown_ended(tracked)) and not self.system.commands_after_end:
            raise JobError(f"{label} job {tracked.native_id} has ended already", ErrorKind.OPERATION_FAILED)
        record = self._table.record(tracked.native_id) or NativeJob(
            tracked.native_id, native_state=str(self.model.attr(tracked.element, K.NATIVE_STATE) or ""))
        argv = self.system.job_command(op, record, queue)
        try:
            result = await self.run_cmd(argv, check=False)
        except CommandFailed as exc:
            raise JobError(f"cannot {op} {label} job {tracked.native_id}: {exc.message}", ErrorKind.UNAVAILABLE) from None
        finally:
            self._poke()
        self.system.check_job_command(op, tracked.native_id, argv, result)
        return tracked

    async def terminate(self, job: int) -> None:
        tracked = await self._job_command(job, "delete")
        tracked.deleted = True
        self._ended_before_start(tracked)

    def _shown_ended(self, tracked: _Job) -> bool:
        """The model shows the job ended (deleted before it started, before a poll said so)."""
        state = self.model.attr(tracked.element, K.STATE) if tracked.element in self.model else None
        return state in _FINAL_STATE_NAMES

    def _ended_before_start(self, tracked: _Job) -> None:
        """A job the scheduler has deleted before it ran will never run: it is KILLED now (and
        so in the job store), not at the next poll, which an agent that ends first never
        makes.  The next poll still asks the scheduler how it ended, which may say more (a
        job held in an error state FAILED, and why)."""
        state = self.model.attr(tracked.element, K.STATE) if tracked.element in self.model else None
        try:
            current = JobState(state) if isinstance(state, str) else None
        except ValueError:
            current = None
        if current is None or current.final or _started(current) or tracked.completed:
            return
        with self.model.batch():
            self._set(tracked.process, {K.STATE: JobState.KILLED.value})
            self._set(tracked.element, {K.STATE: JobState.KILLED.value, K.MESSAGE: "deleted on request before it started"})

    async def hold(self, job: int, held: bool) -> None:
        await self._job_command(job, "hold" if held else "release")

    async def suspend(self, job: int, suspended: bool) -> None:
        await self._job_command(job, "suspend" if suspended else "resume")

    async def move(self, job: int, queue: int) -> None:
        tracked = self._tracked(job)
        if queue == tracked.queue:
            return
        name = self.model.attr(queue, K.NAME)
        if not isinstance(name, str) or not name:
            raise JobError("the queue has no name", ErrorKind.NO_SUCH_QUEUE)
        await self._job_command(job, "move", name)
        if tracked.element in self.model:
            with self.model.batch():
                self.model.move(tracked.element, queue)
                tracked.queue = queue
                self.model.update(tracked.element, {K.QUEUE: queue})
                self._figures_stale = True


# --------------------------------------------------------------------------- helpers


#: Batch settings a front-end may pass only by name (in ``extra``): name -> JobSpec field.
_EXTRA_FIELDS = {"gpus": "gpus", "gres": "gres", "qos": "qos", "constraint": "constraint",
                 "exclusive": "exclusive", "array": "array", "prologue": "prologue",
                 "nativeOptions": "native_options"}


def _batch_settings(spec: JobSpec) -> JobSpec:
    """The spec with batch settings a front-end left in ``extra`` moved into their fields."""
    changes: Dict[str, Any] = {}
    for name, value in spec.extra:
        field = _EXTRA_FIELDS.get(name)
        if field is None or value == "" or getattr(spec, field) not in (None, False, ()):
            continue
        if field == "gpus":
            if not value.strip().isdigit():
                raise SubmitError(f"gpus must be a whole number, got {value!r}", ErrorKind.BAD_REQUEST)
            changes[field] = int(value)
        elif field == "exclusive":
            changes[field] = value.strip().lower() in ("true", "yes", "1")
        elif field in ("prologue", "native_options"):
            changes[field] = tuple(line for line in value.split("\n") if line.strip()) if field == "prologue" \
                else tuple(value.split())
        else:
            changes[field] = value
    return attrs.evolve(spec, **changes) if changes else spec


def _signature(path: str) -> Optional[tuple]:
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
