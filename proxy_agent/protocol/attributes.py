"""Attributes: definitions (ATTR_DEF) and ``key=value`` values.

An attribute value on the wire is one argument ``key=value`` where the key
is an attribute definition id; the split is at the first '=' so values may
contain '=' themselves (``env=PATH=/bin``).  ARRAY attributes repeat their
key once per element (``progArgs=-v``, ``progArgs=out.txt``).

An attribute definition describes one attribute id to the IDE.  In an
ATTR_DEF event it is written as::

    NUM_ARGS ID TYPE NAME DESCRIPTION DISPLAY DEFAULT [EXTRAS...]

with NUM_ARGS the decimal count of the strings after it and the extras
depending on TYPE: INTEGER, BIGINTEGER and DOUBLE ``[MIN MAX]``, ENUMERATED
the legal values, DATE ``DATE_STYLE TIME_STYLE LOCALE [MIN MAX]``.  Which
types a client may be sent is a rule of the dialect
(:mod:`proxy_agent.protocol.dialect`).

Compatibility notes about the IDE's reader (worth knowing when defining
attributes): it parses the DEFAULT of INTEGER and DOUBLE definitions as
numbers and drops definitions whose default is empty or malformed; its
INTEGER is a signed 32-bit int; it parses DATE defaults and bounds with a
locale date format (not ISO 8601); and it drops ENUMERATED values outside the
declared list.  :data:`STANDARD_ATTRIBUTES` follows all of these.

This module is pure: no I/O, no clock, no concurrency.
"""

from __future__ import annotations

import enum
import math
import re
from collections import Counter
from datetime import datetime, timezone
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import attrs

__all__ = [
    "A",
    "AttrType",
    "AttributeDefinition",
    "AttributeRegistry",
    "AttributeSet",
    "AttributeValueError",
    "DATE_STYLES",
    "INT32_MAX",
    "INT32_MIN",
    "JOB_STATES",
    "MACHINE_STATES",
    "NODE_STATES",
    "PROCESS_STATES",
    "QUEUE_STATES",
    "STANDARD_ATTRIBUTES",
    "decode_attr_defs",
    "encode_attr_defs",
    "format_attribute",
    "split_attribute",
    "standard_registry",
]

#: Range of the IDE's INTEGER attributes (a signed 32-bit int).
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

#: Legal DATE_STYLE / TIME_STYLE words of a DATE definition.
DATE_STYLES = ("SHORT", "MEDIUM", "LONG", "FULL")

# Fixed leading fields of a definition after NUM_ARGS:
# ID TYPE NAME DESCRIPTION DISPLAY DEFAULT
_FIXED_FIELDS = 6

_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_EPOCH_RE = re.compile(r"-?[0-9]+")
# Longest integer text worth converting: anything longer is out of range anyway.
_MAX_INTEGER_CHARS = 20
# BIGINTEGER has no bound of its own; this only keeps int() from slow conversions.
_MAX_BIGINTEGER_CHARS = 100
_MAX_DOUBLE_CHARS = 400


def _as_tuple(values):  # unannotated: the field's own type stays the one __init__ shows
    """Field converter: a tuple of the values.  (A function of ours rather than ``tuple``:
    attrs reads a converter's signature, and the first built-in's costs start-up milliseconds.)"""
    return tuple(values)


