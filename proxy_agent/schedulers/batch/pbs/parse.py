"""PBS command output -> neutral batch records: pure functions, no I/O, no trio.

Two families share the name PBS and little else in their output:

* **OpenPBS / PBS Professional** (``FAMILY_OPENPBS``): ``qstat -f -F json``,
  ``pbsnodes -a -F json``, ``qstat -Q -f -F json``, ``qstat -B -f -F json``.
* **Torque** (``FAMILY_TORQUE``): ``qstat -f -x`` and ``pbsnodes -x`` print XML; queues and
  the server exist only as ``qstat -Q -f`` / ``qstat -B -f`` text (``Key = value`` lines).

Which family a machine runs is decided from the probe commands' output by
:func:`detect_family` (the argv are :data:`VERSION_PROBE_ARGV` and
:data:`SERVER_PROBE_ARGV`).

What the JSON of OpenPBS gets wrong, and how it is read anyway
---------------------------------------------------------------
Up to 23.06 OpenPBS writes its JSON by hand, one member per line, and prints any value
that ``strtod`` accepts without quotes: a job named ``1e5``, ``inf`` or ``nan`` becomes a
bare ``1e5``/``inf``/``nan``, an environment value ``.5``, ``5.`` or ``-00`` a token no JSON
reader accepts (OpenPBS issues 1255 and 2603). Releases of the 19.1 era also left PBS's own
``\\'`` and ``\\,`` escapes in strings (issue 2049), and a value containing a ``"`` could come
out unescaped. From late 2023 OpenPBS uses cJSON (tab-indented, always valid) but a
duplicated attribute still yields duplicate keys (issue 2677).

:func:`load_pbs_json` first reads the text as JSON with every number kept as its own text
(``parse_int=str``), which is both exact (a 64-bit job number or a job named ``007`` keeps
its digits) and fast. Only when that fails does it repair the text line by line (bare
tokens become strings, invalid escapes become literal backslashes, a quote that does not
end its value is escaped) and read it again; whatever still cannot be read raises
:class:`PbsParseError` naming the line.

Normalisation
-------------
Every record is a :class:`~proxy_agent.schedulers.batch.records.NativeJob`,
``NativeNode`` or ``NativeQueue``. Times become local time ``YYYY-MM-DDTHH:MM:SS``
(OpenPBS prints ``ctime(3)`` text, Torque's XML epoch seconds); durations seconds
(``120:00:00`` is 432000); sizes megabytes (PBS ``kb``/``mb``/``gb``/``tb``/``pb`` are
powers of 1024, ``w`` words of 8 bytes). An exit status above 256 means the job was ended
by signal ``status - 256`` (``exit_code`` None, ``signal`` the number); a negative one is
the batch system's own code, kept in ``exit_code`` with its meaning in ``reason``.
"""

from __future__ import annotations

import json
import re
import time as _time
import xml.etree.ElementTree as ET
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attrs

from ..records import NativeJob, NativeNode, NativeQueue

__all__ = [
    "FAMILY_OPENPBS",
    "FAMILY_TORQUE",
    "PbsParseError",
    "ProbeResult",
    "ServerInfo",
    "VERSION_PROBE_ARGV",
    "SERVER_PROBE_ARGV",
    "detect_family",
    "parse_version_text",
    "load_pbs_json",
    "parse_openpbs_jobs",
    "parse_openpbs_nodes",
    "parse_openpbs_queues",
    "parse_openpbs_server",
    "parse_torque_jobs",
    "parse_torque_nodes",
    "parse_full_text",
    "parse_torque_queues",
    "parse_torque_server",
    "parse_qsub_output",
    "parse_tracejob",
    "is_unknown_job_error",
    "decode_exit_status",
    "EXEC_CODES",
    "LIMIT_KILL_CODES",
    "array_parents",
    "duration_seconds",
    "size_megabytes",
    "parse_exec_host",
    "ctime_to_local",
    "epoch_to_local",
]

FAMILY_OPENPBS = "openpbs"
FAMILY_TORQUE = "torque"


class PbsParseError(ValueError):
    """Output that cannot be what the PBS command was asked for."""


# --------------------------------------------------------------------------------------------
# Small value parsers
# --------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A scalar from a JSON document as the text PBS meant: numbers were kept as their own
    text; cJSON turns a value that reads as ``true``/``false``/``null`` into a literal."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (dict, list)):
        return ""
    return str(value)


def _int(value: Any) -> Optional[int]:
    text = _text(value).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return None
        if number != number or number in (float("inf"), float("-inf")):
            return None
        return int(number)


def duration_seconds(text: Any) -> Optional[int]:
    """PBS duration text -> seconds: ``HH:MM:SS`` (any number of hours), ``MM:SS``,
    ``DD:HH:MM:SS`` or plain seconds (``3600``, ``3600.5``). None when unset or not a
    duration (a negative remaining time, ``UNLIMITED``)."""
    raw = _text(text).strip()
    if not raw:
        return None
    parts = raw.split(":")
    if len(parts) > 4 or not all(p.strip().isdigit() for p in parts[:-1]):
        return None
    last = parts[-1].strip()
    try:
        seconds = float(last) if "." in last else int(last)
    except ValueError:
        return None
    if not last or last[0] in "+-" or seconds < 0:
        return None
    total = 0
    for part, scale in zip(reversed(parts[:-1]), (60, 3600, 86400)):
        total += int(part) * scale
    return total + int(seconds)


_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgtpe]?)([bw]?)\s*\Z", re.IGNORECASE)
_SIZE_SCALE = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def size_bytes(text: Any) -> Optional[int]:
    """PBS size text -> bytes: ``65536000kb``, ``64gb``, ``2tb``, ``1048576`` (bytes),
    ``8w`` (words of 8 bytes). None for anything else."""
    match = _SIZE.match(_text(text))
    if not match:
        return None
    number, scale, unit = match.groups()
    value = int(number) * (1024 ** _SIZE_SCALE[scale.lower()])
    if unit.lower() == "w":
        value *= 8
    return value


