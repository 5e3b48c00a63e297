"""SLURM command lines and the parsing of their output: pure functions, no I/O, no trio.

The SLURM scheduler runs the commands named here and hands their stdout to the parsers here,
so the argv and the parser of each query live side by side and can never disagree. Every
query comes in two flavours:

* **text**: a fixed output format chosen by this module. Works on every SLURM this project
  supports (21.08 and later) and is the fast path: a 100,000-job ``squeue`` listing parses in
  a fraction of a second.
* **JSON** (``--json``): exact even for odd job names, but only where the installed SLURM has
  it. What exists where (checked against 22.05.8, see ``json_support``):

  ====================================  =======================================
  ``squeue --json``                     21.08 and later
  ``sinfo --json``                      21.08 and later (node list layout until 22.05,
                                        an aggregated ``"sinfo"`` list from 23.02)
  ``scontrol show job|node|partition``  23.02 and later
  ``--json``
  ``sacct --json``                      21.08 and later, but only with slurmdbd
  ====================================  =======================================

  JSON layouts differ by version and all of them are accepted: up to 22.05 (OpenAPI
  v0.0.37/v0.0.38) numbers are plain integers, ``job_state`` is a string and node states are
  a lowercase string plus a ``state_flags`` list; from 23.02 (data_parser v0.0.39+) numbers
  may be ``{"set": .., "infinite": .., "number": ..}`` objects and from 23.11 states are lists
  (``["RUNNING"]``, ``["IDLE", "DRAIN"]``) and exit codes objects.

Text formats and why they are robust
------------------------------------
``squeue`` and ``sacct`` print one record per job with fields separated by the ASCII unit
separator (0x1F) and, for ``squeue``, each record ended by the record separator (0x1E)
followed by the newline squeue adds. Neither control character occurs in names SLURM users
type, ``|`` and spaces in job names are harmless, and a newline inside a job name cannot
split a ``squeue`` record. The job name is always the *last* field and the split is bounded,
so even a 0x1F inside a name ends up in the name. ``squeue`` uses ``--Format`` with zero
widths and a suffix (``JobID:0<sep>``: untruncated, unpadded, then the separator), verified
on 22.05.8; a release whose ``--Format`` lacks field suffixes must use the JSON path.

``scontrol -o show ...`` prints ``Key=Value`` pairs separated by single spaces, one record
per line. Some values contain spaces (``JobName``, ``Reason``, ``OS``, ``Comment``...). A
space-separated piece starts a new pair only if it looks like a SLURM key (an upper-case
letter, then letters, digits, ``_``, ``:`` or ``/``, then ``=``); anything else continues the
previous value. A job *named* like ``x Key=y`` is therefore misread; use JSON where exactness
matters.

Normalisation
-------------
All fields are strings unless an int is natural (counts, CPUs, memory). Placeholders SLURM
prints for "nothing" (``(null)``, ``N/A``, ``None``, ``Unknown``, ``none``) become ``""``.
Times are SLURM's local-time text ``YYYY-MM-DDTHH:MM:SS``; JSON epoch values are rendered
the same way with the local time zone, so text and JSON listings compare equal. Durations
keep SLURM's own text (``10:00``, ``1-00:00:00``, ``UNLIMITED``); JSON durations are
rendered as squeue prints them; ``duration_seconds`` converts any of them. Exit codes are
``"exit:signal"`` (``"3:0"``, ``"0:9"``) whatever the source.
"""

from __future__ import annotations

import gc as _gc
import json as _json
import time as _time
from functools import lru_cache, wraps
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union, cast

import attrs

from ....service.jobs import NEVER_STARTS

__all__ = [
    "NEVER_STARTS_REASONS",
    "job_message",
    "SlurmError",
    "SlurmJob",
    "SlurmNode",
    "SlurmPartition",
    "FIELD_SEP",
    "RECORD_SEP",
    "SQUEUE_FIELDS",
    "SACCT_FIELDS",
    "SINFO_NODE_FIELDS",
    "squeue_argv",
    "nodes_argv",
    "partitions_argv",
    "scontrol_job_argv",
    "sacct_argv",
    "version_argv",
    "config_argv",
    "scancel_argv",
    "move_job_argv",
    "hold_job_argv",
    "release_job_argv",
    "suspend_job_argv",
    "resume_job_argv",
    "json_support",
    "parse_version",
    "json_version",
    "parse_squeue_text",
    "parse_squeue_json",
    "parse_sinfo_nodes_text",
    "parse_nodes_json",
    "parse_partitions_json",
    "parse_scontrol_records",
    "parse_scontrol_config",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_scontrol_partitions",
    "parse_scontrol_jobs_json",
    "parse_sacct_text",
    "parse_sacct_json",
    "parse_sbatch_parsable",
    "map_node_state",
    "map_partition_state",
    "JOB_STATE_CODES",
    "duration_seconds",
    "format_duration",
    "format_epoch",
    "exit_code_from_status",
]


