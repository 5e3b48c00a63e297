"""What coordinating a multi-part job hands out: its errors (a request refused, not allowed
now, the job ended...), its limits, verdicts, and the values the runtime's operations return;
and one part's state."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional, Set, Tuple

import attrs

from ..jobs import JobState
from .description import CommsType, Part, StartType
from .rendezvous import Rendezvous

# --------------------------------------------------------------------------- errors


class CoordinationError(Exception):
    """A request about a multi-part job was refused.  ``kind`` is a short word the runtime
    protocol carries; the message says why in a user's terms."""

    kind = "refused"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(CoordinationError):
    """The request names something that is not there or is malformed (a rank out of range,
    an unknown part, a rendezvous rank taken)."""

    kind = "bad-request"


class NotAllowed(CoordinationError):
    """The request is well formed but not allowed now or from this caller (adding a part
    after the release, inter-part calls from a rank other than 0)."""

    kind = "not-allowed"


class JobEnded(CoordinationError):
    """The multi-part job has failed or was cancelled; nothing more can be done in it."""

    kind = "job-ended"


class CannotComplete(CoordinationError):
    """What the caller waits for can never happen (a part ended without joining)."""

    kind = "cannot-complete"


class LimitExceeded(CoordinationError):
    """The request would hold more than the agent allows for one job."""

    kind = "limit"


# --------------------------------------------------------------------------- values handed out


@attrs.frozen
class Limits:
    """Bounds on what one multi-part job may make the agent hold."""

    #: bytes of messages waiting to be received, over all processes of the job
    queued_bytes: int = 64 * 1024 * 1024
    #: messages waiting to be received, over all processes of the job
    queued_messages: int = 100_000
    #: bytes of one message
    message_bytes: int = 4 * 1024 * 1024
    #: characters of a message tag
    tag_length: int = 256
    #: characters of one part's exchange text
    exchange_text: int = 1024 * 1024
    #: exchange rounds per job
    exchange_rounds: int = 1024
    #: bytes held by one rendezvous
    rendezvous_bytes: int = 16 * 1024 * 1024


@attrs.frozen
class Verdict:
    """What the service must do after a report: when ``failed`` (or ``cancelled``), cancel
    every part in ``cancel_parts`` (ids) in its scheduler.  ``reason`` says why."""

    failed: bool = False
    cancelled: bool = False
    reason: Optional[str] = None
    cancel_parts: Tuple[int, ...] = ()


@attrs.frozen
class ProcessView:
    """What a process learns about itself: its part (id, current index, label, types),
    its rank and the part's size, how many parts the job has, and whether the barrier has
    been released (after which ``part_index`` and ``parts`` are final)."""

    job_id: str
    part_id: int
    part_index: int
    parts: int
    label: Optional[str]
    rank: int
    size: int
    start_type: StartType
    comms_type: CommsType
    released: bool


@attrs.frozen
class BarrierPassed:
    """The barrier let a process through.  ``part_index`` and ``parts`` are final unless
    the part does not wait at the barrier (it may pass before the release)."""

    part_index: int
    parts: int
    final: bool


@attrs.frozen
class PartLayout:
    index: int
    part_id: int
    label: Optional[str]
    size: int
    in_group: bool


@attrs.frozen
class Structure:
    """The job's layout as the rank-0 process of a part in the inter-part group sees it:
    its own part's index and every part (those with ``in_group`` can be sent to)."""

    part_index: int
    parts: Tuple[PartLayout, ...]


@attrs.frozen
class ExchangeResult:
    """One exchange round: the caller's index and every group part's text, in part order
    (``texts[i]`` came from ``indexes[i]``)."""

    part_index: int
    indexes: Tuple[int, ...]
    texts: Tuple[str, ...]


@attrs.frozen
class Message:
    source: int  # the sender's rank (intra-part) or part index (inter-part)
    tag: str
    data: bytes


# --------------------------------------------------------------------------- one part


class PartState:
    def __init__(self, part_id: int, spec: Part, limits: Limits) -> None:
        self.id = part_id
        self.spec = spec
        self.checked_in: Set[int] = set()
        self.ended_ranks: Set[int] = set()
        self.end_state: Optional[JobState] = None  # set when the whole part has ended
        self.end_reason: Optional[str] = None
        self.mailboxes: Dict[int, Deque[Message]] = {}
        self.part_mailbox: Deque[Message] = collections.deque()
        self.joined = False
        self.contributions: List[str] = []
        self.rendezvous = Rendezvous(spec.count, 1, max_size=limits.rendezvous_bytes)
        self.registered_by: Set[int] = set()  # process ranks that registered at level 1
        self.level2_registered = False
        self.forward = False

    @property
    def size(self) -> int:
        return self.spec.count

    @property
    def label(self) -> Optional[str]:
        return self.spec.label

    @property
    def ended(self) -> bool:
        return self.end_state is not None or len(self.ended_ranks) == self.size

    def barrier_accounted(self) -> bool:
        """Every process of the part has checked in (or, for a loose part, has ended)."""
        if not self.spec.start_type.waits:
            return True
        if self.spec.start_type is StartType.LOOSE_BARRIER:
            if self.end_state is not None:
                return True
            return len(self.checked_in | self.ended_ranks) == self.size
        return len(self.checked_in) == self.size


