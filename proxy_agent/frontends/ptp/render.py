"""How one client is sent element attributes: the rules its dialect sets, and the renderer
that turns a row of an element's attributes into encoded PTP arguments (cached per value, so
that a million jobs alike cost one rendering of what they share).

Shared by the initial model (:mod:`.snapshot`) and by the changes a view drains
(:mod:`.view`); ids are range-set texts made here too.
"""

from __future__ import annotations

from array import array
from itertools import groupby, repeat
from operator import add, sub
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ...protocol.messages import ElementKind
from ...protocol.rangeset import RangeSet
from ...protocol.wire import _ARG_PREFIXES, encode_args
from ...service.model import REFERENCES, Kind
from . import mapping

__all__ = ["MAX_GROUPS_PER_EVENT", "NATIVE_RULES", "PTP_KIND", "RenderRules", "Renderer", "WireEvent", "ids_text"]

#: An event before encoding: (event id, arguments in the documented layout).
WireEvent = Tuple[int, List[str]]

#: Range groups per NEW/CHANGE event, so no frame grows without bound.
MAX_GROUPS_PER_EVENT = 2000
#: Distinct values a slot's render cache takes before it checks that values recur.
_CACHE_TRIAL = 4096
#: Arguments shorter than this have their length prefix ready made.
_SHORT = len(_ARG_PREFIXES)

PTP_KIND = {
    Kind.MACHINE: ElementKind.MACHINE,
    Kind.NODE: ElementKind.NODE,
    Kind.QUEUE: ElementKind.QUEUE,
    Kind.JOB: ElementKind.JOB,
    Kind.PROCESS: ElementKind.PROCESS,
}


class RenderRules:
    """How values are written for one client (its dialect decides).

    ``text`` escapes a text value (None: sent as it is); ``arrays`` allows multi-valued
    attributes in element events; ``omit`` are attribute ids never put in element events;
    ``integer_ids`` are attribute ids of INTEGER type whose values go through ``integer``
    (which returns the text to send, or None to leave the attribute out); ``max_id`` is the
    highest element id the client can hold.
    """

    def __init__(
        self,
        text: Optional[Callable[[str], str]] = None,
        arrays: bool = True,
        integer_ids: Iterable[str] = (),
        integer: Optional[Callable[[str], Optional[str]]] = None,
        omit: Iterable[str] = (),
        max_id: Optional[int] = None,
    ) -> None:
        self.text = text
        self.arrays = arrays
        self.integer_ids = frozenset(integer_ids) if integer is not None else frozenset()
        self.integer = integer
        self.omit = frozenset(omit)
        self.max_id = max_id


NATIVE_RULES = RenderRules()


class Ref:
    """A reference attribute in a shared snapshot: ``prefix`` + the id of service key ``key``,
    filled in per client."""

    __slots__ = ("prefix", "key")

    def __init__(self, prefix: str, key: int) -> None:
        self.prefix = prefix
        self.key = key


class _IdPrefix:
    """A reference attribute rendered for a known base id: ``prefix`` + (base + key)."""

    __slots__ = ("prefix", "base", "other")

    def __init__(self, prefix: str, base: int, other) -> None:
        self.prefix = prefix
        self.base = base
        #: how a value that is not a key (a text) is rendered
        self.other = other


class _Checked:
    """A text attribute whose text passes a check first: ``prefix`` + ``check(text)``, or
    nothing when the check returns None.  Values that are not one text go to ``other``."""

    __slots__ = ("prefix", "check", "other")

    def __init__(self, prefix: str, check: Callable[[str], Optional[str]], other) -> None:
        self.prefix = prefix
        self.check = check
        self.other = other

    def __call__(self, value) -> list:
        """The arguments of one value."""
        if value.__class__ is str:
            text = self.check(value)
            return [] if text is None else [self.prefix + text]
        return self.other(value)


