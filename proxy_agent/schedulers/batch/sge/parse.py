"""Parsers for Grid Engine's command output (Son of Grid Engine 8.1.9 and its relatives).

Pure functions from the text a command printed to the neutral records of
:mod:`~proxy_agent.schedulers.batch.records`; nothing here runs a command.

What they read
--------------
- ``qstat -xml [-r] [-u '*']``: jobs; running ones under ``queue_info``, pending ones under
  the second ``job_info`` element (:func:`parse_jobs`).  ``qstat -f -xml`` nests running jobs
  inside each queue instance instead; :func:`parse_jobs` reads that form too.
- ``qstat -f -xml``: queue instances (:func:`parse_queue_instances`) and, summed per cluster
  queue, queues (:func:`parse_queues`).  A queue instance's state is an element named
  ``state`` just like a job's: only ``Queue-List/state`` is the queue's.
- ``qhost -q -xml`` (or plain ``qhost -xml``): hosts as nodes (:func:`parse_hosts`).
- ``qstat -j ID -xml``: one job in detail, above all why an ``Eqw`` job cannot start
  (:func:`parse_job_detail`); an unknown id gives ``<unknown_jobs>`` and no record.
- ``qacct -j ID``: accounting records, several for a rescheduled job (:func:`parse_qacct`).
- ``qsub -terse``: the new job's id, ``ID`` or ``ID.FIRST-LAST:STEP`` (:func:`parse_qsub_terse`).
- ``qconf -sq QUEUE``: a queue's configuration, for its wall-time limit
  (:func:`parse_queue_config`).

Safety
------
Job names, paths and messages come from other users.  Grid Engine escapes ``&``, ``>`` and
quotes in its XML, but writes ``<`` as ``%lt;`` (decoded back here), and copies non-ASCII
bytes through as they are.  Before parsing, text that is not valid UTF-8 is replaced, and
characters XML 1.0 forbids (control characters) become U+FFFD.  A document type declaration
is refused: Grid Engine never writes one, and only one could declare entities to expand.

Times come as ``2024-05-01T12:00:00`` (``qstat -xml``, sometimes with fractional seconds),
epoch seconds (``qstat -j -xml``) or ``Mon Nov 23 11:51:41 2026`` (``qacct``); all become the
local time as ``YYYY-MM-DDTHH:MM:SS``.
"""

from __future__ import annotations

import re
import signal
import time
import xml.etree.ElementTree as ET
from typing import Dict, Iterable, List, Optional, Tuple, Union

import attrs

from ..records import NativeJob, NativeNode, NativeQueue

__all__ = [
    "SgeParseError",
    "QueueInstance",
    "decode",
    "normalize_time",
    "parse_duration",
    "parse_jobs",
    "parse_queue_instances",
    "parse_queues",
    "parse_hosts",
    "parse_job_detail",
    "unknown_job_ids",
    "parse_qacct_records",
    "parse_qacct",
    "parse_qsub_terse",
    "parse_queue_config",
    "queue_max_time",
    "node_state",
    "queue_instance_stopped",
    "QUEUE_INSTANCE_LETTERS",
]


class SgeParseError(ValueError):
    """Grid Engine output that cannot be read: the message says which command's and why."""


Text = Union[str, bytes]

# --------------------------------------------------------------------------- text and XML

# Characters XML 1.0 does not allow anywhere in a document.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_DOCTYPE = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def decode(data: Text) -> str:
    """Command output as text: UTF-8, with undecodable bytes replaced (never an error)."""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    if not isinstance(data, str):
        raise SgeParseError(f"expected command output as text, got {type(data).__name__}")
    return data


def _unescape(text: Optional[str]) -> str:
    # Grid Engine's XML writer turns "<" into "%lt;" instead of "&lt;".
    if not text:
        return ""
    return text.replace("%lt;", "<").strip()


def _xml_root(data: Text, what: str) -> ET.Element:
    text = decode(data)
    if _DOCTYPE.search(text):
        raise SgeParseError(f"{what}: output holds a document type declaration, which Grid Engine never writes")
    text = _XML_FORBIDDEN.sub("\ufffd", text)
    if not text.strip():
        raise SgeParseError(f"{what}: empty output")
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise SgeParseError(f"{what}: not well-formed XML ({exc})") from None


