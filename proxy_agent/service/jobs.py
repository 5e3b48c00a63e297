"""What the job service deals in: job descriptions, one job-state vocabulary, neutral errors.

Nothing here knows a protocol or a scheduler.  Front-ends turn what their clients send into a
:class:`JobSpec` and the :class:`ServiceError` they get back into their own error codes;
backends turn a :class:`JobSpec` into whatever their scheduler takes and their native states
into :class:`JobState` through a :class:`StateTable`.

The states are those of the multi-scheduler client library the service follows (UNDEFINED,
ACCEPTED, PREPARING, SUBMITTING, HOLD, QUEUING, RUNNING, FINISHING, FINISHED, KILLED, FAILED,
DELETED, OTHER) plus SUSPENDED, which that list lacks and interactive clients need.
"""

from __future__ import annotations

import enum
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import attrs

__all__ = [
    "NEVER_STARTS",
    "SERVICE_STATES",
    "ErrorKind",
    "JobError",
    "JobSpec",
    "JobState",
    "ServiceError",
    "StateTable",
    "SchedulersDown",
    "SubmitError",
]


#: How a job's message begins when its scheduler keeps it waiting for something that will not
#: come (more than its queue allows, an account it may not use): a client waiting for it to
#: start or end may stop waiting and say why.  The job itself stays queued in the scheduler.
NEVER_STARTS = "will not start as submitted: "


