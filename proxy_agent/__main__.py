"""Command line of the agent: ``proxy-agent`` / ``python -m proxy_agent``.

Run as a program, this module hands over at once to :func:`proxy_agent.launch.entry`, which
loads no more than a launch needs (a launch that joins the service of its state directory
only passes its client on).  Imported, it is the agent's command line and the agent of one process:
the options are read here (``--help`` and anything the launch cannot read by itself, and by
the service, :mod:`.daemon`, for every launch that joins it); :func:`build_service` makes a
job service with its backends; :func:`run_private` runs an agent that serves its own
transport in its own process, as every agent did before the service of a state directory
existed: only when the state directory cannot hold a service (it cannot be created or
written, or its path is too long for a Unix socket).
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m proxy_agent: the launcher, at once
    import signal as _signal
    import sys

    #: Signals that came while the launcher loaded: the exit they raise is lost when it is
    #: raised inside a callback whose exceptions Python ignores (the import system's
    #: module-lock callbacks), so it is looked at once more before the launch begins.
    _SIGNALLED_WHILE_LOADING: list = []

    def _stopped_while_loading(signum, frame):  # nothing exists yet: nothing to clean up
        _SIGNALLED_WHILE_LOADING.append(signum)
        raise SystemExit(0)

    # until the launcher takes the signals (see proxy_agent.launch.Signals), a signal ends
    # the process quietly
    for _signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(_signum, _stopped_while_loading)

    from proxy_agent.launch import entry

    if _SIGNALLED_WHILE_LOADING:
        sys.exit(0)
    sys.exit(entry(sys.argv[1:]))

import gc

# Start-up makes tens of thousands of objects that live as long as the agent; the collector
# would walk them again and again (full collections included) while they are made.  It waits
# until the imports are done, and then leaves them out of its walks.
_COLLECTING = gc.isenabled()
gc.disable()

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Sequence

import trio

from . import __version__
from .frontends.ptp import PtpConfig
from .launch import Signals, Stopped
from .schedulers.registry import BACKENDS, backend_class
from .server import ServerLimits, Sessions, serve_listeners, serve_stream
from .service.broker_names import broker_choices
from .service.coalloc.manager import CoallocManager, RuntimeSettings
from .service.service import JobService
from .service.store import (JobStore, StateDirInUse, StateLock, StoreError, StoreUnwritable, default_state_dir,
                            open_store)
from .simple_line import SimpleLine
from .transport import (
    connect_tcp,
    load_or_create_token,
    open_stdio,
    open_tcp_listeners,
    open_unix_listener,
    os_error_reason,
    parse_host_port,
)

if TYPE_CHECKING:  # argparse is imported when a command line needs it (see SimpleLine)
    import argparse

if _COLLECTING:
    gc.freeze()
    gc.enable()

log = logging.getLogger("proxy_agent")

#: Seconds the service of a state directory stays without a client and a running local job.
DEFAULT_IDLE_EXIT = 600.0

#: The environment variable holding the --listen token; removed from the agent's own
#: environment at start so that no job ever inherits it.
TOKEN_VARIABLE = "PROXY_AGENT_TOKEN"


_ARGPARSE_CLASSES: list = []


class CommandLineError(Exception):
    """A command line that cannot be used; the text is the one line to show."""


def _argparse_classes() -> list:
    """The parser and help formatter classes (made the first time: they need argparse)."""
    if not _ARGPARSE_CLASSES:
        import argparse

        class _Parser(argparse.ArgumentParser):
            """Errors in one line (and exit status 2), never a usage dump or a traceback."""

            def error(self, message: str) -> NoReturn:
                raise CommandLineError(f"{self.prog}: {message} (see {self.prog} --help)")

        class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
            """Shows an option's default where it has a real one (not for flags or options without one)."""

            def _get_help_string(self, action: argparse.Action) -> str:
                if action.default in (None, False) or "default" in (action.help or ""):
                    return action.help or ""
                return super()._get_help_string(action)

        _ARGPARSE_CLASSES[:] = [_Parser, _DefaultsShown]
    return _ARGPARSE_CLASSES


