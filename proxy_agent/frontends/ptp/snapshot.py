"""The initial model (the *snapshot*) of a PTP session, planned once and shared.

A :class:`SnapshotPlan` groups the whole model at one instant into NEW events whose ids are
filled in per client, and renders them a chunk at a time as the session's writer takes them,
so the client decodes one while the next is made.  Every client that subscribes while the
model is unchanged shares the plan, and clients with the same base id and TID reading at the
same time share the bytes too (see ``docs/performance.md``).  An agent that clients connect to
plans ahead while the model is quiet (:func:`prepare_snapshot`).
"""

from __future__ import annotations

import gc
import logging
import weakref
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ...protocol.messages import ElementKind
from ...protocol.wire import assemble_frame, encode_args
from ...service.model import CREATE_ORDER, Element, Kind, ServiceModel
from .render import (
    MAX_GROUPS_PER_EVENT, PTP_KIND, RenderRules, Renderer, Ranges, WireEvent, ids_bytes, ids_text, joined_parts,
)

log = logging.getLogger("proxy_agent.frontends.ptp")

__all__ = ["FIRST_CHUNK_BYTES", "PREPARE_QUIET", "SNAPSHOT_CHUNK_BYTES", "SnapshotPlan", "prepare_snapshot", "snapshot_plan"]

#: Bytes per chunk of snapshot frames handed to a session's writer.
SNAPSHOT_CHUNK_BYTES = 1 << 18
#: Bytes of the first chunk: the chunks grow from this to SNAPSHOT_CHUNK_BYTES, so that the
#: client has the first frames to decode while the agent is still making the rest.
FIRST_CHUNK_BYTES = 32 << 10
_NEW_PROCESS = int(ElementKind.PROCESS.new_event)


class SnapshotPlan:
    """The whole model as NEW events whose ids are not yet a client's (see module docs)."""

    def __init__(self, version: int, events: Iterable[Tuple[int, int, tuple]], base: Optional[int] = None,
                 settle: Callable[[], None] = lambda: None, deferred: Sequence[Kind] = ()) -> None:
        self.version = version
        #: groups what :func:`build_plan` was told to defer (nothing otherwise)
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
        # what a marker (a service key or a Ref) is written as for this client: parents and
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


def _written(part: Any, base: int, written: Dict[object, bytes]) -> bytes:
    """A marker of a shared snapshot as one encoded argument for the client with ``base``:
    remembered in ``written``, except a range group's (each is met once)."""
    piece = written.get(part)
    if piece is not None:
        return piece
    cls = part.__class__
    if cls is int:
        text = str(base + part)
        piece = written[part] = _PREFIXES[len(text)] + text.encode()
    elif cls is Ranges:
        text = part.data(base)
        piece = b" %08X:%s" % (len(text), text)
    else:  # Ref
        text = (part.prefix + str(base + part.key)).encode()
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


def snapshot_plan(model: ServiceModel, rules: RenderRules, base: Optional[int] = None,
                  defer: bool = False) -> SnapshotPlan:
    """The snapshot of the model as it is now, rendered with ``rules`` (shared while the model
    does not change).

    With a ``base``: a plan that serves that base id.  The first plan of a model version is
    made for that base id alone, ids written in as the events are made (rendering then only
    frames them); once a client with another base id asks for the same version, one plan for
    every other base id is made beside it, ids filled in per client as it is rendered.  So a
    version has at most two plans, however many clients and base ids.  Without a ``base``:
    the plan for every base id.  ``defer``: see :func:`build_plan` (a new plan only)."""
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
        plan = build_plan(model, rules, key[1], defer)
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


