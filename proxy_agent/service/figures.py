"""The figures brokers rank queues by, kept as attributes of each queue in the model.

A batch system reports how loaded its queues are; the local and simulated backends do not, so
the service derives the figures from the jobs in the model for the backends that ask for it
(:attr:`~proxy_agent.service.backend.Backend.queue_load`):

* ``waitingJobs`` (:data:`K.WAITING`): jobs of the queue that wait to start (ACCEPTED,
  PREPARING, SUBMITTING or QUEUING; held jobs do not count: they compete for nothing);
* ``runningJobs`` (:data:`K.RUNNING`): jobs that are RUNNING or FINISHING;
* ``freeSlots`` (:data:`K.FREE_SLOTS`): the queue's ``totalSlots`` (set by the backend) less
  one slot per process of its running jobs, never below 0.  With ``queue_load = "shared"``
  every queue of the backend draws on the same slots (the simulated cluster's queues all
  span the whole machine), so the processes of every running job of the backend count.

The benchmark figures of a configuration file (see :mod:`.broker`) become attributes
``benchmark.NAME`` of the queues they name, whichever backend they belong to.

Costs: each change of a job costs a few dictionary operations, whatever the size of the model;
the figures are written once per batch of changes, for the queues whose figures moved.  Only
jobs that are waiting or running are remembered (their queue's counts must drop when they
move on).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Set

from .jobs import JobState
from .model import ChangeSink, Element, K, Kind, ServiceModel

__all__ = ["BENCHMARK_PREFIX", "LOAD_MODES", "QueueFigures", "benchmark_attribute"]

#: Queue attributes holding benchmark figures are this prefix and the benchmark's name.
BENCHMARK_PREFIX = "benchmark."
#: How a backend's queues share their slots (see the module documentation).
LOAD_MODES = ("queue", "shared")

_WAITING_STATES = frozenset(
    s.value for s in (JobState.ACCEPTED, JobState.PREPARING, JobState.SUBMITTING, JobState.QUEUING)
)
_RUNNING_STATES = frozenset(s.value for s in (JobState.RUNNING, JobState.FINISHING))
_JOB = Kind.JOB
_QUEUE = Kind.QUEUE


def benchmark_attribute(name: str) -> str:
    """The queue attribute holding a benchmark's figure (``benchmark.specint2000``)."""
    return BENCHMARK_PREFIX + name.lower()


