"""A co-allocated multi-part job as data: its parts (:class:`Part`), the job
(:class:`MultiJobDescription`), the vocabulary of start and communication types, the limits,
and the checks every value of either written form goes through (:mod:`.description`)."""

from __future__ import annotations

import enum
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import attrs


from ..jobs import JobSpec

__all__ = ["BarrierRelease", "CommsType", "DescriptionError", "MAX_COUNT", "MAX_DESCRIPTION_SIZE", "MAX_NESTING",
           "MAX_PARTS", "MultiJobDescription", "Part", "StartType", "enum_member", "kind_of"]

#: The most parts one multi-part job may have.
MAX_PARTS = 256
#: The most processes one part may start.
MAX_COUNT = 4096
#: The longest description text (characters) either parser reads.
MAX_DESCRIPTION_SIZE = 1024 * 1024
#: How deeply requests and value lists may nest in the multi-request form.
MAX_NESTING = 32
#: Environment names the agent sets itself: a description may not set them.
RESERVED_ENV_PREFIXES = ("PROXY_AGENT_", "GLOBUS_GRAM_")


class StartType(enum.Enum):
    """How a part takes part in the start barrier."""

    #: its processes wait at the barrier; the whole job fails if the part ends before it
    STRICT_BARRIER = "strict-barrier"
    #: its processes wait at the barrier; an early end does not fail the job
    LOOSE_BARRIER = "loose-barrier"
    #: it does not wait at the barrier and runs on independently
    NO_BARRIER = "no-barrier"

    @property
    def waits(self) -> bool:
        return self is not StartType.NO_BARRIER


class CommsType(enum.Enum):
    """Whether a part's rank-0 process joins the group that talks between parts."""

    #: joins the inter-part group; joining waits until every such part has joined
    BLOCKING_JOIN = "blocking-join"
    #: stays out of the inter-part group
    INDEPENDENT = "independent"


class BarrierRelease(enum.Enum):
    """When the start barrier opens."""

    #: as soon as every process of every barrier part has checked in
    AUTO = "auto"
    #: only when the owner releases it explicitly (``barrier_release``)
    EXPLICIT = "explicit"


