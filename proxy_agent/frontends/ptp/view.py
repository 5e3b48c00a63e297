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
COMPLETED...), in order, however much else is merged meanwhile (:class:`_OwnJob`).  A job that
ran but ended before its client was told still goes STARTING, RUNNING, COMPLETED; one that
never ran (cancelled while queued) gets no RUNNING.  While its submission is being carried
out, the job (with its processes and output) is held back from the client alone, so that the
submission's OK comes first (:meth:`ModelView.expect_submission`).

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

import gc
import logging
import sys
import weakref
from array import array
from itertools import groupby, islice, repeat
from operator import add, sub
from collections import deque
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ...protocol.messages import ElementKind, EventId
from ...protocol.rangeset import RangeSet
from ...protocol.wire import _ARG_PREFIXES, assemble_frame, encode_args
from ...service.jobs import JobState
from ...service.model import CREATE_ORDER, REFERENCES, ChangeSink, Element, K, Kind, ServiceModel
from . import mapping

log = logging.getLogger("proxy_agent.frontends.ptp")

__all__ = ["HELD_OUTPUT_LIMIT", "HELD_TOTAL_LIMIT", "STALL_SECONDS", "MAX_GROUPS_PER_EVENT", "ModelView", "RenderRules", "SnapshotPlan", "WireEvent"]

#: An event before encoding: (event id, arguments in the documented layout).
WireEvent = Tuple[int, List[str]]

#: Bytes per chunk of snapshot frames handed to a session's writer.
SNAPSHOT_CHUNK_BYTES = 1 << 18
#: Bytes of the first chunk: the chunks grow from this to SNAPSHOT_CHUNK_BYTES, so that the
#: client has the first frames to decode while the agent is still making the rest.
FIRST_CHUNK_BYTES = 32 << 10
#: Bytes of output held per process for a client that is not reading.
HELD_OUTPUT_LIMIT = 1 << 20
#: Bytes of output held in all for a client that is not reading.
HELD_TOTAL_LIMIT = 32 << 20
#: A client whose connection takes nothing for this long is not reading.
STALL_SECONDS = 15.0
#: Range groups per NEW/CHANGE event, so no frame grows without bound.
MAX_GROUPS_PER_EVENT = 2000
_OUTPUT_CHUNK = 64 * 1024
#: Distinct values a slot's render cache takes before it checks that values recur.
_CACHE_TRIAL = 4096
#: Arguments shorter than this have their length prefix ready made.
_SHORT = len(_ARG_PREFIXES)

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
_NEW_PROCESS = int(ElementKind.PROCESS.new_event)

#: PTP's state before a job runs, and the service state a job is shown in when its client is
#: told of it only once it was already further on
_STARTING = "STARTING"
_RUNNING = "RUNNING"
_COMPLETED = "COMPLETED"
_STARTING_STATUS = JobState.ACCEPTED.value
#: State changes kept per job of the client's own between two drains; beyond, repeated
#: suspend/resume pairs in the middle are merged (the first and last states stay).
_MAX_STEPS = 8


def _ran(state: str) -> bool:
    """A service state that says the job's processes began to run."""
    try:
        return JobState(state).started
    except ValueError:
        return False


class _OwnJob:
    """A job this view's client submitted: the PTP states (``jobState``) it went through that
    the client has not been told yet, each with the service state (``jobStatus``) it was last
    in, so that none is merged away (see the module documentation)."""

    __slots__ = ("steps", "told", "told_running", "ran")

    def __init__(self, state: Optional[str]) -> None:
        #: (PTP state, service state) not yet told, oldest first; no two in a row alike
        self.steps: List[Tuple[str, str]] = []
        #: the PTP state the client was told last (None: it has not been told of the job)
        self.told: Optional[str] = None
        #: the client has been told RUNNING
        self.told_running = False
        #: the job has been in a state that says it ran
        self.ran = False
        if state is not None:
            self.note(state)

    def note(self, state: str) -> None:
        """The job is now in service state ``state``."""
        if not self.ran and _ran(state):
            self.ran = True
        coarse = mapping.PTP_JOB_STATE.get(state, _STARTING)
        steps = self.steps
        if steps:
            if steps[-1][0] == coarse:
                steps[-1] = (coarse, state)
                return
        elif coarse == self.told:
            return  # a finer change within the state the client has: an ordinary change
        steps.append((coarse, state))
        if len(steps) > _MAX_STEPS:
            for i in range(1, len(steps) - 2):
                if steps[i - 1][0] == steps[i + 1][0]:
                    del steps[i:i + 2]  # A B A C -> A C: a suspension and its resumption
                    break

    def sequence(self, current: str, new: bool) -> List[Tuple[str, str]]:
        """The states to tell the client now, the last being the job's current one.  A job the
        client is told of first (``new``) begins with STARTING; a job that ran and ended
        before its client was told RUNNING has RUNNING before its end."""
        steps = list(self.steps) or [(mapping.PTP_JOB_STATE.get(current, _STARTING), current)]
        if new and steps[0][0] != _STARTING:
            steps.insert(0, (_STARTING, _STARTING_STATUS))
        if (steps[-1][0] == _COMPLETED and not self.told_running and all(c != _RUNNING for c, _ in steps)
                and (self.ran or _ran(current))):
            steps.insert(len(steps) - 1, (_RUNNING, JobState.RUNNING.value))
        return steps

    def told_all(self, sequence: List[Tuple[str, str]]) -> None:
        self.steps = []
        self.told = sequence[-1][0]
        if any(coarse == _RUNNING for coarse, _ in sequence):
            self.told_running = True


