"""Where the service's words meet PTP's: attribute names, job states, error codes, submissions.

Every translation between the neutral service and the PTP protocol is decided here and
nowhere else:

* :func:`ptp_attribute` -- which PTP attribute id a neutral attribute of an element kind is
  shown as (``state`` of a job is ``jobState`` + ``jobStatus``; a job's ``queue`` is
  ``queueId``...);
* :data:`PTP_JOB_STATE` -- PTP's four ``jobState`` values derived from the service's states;
* :data:`ERROR_CODES` -- neutral error kinds to PTP error codes;
* :func:`job_spec` -- a SUBMIT_JOB's attributes to a :class:`~proxy_agent.service.jobs.JobSpec`;
* :func:`job_change` -- a CHANGE_JOB's attributes to a service request;
* :func:`attribute_definitions` -- MODEL_DEF's definitions from the standard ones and what
  the backends describe.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ...protocol.attributes import (
    INT32_MAX,
    STANDARD_ATTRIBUTES,
    A,
    AttributeDefinition,
    AttributeSet,
    AttrType,
)
from ...protocol.messages import ErrorCode
from ...service.attributes import AttrInfo, ValueType
from ...service.coalloc.manager import DESCRIPTION_ATTRIBUTE as COALLOC_DESCRIPTION
from ...service.coalloc.manager import JOB_ATTRIBUTE as COALLOC_JOB
from ...service.coalloc.manager import RELEASE_ATTRIBUTE as COALLOC_RELEASE
from ...service.jobs import ErrorKind, JobSpec, JobState, SubmitError
from ...service.model import K, Kind

__all__ = [
    "CHANGE_HOLD",
    "CHANGE_SUSPEND",
    "ERROR_CODES",
    "PTP_JOB_STATE",
    "JOB_NAME",
    "attribute_definitions",
    "error_code",
    "job_change",
    "job_spec",
    "parse_decimal",
    "ptp_attribute",
]

# --------------------------------------------------------------------------- names

#: Submission attribute: the job's display name (defaults to the program name).
JOB_NAME = "jobName"
#: CHANGE_JOB attribute: ``true`` suspends a running job, ``false`` resumes it.
CHANGE_SUSPEND = "suspend"
#: CHANGE_JOB / submission attribute: ``true`` holds a job that has not started.
CHANGE_HOLD = "hold"
#: Submission attribute: the broker that picks among several queues.
BROKER = "broker"
# Multi-part jobs: ``coallocDescription`` submits one (no program named; with ``coallocJob``,
# the multi-part job's id, one part to add to it); CHANGE_JOB ``coallocRelease=now|wait``
# releases its start barrier.

#: Neutral attribute names shown under another PTP id, per kind (the rest keep their name).
_RENAMED: Dict[Kind, Dict[str, str]] = {
    Kind.MACHINE: {K.STATE: A.MACHINE_STATE, K.NUM_NODES: A.NUM_NODES},
    Kind.NODE: {K.STATE: A.NODE_STATE, K.NUMBER: A.NODE_NUMBER},
    Kind.QUEUE: {K.STATE: A.QUEUE_STATE},
    Kind.JOB: {
        K.NUM_PROCS: A.JOB_NUM_PROCS,
        K.USER: A.USER_ID,
        K.CLIENT_REF: A.JOB_SUB_ID,
        K.MESSAGE: A.JOB_STATUS_MESSAGE,
        K.QUEUE: A.QUEUE_ID,
        K.ARGUMENTS: A.PROG_ARGS,
        K.NATIVE_STATE: "jobNativeState",
    },
    Kind.PROCESS: {
        K.PID: A.PROCESS_PID,
        K.EXIT_CODE: A.PROCESS_EXIT_CODE,
        K.SIGNAL: A.PROCESS_SIGNAL_NAME,
        K.NODE: A.PROCESS_NODE_ID,
        K.NATIVE_STATE: "processNativeState",
    },
}
#: Neutral attributes never shown to a PTP client.
_HIDDEN = frozenset({K.ENVIRONMENT})


def ptp_attribute(kind: Kind, name: str) -> Optional[str]:
    """The PTP attribute id a neutral attribute is shown as (None: not shown at all).

    ``state`` of jobs and processes and ``executable`` of jobs become two attributes each;
    the renderer handles those (see :func:`special_attribute`)."""
    if name in _HIDDEN:
        return None
    return _RENAMED[kind].get(name, name)


#: PTP's coarse state of a job or process, from the service's state.
PTP_JOB_STATE: Dict[str, str] = {
    JobState.UNDEFINED.value: "STARTING",
    JobState.ACCEPTED.value: "STARTING",
    JobState.PREPARING.value: "STARTING",
    JobState.SUBMITTING.value: "STARTING",
    JobState.HOLD.value: "STARTING",
    JobState.QUEUING.value: "STARTING",
    JobState.OTHER.value: "STARTING",
    JobState.RUNNING.value: "RUNNING",
    JobState.FINISHING.value: "RUNNING",
    JobState.SUSPENDED.value: "SUSPENDED",
    JobState.FINISHED.value: "COMPLETED",
    JobState.KILLED.value: "COMPLETED",
    JobState.FAILED.value: "COMPLETED",
    JobState.DELETED.value: "COMPLETED",
}


def state_args(kind: Kind, value: str) -> List[str]:
    """``jobState=``/``jobStatus=`` (or the process pair) for a service state."""
    coarse = PTP_JOB_STATE.get(value, "STARTING")
    if kind is Kind.JOB:
        return ["jobState=" + coarse, "jobStatus=" + value]
    return ["processState=" + coarse, "processStatus=" + value]


def executable_args(value: str) -> List[str]:
    """``execName=`` (the file name) and ``execPath=`` (its directory) of a program path."""
    directory, name = os.path.split(value)
    if not name:
        return ["execName=" + value]
    if not directory:
        return ["execName=" + name]
    return ["execName=" + name, "execPath=" + directory]


#: (kind, neutral name) whose rendering is not one key=value: what renders them.
SPECIAL: Dict[Tuple[Kind, str], str] = {
    (Kind.JOB, K.STATE): "state",
    (Kind.PROCESS, K.STATE): "state",
    (Kind.JOB, K.EXECUTABLE): "executable",
}


# --------------------------------------------------------------------------- errors

#: Neutral error kinds -> PTP error codes.
ERROR_CODES: Dict[ErrorKind, ErrorCode] = {
    ErrorKind.BAD_REQUEST: ErrorCode.BAD_ARGUMENTS,
    ErrorKind.NO_SUCH_JOB: ErrorCode.NO_SUCH_JOB,
    ErrorKind.NO_SUCH_QUEUE: ErrorCode.NO_SUCH_QUEUE,
    ErrorKind.SUBMIT_FAILED: ErrorCode.SUBMIT_FAILED,
    ErrorKind.OPERATION_FAILED: ErrorCode.OPERATION_FAILED,
    ErrorKind.NOT_SUPPORTED: ErrorCode.NOT_SUPPORTED,
    ErrorKind.UNAVAILABLE: ErrorCode.SCHEDULER,
    ErrorKind.SHUTTING_DOWN: ErrorCode.SHUTTING_DOWN,
    ErrorKind.INTERNAL: ErrorCode.INTERNAL,
}


def error_code(kind: ErrorKind) -> ErrorCode:
    return ERROR_CODES.get(kind, ErrorCode.INTERNAL)


# --------------------------------------------------------------------------- numbers

_DECIMAL = re.compile(r"[0-9]+\Z")


def parse_decimal(text: Optional[str], what: str, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    """A plain ASCII decimal number within bounds; SubmitError naming ``what`` otherwise."""
    raw = (text or "").strip()
    if not raw.isascii() or not _DECIMAL.match(raw):
        raise SubmitError(f"{what} must be a whole number written with the digits 0-9, got {text!r}",
                          ErrorKind.BAD_REQUEST)
    if len(raw) > 19 or not minimum <= int(raw) <= maximum:
        raise SubmitError(f"{what} must be between {minimum} and {maximum}, got {text!r}", ErrorKind.BAD_REQUEST)
    return int(raw)


_DURATION = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")


def parse_duration(text: str, what: str) -> int:
    """A time limit as seconds: minutes, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or
    ``D-HH:MM:SS`` (the forms batch systems take)."""
    raw = text.strip()
    match = _DURATION.match(raw) if raw.isascii() else None
    if match is None:
        raise SubmitError(f"{what} {text!r} is not minutes, [D-]HH:MM:SS or D-HH[:MM]", ErrorKind.BAD_REQUEST)
    days, first, second, third = match.groups()
    if days is not None:
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif third is not None:
        total = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:
        total = int(first) * 60 + int(second)
    else:
        total = int(first) * 60
    if total <= 0 or total > 366 * 86400 * 100:
        raise SubmitError(f"{what} {text!r} is not a usable time limit", ErrorKind.BAD_REQUEST)
    return total


_MEMORY = re.compile(r"([0-9]+)\s*([KMGT]?)I?B?\Z", re.IGNORECASE)
_MEMORY_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory(text: str, what: str) -> int:
    """Memory as megabytes: ``4000`` (MB), ``500M``, ``4G``, ``1T``, ``512K``."""
    raw = text.strip()
    match = _MEMORY.match(raw) if raw.isascii() else None
    if match is None:
        raise SubmitError(f"{what} {text!r} is not a size like 4000, 500M or 4G", ErrorKind.BAD_REQUEST)
    megabytes = -(-int(match.group(1)) * _MEMORY_FACTOR[match.group(2).upper()] // 1)
    if megabytes <= 0 or megabytes > 2**40:
        raise SubmitError(f"{what} {text!r} is not a usable size", ErrorKind.BAD_REQUEST)
    return int(megabytes)


def _boolean(text: str, what: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0", ""):
        return False
    raise SubmitError(f"{what} must be true or false, got {text!r}", ErrorKind.BAD_REQUEST)


# --------------------------------------------------------------------------- submissions

#: Submission attributes the front-end understands itself (the rest go to ``extra``).
_KNOWN = frozenset({
    A.JOB_SUB_ID, A.EXEC_NAME, A.EXEC_PATH, A.PROG_ARGS, A.ENV, A.WORKING_DIR, A.JOB_NUM_PROCS,
    A.QUEUE_ID, JOB_NAME, A.NAME, CHANGE_HOLD, "stdoutPath", "stderrPath", K.ACCOUNT, K.TIME_LIMIT,
    "nodes", "cpusPerTask", "memory", "beginTime", "partition", BROKER,
})


def job_spec(attributes: AttributeSet, queue_key: Callable[[str], Union[int, str]],
             job_key: Optional[Callable[[str], int]] = None) -> JobSpec:
    """The job a SUBMIT_JOB describes; SubmitError (BAD_REQUEST) naming what is wrong.

    ``queue_key`` turns a ``queueId`` value into what the service takes: an element id into
    the queue's key, anything else (a name, ``BACKEND:NAME``) as it is; ``job_key`` a job's
    element id into its key (for ``coallocJob``).
    """
    get = attributes.get
    sub_id = get(A.JOB_SUB_ID)
    if not sub_id:
        raise SubmitError("the submission has no jobSubId attribute", ErrorKind.BAD_REQUEST)
    if get(COALLOC_DESCRIPTION) is not None:
        return _multi_part_spec(attributes, sub_id, job_key)
    path = get(A.EXEC_PATH) or ""
    name = get(A.EXEC_NAME) or ""
    if path and name:
        # Both conventions exist: execPath the program itself, or the directory holding it.
        executable = path if os.path.basename(path.rstrip("/")) == name else os.path.join(path, name)
    elif path or name:
        executable = path or name
    else:
        raise SubmitError("no executable given: set execName and/or execPath", ErrorKind.BAD_REQUEST)
    environment: List[Tuple[str, str]] = []
    for item in attributes.getall(A.ENV):
        var, sep, value = item.partition("=")
        if not sep or not var:
            raise SubmitError(f"env value {item!r} is not NAME=VALUE", ErrorKind.BAD_REQUEST)
        environment.append((var, value))
    num_procs = 1
    if get(A.JOB_NUM_PROCS) is not None:
        num_procs = parse_decimal(get(A.JOB_NUM_PROCS), A.JOB_NUM_PROCS, 1, INT32_MAX)
    queue: Optional[Union[int, str]] = None
    candidates: Tuple[Union[int, str], ...] = ()
    # One queue, or several (comma-separated) for a broker; SLURM users' ``partition`` too
    # (partitions by name only).
    queue_text = (get(A.QUEUE_ID) or "").strip()
    reference = queue_key
    if not queue_text:
        queue_text = (get("partition") or "").strip()
        reference = str
    parts = [p.strip() for p in queue_text.split(",") if p.strip()]
    if len(parts) == 1:
        queue = reference(parts[0])
    elif parts:
        candidates = tuple(reference(p) for p in parts)
    extra = tuple((key, value) for key, value in attributes.items if key not in _KNOWN)
    if queue_text and get("partition"):
        # Both name a queue: the backend that knows partitions refuses them if they differ.
        extra += (("partition", get("partition") or ""),)
    settings = {}
    if get(K.TIME_LIMIT):
        settings["wall_time"] = parse_duration(get(K.TIME_LIMIT) or "", K.TIME_LIMIT)
    if get("memory"):
        settings["memory"] = parse_memory(get("memory") or "", "memory")
    if get("nodes") and get("nodes") != "0":
        settings["nodes"] = parse_decimal(get("nodes"), "nodes", 1)
    if get("cpusPerTask"):
        settings["cpus_per_task"] = parse_decimal(get("cpusPerTask"), "cpusPerTask", 1)
    try:
        return JobSpec(
            executable=executable,
            arguments=tuple(attributes.getall(A.PROG_ARGS)),
            environment=tuple(environment),
            working_dir=get(A.WORKING_DIR) or None,
            num_procs=num_procs,
            queue=queue,  # type: ignore[arg-type]
            candidates=candidates,  # type: ignore[arg-type]
            broker=get(BROKER) or None,
            name=get(JOB_NAME) or get(A.NAME) or None,
            hold=_boolean(get(CHANGE_HOLD) or "", CHANGE_HOLD),
            stdout_path=get("stdoutPath") or None,
            stderr_path=get("stderrPath") or None,
            client_ref=sub_id,
            account=get(K.ACCOUNT) or None,
            begin_time=get("beginTime") or None,
            extra=extra,
            **settings,
        )
    except (TypeError, ValueError) as exc:
        raise SubmitError(f"the submission cannot be read: {exc}", ErrorKind.BAD_REQUEST) from None


def _multi_part_spec(attributes: AttributeSet, sub_id: str, job_key: Optional[Callable[[str], int]]) -> JobSpec:
    """A multi-part job's submission (or one part's, with ``coallocJob``): the description
    travels in ``extra`` for the service; the program and queues are the parts' own."""
    extra = [(COALLOC_DESCRIPTION, attributes.get(COALLOC_DESCRIPTION) or "")]
    target = attributes.get(COALLOC_JOB)
    if target is not None:
        if job_key is None:
            raise SubmitError(f"{COALLOC_JOB} cannot be used here", ErrorKind.BAD_REQUEST)
        extra.append((COALLOC_JOB, str(job_key(target))))
    return JobSpec(executable="", name=attributes.get(JOB_NAME) or attributes.get(A.NAME) or None,
                   client_ref=sub_id, extra=tuple(extra))


