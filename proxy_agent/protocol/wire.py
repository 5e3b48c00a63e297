"""Framing of the proxy protocol: bytes <-> frames, with no I/O.

A frame on the wire is::

    LENGTH " " ID ":" TID ":" NARGS { " " ARGLEN ":" BYTES }

``LENGTH`` is 8 hex digits counting the bytes of everything after it (the
body, including its leading space); ``ID`` is 4 hex digits, ``TID``, ``NARGS``
and ``ARGLEN`` are 8 hex digits.  Argument lengths count UTF-8 bytes.  Hex is
written in upper case and accepted in either case.

The :class:`Decoder` is incremental: feed it bytes in chunks of any size and
pull complete :class:`Frame` objects (or :class:`FrameError` objects) out of
it.  It never raises on malformed input and never allocates what a length
field claims before checking it against a cap.

Errors fall into two classes (see ``spec/protocol.md``, "Malformed input"):

* *Framing errors* (``fatal=True``): the 8 length digits are not hex, the
  length exceeds the cap, the body does not begin with a space, or the
  stream ended inside a frame.  The decoder can no longer tell where the
  next frame starts, so it stops producing frames and the session must end.
* *Frame errors* (``fatal=False``): the length was well formed, so the
  frame's end is known; only its body is broken (bad header field, argument
  count mismatch, argument overrunning the frame, trailing bytes, invalid
  UTF-8).  The decoder skips exactly that frame and carries on; the agent
  answers ERROR (with the frame's TID when the header was readable).
"""

from __future__ import annotations

import enum
import re
from typing import Iterator, Optional, Sequence, Tuple, Union

import attrs

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "Decoder",
    "ErrorKind",
    "Frame",
    "FrameError",
    "assemble_frame",
    "encode_args",
    "encode_ascii_frame",
    "encode_frame",
]

#: Frames whose declared body length exceeds this are refused unread.
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

_LENGTH_DIGITS = 8
_HEADER_LEN = 23  # " XXXX:XXXXXXXX:XXXXXXXX"
_HEX8 = re.compile(rb"[0-9A-Fa-f]{8}")
_HEADER = re.compile(rb" ([0-9A-Fa-f]{4}):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8})")
# " LLLLLLLL:" for every short argument length, so encoding needs no formatting per argument.
_ARG_PREFIXES = tuple(" %08X:" % n for n in range(4096))
# ...and back, so decoding a short argument's length is one dictionary lookup.
_PREFIX_LENGTH = {prefix: n for n, prefix in enumerate(_ARG_PREFIXES)}
_ARG_PREFIX = re.compile(rb" ([0-9A-Fa-f]{8}):")


@attrs.frozen(slots=True)
class Frame:
    """One decoded frame: a command or an event, before interpretation."""

    msg_id: int
    tid: int
    args: tuple[str, ...] = ()


class ErrorKind(enum.Enum):
    """What part of the input was wrong."""

    # framing errors (fatal): the stream cannot be resynchronised
    BAD_LENGTH = "bad-length"
    FRAME_TOO_LARGE = "frame-too-large"
    MISSING_SPACE = "missing-space"
    TRUNCATED = "truncated"  # the stream ended inside a frame
    # frame errors: this frame is skipped, the stream stays usable
    BAD_HEADER = "bad-header"
    BAD_ARG_LENGTH = "bad-arg-length"
    ARG_OVERRUN = "arg-overrun"
    ARG_COUNT_MISMATCH = "arg-count-mismatch"
    TRAILING_BYTES = "trailing-bytes"
    BAD_ENCODING = "bad-encoding"

    @property
    def fatal(self) -> bool:
        return self in _FATAL_KINDS


_FATAL_KINDS = frozenset(
    {ErrorKind.BAD_LENGTH, ErrorKind.FRAME_TOO_LARGE, ErrorKind.MISSING_SPACE, ErrorKind.TRUNCATED}
)


@attrs.frozen(slots=True)
class FrameError:
    """Malformed input, reported in place of a frame.

    ``msg_id`` and ``tid`` are filled in when the header could be read, so
    the agent can answer the offending command under its own TID.
    """

    kind: ErrorKind
    message: str
    msg_id: Optional[int] = None
    tid: Optional[int] = None

    @property
    def fatal(self) -> bool:
        return self.kind.fatal

    def __str__(self) -> str:
        return self.message


def _show(data: bytes, limit: int = 24) -> str:
    text = repr(bytes(data[:limit]))
    return text + ("..." if len(data) > limit else "")


