"""Neutral records that every batch system's parsers produce.

A batch system module parses its commands' output into these; the batch engine diffs
listings of them into the service model.  Fields a system does not report stay empty
(``""``) or ``None``; nothing here is specific to one system.  ``native_state`` keeps the
system's own state text; the system's :class:`~proxy_agent.service.jobs.StateTable` maps it.
"""

from __future__ import annotations

from typing import Optional, Tuple

import attrs

__all__ = ["NativeJob", "NativeNode", "NativeQueue"]


@attrs.frozen
class NativeJob:
    """One job as a batch system lists it.

    ``job_id`` is what the system's own commands accept (``12345``, ``12345.server``,
    ``12345[7]``).  For an element of a job array ``array_id`` is the array's id and
    ``array_index`` the element's index; a pending array not yet split has ``array_index``
    like ``"1-9"``.  Times are the local time as ``YYYY-MM-DDTHH:MM:SS``; durations seconds.
    ``exit_code`` is the program's exit status; ``signal`` the name or number of the signal
    that ended it, when one did.  ``reason`` is why it waits or why it failed.
    ``cancelled`` is set when the system's own record says the job was deleted or cancelled
    (by its owner, an administrator or the system), so a final state can tell a job that
    was killed from one that failed.
    """

    job_id: str
    name: str = ""
    user: str = ""
    queue: str = ""
    native_state: str = ""
    reason: str = ""
    account: str = ""
    hosts: Tuple[str, ...] = ()
    num_nodes: Optional[int] = None
    num_procs: Optional[int] = None
    #: CPUs the job uses or asked for, where the system counts them apart from processes
    num_cpus: Optional[int] = None
    submit_time: str = ""
    start_time: str = ""
    end_time: str = ""
    time_used: Optional[int] = None
    time_limit: Optional[int] = None
    exit_code: Optional[int] = None
    signal: str = ""
    work_dir: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    array_id: str = ""
    array_index: str = ""
    priority: Optional[int] = None
    cancelled: bool = False


@attrs.frozen
class NativeNode:
    """One host or node.  ``native_state`` is the system's own text (``idle``, ``au``,
    ``free``, ``down,offline``); ``state`` its meaning: ``UP``, ``DOWN``, ``ERROR`` or
    ``UNKNOWN``."""

    name: str
    native_state: str = ""
    state: str = "UNKNOWN"
    cpus: Optional[int] = None
    cpus_used: Optional[int] = None
    memory_mb: Optional[int] = None
    load: Optional[float] = None
    queues: Tuple[str, ...] = ()
    reason: str = ""
    arch: str = ""


@attrs.frozen
class NativeQueue:
    """One queue (partition, cluster queue).  ``state`` is ``NORMAL`` (takes and starts jobs)
    or ``STOPPED``; ``native_state`` the system's own text.  ``max_time`` is the longest wall
    time a job may ask for, in seconds (None: no limit); ``total_slots``/``free_slots`` count
    processor slots; ``waiting``/``running`` count jobs."""

    name: str
    native_state: str = ""
    state: str = "NORMAL"
    is_default: bool = False
    max_time: Optional[int] = None
    default_time: Optional[int] = None
    max_nodes: Optional[int] = None
    total_nodes: Optional[int] = None
    total_slots: Optional[int] = None
    free_slots: Optional[int] = None
    waiting: Optional[int] = None
    running: Optional[int] = None
    hosts: Tuple[str, ...] = ()
