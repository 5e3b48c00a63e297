"""What the processes of a co-allocated multi-part job call: the start barrier, their place
in the job, messages within a part and between parts, the exchange, and the rendezvous.

Standard library only, Python 3.9 and later, no trio: a job's program imports this on any
node.  Everything it needs comes from the environment the agent gives each process
(``PROXY_AGENT_RUNTIME``, ``PROXY_AGENT_RUNTIME_SECRET``, ``PROXY_AGENT_MULTIJOB``,
``PROXY_AGENT_PART``, ...; see ``docs/coallocation.md``)::

    from proxy_agent import runtime

    runtime.barrier()                       # wait until every part has started
    me, n = runtime.rank(), runtime.size()  # my place within my part
    runtime.register(b"host:port")          # my contact, into my part's rendezvous
    if me == 0:
        runtime.forward()                   # the agent passes my part's data up a level
    everyone = runtime.rendezvous_items(level=2)   # every process of every part

Each call opens a connection to the agent, sends one request and waits for its answer, so
calls block until they can be answered (a ``timeout`` in seconds bounds any of them).  The
calls are not meant to be made from several threads at once.  Failures raise a subclass of
:class:`CoallocError` whose message says what went wrong.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import wire
from .rendezvous_data import FormatError, decode, encode

__all__ = [
    "AgentError",
    "BarrierPassed",
    "CannotComplete",
    "CoallocError",
    "Exchanged",
    "FormatError",
    "JobEnded",
    "Message",
    "NotAuthorized",
    "NotInMultiJob",
    "PartLayout",
    "Refused",
    "Runtime",
    "Structure",
    "Subscription",
    "Timeout",
    "barrier",
    "decode",
    "default",
    "encode",
    "exchange",
    "flatten",
    "forward",
    "info",
    "part_index",
    "part_receive",
    "part_receive_message",
    "part_send",
    "rank",
    "receive",
    "receive_message",
    "register",
    "rendezvous_items",
    "send",
    "size",
    "structure",
    "subscribe",
    "wait_rendezvous",
]


# --------------------------------------------------------------------------- errors


class CoallocError(Exception):
    """A runtime call failed.  ``exit_code`` is what ``proxy-runtime`` exits with."""

    exit_code = 1


class NotInMultiJob(CoallocError):
    """The environment does not describe a multi-part job's process (or describes it wrongly)."""

    exit_code = 3


class NotAuthorized(CoallocError):
    """The agent did not accept this process's secret: the job is over, or the environment is not its own."""

    exit_code = 3


class AgentError(CoallocError):
    """The agent could not be reached, the connection broke, or the agent failed."""

    exit_code = 4


class JobEnded(CoallocError):
    """The multi-part job has failed or was cancelled."""

    exit_code = 5


class Refused(CoallocError):
    """The agent refused the request; ``kind`` says how (``bad-request``, ``not-allowed``, ``limit``)."""

    exit_code = 1

    def __init__(self, message: str, kind: str = "bad-request") -> None:
        super().__init__(message)
        self.kind = kind


class CannotComplete(Refused):
    """What the call waits for can never happen (say, a part ended without registering)."""


class Timeout(CoallocError):
    """The call's timeout passed first; the request was abandoned."""

    exit_code = 6


_ERRORS = {
    "job-ended": JobEnded,
    "unauthorized": NotAuthorized,
    "protocol": AgentError,
    "internal": AgentError,
}


# --------------------------------------------------------------------------- results


class BarrierPassed(NamedTuple):
    """Past the barrier: the part's index and the job's part count (``final``: fixed for the
    job's life, which holds for every part that waits at the barrier)."""

    part_index: int
    parts: int
    final: bool


class Message(NamedTuple):
    """A received message: ``source`` is the sender's rank (within a part) or part index
    (between parts)."""

    source: int
    tag: str
    data: bytes


class PartLayout(NamedTuple):
    index: int
    label: Optional[str]
    size: int
    in_group: bool


class Structure(NamedTuple):
    """The job's layout: this part's index and every part; parts with ``in_group`` take part
    in messages between parts and the exchange."""

    part_index: int
    parts: List[PartLayout]


class Exchanged(NamedTuple):
    """One exchange: this part's index and every group part's text, in part order
    (``texts[i]`` came from part ``indexes[i]``)."""

    part_index: int
    indexes: List[int]
    texts: List[str]


# --------------------------------------------------------------------------- the environment


def _env_int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    text = environ.get(name)
    if text is None:
        raise NotInMultiJob(f"{name} is not set: this process was not started as part of a multi-part job")
    try:
        value = int(text.strip())
    except ValueError:
        raise NotInMultiJob(f"{name} must be a whole number, not {text!r}") from None
    if value < minimum:
        raise NotInMultiJob(f"{name} must be at least {minimum}, not {value}")
    return value


