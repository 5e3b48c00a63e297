"""The simulated scheduler: a synthetic cluster for demos, tests and benchmarks.

Everything is drawn from ``random.Random(options.sim_seed)``, so the same
seed gives the same cluster:

* one machine ``sim`` with ``options.sim_nodes`` nodes ``n00000``,
  ``n00001``... (``nodeState``, ``nodeNumber``, ``cpus``; a few start DOWN);
* queues ``batch``, ``debug`` and ``long``;
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

Terminate cancels any job that has not completed.  CHANGE_JOB holds and
releases jobs that have not started (``hold=true|false``) and suspends and
resumes running ones (``suspend=true|false`` or ``jobState=SUSPENDED|RUNNING``).
MOVE_JOB moves a job that has not started to another queue: it gets the new
queue as parent (:meth:`Model.move`) and ``queueId``.
"""

from __future__ import annotations

import gc
import heapq
import random
import sys
from typing import Dict, List, Optional, Tuple

import trio

from ..model import Model, UnknownElement
from ..protocol.attributes import A, AttributeDefinition, AttributeSet
from ..protocol.messages import ElementKind, ErrorCode
from .base import JobError, Scheduler, SchedulerOptions, SubmitError
from .common import (
    CPUS,
    JOB_NAME,
    MachineState,
    NodeState,
    QueueState,
    State,
    Status,
    current_user,
    parse_job_changes,
    parse_num_procs,
    require_sub_id,
    scheduler_attribute_definitions,
)

__all__ = ["SimScheduler", "MAX_PROCS", "QUEUE_NAMES", "TICK"]

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
# (jobState, jobStatus) of existing jobs, with weights.
_JOB_MIX: Tuple[Tuple[str, str, int], ...] = (
    (State.STARTING, Status.PENDING, 30),
    (State.STARTING, Status.HELD, 5),
    (State.RUNNING, Status.RUNNING, 45),
    (State.SUSPENDED, Status.SUSPENDED, 3),
    (State.COMPLETED, Status.FINISHED, 12),
    (State.COMPLETED, Status.FAILED, 3),
    (State.COMPLETED, Status.CANCELED, 2),
)
_INDEX = tuple(sys.intern(str(i)) for i in range(256))

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


