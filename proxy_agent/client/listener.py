"""Connect-back: a listener for an agent started with ``--connect HOST:PORT``."""

from __future__ import annotations

import math
from typing import List, Optional

import trio

from .errors import AgentExited, ConnectError
from .connection import AgentClient
from .process import AgentProcess

# --------------------------------------------------------------------------- connect-back


class AgentListener:
    """A TCP listener for agents started with ``--connect HOST:PORT`` (one connection)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener

    @property
    def host(self) -> str:
        return self.listener.socket.getsockname()[0]

    @property
    def port(self) -> int:
        return self.listener.socket.getsockname()[1]

    @property
    def address(self) -> str:
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def accept(
        self,
        *,
        process: Optional[AgentProcess] = None,
        timeout: Optional[float] = 30,
        strict: bool = True,
        reference: bool = False,
        dialect: Optional[str] = None,
    ) -> AgentClient:
        """Wait for the agent to connect; with ``process``, fail early if it exits first."""
        accepted: List[trio.abc.Stream] = []
        exited: List[bool] = []

        async def accept_one(cancel: trio.CancelScope) -> None:
            accepted.append(await self.listener.accept())
            cancel.cancel()

        async def watch(cancel: trio.CancelScope) -> None:
            assert process is not None
            await process.wait()
            with trio.move_on_after(1.0):
                await process.wait_stderr()
            exited.append(True)
            cancel.cancel()

        with trio.move_on_after(timeout if timeout is not None else math.inf):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept_one, nursery.cancel_scope)
                if process is not None:
                    nursery.start_soon(watch, nursery.cancel_scope)
                    if process.capture_stderr:
                        nursery.start_soon(process.pump_stderr)
        if accepted:
            return AgentClient(
                accepted[0],
                process=process,
                strict=strict,
                peer=f"agent connected to {self.address}",
                reference=reference,
                dialect=dialect,
            )
        if exited and process is not None:
            tail = process.stderr_tail()
            shown = f"; its last output:\n{tail}" if tail else ""
            raise AgentExited(
                f"the agent {process.exit_description()} before connecting to {self.address}{shown}", process.returncode, tail
            )
        raise ConnectError(f"no agent connected to {self.address} within {timeout:g} s")

    async def aclose(self) -> None:
        await self.listener.aclose()

    async def __aenter__(self) -> "AgentListener":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


async def listen_for_agent(host: str = "127.0.0.1", port: int = 0) -> AgentListener:
    """Listen where an agent started with ``--connect HOST:PORT`` will connect (port 0: any free port)."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConnectError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    for extra in listeners[1:]:
        await extra.aclose()
    return AgentListener(listeners[0])


