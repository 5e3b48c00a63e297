"""The local scheduler: jobs are processes on this host, started directly.

The model is one machine and one node (this host) and one queue,
``default``.  A submitted job runs its program ``jobNumProcs`` times, each
process with ``PROXY_AGENT_PROCESS_INDEX`` (its rank, 0..N-1), ``PROXY_AGENT_NUM_PROCS``
and ``PROXY_AGENT_JOB_KEY`` (the job's service key) in its environment.

How a job runs:

* The program is executed directly from an argv list, never through a shell,
  with stdin from ``/dev/null`` and stdout/stderr on pipes.
* All processes of a job share one process group, led by process 0, so one
  ``killpg`` reaches the whole job including anything its processes started
  (unless that left the group on purpose, like a daemon calling setsid).
* Process 0 is reaped only when the whole job has ended.  While it is an
  unreaped zombie its pid cannot be reused, so the group id stays ours and
  every signal the scheduler sends to the group is safe.
* Output is read line by line (UTF-8, undecodable bytes replaced, ``\\r\\n``
  accepted, lines over 64 KiB split, a last line without newline flushed at
  EOF) and handed to :meth:`ServiceModel.output`.  A process is reported ended
  only after its pipes have reached EOF, so its output always precedes its
  end.  If something it started keeps the pipes open, the exit is
  reported after a short grace anyway.
* Like a batch system, when every process of a job has ended, whatever they
  left running in the job's process group is killed.
* States: the backend's own words (``nativeState``) and what they mean in the
  service's vocabulary are in :data:`STATE_TABLE`: a job is PENDING (QUEUING)
  until its processes are started, RUNNING, STOPPED (SUSPENDED) while
  suspended, and ends EXITED (FINISHED: every process exited 0), FAILED (a
  process exited non-zero or was killed by a signal), NOT_STARTED (FAILED:
  the program could not be executed) or TERMINATED (KILLED: ended on request).

Terminate sends SIGTERM to the group and SIGKILL after ``kill_grace``
seconds.  Suspend stops the group (SIGSTOP) and resume continues it (SIGCONT).
:meth:`LocalBackend.aclose` (and cancellation of :meth:`run`) terminate
every job and reap every process within about 1.5 seconds.

:meth:`LocalBackend.submit` only checks the submission and adds the job
and its processes to the model (PENDING); the job's task then starts the
processes and reports them RUNNING.  A program that passes the checks but
cannot be executed (say, a file in no executable format) makes the job
FAILED with a ``message`` saying why.

Cost per job: one task, which starts the processes (fork/exec on trio's
worker threads, at most four jobs at a time, in submission order) and
watches them, plus one task per process and per pipe.  No sleeping, no
polling on the normal path.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import stat
import sys
from functools import partial
from subprocess import DEVNULL, PIPE
from typing import Dict, List, Optional

import attrs
import trio

from ..service.attributes import AttrInfo, ValueType
from ..service.jobs import ErrorKind, JobError, JobSpec, JobState, StateTable, SubmitError
from ..service.model import K, Kind, ServiceModel, UnknownElement
from .base import Backend, BackendContext
from .common import LineSplitter, MAX_LINE_BYTES, current_user, signal_name, state_attrs
from .reaper import MARKER, OrphanReaper

__all__ = ["LineSplitter", "LocalBackend", "LocalOptions", "MAX_PROCS", "MAX_LINE_BYTES", "QUEUE_NAME", "STATE_TABLE"]

log = logging.getLogger(__name__)

#: Most processes a local job may ask for.
MAX_PROCS = 1024
#: Name of the single queue.
QUEUE_NAME = "default"

#: The local backend's own state words, and what they mean.
STATE_TABLE = StateTable(
    "local",
    {
        "PENDING": JobState.QUEUING,
        "RUNNING": JobState.RUNNING,
        "STOPPED": JobState.SUSPENDED,
        "EXITED": JobState.FINISHED,
        "FAILED": JobState.FAILED,
        "NOT_STARTED": JobState.FAILED,
        "TERMINATED": JobState.KILLED,
    },
)
_PENDING = state_attrs(STATE_TABLE, "PENDING")
_RUNNING = state_attrs(STATE_TABLE, "RUNNING")
_STOPPED = state_attrs(STATE_TABLE, "STOPPED")
_ENDED = frozenset(native for native, state in STATE_TABLE if state.final)


@attrs.frozen
class LocalOptions:
    #: seconds between SIGTERM and SIGKILL when a job is terminated
    kill_grace: float = 2.0

_READ_SIZE = 64 * 1024
#: How long after a process exits its pipes may stay open before the exit is reported anyway.
_EOF_GRACE = 0.5
#: Shutdown: SIGTERM first, SIGKILL after at most this long...
_SHUTDOWN_TERM_GRACE = 0.8
#: ...and give up waiting for processes after this long in all.
_SHUTDOWN_BOUND = 1.5
_POLL_INTERVAL = 0.01
#: How long a suspension may take to reach every process before it is reported anyway.
_STOP_WAIT = 1.0
#: Seconds between two looks for processes that escaped their jobs.
_ORPHAN_SWEEP = 1.0
#: Processes being forked at the same time (each fork/exec takes one of trio's worker threads).
_SPAWN_CONCURRENCY = 4


class _Job:
    """Book-keeping for one live local job (dropped once it has completed)."""

    __slots__ = (
        "id",
        "process_ids",
        "procs",
        "pgid",
        "pidfd",
        "leader_reaped",
        "canceled",
        "suspended",
        "returncodes",
        "reported",
        "exited",
        "all_exited",
        "done",
        "scope",
        "task_done",
        "started",
        "start_error",
    )

    def __init__(self, job_id: int, process_ids: range) -> None:
        self.id = job_id
        self.process_ids = process_ids
        self.procs: List[trio.Process] = []
        #: process group id (the pid of process 0) once that process exists
        self.pgid: Optional[int] = None
        #: pidfd of process 0, to wait for its exit without reaping it
        self.pidfd: Optional[int] = None
        self.leader_reaped = False
        self.canceled = False
        self.suspended = False
        self.returncodes: List[Optional[int]] = [None] * len(process_ids)
        self.reported = [False] * len(process_ids)
        self.exited = 0
        self.all_exited = trio.Event()
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        #: set when the job's task has ended
        self.task_done = trio.Event()
        #: every process that could be started has been
        self.started = False
        #: why the processes could not all be started (the job then fails)
        self.start_error: Optional[str] = None


class _Launch:
    """A validated submission: what to run, where, with what."""

    __slots__ = ("path", "argv", "cwd", "env", "num_procs", "name")

    def __init__(self, path, argv, cwd, env, num_procs, name) -> None:
        self.path = path
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.num_procs = num_procs
        self.name = name


class LocalBackend(Backend):
    """Runs jobs as processes of this host."""

    name = "local"
    summary = "programs run directly on this machine as local processes"
    #: the queue's slots are this host's CPUs; the service counts its waiting and running jobs
    queue_load = "queue"

    def __init__(self, model: ServiceModel, options: Optional[LocalOptions] = None,
                 context: Optional[BackendContext] = None) -> None:
        super().__init__(model, options, context)
        self.hostname = socket.gethostname() or "localhost"
        self.cpus = _cpu_count()
        self.user = current_user()
        self.machine_id: Optional[int] = None
        self.node_id: Optional[int] = None
        self.queue_id: Optional[int] = None
        self._jobs: Dict[int, _Job] = {}
        self._nursery: Optional[trio.Nursery] = None
        self._closing = False
        self._shutdown_done: Optional[trio.Event] = None
        self._spawn_limiter = trio.CapacityLimiter(_SPAWN_CONCURRENCY)
        #: the agent adopts processes that escaped their job's group and ends them with it
        self._reaper = OrphanReaper()
        try:
            self._default_cwd = os.getcwd()
        except OSError:
            self._default_cwd = "/"
        try:
            self._arg_max = max(4096, os.sysconf("SC_ARG_MAX"))
        except (ValueError, OSError, AttributeError):
            self._arg_max = 128 * 1024

    # ------------------------------------------------------------------ options

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("local scheduler")
        group.add_argument(
            "--local-kill-grace", type=float, default=2.0, metavar="SECONDS",
            help="seconds between SIGTERM and SIGKILL when a local job is terminated (default: %(default)s)",
        )

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> LocalOptions:
        grace = getattr(args, "local_kill_grace", 2.0)
        if not grace >= 0 or grace > 3600:
            raise ValueError(f"--local-kill-grace must be between 0 and 3600 seconds, got {grace:g}")
        return LocalOptions(kill_grace=grace)

    @classmethod
    def default_options(cls) -> LocalOptions:
        return LocalOptions()

    # ------------------------------------------------------------------ interface

    def attributes(self) -> List[AttrInfo]:
        return [
            AttrInfo(K.NUM_PROCS, ValueType.INTEGER, "Processes", "How many copies of the program to start",
                     default="1", minimum="1", maximum=str(MAX_PROCS), settable=True),
            AttrInfo(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
        ]

    def default_queue(self) -> Optional[int]:
        return self.queue_id

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        if self.machine_id is None:
            self._populate()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._watch_orphans()
        finally:
            self._nursery = None
            self._closing = True
            await self._shutdown()

    async def submit(self, spec: JobSpec, queue: int) -> int:
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorKind.SHUTTING_DOWN)
        if self._nursery is None or self.queue_id is None:
            raise SubmitError("the local scheduler is not running", ErrorKind.UNAVAILABLE)
        if queue != self.queue_id:
            raise SubmitError(f"the local scheduler has one queue, {QUEUE_NAME}", ErrorKind.NO_SUCH_QUEUE)
        launch = self._prepare(spec)
        model = self.model
        with model.batch():
            job_id = model.add(
                Kind.JOB,
                self.queue_id,
                {
                    K.CLIENT_REF: spec.client_ref,
                    K.NAME: launch.name,
                    **_PENDING,
                    K.QUEUE: self.queue_id,
                    K.NUM_PROCS: str(launch.num_procs),
                    K.EXECUTABLE: launch.path,
                    K.WORKING_DIR: launch.cwd,
                    K.ARGUMENTS: tuple(launch.argv[1:]),
                    K.USER: self.user,
                },
                owner=self.name,
            )
            process_ids = model.add_many(
                Kind.PROCESS,
                job_id,
                [{**_PENDING, K.NODE: self.node_id} for _ in range(launch.num_procs)],
                owner=self.name,
            )
        record = _Job(job_id, process_ids)
        self._jobs[job_id] = record
        self._nursery.start_soon(self._run_job, record, launch)
        return job_id

    async def terminate(self, job: int) -> None:
        record = self._live(job)
        if record.canceled:
            return  # already on its way out
        record.canceled = True
        if record.started:
            self._terminate(record)
        # else its task is still starting the processes and terminates them when done

    async def suspend(self, job: int, suspended: bool) -> None:
        record = self._live(job)
        if record.canceled:
            raise JobError("the job is being terminated", ErrorKind.OPERATION_FAILED)
        if not record.started or record.pgid is None:
            raise JobError("the job is still starting", ErrorKind.OPERATION_FAILED)
        if suspended == record.suspended:
            return
        record.suspended = suspended
        if suspended:
            self._signal(record, signal.SIGSTOP)
            await self._wait_stopped(record)  # SIGSTOP takes effect asynchronously
            if record.done.is_set() or record.suspended is not suspended:
                return
        else:
            self._signal(record, signal.SIGCONT)  # takes effect at once
        attrs_ = _STOPPED if suspended else _RUNNING
        with self.model.batch():
            self.model.update(record.id, attrs_)
            live = [pid for index, pid in enumerate(record.process_ids) if not record.reported[index]]
            self.model.update_many(live, attrs_)

    async def _wait_stopped(self, record: _Job) -> None:
        """Until every process of the job has stopped or exited (at most a second)."""
        with trio.move_on_after(_STOP_WAIT):
            for index, proc in enumerate(record.procs):
                while not record.reported[index] and not _stopped_or_exited(proc.pid):
                    await trio.sleep(_POLL_INTERVAL / 10)

    async def move(self, job: int, queue: int) -> None:
        raise JobError(
            f"the local scheduler has a single queue ({QUEUE_NAME}); jobs cannot be moved",
            ErrorKind.NOT_SUPPORTED,
        )

    async def aclose(self) -> None:
        self._closing = True
        await self._shutdown()

    # ------------------------------------------------------------------ model

    def _populate(self) -> None:
        model = self.model
        with model.batch():
            self.machine_id = model.add(
                Kind.MACHINE, None,
                {K.NAME: self.hostname, K.STATE: "UP", K.NUM_NODES: "1", K.BACKEND: self.name},
                owner=self.name,
            )
            self.node_id = model.add(
                Kind.NODE, self.machine_id,
                {K.NAME: self.hostname, K.STATE: "UP", K.NUMBER: "0", K.CPUS: str(self.cpus)},
                owner=self.name,
            )
            self.queue_id = model.add(
                Kind.QUEUE, None,
                {K.NAME: QUEUE_NAME, K.STATE: "NORMAL", K.BACKEND: self.name, K.DEFAULT: "true",
                 K.TOTAL_SLOTS: str(self.cpus)},
                owner=self.name,
            )

    def _live(self, job: int) -> _Job:
        record = self._jobs.get(job)
        if record is not None:
            return record
        try:
            native = self.model.attr(job, K.NATIVE_STATE)
        except UnknownElement:
            native = None
        if native in _ENDED:
            raise JobError("the job has already ended", ErrorKind.OPERATION_FAILED)
        raise JobError("the job is not a job of the local scheduler", ErrorKind.NO_SUCH_JOB)

    # ------------------------------------------------------------------ submission

    def _prepare(self, spec: JobSpec) -> _Launch:
        """Check a submission and work out the argv, directory and environment."""
        num_procs = spec.num_procs
        if num_procs < 1:
            raise SubmitError(f"the process count must be at least 1, got {num_procs}", ErrorKind.BAD_REQUEST)
        if num_procs > MAX_PROCS:
            raise SubmitError(
                f"the local scheduler starts at most {MAX_PROCS} processes per job, not {num_procs}",
                ErrorKind.BAD_REQUEST,
            )
        cwd = self._working_dir(spec.working_dir)
        env = dict(os.environ)
        for name, value in spec.environment:
            if "\0" in name or "\0" in value:
                raise SubmitError(f"environment variable {name!r} contains a NUL character", ErrorKind.BAD_REQUEST)
            if not name or "=" in name:
                raise SubmitError(f"{name!r} is not an environment variable name", ErrorKind.BAD_REQUEST)
            env[name] = value
        path = _find_executable(spec.executable, cwd, env.get("PATH", os.defpath))
        args = spec.arguments
        for arg in args:
            if "\0" in arg:
                raise SubmitError(f"program argument {arg!r} contains a NUL character", ErrorKind.BAD_REQUEST)
        # execve() takes argv and environment together up to ARG_MAX bytes: refuse now what
        # could never start (each string costs its bytes, a NUL and a pointer).
        size = sum(len(a.encode("utf-8", "surrogateescape")) + 9 for a in (path, *args))
        size += sum(len(k.encode("utf-8", "surrogateescape")) + len(v.encode("utf-8", "surrogateescape")) + 10
                    for k, v in env.items())
        if size > self._arg_max - 2048:
            raise SubmitError(
                f"the program's arguments and environment take {size} bytes; this system allows at most "
                f"{self._arg_max} bytes for both together",
                ErrorKind.BAD_REQUEST,
            )
        name = spec.name or os.path.basename(path)
        return _Launch(path, [path, *args], cwd, env, num_procs, name)

    def _working_dir(self, given: Optional[str]) -> str:
        if not given:
            return self._default_cwd
        if "\0" in given:
            raise SubmitError("working directory contains a NUL character", ErrorKind.BAD_REQUEST)
        path = os.path.join(self._default_cwd, given)  # absolute paths stay as they are
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise SubmitError(f"working directory {path!r} does not exist") from None
        except NotADirectoryError:
            raise SubmitError(f"working directory {path!r} does not exist (a part of it is not a directory)") from None
        except OSError as exc:
            raise SubmitError(f"working directory {path!r} cannot be used: {exc.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise SubmitError(f"working directory {path!r} is not a directory")
        if not os.access(path, os.X_OK):
            raise SubmitError(f"working directory {path!r} is not accessible (permission denied)")
        return path

    async def _run_job(self, record: _Job, launch: _Launch) -> None:
        """The job's task: start its processes, watch them, reap the leader, end the job."""
        try:
            with record.scope:
                await self._start(record, launch)
                if record.procs:
                    async with trio.open_nursery() as nursery:
                        for index in range(1, len(record.procs)):
                            nursery.start_soon(self._watch, record, index)
                        await self._watch(record, 0)
                    self._signal(record, signal.SIGKILL)  # whatever the job left behind in its group
                    await record.procs[0].wait()
                    record.leader_reaped = True
                    self._close_pidfd(record)
                self._finish_job(record)
        finally:
            _close_streams(record)
            self._close_pidfd(record)
            record.task_done.set()

    async def _start(self, record: _Job, launch: _Launch) -> None:
        """Start the processes (a few jobs at a time, in submission order)."""
        try:
            async with self._spawn_limiter:
                if not record.canceled:
                    await self._spawn(record, launch)
        except OSError as exc:
            record.start_error = f"cannot start {launch.path!r}: {exc.strerror or exc}"
            self._signal(record, signal.SIGKILL)  # those that did start
        record.started = True
        if record.start_error is None:
            model = self.model
            # PIDs first, then the state in a batch of its own: the state change is the same
            # for every process, so it travels as one group with one range of ids.
            with model.batch():
                for index, proc in enumerate(record.procs):
                    model.update(record.process_ids[index], {K.PID: str(proc.pid)})
            with model.batch():
                model.update_many(record.process_ids[: len(record.procs)], _RUNNING)
                model.update(record.id, _RUNNING)
        if record.canceled:  # terminated while its processes were being started
            self._terminate(record)

    async def _spawn(self, record: _Job, launch: _Launch) -> None:
        """Process 0 leads a new process group; the others join it."""
        for index in range(launch.num_procs):
            env = dict(launch.env)
            env["PROXY_AGENT_PROCESS_INDEX"] = str(index)
            env["PROXY_AGENT_NUM_PROCS"] = str(launch.num_procs)
            env["PROXY_AGENT_JOB_KEY"] = str(record.id)
            env[MARKER] = self._reaper.mark(record.id)
            proc = await trio.lowlevel.open_process(
                launch.argv,
                stdin=DEVNULL,
                stdout=PIPE,
                stderr=PIPE,
                cwd=launch.cwd,
                env=env,
                **_group_options(record.pgid or 0),
            )
            record.procs.append(proc)
            if index == 0:
                record.pgid = proc.pid
                record.pidfd = _pidfd_open(proc.pid)

    async def _watch(self, record: _Job, index: int) -> None:
        """One process: pump both pipes, wait for its exit, report it after EOF."""
        proc = record.procs[index]
        eid = record.process_ids[index]
        eof = trio.Event()
        open_pipes = [2]

        async def pump(stream, which: str) -> None:
            try:
                await self._pump(stream, eid, which)
            finally:
                open_pipes[0] -= 1
                if not open_pipes[0]:
                    eof.set()

        async with trio.open_nursery() as pipes:
            pipes.start_soon(pump, proc.stdout, "stdout")
            pipes.start_soon(pump, proc.stderr, "stderr")
            if index == 0:
                returncode = await self._wait_leader(record)
            else:
                returncode = await proc.wait()
            record.returncodes[index] = returncode
            record.exited += 1
            if record.exited == len(record.procs):
                record.all_exited.set()
            if not eof.is_set():
                with trio.move_on_after(_EOF_GRACE):
                    await eof.wait()
            self._report_process(record, index)
            if not eof.is_set():
                # Something the process started still holds its pipes.  Keep reading
                # until the job is over, then kill the group's leftovers.
                await record.all_exited.wait()
                self._signal(record, signal.SIGKILL)
                with trio.move_on_after(_EOF_GRACE):
                    await eof.wait()
                pipes.cancel_scope.cancel()

    async def _pump(self, stream: trio.abc.ReceiveStream, eid: int, which: str) -> None:
        """Read one pipe to EOF, handing its lines to the model.

        Before each read it waits for room (:meth:`ServiceModel.output_room`): while the
        clients have enough output waiting, the pipe fills and the process's writes wait.
        """
        model = self.model
        splitter = LineSplitter()
        try:
            while True:
                if not model.output_room_available():
                    await model.output_room()
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    break
                text = splitter.feed_text(data)
                if text is not None:
                    model.output(eid, which, text)
        finally:
            text = splitter.flush_text()
            if text is not None and eid in model:
                model.output(eid, which, text)
            stream.close()  # type: ignore[attr-defined]

    async def _wait_leader(self, record: _Job) -> int:
        """Wait for process 0 to exit without reaping it (its pid keeps the group id ours)."""
        if record.pidfd is not None:
            await trio.lowlevel.wait_readable(record.pidfd)
        while True:
            returncode = _peek_exit(record)
            if returncode is not None:
                return returncode
            await trio.sleep(_POLL_INTERVAL)  # only without pidfd (kernels before 5.3)

    def _report_process(self, record: _Job, index: int) -> None:
        if record.reported[index]:
            return
        record.reported[index] = True
        returncode = record.returncodes[index]
        if returncode is None:  # never started
            native = "TERMINATED" if record.canceled else "NOT_STARTED"
            self.model.update(record.process_ids[index], state_attrs(STATE_TABLE, native))
            return
        if record.canceled:
            native = "TERMINATED"
        else:
            native = "EXITED" if returncode == 0 else "FAILED"
        attrs_ = state_attrs(STATE_TABLE, native)
        if returncode >= 0:
            attrs_[K.EXIT_CODE] = str(returncode)
        else:
            attrs_[K.SIGNAL] = signal_name(-returncode)
        self.model.update(record.process_ids[index], attrs_)

    def _finish_job(self, record: _Job) -> None:
        with self.model.batch():
            self._complete_job(record)
        self._jobs.pop(record.id, None)
        record.done.set()
        self._sweep()

    # ------------------------------------------------------------------ orphans

    def _known_pids(self):
        return [proc.pid for record in self._jobs.values() for proc in record.procs]

    def _sweep(self) -> None:
        """End what ended jobs left behind outside their process groups."""
        if self._reaper.adopted or self._reaper.enabled:
            self._reaper.sweep(self._known_pids(), lambda job: job.isdigit() and int(job) in self._jobs)

    async def _watch_orphans(self) -> None:
        while True:
            await trio.sleep(_ORPHAN_SWEEP)
            self._sweep()

    def _complete_job(self, record: _Job) -> None:
        for index in range(len(record.process_ids)):
            self._report_process(record, index)
        if record.canceled:
            attrs_ = state_attrs(STATE_TABLE, "TERMINATED")
        elif record.start_error is not None:
            attrs_ = state_attrs(STATE_TABLE, "NOT_STARTED")
            attrs_[K.MESSAGE] = record.start_error
        else:
            failed = [(i, rc) for i, rc in enumerate(record.returncodes) if rc != 0]
            if failed:
                index, returncode = failed[0]
                attrs_ = state_attrs(STATE_TABLE, "FAILED")
                if returncode is None:
                    why = f"process {index} was not started"
                elif returncode > 0:
                    why = f"process {index} exited with code {returncode}"
                else:
                    why = f"process {index} was killed by {signal_name(-returncode)}"
                if len(failed) > 1:
                    why += f" ({len(failed)} processes failed)"
                attrs_[K.MESSAGE] = why
            else:
                attrs_ = state_attrs(STATE_TABLE, "EXITED")
                codes = {rc for rc in record.returncodes}
                if codes == {0}:
                    attrs_[K.EXIT_CODE] = "0"
        self.model.update(record.id, attrs_)

    # ------------------------------------------------------------------ signals

    def _signal(self, record: _Job, sig: int) -> None:
        """Signal the job's process group, if it is still ours to signal."""
        if record.pgid is None or record.leader_reaped:
            return
        try:
            os.killpg(record.pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # e.g. a setuid program in the group
            log.warning("cannot signal process group %d of job %d: %s", record.pgid, record.id, exc)

    def _terminate(self, record: _Job) -> None:
        self._signal(record, signal.SIGTERM)
        self._signal(record, signal.SIGCONT)  # a suspended job must wake up to see SIGTERM
        if self._nursery is not None:
            self._nursery.start_soon(self._kill_after_grace, record)

    async def _kill_after_grace(self, record: _Job) -> None:
        with trio.move_on_after(self.options.kill_grace):
            await record.done.wait()
        if not record.done.is_set():
            self._signal(record, signal.SIGKILL)

    def _close_pidfd(self, record: _Job) -> None:
        if record.pidfd is not None:
            trio.lowlevel.notify_closing(record.pidfd)
            os.close(record.pidfd)
            record.pidfd = None

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        """Terminate every job and reap every process, bounded in time (idempotent)."""
        with trio.CancelScope(shield=True):
            if self._shutdown_done is not None:
                with trio.move_on_after(_SHUTDOWN_BOUND):
                    await self._shutdown_done.wait()
                return
            self._shutdown_done = trio.Event()
            try:
                await self._kill_all()
                # and whatever the jobs left behind outside their groups
                self._reaper.end_all(self._known_pids(), bound=0.5)
            finally:
                self._shutdown_done.set()

    async def _kill_all(self) -> None:
        records = list(self._jobs.values())
        if not records:
            return
        # Stop the job tasks first: from here on this loop alone reaps and reports.
        for record in records:
            record.scope.cancel()
        with trio.move_on_after(0.1):
            for record in records:
                await record.task_done.wait()
        now = trio.current_time()
        term_deadline = now + min(self.options.kill_grace, _SHUTDOWN_TERM_GRACE)
        deadline = now + _SHUTDOWN_BOUND
        pending = [r for r in records if not r.done.is_set()]
        for record in pending:
            record.canceled = True
            self._signal(record, signal.SIGTERM)
            self._signal(record, signal.SIGCONT)
        killed = False
        while True:
            pending = [r for r in pending if not self._reap_now(r)]
            if not pending:
                return
            now = trio.current_time()
            if now >= deadline:
                break
            if not killed and now >= term_deadline:
                for record in pending:
                    self._signal(record, signal.SIGKILL)
                killed = True
            await trio.sleep(_POLL_INTERVAL)
        for record in pending:
            log.warning("job %d: processes did not exit after SIGKILL; giving up on them", record.id)

    def _reap_now(self, record: _Job) -> bool:
        """Reap whatever of the job has exited; complete it if all has.  Never blocks."""
        complete = True
        for index, proc in enumerate(record.procs):
            if index == 0 or record.returncodes[index] is not None:
                continue
            returncode = proc.poll()
            if returncode is None:
                complete = False
            else:
                record.returncodes[index] = returncode
        if record.procs and record.returncodes[0] is None:
            record.returncodes[0] = _peek_exit(record)
            if record.returncodes[0] is None:
                complete = False
        if not complete:
            return False
        if record.procs:
            self._signal(record, signal.SIGKILL)  # leftovers, while the group id is still ours
            record.procs[0].poll()
        record.leader_reaped = True
        _close_streams(record)
        self._close_pidfd(record)
        self._finish_job(record)
        return True


# --------------------------------------------------------------------------- helpers


def _close_streams(record: _Job) -> None:
    for proc in record.procs:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()  # type: ignore[attr-defined]


def _peek_exit(record: _Job) -> Optional[int]:
    """Process 0's return code if it has exited, leaving it unreaped; None if running."""
    assert record.pgid is not None
    try:
        info = os.waitid(os.P_PID, record.pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped
        return record.procs[0].poll()
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _stopped_or_exited(pid: int) -> bool:
    """Has this child stopped (or exited)?  Leaves its status to be waited for."""
    try:
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return True
    return info is not None


def _pidfd_open(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def _group_options(pgid: int) -> dict:
    """Popen options putting the child in process group ``pgid`` (0: a new group it leads)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": partial(os.setpgid, 0, pgid)}  # pragma: no cover


def _find_executable(executable: str, cwd: str, search_path: str) -> str:
    """The program to run; SubmitError naming the problem.

    A name without '/' is looked up on PATH (the job's PATH if its environment sets one);
    a path is relative to the job's working directory.
    """
    if not executable:
        raise SubmitError("no executable given", ErrorKind.BAD_REQUEST)
    if "\0" in executable:
        raise SubmitError("the executable's name contains a NUL character", ErrorKind.BAD_REQUEST)
    if "/" in executable:
        candidate = os.path.join(cwd, executable)
    else:
        candidate = _search_path(executable, search_path, cwd)
    _check_executable(candidate)
    return candidate


def _search_path(name: str, search_path: str, cwd: str) -> str:
    not_executable = None
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(cwd, directory or ".", name)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            not_executable = not_executable or candidate
    if not_executable is not None:
        raise SubmitError(
            f"executable {not_executable!r} is not executable (permission denied)"
        )
    raise SubmitError(f"executable {name!r} not found on PATH")


def _check_executable(path: str) -> None:
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SubmitError(f"executable {path!r} not found") from None
    except OSError as exc:
        raise SubmitError(f"executable {path!r} cannot be used: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise SubmitError(f"executable {path!r} is a directory, not a program")
    if not stat.S_ISREG(info.st_mode):
        raise SubmitError(f"executable {path!r} is not a regular file")
    if not os.access(path, os.X_OK):
        raise SubmitError(f"executable {path!r} is not executable (permission denied)")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
