"""The two dialects of the proxy protocol: every rule that differs between them, in one place.

A client picks its dialect in INIT (``dialect=NAME``); without the attribute
it gets :data:`DEFAULT`.

* :data:`DEFAULT` is what the Eclipse PTP 4.0 client takes.  That client reads
  every frame as strict US-ASCII (one byte of 0x80 or above ends its session),
  parses only seven attribute types, breaks on array values in job events,
  holds element ids and INTEGER values as Java ints, expects STOP_EVENTS
  to be answered at once, and may send a command under the TID of a command
  that is still open (which must be carried out, not refused).
* :data:`NATIVE` is the design document's protocol as this project speaks it:
  UTF-8 text, the ARRAY type with array values in events, INTEGER values as
  the scheduler gives them, STOP_EVENTS completed by the next START_EVENTS
  (the design's phase example), and a command on a TID still open refused
  with ERROR ``TID_IN_USE``.

Nothing else in the project decides any of this: the session and the
front-end's renderer ask the :class:`Dialect` of the session.  Everything the
two dialects share (framing, phases, process ids as ranks, TID rules) lives
in the other modules of this package.

Text escaping (default dialect)
-------------------------------

Every byte sent is US-ASCII.  Each *argument* of every event is escaped as a
whole, so job output, names, reasons and error messages are all covered by
one rule, which is reversible and cannot be confused with ordinary text:

* a backslash is written as two backslashes (``\\\\``);
* a character from U+0080 to U+00FF as ``\\x`` and 2 lower-case hex digits;
* a character from U+0100 to U+FFFF as ``\\u`` and 4 lower-case hex digits;
* a character above U+FFFF as ``\\U`` and 8 lower-case hex digits.

Every other character (all of ASCII but the backslash, control characters
included) stands for itself.  So ``naïve\\path`` travels as
``na\\xefve\\\\path``.  Code points that are not characters (lone surrogates,
which arise from undecodable program output) are escaped like any other, so
nothing is ever dropped.  Only the agent escapes: commands from the client are
read as sent.  :func:`unescape` undoes the rule and refuses anything the rule
cannot have produced.

This module is pure: no I/O, no clock, no concurrency.
"""

from __future__ import annotations

import enum
import re
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import attrs

from .attributes import INT32_MAX, INT32_MIN, AttrType, AttributeDefinition, A
from .wire import encode_ascii_frame, encode_frame

__all__ = [
    "DEFAULT",
    "DIALECTS",
    "Dialect",
    "DialectError",
    "EscapeError",
    "KEY_SPACE",
    "NATIVE",
    "ValueRule",
    "dialect_named",
    "escape",
    "unescape",
]

#: Element keys a session may add to the client's base id: 1 .. KEY_SPACE - 1.
#: The agent's element ids are ``base id + key``, so a base id is acceptable
#: only if ``base id + KEY_SPACE - 1`` is an id the client can hold.
KEY_SPACE = 2**24

#: Java's largest int: the highest element id, and INTEGER value, of the default dialect.
JAVA_INT_MAX = INT32_MAX
#: The highest element id of the native dialect (a signed 64-bit integer).
INT64_MAX = 2**63 - 1

#: Attribute ids the PTP 4.0 client holds as arrays whatever ATTR_DEF says.
CLIENT_ARRAY_ATTRIBUTES = frozenset({A.PROG_ARGS, A.ENV})

#: The attribute types the PTP 4.0 client parses in ATTR_DEF.
_REFERENCE_TYPES = frozenset(
    {
        AttrType.BOOLEAN,
        AttrType.DATE,
        AttrType.DOUBLE,
        AttrType.ENUMERATED,
        AttrType.INTEGER,
        AttrType.BIGINTEGER,
        AttrType.STRING,
    }
)


class DialectError(ValueError):
    """INIT named a dialect this agent does not speak."""


class EscapeError(ValueError):
    """Text that the default dialect's escaping cannot have produced."""


# --------------------------------------------------------------------------- escaping


