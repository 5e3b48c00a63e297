"""SLURM as data: its job states, what its records mean in the neutral records of the batch
engine, its attributes and its file name patterns.

Pure: no I/O.  The commands and the parsers of their answers are in
:mod:`.parse`; the backend is :mod:`.backend`.

How SLURM's records become the engine's
---------------------------------------
* a job's state is SLURM's state as one upper-case long name (``CD`` -> ``COMPLETED``,
  ``COMPLETED+COMPLETING`` -> ``COMPLETING``), mapped by :data:`STATE_TABLE`; SLURM lists a
  held job as PENDING and says so in its reason, so a pending job whose reason is
  ``JobHeldUser`` or ``JobHeldAdmin`` is HOLD (:func:`service_state`);
* its message is SLURM's reason, explained when it means the job will never start
  (:func:`.parse.job_message`);
* its exit status ``CODE:SIGNAL`` becomes the exit code (128 + the signal number when a
  signal ended it, as shells do) and the signal;
* its host list stays in SLURM's notation (``node[1-4]``): process 0 is on its
  :func:`first_host`;
* a job without a task count (pending without ``--ntasks``: ``N/A`` or SLURM's "no value"
  4294967294) has one process, so that rank 0 is within it.
"""

from __future__ import annotations

import functools
import re
from typing import List, Optional, Tuple

from ....service.attributes import AttrInfo, ValueType
from ....service.jobs import JobState, StateTable
from ....service.model import K
from . import parse as sp
from .parse import SlurmJob, SlurmNode, SlurmPartition
from ..records import NativeJob, NativeNode, NativeQueue

__all__ = [
    "DISPLAY_ATTRIBUTES",
    "STATE_TABLE",
    "SUBMIT_ATTRIBUTES",
    "clean_message",
    "expand_output_pattern",
    "first_host",
    "native_job",
    "native_node",
    "native_queue",
    "native_word",
    "service_state",
    "slurm_duration",
    "split_exit_code",
]

_FLAG_PRECEDENCE = (
    "COMPLETING", "STAGE_OUT", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT", "REQUEUE_FED",
    "REQUEUED", "CONFIGURING", "SIGNALING", "RESIZING", "STOPPED", "REVOKED",
)


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

#: SLURM's reasons for a pending job that waits to be released, not for resources.
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})


@functools.lru_cache(maxsize=1024)
def native_word(raw: str) -> str:
    """SLURM's state as one upper-case long name (``CD`` -> ``COMPLETED``)."""
    return _state_key(raw) or "UNKNOWN"


def service_state(native_state: str, reason: str) -> JobState:
    """The service state of a job in ``native_state`` waiting for ``reason``."""
    state = STATE_TABLE.map(native_state)
    if state is JobState.QUEUING and reason in HELD_REASONS:
        return JobState.HOLD
    return state


# --------------------------------------------------------------------------- records

#: SLURM's "no value" marker for a 32-bit count (and "infinite" above it).
_NO_VALUE = 0xFFFFFFFE


def split_exit_code(text: str) -> Tuple[Optional[int], int]:
    """``"3:0"`` -> (3, 0), ``"0:9"`` -> (0, 9), anything else -> (None, 0)."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None, 0
    return int(code), int(sig) if sig.isdigit() else 0


def _seconds(duration: str) -> Optional[int]:
    return sp.duration_seconds(duration) if duration else None


#: Durations that repeat from job to job (time limits), read once.
_limit_seconds = functools.lru_cache(maxsize=4096)(_seconds)


@functools.lru_cache(maxsize=4096)
def _state_and_message(state: str, reason: str) -> Tuple[str, str]:
    word = native_word(state)
    pending = service_state(word, reason) in (JobState.QUEUING, JobState.HOLD)
    return word, sp.job_message(reason, pending=pending)


@functools.lru_cache(maxsize=1024)
def _exit(text: str) -> Tuple[Optional[int], str]:
    code, sig = split_exit_code(text)
    return None if code is None else (128 + sig if sig else code), str(sig) if sig else ""


def native_job(job: SlurmJob) -> NativeJob:
    """A SLURM job record as the engine's record (see the module documentation)."""
    word, message = _state_and_message(job.state, job.reason)
    exit_code, signal = _exit(job.exit_code)
    tasks = job.num_tasks
    return NativeJob(
        job.job_id, name=job.name, user=job.user, queue=job.partition, native_state=word, reason=message,
        account=job.account, hosts=(job.nodes,) if job.nodes else (), num_nodes=job.num_nodes,
        num_cpus=job.num_cpus, num_procs=tasks if tasks and 0 < tasks < _NO_VALUE else 1,
        time_used=_seconds(job.time_used), time_limit=_limit_seconds(job.time_limit),
        exit_code=exit_code, signal=signal, work_dir=job.work_dir, stdout_path=job.stdout_path,
        stderr_path=job.stderr_path, cancelled=word == "CANCELLED",
    )