def _child_text(elem: ET.Element, tag: str) -> str:
    child = elem.find(tag)
    return _unescape(child.text) if child is not None else ""


def _int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        try:
            return int(float(text.strip()))
        except (ValueError, OverflowError):
            return None


def _float(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text.strip()) if text is not None else None
    except ValueError:
        return None
    if value is not None and value != value:  # NaN
        return None
    return value


# --------------------------------------------------------------------------- times


_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,]\d+)?")
_CTIME = re.compile(r"[A-Z][a-z]{2}\s+([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


def normalize_time(text: Optional[str]) -> str:
    """Any Grid Engine time as local ``YYYY-MM-DDTHH:MM:SS``; "" for none, 0, ``-/-``,
    ``undefined`` or anything unreadable."""
    if not text:
        return ""
    text = text.strip()
    m = _ISO.match(text)
    if m:
        return "{}-{}-{}T{}:{}:{}".format(*m.groups())
    if text.isdigit():
        seconds = int(text)
        if seconds <= 0:
            return ""
        if seconds > 100_000_000_000:  # milliseconds, as some versions write them
            seconds //= 1000
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))
        except (OverflowError, OSError, ValueError):
            return ""
    m = _CTIME.match(text)
    if m and m.group(1) in _MONTHS:
        month, day, hh, mm, ss, year = m.groups()
        return f"{year}-{_MONTHS[month]:02d}-{int(day):02d}T{hh}:{mm}:{ss}"
    return ""


_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: Optional[str]) -> Optional[int]:
    """A Grid Engine duration (``300``, ``0:5:0``, ``1:00:00``, ``12.5s``) in whole seconds;
    None for ``INFINITY``, empty or unreadable text."""
    if not text:
        return None
    text = text.strip()
    if text.upper() in ("INFINITY", "NONE", "UNDEFINED", "-"):
        return None
    if ":" in text:
        parts = text.split(":")
        if len(parts) > 3 or not all(p.isdigit() or p == "" for p in parts):
            return None
        total = 0
        for part in parts:
            total = total * 60 + (int(part) if part else 0)
        return total
    m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([smhd]?)", text)
    if not m:
        return None
    return int(float(m.group(1)) * _DURATION_UNITS[m.group(2)])


_MEMORY_UNITS = {"": 1 / (1024 * 1024), "B": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1,
                 "G": 1024, "T": 1024 * 1024, "P": 1024 ** 3}