def _rank_from(environ: Mapping[str, str], size: int) -> int:
    for name in wire.RANK_VARIABLES:
        if environ.get(name, "").strip():
            rank = _env_int(environ, name)
            if rank >= size:
                raise NotInMultiJob(f"{name}={rank} is outside this part's {size} processes")
            return rank
    if size == 1:
        return 0
    names = ", ".join(wire.RANK_VARIABLES)
    raise NotInMultiJob(f"cannot tell this process's rank within its part of {size}: none of {names} is set")


# --------------------------------------------------------------------------- one process's runtime


class Runtime:
    """The runtime as one process sees it, configured from ``environ`` (default: this
    process's environment).  ``timeout`` is the default for every call (``None``: wait as
    long as it takes); ``connect_timeout`` bounds how long a call keeps trying to reach
    an agent that refuses connections."""

    def __init__(
        self,
        environ: Optional[Mapping[str, str]] = None,
        *,
        timeout: Optional[float] = None,
        connect_timeout: float = 30.0,
    ) -> None:
        environ = os.environ if environ is None else environ
        contact = environ.get(wire.ENV_CONTACT)
        if not contact:
            raise NotInMultiJob(f"{wire.ENV_CONTACT} is not set: this process was not started as part of a multi-part job")
        try:
            self.contact_kind, self.address = wire.parse_contact(contact)
        except ValueError as error:
            raise NotInMultiJob(f"{wire.ENV_CONTACT}: {error}") from None
        self.contact = contact
        self.secret = environ.get(wire.ENV_SECRET, "")
        if not self.secret:
            raise NotInMultiJob(f"{wire.ENV_SECRET} is not set")
        self.job_id = environ.get(wire.ENV_MULTIJOB, "")
        if not self.job_id:
            raise NotInMultiJob(f"{wire.ENV_MULTIJOB} is not set")
        self.part_id = _env_int(environ, wire.ENV_PART)
        self._size = _env_int(environ, wire.ENV_PART_SIZE, 1)
        self._rank = _rank_from(environ, self._size)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._request_id = 0
        self._passed: Optional[BarrierPassed] = None

    # ------------------------------------------------------------------ talking to the agent

    def _open(self, seconds: float) -> socket.socket:
        if self.contact_kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(seconds)
                sock.connect(self.address)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = socket.create_connection(self.address, timeout=seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock

    def _connect(self, deadline: Optional[float]) -> socket.socket:
        """A connection to the agent, trying again for a while when it is refused (the
        agent's queue of new connections may be full while many processes start)."""
        give_up = time.monotonic() + self.connect_timeout
        if deadline is not None:
            give_up = min(give_up, deadline)
        pause = 0.02
        while True:
            try:
                return self._open(max(0.01, give_up - time.monotonic()))
            except OSError as error:
                transient = isinstance(error, socket.timeout) or error.errno in (
                    errno.ECONNREFUSED,
                    errno.EAGAIN,
                    errno.ENOENT,
                )
                if not transient or time.monotonic() + pause > give_up:
                    if deadline is not None and time.monotonic() + pause > deadline:
                        raise Timeout(f"could not reach the agent at {self.contact} in time: {error}") from None
                    raise AgentError(f"cannot reach the agent at {self.contact}: {error}") from None
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def call(self, op: str, timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """Send one request and return the reply's fields; raises :class:`CoallocError`."""
        if timeout is None:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        self._request_id += 1
        request = {
            "v": wire.PROTOCOL_VERSION,
            "id": self._request_id,
            "op": op,
            "job": self.job_id,
            "part": self.part_id,
            "rank": self._rank,
            "secret": self.secret,
        }
        request.update(fields)
        frame = wire.encode_frame(request)
        if len(frame) > wire.AUTH_FRAME:
            # the agent takes a large request only from a connection that has shown its
            # job's secret: the envelope goes first, in a frame of its own (not answered)
            envelope = {key: request[key] for key in ("v", "id", "job", "part", "rank", "secret")}
            frame = wire.encode_frame({**envelope, "op": "auth"}) + frame
        sock = self._connect(deadline)
        try:
            try:
                sock.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
                sock.sendall(frame)
                reply = self._read_reply(sock, deadline)
            except socket.timeout:
                raise Timeout(f"{op}: no answer within {timeout:g} s") from None
            except wire.WireError as error:
                raise AgentError(f"{op}: the agent's answer is malformed: {error}") from None
            except OSError as error:
                raise AgentError(f"{op}: the connection to the agent broke: {error}") from None
        finally:
            sock.close()
        if reply.get("id") != self._request_id and reply.get("id") is not None:
            raise AgentError(f"{op}: the agent answered another request")
        if reply.get("ok") is True:
            return reply
        error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        kind = str(error.get("kind", "internal"))
        message = str(error.get("message", "the agent refused the request"))
        if kind == "cannot-complete":
            raise CannotComplete(message, kind)
        if kind in _ERRORS:
            raise _ERRORS[kind](message)
        raise Refused(message, kind)

    @staticmethod
    def _read_reply(sock: socket.socket, deadline: Optional[float]) -> Dict[str, Any]:
        decoder = wire.FrameDecoder()
        while True:
            reply = decoder.next()
            if reply is not None:
                return reply
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the agent closed the connection without answering")
            decoder.feed(data)

    # ------------------------------------------------------------------ this process

    def rank(self) -> int:
        """This process's rank within its part, 0 to ``size() - 1``."""
        return self._rank

    def size(self) -> int:
        """How many processes the part has."""
        return self._size

    def info(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """What the agent knows of this process: part id and index, label, rank, size, the
        job's part count, the part's start and comms types, whether the barrier is released."""
        reply = self.call("hello", timeout)
        return {key: value for key, value in reply.items() if key not in ("v", "id", "ok")}

    def part_index(self, timeout: Optional[float] = None) -> int:
        """This part's index in the job (final once past the barrier)."""
        if self._passed is not None and self._passed.final:
            return self._passed.part_index
        return int(self.info(timeout)["part_index"])

    # ------------------------------------------------------------------ the barrier

    def barrier(self, timeout: Optional[float] = None) -> BarrierPassed:
        """Check in at the start barrier and wait until it is released.  Raises
        :class:`JobEnded` if the job fails meanwhile (a strict part ended early)."""
        reply = self.call("barrier", timeout)
        self._passed = BarrierPassed(int(reply["part_index"]), int(reply["parts"]), bool(reply["final"]))
        return self._passed

    # ------------------------------------------------------------------ within the part

    def send(self, dest_rank: int, tag: str, data: bytes, timeout: Optional[float] = None) -> None:
        """Send ``data`` tagged ``tag`` to process ``dest_rank`` of this part."""
        self.call("send", timeout, dest=_int(dest_rank, "dest_rank"), tag=_tag(tag), data=wire.b64(_data(data)))

    def receive_message(self, tag: str, timeout: Optional[float] = None) -> Message:
        """The oldest message to this process tagged ``tag``, waiting for one; messages with
        other tags keep waiting, in order, for calls that ask for their tag."""
        reply = self.call("receive", timeout, tag=_tag(tag))
        return Message(int(reply["source"]), str(reply["tag"]), wire.from_b64(reply["data"]))

    def receive(self, tag: str, timeout: Optional[float] = None) -> bytes:
        return self.receive_message(tag, timeout).data

    # ------------------------------------------------------------------ between parts (rank 0)

    def structure(self, timeout: Optional[float] = None) -> Structure:
        """Join the inter-part group (rank 0 only) and wait until every group part has;
        the job's layout."""
        reply = self.call("structure", timeout)
        parts = [
            PartLayout(int(item["index"]), item.get("label"), int(item["size"]), bool(item["in_group"]))
            for item in reply["parts"]
        ]
        return Structure(int(reply["part_index"]), parts)

    def part_send(self, part: int, tag: str, data: bytes, timeout: Optional[float] = None) -> None:
        """Send ``data`` tagged ``tag`` to the rank-0 process of the part at index ``part``."""
        self.call("part_send", timeout, dest=_int(part, "part"), tag=_tag(tag), data=wire.b64(_data(data)))

    def part_receive_message(self, tag: str, timeout: Optional[float] = None) -> Message:
        reply = self.call("part_receive", timeout, tag=_tag(tag))
        return Message(int(reply["source"]), str(reply["tag"]), wire.from_b64(reply["data"]))

    def part_receive(self, tag: str, timeout: Optional[float] = None) -> bytes:
        """The oldest message from another part tagged ``tag`` (rank 0 only)."""
        return self.part_receive_message(tag, timeout).data

    def exchange(self, text: str, timeout: Optional[float] = None) -> Exchanged:
        """Give ``text`` (rank 0 only) and get every group part's text, in part order."""
        if not isinstance(text, str):
            raise TypeError(f"exchange text is str, not {type(text).__name__}")
        reply = self.call("exchange", timeout, text=text)
        return Exchanged(int(reply["part_index"]), [int(i) for i in reply["indexes"]], [str(t) for t in reply["texts"]])

    # ------------------------------------------------------------------ the rendezvous

    def register(self, data: bytes, rank: int = -1, level: int = 1, timeout: Optional[float] = None) -> int:
        """Register ``data`` with the part's rendezvous (level 1) at ``rank`` (-1: the next
        free one); the rank used.  At level 2 the part's rank-0 process registers its
        part's level-1 aggregate with the job's rendezvous (this waits for the release)."""
        reply = self.call(
            "register", timeout, level=_int(level, "level"), at_rank=_int(rank, "rank"), data=wire.b64(_data(data))
        )
        return int(reply["rank"])

    def forward(self, timeout: Optional[float] = None) -> None:
        """Ask the agent to register this part's level-1 aggregate at level 2 itself, at the
        part's index, as soon as it is complete."""
        self.call("forward", timeout)

    def subscribe(self, level: int = 1) -> "Subscription":
        """A handle on the level-``level`` rendezvous' completion."""
        return Subscription(self, _int(level, "level"))

    def wait_rendezvous(self, level: int = 1, timeout: Optional[float] = None) -> bytes:
        """The complete level-``level`` aggregate (in the rendezvous format), waiting for it."""
        reply = self.call("rendezvous", timeout, level=_int(level, "level"), wait=True)
        return wire.from_b64(reply["data"])

    def rendezvous_items(self, level: int = 1, timeout: Optional[float] = None) -> List[bytes]:
        """Every process's registered bytes, in order (part by part, then rank by rank)."""
        return flatten(decode(self.wait_rendezvous(level, timeout), level))


class Subscription:
    """Waits for one rendezvous to complete."""

    def __init__(self, runtime: Runtime, level: int) -> None:
        self.runtime = runtime
        self.level = level

    def poll(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The aggregate if the rendezvous is complete, else ``None`` (does not wait)."""
        reply = self.runtime.call("rendezvous", timeout, level=self.level, wait=False)
        data = reply.get("data")
        return None if data is None else wire.from_b64(data)

    def wait(self, timeout: Optional[float] = None) -> bytes:
        return self.runtime.wait_rendezvous(self.level, timeout)


def flatten(datum: Union[bytes, Tuple[Any, ...]]) -> List[bytes]:
    """The level-0 items of a decoded datum, in order."""
    if isinstance(datum, bytes):
        return [datum]
    items: List[bytes] = []
    for item in datum:
        items.extend(flatten(item))
    return items


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is an int, not {type(value).__name__}")
    return value


def _tag(tag: Any) -> str:
    if not isinstance(tag, str):
        raise TypeError(f"a message tag is str, not {type(tag).__name__}")
    return tag


def _data(data: Any) -> bytes:
    if isinstance(data, str) or not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data is bytes, not {type(data).__name__} (encode text first)")
    return bytes(data)


# --------------------------------------------------------------------------- module-level calls

_default: Optional[Runtime] = None


def default() -> Runtime:
    """The runtime of this process, from its environment (made on first use)."""
    global _default
    if _default is None:
        _default = Runtime()
    return _default


def info(timeout: Optional[float] = None) -> Dict[str, Any]:
    return default().info(timeout)


def barrier(timeout: Optional[float] = None) -> BarrierPassed:
    return default().barrier(timeout)


def rank() -> int:
    return default().rank()


def size() -> int:
    return default().size()


def part_index(timeout: Optional[float] = None) -> int:
    return default().part_index(timeout)


def send(dest_rank: int, tag: str, data: bytes, timeout: Optional[float] = None) -> None:
    default().send(dest_rank, tag, data, timeout)


def receive(tag: str, timeout: Optional[float] = None) -> bytes:
    return default().receive(tag, timeout)


def receive_message(tag: str, timeout: Optional[float] = None) -> Message:
    return default().receive_message(tag, timeout)


def structure(timeout: Optional[float] = None) -> Structure:
    return default().structure(timeout)


def part_send(part: int, tag: str, data: bytes, timeout: Optional[float] = None) -> None:
    default().part_send(part, tag, data, timeout)


def part_receive(tag: str, timeout: Optional[float] = None) -> bytes:
    return default().part_receive(tag, timeout)


def part_receive_message(tag: str, timeout: Optional[float] = None) -> Message:
    return default().part_receive_message(tag, timeout)


def exchange(text: str, timeout: Optional[float] = None) -> Exchanged:
    return default().exchange(text, timeout)


def register(data: bytes, rank: int = -1, level: int = 1, timeout: Optional[float] = None) -> int:
    return default().register(data, rank, level, timeout)


def forward(timeout: Optional[float] = None) -> None:
    default().forward(timeout)


def subscribe(level: int = 1) -> Subscription:
    return default().subscribe(level)


def wait_rendezvous(level: int = 1, timeout: Optional[float] = None) -> bytes:
    return default().wait_rendezvous(level, timeout)


def rendezvous_items(level: int = 1, timeout: Optional[float] = None) -> List[bytes]:
    return default().rendezvous_items(level, timeout)