def size_megabytes(text: Any) -> Optional[int]:
    """PBS size text -> whole megabytes (rounded down), None when not a size."""
    value = size_bytes(text)
    return None if value is None else value // (1024 * 1024)


_MONTHS = {name: i for i, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_CTIME = re.compile(
    r"\s*(?:[A-Za-z]{3}\s+)?([A-Za-z]{3})\s+(\d{1,2})\s+(\d{1,2}):(\d{2}):(\d{2})\s+(\d{4})\s*\Z"
)


def ctime_to_local(text: Any) -> str:
    """``Mon Nov 13 10:01:02 2023`` (what PBS prints, local time, English names whatever the
    locale) -> ``2023-11-13T10:01:02``; epoch seconds are accepted too; ``""`` otherwise."""
    raw = _text(text).strip()
    if not raw:
        return ""
    if raw.isdigit():
        return epoch_to_local(int(raw))
    match = _CTIME.match(raw)
    if not match:
        return ""
    month = _MONTHS.get(match.group(1).title())
    if month is None:
        return ""
    day, hour, minute, second, year = (int(g) for g in match.groups()[1:])
    return "%04d-%02d-%02dT%02d:%02d:%02d" % (year, month, day, hour, minute, second)


def epoch_to_local(seconds: Any) -> str:
    """Epoch seconds -> local time text; ``""`` for 0, negative or unreadable values."""
    value = _int(seconds)
    if not value or value < 0:
        return ""
    try:
        t = _time.localtime(value)
    except (OverflowError, OSError, ValueError):
        return ""
    return "%04d-%02d-%02dT%02d:%02d:%02d" % (t[0], t[1], t[2], t[3], t[4], t[5])


def _strip_host(path: str) -> str:
    """``host:/path`` (how PBS stores output paths) -> ``/path``. A path PBS stored without a
    host is returned unchanged; only the first colon separates the host."""
    host, sep, rest = path.partition(":")
    if sep and host and "/" not in host:
        return rest
    return path


def _slot_count(text: str) -> int:
    """Slots of one exec_host entry's index part: ``0*4`` (4), ``0-3`` (4), ``0-3,8`` (5),
    ``2`` (1)."""
    if "*" in text:
        count = _int(text.partition("*")[2])
        return count if count and count > 0 else 1
    total = 0
    for piece in text.split(","):
        low, dash, high = piece.partition("-")
        if dash and low.isdigit() and high.isdigit() and int(high) >= int(low):
            total += int(high) - int(low) + 1
        elif piece:
            total += 1
    return total or 1


def parse_exec_host(text: Any) -> Tuple[Tuple[str, ...], int]:
    """An ``exec_host`` value -> (hosts in order, each once; number of slots).

    Forms: ``cn01/0*4+cn02/0*4`` (OpenPBS), ``node01/0+node01/1`` (one entry per slot),
    ``node01/0-3+node02/0-3`` and ``node01/0-3,8-11`` (Torque 4 and later), ``cn01:15002/2``
    (a port after the host). Empty text gives ``((), 0)``.
    """
    raw = _text(text).strip()
    if not raw:
        return ((), 0)
    hosts: List[str] = []
    seen = set()
    slots = 0
    for entry in raw.split("+"):
        entry = entry.strip()
        if not entry:
            continue
        host, slash, index = entry.partition("/")
        host = host.partition(":")[0]
        if host and host not in seen:
            seen.add(host)
            hosts.append(host)
        slots += _slot_count(index) if slash else 1
    return (tuple(hosts), slots)


# --------------------------------------------------------------------------------------------
# Exit status
# --------------------------------------------------------------------------------------------

#: Negative exit statuses: the batch system's own codes, as each family documents them.
_EXEC_CODES_COMMON = {
    -1: "job execution failed before files were staged (no retry)",
    -2: "job execution failed after files were staged (no retry)",
    -3: "job execution failed and will be retried",
    -4: "job aborted while the execution daemon started",
    -5: "job aborted while the execution daemon started (checkpoint, no migration)",
    -6: "job aborted while the execution daemon started (checkpoint, migration allowed)",
    -7: "job restart failed",
}
EXEC_CODES: Dict[str, Dict[int, str]] = {
    FAMILY_OPENPBS: {
        **_EXEC_CODES_COMMON,
        **{
            -10: "invalid user or group id for the job",
            -11: "job rerun",
            -12: "job was checkpointed and killed",
            -13: "bad password",
            -15: "job requeued for restart from a checkpoint",
            -16: "a hook refused to run the job (it will be retried)",
            -17: "a hook refused to run the job",
            -18: "a hook requeued the job",
            -19: "a hook deleted the job",
            -20: "lost contact with the job's first execution host",
            -21: "security problem in the PBS directory",
            -22: "a hook failed or timed out",
            -23: "no Kerberos credentials",
            -24: "killed: CPU use above its limit (burst)",
            -25: "killed: CPU use above its limit (sum)",
            -26: "killed: virtual memory above its limit",
            -27: "killed: memory above its limit",
            -28: "killed: CPU time above its limit",
            -29: "killed: wall time above its limit",
            -30: "job failed to join its sister hosts",
        },
    },
    FAMILY_TORQUE: {
        **_EXEC_CODES_COMMON,
        **{
            -8: "the job's program could not be started",
            -9: "the job's output or error file could not be created",
            -10: "killed: memory above its limit",
            -11: "killed: wall time above its limit",
            -12: "killed: CPU time above its limit",
            -13: "the job's control groups could not be created",
            -14: "the prologue failed",
        },
    },
}

#: Negative codes that mean the system killed the job for passing a limit it asked for.
LIMIT_KILL_CODES: Dict[str, frozenset] = {
    FAMILY_OPENPBS: frozenset({-24, -25, -26, -27, -28, -29}),
    FAMILY_TORQUE: frozenset({-10, -11, -12}),
}


def decode_exit_status(family: str, raw: Any) -> Tuple[Optional[int], str, str]:
    """A PBS exit status -> (exit_code, signal, reason).

    ``None``/empty: not ended yet (or never ran). Above 256: ended by signal
    ``status - 256`` (both families add 256; Torque reports 271 for a cancelled running
    job). Negative: the batch system's own code, explained in ``reason``. Otherwise the
    program's exit status.
    """
    status = _int(raw)
    if status is None:
        return (None, "", "")
    if status > 256:
        number = status - 256
        return (None, str(number), f"ended by signal {number}")
    if status < 0:
        meaning = EXEC_CODES.get(family, {}).get(status, "the batch system could not run the job")
        return (status, "", f"{meaning} (exit status {status})")
    return (status, "", "")


# --------------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------------

#: First probe: both families answer ``--version`` (OpenPBS ``pbs_version = 20.0.1`` on
#: stdout; Torque ``Version: 6.1.3`` or, before 5.0, ``version: 4.2.10`` on stderr).
VERSION_PROBE_ARGV: Tuple[str, ...] = ("qstat", "--version")
#: Second probe, when the first says nothing useful: the server's attributes as text, which
#: every PBS prints (``pbs_version = ...`` among them).
SERVER_PROBE_ARGV: Tuple[str, ...] = ("qstat", "-B", "-f")


@attrs.frozen
class ProbeResult:
    """Which PBS this is: ``family`` (``openpbs`` or ``torque``), ``flavour`` (``OpenPBS``,
    ``PBS Professional`` or ``Torque``), the version as numbers (``()`` when the build
    says only ``latest``) and as printed."""

    family: str
    flavour: str
    version: Tuple[int, ...]
    version_text: str

    def at_least(self, *wanted: int) -> bool:
        """The version is ``wanted`` or later; an unnumbered build counts as the newest."""
        return not self.version or self.version >= tuple(wanted)


def parse_version_text(text: str) -> Tuple[int, ...]:
    """``20.0.1`` -> (20, 0, 1); ``2022.1.3.20230124084011`` -> (2022, 1, 3, 20230124084011);
    ``6.1.3-rc1`` -> (6, 1, 3); ``latest`` or anything without a leading number -> ()."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if not match:
        return ()
    return tuple(int(p) for p in match.group(1).split("."))


def _flavour_of(version: Tuple[int, ...]) -> Tuple[str, str]:
    if not version:
        return (FAMILY_OPENPBS, "OpenPBS")
    major = version[0]
    if major <= 7:
        return (FAMILY_TORQUE, "Torque")
    if major >= 2000 or major < 20:
        return (FAMILY_OPENPBS, "PBS Professional")
    return (FAMILY_OPENPBS, "OpenPBS")


_OPENPBS_VERSION_LINE = re.compile(r"^\s*pbs_version\s*=\s*(\S+)", re.MULTILINE)
_TORQUE_VERSION_LINE = re.compile(r"^\s*version:\s*(\S+)", re.MULTILINE | re.IGNORECASE)
#: Server attributes only one family has: a tie-breaker when the version alone is unclear.
_OPENPBS_ONLY = ("job_history_enable", "eligible_time_enable", "pbs_license_info",
                 "power_provisioning", "max_concurrent_provision", "resv_enable")
_TORQUE_ONLY = ("mom_job_sync", "keep_completed", "net_counter", "next_job_number",
                "auto_node_np", "np_default")


def detect_family(
    version_stdout: str = "",
    version_stderr: str = "",
    server_text: Optional[str] = None,
) -> ProbeResult:
    """Decide the PBS family and version from the probes' output.

    ``version_stdout``/``version_stderr`` are what :data:`VERSION_PROBE_ARGV` printed
    (Torque prints its version on stderr); ``server_text`` what :data:`SERVER_PROBE_ARGV`
    printed, when the first probe was not enough. Raises :class:`PbsParseError` saying what
    was seen when neither tells.
    """
    match = _OPENPBS_VERSION_LINE.search(version_stdout or "") or _OPENPBS_VERSION_LINE.search(
        version_stderr or ""
    )
    if match:
        text = match.group(1)
        version = parse_version_text(text)
        family, flavour = _flavour_of(version)
        if family == FAMILY_TORQUE:
            # "pbs_version =" is OpenPBS's wording; a number that small is an old PBS Pro.
            family, flavour = FAMILY_OPENPBS, "PBS Professional"
        return ProbeResult(family, flavour, version, text)
    for stream in (version_stderr or "", version_stdout or ""):
        match = _TORQUE_VERSION_LINE.search(stream)
        if match:
            text = match.group(1)
            return ProbeResult(FAMILY_TORQUE, "Torque", parse_version_text(text), text)
    if server_text:
        records = parse_full_text(server_text)
        for kind, _name, attributes in records:
            if kind != "Server":
                continue
            text = attributes.get("pbs_version", "").strip()
            version = parse_version_text(text)
            if any(key in attributes for key in _TORQUE_ONLY) and not any(
                key in attributes for key in _OPENPBS_ONLY
            ):
                return ProbeResult(FAMILY_TORQUE, "Torque", version, text)
            if any(key in attributes for key in _OPENPBS_ONLY):
                family, flavour = _flavour_of(version)
                if family == FAMILY_TORQUE:
                    family, flavour = FAMILY_OPENPBS, "PBS Professional"
                return ProbeResult(family, flavour, version, text)
            if text:
                family, flavour = _flavour_of(version)
                return ProbeResult(family, flavour, version, text)
    seen = " | ".join(
        part.strip().splitlines()[0][:80]
        for part in (version_stdout, version_stderr, server_text or "")
        if part and part.strip()
    )
    raise PbsParseError(
        "cannot tell which PBS this is: "
        + (f"the probes printed {seen!r}" if seen else "the probes printed nothing")
        + f" ({' '.join(VERSION_PROBE_ARGV)}; {' '.join(SERVER_PROBE_ARGV)})"
    )


# --------------------------------------------------------------------------------------------
# Lenient JSON
# --------------------------------------------------------------------------------------------


def _json_loads(text: str) -> Any:
    return json.loads(text, parse_int=str, parse_float=str, parse_constant=str, strict=False)


_KEY_LINE = re.compile(r'^(\s*)"((?:[^"\\]|\\.)*)"(\s*:\s*)(.*?)(,?)\s*$')
_PLAIN_LINE = re.compile(r"^(\s*)(.*?)(,?)\s*$")
_STRUCTURE = {"{", "}", "[", "]", "{}", "[]", ""}
_VALID_ESCAPES = set('"\\/bfnrt')
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")


def _repair_string(inner: str) -> str:
    """The inside of a PBS-written JSON string made valid: PBS's own ``\\'`` and ``\\,``
    escapes lose their backslash (what OpenPBS itself does since 20.0), other invalid escapes
    keep the backslash as a character, quotes that are not escaped are escaped."""
    out: List[str] = []
    i = 0
    n = len(inner)
    while i < n:
        ch = inner[i]
        if ch == "\\":
            nxt = inner[i + 1] if i + 1 < n else ""
            if nxt in _VALID_ESCAPES:
                out.append(ch + nxt)
                i += 2
            elif nxt == "u" and _HEX4.match(inner, i + 2):
                out.append(inner[i : i + 6])
                i += 6
            elif nxt in ("'", ","):
                out.append(nxt)
                i += 2
            else:
                out.append("\\\\")
                i += 1
        elif ch == '"':
            out.append('\\"')
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _repair_value(value: str) -> str:
    if value in ("{", "[", "{}", "[]", "true", "false", "null"):
        return value
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return '"' + _repair_string(value[1:-1]) + '"'
    return json.dumps(value)


def _repair_json(text: str) -> str:
    """Rewrite the one-member-per-line JSON OpenPBS wrote by hand into valid JSON."""
    lines = []
    for line in text.split("\n"):
        match = _KEY_LINE.match(line)
        if match:
            indent, key, colon, value, comma = match.groups()
            lines.append(f'{indent}"{_repair_string(key)}"{colon}{_repair_value(value)}{comma}')
            continue
        plain = _PLAIN_LINE.match(line)
        assert plain is not None  # the pattern matches any line
        indent, value, comma = plain.groups()
        if value in _STRUCTURE or value in ("},", "],"):
            lines.append(line)
        else:
            lines.append(f"{indent}{_repair_value(value)}{comma}")
    return "\n".join(lines)


def load_pbs_json(text: str, what: str = "PBS JSON output") -> Dict[str, Any]:
    """Read JSON as OpenPBS and PBS Professional print it (see the module docstring).

    Numbers come back as their own text; an empty output raises :class:`PbsParseError`.
    """
    if not text or not text.strip():
        raise PbsParseError(f"{what} is empty")
    try:
        document = _json_loads(text)
    except ValueError:
        if not text.lstrip().startswith("{"):
            shown = text.strip().splitlines()[0][:120]
            raise PbsParseError(f"{what} is not readable JSON: {shown!r}") from None
        repaired = _repair_json(text)
        try:
            document = _json_loads(repaired)
        except ValueError as error:
            line = getattr(error, "lineno", None)
            where = f" at line {line}" if line else ""
            raise PbsParseError(f"{what} is not readable JSON{where}: {error}") from None
    if not isinstance(document, dict):
        raise PbsParseError(f"{what} is JSON but not an object")
    return document


def _section(document: Mapping[str, Any], *names: str) -> Dict[str, Any]:
    for name in names:
        value = document.get(name)
        if isinstance(value, dict):
            return value
    return {}


# --------------------------------------------------------------------------------------------
# OpenPBS / PBS Professional
# --------------------------------------------------------------------------------------------


def _owner_user(owner: str) -> str:
    return owner.partition("@")[0]


def _resource(attrs_: Mapping[str, Any], group: str, name: str) -> Any:
    """``Resource_List.walltime`` whether the JSON nests it (``{"Resource_List": {...}}``,
    OpenPBS) or the text form keeps it flat (``"Resource_List.walltime"``)."""
    nested = attrs_.get(group)
    if isinstance(nested, dict) and name in nested:
        return nested[name]
    return attrs_.get(f"{group}.{name}")


def _common_job(
    family: str,
    job_id: str,
    attrs_: Mapping[str, Any],
    submit_time: str,
    start_time: str,
    end_time: str,
) -> NativeJob:
    state = _text(attrs_.get("job_state")).strip()
    hosts, slots = parse_exec_host(attrs_.get("exec_host"))
    exit_code, signal, exit_reason = decode_exit_status(
        family, attrs_.get("Exit_status", attrs_.get("exit_status"))
    )
    procs = _int(_resource(attrs_, "Resource_List", "ncpus"))
    if procs is None:
        procs = _int(_resource(attrs_, "Resource_List", "procs"))
    if procs is None and slots:
        procs = slots
    nodes = _int(_resource(attrs_, "Resource_List", "nodect"))
    if nodes is None and hosts:
        nodes = len(hosts)
    stdout_path = _strip_host(_text(attrs_.get("Output_Path")))
    stderr_path = _strip_host(_text(attrs_.get("Error_Path")))
    join = _text(attrs_.get("Join_Path"))
    if join == "oe":
        stderr_path = stdout_path
    elif join == "eo":
        stdout_path = stderr_path
    variables = attrs_.get("Variable_List")
    if isinstance(variables, dict):
        work_dir = _text(variables.get("PBS_O_WORKDIR"))
    else:
        work_dir = _variable(_text(variables), "PBS_O_WORKDIR")
    comment = _text(attrs_.get("comment"))
    return NativeJob(
        job_id=job_id,
        name=_text(attrs_.get("Job_Name")),
        user=_owner_user(_text(attrs_.get("Job_Owner")) or _text(attrs_.get("euser"))),
        queue=_text(attrs_.get("queue")),
        native_state=state,
        reason=exit_reason or comment,
        account=_text(attrs_.get("Account_Name")),
        hosts=hosts,
        num_nodes=nodes,
        num_procs=procs,
        submit_time=submit_time,
        start_time=start_time,
        end_time=end_time,
        time_used=duration_seconds(_resource(attrs_, "resources_used", "walltime")),
        time_limit=duration_seconds(_resource(attrs_, "Resource_List", "walltime")),
        exit_code=exit_code,
        signal=signal,
        work_dir=work_dir,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        priority=_int(attrs_.get("Priority")),
    )


def _variable(variable_list: str, name: str) -> str:
    """One variable of a flat ``Variable_List`` (``A=1,B=x\\,y``: PBS escapes commas in
    values with a backslash)."""
    prefix = name + "="
    for item in re.split(r"(?<!\\),", variable_list):
        item = item.strip()
        if item.startswith(prefix):
            return item[len(prefix) :].replace("\\,", ",")
    return ""


_SUBJOB_ID = re.compile(r"^(\d+)\[(\d+)\](.*)$")


def _openpbs_job(job_id: str, attrs_: Mapping[str, Any]) -> NativeJob:
    state = _text(attrs_.get("job_state")).strip()
    end = attrs_.get("obittime")
    if not _text(end) and state in ("F", "X"):
        # Before obittime existed the last modification of a finished job is its end.
        end = attrs_.get("mtime")
    job = _common_job(
        FAMILY_OPENPBS,
        job_id,
        attrs_,
        submit_time=ctime_to_local(attrs_.get("ctime")),
        start_time=ctime_to_local(attrs_.get("stime")),
        end_time=ctime_to_local(end),
    )
    array_id = ""
    array_index = ""
    subjob = _SUBJOB_ID.match(job_id)
    if _text(attrs_.get("array_id")) or subjob:
        # OpenPBS 23.06 gives a queued subjob no array_id: its id says whose element it is.
        array_id = _text(attrs_.get("array_id")) or (f"{subjob.group(1)}[]{subjob.group(3)}" if subjob else "")
        array_index = _text(attrs_.get("array_index"))
        if not array_index:
            array_index = subjob.group(2) if subjob else ""
    elif _text(attrs_.get("array")).lower() == "true":
        array_id = job_id
        array_index = _text(attrs_.get("array_indices_remaining")) or _text(
            attrs_.get("array_indices_submitted")
        )
        if array_index == "-":
            array_index = ""
    account = job.account
    project = _text(attrs_.get("project"))
    if not account and project and project != "_pbs_project_default":
        account = project
    return attrs.evolve(
        job,
        array_id=array_id,
        array_index=array_index,
        account=account,
        cancelled=_text(attrs_.get("substate")).strip() == "91",
    )


def _user_filter(jobs: Iterable[NativeJob], user: Optional[str]) -> List[NativeJob]:
    if not user:
        return list(jobs)
    return [job for job in jobs if job.user == user]


def parse_openpbs_jobs(text: str, user: Optional[str] = None) -> List[NativeJob]:
    """``qstat -f -F json [-t] [-x]`` -> jobs in qstat's order (array parents and sub-jobs
    alike), only ``user``'s when given (OpenPBS's long format has no user filter of its
    own). An output with no ``Jobs`` member (nothing queued) gives ``[]``."""
    document = load_pbs_json(text, "qstat JSON output")
    jobs = [
        _openpbs_job(str(job_id), attributes)
        for job_id, attributes in _section(document, "Jobs").items()
        if isinstance(attributes, dict)
    ]
    return _user_filter(jobs, user)


def _openpbs_jobs_cpus(jobs: Any) -> int:
    """CPUs in use from an OpenPBS node's ``jobs``: one entry per CPU, as a JSON list
    (``["1.s/0", "1.s/1"]``) or the text form ``1.s/0, 1.s/1``."""
    if isinstance(jobs, list):
        return sum(1 for job in jobs if _text(job).strip())
    return sum(1 for piece in _text(jobs).split(",") if piece.strip())


_TORQUE_NODE_JOB = re.compile(r"([0-9][0-9,\-]*)/([^,\s]+)")


def _torque_jobs_cpus(jobs: str) -> int:
    """CPUs in use from a Torque node's ``jobs``: ``0/1.s, 1/1.s`` (one entry per CPU, up to
    4.2) or ``0-3,8/1.s,4/2.s`` (CPU ranges, 5.0 and later)."""
    return sum(_slot_count(cpus) for cpus, _job in _TORQUE_NODE_JOB.findall(jobs))


def parse_openpbs_nodes(text: str, node_state=None) -> List[NativeNode]:
    """``pbsnodes -a -F json`` -> nodes in pbsnodes' order. ``node_state`` maps the native
    state text to UP/DOWN/ERROR/UNKNOWN (see ``pbs.node_state``); without it ``state`` stays
    ``UNKNOWN``."""
    document = load_pbs_json(text, "pbsnodes JSON output")
    nodes = []
    for name, attributes in _section(document, "nodes", "Nodes").items():
        if not isinstance(attributes, dict):
            continue
        native = _text(attributes.get("state"))
        cpus = _int(_resource(attributes, "resources_available", "ncpus"))
        if cpus is None:
            cpus = _int(attributes.get("pcpus"))
        used = _int(_resource(attributes, "resources_assigned", "ncpus"))
        if used is None and attributes.get("jobs") is not None:
            used = _openpbs_jobs_cpus(attributes.get("jobs"))
        if used is None and isinstance(attributes.get("resources_assigned"), dict):
            used = 0  # an empty resources_assigned: nothing assigned
        queue = _text(attributes.get("queue"))
        nodes.append(
            NativeNode(
                name=str(name),
                native_state=native,
                state=node_state(native) if node_state else "UNKNOWN",
                cpus=cpus,
                cpus_used=used,
                memory_mb=size_megabytes(_resource(attributes, "resources_available", "mem")),
                load=None,
                queues=(queue,) if queue else (),
                reason=_text(attributes.get("comment")),
                arch=_text(_resource(attributes, "resources_available", "arch")),
            )
        )
    return nodes


_STATE_COUNT = re.compile(r"([A-Za-z]+):(\d+)")


def _state_counts(text: Any) -> Dict[str, int]:
    return {name.lower(): int(count) for name, count in _STATE_COUNT.findall(_text(text))}


def _queue(
    name: str,
    attributes: Mapping[str, Any],
    default_queue: Optional[str],
    queue_state,
) -> NativeQueue:
    enabled = _text(attributes.get("enabled")).strip().lower() == "true"
    started = _text(attributes.get("started")).strip().lower() == "true"
    native = ("enabled" if enabled else "disabled") + "," + ("started" if started else "stopped")
    counts = _state_counts(attributes.get("state_count"))
    waiting = None
    running = None
    if counts:
        waiting = counts.get("queued", 0) + counts.get("held", 0) + counts.get("waiting", 0)
        running = counts.get("running", 0) + counts.get("exiting", 0) + counts.get("begun", 0)
    max_nodes = _int(_resource(attributes, "resources_max", "nodect"))
    if max_nodes is None:
        max_nodes = _int(_resource(attributes, "resources_max", "nodes"))
    return NativeQueue(
        name=name,
        native_state=native,
        state=queue_state(enabled, started) if queue_state else ("NORMAL" if enabled and started else "STOPPED"),
        is_default=bool(default_queue) and name == default_queue,
        max_time=duration_seconds(_resource(attributes, "resources_max", "walltime")),
        default_time=duration_seconds(_resource(attributes, "resources_default", "walltime")),
        max_nodes=max_nodes,
        total_nodes=None,
        total_slots=_int(_resource(attributes, "resources_available", "ncpus")),
        free_slots=None,
        waiting=waiting,
        running=running,
    )


def parse_openpbs_queues(
    text: str, default_queue: Optional[str] = None, queue_state=None
) -> List[NativeQueue]:
    """``qstat -Q -f -F json`` -> queues. ``default_queue`` (the server's ``default_queue``,
    see :func:`parse_openpbs_server`) marks the default one."""
    document = load_pbs_json(text, "qstat -Q JSON output")
    return [
        _queue(str(name), attributes, default_queue, queue_state)
        for name, attributes in _section(document, "Queue", "Queues").items()
        if isinstance(attributes, dict)
    ]


@attrs.frozen
class ServerInfo:
    """What the server says of itself: its name, default queue and version text."""

    name: str = ""
    default_queue: str = ""
    version_text: str = ""


def parse_openpbs_server(text: str) -> ServerInfo:
    """``qstat -B -f -F json`` -> the (first) server's name, default queue and version."""
    document = load_pbs_json(text, "qstat -B JSON output")
    for name, attributes in _section(document, "Server", "Servers").items():
        if isinstance(attributes, dict):
            return ServerInfo(
                str(name),
                _text(attributes.get("default_queue")),
                _text(attributes.get("pbs_version")) or _text(document.get("pbs_version")),
            )
    return ServerInfo("", "", _text(document.get("pbs_version")))


