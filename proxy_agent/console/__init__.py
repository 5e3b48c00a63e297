"""``proxy-console``: a command console for proxy agents, for people and for test scripts.

::

    proxy-console [--connect HOST:PORT [--token-file PATH] | --unix PATH
                   | --ssh [USER@]HOST [--remote-agent COMMAND] | --spawn COMMAND...]
                  [-c "COMMANDS" | --script FILE] [--trace] [--json] [--manual]
    proxy-console deploy [USER@]HOST [--pyz FILE] [--remote-path PATH]

Without a transport it spawns ``python -m proxy_agent`` (the local
scheduler; from the single file, the file itself).  ``--spawn`` takes the
rest of the command line as the agent's command, so it comes last:
``proxy-console -c jobs --spawn ssh HOST proxy-agent``.  ``--ssh`` starts the
agent on another machine through ssh (see :mod:`.remote`); ``deploy`` copies
the single file there and checks that it starts (see :mod:`.deploy`).

Exit status: 0 every command succeeded; 1 a command failed (the error line
names it); 2 usage error; 3 the session could not be started or was lost
(cannot connect, agent exited, token refused); 4 the agent violated the
protocol; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, List, Optional, Sequence, TextIO, Tuple

import trio

from .. import __version__
from ..cli import entry_point
from ..client import (
    AgentClient,
    AgentExited,
    AgentProcess,
    ClientError,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
)
from .commands import COMMANDS, CommandError, Console, split_commands
from .diagnose import garbage_before_first_frame
from .options import HelpFormatter, Parser, add_ssh_options
from ..client.remote import SshTarget, default_remote_command, environ_without_token, own_agent_argv, remote_command, ssh_exit_reason
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
_OPTIONS_WITH_VALUES = {
    "-c", "--command", "--script", "--connect", "--unix", "--token-file", "--timeout", "--base-id",
    "--ssh", "--remote-agent", "--ssh-config", "--ssh-port", "--ssh-option", "--agent-log",
}


def _base_id(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    command_list = "\n".join(f"  {spec.usage}" for spec in COMMANDS)
    parser = Parser(
        prog="proxy-console",
        usage="proxy-console [--connect HOST:PORT [--token-file PATH] | --unix PATH\n"
        "                      | --ssh [USER@]HOST [--remote-agent COMMAND] | --spawn COMMAND...]\n"
        "                     [-c COMMANDS | --script FILE] [--trace] [--json] [--manual] [options]\n"
        "       proxy-console deploy [USER@]HOST [options]   (see proxy-console deploy --help)",
        description="Talk to a proxy agent: submit and watch jobs, list the cluster, send raw protocol commands. "
        "Without a transport option it starts this installation's agent on this machine "
        "('python -m proxy_agent', or the single file it runs from) with the local scheduler.",
        epilog=f"--spawn COMMAND... must come last: everything after it is the agent's command line.\n"
        "The agent's own log (its stderr) is shown as it comes, each line marked 'agent| ' "
        "(or 'HOST| ' with --ssh), unless --agent-log sends it to a file.\n\n"
        f"console commands (type 'help' inside the console):\n{command_list}\n\n"
        "exit status: 0 all commands succeeded, 1 a command failed, 2 usage error, "
        "3 session could not start or was lost, 4 protocol violation by the agent",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--connect", metavar="HOST:PORT", help="connect to an agent started with --listen")
    where.add_argument("--unix", metavar="PATH", help="connect to an agent started with --unix PATH")
    where.add_argument(
        "--ssh", metavar="[USER@]HOST",
        help="start the agent on HOST through ssh and talk to it over ssh's stdin/stdout",
    )
    parser.add_argument(
        "--remote-agent", metavar="COMMAND",
        help="with --ssh: the agent's command on HOST, options allowed "
        "(default: the first of ~/proxy-agent.pyz, proxy-agent on PATH, ~/.local/bin/proxy-agent)",
    )
    add_ssh_options(parser)
    parser.add_argument(
        "--agent-log", metavar="FILE",
        help="append the agent's stderr to FILE instead of showing it (spawned and --ssh agents)",
    )
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
    parser.add_argument("--base-id", type=_base_id, default=1000, metavar="N", help="base id sent with INIT")
    parser.add_argument(
        "--timeout", type=_positive_seconds, metavar="SECONDS",
        help=f"time limit for waits (default: {SCRIPT_TIMEOUT:g} s in scripts, none interactively)",
    )
    return parser


def manual() -> str:
    """``proxy-console --man``: the manual page, made from the same parsers as ``--help``."""
    from ..manpage import manual_page
    from .deploy import build_parser as deploy_parser

    return manual_page("proxy-console", "drive a proxy agent by hand or from scripts", build_parser(),
                       [("proxy-console deploy", deploy_parser())], [
        ("console commands", ["Several commands may share a line, separated by ';'. JOB is a job's id (as "
                              "proxy-agent jobs shows it), its jobSubId, its name, or '.' for the job submitted last."]
         + [(spec.usage, spec.summary) for spec in COMMANDS]),
        ("exit status", ["0 every command succeeded; 1 a command failed (the error line names it); a job's own exit "
                         "status when submit --wait, wait or cosubmit ends with a job that failed (128 + N for a job "
                         "killed by signal N), as sbatch --wait gives it; 2 usage error; 3 the session could not "
                         "start or was lost; 4 the agent violated the protocol; 130 interrupted."]),
        ("see also", ["proxy-agent(1); the project's docs/console.md."]),
    ])


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


class _LineTee(trio.abc.ReceiveStream):
    """Passes a stream's bytes on unchanged and hands each complete line to ``on_line``."""

    def __init__(self, inner: trio.abc.ReceiveStream, on_line: Callable[[str], None]) -> None:
        self.inner = inner
        self.on_line = on_line
        self._partial = b""

    async def receive_some(self, max_bytes: Optional[int] = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        if not data:
            if self._partial:
                self.on_line(self._partial.decode("utf-8", "replace"))
                self._partial = b""
            return data
        *complete, self._partial = (self._partial + data).split(b"\n")
        for line in complete:
            self.on_line(line.rstrip(b"\r").decode("utf-8", "replace"))
        if len(self._partial) > 65536:  # a runaway line without newline: show it in pieces
            self.on_line(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class AgentLog:
    """Where a spawned agent's stderr goes: shown with a prefix, or appended to a file."""

    def __init__(self, out: Output, prefix: str, path: Optional[str] = None) -> None:
        self.out = out
        self.prefix = prefix
        self.path = path
        self.shown = 0
        self._file: Optional[TextIO] = None
        if path is not None:
            try:
                self._file = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise ConnectError(f"cannot open the agent log {path}: {exc.strerror or exc}") from None

    def __call__(self, line: str) -> None:
        if self._file is not None:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError):
                pass
            return
        self.shown += 1
        self.out.note(f"{self.prefix}| {line}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def spawn_client(argv: List[str], strict: bool, log: AgentLog, peer: str, env=None) -> AgentClient:
    """Start the agent with its stderr passed through ``log`` (and a tail kept for errors)."""
    process = await AgentProcess.start(argv, env=env, capture_stderr=True)
    stderr = process.process.stderr
    if stderr is not None:
        process.process.stderr = _LineTee(stderr, log)
    stream = trio.StapledStream(process.process.stdin, process.process.stdout)
    return AgentClient(stream, process=process, strict=strict, peer=f"{peer} (pid {process.pid})")


def ssh_target(args: argparse.Namespace, destination: str, batch: bool) -> SshTarget:
    try:
        return SshTarget(destination, config=args.ssh_config, port=args.ssh_port, options=tuple(args.ssh_option), batch=batch)
    except ValueError as exc:
        raise ConnectError(str(exc)) from None


def ssh_agent_argv(args: argparse.Namespace, target: SshTarget) -> List[str]:
    agent_args = ["--stdio"]
    if args.remote_agent:
        try:
            command = remote_command(args.remote_agent, agent_args)
        except ValueError as exc:
            raise ConnectError(f"--remote-agent: {exc}") from None
    else:
        command = default_remote_command(agent_args)
    return target.ssh(command)


async def open_client(
    args: argparse.Namespace, spawn_argv: Optional[List[str]], log: Optional[AgentLog] = None, interactive: bool = False
) -> Tuple[AgentClient, bool]:
    """The client for the chosen transport, and whether the agent is our child."""
    strict = not args.lenient
    if args.connect:
        host, port = _parse_host_port(args.connect)
        return await AgentClient.connect_tcp(host, port, strict=strict), False
    if args.unix:
        return await AgentClient.connect_unix(args.unix, strict=strict), False
    if log is None:
        log = AgentLog(Output(), "agent")
    if args.ssh:
        target = ssh_target(args, args.ssh, batch=not interactive)
        argv = ssh_agent_argv(args, target)
        return await spawn_client(argv, strict, log, f"agent on {target.destination}", env=environ_without_token()), True
    argv = spawn_argv or own_agent_argv()
    return await spawn_client(argv, strict, log, "agent"), True


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
                status = console.failed_status
                break
            if console.finished:
                break
    elif console.interactive:
        reader = TerminalReader(out, "proxy> ", console.completions, _history_file())
        failure: Optional[BaseException] = None
        lost: List[BaseException] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(console.watch_interrupts)
                nursery.start_soon(_watch_session, console, nursery.cancel_scope, lost)
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
        if failure is None and lost:
            failure = lost[0]
        if failure is not None:
            raise failure
    else:
        reader_ = StreamReader()
        index = 0
        lost = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_session, console, nursery.cancel_scope, lost)
            while not console.finished and status == EXIT_OK:  # a failed command ends the script
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
                        status = console.failed_status
                        break
                    if console.finished:
                        break
            nursery.cancel_scope.cancel()
        if lost:
            raise lost[0]
    if client.ended is None:
        await console.finish(send_quit=spawned)
    return status


async def _watch_session(console: Console, cancel: trio.CancelScope, lost: List[BaseException]) -> None:
    """End the console at once when the session ends on its own (the agent died, the
    connection broke, a protocol violation), instead of at the next command."""
    try:
        await console.client.wait_for(lambda: False)
    except ClientError as exc:
        if console.finished and isinstance(exc, ConnectionClosed) and not isinstance(exc, AgentExited):
            return  # 'quit' was typed: the shutdown is the expected end
        if console.finished and isinstance(exc, AgentExited) and exc.returncode == 0:
            return
        lost.append(exc)
        cancel.cancel()


def _fatal(out: Output, message: str, detail: str = "") -> None:
    if out.json_mode:
        record = {"type": "fatal", "message": message}
        if detail:
            record["agent_stderr"] = detail
        out.record(record)
    out.note(f"proxy-console: {message}")


def _ssh_exit_reason(args: argparse.Namespace, exc: AgentExited) -> Optional[str]:
    """What an ssh exit status means, in one line (None: not ssh, or nothing to add)."""
    if not args.ssh:
        return None
    return ssh_exit_reason(args.ssh, exc.returncode, exc.stderr_tail)


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
    log: Optional[AgentLog] = None
    console: Optional[Console] = None
    try:
        token = read_token(args.token_file) if args.connect else None
        if not (args.connect or args.unix):
            log = AgentLog(out, args.ssh.rpartition("@")[2] if args.ssh else "agent", args.agent_log)
            if args.agent_log:
                out.note(f"proxy-console: the agent's log goes to {args.agent_log}")
        client, spawned = await open_client(args, spawn_argv, log, interactive)
    except ClientError as exc:
        _fatal(out, str(exc))
        if log is not None:
            log.close()
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
        garbage = None
        if console is not None and console.frames_in == 0 and exc.violation.rule == "framing":
            where = f"{args.ssh} (the remote host)" if args.ssh else "the agent's host"
            garbage = garbage_before_first_frame(exc.violation.raw or console.first_bytes or b"", where)
        _fatal(out, garbage or str(exc))
        return EXIT_PROTOCOL
    except AgentExited as exc:
        tail = exc.stderr_tail
        first = _ssh_exit_reason(args, exc) or str(exc).split("\n", 1)[0].replace("; its last output:", "")
        _fatal(out, first, tail)
        if tail and not out.json_mode and (log is None or log.path is not None):
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
    finally:
        if log is not None:
            log.close()


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--man"]:
        sys.stdout.write(manual())
        return EXIT_OK
    if words[:1] == ["deploy"]:
        from .deploy import main as deploy_main

        return deploy_main(words[1:])
    own, spawn_argv = split_spawn(words)
    parser = build_parser()
    args = parser.parse_args(own)
    if spawn_argv is not None:
        if not spawn_argv:
            parser.error("--spawn needs the agent's command line after it")
        if args.connect or args.unix or args.ssh:
            parser.error("choose one of --connect, --unix, --ssh and --spawn")
    if args.token_file and not args.connect:
        parser.error("--token-file goes with --connect")
    if args.remote_agent and not args.ssh:
        parser.error("--remote-agent goes with --ssh")
    if (args.ssh_config or args.ssh_port or args.ssh_option) and not args.ssh:
        parser.error("--ssh-config, --ssh-port and --ssh-option go with --ssh")
    if args.agent_log and (args.connect or args.unix):
        parser.error("--agent-log is for agents the console starts (not --connect or --unix)")
    try:
        return trio.run(amain, args, spawn_argv)
    except KeyboardInterrupt:
        print("proxy-console: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
