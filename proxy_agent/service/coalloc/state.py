"""The coordination state of one co-allocated multi-part job.

:class:`MultiJob` holds what the agent knows about a multi-part job's parts and processes
and decides everything about them: who has checked in at the start barrier, when the
barrier opens, whether a part may still be added or deleted, whether an early end makes the
whole job fail, which messages wait for whom, and how the rendezvous fill.  It does no I/O
and never waits: the runtime server asks it, and waits for the job to change when the
answer is "not yet".

Two kinds of callers:

* the **service**, which submits the parts: :meth:`MultiJob.add_part`,
  :meth:`~MultiJob.delete_part`, :meth:`~MultiJob.release_barrier`,
  :meth:`~MultiJob.process_ended`, :meth:`~MultiJob.part_ended`,
  :meth:`~MultiJob.fail`, :meth:`~MultiJob.cancel`.  The calls that can end the job return
  a :class:`Verdict` saying which parts the service must now cancel in their schedulers.
* the **processes** of the parts, through the runtime server, each named by its part's
  id (stable for the job's life) and its rank within the part.  Calls that would block
  come in two halves: one that records the request (``check_in``, ``join``,
  ``contribute``...) and a *poll* that returns ``None`` until the answer is there.  Every
  poll raises :class:`JobEnded` once the job has failed or been cancelled, so nobody
  waits for a job that is gone.

Parts are named by *id* (never reused) in requests; the *index* of a part (its place
among the job's current parts, ``GLOBUS_GRAM_SUBJOB_RANK``) shifts when an earlier part
is deleted, and is final from the barrier's release on.
"""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional, Set, Tuple

import attrs

from ..jobs import JobState
from .description import (
    BarrierRelease,
    CommsType,
    DescriptionError,
    MAX_PARTS,
    MultiJobDescription,
    Part,
    StartType,
)
from .rendezvous import FormatError, Rendezvous, RendezvousError

__all__ = [
    "BarrierPassed",
    "CannotComplete",
    "CoordinationError",
    "ExchangeResult",
    "JobEnded",
    "Limits",
    "MultiJob",
    "NotAllowed",
    "PartLayout",
    "ProcessView",
    "Refused",
    "Structure",
    "Verdict",
]


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


class _PartState:
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


# --------------------------------------------------------------------------- the job


