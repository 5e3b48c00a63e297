"""What the service's model is made of: the kinds of element, the neutral attribute names,
and the elements themselves (see :mod:`.model` for how the model keeps and changes them).

These are the model's vocabulary, imported by everything that reads the model; the model's
bookkeeping (tables, subscribers, output flow) stays in :mod:`.model`.  The keys elements
are known by come from one :class:`KeySource`: the model's, which the service also numbers a
job from before its scheduler is asked (the submission is recorded under that key)."""

from __future__ import annotations

import enum
from typing import Optional, Tuple, Union

AttrValue = Union[str, Tuple[str, ...], int]

#: The key of the service itself: the parent of every machine and queue.
ROOT = 0


class Kind(enum.Enum):
    MACHINE = "machine"
    NODE = "node"
    QUEUE = "queue"
    JOB = "job"
    PROCESS = "process"

    # A kind is equal only to itself: hashed by identity, without the Python-level
    # __hash__ of Enum (kinds key tables that every change of the model looks in).
    __hash__ = object.__hash__


#: Parents before children (creation order); the reverse for removal.
CREATE_ORDER = (Kind.MACHINE, Kind.QUEUE, Kind.NODE, Kind.JOB, Kind.PROCESS)


class K:
    """Neutral attribute names the service and every backend share."""

    # every element
    NAME = "name"
    #: machine UP/DOWN/ALERT/ERROR/UNKNOWN; node UP/DOWN/ERROR/UNKNOWN; queue NORMAL/STOPPED;
    #: job and process: a :class:`~proxy_agent.service.jobs.JobState` name
    STATE = "state"
    #: the scheduler's own word for the element's state
    NATIVE_STATE = "nativeState"
    #: the backend the element belongs to (machines and queues)
    BACKEND = "backend"
    # machine
    NUM_NODES = "numNodes"
    VERSION = "version"
    # node
    NUMBER = "number"
    CPUS = "cpus"
    CPUS_USED = "cpusUsed"
    MEMORY = "memoryMB"
    QUEUES = "queues"
    REASON = "reason"
    # queue
    DEFAULT = "default"
    MAX_TIME = "maxTime"
    DEFAULT_TIME = "defaultTime"
    MAX_NODES = "maxNodes"
    TOTAL_NODES = "totalNodes"
    TOTAL_SLOTS = "totalSlots"
    FREE_SLOTS = "freeSlots"
    WAITING = "waitingJobs"
    RUNNING = "runningJobs"
    # job
    QUEUE = "queue"
    NUM_PROCS = "numProcs"
    EXECUTABLE = "executable"
    ARGUMENTS = "arguments"
    ENVIRONMENT = "environment"
    WORKING_DIR = "workingDir"
    USER = "user"
    CLIENT_REF = "clientRef"
    MESSAGE = "message"
    NATIVE_ID = "nativeId"
    HOSTS = "hosts"
    NUM_CPUS = "numCpus"
    TIME_USED = "timeUsed"
    TIME_LIMIT = "timeLimit"
    SUBMIT_TIME = "submitTime"
    START_TIME = "startTime"
    END_TIME = "endTime"
    ACCOUNT = "account"
    HOLD = "hold"
    #: a part of a co-allocated job: the multi-part job it belongs to (a reference)
    COALLOC_JOB = "coallocJob"
    # job and process
    EXIT_CODE = "exitCode"
    SIGNAL = "signal"
    # process
    PID = "pid"
    NODE = "node"


#: Attributes whose value is the service key of another element.
REFERENCES = frozenset({K.QUEUE, K.NODE, K.COALLOC_JOB})


class UnknownElement(KeyError):
    """No element with that key (or not of the expected kind)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown element"


class Element:
    """One machine, node, queue, job or process."""

    # Six slots: with the collector's header an element takes 80 bytes, where a seventh slot
    # would make it 96 (objects are allocated in steps of 16 bytes).  A million jobs' model is
    # 16 MB smaller for keeping the rank on processes alone.
    __slots__ = ("key", "kind", "parent", "values", "children", "owner")

    #: a process's index in its job (-1 for other kinds; see :class:`ProcessElement`)
    rank = -1

    def __init__(self, key: int, kind: Kind, parent: int, values: tuple, owner: str) -> None:
        self.key = key
        self.kind = kind
        self.parent = parent
        self.values = values
        self.children: Optional[list] = None
        #: name of the backend that owns it
        self.owner = owner


class ProcessElement(Element):
    """A process: an element with its rank (its index in its job)."""

    __slots__ = ("rank",)

    def __init__(self, key: int, kind: Kind, parent: int, values: tuple, owner: str, rank: int) -> None:
        super().__init__(key, kind, parent, values, owner)
        self.rank = rank


class KeySource:
    """Hands out element keys, ascending and never twice (see the module documentation)."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        #: the key handed out next
        self.next = 1

    def take(self, count: int = 1) -> range:
        """``count`` new keys, contiguous."""
        keys = range(self.next, self.next + count)
        self.next += count
        return keys

    def reserve(self, above: int) -> None:
        """Hand out only keys above ``above`` from now on."""
        if above >= self.next:
            self.next = above + 1
