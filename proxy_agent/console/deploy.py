"""``proxy-console deploy [USER@]HOST``: copy the single-file agent to a host and check it starts.

Three steps, one line each as they succeed:

1. ``copied dist/proxy-agent.pyz to HOST:proxy-agent.pyz (912,345 bytes)`` (scp, mode kept);
2. ``Python found on HOST: 3.11.2 (/usr/bin/python3)`` (the file's launcher reports the
   interpreter it settled on, after looking for a newer one if the first was too old);
3. ``agent answered INIT on HOST`` (a real session over ssh: INIT, then QUIT).

The first step that fails says why in one line and the command exits with status 3.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import List, Optional, Sequence

import trio

from ..client import AgentClient, AgentExited, ClientError, ProtocolViolationError
from .diagnose import garbage_before_first_frame, shown_bytes
from .options import HelpFormatter, Parser, add_ssh_options
from ..client.remote import (
    DEFAULT_REMOTE_PYZ,
    SshTarget,
    describe_ssh_failure,
    environ_without_token,
    find_pyz,
    remote_path_word,
)

__all__ = ["main", "build_parser"]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAILED = 3
#: Time limits (seconds) for the copy and for each check.
COPY_TIMEOUT = 300.0
CHECK_TIMEOUT = 60.0

_INFO = re.compile(r"^proxy-agent (\S+) python (\S+) (.+) archive (.+)$")


class DeployError(Exception):
    """A step failed; the text is the one line shown."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="proxy-console deploy",
        description="Copy the single-file agent (proxy-agent.pyz) to HOST with scp and check that it starts there: "
        "one line for the copy, one for the Python it found, one for the agent's answer to INIT.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("destination", metavar="[USER@]HOST", help="where to copy it (as ssh understands it)")
    parser.add_argument(
        "--pyz", metavar="FILE",
        help="the file to copy (when not given: the single file running now, else dist/proxy-agent.pyz of this checkout)",
    )
    parser.add_argument(
        "--remote-path", default=DEFAULT_REMOTE_PYZ, metavar="PATH",
        help="where to put it on HOST (relative paths are in the home directory)",
    )
    add_ssh_options(parser)
    return parser


async def _run(argv: List[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        with trio.fail_after(timeout):
            return await trio.run_process(
                argv, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False,
                env=environ_without_token(),
            )
    except trio.TooSlowError:
        raise DeployError(f"{argv[0]} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise DeployError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _last_line(data: bytes) -> str:
    """What a failed ssh or scp said, as one line (its lines joined by '; ')."""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return shown_bytes("; ".join(lines[-4:]).encode(), limit=400) if lines else "no message"


async def copy(target: SshTarget, local: str, remote: str) -> str:
    result = await _run(target.scp(local, remote), COPY_TIMEOUT)
    if result.returncode != 0:
        raise DeployError(f"copying {local} to {target.destination}:{remote} failed: {_last_line(result.stderr)}")
    size = os.path.getsize(local)
    return f"copied {local} to {target.destination}:{remote} ({size:,} bytes)"


async def check_python(target: SshTarget, remote: str) -> str:
    result = await _run(target.ssh(f"{remote_path_word(remote)} --pyz-info"), CHECK_TIMEOUT)
    out = result.stdout
    if result.returncode == 255:
        raise DeployError(describe_ssh_failure(target.destination, result.stderr.decode("utf-8", "replace")))
    if result.returncode != 0:
        raise DeployError(f"the agent does not start on {target.destination}: {_last_line(result.stderr or out)}")
    first, _, _ = out.partition(b"\n")
    match = _INFO.match(first.decode("utf-8", "replace"))
    if match is None:
        garbage = garbage_before_first_frame(out, f"{target.destination} (the remote host)")
        found = next((m for m in map(_INFO.match, out.decode("utf-8", "replace").splitlines()) if m), None)
        if found is not None and garbage is not None:
            # The file runs, but whatever printed first will corrupt the protocol stream too.
            raise DeployError(garbage.replace("the agent's output began", "the output of ssh began"))
        raise DeployError(f"unexpected answer from the agent on {target.destination}: '{shown_bytes(out[:200])}'")
    return f"Python found on {target.destination}: {match.group(2)} ({match.group(3)})"


async def check_init(target: SshTarget, remote: str) -> str:
    argv = target.ssh(f"{remote_path_word(remote)} --stdio")
    try:
        with trio.fail_after(CHECK_TIMEOUT):
            client = await AgentClient.spawn(argv, env=environ_without_token())
            async with client:
                frames: List[int] = []
                client.add_listener(lambda t: frames.append(1) if t.direction == "in" and t.message is not None else None)
                try:
                    await client.init()
                except ProtocolViolationError as exc:
                    garbage = None
                    if not frames and exc.violation.rule == "framing":
                        garbage = garbage_before_first_frame(exc.violation.raw, f"{target.destination} (the remote host)")
                    raise DeployError(garbage or str(exc)) from None
                await client.quit()
    except trio.TooSlowError:
        raise DeployError(f"the agent on {target.destination} did not answer INIT within {CHECK_TIMEOUT:g} s") from None
    except AgentExited as exc:
        if exc.returncode == 255:
            raise DeployError(describe_ssh_failure(target.destination, exc.stderr_tail)) from None
        raise DeployError(f"the agent on {target.destination} {str(exc).splitlines()[0]}") from None
    except ClientError as exc:
        raise DeployError(f"the agent on {target.destination} did not start a session: {exc}") from None
    return f"agent answered INIT on {target.destination}"


async def deploy(target: SshTarget, local: str, remote: str, say) -> None:
    say(await copy(target, local, remote))
    say(await check_python(target, remote))
    say(await check_init(target, remote))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        target = SshTarget(
            args.destination, config=args.ssh_config, port=args.ssh_port, options=tuple(args.ssh_option),
            batch=not sys.stdin.isatty(),
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        local = str(find_pyz(args.pyz))
    except FileNotFoundError as exc:
        print(f"proxy-console deploy: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        trio.run(deploy, target, local, args.remote_path, say)
    except DeployError as exc:
        print(f"proxy-console deploy: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("proxy-console deploy: interrupted", file=sys.stderr)
        return 130
    return EXIT_OK
