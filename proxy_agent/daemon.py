"""The service of one state directory: the background process every launch joins.

``proxy-agent service --state-dir DIR [--idle-exit SECONDS|never]`` is what the first launch on
a state directory starts (:mod:`.launch`), in a session of its own, with its stdio on
``/dev/null`` and its log in ``DIR/agent.log``; a person may also run it in the foreground.  It
holds the directory's lock (so exactly one runs per directory), keeps the job store, runs the
backends, and serves ``DIR/agent.sock``:

* a connection whose first byte is ``{`` speaks the service interface
  (:mod:`.frontends.api`): the Invoke Server, ``proxy-agent jobs``/``forget``/``output``, and
  the launching processes themselves;
* anything else is a PTP session (the console, any PTP client on this host).

**Launches.**  A launching process (``proxy-agent --stdio``, ``--connect``, ``--listen``,
``--unix``...) opens one connection that stays open as long as it runs (its *anchor*), sending
``launch`` with its command line: the service reads it as the agent's own command line (a
mistake is refused with the one line the launch prints), adds the schedulers it lacks with
the launch's options for them, and notes which of the launch's options it cannot apply (a
scheduler that runs already with another value, another runtime address...): the launch's
clients are told so in one MESSAGE.  This makes the launch a *door*: each of its clients'
connections then opens with ``session`` naming the door, and is a PTP session with the
door's settings (token, authentication deadline, preferred schedulers, working directory).
The request passes the client's output along (its pipe or socket, ``output: handed``): the
session writes to it directly, as an agent of its own would, and reads what the client sends
from the connection, which the launch relays; the connection closes when the session ends.
The door ends when its anchor closes: with ``--on-disconnect terminate`` the local jobs its
clients submitted end then, and the anchor is closed only after they have.  ``farewell`` on
the anchor (the launch received a signal) ends the door's sessions the way the service's own
end does.

**Leaving.**  With no connection and no running local job for ``--idle-exit`` seconds
(default 600), or on ``stop``, SIGTERM, SIGINT or SIGHUP, the service stops accepting, tells
every PTP client why (MESSAGE, SHUTDOWN: each stream ends with whole frames within the
session's bound), ends the local jobs of doors that asked for it, tells each launch its door
was closed, and leaves; the other jobs go on (local ones under their keeper, batch ones in
their scheduler) and the next service adopts them.  A service whose socket file was removed
or replaced leaves too (no launch can reach it any more).  A signal while the service starts
ends it at once, with exit status 0 and its socket file removed.
"""

from __future__ import annotations

import array
import itertools
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import attrs
import trio

from .launch import EXIT_IN_USE, READY_MARK, Signals, Stopped
from .__main__ import CommandLineError, StateDir, idle_exit_seconds, parse_arguments, runtime_settings
from .daemon_log import LOG_NAME, LOG_ROUTE, LogRoute, LogRoutes, ServiceLog, detach
from .daemon_options import Applied, LaunchOptions, read_launch, service_command_line
from .endpoints import bind_unix_listener
from .frontends.api.server import ApiSession, Handover, service_facts
from .frontends.api.wire import DOOR_CLOSED, FIRST_BYTE, LineReader, encode, socket_path
from .frontends.ptp import PtpConfig, keep_snapshot_planned
from .frontends.ptp.session import CLOSE_BOUND
from .server import Admission, ServerLimits, Sessions, serve_connection
from .transport import SplitStream
from .service.coalloc.manager import CoallocManager
from .service.jobs import ErrorKind, ServiceError
from .service.model import K, Kind
from .service.service import JobService
from .service.store import StateDirInUse

__all__ = ["Daemon", "EXIT_IN_USE", "LOG_NAME", "main"]

log = logging.getLogger("proxy_agent.daemon")

#: How long a new connection may take to say what it speaks.
_FIRST_BYTES_BOUND = 10.0
#: How long the local jobs of a door that ends may take to end.
_END_JOBS_BOUND = 10.0
#: How often the service looks whether it is idle, and whether its socket is still its own.
_SOCKET_CHECK = 2.0
#: File descriptors a request may carry (a launch's log).
_MAX_FDS = 2