def build_parser(backends: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The agent's command line; ``backends`` limits the backend options to those backends'
    (the others' modules then need not be imported)."""
    parser_class, formatter_class = _argparse_classes()
    parser = parser_class(
        prog="proxy-agent",
        description="Resource-manager proxy agent: presents this machine's schedulers to an IDE "
        "over the PTP proxy protocol.",
        formatter_class=formatter_class,
    )
    _add_options(parser, backends)
    return parser


def _add_options(parser: Any, backends: Optional[Sequence[str]]) -> None:
    """Every option of the command line (with the backends' of ``backends``, all when None),
    added to ``parser``: an argparse parser, or a :class:`_SimpleLine`."""
    where = parser.add_argument_group("transport (one of; default --stdio)")
    exclusive = where.add_mutually_exclusive_group()
    exclusive.add_argument("--stdio", action="store_true", help="speak the protocol on stdin/stdout")
    exclusive.add_argument("--connect", metavar="HOST:PORT", help="connect back to a client listening at HOST:PORT")
    exclusive.add_argument(
        "--listen", metavar="[HOST:]PORT",
        help="accept clients on a TCP port (127.0.0.1 unless HOST is given; clients need the token)",
    )
    exclusive.add_argument("--unix", metavar="PATH", help="accept clients on a Unix socket created with mode 0600")
    exclusive.add_argument(
        "--proxy", choices=["tcp"],
        help="how the IDE launches a proxy: --proxy=tcp --host=HOST --port=PORT connects back to HOST:PORT",
    )
    where.add_argument("--host", help="with --proxy=tcp: the host to connect back to")
    where.add_argument("--port", help="with --proxy=tcp: the port to connect back to")
    where.add_argument("--debug", type=int, default=0, metavar="LEVEL",
                       help="what the IDE adds when its proxy debugging is on: 1 logs as -v, 2 or more as -vv")
    parser.add_argument(
        "--scheduler", default="local", metavar="NAME[,NAME...]",
        help=f"backends to run, comma-separated; each is one machine with its own queues "
        f"(available: {', '.join(BACKENDS)})",
    )
    parser.add_argument("--all-users", action="store_true", help="show every user's jobs, not only your own")
    parser.add_argument(
        "--state-dir", metavar="DIR",
        help="where jobs are kept so that they outlive the agent (default: $XDG_STATE_HOME/proxy-agent, "
        "that is ~/.local/state/proxy-agent); one service per directory, which every launch on it joins",
    )
    parser.add_argument(
        "--idle-exit", metavar="SECONDS|never", default=None,
        help=f"when this launch starts the state directory's service: it leaves after that long without a "
        f"client and without a running local job (default: {DEFAULT_IDLE_EXIT:g}; never: it stays)",
    )
    parser.add_argument("--keep-ended", metavar="DURATION", type=_keep_ended, default="14d",
                        help="forget jobs this long after they ended, with their kept output (30m, 36h, 14d, 2w; "
                        "a bare number is days; never: keep them until `proxy-agent forget`)")
    parser.add_argument("--show-ended", metavar="DURATION", type=_show_ended, default="24h",
                        help="show clients the jobs that ended this long ago at most (30m, 24h, 7d; a bare number "
                        "is hours; all: every job the store keeps); older ones stay in `proxy-agent jobs`")
    parser.add_argument("--token-file", metavar="PATH",
                        help="where --listen writes its generated token (mode 0600; default ~/.proxy-agent/token)")
    parser.add_argument("--auth-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="--listen/--unix: seconds a connection may take to complete INIT")
    parser.add_argument("--log-file", metavar="PATH", help="write the log here (mode 0600) instead of stderr")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for protocol detail)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--broker", metavar="NAME",
                        help="the broker for submissions that name several queues or none: "
                        f"{broker_choices(arguments=True, last=' or ')}; without one, the first queue named that can "
                        "run the job, or the default queue")
    parser.add_argument("--broker-config", metavar="FILE",
                        help="benchmark figures per queue for the Benchmark broker (INI: [SCHEDULER:QUEUE] sections "
                        "of BENCHMARK = FIGURE lines)")
    runtime = parser.add_argument_group("the runtime of co-allocated multi-part jobs")
    runtime.add_argument("--runtime-socket", metavar="PATH",
                         help="the Unix socket the processes of multi-part jobs on this host reach the agent at "
                         "(default: runtime.sock in the state directory)")
    runtime.add_argument("--runtime-tcp", metavar="HOST[:PORT]|auto|none", default="auto",
                         help="where processes on other hosts reach the agent; auto: the addresses this host's name "
                         "(or --runtime-advertise) resolves to, any port, when a batch scheduler runs; 0.0.0.0 or :PORT "
                         "for every interface")
    runtime.add_argument("--runtime-advertise", metavar="NAME",
                         help="the host name compute nodes reach the agent by (default: this host's name)")
    for name in BACKENDS:
        if backends is None or name in backends:
            backend_class(name).add_arguments(parser)


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def duration_seconds(text: str, bare_unit: str, forever: str) -> Optional[float]:
    """``90m``, ``36h``, ``14d``, ``2w`` (a bare number counts in ``bare_unit``) as seconds;
    the word ``forever`` as None (no limit).  ValueError for anything else."""
    raw = text.strip().lower()
    if raw == forever:
        return None
    unit = raw[-1:] if raw[-1:] in _DURATION_UNITS else bare_unit
    number = raw[:-1] if raw[-1:] in _DURATION_UNITS else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration such as 90m, 36h, 14d or {forever}") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r}: a duration must be more than 0 ({forever} for no limit)")
    return value * _DURATION_UNITS[unit]


