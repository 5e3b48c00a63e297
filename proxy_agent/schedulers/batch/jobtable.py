"""The last listing of a batch system's jobs, and what a new one changes (:class:`JobTable`):
only the jobs whose record changed touch the model, whatever the size of the listing."""


import gc
import operator
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set

import attrs

from .records import NativeJob

# --------------------------------------------------------------------------- job table


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: The record fields the model shows: a record whose key is unchanged changes nothing (the
#: running clock, ``time_used``, is not among them).
_JOB_KEY = operator.attrgetter(
    "native_state", "reason", "queue", "hosts", "exit_code", "signal", "name", "num_nodes", "num_procs",
    "num_cpus", "time_limit", "user", "account", "start_time", "end_time", "cancelled", "work_dir",
)


@attrs.frozen
class JobChanges:
    added: List[NativeJob]
    changed: List[NativeJob]
    gone: List[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.gone)


class JobTable:
    """The last listing, and what a new one changes.  Pure.

    :meth:`expect` announces a job just submitted: a listing whose query started before
    (an earlier ``generation``) does not report it gone.  Jobs reported gone leave the
    table; :meth:`retire` keeps a job whose element was removed from being reported new
    again while the system still lists it.
    """

    def __init__(self) -> None:
        self._keys: Dict[str, Optional[tuple]] = {}
        self._records: Dict[str, Optional[NativeJob]] = {}
        self._expected: Dict[str, int] = {}
        self._retired: Set[str] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._keys

    def record(self, job_id: str) -> Optional[NativeJob]:
        return self._records.get(job_id)

    def records(self) -> Iterable[NativeJob]:
        return (r for r in self._records.values() if r is not None)

    def expect(self, job_id: str, generation: int) -> None:
        if job_id in self._keys:
            return
        self._retired.discard(job_id)
        self._keys[job_id] = None
        self._records[job_id] = None
        self._expected[job_id] = generation

    def forget(self, job_id: str) -> None:
        """As if the last listing had not shown the job: the next one reports it new."""
        self._keys.pop(job_id, None)
        self._records.pop(job_id, None)

    def retire(self, job_id: str) -> None:
        self._keys.pop(job_id, None)
        self._records.pop(job_id, None)
        self._expected.pop(job_id, None)
        self._retired.add(job_id)

    def apply(self, jobs: Iterable[NativeJob], generation: int) -> JobChanges:
        with gc_paused():
            keys, records, retired = self._keys, self._records, self._retired
            key_of, missing = _JOB_KEY, _MISSING
            added: List[NativeJob] = []
            changed: List[NativeJob] = []
            seen: Set[str] = set()
            see = seen.add
            stored = 0
            for job in jobs:
                job_id = job.job_id
                if job_id in seen:
                    continue
                see(job_id)
                key = key_of(job)
                old = keys.get(job_id, missing)
                if old is missing:
                    if retired and job_id in retired:
                        continue
                    added.append(job)
                elif old != key:
                    changed.append(job)
                keys[job_id] = key
                records[job_id] = job
                stored += 1
            expected = self._expected
            if expected:
                for job_id in [j for j in expected if j in seen]:
                    del expected[job_id]
            if stored == len(keys):
                gone: List[str] = []  # every job known was listed
            else:
                gone = [j for j in keys if j not in seen and not (j in expected and expected[j] >= generation)]
                for job_id in gone:
                    del keys[job_id], records[job_id]
                    expected.pop(job_id, None)
            if retired:
                self._retired = {j for j in retired if j in seen}
            return JobChanges(added, changed, gone)


_MISSING: Any = object()

