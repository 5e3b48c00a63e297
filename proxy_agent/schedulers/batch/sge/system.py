"""Grid Engine (Son of Grid Engine 8.1.9 and its relatives) as data: the commands the batch
engine runs, how to read their answers, and what the job state letters mean.

Pure: argv lists and tables, no I/O.  Parsers are in :mod:`.parse`, the job script and
``qsub`` command line in :mod:`.directives`.

Job ids
-------
A job is ``N``; an array task ``N.T``; a group of pending array tasks ``N.1-9:2`` or
``N.1,7`` (as :func:`.parse.parse_jobs` names them).  The job commands take every form:
a comma list of tasks becomes one argv element per task, which ``qdel``, ``qhold``, ``qrls``
and ``qmod`` all accept.

Exit statuses lie
-----------------
``qmod -sj`` on a pending job and ``qalter -q`` on a running job exit 0 without doing
anything; ``qhold`` of a held job and ``qrls`` of one that is not held print nothing;
``qhold`` of an unknown job exits 3.  :func:`check_job_command` reads
the output instead and raises a :class:`~proxy_agent.service.jobs.JobError` that says what
Grid Engine said.
"""

from __future__ import annotations

import itertools
import re
from typing import Dict, Iterable, List, Optional, Sequence

from proxy_agent.service.jobs import ErrorKind, JobError, JobState, StateTable

from ..records import NativeJob
from .parse import QUEUE_INSTANCE_LETTERS, node_state, queue_instance_stopped

__all__ = [
    "SCHEDULER",
    "STATE_TABLE",
    "JOB_STATE_LETTERS",
    "QUEUE_INSTANCE_LETTERS",
    "node_state",
    "queue_instance_stopped",
    "normalize_state",
    "accounting_state",
    "final_record",
    "status_argv",
    "queues_argv",
    "hosts_argv",
    "detail_argv",
    "accounting_argv",
    "queue_config_argv",
    "delete_argv",
    "hold_argv",
    "release_argv",
    "suspend_argv",
    "resume_argv",
    "move_argv",
    "check_job_command",
    "check_job_id",
    "check_queue_name",
]

SCHEDULER = "sge"

# --------------------------------------------------------------------------- job states

#: Every letter ``qstat`` writes into a job's state, in the order it writes them.
JOB_STATE_LETTERS: Dict[str, str] = {
    "d": "being deleted",
    "E": "error: could not be started, waits until the error is cleared (qmod -cj)",
    "S": "suspended because its queue is suspended",
    "T": "suspended because a suspend threshold of its queue is exceeded",
    "h": "held",
    "R": "restarted (rescheduled)",
    "q": "queued",
    "r": "running",
    "s": "suspended",
    "t": "being transferred to its execution host",
    "w": "waiting",
    "x": "exiting: the execution daemon is collecting its usage",
}
_ORDER = {letter: i for i, letter in enumerate(JOB_STATE_LETTERS)}

_PENDING = ("q", "w", "qw")
_SUSPENDED = tuple("".join(c) for n in (1, 2, 3) for c in itertools.combinations("STs", n))
# Where a job can be in its life: pending, in transfer, running, suspended (with or without
# the running letter), exiting.  Each may carry any of the marks d, E, h, R.
_PHASES = _PENDING + ("t", "r", "x", "rx") + _SUSPENDED + tuple("r" + s for s in _SUSPENDED)
_MARKS = ("d", "E", "h", "R")


def normalize_state(text: str) -> str:
    """A state text with its letters in qstat's own order (``hRwq`` -> ``hRqw``).  Text with
    a letter qstat never writes, or a letter twice, comes back unchanged (and maps to OTHER)."""
    letters = text.strip()
    if not letters or any(c not in _ORDER for c in letters) or len(set(letters)) != len(letters):
        return text
    return "".join(sorted(letters, key=_ORDER.__getitem__))


def _meaning(letters: str) -> JobState:
    if "d" in letters or "x" in letters:
        # Deleted, or its processes have ended: the final state comes from accounting.
        return JobState.FINISHING
    if any(c in letters for c in "sST"):
        return JobState.SUSPENDED
    if "r" in letters or "t" in letters:
        return JobState.RUNNING
    # Pending.  An error state (Eqw) is a hold, not an end: the job stays in the queue and
    # starts once its owner or an administrator clears the error; ``reason`` (from
    # qstat -j) says what went wrong.
    if "h" in letters or "E" in letters:
        return JobState.HOLD
    return JobState.QUEUING