# --------------------------------------------------------------------------------------------
# Torque XML
# --------------------------------------------------------------------------------------------

# Characters XML 1.0 forbids: Torque writes them as they are (a job name with a control
# character), and no XML reader accepts them.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_BARE_AMPERSAND = re.compile(r"&(?!(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#x[0-9A-Fa-f]+);)")


def _load_torque_xml(text: str, what: str) -> Optional[ET.Element]:
    """The ``<Data>`` element of Torque's XML, None for an empty listing."""
    if not text or not text.strip():
        return None
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        # Torque never writes either; refusing them keeps entity expansion out.
        raise PbsParseError(f"{what} contains a document type declaration")
    body = _XML_ILLEGAL.sub("\ufffd", text.strip())
    if body.startswith("<?xml"):
        end = body.find("?>")
        body = body[end + 2 :].strip() if end >= 0 else ""
    if not body:
        return None
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        try:
            root = ET.fromstring(_BARE_AMPERSAND.sub("&amp;", body))
        except ET.ParseError as error:
            raise PbsParseError(f"{what} is not readable XML: {error}") from None
    if root.tag != "Data":
        raise PbsParseError(f"{what} is XML but its root is <{root.tag}>, not <Data>")
    return root


def _element_attrs(element: ET.Element) -> Dict[str, Any]:
    """A Torque job/node element -> attribute dict; an element with children (resources)
    becomes a nested dict, as in OpenPBS's JSON."""
    result: Dict[str, Any] = {}
    for child in element:
        if len(child):
            result[child.tag] = {grand.tag: grand.text or "" for grand in child}
        else:
            result[child.tag] = child.text or ""
    return result


