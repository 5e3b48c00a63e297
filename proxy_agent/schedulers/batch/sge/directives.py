"""The Grid Engine dialect: a service :class:`~proxy_agent.service.jobs.JobSpec` as ``qsub``
options and a bash job script.  Pure functions; nothing here runs a command.

Where things go
---------------
Options are argv elements of ``qsub -terse`` (never parsed by a shell); the script reaches
qsub on its **stdin**.  A script on stdin leaves no file to create, protect and remove, and
needs no file name: qsub copies it to the master's spool at once.  ``-C ''`` turns off
qsub's parsing of ``#$`` lines in the script, so no line a user contributes (a prologue
command, say) can add options behind the agent's back; ``-S /bin/bash`` makes the script's
shell bash even where a queue ignores ``#!`` lines (``shell_start_mode posix_compliant``).
``render_script(..., embed_options=True)`` still writes the options as ``#$`` directives,
for a script a person can resubmit by hand (then no value may hold whitespace or quotes).

Every user value in the script is shell-quoted (``shlex.quote``), environment variable names
are checked to be shell identifiers, and values that cannot be options at all (a newline,
carriage return or NUL) are refused with an error naming the field.  Prologue commands
(``module load gcc``) are shell command lines by design and are written as given, one per
line, before the program starts.

What each field becomes
-----------------------
``name`` -N (checked against Grid Engine's rules for names: printable ASCII without
whitespace and ``/ : @ \\ * ?``, not starting with a digit; this version refuses anything
else, non-ASCII included; without a name the program's file name is used, made legal);
``stdout_path``/``stderr_path`` -o/-e (a path with ``:`` is prefixed ``:`` so Grid Engine
does not take its start for a host name; ``,`` is refused: it separates per-host paths;
``$JOB_ID``, ``$TASK_ID`` and the other pseudo variables are expanded by Grid Engine);
``working_dir`` -wd (none: -cwd, the agent's directory, as sbatch does); ``num_procs`` ×
``cpus_per_task`` slots through ``-pe PE N`` (PE ``smp`` by default; one slot: no PE), the
program is started once and finds its slot count in ``$NSLOTS``; ``nodes`` only 1 (a
``$pe_slots`` PE is single-host); ``hold`` -h; ``queue`` -q; ``wall_time`` -l h_rt=SECONDS;
``account`` -A; ``memory`` (MB per node) -l h_vmem per slot, rounded up; ``gpus`` -l gpu=N;
``gres`` -l as given (``name=value`` or ``name:value``, comma separated); ``constraint``
boolean resources (``fast&ib`` -> -l fast=TRUE,ib=TRUE); ``exclusive`` -l exclusive=TRUE;
``array`` -t (``1-10:2``; ``%N`` -> -tc N); ``begin_time`` -a; ``qos`` is refused (Grid
Engine has none).  The resource names are settings of :class:`SgeSettings`.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Dict, List, Sequence, Tuple

import attrs

from ....service.jobs import ErrorKind, JobSpec, SubmitError
from ..script import BatchScriptError, ScriptForm, check_spec, line_problem
from ..script import render_script as _render

__all__ = [
    "SgeSettings",
    "DEFAULT_SETTINGS",
    "QSUB_OPTIONS",
    "qsub_options",
    "submit_argv",
    "render_script",
    "check_native_options",
]


def _bad(message: str) -> BatchScriptError:
    return BatchScriptError(message)


@attrs.frozen
class SgeSettings:
    """Site-specific names: the parallel environment slots are asked through, and the
    resources that stand for memory, GPUs and exclusive hosts."""

    pe_name: str = "smp"
    memory_resource: str = "h_vmem"
    gpu_resource: str = "gpu"
    exclusive_resource: str = "exclusive"
    shell: str = "/bin/bash"


DEFAULT_SETTINGS = SgeSettings()

_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
_RESOURCE_VALUE = re.compile(r"[A-Za-z0-9_.+:-]+\Z")
# One queue or a list; wildcards allowed; never starting with "-" (it would read as an option).
_QUEUE_ONE = r"[A-Za-z0-9_.*][A-Za-z0-9_.*-]*(?:@[A-Za-z0-9_.*@-]+)?"
_QUEUE = re.compile(rf"{_QUEUE_ONE}(?:,{_QUEUE_ONE})*\Z")
_ACCOUNT = re.compile(r"[\x21-\x7e]+\Z")
_NAME_FORBIDDEN = set("/:@\\*?")
_ARRAY = re.compile(r"([1-9][0-9]*)(?:-([1-9][0-9]*)(?::([1-9][0-9]*))?)?(?:%([1-9][0-9]*))?\Z")


def _single_line(what: str, value: str) -> str:
    if value == "":
        raise _bad(f"{what} is empty")
    problem = line_problem(what, value)
    if problem is not None:
        raise _bad(problem)
    return value


def _check_name(name: str) -> str:
    _single_line("job name", name)
    bad = sorted({c for c in name if c in _NAME_FORBIDDEN or not ("\x21" <= c <= "\x7e")})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise _bad(f"job name {name!r}: Grid Engine refuses {shown} in names "
                   "(allowed: printable ASCII without whitespace and / : @ \\ * ?)")
    if name[0].isdigit():
        raise _bad(f"job name {name!r}: Grid Engine names cannot start with a digit")
    return name


def _implicit_name(executable: str) -> str:
    base = executable.rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c if ("\x21" <= c <= "\x7e" and c not in _NAME_FORBIDDEN) else "_" for c in base)
    if not name:
        return "job"
    return "j" + name if name[0].isdigit() else name


def _output_path(what: str, path: str) -> str:
    _single_line(what, path)
    if "," in path:
        raise _bad(f"{what} {path!r}: Grid Engine reads ',' as a separator of per-host paths")
    # "[host:]path": with a ':' anywhere, an empty host first keeps the path whole.
    return ":" + path if ":" in path else path


def _begin_time(text: str) -> str:
    _single_line("begin_time", text)
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise _bad(f"begin_time {text!r} is not a date and time like 2025-01-31T18:00[:00]") from None
    return when.strftime("%Y%m%d%H%M.%S")


def _resource_list(what: str, text: str) -> List[str]:
    """``a=1,b:2`` -> ["a=1", "b=2"]; each name and value checked."""
    _single_line(what, text)
    items = []
    for item in text.split(","):
        item = item.strip()
        name, sep, value = item.partition("=")
        if not sep and ":" in item:
            # SLURM's spelling "gpu:2"; only a plain count or value after one colon.
            name, sep, value = item.partition(":")
            if ":" in value:
                raise _bad(f"{what} {text!r}: {item!r} has a type; Grid Engine resources are name=value")
        if not _RESOURCE_NAME.match(name) or (sep and not _RESOURCE_VALUE.match(value)):
            raise _bad(f"{what} {text!r}: {item!r} is not a resource request like name=value")
        items.append(f"{name}={value}" if sep else name)
    return items


def _constraint(text: str) -> List[str]:
    _single_line("constraint", text)
    if any(c in text for c in "|![]()*"):
        raise _bad(f"constraint {text!r}: Grid Engine can only require boolean resources "
                   "all together (a&b); alternatives and counts are not supported")
    names = [part.strip() for part in re.split(r"[&,]", text)]
    for name in names:
        if not _RESOURCE_NAME.match(name):
            raise _bad(f"constraint {text!r}: {name!r} is not a resource name")
    return [f"{name}=TRUE" for name in names]


# --------------------------------------------------------------------------- native options

#: qsub options a job may pass through, with the number of arguments each takes.  Options
#: that a job field sets, that change how the agent submits or reads the job (-sync,
#: -terse, -o/-e/-j, -b, -shell, -S, -C, -@, -verify, -w), that run programs on the agent's
#: host (-jsv) or that change cluster configuration are not in it.
QSUB_OPTIONS: Dict[str, int] = {
    "-ac": 1, "-dc": 1, "-sc": 1, "-binding": 1, "-c": 1, "-ckpt": 1, "-hard": 0, "-soft": 0,
    "-he": 1, "-hold_jid": 1, "-hold_jid_ad": 1, "-i": 1, "-js": 1, "-l": 1, "-M": 1, "-m": 1,
    "-masterq": 1, "-notify": 0, "-now": 1, "-P": 1, "-p": 1, "-R": 1, "-r": 1, "-tc": 1,
}
_FIELD_OPTIONS = {
    "-N": "name", "-o": "stdout_path", "-e": "stderr_path", "-j": "stdout_path/stderr_path",
    "-h": "hold", "-q": "queue", "-pe": "num_procs", "-t": "array", "-A": "account",
    "-a": "begin_time", "-wd": "working_dir", "-cwd": "working_dir", "-v": "environment",
    "-V": "environment",
}
_AGENT_OPTIONS = ("-sync", "-terse", "-b", "-shell", "-S", "-C", "-@", "-verify", "-w",
                  "-jsv", "-clear", "-help", "-pty")
_BINDING_TYPES = ("env", "pe", "set")


def check_native_options(options: Sequence[str]) -> List[str]:
    """Pass-through qsub options as argv elements, each checked against :data:`QSUB_OPTIONS`.

    An element may hold an option and its argument together (``"-l h_vmem=2G"``); it is
    split at the first whitespace.  Raises SubmitError naming the first option refused.
    """
    elements: List[str] = []
    for element in options:
        _single_line("native option", element)
        option, sep, rest = element.strip().partition(" ")
        if sep and option in QSUB_OPTIONS and QSUB_OPTIONS[option]:
            elements += [option, rest.strip()]
        else:
            elements.append(element)
    argv: List[str] = []
    i = 0
    while i < len(elements):
        option = elements[i]
        if option in _FIELD_OPTIONS:
            raise _bad(f"native option {option}: set the job's {_FIELD_OPTIONS[option]} instead")
        if option in _AGENT_OPTIONS:
            raise _bad(f"native option {option}: the agent decides how jobs are submitted and "
                       "where their output goes; it cannot be passed through")
        if option not in QSUB_OPTIONS:
            if not option.startswith("-"):
                raise _bad(f"native option {option!r} is not an option (options start with '-')")
            raise _bad(f"native option {option}: not a qsub option that can be passed through "
                       f"(allowed: {' '.join(sorted(QSUB_OPTIONS))})")
        count = QSUB_OPTIONS[option]
        if option == "-binding" and i + 1 < len(elements) and elements[i + 1] in _BINDING_TYPES:
            count = 2
        values = elements[i + 1:i + 1 + count]
        if len(values) < count:
            raise _bad(f"native option {option} needs {count} argument(s)")
        argv += [option, *values]
        i += 1 + count
    return argv


# --------------------------------------------------------------------------- options


def qsub_options(spec: JobSpec, settings: SgeSettings = DEFAULT_SETTINGS) -> List[Tuple[str, ...]]:
    """The qsub options for ``spec`` as argv groups (``("-N", "name")``), checked."""
    opts: List[Tuple[str, ...]] = []
    resources: List[str] = []
    check_spec(spec)
    for command in spec.prologue:
        _single_line("prologue command", command)
    if spec.qos is not None:
        raise SubmitError(f"qos {spec.qos!r}: Grid Engine has no quality of service; "
                          "choose a queue or a project (-P) instead", ErrorKind.NOT_SUPPORTED)
    opts.append(("-N", _check_name(spec.name) if spec.name is not None else _implicit_name(spec.executable)))
    if spec.working_dir is not None:
        opts.append(("-wd", _single_line("working_dir", spec.working_dir)))
    else:
        opts.append(("-cwd",))
    if spec.stdout_path is not None:
        opts.append(("-o", _output_path("stdout_path", spec.stdout_path)))
    if spec.stderr_path is not None:
        opts.append(("-e", _output_path("stderr_path", spec.stderr_path)))
    if spec.queue is not None:
        queue = _single_line("queue", spec.queue)
        if not _QUEUE.match(queue):
            raise _bad(f"queue {queue!r} is not a Grid Engine queue name (like all.q or all.q@host)")
        opts.append(("-q", queue))
    if spec.hold:
        opts.append(("-h",))
    if spec.account is not None:
        account = _single_line("account", spec.account)
        if not _ACCOUNT.match(account):
            raise _bad(f"account {account!r}: Grid Engine takes printable ASCII without whitespace")
        opts.append(("-A", account))
    if spec.begin_time is not None:
        opts.append(("-a", _begin_time(spec.begin_time)))
    if spec.nodes is not None and spec.nodes != 1:
        raise SubmitError(f"nodes {spec.nodes}: the parallel environment {settings.pe_name} keeps a "
                          "job on one host; ask for slots (num_procs) instead", ErrorKind.NOT_SUPPORTED)
    slots = spec.num_procs * (spec.cpus_per_task or 1)
    if slots > 1:
        opts.append(("-pe", settings.pe_name, str(slots)))
    if spec.wall_time is not None:
        if spec.wall_time < 1:
            raise _bad(f"wall_time must be at least 1 second, got {spec.wall_time}")
        resources.append(f"h_rt={spec.wall_time}")
    if spec.memory is not None:
        if spec.memory < 1:
            raise _bad(f"memory must be at least 1 MB, got {spec.memory}")
        # Grid Engine counts memory per slot; the job asked for this much on its one host.
        resources.append(f"{settings.memory_resource}={math.ceil(spec.memory / slots)}M")
    if spec.gpus is not None:
        if spec.gpus < 0:
            raise _bad(f"gpus must not be negative, got {spec.gpus}")
        if spec.gpus:
            resources.append(f"{settings.gpu_resource}={spec.gpus}")
    if spec.gres is not None:
        resources += _resource_list("gres", spec.gres)
    if spec.constraint is not None:
        resources += _constraint(spec.constraint)
    if spec.exclusive:
        resources.append(f"{settings.exclusive_resource}=TRUE")
    if resources:
        opts.append(("-l", ",".join(resources)))
    if spec.array is not None:
        m = _ARRAY.match(_single_line("array", spec.array).strip())
        if not m:
            raise _bad(f"array {spec.array!r}: Grid Engine takes one range FIRST[-LAST[:STEP]]"
                       " (and %LIMIT for tasks at once), not lists")
        first, last, step, limit = m.groups()
        if last is not None and int(last) < int(first):
            raise _bad(f"array {spec.array!r}: the range ends before it starts")
        opts.append(("-t", first + (f"-{last}" if last else "") + (f":{step}" if step else "")))
        if limit:
            opts.append(("-tc", limit))
    native = check_native_options(spec.native_options)
    if native:
        opts.append(tuple(native))
    return opts


def submit_argv(spec: JobSpec, settings: SgeSettings = DEFAULT_SETTINGS,
                with_options: bool = True) -> List[str]:
    """``qsub -terse -C '' -S SHELL [options]``; the script goes to its stdin.  With
    ``with_options=False`` the options are left to the script's ``#$`` lines (and ``-C ''``,
    which would ignore them, is left out)."""
    argv = ["qsub", "-terse"]
    if with_options:
        argv += ["-C", "", "-S", settings.shell]
        argv += [element for group in qsub_options(spec, settings) for element in group]
    else:
        argv += ["-S", settings.shell]
        qsub_options(spec, settings)  # still checked
    return argv


def _sge_form(settings: SgeSettings) -> ScriptForm:
    # exec: the program replaces the shell, so signals Grid Engine sends (suspend, resume,
    # delete) reach it directly; "--" keeps a program named like an option a program.
    return ScriptForm("sge", directive="#$", submit_command="qsub", shell=settings.shell, exec_word="exec --")


#: Grid Engine's row of the script table (:mod:`..script`), with the default settings.
SCRIPT = _sge_form(DEFAULT_SETTINGS)


def render_script(spec: JobSpec, settings: SgeSettings = DEFAULT_SETTINGS,
                  embed_options: bool = False) -> str:
    """The bash job script for ``spec``: environment, working directory, prologue, program."""
    options = qsub_options(spec, settings)
    form = SCRIPT if settings.shell == SCRIPT.shell else _sge_form(settings)
    return _render(spec, form, options if embed_options else ())
