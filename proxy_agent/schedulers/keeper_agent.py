"""The keeper's side of ``keeper.sock``: the agent's connection, one JSON object per line each
way (:data:`REQUESTS`, :data:`NOTICES`), the requests carried out and the jobs described."""

from __future__ import annotations

import json
import os
import selectors
import socket
import time

from .keeper_jobs import KeptJob, add_troubles

__all__ = ["AgentConnection", "IDLE_EXIT", "NOTICES", "REQUESTS"]

#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode
#: Seconds without an agent and without jobs after which the keeper leaves.
IDLE_EXIT = 30.0
_MAX_LINE = 64 << 20

#: What the agent may ask, and what the keeper sends back.
REQUESTS = {
    "hello": "-> jobs: every job the keeper knows, running or ended, with its processes",
    "spawn": "key, argv, env, cwd, count -> spawned (pids) or failed (error)",
    "signal": "key, action (terminate|suspend|resume|kill), grace -> nothing (its effect shows in exit/done)",
    "read": "key, rank, stream, offset: the agent has read a file up to offset (flow control)",
    "forget": "key: remove the job's files (it has ended and been delivered)",
    "bye": "policy (terminate|keep): the agent is leaving; terminate ends every job now",
}
NOTICES = {
    "output": "key, rank, stream, size: a file grew (one notice until the agent reads)",
    "recorded": "keys: these jobs are in the journal, synced to the disk (sent before they start)",
    "spawned": "key, pids: the job's processes started",
    "failed": "key, error, refused (the job was not recorded: nothing ran), started (processes that did)",
    "exit": "key, rank, code (negative: the signal; null with lost: the status is not known)",
    "dropped": "key, rank, stream, bytes, lines, at: output the disk had no room for (totals), from offset at",
    "done": "key, error (why it ended so, if it did not end by itself): every process has ended, the end journaled",
    "closing": "policy: the keeper is ending every job (after bye terminate)",
}


class AgentConnection:
    """The agent's connection to the keeper: a part of :class:`~.keeper.Keeper`, whose state it
    uses."""

    def _listen(self) -> socket.socket:
        path = os.path.join(self.dir, "keeper.sock")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(4)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, ("listen", None))
        return sock


    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.agent is not None:  # a new agent replaces one that is gone without saying so
            self._drop_agent()
        conn.setblocking(False)
        self.agent = conn
        self.inbox = b""
        self.outbox = bytearray()
        self.selector.register(conn, selectors.EVENT_READ, ("agent", None))
        for job in self.jobs.values():
            job.notified.clear()

    def _drop_agent(self) -> None:
        agent = self.agent
        self.agent = None
        if agent is not None:
            try:
                self.selector.unregister(agent)
            except (KeyError, ValueError):
                pass
            agent.close()
        self.idle_since = time.monotonic()
        for fd in list(self.paused):  # the detached limit is higher: read on
            self._maybe_resume(fd)

    def _send(self, message: dict) -> None:
        """Queue a message; the loop writes everything queued in a round at the round's end."""
        if self.agent is None:
            return
        self.outbox += _compact(message).encode() + b"\n"

    def _agent_writable(self) -> None:
        if self.journal_pending:  # what a message tells of is recorded before it goes
            self._write_journal()
        agent = self.agent
        if agent is None:
            return
        while self.outbox:
            try:
                sent = agent.send(self.outbox)
            except BlockingIOError:
                break
            except OSError:
                self._drop_agent()
                return
            del self.outbox[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.outbox else 0)
        try:
            self.selector.modify(agent, events, ("agent", None))
        except (KeyError, ValueError):
            pass

    def _flush_agent(self) -> None:
        deadline = time.monotonic() + 1.0
        while self.outbox and self.agent is not None and time.monotonic() < deadline:
            self._agent_writable()
            if self.outbox:
                time.sleep(0.01)

    def _agent_readable(self) -> None:
        agent = self.agent
        if agent is None:
            return
        try:
            data = agent.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop_agent()
            return
        self.inbox += data
        if len(self.inbox) > _MAX_LINE:
            self._drop_agent()
            return
        if b"\n" not in self.inbox:
            return
        *lines, self.inbox = self.inbox.split(b"\n")
        requests = []
        for line in lines:
            try:
                requests.append(json.loads(line))
            except ValueError as exc:
                requests.append(exc)
        # Every job is in the journal before its processes start: one write for all the
        # spawn requests that came together.  The agent hears that they are recorded at once,
        # before they are started (it answers the submissions then).
        refused = self._record_started(requests, lines)
        if self.recorded:
            self._send({"op": "recorded", "keys": self.recorded})
            self.recorded = []
            self._agent_writable()
        for request in requests:
            try:
                if isinstance(request, ValueError):
                    raise request
                if refused and request.get("op") == "spawn" and request.get("key") in refused:
                    self._send({"op": "failed", "key": request["key"], "error": refused[request["key"]],
                                "refused": True})
                    continue
                self._handle(request)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._send({"op": "error", "error": f"bad request: {exc}"})

    def _handle(self, request: dict) -> None:
        op = request.get("op")
        if op == "hello":
            self._send({"op": "jobs", "jobs": [self._describe(job) for job in self.jobs.values()]
                        + self._ended_on_disk()})
        elif op == "spawn":
            self._spawn(int(request["key"]), request["argv"], request["env"], request["cwd"], int(request["count"]))
        elif op == "signal":
            job = self.jobs.get(int(request["key"]))
            if job is not None:
                self._signal_job(job, request["action"], float(request.get("grace", 2.0)))
        elif op == "read":
            job = self.jobs.get(int(request["key"]))
            if job is not None:
                where = (int(request["rank"]), request["stream"])
                job.read[where] = max(job.read.get(where, 0), int(request["offset"]))
                job.notified.discard(where)
                if job.sizes.get(where, 0) > job.read[where]:
                    self._notify_output(job, where)
                for process in job.processes:
                    fd = process.fds.get(where[1]) if process.rank == where[0] else None
                    if fd is not None and fd in self.paused:
                        self._maybe_resume(fd)
        elif op == "forget":
            self._forget(int(request["key"]))
        elif op == "bye":
            self.remove_on_exit = bool(request.get("remove"))
            if request.get("policy") == "terminate":
                # end every job; the agent stays connected to hear each end, then the keeper leaves
                self.closing = True
                self._send({"op": "closing", "policy": "terminate"})
            else:
                self._flush_agent()
                self._drop_agent()
                self.idle_since = time.monotonic() - IDLE_EXIT + 1.0  # leave soon once no job runs
        else:
            self._send({"op": "error", "error": f"unknown request {op!r}"})

    def _describe(self, job: KeptJob) -> dict:
        described = {
            "key": job.key,
            "done": job.done,
            "pids": [p.pid for p in job.processes],
            "codes": [p.code if p.reported else None for p in job.processes],
            "sizes": {f"{r}.{s}": n for (r, s), n in job.sizes.items()},
            "started": job.started,
            "ended": job.ended,
        }
        add_troubles(described, job)
        return described