class JobState(enum.Enum):
    """Where a job is in its life, the same words for every scheduler."""

    #: the state could not be determined (yet)
    UNDEFINED = "UNDEFINED"
    #: the service has taken the job and will hand it to a scheduler
    ACCEPTED = "ACCEPTED"
    #: inputs are being prepared (staging, a co-allocated job waiting for its parts)
    PREPARING = "PREPARING"
    #: being handed to the scheduler
    SUBMITTING = "SUBMITTING"
    #: held in the scheduler: will not start until released
    HOLD = "HOLD"
    #: waiting in a queue to start
    QUEUING = "QUEUING"
    #: running
    RUNNING = "RUNNING"
    #: stopped while running; resumes where it was
    SUSPENDED = "SUSPENDED"
    #: its processes have ended; the scheduler is cleaning up
    FINISHING = "FINISHING"
    #: ended, and everything in it succeeded
    FINISHED = "FINISHED"
    #: ended because it was cancelled (by its owner, an administrator or a limit)
    KILLED = "KILLED"
    #: ended with an error (a non-zero exit, a signal, a node failure)
    FAILED = "FAILED"
    #: removed from the scheduler without a known outcome
    DELETED = "DELETED"
    #: a native state the scheduler's table does not place (its text is kept beside it)
    OTHER = "OTHER"

    @property
    def final(self) -> bool:
        """The job has ended for good: no later state will follow."""
        return self in _FINAL

    @property
    def started(self) -> bool:
        """The job's processes have begun to run (they may have ended since)."""
        return self in _STARTED

    @classmethod
    def parse(cls, text: str) -> "JobState":
        """The state named ``text`` (any case); ValueError naming the legal names otherwise."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(state.value for state in cls)
            raise ValueError(f"unknown job state {text!r}; states are {names}") from None


_FINAL = frozenset({JobState.FINISHED, JobState.KILLED, JobState.FAILED, JobState.DELETED})
#: The states the service gives a job itself, which no scheduler's table gives: before a
#: scheduler has the job (UNDEFINED, ACCEPTED, SUBMITTING) and for a native state a table does
#: not place (OTHER).  Every other state is a scheduler's to give or to say it never gives
#: (:attr:`StateTable.not_given`).
SERVICE_STATES = frozenset({JobState.UNDEFINED, JobState.ACCEPTED, JobState.SUBMITTING, JobState.OTHER})
_STARTED = frozenset(
    {
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.FINISHING,
        JobState.FINISHED,
        JobState.FAILED,
    }
)


class StateTable:
    """One scheduler's native job states, each mapped into :class:`JobState`.

    ``normalize`` turns a native state text into the table's key (say, upper case and the
    first word only); whatever it gives that the table lacks maps to OTHER.  :meth:`map`
    never raises: a scheduler that invents a state tomorrow still gets an answer.

    ``not_given`` names the service states (beyond :data:`SERVICE_STATES`) that no native
    state of the table maps to, each with the reason (the backend decides it otherwise, or
    the scheduler has no such state): so a state added to :class:`JobState` is placed, or
    said to be absent, in every scheduler's table (:meth:`unplaced`).
    """

    def __init__(
        self,
        scheduler: str,
        table: Mapping[str, JobState],
        normalize: Optional[Callable[[str], str]] = None,
        not_given: Optional[Mapping[JobState, str]] = None,
    ) -> None:
        self.scheduler = scheduler
        self.table: Dict[str, JobState] = dict(table)
        self.not_given: Dict[JobState, str] = dict(not_given or {})
        self._normalize = normalize
        self._cache: Dict[str, JobState] = {}

    def unplaced(self) -> List[JobState]:
        """The service states this table neither gives nor says it never gives (none, when the
        table is complete), and those it says both of."""
        given = set(self.table.values())
        return [state for state in JobState
                if state not in SERVICE_STATES and (state in given) == (state in self.not_given)]

    def __contains__(self, native: object) -> bool:
        return native in self.table

    def __iter__(self):
        return iter(self.table.items())

    def map(self, native: str) -> JobState:
        """The service state of a native state text; OTHER when the table does not know it."""
        cached = self._cache.get(native)
        if cached is not None:
            return cached
        try:
            key = self._normalize(native) if self._normalize is not None else native
            state = self.table.get(key, JobState.OTHER)
        except Exception:  # noqa: BLE001 - a state text must never break the caller
            state = JobState.OTHER
        if len(self._cache) < 4096:
            self._cache[native] = state
        return state


# --------------------------------------------------------------------------- errors


class ErrorKind(enum.Enum):
    """What went wrong, in words every front-end can map to its own codes."""

    #: the request itself is malformed or incomplete (a value of the wrong form)
    BAD_REQUEST = "BAD_REQUEST"
    NO_SUCH_JOB = "NO_SUCH_JOB"
    NO_SUCH_QUEUE = "NO_SUCH_QUEUE"
    #: a well-formed submission that could not be submitted (program missing, refused)
    SUBMIT_FAILED = "SUBMIT_FAILED"
    #: a job command that could not be carried out (the job is in the wrong state, refused)
    OPERATION_FAILED = "OPERATION_FAILED"
    #: the backend cannot do this at all
    NOT_SUPPORTED = "NOT_SUPPORTED"
    #: the scheduler is not running or not answering
    UNAVAILABLE = "UNAVAILABLE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INTERNAL = "INTERNAL"


class ServiceError(Exception):
    """A request to the service failed; ``message`` says why in a form fit for a user."""

    default_kind = ErrorKind.OPERATION_FAILED

    def __init__(self, message: str, kind: Optional[ErrorKind] = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind if kind is not None else self.default_kind


class SubmitError(ServiceError):
    """A submission was refused."""

    default_kind = ErrorKind.SUBMIT_FAILED


class SchedulersDown(SubmitError):
    """No scheduler of the service runs (every backend failed to start): the message says why."""

    default_kind = ErrorKind.UNAVAILABLE


class JobError(ServiceError):
    """A command on an existing job (terminate, hold, suspend, move) failed."""

    default_kind = ErrorKind.OPERATION_FAILED


# --------------------------------------------------------------------------- job description


def _strings(value: Iterable[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError("expected a sequence of strings, not a single string")
    return tuple(value)


def _pairs(value) -> Tuple[Tuple[str, str], ...]:
    if isinstance(value, Mapping):
        return tuple(value.items())
    return tuple((k, v) for k, v in value)


def _opt_int(value) -> Optional[int]:
    return None if value is None else int(value)


@attrs.frozen
class JobSpec:
    """What to run, where, and what to ask the scheduler for.

    Only ``executable`` is required.  ``queue`` names one queue, as ``NAME`` or
    ``BACKEND:NAME``; ``candidates`` names several for a broker to choose from (empty with
    no ``queue``: every queue); ``broker`` names the broker.  ``client_ref`` is the
    submitter's own reference for the job (a PTP client's ``jobSubId``), kept with the job.

    The batch fields (``account`` to ``native_options``) are what users of batch systems set;
    each batch system maps those it supports and refuses the others clearly.  ``wall_time``
    is in seconds; ``memory`` in megabytes per node.  ``extra`` keeps any further
    backend-specific settings as (name, value) pairs, in the order given.
    """

    executable: str
    arguments: Tuple[str, ...] = attrs.field(default=(), converter=_strings)
    environment: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    working_dir: Optional[str] = None
    num_procs: int = attrs.field(default=1, converter=int)
    queue: Optional[str] = None
    candidates: Tuple[str, ...] = attrs.field(default=(), converter=_strings)
    broker: Optional[str] = None
    name: Optional[str] = None
    hold: bool = False
    stdout_path: Optional[str] = None
    stderr_path: Optional[str] = None
    client_ref: Optional[str] = None
    # batch settings
    account: Optional[str] = None
    wall_time: Optional[int] = attrs.field(default=None, converter=_opt_int)
    memory: Optional[int] = attrs.field(default=None, converter=_opt_int)
    nodes: Optional[int] = attrs.field(default=None, converter=_opt_int)
    cpus_per_task: Optional[int] = attrs.field(default=None, converter=_opt_int)
    gpus: Optional[int] = attrs.field(default=None, converter=_opt_int)
    gres: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    array: Optional[str] = None
    begin_time: Optional[str] = None
    prologue: Tuple[str, ...] = attrs.field(default=(), converter=_strings)
    native_options: Tuple[str, ...] = attrs.field(default=(), converter=_strings)
    extra: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)

    @property
    def env(self) -> Dict[str, str]:
        return dict(self.environment)

    @property
    def display_name(self) -> str:
        """The job's name, or the program's file name when none was given."""
        if self.name:
            return self.name
        base = self.executable.rstrip("/").rsplit("/", 1)[-1]
        return base or self.executable

    def extra_value(self, key: str) -> Optional[str]:
        for name, value in self.extra:
            if name == key:
                return value
        return None
