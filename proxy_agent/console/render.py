"""How the console shows things: one-line events, tables, trace lines and JSON records.

Everything here is a pure function of its arguments (and of the client's
mirrored model, which is read, never changed).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from ..client.state import OUTPUT_KEYS, STATE_KEYS, ClientState, Element, OutputLine, Traffic, canonical_id
from ..protocol.attributes import STANDARD_ATTRIBUTES, AttrType
from ..protocol.messages import (
    AttrDef,
    Command,
    ElementChange,
    ElementGroup,
    Event,
    EventId,
    Message,
    NewElements,
    ProcessChange,
    RemoveAll,
    RemoveElements,
    RemoveProcesses,
)
from ..protocol.rangeset import RangeSet
from ..protocol.wire import FrameError

#: A group naming more elements than this is shown as one summary line.
GROUP_SUMMARY_THRESHOLD = 4
#: An event about more elements than this is shown as one summary line.
EVENT_SUMMARY_THRESHOLD = 10
#: Raw frames longer than this are cut in trace output.
TRACE_RAW_LIMIT = 1200

_PLURAL = {"machine": "machines", "node": "nodes", "queue": "queues", "job": "jobs", "process": "processes"}
_QUIET_KEYS = {"name", "id", "jobSubId", "jobStatus", "processStatus", "processIndex"}


# --------------------------------------------------------------------------- text from the agent

#: Characters shown escaped: controls (C0, DEL, C1), format characters (bidi overrides,
#: zero-width), line and paragraph separators, surrogates from undecodable bytes.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str, keep_tab: bool = False) -> str:
    """``text`` with every control or format character shown as an escape (``\\x1b``, ``\\n``).

    Whatever the agent sends (a job name, a message, another user's job output) can then
    neither move the cursor, recolour the terminal, nor forge a line of a table.
    """
    if text.isprintable():
        return text
    return "".join(
        _escape_char(c) if unicodedata.category(c) in _HIDDEN_CATEGORIES and not (keep_tab and c == "\t") else c
        for c in text
    )


def json_text(record: Dict[str, Any]) -> str:
    """One JSON line; characters a terminal could act on are written as ``\\uXXXX`` escapes."""
    text = json.dumps(record, ensure_ascii=False, default=str)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if unicodedata.category(char) in _HIDDEN_CATEGORIES:
            code = ord(char)
            if code >= 0x10000:  # JSON escapes astral characters as a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def value_text(value: Union[str, List[str], None]) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(_quote(v) for v in value)
    return visible(value)


def _quote(text: str) -> str:
    if text and all(c.isprintable() and not c.isspace() and c not in "'\"\\" for c in text):
        return text
    return visible(repr(text))


def job_label(state: Optional[ClientState], job_id: Optional[str]) -> str:
    """A job as every tool names it: its id (the element id less the session's base id);
    the element id itself only when that does not make an id."""
    if job_id is None:
        return "?"
    key = state.job_key(job_id) if state is not None else None
    return str(key) if key is not None else visible(job_id)


def _ids_label(state: ClientState, ids: Union[RangeSet, str], kind: Optional[str]) -> str:
    """A range of element ids as shown: jobs by their ids (element id less the base id)."""
    if kind != "job" or isinstance(ids, str) or not ids or state.job_key(str(ids.first)) is None:
        return str(ids)
    base = int(state.base_id or 0)
    return str(RangeSet((first - base, last - base) for first, last in ids.intervals))


def element_label(state: Optional[ClientState], element: Element) -> str:
    """An element's id as shown: a job's id, a process's ``JOB.RANK``, else the element id."""
    if element.kind == "job":
        return job_label(state, element.id)
    if element.kind == "process":
        return process_label(state, element)
    return visible(element.id)


def process_label(state: Optional[ClientState], process: Element) -> str:
    """``42.0``: the job's id and the process's rank within it."""
    return f"{job_label(state, process.parent)}.{visible(process.id)}"


def output_line(state: ClientState, line: OutputLine) -> str:
    process = state.elements.get(line.process)
    if process is not None:
        label = process_label(state, process)
    else:
        label = str(line.process)
    return labelled_line(label, line.stream, line.text)


def labelled_line(label: str, stream: str, text: str) -> str:
    """``[42.0] text`` (stdout) or ``[42.0 err] text``: a line of output and the process it came from."""
    marker = " err" if stream == "stderr" else ""
    return f"[{label}{marker}] {visible(text, keep_tab=True)}"


#: Queue names a model summary shows before it says how many more there are.
SUMMARY_NAMES = 8


def _counted(elements: Sequence[Element]) -> str:
    counts: Dict[str, int] = {}
    for element in elements:
        counts[element.state or "no state"] = counts.get(element.state or "no state", 0) + 1
    return ", ".join(f"{n} {visible(value)}" for value, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def model_summary(state: ClientState) -> List[str]:
    """The model in a few lines, however big: how many machines, nodes, queues, jobs and
    processes, and how many are in each state (what a console shows when it connects)."""
    lines = []
    for kind in ("machine", "node", "queue", "job"):
        elements = list(state.by_kind[kind].values())
        text = f"{_PLURAL[kind]}: {len(elements)}"
        if elements:
            text += f" ({_counted(elements)})"
        if kind == "queue" and elements:
            names = [visible(q.name or q.id) for q in sorted_elements(elements)]
            more = f" and {len(names) - SUMMARY_NAMES} more" if len(names) > SUMMARY_NAMES else ""
            text += ": " + ", ".join(names[:SUMMARY_NAMES]) + more
        if kind == "job":
            text += f"; {len(state.by_kind['process'])} processes"
        lines.append(text)
    return lines


def model_record(state: ClientState) -> Dict[str, Any]:
    """The model summary for JSON: per kind, how many and how many in each state."""
    record: Dict[str, Any] = {"type": "model"}
    for kind in ("machine", "node", "queue", "job", "process"):
        counts: Dict[str, int] = {}
        for element in state.by_kind[kind].values():
            counts[element.state or ""] = counts.get(element.state or "", 0) + 1
        record[_PLURAL[kind]] = {"count": sum(counts.values()), "states": counts}
    return record


def element_summary(element: Element, values: Optional[Dict[str, List[str]]] = None,
                    state: Optional[ClientState] = None, *, carried_only: bool = False) -> str:
    """``job 42 hello RUNNING``, ``node 1003 n17 DOWN`` (a job by its id: see :func:`job_label`).

    With ``values`` (the attributes one event carried) the state and status are those the
    event set, not the element's current ones: an event shown late still says what it said;
    with ``carried_only``, an event that carried none shows none.
    """
    parts = [element.kind, element_label(state, element)]
    name = _carried(values, "name") or element.name
    if name:
        parts.append(_quote(name) if " " in name else visible(name))
    shown = _carried(values, STATE_KEYS.get(element.kind, "")) or (None if carried_only else element.state)
    if shown:
        parts.append(visible(shown))
    status = _carried(values, f"{element.kind}Status")
    if status is None and not carried_only:
        current = element.get(f"{element.kind}Status")
        status = current if isinstance(current, str) else None
    if status and status != shown:
        parts.append(visible(status))
    return " ".join(parts)


def _carried(values: Optional[Dict[str, List[str]]], key: str) -> Optional[str]:
    if not values or key not in values:
        return None
    return " ".join(values[key])


def _group_ids(group: ElementGroup) -> List[str]:
    if isinstance(group.ids, str):
        return [canonical_id(group.ids)]
    if len(group.ids) > GROUP_SUMMARY_THRESHOLD:
        return []
    return [str(i) for i in group.ids]


def _group_attrs(group: ElementGroup, skip: Iterable[str] = ()) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    skipped = set(skip)
    for key, value in group.attributes:
        if key not in skipped:
            out.setdefault(key, []).append(value)
    return out


def _attrs_text(attrs: Dict[str, List[str]], skip: Iterable[str] = ()) -> str:
    skipped = set(skip)
    return " ".join(
        f"{visible(k)}={_quote(' '.join(v)) if len(v) == 1 else value_text(v)}" for k, v in attrs.items() if k not in skipped
    )


# --------------------------------------------------------------------------- events


def event_lines(state: ClientState, event: Event) -> List[str]:
    """Readable lines for one event (after the client's model took it in).

    Output lines are not included: the console prints those from the job's
    accumulated output, so that nothing is shown twice.
    """
    if isinstance(event, (NewElements, ElementChange)) and not isinstance(event, ProcessChange):
        summary = _summary(state, event)
        if summary is not None:
            return [summary]
    if isinstance(event, NewElements):
        kind = event.kind.value
        lines = []
        for group in event.groups:
            ids = _group_ids(group)
            if not ids:
                attrs = _group_attrs(group)
                state_value = next((v[0] for k, v in attrs.items() if k.endswith("State")), "")
                lines.append(f"{_PLURAL[kind]} {group.ids} ({len(group.ids)}) {state_value} new".replace("  ", " "))
                continue
            for eid in ids:
                # processes are numbered by rank within their job (the event's parent)
                element = state.process(event.parent_id, eid) if kind == "process" else state.elements.get(eid)
                if element is None:
                    continue
                carried = _group_attrs(group)
                if element.kind == "process":
                    shown = _carried(carried, "processState") or element.state or ""
                    lines.append(f"process {process_label(state, element)} {visible(shown)} new".replace("  ", " "))
                else:
                    sub = _carried(carried, "jobSubId") or element.sub_id
                    extra = f" ({visible(sub)})" if sub else ""
                    lines.append(f"{element_summary(element, carried, state)} new{extra}")
        return lines
    if isinstance(event, ProcessChange):
        lines = []
        for group in event.groups:
            attrs = _group_attrs(group, OUTPUT_KEYS)
            if not attrs:
                continue
            ids = _group_ids(group)
            if not ids:
                lines.append(f"processes {group.ids} of job {job_label(state, event.job_id)}: {_attrs_text(attrs)}")
                continue
            for pid in ids:
                process = state.process(event.job_id, pid)
                if process is None:
                    continue
                label = process_label(state, process)
                if "processExitCode" in attrs:
                    lines.append(f"process {label} exited with status {visible(attrs['processExitCode'][0])}")
                elif "processSignalName" in attrs:
                    lines.append(f"process {label} killed by {visible(attrs['processSignalName'][0])}")
                else:
                    rest = _attrs_text(attrs, ("processState",) + tuple(_QUIET_KEYS))
                    # only the state the event carried: the mirror may already be further on
                    shown = _carried(attrs, "processState") or ""
                    text = f"process {label} {visible(shown)}".rstrip()
                    lines.append(f"{text} {rest}".rstrip())
        return lines
    if isinstance(event, ElementChange):
        kind = "rm" if event.kind is None else event.kind.value
        lines = []
        for group in event.groups:
            attrs = _group_attrs(group)
            if kind == "rm":
                lines.append(f"resource manager {_attrs_text(attrs)}")
                continue
            ids = _group_ids(group)
            if not ids:
                shown = _ids_label(state, group.ids, kind)
                lines.append(f"{_PLURAL.get(kind, kind)} {shown} ({len(group.ids)}) {_attrs_text(attrs)}")
                continue
            for eid in ids:
                element = state.elements.get(eid)
                if element is None:
                    continue
                state_key = f"{kind}State"
                rest = _attrs_text(attrs, (state_key,) + tuple(_QUIET_KEYS))
                lines.append(f"{element_summary(element, attrs, state, carried_only=True)} {rest}".rstrip())
        return lines
    if isinstance(event, RemoveProcesses):
        return [f"processes {event.ids} of job {job_label(state, event.job_id)} removed"]
    if isinstance(event, RemoveElements):
        kind = event.kind.value
        shown = _ids_label(state, event.ids, kind)
        if isinstance(event.ids, str) or len(event.ids) == 1:
            return [f"{kind} {shown} removed"]
        return [f"{_PLURAL[kind]} {shown} ({len(event.ids)}) removed"]
    if isinstance(event, RemoveAll):
        return ["all elements removed (REMOVE_ALL)"]
    if isinstance(event, Message):
        return [f"agent {visible(str(event.level))}: {visible(event.text)} (code {event.code})"]
    return []


def _summary(state: ClientState, event: Union[NewElements, ElementChange]) -> Optional[str]:
    """One line for an event about many elements: how many, and how many in each state."""
    total = sum(1 if isinstance(g.ids, str) else len(g.ids) for g in event.groups)
    if total <= EVENT_SUMMARY_THRESHOLD:
        return None
    kind = "rm" if event.kind is None else event.kind.value
    state_key = f"{kind}State"
    counts: Dict[str, int] = {}
    keys: Dict[str, None] = {}
    for group in event.groups:
        size = 1 if isinstance(group.ids, str) else len(group.ids)
        value = next((v for k, v in group.attributes if k == state_key), None)
        if value is not None:
            counts[value] = counts.get(value, 0) + size
        for key, _ in group.attributes:
            if key != state_key:
                keys[key] = None
    what = "new" if isinstance(event, NewElements) else "changed"
    parts = [f"{total} {_PLURAL.get(kind, kind)} {what}"]
    if isinstance(event, NewElements):
        parts[0] += f" under {event.parent_id}"
    if counts:
        parts.append(", ".join(f"{n} {visible(value)}" for value, n in sorted(counts.items(), key=lambda item: -item[1])))
    if keys and not isinstance(event, NewElements):
        parts.append("attributes " + " ".join(visible(k) for k in keys))
    return ": ".join(parts)


# --------------------------------------------------------------------------- trace


def _printable_raw(raw: bytes) -> str:
    text = raw[:TRACE_RAW_LIMIT].decode("utf-8", "backslashreplace")
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    if len(raw) > TRACE_RAW_LIMIT:
        text += f"... ({len(raw) - TRACE_RAW_LIMIT} more bytes)"
    return text


def decoded_text(traffic: Traffic) -> str:
    """``INIT tid=1 version=2.0 baseId=1000``: the frame's name, TID and arguments."""
    frame = traffic.frame
    if isinstance(frame, FrameError):
        return f"malformed frame: {frame.message}"
    message = traffic.message
    if frame is None:
        return "(nothing decodable)"
    if isinstance(message, Command):
        name = message.name
    elif isinstance(message, Event):
        name = message.event_id.name
    else:
        try:
            name = EventId(frame.msg_id).name + " (malformed)"
        except ValueError:
            name = f"unknown event {frame.msg_id}"
    args = " ".join(_quote(a) for a in frame.args)
    return f"{name} tid={frame.tid}" + (f" {args}" if args else "")


def trace_lines(traffic: Traffic) -> List[str]:
    arrow = "->" if traffic.direction == "out" else "<-"
    lines = [f"{arrow} {_printable_raw(traffic.raw)}", f"   {decoded_text(traffic)}"]
    for violation in traffic.violations:
        lines.append(f"   !! {violation}")
    return lines


def trace_record(traffic: Traffic) -> Dict[str, Any]:
    record: Dict[str, Any] = {
        "type": "trace",
        "direction": traffic.direction,
        "raw": traffic.raw.decode("utf-8", "backslashreplace"),
        "decoded": decoded_text(traffic),
    }
    if traffic.violations:
        record["violations"] = [str(v) for v in traffic.violations]
    return record


# --------------------------------------------------------------------------- JSON


_STANDARD_TYPES = {d.id: d.type for d in STANDARD_ATTRIBUTES}
_INTEGER = re.compile(r"-?[0-9]+\Z")


def element_id_value(text: Optional[str]) -> Union[int, str, None]:
    """An element id for JSON: a number when it is one (``"1042"`` -> 1042)."""
    if text is None:
        return None
    return int(text) if text.isascii() and text.isdigit() else text


def typed_value(key: str, value: str, state: Optional[ClientState] = None) -> Any:
    """An attribute value for JSON: INTEGER, DOUBLE and BOOLEAN attributes (by the agent's
    definitions, else the standard ones) become numbers and booleans; a value that does not
    parse stays the string it was."""
    definition = state.attr_defs.get(key) if state is not None else None
    kind = getattr(definition, "type", None) or _STANDARD_TYPES.get(key)
    if kind is AttrType.INTEGER and value.isascii() and _INTEGER.match(value):
        return int(value)
    if kind is AttrType.DOUBLE:
        try:
            number = float(value)
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    if kind is AttrType.BOOLEAN and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def attributes_record(attributes: Dict[str, Union[str, List[str]]], state: Optional[ClientState] = None) -> Dict[str, Any]:
    return {
        key: [typed_value(key, v, state) for v in value] if isinstance(value, list) else typed_value(key, value, state)
        for key, value in attributes.items()
    }


def group_record(group: ElementGroup, state: Optional[ClientState] = None) -> Dict[str, Any]:
    """``{"ids": "1003-1052", "attributes": {...}}``; ARRAY attributes as lists, typed values."""
    attrs: Dict[str, Any] = {}
    for key, values in _group_attrs(group).items():
        array = len(values) > 1 or (state is not None and state.is_array(key))
        typed = [typed_value(key, v, state) for v in values]
        attrs[key] = typed if array else typed[0]
    return {"ids": str(group.ids), "attributes": attrs}


def event_record(event: Event, state: Optional[ClientState] = None) -> Dict[str, Any]:
    record: Dict[str, Any] = {"type": "event", "event": event.event_id.name, "tid": event.tid}
    if isinstance(event, NewElements):
        record["parent"] = element_id_value(event.parent_id)
        record["groups"] = [group_record(g, state) for g in event.groups]
    elif isinstance(event, ProcessChange):
        record["job"] = element_id_value(event.job_id)
        record["groups"] = [group_record(g, state) for g in event.groups]
    elif isinstance(event, ElementChange):
        record["groups"] = [group_record(g, state) for g in event.groups]
    elif isinstance(event, AttrDef):
        record["definitions"] = [d.id for d in event.definitions]
    elif isinstance(event, RemoveProcesses):
        record["job"] = element_id_value(event.job_id)
        record["ids"] = str(event.ids)
    elif isinstance(event, RemoveElements):
        record["ids"] = str(event.ids)
    elif isinstance(event, Message):
        record.update(level=str(event.level), code=event.code, text=event.text)
    return record


def job_id_value(state: Optional[ClientState], job_id: Optional[str]) -> Union[int, str, None]:
    """A job's id for JSON: the number every tool names it by (see :func:`job_label`)."""
    if job_id is None:
        return None
    key = state.job_key(job_id) if state is not None else None
    return key if key is not None else element_id_value(job_id)


def element_record(element: Element, state: Optional[ClientState] = None) -> Dict[str, Any]:
    """An element for JSON: a job by its id (:func:`job_id_value`), a process's ``parent``
    its job's id; other elements by their element ids."""
    record: Dict[str, Any] = {
        "id": job_id_value(state, element.id) if element.kind == "job" else element_id_value(element.id),
        "kind": element.kind,
        "parent": job_id_value(state, element.parent) if element.kind == "process" else element_id_value(element.parent),
        "attributes": attributes_record(element.attributes, state),
    }
    if element.kind in ("job", "process"):
        record["states"] = list(element.states)
    return record


# --------------------------------------------------------------------------- tables


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[str]:
    """Columns padded to their widest cell; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [["" if c is None else visible(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return lines


def _numeric_key(element: Element):
    return (0, int(element.id), "") if element.id.isdigit() else (1, 0, element.id)


def sorted_elements(elements: Iterable[Element]) -> List[Element]:
    return sorted(elements, key=_numeric_key)