class RenderRules:
    """How values are written for one client (its dialect decides).

    ``text`` escapes a text value (None: sent as it is); ``arrays`` allows multi-valued
    attributes in element events; ``omit`` are attribute ids never put in element events;
    ``integer_ids`` are attribute ids of INTEGER type whose values go through ``integer``
    (which returns the text to send, or None to leave the attribute out); ``max_id`` is the
    highest element id the client can hold.
    """

    def __init__(
        self,
        text: Optional[Callable[[str], str]] = None,
        arrays: bool = True,
        integer_ids: Iterable[str] = (),
        integer: Optional[Callable[[str], Optional[str]]] = None,
        omit: Iterable[str] = (),
        max_id: Optional[int] = None,
    ) -> None:
        self.text = text
        self.arrays = arrays
        self.integer_ids = frozenset(integer_ids) if integer is not None else frozenset()
        self.integer = integer
        self.omit = frozenset(omit)
        self.max_id = max_id


NATIVE_RULES = RenderRules()


class _Ref:
    """A reference attribute in a shared snapshot: ``prefix`` + the id of service key ``key``,
    filled in per client."""

    __slots__ = ("prefix", "key")

    def __init__(self, prefix: str, key: int) -> None:
        self.prefix = prefix
        self.key = key


class _IdPrefix:
    """A reference attribute rendered for a known base id: ``prefix`` + (base + key)."""

    __slots__ = ("prefix", "base", "other")

    def __init__(self, prefix: str, base: int, other) -> None:
        self.prefix = prefix
        self.base = base
        #: how a value that is not a key (a text) is rendered
        self.other = other


class _Checked:
    """A text attribute whose text passes a check first: ``prefix`` + ``check(text)``, or
    nothing when the check returns None.  Values that are not one text go to ``other``."""

    __slots__ = ("prefix", "check", "other")

    def __init__(self, prefix: str, check: Callable[[str], Optional[str]], other) -> None:
        self.prefix = prefix
        self.check = check
        self.other = other

    def __call__(self, value) -> list:
        """The arguments of one value."""
        if value.__class__ is str:
            text = self.check(value)
            return [] if text is None else [self.prefix + text]
        return self.other(value)


class _Renderer:
    """Renders value rows of one element kind into ``key=value`` arguments.

    With a ``base`` the references become ids of that client; without one (a renderer shared
    by several clients) they stay :class:`_Ref` markers.
    """

    __slots__ = ("kind", "schema", "rules", "base", "plan", "version", "_caches", "_rows", "_whole", "_whole_hits")

    def __init__(self, kind: Kind, schema, rules: RenderRules, base: Optional[int]) -> None:
        self.kind = kind
        self.schema = schema
        self.rules = rules
        self.base = base
        self.plan: List[object] = []
        self.version = -1
        self._caches = []
        self._rows = 0
        self._whole: Optional[dict] = None
        self._whole_hits = 0

    def _refresh(self) -> None:
        keys = self.schema.keys
        self.plan = [self._entry(name) for name in keys]
        self.version = self.schema.version
        # rendered values per slot (see encoded); entries may have changed with the schema
        self._caches: List[Optional[dict]] = [{} for _ in keys]
        #: rows encoded since (to tell the slots whose values hardly recur)
        self._rows = 0
        #: whole rows rendered: row -> (argument count, pieces); None once rows hardly recur.
        #: Only processes: other kinds' equal rows are grouped into one event already.
        self._whole = {} if self.kind is Kind.PROCESS else None
        self._whole_hits = 0

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
        if ptp_id is None or ptp_id in rules.omit:
            return None
        prefix = ptp_id + "="
        if name in REFERENCES:
            base = self.base
            if base is None:
                markers: Dict[int, _Ref] = {}  # one marker per element referred to

                def marker(value, prefix=prefix, markers=markers):
                    if value.__class__ is not int:
                        return [prefix + str(value)]
                    ref = markers.get(value)
                    if ref is None:
                        ref = markers[value] = _Ref(prefix, value)
                    return [ref]

                return marker
            return _IdPrefix(prefix, base, lambda value: [prefix + str(value)])
        arrays = rules.arrays
        check = rules.integer if ptp_id in rules.integer_ids else None
        if check is not None:
            # not one text: absent (never a wrong number)
            return _Checked(prefix, check, lambda value: [])
        if escape is None and arrays:
            return prefix  # the common case: prefix + text

        def others(value, prefix=prefix, escape=escape, arrays=arrays):
            if not arrays:
                return []
            if escape is None:
                return [prefix + item for item in value]
            return [prefix + escape(item) for item in value]

        if escape is None:
            return _Checked(prefix, str, others)
        return _Checked(prefix, escape, others)

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

    def encoded(self, values: tuple, parts: list) -> int:
        """Append a value row's arguments to ``parts`` as encoded bytes (and :class:`_Ref`
        markers); returns how many arguments they are.

        Equal rows recur among elements of different parents (the processes of many jobs):
        what a whole row renders to is remembered, until rows turn out to hardly recur.
        Most values recur too (states, users, queues, node references): what a value renders
        to is remembered per slot, so a big snapshot encodes each distinct value once.  A slot
        whose values hardly recur (names, ids) stops being remembered.
        """
        if self.version != self.schema.version:
            self._refresh()
        whole = self._whole
        if whole is None:
            return self._encoded(values, parts)
        hit = whole.get(values)
        if hit is not None:
            self._whole_hits += 1
            parts += hit[1]
            return hit[0]
        start = len(parts)
        count = self._encoded(values, parts)
        # with a base every piece is bytes (ids written in): one piece
        whole[values] = (count, (b"".join(parts[start:]),) if self.base is not None else tuple(parts[start:]))
        if len(whole) > _CACHE_TRIAL and self._whole_hits * 2 < len(whole):
            self._whole = None  # rows hardly recur
        return count

    def _encoded(self, values: tuple, parts: list) -> int:
        caches = self._caches
        plan = self.plan
        if len(caches) != len(plan):
            caches.extend({} for _ in range(len(plan) - len(caches)))
        self._rows += 1
        count = 0
        i = -1
        for value in values:
            i += 1
            if value is None:
                continue
            cache = caches[i]
            if cache is not None:
                hit = cache.get(value)
                if hit is not None:
                    if hit.__class__ is bytes:  # one argument (most values)
                        count += 1
                        parts.append(hit)
                    else:
                        count += hit[0]
                        parts += hit[1]
                    continue
            entry = plan[i]
            if entry is None:
                continue
            if entry.__class__ is str:
                if value.__class__ is str:
                    arg = entry + value  # type: ignore[operator]
                    if len(arg) < _SHORT and arg.isascii():
                        hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                    else:
                        hit = encode_args((arg,))
                else:
                    args = [entry + item for item in value]  # type: ignore[operator]
                    hit = (len(args), (encode_args(args),) if args else ())
            elif entry.__class__ is _Checked:
                if value.__class__ is str:
                    text = entry.check(value)  # type: ignore[attr-defined]
                    if text is None:
                        hit = (0, ())
                    else:
                        arg = entry.prefix + text  # type: ignore[attr-defined]
                        if len(arg) < _SHORT and arg.isascii():
                            hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                        else:
                            hit = encode_args((arg,))
                else:
                    args = entry.other(value)  # type: ignore[attr-defined]
                    hit = (len(args), tuple(_encode_parts(args)))
            elif entry.__class__ is _IdPrefix:
                if value.__class__ is int:
                    arg = entry.prefix + str(entry.base + value)  # type: ignore[attr-defined]
                    hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                else:
                    args = entry.other(value)  # type: ignore[attr-defined]
                    hit = (len(args), tuple(_encode_parts(args)))
            else:
                args = entry(value)  # type: ignore[operator]
                hit = (len(args), tuple(_encode_parts(args)))
            if cache is not None:
                cache[value] = hit
                if len(cache) > _CACHE_TRIAL and len(cache) * 2 > self._rows:
                    caches[i] = None  # values of this slot hardly recur
                    cache.clear()
            if hit.__class__ is bytes:
                count += 1
                parts.append(hit)
            else:
                count += hit[0]  # type: ignore[index]
                parts += hit[1]  # type: ignore[index]
        return count

    def args(self, values: Sequence) -> list:
        """``key=value`` arguments of a value row (and :class:`_Ref` markers when shared)."""
        if self.version != self.schema.version:
            self._refresh()
        out: list = []
        for value, entry in zip(values, self.plan):
            if value is None or entry is None:
                continue
            if entry.__class__ is str:
                if value.__class__ is str:
                    out.append(entry + value)  # type: ignore[operator]
                else:
                    out.extend(entry + item for item in value)  # type: ignore[operator]
            elif entry.__class__ is _IdPrefix:
                if value.__class__ is int:
                    out.append(entry.prefix + str(entry.base + value))  # type: ignore[attr-defined]
                else:
                    out.extend(entry.other(value))  # type: ignore[attr-defined]
            else:
                out.extend(entry(value))  # type: ignore[operator]
        return out


