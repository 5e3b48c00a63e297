"""SLURM's batch settings: the :class:`~proxy_agent.service.jobs.JobSpec` batch fields as
``sbatch`` options, each value checked.  Pure functions; nothing here runs a command.

Every option is one argv element ``--name=value`` of ``sbatch`` (never parsed by a shell);
a value holding a newline, carriage return or NUL is refused, and each value must have the
form SLURM itself takes, so a mistake is reported by the agent, naming the field, before
sbatch sees it.

What each field becomes
-----------------------
``name`` --job-name, ``queue`` --partition, ``account`` --account, ``num_procs`` --ntasks,
``nodes`` --nodes, ``cpus_per_task`` --cpus-per-task, ``memory`` (MB per node) --mem,
``wall_time`` (seconds) --time, ``working_dir`` --chdir, ``stdout_path``/``stderr_path``
--output/--error; ``hold`` --hold; ``begin_time`` --begin; ``gpus`` --gpus=N; ``gres``
--gres (``name[:type][:count]``, comma separated); ``qos`` --qos; ``constraint``
--constraint (node features with SLURM's ``& | , [] () *`` operators); ``exclusive``
--exclusive; ``array`` --array (``1-10:2,15`` and ``%N`` for N tasks at once; every task
appends to the job's output files, --open-mode=append, so the output of each is kept);
``prologue`` is written into the script (see :mod:`..script`); ``native_options`` are
further sbatch options, each checked against :data:`SBATCH_OPTIONS`.

The script (:data:`SCRIPT`) starts the program through ``srun --ntasks=N [...] --`` (with
``exec``, so signals sent to the job reach srun directly).  Even for one task this makes the
program a job step: SLURM then tracks its processes, delivers signals to them, records
per-step accounting, and a multi-task job runs N copies as the PTP process model expects.
``--`` ends srun's options, so an executable named like an option is still run as a program.
sbatch reads ``#SBATCH`` lines up to the first command: the script's ``:`` line, so no line
below it (a prologue command, say) can add options.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from ....service.jobs import JobSpec
from ..script import FORBIDDEN_IN_LINE, BatchScriptError, ScriptForm, check_spec, line_problem, render_script, \
    single_line
from .system import slurm_duration

__all__ = ["SBATCH_OPTIONS", "SCRIPT", "batch_options", "check_native_options", "check_prologue", "job_script",
           "sbatch_options", "submit_argv"]

_WORD = re.compile(r"[A-Za-z0-9_.+@-]+\Z")
_GRES_ITEM = re.compile(r"[A-Za-z][A-Za-z0-9_/.-]*(?::[A-Za-z0-9_.-]+)?(?::[0-9]+[KMGT]?)?\Z")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.:=&|,*\[\]()-]+\Z")
_ARRAY_RANGE = r"[0-9]+(?:-[0-9]+(?::[1-9][0-9]*)?)?"
_ARRAY = re.compile(rf"({_ARRAY_RANGE}(?:,{_ARRAY_RANGE})*)(?:%([1-9][0-9]*))?\Z")


def _bad(message: str) -> BatchScriptError:
    return BatchScriptError(message)


def _text(what: str, value: str) -> str:
    if isinstance(value, str) and value.strip() == "":
        raise _bad(f"{what} is empty")
    problem = line_problem(what, value)
    if problem is not None:
        raise _bad(problem)
    return value.strip()


def _matching(what: str, value: str, pattern: "re.Pattern[str]", form: str) -> str:
    text = _text(what, value)
    if not pattern.match(text):
        raise _bad(f"{what} {value!r} is not {form}")
    return text


def check_prologue(commands: Sequence[str]) -> List[str]:
    """Prologue commands, one line each, checked (none empty, none holding a line break)."""
    lines = []
    for command in commands:
        if not isinstance(command, str):
            raise _bad(f"prologue command must be text, got {type(command).__name__}")
        for ch in FORBIDDEN_IN_LINE:
            if ch in command:
                raise _bad(f"prologue command {command!r} must be one line (contains {ch!r}); "
                           "give one command per line")
        if command.strip():
            lines.append(command)
    return lines


def _array(text: str) -> str:
    spec = _matching("array", text, _ARRAY, "a list of task ranges like 1-10, 1-9:2,20 or 1-100%5")
    ranges = _ARRAY.match(spec)
    assert ranges is not None  # _matching has checked it
    for part in ranges.group(1).split(","):
        first, _, rest = part.partition("-")
        last = rest.partition(":")[0]
        if last and int(last) < int(first):
            raise _bad(f"array {text!r}: the range {part} ends before it starts")
    return spec


def _srun(spec: JobSpec) -> List[str]:
    argv = ["srun", f"--ntasks={spec.num_procs}"]
    if spec.nodes is not None:
        argv.append(f"--nodes={spec.nodes}")
    if spec.cpus_per_task is not None:
        argv.append(f"--cpus-per-task={spec.cpus_per_task}")
    argv.append("--")
    return argv


#: SLURM's row of the script table (:mod:`..script`).
SCRIPT = ScriptForm("slurm", directive="#SBATCH", submit_command="sbatch", after_header=(":",), launcher=_srun)
SUBMIT_COMMAND = ("sbatch", "--parsable")


#: the name an error gives the value of an option
_FIELD_NAMES = {"job-name": "job_name", "chdir": "working_dir", "output": "stdout_path", "error": "stderr_path",
                "partition": "queue"}


def sbatch_options(spec: JobSpec) -> List[Tuple[str, ...]]:
    """Every sbatch option of ``spec``, checked, as argv groups of one element each."""
    check_spec(spec)
    if spec.memory is not None and spec.memory < 0:
        raise _bad(f"memory must be at least 1 MB, got {spec.memory}")
    options: List[Tuple[str, ...]] = []
    for flag, value in (
        ("job-name", spec.display_name), ("partition", spec.queue), ("account", spec.account),
        ("ntasks", spec.num_procs), ("nodes", spec.nodes), ("cpus-per-task", spec.cpus_per_task),
        ("mem", spec.memory or None), ("time", slurm_duration(spec.wall_time) if spec.wall_time else None),
        ("chdir", spec.working_dir), ("output", spec.stdout_path), ("error", spec.stderr_path),
    ):
        if value is not None:
            options.append((f"--{flag}={single_line(_FIELD_NAMES.get(flag, flag), str(value))}",))
    if spec.hold:
        options.append(("--hold",))
    if spec.begin_time:
        options.append(("--begin=" + single_line("begin_time", spec.begin_time),))
    options += [(option,) for option in batch_options(spec)]
    return options


def submit_argv(spec: JobSpec, script_path: Optional[str] = None, with_options: bool = True) -> List[str]:
    """``sbatch --parsable`` with the options of ``spec`` (none with ``with_options=False``:
    then the script carries them as directives) and the script's path; with no path sbatch
    reads the script from its stdin."""
    options = sbatch_options(spec)
    argv = [*SUBMIT_COMMAND, *(element for group in options for element in group)] if with_options \
        else list(SUBMIT_COMMAND)
    if script_path is not None:
        single_line("script path", script_path)
        argv.append("./" + script_path if script_path.startswith("-") else script_path)
    return argv


def job_script(spec: JobSpec, embed_options: bool = False) -> str:
    """The job script of ``spec``; with ``embed_options`` its options as ``#SBATCH`` lines too."""
    options = sbatch_options(spec)  # checked even when they go on the command line
    return render_script(spec, SCRIPT, options if embed_options else ())


