"""The runtime protocol's wire format, shared by the agent's runtime server and a job's
processes (standard library only; see ``docs/runtime.md`` for the whole protocol).

A frame is a 4-byte unsigned big-endian length ``N`` (1 to :data:`MAX_FRAME`) followed by
``N`` bytes of one JSON object in UTF-8.  Requests and replies are such frames.  Byte
strings (message data, rendezvous data) travel base64-encoded.

Nothing here does I/O: :class:`FrameDecoder` is fed bytes and hands out objects.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Any, Dict, Optional, Tuple

__all__ = [
    "AUTH_FRAME",
    "ENV_CONTACT",
    "ENV_MULTIJOB",
    "ENV_PART",
    "ENV_PART_INDEX",
    "ENV_PART_LABEL",
    "ENV_PART_SIZE",
    "ENV_PARTS",
    "ENV_RANK",
    "ENV_SECRET",
    "ENV_GRAM_JOB_HANDLE",
    "ENV_GRAM_MULTIJOB_HANDLE",
    "ENV_GRAM_SUBJOB_RANK",
    "ERROR_KINDS",
    "FrameDecoder",
    "MAX_FRAME",
    "PROTOCOL_VERSION",
    "RANK_VARIABLES",
    "WireError",
    "b64",
    "encode_frame",
    "error_reply",
    "format_contact",
    "from_b64",
    "handle",
    "ok_reply",
    "parse_contact",
    "split_handle",
]

PROTOCOL_VERSION = 1
#: The largest frame body either side accepts.  Enough for the largest rendezvous
#: aggregate the agent holds (16 MiB) once base64-encoded, with room to spare.
MAX_FRAME = 24 * 1024 * 1024
_LENGTH = struct.Struct(">I")
#: The largest first request on a connection that has not yet shown its job's secret; a
#: larger one is preceded by an ``auth`` request (the envelope alone), which has no reply
#: unless it is refused.
AUTH_FRAME = 64 * 1024

# The environment the agent gives every process of a multi-part job.
ENV_CONTACT = "PROXY_AGENT_RUNTIME"  # unix:///path or tcp://host:port
ENV_SECRET = "PROXY_AGENT_RUNTIME_SECRET"  # the job's secret, hex
ENV_MULTIJOB = "PROXY_AGENT_MULTIJOB"  # the multi-part job's id
ENV_PART = "PROXY_AGENT_PART"  # the part's id (stable for the job's life)
ENV_PART_INDEX = "PROXY_AGENT_PART_INDEX"  # the part's index when it was submitted
ENV_PART_LABEL = "PROXY_AGENT_PART_LABEL"  # the part's label, when it has one
ENV_PART_SIZE = "PROXY_AGENT_PART_SIZE"  # the part's process count
ENV_PARTS = "PROXY_AGENT_PARTS"  # how many parts the job had when the part was submitted
ENV_RANK = "PROXY_AGENT_RANK"  # the process's rank, when the agent starts processes singly
ENV_GRAM_JOB_HANDLE = "GLOBUS_GRAM_JOB_HANDLE"  # serviceURL?JOB/PART
ENV_GRAM_MULTIJOB_HANDLE = "GLOBUS_GRAM_MULTIJOB_HANDLE"  # serviceURL?JOB
ENV_GRAM_SUBJOB_RANK = "GLOBUS_GRAM_SUBJOB_RANK"  # the part's index, 0 to n-1

#: Where a process finds its rank within its part, first match wins: the agent's own name,
#: the local scheduler's process index, then what common launchers set.
RANK_VARIABLES = (
    ENV_RANK,
    "PROXY_AGENT_PROCESS_INDEX",
    "SLURM_PROCID",
    "PMI_RANK",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
)

#: The error kinds a reply may carry (``{"ok": false, "error": {"kind": ..., "message": ...}}``).
ERROR_KINDS = (
    "protocol",  # the frame or request is malformed; the server closes the connection
    "unauthorized",  # wrong secret or unknown job; the server closes the connection
    "bad-request",  # names something that is not there (a rank out of range, a part)
    "not-allowed",  # not allowed now or from this process (parts fixed after the release)
    "job-ended",  # the multi-part job failed or was cancelled
    "cannot-complete",  # what the request waits for can never happen
    "limit",  # the request would exceed what the agent holds for one job
    "internal",  # the agent failed; the message says how
)


class WireError(Exception):
    """The byte stream or a frame in it is malformed; the connection cannot go on."""


def encode_frame(message: Dict[str, Any]) -> bytes:
    """``message`` as one frame."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise WireError(f"a frame of {len(body)} bytes is larger than the {MAX_FRAME} allowed")
    return _LENGTH.pack(len(body)) + body