class SlurmError(ValueError):
    """Output that cannot be what the command was asked for (or an error SLURM reported)."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _bulk(parser: _F) -> _F:
    """Run a listing parser with the cyclic garbage collector paused.

    A 100,000-job listing allocates millions of small strings and records; every allocation
    burst would trigger collections that find nothing (parsed records hold no cycles), which
    cost about 40% of the parse. Collection resumes, if it was on, when the parser returns.
    """

    @wraps(parser)
    def run(*args: Any, **kwargs: Any) -> Any:
        was_enabled = _gc.isenabled()
        _gc.disable()
        try:
            return parser(*args, **kwargs)
        finally:
            if was_enabled:
                _gc.enable()

    return cast(_F, run)


# --------------------------------------------------------------------------------------------
# Value classes
# --------------------------------------------------------------------------------------------


@attrs.frozen
class SlurmJob:
    """One job as SLURM reports it. ``state`` is SLURM's raw state (see ``JOB_STATE_CODES``).

    ``job_id`` is the unique numeric id (what scancel/scontrol accept); for an element of a
    job array, ``array_job_id``/``array_task_id`` give ``<base>`` and ``<index>``; a pending
    array not yet split into elements has ``array_task_id`` like ``"1-3"`` or ``"1-9%2"``.
    """

    job_id: str
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    state: str = ""
    reason: str = ""
    nodes: str = ""
    num_nodes: Optional[int] = None
    num_cpus: Optional[int] = None
    num_tasks: Optional[int] = None
    time_used: str = ""
    time_limit: str = ""
    exit_code: str = ""
    submit_time: str = ""
    start_time: str = ""
    end_time: str = ""
    work_dir: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    array_job_id: str = ""
    array_task_id: str = ""


@attrs.frozen
class SlurmNode:
    """One node. ``state`` is raw: ``IDLE``, ``MIXED+DRAIN`` (scontrol, JSON) or ``idle*``,
    ``drained`` (sinfo); see ``map_node_state``."""

    name: str
    state: str = ""
    cpus: Optional[int] = None
    memory_mb: Optional[int] = None
    partitions: Tuple[str, ...] = ()
    reason: str = ""
    alloc_cpus: Optional[int] = None


@attrs.frozen
class SlurmPartition:
    """One partition. ``state`` is ``UP``, ``DOWN``, ``DRAIN`` or ``INACTIVE``.

    ``max_time``/``default_time`` are duration text (``UNLIMITED`` when unbounded, ``""`` when
    not set); ``max_nodes`` is None when unlimited.
    """

    name: str
    state: str = ""
    is_default: bool = False
    max_time: str = ""
    default_time: str = ""
    max_nodes: Optional[int] = None
    total_nodes: Optional[int] = None
    total_cpus: Optional[int] = None
    nodes: str = ""


# --------------------------------------------------------------------------------------------
# Command lines
# --------------------------------------------------------------------------------------------

#: Field separator of the text formats (ASCII unit separator).
FIELD_SEP = "\x1f"
#: Ends every squeue text record, just before squeue's own newline (ASCII record separator).
RECORD_SEP = "\x1e"

#: squeue --Format field names, in output order, and the SlurmJob attribute each fills.
#: The job name must stay last (see the module docstring).
SQUEUE_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("JobID", "job_id"),
    ("ArrayJobID", "array_job_id"),
    ("ArrayTaskID", "array_task_id"),
    ("UserName", "user"),
    ("Account", "account"),
    ("Partition", "partition"),
    ("State", "state"),
    ("Reason", "reason"),
    ("NodeList", "nodes"),
    ("NumNodes", "num_nodes"),
    ("NumCPUs", "num_cpus"),
    ("NumTasks", "num_tasks"),
    ("TimeUsed", "time_used"),
    ("TimeLimit", "time_limit"),
    ("exit_code", "exit_code"),
    ("SubmitTime", "submit_time"),
    ("StartTime", "start_time"),
    ("EndTime", "end_time"),
    ("WorkDir", "work_dir"),
    ("STDOUT", "stdout_path"),
    ("STDERR", "stderr_path"),
    ("Name", "name"),
)

#: sacct --format field names, in output order, and the SlurmJob attribute each fills.
SACCT_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("JobIDRaw", "job_id"),
    ("JobID", "array_job_id"),  # "<base>_<index>" for array elements, else the id again
    ("User", "user"),
    ("Account", "account"),
    ("Partition", "partition"),
    ("State", "state"),
    ("Reason", "reason"),
    ("NodeList", "nodes"),
    ("NNodes", "num_nodes"),
    ("NCPUS", "num_cpus"),
    ("NTasks", "num_tasks"),
    ("Elapsed", "time_used"),
    ("Timelimit", "time_limit"),
    ("ExitCode", "exit_code"),
    ("Submit", "submit_time"),
    ("Start", "start_time"),
    ("End", "end_time"),
    ("WorkDir", "work_dir"),
    ("JobName", "name"),
)

#: sinfo --format codes for the per-node text listing, and what each gives.
SINFO_NODE_FIELDS: Tuple[Tuple[str, str], ...] = (
    ("%N", "name"),
    ("%T", "state"),
    ("%c", "cpus"),
    ("%m", "memory_mb"),
    ("%P", "partition"),
    ("%C", "cpus_alloc_idle_other_total"),
    ("%E", "reason"),  # last: free text
)

_SQUEUE_FORMAT = ",".join(
    name + ":0" + (RECORD_SEP if i == len(SQUEUE_FIELDS) - 1 else FIELD_SEP)
    for i, (name, _attr) in enumerate(SQUEUE_FIELDS)
)
_SACCT_FORMAT = ",".join(name for name, _attr in SACCT_FIELDS)
_SINFO_FORMAT = FIELD_SEP.join(code for code, _what in SINFO_NODE_FIELDS)

Version = Tuple[int, int, int]


def squeue_argv(user: Optional[str] = None, json: bool = False) -> List[str]:
    """argv listing all jobs the controller still knows, finished ones included.

    Text: ``--states=all`` keeps jobs that ended less than MinJobAge ago, so a poll sees
    completions. JSON: squeue ignores filters with ``--json`` (verified on 22.05: ``--user``
    has no effect), so ``parse_squeue_json`` takes the user filter instead and the argv is
    the same whatever ``user`` is.
    """
    if json:
        return ["squeue", "--json"]
    argv = ["squeue", "--noheader", "--states=all", "--Format=" + _SQUEUE_FORMAT]
    if user:
        argv.append("--user=" + user)
    return argv


def nodes_argv(json: bool = False, version: Optional[Version] = None) -> List[str]:
    """argv listing the nodes: ``sinfo --Node`` text (one line per node and partition), or
    ``scontrol show nodes --json`` from 23.02 and ``sinfo --json`` before."""
    if json:
        if version is not None and version >= (23, 2, 0):
            return ["scontrol", "show", "nodes", "--json"]
        return ["sinfo", "--json"]
    return ["sinfo", "--Node", "--noheader", "--format=" + _SINFO_FORMAT]


def partitions_argv(json: bool = False) -> List[str]:
    """argv listing the partitions (``--json`` needs 23.02 or later)."""
    if json:
        return ["scontrol", "show", "partition", "--json"]
    return ["scontrol", "--oneliner", "show", "partition"]


def scontrol_job_argv(job_id: Optional[str] = None, json: bool = False) -> List[str]:
    """argv showing one job (or all jobs): ``scontrol -o show job [id]`` (``--json`` 23.02+).

    Unlike squeue it reports ExitCode, StdOut/StdErr with patterns expanded, and it is the
    fallback for the state of a finished job while no accounting database is available.
    """
    argv = ["scontrol", "show", "job"] if json else ["scontrol", "--oneliner", "show", "job"]
    if job_id:
        argv.append(_checked_job_id(job_id))
    if json:
        argv.append("--json")
    return argv


def sacct_argv(
    job_ids: Sequence[str] = (),
    json: bool = False,
    completion: bool = False,
    user: Optional[str] = None,
    start_time: Optional[str] = None,
) -> List[str]:
    """argv for finished-job records.

    ``completion=True`` adds ``--completion``: read the JobCompType log instead of the
    accounting database. That is what works on a cluster without slurmdbd that has
    ``JobCompType=jobcomp/filetxt`` (as ``scripts/slurm-up`` configures; verified on 22.05;
    newer SLURM releases may have dropped the option). ``--json`` needs slurmdbd.
    ``start_time`` is any time sacct accepts (``2024-01-31T10:00``, ``now-1hour``); without
    job ids sacct otherwise starts at midnight.
    """
    argv = ["sacct", "--allocations"]
    if completion:
        argv.append("--completion")
    if json:
        argv.append("--json")
    else:
        argv += ["--parsable2", "--noheader", "--delimiter=" + FIELD_SEP, "--format=" + _SACCT_FORMAT]
    if job_ids:
        argv.append("--jobs=" + ",".join(_checked_job_id(j) for j in job_ids))
    if user:
        argv.append("--user=" + user)
    elif not job_ids:
        argv.append("--allusers")
    if start_time:
        argv.append("--starttime=" + start_time)
    return argv


def config_argv() -> List[str]:
    """argv printing the controller's configuration (``parse_scontrol_config`` reads it):
    tells the scheduler whether accounting (slurmdbd) or a job-completion log exists and
    how long finished jobs stay listed (MinJobAge)."""
    return ["scontrol", "show", "config"]


def version_argv() -> List[str]:
    """argv printing the SLURM version (``parse_version`` reads it)."""
    return ["sinfo", "--version"]


def scancel_argv(job_id: str) -> List[str]:
    return ["scancel", _checked_job_id(job_id)]


def move_job_argv(job_id: str, partition: str) -> List[str]:
    """argv moving a pending job to another partition."""
    if not partition or any(c in partition for c in " \t\n=,"):
        raise ValueError(f"invalid partition name {partition!r}")
    return ["scontrol", "update", "JobId=" + _checked_job_id(job_id), "Partition=" + partition]


def hold_job_argv(job_id: str) -> List[str]:
    return ["scontrol", "hold", _checked_job_id(job_id)]


def release_job_argv(job_id: str) -> List[str]:
    return ["scontrol", "release", _checked_job_id(job_id)]


def suspend_job_argv(job_id: str) -> List[str]:
    """Suspending needs operator rights in SLURM; users get an error they can show."""
    return ["scontrol", "suspend", _checked_job_id(job_id)]


def resume_job_argv(job_id: str) -> List[str]:
    return ["scontrol", "resume", _checked_job_id(job_id)]


def _checked_job_id(job_id: str) -> str:
    # "123", "123_4", "123_[1-3]", "123+1": digits first, never an option or a second word.
    s = str(job_id)
    if not s or not s[0].isdigit() or any(c in s for c in " \t\n,=;"):
        raise ValueError(f"invalid SLURM job id {job_id!r}")
    return s


def json_support(version: Optional[Version]) -> Dict[str, bool]:
    """Which queries have ``--json`` on this SLURM version (None: unknown, assume none).

    ``sacct`` is listed as available from 21.08 but additionally needs slurmdbd at run time.
    """
    if version is None:
        return {"squeue": False, "nodes": False, "partitions": False, "job": False, "sacct": False}
    return {
        "squeue": version >= (21, 8, 0),
        "nodes": version >= (21, 8, 0),
        "partitions": version >= (23, 2, 0),
        "job": version >= (23, 2, 0),
        "sacct": version >= (21, 8, 0),
    }


def parse_version(text: str) -> Version:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 23.11.4"`` / ``"slurm 24.05.0-0rc1"`` -> (22, 5, 8)."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            micro = ""
            if len(parts) > 2:
                for ch in parts[2]:
                    if not ch.isdigit():
                        break
                    micro += ch
            return (int(parts[0]), int(parts[1]), int(micro or 0))
    raise SlurmError(f"no SLURM version in {text!r}")


def json_version(doc: Union[str, bytes, dict]) -> Optional[Version]:
    """The SLURM version recorded in a ``--json`` document's ``meta`` (None if absent)."""
    if not isinstance(doc, dict):
        doc = _load_json(doc)
    meta = doc.get("meta") or {}
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    v = slurm.get("version") or {}
    try:
        return (int(v["major"]), int(v["minor"]), int(v["micro"]))
    except (KeyError, TypeError, ValueError):
        release = slurm.get("release")
        return parse_version(release) if isinstance(release, str) else None


