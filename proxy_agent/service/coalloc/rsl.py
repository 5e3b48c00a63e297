"""The multi-request form of a multi-part job description: the resource specification
language co-allocator users know (see :mod:`.description` for its lexical rules)."""

from __future__ import annotations

import bisect
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import attrs

from .parts import (
    BarrierRelease, DescriptionError, description_text, MAX_NESTING, MAX_PARTS, MultiJobDescription, Part,
    enum_member,
)


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
                    options["barrier_release"] = enum_member(BarrierRelease, relation.attribute, value)
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
    text = description_text(text)
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