def escape(text: str) -> str:
    """The default dialect's form of ``text``: pure ASCII, reversible by :func:`unescape`."""
    if text.isascii() and "\\" not in text:
        # str.isascii() is a flag lookup in CPython and the search is a memchr: this
        # is the path of nearly every value, so it must stay this cheap.
        return text
    return text.replace("\\", "\\\\").encode("ascii", "backslashreplace").decode("ascii")


_ESCAPE = re.compile(r"\\(?:(\\)|x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8}))")


def unescape(text: str) -> str:
    """Undo :func:`escape`; :class:`EscapeError` for text it cannot have produced.

    Refused: a non-ASCII character, a backslash that starts no escape, upper-case
    hex digits, and an escape in a longer form than needed (``\\u00e9`` for
    ``\\xe9``) or for a character that needs none (``\\x41``), so that every text
    has exactly one escaped form.
    """
    if "\\" not in text:
        if not text.isascii():
            raise EscapeError(f"escaped text must be ASCII, found {_first_non_ascii(text)}")
        return text
    if not text.isascii():
        raise EscapeError(f"escaped text must be ASCII, found {_first_non_ascii(text)}")
    out: List[str] = []
    pos = 0
    for match in _ESCAPE.finditer(text):
        literal = text[pos:match.start()]
        if "\\" in literal:
            _stray(text, pos + literal.index("\\"))
        out.append(literal)
        backslash, x2, u4, u8 = match.groups()
        if backslash is not None:
            out.append("\\")
        else:
            digits = x2 or u4 or u8
            code = int(digits, 16)
            if x2 is not None:
                low, high = 0x80, 0xFF
            elif u4 is not None:
                low, high = 0x100, 0xFFFF
            else:
                low, high = 0x10000, 0x10FFFF
            if not low <= code <= high:
                raise EscapeError(
                    f"escape {match.group(0)!r} at offset {match.start()}: U+{code:04X} is written "
                    + ("as itself" if code < 0x80 else "in a shorter form" if code < low else "nowhere (beyond U+10FFFF)")
                )
            out.append(chr(code))
        pos = match.end()
    rest = text[pos:]
    if "\\" in rest:
        _stray(text, pos + rest.index("\\"))
    out.append(rest)
    return "".join(out)


def _stray(text: str, offset: int) -> None:
    raise EscapeError(
        f"backslash at offset {offset} starts no escape (expected \\\\, \\xhh, \\uhhhh or \\Uhhhhhhhh): "
        f"{text[offset:offset + 10]!r}"
    )


def _first_non_ascii(text: str) -> str:
    for offset, char in enumerate(text):
        if ord(char) > 0x7F:
            return f"U+{ord(char):04X} at offset {offset}"
    return "nothing"  # pragma: no cover - only called for non-ASCII text


# --------------------------------------------------------------------------- values


class ValueRule(enum.Enum):
    """What the renderer does with one attribute's values in NEW_x and x_CHANGE events."""

    #: send the value as it is
    SEND = "send"
    #: never send the attribute in element events
    OMIT = "omit"
    #: send :meth:`Dialect.integer_text` of the value; leave the attribute out when that is None
    INTEGER = "integer"


_DECIMAL = re.compile(r"[+-]?[0-9]{1,40}")


