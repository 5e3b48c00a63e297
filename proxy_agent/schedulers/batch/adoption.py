"""Jobs an earlier agent submitted come back from the store by their native id; their
output is delivered from where it stopped, and a recorded end is shown after that output."""


import logging
from typing import Dict, List, Optional, Tuple


from ...service.jobs import JobSpec, JobState
from ...service.model import K, Kind
from .tracked import TrackedJob

log = logging.getLogger("proxy_agent.schedulers.batch")


class Adoption:
    """How a batch backend follows again the jobs of an earlier agent."""

    def adopt(self, stored) -> List[int]:
        """Follow again the jobs an earlier agent submitted here, by their native ids:

        * a job still listed goes on from its record, under its stored key (also when the
          first listing showed it under a key of its own);
        * one no longer listed and not known to have ended is reported gone by the next
          poll, which asks the system's accounting how it ended;
        * one no longer listed whose end was recorded shows that end (state, exit status).

        Output files are read on from where delivery to a client stopped, and an end is
        shown after the output, as for a job submitted here.  A record without a native id
        (the agent ended before the submit command answered) is shown DELETED, saying so."""
        adopted: List[int] = []
        for record in stored:
            spec = record.job_spec
            if spec is None or record.key in self.model:
                continue
            try:
                if record.native_id:
                    self._adopt_job(record, spec)
                else:
                    self._adopt_unsubmitted(record, spec)
            except Exception:  # noqa: BLE001 - one bad record must not keep the others out
                log.exception("cannot adopt stored job %s (%s job %r)", record.key, self.system.label,
                              record.native_id)
                continue
            adopted.append(record.key)
        if adopted:
            self._poke()
        return adopted

    def _stored_queue(self, record) -> int:
        return self._queue_for(record.queue.partition(":")[2] or record.queue)

    def _adopt_unsubmitted(self, record, spec: JobSpec) -> None:
        values = {K.STATE: JobState.DELETED.value, K.NATIVE_STATE: "UNKNOWN"}
        message = (f"the agent ended before {self.system.submit_program} answered: whether {self.system.label} "
                   f"took the job is not known (look for a job named {record.name!r})")
        queue = self._stored_queue(record)
        with self.model.batch():
            element = self.model.add(Kind.JOB, queue, {
                K.CLIENT_REF: record.client_ref or spec.client_ref, K.NAME: record.name or spec.display_name,
                K.USER: self.user, K.EXECUTABLE: spec.executable, K.QUEUE: queue, K.MESSAGE: message, **values},
                owner=self.name, key=record.key)
            self.model.add(Kind.PROCESS, element, dict(values), owner=self.name)

    def _adopt_job(self, record, spec: JobSpec) -> None:
        native_id = record.native_id
        listed = self._jobs.get(native_id)
        if listed is not None:
            # The first listing showed it as anybody's job: it becomes the stored one.
            del self._jobs[native_id]
            self._by_element.pop(listed.element, None)
            self.model.remove(listed.element)
        current = self._table.record(native_id)
        queue = self._queue_for(current.queue) if current is not None else (
            listed.queue if listed is not None else self._stored_queue(record))
        try:
            state = JobState(record.state)
        except ValueError:
            state = JobState.QUEUING  # the submission was recorded, no state yet
        final = state.final and record.ended is not None
        values = {K.STATE: JobState.FINISHING.value if final else state.value,
                  K.NATIVE_STATE: record.native_state or self.system.submitted_state}
        tracked = self._register(native_id, spec, queue, record.key, submitted=True, values=values)
        extras = record.extras
        paths = extras.get("paths", extras.get("outputs"))
        paths = paths if isinstance(paths, dict) else {}
        tracked.paths = {s: p for s, p in paths.items() if s in ("stdout", "stderr") and isinstance(p, str)}
        tracked.spool_files = tuple(p for p in extras.get("spool", ()) if isinstance(p, str))
        if current is not None:
            # the system's word, as in every listing (an end waits for the output)
            self._start_followers(tracked, self._delivered(record, tracked))
            self._update_job(tracked, current)
            return
        if final:
            end = {K.STATE: state.value, K.NATIVE_STATE: record.native_state,
                   K.EXIT_CODE: getattr(record, "exit_code", ""), K.SIGNAL: getattr(record, "signal", "")}
            job_end = {**end, K.MESSAGE: record.message or ""}
            self._table.retire(native_id)
            self._completed(tracked)
            if tracked.paths and self._nursery is not None:
                tracked.held = (job_end, end)
            else:
                with self.model.batch():
                    self._set(tracked.process, end)
                    self._set(tracked.element, job_end)
        self._start_followers(tracked, self._delivered(record, tracked))
        if tracked.started is not None:
            # Gone from the listing while no agent ran: it has started (or ended), so its
            # output is read while the next poll looks up how it ended.
            tracked.started.set()

    @staticmethod
    def _delivered(record, tracked: TrackedJob) -> Dict[str, Tuple[int, Optional[tuple]]]:
        delivered = record.delivered_offsets
        return {s: (delivered.get(f"0.{s}", 0), None) for s in tracked.paths}