class _Ranges:
    """Element ids of a group in a shared snapshot: ascending service keys, written as a range
    set once a client's base id is known.  Which keys stand alone and which begin or end a run
    does not depend on the base id: that is worked out once, as a format and the keys it takes
    (in a flat array, read in order), so that a client costs one addition and one formatting
    per number.  Runs keep only their ends: a million jobs' groups stay small."""

    __slots__ = ("numbers", "form")

    def __init__(self, keys: List[int]) -> None:
        form, numbers = _range_layout(keys)
        self.numbers, self.form = array("q", numbers), form

    def data(self, base: int) -> bytes:
        return self.form % tuple(map(add, self.numbers, repeat(base)))


def _ids_bytes(keys: List[int], base: int) -> bytes:
    """The ids of ascending service keys for the client with ``base``, as range-set text
    (see :func:`_range_layout`)."""
    form, numbers = _range_layout(keys)
    return form % tuple(map(add, numbers, repeat(base)))


def _range_layout(keys: List[int]) -> Tuple[bytes, List[int]]:
    """How ascending keys are written as a range set, whatever the base id: a format and the
    keys it takes (to which the base id is added).  Runs of adjacent keys are ``first-last``,
    the rest one by one.  Most groups have no two keys adjacent, or a few runs among many
    keys: the gaps between keys are worked out once, and the runs found by searching them
    for a gap of one (in C), so that the keys between runs cost no loop of their own."""
    n = len(keys)
    if n == 1:
        return b"%d", keys
    if keys[-1] - keys[0] == n - 1:
        return b"%d-%d", [keys[0], keys[-1]]
    gaps = list(map(sub, keys[1:], keys))  # gaps[i] = keys[i + 1] - keys[i]
    find = gaps.index
    try:
        first = find(1)
    except ValueError:
        return _separated(n), keys
    forms: List[bytes] = []
    numbers: List[int] = []
    done = 0  # keys before this one are placed
    while True:
        last = first  # the run is keys[first] .. keys[last + 1]
        while last + 1 < n - 1 and gaps[last + 1] == 1:
            last += 1
        if done < first:
            forms.append(_separated(first - done))
            numbers += keys[done:first]
        forms.append(b"%d-%d")
        numbers += (keys[first], keys[last + 1])
        done = last + 2
        try:
            first = find(1, done)
        except ValueError:
            break
    if done < n:
        forms.append(_separated(n - done))
        numbers += keys[done:]
    return b",".join(forms), numbers


def _separated(count: int) -> bytes:
    """A format of ``count`` numbers separated by commas."""
    if count < len(_FORMATS):
        return _FORMATS[count]
    return b",".join([b"%d"] * count)


_FORMATS = [b",".join([b"%d"] * count) for count in range(64)]


def _encode_parts(items: list) -> list:
    """Arguments (texts, :class:`_Ref`, :class:`_Ranges`, ints for ids) as constant bytes
    where they do not depend on the client, markers where they do."""
    parts: list = []
    run: List[str] = []
    for item in items:
        if item.__class__ is str:
            run.append(item)
            continue
        if run:
            parts.append(encode_args(run))
            run = []
        parts.append(item)
    if run:
        parts.append(encode_args(run))
    return parts