# --------------------------------------------------------------------------------------------
# Small conversions
# --------------------------------------------------------------------------------------------

#: Texts SLURM prints for "no value".
_NULLS = frozenset(("", "(null)", "N/A", "n/a", "None", "none", "Unknown", "(None)"))

# SLURM's "no value" and "infinite" sentinels for 32-bit fields in old JSON layouts.
_NO_VAL = 0xFFFFFFFE
_INFINITE = 0xFFFFFFFF
_NO_VALS = frozenset((_NO_VAL, 0xFFFFFFFFFFFFFFFE))
_INFINITES = frozenset((_INFINITE, 0xFFFFFFFFFFFFFFFF))


def _s(value: str) -> str:
    return "" if value in _NULLS else value


def _int(value: str) -> Optional[int]:
    return int(value) if value.isdigit() else None


def _user(value: str) -> str:
    # scontrol and sacct --completion print "name(uid)".
    cut = value.find("(")
    return _s(value[:cut] if cut > 0 else value)


def exit_code_from_status(status: int) -> str:
    """A wait(2) status as SLURM stores it (768) -> ``"exit:signal"`` (``"3:0"``)."""
    if status < 0:
        return ""
    if status & 0x7F:
        return f"0:{status & 0x7F}"
    return f"{(status >> 8) & 0xFF}:0"


