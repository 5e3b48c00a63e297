"""The hierarchical rendezvous and its data format.

Tasks at the bottom of a hierarchy (the processes of a part) register bytes with the
rendezvous of the unit above them (the part: level 1); once all have registered, the
rendezvous holds the aggregate of their data, which the unit's controlling task (rank 0)
may register in turn with the rendezvous one level up (the multi-part job: level 2).

The data format is recursive, with decimal ASCII counts::

    level 0 :== byteCount SPACE bytes
    level n :== dataCount SPACE (level n-1)*      n >= 1

so two processes that registered ``ab`` and ``c`` make the level-1 aggregate
``2 2 ab1 c``.  Items follow each other with nothing between them: a level-0 item's
byte count says where it ends.  Aggregates list their items in rank order.

Decoding is strict: a count is one or more ASCII digits without a sign or a superfluous
leading zero, followed by exactly one space; a byte count never runs past the end; an item
count is never larger than the bytes left could hold; nothing may follow the datum.  The
caller bounds the input's size.  Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

__all__ = [
    "DEFAULT_MAX_DATA",
    "FormatError",
    "RankOutOfRange",
    "RankTaken",
    "Rendezvous",
    "RendezvousError",
    "RendezvousFull",
    "RendezvousIncomplete",
    "decode",
    "encode",
    "encode_item",
]

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


# --------------------------------------------------------------------------- one rendezvous


class RendezvousError(Exception):
    """A registration was refused; the message says why."""


class RankTaken(RendezvousError):
    pass


class RankOutOfRange(RendezvousError):
    pass


class RendezvousFull(RendezvousError):
    pass


class RendezvousIncomplete(RendezvousError):
    pass


class Rendezvous:
    """One rendezvous of ``size`` members at ``level`` (1: processes of a part; 2: parts of
    a multi-part job).

    A member registers its data at a rank from 0 to ``size - 1`` or, with rank -1, at the
    lowest rank still free.  At level 1 a member's data is its raw bytes; at level n > 1 it
    is the encoded level n-1 aggregate of a unit below, checked on registration.  When all
    ranks are taken the rendezvous is complete and :meth:`aggregate` gives the level-n
    datum of all members in rank order.
    """

    def __init__(self, size: int, level: int = 1, *, max_size: int = DEFAULT_MAX_DATA) -> None:
        if not 1 <= level <= MAX_LEVEL:
            raise ValueError(f"a rendezvous level is from 1 to {MAX_LEVEL}, not {level}")
        if size < 1:
            raise ValueError(f"a rendezvous has at least one member, not {size}")
        self.size = size
        self.level = level
        self.max_size = max_size
        self._items: List[Optional[bytes]] = [None] * size
        self._registered = 0
        self._total = 0
        self._aggregate: Optional[bytes] = None

    @property
    def registered(self) -> int:
        return self._registered

    @property
    def complete(self) -> bool:
        return self._registered == self.size

    def missing(self) -> List[int]:
        """The ranks nobody has registered at yet."""
        return [rank for rank, item in enumerate(self._items) if item is None]

    def register(self, data: bytes, rank: int = -1) -> int:
        """Register ``data`` at ``rank`` (-1: the lowest free rank); the rank used.

        Raises :class:`RankOutOfRange`, :class:`RankTaken`, :class:`RendezvousFull`, or
        :class:`FormatError` for level n > 1 data that is not a level n-1 datum.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"rendezvous data is bytes, not {type(data).__name__}")
        data = bytes(data)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise RankOutOfRange(f"a rank is a whole number, not {rank!r}")
        if self.complete:
            raise RendezvousFull(
                f"the level-{self.level} rendezvous is full: all {self.size} ranks have registered"
            )
        if rank == -1:
            rank = self._items.index(None)
        elif not 0 <= rank < self.size:
            raise RankOutOfRange(
                f"rank {rank} is outside the level-{self.level} rendezvous (ranks 0 to {self.size - 1}, or -1)"
            )
        elif self._items[rank] is not None:
            raise RankTaken(f"rank {rank} of the level-{self.level} rendezvous is already registered")
        if self.level == 1:
            item = encode_item(data)
        else:
            decode(data, self.level - 1, max_size=self.max_size)
            item = data
        if self._total + len(item) > self.max_size:
            raise RendezvousError(
                f"the level-{self.level} rendezvous would hold more than {self.max_size} bytes"
            )
        self._items[rank] = item
        self._total += len(item)
        self._registered += 1
        return rank

    def aggregate(self) -> bytes:
        """The encoded level-``level`` datum of all members in rank order (once complete)."""
        if not self.complete:
            raise RendezvousIncomplete(
                f"the level-{self.level} rendezvous is not complete: ranks {_ranges(self.missing())} "
                "have not registered"
            )
        if self._aggregate is None:
            self._aggregate = _count_text(self.size) + b"".join(item for item in self._items if item is not None)
        return self._aggregate


def _ranges(ranks: Sequence[int]) -> str:
    """``0-3,7`` for [0, 1, 2, 3, 7]: short even for a large rendezvous."""
    pieces = []
    start = prev = None
    for rank in ranks:
        if start is None:
            start = prev = rank
        elif rank == prev + 1:
            prev = rank
        else:
            pieces.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = rank
    if start is not None:
        pieces.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(pieces)
