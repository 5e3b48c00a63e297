"""The hierarchical rendezvous.

Tasks at the bottom of a hierarchy (the processes of a part) register bytes with the
rendezvous of the unit above them (the part: level 1); once all have registered, the
rendezvous holds the aggregate of their data, which the unit's controlling task (rank 0)
may register in turn with the rendezvous one level up (the multi-part job: level 2).

The data format is recursive, with decimal ASCII counts::

    level 0 :== byteCount SPACE bytes
    level n :== dataCount SPACE (level n-1)*      n >= 1

so two processes that registered ``ab`` and ``c`` make the level-1 aggregate
``2 2 ab1 c``.  Aggregates list their items in rank order.  The format's encoder and
strict decoder live with the runtime (:mod:`proxy_agent.runtime.rendezvous_data`), since a
job's processes decode aggregates with nothing but the standard library; they are
re-exported here.  Nothing here does I/O.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ...runtime.rendezvous_data import (
    DEFAULT_MAX_DATA,
    MAX_LEVEL,
    FormatError,
    decode,
    encode,
    encode_item,
)

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


def _count_text(value: int) -> bytes:
    return str(value).encode("ascii") + b" "


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
