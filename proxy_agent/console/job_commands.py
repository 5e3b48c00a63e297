"""The console's commands that act on jobs: submit, cosubmit, coadd, terminate, hold,
release, suspend, resume, change, move."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence


from ..protocol.attributes import STANDARD_ATTRIBUTES
from . import render
from .language import (
    ATTRIBUTE_ARG, CommandError, HOLD_ATTRIBUTES, SPECS, SUSPEND_ATTRIBUTES, nearest, parse_submit, seconds_arg,
)
from .outcome import exit_numbers, exit_status, job_failed

class JobCommands:
    """The job commands of a :class:`~.commands.Console`."""

    def _unknown_attributes(self, keys: Iterable[str]) -> List[str]:
        """Warnings for job attributes no definition names, each with the nearest known name."""
        known = list(self.client.attr_defs) or [d.id for d in STANDARD_ATTRIBUTES]
        known_set = set(known)
        warnings = []
        for key in keys:
            if key in known_set:
                continue
            guess = nearest(key, known)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            warnings.append(f"submit: unknown job attribute {key!r}{hint}; sent as given")
        return warnings

    async def cmd_submit(self, args: List[str]) -> None:
        request = parse_submit(args)
        client = self.client
        warnings = self._unknown_attributes(request.attributes)
        for text in warnings:
            self.warning(text)
        extra: Dict[str, Any] = {"warnings": warnings} if warnings else {}
        kwargs = dict(
            count=request.count,
            env=request.env or None,
            cwd=request.cwd,
            queue=request.queue,
            sub_id=request.sub_id,
            **request.attributes,
        )
        if not client.events_started:
            sub_id = await client.submit_nowait(request.executable, request.args, **kwargs)
            self.result("submit", [f"submitted {sub_id}; events are stopped, its job id arrives with 'start'"], sub_id=sub_id, **extra)
            if request.wait:
                raise CommandError("cannot wait for a job while events are stopped")
            return
        job_id = await client.submit(request.executable, request.args, **kwargs)
        job = client.job(job_id)
        self.last_job = job.id
        if job.get("brokerReason"):
            # a broker chose the queue: say where and why
            extra.update(queue=job.get("brokerQueue"), broker_reason=job.get("brokerReason"))
        if not request.wait:
            line = f"submitted job {self._label(job)} ({job.sub_id})"
            if job.get("brokerReason"):
                line += f" to {job.get('brokerQueue')} ({job.get('brokerReason')})"
            self.result("submit", [line], job=self._id_value(job), sub_id=job.sub_id, **extra)
            return
        if not self.json:
            self.out.line(f"submitted job {self._label(job)} ({job.sub_id}), waiting for it to end")
        await self._follow(job, self._wait_timeout(request.timeout))
        failed = job_failed(client, job)
        numbers, signals = exit_numbers(client, job)
        stdout, stderr = job.text("stdout"), job.text("stderr")
        if self.json:
            kept = await self._kept_or_none(job)
            if kept is not None:  # all of it, also what this session did not see live
                stdout, stderr = kept.text("stdout"), kept.text("stderr")
        fields = dict(
            job=self._id_value(job),
            sub_id=job.sub_id,
            state=job.state,
            status=job.get("jobStatus"),
            exit_codes=numbers,
            signals=signals,
            stdout=stdout,
            stderr=stderr,
            failed=failed,
            **extra,
        )
        if failed:
            if not self.json:
                self.out.line(self._job_end_line(job))
            raise CommandError(f"job {self._label(job)} did not succeed: {self._job_end_line(job)}",
                               exit_status=exit_status(client, job), **fields)
        self.result("submit", [self._job_end_line(job)], **fields)

    @staticmethod
    def _read_description(path: str, command: str) -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{command}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None

    async def cmd_cosubmit(self, args: List[str]) -> None:
        path: Optional[str] = None
        name: Optional[str] = None
        wait = True
        timeout: Optional[float] = None
        words = list(args)
        while words:
            word = words.pop(0)
            if word == "--no-wait":
                wait = False
            elif word in ("--name", "-t", "--timeout"):
                if not words:
                    raise CommandError(f"cosubmit: {word} needs a value")
                value = words.pop(0)
                if word == "--name":
                    name = value
                else:
                    timeout = seconds_arg(value, "cosubmit --timeout")
            elif word.startswith("-") and word != "-":
                raise CommandError(f"cosubmit: unknown option {word!r} (see 'help cosubmit')")
            elif path is None:
                path = word
            else:
                raise CommandError(f"usage: {SPECS['cosubmit'].usage}")
        if path is None:
            raise CommandError(f"usage: {SPECS['cosubmit'].usage}")
        client = self.client
        if not client.events_started:
            raise CommandError("cosubmit: events are stopped ('start' them first)")
        job_id = await client.cosubmit(self._read_description(path, "cosubmit"), name=name)
        job = client.job(job_id)
        self.last_job = job.id
        parts = client.parts_of(job)
        line = f"submitted multi-part job {self._label(job)} ({job.get('coallocId')}): parts " + (
            ", ".join(self._label(part) for part in parts) or "none")
        if not wait:
            self.result("cosubmit", [line], job=self._id_value(job), parts=[self._id_value(p) for p in parts])
            return
        if not self.json:
            self.out.line(line + "; waiting for it to end")

        def over() -> bool:
            for part in client.parts_of(job):
                if part.id not in self._followed:
                    self._followed.add(part.id)
                    self._flush_output(part.id)
            return job.state == "COMPLETED" and all(p.state == "COMPLETED" for p in client.parts_of(job))

        try:
            await client.wait_for(over, self._wait_timeout(timeout),
                                  description=lambda: f"multi-part job {self._label(job)} to end (now {job.state})")
        finally:
            parts = client.parts_of(job)
            self._followed.difference_update(p.id for p in parts)
        status = job.get("jobStatus")
        state = client.state
        summary = [render.element_summary(job, state=state)] + [
            f"  part {p.get('coallocPart')}: {render.element_summary(p, state=state)}" for p in parts]
        fields = dict(
            job=self._id_value(job),
            status=status,
            reason=job.get("jobStatusMessage"),
            parts=[{"job": self._id_value(p), "part": p.get("coallocPart"), "status": p.get("jobStatus"),
                    "stdout": p.text("stdout"), "stderr": p.text("stderr")} for p in parts],
        )
        if status != "FINISHED":
            if not self.json:
                self.out.lines(summary)
            # the parts that failed say why (the others were cancelled because of them)
            failed = [part for part in parts if part.get("jobStatus") == "FAILED"] or parts
            worst = max([exit_status(client, part) for part in failed] + [1])
            raise CommandError(f"multi-part job {self._label(job)} did not succeed: {status}: "
                               f"{job.get('jobStatusMessage') or ''}", exit_status=worst, **fields)
        self.result("cosubmit", summary, **fields)

    async def cmd_coadd(self, args: List[str]) -> None:
        if len(args) != 2:
            raise CommandError(f"usage: {SPECS['coadd'].usage}")
        job = self._job_ref(args[0])
        part = await self.client.add_part(job, self._read_description(args[1], "coadd"))
        self.result("coadd", [f"added part job {self._label(part)} to multi-part job {self._label(job)}"],
                    job=self._id_value(job), part=self._id_value(part))

    async def cmd_terminate(self, args: List[str]) -> None:
        job = self._job_ref(self._one_arg("terminate", args))
        await self.client.terminate(job)
        self.result("terminate", [f"terminate job {self._label(job)}: OK"], job=self._id_value(job))

    def _change_attribute(self, candidates: Sequence[str]) -> str:
        defs = self.client.attr_defs
        for key in candidates:
            if key in defs:
                return key
        for key in defs:
            if any(key.lower() == c.lower() for c in candidates):
                return key
        return candidates[0]

    async def _change(self, name: str, args: List[str], candidates: Sequence[str], value: str) -> None:
        job = self._job_ref(self._one_arg(name, args))
        key = self._change_attribute(candidates)
        await self.client.change_job(job, **{key: value})
        self.result(name, [f"{name} job {self._label(job)}: OK"], job=self._id_value(job), attribute=key, value=value)

    async def cmd_hold(self, args: List[str]) -> None:
        await self._change("hold", args, HOLD_ATTRIBUTES, "true")

    async def cmd_release(self, args: List[str]) -> None:
        await self._change("release", args, HOLD_ATTRIBUTES, "false")

    async def cmd_suspend(self, args: List[str]) -> None:
        await self._change("suspend", args, SUSPEND_ATTRIBUTES, "true")

    async def cmd_resume(self, args: List[str]) -> None:
        await self._change("resume", args, SUSPEND_ATTRIBUTES, "false")

    async def cmd_change(self, args: List[str]) -> None:
        if len(args) < 2 or not all(ATTRIBUTE_ARG.match(a) for a in args[1:]):
            raise CommandError(f"usage: {SPECS['change'].usage}")
        job = self._job_ref(args[0])
        attributes: Dict[str, Any] = {}
        for arg in args[1:]:
            key, _, value = arg.partition("=")
            previous = attributes.get(key)
            attributes[key] = value if previous is None else (previous if isinstance(previous, list) else [previous]) + [value]
        await self.client.change_job(job, **attributes)
        self.result("change", [f"change job {self._label(job)}: OK"], job=self._id_value(job))

    async def cmd_move(self, args: List[str]) -> None:
        if len(args) != 2:
            raise CommandError(f"usage: {SPECS['move'].usage}")
        job = self._job_ref(args[0])
        await self.client.move_job(job, args[1])
        self.result("move", [f"move job {self._label(job)} to {args[1]}: OK"], job=self._id_value(job), queue=args[1])
