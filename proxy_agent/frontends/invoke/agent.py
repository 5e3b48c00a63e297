"""The Invoke Server's jobs as jobs of the agent: a :class:`~.server.JobGateway` over the job
service of the state directory, reached through the service interface on
``STATE_DIR/agent.sock`` (see :mod:`proxy_agent.frontends.api`), in the service's own terms.

Every job a Ninf-G client asks for becomes an ordinary job of the state directory's service:
it goes to whichever scheduler the request names (local, SLURM, Grid Engine...), through the
service's brokers, into its job store, and any PTP client or console of that service sees it.
When no service runs, one is started, as any launch of the agent starts it; it stays for later
servers and clients (until it has been idle for a while).  The server's own options for the
agent (``--scheduler``, ``--agent-option``) are given to the service as a launch's would be:
schedulers it lacks are added.

How a job goes:

* :meth:`AgentJobs.submit` opens the job's output files (``stdout_path``/``stderr_path``,
  for appending, so a bad path fails the submission), reports the job ACCEPTED and, when a
  slot is free (``slots``: at most that many of this server's jobs at once), submits its
  :class:`~proxy_agent.service.jobs.JobSpec` to the service and returns once the service has
  it.  A job without a slot waits QUEUING and is submitted when one frees up, in submission
  order; a refusal then ends it FAILED.
* The service tells the job's states and sends its output, which is appended to the job's
  files here, on the client's side, whatever node the job ran on.  The service's job key (the
  one id its store, the job list and every front-end show) is in this server's log.
* ``wall_time`` goes to the scheduler and is also kept here: a job RUNNING longer than that is
  cancelled and ends FAILED, which covers schedulers without limits.
* :meth:`AgentJobs.cancel` takes a waiting job out of the line, or terminates it.
* If the connection to the service breaks, the server connects again (starting a service if
  none runs any more) and follows its jobs on by their keys: the job store keeps them across a
  restart of the service.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator, Deque, Dict, List, Optional, Sequence, Tuple

import attrs
import trio

from ...service.jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, SubmitError
from ..api.client import GoneEvent, JobEvent, OutputEvent, ServiceClient, ServiceGone
from .server import JobUpdate

__all__ = ["AgentJobs", "AgentSettings"]

log = logging.getLogger("proxy_agent.invoke.agent")

#: How long finding or starting the service may take.
START_BOUND = 30.0
#: How long to keep trying to reach the service again once the connection broke.
RECONNECT_BOUND = 60.0


class _Unreachable(Exception):
    """The service cannot be reached; the text says why."""


class AgentSettings:
    """Where the service is, and what this server asks of it."""

    def __init__(
        self,
        state_dir: str,
        *,
        schedulers: Sequence[str] = ("local",),
        agent_options: Sequence[str] = (),
        python: Optional[str] = None,
        start: bool = True,
    ) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.schedulers = tuple(schedulers) or ("local",)
        self.agent_options = tuple(agent_options)
        self.python = python or sys.executable
        #: start a service when none answers (otherwise: the submission fails)
        self.start = start

    def options(self) -> List[str]:
        """The agent command line this server's jobs need (as a launch would give it)."""
        options = list(self.agent_options)
        named = any(o == "--scheduler" or o.startswith("--scheduler=") for o in options)
        return options if named else ["--scheduler", ",".join(self.schedulers), *options]


