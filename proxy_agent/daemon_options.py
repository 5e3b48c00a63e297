"""A launch's command line applied to the running service: the service-wide options are set by
the first launch, the schedulers a launch names are added with its options for them, and what a
later launch asks for that the service cannot apply is named (:class:`LaunchOptions`).  Also
the service's own command line (``proxy-agent service``)."""

from __future__ import annotations

import copy
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs

from .__main__ import (
    DEFAULT_IDLE_EXIT,
    CommandLineError,
    StateDir,
    build_parser,
    check_arguments,
    given_options,
    idle_exit_seconds,
    parse_arguments,
    runtime_settings,
)
from .schedulers.registry import backend_class
from .service.jobs import ErrorKind, ServiceError
from .service.service import JobService

__all__ = ["Applied", "LaunchOptions", "backend_dests", "read_launch", "service_command_line"]

log = logging.getLogger("proxy_agent.daemon")

#: Options that are the service's, one value for all: set by the first launch; a later
#: launch giving another value is told it was not applied.
SERVICE_OPTIONS = ("broker", "broker_config", "runtime_socket", "runtime_tcp", "runtime_advertise", "idle_exit",
                   "keep_ended", "show_ended")
#: Options that belong to each backend beside its own (``--all-users``).
BACKEND_COMMON = ["all_users"]
#: Options given as paths, resolved against the launch's working directory.
PATH_OPTIONS = ("broker_config", "runtime_socket")


@attrs.frozen
class Applied:
    """What became of a launch's options: the schedulers it prefers, and a line naming those
    not applied and why (None: all were)."""

    prefer: Tuple[str, ...]
    note: Optional[str]


class LaunchOptions:
    """The options of the service's launches: the service-wide ones (one value for all, set by
    the first launch) and each scheduler's (set by the launch that added it)."""

    def __init__(self, service: JobService, state: StateDir, idle_exit: Optional[float]) -> None:
        self.service = service
        self.state = state
        self.idle_exit = idle_exit
        #: the values of the service-wide options (set by the first launch), dest -> value
        self._service_values: Optional[Dict[str, Any]] = None
        #: backend name -> the values of its options it was started with
        self._backend_values: Dict[str, Dict[str, Any]] = {}
        self._flags: Dict[str, str] = {}
        #: the first launch's options, which the runtime of multi-part jobs is set up from
        self._runtime_args: Optional[Any] = None

    def apply(self, argv: List[str], cwd: Optional[str]) -> Tuple[Any, "Applied", List[str]]:
        """Read a launch's command line and bring the service to it: the schedulers it lacks
        are added; what it cannot apply is named.  ServiceError (BAD_REQUEST) with the line to
        show for a command line that cannot be used.  Also the schedulers it added."""
        try:
            args, names, given = read_launch(argv)
        except (CommandLineError, ValueError) as exc:
            text = str(exc)
            raise ServiceError(text if text.startswith("proxy-agent") else f"proxy-agent: {text}",
                               ErrorKind.BAD_REQUEST) from None
        for dest in PATH_OPTIONS:
            value = getattr(args, dest, None)
            if value and cwd and not os.path.isabs(value):
                value = os.path.join(cwd, value)
                setattr(args, dest, value)
                if dest in given:
                    given[dest] = value
        notes: List[str] = []
        try:
            self._apply_service_options(args, given, notes)
            added = self._apply_backends(args, names, given, notes)
        except ValueError as exc:
            raise ServiceError(f"proxy-agent: {exc}", ErrorKind.BAD_REQUEST) from None
        if added:
            self._update_runtime()
        note = None
        if notes:
            note = (f"this launch joined the running service of {self.state.directory} (process {os.getpid()}), "
                    f"which keeps its own settings; not applied: {'; '.join(notes)}")
        return args, Applied(tuple(names), note), added

    def _apply_service_options(self, args, given: Dict[str, Any], notes: List[str]) -> None:
        brokering = self.service.brokering
        if self._service_values is None:
            brokering.configure(args.broker, args.broker_config)  # ValueError naming a bad one
            # how long ended jobs are shown and kept: before any scheduler adopts its stored jobs
            self.service.keep_ended, self.service.show_ended = args.keep_ended, args.show_ended
            self._service_values = {dest: getattr(args, dest) for dest in SERVICE_OPTIONS if dest != "idle_exit"}
            self._service_values["idle_exit"] = self.idle_exit
            self._runtime_args = copy.copy(args)
            return
        if "broker" in given or "broker_config" in given:
            from .service.brokering import Brokering
            from .service.model import ServiceModel

            Brokering(ServiceModel()).configure(given.get("broker"), given.get("broker_config"))
        for dest in SERVICE_OPTIONS:
            if dest not in given:
                continue
            wanted = idle_exit_seconds(given[dest]) if dest == "idle_exit" else given[dest]
            current = self._service_values.get(dest)
            if wanted != current:
                shown = given[dest] if dest == "idle_exit" else _shown(given[dest], dest)
                notes.append(f"{self._flag(dest)}={shown} (the service has {_shown(current, dest)})")

    def _apply_backends(self, args, names: Sequence[str], given: Dict[str, Any], notes: List[str]) -> List[str]:
        service = self.service
        added = []
        for name in names:
            if name in service.failures:
                service.remove_failed_backend(name)
                self._backend_values.pop(name, None)
            dests = backend_dests(name) + BACKEND_COMMON
            if name not in self._backend_values:
                cls = backend_class(name)
                # The service's local jobs outlive its end; each launch ends its own clients'
                # (see Door), so the backend itself always keeps them.
                backend_args = copy.copy(args)
                backend_args.on_disconnect = "keep"
                options = cls.options_from_args(backend_args)
                context = service.context(all_users=args.all_users,
                                          state_dir=self.state.directory if self.state.usable else None)
                service.start_backend(cls(service.model, options, context))
                self._backend_values[name] = {dest: getattr(args, dest, None) for dest in dests}
                added.append(name)
                log.info("the %s scheduler was added", name)
                continue
            current = self._backend_values[name]
            for dest in dests:
                if dest in given and given[dest] != current.get(dest) and dest != "on_disconnect":
                    notes.append(f"{self._flag(dest)}={_shown(given[dest])} (the service's {name} scheduler has "
                                 f"{_shown(current.get(dest), dest)})")
        return added

    def _update_runtime(self) -> None:
        """The runtime of multi-part jobs listens on TCP when a batch scheduler runs (with
        ``--runtime-tcp auto``): decided again as schedulers are added, until it starts."""
        manager = self.service.coalloc
        args = self._runtime_args
        if manager is None or args is None or manager.server is not None or manager.ready.is_set():
            return
        names = [backend.name for backend in self.service.backends]
        manager.settings = runtime_settings(args, names, self.state)

    def _flag(self, dest: str) -> str:
        if not self._flags:
            parser = build_parser()
            for action in parser._actions:
                longs = [o for o in action.option_strings if o.startswith("--")]
                if longs:
                    self._flags[action.dest] = longs[0]
        return self._flags.get(dest, "--" + dest.replace("_", "-"))


