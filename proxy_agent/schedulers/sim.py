"""The simulated scheduler: a synthetic cluster for demos, tests and benchmarks.

Everything is drawn from ``random.Random(options.sim_seed)``, so the same
seed gives the same cluster:

* one machine ``sim`` with ``options.sim_nodes`` nodes ``n00000``,
  ``n00001``... (``nodeState``, ``nodeNumber``, ``cpus``; a few start DOWN);
* queues ``batch``, ``debug`` and ``long``, each spanning the whole machine (``totalSlots``
  is the CPUs of the nodes that are UP; the service keeps their waiting and running jobs and
  free slots, see :mod:`proxy_agent.service.figures`);
* ``options.sim_jobs`` existing jobs spread over the queues in mixed states
  (pending, held, running, suspended, finished, failed, canceled), named and
  owned from small pools of names and users, as on a real cluster.

Existing jobs are other people's batch jobs: a batch scheduler lists them but
knows nothing of their processes, so only a share of them
(``process_share``, 10% by default) come with process elements, most with
exactly one.  This keeps a 100,000-job model cheap to deliver (one
NEW_PROCESS event per job is the protocol's rule and the dominant cost).

Submitted jobs run nothing: they go STARTING -> RUNNING -> COMPLETED
(FINISHED) in simulated time, 0.2 s pending, then 1 to 2 s running with a
few synthetic output lines per process.  ``time_scale`` multiplies every
simulated duration (0.01 makes a job take 12 to 22 ms).  Their timing is
drawn from a second generator seeded from ``sim_seed``, so the same
submissions behave the same way whatever the churn does.

``options.sim_churn`` events per (real) second, applied in ticks of 10 ms,
flip nodes UP and DOWN and move existing jobs along (pending -> running ->
completed, some suspended and resumed, held jobs released); each job that
completes is replaced by a new pending one.  Which events happen follows the
seed; how many fall into each tick follows the clock.  Completed jobs are
removed after ``retention`` simulated seconds (30) so the model stays
bounded, at about ``sim_jobs`` plus the jobs completed in the last retention
period.  Without churn the existing jobs stay as generated.

Job states are short native codes, as a batch system's: PD (pending), H
(held), R (running), S (suspended), CD (completed), F (failed) and CA
(cancelled); :data:`STATE_TABLE` maps them into the service's vocabulary.

``options.submit_delay`` seconds (0 by default) pass before a submission is taken, as a
batch system's submit command may take (a slow ``qsub``): the job appears once they have
passed.  Clients can be tried against a slow submission beside fast ones with it.

Terminate cancels any job that has not ended.  Hold and release act on jobs
that have not started, suspend and resume on running ones.  Moving a job that
has not started gives it the new queue as parent (:meth:`ServiceModel.move`).
"""

from __future__ import annotations

import gc
import heapq
import random
import sys
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import attrs
import trio

from ..service.attributes import AttrInfo, ValueType
from ..service.jobs import ErrorKind, JobError, JobSpec, JobState, StateTable, SubmitError
from ..service.model import K, Kind, ServiceModel, UnknownElement
from ..service.backend import Backend, BackendContext, Submitted
from .common import current_user

if TYPE_CHECKING:  # pragma: no cover
    import argparse

__all__ = ["SimBackend", "SimOptions", "MAX_PROCS", "QUEUE_NAMES", "STATE_TABLE", "TICK"]

#: Largest ``jobNumProcs`` a simulated submission may ask for.
MAX_PROCS = 4096
#: Queues of the simulated cluster; submissions without ``queueId`` go to the first.
QUEUE_NAMES = ("batch", "debug", "long")
#: Churn is applied in ticks of this many seconds.
TICK = 0.01

MACHINE_NAME = "sim"
# Simulated durations of a submitted job, in simulated seconds.
PENDING_TIME = 0.2
RUN_TIME_MIN = 1.0
RUN_TIME_SPREAD = 1.0
OUTPUT_LINES = 3

