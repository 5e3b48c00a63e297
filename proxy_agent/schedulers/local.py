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
  program could not be executed) or TERMINATED (KILLED: ended on request), or LOST (FAILED:
  its end is not known, the message says why: the agent ended before the keeper recorded the
  job, or the keeper running it ended and it could not be taken back).

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
from ..service.backend import Backend, BackendContext
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
        "LOST": JobState.FAILED,
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
#: How long a request waits for a keeper that died to be replaced.
_REPLACE_WAIT = 15.0
#: At most one notice a minute that the disk has no room for output.
_DROP_NOTICE_EVERY = 60.0


@attrs.frozen
class LocalOptions:
    #: seconds between SIGTERM and SIGKILL when a job is terminated
    kill_grace: float = 2.0
    #: what happens to running jobs when the agent ends: "terminate" or "keep"
    on_disconnect: str = "terminate"


class _File:
    """One process's output file, read as the keeper writes it."""

    __slots__ = ("path", "fd", "offset", "splitter", "size", "dropped", "gaps")

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.fd: Optional[int] = None
        #: bytes read so far (the lines before it are complete or held in the splitter)
        self.offset = offset
        self.splitter = LineSplitter()
        #: what the keeper last said its size is
        self.size = offset
        #: output the disk had no room for, as the keeper last told: [bytes, lines]
        self.dropped = [0, 0]
        #: where in the file output was dropped, not yet told to the client: [offset, bytes, lines]
        self.gaps: List[List[int]] = []

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
                 "reported", "done", "finished", "start_error", "recorded", "spawn_line", "refused", "error", "lost",
                 "waiting")

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
        #: set when the keeper has recorded the job in its journal (or refused it)
        self.recorded = trio.Event()
        #: the spawn request, until the keeper recorded it (sent again to a keeper that
        #: replaced one that died before it recorded the job)
        self.spawn_line: Optional[bytes] = None
        #: why the keeper refused the job (it did not record it: nothing of it ran)
        self.refused: Optional[str] = None
        #: why the job ended as it did, when not by itself (the keeper says)
        self.error: Optional[str] = None
        #: rank -> why its exit status is not known
        self.lost: Dict[int, str] = {}
        #: while its submission is not answered: the keeper's news of it, held (None after)
        self.waiting: Optional[List[dict]] = None


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

    async def _resend(self, record: _Job) -> None:
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

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> int:
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
        job_id = self._add_job(spec, launch.name, launch.path, launch.cwd, launch.num_procs, _PENDING, key)
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
        return job_id

    def _withdraw(self, record: _Job) -> None:
        """A job the keeper refused (it recorded nothing, started nothing) leaves the model."""
        self._jobs.pop(record.key, None)
        for file in record.files.values():
            file.close()
        record.finished.set()
        try:
            self.model.remove(record.key)
        except UnknownElement:
            pass

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
        request = {"op": "signal", "key": record.key, "action": action, "grace": self.options.kill_grace}
        try:
            await (await self._keeper_now()).send(request)
        except KeeperError:
            # the keeper died just now: the one replacing it takes the request
            try:
                await (await self._keeper_now()).send(request)
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
                if info is None and record.state == "SUBMITTING":
                    # recorded in the store, not yet by the keeper: it was never answered OK
                    why = ("the keeper has no record of the job: the agent ended before the keeper recorded it, "
                           "so it never ran")
                elif info is None:
                    why = "the keeper has no record of the job: its files were removed"
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
            job.recorded.set()
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
                if pids:
                    self.model.update(job.key, {K.NATIVE_ID: str(pids[0])})
            self._take_dropped(job, info.get("dropped") or {})
            for file in job.files.values():  # what lies before the delivered output was told already
                file.gaps = [gap for gap in file.gaps if gap[0] >= file.offset]
            for rank, why in (info.get("lost_codes") or {}).items():
                job.lost[int(rank)] = why
            job.error = info.get("error")
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
        messages = self._withhold(messages)
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

    def _withhold(self, messages: List[dict]) -> List[dict]:
        """The news of jobs whose submission has not been answered yet waits until it has
        been (see :meth:`submit`): a client first hears of a job as the keeper recorded it,
        then of its start and end, as when the answer came before the keeper's."""
        kept = None
        for index, message in enumerate(messages):
            key = message.get("key")
            record = self._jobs.get(key) if isinstance(key, int) else None
            if record is not None and record.waiting is not None and message.get("op") != "recorded" \
                    and not (message.get("op") == "failed" and message.get("refused")):
                if kept is None:
                    kept = messages[:index]
                record.waiting.append(message)
                record.recorded.set()  # news of it: the keeper has it (a keeper from before
                #                        "recorded" existed says "spawned" first)
            elif kept is not None:
                kept.append(message)
        return messages if kept is None else kept

    def _answered(self, record: _Job) -> None:
        """A submission has been answered: its job's news that waited goes to the model, once
        the client has been told of the job."""
        waiting, record.waiting = record.waiting, None
        if waiting:
            async def hear() -> None:
                await trio.lowlevel.checkpoint()
                self._notices(waiting)

            self._spawn_soon(hear)

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
        if op == "recorded":
            for key in message.get("keys", ()):
                recorded = self._jobs.get(key) if isinstance(key, int) else None
                if recorded is not None:
                    recorded.recorded.set()
        elif op == "spawned" and record is not None:
            record.pids = [int(p) for p in message.get("pids", [])]
            record.started = True
            record.recorded.set()
            model = self.model
            with model.batch():
                for index, pid in enumerate(record.pids):
                    model.update(record.process_keys[index], {K.PID: str(pid)})
            with model.batch():
                live = [p for i, p in enumerate(record.process_keys) if not record.reported[i]]
                model.update_many(live, _RUNNING)
                # the job's own id on this host, its process group (led by process 0), comes
                # with its RUNNING: one change of the job
                model.update(record.key, {**_RUNNING, K.NATIVE_ID: str(record.pids[0])} if record.pids else _RUNNING)
            if record.canceled:  # terminated while its processes were being started
                self._spawn_soon(self._signal, record, "terminate")
        elif op == "failed" and record is not None:
            if message.get("refused") and not record.recorded.is_set():
                record.refused = message.get("error") or "the keeper could not record the job"
                record.recorded.set()
                return
            record.start_error = message.get("error") or "the processes could not be started"
            record.recorded.set()
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
                if message.get("code") is None:
                    record.lost[rank] = message.get("lost") or "its exit status is not known"
                    self._settle(record)
                else:
                    record.codes[rank] = int(message["code"])
                    self._settle(record)
        elif op == "done" and record is not None:
            record.done = True
            if message.get("error"):
                record.error = message["error"]
            self._settle(record)
        elif op == "dropped" and record is not None:
            self._take_dropped(record, {f"{message['rank']}.{message['stream']}":
                                        [message.get("bytes", 0), message.get("lines", 0), message.get("at", 0)]})
        elif op == "error":
            log.warning("the keeper refused a request: %s", message.get("error"))

    def _take_dropped(self, record: _Job, dropped: Dict[str, list]) -> None:
        """The keeper's totals of output the disk had no room for: what is new is told to the
        client where it happened in the stream (see :meth:`_read`), and to every client once
        in a while."""
        grew = False
        for name, (size, lines, at) in dropped.items():
            rank_text, _, stream = name.partition(".")
            file = record.files.get((int(rank_text), stream))
            if file is None or size <= file.dropped[0]:
                continue
            file.gaps.append([int(at), int(size) - file.dropped[0], int(lines) - file.dropped[1]])
            file.dropped = [int(size), int(lines)]
            grew = True
            self._mark(record.key, int(rank_text), stream)
        now = trio.current_time()
        if grew and (self._drops_told_at is None or now - self._drops_told_at >= _DROP_NOTICE_EVERY):
            self._drops_told_at = now
            self.context.notify("WARNING", f"the disk of {self._directory} has no room for the output of local jobs: "
                                           "what does not fit is dropped (each process's output says how much), the "
                                           "jobs run on, and new local jobs are refused until there is room")

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
            if file.gaps:
                self._tell_gap(file, process, stream)
            step = limit
            if file.gaps and file.gaps[0][0] > file.offset:
                step = min(limit, file.gaps[0][0] - file.offset)  # up to the gap, then the note
            data = file.read(step)
            if data is None:
                if file.gaps and final:
                    self._tell_gap(file, process, stream, anyway=True)
                return
            if data:
                text = file.splitter.feed_text(data)
                if text is not None and process in model:
                    model.output(process, stream, text, file.consumed)
            if file.gaps and file.gaps[0][0] <= file.offset:
                continue
            if not data or len(data) < step or not final:
                break
        if file.gaps and final:
            self._tell_gap(file, process, stream, anyway=True)
        if final:
            text = file.splitter.flush_text()
            if text is not None and process in model:
                model.output(process, stream, text, file.offset)
        elif file.offset < file.size:
            self._mark(record.key, rank, stream)
        if self._keeper is not None and not self._keeper.closed and not self._closing:
            self._spawn_soon(self._keeper_read, record.key, rank, stream, file.offset)

    def _tell_gap(self, file: _File, process: int, stream: str, anyway: bool = False) -> None:
        """Where output was dropped for want of disk space, say so, in order: the lines
        before the gap, then a note on the process's stderr."""
        while file.gaps and (anyway or file.gaps[0][0] <= file.offset):
            _at, size, lines = file.gaps.pop(0)
            if process not in self.model:
                continue
            before = file.splitter.flush_text()
            if before is not None:
                self.model.output(process, stream, before, file.offset)
            self.model.output(process, "stderr", f"[proxy-agent: {lines} lines ({size} bytes) of {stream} were dropped "
                                                  f"here: the disk of {self._directory} had no room for them]")

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
            if (code is None and rank not in record.lost) or record.reported[rank]:
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
        if code is None and rank in record.lost:
            self.model.update(process, state_attrs(STATE_TABLE, "LOST"))
            return
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
        if record.canceled and record.error is None:
            attrs_ = state_attrs(STATE_TABLE, "TERMINATED")
        elif record.error is not None:
            # the keeper says why the job ended so (a keeper that died while starting it...)
            attrs_ = state_attrs(STATE_TABLE, "LOST")
            attrs_[K.MESSAGE] = record.error
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
                attrs_.update(_job_end_status(record.codes))
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
                # a submission still waiting is answered: the store has it, and the next
                # agent finds it running, or reports that it never ran
                record.recorded.set()
            self._keeper_back.set()
            if self._temporary and self._directory is not None and keeper is not None and keeper.closed:
                shutil.rmtree(self._directory, ignore_errors=True)
            self._closed.set()


# --------------------------------------------------------------------------- helpers

#: JSON as the keeper reads it (compact)
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _job_end_status(codes: List[Optional[int]]) -> Dict[str, str]:
    """How a job whose processes failed ended, as one process's would read: the highest exit
    status among them, else the signal that ended the first one killed (as ``srun`` reports)."""
    exited = [code for code in codes if code is not None and code > 0]
    if exited:
        return {K.EXIT_CODE: str(max(exited))}
    killed = [code for code in codes if code is not None and code < 0]
    return {K.SIGNAL: signal_name(-killed[0])} if killed else {}


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
