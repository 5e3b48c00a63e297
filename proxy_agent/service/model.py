"""The service's model: machines, nodes, queues, jobs and processes, and the stream of changes.

Backends fill and update the :class:`ServiceModel`; front-ends subscribe to it and render what
they see for their clients.  Nothing here knows a protocol.

Elements
--------
Every element has a stable integer **service key**, handed out in increasing order from 1 and
never reused while the agent runs (0 stands for the whole service, the root every machine and
queue hangs from).  A front-end turns keys into its own ids (the PTP front-end adds its
client's base id).  Parents: machines and queues hang from the root, nodes from a machine,
jobs from a queue, processes from a job.  A process also has a **rank**: its index in its job,
0 to n-1, in the order the backend created them.

Attributes are text (``str``), a tuple of texts for a multi-valued attribute (a job's
arguments), or an ``int`` service key for a reference to another element (a job's ``queue``,
a process's ``node``; see :data:`REFERENCES`).  Their names are the neutral ones in :class:`K`
plus whatever further names a backend shows (described by its
:class:`~proxy_agent.service.attributes.AttrInfo` list).  Values are stored per kind in
columns (one key table per kind, one row of values per element): a model of a million jobs
with a dict per element would cost several times the memory.  A row is an immutable tuple,
replaced when the element changes, so that elements created from one attribute mapping (in
one :meth:`ServiceModel.add_many`) share a single row, and a renderer can group alike
elements by their row's identity before comparing values.

Changes
-------
Each mutation is told at once to every subscriber (a :class:`ChangeSink`): an element was
created, some of its attributes changed (which ones), it was removed (with everything below
it), it moved to another parent, or a process wrote a line of output.  Mutations made inside
:meth:`ServiceModel.batch` are followed by one :meth:`ChangeSink.flush` at the end, so a
subscriber can send what belongs together as one message.  Coalescing (what to send while a
client is not reading) is the subscriber's business.

An *observer* (:meth:`ServiceModel.observe`) hears the same changes but belongs to the model:
it keeps figures derived from other elements (a queue's waiting jobs) and writes them when it
is flushed, first, so that they reach the subscribers in the same batch as their cause.

Output
------
Process output goes to the subscribers, a text of one or more lines at a time (joined by
``\n``).  While nobody is subscribed it is kept per job, up to :data:`BACKLOG_LIMIT` bytes
(the oldest lines giving way, counted), and handed to the next subscriber that asks
(:meth:`ServiceModel.take_backlog`).

Output is held back from the jobs, as a terminal does, while a subscriber that is keeping up
has :data:`OUTPUT_HIGH_WATER` bytes of it waiting: backends ``await``
:meth:`ServiceModel.output_room` before they read more from a job.  A subscriber that is not
reading (its client stopped events, or stopped reading) does not hold jobs back; it keeps a
bounded amount and counts what it drops.
"""

from __future__ import annotations

from collections import deque
from typing import ContextManager, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

# The model's vocabulary (its kinds, names and elements) lives beside it, and is the model's too.
from .elements import (
    CREATE_ORDER, REFERENCES, ROOT, AttrValue, Element, K, KeySource, Kind, ProcessElement, UnknownElement,
)

__all__ = [
    "BACKLOG_LIMIT",
    "CREATE_ORDER",
    "ChangeSink",
    "Element",
    "K",
    "Kind",
    "OutputBacklog",
    "REFERENCES",
    "ROOT",
    "ServiceModel",
    "UnknownElement",
]


#: Output bytes kept per job while no client is subscribed.
BACKLOG_LIMIT = 1 << 20
#: Output bytes a reading subscriber may have waiting before the jobs' output is held back.
OUTPUT_HIGH_WATER = 4 << 20


_PARENT_KIND = {Kind.NODE: Kind.MACHINE, Kind.JOB: Kind.QUEUE, Kind.PROCESS: Kind.JOB}


class _Schema:
    """Attribute names of one element kind, in first-seen order."""

    __slots__ = ("keys", "index", "version")

    def __init__(self) -> None:
        self.keys: List[str] = []
        self.index: Dict[str, int] = {}
        #: bumped whenever a name is added, so renderers can cache per-slot work
        self.version = 0

    def slot(self, key: str) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.version += 1
        return i