def native_node(node: SlurmNode) -> NativeNode:
    state, raw = sp.map_node_state(node.state)
    return NativeNode(node.name, native_state=raw, state=state, cpus=node.cpus, cpus_used=node.alloc_cpus,
                      memory_mb=node.memory_mb, queues=tuple(node.partitions), reason=node.reason)


def native_queue(part: SlurmPartition) -> NativeQueue:
    state, raw = sp.map_partition_state(part.state)
    return NativeQueue(part.name, native_state=raw, state=state, is_default=part.is_default,
                       max_time=_seconds(part.max_time), default_time=_seconds(part.default_time),
                       max_nodes=part.max_nodes, total_nodes=part.total_nodes, total_slots=part.total_cpus,
                       hosts=(part.nodes,) if part.nodes else ())


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


# --------------------------------------------------------------------------- texts

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


def slurm_duration(seconds: int) -> str:
    """Seconds in sbatch's ``[D-]HH:MM:SS``."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text


# --------------------------------------------------------------------------- attributes

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
    AttrInfo(K.VERSION, ValueType.STRING, "Version", "Version of the scheduler installation"),
    AttrInfo(K.NATIVE_STATE, ValueType.STRING, "Native State",
             "The element's state in the scheduler's own words (IDLE, MIXED+DRAIN, PENDING...)"),
    AttrInfo(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
    AttrInfo(K.CPUS_USED, ValueType.INTEGER, "CPUs Allocated", "CPUs of the node allocated to jobs", default="0"),
    AttrInfo(K.MEMORY, ValueType.INTEGER, "Memory (MB)", "Memory the node has, in megabytes", default="0"),
    AttrInfo(K.QUEUES, ValueType.STRING, "Partitions", "Partitions the node belongs to, comma-separated"),
    AttrInfo(K.REASON, ValueType.STRING, "Reason", "Why the node is down, drained or failing"),
    AttrInfo(K.DEFAULT, ValueType.BOOLEAN, "Default Queue", "Whether jobs that name no queue go here",
             default="false"),
    AttrInfo(K.MAX_TIME, ValueType.INTEGER, "Maximum Time (s)",
             "Longest time limit a job of the queue may have, in seconds (absent: unlimited)", default="0"),
    AttrInfo(K.DEFAULT_TIME, ValueType.INTEGER, "Default Time (s)",
             "Time limit of a job of the queue that sets none, in seconds", default="0"),
    AttrInfo(K.MAX_NODES, ValueType.INTEGER, "Maximum Nodes",
             "Most nodes one job of the queue may use (absent: unlimited)", default="0"),
    AttrInfo(K.TOTAL_NODES, ValueType.INTEGER, "Total Nodes", "Nodes in the queue", default="0"),
    AttrInfo(K.TOTAL_SLOTS, ValueType.INTEGER, "Total Slots", "Processor slots (CPUs) in the queue", default="0"),
    AttrInfo(K.HOSTS, ValueType.STRING, "Hosts",
             "Nodes of the queue, or nodes the job runs on, in SLURM's notation"),
    AttrInfo(K.NATIVE_ID, ValueType.STRING, "Native Job ID",
             "The job's id in its scheduler (for squeue, scontrol...)"),
    AttrInfo(K.NUM_NODES, ValueType.INTEGER, "Nodes", "Nodes the job uses or asked for", default="0"),
    AttrInfo(K.NUM_CPUS, ValueType.INTEGER, "CPUs Used", "CPUs the job uses or asked for", default="0"),
    AttrInfo(K.TIME_USED, ValueType.INTEGER, "Time Used (s)",
             "Run time so far in seconds (refreshed at least once a minute)", default="0"),
    AttrInfo(K.TIME_LIMIT, ValueType.INTEGER, "Time Limit (s)", "The job's time limit in seconds", default="0"),
    AttrInfo(K.ACCOUNT, ValueType.STRING, "Account", "Account the job is charged to"),
    AttrInfo(K.EXIT_CODE, ValueType.INTEGER, "Exit Code", "How the job or process ended", default="0"),
)

#: Submission settings other than the partition (whose legal values come from the cluster).
SUBMIT_ATTRIBUTES: Tuple[AttrInfo, ...] = (
    AttrInfo(K.ACCOUNT, ValueType.STRING, "Account",
             "Account the job is charged to (sbatch --account); empty: your default", settable=True),
    AttrInfo(K.TIME_LIMIT, ValueType.STRING, "Time Limit",
             "Time limit (sbatch --time): minutes, or [D-]HH:MM:SS; empty: the partition's default",
             settable=True),
    AttrInfo(NODES, ValueType.INTEGER, "Nodes", "Nodes to run on (sbatch --nodes); 0 lets SLURM decide",
             default="0", minimum="0", settable=True),
    AttrInfo(CPUS_PER_TASK, ValueType.INTEGER, "CPUs per Task", "CPUs for each process (sbatch --cpus-per-task)",
             default="1", minimum="1", settable=True),
    AttrInfo(MEMORY, ValueType.STRING, "Memory",
             "Memory per node (sbatch --mem): megabytes, or 500M, 4G; empty: the partition's default",
             settable=True),
    AttrInfo(K.HOLD, ValueType.BOOLEAN, "Hold",
             "Submit the job held (sbatch --hold); hold and release act on a pending job", default="false",
             settable=True),
    AttrInfo(BEGIN_TIME, ValueType.STRING, "Begin Time",
             "Do not start before this time (sbatch --begin): 2030-01-31T10:00, now+1hour, tomorrow...",
             settable=True),
    AttrInfo(STDOUT_PATH, ValueType.STRING, "Standard Output File",
             "Where the job's standard output goes (sbatch --output, %j is the job id); "
             "empty: a file in ~/.proxy-agent/slurm that the agent follows", settable=True),
    AttrInfo(STDERR_PATH, ValueType.STRING, "Standard Error File",
             "Where the job's standard error goes (sbatch --error); empty: next to the standard output",
             settable=True),
    AttrInfo("gpus", ValueType.INTEGER, "GPUs", "GPUs for the job (sbatch --gpus)", minimum="0", settable=True),
    AttrInfo("gres", ValueType.STRING, "Generic Resources",
             "Generic resources (sbatch --gres): gpu:2, gpu:a100:1, comma separated", settable=True),
    AttrInfo("qos", ValueType.STRING, "Quality of Service", "Quality of service (sbatch --qos)", settable=True),
    AttrInfo("constraint", ValueType.STRING, "Constraint",
             "Node features the job needs (sbatch --constraint): fast&ib, a|b", settable=True),
    AttrInfo("exclusive", ValueType.BOOLEAN, "Exclusive", "Nodes for this job alone (sbatch --exclusive)",
             default="false", settable=True),
    AttrInfo("array", ValueType.STRING, "Array",
             "Job array task ids (sbatch --array): 1-10, 1-9:2,20, %N for N tasks at once", settable=True),
    AttrInfo("prologue", ValueType.STRING, "Prologue",
             "Shell commands run before the program (module load gcc), one per line", settable=True),
    AttrInfo("nativeOptions", ValueType.STRING, "Native Options",
             "Further sbatch options (--comment=x --mail-type=END), checked against sbatch's options",
             settable=True),
)
