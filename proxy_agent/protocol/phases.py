"""The phases of a proxy session, in one table: what moves a session from one phase to the
next, and which commands each phase lets through.

Everything that changes a session's phase is a :class:`Step`; :data:`TRANSITIONS` says where
each (phase, step) pair leads, and a pair it does not name is a bug in the agent (the step
cannot happen in that phase), refused with :class:`IllegalTransition`.  :data:`ALLOWED` says
which commands a phase accepts; :data:`GUARDS` holds the one command a phase accepts only
once something has happened in it (START_EVENTS in DISCOVERY, after a MODEL_DEF).  The
session (:mod:`.session`) asks a :class:`PhaseMachine` and never sets a phase itself::

    INITIALIZE --INIT ok--> DISCOVERY --START_EVENTS--> NORMAL <--STOP/START--> SUSPENDED
                                                                  any --QUIT--> SHUTDOWN
"""

from __future__ import annotations

import enum
from typing import Dict, FrozenSet, Mapping, Optional, Tuple

from .messages import CommandId

__all__ = ["ALLOWED", "GUARDS", "IllegalTransition", "Phase", "PhaseMachine", "Step", "TRANSITIONS"]


class Phase(enum.Enum):
    INITIALIZE = "INITIALIZE"
    DISCOVERY = "DISCOVERY"
    NORMAL = "NORMAL"
    SUSPENDED = "SUSPENDED"
    SHUTDOWN = "SHUTDOWN"


class Step(enum.Enum):
    """What happens to a session that may move its phase."""

    #: the OK that completes INIT (sent, or withheld because the client reused its TID: the
    #: agent is initialised either way)
    INITIALISED = "INIT completed"
    #: a MODEL_DEF completed with OK (it lets START_EVENTS through in DISCOVERY)
    MODEL_DEFINED = "MODEL_DEF completed"
    #: START_EVENTS accepted: model events flow under its TID
    EVENTS_STARTED = "START_EVENTS accepted"
    #: STOP_EVENTS accepted
    EVENTS_STOPPED = "STOP_EVENTS accepted"
    #: the open START_EVENTS ended some other way (completed by the agent or on QUIT, or
    #: abandoned by the client reusing its TID): model events stop until the next START_EVENTS
    EVENTS_ENDED = "START_EVENTS ended"
    #: SHUTDOWN sent: nothing more happens in the session
    SHUT_DOWN = "SHUTDOWN sent"


_JOB_COMMANDS = frozenset({CommandId.SUBMIT_JOB, CommandId.TERMINATE_JOB, CommandId.MOVE_JOB, CommandId.CHANGE_JOB})
_FILTER_COMMANDS = frozenset({CommandId.LIST_FILTERS, CommandId.SET_FILTERS})
#: This agent's own commands that ask about jobs (see spec/protocol.md, "Kept output").
_QUERY_COMMANDS = frozenset({CommandId.GET_OUTPUT})
_WORKING = _JOB_COMMANDS | _FILTER_COMMANDS | _QUERY_COMMANDS

#: The commands each phase accepts; any other is refused (ERROR, illegal in this phase).
ALLOWED: Mapping[Phase, FrozenSet[CommandId]] = {
    Phase.INITIALIZE: frozenset({CommandId.INIT, CommandId.QUIT}),
    Phase.DISCOVERY: frozenset({CommandId.MODEL_DEF, CommandId.START_EVENTS, CommandId.QUIT}),
    Phase.NORMAL: frozenset({CommandId.STOP_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT}) | _WORKING,
    Phase.SUSPENDED: frozenset({CommandId.START_EVENTS, CommandId.MODEL_DEF, CommandId.QUIT}) | _WORKING,
    Phase.SHUTDOWN: frozenset(),
}

#: A command a phase accepts only after a step has happened in the session, and why not before.
GUARDS: Mapping[Tuple[Phase, CommandId], Tuple[Step, str]] = {
    (Phase.DISCOVERY, CommandId.START_EVENTS): (Step.MODEL_DEFINED, "START_EVENTS before MODEL_DEF has completed"),
}


def _transitions() -> Dict[Tuple[Phase, Step], Phase]:
    table = {
        (Phase.INITIALIZE, Step.INITIALISED): Phase.DISCOVERY,
        (Phase.DISCOVERY, Step.EVENTS_STARTED): Phase.NORMAL,
        (Phase.SUSPENDED, Step.EVENTS_STARTED): Phase.NORMAL,
        (Phase.NORMAL, Step.EVENTS_STOPPED): Phase.SUSPENDED,
        (Phase.NORMAL, Step.EVENTS_ENDED): Phase.SUSPENDED,
        # STOP_EVENTS has already suspended the session when the OK completing the
        # START_EVENTS it stopped goes out
        (Phase.SUSPENDED, Step.EVENTS_ENDED): Phase.SUSPENDED,
        # a withheld answer of a command abandoned before QUIT may still arrive: it changes nothing
        (Phase.SHUTDOWN, Step.INITIALISED): Phase.SHUTDOWN,
    }
    for phase in (Phase.DISCOVERY, Phase.NORMAL, Phase.SUSPENDED):
        table[(phase, Step.MODEL_DEFINED)] = phase
    for phase in (Phase.INITIALIZE, Phase.DISCOVERY, Phase.NORMAL, Phase.SUSPENDED):
        table[(phase, Step.SHUT_DOWN)] = Phase.SHUTDOWN
    return table


#: (phase, step) -> the phase the session is in after the step.  A pair not in the table
#: cannot happen: :meth:`PhaseMachine.step` refuses it.
TRANSITIONS: Mapping[Tuple[Phase, Step], Phase] = _transitions()


class IllegalTransition(RuntimeError):
    """A step the table does not allow in the session's phase (a bug in the agent, not bad input)."""


class PhaseMachine:
    """One session's phase, moved only by :data:`TRANSITIONS`."""

    __slots__ = ("phase", "_done")

    def __init__(self) -> None:
        self.phase = Phase.INITIALIZE
        # the steps that have happened (for GUARDS)
        self._done: set = set()

    def step(self, step: Step) -> Phase:
        """Apply ``step``: the session's new phase.  IllegalTransition if it cannot happen now."""
        after = TRANSITIONS.get((self.phase, step))
        if after is None:
            raise IllegalTransition(f"{step.value} cannot happen in the {self.phase.value} phase")
        self._done.add(step)
        self.phase = after
        return after

    def has(self, step: Step) -> bool:
        """Whether ``step`` has happened in this session."""
        return step in self._done

    def refusal(self, command_id: CommandId) -> Optional[str]:
        """Why the phase refuses ``command_id`` (None: it is accepted)."""
        phase = self.phase
        if command_id not in ALLOWED[phase]:
            return f"{command_id.name} is not allowed in the {phase.value} phase"
        guard = GUARDS.get((phase, command_id))
        if guard is not None and guard[0] not in self._done:
            return guard[1]
        return None

    def allows(self, command_id: CommandId) -> bool:
        return self.refusal(command_id) is None