# Pools that existing jobs draw from.  Module constants: every job shares these strings.
_JOB_NAMES = tuple(
    sys.intern(n)
    for n in ("lammps", "gromacs", "wrf", "vasp", "namd", "cp2k", "a.out", "train.py", "sim.sh", "analysis")
)
_USERS = tuple(sys.intern(u) for u in ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"))
_QUEUE_WEIGHTS = (70, 10, 20)
_NUM_PROCS = ("1", "2", "4", "8", "16")
_NUM_PROCS_WEIGHTS = (85, 5, 5, 3, 2)
_CPUS = ("32", "64", "128")
_NODE_DOWN_SHARE = 0.03
#: The simulated scheduler's own state codes, and what they mean.
STATE_TABLE = StateTable(
    "sim",
    {
        "PD": JobState.QUEUING,
        "H": JobState.HOLD,
        "R": JobState.RUNNING,
        "S": JobState.SUSPENDED,
        "CD": JobState.FINISHED,
        "F": JobState.FAILED,
        "CA": JobState.KILLED,
    },
    not_given={
        JobState.PREPARING: "simulated jobs start straight from the queue",
        JobState.FINISHING: "simulated jobs end at once",
        JobState.DELETED: "simulated jobs end in one of the three states above",
    },
)
PENDING, HELD, RUNNING, SUSPENDED, COMPLETED, FAILED, CANCELLED = "PD", "H", "R", "S", "CD", "F", "CA"
_ENDED = frozenset((COMPLETED, FAILED, CANCELLED))
_NOT_STARTED = frozenset((PENDING, HELD))
#: (state, native state) attribute values per native code, shared by every element
_STATE = {native: (sys.intern(STATE_TABLE.map(native).value), sys.intern(native)) for native, _ in STATE_TABLE}

# Native states of existing jobs, with weights.
_JOB_MIX: Tuple[Tuple[str, int], ...] = (
    (PENDING, 30),
    (HELD, 5),
    (RUNNING, 45),
    (SUSPENDED, 3),
    (COMPLETED, 12),
    (FAILED, 3),
    (CANCELLED, 2),
)


def _state(native: str) -> Dict[str, str]:
    state, code = _STATE[native]
    return {K.STATE: state, K.NATIVE_STATE: code}


@attrs.frozen
class SimOptions:
    nodes: int = 16
    jobs: int = 0
    churn: float = 0.0
    seed: int = 1
    #: simulated durations are multiplied by this (0.1: jobs run ten times faster)
    time_scale: float = 1.0
    #: share of existing jobs that list their processes
    process_share: float = 0.1
    #: seconds each submission takes before the job exists (a slow submit command)
    submit_delay: float = 0.0

#: Jobs created between two checkpoints while the cluster is built.
_POPULATE_STEP = 20000
#: Jobs and nodes from which a cluster is collected once built (see :meth:`SimBackend.run`).
_BIG_CLUSTER = 50000

# Timer actions.
_START, _STEP, _REMOVE = 0, 1, 2


class _Submitted:
    """Progress of one submitted job (existing jobs need no such record)."""

    __slots__ = ("gen", "name", "steps_left", "step_time", "pending_time", "nodes")

    def __init__(self, name: str, pending_time: float, run_time: float, nodes: List[int]) -> None:
        #: bumped whenever the job's timers become stale (hold, suspend, terminate)
        self.gen = 0
        self.name = name
        self.steps_left = OUTPUT_LINES + 1
        self.step_time = run_time / (OUTPUT_LINES + 1)
        self.pending_time = pending_time
        self.nodes = nodes


class SimBackend(Backend):
    """A deterministic synthetic cluster (see the module documentation)."""

    name = "sim"
    summary = "a deterministic simulated cluster for demos, client development and scale tests"
    #: every queue spans the whole machine: its slots are the CPUs of the nodes that are UP
    queue_load = "shared"

    def __init__(
        self,
        model: ServiceModel,
        options: Optional[SimOptions] = None,
        context: Optional[BackendContext] = None,
        *,
        retention: float = 30.0,
    ) -> None:
        super().__init__(model, options, context)
        options = self.options
        if not options.time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {options.time_scale!r}")
        if not 0 <= options.process_share <= 1:
            raise ValueError(f"process_share must be between 0 and 1, got {options.process_share!r}")
        self.time_scale = float(options.time_scale)
        self.process_share = options.process_share
        self.retention = retention
        self.user = current_user()
        self._rng = random.Random(options.seed)
        self._job_rng = random.Random(f"{options.seed}/submitted")
        self.machine_id: Optional[int] = None
        self.node_ids: range = range(0)
        self.queue_ids: Dict[str, int] = {}
        self._node_up = bytearray()
        self._node_cpus: List[int] = []
        #: CPUs of the nodes that are UP: every queue's totalSlots
        self._slots = 0
        #: keys of existing (and churn-made) jobs that have not ended, for churn to pick from;
        #: entries that ended some other way are dropped when picked
        self._active: List[int] = []
        self._submitted: Dict[int, _Submitted] = {}
        self._timers: List[Tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._wakeup = trio.Event()
        self._churn_carry = 0.0

    # ------------------------------------------------------------------ options

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("simulated scheduler (sim)")
        group.add_argument("--sim-nodes", type=int, default=16, metavar="N",
                           help="number of nodes (default: %(default)s)")
        group.add_argument("--sim-jobs", type=int, default=0, metavar="N",
                           help="jobs present at start (default: %(default)s)")
        group.add_argument("--sim-churn", type=float, default=0.0, metavar="EVENTS_PER_SECOND",
                           help="random node and job changes per second (default: %(default)s)")
        group.add_argument("--sim-seed", type=int, default=1, metavar="N",
                           help="random seed: the same seed gives the same cluster (default: %(default)s)")
        group.add_argument("--sim-time-scale", type=float, default=1.0, metavar="FACTOR",
                           help="stretch (>1) or shrink (<1) job durations (default: %(default)s)")
        group.add_argument("--sim-submit-delay", type=float, default=0.0, metavar="SECONDS",
                           help="how long each submission takes, as a slow submit command would "
                                "(default: %(default)s)")
        group.add_argument("--sim-process-share", type=float, default=0.1, metavar="FRACTION",
                           help="share of existing jobs that list their processes (default: %(default)s)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> SimOptions:
        nodes = getattr(args, "sim_nodes", 16)
        jobs = getattr(args, "sim_jobs", 0)
        churn = getattr(args, "sim_churn", 0.0)
        scale = getattr(args, "sim_time_scale", 1.0)
        share = getattr(args, "sim_process_share", 0.1)
        delay = getattr(args, "sim_submit_delay", 0.0)
        if not 0 <= nodes <= 1_000_000:
            raise ValueError(f"--sim-nodes must be between 0 and 1000000, got {nodes}")
        if not 0 <= jobs <= 10_000_000:
            raise ValueError(f"--sim-jobs must be between 0 and 10000000, got {jobs}")
        if not 0 <= churn <= 1_000_000:
            raise ValueError(f"--sim-churn must be between 0 and 1000000 events per second, got {churn:g}")
        if not 0 < scale <= 1_000_000:
            raise ValueError(f"--sim-time-scale must be a positive factor, got {scale:g}")
        if not 0 <= share <= 1:
            raise ValueError(f"--sim-process-share must be between 0 and 1, got {share:g}")
        if not 0 <= delay <= 3600:
            raise ValueError(f"--sim-submit-delay must be between 0 and 3600 seconds, got {delay:g}")
        return SimOptions(nodes=nodes, jobs=jobs, churn=churn, seed=getattr(args, "sim_seed", 1),
                          time_scale=scale, process_share=share, submit_delay=delay)

    @classmethod
    def default_options(cls) -> SimOptions:
        return SimOptions()

    # ------------------------------------------------------------------ interface

    def attributes(self) -> List[AttrInfo]:
        return [
            AttrInfo(K.NUM_PROCS, ValueType.INTEGER, "Processes", "How many processes the job runs",
                     default="1", minimum="1", maximum=str(MAX_PROCS), settable=True),
            AttrInfo(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
            AttrInfo(K.HOLD, ValueType.BOOLEAN, "Hold", "Submit the job held", default="false", settable=True),
        ]

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        if self.machine_id is None:
            # in steps, so that a big cluster's construction keeps no client waiting for
            # the answers that do not need it (INIT)
            enabled = gc.isenabled()
            gc.disable()
            try:
                with self.model.batch():
                    for _ in self._populate():
                        await trio.lowlevel.checkpoint()
            finally:
                if enabled:
                    gc.enable()
            if enabled and self.options.jobs + self.options.nodes >= _BIG_CLUSTER:
                # Everything just made is in the youngest generation.  One full collection
                # now, before any client is served, makes it old; else the collector would
                # walk the whole cluster at some later moment, in the middle of serving one.
                gc.collect()
        task_status.started()
        await self._loop()

    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> Submitted:
        if self.machine_id is None:
            raise SubmitError("the simulated scheduler is not running", ErrorKind.UNAVAILABLE)
        num_procs = spec.num_procs
        if not 1 <= num_procs <= MAX_PROCS:
            raise SubmitError(
                f"the simulated scheduler runs 1 to {MAX_PROCS} processes per job, not {num_procs}",
                ErrorKind.BAD_REQUEST,
            )
        if queue not in self.queue_ids.values():
            raise SubmitError("the queue is not a queue of the simulated cluster", ErrorKind.NO_SUCH_QUEUE)
        if not spec.executable:
            raise SubmitError("no executable given", ErrorKind.BAD_REQUEST)
        if self.options.submit_delay:
            await trio.sleep(self.options.submit_delay)
        name = spec.display_name
        rng = self._job_rng
        pending_time = PENDING_TIME
        run_time = RUN_TIME_MIN + RUN_TIME_SPREAD * rng.random()
        nodes = [self._pick_node(rng) for _ in range(num_procs)]
        native = HELD if spec.hold else PENDING
        attrs_ = {
            K.CLIENT_REF: spec.client_ref,
            K.NAME: name,
            **_state(native),
            K.QUEUE: queue,
            K.NUM_PROCS: str(num_procs),
            K.EXECUTABLE: spec.executable,
            K.ARGUMENTS: spec.arguments,
            K.USER: self.user,
            K.WORKING_DIR: spec.working_dir,
        }
        model = self.model
        job_id, _ = model.add_job(queue, attrs_, [_state(native)] * num_procs, owner=self.name, key=key)
        record = _Submitted(name, pending_time, run_time, nodes)
        self._submitted[job_id] = record
        if not spec.hold:
            self._schedule(pending_time, _START, job_id, record.gen)
        return Submitted(job_id)

    async def terminate(self, job: int) -> None:
        native = self._native(job)
        if native in _ENDED:
            raise JobError("the job has already ended", ErrorKind.OPERATION_FAILED)
        record = self._submitted.get(job)
        if record is not None:
            record.gen += 1
        self._complete(job, CANCELLED, signal="SIGTERM")

    async def hold(self, job: int, held: bool) -> None:
        native = self._native(job)
        record = self._submitted.get(job)
        if native not in _NOT_STARTED:
            raise JobError(
                f"the job is {STATE_TABLE.map(native).value}; only a job that has not started can be held or released",
                ErrorKind.OPERATION_FAILED,
            )
        if held and native != HELD:
            self.model.update(job, _state(HELD))
            if record is not None:
                record.gen += 1
        elif not held and native == HELD:
            self.model.update(job, _state(PENDING))
            if record is not None:
                record.gen += 1
                self._schedule(record.pending_time, _START, job, record.gen)

    async def suspend(self, job: int, suspended: bool) -> None:
        native = self._native(job)
        record = self._submitted.get(job)
        if suspended:
            if native == SUSPENDED:
                return
            if native != RUNNING:
                raise JobError(
                    f"the job is {STATE_TABLE.map(native).value}; only a running job can be suspended",
                    ErrorKind.OPERATION_FAILED,
                )
            self._set_running(job, SUSPENDED)
            if record is not None:
                record.gen += 1  # the current step starts over on resume
        else:
            if native == RUNNING:
                return
            if native != SUSPENDED:
                raise JobError(
                    f"the job is {STATE_TABLE.map(native).value}; only a suspended job can be resumed",
                    ErrorKind.OPERATION_FAILED,
                )
            self._set_running(job, RUNNING)
            if record is not None:
                record.gen += 1
                self._schedule(record.step_time, _STEP, job, record.gen)

    async def move(self, job: int, queue: int) -> None:
        if queue not in self.queue_ids.values():
            raise JobError("the queue is not a queue of the simulated cluster", ErrorKind.NO_SUCH_QUEUE)
        native = self._native(job)
        if native not in _NOT_STARTED:
            raise JobError(
                f"the job is {STATE_TABLE.map(native).value}; only a job that has not started can change queues",
                ErrorKind.OPERATION_FAILED,
            )
        with self.model.batch():
            self.model.move(job, queue)
            self.model.update(job, {K.QUEUE: queue})

    # ------------------------------------------------------------------ the initial model

    def populate(self) -> None:
        """Create the machine, nodes, queues and existing jobs (done by :meth:`run`)."""
        enabled = gc.isenabled()
        gc.disable()  # hundreds of thousands of new objects, none of them garbage
        try:
            with self.model.batch():
                for _ in self._populate():
                    pass
        finally:
            if enabled:
                gc.enable()

    def _populate(self) -> Iterator[None]:
        """Build the cluster, yielding now and then (see :meth:`run`)."""
        model = self.model
        rng = self._rng
        count = self.options.nodes
        owner = self.name
        self.machine_id = model.add(
            Kind.MACHINE, None,
            {K.NAME: MACHINE_NAME, K.STATE: "UP", K.NUM_NODES: str(count), K.BACKEND: owner},
            owner=owner,
        )
        width = max(5, len(str(max(count - 1, 0))))
        cpus = rng.choices(_CPUS, k=count)
        up = bytearray(1 if rng.random() >= _NODE_DOWN_SHARE else 0 for _ in range(count))
        if count:
            self.node_ids = model.add_many(
                Kind.NODE,
                self.machine_id,
                [
                    {
                        K.NAME: f"n{i:0{width}d}",
                        K.STATE: "UP" if up[i] else "DOWN",
                        K.NUMBER: str(i),
                        K.CPUS: cpus[i],
                    }
                    for i in range(count)
                ],
                owner=owner,
            )
        self._node_up = up
        self._node_cpus = [int(c) for c in cpus]
        self._slots = sum(c for c, is_up in zip(self._node_cpus, up) if is_up)
        for name in QUEUE_NAMES:
            queue_id = model.add(
                Kind.QUEUE, None,
                {K.NAME: name, K.STATE: "NORMAL", K.BACKEND: owner,
                 K.DEFAULT: "true" if name == QUEUE_NAMES[0] else "false", K.TOTAL_SLOTS: str(self._slots)},
                owner=owner,
            )
            self.queue_ids[name] = queue_id
        self.default_queue = self.queue_ids[QUEUE_NAMES[0]]
        yield
        yield from self._add_existing_jobs(self.options.jobs)

    def _add_existing_jobs(self, count: int) -> Iterator[None]:
        """``count`` jobs in mixed states, in steps of _POPULATE_STEP jobs: each step's jobs
        drawn, added with one add_many per queue, then processes for a share of them.  Only
        one step's draws are held at a time (a million jobs' would be a hundred megabytes)."""
        if count <= 0:
            return
        rng = self._rng
        queues = [self.queue_ids[name] for name in QUEUE_NAMES]
        mix_weights = [w for _, w in _JOB_MIX]
        # Jobs with equal attributes share one attribute dict, and so one row of the model.
        shared: Dict[tuple, dict] = {}
        rows: Dict[int, tuple] = {}
        for start in range(0, count, _POPULATE_STEP):
            k = min(_POPULATE_STEP, count - start)
            mix_index = rng.choices(range(len(_JOB_MIX)), weights=mix_weights, k=k)
            queue_index = rng.choices(range(len(queues)), weights=_QUEUE_WEIGHTS, k=k)
            names = rng.choices(range(len(_JOB_NAMES)), k=k)
            users = rng.choices(range(len(_USERS)), k=k)
            procs = rng.choices(range(len(_NUM_PROCS)), weights=_NUM_PROCS_WEIGHTS, k=k)
            per_queue: List[List[dict]] = [[] for _ in queues]
            per_queue_meta: List[List[Tuple[int, int]]] = [[] for _ in queues]
            for i in range(k):
                key = (mix_index[i], queue_index[i], names[i], users[i], procs[i])
                attrs_ = shared.get(key)
                if attrs_ is None:
                    native = _JOB_MIX[key[0]][0]
                    attrs_ = shared[key] = {
                        K.NAME: _JOB_NAMES[key[2]],
                        **_state(native),
                        K.QUEUE: queues[key[1]],
                        K.NUM_PROCS: _NUM_PROCS[key[4]],
                        K.USER: _USERS[key[3]],
                    }
                per_queue[key[1]].append(attrs_)
                per_queue_meta[key[1]].append((key[0], key[4]))
            yield
            for q, queue_id in enumerate(queues):
                yield from self._add_step(queue_id, per_queue[q], per_queue_meta[q], rows)

    def _add_step(self, queue_id: int, attrs_list: List[dict], meta: List[Tuple[int, int]],
                  rows: Dict[int, tuple]) -> Iterator[None]:
        model = self.model
        rng = self._rng
        listed = self.process_share
        churn = self.options.churn > 0
        if attrs_list:
            ids = model.add_many(Kind.JOB, queue_id, attrs_list, owner=self.name, rows=rows)
            for job_id, (mix, nprocs) in zip(ids, meta):
                native = _JOB_MIX[mix][0]
                if native not in _ENDED:
                    self._active.append(job_id)
                if listed and rng.random() < listed:
                    self._add_processes(job_id, int(_NUM_PROCS[nprocs]), native, rng)
                if native in _ENDED and churn:
                    # they ended at some point of the last retention period
                    self._schedule(self.retention * rng.random(), _REMOVE, job_id, 0)
            yield

    def _add_processes(self, job_id: int, count: int, native: str, rng: random.Random) -> None:
        process = _state(native)
        if native not in _NOT_STARTED and self.node_ids:
            process[K.NODE] = self.node_ids[self._pick_node(rng)]
        if native in _ENDED:
            process[K.EXIT_CODE] = "0" if native == COMPLETED else "1"
        self.model.add_many(Kind.PROCESS, job_id, [process] * count, owner=self.name)

    # ------------------------------------------------------------------ time

    def _schedule(self, sim_delay: float, action: int, job_id: int, gen: int) -> None:
        due = trio.current_time() + sim_delay * self.time_scale
        self._seq += 1
        heapq.heappush(self._timers, (due, self._seq, action, job_id, gen))
        if self._timers[0][1] == self._seq:
            self._wakeup.set()

    async def _loop(self) -> None:
        last_tick = trio.current_time()
        next_tick = last_tick + TICK
        while True:
            churn = self.options.churn
            now = trio.current_time()
            timers = self._timers
            with self.model.batch():  # one wake-up of the subscribers per tick
                while timers and timers[0][0] <= now:
                    _, _, action, job_id, gen = heapq.heappop(timers)
                    self._fire(action, job_id, gen)
                if churn > 0 and now >= next_tick:
                    # catch up after a slow tick, but never by more than a second's worth
                    self._churn_carry += churn * min(now - last_tick, 1.0)
                    last_tick = now
                    next_tick = now + TICK
                    events = int(self._churn_carry)
                    self._churn_carry -= events
                    for _ in range(events):
                        self._churn_event()
            wake = timers[0][0] if timers else float("inf")
            if churn > 0:
                wake = min(wake, next_tick)
            with trio.move_on_at(wake):
                await self._wakeup.wait()
            if self._wakeup.is_set():
                self._wakeup = trio.Event()

    def _fire(self, action: int, job_id: int, gen: int) -> None:
        if action == _REMOVE:
            if job_id in self.model and self.model.attr(job_id, K.NATIVE_STATE) in _ENDED:
                self.model.remove(job_id)
            return
        record = self._submitted.get(job_id)
        if record is None or record.gen != gen or job_id not in self.model:
            return  # stale: held, suspended, terminated or removed since
        if action == _START:
            self._start_submitted(job_id, record)
        elif action == _STEP:
            self._step_submitted(job_id, record)

    def _start_submitted(self, job_id: int, record: _Submitted) -> None:
        model = self.model
        with model.batch():
            model.update(job_id, _state(RUNNING))
            for index, eid in enumerate(model.processes(job_id)):
                attrs_ = {**_state(RUNNING), K.PID: str(10000 + (eid % 50000))}
                if self.node_ids:
                    attrs_[K.NODE] = self.node_ids[record.nodes[index]]
                model.update(eid, attrs_)
        self._schedule(record.step_time, _STEP, job_id, record.gen)

    def _step_submitted(self, job_id: int, record: _Submitted) -> None:
        record.steps_left -= 1
        processes = self.model.processes(job_id)
        if record.steps_left > 0:
            step = OUTPUT_LINES + 1 - record.steps_left
            for index, eid in enumerate(processes):
                self.model.output(eid, "stdout", f"{record.name} rank {index}: step {step} of {OUTPUT_LINES}")
            self._schedule(record.step_time, _STEP, job_id, record.gen)
            return
        with self.model.batch():
            self.model.update_many(processes, {**_state(COMPLETED), K.EXIT_CODE: "0"})
            self.model.update(job_id, {**_state(COMPLETED), K.EXIT_CODE: "0"})
        del self._submitted[job_id]
        self._schedule(self.retention, _REMOVE, job_id, 0)

    # ------------------------------------------------------------------ churn

    def _churn_event(self) -> None:
        rng = self._rng
        if self._node_up and rng.random() < 0.25:
            self._flip_node(rng.randrange(len(self._node_up)))
            return
        active = self._active
        while active:
            i = rng.randrange(len(active))
            job_id = active[i]
            native = self._existing_native(job_id)
            if native is not None and native not in _ENDED:
                self._advance(i, job_id, native)
                return
            active[i] = active[-1]  # ended (or removed) some other way: forget it
            active.pop()
        self._arrival()

    def _flip_node(self, index: int) -> None:
        up = self._node_up[index] = 0 if self._node_up[index] else 1
        self._slots += self._node_cpus[index] if up else -self._node_cpus[index]
        with self.model.batch():
            self.model.update(self.node_ids[index], {K.STATE: "UP" if up else "DOWN"})
            self.model.update_many(self.queue_ids.values(), {K.TOTAL_SLOTS: str(self._slots)})

    def _existing_native(self, job_id: int) -> Optional[str]:
        if job_id not in self.model:
            return None
        native = self.model.attr(job_id, K.NATIVE_STATE)
        return native if isinstance(native, str) else None

    def _advance(self, index: int, job_id: int, native: str) -> None:
        """Move one existing job one step along its life."""
        rng = self._rng
        if native == HELD:
            self.model.update(job_id, _state(PENDING))
        elif native in (PENDING, SUSPENDED):
            self._set_running(job_id, RUNNING, rng)
        elif rng.random() < 0.1:
            self._set_running(job_id, SUSPENDED, rng)
        else:
            self._complete(job_id, COMPLETED if rng.random() < 0.8 else FAILED)
            active = self._active
            active[index] = active[-1]
            active.pop()
            self._arrival()

    def _arrival(self) -> None:
        """A new pending job in a random queue (keeps the population steady under churn)."""
        rng = self._rng
        queue_id = self.queue_ids[rng.choices(QUEUE_NAMES, weights=_QUEUE_WEIGHTS)[0]]
        nprocs = rng.choices(_NUM_PROCS, weights=_NUM_PROCS_WEIGHTS)[0]
        job_id = self.model.add(
            Kind.JOB,
            queue_id,
            {
                K.NAME: rng.choice(_JOB_NAMES),
                **_state(PENDING),
                K.QUEUE: queue_id,
                K.NUM_PROCS: nprocs,
                K.USER: rng.choice(_USERS),
            },
            owner=self.name,
        )
        if self.process_share and rng.random() < self.process_share:
            self._add_processes(job_id, int(nprocs), PENDING, rng)
        self._active.append(job_id)

    # ------------------------------------------------------------------ shared steps

    def _set_running(self, job_id: int, native: str, rng: Optional[random.Random] = None) -> None:
        """Job (and its processes) to R or S."""
        model = self.model
        with model.batch():
            model.update(job_id, _state(native))
            processes = model.processes(job_id)
            if not processes:
                return
            model.update_many(processes, _state(native))
            if rng is not None and self.node_ids:
                for eid in processes:
                    if model.attr(eid, K.NODE) is None:
                        model.update(eid, {K.NODE: self.node_ids[self._pick_node(rng)]})

    def _complete(self, job_id: int, native: str, signal: Optional[str] = None) -> None:
        """Job to an end state; its unfinished processes with it."""
        model = self.model
        with model.batch():
            for eid in model.processes(job_id):
                process_native = model.attr(eid, K.NATIVE_STATE)
                if process_native in _ENDED:
                    continue
                attrs_ = _state(native)
                if signal is not None and process_native not in _NOT_STARTED:
                    attrs_[K.SIGNAL] = signal
                elif signal is None:
                    attrs_[K.EXIT_CODE] = "0" if native == COMPLETED else "1"
                model.update(eid, attrs_)
            model.update(job_id, _state(native))
        self._submitted.pop(job_id, None)
        self._schedule(self.retention, _REMOVE, job_id, 0)

    def _native(self, job_id: int) -> str:
        try:
            self.model.find(job_id, Kind.JOB)
        except UnknownElement:
            raise JobError("no such job", ErrorKind.NO_SUCH_JOB) from None
        native = self.model.attr(job_id, K.NATIVE_STATE)
        return native if isinstance(native, str) and native else PENDING

    def _pick_node(self, rng: random.Random) -> int:
        """A random node index, preferring nodes that are UP."""
        up = self._node_up
        if not up:
            return 0
        for _ in range(8):
            index = rng.randrange(len(up))
            if up[index]:
                return index
        return index
