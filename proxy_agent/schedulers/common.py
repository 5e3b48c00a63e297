"""What every scheduler backend shares: state words, submission attributes, checks.

* State and status words.  ``jobState``/``processState`` take only the four
  values the IDE accepts (:data:`~proxy_agent.protocol.attributes.JOB_STATES`);
  the finer life-cycle word goes to ``jobStatus``/``processStatus``, from the
  one vocabulary below, so every backend reports the same words for the same
  situation (a batch backend maps its own codes onto them).
* Attribute definitions: the standard ones plus the job-submission
  attributes a user may set (:func:`scheduler_attribute_definitions`).
* Parsing of submission and change attributes into plain values, raising
  :class:`~proxy_agent.schedulers.base.SubmitError` /
  :class:`~proxy_agent.schedulers.base.JobError` with a message that names
  the attribute and what is wrong with it.

Everything here is pure and cheap: no I/O, no clock.
"""

from __future__ import annotations

import getpass
import os
import signal
from typing import Dict, Iterable, List, Optional, Sequence, Type

from ..protocol.attributes import (
    STANDARD_ATTRIBUTES,
    A,
    AttributeDefinition,
    AttributeSet,
    AttrType,
)
from ..protocol.messages import ErrorCode
from .base import JobError, SchedulerError, SubmitError

__all__ = [
    "CPUS",
    "HOLD",
    "JOB_NAME",
    "LineSplitter",
    "MAX_LINE_BYTES",
    "SUSPEND",
    "JobChange",
    "MachineState",
    "NodeState",
    "QueueState",
    "State",
    "Status",
    "current_user",
    "merge_definitions",
    "parse_env",
    "parse_job_changes",
    "parse_num_procs",
    "require_sub_id",
    "scheduler_attribute_definitions",
    "signal_name",
    "status_for_exit",
]

# --------------------------------------------------------------------------- attribute ids

#: Submission attribute: the job's display name (defaults to the program name).
JOB_NAME = "jobName"
#: CHANGE_JOB attribute: ``true`` suspends a running job, ``false`` resumes it.
SUSPEND = "suspend"
#: CHANGE_JOB attribute: ``true`` holds a job that has not started, ``false`` releases it.
HOLD = "hold"
#: Node attribute: how many CPUs the node has.
CPUS = "cpus"


# --------------------------------------------------------------------------- states


class MachineState:
    UP = "UP"
    DOWN = "DOWN"


class NodeState:
    UP = "UP"
    DOWN = "DOWN"


class QueueState:
    NORMAL = "NORMAL"
    STOPPED = "STOPPED"


class State:
    """``jobState`` / ``processState``: the only four values the IDE accepts."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"


class Status:
    """``jobStatus`` / ``processStatus``: the finer state, one vocabulary for all backends.

    ``jobState`` STARTING goes with SUBMITTED (accepted, being started),
    PENDING (waiting in a queue) or HELD (held in a queue); RUNNING with
    RUNNING; SUSPENDED with SUSPENDED; COMPLETED with FINISHED (every
    process exited 0), FAILED (something exited non-zero or was killed) or
    CANCELED (terminated on request).
    """

    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    HELD = "HELD"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


def status_for_exit(returncode: int, canceled: bool) -> str:
    """The completion status of one process from its return code."""
    if canceled:
        return Status.CANCELED
    return Status.FINISHED if returncode == 0 else Status.FAILED


def current_user() -> str:
    """The name of the account the agent runs as (its uid when it has none)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry and no USER/LOGNAME variable
        return str(os.getuid())


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG<n>`` for numbers without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


# --------------------------------------------------------------------------- definitions


def merge_definitions(
    base: Iterable[AttributeDefinition], extra: Iterable[AttributeDefinition]
) -> List[AttributeDefinition]:
    """``base`` with each ``extra`` definition replacing the one with its id, or appended.

    The result never holds an id twice, so it can go straight into an
    ATTR_DEF event or an :class:`~proxy_agent.protocol.attributes.AttributeRegistry`.
    """
    merged: Dict[str, AttributeDefinition] = {d.id: d for d in base}
    for definition in extra:
        merged[definition.id] = definition
    return list(merged.values())


