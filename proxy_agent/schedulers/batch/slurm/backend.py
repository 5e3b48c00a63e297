"""The SLURM backend (``--scheduler slurm``): SLURM on the batch engine.

Everything SLURM-specific is in :mod:`.parse` (commands and
parsers) and :mod:`.system` (states, records, attributes); this module tells the engine which
to use when:

* the version from ``sinfo --version``; the cluster's name (the machine's name) and how
  jobs are accounted from ``scontrol show config``;
* jobs from one ``squeue`` per poll (``--user`` unless ``--all-users``); partitions from
  ``scontrol show partition`` and nodes from ``sinfo`` (``--json`` where the installed SLURM
  has it, falling back to the text form for good once JSON fails where text works);
  ``squeue`` uses the text form unless ``squeue_json=True``: up to 22.05 ``squeue --json``
  ignores ``--user`` and prints about ten times as much, for every job of every user;
* jobs that left the listing, together: ``scontrol show job`` for the first
  :attr:`SlurmSystem.MAX_SCONTROL_LOOKUPS` (while the controller remembers them), then one
  ``sacct`` for the rest, from the accounting database or the job-completion log;
* submission with ``sbatch --parsable``, the script (:mod:`..script`) on its stdin, options
  as argv elements (the batch settings checked by :mod:`.directives`); output file names may hold SLURM's patterns (``%j``...) and are
  followed once the job id expands them; ``scancel``, ``scontrol hold``/``release``/
  ``suspend``/``resume`` and ``scontrol update Partition=``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import attrs

from ....service.attributes import AttrInfo, ValueType
from ....service.jobs import ErrorKind, JobError, JobSpec, JobState, StateTable, SubmitError
from . import parse as sp
from .parse import SlurmJob
from . import directives as slurm_options, system as slurm
from ....service.model import K
from ..engine import DISPLAY_ATTRIBUTES, BatchBackend, BatchOptions, BatchSystem, CommandFailed, CommandResult, \
    Parse, Run, job_values, node_values, queue_values
from ..records import NativeJob

__all__ = ["SlurmBackend", "SlurmOptions", "SlurmSystem"]

log = logging.getLogger("proxy_agent.schedulers.slurm")


class SlurmSystem(BatchSystem):
    label = "SLURM"
    submitted_state = "PENDING"
    submit_program = "sbatch"
    commands_after_end = True  # SLURM's answer says what happened to the job
    #: Jobs looked up one by one with scontrol when they leave the listing (the rest: one sacct).
    MAX_SCONTROL_LOOKUPS = 20

    def __init__(self, prefer_json: bool = True, squeue_json: bool = False) -> None:
        self.prefer_json = prefer_json
        self.squeue_json = squeue_json
        self.query_env = dict(os.environ, SLURM_TIME_FORMAT="standard")
        self.version: Optional[Tuple[int, int, int]] = None
        self.config: Dict[str, str] = {}
        self.cluster_name = "slurm"
        #: "accounting" (slurmdbd), "completion" (the job-completion log) or None
        self.sacct_mode: Optional[str] = None
        self._json: Dict[str, bool] = {}
        #: the last listing's records and what they became: an unchanged record is not converted again
        self._converted: Dict[str, Tuple[SlurmJob, NativeJob]] = {}
        #: each query's last answer and its records: the same answer is not parsed again
        self._answers: Dict[str, Tuple[bytes, list]] = {}

    @property
    def state_table(self) -> StateTable:
        return slurm.STATE_TABLE

    async def start(self, run: Run) -> str:
        text = (await run(sp.version_argv())).out.strip()
        self.version = sp.parse_version(text)
        support = sp.json_support(self.version if self.prefer_json else None)
        self._json = {"nodes": support["nodes"], "partitions": support["partitions"], "job": support["job"],
                      "squeue": support["squeue"] and self.squeue_json, "sacct": False}
        log.info("SLURM %s; JSON for %s", text, ", ".join(k for k, v in self._json.items() if v) or "nothing")
        return text.split()[-1] if text else ""

    async def _load_config(self, run: Run) -> None:
        """The cluster's name and accounting, once ``scontrol show config`` answers."""
        result = await run(sp.config_argv(), check=False)
        config = sp.parse_scontrol_config(result.out) if result.returncode == 0 else {}
        if not config:
            return
        self.config = config
        name = config.get("ClusterName", "")
        if name and name != "(null)":
            self.cluster_name = name
        if config.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none":
            self.sacct_mode = "accounting"
            self._json["sacct"] = sp.json_support(self.version if self.prefer_json else None)["sacct"]
        elif config.get("JobCompType") == "jobcomp/filetxt":
            self.sacct_mode = "completion"

    def machine_name(self) -> str:
        return self.cluster_name

    def error_text(self, stderr: str) -> str:
        return slurm.clean_message(stderr)

    # ------------------------------------------------------------------ listings

    async def fetch(self, what: str, user: Optional[str], run: Run, parse: Parse) -> Any:
        if what == "jobs":
            now = int(time.time())
            return await self._query(
                "squeue", run, parse, None, sp.squeue_argv(user), sp.parse_squeue_text,
                sp.squeue_argv(user, json=True), lambda text: sp.parse_squeue_json(text, user, now))
        if what == "queues":
            if not self.config:
                await self._load_config(run)
            return await self._query("partitions", run, parse, slurm.native_queue, sp.partitions_argv(False),
                                     sp.parse_scontrol_partitions, sp.partitions_argv(True), sp.parse_partitions_json)
        return await self._query("nodes", run, parse, slurm.native_node, sp.nodes_argv(False),
                                 sp.parse_sinfo_nodes_text, sp.nodes_argv(True, self.version), sp.parse_nodes_json)

    def status_argv(self, user: Optional[str]) -> Sequence[str]:
        return sp.squeue_argv(user)

    def parse_status(self, text: str, user: Optional[str]) -> List[NativeJob]:
        return [slurm.native_job(j) for j in sp.parse_squeue_text(text)]

    def _native_jobs(self, records: List[SlurmJob]) -> List[NativeJob]:
        old, new, out = self._converted, {}, []
        for record in records:
            pair = old.get(record.job_id)
            if pair is None or pair[0] != record:
                pair = (record, slurm.native_job(record))
            new[record.job_id] = pair
            out.append(pair[1])
        self._converted = new
        return out

    async def _query(self, kind: str, run: Run, parse: Parse, convert: Optional[Callable[[Any], Any]],
                     text_argv: Sequence[str], text_parser: Callable[[str], list],
                     json_argv: Sequence[str], json_parser: Callable[[str], list]) -> list:
        """One query in JSON if this SLURM has it for ``kind``, else (or if JSON turns out not
        to work while text does) in text; records converted in the parser's thread (jobs
        by :meth:`_native_jobs`)."""

        def converted(parser: Callable[[str], list]) -> Callable[[str], list]:
            if convert is None:
                return lambda text: self._native_jobs(parser(text))
            return lambda text: [convert(r) for r in parser(text)]

        async def parsed(parser: Callable[[str], list], data: bytes) -> list:
            # An idle cluster answers the same bytes poll after poll (held jobs above all):
            # they are read once.
            last = self._answers.get(kind)
            if last is not None and last[0] == data:
                return last[1]
            records = await parse(converted(parser), data)
            self._answers[kind] = (data, records)
            return records

        if self._json.get(kind):
            try:
                result = await run(json_argv)
                return await parsed(json_parser, result.stdout)
            except (CommandFailed, sp.SlurmError) as exc:
                json_error = exc
            result = await run(text_argv)  # raises if SLURM itself is failing
            records = await parsed(text_parser, result.stdout)
            log.warning("%s does not work here (%s); using the text format from now on",
                        " ".join(json_argv[:3]), json_error)
            self._json[kind] = False
            return records
        result = await run(text_argv)
        return await parsed(text_parser, result.stdout)

    def job_state(self, job: NativeJob) -> JobState:
        return slurm.service_state(job.native_state, job.reason)

    def first_host(self, job: NativeJob) -> str:
        return slurm.first_host(job.hosts[0]) if job.hosts else ""

    # ------------------------------------------------------------------ final states

    async def final_records(self, job_ids: Sequence[str], run: Run) -> Dict[str, Optional[NativeJob]]:
        """Every job's last record, None for a job SLURM keeps none of."""
        if not self.config:
            await self._load_config(run)
        found = await self.slurm_records(job_ids, run)
        return {job_id: slurm.native_job(found[job_id]) if job_id in found else None for job_id in job_ids}

    async def slurm_records(self, job_ids: Sequence[str], run: Run) -> Dict[str, SlurmJob]:
        """Last known records of jobs: ``scontrol show job`` (while the controller remembers
        them), then one ``sacct`` for the rest when accounting or the completion log exists."""
        found: Dict[str, SlurmJob] = {}
        for job_id in list(job_ids)[:self.MAX_SCONTROL_LOOKUPS]:
            use_json = bool(self._json.get("job"))
            result = await run(sp.scontrol_job_argv(job_id, json=use_json), check=False)
            if result.returncode != 0:
                continue  # "Invalid job id specified": purged already
            try:
                records = (sp.parse_scontrol_jobs_json if use_json else sp.parse_scontrol_jobs)(result.out)
            except sp.SlurmError:
                continue
            found.update((r.job_id, r) for r in records if r.job_id == job_id)
        rest = [j for j in job_ids if j not in found]
        if rest and self.sacct_mode is not None:
            use_json = bool(self._json.get("sacct"))
            result = await run(sp.sacct_argv(rest, json=use_json, completion=self.sacct_mode == "completion"),
                               check=False)
            if result.returncode != 0:
                log.info("sacct could not say how jobs ended: %s", slurm.clean_message(result.err))
                return found
            try:
                records = (sp.parse_sacct_json if use_json else sp.parse_sacct_text)(result.out)
            except sp.SlurmError:
                records = []
            wanted = set(rest)
            found.update((r.job_id, r) for r in records if r.job_id in wanted)  # a requeued job: the last
        return found

    # ------------------------------------------------------------------ submission and job commands

    def submit_command(self, spec: JobSpec) -> Tuple[List[str], bytes]:
        partition = spec.queue or ""
        named = spec.extra_value(slurm.PARTITION)
        if named and named != partition:
            raise SubmitError(f"the queue given is partition {partition!r} but partition is {named!r}; "
                              "give one of them", ErrorKind.BAD_REQUEST)
        spec = attrs.evolve(spec, queue=partition, working_dir=spec.working_dir or None, nodes=spec.nodes or None,
                            account=spec.account or None, prologue=slurm_options.check_prologue(spec.prologue))
        try:
            return slurm_options.submit_argv(spec), slurm_options.job_script(spec).encode("utf-8")
        except ValueError as exc:
            raise SubmitError(str(exc), ErrorKind.BAD_REQUEST) from None

    def parse_submitted(self, result: CommandResult) -> str:
        message = slurm.clean_message(result.err)
        if result.returncode != 0:
            raise SubmitError(message or f"sbatch failed with exit status {result.returncode}")
        try:
            job_id = sp.parse_sbatch_parsable(result.out)
        except sp.SlurmError as exc:
            raise SubmitError(f"{exc}; sbatch said: {message}") from None
        if message:
            log.info("sbatch (SLURM job %s): %s", job_id, message)
        return job_id

    def follow_path(self, path: str, job_id: str, spec: JobSpec, user: str) -> Optional[str]:
        return slurm.expand_output_pattern(path, job_id, spec.display_name or "", user)

    def literal_path(self, path: str) -> str:
        return path.replace("%", "%%")

    def stderr_default(self, stdout: str) -> Optional[str]:
        return stdout  # SLURM's own default: both streams in one file

    def job_command(self, op: str, job: NativeJob, queue: str = "") -> List[str]:
        if op == "move":
            try:
                return sp.move_job_argv(job.job_id, queue)
            except ValueError as exc:
                raise JobError(str(exc), ErrorKind.BAD_REQUEST) from None
        builder = {"delete": sp.scancel_argv, "hold": sp.hold_job_argv, "release": sp.release_job_argv,
                   "suspend": sp.suspend_job_argv, "resume": sp.resume_job_argv}[op]
        return builder(job.job_id)

    def check_job_command(self, op: str, job_id: str, argv: Sequence[str], result: CommandResult) -> None:
        if result.returncode == 0:
            return
        where = "".join(f" to partition {a.partition('=')[2]}" for a in argv if a.startswith("Partition="))
        message = slurm.clean_message(result.err) or f"exit status {result.returncode}"
        raise JobError(f"cannot {'cancel' if op == 'delete' else op} SLURM job {job_id}{where}: {message}")