def _joined_parts(parts: list) -> list:
    """Consecutive bytes in ``parts`` joined into one."""
    out: list = []
    for cls, run in groupby(parts, type):
        if cls is bytes:
            out.append(b"".join(run))
        else:
            out.extend(run)
    return out


class SnapshotPlan:
    """The whole model as NEW events whose ids are not yet a client's (see module docs)."""

    def __init__(self, version: int, events: Iterable[Tuple[int, int, tuple]], base: Optional[int] = None,
                 settle: Callable[[], None] = lambda: None, deferred: Sequence[Kind] = ()) -> None:
        self.version = version
        #: groups what :func:`_build_plan` was told to defer (nothing otherwise)
        self.settle = settle
        #: the kinds not grouped yet (emptied by :attr:`settle`)
        self._deferred = deferred
        #: the base id whose ids the events hold already; None: a plan for any base id
        self.base = base
        #: (event id, argument count, parts), made as far as readers have got
        self._events: List[Tuple[int, int, tuple]] = []
        self._source: Optional[Iterator[Tuple[int, int, tuple]]] = iter(events)
        self._renderings: Dict[Tuple[int, int], _Rendering] = {}

    def _more(self) -> bool:
        """Make the next few events; False once there are no more."""
        source = self._source
        if source is None:
            return False
        events = self._events
        before = len(events)
        # One at a time while they are those of machines, nodes, queues and jobs: few, but
        # each of up to MAX_GROUPS_PER_EVENT groups (megabytes, for a big cluster's jobs), so
        # that each goes out as soon as it is made.  Processes have an event per job, small.
        events.extend(islice(source, 256 if before and events[-1][0] == _NEW_PROCESS else 1))
        if len(events) == before:
            self._source = None
            return False
        return True

    @property
    def settled(self) -> bool:
        """Every kind is grouped: the snapshot's content is fixed."""
        return not self._deferred

    @property
    def prepared(self) -> bool:
        """Every event of the plan is made: rendering only fills in a client's ids."""
        return self._source is None

    def prepare(self) -> bool:
        """Make the next few events ahead of any reader (with no young collections in the
        middle); False once every event is made."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            more = self._more()
            _settle()
        finally:
            if enabled:
                gc.enable()
        return more

    @property
    def events(self) -> List[Tuple[int, int, tuple]]:
        """Every event of the plan (made now if need be)."""
        while self._more():
            pass
        return self._events

    def chunks(self, base: int, tid: int) -> Iterator[bytes]:
        """The snapshot's frames for a client, in chunks of about SNAPSHOT_CHUNK_BYTES (the
        first ones smaller, from FIRST_CHUNK_BYTES on, doubling), each
        rendered when it is first asked for.  Clients with the same base id and TID that read
        at the same time share the chunks; a chunk every reader has passed is let go."""
        return self._rendering(base, tid).reader(keep=False)

    def frames(self, base: int, tid: int) -> List[bytes]:
        """All the snapshot's chunks for a client, kept for later callers (tests, tools)."""
        rendering = self._rendering(base, tid)
        for _ in rendering.reader(keep=True):
            pass
        return rendering.chunks  # type: ignore[return-value]

    def _rendering(self, base: int, tid: int) -> "_Rendering":
        if self.base is not None and base != self.base:
            raise ValueError(f"a plan for base id {self.base} rendered for base id {base}")
        rendering = self._renderings.get((base, tid))
        if rendering is None or rendering.released:
            for key in [k for k, r in self._renderings.items() if r.done and not r.readers]:
                del self._renderings[key]  # finished: rendered again if asked for again
            rendering = self._renderings[(base, tid)] = _Rendering(self._render(base, tid))
        return rendering

    def _render(self, base: int, tid: int) -> Iterator[bytes]:
        assemble_frame(0, tid, 0, b"")  # checks the TID once
        current: List[bytes] = []
        size = 0
        limit = min(FIRST_CHUNK_BYTES, SNAPSHOT_CHUNK_BYTES)
        # what a marker (a service key or a _Ref) is written as for this client: parents and
        # referenced elements recur
        written: Dict[object, bytes] = {}
        get = written.get
        heads: Dict[int, bytes] = {}
        events = self._events
        more = self._more
        index = 0
        while True:
            if index == len(events) and not more():
                break
            event_id, nargs, parts = events[index]
            index += 1
            if len(parts) == 1 and parts[0].__class__ is bytes:
                body = parts[0]  # ids written in already (a plan for this base id), or none
            else:
                body = b"".join([part if part.__class__ is bytes else _id_piece(base + part) if part.__class__ is int
                                 else get(part) or _written(part, base, written) for part in parts])
            head = heads.get(nargs << 16 | event_id)
            if head is None:
                head = heads[nargs << 16 | event_id] = b" %04X:%08X:%08X" % (event_id, tid, nargs)
            length = len(body) + len(head)
            current += (b"%08X" % length, head, body)  # copied once, into the chunk
            size += 8 + length
            if size >= limit:
                yield b"".join(current)
                current, size = [], 0
                limit = min(limit * 2, SNAPSHOT_CHUNK_BYTES)
        if current:
            yield b"".join(current)

    def wire_events(self, base: int) -> List[WireEvent]:
        """The snapshot as (event id, arguments) for a client (tests and tools)."""
        from ...protocol.wire import Decoder

        decoder = Decoder()
        for chunk in self.frames(base, 0):
            decoder.feed(chunk)
        return [(frame.msg_id, list(frame.args)) for frame in decoder]


_PREFIXES = [b" %08X:" % n for n in range(32)]


def _id_piece(element_id: int) -> bytes:
    """An element id as one encoded argument."""
    text = b"%d" % element_id
    return _PREFIXES[len(text)] + text


