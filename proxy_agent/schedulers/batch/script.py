"""Batch scripts and submit command lines for batch schedulers (SLURM now, PBS later).

A job is described once, as a ``ScriptSpec``; a ``Dialect`` turns it into scheduler options,
a submit argv and a bash script. Pure functions: nothing here runs a command.

Where options go
----------------
By default every scheduler option is an element of the submit command's argv
(``sbatch --parsable --job-name=... --ntasks=4 ...``) and the script reaches sbatch on its
stdin. argv elements are never parsed by a shell and need no quoting, whereas ``#SBATCH``
lines are parsed by sbatch with rules of its own (whitespace splits, its own quote handling,
and a newline would start a new directive). ``render_script(..., embed_options=True)`` still
writes the options as directives, for a script a person can resubmit by hand; then a value
that sbatch could split or misread (whitespace, quotes, ``#``, ``\\``) is refused.

In both modes a value containing a newline, carriage return or NUL is refused: no option of
a scheduler legitimately has one, and in a directive it would inject another directive.

The program line
----------------
Every user value in the script is passed through ``shlex.quote``, so the program receives
its arguments verbatim: quotes, ``$(...)``, backticks, globs, newlines, leading dashes,
empty strings and non-ASCII text included. Environment variables become
``export NAME=<quoted value>`` with ``NAME`` checked to be a shell identifier.

For SLURM the program is always started through ``srun --ntasks=N [...] -- program args``
(with ``exec``, so signals sent to the job reach srun directly). Even for one task this makes
the program a job step: SLURM then tracks its processes, delivers signals to them, records
per-step accounting, and a multi-task job runs N copies as the PTP process model expects.
``--`` ends srun's options, so an executable named like an option is still run as a program.
"""

from __future__ import annotations

import re
import shlex
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import attrs

__all__ = [
    "BatchScriptError",
    "ScriptSpec",
    "Dialect",
    "SlurmDialect",
    "SLURM",
    "render_script",
    "submit_argv",
    "scheduler_options",
]


class BatchScriptError(ValueError):
    """A job description that cannot be turned into a safe batch script or submit command."""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MEMORY = re.compile(r"[0-9]+[KMGTkmgt]?[Bb]?\Z")
_TIME = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}\Z")
#: What no value may hold that goes into one line of a batch script or one argument.
FORBIDDEN_IN_LINE = ("\n", "\r", "\0")


def line_problem(what: str, value: object) -> Optional[str]:
    """Why ``value`` cannot be one line of a script or command line (None when it can): every
    batch system's checks start from this one."""
    if not isinstance(value, str):
        return f"{what} must be text, got {type(value).__name__}"
    for ch in FORBIDDEN_IN_LINE:
        if ch in value:
            return f"{what} must not contain {ch!r}: {value!r}"
    return None


def _to_tuple(value: Iterable[str]) -> Tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError("expected a sequence of strings, not a single string")
    return tuple(value)


def _to_env(value: Mapping[str, str]) -> Tuple[Tuple[str, str], ...]:
    if isinstance(value, Mapping):
        return tuple(value.items())
    return tuple((k, v) for k, v in value)


def _opt_int(value) -> Optional[int]:
    return None if value is None else int(value)


@attrs.frozen
class ScriptSpec:
    """What to run and what to ask the scheduler for. All but ``executable`` are optional.

    ``num_procs`` is the number of tasks (processes); ``nodes`` the node count;
    ``memory`` per node in the scheduler's syntax (``4000`` MB, ``4G``); ``time_limit`` in
    SLURM's duration syntax (``30``, ``1:30:00``, ``2-00:00:00``); ``queue`` is the SLURM
    partition or PBS queue. ``extra_options`` are further raw scheduler options, each one
    argv element starting with ``-`` (``--qos=high``, ``--exclusive``).
    ``environment`` is kept in the given order.  ``prologue`` holds shell command lines
    run before the program (``module load gcc``), one line each, written as given.
    """

    executable: str
    arguments: Tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)
    environment: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_to_env)
    working_dir: Optional[str] = None
    num_procs: int = attrs.field(default=1, converter=int)
    nodes: Optional[int] = attrs.field(default=None, converter=_opt_int)
    cpus_per_task: Optional[int] = attrs.field(default=None, converter=_opt_int)
    memory: Optional[str] = None
    time_limit: Optional[str] = None
    queue: Optional[str] = None
    account: Optional[str] = None
    job_name: Optional[str] = None
    stdout_path: Optional[str] = None
    stderr_path: Optional[str] = None
    extra_options: Tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)
    prologue: Tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)

    @property
    def env(self) -> Dict[str, str]:
        return dict(self.environment)