class DescriptionError(ValueError):
    """A description is malformed.  ``part_index`` / ``part_label`` / ``field`` say where,
    when known; ``line`` and ``column`` (1-based) locate an error in the multi-request form."""

    def __init__(
        self,
        reason: str,
        *,
        field: Optional[str] = None,
        part_index: Optional[int] = None,
        part_label: Optional[str] = None,
        line: Optional[int] = None,
        column: Optional[int] = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.part_index = part_index
        self.part_label = part_label
        self.line = line
        self.column = column
        super().__init__(self._compose())

    def _compose(self) -> str:
        where: List[str] = []
        if self.part_index is not None:
            part = f"part {self.part_index}"
            if self.part_label is not None:
                part += f" ({self.part_label!r})"
            where.append(part)
        if self.field is not None:
            where.append(self.field)
        text = ": ".join(where + [self.reason]) if where else self.reason
        if self.line is not None:
            text = f"line {self.line}, column {self.column}: {text}"
        return text

    def located(self, **changes: Any) -> "DescriptionError":
        """The same error with more of its place filled in (what is known already stays)."""
        fields = dict(
            field=self.field,
            part_index=self.part_index,
            part_label=self.part_label,
            line=self.line,
            column=self.column,
        )
        for key, value in changes.items():
            if fields.get(key) is None:
                fields[key] = value
        return DescriptionError(self.reason, **fields)


def description_text(text: Union[str, bytes]) -> str:
    """A description as text: UTF-8 and within :data:`MAX_DESCRIPTION_SIZE` characters, or
    :class:`DescriptionError` saying which it is not."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DescriptionError(f"is not UTF-8 text (byte {error.start})") from None
    if len(text) > MAX_DESCRIPTION_SIZE:
        raise DescriptionError(f"is longer than {MAX_DESCRIPTION_SIZE} characters")
    return text


# --------------------------------------------------------------------------- checks

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_QUEUE_WORD = re.compile(r"[^\s:\x00]+\Z")


def _text(field: str, value: Any, *, empty: bool = False, limit: int = 64 * 1024) -> str:
    if not isinstance(value, str):
        raise DescriptionError(f"must be text, not {kind_of(value)}", field=field)
    if not empty and value == "":
        raise DescriptionError("must not be empty", field=field)
    if "\x00" in value:
        raise DescriptionError("must not contain a NUL character", field=field)
    if len(value) > limit:
        raise DescriptionError(f"is longer than {limit} characters", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise DescriptionError("is not valid text (a lone surrogate)", field=field) from None
    return value


def _opt_text(field: str, value: Any) -> Optional[str]:
    return None if value is None else _text(field, value)


def _count(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DescriptionError(f"must be a whole number, not {kind_of(value)}", field=field)
    if not low <= value <= high:
        raise DescriptionError(f"must be from {low} to {high}, not {value}", field=field)
    return value


def _opt_count(field: str, value: Any, high: int) -> Optional[int]:
    return None if value is None else _count(field, value, 1, high)


def _queue(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = _text("queue", value)
    words = text.split(":")
    if len(words) > 2 or not all(_QUEUE_WORD.match(word) for word in words):
        raise DescriptionError(
            f"must be QUEUE or SCHEDULER:QUEUE without blanks, not {text!r}", field="queue"
        )
    return text


def _label(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = _text("label", value, limit=128)
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in text):
        raise DescriptionError("must not contain control characters", field="label")
    return text


def _arguments(value: Any) -> Tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise DescriptionError(f"must be a list of texts, not {kind_of(value)}", field="arguments")
    if len(value) > 4096:
        raise DescriptionError("has more than 4096 items", field="arguments")
    return tuple(_text(f"arguments[{n}]", item, empty=True) for n, item in enumerate(value))


def _environment(value: Any) -> Tuple[Tuple[str, str], ...]:
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for n, pair in enumerate(value):
            if isinstance(pair, str) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise DescriptionError(
                    f"item {n} must be a pair (NAME, VALUE), not {kind_of(pair)}", field="environment"
                )
            items.append((pair[0], pair[1]))
    else:
        raise DescriptionError(
            f"must be an object or a list of (NAME, VALUE) pairs, not {kind_of(value)}", field="environment"
        )
    if len(items) > 4096:
        raise DescriptionError("has more than 4096 variables", field="environment")
    seen = set()
    checked = []
    for name, setting in items:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise DescriptionError(f"variable name {name!r} is not a shell identifier", field="environment")
        if name.upper().startswith(RESERVED_ENV_PREFIXES):
            raise DescriptionError(f"variable {name} is set by the agent and may not be given", field="environment")
        if name in seen:
            raise DescriptionError(f"variable {name} is given twice", field="environment")
        seen.add(name)
        checked.append((name, _text(f"environment {name}", setting, empty=True)))
    return tuple(checked)


def enum_member(enum_type: Any, field: str, value: Any) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member in enum_type:
            if member.value == value.strip().lower():
                return member
    legal = ", ".join(member.value for member in enum_type)
    raise DescriptionError(f"must be one of {legal}, not {value!r}", field=field)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


# --------------------------------------------------------------------------- the description


@attrs.frozen
class Part:
    """One part of a multi-part job: one job for one scheduler.

    ``queue`` is ``SCHEDULER:QUEUE`` or a queue name (``None``: the service's choice).
    ``max_wall_time`` is in minutes and ``max_memory`` in megabytes, as co-allocator users
    write them.  Every field is checked on construction; errors name the field.
    """

    executable: str = attrs.field(converter=lambda v: _text("executable", v))
    queue: Optional[str] = attrs.field(default=None, converter=_queue)
    count: int = attrs.field(default=1, converter=lambda v: _count("count", v, 1, MAX_COUNT))
    arguments: Tuple[str, ...] = attrs.field(default=(), converter=_arguments)
    environment: Tuple[Tuple[str, str], ...] = attrs.field(default=(), converter=_environment)
    label: Optional[str] = attrs.field(default=None, converter=_label)
    start_type: StartType = attrs.field(
        default=StartType.STRICT_BARRIER, converter=lambda v: enum_member(StartType, "start_type", v)
    )
    comms_type: CommsType = attrs.field(
        default=CommsType.BLOCKING_JOIN, converter=lambda v: enum_member(CommsType, "comms_type", v)
    )
    directory: Optional[str] = attrs.field(default=None, converter=lambda v: _opt_text("directory", v))
    stdout: Optional[str] = attrs.field(default=None, converter=lambda v: _opt_text("stdout", v))
    stderr: Optional[str] = attrs.field(default=None, converter=lambda v: _opt_text("stderr", v))
    project: Optional[str] = attrs.field(default=None, converter=lambda v: _opt_text("project", v))
    max_wall_time: Optional[int] = attrs.field(
        default=None, converter=lambda v: _opt_count("max_wall_time", v, 10**7)
    )
    max_memory: Optional[int] = attrs.field(
        default=None, converter=lambda v: _opt_count("max_memory", v, 10**9)
    )

    @property
    def env(self) -> Dict[str, str]:
        return dict(self.environment)

    def to_job_spec(
        self,
        *,
        name: Optional[str] = None,
        environment: Sequence[Tuple[str, str]] = (),
        client_ref: Optional[str] = None,
    ) -> JobSpec:
        """This part as an ordinary job for its scheduler.

        ``environment`` is added after the part's own variables (the runtime's contact and
        handles go there); ``name`` defaults to the part's label.
        """
        return JobSpec(
            executable=self.executable,
            arguments=self.arguments,
            environment=tuple(self.environment) + tuple(environment),
            working_dir=self.directory,
            num_procs=self.count,
            queue=self.queue,
            name=name if name is not None else self.label,
            stdout_path=self.stdout,
            stderr_path=self.stderr,
            client_ref=client_ref,
            account=self.project,
            wall_time=None if self.max_wall_time is None else self.max_wall_time * 60,
            memory=self.max_memory,
        )


def _parts(value: Any) -> Tuple[Part, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise DescriptionError(f"must be a list of parts, not {kind_of(value)}", field="parts")
    parts = tuple(value)
    if not parts:
        raise DescriptionError("a multi-part job needs at least one part", field="parts")
    if len(parts) > MAX_PARTS:
        raise DescriptionError(f"has {len(parts)} parts; at most {MAX_PARTS} are allowed", field="parts")
    labels: Dict[str, int] = {}
    for index, part in enumerate(parts):
        if not isinstance(part, Part):
            raise DescriptionError(f"must be a Part, not {kind_of(part)}", part_index=index)
        if part.label is not None:
            if part.label in labels:
                raise DescriptionError(
                    f"is already the label of part {labels[part.label]}",
                    field="label",
                    part_index=index,
                    part_label=part.label,
                )
            labels[part.label] = index
    return parts


def _boolean(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise DescriptionError(f"must be true or false, not {kind_of(value)}", field=field)


@attrs.frozen
class MultiJobDescription:
    """A co-allocated job: its parts in order and the job's own options.

    ``barrier_release`` says whether the barrier opens by itself once every barrier
    process has checked in (``AUTO``) or waits for an explicit release (``EXPLICIT``).
    ``forward_rendezvous`` asks the agent to register each part's completed level-1
    rendezvous with the job's level-2 rendezvous itself, so that no process has to.
    """

    parts: Tuple[Part, ...] = attrs.field(converter=_parts)
    name: Optional[str] = attrs.field(default=None, converter=lambda v: _opt_text("name", v))
    barrier_release: BarrierRelease = attrs.field(
        default=BarrierRelease.AUTO, converter=lambda v: enum_member(BarrierRelease, "barrier_release", v)
    )
    forward_rendezvous: bool = attrs.field(
        default=False, converter=lambda v: _boolean("forward_rendezvous", v)
    )

    def part_name(self, index: int) -> str:
        """How errors and logs name part ``index``: ``part 2 ('sub1')``."""
        label = self.parts[index].label
        return f"part {index}" + (f" ({label!r})" if label is not None else "")

    def to_job_specs(self) -> Tuple[JobSpec, ...]:
        """Each part as an ordinary job, named ``NAME.LABEL`` (or ``NAME.INDEX``)."""
        specs = []
        for index, part in enumerate(self.parts):
            suffix = part.label if part.label is not None else str(index)
            name = f"{self.name}.{suffix}" if self.name else part.label
            specs.append(part.to_job_spec(name=name))
        return tuple(specs)


