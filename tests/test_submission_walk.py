"""The walk of one PTP SUBMIT_JOB through the agent's rooms (its modules): the front-end,
then the service, then the backend, and back up through the model to the client's view.
Each room is entered once: a room the walk has left is never entered again (a room still on
the stack, such as the session waiting for the service's answer, has not been left)."""

from __future__ import annotations

import dis
import sys
from typing import Dict, List, Optional, Tuple

import pytest
import trio
import trio.testing

from proxy_agent.client import AgentClient
from proxy_agent.frontends.ptp.session import PtpConfig
from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.server import Admission, ServerLimits, Sessions, serve_connection
from proxy_agent.service.model import ServiceModel
from proxy_agent.service.service import JobService
from proxy_agent.service.store import open_store

from wait_support import scaled

#: The rooms of the walk, coarse: a module of the package -> the room it is part of.  Modules
#: not named here (values, the protocol's codec, trio, the standard library) are corridors:
#: passing through them neither leaves a room nor enters one.
ROOMS = {
    "proxy_agent.frontends.ptp.session": "front-end",
    "proxy_agent.frontends.ptp.job_commands": "front-end",
    "proxy_agent.frontends.ptp.mapping": "mapping",
    "proxy_agent.service.service": "service",
    "proxy_agent.service.submission": "service",
    "proxy_agent.schedulers.local": "backend",
    "proxy_agent.service.model": "model",
    "proxy_agent.frontends.ptp.view": "view",
}


_YIELD_VALUE = dis.opmap["YIELD_VALUE"]


class WalkRecorder(trio.abc.Instrument):
    """Profiles the one task that carries the SUBMIT_JOB, only while that task runs, and
    notes each room it enters, when it enters it and when it leaves it."""

    def __init__(self) -> None:
        self.task: Optional[trio.lowlevel.Task] = None
        self.stack: List[Optional[str]] = []  # the room of each profiled frame, outermost first
        self.entries: List[str] = []  # rooms in the order they were entered
        self.reentered: List[Tuple[str, List[str]]] = []
        self._left: Dict[str, bool] = {}
        # coroutine frames of the task that are suspended (an await that yielded): resuming
        # one goes back into a room that was never left
        self._suspended: Dict[int, object] = {}

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.task is None and task.name.endswith("_job_command"):
            self.task = task

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.stack = []
            sys.setprofile(self._profile)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            sys.setprofile(None)

    def _current(self) -> Optional[str]:
        for room in reversed(self.stack):
            if room is not None:
                return room
        return None

    def _profile(self, frame, event: str, arg) -> None:
        if event not in ("call", "return"):
            return  # C calls: corridors by definition
        module = frame.f_globals.get("__name__", "")
        room = ROOMS.get(module)
        if event == "call":
            before = self._current()
            self.stack.append(room)
            if self._suspended.pop(id(frame), None) is not None:
                return  # resumed, not entered
            if room is not None and room != before:
                if self._left.get(room):
                    self.reentered.append((room, list(self.entries)))
                self.entries.append(room)
                self._left[room] = False
        elif self.stack:
            self.stack.pop()
            code = frame.f_code.co_code
            if 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _YIELD_VALUE:
                self._suspended[id(frame)] = frame  # suspended, not left
                return
            after = self._current()
            if room is not None and room != after and room not in self.stack:
                self._left[room] = True


@pytest.mark.parametrize("stored", [False, True], ids=["without a store", "with the agent's store"])
async def test_one_submission_walks_through_each_room_once(tmp_path, stored):
    model = ServiceModel()
    # the agent's own set-up: its store in the state directory, the local jobs beside it
    service = JobService(model, open_store(str(tmp_path)) if stored else None)
    service.add_backend(LocalBackend(model, None, service.context(state_dir=str(tmp_path))))
    recorder = WalkRecorder()
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    limits = ServerLimits(auth_timeout=scaled(30.0), max_sessions=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.ready.wait()
        nursery.start_soon(serve_connection, agent_stream, service, PtpConfig(), limits, Admission(limits),
                           Sessions(), "walker")
        async with AgentClient.from_stream(client_stream) as client:
            await client.init(1000)
            await client.model_def()
            await client.start_events()
            trio.lowlevel.add_instrument(recorder)
            try:
                await client.submit("/bin/true", timeout=scaled(60))
            finally:
                trio.lowlevel.remove_instrument(recorder)
            await client.quit()
        await service.aclose()
        nursery.cancel_scope.cancel()
    assert recorder.task is not None, "no task carried the submission"
    assert not recorder.reentered, (f"rooms entered again after they were left: "
                                    f"{[room for room, _ in recorder.reentered]}; the walk: {recorder.entries}")
    assert recorder.entries == ["front-end", "mapping", "service", "backend", "model", "view"], recorder.entries
