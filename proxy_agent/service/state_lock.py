"""The one agent of a state directory: :class:`StateLock` holds an exclusive lock on
``agent.lock`` (with the holder's pid and how to reach it written inside) for the agent's life."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from typing import Any, Dict, Optional

from ..endpoints import read_lock_holder as _read_holder
from .store_file import StoreError

log = logging.getLogger("proxy_agent.service.store")

__all__ = ["StateDirInUse", "StateLock"]


class StateDirInUse(StoreError):
    """Another agent holds the state directory."""

    def __init__(self, message: str, holder: Dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder



class StateLock:
    """The one agent of a state directory: an exclusive ``flock`` on ``agent.lock``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "agent.lock")
        self._fd: Optional[int] = None

    def acquire(self, about: Dict[str, Any]) -> None:
        """Take the lock, writing ``about`` (pid, how to reach this agent) into the file;
        :class:`StateDirInUse` naming the holder when another agent has it."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the state directory {self.directory}: {exc.strerror or exc}") from None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                pid = holder.get("pid", "another process")
                where = holder.get("unix")
                hint = f"; connect to it: proxy-console --unix {where}" if where else ""
                raise StateDirInUse(
                    f"the state directory {self.directory} is in use by proxy-agent process {pid}{hint}", holder
                ) from None
            raise StoreError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        self.update(about)

    def update(self, about: Dict[str, Any]) -> None:
        """Say who holds the lock; the lock holds without it (a full disk may refuse the
        bytes: then a second agent is told the directory is in use, without the pid)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, json.dumps(about).encode(), 0)
            except OSError as exc:
                log.warning("cannot write who holds %s: %s", self.path, exc.strerror or exc)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