def _shown(value: Any, dest: Optional[str] = None) -> str:
    if dest == "idle_exit":
        return "never" if value is None else f"{value:g}"
    if dest in ("keep_ended", "show_ended"):
        from .service.service import duration_text

        if value is None:
            return "never" if dest == "keep_ended" else "all"
        return duration_text(value) if isinstance(value, (int, float)) else str(value)
    if value is None:
        return "its default"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


_BACKEND_DESTS: Dict[str, List[str]] = {}


class _Dests:
    """Collects the names (dests) of the options a backend adds, as argparse would name them."""

    def __init__(self) -> None:
        self.dests: List[str] = []

    def add_argument_group(self, *args: Any, **kwargs: Any) -> "_Dests":
        return self

    def add_mutually_exclusive_group(self, **kwargs: Any) -> "_Dests":
        return self

    def add_argument(self, *flags: str, **settings: Any) -> None:
        dest = settings.get("dest")
        if dest is None:
            longs = [flag for flag in flags if flag.startswith("--")]
            dest = (longs or list(flags))[0].lstrip("-").replace("-", "_")
        self.dests.append(dest)


def backend_dests(name: str) -> List[str]:
    """The options (dests) a backend adds to the command line."""
    dests = _BACKEND_DESTS.get(name)
    if dests is None:
        collector = _Dests()
        backend_class(name).add_arguments(collector)
        dests = _BACKEND_DESTS[name] = collector.dests
    return list(dests)


def read_launch(argv: Sequence[str]):
    """A launch's command line read as the agent reads its own: (arguments, schedulers, the
    options given in so many words).  CommandLineError or ValueError with the line to show."""
    try:
        args = parse_arguments(list(argv))
        names = check_arguments(args)
        given = given_options(argv, args.parsed_backends)
    except SystemExit:  # help or the version: the launching process answers those itself
        raise CommandLineError("proxy-agent: --help and --version are answered by the launch itself") from None
    return args, names, given


def service_command_line(argv: Sequence[str]):
    """The service's own command line: read by hand when it is what a launch writes (the
    service then starts without argparse), else by argparse."""
    words = list(argv)
    values: Dict[str, Any] = {"state_dir": None, "idle_exit": None, "check": None}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--check":
            values["check"] = words[i + 1:]
            break
        if word in ("--state-dir", "--idle-exit") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            values[word[2:].replace("-", "_")] = words[i + 1]
            i += 2
            continue
        return _parse_fully(argv)
    import types

    return types.SimpleNamespace(**values)


def _parse_fully(argv: Sequence[str]):
    import argparse

    parser = argparse.ArgumentParser(
        prog="proxy-agent service",
        description="The service of one state directory, which every proxy-agent launch on that directory "
        "joins. Launches start it when none runs; it runs in the foreground when started by hand.",
    )
    parser.add_argument("--state-dir", metavar="DIR", help="the state directory (default: the agent's)")
    parser.add_argument("--idle-exit", metavar="SECONDS|never",
                        help=f"leave after this long without a client and a running local job "
                        f"(default: {DEFAULT_IDLE_EXIT:g})")
    parser.add_argument("--check", nargs=argparse.REMAINDER, metavar="ARGV",
                        help="first check a launch's command line (the rest of the line), and stop with its "
                        "one-line error if it cannot be used")
    return parser.parse_args(list(argv))
