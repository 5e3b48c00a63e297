"""The service's part of brokering (:mod:`.broker`): the list of built-in brokers, the
default broker, the queue figures kept from the jobs, the decision for a submission and the
attributes it gives the job.

The service makes its :class:`Brokering` as it starts; the brokers themselves, and all that
ranks queues, are in :mod:`.ranking`, loaded when a submission is first brokered or a broker
is configured; their names are in :mod:`.broker_names`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import attrs

from .attributes import AttrInfo, ValueType
from .broker_names import broker_choices
from .figures import QueueFigures
from .jobs import ErrorKind, JobSpec, SubmitError
from .model import K, Kind, ServiceModel

if TYPE_CHECKING:  # pragma: no cover
    from .ranking import Broker, Candidate

__all__ = ["ATTRIBUTES", "Brokering", "Decision", "JOB_BROKER", "JOB_BROKER_QUEUE", "JOB_BROKER_REASON", "Placement"]



#: Job attributes the service sets when a broker chose the job's queue.
JOB_BROKER = "broker"
JOB_BROKER_QUEUE = "brokerQueue"
JOB_BROKER_REASON = "brokerReason"

#: What the service shows beyond the backends' attributes.
ATTRIBUTES: Tuple[AttrInfo, ...] = (
    AttrInfo(K.WAITING, ValueType.INTEGER, "Waiting Jobs", "Jobs of the queue waiting to start", default="0"),
    AttrInfo(K.RUNNING, ValueType.INTEGER, "Running Jobs", "Jobs of the queue running", default="0"),
    AttrInfo(K.TOTAL_SLOTS, ValueType.INTEGER, "Total Slots", "Processor slots (CPUs) of the queue", default="0"),
    AttrInfo(K.FREE_SLOTS, ValueType.INTEGER, "Free Slots", "Processor slots of the queue not in use", default="0"),
    AttrInfo(K.MAX_TIME, ValueType.INTEGER, "Maximum Time (s)",
             "Longest wall time a job of the queue may have, in seconds (absent: unlimited)", default="0"),
    AttrInfo(JOB_BROKER, ValueType.STRING, "Broker",
             f"Submission: the broker that picks among several queues ({broker_choices()}); "
             "job: the broker that picked its queue", settable=True),
    AttrInfo(JOB_BROKER_QUEUE, ValueType.STRING, "Brokered Queue", "The queue the broker chose, as SCHEDULER:NAME"),
    AttrInfo(JOB_BROKER_REASON, ValueType.STRING, "Broker Reason", "Why the broker chose the job's queue"),
)


def _brokers():
    """The module of the brokers (imported the first time it is needed)."""
    from . import ranking

    return ranking


@attrs.frozen
class Decision:
    """A broker's choice: the queue, and what the job is told about it."""

    queue: int
    label: str
    broker: str
    reason: str

    def job_attributes(self) -> Dict[str, str]:
        return {JOB_BROKER: self.broker, JOB_BROKER_QUEUE: self.label, JOB_BROKER_REASON: self.reason}


@attrs.frozen
class Placement:
    """Where a submission goes; unpacks as ``(backend, queue)``.  ``decision`` is the broker's
    when one chose the queue."""

    backend: Any
    queue: int
    decision: Optional[Decision] = None

    def __iter__(self):
        return iter((self.backend, self.queue))


class Brokering:
    """The service's brokers: the agent's default, benchmark figures, the queue figures kept
    from the jobs, and the decision for a submission."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.figures = QueueFigures(model)
        model.observe(self.figures)
        #: the broker used when a submission names several queues or none but no broker
        self.default: Optional[str] = None
        self._brokers: Dict[str, "Broker"] = {}

    def configure(self, default: Optional[str] = None, config: Optional[str] = None) -> None:
        """The agent's default broker and benchmark file (``--broker``, ``--broker-config``);
        ValueError naming a bad one."""
        if config:
            self.figures.set_benchmarks(_brokers().load_benchmarks(config))
        if default:
            try:
                self.broker(default)
            except _brokers().BrokerError as exc:
                raise ValueError(f"--broker: {exc.message}") from None
            self.default = default.strip()

    def track(self, backend: str, mode: Optional[str]) -> None:
        """Keep load figures from the jobs of ``backend`` (when ``mode`` says so)."""
        if mode:
            self.figures.track(backend, mode)

    def broker(self, name: str) -> "Broker":
        """The broker named ``name`` (made once, then kept: a seeded Random goes on drawing)."""
        text = name.strip()
        brokers = _brokers()
        key = text.lower() if brokers.built_in_class(text) is not None else text
        broker = self._brokers.get(key)
        if broker is None:
            broker = self._brokers[key] = brokers.make_broker(text)
        return broker

    def screen(self, job: JobSpec, queues: Sequence[int], unusable: Optional[Mapping[int, str]] = None
               ) -> Tuple[List["Candidate"], List[Tuple[str, str]]]:
        """The queues (keys, repeats dropped) that can run ``job``, in the order given, and
        (label, why) for each of the others; ``unusable`` names queues left out beforehand."""
        left_out: List[Tuple[str, str]] = []
        brokers = _brokers()
        kept: List[Candidate] = []
        seen: Set[int] = set()
        for key in queues:
            if key in seen:
                continue
            seen.add(key)
            candidate = brokers.Candidate.from_model(self.model, key)
            why = (unusable.get(key) if unusable else None) or brokers.exclusion(job, candidate)
            if why is None:
                kept.append(candidate)
            else:
                left_out.append((candidate.label, why))
        return kept, left_out

    def decide(self, job: JobSpec, queues: Sequence[int], broker_name: Optional[str],
               unusable: Optional[Mapping[int, str]] = None) -> Decision:
        """Choose among ``queues`` (keys, in the order given) for ``job`` with the broker
        named (None: Null); ``unusable`` as for :meth:`screen`.  SubmitError when no queue can
        run the job, BrokerError when the broker is unknown or fails."""
        brokers = _brokers()
        broker = self.broker(broker_name) if broker_name else brokers.NullBroker()
        kept, left_out = self.screen(job, queues, unusable)
        if not kept:
            if not left_out:
                raise SubmitError("there is no queue to submit to", ErrorKind.UNAVAILABLE)
            reasons = "; ".join(f"{label}: {why}" for label, why in left_out)
            raise SubmitError(f"no queue can run this job ({reasons})", ErrorKind.SUBMIT_FAILED)
        try:
            ranked, reason = broker.choose(job, kept)
        except brokers.BrokerError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broker's bug fails the submission, not the agent
            raise brokers.BrokerError(f"broker {broker.name} failed: {brokers.describe_failure(exc)}") from None
        chosen = ranked[0]
        if left_out:
            reason += "; left out " + "; ".join(f"{label} ({why})" for label, why in left_out)
        return Decision(chosen.key, chosen.label, broker.name, reason)

    def all_queues(self, backends: Iterable[str]) -> List[int]:
        """Every queue of the named backends: backend by backend, each in creation order."""
        model = self.model
        by_backend: Dict[str, List[int]] = {name: [] for name in backends}
        for key in model.keys(Kind.QUEUE):
            keys = by_backend.get(model.get(key).owner)
            if keys is not None:
                keys.append(key)
        return [key for keys in by_backend.values() for key in keys]

    def record(self, job: int, placement: Placement) -> None:
        """Give a job just submitted the broker's decision as attributes."""
        decision = placement.decision
        if decision is not None and job in self.model:
            self.model.update(job, decision.job_attributes())
