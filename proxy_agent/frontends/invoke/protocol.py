"""The Ninf-G Invoke Server protocol as a state machine over bytes, with no I/O.

A grid RPC client starts the Invoke Server with three pipes: requests arrive on its stdin,
replies go out on its stdout, notifies on its stderr.  Every message is one line ended by
CR LF; the client ends a line only at CR LF, so everything written here ends with CR LF.
Input lines may end with LF or CR LF.

Feed what stdin delivers to :meth:`RequestReader.receive_data` (``b""`` at end of file, as in
h11); it returns the events found so far:

* requests: :class:`QueryFeatures`, :class:`JobCreate` (with its attribute lines, collected
  up to ``JOB_CREATE_END`` or ``JOB_CREATE_DONE``), :class:`JobStatus`, :class:`JobDestroy`,
  :class:`Exit`;
* :class:`RequestError`: a line the client sent as a request that cannot be served (unknown
  name, wrong arguments, too long, not UTF-8, a JOB_CREATE whose attributes could not be read).
  The server answers it with ``F`` and :attr:`RequestError.reason`;
* :class:`InputWarning`: a line that is not a request (an attribute line outside a JOB_CREATE,
  an empty line, bytes after EXIT, a last line cut off by end of file).  It gets no reply:
  the client counts replies against its own requests, so a reply to a line it did not count
  would be taken as the answer to its next real request.  The server logs it;
* :class:`CreateInterrupted`: end of file inside a JOB_CREATE; the server fails that request;
* :class:`EndOfInput`: end of file (the client has gone).

So every request the client counts gets exactly one event that calls for exactly one reply,
in the order of the requests.

Decisions this module owns:

* A request line is one whose first word is upper-case letters, digits and ``_``; the words
  are separated by spaces.  Anything else outside a JOB_CREATE is an :class:`InputWarning`.
* Inside a JOB_CREATE an attribute line is ``NAME VALUE``: the name up to the first space, the
  value the rest of the line exactly as sent (it may hold spaces).  A line without a space is
  an attribute with an empty value.  The terminator may carry trailing blanks.
* Lines longer than :data:`MAX_LINE_BYTES` (not counting the line end) are refused: the reader
  keeps at most that many bytes of an unfinished line and drops the rest up to the next LF.
  A JOB_CREATE holding more than :data:`MAX_CREATE_BYTES` of attribute lines is refused too.
  In both cases the reader resynchronises at the next line and keeps serving.
* Bytes that are not UTF-8 make their line fail, they are never replaced: a path or an
  argument with a replaced character would start some other program or pass some other
  value, silently.  A request line that is not UTF-8 gets ``F``; a JOB_CREATE with such an
  attribute line is read to its end and then gets ``F`` naming the line.
* A JOB_CREATE's request id must be a decimal number (the client counts them from 1); it is
  kept as sent, because CREATE_NOTIFY must echo it.

The encoders at the bottom write the server's replies and notifies (and, for tests and
tools, the client's requests); :func:`parse_notify` reads a notify line back.
"""

from __future__ import annotations

import enum
import re
from typing import List, Optional, Sequence, Tuple, Union

import attrs

__all__ = [
    "CreateInterrupted",
    "CreateNotify",
    "EndOfInput",
    "Exit",
    "InputWarning",
    "InvokeStatus",
    "JobCreate",
    "JobDestroy",
    "JobStatus",
    "MAX_CREATE_BYTES",
    "MAX_JOB_ID_LENGTH",
    "MAX_LINE_BYTES",
    "MAX_TEXT_LENGTH",
    "PROTOCOL_VERSION",
    "QueryFeatures",
    "RequestError",
    "RequestReader",
    "SERVER_REQUESTS",
    "StatusNotify",
    "check_job_id",
    "encode_job_create",
    "encode_request",
    "notify_create_failed",
    "notify_created",
    "notify_status",
    "one_line",
    "parse_notify",
    "reply_failure",
    "reply_features",
    "reply_success",
]

#: A line longer than this many bytes (line end not counted) is refused unread.
MAX_LINE_BYTES = 64 * 1024
#: The attribute lines of one JOB_CREATE may hold at most this many bytes in all.
MAX_CREATE_BYTES = 1024 * 1024
#: The client accepts job ids of at most this many characters.
MAX_JOB_ID_LENGTH = 1024
#: Free text in a reply or notify is cut to this many characters.
MAX_TEXT_LENGTH = 4000
#: Request ids longer than this are refused (the client counts them from 1 per server).
_MAX_REQUEST_ID_DIGITS = 20

PROTOCOL_VERSION = "2.0"
EOL = b"\r\n"