# --------------------------------------------------------------------------- streams


class PrefixedStream(trio.abc.HalfCloseableStream):
    """A socket stream whose first bytes were read already (to see what it speaks)."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix
        self.socket = stream.socket

    async def receive_some(self, max_bytes=None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data) -> None:
        await self._stream.send_all(data)

    def send_now(self, data) -> int:
        """Write what the socket takes now, without waiting (0 if it takes nothing)."""
        try:
            return os.write(self.socket.fileno(), data)
        except OSError:
            return 0

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _first_bytes(stream: trio.SocketStream) -> Tuple[bytes, List[int]]:
    """The connection's first bytes, with the descriptors that came with them."""
    fds: List[int] = []
    data, ancdata, _, _ = await stream.socket.recvmsg(1 << 16, socket.CMSG_SPACE(_MAX_FDS * 4))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            numbers = array.array("i")
            numbers.frombytes(payload[: len(payload) - len(payload) % numbers.itemsize])
            fds.extend(numbers)
    return data, fds


# --------------------------------------------------------------------------- launches


@attrs.define(eq=False)
class Door:
    """A launch's front door: its settings, its clients' sessions, the jobs they submitted."""

    ident: str
    #: ``terminate`` or ``keep``: what becomes of the local jobs of its clients when it ends
    policy: str
    config: PtpConfig
    limits: ServerLimits
    peer: str
    admission: Admission = attrs.field(default=None)
    sessions: Sessions = attrs.field(factory=lambda: Sessions(keep_jobs=True))
    route: Optional[LogRoute] = None
    #: the launch is ending (a signal): its sessions are told so, and no new one starts
    ending: bool = False
    #: the launch's anchor connection
    anchor: Optional[ApiSession] = None

    def __attrs_post_init__(self) -> None:
        if self.admission is None:
            self.admission = Admission(self.limits)

    def jobs(self) -> Set[int]:
        return self.sessions.jobs()


