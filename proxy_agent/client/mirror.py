"""The model as the client mirrors it from the agent's events: machines, queues, nodes, jobs
and their processes, found by id, name or submission."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union


from .errors import ClientError, UnknownElementError
from .state import Element, canonical_id

class MirroredModel:
    """What an :class:`~.connection.AgentClient` knows of the model (see the module documentation)."""

    @property
    def violations(self) -> list:
        return self.state.violations

    @property
    def messages(self) -> list:
        return self.state.messages

    @property
    def attr_defs(self) -> Dict[str, Any]:
        """Attribute definitions received so far, by attribute id."""
        return self.state.attr_defs

    @property
    def rm(self) -> Optional[Element]:
        return self.state.rm

    @property
    def machines(self) -> Dict[str, Element]:
        return self.state.by_kind["machine"]

    @property
    def nodes(self) -> Dict[str, Element]:
        return self.state.by_kind["node"]

    @property
    def queues(self) -> Dict[str, Element]:
        return self.state.by_kind["queue"]

    @property
    def jobs(self) -> Dict[str, Element]:
        return self.state.by_kind["job"]

    @property
    def processes(self) -> Dict[str, Element]:
        return self.state.by_kind["process"]

    @property
    def ended(self) -> Optional[ClientError]:
        """Why the session is over (None while it is not)."""
        return self._ended

    @property
    def events_started(self) -> bool:
        return self.state.events_started

    def element(self, element_id: str) -> Element:
        try:
            return self.state.elements[canonical_id(str(element_id))]
        except KeyError:
            raise UnknownElementError(f"no element {element_id} in the model") from None

    def job_process(self, job: Union[str, Element], rank: Union[int, str]) -> Element:
        """The process of ``rank`` (0 .. n-1) in ``job`` (element id, jobSubId or the job)."""
        found = self.state.process(self._job_id(job), rank)
        if found is None:
            raise UnknownElementError(f"no process of rank {rank} in job {self._job_id(job)}")
        return found

    def children(self, element: Union[str, Element], kind: Optional[str] = None) -> List[Element]:
        parent = element if isinstance(element, Element) else self.element(element)
        found = [self.state.elements[c] for c in parent.children if c in self.state.elements]
        return [e for e in found if kind is None or e.kind == kind]

    def find_job(self, ref: Union[str, Element]) -> Optional[Element]:
        """A job by element id or jobSubId (also a removed one still referenced), or None."""
        if isinstance(ref, Element):
            return ref
        ref = str(ref)
        job = self.jobs.get(canonical_id(ref))
        if job is None:
            job = self.state.jobs_by_sub.get(ref)
        return job

    def job(self, ref: Union[str, Element]) -> Element:
        job = self.find_job(ref)
        if job is None:
            raise UnknownElementError(f"no job {ref} in the model (give its element id or jobSubId)")
        return job

    def _find_queue(self, ref: str) -> Optional[Element]:
        queue = self.queues.get(canonical_id(str(ref)))
        if queue is None:
            for candidate in self.queues.values():
                if candidate.name == ref:
                    return candidate
        return queue

    def queue(self, ref: str) -> Element:
        """A queue by element id or name."""
        queue = self._find_queue(ref)
        if queue is None:
            raise UnknownElementError(f"no queue {ref} in the model")
        return queue

    def _job_id(self, job: Union[str, Element]) -> str:
        found = self.find_job(job)
        return found.id if found is not None else str(job)

    def job_output(self, job: Union[str, Element], stream: str = "stdout") -> str:
        """What the job's processes wrote to ``stream`` that this session received live, one
        line per received line (:meth:`kept_output` has all of it)."""
        return self.job(job).text(stream)


def states_text(element: Element) -> str:
    return " -> ".join(element.states) or "no state"

