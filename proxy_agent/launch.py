"""What ``proxy-agent [--stdio | --connect ... | --listen ... | --unix ...] [options]`` does: it
joins the service of its state directory, starting one when none runs, and passes its clients
on to it.

The launched process is small on purpose (the standard library only; the agent itself is
the service, :mod:`.daemon`), so that a launch that joins a running service answers INIT
sooner than a whole agent could start.  What it does:

1. reads its command line, cheaply when it can (:func:`read_command_line`; help, the version
   and anything unclear go to the full reader in :mod:`.agent`);
2. opens its *anchor*: a connection to ``STATE_DIR/agent.sock`` sending ``launch`` with the
   whole command line.  The service reads it as the agent's own (a mistake comes back as the
   one line this process prints, exit status 2), adds the schedulers it lacks, and says which
   options it could not apply (printed here too, and told to the clients in a MESSAGE).  When
   no service answers, one is started (``proxy-agent service``, in a session of its own, its
   stdio on ``/dev/null``): of two launches starting one at the same moment, the lock in the
   state directory lets one win and the other joins it;
3. serves its transport: for ``--stdio`` and ``--connect`` one client, passed on to one
   session; for ``--listen`` and ``--unix`` it keeps its listener (the port or socket file is
   the launch's, as it was the agent's) and passes each client it accepts on to a session of
   its own, with the token and authentication deadline checked by the service.  Passing a
   client on (:class:`Relay`) hands the client's output (its pipe or socket) to the service,
   which writes to it itself, as an agent of its own would, with the session's bounds on how
   a stream ends; the launch relays what the client sends, and the session's output too only
   when it cannot be handed over (a regular file).

It ends when its client goes (``--stdio``, ``--connect``): after the service has ended the
local jobs of that client (``--on-disconnect terminate``, the default) and closed the anchor.
It takes SIGTERM, SIGINT and SIGHUP from its first moment (:class:`Signals`): while it starts,
a signal ends it at once (exit status 0, its ``--unix`` socket removed); once it serves, it
asks the service to end its clients' sessions (MESSAGE, SHUTDOWN, within the sessions'
bounds) and leaves when they have ended.  If the service dies, a stdio or connect-back client
sees its connection end (as when an agent of its own died); a listening launch starts a
service again.

When the state directory cannot hold a service (it cannot be created or written, or its path
is too long for a Unix socket), the launch runs an agent of its own in this process instead
(:func:`proxy_agent.__main__.run_private`).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .cli import entry_point
from .endpoints import (
    UNIX_PATH_MAX,
    bind_unix_listener,
    default_state_dir,
    load_or_create_token,
    lock_holder,
    parse_host_port,
    widen_pipe,
)
from .frontends.api.wire import DOOR_CLOSED, VERSION, Refused, call, encode, socket_path

__all__ = ["EXIT_IN_USE", "LaunchLine", "Signals", "Stopped", "entry", "main", "read_command_line", "start_service",
           "stop_main"]

#: The environment variable holding the --listen token; removed from the environment at start
#: so that no service (and no job) ever inherits it.
TOKEN_VARIABLE = "PROXY_AGENT_TOKEN"
#: Exit status of a service that found its state directory held by another (it lost a race).
EXIT_IN_USE = 3
#: What a service writes on its stderr once it serves, just before its stderr goes to its log.
READY_MARK = b"proxy-agent service ready\n"
#: How long finding or starting the service may take.
START_BOUND = 30.0
#: How long the service may take to end a departed client's local jobs and close.
END_BOUND = 15.0
#: How long a PTP session may take to end its stream with whole frames and SHUTDOWN once it
#: is told to end (``frontends.ptp.session.CLOSE_BOUND``, which a test holds equal); a relay
#: gives up on a client that takes nothing for that long once the stream ends.
CLOSE_BOUND = 5.0
#: How long, after a signal, the service may be silent before the launch leaves without it.
SIGNAL_BOUND = 3 * CLOSE_BOUND
_READ = 1 << 20
#: What a relay holds for its client at most (see :class:`Relay`).
_HOLD = 256 << 10

_TRANSPORTS = ("--stdio", "--connect", "--listen", "--unix", "--proxy")
#: The agent's options this process reads itself, and whether each takes a value; any other
#: option is a backend's and is left to the service.
_OPTIONS = {
    "--stdio": False, "--connect": True, "--listen": True, "--unix": True, "--proxy": True,
    "--host": True, "--port": True, "--debug": True, "--state-dir": True, "--token-file": True,
    "--log-file": True, "--verbose": False, "--idle-exit": True, "--all-users": False, "--scheduler": True,
    "--auth-timeout": True, "--broker": True, "--broker-config": True, "--runtime-socket": True,
    "--runtime-tcp": True, "--runtime-advertise": True, "--keep-ended": True, "--show-ended": True,
}
#: Options a shortened spelling could stand for (argparse takes any unambiguous prefix).
_ABBREVIABLE = tuple(_OPTIONS) + ("--help", "--version")


class LaunchError(Exception):
    """The launch cannot go on: the text is the one line to print; ``status`` the exit status."""

    def __init__(self, text: str, status: int = 2) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


class LaunchLine:
    """What the launching process needs of its command line (the service reads the rest)."""

    def __init__(self, transport: str = "stdio", address: Optional[str] = None, state_dir: Optional[str] = None,
                 token_file: Optional[str] = None, log_file: Optional[str] = None, verbose: int = 0,
                 idle_exit: Optional[str] = None, stdio: bool = False) -> None:
        self.transport = transport
        #: --stdio given in so many words (the protocol on a terminal is then what was meant)
        self.stdio = stdio
        self.address = address
        self.state_dir = state_dir
        self.token_file = token_file
        self.log_file = log_file
        self.verbose = verbose
        self.idle_exit = idle_exit

    @classmethod
    def from_arguments(cls, args: Any) -> "LaunchLine":
        """From the agent's parsed arguments (:func:`proxy_agent.__main__.parse_arguments`)."""
        transport, address = "stdio", None
        if args.proxy:
            if not args.host or not args.port:
                raise SystemExit(_fail("--proxy=tcp needs --host=HOST and --port=PORT"))
            transport, address = "connect", f"{args.host}:{args.port}"
        elif args.connect:
            transport, address = "connect", args.connect
        elif args.listen:
            transport, address = "listen", args.listen
        elif args.unix:
            transport, address = "unix", args.unix
        return cls(transport, address, args.state_dir, args.token_file, args.log_file,
                   max(args.verbose or 0, args.debug or 0), args.idle_exit, bool(args.stdio))