def job_change(attributes: AttributeSet) -> Tuple[str, bool]:
    """What a CHANGE_JOB asks for: ``("suspend", bool)`` or ``("hold", bool)``.

    Understood: ``suspend=true|false``, ``jobState=SUSPENDED|RUNNING`` (the same in the
    IDE's own words) and ``hold=true|false``.  ``jobId`` (the target) is ignored.
    ``coallocRelease=now|wait`` gives ``("release", wait)``: a multi-part job's start barrier.
    """
    from ...service.jobs import JobError

    wanted: Dict[str, bool] = {}
    unsupported: List[str] = []
    for key in attributes.keys():
        if key == A.JOB_ID:
            continue
        value = attributes.get(key) or ""
        if key == CHANGE_SUSPEND:
            flag = _change_boolean(key, value)
            kind = "suspend"
        elif key == A.JOB_STATE:
            if value == "SUSPENDED":
                flag = True
            elif value == "RUNNING":
                flag = False
            else:
                raise JobError(f"jobState can only be changed to SUSPENDED or RUNNING, not {value!r}",
                               ErrorKind.NOT_SUPPORTED)
            kind = "suspend"
        elif key == CHANGE_HOLD:
            flag = _change_boolean(key, value)
            kind = "hold"
        elif key == COALLOC_RELEASE:
            if value.strip().lower() not in ("now", "wait"):
                raise JobError(f"{key} must be now or wait, got {value!r}", ErrorKind.BAD_REQUEST)
            flag = value.strip().lower() == "wait"
            kind = "release"
        else:
            unsupported.append(key)
            continue
        if kind in wanted and wanted[kind] != flag:
            raise JobError(f"the change asks for {kind} both true and false", ErrorKind.BAD_REQUEST)
        wanted[kind] = flag
    if unsupported:
        raise JobError(
            f"cannot change {', '.join(sorted(unsupported))} "
            f"(supported: suspend, hold, jobState=SUSPENDED|RUNNING, {COALLOC_RELEASE}=now|wait)",
            ErrorKind.NOT_SUPPORTED,
        )
    if not wanted:
        raise JobError("the change names nothing to change", ErrorKind.BAD_REQUEST)
    if len(wanted) > 1:
        raise JobError(f"{' and '.join(sorted(wanted))} cannot be changed together", ErrorKind.BAD_REQUEST)
    return next(iter(wanted.items()))


