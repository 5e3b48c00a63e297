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
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import attrs
import trio

from ..protocol.messages import (
    AttrDef,
    CommandId,
    Error,
    ErrorCode,
    Event,
    Ok,
    Shutdown,
    SubmitJobError,
    TerminateJobError,
)
from ..protocol.dialect import DEFAULT, NATIVE
from ..protocol.first_bytes import QUOTE_LIMIT, QUOTE_WAIT, first_line, shown_bytes
from ..protocol.wire import DEFAULT_MAX_FRAME_SIZE
from .errors import (
    AgentExited,
    ClientError,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
    UnknownElementError,
    WaitFailed,
    WaitTimeout,
)
from .state import PROTOCOL_VERSION, REFERENCE_TID_POOL, ClientState, Element, OpenCommand, Traffic, canonical_id

__all__ = [
    "AgentClient",
    "AgentListener",
    "AgentProcess",
    "connect_tcp",
    "connect_unix",
    "from_stream",
    "listen_for_agent",
    "spawn",
    "job_attributes",
]

_READ_SIZE = 1 << 16
#: Bytes of the agent's stderr kept for error messages.
STDERR_TAIL_BYTES = 64 * 1024
#: How long a spawned agent gets to exit by itself once its input is closed.
EXIT_GRACE = 3.0
#: How long start_events() waits for a first event before confirming by a round trip.
_START_QUIET = 0.5


# --------------------------------------------------------------------------- processes


class AgentProcess:
    """A spawned agent: the trio process plus a bounded tail of its stderr."""

    def __init__(self, process: trio.Process, argv: Sequence[str], capture_stderr: bool, exit_grace: float = EXIT_GRACE) -> None:
        self.process = process
        #: how long the agent gets to exit by itself once its input is closed
        self.exit_grace = exit_grace
        self.argv = list(argv)
        self.capture_stderr = capture_stderr
        self._tail = bytearray()
        self._stderr_eof = trio.Event()
        if not capture_stderr:
            self._stderr_eof.set()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        *,
        capture_stderr: bool = True,
        stdio: bool = True,
        exit_grace: float = EXIT_GRACE,
    ) -> "AgentProcess":
        """Start the agent; with ``stdio`` its stdin/stdout are pipes for the protocol."""
        if not argv:
            raise ConnectError("cannot start the agent: empty command line")
        pipe = subprocess.PIPE if stdio else subprocess.DEVNULL
        try:
            process = await trio.lowlevel.open_process(
                list(argv),
                stdin=pipe,
                stdout=pipe,
                stderr=subprocess.PIPE if capture_stderr else None,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                # Its own session: a Ctrl-C meant for the client's terminal must not reach the
                # agent; the client decides when it ends (closing its input, then signals).
                start_new_session=True,
            )
        except OSError as exc:
            raise ConnectError(f"cannot start the agent {argv[0]!r}: {exc.strerror or exc}") from None
        return cls(process, argv, capture_stderr, exit_grace)

    @property
    def returncode(self) -> Optional[int]:
        return self.process.returncode

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self, lines: int = 15) -> str:
        """The last lines the agent wrote to stderr (captured mode only)."""
        text = self._tail.decode("utf-8", "replace")
        return "\n".join(text.rstrip("\n").splitlines()[-lines:])

    async def pump_stderr(self) -> None:
        """Read stderr until EOF, keeping only the last :data:`STDERR_TAIL_BYTES`."""
        stream = self.process.stderr
        if stream is None or self._stderr_eof.is_set():
            return
        try:
            while True:
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    break
                self._tail += data
                if len(self._tail) > STDERR_TAIL_BYTES:
                    del self._tail[: len(self._tail) - STDERR_TAIL_BYTES]
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._stderr_eof.set()

    async def wait_stderr(self) -> None:
        await self._stderr_eof.wait()

    async def wait(self) -> int:
        return await self.process.wait()

    def exit_description(self) -> str:
        """``exited with status 2`` / ``was killed by SIGTERM``."""
        code = self.returncode
        if code is None:
            return "is still running"
        if code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with status {code}"

    async def reap(self, grace: Optional[float] = None) -> None:
        """Wait for the agent to exit; terminate it after ``grace`` s, kill it 2 s later."""
        if grace is None:
            grace = self.exit_grace
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace):
                await self.process.wait()
            if self.returncode is None:
                try:
                    self.process.terminate()
                except OSError:
                    pass
                with trio.move_on_after(2.0):
                    await self.process.wait()
            if self.returncode is None:
                try:
                    self.process.kill()
                except OSError:
                    pass
                await self.process.wait()
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    try:
                        await stream.aclose()
                    except Exception:  # noqa: BLE001 - closing is best effort
                        pass


