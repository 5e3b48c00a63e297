"""The console's commands, run against an :class:`~proxy_agent.client.AgentClient`.

Each command is a method ``cmd_<name>(args)``.  A command that cannot do
what was asked raises (:class:`CommandError` for the console's own
complaints, the client's errors otherwise); :meth:`Console.execute` turns
that into one error line and a False result.  Errors that end the session
(protocol violation, agent gone) are not caught there: they end the console.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
import signal
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import attrs
import trio

from ..client import (
    AgentClient,
    ClientError,
    CommandFailed,
    ConnectionClosed,
    Element,
    ProtocolViolationError,
    Traffic,
    UnknownElementError,
)
from ..client.connection import NO_KEPT_OUTPUT
from ..client.state import OUTPUT_KEYS, PROTOCOL_VERSION, canonical_id
from ..protocol.attributes import JOB_STATES, STANDARD_ATTRIBUTES
from ..protocol.messages import CommandId, ElementChange, ElementKind, Error, Event, NewElements, Ok, ProcessChange, Shutdown
from ..protocol.wire import FrameError
from ..service.jobs import NEVER_STARTS, JobState
from . import render
from .terminal import Output

__all__ = ["Console", "CommandError", "split_commands", "COMMANDS"]


class CommandError(Exception):
    """A console command was misused or could not be carried out; the text says why.

    ``fields`` go into the command's one ``result`` record under ``--json`` (what the
    command found out before it failed, such as a failed job's output).
    """

    def __init__(self, message: str, *, exit_status: Optional[int] = None, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields
        #: the exit status the console ends with when this ends a script (a job's own, as
        #: ``sbatch --wait`` and ``srun`` give it); None: the usual status of a failed command
        self.exit_status = exit_status


@attrs.frozen
class CommandSpec:
    name: str
    usage: str
    summary: str


COMMANDS: Tuple[CommandSpec, ...] = (
    CommandSpec("submit", "submit [OPTIONS] [KEY=VALUE...] EXECUTABLE [ARG...] [--wait]",
                "submit a job; options: -n/--count N, -e/--env NAME=VALUE, -d/--dir DIR, -q/--queue QUEUE[,QUEUE...] "
                "(several: a broker chooses), -b/--broker NAME (Null, Random, FastestQueue, Benchmark, module:Class), "
                "--sub-id ID, -w/--wait (wait for it to end, print its output, fail if it failed), -t/--timeout S"),
    CommandSpec("cosubmit", "cosubmit FILE [--name NAME] [--no-wait] [-t SECONDS]",
                "submit a co-allocated multi-part job described in FILE (JSON or the multi-request form, see "
                "docs/coallocation.md); waits for it to end, printing its parts' output, and fails if it failed "
                "(--no-wait: only submit); 'release JOB' releases an explicit barrier, 'terminate PART' deletes a part"),
    CommandSpec("coadd", "coadd JOB FILE", "add the part described in FILE to multi-part job JOB before its barrier is released"),
    CommandSpec("jobs", "jobs", "list the jobs"),
    CommandSpec("nodes", "nodes", "list the nodes"),
    CommandSpec("queues", "queues", "list the queues"),
    CommandSpec("machines", "machines", "list the machines"),
    CommandSpec("show", "show ID", "every attribute of an element (a job also by its jobSubId)"),
    CommandSpec("output", "output JOB", "print a job's output and follow it until the job ends (Ctrl-C stops)"),
    CommandSpec("wait", "wait JOB [STATE] [-t SECONDS]",
                "wait until the job has reached STATE (default COMPLETED): a jobState (STARTING, RUNNING, SUSPENDED, "
                "COMPLETED) or a jobStatus (QUEUING, HOLD, FINISHED, FAILED, KILLED...)"),
    CommandSpec("terminate", "terminate JOB", "terminate a job (TERMINATE_JOB)"),
    CommandSpec("hold", "hold JOB", "hold a job (CHANGE_JOB)"),
    CommandSpec("release", "release JOB", "release a held job (CHANGE_JOB)"),
    CommandSpec("suspend", "suspend JOB", "suspend a running job (CHANGE_JOB)"),
    CommandSpec("resume", "resume JOB", "resume a suspended job (CHANGE_JOB)"),
    CommandSpec("change", "change JOB KEY=VALUE...", "change job attributes (CHANGE_JOB)"),
    CommandSpec("move", "move JOB QUEUE", "move a job to another queue (MOVE_JOB)"),
    CommandSpec("stop", "stop", "stop the agent's events (STOP_EVENTS); changes are held"),
    CommandSpec("start", "start", "start events again (START_EVENTS); held changes arrive"),
    CommandSpec("attrs", "attrs [ID]", "attribute definitions the agent sent (MODEL_DEF)"),
    CommandSpec("raw", "raw [--tid N] [--no-wait] ID [ARG...]",
                "send any command by number (decimal or 0x..) and print its reply"),
    CommandSpec("init", "init [BASE_ID] [--bare] [--token TOKEN] [--version V]", "send INIT (sessions started with --manual)"),
    CommandSpec("modeldef", "modeldef", "send MODEL_DEF (sessions started with --manual)"),
    CommandSpec("violations", "violations", "protocol violations by the agent seen so far"),
    CommandSpec("quiet", "quiet [on|off]", "hide (on) or show (off) events as they arrive"),
    CommandSpec("sleep", "sleep SECONDS", "pause (useful in scripts)"),
    CommandSpec("help", "help [COMMAND]", "this list, or one command's usage"),
    CommandSpec("quit", "quit", "send QUIT (the agent shuts down) and leave"),
)
_SPECS = {spec.name: spec for spec in COMMANDS}
_ALIASES = {"exit": "quit", "ls": "jobs", "kill": "terminate", "?": "help"}

#: Job statuses that mean the job did not succeed.
_FAILED_STATUSES = {"FAILED", "CANCELED", "CANCELLED", "ERROR", "KILLED", "TIMEOUT"}
_ATTRIBUTE_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*=")

#: The protocol's coarse job states (jobState): a wait for one of these follows jobState.
PROTOCOL_JOB_STATES = tuple(JOB_STATES)
#: The detailed states (jobStatus): the service's vocabulary, and the words agents used before it.
STATUS_NAMES = tuple(state.value for state in JobState) + (
    "PENDING", "HELD", "CANCELED", "CANCELLED", "COMPLETING", "ERROR", "TIMEOUT",
)

#: jobStatus values after which nothing follows.
#: jobStatus names a job that never starts still reaches.
_WAITING_STATUSES = {"UNDEFINED", "ACCEPTED", "PREPARING", "SUBMITTING", "HOLD", "QUEUING", "PENDING", "OTHER"}
_FINAL_STATUSES = {"FINISHED", "FAILED", "KILLED", "DELETED", "COMPLETED", "CANCELED", "CANCELLED", "ERROR", "TIMEOUT"}

#: Seconds ``output`` waits for live output before it asks the agent again anyway.
_OUTPUT_RECHECK = 2.0

#: CHANGE_JOB attributes per console command: candidates, in order of preference.
_HOLD_ATTRIBUTES = ("hold", "jobHold")
_SUSPEND_ATTRIBUTES = ("suspend", "jobSuspend")


def split_commands(text: str) -> List[List[str]]:
    """Split command text into commands (';' or newlines) and those into words (shell quoting)."""
    commands: List[List[str]] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";")
        lexer.whitespace_split = True
        lexer.commenters = ""
        current: List[str] = []
        try:
            tokens = list(lexer)
        except ValueError as exc:
            raise CommandError(f"cannot parse {line!r}: {exc}") from None
        for token in tokens:
            if token and set(token) == {";"}:
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
        if current:
            commands.append(current)
    return commands


def command_text(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


@attrs.define
class SubmitRequest:
    executable: str
    args: List[str]
    count: int = 1
    env: List[str] = attrs.Factory(list)
    cwd: Optional[str] = None
    queue: Optional[str] = None
    sub_id: Optional[str] = None
    wait: bool = False
    timeout: Optional[float] = None
    attributes: Dict[str, Any] = attrs.Factory(dict)


def parse_submit(args: Sequence[str]) -> SubmitRequest:
    """``[OPTIONS] [KEY=VALUE...] EXECUTABLE [ARG...] [--wait]``."""
    options: Dict[str, Any] = {"env": [], "attributes": {}}
    words = list(args)
    i = 0

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(words):
            raise CommandError(f"submit: {flag} needs a value")
        i += 1
        return words[i]

    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        get = (lambda f=flag: inline) if eq else (lambda f=flag: value(f))
        if word == "--":
            i += 1
            break
        if flag in ("-n", "--count"):
            text = get()
            if not text.isdigit() or int(text) < 1:
                raise CommandError(f"submit: {flag} needs a positive number, got {text!r}")
            options["count"] = int(text)
        elif flag in ("-e", "--env"):
            text = get()
            if "=" not in text:
                raise CommandError(f"submit: {flag} needs NAME=VALUE, got {text!r}")
            options["env"].append(text)
        elif flag in ("-d", "--dir"):
            options["cwd"] = get()
        elif flag in ("-q", "--queue"):
            options["queue"] = get()
        elif flag in ("-b", "--broker"):
            options["attributes"]["broker"] = get()
        elif flag == "--sub-id":
            options["sub_id"] = get()
        elif flag in ("-t", "--timeout"):
            options["timeout"] = _seconds(get(), "submit --timeout")
        elif flag in ("-w", "--wait"):
            options["wait"] = True
        elif word.startswith("-") and len(word) > 1:
            raise CommandError(f"submit: unknown option {word!r} (see 'help submit')")
        elif _ATTRIBUTE_ARG.match(word):
            key, _, val = word.partition("=")
            previous = options["attributes"].get(key)
            if previous is None:
                options["attributes"][key] = val
            else:
                options["attributes"][key] = (previous if isinstance(previous, list) else [previous]) + [val]
        else:
            break
        i += 1
    rest = words[i:]
    if len(rest) > 1 and rest[-1] in ("--wait", "-w"):
        options["wait"] = True
        rest = rest[:-1]
    if not rest:
        raise CommandError("submit needs an executable (see 'help submit')")
    return SubmitRequest(rest[0], rest[1:], **options)


def _seconds(text: str, what: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise CommandError(f"{what}: expected seconds, got {text!r}") from None
    if seconds < 0:
        raise CommandError(f"{what}: seconds must not be negative")
    return seconds


def exit_numbers(client: AgentClient, job: Element) -> Tuple[List[int], List[str]]:
    """(exit statuses, signal names) of the job's ended processes, for JSON."""
    numbers: List[int] = []
    signals: List[str] = []
    for code in exit_codes(client, job):
        if code.lstrip("-").isascii() and code.lstrip("-").isdigit():
            numbers.append(int(code))
        else:
            signals.append(code)
    return numbers, signals