def _table() -> Dict[str, JobState]:
    table: Dict[str, JobState] = {}
    for phase in _PHASES:
        for n in range(len(_MARKS) + 1):
            for marks in itertools.combinations(_MARKS, n):
                key = normalize_state("".join(marks) + phase)
                table[key] = _meaning(key)
    return table


#: Every job state letter combination qstat can show, mapped into the service vocabulary.
STATE_TABLE = StateTable(SCHEDULER, _table(), normalize_state, not_given={
    JobState.PREPARING: "Grid Engine shows no phase between pending and running",
    JobState.FINISHED: "an ended job leaves qstat: its end comes from accounting (accounting_state)",
    JobState.KILLED: "an ended job leaves qstat: its end comes from accounting (accounting_state)",
    JobState.FAILED: "an ended job leaves qstat: its end comes from accounting (accounting_state)",
    JobState.DELETED: "a job gone from qstat and from accounting is the engine's to settle",
})

# Grid Engine's "failed" codes (accounting(5)) that mean the job was stopped from outside:
# 100 "assumedly after job" (killed by a signal: qdel), 37 a limit the master enforced.
_KILLED_CODES = frozenset({37, 100})


def accounting_state(record: NativeJob) -> JobState:
    """The final state of a job from its accounting record (:func:`.parse.parse_qacct`):
    FINISHED for exit 0, KILLED when deleted or stopped at a limit, FAILED otherwise."""
    if record.native_state == "failed":
        code = record.reason.split(":", 1)[0].strip()
        if code.isdigit() and int(code) in _KILLED_CODES:
            return JobState.KILLED
        return JobState.FAILED
    if record.exit_code == 0:
        return JobState.FINISHED
    return JobState.FAILED


def final_record(records: Sequence[NativeJob]) -> Optional[NativeJob]:
    """The record that ends a job: a rescheduled job has one per run, the last one counts."""
    if not records:
        return None
    return max(enumerate(records), key=lambda pair: (pair[1].end_time, pair[0]))[1]


# --------------------------------------------------------------------------- ids and names

_JOB_ID = re.compile(r"[1-9][0-9]*(?:\.[1-9][0-9]*(?:-[0-9]+(?::[0-9]+)?)?(?:,[1-9][0-9]*(?:-[0-9]+(?::[0-9]+)?)?)*)?\Z")
_QUEUE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(?:@[A-Za-z0-9_.@-]+)?\Z")


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Grid Engine job or task id, else JobError(NO_SUCH_JOB)."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise JobError(f"{job_id!r} is not a Grid Engine job id (N, N.T, N.A-B:S)", ErrorKind.NO_SUCH_JOB)
    return job_id


def check_queue_name(queue: str) -> str:
    """``queue`` if it can name a Grid Engine queue (``all.q``, ``all.q@host``)."""
    if not isinstance(queue, str) or not _QUEUE.match(queue):
        raise JobError(f"{queue!r} is not a Grid Engine queue name", ErrorKind.NO_SUCH_QUEUE)
    return queue


def _command_ids(job_id: str) -> List[str]:
    check_job_id(job_id)
    number, _, tasks = job_id.partition(".")
    if not tasks:
        return [number]
    return [f"{number}.{part}" for part in tasks.split(",")]


def _job_number(job_id: str) -> str:
    return check_job_id(job_id).partition(".")[0]


# --------------------------------------------------------------------------- queries


def status_argv(all_users: bool = False, user: Optional[str] = None) -> List[str]:
    """One query for every job the agent shows: the caller's, ``user``'s or everyone's.
    ``-r`` adds what a pending job asked for (queue, wall time) and its full name."""
    argv = ["qstat", "-xml", "-r"]
    if all_users:
        argv += ["-u", "*"]
    elif user:
        argv += ["-u", user]
    return argv


def queues_argv() -> List[str]:
    """Queue instances with their slots and states, and the running and suspended jobs in
    them (``-s rs``: pending jobs, which belong to no queue, would only make it long)."""
    return ["qstat", "-f", "-xml", "-u", "*", "-s", "rs"]