def _torque_job(attributes: Mapping[str, Any]) -> NativeJob:
    job_id = _text(attributes.get("Job_Id"))
    state = _text(attributes.get("job_state")).strip()
    end = attributes.get("comp_time")
    job = _common_job(
        FAMILY_TORQUE,
        job_id,
        attributes,
        submit_time=epoch_to_local(attributes.get("ctime")),
        start_time=epoch_to_local(attributes.get("start_time")),
        end_time=epoch_to_local(end) if _text(end) else "",
    )
    array_id = ""
    array_index = ""
    match = _SUBJOB_ID.match(job_id)
    if match:
        array_id = f"{match.group(1)}[]{match.group(3)}"
        array_index = _text(attributes.get("job_array_id")) or match.group(2)
    elif "[]" in job_id:
        array_id = job_id
        array_index = _text(attributes.get("job_array_request"))
    procs = job.num_procs
    if procs is None:
        procs = _torque_nodes_procs(_text(_resource(attributes, "Resource_List", "nodes")))
    cancelled = job.exit_code is None and not job.signal and state == "C"
    return attrs.evolve(
        job, array_id=array_id, array_index=array_index, num_procs=procs, cancelled=cancelled
    )


def _torque_nodes_procs(spec: str) -> Optional[int]:
    """``2:ppn=4+1:ppn=2`` -> 10; ``node01:ppn=8`` -> 8; ``3`` -> 3; None when empty."""
    if not spec:
        return None
    total = 0
    for part in spec.split("+"):
        pieces = part.split(":")
        count = int(pieces[0]) if pieces[0].isdigit() else 1
        ppn = 1
        for piece in pieces[1:]:
            key, _, value = piece.partition("=")
            if key == "ppn" and value.isdigit():
                ppn = int(value)
        total += count * ppn
    return total or None


