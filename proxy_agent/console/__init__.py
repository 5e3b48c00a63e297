"""``proxy-console``: a command console for proxy agents, for people and for test scripts.

::

    proxy-console [--connect HOST:PORT [--token-file PATH] | --unix PATH | --spawn COMMAND...]
                  [-c "COMMANDS" | --script FILE] [--trace] [--json] [--manual]

Without a transport it spawns ``python -m proxy_agent`` (the local
scheduler).  ``--spawn`` takes the rest of the command line as the agent's
command, so it comes last: ``proxy-console -c jobs --spawn ssh HOST proxy-agent``.

Exit status: 0 every command succeeded; 1 a command failed (the error line
names it); 2 usage error; 3 the session could not be started or was lost
(cannot connect, agent exited, token refused); 4 the agent violated the
protocol; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

import trio

from ..client import (
    AgentClient,
    AgentExited,
    ClientError,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
)
from .commands import COMMANDS, CommandError, Console, split_commands
from .terminal import Output, StreamReader, TerminalReader

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_SESSION", "EXIT_PROTOCOL"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SESSION = 3
EXIT_PROTOCOL = 4
EXIT_INTERRUPTED = 130

#: Default time limit (seconds) for waits in scripts (interactive waits have none: Ctrl-C ends them).
SCRIPT_TIMEOUT = 300.0
_OPTIONS_WITH_VALUES = {"-c", "--command", "--script", "--connect", "--unix", "--token-file", "--timeout", "--base-id"}


def build_parser() -> argparse.ArgumentParser:
    command_list = "\n".join(f"  {spec.usage}" for spec in COMMANDS)
    parser = argparse.ArgumentParser(
        prog="proxy-console",
        usage="proxy-console [--connect HOST:PORT [--token-file PATH] | --unix PATH | --spawn COMMAND...]\n"
        "                     [-c COMMANDS | --script FILE] [--trace] [--json] [--manual] [options]",
        description="Talk to a proxy agent: submit and watch jobs, list the cluster, send raw protocol commands. "
        "Without a transport option it starts 'python -m proxy_agent' (local scheduler).",
        epilog=f"--spawn COMMAND... must come last: everything after it is the agent's command line.\n\n"
        f"console commands (type 'help' inside the console):\n{command_list}\n\n"
        "exit status: 0 all commands succeeded, 1 a command failed, 2 usage error, "
        "3 session could not start or was lost, 4 protocol violation by the agent",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--connect", metavar="HOST:PORT", help="connect to an agent started with --listen")
    where.add_argument("--unix", metavar="PATH", help="connect to an agent started with --unix PATH")
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="token for --connect (default: $PROXY_AGENT_TOKEN, else ~/.proxy-agent/token if present)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("-c", "--command", metavar="COMMANDS", help="run these commands (';' or newlines between them) and exit")
    source.add_argument("--script", metavar="FILE", help="run the commands in FILE ('-' for stdin) and exit")
    parser.add_argument("--trace", action="store_true", help="show every frame sent and received, raw and decoded (stderr)")
    parser.add_argument("--json", action="store_true", help="print events and results as JSON lines")
    parser.add_argument("--manual", action="store_true", help="do not send INIT/MODEL_DEF/START_EVENTS (use init, modeldef, start)")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not print events as they arrive")
    parser.add_argument("--lenient", action="store_true", help="report protocol violations but carry on")
    parser.add_argument("--base-id", type=int, default=1000, metavar="N", help="base id sent with INIT (default 1000)")
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS",
        help=f"time limit for waits (default: {SCRIPT_TIMEOUT:g} s in scripts, none interactively)",
    )
    return parser


def split_spawn(argv: Sequence[str]) -> Tuple[List[str], Optional[List[str]]]:
    """Cut ``--spawn COMMAND...`` off the end of the console's arguments."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--spawn":
            return argv[:i], argv[i + 1:]
        if word == "--":
            break
        if word in _OPTIONS_WITH_VALUES:
            i += 1
        i += 1
    return argv, None


def read_token(path: Optional[str]) -> Optional[str]:
    if path is None:
        env = os.environ.get("PROXY_AGENT_TOKEN")
        if env:
            return env
        default = os.path.join(os.path.expanduser("~"), ".proxy-agent", "token")
        if not os.path.exists(default):
            return None
        path = default
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise ConnectError(f"cannot read the token file {path}: {exc.strerror or exc}") from None


