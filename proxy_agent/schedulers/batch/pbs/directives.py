"""PBS submission: a job description -> ``qsub`` argv and a bash script. Pure functions.

Both PBS families take the same shape of submission, built here from the neutral
:class:`~proxy_agent.service.jobs.JobSpec`:

* Every scheduler option is an element of qsub's argv; the script reaches qsub on **stdin**.
  stdin rather than a file: nothing to create, clean up or race on, no path to quote, and
  both families read a script from stdin when no script operand is given (as sbatch does for
  the SLURM dialect in :mod:`..script`).
* ``-C ''`` turns off qsub's scanning of the script for ``#PBS`` directives. The script
  holds none, but an environment value or a prologue line could contain a line starting with
  ``#PBS`` (inside quotes, harmless to bash) which qsub would otherwise obey.
* ``-S /bin/bash`` runs the script with bash whatever the user's login shell is.
* OpenPBS / PBS Professional also get ``-f`` (qsub otherwise leaves a background helper
  process running after the first submission) and ``-k oed`` from 19.0 on (output written
  straight to the requested files, so it can be followed while the job runs). Torque has no
  such option; there output reaches the requested files when the job ends unless the
  execution hosts set ``$spool_as_final_name``.

The script quotes every user value with ``shlex.quote``; environment variables become
``export NAME=value`` with ``NAME`` checked to be a shell identifier. With more than one
process the program is started by ``pbsdsh``, once per slot PBS gave the job (the analogue
of ``srun`` in the SLURM dialect); pbsdsh starts each copy in the job's original
environment, so the exports, the prologue and the ``cd`` run inside every copy.
"""

from __future__ import annotations

import math
import posixpath
import re
from typing import Dict, List, Optional, Sequence, Tuple

import attrs

from ....service.jobs import JobSpec
from ....service.jobs import ErrorKind
from ..script import BatchScriptError, ScriptForm, check_spec, render_script
from ..script import single_line as _line
from .parse import FAMILY_OPENPBS, FAMILY_TORQUE

__all__ = [
    "PbsUnsupported",
    "PbsSubmission",
    "QSUB_OPTIONS",
    "NAME_LIMIT",
    "build_submission",
    "qsub_argv",
    "render_pbs_script",
    "sanitize_job_name",
    "check_native_options",
    "format_walltime",
]


class PbsUnsupported(BatchScriptError):
    """A job setting this PBS family cannot express at all (say, a quality of service)."""

    default_kind = ErrorKind.NOT_SUPPORTED


#: Longest job name each family is sure to accept (Torque before 4.0 allowed only 15).
NAME_LIMIT = {FAMILY_OPENPBS: 236, FAMILY_TORQUE: 15}

#: qsub's own options per family: letter -> whether it takes a value.
QSUB_OPTIONS: Dict[str, Dict[str, bool]] = {
    FAMILY_OPENPBS: {
        **{letter: True for letter in "aAcCeJjklmMNopPqrRSuvW"},
        **{letter: False for letter in "fGhIVXz"},
    },
    FAMILY_TORQUE: {
        **{letter: True for letter in "aAbcCdDeFijkKlLmMNopPqrStTuvwW"},
        **{letter: False for letter in "fhInVxXz"},
    },
}

#: Options a job attribute already sets: passing them natively would fight that attribute.
_OWNED = {
    "N": "the job's name",
    "o": "stdout_path",
    "e": "stderr_path",
    "j": "stdout_path and stderr_path",
    "k": "the output paths (output is written where the job asks)",
    "q": "queue",
    "h": "hold",
    "A": "account",
    "a": "begin_time",
    "C": "nothing: the agent turns directive scanning off",
    "S": "nothing: the agent runs its script with bash",
}
_OWNED_BY_FAMILY = {
    FAMILY_OPENPBS: {"J": "array"},
    FAMILY_TORQUE: {"t": "array", "d": "working_dir", "w": "working_dir", "n": "exclusive"},
}
#: Options that would break the agent's use of qsub.
_REFUSED = {
    "I": "interactive jobs need a terminal",
    "X": "X11 forwarding needs an interactive job",
    "G": "GUI sessions need an interactive job",
    "x": "it runs a script in an interactive job",
    "z": "qsub would not print the new job's id",
}

_FEATURE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*\Z")
_GRES = re.compile(r"([A-Za-z][A-Za-z0-9_.\-]*)(?::([0-9]+))?\Z")
_OPENPBS_ARRAY = re.compile(r"([0-9]+)-([0-9]+)(?::([0-9]+))?\Z")
_TORQUE_ARRAY = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*(?:%[0-9]+)?\Z")
_BEGIN = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2}))?\Z")