def _show(value: object, limit: int = 60) -> str:
    """``repr`` of a value for messages, shortened when long."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} chars)"
    return repr(value)


class AttributeValueError(ValueError):
    """An attribute value (or ``key=value`` argument) is not acceptable.

    ``attr_id`` is the attribute id (None when the argument could not even be
    split into key and value), ``value`` the offending text and ``reason``
    a short explanation; the message combines all three.
    """

    def __init__(self, attr_id: Optional[str], value: object, reason: str) -> None:
        self.attr_id = attr_id
        self.value = value
        self.reason = reason
        if attr_id is None:
            message = f"attribute argument {_show(value)} {reason}"
        else:
            message = f"attribute {attr_id!r}: value {_show(value)} {reason}"
        super().__init__(message)

    def __reduce__(self):  # keep the three-argument constructor picklable
        return (type(self), (self.attr_id, self.value, self.reason))


class AttrType(enum.Enum):
    """Attribute types of the protocol; each value is its wire spelling."""

    ARRAY = "ARRAY"
    BIGINTEGER = "BIGINTEGER"
    BOOLEAN = "BOOLEAN"
    DATE = "DATE"
    DOUBLE = "DOUBLE"
    ENUMERATED = "ENUMERATED"
    INTEGER = "INTEGER"
    STRING = "STRING"


_NUMBER_TYPES = frozenset({AttrType.INTEGER, AttrType.BIGINTEGER, AttrType.DOUBLE})
_BOUNDED_TYPES = _NUMBER_TYPES | {AttrType.DATE}


def _to_attr_type(value: Union[AttrType, str]) -> AttrType:
    if isinstance(value, AttrType):
        return value
    try:
        return AttrType(value)
    except ValueError:
        legal = ", ".join(t.value for t in AttrType)
        raise ValueError(f"unknown attribute type {_show(value)} (expected one of {legal})") from None


def _check_key(key: str, whole: object = None) -> None:
    """Attribute ids are non-empty strings without '=' (the key/value separator)."""
    if not isinstance(key, str):
        raise TypeError(f"attribute id must be str, not {type(key).__name__}")
    if not key:
        raise AttributeValueError(None, key if whole is None else whole, "has an empty key")
    if "=" in key:
        raise AttributeValueError(None, key if whole is None else whole, "has '=' in its key")


# --------------------------------------------------------------------------- values


def _parse_integer(attr_id: str, value: str) -> int:
    if len(value) > _MAX_INTEGER_CHARS or not _INTEGER_RE.fullmatch(value):
        if _INTEGER_RE.fullmatch(value):
            raise AttributeValueError(attr_id, value, "is out of the 32-bit integer range")
        raise AttributeValueError(
            attr_id, value, "is not an integer (optional sign, then ASCII digits)"
        )
    number = int(value)
    if not INT32_MIN <= number <= INT32_MAX:
        raise AttributeValueError(attr_id, value, "is out of the 32-bit integer range")
    return number


def _parse_big_integer(attr_id: str, value: str) -> int:
    if len(value) > _MAX_BIGINTEGER_CHARS or not _INTEGER_RE.fullmatch(value):
        if _INTEGER_RE.fullmatch(value):
            raise AttributeValueError(attr_id, value, f"has more than {_MAX_BIGINTEGER_CHARS} characters")
        raise AttributeValueError(attr_id, value, "is not an integer (optional sign, then ASCII digits)")
    return int(value)


def _parse_double(attr_id: str, value: str) -> float:
    if len(value) > _MAX_DOUBLE_CHARS or not _DOUBLE_RE.fullmatch(value):
        raise AttributeValueError(attr_id, value, "is not a decimal number")
    number = float(value)
    if not math.isfinite(number):
        raise AttributeValueError(attr_id, value, "is not a finite number")
    return number


def _parse_date(attr_id: str, value: str) -> datetime:
    """ISO 8601 date/time (naive means UTC) or integer seconds since the epoch."""
    if _EPOCH_RE.fullmatch(value):
        try:
            if len(value) > _MAX_INTEGER_CHARS:
                raise OverflowError
            return datetime.fromtimestamp(int(value), timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise AttributeValueError(attr_id, value, "is out of the supported date range") from None
    text = value
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        if not text.isascii():
            raise ValueError
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise AttributeValueError(
            attr_id, value, "is not an ISO 8601 date/time or integer epoch seconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment


# --------------------------------------------------------------------------- definitions


def _check_text(what: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, not {type(value).__name__}")


@attrs.frozen
class AttributeDefinition:
    """Meta-data about one attribute id, as sent in ATTR_DEF.

    ``minimum``/``maximum`` apply to INTEGER, BIGINTEGER, DOUBLE and DATE and are kept
    as wire strings.  Either may be given alone: it is then enforced by
    :meth:`validate` but not sent, because the wire carries bounds only as
    a pair.  ``values`` lists the legal ENUMERATED values (required for that
    type, forbidden for the others).  The DATE-only fields are sent only for
    DATE.  A non-empty ``default`` must pass :meth:`validate`.
    """

    id: str
    type: AttrType = attrs.field(converter=_to_attr_type)
    name: str
    description: str = ""
    display: bool = True
    default: str = ""
    minimum: Optional[str] = None
    maximum: Optional[str] = None
    values: Tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    date_style: str = "SHORT"
    time_style: str = "SHORT"
    locale: str = "en_US"

    def __attrs_post_init__(self) -> None:
        _check_text("attribute id", self.id)
        if not self.id or "=" in self.id or any(c.isspace() or c == "\0" for c in self.id):
            raise ValueError(
                f"attribute id {_show(self.id)} must be non-empty, without '=', "
                "whitespace or NUL"
            )
        for what in ("name", "description", "default", "date_style", "time_style", "locale"):
            _check_text(f"{what} of attribute {self.id!r}", getattr(self, what))
        if not isinstance(self.display, bool):
            raise TypeError(f"display of attribute {self.id!r} must be bool")
        kind = self.type
        if kind is AttrType.ENUMERATED:
            if not self.values:
                raise ValueError(f"ENUMERATED attribute {self.id!r} needs at least one value")
            for value in self.values:
                _check_text(f"value of attribute {self.id!r}", value)
            if len(set(self.values)) != len(self.values):
                repeated = sorted(v for v, n in Counter(self.values).items() if n > 1)
                raise ValueError(f"ENUMERATED attribute {self.id!r} repeats values {repeated!r}")
        elif self.values:
            raise ValueError(f"{kind.value} attribute {self.id!r} cannot have enumerated values")
        bounds = [b for b in (self.minimum, self.maximum) if b is not None]
        if bounds and kind not in _BOUNDED_TYPES:
            raise ValueError(f"{kind.value} attribute {self.id!r} cannot have a minimum or maximum")
        for bound in bounds:
            _check_text(f"bound of attribute {self.id!r}", bound)
        low = self._bound_key(self.minimum, "minimum")
        high = self._bound_key(self.maximum, "maximum")
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"attribute {self.id!r} has minimum {self.minimum!r} above maximum {self.maximum!r}"
            )
        if kind is AttrType.DATE:
            for what in ("date_style", "time_style"):
                if getattr(self, what) not in DATE_STYLES:
                    raise ValueError(
                        f"DATE attribute {self.id!r} has {what} {getattr(self, what)!r}; "
                        f"expected one of {', '.join(DATE_STYLES)}"
                    )
            if not self.locale or any(c.isspace() for c in self.locale):
                raise ValueError(f"DATE attribute {self.id!r} has an invalid locale {self.locale!r}")
        if self.default:
            try:
                self.validate(self.default)
            except AttributeValueError as exc:
                raise AttributeValueError(self.id, self.default, f"(the default) {exc.reason}") from None

    def _bound_key(self, bound: Optional[str], what: str):
        """Comparable form of a bound, or None when unset."""
        if bound is None:
            return None
        label = f"{self.id} ({what})"
        if self.type is AttrType.INTEGER:
            return _parse_integer(label, bound)
        if self.type is AttrType.BIGINTEGER:
            return _parse_big_integer(label, bound)
        if self.type is AttrType.DOUBLE:
            return _parse_double(label, bound)
        return _parse_date(label, bound)

    # -- validation ----------------------------------------------------------

    def validate(self, value: str) -> str:
        """Return *value* normalized for this attribute, or raise AttributeValueError.

        INTEGER: optional sign and ASCII digits, a 32-bit int within the
        bounds; normalized to plain decimal.  BIGINTEGER: the same without
        the 32-bit limit (up to 100 characters).  DOUBLE: decimal notation
        (no nan/inf, no '_', no spaces), finite, within the bounds;
        normalized to Python's shortest round-trip form.  BOOLEAN:
        true/false in any case; normalized to lower case.  ENUMERATED: one
        of ``values`` exactly.  DATE: ISO 8601 (naive means UTC; a trailing
        'Z' is accepted) or integer epoch seconds, within the bounds;
        returned unchanged.  STRING/ARRAY: any text without a NUL character.
        """
        if not isinstance(value, str):
            raise AttributeValueError(self.id, value, f"is a {type(value).__name__}, not a string")
        kind = self.type
        if kind is AttrType.STRING or kind is AttrType.ARRAY:
            if "\0" in value:
                raise AttributeValueError(self.id, value, "contains a NUL character")
            return value
        if kind is AttrType.ENUMERATED:
            if value not in self.values:
                raise AttributeValueError(
                    self.id, value, f"is not one of {', '.join(map(repr, self.values))}"
                )
            return value
        if kind is AttrType.BOOLEAN:
            lowered = value.lower()
            if lowered not in ("true", "false"):
                raise AttributeValueError(self.id, value, "is not 'true' or 'false'")
            return lowered
        if kind is AttrType.INTEGER:
            number = _parse_integer(self.id, value)
            self._check_bounds(value, number)
            return str(number)
        if kind is AttrType.BIGINTEGER:
            number = _parse_big_integer(self.id, value)
            self._check_bounds(value, number)
            return str(number)
        if kind is AttrType.DOUBLE:
            real = _parse_double(self.id, value)
            self._check_bounds(value, real)
            return repr(real)
        moment = _parse_date(self.id, value)
        self._check_bounds(value, moment)
        return value

    def _check_bounds(self, value: str, key) -> None:
        low = self._bound_key(self.minimum, "minimum")
        if low is not None and key < low:
            raise AttributeValueError(self.id, value, f"is below the minimum {self.minimum}")
        high = self._bound_key(self.maximum, "maximum")
        if high is not None and key > high:
            raise AttributeValueError(self.id, value, f"is above the maximum {self.maximum}")

    # -- wire form -----------------------------------------------------------

    def to_args(self) -> List[str]:
        """``[NUM_ARGS, ID, TYPE, NAME, DESCRIPTION, DISPLAY, DEFAULT, *EXTRAS]``."""
        kind = self.type
        extras: List[str] = []
        low, high = self.minimum, self.maximum
        bounds = [low, high] if low is not None and high is not None else []
        if kind in _NUMBER_TYPES:
            extras = bounds
        elif kind is AttrType.ENUMERATED:
            extras = list(self.values)
        elif kind is AttrType.DATE:
            extras = [self.date_style, self.time_style, self.locale, *bounds]
        fields = [
            self.id,
            kind.value,
            self.name,
            self.description,
            "true" if self.display else "false",
            self.default,
            *extras,
        ]
        return [str(len(fields)), *fields]

    @classmethod
    def from_args(cls, args: Sequence[str], pos: int) -> Tuple[AttributeDefinition, int]:
        """Parse the definition starting at ``args[pos]`` (its NUM_ARGS).

        Returns the definition and the position just after it.  Raises
        ValueError (AttributeValueError for a bad default or bound) saying
        what is wrong and where.
        """
        where = f"attribute definition at argument {pos}"
        if not 0 <= pos < len(args):
            raise ValueError(f"{where}: missing (only {len(args)} arguments)")
        count = _parse_count(args[pos], f"{where}: NUM_ARGS")
        if count < _FIXED_FIELDS:
            raise ValueError(
                f"{where}: NUM_ARGS is {count}, but a definition has at least "
                f"{_FIXED_FIELDS} fields (ID TYPE NAME DESCRIPTION DISPLAY DEFAULT)"
            )
        end = pos + 1 + count
        if end > len(args):
            raise ValueError(
                f"{where}: NUM_ARGS is {count}, but only {len(args) - pos - 1} arguments follow"
            )
        attr_id, type_text, name, description, display_text, default = args[pos + 1 : pos + 7]
        extras = list(args[pos + 7 : end])
        where = f"attribute definition {attr_id!r} at argument {pos}"
        try:
            kind = _to_attr_type(type_text)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        display_word = display_text.lower()
        if display_word not in ("true", "false"):
            raise ValueError(f"{where}: DISPLAY is {display_text!r}, expected 'true' or 'false'")
        fields: Dict[str, object] = {}
        if kind in _NUMBER_TYPES:
            if len(extras) not in (0, 2):
                raise ValueError(
                    f"{where}: {kind.value} takes no extras or MIN MAX, got {len(extras)} extras"
                )
            if extras:
                fields["minimum"], fields["maximum"] = extras
        elif kind is AttrType.ENUMERATED:
            if not extras:
                raise ValueError(f"{where}: ENUMERATED needs at least one value")
            fields["values"] = tuple(extras)
        elif kind is AttrType.DATE:
            if len(extras) not in (3, 5):
                raise ValueError(
                    f"{where}: DATE takes DATE_STYLE TIME_STYLE LOCALE [MIN MAX], "
                    f"got {len(extras)} extras"
                )
            fields["date_style"], fields["time_style"], fields["locale"] = extras[:3]
            if len(extras) == 5:
                fields["minimum"], fields["maximum"] = extras[3:]
        elif extras:
            raise ValueError(f"{where}: {kind.value} takes no extras, got {len(extras)}")
        try:
            definition = cls(
                attr_id,
                kind,
                name,
                description,
                display_word == "true",
                default,
                **fields,  # type: ignore[arg-type]
            )
        except AttributeValueError:
            raise
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        return definition, end


def _parse_count(text: str, what: str) -> int:
    """A decimal count as used by ATTR_DEF (ASCII digits, no sign)."""
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ValueError(f"{what} {_show(text)} is not a decimal count")
    return int(text)


def encode_attr_defs(defs: Sequence[AttributeDefinition]) -> List[str]:
    """ATTR_DEF event arguments: ``[NUM_DEFS, *definition args...]``."""
    args = [str(len(defs))]
    for definition in defs:
        args.extend(definition.to_args())
    return args


def decode_attr_defs(args: Sequence[str]) -> List[AttributeDefinition]:
    """Inverse of :func:`encode_attr_defs`; strict about counts and leftovers."""
    if not args:
        raise ValueError("ATTR_DEF has no arguments (expected NUM_DEFS first)")
    count = _parse_count(args[0], "ATTR_DEF NUM_DEFS")
    definitions: List[AttributeDefinition] = []
    pos = 1
    for index in range(count):
        if pos >= len(args):
            raise ValueError(
                f"ATTR_DEF declares {count} definitions but only {index} are present"
            )
        definition, pos = AttributeDefinition.from_args(args, pos)
        definitions.append(definition)
    if pos != len(args):
        raise ValueError(
            f"ATTR_DEF has {len(args) - pos} trailing arguments after its {count} definitions"
        )
    return definitions


# --------------------------------------------------------------------------- key=value


def split_attribute(arg: str) -> Tuple[str, str]:
    """Split ``key=value`` at the first '=' (``env=PATH=/bin`` -> ``("env", "PATH=/bin")``).

    The value may be empty; a missing '=' or an empty key raises
    AttributeValueError.
    """
    if not isinstance(arg, str):
        raise TypeError(f"attribute argument must be str, not {type(arg).__name__}")
    key, separator, value = arg.partition("=")
    if not separator:
        raise AttributeValueError(None, arg, "has no '=' between key and value")
    if not key:
        raise AttributeValueError(None, arg, "has an empty key")
    return key, value


def format_attribute(key: str, value: str) -> str:
    """``key=value``; the key must be non-empty and free of '='."""
    _check_key(key)
    if not isinstance(value, str):
        raise TypeError(f"value of attribute {key!r} must be str, not {type(value).__name__}")
    return f"{key}={value}"


def _to_items(items: Iterable[Tuple[str, str]]) -> Tuple[Tuple[str, str], ...]:
    checked = []
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            raise TypeError(f"attribute item {item!r} is not a (key, value) pair") from None
        _check_key(key)
        if not isinstance(value, str):
            raise TypeError(f"value of attribute {key!r} must be str, not {type(value).__name__}")
        checked.append((key, value))
    return tuple(checked)


@attrs.frozen
class AttributeSet:
    """An ordered multi-map of attribute values, as carried by one command or group.

    Keys may repeat (ARRAY attributes); :meth:`get` gives the last value,
    :meth:`getall` every value in order.
    """

    items: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_to_items)

    @classmethod
    def parse(cls, args: Iterable[str]) -> AttributeSet:
        """Build from ``key=value`` arguments (see :func:`split_attribute`)."""
        return cls(tuple(split_attribute(arg) for arg in args))

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The last value given for *key*, or *default*."""
        for item_key, value in reversed(self.items):
            if item_key == key:
                return value
        return default

    def getall(self, key: str) -> List[str]:
        """Every value given for *key*, in order (empty list when absent)."""
        return [value for item_key, value in self.items if item_key == key]

    def __contains__(self, key: object) -> bool:
        return any(item_key == key for item_key, _ in self.items)

    def keys(self) -> List[str]:
        """Distinct keys in order of first appearance."""
        return list(dict.fromkeys(key for key, _ in self.items))

    def to_args(self) -> List[str]:
        """``key=value`` arguments, in order."""
        return [f"{key}={value}" for key, value in self.items]