class _ElementIndex:
    """Every element by key, looked up in the tables of each kind: no table of all elements
    beside them (for a million jobs that is tens of megabytes less).  Keys are unique across
    kinds; the biggest kinds are looked in first."""

    __slots__ = ("_tables",)

    def __init__(self, by_kind: Dict[Kind, Dict[int, Element]]) -> None:
        order = (Kind.JOB, Kind.PROCESS, Kind.NODE, Kind.QUEUE, Kind.MACHINE)
        self._tables = tuple(by_kind[kind] for kind in order)

    def get(self, key: int, default: Optional[Element] = None) -> Optional[Element]:
        for table in self._tables:
            element = table.get(key)
            if element is not None:
                return element
        return default

    def __getitem__(self, key: int) -> Element:
        element = self.get(key)
        if element is None:
            raise KeyError(key)
        return element

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.get(key) is not None

    def __len__(self) -> int:
        return sum(map(len, self._tables))


class ChangeSink:
    """What a subscriber hears.  Every method is called synchronously, inside the mutation.

    ``held_output`` is how many bytes of output it holds that its client has not taken yet;
    while ``holds_back`` is true and that exceeds :data:`OUTPUT_HIGH_WATER`, the jobs' output
    waits (see :meth:`ServiceModel.output_room`).  A subscriber calls
    :meth:`ServiceModel.room_made` when either changes in the jobs' favour.
    """

    held_output = 0
    holds_back = False
    #: hears output (a client's view); a sink that does not leaves output to the backlog
    takes_output = True

    def created(self, element: Element) -> None:
        """A new element (its children follow in their own calls)."""

    def created_all(self, elements: Sequence[Element],
                    changes: Sequence[Tuple[Element, List[int]]] = ()) -> None:
        """New elements, parents before their children, and the changes the model's observers
        made of them (their queue's figures): one call for a job and its processes."""
        for element in elements:
            self.created(element)
        for element, slots in changes:
            self.changed(element, slots)

    def changed(self, element: Element, slots: Iterable[int]) -> None:
        """These attribute slots of the element have new values (read them from the element)."""

    def removed(self, element: Element) -> None:
        """The element is gone, and everything below it (children are told first)."""

    def moved(self, element: Element, old_parent: int) -> None:
        """The element now hangs from ``element.parent``, no longer from ``old_parent``."""

    def output(self, element: Element, stream: str, text: str, offset: Optional[int] = None) -> None:
        """A process wrote lines (``stream`` is ``stdout`` or ``stderr``); ``offset``, when
        the backend keeps the output in a file, is where this text ends in it."""

    def flush(self) -> None:
        """A batch of mutations is complete (called after every mutation outside a batch)."""


class OutputBacklog:
    """Output written while nobody listened: per process, lines in order, bounded per job."""

    __slots__ = ("lines", "size", "dropped")

    def __init__(self) -> None:
        #: (process key, stream, text, end offset or None) in the order written
        self.lines: Deque[Tuple[int, str, str, Optional[int]]] = deque()
        self.size = 0
        #: lines given up because the job wrote more than the limit: process key -> count
        self.dropped: Dict[int, int] = {}


class _Batch:
    """:meth:`ServiceModel.batch`: the model's batches nest; the outermost flushes."""

    __slots__ = ("model",)

    def __init__(self, model: "ServiceModel") -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model._quiet += 1

    def __exit__(self, *exc_info) -> None:
        model = self.model
        model._quiet -= 1
        if model._quiet == 0 and model._missed:
            model._missed = False
            model._notify()