class Renderer:
    """Renders value rows of one element kind into ``key=value`` arguments.

    With a ``base`` the references become ids of that client; without one (a renderer shared
    by several clients) they stay :class:`Ref` markers.
    """

    __slots__ = ("kind", "schema", "rules", "base", "plan", "version", "_caches", "_rows", "_whole", "_whole_hits")

    def __init__(self, kind: Kind, schema, rules: RenderRules, base: Optional[int]) -> None:
        self.kind = kind
        self.schema = schema
        self.rules = rules
        self.base = base
        # per slot: a prefix text, a checked or id-prefixed entry, or a function of the value
        self.plan: List[Any] = []
        self.version = -1
        self._caches = []
        self._rows = 0
        self._whole: Optional[dict] = None
        self._whole_hits = 0

    def _refresh(self) -> None:
        keys = self.schema.keys
        self.plan = [self._entry(name) for name in keys]
        self.version = self.schema.version
        # rendered values per slot (see encoded); entries may have changed with the schema
        self._caches: List[Optional[dict]] = [{} for _ in keys]
        #: rows encoded since (to tell the slots whose values hardly recur)
        self._rows = 0
        #: whole rows rendered: row -> (argument count, pieces); None once rows hardly recur.
        #: Only processes: other kinds' equal rows are grouped into one event already.
        self._whole = {} if self.kind is Kind.PROCESS else None
        self._whole_hits = 0

    def _entry(self, name: str):
        kind, rules = self.kind, self.rules
        special = mapping.SPECIAL.get((kind, name))
        escape = rules.text
        if special == "state":
            return lambda value: mapping.state_args(kind, value)
        if special == "executable":
            if escape is None:
                return mapping.executable_args
            return lambda value: mapping.executable_args(escape(value))
        ptp_id = mapping.ptp_attribute(kind, name)
        if ptp_id is None or ptp_id in rules.omit:
            return None
        prefix = ptp_id + "="
        if name in REFERENCES:
            base = self.base
            if base is None:
                markers: Dict[int, Ref] = {}  # one marker per element referred to

                def marker(value, prefix=prefix, markers=markers):
                    if value.__class__ is not int:
                        return [prefix + str(value)]
                    ref = markers.get(value)
                    if ref is None:
                        ref = markers[value] = Ref(prefix, value)
                    return [ref]

                return marker
            return _IdPrefix(prefix, base, lambda value: [prefix + str(value)])
        arrays = rules.arrays
        check = rules.integer if ptp_id in rules.integer_ids else None
        if check is not None:
            # not one text: absent (never a wrong number)
            return _Checked(prefix, check, lambda value: [])
        if escape is None and arrays:
            return prefix  # the common case: prefix + text

        def others(value, prefix=prefix, escape=escape, arrays=arrays):
            if not arrays:
                return []
            if escape is None:
                return [prefix + item for item in value]
            return [prefix + escape(item) for item in value]

        if escape is None:
            return _Checked(prefix, str, others)
        return _Checked(prefix, escape, others)

    def cleared(self, slots: Iterable[int]) -> List[str]:
        """``key=`` arguments for attributes that no longer have a value: without them a
        client would keep showing the value it was last sent."""
        kind, names = self.kind, self.schema.keys
        out: List[str] = []
        for i in slots:
            name = names[i]
            special = mapping.SPECIAL.get((kind, name))
            if special == "state":
                out.extend(arg.partition("=")[0] + "=" for arg in mapping.state_args(kind, ""))
            elif special == "executable":
                out.extend(("execName=", "execPath="))
            else:
                ptp_id = mapping.ptp_attribute(kind, name)
                if ptp_id is not None and ptp_id not in self.rules.integer_ids:
                    out.append(ptp_id + "=")
        return out

    def encoded(self, values: tuple, parts: list) -> int:
        """Append a value row's arguments to ``parts`` as encoded bytes (and :class:`Ref`
        markers); returns how many arguments they are.

        Equal rows recur among elements of different parents (the processes of many jobs):
        what a whole row renders to is remembered, until rows turn out to hardly recur.
        Most values recur too (states, users, queues, node references): what a value renders
        to is remembered per slot, so a big snapshot encodes each distinct value once.  A slot
        whose values hardly recur (names, ids) stops being remembered.
        """
        if self.version != self.schema.version:
            self._refresh()
        whole = self._whole
        if whole is None:
            return self._encoded(values, parts)
        hit = whole.get(values)
        if hit is not None:
            self._whole_hits += 1
            parts += hit[1]
            return hit[0]
        start = len(parts)
        count = self._encoded(values, parts)
        # with a base every piece is bytes (ids written in): one piece
        whole[values] = (count, (b"".join(parts[start:]),) if self.base is not None else tuple(parts[start:]))
        if len(whole) > _CACHE_TRIAL and self._whole_hits * 2 < len(whole):
            self._whole = None  # rows hardly recur
        return count

    def _encoded(self, values: tuple, parts: list) -> int:
        caches = self._caches
        plan = self.plan
        if len(caches) != len(plan):
            caches.extend({} for _ in range(len(plan) - len(caches)))
        self._rows += 1
        count = 0
        i = -1
        for value in values:
            i += 1
            if value is None:
                continue
            cache = caches[i]
            if cache is not None:
                hit = cache.get(value)
                if hit is not None:
                    if hit.__class__ is bytes:  # one argument (most values)
                        count += 1
                        parts.append(hit)
                    else:
                        count += hit[0]
                        parts += hit[1]
                    continue
            entry = plan[i]
            if entry is None:
                continue
            if entry.__class__ is str:
                if value.__class__ is str:
                    arg = entry + value
                    if len(arg) < _SHORT and arg.isascii():
                        hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                    else:
                        hit = encode_args((arg,))
                else:
                    args = [entry + item for item in value]
                    hit = (len(args), (encode_args(args),) if args else ())
            elif entry.__class__ is _Checked:
                if value.__class__ is str:
                    text = entry.check(value)
                    if text is None:
                        hit = (0, ())
                    else:
                        arg = entry.prefix + text
                        if len(arg) < _SHORT and arg.isascii():
                            hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                        else:
                            hit = encode_args((arg,))
                else:
                    args = entry.other(value)
                    hit = (len(args), tuple(_encode_parts(args)))
            elif entry.__class__ is _IdPrefix:
                if value.__class__ is int:
                    arg = entry.prefix + str(entry.base + value)
                    hit = (_ARG_PREFIXES[len(arg)] + arg).encode()
                else:
                    args = entry.other(value)
                    hit = (len(args), tuple(_encode_parts(args)))
            else:
                args = entry(value)
                hit = (len(args), tuple(_encode_parts(args)))
            if cache is not None:
                cache[value] = hit
                if len(cache) > _CACHE_TRIAL and len(cache) * 2 > self._rows:
                    caches[i] = None  # values of this slot hardly recur
                    cache.clear()
            if hit.__class__ is bytes:
                count += 1
                parts.append(hit)
            else:
                count += hit[0]
                parts += hit[1]
        return count

    def args(self, values: Sequence) -> list:
        """``key=value`` arguments of a value row (and :class:`Ref` markers when shared)."""
        if self.version != self.schema.version:
            self._refresh()
        out: list = []
        for value, entry in zip(values, self.plan):
            if value is None or entry is None:
                continue
            if entry.__class__ is str:
                if value.__class__ is str:
                    out.append(entry + value)
                else:
                    out.extend(entry + item for item in value)
            elif entry.__class__ is _IdPrefix:
                if value.__class__ is int:
                    out.append(entry.prefix + str(entry.base + value))
                else:
                    out.extend(entry.other(value))
            else:
                out.extend(entry(value))
        return out