# --------------------------------------------------------------------------------------------
# Validation shared by dialects
# --------------------------------------------------------------------------------------------


def single_line(what: str, value: str) -> str:
    """``value`` if it is one line of text, else BatchScriptError saying why."""
    problem = line_problem(what, value)
    if problem is not None:
        raise BatchScriptError(problem)
    return value



def _validate_common(spec: ScriptSpec) -> None:
    if not spec.executable:
        raise BatchScriptError("executable is empty")
    if "\0" in spec.executable or any("\0" in a for a in spec.arguments):
        # The only byte an argv element cannot carry.
        raise BatchScriptError("executable and arguments must not contain NUL")
    for name, value in spec.environment:
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise BatchScriptError(f"environment variable name {name!r} is not a shell identifier")
        if not isinstance(value, str) or "\0" in value:
            raise BatchScriptError(f"environment variable {name} has a value that is not NUL-free text")
    if spec.num_procs < 1:
        raise BatchScriptError(f"num_procs must be at least 1, got {spec.num_procs}")
    for what, n in (("nodes", spec.nodes), ("cpus_per_task", spec.cpus_per_task)):
        if n is not None and n < 1:
            raise BatchScriptError(f"{what} must be at least 1, got {n}")
    if spec.memory is not None and not _MEMORY.match(str(spec.memory)):
        raise BatchScriptError(f"memory {spec.memory!r} is not a size like 4000, 500M or 4G")
    if spec.time_limit is not None and not _TIME.match(str(spec.time_limit)):
        raise BatchScriptError(
            f"time limit {spec.time_limit!r} is not minutes or [D-]HH:MM:SS"
        )
    for what in ("queue", "account", "job_name", "working_dir", "stdout_path", "stderr_path"):
        value = getattr(spec, what)
        if value is not None:
            if value == "":
                raise BatchScriptError(f"{what} is empty")
            single_line(what, value)
    for opt in spec.extra_options:
        single_line("extra option", opt)
        if not opt.startswith("-"):
            # Anything else would be taken by the submit command as the script file name.
            raise BatchScriptError(f"extra option {opt!r} does not start with '-'")
    for command in spec.prologue:
        single_line("prologue command", command)


# --------------------------------------------------------------------------------------------
# Dialects
# --------------------------------------------------------------------------------------------


class Dialect:
    """How one scheduler spells options, directives, submission and program launch."""

    name = "abstract"
    directive_prefix = "#"
    submit_command: Tuple[str, ...] = ()

    def options(self, spec: ScriptSpec) -> List[Tuple[str, ...]]:
        """Scheduler options as argv groups: one tuple of argv elements per option
        (``("--ntasks=4",)`` for SLURM, ``("-l", "walltime=1:00:00")`` for PBS)."""
        raise NotImplementedError

    def launch_prefix(self, spec: ScriptSpec) -> List[str]:
        """argv put before the program on the script's program line (may be empty)."""
        raise NotImplementedError

    def check_directive_value(self, group: Tuple[str, ...]) -> None:
        """Refuse option text the scheduler's directive parser could misread."""
        for element in group:
            for ch in element:
                if ch.isspace() or ch in "\"'#\\":
                    raise BatchScriptError(
                        f"option {' '.join(group)!r} cannot be written as a {self.directive_prefix}"
                        f" directive (contains {ch!r}); pass options on the command line instead"
                    )