class Daemon:
    """The service of one state directory (see the module documentation)."""

    def __init__(self, state: StateDir, listener: socket.socket, idle_exit: Optional[float],
                 routes: Optional[LogRoutes] = None, signals: Optional[Signals] = None) -> None:
        self.state = state
        self.signals = signals
        self.path = socket_path(state.directory)
        self._listener = listener
        self._socket_id = _file_id(self.path)
        self.idle_exit = idle_exit
        self.routes = routes or LogRoutes()
        self.service = JobService(store=state.store)
        CoallocManager(self.service, runtime_settings(parse_arguments([]), [], state))
        self.sessions = Sessions()
        self.admission = Admission(ServerLimits())
        self.doors: Dict[str, Door] = {}
        self._door_numbers = itertools.count(1)
        #: live connections of any kind
        self.clients = 0
        self._stop = trio.Event()
        self._stop_reason = ""
        self._end_every_job = False
        self.options = LaunchOptions(self.service, state, idle_exit)
        self._nursery: Optional[trio.Nursery] = None
        self._planning = False
        if state.problem:
            self.service.tell_every_client("WARNING", state.problem)

    # ------------------------------------------------------------------ running

    async def run(self) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._listener))
        log.info("serving %s (process %d)", self.path, os.getpid())
        if self.signals is not None:
            # a signal, from now on (or one noted since start-up), stops the service the usual way
            token = trio.lowlevel.current_trio_token()
            self.signals.to_function(lambda number: token.run_sync_soon(self._signalled, number))
            self.signals.handed_on(self.path)  # removed as the service stops (_remove_socket)
        async with trio.open_nursery() as nursery:
            if self.signals is None:
                nursery.start_soon(self._watch_signals)
            await nursery.start(self.service.run)
            self._nursery = nursery
            accepting = trio.CancelScope()
            nursery.start_soon(self._accept, listener, accepting, nursery)
            nursery.start_soon(self._watch_idle)
            nursery.start_soon(self._watch_socket)
            await self._stop.wait()
            log.info("stopping: %s", self._stop_reason)
            accepting.cancel()
            self._remove_socket()
            with trio.CancelScope(shield=True):
                await self._farewell(self._stop_reason)
                doors = list(self.doors.values())
                jobs: Set[int] = set()
                for door in doors:
                    if door.policy == "terminate":
                        jobs.update(door.jobs())
                if self._end_every_job:
                    jobs.update(self._local_jobs())
                await self._end_local_jobs(jobs)
                # each launch is told its door was closed, not lost (as when the service dies)
                anchors = [door.anchor for door in doors if door.anchor is not None]
                for anchor in anchors:
                    anchor.send({"event": DOOR_CLOSED})
                with trio.move_on_after(1.0):
                    for anchor in anchors:
                        await anchor.drained()
            nursery.cancel_scope.cancel()

    async def _accept(self, listener: trio.SocketListener, scope: trio.CancelScope, nursery: trio.Nursery) -> None:
        # connections are served in the service's nursery: they outlive the end of accepting
        with scope:
            await trio.serve_listeners(self._handle, [listener], handler_nursery=nursery)

    def stop(self, reason: str, *, end_every_job: bool = False) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._end_every_job = end_every_job
            self._stop.set()

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                self._signalled(signum)
                return

    def _signalled(self, signum: int) -> None:
        self.stop(f"the agent's service received {signal.Signals(signum).name} and is shutting down")

    async def _watch_idle(self) -> None:
        if self.idle_exit is None:
            return
        check = min(1.0, max(0.05, self.idle_exit / 4))
        quiet_since: Optional[float] = None
        while True:
            await trio.sleep(check)
            busy = self.clients > 0 or any(backend.active_jobs() for backend in self.service.backends)
            now = trio.current_time()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            if quiet_since is not None and now - quiet_since >= self.idle_exit:
                self.stop(f"no client and no running local job for {self.idle_exit:g} s")
                return

    async def _watch_socket(self) -> None:
        while True:
            await trio.sleep(_SOCKET_CHECK)
            if _file_id(self.path) != self._socket_id:
                self._socket_id = None  # not ours to remove any more
                self.stop(f"its socket {self.path} was removed or replaced")
                return

    def _remove_socket(self) -> None:
        if self._socket_id is not None and _file_id(self.path) == self._socket_id:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        self._socket_id = None

    async def _farewell(self, text: str) -> None:
        groups = [self.sessions, *(door.sessions for door in self.doors.values())]
        sessions = [session for group in groups for session in group.live]
        for session in sessions:
            session.farewell(text)
        # each ends its stream with whole frames and SHUTDOWN within its bound
        with trio.move_on_after(CLOSE_BOUND + 0.5):
            for session in sessions:
                await session.written()

    # ------------------------------------------------------------------ connections

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.clients += 1
        fds: List[int] = []
        try:
            first = b""
            with trio.move_on_after(_FIRST_BYTES_BOUND) as waited:
                try:
                    first, fds = await _first_bytes(stream)
                except OSError:
                    return
            if waited.cancelled_caught:
                log.info("a connection said nothing within %g s; closed", _FIRST_BYTES_BOUND)
            if not first:
                return
            if first[:1] == FIRST_BYTE:
                await self._serve_api(stream, first, fds)
            else:
                await serve_connection(PrefixedStream(stream, first), self.service, PtpConfig(),
                                       self.admission.limits, self.admission, self.sessions, "local client")
        except Exception:  # noqa: BLE001 - one connection's trouble must not end the service
            log.exception("internal error serving a connection")
        finally:
            self.clients -= 1
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            with trio.move_on_after(0.5) as scope:
                scope.shield = True
                try:
                    await stream.aclose()
                except Exception:  # noqa: BLE001
                    pass

    async def _serve_api(self, stream: trio.SocketStream, first: bytes, fds: List[int]) -> None:
        reader = LineReader()
        try:
            messages = reader.feed(first)
        except ValueError as exc:
            log.warning("a local tool sent %s; closed", exc)
            with trio.move_on_after(1.0):
                try:
                    await stream.send_all(encode({"event": "error", "message": f"the service closes this "
                                                                                 f"connection: {exc}"}))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            return
        opened: List[Door] = []  # the door a launch opens on this connection, if it is an anchor
        api = ApiSession(stream, self.service, state_dir=self.state.directory, ops=self._ops(fds, opened),
                         options=self._hello_options, peer="local tool")
        handover = await api.run(reader, messages)
        door: Optional[Door] = opened[-1] if opened else None
        if handover is not None:
            taken, rest = handover
            await taken.run(stream, rest)
        if door is not None:
            await self._end_door(door)
            # the launch tells a service that ended its door from one that died
            with trio.move_on_after(1.0):
                try:
                    await stream.send_all(encode({"event": DOOR_CLOSED}))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    def _ops(self, fds: List[int], opened: List[Door]):
        async def launch(api: ApiSession, message: Dict[str, Any]) -> Dict[str, Any]:
            door = await self._launch(message, fds)
            door.anchor = api
            opened.append(door)
            if door.route is not None:
                LOG_ROUTE.set(door.route)
            return {"door": door.ident, "service": service_facts(self.service),
                    "not_applied": door.config.notices[0][1] if door.config.notices else None}

        async def session(api: ApiSession, message: Dict[str, Any]) -> Handover:
            door = self.doors.get(str(message.get("door")))
            if door is None:
                raise ServiceError("no such launch (it has ended)", ErrorKind.BAD_REQUEST)
            peer = str(message.get("peer") or door.peer)
            out_fd = None
            if message.get("output") == "handed":
                # The client's own output (its pipe or socket): the session writes to it
                # directly, as an agent of its own would, while the launch passes the
                # client's input on over this connection.
                if not fds:
                    raise ServiceError("the client's output was to come with the request", ErrorKind.BAD_REQUEST)
                out_fd = fds.pop(0)  # the session's from now on (closed with its stream)
            return Handover(lambda stream, rest: self._serve_session(door, stream, rest, peer, out_fd))

        async def farewell(api: ApiSession, message: Dict[str, Any]) -> Dict[str, Any]:
            door = (opened[-1] if opened else None) or self.doors.get(str(message.get("door")))
            if door is None:
                raise ServiceError("no such launch (it has ended)", ErrorKind.BAD_REQUEST)
            text = str(message.get("text") or "the agent is shutting down")
            log.info("%s: %s", door.peer, text)
            door.ending = True  # a session of it that has yet to start is not served
            await door.sessions.farewell(text)
            for live in list(door.sessions.live):
                with trio.move_on_after(0.5) as scope:
                    scope.shield = True
                    await live.stream.aclose()  # its client is told; the session ends
            return {}

        async def stop(api: ApiSession, message: Dict[str, Any]) -> Dict[str, Any]:
            every = message.get("jobs") == "terminate"
            self.stop("the agent's service was asked to stop" + (" with its jobs" if every else ""),
                      end_every_job=every)
            return {"pid": os.getpid()}

        return {"launch": launch, "session": session, "farewell": farewell, "stop": stop}

    async def _serve_session(self, door: Door, stream: trio.SocketStream, rest: bytes, peer: str,
                             out_fd: Optional[int] = None) -> None:
        if door.route is not None:
            LOG_ROUTE.set(door.route)
        if door.ending:
            log.info("%s: the launch is ending; %s is not served", door.peer, peer)
            if out_fd is not None:
                os.close(out_fd)
            return
        client: trio.abc.HalfCloseableStream = PrefixedStream(stream, rest)
        if out_fd is not None:
            client = SplitStream(client, out_fd)
        await serve_connection(client, self.service, door.config, door.limits, door.admission, door.sessions, peer)

    # ------------------------------------------------------------------ launches

    async def _launch(self, message: Dict[str, Any], fds: List[int]) -> Door:
        argv = message.get("argv")
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ServiceError("argv must be a list of texts", ErrorKind.BAD_REQUEST)
        cwd = message.get("cwd") if isinstance(message.get("cwd"), str) else None
        args, applied = self._apply(argv, cwd)
        transport = str(message.get("transport") or "stdio")
        policy = getattr(args, "on_disconnect", None) or ("keep" if transport in ("listen", "unix") else "terminate")
        token = message.get("token") if transport == "listen" else None
        notices: Tuple[Tuple[str, str], ...] = ()
        if applied.note:
            notices = (("WARNING", applied.note),)
        config = PtpConfig(token=token if isinstance(token, str) else None, prefer=applied.prefer,
                           working_dir=cwd, notices=notices)
        ident = f"{next(self._door_numbers)}"
        peer = str(message.get("peer") or f"{transport} launch {ident}")
        door = Door(ident, policy, config, ServerLimits(auth_timeout=args.auth_timeout), peer)
        if fds:
            # The launch's log (its stderr, or --log-file) hears what its clients' sessions log,
            # as an agent of its own would have written it there.
            verbose = max(args.verbose or 0, args.debug or 0, 1 if args.log_file else 0)
            level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
            door.route = LogRoute(os.dup(fds[0]), level)
            self.routes.add(door.route)
        self.doors[ident] = door
        log.info("%s joined (process %s, schedulers %s, on disconnect: %s)", peer, message.get("pid", "?"),
                 ",".join(applied.prefer), policy)
        if applied.note:
            log.warning("%s: %s", peer, applied.note)
        return door

    async def _end_door(self, door: Door) -> None:
        self.doors.pop(door.ident, None)
        if door.route is not None:
            # first of all: nothing of the launch's (its stderr, an ssh channel) stays open here
            self.routes.remove(door.route)
            door.route = None
        with trio.CancelScope(shield=True):
            if door.policy == "terminate":
                await self._end_local_jobs(door.jobs())
        log.info("%s ended", door.peer)

    async def _hello_options(self, argv: Sequence[str], cwd: Optional[str]) -> Dict[str, Any]:
        if not isinstance(cwd, str):
            cwd = None
        _, applied = self._apply(list(argv), cwd)
        return {"prefer": applied.prefer, "not_applied": applied.note}

    def _apply(self, argv: List[str], cwd: Optional[str]) -> Tuple[Any, Applied]:
        """A launch's command line applied (see :meth:`LaunchOptions.apply`)."""
        args, applied, added = self.options.apply(argv, cwd)
        if added and not self._planning and self._nursery is not None:
            # the initial model is kept planned for clients to come, once there is one
            self._planning = True
            self._nursery.start_soon(keep_snapshot_planned, self.service)
        return args, applied

    # ------------------------------------------------------------------ jobs

    def _local_jobs(self) -> Set[int]:
        local = {backend.name for backend in self.service.backends if backend.jobs_are_local}
        return {element.key for element in self.service.model.elements(Kind.JOB) if element.owner in local}

    async def _end_local_jobs(self, keys: Set[int]) -> None:
        """End the local jobs among ``keys`` (with the local parts of multi-part jobs among
        them) that are still running, and wait for their ends (bounded)."""
        service = self.service
        model = service.model
        local = {backend.name for backend in service.backends if backend.jobs_are_local}
        coalloc = service.coalloc.name if service.coalloc is not None else None
        targets: Set[int] = set()
        multi = set()
        for key in keys:
            element = model.lookup(key)
            if element is None or element.kind is not Kind.JOB:
                continue
            if element.owner in local:
                targets.add(key)
            elif element.owner == coalloc:
                multi.add(key)
        if multi:
            for element in model.elements(Kind.JOB):
                if element.owner in local and model.attr(element.key, K.COALLOC_JOB) in multi:
                    targets.add(element.key)
        running = [key for key in targets if not _ended(model, key)]
        if not running:
            return
        log.info("ending %d local jobs whose client went away", len(running))

        async def end(key: int) -> None:
            try:
                await service.terminate(key)
            except ServiceError as exc:
                log.info("job %d: %s", key, exc.message)

        with trio.move_on_after(_END_JOBS_BOUND):
            async with trio.open_nursery() as nursery:
                for key in running:
                    nursery.start_soon(end, key)
            while not all(_ended(model, key) for key in running):
                await trio.sleep(0.02)


