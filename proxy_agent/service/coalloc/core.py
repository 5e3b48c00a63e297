"""The multi-part job manager's core: its names in the model, its settings, its state and
what it answers without carrying out a multi-part job (see :mod:`.manager`).

Both forms of the manager build on :class:`ManagerCore`: :class:`~.manager.CoallocManager`,
which the agent makes, and :class:`~.running.RunningManager`, which carries out multi-part
jobs and which a manager becomes with its first one.  Neither form's module is needed by the
other's at run time: the manager loads the running form when it is first asked for it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import attrs
import trio

from ..attributes import AttrInfo, ValueType
from ..jobs import ErrorKind, JobError
from ..model import ChangeSink, Element, K, Kind

if TYPE_CHECKING:  # pragma: no cover
    from ..service import JobService
    from .running import MultiJobRecord
    from .server import RuntimeServer

__all__ = [
    "COALLOC_NAME",
    "DESCRIPTION_ATTRIBUTE",
    "ID_ATTRIBUTE",
    "JOB_ATTRIBUTE",
    "ManagerCore",
    "PART_ATTRIBUTE",
    "PARTS_ATTRIBUTE",
    "QUEUE_NAME",
    "RELEASE_ATTRIBUTE",
    "RuntimeSettings",
]

log = logging.getLogger("proxy_agent.service.coalloc.manager")

#: The owner of multi-part jobs in the model, and the scheduler part of their queue's name.
COALLOC_NAME = "coalloc"
#: The queue multi-part jobs hang from: ``coalloc:multi``.
QUEUE_NAME = "multi"
#: Submission attribute: a multi-part job's description (JSON or the multi-request form);
#: with :data:`JOB_ATTRIBUTE`, one part to add to that job.
DESCRIPTION_ATTRIBUTE = "coallocDescription"
#: On a part: its multi-part job (a reference).  In a submission: the job to add a part to.
JOB_ATTRIBUTE = K.COALLOC_JOB
#: On a part: the part's id in its multi-part job.
PART_ATTRIBUTE = "coallocPart"
#: On a multi-part job: its id for the runtime (``mj-...``, what the handles carry).
ID_ATTRIBUTE = "coallocId"
#: On a multi-part job: how many parts it has now.
PARTS_ATTRIBUTE = "coallocParts"
#: Change attribute: release the start barrier, ``now`` or once every part has checked in (``wait``).
RELEASE_ATTRIBUTE = "coallocRelease"

@attrs.frozen
class RuntimeSettings:
    """Where the runtime server listens: a Unix socket (``unix_path``; None: a private
    directory of the agent's) and TCP (``tcp_host``; None: no TCP), advertised to compute
    nodes as ``advertise_host``."""

    unix_path: Optional[str] = None
    tcp_host: Optional[str] = None
    tcp_port: int = 0
    advertise_host: Optional[str] = None


class _Watcher(ChangeSink):
    """Hears the model's changes and notes the parts whose jobs or processes changed."""

    takes_output = False

    def __init__(self, manager: "ManagerCore") -> None:
        self.manager = manager

    def _note(self, element: Element) -> None:
        if element.kind is Kind.JOB:
            key = element.key
        elif element.kind is Kind.PROCESS:
            key = element.parent
        else:
            return
        if key in self.manager._parts:
            self.manager._dirty(key)

    def created(self, element: Element) -> None:
        self._note(element)

    def changed(self, element: Element, slots) -> None:
        self._note(element)

    def removed(self, element: Element) -> None:
        self._note(element)


class ManagerCore:
    """What every multi-part job manager has and answers (see :mod:`.manager`): its state, its
    attributes, its life, and what it tells the service without carrying out a multi-part job.
    :class:`~.manager.CoallocManager` (before its first multi-part job) and
    :class:`~.running.RunningManager` (from then on) build on it."""

    #: the owner name of multi-part jobs (what the service compares job owners with)
    name = COALLOC_NAME

    def __init__(self, service: "JobService", settings: RuntimeSettings = RuntimeSettings(),
                 server: Optional[RuntimeServer] = None) -> None:
        self.service = service
        self.model = service.model
        self.settings = settings
        self._private_dir: Optional[str] = None
        self.server = server
        self._records: Dict[int, MultiJobRecord] = {}
        #: part job key -> (record, part id)
        self._parts: Dict[int, Tuple[MultiJobRecord, int]] = {}
        self._pending: Set[int] = set()
        self._wake = trio.Event()
        self._nursery: Optional[trio.Nursery] = None
        self._queue: Optional[int] = None
        #: set once the runtime server has started (or failed to)
        self.ready = trio.Event()
        self._starting = trio.Lock()
        self.failure: Optional[str] = None
        service.coalloc = self
        self.model.observe(_Watcher(self))

    # ------------------------------------------------------------------ life

    def attributes(self) -> List[AttrInfo]:
        return [
            AttrInfo(DESCRIPTION_ATTRIBUTE, ValueType.STRING, "Multi-part Job",
                     "Submission: a co-allocated multi-part job's description (JSON or the multi-request form); "
                     "with coallocJob, one part to add to that job", settable=True, display=False),
            AttrInfo(JOB_ATTRIBUTE, ValueType.REFERENCE, "Multi-part Job",
                     "The co-allocated multi-part job this job is a part of"),
            AttrInfo(PART_ATTRIBUTE, ValueType.INTEGER, "Part", "This job's part id in its multi-part job"),
            AttrInfo(ID_ATTRIBUTE, ValueType.STRING, "Multi-part Job Id",
                     "The multi-part job's id in its processes' handles"),
            AttrInfo(PARTS_ATTRIBUTE, ValueType.INTEGER, "Parts", "How many parts the multi-part job has"),
            AttrInfo(RELEASE_ATTRIBUTE, ValueType.ENUMERATED, "Release Barrier",
                     "Change: release a multi-part job's start barrier now, or once every part has checked in",
                     choices=("now", "wait"), settable=True, display=False),
        ]

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled.  The runtime server starts with the first multi-part job
        (:meth:`start_runtime`)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            if self._private_dir is not None:
                try:
                    os.rmdir(self._private_dir)
                except OSError:
                    pass

    # ------------------------------------------------------------------ what the service asks

    def intercepts(self, job: int) -> bool:
        """Terminating ``job`` is the manager's business: a multi-part job, or a part that is
        still to be deleted rather than ended (the barrier is not released yet)."""
        if job in self._records:
            return True
        found = self._parts.get(job)
        if found is None:
            return False
        record, part_id = found
        state = self._state(record)
        return state is not None and not state.ended and not state.released and part_id not in record.ended

    async def hold(self, job: int, held: bool) -> None:
        """Releasing a multi-part job's hold releases its start barrier."""
        if held:
            raise JobError("a multi-part job cannot be held; its parts wait at the start barrier",
                           ErrorKind.NOT_SUPPORTED)
        await self.release(job)

    async def suspend(self, job: int, suspended: bool) -> None:
        raise JobError("a multi-part job cannot be suspended; suspend its parts", ErrorKind.NOT_SUPPORTED)

    async def move(self, job: int, queue: int) -> None:
        raise JobError("a multi-part job cannot be moved; its parts have their own queues", ErrorKind.NOT_SUPPORTED)

    # ------------------------------------------------------------------ inside

    def _state(self, record: MultiJobRecord):
        from .state import CoordinationError
        if record.forgotten or self.server is None:
            return None
        try:
            return self.server.job(record.job_id)
        except CoordinationError:
            return None

    def _dirty(self, key: int) -> None:
        """Note that a part's job or processes changed (the watcher calls it)."""
        raise NotImplementedError
