"""Helpers shared by the tests of the service model, the backends and the PTP view.

* :class:`Client` is what one PTP client is sent of a :class:`ServiceModel`: a
  :class:`ModelView` with its own base id whose wire events are encoded into frames,
  decoded again and interpreted with :func:`decode_event`, so tests assert on the typed
  PTP events a client would read.
* :class:`Mirror` applies such events the way a client does (NEW of a known id, CHANGE or
  REMOVE of an unknown one, REMOVE of a parent before its children are errors) and keeps
  the output lines; :func:`expected_mirror` is the picture a client should have of a model.
* :class:`Harness` is a :class:`JobService` running one backend, with the PTP way in
  (:meth:`Harness.submit_ptp`, :meth:`Harness.change_ptp`: SUBMIT_JOB and CHANGE_JOB
  attributes through the front-end's mapping) beside the neutral one.

Import from test modules (``from service_fixtures import Client``); pytest puts this
directory on ``sys.path``.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import attrs
import trio

from proxy_agent.frontends.ptp import mapping
from proxy_agent.frontends.ptp.render import NATIVE_RULES, RenderRules, WireEvent
from proxy_agent.frontends.ptp.view import ModelView
from proxy_agent.protocol.attributes import AttributeSet
from proxy_agent.protocol.messages import (
    ElementChange,
    ElementKind,
    ErrorCode,
    Event,
    NewElements,
    ProcessChange,
    RemoveElements,
    RemoveProcesses,
    decode_event,
)
from proxy_agent.protocol.wire import Decoder, FrameError, encode_frame
from proxy_agent.service.backend import Backend
from proxy_agent.service.jobs import ErrorKind, JobState, ServiceError
from proxy_agent.service.model import K, Kind, ServiceModel
from proxy_agent.service.service import JobService
from wait_support import scaled

__all__ = [
    "BASE",
    "TID",
    "Client",
    "Harness",
    "Mirror",
    "decode_wire",
    "expected_mirror",
    "ptp_code",
    "start_backend",
    "wait_for",
]

#: The base id of the client of most tests.
BASE = 100
#: The TID of that client's START_EVENTS.
TID = 7
#: How long a test waits for a backend to get somewhere.
TIMEOUT = scaled(30.0)

_KIND = {
    Kind.MACHINE: ElementKind.MACHINE,
    Kind.NODE: ElementKind.NODE,
    Kind.QUEUE: ElementKind.QUEUE,
    Kind.JOB: ElementKind.JOB,
    Kind.PROCESS: ElementKind.PROCESS,
}


def decode_wire(events: Iterable[WireEvent], tid: int = TID) -> List[Event]:
    """Wire events as a client reads them: framed, decoded, interpreted."""
    data = b"".join(encode_frame(event_id, tid, args) for event_id, args in events)
    decoder = Decoder()
    decoder.feed(data)
    decoder.feed_eof()
    out: List[Event] = []
    for item in decoder:
        assert not isinstance(item, FrameError), f"malformed frame: {item}"
        out.append(decode_event(item))
    return out


def process_ref(job_id: str, rank: Union[int, str]) -> str:
    """How a client names a process: its job's id and its rank (``112:0``)."""
    return f"{job_id}:{rank}"


class Client:
    """One PTP client of a model: a view under ``base``, its events decoded."""

    def __init__(self, model: ServiceModel, base: int = BASE, tid: int = TID,
                 rules: RenderRules = NATIVE_RULES) -> None:
        self.model = model
        self.base = base
        self.tid = tid
        self.view = ModelView(model, base, rules)

    # ids

    def id(self, key: int) -> str:
        """The client's id of an element (a process: ``job id:rank``)."""
        element = self.model.get(key)
        if element.kind is Kind.PROCESS:
            return process_ref(str(self.base + element.parent), element.rank)
        return str(self.base + key)

    # events

    def chunks(self) -> Iterator[List[Event]]:
        """Subscribe; the initial model chunk by chunk (consume it while the model changes)."""
        for chunk in self.view.subscribe():
            yield decode_wire(chunk, self.tid)

    def snapshot(self) -> List[Event]:
        """Subscribe and take the whole initial model."""
        return [event for chunk in self.chunks() for event in chunk]

    def snapshot_wire(self) -> List[WireEvent]:
        return [event for chunk in self.view.subscribe() for event in chunk]

    def drain(self) -> List[Event]:
        return decode_wire(self.view.drain(), self.tid)

    def close(self) -> None:
        self.view.unsubscribe()


