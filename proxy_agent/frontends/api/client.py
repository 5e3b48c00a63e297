"""The service interface from a tool's side: :class:`ServiceClient`, over trio.

::

    async with await ServiceClient.connect(state_dir, options=["--scheduler", "local"]) as service:
        key = await service.submit(JobSpec("/bin/echo", ("hi",)), watch=True)
        async for event in service.events(key):
            ...  # JobEvent and OutputEvent, up to the job's final state

Connecting starts the state directory's service when none runs (as a launch does, see
:func:`proxy_agent.launch.open_service`).  Replies are matched to requests by id; events are
kept per job until read.  When the connection ends, every call in progress and every event
iterator raises :class:`ServiceGone`.
"""

from __future__ import annotations

import itertools
import socket
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Deque, Dict, List, Optional, Sequence, Tuple, Union

import attrs
import trio

from ...service.jobs import ErrorKind, JobSpec, JobState, ServiceError
from .terms import service_error, spec_to_dict
from .wire import VERSION, LineReader, Refused, encode, socket_path

__all__ = ["DroppedEvent", "GoneEvent", "JobEvent", "OutputEvent", "ServiceClient", "ServiceGone"]


class ServiceGone(Exception):
    """The connection to the service ended (or could not be made); the text says why."""


@attrs.frozen
class ProcessEnd:
    rank: int
    exit_code: Optional[str] = None
    signal: Optional[str] = None


@attrs.frozen
class JobEvent:
    """A job's state: its :class:`JobState`, the scheduler's own word, its message, and once
    it has ended, how each process ended."""

    job: int
    state: JobState
    native_state: Optional[str] = None
    message: Optional[str] = None
    exit_code: Optional[str] = None
    signal: Optional[str] = None
    processes: Tuple[ProcessEnd, ...] = ()


@attrs.frozen
class OutputEvent:
    """Lines a process of the job wrote (joined by ``\\n``)."""

    job: int
    rank: int
    stream: str
    text: str


@attrs.frozen
class GoneEvent:
    job: int
    message: str


@attrs.frozen
class DroppedEvent:
    job: int
    lines: int
    why: str


Event = Union[JobEvent, OutputEvent, GoneEvent, DroppedEvent]


def _event(data: Dict[str, Any]) -> Optional[Event]:
    kind = data.get("event")
    job = data.get("job")
    if not isinstance(job, int):
        return None
    if kind == "job":
        try:
            state = JobState(str(data.get("state")))
        except ValueError:
            state = JobState.OTHER
        processes = tuple(ProcessEnd(int(p.get("rank", 0)), p.get("exit_code"), p.get("signal"))
                          for p in data.get("processes") or () if isinstance(p, dict))
        return JobEvent(job, state, data.get("native_state"), data.get("message"), data.get("exit_code"),
                        data.get("signal"), processes)
    if kind == "output":
        return OutputEvent(job, int(data.get("rank", 0)), str(data.get("stream", "stdout")), str(data.get("text", "")))
    if kind == "gone":
        return GoneEvent(job, str(data.get("message") or "the job is gone"))
    if kind == "dropped":
        return DroppedEvent(job, int(data.get("lines", 0)), str(data.get("why") or ""))
    if kind == "end":
        return GoneEvent(job, "")
    return None


class _Inbox:
    """One job's events, in order, until read."""

    __slots__ = ("events", "arrived")

    def __init__(self) -> None:
        self.events: Deque[Event] = deque()
        self.arrived = trio.Event()

    def put(self, event: Event) -> None:
        self.events.append(event)
        self.arrived.set()