def build_plan(model: ServiceModel, rules: RenderRules, base: Optional[int] = None,
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

    renderers = {kind: Renderer(kind, model.schema(kind), rules, base) for kind in CREATE_ORDER}
    return SnapshotPlan(model.version, _emit(grouped, renderers, base, settle), base, settle, later)


def _grouped_kind(model: ServiceModel, kind: Kind, ascending: bool) -> Dict[int, Union[list, Dict[int, list]]]:
    """The elements of a kind grouped by parent and row (see :func:`build_plan`)."""
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
    last_parent = last_row = None
    last_group: Any = None
    entry: Any
    for element in elements:
        parent = element.parent
        row = element.values
        member = element.rank
        if row is last_row and parent == last_parent:
            last_group.append(member)
            continue
        entry = by_parent.get(parent)
        if entry is None:
            last_group = by_parent[parent] = [row, member]
        elif entry.__class__ is list:
            if entry[0] is row:
                entry.append(member)
                last_group = entry
            else:
                last_group = [row, member]
                by_parent[parent] = {id(entry[0]): entry, id(row): last_group}
        else:
            group = entry.get(id(row))
            if group is None:
                last_group = entry[id(row)] = [row, member]
            else:
                group.append(member)
                last_group = group
        last_parent, last_row = parent, row
    return by_parent


def _by_row(elements: Iterable[Element]) -> Dict[int, Union[list, Dict[int, list]]]:
    """Elements (not processes) grouped as :func:`build_plan` does, by the identity of their
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
            by_parent[parent] = {id(entry[0]): entry, id(group[0]): group}
        else:
            entry[id(group[0])] = group
    return by_parent


def _emit(grouped: list, renderers: Dict[Kind, "Renderer"], base: Optional[int] = None,
          settle: Callable[[], None] = lambda: None) -> Iterator[Tuple[int, int, tuple]]:
    """The NEW events of grouped elements (see :func:`build_plan`), kind by kind.  With a
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
        event_id = PTP_KIND[kind].new_event
        process = kind is Kind.PROCESS
        items = list(by_parent.items())
        by_parent.clear()
        for i in range(len(items)):
            parent, entry = items[i]
            items[i] = None  # its groups go once its events are made
            if entry.__class__ is list:
                # one group (a job's processes, a queue's jobs all alike): the event refers to
                # the pieces its values share with others, nothing copied
                group = entry
                row_parts: list = []
                nargs = encode_row(group[0], row_parts)
                if len(group) == 2:
                    member = group[1]
                    if process:
                        ids = _encoded_number(member)
                    elif direct:
                        text = b"%d" % (base + member)
                        ids = _PREFIXES[len(text)] + text
                    else:
                        ids = member
                else:
                    members = group[1:]
                    if process:
                        ids = encode_args((ids_text(members),))
                    elif direct:
                        text = ids_bytes(members, base)  # type: ignore[arg-type]
                        ids = b" %08X:%s" % (len(text), text)
                    else:
                        ids = Ranges(members)  # type: ignore[assignment]
                count = _SMALL_NUMBERS[nargs] if nargs < 256 else _encoded_number(nargs)
                if direct:
                    if process:  # a job has one such event: its id is not kept
                        text = b"%d" % (base + parent)
                        head = _PREFIXES[len(text)] + text
                    else:
                        head = written.get(parent) or _written(parent, base, written)  # type: ignore[arg-type]
                    yield event_id, 4 + nargs, (b"".join([head, _ONE, ids, count, *row_parts]),)
                elif process:
                    yield event_id, 4 + nargs, (parent, *joined_parts([_ONE + ids + count, *row_parts]))
                else:
                    yield event_id, 4 + nargs, tuple(joined_parts([parent, _ONE, ids, count, *row_parts]))
                continue
            else:
                unsorted: Set[int] = set()
                same: Dict[tuple, list] = {}
                for group in entry.values():
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
                            text = b"%d" % (base + member)
                            parts.append(_PREFIXES[len(text)] + text)
                        else:
                            parts.append(member)
                    else:
                        members = bucket[1:]
                        if unsorted and id(bucket) in unsorted:
                            members.sort()
                        if process:
                            parts.append(encode_args((ids_text(members),)))
                        elif direct:
                            text = ids_bytes(members, base)  # type: ignore[arg-type]
                            parts.append(b" %08X:%s" % (len(text), text))
                        else:
                            parts.append(Ranges(members))  # type: ignore[arg-type]
                    at = len(parts)
                    parts.append(b"")
                    nargs = encode_row(row, parts)  # the row's pieces go in after its count
                    parts[at] = _SMALL_NUMBERS[nargs] if nargs < 256 else _encoded_number(nargs)
                    total += 2 + nargs
                yield event_id, total, (b"".join(parts),) if direct else tuple(joined_parts(parts))


_SMALL_NUMBERS = [encode_args((str(n),)) for n in range(256)]
_ONE = _SMALL_NUMBERS[1]


def _encoded_number(n: int) -> bytes:
    """A number as one encoded argument."""
    return _SMALL_NUMBERS[n] if 0 <= n < 256 else encode_args((str(n),))


def _key_of(element: Element) -> int:
    return element.key

