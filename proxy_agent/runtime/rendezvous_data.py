"""The rendezvous data format, shared by the agent and a job's processes (standard library
only, like the rest of the runtime).

The format is recursive, with decimal ASCII counts::

    level 0 :== byteCount SPACE bytes
    level n :== dataCount SPACE (level n-1)*      n >= 1

so two processes that registered ``ab`` and ``c`` make the level-1 aggregate
``2 2 ab1 c``.  Items follow each other with nothing between them: a level-0 item's
byte count says where it ends.  Aggregates list their items in rank order.

Decoding is strict: a count is one or more ASCII digits without a sign or a superfluous
leading zero, followed by exactly one space; a byte count never runs past the end; an item
count is never larger than the bytes left could hold; nothing may follow the datum.  The
caller bounds the input's size.  Nothing here does I/O.

:mod:`proxy_agent.service.coalloc.rendezvous` builds the rendezvous itself on this.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple, Union

__all__ = ["DEFAULT_MAX_DATA", "MAX_LEVEL", "FormatError", "decode", "encode", "encode_item"]

#: The largest encoded datum :func:`decode` accepts unless told otherwise.
DEFAULT_MAX_DATA = 16 * 1024 * 1024
#: Counts have at most this many digits: more is never a sensible size.
_MAX_DIGITS = 12
#: The deepest level the format is decoded to (the recursion stays shallow).
MAX_LEVEL = 16

#: A datum of some level: bytes at level 0, a sequence of level n-1 data at level n.
Datum = Union[bytes, Sequence[Any]]


class FormatError(ValueError):
    """Encoded rendezvous data is malformed; the message says what and at which byte."""


def _count_text(value: int) -> bytes:
    return str(value).encode("ascii") + b" "


def encode_item(data: bytes) -> bytes:
    """One task's bytes as a level-0 datum: ``byteCount SPACE bytes``."""
    return _count_text(len(data)) + bytes(data)


def encode(datum: Datum, level: int) -> bytes:
    """``datum`` in the rendezvous format of ``level``: bytes at level 0, else a sequence of
    level ``level - 1`` data."""
    if level < 0 or level > MAX_LEVEL:
        raise ValueError(f"level must be from 0 to {MAX_LEVEL}, not {level}")
    if level == 0:
        if not isinstance(datum, (bytes, bytearray, memoryview)):
            raise TypeError(f"level-0 data is bytes, not {type(datum).__name__}")
        return encode_item(bytes(datum))
    if isinstance(datum, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"level-{level} data is a sequence of level-{level - 1} data")
    items = list(datum)
    return _count_text(len(items)) + b"".join(encode(item, level - 1) for item in items)


def _read_count(data: bytes, at: int, what: str) -> Tuple[int, int]:
    """The count that starts at ``at`` and the offset after its space."""
    end = at
    limit = min(len(data), at + _MAX_DIGITS + 1)
    while end < limit and 0x30 <= data[end] <= 0x39:
        end += 1
    if end == at:
        found = "the end of the data" if at >= len(data) else f"byte {data[at:at + 1]!r}"
        raise FormatError(f"expected the digits of a {what} at byte {at}, found {found}")
    if end - at > _MAX_DIGITS:
        raise FormatError(f"the {what} at byte {at} has more than {_MAX_DIGITS} digits")
    if data[at] == 0x30 and end - at > 1:
        raise FormatError(f"the {what} at byte {at} has a leading zero")
    if end >= len(data) or data[end] != 0x20:
        found = "the end of the data" if end >= len(data) else f"byte {data[end:end + 1]!r}"
        raise FormatError(f"expected a space after the {what} at byte {end}, found {found}")
    return int(data[at:end]), end + 1


# The fewest bytes an encoded datum of each level occupies: "0 " at level 0, "0 " at any
# level (an empty list) too.  So a list of k items needs at least 2k more bytes.
_MIN_ITEM = 2


def _decode_at(data: bytes, at: int, level: int) -> Tuple[Datum, int]:
    if level == 0:
        length, at = _read_count(data, at, "byte count")
        if length > len(data) - at:
            raise FormatError(
                f"the byte count {length} at byte {at} runs past the end of the data "
                f"({len(data) - at} bytes left)"
            )
        return data[at : at + length], at + length
    count, start = _read_count(data, at, f"level-{level} item count")
    if count * _MIN_ITEM > len(data) - start:
        raise FormatError(
            f"the item count {count} at byte {at} is more than the {len(data) - start} bytes left could hold"
        )
    items: List[Datum] = []
    at = start
    for _ in range(count):
        item, at = _decode_at(data, at, level - 1)
        items.append(item)
    return tuple(items), at


def decode(data: bytes, level: int, *, max_size: int = DEFAULT_MAX_DATA) -> Datum:
    """The datum ``data`` encodes at ``level``: bytes at level 0, else a tuple of level
    ``level - 1`` data.  Raises :class:`FormatError` on anything but exactly one datum."""
    if level < 0 or level > MAX_LEVEL:
        raise ValueError(f"level must be from 0 to {MAX_LEVEL}, not {level}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"encoded data is bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise FormatError(f"the data is {len(data)} bytes, more than the {max_size} allowed")
    datum, end = _decode_at(data, 0, level)
    if end != len(data):
        raise FormatError(f"{len(data) - end} bytes of trailing garbage after the datum (from byte {end})")
    return datum
