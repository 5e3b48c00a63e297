"""The service interface, served: one local tool's connection over the job service.

A tool (the Invoke Server, ``proxy-agent jobs``/``forget``/``output``) speaks the service's
own terms here (see :mod:`.wire`): it submits a :class:`~proxy_agent.service.jobs.JobSpec`
and gets the job's key, the one id the store keeps and every front-end shows; it watches
jobs by key and hears their :class:`~proxy_agent.service.jobs.JobState` and output; errors
come back as the service's neutral kinds.  Requests run side by side, each in a task of its
own, and are answered as they complete (by ``id``).

What the host (the service process, :mod:`proxy_agent.daemon`) adds is passed in as ``ops``:
the launching process's requests and ``stop``.  An op may answer with a :class:`Handover`,
after which the connection is no longer this interface's (a launch's PTP session).

Output of a watched job is recorded as delivered (see
:meth:`~proxy_agent.service.service.JobService.delivered`) just before it is written, as a PTP
session does; a tool that stops reading has its output dropped past :data:`QUEUE_LIMIT`
bytes, and is told how many lines of which job it lost.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections import deque
from typing import Any, Awaitable, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import attrs
import trio

from ...service.jobs import ErrorKind, JobError, JobState, ServiceError
from ...service.model import ChangeSink, Element, K, Kind, UnknownElement
from ...service.service import JobService, describe
from ...service.store import StoreUnwritable
from ...transport import write_now
from .terms import error_of, spec_from_dict
from .wire import VERSION, LineReader, encode

__all__ = ["ApiSession", "Handover", "QUEUE_LIMIT"]

log = logging.getLogger("proxy_agent.frontends.api")

#: Bytes of events a connection may have waiting before output is dropped (and counted).
QUEUE_LIMIT = 8 << 20
#: Of an output file, ``output`` sends at most its last this many bytes...
FILE_LIMIT = 64 << 20
#: ...in events of at most this many (lines are not cut).
OUTPUT_CHUNK = 1 << 20
#: Bytes written in one go.
_WRITE_CHUNK = 1 << 18
_READ_SIZE = 1 << 16
#: Longest a job request may take once started (as a PTP session's).
_REQUEST_BOUND = 120.0
_FINAL = frozenset(state.value for state in JobState if state.final)
#: Requests that may open a connection (each checks the version it is given).
_GREETINGS = frozenset({"hello", "launch", "session", "stop", "farewell"})

#: What an op handler returns: the reply's fields, or a handover.
OpResult = Union[Dict[str, Any], "Handover"]
Op = Callable[["ApiSession", Dict[str, Any]], Awaitable[OpResult]]


@attrs.frozen
class Handover:
    """The connection becomes something else once the reply is written: ``run(stream,
    rest)`` takes it over (``rest``: what the client sent after its request)."""

    run: Callable[[trio.abc.Stream, bytes], Awaitable[None]]
    reply: Dict[str, Any] = attrs.field(factory=dict)


class _Watch:
    __slots__ = ("key", "last", "dropped", "ended", "done", "files_end", "streams")

    def __init__(self, key: int) -> None:
        self.key = key
        #: the (state, native state, message) last sent
        self.last: Optional[Tuple[Any, Any, Any]] = None
        #: output lines given up because the tool did not read
        self.dropped = 0
        #: the job's final state has been sent
        self.ended = False
        #: set when the watch has ended (final state or the job gone)
        self.done = trio.Event()
        #: (rank, stream) -> where the part already read from the job's files ends
        self.files_end: Dict[Tuple[int, str], int] = {}
        #: the output streams the tool wants
        self.streams = frozenset(("stdout", "stderr"))


class _JobSink(ChangeSink):
    """Hears the model for one connection's watched jobs (no subscriber of output: the output
    of each watched job comes through :meth:`ServiceModel.watch_output`)."""

    takes_output = False

    def __init__(self, session: "ApiSession") -> None:
        self.session = session
        self._dirty: Dict[int, None] = {}

    def created(self, element: Element) -> None:
        if element.kind is Kind.JOB and element.key in self.session.watches:
            self._dirty[element.key] = None

    def changed(self, element: Element, slots) -> None:
        watches = self.session.watches
        if element.kind is Kind.JOB:
            if element.key in watches:
                self._dirty[element.key] = None
        elif element.kind is Kind.PROCESS and element.parent in watches:
            self._dirty[element.parent] = None

    def removed(self, element: Element) -> None:
        if element.kind is Kind.JOB and element.key in self.session.watches:
            self._dirty.pop(element.key, None)
            self.session.job_gone(element.key)

    def output(self, element: Element, stream: str, text: str, offset: Optional[int] = None) -> None:
        self.session.job_output(element, stream, text, offset)

    def flush(self) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        for key in dirty:
            self.session.job_changed(key)


class ApiSession:
    """Serves one tool's connection until it closes (see the module documentation)."""

    def __init__(self, stream: trio.abc.Stream, service: JobService, *, state_dir: Optional[str] = None,
                 ops: Optional[Dict[str, Op]] = None, options: Optional[Callable[..., Awaitable[Dict[str, Any]]]] = None,
                 peer: str = "tool") -> None:
        self.stream = stream
        self.service = service
        self.state_dir = state_dir
        self.ops: Dict[str, Op] = dict(ops or {})
        #: applies a hello's ``options`` (an agent command line): returns the reply's fields,
        #: with ``prefer`` (the schedulers the tool's submissions prefer)
        self._apply_options = options
        self.peer = peer
        self.prefer: Tuple[str, ...] = ()
        self.greeted = False
        self.watches: Dict[int, _Watch] = {}
        self._sink: Optional[_JobSink] = None
        #: (bytes, output offsets they carry or None) waiting to be written
        self._out: Deque[Tuple[bytes, Optional[Dict[Tuple[int, str], int]]]] = deque()
        self._queued = 0
        self._wake = trio.Event()
        #: a write is under way (see :meth:`drained`)
        self._writing = False
        self._nursery: Optional[trio.Nursery] = None
        self._handover: Optional[Tuple[Handover, bytes]] = None
        self._ready = service.ready

    # ------------------------------------------------------------------ running

    async def run(self, reader: LineReader, first: Iterable[Dict[str, Any]] = ()) -> Optional[Tuple[Handover, bytes]]:
        """Serve until the tool closes the connection (or the caller cancels); returns the
        handover an op asked for, with the bytes that followed its request."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                for message in first:
                    if await self._receive(message, reader):
                        break
                else:
                    await self._read(reader)
                await self.drained()
                nursery.cancel_scope.cancel()
        finally:
            self._detach()
        return self._handover

    async def _read(self, reader: LineReader) -> None:
        while True:
            try:
                data = await self.stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            try:
                messages = reader.feed(data)
            except ValueError as exc:
                self.send({"event": "error", "message": f"the service closes this connection: {exc}"})
                log.warning("%s sent %s; closing", self.peer, exc)
                return
            for message in messages:
                if await self._receive(message, reader):
                    return

    async def _receive(self, message: Dict[str, Any], reader: LineReader) -> bool:
        """Handle one request; True when the connection is handed over (stop reading)."""
        op = message.get("op")
        ident = message.get("id")
        if not self.greeted:
            if op not in _GREETINGS:
                self._fail(ident, ServiceError("the first request must be hello", ErrorKind.BAD_REQUEST))
                return False
            if message.get("version") != VERSION:
                self._fail(ident, ServiceError(
                    f"this service speaks version {VERSION} of its interface, not {message.get('version')!r}; "
                    "stop it (proxy-agent stop) to start one of this version", ErrorKind.NOT_SUPPORTED))
                return False
            self.greeted = True
        handler = self.ops.get(op) if isinstance(op, str) else None
        if handler is None and op == "hello":
            handler = _REQUESTS["hello"]
        if handler is not None and op in _GREETINGS:
            # the host's own requests come one at a time, in order
            try:
                result = await handler(self, message)
            except ServiceError as exc:
                self._fail(ident, exc)
                return False
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the service
                log.exception("internal error in %s from %s", op, self.peer)
                self._fail(ident, ServiceError(f"internal error: {describe(exc)}", ErrorKind.INTERNAL))
                return False
            if isinstance(result, Handover):
                self.send(dict(result.reply, id=ident, ok=True))
                self._handover = (result, reader.pending)
                return True
            self.send(dict(result, id=ident, ok=True))
            return False
        if self._nursery is not None:
            self._nursery.start_soon(self._request, op, ident, message, handler)
        return False

    async def _request(self, op: Any, ident: Any, message: Dict[str, Any], handler: Optional[Op]) -> None:
        try:
            if handler is not None:
                result = await handler(self, message)
            else:
                method = _REQUESTS.get(op) if isinstance(op, str) else None
                if method is None:
                    raise ServiceError(f"unknown request {op!r}", ErrorKind.NOT_SUPPORTED)
                # A request, once made, is carried out even if the tool leaves meanwhile.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + _REQUEST_BOUND):
                    result = await method(self, message)
        except ServiceError as exc:
            self._fail(ident, exc)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the connection
            log.exception("internal error in %s from %s", op, self.peer)
            self._fail(ident, ServiceError(f"internal error: {describe(exc)}", ErrorKind.INTERNAL))
        else:
            if isinstance(result, dict):
                self.send(dict(result, id=ident, ok=True))

    def _fail(self, ident: Any, exc: ServiceError) -> None:
        self.send({"id": ident, "ok": False, "error": error_of(exc)})

    # ------------------------------------------------------------------ writing

    def send(self, message: Dict[str, Any], offsets: Optional[Dict[Tuple[int, str], int]] = None) -> None:
        data = encode(message)
        self._out.append((data, offsets))
        self._queued += len(data)
        self._wake.set()

    async def _writer(self) -> None:
        while True:
            if not self._out:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            chunk: List[bytes] = []
            size = 0
            offsets: Dict[Tuple[int, str], int] = {}
            while self._out and size < _WRITE_CHUNK:
                data, carried = self._out.popleft()
                chunk.append(data)
                size += len(data)
                if carried:
                    offsets.update(carried)
            self._queued -= size
            data = b"".join(chunk)
            # Recorded as delivered just before it is written, and written at once (no other
            # task runs in between): a service killed then loses at most this one write.
            undo = self.service.delivered(offsets) if offsets else None
            self._writing = True
            try:
                sent = write_now(self.stream, data) if undo else 0
                if sent < len(data):
                    await self.stream.send_all(data[sent:] if sent else data)
                self._writing = False
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                if undo:
                    self.service.undeliver(undo)
                if self._nursery is not None:
                    self._nursery.cancel_scope.cancel()
                return
            except BaseException:
                if undo:
                    self.service.undeliver(undo)
                raise

    async def drained(self, bound: float = 2.0) -> None:
        """Until what is queued is written (bounded: a tool that stopped reading is left)."""
        with trio.move_on_after(bound):
            while self._out or self._writing:
                await trio.sleep(0.005)

    # ------------------------------------------------------------------ watching

    def _watch(self, key: int, files_end: Optional[Dict[Tuple[int, str], int]] = None,
               streams: Sequence[str] = ("stdout", "stderr")) -> _Watch:
        """Watch a job (``files_end``: where the part of its output already sent from its
        files ends, per process and stream; what comes from the model up to there is not sent
        again)."""
        watch = self.watches.get(key)
        if watch is not None:
            for where, end in (files_end or {}).items():
                watch.files_end[where] = max(end, watch.files_end.get(where, 0))
        else:
            model = self.service.model
            watch = self.watches[key] = _Watch(key)
            watch.files_end = dict(files_end or {})
            watch.streams = frozenset(streams)
            if self._sink is None:
                self._sink = _JobSink(self)
                model.subscribe(self._sink)
            model.watch_output(key, self._sink)
            # what it wrote while no client listened (a service that has just taken it back)
            for process, stream, text, offset in model.backlog_of(key):
                element = model.lookup(process)
                if element is not None:
                    self.job_output(element, stream, text, offset)
        return watch

    def _unwatch(self, key: int) -> None:
        watch = self.watches.pop(key, None)
        if watch is None:
            return
        watch.done.set()
        if self._sink is not None:
            self.service.model.unwatch_output(key, self._sink)
            if not self.watches:
                self.service.model.unsubscribe(self._sink)
                self._sink = None

    def _detach(self) -> None:
        for key in list(self.watches):
            self._unwatch(key)

    def job_output(self, element: Element, stream: str, text: str, offset: Optional[int]) -> None:
        watch = self.watches.get(element.parent)
        if watch is None or watch.ended or stream not in watch.streams:
            return
        if offset is not None:
            end = watch.files_end.get((element.rank, stream))
            if end is not None and offset <= end:
                return  # already sent from the job's files
        if self._queued > QUEUE_LIMIT:
            watch.dropped += text.count("\n") + 1
            return
        self._flush_dropped(watch)
        carried = {(element.key, stream): offset} if offset is not None else None
        self.send({"event": "output", "job": element.parent, "rank": element.rank, "stream": stream, "text": text},
                  carried)

    def _flush_dropped(self, watch: _Watch) -> None:
        if watch.dropped:
            self.send({"event": "dropped", "job": watch.key, "lines": watch.dropped,
                       "why": "the tool did not read its output in time"})
            watch.dropped = 0

    def job_changed(self, key: int) -> None:
        watch = self.watches.get(key)
        if watch is None or watch.ended:
            return
        event = job_event(self.service, key)
        if event is None:
            return
        now = (event["state"], event.get("native_state"), event.get("message"))
        final = event["state"] in _FINAL
        if now == watch.last and not final:
            return
        watch.last = now
        self._flush_dropped(watch)
        self.send(event)
        if final:
            watch.ended = True
            self._unwatch(key)

    def job_gone(self, key: int) -> None:
        watch = self.watches.get(key)
        if watch is None or watch.ended:
            return
        self._flush_dropped(watch)
        self.send({"event": "gone", "job": key, "message": "the job was removed from the service"})
        watch.ended = True
        self._unwatch(key)

    async def _known(self, key: int) -> bool:
        """Whether the model has job ``key``, once the backends present when this connection
        began have started (they take back their stored jobs as they start)."""
        await self._ready.wait()
        return key in self.service.model and self.service.model.get(key).kind is Kind.JOB

    # ------------------------------------------------------------------ requests

    async def _hello(self, message: Dict[str, Any]) -> Dict[str, Any]:
        reply: Dict[str, Any] = {}
        options = message.get("options")
        if options is not None:
            if not (isinstance(options, list) and all(isinstance(o, str) for o in options)):
                raise ServiceError("options must be a list of texts (an agent command line)", ErrorKind.BAD_REQUEST)
            if self._apply_options is None:
                raise ServiceError("this service takes no options", ErrorKind.NOT_SUPPORTED)
            applied = await self._apply_options(options, message.get("cwd"))
            self.prefer = tuple(applied.pop("prefer", ()))
            self._ready = self.service.ready
            reply.update(applied)
        reply["service"] = service_facts(self.service)
        return reply

    async def _submit(self, message: Dict[str, Any]) -> Dict[str, Any]:
        spec = spec_from_dict(message.get("spec"))
        await self._ready.wait()
        failure = self.service.failure
        if failure is not None:
            raise ServiceError(failure, ErrorKind.UNAVAILABLE)
        watch = bool(message.get("watch"))
        key = await self.service.submit(spec, self.prefer, on_key=self._watch if watch else None)
        if watch:
            if key not in self.watches:
                self._watch(key)  # another key than the one first given (a multi-part job)
            self.job_changed(key)
        return {"job": key}

    async def _terminate(self, message: Dict[str, Any]) -> Dict[str, Any]:
        key = _key(message.get("job"))
        if not await self._known(key):
            raise JobError(f"no job {key}", ErrorKind.NO_SUCH_JOB)
        if self.service.model.attr(key, K.STATE) in _FINAL:
            return {"ended": True}  # it ended on its own meanwhile
        await self.service.terminate(key)
        return {}

    async def _watch_request(self, message: Dict[str, Any]) -> Dict[str, Any]:
        key = _key(message.get("job"))
        if not await self._known(key):
            ended = stored_end(self.service, key)
            if ended is None:
                raise JobError(f"no job {key}", ErrorKind.NO_SUCH_JOB)
            self.send(ended)
            return {"job": key}
        self._watch(key)
        self.job_changed(key)
        return {"job": key}

    async def _unwatch_request(self, message: Dict[str, Any]) -> Dict[str, Any]:
        self._unwatch(_key(message.get("job")))
        return {}

    async def _queues(self, message: Dict[str, Any]) -> Dict[str, Any]:
        await self._ready.wait()
        service = self.service
        model = service.model
        defaults = {backend.name: backend.default_queue for backend in service.running_backends()}
        queues = []
        for key in model.keys(Kind.QUEUE):
            owner = model.get(key).owner
            queues.append({"key": key, "name": model.attr(key, K.NAME), "scheduler": owner,
                           "default": defaults.get(owner) == key})
        return {"queues": queues}

    async def _jobs(self, message: Dict[str, Any]) -> Dict[str, Any]:
        store = self._store()
        return {"jobs": [attrs.asdict(job) for job in store.jobs()]}

    async def _forget(self, message: Dict[str, Any]) -> Dict[str, Any]:
        from ...service.statedir import forget_stored

        store = self._store()
        keys = message.get("jobs") or []
        when = message.get("ended_before")
        if not (isinstance(keys, list) and all(isinstance(k, int) and not isinstance(k, bool) for k in keys)):
            raise ServiceError("jobs must be a list of job keys", ErrorKind.BAD_REQUEST)
        if when is not None and not isinstance(when, (int, float)):
            raise ServiceError("ended_before must be a time in seconds", ErrorKind.BAD_REQUEST)
        why = store.unwritable
        if why is None:
            try:
                outcome = forget_stored(store, self.state_dir or "", keys, when)
                forgotten, refused = outcome["forgotten"], outcome["refused"]
            except StoreUnwritable as exc:
                why = exc.message
            except sqlite3.Error as exc:
                why = str(exc)
        if why is not None:
            # as `proxy-agent forget` says it with no service running: one line, nothing lost
            raise ServiceError(f"the job store cannot be written now ({why}); nothing was forgotten",
                               ErrorKind.UNAVAILABLE)
        self.service.stored.difference_update(forgotten)
        return {"forgotten": forgotten, "refused": refused}

    async def _output(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """A job's output: what its scheduler keeps in files (a local job's, all of it), then
        with ``follow`` what it writes from now on, until it ends."""
        key = _key(message.get("job"))
        streams = message.get("streams") or ["stdout", "stderr"]
        if not (isinstance(streams, list) and set(streams) <= {"stdout", "stderr"}):
            raise ServiceError("streams must name stdout and/or stderr", ErrorKind.BAD_REQUEST)
        known = await self._known(key)
        if not known and self._store_record(key) is None:
            raise JobError(f"no job {key}", ErrorKind.NO_SUCH_JOB)
        follow = bool(message.get("follow")) and known
        files = self._output_files(key)
        ends: Dict[Tuple[int, str], int] = {}
        for (rank, stream), path in sorted(files.items()):
            if stream in streams:
                ends[(rank, stream)] = self._send_file(key, rank, stream, path)
        # From here on (no other task has run since the files were read) the job's output
        # comes from the model: what it has kept, then what is written.
        if follow:
            self._watch(key, ends, streams)
            self.job_changed(key)
        else:
            self.send({"event": "end", "job": key})
        return {"job": key, "files": bool(files)}

    async def _kept_output(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """A job's kept output (every line it wrote, as the state directory keeps it) from the
        line after those the reader has (``skip``: ``[[rank, stream, lines], ...]``), and
        whether the job has ended; what ``proxy-agent output`` prints."""
        from ...service.statedir import output_answer

        key = _key(message.get("job"))
        streams = message.get("streams") or ["stdout", "stderr"]
        if not (isinstance(streams, list) and set(streams) <= {"stdout", "stderr"}):
            raise ServiceError("streams must name stdout and/or stderr", ErrorKind.BAD_REQUEST)
        rank = message.get("rank")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise ServiceError("rank must be a process's rank (0 or more)", ErrorKind.BAD_REQUEST)
        skip: Dict[Tuple[int, str], int] = {}
        for item in message.get("skip") or []:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int)
                    and item[1] in ("stdout", "stderr") and isinstance(item[2], int) and item[2] >= 0):
                raise ServiceError("skip must list [rank, stream, lines]", ErrorKind.BAD_REQUEST)
            skip[(item[0], item[1])] = item[2]
        if self.service.store is not None and self._store_record(key) is None:
            raise JobError(f"no job {key} in the list", ErrorKind.NO_SUCH_JOB)  # (as the job list says it)
        kept = await self.service.job_output(key, streams=streams, rank=rank, skip=skip)
        record = self._store_record(key)
        return output_answer(kept, record is not None and record.ended is not None)

    def _send_file(self, key: int, rank: int, stream: str, path: str) -> int:
        """Send the complete lines of an output file (its last FILE_LIMIT bytes, the lines
        before them counted as dropped), in events of OUTPUT_CHUNK bytes at most; returns
        where the part sent ends in the file."""
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                start = max(0, size - FILE_LIMIT)
                handle.seek(start)
                data = handle.read(size - start)
        except OSError:
            return 0
        if start:
            cut = data.find(b"\n") + 1
            data = data[cut:]
            start += cut
            self.send({"event": "dropped", "job": key, "lines": 0,
                       "why": f"only the last {FILE_LIMIT >> 20} MiB of process {rank}'s {stream} are sent"})
        complete = data[: data.rfind(b"\n") + 1]
        position = 0
        while position < len(complete):
            end = complete.rfind(b"\n", position, position + OUTPUT_CHUNK) + 1
            if end <= position:  # one line longer than a chunk: sent whole
                end = complete.find(b"\n", position) + 1
            self.send({"event": "output", "job": key, "rank": rank, "stream": stream,
                       "text": complete[position:end - 1].decode("utf-8", "surrogateescape")})
            position = end
        return start + len(complete)

    def _output_files(self, key: int) -> Dict[Tuple[int, str], str]:
        model = self.service.model
        owner = model.get(key).owner if key in model else None
        if owner is None:
            record = self._store_record(key)
            owner = record.backend if record is not None else None
        for backend in self.service.backends:
            if backend.name == owner:
                return backend.output_files(key)
        return {}

    def _store(self):
        store = self.service.store
        if store is None:
            raise ServiceError("the service keeps no job store (its state directory cannot be used)",
                               ErrorKind.UNAVAILABLE)
        self.service.flush_store()
        return store

    def _store_record(self, key: int):
        store = self.service.store
        return store.job(key) if store is not None else None


_REQUESTS: Dict[str, Callable[[ApiSession, Dict[str, Any]], Awaitable[Dict[str, Any]]]] = {
    "hello": ApiSession._hello,
    "submit": ApiSession._submit,
    "terminate": ApiSession._terminate,
    "watch": ApiSession._watch_request,
    "unwatch": ApiSession._unwatch_request,
    "queues": ApiSession._queues,
    "jobs": ApiSession._jobs,
    "forget": ApiSession._forget,
    "output": ApiSession._output,
    "kept_output": ApiSession._kept_output,
}


def _key(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise JobError(f"{value!r} is not a job key", ErrorKind.BAD_REQUEST)
    return value


def service_facts(service: JobService) -> Dict[str, Any]:
    from ... import __version__

    return {"pid": os.getpid(), "version": __version__,
            "schedulers": [b.name for b in service.running_backends()]}


def job_event(service: JobService, key: int) -> Optional[Dict[str, Any]]:
    """A job's state as the interface tells it: its state, the scheduler's word, its message,
    and once it has ended, how each process ended."""
    model = service.model
    try:
        model.find(key, Kind.JOB)
    except UnknownElement:
        return None
    state = model.attr(key, K.STATE)
    if not isinstance(state, str):
        return None
    event: Dict[str, Any] = {"event": "job", "job": key, "state": state,
                             "native_state": model.attr(key, K.NATIVE_STATE),
                             "message": model.attr(key, K.MESSAGE)}
    if state in _FINAL:
        event["exit_code"] = model.attr(key, K.EXIT_CODE)
        event["signal"] = model.attr(key, K.SIGNAL)
        event["processes"] = [
            {"rank": model.get(p).rank, "exit_code": model.attr(p, K.EXIT_CODE), "signal": model.attr(p, K.SIGNAL)}
            for p in model.processes(key)
        ]
    return event


def stored_end(service: JobService, key: int) -> Optional[Dict[str, Any]]:
    """The final state the store keeps of a job the model no longer has (None: none)."""
    store = service.store
    record = store.job(key) if store is not None else None
    if record is None or record.ended is None:
        return None
    return {"event": "job", "job": key, "state": record.state, "native_state": record.native_state or None,
            "message": record.message or None, "exit_code": record.exit_code or None,
            "signal": record.signal or None, "processes": []}
