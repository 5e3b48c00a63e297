"""One PTP client's session over the job service: the wire, the session rules and a view.

Data flows one way each direction::

    bytes -> Decoder -> AgentSession (phases, TIDs) -> command handlers -> JobService
    ServiceModel -> ModelView (this client's pending changes) -> AgentSession.check -> bytes

Every outgoing event is checked by the session rules and encoded when it is queued, so the
order on the wire is the order of the checks.  One writer task moves queued bytes to the
stream; model changes are drained when nothing waits to be written, or by the writer just
before it writes, so a slow client makes changes coalesce in its view instead of piling up in
a buffer (the jobs the client submitted keep every state: see ``view.py``).  A submission's
job is held back from its client until the submission's OK is queued; nothing else waits
for a submission.

The session never stops the service: when it ends, its view unsubscribes and the jobs go on.
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from typing import Deque, Iterator, List, Optional, Tuple, Union

import attrs
import trio

from ...protocol.messages import AttrDef, Command, CommandId, Error, ErrorCode, Event, EventId, MessageLevel, Ok
from ...protocol.dialect import DEFAULT, Dialect
from ...protocol.session import AgentSession, ProtocolViolation, Transaction
from ...protocol.first_bytes import QUOTE_LIMIT, QUOTE_WAIT, looks_like_frame_start
from ...protocol.wire import DEFAULT_MAX_FRAME_SIZE, Decoder, FrameError, encode_frame
from ...service.jobs import ServiceError
from ...service.service import JobService
from ...transport import write_now
from . import mapping
from .job_commands import JobCommands
from .render import NATIVE_RULES, RenderRules
from .snapshot import prepare_snapshot
from .view import STALL_SECONDS, ModelView

log = logging.getLogger("proxy_agent.frontends.ptp")

__all__ = ["PtpConfig", "PtpSession", "refuse_busy"]

#: Attribute definitions per ATTR_DEF event.
DEFS_PER_EVENT = 16
#: The writer drains the view only while less than this much is waiting to be written.
_WRITE_HIGH_WATER = 1 << 20
_READ_SIZE = 1 << 16
#: Commands the reader starts before it lets them run: of many that arrive at once, the first
#: reach their scheduler (the keeper starts the first local jobs) while the rest are read.
_COMMANDS_PER_STEP = 32
#: When a session ends (QUIT, or the agent stopping), what is queued for the client is
#: written for this long; then the frame being written is finished and only the closing
#: frames (SHUTDOWN, with what completes the open commands) follow, so that the stream
#: always ends with whole frames and a SHUTDOWN, however slowly the client reads...
CLOSE_SOFT = 2.0
#: ...within this long in all, unless the client takes nothing at all; the connection is
#: then closed wherever the writing stands.
CLOSE_BOUND = 5.0
#: How often a session that ends tries again to write to a client that has no room.
_CLOSING_RETRY = 0.05

_LEVELS = {"ERROR": MessageLevel.ERROR, "WARNING": MessageLevel.WARNING, "INFO": MessageLevel.INFO}


@attrs.frozen
class PtpConfig:
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: shared secret the client must send as INIT attribute token=... (None: not required)
    token: Optional[str] = None
    #: schedulers whose queues this client's submissions prefer, in order (the launch's
    #: ``--scheduler``): a submission that names no queue goes to the first one's default
    prefer: Tuple[str, ...] = ()
    #: the working directory of jobs that name none (the launching process's), else the service's
    working_dir: Optional[str] = None
    #: told to this client alone when its events start, as (level, text)
    notices: Tuple[Tuple[str, str], ...] = ()


class PtpSession(JobCommands):
    """Serves one client connection until QUIT, end of input, or cancellation."""

    def __init__(self, stream: trio.abc.Stream, service: JobService, config: PtpConfig = PtpConfig(),
                 peer: str = "client") -> None:
        self.stream = stream
        self.service = service
        self.config = config
        self.peer = peer
        self.session = AgentSession()
        self.decoder = Decoder(config.max_frame_size)
        self.view: Optional[ModelView] = None
        self.rules: RenderRules = NATIVE_RULES
        self.quit_requested = False
        #: set once the client has given the token (at once when none is required); the front
        #: door waits on it to count the connection as a session
        self.authenticated = trio.Event()
        if config.token is None:
            self.authenticated.set()
        self._out = bytearray()
        #: what goes out before ``_out``: bytes, and the initial model as an iterator of chunks
        #: rendered as the writer gets to them (the client reads the first while the agent
        #: renders the next)
        self._ahead: Deque[Union[bytes, Iterator[bytes]]] = deque()
        #: where the writer waits for something to write (see _poke)
        self._lot = trio.lowlevel.ParkingLot()
        self._snapshot_started = False
        self._closing = False
        #: when the session began to end (the bounds above count from it)
        self._closing_since: Optional[float] = None
        #: the frames that end the stream (SHUTDOWN...), written after everything else
        self._final = bytearray()
        #: the rest of an early write: its bytes and how much of them went (the writer goes on)
        self._resume: Optional[Tuple[bytes, int]] = None
        self._writer_done = trio.Event()
        self._nursery: Optional[trio.Nursery] = None
        self._remove_listener = None
        #: the client went away while the agent was writing to it
        self._gone = False
        #: when the write in progress began (None: none in progress)
        self._sending_since: Optional[float] = None
        #: set when a write begins (what the stall watch waits for)
        self._write_began = trio.Event()
        #: the client has not taken anything for STALL_SECONDS
        self._stalled = False
        #: the backends this session waits for: those of the service when it began
        self._ready = service.ready
        #: keys of the jobs this client submitted (what ``--on-disconnect terminate`` ends)
        self.submitted: List[int] = []
        #: submissions answered since the writer last took ``_out``: (jobSubId, job key or None);
        #: the writer tells the view of them once their OK is taken (see job_commands)
        self._answered: List[Tuple[str, Optional[int]]] = []

    # ------------------------------------------------------------------ output

    def emit(self, event: Event, transaction: Optional[Transaction] = None, final: bool = False,
             changes_first: bool = False) -> bool:
        """Check, encode (in the session's dialect) and queue one event; ``transaction`` is
        the command it answers; ``final``: one of the frames that end the stream.  Returns
        False if it may not be sent (its command was abandoned or already completed).

        ``changes_first``: changes of the model made while nothing waited to be written go
        out before it (a job command's reply follows what the command changed).  Otherwise
        the writer sends them after what is queued (the changes a client missed while its
        events were stopped come after the reply that starts them again)."""
        if changes_first and not final and not self._out and self._has_model_work():
            self._emit_model()
        try:
            data = self.session.write(event, transaction)
        except ProtocolViolation as exc:
            log.debug("not sent: %s", exc)
            return False
        if not data:
            log.debug("not sent: %s answers an abandoned command", event)
            return False
        if log.isEnabledFor(logging.DEBUG):
            log.debug("sending %s", event)
        if final:
            self._final += data
        else:
            self._out += data
        self._poke()
        return True

    def _poke(self) -> None:
        """Wake the writer (the view's changes wake it too, without coming through here)."""
        self._lot.unpark_all()

    def _has_model_work(self) -> bool:
        view = self.view
        return (
            not self._closing
            and not self.quit_requested
            and view is not None
            and self._snapshot_started
            and self.session.events_flowing
            and view.has_pending
        )

    def _emit_model(self) -> None:
        """Queue the pending changes.

        The writer does this, woken by the view as the model changes (and :meth:`emit`, for
        the changes a reply follows): whatever changes while bytes wait for the writer shares
        its events, so a burst of submissions costs a few events, not a few per submission.
        The states of the client's own jobs are kept one by one in the view, so only other
        jobs' states merge."""
        tid = self.session.events_tid
        assert self.view is not None and tid is not None
        check = self.session.check
        out = self._out
        for event_id, args in self.view.drain():
            check(event_id, tid)
            out += encode_frame(event_id, tid, args)

    def _tell_answered(self) -> None:
        """The view learns which submissions were answered (their OKs are queued, or were not
        sent): each one's job goes out, as the client's own, behind its OK in the same write."""
        answered, self._answered = self._answered, []
        if self.view is not None:
            for sub_id, job in answered:
                self.view.submitted(sub_id, job)

    def _take_ahead(self) -> bytes:
        item = self._ahead[0]
        if isinstance(item, bytes):
            self._ahead.popleft()
            return item
        data = next(item, None)
        if data is None:
            self._ahead.popleft()
            return b""
        return data

    async def _writer(self) -> None:
        while True:
            if not self._resume and not self._ahead and not self._out and not self._has_model_work() \
                    and not self._answered and not (self._closing and self._final):
                if self._closing:
                    break
                await self._lot.park()
                continue
            sent = 0
            delivered = None
            final = False
            if self._resume is not None:
                data, sent = self._resume
                self._resume = None
            elif self._ahead:
                data = self._take_ahead()
            elif self._out or self._has_model_work() or self._answered:
                if self._answered:
                    self._tell_answered()  # their OKs are in _out: their jobs go right behind them
                if self._has_model_work() and len(self._out) < _WRITE_HIGH_WATER:
                    self._emit_model()
                data = bytes(self._out)
                self._out.clear()
                delivered = self.view.take_delivered() if data and self.view is not None else None
            else:  # closing, nothing else left: the frames that end the stream
                data = bytes(self._final)
                self._final.clear()
                final = True
            if not data:
                await trio.lowlevel.checkpoint()
                continue
            # Recorded before the bytes go out and taken back if they do not: an agent
            # killed once the client has read them never sends them again.
            undo = self.service.delivered(delivered) if delivered else None
            self._sending_since = trio.current_time()
            self._write_began.set()
            try:
                try:
                    whole = await self._write(data, sent, first_at_once=bool(undo), cut=not final)
                except BaseException:
                    if undo:
                        self.service.undeliver(undo)
                    raise
                if not whole:  # cut at a frame's end: the session is ending and time is up
                    if undo:
                        self.service.undeliver(undo)
                    await self._finish_cut()
                    break
                self._sending_since = None
                if self._stalled:
                    self._stalled = False
                    log.info("%s reads again", self.peer)
                    if self.view is not None and self.session.events_flowing:
                        self.view.set_reading(True)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                # The client is gone: this session ends, nothing else does.
                log.info("%s went away while writing: %s", self.peer, exc)
                self._gone = True
                if self._nursery is not None:
                    self._nursery.cancel_scope.cancel()
                return
        self._writer_done.set()

    async def _write(self, data: bytes, sent: int = 0, first_at_once: bool = False, cut: bool = True) -> bool:
        """Write ``data`` (which begins with a frame) from ``sent`` on.  The first write
        happens before any other task runs when ``first_at_once`` (see ``delivered``).
        False if the session is ending and its time ran out (``cut``: it may be): what was
        written then ends at a frame's end (the rest is not written)."""
        stream = self.stream
        view = memoryview(data)
        if first_at_once:
            # ...written at once, before any other task runs: the time in which a killed
            # agent would lose them is that of one system call
            sent += write_now(stream, view[sent:])
        waits = hasattr(stream, "wait_send_all_might_not_block")
        target = len(data)
        while sent < target:
            if cut and self._closing_since is not None and target == len(data) and self._past(CLOSE_SOFT):
                target = _frame_end(data, sent)  # finish the frame being written, no more
                if sent >= target:
                    break
            written = write_now(stream, view[sent:target])
            if written:
                sent += written
                continue
            if not waits:
                await stream.send_all(view[sent:target])
                sent = target
                break
            if self._closing_since is None:
                await stream.wait_send_all_might_not_block()
            else:
                # A socket says it has room only once much of its buffer is free (a quarter of
                # it, for a Unix socket), while a write goes through as soon as there is any:
                # while the session ends, a write is tried every _CLOSING_RETRY, so that it goes
                # on at the pace the client reads (through a launch's relay, say).
                left = self._closing_since + CLOSE_BOUND - trio.current_time()
                with trio.move_on_after(max(0.0, min(_CLOSING_RETRY, left))) as waited:
                    await stream.wait_send_all_might_not_block()
                if self._past(CLOSE_BOUND):
                    log.warning("%s took nothing for %g s; closing the connection", self.peer, CLOSE_BOUND)
                    raise trio.ClosedResourceError("the client does not read")
                if waited.cancelled_caught:
                    continue  # no room said yet: a write is tried again
            written = write_now(stream, view[sent:target])
            if written:
                sent += written
            elif sent < target:
                await stream.send_all(view[sent:target])  # says why it cannot, or waits
                sent = target
        return target == len(data)

    def _past(self, bound: float) -> bool:
        return self._closing_since is not None and trio.current_time() - self._closing_since >= bound

    async def _finish_cut(self) -> None:
        """The session's time to end ran out: what is still queued is dropped (output not
        delivered stays undelivered), and the frames that end the stream are written."""
        dropped = len(self._out) + sum(len(item) for item in self._ahead if item.__class__ is bytes)
        self._out.clear()
        self._ahead.clear()
        self._resume = None
        if self.view is not None:
            self.view.take_delivered()  # dropped with the output they were for
        log.warning("%s reads too slowly to take what was queued (%d bytes dropped) before the session ends; "
                    "ending the stream with SHUTDOWN", self.peer, dropped)
        final = bytes(self._final)
        self._final.clear()
        if final:
            await self._write(final, cut=False)

    # ------------------------------------------------------------------ main loop

    async def run(self) -> bool:
        """Serve until the session ends.  Returns True if the client sent QUIT."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._watch_stall)
                await self._reader()
                # Let the writer finish writing what is queued (SHUTDOWN after QUIT), bounded:
                # the writer cuts at a frame's end when time runs short.
                self._begin_closing()
                with trio.move_on_after(CLOSE_BOUND + 0.5):
                    await self._writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._detach()
        return self.quit_requested

    async def _watch_stall(self) -> None:
        """A client whose connection takes nothing for STALL_SECONDS no longer holds jobs back:
        each write that begins is given until then to end."""
        while True:
            await self._write_began.wait()
            self._write_began = trio.Event()
            since = self._sending_since
            if since is None:
                continue
            await trio.sleep_until(since + STALL_SECONDS)
            if self._sending_since == since and not self._stalled and self.view is not None:
                self._stalled = True
                log.warning("%s has not read anything for %g s; its output is now bounded and dropped lines counted",
                            self.peer, STALL_SECONDS)
                self.view.set_reading(False, f"the client did not read for {STALL_SECONDS:g} s")

    def farewell(self, text: str) -> None:
        """The agent is stopping: tell the client (MESSAGE, then SHUTDOWN under an open TID)
        and end the session once that is written (see :meth:`written`)."""
        if self._closing or self.quit_requested:
            return
        session = self.session
        tid = session.events_tid if session.events_tid is not None else session.stop_tid
        if tid is None and session.open:
            tid = next(iter(session.open))
        if tid is not None:
            from ...protocol.messages import Message, Shutdown  # loaded when first needed

            self.emit(Message(tid, MessageLevel.WARNING, ErrorCode.SHUTTING_DOWN, text), final=True)
            self.emit(Shutdown(tid), final=True)
        self.quit_requested = True
        self._begin_closing()

    def _begin_closing(self) -> None:
        """The session ends: the writer writes what is queued, within the bounds above."""
        self._closing = True
        if self._closing_since is None:
            self._closing_since = trio.current_time()
        self._poke()

    async def written(self) -> None:
        """Until what is queued has been written (after :meth:`farewell` or QUIT)."""
        await self._writer_done.wait()

    def _detach(self) -> None:
        if self.view is not None:
            self.view.unsubscribe()
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None

    async def _reader(self) -> None:
        stream = self.stream
        decoder = self.decoder
        session = self.session
        debug = log.isEnabledFor(logging.DEBUG)
        # The input's first bytes, kept until a frame arrives, to quote them if they are not one.
        head = bytearray()
        started = 0
        while True:
            try:
                data = await stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.info("%s went away: %s", self.peer, exc)
                return
            if not data:
                decoder.feed_eof()
                for item in decoder:
                    if session.frames_received == 0 and not looks_like_frame_start(head):
                        self._not_the_protocol(head)
                    else:
                        log.warning("input ended: %s", item)
                log.info("%s closed the connection", self.peer)
                return
            if session.frames_received == 0 and len(head) < QUOTE_LIMIT:
                head += data[: QUOTE_LIMIT - len(head)]
            decoder.feed(data)
            for item in decoder:
                if debug:
                    log.debug("received %s", _redacted(item))
                if (isinstance(item, FrameError) and item.fatal and session.frames_received == 0
                        and not looks_like_frame_start(head)):
                    await self._read_first_line(head)
                    self._not_the_protocol(head)
                    return
                received = session.receive(item)
                if received.log:
                    log.warning("%s", received.log)
                # QUIT's replies end the stream: written after whatever else is queued
                quitting = received.command is not None and received.command.command_id is CommandId.QUIT
                for reply, owner in received.answers():
                    self.emit(reply, owner, final=quitting)
                if received.close:
                    return
                if received.command is not None:
                    await self._dispatch(received.command, received)
                    if self.quit_requested or self._closing:
                        return
                    started += 1
                    if started % _COMMANDS_PER_STEP == 0:
                        await trio.lowlevel.checkpoint()

    async def _read_first_line(self, head: bytearray) -> None:
        """Read on, briefly, until ``head`` holds a whole line (to quote it whole)."""
        with trio.move_on_after(QUOTE_WAIT):
            while b"\n" not in head and len(head) < QUOTE_LIMIT:
                try:
                    data = await self.stream.receive_some(QUOTE_LIMIT)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                head += data[: QUOTE_LIMIT - len(head)]

    def _not_the_protocol(self, head: bytes) -> None:
        received = self.session.not_the_protocol(bytes(head))
        log.warning("%s: %s", self.peer, received.log)
        for reply, owner in received.answers():
            self.emit(reply, owner)

    # ------------------------------------------------------------------ commands

    async def _dispatch(self, command: Command, received) -> None:
        cid = command.command_id
        transaction = received.transaction
        if cid is CommandId.QUIT:
            self.quit_requested = True
            log.info("QUIT received")
            return
        if cid is CommandId.INIT:
            self._init(command, received.init, transaction)
        elif cid is CommandId.MODEL_DEF:
            await self._model_def(command, transaction)
        elif cid is CommandId.START_EVENTS:
            await self._start_events(command, transaction)
        elif cid is CommandId.STOP_EVENTS:
            log.debug("events stopped (TID %d)", command.tid)
            if self.view is not None:
                self.view.set_reading(False, "events were stopped")
        elif cid is CommandId.LIST_FILTERS:
            self.emit(Ok(command.tid), transaction)
        elif cid is CommandId.SET_FILTERS:
            self.emit(Error(command.tid, ErrorCode.NOT_SUPPORTED, "this agent supports no event filters"), transaction)
        else:
            assert self._nursery is not None  # commands are read inside the session's nursery
            self._nursery.start_soon(self._job_command, command, transaction)

    def _init(self, command: Command, init, transaction: Optional[Transaction]) -> None:
        expected = self.config.token
        if expected is not None:
            given = init.get("token") or ""
            if not hmac.compare_digest(given.encode(), expected.encode()):
                reason = "missing" if not given else "wrong"
                log.warning("%s sent a %s token; closing the connection", self.peer, reason)
                self.emit(Error(command.tid, ErrorCode.AUTHENTICATION, f"authentication failed: {reason} token"),
                          transaction)
                self._closing = True
                return
        self.authenticated.set()
        self.rules = render_rules(self.session.dialect, self.service.attributes())
        global _latest_rules
        _latest_rules = self.rules
        self.view = ModelView(self.service.model, init.base_id, self.rules, self._lot.unpark_all)
        if self._nursery is not None and not self._snapshot_started:
            self._nursery.start_soon(self._prepare_snapshot)
        log.info("session initialised: base id %d, %s dialect", init.base_id, self.session.dialect.name)
        self.emit(Ok(command.tid), transaction)

    async def _prepare_snapshot(self) -> None:
        """Between INIT and START_EVENTS: the initial model is planned while the model is
        quiet, so that START_EVENTS has only to render it for this client."""
        await self._ready.wait()
        if self.service.failure is None:
            await prepare_snapshot(self.service.model, lambda: self.rules,
                                   lambda: not self._snapshot_started and not self._closing,
                                   base=lambda: self.view.plan_base() if self.view is not None else None)

    async def _service_ready(self, command: Command, transaction: Optional[Transaction] = None,
                             check: bool = True) -> bool:
        """Wait for the service's backends to start; False (and the client told why) if none
        did.  ``check=False``: only wait (the service's answer will say it)."""
        if self._ready.is_set():
            # a session that is ending takes no new request; no pass through the scheduler
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            await self._ready.wait()
        if not check:
            return True
        failure = self.service.failure
        if failure is not None:
            self.emit(Error(command.tid, ErrorCode.SCHEDULER, failure), transaction)
            return False
        return True

    def _default_queue_id(self) -> Optional[str]:
        try:
            _, queue = self.service.default_queue(self.config.prefer)
        except ServiceError:
            return None
        assert self.view is not None
        return str(self.view.element_id(queue))

    async def _model_def(self, command: Command, transaction: Optional[Transaction]) -> None:
        if not await self._service_ready(command, transaction):
            return
        defs = mapping.attribute_definitions(self.service.attributes(), self._default_queue_id())
        defs = self.session.dialect.attribute_definitions(defs)
        for start in range(0, len(defs), DEFS_PER_EVENT):
            self.emit(AttrDef(command.tid, defs[start:start + DEFS_PER_EVENT]), transaction)
        self.emit(Ok(command.tid), transaction)

    async def _start_events(self, command: Command, transaction: Optional[Transaction]) -> None:
        if not await self._service_ready(command, transaction):
            return
        if not self._snapshot_started and self.view is not None and self.session.events_flowing:
            # The whole model, at this instant, ahead of anything said later: a client can use
            # the reply to any later command as a fence ("the initial model is in").
            tid = command.tid
            self.session.check(EventId.NEW_MACHINE, tid)
            if self._out:
                self._ahead.append(bytes(self._out))
                self._out.clear()
            # the writer idle (not amid a write): the first chunk is written at once
            early = self._write_early if self._sending_since is None else None
            self._ahead.append(self.view.subscribe_chunks(tid, early))
            self._snapshot_started = True
            self._remove_listener = self.service.add_listener(self._notice)
            for level, text in (*self.service.standing, *self.config.notices):
                self._notice(level, text)
            log.debug("initial model queued: %d elements", len(self.service.model))
        elif self.view is not None and not self._stalled:
            self.view.set_reading(True)
        self._poke()

    def _write_early(self, chunk: bytes) -> bool:
        """One of the initial model's first chunks, behind what was queued before it, written
        now without waiting (what the connection does not take stays queued, in order): the
        client decodes it while the agent groups the rest of the model.  True if it was all
        written."""
        queued: List[bytes] = []
        for item in self._ahead:
            assert isinstance(item, bytes)  # only bytes come before the initial model
            queued.append(item)
        self._ahead.clear()
        data = b"".join([*queued, chunk])
        sent = write_now(self.stream, data)
        if sent < len(data):
            self._resume = (data, sent)  # the writer goes on from there (the frames stay whole)
        self._poke()
        return sent == len(data)

    def _notice(self, level: str, text: str) -> None:
        self.notify(_LEVELS.get(level, MessageLevel.INFO), ErrorCode.SCHEDULER, text)

    def notify(self, level: MessageLevel, code: int, text: str) -> None:
        """Tell the client something outside any command (under the START_EVENTS TID, if open)."""
        tid = self.session.events_tid
        if tid is not None:
            from ...protocol.messages import Message

            self.emit(Message(tid, level, code, text))
        else:
            log.warning("%s", text)


_RULES: dict = {}


def render_rules(dialect: Dialect, infos) -> RenderRules:
    """How a client of ``dialect`` is sent values, given what the backends describe (the
    INTEGER attributes among them); one object per combination, so that clients alike share
    the rendering of the initial model."""
    definitions = mapping.attribute_definitions(infos, None)
    types = {d.id: d.type for d in definitions}
    integers = frozenset(i for i, t in types.items() if dialect.value_rule(i, t).name == "INTEGER")
    omit = frozenset(i for i, t in types.items() if dialect.value_rule(i, t).name == "OMIT")
    key = (dialect.name, integers, omit)
    rules = _RULES.get(key)
    if rules is None:
        rules = _RULES[key] = RenderRules(
            text=dialect.escape if dialect.ascii_only else None,
            arrays=dialect.array_values_in_events,
            integer_ids=integers,
            integer=dialect.integer_text if dialect.integer_bounds is not None else None,
            omit=omit,
            max_id=dialect.max_element_id,
        )
    return rules


def _redacted(item) -> object:
    """A received frame for the log, with the value of a ``token=`` argument masked."""
    args = getattr(item, "args", None)
    if not args or not any(isinstance(a, str) and a.startswith("token=") for a in args):
        return item
    masked = tuple("token=********" if isinstance(a, str) and a.startswith("token=") else a for a in args)
    try:
        return attrs.evolve(item, args=masked)
    except (TypeError, ValueError):
        return f"{type(item).__name__} (arguments not shown: they hold a token)"


#: the rules of the client that sent INIT last (whose kind of client is likely to come again)
_latest_rules: Optional[RenderRules] = None

#: An agent that clients connect to plans its initial model once the model has been quiet
#: this long (seconds), and after planning waits PLAN_AHEAD_SPACING times as long as that took.
PLAN_AHEAD_QUIET = 1.0
PLAN_AHEAD_SPACING = 20.0


async def keep_snapshot_planned(service: JobService) -> None:
    """For an agent that clients connect to (``--listen``, ``--unix``): keep the initial
    model planned for the rules of the latest client (the default dialect's before the
    first), so that a client connecting later has only its ids filled in.  A model that keeps
    changing is planned at most about once per PLAN_AHEAD_SPACING times the planning's cost."""
    await service.ready.wait()
    if service.failure is not None:
        return
    global _latest_rules
    if _latest_rules is None:
        _latest_rules = render_rules(DEFAULT, service.attributes())

    def latest_rules() -> RenderRules:
        assert _latest_rules is not None  # set above; later only replaced by a newer client's
        return _latest_rules

    await prepare_snapshot(service.model, latest_rules, lambda: True,
                           quiet=PLAN_AHEAD_QUIET, spacing=PLAN_AHEAD_SPACING)


async def refuse_busy(stream: trio.abc.Stream, peer: str, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
    """Answer a connection the agent cannot serve now: ERROR (busy) under the TID of its
    first command, then close it."""
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
                    busy = Error(tid, ErrorCode.BUSY, "the agent is busy serving other sessions; try again later")
                    await stream.send_all(busy.encode())
                break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    log.info("refused %s: busy", peer)
    with trio.move_on_after(1):
        await stream.aclose()


def _frame_end(data: bytes, upto: int) -> int:
    """Where the frame that byte ``upto`` of ``data`` belongs to ends (``data`` begins with
    a frame; a frame's first 8 bytes are its length in hex, not counting them); ``upto``
    itself when it is a frame's start."""
    position = 0
    while position < len(data):
        if upto <= position:
            return position
        try:
            end = position + 8 + int(data[position:position + 8], 16)
        except ValueError:
            return len(data)  # not frames after all: no cut but the end
        if end >= upto:
            return min(end, len(data))
        position = end
    return len(data)

