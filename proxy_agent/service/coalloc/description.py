"""The description of a co-allocated multi-part job, in its two written forms.

A multi-part job is a list of *parts*; each part is one ordinary job for one scheduler
(``scheduler:queue``, or a queue name the service routes), started with ``count``
processes.  Every part says how it takes part in the start barrier (``start_type``) and in
the communication between parts (``comms_type``).  The job as a whole says how the barrier
is released and may carry a name.

The same :class:`MultiJobDescription` is written in two forms:

JSON
    ``{"name": ..., "barrier_release": "auto"|"explicit", "forward_rendezvous": false,
    "parts": [{"queue": "slurm:debug", "count": 2, "executable": "/bin/app", "arguments":
    ["-x", "1"], "environment": {"A": "1"}, "label": "sub1", "start_type":
    "strict-barrier", "comms_type": "blocking-join"}, ...]}``; a bare list of parts is a
    job with default options.  Unknown keys are refused.

The multi-request form
    the resource specification language co-allocator users know::

        +( &(resourceManagerContact="slurm:debug")(count=2)(executable="/bin/app")
            (arguments="-x" "1")(environment=(A "1"))(label="sub1")
            (subjobStartType=strict-barrier)(subjobCommsType=blocking-join) )
         ( &(executable=/bin/other) )

    Job options go in a conjunction around the multi-request:
    ``&(name=demo)(barrierRelease=explicit)( +(&(...))(&(...)) )``.

    Lexical rules: attribute names ignore case and underscores (``subjob_start_type`` is
    ``subjobStartType``); a value is an unquoted word (any characters but white space and
    ``+&|()=<>!"'^#$``), a string in ``"..."`` or ``'...'`` in which the quote is written
    twice to stand for itself, or ``^C...C`` quoted by a character ``C`` of one's choice;
    ``a # b`` concatenates; ``$(NAME)`` is replaced by the value ``rslSubstitution``
    gives ``NAME`` earlier in the same conjunction or an enclosing one; ``(* ... *)`` is
    a comment.

Both parsers check every value and raise :class:`DescriptionError` naming the part (index
and label), the field and, for the multi-request form, the line and column.  Nothing here
does I/O.
"""

from __future__ import annotations

import bisect
import enum
import json
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import attrs

from ..jobs import JobSpec

__all__ = [
    "BarrierRelease",
    "CommsType",
    "DescriptionError",
    "MAX_COUNT",
    "MAX_DESCRIPTION_SIZE",
    "MAX_PARTS",
    "MultiJobDescription",
    "Part",
    "StartType",
    "parse_description",
    "parse_json",
    "parse_part_json",
    "parse_part_rsl",
    "parse_rsl",
    "render_json",
    "render_part_rsl",
    "render_rsl",
]

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


# --------------------------------------------------------------------------- checks

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_QUEUE_WORD = re.compile(r"[^\s:\x00]+\Z")


