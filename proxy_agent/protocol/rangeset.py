"""Range sets: compact sets of non-negative element ids.

On the wire a range set is a comma-separated list of parts, each part either
a single id (``41``) or an inclusive range (``34-38``) written with ASCII
digits only.  Parts may come in any order and may overlap or touch:
``1-10,4-12,3`` is the twelve ids 1..12.  Nothing else is allowed: no signs,
no spaces, no empty parts, no reversed ranges, and the empty string is not a
legal range set.

:class:`RangeSet` keeps its ids as a canonical tuple of intervals -- sorted,
disjoint and never adjacent -- and never expands a range into its ids, so
``1-4000000000`` costs the same as ``1-2``.  Equal sets therefore have equal
intervals, equal hashes and the same canonical text.

Complexities below use ``k`` (and ``m``) for the number of intervals of the
sets involved and ``n`` for the number of ids handed to :meth:`from_ids`.

This module is pure: no I/O, no clock, no concurrency.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from itertools import chain, islice
from typing import ClassVar, Iterable, Iterator, List, Tuple

import attrs

__all__ = ["RangeSet", "RangeSetError"]

Interval = Tuple[int, int]

_PART_CHARS = frozenset("0123456789-")
# Digit strings longer than this are refused before int() sees them: they are
# far beyond any id a peer could mean, and very long ones would be slow (and,
# on recent Pythons, rejected by int() itself).
_MAX_DIGITS = 40


class RangeSetError(ValueError):
    """A range set (text or ids) is malformed; the message says where and why."""


def _show(text: str, limit: int = 60) -> str:
    """``repr`` of *text*, shortened when long so messages stay readable."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


def _part_error(text: str, index: int, part: str, why: str) -> RangeSetError:
    return RangeSetError(f"range set {_show(text)}: part {index} {_show(part)} {why}")


def _why_bad(part: str) -> str:
    """Explain why *part* is not ``DIGITS`` or ``DIGITS-DIGITS``."""
    if not part:
        return "is empty (stray ',')"
    for offset, char in enumerate(part):
        if char not in _PART_CHARS:
            return (
                f"has invalid character {char!r} at offset {offset} "
                "(only ASCII digits and '-' are allowed)"
            )
    if part.count("-") > 1:
        return "has more than one '-'"
    if part.startswith("-"):
        return "has no lower bound"
    if part.endswith("-"):
        return "has no upper bound"
    return "is not a number or a range"  # not reached for well-formed checks


def _is_canonical(intervals: List[Interval]) -> bool:
    """True when *intervals* are sorted, disjoint and non-adjacent.  O(k)."""
    previous_last = -2
    for first, last in intervals:
        if first <= previous_last + 1:
            return False
        previous_last = last
    return True


def _coalesce_sorted(intervals: Iterable[Interval]) -> Tuple[Interval, ...]:
    """Merge overlapping or touching intervals of a list sorted by first id.  O(k)."""
    merged: List[Interval] = []
    iterator = iter(intervals)
    try:
        current_first, current_last = next(iterator)
    except StopIteration:
        return ()
    for first, last in iterator:
        if first <= current_last + 1:
            if last > current_last:
                current_last = last
        else:
            merged.append((current_first, current_last))
            current_first, current_last = first, last
    merged.append((current_first, current_last))
    return tuple(merged)


def _normalize(intervals: List[Interval]) -> Tuple[Interval, ...]:
    """Canonical form of valid intervals in any order.

    O(k) when already canonical (the common case for text we produced
    ourselves), O(k log k) otherwise.
    """
    if _is_canonical(intervals):
        return tuple(intervals)
    intervals.sort()
    return _coalesce_sorted(intervals)


def _convert_intervals(value: Iterable[Interval]) -> Tuple[Interval, ...]:
    """Converter for ``RangeSet(intervals)``: validate pairs, then canonicalize."""
    checked: List[Interval] = []
    for position, pair in enumerate(value):
        try:
            first, last = pair
            first = int(operator.index(first))
            last = int(operator.index(last))
        except (TypeError, ValueError):
            raise RangeSetError(
                f"interval {position} {pair!r} is not a pair of integers"
            ) from None
        if first < 0:
            raise RangeSetError(f"interval {position} {pair!r} starts below 0")
        if first > last:
            raise RangeSetError(f"interval {position} {pair!r} is reversed")
        checked.append((first, last))
    return _normalize(checked)


def _runs_of_increasing(ids: List[int]) -> List[Interval]:
    """Split a strictly increasing list of ints into maximal runs of consecutive ids.

    In a strictly increasing list ``ids[j] - j`` never decreases, and a run
    of consecutive ids is exactly a stretch where it stays constant, so a
    run's end can be searched for instead of walked to.  The first probe
    guesses that the run is as long as the previous one (blocks tend to be
    alike); after that the search gallops forward and then bisects.  The
    cost is O(r log(n / r)) Python steps for r runs rather than O(n), and
    about three steps per run when the runs have equal lengths.
    """
    runs: List[Interval] = []
    total = len(ids)
    start = 0
    guess = 0  # offset of the previous run's last id from its first
    while start < total:
        offset = ids[start] - start
        inside = start  # last index known to be in the run
        outside = total  # first index known to be past it (or the end)
        probe = start + guess
        if probe < total:
            if ids[probe] - probe == offset:
                inside = probe
            else:
                outside = probe
        if outside == total:
            step = 1
            probe = inside + 1
            while probe < total and ids[probe] - probe == offset:
                inside = probe
                step <<= 1
                probe = inside + step
            if probe < total:
                outside = probe
        while outside - inside > 1:
            middle = (inside + outside) >> 1
            if ids[middle] - middle == offset:
                inside = middle
            else:
                outside = middle
        runs.append((int(ids[start]), int(ids[inside])))
        guess = inside - start
        start = inside + 1
    return runs