def _written(part: object, base: int, written: Dict[object, bytes]) -> bytes:
    """A marker of a shared snapshot as one encoded argument for the client with ``base``:
    remembered in ``written``, except a range group's (each is met once)."""
    piece = written.get(part)
    if piece is not None:
        return piece
    cls = part.__class__
    if cls is int:
        text = str(base + part)  # type: ignore[operator]
        piece = written[part] = _PREFIXES[len(text)] + text.encode()
    elif cls is _Ranges:
        text = part.data(base)  # type: ignore[attr-defined]
        piece = b" %08X:%s" % (len(text), text)
    else:  # _Ref
        text = (part.prefix + str(base + part.key)).encode()  # type: ignore[attr-defined]
        piece = written[part] = b" %08X:%s" % (len(text), text)
    return piece


class _Rendering:
    """The chunks of one snapshot for one (base id, TID), rendered as readers first reach them.

    A chunk stays while a reader has yet to take it, or for good once a keeping reader
    (:meth:`SnapshotPlan.frames`) has come; otherwise it is let go (``released``: a reader
    arriving later gets a rendering of its own), so that a big snapshot is never held whole.
    """

    __slots__ = ("chunks", "source", "done", "readers", "keep", "released", "head")

    def __init__(self, source: Iterator[bytes]) -> None:
        self.chunks: List[Optional[bytes]] = []
        self.source = source
        self.done = False
        #: readers in progress
        self.readers: List[_Reader] = []
        self.keep = False
        self.released = False
        #: the first chunks, kept for good (see take)
        self.head = 1

    def reader(self, keep: bool) -> "_Reader":
        if keep:
            self.keep = True
        return _Reader(self)

    def take(self, reader: "_Reader") -> Optional[bytes]:
        """The reader's next chunk (None at the end)."""
        chunks = self.chunks
        i = reader.position
        if i == len(chunks):
            if self.done:
                return None
            enabled = gc.isenabled()
            gc.disable()  # thousands of new objects, none of them garbage
            try:
                chunks.append(next(self.source))
                _settle()
            except StopIteration:
                self.done = True
                return None
            finally:
                if enabled:
                    gc.enable()
        chunk = chunks[i]
        reader.position = i + 1
        # Every reader has it: let it go.  Not the first chunks, which are few: a client that
        # took them at once (see ModelView.subscribe_chunks) did so before others asking in the
        # same instant could join, and they still share them.
        if i >= self.head and not self.keep and min(r.position for r in self.readers) > i:
            chunks[i] = None
            self.released = True
        return chunk


class _Reader:
    """One client's way through a :class:`_Rendering` (counted from its creation on)."""

    __slots__ = ("rendering", "position", "__weakref__")

    def __init__(self, rendering: _Rendering) -> None:
        self.rendering: Optional[_Rendering] = rendering
        self.position = 0
        rendering.readers.append(self)

    def __iter__(self) -> "_Reader":
        return self

    def __next__(self) -> bytes:
        rendering = self.rendering
        chunk = rendering.take(self) if rendering is not None else None
        if chunk is None:
            self.close()
            raise StopIteration
        return chunk

    def close(self) -> None:
        rendering, self.rendering = self.rendering, None
        if rendering is not None:
            rendering.readers.remove(self)

    def __del__(self) -> None:
        self.close()


def _settle() -> None:
    """Put every object the collector tracks into its oldest generation at once (a freeze
    and an unfreeze, which move lists rather than walk them).  A plan and its chunks make up
    to millions of objects that live as long as the plan; left young, the next young
    collections would walk all of them only to keep them: tens of milliseconds at a million
    jobs, in the middle of the snapshot.  Anything else young just waits for the next full
    collection."""
    gc.freeze()
    gc.unfreeze()


#: How long the model must stay unchanged before its snapshot is planned ahead (seconds)
PREPARE_QUIET = 0.05

#: The snapshot plans of each model's latest version: model -> {(id of rules, base id or None): plan}
_PLANS: "weakref.WeakKeyDictionary[ServiceModel, Dict[Tuple[int, Optional[int]], SnapshotPlan]]" = weakref.WeakKeyDictionary()


#: The client views of each model (see :meth:`ModelView.plan_base`)
_VIEWS: "weakref.WeakKeyDictionary[ServiceModel, weakref.WeakSet[ModelView]]" = weakref.WeakKeyDictionary()


def snapshot_plan(model: ServiceModel, rules: RenderRules, base: Optional[int] = None,
                  defer: bool = False) -> SnapshotPlan:
    """The snapshot of the model as it is now, rendered with ``rules`` (shared while the model
    does not change).

    With a ``base``: a plan that serves that base id.  The first plan of a model version is
    made for that base id alone, ids written in as the events are made (rendering then only
    frames them); once a client with another base id asks for the same version, one plan for
    every other base id is made beside it, ids filled in per client as it is rendered.  So a
    version has at most two plans, however many clients and base ids.  Without a ``base``:
    the plan for every base id.  ``defer``: see :func:`_build_plan` (a new plan only)."""
    plans = _PLANS.get(model)
    if plans is None:
        plans = _PLANS[model] = {}
    version = model.version
    key = (id(rules), base)
    plan = plans.get(key)
    if plan is None or plan.version != version:
        plan = plans.get((id(rules), None))
    if plan is not None and plan.version == version:
        return plan
    # An older version is of no use to anyone subscribing from now on, and a plan for other
    # rules is let go too (a million jobs' plan is large): both before the new one is made.
    # A plan of this version for another base id stays: this one is then for every base id.
    kept = {k: p for k, p in plans.items() if k[0] == id(rules) and p.version == version}
    plans.clear()
    plans.update(kept)
    if kept:
        key = (id(rules), None)
    enabled = gc.isenabled()
    gc.disable()  # hundreds of thousands of new objects, none of them garbage: no collections
    try:
        plan = _build_plan(model, rules, key[1], defer)
        _settle()
        log.debug("initial model planned (model version %d, base id %s)", plan.version,
                  "any" if key[1] is None else key[1])
    finally:
        if enabled:
            gc.enable()
    plans[key] = plan
    return plan