def parse_torque_jobs(text: str, user: Optional[str] = None) -> List[NativeJob]:
    """``qstat -f -x [-t]`` -> jobs in qstat's order, only ``user``'s when given.

    With ``-t`` Torque lists an array's elements (``123[4].server``) and not the array
    itself; :func:`array_parents` derives one record per array from them. Completed jobs
    (state ``C``) appear while the server keeps them (``keep_completed``); one without an
    exit status never ran, so it was deleted while it waited (``cancelled``).
    """
    root = _load_torque_xml(text, "qstat XML output")
    if root is None:
        return []
    jobs = [_torque_job(_element_attrs(element)) for element in root.iter("Job")]
    return _user_filter((job for job in jobs if job.job_id), user)


_TORQUE_RUNNING = {"R", "E", "S"}
_TORQUE_WAITING = {"Q", "H", "W", "T"}


def array_parents(jobs: Sequence[NativeJob]) -> List[NativeJob]:
    """One record per job array whose elements are listed but whose parent is not (Torque
    with ``-t``): state ``R`` while any element runs, ``H`` when every waiting element is
    held and none ran, ``Q`` while any waits, ``C`` when all completed (exit status 0 if
    every element's was, otherwise the first non-zero one; ``cancelled`` if any element
    was). Records already present as parents are not repeated."""
    listed = {job.job_id for job in jobs}
    groups: Dict[str, List[NativeJob]] = {}
    for job in jobs:
        if job.array_id and job.array_id != job.job_id and job.array_id not in listed:
            groups.setdefault(job.array_id, []).append(job)
    parents = []
    for array_id, members in groups.items():
        states = [m.native_state for m in members]
        if any(s in _TORQUE_RUNNING for s in states):
            state = "R"
        elif any(s in _TORQUE_WAITING for s in states):
            waiting = [s for s in states if s in _TORQUE_WAITING]
            state = "H" if all(s == "H" for s in waiting) and "C" not in states else "Q"
        else:
            state = "C"
        exit_code: Optional[int] = None
        signal = ""
        if state == "C":
            codes = [m.exit_code for m in members if m.exit_code is not None]
            nonzero = [c for c in codes if c != 0]
            signals = [m.signal for m in members if m.signal]
            if nonzero:
                exit_code = nonzero[0]
            elif signals:
                signal = signals[0]
            elif codes:
                exit_code = 0
        first = members[0]
        # Torque names each element "<array name>-<index>".
        name = first.name
        suffix = "-" + first.array_index
        if first.array_index and name.endswith(suffix):
            name = name[: -len(suffix)]
        hosts: List[str] = []
        for member in members:
            hosts.extend(h for h in member.hosts if h not in hosts)
        starts = [m.start_time for m in members if m.start_time]
        ends = [m.end_time for m in members if m.end_time]
        parents.append(
            attrs.evolve(
                first,
                job_id=array_id,
                name=name,
                native_state=state,
                hosts=tuple(hosts),
                start_time=min(starts) if starts else "",
                end_time=max(ends) if state == "C" and ends else "",
                exit_code=exit_code,
                signal=signal,
                reason="",
                array_id=array_id,
                array_index=_index_summary(m.array_index for m in members),
                cancelled=state == "C" and any(m.cancelled for m in members),
            )
        )
    return parents