def nearest(name: str, known: Iterable[str]) -> Optional[str]:
    """The known name closest to a misspelt one (case is ignored), or None."""
    by_lower: Dict[str, str] = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def exit_codes(client: AgentClient, job: Element) -> List[str]:
    codes = []
    for process in client.children(job, "process"):
        code = process.get("processExitCode")
        sig = process.get("processSignalName")
        if isinstance(code, str):
            codes.append(code)
        elif isinstance(sig, str):
            codes.append(sig)
    return codes


def exit_status(client: AgentClient, job: Element) -> int:
    """A job's exit status as a shell gives a command's, and as ``srun`` does: the highest of
    its processes' exit statuses, 128 + N for one killed by signal N; 1 for a job that
    failed without one (never started, cancelled while queued); 0 when it succeeded."""
    status = 0
    for process in client.children(job, "process"):
        code = process.get("processExitCode")
        name = process.get("processSignalName")
        if isinstance(code, str) and code.isascii() and code.isdigit():
            status = max(status, int(code))
        elif isinstance(name, str) and name:
            status = max(status, 128 + _signal_number(name))
    if status == 0 and job_failed(client, job):
        return 1
    return status


def _signal_number(name: str) -> int:
    """SIGKILL -> 9; a name no signal has -> 0 (the status is then 128: a signal, unknown)."""
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        return int(name) if name.isdigit() else 0