class SlurmDialect(Dialect):
    """sbatch options (``--name=value``, always one argv element) and an srun launch."""

    name = "slurm"
    directive_prefix = "#SBATCH"
    submit_command = ("sbatch", "--parsable")

    def options(self, spec: ScriptSpec) -> List[Tuple[str, ...]]:
        opts: List[Tuple[str, ...]] = []

        def add(flag: str, value) -> None:
            if value is not None:
                opts.append((f"--{flag}={single_line(flag, str(value))}",))

        add("job-name", spec.job_name)
        add("partition", spec.queue)
        add("account", spec.account)
        add("ntasks", spec.num_procs)
        add("nodes", spec.nodes)
        add("cpus-per-task", spec.cpus_per_task)
        add("mem", spec.memory)
        add("time", spec.time_limit)
        add("chdir", spec.working_dir)
        add("output", spec.stdout_path)
        add("error", spec.stderr_path)
        opts.extend((opt,) for opt in spec.extra_options)
        return opts

    def launch_prefix(self, spec: ScriptSpec) -> List[str]:
        argv = ["srun", f"--ntasks={spec.num_procs}"]
        if spec.nodes is not None:
            argv.append(f"--nodes={spec.nodes}")
        if spec.cpus_per_task is not None:
            argv.append(f"--cpus-per-task={spec.cpus_per_task}")
        argv.append("--")
        return argv


#: The SLURM dialect (stateless; share it).
SLURM = SlurmDialect()


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def scheduler_options(spec: ScriptSpec, dialect: Dialect = SLURM) -> List[str]:
    """The scheduler options of ``spec`` as flat argv elements (validated)."""
    _validate_common(spec)
    return [element for group in dialect.options(spec) for element in group]


def submit_argv(
    spec: ScriptSpec,
    dialect: Dialect = SLURM,
    script_path: Optional[str] = None,
    with_options: bool = True,
) -> List[str]:
    """argv submitting ``spec``: the dialect's submit command, the options (unless the
    script embeds them: ``with_options=False``) and the script path; with no path the
    script is read from stdin (sbatch does that)."""
    argv = list(dialect.submit_command)
    if with_options:
        argv += scheduler_options(spec, dialect)
    else:
        _validate_common(spec)
    if script_path is not None:
        single_line("script path", script_path)
        if script_path.startswith("-"):
            script_path = "./" + script_path
        argv.append(script_path)
    return argv


def render_script(spec: ScriptSpec, dialect: Dialect = SLURM, embed_options: bool = False) -> str:
    """The bash batch script for ``spec``.

    With ``embed_options`` the scheduler options are also written as directives (and
    refused if the directive parser could misread them); by default they belong on the
    submit command line (``submit_argv``) and the script holds none.
    """
    _validate_common(spec)
    lines = ["#!/bin/bash"]
    if embed_options:
        for group in dialect.options(spec):
            dialect.check_directive_value(group)
            lines.append(f"{dialect.directive_prefix} {' '.join(group)}")
    lines.append("# Generated by proxy-agent: every value below is shell-quoted.")
    # sbatch reads #SBATCH lines up to the first command: this one, so no line below (a
    # prologue command, say) can add options.
    lines.append(":")
    for name, value in spec.environment:
        lines.append(f"export {name}={shlex.quote(value)}")
    if spec.working_dir is not None:
        # The scheduler already starts here (--chdir); cd again so the script stays correct
        # when run by other means.
        lines.append(f"cd -- {shlex.quote(spec.working_dir)} || exit 1")
    # Prologue commands are shell command lines by design: written as given, one per line.
    lines.extend(spec.prologue)
    program = dialect.launch_prefix(spec) + [spec.executable, *spec.arguments]
    lines.append("exec " + " ".join(shlex.quote(word) for word in program))
    return "\n".join(lines) + "\n"