def _change_boolean(key: str, text: str) -> bool:
    from ...service.jobs import JobError

    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise JobError(f"{key} must be true or false, got {text!r}", ErrorKind.BAD_REQUEST)


# --------------------------------------------------------------------------- definitions

_VALUE_TYPES: Dict[ValueType, AttrType] = {
    ValueType.STRING: AttrType.STRING,
    ValueType.INTEGER: AttrType.INTEGER,
    ValueType.BIGINTEGER: AttrType.STRING,
    ValueType.DOUBLE: AttrType.DOUBLE,
    ValueType.BOOLEAN: AttrType.BOOLEAN,
    ValueType.ENUMERATED: AttrType.ENUMERATED,
    ValueType.DATE: AttrType.STRING,
    ValueType.LIST: AttrType.ARRAY,
    ValueType.REFERENCE: AttrType.STRING,
}

#: Definitions of the submission and change attributes the front-end itself understands.
SUBMISSION_ATTRIBUTES: Tuple[AttributeDefinition, ...] = (
    AttributeDefinition(A.JOB_SUB_ID, AttrType.STRING, "Submission ID",
                        "Tag the IDE attaches to a submission (required)", False),
    AttributeDefinition(A.EXEC_NAME, AttrType.STRING, "Executable",
                        "Program to run: a file name looked up on PATH, or a file in execPath"),
    AttributeDefinition(A.EXEC_PATH, AttrType.STRING, "Executable Path",
                        "Directory holding execName, or the program's full path"),
    AttributeDefinition(A.PROG_ARGS, AttrType.ARRAY, "Program Arguments",
                        "Arguments passed to the program verbatim (no shell), one per value"),
    AttributeDefinition(A.ENV, AttrType.ARRAY, "Environment",
                        "NAME=VALUE added to the job's environment, one per value"),
    AttributeDefinition(A.WORKING_DIR, AttrType.STRING, "Working Directory",
                        "Directory the processes start in (default: the agent's)"),
    AttributeDefinition(JOB_NAME, AttrType.STRING, "Job Name", "Display name of the job"),
    AttributeDefinition(CHANGE_SUSPEND, AttrType.BOOLEAN, "Suspend",
                        "CHANGE_JOB: true suspends a running job, false resumes it", False, "false"),
    AttributeDefinition(CHANGE_HOLD, AttrType.BOOLEAN, "Hold",
                        "Submit held, or CHANGE_JOB: true holds a job that has not started, false releases it",
                        False, "false"),
    AttributeDefinition("jobNativeState", AttrType.STRING, "Native State",
                        "The job's state in its scheduler's own words"),
    AttributeDefinition("processNativeState", AttrType.STRING, "Native State",
                        "The process's state in its scheduler's own words"),
    AttributeDefinition(K.BACKEND, AttrType.STRING, "Scheduler", "The scheduler the machine or queue belongs to"),
)