# --------------------------------------------------------------------------- registry


class AttributeRegistry:
    """Attribute definitions by id; iteration yields the definitions in insertion order."""

    def __init__(self, defs: Iterable[AttributeDefinition] = ()) -> None:
        self._defs: Dict[str, AttributeDefinition] = {}
        for definition in defs:
            self.add(definition)

    def add(self, defn: AttributeDefinition) -> None:
        """Register *defn*; ValueError when its id is already registered."""
        if not isinstance(defn, AttributeDefinition):
            raise TypeError(f"expected an AttributeDefinition, not {type(defn).__name__}")
        if defn.id in self._defs:
            raise ValueError(f"attribute {defn.id!r} is already defined")
        self._defs[defn.id] = defn

    def get(self, attr_id: str) -> Optional[AttributeDefinition]:
        return self._defs.get(attr_id)

    def __contains__(self, attr_id: object) -> bool:
        return attr_id in self._defs

    def __iter__(self) -> Iterator[AttributeDefinition]:
        return iter(list(self._defs.values()))

    def __len__(self) -> int:
        return len(self._defs)

    def definitions(self) -> List[AttributeDefinition]:
        return list(self._defs.values())

    def validate(self, attrs: AttributeSet, *, allow_unknown: bool = True) -> List[str]:
        """Problems with *attrs* as messages (empty when all is well).

        Every known attribute's values are checked against its definition;
        a non-ARRAY key given more than once is an error, and so is an
        unknown key unless *allow_unknown*.  Each problem is reported once.
        """
        errors: List[str] = []
        counts = Counter(key for key, _ in attrs.items)
        reported = set()
        for key, value in attrs.items:
            definition = self._defs.get(key)
            if definition is None:
                if not allow_unknown and key not in reported:
                    reported.add(key)
                    errors.append(f"unknown attribute {key!r}")
                continue
            if definition.type is not AttrType.ARRAY and counts[key] > 1 and key not in reported:
                reported.add(key)
                errors.append(
                    f"attribute {key!r} is given {counts[key]} times but is not an ARRAY attribute"
                )
            try:
                definition.validate(value)
            except AttributeValueError as exc:
                errors.append(str(exc))
        return errors