JOB_CREATE = "JOB_CREATE"
JOB_STATUS = "JOB_STATUS"
JOB_DESTROY = "JOB_DESTROY"
QUERY_FEATURES = "QUERY_FEATURES"
EXIT = "EXIT"
#: The requests this server serves, in the order the QUERY_FEATURES reply lists them.
SERVER_REQUESTS = (JOB_CREATE, JOB_STATUS, JOB_DESTROY, QUERY_FEATURES, EXIT)
#: The lines that end a JOB_CREATE: the field's spelling and the one the protocol document uses.
CREATE_TERMINATORS = ("JOB_CREATE_END", "JOB_CREATE_DONE")
_TERMINATOR_BYTES = tuple(t.encode("ascii") for t in CREATE_TERMINATORS)

_REQUEST_WORD = re.compile(rb"[A-Z][A-Z0-9_]*")
_BLANKS = b" \t\r"


class InvokeStatus(enum.Enum):
    """A job's status as the client knows it."""

    #: waiting to start
    PENDING = "PENDING"
    #: started
    ACTIVE = "ACTIVE"
    #: ended (normally or because it was cancelled)
    DONE = "DONE"
    #: ended abnormally
    FAILED = "FAILED"

    @property
    def final(self) -> bool:
        return self in (InvokeStatus.DONE, InvokeStatus.FAILED)


# --------------------------------------------------------------------------- events


@attrs.frozen
class QueryFeatures:
    """``QUERY_FEATURES``: which protocol version, features and requests the server has."""


@attrs.frozen
class JobCreate:
    """``JOB_CREATE <request_id>`` with its attribute lines, in the order sent."""

    request_id: str
    attributes: Tuple[Tuple[str, str], ...]
    #: the line that ended it (``JOB_CREATE_END`` or ``JOB_CREATE_DONE``)
    terminator: str = "JOB_CREATE_END"


@attrs.frozen
class JobStatus:
    """``JOB_STATUS <job_id>``."""

    job_id: str


@attrs.frozen
class JobDestroy:
    """``JOB_DESTROY <job_id>``."""

    job_id: str


@attrs.frozen
class Exit:
    """``EXIT``: cancel every job, wait for them, exit."""


@attrs.frozen
class RequestError:
    """A request that cannot be served; the server replies ``F`` with :attr:`reason`."""

    #: the request's name as sent (``"?"`` when not even that could be read)
    request: str
    reason: str


@attrs.frozen
class InputWarning:
    """A line that is not a request: logged, never answered."""

    reason: str


@attrs.frozen
class CreateInterrupted:
    """The input ended inside a JOB_CREATE; the server fails that request."""

    request_id: str
    reason: str


@attrs.frozen
class EndOfInput:
    """The request pipe reached end of file: the client is gone."""


Event = Union[
    QueryFeatures,
    JobCreate,
    JobStatus,
    JobDestroy,
    Exit,
    RequestError,
    InputWarning,
    CreateInterrupted,
    EndOfInput,
]


class ReaderState(enum.Enum):
    #: between requests
    IDLE = "IDLE"
    #: inside a JOB_CREATE, reading attribute lines
    IN_CREATE = "IN_CREATE"
    #: after EXIT or end of file: nothing more is served
    CLOSED = "CLOSED"


def _show(data: bytes, limit: int = 40) -> str:
    text = repr(bytes(data[:limit]))
    return text + ("..." if len(data) > limit else "")


def _utf8_problem(exc: UnicodeDecodeError) -> str:
    return f"byte 0x{exc.object[exc.start]:02X} at offset {exc.start} is not UTF-8"


class _Create:
    """A JOB_CREATE being read."""

    __slots__ = ("request_id", "attributes", "size", "failure")

    def __init__(self, request_id: str, failure: Optional[str]) -> None:
        self.request_id = request_id
        self.attributes: List[Tuple[str, str]] = []
        self.size = 0
        #: why the request will fail once its end is read (the first problem found)
        self.failure = failure

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        # What was collected is useless now; do not keep it.
        self.attributes = []


