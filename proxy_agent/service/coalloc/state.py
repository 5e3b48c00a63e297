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

The messages and the rendezvous are in :mod:`.exchange`; the errors and the values handed
out, and one part's state, in :mod:`.outcomes`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple


from ..jobs import JobState
from .description import BarrierRelease, CommsType, DescriptionError, MAX_PARTS, MultiJobDescription, Part, StartType
from .rendezvous import Rendezvous
from .exchange import Exchange
from .outcomes import (
    BarrierPassed, CannotComplete, CoordinationError, ExchangeResult, JobEnded, LimitExceeded, Limits,
    NotAllowed, PartLayout, PartState, ProcessView, Refused, Structure, Verdict,
)

# The job's face: what coordinating it hands out comes from here too.
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


# --------------------------------------------------------------------------- the job


class MultiJob(Exchange):
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
        self._parts: Dict[int, PartState] = {}  # in index order (dicts keep insertion order)
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

    def _part(self, part_id: int) -> PartState:
        if isinstance(part_id, bool) or not isinstance(part_id, int):
            raise Refused(f"a part id is a whole number, not {part_id!r}")
        part = self._parts.get(part_id)
        if part is None:
            if part_id in self._deleted:
                raise NotAllowed(f"part #{part_id} was deleted from the job: {self._deleted[part_id]}")
            raise Refused(f"the job has no part #{part_id}")
        return part

    def _process(self, part_id: int, rank: int) -> PartState:
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
        self._parts[part_id] = PartState(part_id, spec, self.limits)
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


