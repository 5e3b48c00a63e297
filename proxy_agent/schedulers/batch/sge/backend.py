"""The Grid Engine backend (``--scheduler sge``): Grid Engine on the batch engine.

Everything Grid Engine-specific is in :mod:`.system` (commands and state letters),
:mod:`.parse` (answers) and :mod:`.directives` (qsub options and job script); this
module tells the engine which to use when:

* the version from ``qstat -help`` (its first line, ``SGE 8.1.9``);
* jobs from one ``qstat -xml -r`` per poll (``-u '*'`` with ``--all-users``); a job in an
  error state (``Eqw``) gets its error from ``qstat -j``;
* cluster queues from ``qstat -f -xml`` (slots, states, running jobs) at every poll, and
  their wall-time limit from ``qconf -sq`` (see the engine: at the definitions interval,
  for a new queue, and after the master answers again); hosts from ``qhost -q -xml``;
* a job that left the listing from ``qacct -j`` (exit status, signal, deleted or failed);
* submission with ``qsub -terse``, the script on its stdin; ``qdel``, ``qhold``/``qrls``,
  ``qmod -sj``/``-usj`` and ``qalter -q``, each answer read (not only its exit status).
"""

from __future__ import annotations

import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs

from ....service.attributes import AttrInfo, ValueType
from ....service.jobs import NEVER_STARTS, ErrorKind, JobSpec, JobState, StateTable, SubmitError
from . import directives as sge_script, parse as sge_parse, system as sge
from ..engine import BatchBackend, BatchOptions, BatchSystem, CommandResult, Parse, Run, one_line
from ..records import NativeJob, NativeQueue

__all__ = ["SgeBackend", "SgeOptions", "SgeSystem"]

_ACCOUNTING = ("exited", "failed")
#: a note of the scheduler that a place can never take the job (not that it is busy now)
_CANNOT_RUN = re.compile(r"cannot run (in queue|in PE|at host|globally)")


def never_runs(note: str) -> bool:
    """Whether the scheduler's notes on a pending job (``;``-separated) say that no queue
    can ever run it as submitted: each one says a place cannot run it, none that a place is
    busy, full, disabled or the job over a quota for now."""
    notes = [n.strip() for n in note.split(";") if n.strip()]
    return bool(notes) and all(_CANNOT_RUN.search(n) for n in notes)


