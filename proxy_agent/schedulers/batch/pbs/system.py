"""PBS as a batch system: commands as argv, which parser reads each, state tables.

One :class:`PbsSystem` per family (OpenPBS / PBS Professional, or Torque), chosen by probing
(:func:`~.parse.detect_family` on the output of the probe argv). The batch engine runs
the commands named here with a timeout, hands their stdout to the matching ``parse_*``
method and diffs the records. Pure: nothing here runs a command.

Decisions
---------
* One status query per poll for every job (``qstat -f -F json -t`` / ``qstat -f -x -t``);
  OpenPBS's long format has no user filter, so ``parse_status(..., user=...)`` filters.
  Finished OpenPBS jobs leave that listing (they are history, shown only with ``-x``): the
  engine then asks :meth:`PbsSystem.final_argv` (``qstat -x -f -F json ID``). Torque keeps a
  completed job in the listing with state ``C`` for ``keep_completed`` seconds; after that
  only the server logs know it, read with ``tracejob`` (usually only on the server host).
* Suspend and resume are ``qsig -s suspend|resume`` in both families; both require PBS
  operator or manager privilege. A refusal becomes a :class:`JobError` saying so.
* A running job cannot be moved to another queue (both families refuse); :meth:`check_move`
  says so before a command is run.
* States: every letter each family documents has a row; anything else maps to OTHER. For
  the final letters (``F``/``X``, ``C``) :meth:`PbsSystem.final_state` decides from the exit
  status: 0 FINISHED; deleted (the record says so) KILLED; killed for passing a limit it
  asked for KILLED; no exit status at all DELETED (OpenPBS) or KILLED (Torque: a completed
  job with no exit status was deleted before it ran); anything else FAILED.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

import attrs

from ....service.jobs import NEVER_STARTS, ErrorKind, JobError, JobSpec, JobState, ServiceError, StateTable, \
    SubmitError
from . import parse as P
from .directives import PbsSubmission, PbsUnsupported, build_submission
from ..records import NativeJob, NativeNode, NativeQueue
from ..script import BatchScriptError

__all__ = [
    "OPENPBS_STATES",
    "STATE_TABLES",
    "TORQUE_STATES",
    "PbsSystem",
    "node_state",
    "queue_state",
    "system_for",
]

S = JobState

#: OpenPBS / PBS Professional job states (the letters of its reference guide).
OPENPBS_STATES = {
    "B": S.RUNNING,  # job array begun: at least one sub-job has started
    "E": S.FINISHING,  # exiting after having run
    "F": S.FINISHED,  # finished (history); refined by final_state
    "H": S.HOLD,
    "M": S.DELETED,  # moved to another server: gone from this one
    "Q": S.QUEUING,
    "R": S.RUNNING,
    "S": S.SUSPENDED,
    "T": S.QUEUING,  # in transit to another queue
    "U": S.SUSPENDED,  # suspended because its workstation is busy
    "W": S.QUEUING,  # waiting for its start time
    "X": S.FINISHED,  # a finished sub-job; refined by final_state
}

#: Torque job states.
TORQUE_STATES = {
    "C": S.FINISHED,  # completed, kept for keep_completed seconds; refined by final_state
    "E": S.FINISHING,
    "H": S.HOLD,
    "Q": S.QUEUING,
    "R": S.RUNNING,
    "S": S.SUSPENDED,
    "T": S.QUEUING,
    "W": S.QUEUING,
}


def _state_key(native: str) -> str:
    return native.strip().upper()


#: What neither family's letters say: an ended job's outcome comes from its exit status.
_ENDS_BY_EXIT = {S.KILLED: "an ended job's outcome is its exit status's (PbsSystem.final_state)",
                 S.FAILED: "an ended job's outcome is its exit status's (PbsSystem.final_state)"}
#: Each family's table of job states.
STATE_TABLES = {
    P.FAMILY_OPENPBS: StateTable("pbs", OPENPBS_STATES, _state_key, not_given={
        S.PREPARING: "PBS shows no phase between queued and running", **_ENDS_BY_EXIT}),
    P.FAMILY_TORQUE: StateTable("torque", TORQUE_STATES, _state_key, not_given={
        S.PREPARING: "Torque shows no phase between queued and running", **_ENDS_BY_EXIT,
        S.DELETED: "a job gone from qstat is the engine's to settle"}),
}
_FINAL_LETTERS = {P.FAMILY_OPENPBS: {"F", "X"}, P.FAMILY_TORQUE: {"C"}}

_NODE_ERROR = {"stale", "unresolvable"}
_NODE_DOWN = {"down", "offline", "maintenance"}
_NODE_UP = {
    "free", "busy", "job-busy", "job-exclusive", "job-sharing", "resv-exclusive", "reserve",
    "time-shared", "timeshared", "provisioning", "wait-provisioning", "sleep", "active", "up",
}


def node_state(native: str) -> str:
    """A node's state text (one word or several joined by commas, either family) ->
    ``UP``, ``DOWN``, ``ERROR`` or ``UNKNOWN``: a fault the node cannot report from
    (``stale``, ``unresolvable``) is ERROR; not taking work (``down``, ``offline``,
    ``maintenance``) DOWN; ``state-unknown`` alone or an unknown word UNKNOWN; busy or free
    UP."""
    words = {word.strip().lower() for word in native.split(",") if word.strip()}
    if words & _NODE_ERROR:
        return "ERROR"
    if words & _NODE_DOWN:
        return "DOWN"
    if not words or not words <= _NODE_UP:
        return "UNKNOWN"
    return "UP"


#: the scheduler's comment on a queued job that no node or queue can ever run as it asks
_NEVER = re.compile(r"^Can Never Run\b|would never run", re.IGNORECASE)


def _never_runs(job: NativeJob) -> NativeJob:
    """A queued job the scheduler says can never run (``Can Never Run: Insufficient amount
    of resource: ncpus (R: 4 A: 2 T: 2)``, ``Not Running: Job would never run``) says so
    first, in the scheduler's words."""
    if job.native_state == "Q" and _NEVER.search(job.reason):
        return attrs.evolve(job, reason=NEVER_STARTS + job.reason)
    return job