async def prepare_snapshot(model: ServiceModel, rules: Callable[[], RenderRules], wanted: Callable[[], bool],
                           quiet: float = PREPARE_QUIET, spacing: float = 0.0,
                           base: Callable[[], Optional[int]] = lambda: None) -> None:
    """Plan the model's snapshot ahead of a client's START_EVENTS, for as long as ``wanted()``
    (``base()``: the base id to plan for, None for any; see :func:`snapshot_plan`).

    Once the model has stayed at one version for ``quiet`` seconds and there is no finished
    plan of that version for ``rules()``, the elements are grouped (one step) and the events
    made a few hundred at a time, other tasks running between steps.  A client that asks then
    only has its ids filled in.  A plan is served only while its version is the model's
    (:func:`snapshot_plan`), so a change midway costs only a new plan after the next quiet
    moment; a client asking midway takes the plan over where it is.  After planning, the next
    planning waits at least ``spacing`` times as long as this one took, so that a model that
    keeps changing costs little."""
    import trio

    while wanted():
        version = model.version
        await trio.sleep(quiet)
        if not wanted() or model.version != version:
            continue
        current = rules()
        plans = _PLANS.get(model) or {}
        wanted_base = base()
        ready = [p for p in (plans.get((id(current), wanted_base)), plans.get((id(current), None)))
                 if p is not None and p.version == version and p.prepared]
        if ready:
            continue
        began = trio.current_time()
        plan = snapshot_plan(model, current, wanted_base)
        while plan.prepare():
            await trio.sleep(0)
            if not wanted() or model.version != version:
                break
        else:
            log.debug("initial model planned ahead: %d events", len(plan.events))
        if spacing:
            await trio.sleep((trio.current_time() - began) * spacing)


#: Kinds whose grouping may wait until the first frames of a new plan are on their way
#: (see :meth:`ModelView.subscribe_chunks`): the big ones, which come last
_LATER = (Kind.JOB, Kind.PROCESS)


def _build_plan(model: ServiceModel, rules: RenderRules, base: Optional[int] = None,
                defer: bool = False) -> SnapshotPlan:
    """Group the model's elements now (what the snapshot holds is decided at this instant: rows
    are immutable, so holding them is holding the values); encode the groups into events later,
    as the plan's readers get to them.

    With ``defer``, jobs and processes are grouped only when :meth:`SnapshotPlan.settle` is
    called (or their events are first needed): the caller must make sure that happens before
    the model can change, that is, before anything else runs."""
    ascending = model.ascending()
    grouped: List[Tuple[Kind, Dict[int, Union[list, Dict[int, list]]]]] = []
    later = [kind for kind in CREATE_ORDER if defer and kind in _LATER]
    for kind in CREATE_ORDER:
        if kind not in later:
            grouped.append((kind, _grouped_kind(model, kind, ascending)))

    def settle() -> None:
        if not later:
            return
        enabled = gc.isenabled()
        gc.disable()
        try:
            while later:
                kind = later.pop(0)
                grouped.append((kind, _grouped_kind(model, kind, ascending)))
            _settle()
        finally:
            if enabled:
                gc.enable()

    renderers = {kind: _Renderer(kind, model.schema(kind), rules, base) for kind in CREATE_ORDER}
    return SnapshotPlan(model.version, _emit(grouped, renderers, base, settle), base, settle, later)


def _grouped_kind(model: ServiceModel, kind: Kind, ascending: bool) -> Dict[int, Union[list, Dict[int, list]]]:
    """The elements of a kind grouped by parent and row (see :func:`_build_plan`)."""
    elements: Iterable[Element] = model.elements(kind)
    if not ascending:
        elements = sorted(elements, key=_key_of)
    process = kind is Kind.PROCESS
    # parent -> [row, key or rank, ...] while its children share one row object, else
    # id of a row -> such a group.  Elements created alike share their row object, so most
    # of the grouping is by identity; equal rows that are distinct objects merge below.
    if not process:
        return _by_row(elements)
    by_parent: Dict[int, Union[list, Dict[int, list]]] = {}
    last_parent = last_row = last_group = None
    for element in elements:
        parent = element.parent
        row = element.values
        member = element.rank
        if row is last_row and parent == last_parent:
            last_group.append(member)  # type: ignore[union-attr]
            continue
        entry = by_parent.get(parent)
        if entry is None:
            last_group = by_parent[parent] = [row, member]
        elif entry.__class__ is list:
            if entry[0] is row:  # type: ignore[index]
                entry.append(member)  # type: ignore[union-attr]
                last_group = entry
            else:
                last_group = [row, member]
                by_parent[parent] = {id(entry[0]): entry, id(row): last_group}  # type: ignore[index]
        else:
            group = entry.get(id(row))  # type: ignore[union-attr]
            if group is None:
                last_group = entry[id(row)] = [row, member]  # type: ignore[index]
            else:
                group.append(member)
                last_group = group
        last_parent, last_row = parent, row
    return by_parent


def _by_row(elements: Iterable[Element]) -> Dict[int, Union[list, Dict[int, list]]]:
    """Elements (not processes) grouped as :func:`_build_plan` does, by the identity of their
    row first: the children of one parent rarely come in a row (jobs of many kinds, queued
    in turn), while a row is rarely shared by children of different parents."""
    groups: Dict[int, list] = {}  # id of a row -> [parent, row, key, ...]
    made: List[list] = []  # the groups in the order they were begun
    strays: Dict[Tuple[int, int], list] = {}  # (parent, id of a row) for a row other parents share
    get = groups.get
    for element in elements:
        row = element.values
        group = get(id(row))
        if group is None:
            group = groups[id(row)] = [element.parent, row, element.key]
            made.append(group)
        elif group[0] == element.parent:
            group.append(element.key)
        else:
            stray = strays.get((element.parent, id(row)))
            if stray is None:
                stray = strays[(element.parent, id(row))] = [element.parent, row, element.key]
                made.append(stray)
            else:
                stray.append(element.key)
    by_parent: Dict[int, Union[list, Dict[int, list]]] = {}
    for group in made:
        parent = group[0]
        del group[0]
        entry = by_parent.get(parent)
        if entry is None:
            by_parent[parent] = group
        elif entry.__class__ is list:
            by_parent[parent] = {id(entry[0]): entry, id(group[0]): group}  # type: ignore[index]
        else:
            entry[id(group[0])] = group  # type: ignore[index]
    return by_parent