@attrs.frozen
class SlurmOptions(BatchOptions):
    poll_interval: float = 5.0


class SlurmBackend(BatchBackend):
    """A SLURM cluster (see the module documentation)."""

    name = "slurm"
    summary = "a SLURM cluster (squeue, sinfo, sbatch, scancel, scontrol, sacct)"
    default_poll_interval = 5.0

    def __init__(self, model, options: Optional[SlurmOptions] = None, context=None, *, prefer_json: bool = True,
                 squeue_json: bool = False, fast_poll_interval: float = 0.5, max_backoff: float = 60.0,
                 partition_interval: Optional[float] = None, **kwargs: Any) -> None:
        self._json_choice = (prefer_json, squeue_json)
        interval = (options or SlurmOptions()).poll_interval
        if partition_interval is not None:
            kwargs.setdefault("info_interval", partition_interval)
        kwargs.setdefault("node_interval", interval)  # a drained node shows at the next poll
        super().__init__(model, options, context, fast_poll_interval=fast_poll_interval, max_backoff=max_backoff,
                         **kwargs)

    def make_system(self) -> SlurmSystem:
        return SlurmSystem(*self._json_choice)

    @property
    def config(self) -> Dict[str, str]:
        """SLURM's configuration (``scontrol show config``), once it answered."""
        return self.system.config  # type: ignore[attr-defined]

    @classmethod
    def add_arguments(cls, parser) -> None:
        group = parser.add_argument_group("SLURM (slurm)")
        group.add_argument("--slurm-poll-interval", "--poll-interval", dest="slurm_poll_interval", type=float,
                           default=None, metavar="SECONDS", help=cls.poll_interval_help())
        cls.add_definitions_argument(group)
        cls.add_commands_argument(group)

    @classmethod
    def options_from_args(cls, args) -> SlurmOptions:
        base = super().options_from_args(args)
        return SlurmOptions(poll_interval=base.poll_interval, definitions_interval=base.definitions_interval,
                            commands_dir=base.commands_dir, cpu_budget=base.cpu_budget)

    @classmethod
    def default_options(cls) -> SlurmOptions:
        return SlurmOptions()

    def attributes(self) -> List[AttrInfo]:
        mine = {info.name for info in slurm.DISPLAY_ATTRIBUTES}
        names = tuple(name for name in self._queue_records if name)
        description = "Partition to submit to (sbatch --partition); a queue names one too"
        if names:
            partition = AttrInfo(slurm.PARTITION, ValueType.ENUMERATED, "Partition", description,
                                 default=self._default if self._default in names else names[0], choices=names,
                                 settable=True)
        else:
            partition = AttrInfo(slurm.PARTITION, ValueType.STRING, "Partition", description, settable=True)
        return [*slurm.DISPLAY_ATTRIBUTES, *(a for a in DISPLAY_ATTRIBUTES if a.name not in mine), partition,
                *slurm.SUBMIT_ATTRIBUTES]


# ---------------------------------------------------------------------- one record at a time

_SYSTEM = SlurmSystem()


def job_attributes(job: SlurmJob) -> Dict[str, str]:
    """The attributes a listed job shows (every key, ``""`` where SLURM has no value)."""
    return {K.EXIT_CODE: "", K.SIGNAL: "", **job_values(_SYSTEM, slurm.native_job(job))[0]}


def process_attributes(job: SlurmJob, node_id: Optional[int] = None) -> Dict[str, Any]:
    """The attributes of a job's process 0 that follow from the job's record."""
    out: Dict[str, Any] = {k: v for k, v in job_values(_SYSTEM, slurm.native_job(job))[1].items() if v != ""}
    if node_id is not None:
        out[K.NODE] = node_id
    return out


def node_attributes(node: sp.SlurmNode) -> Dict[str, str]:
    """A node's attributes (every key; the node number is the caller's)."""
    return node_values(slurm.native_node(node))


def partition_attributes(part: sp.SlurmPartition) -> Dict[str, str]:
    """A partition's queue attributes (every key)."""
    queue = slurm.native_queue(part)
    return queue_values(queue, queue.is_default)