@attrs.frozen
class Dialect:
    """One dialect: the value of each rule that differs between the two.

    Use the two instances, :data:`DEFAULT` and :data:`NATIVE`; pick one with
    :func:`dialect_named`.
    """

    #: the name a client gives in INIT (``dialect=native``)
    name: str
    #: every byte sent is US-ASCII; other text is escaped (see the module docstring)
    ascii_only: bool
    #: attribute types an ATTR_DEF may carry
    attribute_types: FrozenSet[AttrType]
    #: NEW_x / x_CHANGE may carry multi-valued (ARRAY) attributes
    array_values_in_events: bool
    #: bounds of INTEGER values in events (None: as the scheduler gave them)
    integer_bounds: Optional[Tuple[int, int]]
    #: STOP_EVENTS is answered at once (OK for START_EVENTS, then OK for itself)
    #: rather than completed by the next START_EVENTS
    stop_events_at_once: bool
    #: the highest element id the client can hold
    max_element_id: int
    #: element ids may be strings (``<base id>:<unique>``) as well as numbers
    string_element_ids: bool
    #: a command that arrives under the TID of a command still open is carried out and
    #: answered like any other, each answer completing the oldest open command of the TID
    #: on the client's side (False: it is refused with ERROR TID_IN_USE, which abandons
    #: the command that held the TID)
    open_tid_reuse: bool

    # ------------------------------------------------------------------ text

    def escape(self, text: str) -> str:
        """One text as it must travel (unchanged in the native dialect)."""
        if not self.ascii_only or (text.isascii() and "\\" not in text):
            return text
        return escape(text)

    def escape_all(self, texts: Sequence[str]) -> Sequence[str]:
        """Many texts at once: the same sequence back when none needs escaping.

        One pass in C over all of them decides that for the usual case; only
        when some text needs it is each escaped on its own.
        """
        if not self.ascii_only:
            return texts
        joined = "".join(texts)
        if joined.isascii() and "\\" not in joined:
            return texts
        return [text if text.isascii() and "\\" not in text else escape(text) for text in texts]

    def unescape(self, text: str) -> str:
        """What the client does to each received argument (identity in the native dialect)."""
        if not self.ascii_only:
            return text
        return unescape(text)

    def encode_frame(self, msg_id: int, tid: int, args: Sequence[str]) -> bytes:
        """Encode one event with this dialect's text rule.

        The usual frame, all ASCII without a backslash, is built once and
        checked in C; only a frame with other text has its arguments escaped,
        and is then built once more from ASCII text.
        """
        if not self.ascii_only:
            return encode_frame(msg_id, tid, args)
        data = encode_ascii_frame(msg_id, tid, args)
        if data is not None and b"\\" not in data:
            return data
        # Most arguments of such a frame still need nothing: test them inline.
        escaped = [arg if arg.isascii() and "\\" not in arg else escape(arg) for arg in args]
        return encode_frame(msg_id, tid, escaped)

    def encode(self, event) -> bytes:
        """Encode a typed event (:class:`~proxy_agent.protocol.messages.Event`)."""
        return self.encode_frame(int(event.event_id), event.tid, event.to_args())

    # ------------------------------------------------------------------ MODEL_DEF

    def allows_type(self, attr_type: AttrType) -> bool:
        return attr_type in self.attribute_types

    def attribute_definitions(self, definitions: Iterable[AttributeDefinition]) -> List[AttributeDefinition]:
        """The definitions to send in ATTR_DEF: those of a type this dialect carries.

        The default dialect leaves out ARRAY definitions (``progArgs``, ``env``):
        the PTP 4.0 client reports each one as an unknown type, and it already
        has its own definitions of those two.
        """
        return [definition for definition in definitions if definition.type in self.attribute_types]

    # ------------------------------------------------------------------ element events

    def value_rule(self, attr_id: str, attr_type: Optional[AttrType]) -> ValueRule:
        """How NEW_x / x_CHANGE events carry attribute ``attr_id`` (of type ``attr_type``, None if unknown).

        Meant to be asked once per attribute id and kept, not once per value.
        """
        if not self.array_values_in_events and (attr_type is AttrType.ARRAY or attr_id in CLIENT_ARRAY_ATTRIBUTES):
            return ValueRule.OMIT
        if attr_type is AttrType.INTEGER and self.integer_bounds is not None:
            return ValueRule.INTEGER
        return ValueRule.SEND

    def integer_text(self, value: Union[int, str]) -> Optional[str]:
        """An INTEGER value as sent, or None when the attribute must be left out.

        Default dialect: a decimal integer within a Java int, in plain decimal;
        anything else (a scheduler's "no value" marker 4294967294, "infinite",
        text that is no integer) is None.  Native dialect: the value as given.
        """
        bounds = self.integer_bounds
        if bounds is None:
            return value if isinstance(value, str) else str(value)
        if value.__class__ is str:
            # Up to 9 ASCII digits without a leading zero: already canonical, and
            # below 10^9, so within any int.  That is nearly every value.
            if value.isdigit() and value.isascii() and len(value) < 10 and (value[0] != "0" or len(value) == 1):
                return value
            if not _DECIMAL.fullmatch(value):
                return None
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            return None
        if not bounds[0] <= number <= bounds[1]:
            return None
        return str(number)

    def event_attributes(
        self,
        attributes: Union[Mapping[str, object], Iterable[Tuple[str, object]]],
        types: Mapping[str, AttrType],
    ) -> List[str]:
        """``key=value`` arguments for one group of a NEW_x / x_CHANGE event.

        ``attributes`` maps attribute ids to a string, an int, or a list of
        strings (an ARRAY value); ``types`` gives the type of each id known to
        the session.  A list value becomes one argument per element where
        array values may travel and is left out where they may not; None
        values are left out.  (Text is escaped later, by :meth:`encode_frame`.)
        A renderer on a hot path can use :meth:`value_rule` per attribute id
        instead and do the same with less work per value.
        """
        items = attributes.items() if isinstance(attributes, Mapping) else attributes
        out: List[str] = []
        for key, value in items:
            if value is None:
                continue
            rule = self.value_rule(key, types.get(key))
            if rule is ValueRule.OMIT:
                continue
            if isinstance(value, (list, tuple)):
                if not self.array_values_in_events:
                    continue
                out.extend(f"{key}={item}" for item in value)
                continue
            if rule is ValueRule.INTEGER:
                text = self.integer_text(value)  # type: ignore[arg-type]
                if text is None:
                    continue
                out.append(f"{key}={text}")
                continue
            out.append(f"{key}={value}")
        return out

    # ------------------------------------------------------------------ ids

    def highest_id(self, base_id: int, key_space: int = KEY_SPACE) -> int:
        """The highest element id a session with this base id may use."""
        return base_id + key_space - 1

    def base_id_problem(self, base_id: int, key_space: int = KEY_SPACE) -> Optional[str]:
        """Why INIT must refuse ``base_id`` (None when it is acceptable).

        The agent's element ids are ``base id + key`` with keys up to
        ``key_space - 1``; all of them must be ids the client can hold.
        """
        highest = self.highest_id(base_id, key_space)
        if highest <= self.max_element_id:
            return None
        largest = self.max_element_id - key_space + 1
        holder = "a Java int" if self.max_element_id == JAVA_INT_MAX else "a signed 64-bit integer"
        hint = " (or ask for dialect=native)" if self.name != NATIVE_NAME else ""
        return (
            f"base id {base_id} is too large for the {self.name} dialect: this agent's element ids go up to "
            f"base id + {key_space - 1}, and every id must fit {holder} (at most {self.max_element_id}); "
            f"give a base id of at most {largest}{hint}"
        )