def _word(what: str, value: str) -> str:
    """A value that is one argv element of its own: single line, not empty, and not
    starting with '-' (which would read as another option to a person, if not to qsub)."""
    _line(what, value)
    if not value:
        raise BatchScriptError(f"{what} is empty")
    if value.startswith("-"):
        raise BatchScriptError(f"{what} {value!r} must not start with '-'")
    if any(ch.isspace() for ch in value):
        raise BatchScriptError(f"{what} {value!r} must not contain white space")
    return value


def sanitize_job_name(name: str, family: str) -> str:
    """A name every release of ``family`` accepts for ``-N``: ASCII letters, digits and
    ``_.+-`` (anything else becomes ``_``), starting with a letter (Torque demands it, and a
    name that reads as a number comes back from OpenPBS's JSON as a number), at most
    :data:`NAME_LIMIT` characters. The job's real name is kept by the service."""
    cleaned = "".join(ch if (ch.isascii() and (ch.isalnum() or ch in "_.+-")) else "_" for ch in name)
    if not cleaned or not cleaned[0].isalpha():
        cleaned = "j" + cleaned
    return cleaned[: NAME_LIMIT[family]]


def format_walltime(seconds: int) -> str:
    """Seconds -> ``HH:MM:SS`` with as many hours as needed (``100:00:00``)."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _output_path(what: str, path: str, spec: JobSpec, submit_host: Optional[str]) -> str:
    """An output path as qsub's ``-o``/``-e`` take it: absolute (qsub would resolve a
    relative one against the agent's own directory), and with the submit host in front when
    the path has a colon (qsub reads ``host:path`` otherwise)."""
    _line(what, path)
    if not path:
        raise BatchScriptError(f"{what} is empty")
    if not path.startswith("/"):
        base = spec.working_dir
        if not base or not base.startswith("/"):
            raise BatchScriptError(
                f"{what} {path!r} is relative: give an absolute path or an absolute working_dir"
            )
        path = posixpath.join(base, path)
    if ":" in path:
        if not submit_host:
            raise BatchScriptError(
                f"{what} {path!r} contains ':', which qsub reads as host:path; "
                "the submit host is needed to pass it"
            )
        return f"{_word('submit host', submit_host)}:{path}"
    return path


def _features(constraint: Optional[str]) -> List[str]:
    if constraint is None:
        return []
    _line("constraint", constraint)
    if any(ch in constraint for ch in "|[]*!"):
        raise PbsUnsupported(
            f"constraint {constraint!r}: PBS can only require features, not choose between "
            "them; give feature names joined by '&' or ','"
        )
    names = [part.strip() for part in re.split(r"[&,]", constraint) if part.strip()]
    for feature in names:
        if not _FEATURE.match(feature):
            raise BatchScriptError(f"constraint feature {feature!r} is not a valid name")
    if not names:
        raise BatchScriptError("constraint is empty")
    return names


def _gres(gres: Optional[str]) -> List[Tuple[str, int]]:
    if gres is None:
        return []
    _line("gres", gres)
    items = []
    for part in gres.split(","):
        match = _GRES.match(part.strip())
        if not match:
            raise BatchScriptError(f"gres item {part.strip()!r} is not NAME or NAME:COUNT")
        items.append((match.group(1), int(match.group(2) or 1)))
    return items


def _begin(begin_time: Optional[str]) -> Optional[str]:
    """``2024-03-01T18:30[:15]`` -> qsub's ``-a`` form ``202403011830.15``."""
    if begin_time is None:
        return None
    match = _BEGIN.match(_line("begin_time", begin_time).strip())
    if not match:
        raise BatchScriptError(
            f"begin_time {begin_time!r} is not a date and time like 2024-03-01T18:30:00"
        )
    year, month, day, hour, minute, second = match.groups()
    return f"{year}{month}{day}{hour}{minute}.{second or '00'}"


def _check_counts(spec: JobSpec) -> Tuple[int, int, Optional[int]]:
    if spec.num_procs < 1:
        raise BatchScriptError(f"num_procs must be at least 1, got {spec.num_procs}")
    per_task = spec.cpus_per_task if spec.cpus_per_task is not None else 1
    if per_task < 1:
        raise BatchScriptError(f"cpus_per_task must be at least 1, got {per_task}")
    nodes = spec.nodes
    if nodes is not None:
        if nodes < 1:
            raise BatchScriptError(f"nodes must be at least 1, got {nodes}")
        if spec.num_procs < nodes:
            raise BatchScriptError(
                f"num_procs ({spec.num_procs}) is smaller than nodes ({nodes}): "
                "every node needs a process"
            )
    for what in ("memory", "gpus", "wall_time"):
        value = getattr(spec, what)
        if value is not None and value < 1:
            raise BatchScriptError(f"{what} must be at least 1, got {value}")
    return spec.num_procs, per_task, nodes


