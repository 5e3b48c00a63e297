"""A small disk for tests of what happens when it is full: a tmpfs of a given size, mounted
by the test and removed by it (root only; CI runs as root), and a file that fills it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (made if missing) for the block; unmounted
    after it (lazily if something still holds it), the directory left empty."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a small tmpfs, which only root can mount (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)  # a process that used it is still ending
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the disk of ``directory`` up to ``leave`` bytes short of full, with one file;
    its path (remove it to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
            if free <= leave:
                break
            try:
                os.write(fd, chunk[:max(1, min(len(chunk), free - leave))])
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    break
                raise
    finally:
        os.close(fd)
    return filler


def free_bytes(directory: Path) -> int:
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize
