"""The batch engine: what every batch system backend shares.

A batch system (SLURM, Grid Engine, PBS...) is a :class:`BatchSystem`: its commands as argv lists,
parsers of their answers into the neutral records of :mod:`.records`, its state table and
its submission dialect.  :class:`BatchBackend` does the rest, the same way for every system:

* **Polling**: one status query per poll for every job shown (the agent user's, or every
  user's with ``--all-users``) and, in the same poll, one listing of the queues (their
  states, slots and figures, and the limits the listing carries), so what the clients see
  of a queue is never older than one poll; the hosts every ``node_interval`` (a minute, or
  four polls, and at the next poll when a job names a queue not listed).
* **Queue definitions** a second command must read (:meth:`BatchSystem.queue_details`,
  Grid Engine's ``qconf -sq``) are read again every ``info_interval`` (the
  ``--SYSTEM-definitions-interval`` option, five minutes by default), for a queue not read
  yet or whose reading failed at the next poll, and for every queue at the first poll after
  the scheduler answers again (its daemon may have restarted with other definitions).  Queries of one poll run
  side by side; a big answer is parsed in a worker thread.  A system may ask a listing its
  own way (:meth:`BatchSystem.fetch`: SLURM tries JSON, then text).  After a submission
  or a job command the engine polls every ``fast_poll_interval`` for a while.  A job's
  ``timeUsed`` is not a change by itself: it is refreshed for every job once every
  ``time_used_interval`` (a minute).
* **Back-off**: a failing or hanging query is logged, shown as the machine's ERROR state and
  told to the clients once (and once more when the scheduler answers again); polls are then
  spaced twice as far each time, up to ``max_backoff``.
* **Job table**: each listing is compared with the previous one (:class:`JobTable`): only
  jobs whose record changed touch the model, whatever the size of the listing.
* **Final states**: the jobs that leave one listing are looked up together through the
  system's accounting (:meth:`BatchSystem.final_records`, by default one
  :meth:`BatchSystem.final_record` each); while the lookup finds nothing yet it is tried
  again for ``MAX_GONE_POLLS`` polls, then (or at once, when the system says it has no
  record for good) the job is DELETED ("no record of how it ended").
  Jobs that have ended leave the model ``retention`` seconds later.
* **Submission races**: a job announced by its submission is not reported gone by a listing
  that started before the submission (:meth:`JobTable.expect`); a job that ended before it
  was ever listed is found through accounting like any other.
* **Output**: a job submitted here writes its standard output and error to files, in the
  spool directory (``~/.proxy-agent/BACKEND``) unless the submission names files.  They are
  followed while the job runs; a job's final state is shown only once all of its output has
  been delivered, and the spool files are removed then (files an earlier agent left there
  are removed after a week).  Output carries its file offsets, so the job store records
  how far delivery got.  A system whose file names hold patterns expands them once the
  job has its id (:meth:`BatchSystem.follow_path`).
* **Adoption**: jobs an earlier agent submitted come back from the store by their native
  id (:meth:`BatchBackend.adopt`), and their output is delivered from where it stopped; a
  recorded end is shown after that output.
* **Queue figures**: each queue shows ``totalSlots`` and ``freeSlots`` as the scheduler
  reports them and ``waitingJobs``/``runningJobs`` (the scheduler's counts where it gives
  them, else counted from the listed jobs), the names the local backend's figures have.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import resource
import secrets
import time
from collections import deque
from typing import Any, Awaitable, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import trio

from ...service.attributes import AttrInfo
from ...service.jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, SubmitError
from ...service.model import K, Kind, ServiceModel
from .. import common
from ...service.backend import Backend, BackendContext, Submitted
from .records import NativeJob, NativeNode, NativeQueue
from .adoption import Adoption
from .jobtable import JobTable, gc_paused
from .options import DEFAULT_DEFINITIONS_INTERVAL, DEFAULT_POLL_INTERVAL, BatchCommandLine, BatchOptions
from .output import OutputFollowing, file_signature
from .resources import QueuesAndNodes
from .system import BatchSystem, CommandFailed, CommandResult, Parse, Run, one_line, run_command
from .tracked import TrackedJob
from .values import DISPLAY_ATTRIBUTES, FINAL_STATE_NAMES, job_values, node_values, queue_values, ran_or_ended

# The engine's face to each system's backend: what a backend module needs, from one place.
__all__ = [
    "DISPLAY_ATTRIBUTES",
    "BatchBackend",
    "BatchOptions",
    "BatchSystem",
    "CommandFailed",
    "CommandResult",
    "JobTable",
    "Parse",
    "Run",
    "job_values",
    "node_values",
    "one_line",
    "queue_values",
    "run_command",
]

log = logging.getLogger("proxy_agent.schedulers.batch")

_FINAL_KEYS = (K.STATE, K.NATIVE_STATE, K.EXIT_CODE, K.SIGNAL, K.MESSAGE)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_ABANDON = ("abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(trio.to_thread.run_sync).parameters
            else "cancellable")


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have ended."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class BatchBackend(BatchCommandLine, QueuesAndNodes, Adoption, OutputFollowing, Backend):
    """A backend over one :class:`BatchSystem` (see the module documentation).  A batch
    system's backend is this class with :meth:`make_system` and its options."""

    MAX_GONE_POLLS = 3
    #: jobs put into the model between two checkpoints
    APPLY_CHUNK = 5000

    def __init__(self, model: ServiceModel, options: Any = None, context: Optional[BackendContext] = None, *,
                 retention: float = 60.0, command_timeout: float = 30.0, fast_poll_interval: float = 1.0,
                 fast_poll_duration: float = 10.0, info_interval: Optional[float] = None,
                 node_interval: Optional[float] = None,
                 time_used_interval: float = 60.0,
                 output_interval: float = 0.5, output_drain_grace: float = 1.0, max_backoff: float = 120.0,
                 spool_dir: Optional[str] = None, parse_in_thread_above: int = 256 * 1024,
                 user: Optional[str] = None, runner: Optional[Callable[..., Awaitable[CommandResult]]] = None,
                 system: Optional[BatchSystem] = None) -> None:
        super().__init__(model, options, context)
        self.system = system if system is not None else self.make_system()
        self.poll_interval = max(0.1, float(getattr(self.options, "poll_interval", DEFAULT_POLL_INTERVAL)))
        self.retention = retention
        self.command_timeout = command_timeout
        self.fast_poll_interval = min(fast_poll_interval, self.poll_interval)
        self.fast_poll_duration = fast_poll_duration
        #: seconds between two readings of the queues' definitions (BatchSystem.queue_details)
        self.info_interval = info_interval if info_interval is not None else \
            float(getattr(self.options, "definitions_interval", DEFAULT_DEFINITIONS_INTERVAL))
        #: seconds between two node queries (at most as often as the jobs are polled)
        self.node_interval = node_interval if node_interval is not None else max(60.0, 4 * self.poll_interval)
        self.time_used_interval = time_used_interval
        self.output_interval = output_interval
        self.output_drain_grace = output_drain_grace
        self.max_backoff = max(max_backoff, self.poll_interval)
        #: the share of one core idle polling may take (None: no limit): polls that cost more
        #: are spaced further apart
        self.cpu_budget: Optional[float] = getattr(self.options, "cpu_budget", None)
        self.spool_dir = spool_dir or os.path.join(os.path.expanduser("~"), ".proxy-agent", self.name)
        #: files in the spool directory older than this that no job follows are removed
        self.spool_max_age = common.SPOOL_MAX_AGE
        self.parse_in_thread_above = parse_in_thread_above
        self.user = user or common.current_user()
        #: where the system's commands are (None: found on PATH)
        self.commands_dir: Optional[str] = getattr(self.options, "commands_dir", None)
        self._runner = runner or run_command
        self.version_text = ""
        #: the last failure of a query (None while they work)
        self.last_error: Optional[str] = None
        self._machine: Optional[int] = None
        self._queues: Dict[str, int] = {}
        self._queue_records: Dict[str, NativeQueue] = {}
        #: the name of the default queue (its key is ``default_queue``)
        self._default: Optional[str] = None
        #: each queue's definitions as last read by BatchSystem.queue_details
        self._definitions: Dict[str, NativeQueue] = {}
        #: read every queue's definitions at the next poll
        self._definitions_due = False
        self._queues_stale = False
        #: whether the queues' job figures may have changed since they were last counted
        self._figures_stale = True
        self._nodes: Dict[str, Tuple[int, NativeNode]] = {}
        self._table = JobTable()
        self._jobs: Dict[str, TrackedJob] = {}
        self._by_element: Dict[int, TrackedJob] = {}
        self._retire: Deque[Tuple[float, str]] = deque()
        self._generation = 0
        self._failures = 0
        self._failing = False
        self._reported: Optional[str] = None
        self._wake = trio.Event()
        self._fast_until = 0.0
        #: submit commands running
        self._submitting = 0
        #: the CPU seconds (the agent's and its commands') of the last polls
        self._poll_costs: Deque[float] = deque(maxlen=3)
        self._nursery: Optional[trio.Nursery] = None

    # ------------------------------------------------------------------ to be given

    def make_system(self) -> BatchSystem:
        raise NotImplementedError

    def submit_attributes(self) -> List[AttrInfo]:
        return []
    def attributes(self) -> List[AttrInfo]:
        return [*DISPLAY_ATTRIBUTES, *self.submit_attributes()]

    # ------------------------------------------------------------------ commands

    async def run_cmd(self, argv: Sequence[str], stdin: Optional[bytes] = None, check: bool = True,
                      env: Optional[Mapping[str, str]] = None) -> CommandResult:
        if self.commands_dir and "/" not in argv[0]:
            argv = [os.path.join(self.commands_dir, argv[0]), *argv[1:]]
        shown = " ".join(argv[:3])
        try:
            with trio.fail_after(self.command_timeout):
                result = await self._runner(argv, stdin, env if env is not None else self.system.query_env)
        except trio.TooSlowError:
            raise CommandFailed(argv, f"{shown} did not finish within {self.command_timeout:g} s",
                                timed_out=True) from None
        except FileNotFoundError:
            raise CommandFailed(argv, f"{argv[0]}: command not found (is {self.system.label} installed "
                                      "and on PATH?)") from None
        except OSError as exc:
            raise CommandFailed(argv, f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        if check and result.returncode != 0:
            raise CommandFailed(argv, self.system.error_text(result.err)
                                or f"{shown} failed with exit status {result.returncode}")
        return result

    async def _parse(self, parser: Callable[[str], Any], data: bytes) -> Any:
        def work() -> Any:
            return parser(data.decode("utf-8", "replace"))

        if len(data) <= self.parse_in_thread_above:
            return work()
        return await trio.to_thread.run_sync(work, **{_ABANDON: True})

    # ------------------------------------------------------------------ life cycle

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        try:
            self.version_text = await self.system.start(self.run_cmd)
        except ServiceError as exc:
            raise ServiceError(f"cannot use {self.system.label} on this machine: {exc.message}",
                               ErrorKind.UNAVAILABLE) from None
        except ValueError as exc:
            raise ServiceError(f"cannot use {self.system.label} on this machine: {exc}",
                               ErrorKind.UNAVAILABLE) from None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._machine = self.model.add(Kind.MACHINE, None, {
                K.NAME: self.system.machine_name() or self.name, K.STATE: "UNKNOWN", K.NUM_NODES: "0",
                K.VERSION: self.version_text, K.BACKEND: self.name}, owner=self.name)
            self._report(await self._poll(info=True))
            task_status.started()
            nursery.start_soon(self._sweep_spool_loop)
            await self._poll_loop()

    async def _sweep_spool_loop(self) -> None:
        """Now and then, remove old output files of jobs no agent follows any more."""
        while True:
            keep = {path for tracked in self._jobs.values() for path in tracked.spool_files}
            for path in common.sweep_spool(self.spool_dir, keep, self.spool_max_age):
                log.info("removed old output file %s", path)
            await trio.sleep(3600)

    async def aclose(self) -> None:
        # Jobs stay with the scheduler; polling and output followers stop.
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _poke(self) -> None:
        self._fast_until = trio.current_time() + self.fast_poll_duration
        self._wake.set()

    def _delay(self) -> float:
        if self._failures:
            return min(self.poll_interval * 2 ** (self._failures - 1), self.max_backoff)
        if trio.current_time() < self._fast_until:
            return self.fast_poll_interval
        interval = self.poll_interval
        if self.cpu_budget and self._poll_costs:
            # Idle polls are spaced so that they take at most cpu_budget of a core: the cheapest
            # of the last polls' CPU (the agent's and its commands') decides, so that a child
            # of some other part of the agent, reaped meanwhile, does not.
            interval = max(interval, min(min(self._poll_costs) / self.cpu_budget, self.max_backoff))
        return interval

    async def _poll_loop(self) -> None:
        next_info = trio.current_time() + self.info_interval
        next_time_used = trio.current_time() + self.time_used_interval
        next_nodes = trio.current_time() + self.node_interval
        began = trio.current_time()
        while True:
            # Polls start one interval apart (not an interval after the last one ended), so a
            # job's end reaches the client within one interval plus one poll's own time.
            with trio.move_on_at(began + self._delay()):
                await self._wake.wait()
            self._wake = trio.Event()
            began = trio.current_time()
            cpu = _cpu_seconds()
            info = trio.current_time() >= next_info or self._definitions_due
            self._definitions_due = False
            nodes = self._queues_stale or trio.current_time() >= next_nodes
            self._queues_stale = False
            try:
                errors = await self._poll(info=info, nodes=nodes)
                if trio.current_time() >= next_time_used:
                    self._refresh_time_used()
                    next_time_used = trio.current_time() + self.time_used_interval
                self._retire_due()
            except Exception as exc:  # noqa: BLE001 - one bad poll must not end the agent
                log.exception("polling %s failed", self.system.label)
                errors = [f"internal error while polling: {type(exc).__name__}: {exc}"]
            self._poll_costs.append(_cpu_seconds() - cpu)
            self._report(errors)
            if info:
                next_info = trio.current_time() + self.info_interval
            if nodes:
                next_nodes = trio.current_time() + self.node_interval

    async def _poll(self, *, info: bool, nodes: bool = False) -> List[str]:
        results: Dict[str, Any] = {}
        errors: Dict[str, str] = {}
        system = self.system

        self._generation += 1
        generation = self._generation
        user = None if self.context.all_users else self.user

        async def fetch(what: str) -> None:
            try:
                answer = await system.fetch(what, user, self.run_cmd, self._parse)
            except ServiceError as exc:
                errors[what] = exc.message
            except ValueError as exc:
                errors[what] = f"unreadable answer of the {what} query: {exc}"
            else:
                if answer is not None:
                    results[what] = answer

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch, "queues")
            if info or nodes:
                nursery.start_soon(fetch, "nodes")
            nursery.start_soon(fetch, "jobs")
        if "queues" in results:
            await self._apply_queues(results["queues"], reread=info)
        if "nodes" in results:
            self._apply_nodes(results["nodes"])
        if "jobs" in results:
            try:
                if await self._apply_listing(results["jobs"], generation):
                    self._figures_stale = True
            except ServiceError as exc:
                errors["final states"] = exc.message
            if self._figures_stale:
                self._update_figures()
        self._failing = bool(errors)
        self._update_machine()
        return list(dict.fromkeys(errors.values()))

    def _report(self, errors: List[str]) -> None:
        label = self.system.label
        if errors:
            self._failures += 1
            text = "; ".join(errors)
            self.last_error = text
            if text != self._reported:
                self._reported = text
                log.warning("%s query failed (retrying in %g s): %s", label, self._delay(), text)
                self._notify("ERROR", f"{label} query failed (retrying): {text}")
        elif self._failures:
            log.info("%s answers again after %d failed polls", label, self._failures)
            self._definitions_due = True  # it may have restarted with other definitions
            self._notify("INFO", f"{label} answers again")
            self._failures = 0
            self.last_error = self._reported = None

    def _notify(self, level: str, text: str) -> None:
        try:
            self.context.notify(level, text)
        except Exception:  # noqa: BLE001 - reporting must not break polling
            log.exception("a notice could not be delivered")

    # ------------------------------------------------------------------ jobs

    def _job_values(self, job: NativeJob, tracked: Optional[TrackedJob]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        return job_values(self.system, job, submitted=tracked is not None and tracked.submitted)

    def _node_of(self, job: NativeJob) -> Optional[int]:
        host = self.system.first_host(job)
        known = self._nodes.get(host) if host else None
        return known[0] if known is not None else None

    async def _apply_listing(self, jobs: List[NativeJob], generation: int) -> bool:
        """Apply a listing; whether it changed anything."""
        changes = self._table.apply(jobs, generation)
        added = changes.added
        if self._submitting and added:
            # A job of this user new to the listing while a submit command runs may be that
            # submission's: it is left to the next listing, when the submission has named its
            # job (else it would show as somebody's job, then be taken over as the submitted one).
            mine = [job for job in added if not job.user or job.user == self.user]
            for job in mine:
                self._table.forget(job.job_id)
            added = [job for job in added if job.user and job.user != self.user]
        fresh = added + changes.changed
        if fresh:
            try:
                fresh = await self.system.explain(fresh, self.run_cmd)
            except (ServiceError, ValueError) as exc:
                log.info("%s could not say more about %d jobs: %s", self.system.label, len(fresh), exc)
            for start in range(0, len(fresh), self.APPLY_CHUNK):
                with gc_paused(), self.model.batch():
                    for job in fresh[start:start + self.APPLY_CHUNK]:
                        self._apply_job(job)
                await trio.lowlevel.checkpoint()
        if changes.gone:
            await self._finish_gone(changes.gone)
        return bool(changes)

    def _apply_job(self, job: NativeJob) -> None:
        tracked = self._jobs.get(job.job_id)
        if tracked is None:
            self._add_job(job)
        else:
            self._update_job(tracked, job)

    def _add_job(self, job: NativeJob) -> None:
        model = self.model
        queue = self._queue_for(job.queue)
        values, process = self._job_values(job, None)
        values[K.QUEUE] = queue
        key = model.add(Kind.JOB, queue, {k: v for k, v in values.items() if v != ""}, owner=self.name)
        node = self._node_of(job)
        if node is not None:
            process[K.NODE] = node
        pid = model.add(Kind.PROCESS, key, {k: v for k, v in process.items() if v != ""}, owner=self.name)
        tracked = TrackedJob(job.job_id, key, pid, queue, node=node)
        self._jobs[job.job_id] = tracked
        self._by_element[key] = tracked
        if self.system.job_state(job).final:
            self._completed(tracked)

    def _update_job(self, tracked: TrackedJob, job: NativeJob) -> None:
        model = self.model
        if tracked.element not in model:
            return
        state = self.system.job_state(job)
        if tracked.deleted and not ran_or_ended(state) and self._shown_ended(tracked):
            return  # a listing made before it was deleted: a deleted job does not wait again
        queue = self._queue_for(job.queue, tracked.queue)
        if queue != tracked.queue:
            model.move(tracked.element, queue)
            tracked.queue = queue
        values, process = self._job_values(job, tracked)
        values[K.QUEUE] = queue
        if not job.hosts and state not in (JobState.QUEUING, JobState.HOLD):
            # A record of a job that ran or ends without its hosts (PBS blanks them at the end
            # unless it keeps job history) does not say it had none: what was shown stays.
            del values[K.HOSTS]
        node = self._node_of(job)
        if node is not None:
            tracked.node = process[K.NODE] = node
        if state.final and tracked.followers and not (tracked.deleted and self._shown_ended(tracked)):
            # Output is still being read: the end shows after it (a job shown ended when it
            # was deleted before it started stays ended: it wrote nothing to wait for).
            tracked.held = ({k: values.pop(k) for k in _FINAL_KEYS if k in values},
                            {k: process.pop(k) for k in _FINAL_KEYS if k in process})
            values[K.STATE] = process[K.STATE] = JobState.FINISHING.value
        elif not state.final:
            tracked.held = None
        self._set(tracked.process, process)  # the process first: a job ends after its process
        self._set(tracked.element, values)
        if ran_or_ended(state) and tracked.started is not None:
            tracked.started.set()
        if state.final and not tracked.completed:
            self._completed(tracked)
        elif not state.final and tracked.completed:
            tracked.completed = False  # rescheduled: back under the same id
            tracked.retire_at = None

    def _completed(self, tracked: TrackedJob) -> None:
        self._figures_stale = True
        tracked.completed = True
        tracked.retire_at = trio.current_time() + self.retention
        self._retire.append((tracked.retire_at, tracked.native_id))
        if tracked.done is not None:
            tracked.done.set()

    def _retire_due(self) -> None:
        now = trio.current_time()
        while self._retire and self._retire[0][0] <= now:
            at, native_id = self._retire.popleft()
            tracked = self._jobs.get(native_id)
            if tracked is None or not tracked.completed or tracked.retire_at != at or tracked.followers:
                continue
            del self._jobs[native_id]
            self._by_element.pop(tracked.element, None)
            if tracked.element in self.model:
                self.model.remove(tracked.element)
            self._table.retire(native_id)
            self._figures_stale = True
            self._remove_spool(tracked)

    def _refresh_time_used(self) -> None:
        """Time used of running jobs: a listing that changes nothing else does not touch the
        model, so the clock is brought up to date here, once every ``time_used_interval``."""
        model = self.model
        with model.batch():
            for tracked in self._jobs.values():
                if tracked.completed:
                    continue
                record = self._table.record(tracked.native_id)
                if record is not None and record.time_used and tracked.element in model:
                    model.update(tracked.element, {K.TIME_USED: str(record.time_used)})

    async def _finish_gone(self, gone: List[str]) -> None:
        """Jobs the listing no longer shows: their end from the system's accounting."""
        # An array job lives on while the listing shows any of its tasks.
        arrays = {record.array_id for record in self._table.records() if record.array_id}
        todo: List[TrackedJob] = []
        for native_id in gone:
            tracked = self._jobs.get(native_id)
            if tracked is None or tracked.completed:
                continue
            if native_id in arrays:
                self._table.expect(native_id, self._generation)
                continue
            todo.append(tracked)
        if not todo:
            return
        try:
            found: Dict[str, Optional[NativeJob]] = await self.system.final_records(
                [t.native_id for t in todo], self.run_cmd)
            failed = False
        except (ServiceError, ValueError) as exc:
            log.info("cannot look up how %d %s jobs ended: %s", len(todo), self.system.label, exc)
            found, failed = {}, True
        for tracked in todo:
            native_id = tracked.native_id
            record = found.get(native_id)
            if record is not None:
                self._update_job(tracked, record)
                if not self.system.job_state(record).final:
                    # Still there, although the listing left it out: looked up again.
                    self._table.expect(native_id, self._generation)
                continue
            tracked.gone_polls += 1
            if native_id not in found and tracked.gone_polls < self.MAX_GONE_POLLS:
                self._table.expect(native_id, self._generation)  # asked again after the next listing
                continue
            why = ("the accounting lookup kept failing" if failed else "it has no record of how it ended")
            message = f"{self.system.label} no longer lists the job and {why}"
            state = JobState.DELETED
            if tracked.deleted:
                state, message = JobState.KILLED, f"deleted on request; {message}"
            values = {K.STATE: state.value, K.NATIVE_STATE: "UNKNOWN"}
            if tracked.followers:
                tracked.held = ({**values, K.MESSAGE: message}, dict(values))
                values = {K.STATE: JobState.FINISHING.value}
            with self.model.batch():
                self._set(tracked.process, values)
                self._set(tracked.element, {**values, K.MESSAGE: message} if not tracked.followers else values)
            if not tracked.completed:
                self._completed(tracked)

    def _tracked(self, job: int) -> TrackedJob:
        tracked = self._by_element.get(job)
        if tracked is None:
            raise JobError(f"the job is not a {self.system.label} job this agent follows", ErrorKind.NO_SUCH_JOB)
        return tracked

    # ------------------------------------------------------------------ submission

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> Submitted:
        if not spec.executable:
            raise SubmitError("the submission names no program", ErrorKind.BAD_REQUEST)
        name = self.model.attr(queue, K.NAME)
        if not isinstance(name, str) or not name:
            raise SubmitError("the queue has no name", ErrorKind.NO_SUCH_QUEUE)
        spec = _batch_settings(spec)
        base = spec.working_dir or os.getcwd()
        spool: List[str] = []
        stdout, stderr = spec.stdout_path or None, spec.stderr_path or None
        if stdout is not None and stderr is None:
            stderr = self.system.stderr_default(stdout)
        if stdout is None or stderr is None:
            out, err = self._spool_paths(spec.client_ref or spec.display_name)
            if stdout is None:
                stdout = self.system.literal_path(out)
                spool.append(out)
            if stderr is None:
                stderr = self.system.literal_path(err)
                spool.append(err)
        spec = attrs.evolve(spec, queue=name, stdout_path=stdout, stderr_path=stderr)
        argv, stdin = self.system.submit_command(spec)
        named = {"stdout": stdout}
        if stderr != stdout:
            named["stderr"] = stderr
        # Files left by an earlier run under the same names are not this job's output.
        stale = {stream: file_signature(os.path.join(base, path)) for stream, path in named.items()}
        self._submitting += 1
        try:
            # The submit command may pass its environment to the job.
            result = await self.run_cmd(argv, stdin=stdin, check=False, env=dict(os.environ))
        except CommandFailed as exc:
            message = exc.message + ("; the job may or may not have been submitted" if exc.timed_out else "")
            raise SubmitError(message, ErrorKind.UNAVAILABLE) from None
        finally:
            self._submitting -= 1
        native_id = self.system.parse_submitted(result)
        follow = {}
        for stream, path in named.items():
            found = self.system.follow_path(path, native_id, spec, self.user)
            if found is None:
                log.info("cannot follow %s of %s job %s: %r is expanded by %s", stream, self.system.label,
                         native_id, path, self.system.label)
                continue
            follow[stream] = os.path.join(base, found)
            if found != path:
                stale[stream] = None
        tracked = self._register(native_id, spec, queue, key, submitted=True)
        tracked.spool_files = tuple(spool)
        tracked.paths = dict(follow)
        self._start_followers(tracked, {stream: (0, stale[stream]) for stream in follow})
        self._poke()
        log.info("submitted %s as %s job %s (key %d)", spec.display_name, self.system.label, native_id,
                 tracked.element)
        return Submitted(tracked.element, native_id, {"paths": dict(tracked.paths), "spool": list(tracked.spool_files)})

    def _register(self, native_id: str, spec: JobSpec, queue: int, key: Optional[int], *, submitted: bool,
                  values: Optional[Dict[str, Any]] = None) -> TrackedJob:
        model = self.model
        attrs_: Dict[str, Any] = {
            K.CLIENT_REF: spec.client_ref, K.NAME: spec.display_name, K.NATIVE_ID: native_id, K.USER: self.user,
            K.NUM_PROCS: str(spec.num_procs), K.EXECUTABLE: spec.executable,
        }
        if spec.arguments:
            attrs_[K.ARGUMENTS] = spec.arguments
        if spec.working_dir:
            attrs_[K.WORKING_DIR] = spec.working_dir
        if spec.account:
            attrs_[K.ACCOUNT] = spec.account
        if spec.wall_time:
            attrs_[K.TIME_LIMIT] = str(spec.wall_time)
        tracked = self._jobs.get(native_id)
        if tracked is not None:  # listed before the submit command answered
            tracked.submitted = submitted
            self._set(tracked.element, attrs_)
            return tracked
        state = JobState.HOLD if spec.hold else JobState.QUEUING
        first = {K.STATE: state.value, K.NATIVE_STATE: self.system.submitted_state}
        first.update(values or {})
        attrs_.update(first)
        attrs_[K.QUEUE] = queue
        element, processes = model.add_job(
            queue, {k: v for k, v in attrs_.items() if v not in ("", None)},
            [{k: v for k, v in first.items() if k in (K.STATE, K.NATIVE_STATE, K.EXIT_CODE, K.SIGNAL) and v}],
            owner=self.name, key=key)
        process = processes[0]
        tracked = TrackedJob(native_id, element, process, queue, submitted=submitted)
        self._figures_stale = True
        self._jobs[native_id] = tracked
        self._by_element[element] = tracked
        self._table.expect(native_id, self._generation)
        return tracked

    def _spool_paths(self, label: str) -> Tuple[str, str]:
        try:
            os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SubmitError(f"cannot create the output directory {self.spool_dir}: {exc.strerror or exc}") from None
        stem = os.path.join(self.spool_dir, f"{_SAFE_NAME.sub('_', label)[:80] or 'job'}.{secrets.token_hex(4)}")
        return stem + ".out", stem + ".err"

    # ------------------------------------------------------------------ adoption

    # ------------------------------------------------------------------ job commands

    async def _job_command(self, job: int, op: str, queue: str = "") -> TrackedJob:
        tracked = self._tracked(job)
        label = self.system.label
        if (tracked.completed or self._shown_ended(tracked)) and not self.system.commands_after_end:
            raise JobError(f"{label} job {tracked.native_id} has ended already", ErrorKind.OPERATION_FAILED)
        record = self._table.record(tracked.native_id) or NativeJob(
            tracked.native_id, native_state=str(self.model.attr(tracked.element, K.NATIVE_STATE) or ""))
        argv = self.system.job_command(op, record, queue)
        try:
            result = await self.run_cmd(argv, check=False)
        except CommandFailed as exc:
            raise JobError(f"cannot {op} {label} job {tracked.native_id}: {exc.message}", ErrorKind.UNAVAILABLE) from None
        finally:
            self._poke()
        self.system.check_job_command(op, tracked.native_id, argv, result)
        return tracked

    async def terminate(self, job: int) -> None:
        tracked = await self._job_command(job, "delete")
        tracked.deleted = True
        self._ended_before_start(tracked)

    def _shown_ended(self, tracked: TrackedJob) -> bool:
        """The model shows the job ended (deleted before it started, before a poll said so)."""
        state = self.model.attr(tracked.element, K.STATE) if tracked.element in self.model else None
        return state in FINAL_STATE_NAMES

    def _ended_before_start(self, tracked: TrackedJob) -> None:
        """A job the scheduler has deleted before it ran will never run: it is KILLED now (and
        so in the job store), not at the next poll, which an agent that ends first never
        makes.  The next poll still asks the scheduler how it ended, which may say more (a
        job held in an error state FAILED, and why)."""
        state = self.model.attr(tracked.element, K.STATE) if tracked.element in self.model else None
        try:
            current = JobState(state) if isinstance(state, str) else None
        except ValueError:
            current = None
        if current is None or current.final or ran_or_ended(current) or tracked.completed:
            return
        with self.model.batch():
            self._set(tracked.process, {K.STATE: JobState.KILLED.value})
            self._set(tracked.element, {K.STATE: JobState.KILLED.value, K.MESSAGE: "deleted on request before it started"})

    async def hold(self, job: int, held: bool) -> None:
        await self._job_command(job, "hold" if held else "release")

    async def suspend(self, job: int, suspended: bool) -> None:
        await self._job_command(job, "suspend" if suspended else "resume")

    async def move(self, job: int, queue: int) -> None:
        tracked = self._tracked(job)
        if queue == tracked.queue:
            return
        name = self.model.attr(queue, K.NAME)
        if not isinstance(name, str) or not name:
            raise JobError("the queue has no name", ErrorKind.NO_SUCH_QUEUE)
        await self._job_command(job, "move", name)
        if tracked.element in self.model:
            with self.model.batch():
                self.model.move(tracked.element, queue)
                tracked.queue = queue
                self.model.update(tracked.element, {K.QUEUE: queue})
                self._figures_stale = True


# --------------------------------------------------------------------------- helpers


#: Batch settings a front-end may pass only by name (in ``extra``): name -> JobSpec field.
_EXTRA_FIELDS = {"gpus": "gpus", "gres": "gres", "qos": "qos", "constraint": "constraint",
                 "exclusive": "exclusive", "array": "array", "prologue": "prologue",
                 "nativeOptions": "native_options"}


def _batch_settings(spec: JobSpec) -> JobSpec:
    """The spec with batch settings a front-end left in ``extra`` moved into their fields."""
    changes: Dict[str, Any] = {}
    for name, value in spec.extra:
        field = _EXTRA_FIELDS.get(name)
        if field is None or value == "" or getattr(spec, field) not in (None, False, ()):
            continue
        if field == "gpus":
            if not value.strip().isdigit():
                raise SubmitError(f"gpus must be a whole number, got {value!r}", ErrorKind.BAD_REQUEST)
            changes[field] = int(value)
        elif field == "exclusive":
            changes[field] = value.strip().lower() in ("true", "yes", "1")
        elif field in ("prologue", "native_options"):
            changes[field] = tuple(line for line in value.split("\n") if line.strip()) if field == "prologue" \
                else tuple(value.split())
        else:
            changes[field] = value
    return attrs.evolve(spec, **changes) if changes else spec


