"""A :class:`~.server.JobGateway` that runs each job as processes on this host.

It stands in for the agent's job service so that the Invoke Server works on its own: one
scheduler (``local``), one queue (``default``).

How a job runs:

* It is ACCEPTED when submitted.  With ``slots`` set, at most that many jobs run at once and
  the others wait QUEUING, and start in submission order.
* ``num_procs`` copies of the program start from an argv list (never a shell), each in a
  session and process group of its own, with stdin from /dev/null and ``working_dir`` as
  the working directory.  The environment is the server's plus the job's variables.
* stdout and stderr go to ``stdout_path`` and ``stderr_path`` (opened for appending, created
  0644 if missing, before the submission returns, so a bad path fails the submission), or to
  /dev/null: never to the server's own pipes, which belong to the protocol.
* RUNNING once every process has started; FINISHED when all exited 0; FAILED otherwise
  (the message names the first failure: ``exit status 3``, ``killed by signal SIGSEGV``),
  or when ``wall_time`` ran out; KILLED when it was cancelled.
* Cancelling sends SIGTERM to each process group, and SIGKILL ``kill_grace`` seconds later
  to whatever is left.  :meth:`LocalJobs.aclose` cancels every job and waits for them.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import stat
from contextlib import asynccontextmanager
from subprocess import DEVNULL
from collections import deque
from typing import AsyncIterator, Deque, Dict, List, Optional

import trio

from ...service.jobs import ErrorKind, JobError, JobSpec, JobState, SubmitError
from .server import JobUpdate

__all__ = ["LocalJobs", "MAX_PROCS", "QUEUE", "SCHEDULER"]

log = logging.getLogger("proxy_agent.invoke.local")

SCHEDULER = "local"
QUEUE = "default"
#: Most processes one job may start.
MAX_PROCS = 256
_QUEUE_NAMES = frozenset({QUEUE, f"{SCHEDULER}:{QUEUE}"})


class _LocalJob:
    __slots__ = (
        "key",
        "spec",
        "history",
        "changed",
        "procs",
        "out_fds",
        "cancelled",
        "timed_out",
        "final",
        "ended",
        "waiting",
        "has_slot",
        "slot_given",
    )

    def __init__(self, key: int, spec: JobSpec) -> None:
        self.key = key
        self.spec = spec
        self.history: List[JobUpdate] = []
        self.changed = trio.Event()
        self.procs: List[trio.Process] = []
        self.out_fds: List[int] = []
        self.cancelled = False
        self.timed_out = False
        self.final = False
        self.ended = trio.Event()
        #: while the job waits for a slot: cancelling this ends the wait
        self.waiting = trio.CancelScope()
        self.has_slot = False
        self.slot_given = trio.Event()

    def push(self, state: JobState, message: Optional[str] = None) -> None:
        if self.final:
            return
        self.history.append(JobUpdate(state, message))
        if state.final:
            self.final = True
            self.ended.set()
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def signal(self, signum: int) -> None:
        for proc in self.procs:
            # A process not yet reaped keeps its pid, so its group id is still ours.
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass


class _Updates:
    """A job's updates from the first on, until the final one."""

    def __init__(self, job: _LocalJob) -> None:
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


