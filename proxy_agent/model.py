"""The element tree the agent presents, and the coalesced stream of its changes.

Schedulers mutate the :class:`Model` (add, update, move, remove elements,
append process output).  The agent turns those mutations into protocol events:

* :meth:`Model.snapshot` -- the whole model as NEW events, parents first.
* :meth:`Model.drain` -- what changed since the last snapshot or drain.

Between two drains every element carries at most one pending record, so
memory held for changes is bounded by the size of the model, however long
events stay stopped: a later value of an attribute replaces an earlier one,
a NEW followed by a CHANGE is still one NEW with the latest attributes, a NEW
followed by its REMOVE vanishes, and a CHANGE followed by a REMOVE is just
the REMOVE.  Process output is the one stream that cannot be coalesced; it is
held per process up to :data:`HELD_OUTPUT_LIMIT` bytes, the oldest lines giving
way (with a note saying how many were dropped) when that is exceeded.

Elements that share a change are sent in one event with one range set: 64
processes entering RUNNING together become one PROCESS_CHANGE with one range.

Attributes are stored per kind in a column layout (one list of values per
element, one key table per kind) because a model of 100,000 jobs with a dict
per element would cost several times the memory.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .protocol.ids import IdAllocator
from .protocol.messages import ElementKind, Event, EventId, decode_event
from .protocol.rangeset import RangeSet
from .protocol.wire import Frame

__all__ = ["Element", "Model", "UnknownElement", "HELD_OUTPUT_LIMIT", "MAX_GROUPS_PER_EVENT"]

AttrValue = Union[str, Tuple[str, ...]]
#: An event before encoding: (event id, arguments in the documented layout).
WireEvent = Tuple[int, List[str]]

#: Elements per chunk of a streamed snapshot.
SNAPSHOT_CHUNK = 5000

#: Bytes of output held per process while events are stopped.
HELD_OUTPUT_LIMIT = 1 << 20
#: Range groups per NEW/CHANGE event, so no frame grows without bound.
MAX_GROUPS_PER_EVENT = 2000
#: Output lines per process sent as separate events in one drain; more are joined.
MAX_OUTPUT_EVENTS_PER_DRAIN = 64
_OUTPUT_CHUNK = 64 * 1024

# Parents before children when creating, children before parents when removing.
_CREATE_ORDER = (ElementKind.MACHINE, ElementKind.QUEUE, ElementKind.NODE, ElementKind.JOB, ElementKind.PROCESS)
_REMOVE_ORDER = tuple(reversed(_CREATE_ORDER))
# Changes: a job's processes before the job, so a job's COMPLETED follows its processes' exits.
_CHANGE_ORDER = (ElementKind.MACHINE, ElementKind.QUEUE, ElementKind.NODE, ElementKind.PROCESS, ElementKind.JOB)

_NEW = 1  # pending record: the client has not seen this element yet


class UnknownElement(KeyError):
    """No element with that id (or not of the expected kind)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown element"


class _Schema:
    """Attribute keys of one element kind, in first-seen order."""

    __slots__ = ("keys", "index", "prefixes", "arrays")

    def __init__(self) -> None:
        self.keys: List[str] = []
        self.index: Dict[str, int] = {}
        #: "key=" per slot, to build key=value arguments with one concatenation
        self.prefixes: List[str] = []
        #: some element of this kind has (had) an ARRAY value
        self.arrays = False

    def slot(self, key: str) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.prefixes.append(key + "=")
        return i


class Element:
    """One machine, node, queue, job or process."""

    __slots__ = ("id", "kind", "parent", "values", "children", "sent")

    def __init__(self, eid: int, kind: ElementKind, parent: int, values: list) -> None:
        self.id = eid
        self.kind = kind
        self.parent = parent
        self.values = values
        self.children: Optional[list] = None
        #: the client knows this element (it was in a snapshot or a drained NEW)
        self.sent = False


