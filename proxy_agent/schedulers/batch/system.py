"""What a batch system is to the engine: its commands as argv lists, the parsers of their
answers into the neutral records of :mod:`.records`, its state table and its submission
dialect (:class:`BatchSystem`); and how a command is run (:func:`run_command`)."""


import abc
from typing import Any, Awaitable, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import trio

from ...service.jobs import ErrorKind, JobSpec, JobState, ServiceError, StateTable
from .records import NativeJob, NativeNode, NativeQueue

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