def job_failed(client: AgentClient, job: Element) -> bool:
    status = job.get("jobStatus")
    if isinstance(status, str) and status.upper() in _FAILED_STATUSES:
        return True
    return any(code != "0" for code in exit_codes(client, job))


class Console:
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
            delivered = _output_lines_in(event)
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
        name = _ALIASES.get(name, name)
        if name not in _SPECS:
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
            names = sorted(set(_SPECS) | set(_ALIASES))
            return [n + " " for n in names if n.startswith(text)]
        candidates: List[str] = []
        try:
            state = self.client.state
            command = _ALIASES.get(words[0], words[0])
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
            ids = ", ".join(sorted((render.job_label(state, job.id) for job in named), key=_number_first))
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
            raise CommandError(f"usage: {_SPECS[name].usage}")
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
            spec = _SPECS.get(_ALIASES.get(args[0], args[0]))
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

    def _unknown_attributes(self, keys: Iterable[str]) -> List[str]:
        """Warnings for job attributes no definition names, each with the nearest known name."""
        known = list(self.client.attr_defs) or [d.id for d in STANDARD_ATTRIBUTES]
        known_set = set(known)
        warnings = []
        for key in keys:
            if key in known_set:
                continue
            guess = nearest(key, known)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            warnings.append(f"submit: unknown job attribute {key!r}{hint}; sent as given")
        return warnings

    async def cmd_submit(self, args: List[str]) -> None:
        request = parse_submit(args)
        client = self.client
        warnings = self._unknown_attributes(request.attributes)
        for text in warnings:
            self.warning(text)
        extra: Dict[str, Any] = {"warnings": warnings} if warnings else {}
        kwargs = dict(
            count=request.count,
            env=request.env or None,
            cwd=request.cwd,
            queue=request.queue,
            sub_id=request.sub_id,
            **request.attributes,
        )
        if not client.events_started:
            sub_id = await client.submit_nowait(request.executable, request.args, **kwargs)
            self.result("submit", [f"submitted {sub_id}; events are stopped, its job id arrives with 'start'"], sub_id=sub_id, **extra)
            if request.wait:
                raise CommandError("cannot wait for a job while events are stopped")
            return
        job_id = await client.submit(request.executable, request.args, **kwargs)
        job = client.job(job_id)
        self.last_job = job.id
        if job.get("brokerReason"):
            # a broker chose the queue: say where and why
            extra.update(queue=job.get("brokerQueue"), broker_reason=job.get("brokerReason"))
        if not request.wait:
            line = f"submitted job {self._label(job)} ({job.sub_id})"
            if job.get("brokerReason"):
                line += f" to {job.get('brokerQueue')} ({job.get('brokerReason')})"
            self.result("submit", [line], job=self._id_value(job), sub_id=job.sub_id, **extra)
            return
        if not self.json:
            self.out.line(f"submitted job {self._label(job)} ({job.sub_id}), waiting for it to end")
        await self._follow(job, self._wait_timeout(request.timeout))
        failed = job_failed(client, job)
        numbers, signals = exit_numbers(client, job)
        stdout, stderr = job.text("stdout"), job.text("stderr")
        if self.json:
            kept = await self._kept_or_none(job)
            if kept is not None:  # all of it, also what this session did not see live
                stdout, stderr = kept.text("stdout"), kept.text("stderr")
        fields = dict(
            job=self._id_value(job),
            sub_id=job.sub_id,
            state=job.state,
            status=job.get("jobStatus"),
            exit_codes=numbers,
            signals=signals,
            stdout=stdout,
            stderr=stderr,
            failed=failed,
            **extra,
        )
        if failed:
            if not self.json:
                self.out.line(self._job_end_line(job))
            raise CommandError(f"job {self._label(job)} did not succeed: {self._job_end_line(job)}",
                               exit_status=exit_status(client, job), **fields)
        self.result("submit", [self._job_end_line(job)], **fields)

    @staticmethod
    def _read_description(path: str, command: str) -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{command}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None

    async def cmd_cosubmit(self, args: List[str]) -> None:
        path: Optional[str] = None
        name: Optional[str] = None
        wait = True
        timeout: Optional[float] = None
        words = list(args)
        while words:
            word = words.pop(0)
            if word == "--no-wait":
                wait = False
            elif word in ("--name", "-t", "--timeout"):
                if not words:
                    raise CommandError(f"cosubmit: {word} needs a value")
                value = words.pop(0)
                if word == "--name":
                    name = value
                else:
                    timeout = _seconds(value, "cosubmit --timeout")
            elif word.startswith("-") and word != "-":
                raise CommandError(f"cosubmit: unknown option {word!r} (see 'help cosubmit')")
            elif path is None:
                path = word
            else:
                raise CommandError(f"usage: {_SPECS['cosubmit'].usage}")
        if path is None:
            raise CommandError(f"usage: {_SPECS['cosubmit'].usage}")
        client = self.client
        if not client.events_started:
            raise CommandError("cosubmit: events are stopped ('start' them first)")
        job_id = await client.cosubmit(self._read_description(path, "cosubmit"), name=name)
        job = client.job(job_id)
        self.last_job = job.id
        parts = client.parts_of(job)
        line = f"submitted multi-part job {self._label(job)} ({job.get('coallocId')}): parts " + (
            ", ".join(self._label(part) for part in parts) or "none")
        if not wait:
            self.result("cosubmit", [line], job=self._id_value(job), parts=[self._id_value(p) for p in parts])
            return
        if not self.json:
            self.out.line(line + "; waiting for it to end")

        def over() -> bool:
            for part in client.parts_of(job):
                if part.id not in self._followed:
                    self._followed.add(part.id)
                    self._flush_output(part.id)
            return job.state == "COMPLETED" and all(p.state == "COMPLETED" for p in client.parts_of(job))

        try:
            await client.wait_for(over, self._wait_timeout(timeout),
                                  description=lambda: f"multi-part job {self._label(job)} to end (now {job.state})")
        finally:
            parts = client.parts_of(job)
            self._followed.difference_update(p.id for p in parts)
        status = job.get("jobStatus")
        state = client.state
        summary = [render.element_summary(job, state=state)] + [
            f"  part {p.get('coallocPart')}: {render.element_summary(p, state=state)}" for p in parts]
        fields = dict(
            job=self._id_value(job),
            status=status,
            reason=job.get("jobStatusMessage"),
            parts=[{"job": self._id_value(p), "part": p.get("coallocPart"), "status": p.get("jobStatus"),
                    "stdout": p.text("stdout"), "stderr": p.text("stderr")} for p in parts],
        )
        if status != "FINISHED":
            if not self.json:
                self.out.lines(summary)
            # the parts that failed say why (the others were cancelled because of them)
            failed = [part for part in parts if part.get("jobStatus") == "FAILED"] or parts
            worst = max([exit_status(client, part) for part in failed] + [1])
            raise CommandError(f"multi-part job {self._label(job)} did not succeed: {status}: "
                               f"{job.get('jobStatusMessage') or ''}", exit_status=worst, **fields)
        self.result("cosubmit", summary, **fields)

    async def cmd_coadd(self, args: List[str]) -> None:
        if len(args) != 2:
            raise CommandError(f"usage: {_SPECS['coadd'].usage}")
        job = self._job_ref(args[0])
        part = await self.client.add_part(job, self._read_description(args[1], "coadd"))
        self.result("coadd", [f"added part job {self._label(part)} to multi-part job {self._label(job)}"],
                    job=self._id_value(job), part=self._id_value(part))

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

    async def cmd_output(self, args: List[str]) -> None:
        ref = self._one_arg("output", args)
        target: Union[Element, int]
        try:
            job: Optional[Element] = self._job(ref)
            target = job  # type: ignore[assignment]
        except UnknownElementError:
            if not (ref.isascii() and ref.isdigit()):
                raise
            job, target = None, int(ref)  # one the model no longer shows: the agent may keep its output
        try:
            await self._print_kept(job, target)
        except CommandFailed as exc:
            if job is None or exc.code not in NO_KEPT_OUTPUT:
                raise
            await self._print_seen(job)  # an agent that keeps none of it: what this session saw

    async def _kept_or_none(self, job: Element):
        """The job's kept output, or None when the agent keeps none of it."""
        try:
            return await self.client.kept_output(job)
        except CommandFailed as exc:
            if exc.code in NO_KEPT_OUTPUT:
                return None
            raise

    async def _print_kept(self, job: Optional[Element], target: Union[Element, int]) -> None:
        """``output``: every line the agent keeps of the job, process by process; then, until
        the job ends, the lines it writes.  The live events only say when to ask again, so
        each line is printed once."""
        client = self.client
        label = self._label(job) if job is not None else str(target)
        seen: Dict[Tuple[int, str], int] = {}
        dropped: Dict[Tuple[int, str], int] = {}
        texts: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        timeout = self.timeout
        if job is not None:
            self._silenced.add(job.id)
        try:
            with trio.move_on_after(timeout if timeout is not None else math.inf) as deadline:
                while True:
                    over = job is None or job.state == "COMPLETED" or job.removed
                    kept = await client.kept_output(target, skip=seen)
                    for part in kept.streams:
                        seen[(part.rank, part.stream)] = part.first + len(part.lines)
                        dropped[(part.rank, part.stream)] = part.dropped
                        texts[part.stream].extend(part.lines)
                        if not self.json:
                            self.out.lines(render.labelled_line(f"{label}.{part.rank}", part.stream, line)
                                           for line in part.lines)
                    if over:
                        break
                    assert job is not None
                    count = len(job.output)
                    with trio.move_on_after(_OUTPUT_RECHECK):
                        await client.wait_for(lambda: len(job.output) != count or job.state == "COMPLETED"
                                              or job.removed)
            if deadline.cancelled_caught:
                now = f" (now {job.state})" if job is not None else ""
                raise CommandError(f"timed out after {timeout:g} s following the output of job {label}{now}")
        finally:
            if job is not None:
                self._silenced.discard(job.id)
                self._printed[job.id] = len(job.output)
        for (rank, stream), count in sorted(dropped.items()):
            if count:
                self.warning(f"{count} later lines process {label}.{rank} wrote to {stream} were not kept "
                             "(the agent keeps the first 64 MiB of each job's output, as far as its disk has room)")
        if self.json:
            self.result("output", job=self._id_value(job) if job is not None else target,
                        stdout="".join(line + "\n" for line in texts["stdout"]),
                        stderr="".join(line + "\n" for line in texts["stderr"]),
                        dropped=sum(dropped.values()))
        elif job is not None:
            self.out.line(self._job_end_line(job))

    async def _print_seen(self, job: Element) -> None:
        """``output`` of a job the agent keeps no output of: the lines this session received,
        then those that come until the job ends."""
        if self.json:
            if job.state != "COMPLETED":
                await self._follow(job, self.timeout)
            self.result("output", job=self._id_value(job), stdout=job.text("stdout"), stderr=job.text("stderr"))
            return
        for line in job.output:
            self.out.line(render.output_line(self.client.state, line))
        self._printed[job.id] = len(job.output)
        if job.state != "COMPLETED" and not job.removed:
            await self._follow(job, self.timeout)
        self.out.line(self._job_end_line(job))

    async def cmd_wait(self, args: List[str]) -> None:
        timeout = None
        words = []
        i = 0
        while i < len(args):
            if args[i] in ("-t", "--timeout") and i + 1 < len(args):
                timeout = _seconds(args[i + 1], "wait --timeout")
                i += 2
                continue
            words.append(args[i])
            i += 1
        if not 1 <= len(words) <= 2:
            raise CommandError(f"usage: {_SPECS['wait'].usage}")
        state = self._wait_state(words[1]) if len(words) == 2 else "COMPLETED"
        job = self._job(words[0])
        await self._wait_job(job, state, self._wait_timeout(timeout))
        if state == "COMPLETED" and job_failed(self.client, job):
            # as sbatch --wait: a wait for the end of a job that failed fails with its status
            raise CommandError(f"job {self._label(job)} did not succeed: {self._job_end_line(job)}",
                               exit_status=exit_status(self.client, job), job=self._id_value(job), state=state,
                               current=job.state, status=job.get("jobStatus"))
        self.result("wait", [f"job {self._label(job)} reached {state}"], job=self._id_value(job), state=state,
                    current=job.state, status=job.get("jobStatus"))

    def _known_states(self) -> List[str]:
        names = list(PROTOCOL_JOB_STATES) + list(STATUS_NAMES)
        for key in ("jobState", "jobStatus"):
            definition = self.client.attr_defs.get(key)
            names.extend(getattr(definition, "values", ()) or ())
        return list(dict.fromkeys(n.upper() for n in names))

    def _wait_state(self, text: str) -> str:
        """The state a ``wait`` names, checked before anything is awaited."""
        state = text.upper()
        known = self._known_states()
        if state in known:
            return state
        guess = nearest(state, known)
        hint = f" (did you mean {guess}?)" if guess else ""
        raise CommandError(
            f"wait: unknown state {text!r}{hint}; jobState is one of {', '.join(PROTOCOL_JOB_STATES)}, "
            f"jobStatus one of {', '.join(s for s in known if s not in PROTOCOL_JOB_STATES)}"
        )

    async def _wait_job(self, job: Element, state: str, timeout: Optional[float]) -> None:
        """Until the job has been in ``state``: its jobState for the protocol's four, else its jobStatus."""
        if state in PROTOCOL_JOB_STATES:
            await self._wait_job_state(job, state, timeout)
            return
        seen = self.statuses.setdefault(job.id, [])
        current = job.get("jobStatus")
        if isinstance(current, str) and current not in seen:
            seen.append(current)

        def reached() -> bool:
            # The mirror may be ahead of the events shown so far (several came in one read):
            # its current status counts as seen.
            status = job.get("jobStatus")
            if state in (s.upper() for s in seen) or (isinstance(status, str) and status.upper() == state):
                return True
            # An agent may send the final status in the event after jobState COMPLETED.
            ended = job.state == "COMPLETED" and isinstance(status, str) and status.upper() in _FINAL_STATUSES
            if job.removed or ended:
                went = " -> ".join(seen + ([status] if status and (not seen or seen[-1] != status) else [])) or "no status"
                raise CommandError(f"job {self._label(job)} ended without reaching {state} (went {went})")
            if state not in _WAITING_STATUSES:
                self._check_startable(job, state)
            return False

        await self.client.wait_for(
            reached, timeout, description=lambda: f"job {self._label(job)} to reach {state} (now {job.get('jobStatus')})")

    async def cmd_terminate(self, args: List[str]) -> None:
        job = self._job_ref(self._one_arg("terminate", args))
        await self.client.terminate(job)
        self.result("terminate", [f"terminate job {self._label(job)}: OK"], job=self._id_value(job))

    def _change_attribute(self, candidates: Sequence[str]) -> str:
        defs = self.client.attr_defs
        for key in candidates:
            if key in defs:
                return key
        for key in defs:
            if any(key.lower() == c.lower() for c in candidates):
                return key
        return candidates[0]

    async def _change(self, name: str, args: List[str], candidates: Sequence[str], value: str) -> None:
        job = self._job_ref(self._one_arg(name, args))
        key = self._change_attribute(candidates)
        await self.client.change_job(job, **{key: value})
        self.result(name, [f"{name} job {self._label(job)}: OK"], job=self._id_value(job), attribute=key, value=value)

    async def cmd_hold(self, args: List[str]) -> None:
        await self._change("hold", args, _HOLD_ATTRIBUTES, "true")

    async def cmd_release(self, args: List[str]) -> None:
        await self._change("release", args, _HOLD_ATTRIBUTES, "false")

    async def cmd_suspend(self, args: List[str]) -> None:
        await self._change("suspend", args, _SUSPEND_ATTRIBUTES, "true")

    async def cmd_resume(self, args: List[str]) -> None:
        await self._change("resume", args, _SUSPEND_ATTRIBUTES, "false")

    async def cmd_change(self, args: List[str]) -> None:
        if len(args) < 2 or not all(_ATTRIBUTE_ARG.match(a) for a in args[1:]):
            raise CommandError(f"usage: {_SPECS['change'].usage}")
        job = self._job_ref(args[0])
        attributes: Dict[str, Any] = {}
        for arg in args[1:]:
            key, _, value = arg.partition("=")
            previous = attributes.get(key)
            attributes[key] = value if previous is None else (previous if isinstance(previous, list) else [previous]) + [value]
        await self.client.change_job(job, **attributes)
        self.result("change", [f"change job {self._label(job)}: OK"], job=self._id_value(job))

    async def cmd_move(self, args: List[str]) -> None:
        if len(args) != 2:
            raise CommandError(f"usage: {_SPECS['move'].usage}")
        job = self._job_ref(args[0])
        await self.client.move_job(job, args[1])
        self.result("move", [f"move job {self._label(job)} to {args[1]}: OK"], job=self._id_value(job), queue=args[1])

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
            self.result("attrs", lines, definition=_def_record(d))
            return
        if not defs:
            self.result("attrs", ["no attribute definitions (MODEL_DEF not sent yet?)"], definitions=[])
            return
        rows = []
        for d in defs.values():
            extra = " ".join(d.values) if d.values else d.default
            rows.append((d.id, d.type.value, d.name, extra))
        self.result("attrs", render.table(("ID", "TYPE", "NAME", "DEFAULT/VALUES"), rows), definitions=[_def_record(d) for d in defs.values()])

    async def cmd_raw(self, args: List[str]) -> None:
        tid: Optional[int] = None
        wait = True
        words = list(args)
        while words and words[0].startswith("--"):
            option = words.pop(0)
            if option == "--tid" and words:
                tid = _number(words.pop(0), "raw --tid")
            elif option == "--no-wait":
                wait = False
            else:
                raise CommandError(f"usage: {_SPECS['raw'].usage}")
        if not words:
            raise CommandError(f"usage: {_SPECS['raw'].usage}")
        command_id = _number(words[0], "raw: command id")
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
                raise CommandError(f"usage: {_SPECS['init'].usage}")
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
            raise CommandError(f"usage: {_SPECS['quiet'].usage}")
        self.quiet = not args or args[0] == "on"
        self.result("quiet", [f"events {'hidden' if self.quiet else 'shown'}"], quiet=self.quiet)

    async def cmd_sleep(self, args: List[str]) -> None:
        await trio.sleep(_seconds(self._one_arg("sleep", args), "sleep"))
        self.result("sleep")

    async def cmd_quit(self, args: List[str]) -> None:
        self.finished = True
        await self.client.quit()
        self.result("quit", ["agent shut down"])


def _number_first(text: str) -> Tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 62, text)


def _number(text: str, what: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise CommandError(f"{what}: expected a number (decimal or 0x...), got {text!r}") from None
    if value < 0:
        raise CommandError(f"{what}: must not be negative")
    return value


def _def_record(d: Any) -> Dict[str, Any]:
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


def _output_lines_in(event: ProcessChange) -> int:
    """How many output lines one PROCESS_CHANGE adds to its job (as the mirror splits them)."""
    count = 0
    for group in event.groups:
        lines = sum(value.count("\n") + 1 for key, value in group.attributes if key in OUTPUT_KEYS)
        if lines:
            count += lines * (1 if isinstance(group.ids, str) else len(group.ids))
    return count
