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
:data:`REQUESTS`.  Its parts: the agent's connection (:mod:`.keeper_agent`), the journal
(:mod:`.keeper_journal`), output from pipes to files (:mod:`.keeper_output`), what it knows of
each job (:mod:`.keeper_jobs`); this module supervises the processes.  The keeper leaves by
itself once no agent has been connected and no job has been running for :data:`IDLE_EXIT`
seconds.
"""

from __future__ import annotations

import errno
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
from .keeper_agent import IDLE_EXIT, NOTICES, REQUESTS, AgentConnection
from .keeper_jobs import KeptJob, KeptProcess, kill_group
from .keeper_journal import MIN_FREE, JobJournal
from .keeper_output import AHEAD, AHEAD_DETACHED, OutputCopying
from ..service.journal import JOURNAL, compact_journal

__all__ = ["AHEAD", "AHEAD_DETACHED", "EOF_GRACE", "IDLE_EXIT", "MIN_FREE", "NOTICES", "REQUESTS", "Keeper", "main",
           "run_keeper"]

#: Seconds a process's pipes may stay open after it exited before it counts as ended anyway.
EOF_GRACE = 0.5



class Keeper(AgentConnection, JobJournal, OutputCopying):
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
        self.jobs: Dict[int, KeptJob] = {}
        #: the jobs not done yet: what the loop's timers and the orphan sweep look at
        self.live: Dict[int, KeptJob] = {}
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
        self.by_pid: Dict[int, Tuple[KeptJob, KeptProcess]] = {}
        self.by_fd: Dict[int, Tuple[KeptJob, KeptProcess, str]] = {}
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
            job = KeptJob(key, os.path.join(self.jobs_dir, str(key)))
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
                process = KeptProcess(rank, pid, None, fds)
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

    def _end_untaken(self, job: KeptJob, mark: str, strays: List[int], why: str) -> None:
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

    # ------------------------------------------------------------------ jobs

    def _spawn(self, key: int, argv: List[str], env: Dict[str, str], cwd: str, count: int) -> None:
        if key in self.jobs:
            self._send({"op": "failed", "key": key, "error": "a job with this key is already running"})
            return
        directory = os.path.join(self.jobs_dir, str(key))
        job = KeptJob(key, directory)
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
            kill_group(job.pgid, signal.SIGKILL)  # those that did start: they end as the job fails
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

    def _start_process(self, job: KeptJob, rank: int, argv, env, cwd, count, pipe: Tuple[int, int, int, int]) -> None:
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
        process = KeptProcess(rank, pid, popen, {"stdout": out_r, "stderr": err_r})
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

    def _check_process(self, job: KeptJob, process: KeptProcess) -> None:
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

    def _finish(self, job: KeptJob) -> None:
        kill_group(job.pgid, signal.SIGKILL)  # whatever the job left in its group
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

    def _tell_pids(self, job: KeptJob) -> None:
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
            self._release_pipe(fd)

    def _close_files(self, job: KeptJob) -> None:
        for fd in job.files.values():
            try:
                os.close(fd)
            except OSError:
                pass
        job.files = {}

    # ------------------------------------------------------------------ signals

    def _signal_job(self, job: KeptJob, action: str, grace: float) -> None:
        if job.done:
            return
        if action == "terminate":
            kill_group(job.pgid, signal.SIGTERM)
            kill_group(job.pgid, signal.SIGCONT)  # a stopped job must wake to see SIGTERM
            if job.kill_at is None:
                job.kill_at = time.monotonic() + grace
        elif action == "kill":
            kill_group(job.pgid, signal.SIGKILL)
        elif action == "suspend":
            kill_group(job.pgid, signal.SIGSTOP)
            job.stopped = True
        elif action == "resume":
            kill_group(job.pgid, signal.SIGCONT)
            job.stopped = False

    def _terminate_all(self, grace: float) -> None:
        for job in list(self.live.values()):
            if not job.done and job.kill_at is None:
                self._signal_job(job, "terminate", grace)

    def _timers(self) -> None:
        now = time.monotonic()
        for job in list(self.live.values()):
            if job.kill_at is not None and now >= job.kill_at and not job.done:
                kill_group(job.pgid, signal.SIGKILL)
                job.kill_at = None
            for process in job.processes:
                if process.exited_at is not None and not process.reported and now - process.exited_at >= EOF_GRACE:
                    self._check_process(job, process)


#: Start processes with os.posix_spawn (Linux and glibc, where it reports exec errors).
_SPAWN = hasattr(os, "posix_spawn") and sys.platform.startswith("linux")
#: Signals the keeper ignores that a job starts with at their default (as Popen's restore_signals).
_DEFAULT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))


def _group(pgid: int) -> dict:
    """Popen options putting the child in process group ``pgid`` (0: a new group it leads)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover


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