@lru_cache(maxsize=1024)
def _exit_code_text(raw: str) -> str:
    # squeue --Format exit_code prints the raw wait status; scontrol/sacct print "3:0".
    if ":" in raw:
        return raw
    if raw.isdigit():
        return exit_code_from_status(int(raw))
    return _s(raw)


def format_duration(seconds: Optional[int]) -> str:
    """Seconds -> SLURM's squeue style: ``5:07``, ``1:00:00``, ``2-03:04:05``."""
    if seconds is None or seconds < 0:
        return ""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def duration_seconds(text: str) -> Optional[int]:
    """Any SLURM duration text -> seconds; None for unset/unlimited/invalid.

    SLURM's grammar: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` (so a bare
    ``10``, as ``sacct --completion`` prints limits, is ten minutes).
    """
    text = text.strip()
    if not text or not (text[0].isdigit()):
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
        parts = text.split(":")
        if not all(p.isdigit() for p in parts) or len(parts) > 3:
            return None
        nums = [int(p) for p in parts] + [0] * (3 - len(parts))
        h, m, s = nums
    else:
        parts = text.split(":")
        if not all(p.isdigit() for p in parts) or len(parts) > 3:
            return None
        nums = [int(p) for p in parts]
        if len(nums) == 1:
            h, m, s = 0, nums[0], 0
        elif len(nums) == 2:
            h, m, s = 0, nums[0], nums[1]
        else:
            h, m, s = nums
    return ((days * 24 + h) * 60 + m) * 60 + s


def format_epoch(seconds: Optional[int]) -> str:
    """Epoch seconds -> SLURM's local-time text; ``""`` for 0/None (SLURM's "unset")."""
    if not seconds or seconds < 0 or seconds >= _NO_VAL:
        return ""
    t = _time.localtime(seconds)
    return "%04d-%02d-%02dT%02d:%02d:%02d" % (t[0], t[1], t[2], t[3], t[4], t[5])


# --------------------------------------------------------------------------------------------
# States: SLURM's job state codes; node and partition states
# --------------------------------------------------------------------------------------------

#: squeue's compact codes (%t, StateCompact) -> long names.
JOB_STATE_CODES: Dict[str, str] = {
    "PD": "PENDING", "CF": "CONFIGURING", "RQ": "REQUEUED", "RH": "REQUEUE_HOLD",
    "RF": "REQUEUE_FED", "RD": "RESV_DEL_HOLD", "SE": "SPECIAL_EXIT", "R": "RUNNING",
    "CG": "COMPLETING", "RS": "RESIZING", "SI": "SIGNALING", "SO": "STAGE_OUT",
    "S": "SUSPENDED", "ST": "STOPPED", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
    "TO": "TIMEOUT", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY", "PR": "PREEMPTED",
    "BF": "BOOT_FAIL", "DL": "DEADLINE", "RV": "REVOKED",
}

NODE_UP, NODE_DOWN, NODE_ERROR, NODE_UNKNOWN = "UP", "DOWN", "ERROR", "UNKNOWN"

# sinfo's short and lower-case spellings -> scontrol's names.
_NODE_WORDS: Dict[str, str] = {
    "ALLOC": "ALLOCATED", "ALLOCATED": "ALLOCATED", "MIX": "MIXED", "MIXED": "MIXED",
    "IDLE": "IDLE", "COMP": "COMPLETING", "COMPLETING": "COMPLETING", "DOWN": "DOWN",
    "DRAIN": "DRAIN", "DRAINED": "DRAIN", "DRNG": "DRAINING", "DRAINING": "DRAINING",
    "FAIL": "FAIL", "FAILG": "FAILING", "FAILING": "FAILING", "UNK": "UNKNOWN",
    "UNKNOWN": "UNKNOWN", "INVAL": "INVALID", "INVALID": "INVALID", "INVALID_REG": "INVALID",
    "FUTR": "FUTURE", "FUTURE": "FUTURE", "RESV": "RESERVED", "RESERVED": "RESERVED",
    "MAINT": "MAINT", "PLND": "PLANNED", "PLANNED": "PLANNED", "NPC": "PERFCTRS",
    "PERFCTRS": "PERFCTRS", "BOOT": "REBOOT", "BLOCKED": "BLOCKED", "NOT_RESPONDING": "NO_RESPOND",
    "NO_RESPOND": "NO_RESPOND", "POW_DN": "POWERED_DOWN", "POW_UP": "POWERING_UP",
    "POWERED_DOWN": "POWERED_DOWN", "POWERING_DOWN": "POWERING_DOWN", "POWER_DOWN": "POWER_DOWN",
    "POWERING_UP": "POWERING_UP", "POWER_UP": "POWER_UP", "CLOUD": "CLOUD",
}
# sinfo state suffixes: '*' not responding, '~' powered off (power saving), '#' powering up,
# '%' powering down, '!' pending power down, '$' maintenance reservation, '@' reboot pending,
# '^' reboot issued, '-' planned for a pending job.
_NODE_SUFFIXES = "*~#%!$@^-"

_NODE_ERROR_WORDS = frozenset(("FAIL", "FAILING", "INVALID"))
_NODE_DOWN_WORDS = frozenset(("DOWN", "DRAIN", "DRAINING", "FUTURE"))


@lru_cache(maxsize=256)
def map_node_state(raw: str) -> Tuple[str, str]:
    """SLURM node state -> (PTP nodeState, raw state).

    * ERROR: SLURM considers the node faulty: ``FAIL``, ``FAILING``, ``INVALID`` (registered
      with a configuration that does not match), or not responding (``*`` suffix,
      ``NOT_RESPONDING`` flag) while not already marked down or drained.
    * DOWN: not available for new work by decision: ``DOWN``, any ``DRAIN`` (``drained``,
      ``draining``, ``IDLE+DRAIN``, ``MIXED+DRAIN``), ``FUTURE``; a down node that also does
      not respond (``down*``) stays DOWN.
    * UNKNOWN: ``UNKNOWN`` or empty/unrecognised.
    * UP: everything else (``IDLE``, ``MIXED``, ``ALLOCATED``, ``COMPLETING``, ``PLANNED``,
      ``RESERVED``, ``MAINT``, power-saving states, ``CLOUD``).
    """
    text = raw.strip()
    if not text:
        return (NODE_UNKNOWN, raw)
    not_responding = False
    words = set()
    for token in text.upper().split("+"):
        while token and token[-1] in _NODE_SUFFIXES:
            if token[-1] == "*":
                not_responding = True
            token = token[:-1]
        word = _NODE_WORDS.get(token)
        if word is None:
            word = "?" + token
        elif word == "NO_RESPOND":
            not_responding = True
        words.add(word)
    if words & _NODE_ERROR_WORDS:
        return (NODE_ERROR, raw)
    if words & _NODE_DOWN_WORDS:
        return (NODE_DOWN, raw)
    if not_responding:
        return (NODE_ERROR, raw)
    if "UNKNOWN" in words or any(w.startswith("?") for w in words):
        return (NODE_UNKNOWN, raw)
    return (NODE_UP, raw)