class ServiceModel:
    """The model every backend writes and every front-end reads (see the module docs)."""

    def __init__(self) -> None:
        self._schemas: Dict[Kind, _Schema] = {kind: _Schema() for kind in Kind}
        #: kind -> key -> element, in creation order
        self._by_kind: Dict[Kind, Dict[int, Element]] = {kind: {} for kind in Kind}
        self._elements = _ElementIndex(self._by_kind)
        #: where element keys come from (the service numbers a submission from it too)
        self.key_source = KeySource()
        self._sinks: List[ChangeSink] = []
        #: the subscribers that take output
        self._readers: List[ChangeSink] = []
        #: sinks that are part of the model (see :meth:`observe`)
        self._observers: List[ChangeSink] = []
        #: sinks that hear every line of output (see :meth:`record_output`)
        self._output_recorders: List[ChangeSink] = []
        self._quiet = 0
        self._missed = False
        #: while not None, the subscribers' share of each update is kept here (see add_job)
        self._collected: Optional[List[Tuple[Element, List[int]]]] = None
        self._batch = _Batch(self)
        self._backlog: Dict[int, OutputBacklog] = {}
        #: job key -> the rank its next process gets
        self._next_ranks: Dict[int, int] = {}
        self._room = None  # a trio.Event while backends wait for room for output
        #: job key -> sinks that hear that job's output whoever else listens (see watch_output)
        self._job_watchers: Dict[int, List[ChangeSink]] = {}
        #: bumped on every mutation: equal versions mean an unchanged model
        self.version = 0
        #: keys handed out in creation order stay ascending unless a caller chose keys
        self._ascending = True

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._elements)

    def __contains__(self, key: object) -> bool:
        return key in self._elements

    @property
    def by_key(self) -> "_ElementIndex":
        """Every element by its key, for reading only: ``get(key)`` gives None for a key that
        is gone (what a loop over many keys wants, where :meth:`get` would raise)."""
        return self._elements

    def get(self, key: int) -> Element:
        try:
            return self._elements[key]
        except KeyError:
            raise UnknownElement(f"no element with key {key}") from None

    def lookup(self, key: int) -> Optional[Element]:
        """The element with ``key``, or None when there is none (where a miss is expected)."""
        return self._elements.get(key)

    def find(self, key: int, kind: Kind) -> Element:
        element = self._elements.get(key)
        if element is None or element.kind is not kind:
            raise UnknownElement(f"no {kind.value} with key {key}")
        return element

    def keys(self, kind: Kind) -> List[int]:
        """Keys of every element of a kind, in creation order."""
        return list(self._by_kind[kind])

    def elements(self, kind: Kind) -> Iterable[Element]:
        """Every element of a kind, in creation order (a live view: do not mutate while iterating)."""
        return self._by_kind[kind].values()

    def of_kind(self, kind: Kind) -> Mapping[int, Element]:
        """Every element of a kind by its key (a live view, for many look-ups in a row)."""
        return self._by_kind[kind]

    def count(self, kind: Kind) -> int:
        return len(self._by_kind[kind])

    def schema(self, kind: Kind) -> _Schema:
        return self._schemas[kind]

    def attrs(self, key: int) -> Dict[str, AttrValue]:
        """The element's attributes as a fresh dict."""
        element = self.get(key)
        names = self._schemas[element.kind].keys
        return {names[i]: v for i, v in enumerate(element.values) if v is not None}

    def attr(self, key: int, name: str, default: Optional[AttrValue] = None) -> Optional[AttrValue]:
        element = self.get(key)
        i = self._schemas[element.kind].index.get(name)
        if i is None or i >= len(element.values):
            return default
        value = element.values[i]
        return default if value is None else value

    def children(self, key: int, kind: Optional[Kind] = None) -> List[int]:
        element = self.get(key)
        if not element.children:
            return []
        if kind is None:
            return list(element.children)
        elements = self._elements
        return [c for c in element.children if elements[c].kind is kind]

    def processes(self, job: int) -> List[int]:
        """A job's processes, in rank order."""
        element = self.get(job)
        if not element.children:
            return []
        elements = self._elements
        found = [elements[c] for c in element.children if elements[c].kind is Kind.PROCESS]
        found.sort(key=lambda e: e.rank)
        return [e.key for e in found]

    def owner(self, key: int) -> str:
        return self.get(key).owner

    def ascending(self) -> bool:
        """Keys of each kind are in ascending order in :meth:`keys` (true unless keys were chosen)."""
        return self._ascending

    # ------------------------------------------------------------------ subscription

    def subscribe(self, sink: ChangeSink) -> None:
        # The list is replaced, never changed in place (here and in unsubscribe): a sink may
        # subscribe or leave while the sinks are being told of a change, and every other sink
        # of that round must still be told.
        self._sinks = self._sinks + [sink]
        self._readers = [s for s in self._sinks if s.takes_output]

    def observe(self, sink: ChangeSink) -> None:
        """Hear every change as a subscriber does, as a part of the model rather than a reader of
        it: an observer gets no output and does not count as a subscriber (output is still kept
        while nobody else listens), and it is flushed before the subscribers, so that what it
        changes in its :meth:`ChangeSink.flush` (figures it derives) joins the same batch."""
        self._observers.append(sink)

    def record_output(self, sink: ChangeSink) -> None:
        """Hand every line of output to ``sink`` too, as it is written and before any
        subscriber has it, whether or not anyone listens (the service keeps each job's
        output this way).  It does not count as a subscriber."""
        self._output_recorders.append(sink)

    def unsubscribe(self, sink: ChangeSink) -> None:
        self._sinks = [s for s in self._sinks if s is not sink]
        self._readers = [s for s in self._sinks if s.takes_output]
        self.room_made()

    def watch_output(self, job: int, sink: ChangeSink) -> None:
        """``sink`` hears the output of job ``job`` (as :meth:`ChangeSink.output`), besides the
        subscribers: a watcher of single jobs is no subscriber, so output is still kept for
        the next one while none listens, and it holds no job back."""
        watchers = self._job_watchers.setdefault(job, [])
        if sink not in watchers:
            watchers.append(sink)

    def backlog_of(self, job: int) -> List[Tuple[int, str, str, Optional[int]]]:
        """The output of ``job`` kept while nobody listened: (process, stream, text, offset),
        in order; it stays kept for the next subscriber."""
        backlog = self._backlog.get(job)
        return list(backlog.lines) if backlog is not None else []

    def unwatch_output(self, job: int, sink: ChangeSink) -> None:
        watchers = self._job_watchers.get(job)
        if watchers is None:
            return
        try:
            watchers.remove(sink)
        except ValueError:
            pass
        if not watchers:
            del self._job_watchers[job]

    # ------------------------------------------------------------------ output flow

    def output_room_available(self) -> bool:
        """No subscriber that is keeping up has too much output waiting."""
        for sink in self._sinks:
            if sink.holds_back and sink.held_output >= OUTPUT_HIGH_WATER:
                return False
        return True

    async def output_room(self) -> None:
        """Wait until a job's output may be read on (see the module documentation)."""
        import trio

        while not self.output_room_available():
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    def room_made(self) -> None:
        """A subscriber sent output on (or stopped holding jobs back): waiting jobs go on."""
        room = self._room
        if room is not None:
            self._room = None
            room.set()

    @property
    def subscribers(self) -> int:
        """How many subscribers hear output (clients)."""
        return len(self._readers)

    def take_backlog(self) -> Dict[int, OutputBacklog]:
        """Output kept while nobody listened, per job; the caller now owns it."""
        backlog = self._backlog
        self._backlog = {}
        return backlog

    # ------------------------------------------------------------------ mutation

    def _values(self, kind: Kind, attrs: Mapping[str, AttrValue]) -> tuple:
        schema = self._schemas[kind]
        values: list = [None] * len(schema.keys)
        for name, value in attrs.items():
            if value is None:
                continue
            i = schema.slot(name)
            if i >= len(values):
                values.extend([None] * (i + 1 - len(values)))
            values[i] = value if value.__class__ is str else _freeze(name, value)
        return tuple(values)

    def _check_parent(self, kind: Kind, parent: int) -> Optional[Element]:
        """The parent element a new element of ``kind`` hangs from (None: the service root)."""
        if kind in (Kind.MACHINE, Kind.QUEUE):
            if parent != ROOT:
                raise ValueError(f"a {kind.value} hangs from the service root, not {parent}")
            return None
        return self.find(parent, _PARENT_KIND[kind])

    def new_keys(self, count: int) -> range:
        return self.key_source.take(count)

    def reserve_keys(self, above: int) -> None:
        """Hand out only keys above ``above`` from now on (keys restored from a store)."""
        self.key_source.reserve(above)

    def add(self, kind: Kind, parent: Optional[int], attrs: Mapping[str, AttrValue], owner: str = "",
            key: Optional[int] = None) -> int:
        """Create one element; returns its key.  Machines and queues take parent None.

        ``key`` chooses the key (a job adopted from the store keeps the one it had); it must
        not be in use.
        """
        if key is not None:
            if key in self._elements or key <= ROOT:
                raise ValueError(f"key {key} is in use or not a valid key")
            parent_key = ROOT if parent is None else parent
            parent_element = self._check_parent(kind, parent_key)
            if key < self.key_source.next:
                self._ascending = False
            self.reserve_keys(key)
            rank = self._next_rank(parent_element) if kind is Kind.PROCESS else -1
            if rank >= 0:
                self._next_ranks[parent_key] = rank + 1
            values = self._values(kind, attrs)
            self._attach(ProcessElement(key, kind, parent_key, values, owner, rank) if rank >= 0
                         else Element(key, kind, parent_key, values, owner))
            self._notify()
            return key
        return self.add_many(kind, parent, [attrs], owner)[0]

    def _next_rank(self, job: Optional[Element]) -> int:
        """The rank the job's next process gets: ranks are never reused within a job."""
        if job is None:
            return 0
        return self._next_ranks.get(job.key, 0)

    def add_many(
        self, kind: Kind, parent: Optional[int], attrs_list: Sequence[Mapping[str, AttrValue]], owner: str = "",
        rows: Optional[Dict[int, tuple]] = None,
    ) -> range:
        """Create related elements with contiguous keys (a job's processes, a machine's nodes).

        Processes get the next ranks of their job, in list order.  Elements given the same
        mapping object share one row; ``rows`` carries that sharing across calls (the caller
        keeps every mapping it used alive, and the mappings unchanged, while it passes it).
        """
        parent_key = ROOT if parent is None else parent
        parent_element = self._check_parent(kind, parent_key)
        keys = self.new_keys(len(attrs_list))
        rank = self._next_rank(parent_element) if kind is Kind.PROCESS else -1
        values_of = self._values
        attach = self._attach
        # Elements given the same attribute mapping share one (immutable) row of values: a
        # backend that reuses mappings for alike jobs keeps a big model small.
        if rows is None:
            rows = {}
        if rank < 0:
            for key, attrs in zip(keys, attrs_list):
                row = rows.get(id(attrs))
                if row is None:
                    row = rows[id(attrs)] = values_of(kind, attrs)
                attach(Element(key, kind, parent_key, row, owner))
        else:
            for key, attrs in zip(keys, attrs_list):
                row = rows.get(id(attrs))
                if row is None:
                    row = rows[id(attrs)] = values_of(kind, attrs)
                attach(ProcessElement(key, kind, parent_key, row, owner, rank))
                rank += 1
            self._next_ranks[parent_key] = rank
        self._notify()
        return keys

    def add_job(self, queue: int, attrs: Mapping[str, AttrValue], processes: Sequence[Mapping[str, AttrValue]],
                owner: str = "", key: Optional[int] = None) -> Tuple[int, range]:
        """A job in ``queue`` and its processes (ranks 0, 1, ...) in one step; returns the
        job's key and its processes' keys.  Each subscriber hears of them in one call
        (:meth:`ChangeSink.created_all`), then the batch is flushed.  ``key``: as for
        :meth:`add`; the processes' keys are new.  Processes given the same mapping object
        share one row, as in :meth:`add_many`."""
        self.find(queue, Kind.QUEUE)
        keys = self.key_source
        if key is None:
            key = keys.take(1)[0]
        else:
            if key in self._elements or key <= ROOT:
                raise ValueError(f"key {key} is in use or not a valid key")
            if key < keys.next:
                self._ascending = False
            keys.reserve(key)
        job = Element(key, Kind.JOB, queue, self._values(Kind.JOB, attrs), owner)
        elements: List[Element] = [job]
        self._link(job)
        process_keys = keys.take(len(processes))
        rows: Dict[int, tuple] = {}
        values_of = self._values
        for rank, (process_key, process_attrs) in enumerate(zip(process_keys, processes)):
            row = rows.get(id(process_attrs))
            if row is None:
                row = rows[id(process_attrs)] = values_of(Kind.PROCESS, process_attrs)
            process = ProcessElement(process_key, Kind.PROCESS, key, row, owner, rank)
            self._link(process)
            elements.append(process)
        if processes:
            self._next_ranks[key] = len(processes)
        for sink in self._observers:
            sink.created_all(elements)
        changes: List[Tuple[Element, List[int]]] = []
        if self._quiet:  # in a batch: its end flushes the observers and the subscribers
            self._missed = True
            for sink in self._sinks:
                sink.created_all(elements)
            return key, process_keys
        if self._observers:
            # What the observers derive from the job now (its queue's figures) reaches each
            # subscriber with the job, in the same call.
            self._collected = changes
            try:
                self._flush_observers()
            finally:
                self._collected = None
        for sink in self._sinks:
            sink.created_all(elements, changes)
        for sink in self._sinks:
            sink.flush()
        return key, process_keys

    def _link(self, element: Element) -> None:
        """Put an element in the model (its subscribers are told by the caller)."""
        self._by_kind[element.kind][element.key] = element
        parent = self._elements.get(element.parent)
        if parent is not None:
            if parent.children is None:
                parent.children = [element.key]
            else:
                parent.children.append(element.key)
        self.version += 1

    def _attach(self, element: Element) -> None:
        self._link(element)
        for sink in self._observers:
            sink.created(element)
        for sink in self._sinks:
            sink.created(element)

    def update(self, key: int, attrs: Mapping[str, AttrValue]) -> bool:
        """Set attributes (None clears one); only values that differ count.  True if any did."""
        element = self.get(key)
        schema = self._schemas[element.kind]
        row = element.values
        # Rows may be shared between elements: a changed row is a new one.
        values: Optional[list] = None
        changed: Optional[List[int]] = None
        for name, value in attrs.items():
            if value is not None and value.__class__ is not str:
                value = _freeze(name, value)
            i = schema.index.get(name)
            if i is None:
                if value is None:
                    continue
                i = schema.slot(name)
            current = values if values is not None else row
            if i >= len(current):
                if value is None:
                    continue
            elif current[i] == value:
                continue
            if values is None:
                values = list(row)
            if i >= len(values):
                values.extend([None] * (i + 1 - len(values)))
            values[i] = value
            if changed is None:
                changed = [i]
            else:
                changed.append(i)
        if changed is None:
            return False
        assert values is not None  # a change copies the row first
        element.values = tuple(values)
        self.version += 1
        for sink in self._observers:
            sink.changed(element, changed)
        if self._collected is not None:
            self._collected.append((element, changed))
        else:
            for sink in self._sinks:
                sink.changed(element, changed)
        self._notify()
        return True

    def update_many(self, keys: Iterable[int], attrs: Mapping[str, AttrValue]) -> int:
        """The same attributes for many elements; subscribers hear of it in one batch."""
        with self.batch():
            return sum(1 for key in keys if self.update(key, attrs))

    def batch(self) -> ContextManager[None]:
        """Group mutations: subscribers are flushed once, at the end, if anything happened.
        (One object for every batch, without a generator: a job's life takes several.)"""
        return self._batch

    def remove(self, key: int) -> None:
        """Remove an element and everything below it."""
        element = self.get(key)
        parent = self._elements.get(element.parent)
        if parent is not None and parent.children:
            try:
                parent.children.remove(key)
            except ValueError:
                pass
        self._remove_tree(element)
        self.version += 1
        self._notify()

    def _remove_tree(self, element: Element) -> None:
        for child in element.children or ():
            self._remove_tree(self._elements[child])
        del self._by_kind[element.kind][element.key]
        if element.kind is Kind.JOB:
            self._backlog.pop(element.key, None)
            self._next_ranks.pop(element.key, None)
        for sink in self._observers:
            sink.removed(element)
        for sink in self._sinks:
            sink.removed(element)

    def move(self, key: int, new_parent: int) -> None:
        """Give an element another parent (a job moving to another queue)."""
        element = self.get(key)
        if element.kind in (Kind.MACHINE, Kind.QUEUE):
            raise ValueError(f"a {element.kind.value} always hangs from the service root")
        if new_parent == element.parent:
            return
        parent = self._check_parent(element.kind, new_parent)
        assert parent is not None  # machines and queues were refused above
        old_parent = self._elements.get(element.parent)
        if old_parent is not None and old_parent.children:
            try:
                old_parent.children.remove(key)
            except ValueError:
                pass
        old = element.parent
        element.parent = new_parent
        if parent.children is None:
            parent.children = [key]
        else:
            parent.children.append(key)
        self.version += 1
        for sink in self._observers:
            sink.moved(element, old)
        for sink in self._sinks:
            sink.moved(element, old)
        self._notify()

    def output(self, process: int, stream: str, text: str, offset: Optional[int] = None) -> None:
        """A process wrote one or more lines (joined by ``\n``; ``stream`` is ``stdout`` or
        ``stderr``).  ``offset``: where the text ends in the file the backend keeps the
        output in, when it does (so that delivery can be recorded and resumed)."""
        element = self.find(process, Kind.PROCESS)
        for recorder in self._output_recorders:
            recorder.output(element, stream, text, offset)
        if self._job_watchers:
            for sink in self._job_watchers.get(element.parent, ()):
                sink.output(element, stream, text, offset)
        readers = self._readers
        if readers:
            for sink in readers:
                sink.output(element, stream, text, offset)
            self._notify()
            return
        self._keep(element, process, stream, text, offset)

    def keep_output(self, lines: Iterable[Tuple[int, str, str, Optional[int]]], dropped: Mapping[int, int]) -> None:
        """Output a subscriber held and never passed on to its client, which has gone:
        (process, stream, text, offset) in order, and lines it had given up per process.  It
        is kept for the next subscriber as output written while nobody listened is, unless a
        subscriber listens now (it has had those lines)."""
        if self._readers:
            return
        for process, stream, text, offset in lines:
            element = self._elements.get(process)
            if element is not None and element.kind is Kind.PROCESS:
                self._keep(element, process, stream, text, offset)
        for process, count in dropped.items():
            element = self._elements.get(process)
            if element is not None and element.kind is Kind.PROCESS:
                backlog = self._backlog.setdefault(element.parent, OutputBacklog())
                backlog.dropped[process] = backlog.dropped.get(process, 0) + count

    def _keep(self, element: Element, process: int, stream: str, text: str, offset: Optional[int]) -> None:
        backlog = self._backlog.get(element.parent)
        if backlog is None:
            backlog = self._backlog[element.parent] = OutputBacklog()
        backlog.lines.append((process, stream, text, offset))
        backlog.size += len(text) + 1
        while backlog.size > BACKLOG_LIMIT and backlog.lines:
            old_process, old_stream, old, old_offset = backlog.lines.popleft()
            if not backlog.lines:
                # one block alone is too big: keep its newest lines
                keep = old[-BACKLOG_LIMIT:]
                cut = keep.find("\n")
                keep = keep[cut + 1:] if cut >= 0 else ""
                kept_lines = keep.count("\n") + 1 if keep else 0
                backlog.dropped[old_process] = backlog.dropped.get(old_process, 0) + old.count("\n") + 1 - kept_lines
                backlog.size = len(keep) + 1 if keep else 0
                if keep:
                    backlog.lines.append((old_process, old_stream, keep, old_offset))
                break
            backlog.size -= len(old) + 1
            backlog.dropped[old_process] = backlog.dropped.get(old_process, 0) + old.count("\n") + 1

    def _notify(self) -> None:
        if self._quiet:
            self._missed = True
            return
        if self._observers:
            self._flush_observers()
        for sink in self._sinks:
            sink.flush()

    def _flush_observers(self) -> None:
        self._quiet += 1  # what the observers change now belongs to the subscribers' flush
        try:
            for sink in self._observers:
                sink.flush()
        finally:
            self._quiet -= 1
            self._missed = False


def _freeze(name: str, value: object) -> AttrValue:
    """The stored form of a value that is not already text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int(value) if name in REFERENCES else str(value)
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return str(value)