def _index_summary(indices: Iterable[str]) -> str:
    numbers = sorted({int(i) for i in indices if i.isdigit()})
    ranges = []
    for n in numbers:
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def _torque_status(status: str) -> Dict[str, str]:
    """A Torque node's ``status`` (``key=value`` pairs joined by commas; a value such as
    ``uname`` may itself contain spaces but never a comma)."""
    result = {}
    for item in status.split(","):
        key, sep, value = item.partition("=")
        if sep:
            result[key.strip()] = value
    return result


def parse_torque_nodes(text: str, node_state=None) -> List[NativeNode]:
    """``pbsnodes -x`` -> nodes in pbsnodes' order (``np`` CPUs, ``jobs`` for the CPUs in
    use, ``status`` for memory, load and operating system, ``note`` as the reason)."""
    root = _load_torque_xml(text, "pbsnodes XML output")
    if root is None:
        return []
    nodes = []
    for element in root.iter("Node"):
        attributes = _element_attrs(element)
        name = _text(attributes.get("name"))
        if not name:
            continue
        status = _torque_status(_text(attributes.get("status")))
        native = _text(attributes.get("state"))
        jobs = _text(attributes.get("jobs"))
        load = status.get("loadave")
        try:
            load_value = float(load) if load not in (None, "") else None
        except ValueError:
            load_value = None
        nodes.append(
            NativeNode(
                name=name,
                native_state=native,
                state=node_state(native) if node_state else "UNKNOWN",
                cpus=_int(attributes.get("np")) if _text(attributes.get("np")) else _int(status.get("ncpus")),
                cpus_used=_torque_jobs_cpus(jobs) if jobs else 0,
                memory_mb=size_megabytes(status.get("physmem")),
                load=load_value,
                queues=(),
                reason=_text(attributes.get("note")),
                arch=status.get("opsys", ""),
            )
        )
    return nodes