def _frame_text(msg_id: int, tid: int, args: Sequence[str]) -> Tuple[str, str]:
    """The frame's header and its text, with length fields right for ASCII arguments."""
    if not 0 <= msg_id <= 0xFFFF:
        raise ValueError(f"message id {msg_id} does not fit in 4 hex digits")
    if not 0 <= tid <= 0xFFFFFFFF:
        raise ValueError(f"TID {tid} does not fit in 8 hex digits")
    header = " %04X:%08X:%08X" % (msg_id, tid, len(args))
    prefixes = _ARG_PREFIXES
    limit = len(prefixes)
    try:
        # Fast path: every argument short enough for the prefix table.
        parts = [prefixes[len(arg)] + arg for arg in args]
    except IndexError:
        parts = [(prefixes[len(arg)] if len(arg) < limit else " %08X:" % len(arg)) + arg for arg in args]
    return header, header + "".join(parts)


def encode_ascii_frame(msg_id: int, tid: int, args: Sequence[str] = ()) -> Optional[bytes]:
    """:func:`encode_frame` for arguments that are all ASCII; None (at the same cost) if one is not.

    For an encoder that must treat other text first (the default dialect
    escapes it): the usual, all-ASCII frame is built once and checked once.
    """
    _, text = _frame_text(msg_id, tid, args)
    if not text.isascii():
        return None
    body = text.encode("ascii")
    return b"%08X" % len(body) + body


def encode_frame(msg_id: int, tid: int, args: Sequence[str] = ()) -> bytes:
    """Encode one frame.  Argument lengths count UTF-8 bytes.

    A lone surrogate in an argument cannot be written in UTF-8 and is sent as
    U+FFFD.

    Raises :class:`ValueError` if ``msg_id`` does not fit 4 hex digits or
    ``tid`` does not fit 8: a wider field would silently break the framing.
    """
    header, text = _frame_text(msg_id, tid, args)
    if not text.isascii():
        prefixes = _ARG_PREFIXES
        limit = len(prefixes)
        # Some argument is not ASCII: its length field must count UTF-8 bytes.
        # Only those arguments are measured again; the others keep their prefix.
        parts = []
        for arg in args:
            if arg.isascii():
                size = len(arg)
            else:
                try:
                    size = len(arg.encode("utf-8"))
                except UnicodeEncodeError:
                    # A lone surrogate (from output that was not UTF-8) has no UTF-8
                    # form at all; it travels as U+FFFD.  (The default dialect
                    # escapes it instead, losing nothing.)
                    arg = _without_surrogates(arg)
                    size = len(arg.encode("utf-8"))
            parts.append((prefixes[size] if size < limit else " %08X:" % size) + arg)
        text = header + "".join(parts)
    body = text.encode("utf-8")
    return b"%08X" % len(body) + body


def encode_args(args: Sequence[str]) -> bytes:
    """The encoded argument part of a frame (each argument with its length), for callers that
    assemble frames from pieces (:func:`assemble_frame`).  Lengths count UTF-8 bytes."""
    prefixes = _ARG_PREFIXES
    limit = len(prefixes)
    text = "".join([(prefixes[len(arg)] if len(arg) < limit else " %08X:" % len(arg)) + arg for arg in args])
    if not text.isascii():
        args = [_without_surrogates(arg) for arg in args]
        text = "".join([" %08X:%s" % (len(arg.encode("utf-8")), arg) for arg in args])
    return text.encode("utf-8")


def assemble_frame(msg_id: int, tid: int, nargs: int, args: bytes) -> bytes:
    """A whole frame from its encoded arguments (:func:`encode_args`) and their count."""
    if not 0 <= msg_id <= 0xFFFF:
        raise ValueError(f"message id {msg_id} does not fit in 4 hex digits")
    if not 0 <= tid <= 0xFFFFFFFF:
        raise ValueError(f"TID {tid} does not fit in 8 hex digits")
    body = b" %04X:%08X:%08X" % (msg_id, tid, nargs) + args
    return b"%08X" % len(body) + body