def _text(field: str, value: Any, *, empty: bool = False, limit: int = 64 * 1024) -> str:
    if not isinstance(value, str):
        raise DescriptionError(f"must be text, not {_kind_of(value)}", field=field)
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
        raise DescriptionError(f"must be a whole number, not {_kind_of(value)}", field=field)
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
        raise DescriptionError(f"must be a list of texts, not {_kind_of(value)}", field="arguments")
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
                    f"item {n} must be a pair (NAME, VALUE), not {_kind_of(pair)}", field="environment"
                )
            items.append((pair[0], pair[1]))
    else:
        raise DescriptionError(
            f"must be an object or a list of (NAME, VALUE) pairs, not {_kind_of(value)}", field="environment"
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


def _enum(enum_type: Any, field: str, value: Any) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member in enum_type:
            if member.value == value.strip().lower():
                return member
    legal = ", ".join(member.value for member in enum_type)
    raise DescriptionError(f"must be one of {legal}, not {value!r}", field=field)


def _kind_of(value: Any) -> str:
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
        default=StartType.STRICT_BARRIER, converter=lambda v: _enum(StartType, "start_type", v)
    )
    comms_type: CommsType = attrs.field(
        default=CommsType.BLOCKING_JOIN, converter=lambda v: _enum(CommsType, "comms_type", v)
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
        raise DescriptionError(f"must be a list of parts, not {_kind_of(value)}", field="parts")
    parts = tuple(value)
    if not parts:
        raise DescriptionError("a multi-part job needs at least one part", field="parts")
    if len(parts) > MAX_PARTS:
        raise DescriptionError(f"has {len(parts)} parts; at most {MAX_PARTS} are allowed", field="parts")
    labels: Dict[str, int] = {}
    for index, part in enumerate(parts):
        if not isinstance(part, Part):
            raise DescriptionError(f"must be a Part, not {_kind_of(part)}", part_index=index)
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
    raise DescriptionError(f"must be true or false, not {_kind_of(value)}", field=field)


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
        default=BarrierRelease.AUTO, converter=lambda v: _enum(BarrierRelease, "barrier_release", v)
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


# --------------------------------------------------------------------------- JSON

_PART_KEYS = {
    "queue": "queue",
    "count": "count",
    "executable": "executable",
    "arguments": "arguments",
    "environment": "environment",
    "label": "label",
    "start_type": "start_type",
    "comms_type": "comms_type",
    "directory": "directory",
    "stdout": "stdout",
    "stderr": "stderr",
    "project": "project",
    "max_wall_time": "max_wall_time",
    "max_memory": "max_memory",
}
_JOB_KEYS = ("name", "barrier_release", "forward_rendezvous", "parts")


def _no_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DescriptionError(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def _load_json(text: Union[str, bytes]) -> Any:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DescriptionError(f"is not UTF-8 text (byte {error.start})") from None
    if len(text) > MAX_DESCRIPTION_SIZE:
        raise DescriptionError(f"is longer than {MAX_DESCRIPTION_SIZE} characters")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as error:
        raise DescriptionError(f"is not valid JSON: {error.msg}", line=error.lineno, column=error.colno) from None
    except RecursionError:
        raise DescriptionError("nests too deeply") from None


def _part_from_json(index: Optional[int], value: Any) -> Part:
    if not isinstance(value, Mapping):
        raise DescriptionError(f"must be an object, not {_kind_of(value)}", part_index=index)
    label = value.get("label") if isinstance(value.get("label"), str) else None
    for key in value:
        if key not in _PART_KEYS:
            known = ", ".join(_PART_KEYS)
            raise DescriptionError(
                f"unknown key; a part has {known}", field=str(key), part_index=index, part_label=label
            )
    if "executable" not in value:
        raise DescriptionError("is missing", field="executable", part_index=index, part_label=label)
    try:
        return Part(**{_PART_KEYS[key]: setting for key, setting in value.items()})
    except DescriptionError as error:
        raise error.located(part_index=index, part_label=label) from None


def parse_part_json(text: Union[str, bytes]) -> Part:
    """One part written as a JSON object (what adding a part to a running job takes)."""
    return _part_from_json(None, _load_json(text))


def parse_json(text: Union[str, bytes]) -> MultiJobDescription:
    """A multi-part job from its JSON form: an object with ``parts``, or a bare list of parts."""
    document = _load_json(text)
    return description_from_json_value(document)


def description_from_json_value(document: Any) -> MultiJobDescription:
    """A multi-part job from already-decoded JSON (say, an attribute of a larger message)."""
    if isinstance(document, list):
        document = {"parts": document}
    if not isinstance(document, Mapping):
        raise DescriptionError(f"must be an object with 'parts' or a list of parts, not {_kind_of(document)}")
    for key in document:
        if key not in _JOB_KEYS:
            raise DescriptionError(f"unknown key; a job has {', '.join(_JOB_KEYS)}", field=str(key))
    if "parts" not in document:
        raise DescriptionError("is missing", field="parts")
    raw_parts = document["parts"]
    if not isinstance(raw_parts, list):
        raise DescriptionError(f"must be a list of parts, not {_kind_of(raw_parts)}", field="parts")
    if len(raw_parts) > MAX_PARTS:
        raise DescriptionError(f"has {len(raw_parts)} parts; at most {MAX_PARTS} are allowed", field="parts")
    parts = [_part_from_json(index, item) for index, item in enumerate(raw_parts)]
    options = {key: document[key] for key in ("name", "barrier_release", "forward_rendezvous") if key in document}
    return MultiJobDescription(parts=parts, **options)


def _part_json(part: Part) -> Dict[str, Any]:
    item: Dict[str, Any] = {}
    if part.queue is not None:
        item["queue"] = part.queue
    item["count"] = part.count
    item["executable"] = part.executable
    if part.arguments:
        item["arguments"] = list(part.arguments)
    if part.environment:
        item["environment"] = dict(part.environment)
    if part.label is not None:
        item["label"] = part.label
    item["start_type"] = part.start_type.value
    item["comms_type"] = part.comms_type.value
    for key in ("directory", "stdout", "stderr", "project", "max_wall_time", "max_memory"):
        value = getattr(part, key)
        if value is not None:
            item[key] = value
    return item


def render_json(description: MultiJobDescription, *, indent: Optional[int] = 2) -> str:
    """The JSON form of ``description``; :func:`parse_json` reads it back equal."""
    document: Dict[str, Any] = {}
    if description.name is not None:
        document["name"] = description.name
    document["barrier_release"] = description.barrier_release.value
    if description.forward_rendezvous:
        document["forward_rendezvous"] = True
    document["parts"] = [_part_json(part) for part in description.parts]
    return json.dumps(document, indent=indent, ensure_ascii=False)


# --------------------------------------------------------------------------- multi-request: tokens

_SPECIAL_CHARS = frozenset("+&|()=<>!\"'^#$")
_OPERATORS = ("!=", "<=", ">=", "=", "<", ">")


@attrs.frozen
class _Token:
    kind: str  # ( ) & | + op # $ str word eof
    text: str
    offset: int


class _Source:
    """The text with a way to turn offsets into line and column."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._line_starts = [0] + [match.end() for match in re.finditer("\n", text)]

    def where(self, offset: int) -> Tuple[int, int]:
        line = bisect.bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1] + 1

    def error(self, offset: int, reason: str, **place: Any) -> DescriptionError:
        line, column = self.where(offset)
        return DescriptionError(reason, line=line, column=column, **place)


def _tokens(source: _Source) -> Iterator[_Token]:
    text = source.text
    size = len(text)
    at = 0
    while True:
        while at < size and text[at].isspace():
            at += 1
        if at >= size:
            yield _Token("eof", "", at)
            return
        char = text[at]
        if char == "(" and text.startswith("(*", at):
            end = text.find("*)", at + 2)
            if end < 0:
                raise source.error(at, "comment '(*' is never closed with '*)'")
            at = end + 2
            continue
        if char in "()&|+#$":
            yield _Token(char, char, at)
            at += 1
            continue
        if char in "=<>!":
            for operator in _OPERATORS:
                if text.startswith(operator, at):
                    yield _Token("op", operator, at)
                    at += len(operator)
                    break
            else:
                raise source.error(at, "'!' must be followed by '=' (the operator '!=')")
            continue
        if char in "\"'":
            value, at_end = _quoted(source, at, char, doubled=True)
            yield _Token("str", value, at)
            at = at_end
            continue
        if char == "^":
            if at + 1 >= size:
                raise source.error(at, "'^' must be followed by the quoting character")
            quote = text[at + 1]
            if quote.isspace():
                raise source.error(at, "the quoting character after '^' must not be white space")
            value, at_end = _quoted(source, at + 1, quote, doubled=False)
            yield _Token("str", value, at)
            at = at_end
            continue
        start = at
        while at < size and not text[at].isspace() and text[at] not in _SPECIAL_CHARS:
            at += 1
        yield _Token("word", text[start:at], start)


def _quoted(source: _Source, at: int, quote: str, *, doubled: bool) -> Tuple[str, int]:
    """The string whose opening quote is at ``at``, and the offset after its closing quote."""
    text = source.text
    pieces = []
    cursor = at + 1
    while True:
        end = text.find(quote, cursor)
        if end < 0:
            raise source.error(at, f"string opened with {quote!r} is never closed")
        pieces.append(text[cursor:end])
        if doubled and text.startswith(quote, end + 1):
            pieces.append(quote)
            cursor = end + 2
            continue
        return "".join(pieces), end + 1


# --------------------------------------------------------------------------- multi-request: syntax tree


@attrs.frozen
class _Str:
    text: str
    offset: int


@attrs.frozen
class _Var:
    name: str
    offset: int


@attrs.frozen
class _Concat:
    items: Tuple[Union[_Str, _Var], ...]
    offset: int


@attrs.frozen
class _List:
    items: Tuple[Any, ...]
    offset: int


@attrs.frozen
class _Relation:
    attribute: str
    canonical: str
    operator: str
    values: Tuple[Any, ...]
    offset: int


@attrs.frozen
class _Request:
    operator: str  # & | +
    children: Tuple[Union["_Request", _Relation], ...]
    offset: int


class _Parser:
    def __init__(self, source: _Source) -> None:
        self.source = source
        self._tokens = _tokens(source)
        self.token = next(self._tokens)

    def advance(self) -> _Token:
        token = self.token
        self.token = next(self._tokens)
        return token

    def expect(self, kind: str, what: str) -> _Token:
        if self.token.kind != kind:
            raise self.source.error(self.token.offset, f"expected {what}, found {self._describe(self.token)}")
        return self.advance()

    @staticmethod
    def _describe(token: _Token) -> str:
        if token.kind == "eof":
            return "the end of the text"
        if token.kind == "str":
            return "a quoted string"
        return repr(token.text)

    def document(self) -> _Request:
        token = self.token
        if token.kind not in ("&", "+", "|"):
            raise self.source.error(
                token.offset, f"expected a multi-request '+( &(...) )( &(...) )', found {self._describe(token)}"
            )
        request = self.request(0)
        if self.token.kind != "eof":
            raise self.source.error(self.token.offset, f"unexpected {self._describe(self.token)} after the request")
        return request

    def request(self, depth: int) -> _Request:
        if depth > MAX_NESTING:
            raise self.source.error(self.token.offset, f"requests nest more than {MAX_NESTING} deep")
        operator = self.advance()
        children: List[Union[_Request, _Relation]] = []
        while self.token.kind == "(":
            open_paren = self.advance()
            if self.token.kind in ("&", "+", "|"):
                children.append(self.request(depth + 1))
            else:
                children.append(self.relation(depth))
            if self.token.kind != ")":
                line, column = self.source.where(open_paren.offset)
                raise self.source.error(
                    self.token.offset,
                    f"expected ')' to close the '(' at line {line}, column {column}, "
                    f"found {self._describe(self.token)}",
                )
            self.advance()
        if not children:
            raise self.source.error(
                self.token.offset, f"expected '(' after {operator.text!r}, found {self._describe(self.token)}"
            )
        return _Request(operator.kind, tuple(children), operator.offset)

    def relation(self, depth: int) -> _Relation:
        name = self.token
        if name.kind != "word":
            raise self.source.error(name.offset, f"expected an attribute name, found {self._describe(name)}")
        self.advance()
        operator = self.expect("op", f"an operator such as '=' after {name.text!r}")
        values = self.values(depth + 1)
        canonical = name.text.replace("_", "").lower()
        return _Relation(name.text, canonical, operator.text, tuple(values), name.offset)

    def values(self, depth: int) -> List[Any]:
        if depth > MAX_NESTING:
            raise self.source.error(self.token.offset, f"value lists nest more than {MAX_NESTING} deep")
        items: List[Any] = []
        while self.token.kind != ")":
            if self.token.kind == "(":
                open_paren = self.advance()
                inner = self.values(depth + 1)
                if self.token.kind != ")":
                    raise self.source.error(self.token.offset, f"expected ')', found {self._describe(self.token)}")
                self.advance()
                items.append(_List(tuple(inner), open_paren.offset))
            elif self.token.kind in ("str", "word", "$"):
                items.append(self.concatenation())
            else:
                raise self.source.error(
                    self.token.offset, f"expected a value or ')', found {self._describe(self.token)}"
                )
        return items

    def concatenation(self) -> Union[_Str, _Var, _Concat]:
        first = self.simple()
        items = [first]
        while self.token.kind == "#":
            self.advance()
            if self.token.kind not in ("str", "word", "$"):
                raise self.source.error(
                    self.token.offset, f"expected a value after '#', found {self._describe(self.token)}"
                )
            items.append(self.simple())
        if len(items) == 1:
            return first
        return _Concat(tuple(items), first.offset)

    def simple(self) -> Union[_Str, _Var]:
        token = self.advance()
        if token.kind != "$":
            return _Str(token.text, token.offset)
        self.expect("(", "'(' after '$' (a variable is written $(NAME))")
        name = self.token
        if name.kind not in ("word", "str"):
            raise self.source.error(name.offset, f"expected a variable name, found {self._describe(name)}")
        self.advance()
        self.expect(")", "')' after the variable name")
        return _Var(name.text, token.offset)


# --------------------------------------------------------------------------- multi-request: meaning

_PART_ATTRIBUTES = {
    "resourcemanagercontact": "resourceManagerContact",
    "queue": "queue",
    "count": "count",
    "executable": "executable",
    "arguments": "arguments",
    "environment": "environment",
    "label": "label",
    "subjobstarttype": "subjobStartType",
    "subjobcommstype": "subjobCommsType",
    "directory": "directory",
    "stdout": "stdout",
    "stderr": "stderr",
    "project": "project",
    "maxwalltime": "maxWallTime",
    "maxmemory": "maxMemory",
}
_JOB_ATTRIBUTES = {
    "name": "name",
    "barrierrelease": "barrierRelease",
    "forwardrendezvous": "forwardRendezvous",
}
_SUBSTITUTION = "rslsubstitution"
_LABEL_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,128}\Z")
_PART_FIELD_OF = {
    "count": "count",
    "executable": "executable",
    "arguments": "arguments",
    "environment": "environment",
    "label": "label",
    "subjobstarttype": "start_type",
    "subjobcommstype": "comms_type",
    "directory": "directory",
    "stdout": "stdout",
    "stderr": "stderr",
    "project": "project",
    "maxwalltime": "max_wall_time",
    "maxmemory": "max_memory",
}


class _Meaning:
    """Turns the syntax tree into a description, keeping offsets for errors."""

    def __init__(self, source: _Source) -> None:
        self.source = source

    def error(self, offset: int, reason: str, **place: Any) -> DescriptionError:
        return self.source.error(offset, reason, **place)

    # -- values

    def evaluate(self, node: Any, scope: Mapping[str, str], **place: Any) -> Union[str, List[Any]]:
        if isinstance(node, _Str):
            return node.text
        if isinstance(node, _Var):
            if node.name not in scope:
                raise self.error(
                    node.offset, f"variable $({node.name}) is not defined by an earlier rslSubstitution", **place
                )
            return scope[node.name]
        if isinstance(node, _Concat):
            return "".join(str(self.evaluate(item, scope, **place)) for item in node.items)
        return [self.evaluate(item, scope, **place) for item in node.items]

    def substitutions(
        self, relations: Sequence[_Relation], outer: Mapping[str, str], **place: Any
    ) -> Dict[str, str]:
        scope = dict(outer)
        for relation in relations:
            if relation.canonical != _SUBSTITUTION:
                continue
            self.equals(relation, **place)
            for node in relation.values:
                if not isinstance(node, _List) or len(node.items) != 2 or isinstance(node.items[0], _List):
                    raise self.error(
                        getattr(node, "offset", relation.offset),
                        "each substitution is a pair (NAME VALUE)",
                        field=relation.attribute,
                        **place,
                    )
                name = self.evaluate(node.items[0], scope, field=relation.attribute, **place)
                value = self.evaluate(node.items[1], scope, field=relation.attribute, **place)
                if isinstance(value, list):
                    raise self.error(
                        node.offset, f"the value of {name} must be a single value", field=relation.attribute, **place
                    )
                scope[str(name)] = value
        return scope

    def equals(self, relation: _Relation, **place: Any) -> None:
        if relation.operator != "=":
            raise self.error(
                relation.offset,
                f"takes '=', not {relation.operator!r}",
                field=relation.attribute,
                **place,
            )

    def single(self, relation: _Relation, scope: Mapping[str, str], **place: Any) -> str:
        values = [self.evaluate(node, scope, field=relation.attribute, **place) for node in relation.values]
        if len(values) != 1 or not isinstance(values[0], str):
            raise self.error(
                relation.offset,
                f"takes exactly one value, not {len(values) if len(values) != 1 else 'a list'}",
                field=relation.attribute,
                **place,
            )
        return values[0]

    def number(self, relation: _Relation, scope: Mapping[str, str], **place: Any) -> int:
        text = self.single(relation, scope, **place)
        if not re.fullmatch(r"[0-9]{1,12}", text.strip()):
            raise self.error(
                relation.offset, f"must be a whole number, not {text!r}", field=relation.attribute, **place
            )
        return int(text)

    # -- the document

    def description(self, tree: _Request) -> MultiJobDescription:
        if tree.operator == "|":
            raise self.error(tree.offset, "'|' (a choice between requests) is not supported; use '+' for parts")
        if tree.operator == "+":
            return self.multi_request(tree, {}, {})
        relations = [child for child in tree.children if isinstance(child, _Relation)]
        requests = [child for child in tree.children if isinstance(child, _Request)]
        multi = [request for request in requests if request.operator == "+"]
        if len(multi) != 1 or len(requests) != 1:
            raise self.error(
                tree.offset,
                "expected a multi-request '+( &(...) )( &(...) )', or job options around exactly one: "
                "&(name=...)(barrierRelease=...)( +(&(...))(&(...)) )",
            )
        scope = self.substitutions(relations, {})
        options: Dict[str, Any] = {}
        seen: Dict[str, int] = {}
        for relation in relations:
            if relation.canonical == _SUBSTITUTION:
                continue
            if relation.canonical not in _JOB_ATTRIBUTES:
                hint = " (it belongs inside a part)" if relation.canonical in _PART_ATTRIBUTES else ""
                known = ", ".join(_JOB_ATTRIBUTES.values())
                raise self.error(
                    relation.offset,
                    f"unknown job attribute{hint}; a job has {known}",
                    field=relation.attribute,
                )
            self.once(relation, seen)
            self.equals(relation)
            value = self.single(relation, scope)
            try:
                if relation.canonical == "name":
                    options["name"] = value
                elif relation.canonical == "barrierrelease":
                    options["barrier_release"] = _enum(BarrierRelease, relation.attribute, value)
                else:
                    options["forward_rendezvous"] = self.yes_no(relation, value)
            except DescriptionError as error:
                line, column = self.source.where(relation.offset)
                raise error.located(line=line, column=column) from None
        return self.multi_request(multi[0], scope, options)

    def once(self, relation: _Relation, seen: Dict[str, int], **place: Any) -> None:
        if relation.canonical in seen:
            line, column = self.source.where(seen[relation.canonical])
            raise self.error(
                relation.offset, f"is given twice (first at line {line}, column {column})", field=relation.attribute, **place
            )
        seen[relation.canonical] = relation.offset

    def yes_no(self, relation: _Relation, value: str) -> bool:
        lowered = value.strip().lower()
        if lowered in ("yes", "true"):
            return True
        if lowered in ("no", "false"):
            return False
        raise self.error(relation.offset, f"must be yes or no, not {value!r}", field=relation.attribute)

    def multi_request(
        self, tree: _Request, scope: Mapping[str, str], options: Dict[str, Any]
    ) -> MultiJobDescription:
        if len(tree.children) > MAX_PARTS:
            raise self.error(tree.offset, f"has {len(tree.children)} parts; at most {MAX_PARTS} are allowed")
        parts = [self.part(index, child, scope) for index, child in enumerate(tree.children)]
        try:
            return MultiJobDescription(parts=parts, **options)
        except DescriptionError as error:
            if error.part_index is not None:
                child = tree.children[error.part_index]
                line, column = self.source.where(child.offset)
                raise error.located(line=line, column=column) from None
            raise

    def part(self, index: int, node: Any, scope: Mapping[str, str]) -> Part:
        if isinstance(node, _Request) and node.operator == "|":
            raise self.error(node.offset, "'|' (a choice between requests) is not supported", part_index=index)
        if not isinstance(node, _Request) or node.operator != "&":
            raise self.error(node.offset, "expected a conjunction '&(attribute=value)...'", part_index=index)
        relations: List[_Relation] = []
        for child in node.children:
            if isinstance(child, _Request):
                raise self.error(child.offset, "a part may not contain a nested request", part_index=index)
            relations.append(child)
        place = dict(part_index=index, part_label=self.label_of(relations, scope))
        local = self.substitutions(relations, scope, **place)
        fields: Dict[str, Any] = {}
        contact: Optional[_Relation] = None
        queue: Optional[_Relation] = None
        seen: Dict[str, int] = {}
        for relation in relations:
            if relation.canonical == _SUBSTITUTION:
                continue
            if relation.canonical not in _PART_ATTRIBUTES:
                hint = " (it is a job option: put it around the '+' request)" if relation.canonical in _JOB_ATTRIBUTES else ""
                known = ", ".join(_PART_ATTRIBUTES.values())
                raise self.error(
                    relation.offset, f"unknown attribute{hint}; a part has {known}", field=relation.attribute, **place
                )
            self.once(relation, seen, **place)
            self.equals(relation, **place)
            canonical = relation.canonical
            if canonical == "resourcemanagercontact":
                contact = relation
            elif canonical == "queue":
                queue = relation
            elif canonical in ("count", "maxwalltime", "maxmemory"):
                fields[_PART_FIELD_OF[canonical]] = (relation, self.number(relation, local, **place))
            elif canonical == "arguments":
                values = [self.evaluate(item, local, field=relation.attribute, **place) for item in relation.values]
                if any(isinstance(value, list) for value in values):
                    raise self.error(
                        relation.offset, "takes plain values, not lists", field=relation.attribute, **place
                    )
                fields["arguments"] = (relation, values)
            elif canonical == "environment":
                fields["environment"] = (relation, self.environment(relation, local, **place))
            else:
                fields[_PART_FIELD_OF[canonical]] = (relation, self.single(relation, local, **place))
        if "executable" not in fields:
            raise self.error(node.offset, "is missing", field="executable", **place)
        if queue is not None or contact is not None:
            fields["queue"] = self.queue_of(contact, queue, local, **place)
        try:
            return Part(**{field: value for field, (_, value) in fields.items()})
        except DescriptionError as error:
            # The field named in the error is a Part field, perhaps with a detail after it
            # ("arguments[2]", "environment A"): point at the relation that gave it.
            field = error.field or ""
            head = re.split(r"[\[ ]", field, maxsplit=1)[0]
            relation = fields[head][0] if head in fields else node
            name = field.replace(head, relation.attribute, 1) if isinstance(relation, _Relation) else field
            line, column = self.source.where(relation.offset)
            raise DescriptionError(error.reason, field=name or None, line=line, column=column, **place) from None

    def label_of(self, relations: Sequence[_Relation], scope: Mapping[str, str]) -> Optional[str]:
        """The part's label for error messages, if it can be read at all."""
        for relation in relations:
            if relation.canonical == "label":
                try:
                    label = self.single(relation, self.substitutions(relations, scope))
                except DescriptionError:
                    return None
                return label if _LABEL_TEXT.match(label) else None
        return None

    def environment(self, relation: _Relation, scope: Mapping[str, str], **place: Any) -> List[Tuple[str, str]]:
        pairs = []
        for node in relation.values:
            if not isinstance(node, _List) or len(node.items) != 2:
                raise self.error(
                    getattr(node, "offset", relation.offset),
                    "each variable is a pair (NAME VALUE)",
                    field=relation.attribute,
                    **place,
                )
            name, value = (self.evaluate(item, scope, field=relation.attribute, **place) for item in node.items)
            if isinstance(name, list) or isinstance(value, list):
                raise self.error(
                    node.offset, "a variable's name and value are plain values", field=relation.attribute, **place
                )
            pairs.append((name, value))
        return pairs

    def queue_of(
        self, contact: Optional[_Relation], queue: Optional[_Relation], scope: Mapping[str, str], **place: Any
    ) -> Tuple[_Relation, str]:
        if contact is None:
            assert queue is not None
            return queue, self.single(queue, scope, **place)
        contact_text = self.single(contact, scope, **place)
        if queue is None:
            return contact, contact_text
        queue_text = self.single(queue, scope, **place)
        if ":" in contact_text or ":" in queue_text:
            raise self.error(
                queue.offset,
                "with both resourceManagerContact and queue, the contact names the scheduler and queue the "
                "queue: neither may contain ':'",
                field=queue.attribute,
                **place,
            )
        return contact, f"{contact_text}:{queue_text}"


def _rsl_source(text: Union[str, bytes]) -> _Source:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DescriptionError(f"is not UTF-8 text (byte {error.start})") from None
    if len(text) > MAX_DESCRIPTION_SIZE:
        raise DescriptionError(f"is longer than {MAX_DESCRIPTION_SIZE} characters")
    return _Source(text)


def parse_rsl(text: Union[str, bytes]) -> MultiJobDescription:
    """A multi-part job from its multi-request form."""
    source = _rsl_source(text)
    tree = _Parser(source).document()
    return _Meaning(source).description(tree)


def parse_part_rsl(text: Union[str, bytes]) -> Part:
    """One part written as a conjunction ``&(executable=...)(count=...)`` (for adding a part)."""
    source = _rsl_source(text)
    parser = _Parser(source)
    if parser.token.kind != "&":
        raise source.error(parser.token.offset, "expected a conjunction '&(attribute=value)...'")
    tree = parser.request(0)
    if parser.token.kind != "eof":
        raise source.error(parser.token.offset, "unexpected text after the request")
    try:
        return _Meaning(source).part(0, tree, {})
    except DescriptionError as error:
        raise DescriptionError(
            error.reason, field=error.field, part_label=None, line=error.line, column=error.column
        ) from None


def parse_description(text: Union[str, bytes]) -> MultiJobDescription:
    """A multi-part job in either form: JSON when it starts with ``{`` or ``[``, else the
    multi-request form."""
    head = text.lstrip()[:1]
    if head in ("{", "[", b"{", b"["):
        return parse_json(text)
    return parse_rsl(text)


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def render_part_rsl(part: Part) -> str:
    """One part as a conjunction ``&(...)(...)``; :func:`parse_part_rsl` reads it back equal."""
    relations: List[str] = []
    if part.queue is not None:
        relations.append(f"(resourceManagerContact={_quote(part.queue)})")
    relations.append(f"(count={part.count})")
    relations.append(f"(executable={_quote(part.executable)})")
    if part.arguments:
        relations.append("(arguments=" + " ".join(_quote(arg) for arg in part.arguments) + ")")
    if part.environment:
        relations.append(
            "(environment=" + "".join(f"({name} {_quote(value)})" for name, value in part.environment) + ")"
        )
    if part.label is not None:
        relations.append(f"(label={_quote(part.label)})")
    relations.append(f"(subjobStartType={part.start_type.value})")
    relations.append(f"(subjobCommsType={part.comms_type.value})")
    for field, attribute in (
        ("directory", "directory"),
        ("stdout", "stdout"),
        ("stderr", "stderr"),
        ("project", "project"),
    ):
        value = getattr(part, field)
        if value is not None:
            relations.append(f"({attribute}={_quote(value)})")
    if part.max_wall_time is not None:
        relations.append(f"(maxWallTime={part.max_wall_time})")
    if part.max_memory is not None:
        relations.append(f"(maxMemory={part.max_memory})")
    return "&" + "\n    ".join(relations)


def render_rsl(description: MultiJobDescription) -> str:
    """The multi-request form of ``description``; :func:`parse_rsl` reads it back equal."""
    body = "+" + "\n ".join(f"( {render_part_rsl(part)} )" for part in description.parts)
    options: List[str] = []
    if description.name is not None:
        options.append(f"(name={_quote(description.name)})")
    if description.barrier_release is not BarrierRelease.AUTO:
        options.append(f"(barrierRelease={description.barrier_release.value})")
    if description.forward_rendezvous:
        options.append("(forwardRendezvous=yes)")
    if not options:
        return body
    return "&" + "".join(options) + "\n( " + body + " )"