class Ranges:
    """Element ids of a group in a shared snapshot: ascending service keys, written as a range
    set once a client's base id is known.  Which keys stand alone and which begin or end a run
    does not depend on the base id: that is worked out once, as a format and the keys it takes
    (in a flat array, read in order), so that a client costs one addition and one formatting
    per number.  Runs keep only their ends: a million jobs' groups stay small."""

    __slots__ = ("numbers", "form")

    def __init__(self, keys: List[int]) -> None:
        form, numbers = _range_layout(keys)
        self.numbers, self.form = array("q", numbers), form

    def data(self, base: int) -> bytes:
        return self.form % tuple(map(add, self.numbers, repeat(base)))


def ids_bytes(keys: List[int], base: int) -> bytes:
    """The ids of ascending service keys for the client with ``base``, as range-set text
    (see :func:`_range_layout`)."""
    form, numbers = _range_layout(keys)
    return form % tuple(map(add, numbers, repeat(base)))


def _range_layout(keys: List[int]) -> Tuple[bytes, List[int]]:
    """How ascending keys are written as a range set, whatever the base id: a format and the
    keys it takes (to which the base id is added).  Runs of adjacent keys are ``first-last``,
    the rest one by one.  Most groups have no two keys adjacent, or a few runs among many
    keys: the gaps between keys are worked out once, and the runs found by searching them
    for a gap of one (in C), so that the keys between runs cost no loop of their own."""
    n = len(keys)
    if n == 1:
        return b"%d", keys
    if keys[-1] - keys[0] == n - 1:
        return b"%d-%d", [keys[0], keys[-1]]
    gaps = list(map(sub, keys[1:], keys))  # gaps[i] = keys[i + 1] - keys[i]
    find = gaps.index
    try:
        first = find(1)
    except ValueError:
        return _separated(n), keys
    forms: List[bytes] = []
    numbers: List[int] = []
    done = 0  # keys before this one are placed
    while True:
        last = first  # the run is keys[first] .. keys[last + 1]
        while last + 1 < n - 1 and gaps[last + 1] == 1:
            last += 1
        if done < first:
            forms.append(_separated(first - done))
            numbers += keys[done:first]
        forms.append(b"%d-%d")
        numbers += (keys[first], keys[last + 1])
        done = last + 2
        try:
            first = find(1, done)
        except ValueError:
            break
    if done < n:
        forms.append(_separated(n - done))
        numbers += keys[done:]
    return b",".join(forms), numbers


def _separated(count: int) -> bytes:
    """A format of ``count`` numbers separated by commas."""
    if count < len(_FORMATS):
        return _FORMATS[count]
    return b",".join([b"%d"] * count)


_FORMATS = [b",".join([b"%d"] * count) for count in range(64)]


def _encode_parts(items: list) -> list:
    """Arguments (texts, :class:`Ref`, :class:`Ranges`, ints for ids) as constant bytes
    where they do not depend on the client, markers where they do."""
    parts: list = []
    run: List[str] = []
    for item in items:
        if item.__class__ is str:
            run.append(item)
            continue
        if run:
            parts.append(encode_args(run))
            run = []
        parts.append(item)
    if run:
        parts.append(encode_args(run))
    return parts


def joined_parts(parts: list) -> list:
    """Consecutive bytes in ``parts`` joined into one."""
    out: list = []
    for cls, run in groupby(parts, type):
        if cls is bytes:
            out.append(b"".join(run))
        else:
            out.extend(run)
    return out


def ids_text(members: List[int]) -> str:
    """Range-set text for ids (usually ascending runs, often a single id)."""
    if len(members) == 1:
        return str(members[0])
    first, last = members[0], members[-1]
    if last - first == len(members) - 1 and members == list(range(first, last + 1)):
        return f"{first}-{last}"
    return str(RangeSet.from_ids(members))

