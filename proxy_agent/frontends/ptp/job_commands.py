"""A PTP session's job commands: SUBMIT_JOB, TERMINATE_JOB, CHANGE_JOB, MOVE_JOB and
GET_OUTPUT turned into service calls, the client's element ids into service keys, and a
service's neutral errors into the PTP errors the client matches."""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import attrs
import trio

from ...protocol.attributes import AttributeSet
from ...protocol.messages import Command, CommandId, Error, ErrorCode, Ok
from ...protocol.session import Transaction
from ...service.jobs import ErrorKind, JobError, SchedulersDown, ServiceError, SubmitError
from ...service.model import Kind, UnknownElement
from ...service.service import describe
from . import mapping

log = logging.getLogger("proxy_agent.frontends.ptp")

#: Longest a job request may take once started (a scheduler command has its own timeout).
REQUEST_BOUND = 120.0
#: Characters of output lines per OUTPUT event (a longer line goes alone).
OUTPUT_EVENT_TEXT = 64 * 1024


class JobCommands:
    """The job commands of a :class:`~.session.PtpSession` (see the module documentation)."""

    def _job_key(self, text: Optional[str]) -> int:
        """The service key of the job a client's element id names; JobError if none."""
        raw = (text or "").strip()
        assert self.view is not None
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
            raise JobError(f"no job with id {text!r}: ids are decimal numbers", ErrorKind.NO_SUCH_JOB)
        key = self.view.key_of(int(raw))
        try:
            self.service.model.find(key, Kind.JOB)
        except UnknownElement:
            raise JobError(f"no job with id {raw}", ErrorKind.NO_SUCH_JOB) from None
        return key

    def _queue_ref(self, text: str):
        """A client's queue reference: its element id -> the queue's key; a name as it is."""
        raw = text.strip()
        assert self.view is not None
        if raw.isascii() and raw.isdigit() and len(raw) <= 19:
            key = self.view.key_of(int(raw))
            if key in self.service.model and self.service.model.get(key).kind is Kind.QUEUE:
                return key
            raise ServiceError(f"no queue with id {text!r}", ErrorKind.NO_SUCH_QUEUE)
        return raw

    async def _job_command(self, command: Command, transaction: Optional[Transaction]) -> None:
        cid = command.command_id
        attrs_ = AttributeSet.parse(command.args)
        if self.view is None:
            self._fail(command, transaction, attrs_, ErrorCode.ILLEGAL_IN_PHASE, "the session is not initialised")
            return
        # A submission goes to the service alone (which says if no scheduler runs): see _submit.
        if not await self._service_ready(command, transaction, check=cid is not CommandId.SUBMIT_JOB):
            return
        # A request, once made, is carried out even if the client leaves meanwhile (a job
        # submitted but not recorded would run unseen); bounded so shutdown still ends.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + REQUEST_BOUND):
            await self._carry_out(command, transaction, attrs_)

    async def _carry_out(self, command: Command, transaction: Optional[Transaction], attrs_: AttributeSet) -> None:
        cid = command.command_id
        tid = command.tid
        assert self.view is not None
        service = self.service
        try:
            if cid is CommandId.SUBMIT_JOB:
                await self._submit(tid, transaction, attrs_)
                return
            elif cid is CommandId.TERMINATE_JOB:
                await service.terminate(self._job_key(attrs_.get("jobId")))
            elif cid is CommandId.CHANGE_JOB:
                key = self._job_key(attrs_.get("jobId"))
                what, flag = mapping.job_change(attrs_)
                if what == "hold":
                    await service.hold(key, flag)
                elif what == "release":
                    await service.release_barrier(key, flag)
                else:
                    await service.suspend(key, flag)
            elif cid is CommandId.MOVE_JOB:
                key = self._job_key(attrs_.get("jobId"))
                queue = self._queue_ref(attrs_.get("queueId") or "")
                await service.move(key, queue)
            elif cid is CommandId.GET_OUTPUT:
                await self._send_output(command, transaction, attrs_)
            else:  # pragma: no cover - the session only lets known commands through
                raise JobError(f"{command.name} is not handled", ErrorKind.NOT_SUPPORTED)
        except SchedulersDown as exc:
            self.emit(Error(tid, ErrorCode.SCHEDULER, exc.message), transaction)
        except ServiceError as exc:
            log.info("%s (TID %d) failed: %s", command.name, tid, exc.message)
            code = mapping.error_code(exc.kind)
            if isinstance(exc, SubmitError) and exc.kind is ErrorKind.SUBMIT_FAILED:
                code = ErrorCode.SUBMIT_FAILED
            self._fail(command, transaction, attrs_, code, exc.message)
        except Exception as exc:  # noqa: BLE001 - one command's failure must not end the session
            log.exception("internal error in %s (TID %d)", command.name, tid)
            self._fail(command, transaction, attrs_, ErrorCode.INTERNAL, f"internal error: {describe(exc)}")
        else:
            self.emit(Ok(tid), transaction, changes_first=True)

    async def _submit(self, tid: int, transaction: Optional[Transaction], attrs_: AttributeSet) -> None:
        """SUBMIT_JOB: the client's attributes become a job description, the service submits it
        (routes, numbers, records and hands it to one backend), and the OK is queued.

        The job is held back from this client (nothing else is) until the writer takes the
        OK: the view reads the submissions in flight from ``view.expected`` as the model
        tells it of the job, and hears of the answer from the writer (``_tell_answered``).
        So the submitting task goes front-end, service, backend, model, view, and back, and
        renders nothing itself."""
        spec = mapping.job_spec(attrs_, self._queue_ref, self._job_key)
        if spec.working_dir is None and self.config.working_dir is not None:
            spec = attrs.evolve(spec, working_dir=self.config.working_dir)
        assert self.view is not None
        sub_id = spec.client_ref or ""
        expected = self.view.expected
        if sub_id:
            expected[sub_id] = expected.get(sub_id, 0) + 1
        job: Optional[int] = None
        try:
            job = await self.service.submit(spec, self.config.prefer)
            self.submitted.append(job)
            log.info("submitted %s as job %d", spec.client_ref, job)  # the job's id, as every tool names it
            self.emit(Ok(tid), transaction)  # the job it made is held back anyway: see above
        finally:
            self._answered.append((sub_id, job))
            self._poke()

    async def _send_output(self, command: Command, transaction: Optional[Transaction], attrs_: AttributeSet) -> None:
        """GET_OUTPUT: the job's kept output as OUTPUT events (the OK follows).  Any job the
        store keeps, in the model or not; ``stream=``, ``rank=`` choose, and each
        ``skip=RANK.STREAM:N`` leaves out lines the client has already."""
        from ...protocol.messages import OutputEvent

        assert self.view is not None
        raw = (attrs_.get("jobId") or "").strip()
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
            raise JobError(f"no job with id {raw!r}: ids are decimal numbers", ErrorKind.NO_SUCH_JOB)
        streams: Tuple[str, ...] = ("stdout", "stderr")
        stream = attrs_.get("stream")
        if stream is not None:
            if stream not in streams:
                raise JobError(f"stream must be stdout or stderr, got {stream!r}", ErrorKind.BAD_REQUEST)
            streams = (stream,)
        rank = None
        if attrs_.get("rank") is not None:
            rank = mapping.parse_decimal(attrs_.get("rank"), "rank")
        skip = {}
        for item in attrs_.getall("skip"):
            where, _, count = item.rpartition(":")
            number, _, stream = where.partition(".")
            if stream not in ("stdout", "stderr") or not number.isdigit() or not count.isdigit():
                raise JobError(f"skip={item!r} is not RANK.STREAM:LINES (0.stdout:12)", ErrorKind.BAD_REQUEST)
            skip[(int(number), stream)] = int(count)
        element_id = int(raw)
        kept = await self.service.job_output(self.view.key_of(element_id), streams=streams, rank=rank, skip=skip)
        for part in kept.streams:
            first, lines = part.first, part.lines
            while True:
                count, size = 0, 0
                while count < len(lines) and (count == 0 or size + len(lines[count]) < OUTPUT_EVENT_TEXT):
                    size += len(lines[count]) + 1
                    count += 1
                self.emit(OutputEvent(command.tid, str(element_id), part.rank, part.stream, first, part.dropped,
                                      "\n".join(lines[:count])), transaction)
                lines, first = lines[count:], first + count
                if not lines:
                    break

    def _fail(self, command: Command, transaction: Optional[Transaction], attrs_: AttributeSet, code: int,
              message: str) -> None:
        from ...protocol.messages import SubmitJobError, TerminateJobError

        cid = command.command_id
        if cid is CommandId.SUBMIT_JOB:
            self.emit(SubmitJobError(command.tid, attrs_.get("jobSubId") or "", code, message), transaction)
        elif cid is CommandId.TERMINATE_JOB:
            self.emit(TerminateJobError(command.tid, attrs_.get("jobId") or "", code, message), transaction)
        else:
            self.emit(Error(command.tid, code, message), transaction)