def _memory_mb(text: Optional[str]) -> Optional[int]:
    """``23.5G`` / ``213.6M`` / ``1024`` (bytes) in megabytes."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGTPkmgtp]?)[Bb]?\s*", text)
    if not m:
        return None
    return int(round(float(m.group(1)) * _MEMORY_UNITS[m.group(2).upper()]))


# --------------------------------------------------------------------------- jobs


def _split_queue(queue_instance: str) -> Tuple[str, str]:
    """``all.q@vm`` -> (``all.q``, ``vm``)."""
    queue, _, host = queue_instance.partition("@")
    return queue, host


def _hard_request(elem: ET.Element, name: str) -> str:
    for req in elem.findall("hard_request"):
        if req.get("name") == name:
            return _unescape(req.text)
    return ""


def _job_from_list_entry(elem: ET.Element, queue_instance: str = "") -> Optional[NativeJob]:
    number = _child_text(elem, "JB_job_number")
    if not number.isdigit():
        return None
    tasks = _child_text(elem, "tasks")
    name = _child_text(elem, "full_job_name") or _child_text(elem, "JB_name")
    queue_instance = queue_instance or _child_text(elem, "queue_name")
    queue, host = _split_queue(queue_instance)
    if not queue:
        # A pending job belongs to no queue yet; the queue it asked for is the best answer.
        queue = _child_text(elem, "hard_req_queue")
    running = bool(host)
    return NativeJob(
        job_id=f"{number}.{tasks}" if tasks else number,
        name=name,
        user=_child_text(elem, "JB_owner"),
        queue=queue,
        native_state=_child_text(elem, "state"),
        hosts=(host,) if host else (),
        num_nodes=1 if running else None,
        num_procs=_int(_child_text(elem, "slots")),
        submit_time=normalize_time(_child_text(elem, "JB_submission_time")),
        start_time=normalize_time(_child_text(elem, "JAT_start_time")),
        time_limit=parse_duration(_hard_request(elem, "h_rt")),
        array_id=number if tasks else "",
        array_index=tasks,
    )


def parse_jobs(data: Text) -> List[NativeJob]:
    """Jobs of ``qstat -xml`` (any of ``-r``, ``-u``, ``-s``) or of ``qstat -f -xml``.

    An array's running tasks are one record each (``job_id`` ``"7.3"``); its pending tasks
    are one record per group that shares a state (``"7.4-9:1"``, ``"7.1,7"``).  In the
    ``-f`` form a parallel job spread over several queue instances is listed under each;
    those entries are merged into one record with all hosts and the slots summed.
    """
    root = _xml_root(data, "qstat -xml")
    jobs: Dict[str, NativeJob] = {}
    order: List[str] = []

    def add(job: Optional[NativeJob], merge: bool) -> None:
        if job is None:
            return
        seen = jobs.get(job.job_id)
        if seen is None:
            jobs[job.job_id] = job
            order.append(job.job_id)
        elif merge:
            hosts = seen.hosts + tuple(h for h in job.hosts if h not in seen.hosts)
            procs = (seen.num_procs or 0) + (job.num_procs or 0)
            jobs[job.job_id] = attrs.evolve(seen, hosts=hosts, num_nodes=len(hosts) or None,
                                            num_procs=procs or None)

    queue_info = root.find("queue_info")
    if queue_info is not None:
        for entry in queue_info:
            if entry.tag == "job_list":
                add(_job_from_list_entry(entry), merge=False)
            elif entry.tag == "Queue-List":
                qi_name = _child_text(entry, "name")
                for job_elem in entry.findall("job_list"):
                    add(_job_from_list_entry(job_elem, qi_name), merge=True)
    # Pending jobs: the job_info element inside the root job_info.
    for pending in root.findall("job_info"):
        for job_elem in pending.findall("job_list"):
            add(_job_from_list_entry(job_elem), merge=False)
    return [jobs[job_id] for job_id in order]


def _task_list(groups: Iterable[str]) -> str:
    """Task groups (``1``, ``4-9:1``, ``1,7``) as one comma list, in the order given."""
    return ",".join(part for group in groups for part in group.split(",") if part)


def with_arrays(jobs: List[NativeJob]) -> List[NativeJob]:
    """A listing with each array job as one record of its own, with its tasks.

    ``qstat`` lists an array's running tasks one each (``7.3``) and its waiting ones in
    groups that change as tasks start (``7.4-9:1``): the waiting ones are folded into one record
    ``7`` (the job as submitted) whose ``array_index`` lists the tasks not yet ended and
    whose state is the array's: running while a task runs, else waiting while one waits
    (held only when every waiting one is held).  The running tasks stay records of their
    own, each with ``array_id`` the array's number."""
    members: Dict[str, List[NativeJob]] = {}
    for job in jobs:
        if job.array_id:
            members.setdefault(job.array_id, []).append(job)
    if not members:
        return jobs
    out: List[NativeJob] = []
    emitted = set()
    for job in jobs:
        if not job.array_id:
            out.append(job)
            continue
        if job.array_id in emitted:
            continue
        emitted.add(job.array_id)  # the array's record, in the place of its first member
        tasks = members[job.array_id]
        running = [t for t in tasks if t.hosts]  # (a task that waits has no host yet)
        waiting = [t for t in tasks if not t.hosts]
        unheld = [t.native_state for t in waiting if "h" not in t.native_state]
        state = running[0].native_state if running else (unheld[0] if unheld else tasks[0].native_state)
        hosts: List[str] = []
        for task in running:
            hosts.extend(h for h in task.hosts if h not in hosts)
        first = waiting[0] if waiting else running[0]
        out.append(attrs.evolve(
            first, job_id=job.array_id, native_state=state, hosts=tuple(hosts), num_nodes=len(hosts) or None,
            array_id=job.array_id, array_index=_task_list(t.array_index for t in tasks),
            start_time=min((t.start_time for t in running if t.start_time), default=""),
            reason=next((t.reason for t in waiting if t.reason), ""),
        ))
        out.extend(running)
    return out