def _openpbs_resources(spec: JobSpec) -> List[str]:
    """``select`` and ``place`` for OpenPBS: with ``nodes`` one chunk per node holding its
    share of the processes (memory, GPUs and generic resources are per node); without, one
    chunk per process placed freely, the memory split evenly between them and GPUs and
    generic resources on the first chunk (the job asked for them once)."""
    procs, per_task, nodes = _check_counts(spec)
    features = "".join(f":{name}=True" for name in _features(spec.constraint))
    extras = ([("ngpus", spec.gpus)] if spec.gpus else []) + _gres(spec.gres)
    extra_text = "".join(f":{name}={count}" for name, count in extras)
    if nodes is not None:
        share = math.ceil(procs / nodes)
        chunk = f"{nodes}:ncpus={share * per_task}:mpiprocs={share}"
        if spec.memory:
            chunk += f":mem={spec.memory}mb"
        select = chunk + extra_text + features
        place = "scatter:excl" if spec.exclusive else "scatter"
    else:
        memory = f":mem={math.ceil(spec.memory / procs)}mb" if spec.memory else ""
        one = f"ncpus={per_task}:mpiprocs=1{memory}{features}"
        if extras:
            select = f"1:{one}{extra_text}"
            if procs > 1:
                select += f"+{procs - 1}:{one}"
        else:
            select = f"{procs}:{one}"
        place = "excl" if spec.exclusive else None
    options = ["-l", f"select={select}"]
    if place:
        options += ["-l", f"place={place}"]
    return options


def _torque_resources(spec: JobSpec) -> List[str]:
    """``nodes=K:ppn=P`` for Torque (one node when ``nodes`` is not given, the usual Torque
    default), GPUs and features per node, memory as the job's total."""
    procs, per_task, nodes = _check_counts(spec)
    count = nodes if nodes is not None else 1
    ppn = math.ceil(procs / count) * per_task
    spec_text = f"{count}:ppn={ppn}"
    if spec.gpus:
        spec_text += f":gpus={spec.gpus}"
    spec_text += "".join(f":{name}" for name in _features(spec.constraint))
    options = ["-l", f"nodes={spec_text}"]
    if spec.memory:
        options += ["-l", f"mem={spec.memory * count}mb"]
    gres = _gres(spec.gres)
    if gres:
        options += ["-l", "gres=" + "+".join(f"{name}:{n}" for name, n in gres)]
    if spec.exclusive:
        options.append("-n")
    return options