QUEUE_NORMAL, QUEUE_STOPPED = "NORMAL", "STOPPED"


def map_partition_state(raw: str) -> Tuple[str, str]:
    """SLURM partition state -> (PTP queueState, raw): UP is NORMAL; DOWN (no new jobs
    start), DRAIN (no new submissions) and INACTIVE are STOPPED."""
    return (QUEUE_NORMAL if raw.strip().upper() == "UP" else QUEUE_STOPPED, raw)


# --------------------------------------------------------------------------------------------
# squeue
# --------------------------------------------------------------------------------------------

_SQUEUE_NFIELDS = len(SQUEUE_FIELDS)
_SQUEUE_TERMINATOR = RECORD_SEP + "\n"


@_bulk
def parse_squeue_text(text: str) -> List[SlurmJob]:
    """Parse the output of ``squeue_argv(json=False)`` into jobs, in squeue's order.

    A record with too few fields (output cut short) is skipped rather than guessed at.
    """
    jobs: List[SlurmJob] = []
    append = jobs.append
    nulls = _NULLS
    exit_text = _exit_code_text
    n = _SQUEUE_NFIELDS
    records = text.split(_SQUEUE_TERMINATOR)
    # The piece after the last terminator is "" (or a truncated record): never a job.
    records.pop()
    # Only the fields where squeue prints placeholders are checked against _NULLS: this loop
    # is the hot path of every poll on a large cluster.
    for rec in records:
        f = rec.split(FIELD_SEP, n - 1)
        if len(f) != n:
            continue
        (job_id, array_job_id, array_task_id, user, account, partition, state, reason, nodes,
         num_nodes, num_cpus, num_tasks, time_used, time_limit, exit_code, submit_time,
         start_time, end_time, work_dir, stdout_path, stderr_path, name) = f
        if array_task_id in nulls:
            array_job_id = array_task_id = ""
        append(SlurmJob(
            job_id.strip(),
            name,
            user,
            "" if account in nulls else account,
            partition,
            state,
            "" if reason in nulls else reason,
            nodes,
            int(num_nodes) if num_nodes.isdigit() else None,
            int(num_cpus) if num_cpus.isdigit() else None,
            int(num_tasks) if num_tasks.isdigit() else None,
            time_used,
            "" if time_limit in nulls else time_limit,
            exit_text(exit_code),
            "" if submit_time in nulls else submit_time,
            "" if start_time in nulls else start_time,
            "" if end_time in nulls else end_time,
            "" if work_dir in nulls else work_dir,
            "" if stdout_path in nulls else stdout_path,
            "" if stderr_path in nulls else stderr_path,
            array_job_id,
            array_task_id,
        ))
    return jobs


def _load_json(text: Union[str, bytes]) -> dict:
    try:
        doc = _json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmError("JSON output is not an object")
    return doc


def _json_list(doc: dict, key: str) -> list:
    items = doc.get(key)
    if isinstance(items, list):
        return items
    errors = doc.get("errors") or []
    if errors:
        msgs = []
        for e in errors:
            if isinstance(e, dict):
                msgs.append(str(e.get("description") or e.get("error") or e))
            else:
                msgs.append(str(e))
        raise SlurmError("; ".join(msgs))
    raise SlurmError(f"JSON output has no {key!r} list")


def _num(v: Any) -> Optional[int]:
    """A JSON number in any layout -> int; None when unset; -1 when infinite."""
    t = type(v)
    if t is int:
        if v < _NO_VAL:
            return v
        if v in _NO_VALS:
            return None
        return -1 if v in _INFINITES else v
    if t is dict:
        if v.get("infinite"):
            return -1
        if not v.get("set", True):
            return None
        n = v.get("number")
        return int(n) if type(n) in (int, float) else None
    if v is None or t is bool:
        return None
    if t is float:
        return int(v)
    if t is str and v.isdigit():
        return int(v)
    return None


def _count(v: Any) -> Optional[int]:
    n = _num(v)
    return None if n is None or n < 0 else n


def _epoch_text(v: Any) -> str:
    n = _num(v)
    return format_epoch(n) if n is not None and n > 0 else ""


def _minutes_text(v: Any) -> str:
    n = _num(v)
    if n is None:
        return ""
    if n < 0:
        return "UNLIMITED"
    return format_duration(n * 60)


def _state_text(v: Any) -> str:
    if type(v) is list:
        return v[0] if len(v) == 1 and type(v[0]) is str else "+".join(map(str, v))
    return "" if v is None else str(v)


def _json_exit_code(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, dict):
        rc = _num(v.get("return_code"))
        sig = v.get("signal")
        sig_n = _num(sig.get("id")) if isinstance(sig, dict) else _num(sig)
        return f"{rc if rc is not None and rc >= 0 else 0}:{sig_n if sig_n and sig_n > 0 else 0}"
    n = _num(v)
    return exit_code_from_status(n) if n is not None else ""


def _json_str(v: Any) -> str:
    if type(v) is str:
        return "" if v in _NULLS else v
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(map(str, v))
    return _s(str(v))


