"""Element id allocation.

The IDE hands the agent a *base id* at INIT.  The base id is itself an
element id (it names the resource manager), so the agent never hands it out;
every id the agent makes is derived from it so that it cannot clash with ids
from anywhere else.

Numeric ids are ``base_id + 1``, ``base_id + 2``, ... from one shared
counter, reserved in blocks per element kind ("node", "job", "process", ...)
so that related elements get consecutive ids and range sets stay short:
a thousand nodes created one by one still travel as a single ``a-b`` range.
Numeric ids are never reused.

String ids are ``"<base_id>:<unique>"``.  The ':' keeps them from ever
looking like a number or a range set, so they cannot collide with numeric
ids; they are less efficient because they cannot be grouped into ranges.

This module is pure: no I/O, no clock, no concurrency.
"""

from __future__ import annotations

import operator
from typing import Dict, List

__all__ = ["IdAllocator", "STRING_ID_SEPARATOR", "is_decimal", "parse_decimal"]

#: Separator between the base id and the caller's unique part of a string id.
STRING_ID_SEPARATOR = ":"

#: Longest run of digits read as a number from the wire; no id or count needs more.
MAX_DECIMAL_DIGITS = 20


def is_decimal(text: str) -> bool:
    """True for ASCII digits 0-9 only (no sign, blank, '_' or other scripts' digits).

    Python's ``int()`` also takes ``' 7'``, ``'+7'``, ``'1_0_1'`` and
    ``'\u0661\u0662'`` (Arabic-Indic digits): none of those is an id or a
    number on the wire, so nothing read from the wire goes to ``int()``
    without passing this first.
    """
    return text.isascii() and text.isdigit()


def parse_decimal(text: str, what: str = "element id") -> int:
    """An id or count from the wire: ASCII decimal digits only, at most 20 of them.

    Raises ValueError naming ``what`` and the text.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be str, not {type(text).__name__}")
    if not is_decimal(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ValueError(f"{what} must be plain decimal digits 0-9, got {shown!r}")
    if len(text) > MAX_DECIMAL_DIGITS:
        raise ValueError(f"{what} has {len(text)} digits; at most {MAX_DECIMAL_DIGITS} are accepted")
    return int(text)


class IdAllocator:
    """Hands out element ids derived from a session's base id.

    ``block_size`` is the reservation granule: a kind whose current block is
    exhausted reserves the next whole number of blocks from the shared
    counter.  When that kind also made the most recent reservation, the new
    space directly follows its old block and its ids simply continue, so a
    kind allocating alone never shows a gap.
    """

    def __init__(self, base_id: int, block_size: int = 4096) -> None:
        base_id = operator.index(base_id)
        block_size = operator.index(block_size)
        if base_id < 0:
            raise ValueError(f"base id must not be negative (got {base_id})")
        if block_size < 1:
            raise ValueError(f"block size must be at least 1 (got {block_size})")
        self.base_id: int = int(base_id)
        self.block_size: int = int(block_size)
        # First id not yet reserved by any kind.
        self._unreserved = self.base_id + 1
        # kind -> [next free id, end of the kind's block (exclusive)]
        self._blocks: Dict[str, List[int]] = {}

    def _rounded(self, count: int) -> int:
        """Smallest multiple of block_size that holds *count* ids."""
        return -(-count // self.block_size) * self.block_size

    def allocate(self, kind: str, count: int = 1) -> range:
        """Return *count* new consecutive ids for elements of *kind*.

        Taken from the kind's current block when they fit; otherwise whole
        blocks are reserved from the shared counter.  The unused tail of an
        abandoned block is never handed out.
        """
        count = operator.index(count)
        if count < 1:
            raise ValueError(f"cannot allocate {count} ids: count must be at least 1")
        block = self._blocks.get(kind)
        if block is not None:
            next_id, end = block
            if end - next_id >= count:
                block[0] = next_id + count
                return range(next_id, next_id + count)
            if end == self._unreserved:
                # This kind owns the newest reservation: grow it in place so
                # its ids stay consecutive.
                grow = self._rounded(count - (end - next_id))
                self._unreserved += grow
                block[0] = next_id + count
                block[1] = end + grow
                return range(next_id, next_id + count)
        start = self._unreserved
        size = self._rounded(count)
        self._unreserved = start + size
        self._blocks[kind] = [start + count, start + size]
        return range(start, start + count)

    def allocate_one(self, kind: str) -> int:
        """Return one new id for an element of *kind*."""
        return self.allocate(kind, 1)[0]

    def string_id(self, unique: str) -> str:
        """The string element id for *unique*: ``f"{base_id}:{unique}"``.

        The same *unique* always gives the same id; keeping it unique is the
        caller's business.  *unique* must be non-empty printable ASCII
        without whitespace or ',' (the IDE reads the wire as ASCII, and ','
        separates range-set parts).
        """
        if not isinstance(unique, str):
            raise TypeError(f"unique part must be str, not {type(unique).__name__}")
        if not unique:
            raise ValueError("unique part of a string id must not be empty")
        for offset, char in enumerate(unique):
            if char.isspace() or char == "," or not ("!" <= char <= "~"):
                raise ValueError(
                    f"unique part {unique!r} has forbidden character {char!r} at offset "
                    f"{offset} (allowed: printable ASCII except whitespace and ',')"
                )
        return f"{self.base_id}{STRING_ID_SEPARATOR}{unique}"

    def __repr__(self) -> str:
        return (
            f"IdAllocator(base_id={self.base_id}, block_size={self.block_size}, "
            f"kinds={sorted(self._blocks)!r})"
        )