# --------------------------------------------------------------------------- queues and hosts

#: What each queue instance state letter means: (description, node state, stops the queue).
QUEUE_INSTANCE_LETTERS: Dict[str, Tuple[str, str, bool]] = {
    "a": ("load threshold exceeded: no new jobs start", "UP", True),
    "A": ("suspend threshold exceeded: jobs are being suspended", "UP", True),
    "u": ("unknown: the execution daemon does not report", "DOWN", True),
    "C": ("suspended by its calendar", "UP", True),
    "s": ("suspended by an administrator", "UP", True),
    "S": ("suspended by a subordinating queue", "UP", True),
    "d": ("disabled by an administrator", "UP", True),
    "D": ("disabled by its calendar", "UP", True),
    "E": ("error: a job could not be started here", "ERROR", True),
    "c": ("configuration ambiguous", "UNKNOWN", True),
    "o": ("orphaned: no longer configured, jobs still there", "UNKNOWN", True),
    "P": ("preempted", "UP", True),
}

# Which node state wins when a host's queue instances disagree.
_NODE_PRECEDENCE = ("DOWN", "ERROR", "UNKNOWN", "UP")


def node_state(letters: str) -> str:
    """A host's state (UP, DOWN, ERROR, UNKNOWN) from the state letters of its queue
    instances (joined in any order).  A letter this table does not know gives UNKNOWN."""
    found = set()
    for letter in letters:
        meaning = QUEUE_INSTANCE_LETTERS.get(letter)
        found.add(meaning[1] if meaning else "UNKNOWN")
    for state in _NODE_PRECEDENCE:
        if state in found:
            return state
    return "UP"


def queue_instance_stopped(letters: str) -> bool:
    """True when a queue instance in this state starts no jobs (unknown letters count as
    stopping: better to send work elsewhere than into a state nobody understands)."""
    return any(QUEUE_INSTANCE_LETTERS.get(letter, ("", "", True))[2] for letter in letters)


@attrs.frozen
class QueueInstance:
    """One queue on one host, as ``qstat -f -xml`` lists it."""

    queue: str
    host: str
    state: str = ""
    slots_total: Optional[int] = None
    slots_used: Optional[int] = None
    slots_reserved: Optional[int] = None
    load: Optional[float] = None
    arch: str = ""
    running_jobs: Tuple[str, ...] = ()

    @property
    def stopped(self) -> bool:
        return queue_instance_stopped(self.state)

    @property
    def free_slots(self) -> Optional[int]:
        if self.slots_total is None:
            return None
        if self.stopped:
            return 0
        return max(0, self.slots_total - (self.slots_used or 0) - (self.slots_reserved or 0))


def parse_queue_instances(data: Text) -> List[QueueInstance]:
    """The queue instances of ``qstat -f -xml``, in its order."""
    root = _xml_root(data, "qstat -f -xml")
    result = []
    queue_info = root.find("queue_info")
    for entry in queue_info.findall("Queue-List") if queue_info is not None else ():
        queue, host = _split_queue(_child_text(entry, "name"))
        if not queue:
            continue
        jobs = []
        for job_elem in entry.findall("job_list"):
            number = _child_text(job_elem, "JB_job_number")
            tasks = _child_text(job_elem, "tasks")
            job_id = f"{number}.{tasks}" if tasks else number
            if number and job_id not in jobs:
                jobs.append(job_id)
        result.append(QueueInstance(
            queue=queue,
            host=host,
            state=_child_text(entry, "state"),
            slots_total=_int(_child_text(entry, "slots_total")),
            slots_used=_int(_child_text(entry, "slots_used")),
            slots_reserved=_int(_child_text(entry, "slots_resv")),
            load=_float(_child_text(entry, "load_avg")),
            arch=_child_text(entry, "arch"),
            running_jobs=tuple(jobs),
        ))
    return result


