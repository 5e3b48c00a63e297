"""The local scheduler: jobs are processes on this host, started directly.

The model is one machine and one node (this host) and one queue,
``default``.  A submitted job runs its program ``jobNumProcs`` times, each
process with ``PROXY_AGENT_PROCESS_INDEX`` (0..N-1), ``PROXY_AGENT_NUM_PROCS``
and ``PROXY_AGENT_JOB_ID`` in its environment.

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
  EOF) and handed to :meth:`Model.output`.  A process is reported COMPLETED
  only after its pipes have reached EOF, so its output always precedes its
  completion.  If something it started keeps the pipes open, the exit is
  reported after a short grace anyway.
* Like a batch system, when every process of a job has ended, whatever they
  left running in the job's process group is killed.
* A job is FINISHED when every process exited 0, FAILED otherwise, CANCELED
  when it was terminated on request.

Terminate sends SIGTERM to the group and SIGKILL after ``kill_grace``
seconds.  CHANGE_JOB suspends (SIGSTOP) and resumes (SIGCONT) the group.
:meth:`LocalScheduler.aclose` (and cancellation of :meth:`run`) terminate
every job and reap every process within about 1.5 seconds.

:meth:`LocalScheduler.submit` only checks the submission and adds the job
and its processes to the model (STARTING); the job's task then starts the
processes and reports them RUNNING.  A program that passes the checks but
cannot be executed (say, a file in no executable format) makes the job
FAILED with a ``jobStatusMessage`` saying why.

Cost per job: one task, which starts the processes (fork/exec on trio's
worker threads, at most four jobs at a time, in submission order) and
watches them, plus one task per process and per pipe.  No sleeping, no
polling on the normal path.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import sys
from functools import partial
from subprocess import DEVNULL, PIPE
from typing import Dict, List, Optional

import trio

from ..model import Model, UnknownElement
from ..protocol.attributes import A, AttributeDefinition, AttributeSet
from ..protocol.messages import ElementKind, ErrorCode
from .base import JobError, Scheduler, SchedulerOptions, SubmitError
from .common import (
    CPUS,
    JOB_NAME,
    MAX_LINE_BYTES,
    LineSplitter,
    MachineState,
    NodeState,
    QueueState,
    State,
    Status,
    current_user,
    parse_env,
    parse_job_changes,
    parse_num_procs,
    require_sub_id,
    scheduler_attribute_definitions,
    signal_name,
    status_for_exit,
)

__all__ = ["LineSplitter", "LocalScheduler", "MAX_PROCS", "MAX_LINE_BYTES", "QUEUE_NAME"]

log = logging.getLogger(__name__)

#: Largest ``jobNumProcs`` a local job may ask for.
MAX_PROCS = 1024
#: Output lines longer than this (in bytes) are split.
#: Name of the single queue.
QUEUE_NAME = "default"

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

    __slots__ = ("sub_id", "path", "argv", "cwd", "env", "num_procs", "name")

    def __init__(self, sub_id, path, argv, cwd, env, num_procs, name) -> None:
        self.sub_id = sub_id
        self.path = path
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.num_procs = num_procs
        self.name = name


class LocalScheduler(Scheduler):
    """Runs jobs as processes of this host."""

    name = "local"

    def __init__(self, model: Model, options: SchedulerOptions) -> None:
        super().__init__(model, options)
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
        try:
            self._default_cwd = os.getcwd()
        except OSError:
            self._default_cwd = "/"

    # ------------------------------------------------------------------ interface

    def attribute_definitions(self) -> List[AttributeDefinition]:
        default_queue = None if self.queue_id is None else str(self.queue_id)
        return scheduler_attribute_definitions(max_procs=MAX_PROCS, default_queue=default_queue)

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        if self.machine_id is None:
            self._populate()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._closing = True
            await self._shutdown()

    async def submit(self, job: AttributeSet) -> int:
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorCode.SHUTTING_DOWN)
        if self._nursery is None or self.queue_id is None:
            raise SubmitError("the local scheduler is not running", ErrorCode.SCHEDULER)
        launch = self._prepare(job)
        model = self.model
        exec_dir, exec_name = os.path.split(launch.path)
        job_id = model.add(
            ElementKind.JOB,
            self.queue_id,
            {
                A.JOB_SUB_ID: launch.sub_id,
                A.NAME: launch.name,
                A.JOB_STATE: State.STARTING,
                A.JOB_STATUS: Status.SUBMITTED,
                A.QUEUE_ID: str(self.queue_id),
                A.JOB_NUM_PROCS: str(launch.num_procs),
                A.EXEC_NAME: exec_name,
                A.EXEC_PATH: exec_dir,
                A.WORKING_DIR: launch.cwd,
                A.PROG_ARGS: tuple(launch.argv[1:]),
                A.USER_ID: self.user,
            },
        )
        node = str(self.node_id)
        process_ids = model.add_many(
            ElementKind.PROCESS,
            job_id,
            [
                {A.PROCESS_STATE: State.STARTING, A.PROCESS_INDEX: str(index), A.PROCESS_NODE_ID: node}
                for index in range(launch.num_procs)
            ],
        )
        record = _Job(job_id, process_ids)
        self._jobs[job_id] = record
        self._nursery.start_soon(self._run_job, record, launch)
        return job_id

    async def terminate(self, job_id: int) -> None:
        record = self._live(job_id)
        if record.canceled:
            return  # already on its way out
        record.canceled = True
        if record.started:
            self._terminate(record)
        # else its task is still starting the processes and terminates them when done

    async def change(self, job_id: int, changes: AttributeSet) -> None:
        request = parse_job_changes(changes)
        record = self._live(job_id)
        if record.canceled:
            raise JobError(f"job {job_id} is being terminated", ErrorCode.OPERATION_FAILED)
        if not record.started or record.pgid is None:
            raise JobError(f"job {job_id} is still starting", ErrorCode.OPERATION_FAILED)
        suspend = bool(request.suspend)
        if suspend == record.suspended:
            return
        record.suspended = suspend
        if suspend:
            self._signal(record, signal.SIGSTOP)
            await self._wait_stopped(record)  # SIGSTOP takes effect asynchronously
            if record.done.is_set() or record.suspended is not suspend:
                return
        else:
            self._signal(record, signal.SIGCONT)  # takes effect at once
        state = State.SUSPENDED if suspend else State.RUNNING
        status = Status.SUSPENDED if suspend else Status.RUNNING
        self.model.update(record.id, {A.JOB_STATE: state, A.JOB_STATUS: status})
        live = [pid for index, pid in enumerate(record.process_ids) if not record.reported[index]]
        self.model.update_many(live, {A.PROCESS_STATE: state, A.PROCESS_STATUS: status})

    async def _wait_stopped(self, record: _Job) -> None:
        """Until every process of the job has stopped or exited (at most a second)."""
        with trio.move_on_after(_STOP_WAIT):
            for index, proc in enumerate(record.procs):
                while not record.reported[index] and not _stopped_or_exited(proc.pid):
                    await trio.sleep(_POLL_INTERVAL / 10)

    async def move(self, job_id: int, queue_id: int) -> None:
        raise JobError(
            f"the local scheduler has a single queue ({QUEUE_NAME}); jobs cannot be moved",
            ErrorCode.NOT_SUPPORTED,
        )

    async def aclose(self) -> None:
        self._closing = True
        await self._shutdown()

    # ------------------------------------------------------------------ model

    def _populate(self) -> None:
        model = self.model
        self.machine_id = model.add(
            ElementKind.MACHINE,
            None,
            {A.NAME: self.hostname, A.MACHINE_STATE: MachineState.UP, A.NUM_NODES: "1"},
        )
        self.node_id = model.add(
            ElementKind.NODE,
            self.machine_id,
            {A.NAME: self.hostname, A.NODE_STATE: NodeState.UP, A.NODE_NUMBER: "0", CPUS: str(self.cpus)},
        )
        self.queue_id = model.add(ElementKind.QUEUE, None, {A.NAME: QUEUE_NAME, A.QUEUE_STATE: QueueState.NORMAL})

    def _live(self, job_id: int) -> _Job:
        record = self._jobs.get(job_id)
        if record is not None:
            return record
        try:
            state = self.model.attr(job_id, A.JOB_STATE)
        except UnknownElement:
            state = None
        if state == State.COMPLETED:
            raise JobError(f"job {job_id} has already completed", ErrorCode.OPERATION_FAILED)
        raise JobError(f"job {job_id} is not a job of the local scheduler", ErrorCode.NO_SUCH_JOB)

    # ------------------------------------------------------------------ submission

    def _prepare(self, job: AttributeSet) -> _Launch:
        """Check a submission and work out the argv, directory and environment."""
        sub_id = require_sub_id(job)
        num_procs = parse_num_procs(job, MAX_PROCS)
        queue = job.get(A.QUEUE_ID)
        if queue and queue not in (str(self.queue_id), QUEUE_NAME):
            raise SubmitError(
                f"unknown queue {queue!r}: the local scheduler has one queue, {self.queue_id} ({QUEUE_NAME})",
                ErrorCode.NO_SUCH_QUEUE,
            )
        cwd = self._working_dir(job.get(A.WORKING_DIR))
        env = dict(os.environ)
        env.update(parse_env(job.getall(A.ENV)))
        path = _find_executable(job.get(A.EXEC_NAME), job.get(A.EXEC_PATH), cwd, env.get("PATH", os.defpath))
        args = job.getall(A.PROG_ARGS)
        for arg in args:
            if "\0" in arg:
                raise SubmitError(f"program argument {arg!r} contains a NUL character", ErrorCode.BAD_ARGUMENTS)
        name = job.get(JOB_NAME) or os.path.basename(path)
        return _Launch(sub_id, path, [path, *args], cwd, env, num_procs, name)

    def _working_dir(self, given: Optional[str]) -> str:
        if not given:
            return self._default_cwd
        if "\0" in given:
            raise SubmitError("working directory contains a NUL character", ErrorCode.BAD_ARGUMENTS)
        path = os.path.join(self._default_cwd, given)  # absolute paths stay as they are
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise SubmitError(f"working directory {path!r} does not exist", ErrorCode.SUBMIT_FAILED) from None
        except NotADirectoryError:
            raise SubmitError(
                f"working directory {path!r} does not exist (a part of it is not a directory)",
                ErrorCode.SUBMIT_FAILED,
            ) from None
        except OSError as exc:
            raise SubmitError(
                f"working directory {path!r} cannot be used: {exc.strerror}", ErrorCode.SUBMIT_FAILED
            ) from None
        if not stat.S_ISDIR(info.st_mode):
            raise SubmitError(f"working directory {path!r} is not a directory", ErrorCode.SUBMIT_FAILED)
        if not os.access(path, os.X_OK):
            raise SubmitError(
                f"working directory {path!r} is not accessible (permission denied)", ErrorCode.SUBMIT_FAILED
            )
        return path

    async def _run_job(self, record: _Job, launch: _Launch) -> None:
        """The job's task: start its processes, watch them, reap the leader, complete the job."""
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
                    model.update(record.process_ids[index], {A.PROCESS_PID: str(proc.pid)})
            with model.batch():
                running = {A.PROCESS_STATE: State.RUNNING, A.PROCESS_STATUS: Status.RUNNING}
                model.update_many(record.process_ids[: len(record.procs)], running)
                model.update(record.id, {A.JOB_STATE: State.RUNNING, A.JOB_STATUS: Status.RUNNING})
        if record.canceled:  # terminated while its processes were being started
            self._terminate(record)

    async def _spawn(self, record: _Job, launch: _Launch) -> None:
        """Process 0 leads a new process group; the others join it."""
        for index in range(launch.num_procs):
            env = dict(launch.env)
            env["PROXY_AGENT_PROCESS_INDEX"] = str(index)
            env["PROXY_AGENT_NUM_PROCS"] = str(launch.num_procs)
            env["PROXY_AGENT_JOB_ID"] = str(record.id)
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
        """Read one pipe to EOF, handing its lines to the model."""
        output = self.model.output
        splitter = LineSplitter()
        try:
            while True:
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    break
                for line in splitter.feed(data):
                    output(eid, line, which)
        finally:
            for line in splitter.flush():
                output(eid, line, which)
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
            status = Status.CANCELED if record.canceled else Status.FAILED
            self.model.update(record.process_ids[index], {A.PROCESS_STATE: State.COMPLETED, A.PROCESS_STATUS: status})
            return
        attrs = {A.PROCESS_STATE: State.COMPLETED, A.PROCESS_STATUS: status_for_exit(returncode, record.canceled)}
        if returncode >= 0:
            attrs[A.PROCESS_EXIT_CODE] = str(returncode)
        else:
            attrs[A.PROCESS_SIGNAL_NAME] = signal_name(-returncode)
        self.model.update(record.process_ids[index], attrs)

    def _finish_job(self, record: _Job) -> None:
        with self.model.batch():
            self._complete_job(record)
        self._jobs.pop(record.id, None)
        record.done.set()

    def _complete_job(self, record: _Job) -> None:
        for index in range(len(record.process_ids)):
            self._report_process(record, index)
        attrs = {A.JOB_STATE: State.COMPLETED}
        if record.canceled:
            attrs[A.JOB_STATUS] = Status.CANCELED
        elif record.start_error is not None:
            attrs[A.JOB_STATUS] = Status.FAILED
            attrs[A.JOB_STATUS_MESSAGE] = record.start_error
        else:
            failed = [(i, rc) for i, rc in enumerate(record.returncodes) if rc != 0]
            if failed:
                index, returncode = failed[0]
                attrs[A.JOB_STATUS] = Status.FAILED
                if returncode is None:
                    why = f"process {index} was not started"
                elif returncode > 0:
                    why = f"process {index} exited with code {returncode}"
                else:
                    why = f"process {index} was killed by {signal_name(-returncode)}"
                if len(failed) > 1:
                    why += f" ({len(failed)} processes failed)"
                attrs[A.JOB_STATUS_MESSAGE] = why
            else:
                attrs[A.JOB_STATUS] = Status.FINISHED
        self.model.update(record.id, attrs)

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