# --------------------------------------------------------------------------- standard ids


class A:
    """Attribute ids as constants, so no module spells them by hand."""

    # every element
    ID = "id"
    NAME = "name"
    # machine
    MACHINE_STATE = "machineState"
    NUM_NODES = "numNodes"
    # node
    NODE_STATE = "nodeState"
    NODE_NUMBER = "nodeNumber"
    # queue
    QUEUE_STATE = "queueState"
    # job
    JOB_ID = "jobId"
    JOB_SUB_ID = "jobSubId"
    JOB_STATE = "jobState"
    JOB_STATUS = "jobStatus"
    JOB_STATUS_MESSAGE = "jobStatusMessage"
    QUEUE_ID = "queueId"
    JOB_NUM_PROCS = "jobNumProcs"
    EXEC_NAME = "execName"
    EXEC_PATH = "execPath"
    WORKING_DIR = "workingDir"
    PROG_ARGS = "progArgs"
    ENV = "env"
    USER_ID = "userId"
    # process
    PROCESS_STATE = "processState"
    PROCESS_STATUS = "processStatus"
    PROCESS_PID = "processPID"
    PROCESS_INDEX = "processIndex"
    PROCESS_NODE_ID = "processNodeId"
    PROCESS_STDOUT = "processStdout"
    PROCESS_STDERR = "processStderr"
    PROCESS_EXIT_CODE = "processExitCode"
    PROCESS_SIGNAL_NAME = "processSignalName"
    # keys used inside event and command arguments (not element attributes)
    VERSION = "version"
    BASE_ID = "baseId"