class SgeSystem(BatchSystem):
    label = "Grid Engine"
    #: seconds after a job is first listed waiting during which the scheduler's notes on it
    #: are asked for at each poll (until one says it can never run)
    NOTE_WINDOW = 600.0
    #: jobs asked about in one poll
    NOTE_BATCH = 100

    def __init__(self, settings: sge_script.SgeSettings = sge_script.DEFAULT_SETTINGS) -> None:
        self.settings = settings
        #: job number -> when it was first listed waiting without a note
        self._waiting_since: Dict[str, float] = {}
        #: job number -> the scheduler's words on why it can never run
        self._never: Dict[str, str] = {}

    async def fetch(self, what: str, user: Optional[str], run: Run, parse: Parse) -> Any:
        answer = await super().fetch(what, user, run, parse)
        if what != "jobs" or answer is None:
            return answer
        return await self._with_never_notes(answer, run)

    async def _with_never_notes(self, jobs: List[NativeJob], run: Run) -> List[NativeJob]:
        """A job waiting (``qw``) that no queue can ever run shows Grid Engine's own words on
        why (``(-l h_rt=72000) cannot run in queue "short.q" ...``), from the first poll after
        the scheduler looked at it: ``qstat -j`` for the waiting jobs not yet explained, for
        :data:`NOTE_WINDOW` seconds after each was first listed."""
        waiting = {job.job_id.partition(".")[0] for job in jobs if job.native_state == "qw"}
        for table in (self._waiting_since, self._never):
            for number in [n for n in table if n not in waiting]:
                del table[number]
        now = time.monotonic()
        ask = [n for n in sorted(waiting) if n not in self._never
               and now - self._waiting_since.setdefault(n, now) < self.NOTE_WINDOW][:self.NOTE_BATCH]
        if ask:
            result = await run(sge.detail_argv(ask), check=False)
            if result.returncode == 0:
                try:
                    details = sge_parse.parse_job_detail(result.out)
                except sge_parse.SgeParseError:
                    details = []
                for detail in details:
                    if never_runs(detail.reason):
                        self._never[detail.job_id.partition(".")[0]] = f"{NEVER_STARTS}{detail.reason}"
        if not self._never:
            return jobs
        return [attrs.evolve(job, reason=self._never[job.job_id.partition(".")[0]])
                if job.native_state == "qw" and job.job_id.partition(".")[0] in self._never else job
                for job in jobs]

    @property
    def state_table(self) -> StateTable:
        return sge.STATE_TABLE

    async def start(self, run: Run) -> str:
        result = await run(["qstat", "-help"], check=False)
        first = (result.out.strip().splitlines() or [""])[0]
        if not first.startswith(("SGE", "GE", "OGS", "UGE", "Univa")):
            raise ValueError(f"qstat -help did not name a Grid Engine: {one_line(result.out + result.err)[:200]!r}")
        await run(sge.queues_argv())  # the master answers
        return first.split()[-1]

    def status_argv(self, user: Optional[str]) -> Sequence[str]:
        return sge.status_argv(all_users=user is None, user=user)

    def parse_status(self, text: str, user: Optional[str]) -> List[NativeJob]:
        return sge_parse.with_arrays(sge_parse.parse_jobs(text))

    def queues_argv(self) -> Sequence[str]:
        return sge.queues_argv()

    def parse_queues(self, text: str) -> List[NativeQueue]:
        return sge_parse.parse_queues(text)

    detail_fields = ("max_time",)

    async def queue_details(self, queues: List[NativeQueue], run: Run) -> Dict[str, NativeQueue]:
        out = {}
        for queue in queues:
            result = await run(sge.queue_config_argv(queue.name), check=False)
            if result.returncode == 0:
                out[queue.name] = attrs.evolve(
                    queue, max_time=sge_parse.queue_max_time(sge_parse.parse_queue_config(result.out)))
        return out

    def nodes_argv(self) -> Sequence[str]:
        return sge.hosts_argv()

    def parse_nodes(self, text: str):
        return sge_parse.parse_hosts(text)

    def job_state(self, job: NativeJob) -> JobState:
        if job.native_state in _ACCOUNTING:
            return sge.accounting_state(job)
        return sge.STATE_TABLE.map(job.native_state)

    async def explain(self, jobs: List[NativeJob], run: Run) -> List[NativeJob]:
        """Jobs in an error state (``Eqw``) get Grid Engine's reason from ``qstat -j``."""
        failing = [j for j in jobs if "E" in j.native_state and not j.reason]
        if not failing:
            return jobs
        result = await run(sge.detail_argv([j.job_id for j in failing]), check=False)
        reasons = {d.job_id.partition(".")[0]: d.reason for d in sge_parse.parse_job_detail(result.out) if d.reason}
        return [attrs.evolve(j, reason=reasons.get(j.job_id.partition(".")[0], j.reason)) if j in failing else j
                for j in jobs]

    async def final_record(self, job_id: str, run: Run) -> Optional[NativeJob]:
        result = await run(sge.accounting_argv(job_id), check=False)
        if result.returncode != 0:
            return None  # "job id N not found": not written yet, or the job never ran
        return sge.final_record(sge_parse.parse_qacct(result.out))

    def submit_command(self, spec: JobSpec) -> Tuple[List[str], bytes]:
        argv = sge_script.submit_argv(spec, self.settings)
        return argv, sge_script.render_script(spec, self.settings).encode("utf-8")

    def parse_submitted(self, result: CommandResult) -> str:
        message = one_line(result.err or result.out)
        if result.returncode != 0:
            kind = ErrorKind.NO_SUCH_QUEUE if "unknown queue" in message else ErrorKind.SUBMIT_FAILED
            raise SubmitError(f"qsub refused the job: {message or f'exit status {result.returncode}'}", kind)
        try:
            return sge_parse.parse_qsub_terse(result.out)[0]
        except sge_parse.SgeParseError as exc:
            raise SubmitError(f"{exc}; qsub said: {message}") from None

    def job_command(self, op: str, job: NativeJob, queue: str = "") -> List[str]:
        if op == "move":
            return sge.move_argv(job.job_id, queue, job.native_state)
        builder = {"delete": sge.delete_argv, "hold": sge.hold_argv, "release": sge.release_argv,
                   "suspend": sge.suspend_argv, "resume": sge.resume_argv}[op]
        return builder(job.job_id)

    def check_job_command(self, op: str, job_id: str, argv: Sequence[str], result: CommandResult) -> None:
        sge.check_job_command(argv, result.returncode, result.out, result.err)


@attrs.frozen
class SgeOptions(BatchOptions):
    #: the parallel environment a job with several slots asks for
    pe: str = "smp"


class SgeBackend(BatchBackend):
    """A Grid Engine cell (see the module documentation)."""

    name = "sge"
    summary = "Grid Engine (qstat, qsub, qdel, qhold, qrls, qmod, qalter, qacct)"

    def make_system(self) -> BatchSystem:
        return SgeSystem(attrs.evolve(sge_script.DEFAULT_SETTINGS, pe_name=getattr(self.options, "pe", "smp")))

    @classmethod
    def add_more_arguments(cls, group) -> None:
        group.add_argument("--sge-pe", dest="sge_pe", default="smp", metavar="NAME",
                            help="parallel environment for jobs of several slots (default: %(default)s)")

    @classmethod
    def options_from_args(cls, args) -> SgeOptions:
        base = super().options_from_args(args)
        pe = getattr(args, "sge_pe", "smp") or ""
        if not pe.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"--sge-pe {pe!r} is not a parallel environment name")
        return SgeOptions(poll_interval=base.poll_interval, definitions_interval=base.definitions_interval,
                          commands_dir=base.commands_dir, cpu_budget=base.cpu_budget, pe=pe)

    @classmethod
    def default_options(cls) -> SgeOptions:
        return SgeOptions()

    def submit_attributes(self) -> List[AttrInfo]:
        return [
            AttrInfo("stdoutPath", ValueType.STRING, "Standard Output File",
                     "Where the job's standard output goes (qsub -o; $JOB_ID is the job id); "
                     "empty: a file in ~/.proxy-agent/sge that the agent follows", settable=True),
            AttrInfo("stderrPath", ValueType.STRING, "Standard Error File",
                     "Where the job's standard error goes (qsub -e)", settable=True),
        ]
