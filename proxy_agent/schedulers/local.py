"""The local scheduler: jobs are processes on this host, run by a keeper that outlives the agent.

The model is one machine and one node (this host) and one queue, ``default``.  A submitted
job runs its program ``count`` times, each process with ``PROXY_AGENT_PROCESS_INDEX`` (its
rank, 0..N-1), ``PROXY_AGENT_NUM_PROCS`` and ``PROXY_AGENT_JOB_KEY`` (the job's service key)
in its environment.

The processes are not the agent's children: the keeper of the state directory
(:mod:`.keeper`, a small standard-library program in a session of its own) starts them,
copies their output into files, records how they end, and goes on when the agent dies.  The
agent reads the output files (:class:`_File`) as the keeper says they grow, and tells the
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
  program could not be executed) or TERMINATED (KILLED: ended on request), or LOST (DELETED:
  the keeper running it ended before it did).

Terminate sends SIGTERM to the group and SIGKILL after ``kill_grace`` seconds.  Suspend stops
the group (SIGSTOP) and resume continues it (SIGCONT).  When the agent ends, the jobs end with
it (``--on-disconnect terminate``, the default) or run on for the next agent (``keep``); an
agent that is killed cannot choose, and its jobs run on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import attrs
import trio

from ..service.attributes import AttrInfo, ValueType
from ..service.jobs import ErrorKind, JobError, JobSpec, JobState, StateTable, SubmitError
from ..service.model import K, Kind, ServiceModel, UnknownElement
from .base import Backend, BackendContext
from .common import LineSplitter, MAX_LINE_BYTES, current_user, signal_name, state_attrs
from .keeper_link import KeeperError, KeeperLink, open_keeper

if TYPE_CHECKING:  # pragma: no cover
    import argparse

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
        "LOST": JobState.DELETED,
    },
)
_PENDING = state_attrs(STATE_TABLE, "PENDING")
_RUNNING = state_attrs(STATE_TABLE, "RUNNING")
_STOPPED = state_attrs(STATE_TABLE, "STOPPED")
_ENDED = frozenset(native for native, state in STATE_TABLE if state.final)

#: Bytes read from an output file at a time.
_READ_CHUNK = 1 << 20
#: How long a suspension may take to reach every process before it is reported anyway.
_STOP_WAIT = 1.0
#: How long ending the jobs may take when the agent ends.
_SHUTDOWN_BOUND = 1.5


@attrs.frozen
class LocalOptions:
    #: seconds between SIGTERM and SIGKILL when a job is terminated
    kill_grace: float = 2.0
    #: what happens to running jobs when the agent ends: "terminate" or "keep"
    on_disconnect: str = "terminate"


class _File:
    """One process's output file, read as the keeper writes it."""

    __slots__ = ("path", "fd", "offset", "splitter", "size")

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.fd: Optional[int] = None
        #: bytes read so far (the lines before it are complete or held in the splitter)
        self.offset = offset
        self.splitter = LineSplitter()
        #: what the keeper last said its size is
        self.size = offset

    @property
    def consumed(self) -> int:
        """Where the text handed on so far ends: what may count as delivered."""
        return self.offset - self.splitter.pending_bytes

    def read(self, limit: int) -> Optional[bytes]:
        if self.fd is None:
            if self.size <= 0 and self.offset <= 0:
                # The keeper has told of no output here (it says when a file first grows,
                # before the process's end): it has made no file, nothing to look up.
                return None
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        data = os.pread(self.fd, limit, self.offset)
        self.offset += len(data)
        return data

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Job:
    """A local job this agent follows (dropped once it has ended and its output is read)."""

    __slots__ = ("key", "process_keys", "files", "canceled", "suspended", "started", "pids", "codes",
                 "reported", "done", "finished", "start_error", "spawned")

    def __init__(self, key: int, process_keys: List[int], directory: str) -> None:
        self.key = key
        self.process_keys = process_keys
        count = len(process_keys)
        #: (rank, stream) -> its output file
        self.files: Dict[Tuple[int, str], _File] = {
            (rank, stream): _File(os.path.join(directory, str(key), f"{rank}.{'out' if stream == 'stdout' else 'err'}"))
            for rank in range(count) for stream in ("stdout", "stderr")
        }
        self.canceled = False
        self.suspended = False
        self.started = False
        self.pids: List[int] = []
        self.codes: List[Optional[int]] = [None] * count
        self.reported = [False] * count
        #: the keeper said every process has ended
        self.done = False
        #: set once the job's end is in the model
        self.finished = trio.Event()
        self.start_error: Optional[str] = None
        #: set when the keeper answered the spawn request
        self.spawned = trio.Event()


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
        self.cpus = _cpu_count()
        self.user = current_user()
        self.machine_id: Optional[int] = None
        self.node_id: Optional[int] = None
        self.queue_id: Optional[int] = None
        self._jobs: Dict[int, _Job] = {}
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

    def default_queue(self) -> Optional[int]:
        return self.queue_id

    @property
    def durable(self) -> bool:
        """Jobs survive the agent (the keeper works in the state directory)."""
        return not self._temporary

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        state_dir = self.context.state_dir
        if state_dir is not None:
            self._directory = os.path.join(state_dir, "local")
        else:
            self._directory = tempfile.mkdtemp(prefix="proxy-agent-local-")
            self._temporary = True
        try:
            self._keeper = await open_keeper(self._directory)
            await self._keeper.send({"op": "hello"})
            reply = await self._keeper.receive()
            # Notices the keeper sent between the connection and its answer (output of running
            # jobs) are heard once the jobs are adopted: the keeper sends no second notice
            # for a file until the agent has read it.
            early = []
            while reply is not None and reply.get("op") != "jobs":
                early.append(reply)
                reply = await self._keeper.receive()
        except (KeeperError, OSError, ValueError) as exc:
            raise RuntimeError(f"cannot run local jobs: {exc}") from None
        if reply is None or reply.get("op") != "jobs":
            raise RuntimeError("cannot run local jobs: the keeper did not answer")
        self._keeper_jobs = {int(job["key"]): job for job in reply.get("jobs", [])}
        if self.machine_id is None:
            self._populate()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_outputs)
                task_status.started()
                for message in early:
                    self._notice(message)
                self._serving = True
                try:
                    await self._keeper.serve(self._notices)
                finally:
                    self._serving = False
                    self._served.set()
                if not self._closing:
                    raise RuntimeError("the keeper of the local jobs stopped")
        finally:
            self._closing = True
            with trio.CancelScope(shield=True):
                await self._shutdown()

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> int:
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorKind.SHUTTING_DOWN)
        if self._keeper is None or self.queue_id is None:
            raise SubmitError("the local scheduler is not running", ErrorKind.UNAVAILABLE)
        if queue != self.queue_id:
            raise SubmitError(f"the local scheduler has one queue, {QUEUE_NAME}", ErrorKind.NO_SUCH_QUEUE)
        launch = self._prepare(spec)
        job_id = self._add_job(spec, launch.name, launch.path, launch.cwd, launch.num_procs, _PENDING, key)
        record = self._jobs[job_id]
        try:
            await self._keeper.send_line(self._spawn_request(job_id, launch))
        except KeeperError as exc:
            record.start_error = str(exc)
            record.done = True
            self._finish(record)
            return job_id
        return job_id

    def _spawn_request(self, job_id: int, launch: _Launch) -> bytes:
        """The keeper's request to start a job, as one JSON line: ``{"op": "spawn", "key",
        "argv", "env", "cwd", "count"}``, the environment with ``PROXY_AGENT_JOB_KEY``.  The
        agent's environment, which most jobs are given as it is, is encoded once."""
        dumps = _dumps
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
        model = self.model
        with model.batch():
            job_id = model.add(
                Kind.JOB,
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
                owner=self.name,
                key=key,
            )
            process_ids = list(model.add_many(
                Kind.PROCESS, job_id, [{**state, K.NODE: self.node_id} for _ in range(count)], owner=self.name,
            ))
        assert self._directory is not None
        self._jobs[job_id] = _Job(job_id, process_ids, os.path.join(self._directory, "jobs"))
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
        attrs_ = _STOPPED if suspended else _RUNNING
        with self.model.batch():
            self.model.update(record.key, attrs_)
            live = [pid for index, pid in enumerate(record.process_keys) if not record.reported[index]]
            self.model.update_many(live, attrs_)

    async def _signal(self, record: _Job, action: str) -> None:
        if self._keeper is None:
            raise JobError("the local scheduler is not running", ErrorKind.UNAVAILABLE)
        try:
            await self._keeper.send({"op": "signal", "key": record.key, "action": action,
                                     "grace": self.options.kill_grace})
        except KeeperError as exc:
            raise JobError(str(exc), ErrorKind.UNAVAILABLE) from None

    async def _wait_stopped(self, record: _Job) -> None:
        """Until every process of the job has stopped or exited (at most a second)."""
        with trio.move_on_after(_STOP_WAIT):
            for index, pid in enumerate(record.pids):
                while not record.reported[index] and not _stopped_or_exited(pid):
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

    # ------------------------------------------------------------------ adoption

    def adopt(self, stored) -> List[int]:
        """Take back the jobs a previous agent submitted here (their store records), as the
        keeper knows them: running ones are followed on, ended ones reported; their output is
        delivered from where delivery had stopped.  Returns the keys adopted."""
        adopted = []
        for record in stored:
            spec = record.job_spec
            if spec is None:
                continue
            info = self._keeper_jobs.get(record.key)
            pids = list(info.get("pids", [])) if info else []
            count = len(pids) or spec.num_procs
            path = spec.executable
            cwd = spec.working_dir or self._default_cwd
            if info is None and record.ended is not None and record.native_state in _ENDED:
                # ended and recorded so, its files since removed: the recorded end
                ended = state_attrs(STATE_TABLE, record.native_state)
                self._add_job(spec, spec.display_name, path, cwd, count, ended, record.key)
                job = self._jobs.pop(record.key)
                with self.model.batch():
                    self.model.update(job.key, {K.EXIT_CODE: record.exit_code or None,
                                                K.MESSAGE: record.message or None})
                    if count == 1 and (record.exit_code or record.signal):
                        self.model.update(job.process_keys[0], {K.EXIT_CODE: record.exit_code or None,
                                                                K.SIGNAL: record.signal or None})
                adopted.append(record.key)
                continue
            if info is None or info.get("lost"):
                self._add_job(spec, spec.display_name, path, cwd, count, state_attrs(STATE_TABLE, "LOST"), record.key)
                job = self._jobs.pop(record.key)
                if info is None:
                    why = ("the keeper has no record of the job: the agent ended before it handed the job over, "
                           "or the job's files were removed")
                else:
                    why = "the job ended with the keeper that ran it; its end was not recorded"
                self.model.update(job.key, {K.MESSAGE: why})
                for process in job.process_keys:
                    self.model.update(process, state_attrs(STATE_TABLE, "LOST"))
                adopted.append(record.key)
                continue
            self._add_job(spec, spec.display_name, path, cwd, count, _RUNNING, record.key)
            job = self._jobs[record.key]
            job.started = True
            job.pids = pids
            job.spawned.set()
            if record.native_state == "TERMINATED" or record.state == JobState.KILLED.value:
                job.canceled = True
            delivered = record.delivered_offsets
            sizes = info.get("sizes", {})
            for (rank, stream), file in job.files.items():
                name = f"{rank}.{stream}"
                file.offset = file.size = delivered.get(name, 0)
                file.size = max(file.size, int(sizes.get(f"{rank}.{stream}", 0)))
                if file.size > file.offset:
                    self._mark(job.key, rank, stream)
            with self.model.batch():
                for index, pid in enumerate(pids):
                    self.model.update(job.process_keys[index], {K.PID: str(pid)})
            codes = info.get("codes", [])
            if info.get("done"):
                job.done = True
                for rank, code in enumerate(codes):
                    job.codes[rank] = code
            else:
                for rank, code in enumerate(codes):
                    if code is not None:
                        job.codes[rank] = code
            self._settle(job)
            adopted.append(record.key)
        return adopted

    # ------------------------------------------------------------------ the keeper's news

    def _notices(self, messages: List[dict]) -> None:
        """A round of the keeper's news, in as few changes of the model as keep every state
        a job passes through visible: the queue's figures are written once per change, and
        clients hear of it in one go.  A change ends before news of a job that started in
        it (its RUNNING is not to be lost in its end).  The PIDs of the jobs started in the
        round go first, in a change of their own (every process's differs; their RUNNING,
        the same for all, then goes in one range)."""
        model = self.model
        with model.batch():
            for message in messages:
                if message.get("op") == "spawned":
                    self._set_pids(message)
        changes: List[List[dict]] = [[]]
        started: set = set()
        for message in messages:
            op, key = message.get("op"), message.get("key")
            if key in started and op != "output":
                changes.append([])
                started = set()
            changes[-1].append(message)
            if op == "spawned":
                started.add(key)
        for change in changes:
            with model.batch():
                for message in change:
                    self._notice(message)

    def _set_pids(self, message: dict) -> None:
        key = message.get("key")
        record = self._jobs.get(key) if isinstance(key, int) else None
        if record is not None and not record.started:
            record.pids = [int(p) for p in message.get("pids", [])]
            model = self.model
            for index, pid in enumerate(record.pids):
                model.update(record.process_keys[index], {K.PID: str(pid)})

    def _notice(self, message: dict) -> None:
        op = message.get("op")
        key = message.get("key")
        record = self._jobs.get(key) if isinstance(key, int) else None
        if op == "spawned" and record is not None:
            record.pids = [int(p) for p in message.get("pids", [])]
            record.started = True
            record.spawned.set()
            model = self.model
            with model.batch():
                for index, pid in enumerate(record.pids):
                    model.update(record.process_keys[index], {K.PID: str(pid)})
            with model.batch():
                live = [p for i, p in enumerate(record.process_keys) if not record.reported[i]]
                model.update_many(live, _RUNNING)
                model.update(record.key, _RUNNING)
            if record.canceled:  # terminated while its processes were being started
                self._spawn_soon(self._signal, record, "terminate")
        elif op == "failed" and record is not None:
            record.start_error = message.get("error") or "the processes could not be started"
            record.spawned.set()
            if not message.get("started"):
                record.done = True
                self._settle(record)
        elif op == "output" and record is not None:
            rank, stream = int(message["rank"]), message["stream"]
            file = record.files.get((rank, stream))
            if file is not None:
                file.size = max(file.size, int(message.get("size", 0)))
                self._mark(record.key, rank, stream)
        elif op == "exit" and record is not None:
            rank = int(message["rank"])
            if 0 <= rank < len(record.codes):
                record.codes[rank] = int(message["code"])
                self._settle(record)
        elif op == "done" and record is not None:
            record.done = True
            self._settle(record)
        elif op == "error":
            log.warning("the keeper refused a request: %s", message.get("error"))

    def _spawn_soon(self, function, *args) -> None:
        # The coroutine is made only inside the task, so that a request dropped because the
        # backend is closing leaves no coroutine that was never awaited.
        async def run() -> None:
            try:
                await function(*args)
            except Exception:  # noqa: BLE001 - best effort
                log.exception("a request to the keeper failed")

        if self._nursery_for_tasks is not None:
            try:
                self._nursery_for_tasks.start_soon(run)
            except RuntimeError:  # the nursery has closed: the agent is ending
                pass

    _nursery_for_tasks: Optional[trio.Nursery] = None

    def _mark(self, key: int, rank: int, stream: str) -> None:
        self._dirty[(key, rank, stream)] = None
        self._wake_reader.set()

    async def _read_outputs(self) -> None:
        """Read the output files the keeper said grew, as far as the clients have room."""
        model = self.model
        async with trio.open_nursery() as nursery:
            self._nursery_for_tasks = nursery
            while True:
                if not self._dirty:
                    await self._wake_reader.wait()
                    self._wake_reader = trio.Event()
                    continue
                if not model.output_room_available():
                    await model.output_room()
                key, rank, stream = next(iter(self._dirty))
                del self._dirty[(key, rank, stream)]
                record = self._jobs.get(key)
                if record is None:
                    continue
                self._read(record, rank, stream, _READ_CHUNK)
                await trio.lowlevel.checkpoint()

    def _read(self, record: _Job, rank: int, stream: str, limit: int, final: bool = False) -> None:
        """Read a file on (``limit`` bytes at most; to its end when ``final``) and hand its
        complete lines to the model; tell the keeper how far it has been read."""
        file = record.files[(rank, stream)]
        process = record.process_keys[rank]
        model = self.model
        while True:
            data = file.read(limit)
            if data is None:
                return
            if data:
                text = file.splitter.feed_text(data)
                if text is not None and process in model:
                    model.output(process, stream, text, file.consumed)
            if not data or len(data) < limit or not final:
                break
        if final:
            text = file.splitter.flush_text()
            if text is not None and process in model:
                model.output(process, stream, text, file.offset)
        elif file.offset < file.size:
            self._mark(record.key, rank, stream)
        if self._keeper is not None and not self._keeper.closed and not self._closing:
            self._spawn_soon(self._keeper_read, record.key, rank, stream, file.offset)

    async def _keeper_read(self, key: int, rank: int, stream: str, offset: int) -> None:
        if self._keeper is not None and not self._keeper.closed:
            try:
                await self._keeper.send({"op": "read", "key": key, "rank": rank, "stream": stream, "offset": offset})
            except KeeperError:
                pass

    def _settle(self, record: _Job) -> None:
        """Report what has ended: each process whose status is known (after reading its
        output to the end), then the job once the keeper says all have ended."""
        # While the agent ends, output stays in the files for the next agent to deliver.
        read = not self._closing
        for rank, code in enumerate(record.codes):
            if code is None or record.reported[rank]:
                continue
            if read:
                for stream in ("stdout", "stderr"):
                    self._read(record, rank, stream, _READ_CHUNK, final=True)
            self._report_process(record, rank)
        if record.done and not record.finished.is_set():
            for rank in range(len(record.codes)):
                if not record.reported[rank]:
                    if read:
                        for stream in ("stdout", "stderr"):
                            self._read(record, rank, stream, _READ_CHUNK, final=True)
                    self._report_process(record, rank)
            self._finish(record)

    def _report_process(self, record: _Job, rank: int) -> None:
        if record.reported[rank]:
            return
        record.reported[rank] = True
        code = record.codes[rank]
        process = record.process_keys[rank]
        if code is None:  # never started
            native = "TERMINATED" if record.canceled else "NOT_STARTED"
            self.model.update(process, state_attrs(STATE_TABLE, native))
            return
        if record.canceled:
            native = "TERMINATED"
        else:
            native = "EXITED" if code == 0 else "FAILED"
        attrs_ = state_attrs(STATE_TABLE, native)
        if code >= 0:
            attrs_[K.EXIT_CODE] = str(code)
        else:
            attrs_[K.SIGNAL] = signal_name(-code)
        self.model.update(process, attrs_)

    def _finish(self, record: _Job) -> None:
        with self.model.batch():
            for rank in range(len(record.codes)):
                self._report_process(record, rank)
            self._complete_job(record)
        self._jobs.pop(record.key, None)
        for file in record.files.values():
            file.close()
        record.finished.set()

    def _complete_job(self, record: _Job) -> None:
        if record.key not in self.model:
            return
        if record.canceled:
            attrs_ = state_attrs(STATE_TABLE, "TERMINATED")
        elif record.start_error is not None:
            attrs_ = state_attrs(STATE_TABLE, "NOT_STARTED")
            attrs_[K.MESSAGE] = record.start_error
        else:
            failed = [(i, rc) for i, rc in enumerate(record.codes) if rc != 0]
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
                attrs_[K.EXIT_CODE] = "0"
        self.model.update(record.key, attrs_)

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
        base, base_size = self._environment()
        env = dict(base) if spec.environment else base  # not changed after this
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
        size += base_size if env is base else _environment_size(env)
        if size > self._arg_max - 2048:
            raise SubmitError(
                f"the program's arguments and environment take {size} bytes; this system allows at most "
                f"{self._arg_max} bytes for both together",
                ErrorKind.BAD_REQUEST,
            )
        name = spec.name or os.path.basename(path)
        return _Launch(path, [path, *args], cwd, env, num_procs, name)

    def _environment(self) -> Tuple[Dict[str, str], int]:
        """The agent's environment (what every job starts from) and its size for execve().
        Read at the first submission, when the agent has set itself up (it does not change
        its environment after that): a busy client submits hundreds of jobs a second."""
        if self._base_env is None:
            env = dict(os.environ)
            self._base_env = (env, _environment_size(env))
        return self._base_env

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
            if self._temporary and self._directory is not None and keeper is not None and keeper.closed:
                shutil.rmtree(self._directory, ignore_errors=True)
            self._closed.set()


# --------------------------------------------------------------------------- helpers

#: JSON as the keeper reads it (compact)
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _environment_size(env: Dict[str, str]) -> int:
    """Bytes an environment takes in execve(): each string, its NUL and its pointer."""
    return sum(len(k.encode("utf-8", "surrogateescape")) + len(v.encode("utf-8", "surrogateescape")) + 10
               for k, v in env.items())


def _stopped_or_exited(pid: int) -> bool:
    """Has this process stopped (or exited)?  Read from /proc: it is the keeper's child."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            state = stat_file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("T", "t", "Z", "X")


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
