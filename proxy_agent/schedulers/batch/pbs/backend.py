"""The PBS backend (``--scheduler pbs``): OpenPBS, PBS Professional and Torque on the batch engine.

The family is found by probing when the backend starts (``qstat --version``, then
``qstat -B -f``); :class:`~.pbs.PbsSystem` then names every command and the parser of its
answer, and this module tells the engine which to use when:

* jobs from one ``qstat -f -F json -t`` (OpenPBS) or ``qstat -f -x -t`` (Torque) per poll,
  filtered to the agent user's unless ``--all-users``;
* queues from ``qstat -Q -f`` (the default queue from ``qstat -B -f``), nodes from
  ``pbsnodes``;
* a job that left the listing from ``qstat -x -f ID`` (OpenPBS job history, Torque's kept
  completed jobs), else from ``tracejob`` (where the server logs can be read);
* submission with ``qsub``, the script on its stdin; ``qdel``, ``qhold``/``qrls``,
  ``qsig -s suspend|resume`` (PBS operators and managers only) and ``qmove``.

No PBS server is packaged for this system: the backend is tested against the commands of
``tests/fake_pbs``, which answer in the formats of the recordings in ``tests/data/pbs``.
"""

from __future__ import annotations

import socket
from typing import List, Optional, Sequence, Tuple

from ....service.jobs import JobSpec, JobState, StateTable
from . import parse as P
from ..engine import BatchBackend, BatchSystem, CommandFailed, CommandResult, Run
from .system import PbsSystem, system_for
from ..records import NativeJob, NativeNode, NativeQueue

__all__ = ["PbsBackend", "PbsBatch"]


class PbsBatch(BatchSystem):
    label = "PBS"

    def __init__(self) -> None:
        self.pbs: Optional[PbsSystem] = None
        self.default_queue = ""

    @property
    def system(self) -> PbsSystem:
        if self.pbs is None:
            raise RuntimeError("PBS has not been probed yet")
        return self.pbs

    @property
    def state_table(self) -> StateTable:
        return self.system.state_table

    async def start(self, run: Run) -> str:
        first = await run(list(P.VERSION_PROBE_ARGV), check=False)
        try:
            probe = P.detect_family(first.out, first.err)
        except P.PbsParseError:
            server = await run(list(P.SERVER_PROBE_ARGV), check=False)
            probe = P.detect_family(first.out, first.err, server.out)  # ValueError: not usable
        self.pbs = system_for(probe)
        result = await run(self.pbs.server_argv())
        self.default_queue = self.pbs.parse_server(result.out).default_queue
        return f"{probe.flavour} {probe.version_text}".strip()

    def status_argv(self, user: Optional[str]) -> Sequence[str]:
        return self.system.status_argv()

    def parse_status(self, text: str, user: Optional[str]) -> List[NativeJob]:
        return self.system.parse_status(text, user)

    def queues_argv(self) -> Sequence[str]:
        return self.system.queues_argv()

    def parse_queues(self, text: str) -> List[NativeQueue]:
        return self.system.parse_queues(text, self.default_queue or None)

    def nodes_argv(self) -> Sequence[str]:
        return self.system.nodes_argv()

    def parse_nodes(self, text: str) -> List[NativeNode]:
        return self.system.parse_nodes(text)

    def job_state(self, job: NativeJob) -> JobState:
        return self.system.final_state(job)

    async def final_record(self, job_id: str, run: Run) -> Optional[NativeJob]:
        system = self.system
        result = await run(system.final_argv(job_id), check=False)
        if result.returncode == 0:
            record = system.parse_final(result.out, job_id)
            if record is not None:
                return record
        elif not P.is_unknown_job_error(result.err):
            raise CommandFailed(result.argv, result.err.strip() or "qstat -x failed")
        try:
            traced = await run(system.tracejob_argv(job_id), check=False)
        except CommandFailed:
            return None  # no tracejob here: no record
        return system.parse_tracejob(traced.out, job_id) if traced.returncode == 0 else None

    def submit_command(self, spec: JobSpec) -> Tuple[List[str], bytes]:
        submission = self.system.submission(spec, submit_host=socket.gethostname())
        return list(submission.argv), submission.script.encode("utf-8")

    def parse_submitted(self, result: CommandResult) -> str:
        if result.returncode != 0:
            raise self.system.submit_error(result.err)
        return self.system.parse_submit(result.out)

    def job_command(self, op: str, job: NativeJob, queue: str = "") -> List[str]:
        system = self.system
        if op == "move":
            system.check_move(self.job_state(job))
            return system.move_argv(job.job_id, queue)
        builder = {"delete": system.delete_argv, "hold": system.hold_argv, "release": system.release_argv,
                   "suspend": system.suspend_argv, "resume": system.resume_argv}[op]
        return builder(job.job_id)

    def check_job_command(self, op: str, job_id: str, argv: Sequence[str], result: CommandResult) -> None:
        if result.returncode != 0:
            raise self.system.command_error(op, job_id, result.err)


class PbsBackend(BatchBackend):
    """A PBS server, either family (see the module documentation)."""

    name = "pbs"
    summary = "PBS: OpenPBS, PBS Professional or Torque (qstat, qsub, qdel, qhold, qrls, qsig, qmove)"

    def make_system(self) -> BatchSystem:
        return PbsBatch()
