"""The service's own terms as the interface carries them: a :class:`JobSpec` as a JSON object
of its fields, a :class:`JobState` as its name, an error as its neutral kind and message."""

from __future__ import annotations

from typing import Any, Dict

import attrs

from ...service.jobs import ErrorKind, JobSpec, ServiceError

__all__ = ["error_of", "service_error", "spec_from_dict", "spec_to_dict"]

_FIELDS = {field.name: field for field in attrs.fields(JobSpec)}
#: fields whose value is a list of texts, and those of (name, value) pairs
_TEXTS = frozenset({"arguments", "candidates", "prologue", "native_options"})
_PAIRS = frozenset({"environment", "extra"})
_FLAGS = frozenset({"hold", "exclusive"})
_NUMBERS = frozenset({"num_procs", "wall_time", "memory", "nodes", "cpus_per_task", "gpus"})


def spec_to_dict(spec: JobSpec) -> Dict[str, Any]:
    """The fields that differ from their defaults (pairs as two-element lists)."""
    out: Dict[str, Any] = {}
    for name, field in _FIELDS.items():
        value = getattr(spec, name)
        if value == field.default:
            continue
        if name in _PAIRS:
            value = [[k, v] for k, v in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


def spec_from_dict(data: Any) -> JobSpec:
    """The JobSpec a client sent; ServiceError (BAD_REQUEST) naming what is wrong."""
    if not isinstance(data, dict):
        raise ServiceError("a job description must be a JSON object", ErrorKind.BAD_REQUEST)
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ServiceError(f"unknown job description fields: {', '.join(unknown)}", ErrorKind.BAD_REQUEST)
    if not isinstance(data.get("executable"), str) or not data["executable"]:
        raise ServiceError("a job description needs an executable (a non-empty text)", ErrorKind.BAD_REQUEST)
    for name, value in data.items():
        if value is None:
            continue
        if name in _TEXTS:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif name in _PAIRS:
            ok = isinstance(value, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in value)
        elif name in _FLAGS:
            ok = isinstance(value, bool)
        elif name in _NUMBERS:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ServiceError(f"job description field {name!r} has a value of the wrong form", ErrorKind.BAD_REQUEST)
    try:
        return JobSpec(**{name: value for name, value in data.items() if value is not None})
    except (TypeError, ValueError) as exc:
        raise ServiceError(f"bad job description: {exc}", ErrorKind.BAD_REQUEST) from None


def error_of(exc: ServiceError) -> Dict[str, str]:
    return {"kind": exc.kind.value, "message": exc.message}


def service_error(kind: str, message: str) -> ServiceError:
    """The ServiceError an error reply stands for (an unknown kind: OPERATION_FAILED)."""
    try:
        error_kind = ErrorKind(kind)
    except ValueError:
        error_kind = ErrorKind.OPERATION_FAILED
    return ServiceError(message, error_kind)