#: Legal values of the state attributes (the IDE drops anything else).
MACHINE_STATES = ("UP", "DOWN", "ALERT", "ERROR", "UNKNOWN")
NODE_STATES = ("UP", "DOWN", "ERROR", "UNKNOWN")
QUEUE_STATES = ("NORMAL", "STOPPED")
JOB_STATES = ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED")
PROCESS_STATES = ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED")


def _string(attr_id: str, name: str, description: str, display: bool = True) -> AttributeDefinition:
    return AttributeDefinition(attr_id, AttrType.STRING, name, description, display)


def _integer(attr_id: str, name: str, description: str, default: str = "0", **bounds: str):
    return AttributeDefinition(attr_id, AttrType.INTEGER, name, description, True, default, **bounds)


def _states(attr_id: str, name: str, description: str, values: Tuple[str, ...], default: str):
    return AttributeDefinition(
        attr_id, AttrType.ENUMERATED, name, description, True, default, values=values
    )


#: Definitions of every attribute id the IDE's model uses.  Numeric ones
#: have numeric defaults and state ones a legal default, as the IDE requires.
STANDARD_ATTRIBUTES: Tuple[AttributeDefinition, ...] = (
    _string(A.ID, "ID", "Identifier the agent gave this element", display=False),
    _string(A.NAME, "Name", "Human-readable name of the element"),
    _states(A.MACHINE_STATE, "Machine State", "Overall condition of the machine",
            MACHINE_STATES, "UNKNOWN"),
    _integer(A.NUM_NODES, "Nodes", "How many nodes the machine has"),
    _states(A.NODE_STATE, "Node State", "Condition of the node as the scheduler sees it",
            NODE_STATES, "UNKNOWN"),
    _integer(A.NODE_NUMBER, "Node Number", "Position of the node within its machine"),
    _states(A.QUEUE_STATE, "Queue State", "Whether the queue is accepting and starting jobs",
            QUEUE_STATES, "NORMAL"),
    _string(A.JOB_ID, "Job ID", "Element id of the job"),
    _string(A.JOB_SUB_ID, "Submission ID", "Tag the IDE attached to the job submission",
            display=False),
    _states(A.JOB_STATE, "Job State", "Coarse life-cycle state of the job", JOB_STATES, "STARTING"),
    _string(A.JOB_STATUS, "Job Status", "Finer-grained state reported by the scheduler"),
    _string(A.JOB_STATUS_MESSAGE, "Status Message", "Why the job is in its current status"),
    _string(A.QUEUE_ID, "Queue ID", "Element id of the queue the job belongs to"),
    _integer(A.JOB_NUM_PROCS, "Processes", "How many processes the job runs",
             default="1", minimum="1", maximum=str(INT32_MAX)),
    _string(A.EXEC_NAME, "Executable", "Name of the program the job runs"),
    _string(A.EXEC_PATH, "Executable Path", "Where the program the job runs is located"),
    _string(A.WORKING_DIR, "Working Directory", "Directory the job starts in"),
    AttributeDefinition(A.PROG_ARGS, AttrType.ARRAY, "Program Arguments",
                        "Command-line arguments of the program, one per value"),
    AttributeDefinition(A.ENV, AttrType.ARRAY, "Environment",
                        "Extra environment variables as NAME=VALUE, one per value"),
    _string(A.USER_ID, "User", "Account that owns the job"),
    _states(A.PROCESS_STATE, "Process State", "Coarse life-cycle state of the process",
            PROCESS_STATES, "STARTING"),
    _string(A.PROCESS_STATUS, "Process Status", "Finer-grained state of the process"),
    _integer(A.PROCESS_PID, "PID", "Operating-system process id"),
    _integer(A.PROCESS_INDEX, "Index", "Rank of the process within its job"),
    _string(A.PROCESS_NODE_ID, "Node ID", "Element id of the node the process runs on"),
    _string(A.PROCESS_STDOUT, "Standard Output", "Text the process wrote to standard output"),
    _string(A.PROCESS_STDERR, "Standard Error", "Text the process wrote to standard error"),
    _integer(A.PROCESS_EXIT_CODE, "Exit Code", "Status the process exited with"),
    _string(A.PROCESS_SIGNAL_NAME, "Signal", "Name of the signal that ended the process"),
)


def standard_registry() -> AttributeRegistry:
    """A fresh registry holding :data:`STANDARD_ATTRIBUTES` (add your own to it)."""
    return AttributeRegistry(STANDARD_ATTRIBUTES)
