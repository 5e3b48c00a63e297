"""The local scheduler: jobs are processes on this host, run by a keeper that outlives the agent.

The model is one machine and one node (this host) and one queue, ``default``.  A submitted
job runs its program ``count`` times, each process with ``PROXY_AGENT_PROCESS_INDEX`` (its
rank, 0..N-1), ``PROXY_AGENT_NUM_PROCS`` and ``PROXY_AGENT_JOB_KEY`` (the job's service key)
in its environment.

The processes are not the agent's children: the keeper of the state directory
(:mod:`.keeper`, a small standard-library program in a session of its own) starts them,
copies their output into files, records how they end, and goes on when the agent dies.  A
submission is answered once the keeper has recorded the job in its journal, synced to the
disk, before it starts it: an accepted job is never lost.  A keeper that dies is replaced by its
custodian (:mod:`.custodian`), and the agent reconnects to the new keeper at once and goes on
with every job it took back.  The
agent reads the output files (:class:`~.local_records.OutputFile`) as the keeper says they grow, and tells the
keeper how far it has read: the keeper holds a process's output back, as a terminal does,
when the agent falls behind.  A new agent on the same state directory finds the keeper's jobs
again (:meth:`LocalBackend.adopt`): running ones are followed on, ended ones reported with
their exit statuses, and their output is delivered from where delivery had stopped.

How a job runs:

* The program is executed directly from an argv list, never through a shell, with stdin
  from ``/dev/null``; all processes of a job share one process group, led by process 0.
* A process is reported ended only after its output has been read to the end, so its output
  always precedes its end; when every process has ended, whatever they left running (in the
  group, or having left it) is ended too.
* States: the backend's own words (``nativeState``) and what they mean are in
  :data:`STATE_TABLE`: a job is PENDING (QUEUING) until its processes are started, RUNNING,
  STOPPED (SUSPENDED) while suspended, and ends EXITED (FINISHED: every process exited 0),
  FAILED (a process exited non-zero or was killed by a signal), NOT_STARTED (FAILED: the
  program could not be executed) or TERMINATED (KILLED: ended on request), or LOST (FAILED:
  its end is not known, the message says why: the agent ended before the keeper recorded the
  job, or the keeper running it ended and it could not be taken back).

Terminate sends SIGTERM to the group and SIGKILL after ``kill_grace`` seconds.  Suspend stops
the group (SIGSTOP) and resume continues it (SIGCONT).  When the agent ends, the jobs end with
it (``--on-disconnect terminate``, the default) or run on for the next agent (``keep``); an
agent that is killed cannot choose, and its jobs run on.

Beside this module: the job records, output files and state table (:mod:`.local_records`),
preparing a launch (:mod:`.local_launch`), the keeper's news (:mod:`.local_news`), reading
the output (:mod:`.local_output`) and taking jobs back (:mod:`.local_adoption`).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import attrs
import trio

from ..service.attributes import AttrInfo, ValueType
from ..service.jobs import ErrorKind, JobError, JobSpec, SubmitError
from ..service.model import K, Kind, ServiceModel, UnknownElement
from ..service.backend import Backend, BackendContext, Submitted
from .common import LineSplitter, MAX_LINE_BYTES, current_user
from .keeper_link import KeeperError, KeeperLink, open_keeper
from .local_adoption import LocalAdoption
from .local_launch import LaunchPreparation
from .local_news import KeeperNews
from .local_output import OutputReading
from .local_records import (
    ENDED_STATES, MAX_PROCS, PENDING_ATTRS, QUEUE_NAME, RUNNING_ATTRS, STATE_TABLE, STOPPED_ATTRS, Launch, LocalJob,
    compact_json, cpu_count, stopped_or_exited,
)

if TYPE_CHECKING:  # pragma: no cover
    import argparse

__all__ = ["LineSplitter", "LocalBackend", "LocalOptions", "MAX_PROCS", "MAX_LINE_BYTES", "QUEUE_NAME", "STATE_TABLE"]

log = logging.getLogger(__name__)


#: How long a suspension may take to reach every process before it is reported anyway.
_STOP_WAIT = 1.0
#: How long ending the jobs may take when the agent ends.
_SHUTDOWN_BOUND = 1.5
#: How long a request waits for a keeper that died to be replaced.
_REPLACE_WAIT = 15.0

@attrs.frozen
class LocalOptions:
    #: seconds between SIGTERM and SIGKILL when a job is terminated
    kill_grace: float = 2.0
    #: what happens to running jobs when the agent ends: "terminate" or "keep"
    on_disconnect: str = "terminate"


class LocalBackend(KeeperNews, OutputReading, LocalAdoption, LaunchPreparation, Backend):
    """Runs jobs as processes of this host, through the keeper."""

    name = "local"
    summary = "programs run directly on this machine as local processes"
    #: the queue's slots are this host's CPUs; the service counts its waiting and running jobs
    queue_load = "queue"
    jobs_are_local = True

    def __init__(self, model: ServiceModel, options: Optional[LocalOptions] = None,
                 context: Optional[BackendContext] = None) -> None:
        super().__init__(model, options, context)
        self.hostname = socket.gethostname() or "localhost"
        self.cpus = cpu_count()
        self.user = current_user()
        self.machine_id: Optional[int] = None
        self.node_id: Optional[int] = None
        self.queue_id: Optional[int] = None
        self._jobs: Dict[int, LocalJob] = {}
        self._base_env: Optional[Tuple[Dict[str, str], int]] = None
        #: the agent's environment as the inside of a JSON object
        self._base_env_json: Optional[str] = None
        self._keeper: Optional[KeeperLink] = None
        self._keeper_jobs: Dict[int, dict] = {}
        self._directory: Optional[str] = None
        self._temporary = False
        self._dirty: Dict[Tuple[int, int, str], None] = {}
        self._wake_reader = trio.Event()
        self._closing = False
        self._shutting_down = False
        self._closed = trio.Event()
        #: run()'s loop is reading the keeper's messages (nobody else may read them then)
        self._serving = False
        self._served = trio.Event()
        #: set when a keeper that died has been replaced (requests made meanwhile wait for it)
        self._keeper_back = trio.Event()
        #: when clients were last told that the disk has no room for output
        self._drops_told_at: Optional[float] = None
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
        group.add_argument(
            "--on-disconnect", choices=["terminate", "keep"], default=None,
            help="when this launch's client goes away (--stdio, --connect), or the launch ends (--listen, --unix): "
            "end the local jobs submitted through it, or keep them running; they stay jobs of the state "
            "directory's service either way (default: terminate, and keep for --listen and --unix)",
        )

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> LocalOptions:
        grace = getattr(args, "local_kill_grace", 2.0)
        if not grace >= 0 or grace > 3600:
            raise ValueError(f"--local-kill-grace must be between 0 and 3600 seconds, got {grace:g}")
        return LocalOptions(kill_grace=grace, on_disconnect=getattr(args, "on_disconnect", None) or "terminate")

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

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        state_dir = self.context.state_dir
        if state_dir is not None:
            self._directory = os.path.join(state_dir, "local")
        else:
            self._directory = tempfile.mkdtemp(prefix="proxy-agent-local-")
            self._temporary = True
        try:
            self._keeper, reply, early = await self._connect_keeper()
        except (KeeperError, OSError, ValueError) as exc:
            raise RuntimeError(f"cannot run local jobs: {exc}") from None
        self._keeper_jobs = {int(job["key"]): job for job in reply.get("jobs", [])}
        if self.machine_id is None:
            self._populate()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_outputs)
                task_status.started()
                for message in early:
                    self._notice(message)
                while True:
                    self._serving = True
                    try:
                        await self._keeper.serve(self._notices)
                    finally:
                        self._serving = False
                    if self._closing:
                        break
                    # The keeper died: its custodian starts another one, which takes the
                    # running jobs back; the agent goes on with it.
                    await self._replace_keeper()
                self._served.set()
        finally:
            self._closing = True
            self._served.set()
            with trio.CancelScope(shield=True):
                await self._shutdown()

    async def _connect_keeper(self) -> Tuple[KeeperLink, dict, List[dict]]:
        """Connect to the keeper (starting one if none answers) and ask for its jobs: the
        link, its answer, and the notices it sent before that answer."""
        assert self._directory is not None
        keeper = await open_keeper(self._directory)
        try:
            await keeper.send({"op": "hello"})
            reply = await keeper.receive()
            # Notices the keeper sent between the connection and its answer (output of running
            # jobs) are heard once the jobs are adopted: the keeper sends no second notice
            # for a file until the agent has read it.
            early = []
            while reply is not None and reply.get("op") != "jobs":
                early.append(reply)
                reply = await keeper.receive()
            if reply is None:
                raise KeeperError("the keeper did not answer")
        except BaseException:
            await keeper.aclose()
            raise
        return keeper, reply, early

    async def _replace_keeper(self) -> None:
        """Reconnect to the keeper that replaced one that died, and go on with every job
        where the new keeper has it (retrying, and saying so, while none answers)."""
        old, self._keeper = self._keeper, None
        if old is not None:
            await old.aclose()
        log.warning("the keeper of the local jobs ended; reconnecting to the one that replaces it")
        started = trio.current_time()
        delay = 0.02
        told = False
        while not self._closing:
            try:
                keeper, reply, early = await self._connect_keeper()
            except (KeeperError, OSError, ValueError) as exc:
                if not told and trio.current_time() - started > 2.0:
                    told = True
                    self.context.notify("ERROR", f"the keeper of the local jobs ended and could not be replaced yet "
                                                 f"({exc}); retrying, and local requests wait meanwhile")
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._keeper = keeper
            self._resync(reply)
            back, self._keeper_back = self._keeper_back, trio.Event()
            back.set()
            for message in early:
                self._notice(message)
            log.warning("reconnected to the keeper of the local jobs after %.2f s", trio.current_time() - started)
            if told:
                self.context.notify("INFO", "the keeper of the local jobs was replaced; its jobs go on")
            return

    def _resync(self, reply: dict) -> None:
        """Bring every job the agent follows in line with what a new keeper says of it."""
        known = {int(job["key"]): job for job in reply.get("jobs", [])}
        for record in list(self._jobs.values()):
            info = known.get(record.key)
            if info is None:
                if record.spawn_line is not None and not record.recorded.is_set():
                    # never recorded by the keeper that died, so never started: ask again
                    self._spawn_soon(self._resend, record)
                    continue
                record.error = "the keeper running the job ended, and the one that replaced it has no record of it"
                record.done = True
                self._settle(record)
                continue
            record.recorded.set()  # the keeper has it
            if not record.started and info.get("pids"):
                self._notices([{"op": "spawned", "key": record.key, "pids": info["pids"]}])
            for rank, why in (info.get("lost_codes") or {}).items():
                record.lost[int(rank)] = why
            for rank, code in enumerate(info.get("codes", [])):
                if code is not None and 0 <= rank < len(record.codes):
                    record.codes[rank] = code
            self._take_dropped(record, info.get("dropped") or {})
            for name, size in (info.get("sizes") or {}).items():
                rank_text, _, stream = name.partition(".")
                file = record.files.get((int(rank_text), stream))
                if file is not None and int(size) > file.size:
                    file.size = int(size)
                    self._mark(record.key, int(rank_text), stream)
            for (rank, stream), file in record.files.items():
                if file.offset:  # the new keeper learns how far each file has been read
                    self._spawn_soon(self._keeper_read, record.key, rank, stream, file.offset)
            if info.get("done"):
                record.done = True
                record.error = record.error or info.get("error")
            self._settle(record)

    async def _resend(self, record: LocalJob) -> None:
        if self._keeper is not None and record.spawn_line is not None and not record.recorded.is_set():
            try:
                await self._keeper.send_line(record.spawn_line)
            except KeeperError:
                pass  # that keeper died too: the next one is asked again

    async def _keeper_now(self) -> KeeperLink:
        """The keeper, waiting (bounded) while one that died is being replaced."""
        if (self._keeper is None or self._keeper.closed) and not self._closing:
            with trio.move_on_after(_REPLACE_WAIT):
                await self._keeper_back.wait()
        if self._keeper is None or self._keeper.closed:
            raise JobError("the keeper of the local jobs ended and has not been replaced yet", ErrorKind.UNAVAILABLE)
        return self._keeper

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> Submitted:
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorKind.SHUTTING_DOWN)
        if self.queue_id is None:
            raise SubmitError("the local scheduler is not running", ErrorKind.UNAVAILABLE)
        if queue != self.queue_id:
            raise SubmitError(f"the local scheduler has one queue, {QUEUE_NAME}", ErrorKind.NO_SUCH_QUEUE)
        launch = self._prepare(spec)
        try:
            keeper = await self._keeper_now()
        except JobError as exc:
            raise SubmitError(exc.message, ErrorKind.UNAVAILABLE) from None
        job_id = self._add_job(spec, launch.name, launch.path, launch.cwd, launch.num_procs, PENDING_ATTRS, key)
        record = self._jobs[job_id]
        record.waiting = []
        record.spawn_line = self._spawn_request(job_id, launch)
        try:
            await keeper.send_line(record.spawn_line)
        except KeeperError:
            pass  # the keeper died: the one that replaces it is asked (see _resync)
        # Answered once the keeper has recorded the job (or refused it): an accepted job is
        # never lost, whatever ends after this.
        await record.recorded.wait()
        record.spawn_line = None
        if record.refused is not None:
            self._withdraw(record)
            raise SubmitError(record.refused, ErrorKind.UNAVAILABLE)
        self._answered(record)
        return Submitted(job_id)  # its own id on this host (its process group) comes once it runs

    def _withdraw(self, record: LocalJob) -> None:
        """A job the keeper refused (it recorded nothing, started nothing) leaves the model."""
        self._jobs.pop(record.key, None)
        for file in record.files.values():
            file.close()
        record.finished.set()
        try:
            self.model.remove(record.key)
        except UnknownElement:
            pass

    def _spawn_request(self, job_id: int, launch: Launch) -> bytes:
        """The keeper's request to start a job, as one JSON line: ``{"op": "spawn", "key",
        "argv", "env", "cwd", "count"}``, the environment with ``PROXY_AGENT_JOB_KEY``.  The
        agent's environment, which most jobs are given as it is, is encoded once."""
        dumps = compact_json
        if launch.env is self._base_env_of():
            if self._base_env_json is None:
                self._base_env_json = dumps(launch.env)[1:-1]
            env = self._base_env_json
        else:
            env = dumps(launch.env)[1:-1]
        return (f'{{"op":"spawn","key":{job_id},"argv":{dumps(launch.argv)},"env":{{{env}{"," if env else ""}'
                f'"PROXY_AGENT_JOB_KEY":"{job_id}"}},"cwd":{dumps(launch.cwd)},"count":{launch.num_procs}}}\n'
                ).encode()

    def _base_env_of(self) -> Optional[Dict[str, str]]:
        return self._base_env[0] if self._base_env is not None else None

    def _add_job(self, spec: JobSpec, name: str, path: str, cwd: str, count: int, state: Dict[str, str],
                 key: Optional[int]) -> int:
        assert self.queue_id is not None
        job_id, process_ids = self.model.add_job(
            self.queue_id,
            {
                K.CLIENT_REF: spec.client_ref,
                K.NAME: name,
                **state,
                K.QUEUE: self.queue_id,
                K.NUM_PROCS: str(count),
                K.EXECUTABLE: path,
                K.WORKING_DIR: cwd,
                K.ARGUMENTS: tuple(spec.arguments),
                K.USER: self.user,
            },
            [{**state, K.NODE: self.node_id}] * count,  # one shared row
            owner=self.name,
            key=key,
        )
        assert self._directory is not None
        self._jobs[job_id] = LocalJob(job_id, list(process_ids), os.path.join(self._directory, "jobs"))
        return job_id

    async def terminate(self, job: int) -> None:
        record = self._live(job)
        if record.canceled:
            return  # already on its way out
        record.canceled = True
        await self._signal(record, "terminate")

    async def suspend(self, job: int, suspended: bool) -> None:
        record = self._live(job)
        if record.canceled:
            raise JobError("the job is being terminated", ErrorKind.OPERATION_FAILED)
        if not record.started:
            raise JobError("the job is still starting", ErrorKind.OPERATION_FAILED)
        if suspended == record.suspended:
            return
        record.suspended = suspended
        await self._signal(record, "suspend" if suspended else "resume")
        if suspended:
            await self._wait_stopped(record)  # SIGSTOP takes effect asynchronously
            if record.done or record.suspended is not suspended:
                return
        attrs_ = STOPPED_ATTRS if suspended else RUNNING_ATTRS
        with self.model.batch():
            self.model.update(record.key, attrs_)
            live = [pid for index, pid in enumerate(record.process_keys) if not record.reported[index]]
            self.model.update_many(live, attrs_)

    async def _signal(self, record: LocalJob, action: str) -> None:
        request = {"op": "signal", "key": record.key, "action": action, "grace": self.options.kill_grace}
        try:
            await (await self._keeper_now()).send(request)
        except KeeperError:
            # the keeper died just now: the one replacing it takes the request
            try:
                await (await self._keeper_now()).send(request)
            except KeeperError as exc:
                raise JobError(str(exc), ErrorKind.UNAVAILABLE) from None

    async def _wait_stopped(self, record: LocalJob) -> None:
        """Until every process of the job has stopped or exited (at most a second)."""
        with trio.move_on_after(_STOP_WAIT):
            for index, pid in enumerate(record.pids):
                while not record.reported[index] and not stopped_or_exited(pid):
                    await trio.sleep(0.001)

    def active_jobs(self) -> int:
        return sum(1 for job in self._jobs.values() if not job.done)

    def output_files(self, job: int) -> Dict[Tuple[int, str], str]:
        """The keeper's files of the job (kept until the job is forgotten)."""
        if self._directory is None or self._temporary:
            return {}
        directory = os.path.join(self._directory, "jobs", str(job))
        try:
            names = os.listdir(directory)
        except OSError:
            return {}
        files = {}
        for name in names:
            rank, _, suffix = name.partition(".")
            if rank.isdigit() and suffix in ("out", "err"):
                files[(int(rank), "stdout" if suffix == "out" else "stderr")] = os.path.join(directory, name)
        return files

    async def move(self, job: int, queue: int) -> None:
        raise JobError(
            f"the local scheduler has a single queue ({QUEUE_NAME}); jobs cannot be moved",
            ErrorKind.NOT_SUPPORTED,
        )

    async def aclose(self) -> None:
        self._closing = True
        await self._shutdown()

    def _spawn_soon(self, function, *args) -> None:
        # The coroutine is made only inside the task, so that a request dropped because the
        # backend is closing leaves no coroutine that was never awaited.
        async def run() -> None:
            try:
                await function(*args)
            except Exception as exc:  # noqa: BLE001 - best effort
                if self._closing:  # the keeper is being let go: expected, and nothing to fix
                    log.info("a request to the keeper was dropped as the agent ends: %s", exc)
                else:
                    log.exception("a request to the keeper failed")

        if self._nursery_for_tasks is not None:
            try:
                self._nursery_for_tasks.start_soon(run)
            except RuntimeError:  # the nursery has closed: the agent is ending
                pass

    _nursery_for_tasks: Optional[trio.Nursery] = None

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
            self.default_queue = self.queue_id

    def _live(self, job: int) -> LocalJob:
        record = self._jobs.get(job)
        if record is not None:
            return record
        try:
            native = self.model.attr(job, K.NATIVE_STATE)
        except UnknownElement:
            native = None
        if native in ENDED_STATES:
            raise JobError("the job has already ended", ErrorKind.OPERATION_FAILED)
        raise JobError("the job is not a job of the local scheduler", ErrorKind.NO_SUCH_JOB)

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        """End the connection to the keeper; with ``terminate``, end every job first (its
        end and output reported), bounded in time.  Idempotent."""
        if self._shutting_down:
            with trio.move_on_after(_SHUTDOWN_BOUND):
                await self._closed.wait()
            return
        self._shutting_down = True
        keeper = self._keeper
        self._closing = True
        try:
            if keeper is not None and not keeper.closed:
                with trio.CancelScope(shield=True), trio.move_on_after(_SHUTDOWN_BOUND):
                    terminate = self.options.on_disconnect == "terminate" or self._temporary
                    if terminate:
                        for record in self._jobs.values():
                            record.canceled = True  # ended on the agent's behalf: KILLED
                    try:
                        await keeper.send({"op": "bye", "policy": "terminate" if terminate else "keep",
                                           "remove": self._temporary})
                    except KeeperError:
                        pass
                    if terminate:
                        # the keeper reports every job's end before it closes the connection
                        if self._serving:
                            await self._served.wait()
                        else:
                            await keeper.serve(self._notices)
                await keeper.aclose()
        finally:
            for record in list(self._jobs.values()):
                for file in record.files.values():
                    file.close()
                # a submission still waiting is answered: the store has it, and the next
                # agent finds it running, or reports that it never ran
                record.recorded.set()
            self._keeper_back.set()
            if self._temporary and self._directory is not None and keeper is not None and keeper.closed:
                shutil.rmtree(self._directory, ignore_errors=True)
            self._closed.set()


