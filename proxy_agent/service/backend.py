"""The small interface every backend implements: what the service asks of a scheduler.

A backend owns one part of the service's :class:`~proxy_agent.service.model.ServiceModel`:
the machines, nodes and queues of its scheduler and the jobs in them.  It fills that part,
keeps it current, and carries out requests on its jobs.  It speaks no protocol: it raises
:class:`~proxy_agent.service.jobs.ServiceError` and reports problems that belong to no request
through :attr:`BackendContext.notify`.

Each backend owns its command-line options: :meth:`Backend.add_arguments` adds them (named
after the backend, ``--sim-nodes``, ``--slurm-...``) and :meth:`Backend.options_from_args`
checks them and builds the backend's own options object.

The interface lives with the service, which calls it; the backends themselves live under
:mod:`proxy_agent.schedulers`, which knows the service and not the other way round (the
registry of backends by name is :mod:`proxy_agent.schedulers.registry`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Optional, Tuple

import attrs
import trio

from .attributes import AttrInfo
from .jobs import ErrorKind, JobError, JobSpec
from .model import ServiceModel

if TYPE_CHECKING:  # pragma: no cover
    import argparse

    from .store import StoredJob

__all__ = [
    "Backend",
    "BackendContext",
    "Submitted",
]


@attrs.frozen
class Submitted:
    """A backend's answer to a submission: the job's key, and what the service keeps in its
    store to find the job again (the scheduler's own id, and what else the backend needs to
    adopt it later: output file paths, say)."""

    key: int
    native_id: Optional[str] = None
    extra: Dict[str, Any] = attrs.field(factory=dict)


def _ignore(level: str, text: str) -> None:
    pass


@attrs.define
class BackendContext:
    """What the service gives every backend beside the model."""

    #: show every user's jobs, not only the agent user's
    all_users: bool = False
    #: tell the clients something that belongs to no request: notify(level, text) with level
    #: ERROR, WARNING or INFO (a scheduler stopped answering, and answers again)
    notify: Callable[[str, str], None] = _ignore
    #: where the backend may keep files that must outlive the agent (None: nowhere)
    state_dir: Optional[str] = None


class Backend(abc.ABC):
    """One scheduler behind the service (local processes, simulated cluster, SLURM...)."""

    #: the name users give in ``--scheduler`` and in ``NAME:QUEUE`` queue names
    name: ClassVar[str]
    #: one line for ``--help``
    summary: ClassVar[str] = ""
    #: how the service keeps the load figures of this backend's queues (waiting and running
    #: jobs, free slots) from the jobs in the model: None (the backend or its scheduler reports
    #: them, or nobody), "queue" (each queue has its own ``totalSlots``) or "shared" (the queues
    #: draw on the same slots); see :mod:`proxy_agent.service.figures`
    queue_load: ClassVar[Optional[str]] = None
    #: its jobs are processes of this host in the agent's care: ``--on-disconnect terminate``
    #: ends those a client submitted when that client goes
    jobs_are_local: ClassVar[bool] = False

    def __init__(self, model: ServiceModel, options: Any = None, context: Optional[BackendContext] = None) -> None:
        self.model = model
        self.options = options if options is not None else self.default_options()
        self.context = context if context is not None else BackendContext()

    # ------------------------------------------------------------------ options

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this backend's options (an argument group named after it)."""

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> Any:
        """This backend's options from parsed arguments; ValueError naming a bad value."""
        return None

    @classmethod
    def default_options(cls) -> Any:
        """The options when none are given (as with no command-line option set)."""
        return None

    # ------------------------------------------------------------------ model

    @abc.abstractmethod
    def attributes(self) -> List[AttrInfo]:
        """Every attribute beyond the standard ones that this backend shows or accepts."""

    #: The queue a submission that names none goes to (None before discovery): read as an
    #: attribute, so routing a submission asks the backend nothing before :meth:`submit`.
    default_queue: Optional[int] = None

    # ------------------------------------------------------------------ life cycle

    @abc.abstractmethod
    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Fill the model, call ``task_status.started()``, then keep it current until cancelled."""

    async def aclose(self) -> None:
        """Release what the backend started (local jobs are ended).  Bounded in time."""

    # ------------------------------------------------------------------ requests

    @abc.abstractmethod
    async def submit(self, spec: JobSpec, queue: int, key: Optional[int] = None) -> Submitted:
        """Start a job in ``queue`` (a queue of this backend); answer once it is in the model,
        with its key (``key`` when given: the service chose it and recorded the submission
        under it) and what the store keeps of it.  Raise
        :class:`~proxy_agent.service.jobs.SubmitError` naming the problem."""

    def adopt(self, stored: List["StoredJob"]) -> List[int]:
        """Take back jobs an earlier agent submitted to this backend (their store records):
        put them in the model under their keys and follow them.  Returns the keys adopted;
        the others are not this backend's to follow (they stay in the store)."""
        return []

    def active_jobs(self) -> int:
        """How many of its jobs are running in the agent's care (an idle service waits for
        them before it leaves); a batch scheduler's jobs are its scheduler's, not counted."""
        return 0

    def output_files(self, job: int) -> Dict[Tuple[int, str], str]:
        """Where the backend keeps a job's output, if it does: (rank, stream) -> file."""
        return {}

    @abc.abstractmethod
    async def terminate(self, job: int) -> None:
        """End a job (the service has checked that ``job`` is one of this backend's jobs)."""

    async def hold(self, job: int, held: bool) -> None:
        """Hold a job that has not started (``held``), or release it."""
        raise JobError(f"the {self.name} scheduler cannot hold jobs", ErrorKind.NOT_SUPPORTED)

    async def suspend(self, job: int, suspended: bool) -> None:
        """Suspend a running job (``suspended``), or resume it."""
        raise JobError(f"the {self.name} scheduler cannot suspend jobs", ErrorKind.NOT_SUPPORTED)

    async def move(self, job: int, queue: int) -> None:
        """Move a job that has not started to another queue of this backend."""
        raise JobError(f"the {self.name} scheduler cannot move jobs between queues", ErrorKind.NOT_SUPPORTED)
