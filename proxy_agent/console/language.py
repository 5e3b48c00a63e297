"""The console's language: its commands and their usage, how a line splits into commands,
the submit command's options, and the job states a wait may name."""

from __future__ import annotations

import difflib
import re
import shlex
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import attrs

from ..protocol.attributes import JOB_STATES
from ..service.broker_names import broker_choices
from ..service.jobs import JobState

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
                f"(several: a broker chooses), -b/--broker NAME ({broker_choices()}), "
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
SPECS = {spec.name: spec for spec in COMMANDS}
ALIASES = {"exit": "quit", "ls": "jobs", "kill": "terminate", "?": "help"}

#: Job statuses that mean the job did not succeed.
FAILED_STATUSES = {"FAILED", "CANCELED", "CANCELLED", "ERROR", "KILLED", "TIMEOUT"}
ATTRIBUTE_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*=")

#: The protocol's coarse job states (jobState): a wait for one of these follows jobState.
PROTOCOL_JOB_STATES = tuple(JOB_STATES)
#: The detailed states (jobStatus): the service's vocabulary, and the words agents used before it.
STATUS_NAMES = tuple(state.value for state in JobState) + (
    "PENDING", "HELD", "CANCELED", "CANCELLED", "COMPLETING", "ERROR", "TIMEOUT",
)

#: jobStatus values after which nothing follows.
#: jobStatus names a job that never starts still reaches.
WAITING_STATUSES = {"UNDEFINED", "ACCEPTED", "PREPARING", "SUBMITTING", "HOLD", "QUEUING", "PENDING", "OTHER"}
FINAL_STATUSES = {"FINISHED", "FAILED", "KILLED", "DELETED", "COMPLETED", "CANCELED", "CANCELLED", "ERROR", "TIMEOUT"}

#: Seconds ``output`` waits for live output before it asks the agent again anyway.
OUTPUT_RECHECK = 2.0

#: CHANGE_JOB attributes per console command: candidates, in order of preference.
HOLD_ATTRIBUTES = ("hold", "jobHold")
SUSPEND_ATTRIBUTES = ("suspend", "jobSuspend")


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
            options["timeout"] = seconds_arg(get(), "submit --timeout")
        elif flag in ("-w", "--wait"):
            options["wait"] = True
        elif word.startswith("-") and len(word) > 1:
            raise CommandError(f"submit: unknown option {word!r} (see 'help submit')")
        elif ATTRIBUTE_ARG.match(word):
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


def seconds_arg(text: str, what: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise CommandError(f"{what}: expected seconds, got {text!r}") from None
    if seconds < 0:
        raise CommandError(f"{what}: seconds must not be negative")
    return seconds


def nearest(name: str, known: Iterable[str]) -> Optional[str]:
    """The known name closest to a misspelt one (case is ignored), or None."""
    by_lower: Dict[str, str] = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


