"""Orphans of jobs: no process a job started may outlive the job.

A job's processes share a process group, and ending the job signals the group.  A process
that leaves the group on purpose (a daemon calling ``setsid``) would escape that.  So the
agent makes itself the *child subreaper* of everything it starts (``PR_SET_CHILD_SUBREAPER``):
when such a process's parent exits, the kernel hands it to the agent instead of to init, and
it shows up among the agent's own children.  Every job process carries its job's marker in
its environment (:data:`MARKER`); :meth:`OrphanReaper.sweep` looks at the children the agent
did not start itself, ends those whose job has ended, and reaps the ones that have exited.

Linux only (``/proc``, ``prctl``); elsewhere the reaper does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import time
from typing import Callable, Dict, Iterable, Optional, Set

log = logging.getLogger("proxy_agent.schedulers.reaper")

__all__ = ["MARKER", "OrphanReaper"]

#: Environment variable every job process gets: ``INSTANCE/JOB`` of the agent that started it.
MARKER = "PROXY_AGENT_JOB_MARK"
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
#: An unknown child that stays a zombie this long was not started by anyone who reaps it.
_ZOMBIE_GRACE = 2.0


def child_pids() -> Set[int]:
    """Direct children of this process (of all its threads)."""
    found: Set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                found.update(int(pid) for pid in children.read().split())
        except (OSError, ValueError):
            continue
    return found


def _state(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_marker(pid: int) -> Optional[str]:
    """The job marker in a process's environment (None: it has none, or is gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            data = environ.read()
    except OSError:
        return None
    prefix = MARKER.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("ascii", "replace")
    return None


class OrphanReaper:
    """Adopts the orphans of this process's jobs and ends them with their jobs."""

    def __init__(self, instance: Optional[str] = None) -> None:
        #: tells this agent's jobs from any other agent's (a keeper's custodian gives its own,
        #: the same for every keeper it starts)
        self.instance = instance or f"{os.getpid()}-{secrets.token_hex(4)}"
        self.enabled = _set_subreaper()
        #: adopted orphans still alive: pid -> job
        self.adopted: Dict[int, str] = {}
        self._zombies: Dict[int, float] = {}

    def mark(self, job: object) -> str:
        """The marker value for a job's processes' environment."""
        return f"{self.instance}/{job}"

    def sweep(self, known: Iterable[int], alive_jobs: Callable[[str], bool]) -> int:
        """Look at the children this process did not start itself (``known`` are the ones it
        did): end every process of this agent's jobs whose job is not alive, reap those that
        have exited.  Returns how many it signalled."""
        if not self.enabled:
            return 0
        known_set = set(known)
        killed = 0
        prefix = self.instance + "/"
        now = time.monotonic()
        for pid in child_pids() - known_set:
            state = _state(pid)
            if state is None:
                continue
            if state == "Z":
                # Ours to reap if we saw it alive, or if nobody else reaped it for a while.
                first = self._zombies.setdefault(pid, now)
                if pid in self.adopted or now - first >= _ZOMBIE_GRACE:
                    self._reap(pid)
                continue
            job = self.adopted.get(pid)
            if job is None:
                mark = process_marker(pid)
                if mark is None or not mark.startswith(prefix):
                    continue  # not a job's: some command's child; leave it alone
                job = self.adopted[pid] = mark[len(prefix):]
            if not alive_jobs(job):
                log.info("ending process %d, left behind by job %s", pid, job)
                _kill(pid)
                killed += 1
        return killed

    def _reap(self, pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        self.adopted.pop(pid, None)
        self._zombies.pop(pid, None)


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(os.getpgid(pid), signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError, OSError):
            continue


def set_name(name: str) -> None:
    """The process's name as ``ps`` and ``/proc/PID/comm`` show it (at most 15 bytes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