def _keep_ended(text: str) -> Optional[float]:
    return duration_seconds(text, "d", "never")


def _show_ended(text: str) -> Optional[float]:
    return duration_seconds(text, "h", "all")


# argparse names the type in its message: "invalid duration value: '3x'"
_keep_ended.__name__ = _show_ended.__name__ = "duration"


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, parsed.  Start-up imports only the backends it names: the options are
    parsed with theirs first, and with every backend's (as ``--help`` shows them) only when
    something is left over, so what is accepted and every message are the same."""
    requested = _requested_schedulers(argv)
    if requested is not None:
        simple = _SimpleLine(requested).parse(argv)
        if simple is not None and all(name.strip() in requested for name in simple.scheduler.split(",")):
            simple.parsed_backends = requested
            return simple
        args, rest = build_parser(requested).parse_known_args(argv)
        names = [name.strip() for name in args.scheduler.split(",")]
        if not rest and all(name in requested for name in names):
            args.parsed_backends = requested
            return args
    args = build_parser().parse_args(argv)
    args.parsed_backends = list(BACKENDS)
    return args


class _SimpleLine(SimpleLine):
    """The agent's options (those of the backends named) as :class:`SimpleLine` reads them."""

    def __init__(self, backends: Sequence[str]) -> None:
        super().__init__()
        _add_options(self, backends)


def _requested_schedulers(argv: Sequence[str]) -> Optional[List[str]]:
    """The backends ``--scheduler`` names (the default's when absent), or None when the command
    line must be read with every backend's options (help, or anything unclear)."""
    value = "local"
    for i, arg in enumerate(argv):
        if arg in ("-h", "--help") or arg == "--":
            return None
        if arg == "--scheduler":
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
        elif arg.startswith("--scheduler="):
            value = arg.partition("=")[2]
        elif arg.startswith("--sch") and "--scheduler".startswith(arg.partition("=")[0]):
            return None  # an abbreviation: leave it to argparse
    names = [name.strip() for name in value.split(",")]
    if not all(name in BACKENDS for name in names):
        return None
    return names