def _parse_host_port(text: str) -> Tuple[str, int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port = rest[1:] if sep and rest.startswith(":") else ""
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConnectError(f"bad address {text!r}: expected HOST:PORT")
    return host, int(port)


async def open_client(args: argparse.Namespace, spawn_argv: Optional[List[str]]) -> Tuple[AgentClient, bool]:
    """The client for the chosen transport, and whether the agent is our child."""
    strict = not args.lenient
    if args.connect:
        host, port = _parse_host_port(args.connect)
        return await AgentClient.connect_tcp(host, port, strict=strict), False
    if args.unix:
        return await AgentClient.connect_unix(args.unix, strict=strict), False
    argv = spawn_argv or [sys.executable, "-m", "proxy_agent"]
    return await AgentClient.spawn(argv, strict=strict), True


class _Fatal(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _history_file() -> Optional[str]:
    home = os.path.expanduser("~")
    return os.path.join(home, ".proxy_console_history") if os.path.isdir(home) else None


async def _run(console: Console, args: argparse.Namespace, script: Optional[str], spawned: bool, out: Output) -> int:
    client = console.client
    if not args.manual:
        try:
            await console.startup()
        except TokenRefused:
            raise
        except CommandFailed as exc:
            raise _Fatal(f"the agent refused to start the session: {exc}", EXIT_SESSION) from None
    status = EXIT_OK
    if script is not None:
        try:
            commands = split_commands(script)
        except CommandError as exc:
            raise _Fatal(str(exc), EXIT_USAGE) from None
        for index, words in enumerate(commands, 1):
            if not await console.execute(words, index):
                status = EXIT_FAILED
                break
            if console.finished:
                break
    elif console.interactive:
        reader = TerminalReader(out, "proxy> ", console.completions, _history_file())
        failure: Optional[BaseException] = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(console.watch_interrupts)
                try:
                    while not console.finished:
                        line = await reader.read()
                        if line is None:
                            break
                        try:
                            commands = split_commands(line)
                        except CommandError as exc:
                            out.note(f"error: {exc}")
                            continue
                        for words in commands:
                            await console.execute(words)
                            if console.finished:
                                break
                except (ClientError, _Fatal) as exc:
                    failure = exc
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            reader.close()
        if failure is not None:
            raise failure
    else:
        reader_ = StreamReader()
        index = 0
        while not console.finished and status == EXIT_OK:
            line = await reader_.read()
            if line is None:
                break
            try:
                commands = split_commands(line)
            except CommandError as exc:
                raise _Fatal(str(exc), EXIT_USAGE) from None
            for words in commands:
                index += 1
                if not await console.execute(words, index):
                    status = EXIT_FAILED
                    break
                if console.finished:
                    break
    if client.ended is None:
        await console.finish(send_quit=spawned)
    return status


def _fatal(out: Output, message: str, detail: str = "") -> None:
    if out.json_mode:
        record = {"type": "fatal", "message": message}
        if detail:
            record["agent_stderr"] = detail
        out.record(record)
    out.note(f"proxy-console: {message}")


async def amain(args: argparse.Namespace, spawn_argv: Optional[List[str]]) -> int:
    out = Output(json_mode=args.json)
    script: Optional[str] = None
    if args.command is not None:
        script = args.command
    elif args.script is not None:
        try:
            if args.script == "-":
                script = sys.stdin.read()
            else:
                with open(args.script, encoding="utf-8") as handle:
                    script = handle.read()
        except OSError as exc:
            _fatal(out, f"cannot read the script {args.script}: {exc.strerror or exc}")
            return EXIT_USAGE
    interactive = script is None and sys.stdin.isatty()
    timeout = args.timeout if args.timeout is not None else (None if interactive else SCRIPT_TIMEOUT)
    try:
        token = read_token(args.token_file) if args.connect else None
        client, spawned = await open_client(args, spawn_argv)
    except ClientError as exc:
        _fatal(out, str(exc))
        return EXIT_SESSION
    try:
        async with client:
            console = Console(
                client, out, trace=args.trace, quiet=args.quiet, timeout=timeout,
                reply_timeout=args.timeout if args.timeout is not None else 10.0,
                token=token, base_id=args.base_id, interactive=interactive,
            )
            return await _run(console, args, script, spawned, out)
    except TokenRefused as exc:
        hint = "" if args.token_file or os.environ.get("PROXY_AGENT_TOKEN") else " (give --token-file or set PROXY_AGENT_TOKEN)"
        _fatal(out, f"token refused by the agent: {exc.message}{hint}")
        return EXIT_SESSION
    except ProtocolViolationError as exc:
        _fatal(out, str(exc))
        return EXIT_PROTOCOL
    except AgentExited as exc:
        tail = exc.stderr_tail
        first = str(exc).split("\n", 1)[0].replace("; its last output:", "")
        _fatal(out, first, tail)
        if tail and not out.json_mode:
            for line in tail.splitlines():
                out.note(f"  agent| {line}")
        return EXIT_SESSION
    except ConnectionClosed as exc:
        _fatal(out, f"session lost: {exc}")
        return EXIT_SESSION
    except _Fatal as exc:
        _fatal(out, str(exc))
        return exc.status
    except ClientError as exc:
        _fatal(out, str(exc))
        return EXIT_SESSION


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, spawn_argv = split_spawn(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if spawn_argv is not None:
        if not spawn_argv:
            parser.error("--spawn needs the agent's command line after it")
        if args.connect or args.unix:
            parser.error("choose one of --connect, --unix and --spawn")
    if args.token_file and not args.connect:
        parser.error("--token-file goes with --connect")
    try:
        return trio.run(amain, args, spawn_argv)
    except KeyboardInterrupt:
        print("proxy-console: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