class _ServiceLink:
    """One connection to the service at a time, made when first needed and again after it
    broke.  The connection's reader lives in a task of its own."""

    def __init__(self, nursery: trio.Nursery, settings: AgentSettings) -> None:
        self._nursery = nursery
        self.settings = settings
        self.client: Optional[ServiceClient] = None
        self._connecting: Optional[trio.Event] = None
        self._error: Optional[str] = None
        self._closing = False

    async def get(self) -> ServiceClient:
        """The connected client; _Unreachable saying why there is none."""
        for _ in range(2):
            client = self.client
            if client is not None and client.ended is None:
                return client
            if self._closing:
                raise _Unreachable("the server is shutting down")
            attempt = self._connecting
            if attempt is None:
                attempt = self._connecting = trio.Event()
                self._error = None
                self._nursery.start_soon(self._hold, attempt)
            await attempt.wait()
            if self._error is not None:
                break
        client = self.client
        if client is None or client.ended is not None:
            raise _Unreachable(self._error or "the connection to the service ended")
        return client

    def close(self) -> None:
        self._closing = True

    async def _hold(self, attempt: trio.Event) -> None:
        settings = self.settings
        try:
            client = await ServiceClient.connect(settings.state_dir, options=settings.options(),
                                                 start=settings.start, tool="proxy-invoke-server",
                                                 timeout=START_BOUND)
        except (ServiceError, ServiceGone) as exc:
            self._error = exc.message if isinstance(exc, ServiceError) else str(exc)
            log.warning("cannot reach the service: %s", self._error)
            self._connecting = None
            attempt.set()
            return
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(client.run)
                self.client = client
                self._connecting = None
                log.info("connected to the service of %s (process %s)", settings.state_dir,
                         client.service.get("pid"))
                if client.not_applied:
                    log.warning("%s", client.not_applied)
                attempt.set()
        finally:
            if client.ended:
                log.warning("the connection to the service ended: %s", client.ended)
            if self.client is client:
                self.client = None
            attempt.set()
            with trio.CancelScope(shield=True):
                await client.aclose()


# --------------------------------------------------------------------------- jobs


class _Job:
    __slots__ = (
        "ident", "spec", "history", "changed", "final", "ended", "cancelled", "timed_out",
        "key", "has_slot", "slot_given", "waiting", "files",
    )

    def __init__(self, ident: int, spec: JobSpec, files: Dict[str, int]) -> None:
        #: this server's number for the job (what the gateway's callers hold)
        self.ident = ident
        self.spec = spec
        self.history: List[JobUpdate] = []
        self.changed = trio.Event()
        self.final = False
        self.ended = trio.Event()
        self.cancelled = False
        self.timed_out = False
        #: the service's job key, once it has the job
        self.key: Optional[int] = None
        self.has_slot = False
        self.slot_given = trio.Event()
        #: while the job waits for a slot: cancelling this ends the wait
        self.waiting = trio.CancelScope()
        #: stream -> descriptor of the file its output is appended to
        self.files = files

    def push(self, state: JobState, message: Optional[str] = None) -> None:
        if self.final:
            return
        if self.history and self.history[-1].state is state and not state.final:
            return
        self.history.append(JobUpdate(state, message))
        if state.final:
            self.final = True
            self.ended.set()
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    @property
    def label(self) -> str:
        return f"job {self.key} of the service" if self.key is not None else f"request {self.ident} (not submitted)"


class _Updates:
    """A job's updates from the first on, until the final one."""

    def __init__(self, job: _Job) -> None:
        self._job = job
        self._next = 0

    def __aiter__(self) -> "_Updates":
        return self

    async def __anext__(self) -> JobUpdate:
        job = self._job
        while self._next >= len(job.history):
            if self._next and job.history[self._next - 1].state.final:
                raise StopAsyncIteration
            await job.changed.wait()
        update = job.history[self._next]
        self._next += 1
        return update