# --------------------------------------------------------------------------------------------
# The text of "qstat -f", "qstat -Q -f", "qstat -B -f" (both families)
# --------------------------------------------------------------------------------------------

_RECORD_HEAD = re.compile(r"^(Job Id|Queue|Server|Resv ID|Reservation ID):\s*(.*?)\s*$")
_ATTRIBUTE = re.compile(r"^\s+([A-Za-z_][A-Za-z0-9_.\-]*)\s=\s?(.*)$")


def parse_full_text(text: str) -> List[Tuple[str, str, Dict[str, str]]]:
    """The long text format -> ``[(kind, name, {attribute: value})]``.

    ``kind`` is ``Job Id``/``Queue``/``Server``; attribute names keep their resource part
    (``resources_max.walltime``). A line that does not start a new attribute continues the
    previous value: OpenPBS wraps long values at a fixed width and continues them on a line
    starting with a tab (joined without a separator), older Torque the same.
    """
    records: List[Tuple[str, str, Dict[str, str]]] = []
    current: Optional[Dict[str, str]] = None
    last: Optional[str] = None
    for line in text.splitlines():
        head = _RECORD_HEAD.match(line)
        if head:
            current = {}
            records.append((head.group(1), head.group(2), current))
            last = None
            continue
        if current is None or not line.strip():
            continue
        attribute = _ATTRIBUTE.match(line)
        if attribute and not line.startswith("\t"):
            last = attribute.group(1)
            current[last] = attribute.group(2).rstrip()
        elif last is not None:
            current[last] += line.lstrip("\t").rstrip("\n")
    return records