def element_refs(event: Event) -> List[str]:
    """The ids an element event names, processes as ``job id:rank``."""
    if isinstance(event, (NewElements, ElementChange, ProcessChange)):
        ids = [i for group in event.groups for i in group.id_list()]
    else:
        ids = [str(i) for i in event.ids]  # type: ignore[attr-defined]
    if isinstance(event, (ProcessChange, RemoveProcesses)):
        return [process_ref(event.job_id, i) for i in ids]
    if isinstance(event, NewElements) and event.kind is ElementKind.PROCESS:
        return [process_ref(event.parent_id, i) for i in ids]
    return ids


class Mirror:
    """A client's picture of the model, built from events; protocol slips fail the test.

    ``elements`` maps a client id (``job id:rank`` for processes) to (kind, parent id,
    attributes); a change to an empty value removes the attribute.  ``output`` maps a process
    to its (stream, line) in the order received.
    """

    OUTPUT_KEYS = {"processStdout": "stdout", "processStderr": "stderr"}

    def __init__(self) -> None:
        self.elements: Dict[str, Tuple[ElementKind, str, Dict[str, str]]] = {}
        self.output: Dict[str, List[Tuple[str, str]]] = {}

    def apply(self, events: Iterable[Event]) -> "Mirror":
        elements = self.elements
        for event in events:
            if isinstance(event, NewElements):
                for group in event.groups:
                    for ref in element_refs(NewElements(event.tid, event.kind, event.parent_id, [group])):
                        assert ref not in elements, f"NEW for known element {ref}"
                        if event.kind not in (ElementKind.MACHINE, ElementKind.QUEUE):
                            assert event.parent_id in elements, f"NEW {ref} under unknown parent {event.parent_id}"
                        elements[ref] = (event.kind, event.parent_id, dict(group.attributes))
            elif isinstance(event, (ElementChange, ProcessChange)):
                for group in event.groups:
                    single = (ProcessChange(event.tid, event.job_id, [group]) if isinstance(event, ProcessChange)
                              else ElementChange(event.tid, event.kind, [group]))
                    attrs = dict(group.attributes)
                    # one value may carry several lines, joined by "\n"
                    lines = [(self.OUTPUT_KEYS[k], line) for k, v in group.attributes if k in self.OUTPUT_KEYS
                             for line in v.split("\n")]
                    for key in self.OUTPUT_KEYS:
                        attrs.pop(key, None)
                    for ref in element_refs(single):
                        assert ref in elements, f"CHANGE for unknown element {ref}"
                        assert elements[ref][0] is event.kind, f"{event.event_id.name} for {ref}, a {elements[ref][0]}"
                        known = elements[ref][2]
                        for key, value in attrs.items():
                            if value == "":
                                known.pop(key, None)  # the attribute no longer has a value
                            else:
                                known[key] = value
                        self.output.setdefault(ref, []).extend(lines)
            elif isinstance(event, (RemoveElements, RemoveProcesses)):
                for ref in element_refs(event):
                    assert ref in elements, f"REMOVE for unknown element {ref}"
                    assert elements[ref][0] is event.kind, f"{event.event_id.name} for {ref}, a {elements[ref][0]}"
                    if isinstance(event, RemoveProcesses):
                        assert elements[ref][1] == event.job_id
                    assert not any(parent == ref for _, parent, _ in elements.values()), \
                        f"{ref} removed before its children"
                    del elements[ref]
            else:  # pragma: no cover - a model stream has nothing else
                raise AssertionError(f"unexpected event {event}")
        return self

    def structure(self) -> Dict[str, Tuple[ElementKind, str]]:
        return {ref: (kind, parent) for ref, (kind, parent, _) in self.elements.items()}

    def lines(self, ref: str, stream: str = "stdout") -> List[str]:
        return [text for s, text in self.output.get(ref, []) if s == stream]


def expected_structure(model: ServiceModel, base: int = BASE) -> Dict[str, Tuple[ElementKind, str]]:
    """Every element of the model as a client with ``base`` must know it: id -> (kind, parent)."""
    out = {}
    for kind in Kind:
        for key in model.keys(kind):
            element = model.get(key)
            parent = str(base + element.parent)
            ref = process_ref(parent, element.rank) if kind is Kind.PROCESS else str(base + key)
            out[ref] = (_KIND[kind], parent)
    return out