def _without_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (pairs are joined into their character)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _parse_body(body: bytes) -> Union[Frame, FrameError]:
    """Parse one frame body (starting with its leading space)."""
    header = _HEADER.match(body)
    if header is None:
        return _header_error(body)
    msg_id = int(header.group(1), 16)
    tid = int(header.group(2), 16)
    nargs = int(header.group(3), 16)
    pos = _HEADER_LEN
    end = len(body)
    raw_args: list[bytes] = []
    for index in range(nargs):
        if pos >= end:
            return FrameError(
                ErrorKind.ARG_COUNT_MISMATCH,
                f"frame declares {nargs} arguments but ends after {index}",
                msg_id,
                tid,
            )
        prefix = _ARG_PREFIX.match(body, pos)
        if prefix is None:
            return FrameError(
                ErrorKind.BAD_ARG_LENGTH,
                f"argument {index + 1} of {nargs}: expected ' ' + 8 hex digits + ':' at byte "
                f"{pos} of the body, found {_show(body[pos:pos + 10])}",
                msg_id,
                tid,
            )
        length = int(prefix.group(1), 16)
        start = pos + 10
        stop = start + length
        if stop > end:
            return FrameError(
                ErrorKind.ARG_OVERRUN,
                f"argument {index + 1} of {nargs} claims {length} bytes but only "
                f"{end - start} remain in the frame",
                msg_id,
                tid,
            )
        raw_args.append(body[start:stop])
        pos = stop
    if pos != end:
        extra = _count_extra_args(body, pos)
        if extra:
            return FrameError(
                ErrorKind.ARG_COUNT_MISMATCH,
                f"frame declares {nargs} arguments but carries {nargs + extra}",
                msg_id,
                tid,
            )
        return FrameError(
            ErrorKind.TRAILING_BYTES,
            f"{end - pos} unexpected bytes after the last argument: {_show(body[pos:])}",
            msg_id,
            tid,
        )
    try:
        args = tuple(raw.decode("utf-8") for raw in raw_args)
    except UnicodeDecodeError as exc:
        return FrameError(ErrorKind.BAD_ENCODING, f"argument is not valid UTF-8: {exc}", msg_id, tid)
    return Frame(msg_id, tid, args)


def _count_extra_args(body: bytes, pos: int) -> int:
    """How many well-formed arguments fill body[pos:] exactly (0 if they don't)."""
    count = 0
    end = len(body)
    while pos < end:
        prefix = _ARG_PREFIX.match(body, pos)
        if prefix is None:
            return 0
        pos += 10 + int(prefix.group(1), 16)
        if pos > end:
            return 0
        count += 1
    return count


def _header_error(body: bytes) -> FrameError:
    """Name the header field that is wrong, salvaging id/TID where possible."""
    fields = (("command/event id", 1, 4), ("TID", 6, 8), ("argument count", 15, 8))
    msg_id = tid = None
    if len(body) < _HEADER_LEN:
        return FrameError(
            ErrorKind.BAD_HEADER,
            f"frame body of {len(body)} bytes is shorter than the {_HEADER_LEN}-byte header: {_show(body)}",
        )
    for name, start, width in fields:
        digits = body[start:start + width]
        if _HEX8.fullmatch(digits.rjust(8, b"0")) is None:
            return FrameError(
                ErrorKind.BAD_HEADER,
                f"header {name} is not {width} hex digits: {_show(digits)}",
                msg_id,
                tid,
            )
        if name == "command/event id":
            msg_id = int(digits, 16)
        elif name == "TID":
            tid = int(digits, 16)
    return FrameError(
        ErrorKind.BAD_HEADER,
        f"header fields must be separated by ':', found {_show(body[:_HEADER_LEN])}",
        msg_id,
        tid,
    )


