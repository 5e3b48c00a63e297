"""The events of the model's elements: NEW_*, *_CHANGE, REMOVE_* and REMOVE_ALL (and
FILTER_DEF), with the range groups they carry.

An agent writes these through its view (:mod:`proxy_agent.frontends.ptp.view`), never as
objects: only clients and tests make them.  :mod:`.messages` gives them under
its own names, loading this module the first time one is asked for.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple, Union

import attrs

from .attributes import split_attribute
from .event_base import KIND_BY_EVENT, ArgumentError, ElementKind, Event, EventId, as_tuple, count_arg
from .rangeset import RangeSet, RangeSetError

__all__ = ["ElementChange", "ElementGroup", "FilterDef", "NewElements", "ProcessChange", "RemoveAll",
           "RemoveElements", "RemoveProcesses"]


def _attr_pairs(values: Iterable[Union[str, Tuple[str, str]]]) -> Tuple[Tuple[str, str], ...]:
    out = []
    for item in values:
        if isinstance(item, str):
            out.append(split_attribute(item))
        else:
            out.append((item[0], item[1]))
    return tuple(out)


@attrs.frozen(slots=True)
class ElementGroup:
    """Elements sharing attributes: a range set of numeric ids (or one string id)."""

    ids: Union[RangeSet, str]
    attributes: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_attr_pairs)

    def id_list(self) -> list:
        """Element ids as strings (range sets expanded)."""
        if isinstance(self.ids, RangeSet):
            return [str(i) for i in self.ids]
        return [self.ids]


_RANGE_SET_CHARS = frozenset("0123456789,-")


def _parse_ids(text: str) -> Union[RangeSet, str]:
    """A range set when the text could only be one, else a string element id.

    String ids (``100:job-7``) may contain digits and '-' too, so only text
    made of nothing but digits, ',' and '-' is read as a range set (and
    must then be a valid one).
    """
    if not text:
        raise ArgumentError("empty element id")
    if _RANGE_SET_CHARS.issuperset(text):
        return RangeSet.parse(text)
    return text


def _encode_groups(args: list, groups: Sequence[ElementGroup]) -> None:
    args.append(str(len(groups)))
    for group in groups:
        args.append(str(group.ids))
        args.append(str(len(group.attributes)))
        args.extend(f"{k}={v}" for k, v in group.attributes)


def _decode_groups(args: Sequence[str], pos: int) -> Tuple[Tuple[ElementGroup, ...], int]:
    count = count_arg(args, pos, "number of ranges")
    pos += 1
    groups = []
    for n in range(count):
        if pos + 2 > len(args):
            raise ArgumentError(f"range group {n + 1} of {count} is missing")
        try:
            ids = _parse_ids(args[pos])
        except (RangeSetError, ArgumentError) as exc:
            raise ArgumentError(f"range group {n + 1}: bad element ids: {exc}") from None
        nattrs = count_arg(args, pos + 1, f"attribute count of group {n + 1}")
        pos += 2
        if pos + nattrs > len(args):
            raise ArgumentError(f"range group {n + 1} declares {nattrs} attributes, {len(args) - pos} present")
        try:
            pairs = tuple(split_attribute(a) for a in args[pos:pos + nattrs])
        except ValueError as exc:
            raise ArgumentError(f"range group {n + 1}: {exc}") from None
        groups.append(ElementGroup(ids, pairs))
        pos += nattrs
    return tuple(groups), pos


@attrs.frozen(slots=True)
class FilterDef(Event):
    """Filter definitions; this agent announces none, but the layout is opaque strings."""

    tid: int
    args: Tuple[str, ...] = attrs.field(default=(), converter=as_tuple)
    event_id = EventId.FILTER_DEF

    def to_args(self) -> list:
        return list(self.args)

    @classmethod
    def from_args(cls, tid, args, event_id):
        return cls(tid, args)


@attrs.frozen(slots=True)
class NewElements(Event):
    """NEW_MACHINE / NEW_NODE / NEW_QUEUE / NEW_JOB / NEW_PROCESS.

    For NEW_PROCESS the parent is the job and the groups' ids are the ranks
    of the new processes within that job (0 .. n-1), not element ids.
    """

    tid: int
    kind: ElementKind
    parent_id: str
    groups: Tuple[ElementGroup, ...] = attrs.field(converter=as_tuple)

    @property
    def event_id(self) -> EventId:  # type: ignore[override]
        return self.kind.new_event

    def to_args(self) -> list:
        args = [str(self.parent_id)]
        _encode_groups(args, self.groups)
        return args

    @classmethod
    def from_args(cls, tid, args, event_id):
        if not args:
            raise ArgumentError(f"{event_id.name}: missing parent id")
        groups, pos = _decode_groups(args, 1)
        if pos != len(args):
            raise ArgumentError(f"{event_id.name}: {len(args) - pos} arguments after the last range group")
        return cls(tid, KIND_BY_EVENT[event_id], args[0], groups)


@attrs.frozen(slots=True)
class ElementChange(Event):
    """JOB_CHANGE / MACHINE_CHANGE / NODE_CHANGE / QUEUE_CHANGE (and RM_CHANGE with kind None)."""

    tid: int
    kind: Optional[ElementKind] = attrs.field()
    groups: Tuple[ElementGroup, ...] = attrs.field(converter=as_tuple)

    @kind.validator
    def _not_process(self, attribute, value) -> None:
        # PROCESS_CHANGE carries the job id first: that layout is ProcessChange.
        if value is ElementKind.PROCESS:
            raise ValueError("process changes are ProcessChange events (they need the job id)")

    @property
    def event_id(self) -> EventId:  # type: ignore[override]
        return EventId.RM_CHANGE if self.kind is None else self.kind.change_event

    def to_args(self) -> list:
        args: list = []
        _encode_groups(args, self.groups)
        return args

    @classmethod
    def from_args(cls, tid, args, event_id):
        groups, pos = _decode_groups(args, 0)
        if pos != len(args):
            raise ArgumentError(f"{event_id.name}: {len(args) - pos} arguments after the last range group")
        kind = None if event_id == EventId.RM_CHANGE else KIND_BY_EVENT[event_id]
        return cls(tid, kind, groups)


@attrs.frozen(slots=True)
class ProcessChange(Event):
    """PROCESS_CHANGE: the job's element id, then groups whose ids are ranks within that job."""

    tid: int
    job_id: str
    groups: Tuple[ElementGroup, ...] = attrs.field(converter=as_tuple)
    event_id = EventId.PROCESS_CHANGE
    kind = ElementKind.PROCESS

    def to_args(self) -> list:
        args = [str(self.job_id)]
        _encode_groups(args, self.groups)
        return args

    @classmethod
    def from_args(cls, tid, args, event_id):
        if not args:
            raise ArgumentError("PROCESS_CHANGE: missing job id")
        groups, pos = _decode_groups(args, 1)
        if pos != len(args):
            raise ArgumentError(f"PROCESS_CHANGE: {len(args) - pos} arguments after the last range group")
        return cls(tid, args[0], groups)