class AgentJobs:
    """The gateway (see the module's description)."""

    def __init__(self, nursery: trio.Nursery, settings: AgentSettings, *, slots: Optional[int] = None) -> None:
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self._nursery = nursery
        self.link = _ServiceLink(nursery, settings)
        self._free_slots = slots
        self._queue: Deque[_Job] = deque()
        self._jobs: Dict[int, _Job] = {}
        self._idents = itertools.count(1)
        self._refs = itertools.count(1)
        self._closing = False

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: AgentSettings, *, slots: Optional[int] = None) -> AsyncIterator["AgentJobs"]:
        async with trio.open_nursery() as nursery:
            jobs = cls(nursery, settings, slots=slots)
            try:
                yield jobs
            finally:
                jobs._closing = True
                jobs.link.close()
                nursery.cancel_scope.cancel()

    def connect_soon(self) -> None:
        """Reach the service now (starting one if needed) rather than at the first job."""
        self._nursery.start_soon(self._connect_quietly)

    async def _connect_quietly(self) -> None:
        try:
            await self.link.get()
        except _Unreachable:
            pass

    # ------------------------------------------------------------------ the gateway

    async def submit(self, spec: JobSpec) -> int:
        """The job's key: the service's own (as its store, the job list and every front-end
        show it); for a job that waits for a slot, a number of this server's below zero until
        it goes to the service (its log then gives the service's key)."""
        if self._closing:
            raise SubmitError("the server is shutting down", ErrorKind.SHUTTING_DOWN)
        files = _open_outputs(spec)
        job = _Job(next(self._idents), spec, files)
        job.push(JobState.ACCEPTED)
        if self._free_slots is None:
            job.has_slot = True
        elif self._free_slots > 0:
            self._free_slots -= 1
            job.has_slot = True
        if job.has_slot:
            try:
                await self._submit(job)
            except BaseException:
                self._release_slot(job)
                _close_files(job)
                raise
            assert job.key is not None
            handle = job.key
            self._nursery.start_soon(self._run, job)
        else:
            handle = -job.ident
            self._queue.append(job)
            job.push(JobState.QUEUING, "waiting for a free slot")
            log.info("request %d waits for a free slot (as %d)", job.ident, handle)
            self._nursery.start_soon(self._run, job)
        self._jobs[handle] = job
        return handle

    async def cancel(self, job: int) -> None:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        if record.final or record.cancelled:
            return
        record.cancelled = True
        record.waiting.cancel()
        if record.key is not None:
            await self._terminate(record)
        # A job being submitted is terminated as soon as the service has it (see _run).

    def watch(self, job: int) -> _Updates:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        return _Updates(record)

    # ------------------------------------------------------------------ submitting

    async def _submit(self, job: _Job) -> None:
        try:
            client = await self.link.get()
        except _Unreachable as exc:
            raise SubmitError(f"cannot reach the agent: {exc}", ErrorKind.UNAVAILABLE) from None
        spec = await self._service_spec(client, job.spec)
        try:
            job.key = await client.submit(spec, watch=True)
        except ServiceGone as exc:
            raise SubmitError(f"the agent did not take the job: {exc}", ErrorKind.UNAVAILABLE) from None
        except ServiceError as exc:
            raise SubmitError(exc.message, exc.kind) from None
        log.info("%s (job %d) is in the agent's job list (request %d, %s)", job.spec.client_ref or f"request {job.ident}",
                 job.key, job.ident, spec.client_ref)

    async def _service_spec(self, client: ServiceClient, spec: JobSpec) -> JobSpec:
        """The job as the service takes it: its output stays with this server (which writes the
        files), its name is the program's, its working directory this server's when it names
        none, its reference this server's own, and a scheduler named without a queue becomes
        that scheduler's default queue (or its queues, for a broker)."""
        program = spec.extra_value("mpi_program")
        queue, candidates = spec.queue, spec.candidates
        scheduler = spec.extra_value("scheduler")
        if not queue and not candidates and scheduler:
            queue, candidates = await _queues_of(client, scheduler, spec.broker)
        return attrs.evolve(
            spec,
            stdout_path=None,
            stderr_path=None,
            name=spec.name or (os.path.basename(program) if program else None),
            working_dir=spec.working_dir or os.getcwd(),
            # unique among the service's jobs, whichever server submitted them
            client_ref=f"ninfg-{os.getpid()}-{next(self._refs)}",
            queue=queue,
            candidates=candidates,
        )

    async def _run(self, job: _Job) -> None:
        try:
            await self._run_job(job)
        except Exception as exc:  # noqa: BLE001 - one job's trouble must not end the others
            log.exception("%s: following it failed", job.label)
            job.push(JobState.FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._release_slot(job)
            _close_files(job)
            if not job.final:
                job.push(JobState.FAILED, "the server ended before the job did")

    async def _run_job(self, job: _Job) -> None:
        if not job.has_slot:
            with job.waiting:
                await job.slot_given.wait()
            if job.cancelled:
                job.push(JobState.KILLED, "cancelled before it started")
                return
            try:
                await self._submit(job)
            except SubmitError as exc:
                job.push(JobState.FAILED, exc.message)
                return
        if job.cancelled:
            # Cancelled while it was being submitted.
            try:
                await self._terminate(job)
            except JobError as exc:
                log.warning("%s: %s", job.label, exc.message)
        await self._follow(job)

    async def _terminate(self, job: _Job) -> None:
        assert job.key is not None
        try:
            client = await self.link.get()
            await client.terminate(job.key)
        except _Unreachable as exc:
            raise JobError(f"cannot reach the agent: {exc}", ErrorKind.UNAVAILABLE) from None
        except ServiceGone as exc:
            raise JobError(f"the agent did not end the job: {exc}", ErrorKind.UNAVAILABLE) from None
        except ServiceError as exc:
            raise JobError(exc.message, exc.kind) from None

    def _release_slot(self, job: _Job) -> None:
        if self._free_slots is None:
            return
        if not job.has_slot:
            try:
                self._queue.remove(job)
            except ValueError:
                pass
            return
        job.has_slot = False
        while self._queue:
            waiting = self._queue.popleft()
            if not waiting.cancelled:
                waiting.has_slot = True
                waiting.slot_given.set()
                return
        self._free_slots += 1

    # ------------------------------------------------------------------ following

    async def _follow(self, job: _Job) -> None:
        """Follow the job's events until it ends, across reconnections."""
        assert job.key is not None
        running_since: Optional[float] = None
        lost_at: Optional[float] = None
        client: Optional[ServiceClient] = None
        watching = True  # the submission asked for its events
        while not job.final:
            try:
                if client is None or client.ended is not None:
                    client = await self.link.get()
                    watching = False
                if not watching:
                    await client.watch(job.key)
                    watching = True
            except (_Unreachable, ServiceGone) as exc:
                client = None
                now = trio.current_time()
                lost_at = lost_at if lost_at is not None else now
                if now - lost_at > RECONNECT_BOUND:
                    job.push(JobState.FAILED, f"lost the agent: {exc}")
                    return
                await trio.sleep(1.0)
                continue
            except ServiceError as exc:
                if exc.kind is ErrorKind.NO_SUCH_JOB:
                    job.push(JobState.DELETED, "the agent no longer knows the job")
                else:
                    job.push(JobState.FAILED, f"cannot follow the job: {exc.message}")
                return
            lost_at = None
            try:
                running_since = await self._follow_on(client, job, running_since)
            except ServiceGone as exc:
                log.info("%s: the connection to the service failed (%s); following on", job.label, exc)
                client = None
                await trio.sleep(0.5)

    async def _follow_on(self, client: ServiceClient, job: _Job, running_since: Optional[float]) -> Optional[float]:
        assert job.key is not None
        events = client.events(job.key).__aiter__()
        while True:
            deadline = math.inf
            if job.spec.wall_time and running_since is not None and not job.timed_out:
                deadline = running_since + job.spec.wall_time
            with trio.move_on_at(deadline) as waited:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    return running_since
            if waited.cancelled_caught:
                log.info("%s ran past its wall time of %d s: cancelling it", job.label, job.spec.wall_time)
                job.timed_out = True
                try:
                    await self._terminate(job)
                except JobError as exc:
                    log.warning("%s: %s", job.label, exc.message)
                continue
            if isinstance(event, OutputEvent):
                self._write_output(job, event)
            elif isinstance(event, GoneEvent):
                job.push(JobState.DELETED, event.message or "the job was removed from the agent")
                return running_since
            elif isinstance(event, JobEvent):
                state = event.state
                if state.started and running_since is None:
                    running_since = trio.current_time()
                if state.final:
                    job.push(*_final_update(job, event))
                    return running_since
                # The client hears "queued" or "started"; a scheduler's reason (why a job waits)
                # is in the service's log and its clients' views.
                job.push(state)

    @staticmethod
    def _write_output(job: _Job, event: OutputEvent) -> None:
        fd = job.files.get(event.stream)
        if fd is None:
            return
        try:
            os.write(fd, (event.text + "\n").encode("utf-8", "surrogateescape"))
        except OSError as exc:
            log.warning("%s: cannot write its %s: %s", job.label, event.stream, exc.strerror or exc)
            job.files.pop(event.stream, None)


# --------------------------------------------------------------------------- helpers


def _final_update(job: _Job, event: JobEvent) -> Tuple[JobState, Optional[str]]:
    state = event.state
    if job.timed_out and state is not JobState.FINISHED:
        return JobState.FAILED, f"exceeded its wall time of {job.spec.wall_time} s"
    if state is JobState.KILLED:
        return state, "cancelled"
    outcome = _exit_outcome(event)
    if outcome is not None:
        return state, outcome
    if event.message:
        return state, event.message
    return state, "exit status 0" if state is JobState.FINISHED else None


def _exit_outcome(event: JobEvent) -> Optional[str]:
    """``exit status N`` or ``killed by signal NAME`` of the first process that failed (all
    exited 0: ``exit status 0``); None when the service reports no exit status."""
    processes = sorted(event.processes, key=lambda p: p.rank)
    count = len(processes)
    seen_code = False
    for index, process in enumerate(processes):
        which = f"process {index + 1} of {count}: " if count > 1 else ""
        if process.signal:
            return f"{which}killed by signal {process.signal}"
        code = process.exit_code
        if isinstance(code, str) and code.lstrip("-").isdigit():
            seen_code = True
            if int(code) != 0:
                return f"{which}exit status {int(code)}"
    if not processes:
        if event.signal:
            return f"killed by signal {event.signal}"
        if isinstance(event.exit_code, str) and event.exit_code.lstrip("-").isdigit():
            return f"exit status {int(event.exit_code)}"
    return "exit status 0" if seen_code else None


async def _queues_of(client: ServiceClient, scheduler: str, broker: Optional[str]) -> Tuple[Optional[str], Tuple[str, ...]]:
    """For a ``scheduler`` named without a queue: that scheduler's default queue, or with a
    broker all its queues as candidates."""
    queues = [q for q in await client.queues() if q.get("scheduler") == scheduler]
    if not queues:
        running = sorted({str(q.get("scheduler")) for q in await client.queues() if q.get("scheduler")})
        raise SubmitError(
            f"the agent runs no scheduler {scheduler!r} (it runs {', '.join(running) or 'none'}); "
            f"start it with that scheduler, e.g. proxy-agent --scheduler {scheduler}",
            ErrorKind.NO_SUCH_QUEUE,
        )
    if broker:
        return None, tuple(f"{scheduler}:{q['name']}" for q in queues)
    chosen = next((q for q in queues if q.get("default")), queues[0])
    return f"{scheduler}:{chosen['name']}", ()


def _open_outputs(spec: JobSpec) -> Dict[str, int]:
    """Descriptors of the files the job's stdout and stderr are appended to."""
    files: Dict[str, int] = {}
    opened: Dict[str, int] = {}
    try:
        for stream, path in (("stdout", spec.stdout_path), ("stderr", spec.stderr_path)):
            if path is None:
                continue
            if path not in opened:
                opened[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            files[stream] = opened[path]
    except OSError as exc:
        for fd in opened.values():
            os.close(fd)
        raise SubmitError(f"cannot open output file {exc.filename}: {exc.strerror}") from None
    return files


def _close_files(job: _Job) -> None:
    for fd in set(job.files.values()):
        try:
            os.close(fd)
        except OSError:
            pass
    job.files = {}