class LocalJobs:
    """Jobs as local processes, for the Invoke Server (see the module's description)."""

    def __init__(self, nursery: trio.Nursery, *, slots: Optional[int] = None, kill_grace: float = 1.0) -> None:
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self._nursery = nursery
        #: free slots (None: no limit), and the jobs waiting for one in submission order
        self._free_slots = slots
        self._queue: Deque[_LocalJob] = deque()
        self._kill_grace = kill_grace
        self._jobs: Dict[int, _LocalJob] = {}
        self._keys = itertools.count(1)
        self._closing = False

    @classmethod
    @asynccontextmanager
    async def open(cls, *, slots: Optional[int] = None, kill_grace: float = 1.0) -> AsyncIterator["LocalJobs"]:
        """A LocalJobs for the duration of the block; every job is ended when it is left."""
        async with trio.open_nursery() as nursery:
            jobs = cls(nursery, slots=slots, kill_grace=kill_grace)
            try:
                yield jobs
            finally:
                with trio.CancelScope(shield=True):
                    await jobs.aclose()
                nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ the gateway

    async def submit(self, spec: JobSpec) -> int:
        if self._closing:
            raise SubmitError("the server is shutting down", ErrorKind.SHUTTING_DOWN)
        self._check(spec)
        fds = self._open_outputs(spec)
        key = next(self._keys)
        job = _LocalJob(key, spec)
        job.out_fds = fds
        self._jobs[key] = job
        job.push(JobState.ACCEPTED, "queued")
        # Slots are handed out here, not in the job's task: tasks start in no set order, jobs
        # must start in the order they were submitted.
        if self._free_slots is None:
            job.has_slot = True
        elif self._free_slots > 0:
            self._free_slots -= 1
            job.has_slot = True
        else:
            self._queue.append(job)
            job.push(JobState.QUEUING, "waiting for a free slot")
        self._nursery.start_soon(self._run, job)
        return key

    async def cancel(self, job: int) -> None:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        if record.final or record.cancelled:
            return
        record.cancelled = True
        record.waiting.cancel()
        record.signal(signal.SIGTERM)
        self._nursery.start_soon(self._kill_later, record)

    def watch(self, job: int) -> _Updates:
        record = self._jobs.get(job)
        if record is None:
            raise JobError(f"no job with key {job}", ErrorKind.NO_SUCH_JOB)
        return _Updates(record)

    async def aclose(self) -> None:
        """Cancel every job and wait (a few seconds at most) for all to end."""
        self._closing = True
        live = [job for job in self._jobs.values() if not job.final]
        for job in live:
            await self.cancel(job.key)
        with trio.move_on_after(self._kill_grace + 2.0):
            for job in live:
                await job.ended.wait()

    # ------------------------------------------------------------------ checks

    def _check(self, spec: JobSpec) -> None:
        scheduler = spec.extra_value("scheduler")
        if scheduler not in (None, SCHEDULER):
            raise SubmitError(
                f"scheduler {scheduler!r} is not available: this server runs jobs as processes on "
                f"this host (scheduler {SCHEDULER!r})",
                ErrorKind.NO_SUCH_QUEUE,
            )
        queues = [spec.queue] if spec.queue else list(spec.candidates)
        if queues and not any(q in _QUEUE_NAMES for q in queues):
            raise SubmitError(
                f"no queue {', '.join(queues)} here; the only queue is {SCHEDULER}:{QUEUE}",
                ErrorKind.NO_SUCH_QUEUE,
            )
        if not 1 <= spec.num_procs <= MAX_PROCS:
            raise SubmitError(f"a job here runs 1 to {MAX_PROCS} processes, not {spec.num_procs}", ErrorKind.BAD_REQUEST)
        if spec.nodes is not None and spec.nodes > 1:
            raise SubmitError(f"this host is one node; the job asks for {spec.nodes}", ErrorKind.BAD_REQUEST)
        program = spec.executable
        try:
            info = os.stat(program)
        except OSError as exc:
            raise SubmitError(f"program {program}: {exc.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            raise SubmitError(f"program {program} is not a regular file")
        if not os.access(program, os.X_OK):
            raise SubmitError(f"program {program} is not executable")
        if spec.working_dir is not None and not os.path.isdir(spec.working_dir):
            raise SubmitError(f"working directory {spec.working_dir} does not exist")

    def _open_outputs(self, spec: JobSpec) -> List[int]:
        """Descriptors for the job's stdout and stderr (/dev/null where there is no file)."""
        fds: List[int] = []
        opened: Dict[str, int] = {}
        try:
            for path in (spec.stdout_path, spec.stderr_path):
                if path is None:
                    fds.append(DEVNULL)
                elif path in opened:
                    fds.append(opened[path])
                else:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                    opened[path] = fd
                    fds.append(fd)
        except OSError as exc:
            for fd in opened.values():
                os.close(fd)
            raise SubmitError(f"cannot open output file {exc.filename}: {exc.strerror}") from None
        return fds

    # ------------------------------------------------------------------ running

    async def _run(self, job: _LocalJob) -> None:
        try:
            if not job.has_slot:
                with job.waiting:
                    await job.slot_given.wait()
            if job.cancelled:
                job.push(JobState.KILLED, "cancelled before it started")
                return
            await self._execute(job)
        finally:
            self._release_slot(job)
            for fd in set(job.out_fds):
                if fd != DEVNULL:
                    os.close(fd)
            job.out_fds = []
            if not job.final:
                # Cancelled from outside (the gateway is closing): nothing may outlive it.
                job.signal(signal.SIGKILL)
                job.push(JobState.KILLED, "the server ended")

    def _release_slot(self, job: _LocalJob) -> None:
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

    async def _execute(self, job: _LocalJob) -> None:
        spec = job.spec
        env = dict(os.environ)
        env.update(spec.env)
        argv = [spec.executable, *spec.arguments]
        stdout, stderr = job.out_fds
        for _ in range(spec.num_procs):
            try:
                proc = await trio.lowlevel.open_process(
                    argv,
                    stdin=DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=spec.working_dir,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                job.signal(signal.SIGKILL)
                await self._reap(job)
                job.push(JobState.FAILED, f"cannot start {spec.executable}: {exc.strerror or exc}")
                return
            job.procs.append(proc)
            if job.cancelled:
                job.signal(signal.SIGTERM)
        job.push(JobState.RUNNING, "started")
        deadline = math.inf if not spec.wall_time else trio.current_time() + spec.wall_time
        with trio.CancelScope(deadline=deadline) as limit:
            await self._reap(job)
        if limit.cancelled_caught:
            job.timed_out = True
            job.signal(signal.SIGTERM)
            self._nursery.start_soon(self._kill_later, job)
            await self._reap(job)
        job.push(*self._outcome(job))

    @staticmethod
    async def _reap(job: _LocalJob) -> None:
        async with trio.open_nursery() as nursery:
            for proc in job.procs:
                nursery.start_soon(proc.wait)

    def _outcome(self, job: _LocalJob):
        if job.cancelled:
            return JobState.KILLED, "cancelled"
        if job.timed_out:
            return JobState.FAILED, f"exceeded its wall time of {job.spec.wall_time} s"
        count = len(job.procs)
        for index, proc in enumerate(job.procs):
            code = proc.returncode
            if code:
                which = f"process {index + 1} of {count}: " if count > 1 else ""
                if code < 0:
                    try:
                        name = signal.Signals(-code).name
                    except ValueError:
                        name = f"signal {-code}"
                    return JobState.FAILED, f"{which}killed by signal {name}"
                return JobState.FAILED, f"{which}exit status {code}"
        return JobState.FINISHED, "exit status 0"

    async def _kill_later(self, job: _LocalJob) -> None:
        with trio.move_on_after(self._kill_grace):
            await job.ended.wait()
            return
        job.signal(signal.SIGKILL)
