"""The console's commands, run against an :class:`~proxy_agent.client.AgentClient`.

Each command is a method ``cmd_<name>(args)``.  A command that cannot do
what was asked raises (:class:`CommandError` for the console's own
complaints, the client's errors otherwise); :meth:`Console.execute` turns
that into one error line and a False result.  Errors that end the session
(protocol violation, agent gone) are not caught there: they end the console.

The commands that act on jobs are in :mod:`.job_commands`, those that follow a job's output
and states in :mod:`.watching`; the language (commands, usage, splitting, submit options) is
:mod:`.language`, how a job ended :mod:`.outcome`.
"""

from __future__ import annotations

import signal
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import trio

from ..client import (
    AgentClient, ClientError, ConnectionClosed, Element, ProtocolViolationError, Traffic, UnknownElementError,
)
from ..client.state import OUTPUT_KEYS, PROTOCOL_VERSION, canonical_id
from ..protocol.messages import (
    CommandId, ElementChange, ElementKind, Error, Event, NewElements, Ok, ProcessChange, Shutdown,
)
from ..protocol.wire import FrameError
from ..service.jobs import NEVER_STARTS
from . import render
from .terminal import Output
from .job_commands import JobCommands
from .language import ALIASES, COMMANDS, SPECS, CommandError, command_text, parse_submit, seconds_arg, split_commands
from .outcome import exit_codes
from .watching import JobWatching

# The console's face: the language's names its users need come from here too.
__all__ = ["Console", "CommandError", "parse_submit", "split_commands", "COMMANDS"]


