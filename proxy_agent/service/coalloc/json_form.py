"""The JSON form of a multi-part job description (see :mod:`.description`)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .parts import DescriptionError, description_text, MAX_PARTS, MultiJobDescription, Part, kind_of


# --------------------------------------------------------------------------- JSON

_PART_KEYS = {
    "queue": "queue",
    "count": "count",
    "executable": "executable",
    "arguments": "arguments",
    "environment": "environment",
    "label": "label",
    "start_type": "start_type",
    "comms_type": "comms_type",
    "directory": "directory",
    "stdout": "stdout",
    "stderr": "stderr",
    "project": "project",
    "max_wall_time": "max_wall_time",
    "max_memory": "max_memory",
}
_JOB_KEYS = ("name", "barrier_release", "forward_rendezvous", "parts")


def _no_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DescriptionError(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def _load_json(text: Union[str, bytes]) -> Any:
    text = description_text(text)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as error:
        raise DescriptionError(f"is not valid JSON: {error.msg}", line=error.lineno, column=error.colno) from None
    except RecursionError:
        raise DescriptionError("nests too deeply") from None


def _part_from_json(index: Optional[int], value: Any) -> Part:
    if not isinstance(value, Mapping):
        raise DescriptionError(f"must be an object, not {kind_of(value)}", part_index=index)
    label = value.get("label") if isinstance(value.get("label"), str) else None
    for key in value:
        if key not in _PART_KEYS:
            known = ", ".join(_PART_KEYS)
            raise DescriptionError(
                f"unknown key; a part has {known}", field=str(key), part_index=index, part_label=label
            )
    if "executable" not in value:
        raise DescriptionError("is missing", field="executable", part_index=index, part_label=label)
    try:
        return Part(**{_PART_KEYS[key]: setting for key, setting in value.items()})
    except DescriptionError as error:
        raise error.located(part_index=index, part_label=label) from None


def parse_part_json(text: Union[str, bytes]) -> Part:
    """One part written as a JSON object (what adding a part to a running job takes)."""
    return _part_from_json(None, _load_json(text))


def parse_json(text: Union[str, bytes]) -> MultiJobDescription:
    """A multi-part job from its JSON form: an object with ``parts``, or a bare list of parts."""
    document = _load_json(text)
    return description_from_json_value(document)


def description_from_json_value(document: Any) -> MultiJobDescription:
    """A multi-part job from already-decoded JSON (say, an attribute of a larger message)."""
    if isinstance(document, list):
        document = {"parts": document}
    if not isinstance(document, Mapping):
        raise DescriptionError(f"must be an object with 'parts' or a list of parts, not {kind_of(document)}")
    for key in document:
        if key not in _JOB_KEYS:
            raise DescriptionError(f"unknown key; a job has {', '.join(_JOB_KEYS)}", field=str(key))
    if "parts" not in document:
        raise DescriptionError("is missing", field="parts")
    raw_parts = document["parts"]
    if not isinstance(raw_parts, list):
        raise DescriptionError(f"must be a list of parts, not {kind_of(raw_parts)}", field="parts")
    if len(raw_parts) > MAX_PARTS:
        raise DescriptionError(f"has {len(raw_parts)} parts; at most {MAX_PARTS} are allowed", field="parts")
    parts = [_part_from_json(index, item) for index, item in enumerate(raw_parts)]
    options = {key: document[key] for key in ("name", "barrier_release", "forward_rendezvous") if key in document}
    return MultiJobDescription(parts=parts, **options)


def _part_json(part: Part) -> Dict[str, Any]:
    item: Dict[str, Any] = {}
    if part.queue is not None:
        item["queue"] = part.queue
    item["count"] = part.count
    item["executable"] = part.executable
    if part.arguments:
        item["arguments"] = list(part.arguments)
    if part.environment:
        item["environment"] = dict(part.environment)
    if part.label is not None:
        item["label"] = part.label
    item["start_type"] = part.start_type.value
    item["comms_type"] = part.comms_type.value
    for key in ("directory", "stdout", "stderr", "project", "max_wall_time", "max_memory"):
        value = getattr(part, key)
        if value is not None:
            item[key] = value
    return item


def render_json(description: MultiJobDescription, *, indent: Optional[int] = 2) -> str:
    """The JSON form of ``description``; :func:`parse_json` reads it back equal."""
    document: Dict[str, Any] = {}
    if description.name is not None:
        document["name"] = description.name
    document["barrier_release"] = description.barrier_release.value
    if description.forward_rendezvous:
        document["forward_rendezvous"] = True
    document["parts"] = [_part_json(part) for part in description.parts]
    return json.dumps(document, indent=indent, ensure_ascii=False)