@attrs.frozen(slots=True)
class RemoveElements(Event):
    """REMOVE_JOB / REMOVE_MACHINE / REMOVE_NODE / REMOVE_QUEUE."""

    tid: int
    kind: ElementKind
    ids: Union[RangeSet, str]

    @property
    def event_id(self) -> EventId:  # type: ignore[override]
        return self.kind.remove_event

    def to_args(self) -> list:
        return [str(self.ids)]

    @classmethod
    def from_args(cls, tid, args, event_id):
        if len(args) != 1:
            raise ArgumentError(f"{event_id.name} takes one id range, got {len(args)} arguments")
        try:
            ids = _parse_ids(args[0])
        except (RangeSetError, ArgumentError) as exc:
            raise ArgumentError(f"{event_id.name}: {exc}") from None
        return cls(tid, KIND_BY_EVENT[event_id], ids)


@attrs.frozen(slots=True)
class RemoveProcesses(Event):
    """REMOVE_PROCESS: the job's element id, then the ranks (within that job) of the processes removed."""

    tid: int
    job_id: str
    ids: Union[RangeSet, str]
    event_id = EventId.REMOVE_PROCESS
    kind = ElementKind.PROCESS

    def to_args(self) -> list:
        return [str(self.job_id), str(self.ids)]

    @classmethod
    def from_args(cls, tid, args, event_id):
        if len(args) != 2:
            raise ArgumentError(f"REMOVE_PROCESS takes a job id and an id range, got {len(args)} arguments")
        try:
            ids = _parse_ids(args[1])
        except (RangeSetError, ArgumentError) as exc:
            raise ArgumentError(f"REMOVE_PROCESS: {exc}") from None
        return cls(tid, args[0], ids)


@attrs.frozen(slots=True)
class RemoveAll(Event):
    tid: int
    event_id = EventId.REMOVE_ALL

    def to_args(self) -> list:
        return []

    @classmethod
    def from_args(cls, tid, args, event_id):
        if args:
            raise ArgumentError(f"REMOVE_ALL takes no arguments, got {len(args)}")
        return cls(tid)