def _sum(values: Iterable[Optional[int]]) -> Optional[int]:
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def parse_queues(data: Text) -> List[NativeQueue]:
    """Cluster queues from ``qstat -f -xml``: slots summed over their instances.

    ``state`` is NORMAL while at least one instance can start jobs, else STOPPED;
    ``native_state`` lists the distinct instance states (``"d"``, ``"au,d"``; ``""`` when no
    instance shows one).  ``running`` counts the jobs the listing shows in the queue (all
    users' only with ``-u '*'``); ``waiting`` is unknown here: pending jobs belong to no
    queue until they start.
    """
    instances = parse_queue_instances(data)
    by_queue: Dict[str, List[QueueInstance]] = {}
    for qi in instances:
        by_queue.setdefault(qi.queue, []).append(qi)
    queues = []
    for name, members in by_queue.items():
        states: List[str] = []
        for qi in members:
            if qi.state and qi.state not in states:
                states.append(qi.state)
        running = {job for qi in members for job in qi.running_jobs}
        queues.append(NativeQueue(
            name=name,
            native_state=",".join(states),
            state="STOPPED" if all(qi.stopped for qi in members) else "NORMAL",
            total_nodes=len({qi.host for qi in members}),
            total_slots=_sum(qi.slots_total for qi in members),
            free_slots=_sum(qi.free_slots for qi in members),
            running=len(running),
            hosts=tuple(dict.fromkeys(qi.host for qi in members)),
        ))
    return queues


def _canonical_letters(states: Iterable[str]) -> str:
    letters: List[str] = []
    for state in states:
        for letter in state:
            if letter not in letters:
                letters.append(letter)
    return "".join(letters)


def parse_hosts(data: Text) -> List[NativeNode]:
    """Execution hosts of ``qhost -xml`` / ``qhost -q -xml`` as nodes (``global`` skipped).

    ``native_state`` joins the state letters of the host's queue instances (``qhost -q``);
    a host whose load is not reported (``-``) is DOWN: its execution daemon is not running
    or not heard.  ``cpus_used`` counts used slots, ``memory_mb`` is ``mem_total``.
    """
    root = _xml_root(data, "qhost -xml")
    nodes = []
    for host in root.findall("host"):
        name = _unescape(host.get("name"))
        if not name or name == "global":
            continue
        values = {v.get("name"): _unescape(v.text) for v in host.findall("hostvalue")}
        queues: List[str] = []
        states: List[str] = []
        used: List[Optional[int]] = []
        for queue in host.findall("queue"):
            qvalues = {v.get("name"): _unescape(v.text) for v in queue.findall("queuevalue")}
            qname = _unescape(queue.get("name"))
            if qname:
                queues.append(qname)
            states.append(qvalues.get("state_string", ""))
            used.append(_int(qvalues.get("slots_used")))
        letters = _canonical_letters(states)
        load_text = values.get("load_avg", "-")
        reported = load_text not in ("", "-")
        state = node_state(letters)
        reason = ", ".join(QUEUE_INSTANCE_LETTERS[c][0] for c in letters if c in QUEUE_INSTANCE_LETTERS)
        if not reported and state == "UP":
            state = "DOWN"
            reason = reason or "no load report: the execution daemon is not running or not heard"
        arch = values.get("arch_string", "")
        nodes.append(NativeNode(
            name=name,
            native_state=letters,
            state=state,
            cpus=_int(values.get("num_proc")),
            cpus_used=_sum(used) if used else None,
            memory_mb=_memory_mb(values.get("mem_total")),
            load=_float(load_text) if reported else None,
            queues=tuple(queues),
            reason=reason,
            arch="" if arch == "-" else arch,
        ))
    return nodes


# --------------------------------------------------------------------------- job detail