_FINAL_STATES = frozenset({"FINISHED", "KILLED", "FAILED", "DELETED"})


def _ended(model, key: int) -> bool:
    return key not in model or model.attr(key, K.STATE) in _FINAL_STATES


def _file_id(path: str) -> Optional[Tuple[int, int]]:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


# --------------------------------------------------------------------------- the process


def main(argv: Sequence[str], signals: Optional[Signals] = None) -> int:
    """``proxy-agent service``: see the module documentation.  Exit status 0 when it has served
    and left (or was stopped by a signal while starting: it then removes its socket file),
    :data:`EXIT_IN_USE` when another process holds the directory, 2 when the directory, the
    log or a launch's command line (``--check``) cannot be used.  ``signals``: taken from the
    process's first moment by :func:`proxy_agent.launch.entry` (taken here when None)."""
    own = signals is None
    if signals is None:
        signals = Signals().install()
    where: List[str] = []
    try:
        return _serve(argv, signals, where)
    except Stopped:
        signals.hold()
        name = signals.name or "a signal"
        log.info("stopped by %s while starting", name)
        text = f"proxy-agent: the service of {where[0] if where else 'its state directory'} was stopped by {name} " \
               f"while starting\n"
        try:
            os.write(2, text.encode())  # the launch that started it reads this (or the log, once detached)
        except OSError:
            pass
        return 0
    finally:
        signals.hold()
        signals.remove_made()
        if own:
            signals.restore()