def queue_state(enabled: bool, started: bool) -> str:
    """A queue takes and starts jobs (NORMAL) only when both enabled and started."""
    return "NORMAL" if enabled and started else "STOPPED"


_JOB_ID = re.compile(
    r"\d+(?:\[\d*(?:-\d+(?::\d+)?)?\])?(?:\.[A-Za-z0-9][A-Za-z0-9._\-]*)?(?:@[A-Za-z0-9][A-Za-z0-9._\-]*)?\Z"
)


def _job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise JobError(f"{job_id!r} is not a PBS job id", ErrorKind.BAD_REQUEST)
    return job_id


_UNAVAILABLE = re.compile(
    r"cannot connect to server|Connection refused|Communication failure|pbs_iff|"
    r"server is not running|No route to host|Network is unreachable|timed out",
    re.IGNORECASE,
)


@attrs.frozen
class PbsSystem:
    """One PBS family (and version) as the batch engine uses it."""

    family: str
    version: Tuple[int, ...] = ()
    flavour: str = ""

    # -- identity -----------------------------------------------------------------------

    @property
    def openpbs(self) -> bool:
        return self.family == P.FAMILY_OPENPBS

    @property
    def state_table(self) -> StateTable:
        return STATE_TABLES[self.family]

    # -- listings ------------------------------------------------------------------------

    def status_argv(self) -> List[str]:
        """Every job, array parents and their sub-jobs, whoever owns them."""
        if self.openpbs:
            return ["qstat", "-f", "-F", "json", "-t"]
        return ["qstat", "-f", "-x", "-t"]

    def parse_status(self, stdout: str, user: Optional[str] = None) -> List[NativeJob]:
        """Jobs of the status listing (only ``user``'s when given). For Torque the arrays,
        which ``-t`` lists only as their elements, get a derived parent record each."""
        if self.openpbs:
            return [_never_runs(job) for job in P.parse_openpbs_jobs(stdout, user)]
        jobs = P.parse_torque_jobs(stdout, user)
        return jobs + P.array_parents(jobs)

    def nodes_argv(self) -> List[str]:
        return ["pbsnodes", "-a", "-F", "json"] if self.openpbs else ["pbsnodes", "-x"]

    def parse_nodes(self, stdout: str) -> List[NativeNode]:
        if self.openpbs:
            return P.parse_openpbs_nodes(stdout, node_state)
        return P.parse_torque_nodes(stdout, node_state)

    def queues_argv(self) -> List[str]:
        return ["qstat", "-Q", "-f", "-F", "json"] if self.openpbs else ["qstat", "-Q", "-f", "-1"]

    def parse_queues(self, stdout: str, default_queue: Optional[str] = None) -> List[NativeQueue]:
        """Queues; ``default_queue`` (from :meth:`parse_server`) marks the default."""
        if self.openpbs:
            return P.parse_openpbs_queues(stdout, default_queue, queue_state)
        return P.parse_torque_queues(stdout, default_queue, queue_state)

    def server_argv(self) -> List[str]:
        return ["qstat", "-B", "-f", "-F", "json"] if self.openpbs else ["qstat", "-B", "-f", "-1"]

    def parse_server(self, stdout: str) -> P.ServerInfo:
        return P.parse_openpbs_server(stdout) if self.openpbs else P.parse_torque_server(stdout)

    # -- submission ----------------------------------------------------------------------

    def submission(self, spec: JobSpec, submit_host: Optional[str] = None) -> PbsSubmission:
        """qsub argv and script (for its stdin). A job this family cannot express raises
        :class:`SubmitError` naming the setting (NOT_SUPPORTED for one PBS lacks)."""
        try:
            return build_submission(spec, self.family, self.version, submit_host)
        except PbsUnsupported as error:
            raise SubmitError(str(error), ErrorKind.NOT_SUPPORTED) from None
        except BatchScriptError as error:
            raise SubmitError(str(error), ErrorKind.BAD_REQUEST) from None

    def parse_submit(self, stdout: str) -> str:
        """The new job's id from qsub's stdout."""
        try:
            return P.parse_qsub_output(stdout)
        except P.PbsParseError as error:
            raise SubmitError(str(error)) from None

    def submit_error(self, stderr: str) -> ServiceError:
        """qsub failed: the error to report, in the scheduler's own words."""
        message = _first_line(stderr) or "qsub failed without a message"
        if _UNAVAILABLE.search(stderr):
            return ServiceError(f"the PBS server is not answering: {message}", ErrorKind.UNAVAILABLE)
        if re.search(r"Unknown queue|Unknown destination", stderr, re.IGNORECASE):
            return SubmitError(f"no such queue: {message}", ErrorKind.NO_SUCH_QUEUE)
        return SubmitError(f"qsub refused the job: {message}")

    # -- job commands --------------------------------------------------------------------

    def delete_argv(self, job_id: str) -> List[str]:
        return ["qdel", _job_id(job_id)]

    def hold_argv(self, job_id: str) -> List[str]:
        return ["qhold", _job_id(job_id)]

    def release_argv(self, job_id: str) -> List[str]:
        return ["qrls", _job_id(job_id)]

    def suspend_argv(self, job_id: str) -> List[str]:
        return ["qsig", "-s", "suspend", _job_id(job_id)]

    def resume_argv(self, job_id: str) -> List[str]:
        return ["qsig", "-s", "resume", _job_id(job_id)]

    def move_argv(self, job_id: str, queue: str) -> List[str]:
        if not queue or queue.startswith("-") or any(ch.isspace() or ch == "\0" for ch in queue):
            raise JobError(f"{queue!r} is not a queue name", ErrorKind.NO_SUCH_QUEUE)
        return ["qmove", queue, _job_id(job_id)]

    @staticmethod
    def check_move(state: JobState) -> None:
        """PBS moves only jobs that have not started."""
        if state.started or state.final:
            raise JobError(
                f"a job that is {state.value.lower()} cannot move to another queue "
                "(PBS moves only jobs that have not started)"
            )

    def command_error(self, operation: str, job_id: str, stderr: str) -> ServiceError:
        """A job command (``operation``: delete, hold, release, suspend, resume, move)
        failed with ``stderr``: the error to report."""
        message = _first_line(stderr) or f"{operation} failed without a message"
        if P.is_unknown_job_error(stderr):
            return JobError(f"the PBS server has no job {job_id}", ErrorKind.NO_SUCH_JOB)
        if _UNAVAILABLE.search(stderr):
            return ServiceError(f"the PBS server is not answering: {message}", ErrorKind.UNAVAILABLE)
        if re.search(r"Unauthorized|not authorized|permission denied", stderr, re.IGNORECASE):
            why = (
                "; suspending and resuming PBS jobs needs PBS operator or manager privilege"
                if operation in ("suspend", "resume")
                else ""
            )
            return JobError(f"PBS refused to {operation} job {job_id}: {message}{why}")
        if re.search(r"Unknown queue|Unknown destination", stderr, re.IGNORECASE):
            return JobError(f"no such queue: {message}", ErrorKind.NO_SUCH_QUEUE)
        if re.search(r"invalid for state|job is running|Invalid request", stderr, re.IGNORECASE):
            return JobError(f"cannot {operation} job {job_id} in its present state: {message}")
        return JobError(f"{operation} of job {job_id} failed: {message}")

    # -- final state ---------------------------------------------------------------------

    def final_argv(self, job_id: str) -> List[str]:
        """The record of a job that left the status listing: OpenPBS history (kept for
        ``job_history_duration`` when history is on); Torque only while it is kept."""
        if self.openpbs:
            return ["qstat", "-x", "-f", "-F", "json", _job_id(job_id)]
        return ["qstat", "-f", "-x", _job_id(job_id)]

    def parse_final(self, stdout: str, job_id: str) -> Optional[NativeJob]:
        """The job's final record from :meth:`final_argv`'s output; None while it has not
        ended or when the output holds no such job."""
        jobs = P.parse_openpbs_jobs(stdout) if self.openpbs else P.parse_torque_jobs(stdout)
        for job in jobs:
            if job.job_id == job_id or job.job_id.split(".", 1)[0] == job_id.split(".", 1)[0]:
                if _state_key(job.native_state) in _FINAL_LETTERS[self.family]:
                    return job
        return None

    def tracejob_argv(self, job_id: str) -> List[str]:
        """The server logs of the last two days (tracejob needs to read them)."""
        return ["tracejob", "-n", "2", _job_id(job_id)]

    def parse_tracejob(self, stdout: str, job_id: str) -> Optional[NativeJob]:
        return P.parse_tracejob(stdout, self.family, job_id)

    def final_state(self, job: NativeJob) -> JobState:
        """The service state of a job record; for an ended job decided by its exit status
        (see the module docstring)."""
        mapped = self.state_table.map(job.native_state)
        if _state_key(job.native_state) not in _FINAL_LETTERS[self.family]:
            return mapped
        if job.cancelled:
            return S.KILLED
        if job.signal:
            # Torque reports 271 (SIGTERM + 256) for a job deleted while it ran.
            if not self.openpbs and job.signal == "15":
                return S.KILLED
            return S.FAILED
        if job.exit_code is None:
            return S.DELETED if self.openpbs else S.KILLED
        if job.exit_code == 0:
            return S.FINISHED
        if job.exit_code in P.LIMIT_KILL_CODES[self.family]:
            return S.KILLED
        return S.FAILED


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def system_for(probe: P.ProbeResult) -> PbsSystem:
    """The system a probe found."""
    return PbsSystem(probe.family, probe.version, probe.flavour)
