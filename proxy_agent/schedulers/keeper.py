"""The keeper: runs the local scheduler's jobs so that they outlive the agent.

One keeper per state directory, started by the agent when it first needs one and detached
from it (its own session), so that an agent that dies, is killed or loses its terminal takes
no job with it.  It is a plain standard-library program (no trio: it starts in a few tens of
milliseconds) run as ``python -m proxy_agent.schedulers.keeper DIRECTORY``.  That command
starts the keeper's *custodian* (:mod:`.custodian`), which runs the keeper as its child and
starts another one when a keeper dies: the new keeper takes the running jobs back, with
their output and exit statuses (see :mod:`.custodian` for how).

What it does, for every job:

* records the job in its journal, synced to the disk, before any of its processes starts
  (the agent accepts a job only once it is recorded there);
* starts the job's processes (one process group, led by process 0; stdin ``/dev/null``;
  stdout and stderr on pipes) with the environment, directory and arguments the agent gives,
  and hands the custodian the pipes' read ends and the pids;
* copies each process's output into files, ``jobs/KEY/RANK.out`` and ``RANK.err`` (made when
  the first output comes: a stream that wrote nothing has no file), which the
  agent reads and a later agent can read again from where delivery stopped.  While an agent
  is connected, a file may run at most :data:`AHEAD` bytes ahead of what the agent has read:
  beyond that the keeper stops reading the pipe and the process's writes wait, as on a
  terminal.  With no agent connected the limit is :data:`AHEAD_DETACHED`.  Output the disk
  has no room for is dropped and counted (the agent tells the client how much), and the job
  runs on; while the disk is full, new jobs are refused;
* reaps the processes, and once a process has exited and its pipes are closed, records its
  status; once every process of the job has, it ends whatever the job left running (its
  process group, and processes that left it: the keeper is their child subreaper, see
  :mod:`.reaper`) and journals the job's end;
* signals jobs on request (terminate: SIGTERM, then SIGKILL after a grace period; suspend and
  resume: SIGSTOP and SIGCONT).

The agent talks to it over ``keeper.sock`` in the directory, one JSON object per line; see
:data:`REQUESTS`.  The keeper leaves by itself once no agent has been connected and no job
has been running for :data:`IDLE_EXIT` seconds.
"""

from __future__ import annotations

import errno
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from .custodian import FDS_PER_MESSAGE, CustodianLink, custodian_main, marker_of, say
from .reaper import MARKER, OrphanReaper, set_name
from ..service.journal import JOURNAL, compact_journal, journal_line, read_journal

#: JSON without spaces, by one encoder (``json.dumps`` with separators makes one a call)
_compact = json.JSONEncoder(separators=(",", ":")).encode

