"""The Invoke Server's jobs as jobs of the agent: a :class:`~.server.JobGateway` over the agent's
job service, reached as a client on the state directory's socket.

Every job a Ninf-G client asks for becomes an ordinary job of the agent that serves the state
directory (``STATE_DIR/agent.sock``): it goes to whichever scheduler the request names (local,
SLURM, Grid Engine...), through the agent's brokers, into its job store, and any PTP client or
console of that agent sees it.  When no agent serves the directory, one is started in the
background (``proxy-agent --unix STATE_DIR/background.sock``, its log in
``STATE_DIR/agent.log``); it stays for later servers and clients, as an agent started by
hand would.

How a job goes:

* :meth:`AgentJobs.submit` opens the job's output files (``stdout_path``/``stderr_path``,
  for appending, so a bad path fails the submission), reports the job ACCEPTED and, when a
  slot is free (``slots``: at most that many of this server's jobs at once), submits it to
  the agent and returns once the agent has it.  A job without a slot waits QUEUING and is
  submitted when one frees up, in submission order; a refusal then ends it FAILED.
* The job's state is followed in the agent's model; its output arrives as the agent's output
  events and is appended to the job's files here, on the client's side, whatever node the
  job ran on.  (Files are written line by line as the agent delivers them.)
* ``wall_time`` goes to the scheduler (``timeLimit``) and is also kept here: a job RUNNING
  longer than that is cancelled and ends FAILED, which covers schedulers without limits.
* :meth:`AgentJobs.cancel` takes a waiting job out of the line, or terminates it in the agent.
* If the connection to the agent breaks, the server connects again (starting an agent if
  none serves the directory any more) and follows its jobs on under the same ids: the job
  store keeps them across a restart of the agent.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
from collections import deque
from contextlib import asynccontextmanager
from subprocess import DEVNULL
from typing import AsyncIterator, Deque, Dict, List, Optional, Sequence, Set, Tuple

import trio

from ...client.connection import AgentClient
from ...client.errors import ClientError, CommandFailed, ConnectError, WaitTimeout
from ...client.state import Element
from ...service.jobs import ErrorKind, JobError, JobSpec, JobState, SubmitError
from .server import JobUpdate

__all__ = ["AgentJobs", "AgentSettings", "SOCKET_NAME"]

log = logging.getLogger("proxy_agent.invoke.agent")

#: The socket every agent serves in its state directory.
SOCKET_NAME = "agent.sock"
#: The socket of an agent this server started (it needs a transport of its own).
BACKGROUND_SOCKET = "background.sock"
#: The started agent's log and its early error output.
AGENT_LOG = "agent.log"
AGENT_ERRORS = "agent.err"
#: How long a started agent may take to answer on the socket.
START_BOUND = 30.0
#: How long to keep trying to reach the agent again once the connection broke.
RECONNECT_BOUND = 60.0
#: How long a job may take to show up in the model of an agent connected to again.
ADOPT_BOUND = 10.0
#: How long a command to the agent may take.
COMMAND_BOUND = 60.0
#: Element ids of this server's session begin here (ids are base + the service's job key,
#: the same in every session, so a job keeps its id across a reconnection).
BASE_ID = 1000
#: Names that are parameters of the client's submit(), not attributes.
_SUBMIT_PARAMETERS = frozenset({"exec_path", "args", "count", "env", "cwd", "queue", "sub_id", "timeout", "broker"})
#: Seconds between two sweeps of the output of jobs that are not this server's.
OUTPUT_TRIM_INTERVAL = 10.0
#: Texts of the agent's job states (``jobStatus``) that this gateway understands.
_STATES = {state.value: state for state in JobState}


class _Unreachable(Exception):
    """The agent cannot be reached; the text says why."""


class AgentSettings:
    """Where the agent is, and how to start one when none serves the state directory."""

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
        #: start an agent when none answers (otherwise: the submission fails)
        self.start = start

    @property
    def socket(self) -> str:
        return os.path.join(self.state_dir, SOCKET_NAME)

    def agent_argv(self) -> List[str]:
        return [
            self.python, "-m", "proxy_agent",
            "--unix", os.path.join(self.state_dir, BACKGROUND_SOCKET),
            "--state-dir", self.state_dir,
            "--scheduler", ",".join(self.schedulers),
            "--log-file", os.path.join(self.state_dir, AGENT_LOG),
            *self.agent_options,
        ]


class _AgentLink:
    """One connection to the agent at a time, opened when first needed and again after it
    broke.  The connection lives in a task of its own (its reader's nursery must)."""

    def __init__(self, nursery: trio.Nursery, settings: AgentSettings) -> None:
        self._nursery = nursery
        self.settings = settings
        self.client: Optional[AgentClient] = None
        self._attempt: Optional[trio.Event] = None
        self._error: Optional[str] = None
        #: the last attempt could not connect (as opposed to: its connection ended later)
        self._failed = False
        self._started: Optional[subprocess.Popen] = None
        self._closing = False

    async def get(self) -> AgentClient:
        """The connected client; _Unreachable saying why there is none."""
        if self._started is not None and self._started.poll() is not None:
            self._started = None  # reaped (say an agent that found the directory taken)
        for _ in range(2):
            client = self.client
            if client is not None and client.ended is None:
                return client
            if self._closing:
                raise _Unreachable("the server is shutting down")
            attempt = self._attempt
            if attempt is None or (attempt.is_set() and not self._failed):
                # None yet, or one whose connection has just ended: a new one
                attempt = self._attempt = trio.Event()
                self._failed = False
                self._nursery.start_soon(self._hold, attempt)
            await attempt.wait()
            if self._failed:
                break
        client = self.client
        if client is None or client.ended is not None:
            raise _Unreachable(self._error or "the connection to the agent ended")
        return client

    def close(self) -> None:
        self._closing = True

    async def _hold(self, attempt: trio.Event) -> None:
        try:
            client = await self._connect()
        except _Unreachable as exc:
            self._error = str(exc)
            self._failed = True
            log.warning("cannot reach the agent: %s", exc)
            if self._attempt is attempt:
                self._attempt = None
            attempt.set()
            return
        try:
            async with client:
                try:
                    await client.init(base_id=BASE_ID, timeout=COMMAND_BOUND)
                    await client.model_def(timeout=COMMAND_BOUND)
                    await client.start_events(timeout=COMMAND_BOUND)
                except ClientError as exc:
                    self._error = f"the agent at {self.settings.socket} did not accept this server: {exc}"
                    self._failed = True
                    log.warning("%s", self._error)
                    return
                self.client = client
                log.info("connected to the agent at %s", self.settings.socket)
                attempt.set()
                try:
                    await client.wait_for(lambda: False)
                except ClientError as exc:
                    self._error = f"the connection to the agent ended: {exc}"
                    log.warning("%s", self._error)
        finally:
            if self._attempt is attempt:
                self.client = None
                self._attempt = None
            attempt.set()

    async def _connect(self) -> AgentClient:
        path = self.settings.socket
        try:
            return await AgentClient.connect_unix(path, strict=False)
        except ConnectError as exc:
            first = str(exc)
        if not self.settings.start:
            raise _Unreachable(f"no agent serves {self.settings.state_dir} ({first})")
        started = self._start_agent()
        with trio.move_on_after(START_BOUND):
            while True:
                await trio.sleep(0.05)
                try:
                    return await AgentClient.connect_unix(path, strict=False)
                except ConnectError:
                    pass
                if started.poll() is not None:
                    why = self._agent_errors()
                    if "in use" not in why:
                        # Not a race with another agent starting: this one failed.
                        raise _Unreachable(f"the agent could not be started: {why or f'exit status {started.returncode}'}")
        raise _Unreachable(f"the agent started in {self.settings.state_dir} did not answer within {START_BOUND:.0f} s")

    def _start_agent(self) -> subprocess.Popen:
        settings = self.settings
        try:
            os.makedirs(settings.state_dir, mode=0o700, exist_ok=True)
            errors = os.open(
                os.path.join(settings.state_dir, AGENT_ERRORS),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600,
            )
        except OSError as exc:
            raise _Unreachable(f"cannot use the state directory {settings.state_dir}: {exc.strerror or exc}") from None
        argv = settings.agent_argv()
        log.info("starting an agent: %s", " ".join(argv))
        try:
            # A session of its own: signals meant for this server's group do not reach it,
            # and it stays when this server ends, for the next one.
            started = subprocess.Popen(
                argv, stdin=DEVNULL, stdout=DEVNULL, stderr=errors, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise _Unreachable(f"cannot start the agent {argv[0]}: {exc.strerror or exc}") from None
        finally:
            os.close(errors)
        # Kept to be reaped, should it end while this server runs.
        self._started = started
        return started

    def _agent_errors(self) -> str:
        try:
            with open(os.path.join(self.settings.state_dir, AGENT_ERRORS), "rb") as f:
                text = f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""
        return " ".join(text.split())


# --------------------------------------------------------------------------- jobs


class _Job:
    __slots__ = (
        "key", "spec", "history", "changed", "final", "ended", "cancelled", "timed_out",
        "agent_id", "label", "has_slot", "slot_given", "waiting", "files",
    )

    def __init__(self, key: int, spec: JobSpec, files: Dict[str, int]) -> None:
        self.key = key
        self.spec = spec
        self.history: List[JobUpdate] = []
        self.changed = trio.Event()
        self.final = False
        self.ended = trio.Event()
        self.cancelled = False
        self.timed_out = False
        #: the job's element id in the agent's model, once it has it
        self.agent_id: Optional[str] = None
        #: how the log names it: the client's job id, then the agent's id of the job (as
        #: ``proxy-agent jobs`` and the console show it) once the agent has it
        self.label = spec.client_ref or f"#{key}"
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
        self.link = _AgentLink(nursery, settings)
        self._free_slots = slots
        self._queue: Deque[_Job] = deque()
        self._jobs: Dict[int, _Job] = {}
        self._keys = itertools.count(1)
        self._sub_ids = itertools.count(1)
        self._closing = False
        #: agent ids of the jobs followed now (the output of the others is not kept)
        self._followed: Set[Optional[str]] = set()

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: AgentSettings, *, slots: Optional[int] = None) -> AsyncIterator["AgentJobs"]:
        async with trio.open_nursery() as nursery:
            jobs = cls(nursery, settings, slots=slots)
            nursery.start_soon(jobs._drop_other_output)
            try:
                yield jobs
            finally:
                jobs._closing = True
                jobs.link.close()
                nursery.cancel_scope.cancel()

    def connect_soon(self) -> None:
        """Reach the agent now (starting one if needed) rather than at the first job."""
        self._nursery.start_soon(self._connect_quietly)

    async def _connect_quietly(self) -> None:
        try:
            await self.link.get()
        except _Unreachable:
            pass

    async def _drop_other_output(self) -> None:
        """The agent sends every client the output of every job; the mirror would keep that
        of the jobs of others (an IDE's, say) for ever."""
        while True:
            await trio.sleep(OUTPUT_TRIM_INTERVAL)
            client = self.link.client
            if client is None:
                continue
            for element in list(client.jobs.values()):
                if element.id not in self._followed and element.output:
                    del element.output[:]
                    for process in client.children(element):
                        del process.output[:]

    # ------------------------------------------------------------------ the gateway

    async def submit(self, spec: JobSpec) -> int:
        if self._closing:
            raise SubmitError("the server is shutting down", ErrorKind.SHUTTING_DOWN)
        files = _open_outputs(spec)
        job = _Job(next(self._keys), spec, files)
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
            self._jobs[job.key] = job
            self._nursery.start_soon(self._run, job)
        else:
            self._jobs[job.key] = job
            self._queue.append(job)
            job.push(JobState.QUEUING, "waiting for a free slot")
            self._nursery.start_soon(self._run, job)
        return job.key

    async def cancel(self, job: int) -> None:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        if record.final or record.cancelled:
            return
        record.cancelled = True
        record.waiting.cancel()
        if record.agent_id is not None:
            await self._terminate(record)
        # A job being submitted is terminated as soon as the agent has it (see _run).

    def watch(self, job: int) -> _Updates:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        return _Updates(record)

    # ------------------------------------------------------------------ submitting

    async def _submit(self, job: _Job) -> None:
        spec = job.spec
        try:
            client = await self.link.get()
        except _Unreachable as exc:
            raise SubmitError(f"cannot reach the agent: {exc}", ErrorKind.UNAVAILABLE) from None
        queue = _queue_for(client, spec)
        sub_id = f"ninfg-{os.getpid()}-{next(self._sub_ids)}"
        attributes: Dict[str, object] = {}
        if spec.broker:
            attributes["broker"] = spec.broker
        if spec.wall_time:
            attributes["timeLimit"] = str(max(1, -(-spec.wall_time // 60)))
        if spec.memory:
            attributes["memory"] = str(spec.memory)
        if spec.nodes:
            attributes["nodes"] = str(spec.nodes)
        if spec.account:
            attributes["account"] = spec.account
        program = spec.extra_value("mpi_program")
        attributes["jobName"] = os.path.basename(program) if program else spec.display_name
        for name, value in spec.extra:
            if name not in _SUBMIT_PARAMETERS:
                attributes.setdefault(name, value)
        try:
            job.agent_id = await client.submit(
                spec.executable,
                spec.arguments,
                count=spec.num_procs,
                env=[f"{name}={value}" for name, value in spec.environment],
                cwd=spec.working_dir or os.getcwd(),
                queue=queue,
                sub_id=sub_id,
                timeout=COMMAND_BOUND,
                **attributes,
            )
        except CommandFailed as exc:
            raise SubmitError(exc.message or str(exc)) from None
        except ClientError as exc:
            raise SubmitError(f"the agent did not take the job: {exc}", ErrorKind.UNAVAILABLE) from None
        self._followed.add(job.agent_id)
        job.label = f"{spec.client_ref or sub_id} (job {client.job_key(job.agent_id)})"
        log.info("%s is in the agent's job list", job.label)

    async def _run(self, job: _Job) -> None:
        try:
            await self._run_job(job)
        except Exception as exc:  # noqa: BLE001 - one job's trouble must not end the others
            log.exception("%s: following it failed", job.label)
            job.push(JobState.FAILED, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._followed.discard(job.agent_id)
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
        try:
            client = await self.link.get()
            await client.terminate(job.agent_id, timeout=COMMAND_BOUND)
        except _Unreachable as exc:
            raise JobError(f"cannot reach the agent: {exc}", ErrorKind.UNAVAILABLE) from None
        except CommandFailed as exc:
            element = client.find_job(job.agent_id) if job.agent_id else None
            if element is not None and _state_of(element) is not None and _state_of(element).final:
                return  # it ended on its own meanwhile
            raise JobError(exc.message or str(exc)) from None
        except ClientError as exc:
            raise JobError(f"the agent did not end the job: {exc}", ErrorKind.UNAVAILABLE) from None

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
        """Follow the job in the agent's model until it ends, across reconnections."""
        running_since: Optional[float] = None
        lost_at: Optional[float] = None
        while not job.final:
            try:
                client = await self.link.get()
            except _Unreachable as exc:
                now = trio.current_time()
                lost_at = lost_at if lost_at is not None else now
                if now - lost_at > RECONNECT_BOUND:
                    job.push(JobState.FAILED, f"lost the agent: {exc}")
                    return
                await trio.sleep(1.0)
                continue
            try:
                # A new agent may take a moment to adopt the jobs of the one before.
                element = await client.wait_for(lambda: client.find_job(job.agent_id), timeout=ADOPT_BOUND)
            except WaitTimeout:
                job.push(JobState.DELETED, "the agent no longer knows the job")
                return
            except ClientError:
                await trio.sleep(0.5)
                continue
            lost_at = None
            try:
                running_since = await self._follow_on(client, element, job, running_since)
            except ClientError as exc:
                log.info("%s: the connection to the agent failed (%s); following on", job.label, exc)
                await trio.sleep(0.5)

    async def _follow_on(self, client: AgentClient, element: Element, job: _Job, running_since: Optional[float]) -> Optional[float]:
        seen: Optional[str] = None
        while True:
            self._write_output(client, job, element)
            status = element.get("jobStatus")
            if status != seen:
                seen = status if isinstance(status, str) else None
                state = _STATES.get(seen or "")
                if state is not None:
                    if state.started and running_since is None:
                        running_since = trio.current_time()
                    if state.final:
                        job.push(*_final_update(client, job, element, state))
                        return running_since
                    # The client hears "queued" or "started"; a scheduler's reason (why a
                    # job waits) is in the agent's log and its clients' views.
                    job.push(state)
            if element.removed:
                job.push(JobState.DELETED, "the job was removed from the agent")
                return running_since
            deadline = math.inf
            if job.spec.wall_time and running_since is not None and not job.timed_out:
                deadline = running_since + job.spec.wall_time
            try:
                await client.wait_for(
                    lambda: element.get("jobStatus") != seen or element.output or element.removed,
                    timeout=None if deadline == math.inf else max(0.0, deadline - trio.current_time()),
                )
            except WaitTimeout:
                log.info("%s ran past its wall time of %d s: cancelling it", job.label, job.spec.wall_time)
                job.timed_out = True
                try:
                    await self._terminate(job)
                except JobError as exc:
                    log.warning("%s: %s", job.label, exc.message)

    @staticmethod
    def _write_output(client: AgentClient, job: _Job, element: Element) -> None:
        lines = element.output
        if not lines:
            return
        for line in lines:
            fd = job.files.get(line.stream)
            if fd is None:
                continue
            try:
                os.write(fd, (line.text + "\n").encode("utf-8", "surrogateescape"))
            except OSError as exc:
                log.warning("%s: cannot write its %s: %s", job.label, line.stream, exc.strerror or exc)
                job.files.pop(line.stream, None)
        # The lines are in their files now: the mirror need not keep them.
        del lines[:]
        for process in client.children(element):
            del process.output[:]


# --------------------------------------------------------------------------- helpers


def _state_of(element: Element) -> Optional[JobState]:
    status = element.get("jobStatus")
    return _STATES.get(status) if isinstance(status, str) else None


def _final_update(client: AgentClient, job: _Job, element: Element, state: JobState) -> Tuple[JobState, Optional[str]]:
    if job.timed_out and state is not JobState.FINISHED:
        return JobState.FAILED, f"exceeded its wall time of {job.spec.wall_time} s"
    if state is JobState.KILLED:
        return state, "cancelled"
    outcome = _exit_outcome(client, element)
    if outcome is not None:
        return state, outcome
    message = element.get("jobStatusMessage")
    if isinstance(message, str) and message:
        return state, message
    return state, "exit status 0" if state is JobState.FINISHED else None


def _exit_outcome(client: AgentClient, element: Element) -> Optional[str]:
    """``exit status N`` or ``killed by signal NAME`` of the first process that failed (all
    exited 0: ``exit status 0``); None when the agent reports no exit status."""
    processes = sorted(client.children(element), key=lambda p: p.rank if p.rank is not None else 0)
    count = len(processes)
    seen_code = False
    for index, process in enumerate(processes):
        signal_name = process.get("processSignalName")
        code = process.get("processExitCode")
        which = f"process {index + 1} of {count}: " if count > 1 else ""
        if isinstance(signal_name, str) and signal_name:
            return f"{which}killed by signal {signal_name}"
        if isinstance(code, str) and code.lstrip("-").isdigit():
            seen_code = True
            if int(code) != 0:
                return f"{which}exit status {int(code)}"
    return "exit status 0" if seen_code else None


def _queue_for(client: AgentClient, spec: JobSpec) -> Optional[str]:
    """The queueId of a submission: its queue, its candidates, or for a ``scheduler`` named
    without a queue, that scheduler's default queue (its queues, with a broker)."""
    if spec.queue:
        return spec.queue
    if spec.candidates:
        return ",".join(spec.candidates)
    scheduler = spec.extra_value("scheduler")
    if not scheduler:
        return None
    queues = [q for q in client.queues.values() if q.get("backend") == scheduler and not q.removed]
    if not queues:
        running = sorted({str(q.get("backend")) for q in client.queues.values() if q.get("backend")})
        raise SubmitError(
            f"the agent runs no scheduler {scheduler!r} (it runs {', '.join(running) or 'none'}); "
            f"start it with that scheduler, e.g. proxy-agent --scheduler {scheduler}",
            ErrorKind.NO_SUCH_QUEUE,
        )
    if spec.broker:
        return ",".join(f"{scheduler}:{q.name}" for q in queues)
    chosen = next((q for q in queues if q.get("default") == "true"), queues[0])
    return f"{scheduler}:{chosen.name}"


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
