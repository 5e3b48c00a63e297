"""One protocol session: the wire, the session rules, the model and a scheduler, in one nursery.

Data flows one way through a session::

    bytes -> Decoder -> AgentSession -> command handlers -> Scheduler
    Scheduler -> Model -> (drain/snapshot) -> AgentSession.send -> encode -> bytes

Every outgoing event is checked by the session and encoded at the moment it
is queued, so the order on the wire is the order of the checks.  A single
writer task moves queued bytes to the stream; model changes are drained
only when the writer has caught up, so a slow client makes changes coalesce
in the model instead of piling up in a buffer.
"""

from __future__ import annotations

import gc
import hmac
import logging
from typing import List, Optional

import attrs
import trio

from .model import Model, UnknownElement
from .protocol.attributes import AttributeDefinition, AttributeSet
from .protocol.ids import IdAllocator
from .protocol.messages import (
    AttrDef,
    Command,
    CommandId,
    ElementKind,
    Error,
    ErrorCode,
    Event,
    Message,
    MessageLevel,
    Ok,
    SubmitJobError,
    TerminateJobError,
)
from .protocol.session import AgentSession, ProtocolViolation
from .protocol.wire import DEFAULT_MAX_FRAME_SIZE, Decoder, encode_frame
from .schedulers.base import JobError, Scheduler, SchedulerError, SchedulerOptions, scheduler_class

log = logging.getLogger("proxy_agent.agent")

__all__ = ["AgentConfig", "Session", "refuse_busy"]

#: Attribute definitions per ATTR_DEF event.
DEFS_PER_EVENT = 16
#: Writer drains the model only while less than this much is waiting to be written.
_WRITE_HIGH_WATER = 1 << 20
_READ_SIZE = 1 << 16


@attrs.frozen
class AgentConfig:
    scheduler: str = "local"
    options: SchedulerOptions = SchedulerOptions()
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: shared secret the client must send as INIT attribute token=... (None: not required)
    token: Optional[str] = None


class _SessionClosed(Exception):
    pass


