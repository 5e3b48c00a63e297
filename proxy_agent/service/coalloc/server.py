"""The runtime server: what the processes of co-allocated jobs talk to.

One :class:`RuntimeServer` serves any number of multi-part jobs over a Unix socket (for
processes on the agent's host) and/or TCP (for compute nodes), speaking the protocol of
``docs/runtime.md``: length-prefixed JSON frames, every request carrying its job's secret
and naming its job, part and rank.  Each job's coordination is a
:class:`~proxy_agent.service.coalloc.state.MultiJob`; the server only reads requests,
asks the state machine, waits for the job to change when the answer is "not yet", and
replies.

The job service drives it through a small synchronous API (call it from trio code):
:meth:`RuntimeServer.register_job`, :meth:`~RuntimeServer.environment`,
:meth:`~RuntimeServer.add_part`, :meth:`~RuntimeServer.delete_part`,
:meth:`~RuntimeServer.release_barrier`, :meth:`~RuntimeServer.process_ended`,
:meth:`~RuntimeServer.part_ended`, :meth:`~RuntimeServer.fail`,
:meth:`~RuntimeServer.cancel`, :meth:`~RuntimeServer.forget`; and it can wait for a job to
change with :meth:`~RuntimeServer.wait_changed`.

Nothing a client sends can stop the server: malformed frames, wrong secrets, huge
lengths, stalls and dropped connections end that one connection, and a request that fails
inside is answered with an ``internal`` error.

Before a connection has shown a job's secret it costs little and cannot keep anyone out:
its first request may be at most :data:`AUTH_FRAME` bytes (checked on the length, before
anything of the body is kept; a larger request is preceded by a small ``auth`` frame, which
the runtime library sends), and must arrive within ``auth_timeout`` seconds; a connection
that has shown nothing after :data:`AUTH_GRACE` seconds counts as idle or slow, and each
peer address may have only ``slow_per_peer`` of those (more are closed); at most
``max_unauthenticated`` TCP connections wait to authenticate at once (the oldest is closed
to make room).  TCP and the Unix socket are counted apart, so that nothing on the network
can keep the job's local processes out.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections import OrderedDict
import os
import re
import secrets
import socket
import stat
import struct
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar, Union

import trio

from ...runtime import wire
from ..jobs import JobState
from .description import MultiJobDescription, Part
from .state import CoordinationError, JobEnded, Limits, MultiJob, Refused, Verdict
from .contact import auto_addresses, reachable_host
from .operations import RuntimeOperations

__all__ = ["AUTH_FRAME", "RuntimeServer", "UnknownJob", "auto_addresses"]

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
T = TypeVar("T")

#: The largest first request of a connection that has not shown a secret yet.
AUTH_FRAME = wire.AUTH_FRAME
#: Seconds after which a connection that has shown no secret counts as idle or slow.
AUTH_GRACE = 1.0


class _Connection:
    """One client connection, for the limits on those that have not authenticated."""

    __slots__ = ("transport", "peer", "scope", "job", "slow")

    def __init__(self, transport: str, peer: str) -> None:
        self.transport = transport
        self.peer = peer
        self.scope = trio.CancelScope()
        #: the job whose secret it has shown (None: not yet)
        self.job: Optional[RuntimeJob] = None
        #: counted among its peer's idle or slow connections
        self.slow = False


class UnknownJob(Refused):
    """The runtime server has no multi-part job by that id."""


class RequestViolation(Exception):
    """The client broke the protocol; the reply says how and the connection ends."""


class _Unauthorized(Exception):
    pass


class RuntimeJob:
    """One multi-part job as the server holds it."""

    __slots__ = ("state", "secret", "changed", "seen_version", "forgotten")

    def __init__(self, state: MultiJob, secret: str) -> None:
        self.state = state
        self.secret = secret
        self.changed = trio.Event()
        self.seen_version = state.version
        self.forgotten = False


# --------------------------------------------------------------------------- the server


class RuntimeServer(RuntimeOperations):
    """Serves the runtime protocol for every multi-part job registered with it.

    ``unix_path``: listen on a Unix socket there (its directory should be private: the
    socket is made owner-only and peers of other users are refused).  ``tcp_host``: listen
    on TCP there too: ``"auto"`` for the addresses compute nodes reach this host by (those
    its name, ``advertise_host`` or the host's own, resolves to), a host or address, or
    ``"0.0.0.0"`` / ``"::"`` for every interface; port ``tcp_port``, 0 for any; advertised to
    compute nodes as ``advertise_host`` (default, when listening on every interface or on
    ``auto``: ``reachable_host()``, never loopback).  ``frame_timeout`` bounds how long a
    started frame may take to arrive, ``idle_timeout`` how long an authenticated connection may sit without a
    request; ``max_connections`` bounds connections at once, on TCP and on the Unix socket
    each; the limits before authentication are in the module documentation.
    """

    def __init__(
        self,
        *,
        unix_path: Optional[str] = None,
        tcp_host: Optional[str] = None,
        tcp_port: int = 0,
        advertise_host: Optional[str] = None,
        max_frame: int = wire.MAX_FRAME,
        frame_timeout: float = 30.0,
        idle_timeout: float = 600.0,
        send_timeout: float = 30.0,
        max_connections: int = 512,
        auth_timeout: float = 10.0,
        slow_per_peer: int = 8,
        max_unauthenticated: int = 256,
        limits: Limits = Limits(),
    ) -> None:
        if unix_path is None and tcp_host is None:
            raise ValueError("the runtime server needs a Unix socket path, a TCP host, or both")
        if unix_path is not None and ("?" in unix_path or not os.path.isabs(unix_path)):
            raise ValueError(f"the Unix socket path must be absolute and free of '?': {unix_path!r}")
        self.unix_path = unix_path
        self.tcp_host = tcp_host
        self.tcp_port = tcp_port
        self.advertise_host = advertise_host
        self.max_frame = max_frame
        self.frame_timeout = frame_timeout
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.max_connections = max_connections
        self.auth_timeout = auth_timeout
        self.slow_per_peer = slow_per_peer
        self.max_unauthenticated = max_unauthenticated
        self.limits = limits
        self.unix_contact: Optional[str] = None
        self.tcp_contact: Optional[str] = None
        #: the addresses the TCP listeners are bound to
        self.tcp_addresses: List[str] = []
        self._jobs: Dict[str, RuntimeJob] = {}
        #: connections at once, by transport ("unix", "tcp")
        self._connections: Dict[str, int] = {"unix": 0, "tcp": 0}
        #: TCP connections that have not authenticated yet, oldest first
        self._unauthenticated: "OrderedDict[_Connection, None]" = OrderedDict()
        #: peer address -> its idle or slow connections
        self._slow: Dict[str, int] = {}
        #: connections refused or ended for breaking the protocol (for tests and logs)
        self.violations = 0
        self._started = trio.Event()

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; ``task_status.started`` once listening."""
        listeners: List[trio.SocketListener] = []
        try:
            if self.unix_path is not None:
                listeners.append(await self._unix_listener(self.unix_path))
                self.unix_contact = wire.format_contact("unix", self.unix_path)
            unix_count = len(listeners)
            if self.tcp_host is not None:
                tcp = await self._tcp_listeners()
                listeners.extend(tcp)
                port = tcp[0].socket.getsockname()[1]
                self.tcp_addresses = [listener.socket.getsockname()[0] for listener in tcp]
                self.tcp_contact = wire.format_contact("tcp", (self._advertised_host(), port))
            async with trio.open_nursery() as nursery:
                for index, listener in enumerate(listeners):
                    nursery.start_soon(self._accept_loop, listener, nursery, "unix" if index < unix_count else "tcp")
                self._started.set()
                task_status.started(self)
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            if self.unix_path is not None and self.unix_contact is not None:
                try:
                    os.unlink(self.unix_path)
                except OSError:
                    pass

    def _advertised_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        if self.tcp_host in ("", "0.0.0.0", "::", "auto"):
            return reachable_host()
        return str(self.tcp_host)

    async def _tcp_listeners(self) -> List[trio.SocketListener]:
        """The TCP listeners: on every interface only when asked; for ``auto``, on each
        address of this host that its advertised name resolves to (what compute nodes
        connect to), on one port."""
        if self.tcp_host != "auto":
            return await trio.open_tcp_listeners(self.tcp_port, host=self.tcp_host or None)
        name = self._advertised_host()
        addresses = await auto_addresses(name)
        if not addresses:
            raise OSError(f"--runtime-tcp auto: the name {name!r} resolves to no address of this host, so compute "
                          "nodes could not reach the agent by it; give --runtime-advertise NAME, or --runtime-tcp "
                          "HOST[:PORT] (0.0.0.0 for every interface)")
        listeners: List[trio.SocketListener] = []
        port = self.tcp_port
        try:
            for address in addresses:
                try:
                    bound = await trio.open_tcp_listeners(port, host=address)
                except OSError as error:
                    if not listeners:
                        raise
                    log.warning("runtime server: cannot also listen on %s port %d: %s", address, port, error)
                    continue
                listeners.extend(bound)
                port = bound[0].socket.getsockname()[1]  # the others take the same port
        except BaseException:
            for listener in listeners:
                await listener.aclose()
            raise
        return listeners

    async def _unix_listener(self, path: str) -> trio.SocketListener:
        try:
            existing = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(existing.st_mode):
                raise OSError(f"{path} exists and is not a socket; not replacing it")
            os.unlink(path)  # a socket left by an earlier agent
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        return trio.SocketListener(sock)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery, transport: str) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                # Out of file descriptors and the like: wait a little, then go on serving.
                log.warning("runtime server: accept failed: %s", error)
                await trio.sleep(0.1)
                continue
            if self._connections[transport] >= self.max_connections:
                self.violations += 1
                log.warning("runtime server: %d %s connections already; refusing one more",
                            self._connections[transport], transport)
                await trio.aclose_forcefully(stream)
                continue
            self._connections[transport] += 1
            nursery.start_soon(self._serve_connection, stream, transport)

    # ------------------------------------------------------------------ one connection

    async def _serve_connection(self, stream: trio.SocketStream, transport: str = "unix") -> None:
        connection = _Connection(transport, _peer_address(stream) if transport == "tcp" else "")
        try:
            if stream.socket.family == socket.AF_UNIX and not self._same_user(stream.socket):
                self.violations += 1
                log.warning("runtime server: refused a Unix-socket peer of another user")
                return
            with connection.scope:
                if transport == "tcp":
                    self._admit(connection)
                async with trio.open_nursery() as nursery:
                    if transport == "tcp":
                        nursery.start_soon(self._watch_slow, connection)
                    await self._converse(stream, connection)
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # noqa: BLE001 - one connection must never take the server down
            log.exception("runtime server: a connection failed")
        finally:
            self._unauthenticated.pop(connection, None)
            self._no_longer_slow(connection)
            self._connections[transport] -= 1
            await trio.aclose_forcefully(stream)

    def _admit(self, connection: _Connection) -> None:
        """A new TCP connection waits to authenticate; the oldest waiting is closed when too
        many do (so connections that never authenticate cannot keep anyone out)."""
        while len(self._unauthenticated) >= self.max_unauthenticated:
            oldest, _ = self._unauthenticated.popitem(last=False)
            self.violations += 1
            log.info("runtime server: %d connections waiting to authenticate; closing the oldest (from %s)",
                     self.max_unauthenticated, oldest.peer)
            oldest.scope.cancel()
        self._unauthenticated[connection] = None

    async def _watch_slow(self, connection: _Connection) -> None:
        """A connection that has shown no secret within AUTH_GRACE is idle or slow: its peer
        may keep a handful of those, no more."""
        await trio.sleep(AUTH_GRACE)
        if connection.job is not None:
            return
        count = self._slow.get(connection.peer, 0)
        if count >= self.slow_per_peer:
            self.violations += 1
            log.info("runtime server: %s has %d idle or slow connections already; closing one more",
                     connection.peer, count)
            connection.scope.cancel()
            return
        self._slow[connection.peer] = count + 1
        connection.slow = True

    def _authenticated(self, connection: _Connection, job: RuntimeJob) -> None:
        connection.job = job
        self._unauthenticated.pop(connection, None)
        self._no_longer_slow(connection)

    def _no_longer_slow(self, connection: _Connection) -> None:
        if connection.slow:
            connection.slow = False
            left = self._slow.get(connection.peer, 1) - 1
            if left > 0:
                self._slow[connection.peer] = left
            else:
                self._slow.pop(connection.peer, None)

    @staticmethod
    def _same_user(sock: Any) -> bool:
        peercred = getattr(socket, "SO_PEERCRED", None)
        if peercred is None:
            return True  # no way to ask: the socket's mode keeps others out
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
        except OSError:
            return False
        _pid, uid, _gid = struct.unpack("3i", raw)
        return uid == os.geteuid()

    async def _converse(self, stream: trio.SocketStream, connection: Optional[_Connection] = None) -> None:
        connection = connection or _Connection("unix", "")
        # Until the connection has shown a secret, a request may be small only: its length is
        # checked before any of it is kept.
        decoder = wire.FrameDecoder(min(self.max_frame, AUTH_FRAME))
        while True:
            try:
                request = await self._read_request(stream, decoder, connection)
            except wire.WireError as error:
                self.violations += 1
                message = str(error)
                if connection.job is None and decoder.max_frame < self.max_frame:
                    message += (f"; before a connection has shown its job's secret, a request may be at most "
                                f"{decoder.max_frame} bytes (send an 'auth' request first)")
                await self._send(stream, wire.error_reply(None, "protocol", message))
                return
            if request is None:
                return
            if request.get("op") == "auth":
                # shows the secret before a large request; answered only when it is wrong
                try:
                    _op, job, _part, _rank = self._envelope(request, connection)
                except (RequestViolation, _Unauthorized) as error:
                    self.violations += 1
                    kind = "protocol" if isinstance(error, RequestViolation) else "unauthorized"
                    await self._send(stream, wire.error_reply(request.get("id"), kind, str(error)))
                    return
                self._authenticated(connection, job)
                decoder.max_frame = self.max_frame
                continue
            reply = await self._answer(stream, decoder, request, connection)
            if connection.job is not None:
                decoder.max_frame = self.max_frame
            if reply is None:
                return  # the client went away (or spoke out of turn) while it waited
            if not await self._send(stream, reply):
                return
            if not reply["ok"] and reply["error"]["kind"] in ("protocol", "unauthorized"):
                return

    async def _read_request(self, stream: trio.SocketStream, decoder: wire.FrameDecoder,
                            connection: Optional[_Connection] = None) -> Optional[Dict[str, Any]]:
        """The next request; ``None`` at a clean end or when the client idles or stalls (a
        connection that has not authenticated has ``auth_timeout`` for its first request)."""
        waiting = self.idle_timeout if connection is None or connection.job is not None else self.auth_timeout
        with trio.move_on_after(waiting) as scope:
            frame_deadline_set = False
            while True:
                message = decoder.next()
                if message is not None:
                    return message
                if decoder.inside_frame and not frame_deadline_set:
                    scope.deadline = min(scope.deadline, trio.current_time() + self.frame_timeout)
                    frame_deadline_set = True
                data = await stream.receive_some(65536)
                if not data:
                    if decoder.inside_frame:
                        self.violations += 1
                        log.info("runtime server: a client closed its connection inside a frame")
                    return None
                decoder.feed(data)
        if decoder.inside_frame:
            self.violations += 1
            log.info("runtime server: a client stalled inside a frame; connection closed")
        return None

    async def _send(self, stream: trio.SocketStream, reply: Dict[str, Any]) -> bool:
        """Send a reply; False if the client did not take it in time (the connection is
        then half-way through a frame and must end)."""
        try:
            frame = wire.encode_frame(reply)
        except wire.WireError as error:
            frame = wire.encode_frame(wire.error_reply(reply.get("id"), "limit", str(error)))
        with trio.move_on_after(self.send_timeout):
            await stream.send_all(frame)
            return True
        log.info("runtime server: a client did not read its reply; connection closed")
        return False

    # ------------------------------------------------------------------ one request

    async def _answer(
        self, stream: trio.SocketStream, decoder: wire.FrameDecoder, request: Dict[str, Any],
        connection: Optional[_Connection] = None,
    ) -> Optional[Dict[str, Any]]:
        request_id = request.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, (int, str, type(None))):
            request_id = None
        try:
            op, job, part, rank = self._envelope(request, connection)
            if connection is not None and connection.job is None:
                self._authenticated(connection, job)
        except RequestViolation as error:
            self.violations += 1
            return wire.error_reply(request_id, "protocol", str(error))
        except _Unauthorized as error:
            self.violations += 1
            return wire.error_reply(request_id, "unauthorized", str(error))
        handler = self._handlers[op]
        try:
            if op in self._blocking:
                results = await self._watching(stream, decoder, handler(self, job, part, rank, request))
                if results is None:
                    return None
            else:
                results = await handler(self, job, part, rank, request)
        except CoordinationError as error:
            return wire.error_reply(request_id, error.kind, error.message)
        except Exception as error:  # noqa: BLE001 - answered, logged, and the server goes on
            log.exception("runtime server: %s request failed", op)
            return wire.error_reply(request_id, "internal", f"the agent failed to carry out {op}: {error}")
        finally:
            self._note(job)
        return wire.ok_reply(request_id, **results)

    def _envelope(self, request: Dict[str, Any], connection: Optional[_Connection] = None) -> Tuple[str, RuntimeJob, int, int]:
        if request.get("v") != wire.PROTOCOL_VERSION:
            raise RequestViolation(f"this agent speaks runtime protocol version {wire.PROTOCOL_VERSION}")
        op = request.get("op")
        if not isinstance(op, str) or (op not in self._handlers and op != "auth"):
            raise RequestViolation(f"unknown operation {op!r}"[:200])
        job_id, secret = request.get("job"), request.get("secret")
        if not isinstance(job_id, str) or not isinstance(secret, str):
            raise RequestViolation("a request names its 'job' and carries its 'secret' (texts)")
        job = self._jobs.get(job_id)
        # Unknown job and wrong secret get the same answer: a guesser learns nothing.
        expected = job.secret if job is not None else "x" * 64
        if not hmac.compare_digest(expected.encode(), secret.encode("utf-8", "replace")) or job is None:
            raise _Unauthorized("the job's secret does not match (or there is no such job)")
        if connection is not None and connection.job is not None and connection.job is not job:
            raise _Unauthorized("a connection serves the job whose secret it showed first, no other")
        part, rank = request.get("part"), request.get("rank")
        for key, value in (("part", part), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise RequestViolation(f"a request names its {key!r} as a whole number")
        return op, job, part, rank

    async def _watching(
        self, stream: trio.SocketStream, decoder: wire.FrameDecoder, work: Awaitable[Dict[str, Any]]
    ) -> Optional[Dict[str, Any]]:
        """Run a request that may wait, while watching the connection: a client that goes
        away (or sends more before its answer) abandons its request."""
        outcome: Dict[str, Any] = {}

        async def run(cancel_scope: trio.CancelScope) -> None:
            try:
                outcome["result"] = await work
            except BaseException as error:  # carried out of the nursery below
                if isinstance(error, trio.Cancelled):
                    raise
                outcome["error"] = error
            cancel_scope.cancel()

        async def watch(cancel_scope: trio.CancelScope) -> None:
            data = await stream.receive_some(65536)
            if data:
                self.violations += 1
                log.info("runtime server: a client sent more while its request waited; connection closed")
            outcome["gone"] = True
            cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, nursery.cancel_scope)
                nursery.start_soon(watch, nursery.cancel_scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            outcome["gone"] = True
        if "error" in outcome:
            raise outcome["error"]
        if "result" in outcome:
            return outcome["result"]
        close = getattr(work, "close", None)
        if close is not None:
            close()
        return None

    # ------------------------------------------------------------------ waiting for a job

    def _note(self, job: RuntimeJob) -> None:
        """Wake everyone waiting on ``job`` if it changed."""
        if job.state.version != job.seen_version or job.forgotten:
            job.seen_version = job.state.version
            job.changed.set()
            job.changed = trio.Event()

    async def _wait_for(self, job: RuntimeJob, poll: Callable[[], Optional[T]]) -> T:
        while True:
            if job.forgotten:
                raise JobEnded("the multi-part job is no longer known to the agent")
            result = poll()
            self._note(job)
            if result is not None:
                return result
            await job.changed.wait()

    # ------------------------------------------------------------------ the operations

    # ------------------------------------------------------------------ the service's API

    def _job(self, job_id: str) -> RuntimeJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(f"the runtime server has no multi-part job {job_id!r}")
        return job

    def _changing(self, job: RuntimeJob, call: Callable[[], T]) -> T:
        try:
            return call()
        finally:
            self._note(job)

    def register_job(self, description: MultiJobDescription, job_id: Optional[str] = None) -> str:
        """Take on a multi-part job (before its parts are submitted); its id."""
        if job_id is None:
            job_id = "mj-" + secrets.token_hex(6)
            while job_id in self._jobs:
                job_id = "mj-" + secrets.token_hex(6)
        elif not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            raise Refused(f"a multi-part job id is 1 to 64 letters, digits, '.', '_' or '-', not {job_id!r}")
        elif job_id in self._jobs:
            raise Refused(f"the runtime server already has a multi-part job {job_id!r}")
        self._jobs[job_id] = RuntimeJob(MultiJob(job_id, description, limits=self.limits), secrets.token_hex(32))
        return job_id

    def job(self, job_id: str) -> MultiJob:
        """The job's coordination state (to read: its state, reason, parts)."""
        return self._job(job_id).state

    def secret(self, job_id: str) -> str:
        return self._job(job_id).secret

    def environment(
        self, job_id: str, part_id: int, *, remote: bool = False, rank: Optional[int] = None
    ) -> Dict[str, str]:
        """The variables every process of the part gets: the runtime's contact (the Unix
        socket, or TCP when ``remote`` or there is no socket), the job's secret, the
        handles, and the part's place.  ``rank`` adds the process's rank, for backends
        that start each process on its own."""
        job = self._job(job_id)
        state = job.state
        contact = self.tcp_contact if (remote or self.unix_contact is None) else self.unix_contact
        if contact is None:
            raise RuntimeError("the runtime server is not listening (yet) on what this part needs")
        spec = state.part_spec(part_id)
        index = state.index_of(part_id)
        env = {
            wire.ENV_CONTACT: contact,
            wire.ENV_SECRET: job.secret,
            wire.ENV_MULTIJOB: job_id,
            wire.ENV_PART: str(part_id),
            wire.ENV_PART_INDEX: str(index),
            wire.ENV_PART_SIZE: str(spec.count),
            wire.ENV_PARTS: str(len(state.part_ids)),
            wire.ENV_GRAM_JOB_HANDLE: wire.handle(contact, job_id, part_id),
            wire.ENV_GRAM_MULTIJOB_HANDLE: wire.handle(contact, job_id),
            wire.ENV_GRAM_SUBJOB_RANK: str(index),
        }
        if spec.label is not None:
            env[wire.ENV_PART_LABEL] = spec.label
        if rank is not None:
            env[wire.ENV_RANK] = str(rank)
        return env

    def add_part(self, job_id: str, part: Part) -> int:
        """Add a part before the release; its id (then submit it with its environment)."""
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.add_part(part))

    def delete_part(self, job_id: str, part: Union[int, str]) -> int:
        """Delete a part (by id, or by label) before the release; its id (then cancel it)."""
        job = self._job(job_id)
        part_id = job.state.part_by_label(part) if isinstance(part, str) else part
        self._changing(job, lambda: job.state.delete_part(part_id))
        return part_id

    def release_barrier(self, job_id: str, wait_for_parts: bool = False) -> bool:
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.release_barrier(wait_for_parts))

    def process_ended(self, job_id: str, part_id: int, rank: int, failed: bool = False) -> Verdict:
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.process_ended(part_id, rank, failed))

    def part_ended(
        self, job_id: str, part_id: int, state: JobState = JobState.FINISHED, reason: Optional[str] = None
    ) -> Verdict:
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.part_ended(part_id, state, reason))

    def fail(self, job_id: str, reason: str) -> Verdict:
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.fail(reason))

    def cancel(self, job_id: str, reason: str = "cancelled by its owner") -> Verdict:
        job = self._job(job_id)
        return self._changing(job, lambda: job.state.cancel(reason))

    def forget(self, job_id: str) -> None:
        """Drop a job that is over; its processes' requests are refused from now on."""
        job = self._jobs.pop(job_id, None)
        if job is not None:
            job.forgotten = True
            self._note(job)

    async def wait_changed(self, job_id: str, version: int, timeout: float = math.inf) -> int:
        """Wait until the job's state version differs from ``version`` (or ``timeout``
        passes); the version now."""
        job = self._job(job_id)
        with trio.move_on_after(timeout):
            while job.state.version == version and not job.forgotten:
                await job.changed.wait()
        return job.state.version


def _peer_address(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return "?"