def scheduler_attribute_definitions(
    *,
    max_procs: int,
    default_queue: Optional[str] = None,
    hold: bool = False,
    extra: Sequence[AttributeDefinition] = (),
) -> List[AttributeDefinition]:
    """Standard attributes plus the job-submission and change attributes of a backend.

    Also defines ``jobName``, ``suspend`` and the node attribute ``cpus``;
    ``extra`` definitions are added last and replace any with the same id.
    ``max_procs`` bounds ``jobNumProcs``; ``default_queue`` (an element id)
    becomes the default of ``queueId``; ``hold`` adds the ``hold`` change
    attribute for backends that can hold jobs.
    """
    submission = [
        AttributeDefinition(
            A.JOB_SUB_ID, AttrType.STRING, "Submission ID",
            "Tag the IDE attaches to a submission (required)", False,
        ),
        AttributeDefinition(
            A.EXEC_NAME, AttrType.STRING, "Executable",
            "Program to run: a file name looked up on PATH, or a file in execPath",
        ),
        AttributeDefinition(
            A.EXEC_PATH, AttrType.STRING, "Executable Path",
            "Directory holding execName, or the program's full path",
        ),
        AttributeDefinition(
            A.PROG_ARGS, AttrType.ARRAY, "Program Arguments",
            "Arguments passed to the program verbatim (no shell), one per value",
        ),
        AttributeDefinition(
            A.ENV, AttrType.ARRAY, "Environment",
            "NAME=VALUE added to the agent's environment, one per value",
        ),
        AttributeDefinition(
            A.WORKING_DIR, AttrType.STRING, "Working Directory",
            "Directory the processes start in (default: the agent's)",
        ),
        AttributeDefinition(
            A.JOB_NUM_PROCS, AttrType.INTEGER, "Processes",
            "How many copies of the program to start",
            True, "1", minimum="1", maximum=str(max_procs),
        ),
        AttributeDefinition(
            A.QUEUE_ID, AttrType.STRING, "Queue ID",
            "Element id of the queue to submit to", True, default_queue or "",
        ),
        AttributeDefinition(JOB_NAME, AttrType.STRING, "Job Name", "Display name of the job"),
        AttributeDefinition(
            SUSPEND, AttrType.BOOLEAN, "Suspend",
            "CHANGE_JOB: true suspends a running job, false resumes it", False, "false",
        ),
        AttributeDefinition(CPUS, AttrType.INTEGER, "CPUs", "How many CPUs the node has", True, "0"),
    ]
    if hold:
        submission.append(
            AttributeDefinition(
                HOLD, AttrType.BOOLEAN, "Hold",
                "CHANGE_JOB: true holds a job that has not started, false releases it", False, "false",
            )
        )
    return merge_definitions(STANDARD_ATTRIBUTES, [*submission, *extra])


# --------------------------------------------------------------------------- submission


def require_sub_id(job: AttributeSet) -> str:
    """The ``jobSubId`` of a submission; SubmitError when missing or empty."""
    sub_id = job.get(A.JOB_SUB_ID)
    if not sub_id:
        raise SubmitError("the submission has no jobSubId attribute", ErrorCode.BAD_ARGUMENTS)
    return sub_id


def parse_num_procs(job: AttributeSet, maximum: int) -> int:
    """``jobNumProcs`` as an int in 1..maximum (1 when absent)."""
    text = job.get(A.JOB_NUM_PROCS)
    if text is None:
        return 1
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()) or len(stripped) > 9:
        if stripped[:1] == "-" and stripped[1:].isascii() and stripped[1:].isdigit():
            raise SubmitError(f"jobNumProcs must be at least 1, got {text!r}", ErrorCode.BAD_ARGUMENTS)
        raise SubmitError(f"jobNumProcs must be a whole number, got {text!r}", ErrorCode.BAD_ARGUMENTS)
    count = int(stripped)
    if count < 1:
        raise SubmitError(f"jobNumProcs must be at least 1, got {text!r}", ErrorCode.BAD_ARGUMENTS)
    if count > maximum:
        raise SubmitError(f"jobNumProcs must be at most {maximum}, got {text!r}", ErrorCode.BAD_ARGUMENTS)
    return count


def parse_env(values: Iterable[str]) -> Dict[str, str]:
    """``env`` values (``NAME=VALUE``, split at the first '=') as a dict; later ones win."""
    env: Dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SubmitError(f"env value {item!r} is not NAME=VALUE", ErrorCode.BAD_ARGUMENTS)
        if "\0" in item:
            raise SubmitError(f"env value for {name!r} contains a NUL character", ErrorCode.BAD_ARGUMENTS)
        env[name] = value
    return env


# --------------------------------------------------------------------------- changes


class JobChange:
    """What a CHANGE_JOB asks for: ``suspend``/``hold`` are None when not mentioned."""

    __slots__ = ("suspend", "hold")

    def __init__(self, suspend: Optional[bool] = None, hold: Optional[bool] = None) -> None:
        self.suspend = suspend
        self.hold = hold

    def __repr__(self) -> str:
        return f"JobChange(suspend={self.suspend!r}, hold={self.hold!r})"