def _emit(grouped: list, renderers: Dict[Kind, "_Renderer"], base: Optional[int] = None,
          settle: Callable[[], None] = lambda: None) -> Iterator[Tuple[int, int, tuple]]:
    """The NEW events of grouped elements (see :func:`_build_plan`), kind by kind.  With a
    ``base`` (a plan for the clients of one base id) every id is written at once: each event
    is one piece of bytes and rendering only frames it."""
    direct = base is not None
    written: Dict[object, bytes] = {}  # parents and references, written once each (direct)
    index = 0
    while True:
        if index == len(grouped):
            settle()  # the kinds whose grouping was deferred, if any
            if index == len(grouped):
                break
        kind, by_parent = grouped[index]
        grouped[index] = None  # let each kind's groups go once its events are made
        index += 1
        encode_row = renderers[kind].encoded
        event_id = _PTP_KIND[kind].new_event
        process = kind is Kind.PROCESS
        items = list(by_parent.items())
        by_parent.clear()
        for i in range(len(items)):
            parent, entry = items[i]
            items[i] = None  # type: ignore[call-overload]  # its groups go once its events are made
            if entry.__class__ is list:
                # one group (a job's processes, a queue's jobs all alike): the event refers to
                # the pieces its values share with others, nothing copied
                group = entry  # type: ignore[assignment]
                row_parts: list = []
                nargs = encode_row(group[0], row_parts)
                if len(group) == 2:
                    member = group[1]
                    if process:
                        ids = _encoded_number(member)
                    elif direct:
                        text = b"%d" % (base + member)  # type: ignore[operator]
                        ids = _PREFIXES[len(text)] + text
                    else:
                        ids = member
                else:
                    members = group[1:]
                    if process:
                        ids = encode_args((_ids_text(members),))
                    elif direct:
                        text = _ids_bytes(members, base)  # type: ignore[arg-type,assignment]
                        ids = b" %08X:%s" % (len(text), text)
                    else:
                        ids = _Ranges(members)
                count = _SMALL_NUMBERS[nargs] if nargs < 256 else _encoded_number(nargs)
                if direct:
                    if process:  # a job has one such event: its id is not kept
                        text = b"%d" % (base + parent)  # type: ignore[operator]
                        head = _PREFIXES[len(text)] + text
                    else:
                        head = written.get(parent) or _written(parent, base, written)  # type: ignore[arg-type]
                    yield event_id, 4 + nargs, (b"".join([head, _ONE, ids, count, *row_parts]),)  # type: ignore[list-item]
                elif process:
                    yield event_id, 4 + nargs, (parent, *_joined_parts([_ONE + ids + count, *row_parts]))  # type: ignore[operator]
                else:
                    yield event_id, 4 + nargs, tuple(_joined_parts([parent, _ONE, ids, count, *row_parts]))
                continue
            else:
                unsorted: Set[int] = set()
                same: Dict[tuple, list] = {}
                for group in entry.values():  # type: ignore[union-attr]
                    bucket = same.get(group[0])
                    if bucket is None:
                        same[group[0]] = group
                    else:
                        bucket.extend(group[1:])
                        unsorted.add(id(bucket))
                merged = list(same.items())
            for start in range(0, len(merged), MAX_GROUPS_PER_EVENT):
                part = merged[start:start + MAX_GROUPS_PER_EVENT]
                if direct:
                    parts = [written.get(parent) or _written(parent, base, written), _encoded_number(len(part))]  # type: ignore[arg-type]
                else:
                    parts = [parent, _encoded_number(len(part))]
                total = 2
                for row, bucket in part:
                    if len(bucket) == 2:  # one member (a node, a job of its own)
                        member = bucket[1]
                        if process:
                            parts.append(_encoded_number(member))
                        elif direct:
                            text = b"%d" % (base + member)  # type: ignore[operator]
                            parts.append(_PREFIXES[len(text)] + text)
                        else:
                            parts.append(member)
                    else:
                        members = bucket[1:]
                        if unsorted and id(bucket) in unsorted:
                            members.sort()
                        if process:
                            parts.append(encode_args((_ids_text(members),)))
                        elif direct:
                            text = _ids_bytes(members, base)  # type: ignore[arg-type]
                            parts.append(b" %08X:%s" % (len(text), text))
                        else:
                            parts.append(_Ranges(members))
                    at = len(parts)
                    parts.append(b"")
                    nargs = encode_row(row, parts)  # the row's pieces go in after its count
                    parts[at] = _SMALL_NUMBERS[nargs] if nargs < 256 else _encoded_number(nargs)
                    total += 2 + nargs
                yield event_id, total, (b"".join(parts),) if direct else tuple(_joined_parts(parts))


_SMALL_NUMBERS = [encode_args((str(n),)) for n in range(256)]
_ONE = _SMALL_NUMBERS[1]


def _encoded_number(n: int) -> bytes:
    """A number as one encoded argument."""
    return _SMALL_NUMBERS[n] if 0 <= n < 256 else encode_args((str(n),))


def _key_of(element: Element) -> int:
    return element.key