def expected_mirror(model: ServiceModel, base: int = BASE) -> Mirror:
    """What a client must know of the model: checked against the model's own structure, with
    the attributes a new client is sent."""
    fresh = Mirror().apply(Client(model, base).snapshot())
    assert fresh.structure() == expected_structure(model, base)
    return fresh


def ptp_code(exc: ServiceError) -> ErrorCode:
    """The PTP error code a client gets for a failed request."""
    return mapping.error_code(exc.kind)


async def wait_for(predicate, timeout: float = TIMEOUT, step: float = 0.005) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(step)


class Harness:
    """A job service running one backend, seen by one PTP client (subscribed at start)."""

    def __init__(self, service: JobService, backend: Backend, client: Client) -> None:
        self.service = service
        self.backend = backend
        self.model = service.model
        self.client = client
        self.mirror = Mirror()
        #: notices the service passed on: (level, text)
        self.notices: List[Tuple[str, str]] = []
        service.add_listener(lambda level, text: self.notices.append((level, text)))

    # ---------------------------------------------------------------- what the client sees

    def sync(self) -> List[Event]:
        """Drain the client's view into its mirror; returns the events."""
        events = self.client.drain()
        self.mirror.apply(events)
        return events

    def output(self, process: int, stream: str = "stdout") -> List[str]:
        """Lines of a process the client has been sent so far (after :meth:`sync`)."""
        return self.mirror.lines(self.client.id(process), stream)

    def ptp(self, key: int) -> Dict[str, str]:
        """An element's attributes as the client knows them (after :meth:`sync`)."""
        return self.mirror.elements[self.client.id(key)][2]

    # ---------------------------------------------------------------- the PTP way in

    def queue_ref(self, text: str):
        """A client's queueId: its element id -> the queue's key; a name as it is."""
        raw = text.strip()
        if raw.isdigit():
            key = int(raw) - self.client.base
            if key in self.model and self.model.get(key).kind is Kind.QUEUE:
                return key
            raise ServiceError(f"no queue with id {text!r}", ErrorKind.NO_SUCH_QUEUE)
        return raw

    async def submit_ptp(self, attrs: Union[AttributeSet, Sequence[str]]) -> int:
        """SUBMIT_JOB with these attributes (``key=value`` texts or a set); the job's key."""
        if not isinstance(attrs, AttributeSet):
            attrs = AttributeSet.parse(list(attrs))
        return await self.service.submit(mapping.job_spec(attrs, self.queue_ref))

    async def change_ptp(self, job: int, attrs: Union[AttributeSet, Sequence[str]]) -> None:
        """CHANGE_JOB of a job with these attributes."""
        if not isinstance(attrs, AttributeSet):
            attrs = AttributeSet.parse(list(attrs))
        what, flag = mapping.job_change(attrs)
        if what == "hold":
            await self.service.hold(job, flag)
        else:
            await self.service.suspend(job, flag)

    # ---------------------------------------------------------------- states

    def state(self, key: int) -> Optional[str]:
        return self.model.attr(key, K.STATE)  # type: ignore[return-value]

    def native(self, key: int) -> Optional[str]:
        return self.model.attr(key, K.NATIVE_STATE)  # type: ignore[return-value]

    def ended(self, key: int) -> bool:
        state = self.state(key)
        return state is not None and JobState(state).final

    async def wait_state(self, key: int, state: str, timeout: float = TIMEOUT) -> None:
        await wait_for(lambda: self.state(key) == state, timeout)

    async def wait_ended(self, key: int, timeout: float = TIMEOUT) -> Dict[str, object]:
        await wait_for(lambda: self.ended(key), timeout)
        return self.model.attrs(key)


async def start_backend(nursery: trio.Nursery, backend: Backend, base: int = BASE) -> Harness:
    """Run ``backend`` in a service in ``nursery``; returns once it has filled the model, with
    a client subscribed that has taken the initial model."""
    service = JobService(backend.model)
    backend.context = attrs.evolve(backend.context, notify=service.notify)
    service.add_backend(backend)
    harness = Harness(service, backend, Client(service.model, base))
    await nursery.start(service.run)
    await service.ready.wait()
    assert service.failure is None, service.failure
    harness.mirror.apply(harness.client.snapshot())
    return harness