# --------------------------------------------------------------------------- helpers


class _Waiter:
    __slots__ = ("predicate", "event", "result", "error")

    def __init__(self, predicate: Callable[[], Any]) -> None:
        self.predicate = predicate
        self.event = trio.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


def _os_reason(exc: OSError) -> str:
    """The most specific reason in an OSError chain (trio wraps per-address failures)."""
    seen: BaseException = exc
    for _ in range(5):
        inner = getattr(seen.__cause__, "exceptions", None)  # a group of per-address attempts
        if inner:
            seen = inner[-1]
        elif isinstance(seen.__cause__, OSError):
            seen = seen.__cause__
        else:
            break
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror
    return str(seen)


def _attr_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_attributes(
    exec_path: Optional[str],
    args: Iterable[str] = (),
    *,
    count: int = 1,
    env: Union[Mapping[str, str], Iterable[str], None] = None,
    cwd: Optional[str] = None,
    queue: Optional[str] = None,
    sub_id: str,
    **attributes: Any,
) -> List[str]:
    """SUBMIT_JOB arguments for a job (``key=value`` strings, ARRAY attributes repeated).

    ``exec_path`` with a '/' goes in ``execPath`` (the program's path), a bare
    name in ``execName`` (looked up on the agent's PATH).  Extra keyword
    attributes pass through (``execName=...`` too, to send both); list values
    repeat the key.
    """
    out = [f"jobSubId={sub_id}"]
    if exec_path:
        out.append(("execPath=" if "/" in exec_path else "execName=") + exec_path)
    out.extend(f"progArgs={arg}" for arg in args)
    if env:
        items = env.items() if isinstance(env, Mapping) else (item.partition("=")[::2] for item in env)
        out.extend(f"env={name}={value}" for name, value in items)
    if cwd:
        out.append(f"workingDir={cwd}")
    if count != 1:
        out.append(f"jobNumProcs={int(count)}")
    if queue is not None:
        out.append(f"queueId={queue}")
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)):
            out.extend(f"{key}={_attr_text(v)}" for v in value)
        elif value is not None:
            out.append(f"{key}={_attr_text(value)}")
    return out


# --------------------------------------------------------------------------- the client


