"""How a job ended, as the console tells it: exit statuses, signals, failure."""

from __future__ import annotations

import signal
from typing import List, Tuple


from ..client import AgentClient, Element
from .language import FAILED_STATUSES

def exit_numbers(client: AgentClient, job: Element) -> Tuple[List[int], List[str]]:
    """(exit statuses, signal names) of the job's ended processes, for JSON."""
    numbers: List[int] = []
    signals: List[str] = []
    for code in exit_codes(client, job):
        if code.lstrip("-").isascii() and code.lstrip("-").isdigit():
            numbers.append(int(code))
        else:
            signals.append(code)
    return numbers, signals


def exit_codes(client: AgentClient, job: Element) -> List[str]:
    codes = []
    for process in client.children(job, "process"):
        code = process.get("processExitCode")
        sig = process.get("processSignalName")
        if isinstance(code, str):
            codes.append(code)
        elif isinstance(sig, str):
            codes.append(sig)
    return codes


def exit_status(client: AgentClient, job: Element) -> int:
    """A job's exit status as a shell gives a command's, and as ``srun`` does: the highest of
    its processes' exit statuses, 128 + N for one killed by signal N; 1 for a job that
    failed without one (never started, cancelled while queued); 0 when it succeeded."""
    status = 0
    for process in client.children(job, "process"):
        code = process.get("processExitCode")
        name = process.get("processSignalName")
        if isinstance(code, str) and code.isascii() and code.isdigit():
            status = max(status, int(code))
        elif isinstance(name, str) and name:
            status = max(status, 128 + signal_number(name))
    if status == 0 and job_failed(client, job):
        return 1
    return status


def signal_number(name: str) -> int:
    """SIGKILL -> 9; a name no signal has -> 0 (the status is then 128: a signal, unknown)."""
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        return int(name) if name.isdigit() else 0


def job_failed(client: AgentClient, job: Element) -> bool:
    status = job.get("jobStatus")
    if isinstance(status, str) and status.upper() in FAILED_STATUSES:
        return True
    return any(code != "0" for code in exit_codes(client, job))