def _job_from_json(j: dict, now: Optional[int]) -> SlurmJob:
    g = j.get
    num = _num
    job_id = num(g("job_id"))
    array_job = num(g("array_job_id"))
    array_job_id = array_task_id = ""
    if array_job:
        array_task = num(g("array_task_id"))
        if array_task is not None and array_task >= 0:
            array_job_id, array_task_id = str(array_job), str(array_task)
        else:
            task_string = g("array_task_string")
            if task_string:
                array_job_id, array_task_id = str(array_job), str(task_string)
    state = _state_text(g("job_state"))
    start = num(g("start_time")) or 0
    end = num(g("end_time")) or 0
    base = state.split("+", 1)[0]
    if base == "PENDING":
        used = "0:00"
    elif start <= 0:
        used = ""
    elif base in _RUNNING_LIKE:
        used = format_duration(max(0, now - start)) if now is not None else ""
    elif end >= start and base in _ENDED:
        used = format_duration(end - start)
    else:
        used = ""
    text = _json_str
    return SlurmJob(
        str(job_id) if job_id is not None else "",
        str(g("name") or ""),
        text(g("user_name")),
        text(g("account")),
        text(g("partition")),
        state,
        text(g("state_reason")),
        text(g("nodes")),
        _count(g("node_count")),
        _count(g("cpus")),
        _count(g("tasks")),
        used,
        _minutes_text(g("time_limit")),
        _json_exit_code(g("exit_code")),
        _epoch_text(g("submit_time")),
        format_epoch(start) if start > 0 else "",
        format_epoch(end) if end > 0 else "",
        text(g("current_working_directory")),
        text(g("standard_output")),
        text(g("standard_error")),
        array_job_id,
        array_task_id,
    )


_RUNNING_LIKE = frozenset(("RUNNING", "SUSPENDED", "COMPLETING", "STOPPED", "SIGNALING", "STAGE_OUT"))
#: The states of a job that has ended: its run time is end minus start.
_ENDED = frozenset(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                    "BOOT_FAIL", "DEADLINE", "REVOKED"))


@_bulk
def parse_squeue_json(
    text: Union[str, bytes], user: Optional[str] = None, now: Optional[int] = None
) -> List[SlurmJob]:
    """Parse ``squeue --json`` (any layout, 21.08+) into jobs.

    ``user`` filters here because squeue ignores filters with --json. JSON has no run time:
    pass ``now`` (epoch seconds) to get ``time_used`` for running jobs; finished jobs get
    end - start either way. In 22.05 an unset StdOut/StdErr is ``""`` in JSON where the text
    listing shows the default file name.
    """
    doc = _load_json(text)
    return [
        _job_from_json(j, now)
        for j in _json_list(doc, "jobs")
        if user is None or j.get("user_name") == user
    ]


def parse_scontrol_jobs_json(text: Union[str, bytes], now: Optional[int] = None) -> List[SlurmJob]:
    """Parse ``scontrol show job --json`` (23.02+); same layout as ``squeue --json``."""
    return parse_squeue_json(text, None, now)


# --------------------------------------------------------------------------------------------
# Nodes and partitions
# --------------------------------------------------------------------------------------------


@_bulk
def parse_sinfo_nodes_text(text: str) -> List[SlurmNode]:
    """Parse ``nodes_argv(json=False)``: sinfo prints a node once per partition; the lines
    are merged, keeping the node's first appearance order."""
    by_name: Dict[str, list] = {}
    for line in text.split("\n"):
        if not line:
            continue
        f = line.split(FIELD_SEP, len(SINFO_NODE_FIELDS) - 1)
        if len(f) != len(SINFO_NODE_FIELDS):
            continue
        name, state, cpus, memory, partition, cpu_counts, reason = f
        partition = partition.rstrip("*")
        entry = by_name.get(name)
        if entry is None:
            alloc = cpu_counts.split("/", 1)[0]
            by_name[name] = [state, _int(cpus), _int(memory), [partition] if partition else [],
                             _s(reason), _int(alloc)]
        elif partition and partition not in entry[3]:
            entry[3].append(partition)
    return [SlurmNode(name, e[0], e[1], e[2], tuple(e[3]), e[4], e[5]) for name, e in by_name.items()]


def _node_state_json(n: dict) -> str:
    state = n.get("state")
    if isinstance(state, list):
        return "+".join(str(s).upper() for s in state)
    words = [str(state or "").upper()]
    words += [str(f).upper() for f in n.get("state_flags") or []]
    return "+".join(w for w in words if w)


@_bulk
def parse_nodes_json(text: Union[str, bytes]) -> List[SlurmNode]:
    """Parse ``sinfo --json`` (21.08/22.05: a ``nodes`` list) or ``scontrol show nodes
    --json`` (23.02+). A 23.02+ ``sinfo --json`` (an aggregated ``sinfo`` list) is accepted
    too, though it carries less per node. States come out as ``IDLE+DRAIN``."""
    doc = _load_json(text)
    if "nodes" not in doc and isinstance(doc.get("sinfo"), list):
        return _nodes_from_sinfo_json(doc["sinfo"])
    nodes = []
    for n in _json_list(doc, "nodes"):
        parts = n.get("partitions") or []
        nodes.append(SlurmNode(
            name=str(n.get("name") or ""),
            state=_node_state_json(n),
            cpus=_count(n.get("cpus")),
            memory_mb=_count(n.get("real_memory")),
            partitions=tuple(str(p) for p in parts),
            reason=_json_str(n.get("reason")),
            alloc_cpus=_count(n.get("alloc_cpus")),
        ))
    return nodes


def _nodes_from_sinfo_json(entries: list) -> List[SlurmNode]:
    by_name: Dict[str, list] = {}
    for e in entries:
        node = e.get("node") or {}
        state = _state_text(node.get("state"))
        cpus = _count((e.get("cpus") or {}).get("maximum"))
        mem = _count(((e.get("memory") or {}).get("maximum")))
        part = str((e.get("partition") or {}).get("name") or "")
        reason = (e.get("reason") or {}).get("description") if isinstance(e.get("reason"), dict) else e.get("reason")
        names = (e.get("nodes") or {}).get("nodes") or []
        for name in names:
            entry = by_name.get(name)
            if entry is None:
                by_name[name] = [state, cpus, mem, [part] if part else [], _json_str(reason)]
            elif part and part not in entry[3]:
                entry[3].append(part)
    return [SlurmNode(name, e[0], e[1], e[2], tuple(e[3]), e[4]) for name, e in by_name.items()]


