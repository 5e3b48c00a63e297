"""One PTP client's view of the service model: what it has seen, what it has yet to see.

A :class:`ModelView` subscribes to the :class:`~proxy_agent.service.model.ServiceModel` when
its client starts events.  At that instant the whole model is rendered into NEW events (the
*snapshot*) and from then on the view keeps, per element, what the client has not been told
yet (:meth:`ModelView.drain`).  Both are PTP wire events with the client's own ids: element
id = the client's base id + the service key; a process is named by its rank within its job.

The snapshot is planned once for every client that subscribes while the model is unchanged
(:class:`SnapshotPlan`, shared): the elements are grouped at that instant, and their events are
encoded as the first reader gets to them; only the ids, which depend on each client's base id,
are filled in per client.  The frames are rendered a chunk at a time as the session's writer
takes them, so the client decodes one while the next is made; clients with the same base id
and TID reading at the same time share the bytes too (see ``docs/performance.md``).

Between two drains every element carries at most one pending record, so the memory held for
changes is bounded by the size of the model however long events stay stopped: a later value
replaces an earlier one, a NEW followed by a CHANGE is one NEW with the latest values, a NEW
followed by its REMOVE vanishes, a CHANGE followed by a REMOVE is just the REMOVE.

The jobs a client submitted itself are the exception to coalescing: their launch in the IDE
completes only on a JOB_CHANGE that says RUNNING, so every such job reaches its client as a
NEW_JOB saying STARTING, then one JOB_CHANGE per state it went through (RUNNING, SUSPENDED,
COMPLETED...), in order, however much else is merged meanwhile (:class:`OwnJob`).  A job that
ran but ended before its client was told still goes STARTING, RUNNING, COMPLETED; one that
never ran (cancelled while queued) gets no RUNNING.  While its submission is being carried
out, the job (with its processes and output) is held back from the client alone, so that the
submission's OK comes first (:attr:`ModelView.expected`).

Process output is the one stream that cannot be coalesced.  While the client keeps reading,
nothing is dropped: the view holds what is waiting and the jobs' output is held back at the
source once that passes :data:`~proxy_agent.service.model.OUTPUT_HIGH_WATER` bytes.  While
the client does not read (it stopped events, or its connection has not taken anything for
:data:`STALL_SECONDS`), jobs are not held back for it; it keeps at most
:data:`HELD_OUTPUT_LIMIT` bytes per process and :data:`HELD_TOTAL_LIMIT` in all, the oldest
lines giving way, and is told exactly how many lines it missed.

Elements that share a change are sent in one event with one range set: 64 processes
entering RUNNING together become one PROCESS_CHANGE with one range.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ...protocol.messages import EventId
from ...service.model import CREATE_ORDER, ChangeSink, Element, K, Kind, ServiceModel
from . import mapping
from .own_jobs import COMPLETED, STARTING_STATUS, OwnJob
from .render import MAX_GROUPS_PER_EVENT, NATIVE_RULES, PTP_KIND, RenderRules, Renderer, WireEvent, ids_text
from .snapshot import SnapshotPlan, snapshot_plan

__all__ = ["HELD_OUTPUT_LIMIT", "HELD_TOTAL_LIMIT", "STALL_SECONDS", "ModelView"]

#: Bytes of output held per process for a client that is not reading.
HELD_OUTPUT_LIMIT = 1 << 20
#: Bytes of output held in all for a client that is not reading.
HELD_TOTAL_LIMIT = 32 << 20
#: A client whose connection takes nothing for this long is not reading.
STALL_SECONDS = 15.0
_OUTPUT_CHUNK = 64 * 1024

_REMOVE_ORDER = tuple(reversed(CREATE_ORDER))
# Changes: a job's processes before the job, so a job's end follows its processes' ends.
_CHANGE_ORDER = (Kind.MACHINE, Kind.QUEUE, Kind.NODE, Kind.PROCESS, Kind.JOB)

_NEW = 1  # pending record: the client has not seen this element yet

#: The client views of each model (see :meth:`ModelView.plan_base`)
_VIEWS: "weakref.WeakKeyDictionary[ServiceModel, weakref.WeakSet[ModelView]]" = weakref.WeakKeyDictionary()

class ModelView(ChangeSink):
    """What one client has seen of the model, and renders what it has not (module docs)."""

    def __init__(self, model: ServiceModel, base_id: int, rules: RenderRules = NATIVE_RULES,
                 on_change: Optional[Callable[[], None]] = None) -> None:
        self.model = model
        self.base = base_id
        self.rules = rules
        if on_change is not None:
            self.flush = on_change  # type: ignore[method-assign]  # the model's flush wakes the client's writer
        self._renderers = {kind: Renderer(kind, model.schema(kind), rules, base_id) for kind in Kind}
        views = _VIEWS.get(model)
        if views is None:
            views = _VIEWS[model] = weakref.WeakSet()
        views.add(self)
        self.subscribed = False
        # pending records: key -> _NEW or the set of changed slots
        self._pending: Dict[int, Union[int, Set[int]]] = {}
        # elements the client knew that are gone: kind -> [(parent key, key or rank)]
        self._removed: Dict[Kind, List[Tuple[int, int]]] = {kind: [] for kind in Kind}
        # elements the client knew that moved: removed under the old parent, then NEW again
        self._reissued: Dict[Kind, List[Tuple[int, int]]] = {kind: [] for kind in Kind}
        # held output: process key -> deque of (ptp key, text); its size; dropped counts
        self._output: Dict[int, Deque[Tuple[str, str]]] = {}
        self._output_bytes: Dict[int, int] = {}
        self._output_dropped: Dict[int, int] = {}
        #: bytes of output held in all (for flow control)
        self.held_output = 0
        #: the client is reading: the jobs' output is held back rather than dropped for it
        self.holds_back = True
        # where the held output ends in the backends' files, and where drained output ends:
        # (process key, stream) -> offset (see take_delivered)
        self._held_offsets: Dict[Tuple[int, str], int] = {}
        self._drained_offsets: Dict[Tuple[int, str], int] = {}
        #: why it is not reading, for the note about dropped lines
        self._not_reading = ""
        #: Submissions of this client being carried out: jobSubId -> how many.  The front-end
        #: counts one in before it asks the service; the job such a submission makes (the job
        #: whose ``jobSubId`` this is) is held back from this client, with its processes and
        #: output, until :meth:`submitted`: the submission's OK goes out first, and from its
        #: first event on the job is the client's own.  Nothing else waits for it.
        self.expected: Dict[str, int] = {}
        # Jobs held back until their submission is answered: key -> jobSubId
        self._withheld: Dict[int, str] = {}
        # Their records and their processes': element key -> withheld job key
        self._held: Dict[int, int] = {}
        # Their output: withheld job key -> [(process key, stream, text, offset)]
        self._held_output: Dict[int, List[Tuple[int, str, str, Optional[int]]]] = {}
        # Jobs this client submitted, until it has been told they completed
        self._own: Dict[int, OwnJob] = {}
        self._job_schema = model.schema(Kind.JOB)

    # ------------------------------------------------------------------ flow

    def set_reading(self, reading: bool, why: str = "") -> None:
        """Whether the client is taking what it is sent (see the module documentation)."""
        if reading == self.holds_back:
            return
        self.holds_back = reading
        if not reading:
            self._not_reading = why
            self._trim_all()
            self.model.room_made()
        elif not self._output_dropped:
            # Otherwise the reason stays until the note about the dropped lines is sent.
            self._not_reading = ""

    # ------------------------------------------------------------------ ids

    def element_id(self, key: int) -> int:
        return self.base + key

    def key_of(self, element_id: int) -> int:
        return element_id - self.base

    # ------------------------------------------------------------------ the client's submissions

    def submitted(self, sub_id: str, key: Optional[int]) -> None:
        """A submission counted in :attr:`expected` is answered: ``key`` is its job (None:
        it was refused).  The job goes out from now on, every state it goes through as an
        event of its own (see the module documentation)."""
        if sub_id:
            left = self.expected.get(sub_id, 0) - 1
            if left > 0:
                self.expected[sub_id] = left
            else:
                self.expected.pop(sub_id, None)
        if key is not None:
            element = self.model.by_key.get(key)
            if element is not None and element.kind is Kind.JOB:
                if key in self._withheld:
                    self._release(key)
                elif key not in self._own:
                    self._own[key] = OwnJob(self._state_of(element))
                    if self.subscribed and self._known(element):
                        # Its scheduler listed it before its submit command answered, and the
                        # client was told of it as of anybody's job: told again, as its own.
                        self._reissue(element, element.parent)
        if sub_id and sub_id not in self.expected:
            # what was held for this jobSubId and is not the submission's job: anybody's job
            for stray in [k for k, s in self._withheld.items() if s == sub_id]:
                self._own.pop(stray, None)
                self._release(stray)

    def _state_of(self, element: Element) -> Optional[str]:
        slot = self._job_schema.index.get(K.STATE)
        values = element.values
        if slot is None or slot >= len(values):
            return None
        value = values[slot]
        return value if value.__class__ is str else None

    def _claim(self, element: Element) -> bool:
        """Hold back a job the client has not been told of if its jobSubId is that of a
        submission being carried out; True if it is held back now."""
        slot = self._job_schema.index.get(K.CLIENT_REF)
        values = element.values
        if slot is None or slot >= len(values):
            return False
        sub_id = values[slot]
        if sub_id.__class__ is not str or sub_id not in self.expected:
            return False
        key = element.key
        self._withheld[key] = sub_id
        self._own[key] = OwnJob(self._state_of(element))
        held = self._held
        for member in (key, *(element.children or ())):
            if self._pending.get(member) is not _NEW:
                continue
            del self._pending[member]
            held[member] = key
            out = self._output.pop(member, None)
            if out is None:
                continue
            # output that came before the jobSubId did: held back with the rest
            self.held_output -= self._output_bytes.pop(member, 0)
            lines = [(member, "stdout" if ptp_key == "processStdout" else "stderr", text) for ptp_key, text in out]
            last = {stream: i for i, (_, stream, _) in enumerate(lines)}
            offsets = {i: self._held_offsets.pop((member, stream), None) for stream, i in last.items()}
            self._held_output.setdefault(key, []).extend(
                (process, stream, text, offsets.get(i)) for i, (process, stream, text) in enumerate(lines))
        return True

    def _release(self, job: int) -> None:
        """What was held back for ``job`` now goes out as usual."""
        self._withheld.pop(job, None)
        held = self._held
        for member in [k for k, owner in held.items() if owner == job]:
            del held[member]
            self._pending[member] = _NEW
        for process, stream, text, offset in self._held_output.pop(job, ()):
            if process in self.model:
                self._hold_output(process, stream, text, offset)

    # ------------------------------------------------------------------ subscription

    def plan_base(self) -> Optional[int]:
        """The base id a snapshot plan for this client is best made for: its own while every
        client of the model has that base id; None (a plan for any base id) once clients with
        other base ids are about, so that one plan serves them all."""
        views = _VIEWS.get(self.model)
        if views is not None and any(view.base != self.base for view in views):
            return None
        return self.base

    def subscribe_plan(self, defer: bool = False) -> SnapshotPlan:
        """Start following the model; returns the snapshot of this instant (its elements now
        count as known to the client: queue its frames before anything drained later).
        ``defer``: see :func:`build_plan`."""
        model = self.model
        plan = snapshot_plan(model, self.rules, self.plan_base(), defer)
        model.subscribe(self)
        self.subscribed = True
        for job, backlog in model.take_backlog().items():
            for process, stream, text, offset in backlog.lines:
                self._hold_output(process, stream, text, offset)
            for process, count in backlog.dropped.items():
                self._output_dropped[process] = self._output_dropped.get(process, 0) + count
                self._not_reading = self._not_reading or "no client had events started"
        return plan

    def subscribe(self) -> Iterator[List[WireEvent]]:
        """:meth:`subscribe_plan` with the snapshot as one chunk of wire events."""
        plan = self.subscribe_plan()
        return iter([plan.wire_events(self.base)])

    def subscribe_frames(self, tid: int) -> List[bytes]:
        """:meth:`subscribe_plan` with the snapshot as encoded frames for ``tid``."""
        return self.subscribe_plan().frames(self.base, tid)

    def subscribe_chunks(self, tid: int, early: Optional[Callable[[bytes], None]] = None) -> Iterator[bytes]:
        """:meth:`subscribe_plan` with the snapshot's frames for ``tid`` rendered chunk by chunk
        as they are taken (the snapshot is of this instant whenever they are taken).

        ``early``: takes the first chunks at once, before the rest of a new plan is grouped, so
        that the client decodes them meanwhile (it must send them without letting anything
        else run, and say whether the connection took them whole): the machines, queues and
        nodes, up to the chunk in which the jobs and processes get grouped, for as long as
        the connection takes them (of a plan grouped already, the first chunk).  The chunks
        returned are the rest."""
        plan = self.subscribe_plan(defer=early is not None)
        chunks: Any = plan.chunks(self.base, tid)  # a _Reader: its rendering is shared
        if early is not None:
            rendering = chunks.rendering
            rendering.head = sys.maxsize  # what is taken now stays, for others asking meanwhile
            try:
                while True:
                    chunk = next(chunks, None)
                    if chunk is None or not early(chunk) or plan.settled:
                        break
            finally:
                rendering.head = max(1, chunks.position)
                plan.settle()  # the snapshot is of this instant: grouped before anything else runs
        return chunks

    def unsubscribe(self) -> None:
        if self.subscribed:
            self.model.unsubscribe(self)
            self.subscribed = False
            if self._output or self._output_dropped:
                # Output held for this client and never sent (it left, or quit): kept for the
                # next client, as output written while nobody listened is.
                self.model.keep_output(self._held_lines(), self._output_dropped)
                self._output, self._output_bytes, self._output_dropped = {}, {}, {}
                self.held_output = 0

    def _held_lines(self) -> List[Tuple[int, str, str, Optional[int]]]:
        """The held output as (process, stream, text, offset); the last block of each stream
        carries where it ends in the backend's file (when it keeps one)."""
        lines: List[Tuple[int, str, str, Optional[int]]] = []
        last: Dict[Tuple[int, str], int] = {}
        for process, blocks in self._output.items():
            for key, text in blocks:
                stream = "stdout" if key == "processStdout" else "stderr"
                last[(process, stream)] = len(lines)
                lines.append((process, stream, text, None))
        for (process, stream), index in last.items():
            offset = self._held_offsets.get((process, stream))
            if offset is not None:
                lines[index] = (process, stream, lines[index][2], offset)
        return lines

    def _known(self, element: Element) -> bool:
        """Has the client been told of this element (and not of its removal)?"""
        return self._pending.get(element.key) is not _NEW

    # ------------------------------------------------------------------ ChangeSink

    def created(self, element: Element) -> None:
        key = element.key
        if self._held and element.parent in self._held:
            self._held[key] = self._held[element.parent]  # a process of a job held back
            return
        self._pending[key] = _NEW
        if self.expected and element.kind is Kind.JOB:
            self._claim(element)

    def changed(self, element: Element, slots: Iterable[int]) -> None:
        key = element.key
        if self._own:
            own = self._own.get(key)
            if own is not None:
                slot = self._job_schema.index.get(K.STATE)
                if slot in slots:  # type: ignore[operator]
                    own.note(element.values[slot])
        if self._held and key in self._held:
            return  # new to the client
        record = self._pending.get(key)
        if record is _NEW:
            if self.expected and element.kind is Kind.JOB:
                self._claim(element)  # its jobSubId may have come only now
            return
        if record is None:
            self._pending[key] = set(slots)
        else:
            record.update(slots)  # type: ignore[union-attr]

    def removed(self, element: Element) -> None:
        key = element.key
        if self._held and key in self._held:
            # held back, so never told of: gone without a word
            del self._held[key]
            self._withheld.pop(key, None)
            self._own.pop(key, None)
            self._held_output.pop(key, None)
            return
        if self._own:
            self._own.pop(key, None)
        known = self._known(element)
        self._pending.pop(key, None)
        held = self._output.pop(key, None)
        if held is not None:
            self.held_output -= self._output_bytes.pop(key, 0)
        self._output_dropped.pop(key, None)
        if known:
            ref = element.rank if element.kind is Kind.PROCESS else key
            self._removed[element.kind].append((element.parent, ref))

    def moved(self, element: Element, old_parent: int) -> None:
        if (self._held and element.key in self._held) or not self._known(element):
            return  # it will be sent under its new parent
        self._reissue(element, old_parent)

    def _reissue(self, element: Element, parent: int) -> None:
        # Children first, as a removal goes; every element becomes NEW again.
        elements = self.model.by_key
        for child in element.children or ():
            self._reissue(elements[child], element.key)
        if self._known(element):
            ref = element.rank if element.kind is Kind.PROCESS else element.key
            self._reissued[element.kind].append((parent, ref))
            own = self._own.get(element.key) if self._own else None
            if own is not None:
                own.told = None  # it is new to the client again
        self._pending[element.key] = _NEW

    def output(self, element: Element, stream: str, text: str, offset: Optional[int] = None) -> None:
        self._hold_output(element.key, stream, text, offset)

    def _hold_output(self, process: int, stream: str, text: str, offset: Optional[int] = None) -> None:
        if self._held and process in self._held:
            self._held_output.setdefault(self._held[process], []).append((process, stream, text, offset))
            return
        key = "processStdout" if stream == "stdout" else "processStderr"
        if offset is not None:
            where = (process, stream)
            if offset > self._held_offsets.get(where, -1):
                self._held_offsets[where] = offset
        held = self._output.get(process)
        if held is None:
            held = self._output[process] = deque()
            self._output_bytes[process] = 0
        held.append((key, text))
        size = len(text) + 1
        self._output_bytes[process] += size
        self.held_output += size
        if not self.holds_back:
            self._trim(process)
            if self.held_output > HELD_TOTAL_LIMIT:
                self._trim_all()

    def _trim(self, process: int, limit: int = HELD_OUTPUT_LIMIT) -> None:
        """Keep at most ``limit`` bytes of a process's held output (its newest lines)."""
        held = self._output.get(process)
        if held is None:
            return
        total = self._output_bytes[process]
        dropped = 0
        while total > limit and held:
            key, old = held.popleft()
            size = len(old) + 1
            if not held and size > limit:
                # one block alone is too big: keep its newest whole lines
                keep = old[len(old) - limit + 1:]
                cut = keep.find("\n")
                keep = keep[cut + 1:] if cut >= 0 else ""
                kept_lines = keep.count("\n") + 1 if keep else 0
                dropped += old.count("\n") + 1 - kept_lines
                if keep:
                    held.append((key, keep))
                new_total = len(keep) + 1 if keep else 0
                self.held_output -= total - new_total
                total = new_total
                break
            total -= size
            self.held_output -= size
            dropped += old.count("\n") + 1
        self._output_bytes[process] = total
        if dropped:
            self._output_dropped[process] = self._output_dropped.get(process, 0) + dropped

    def _trim_all(self) -> None:
        """Bound what a client that is not reading holds: per process, then in all."""
        for process in list(self._output):
            self._trim(process)
        if self.held_output > HELD_TOTAL_LIMIT:
            share = max(1024, HELD_TOTAL_LIMIT // max(1, len(self._output)))
            for process in list(self._output):
                self._trim(process, share)

    def created_all(self, elements: Sequence[Element], changes: Sequence[Tuple[Element, List[int]]] = ()) -> None:
        for element in elements:
            self.created(element)
        for element, slots in changes:
            self.changed(element, slots)

    # ------------------------------------------------------------------ draining

    def take_delivered(self) -> Dict[Tuple[int, str], int]:
        """Where the output drained so far ends in the backends' files, per (process key,
        stream); cleared.  The session records it once those bytes are written out."""
        drained, self._drained_offsets = self._drained_offsets, {}
        return drained

    @property
    def has_pending(self) -> bool:
        return bool(
            self._pending or self._output or any(self._removed.values()) or any(self._reissued.values())
        )

    def drain(self) -> List[WireEvent]:
        """Events for everything that changed since the snapshot or the last drain."""
        events: List[WireEvent] = []
        # Removals first, children before parents: what is gone for good, then what moved
        # (removed here and created again below under its new parent).
        for kind in _REMOVE_ORDER:
            removed = self._removed[kind]
            if removed:
                events.extend(self._remove_events(kind, removed))
                self._removed[kind] = []
        for kind in _REMOVE_ORDER:
            reissued = self._reissued[kind]
            if reissued:
                events.extend(self._remove_events(kind, reissued))
                self._reissued[kind] = []
        pending = self._pending
        self._pending = {}
        elements = self.model.by_key
        new_by_kind: Dict[Kind, List[Element]] = {kind: [] for kind in Kind}
        changes: Dict[Kind, List[Tuple[Element, Set[int]]]] = {kind: [] for kind in Kind}
        for key, record in pending.items():
            element = elements.get(key)
            if element is None:
                continue
            if record is _NEW:
                new_by_kind[element.kind].append(element)
            else:
                changes[element.kind].append((element, record))  # type: ignore[arg-type]
        own = self._own
        for kind in CREATE_ORDER:
            if kind is Kind.JOB and own:
                events.extend(self._own_job_events(new_by_kind[kind], changes[kind]))
            elif new_by_kind[kind]:
                events.extend(self._new_events(kind, new_by_kind[kind]))
        events.extend(self._output_events())
        for kind in _CHANGE_ORDER:
            if changes[kind]:
                events.extend(self._change_events(kind, changes[kind]))
        return events

    # ------------------------------------------------------------------ rendering

    def _grouped(self, event_id: int, head: List[str], groups: Iterable[Tuple[str, List[str]]]) -> List[WireEvent]:
        """Events with ``head`` then NUM_RANGES { RANGE NUM_ATTRS attrs }, split every
        MAX_GROUPS_PER_EVENT groups."""
        events: List[WireEvent] = []
        args: List[str] = []
        count = 0
        for range_text, attr_args in groups:
            args.append(range_text)
            args.append(str(len(attr_args)))
            args.extend(attr_args)
            count += 1
            if count == MAX_GROUPS_PER_EVENT:
                events.append((event_id, head + [str(count)] + args))
                args, count = [], 0
        if count:
            events.append((event_id, head + [str(count)] + args))
        return events

    def _own_job_events(self, new: List[Element], changes: List[Tuple[Element, Set[int]]]) -> List[WireEvent]:
        """NEW_JOB events, with the jobs of the client's own told of as the module documentation
        says: a NEW_JOB saying STARTING, then a JOB_CHANGE per state they went through.  The
        last of those (their current state) is left in ``changes``, to go out with their
        other changes; the ones before it are returned after the NEW_JOB events."""
        own = self._own
        slot = self._job_schema.index.get(K.STATE)
        if slot is None:
            return self._new_events(Kind.JOB, new) if new else []
        rows: Dict[int, tuple] = {}
        steps: List[Tuple[Element, List[Tuple[str, str]]]] = []
        done: List[int] = []
        for element in new:
            record = own.get(element.key)
            if record is None:
                continue
            sequence = record.sequence(self._state_of(element) or STARTING_STATUS, new=True)
            values = list(element.values)
            values[slot] = sequence[0][1]
            rows[element.key] = tuple(values)
            steps.append((element, sequence[1:-1]))
            if len(sequence) > 1:
                changes.append((element, {slot}))
            record.told_all(sequence)
            if record.told == COMPLETED:
                done.append(element.key)
        for element, slots in changes:
            record = own.get(element.key)
            if record is None or not record.steps:
                continue
            sequence = record.sequence(self._state_of(element) or STARTING_STATUS, new=False)
            steps.append((element, sequence[:-1]))
            slots.add(slot)
            record.told_all(sequence)
            if record.told == COMPLETED:
                done.append(element.key)
        for key in done:
            del own[key]
        events = self._new_events(Kind.JOB, new, rows) if new else []
        events.extend(self._state_events(steps))
        return events

    def _state_events(self, steps: List[Tuple[Element, List[Tuple[str, str]]]]) -> List[WireEvent]:
        """JOB_CHANGE events saying only the state, each job's states in order, one event
        per state of a job: the first states of all the jobs share an event (grouped by
        state), then their second states, and so on."""
        events: List[WireEvent] = []
        base = self.base
        rounds = max((len(sequence) for _, sequence in steps), default=0)
        for index in range(rounds):
            by_state: Dict[str, List[int]] = {}
            for element, sequence in steps:
                if index < len(sequence):
                    by_state.setdefault(sequence[index][1], []).append(base + element.key)
            built = [(ids_text(sorted(ids)), mapping.state_args(Kind.JOB, state)) for state, ids in by_state.items()]
            events.extend(self._grouped(EventId.JOB_CHANGE, [], built))
        return events

    def _refs(self, kind: Kind, members: List[Element]) -> str:
        if kind is Kind.PROCESS:
            return ids_text([e.rank for e in members])
        base = self.base
        return ids_text([base + e.key for e in members])

    def _new_events(self, kind: Kind, members: Sequence[Element],
                    rows: Optional[Dict[int, tuple]] = None) -> List[WireEvent]:
        """NEW events of ``members``, rendered from their values (or the row ``rows`` gives)."""
        by_parent: Dict[int, List[Element]] = {}
        for element in members:
            group = by_parent.get(element.parent)
            if group is None:
                by_parent[element.parent] = [element]
            else:
                group.append(element)
        event_id = PTP_KIND[kind].new_event
        args_of = self._renderers[kind].args
        base = self.base
        events: List[WireEvent] = []
        for parent, group in by_parent.items():
            parent_id = str(base + parent)
            if len(group) == 1:
                # the common case for a job's single process: no grouping needed
                element = group[0]
                args = args_of(rows.get(element.key, element.values) if rows else element.values)
                ref = str(element.rank) if kind is Kind.PROCESS else str(base + element.key)
                events.append((event_id, [parent_id, "1", ref, str(len(args)), *args]))
                continue
            # elements with identical values share one range group
            same: Dict[tuple, List[Element]] = {}
            for element in group:
                row = tuple(rows.get(element.key, element.values) if rows else element.values)
                bucket = same.get(row)
                if bucket is None:
                    same[row] = [element]
                else:
                    bucket.append(element)
            built = ((self._refs(kind, bucket), args_of(row)) for row, bucket in same.items())
            events.extend(self._grouped(event_id, [parent_id], built))
        return events

    def _change_events(self, kind: Kind, changes: List[Tuple[Element, Set[int]]]) -> List[WireEvent]:
        """CHANGE events: each new value goes with every element that took it, so elements
        that share a change share a group (and a range), whatever else changed for each of
        them (64 processes that entered RUNNING and got their pids meanwhile: one group
        saying RUNNING, then one per pid)."""
        renderer = self._renderers[kind]
        length = len(self.model.schema(kind).keys)

        def built(members: List[Tuple[Element, Set[int]]]) -> List[Tuple[str, List[str]]]:
            # (slot, value) -> the elements that took it; then the values alike elements took
            took: Dict[Tuple[int, Any], List[Element]] = {}
            for element, slots in members:
                values = element.values
                for i in slots:
                    pair = (i, values[i] if i < len(values) else None)
                    group = took.get(pair)
                    if group is None:
                        took[pair] = [element]
                    else:
                        group.append(element)
            alike: Dict[Tuple[int, ...], Tuple[List[Element], List[Tuple[int, Any]]]] = {}
            for pair, elements in took.items():
                ident = tuple([e.key for e in elements])
                entry = alike.get(ident)
                if entry is None:
                    alike[ident] = (elements, [pair])
                else:
                    entry[1].append(pair)
            groups: List[Tuple[str, List[str]]] = []
            for elements, pairs in alike.values():
                row: list = [None] * length
                cleared = []
                for i, value in sorted(pairs):
                    if value is None:
                        cleared.append(i)
                    else:
                        row[i] = value
                args = renderer.args(row)
                if cleared:
                    args.extend(renderer.cleared(cleared))
                if args:  # else a change nothing of which this client sees
                    groups.append((self._refs(kind, elements), args))
            return groups

        if kind is Kind.PROCESS:
            by_job: Dict[int, List[Tuple[Element, Set[int]]]] = {}
            for change in changes:
                by_job.setdefault(change[0].parent, []).append(change)
            events: List[WireEvent] = []
            for job, members in by_job.items():
                events.extend(self._grouped(EventId.PROCESS_CHANGE, [str(self.base + job)], built(members)))
            return events
        return self._grouped(PTP_KIND[kind].change_event, [], built(changes))

    def _remove_events(self, kind: Kind, removed: List[Tuple[int, int]]) -> List[WireEvent]:
        if kind is Kind.PROCESS:
            by_job: Dict[int, List[int]] = {}
            for parent, rank in removed:
                by_job.setdefault(parent, []).append(rank)
            return [
                (EventId.REMOVE_PROCESS, [str(self.base + job), ids_text(sorted(ranks))])
                for job, ranks in by_job.items()
            ]
        base = self.base
        return [(PTP_KIND[kind].remove_event, [ids_text(sorted(base + key for _, key in removed))])]

    def _output_events(self) -> List[WireEvent]:
        events: List[WireEvent] = []
        output = self._output
        if not output:
            return events
        self._output = {}
        self._output_bytes = {}
        self.held_output = 0
        if self._held_offsets:
            self._drained_offsets.update(self._held_offsets)
            self._held_offsets = {}
        dropped = self._output_dropped
        self._output_dropped = {}
        why = self._not_reading or "the client was not reading"
        if self.holds_back:
            self._not_reading = ""
        elements = self.model.by_key
        escape = self.rules.text
        base = self.base
        for process, blocks in output.items():
            element = elements.get(process)
            if element is None:
                continue
            job = str(base + element.parent)
            rank = str(element.rank)
            if process in dropped:
                note = f"[proxy-agent: {dropped[process]} earlier lines of output were dropped ({why})]"
                blocks.appendleft(("processStderr", note))
            for key, text in _joined(blocks):
                if escape is not None:
                    text = escape(text)
                events.append((EventId.PROCESS_CHANGE, [job, "1", rank, "1", f"{key}={text}"]))
        self.model.room_made()
        return events


def _joined(blocks: Deque[Tuple[str, str]]) -> Iterator[Tuple[str, str]]:
    """Held output as (key, text) values: consecutive blocks of one stream joined into texts
    of at most :data:`_OUTPUT_CHUNK` characters where the lines allow, a bigger block cut at
    its line ends (a line is never cut: the splitter already made every line short enough)."""
    key: Any = None
    buf: List[str] = []
    size = 0
    for k, text in blocks:
        if buf and (k != key or size + len(text) > _OUTPUT_CHUNK):
            yield key, "\n".join(buf)
            buf, size = [], 0
        key = k
        while len(text) > _OUTPUT_CHUNK:
            cut = text.rfind("\n", 0, _OUTPUT_CHUNK + 1)
            if cut < 0:
                break  # one line longer than a chunk: it travels whole
            if buf:
                yield key, "\n".join(buf)
                buf, size = [], 0
            yield key, text[:cut]
            text = text[cut + 1:]
        buf.append(text)
        size += len(text) + 1
    if buf:
        yield key, "\n".join(buf)