def _find_executable(exec_name: Optional[str], exec_path: Optional[str], cwd: str, search_path: str) -> str:
    """The program to run, from ``execName``/``execPath``; SubmitError naming the problem.

    ``execPath`` alone, or naming an existing file, is the program's path;
    with ``execName`` it is otherwise the directory holding ``execName``.
    ``execName`` alone is looked up on PATH (the job's PATH if its ``env``
    sets one) unless it contains '/'.  Relative paths are relative to the
    job's working directory.
    """
    for what, value in (("execName", exec_name), ("execPath", exec_path)):
        if value and "\0" in value:
            raise SubmitError(f"{what} contains a NUL character", ErrorCode.BAD_ARGUMENTS)
    if exec_path:
        base = os.path.join(cwd, exec_path)
        candidate = os.path.join(base, exec_name) if exec_name and not os.path.isfile(base) else base
    elif exec_name:
        if "/" in exec_name:
            candidate = os.path.join(cwd, exec_name)
        else:
            candidate = _search_path(exec_name, search_path, cwd)
    else:
        raise SubmitError("no executable given: set execName and/or execPath", ErrorCode.BAD_ARGUMENTS)
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
            f"executable {not_executable!r} is not executable (permission denied)", ErrorCode.SUBMIT_FAILED
        )
    raise SubmitError(f"executable {name!r} not found on PATH", ErrorCode.SUBMIT_FAILED)


def _check_executable(path: str) -> None:
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SubmitError(f"executable {path!r} not found", ErrorCode.SUBMIT_FAILED) from None
    except OSError as exc:
        raise SubmitError(f"executable {path!r} cannot be used: {exc.strerror}", ErrorCode.SUBMIT_FAILED) from None
    if stat.S_ISDIR(info.st_mode):
        raise SubmitError(f"executable {path!r} is a directory, not a program", ErrorCode.SUBMIT_FAILED)
    if not stat.S_ISREG(info.st_mode):
        raise SubmitError(f"executable {path!r} is not a regular file", ErrorCode.SUBMIT_FAILED)
    if not os.access(path, os.X_OK):
        raise SubmitError(f"executable {path!r} is not executable (permission denied)", ErrorCode.SUBMIT_FAILED)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
