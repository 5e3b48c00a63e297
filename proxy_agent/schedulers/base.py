"""The small interface every scheduler backend implements.

A scheduler owns the contents of the agent's :class:`~proxy_agent.model.Model`
for one session: it fills it with machines, nodes and queues, adds the jobs
it knows and keeps their states current.  It never speaks the protocol: the
agent turns model changes into events and scheduler exceptions into ERROR /
SUBMITJOB_ERROR / TERMINATEJOB_ERROR events.
"""

from __future__ import annotations

import abc
from typing import Callable, ClassVar, Dict, List, Optional, Type

import attrs
import trio

from ..model import Model
from ..protocol.attributes import AttributeDefinition, AttributeSet
from ..protocol.messages import ErrorCode, MessageLevel

__all__ = [
    "JobError",
    "Scheduler",
    "SchedulerError",
    "SchedulerOptions",
    "SubmitError",
    "register",
    "scheduler_class",
    "SCHEDULERS",
]


class SchedulerError(Exception):
    """A command could not be carried out; ``code`` and ``message`` go to the client."""

    default_code: ClassVar[ErrorCode] = ErrorCode.SCHEDULER

    def __init__(self, message: str, code: Optional[ErrorCode] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code


class SubmitError(SchedulerError):
    """SUBMIT_JOB refused (bad attributes, executable missing, scheduler rejection)."""

    default_code = ErrorCode.SUBMIT_FAILED


class JobError(SchedulerError):
    """A job command (terminate, change, move) failed."""

    default_code = ErrorCode.OPERATION_FAILED


@attrs.frozen
class SchedulerOptions:
    """Command-line settings a backend may use."""

    poll_interval: float = 5.0
    sim_nodes: int = 16
    sim_jobs: int = 0
    sim_churn: float = 0.0
    sim_seed: int = 1
    #: simulated seconds per real second are 1/sim_time_scale (0.1: jobs run ten times faster)
    sim_time_scale: float = 1.0
    #: simulated cluster: share of existing jobs that list their processes
    sim_process_share: float = 0.1
    all_users: bool = False
    kill_grace: float = 2.0


class Scheduler(abc.ABC):
    """One backend (local processes, simulated cluster, SLURM, PBS)."""

    name: ClassVar[str]

    def __init__(self, model: Model, options: SchedulerOptions) -> None:
        self.model = model
        self.options = options
        #: set by the agent: called as on_message(level, code, text) to tell the client
        #: something that belongs to no command (the scheduler stopped or resumed answering)
        self.on_message: Optional[Callable[[MessageLevel, int, str], None]] = None

    @abc.abstractmethod
    def attribute_definitions(self) -> List[AttributeDefinition]:
        """Every attribute this backend sends or accepts (MODEL_DEF answers with these).

        Includes the standard element attributes it uses and the job-submission
        attributes a user may set, with types, defaults and legal values.
        """

    @abc.abstractmethod
    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Fill the model, call ``task_status.started()``, then keep it current until cancelled."""

    @abc.abstractmethod
    async def submit(self, job: AttributeSet) -> int:
        """Start a job; return its element id once it is in the model (with ``jobSubId``).

        Raise :class:`SubmitError` naming the problem if it cannot be submitted.
        """

    @abc.abstractmethod
    async def terminate(self, job_id: int) -> None:
        """Terminate a job (the agent has checked that ``job_id`` is a job)."""

    async def change(self, job_id: int, changes: AttributeSet) -> None:
        """CHANGE_JOB: apply attribute changes (hold, release, suspend...)."""
        raise JobError(f"the {self.name} scheduler cannot change jobs", ErrorCode.NOT_SUPPORTED)

    async def move(self, job_id: int, queue_id: int) -> None:
        """MOVE_JOB: move a job to another queue."""
        raise JobError(f"the {self.name} scheduler cannot move jobs between queues", ErrorCode.NOT_SUPPORTED)

    async def aclose(self) -> None:
        """Release what the backend started (local jobs are terminated).  Bounded in time."""


SCHEDULERS: Dict[str, str] = {
    "local": "proxy_agent.schedulers.local:LocalScheduler",
    "sim": "proxy_agent.schedulers.sim:SimScheduler",
    "slurm": "proxy_agent.schedulers.slurm:SlurmScheduler",
    "pbs": "proxy_agent.schedulers.pbs:PbsScheduler",
}


def register(name: str, target: str) -> None:
    SCHEDULERS[name] = target


def scheduler_class(name: str) -> Type[Scheduler]:
    """Import and return the backend class registered under ``name``."""
    import importlib

    try:
        target = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(sorted(SCHEDULERS))}") from None
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)