def _fail(text: str) -> int:
    print(f"proxy-agent: {text}", file=sys.stderr)
    return 2


def read_command_line(argv: Sequence[str]) -> Optional[LaunchLine]:
    """The launch's own options from a command line spelled out in full; None when it holds
    anything else (help, the version, a short or run-together option, a conflict, a stray
    word), which :func:`proxy_agent.__main__.read_full_command_line` then reads as argparse does."""
    values: Dict[str, str] = {}
    verbose = 0
    transports = set()
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and len(word) > 2:
            name, equals, value = word.partition("=")
            takes = _OPTIONS.get(name)
            if takes is None:
                if any(known.startswith(name) for known in _ABBREVIABLE):
                    return None  # perhaps a short spelling of one of them
                # a backend's option: its value, if it has one, goes with it to the service
                if not equals and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    i += 1
                i += 1
                continue
            if takes:
                if not equals:
                    i += 1
                    if i >= len(words) or words[i].startswith("-"):
                        return None
                    value = words[i]
                values[name] = value
            elif equals:
                return None
            elif name == "--verbose":
                verbose += 1
            else:
                values[name] = ""
            if name in _TRANSPORTS:
                transports.add(name)
        elif word.startswith("-") and len(word) > 1 and set(word[1:]) == {"v"}:
            verbose += len(word) - 1
        else:
            return None  # a stray word, a short option other than -v, "--" or "-"
        i += 1
    if len(transports) > 1:
        return None
    debug = values.get("--debug")
    if debug is not None:
        if not (debug.isascii() and debug.isdigit()):
            return None
        verbose = max(verbose, int(debug))
    if "--proxy" in values and values["--proxy"] != "tcp":
        return None
    if ("--host" in values or "--port" in values) and "--proxy" not in values:
        return None
    transport, address = "stdio", None
    if "--proxy" in values:
        if not values.get("--host") or not values.get("--port"):
            raise SystemExit(_fail("--proxy=tcp needs --host=HOST and --port=PORT"))
        transport, address = "connect", f"{values['--host']}:{values['--port']}"
    else:
        for option in ("--connect", "--listen", "--unix"):
            if option in values:
                transport, address = option[2:], values[option]
    return LaunchLine(transport, address, values.get("--state-dir"), values.get("--token-file"),
                      values.get("--log-file"), verbose, values.get("--idle-exit"), "--stdio" in values)


# --------------------------------------------------------------------------- the launch's own log


