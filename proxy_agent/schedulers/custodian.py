"""The keeper's custodian: what lets the keeper die without losing a job.

A job's processes write into pipes the keeper reads, and only a process's parent learns its
exit status.  A keeper that is killed would take both with it: the processes' next writes
would kill them (SIGPIPE), and their ends would go to init, unrecorded.  So the keeper does
not run alone.  ``python -m proxy_agent.schedulers.keeper DIR`` starts the *custodian*, a
small process that does nothing but this:

* it is the keeper's parent, and the *child subreaper* of everything below it
  (``PR_SET_CHILD_SUBREAPER``): when the keeper dies, its children (the jobs' processes)
  become the custodian's, not init's, and the custodian reaps them and keeps their exit
  statuses;
* the keeper hands it a duplicate of the read end of every job process's output pipes
  before the process starts (``SCM_RIGHTS`` over a socket pair), then its pid once it has,
  and tells it the exit status of each process it reaps; so a pipe always has a reader and
  its data stays in the kernel until a keeper reads it, and a job whose pipes the custodian
  holds without pids is one the keeper died starting;
* when the keeper dies (killed, crashed), the custodian starts a new one at once (a fork of
  itself: no interpreter start-up), and the new keeper asks for everything: the pipes, the
  pids, the exit statuses the custodian knows, and the processes it holds that belong to no
  job it was told of (*strays*: processes of a job the keeper was starting when it died, and
  processes that left their job).  The new keeper reads the job journal, takes the running
  jobs back from that, and goes on: output continues from where the files end, exits come
  from the custodian;
* the keeper tells it when a job has ended (its pipes are closed then), and asks it to end
  the strays of jobs that have ended (the keeper's orphan sweep, for processes that are the
  custodian's children).

The custodian holds ``keeper.lock`` in the directory for its life (and the keeper inherits
it): one custodian per directory.  A second one started there leaves at once with exit
status :data:`EXIT_ANOTHER` (0).  When the keeper leaves of its own accord (exit status 0: idle,
or every job ended on request) the custodian leaves too.  If the custodian itself is killed,
the keeper goes on as before (its jobs are its children); only a later death of the keeper
would then lose its running jobs, which the next keeper reports with the reason.

Messages are JSON objects, one per datagram of a ``SOCK_SEQPACKET`` pair, descriptors
alongside (at most :data:`FDS_PER_MESSAGE` per message):

* keeper -> custodian: ``hold`` (key, procs: [[rank, pid or 0, [streams]]...] + one
  descriptor per stream; started: {key: pids by rank} of the jobs started since the last
  message), ``pids`` (started, alone: at the end of a round), ``reaped``
  (codes: {pid: status}), ``release`` (keys), ``handover``, ``sweep`` (alive: the keys of the
  jobs still running);
* custodian -> keeper: ``exited`` (pid, code) for a held process it reaped; in answer to
  ``handover``: ``held`` (procs: [[key, rank, pid or 0, code, [streams]]...] + descriptors;
  as many as it takes), ``strays`` ({key: [pids]}), ``handover-end``.

Standard library only, like the keeper.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import selectors
import signal
import socket
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

try:  # the package's reaper when run from the package
    from .reaper import MARKER, OrphanReaper, child_pids, process_marker, set_name
except ImportError:  # pragma: no cover
    from reaper import MARKER, OrphanReaper, child_pids, process_marker, set_name  # type: ignore[no-redef]

__all__ = ["Custodian", "CustodianLink", "EXIT_ANOTHER", "FDS_PER_MESSAGE", "LOCK", "say"]

#: The lock file of a keeper directory (held by its custodian and its keeper).
LOCK = "keeper.lock"
#: Exit status of a custodian started where another one serves (nothing went wrong: that one
#: answers).
EXIT_ANOTHER = 0
#: Descriptors passed in one message (the kernel takes at most 253).
FDS_PER_MESSAGE = 240
#: Largest message (a datagram of the socket pair).
_MESSAGE = 1 << 17
#: A keeper that dies this soon after it started counts as failing to start: the next one
#: waits, twice as long each time, up to _RESTART_MAX seconds.
_QUICK_DEATH = 5.0
_RESTART_MAX = 30.0


def say(text: str) -> None:
    """A line in the keeper's log (its stderr), dated; never an error, even on a full disk
    (where the line is lost)."""
    try:
        os.write(2, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _compact(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


class CustodianLink:
    """One end of the keeper-custodian socket pair: messages out (queued while the socket
    is full) and in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.outbox: List[Tuple[bytes, List[int]]] = []
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict, fds: Optional[List[int]] = None) -> None:
        """Queue a message (and descriptors to pass; they are duplicated by the kernel when
        it goes, so the sender keeps its own)."""
        if self.closed:
            return
        self.outbox.append((_compact(message), list(fds or ())))
        self.flush()

    def deliver(self, message: dict, fds: Optional[List[int]] = None, bound: float = 5.0) -> bool:
        """Send a message and wait (at most ``bound`` seconds) until the kernel has it: what
        must be with the other end before anything else happens.  False if it is not."""
        self.send(message, fds)
        deadline = time.monotonic() + bound
        while self.outbox and not self.closed and time.monotonic() < deadline:
            select.select([], [self.sock], [], max(0.0, deadline - time.monotonic()))
            self.flush()
        return not self.outbox and not self.closed

    def flush(self) -> bool:
        """Send what is queued; True if nothing is left."""
        while self.outbox and not self.closed:
            data, fds = self.outbox[0]
            try:
                if fds:
                    socket.send_fds(self.sock, [data], fds)
                else:
                    self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self.closed = True
                self.outbox.clear()
                return True
            self.outbox.pop(0)
        return True

    def receive(self) -> Optional[Tuple[dict, List[int]]]:
        """The next message and the descriptors that came with it; None when none is waiting;
        ``({}, [])`` when the other end is gone."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, _MESSAGE, FDS_PER_MESSAGE + 13)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data, fds = b"", []
        if not data:
            self.closed = True
            for fd in fds:
                os.close(fd)
            return {}, []
        try:
            message = json.loads(data)
        except ValueError:
            message = {"op": "?"}
        return (message if isinstance(message, dict) else {"op": "?"}), list(fds)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class _Held:
    """A job process the custodian holds: its pid, its pipes' read ends, its status once
    known."""

    __slots__ = ("key", "rank", "pid", "fds", "code")

    def __init__(self, key: int, rank: int, pid: int, fds: Dict[str, int]) -> None:
        self.key = key
        self.rank = rank
        self.pid = pid
        self.fds = fds
        self.code: Optional[int] = None


class Custodian:
    """See the module documentation.  ``run_keeper(directory, link, instance)`` is what a
    forked keeper runs (its exit status is the keeper's)."""

    def __init__(self, directory: str, run_keeper: Callable[[str, CustodianLink, str], int]) -> None:
        self.dir = os.path.abspath(directory)
        self.run_keeper = run_keeper
        self.lock_fd = -1
        import secrets

        #: the marker of every job process started under this custodian (see reaper.MARKER)
        self.instance = f"{os.getpid()}-{secrets.token_hex(4)}"
        #: (key, rank) -> held process, and the same by pid once it has one
        self.held: Dict[Tuple[int, int], _Held] = {}
        self.by_pid: Dict[int, _Held] = {}
        self.keeper_pid: Optional[int] = None
        self.keeper_started = 0.0
        self.link: Optional[CustodianLink] = None
        self.closing = False
        self.failures = 0
        self.restart_at: Optional[float] = None
        self.selector = selectors.DefaultSelector()
        self.reaper: Optional[OrphanReaper] = None
        self._wake_r, self._wake_w = os.pipe()

    # ------------------------------------------------------------------ life

    def take_lock(self) -> bool:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        # Inherited by the keeper (not close-on-exec matters not: the keeper is forked, not
        # executed), so that a keeper whose custodian died still holds the directory.
        self.lock_fd = fd
        self._describe()
        return True

    def _describe(self) -> None:
        """Who serves the directory, for people and tests: ``keeper.lock`` says both pids."""
        try:
            os.ftruncate(self.lock_fd, 0)
            os.pwrite(self.lock_fd, _compact({"custodian": os.getpid(), "keeper": self.keeper_pid}), 0)
        except OSError:
            pass  # a full disk: the lock holds without its description

    def run(self) -> int:
        set_name("pa-custodian")
        self.reaper = OrphanReaper(self.instance)
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._start_keeper()
        while True:
            timeout = 1.0
            if self.restart_at is not None:
                timeout = max(0.0, min(timeout, self.restart_at - time.monotonic()))
            for key, _mask in self.selector.select(timeout):
                if key.data == "wake":
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data == "link":
                    self._from_keeper()
            if self.link is not None and self.link.outbox:
                self.link.flush()
            ended = self._reap()
            if ended is not None:
                self._keeper_ended(ended)
            if self.keeper_pid is None:
                if self.closing or self.restart_at is None:
                    self._end_held()
                    return 0
                if time.monotonic() >= self.restart_at:
                    self._start_keeper()

    def _on_signal(self, signum, frame) -> None:
        self.closing = True
        if self.keeper_pid is not None:
            try:
                os.kill(self.keeper_pid, signum)  # the keeper ends the jobs, then leaves
            except ProcessLookupError:
                pass

    def _start_keeper(self) -> None:
        self.restart_at = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the keeper
            code = 1
            try:
                ours.close()
                self.selector.close()
                signal.set_wakeup_fd(-1)
                os.close(self._wake_r)
                os.close(self._wake_w)
                if self.link is not None:
                    self.link.sock.close()
                for held in self.held.values():
                    for fd in held.fds.values():
                        os.close(fd)
                code = self.run_keeper(self.dir, CustodianLink(theirs), self.instance)
            except BaseException:  # noqa: BLE001 - told in the keeper's log, then the keeper is gone
                say("keeper: failed:\n" + traceback.format_exc())
            finally:
                os._exit(code)
        theirs.close()
        if self.link is not None:
            self.selector.unregister(self.link.sock)
            self.link.close()
        self.link = CustodianLink(ours)
        self.selector.register(ours, selectors.EVENT_READ, "link")
        self.keeper_pid = pid
        self.keeper_started = time.monotonic()
        self._describe()

    def _keeper_ended(self, status: int) -> None:
        """The keeper is gone: leave with it, or start another one (soon, if it keeps dying)."""
        code = os.waitstatus_to_exitcode(status)
        lived = time.monotonic() - self.keeper_started
        pid, self.keeper_pid = self.keeper_pid, None
        if self.link is not None:
            # what it said before it died still counts (pipes it handed over just now)
            self._from_keeper()
            self.selector.unregister(self.link.sock)
            self.link.close()
            self.link = None
        if code == 0 or self.closing:
            return  # it left on purpose (restart_at stays None: the custodian leaves too)
        self.failures = self.failures + 1 if lived < _QUICK_DEATH else 0
        delay = 0.0 if self.failures <= 1 else min(_RESTART_MAX, 0.25 * 2 ** self.failures)
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        say(f"custodian {os.getpid()}: the keeper (pid {pid}) ended ({how}) after {lived:.1f} s, holding "
            f"{len({h.key for h in self.held.values()})} running jobs; starting another"
            + (f" in {delay:g} s" if delay else ""))
        self.restart_at = time.monotonic() + delay

    def _end_held(self) -> None:
        """Leaving: nothing is held any more (a keeper that leaves on purpose has ended its
        jobs; after a signal with no keeper left, they are ended here)."""
        for held in self.held.values():
            if held.code is None and held.pid and self.closing:
                try:
                    os.killpg(held.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for fd in held.fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.held.clear()
        self.by_pid.clear()

    # ------------------------------------------------------------------ children

    def _reap(self) -> Optional[int]:
        """Reap every child that ended; the keeper's wait status if it was among them."""
        keeper_status = None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.keeper_pid:
                keeper_status = status
                continue
            held = self.by_pid.get(pid)
            if held is not None and held.code is None:
                held.code = os.waitstatus_to_exitcode(status)
                if self.link is not None and self.keeper_pid is not None:
                    self.link.send({"op": "exited", "pid": pid, "code": held.code})
            # else: a stray (a process that left its job, one of a job being started): reaped
        return keeper_status

    def _strays(self) -> Dict[int, List[int]]:
        """Children of the custodian it does not hold, by the job their marker names."""
        found: Dict[int, List[int]] = {}
        prefix = self.instance + "/"
        for pid in child_pids() - set(self.by_pid) - {self.keeper_pid}:
            mark = process_marker(pid)
            if mark and mark.startswith(prefix):
                job = mark[len(prefix):]
                if job.isdigit():
                    found.setdefault(int(job), []).append(pid)
        return found

    # ------------------------------------------------------------------ the keeper's messages

    def _from_keeper(self) -> None:
        link = self.link
        while link is not None and not link.closed:
            got = link.receive()
            if got is None:
                return
            message, fds = got
            op = message.get("op")
            try:
                if op in ("hold", "pids"):
                    for key, pids in message.get("started", {}).items():  # before the new pipes
                        for rank, pid in enumerate(pids):
                            held = self.held.get((int(key), rank))
                            if held is not None:
                                held.pid = int(pid)
                                self.by_pid[held.pid] = held
                if op == "hold":
                    self._hold(message, fds)
                    fds = []
                elif op == "reaped":
                    for pid, code in message.get("codes", {}).items():
                        held = self.by_pid.get(int(pid))
                        if held is not None and held.code is None:
                            held.code = int(code)
                elif op == "release":
                    self._release(set(message.get("keys", [])))
                elif op == "handover":
                    self._hand_over(link)
                elif op == "sweep" and self.reaper is not None:
                    alive = {str(key) for key in message.get("alive", [])}
                    self.reaper.sweep(self.by_pid.keys(), alive.__contains__)
            except (ValueError, KeyError, TypeError) as exc:
                say(f"custodian: bad message from the keeper ({exc}): {message!r:.200}")
            for fd in fds:  # descriptors that came with a message that does not keep them
                os.close(fd)

    def _hold(self, message: dict, fds: List[int]) -> None:
        key = int(message["key"])
        at = 0
        for rank, pid, streams in message["procs"]:
            mine = {}
            for stream in streams:
                mine[stream] = fds[at]
                at += 1
            self._drop((key, int(rank)))
            held = self.held[(key, int(rank))] = _Held(key, int(rank), int(pid), mine)
            if held.pid:
                self.by_pid[held.pid] = held
        for fd in fds[at:]:
            os.close(fd)

    def _drop(self, where: Tuple[int, int]) -> None:
        held = self.held.pop(where, None)
        if held is None:
            return
        if self.by_pid.get(held.pid) is held:
            del self.by_pid[held.pid]
        for fd in held.fds.values():
            os.close(fd)

    def _release(self, keys: set) -> None:
        for where in [where for where in self.held if where[0] in keys]:
            self._drop(where)

    def _hand_over(self, link: CustodianLink) -> None:
        """Everything a new keeper needs to take the running jobs back."""
        batch: List[list] = []
        batch_fds: List[int] = []
        for held in self.held.values():
            streams = list(held.fds)
            if batch and len(batch_fds) + len(streams) > FDS_PER_MESSAGE:
                link.send({"op": "held", "procs": batch}, batch_fds)
                batch, batch_fds = [], []
            batch.append([held.key, held.rank, held.pid, held.code, streams])
            batch_fds.extend(held.fds[stream] for stream in streams)
        if batch:
            link.send({"op": "held", "procs": batch}, batch_fds)
        link.send({"op": "strays", "strays": {str(k): v for k, v in self._strays().items()}})
        link.send({"op": "handover-end"})


def custodian_main(directory: str, run_keeper: Callable[[str, CustodianLink, str], int]) -> int:
    custodian = Custodian(directory, run_keeper)
    if not custodian.take_lock():
        say(f"custodian: another keeper serves {custodian.dir}")
        return EXIT_ANOTHER
    return custodian.run()


def marker_of(pid: int) -> Optional[str]:
    """The job marker in a process's environment (see :data:`.reaper.MARKER`)."""
    return process_marker(pid)


__all__ += ["custodian_main", "marker_of", "MARKER"]