@_bulk
def parse_partitions_json(text: Union[str, bytes]) -> List[SlurmPartition]:
    """Parse ``scontrol show partition --json`` (23.02+, nested layout) or the flat layout
    of the 0.0.37/0.0.38 REST API (``state``, ``flags``, ``max_time_limit``...)."""
    doc = _load_json(text)
    out = []
    for p in _json_list(doc, "partitions"):
        if isinstance(p.get("partition"), dict) or isinstance(p.get("maximums"), dict):
            inner = p.get("partition") or {}
            state = _state_text(inner.get("state"))
            flags = [str(f).upper() for f in (p.get("flags") or inner.get("flags") or [])]
            nodes = p.get("nodes") or {}
            maxs = p.get("maximums") or {}
            defs = p.get("defaults") or {}
            cpus = p.get("cpus") or {}
            max_nodes = _num(maxs.get("nodes"))
            out.append(SlurmPartition(
                name=str(p.get("name") or ""),
                state=state,
                is_default="DEFAULT" in flags,
                max_time=_minutes_text(maxs.get("time")),
                default_time=_minutes_text(defs.get("time")),
                max_nodes=None if max_nodes is None or max_nodes < 0 else max_nodes,
                total_nodes=_count(nodes.get("total")),
                total_cpus=_count(cpus.get("total")),
                nodes=_json_str(nodes.get("configured")),
            ))
        else:
            flags = [str(f).upper() for f in p.get("flags") or []]
            max_nodes = _num(p.get("maximum_nodes_per_job"))
            out.append(SlurmPartition(
                name=str(p.get("name") or ""),
                state=_state_text(p.get("state")).upper(),
                is_default="DEFAULT" in flags,
                max_time=_minutes_text(p.get("max_time_limit")),
                default_time=_minutes_text(p.get("default_time_limit")),
                max_nodes=None if max_nodes is None or max_nodes < 0 else max_nodes,
                total_nodes=_count(p.get("nodes_online") if "total_nodes" not in p else p.get("total_nodes")),
                total_cpus=_count(p.get("total_cpus")),
                nodes=_json_str(p.get("nodes")),
            ))
    return out


# --------------------------------------------------------------------------------------------
# scontrol key=value records
# --------------------------------------------------------------------------------------------

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_:/")
_RECORD_KEYS = ("JobId=", "NodeName=", "PartitionName=", "ReservationName=", "StepId=")


def _is_key(word: str) -> bool:
    return bool(word) and "A" <= word[0] <= "Z" and all(c in _KEY_CHARS for c in word)