def batch_options(spec: JobSpec) -> List[str]:
    """sbatch options for the batch settings of ``spec`` beyond those every batch system
    has (:func:`sbatch_options` writes those): GPUs, generic resources, QoS, constraint, exclusive,
    array and the native options.  SubmitError naming the field whose value SLURM could not take."""
    opts: List[str] = []
    if spec.gpus is not None:
        if spec.gpus < 0:
            raise _bad(f"gpus must not be negative, got {spec.gpus}")
        if spec.gpus:
            opts.append(f"--gpus={spec.gpus}")
    if spec.gres is not None:
        items = [item.strip() for item in _text("gres", spec.gres).split(",")]
        for item in items:
            if not _GRES_ITEM.match(item):
                raise _bad(f"gres {spec.gres!r}: {item!r} is not a resource like gpu, gpu:2 or gpu:a100:2")
        opts.append("--gres=" + ",".join(items))
    if spec.qos is not None:
        opts.append("--qos=" + _matching("qos", spec.qos, _WORD, "a quality of service name"))
    if spec.constraint is not None:
        opts.append("--constraint=" + _matching(
            "constraint", spec.constraint, _CONSTRAINT, "node features joined by & | , like fast&ib"))
    if spec.exclusive:
        opts.append("--exclusive")
    if spec.array is not None:
        opts.append("--array=" + _array(spec.array))
        # Every task writes the one output file the agent follows: appended, none lost.
        opts.append("--open-mode=append")
    opts += check_native_options(spec.native_options)
    return opts


# --------------------------------------------------------------------------- native options

