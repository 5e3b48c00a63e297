"""A JOB_CREATE's attributes -> a neutral job request, and job states -> Invoke Server statuses.

Pure: no I/O.  The one look-up this needs from the machine (where ``mpirun`` is) comes in as
a function, and relative paths are made absolute against a directory the caller names.

How each attribute is honoured (names as the client sends them; the mandatory ones are those
the protocol document's table marks so, and a JOB_CREATE missing one fails naming it):

=====================  ====================================================================
``executable_path``    the program (must be an absolute path)
``argument``           one argument per line, in order (at least one line: it is mandatory)
``count``              NORMAL: how many copies of the program run (``JobSpec.num_procs``);
                       MPI/BLACS: the number of MPI processes (``mpirun -np COUNT``)
``backend``            ``NORMAL``; ``MPI`` and ``BLACS`` run the program through the site's
                       ``mpirun`` (found on PATH, or named by the ``mpirun`` option); without
                       one the request fails naming what is missing
``staging``            ``true``: the program is copied to the job's side first (here: into a
                       fresh directory under ``tmp_dir``) and made executable; see
                       :meth:`InvokeJob.spec_for`
``work_directory``     the job's working directory
``environment``        one variable per line, ``NAME=VALUE``, or ``NAME`` for an empty value
``redirect_enable``    ``true``: the job's stdout and stderr go into ``stdout_file`` and
                       ``stderr_file`` (a stream without a file is discarded)
``queue_name``         the queue (wins over the ``queue`` option)
``max_wall_time``      wall-clock limit in minutes -> ``JobSpec.wall_time`` in seconds
``max_time``           the same, used when ``max_wall_time`` is absent (0 means no limit)
``max_cpu_time``       minutes; kept in ``JobSpec.extra`` as ``cpu_time`` (seconds)
``project``            ``JobSpec.account``
``host_count``         ``JobSpec.nodes``
``max_memory``         megabytes, ``JobSpec.memory``
``tmp_dir``            where staged programs go
``hostname``, ``port``, ``client_name``, ``status_polling``, ``refresh_credential``:
                       checked (they are mandatory) and logged; they change nothing here
=====================  ====================================================================

The unit of the time limits is not given by the protocol document; Ninf-G hands them over
from its ``job_maxTime``/``job_maxWallTime``/``job_maxCpuTime`` settings, which follow the
GRAM job description, where they count minutes.

Every other attribute is ignored (the protocol asks for that).  An attribute given twice
keeps its last value, except ``argument`` and ``environment``, which add up.

The client also forwards each ``invoke_server_option`` string of its configuration verbatim,
as one more attribute line.  These options are read here (``NAME VALUE``, as in
``invoke_server_option "queue debug"``):

=====================  ====================================================================
``scheduler NAME``     the scheduler to submit to (``local``, ``slurm``, ...); with a queue
                       it makes ``JobSpec.queue`` ``NAME:QUEUE``, and it is kept in
                       ``JobSpec.extra`` as ``scheduler``
``queue Q[,Q...]``     one queue, or several candidates for the broker to choose from
``broker NAME``        the broker that ranks the candidates (``JobSpec.broker``)
``mpirun PATH``        the ``mpirun`` to start MPI and BLACS jobs with
=====================  ====================================================================

Options absent from a request fall back to :class:`InvokeDefaults` (the server's command
line).
"""

from __future__ import annotations

import enum
import posixpath
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

from ...service.jobs import JobSpec, JobState
from .protocol import InvokeStatus

__all__ = [
    "Backend",
    "BadJobRequest",
    "InvokeDefaults",
    "InvokeJob",
    "MANDATORY_ATTRIBUTES",
    "MAX_COUNT",
    "STATUS_OF_STATE",
    "invoke_status",
    "job_from_attributes",
]

#: The attributes every JOB_CREATE must carry (the protocol document's table).
MANDATORY_ATTRIBUTES = (
    "hostname",
    "port",
    "client_name",
    "executable_path",
    "backend",
    "count",
    "staging",
    "argument",
    "redirect_enable",
    "status_polling",
    "refresh_credential",
)

#: Largest ``count`` accepted.
MAX_COUNT = 65536
#: Largest time limit accepted, in minutes (a year).
_MAX_MINUTES = 366 * 24 * 60

_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


class Backend(enum.Enum):
    """How the program is started."""

    NORMAL = "NORMAL"
    MPI = "MPI"
    BLACS = "BLACS"

    @property
    def uses_mpirun(self) -> bool:
        return self is not Backend.NORMAL