def _strictly_increasing_ints(ids: List[int]) -> bool:
    """True when *ids* is a strictly increasing list of plain ints.

    Both checks run at C speed (about 15 ms for a million ids): the
    pairwise comparison through ``map`` and the ``sum`` whose result is an
    int only when no float, Decimal or similar slipped in.
    """
    try:
        if not all(map(operator.lt, ids, islice(ids, 1, None))):
            return False
        return type(sum(ids)) is int
    except TypeError:
        return False


def _difference(left: Tuple[Interval, ...], right: Tuple[Interval, ...]) -> Tuple[Interval, ...]:
    """Intervals of *left* minus those of *right*, both canonical.  O(k + m)."""
    result: List[Interval] = []
    count = len(right)
    index = 0
    for first, last in left:
        while index < count and right[index][1] < first:
            index += 1
        cursor = first
        probe = index
        while probe < count and right[probe][0] <= last:
            cut_first, cut_last = right[probe]
            if cut_first > cursor:
                result.append((cursor, cut_first - 1))
            if cut_last >= last:
                cursor = last + 1
                break
            cursor = cut_last + 1
            probe += 1
        if cursor <= last:
            result.append((cursor, last))
        # right[probe] may still reach into the next interval of left.
        index = probe
    return tuple(result)


def _intersection(left: Tuple[Interval, ...], right: Tuple[Interval, ...]) -> Tuple[Interval, ...]:
    """Intervals common to *left* and *right*, both canonical.  O(k + m)."""
    result: List[Interval] = []
    i = j = 0
    while i < len(left) and j < len(right):
        left_first, left_last = left[i]
        right_first, right_last = right[j]
        low = left_first if left_first > right_first else right_first
        high = left_last if left_last < right_last else right_last
        if low <= high:
            result.append((low, high))
        if left_last < right_last:
            i += 1
        else:
            j += 1
    return tuple(result)