class RequestReader:
    """The server's side of the request pipe: bytes in, events out.

    Memory is bounded: an unfinished line is kept up to :data:`MAX_LINE_BYTES` (plus one
    chunk while it is being scanned), one JOB_CREATE's attributes up to
    :data:`MAX_CREATE_BYTES`.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, max_create_bytes: int = MAX_CREATE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_create_bytes = max_create_bytes
        self.state = ReaderState.IDLE
        self._buffer = bytearray()
        #: while dropping an overlong line: its first bytes (to name it) and its line number
        self._overlong: Optional[Tuple[bytes, int]] = None
        self._create: Optional[_Create] = None
        self._line_no = 0
        self._ended = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for an unfinished line (for tests of the memory bound)."""
        return len(self._buffer) + (len(self._overlong[0]) if self._overlong else 0)

    def receive_data(self, data: bytes) -> List[Event]:
        """Take the next bytes from the request pipe (``b""`` means end of file)."""
        if self._ended:
            return []
        events: List[Event] = []
        if not data:
            self._end_of_input(events)
            return events
        if self._overlong is not None:
            end = data.find(b"\n")
            if end < 0:
                return events
            head, line_no = self._overlong
            self._overlong = None
            self._refuse_overlong(head, line_no, events)
            data = data[end + 1 :]
        buffer = self._buffer
        buffer += data
        start = 0
        limit = self.max_line_bytes
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            stop = end - 1 if end > start and buffer[end - 1] == 0x0D else end
            self._line_no += 1
            if stop - start > limit:
                self._refuse_overlong(bytes(buffer[start : start + 64]), self._line_no, events)
            else:
                self._line(bytes(buffer[start:stop]), events)
            start = end + 1
        del buffer[:start]
        # One CR may belong to a line end still to come.
        if len(buffer) > limit + 1:
            self._line_no += 1
            self._overlong = (bytes(buffer[:64]), self._line_no)
            buffer.clear()
        return events

    # ------------------------------------------------------------------ lines

    def _line(self, line: bytes, events: List[Event]) -> None:
        if self.state is ReaderState.IN_CREATE:
            self._attribute_line(line, events)
        elif self.state is ReaderState.IDLE:
            self._request_line(line, events)
        else:
            events.append(InputWarning(f"line {self._line_no} after EXIT ignored: {_show(line)}"))

    def _request_line(self, line: bytes, events: List[Event]) -> None:
        stripped = line.strip(_BLANKS)
        if not stripped:
            events.append(InputWarning(f"line {self._line_no} is empty; ignored"))
            return
        if stripped in _TERMINATOR_BYTES:
            # The client counts a JOB_CREATE as one request, answered at its end: a stray end
            # line is not a request of its own.
            events.append(InputWarning(f"line {self._line_no}: {stripped.decode()} without a JOB_CREATE; ignored"))
            return
        word = _REQUEST_WORD.match(stripped)
        if word is None or (word.end() < len(stripped) and stripped[word.end()] not in b" \t"):
            first = stripped.split(None, 1)[0]
            events.append(
                InputWarning(
                    f"line {self._line_no} is not a request and not inside a JOB_CREATE; ignored: "
                    f"{_show(first)}"
                )
            )
            return
        name = word.group().decode("ascii")
        try:
            text = stripped.decode("utf-8")
        except UnicodeDecodeError as exc:
            events.append(RequestError(name, f"{name}: line {self._line_no} is not valid UTF-8 ({_utf8_problem(exc)})"))
            return
        args = text.split()[1:]
        if name == JOB_CREATE:
            self._begin_create(args, events)
        elif name in (JOB_STATUS, JOB_DESTROY):
            if len(args) != 1:
                events.append(RequestError(name, f"{name} takes one job id, got {len(args)} arguments"))
            elif name == JOB_STATUS:
                events.append(JobStatus(args[0]))
            else:
                events.append(JobDestroy(args[0]))
        elif name in (EXIT, QUERY_FEATURES):
            if args:
                events.append(RequestError(name, f"{name} takes no arguments, got {len(args)}"))
            elif name == EXIT:
                events.append(Exit())
                self.state = ReaderState.CLOSED
            else:
                events.append(QueryFeatures())
        else:
            known = ", ".join(SERVER_REQUESTS)
            events.append(RequestError(name, f"unknown request {name}; this server serves {known}"))

    def _begin_create(self, args: Sequence[str], events: List[Event]) -> None:
        failure: Optional[str] = None
        if len(args) != 1:
            request_id = args[0] if args else "?"
            failure = f"JOB_CREATE takes one request id, got {len(args)} arguments"
        else:
            request_id = args[0]
            if not (request_id.isascii() and request_id.isdigit()) or len(request_id) > _MAX_REQUEST_ID_DIGITS:
                failure = f"JOB_CREATE: request id {request_id[:40]!r} is not a decimal number"
        # Even a broken JOB_CREATE is read to its end: its attribute lines must not be taken
        # for requests.
        self._create = _Create(request_id, failure)
        self.state = ReaderState.IN_CREATE

    def _attribute_line(self, line: bytes, events: List[Event]) -> None:
        create = self._create
        assert create is not None
        stripped = line.rstrip(_BLANKS)
        if stripped in _TERMINATOR_BYTES:
            self._end_create(stripped.decode("ascii"), events)
            return
        if not stripped:
            events.append(InputWarning(f"line {self._line_no}: empty line inside JOB_CREATE {create.request_id} ignored"))
            return
        if create.failure is not None:
            return
        create.size += len(line) + 2
        if create.size > self.max_create_bytes:
            create.fail(f"its attribute lines hold more than {self.max_create_bytes} bytes")
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            name = line.split(b" ", 1)[0]
            create.fail(
                f"attribute line {self._line_no} ({_show(name)}) is not valid UTF-8 ({_utf8_problem(exc)})"
            )
            return
        name, _, value = text.partition(" ")
        create.attributes.append((name, value))

    def _end_create(self, terminator: str, events: List[Event]) -> None:
        create = self._create
        assert create is not None
        self._create = None
        self.state = ReaderState.IDLE
        if create.failure is not None:
            prefix = "" if create.failure.startswith("JOB_CREATE") else f"JOB_CREATE {create.request_id}: "
            events.append(RequestError(JOB_CREATE, prefix + create.failure))
        else:
            events.append(JobCreate(create.request_id, tuple(create.attributes), terminator))

    def _refuse_overlong(self, head: bytes, line_no: int, events: List[Event]) -> None:
        what = f"line {line_no} is longer than {self.max_line_bytes} bytes"
        if self.state is ReaderState.IN_CREATE:
            assert self._create is not None
            name = head.split(b" ", 1)[0]
            self._create.fail(f"attribute line {line_no} ({_show(name, 24)}) is longer than {self.max_line_bytes} bytes")
            return
        if self.state is ReaderState.CLOSED:
            events.append(InputWarning(f"{what}, after EXIT; ignored"))
            return
        word = _REQUEST_WORD.match(head.lstrip(_BLANKS))
        if word is not None:
            name = word.group().decode("ascii")
            if name == JOB_CREATE:
                # Its attribute lines follow: read them as such, then fail the request once.
                self._create = _Create("?", f"JOB_CREATE: {what}; refused")
                self.state = ReaderState.IN_CREATE
                return
            events.append(RequestError(name, f"{name}: {what}; refused"))
        else:
            events.append(InputWarning(f"{what} and is not a request; ignored: {_show(head)}"))

    def _end_of_input(self, events: List[Event]) -> None:
        self._ended = True
        if self._overlong is not None or self._buffer:
            dropped = len(self._buffer) if self._overlong is None else self.max_line_bytes
            events.append(InputWarning(f"input ended inside a line; its {dropped}+ bytes were dropped"))
            self._buffer.clear()
            self._overlong = None
        if self.state is ReaderState.IN_CREATE:
            assert self._create is not None
            events.append(
                CreateInterrupted(
                    self._create.request_id,
                    f"JOB_CREATE {self._create.request_id}: input ended before JOB_CREATE_END",
                )
            )
            self._create = None
        self.state = ReaderState.CLOSED
        events.append(EndOfInput())