def check_native_options(options: Sequence[str], family: str) -> List[str]:
    """Check pass-through options against qsub's own option list for ``family``.

    Each element is one argv element: ``-l``, ``walltime=1:00:00``, ``-Wdepend=afterok:12``,
    ``-mbe``. Unknown options, operands (which qsub would take as the script), long options,
    options a job attribute already sets and options that would break the agent (interactive
    jobs, ``-z``, ``-W block=true``) are refused, naming the option. Nothing is ever given
    to a shell; the checked elements are returned unchanged.
    """
    table = QSUB_OPTIONS[family]
    owned = dict(_OWNED, **_OWNED_BY_FAMILY[family])
    checked: List[str] = []
    i = 0
    while i < len(options):
        element = _line("native option", options[i])
        if not element.startswith("-"):
            raise BatchScriptError(
                f"native option {element!r} does not start with '-' (qsub would take it as "
                "the script to run)"
            )
        if element == "-" or element.startswith("--"):
            raise BatchScriptError(f"native option {element!r} is not a qsub option")
        checked.append(element)
        j = 1
        while j < len(element):
            letter = element[j]
            if letter not in table:
                raise BatchScriptError(f"native option -{letter} is not a qsub option of {family}")
            if letter in _REFUSED:
                raise BatchScriptError(f"native option -{letter} is not allowed: {_REFUSED[letter]}")
            if letter in owned:
                raise BatchScriptError(f"native option -{letter} is set through {owned[letter]}")
            if table[letter]:
                value = element[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(options):
                        raise BatchScriptError(f"native option -{letter} needs a value")
                    value = _line("native option value", options[i])
                    checked.append(value)
                if letter == "W" and re.search(r"(^|,)\s*block\s*=", value):
                    raise BatchScriptError("native option -W block is not allowed: qsub would wait for the job")
                break
            j += 1
        i += 1
    return checked


def _validate(spec: JobSpec) -> None:
    check_spec(spec)
    if spec.qos is not None:
        raise PbsUnsupported(
            f"PBS has no quality of service (qos {spec.qos!r}): choose a queue instead"
        )


def qsub_argv(
    spec: JobSpec,
    family: str,
    version: Tuple[int, ...] = (),
    submit_host: Optional[str] = None,
) -> List[str]:
    """The qsub argv submitting ``spec`` (the script goes on stdin: see the module doc).

    ``version`` is the PBS version from probing (``()``: unknown, taken as recent);
    ``submit_host`` this machine's name, needed only for an output path with a colon.
    """
    if family not in QSUB_OPTIONS:
        raise ValueError(f"unknown PBS family {family!r}")
    _validate(spec)
    argv = ["qsub"]
    if family == FAMILY_OPENPBS:
        argv.append("-f")
    argv += ["-C", "", "-S", "/bin/bash"]
    argv += ["-N", sanitize_job_name(spec.display_name, family)]
    stdout = _output_path("stdout_path", spec.stdout_path, spec, submit_host) if spec.stdout_path else None
    stderr = _output_path("stderr_path", spec.stderr_path, spec, submit_host) if spec.stderr_path else None
    if stdout is not None and stdout == stderr:
        argv += ["-j", "oe", "-o", stdout]
    else:
        if stdout is not None:
            argv += ["-o", stdout]
        if stderr is not None:
            argv += ["-e", stderr]
    if family == FAMILY_OPENPBS and (not version or version >= (19,)):
        argv += ["-k", "oed"]
    if spec.queue is not None:
        queue = spec.queue.partition(":")[2] if ":" in spec.queue else spec.queue
        argv += ["-q", _word("queue", queue)]
    if spec.hold:
        argv.append("-h")
    if spec.account is not None:
        argv += ["-A", _word("account", spec.account)]
    if family == FAMILY_OPENPBS:
        argv += _openpbs_resources(spec)
    else:
        argv += _torque_resources(spec)
    if spec.wall_time is not None:
        argv += ["-l", f"walltime={format_walltime(spec.wall_time)}"]
    if spec.array is not None:
        argv += _array(spec.array, family)
    begin = _begin(spec.begin_time)
    if begin is not None:
        argv += ["-a", begin]
    argv += check_native_options(spec.native_options, family)
    return argv


def _array(array: str, family: str) -> List[str]:
    text = _line("array", array).strip()
    if family == FAMILY_OPENPBS:
        match = _OPENPBS_ARRAY.match(text)
        if not match or int(match.group(1)) > int(match.group(2)) or match.group(3) == "0":
            raise BatchScriptError(
                f"array {array!r}: OpenPBS takes one range FIRST-LAST[:STEP] (no lists, no "
                "limit on running elements)"
            )
        return ["-J", text]
    if not _TORQUE_ARRAY.match(text):
        raise BatchScriptError(f"array {array!r}: Torque takes indices and ranges like 1-10,20%4")
    return ["-t", text]


#: PBS's row of the script table (:mod:`..script`): the same for both families, and the
#: script holds no directives (``-C ''`` on the command line).  pbsdsh starts each copy in
#: the job's original environment, so the exports, the prologue and the ``cd`` run in each.
SCRIPT = ScriptForm("pbs", directive="#PBS", submit_command="qsub", prologue_first=True,
                    copies=("pbsdsh", "--", "/bin/bash", "-c"),
                    copies_comment="# One copy per slot of the job, each started by pbsdsh in the job's "
                                   "original environment.")


def render_pbs_script(spec: JobSpec) -> str:
    """The bash script for ``spec`` (the same for both families; it holds no directives)."""
    _validate(spec)
    return render_script(spec, SCRIPT)


@attrs.frozen
class PbsSubmission:
    """One ready submission: run ``argv`` with ``script`` (UTF-8) on its stdin; PBS will
    list the job under ``pbs_name``."""

    argv: Tuple[str, ...]
    script: str
    pbs_name: str


def build_submission(
    spec: JobSpec,
    family: str,
    version: Tuple[int, ...] = (),
    submit_host: Optional[str] = None,
) -> PbsSubmission:
    """argv, script and PBS-side name for ``spec``; :class:`BatchScriptError` (or
    :class:`PbsUnsupported`) names what cannot be submitted."""
    argv = qsub_argv(spec, family, version, submit_host)
    return PbsSubmission(tuple(argv), render_pbs_script(spec), sanitize_job_name(spec.display_name, family))