class BadJobRequest(ValueError):
    """A JOB_CREATE that cannot become a job; the message names the attribute at fault."""


@attrs.frozen
class InvokeDefaults:
    """Settings a JOB_CREATE may leave out: from the server's command line."""

    scheduler: Optional[str] = None
    #: one queue, or several separated by commas (candidates for the broker)
    queue: Optional[str] = None
    broker: Optional[str] = None
    mpirun: Optional[str] = None


@attrs.frozen
class InvokeJob:
    """One JOB_CREATE, understood: the job to submit and what :class:`JobSpec` cannot say."""

    request_id: str
    #: the job with the program as the client named it (see :meth:`spec_for`)
    spec: JobSpec
    #: the program (the Ninf-G Executable) as the client named it
    program: str
    arguments: Tuple[str, ...]
    backend: Backend
    count: int
    #: the program must be copied to the job's side before the job starts
    staging: bool
    #: where staged copies go (None: the system's temporary directory)
    tmp_dir: Optional[str]
    #: the ``mpirun`` that starts MPI and BLACS jobs (None for NORMAL)
    mpirun: Optional[str]
    #: the scheduler asked for (option or default), None for the service's choice
    scheduler: Optional[str]
    hostname: str
    port: int
    client_name: str
    status_polling: int
    #: names of the attributes that had no effect (unknown ones included), in the order
    #: first sent, for the log
    ignored: Tuple[str, ...] = ()

    def spec_for(self, program: str) -> JobSpec:
        """The job to submit with ``program`` in place of the client's path (a staged copy)."""
        if program == self.program:
            return self.spec
        if self.backend.uses_mpirun:
            arguments = _mpirun_arguments(self.count, program, self.arguments)
            extra = tuple(
                (name, program if name == "mpi_program" else value) for name, value in self.spec.extra
            )
            return attrs.evolve(self.spec, arguments=arguments, extra=extra)
        return attrs.evolve(self.spec, executable=program)


def _mpirun_arguments(count: int, program: str, arguments: Sequence[str]) -> Tuple[str, ...]:
    return ("-np", str(count), program, *arguments)


# --------------------------------------------------------------------------- values


def _single(values: Mapping[str, List[str]], name: str) -> Optional[str]:
    found = values.get(name)
    return found[-1] if found else None


def _integer(name: str, text: str, low: int, high: int) -> int:
    value = text.strip()
    if not (value.isascii() and (value.isdigit() or (value[:1] in "+-" and value[1:].isdigit()))):
        raise BadJobRequest(f"attribute {name} must be a whole number, not {text[:40]!r}")
    number = int(value)
    if not low <= number <= high:
        raise BadJobRequest(f"attribute {name} must be between {low} and {high}, not {number}")
    return number


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    raise BadJobRequest(f"attribute {name} must be true or false, not {text[:40]!r}")


def _absolute(name: str, path: str, base_dir: str) -> str:
    path = path.strip()
    if not path:
        raise BadJobRequest(f"attribute {name} is empty")
    if "\0" in path:
        raise BadJobRequest(f"attribute {name} holds a NUL character")
    # Joined, not normalised: ".." after a symbolic link means something else than dropping
    # the link's name.
    return posixpath.join(base_dir, path)


def _environment(lines: Sequence[str]) -> Tuple[Tuple[str, str], ...]:
    pairs: List[Tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition("=")
        if not name or name != name.strip() or "\0" in line:
            raise BadJobRequest(f"attribute environment {line[:60]!r} is not NAME=VALUE or NAME")
        pairs.append((name, value if sep else ""))
    return tuple(pairs)


def _option_name(option: str, text: str) -> str:
    value = text.strip()
    if not _NAME.fullmatch(value):
        raise BadJobRequest(f"option {option} needs one name (letters, digits, _ . + -), not {text[:40]!r}")
    return value


def _queues(text: str) -> Tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not name for name in names):
        raise BadJobRequest(f"option queue needs one queue or several separated by commas, not {text[:60]!r}")
    for name in names:
        if any(ch.isspace() for ch in name):
            raise BadJobRequest(f"option queue: {name!r} holds white space")
    return names


def _minutes(values: Mapping[str, List[str]], name: str) -> Optional[int]:
    text = _single(values, name)
    if text is None:
        return None
    minutes = _integer(name, text, 0, _MAX_MINUTES)
    return minutes * 60 if minutes else None