def _parse_record(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    key = None
    for piece in text.split(" "):
        eq = piece.find("=")
        if eq > 0 and _is_key(piece[:eq]):
            key = piece[:eq]
            out[key] = piece[eq + 1:]
        elif key is not None:
            out[key] += " " + piece
    for k, v in out.items():
        out[k] = v.strip(" ")
    return out


@_bulk
def parse_scontrol_records(text: str) -> List[Dict[str, str]]:
    """``scontrol show ...`` output -> one ``{Key: Value}`` dict per record.

    Reads the one-line form (``-o``) and also the default multi-line form (a record starts
    at a line beginning with ``JobId=``, ``NodeName=``, ``PartitionName=``...). Values are
    raw text (``(null)`` included).
    """
    records: List[str] = []
    for line in text.split("\n"):
        stripped = line.strip(" \t\r")
        if not stripped:
            continue
        if stripped.startswith("No ") and stripped.endswith(" in the system"):
            continue  # "No jobs in the system", printed instead of an empty listing
        if stripped.startswith(_RECORD_KEYS) or not records:
            records.append(stripped)
        else:
            records[-1] += " " + stripped
    return [_parse_record(r) for r in records]


def parse_scontrol_config(text: str) -> Dict[str, str]:
    """``scontrol show config`` -> ``{"ClusterName": "proxyagent", "MinJobAge": "300 sec", ...}``.

    Values are raw text. Lines without ``" = "`` (the header, section titles, the
    "Slurmctld(primary) at ... is UP" footer) are ignored; within sections a key seen twice
    keeps its first value, which is the main configuration's.
    """
    config: Dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(" = ")
        key = key.strip()
        if sep and key and " " not in key:
            config.setdefault(key, value.strip())
    return config


def parse_scontrol_jobs(text: str) -> List[SlurmJob]:
    """Parse ``scontrol -o show job [id]``."""
    jobs = []
    for r in parse_scontrol_records(text):
        if "JobId" not in r:
            continue
        g = r.get
        task = _s(g("ArrayTaskId", ""))
        jobs.append(SlurmJob(
            job_id=r["JobId"],
            name=g("JobName", ""),
            user=_user(g("UserId", "")),
            account=_s(g("Account", "")),
            partition=_s(g("Partition", "")),
            state=g("JobState", ""),
            reason=_s(g("Reason", "")),
            nodes=_s(g("NodeList", "")),
            num_nodes=_int(g("NumNodes", "")),
            num_cpus=_int(g("NumCPUs", "")),
            num_tasks=_int(g("NumTasks", "")),
            time_used=_s(g("RunTime", "")),
            time_limit=_s(g("TimeLimit", "")),
            exit_code=_exit_code_text(g("ExitCode", "")),
            submit_time=_s(g("SubmitTime", "")),
            start_time=_s(g("StartTime", "")),
            end_time=_s(g("EndTime", "")),
            work_dir=_s(g("WorkDir", "")),
            stdout_path=_s(g("StdOut", "")),
            stderr_path=_s(g("StdErr", "")),
            array_job_id=_s(g("ArrayJobId", "")) if task else "",
            array_task_id=task,
        ))
    return jobs


def parse_scontrol_nodes(text: str) -> List[SlurmNode]:
    """Parse ``scontrol -o show node``; states look like ``IDLE``, ``MIXED+DRAIN``, ``DOWN*``."""
    nodes = []
    for r in parse_scontrol_records(text):
        if "NodeName" not in r:
            continue
        parts = _s(r.get("Partitions", ""))
        nodes.append(SlurmNode(
            name=r["NodeName"],
            state=r.get("State", ""),
            cpus=_int(r.get("CPUTot", "")),
            memory_mb=_int(r.get("RealMemory", "")),
            partitions=tuple(p for p in parts.split(",") if p),
            reason=_s(r.get("Reason", "")),
            alloc_cpus=_int(r.get("CPUAlloc", "")),
        ))
    return nodes


def parse_scontrol_partitions(text: str) -> List[SlurmPartition]:
    """Parse ``scontrol -o show partition``."""
    parts = []
    for r in parse_scontrol_records(text):
        if "PartitionName" not in r:
            continue
        max_nodes = r.get("MaxNodes", "")
        parts.append(SlurmPartition(
            name=r["PartitionName"],
            state=r.get("State", ""),
            is_default=r.get("Default", "NO").upper() == "YES",
            max_time=_s(r.get("MaxTime", "")),
            default_time=_s(r.get("DefaultTime", "")),
            max_nodes=_int(max_nodes),
            total_nodes=_int(r.get("TotalNodes", "")),
            total_cpus=_int(r.get("TotalCPUs", "")),
            nodes=_s(r.get("Nodes", "")),
        ))
    return parts


# --------------------------------------------------------------------------------------------
# sacct and sbatch
# --------------------------------------------------------------------------------------------

_SACCT_NFIELDS = len(SACCT_FIELDS)


@_bulk
def parse_sacct_text(text: str) -> List[SlurmJob]:
    """Parse ``sacct_argv(json=False)`` (with or without ``--completion``).

    Job steps (``123.batch``, ``123.0``) are skipped: the listing asks for allocations only,
    and the check keeps a listing made without ``--allocations`` from doubling jobs.
    """
    jobs = []
    n = _SACCT_NFIELDS
    for line in text.split("\n"):
        if not line:
            continue
        f = line.split(FIELD_SEP, n - 1)
        if len(f) != n:
            continue
        (job_id, shown_id, user, account, partition, state, reason, nodes, num_nodes, num_cpus,
         num_tasks, elapsed, limit, exit_code, submit, start, end, work_dir, name) = f
        if "." in job_id:
            continue
        array_job_id = array_task_id = ""
        if "_" in shown_id:
            array_job_id, _, array_task_id = shown_id.partition("_")
            array_task_id = array_task_id.strip("[]")
        jobs.append(SlurmJob(
            job_id, name, _user(user), _s(account), _s(partition), state, _s(reason),
            _s(nodes) if nodes != "None assigned" else "", _int(num_nodes), _int(num_cpus),
            _int(num_tasks), _s(elapsed), _s(limit), _exit_code_text(exit_code), _s(submit),
            _s(start), _s(end), _s(work_dir), "", "", array_job_id, array_task_id,
        ))
    return jobs


@_bulk
def parse_sacct_json(text: Union[str, bytes]) -> List[SlurmJob]:
    """Parse ``sacct --json`` (needs slurmdbd; 21.08+ layouts)."""
    doc = _load_json(text)
    jobs = []
    for j in _json_list(doc, "jobs"):
        state = j.get("state") or {}
        current = state.get("current") if isinstance(state, dict) else state
        times = j.get("time") or {}
        array = j.get("array") or {}
        array_job = _count(array.get("job_id"))
        array_task = _num(array.get("task_id"))
        required = j.get("required") or {}
        limit = times.get("limit")
        tres_nodes = j.get("allocation_nodes")
        jobs.append(SlurmJob(
            job_id=str(_num(j.get("job_id")) or ""),
            name=str(j.get("name") or ""),
            user=_json_str(j.get("user")),
            account=_json_str(j.get("account")),
            partition=_json_str(j.get("partition")),
            state=_state_text(current),
            reason=_json_str((state.get("reason") if isinstance(state, dict) else None)),
            nodes=_json_str(j.get("nodes")).replace("None assigned", ""),
            num_nodes=_count(tres_nodes),
            num_cpus=_count(required.get("CPUs")),
            num_tasks=None,
            time_used=format_duration(_count(times.get("elapsed"))),
            time_limit=_minutes_text(limit),
            exit_code=_json_exit_code(j.get("exit_code")),
            submit_time=_epoch_text(times.get("submission")),
            start_time=_epoch_text(times.get("start")),
            end_time=_epoch_text(times.get("end")),
            work_dir=_json_str(j.get("working_directory")),
            stdout_path=_json_str(j.get("stdout")),
            stderr_path=_json_str(j.get("stderr")),
            array_job_id=str(array_job) if array_job and array_task is not None and array_task >= 0 else "",
            array_task_id=str(array_task) if array_job and array_task is not None and array_task >= 0 else "",
        ))
    return jobs


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` output (``"123"`` or ``"123;cluster"``) -> ``"123"``.

    sbatch may print warnings before the id; the id is the last non-empty line.
    """
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise SlurmError("sbatch printed no job id")
    job_id = lines[-1].split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {lines[-1]!r}")
    return job_id


# --------------------------------------------------------------------------- pending reasons

#: Reasons SLURM gives for a pending job that it will not start as submitted (squeue(1), "JOB
#: REASON CODES"): the request exceeds what its partition, association or QOS allows, or
#: names something it may not use.  Without EnforcePartLimits, sbatch accepts such jobs and
#: they wait for ever.
NEVER_STARTS_REASONS: Dict[str, str] = {
    "PartitionConfig": "it asks for more than its partition allows (nodes, CPUs, memory, GPUs or time)",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows (or the nodes it needs are down)",
    "PartitionTimeLimit": "its time limit is longer than its partition allows",
    "BadConstraints": "its constraints (features, node list, counts) cannot be met",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "AccountNotAllowed": "its account may not use this partition",
    "QOSNotAllowed": "its QOS may not be used in this partition",
    "DependencyNeverSatisfied": "a job it depends on ended in a way that can never satisfy the dependency",
    "AssocMaxCpuPerJobLimit": "it asks for more CPUs than its association allows per job",
    "AssocMaxNodePerJobLimit": "it asks for more nodes than its association allows per job",
    "AssocMaxWallDurationPerJobLimit": "its time limit is longer than its association allows",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than its QOS allows per job",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than its QOS allows per job",
    "QOSMaxWallDurationPerJobLimit": "its time limit is longer than its QOS allows",
    "QOSMinCpuNotSatisfied": "it asks for fewer CPUs than its QOS requires",
}


def job_message(reason: str, pending: bool) -> str:
    """A job's message: SLURM's reason, explained when it means a pending job will never start."""
    why = NEVER_STARTS_REASONS.get(reason)
    if why is None or not pending:
        return reason
    return f"{NEVER_STARTS}SLURM keeps it pending because {why} (reason {reason}); cancel it and submit it with less"
