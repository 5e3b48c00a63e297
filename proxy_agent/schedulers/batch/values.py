"""What the model shows of a batch system's records: a job's and its process's attributes,
a node's, a queue's, and the attributes every batch backend shows beyond the standard ones."""


from typing import Any, Dict, Optional, Tuple


from ...service.attributes import AttrInfo, ValueType
from ...service.jobs import JobState
from ...service.model import K
from .. import common
from .records import NativeJob, NativeNode, NativeQueue
from .system import BatchSystem

def _text(value: Optional[int]) -> str:
    return "" if value is None else str(value)


def _signal_text(signal: str) -> str:
    return common.signal_name(int(signal)) if signal.isdigit() else signal


FINAL_STATE_NAMES = frozenset(state.value for state in JobState if state.final)


def ran_or_ended(state: JobState) -> bool:
    return state.started or state.final or state is JobState.FINISHING


def job_values(system: BatchSystem, job: NativeJob, submitted: bool = False) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The attributes a record gives a job and its process 0 (``""``: no value).  A job
    ``submitted`` here keeps the name, size and settings it was submitted with."""
    state = system.job_state(job)
    values: Dict[str, Any] = {
        K.STATE: state.value, K.NATIVE_STATE: job.native_state, K.MESSAGE: job.reason,
        K.USER: job.user, K.NATIVE_ID: job.job_id, K.ACCOUNT: job.account, K.HOSTS: ",".join(job.hosts),
        K.NUM_NODES: _text(job.num_nodes), K.NUM_CPUS: _text(job.num_cpus), K.TIME_LIMIT: _text(job.time_limit),
        K.SUBMIT_TIME: job.submit_time, K.START_TIME: job.start_time, K.END_TIME: job.end_time,
    }
    if not submitted:
        values.update({K.NAME: job.name, K.NUM_PROCS: _text(job.num_procs), K.WORKING_DIR: job.work_dir})
    else:
        # where the listing shows none (or a shortened name)
        for name in (K.USER, K.ACCOUNT, K.TIME_LIMIT, K.NUM_NODES, K.NUM_CPUS):
            if values[name] == "":
                del values[name]
    if job.time_used is not None:
        values[K.TIME_USED] = str(job.time_used)
    process: Dict[str, Any] = {K.STATE: state.value, K.NATIVE_STATE: job.native_state}
    if state.final:
        end = {K.EXIT_CODE: _text(job.exit_code), K.SIGNAL: _signal_text(job.signal)}
        values.update(end)
        process.update(end)
    return values, process


def node_values(node: NativeNode) -> Dict[str, str]:
    """A node's attributes (``""``: no value; its number is the caller's)."""
    return {
        K.NAME: node.name, K.STATE: node.state, K.NATIVE_STATE: node.native_state,
        K.CPUS: _text(node.cpus), K.CPUS_USED: _text(node.cpus_used), K.MEMORY: _text(node.memory_mb),
        K.QUEUES: ",".join(node.queues), K.REASON: node.reason,
    }


def queue_values(queue: NativeQueue, is_default: bool) -> Dict[str, str]:
    """A queue's attributes (``""``: no value)."""
    return {
        K.NAME: queue.name, K.STATE: queue.state, K.NATIVE_STATE: queue.native_state,
        K.DEFAULT: "true" if is_default else "false", K.MAX_TIME: _text(queue.max_time),
        K.DEFAULT_TIME: _text(queue.default_time), K.MAX_NODES: _text(queue.max_nodes),
        K.TOTAL_NODES: _text(queue.total_nodes), K.TOTAL_SLOTS: _text(queue.total_slots),
        K.FREE_SLOTS: _text(queue.free_slots), K.HOSTS: ",".join(queue.hosts),
    }


#: Attributes every batch backend shows beyond the standard ones.
DISPLAY_ATTRIBUTES: Tuple[AttrInfo, ...] = (
    AttrInfo(K.VERSION, ValueType.STRING, "Version", "Version of the scheduler installation"),
    AttrInfo(K.NATIVE_STATE, ValueType.STRING, "Native State", "The element's state in the scheduler's own words"),
    AttrInfo(K.NATIVE_ID, ValueType.STRING, "Native Job ID", "The job's id in its scheduler"),
    AttrInfo(K.CPUS, ValueType.INTEGER, "CPUs", "How many CPUs the node has", default="0"),
    AttrInfo(K.CPUS_USED, ValueType.INTEGER, "CPUs Used", "CPUs of the node in use by jobs", default="0"),
    AttrInfo(K.MEMORY, ValueType.INTEGER, "Memory (MB)", "Memory the node has, in megabytes", default="0"),
    AttrInfo(K.QUEUES, ValueType.STRING, "Queues", "Queues of the node, comma-separated"),
    AttrInfo(K.REASON, ValueType.STRING, "Reason", "Why the node is down or failing"),
    AttrInfo(K.DEFAULT, ValueType.BOOLEAN, "Default Queue", "Whether jobs that name no queue go here",
             default="false"),
    AttrInfo(K.MAX_TIME, ValueType.INTEGER, "Maximum Time (s)",
             "Longest wall time a job of the queue may have, in seconds (absent: unlimited)", default="0"),
    AttrInfo(K.TOTAL_NODES, ValueType.INTEGER, "Total Nodes", "Hosts of the queue", default="0"),
    AttrInfo(K.TOTAL_SLOTS, ValueType.INTEGER, "Total Slots", "Processor slots of the queue", default="0"),
    AttrInfo(K.FREE_SLOTS, ValueType.INTEGER, "Free Slots", "Processor slots of the queue not in use",
             default="0"),
    AttrInfo(K.WAITING, ValueType.INTEGER, "Waiting Jobs", "Jobs of the queue waiting to start", default="0"),
    AttrInfo(K.RUNNING, ValueType.INTEGER, "Running Jobs", "Jobs of the queue running", default="0"),
    AttrInfo(K.HOSTS, ValueType.STRING, "Hosts", "Hosts of the queue, or hosts the job runs on"),
    AttrInfo(K.NUM_NODES, ValueType.INTEGER, "Nodes", "Hosts the job uses or asked for", default="0"),
    AttrInfo(K.TIME_USED, ValueType.INTEGER, "Time Used (s)", "Run time so far in seconds", default="0"),
    AttrInfo(K.TIME_LIMIT, ValueType.INTEGER, "Time Limit (s)", "The job's wall-time limit in seconds",
             default="0"),
    AttrInfo(K.ACCOUNT, ValueType.STRING, "Account", "Account or project the job is charged to"),
    AttrInfo(K.EXIT_CODE, ValueType.INTEGER, "Exit Code", "How the job or process ended", default="0"),
)