#: sbatch options a job may pass through (those of SLURM 22.05's ``sbatch --help``), with
#: whether each takes a value: True (required), False (a flag), None (optional).  Options a
#: job field sets, and those that change how the agent submits or follows the job, are not
#: in it (see the two tables below).
SBATCH_OPTIONS: Dict[str, Optional[bool]] = {
    "--acctg-freq": True, "--bb": True, "--bbf": True, "--cluster-constraint": True, "--comment": True,
    "--contiguous": False, "--core-spec": True, "--cores-per-socket": True, "--cpu-freq": True,
    "--cpus-per-gpu": True, "--deadline": True, "--delay-boot": True, "--dependency": True,
    "--distribution": True, "--exclude": True, "--extra-node-info": True, "--gpu-bind": True,
    "--gpu-freq": True, "--gpus-per-node": True, "--gpus-per-socket": True, "--gpus-per-task": True,
    "--gres-flags": True, "--hint": True, "--kill-on-invalid-dep": True, "--licenses": True,
    "--mail-type": True, "--mail-user": True, "--mcs-label": True, "--mem-bind": True,
    "--mem-per-cpu": True, "--mem-per-gpu": True, "--mincpus": True, "--network": True, "--nice": None,
    "--no-kill": None, "--no-requeue": False, "--nodefile": True, "--nodelist": True,
    "--ntasks-per-core": True, "--ntasks-per-gpu": True, "--ntasks-per-node": True,
    "--ntasks-per-socket": True, "--overcommit": False, "--oversubscribe": False, "--power": True,
    "--priority": True, "--profile": True, "--propagate": None, "--reboot": False, "--requeue": False,
    "--reservation": True, "--signal": True, "--sockets-per-node": True, "--spread-job": False,
    "--switches": True, "--thread-spec": True, "--threads-per-core": True, "--time-min": True, "--tmp": True,
    "--use-min-nodes": False, "--wckey": True,
}
#: short spellings of options in :data:`SBATCH_OPTIONS`
_SHORT = {"-d": "--dependency", "-D": "--chdir", "-F": "--nodefile", "-k": "--no-kill", "-L": "--licenses",
          "-m": "--distribution", "-O": "--overcommit", "-s": "--oversubscribe", "-S": "--core-spec",
          "-w": "--nodelist", "-x": "--exclude", "-A": "--account", "-a": "--array", "-b": "--begin",
          "-C": "--constraint", "-c": "--cpus-per-task", "-e": "--error", "-G": "--gpus", "-H": "--hold",
          "-J": "--job-name", "-N": "--nodes", "-n": "--ntasks", "-o": "--output", "-p": "--partition",
          "-q": "--qos", "-t": "--time", "-W": "--wait", "-i": "--input", "-M": "--clusters"}
_FIELD_OPTIONS = {
    "--account": "account", "--array": "array", "--begin": "beginTime", "--chdir": "workingDir",
    "--constraint": "constraint", "--cpus-per-task": "cpusPerTask", "--error": "stderrPath",
    "--exclusive": "exclusive", "--export": "environment", "--gpus": "gpus", "--gres": "gres",
    "--hold": "hold", "--job-name": "name", "--mem": "memory", "--nodes": "nodes", "--ntasks": "jobNumProcs",
    "--output": "stdoutPath", "--partition": "queue", "--qos": "qos", "--time": "timeLimit",
}
_AGENT_OPTIONS = ("--parsable", "--wrap", "--wait", "--test-only", "--open-mode", "--input", "--uid", "--gid",
                  "--get-user-env", "--export-file", "--clusters", "--ignore-pbs", "--container", "--help",
                  "--usage", "--version", "--quiet", "--verbose", "--batch")


def check_native_options(options: Sequence[str]) -> List[str]:
    """Pass-through sbatch options as ``--name[=value]`` argv elements.

    Takes ``--name=value``, ``--name value`` (two elements or one with a space) and the
    short spellings (``-w node1``).  SubmitError naming the first option refused: unknown to
    sbatch, set by a job field, or one the agent decides."""
    elements: List[str] = []
    for element in options:
        text = _text("native option", element)
        option, sep, rest = text.partition(" ")
        if sep and "=" not in option:
            elements += [option, rest.strip()]
        else:
            elements.append(text)
    argv: List[str] = []
    i = 0
    while i < len(elements):
        given = elements[i]
        i += 1
        if not given.startswith("-") or given in ("-", "--"):
            raise _bad(f"native option {given!r} is not an sbatch option (options start with '-')")
        if given.startswith("--"):
            name, has_value, value = given.partition("=")
        else:
            name, has_value, value = given[:2], len(given) > 2, given[2:].lstrip("=")
            if name not in _SHORT:
                raise _bad(f"native option {given}: not an sbatch option that can be passed through; "
                           "give options by their long names (--comment=...)")
            name = _SHORT[name]
        if name in _FIELD_OPTIONS:
            raise _bad(f"native option {given}: set the job's {_FIELD_OPTIONS[name]} attribute instead")
        if name in _AGENT_OPTIONS:
            raise _bad(f"native option {given}: the agent decides how jobs are submitted and where their "
                       "output goes; it cannot be passed through")
        if name not in SBATCH_OPTIONS:
            raise _bad(f"native option {given}: not an sbatch option that can be passed through "
                       f"(allowed: {' '.join(sorted(SBATCH_OPTIONS))})")
        takes = SBATCH_OPTIONS[name]
        if takes is False and has_value:
            raise _bad(f"native option {given}: {name} takes no value")
        if takes and not has_value:
            if i >= len(elements) or (elements[i].startswith("-") and not elements[i][1:2].isdigit()):
                raise _bad(f"native option {name} needs a value ({name}=VALUE)")
            value, has_value = elements[i], True
            i += 1
        argv.append(f"{name}={value}" if has_value else name)
    return argv
