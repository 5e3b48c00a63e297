"""The protocol's commands as the client sends them (INIT, MODEL_DEF, START_EVENTS, job
commands, QUIT...) and what each waits for."""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

import trio

from ..protocol.messages import (
    AttrDef, CommandId, Error, ErrorCode, Event, Ok, Shutdown, SubmitJobError, TerminateJobError,
)
from ..protocol.dialect import DEFAULT
from .errors import ClientError, CommandFailed, ConnectionClosed, TokenRefused, WaitFailed
from .state import PROTOCOL_VERSION, Element, OpenCommand
from .kept import attribute_text, job_attributes
from .mirror import states_text

class Commands:
    """The commands of an :class:`~.connection.AgentClient` (see the module documentation)."""

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
        a built-in broker, see ``proxy_agent.service.broker_names``, or module:Class)."""
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
                shown = self.state.job_key(job.id) or job.id  # as the agent's log and job list name it
                raise WaitFailed(f"job {shown} ({sub_id}) ended without a JOB_CHANGE saying RUNNING "
                                 f"(went {states_text(job)}): the IDE's launch of it would never complete")
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
            args.extend(f"{key}={attribute_text(v)}" for v in values)
        return await self.command(CommandId.CHANGE_JOB, *args, timeout=timeout)

    async def move_job(self, job: Union[str, Element], queue: str, *, timeout: Optional[float] = 60) -> Event:
        found = self._find_queue(queue)
        queue_id = found.id if found is not None else queue
        return await self.command(CommandId.MOVE_JOB, f"jobId={self._job_id(job)}", f"queueId={queue_id}", timeout=timeout)