_MESSAGE_PREFIX = re.compile(r"^\d{2}/\d{2}/\d{4} \d{2}:\d{2}:\d{2} \[[^\]]*\]:\s*(?:error:\s*)?")


def _clean_message(text: str) -> str:
    """``11/23/2026 11:53:48 [0:31217]: error: can't open ...`` -> ``can't open ...``"""
    return _MESSAGE_PREFIX.sub("", " ".join(text.split()))


def _path_list(elem: ET.Element, tag: str) -> str:
    for path in elem.iterfind(f"{tag}/*/PN_path"):
        if path.text:
            return _unescape(path.text)
    return ""


# The element wrapping each item of a list varies with how the list was last set (a queue
# list is "destin_ident_list" after qsub, "element" after qalter): match any.
def _detail_job(elem: ET.Element, messages: Dict[str, List[str]]) -> Optional[NativeJob]:
    number = _child_text(elem, "JB_job_number")
    if not number.isdigit():
        return None
    errors: List[str] = []
    start = ""
    for task in elem.iterfind("JB_ja_tasks/*"):
        for message in task.iterfind("JAT_message_list/*/QIM_message"):
            text = _clean_message(_unescape(message.text))
            if text and text not in errors:
                errors.append(text)
        start = start or normalize_time(_child_text(task, "JAT_start_time"))
    time_limit = None
    for request in elem.iterfind("JB_hard_resource_list/*"):
        if _child_text(request, "CE_name") == "h_rt":
            time_limit = parse_duration(_child_text(request, "CE_stringval"))
    queues = [_unescape(q.text) for q in elem.iterfind("JB_hard_queue_list/*/QR_name")]
    slots = _int(elem.findtext("JB_pe_range/*/RN_max"))
    # Why it fails (error messages) beats why it waits (scheduler messages).
    reason = "; ".join(errors) or "; ".join(messages.get(number, []))
    return NativeJob(
        job_id=number,
        name=_child_text(elem, "JB_job_name"),
        user=_child_text(elem, "JB_owner"),
        queue=",".join(q for q in queues if q),
        reason=reason,
        account=_child_text(elem, "JB_account"),
        num_procs=slots if slots is not None else 1,
        submit_time=normalize_time(_child_text(elem, "JB_submission_time")),
        start_time=start,
        time_limit=time_limit,
        work_dir=_child_text(elem, "JB_cwd"),
        stdout_path=_path_list(elem, "JB_stdout_path_list"),
        stderr_path=_path_list(elem, "JB_stderr_path_list"),
        priority=_int(_child_text(elem, "JB_priority")),
    )


def parse_job_detail(data: Text) -> List[NativeJob]:
    """Jobs of ``qstat -j ID[,ID...] -xml`` (none for ``<unknown_jobs>``).

    ``reason`` is the job's error (an ``Eqw`` job: ``can't open output file "..."``) with
    the time stamp and ``error:`` stripped, or else the scheduler's note on why it waits.
    ``native_state`` stays empty: this output has no state letters (take them from qstat).
    """
    root = _xml_root(data, "qstat -j -xml")
    if root.tag == "unknown_jobs":
        return []
    messages: Dict[str, List[str]] = {}
    for message in root.iterfind("messages/*/SME_message_list/*"):
        text = _clean_message(_child_text(message, "MES_message"))
        for job in message.iterfind("MES_job_number_list/*/ULNG_value"):
            messages.setdefault(_unescape(job.text), []).append(text)
    jobs = []
    for elem in root.iterfind("djob_info/*"):
        job = _detail_job(elem, messages)
        if job is not None:
            jobs.append(job)
    return jobs


def unknown_job_ids(data: Text) -> List[str]:
    """The ids ``qstat -j ... -xml`` did not know (its ``<unknown_jobs>`` answer)."""
    root = _xml_root(data, "qstat -j -xml")
    if root.tag != "unknown_jobs":
        return []
    return [_unescape(e.text) for e in root.iter("ST_name") if e.text]


# --------------------------------------------------------------------------- accounting