class QueueFigures(ChangeSink):
    """Derives queue figures from job changes; a model observer (see the module docs)."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        #: backend name -> "queue" or "shared"
        self._modes: Dict[str, str] = {}
        #: queue label (BACKEND:NAME) -> benchmark attributes to give it
        self._benchmarks: Dict[str, Dict[str, str]] = {}
        #: waiting or running jobs of tracked backends: key -> 0 (waiting) or the slots it uses
        self._jobs: Dict[int, int] = {}
        #: tracked queue key -> [waiting, running, slots used]
        self._load: Dict[int, List[int]] = {}
        #: tracked backend -> its queue keys, and the slots its running jobs use
        self._queues_of: Dict[str, Set[int]] = {}
        self._used_by: Dict[str, int] = {}
        self._dirty: Set[int] = set()
        self._dirty_backends: Set[str] = set()
        self._new_queues: List[int] = []
        self._state_slot: Optional[int] = None
        self._procs_slot: Optional[int] = None
        self._total_slot: Optional[int] = None

    # ------------------------------------------------------------------ set-up

    def track(self, backend: str, mode: str) -> None:
        """Keep the load figures of ``backend``'s queues from its jobs (``mode`` in
        :data:`LOAD_MODES`); what the backend already has in the model is counted now."""
        if mode not in LOAD_MODES:
            raise ValueError(f"unknown queue load mode {mode!r}; modes are {', '.join(LOAD_MODES)}")
        if backend in self._modes:
            return
        self._modes[backend] = mode
        self._queues_of[backend] = set()
        self._used_by[backend] = 0
        model = self.model
        for key in model.keys(Kind.QUEUE):
            element = model.get(key)
            if element.owner == backend:
                self._add_queue(element)
        for key in model.keys(Kind.JOB):
            element = model.get(key)
            if element.owner == backend:
                self._add_job(element)
        self._write()

    def set_benchmarks(self, figures: Mapping[str, Mapping[str, float]]) -> None:
        """Benchmark figures per queue label (``BACKEND:NAME`` -> benchmark -> value); given to
        the queues in the model now and to queues that appear later."""
        self._benchmarks = {
            label: {benchmark_attribute(name): _number_text(value) for name, value in values.items()}
            for label, values in figures.items()
        }
        self._new_queues.extend(self.model.keys(Kind.QUEUE))
        self._write()

    # ------------------------------------------------------------------ reading a job

    def _slot(self, kind: Kind, name: str) -> Optional[int]:
        return self.model.schema(kind).index.get(name)

    def _category(self, element: Element) -> Optional[int]:
        """0 for a waiting job, the slots it uses for a running one, None otherwise."""
        slot = self._state_slot
        if slot is None:
            slot = self._state_slot = self._slot(_JOB, K.STATE)
            if slot is None:
                return None
        values = element.values
        state = values[slot] if slot < len(values) else None
        if state in _WAITING_STATES:
            return 0
        if state in _RUNNING_STATES:
            procs_slot = self._procs_slot
            if procs_slot is None:
                procs_slot = self._procs_slot = self._slot(_JOB, K.NUM_PROCS)
            procs = values[procs_slot] if procs_slot is not None and procs_slot < len(values) else None
            try:
                used = int(procs) if procs is not None else 1
            except (TypeError, ValueError):
                used = 1
            return used if used > 0 else 1
        return None

    # ------------------------------------------------------------------ counting

    def _add_queue(self, element: Element) -> None:
        self._load[element.key] = [0, 0, 0]
        self._queues_of[element.owner].add(element.key)
        self._dirty.add(element.key)

    def _add_job(self, element: Element) -> None:
        category = self._category(element)
        if category is not None:
            self._jobs[element.key] = category
            self._count(element.owner, element.parent, category, 1)

    def _count(self, backend: str, queue: int, category: int, sign: int) -> None:
        load = self._load.get(queue)
        if load is None:
            return
        if category == 0:
            load[0] += sign
        else:
            load[1] += sign
            load[2] += sign * category
            if self._modes.get(backend) == "shared":
                self._used_by[backend] += sign * category
                self._dirty_backends.add(backend)
        self._dirty.add(queue)

    # ------------------------------------------------------------------ what the model tells

    def created(self, element: Element) -> None:
        kind = element.kind
        if kind is _JOB:
            if element.owner in self._modes:
                self._add_job(element)
        elif kind is _QUEUE:
            if element.owner in self._modes:
                self._add_queue(element)
            if self._benchmarks:
                self._new_queues.append(element.key)

    def changed(self, element: Element, slots) -> None:
        kind = element.kind
        if kind is _JOB:
            if element.owner not in self._modes:
                return
            if self._state_slot is None or self._state_slot in slots:
                key = element.key
                old = self._jobs.get(key)
                new = self._category(element)
                if old == new or (old and new):  # a running job stays counted as it started
                    return
                if old is not None:
                    del self._jobs[key]
                    self._count(element.owner, element.parent, old, -1)
                if new is not None:
                    self._jobs[key] = new
                    self._count(element.owner, element.parent, new, 1)
        elif kind is _QUEUE and element.key in self._load:
            total = self._total_slot
            if total is None:
                total = self._total_slot = self._slot(_QUEUE, K.TOTAL_SLOTS)
            if total is not None and total in slots:
                self._dirty.add(element.key)

    def removed(self, element: Element) -> None:
        kind = element.kind
        if kind is _JOB:
            old = self._jobs.pop(element.key, None)
            if old is not None:
                self._count(element.owner, element.parent, old, -1)
        elif kind is _QUEUE:
            if self._load.pop(element.key, None) is not None:
                self._queues_of[element.owner].discard(element.key)
                self._dirty.discard(element.key)

    def moved(self, element: Element, old_parent: int) -> None:
        if element.kind is _JOB:
            category = self._jobs.get(element.key)
            if category is not None:
                self._count(element.owner, old_parent, category, -1)
                self._count(element.owner, element.parent, category, 1)

    def flush(self) -> None:
        if self._dirty or self._dirty_backends or self._new_queues:
            self._write()

    # ------------------------------------------------------------------ writing

    def _write(self) -> None:
        model = self.model
        dirty = self._dirty
        self._dirty = set()
        for backend in self._dirty_backends:
            dirty.update(self._queues_of.get(backend, ()))
        self._dirty_backends = set()
        new_queues = self._new_queues
        self._new_queues = []
        queues = model.of_kind(_QUEUE)
        with model.batch():
            for key in dirty:
                load = self._load.get(key)
                element = queues.get(key)
                if load is None or element is None:
                    continue
                used = self._used_by[element.owner] if self._modes.get(element.owner) == "shared" else load[2]
                total_slot = self._total_slot
                if total_slot is None:
                    total_slot = self._total_slot = self._slot(_QUEUE, K.TOTAL_SLOTS)
                values = element.values
                total = _integer(values[total_slot]) if total_slot is not None and total_slot < len(values) else None
                model.update(key, {
                    K.WAITING: str(load[0]),
                    K.RUNNING: str(load[1]),
                    K.FREE_SLOTS: None if total is None else str(max(0, total - used)),
                })
            if self._benchmarks:
                for key in new_queues:
                    if key not in model:
                        continue
                    element = model.get(key)
                    figures = self._benchmarks.get(f"{element.owner}:{model.attr(key, K.NAME)}")
                    if figures:
                        model.update(key, figures)


def _integer(value) -> Optional[int]:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _number_text(value: float) -> str:
    """A figure as text: ``1200`` for a whole number, else Python's shortest form."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