class FrameDecoder:
    """Incremental frame decoder: :meth:`feed` bytes, then take objects with :meth:`next`.

    The declared length is checked before anything is kept for the body, so a hostile
    length costs nothing; bytes are kept only as they arrive.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._expected: Optional[int] = None

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buffer)

    @property
    def inside_frame(self) -> bool:
        return bool(self._buffer) or self._expected is not None

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> Optional[Dict[str, Any]]:
        """The next whole frame's object, ``None`` if more bytes are needed; raises
        :class:`WireError` for a bad length or a body that is not one JSON object."""
        if self._expected is None:
            if len(self._buffer) < _LENGTH.size:
                return None
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length == 0 or length > self.max_frame:
                raise WireError(f"frame length {length} is outside 1 to {self.max_frame}")
            del self._buffer[: _LENGTH.size]
            self._expected = length
        if len(self._buffer) < self._expected:
            return None
        body = bytes(self._buffer[: self._expected])
        del self._buffer[: self._expected]
        self._expected = None
        try:
            message = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise WireError(f"a frame body is not UTF-8 JSON: {error}") from None
        if not isinstance(message, dict):
            raise WireError("a frame body must be a JSON object")
        return message


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def from_b64(text: Any, what: str = "data") -> bytes:
    """Bytes from base64 text; ValueError naming ``what`` otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not valid base64") from None


def format_contact(kind: str, address: Any) -> str:
    """``unix:///path`` for a socket path, ``tcp://host:port`` for (host, port)."""
    if kind == "unix":
        return "unix://" + str(address)
    host, port = address
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def parse_contact(text: str) -> Tuple[str, Any]:
    """``("unix", path)`` or ``("tcp", (host, port))`` from a contact; ValueError otherwise."""
    if text.startswith("unix://"):
        path = text[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(f"a unix contact names an absolute path: {text!r}")
        return "unix", path
    if text.startswith("tcp://"):
        rest = text[len("tcp://") :]
        if rest.startswith("["):
            host, _, port_text = rest[1:].partition("]:")
        else:
            host, _, port_text = rest.rpartition(":")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"a tcp contact is tcp://HOST:PORT, not {text!r}")
        return "tcp", (host, int(port_text))
    raise ValueError(f"a contact is unix:///PATH or tcp://HOST:PORT, not {text!r}")


def handle(contact: str, job: str, part: Optional[int] = None) -> str:
    """A handle in the ``serviceURL?resourceID`` form: the multi-part job's
    (``CONTACT?JOB``) or one part's (``CONTACT?JOB/PART``)."""
    return f"{contact}?{job}" if part is None else f"{contact}?{job}/{part}"


def split_handle(text: str) -> Tuple[str, str, Optional[int]]:
    """(contact, job, part or None) from a handle; ValueError otherwise."""
    contact, sep, resource = text.rpartition("?")
    if not sep or not contact or not resource:
        raise ValueError(f"a handle is SERVICE-URL?RESOURCE-ID, not {text!r}")
    job, slash, part = resource.partition("/")
    if slash:
        if not part.isdigit():
            raise ValueError(f"a part handle ends in /PART-NUMBER, not {text!r}")
        return contact, job, int(part)
    return contact, job, None


def error_reply(request_id: Any, kind: str, message: str) -> Dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": {"kind": kind, "message": message}}


def ok_reply(request_id: Any, **results: Any) -> Dict[str, Any]:
    reply: Dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True}
    reply.update(results)
    return reply

