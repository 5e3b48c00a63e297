"""Command line of the agent: ``proxy-agent`` / ``python -m proxy_agent``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import List, Optional

import attrs
import trio

from . import __version__
from .agent import AgentConfig, Session, refuse_busy
from .schedulers.base import SCHEDULERS, SchedulerOptions
from .transport import (
    connect_tcp,
    load_or_create_token,
    open_stdio,
    open_tcp_listeners,
    open_unix_listener,
    parse_host_port,
)

log = logging.getLogger("proxy_agent")

#: How long a new connection waits for the previous session to finish before being refused as busy.
_BUSY_GRACE = 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="proxy-agent",
        description="Resource-manager proxy agent: presents this machine's scheduler to an IDE "
        "over the proxy protocol.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stdio", action="store_true", help="speak the protocol on stdin/stdout (default)")
    where.add_argument("--connect", metavar="HOST:PORT", help="connect back to a client listening at HOST:PORT")
    where.add_argument(
        "--listen", metavar="[HOST:]PORT", help="accept clients on a TCP port (127.0.0.1 unless HOST given; needs a token)"
    )
    where.add_argument("--unix", metavar="PATH", help="accept clients on a Unix socket created with mode 0600")
    parser.add_argument(
        "--scheduler", default="local", choices=sorted(SCHEDULERS), help="scheduler backend (default: local)"
    )
    parser.add_argument("--poll-interval", type=float, default=5.0, metavar="SECONDS", help="scheduler poll interval")
    parser.add_argument("--sim-nodes", type=int, default=16, metavar="N", help="simulated cluster: number of nodes")
    parser.add_argument("--sim-jobs", type=int, default=0, metavar="N", help="simulated cluster: jobs present at start")
    parser.add_argument(
        "--sim-churn", type=float, default=0.0, metavar="EVENTS_PER_SECOND", help="simulated cluster: random changes per second"
    )
    parser.add_argument("--sim-seed", type=int, default=1, help="simulated cluster: random seed (same seed, same cluster)")
    parser.add_argument(
        "--sim-time-scale", type=float, default=1.0, metavar="FACTOR", help="simulated cluster: stretch (>1) or shrink (<1) job durations"
    )
    parser.add_argument(
        "--sim-process-share", type=float, default=0.1, metavar="FRACTION",
        help="simulated cluster: share of existing jobs that list their processes (default 0.1)",
    )
    parser.add_argument("--all-users", action="store_true", help="show every user's jobs, not only your own")
    parser.add_argument("--token-file", metavar="PATH", help="where --listen writes its generated token (mode 0600)")
    parser.add_argument("--log-file", metavar="PATH", help="write the log here instead of stderr")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for protocol detail)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    handler: logging.Handler
    if args.log_file:
        handler = logging.FileHandler(args.log_file)
        level = min(level, logging.INFO)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s proxy-agent[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


async def _serve_one(stream, config: AgentConfig, peer: str) -> bool:
    session = Session(stream, config, peer)
    try:
        return await session.run()
    finally:
        with trio.move_on_after(0.5) as scope:
            scope.shield = True
            try:
                await stream.aclose()
            except Exception:  # noqa: BLE001
                pass


async def _serve_listeners(listeners: List[trio.SocketListener], config: AgentConfig, quit_scope: trio.CancelScope) -> None:
    """Serve one session at a time; a concurrent connection is told the agent is busy."""
    busy = trio.Lock()

    async def handle(stream) -> None:
        peer = _peer_name(stream)
        # A session that is just ending (its client already gone) gets a moment to finish.
        with trio.move_on_after(_BUSY_GRACE):
            await busy.acquire()
        if not busy.locked() or busy.statistics().owner is not trio.lowlevel.current_task():
            await refuse_busy(stream, peer, config.max_frame_size)
            return
        try:
            log.info("session with %s started", peer)
            quit_requested = await _serve_one(stream, config, peer)
            log.info("session with %s ended", peer)
            if quit_requested:
                quit_scope.cancel()
        finally:
            busy.release()

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, handle, [listener])


def _peer_name(stream) -> str:
    try:
        peer = stream.socket.getpeername()
    except (AttributeError, OSError):
        return "client"
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return peer or "unix client"


async def _watch_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            scope.cancel()
            return


async def _open_transport(args: argparse.Namespace, config: AgentConfig):
    """Connect or start listening; returns (kind, stream-or-listeners, config)."""
    if args.connect:
        host, port = parse_host_port(args.connect)
        try:
            stream = await connect_tcp(host, port)
        except OSError as exc:
            raise OSError(f"cannot connect to {host}:{port}: {_reason(exc)}") from None
        log.info("connected to %s:%d", host, port)
        return "connect", stream, config
    if args.listen:
        host, port = parse_host_port(args.listen, default_host="127.0.0.1", allow_zero=True)
        token, path = load_or_create_token(args.token_file)
        try:
            listeners = await open_tcp_listeners(host, port)
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {_reason(exc)}") from None
        for listener in listeners:
            addr = listener.socket.getsockname()
            print(f"proxy-agent listening on {addr[0]}:{addr[1]}", file=sys.stderr, flush=True)
        if path:
            print(f"proxy-agent token written to {path}", file=sys.stderr, flush=True)
        return "listen", listeners, attrs.evolve(config, token=token)
    if args.unix:
        try:
            listener = await open_unix_listener(args.unix)
        except OSError as exc:
            raise OSError(f"cannot listen on {args.unix}: {_reason(exc)}") from None
        print(f"proxy-agent listening on {args.unix}", file=sys.stderr, flush=True)
        return "unix", [listener], config
    return "stdio", open_stdio(), config


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


async def amain(args: argparse.Namespace) -> int:
    options = SchedulerOptions(
        poll_interval=args.poll_interval,
        sim_nodes=args.sim_nodes,
        sim_jobs=args.sim_jobs,
        sim_churn=args.sim_churn,
        sim_seed=args.sim_seed,
        sim_time_scale=args.sim_time_scale,
        sim_process_share=args.sim_process_share,
        all_users=args.all_users,
    )
    config = AgentConfig(scheduler=args.scheduler, options=options)
    try:
        kind, transport, config = await _open_transport(args, config)
    except (OSError, ValueError) as exc:
        print(f"proxy-agent: {exc}", file=sys.stderr)
        return 2
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, scope)
            if kind == "connect":
                await _serve_one(transport, config, args.connect)
            elif kind == "stdio":
                await _serve_one(transport, config, "stdio client")
            else:
                try:
                    await _serve_listeners(transport, config, scope)
                finally:
                    if kind == "unix":
                        try:
                            os.unlink(args.unix)
                        except OSError:
                            pass
            nursery.cancel_scope.cancel()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args)
    try:
        return trio.run(amain, args)
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError) as exc:  # set-up failures not caught above
        print(f"proxy-agent: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