def _scheduler_names(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ValueError(f"--scheduler {text!r}: empty scheduler name")
    seen: List[str] = []
    for name in names:
        if name not in BACKENDS:
            raise ValueError(f"unknown scheduler {name!r} (available: {', '.join(BACKENDS)})")
        if name in seen:
            raise ValueError(f"scheduler {name!r} is given twice")
        seen.append(name)
    return seen


def _setup_logging(args: argparse.Namespace) -> None:
    verbose = max(args.verbose, args.debug)
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler: logging.Handler
    if args.log_file:
        try:
            fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ValueError(f"cannot open the log file {args.log_file}: {exc.strerror or exc}") from None
        handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8"))
        level = min(level, logging.INFO)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s proxy-agent[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def build_service(args: argparse.Namespace, names: Sequence[str], state: "StateDir") -> JobService:
    """The service with its backends, options checked (ValueError naming a bad one)."""
    service = JobService(store=state.store, keep_ended=args.keep_ended, show_ended=args.show_ended)
    for name in names:
        cls = backend_class(name)
        options = cls.options_from_args(args)
        context = service.context(all_users=args.all_users, state_dir=state.directory if state.usable else None)
        service.add_backend(cls(service.model, options, context))
    CoallocManager(service, runtime_settings(args, names, state))
    return service


def runtime_settings(args: argparse.Namespace, names: Sequence[str], state: "StateDir") -> RuntimeSettings:
    """Where the runtime of multi-part jobs listens (ValueError naming a bad option)."""
    unix_path = args.runtime_socket
    if unix_path is None and state.usable:
        candidate = os.path.join(state.directory, "runtime.sock")
        if len(candidate.encode()) < 100:  # longer paths do not fit a Unix socket address
            unix_path = candidate
    if unix_path is not None:
        unix_path = os.path.abspath(unix_path)
    tcp = (args.runtime_tcp or "auto").strip()
    tcp_host: Optional[str] = None
    tcp_port = 0
    if tcp == "auto":
        if any(name not in ("local", "sim") for name in names):
            tcp_host = "auto"  # the addresses compute nodes reach this host by (see RuntimeServer)
    elif tcp != "none":
        host, sep, port = tcp.rpartition(":")
        if not sep:
            host, port = tcp, "0"
        try:
            tcp_port = int(port)
        except ValueError:
            raise ValueError(f"--runtime-tcp {tcp!r}: the port must be a number") from None
        if not 0 <= tcp_port <= 65535:
            raise ValueError(f"--runtime-tcp {tcp!r}: the port must be 0 to 65535")
        tcp_host = host or "0.0.0.0"
    return RuntimeSettings(unix_path=unix_path, tcp_host=tcp_host, tcp_port=tcp_port,
                           advertise_host=args.runtime_advertise)


class StateDir:
    """The agent's state directory: its lock, its job store, and why it cannot be used."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = StateLock(directory)
        self.store: Optional[JobStore] = None
        #: a problem to tell clients (the store cannot be used), or None
        self.problem: Optional[str] = None
        self.usable = False

    def take(self) -> None:
        """Lock the directory and open its store; StateDirInUse if another agent holds it.
        Any other problem leaves the agent without a store (said in :attr:`problem`)."""
        try:
            self.lock.acquire({"pid": os.getpid()})
        except StateDirInUse:
            raise
        except (StoreError, OSError) as exc:
            self.problem = (f"the state directory cannot be used ({_message(exc)}); jobs will not survive a restart, "
                            "nor will their output be kept")
            return
        self.usable = True
        try:
            self.store = open_store(self.directory)
        except StoreUnwritable as exc:
            self.problem = (f"the job store cannot be used now ({exc.message}); it is left as it is for the next "
                            "agent, and jobs submitted to this one will not survive a restart, nor will their "
                            "output be kept")
            return
        except StoreError as exc:
            self.problem = (f"the job store cannot be used ({exc.message}); jobs will not survive a restart, nor "
                            "will their output be kept")
            return
        damaged = self.store.damaged_copy
        if damaged:
            self.problem = (f"the job store could not be read ({self.store.damage}); it was kept as {damaged}, a new "
                            "one was started, and the jobs the old one held are not followed")

    def advertise(self, unix: Optional[str]) -> None:
        about = {"pid": os.getpid()}
        if unix:
            about["unix"] = unix
        try:
            self.lock.update(about)
        except OSError:
            pass


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or getattr(exc, "strerror", None) or str(exc)


async def _watch_signals(scope: trio.CancelScope, sessions: Sessions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            log.info("received %s, shutting down", name)
            await sessions.farewell(f"the agent received {name} and is shutting down")
            scope.cancel()
            return


async def _open_transport(args: argparse.Namespace, config: PtpConfig, signals: Signals):
    """Connect or start listening; returns (kind, stream-or-listeners, config)."""
    if args.connect or args.proxy:
        if args.proxy:
            if not args.host or not args.port:
                raise ValueError("--proxy=tcp needs --host=HOST and --port=PORT")
            host, port = parse_host_port(f"{args.host}:{args.port}")
        else:
            host, port = parse_host_port(args.connect)
        try:
            stream = await connect_tcp(host, port)
        except OSError as exc:
            raise OSError(f"cannot connect to {host}:{port}: {_reason(exc)}") from None
        log.info("connected to %s:%d", host, port)
        return "connect", stream, config
    if args.listen:
        import attrs

        host, port = parse_host_port(args.listen, default_host="127.0.0.1", allow_zero=True)
        token, path = load_or_create_token(args.token_file, args.env_token)
        try:
            listeners = await open_tcp_listeners(host, port)
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {_reason(exc)}") from None
        for listener in listeners:
            addr = listener.socket.getsockname()
            print(f"proxy-agent listening on {addr[0]}:{addr[1]}", file=sys.stderr, flush=True)
        if path:
            print(f"proxy-agent token written to {path}", file=sys.stderr, flush=True)
        return "listen", listeners, attrs.evolve(config, token=token)
    if args.unix:
        try:
            listener = await open_unix_listener(args.unix)
        except OSError as exc:
            raise OSError(f"cannot listen on {args.unix}: {_reason(exc)}") from None
        signals.made(args.unix)
        print(f"proxy-agent listening on {args.unix}", file=sys.stderr, flush=True)
        return "unix", [listener], config
    return "stdio", open_stdio(), config


def _reason(exc: OSError) -> str:
    return os_error_reason(exc)


async def _run_agent(args: argparse.Namespace, service: JobService, state: "StateDir", signals: Signals) -> int:
    """:func:`amain`, cancelled by a signal until it watches for them itself (a signal at any
    moment of start-up ends the agent cleanly); its socket files removed however it ends."""
    with trio.CancelScope() as scope:
        token = trio.lowlevel.current_trio_token()
        signals.to_function(lambda number: token.run_sync_soon(scope.cancel))
        try:
            return await amain(args, service, state, signals)
        finally:
            signals.hold()
            signals.remove_made()
    log.info("stopped by %s while starting", signals.name or "a signal")
    return 0


async def amain(args: argparse.Namespace, service: JobService, state: "StateDir", signals: Signals) -> int:
    config = PtpConfig()
    try:
        kind, transport, config = await _open_transport(args, config, signals)
    except (OSError, ValueError) as exc:
        print(f"proxy-agent: {exc}", file=sys.stderr)
        return 2
    local_listener = None
    if state.usable:
        # Tools on this host (the console, the Invoke Server) reach the agent here.
        path = os.path.join(state.directory, "agent.sock")
        try:
            local_listener = await open_unix_listener(path)
            signals.made(path)
            state.advertise(path)
        except OSError as exc:
            log.warning("cannot listen on %s: %s", path, exc)
    if state.problem:
        service.tell_every_client("WARNING", state.problem)
    limits = ServerLimits(auth_timeout=args.auth_timeout)
    sessions = Sessions()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, scope, sessions)
            await nursery.start(service.run)
            if local_listener is not None:
                nursery.start_soon(serve_listeners, [local_listener], service, PtpConfig(), limits, sessions)
            if kind == "connect":
                await serve_stream(transport, service, config, args.connect or f"{args.host}:{args.port}", sessions)
            elif kind == "stdio":
                await serve_stream(transport, service, config, "stdio client", sessions)
            else:
                try:
                    await serve_listeners(transport, service, config, limits, sessions, plan_ahead=True)
                    await trio.sleep_forever()
                finally:
                    if kind == "unix":
                        try:
                            os.unlink(args.unix)
                        except OSError:
                            pass
            nursery.cancel_scope.cancel()
    if local_listener is not None:
        try:
            os.unlink(os.path.join(state.directory, "agent.sock"))
        except OSError:
            pass
    return 0


def configured(argv: List[str]) -> List[str]:
    """The command line with the configuration file's options in front (the command line's
    own win, being later); unchanged when there is no file (the usual case costs one stat).
    ConfigError naming the file for a key or value it cannot take."""
    from .config import ConfigError, config_arguments, config_path

    path = config_path()
    if path is None or not os.path.exists(path) or any(a in ("-h", "--help", "--version") for a in argv):
        return argv  # (help and version are said whatever the file holds)
    parser = build_parser()
    words = config_arguments(parser, list(BACKENDS), path)
    if words:
        def refuse(message: str) -> NoReturn:
            raise ConfigError(f"{path}: {message}")

        parser.error = refuse  # type: ignore[method-assign]
        parser.parse_args(words)  # its values checked alone, so that an error names the file
    return words + argv


def idle_exit_seconds(text: Optional[str]) -> Optional[float]:
    """``--idle-exit``'s value in seconds (None: never); ValueError naming a bad one."""
    if text is None:
        return DEFAULT_IDLE_EXIT
    if text.strip().lower() == "never":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--idle-exit {text!r}: expected seconds or never") from None
    if not 0 <= value <= 366 * 86400:
        raise ValueError(f"--idle-exit must be between 0 seconds and a year, or never, got {text}")
    return value


def check_arguments(args: argparse.Namespace) -> List[str]:
    """Check what the parser cannot (ValueError naming a bad option); returns the schedulers."""
    names = _scheduler_names(args.scheduler)
    for name in args.parsed_backends:
        # A bad value is refused even for a backend not selected, never silently ignored
        # (a backend's options given on the command line are always among those parsed).
        backend_class(name).options_from_args(args)
    if not 0 < args.auth_timeout <= 3600:
        raise ValueError(f"--auth-timeout must be between 0 and 3600 seconds, got {args.auth_timeout:g}")
    if (args.host or args.port) and not args.proxy:
        raise ValueError("--host and --port go with --proxy=tcp")
    idle_exit_seconds(args.idle_exit)
    return names


def given_options(argv: Sequence[str], backends: Sequence[str]) -> Dict[str, Any]:
    """The options ``argv`` gives (dest -> value, as parsed), without those left at their
    defaults: what a launch asked for in so many words."""
    simple = _SimpleLine(backends).parse_given(argv)
    if simple is not None:
        args, given = simple
        return {dest: getattr(args, dest) for dest in given}
    import argparse

    key = tuple(backends)
    parser = _GIVEN_PARSERS.get(key)
    if parser is None:
        parser = _GIVEN_PARSERS[key] = build_parser(backends)
        for action in parser._actions:
            action.default = argparse.SUPPRESS
    given, _ = parser.parse_known_args(list(argv))
    return vars(given)


#: parsers that leave out what is not given, per list of backends
_GIVEN_PARSERS: Dict[tuple, Any] = {}


def read_full_command_line(argv: Sequence[str]):
    """The command line read in full (what the launching process cannot read by itself):
    help and the version are printed (exit 0), a mistake is one line (exit 2); returns what
    the launch needs of it."""
    from .launch import LaunchLine

    try:
        args = parse_arguments(list(argv))
        check_arguments(args)
    except (CommandLineError, ValueError) as exc:
        text = str(exc)
        print(text if text.startswith("proxy-agent") else f"proxy-agent: {text}", file=sys.stderr)
        raise SystemExit(2) from None
    return LaunchLine.from_arguments(args)


def run_private(argv: Sequence[str], signals: Optional[Signals] = None) -> int:
    """An agent of its own, in this process, on its own transport (see the module's
    description).  ``signals``: the launch's (taken here when None)."""
    own = signals is None
    if signals is None:
        signals = Signals().install()
    try:
        return _run_private(argv, signals)
    except Stopped:
        return 0
    finally:
        signals.hold()
        signals.remove_made()
        if own:
            signals.restore()


def _run_private(argv: Sequence[str], signals: Signals) -> int:
    try:
        args = parse_arguments(list(argv))
        names = check_arguments(args)
        _setup_logging(args)
        state = StateDir(os.path.abspath(args.state_dir or default_state_dir()))
        try:
            state.take()
        except StateDirInUse as exc:
            print(f"proxy-agent: {exc.message}", file=sys.stderr)
            return 2
        service = build_service(args, names, state)
        service.brokering.configure(args.broker, args.broker_config)
    except (CommandLineError, ValueError) as exc:
        text = str(exc)
        print(text if text.startswith("proxy-agent") else f"proxy-agent: {text}", file=sys.stderr)
        return 2
    args.env_token = os.environ.pop(TOKEN_VARIABLE, None)
    signals.hold()  # from here a signal is noted, and cancels the agent once trio runs
    try:
        return trio.run(_run_agent, args, service, state, signals)
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError) as exc:  # set-up failures not caught above
        print(f"proxy-agent: {exc}", file=sys.stderr)
        return 2


def main(argv: Optional[List[str]] = None) -> int:
    """``proxy-agent``: see :func:`proxy_agent.launch.entry`."""
    from .launch import entry

    return entry(sys.argv[1:] if argv is None else argv)