def parse_qacct_records(data: Text) -> List[Dict[str, str]]:
    """``qacct -j`` output as one dict per record (field name -> value text, trimmed)."""
    text = decode(data)
    records: List[Dict[str, str]] = []
    current: Optional[Dict[str, str]] = None
    for line in text.splitlines():
        if line.startswith("====="):
            current = {}
            records.append(current)
            continue
        if current is None or not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        current[key] = value.strip()
    return [r for r in records if r]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def parse_qacct(data: Text) -> List[NativeJob]:
    """Accounting records of ``qacct -j ID`` as finished jobs, oldest first.

    ``exit_code`` is ``exit_status``; when that is 128+N for a signal N (the way Grid Engine
    reports a job killed by a signal), ``signal`` names it.  ``native_state`` is
    ``failed`` when Grid Engine's ``failed`` field is not 0 (the job did not end on its own:
    deleted, over a limit, could not start), else ``exited``; ``reason`` carries the
    ``failed`` text (``100 : assumedly after job``).  A rescheduled job has several records.
    """
    jobs = []
    for record in parse_qacct_records(data):
        number = record.get("jobnumber", "")
        if not number.isdigit():
            continue
        task = record.get("taskid", "")
        task = task if task.isdigit() else ""
        # "137                  (Killed)": the number, then sometimes a note.
        exit_code = _int((record.get("exit_status") or "").split(" ", 1)[0] or None)
        failed_text = record.get("failed", "0")
        failed_code = _int(failed_text.split(":", 1)[0]) or 0
        signal_name = ""
        if exit_code is not None and 128 < exit_code <= 128 + 64:
            signal_name = _signal_name(exit_code - 128)
        host = record.get("hostname", "")
        pe = record.get("granted_pe", "NONE")
        slots = _int((record.get("slots") or "").split(" ", 1)[0] or None)
        jobs.append(NativeJob(
            job_id=f"{number}.{task}" if task else number,
            name=record.get("jobname", ""),
            user=record.get("owner", ""),
            queue=record.get("qname", "") if record.get("qname") not in (None, "UNKNOWN") else "",
            native_state="failed" if failed_code else "exited",
            reason=" ".join(failed_text.split()) if failed_code else "",
            account=record.get("account", ""),
            hosts=(host,) if host and host != "UNKNOWN" else (),
            num_nodes=1 if host and host != "UNKNOWN" else None,
            num_procs=slots if slots else (1 if pe == "NONE" else None),
            submit_time=normalize_time(record.get("qsub_time")),
            start_time=normalize_time(record.get("start_time")),
            end_time=normalize_time(record.get("end_time")),
            time_used=parse_duration(record.get("ru_wallclock")),
            exit_code=exit_code,
            signal=signal_name,
            array_id=number if task else "",
            array_index=task,
        ))
    return jobs


# --------------------------------------------------------------------------- submission, config

_TERSE = re.compile(r"(\d+)(?:\.(\d+-\d+:\d+))?")


def parse_qsub_terse(data: Text) -> Tuple[str, str]:
    """``qsub -terse`` output -> (job id, array task range or "").

    ``"42"`` -> ``("42", "")``; ``"43.1-5:2"`` -> ``("43", "1-5:2")``.  Anything else
    (an error message, two ids) raises SgeParseError quoting it.
    """
    text = decode(data).strip()
    m = _TERSE.fullmatch(text)
    if not m:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise SgeParseError(f"qsub -terse printed {shown!r}, not a job id")
    return m.group(1), m.group(2) or ""


def parse_queue_config(data: Text) -> Dict[str, str]:
    """``qconf -sq QUEUE`` as attribute -> value (continuation lines joined)."""
    text = decode(data).replace("\\\n", " ")
    config: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if parts and not parts[0].startswith("#"):
            config[parts[0]] = " ".join(parts[1].split()) if len(parts) > 1 else ""
    return config


def queue_max_time(config: Dict[str, str]) -> Optional[int]:
    """The wall-time limit of a queue configuration in seconds (None: INFINITY).  A
    host-specific list (``0:10:0,[vm=1:0:0]``) gives its default (first) value."""
    value = config.get("h_rt", "")
    return parse_duration(value.split(",", 1)[0])