class AgentClient:
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
                    data = await self.stream.receive_some(_READ_SIZE)
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
        self, predicate: Callable[[], Any], timeout: Optional[float] = None, *, description: Optional[str] = None
    ) -> Any:
        """Wait until ``predicate()`` is true; returns its value.

        The predicate is evaluated now and then after every event the agent
        sends.  If it raises, the exception is passed on.  Raises
        :class:`WaitTimeout` after ``timeout`` seconds, the protocol violation
        (strict mode) or the reason the session ended.
        """
        self._raise_failure()
        result = predicate()
        if result:
            return result
        if self._ended is not None:
            raise self._ended
        waiter = _Waiter(predicate)
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
            what = description or getattr(predicate, "__name__", "a condition")
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
        # In reference mode a job of its own has run, for the client, once a JOB_CHANGE said so.
        seen = element.changed_states if (self.reference and state == "RUNNING"
                                          and element.sub_id in self.state.submitted) else element.states

        def reached() -> Optional[Element]:
            if state in seen:
                return element
            if element.removed:
                raise WaitFailed(f"job {element.id} was removed before reaching {state} (went {_states(element)})")
            if element.state == "COMPLETED":
                raise WaitFailed(f"job {element.id} completed without reaching {state} (went {_states(element)})")
            return None

        return await self.wait_for(reached, timeout, description=f"job {element.id} to reach {state} (now {element.state})")

    # ------------------------------------------------------------------ commands

    async def send_command(
        self, command_id: Union[CommandId, int], args: Sequence[str] = (), *, tid: Optional[int] = None
    ) -> OpenCommand:
        """Send a command without waiting for its reply; returns its :class:`OpenCommand`."""
        self._raise_failure()
        if self._ended is not None:
            raise self._ended
        if self._nursery is None:
            raise RuntimeError("use the AgentClient in 'async with' before sending commands")
        command, traffic = self.state.send(command_id, args, tid)
        for listener in list(self._listeners):
            listener(traffic)
        async with self._send_lock:
            try:
                await self.stream.send_all(traffic.raw)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                with trio.move_on_after(3.5):
                    await self._ended_event.wait()
                self._raise_failure()
                raise self._ended or ConnectionClosed(f"cannot send to {self.peer}: {exc}") from None
        return command

    async def reply(self, command: OpenCommand, timeout: Optional[float] = None) -> Event:
        """Wait for a command's completing event; raise :class:`CommandFailed` for an error."""
        await self.wait_for(lambda: command.done, timeout, description=f"the reply to {command.name} (TID {command.tid})")
        return self._result(command)

    @staticmethod
    def _result(command: OpenCommand) -> Event:
        event = command.completion
        if command.failure is not None or event is None:
            raise CommandFailed(command.name, None, command.failure or "no reply", event)
        if isinstance(event, (Ok, Shutdown)):
            return event
        if isinstance(event, (Error, SubmitJobError, TerminateJobError)):
            cls = TokenRefused if (command.command_id == CommandId.INIT and event.code == ErrorCode.AUTHENTICATION) else CommandFailed
            raise cls(command.name, event.code, event.message, event)
        return event  # pragma: no cover - every completing event is handled above

    async def command(self, command_id: Union[CommandId, int], *args: str, timeout: Optional[float] = None) -> Event:
        """Send a command with a fresh TID and return its completing event (OK, SHUTDOWN).

        ERROR / SUBMITJOB_ERROR / TERMINATEJOB_ERROR raise :class:`CommandFailed`.
        (START_EVENTS and STOP_EVENTS complete only when the other is sent:
        use :meth:`start_events` / :meth:`stop_events` for those.)
        """
        command = await self.send_command(command_id, args)
        return await self.reply(command, timeout)

    async def raw(
        self, command_id: int, args: Sequence[str] = (), *, tid: Optional[int] = None, wait: bool = True, timeout: Optional[float] = None
    ) -> OpenCommand:
        """Send any command by number (protocol testing); returns its :class:`OpenCommand`.

        With ``wait`` it returns once the command completed, whatever the
        outcome (see ``.completion``, ``.events``); it never raises
        :class:`CommandFailed`.
        """
        command = await self.send_command(command_id, args, tid=tid)
        if wait:
            await self.wait_for(lambda: command.done, timeout, description=f"the reply to {command.name} (TID {command.tid})")
        return command

    async def init(
        self,
        base_id: int = 1000,
        token: Optional[str] = None,
        bare: bool = False,
        *,
        version: str = PROTOCOL_VERSION,
        dialect: Optional[str] = None,
        extra: Sequence[str] = (),
        timeout: Optional[float] = 30,
    ) -> Event:
        """INIT: ``version=2.0 baseId=N`` (or the bare form), the dialect, ``token=...`` if given.

        ``dialect`` (default: the client's, see :class:`AgentClient`) is sent
        as ``dialect=NAME``, except ``"default"``, which is asked for by saying
        nothing.  ``extra`` arguments follow as given (the PTP 4.0 client sends
        ``key=value`` attributes of its own there).
        """
        name = dialect if dialect is not None else self.dialect
        args = [version, str(base_id)] if bare else [f"version={version}", f"baseId={base_id}"]
        if name != DEFAULT.name:
            args.append(f"dialect={name}")
        if token is not None:
            args.append(f"token={token}")
        args.extend(extra)
        command = await self.send_command(CommandId.INIT, args)
        return await self.reply(command, timeout)

    async def model_def(self, *, timeout: Optional[float] = 30) -> List[Any]:
        """MODEL_DEF: returns (and keeps in :attr:`attribute_definitions`) the definitions sent."""
        command = await self.send_command(CommandId.MODEL_DEF)
        await self.reply(command, timeout)
        definitions = [d for event in command.events if isinstance(event, AttrDef) for d in event.definitions]
        self.attribute_definitions = definitions
        return definitions

    async def start_events(self, *, timeout: Optional[float] = 30) -> OpenCommand:
        """START_EVENTS; returns once the agent has accepted it and the initial model is in.

        A LIST_FILTERS sent right behind it serves as a fence: the agent sends
        the whole initial model before it answers anything received after
        START_EVENTS, and replies come in order, so once the fence is answered
        the mirror holds the model (or START_EVENTS was refused).
        """
        stop = self.state.open_command(CommandId.STOP_EVENTS)
        command = await self.send_command(CommandId.START_EVENTS)
        fence = await self.send_command(CommandId.LIST_FILTERS)
        await self.wait_for(
            lambda: fence.done and (stop is None or stop.done or command.done),
            timeout,
            description="the agent to accept START_EVENTS",
        )
        if command.done:
            self._result(command)
        return command

    async def stop_events(self, *, timeout: Optional[float] = 30) -> OpenCommand:
        """STOP_EVENTS; returns once the open START_EVENTS has completed with OK.

        In the default dialect STOP_EVENTS is answered at once, so this also
        waits for its own OK (native: it stays open until START_EVENTS).
        """
        start = self.state.open_command(CommandId.START_EVENTS)
        command = await self.send_command(CommandId.STOP_EVENTS)
        if start is None or self.state.dialect.stop_events_at_once:
            await self.wait_for(lambda: command.done, timeout, description="the reply to STOP_EVENTS")
        else:
            await self.wait_for(lambda: start.done or command.done, timeout, description="the agent to accept STOP_EVENTS")
        if command.done:
            self._result(command)
        return command

    async def quit(self, *, timeout: Optional[float] = 30) -> Event:
        """QUIT; returns the SHUTDOWN event (open START/STOP_EVENTS complete with OK first)."""
        command = await self.send_command(CommandId.QUIT)
        return await self.reply(command, timeout)

    def new_sub_id(self) -> str:
        self._sub_counter += 1
        return f"sub-{os.getpid()}-{self._sub_counter}"

    async def submit_nowait(
        self,
        exec_path: Optional[str],
        args: Iterable[str] = (),
        *,
        count: int = 1,
        env: Union[Mapping[str, str], Iterable[str], None] = None,
        cwd: Optional[str] = None,
        queue: Union[str, Sequence[str], None] = None,
        sub_id: Optional[str] = None,
        timeout: Optional[float] = 60,
        broker: Optional[str] = None,
        **attributes: Any,
    ) -> str:
        """SUBMIT_JOB, waiting only for its OK; returns the jobSubId.

        ``queue`` is one queue (element id, name, or SCHEDULER:NAME) or several, as a list or
        comma-separated, for the agent's broker to choose among (``broker`` names the broker:
        Null, Random, FastestQueue, Benchmark or module:Class)."""
        sub_id = sub_id or self.new_sub_id()
        if queue is not None:
            parts = [p.strip() for p in queue.split(",")] if isinstance(queue, str) else [str(p) for p in queue]
            resolved = []
            for part in parts:
                found = self._find_queue(part)
                resolved.append(found.id if found is not None else part)
            queue = ",".join(resolved)
        if broker is not None:
            attributes["broker"] = broker
        args_ = job_attributes(exec_path, args, count=count, env=env, cwd=cwd, queue=queue, sub_id=sub_id, **attributes)
        command = await self.send_command(CommandId.SUBMIT_JOB, args_)
        await self.reply(command, timeout)
        return sub_id

    async def submit(self, exec_path: Optional[str], args: Iterable[str] = (), *, timeout: Optional[float] = 60, **kwargs: Any) -> str:
        """SUBMIT_JOB, then wait for the NEW_JOB carrying its jobSubId; returns the job's element id.

        Keyword arguments as :meth:`submit_nowait` (``count``, ``env``, ``cwd``,
        ``queue``, ``sub_id``, any other attribute).  Events must be started.
        """
        sub_id = await self.submit_nowait(exec_path, args, timeout=timeout, **kwargs)
        seen = self.state.jobs_by_sub.get(sub_id)
        if seen is not None:
            return seen.id
        if not self.state.events_started:
            raise ClientError(
                f"job {sub_id} was submitted, but events are stopped: its job id arrives after START_EVENTS"
            )
        job = await self.wait_for(
            lambda: self.state.jobs_by_sub.get(sub_id), timeout, description=f"the NEW_JOB for jobSubId {sub_id}"
        )
        return job.id

    async def launch(self, exec_path: Optional[str], args: Iterable[str] = (), *, timeout: Optional[float] = 60,
                     **kwargs: Any) -> str:
        """A launch as the PTP 4.0 IDE makes it: SUBMIT_JOB, then wait for a JOB_CHANGE of the
        job saying RUNNING (the NEW_JOB never counts, nor a later state); returns the job's
        element id.  :class:`WaitFailed` if the job ends before such a JOB_CHANGE (the IDE's
        launch would wait until cancelled).  Keyword arguments as :meth:`submit_nowait`."""
        sub_id = await self.submit_nowait(exec_path, args, timeout=timeout, **kwargs)

        def running() -> Optional[Element]:
            job = self.state.jobs_by_sub.get(sub_id)
            if job is None:
                return None
            if "RUNNING" in job.changed_states:
                return job
            if job.state == "COMPLETED" or job.removed:
                raise WaitFailed(f"job {job.id} ({sub_id}) ended without a JOB_CHANGE saying RUNNING "
                                 f"(went {_states(job)}): the IDE's launch of it would never complete")
            return None

        job = await self.wait_for(running, timeout, description=f"a JOB_CHANGE saying RUNNING for jobSubId {sub_id}")
        return job.id

    async def cosubmit(self, description: str, *, name: Optional[str] = None, sub_id: Optional[str] = None,
                       timeout: Optional[float] = 60) -> str:
        """Submit a co-allocated multi-part job (its description: JSON or the multi-request
        form, see docs/coallocation.md); waits for its NEW_JOB and returns the multi-part
        job's element id.  Its parts appear as jobs with ``coallocJob`` naming it
        (:meth:`parts_of`)."""
        return await self.submit(None, timeout=timeout, sub_id=sub_id, coallocDescription=description, jobName=name)

    async def add_part(self, job: Union[str, Element], part: str, *, sub_id: Optional[str] = None,
                       timeout: Optional[float] = 60) -> str:
        """Add one part (a JSON object or an ``&(...)`` conjunction) to a multi-part job
        whose start barrier is not released yet; returns the part's job id."""
        return await self.submit(None, timeout=timeout, sub_id=sub_id, coallocDescription=part,
                                 coallocJob=self._job_id(job))

    async def delete_part(self, part: Union[str, Element], *, timeout: Optional[float] = 60) -> Event:
        """Delete a part (its job) from its multi-part job before the start barrier is
        released: it is cancelled and the barrier no longer waits for it."""
        return await self.terminate(part, timeout=timeout)

    async def release_barrier(self, job: Union[str, Element], *, wait_for_parts: bool = False,
                              timeout: Optional[float] = 60) -> Event:
        """Release a multi-part job's start barrier: now, or once every part's processes
        have checked in (``wait_for_parts``)."""
        return await self.change_job(job, timeout=timeout, coallocRelease="wait" if wait_for_parts else "now")

    def parts_of(self, job: Union[str, Element]) -> List[Element]:
        """The jobs that are parts of a multi-part job, in part order."""
        job_id = self._job_id(job)
        found = [j for j in self.jobs.values() if j.get("coallocJob") == job_id]
        return sorted(found, key=lambda j: int(j.get("coallocPart") or 0))

    async def terminate(self, job: Union[str, Element], *, timeout: Optional[float] = 60) -> Event:
        return await self.command(CommandId.TERMINATE_JOB, f"jobId={self._job_id(job)}", timeout=timeout)

    async def change_job(self, job: Union[str, Element], *, timeout: Optional[float] = 60, **attributes: Any) -> Event:
        args = [f"jobId={self._job_id(job)}"]
        for key, value in attributes.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            args.extend(f"{key}={_attr_text(v)}" for v in values)
        return await self.command(CommandId.CHANGE_JOB, *args, timeout=timeout)

    async def move_job(self, job: Union[str, Element], queue: str, *, timeout: Optional[float] = 60) -> Event:
        found = self._find_queue(queue)
        queue_id = found.id if found is not None else queue
        return await self.command(CommandId.MOVE_JOB, f"jobId={self._job_id(job)}", f"queueId={queue_id}", timeout=timeout)

    # ------------------------------------------------------------------ the mirrored model

    @property
    def violations(self) -> list:
        return self.state.violations

    @property
    def messages(self) -> list:
        return self.state.messages

    @property
    def attr_defs(self) -> Dict[str, Any]:
        """Attribute definitions received so far, by attribute id."""
        return self.state.attr_defs

    @property
    def rm(self) -> Optional[Element]:
        return self.state.rm

    @property
    def machines(self) -> Dict[str, Element]:
        return self.state.by_kind["machine"]

    @property
    def nodes(self) -> Dict[str, Element]:
        return self.state.by_kind["node"]

    @property
    def queues(self) -> Dict[str, Element]:
        return self.state.by_kind["queue"]

    @property
    def jobs(self) -> Dict[str, Element]:
        return self.state.by_kind["job"]

    @property
    def processes(self) -> Dict[str, Element]:
        return self.state.by_kind["process"]

    @property
    def ended(self) -> Optional[ClientError]:
        """Why the session is over (None while it is not)."""
        return self._ended

    @property
    def events_started(self) -> bool:
        return self.state.events_started

    def element(self, element_id: str) -> Element:
        try:
            return self.state.elements[canonical_id(str(element_id))]
        except KeyError:
            raise UnknownElementError(f"no element {element_id} in the model") from None

    def job_process(self, job: Union[str, Element], rank: Union[int, str]) -> Element:
        """The process of ``rank`` (0 .. n-1) in ``job`` (element id, jobSubId or the job)."""
        found = self.state.process(self._job_id(job), rank)
        if found is None:
            raise UnknownElementError(f"no process of rank {rank} in job {self._job_id(job)}")
        return found

    def children(self, element: Union[str, Element], kind: Optional[str] = None) -> List[Element]:
        parent = element if isinstance(element, Element) else self.element(element)
        found = [self.state.elements[c] for c in parent.children if c in self.state.elements]
        return [e for e in found if kind is None or e.kind == kind]

    def find_job(self, ref: Union[str, Element]) -> Optional[Element]:
        """A job by element id or jobSubId (also a removed one still referenced), or None."""
        if isinstance(ref, Element):
            return ref
        ref = str(ref)
        job = self.jobs.get(canonical_id(ref))
        if job is None:
            job = self.state.jobs_by_sub.get(ref)
        return job

    def job(self, ref: Union[str, Element]) -> Element:
        job = self.find_job(ref)
        if job is None:
            raise UnknownElementError(f"no job {ref} in the model (give its element id or jobSubId)")
        return job

    def _find_queue(self, ref: str) -> Optional[Element]:
        queue = self.queues.get(canonical_id(str(ref)))
        if queue is None:
            for candidate in self.queues.values():
                if candidate.name == ref:
                    return candidate
        return queue

    def queue(self, ref: str) -> Element:
        """A queue by element id or name."""
        queue = self._find_queue(ref)
        if queue is None:
            raise UnknownElementError(f"no queue {ref} in the model")
        return queue

    def _job_id(self, job: Union[str, Element]) -> str:
        found = self.find_job(job)
        return found.id if found is not None else str(job)

    def job_output(self, job: Union[str, Element], stream: str = "stdout") -> str:
        """Everything the job's processes wrote to ``stream``, one line per received line."""
        return self.job(job).text(stream)


