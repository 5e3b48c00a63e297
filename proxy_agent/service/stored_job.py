"""What the job store keeps of a job: its row (:class:`StoredJob`) and its :class:`JobSpec`
as JSON."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

import attrs

from .jobs import JobSpec

__all__ = ["COLUMNS", "StoredJob", "offsets_of", "spec_from_json", "spec_to_json"]


#: JobSpec's fields, in order.  Their values are strings, numbers, booleans, None and tuples
#: of those (or of pairs): JSON writes them as attrs.asdict would give them, without its
#: walk over every value (a submission is written for every job).
_SPEC_FIELDS = tuple(field.name for field in attrs.fields(JobSpec))


#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode


def spec_to_json(spec: JobSpec) -> str:
    return _compact({name: getattr(spec, name) for name in _SPEC_FIELDS})


def spec_from_json(text: str) -> Optional[JobSpec]:
    """The JobSpec stored as ``text`` (None if it cannot be read back)."""
    try:
        data = json.loads(text)
        fields = {f.name for f in attrs.fields(JobSpec)}
        return JobSpec(**{k: v for k, v in data.items() if k in fields})
    except (ValueError, TypeError, AttributeError):
        return None



def offsets_of(text: str) -> Dict[str, int]:
    """Output offsets written as JSON (``"RANK.STREAM"`` -> bytes); nothing for text that is not."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, int)}


@attrs.frozen
class StoredJob:
    key: int
    backend: str
    queue: str
    native_id: str
    name: str
    client_ref: str
    spec: str
    state: str
    native_state: str
    message: str
    submitted: float
    ended: Optional[float]
    delivered: str
    extra: str
    #: the exit status (decimal text) or the signal name of an ended job ('' if not known)
    exit_code: str = ""
    signal: str = ""

    @property
    def job_spec(self) -> Optional[JobSpec]:
        return spec_from_json(self.spec)

    @property
    def delivered_offsets(self) -> Dict[str, int]:
        """How much output reached a client: ``"RANK.STREAM"`` -> bytes of its file."""
        try:
            value = json.loads(self.delivered)
        except ValueError:
            return {}
        if not isinstance(value, dict):
            return {}
        return {k: int(v) for k, v in value.items() if isinstance(v, int)}

    @property
    def extras(self) -> Dict[str, Any]:
        try:
            value = json.loads(self.extra)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


#: The store's columns, in the order of :class:`StoredJob`'s fields.
COLUMNS = [f.name for f in attrs.fields(StoredJob)]