def attribute_definitions(infos: Sequence[AttrInfo], default_queue: Optional[str]) -> List[AttributeDefinition]:
    """MODEL_DEF's definitions: the standard ones, the front-end's, then the backends'.

    A backend's description of a standard attribute (a tighter bound on ``jobNumProcs``)
    replaces the standard one; ``default_queue`` (an element id) becomes ``queueId``'s
    default."""
    merged: Dict[str, AttributeDefinition] = {d.id: d for d in STANDARD_ATTRIBUTES}
    for definition in SUBMISSION_ATTRIBUTES:
        merged[definition.id] = definition
    merged[A.QUEUE_ID] = AttributeDefinition(
        A.QUEUE_ID, AttrType.STRING, "Queue ID",
        "Queue to submit to: its element id, NAME or SCHEDULER:NAME; several, comma-separated, for a broker",
        True, default_queue or "",
    )
    standard = {d.id for d in STANDARD_ATTRIBUTES}
    for info in infos:
        if info.name == K.STATE:
            continue
        shown = {ptp_id for kind in Kind if (ptp_id := ptp_attribute(kind, info.name)) is not None}
        for ptp_id in sorted(shown):
            if ptp_id in standard and ptp_id != A.JOB_NUM_PROCS:
                continue  # the standard definition is what every client already knows
            definition = _definition(ptp_id, info)
            if definition is not None:
                merged[definition.id] = definition
    return list(merged.values())


def _definition(ptp_id: str, info: AttrInfo) -> Optional[AttributeDefinition]:
    attr_type = _VALUE_TYPES[info.type]
    minimum, maximum = info.minimum, info.maximum
    default = info.default
    if attr_type is AttrType.INTEGER:
        default = default or "0"
        if maximum is None:
            maximum = str(INT32_MAX)
        if minimum is None:
            minimum = "0" if int(default) >= 0 else str(-INT32_MAX - 1)
    try:
        return AttributeDefinition(
            ptp_id, attr_type, info.label, info.description, info.display, default,
            minimum=minimum if attr_type in (AttrType.INTEGER, AttrType.DOUBLE) else None,
            maximum=maximum if attr_type in (AttrType.INTEGER, AttrType.DOUBLE) else None,
            values=info.choices if attr_type is AttrType.ENUMERATED else (),
        )
    except (TypeError, ValueError):
        return None