class MultiJob:
    """The coordination state of one multi-part job (see the module's docstring)."""

    def __init__(
        self,
        job_id: str,
        description: MultiJobDescription,
        *,
        limits: Limits = Limits(),
    ) -> None:
        self.job_id = job_id
        self.description = description
        self.limits = limits
        self._next_part_id = 0
        self._parts: Dict[int, _PartState] = {}  # in index order (dicts keep insertion order)
        self._deleted: Dict[int, str] = {}
        self.released = False
        self._release_when_all_in = False
        self.failure: Optional[str] = None
        self.cancellation: Optional[str] = None
        self._level2: Optional[Rendezvous] = None
        self._level2_problem: Optional[str] = None
        self._group: Tuple[int, ...] = ()
        self._exchanges: List[Dict[int, str]] = []
        self._queued_bytes = 0
        self._queued_messages = 0
        #: counts every change; a waiter compares it to know whether to poll again
        self.version = 0
        for part in description.parts:
            self._add(part)
        self._settle()

    # ------------------------------------------------------------------ looking up

    @property
    def part_ids(self) -> Tuple[int, ...]:
        """The current parts' ids in index order."""
        return tuple(self._parts)

    def part_spec(self, part_id: int) -> Part:
        return self._part(part_id).spec

    def index_of(self, part_id: int) -> int:
        return list(self._parts).index(self._part(part_id).id)

    def part_name(self, part_id: int) -> str:
        """``part 2 ('sub1')`` - how messages name a part."""
        part = self._parts.get(part_id)
        if part is None:
            return f"part #{part_id}"
        index = list(self._parts).index(part_id)
        return f"part {index}" + (f" ({part.label!r})" if part.label is not None else "")

    def part_by_label(self, label: str) -> int:
        for part in self._parts.values():
            if part.label == label:
                return part.id
        raise Refused(f"the job has no part labelled {label!r}")

    def _part(self, part_id: int) -> _PartState:
        if isinstance(part_id, bool) or not isinstance(part_id, int):
            raise Refused(f"a part id is a whole number, not {part_id!r}")
        part = self._parts.get(part_id)
        if part is None:
            if part_id in self._deleted:
                raise NotAllowed(f"part #{part_id} was deleted from the job: {self._deleted[part_id]}")
            raise Refused(f"the job has no part #{part_id}")
        return part

    def _process(self, part_id: int, rank: int) -> _PartState:
        part = self._part(part_id)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < part.size:
            raise Refused(f"rank {rank!r} is outside {self.part_name(part_id)}, which has ranks 0 to {part.size - 1}")
        return part

    # ------------------------------------------------------------------ the job's state

    @property
    def ended(self) -> bool:
        """Failed or cancelled: every further runtime request is refused."""
        return self.failure is not None or self.cancellation is not None

    @property
    def state(self) -> JobState:
        """The multi-part job's one state."""
        if self.failure is not None:
            return JobState.FAILED
        if self.cancellation is not None:
            return JobState.KILLED
        parts = list(self._parts.values())
        if parts and all(part.end_state is not None for part in parts):
            ends = {part.end_state for part in parts}
            if JobState.FAILED in ends:
                return JobState.FAILED
            if ends <= {JobState.FINISHED}:
                return JobState.FINISHED
            return JobState.KILLED if JobState.KILLED in ends else JobState.FAILED
        return JobState.RUNNING if self.released else JobState.PREPARING

    @property
    def reason(self) -> Optional[str]:
        """Why the job failed or was cancelled, or why a part did."""
        if self.failure is not None:
            return self.failure
        if self.cancellation is not None:
            return self.cancellation
        for part in self._parts.values():
            if part.end_state is JobState.FAILED and part.end_reason:
                return f"{self.part_name(part.id)}: {part.end_reason}"
        return None

    def _alive(self) -> None:
        if self.failure is not None:
            raise JobEnded(f"the multi-part job failed: {self.failure}")
        if self.cancellation is not None:
            raise JobEnded(f"the multi-part job was cancelled: {self.cancellation}")

    def _changed(self) -> None:
        self.version += 1

    def _ending_verdict(self) -> Verdict:
        return Verdict(
            failed=self.failure is not None,
            cancelled=self.cancellation is not None,
            reason=self.failure if self.failure is not None else self.cancellation,
            cancel_parts=tuple(part.id for part in self._parts.values() if part.end_state is None),
        )

    # ------------------------------------------------------------------ service: parts

    def _add(self, spec: Part) -> int:
        part_id = self._next_part_id
        self._next_part_id += 1
        self._parts[part_id] = _PartState(part_id, spec, self.limits)
        return part_id

    def _refuse_after_release(self, what: str) -> None:
        self._alive()
        if self.released:
            raise NotAllowed(f"{what}: the start barrier has been released, and parts are fixed from then on")

    def add_part(self, spec: Part) -> int:
        """Add a part before the release; its id.  The service submits it next."""
        self._refuse_after_release("cannot add a part")
        if not isinstance(spec, Part):
            raise Refused(f"a part is a Part, not {type(spec).__name__}")
        if len(self._parts) >= MAX_PARTS:
            raise LimitExceeded(f"the job already has {MAX_PARTS} parts, the most allowed")
        if spec.label is not None and any(part.label == spec.label for part in self._parts.values()):
            raise NotAllowed(
                str(DescriptionError("is already the label of another part", field="label", part_label=spec.label))
            )
        part_id = self._add(spec)
        self._changed()
        self._settle()
        return part_id

    def delete_part(self, part_id: int, reason: str = "deleted by its owner") -> None:
        """Delete a part before the release (the service cancels it in its scheduler)."""
        self._refuse_after_release("cannot delete a part")
        part = self._part(part_id)
        if len(self._parts) == 1:
            raise NotAllowed(f"cannot delete {self.part_name(part_id)}: it is the job's only part")
        self._drop_messages(part)
        del self._parts[part.id]
        self._deleted[part.id] = reason
        self._changed()
        self._settle()

    def release_barrier(self, wait_for_parts: bool = False) -> bool:
        """Release the start barrier: at once, or with ``wait_for_parts`` as soon as every
        barrier process has checked in.  True if the barrier is released now."""
        self._alive()
        if not self.released:
            if wait_for_parts:
                self._release_when_all_in = True
                self._settle()
            else:
                self._release()
            self._changed()
        return self.released

    # ------------------------------------------------------------------ service: ends

    def process_ended(self, part_id: int, rank: int, failed: bool = False) -> Verdict:
        """A process of a part has ended (``failed``: with an error).  A strict-barrier part
        whose process ends before the release makes the whole job fail."""
        if self.ended:
            return Verdict()
        part = self._process(part_id, rank)
        part.ended_ranks.add(rank)
        self._changed()
        if not self.released and part.spec.start_type is StartType.STRICT_BARRIER:
            how = "failed" if failed else "ended"
            return self.fail(f"process {rank} of {self.part_name(part_id)} {how} before the start barrier was released")
        self._settle()
        return Verdict()

    def part_ended(self, part_id: int, state: JobState = JobState.FINISHED, reason: Optional[str] = None) -> Verdict:
        """A part has ended in its scheduler with final ``state``.  A strict-barrier part
        ending before the release makes the whole job fail."""
        part = self._part(part_id)
        if part.end_state is not None:
            return Verdict()
        part.end_state = state if state.final else JobState.FAILED
        part.end_reason = reason
        part.ended_ranks.update(range(part.size))
        self._changed()
        if self.ended:
            return Verdict()
        if not self.released and part.spec.start_type is StartType.STRICT_BARRIER:
            why = f" ({reason})" if reason else ""
            return self.fail(
                f"{self.part_name(part_id)} ended ({part.end_state.value}) before the start barrier was released{why}"
            )
        self._settle()
        return Verdict()

    def fail(self, reason: str) -> Verdict:
        """Make the whole job fail (a part could not be submitted, a strict part ended
        early); every runtime request from now on is refused with ``reason``."""
        if not self.ended:
            self.failure = reason
            self._changed()
        return self._ending_verdict()

    def cancel(self, reason: str = "cancelled by its owner") -> Verdict:
        """Cancel the job: every part is to be cancelled; every runtime request is refused."""
        if not self.ended:
            self.cancellation = reason
            self._changed()
        return self._ending_verdict()

    # ------------------------------------------------------------------ the barrier

    def _settle(self) -> None:
        """Carry out what follows by itself from the current state: the release, and the
        rendezvous forwards the agent was asked to do."""
        if self.ended:
            return
        if not self.released:
            automatic = self.description.barrier_release is BarrierRelease.AUTO
            if (automatic or self._release_when_all_in) and all(
                part.barrier_accounted() for part in self._parts.values()
            ):
                self._release()
        if self.released:
            self._forward_rendezvous()

    def _release(self) -> None:
        self.released = True
        self._level2 = Rendezvous(len(self._parts), 2, max_size=self.limits.rendezvous_bytes)
        self._group = tuple(
            part.id
            for part in self._parts.values()
            if part.spec.comms_type is CommsType.BLOCKING_JOIN and part.end_state is None
        )
        self._forward_rendezvous()

    def view(self, part_id: int, rank: int) -> ProcessView:
        self._alive()
        part = self._process(part_id, rank)
        return ProcessView(
            job_id=self.job_id,
            part_id=part.id,
            part_index=self.index_of(part.id),
            parts=len(self._parts),
            label=part.label,
            rank=rank,
            size=part.size,
            start_type=part.spec.start_type,
            comms_type=part.spec.comms_type,
            released=self.released,
        )

    def check_in(self, part_id: int, rank: int) -> None:
        """A process has reached the start barrier.  Checking in twice is harmless."""
        self._alive()
        part = self._process(part_id, rank)
        if rank not in part.checked_in:
            part.checked_in.add(rank)
            self._changed()
            self._settle()

    def barrier_passed(self, part_id: int, rank: int) -> Optional[BarrierPassed]:
        """Poll: the process may pass the barrier (``None``: not yet)."""
        self._alive()
        part = self._process(part_id, rank)
        if not part.spec.start_type.waits:
            return BarrierPassed(self.index_of(part.id), len(self._parts), self.released)
        if rank not in part.checked_in:
            raise NotAllowed(f"process {rank} of {self.part_name(part_id)} has not checked in at the barrier")
        if not self.released:
            return None
        return BarrierPassed(self.index_of(part.id), len(self._parts), True)

    def barrier_waiting_for(self) -> List[Tuple[int, int]]:
        """The (part id, rank) of every barrier process not yet checked in."""
        waiting = []
        for part in self._parts.values():
            if part.spec.start_type.waits and part.end_state is None:
                for rank in range(part.size):
                    if rank not in part.checked_in and not (
                        part.spec.start_type is StartType.LOOSE_BARRIER and rank in part.ended_ranks
                    ):
                        waiting.append((part.id, rank))
        return waiting

    # ------------------------------------------------------------------ messages within a part

    def _check_message(self, tag: str, data: bytes) -> None:
        if not isinstance(tag, str):
            raise Refused(f"a message tag is text, not {type(tag).__name__}")
        if len(tag) > self.limits.tag_length:
            raise Refused(f"a message tag may have at most {self.limits.tag_length} characters")
        if not isinstance(data, (bytes, bytearray)):
            raise Refused(f"message data is bytes, not {type(data).__name__}")
        if len(data) > self.limits.message_bytes:
            raise LimitExceeded(f"a message may have at most {self.limits.message_bytes} bytes, not {len(data)}")
        if self._queued_messages >= self.limits.queued_messages:
            raise LimitExceeded(f"the job already holds {self._queued_messages} messages nobody has received")
        if self._queued_bytes + len(data) > self.limits.queued_bytes:
            raise LimitExceeded(f"the job already holds {self._queued_bytes} bytes of messages nobody has received")

    def _queue(self, box: Deque[Message], message: Message) -> None:
        box.append(message)
        self._queued_bytes += len(message.data)
        self._queued_messages += 1
        self._changed()

    def _take(self, box: Deque[Message], tag: str) -> Optional[Message]:
        for position, message in enumerate(box):
            if message.tag == tag:
                del box[position]
                self._queued_bytes -= len(message.data)
                self._queued_messages -= 1
                self._changed()
                return message
        return None

    def _drop_messages(self, part: _PartState) -> None:
        for box in list(part.mailboxes.values()) + [part.part_mailbox]:
            for message in box:
                self._queued_bytes -= len(message.data)
                self._queued_messages -= 1
            box.clear()

    def send(self, part_id: int, rank: int, dest_rank: int, tag: str, data: bytes) -> None:
        """Queue a tagged message for process ``dest_rank`` of the sender's part."""
        self._alive()
        part = self._process(part_id, rank)
        if isinstance(dest_rank, bool) or not isinstance(dest_rank, int) or not 0 <= dest_rank < part.size:
            raise Refused(
                f"destination rank {dest_rank!r} is outside {self.part_name(part_id)}, which has ranks 0 to {part.size - 1}"
            )
        self._check_message(tag, data)
        self._queue(part.mailboxes.setdefault(dest_rank, collections.deque()), Message(rank, tag, bytes(data)))

    def take_message(self, part_id: int, rank: int, tag: str) -> Optional[Message]:
        """Poll: the oldest message for this process with ``tag`` (others keep waiting in
        order); ``None`` while there is none."""
        self._alive()
        part = self._process(part_id, rank)
        if not isinstance(tag, str):
            raise Refused(f"a message tag is text, not {type(tag).__name__}")
        box = part.mailboxes.get(rank)
        return self._take(box, tag) if box else None

    # ------------------------------------------------------------------ between parts

    def _group_member(self, part_id: int, rank: int, what: str) -> _PartState:
        self._alive()
        part = self._process(part_id, rank)
        if rank != 0:
            raise NotAllowed(f"{what} is for the rank-0 process of a part; this is rank {rank}")
        if part.spec.comms_type is not CommsType.BLOCKING_JOIN:
            raise NotAllowed(
                f"{self.part_name(part_id)} is independent (comms type {part.spec.comms_type.value}) "
                "and does not join the inter-part group"
            )
        if self.released and part.id not in self._group:
            raise NotAllowed(f"{self.part_name(part_id)} had ended when the barrier was released and is not in the group")
        return part

    def join(self, part_id: int, rank: int) -> None:
        """The part's rank-0 process joins the inter-part group (again: harmless)."""
        part = self._group_member(part_id, rank, "joining the inter-part group")
        if not part.joined:
            part.joined = True
            self._changed()

    def _group_complete(self) -> bool:
        if not self.released:
            return False
        for member in self._group:
            part = self._parts[member]
            if not part.joined:
                if part.ended:
                    raise CannotComplete(
                        f"{self.part_name(member)} ended without joining the inter-part group"
                    )
                return False
        return True

    def structure(self, part_id: int, rank: int = 0) -> Optional[Structure]:
        """Poll: the job's layout, once the barrier is released and every part of the
        inter-part group has joined (the join works as a group barrier)."""
        part = self._group_member(part_id, rank, "the job structure")
        if not part.joined:
            raise NotAllowed(f"{self.part_name(part_id)} has not joined the inter-part group")
        if not self._group_complete():
            return None
        layouts = tuple(
            PartLayout(index, other.id, other.label, other.size, other.id in self._group)
            for index, other in enumerate(self._parts.values())
        )
        return Structure(self.index_of(part.id), layouts)

    def part_send(self, part_id: int, rank: int, dest_index: int, tag: str, data: bytes) -> None:
        """Queue a tagged message for the rank-0 process of the part at ``dest_index``
        (only once :meth:`structure` has answered)."""
        part = self._group_member(part_id, rank, "sending to another part")
        if not self._group_complete():
            raise NotAllowed("the inter-part group is not complete yet: call structure() first")
        ids = list(self._parts)
        if isinstance(dest_index, bool) or not isinstance(dest_index, int) or not 0 <= dest_index < len(ids):
            raise Refused(f"destination part {dest_index!r} is outside the job, which has parts 0 to {len(ids) - 1}")
        dest = self._parts[ids[dest_index]]
        if dest.id not in self._group:
            raise NotAllowed(f"{self.part_name(dest.id)} is not in the inter-part group")
        self._check_message(tag, data)
        self._queue(dest.part_mailbox, Message(self.index_of(part.id), tag, bytes(data)))

    def take_part_message(self, part_id: int, rank: int, tag: str) -> Optional[Message]:
        """Poll: the oldest message from another part with ``tag``; ``None`` while none."""
        part = self._group_member(part_id, rank, "receiving from another part")
        if not isinstance(tag, str):
            raise Refused(f"a message tag is text, not {type(tag).__name__}")
        return self._take(part.part_mailbox, tag)

    def contribute(self, part_id: int, rank: int, text: str) -> int:
        """The part's rank-0 process gives its text to the next exchange round; the round."""
        part = self._group_member(part_id, rank, "the exchange")
        if not isinstance(text, str):
            raise Refused(f"exchange text is text, not {type(text).__name__}")
        if len(text) > self.limits.exchange_text:
            raise LimitExceeded(f"exchange text may have at most {self.limits.exchange_text} characters")
        round_number = len(part.contributions)
        if round_number >= self.limits.exchange_rounds:
            raise LimitExceeded(f"a job may have at most {self.limits.exchange_rounds} exchange rounds")
        part.contributions.append(text)
        part.joined = True
        self._changed()
        return round_number

    def exchange_result(self, part_id: int, rank: int, round_number: int) -> Optional[ExchangeResult]:
        """Poll: exchange round ``round_number``, once every group part has given its text."""
        part = self._group_member(part_id, rank, "the exchange")
        if not self._group_complete():
            return None
        indexes, texts = [], []
        for index, other in enumerate(self._parts.values()):
            if other.id not in self._group:
                continue
            if len(other.contributions) <= round_number:
                if other.ended:
                    raise CannotComplete(f"{self.part_name(other.id)} ended before taking part in the exchange")
                return None
            indexes.append(index)
            texts.append(other.contributions[round_number])
        return ExchangeResult(self.index_of(part.id), tuple(indexes), tuple(texts))

    # ------------------------------------------------------------------ the rendezvous

    def register(self, part_id: int, rank: int, data: bytes, *, level: int = 1, at_rank: int = -1) -> Optional[int]:
        """Register ``data`` with the part's rendezvous (level 1) or the job's (level 2);
        the rendezvous rank used.

        Level 1: any process, once, ``data`` its own bytes.  Level 2: the rank-0 process of
        a part, once per part, ``data`` a level-1 aggregate; ``None`` until the barrier is
        released (the job's parts are known only then): the caller polls again.
        """
        self._alive()
        part = self._process(part_id, rank)
        if not isinstance(data, (bytes, bytearray)):
            raise Refused(f"rendezvous data is bytes, not {type(data).__name__}")
        if level == 1:
            if rank in part.registered_by:
                raise NotAllowed(f"process {rank} of {self.part_name(part_id)} has already registered at level 1")
            used = self._rendezvous_call(part.rendezvous, bytes(data), at_rank)
            part.registered_by.add(rank)
            self._changed()
            self._settle()
            return used
        if level == 2:
            if rank != 0:
                raise NotAllowed(f"only the rank-0 process of a part registers at level 2; this is rank {rank}")
            if part.level2_registered or part.forward or self.description.forward_rendezvous:
                raise NotAllowed(
                    f"{self.part_name(part_id)} has already registered at level 2"
                    + (" (the agent forwards its rendezvous)" if not part.level2_registered else "")
                )
            if not self.released or self._level2 is None:
                return None
            used = self._rendezvous_call(self._level2, bytes(data), at_rank)
            part.level2_registered = True
            self._changed()
            return used
        raise Refused(f"a rendezvous level is 1 (the part) or 2 (the multi-part job), not {level!r}")

    def _rendezvous_call(self, rendezvous: Rendezvous, data: bytes, at_rank: int) -> int:
        try:
            return rendezvous.register(data, at_rank)
        except (RendezvousError, FormatError) as error:
            raise Refused(str(error)) from None

    def forward(self, part_id: int, rank: int = 0) -> None:
        """Ask the agent to register the part's level-1 aggregate at level 2 itself (at the
        part's index) once it is complete and the barrier released."""
        self._alive()
        part = self._process(part_id, rank)
        if part.level2_registered:
            raise NotAllowed(f"{self.part_name(part_id)} has already registered at level 2")
        if not part.forward:
            part.forward = True
            self._changed()
            self._settle()

    def _forward_rendezvous(self) -> None:
        if self._level2 is None or self._level2_problem is not None:
            return
        for index, part in enumerate(self._parts.values()):
            wanted = part.forward or self.description.forward_rendezvous
            if not wanted or part.level2_registered or not part.rendezvous.complete:
                continue
            try:
                self._level2.register(part.rendezvous.aggregate(), index)
            except (RendezvousError, FormatError) as error:
                self._level2_problem = f"the agent could not forward the rendezvous of {self.part_name(part.id)}: {error}"
                self._changed()
                return
            part.level2_registered = True
            self._changed()

    def rendezvous_result(self, part_id: int, rank: int, level: int = 1) -> Optional[bytes]:
        """Poll: the complete aggregate of the part's (1) or the job's (2) rendezvous."""
        self._alive()
        part = self._process(part_id, rank)
        if level == 1:
            if part.rendezvous.complete:
                return part.rendezvous.aggregate()
            self._level1_can_complete(part)
            return None
        if level == 2:
            if self._level2_problem is not None:
                raise CannotComplete(self._level2_problem)
            if self._level2 is not None and self._level2.complete:
                return self._level2.aggregate()
            for other in self._parts.values():
                if other.level2_registered:
                    continue
                if other.forward or self.description.forward_rendezvous:
                    self._level1_can_complete(other)
                elif other.end_state is not None or 0 in other.ended_ranks:
                    raise CannotComplete(
                        f"the job's rendezvous cannot complete: the rank-0 process of "
                        f"{self.part_name(other.id)} ended without registering"
                    )
            return None
        raise Refused(f"a rendezvous level is 1 (the part) or 2 (the multi-part job), not {level!r}")

    def _level1_can_complete(self, part: _PartState) -> None:
        gone = sorted(part.ended_ranks - part.registered_by)
        if gone:
            raise CannotComplete(
                f"the rendezvous of {self.part_name(part.id)} cannot complete: process "
                f"{gone[0]} ended without registering"
            )

    # ------------------------------------------------------------------ for the service's display

    def summary(self) -> Dict[str, object]:
        """A plain snapshot for logs and status displays."""
        return {
            "job": self.job_id,
            "state": self.state.value,
            "reason": self.reason,
            "released": self.released,
            "parts": [
                {
                    "id": part.id,
                    "index": index,
                    "label": part.label,
                    "size": part.size,
                    "start_type": part.spec.start_type.value,
                    "checked_in": len(part.checked_in),
                    "ended": part.end_state.value if part.end_state else None,
                }
                for index, part in enumerate(self._parts.values())
            ],
        }