def _serve(argv: Sequence[str], signals: Signals, where: List[str]) -> int:
    from .endpoints import default_state_dir

    args = service_command_line(argv)
    try:
        idle_exit = idle_exit_seconds(args.idle_exit)
        if args.check is not None:
            read_launch(args.check)
    except (CommandLineError, ValueError) as exc:
        text = str(exc)
        print(text if text.startswith("proxy-agent") else f"proxy-agent: {text}", file=sys.stderr)
        return 2
    state = StateDir(os.path.abspath(args.state_dir or default_state_dir()))
    where.append(state.directory)
    try:
        os.makedirs(state.directory, mode=0o700, exist_ok=True)
        service_log = ServiceLog(os.path.join(state.directory, LOG_NAME))
    except OSError as exc:
        print(f"proxy-agent: cannot use the state directory {state.directory}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    routes = LogRoutes()
    root = logging.getLogger()
    root.handlers[:] = [service_log, routes]
    root.setLevel(logging.INFO)
    try:
        state.take()
    except StateDirInUse as exc:
        print(f"proxy-agent: {exc.message}", file=sys.stderr)
        return EXIT_IN_USE
    if not state.usable:
        print(f"proxy-agent: {state.problem}", file=sys.stderr)
        return 2
    path = socket_path(state.directory)
    # From here a signal is noted, and stops the service once it runs: the socket file is known
    # to be its own (made) before anything can stop the start-up.
    signals.hold()
    try:
        listener = bind_unix_listener(path, 64, replace=True)
    except OSError as exc:
        print(f"proxy-agent: cannot serve {state.directory}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    signals.made(path)
    state.advertise(path)
    try:
        # holding no launch's working directory (each launch's clients' jobs get their own)
        os.chdir(os.path.expanduser("~"))
    except OSError:
        os.chdir("/")
    try:
        # The launch that started the service reads this, then the end of its stderr.
        os.write(2, READY_MARK)
    except OSError:
        pass  # that launch has gone: the service serves the next one
    detach(service_log.fd)
    signals.hold()  # from here a signal is noted, and stops the service once it runs
    started = time.time()
    try:
        trio.run(Daemon(state, listener, idle_exit, routes, signals).run)
    except KeyboardInterrupt:
        pass
    except Exception:  # noqa: BLE001 - said in the log, never on a launch's stdio
        log.exception("the service failed")
        return 1
    finally:
        signals.hold()
        if state.store is not None:
            try:
                state.store.close()  # closed, not left to the interpreter's exit: nothing but the file stays
            except Exception as exc:  # noqa: BLE001 - what it still owes was said while it served
                log.warning("the job store did not close cleanly: %s", exc)
        log.info("left after %.0f s", time.time() - started)
    return 0
