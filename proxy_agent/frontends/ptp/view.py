"""One PTP client's view of the service model: what it has seen, what it has yet to see.

A :class:`ModelView` subscribes to the :class:`~proxy_agent.service.model.ServiceModel` when
its client starts events, streams the whole model to it (:meth:`ModelView.snapshot_chunks`),
and from then on keeps, per element, what the client has not been told yet
(:meth:`ModelView.drain`).  It renders both into PTP wire events (event id, arguments) with
the client's own ids: element id = the client's base id + the service key; a process is
named by its rank within its job.

Between two drains every element carries at most one pending record, so the memory held for
changes is bounded by the size of the model however long events stay stopped: a later value
replaces an earlier one, a NEW followed by a CHANGE is one NEW with the latest values, a NEW
followed by its REMOVE vanishes, a CHANGE followed by a REMOVE is just the REMOVE.  Process
output is the one stream that cannot be coalesced; it is held per process up to
:data:`HELD_OUTPUT_LIMIT` bytes, the oldest lines giving way (with a note saying how many).

Elements that share a change are sent in one event with one range set: 64 processes
entering RUNNING together become one PROCESS_CHANGE with one range.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ...protocol.messages import ElementKind, EventId
from ...protocol.rangeset import RangeSet
from ...service.model import CREATE_ORDER, REFERENCES, ChangeSink, Element, Kind, ServiceModel
from . import mapping

__all__ = ["HELD_OUTPUT_LIMIT", "MAX_GROUPS_PER_EVENT", "ModelView", "RenderRules", "WireEvent"]

#: An event before encoding: (event id, arguments in the documented layout).
WireEvent = Tuple[int, List[str]]

#: Elements per chunk of a streamed snapshot.
SNAPSHOT_CHUNK = 5000
#: Bytes of output held per process while the client is not being sent events.
HELD_OUTPUT_LIMIT = 1 << 20
#: Range groups per NEW/CHANGE event, so no frame grows without bound.
MAX_GROUPS_PER_EVENT = 2000
#: Output lines per process sent as separate events in one drain; more are joined.
MAX_OUTPUT_EVENTS_PER_DRAIN = 64
_OUTPUT_CHUNK = 64 * 1024

_PTP_KIND = {
    Kind.MACHINE: ElementKind.MACHINE,
    Kind.NODE: ElementKind.NODE,
    Kind.QUEUE: ElementKind.QUEUE,
    Kind.JOB: ElementKind.JOB,
    Kind.PROCESS: ElementKind.PROCESS,
}
_REMOVE_ORDER = tuple(reversed(CREATE_ORDER))
# Changes: a job's processes before the job, so a job's end follows its processes' ends.
_CHANGE_ORDER = (Kind.MACHINE, Kind.QUEUE, Kind.NODE, Kind.PROCESS, Kind.JOB)

_NEW = 1  # pending record: the client has not seen this element yet


class RenderRules:
    """How values are written for one client (its dialect decides).

    ``text`` escapes a text value (None: sent as it is); ``arrays`` allows multi-valued
    attributes in element events; ``integer_ids`` are attribute ids of INTEGER type whose
    values must fit ``integer_range`` (others are left out).
    """

    def __init__(
        self,
        text: Optional[Callable[[str], str]] = None,
        arrays: bool = True,
        integer_ids: Iterable[str] = (),
        integer_range: Optional[Tuple[int, int]] = None,
    ) -> None:
        self.text = text
        self.arrays = arrays
        self.integer_ids = frozenset(integer_ids)
        self.integer_range = integer_range


NATIVE_RULES = RenderRules()


class _Renderer:
    """Renders value rows of one element kind into ``key=value`` arguments (per client)."""

    __slots__ = ("kind", "schema", "rules", "base", "plan", "version")

    def __init__(self, kind: Kind, schema, rules: RenderRules, base: int) -> None:
        self.kind = kind
        self.schema = schema
        self.rules = rules
        self.base = base
        self.plan: List[object] = []
        self.version = -1

    def _refresh(self) -> None:
        keys = self.schema.keys
        self.plan = [self._entry(name) for name in keys]
        self.version = self.schema.version

    def _entry(self, name: str):
        kind, rules = self.kind, self.rules
        special = mapping.SPECIAL.get((kind, name))
        escape = rules.text
        if special == "state":
            return lambda value: mapping.state_args(kind, value)
        if special == "executable":
            if escape is None:
                return mapping.executable_args
            return lambda value: mapping.executable_args(escape(value))
        ptp_id = mapping.ptp_attribute(kind, name)
        if ptp_id is None:
            return None
        prefix = ptp_id + "="
        if name in REFERENCES:
            base = self.base
            return lambda value: [prefix + str(base + value)] if value.__class__ is int else [prefix + str(value)]
        bounds = rules.integer_range if ptp_id in rules.integer_ids else None
        arrays = rules.arrays
        if bounds is not None:
            low, high = bounds

            def integer(value, prefix=prefix, low=low, high=high):
                if value.__class__ is not str:
                    return []
                text = value.strip()
                if len(text) > 12 or not text.lstrip("-").isdigit() or not low <= int(text) <= high:
                    return []  # out of range for this client: absent, never a wrong number
                return [prefix + text]

            return integer
        if escape is None and arrays:
            return prefix  # the common case: prefix + text

        def general(value, prefix=prefix, escape=escape, arrays=arrays):
            if value.__class__ is str:
                return [prefix + (escape(value) if escape is not None else value)]
            if not arrays:
                return []
            if escape is None:
                return [prefix + item for item in value]
            return [prefix + escape(item) for item in value]

        return general

    def cleared(self, slots: Iterable[int]) -> List[str]:
        """``key=`` arguments for attributes that no longer have a value: without them a
        client would keep showing the value it was last sent."""
        kind, names = self.kind, self.schema.keys
        out: List[str] = []
        for i in slots:
            name = names[i]
            special = mapping.SPECIAL.get((kind, name))
            if special == "state":
                out.extend(arg.partition("=")[0] + "=" for arg in mapping.state_args(kind, ""))
            elif special == "executable":
                out.extend(("execName=", "execPath="))
            else:
                ptp_id = mapping.ptp_attribute(kind, name)
                if ptp_id is not None and ptp_id not in self.rules.integer_ids:
                    out.append(ptp_id + "=")
        return out

    def args(self, values: Sequence) -> List[str]:
        """``key=value`` arguments of a value row."""
        if self.version != self.schema.version:
            self._refresh()
        out: List[str] = []
        for value, entry in zip(values, self.plan):
            if value is None or entry is None:
                continue
            if entry.__class__ is str:
                if value.__class__ is str:
                    out.append(entry + value)  # type: ignore[operator]
                else:
                    out.extend(entry + item for item in value)  # type: ignore[operator]
            else:
                out.extend(entry(value))  # type: ignore[operator]
        return out


class ModelView(ChangeSink):
    """What one client has seen of the model, and renders what it has not (module docs)."""

    def __init__(self, model: ServiceModel, base_id: int, rules: RenderRules = NATIVE_RULES,
                 on_change: Optional[Callable[[], None]] = None) -> None:
        self.model = model
        self.base = base_id
        self.rules = rules
        self.on_change = on_change
        self._renderers = {kind: _Renderer(kind, model.schema(kind), rules, base_id) for kind in Kind}
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
        # snapshot progress: kinds done, the kind being sent and the last key sent of it
        self._snap_kind_index = len(CREATE_ORDER)
        self._snap_last = 0
        # elements created while the snapshot is being sent (they are not in it)
        self._late: Set[int] = set()
        self._snapshot_active = False

    # ------------------------------------------------------------------ ids

    def element_id(self, key: int) -> int:
        return self.base + key

    def key_of(self, element_id: int) -> int:
        return element_id - self.base

    # ------------------------------------------------------------------ subscription

    def subscribe(self) -> Iterator[List[WireEvent]]:
        """Start following the model; returns the snapshot as chunks of NEW events.

        The chunks may be consumed while the model keeps changing: the elements in the
        snapshot are fixed now; one removed before its chunk is skipped, one changed before
        its chunk goes with its current values, one created meanwhile is pending NEW for the
        first drain.  Drain only after the snapshot is exhausted.
        """
        model = self.model
        model.subscribe(self)
        self.subscribed = True
        order = []
        ascending = model.ascending()
        for kind in CREATE_ORDER:
            keys = model.keys(kind)
            if not ascending:
                keys.sort()
            order.append(keys)
        self._snap_kind_index = 0
        self._snap_last = 0
        self._snapshot_active = True
        for job, backlog in model.take_backlog().items():
            for process, stream, text in backlog.lines:
                self._hold_output(process, stream, text)
            for process, count in backlog.dropped.items():
                self._output_dropped[process] = self._output_dropped.get(process, 0) + count
        return self._snapshot_chunks(order)

    def unsubscribe(self) -> None:
        if self.subscribed:
            self.model.unsubscribe(self)
            self.subscribed = False

    def _snapshot_chunks(self, order: List[List[int]]) -> Iterator[List[WireEvent]]:
        elements = self.model._elements  # the view reads the model's table directly: hot path
        try:
            for index, (kind, keys) in enumerate(zip(CREATE_ORDER, order)):
                self._snap_kind_index = index
                self._snap_last = 0
                for start in range(0, len(keys), SNAPSHOT_CHUNK):
                    part = []
                    for key in keys[start:start + SNAPSHOT_CHUNK]:
                        element = elements.get(key)
                        # Pending NEW: reissued after a move; the first drain sends it.
                        if element is not None and self._pending.get(key) is not _NEW:
                            part.append(element)
                    if part:
                        self._snap_last = part[-1].key
                        yield self._new_events(kind, part)
                    elif keys[start:start + SNAPSHOT_CHUNK]:
                        self._snap_last = keys[min(start + SNAPSHOT_CHUNK, len(keys)) - 1]
        finally:
            self._snap_kind_index = len(CREATE_ORDER)
            self._snapshot_active = False
            self._late.clear()

    def _known(self, element: Element) -> bool:
        """Has the client been told of this element (and not of its removal)?"""
        key = element.key
        if self._pending.get(key) is _NEW:
            return False
        if not self._snapshot_active or key in self._late:
            return True
        index = CREATE_ORDER.index(element.kind)
        if index != self._snap_kind_index:
            return index < self._snap_kind_index
        return key <= self._snap_last

    # ------------------------------------------------------------------ ChangeSink

    def created(self, element: Element) -> None:
        self._pending[element.key] = _NEW
        if self._snapshot_active:
            self._late.add(element.key)

    def changed(self, element: Element, slots: Iterable[int]) -> None:
        key = element.key
        record = self._pending.get(key)
        if record is _NEW:
            return
        if record is None:
            if not self._known(element):
                return  # still to come in the snapshot, with its current values
            self._pending[key] = set(slots)
        else:
            record.update(slots)  # type: ignore[union-attr]

    def removed(self, element: Element) -> None:
        key = element.key
        known = self._known(element)
        self._pending.pop(key, None)
        self._late.discard(key)
        held = self._output.pop(key, None)
        if held is not None:
            self.held_output -= self._output_bytes.pop(key, 0)
        self._output_dropped.pop(key, None)
        if known:
            ref = element.rank if element.kind is Kind.PROCESS else key
            self._removed[element.kind].append((element.parent, ref))

    def moved(self, element: Element, old_parent: int) -> None:
        if not self._known(element):
            return  # it will be sent under its new parent
        self._reissue(element, old_parent)

    def _reissue(self, element: Element, parent: int) -> None:
        # Children first, as a removal goes; every element becomes NEW again.
        elements = self.model._elements
        for child in element.children or ():
            self._reissue(elements[child], element.key)
        if self._known(element):
            ref = element.rank if element.kind is Kind.PROCESS else element.key
            self._reissued[element.kind].append((parent, ref))
        self._pending[element.key] = _NEW

    def output(self, element: Element, stream: str, text: str) -> None:
        self._hold_output(element.key, stream, text)

    def _hold_output(self, process: int, stream: str, text: str) -> None:
        key = "processStdout" if stream == "stdout" else "processStderr"
        held = self._output.get(process)
        if held is None:
            held = self._output[process] = deque()
            self._output_bytes[process] = 0
        held.append((key, text))
        size = len(text) + 1
        total = self._output_bytes[process] + size
        self.held_output += size
        while total > HELD_OUTPUT_LIMIT and len(held) > 1:
            _, old = held.popleft()
            total -= len(old) + 1
            self.held_output -= len(old) + 1
            self._output_dropped[process] = self._output_dropped.get(process, 0) + 1
        self._output_bytes[process] = total

    def flush(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # ------------------------------------------------------------------ draining

    @property
    def has_pending(self) -> bool:
        return bool(
            self._pending or self._output or any(self._removed.values()) or any(self._reissued.values())
        )

    def drain(self) -> List[WireEvent]:
        """Events for everything that changed since the snapshot or the last drain."""
        events: List[WireEvent] = []
        for kind in _REMOVE_ORDER:
            reissued = self._reissued[kind]
            if reissued:
                events.extend(self._remove_events(kind, reissued))
                self._reissued[kind] = []
        pending = self._pending
        self._pending = {}
        elements = self.model._elements
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
        for kind in CREATE_ORDER:
            if new_by_kind[kind]:
                events.extend(self._new_events(kind, new_by_kind[kind]))
        events.extend(self._output_events())
        for kind in _CHANGE_ORDER:
            if changes[kind]:
                events.extend(self._change_events(kind, changes[kind]))
        for kind in _REMOVE_ORDER:
            removed = self._removed[kind]
            if removed:
                events.extend(self._remove_events(kind, removed))
                self._removed[kind] = []
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

    def _refs(self, kind: Kind, members: List[Element]) -> str:
        if kind is Kind.PROCESS:
            return _ids_text([e.rank for e in members])
        base = self.base
        return _ids_text([base + e.key for e in members])

    def _new_events(self, kind: Kind, members: Sequence[Element]) -> List[WireEvent]:
        by_parent: Dict[int, List[Element]] = {}
        for element in members:
            group = by_parent.get(element.parent)
            if group is None:
                by_parent[element.parent] = [element]
            else:
                group.append(element)
        event_id = _PTP_KIND[kind].new_event
        args_of = self._renderers[kind].args
        base = self.base
        events: List[WireEvent] = []
        for parent, group in by_parent.items():
            parent_id = str(base + parent)
            if len(group) == 1:
                # the common case for a job's single process: no grouping needed
                element = group[0]
                args = args_of(element.values)
                ref = str(element.rank) if kind is Kind.PROCESS else str(base + element.key)
                events.append((event_id, [parent_id, "1", ref, str(len(args)), *args]))
                continue
            # elements with identical values share one range group
            same: Dict[tuple, List[Element]] = {}
            for element in group:
                row = tuple(element.values)
                bucket = same.get(row)
                if bucket is None:
                    same[row] = [element]
                else:
                    bucket.append(element)
            built = ((self._refs(kind, bucket), args_of(row)) for row, bucket in same.items())
            events.extend(self._grouped(event_id, [parent_id], built))
        return events

    def _change_events(self, kind: Kind, changes: List[Tuple[Element, Set[int]]]) -> List[WireEvent]:
        renderer = self._renderers[kind]
        length = len(self.model.schema(kind).keys)

        def args_of(row: list, key: tuple) -> List[str]:
            args = renderer.args(row)
            if any(value is None for _, value in key):
                args.extend(renderer.cleared(i for i, value in key if value is None))
            return args

        def row_key(element: Element, slots: Set[int]) -> tuple:
            values = element.values
            return tuple(sorted((i, values[i] if i < len(values) else None) for i in slots))

        def sparse(key: tuple) -> list:
            row: list = [None] * length
            for i, value in key:
                row[i] = value
            return row

        if kind is Kind.PROCESS:
            by_job: Dict[int, Dict[tuple, List[Element]]] = {}
            for element, slots in changes:
                groups = by_job.setdefault(element.parent, {})
                groups.setdefault(row_key(element, slots), []).append(element)
            events: List[WireEvent] = []
            for job, groups in by_job.items():
                built = [(self._refs(kind, m), args_of(sparse(key), key)) for key, m in groups.items()]
                built = [(r, a) for r, a in built if a]  # a change nothing of which this client sees
                events.extend(self._grouped(EventId.PROCESS_CHANGE, [str(self.base + job)], built))
            return events
        grouped: Dict[tuple, List[Element]] = {}
        for element, slots in changes:
            grouped.setdefault(row_key(element, slots), []).append(element)
        built = [(self._refs(kind, m), args_of(sparse(key), key)) for key, m in grouped.items()]
        built = [(r, a) for r, a in built if a]  # a change nothing of which this client sees
        return self._grouped(_PTP_KIND[kind].change_event, [], built)

    def _remove_events(self, kind: Kind, removed: List[Tuple[int, int]]) -> List[WireEvent]:
        if kind is Kind.PROCESS:
            by_job: Dict[int, List[int]] = {}
            for parent, rank in removed:
                by_job.setdefault(parent, []).append(rank)
            return [
                (EventId.REMOVE_PROCESS, [str(self.base + job), _ids_text(sorted(ranks))])
                for job, ranks in by_job.items()
            ]
        base = self.base
        return [(_PTP_KIND[kind].remove_event, [_ids_text(sorted(base + key for _, key in removed))])]

    def _output_events(self) -> List[WireEvent]:
        events: List[WireEvent] = []
        output = self._output
        if not output:
            return events
        self._output = {}
        self._output_bytes = {}
        self.held_output = 0
        dropped = self._output_dropped
        self._output_dropped = {}
        elements = self.model._elements
        escape = self.rules.text
        base = self.base
        for process, lines in output.items():
            element = elements.get(process)
            if element is None:
                continue
            job = str(base + element.parent)
            rank = str(element.rank)
            if process in dropped:
                note = (f"[proxy-agent: {dropped[process]} earlier lines of output were dropped: "
                        f"more than {HELD_OUTPUT_LIMIT} bytes were waiting to be sent]")
                lines.appendleft(("processStderr", note))
            for key, text in _batch_lines(lines):
                if escape is not None:
                    text = escape(text)
                events.append((EventId.PROCESS_CHANGE, [job, "1", rank, "1", f"{key}={text}"]))
        return events


def _ids_text(members: List[int]) -> str:
    """Range-set text for ids (usually ascending runs, often a single id)."""
    if len(members) == 1:
        return str(members[0])
    first, last = members[0], members[-1]
    if last - first == len(members) - 1 and members == list(range(first, last + 1)):
        return f"{first}-{last}"
    return str(RangeSet.from_ids(members))


def _batch_lines(lines: Deque[Tuple[str, str]]) -> Iterator[Tuple[str, str]]:
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