class Decoder:
    """Incremental frame decoder.

    >>> d = Decoder()
    >>> d.feed(b"00000017 0003:00000003:00000000")
    >>> d.next_event()
    Frame(msg_id=3, tid=3, args=())
    >>> d.next_event() is None
    True

    The caller should drain the decoder (iterate it until it stops) after
    each :meth:`feed`; the buffer then never holds more than one partial
    frame (at most ``max_frame_size + 8`` bytes) plus the latest chunk.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        #: The framing error that stopped this decoder, if any.
        self.failed: Optional[FrameError] = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        """Add received bytes.  After a framing error further data is ignored."""
        if self.failed is not None or self._eof:
            return
        if self._pos:
            # Dropping a bytearray's head is cheap in CPython (no memmove).
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def feed_eof(self) -> None:
        """The peer closed the stream; a partial frame left over is an error."""
        self._eof = True

    def _fail(self, kind: ErrorKind, message: str) -> FrameError:
        self.failed = FrameError(kind, message)
        self._buf = bytearray()
        self._pos = 0
        return self.failed

    def next_event(self) -> Union[Frame, FrameError, None]:
        """The next complete frame, a :class:`FrameError`, or None (need more data).

        A fatal error is returned once; after it the decoder returns None.
        """
        if self.failed is not None:
            return None
        buf = self._buf
        pos = self._pos
        # Fast path: a whole, well-formed frame is buffered.  It is parsed
        # straight from the buffer; anything unusual falls through to the
        # careful path below, which owns every error message.
        head = _FRAME_HEAD.match(buf, pos)
        if head is not None:
            length = int(head.group(1), 16)
            end = pos + _LENGTH_DIGITS + length
            if _HEADER_LEN <= length <= self.max_frame_size and end <= len(buf):
                frame = _parse_in_place(buf, head, end)
                if frame is not None:
                    self._pos = end
                    return frame
        return self._next_careful(buf, pos)

    def _next_careful(self, buf: bytearray, pos: int) -> Union[Frame, FrameError, None]:
        available = len(buf) - pos
        if available < _LENGTH_DIGITS:
            if self._eof and available:
                return self._fail(
                    ErrorKind.TRUNCATED, f"stream ended inside a frame length: {_show(buf[pos:])}"
                )
            return None
        digits = bytes(buf[pos:pos + _LENGTH_DIGITS])
        if _HEX8.fullmatch(digits) is None:
            return self._fail(ErrorKind.BAD_LENGTH, f"frame length is not 8 hex digits: {_show(digits)}")
        # Each verdict below is reached from the same bytes whatever the chunking:
        # the first three from the 8 length digits alone, the fourth from exactly
        # one more byte, and nothing is decided from bytes that merely happen to
        # be buffered already.
        length = int(digits, 16)
        if length > self.max_frame_size:
            return self._fail(
                ErrorKind.FRAME_TOO_LARGE,
                f"frame length {length} exceeds the limit of {self.max_frame_size} bytes",
            )
        if length == 0:
            return self._fail(ErrorKind.MISSING_SPACE, "frame length 0: the body must start with a space")
        if available == _LENGTH_DIGITS:
            if self._eof:
                return self._fail(ErrorKind.TRUNCATED, f"stream ended after 0 of {length} frame bytes")
            return None
        if buf[pos + _LENGTH_DIGITS] != 0x20:
            return self._fail(
                ErrorKind.MISSING_SPACE,
                f"frame length is not followed by a space: {_show(buf[pos:pos + _LENGTH_DIGITS + 1])}",
            )
        end = pos + _LENGTH_DIGITS + length
        if end > len(buf):
            if self._eof:
                return self._fail(
                    ErrorKind.TRUNCATED,
                    f"stream ended after {available - _LENGTH_DIGITS} of {length} frame bytes",
                )
            return None
        body = bytes(buf[pos + _LENGTH_DIGITS:end])
        self._pos = end
        return _parse_body(body)

    def __iter__(self) -> Iterator[Union[Frame, FrameError]]:
        """Yield everything decodable from the data fed so far."""
        next_event = self.next_event
        while True:
            item = next_event()
            if item is None:
                return
            yield item
            if item.__class__ is FrameError and item.fatal:
                return


# LENGTH and the whole header in one match, for the fast path.
_FRAME_HEAD = re.compile(rb"([0-9A-Fa-f]{8}) ([0-9A-Fa-f]{4}):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8})")


def _parse_in_place(buf: bytearray, head: "re.Match[bytes]", end: int) -> Optional[Frame]:
    """Parse a well-formed frame straight out of the buffer; None if it is not one.

    ``head`` matched LENGTH and the header, and the frame ends at ``end``
    (already checked to be inside ``buf``).  Returning None sends the frame
    to :func:`_parse_body`, which explains what is wrong with it.
    """
    _, msg_id, tid, nargs = head.groups()
    count = int(nargs, 16)
    first = head.end()
    try:
        # Nearly all traffic is ASCII, where byte and character offsets agree:
        # decode all arguments at once and cut the text.
        text = buf[first:end].decode("ascii")
    except UnicodeDecodeError:
        args = _split_args_bytes(buf, first, end, count)
        if args is None:
            return None
        return Frame(int(msg_id, 16), int(tid, 16), args)
    size = len(text)
    pos = 0
    out = []
    append = out.append
    known = _PREFIX_LENGTH.get
    try:
        for _ in range(count):
            start = pos + 10
            length = known(text[pos:start])  # " LLLLLLLL:" of a short argument, as written by us
            if length is None:
                if start > size or text[pos] != " " or text[pos + 9] != ":":
                    return None
                digits = text[pos + 1:pos + 9]
                # isalnum() rules out the sign, blank and '_' that int() would
                # accept; int() itself rejects letters beyond F.  So pos only
                # moves forward, and the loop ends within the frame.
                if not digits.isalnum():
                    return None
                length = int(digits, 16)
            pos = start + length
            if pos > size:
                return None
            append(text[start:pos])
    except ValueError:
        return None
    if pos != size:
        return None
    return Frame(int(msg_id, 16), int(tid, 16), tuple(out))


def _split_args_bytes(buf: bytearray, pos: int, end: int, count: int) -> Optional[tuple]:
    args = []
    append = args.append
    match_prefix = _ARG_PREFIX.match
    try:
        for _ in range(count):
            prefix = match_prefix(buf, pos, end)
            if prefix is None:
                return None
            start = pos + 10
            pos = start + int(prefix.group(1), 16)
            if pos > end:
                return None
            append(buf[start:pos].decode("utf-8"))
    except UnicodeDecodeError:
        return None
    if pos != end:
        return None
    return tuple(args)