class SimScheduler(Scheduler):
    """A deterministic synthetic cluster (see the module documentation)."""

    name = "sim"

    def __init__(
        self,
        model: Model,
        options: SchedulerOptions,
        *,
        time_scale: Optional[float] = None,
        process_share: Optional[float] = None,
        retention: float = 30.0,
    ) -> None:
        super().__init__(model, options)
        if time_scale is None:
            time_scale = getattr(options, "sim_time_scale", 1.0)
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale!r}")
        self.time_scale = float(time_scale)
        if process_share is None:
            process_share = getattr(options, "sim_process_share", 0.1)
        if not 0 <= process_share <= 1:
            raise ValueError(f"process_share must be between 0 and 1, got {process_share!r}")
        self.process_share = process_share
        self.retention = retention
        self.user = current_user()
        self._rng = random.Random(options.sim_seed)
        self._job_rng = random.Random(f"{options.sim_seed}/submitted")
        self.machine_id: Optional[int] = None
        self.node_ids: range = range(0)
        self.queue_ids: Dict[str, int] = {}
        self._queue_id_text: Dict[int, str] = {}
        self._node_up = bytearray()
        self._node_id_text: List[str] = []
        #: ids of existing (and churn-made) jobs that have not completed, for churn to pick from;
        #: entries that completed some other way are dropped when picked
        self._active: List[int] = []
        self._submitted: Dict[int, _Submitted] = {}
        self._timers: List[Tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._wakeup = trio.Event()
        self._churn_carry = 0.0

    # ------------------------------------------------------------------ interface

    def attribute_definitions(self) -> List[AttributeDefinition]:
        default_queue = self.queue_ids.get(QUEUE_NAMES[0])
        return scheduler_attribute_definitions(
            max_procs=MAX_PROCS,
            default_queue=None if default_queue is None else str(default_queue),
            hold=True,
        )

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        if self.machine_id is None:
            self.populate()
        task_status.started()
        await self._loop()

    async def submit(self, job: AttributeSet) -> int:
        if self.machine_id is None:
            raise SubmitError("the simulated scheduler is not running", ErrorCode.SCHEDULER)
        sub_id = require_sub_id(job)
        num_procs = parse_num_procs(job, MAX_PROCS)
        queue_id = self._queue_for(job.get(A.QUEUE_ID))
        exec_name = job.get(A.EXEC_NAME) or ""
        exec_path = job.get(A.EXEC_PATH) or ""
        if not exec_name and not exec_path:
            raise SubmitError("no executable given: set execName and/or execPath", ErrorCode.BAD_ARGUMENTS)
        program = exec_name or exec_path.rstrip("/").rsplit("/", 1)[-1] or exec_path
        name = job.get(JOB_NAME) or program
        rng = self._job_rng
        pending_time = PENDING_TIME
        run_time = RUN_TIME_MIN + RUN_TIME_SPREAD * rng.random()
        nodes = [self._pick_node(rng) for _ in range(num_procs)]
        attrs = {
            A.JOB_SUB_ID: sub_id,
            A.NAME: name,
            A.JOB_STATE: State.STARTING,
            A.JOB_STATUS: Status.PENDING,
            A.QUEUE_ID: self._queue_id_text[queue_id],
            A.JOB_NUM_PROCS: str(num_procs),
            A.PROG_ARGS: tuple(job.getall(A.PROG_ARGS)),
            A.USER_ID: self.user,
        }
        for key, value in ((A.EXEC_NAME, exec_name), (A.EXEC_PATH, exec_path), (A.WORKING_DIR, job.get(A.WORKING_DIR))):
            if value:
                attrs[key] = value
        job_id = self.model.add(ElementKind.JOB, queue_id, attrs)
        self.model.add_many(
            ElementKind.PROCESS,
            job_id,
            [{A.PROCESS_STATE: State.STARTING, A.PROCESS_INDEX: _index(i)} for i in range(num_procs)],
        )
        record = _Submitted(name, pending_time, run_time, nodes)
        self._submitted[job_id] = record
        self._schedule(pending_time, _START, job_id, record.gen)
        return job_id

    async def terminate(self, job_id: int) -> None:
        state = self._job_state(job_id)
        if state == State.COMPLETED:
            raise JobError(f"job {job_id} has already completed", ErrorCode.OPERATION_FAILED)
        record = self._submitted.get(job_id)
        if record is not None:
            record.gen += 1
        self._complete(job_id, Status.CANCELED, signal="SIGTERM")

    async def change(self, job_id: int, changes: AttributeSet) -> None:
        request = parse_job_changes(changes, hold=True)
        state = self._job_state(job_id)
        status = self.model.attr(job_id, A.JOB_STATUS)
        record = self._submitted.get(job_id)
        if request.hold is not None:
            if state != State.STARTING:
                raise JobError(
                    f"job {job_id} is {state}; only a job that has not started can be held or released",
                    ErrorCode.OPERATION_FAILED,
                )
            if request.hold and status != Status.HELD:
                self.model.update(job_id, {A.JOB_STATUS: Status.HELD})
                if record is not None:
                    record.gen += 1
            elif not request.hold and status == Status.HELD:
                self.model.update(job_id, {A.JOB_STATUS: Status.PENDING})
                if record is not None:
                    record.gen += 1
                    self._schedule(record.pending_time, _START, job_id, record.gen)
            return
        if request.suspend:
            if state == State.SUSPENDED:
                return
            if state != State.RUNNING:
                raise JobError(
                    f"job {job_id} is {state}; only a running job can be suspended", ErrorCode.OPERATION_FAILED
                )
            self._set_running(job_id, State.SUSPENDED, Status.SUSPENDED)
            if record is not None:
                record.gen += 1  # the current step starts over on resume
        else:
            if state == State.RUNNING:
                return
            if state != State.SUSPENDED:
                raise JobError(
                    f"job {job_id} is {state}; only a suspended job can be resumed", ErrorCode.OPERATION_FAILED
                )
            self._set_running(job_id, State.RUNNING, Status.RUNNING)
            if record is not None:
                record.gen += 1
                self._schedule(record.step_time, _STEP, job_id, record.gen)

    async def move(self, job_id: int, queue_id: int) -> None:
        try:
            self.model.find(queue_id, ElementKind.QUEUE)
        except UnknownElement:
            raise JobError(f"no queue with id {queue_id}", ErrorCode.NO_SUCH_QUEUE) from None
        state = self._job_state(job_id)
        if state != State.STARTING:
            raise JobError(
                f"job {job_id} is {state}; only a job that has not started can change queues",
                ErrorCode.OPERATION_FAILED,
            )
        with self.model.batch():
            self.model.move(job_id, queue_id)
            self.model.update(job_id, {A.QUEUE_ID: self._queue_id_text[queue_id]})

    # ------------------------------------------------------------------ the initial model

    def populate(self) -> None:
        """Create the machine, nodes, queues and existing jobs (done by :meth:`run`)."""
        enabled = gc.isenabled()
        gc.disable()  # hundreds of thousands of new objects, none of them garbage
        try:
            with self.model.batch():
                self._populate()
        finally:
            if enabled:
                gc.enable()

    def _populate(self) -> None:
        model = self.model
        rng = self._rng
        count = self.options.sim_nodes
        self.machine_id = model.add(
            ElementKind.MACHINE,
            None,
            {A.NAME: MACHINE_NAME, A.MACHINE_STATE: MachineState.UP, A.NUM_NODES: str(count)},
        )
        width = max(5, len(str(max(count - 1, 0))))
        cpus = rng.choices(_CPUS, k=count)
        up = bytearray(1 if rng.random() >= _NODE_DOWN_SHARE else 0 for _ in range(count))
        if count:
            self.node_ids = model.add_many(
                ElementKind.NODE,
                self.machine_id,
                [
                    {
                        A.NAME: f"n{i:0{width}d}",
                        A.NODE_STATE: NodeState.UP if up[i] else NodeState.DOWN,
                        A.NODE_NUMBER: str(i),
                        CPUS: cpus[i],
                    }
                    for i in range(count)
                ],
            )
        self._node_up = up
        self._node_id_text = [str(n) for n in self.node_ids]
        for name in QUEUE_NAMES:
            queue_id = model.add(ElementKind.QUEUE, None, {A.NAME: name, A.QUEUE_STATE: QueueState.NORMAL})
            self.queue_ids[name] = queue_id
            self._queue_id_text[queue_id] = sys.intern(str(queue_id))
        self._add_existing_jobs(self.options.sim_jobs)

    def _add_existing_jobs(self, count: int) -> None:
        """``count`` jobs in mixed states; one add_many per queue, processes for a share."""
        if count <= 0:
            return
        rng = self._rng
        model = self.model
        queues = [self.queue_ids[name] for name in QUEUE_NAMES]
        mix_index = rng.choices(range(len(_JOB_MIX)), weights=[w for _, _, w in _JOB_MIX], k=count)
        queue_index = rng.choices(range(len(queues)), weights=_QUEUE_WEIGHTS, k=count)
        names = rng.choices(range(len(_JOB_NAMES)), k=count)
        users = rng.choices(range(len(_USERS)), k=count)
        procs = rng.choices(range(len(_NUM_PROCS)), weights=_NUM_PROCS_WEIGHTS, k=count)
        # Jobs with equal attributes share one attribute dict (the model copies values).
        shared: Dict[tuple, dict] = {}
        per_queue: List[List[dict]] = [[] for _ in queues]
        per_queue_meta: List[List[Tuple[int, int]]] = [[] for _ in queues]
        for i in range(count):
            key = (mix_index[i], queue_index[i], names[i], users[i], procs[i])
            attrs = shared.get(key)
            if attrs is None:
                state, status, _ = _JOB_MIX[key[0]]
                attrs = shared[key] = {
                    A.NAME: _JOB_NAMES[key[2]],
                    A.JOB_STATE: state,
                    A.JOB_STATUS: status,
                    A.QUEUE_ID: self._queue_id_text[queues[key[1]]],
                    A.JOB_NUM_PROCS: _NUM_PROCS[key[4]],
                    A.USER_ID: _USERS[key[3]],
                }
            per_queue[key[1]].append(attrs)
            per_queue_meta[key[1]].append((key[0], key[4]))
        listed = self.process_share
        for q, queue_id in enumerate(queues):
            if not per_queue[q]:
                continue
            ids = model.add_many(ElementKind.JOB, queue_id, per_queue[q])
            for job_id, (mix, nprocs) in zip(ids, per_queue_meta[q]):
                state, status, _ = _JOB_MIX[mix]
                if state != State.COMPLETED:
                    self._active.append(job_id)
                if listed and rng.random() < listed:
                    self._add_processes(job_id, int(_NUM_PROCS[nprocs]), state, status, rng)
                if state == State.COMPLETED and self.options.sim_churn > 0:
                    # they completed at some point of the last retention period
                    self._schedule(self.retention * rng.random(), _REMOVE, job_id, 0)

    def _add_processes(self, job_id: int, count: int, state: str, status: str, rng: random.Random) -> None:
        process = {A.PROCESS_STATE: state}
        if state != State.STARTING:
            process[A.PROCESS_NODE_ID] = self._node_id_text[self._pick_node(rng)] if self._node_id_text else ""
        if state == State.COMPLETED:
            process[A.PROCESS_STATUS] = status
            process[A.PROCESS_EXIT_CODE] = "0" if status == Status.FINISHED else "1"
        if count == 1:
            process[A.PROCESS_INDEX] = _INDEX[0]
            self.model.add_many(ElementKind.PROCESS, job_id, [process])
            return
        self.model.add_many(
            ElementKind.PROCESS, job_id, [{**process, A.PROCESS_INDEX: _index(i)} for i in range(count)]
        )

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
            churn = self.options.sim_churn  # read each round: the rate may be changed while running
            now = trio.current_time()
            timers = self._timers
            with self.model.batch():  # one wake-up of the agent per tick
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
            if job_id in self.model and self.model.attr(job_id, A.JOB_STATE) == State.COMPLETED:
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
        model.update(job_id, {A.JOB_STATE: State.RUNNING, A.JOB_STATUS: Status.RUNNING})
        for index, eid in enumerate(model.children(job_id, ElementKind.PROCESS)):
            model.update(
                eid,
                {
                    A.PROCESS_STATE: State.RUNNING,
                    A.PROCESS_STATUS: Status.RUNNING,
                    A.PROCESS_NODE_ID: self._node_id_text[record.nodes[index]] if self._node_id_text else "",
                    A.PROCESS_PID: str(10000 + (eid % 50000)),
                },
            )
        self._schedule(record.step_time, _STEP, job_id, record.gen)

    def _step_submitted(self, job_id: int, record: _Submitted) -> None:
        record.steps_left -= 1
        processes = self.model.children(job_id, ElementKind.PROCESS)
        if record.steps_left > 0:
            step = OUTPUT_LINES + 1 - record.steps_left
            for index, eid in enumerate(processes):
                self.model.output(eid, f"{record.name} rank {index}: step {step} of {OUTPUT_LINES}", "stdout")
            self._schedule(record.step_time, _STEP, job_id, record.gen)
            return
        self.model.update_many(
            processes,
            {A.PROCESS_STATE: State.COMPLETED, A.PROCESS_STATUS: Status.FINISHED, A.PROCESS_EXIT_CODE: "0"},
        )
        self.model.update(job_id, {A.JOB_STATE: State.COMPLETED, A.JOB_STATUS: Status.FINISHED})
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
            state = self._existing_state(job_id)
            if state is not None and state != State.COMPLETED:
                self._advance(i, job_id, state)
                return
            active[i] = active[-1]  # completed (or removed) some other way: forget it
            active.pop()
        self._arrival()

    def _flip_node(self, index: int) -> None:
        up = self._node_up[index] = 0 if self._node_up[index] else 1
        self.model.update(self.node_ids[index], {A.NODE_STATE: NodeState.UP if up else NodeState.DOWN})

    def _existing_state(self, job_id: int) -> Optional[str]:
        if job_id not in self.model:
            return None
        return self.model.attr(job_id, A.JOB_STATE)  # type: ignore[return-value]

    def _advance(self, index: int, job_id: int, state: str) -> None:
        """Move one existing job one step along its life."""
        rng = self._rng
        if state == State.STARTING:
            if self.model.attr(job_id, A.JOB_STATUS) == Status.HELD:
                self.model.update(job_id, {A.JOB_STATUS: Status.PENDING})
            else:
                self._set_running(job_id, State.RUNNING, Status.RUNNING, rng)
        elif state == State.SUSPENDED:
            self._set_running(job_id, State.RUNNING, Status.RUNNING, rng)
        elif rng.random() < 0.1:
            self._set_running(job_id, State.SUSPENDED, Status.SUSPENDED, rng)
        else:
            self._complete(job_id, Status.FINISHED if rng.random() < 0.8 else Status.FAILED)
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
            ElementKind.JOB,
            queue_id,
            {
                A.NAME: rng.choice(_JOB_NAMES),
                A.JOB_STATE: State.STARTING,
                A.JOB_STATUS: Status.PENDING,
                A.QUEUE_ID: self._queue_id_text[queue_id],
                A.JOB_NUM_PROCS: nprocs,
                A.USER_ID: rng.choice(_USERS),
            },
        )
        if self.process_share and rng.random() < self.process_share:
            self._add_processes(job_id, int(nprocs), State.STARTING, Status.PENDING, rng)
        self._active.append(job_id)

    # ------------------------------------------------------------------ shared steps

    def _set_running(self, job_id: int, state: str, status: str, rng: Optional[random.Random] = None) -> None:
        """Job (and its processes) to RUNNING or SUSPENDED."""
        model = self.model
        model.update(job_id, {A.JOB_STATE: state, A.JOB_STATUS: status})
        processes = model.children(job_id, ElementKind.PROCESS)
        if not processes:
            return
        attrs = {A.PROCESS_STATE: state, A.PROCESS_STATUS: status}
        model.update_many(processes, attrs)
        if rng is not None and self._node_id_text:
            for eid in processes:
                if model.attr(eid, A.PROCESS_NODE_ID) is None:
                    model.update(eid, {A.PROCESS_NODE_ID: self._node_id_text[self._pick_node(rng)]})

    def _complete(self, job_id: int, status: str, signal: Optional[str] = None) -> None:
        """Job to COMPLETED with ``status``; its unfinished processes with it."""
        model = self.model
        for eid in model.children(job_id, ElementKind.PROCESS):
            process_state = model.attr(eid, A.PROCESS_STATE)
            if process_state == State.COMPLETED:
                continue
            attrs = {A.PROCESS_STATE: State.COMPLETED, A.PROCESS_STATUS: status}
            if signal is not None and process_state != State.STARTING:
                attrs[A.PROCESS_SIGNAL_NAME] = signal
            elif signal is None:
                attrs[A.PROCESS_EXIT_CODE] = "0" if status == Status.FINISHED else "1"
            model.update(eid, attrs)
        model.update(job_id, {A.JOB_STATE: State.COMPLETED, A.JOB_STATUS: status})
        self._submitted.pop(job_id, None)
        self._schedule(self.retention, _REMOVE, job_id, 0)

    def _job_state(self, job_id: int) -> str:
        try:
            self.model.find(job_id, ElementKind.JOB)
        except UnknownElement:
            raise JobError(f"no job with id {job_id}", ErrorCode.NO_SUCH_JOB) from None
        return self.model.attr(job_id, A.JOB_STATE) or State.STARTING  # type: ignore[return-value]

    def _queue_for(self, given: Optional[str]) -> int:
        if given is None or given == "":
            return self.queue_ids[QUEUE_NAMES[0]]
        if given in self.queue_ids:
            return self.queue_ids[given]
        for queue_id, text in self._queue_id_text.items():
            if text == given:
                return queue_id
        known = ", ".join(f"{self._queue_id_text[q]} ({n})" for n, q in self.queue_ids.items())
        raise SubmitError(f"unknown queue {given!r}; queues: {known}", ErrorCode.NO_SUCH_QUEUE)

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


def _index(i: int) -> str:
    return _INDEX[i] if i < len(_INDEX) else str(i)
