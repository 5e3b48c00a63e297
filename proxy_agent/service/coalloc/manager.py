"""Co-allocated multi-part jobs on top of the job service.

The :class:`CoallocManager` turns a multi-part job description into ordinary jobs, one per
part, each submitted through :meth:`JobService.submit <proxy_agent.service.service.JobService.submit>`
to the scheduler its queue names (``local:default``, ``slurm:debug``, ``sge:all.q``...).
Nothing here knows a particular scheduler: a part for a backend the agent runs needs
nothing more than the backend.

In the model the multi-part job is one job of its own, in the queue ``coalloc:multi``
(created at the first multi-part submission), with one state (``PREPARING`` until the start
barrier is released, then ``RUNNING``, and at the end ``FINISHED``, ``FAILED`` or
``KILLED``) and its reason in ``message``.  Every part is a job of its own scheduler,
carrying ``coallocJob`` (a reference to the multi-part job) and ``coallocPart`` (the part's
id in it, which never changes).

What the manager guarantees:

* **atomic creation**: if a part cannot be submitted, or a strict-barrier part (or one of its
  processes) ends before the barrier is released, every other part is cancelled in its
  scheduler and the multi-part job is ``FAILED`` with the reason;
* **cancel**: terminating the multi-part job terminates every part;
* **parts added and deleted** until the barrier is released (terminating a part before the
  release deletes it from the job; after the release it only ends that part);
* **the runtime**: a :class:`~.server.RuntimeServer` serves the barrier and the rendezvous
  to the parts' processes, which find it through the environment the manager gives each
  part (the Unix socket for the local scheduler, TCP for every other).

The coordination itself (who has checked in, what follows from an end) is
:class:`~.state.MultiJob`'s; the manager only watches the model for the parts' ends,
reports them, and carries out what the state machine decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from ..jobs import JobSpec
from .core import (COALLOC_NAME, DESCRIPTION_ATTRIBUTE, ID_ATTRIBUTE, JOB_ATTRIBUTE, PART_ATTRIBUTE, PARTS_ATTRIBUTE,
                   QUEUE_NAME, RELEASE_ATTRIBUTE, ManagerCore, RuntimeSettings)

if TYPE_CHECKING:  # pragma: no cover
    from .running import RunningManager

# The description, state and server modules load when the first multi-part job comes (the
# runtime server starts then): an agent that never runs one does not pay for them at start-up.

__all__ = [
    "COALLOC_NAME",
    "CoallocManager",
    "DESCRIPTION_ATTRIBUTE",
    "ID_ATTRIBUTE",
    "JOB_ATTRIBUTE",
    "PART_ATTRIBUTE",
    "PARTS_ATTRIBUTE",
    "QUEUE_NAME",
    "RELEASE_ATTRIBUTE",
    "RuntimeSettings",
]


class CoallocManager(ManagerCore):
    """Runs multi-part jobs for a :class:`~proxy_agent.service.service.JobService` (see the
    module documentation).  Making one attaches it to the service (``service.coalloc``); the
    service starts it with its backends and routes to it what concerns multi-part jobs."""

    # What carries out multi-part jobs is in .running: a RunningManager is the core with the
    # rest of the methods.  A manager becomes one (its class is changed) the first time it is
    # asked to do something with a multi-part job, so an agent that runs none never loads them.

    def _running(self) -> "RunningManager":
        from .running import RunningManager

        if not isinstance(self, RunningManager):
            self.__class__ = RunningManager
        assert isinstance(self, RunningManager)
        return self

    async def start_runtime(self) -> None:
        await self._running().start_runtime()

    async def submit(self, spec: JobSpec, queue: Optional[int] = None, key: Optional[int] = None) -> int:
        return await self._running().submit(spec, queue, key)

    async def cosubmit(self, *args, **kwargs) -> int:
        return await self._running().cosubmit(*args, **kwargs)

    async def add_part(self, *args, **kwargs) -> int:
        return await self._running().add_part(*args, **kwargs)

    async def delete_part(self, job: int, part: Union[int, str]) -> None:
        await self._running().delete_part(job, part)

    async def release(self, job: int, wait_for_parts: bool = False) -> None:
        await self._running().release(job, wait_for_parts)

    async def terminate(self, job: int) -> None:
        await self._running().terminate(job)

    def _dirty(self, key: int) -> None:
        self._running()._dirty(key)
