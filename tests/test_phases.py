"""The session's phases: one table decides every (phase, command) and (phase, step) pair, the
session follows it, and the front door waits for authentication on an event, not a clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from proxy_agent.client import AgentClient
from proxy_agent.frontends.ptp import PtpConfig
from proxy_agent.protocol.messages import CommandId, Error, ErrorCode
from proxy_agent.protocol.phases import ALLOWED, GUARDS, TRANSITIONS, IllegalTransition, Phase, PhaseMachine, Step
from proxy_agent.server import Admission, ServerLimits, Sessions, serve_connection
from proxy_agent.service.service import JobService
from test_session import VALID_ARGS, cmd, send_all, session_in

LIVE_PHASES = [Phase.INITIALIZE, Phase.DISCOVERY, Phase.NORMAL, Phase.SUSPENDED]


def machine_in(phase: Phase) -> PhaseMachine:
    """A machine driven through the table into ``phase`` (DISCOVERY with its MODEL_DEF done)."""
    machine = PhaseMachine()
    path = {
        Phase.INITIALIZE: [],
        Phase.DISCOVERY: [Step.INITIALISED, Step.MODEL_DEFINED],
        Phase.NORMAL: [Step.INITIALISED, Step.MODEL_DEFINED, Step.EVENTS_STARTED],
        Phase.SUSPENDED: [Step.INITIALISED, Step.MODEL_DEFINED, Step.EVENTS_STARTED, Step.EVENTS_STOPPED],
        Phase.SHUTDOWN: [Step.SHUT_DOWN],
    }[phase]
    for step in path:
        machine.step(step)
    assert machine.phase is phase
    return machine


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.name)
@pytest.mark.parametrize("step", list(Step), ids=lambda s: s.name)
def test_every_phase_and_step_is_decided_by_the_table(phase, step):
    machine = machine_in(phase)
    after = TRANSITIONS.get((phase, step))
    if after is None:
        with pytest.raises(IllegalTransition, match=phase.value):
            machine.step(step)
        assert machine.phase is phase  # an illegal transition is refused and changes nothing
    else:
        assert machine.step(step) is after and machine.phase is after


def test_the_table_leaves_no_phase_behind():
    """Every phase has its commands, and every phase but the first is reached by some step."""
    assert set(ALLOWED) == set(Phase)
    reached = set(TRANSITIONS.values())
    assert reached >= set(Phase) - {Phase.INITIALIZE}
    # nothing leaves SHUTDOWN
    assert all(after is Phase.SHUTDOWN for (before, _), after in TRANSITIONS.items() if before is Phase.SHUTDOWN)
    for (phase, command), (step, _) in GUARDS.items():
        assert command in ALLOWED[phase] and (phase, step) in TRANSITIONS


@pytest.mark.parametrize("phase", LIVE_PHASES, ids=lambda p: p.name)
@pytest.mark.parametrize("command_id", list(CommandId), ids=lambda c: c.name)
def test_the_session_accepts_a_command_exactly_when_the_table_does(phase, command_id):
    session = session_in(phase)
    accepted = machine_in(phase).allows(command_id)
    r = session.receive(cmd(command_id, 77, *VALID_ARGS.get(command_id, ())))
    if accepted:
        assert r.command is not None and session.is_open(77)
    else:
        assert r.command is None and r.replies == [Error(77, ErrorCode.ILLEGAL_IN_PHASE, machine_in(phase).refusal(command_id))]


def test_the_session_reads_the_table_it_is_given(monkeypatch):
    """Change the table and the session follows: it keeps no rules of its own."""
    monkeypatch.setitem(ALLOWED, Phase.NORMAL, ALLOWED[Phase.NORMAL] - {CommandId.MODEL_DEF})
    monkeypatch.setitem(TRANSITIONS, (Phase.NORMAL, Step.EVENTS_STOPPED), Phase.NORMAL)
    session = session_in(Phase.NORMAL)
    r = session.receive(cmd(CommandId.MODEL_DEF, 40))
    assert r.command is None and r.replies[0].code == ErrorCode.ILLEGAL_IN_PHASE
    send_all(session, r.replies)
    session.receive(cmd(CommandId.STOP_EVENTS, 41))
    assert session.phase is Phase.NORMAL  # the table, changed, kept it there


def test_the_start_events_guard_is_the_tables():
    machine = machine_in(Phase.INITIALIZE)
    machine.step(Step.INITIALISED)
    assert machine.refusal(CommandId.START_EVENTS) == GUARDS[(Phase.DISCOVERY, CommandId.START_EVENTS)][1]
    machine.step(Step.MODEL_DEFINED)
    assert machine.allows(CommandId.START_EVENTS)


async def test_authentication_is_noticed_with_no_time_passing(mock_clock):
    """The front door counts a connection as a session the moment its INIT passes the token
    check: the clock stands still (nothing advances it), so a watcher that looked now and
    then would never see it."""
    limits = ServerLimits(auth_timeout=30.0, max_sessions=4)
    admission = Admission(limits)
    sessions = Sessions()
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    service = JobService()
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        nursery.start_soon(serve_connection, agent_stream, service, PtpConfig(token="s3cret"), limits, admission,
                           sessions, "tester")
        async with AgentClient.from_stream(client_stream) as client:
            await trio.testing.wait_all_tasks_blocked()
            began = trio.current_time()
            assert admission.sessions == 0 and len(admission.waiting) == 1
            await client.init(1000, token="s3cret")
            await trio.testing.wait_all_tasks_blocked()
            assert admission.sessions == 1 and not admission.waiting
            assert trio.current_time() == began
            await client.quit()
        nursery.cancel_scope.cancel()