class Model:
    """The agent's model of machines, nodes, queues, jobs and processes."""

    def __init__(self, allocator: IdAllocator) -> None:
        self.allocator = allocator
        self.rm_id = allocator.base_id
        self._elements: Dict[int, Element] = {}
        self._schemas: Dict[ElementKind, _Schema] = {kind: _Schema() for kind in ElementKind}
        self._by_kind: Dict[ElementKind, Dict[int, None]] = {kind: {} for kind in ElementKind}
        # pending records: id -> _NEW or a dict of changed slot -> value
        self._pending: Dict[int, Union[int, Dict[int, AttrValue]]] = {}
        # elements the client knew that have since been removed: kind -> [(parent, id)]
        self._removed: Dict[ElementKind, List[Tuple[int, int]]] = {kind: [] for kind in ElementKind}
        # elements the client knew that moved to another parent: they are removed (before any
        # NEW of the same drain) and created again under the new parent
        self._reissued: Dict[ElementKind, List[Tuple[int, int]]] = {kind: [] for kind in ElementKind}
        # held output: process id -> deque of (key, line); dropped line counts
        self._output: Dict[int, deque] = {}
        self._output_bytes: Dict[int, int] = {}
        self._output_dropped: Dict[int, int] = {}
        self._quiet = 0
        self._missed = False
        #: called (without arguments) whenever something new is pending
        self.on_change: Optional[Callable[[], None]] = None

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._elements)

    def __contains__(self, eid: object) -> bool:
        return eid in self._elements

    def get(self, eid: int) -> Element:
        try:
            return self._elements[eid]
        except KeyError:
            raise UnknownElement(f"no element with id {eid}") from None

    def find(self, eid: int, kind: ElementKind) -> Element:
        element = self._elements.get(eid)
        if element is None or element.kind is not kind:
            raise UnknownElement(f"no {kind.value} with id {eid}")
        return element

    def ids(self, kind: ElementKind) -> List[int]:
        return list(self._by_kind[kind])

    def count(self, kind: ElementKind) -> int:
        return len(self._by_kind[kind])

    def attrs(self, eid: int) -> Dict[str, AttrValue]:
        """The element's attributes as a fresh dict."""
        element = self.get(eid)
        keys = self._schemas[element.kind].keys
        return {keys[i]: v for i, v in enumerate(element.values) if v is not None}

    def attr(self, eid: int, key: str, default: Optional[AttrValue] = None) -> Optional[AttrValue]:
        element = self.get(eid)
        i = self._schemas[element.kind].index.get(key)
        if i is None or i >= len(element.values):
            return default
        value = element.values[i]
        return default if value is None else value

    def children(self, eid: int, kind: Optional[ElementKind] = None) -> List[int]:
        element = self.get(eid)
        if not element.children:
            return []
        if kind is None:
            return list(element.children)
        return [c for c in element.children if self._elements[c].kind is kind]

    @property
    def has_pending(self) -> bool:
        return bool(
            self._pending or self._output or any(self._removed.values()) or any(self._reissued.values())
        )

    # ------------------------------------------------------------------ mutation

    def _values(self, kind: ElementKind, attrs: Mapping[str, AttrValue]) -> list:
        schema = self._schemas[kind]
        values: list = [None] * len(schema.keys)
        for key, value in attrs.items():
            i = schema.slot(key)
            if i >= len(values):
                values.extend([None] * (i + 1 - len(values)))
            value = _freeze(value)
            if value.__class__ is tuple:
                schema.arrays = True
            values[i] = value
        return values

    def _attach(self, element: Element) -> None:
        self._elements[element.id] = element
        self._by_kind[element.kind][element.id] = None
        parent = self._elements.get(element.parent)
        if parent is not None:
            if parent.children is None:
                parent.children = []
            parent.children.append(element.id)
        self._pending[element.id] = _NEW

    def _check_parent(self, kind: ElementKind, parent: int) -> None:
        if kind in (ElementKind.MACHINE, ElementKind.QUEUE):
            if parent != self.rm_id:
                raise ValueError(f"a {kind.value}'s parent must be the resource manager {self.rm_id}")
            return
        wanted = {
            ElementKind.NODE: ElementKind.MACHINE,
            ElementKind.JOB: ElementKind.QUEUE,
            ElementKind.PROCESS: ElementKind.JOB,
        }[kind]
        self.find(parent, wanted)

    def add(self, kind: ElementKind, parent: Optional[int], attrs: Mapping[str, AttrValue]) -> int:
        """Create one element; returns its id.  Machines and queues take parent None."""
        return self.add_many(kind, parent, [attrs])[0]

    def add_many(
        self, kind: ElementKind, parent: Optional[int], attrs_list: Sequence[Mapping[str, AttrValue]]
    ) -> range:
        """Create related elements with contiguous ids (a job's processes, a machine's nodes)."""
        if parent is None:
            parent = self.rm_id
        self._check_parent(kind, parent)
        ids = self.allocator.allocate(kind.value, len(attrs_list))
        for eid, attrs in zip(ids, attrs_list):
            self._attach(Element(eid, kind, parent, self._values(kind, attrs)))
        self._notify()
        return ids

    def update(self, eid: int, attrs: Mapping[str, AttrValue]) -> bool:
        """Set attributes; only values that differ become pending. Returns True if any did."""
        element = self.get(eid)
        schema = self._schemas[element.kind]
        values = element.values
        changed: Optional[Dict[int, AttrValue]] = None
        for key, value in attrs.items():
            value = _freeze(value)
            if value.__class__ is tuple:
                schema.arrays = True
            i = schema.slot(key)
            if i >= len(values):
                values.extend([None] * (i + 1 - len(values)))
            if values[i] == value:
                continue
            values[i] = value
            if changed is None:
                changed = {}
            changed[i] = value
        if changed is None:
            return False
        record = self._pending.get(eid)
        if record is None:
            self._pending[eid] = changed
        elif record is not _NEW:
            record.update(changed)  # type: ignore[union-attr]
        self._notify()
        return True

    def update_many(self, eids: Iterable[int], attrs: Mapping[str, AttrValue]) -> int:
        """Apply the same attributes to many elements; returns how many changed.

        Listeners hear of it once, so the change goes out as one event.
        """
        with self.batch():
            return sum(1 for eid in eids if self.update(eid, attrs))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group mutations: :attr:`on_change` is called once, at the end, if anything changed."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1
            if self._quiet == 0 and self._missed:
                self._missed = False
                self._notify()

    def remove(self, eid: int) -> None:
        """Remove an element and everything below it."""
        element = self.get(eid)
        parent = self._elements.get(element.parent)
        if parent is not None and parent.children:
            try:
                parent.children.remove(eid)
            except ValueError:
                pass
        self._remove_tree(element)
        self._notify()

    def _remove_tree(self, element: Element) -> None:
        for child in element.children or ():
            self._remove_tree(self._elements[child])
        del self._elements[element.id]
        del self._by_kind[element.kind][element.id]
        self._pending.pop(element.id, None)
        self._output.pop(element.id, None)
        self._output_bytes.pop(element.id, None)
        self._output_dropped.pop(element.id, None)
        if element.sent:
            self._removed[element.kind].append((element.parent, element.id))

    def move(self, eid: int, new_parent: int) -> None:
        """Give an element another parent (a job moving to another queue).

        The protocol cannot re-parent an element, so a client that already knows it sees it
        (and everything below it) removed and then created again under the new parent, with
        the same ids and current attributes, in one drain with the removals first.  An
        element the client has not seen yet just gets its NEW under the new parent.
        """
        element = self.get(eid)
        if element.kind in (ElementKind.MACHINE, ElementKind.QUEUE):
            raise ValueError(f"a {element.kind.value}'s parent is always the resource manager")
        if new_parent == element.parent:
            return
        self._check_parent(element.kind, new_parent)
        old_parent = self._elements.get(element.parent)
        if old_parent is not None and old_parent.children:
            try:
                old_parent.children.remove(eid)
            except ValueError:
                pass
        if element.sent:
            self._reissue(element)
        element.parent = new_parent
        parent = self._elements[new_parent]
        if parent.children is None:
            parent.children = []
        parent.children.append(eid)
        self._notify()

    def _reissue(self, element: Element) -> None:
        # Children first, as a removal goes; every element becomes NEW again.
        for child in element.children or ():
            self._reissue(self._elements[child])
        if element.sent:
            self._reissued[element.kind].append((element.parent, element.id))
            element.sent = False
        self._pending[element.id] = _NEW

    def output(self, process_id: int, line: str, stream: str = "stdout") -> None:
        """Append one line of a process's output (``stream`` is stdout or stderr)."""
        element = self.find(process_id, ElementKind.PROCESS)
        key = "processStdout" if stream == "stdout" else "processStderr"
        held = self._output.get(element.id)
        if held is None:
            held = self._output[element.id] = deque()
            self._output_bytes[element.id] = 0
        held.append((key, line))
        size = self._output_bytes[element.id] + len(line) + 1
        while size > HELD_OUTPUT_LIMIT and len(held) > 1:
            _, old = held.popleft()
            size -= len(old) + 1
            self._output_dropped[element.id] = self._output_dropped.get(element.id, 0) + 1
        self._output_bytes[element.id] = size
        self._notify()

    def _notify(self) -> None:
        if self._quiet:
            self._missed = True
        elif self.on_change is not None:
            self.on_change()

    # ------------------------------------------------------------------ events
    #
    # Events are built as "wire events": (event id, argument list) pairs in the
    # documented layouts, which the agent checks and encodes in bulk.  The typed
    # views (snapshot(), drain()) decode those, for tests and tools.

    def snapshot_wire(self, tid: int, chunk: int = SNAPSHOT_CHUNK) -> Iterator[List[WireEvent]]:
        """The whole model as NEW events, parents first, in chunks of about ``chunk`` elements.

        Pending changes are absorbed.  The chunks may be consumed while the
        model keeps changing: the element ids are fixed when this is called;
        an element removed before its chunk is skipped, one changed before its
        chunk is sent with its current values (its pending CHANGE repeats them),
        one added meanwhile is pending NEW for the next drain.  Do not drain
        until the snapshot is exhausted.  Held output is kept for that drain.
        """
        for kind in ElementKind:
            self._removed[kind].clear()
            self._reissued[kind].clear()
        self._pending.clear()
        order = [(kind, list(self._by_kind[kind])) for kind in _CREATE_ORDER]
        return self._snapshot_chunks(tid, order, chunk)

    def _snapshot_chunks(self, tid: int, order, chunk: int) -> Iterator[List[WireEvent]]:
        elements = self._elements
        for kind, ids in order:
            for start in range(0, len(ids), chunk):
                part = []
                for eid in ids[start:start + chunk]:
                    element = elements.get(eid)
                    # Pending NEW: below an element moved meanwhile (see move); the next
                    # drain sends it after its parent's REMOVE and NEW.
                    if element is not None and not element.sent and self._pending.get(eid) is not _NEW:
                        element.sent = True
                        part.append(eid)
                if part:
                    yield self._new_wire(tid, kind, part)

    def snapshot(self, tid: int) -> List[Event]:
        """:meth:`snapshot_wire` as typed events, all at once."""
        return [_typed(tid, w) for part in self.snapshot_wire(tid) for w in part]

    def drain(self, tid: int) -> List[Event]:
        """:meth:`drain_wire` as typed events."""
        return [_typed(tid, w) for w in self.drain_wire(tid)]

    def drain_wire(self, tid: int) -> List[WireEvent]:
        """Events for everything that changed since the last snapshot or drain."""
        events: List[WireEvent] = []
        for kind in _REMOVE_ORDER:
            reissued = self._reissued[kind]
            if reissued:
                events.extend(self._remove_wire(kind, reissued))
                self._reissued[kind] = []
        pending = self._pending
        self._pending = {}
        new_by_kind: Dict[ElementKind, List[int]] = {kind: [] for kind in ElementKind}
        changes: Dict[ElementKind, List[Tuple[int, Dict[int, AttrValue]]]] = {kind: [] for kind in ElementKind}
        for eid, record in pending.items():
            element = self._elements[eid]
            if record is _NEW:
                new_by_kind[element.kind].append(eid)
                element.sent = True
            else:
                changes[element.kind].append((eid, record))  # type: ignore[arg-type]
        for kind in _CREATE_ORDER:
            if new_by_kind[kind]:
                events.extend(self._new_wire(tid, kind, new_by_kind[kind]))
        events.extend(self._output_wire())
        for kind in _CHANGE_ORDER:
            if changes[kind]:
                events.extend(self._change_wire(kind, changes[kind]))
        for kind in _REMOVE_ORDER:
            removed = self._removed[kind]
            if removed:
                events.extend(self._remove_wire(kind, removed))
                self._removed[kind] = []
        return events

    def _attr_args(self, kind: ElementKind, values: Sequence) -> List[str]:
        """``key=value`` arguments for a value row (ARRAY values repeat the key)."""
        schema = self._schemas[kind]
        if not schema.arrays:
            return [p + v for p, v in zip(schema.prefixes, values) if v is not None]
        out = []
        for prefix, value in zip(schema.prefixes, values):
            if value is None:
                continue
            if value.__class__ is str:
                out.append(prefix + value)
            else:
                out.extend(prefix + item for item in value)
        return out

    def _grouped_events(self, event_id: int, head: List[str], groups: Iterable[Tuple[List[int], List[str]]]) -> List[WireEvent]:
        """Events with ``head`` then NUM_RANGES { RANGE NUM_ATTRS attrs }, split every MAX_GROUPS_PER_EVENT."""
        events: List[WireEvent] = []
        args: List[str] = []
        count = 0
        for members, attr_args in groups:
            args.append(_ids_text(members))
            args.append(str(len(attr_args)))
            args.extend(attr_args)
            count += 1
            if count == MAX_GROUPS_PER_EVENT:
                events.append((event_id, head + [str(count)] + args))
                args, count = [], 0
        if count:
            events.append((event_id, head + [str(count)] + args))
        return events

    def _new_wire(self, tid: int, kind: ElementKind, ids: Iterable[int]) -> List[WireEvent]:
        elements = self._elements
        by_parent: Dict[int, List[int]] = {}
        for eid in ids:
            parent = elements[eid].parent
            members = by_parent.get(parent)
            if members is None:
                by_parent[parent] = [eid]
            else:
                members.append(eid)
        event_id = kind.new_event
        attr_args = self._attr_args
        events: List[WireEvent] = []
        for parent, members in by_parent.items():
            if len(members) == 1:
                # the common case for a job's single process: no grouping needed
                eid = members[0]
                args = attr_args(kind, elements[eid].values)
                events.append((event_id, [str(parent), "1", str(eid), str(len(args)), *args]))
                continue
            # elements with identical attribute values share one range group
            groups: Dict[tuple, List[int]] = {}
            for eid in members:
                key = tuple(elements[eid].values)
                same = groups.get(key)
                if same is None:
                    groups[key] = [eid]
                else:
                    same.append(eid)
            built = ((same, attr_args(kind, key)) for key, same in groups.items())
            events.extend(self._grouped_events(event_id, [str(parent)], built))
        return events

    def _change_wire(self, kind: ElementKind, changes: List[Tuple[int, Dict[int, AttrValue]]]) -> List[WireEvent]:
        schema_len = len(self._schemas[kind].keys)
        if kind is ElementKind.PROCESS:
            by_job: Dict[int, Dict[tuple, List[int]]] = {}
            for eid, changed in changes:
                job = self._elements[eid].parent
                groups = by_job.setdefault(job, {})
                groups.setdefault(_change_key(changed), []).append(eid)
            events: List[WireEvent] = []
            for job, groups in by_job.items():
                built = ((m, self._attr_args(kind, _expand(key, schema_len))) for key, m in groups.items())
                events.extend(self._grouped_events(EventId.PROCESS_CHANGE, [str(job)], built))
            return events
        grouped: Dict[tuple, List[int]] = {}
        for eid, changed in changes:
            grouped.setdefault(_change_key(changed), []).append(eid)
        built = ((m, self._attr_args(kind, _expand(key, schema_len))) for key, m in grouped.items())
        return self._grouped_events(kind.change_event, [], built)

    def _remove_wire(self, kind: ElementKind, removed: List[Tuple[int, int]]) -> List[WireEvent]:
        if kind is ElementKind.PROCESS:
            by_job: Dict[int, List[int]] = {}
            for parent, eid in removed:
                by_job.setdefault(parent, []).append(eid)
            return [(EventId.REMOVE_PROCESS, [str(job), _ids_text(ids)]) for job, ids in by_job.items()]
        return [(kind.remove_event, [_ids_text([eid for _, eid in removed])])]

    def _output_wire(self) -> List[WireEvent]:
        events: List[WireEvent] = []
        output = self._output
        if not output:
            return events
        self._output = {}
        self._output_bytes = {}
        dropped = self._output_dropped
        self._output_dropped = {}
        for pid, lines in output.items():
            element = self._elements.get(pid)
            if element is None:
                continue
            job = str(element.parent)
            ids = str(pid)
            if pid in dropped:
                note = f"[proxy-agent: {dropped[pid]} earlier lines dropped while events were stopped]"
                lines.appendleft(("processStderr", note))
            for key, text in _batch_lines(lines):
                events.append((EventId.PROCESS_CHANGE, [job, "1", ids, "1", f"{key}={text}"]))
        return events