@attrs.frozen(slots=True, repr=False)
class RangeSet:
    """An immutable set of non-negative ids stored as canonical intervals.

    ``intervals`` holds inclusive ``(first, last)`` pairs, sorted, disjoint
    and non-adjacent.  The constructor accepts pairs in any order (even
    overlapping) and canonicalizes them; the class methods are the usual way
    in.  Equality and hashing compare the canonical intervals.
    """

    intervals: Tuple[Interval, ...] = attrs.field(default=(), converter=_convert_intervals)

    EMPTY: ClassVar[RangeSet]

    # -- construction ------------------------------------------------------

    @classmethod
    def _make(cls, intervals: Tuple[Interval, ...]) -> RangeSet:
        """Wrap intervals already known to be canonical, skipping the converter."""
        instance = object.__new__(cls)
        object.__setattr__(instance, "intervals", intervals)
        return instance

    @classmethod
    def parse(cls, text: str) -> RangeSet:
        """Parse wire notation such as ``1-7,34-38,41``.

        Parts may be unsorted, overlapping or touching.  Raises
        :class:`RangeSetError` naming the first bad part (1-based) for the
        empty string, empty parts, signs, spaces, non-ASCII digits, missing
        bounds, reversed ranges and extra dashes.  Leading zeros are
        accepted (``007`` is 7).  O(k) for canonical input, O(k log k)
        otherwise; ranges are never expanded.
        """
        if not isinstance(text, str):
            raise TypeError(f"range set text must be str, not {type(text).__name__}")
        if not text:
            raise RangeSetError("range set '' is empty: a range set needs at least one id")
        intervals: List[Interval] = []
        append = intervals.append
        for index, part in enumerate(text.split(","), 1):
            first_text, dash, last_text = part.partition("-")
            # isdigit() alone would admit non-ASCII digits such as '\u0661'.
            if not (first_text.isdigit() and first_text.isascii()) or (
                dash and not (last_text.isdigit() and last_text.isascii())
            ):
                raise _part_error(text, index, part, _why_bad(part))
            if len(first_text) > _MAX_DIGITS or len(last_text) > _MAX_DIGITS:
                raise _part_error(text, index, part, f"has more than {_MAX_DIGITS} digits")
            first = int(first_text)
            if dash:
                last = int(last_text)
                if first > last:
                    raise _part_error(text, index, part, f"is reversed ({first} > {last})")
                append((first, last))
            else:
                append((first, first))
        return cls._make(_normalize(intervals))

    @classmethod
    def from_ids(cls, ids: Iterable[int]) -> RangeSet:
        """Build the set of *ids*, given in any order, duplicates allowed.

        Fast path: a list (or tuple) that is already strictly increasing is
        recognised at C speed and split into runs by galloping search, so a
        million sorted ids take a few tens of milliseconds at most, O(n) C
        steps plus O(r log n) Python steps for r runs.  Anything else is
        deduplicated and sorted first: O(n log n).  Raises
        :class:`RangeSetError` for negative ids and TypeError for non-ints.
        """
        if isinstance(ids, RangeSet):
            return ids
        if isinstance(ids, range) and ids.step == 1:
            if not ids:
                return cls.EMPTY
            return cls.from_range(ids.start, ids.stop - 1)
        values = ids if isinstance(ids, (list, tuple)) else list(ids)
        if not values:
            return cls.EMPTY
        if not _strictly_increasing_ints(values):
            values = sorted(set(map(operator.index, values)))
        if values[0] < 0:
            raise RangeSetError(f"element ids cannot be negative (got {int(values[0])})")
        return cls._make(tuple(_runs_of_increasing(values)))

    @classmethod
    def from_range(cls, first: int, last: int) -> RangeSet:
        """The ids ``first..last`` inclusive.  O(1)."""
        first = int(operator.index(first))
        last = int(operator.index(last))
        if first < 0:
            raise RangeSetError(f"range {first}-{last} starts below 0")
        if first > last:
            raise RangeSetError(f"range {first}-{last} is reversed ({first} > {last})")
        return cls._make(((first, last),))

    @classmethod
    def single(cls, n: int) -> RangeSet:
        """The set holding only *n*.  O(1)."""
        return cls.from_range(n, n)

    # -- text --------------------------------------------------------------

    def __str__(self) -> str:
        """Canonical wire text, e.g. ``1-7,34-38,41``; ``""`` for the empty set.  O(k)."""
        return ",".join(
            str(first) if first == last else f"{first}-{last}" for first, last in self.intervals
        )

    format = __str__

    def __repr__(self) -> str:
        return f"RangeSet({str(self)!r})"

    # -- container protocol ------------------------------------------------

    def __len__(self) -> int:
        """Number of ids (not intervals).  O(k)."""
        return sum(last - first + 1 for first, last in self.intervals)

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def __iter__(self) -> Iterator[int]:
        """The ids in ascending order, produced lazily."""
        return chain.from_iterable(range(first, last + 1) for first, last in self.intervals)

    def _locate(self, n: int) -> int:
        """Index of the last interval whose first id is <= n, or -1.  O(log k)."""
        # (first, last) < (n + 1,) exactly when first <= n.
        return bisect_left(self.intervals, (n + 1,)) - 1

    def __contains__(self, item: object) -> bool:
        """Membership by binary search, O(log k); non-integers are never members."""
        try:
            n = operator.index(item)  # type: ignore[arg-type]
        except TypeError:
            return False
        index = self._locate(n)
        return index >= 0 and self.intervals[index][1] >= n

    @property
    def first(self) -> int:
        """Smallest id; ValueError when empty."""
        if not self.intervals:
            raise ValueError("the empty range set has no first id")
        return self.intervals[0][0]

    @property
    def last(self) -> int:
        """Largest id; ValueError when empty."""
        if not self.intervals:
            raise ValueError("the empty range set has no last id")
        return self.intervals[-1][1]

    # -- set algebra (all linear in interval counts, never expanding) -------

    def union(self, other: RangeSet) -> RangeSet:
        """Ids in either set.  O(k + m): the concatenation is two sorted runs,
        which Timsort merges in one linear pass, then touching runs coalesce."""
        if not other.intervals:
            return self
        if not self.intervals:
            return other
        return RangeSet._make(_coalesce_sorted(sorted(self.intervals + other.intervals)))

    def difference(self, other: RangeSet) -> RangeSet:
        """Ids in this set but not in *other*.  O(k + m)."""
        if not self.intervals or not other.intervals:
            return self
        return RangeSet._make(_difference(self.intervals, other.intervals))

    def intersection(self, other: RangeSet) -> RangeSet:
        """Ids in both sets.  O(k + m)."""
        if not self.intervals or not other.intervals:
            return RangeSet.EMPTY
        return RangeSet._make(_intersection(self.intervals, other.intervals))

    def issubset(self, other: RangeSet) -> bool:
        """True when every id of this set is in *other*.  O(k log m)."""
        for first, last in self.intervals:
            index = other._locate(first)
            if index < 0 or other.intervals[index][1] < last:
                return False
        return True

    def issuperset(self, other: RangeSet) -> bool:
        """True when every id of *other* is in this set.  O(m log k)."""
        return other.issubset(self)

    def isdisjoint(self, other: RangeSet) -> bool:
        """True when the sets share no id.  O(k + m)."""
        return not _intersection(self.intervals, other.intervals)

    def __or__(self, other: object) -> RangeSet:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self.union(other)

    def __sub__(self, other: object) -> RangeSet:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self.difference(other)

    def __and__(self, other: object) -> RangeSet:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self.intersection(other)


RangeSet.EMPTY = RangeSet._make(())
