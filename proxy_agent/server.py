"""Accepting clients: one job service, any number of sessions.

* :func:`serve_stream` serves one connection (stdio, connect-back) and returns when it ends.
* :func:`serve_listeners` accepts connections on TCP or Unix listeners and serves each in a
  session of its own, side by side; a client leaving (QUIT, end of input, a dropped
  connection, at any moment) ends its own session only.

A connection must authenticate (complete INIT, with the token where one is required) within
``auth_timeout`` seconds or it is closed, and connections that have not authenticated yet are
limited in number: when a new one arrives and the limit is reached, the oldest
unauthenticated one is closed to make room.  So a client that connects and says nothing can
never keep the owner out.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import List, Optional

import attrs
import trio

from .frontends.ptp import PtpConfig, PtpSession, keep_snapshot_planned, refuse_busy
from .frontends.ptp.session import CLOSE_BOUND
from .service.service import JobService

log = logging.getLogger("proxy_agent.server")

__all__ = ["Admission", "ServerLimits", "Sessions", "peer_name", "serve_connection", "serve_listeners", "serve_stream"]


class Sessions:
    """The sessions being served, so that the agent can say goodbye to each when it stops,
    and the jobs submitted in those that have ended."""

    def __init__(self, keep_jobs: bool = False) -> None:
        self.live: "set[PtpSession]" = set()
        #: keys of the jobs submitted in the sessions that have ended (with ``keep_jobs``)
        self.submitted: List[int] = []
        self._keep_jobs = keep_jobs

    def left(self, session: PtpSession) -> None:
        self.live.discard(session)
        if self._keep_jobs:
            self.submitted.extend(session.submitted)

    def jobs(self) -> "set[int]":
        """The keys of the jobs submitted in these sessions, live or ended."""
        keys = set(self.submitted)
        for session in self.live:
            keys.update(session.submitted)
        return keys

    async def farewell(self, text: str, bound: float = CLOSE_BOUND + 0.5) -> None:
        """Tell every client the agent is stopping, and let that be written (bounded: each
        session ends its stream with whole frames and SHUTDOWN within CLOSE_BOUND)."""
        sessions = list(self.live)
        for session in sessions:
            session.farewell(text)
        with trio.move_on_after(bound):
            for session in sessions:
                await session.written()


@attrs.frozen
class ServerLimits:
    #: seconds a connection may take to authenticate (complete INIT)
    auth_timeout: float = 10.0
    #: connections waiting to authenticate at once (the oldest is dropped for a newer one)
    max_unauthenticated: int = 16
    #: authenticated sessions at once (more get ERROR "busy")
    max_sessions: int = 64


async def _close(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(0.5) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except Exception:  # noqa: BLE001 - the peer may be gone already
            pass


async def serve_stream(stream: trio.abc.Stream, service: JobService, config: PtpConfig, peer: str,
                       sessions: Optional[Sessions] = None) -> bool:
    """Serve one session on ``stream``; returns True if the client sent QUIT."""
    session = PtpSession(stream, service, config, peer)
    if sessions is not None:
        sessions.live.add(session)
    try:
        return await session.run()
    finally:
        if sessions is not None:
            sessions.left(session)
        await _close(stream)


class Admission:
    """Unauthenticated connections, oldest first, and the count of live sessions."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.waiting: "OrderedDict[int, trio.CancelScope]" = OrderedDict()
        self.sessions = 0
        self._next = 0

    def admit(self, scope: trio.CancelScope) -> int:
        while len(self.waiting) >= self.limits.max_unauthenticated:
            _, oldest = self.waiting.popitem(last=False)
            oldest.cancel()
        self._next += 1
        self.waiting[self._next] = scope
        return self._next

    def authenticated(self, ticket: int) -> None:
        self.waiting.pop(ticket, None)

    def left(self, ticket: int) -> None:
        self.waiting.pop(ticket, None)


async def serve_connection(
    stream: trio.abc.Stream,
    service: JobService,
    config: PtpConfig,
    limits: ServerLimits,
    admission: "Admission",
    sessions: Optional[Sessions] = None,
    peer: Optional[str] = None,
) -> Optional[PtpSession]:
    """Serve one accepted connection in a session of its own, under ``admission`` (the
    sessions and unauthenticated connections of one front door); returns the session once
    it has ended (None if it was refused: too many sessions)."""
    peer = peer or peer_name(stream)
    if admission.sessions >= limits.max_sessions:
        log.warning("refusing %s: %d sessions are open", peer, admission.sessions)
        await refuse_busy(stream, peer, config.max_frame_size)
        return None
    with trio.CancelScope() as scope:
        ticket = admission.admit(scope)
        session = PtpSession(stream, service, config, peer)
        if sessions is not None:
            sessions.live.add(session)
        counted = False
        try:
            async with trio.open_nursery() as nursery:

                async def watch_authentication() -> None:
                    nonlocal counted
                    with trio.move_on_after(limits.auth_timeout):
                        await session.authenticated.wait()
                    if not session.authenticated.is_set():
                        log.info("%s did not authenticate within %g s; closing", peer, limits.auth_timeout)
                        nursery.cancel_scope.cancel()
                        return
                    admission.authenticated(ticket)
                    admission.sessions += 1
                    counted = True

                nursery.start_soon(watch_authentication)
                log.info("session with %s started", peer)
                await session.run()
                nursery.cancel_scope.cancel()
            log.info("session with %s ended", peer)
        finally:
            if sessions is not None:
                sessions.left(session)
            admission.left(ticket)
            if counted:
                admission.sessions -= 1
            await _close(stream)
    return session


async def serve_listeners(
    listeners: List[trio.SocketListener],
    service: JobService,
    config: PtpConfig,
    limits: ServerLimits = ServerLimits(),
    sessions: Optional[Sessions] = None,
    *,
    plan_ahead: bool = False,
    task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept clients until cancelled, each in a session of its own.  With ``plan_ahead``,
    the initial model is kept planned for clients yet to come."""
    admission = Admission(limits)

    async def handle(stream) -> None:
        await serve_connection(stream, service, config, limits, admission, sessions)

    async with trio.open_nursery() as nursery:
        if plan_ahead:
            nursery.start_soon(keep_snapshot_planned, service)
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, handle, [listener])
        task_status.started()


def peer_name(stream) -> str:
    try:
        peer = stream.socket.getpeername()
    except (AttributeError, OSError):
        return "client"
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return peer or "unix client"

