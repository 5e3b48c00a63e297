"""The service's log: its own file in the state directory (:class:`ServiceLog`), and each
launch's route (:class:`LogRoute`: the launch's stderr or ``--log-file``), which hears what its
clients' sessions log, as an agent of its own would have written it there."""

from __future__ import annotations

import contextvars
import io
import logging
import os
import sys
from typing import Optional, Set

__all__ = ["LOG_LIMIT", "LOG_NAME", "LOG_ROUTE", "LogRoute", "LogRoutes", "ServiceLog", "detach"]

#: The service's log in the state directory, and where it goes once it is this large.
LOG_NAME = "agent.log"
LOG_LIMIT = 8 << 20

#: The log route of the task that logs (a launch's ``-v``/``--log-file``), see :class:`LogRoutes`.
LOG_ROUTE: contextvars.ContextVar[Optional["LogRoute"]] = contextvars.ContextVar("proxy_agent_log_route", default=None)

_FORMAT = "%(asctime)s proxy-agent[%(process)d] %(levelname)s %(name)s: %(message)s"


class LogRoute:
    """Where one launch wants the log of its sessions: a descriptor it passed (its stderr or
    its ``--log-file``), and the least level it wants."""

    def __init__(self, fd: int, level: int) -> None:
        self.fd = fd
        self.level = level
        self.dropped = 0
        try:
            os.set_blocking(fd, False)  # a launch whose stderr nobody reads must not stop the service
        except OSError:
            pass

    def write(self, line: str) -> None:
        if self.fd < 0:
            return
        data = (line + "\n").encode("utf-8", "replace")
        if self.dropped:
            data = f"... {self.dropped} lines of the log were dropped (nobody read them)\n".encode() + data
        try:
            os.write(self.fd, data)
            self.dropped = 0
        except BlockingIOError:
            self.dropped += 1
        except OSError:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class LogRoutes(logging.Handler):
    """Sends each record logged in a launch's tasks to that launch's route as well, and each
    record the service logs for no launch in particular (its schedulers, say) to every route:
    a launch's log shows what an agent of its own would have logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(_FORMAT))
        self.live: Set[LogRoute] = set()
        self.base_level = logging.INFO

    def emit(self, record: logging.LogRecord) -> None:
        route = LOG_ROUTE.get()
        routes = self.live if route is None else (route,)
        text = None
        for each in routes:
            if record.levelno < each.level:
                continue
            try:
                if text is None:
                    text = self.format(record)
                each.write(text)
            except Exception:  # noqa: BLE001 - logging must never fail the service
                pass

    def add(self, route: LogRoute) -> None:
        self.live.add(route)
        self._level()

    def remove(self, route: LogRoute) -> None:
        self.live.discard(route)
        route.close()
        self._level()

    def _level(self) -> None:
        levels = [self.base_level] + [route.level for route in self.live]
        logging.getLogger().setLevel(min(levels))


class ServiceLog(logging.Handler):
    """The service's own log file (mode 0600), moved to ``agent.log.1`` once it is large."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self.path = path
        self.setFormatter(logging.Formatter(_FORMAT))
        self.fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            os.write(self.fd, (self.format(record) + "\n").encode("utf-8", "replace"))
            if os.fstat(self.fd).st_size > LOG_LIMIT:
                os.replace(self.path, self.path + ".1")
                old, self.fd = self.fd, self._open()
                os.dup2(self.fd, 2)
                os.close(old)
        except Exception:  # noqa: BLE001
            pass


def detach(log_fd: int) -> None:
    """From now on stdin is /dev/null and stdout and stderr go into the log (what a user's
    broker module prints, say): the launch that started the service waits for its stderr to
    close (the service is ready), and nothing of the service may hold a launch's terminal or
    ssh channel."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