class ServiceClient:
    """One connection to the service of a state directory (see the module documentation)."""

    def __init__(self, stream: trio.abc.Stream, hello: Dict[str, Any]) -> None:
        self.stream = stream
        #: what the service said of itself: pid, version, schedulers
        self.service: Dict[str, Any] = dict(hello.get("service") or {})
        #: which of the options given were not applied, and why (None: all were)
        self.not_applied: Optional[str] = hello.get("not_applied")
        self._ids = itertools.count(2)
        self._waiting: Dict[int, Tuple[trio.Event, List[Dict[str, Any]]]] = {}
        self._inboxes: Dict[int, _Inbox] = {}
        self._send_lock = trio.Lock()
        #: why the connection ended (None while it is up)
        self.ended: Optional[str] = None
        self._closed = trio.Event()

    @classmethod
    async def connect(cls, state_dir: str, *, options: Optional[Sequence[str]] = None, start: bool = True,
                      idle_exit: Optional[str] = None, tool: str = "tool",
                      timeout: float = 30.0) -> "ServiceClient":
        """Connect (starting the service when none runs and ``start``), say hello with
        ``options`` (an agent command line: the schedulers wanted, their options), and
        return the client, with its reader running in the background (see :meth:`run`).
        ServiceGone saying why it cannot be reached; ServiceError when it refuses the options."""
        from ...launch import LaunchError, open_service

        import os

        request: Dict[str, Any] = {"op": "hello", "version": VERSION, "client": tool, "cwd": os.getcwd()}
        if options is not None:
            request["options"] = list(options)

        def reach() -> Tuple[Dict[str, Any], socket.socket]:
            if start:
                return open_service(state_dir, request, (), idle_exit=idle_exit,
                                    check=list(options or ()), timeout=timeout)
            from .wire import call

            reply, sock = call(socket_path(state_dir), request, keep=True, timeout=timeout)
            assert sock is not None
            return reply, sock

        try:
            reply, sock = await trio.to_thread.run_sync(reach)
        except LaunchError as exc:
            raise ServiceError(exc.text, ErrorKind.UNAVAILABLE) from None
        except Refused as exc:
            raise service_error(exc.kind, exc.message) from None
        except (OSError, ValueError) as exc:
            raise ServiceGone(f"no service serves {state_dir} ({getattr(exc, 'strerror', None) or exc})") from None
        sock.setblocking(False)
        return cls(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), reply)

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Read replies and events until the connection ends (run it in a nursery)."""
        reader = LineReader()
        task_status.started()
        why = "the service closed the connection"
        try:
            while True:
                try:
                    data = await self.stream.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    why = f"the connection to the service broke ({exc})"
                    break
                if not data:
                    break
                try:
                    messages = reader.feed(data)
                except ValueError as exc:
                    why = f"the service sent {exc}"
                    break
                for message in messages:
                    self._receive(message)
        finally:
            self._end(why)

    def _receive(self, message: Dict[str, Any]) -> None:
        ident = message.get("id")
        if ident is not None:
            waiting = self._waiting.pop(ident, None) if isinstance(ident, int) else None
            if waiting is not None:
                waiting[1].append(message)
                waiting[0].set()
            return
        event = _event(message)
        if event is not None:
            self._inbox(event.job).put(event)

    def _inbox(self, job: int) -> _Inbox:
        inbox = self._inboxes.get(job)
        if inbox is None:
            inbox = self._inboxes[job] = _Inbox()
        return inbox

    def _end(self, why: str) -> None:
        if self.ended is not None:
            return
        self.ended = why
        for event, _ in self._waiting.values():
            event.set()
        self._waiting.clear()
        for inbox in self._inboxes.values():
            inbox.arrived.set()
        self._closed.set()

    async def aclose(self) -> None:
        self._end("closed by this side")
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # ------------------------------------------------------------------ requests

    async def request(self, op: str, **fields: Any) -> Dict[str, Any]:
        """Send a request and wait for its answer; ServiceError (the service's own kind and
        words) for a refusal, ServiceGone when the connection ends first."""
        if self.ended is not None:
            raise ServiceGone(self.ended)
        ident = next(self._ids)
        arrived = trio.Event()
        answer: List[Dict[str, Any]] = []
        self._waiting[ident] = (arrived, answer)
        try:
            async with self._send_lock:
                await self.stream.send_all(encode(dict(fields, op=op, id=ident)))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._waiting.pop(ident, None)
            self._end(f"the connection to the service broke ({exc})")
            raise ServiceGone(self.ended or "the connection ended") from None
        await arrived.wait()
        if not answer:
            raise ServiceGone(self.ended or "the connection ended")
        reply = answer[0]
        if not reply.get("ok"):
            error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            raise service_error(str(error.get("kind") or ""), str(error.get("message") or "refused"))
        return reply

    async def submit(self, spec: JobSpec, *, watch: bool = False) -> int:
        """Submit a job; its key (with ``watch``, its events from the very first)."""
        reply = await self.request("submit", spec=spec_to_dict(spec), watch=watch)
        return int(reply["job"])

    async def terminate(self, job: int) -> None:
        await self.request("terminate", job=job)

    async def watch(self, job: int) -> None:
        """Hear the job's events from now on (its state now first)."""
        await self.request("watch", job=job)

    async def queues(self) -> List[Dict[str, Any]]:
        """The queues of the running schedulers: name, scheduler, key, default."""
        return list((await self.request("queues"))["queues"])

    async def jobs(self) -> List[Dict[str, Any]]:
        """The jobs the store keeps, each as the store's record (field -> value)."""
        return list((await self.request("jobs"))["jobs"])

    async def forget(self, jobs: Sequence[int], ended_before: Optional[float] = None) -> Tuple[List[int], List[int]]:
        reply = await self.request("forget", jobs=list(jobs), ended_before=ended_before)
        return list(reply["forgotten"]), list(reply["refused"])

    async def output(self, job: int, *, streams: Sequence[str] = ("stdout", "stderr"),
                     follow: bool = False) -> AsyncIterator[Event]:
        """A job's output: what its scheduler keeps of it, then with ``follow`` what it writes
        until it ends (the last event is then its final state)."""
        await self.request("output", job=job, streams=list(streams), follow=follow)
        async for event in self.events(job):
            yield event

    async def events(self, job: int) -> AsyncIterator[Event]:
        """The job's events as they come, up to its final state (or the end of the
        listing/watch: a GoneEvent).  ServiceGone when the connection ends first."""
        inbox = self._inbox(job)
        try:
            while True:
                while not inbox.events:
                    if self.ended is not None:
                        raise ServiceGone(self.ended)
                    inbox.arrived = trio.Event()
                    await inbox.arrived.wait()
                event = inbox.events.popleft()
                yield event
                if isinstance(event, GoneEvent) or (isinstance(event, JobEvent) and event.state.final):
                    return
        finally:
            if not inbox.events and self._inboxes.get(job) is inbox:
                del self._inboxes[job]

    @classmethod
    @asynccontextmanager
    async def open(cls, state_dir: str, **settings: Any) -> AsyncIterator["ServiceClient"]:
        """:meth:`connect` with the reader running, closed at the end of the block."""
        client = await cls.connect(state_dir, **settings)
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            try:
                yield client
            finally:
                await client.aclose()
                nursery.cancel_scope.cancel()

    async def __aenter__(self) -> "ServiceClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()
