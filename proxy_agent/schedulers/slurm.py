"""SLURM (``--scheduler slurm``): the backend runs on the batch engine.

The backend is :class:`~proxy_agent.schedulers.batch.slurm_backend.SlurmBackend`; SLURM's
states, records and attributes are in :mod:`proxy_agent.schedulers.batch.slurm`, its commands
and their parsers in :mod:`proxy_agent.schedulers.slurm_parse`.  This module gathers the
names under which they have always been found, and maps SLURM's records to the attributes
the model shows (for tools and tests that look at one record).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..service.jobs import JobState
from ..service.model import K
from .batch.engine import CommandResult, JobChanges, JobTable, job_values, node_values, queue_values, run_command
from .batch.slurm import (
    DISPLAY_ATTRIBUTES, STATE_TABLE, SUBMIT_ATTRIBUTES, clean_message, expand_output_pattern, first_host, native_job,
    native_node, native_queue, native_word, service_state, split_exit_code,
)
from .batch.slurm_backend import SlurmBackend, SlurmOptions, SlurmSystem
from .slurm_parse import SlurmJob, SlurmNode, SlurmPartition

__all__ = [
    "CommandResult",
    "DISPLAY_ATTRIBUTES",
    "JobChanges",
    "JobTable",
    "STATE_TABLE",
    "SUBMIT_ATTRIBUTES",
    "SlurmBackend",
    "SlurmOptions",
    "SlurmSystem",
    "clean_message",
    "expand_output_pattern",
    "first_host",
    "job_attributes",
    "job_service_state",
    "native_job",
    "native_word",
    "node_attributes",
    "partition_attributes",
    "process_attributes",
    "run_command",
    "split_exit_code",
]

_SYSTEM = SlurmSystem()


def job_service_state(job: SlurmJob) -> JobState:
    """The service state of a job's record (a pending job held by its user or an
    administrator is HOLD)."""
    return service_state(native_word(job.state), job.reason)


def job_attributes(job: SlurmJob) -> Dict[str, str]:
    """The attributes a listed job shows (every key, ``""`` where SLURM has no value)."""
    return {K.EXIT_CODE: "", K.SIGNAL: "", **job_values(_SYSTEM, native_job(job))[0]}


def process_attributes(job: SlurmJob, node_id: Optional[int] = None) -> Dict[str, Any]:
    """The attributes of a job's process 0 that follow from the job's record."""
    out: Dict[str, Any] = {k: v for k, v in job_values(_SYSTEM, native_job(job))[1].items() if v != ""}
    if node_id is not None:
        out[K.NODE] = node_id
    return out


def node_attributes(node: SlurmNode) -> Dict[str, str]:
    """A node's attributes (every key; the node number is the caller's)."""
    return node_values(native_node(node))


def partition_attributes(part: SlurmPartition) -> Dict[str, str]:
    """A partition's queue attributes (every key)."""
    queue = native_queue(part)
    return queue_values(queue, queue.is_default)