# --------------------------------------------------------------------------- encoders

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")


def one_line(text: str, default: str = "failed") -> str:
    """``text`` made fit for one protocol line: control characters (line ends above all)
    become spaces, the length is capped, and empty text becomes ``default``."""
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MAX_TEXT_LENGTH:
        text = text[: MAX_TEXT_LENGTH - 3] + "..."
    return text or default


def _line(text: str) -> bytes:
    return text.encode("utf-8") + EOL


def check_job_id(job_id: str) -> str:
    """``job_id`` if the client can take it: 1 to 1024 visible ASCII characters.

    ValueError otherwise (a server bug: job ids are the server's own)."""
    if not 0 < len(job_id) <= MAX_JOB_ID_LENGTH:
        raise ValueError(f"a job id must have 1 to {MAX_JOB_ID_LENGTH} characters, not {len(job_id)}")
    if not all("!" <= ch <= "~" for ch in job_id):
        raise ValueError(f"job id {job_id[:40]!r} holds a space or an invisible character")
    return job_id


def _check_request_id(request_id: str) -> str:
    if not (request_id.isascii() and request_id.isdigit()):
        raise ValueError(f"request id {request_id[:40]!r} is not a decimal number")
    return request_id


def reply_success(status: Optional[InvokeStatus] = None) -> bytes:
    """``S``, or ``S <status>`` (the answer to JOB_STATUS)."""
    return b"S\r\n" if status is None else _line(f"S {status.value}")


