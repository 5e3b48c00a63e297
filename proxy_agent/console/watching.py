"""The console's commands that follow a job: its output (kept and live) and waits for its states."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

import trio

from ..client import CommandFailed, Element, UnknownElementError
from ..client.connection import NO_KEPT_OUTPUT
from . import render
from .language import (
    CommandError, FINAL_STATUSES, OUTPUT_RECHECK, PROTOCOL_JOB_STATES, SPECS, STATUS_NAMES, WAITING_STATUSES,
    nearest, seconds_arg,
)
from .outcome import exit_status, job_failed

class JobWatching:
    """The output and wait commands of a :class:`~.commands.Console`."""

    async def cmd_output(self, args: List[str]) -> None:
        ref = self._one_arg("output", args)
        target: Union[Element, int]
        try:
            job: Optional[Element] = self._job(ref)
            target = job  # type: ignore[assignment]
        except UnknownElementError:
            if not (ref.isascii() and ref.isdigit()):
                raise
            job, target = None, int(ref)  # one the model no longer shows: the agent may keep its output
        try:
            await self._print_kept(job, target)
        except CommandFailed as exc:
            if job is None or exc.code not in NO_KEPT_OUTPUT:
                raise
            await self._print_seen(job)  # an agent that keeps none of it: what this session saw

    async def _kept_or_none(self, job: Element):
        """The job's kept output, or None when the agent keeps none of it."""
        try:
            return await self.client.kept_output(job)
        except CommandFailed as exc:
            if exc.code in NO_KEPT_OUTPUT:
                return None
            raise

    async def _print_kept(self, job: Optional[Element], target: Union[Element, int]) -> None:
        """``output``: every line the agent keeps of the job, process by process; then, until
        the job ends, the lines it writes.  The live events only say when to ask again, so
        each line is printed once."""
        client = self.client
        label = self._label(job) if job is not None else str(target)
        seen: Dict[Tuple[int, str], int] = {}
        dropped: Dict[Tuple[int, str], int] = {}
        texts: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        timeout = self.timeout
        if job is not None:
            self._silenced.add(job.id)
        try:
            with trio.move_on_after(timeout if timeout is not None else math.inf) as deadline:
                while True:
                    over = job is None or job.state == "COMPLETED" or job.removed
                    kept = await client.kept_output(target, skip=seen)
                    for part in kept.streams:
                        seen[(part.rank, part.stream)] = part.first + len(part.lines)
                        dropped[(part.rank, part.stream)] = part.dropped
                        texts[part.stream].extend(part.lines)
                        if not self.json:
                            self.out.lines(render.labelled_line(f"{label}.{part.rank}", part.stream, line)
                                           for line in part.lines)
                    if over:
                        break
                    assert job is not None
                    count = len(job.output)
                    with trio.move_on_after(OUTPUT_RECHECK):
                        await client.wait_for(lambda: len(job.output) != count or job.state == "COMPLETED"
                                              or job.removed)
            if deadline.cancelled_caught:
                now = f" (now {job.state})" if job is not None else ""
                raise CommandError(f"timed out after {timeout:g} s following the output of job {label}{now}")
        finally:
            if job is not None:
                self._silenced.discard(job.id)
                self._printed[job.id] = len(job.output)
        for (rank, stream), count in sorted(dropped.items()):
            if count:
                self.warning(f"{count} later lines process {label}.{rank} wrote to {stream} were not kept "
                             "(the agent keeps the first 64 MiB of each job's output, as far as its disk has room)")
        if self.json:
            self.result("output", job=self._id_value(job) if job is not None else target,
                        stdout="".join(line + "\n" for line in texts["stdout"]),
                        stderr="".join(line + "\n" for line in texts["stderr"]),
                        dropped=sum(dropped.values()))
        elif job is not None:
            self.out.line(self._job_end_line(job))

    async def _print_seen(self, job: Element) -> None:
        """``output`` of a job the agent keeps no output of: the lines this session received,
        then those that come until the job ends."""
        if self.json:
            if job.state != "COMPLETED":
                await self._follow(job, self.timeout)
            self.result("output", job=self._id_value(job), stdout=job.text("stdout"), stderr=job.text("stderr"))
            return
        for line in job.output:
            self.out.line(render.output_line(self.client.state, line))
        self._printed[job.id] = len(job.output)
        if job.state != "COMPLETED" and not job.removed:
            await self._follow(job, self.timeout)
        self.out.line(self._job_end_line(job))

    async def cmd_wait(self, args: List[str]) -> None:
        timeout = None
        words = []
        i = 0
        while i < len(args):
            if args[i] in ("-t", "--timeout") and i + 1 < len(args):
                timeout = seconds_arg(args[i + 1], "wait --timeout")
                i += 2
                continue
            words.append(args[i])
            i += 1
        if not 1 <= len(words) <= 2:
            raise CommandError(f"usage: {SPECS['wait'].usage}")
        state = self._wait_state(words[1]) if len(words) == 2 else "COMPLETED"
        job = self._job(words[0])
        await self._wait_job(job, state, self._wait_timeout(timeout))
        if state == "COMPLETED" and job_failed(self.client, job):
            # as sbatch --wait: a wait for the end of a job that failed fails with its status
            raise CommandError(f"job {self._label(job)} did not succeed: {self._job_end_line(job)}",
                               exit_status=exit_status(self.client, job), job=self._id_value(job), state=state,
                               current=job.state, status=job.get("jobStatus"))
        self.result("wait", [f"job {self._label(job)} reached {state}"], job=self._id_value(job), state=state,
                    current=job.state, status=job.get("jobStatus"))

    def _known_states(self) -> List[str]:
        names = list(PROTOCOL_JOB_STATES) + list(STATUS_NAMES)
        for key in ("jobState", "jobStatus"):
            definition = self.client.attr_defs.get(key)
            names.extend(getattr(definition, "values", ()) or ())
        return list(dict.fromkeys(n.upper() for n in names))

    def _wait_state(self, text: str) -> str:
        """The state a ``wait`` names, checked before anything is awaited."""
        state = text.upper()
        known = self._known_states()
        if state in known:
            return state
        guess = nearest(state, known)
        hint = f" (did you mean {guess}?)" if guess else ""
        raise CommandError(
            f"wait: unknown state {text!r}{hint}; jobState is one of {', '.join(PROTOCOL_JOB_STATES)}, "
            f"jobStatus one of {', '.join(s for s in known if s not in PROTOCOL_JOB_STATES)}"
        )

    async def _wait_job(self, job: Element, state: str, timeout: Optional[float]) -> None:
        """Until the job has been in ``state``: its jobState for the protocol's four, else its jobStatus."""
        if state in PROTOCOL_JOB_STATES:
            await self._wait_job_state(job, state, timeout)
            return
        seen = self.statuses.setdefault(job.id, [])
        current = job.get("jobStatus")
        if isinstance(current, str) and current not in seen:
            seen.append(current)

        def reached() -> bool:
            # The mirror may be ahead of the events shown so far (several came in one read):
            # its current status counts as seen.
            status = job.get("jobStatus")
            if state in (s.upper() for s in seen) or (isinstance(status, str) and status.upper() == state):
                return True
            # An agent may send the final status in the event after jobState COMPLETED.
            ended = job.state == "COMPLETED" and isinstance(status, str) and status.upper() in FINAL_STATUSES
            if job.removed or ended:
                went = " -> ".join(seen + ([status] if status and (not seen or seen[-1] != status) else [])) or "no status"
                raise CommandError(f"job {self._label(job)} ended without reaching {state} (went {went})")
            if state not in WAITING_STATUSES:
                self._check_startable(job, state)
            return False

        await self.client.wait_for(
            reached, timeout, description=lambda: f"job {self._label(job)} to reach {state} (now {job.get('jobStatus')})")