# --------------------------------------------------------------------------- translation


def job_from_attributes(
    request_id: str,
    attributes: Sequence[Tuple[str, str]],
    *,
    find_program: Callable[[str], Optional[str]],
    base_dir: str,
    defaults: InvokeDefaults = InvokeDefaults(),
) -> InvokeJob:
    """Understand one JOB_CREATE.

    ``find_program(name)`` gives the absolute path of a program on the server's PATH, or
    None (it is asked for ``mpirun`` only, and only for MPI and BLACS jobs); ``base_dir``
    (the server's working directory) anchors relative paths.  BadJobRequest names the
    first attribute at fault.
    """
    values: Dict[str, List[str]] = {}
    order: List[str] = []
    for name, value in attributes:
        if name not in values:
            values[name] = []
            order.append(name)
        values[name].append(value)

    missing = [name for name in MANDATORY_ATTRIBUTES if name not in values]
    if missing:
        names = ", ".join(missing)
        noun = "attribute" if len(missing) == 1 else "attributes"
        raise BadJobRequest(f"missing mandatory {noun} {names}")

    program = _single(values, "executable_path") or ""
    if not program.strip():
        raise BadJobRequest("attribute executable_path is empty")
    if not program.startswith("/"):
        raise BadJobRequest(f"attribute executable_path must be an absolute path, not {program[:80]!r}")
    program = _absolute("executable_path", program, "/")

    backend_text = (_single(values, "backend") or "").strip().upper()
    try:
        backend = Backend(backend_text)
    except ValueError:
        raise BadJobRequest(
            f"attribute backend must be NORMAL, MPI or BLACS, not {_single(values, 'backend')!r}"
        ) from None
    count = _integer("count", _single(values, "count") or "", 1, MAX_COUNT)
    staging = _flag("staging", _single(values, "staging") or "")
    redirect = _flag("redirect_enable", _single(values, "redirect_enable") or "")
    port = _integer("port", _single(values, "port") or "", 0, 65535)
    status_polling = _integer("status_polling", _single(values, "status_polling") or "", 0, 2**31 - 1)
    _integer("refresh_credential", _single(values, "refresh_credential") or "", 0, 2**31 - 1)
    hostname = (_single(values, "hostname") or "").strip()
    if not hostname:
        raise BadJobRequest("attribute hostname is empty")
    arguments = tuple(values["argument"])

    working_dir = _single(values, "work_directory")
    if working_dir is not None:
        working_dir = _absolute("work_directory", working_dir, base_dir)
    tmp_dir = _single(values, "tmp_dir")
    if tmp_dir is not None:
        tmp_dir = _absolute("tmp_dir", tmp_dir, base_dir)
    stdout_path = stderr_path = None
    if redirect:
        if _single(values, "stdout_file") is not None:
            stdout_path = _absolute("stdout_file", _single(values, "stdout_file") or "", base_dir)
        if _single(values, "stderr_file") is not None:
            stderr_path = _absolute("stderr_file", _single(values, "stderr_file") or "", base_dir)
    environment = _environment(values.get("environment", ()))

    wall_time = _minutes(values, "max_wall_time")
    if wall_time is None:
        wall_time = _minutes(values, "max_time")
    cpu_time = _minutes(values, "max_cpu_time")
    nodes = None
    if _single(values, "host_count") is not None:
        nodes = _integer("host_count", _single(values, "host_count") or "", 1, MAX_COUNT)
    memory = None
    if _single(values, "max_memory") is not None:
        memory = _integer("max_memory", _single(values, "max_memory") or "", 1, 2**40)
    account = (_single(values, "project") or "").strip() or None

    # invoke_server_option strings, then the server's defaults
    scheduler_text = _single(values, "scheduler")
    scheduler = _option_name("scheduler", scheduler_text) if scheduler_text is not None else defaults.scheduler
    broker_text = _single(values, "broker")
    broker = _option_name("broker", broker_text) if broker_text is not None else defaults.broker
    queue_name = (_single(values, "queue_name") or "").strip()
    queue_text = _single(values, "queue")
    queues: Tuple[str, ...]
    if queue_name:
        if any(ch.isspace() for ch in queue_name):
            raise BadJobRequest(f"attribute queue_name {queue_name[:60]!r} holds white space")
        queues = (queue_name,)
    elif queue_text is not None:
        queues = _queues(queue_text)
    elif defaults.queue:
        queues = _queues(defaults.queue)
    else:
        queues = ()
    if scheduler is not None:
        queues = tuple(q if ":" in q else f"{scheduler}:{q}" for q in queues)
    queue = queues[0] if len(queues) == 1 else None
    candidates = queues if len(queues) > 1 else ()

    mpirun = None
    if backend.uses_mpirun:
        wanted = _single(values, "mpirun")
        if wanted is not None:
            wanted = wanted.strip()
            if not wanted:
                raise BadJobRequest("option mpirun is empty")
        else:
            wanted = defaults.mpirun
        if wanted is not None and wanted.startswith("/"):
            mpirun = wanted
        else:
            mpirun = find_program(wanted or "mpirun")
            if mpirun is None:
                where = f"{wanted!r} is not on the PATH" if wanted else "no mpirun was found on the PATH"
                raise BadJobRequest(
                    f"backend {backend.value} starts the program through mpirun, but {where}; "
                    f"install MPI or name one with the option 'mpirun /path/to/mpirun'"
                )

    extra: List[Tuple[str, str]] = []
    if scheduler is not None:
        extra.append(("scheduler", scheduler))
    if cpu_time is not None:
        extra.append(("cpu_time", str(cpu_time)))
    if mpirun is not None:
        # A batch backend allocates for the MPI processes, not for the one mpirun.
        extra += [("mpi_processes", str(count)), ("mpi_program", program), ("backend", backend.value)]

    if mpirun is not None:
        executable, job_arguments, num_procs = mpirun, _mpirun_arguments(count, program, arguments), 1
    else:
        executable, job_arguments, num_procs = program, arguments, count
    spec = JobSpec(
        executable=executable,
        arguments=job_arguments,
        environment=environment,
        working_dir=working_dir,
        num_procs=num_procs,
        queue=queue,
        candidates=candidates,
        broker=broker,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        client_ref=f"ninfg:{request_id}",
        account=account,
        wall_time=wall_time,
        memory=memory,
        nodes=nodes,
        extra=tuple(extra),
    )
    ignored = tuple(name for name in order if name not in _HONOURED and name not in MANDATORY_ATTRIBUTES)
    return InvokeJob(
        request_id=request_id,
        spec=spec,
        program=program,
        arguments=arguments,
        backend=backend,
        count=count,
        staging=staging,
        tmp_dir=tmp_dir,
        mpirun=mpirun,
        scheduler=scheduler,
        hostname=hostname,
        port=port,
        client_name=(_single(values, "client_name") or "").strip(),
        status_polling=status_polling,
        ignored=ignored,
    )