def reply_failure(reason: str) -> bytes:
    """``F <reason>``."""
    return _line("F " + one_line(reason))


def reply_features(
    features: Sequence[str] = (),
    requests: Sequence[str] = SERVER_REQUESTS,
    version: str = PROTOCOL_VERSION,
) -> bytes:
    """The multi-line answer to QUERY_FEATURES, ``SM`` to ``REPLY_END``."""
    lines = ["SM", f"protocol_version {one_line(version)}"]
    lines += [f"feature {one_line(name)}" for name in features]
    lines += [f"request {one_line(name)}" for name in requests]
    lines.append("REPLY_END")
    return b"".join(_line(line) for line in lines)


def notify_created(request_id: str, job_id: str) -> bytes:
    """``CREATE_NOTIFY <request_id> S <job_id>``."""
    return _line(f"CREATE_NOTIFY {_check_request_id(request_id)} S {check_job_id(job_id)}")


def notify_create_failed(request_id: str, reason: str) -> bytes:
    """``CREATE_NOTIFY <request_id> F <reason>``."""
    return _line(f"CREATE_NOTIFY {_check_request_id(request_id)} F {one_line(reason)}")


def notify_status(job_id: str, status: InvokeStatus, text: Optional[str] = None) -> bytes:
    """``STATUS_NOTIFY <job_id> <status> [<text>]``."""
    line = f"STATUS_NOTIFY {check_job_id(job_id)} {status.value}"
    if text is not None:
        text = one_line(text, default="")
        if text:
            line += " " + text
    return _line(line)


# --------------------------------------------------------------------------- the client's side


def encode_request(name: str, argument: Optional[str] = None) -> bytes:
    """A one-line request as the client writes it (``EXIT``, ``JOB_DESTROY job-1``...)."""
    if not _REQUEST_WORD.fullmatch(name.encode("ascii", "replace")):
        raise ValueError(f"{name!r} is not a request name")
    if argument is None:
        return _line(name)
    if not argument or any(ch.isspace() for ch in argument):
        raise ValueError(f"request argument {argument!r} is empty or holds white space")
    return _line(f"{name} {argument}")


def encode_job_create(
    request_id: Union[int, str],
    attributes: Sequence[Tuple[str, str]],
    terminator: str = "JOB_CREATE_END",
) -> bytes:
    """A JOB_CREATE with its attribute lines and terminator, as the client writes it."""
    if terminator not in CREATE_TERMINATORS:
        raise ValueError(f"{terminator!r} does not end a JOB_CREATE")
    parts = [_line(f"JOB_CREATE {_check_request_id(str(request_id))}")]
    for name, value in attributes:
        if not name or " " in name or _CONTROL.search(name) or _CONTROL.search(value):
            raise ValueError(f"attribute {name!r} {value!r} cannot be written on one line")
        parts.append(_line(f"{name} {value}"))
    parts.append(_line(terminator))
    return b"".join(parts)


@attrs.frozen
class CreateNotify:
    """A CREATE_NOTIFY read back: ``job_id`` on success, ``reason`` on failure."""

    request_id: str
    ok: bool
    job_id: Optional[str] = None
    reason: Optional[str] = None


@attrs.frozen
class StatusNotify:
    """A STATUS_NOTIFY read back."""

    job_id: str
    status: InvokeStatus
    text: Optional[str] = None


def parse_notify(line: str) -> Union[CreateNotify, StatusNotify, None]:
    """A notify line (line end removed) as the client reads it; None for any other line,
    which the client ignores.  ValueError for a known notify that is malformed."""
    name, _, rest = line.partition(" ")
    if name == "CREATE_NOTIFY":
        request_id, _, rest = rest.partition(" ")
        outcome, _, payload = rest.partition(" ")
        if not request_id or outcome not in ("S", "F"):
            raise ValueError(f"malformed CREATE_NOTIFY: {line[:80]!r}")
        if outcome == "S":
            if not payload or " " in payload:
                raise ValueError(f"CREATE_NOTIFY without a job id: {line[:80]!r}")
            return CreateNotify(request_id, True, job_id=payload)
        return CreateNotify(request_id, False, reason=payload)
    if name == "STATUS_NOTIFY":
        job_id, _, rest = rest.partition(" ")
        status, sep, text = rest.partition(" ")
        try:
            value = InvokeStatus(status)
        except ValueError:
            raise ValueError(f"STATUS_NOTIFY with unknown status {status!r}") from None
        if not job_id:
            raise ValueError(f"STATUS_NOTIFY without a job id: {line[:80]!r}")
        return StatusNotify(job_id, value, text if sep else None)
    return None