def _typed(tid: int, wire: WireEvent) -> Event:
    event_id, args = wire
    return decode_event(Frame(int(event_id), tid, tuple(args)))


def _freeze(value: AttrValue) -> AttrValue:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return str(value)


def _ids_text(members: List[int]) -> str:
    """Range-set text for element ids (usually ascending runs, often a single id)."""
    if len(members) == 1:
        return str(members[0])
    first, last = members[0], members[-1]
    if last - first == len(members) - 1 and members == list(range(first, last + 1)):
        return f"{first}-{last}"
    return str(RangeSet.from_ids(members))


def _change_key(changed: Dict[int, AttrValue]) -> tuple:
    return tuple(sorted(changed.items()))


def _expand(key: tuple, length: int) -> list:
    values: list = [None] * length
    for i, value in key:
        values[i] = value
    return values


def _batch_lines(lines: deque) -> Iterator[Tuple[str, str]]:
    """Lines as (key, text) values: one per line when few, joined when many."""
    if len(lines) <= MAX_OUTPUT_EVENTS_PER_DRAIN:
        yield from lines
        return
    key = None
    buf: List[str] = []
    size = 0
    for k, text in lines:
        if buf and (k != key or size + len(text) > _OUTPUT_CHUNK):
            yield key, "\n".join(buf)  # type: ignore[misc]
            buf, size = [], 0
        key = k
        buf.append(text)
        size += len(text) + 1
    if buf:
        yield key, "\n".join(buf)  # type: ignore[misc]