def parse_torque_queues(
    text: str, default_queue: Optional[str] = None, queue_state=None
) -> List[NativeQueue]:
    """``qstat -Q -f -1`` (or without ``-1``) text -> queues."""
    return [
        _queue(name, attributes, default_queue, queue_state)
        for kind, name, attributes in parse_full_text(text)
        if kind == "Queue"
    ]


def parse_torque_server(text: str) -> ServerInfo:
    """``qstat -B -f`` text (either family) -> the first server's name, default queue and
    version."""
    for kind, name, attributes in parse_full_text(text):
        if kind == "Server":
            return ServerInfo(name, attributes.get("default_queue", ""), attributes.get("pbs_version", ""))
    return ServerInfo()


# --------------------------------------------------------------------------------------------
# qsub, error messages, tracejob
# --------------------------------------------------------------------------------------------

_JOB_ID = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9][A-Za-z0-9._\-]*)?$")


def parse_qsub_output(text: str) -> str:
    """qsub's output -> the new job's id (``1234.server``, ``1234[].server`` for an array).

    qsub prints the id alone on a line; anything before it (a warning some sites' submit
    filters print on stdout) is skipped. No id raises :class:`PbsParseError` quoting the
    output."""
    for line in reversed(text.splitlines()):
        candidate = line.strip()
        if _JOB_ID.match(candidate):
            return candidate
    shown = text.strip()[:200]
    raise PbsParseError(f"qsub printed no job id: {shown!r}" if shown else "qsub printed nothing")


_UNKNOWN_JOB = re.compile(r"Unknown Job Id|Job has finished|job has been deleted|Unknown Job", re.I)


def is_unknown_job_error(stderr: str) -> bool:
    """The command failed because the server does not know the job (any more)."""
    return bool(_UNKNOWN_JOB.search(stderr or ""))


_TRACE_LINE = re.compile(
    r"^(\d{2})/(\d{2})/(\d{4}) (\d{2}):(\d{2}):(\d{2})(?:\.\d+)?\s+([A-Z])\s+(.*)$"
)
_KEY_VALUE = re.compile(r"(\S+?)=(\S*)")


def parse_tracejob(text: str, family: str, job_id: str = "") -> Optional[NativeJob]:
    """``tracejob JOBID`` -> the job's final record, or None when the logs hold no end.

    tracejob merges the server, execution and accounting logs of the job: lines
    ``MM/DD/YYYY HH:MM:SS  <source>  <message>``. The end is read from the accounting
    record (``E``: ``Exit_status=...``, ``resources_used.walltime=...``; Torque and OpenPBS
    write it alike) or, failing that, from the server's ``Exit_status=`` line; a deletion
    (``Job deleted at request of ...`` or an accounting ``D`` record) marks it cancelled.
    A deleted job that never ran has no exit status.
    """
    header = re.search(r"^Job:\s*(\S+)", text, re.MULTILINE)
    found_id = header.group(1) if header else job_id
    exit_raw: Optional[str] = None
    fields: Dict[str, str] = {}
    deleted = False
    end_time = ""
    start_time = ""
    submit_time = ""
    last_time = ""
    for line in text.splitlines():
        match = _TRACE_LINE.match(line.strip())
        if not match:
            continue
        month, day, year, hour, minute, second, _source, message = match.groups()
        stamp = f"{year}-{month}-{day}T{hour}:{minute}:{second}"
        last_time = stamp
        if not submit_time and ("Job Queued" in message or "enqueuing into" in message):
            submit_time = stamp
        if "Job Run" in message or message.startswith("Started") or "Job Modified at request of Scheduler" in message:
            start_time = start_time or stamp
        if re.search(r"\bdeleted\b.*\brequest of\b|\bJob deleted\b|delete request", message, re.I):
            deleted = True
        pairs = dict(_KEY_VALUE.findall(message))
        if "Exit_status" in pairs:
            # The server's "Exit_status=..." line and the accounting end record (which also
            # names the user, queue, times and hosts) both carry it; the later one wins.
            exit_raw = pairs["Exit_status"]
            fields.update(pairs)
            end_time = stamp
        elif message.startswith("requestor="):
            # The accounting record of a deletion.
            deleted = True
            end_time = end_time or stamp
        elif "user=" in message and "jobname=" in message:
            for key, value in pairs.items():
                fields.setdefault(key, value)
    if exit_raw is None and not deleted:
        return None
    exit_code, signal, reason = decode_exit_status(family, exit_raw)
    if fields.get("end"):
        end_time = epoch_to_local(fields["end"]) or end_time
    if fields.get("start"):
        start_time = epoch_to_local(fields["start"]) or start_time
    if fields.get("ctime"):
        submit_time = epoch_to_local(fields["ctime"]) or submit_time
    hosts, slots = parse_exec_host(fields.get("exec_host", ""))
    state = "C" if family == FAMILY_TORQUE else "F"
    return NativeJob(
        job_id=found_id,
        name=fields.get("jobname", ""),
        user=fields.get("user", ""),
        queue=fields.get("queue", ""),
        native_state=state,
        reason=reason or ("deleted" if deleted else ""),
        account=fields.get("account", ""),
        hosts=hosts,
        num_procs=slots or None,
        submit_time=submit_time,
        start_time=start_time,
        end_time=end_time or last_time,
        time_used=duration_seconds(fields.get("resources_used.walltime", "")),
        time_limit=duration_seconds(fields.get("Resource_List.walltime", "")),
        exit_code=exit_code,
        signal=signal,
        cancelled=deleted,
    )
