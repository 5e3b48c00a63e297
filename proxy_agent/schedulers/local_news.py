"""What the local backend makes of the keeper's news: processes spawned, exited, stopped,
resumed, their output written; the jobs' states and ends in the model."""

from __future__ import annotations

import logging
from typing import List

import trio

from ..service.model import K
from .common import signal_name, state_attrs
from .local_records import LocalJob, READ_CHUNK, RUNNING_ATTRS, STATE_TABLE, job_end_status

log = logging.getLogger("proxy_agent.schedulers.local")


class KeeperNews:
    """How the local backend takes the keeper's messages."""

    # ------------------------------------------------------------------ the keeper's news

    def _notices(self, messages: List[dict]) -> None:
        """A round of the keeper's news, in as few changes of the model as keep every state
        a job passes through visible: the queue's figures are written once per change, and
        clients hear of it in one go.  A change ends before news of a job that started in
        it (its RUNNING is not to be lost in its end).  The PIDs of the jobs started in the
        round go first, in a change of their own (every process's differs; their RUNNING,
        the same for all, then goes in one range)."""
        model = self.model
        messages = self._withhold(messages)
        with model.batch():
            for message in messages:
                if message.get("op") == "spawned":
                    self._set_pids(message)
        changes: List[List[dict]] = [[]]
        started: set = set()
        for message in messages:
            op, key = message.get("op"), message.get("key")
            if key in started and op != "output":
                changes.append([])
                started = set()
            changes[-1].append(message)
            if op == "spawned":
                started.add(key)
        for change in changes:
            with model.batch():
                for message in change:
                    self._notice(message)

    def _withhold(self, messages: List[dict]) -> List[dict]:
        """The news of jobs whose submission has not been answered yet waits until it has
        been (see :meth:`submit`): a client first hears of a job as the keeper recorded it,
        then of its start and end, as when the answer came before the keeper's."""
        kept = None
        for index, message in enumerate(messages):
            key = message.get("key")
            record = self._jobs.get(key) if isinstance(key, int) else None
            if record is not None and record.waiting is not None and message.get("op") != "recorded" \
                    and not (message.get("op") == "failed" and message.get("refused")):
                if kept is None:
                    kept = messages[:index]
                record.waiting.append(message)
                record.recorded.set()  # news of it: the keeper has it (a keeper from before
                #                        "recorded" existed says "spawned" first)
            elif kept is not None:
                kept.append(message)
        return messages if kept is None else kept

    def _answered(self, record: LocalJob) -> None:
        """A submission has been answered: its job's news that waited goes to the model, once
        the client has been told of the job.  News that comes meanwhile waits with it, so
        that the model hears all of it in the keeper's order (a process's exit never before
        the news that its output file grew: the output would be read as empty)."""
        if not record.waiting:
            record.waiting = None
            return

        async def hear() -> None:
            await trio.lowlevel.checkpoint()
            waiting, record.waiting = record.waiting, None
            if waiting:
                self._notices(waiting)

        self._spawn_soon(hear)

    def _set_pids(self, message: dict) -> None:
        key = message.get("key")
        record = self._jobs.get(key) if isinstance(key, int) else None
        if record is not None and not record.started:
            record.pids = [int(p) for p in message.get("pids", [])]
            model = self.model
            for index, pid in enumerate(record.pids):
                model.update(record.process_keys[index], {K.PID: str(pid)})

    def _notice(self, message: dict) -> None:
        op = message.get("op")
        key = message.get("key")
        record = self._jobs.get(key) if isinstance(key, int) else None
        if op == "recorded":
            for key in message.get("keys", ()):
                recorded = self._jobs.get(key) if isinstance(key, int) else None
                if recorded is not None:
                    recorded.recorded.set()
        elif op == "spawned" and record is not None:
            record.pids = [int(p) for p in message.get("pids", [])]
            record.started = True
            record.recorded.set()
            model = self.model
            with model.batch():
                for index, pid in enumerate(record.pids):
                    model.update(record.process_keys[index], {K.PID: str(pid)})
            with model.batch():
                live = [p for i, p in enumerate(record.process_keys) if not record.reported[i]]
                model.update_many(live, RUNNING_ATTRS)
                # the job's own id on this host, its process group (led by process 0), comes
                # with its RUNNING: one change of the job
                model.update(record.key, {**RUNNING_ATTRS, K.NATIVE_ID: str(record.pids[0])} if record.pids else RUNNING_ATTRS)
            if record.canceled:  # terminated while its processes were being started
                self._spawn_soon(self._signal, record, "terminate")
        elif op == "failed" and record is not None:
            if message.get("refused") and not record.recorded.is_set():
                record.refused = message.get("error") or "the keeper could not record the job"
                record.recorded.set()
                return
            record.start_error = message.get("error") or "the processes could not be started"
            record.recorded.set()
            if not message.get("started"):
                record.done = True
                self._settle(record)
        elif op == "output" and record is not None:
            rank, stream = int(message["rank"]), message["stream"]
            file = record.files.get((rank, stream))
            if file is not None:
                file.size = max(file.size, int(message.get("size", 0)))
                self._mark(record.key, rank, stream)
        elif op == "exit" and record is not None:
            rank = int(message["rank"])
            if 0 <= rank < len(record.codes):
                if message.get("code") is None:
                    record.lost[rank] = message.get("lost") or "its exit status is not known"
                    self._settle(record)
                else:
                    record.codes[rank] = int(message["code"])
                    self._settle(record)
        elif op == "done" and record is not None:
            record.done = True
            if message.get("error"):
                record.error = message["error"]
            self._settle(record)
        elif op == "dropped" and record is not None:
            self._take_dropped(record, {f"{message['rank']}.{message['stream']}":
                                        [message.get("bytes", 0), message.get("lines", 0), message.get("at", 0)]})
        elif op == "error":
            log.warning("the keeper refused a request: %s", message.get("error"))

    def _settle(self, record: LocalJob) -> None:
        """Report what has ended: each process whose status is known (after reading its
        output to the end), then the job once the keeper says all have ended."""
        # While the agent ends, output stays in the files for the next agent to deliver.
        read = not self._closing
        for rank, code in enumerate(record.codes):
            if (code is None and rank not in record.lost) or record.reported[rank]:
                continue
            if read:
                for stream in ("stdout", "stderr"):
                    self._read(record, rank, stream, READ_CHUNK, final=True)
            self._report_process(record, rank)
        if record.done and not record.finished.is_set():
            for rank in range(len(record.codes)):
                if not record.reported[rank]:
                    if read:
                        for stream in ("stdout", "stderr"):
                            self._read(record, rank, stream, READ_CHUNK, final=True)
                    self._report_process(record, rank)
            self._finish(record)

    def _report_process(self, record: LocalJob, rank: int) -> None:
        if record.reported[rank]:
            return
        record.reported[rank] = True
        code = record.codes[rank]
        process = record.process_keys[rank]
        if code is None and rank in record.lost:
            self.model.update(process, state_attrs(STATE_TABLE, "LOST"))
            return
        if code is None:  # never started
            native = "TERMINATED" if record.canceled else "NOT_STARTED"
            self.model.update(process, state_attrs(STATE_TABLE, native))
            return
        if record.canceled:
            native = "TERMINATED"
        else:
            native = "EXITED" if code == 0 else "FAILED"
        attrs_ = state_attrs(STATE_TABLE, native)
        if code >= 0:
            attrs_[K.EXIT_CODE] = str(code)
        else:
            attrs_[K.SIGNAL] = signal_name(-code)
        self.model.update(process, attrs_)

    def _finish(self, record: LocalJob) -> None:
        with self.model.batch():
            for rank in range(len(record.codes)):
                self._report_process(record, rank)
            self._complete_job(record)
        self._jobs.pop(record.key, None)
        for file in record.files.values():
            file.close()
        record.finished.set()

    def _complete_job(self, record: LocalJob) -> None:
        if record.key not in self.model:
            return
        if record.canceled and record.error is None:
            attrs_ = state_attrs(STATE_TABLE, "TERMINATED")
        elif record.error is not None:
            # the keeper says why the job ended so (a keeper that died while starting it...)
            attrs_ = state_attrs(STATE_TABLE, "LOST")
            attrs_[K.MESSAGE] = record.error
        elif record.start_error is not None:
            attrs_ = state_attrs(STATE_TABLE, "NOT_STARTED")
            attrs_[K.MESSAGE] = record.start_error
        else:
            failed = [(i, rc) for i, rc in enumerate(record.codes) if rc != 0]
            if failed:
                index, returncode = failed[0]
                attrs_ = state_attrs(STATE_TABLE, "FAILED")
                if returncode is None:
                    why = f"process {index} was not started"
                elif returncode > 0:
                    why = f"process {index} exited with code {returncode}"
                else:
                    why = f"process {index} was killed by {signal_name(-returncode)}"
                if len(failed) > 1:
                    why += f" ({len(failed)} processes failed)"
                attrs_[K.MESSAGE] = why
                attrs_.update(job_end_status(record.codes))
            else:
                attrs_ = state_attrs(STATE_TABLE, "EXITED")
                attrs_[K.EXIT_CODE] = "0"
        self.model.update(record.key, attrs_)