#: How far (bytes) an output file may run ahead of what the connected agent has read.
AHEAD = 8 << 20
#: The same while no agent is connected.
AHEAD_DETACHED = 256 << 20
#: Seconds without an agent and without jobs after which the keeper leaves.
IDLE_EXIT = 30.0
#: Seconds a process's pipes may stay open after it exited before it counts as ended anyway.
EOF_GRACE = 0.5
_READ = 1 << 16
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
#: Free bytes the state directory's disk must have for a new job to be accepted.
MIN_FREE = 1 << 20
#: Seconds after the disk refused output during which new jobs are refused (for a quota,
#: which the free space does not show).
_FULL_MEMORY = 5.0
#: Errors of a write that mean the disk has no room (the data is dropped and counted).
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: Move output from pipe to file in the kernel where it can (no copy, and a keeper killed
#: in between cannot have taken bytes out of the pipe without writing them).
_SPLICE = hasattr(os, "splice")


class _Process:
    __slots__ = ("rank", "pid", "popen", "fds", "code", "exited_at", "reported", "lost")

    def __init__(self, rank: int, pid: int, popen: Optional[subprocess.Popen], fds: Dict[str, int]) -> None:
        self.rank = rank
        self.pid = pid
        #: the Popen object when the process was started through subprocess, else None
        self.popen = popen
        #: stream -> read end of its pipe, while open
        self.fds = fds
        self.code: Optional[int] = None
        self.exited_at: Optional[float] = None
        self.reported = False
        #: why its exit status is not known (it ended with the keeper that ran it), else None
        self.lost: Optional[str] = None


class _Job:
    __slots__ = ("key", "dir", "processes", "files", "sizes", "read", "notified", "pgid", "done",
                 "kill_at", "started", "ended", "stopped", "adopted", "dropped", "error")

    def __init__(self, key: int, directory: str) -> None:
        self.key = key
        self.dir = directory
        self.processes: List[_Process] = []
        #: (rank, stream) -> write fd of its file
        self.files: Dict[Tuple[int, str], int] = {}
        self.sizes: Dict[Tuple[int, str], int] = {}
        #: what the agent has read of each file
        self.read: Dict[Tuple[int, str], int] = {}
        #: files the agent has been told about and not read since
        self.notified: set = set()
        self.pgid: Optional[int] = None
        self.done = False
        self.kill_at: Optional[float] = None
        self.started = time.time()
        self.ended: Optional[float] = None
        self.stopped = False
        #: taken back from an earlier keeper: its files are appended to, never truncated
        self.adopted = False
        #: output the disk had no room for: (rank, stream) -> [bytes, lines, offset of the gap]
        self.dropped: Dict[Tuple[int, str], List[int]] = {}
        #: why the job ended as it did, when not by itself (a keeper that died while starting it)
        self.error: Optional[str] = None


class Keeper:
    """The keeper (see the module documentation).  ``custodian``: the link to the custodian
    that started it, if one did (``instance``: the custodian's job marker)."""

    def __init__(self, directory: str, custodian: Optional[CustodianLink] = None,
                 instance: Optional[str] = None) -> None:
        # absolute: the keeper changes its working directory to start a job in the job's
        self.dir = os.path.abspath(directory)
        self.jobs_dir = os.path.join(self.dir, "jobs")
        try:  # where the keeper returns after starting a process elsewhere
            self.home = os.getcwd()
        except OSError:
            self.home = "/"
            os.chdir("/")
        os.makedirs(self.jobs_dir, mode=0o700, exist_ok=True)
        self.selector = selectors.DefaultSelector()
        self.jobs: Dict[int, _Job] = {}
        #: the jobs not done yet: what the loop's timers and the orphan sweep look at
        self.live: Dict[int, _Job] = {}
        #: a job ended since the last sweep for orphans
        self.sweep_due = False
        #: stdin of every job process (kept open; close-on-exec like every fd of the keeper)
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        #: the journal (see :func:`read_journal`), made compact once at start
        self.journal_path = os.path.join(self.dir, JOURNAL)
        on_disk = compact_journal(self.journal_path)
        #: keys that may have a directory or a journal entry from an earlier job
        self.seen = set(on_disk)
        try:
            self.seen.update(int(name) for name in os.listdir(self.jobs_dir) if name.isdigit())
        except OSError:
            pass
        self.journal = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        #: entries to append, written at the end of the round before any message that tells of them
        self.journal_pending: List[bytes] = []
        self.by_pid: Dict[int, Tuple[_Job, _Process]] = {}
        self.by_fd: Dict[int, Tuple[_Job, _Process, str]] = {}
        self.paused: set = set()
        self.agent: Optional[socket.socket] = None
        self.inbox = b""
        self.outbox = bytearray()
        self.idle_since = time.monotonic()
        self.closing = False
        #: remove the directory when leaving (it was a temporary one)
        self.remove_on_exit = False
        self.reaper = OrphanReaper(instance)
        #: the custodian (None: the keeper runs alone, or its custodian is gone)
        self.custodian = custodian
        #: news for the custodian, sent at the end of the round: statuses reaped, jobs ended
        self.reaped: Dict[str, int] = {}
        self.released: List[int] = []
        #: the pids of jobs just started: key -> pids by rank (see _tell_pids)
        self.pids_untold: Dict[str, List[int]] = {}
        #: files whose dropped output the agent has not been told of yet
        self.drops_untold: Dict[Tuple[int, Tuple[int, str]], None] = {}
        #: when the disk last had no room for output or the journal (new jobs are refused for a while)
        self.disk_full_at: Optional[float] = None
        #: a drop of output was written to the keeper's log (once per keeper)
        self.drop_logged = False
        #: jobs just recorded in the journal, to tell the agent before they start
        self.recorded: List[int] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        if custodian is not None:
            self._take_back(on_disk, custodian)
            self.selector.register(custodian.sock, selectors.EVENT_READ, ("custodian", None))
        else:
            self._take_back(on_disk, None)
        self.listener = self._listen()

    # ------------------------------------------------------------------ set-up

    def _take_back(self, on_disk: Dict[int, dict], custodian: Optional[CustodianLink]) -> None:
        """The jobs an earlier keeper started and did not see end (journaled as started, not
        as done): taken back, with the pipes, pids and statuses the custodian holds, and run
        on; or, what cannot be taken back, ended, saying why."""
        held: Dict[int, Dict[int, list]] = {}
        strays: Dict[int, List[int]] = {}
        if custodian is not None:
            held, strays = _hand_over(custodian)
        unfinished = {key: entry for key, entry in on_disk.items() if not entry.get("done")}
        for key in [key for key in held if key not in unfinished]:
            for _pid, _code, fds in held.pop(key).values():  # ended (or forgotten) meanwhile
                for fd in fds.values():
                    os.close(fd)
            self.released.append(key)
        now = time.monotonic()
        for key, entry in unfinished.items():
            job = _Job(key, os.path.join(self.jobs_dir, str(key)))
            job.adopted = True
            job.started = float(entry.get("started") or time.time())
            self.jobs[key] = job
            mark = f"{entry.get('mark', '')}/{key}"
            procs = held.get(key)
            ours = custodian is not None and entry.get("mark") == self.reaper.instance
            if not procs and ours and not strays.get(key) and isinstance(entry.get("request"), dict):
                # recorded, and nothing of it was handed to the custodian, which happens
                # before any process starts: it never started.  It starts now.
                del self.jobs[key]
                request = entry["request"]
                try:
                    self._spawn(int(request["key"]), request["argv"], request["env"], request["cwd"],
                                int(request["count"]))
                except (KeyError, TypeError, ValueError) as exc:
                    job = self.jobs[key] = job
                    self._end_untaken(job, mark, [], f"its request could not be read back ({exc})")
                continue
            if not procs or any(not pid for pid, _code, _fds in procs.values()):
                for pid, _code, fds in (procs or {}).values():
                    for fd in fds.values():
                        os.close(fd)
                if procs:
                    self.released.append(key)
                started = [pid for pid, _code, _fds in (procs or {}).values() if pid]
                self._end_untaken(job, mark, strays.get(key, []) + started,
                                  "the keeper ended while it was starting the job's processes, so how far it ran is "
                                  "not known; it is not started again" if ours else
                                  "the keeper and the custodian that ran the job both ended (killed, or the machine "
                                  "went down), so it could not be taken back and its end is not known")
                continue
            self.live[key] = job
            for rank in range(max(procs) + 1):
                pid, code, fds = procs.get(rank, [0, None, {}])
                process = _Process(rank, pid, None, fds)
                job.processes.append(process)
                for stream in ("stdout", "stderr"):
                    path = os.path.join(job.dir, f"{rank}.{'out' if stream == 'stdout' else 'err'}")
                    try:
                        job.sizes[(rank, stream)] = os.stat(path).st_size
                    except OSError:
                        job.sizes[(rank, stream)] = 0
                for stream, fd in fds.items():
                    os.set_blocking(fd, False)
                    self.by_fd[fd] = (job, process, stream)
                    self.selector.register(fd, selectors.EVENT_READ, ("pipe", None))
                if code is not None:
                    process.code, process.exited_at = int(code), now
                elif pid and marker_of(pid) == mark:
                    self.by_pid[pid] = (job, process)  # running: its end comes from the custodian
                else:
                    process.lost = "it ended while the keeper that ran it was being replaced"
                    process.exited_at = now
            job.pgid = job.processes[0].pid or None
        if strays:  # processes that left their jobs: ended with them, by the sweep
            self.sweep_due = True

    def _end_untaken(self, job: _Job, mark: str, strays: List[int], why: str) -> None:
        """A running job that cannot be taken back: ended, its processes too, saying why."""
        pids = set(strays) | set(_marked_processes(mark))
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if pids:
            why += f"; {len(pids)} of its processes still running were ended"
        job.done = True
        job.ended = time.time()
        self._write_status(job, why)

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

    def _on_signal(self, signum, frame) -> None:
        self.closing = True

    # ------------------------------------------------------------------ main loop

    def run(self) -> None:
        while True:
            timeout = self._timeout()
            for key, mask in self.selector.select(timeout):
                kind, data = key.data
                if kind == "wake":
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                elif kind == "listen":
                    self._accept()
                elif kind == "agent":
                    if key.fileobj is not self.agent:
                        continue  # dropped by an earlier event of this round (a failed write)
                    if mask & selectors.EVENT_READ:
                        self._agent_readable()
                    if mask & selectors.EVENT_WRITE and self.agent is not None:
                        self._agent_writable()
                elif kind == "pipe":
                    self._pipe_readable(key.fd)
                elif kind == "custodian":
                    self._custodian_readable()
            self._reap()
            self._timers()
            if self.sweep_due:
                self._sweep()
            if self.journal_pending:  # one write for the round's entries, before its messages
                self._write_journal()
            self._tell_custodian()  # after the journal: a job released there has its end recorded
            if self.drops_untold:
                self._tell_drops()
            if self.outbox:  # one write for every message of the round
                self._agent_writable()
            if self.closing:
                self._terminate_all(grace=0.8)
                if not self.live:
                    self._flush_agent()
                    return
            if self.agent is None and not self.live:
                if time.monotonic() - self.idle_since >= IDLE_EXIT:
                    return

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [1.0]
        for job in self.live.values():
            if job.kill_at is not None:
                deadlines.append(max(0.0, job.kill_at - now))
            for process in job.processes:
                if process.exited_at is not None and not process.reported:
                    deadlines.append(max(0.01, process.exited_at + EOF_GRACE - now))
        return min(deadlines)

    # ------------------------------------------------------------------ the agent

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

    def _record_started(self, requests: list, lines: List[bytes]) -> Dict[int, str]:
        """Journal the jobs about to start, with their requests as the agent sent them (a
        keeper that replaces one that died before it started them starts them), synced to the
        disk; the keys that could not be recorded (nothing of them runs), with why."""
        entries = []
        keys = []
        head = f'{{"started":{time.time()!r},"mark":{json.dumps(self.reaper.instance)},"key":'.encode()
        for request, line in zip(requests, lines):
            if isinstance(request, dict) and request.get("op") == "spawn":
                key = request.get("key")
                if isinstance(key, int) and key not in self.jobs and isinstance(request.get("argv"), list):
                    entries.append(b"%s%d,\"request\":%s}\n" % (head, key, line.strip()))
                    keys.append(key)
        if not entries:
            return {}
        error = self._no_room()
        if error is None and self.journal_pending:
            error = self._write_journal()  # what is pending goes first, whole
        if error is None:
            error = self._append_journal(b"".join(entries), sync=True)
        if error:
            return {key: error for key in keys}
        self.recorded = keys
        return {}

    def _no_room(self) -> Optional[str]:
        """Why a new job cannot be taken now for lack of disk space (None: it can)."""
        try:
            info = os.statvfs(self.dir)
            free = info.f_bavail * info.f_frsize
        except OSError:
            return None
        recent = self.disk_full_at is not None and time.monotonic() - self.disk_full_at < _FULL_MEMORY
        if free >= MIN_FREE and not recent:
            return None
        return (f"no space left on the disk of {self.dir} ({free // 1024} KiB free): new jobs are refused until "
                "space is freed")

    def _write_journal(self) -> Optional[str]:
        """Append what is pending to the journal (kept to try again if the disk refuses it);
        why it failed, if it did."""
        data = b"".join(self.journal_pending)
        self.journal_pending = []
        error = self._append_journal(data)
        if error is not None:
            self.journal_pending = [data]
        return error

    def _append_journal(self, data: bytes, sync: bool = False) -> Optional[str]:
        """Append whole lines to the journal (synced to the disk if ``sync``); on failure the
        journal is cut back to where it was, so that no torn line is left for the next write
        to run into.  Why it failed, if it did."""
        try:
            size = os.fstat(self.journal).st_size
        except OSError as exc:
            return f"cannot record the job in {self.journal_path}: {exc.strerror or exc}"
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.journal, view):]
            if sync:
                os.fdatasync(self.journal)
        except OSError as exc:
            try:
                os.ftruncate(self.journal, size)
            except OSError:
                pass
            if exc.errno in _NO_ROOM:
                self.disk_full_at = time.monotonic()
            return f"cannot record the job in {self.journal_path}: {exc.strerror or exc}"
        return None

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

    def _describe(self, job: _Job) -> dict:
        described = {
            "key": job.key,
            "done": job.done,
            "pids": [p.pid for p in job.processes],
            "codes": [p.code if p.reported else None for p in job.processes],
            "sizes": {f"{r}.{s}": n for (r, s), n in job.sizes.items()},
            "started": job.started,
            "ended": job.ended,
        }
        _add_troubles(described, job)
        return described

    def _ended_on_disk(self) -> List[dict]:
        """Jobs ended under an earlier keeper (in the journal, or the ``status.json`` of an
        older keeper), not in memory now."""
        found = []
        if self.journal_pending:
            self._write_journal()
        journal = read_journal(self.journal_path)
        for key, entry in journal.items():
            if key in self.jobs or entry.get("forgotten"):
                continue
            if not entry.get("done"):
                # started but never finished here (the keeper itself was killed): lost
                entry = {"key": key, "done": True, "lost": True, "codes": [], "pids": []}
            found.append(entry)
        try:
            names = os.listdir(self.jobs_dir)
        except OSError:
            return found
        for name in names:
            if not name.isdigit() or int(name) in self.jobs or int(name) in journal:
                continue
            try:
                with open(os.path.join(self.jobs_dir, name, "status.json")) as status:
                    data = json.load(status)
            except (OSError, ValueError):
                # started but never finished here (the keeper itself was killed): lost
                data = {"key": int(name), "done": True, "lost": True, "codes": [], "pids": []}
            data["done"] = True
            found.append(data)
        return found

    # ------------------------------------------------------------------ jobs

    def _spawn(self, key: int, argv: List[str], env: Dict[str, str], cwd: str, count: int) -> None:
        if key in self.jobs:
            self._send({"op": "failed", "key": key, "error": "a job with this key is already running"})
            return
        directory = os.path.join(self.jobs_dir, str(key))
        job = _Job(key, directory)
        if key in self.seen:  # an earlier job with this key, forgotten: its files go
            try:
                for name in os.listdir(directory):
                    os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._send({"op": "failed", "key": key, "error": f"cannot prepare {directory}: {exc.strerror or exc}"})
                return
        self.seen.add(key)
        self.jobs[key] = job
        self.live[key] = job
        pipes: List[Tuple[int, int, int, int]] = []
        try:
            for _rank in range(count):
                out_r, out_w = os.pipe()
                try:
                    err_r, err_w = os.pipe()
                except OSError:
                    os.close(out_r)
                    os.close(out_w)
                    raise
                pipes.append((out_r, out_w, err_r, err_w))
            # The custodian holds the pipes before anything starts: a keeper that dies from
            # here on leaves a job that may have started (see _take_back)
            self._hold(key, [(rank, 0, {"stdout": p[0], "stderr": p[2]}) for rank, p in enumerate(pipes)])
            for rank in range(count):
                self._start_process(job, rank, argv, env, cwd, count, pipes[rank])
        except OSError as exc:
            for out_r, out_w, err_r, err_w in pipes[len(job.processes):]:
                for fd in (out_r, out_w, err_r, err_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # (closed by _start_process when its start failed)
            _kill_group(job.pgid, signal.SIGKILL)  # those that did start: they end as the job fails
            self._tell_pids(job)  # (their ends are recorded like any other)
            error = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            self._send({"op": "failed", "key": key, "error": error, "started": len(job.processes)})
            if not job.processes:
                self._close_files(job)
                job.done = True
                self.live.pop(key, None)
                job.ended = time.time()
                self._write_status(job, error)
                if self.custodian is not None:
                    self.released.append(key)
            return
        self._tell_pids(job)
        self._send({"op": "spawned", "key": key, "pids": [p.pid for p in job.processes]})

    def _start_process(self, job: _Job, rank: int, argv, env, cwd, count, pipe: Tuple[int, int, int, int]) -> None:
        env = dict(env)
        env["PROXY_AGENT_PROCESS_INDEX"] = str(rank)
        env["PROXY_AGENT_NUM_PROCS"] = str(count)
        env[MARKER] = self.reaper.mark(job.key)
        out_r, out_w, err_r, err_w = pipe
        popen = None
        try:
            if _SPAWN and "/" in argv[0]:
                pid = self._posix_spawn(argv, env, cwd, out_w, err_w, job.pgid or 0)
            else:
                popen = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, cwd=cwd, env=env,
                    close_fds=True, **_group(job.pgid or 0),
                )
                pid = popen.pid
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        if job.pgid is None:
            job.pgid = pid
        process = _Process(rank, pid, popen, {"stdout": out_r, "stderr": err_r})
        job.processes.append(process)
        self.by_pid[pid] = (job, process)
        for stream, fd in process.fds.items():
            os.set_blocking(fd, False)
            job.sizes[(rank, stream)] = 0  # its file is made when output first comes
            self.by_fd[fd] = (job, process, stream)
            self.selector.register(fd, selectors.EVENT_READ, ("pipe", None))

    def _posix_spawn(self, argv: List[str], env: Dict[str, str], cwd: str, out_w: int, err_w: int,
                     pgid: int) -> int:
        """Start a process as ``subprocess.Popen`` would (the same descriptors, group, signal
        dispositions and errors), with half its CPU time: no pipe for errors, no Python code
        between fork and exec.  Every descriptor the keeper opens is close-on-exec, so the
        process inherits only its three streams.  ``posix_spawn`` has no working directory
        of its own: the keeper moves to the job's and back (it is single-threaded)."""
        moved = cwd != self.home
        if moved:
            os.chdir(cwd)
        try:
            return os.posix_spawn(
                argv[0], argv, env,
                file_actions=[(os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                              (os.POSIX_SPAWN_DUP2, err_w, 2)],
                setpgroup=pgid, setsigdef=_DEFAULT_SIGNALS,
            )
        finally:
            if moved:
                os.chdir(self.home)

    def _pipe_readable(self, fd: int) -> None:
        entry = self.by_fd.get(fd)
        if entry is None:
            return
        job, process, stream = entry
        where = (process.rank, stream)
        taken = self._take_output(job, where, fd)
        if taken is None:
            return
        if taken == 0:
            self._close_pipe(fd)
            return
        self._notify_output(job, where)
        limit = AHEAD if self.agent is not None else AHEAD_DETACHED
        if job.sizes[where] - job.read.get(where, 0) > limit:
            self.selector.unregister(fd)
            self.paused.add(fd)

    def _take_output(self, job: _Job, where: Tuple[int, str], fd: int) -> Optional[int]:
        """Move what the pipe holds into the process's file (what the disk has no room for
        is dropped and counted); the bytes taken from the pipe, 0 at its end, None if it
        holds nothing now."""
        global _SPLICE
        out = job.files.get(where)
        if _SPLICE and out is not None:
            try:
                moved = os.splice(fd, out, _READ)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EXDEV):
                    _SPLICE = False  # not for this file system: copy through the keeper instead
                elif exc.errno not in _NO_ROOM and exc.errno != errno.EIO:
                    return 0
            else:
                job.sizes[where] += moved
                return moved
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data:
            self._write_output(job, where, data)
        return len(data)

    def _write_output(self, job: _Job, where: Tuple[int, str], data: bytes) -> None:
        """Append to a process's file; what the disk does not take is dropped and counted."""
        view = memoryview(data)
        try:
            out = _output_file(job, where)
            while view:
                view = view[os.write(out, view):]
        except OSError as exc:
            job.sizes[where] += len(data) - len(view)
            self._drop(job, where, view.tobytes(), exc)
            return
        job.sizes[where] += len(data)

    def _drop(self, job: _Job, where: Tuple[int, str], data: bytes, exc: OSError) -> None:
        """Output the disk did not take: counted, with where the file stops (the gap)."""
        at = job.sizes[where]
        dropped = job.dropped.setdefault(where, [0, 0, at])
        dropped[0] += len(data)
        dropped[1] += data.count(b"\n")
        dropped[2] = at
        self.drops_untold[(job.key, where)] = None
        if exc.errno in _NO_ROOM:
            self.disk_full_at = time.monotonic()
        if not self.drop_logged:
            self.drop_logged = True
            say(f"keeper: output of job {job.key} dropped: {exc.strerror or exc}")

    def _tell_drops(self) -> None:
        """Tell the agent how much output each file has lost so far (totals, and where the
        latest loss is in the file)."""
        untold, self.drops_untold = self.drops_untold, {}
        for key, where in untold:
            job = self.jobs.get(key)
            if job is None or where not in job.dropped:
                continue
            size, lines, at = job.dropped[where]
            self._send({"op": "dropped", "key": key, "rank": where[0], "stream": where[1], "bytes": size,
                        "lines": lines, "at": at})

    def _maybe_resume(self, fd: int) -> None:
        entry = self.by_fd.get(fd)
        if entry is None:
            self.paused.discard(fd)
            return
        job, process, stream = entry
        where = (process.rank, stream)
        limit = AHEAD if self.agent is not None else AHEAD_DETACHED
        if job.sizes[where] - job.read.get(where, 0) <= limit:
            self.paused.discard(fd)
            self.selector.register(fd, selectors.EVENT_READ, ("pipe", None))

    def _notify_output(self, job: _Job, where: Tuple[int, str]) -> None:
        if self.agent is None or where in job.notified:
            return
        job.notified.add(where)
        self._send({"op": "output", "key": job.key, "rank": where[0], "stream": where[1], "size": job.sizes[where]})

    def _close_pipe(self, fd: int) -> None:
        entry = self.by_fd.pop(fd, None)
        if fd in self.paused:
            self.paused.discard(fd)
        else:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
        os.close(fd)
        if entry is not None:
            job, process, stream = entry
            process.fds.pop(stream, None)
            self._check_process(job, process)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._exited(pid, os.waitstatus_to_exitcode(status), own=True)

    def _exited(self, pid: int, code: int, own: bool) -> None:
        """A job process ended (``own``: reaped here; else the custodian reaped it)."""
        entry = self.by_pid.pop(pid, None)
        if entry is None:
            return  # an orphan a job left behind: reaped, nothing more
        job, process = entry
        process.code = code
        if process.popen is not None:
            process.popen.returncode = code
        process.exited_at = time.monotonic()
        if own and self.custodian is not None:
            self.reaped[str(pid)] = code  # so that a keeper after this one knows it too
        self._check_process(job, process)

    def _check_process(self, job: _Job, process: _Process) -> None:
        """Report a process once it has exited and its output is complete (its pipes closed),
        or once its pipes have stayed open EOF_GRACE seconds after it exited (something it
        started holds them; they are read on until the job ends)."""
        if process.reported or (process.code is None and process.lost is None):
            return
        if process.fds and time.monotonic() - (process.exited_at or 0) < EOF_GRACE:
            return
        process.reported = True
        if process.lost is not None:
            self._send({"op": "exit", "key": job.key, "rank": process.rank, "code": None, "lost": process.lost})
        else:
            self._send({"op": "exit", "key": job.key, "rank": process.rank, "code": process.code})
        if all(p.reported for p in job.processes):
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        _kill_group(job.pgid, signal.SIGKILL)  # whatever the job left in its group
        self.live.pop(job.key, None)
        # what left the group is ended by the sweep at the end of this round (one look at
        # the keeper's children for every job that ended in the round)
        self.sweep_due = True
        for process in job.processes:  # what is still in pipes held by the ended leftovers
            for fd in list(process.fds.values()):
                self._drain_and_close(fd)
        job.done = True
        job.ended = time.time()
        job.kill_at = None
        self._close_files(job)
        lost = [p.rank for p in job.processes if p.lost is not None]
        if lost and job.error is None:
            job.error = (f"the exit status of process{'es' if len(lost) > 1 else ''} "
                         f"{', '.join(map(str, lost))} is not known: {job.processes[lost[0]].lost}")
        self._write_status(job)
        if self.custodian is not None:
            self.released.append(job.key)
        done = {"op": "done", "key": job.key}
        if job.error is not None:
            done["error"] = job.error
        self._send(done)
        self.idle_since = time.monotonic()

    def _sweep(self) -> None:
        """End the orphans of the jobs that have ended (see :mod:`.reaper`): the keeper's
        children, and the custodian's (those of jobs taken back from an earlier keeper)."""
        self.sweep_due = False
        # by_pid holds exactly the started processes not reaped yet
        alive = {str(key) for key in self.live}
        self.reaper.sweep(self.by_pid.keys(), alive.__contains__)
        if self.custodian is not None:
            self.custodian.send({"op": "sweep", "alive": list(self.live)})

    # ------------------------------------------------------------------ the custodian

    def _hold(self, key: int, procs: List[Tuple[int, int, Dict[str, int]]]) -> None:
        """Hand the custodian the read ends of a job's pipes: (rank, pid (0: not started
        yet), {stream: fd}) (see :mod:`.custodian`)."""
        custodian = self.custodian
        if custodian is None or not procs:
            return
        batch: List[list] = []
        fds: List[int] = []
        delivered = True
        # the pids of the jobs started since the last message go with it (one message a job)
        started, self.pids_untold = self.pids_untold, {}
        for rank, pid, streams in procs:
            if batch and len(fds) + len(streams) > FDS_PER_MESSAGE:
                delivered = custodian.deliver({"op": "hold", "key": key, "procs": batch, "started": started},
                                              fds) and delivered
                batch, fds, started = [], [], {}
            batch.append([rank, pid, list(streams)])
            fds.extend(streams.values())
        # with the custodian before the processes start (else a job the keeper dies starting
        # would look as if it had never started, and be started again)
        if not (custodian.deliver({"op": "hold", "key": key, "procs": batch, "started": started}, fds)
                and delivered):
            self._custodian_gone()

    def _tell_pids(self, job: _Job) -> None:
        """The custodian learns the pids of a job's processes once they have started: with
        the next job's pipes, or at the end of the round."""
        if self.custodian is not None and job.processes:
            self.pids_untold[str(job.key)] = [p.pid for p in job.processes]

    def _tell_custodian(self) -> None:
        custodian = self.custodian
        if custodian is None:
            return
        if self.pids_untold:
            custodian.send({"op": "pids", "started": self.pids_untold})
            self.pids_untold = {}
        if self.reaped:
            custodian.send({"op": "reaped", "codes": self.reaped})
            self.reaped = {}
        if self.released:
            custodian.send({"op": "release", "keys": self.released})
            self.released = []
        if custodian.outbox:
            custodian.flush()
        if custodian.closed:
            self._custodian_gone()

    def _custodian_readable(self) -> None:
        custodian = self.custodian
        while custodian is not None and not custodian.closed:
            got = custodian.receive()
            if got is None:
                return
            message, fds = got
            for fd in fds:
                os.close(fd)
            if message.get("op") == "exited":
                self._exited(int(message["pid"]), int(message["code"]), own=False)
        self._custodian_gone()

    def _custodian_gone(self) -> None:
        custodian, self.custodian = self.custodian, None
        if custodian is None:
            return
        try:
            self.selector.unregister(custodian.sock)
        except (KeyError, ValueError):
            pass
        custodian.close()
        say("keeper: the custodian is gone; the jobs run on, but if this keeper ends, its running jobs cannot be "
            "taken back")

    def _drain_and_close(self, fd: int) -> None:
        entry = self.by_fd.get(fd)
        while entry is not None:
            job, process, stream = entry
            if not self._take_output(job, (process.rank, stream), fd):
                break
            self._notify_output(job, (process.rank, stream))
        if fd in self.by_fd:
            self.by_fd.pop(fd)
            if fd in self.paused:
                self.paused.discard(fd)
            else:
                try:
                    self.selector.unregister(fd)
                except (KeyError, ValueError):
                    pass
            os.close(fd)
            if entry is not None:
                entry[1].fds.pop(entry[2], None)

    def _close_files(self, job: _Job) -> None:
        for fd in job.files.values():
            try:
                os.close(fd)
            except OSError:
                pass
        job.files = {}

    def _write_status(self, job: _Job, error: Optional[str] = None) -> None:
        status = {
            "key": job.key,
            "done": True,
            "pids": [p.pid for p in job.processes],
            "codes": [p.code for p in job.processes],
            "sizes": {f"{r}.{s}": n for (r, s), n in job.sizes.items()},
            "started": job.started,
            "ended": job.ended,
        }
        if error is not None:
            job.error = error
        _add_troubles(status, job)
        # written with the round's other entries, before the "done" that tells of it
        self.journal_pending.append(journal_line(status))

    def _forget(self, key: int) -> None:
        job = self.jobs.get(key)
        if job is not None and not job.done:
            return
        self.jobs.pop(key, None)
        self.journal_pending.append(journal_line({"key": key, "forgotten": True}))
        self._write_journal()
        directory = os.path.join(self.jobs_dir, str(key))
        try:
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            os.rmdir(directory)
        except OSError:
            pass

    # ------------------------------------------------------------------ signals

    def _signal_job(self, job: _Job, action: str, grace: float) -> None:
        if job.done:
            return
        if action == "terminate":
            _kill_group(job.pgid, signal.SIGTERM)
            _kill_group(job.pgid, signal.SIGCONT)  # a stopped job must wake to see SIGTERM
            if job.kill_at is None:
                job.kill_at = time.monotonic() + grace
        elif action == "kill":
            _kill_group(job.pgid, signal.SIGKILL)
        elif action == "suspend":
            _kill_group(job.pgid, signal.SIGSTOP)
            job.stopped = True
        elif action == "resume":
            _kill_group(job.pgid, signal.SIGCONT)
            job.stopped = False

    def _terminate_all(self, grace: float) -> None:
        for job in list(self.live.values()):
            if not job.done and job.kill_at is None:
                self._signal_job(job, "terminate", grace)

    def _timers(self) -> None:
        now = time.monotonic()
        for job in list(self.live.values()):
            if job.kill_at is not None and now >= job.kill_at and not job.done:
                _kill_group(job.pgid, signal.SIGKILL)
                job.kill_at = None
            for process in job.processes:
                if process.exited_at is not None and not process.reported and now - process.exited_at >= EOF_GRACE:
                    self._check_process(job, process)