def hosts_argv() -> List[str]:
    """Execution hosts, each with its queue instances and their states."""
    return ["qhost", "-q", "-xml"]


def detail_argv(job_ids: Iterable[str]) -> List[str]:
    """One job's (or several jobs') detail, for an ``Eqw`` job's error above all."""
    numbers = list(dict.fromkeys(_job_number(j) for j in job_ids))
    if not numbers:
        raise ValueError("detail_argv needs at least one job id")
    return ["qstat", "-j", ",".join(numbers), "-xml"]


def accounting_argv(job_id: str) -> List[str]:
    """The accounting records of a job (of one array task for ``N.T``)."""
    number, _, task = check_job_id(job_id).partition(".")
    argv = ["qacct", "-j", number]
    if task.isdigit():
        argv += ["-t", task]
    return argv


def queue_config_argv(queue: str) -> List[str]:
    """A queue's configuration (its ``h_rt`` is the longest wall time it allows)."""
    return ["qconf", "-sq", check_queue_name(queue)]


# --------------------------------------------------------------------------- job commands


def delete_argv(job_id: str) -> List[str]:
    return ["qdel", *_command_ids(job_id)]


def hold_argv(job_id: str) -> List[str]:
    return ["qhold", *_command_ids(job_id)]


def release_argv(job_id: str) -> List[str]:
    return ["qrls", *_command_ids(job_id)]


def suspend_argv(job_id: str) -> List[str]:
    return ["qmod", "-sj", *_command_ids(job_id)]


def resume_argv(job_id: str) -> List[str]:
    return ["qmod", "-usj", *_command_ids(job_id)]


def move_argv(job_id: str, queue: str, native_state: str = "") -> List[str]:
    """``qalter -q QUEUE N``: move a pending job to another queue.

    Raises JobError when it cannot work: for an array task (qalter changes whole jobs only)
    and for a job that has started, which ``qalter`` would answer with success while the
    job stays where it runs.  ``native_state`` is the job's current state letters.
    """
    check_queue_name(queue)
    if "." in check_job_id(job_id):
        raise JobError(f"job {job_id}: Grid Engine moves whole jobs only, not array tasks; "
                       f"move job {_job_number(job_id)}")
    state = STATE_TABLE.map(native_state) if native_state else JobState.QUEUING
    if state not in (JobState.QUEUING, JobState.HOLD):
        raise JobError(f"job {job_id} is {state.value.lower()} (state {native_state}); "
                       "Grid Engine can move a job to another queue only while it waits")
    return ["qalter", "-q", queue, job_id]


# What each command prints when it did its work (per job or task), and what means "no such job".
_DONE = {
    "qdel": re.compile(r"has (?:registered the job|deleted job)|is already in deletion"),
    "qhold": re.compile(r"modified hold of job"),
    "qrls": re.compile(r"modified hold of job"),
    "-sj": re.compile(r"\bsuspended job|is already suspended"),
    "-usj": re.compile(r"\bunsuspended job|is already unsuspended"),
    "qalter": re.compile(r"modified hard queue list of job"),
}
_UNKNOWN = re.compile(r"does not exist|invalid queue or job|unknown job")


def check_job_command(argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
    """Raise JobError unless Grid Engine's answer to a job command (from the argv builders
    above) says it worked for every job named.  Exit statuses are not trusted either way."""
    output = "\n".join(part.strip() for part in (stdout, stderr) if part and part.strip())
    key = argv[1] if argv and argv[0] == "qmod" and len(argv) > 1 else (argv[0] if argv else "")
    done = _DONE.get(key)
    if done is None:
        raise ValueError(f"not a job command of this module: {list(argv)!r}")
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines and returncode == 0 and key in ("qhold", "qrls"):
        return  # a job already held (released) is left as it is, without a word
    succeeded = [line for line in lines if done.search(line)]
    failed = [line for line in lines if not done.search(line)]
    if succeeded and not failed:
        return
    message = "; ".join(failed or lines)[:500] or f"no answer (exit status {returncode})"
    kind = ErrorKind.NO_SUCH_JOB if _UNKNOWN.search(message) else ErrorKind.OPERATION_FAILED
    if key == "qalter" and "rejected because job requests unknown queue" in message:
        kind = ErrorKind.NO_SUCH_QUEUE
    raise JobError(f"{' '.join(argv[:2])}: {message}", kind)