DEFAULT_NAME = "default"
NATIVE_NAME = "native"

#: What the Eclipse PTP 4.0 client takes (no ``dialect`` attribute in INIT).
DEFAULT = Dialect(
    name=DEFAULT_NAME,
    ascii_only=True,
    attribute_types=_REFERENCE_TYPES,
    array_values_in_events=False,
    integer_bounds=(INT32_MIN, INT32_MAX),
    stop_events_at_once=True,
    max_element_id=JAVA_INT_MAX,
    string_element_ids=False,
    open_tid_reuse=True,
)

#: The design document's protocol (``dialect=native``).
NATIVE = Dialect(
    name=NATIVE_NAME,
    ascii_only=False,
    attribute_types=frozenset(AttrType),
    array_values_in_events=True,
    integer_bounds=None,
    stop_events_at_once=False,
    max_element_id=INT64_MAX,
    string_element_ids=True,
    open_tid_reuse=False,
)

#: Every dialect by the name a client gives in INIT.
DIALECTS: Dict[str, Dialect] = {DEFAULT.name: DEFAULT, NATIVE.name: NATIVE}


def dialect_named(name: Optional[str]) -> Dialect:
    """The dialect ``dialect=name`` asks for (None: the default); :class:`DialectError` if unknown."""
    if name is None:
        return DEFAULT
    found = DIALECTS.get(name)
    if found is None:
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise DialectError(f"unknown dialect {shown!r}; this agent speaks {', '.join(sorted(DIALECTS))}")
    return found
