"""Reaching an agent on another machine: ssh and scp command lines, the default remote command,
and where the single-file agent is.

Nothing here runs a program; the synchronous client (:mod:`.sync`), the console and its
:mod:`proxy_agent.console.deploy` do that.
Every value that ends up in a remote shell's command line is quoted here.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import attrs

__all__ = [
    "SshTarget",
    "default_remote_command",
    "remote_command",
    "remote_path_word",
    "running_archive",
    "own_agent_argv",
    "find_pyz",
]

#: Where ``proxy-console deploy`` puts the file, relative to the remote home directory.
DEFAULT_REMOTE_PYZ = "proxy-agent.pyz"
#: How long ssh may take to reach the host.
CONNECT_TIMEOUT = 20

# One line of POSIX sh (a login shell may be csh: no newlines, no '!').  It runs the first of
# ~/proxy-agent.pyz, proxy-agent on PATH and ~/.local/bin/proxy-agent (where pipx puts it,
# often missing from the PATH of a non-interactive ssh command) with the agent's arguments.
_FIND_AGENT = (
    'if [ -x "$HOME/proxy-agent.pyz" ]; then exec "$HOME/proxy-agent.pyz" "$@"; fi; '
    'if command -v proxy-agent >/dev/null 2>&1; then exec proxy-agent "$@"; fi; '
    'if [ -x "$HOME/.local/bin/proxy-agent" ]; then exec "$HOME/.local/bin/proxy-agent" "$@"; fi; '
    'echo "proxy-agent: not found on $(hostname): no ~/proxy-agent.pyz, no proxy-agent on PATH '
    '($PATH) or in ~/.local/bin; copy it there with: proxy-console deploy HOST" >&2; exit 127'
)


def remote_path_word(path: str) -> str:
    """A remote path as one shell word: quoted, ``~/`` left to expand, bare names run from home."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    if "/" not in path:
        path = "./" + path  # relative to the home directory, not looked up on PATH
    return shlex.quote(path)


def remote_command(agent: str, args: Sequence[str]) -> str:
    """The command text ssh hands to the remote shell for ``--remote-agent AGENT``.

    ``agent`` may carry its own options (``"bin/proxy-agent.pyz --scheduler slurm"``); its
    first word is a path (see :func:`remote_path_word`), every word is quoted.
    """
    words = shlex.split(agent)
    if not words:
        raise ValueError("--remote-agent is empty")
    head = words[0]
    first = remote_path_word(head) if ("/" in head or head.endswith(".pyz")) else shlex.quote(head)
    return " ".join([first, *(shlex.quote(w) for w in words[1:]), *(shlex.quote(a) for a in args)])


def default_remote_command(args: Sequence[str]) -> str:
    """The command text that finds the agent on the remote side (see module text)."""
    return " ".join(["sh", "-c", shlex.quote(_FIND_AGENT), "proxy-agent", *(shlex.quote(a) for a in args)])


@attrs.frozen
class SshTarget:
    """A host as ssh sees it, with the options the console passes to ssh and scp."""

    destination: str
    config: Optional[str] = None
    port: Optional[int] = None
    options: Sequence[str] = ()
    batch: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.destination or self.destination.startswith("-") or any(c.isspace() for c in self.destination):
            raise ValueError(f"bad host {self.destination!r}: expected [USER@]HOST")

    @property
    def host(self) -> str:
        return self.destination.rpartition("@")[2]

    def _common(self, port_flag: str) -> List[str]:
        argv: List[str] = []
        if self.config:
            argv += ["-F", self.config]
        if self.port is not None:
            argv += [port_flag, str(self.port)]
        argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT}"]
        if self.batch:
            argv += ["-o", "BatchMode=yes"]
        for option in self.options:
            argv += ["-o", option]
        return argv

    def ssh(self, command: str) -> List[str]:
        """``ssh ... -T DEST -- COMMAND`` (no terminal: the protocol needs a clean byte stream)."""
        return ["ssh", *self._common("-p"), "-T", "--", self.destination, command]

    def scp(self, local: str, remote: str) -> List[str]:
        """``scp ... LOCAL DEST:REMOTE``, keeping the file's mode (it must stay executable)."""
        return ["scp", "-p", *self._common("-P"), "--", local, f"{self.destination}:{remote}"]


# --------------------------------------------------------------------------- the single file


def running_archive() -> Optional[str]:
    """The ``.pyz`` this code is running from, or None when it runs from a directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if parent.is_file():
            return str(parent)
    return None


def own_agent_argv(*extra: str) -> List[str]:
    """How to start this very agent: the archive it runs from, or ``python -m proxy_agent``."""
    archive = running_archive()
    if archive is not None:
        return [sys.executable, archive, *extra]
    return [sys.executable, "-m", "proxy_agent", *extra]


def find_pyz(given: Optional[str] = None) -> Path:
    """The single file to deploy: ``given``, the archive running now, or the checkout's dist/."""
    if given:
        path = Path(given)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {given}")
        return path
    archive = running_archive()
    if archive is not None:
        return Path(archive)
    built = Path(__file__).resolve().parents[2] / "dist" / "proxy-agent.pyz"
    if built.is_file():
        return built
    raise FileNotFoundError(f"no proxy-agent.pyz to copy: build one with scripts/build-pyz (makes {built}) or give --pyz PATH")


def describe_ssh_failure(destination: str, stderr_tail: str) -> str:
    """One line for ssh's own failure (status 255), from the last thing it said."""
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    reason = lines[-1] if lines else "no message"
    return f"ssh to {destination} failed: {reason}"


def ssh_exit_reason(destination: str, returncode: Optional[int], stderr_tail: str) -> Optional[str]:
    """What the exit status of ``ssh HOST AGENT`` means, in one line (None: nothing ssh's
    own: the agent itself ended)."""
    if returncode == 255:
        return describe_ssh_failure(destination, stderr_tail)
    if returncode == 127:
        return (f"no agent found on {destination}: copy it there with 'proxy-console deploy {destination}' "
                "or name it with --remote-agent PATH")
    return None


def environ_without_token() -> dict:
    """The environment for ssh and scp: the agent token never leaves with them."""
    env = dict(os.environ)
    env.pop("PROXY_AGENT_TOKEN", None)
    return env
