"""The test sshd of scripts/sshd-up, for tests marked ``ssh``.

:func:`sshd_settings` finds the running server the way scripts/sshd-env does.  The tests run
when ``PROXY_AGENT_TEST_CLUSTERS`` asks for them (see ``cluster_support``); then a server that
is not up fails them, with the reason (:func:`require_sshd`).

The server's two test accounts are shared by everyone on the machine, and what the tests put
there (the agent's single file at ``~/proxy-agent.pyz``, where ``proxy-console --ssh`` looks
for it, and the remote agents' state directory) would clash with another run doing the same
at the same time.  :func:`accounts_of_our_own` gives one run the accounts at a time, and
takes away what it left in them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import attrs

import cluster_support
import leftover_support
from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen
class Sshd:
    directory: Path
    config: str
    host: str
    banner_host: str
    port: int
    user: str
    banner_user: str
    key: str
    known_hosts: str

    def ide_ssh(self, user: str, command: str) -> list:
        """ssh as an IDE runs it: explicit port, key and host key file, no config file."""
        return [
            "ssh", "-p", str(self.port), "-i", self.key,
            "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "-T", f"{user}@127.0.0.1", command,
        ]

    def ide_scp(self, local: str, user: str, remote: str = "") -> list:
        return [
            "scp", "-q", "-p", "-P", str(self.port), "-i", self.key,
            "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            local, f"{user}@127.0.0.1:{remote}",
        ]


def state_dir() -> Path:
    return Path(os.environ.get("PROXY_AGENT_SSHD_DIR") or "/tmp/proxy-agent-sshd")


def sshd_settings() -> Optional[Sshd]:
    directory = state_dir()
    try:
        pid = (directory / "sshd.pid").read_text().strip()
        if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
            return None
        lines = (directory / "env").read_text().splitlines()
    except (OSError, ValueError):
        return None
    values: Dict[str, str] = {}
    for line in lines:
        key, _, value = line.removeprefix("export ").partition("=")
        values[key] = value
    return Sshd(
        directory=directory,
        config=values["PROXY_AGENT_SSH_CONFIG"],
        host=values["PROXY_AGENT_SSH_HOST"],
        banner_host=values["PROXY_AGENT_SSH_BANNER_HOST"],
        port=int(values["PROXY_AGENT_SSH_PORT"]),
        user=values["PROXY_AGENT_SSH_USER"],
        banner_user=values["PROXY_AGENT_SSH_BANNER_USER"],
        key=values["PROXY_AGENT_SSH_KEY"],
        known_hosts=values["PROXY_AGENT_SSH_KNOWN_HOSTS"],
    )


def _unusable() -> Optional[str]:
    if os.geteuid() != 0:
        return "the ssh tests need root (the test key is root's)"
    if sshd_settings() is None:
        return f"the test sshd is not up (no live sshd.pid in {state_dir()}); run scripts/sshd-up"
    return None


def require_sshd() -> Sshd:
    """The running test server; skips when the ssh tests are off, fails when it is not up."""
    cluster_support.require("ssh", _unusable)
    settings = sshd_settings()
    assert settings is not None
    return settings


def _homes(sshd: Sshd) -> List[Path]:
    return [sshd.directory / "home" / user for user in (sshd.user, sshd.banner_user)]


def _contents(homes: List[Path]) -> Set[Path]:
    found = set()
    for home in homes:
        for top, dirs, files in os.walk(home):
            found.update(Path(top, name) for name in dirs + files)
    return found


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _user_processes(users: List[str], since: float) -> Dict[int, str]:
    """Processes of ``users`` started since ``since`` (seconds after boot): pid -> command."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "-u", ",".join(users)], capture_output=True, text=True,
                         timeout=scaled(30)).stdout
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for line in out.splitlines():
        pid, _, command = line.strip().partition(" ")
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        started = int(stat.rsplit(")", 1)[1].split()[19]) / ticks
        if started >= since:
            found[int(pid)] = command.strip()
    return found


@contextmanager
def accounts_of_our_own(sshd: Sshd, wait: float = 600) -> Iterator[None]:
    """While the block runs, no other test run uses the server's test accounts (a lock in the
    server's state directory, waited for up to ``wait`` seconds, scaled).  Afterwards the
    accounts' processes started meanwhile must have ended (any still running are ended and
    reported as left behind by the run), and what the block added to their homes is removed.
    Everything that uses the accounts in tests must run inside this block."""
    with open(sshd.directory / "tests.lock", "a") as lock:
        deadline = time.monotonic() + scaled(wait)
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise AssertionError(f"another test run held the ssh test accounts for {scaled(wait):g} s") from None
                time.sleep(0.5)
        homes = _homes(sshd)
        before = _contents(homes)
        since = _uptime()
        try:
            yield
        finally:
            users = [sshd.user, sshd.banner_user]
            left = leftover_support.wait_for_ends(lambda: _user_processes(users, since),
                                                  scaled(leftover_support.PROCESS_GRACE))
            for pid, command in left.items():
                leftover_support.note(leftover_support.Leftover("process", str(pid), f"{command} (an ssh test account's)"))
                subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)
            for path in sorted(_contents(homes) - before, reverse=True):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