def _output_file(job: _Job, where: Tuple[int, str]) -> int:
    """The write end of a process's output file, made (with the job's directory) when the
    first output comes: most processes of a busy host write nothing to one stream or both,
    and a job that writes nothing has no directory."""
    fd = job.files.get(where)
    if fd is None:
        rank, stream = where
        path = os.path.join(job.dir, f"{rank}.{'out' if stream == 'stdout' else 'err'}")
        # a job taken back from an earlier keeper goes on where its files end
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if job.adopted else os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            try:
                os.mkdir(job.dir, mode=0o700)
            except FileExistsError:
                pass
            fd = os.open(path, flags, 0o600)
        job.files[where] = fd
    return fd


def _add_troubles(described: dict, job: _Job) -> None:
    """What went wrong with a job, in its description or status: why it ended so, whose exit
    status is not known, how much output the disk had no room for."""
    if job.error is not None:
        described["error"] = job.error
    lost = {str(p.rank): p.lost for p in job.processes if p.lost is not None}
    if lost:
        described["lost_codes"] = lost
    if job.dropped:
        described["dropped"] = {f"{r}.{s}": list(value) for (r, s), value in job.dropped.items()}


#: Start processes with os.posix_spawn (Linux and glibc, where it reports exec errors).
_SPAWN = hasattr(os, "posix_spawn") and sys.platform.startswith("linux")
#: Signals the keeper ignores that a job starts with at their default (as Popen's restore_signals).
_DEFAULT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))