_HONOURED = frozenset(
    {
        "executable_path",
        "argument",
        "count",
        "backend",
        "staging",
        "work_directory",
        "environment",
        "redirect_enable",
        "stdout_file",
        "stderr_file",
        "queue_name",
        "max_time",
        "max_wall_time",
        "max_cpu_time",
        "project",
        "host_count",
        "max_memory",
        "tmp_dir",
        "scheduler",
        "queue",
        "broker",
        "mpirun",
    }
)


# --------------------------------------------------------------------------- statuses

#: Each service job state as the client sees it.  None: the state says nothing the client
#: can use (the job's last status stands).  A job cancelled on request is DONE: that is what
#: the client waits for after JOB_DESTROY.
STATUS_OF_STATE: Mapping[JobState, Optional[InvokeStatus]] = {
    JobState.UNDEFINED: None,
    JobState.ACCEPTED: InvokeStatus.PENDING,
    JobState.PREPARING: InvokeStatus.PENDING,
    JobState.SUBMITTING: InvokeStatus.PENDING,
    JobState.HOLD: InvokeStatus.PENDING,
    JobState.QUEUING: InvokeStatus.PENDING,
    JobState.RUNNING: InvokeStatus.ACTIVE,
    JobState.SUSPENDED: InvokeStatus.ACTIVE,
    JobState.FINISHING: InvokeStatus.ACTIVE,
    JobState.FINISHED: InvokeStatus.DONE,
    JobState.KILLED: InvokeStatus.DONE,
    JobState.FAILED: InvokeStatus.FAILED,
    JobState.DELETED: InvokeStatus.DONE,
    JobState.OTHER: None,
}


def invoke_status(state: JobState) -> Optional[InvokeStatus]:
    """The client's status for a service state (None: no change to report)."""
    return STATUS_OF_STATE[state]
