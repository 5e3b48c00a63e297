"""The test sshd of scripts/sshd-up, for tests marked ``ssh``.

:func:`sshd_settings` finds the running server the way scripts/sshd-env does.  When it is not
running, tests skip, except under CI (CI=true), where :func:`ensure_sshd` starts it (and the
caller stops it again at the end), so that the ssh tests always run in CI.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, Optional

import attrs

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


def ensure_sshd() -> bool:
    """Under CI, start the server if it is not up; True if this call started it."""
    if sshd_settings() is not None or os.environ.get("CI") != "true":
        return False
    result = subprocess.run([str(ROOT / "scripts" / "sshd-up")], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/sshd-up failed under CI:\n{result.stderr}")
    return True


def stop_sshd() -> None:
    subprocess.run([str(ROOT / "scripts" / "sshd-down")], capture_output=True, text=True, timeout=120)
