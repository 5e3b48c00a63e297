"""What a state directory keeps about jobs, read and changed directly, with or without an agent.

The job list for people (``proxy-agent jobs``, ``forget``, ``output``) is built on these few
functions; each takes the state directory and returns plain data (numbers, text, lists and
dicts, as JSON has them), so that the same requests can be answered by a running agent:

* :func:`list_jobs` -- every job the store keeps, one row (a dict, :data:`ROW_FIELDS`) each;
* :func:`forget_jobs` -- remove ended jobs, with their kept output and their local files;
* :func:`job_output` -- a job's kept output (:mod:`.history`), whole or past what a reader has.

The agent forgets long-ended jobs through :func:`forget_stored` on its own store.  The store
is SQLite in WAL mode, so reading it beside a running agent is safe.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from . import history
from .journal import JOURNAL, forget_in_journal, read_journal
from .store import JobStore, StoreError, StoredJob, StoreUnwritable

__all__ = [
    "ROW_FIELDS",
    "forget_jobs",
    "forget_stored",
    "job_output",
    "job_row",
    "list_jobs",
    "open_existing_store",
]

#: The fields of a job's row, in their table order.  Times are seconds since the epoch
#: (None: not yet); ``exit_code`` a number or None; ``signal`` a name or None.
ROW_FIELDS = (
    "id", "name", "scheduler", "queue", "native_id", "state", "native_state", "submitted", "ended",
    "exit_code", "signal", "message", "client_ref", "broker", "broker_queue", "broker_reason",
)

#: The key of a job record's extra holding the broker's decision (as the service writes it).
_BROKER_EXTRA = "broker"


def open_existing_store(state_dir: str, writing: bool = False) -> JobStore:
    """The store of ``state_dir`` as it is: :class:`StoreError` when there is none (none is
    made), or when it is damaged (:class:`StoreDamaged`, saying what is wrong: it is never
    moved aside or followed through a link here, that is the agent's to do).  Unless
    ``writing``, it is opened to be read only (no lock that a running agent's writes would
    wait for), and a sound store that cannot be written now is read all the same; with
    ``writing``, :class:`StoreUnwritable` says why it cannot be written now."""
    path = os.path.join(state_dir, JobStore.FILE)
    if not os.path.lexists(path):
        raise StoreError(f"no job store in {state_dir} (no agent has kept jobs there)")
    if not writing:
        reader = JobStore.reader(path)
        if reader is not None:
            return reader
        # an older agent's store: opened to be brought up to date, as an agent would
    try:
        return JobStore(path)
    except StoreUnwritable as exc:
        if writing:
            raise
        return JobStore.reading_only(path, exc.message)


def job_row(job: StoredJob) -> Dict[str, Any]:
    """One stored job as a row (see :data:`ROW_FIELDS`)."""
    choice = job.extras.get(_BROKER_EXTRA)
    choice = choice if isinstance(choice, dict) else {}
    code = job.exit_code.strip()
    return {
        "id": job.key,
        "name": job.name,
        "scheduler": job.backend,
        "queue": job.queue,
        "native_id": job.native_id,
        "state": job.state,
        "native_state": job.native_state,
        "submitted": job.submitted,
        "ended": job.ended,
        "exit_code": int(code) if code.lstrip("-").isdigit() else None,
        "signal": job.signal or None,
        "message": job.message,
        "client_ref": job.client_ref,
        "broker": _text(choice.get("broker")),
        "broker_queue": _text(choice.get("brokerQueue")),
        "broker_reason": _text(choice.get("brokerReason")),
    }


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def list_jobs(state_dir: str) -> List[Dict[str, Any]]:
    """Every job the store of ``state_dir`` keeps, in key order."""
    store = open_existing_store(state_dir)
    try:
        return [job_row(job) for job in store.jobs()]
    finally:
        store.close()


def forget_jobs(state_dir: str, keys: Sequence[int] = (), ended_before: Optional[float] = None) -> Dict[str, List[int]]:
    """Forget ended jobs: those named (``keys``) and those that ended before a time.  Returns
    ``{"forgotten": [...], "refused": [...] (not ended: kept), "missing": [...] (unknown)}``."""
    store = open_existing_store(state_dir, writing=True)
    try:
        return forget_stored(store, state_dir, keys, ended_before)
    finally:
        store.close()


def forget_stored(store: JobStore, state_dir: str, keys: Iterable[int] = (),
                  ended_before: Optional[float] = None) -> Dict[str, List[int]]:
    """:func:`forget_jobs` on an open store (the agent's own)."""
    keys = list(keys)
    backends = {job.key: job.backend for job in store.jobs(ended=True)}
    forgotten, refused = store.forget(keys)
    if ended_before is not None:
        forgotten += store.forget_ended_before(ended_before)
    missing = [key for key in keys if key not in forgotten and key not in refused]
    remove_kept_files(state_dir, forgotten, backends)
    return {"forgotten": forgotten, "refused": refused, "missing": missing}


def remove_kept_files(state_dir: str, keys: Sequence[int], backends: Dict[int, str]) -> None:
    """What the state directory holds for forgotten jobs: their kept output and, for local
    jobs, the keeper's output files (only once the keeper has recorded their end: in its
    journal, or an older keeper's ``status.json``)."""
    for key in keys:
        history.remove_job_output(state_dir, key)
    local = [key for key in keys if backends.get(key) == "local"]
    if not local:
        return
    directory = os.path.join(state_dir, "local")
    journal = read_journal(os.path.join(directory, JOURNAL))
    for key in local:
        files = os.path.join(directory, "jobs", str(key))
        if journal.get(key, {}).get("done") or os.path.isfile(os.path.join(files, "status.json")):
            shutil.rmtree(files, ignore_errors=True)
    forget_in_journal(directory, [key for key in local if journal.get(key, {}).get("done")])


def job_output(state_dir: str, key: int, *, rank: Optional[int] = None,
               streams: Sequence[str] = ("stdout", "stderr"),
               skip: Optional[Dict[Tuple[int, str], int]] = None) -> Dict[str, Any]:
    """A job's kept output, and whether more may come: ``{"id", "ended" (the job has ended:
    nothing more comes), "streams": [{"rank", "stream", "first", "lines", "dropped", "why_dropped"}]}``
    (``why_dropped``: empty for lines past the bound, else what refused them, a full disk).
    :class:`LookupError` when the store does not know the job.  ``skip``: lines a reader has
    already, per (rank, stream); only the lines after them are read out."""
    store = open_existing_store(state_dir)
    try:
        job = store.job(key)
    finally:
        store.close()
    if job is None:
        raise LookupError(f"no job {key} in the list")
    kept = history.read_job_output(state_dir, key, rank=rank, streams=streams, skip=skip)
    return output_answer(kept, job.ended is not None)


def output_answer(kept: "history.JobOutput", ended: bool) -> Dict[str, Any]:
    """A job's kept output as :func:`job_output` gives it (and the service's interface sends it)."""
    return {
        "id": kept.key,
        "ended": ended,
        "streams": [{"rank": part.rank, "stream": part.stream, "first": part.first, "lines": list(part.lines),
                     "dropped": part.dropped, "why_dropped": part.why_dropped} for part in kept.streams],
    }