class _Log:
    """This process's log: to stderr, or to ``--log-file`` (mode 0600, which also makes it log
    what it does, as the agent always did with a log file)."""

    def __init__(self, line: LaunchLine) -> None:
        self.fd = 2
        self.verbose = line.verbose
        if line.log_file:
            try:
                self.fd = os.open(line.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                                  0o600)
            except OSError as exc:
                raise LaunchError(f"cannot open the log file {line.log_file}: {exc.strerror or exc}") from None
            self.verbose = max(self.verbose, 1)

    def info(self, text: str) -> None:
        if self.verbose >= 1:
            self._write("INFO", text)

    def debug(self, text: str) -> None:
        if self.verbose >= 2:
            self._write("DEBUG", text)

    def warning(self, text: str) -> None:
        self._write("WARNING", text)

    def _write(self, level: str, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",%03d" % (time.time() % 1 * 1000)
        _write_all(self.fd, f"{stamp} proxy-agent[{os.getpid()}] {level} proxy_agent.launch: {text}\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    """Write everything, even to a descriptor the service has made non-blocking (the two
    share the launch's stderr); give up on a broken one."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except OSError:
            return


# --------------------------------------------------------------------------- the service


def _package_root() -> str:
    """Where the ``proxy_agent`` package is imported from (a directory or the single file)."""
    import proxy_agent

    return os.path.dirname(os.path.dirname(os.path.abspath(proxy_agent.__file__)))


def start_service(state_dir: str, idle_exit: Optional[str] = None, check: Optional[Sequence[str]] = None,
                  timeout: float = START_BOUND) -> Optional[int]:
    """Start the service of ``state_dir`` and wait until it serves (or has failed).  Returns
    its pid, or None when another service won the directory first; LaunchError with the
    service's own words when it cannot start (a ``check``ed command line it cannot use, say)."""
    import subprocess

    env = dict(os.environ)
    env.pop(TOKEN_VARIABLE, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "proxy_agent", "service", "--state-dir", state_dir]
    if idle_exit is not None:
        argv += ["--idle-exit", idle_exit]
    if check is not None:
        argv += ["--check", *check]
    read_end, write_end = os.pipe()
    try:
        # A session of its own (no terminal, no signal meant for the launch's group), nothing
        # of the launch's stdio: the ssh channel that started it closes when the launch ends.
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_end,
                                   start_new_session=True, close_fds=True, env=env)
    except OSError as exc:
        os.close(read_end)
        raise LaunchError(f"cannot start the service {argv[0]}: {exc.strerror or exc}") from None
    finally:
        os.close(write_end)
    # Its stderr closes when it serves (it then logs to its file), or when it has failed.
    said = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaunchError(f"the service of {state_dir} did not start within {timeout:g} s")
            ready, _, _ = select.select([read_end], [], [], left)
            if ready:
                chunk = os.read(read_end, 4096)
                if not chunk:
                    break
                said += chunk
    finally:
        os.close(read_end)
    if said.endswith(READY_MARK):
        return process.pid
    text = " ".join(said.decode("utf-8", "replace").split())
    try:
        code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    if code == EXIT_IN_USE:
        return None
    if not text:
        text = f"the service of {state_dir} ended before it served (exit status {code})"
    raise LaunchError(text if text.startswith("proxy-agent") else f"proxy-agent: {text}", 1 if code in (0, 1) else 2)


def open_service(state_dir: str, request: Dict[str, Any], fds: Sequence[int], *, idle_exit: Optional[str],
                check: Optional[Sequence[str]], log: Optional[_Log] = None,
                timeout: float = START_BOUND) -> Tuple[Dict[str, Any], socket.socket]:
    """Send ``request`` to the service of ``state_dir`` on a connection kept open (the anchor),
    starting a service when none answers.  Returns (its answer, the connection)."""
    path = socket_path(state_dir)
    deadline = time.monotonic() + timeout
    starts = 0
    while True:
        try:
            return call(path, request, fds=fds, keep=True, timeout=timeout)
        except Refused as exc:
            raise LaunchError(exc.message if exc.message.startswith("proxy-agent") else f"proxy-agent: {exc.message}")
        except ValueError:
            holder = lock_holder(state_dir) or {}
            raise LaunchError(f"proxy-agent: the process holding {state_dir} (process {holder.get('pid', '?')}) does "
                              f"not speak this agent's service interface; stop it, or give this launch another "
                              f"--state-dir") from None
        except OSError:
            pass
        if time.monotonic() > deadline:
            holder = lock_holder(state_dir)
            who = f"process {holder.get('pid', '?')} holds it but" if holder is not None else "no service"
            raise LaunchError(f"proxy-agent: the state directory {state_dir} cannot be served: {who} does not answer "
                              f"on {path}")
        if lock_holder(state_dir) is not None:
            time.sleep(0.01)  # a service starting (or stopping): its socket comes (or goes) soon
            continue
        starts += 1
        if starts > 3:
            raise LaunchError(f"proxy-agent: a service of {state_dir} was started {starts - 1} times and none served")
        pid = start_service(state_dir, idle_exit, check, max(1.0, deadline - time.monotonic()))
        if log is not None and pid is not None:
            log.info(f"started the service of {state_dir} (process {pid}); its log is {state_dir}/agent.log")


def _prepare_state_dir(directory: str) -> Optional[str]:
    """None if ``directory`` can hold a service, else why not."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        return f"cannot create the state directory {directory}: {exc.strerror or exc}"
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        return f"the state directory {directory} cannot be written"
    if len(os.fsencode(socket_path(directory))) > UNIX_PATH_MAX:
        return f"the path of the state directory {directory} is too long for a Unix socket"
    return None


# --------------------------------------------------------------------------- relaying


class Stopped(BaseException):
    """A signal came while the process was starting: the start-up stops where it stands."""


class Signals:
    """SIGTERM, SIGINT and SIGHUP, from a process's first moment to its last.

    While the process starts, a signal stops the start-up where it stands (:class:`Stopped`,
    which the entry point turns into exit status 0) and the socket files made by then
    (:meth:`made`) are removed as the process leaves (:meth:`remove_made`): nothing is half
    made that could need a goodbye.  Once the process serves, a signal is noted and handed
    over instead: it makes a pipe readable that a poll loop watches (:meth:`to_pipe`), or is
    given to a function (:meth:`to_function`, a trio task's, say); between the two it is only
    noted (:meth:`hold`), and handed over when that is set."""

    NUMBERS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        #: the first signal received (its number), or None
        self.received: Optional[int] = None
        self.starting = False
        #: readable once a signal came (see :meth:`to_pipe`)
        self.read_fd: Optional[int] = None
        self._write_fd: Optional[int] = None
        self._function: Optional[Callable[[int], None]] = None
        #: socket files made while starting: path -> inode (only those are removed)
        self._made: Dict[str, int] = {}
        self._previous: Dict[int, Any] = {}
        #: the unraisable hook before :meth:`install`
        self._hook: Optional[Callable[[Any], None]] = None

    def install(self) -> "Signals":
        """Take the signals (in the main thread only: elsewhere they are not Python's to take)."""
        for number in self.NUMBERS:
            try:
                previous = signal.signal(number, self._handle)
            except ValueError:  # not the main thread
                return self
            self._previous.setdefault(number, previous)
            self.starting = True
        if self._hook is None:
            self._hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable
        return self

    def restore(self) -> None:
        """Give the signals back to what handled them before :meth:`install`."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._hook is not None:
            sys.unraisablehook = self._hook
            self._hook = None

    def _unraisable(self, info: Any) -> None:
        """A :class:`Stopped` raised where Python cannot let an exception out (in a ``__del__``,
        say, which it would print and forget): raised again a moment later instead, where it
        stops the start-up."""
        if isinstance(info.exc_value, Stopped) and self.received is not None:
            self.starting = True
            signal.signal(signal.SIGALRM, lambda number, frame: self._handle(self.received, frame))
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        (self._hook or sys.__unraisablehook__)(info)

    @property
    def name(self) -> Optional[str]:
        return None if self.received is None else signal.Signals(self.received).name

    def _handle(self, number: int, frame: Any) -> None:
        if self.received is None:
            self.received = number
        if self._function is not None:
            try:
                self._function(number)
            except Exception:  # noqa: BLE001 - what it was for has ended: the signal stays noted
                pass
        elif self._write_fd is not None:
            try:
                os.write(self._write_fd, b"!")
            except OSError:
                pass
        elif self.starting:
            self.starting = False  # once: what cleans up after it is not stopped again
            raise Stopped(number)

    def hold(self) -> None:
        """From now on a signal is only noted (the process is about to serve)."""
        self._function = None
        self.starting = False

    def to_pipe(self) -> int:
        """From now on a signal makes :attr:`read_fd` readable; returns it."""
        if self.read_fd is None:
            read_fd, write_fd = os.pipe()
            for fd in (read_fd, write_fd):
                os.set_blocking(fd, False)
                os.set_inheritable(fd, False)
            self.read_fd, self._write_fd = read_fd, write_fd
        self.hold()
        if self.received is not None:
            os.write(self._write_fd, b"!")
        return self.read_fd

    def to_function(self, function: Callable[[int], None]) -> None:
        """From now on a signal is given to ``function`` (called in the signal handler: it
        may only arrange for something to happen, as ``TrioToken.run_sync_soon`` does)."""
        self._function = function
        self.starting = False
        if self.received is not None:
            self._handle(self.received, None)

    def drain(self) -> None:
        if self.read_fd is None:
            return
        try:
            while os.read(self.read_fd, 64):
                pass
        except OSError:
            pass

    def made(self, path: str) -> None:
        """A socket file this process made at ``path``: removed by :meth:`remove_made`."""
        try:
            self._made[path] = os.stat(path).st_ino
        except OSError:
            pass

    def handed_on(self, path: str) -> None:
        """``path`` is no longer for :meth:`remove_made`: what serves now removes it."""
        self._made.pop(path, None)

    def remove(self, path: str) -> None:
        """Remove the socket file :meth:`made` made at ``path``, if it is still that one."""
        inode = self._made.pop(path, None)
        try:
            if inode is not None and os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass

    def remove_made(self) -> None:
        """Remove every socket file :meth:`made` names that is still the one made."""
        for path in list(self._made):
            self.remove(path)


_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF)


def _can_hand_over(fd: int) -> bool:
    """Can the service write to ``fd`` itself (a pipe, a socket or a terminal, which it
    waits on as it waits on its own)?  A regular file or a device it cannot wait on is
    written by the relay instead."""
    import stat

    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


class Relay:
    """Carries a client's bytes to a service session (``service``) and, unless the client's
    output was handed to the service (``output_handed``: the session then writes to the
    client itself, exactly as an agent of its own, with its bounds on how a stream ends),
    the session's bytes back to the client (``client_in``/``client_out``: two descriptors,
    or one socket twice); until the session has ended and all it said is written, or the
    client has gone and the service has closed too.

    When it carries the session's bytes, it holds at most :data:`_HOLD` of them and reads
    from the service while it holds less, and it never cuts what the session said: once the
    stream ends (the session closed, or the launch was told to end, see :meth:`run`), it
    gives up only on a client that takes nothing for :data:`CLOSE_BOUND` (as the session does)
    or on a service that, told to end the session, says nothing for :data:`SIGNAL_BOUND`."""

    def __init__(self, client_in: int, client_out: int, service: socket.socket,
                 client_socket: Optional[socket.socket] = None, output_handed: bool = False) -> None:
        self.client_in = client_in
        self.client_out = client_out
        self.service = service
        self.service_fd = service.fileno()
        #: the client's socket, when it is one (client_in and client_out are its descriptor)
        self.client_socket = client_socket
        self.up = b""  # client -> service
        self.down = bytearray()  # service -> client
        self.client_done = False  # no more to read from the client
        self.client_gone = False  # nothing more can be written to it
        self.service_done = False
        self._service_shut = False
        #: when the stream began to end (the launch was told to end, or the session closed)
        self.ending_since: Optional[float] = None
        self._told_to_end = False
        #: when the client last took something, and when the service was last heard (or
        #: not waited for)
        self._took_at = 0.0
        self._heard_at = 0.0
        self.output_handed = output_handed
        for fd in {client_in, self.service_fd} if output_handed else {client_in, client_out, self.service_fd}:
            os.set_blocking(fd, False)

    def run(self, wake: Optional[int] = None, on_wake: Optional[Callable[[], Any]] = None) -> bool:
        """Relay until done.  ``wake`` becoming readable means the launch is ending:
        ``on_wake`` is called once (it asks the service to end the session) and the relay
        goes on until the session has ended and all it said is written.  False if it gave up
        (see the class)."""
        poller = select.poll()
        registered: Dict[int, int] = {}
        while not (self.service_done and (not self.down or self.client_gone)):
            wanted: Dict[int, int] = {}

            def want(fd: int, mask: int) -> None:
                wanted[fd] = wanted.get(fd, 0) | mask

            if not self.client_done and not self.up:
                want(self.client_in, select.POLLIN)
            if self.up:
                want(self.service_fd, select.POLLOUT)
            if not self.service_done and (len(self.down) < _HOLD or self.client_gone):
                want(self.service_fd, select.POLLIN)
            if self.down and not self.client_gone:
                want(self.client_out, select.POLLOUT)
            if wake is not None and not self._told_to_end:
                want(wake, select.POLLIN)
            for fd in list(registered):
                if fd not in wanted:
                    poller.unregister(fd)
                    del registered[fd]
            for fd, mask in wanted.items():
                if registered.get(fd) != mask:
                    if fd in registered:
                        poller.modify(fd, mask)
                    else:
                        poller.register(fd, mask)
                    registered[fd] = mask
            timeout = self._give_up_in()
            if timeout is not None and timeout <= 0:
                self._close_client_output()
                return False
            events = poller.poll(None if timeout is None else int(timeout * 1000) + 1)
            for fd, mask in events:
                if fd == wake:
                    if not self._told_to_end:
                        self._told_to_end = True
                        self._ending()
                        if on_wake is not None:
                            on_wake()
                    continue
                if fd == self.service_fd:
                    if mask & select.POLLOUT and self.up:
                        self._to_service()
                    if mask & (select.POLLIN | select.POLLHUP | select.POLLERR) and not self.service_done:
                        self._from_service()
                if fd in (self.client_in, self.client_out):
                    if fd == self.client_out and mask & select.POLLOUT and self.down:
                        self._to_client()
                    if (fd == self.client_in and mask & (select.POLLIN | select.POLLHUP | select.POLLERR)
                            and not self.client_done and not self.up):
                        self._from_client()
                    elif (fd == self.client_out and self.client_socket is None and not self.output_handed
                          and mask & (select.POLLERR | select.POLLHUP) and not mask & select.POLLOUT):
                        self._client_left()
        self._close_client_output()
        return True

    def _ending(self) -> None:
        if self.ending_since is None:
            self.ending_since = self._took_at = self._heard_at = time.monotonic()

    def _give_up_in(self) -> Optional[float]:
        """Seconds until the relay gives up, as things stand (None: it does not)."""
        if self.ending_since is None:
            return None
        now = time.monotonic()
        bounds = []
        if self.down and not self.client_gone:
            bounds.append(self._took_at + CLOSE_BOUND - now)
        if self._told_to_end and not self.service_done:
            if len(self.down) >= _HOLD and not self.client_gone:
                self._heard_at = now  # not waiting for the service: the client has yet to take
            bounds.append(self._heard_at + SIGNAL_BOUND - now)
        return min(bounds) if bounds else None

    def _from_client(self) -> None:
        try:
            data = os.read(self.client_in, _READ)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.up = data
            self._to_service()
        else:
            self.client_done = True
            self._shut_service()

    def _to_service(self) -> None:
        try:
            sent = self.service.send(self.up)
        except BlockingIOError:
            return
        except OSError:
            self.up = b""
            self.client_done = True
            self.service_done = True
            self._ending()
            return
        self.up = self.up[sent:]
        if not self.up and self.client_done:
            self._shut_service()

    def _shut_service(self) -> None:
        if self.up or self._service_shut:
            return
        self._service_shut = True
        try:
            self.service.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _from_service(self) -> None:
        try:
            data = self.service.recv(_READ if self.client_gone else _HOLD - len(self.down))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.service_done = True
            self._ending()
            return
        self._heard_at = time.monotonic()
        if self.client_gone:
            return  # nobody to give it to
        self.down += data
        self._to_client()

    def _to_client(self) -> None:
        try:
            written = os.write(self.client_out, self.down)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self._client_left()
            return
        if written:
            del self.down[:written]
            self._took_at = time.monotonic()

    def _client_left(self) -> None:
        """The client can no longer be written to: it has gone; the service is told (EOF)."""
        self.client_gone = True
        self.down.clear()
        self.client_done = True
        self._shut_service()

    def _close_client_output(self) -> None:
        if self.client_socket is not None:
            try:
                self.client_socket.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        else:
            _restore_blocking(self.client_out)  # a terminal's, say, shared with the shell
            try:
                os.close(self.client_out)
            except OSError:
                pass


def _restore_blocking(*fds: int) -> None:
    for fd in fds:
        try:
            os.set_blocking(fd, True)
        except OSError:
            pass


class _Launch:
    """One launch, from its anchor to its end."""

    def __init__(self, line: LaunchLine, argv: Sequence[str], log: _Log, signals: Signals) -> None:
        self.line = line
        self.argv = list(argv)
        self.log = log
        self.state_dir = os.path.abspath(line.state_dir or default_state_dir())
        self.token: Optional[str] = None
        self.anchor: Optional[socket.socket] = None
        self.door = ""
        self.service_pid: Optional[int] = None
        self.signals = signals

    def open(self, peer: str) -> None:
        request: Dict[str, Any] = {
            "op": "launch", "version": VERSION, "argv": self.argv, "cwd": os.getcwd(),
            "transport": self.line.transport, "pid": os.getpid(), "peer": peer,
        }
        if self.token is not None:
            request["token"] = self.token
        fds = [self.log.fd]
        reply, anchor = open_service(self.state_dir, request, fds, idle_exit=self.line.idle_exit, check=self.argv,
                                    log=self.log)
        assert anchor is not None
        self.anchor = anchor
        self.door = str(reply.get("door"))
        service = reply.get("service") or {}
        self.service_pid = service.get("pid")
        self.log.info(f"joined the service of {self.state_dir} (process {self.service_pid}, schedulers "
                      f"{','.join(service.get('schedulers') or []) or 'starting'})")
        note = reply.get("not_applied")
        if note:
            self.log.warning(note)

    def session(self, peer: str, output: Optional[int] = None) -> socket.socket:
        """A connection to the service that is a session of this launch's door; LaunchError
        when the service has gone meanwhile.  ``output``: the client's output (its pipe or
        socket), handed to the service, which then writes to it directly."""
        request = {"op": "session", "version": VERSION, "door": self.door, "peer": peer}
        if output is not None:
            request["output"] = "handed"
        try:
            _, sock = call(socket_path(self.state_dir), request, fds=() if output is None else (output,), keep=True)
        except (OSError, ValueError, Refused) as exc:
            raise LaunchError(f"the service of {self.state_dir} went away: {getattr(exc, 'message', None) or exc}",
                              1) from None
        assert sock is not None
        return sock

    def farewell(self) -> None:
        """A signal came: the service is asked to end this launch's sessions, telling their
        clients why (MESSAGE, SHUTDOWN); the relays carry that to the clients.  Its answer is
        not waited for (the relays go on meanwhile): :meth:`close` reads past it."""
        self.signals.drain()
        name = self.signals.name or "a signal"
        self.log.info(f"received {name}, shutting down")
        anchor = self.anchor
        if anchor is not None:
            try:
                anchor.settimeout(2.0)
                anchor.sendall(encode({"op": "farewell", "id": 2, "version": VERSION,
                                       "text": f"the agent received {name} and is shutting down"}))
            except OSError:
                pass

    def close(self, bound: float = END_BOUND) -> bool:
        """End the door: the service ends what it must of the clients' jobs, then closes.
        False when the service went away instead (it died)."""
        anchor, self.anchor = self.anchor, None
        if anchor is None:
            return False
        said = b""
        try:
            anchor.shutdown(socket.SHUT_WR)
            anchor.settimeout(bound)
            while True:
                data = anchor.recv(4096)
                if not data:
                    break
                said = (said + data)[-256:]
        except OSError:
            pass
        finally:
            anchor.close()
        return f'"{DOOR_CLOSED}"'.encode() in said

    # ---------------------------------------------------------------- one client

    def relay_one(self, client_in: int, client_out: int, peer: str,
                  client_socket: Optional[socket.socket] = None) -> int:
        wake = self.signals.to_pipe()  # from here a signal ends the session, as the service says
        handed = _can_hand_over(client_out)
        sock = self.session(peer, client_out if handed else None)
        relay = Relay(client_in, client_out, sock, client_socket, output_handed=handed)
        try:
            if not relay.run(wake, self.farewell):
                self.log.warning("the session did not end within its bounds; the connection is closed")
        finally:
            _restore_blocking(client_in, client_out)
            sock.close()
        if not self.close(SIGNAL_BOUND if self.signals.received else END_BOUND) and self.signals.received is None:
            print(f"proxy-agent: the service of {self.state_dir} (process {self.service_pid}) ended; its jobs are "
                  "kept for the next one", file=sys.stderr)
            return 1
        self.log.info("the session ended")
        return 0

    # ---------------------------------------------------------------- listening

    def serve_listeners(self, listeners: List[socket.socket], unix_path: Optional[str]) -> int:
        """Relay each client the listeners accept, in a thread of its own, until a signal;
        then the service ends the sessions (telling their clients) and the relays carry that
        to the end."""
        import threading

        # readable once the launch ends (never drained): each relay then knows it
        ending_fd, ending_write = os.pipe()

        def serve(conn: socket.socket, peer: str) -> None:
            try:
                sock = self.session(peer, conn.fileno())
            except LaunchError as exc:
                self.log.warning(f"cannot serve {peer}: {exc.text}")
                conn.close()
                return
            try:
                Relay(conn.fileno(), conn.fileno(), sock, conn, output_handed=True).run(ending_fd)
            except OSError:
                pass
            finally:
                sock.close()
                conn.close()

        wake = self.signals.to_pipe()
        poller = select.poll()
        by_fd = {listener.fileno(): listener for listener in listeners}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(wake, select.POLLIN)
        anchor_fd = self.anchor.fileno() if self.anchor is not None else None
        if anchor_fd is not None:
            poller.register(anchor_fd, select.POLLIN)
        threads: List[threading.Thread] = []
        try:
            while self.signals.received is None:
                for fd, _ in poller.poll():
                    if fd == wake:
                        break
                    if fd == anchor_fd:
                        # The service is gone: a new one (which adopts the jobs) serves from now on.
                        poller.unregister(anchor_fd)
                        anchor_fd = self._launch_again(poller)
                        continue
                    try:
                        conn, address = by_fd[fd].accept()
                    except OSError:
                        continue
                    peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "unix client"
                    thread = threading.Thread(target=serve, args=(conn, peer), daemon=True)
                    thread.start()
                    threads = [t for t in threads if t.is_alive()] + [thread]
            self.farewell()
            os.write(ending_write, b"!")
            for listener in listeners:
                listener.close()
            if unix_path is not None:
                self.signals.remove(unix_path)  # no client comes any more
            for thread in threads:
                thread.join()  # each relay ends within its bounds
        finally:
            if unix_path is not None:
                self.signals.remove(unix_path)
        self.close(SIGNAL_BOUND)
        return 0

    def _launch_again(self, poller: Any) -> Optional[int]:
        try:
            data = self.anchor.recv(4096) if self.anchor is not None else b""
        except OSError:
            data = b""
        if data:
            return self.anchor.fileno() if self.anchor is not None else None  # not an end
        self.log.warning(f"the service of {self.state_dir} ended; starting it again")
        if self.anchor is not None:
            self.anchor.close()
            self.anchor = None
        try:
            self.open(self.line.transport + " launch")
        except LaunchError as exc:
            self.log.warning(exc.text)
            raise SystemExit(1)
        assert self.anchor is not None
        poller.register(self.anchor.fileno(), select.POLLIN)
        return self.anchor.fileno()


# --------------------------------------------------------------------------- main


@entry_point
def entry(argv: Optional[Sequence[str]] = None) -> int:
    """``proxy-agent``: a launch (:func:`main`), or one of its commands: ``service`` (the
    service itself, :mod:`.daemon`), ``stop`` (:func:`stop_main`), ``jobs``, ``forget`` and
    ``output`` (:mod:`.joblist`), ``completion`` (:mod:`.completion`) and ``--man``.  Each
    loads only what it needs.  A launch and the service take SIGTERM, SIGINT and SIGHUP from
    their first moment (see :class:`Signals`).  A reader that closes stdout early (a pipe into
    ``head``) ends the command quietly (:func:`.cli.entry_point`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command in ("jobs", "forget", "output"):
        from .joblist import main as joblist_main

        return joblist_main(argv)
    if command == "stop":
        return stop_main(argv[1:])
    if command == "completion":
        from .completion import main as completion_main

        return completion_main(argv[1:])
    if argv == ["--man"]:
        from .completion import manual

        sys.stdout.write(manual())
        return 0
    if command != "service":
        try:
            argv = _configured(argv)
        except ValueError as exc:  # the configuration file's problem, said in one line
            print(f"proxy-agent: {exc}", file=sys.stderr)
            return 2
    signals = Signals()
    try:
        signals.install()
        if command == "service":
            from .daemon import main as service_main

            return service_main(argv[1:], signals)
        return main(argv, signals)
    except Stopped:
        return 0  # a signal while starting: nothing was serving yet
    finally:
        signals.hold()
        signals.remove_made()
        signals.restore()


def main(argv: Sequence[str], signals: Optional[Signals] = None) -> int:
    """``proxy-agent [OPTIONS]``: see the module documentation."""
    if signals is None:
        return entry(argv)
    line = read_command_line(argv)
    if line is None:
        from .__main__ import read_full_command_line

        line = read_full_command_line(argv)  # help, the version, or a mistake: it exits
    try:
        return _run(line, argv, signals)
    except LaunchError as exc:
        print(exc.text if exc.text.startswith("proxy-agent") else f"proxy-agent: {exc.text}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"proxy-agent: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _configured(argv: List[str]) -> List[str]:
    """The command line with the configuration file's options in front (see
    :func:`proxy_agent.__main__.configured`); when there is no file, one stat and nothing loaded."""
    from .config import config_path

    path = config_path()
    if path is None or not os.path.exists(path):
        return argv
    from .__main__ import configured

    return configured(argv)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


#: What an agent started at a terminal says (a person typed ``proxy-agent``).
_ON_A_TERMINAL = ("stdin is a terminal: this agent speaks the PTP proxy protocol on stdin/stdout for an IDE or a "
                  "console (to drive it by hand, run proxy-console, which starts one")


def _run(line: LaunchLine, argv: Sequence[str], signals: Signals) -> int:
    if line.transport == "stdio" and _isatty(0):
        if not line.stdio:
            raise LaunchError(f"{_ON_A_TERMINAL}, or give --stdio to speak it on this terminal anyway)")
        print(f"proxy-agent: {_ON_A_TERMINAL})", file=sys.stderr)
    log = _Log(line)
    state_dir = os.path.abspath(line.state_dir or default_state_dir())
    why = _prepare_state_dir(state_dir)
    if why is not None:
        from .__main__ import run_private

        return run_private(argv, signals)
    env_token = os.environ.pop(TOKEN_VARIABLE, None)
    launch = _Launch(line, argv, log, signals)
    transport = line.transport
    if transport == "connect":
        try:
            host, port = parse_host_port(line.address or "")
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        launch.open(f"{host}:{port}")
        try:
            client = socket.create_connection((host, port))
        except OSError as exc:
            launch.close()
            raise LaunchError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        log.info(f"connected to {host}:{port}")
        try:
            return launch.relay_one(client.fileno(), client.fileno(), f"{host}:{port}", client)
        finally:
            client.close()
    if transport in ("listen", "unix"):
        return _listen(launch, line, env_token)
    # stdio: the protocol has stdin and stdout to itself; fd 1 becomes stderr, so that nothing
    # stray can ever reach the client, and fd 0 /dev/null.
    in_fd, out_fd = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    widen_pipe(out_fd)
    launch.open(f"stdio client of launch {os.getpid()}")
    return launch.relay_one(in_fd, out_fd, f"stdio client of launch {os.getpid()}")


def _listen(launch: _Launch, line: LaunchLine, env_token: Optional[str]) -> int:
    listeners: List[socket.socket] = []
    unix_path = None
    if line.transport == "listen":
        try:
            host, port = parse_host_port(line.address or "", default_host="127.0.0.1", allow_zero=True)
            token, written = load_or_create_token(line.token_file, env_token)
        except (ValueError, OSError) as exc:
            raise LaunchError(str(exc)) from None
        launch.token = token
        launch.open(f"--listen {host}:{port}")
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                     flags=socket.AI_PASSIVE):
                sock = socket.socket(family, kind, proto)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(64)
                listeners.append(sock)
        except OSError as exc:
            for sock in listeners:
                sock.close()
            launch.close()
            raise LaunchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        for sock in listeners:
            address = sock.getsockname()
            print(f"proxy-agent listening on {address[0]}:{address[1]}", file=sys.stderr, flush=True)
        if written:
            print(f"proxy-agent token written to {written}", file=sys.stderr, flush=True)
    else:
        unix_path = line.address or ""
        launch.open(f"--unix {unix_path}")
        # From here a signal is noted (serve_listeners then ends the launch the usual way):
        # the socket file made is known before anything can stop the launch.
        launch.signals.hold()
        try:
            listeners.append(bind_unix_listener(unix_path))
        except OSError as exc:
            launch.close()
            raise LaunchError(f"cannot listen on {unix_path}: {exc.strerror or exc}") from None
        launch.signals.made(unix_path)
        print(f"proxy-agent listening on {unix_path}", file=sys.stderr, flush=True)
    return launch.serve_listeners(listeners, unix_path)


# --------------------------------------------------------------------------- stop


def stop_parser() -> Any:
    """The command line of ``proxy-agent stop``."""
    import argparse

    from .config import state_dir as configured_state_dir

    parser = argparse.ArgumentParser(prog="proxy-agent stop",
                                     description="Stop the service of a state directory. Its jobs go on (batch jobs "
                                     "in their scheduler, local ones under their keeper) and the next service "
                                     "adopts them.")
    parser.add_argument("--state-dir", metavar="DIR", default=configured_state_dir(default_state_dir()),
                        help="the state directory (default: %(default)s, or the configuration file's)")
    parser.add_argument("--end-jobs", action="store_true", help="also end every running local job first")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for it to stop (default: %(default)s)")
    return parser


def stop_main(argv: Sequence[str]) -> int:
    """``proxy-agent stop [--state-dir DIR] [--end-jobs]``: stop the service of a state
    directory (its running local jobs go on for the next one, unless --end-jobs)."""
    from .config import ConfigError

    try:
        args = stop_parser().parse_args(list(argv))
    except ConfigError as exc:
        print(f"proxy-agent stop: {exc}", file=sys.stderr)
        return 2
    state_dir = os.path.abspath(args.state_dir or default_state_dir())
    try:
        pid = stop_service(state_dir, end_jobs=args.end_jobs, timeout=args.timeout)
    except LaunchError as exc:
        print(f"proxy-agent stop: {exc.text}", file=sys.stderr)
        return exc.status
    if pid is None:
        print(f"no service runs on {state_dir}")
    else:
        print(f"stopped the service of {state_dir} (process {pid})")
    return 0


def stop_service(state_dir: str, *, end_jobs: bool = False, timeout: float = 30.0) -> Optional[int]:
    """Stop the service of ``state_dir`` and wait until it has left; its pid (None: none ran)."""
    holder = lock_holder(state_dir)
    if holder is None:
        return None
    pid = holder.get("pid")
    request = {"op": "stop", "version": VERSION, "jobs": "terminate" if end_jobs else "keep"}
    try:
        reply, _ = call(socket_path(state_dir), request, timeout=timeout)
        pid = reply.get("pid", pid)
    except Refused as exc:
        raise LaunchError(exc.message, 1) from None
    except (OSError, ValueError):
        if not isinstance(pid, int):
            raise LaunchError(f"the process holding {state_dir} does not answer and did not say who it is", 1) from None
        try:
            os.kill(pid, signal.SIGTERM)  # not a service of this version: asked the old way
        except ProcessLookupError:
            return pid
    deadline = time.monotonic() + timeout
    while lock_holder(state_dir) is not None:
        if time.monotonic() > deadline:
            raise LaunchError(f"the service of {state_dir} (process {pid}) did not stop within {timeout:g} s", 1)
        time.sleep(0.02)
    return pid