class Session:
    """Serves one client connection until QUIT, end of input, or cancellation."""

    def __init__(self, stream: trio.abc.Stream, config: AgentConfig, peer: str = "client") -> None:
        self.stream = stream
        self.config = config
        self.peer = peer
        self.session = AgentSession()
        self.decoder = Decoder(config.max_frame_size)
        self.model: Optional[Model] = None
        self.scheduler: Optional[Scheduler] = None
        self.quit_requested = False
        self._out = bytearray()
        # replies held back until the initial model is out (see emit)
        self._deferred: List[bytes] = []
        self._wake = trio.Event()
        self._scheduler_ready = trio.Event()
        self._scheduler_failure: Optional[str] = None
        self._snapshot_started = False
        # While above zero, model changes wait (a submission's OK goes out before its NEW_JOB).
        self._hold = 0
        self._snapshot = None
        self._closing = False
        self._writer_done = trio.Event()
        self._nursery: Optional[trio.Nursery] = None

    # ------------------------------------------------------------------ output

    def emit(self, event: Event) -> bool:
        """Check, encode and queue one event.  Returns False if it may not be sent."""
        try:
            self.session.send(event)
        except ProtocolViolation as exc:
            # The command was already completed (e.g. abandoned by QUIT).
            log.debug("not sent: %s", exc)
            return False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("sending %s", event)
        if self._snapshot is not None and self.session.events_flowing:
            # Anything said after START_EVENTS follows the whole initial model, so a
            # client can use any later reply as a fence ("the initial model is in").
            # It waits (already checked and encoded) while the model streams out.
            self._deferred.append(event.encode())
            self._poke()
            return True
        if self._deferred:
            self._release_deferred()
        self._out += event.encode()
        self._poke()
        return True

    def _poke(self) -> None:
        self._wake.set()

    def _events_live(self) -> bool:
        return self._snapshot_started and self.session.events_flowing and self.model is not None

    def _has_model_work(self) -> bool:
        return (
            self._hold == 0
            and self._events_live()
            and (self._snapshot is not None or self.model.has_pending)  # type: ignore[union-attr]
        )

    def _model_changed(self) -> None:
        """The model changed: while events flow, the change goes out at once.

        Sending each mutation (or batch of mutations) as it happens keeps every
        state a job passes through visible to the client; changes coalesce only
        while events are stopped, while the initial model is still streaming,
        or while the client is not keeping up with what was already queued.
        """
        if self._snapshot is None and len(self._out) < _WRITE_HIGH_WATER and self._has_model_work():
            self._emit_model()
        self._poke()

    def _emit_model(self) -> None:
        """Queue the next chunk of the initial model, or else the pending changes."""
        tid = self.session.events_tid
        if self._snapshot is not None:
            chunk = next(self._snapshot, None)
            if chunk is None:
                self._snapshot = None
                log.debug("initial model sent: %d elements", len(self.model))  # type: ignore[arg-type]
                self._release_deferred()
                return
        else:
            chunk = self.model.drain_wire(tid)  # type: ignore[union-attr,arg-type]
        check = self.session.check
        out = self._out
        for event_id, args in chunk:
            check(event_id, tid)  # type: ignore[arg-type]
            out += encode_frame(event_id, tid, args)  # type: ignore[arg-type]

    def _release_deferred(self) -> None:
        for data in self._deferred:
            self._out += data
        self._deferred.clear()

    async def _writer(self) -> None:
        stream = self.stream
        while True:
            if not self._out and not self._has_model_work():
                await self._wake.wait()
                self._wake = trio.Event()
            if self._has_model_work() and len(self._out) < _WRITE_HIGH_WATER:
                self._emit_model()
            elif self._deferred and not (self._snapshot is not None and self.session.events_flowing):
                self._release_deferred()  # the snapshot was paused by STOP_EVENTS
            if self._out:
                data = bytes(self._out)
                self._out.clear()
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise _SessionClosed(f"{self.peer} went away while writing: {exc}") from None
            else:
                await trio.lowlevel.checkpoint()
            if self._closing and not self._out:
                self._writer_done.set()
                return

    # ------------------------------------------------------------------ main loop

    async def run(self) -> bool:
        """Serve until the session ends.  Returns True if the client sent QUIT."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                await self._reader()
                # Let the writer finish writing what is queued (SHUTDOWN after QUIT), bounded.
                self._closing = True
                self._poke()
                with trio.move_on_after(2):
                    await self._writer_done.wait()
                nursery.cancel_scope.cancel()
        except _SessionClosed as exc:
            log.info("%s", exc)
        finally:
            await self._shutdown_scheduler()
        return self.quit_requested

    async def _reader(self) -> None:
        stream = self.stream
        decoder = self.decoder
        debug = log.isEnabledFor(logging.DEBUG)
        while True:
            try:
                data = await stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.info("%s went away: %s", self.peer, exc)
                return
            if not data:
                decoder.feed_eof()
                for item in decoder:
                    log.warning("input ended: %s", item)
                log.info("%s closed the connection", self.peer)
                return
            decoder.feed(data)
            for item in decoder:
                if debug:
                    log.debug("received %s", item)
                received = self.session.receive(item)
                if received.log:
                    log.warning("%s", received.log)
                for reply in received.replies:
                    self.emit(reply)
                if received.close:
                    return
                if received.command is not None:
                    await self._dispatch(received.command, received)
                    if self.quit_requested or self._closing:
                        return

    async def _shutdown_scheduler(self) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        self.scheduler = None
        with trio.CancelScope(shield=True):
            with trio.move_on_after(1.8):
                try:
                    await scheduler.aclose()
                except Exception:  # noqa: BLE001 - shutdown must finish
                    log.exception("error while shutting down the %s scheduler", scheduler.name)

    # ------------------------------------------------------------------ commands

    async def _dispatch(self, command: Command, received) -> None:
        cid = command.command_id
        if cid is CommandId.QUIT:
            self.quit_requested = True
            log.info("QUIT received")
            return
        if cid is CommandId.INIT:
            await self._init(command, received.init)
        elif cid is CommandId.MODEL_DEF:
            await self._model_def(command)
        elif cid is CommandId.START_EVENTS:
            await self._start_events(command)
        elif cid is CommandId.STOP_EVENTS:
            log.debug("events stopped (TID %d)", command.tid)
        elif cid is CommandId.LIST_FILTERS:
            self.emit(Ok(command.tid))
        elif cid is CommandId.SET_FILTERS:
            self.emit(Error(command.tid, ErrorCode.NOT_SUPPORTED, "this agent supports no event filters"))
        else:
            self._nursery.start_soon(self._job_command, command)  # type: ignore[union-attr]

    async def _init(self, command: Command, init) -> None:
        expected = self.config.token
        if expected is not None:
            given = init.get("token") or ""
            if not hmac.compare_digest(given.encode(), expected.encode()):
                reason = "missing" if not given else "wrong"
                log.warning("%s sent a %s token; closing the connection", self.peer, reason)
                self.emit(Error(command.tid, ErrorCode.AUTHENTICATION, f"authentication failed: {reason} token"))
                self._closing = True
                return
        try:
            cls = scheduler_class(self.config.scheduler)
            self.model = Model(IdAllocator(init.base_id))
            self.model.on_change = self._model_changed
            self.scheduler = cls(self.model, self.config.options)
            self.scheduler.on_message = self.notify
        except Exception as exc:  # noqa: BLE001 - report any set-up failure to the client
            log.exception("cannot set up the %s scheduler", self.config.scheduler)
            self.emit(Error(command.tid, ErrorCode.SCHEDULER, f"cannot start the {self.config.scheduler} scheduler: {exc}"))
            return
        self._nursery.start_soon(self._run_scheduler)  # type: ignore[union-attr]
        log.info("session initialised: base id %d, scheduler %s", init.base_id, self.config.scheduler)
        self.emit(Ok(command.tid))

    async def _run_scheduler(self) -> None:
        scheduler = self.scheduler
        assert scheduler is not None
        try:
            await self._nursery.start(self._guarded_scheduler, scheduler)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - reported to the client by MODEL_DEF / START_EVENTS
            log.exception("the %s scheduler failed to start", scheduler.name)
            self._scheduler_failure = f"the {scheduler.name} scheduler failed to start: {_describe(exc)}"
            self._scheduler_ready.set()
            return
        # The model just built is long-lived: keep the cyclic collector from scanning
        # it again and again while the initial model is encoded.
        gc.freeze()
        self._scheduler_ready.set()

    async def _guarded_scheduler(self, scheduler: Scheduler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the scheduler; a failure after start-up is logged and told, not fatal to the session."""
        started = False

        class _Status:
            def started(self, value=None) -> None:
                nonlocal started
                started = True
                task_status.started(value)

        try:
            await scheduler.run(task_status=_Status())
        except Exception as exc:  # noqa: BLE001
            if not started:
                raise
            log.exception("the %s scheduler stopped", scheduler.name)
            self.notify(MessageLevel.ERROR, ErrorCode.SCHEDULER, f"the {scheduler.name} scheduler stopped: {_describe(exc)}")

    async def _wait_scheduler(self, command: Command) -> bool:
        await self._scheduler_ready.wait()
        if self._scheduler_failure is not None:
            self.emit(Error(command.tid, ErrorCode.SCHEDULER, self._scheduler_failure))
            return False
        return True

    async def _model_def(self, command: Command) -> None:
        if not await self._wait_scheduler(command):
            return
        seen = set()
        defs: List[AttributeDefinition] = []
        for definition in self.scheduler.attribute_definitions():  # type: ignore[union-attr]
            if definition.id not in seen:
                seen.add(definition.id)
                defs.append(definition)
        for start in range(0, len(defs), DEFS_PER_EVENT):
            self.emit(AttrDef(command.tid, defs[start:start + DEFS_PER_EVENT]))
        self.emit(Ok(command.tid))

    async def _start_events(self, command: Command) -> None:
        if not await self._wait_scheduler(command):
            return
        if not self._snapshot_started:
            # Streamed by the writer chunk by chunk, ahead of any change.
            self._snapshot = self.model.snapshot_wire(command.tid)  # type: ignore[union-attr]
            self._snapshot_started = True
        self._poke()

    def _job_id(self, attrs_: AttributeSet) -> int:
        text = attrs_.get("jobId") or ""
        try:
            job_id = int(text)
        except ValueError:
            raise UnknownElement(f"no job with id {text!r}") from None
        self.model.find(job_id, ElementKind.JOB)  # type: ignore[union-attr]
        return job_id

    async def _job_command(self, command: Command) -> None:
        cid = command.command_id
        tid = command.tid
        attrs_ = AttributeSet.parse(command.args)
        if self.scheduler is None:
            self._fail(command, attrs_, ErrorCode.ILLEGAL_IN_PHASE, "no scheduler is running")
            return
        if not await self._wait_scheduler(command):
            return
        scheduler = self.scheduler
        try:
            if cid is CommandId.SUBMIT_JOB:
                self._hold += 1
                try:
                    job_id = await scheduler.submit(attrs_)
                    log.info("submitted %s as job %d", attrs_.get("jobSubId"), job_id)
                    self.emit(Ok(tid))
                finally:
                    self._hold -= 1
                    self._model_changed()
                return
            elif cid is CommandId.TERMINATE_JOB:
                await scheduler.terminate(self._job_id(attrs_))
            elif cid is CommandId.CHANGE_JOB:
                job_id = self._job_id(attrs_)
                changes = AttributeSet(tuple(item for item in attrs_.items if item[0] != "jobId"))
                if not changes.items:
                    raise JobError("CHANGE_JOB names no attribute to change", ErrorCode.BAD_ARGUMENTS)
                await scheduler.change(job_id, changes)
            elif cid is CommandId.MOVE_JOB:
                job_id = self._job_id(attrs_)
                queue_text = attrs_.get("queueId") or ""
                try:
                    queue_id = int(queue_text)
                    self.model.find(queue_id, ElementKind.QUEUE)  # type: ignore[union-attr]
                except (ValueError, UnknownElement):
                    raise JobError(f"no queue with id {queue_text!r}", ErrorCode.NO_SUCH_QUEUE) from None
                await scheduler.move(job_id, queue_id)
            else:  # pragma: no cover - the session only lets known commands through
                raise JobError(f"{command.name} is not handled", ErrorCode.NOT_SUPPORTED)
        except UnknownElement as exc:
            self._fail(command, attrs_, ErrorCode.NO_SUCH_JOB, str(exc))
        except SchedulerError as exc:
            log.info("%s (TID %d) failed: %s", command.name, tid, exc.message)
            self._fail(command, attrs_, exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - one command's failure must not end the session
            log.exception("internal error in %s (TID %d)", command.name, tid)
            self._fail(command, attrs_, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self.emit(Ok(tid))

    def _fail(self, command: Command, attrs_: AttributeSet, code: int, message: str) -> None:
        cid = command.command_id
        if cid is CommandId.SUBMIT_JOB:
            self.emit(SubmitJobError(command.tid, attrs_.get("jobSubId") or "", code, message))
        elif cid is CommandId.TERMINATE_JOB:
            self.emit(TerminateJobError(command.tid, attrs_.get("jobId") or "", code, message))
        else:
            self.emit(Error(command.tid, code, message))

    def notify(self, level: MessageLevel, code: int, text: str) -> None:
        """Tell the client something outside any command (under the START_EVENTS TID, if open)."""
        tid = self.session.events_tid
        if tid is not None:
            self.emit(Message(tid, level, code, text))
        else:
            log.warning("%s", text)


def _describe(exc: BaseException) -> str:
    """One line about an exception; for a group, about its first leaf."""
    while getattr(exc, "exceptions", None):  # an exception group (trio nurseries raise those)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)


async def refuse_busy(stream: trio.abc.Stream, peer: str, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
    """Answer a connection that arrived while another session is being served.

    It gets ERROR (busy) under the TID of its first command, then is closed.
    """
    decoder = Decoder(max_frame_size)
    with trio.move_on_after(5):
        try:
            while True:
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    break
                decoder.feed(data)
                item = decoder.next_event()
                if item is None:
                    continue
                tid = getattr(item, "tid", None)
                if tid is not None:
                    busy = Error(tid, ErrorCode.BUSY, "the agent is busy serving another session; try again later")
                    await stream.send_all(busy.encode())
                break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    log.info("refused %s: busy", peer)
    with trio.move_on_after(1):
        await stream.aclose()
