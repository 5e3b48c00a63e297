"""Command line of the Invoke Server: ``proxy-invoke-server`` / ``python -m proxy_agent.invoke``.

A grid RPC client starts it with ``-l LOGFILE`` at most; the other options are for people
and wrapper scripts.  The jobs are the agent's: the server is a client of the service of the
state directory (``--state-dir``, the agent's default), and starts it when none runs (see
``agent.py``).  stdout and stderr carry the protocol and nothing else: logs go to the
log file or nowhere, and the process's own descriptors 0, 1 and 2 are pointed at /dev/null
once the protocol has taken its copies, so no library or child process can write into the
protocol by accident.

A command line that cannot be understood does not end the program: the client would only
see a broken pipe.  The server runs and answers every request but EXIT with ``F`` and the
reason, which the client writes into its log.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from typing import List, Optional

import trio

from ...cli import entry_point
from ...schedulers.registry import BACKENDS
from ...service.store import default_state_dir
from .agent import AgentJobs, AgentSettings
from .request import InvokeDefaults
from .server import InvokeServer

log = logging.getLogger("proxy_agent.invoke")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="proxy-invoke-server",
        description="Ninf-G Invoke Server: runs the jobs a grid RPC client asks for through the "
        "agent's schedulers. Requests on stdin, replies on stdout, notifies on stderr.",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the state directory whose service runs these jobs (default: the agent's, "
        "$XDG_STATE_HOME/proxy-agent); the service is started if none runs",
    )
    parser.add_argument(
        "--agent-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="an agent option the service is given, as a launch's (repeat for several; "
        "e.g. --agent-option=--scheduler=local,slurm)",
    )
    parser.add_argument("-l", dest="log_file", metavar="LOGFILE", help="write the log here (otherwise there is none)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more detail in the log")
    parser.add_argument(
        "--scheduler",
        choices=list(BACKENDS),
        help="scheduler for jobs whose request names none (default: the service's first); the "
        "service is given it (added if it lacks it)",
    )
    parser.add_argument("--queue", metavar="QUEUE[,QUEUE...]", help="queue, or candidate queues, for jobs that name none")
    parser.add_argument("--broker", metavar="NAME", help="broker for jobs that name none")
    parser.add_argument("--mpirun", metavar="PATH", help="the mpirun that starts MPI and BLACS jobs (default: from PATH)")
    parser.add_argument(
        "--slots", type=int, metavar="N",
        help="run at most N of this server's jobs at once; the others wait queued (default: no limit)"
    )
    parser.add_argument(
        "--exit-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="after EXIT, how long to wait for cancelled jobs to end (default 30)",
    )
    return parser


def _setup_logging(log_file: Optional[str], verbose: int) -> None:
    """Log to ``log_file`` or nowhere.  A log file that cannot be opened means no log: the
    jobs matter more than the log, and there is nowhere else to say it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    logging.captureWarnings(True)
    if log_file:
        try:
            handler: logging.Handler = logging.FileHandler(log_file)
        except OSError:
            handler = logging.NullHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s proxy-invoke-server[%(process)d] %(levelname)s %(name)s: %(message)s")
        )
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
    else:
        handler = logging.NullHandler()
        root.setLevel(logging.CRITICAL + 1)
    root.addHandler(handler)
    # Nothing may fall back to writing on stderr.
    logging.lastResort = None


class ProtocolPipes:
    """The three pipes, taken from descriptors 0, 1 and 2, which then point at /dev/null."""

    def __init__(self) -> None:
        fds = [os.dup(0), os.dup(1), os.dup(2)]
        null_in = os.open(os.devnull, os.O_RDONLY)
        null_out = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null_in, 0)
        os.dup2(null_out, 1)
        os.dup2(null_out, 2)
        os.close(null_in)
        os.close(null_out)
        self.requests = trio.lowlevel.FdStream(fds[0])
        self.replies = trio.lowlevel.FdStream(fds[1])
        self.notifies = trio.lowlevel.FdStream(fds[2])

    async def aclose(self) -> None:
        for stream in (self.replies, self.notifies, self.requests):
            try:
                # The descriptors share their open files with whoever started the server (a
                # terminal, when a person did): leave them blocking, as they were found.
                os.set_blocking(stream.fileno(), True)
            except OSError:
                pass
            try:
                await stream.aclose()
            except OSError:
                pass


async def _watch_signals(server: InvokeServer) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            log.info("received %s", name)
            server.stop(name)


def _configured_state_dir() -> str:
    """The agent's state directory unless the server was given one: the configuration
    file's, else the default (a file that cannot be read is logged, not fatal)."""
    from ...config import ConfigError, state_dir

    try:
        return state_dir(default_state_dir())
    except ConfigError as exc:
        log.warning("%s", exc)
        return default_state_dir()


async def serve(args: Optional[argparse.Namespace], refusal: Optional[str]) -> str:
    pipes = ProtocolPipes()
    try:
        settings = AgentSettings(
            (args.state_dir if args else None) or _configured_state_dir(),
            schedulers=[args.scheduler] if args and args.scheduler else ["local"],
            agent_options=args.agent_option if args else (),
        )
        async with AgentJobs.open(settings, slots=args.slots if args else None) as jobs:
            if refusal is None:
                jobs.connect_soon()
            server = InvokeServer(
                jobs,
                pipes.requests,
                pipes.replies,
                pipes.notifies,
                defaults=InvokeDefaults(
                    scheduler=args.scheduler if args else None,
                    queue=args.queue if args else None,
                    broker=args.broker if args else None,
                    mpirun=args.mpirun if args else None,
                ),
                find_program=shutil.which,
                exit_grace=args.exit_grace if args else 5.0,
                refusal=refusal,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, server)
                why = await server.run()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await pipes.aclose()
    return why


@entry_point
def main(argv: Optional[List[str]] = None) -> int:
    refusal = None
    args: Optional[argparse.Namespace]
    try:
        args = build_parser().parse_args(argv)
        if args.slots is not None and args.slots < 1:
            raise UsageError(f"--slots must be at least 1, not {args.slots}")
        if args.exit_grace < 0:
            raise UsageError(f"--exit-grace must not be negative, not {args.exit_grace}")
    except UsageError as exc:
        args = None
        refusal = f"the invoke server cannot start: {exc}"
    _setup_logging(args.log_file if args else None, args.verbose if args else 0)
    if refusal:
        log.error("%s", refusal)
    log.info("started with %s", " ".join(argv if argv is not None else sys.argv[1:]) or "no options")
    try:
        trio.run(serve, args, refusal)
    except Exception:  # noqa: BLE001 - never a traceback on the protocol's pipes
        log.exception("internal error")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
