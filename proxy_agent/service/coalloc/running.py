"""Multi-part jobs carried out: what :class:`~.manager.CoallocManager` does once the first
multi-part job comes (see :mod:`.manager`).  A manager is made a :class:`RunningManager`
then, and this module (with the description, coordination and server modules) is loaded
only in an agent that runs multi-part jobs."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Dict, Optional, Set, Tuple, Union

import attrs
import trio

from ...runtime import wire
from ..jobs import ErrorKind, JobError, JobSpec, JobState, ServiceError, SubmitError
from ..model import K, Kind
from .core import (
    COALLOC_NAME,
    DESCRIPTION_ATTRIBUTE,
    ID_ATTRIBUTE,
    JOB_ATTRIBUTE,
    PART_ATTRIBUTE,
    PARTS_ATTRIBUTE,
    QUEUE_NAME,
    ManagerCore,
    log,
)

if TYPE_CHECKING:  # pragma: no cover
    from .description import MultiJobDescription
    from .server import RuntimeServer
    from .state import CoordinationError

__all__ = ["RunningManager"]

#: How long the agent goes on trying to cancel a part its scheduler would not cancel.
_CANCEL_RETRY = (1.0, 2.0, 4.0)


def index_at_start(python: str = sys.executable) -> str:
    """A prologue line that sets the part's index variables to its index when its job
    starts, asked of the runtime (with ``proxy-runtime``, else this agent's Python): a part
    still waiting in its queue when an earlier part is deleted starts with the index the
    barrier gives it, not the one it had when it was submitted.  Where the runtime cannot be
    asked, the values given at submission stay."""
    ask = (f"{{ proxy-runtime --timeout 20 part-index || {shlex.quote(python)} -m proxy_agent.runtime --timeout 20 "
           "part-index; } 2>/dev/null")
    return (f"PA_PART_INDEX=$({ask}) && export {wire.ENV_PART_INDEX}=$PA_PART_INDEX "
            f"{wire.ENV_GRAM_SUBJOB_RANK}=$PA_PART_INDEX; unset PA_PART_INDEX")


class MultiJobRecord:
    """One multi-part job as the manager follows it."""

    def __init__(self, key: int, job_id: str, description: MultiJobDescription, name: str,
                 client_ref: Optional[str]) -> None:
        self.key = key
        self.job_id = job_id
        self.description = description
        self.name = name
        self.client_ref = client_ref
        #: part id -> the part's job key
        self.keys: Dict[int, int] = {}
        #: parts whose end was reported to the state machine (or that were deleted)
        self.ended: Set[int] = set()
        #: part id -> ranks whose end was reported
        self.ranks: Dict[int, Set[int]] = {}
        #: parts the manager asked their scheduler to cancel
        self.cancelling: Set[int] = set()
        #: parts deleted from the job (cancelled in their schedulers, no longer followed)
        self.deleted: Set[int] = set()
        #: parts being submitted right now
        self.submitting = 0
        self.forgotten = False
        self.last_state = JobState.PREPARING
        self.last_reason: Optional[str] = None


class RunningManager(ManagerCore):
    """The manager's core with the methods that carry out multi-part jobs (what a
    :class:`~.manager.CoallocManager` becomes with its first multi-part job)."""

    async def start_runtime(self) -> None:
        """Start the runtime server, once (the first multi-part job does).  A server that
        cannot start is reported; multi-part submissions are then refused with the reason."""
        async with self._starting:
            if self.ready.is_set() or self._nursery is None:
                return
            nursery = self._nursery
            try:
                if self.server is None:
                    self.server = self._make_server()
                await nursery.start(self.server.run)
            except (OSError, ValueError) as exc:
                self.failure = f"the runtime for multi-part jobs could not start: {exc}"
                log.error("%s", self.failure)
                self.service.notify("WARNING", self.failure)
                self.ready.set()
                return
            nursery.start_soon(self._examine_loop)
            self.ready.set()

    def _make_server(self) -> RuntimeServer:
        from .server import RuntimeServer

        settings = self.settings
        unix_path = settings.unix_path
        if unix_path is None:
            self._private_dir = tempfile.mkdtemp(prefix="proxy-agent-runtime-")
            unix_path = os.path.join(self._private_dir, "runtime.sock")
        return RuntimeServer(unix_path=unix_path, tcp_host=settings.tcp_host, tcp_port=settings.tcp_port,
                             advertise_host=settings.advertise_host)

    async def submit(self, spec: JobSpec, queue: Optional[int] = None, key: Optional[int] = None) -> int:
        """A multi-part job (or one part to add, when the spec names ``coallocJob``); returns
        the key of the multi-part job (of the added part's job)."""
        from .description import DescriptionError, parse_description
        text = spec.extra_value(DESCRIPTION_ATTRIBUTE) or ""
        target = spec.extra_value(JOB_ATTRIBUTE)
        if target is not None:
            try:
                job = int(target)
            except ValueError:
                raise SubmitError(f"{JOB_ATTRIBUTE} must name a multi-part job, not {target!r}",
                                  ErrorKind.BAD_REQUEST) from None
            return await self.add_part(job, text, client_ref=spec.client_ref)
        try:
            description = parse_description(text)
        except DescriptionError as exc:
            raise SubmitError(f"the multi-part job's description is wrong: {exc}", ErrorKind.BAD_REQUEST) from None
        return await self.cosubmit(description, name=spec.name, client_ref=spec.client_ref)

    async def cosubmit(self, description: Union[MultiJobDescription, str], *, name: Optional[str] = None,
                       client_ref: Optional[str] = None) -> int:
        """Submit every part of a multi-part job; the key of the multi-part job.

        The job is in the model when this returns: ``FAILED`` (with the reason) if a part could
        not be submitted, in which case the parts already submitted are being cancelled."""
        from .description import DescriptionError, parse_description
        if isinstance(description, str):
            try:
                description = parse_description(description)
            except DescriptionError as exc:
                raise SubmitError(f"the multi-part job's description is wrong: {exc}", ErrorKind.BAD_REQUEST) from None
        await self.start_runtime()
        server = self._server()
        job_id = server.register_job(description)
        state = server.job(job_id)
        name = name or description.name or job_id
        key = self.model.add(Kind.JOB, self._multi_queue(), {
            K.NAME: name,
            K.STATE: state.state.value,
            K.NATIVE_STATE: "AT_BARRIER",
            K.NUM_PROCS: str(sum(part.count for part in description.parts)),
            K.SUBMIT_TIME: time.strftime("%Y-%m-%dT%H:%M:%S"),
            ID_ATTRIBUTE: job_id,
            PARTS_ATTRIBUTE: str(len(description.parts)),
            **({K.CLIENT_REF: client_ref} if client_ref else {}),
        }, owner=COALLOC_NAME)
        record = MultiJobRecord(key, job_id, description, name, client_ref)
        self._records[key] = record
        log.info("multi-part job %s (%s): submitting %d parts", key, job_id, len(state.part_ids))
        record.submitting += 1
        try:
            for part_id in state.part_ids:
                if state.ended:
                    break
                await self._submit_part(record, part_id)
        finally:
            record.submitting -= 1
        self._settle(record)
        assert self._nursery is not None
        self._nursery.start_soon(self._follow, record)
        return key

    async def add_part(self, job: int, text: str, *, client_ref: Optional[str] = None) -> int:
        """Add one part (JSON or a ``&(...)`` conjunction) to a multi-part job whose barrier
        is not released yet; the key of the part's job."""
        from .description import DescriptionError, parse_part_json, parse_part_rsl
        from .state import CoordinationError
        record = self._record(job)
        try:
            part = parse_part_json(text) if text.lstrip()[:1] == "{" else parse_part_rsl(text)
        except DescriptionError as exc:
            raise SubmitError(f"the part's description is wrong: {exc}", ErrorKind.BAD_REQUEST) from None
        server = self._server()
        try:
            part_id = server.add_part(record.job_id, part)
        except CoordinationError as exc:
            raise SubmitError(f"cannot add a part to multi-part job {record.name}: {exc.message}",
                              _error_kind(exc)) from None
        self._settle(record)
        record.submitting += 1
        try:
            part_key = await self._submit_part(record, part_id, client_ref=client_ref, alone=True)
        finally:
            record.submitting -= 1
        self._settle(record)
        return part_key

    async def delete_part(self, job: int, part: Union[int, str]) -> None:
        """Delete a part (by its job's key, or by label) before the barrier is released, and
        cancel it in its scheduler."""
        from .state import CoordinationError
        record = self._record(job)
        if isinstance(part, int):
            found = self._parts.get(part)
            if found is None or found[0] is not record:
                raise JobError(f"job {part} is not a part of multi-part job {record.name}", ErrorKind.NO_SUCH_JOB)
            ref: Union[int, str] = found[1]
        else:
            ref = part
        try:
            part_id = self._server().delete_part(record.job_id, ref)
        except CoordinationError as exc:
            raise JobError(f"cannot delete the part: {exc.message}", _error_kind(exc)) from None
        record.deleted.add(part_id)
        log.info("multi-part job %s: part %s deleted", record.key, part_id)
        self._settle(record)
        part_key = record.keys.get(part_id)
        if part_key is not None:
            await self._terminate_part(record, part_id, part_key)

    async def release(self, job: int, wait_for_parts: bool = False) -> None:
        """Release the start barrier of a multi-part job (now, or once every part is in)."""
        from .state import CoordinationError
        record = self._record(job)
        try:
            self._server().release_barrier(record.job_id, wait_for_parts)
        except CoordinationError as exc:
            raise JobError(f"cannot release the barrier: {exc.message}", _error_kind(exc)) from None
        self._settle(record)

    async def terminate(self, job: int) -> None:
        """Cancel a multi-part job (every part), or delete a part before the release."""
        if job not in self._records:
            found = self._parts.get(job)
            if found is None:
                raise JobError("no such job", ErrorKind.NO_SUCH_JOB)
            await self.delete_part(found[0].key, job)
            return
        record = self._records[job]
        if record.forgotten:
            raise JobError(f"multi-part job {record.name} has ended", ErrorKind.OPERATION_FAILED)
        self._server().cancel(record.job_id)
        log.info("multi-part job %s: cancelled", job)
        self._settle(record)

    def _server(self) -> RuntimeServer:
        if self.failure is not None:
            raise SubmitError(self.failure, ErrorKind.UNAVAILABLE)
        if self.server is None or self._nursery is None or not self.ready.is_set():
            raise SubmitError("the runtime for multi-part jobs is not running", ErrorKind.UNAVAILABLE)
        return self.server

    def _record(self, job: int) -> MultiJobRecord:
        record = self._records.get(job)
        if record is None:
            if job in self._parts:
                record = self._parts[job][0]
                raise JobError(f"job {job} is a part of multi-part job {record.key}; name the multi-part job",
                               ErrorKind.BAD_REQUEST)
            raise JobError(f"no multi-part job {job}", ErrorKind.NO_SUCH_JOB)
        if record.forgotten:
            raise JobError(f"multi-part job {record.name} has ended", ErrorKind.OPERATION_FAILED)
        return record

    def _multi_queue(self) -> int:
        if self._queue is None or self._queue not in self.model:
            self._queue = self.model.add(Kind.QUEUE, None, {
                K.NAME: QUEUE_NAME, K.STATE: "NORMAL", K.BACKEND: COALLOC_NAME,
            }, owner=COALLOC_NAME)
        return self._queue

    async def _submit_part(self, record: MultiJobRecord, part_id: int, *, client_ref: Optional[str] = None,
                           alone: bool = False) -> int:
        """Submit one part to its scheduler.  A refusal fails the whole job (``alone``: the
        part is deleted again instead, and the refusal raised)."""
        from .state import CoordinationError
        server = self._server()
        state = server.job(record.job_id)
        part = state.part_spec(part_id)
        index = state.index_of(part_id)
        suffix = part.label if part.label is not None else str(part_id)
        what = state.part_name(part_id)
        try:
            backend_name, queue_label = self._placement(part)
            # Processes on this host reach the runtime by the Unix socket; every other
            # scheduler's by TCP when the agent listens there.
            remote = backend_name != "local" and server.tcp_contact is not None
            environment = server.environment(record.job_id, part_id, remote=remote)
            spec = part.to_job_spec(
                name=f"{record.name}.{suffix}",
                environment=tuple(environment.items()),
                client_ref=client_ref or (f"{record.client_ref}.{suffix}" if record.client_ref else None),
            )
            spec = attrs.evolve(spec, queue=queue_label)
            if backend_name != "local":
                # A batch job may start long after its submission, an earlier part deleted
                # meanwhile: its index is asked for when it starts.
                spec = attrs.evolve(spec, prologue=(*spec.prologue, index_at_start()))
            key = await self.service.submit(spec)
        except (ServiceError, CoordinationError, RuntimeError) as exc:
            why = exc.message if isinstance(exc, (ServiceError, CoordinationError)) else str(exc)
            if alone:
                try:
                    server.delete_part(record.job_id, part_id)
                except CoordinationError:
                    pass
                record.deleted.add(part_id)
                raise SubmitError(f"{what} could not be submitted: {why}",
                                  exc.kind if isinstance(exc, ServiceError) else ErrorKind.SUBMIT_FAILED) from None
            log.info("multi-part job %s: %s could not be submitted: %s", record.key, what, why)
            server.fail(record.job_id, f"{what} could not be submitted: {why}")
            return -1
        record.keys[part_id] = key
        record.ranks.setdefault(part_id, set())
        self._parts[key] = (record, part_id)
        if key in self.model:
            self.model.update(key, {JOB_ATTRIBUTE: record.key, PART_ATTRIBUTE: str(part_id)})
        log.info("multi-part job %s: %s (index %d) is job %s in %s", record.key, what, index, key, queue_label)
        self._examine(key)
        self._settle(record)
        return key

    def _placement(self, part) -> Tuple[str, str]:
        """The scheduler and ``SCHEDULER:QUEUE`` a part goes to, decided once (a broker may
        draw at random).  A queue that is only a scheduler's name (``slurm``, no queue of
        that name anywhere) means that scheduler's default queue."""
        service = self.service
        try:
            placement = service.route(part.to_job_spec())
        except ServiceError as exc:
            name = (part.queue or "").strip()
            if exc.kind is not ErrorKind.NO_SUCH_QUEUE or not name or ":" in name:
                raise
            try:
                backend = service.backend(name)
            except ServiceError:
                raise exc from None
            queue = backend.default_queue if backend in service.running_backends() else None
            if queue is None:
                raise SubmitError(f"the {name} scheduler has no queue to submit to (yet)", ErrorKind.UNAVAILABLE) from None
            return backend.name, service.queue_label(queue)
        return placement.backend.name, service.queue_label(placement.queue)

    def _dirty(self, key: int) -> None:
        self._pending.add(key)
        self._wake.set()

    async def _examine_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            pending, self._pending = self._pending, set()
            touched: Dict[int, MultiJobRecord] = {}
            for key in pending:
                try:
                    record = self._examine(key)
                except Exception:  # noqa: BLE001 - one job's trouble must not stop the others
                    log.exception("multi-part jobs: following job %s failed", key)
                    continue
                if record is not None:
                    touched[record.key] = record
            for record in touched.values():
                try:
                    self._settle(record)
                except Exception:  # noqa: BLE001
                    log.exception("multi-part job %s: settling failed", record.key)

    def _examine(self, key: int) -> Optional[MultiJobRecord]:
        """Tell the state machine what has ended of the part whose job is ``key``."""
        from .state import CoordinationError
        found = self._parts.get(key)
        if found is None:
            return None
        record, part_id = found
        if part_id in record.ended or part_id in record.deleted or record.forgotten:
            return record
        server = self.server
        assert server is not None
        model = self.model
        try:
            if key not in model:
                record.ended.add(part_id)
                server.part_ended(record.job_id, part_id, JobState.DELETED, "the job left its scheduler")
                return record
            reported = record.ranks.setdefault(part_id, set())
            for process in model.processes(key):
                element = model.get(process)
                ended = _final_state(model.attr(process, K.STATE))
                if ended is None or element.rank in reported:
                    continue
                reported.add(element.rank)
                if element.rank < server.job(record.job_id).part_spec(part_id).count:
                    server.process_ended(record.job_id, part_id, element.rank, failed=ended is not JobState.FINISHED)
            ended = _final_state(model.attr(key, K.STATE))
            if ended is not None:
                record.ended.add(part_id)
                message = model.attr(key, K.MESSAGE)
                server.part_ended(record.job_id, part_id, ended, message if isinstance(message, str) and message else None)
        except CoordinationError as exc:
            # a part deleted meanwhile, or the job already forgotten: nothing to report
            log.debug("multi-part job %s: part %s: %s", record.key, part_id, exc)
        return record

    def _settle(self, record: MultiJobRecord) -> None:
        """Carry out what the state machine has decided: cancel the parts of a job that has
        failed or was cancelled, show the job's state, and forget a job that is over."""
        state = self._state(record)
        if state is None:
            return
        if state.ended and self._nursery is not None:
            for part_id, key in record.keys.items():
                if part_id not in record.ended and part_id not in record.deleted and part_id not in record.cancelling:
                    self._nursery.start_soon(self._terminate_part, record, part_id, key)
        record.last_state = state.state
        record.last_reason = state.reason
        if record.key in self.model:
            native = "ENDED" if state.ended else "RELEASED" if state.released else "AT_BARRIER"
            self.model.update(record.key, {
                K.STATE: state.state.value,
                K.NATIVE_STATE: native if not state.state.final else state.state.value,
                K.MESSAGE: state.reason or "",
                PARTS_ATTRIBUTE: str(len(state.part_ids)),
                K.NUM_PROCS: str(sum(state.part_spec(p).count for p in state.part_ids)),
            })
        over = state.state.final and record.submitting == 0 and all(
            part_id in record.ended or part_id in record.deleted for part_id in record.keys
        )
        if over:
            self._forget(record)

    def _forget(self, record: MultiJobRecord) -> None:
        record.forgotten = True
        if self.server is not None:
            self.server.forget(record.job_id)
        for key in record.keys.values():
            self._parts.pop(key, None)
        if record.key in self.model:
            self.model.update(record.key, {K.END_TIME: time.strftime("%Y-%m-%dT%H:%M:%S")})
        log.info("multi-part job %s (%s) is over: %s %s", record.key, record.job_id, record.last_state.value,
                 record.last_reason or "")

    async def _terminate_part(self, record: MultiJobRecord, part_id: int, key: int) -> None:
        record.cancelling.add(part_id)
        for delay in (0.0,) + _CANCEL_RETRY:
            await trio.sleep(delay)
            if key not in self.model or _final_state(self.model.attr(key, K.STATE)) is not None:
                break
            try:
                await self.service.job_owner(key).terminate(key)
                return
            except Exception as exc:  # noqa: BLE001 - a scheduler's refusal or failure: try again
                if not isinstance(exc, ServiceError):
                    log.exception("multi-part job %s: cancelling part job %s failed", record.key, key)
                    continue
                if _final_state(self.model.attr(key, K.STATE)) is not None:
                    return
                log.warning("multi-part job %s: cancelling part job %s failed: %s", record.key, key, exc.message)
        else:
            if key in self.model and _final_state(self.model.attr(key, K.STATE)) is None:
                self.service.notify("ERROR", f"multi-part job {record.name}: its part job {key} could not be "
                                             f"cancelled; cancel it in its scheduler")
        self._dirty(key)

    async def _follow(self, record: MultiJobRecord) -> None:
        """Show the job's state as it changes without a service call (the barrier's release)."""
        from .state import CoordinationError
        server = self.server
        assert server is not None
        version = -1
        while not record.forgotten:
            try:
                version = await server.wait_changed(record.job_id, version)
                self._settle(record)
            except CoordinationError:
                return
            except Exception:  # noqa: BLE001 - the agent serves on; the job is reported stuck
                log.exception("multi-part job %s: following it failed", record.key)
                return


def _final_state(value: object) -> Optional[JobState]:
    if not isinstance(value, str):
        return None
    try:
        state = JobState(value)
    except ValueError:
        return None
    return state if state.final else None


def _error_kind(error: CoordinationError) -> ErrorKind:
    """A refusal names something wrong in the request; the rest (not allowed now, the job
    has ended, a limit) are operations that failed."""
    from .state import Refused
    return ErrorKind.BAD_REQUEST if isinstance(error, Refused) else ErrorKind.OPERATION_FAILED