class ModelView(ChangeSink):
    """What one client has seen of the model, and renders what it has not (module docs)."""

    def __init__(self, model: ServiceModel, base_id: int, rules: RenderRules = NATIVE_RULES,
                 on_change: Optional[Callable[[], None]] = None) -> None:
        self.model = model
        self.base = base_id
        self.rules = rules
        self.on_change = on_change
        self._renderers = {kind: _Renderer(kind, model.schema(kind), rules, base_id) for kind in Kind}
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
        # Submissions of this client being carried out: jobSubId -> how many (see expect_submission)
        self._expected: Dict[str, int] = {}
        # Jobs held back until their submission is answered: key -> jobSubId
        self._withheld: Dict[int, str] = {}
        # Their records and their processes': element key -> withheld job key
        self._held: Dict[int, int] = {}
        # Their output: withheld job key -> [(process key, stream, text, offset)]
        self._held_output: Dict[int, List[Tuple[int, str, str, Optional[int]]]] = {}
        # Jobs this client submitted, until it has been told they completed
        self._own: Dict[int, _OwnJob] = {}
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

    def expect_submission(self, sub_id: str) -> None:
        """The client's SUBMIT_JOB with this jobSubId is being carried out.  The job it makes
        (the job whose ``jobSubId`` this is) is held back from this client, with its processes
        and output, until :meth:`submitted`: the submission's OK goes out first, and from its
        first event on the job is the client's own.  Nothing else waits for it."""
        if sub_id:
            self._expected[sub_id] = self._expected.get(sub_id, 0) + 1

    def submitted(self, sub_id: str, key: Optional[int]) -> None:
        """The submission of :meth:`expect_submission` is answered: ``key`` is its job (None:
        it was refused).  The job goes out from now on, every state it goes through as an
        event of its own (see the module documentation)."""
        if sub_id:
            left = self._expected.get(sub_id, 0) - 1
            if left > 0:
                self._expected[sub_id] = left
            else:
                self._expected.pop(sub_id, None)
        if key is not None:
            element = self.model._elements.get(key)
            if element is not None and element.kind is Kind.JOB:
                if key in self._withheld:
                    self._release(key)
                elif key not in self._own:
                    self._own[key] = _OwnJob(self._state_of(element))
                    if self.subscribed and self._known(element):
                        # Its scheduler listed it before its submit command answered, and the
                        # client was told of it as of anybody's job: told again, as its own.
                        self._reissue(element, element.parent)
        if sub_id and sub_id not in self._expected:
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
        if sub_id.__class__ is not str or sub_id not in self._expected:
            return False
        key = element.key
        self._withheld[key] = sub_id
        self._own[key] = _OwnJob(self._state_of(element))
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
        ``defer``: see :func:`_build_plan`."""
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
        chunks = plan.chunks(self.base, tid)
        if early is not None:
            rendering = chunks.rendering  # type: ignore[attr-defined]
            rendering.head = sys.maxsize  # what is taken now stays, for others asking meanwhile
            try:
                while True:
                    chunk = next(chunks, None)
                    if chunk is None or not early(chunk) or plan.settled:
                        break
            finally:
                rendering.head = max(1, chunks.position)  # type: ignore[attr-defined]
                plan.settle()  # the snapshot is of this instant: grouped before anything else runs
        return chunks

    def unsubscribe(self) -> None:
        if self.subscribed:
            self.model.unsubscribe(self)
            self.subscribed = False

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
        if self._expected and element.kind is Kind.JOB:
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
            if self._expected and element.kind is Kind.JOB:
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
        elements = self.model._elements
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

    def flush(self) -> None:
        if self.on_change is not None:
            self.on_change()

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
            sequence = record.sequence(self._state_of(element) or _STARTING_STATUS, new=True)
            values = list(element.values)
            values[slot] = sequence[0][1]
            rows[element.key] = tuple(values)
            steps.append((element, sequence[1:-1]))
            if len(sequence) > 1:
                changes.append((element, {slot}))
            record.told_all(sequence)
            if record.told == _COMPLETED:
                done.append(element.key)
        for element, slots in changes:
            record = own.get(element.key)
            if record is None or not record.steps:
                continue
            sequence = record.sequence(self._state_of(element) or _STARTING_STATUS, new=False)
            steps.append((element, sequence[:-1]))
            slots.add(slot)
            record.told_all(sequence)
            if record.told == _COMPLETED:
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
            built = [(_ids_text(sorted(ids)), mapping.state_args(Kind.JOB, state)) for state, ids in by_state.items()]
            events.extend(self._grouped(EventId.JOB_CHANGE, [], built))
        return events

    def _refs(self, kind: Kind, members: List[Element]) -> str:
        if kind is Kind.PROCESS:
            return _ids_text([e.rank for e in members])
        base = self.base
        return _ids_text([base + e.key for e in members])

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
        event_id = _PTP_KIND[kind].new_event
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
        if self._held_offsets:
            self._drained_offsets.update(self._held_offsets)
            self._held_offsets = {}
        dropped = self._output_dropped
        self._output_dropped = {}
        why = self._not_reading or "the client was not reading"
        if self.holds_back:
            self._not_reading = ""
        elements = self.model._elements
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


def _ids_text(members: List[int]) -> str:
    """Range-set text for ids (usually ascending runs, often a single id)."""
    if len(members) == 1:
        return str(members[0])
    first, last = members[0], members[-1]
    if last - first == len(members) - 1 and members == list(range(first, last + 1)):
        return f"{first}-{last}"
    return str(RangeSet.from_ids(members))


def _joined(blocks: Deque[Tuple[str, str]]) -> Iterator[Tuple[str, str]]:
    """Held output as (key, text) values: consecutive blocks of one stream joined into texts
    of at most :data:`_OUTPUT_CHUNK` characters where the lines allow, a bigger block cut at
    its line ends (a line is never cut: the splitter already made every line short enough)."""
    key = None
    buf: List[str] = []
    size = 0
    for k, text in blocks:
        if buf and (k != key or size + len(text) > _OUTPUT_CHUNK):
            yield key, "\n".join(buf)  # type: ignore[misc]
            buf, size = [], 0
        key = k
        while len(text) > _OUTPUT_CHUNK:
            cut = text.rfind("\n", 0, _OUTPUT_CHUNK + 1)
            if cut < 0:
                break  # one line longer than a chunk: it travels whole
            if buf:
                yield key, "\n".join(buf)  # type: ignore[misc]
                buf, size = [], 0
            yield key, text[:cut]  # type: ignore[misc]
            text = text[cut + 1:]
        buf.append(text)
        size += len(text) + 1
    if buf:
        yield key, "\n".join(buf)  # type: ignore[misc]
