"""Local jobs an earlier agent started come back from the store: those the keeper still runs
are followed again, the others shown as they ended."""

from __future__ import annotations

import logging
from typing import List


from ..service.jobs import JobState
from ..service.model import K
from .common import state_attrs
from .local_records import ENDED_STATES, RUNNING_ATTRS, STATE_TABLE

log = logging.getLogger("proxy_agent.schedulers.local")


class LocalAdoption:
    """How the local backend takes back the jobs of an earlier agent."""

    # ------------------------------------------------------------------ adoption

    def adopt(self, stored) -> List[int]:
        """Take back the jobs a previous agent submitted here (their store records), as the
        keeper knows them: running ones are followed on, ended ones reported; their output is
        delivered from where delivery had stopped.  Returns the keys adopted."""
        adopted = []
        for record in stored:
            spec = record.job_spec
            if spec is None:
                continue
            info = self._keeper_jobs.get(record.key)
            pids = list(info.get("pids", [])) if info else []
            count = len(pids) or spec.num_procs
            path = spec.executable
            cwd = spec.working_dir or self._default_cwd
            if info is None and record.ended is not None and record.native_state in ENDED_STATES:
                # ended and recorded so, its files since removed: the recorded end
                ended = state_attrs(STATE_TABLE, record.native_state)
                self._add_job(spec, spec.display_name, path, cwd, count, ended, record.key)
                job = self._jobs.pop(record.key)
                with self.model.batch():
                    self.model.update(job.key, {K.EXIT_CODE: record.exit_code or None,
                                                K.MESSAGE: record.message or None})
                    if count == 1 and (record.exit_code or record.signal):
                        self.model.update(job.process_keys[0], {K.EXIT_CODE: record.exit_code or None,
                                                                K.SIGNAL: record.signal or None})
                adopted.append(record.key)
                continue
            if info is None or info.get("lost"):
                self._add_job(spec, spec.display_name, path, cwd, count, state_attrs(STATE_TABLE, "LOST"), record.key)
                job = self._jobs.pop(record.key)
                if info is None and record.state == "SUBMITTING":
                    # recorded in the store, not yet by the keeper: it was never answered OK
                    why = ("the keeper has no record of the job: the agent ended before the keeper recorded it, "
                           "so it never ran")
                elif info is None:
                    why = "the keeper has no record of the job: its files were removed"
                else:
                    why = "the job ended with the keeper that ran it; its end was not recorded"
                self.model.update(job.key, {K.MESSAGE: why})
                for process in job.process_keys:
                    self.model.update(process, state_attrs(STATE_TABLE, "LOST"))
                adopted.append(record.key)
                continue
            self._add_job(spec, spec.display_name, path, cwd, count, RUNNING_ATTRS, record.key)
            job = self._jobs[record.key]
            job.started = True
            job.pids = pids
            job.recorded.set()
            if record.native_state == "TERMINATED" or record.state == JobState.KILLED.value:
                job.canceled = True
            delivered = record.delivered_offsets
            sizes = info.get("sizes", {})
            for (rank, stream), file in job.files.items():
                name = f"{rank}.{stream}"
                file.offset = file.size = delivered.get(name, 0)
                file.size = max(file.size, int(sizes.get(f"{rank}.{stream}", 0)))
                if file.size > file.offset:
                    self._mark(job.key, rank, stream)
            with self.model.batch():
                for index, pid in enumerate(pids):
                    self.model.update(job.process_keys[index], {K.PID: str(pid)})
                if pids:
                    self.model.update(job.key, {K.NATIVE_ID: str(pids[0])})
            self._take_dropped(job, info.get("dropped") or {})
            for file in job.files.values():  # what lies before the delivered output was told already
                file.gaps = [gap for gap in file.gaps if gap[0] >= file.offset]
            for rank, why in (info.get("lost_codes") or {}).items():
                job.lost[int(rank)] = why
            job.error = info.get("error")
            codes = info.get("codes", [])
            if info.get("done"):
                job.done = True
                for rank, code in enumerate(codes):
                    job.codes[rank] = code
            else:
                for rank, code in enumerate(codes):
                    if code is not None:
                        job.codes[rank] = code
            self._settle(job)
            adopted.append(record.key)
        return adopted