class Console(JobCommands, JobWatching):
    """Runs console commands and shows what the agent sends."""

    def __init__(
        self,
        client: AgentClient,
        output: Output,
        *,
        trace: bool = False,
        quiet: bool = False,
        timeout: Optional[float] = None,
        reply_timeout: float = 10.0,
        token: Optional[str] = None,
        base_id: int = 1000,
        interactive: bool = False,
    ) -> None:
        self.client = client
        self.out = output
        self.json = output.json_mode
        self.trace = trace
        self.quiet = quiet
        self.timeout = timeout
        #: how long ``raw`` waits for a reply
        self.reply_timeout = reply_timeout
        self.token = token
        self.base_id = base_id
        self.interactive = interactive
        self.finished = False
        self.last_job: Optional[str] = None
        #: well-formed frames received from the agent so far
        self.frames_in = 0
        #: the bytes of the first frame (or of what arrived instead of one)
        self.first_bytes: Optional[bytes] = None
        #: every jobStatus each job was seen in, in order (the client keeps only jobState)
        self.statuses: Dict[str, List[str]] = {}
        self._followed: set = set()
        #: jobs whose live output is not printed as it comes (an ``output`` command prints it)
        self._silenced: set = set()
        #: the exit status of the last command that failed (see :attr:`CommandError.exit_status`)
        self.failed_status = 1
        #: the first START_EVENTS' model is shown as a summary, not event by event
        self._opening = False
        self._model_shown = False
        # per job: output lines printed, and lines delivered by the events shown so far
        self._printed: Dict[str, int] = {}
        self._delivered: Dict[str, int] = {}
        self._command_scope: Optional[trio.CancelScope] = None
        client.add_listener(self._on_traffic)

    # ------------------------------------------------------------------ showing events

    def _on_traffic(self, traffic: Traffic) -> None:
        if self.trace:
            if self.json:
                self.out.record(render.trace_record(traffic))
            else:
                for text in render.trace_lines(traffic):
                    self.out.note(text)
        if traffic.direction != "in":
            return
        if self.first_bytes is None:
            self.first_bytes = traffic.raw
        if traffic.frame is not None and not isinstance(traffic.frame, FrameError):
            self.frames_in += 1
        for violation in traffic.violations:
            if self.frames_in == 0 and violation.rule == "framing":
                continue  # garbage before the first frame: the fatal error explains it
            if self.json:
                self.out.record({"type": "violation", "rule": violation.rule, "message": str(violation)})
            else:
                self.out.note(f"protocol violation: {violation}")
        event = traffic.message
        if not isinstance(event, Event) or isinstance(event, (Ok, Error, Shutdown)):
            return
        self._note_statuses(event)
        opening = self._opening and isinstance(event, (NewElements, ElementChange))
        if self.json:
            if not self.quiet and not opening:
                self.out.record(render.event_record(event, self.client.state))
        elif not self.quiet and not opening:
            self.out.lines(render.event_lines(self.client.state, event))
        if isinstance(event, ProcessChange):
            delivered = output_lines_in(event)
            if delivered:
                job_id = canonical_id(event.job_id)
                self._delivered[job_id] = self._delivered.get(job_id, 0) + delivered
                self._flush_output(job_id)

    def _note_statuses(self, event: Event) -> None:
        if not isinstance(event, (NewElements, ElementChange)) or isinstance(event, ProcessChange):
            return
        if event.kind is not ElementKind.JOB:
            return
        for group in event.groups:
            status = next((v for k, v in group.attributes if k == "jobStatus"), None)
            if status is None:
                continue
            for job_id in ([canonical_id(group.ids)] if isinstance(group.ids, str) else [str(i) for i in group.ids]):
                seen = self.statuses.setdefault(job_id, [])
                if not seen or seen[-1] != status:
                    seen.append(status)

    def _flush_output(self, job_id: str) -> None:
        """Print the job's output lines not printed yet, up to those the events shown so far
        delivered (text mode, unless quiet and not followed): lines print where their event
        came, not where the mirror is by the time the listener runs."""
        if self.json:
            return
        job = self.client.find_job(job_id)
        if job is None:
            return
        if job.id in self._silenced:  # an ``output`` command prints it
            self._printed[job.id] = len(job.output)
            return
        if self.quiet and job.id not in self._followed:
            return
        start = self._printed.get(job.id, 0)
        end = min(self._delivered.get(job.id, len(job.output)), len(job.output))
        for line in job.output[start:end]:
            self.out.line(render.output_line(self.client.state, line))
        self._printed[job.id] = max(start, end)

    # ------------------------------------------------------------------ results

    def result(self, command: str, text_lines: Iterable[str] = (), **fields: Any) -> None:
        if self.json:
            self.out.record({"type": "result", "command": command, "ok": True, **fields})
        else:
            self.out.lines(text_lines)

    def failure(self, words: Sequence[str], message: str, index: Optional[int] = None, **fields: Any) -> None:
        where = f"command {index} " if index is not None else ""
        text = f"{where}failed: {command_text(words)}: {message}" if index is not None else f"error: {message}"
        if self.json:
            record = {"type": "result", "command": words[0] if words else "", "ok": False, "error": message, "line": command_text(words)}
            record.update(fields)
            self.out.record(record)
        self.out.note(f"proxy-console: {text}" if index is not None else text)

    def warning(self, text: str) -> None:
        """A warning line on stderr (also under --json, where stdout holds only records)."""
        self.out.note(f"warning: {text}")

    # ------------------------------------------------------------------ running commands

    def resolve(self, name: str) -> Optional[Callable]:
        name = ALIASES.get(name, name)
        if name not in SPECS:
            return None
        return getattr(self, f"cmd_{name}")

    async def execute(self, words: Sequence[str], index: Optional[int] = None) -> bool:
        """Run one command; False (after an error line) if it failed."""
        if not words:
            return True
        handler = self.resolve(words[0])
        if handler is None:
            self.failure(words, f"unknown command {words[0]!r} (type 'help' for the list)", index)
            return False
        try:
            with trio.CancelScope() as scope:
                self._command_scope = scope
                await handler(list(words[1:]))
            if scope.cancelled_caught:
                if self.json:
                    self.out.record({"type": "result", "command": words[0], "ok": False, "error": "interrupted", "line": command_text(words)})
                self.out.note("interrupted")
                return False
            return True
        except (ProtocolViolationError, ConnectionClosed):
            raise
        except CommandError as exc:
            self.failed_status = exc.exit_status or 1
            fields = dict(exc.fields, exit_status=exc.exit_status) if exc.exit_status is not None else exc.fields
            self.failure(words, str(exc), index, **fields)
            return False
        except ClientError as exc:
            self.failed_status = 1
            self.failure(words, str(exc), index)
            return False
        finally:
            self._command_scope = None

    def interrupt(self) -> bool:
        """Ctrl-C: cancel the running command; False if none was running."""
        if self._command_scope is None:
            return False
        self._command_scope.cancel()
        return True

    async def watch_interrupts(self) -> None:
        """Interactive mode: Ctrl-C stops the running command instead of the console."""
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                if not self.interrupt():
                    self.out.note("(type 'quit' or press Ctrl-D to leave)")

    async def startup(self) -> None:
        """INIT, MODEL_DEF, START_EVENTS."""
        await self.client.init(self.base_id, token=self.token)
        definitions = await self.client.model_def()
        await self._start_events()
        peer = self.client.peer
        if self.json:
            self.out.record({"type": "connected", "peer": peer, "base_id": self.base_id, "attribute_definitions": len(definitions)})
        else:
            self.out.note(f"connected to {peer}: {len(definitions)} attribute definitions, events started")

    async def finish(self, send_quit: bool) -> None:
        """End of input: QUIT (spawned agents) or just leave."""
        if self.finished or self.client.ended is not None:
            return
        self.finished = True
        if send_quit:
            with trio.move_on_after(10):
                await self.client.quit()

    async def _start_events(self) -> None:
        """START_EVENTS; the first time, the model that comes is shown in a few lines, not
        event by event (a cluster of thousands of jobs would fill screens)."""
        if self._model_shown:
            await self.client.start_events()
            return
        self._opening = True
        try:
            await self.client.start_events()
        finally:
            self._opening = False
        self._model_shown = True
        if self.quiet:
            return
        if self.json:
            self.out.record(render.model_record(self.client.state))
        else:
            self.out.lines(render.model_summary(self.client.state))

    def completions(self, text: str, words: List[str]) -> List[str]:
        """Tab completion: command names first, then job ids, jobSubIds, queue and element ids."""
        if not words:
            names = sorted(set(SPECS) | set(ALIASES))
            return [n + " " for n in names if n.startswith(text)]
        candidates: List[str] = []
        try:
            state = self.client.state
            command = ALIASES.get(words[0], words[0])
            jobs = list(state.by_kind["job"].values())
            job_refs = [render.job_label(state, j.id) for j in jobs] + list(state.jobs_by_sub) + [j.name for j in jobs]
            if command in ("move",) and len(words) == 2:
                pool = [q.name or q.id for q in list(state.by_kind["queue"].values())] + list(state.by_kind["queue"])
            elif command == "show":
                pool = job_refs + [e for e in state.elements if isinstance(e, str)]
            else:
                pool = job_refs
            candidates = sorted({c for c in pool if c.startswith(text)})
        except RuntimeError:  # the model changed under us (another thread); try again next time
            return []
        return [c + " " for c in candidates]

    # ------------------------------------------------------------------ helpers

    def _job(self, ref: str, *, latest: bool = True) -> Element:
        """The job a user names: ``.`` (the last submitted), its id (as ``jobs`` and
        ``proxy-agent jobs`` show it), its jobSubId, or its name.  Several jobs of that name:
        the latest (``latest``), else an error listing their ids."""
        state = self.client.state
        if ref == "." and self.last_job is not None:
            found = self.client.find_job(self.last_job)
            if found is not None:
                return found
        if ref.isascii() and ref.isdigit():
            found = state.job_by_key(int(ref))
            if found is not None:
                return found
        found = state.jobs_by_sub.get(ref)
        if found is not None:
            return found
        named = [job for job in state.by_kind["job"].values() if job.name == ref]
        if len(named) == 1 or (named and latest):
            return max(named, key=lambda job: state.job_key(job.id) or 0)
        if named:
            ids = ", ".join(sorted((render.job_label(state, job.id) for job in named), key=number_first))
            raise CommandError(f"{len(named)} jobs are named {ref!r} (ids {ids}); give the id of one")
        raise UnknownElementError(f"no job {ref} (give its id, as 'jobs' shows it, its jobSubId or its name)")

    def _job_ref(self, ref: str) -> str:
        """For commands that act on a job: its element id, for the protocol (a name must be
        one job's)."""
        return self._job(ref, latest=False).id

    def _label(self, job: Union[Element, str]) -> str:
        """A job's id as shown (see :func:`render.job_label`)."""
        return render.job_label(self.client.state, job.id if isinstance(job, Element) else job)

    def _id_value(self, job: Union[Element, str]) -> Union[int, str, None]:
        """A job's id for JSON."""
        return render.job_id_value(self.client.state, job.id if isinstance(job, Element) else job)

    def _one_arg(self, name: str, args: Sequence[str]) -> str:
        if len(args) != 1:
            raise CommandError(f"usage: {SPECS[name].usage}")
        return args[0]

    def _wait_timeout(self, given: Optional[float]) -> Optional[float]:
        return given if given is not None else self.timeout

    async def _follow(self, job: Element, timeout: Optional[float]) -> None:
        """Show the job's output as it arrives until it completes."""
        self._followed.add(job.id)
        try:
            self._flush_output(job.id)
            await self._wait_job_state(job, "COMPLETED", timeout)
        finally:
            self._followed.discard(job.id)

    def _check_startable(self, job: Element, state: str) -> None:
        """Stop a wait for ``state`` at once if the agent says the job will never start."""
        message = job.get("jobStatusMessage")
        if job.state == "STARTING" and state != "STARTING" and isinstance(message, str) and message.startswith(NEVER_STARTS):
            raise CommandError(
                f"job {self._label(job)} {message} (it stays queued; 'terminate {self._label(job)}' removes it)",
                job=self._id_value(job), state=job.state, status=job.get("jobStatus"), status_message=message,
            )

    async def _wait_job_state(self, job: Element, state: str, timeout: Optional[float]) -> None:
        """:meth:`AgentClient.wait_job_state`, given up as soon as the job is known never to start."""
        self._check_startable(job, state)
        client = self.client

        def reached() -> bool:
            if state in job.states or job.removed or job.state == "COMPLETED":
                return True
            self._check_startable(job, state)
            return False

        await client.wait_for(reached, timeout,
                              description=lambda: f"job {self._label(job)} to reach {state} (now {job.state})")
        await client.wait_job_state(job, state, 0)

    def _job_end_line(self, job: Element) -> str:
        codes = exit_codes(self.client, job)
        tail = ""
        if len(codes) == 1:
            tail = f" (exit status {codes[0]})"
        elif codes:
            tail = f" (exit statuses {','.join(codes)})"
        return render.element_summary(job, state=self.client.state) + tail

    # ------------------------------------------------------------------ commands

    async def cmd_help(self, args: List[str]) -> None:
        if args:
            spec = SPECS.get(ALIASES.get(args[0], args[0]))
            if spec is None:
                raise CommandError(f"no command {args[0]!r}")
            self.result("help", [f"usage: {spec.usage}", f"  {spec.summary}"], usage=spec.usage, summary=spec.summary)
            return
        width = max(len(spec.usage) for spec in COMMANDS if len(spec.usage) < 40)
        lines = ["commands (separate several with ';'; JOB is a job's id, its jobSubId, its name, or '.' for the "
                 "last submitted):"]
        for spec in COMMANDS:
            summary = spec.summary.split(";")[0]
            if len(spec.usage) <= width:
                lines.append(f"  {spec.usage.ljust(width)}  {summary}")
            else:
                lines.append(f"  {spec.usage}")
                lines.append(f"  {'':{width}}  {summary}")
        self.result("help", lines, commands=[{"usage": s.usage, "summary": s.summary} for s in COMMANDS])

    def _listing(self, command: str, kind: str, headers: Sequence[str], row: Callable[[Element], Sequence[Any]]) -> None:
        elements = render.sorted_elements(self.client.state.by_kind[kind].values())
        lines = render.table(headers, (row(e) for e in elements)) if elements else [f"no {command}"]
        self.result(command, lines, **{command: [render.element_record(e, self.client.state) for e in elements]})

    async def cmd_jobs(self, args: List[str]) -> None:
        client = self.client

        def row(job: Element) -> Sequence[Any]:
            # queueId follows MOVE_JOB; the parent link cannot (the protocol has no re-parenting)
            queue_id = job.get("queueId")
            queue = client.state.elements.get(queue_id if isinstance(queue_id, str) else job.parent or "")
            procs = len(client.children(job, "process")) or job.get("jobNumProcs", "")
            return (self._label(job), job.sub_id or "", job.name, job.state or "", job.get("jobStatus", ""),
                    (queue.name or queue.id) if queue else (queue_id or job.parent), procs)

        self._listing("jobs", "job", ("ID", "SUBID", "NAME", "STATE", "STATUS", "QUEUE", "PROCS"), row)

    async def cmd_nodes(self, args: List[str]) -> None:
        client = self.client

        def row(node: Element) -> Sequence[Any]:
            machine = client.state.elements.get(node.parent or "")
            return (node.id, node.name, node.state or "", (machine.name or machine.id) if machine else node.parent)

        self._listing("nodes", "node", ("ID", "NAME", "STATE", "MACHINE"), row)

    async def cmd_queues(self, args: List[str]) -> None:
        client = self.client
        self._listing(
            "queues", "queue", ("ID", "NAME", "STATE", "JOBS"),
            lambda q: (q.id, q.name, q.state or "", len(client.children(q, "job"))),
        )

    async def cmd_machines(self, args: List[str]) -> None:
        client = self.client
        self._listing(
            "machines", "machine", ("ID", "NAME", "STATE", "NODES"),
            lambda m: (m.id, m.name, m.state or "", len(client.children(m, "node"))),
        )

    async def cmd_show(self, args: List[str]) -> None:
        ref = self._one_arg("show", args)
        client = self.client
        state = client.state
        try:
            element = self._job(ref)
        except UnknownElementError:
            element = client.element(ref)
        lines = [render.element_summary(element, state=state)]
        parent = state.elements.get(element.parent or "")
        if parent is not None:
            lines.append(f"  parent: {render.element_summary(parent, state=state)}")
        for key in sorted(element.attributes):
            lines.append(f"  {key} = {render.value_text(element.attributes[key])}")
        if element.kind in ("job", "process") and element.states:
            lines.append(f"  states seen: {' -> '.join(element.states)}")
        children = client.children(element)
        for child in render.sorted_elements(children)[:50]:
            text = render.element_summary(child, state=state)
            if child.kind == "process":
                code = child.get("processExitCode")
                text += f" exit {code}" if isinstance(code, str) else ""
            lines.append(f"  child: {text}")
        if len(children) > 50:
            lines.append(f"  ... and {len(children) - 50} more children")
        if element.output:
            out = sum(1 for line in element.output if line.stream == "stdout")
            lines.append(f"  output: {out} stdout lines, {len(element.output) - out} stderr lines seen "
                         f"(all of it: 'output {render.element_label(state, element)}')")
        record = render.element_record(element, state)
        record["children"] = [render.element_record(c, state)["id"] for c in children]
        self.result("show", lines, element=record)

    async def cmd_stop(self, args: List[str]) -> None:
        await self.client.stop_events()
        self.result("stop", ["events stopped"])

    async def cmd_start(self, args: List[str]) -> None:
        await self._start_events()
        self.result("start", ["events started"])

    async def cmd_attrs(self, args: List[str]) -> None:
        defs = self.client.attr_defs
        if args:
            key = args[0]
            if key not in defs:
                raise CommandError(f"no attribute definition {key!r} (type 'attrs' for the list)")
            d = defs[key]
            lines = [f"{d.id}: {d.type.value} {d.name!r}", f"  {d.description}", f"  default {d.default!r}, display {d.display}"]
            if d.values:
                lines.append(f"  values: {' '.join(d.values)}")
            if d.minimum is not None or d.maximum is not None:
                lines.append(f"  range: {d.minimum} .. {d.maximum}")
            self.result("attrs", lines, definition=definition_record(d))
            return
        if not defs:
            self.result("attrs", ["no attribute definitions (MODEL_DEF not sent yet?)"], definitions=[])
            return
        rows = []
        for d in defs.values():
            extra = " ".join(d.values) if d.values else d.default
            rows.append((d.id, d.type.value, d.name, extra))
        self.result("attrs", render.table(("ID", "TYPE", "NAME", "DEFAULT/VALUES"), rows), definitions=[definition_record(d) for d in defs.values()])

    async def cmd_raw(self, args: List[str]) -> None:
        tid: Optional[int] = None
        wait = True
        words = list(args)
        while words and words[0].startswith("--"):
            option = words.pop(0)
            if option == "--tid" and words:
                tid = number_arg(words.pop(0), "raw --tid")
            elif option == "--no-wait":
                wait = False
            else:
                raise CommandError(f"usage: {SPECS['raw'].usage}")
        if not words:
            raise CommandError(f"usage: {SPECS['raw'].usage}")
        command_id = number_arg(words[0], "raw: command id")
        if command_id > 0xFFFF:
            raise CommandError("raw: command ids have 4 hex digits (at most 0xFFFF)")
        if command_id in (CommandId.START_EVENTS, CommandId.STOP_EVENTS):
            wait = False  # they complete only when the other one is sent
        command = await self.client.raw(command_id, words[1:], tid=tid, wait=False)
        if not wait:
            self.result("raw", [f"sent {command.name} (TID {command.tid})"], tid=command.tid, done=command.done)
            return
        await self.client.wait_for(lambda: command.done, self.reply_timeout,
                                   description=f"the reply to {command.name} (TID {command.tid})")
        reply = command.completion
        if reply is None:
            text = f"{command.name} (TID {command.tid}): {command.failure}"
            name = None
        else:
            name = reply.event_id.name
            detail = ""
            if hasattr(reply, "message"):
                detail = f": {reply.message} (error {reply.code})"
            text = f"{name} (TID {command.tid}){detail}"
        self.result("raw", [text], tid=command.tid, reply=name, args=list(reply.to_args()) if reply is not None else None)

    async def cmd_init(self, args: List[str]) -> None:
        base_id = self.base_id
        bare = False
        token = self.token
        version = PROTOCOL_VERSION
        words = list(args)
        while words:
            word = words.pop(0)
            if word == "--bare":
                bare = True
            elif word == "--token" and words:
                token = words.pop(0)
            elif word == "--version" and words:
                version = words.pop(0)
            elif word.isdigit():
                base_id = int(word)
            else:
                raise CommandError(f"usage: {SPECS['init'].usage}")
        self.base_id = base_id
        await self.client.init(base_id, token=token, bare=bare, version=version)
        self.result("init", [f"INIT OK (base id {base_id})"], base_id=base_id)

    async def cmd_modeldef(self, args: List[str]) -> None:
        definitions = await self.client.model_def()
        self.result("modeldef", [f"MODEL_DEF OK: {len(definitions)} attribute definitions"], count=len(definitions))

    async def cmd_violations(self, args: List[str]) -> None:
        found = self.client.violations
        lines = [f"{v.rule}: {v}" for v in found] or ["no protocol violations"]
        self.result("violations", lines, violations=[{"rule": v.rule, "message": str(v)} for v in found])

    async def cmd_quiet(self, args: List[str]) -> None:
        if args and args[0] not in ("on", "off"):
            raise CommandError(f"usage: {SPECS['quiet'].usage}")
        self.quiet = not args or args[0] == "on"
        self.result("quiet", [f"events {'hidden' if self.quiet else 'shown'}"], quiet=self.quiet)

    async def cmd_sleep(self, args: List[str]) -> None:
        await trio.sleep(seconds_arg(self._one_arg("sleep", args), "sleep"))
        self.result("sleep")

    async def cmd_quit(self, args: List[str]) -> None:
        self.finished = True
        await self.client.quit()
        self.result("quit", ["agent shut down"])


def number_first(text: str) -> Tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 62, text)


def number_arg(text: str, what: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise CommandError(f"{what}: expected a number (decimal or 0x...), got {text!r}") from None
    if value < 0:
        raise CommandError(f"{what}: must not be negative")
    return value


def definition_record(d: Any) -> Dict[str, Any]:
    return {
        "id": d.id,
        "type": d.type.value,
        "name": d.name,
        "description": d.description,
        "display": d.display,
        "default": d.default,
        "values": list(d.values),
        "minimum": d.minimum,
        "maximum": d.maximum,
    }


def output_lines_in(event: ProcessChange) -> int:
    """How many output lines one PROCESS_CHANGE adds to its job (as the mirror splits them)."""
    count = 0
    for group in event.groups:
        lines = sum(value.count("\n") + 1 for key, value in group.attributes if key in OUTPUT_KEYS)
        if lines:
            count += lines * (1 if isinstance(group.ids, str) else len(group.ids))
    return count

