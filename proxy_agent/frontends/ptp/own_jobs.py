"""The jobs a client submitted itself: every state they go through reaches the client in
order (an IDE's launch completes only on a JOB_CHANGE that says RUNNING), however much else
is merged meanwhile; see :mod:`.view`."""

from __future__ import annotations

from typing import List, Optional, Tuple

from ...service.jobs import JobState
from . import mapping


#: PTP's state before a job runs, and the service state a job is shown in when its client is
#: told of it only once it was already further on
_STARTING = "STARTING"
_RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
STARTING_STATUS = JobState.ACCEPTED.value
#: State changes kept per job of the client's own between two drains; beyond, repeated
#: suspend/resume pairs in the middle are merged (the first and last states stay).
_MAX_STEPS = 8


def _ran(state: str) -> bool:
    """A service state that says the job's processes began to run."""
    try:
        return JobState(state).started
    except ValueError:
        return False


class OwnJob:
    """A job this view's client submitted: the PTP states (``jobState``) it went through that
    the client has not been told yet, each with the service state (``jobStatus``) it was last
    in, so that none is merged away (see the module documentation)."""

    __slots__ = ("steps", "told", "told_running", "ran")

    def __init__(self, state: Optional[str]) -> None:
        #: (PTP state, service state) not yet told, oldest first; no two in a row alike
        self.steps: List[Tuple[str, str]] = []
        #: the PTP state the client was told last (None: it has not been told of the job)
        self.told: Optional[str] = None
        #: the client has been told RUNNING
        self.told_running = False
        #: the job has been in a state that says it ran
        self.ran = False
        if state is not None:
            self.note(state)

    def note(self, state: str) -> None:
        """The job is now in service state ``state``."""
        if not self.ran and _ran(state):
            self.ran = True
        coarse = mapping.PTP_JOB_STATE.get(state, _STARTING)
        steps = self.steps
        if steps:
            if steps[-1][0] == coarse:
                steps[-1] = (coarse, state)
                return
        elif coarse == self.told:
            return  # a finer change within the state the client has: an ordinary change
        steps.append((coarse, state))
        if len(steps) > _MAX_STEPS:
            for i in range(1, len(steps) - 2):
                if steps[i - 1][0] == steps[i + 1][0]:
                    del steps[i:i + 2]  # A B A C -> A C: a suspension and its resumption
                    break

    def sequence(self, current: str, new: bool) -> List[Tuple[str, str]]:
        """The states to tell the client now, the last being the job's current one.  A job the
        client is told of first (``new``) begins with STARTING; a job that ran and ended
        before its client was told RUNNING has RUNNING before its end."""
        steps = list(self.steps) or [(mapping.PTP_JOB_STATE.get(current, _STARTING), current)]
        if new and steps[0][0] != _STARTING:
            steps.insert(0, (_STARTING, STARTING_STATUS))
        if (steps[-1][0] == COMPLETED and not self.told_running and all(c != _RUNNING for c, _ in steps)
                and (self.ran or _ran(current))):
            steps.insert(len(steps) - 1, (_RUNNING, JobState.RUNNING.value))
        return steps

    def told_all(self, sequence: List[Tuple[str, str]]) -> None:
        self.steps = []
        self.told = sequence[-1][0]
        if any(coarse == _RUNNING for coarse, _ in sequence):
            self.told_running = True


