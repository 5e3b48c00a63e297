"""A multi-part job's messages: within a part, between parts, and the rendezvous (see
:mod:`.state`)."""

from __future__ import annotations

import collections
from typing import Deque, Optional


from .description import CommsType
from .rendezvous import FormatError, Rendezvous, RendezvousError
from .outcomes import (
    CannotComplete, ExchangeResult, LimitExceeded, Message, NotAllowed, PartLayout, PartState, Refused,
    Structure,
)

class Exchange:
    """The messages and the rendezvous of a :class:`~.state.MultiJob`."""

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

    def _drop_messages(self, part: PartState) -> None:
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

    def _group_member(self, part_id: int, rank: int, what: str) -> PartState:
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

    def _level1_can_complete(self, part: PartState) -> None:
        gone = sorted(part.ended_ranks - part.registered_by)
        if gone:
            raise CannotComplete(
                f"the rendezvous of {self.part_name(part.id)} cannot complete: process "
                f"{gone[0]} ended without registering"
            )