def _boolean(key: str, text: str, error: Type[SchedulerError]) -> bool:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise error(f"{key} must be true or false, got {text!r}", ErrorCode.BAD_ARGUMENTS)


def parse_job_changes(changes: AttributeSet, *, hold: bool = False) -> JobChange:
    """Read a CHANGE_JOB's attributes; JobError for anything a backend cannot do.

    Understood: ``suspend=true|false``, ``jobState=SUSPENDED|RUNNING`` (the
    same thing in the IDE's own words) and, when ``hold`` is allowed,
    ``hold=true|false``.  ``jobId`` (the command's target) is ignored.
    """
    result = JobChange()
    unsupported: List[str] = []
    for key in changes.keys():
        if key == A.JOB_ID:
            continue
        value = changes.get(key) or ""
        if key == SUSPEND:
            wanted: Optional[bool] = _boolean(key, value, JobError)
        elif key == A.JOB_STATE:
            if value == State.SUSPENDED:
                wanted = True
            elif value == State.RUNNING:
                wanted = False
            else:
                raise JobError(
                    f"jobState can only be changed to SUSPENDED or RUNNING, not {value!r}",
                    ErrorCode.NOT_SUPPORTED,
                )
        elif key == HOLD and hold:
            result.hold = _boolean(key, value, JobError)
            continue
        else:
            unsupported.append(key)
            continue
        if result.suspend is not None and result.suspend != wanted:
            raise JobError("the change both suspends and resumes the job", ErrorCode.BAD_ARGUMENTS)
        result.suspend = wanted
    if unsupported:
        understood = "suspend, jobState=SUSPENDED|RUNNING" + (", hold" if hold else "")
        raise JobError(
            f"cannot change {', '.join(sorted(unsupported))} (supported: {understood})",
            ErrorCode.NOT_SUPPORTED,
        )
    if result.suspend is None and result.hold is None:
        raise JobError("the change names nothing to change", ErrorCode.BAD_ARGUMENTS)
    if result.suspend is not None and result.hold is not None:
        raise JobError("suspend and hold cannot be changed together", ErrorCode.BAD_ARGUMENTS)
    return result


#: Output lines longer than this many bytes are passed on in pieces.
MAX_LINE_BYTES = 64 * 1024


class LineSplitter:
    """Bytes of one output stream in, text lines out.

    Lines end at ``\n`` (a ``\r`` before it is dropped); bytes are decoded
    as UTF-8 with undecodable bytes replaced.  A line longer than
    ``max_bytes`` is split into pieces of at most ``max_bytes`` (never inside
    a UTF-8 sequence); the pieces are the same however the bytes were chunked
    by the pipe.  :meth:`flush` returns a last line that had no newline.
    """

    __slots__ = ("max_bytes", "_pending")

    def __init__(self, max_bytes: int = MAX_LINE_BYTES) -> None:
        if max_bytes < 4:
            raise ValueError("max_bytes must be at least 4 (one UTF-8 character)")
        self.max_bytes = max_bytes
        self._pending = b""

    def feed(self, data: bytes) -> List[str]:
        lines: List[str] = []
        if self._pending:
            data = self._pending + data
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if end > start and data[end - 1] == 0x0D:  # \r\n
                self._pieces(data[start:end - 1], lines)
            else:
                self._pieces(data[start:end], lines)
            start = end + 1
        pending = data[start:]
        # Cut an overlong unfinished line, keeping one byte more than a piece so a
        # final '\r' can still meet its '\n' (the cuts then match a whole-line split).
        limit = self.max_bytes
        while len(pending) > limit + 1:
            cut = _utf8_boundary(pending, limit)
            lines.append(pending[:cut].decode("utf-8", "replace"))
            pending = pending[cut:]
        self._pending = pending
        return lines

    def flush(self) -> List[str]:
        pending, self._pending = self._pending, b""
        lines: List[str] = []
        if pending.endswith(b"\r"):
            pending = pending[:-1]
        if pending:
            self._pieces(pending, lines)
        return lines

    def _pieces(self, line: bytes, lines: List[str]) -> None:
        limit = self.max_bytes
        while len(line) > limit:
            cut = _utf8_boundary(line, limit)
            lines.append(line[:cut].decode("utf-8", "replace"))
            line = line[cut:]
        lines.append(line.decode("utf-8", "replace"))


def _utf8_boundary(data: bytes, limit: int) -> int:
    """A cut position at or before ``limit`` that does not split a UTF-8 sequence."""
    cut = limit
    while cut > limit - 3 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut
