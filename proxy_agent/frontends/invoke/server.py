"""The Invoke Server: requests from stdin, replies to stdout, notifies to stderr, jobs through
a :class:`JobGateway`.

What it does for each request (see ``protocol.py`` for the lines themselves):

* ``QUERY_FEATURES``: the multi-line reply (protocol 2.0, no optional features).
* ``JOB_CREATE``: the attributes are checked at once (``request.py``); a request that cannot
  become a job gets ``F`` naming why.  Otherwise ``S`` at once, then, in the job's own task:
  staging when asked, submission, ``CREATE_NOTIFY <rid> S job-N`` (or ``F <why>`` if the
  submission was refused), then a ``STATUS_NOTIFY`` each time the job's status changes, the
  last one DONE or FAILED.  Job ids are ``job-1``, ``job-2``, ... in request order.
* ``JOB_STATUS``: ``S <status>``.
* ``JOB_DESTROY``: ``S``.  A job that has not reported its end is cancelled, and its one
  final ``STATUS_NOTIFY <job> DONE destroyed`` follows once it is gone (``FAILED destroyed``
  if it failed, or could not be cancelled).  A job that has reported its end gets nothing
  more: the client counts every DONE and FAILED against its jobs, and a second one for a
  job breaks its count (it stops reading notifies, and its next handle hangs).  Every job
  gets exactly one final notify, whatever the order of its end and the destroy.
* ``EXIT``: ``S``; then every job that has not ended is cancelled and waited for (at most
  ``exit_grace`` seconds), and :meth:`InvokeServer.run` returns.  End of file on stdin (the
  client died), a broken reply or notify pipe, or :meth:`InvokeServer.stop` (a signal) do
  the same without the reply.

Replies are written in request order by the one task that reads requests; notifies by one
writer task fed through a channel, so lines never interleave.  The log at debug level
(``-v``) has every request, reply and notify.  A reply is written before
anything its request causes is started, so a CREATE_NOTIFY never overtakes its ``S``.

The job service is reached through :class:`JobGateway`, three calls wide; ``agent.py`` has
the implementation over the agent's job service.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from functools import partial
from typing import AsyncIterator, Callable, Dict, List, Optional, Protocol, Tuple

import attrs
import trio

from ...service.jobs import JobSpec, JobState, ServiceError
from .protocol import (
    SERVER_REQUESTS,
    CreateInterrupted,
    EndOfInput,
    Exit,
    InputWarning,
    InvokeStatus,
    JobCreate,
    JobDestroy,
    JobStatus,
    QueryFeatures,
    RequestError,
    RequestReader,
    notify_create_failed,
    notify_created,
    notify_status,
    reply_failure,
    reply_features,
    reply_success,
)
from .request import BadJobRequest, InvokeDefaults, InvokeJob, invoke_status, job_from_attributes

__all__ = ["InvokeServer", "JobGateway", "JobUpdate"]

log = logging.getLogger("proxy_agent.invoke")

_READ_SIZE = 64 * 1024
#: After EXIT, how long the notify writer may take to hand over what is left.
_FLUSH_BOUND = 2.0
#: Texts of STATUS_NOTIFY when the job service gives none.
_DEFAULT_TEXT = {
    InvokeStatus.PENDING: "queued",
    InvokeStatus.ACTIVE: "started",
    InvokeStatus.DONE: "finished",
    InvokeStatus.FAILED: "failed",
}


# --------------------------------------------------------------------------- the job service, as seen from here


@attrs.frozen
class JobUpdate:
    """A job's state, with a line about it for the client's log (``exit status 0``)."""

    state: JobState
    message: Optional[str] = None


class JobGateway(Protocol):
    """What the Invoke Server needs from a job service: submit, cancel, observe.

    Job keys are the service's own.  Errors are :class:`ServiceError` whose ``message`` is
    fit to show the user (it goes into ``CREATE_NOTIFY ... F``).
    """

    async def submit(self, spec: JobSpec) -> int:
        """Take the job; return its key as soon as it is known (not when it starts).

        Raises ServiceError (SubmitError) when the job cannot be taken."""
        ...

    async def cancel(self, job: int) -> None:
        """Ask for the job to end (queued or running).  Returns once asked; the end itself
        shows up in :meth:`watch`.  A job that has ended already is no error."""
        ...

    def watch(self, job: int) -> AsyncIterator[JobUpdate]:
        """The job's state now, then each change, ending after the first final state.

        States may be skipped (a short job may go from ACCEPTED straight to FINISHED); the
        final one must not be.  If the iterator has ``aclose``, it is closed when no longer
        needed."""
        ...


# --------------------------------------------------------------------------- the server


class _Job:
    """A job the client knows by id (from its CREATE_NOTIFY on)."""

    __slots__ = (
        "id",
        "request_id",
        "key",
        "status",
        "reported",
        "final",
        "destroy_requested",
        "staged_dir",
    )

    def __init__(self, job_id: str, request_id: str) -> None:
        self.id = job_id
        self.request_id = request_id
        self.key: Optional[int] = None
        self.status = InvokeStatus.PENDING
        #: a STATUS_NOTIFY has been sent
        self.reported = False
        #: its final STATUS_NOTIFY has been sent
        self.final = False
        #: a JOB_DESTROY came before its end was reported: the final notify says so
        self.destroy_requested = False
        self.staged_dir: Optional[str] = None


class InvokeServer:
    """One Invoke Server session: one client, its three pipes, its jobs.

    ``refusal``, when set, is a reason every request but EXIT is refused with (the server
    could not be set up, say its command line was wrong): the client's log then says why.
    """

    def __init__(
        self,
        jobs: JobGateway,
        requests: trio.abc.ReceiveStream,
        replies: trio.abc.SendStream,
        notifies: trio.abc.SendStream,
        *,
        defaults: InvokeDefaults = InvokeDefaults(),
        find_program: Callable[[str], Optional[str]] = shutil.which,
        base_dir: Optional[str] = None,
        exit_grace: float = 30.0,
        refusal: Optional[str] = None,
    ) -> None:
        self._gateway = jobs
        self._requests = requests
        self._replies = replies
        self._notifies = notifies
        self._defaults = defaults
        self._find_program = find_program
        self._base_dir = base_dir if base_dir is not None else os.getcwd()
        self._exit_grace = exit_grace
        self._refusal = refusal
        self._reader = RequestReader()
        self._jobs: Dict[str, _Job] = {}
        self._created = 0
        self._request_ids: Dict[str, str] = {}
        self._closing = False
        self._stop_reason: Optional[str] = None
        self._serve_scope = trio.CancelScope()
        self._job_scope: Optional[trio.CancelScope] = None
        self._job_nursery: Optional[trio.Nursery] = None
        self._notify_in, self._notify_out = trio.open_memory_channel(math.inf)
        self._notify_broken = False

    # ------------------------------------------------------------------ running

    async def run(self) -> str:
        """Serve until EXIT, end of input, a broken pipe or :meth:`stop`; then cancel and wait
        for every job.  Returns why it ended."""
        async with trio.open_nursery() as outer:
            outer.start_soon(self._write_notifies)
            async with trio.open_nursery() as job_nursery:
                self._job_nursery = job_nursery
                self._job_scope = job_nursery.cancel_scope
                why = await self._serve()
                log.info("ending (%s): cancelling %d unfinished jobs", why, self._unfinished())
                self._closing = True
                for job in list(self._jobs.values()):
                    if not job.final and job.key is not None:
                        job_nursery.start_soon(self._cancel_quietly, job)
                job_nursery.cancel_scope.deadline = min(
                    job_nursery.cancel_scope.deadline, trio.current_time() + self._exit_grace
                )
            if job_nursery.cancel_scope.cancelled_caught:
                log.warning("jobs still running %.0f s after the end; left to the job service", self._exit_grace)
            self._notify_in.close()
            outer.cancel_scope.deadline = trio.current_time() + _FLUSH_BOUND
        log.info("ended: %s", why)
        return why

    def stop(self, reason: str) -> None:
        """End the session as if the client had gone (a signal).  Once the session is ending,
        stop waiting for the jobs (they have been asked to end; the job service sees to it)."""
        if self._closing:
            if self._job_scope is not None and not self._job_scope.cancel_called:
                log.info("%s while ending: no longer waiting for jobs", reason)
                self._job_scope.cancel()
            return
        if self._stop_reason is None:
            self._stop_reason = reason
            self._serve_scope.cancel()

    def _unfinished(self) -> int:
        return sum(1 for job in self._jobs.values() if not job.final)

    async def _serve(self) -> str:
        reader = self._reader
        with self._serve_scope:
            while True:
                try:
                    data = await self._requests.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.info("request pipe failed: %s", exc)
                    data = b""
                replies: List[bytes] = []
                after: List[Callable[[], None]] = []
                ending: Optional[str] = None
                for event in reader.receive_data(data):
                    ending = self._handle(event, replies, after)
                    if ending is not None:
                        break
                if replies:
                    if log.isEnabledFor(logging.DEBUG):
                        for reply in replies:
                            for line in reply.decode("utf-8", "replace").splitlines():
                                log.debug("reply: %s", line)
                    try:
                        await self._replies.send_all(b"".join(replies))
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        log.warning("reply pipe broken (%s): the client is gone", exc)
                        return "reply pipe broken"
                # Only now that the replies are out may what they announce begin.
                for action in after:
                    action()
                if ending is not None:
                    return ending
        return self._stop_reason or "stopped"

    # ------------------------------------------------------------------ requests

    def _handle(self, event, replies: List[bytes], after: List[Callable[[], None]]) -> Optional[str]:
        """Answer one event; returns why serving ends, if it does."""
        log.debug("request: %r", event)
        if isinstance(event, InputWarning):
            log.warning("input: %s", event.reason)
            return None
        if isinstance(event, Exit):
            replies.append(reply_success())
            return "EXIT"
        if isinstance(event, EndOfInput):
            return "end of input"
        if isinstance(event, CreateInterrupted):
            log.warning("%s", event.reason)
            replies.append(reply_failure(event.reason))
            return None
        if isinstance(event, RequestError):
            log.warning("refused %s: %s", event.request, event.reason)
            replies.append(reply_failure(event.reason))
            return None
        if self._refusal is not None:
            replies.append(reply_failure(self._refusal))
            return None
        if isinstance(event, QueryFeatures):
            replies.append(reply_features(features=(), requests=SERVER_REQUESTS))
        elif isinstance(event, JobCreate):
            self._create(event, replies, after)
        elif isinstance(event, JobStatus):
            job = self._jobs.get(event.job_id)
            if job is None:
                replies.append(reply_failure(f"JOB_STATUS: no job {event.job_id}"))
            else:
                replies.append(reply_success(job.status))
        elif isinstance(event, JobDestroy):
            self._destroy_request(event.job_id, replies, after)
        else:  # pragma: no cover - every event type is handled above
            log.error("unhandled event %r", event)
            replies.append(reply_failure("internal error: unhandled request"))
        return None

    def _create(self, event: JobCreate, replies: List[bytes], after: List[Callable[[], None]]) -> None:
        rid = event.request_id
        try:
            job = job_from_attributes(
                rid,
                event.attributes,
                find_program=self._find_program,
                base_dir=self._base_dir,
                defaults=self._defaults,
            )
        except BadJobRequest as exc:
            log.warning("JOB_CREATE %s refused: %s", rid, exc)
            replies.append(reply_failure(f"JOB_CREATE {rid}: {exc}"))
            return
        self._created += 1
        job_id = f"job-{self._created}"
        if rid in self._request_ids:
            log.warning("request id %s used again (first for %s)", rid, self._request_ids[rid])
        self._request_ids[rid] = job_id
        log.info(
            "JOB_CREATE %s -> %s: %s %s x%d (%s) from %s for %s:%d%s",
            rid,
            job_id,
            job.backend.value,
            job.program,
            job.count,
            "staged" if job.staging else "in place",
            job.client_name or "?",
            job.hostname,
            job.port,
            f"; ignored: {', '.join(job.ignored)}" if job.ignored else "",
        )
        replies.append(reply_success())
        record = _Job(job_id, rid)
        assert self._job_nursery is not None
        after.append(partial(self._job_nursery.start_soon, self._run_job, record, job))

    def _destroy_request(self, job_id: str, replies: List[bytes], after: List[Callable[[], None]]) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            replies.append(reply_failure(f"JOB_DESTROY: no job {job_id}"))
            return
        replies.append(reply_success())
        if job.final:
            # Its end was reported (the usual case: the client destroys a handle's job once
            # the call returned): nothing more, a second final notify would break its count.
            log.info("%s destroyed after its end (%s): nothing to do", job.id, job.status.value)
            return
        if job.destroy_requested:
            return  # being destroyed: its one final notify is on its way
        job.destroy_requested = True
        assert self._job_nursery is not None
        after.append(partial(self._job_nursery.start_soon, self._destroy, job))

    # ------------------------------------------------------------------ jobs

    async def _run_job(self, job: _Job, request: InvokeJob) -> None:
        try:
            try:
                program = request.program
                if request.staging:
                    program, job.staged_dir = await trio.to_thread.run_sync(_stage, request)
                    log.info("%s: staged %s as %s", job.id, request.program, program)
                spec = attrs.evolve(request.spec_for(program), client_ref=job.id)
                key = await self._gateway.submit(spec)
            except ServiceError as exc:
                reason = exc.message
            except _StagingError as exc:
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 - the client must hear of it, the server must go on
                log.exception("%s: submission failed", job.id)
                reason = f"internal error: {type(exc).__name__}: {exc}"
            else:
                reason = None
            if reason is not None:
                log.warning("JOB_CREATE %s (%s) failed: %s", job.request_id, job.id, reason)
                self._notify(notify_create_failed(job.request_id, reason))
                return
            job.key = key
            self._jobs[job.id] = job
            self._notify(notify_created(job.request_id, job.id))
            log.info("%s is job %s of the job service", job.id, key)
            if self._closing:
                await self._cancel_quietly(job)
            await self._follow(job, key)
        finally:
            if job.staged_dir is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(partial(shutil.rmtree, job.staged_dir, ignore_errors=True))

    async def _follow(self, job: _Job, key: int) -> None:
        updates = self._gateway.watch(key)
        try:
            async for update in updates:
                status = invoke_status(update.state)
                if status is None:
                    continue
                if status.final:
                    self._finish(job, status, update.message)
                    return
                if status is not job.status or not job.reported:
                    job.status = status
                    job.reported = True
                    self._notify(notify_status(job.id, status, update.message or _DEFAULT_TEXT[status]))
            self._finish(job, InvokeStatus.FAILED, "the job service stopped reporting on the job")
        except ServiceError as exc:
            self._finish(job, InvokeStatus.FAILED, f"lost track of the job: {exc.message}")
        except Exception as exc:  # noqa: BLE001
            log.exception("%s: following the job failed", job.id)
            self._finish(job, InvokeStatus.FAILED, f"lost track of the job: {type(exc).__name__}: {exc}")
        finally:
            aclose = getattr(updates, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()

    def _finish(self, job: _Job, status: InvokeStatus, message: Optional[str]) -> None:
        """Report a job's end, once."""
        if job.final:
            return
        job.final = True
        job.status = status
        if job.destroy_requested:
            text = "destroyed"
        else:
            text = message or _DEFAULT_TEXT[status]
        log.info("%s %s: %s", job.id, status.value, message or text)
        self._notify(notify_status(job.id, status, text))

    async def _destroy(self, job: _Job) -> None:
        if job.final:
            return  # it ended meanwhile, and said so: that was its one final notify
        assert job.key is not None
        try:
            await self._gateway.cancel(job.key)
        except ServiceError as exc:
            if not job.final:
                # The client waits for a final status after JOB_DESTROY, without a time limit.
                log.warning("%s: cancel failed: %s", job.id, exc.message)
                self._finish(job, InvokeStatus.FAILED, None)

    async def _cancel_quietly(self, job: _Job) -> None:
        if job.key is None or job.final:
            return
        try:
            await self._gateway.cancel(job.key)
        except ServiceError as exc:
            log.warning("%s: cancel failed: %s", job.id, exc.message)

    # ------------------------------------------------------------------ notifies

    def _notify(self, line: bytes) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("notify: %s", line.decode("utf-8", "replace").rstrip("\r\n"))
        try:
            self._notify_in.send_nowait(line)
        except trio.ClosedResourceError:
            log.info("notify after the end dropped: %r", line)

    async def _write_notifies(self) -> None:
        async with self._notify_out:
            async for line in self._notify_out:
                batch = [line]
                while True:
                    try:
                        batch.append(self._notify_out.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self._notify_broken:
                    continue
                try:
                    await self._notifies.send_all(b"".join(batch))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.warning("notify pipe broken (%s): the client is gone", exc)
                    self._notify_broken = True
                    if not self._closing:
                        # Like end of file; once ending, the jobs are still waited for.
                        self.stop("notify pipe broken")


# --------------------------------------------------------------------------- staging


class _StagingError(Exception):
    pass


def _stage(request: InvokeJob) -> Tuple[str, str]:
    """Copy the program into a new directory under ``tmp_dir``; returns (copy, directory).

    Runs in a worker thread."""
    try:
        directory = tempfile.mkdtemp(prefix="ninfg-stage-", dir=request.tmp_dir)
    except OSError as exc:
        where = request.tmp_dir or tempfile.gettempdir()
        raise _StagingError(f"staging: cannot make a directory in {where}: {exc.strerror or exc}") from None
    target = os.path.join(directory, os.path.basename(request.program) or "program")
    try:
        shutil.copyfile(request.program, target)
        os.chmod(target, 0o700)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise _StagingError(f"staging: cannot copy {request.program}: {exc.strerror or exc}") from None
    return target, directory
