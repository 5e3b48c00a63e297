"""The scheduler's machine, queues and nodes in the model, as its listings show them: the
queues' states, slots, definitions and job figures, the hosts and their states."""


import logging
from typing import Any, Dict, List, Mapping, Optional, Set

import attrs

from ...service.jobs import JobState, ServiceError
from ...service.model import K, Kind
from .records import NativeNode, NativeQueue
from .values import node_values, queue_values

log = logging.getLogger("proxy_agent.schedulers.batch")


class QueuesAndNodes:
    """The machine, queues and nodes of a batch backend (see the module documentation)."""

    def _update_machine(self) -> None:
        if self._machine is None:
            return
        if self._failing:
            state = "ERROR"
        elif not self._nodes:
            state = "UNKNOWN"
        else:
            up = sum(1 for _key, node in self._nodes.values() if node.state == "UP")
            state = "UP" if up == len(self._nodes) else ("ALERT" if up else "DOWN")
        self.model.update(self._machine, {K.STATE: state, K.NUM_NODES: str(len(self._nodes)),
                                          K.NAME: self.system.machine_name() or self.name})

    def _set(self, key: int, values: Mapping[str, Any]) -> None:
        """Update an element; an empty value clears an attribute only if it was ever set."""
        model = self.model
        model.update(key, {k: (v if v != "" else None) for k, v in values.items()
                           if v != "" or model.attr(key, k) is not None})

    # ------------------------------------------------------------------ queues and nodes

    async def _apply_queues(self, queues: List[NativeQueue], reread: bool = False) -> None:
        listed = {q.name: q for q in queues if q.name}
        definitions = self._definitions
        for name in [n for n in definitions if n not in listed]:
            del definitions[name]
        unread = [q for name, q in listed.items() if reread or name not in definitions]
        if unread:
            try:
                definitions.update(await self.system.queue_details(unread, self.run_cmd))
            except (ServiceError, ValueError) as exc:
                log.info("%s queue details unavailable: %s", self.system.label, exc)
        fields = self.system.detail_fields
        if fields:
            listed = {name: attrs.evolve(q, **{f: getattr(definitions[name], f) for f in fields})
                      if name in definitions else q for name, q in listed.items()}
        default = next((q.name for q in listed.values() if q.is_default), None) or next(iter(listed), None)
        with self.model.batch():
            for name, queue in listed.items():
                values = queue_values(queue, name == default)
                if queue.free_slots is None:
                    del values[K.FREE_SLOTS]  # counted from the jobs (_update_figures)
                key = self._queues.get(name)
                if key is None:
                    values[K.BACKEND] = self.name
                    self._queues[name] = self.model.add(Kind.QUEUE, None, {k: v for k, v in values.items() if v},
                                                        owner=self.name)
                else:
                    self._set(key, values)
            for name, key in list(self._queues.items()):
                if name not in listed and not self.model.children(key):
                    self.model.remove(key)
                    del self._queues[name]
        if listed != self._queue_records:
            self._figures_stale = True  # the scheduler's own figures may have changed
        self._queue_records = listed
        self._default = default
        self.default_queue = self._queues.get(default) if default is not None else None

    def _queue_for(self, name: str, current: Optional[int] = None) -> int:
        """The queue of a job; one pending in several (``a,b``) is shown in the first known."""
        names = [n for n in name.split(",") if n]
        for each in names:
            key = self._queues.get(each)
            if key is not None:
                return key
        if current is not None:
            return current
        name = names[0] if names else ""
        if not name:
            default = self.default_queue
            if default is not None:
                return default
            name = "unknown"
        key = self._queues.get(name)
        if key is None:
            key = self._queues[name] = self.model.add(
                Kind.QUEUE, None, {K.NAME: name, K.STATE: "NORMAL", K.BACKEND: self.name}, owner=self.name)
            self._queues_stale = True  # a queue the last listing lacked: asked again
        return key

    def _apply_nodes(self, nodes: List[NativeNode]) -> None:
        assert self._machine is not None
        model = self.model
        listed: Set[str] = set()
        with model.batch():
            for number, node in enumerate(nodes):
                if not node.name or node.name in listed:
                    continue
                listed.add(node.name)
                values = node_values(node)
                known = self._nodes.get(node.name)
                if known is None:
                    values[K.NUMBER] = str(len(self._nodes))
                    key = model.add(Kind.NODE, self._machine, {k: v for k, v in values.items() if v},
                                    owner=self.name)
                    self._nodes[node.name] = (key, node)
                elif known[1] != node:
                    self._set(known[0], values)
                    self._nodes[node.name] = (known[0], node)
            for name in [n for n in self._nodes if n not in listed]:
                model.remove(self._nodes.pop(name)[0])

    def _update_figures(self) -> None:
        """waitingJobs/runningJobs of each queue: the scheduler's counts when it gives them,
        else the listed jobs'; freeSlots from the scheduler, else total less running slots."""
        self._figures_stale = False
        counts: Dict[int, List[int]] = {key: [0, 0, 0] for key in self._queues.values()}
        for tracked in self._jobs.values():
            if tracked.completed:
                continue
            record = self._table.record(tracked.native_id)
            if record is None:
                continue
            state = self.system.job_state(record)
            figures = counts.get(tracked.queue)
            if figures is None:
                continue
            if state is JobState.QUEUING:
                figures[0] += 1
            elif state in (JobState.RUNNING, JobState.FINISHING):
                figures[1] += 1
                figures[2] += record.num_procs or 1
        records = {self._queues[name]: q for name, q in self._queue_records.items() if name in self._queues}
        with self.model.batch():
            for key, (waiting, running, used) in counts.items():
                queue = records.get(key)
                values = {K.WAITING: str(waiting), K.RUNNING: str(running)}
                if queue is not None:
                    if queue.waiting is not None:
                        values[K.WAITING] = str(queue.waiting)
                    if queue.running is not None:
                        values[K.RUNNING] = str(queue.running)
                    if queue.free_slots is None and queue.total_slots is not None:
                        values[K.FREE_SLOTS] = str(max(0, queue.total_slots - used))
                self.model.update(key, values)

