"""A trio client for the proxy protocol: transports, commands, waits, and the mirrored model.

Typical use::

    async with await AgentClient.spawn([sys.executable, "-m", "proxy_agent"]) as client:
        await client.init()
        await client.model_def()
        await client.start_events()
        job = await client.submit("/bin/echo", ["hello"])
        await client.wait_job_state(job, "COMPLETED", timeout=10)
        print(client.job_output(job))
        await client.quit()

One reader task (in a nursery owned by the ``async with`` block) decodes
everything the agent sends, feeds it to the sans-I/O :class:`ClientState`
(protocol checks, mirrored model) and then re-evaluates every pending wait,
so a predicate sees each event's effect before the next event is applied.

The client's parts beside it: the commands (:mod:`.commands`), the mirrored model
(:mod:`.mirror`), a spawned agent's process (:mod:`.process`), kept output (:mod:`.kept`) and
connect-back (:mod:`.listener`).
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import attrs
import trio

from ..protocol.messages import CommandId, ErrorCode, OutputEvent
from ..protocol.dialect import DEFAULT, NATIVE
from ..protocol.first_bytes import QUOTE_LIMIT, QUOTE_WAIT, first_line, shown_bytes
from ..protocol.wire import DEFAULT_MAX_FRAME_SIZE
from ..transport import os_error_reason as _os_reason
from .errors import (
    AgentExited, ClientError, ConnectError, ConnectionClosed, ProtocolViolationError, UnknownElementError, WaitFailed, WaitTimeout,
)
from .state import REFERENCE_TID_POOL, ClientState, Element, Traffic
from .commands import Commands
from .kept import KeptOutput, KeptStream
from .mirror import MirroredModel, states_text
from .process import EXIT_GRACE, READ_SIZE, AgentProcess

__all__ = ["AgentClient", "NO_KEPT_OUTPUT", "connect_tcp", "connect_unix", "from_stream", "spawn"]

#: Error codes of a GET_OUTPUT that mean the agent keeps no output of the job (an agent that
#: does not know the command, one without a state directory, a job it did not submit).
NO_KEPT_OUTPUT = (ErrorCode.UNKNOWN_COMMAND, ErrorCode.NOT_SUPPORTED, ErrorCode.NO_SUCH_JOB)


# --------------------------------------------------------------------------- helpers


class Waiter:
    __slots__ = ("predicate", "event", "result", "error")

    def __init__(self, predicate: Callable[[], Any]) -> None:
        self.predicate = predicate
        self.event = trio.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


# --------------------------------------------------------------------------- the client


class AgentClient(Commands, MirroredModel):
    """One session with an agent over a :class:`trio.abc.Stream`.

    Use it as an async context manager (the block owns the reader task)::

        async with await AgentClient.spawn(argv) as client: ...
        async with await AgentClient.connect_unix(path) as client: ...

    ``strict`` (default): the first protocol violation by the agent is raised
    as :class:`ProtocolViolationError` in every current and later wait or
    command, and on leaving the block if nobody saw it.  Either way every
    violation is listed in :attr:`violations`.

    ``dialect``: what :meth:`init` asks for; ``"native"`` unless ``reference``.
    ``"default"`` sends no ``dialect`` attribute (as the PTP 4.0 client does).

    ``reference``: behave as the Eclipse PTP 4.0 client does, and fail
    loudly where that client would break: the default dialect, strict, and
    the reference checks of :class:`ClientState` (strict US-ASCII, the seven
    attribute types, no array values in element events, process ranks below
    the job's process count, Java int bounds, every command answered by a
    completing event, no TID refused, a launch's job told STARTING then
    RUNNING).  Like that client it sends INIT, MODEL_DEF and the first
    START_EVENTS on TID 0, takes other TIDs from a ring of ``tid_pool`` whether
    or not they are still open, takes every answer for the oldest command on
    its TID, and counts a launch done only on a JOB_CHANGE saying RUNNING
    (:meth:`launch`; :meth:`wait_job_state` for RUNNING of a job it submitted).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        process: Optional[AgentProcess] = None,
        strict: bool = True,
        peer: str = "agent",
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        reference: bool = False,
        dialect: Optional[str] = None,
        tid_pool: int = REFERENCE_TID_POOL,
    ) -> None:
        if reference and dialect not in (None, DEFAULT.name):
            raise ValueError(f"a reference-mode client speaks the default dialect only, not {dialect!r}")
        self.stream = stream
        self.process = process
        self.reference = reference
        self.strict = strict or reference
        self.peer = peer
        #: the dialect init() asks for by default
        self.dialect = dialect or (DEFAULT.name if reference else NATIVE.name)
        self.state = ClientState(max_frame_size, reference=reference, tid_pool=tid_pool)
        #: attribute definitions returned by the last model_def()
        self.attribute_definitions: List[Any] = []
        self._send_lock = trio.Lock()
        self._waiters: set = set()
        self._listeners: List[Callable[[Traffic], None]] = []
        self._failure: Optional[ClientError] = None
        self._failure_seen = False
        self._ended: Optional[ClientError] = None
        self._ended_event = trio.Event()
        self._nursery_cm: Any = None
        self._nursery: Optional[trio.Nursery] = None
        self._closing = False
        self._closed = False
        self._sub_counter = 0

    # ------------------------------------------------------------------ opening

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        *,
        strict: bool = True,
        capture_stderr: bool = True,
        exit_grace: float = EXIT_GRACE,
        reference: bool = False,
        dialect: Optional[str] = None,
        tid_pool: int = REFERENCE_TID_POOL,
    ) -> "AgentClient":
        """Start the agent as a child and talk to it over its stdin/stdout.

        On close its stdin is closed; if it has not exited ``exit_grace``
        seconds later it is terminated (and killed 2 s after that).
        """
        process = await AgentProcess.start(argv, env, cwd, capture_stderr=capture_stderr, exit_grace=exit_grace)
        stream = trio.StapledStream(process.process.stdin, process.process.stdout)
        return cls(
            stream, process=process, strict=strict, peer=f"agent (pid {process.pid})", reference=reference,
            dialect=dialect, tid_pool=tid_pool,
        )

    @classmethod
    async def connect_tcp(
        cls, host: str, port: int, *, strict: bool = True, reference: bool = False, dialect: Optional[str] = None
    ) -> "AgentClient":
        """Connect to an agent started with ``--listen``."""
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {host}:{port}: {_os_reason(exc)}") from None
        return cls(stream, strict=strict, peer=f"{host}:{port}", reference=reference, dialect=dialect)

    @classmethod
    async def connect_unix(
        cls, path: str, *, strict: bool = True, reference: bool = False, dialect: Optional[str] = None
    ) -> "AgentClient":
        """Connect to an agent started with ``--unix PATH``."""
        try:
            stream = await trio.open_unix_socket(path)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {path}: {_os_reason(exc)}") from None
        return cls(stream, strict=strict, peer=path, reference=reference, dialect=dialect)

    @classmethod
    def from_stream(
        cls,
        stream: trio.abc.Stream,
        *,
        strict: bool = True,
        peer: str = "agent",
        reference: bool = False,
        dialect: Optional[str] = None,
    ) -> "AgentClient":
        return cls(stream, strict=strict, peer=peer, reference=reference, dialect=dialect)

    async def __aenter__(self) -> "AgentClient":
        if self._nursery is not None:
            raise RuntimeError("an AgentClient can be entered only once")
        if self._closed:
            raise RuntimeError("this AgentClient is closed")
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._reader)
        if self.process is not None and self.process.capture_stderr:
            self._nursery.start_soon(self.process.pump_stderr)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        try:
            await self.aclose()
        finally:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
                # The reader never raises, so the nursery has nothing to add
                # to an exception leaving the block; keep that one as it is.
                await self._nursery_cm.__aexit__(None, None, None)
        if exc_type is None and self.strict and self._failure is not None and not self._failure_seen:
            if isinstance(self._failure, ProtocolViolationError):
                self._failure_seen = True
                raise self._failure
        return False

    async def aclose(self) -> None:
        """Close the connection and reap a spawned agent.  Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._closing = True
        with trio.CancelScope(shield=True):
            try:
                with trio.move_on_after(2):
                    await self.stream.aclose()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            if self.process is not None:
                await self.process.reap()
        if self._ended is None:
            self._end(ConnectionClosed("the client closed the connection"))

    # ------------------------------------------------------------------ reading

    async def _reader(self) -> None:
        state = self.state
        # The stream's first bytes, kept while no frame has arrived, to quote them
        # if they turn out not to be the protocol.
        head = bytearray()
        try:
            while True:
                try:
                    data = await self.stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    await self._connection_ended(f"the connection to the agent broke: {exc}")
                    return
                if not data:
                    for traffic in state.receive_eof():
                        if traffic.fatal and state.frames_received == 0:
                            traffic = self._quoting(traffic, head)
                        self._dispatch(traffic)
                    await self._connection_ended(None)
                    return
                if state.frames_received == 0 and len(head) < QUOTE_LIMIT:
                    head += data[: QUOTE_LIMIT - len(head)]
                ended = False
                for traffic in state.receive_data(data):
                    if traffic.fatal and state.frames_received == 0:
                        ended = await self._read_first_line(head)
                        traffic = self._quoting(traffic, head)
                    self._dispatch(traffic)
                if ended:
                    await self._connection_ended(None)
                    return
        except Exception as exc:  # noqa: BLE001 - report a client bug to whoever waits, loudly
            error = ClientError(f"internal error in the client while reading: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._fail(error)
            self._end(error)

    async def _read_first_line(self, head: bytearray) -> bool:
        """Read on, briefly, until ``head`` holds a whole line; True if the stream ended meanwhile.

        The decoder stops at the first bytes that cannot start a frame (often
        just 8 of them); reading a little further lets the error quote the
        first line of, say, a login banner instead of a fragment of it.
        """
        with trio.move_on_after(QUOTE_WAIT):
            while b"\n" not in head and len(head) < QUOTE_LIMIT:
                try:
                    data = await self.stream.receive_some(QUOTE_LIMIT)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return True
                if not data:
                    return True
                head += data[: QUOTE_LIMIT - len(head)]
        return False

    def _quoting(self, traffic: Traffic, head: bytes) -> Traffic:
        """``traffic`` (a fatal framing error before any frame) with its violation quoting the first line of ``head``."""
        line = first_line(head)
        if len(line) <= len(traffic.raw) or not line.startswith(traffic.raw):
            return traffic
        message = (
            f"malformed frame from the agent: its output began with text that is not the protocol: "
            f"'{shown_bytes(line)}'"
        )
        quoted = {
            id(v): attrs.evolve(v, raw=line, message=message)
            for v in traffic.violations
            if v.rule == "framing" and v.raw == traffic.raw
        }
        recorded = self.state.violations
        recorded[:] = [quoted.get(id(v), v) for v in recorded]
        violations = tuple(quoted.get(id(v), v) for v in traffic.violations)
        return attrs.evolve(traffic, raw=line, violations=violations)

    def _dispatch(self, traffic: Traffic) -> None:
        for listener in list(self._listeners):
            listener(traffic)
        if traffic.violations and (self.strict or traffic.fatal):
            self._fail(ProtocolViolationError(traffic.violations[0]))
        self._check_waiters()
        if self.state.shutdown and self._ended is None:
            self._end(ConnectionClosed("the agent has shut down"))

    async def _connection_ended(self, reason: Optional[str]) -> None:
        if self._closing:
            self._end(ConnectionClosed("the client closed the connection"))
            return
        if self.state.shutdown:
            self._end(ConnectionClosed("the agent has shut down"))
            return
        if self.reference:
            # The agent ended the session: whatever it left unanswered, the
            # PTP 4.0 client would have waited for in vain.
            unanswered = self.state.unanswered()
            if unanswered:
                self._fail(ProtocolViolationError(unanswered[0]))
        process = self.process
        if process is not None:
            with trio.move_on_after(2.0):
                await process.wait()
            with trio.move_on_after(1.0):
                await process.wait_stderr()
            tail = process.stderr_tail()
            shown = f"; its last output:\n{tail}" if tail else ""
            if process.returncode is not None:
                self._end(AgentExited(f"the agent {process.exit_description()}{shown}", process.returncode, tail))
            else:
                self._end(AgentExited(f"the agent closed its output but is still running{shown}", None, tail))
            return
        self._end(ConnectionClosed(reason or f"{self.peer} closed the connection"))

    def _fail(self, error: ClientError) -> None:
        if self._failure is not None:
            return
        self._failure = error
        self._failure_seen = False
        self._wake_all(error)

    def _end(self, error: ClientError) -> None:
        if self._ended is not None:
            return
        self._ended = error
        self._ended_event.set()
        self._check_waiters()
        self._wake_all(error)

    def _wake_all(self, error: ClientError) -> None:
        for waiter in list(self._waiters):
            if not waiter.event.is_set():
                waiter.error = self._failure or error
                waiter.event.set()
        self._waiters.clear()

    def _check_waiters(self) -> None:
        for waiter in list(self._waiters):
            if waiter.event.is_set():
                continue
            try:
                result = waiter.predicate()
            except Exception as exc:  # noqa: BLE001 - handed to the waiting task
                waiter.error = exc
                waiter.event.set()
                self._waiters.discard(waiter)
                continue
            if result:
                waiter.result = result
                waiter.event.set()
                self._waiters.discard(waiter)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            self._failure_seen = True
            raise self._failure

    # ------------------------------------------------------------------ listening in

    def add_listener(self, callback: Callable[[Traffic], None]) -> Callable[[], None]:
        """Call ``callback(traffic)`` for every frame in either direction; returns a remover.

        Incoming frames are reported after the mirrored model was updated and
        before waits are re-evaluated.  The callback runs in the reader task:
        it must not block.
        """
        self._listeners.append(callback)

        def remove() -> None:
            try:
                self._listeners.remove(callback)
            except ValueError:
                pass

        return remove

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[trio.MemoryReceiveChannel]:
        """An async iterator of :class:`Traffic` records (both directions), while the block lasts."""
        send, receive = trio.open_memory_channel(math.inf)
        remove = self.add_listener(send.send_nowait)
        try:
            yield receive
        finally:
            remove()  # first, so the reader never feeds a closed channel
            send.close()
            receive.close()

    # ------------------------------------------------------------------ waiting

    async def wait_for(
        self, predicate: Callable[[], Any], timeout: Optional[float] = None, *,
        description: Union[str, Callable[[], str], None] = None,
    ) -> Any:
        """Wait until ``predicate()`` is true; returns its value.

        The predicate is evaluated now and then after every event the agent
        sends.  If it raises, the exception is passed on.  Raises
        :class:`WaitTimeout` after ``timeout`` seconds, the protocol violation
        (strict mode) or the reason the session ended.  ``description`` says
        what was awaited in the timeout's message; a callable is asked when the
        message is made (so that it tells the state at that time).
        """
        self._raise_failure()
        result = predicate()
        if result:
            return result
        if self._ended is not None:
            raise self._ended
        waiter = Waiter(predicate)
        self._waiters.add(waiter)
        try:
            if timeout is None:
                await waiter.event.wait()
            else:
                with trio.move_on_after(timeout):
                    await waiter.event.wait()
        finally:
            self._waiters.discard(waiter)
        if not waiter.event.is_set():
            what = (description() if callable(description) else description) or getattr(
                predicate, "__name__", "a condition")
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
        if waiter.error is not None:
            if waiter.error is self._failure:
                self._failure_seen = True
            raise waiter.error
        return waiter.result

    async def wait_job_state(self, job: Union[str, Element], state: str, timeout: Optional[float] = None) -> Element:
        """Wait until the job has been in ``state`` (``RUNNING``, ``COMPLETED``...); returns the job.

        States are remembered, so a state already passed counts.  Raises
        :class:`WaitFailed` if the job completes or is removed without it.
        """
        element = self.job(job)
        shown = self.state.job_key(element.id) or element.id  # as the agent's log and job list name it
        # In reference mode a job of its own has run, for the client, once a JOB_CHANGE said so.
        seen = element.changed_states if (self.reference and state == "RUNNING"
                                          and element.sub_id in self.state.submitted) else element.states

        def reached() -> Optional[Element]:
            if state in seen:
                return element
            if element.removed:
                raise WaitFailed(f"job {shown} was removed before reaching {state} (went {states_text(element)})")
            if element.state == "COMPLETED":
                raise WaitFailed(f"job {shown} completed without reaching {state} (went {states_text(element)})")
            return None

        return await self.wait_for(reached, timeout,
                                   description=lambda: f"job {shown} to reach {state} (now {element.state})")

    # ------------------------------------------------------------------ commands

    # ------------------------------------------------------------------ job ids and kept output

    def job_key(self, job: Union[str, Element]) -> int:
        """A job's id outside the protocol, the one ``proxy-agent jobs``, the agent's log and
        the console show: its element id less the base id (see ``spec/protocol.md``)."""
        element_id = job.id if isinstance(job, Element) else self._job_id(job)
        key = self.state.job_key(element_id)
        if key is None:
            raise UnknownElementError(f"{element_id!r} is not a job id of this session")
        return key

    def job_by_key(self, key: int) -> Optional[Element]:
        """The job whose id (see :meth:`job_key`) is ``key``, if the mirror has it."""
        return self.state.job_by_key(int(key))

    async def kept_output(self, job: Union[str, Element, int], *, stream: Optional[str] = None,
                          rank: Optional[int] = None, skip: Optional[Mapping[Tuple[int, str], int]] = None,
                          timeout: Optional[float] = 60) -> "KeptOutput":
        """Everything the job's processes have written so far, as the agent keeps it (GET_OUTPUT),
        whether or not this session saw it: any job the agent's store keeps, in the mirror or
        not.  ``job`` is an element, an element id or jobSubId, or an ``int``: the job's id
        (:meth:`job_key`).  ``skip`` leaves out lines the caller has ({(rank, stream): lines})."""
        if isinstance(job, int):
            element_id = self.state.job_element_id(job)
            if element_id is None:
                raise UnknownElementError(f"no job {job}: the session has no base id yet")
        else:
            element_id = job.id if isinstance(job, Element) else self._job_id(job)
        args = [f"jobId={element_id}"]
        if stream is not None:
            args.append(f"stream={stream}")
        if rank is not None:
            args.append(f"rank={int(rank)}")
        args.extend(f"skip={r}.{s}:{n}" for (r, s), n in sorted((skip or {}).items()) if n)
        command = await self.send_command(CommandId.GET_OUTPUT, args)
        await self.reply(command, timeout)
        parts: Dict[Tuple[int, str], KeptStream] = {}
        for event in command.events:
            if not isinstance(event, OutputEvent):
                continue
            where = (event.rank, event.stream)
            found = parts.get(where)
            if found is None:
                parts[where] = KeptStream(event.rank, event.stream, event.first, event.texts, event.dropped)
            else:
                found.lines.extend(event.texts)
                found.dropped = event.dropped
        ordered = sorted(parts.values(), key=lambda part: (part.rank, part.stream != "stdout"))
        return KeptOutput(self.state.job_key(element_id), ordered)


spawn = AgentClient.spawn
connect_tcp = AgentClient.connect_tcp
connect_unix = AgentClient.connect_unix
from_stream = AgentClient.from_stream