def _group(pgid: int) -> dict:
    """Popen options putting the child in process group ``pgid`` (0: a new group it leads)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover


def _kill_group(pgid: Optional[int], sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_keeper(directory: str, custodian: Optional[CustodianLink], instance: Optional[str]) -> int:
    """Run a keeper for ``directory`` until it leaves; its exit status (0: it left on
    purpose)."""
    set_name("pa-keeper")
    keeper = Keeper(directory, custodian, instance)
    try:
        keeper.run()
    finally:
        if keeper.journal_pending:
            keeper._write_journal()
        if keeper.custodian is not None:
            keeper._tell_custodian()
        try:
            os.unlink(os.path.join(keeper.dir, "keeper.sock"))
        except OSError:
            pass
        if keeper.remove_on_exit:
            import shutil

            shutil.rmtree(keeper.dir, ignore_errors=True)
    return 0


def _hand_over(custodian: CustodianLink) -> Tuple[Dict[int, Dict[int, list]], Dict[int, List[int]]]:
    """Ask the custodian for what it holds: key -> rank -> [pid, status or None, {stream:
    read end}], and its strays: key -> pids."""
    held: Dict[int, Dict[int, list]] = {}
    strays: Dict[int, List[int]] = {}
    exited: Dict[int, int] = {}
    custodian.send({"op": "handover"})
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not custodian.closed:
        custodian.flush()
        got = custodian.receive()
        if got is None:
            select.select([custodian.sock], [], [], 0.2)
            continue
        message, fds = got
        for fd in fds:
            os.set_inheritable(fd, False)
        op = message.get("op")
        if op == "held":
            at = 0
            for key, rank, pid, code, streams in message.get("procs", []):
                mine = {}
                for stream in streams:
                    mine[stream] = fds[at]
                    at += 1
                held.setdefault(int(key), {})[int(rank)] = [int(pid), code, mine]
        elif op == "strays":
            strays = {int(key): [int(pid) for pid in pids] for key, pids in message.get("strays", {}).items()}
        elif op == "exited":
            exited[int(message["pid"])] = int(message["code"])
        elif op == "handover-end":
            break
        else:
            for fd in fds:
                os.close(fd)
    for procs in held.values():
        for entry in procs.values():
            if entry[1] is None and entry[0] in exited:
                entry[1] = exited[entry[0]]
    return held, strays


def _marked_processes(mark: str) -> List[int]:
    """Processes of this user whose job marker is ``mark`` (a job's processes, wherever they
    were re-parented)."""
    found = []
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit() and int(name) != me and marker_of(int(name)) == mark:
            found.append(int(name))
    return found


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m proxy_agent.schedulers.keeper DIRECTORY", file=sys.stderr)
        return 2
    directory = args[0]
    try:
        os.setsid()
    except OSError as exc:
        if exc.errno != errno.EPERM:  # already a session leader
            raise
    _raise_file_limit()
    return custodian_main(directory, run_keeper)


def _raise_file_limit() -> None:
    """Each running job process costs the keeper up to four descriptors (two pipes, two
    files) and the custodian two: take what the system allows."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


if __name__ == "__main__":
    sys.exit(main())