def _states(element: Element) -> str:
    return " -> ".join(element.states) or "no state"


# --------------------------------------------------------------------------- connect-back


class AgentListener:
    """A TCP listener for agents started with ``--connect HOST:PORT`` (one connection)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener

    @property
    def host(self) -> str:
        return self.listener.socket.getsockname()[0]

    @property
    def port(self) -> int:
        return self.listener.socket.getsockname()[1]

    @property
    def address(self) -> str:
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def accept(
        self,
        *,
        process: Optional[AgentProcess] = None,
        timeout: Optional[float] = 30,
        strict: bool = True,
        reference: bool = False,
        dialect: Optional[str] = None,
    ) -> AgentClient:
        """Wait for the agent to connect; with ``process``, fail early if it exits first."""
        accepted: List[trio.abc.Stream] = []
        exited: List[bool] = []

        async def accept_one(cancel: trio.CancelScope) -> None:
            accepted.append(await self.listener.accept())
            cancel.cancel()

        async def watch(cancel: trio.CancelScope) -> None:
            assert process is not None
            await process.wait()
            with trio.move_on_after(1.0):
                await process.wait_stderr()
            exited.append(True)
            cancel.cancel()

        with trio.move_on_after(timeout if timeout is not None else math.inf):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept_one, nursery.cancel_scope)
                if process is not None:
                    nursery.start_soon(watch, nursery.cancel_scope)
                    if process.capture_stderr:
                        nursery.start_soon(process.pump_stderr)
        if accepted:
            return AgentClient(
                accepted[0],
                process=process,
                strict=strict,
                peer=f"agent connected to {self.address}",
                reference=reference,
                dialect=dialect,
            )
        if exited and process is not None:
            tail = process.stderr_tail()
            shown = f"; its last output:\n{tail}" if tail else ""
            raise AgentExited(
                f"the agent {process.exit_description()} before connecting to {self.address}{shown}", process.returncode, tail
            )
        raise ConnectError(f"no agent connected to {self.address} within {timeout:g} s")

    async def aclose(self) -> None:
        await self.listener.aclose()

    async def __aenter__(self) -> "AgentListener":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


async def listen_for_agent(host: str = "127.0.0.1", port: int = 0) -> AgentListener:
    """Listen where an agent started with ``--connect HOST:PORT`` will connect (port 0: any free port)."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConnectError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    for extra in listeners[1:]:
        await extra.aclose()
    return AgentListener(listeners[0])


spawn = AgentClient.spawn
connect_tcp = AgentClient.connect_tcp
connect_unix = AgentClient.connect_unix
from_stream = AgentClient.from_stream


def default_agent_argv(*extra: str) -> List[str]:
    """``python -m proxy_agent`` with this interpreter, plus ``extra`` arguments."""
    return [sys.executable, "-m", "proxy_agent", *extra]
