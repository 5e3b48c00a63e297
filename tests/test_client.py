"""The client library against a fake agent played by the test, byte for byte.

The fake agent (``agent_fixtures.FakeAgent``) sits on the other end of an
in-memory stream pair and sends exactly the events a test scripts, so every
rule the client's checker enforces can be broken on purpose.
"""

from __future__ import annotations

import os
import sys

import pytest
import trio
import trio.testing
from hypothesis import given, settings, strategies as st

from agent_fixtures import FakeAgent, ids
from wait_support import scaled, wait_until
from proxy_agent.client import (
    AgentClient,
    AgentExited,
    ClientState,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
    UnknownElementError,
    WaitFailed,
    WaitTimeout,
    job_attributes,
    listen_for_agent,
)
from proxy_agent.protocol.messages import (
    CommandId,
    ElementChange,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    Message,
    NewElements,
    Ok,
    ProcessChange,
    RemoveAll,
    RemoveElements,
    RemoveProcesses,
    Shutdown,
    SubmitJobError,
    TerminateJobError,
)
from proxy_agent.protocol.wire import encode_frame


def group(id_text, **attrs):
    return ElementGroup(ids(id_text) if id_text[0].isdigit() else id_text, list(attrs.items()))


@pytest.fixture
async def pair():
    """A started client (strict) and the fake agent at the other end."""
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with AgentClient.from_stream(client_end) as client:
        yield client, FakeAgent(agent_end)


@pytest.fixture
async def lenient_pair():
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with AgentClient.from_stream(client_end, strict=False) as client:
        yield client, FakeAgent(agent_end)


async def started(client, fake):
    """Run the handshake on both sides; returns the START_EVENTS TID."""
    tids = []
    async with trio.open_nursery() as nursery:

        async def agent_side():
            tids.append(await fake.handshake())

        nursery.start_soon(agent_side)
        await client.init()
        await client.model_def()
        await client.start_events()
    await client.wait_for(lambda: len(client.nodes) == 2, scaled(30))
    return tids[0]


async def serve(fake, *steps):
    """Run agent-side steps concurrently with the client's calls."""
    for step in steps:
        await step()


# --------------------------------------------------------------------------- handshake and model


async def test_handshake_builds_the_model(pair):
    client, fake = pair
    await started(client, fake)
    init = fake.received[0]
    assert init.args == ("version=2.0", "baseId=1000", "dialect=native")
    assert client.rm.id == "1000"
    assert set(client.machines) == {"1001"}
    assert client.machines["1001"].name == "m0"
    assert client.queues["1002"].state == "NORMAL"
    assert [n.parent for n in client.nodes.values()] == ["1001", "1001"]
    assert {c.id for c in client.children("1001", "node")} == {"1003", "1004"}
    assert "progArgs" in client.attr_defs and len(client.attribute_definitions) == len(client.attr_defs)
    assert client.violations == []


async def test_bare_init_and_token(pair):
    client, fake = pair
    async with trio.open_nursery() as nursery:

        async def agent_side():
            init = await fake.expect(CommandId.INIT)
            assert init.args == ("2.0", "77", "dialect=native", "token=s3cret")
            await fake.send(Ok(init.tid))

        nursery.start_soon(agent_side)
        await client.init(77, token="s3cret", bare=True)
    assert client.rm.id == "77"


async def test_refused_token_raises_token_refused(pair):
    client, fake = pair
    async with trio.open_nursery() as nursery:

        async def agent_side():
            init = await fake.expect(CommandId.INIT)
            await fake.send(Error(init.tid, ErrorCode.AUTHENTICATION, "authentication failed: wrong token"))

        nursery.start_soon(agent_side)
        with pytest.raises(TokenRefused, match="wrong token") as info:
            await client.init(token="nope")
    assert info.value.code == ErrorCode.AUTHENTICATION


async def test_submit_output_and_completion(pair):
    client, fake = pair
    tid = await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            submit = await fake.expect(CommandId.SUBMIT_JOB)
            args = dict(a.split("=", 1) for a in submit.args if not a.startswith(("progArgs=", "env=")))
            assert [a for a in submit.args if a.startswith("progArgs=")] == ["progArgs=hello", "progArgs=big world"]
            assert [a for a in submit.args if a.startswith("env=")] == ["env=A=1", "env=B=x=y"]
            assert args["execPath"] == "/bin/echo" and args["workingDir"] == "/tmp" and args["jobNumProcs"] == "2"
            sub = args["jobSubId"]
            await fake.send(
                Ok(submit.tid),
                NewElements(tid, ElementKind.JOB, "1002", [group("5000", jobSubId=sub, name="echo", jobState="STARTING")]),
                NewElements(tid, ElementKind.PROCESS, "5000", [group("0-1", processState="STARTING")]),
                ElementChange(tid, ElementKind.JOB, [group("5000", jobState="RUNNING")]),
                ProcessChange(tid, "5000", [group("0", processStdout="hello big world")]),
                ProcessChange(tid, "5000", [group("1", processStdout="two\nlines")]),
                ProcessChange(tid, "5000", [group("1", processStderr="oops")]),
                ProcessChange(tid, "5000", [group("0-1", processExitCode="0", processState="COMPLETED")]),
                ElementChange(tid, ElementKind.JOB, [group("5000", jobState="COMPLETED", jobStatus="FINISHED")]),
            )

        nursery.start_soon(agent_side)
        job = await client.submit("/bin/echo", ["hello", "big world"], count=2, env={"A": "1", "B": "x=y"}, cwd="/tmp")
        assert job == "5000"
        done = await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
    assert done.states == ["STARTING", "RUNNING", "COMPLETED"]
    assert client.job_output(job) == "hello big world\ntwo\nlines\n"
    assert client.job_output(job, "stderr") == "oops\n"
    assert client.processes[("5000", "1")].text() == "two\nlines\n"
    assert client.job_process(job, 1) is client.processes[("5000", "1")]
    assert client.find_job(done.sub_id) is done
    assert [p.get("processExitCode") for p in client.children(job, "process")] == ["0", "0"]
    assert client.violations == []


async def test_wait_sees_transient_states_and_reports_impossible_ones(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(
        NewElements(tid, ElementKind.JOB, "1002", [group("5000", jobState="STARTING")]),
        ElementChange(tid, ElementKind.JOB, [group("5000", jobState="RUNNING")]),
        ElementChange(tid, ElementKind.JOB, [group("5000", jobState="COMPLETED")]),
    )
    job = await client.wait_for(lambda: client.find_job("5000"), scaled(30))
    # RUNNING lasted for no time at all, but it was seen
    assert await client.wait_job_state(job, "RUNNING", scaled(30)) is job
    with pytest.raises(WaitFailed, match="completed without reaching SUSPENDED"):
        await client.wait_job_state(job, "SUSPENDED", scaled(30))
    with pytest.raises(UnknownElementError):
        client.job("nope")


async def test_wait_timeout(pair):
    client, fake = pair
    await started(client, fake)
    with pytest.raises(WaitTimeout, match="the moon"):
        await client.wait_for(lambda: False, 0.05, description="the moon")
    with pytest.raises(trio.TooSlowError):
        await client.wait_for(lambda: False, 0.01)


async def test_submit_error_and_terminate_error(pair):
    client, fake = pair
    await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            submit = await fake.expect(CommandId.SUBMIT_JOB)
            sub = [a for a in submit.args if a.startswith("jobSubId=")][0].split("=", 1)[1]
            await fake.send(SubmitJobError(submit.tid, sub, ErrorCode.SUBMIT_FAILED, "no such program"))
            terminate = await fake.expect(CommandId.TERMINATE_JOB)
            assert terminate.args == ("jobId=4242",)
            await fake.send(TerminateJobError(terminate.tid, "4242", ErrorCode.NO_SUCH_JOB, "no job 4242"))
            change = await fake.expect(CommandId.CHANGE_JOB)
            assert change.args == ("jobId=4242", "jobHold=true")
            await fake.send(Error(change.tid, ErrorCode.NOT_SUPPORTED, "cannot"))

        nursery.start_soon(agent_side)
        with pytest.raises(CommandFailed, match="no such program") as info:
            await client.submit("/nonexistent")
        assert info.value.code == ErrorCode.SUBMIT_FAILED
        with pytest.raises(CommandFailed, match="no job 4242"):
            await client.terminate("4242")
        with pytest.raises(CommandFailed, match="cannot"):
            await client.change_job("4242", jobHold=True)
    assert client.violations == []


async def test_stop_start_and_quit_sequence(pair):
    client, fake = pair
    start_tid = await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            stop = await fake.expect(CommandId.STOP_EVENTS)
            await fake.send(Ok(start_tid))
            start = await fake.expect(CommandId.START_EVENTS)
            await fake.send(Ok(stop.tid), NodeDown(start.tid))
            await fake.answer_fence()
            quit_ = await fake.expect(CommandId.QUIT)
            await fake.send(Ok(start.tid), Shutdown(quit_.tid))

        nursery.start_soon(agent_side)
        await client.stop_events()
        assert not client.events_started
        await client.start_events()
        assert client.events_started
        await client.wait_for(lambda: client.nodes["1003"].state == "DOWN", scaled(30))
        shutdown = await client.quit()
    assert isinstance(shutdown, Shutdown)
    assert client.violations == []
    with pytest.raises(ConnectionClosed):
        await client.command(CommandId.MODEL_DEF)


def NodeDown(tid):
    return ElementChange(tid, ElementKind.NODE, [group("1003", nodeState="DOWN")])


async def test_remove_cascades_and_remove_all(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(
        NewElements(tid, ElementKind.JOB, "1002", [group("5000-5001", jobState="RUNNING")]),
        NewElements(tid, ElementKind.PROCESS, "5000", [group("9000-9003", processState="RUNNING")]),
        RemoveProcesses(tid, "5000", ids("9003")),
        RemoveElements(tid, ElementKind.JOB, ids("5000")),
    )
    await client.wait_for(lambda: "5001" in client.jobs and "5000" not in client.jobs, scaled(30))
    assert set(client.jobs) == {"5001"} and client.processes == {}
    await fake.send(RemoveAll(tid))
    await client.wait_for(lambda: not client.machines, scaled(30))
    assert client.nodes == {} and client.queues == {} and client.jobs == {}
    assert client.rm is not None
    # after REMOVE_ALL the same ids may come back
    await fake.send(*fake.initial_model(tid))
    await client.wait_for(lambda: len(client.nodes) == 2, scaled(30))
    assert client.violations == []


async def test_string_ids_and_array_attributes(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(
        NewElements(tid, ElementKind.JOB, "1002", [ElementGroup("1000:abc", [("progArgs", "-v"), ("env", "A=1"), ("env", "B=2")])]),
    )
    job = await client.wait_for(lambda: client.find_job("1000:abc"), scaled(30))
    assert job.get("progArgs") == ["-v"]
    assert job.get("env") == ["A=1", "B=2"]


# --------------------------------------------------------------------------- the checker


async def test_event_with_unknown_tid_is_a_violation(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(ElementChange(tid + 100, ElementKind.NODE, [group("1003", nodeState="DOWN")]))
    with pytest.raises(ProtocolViolationError, match="matches no open command"):
        await client.wait_for(lambda: False, scaled(30))
    assert [v.rule for v in client.violations] == ["unknown-tid"]
    # the event was not applied, and the client stays failed
    assert client.nodes["1003"].state == "UP"
    with pytest.raises(ProtocolViolationError):
        await client.command(CommandId.MODEL_DEF)


async def test_change_for_unknown_element_is_a_violation(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(ElementChange(tid, ElementKind.JOB, [group("777", jobState="RUNNING")]))
    with pytest.raises(ProtocolViolationError, match="JOB_CHANGE for unknown job 777"):
        await client.wait_for(lambda: False, scaled(30))


async def test_violation_surfaces_in_a_pending_command(pair):
    client, fake = pair
    tid = await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            await fake.expect(CommandId.TERMINATE_JOB)
            await fake.send(NewElements(tid, ElementKind.NODE, "1001", [group("1003", nodeState="UP")]))

        nursery.start_soon(agent_side)
        with pytest.raises(ProtocolViolationError, match="NEW_NODE for id 1003, already a node"):
            await client.terminate("5")


async def test_malformed_frame_is_a_violation(pair):
    client, fake = pair
    await started(client, fake)
    frame = bytearray(encode_frame(0, 3, ["x"]))
    frame[-3:-2] = b"Z"  # break the argument's length prefix
    await fake.send_raw(bytes(frame))
    with pytest.raises(ProtocolViolationError, match="malformed frame"):
        await client.wait_for(lambda: False, scaled(30))
    assert client.violations[0].rule == "malformed-frame"


async def test_malformed_event_layout_is_a_violation(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send_raw(encode_frame(int(ElementKind.NODE.change_event), tid, ["1", "1003", "2", "nodeState=UP"]))
    with pytest.raises(ProtocolViolationError, match="malformed NODE_CHANGE"):
        await client.wait_for(lambda: False, scaled(30))


async def test_lost_framing_fails_even_a_lenient_client(lenient_pair):
    client, fake = lenient_pair
    await started(client, fake)
    await fake.send_raw(b"zzzzzzzz garbage")
    with pytest.raises(ProtocolViolationError, match="frame length is not 8 hex digits"):
        await client.wait_for(lambda: False, scaled(30))


async def test_lenient_client_records_and_carries_on(lenient_pair):
    client, fake = lenient_pair
    tid = await started(client, fake)
    await fake.send(
        ElementChange(tid, ElementKind.JOB, [group("777", jobState="RUNNING")]),  # unknown job
        NewElements(tid, ElementKind.JOB, "1003", [group("5000")]),  # parent is a node, not a queue
        NewElements(tid, ElementKind.NODE, "4444", [group("5001")]),  # unknown parent
        ProcessChange(tid, "6000", [group("9000", processState="RUNNING")]),  # unknown job
        RemoveElements(tid, ElementKind.QUEUE, ids("1001")),  # 1001 is a machine
        Ok(tid + 50),  # unknown TID
        NodeDown(tid),
    )
    await client.wait_for(lambda: client.nodes["1003"].state == "DOWN", scaled(30))
    assert [v.rule for v in client.violations] == [
        "unknown-element",
        "wrong-parent",
        "unknown-parent",
        "unknown-element",
        "wrong-kind",
        "unknown-tid",
    ]


async def test_early_ok_for_start_events_is_a_violation(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(Ok(tid))
    with pytest.raises(ProtocolViolationError, match="OK for START_EVENTS .* before the client sent STOP_EVENTS"):
        await client.wait_for(lambda: False, scaled(30))


async def test_model_event_under_another_commands_tid_is_a_violation(pair):
    client, fake = pair
    await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            submit = await fake.expect(CommandId.SUBMIT_JOB)
            await fake.send(NewElements(submit.tid, ElementKind.JOB, "1002", [group("5000", jobState="STARTING")]))

        nursery.start_soon(agent_side)
        with pytest.raises(ProtocolViolationError, match="model events belong to the open START_EVENTS"):
            await client.submit("/bin/true")


async def test_shutdown_leaving_commands_open_is_a_violation(pair):
    client, fake = pair
    await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            quit_ = await fake.expect(CommandId.QUIT)
            await fake.send(Shutdown(quit_.tid))  # no OK for the open START_EVENTS first

        nursery.start_soon(agent_side)
        with pytest.raises(ProtocolViolationError, match="SHUTDOWN while commands were still open: START_EVENTS"):
            await client.quit()


async def test_unseen_violation_is_raised_when_the_block_ends():
    client_end, agent_end = trio.testing.memory_stream_pair()
    fake = FakeAgent(agent_end)
    with pytest.raises(ProtocolViolationError, match="matches no open command"):
        async with AgentClient.from_stream(client_end) as client:
            await fake.send(Ok(99))
            await trio.testing.wait_all_tasks_blocked()
            assert client.violations


async def test_message_events_are_kept(pair):
    client, fake = pair
    tid = await started(client, fake)
    await fake.send(Message(tid, "WARNING", 12, "scheduler slow"))
    await client.wait_for(lambda: client.messages, scaled(30))
    assert client.messages[0].text == "scheduler slow"


async def test_reusing_an_open_tid_on_purpose(pair):
    client, fake = pair
    tid = await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            reused = await fake.expect(CommandId.MODEL_DEF)
            assert reused.tid == tid
            # events already on their way for the START_EVENTS that held the TID still count
            await fake.send(NodeDown(tid), Error(tid, ErrorCode.TID_IN_USE, "TID in use"))

        nursery.start_soon(agent_side)
        refused = await client.raw(CommandId.MODEL_DEF, [], tid=tid, timeout=scaled(30))
    assert isinstance(refused.completion, Error) and refused.completion.code == ErrorCode.TID_IN_USE
    assert client.nodes["1003"].state == "DOWN"
    # the START_EVENTS that held the TID is abandoned: nothing more may come for it
    assert not client.events_started and client.violations == []
    await fake.send(NodeDown(tid))
    with pytest.raises(ProtocolViolationError, match="matches no open command"):
        await client.wait_for(lambda: False, scaled(30))


async def test_command_queued_on_a_tid_takes_it_over_when_the_holder_completes(pair):
    client, fake = pair
    await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            first = await fake.expect(CommandId.TERMINATE_JOB)
            second = await fake.expect(CommandId.LIST_FILTERS)
            assert second.tid == first.tid
            # the agent finished the first before it read the second: both are answered normally
            await fake.send(Ok(first.tid), Error(second.tid, ErrorCode.NOT_SUPPORTED, "no filters"))

        nursery.start_soon(agent_side)
        first = await client.send_command(CommandId.TERMINATE_JOB, ["jobId=5"])
        second = await client.raw(CommandId.LIST_FILTERS, [], tid=first.tid, timeout=scaled(30))
    assert first.ok and not first.abandoned
    assert isinstance(second.completion, Error) and second.completion.code == ErrorCode.NOT_SUPPORTED
    assert client.violations == []


async def test_quit_on_an_open_tid_abandons_the_holder(pair):
    client, fake = pair
    tid = await started(client, fake)
    async with trio.open_nursery() as nursery:

        async def agent_side():
            quit_ = await fake.expect(CommandId.QUIT)
            assert quit_.tid == tid
            await fake.send(Shutdown(tid))

        nursery.start_soon(agent_side)
        command = await client.raw(CommandId.QUIT, [], tid=tid, timeout=scaled(30))
    assert isinstance(command.completion, Shutdown)
    assert client.violations == []


async def test_subscribe_sees_both_directions(pair):
    client, fake = pair
    seen = []
    async with client.subscribe() as traffic:
        await started(client, fake)
        while True:
            with trio.fail_after(scaled(30)):
                record = await traffic.receive()
            seen.append(record)
            if record.direction == "in" and len(client.nodes) == 2 and sum(1 for r in seen if r.direction == "in") >= 7:
                break
    outgoing = [r.message.name for r in seen if r.direction == "out"]
    assert outgoing == ["INIT", "MODEL_DEF", "START_EVENTS", "LIST_FILTERS"]
    assert seen[0].raw.startswith(b"0000") and b"baseId=1000" in seen[0].raw
    incoming = [r for r in seen if r.direction == "in"]
    assert all(r.raw.startswith(b"0000") for r in incoming)
    assert incoming[0].completed and incoming[0].command.name == "INIT"


# --------------------------------------------------------------------------- ending


async def test_agent_closing_the_connection_fails_waiters(pair):
    client, fake = pair
    await started(client, fake)
    await fake.stream.aclose()
    with pytest.raises(ConnectionClosed, match="closed the connection"):
        await client.wait_for(lambda: False, scaled(30))
    assert client.violations == []


async def test_aclose_is_idempotent(pair):
    client, fake = pair
    await client.aclose()
    await client.aclose()
    assert isinstance(client.ended, ConnectionClosed)


async def test_spawn_failure_is_a_connect_error():
    with pytest.raises(ConnectError, match="cannot start the agent '/nonexistent/agent'"):
        await AgentClient.spawn(["/nonexistent/agent"])


async def test_spawned_agent_exiting_shows_its_stderr():
    script = "import sys; sys.stderr.write('first\\nbad config: no scheduler\\n'); sys.exit(3)"
    async with await AgentClient.spawn([sys.executable, "-c", script]) as client:
        with pytest.raises(AgentExited) as info:
            await client.init()
    assert info.value.returncode == 3
    assert "exited with status 3" in str(info.value)
    assert info.value.stderr_tail.endswith("bad config: no scheduler")


async def test_spawned_child_is_reaped_when_it_ignores_eof():
    script = "import time; time.sleep(60)"
    client = await AgentClient.spawn([sys.executable, "-c", script], exit_grace=0.2)
    with trio.fail_after(scaled(30)):
        async with client:
            pass
    assert client.process.returncode == -15


async def test_listen_for_agent_accepts_a_connect_back():
    async with await listen_for_agent("127.0.0.1", 0) as listener:
        async with trio.open_nursery() as nursery:

            async def agent():
                stream = await trio.open_tcp_stream("127.0.0.1", listener.port)
                fake = FakeAgent(stream)
                init = await fake.expect(CommandId.INIT)
                await fake.send(Ok(init.tid))
                await stream.aclose()

            nursery.start_soon(agent)
            client = await listener.accept(timeout=scaled(30))
            async with client:
                await client.init()


async def test_listen_for_agent_reports_an_agent_that_exits_first():
    from proxy_agent.client import AgentProcess

    async with await listen_for_agent("127.0.0.1", 0) as listener:
        process = await AgentProcess.start(
            [sys.executable, "-c", "import sys; sys.stderr.write('cannot connect\\n'); sys.exit(2)"], stdio=False
        )
        with pytest.raises(AgentExited, match="exited with status 2 before connecting"):
            await listener.accept(process=process, timeout=scaled(30))
        await process.reap()


async def test_unix_connect_error_names_the_path(tmp_path):
    with pytest.raises(ConnectError, match="cannot connect to .*nothing-here"):
        await AgentClient.connect_unix(str(tmp_path / "nothing-here"))


# --------------------------------------------------------------------------- sans-I/O state


def test_job_attributes_layout():
    args = job_attributes("sleep", ["1"], count=3, queue="1002", sub_id="s1", jobHold=False, extra=["a", "b"])
    assert args == [
        "jobSubId=s1",
        "execName=sleep",
        "progArgs=1",
        "jobNumProcs=3",
        "queueId=1002",
        "jobHold=false",
        "extra=a",
        "extra=b",
    ]


NATIVE_INIT = ["version=2.0", "baseId=1000", "dialect=native"]


def _scripted_bytes():
    state = ClientState()
    init, _ = state.send(CommandId.INIT, NATIVE_INIT)
    start, _ = state.send(CommandId.START_EVENTS)
    events = [
        Ok(init.tid),
        NewElements(start.tid, ElementKind.MACHINE, "1000", [group("1001", name="m0")]),
        NewElements(start.tid, ElementKind.NODE, "1001", [group("1002-1010", nodeState="UP")]),
        ElementChange(start.tid, ElementKind.NODE, [group("1005", nodeState="DOWN", name="ünïcode node")]),
    ]
    return b"".join(e.encode() for e in events)


def _fresh_state():
    state = ClientState()
    state.send(CommandId.INIT, NATIVE_INIT)
    state.send(CommandId.START_EVENTS)
    return state


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_chunking_does_not_matter(cuts):
    data = _scripted_bytes()
    whole = _fresh_state()
    expected = whole.receive_data(data)
    state = _fresh_state()
    got = []
    pos = 0
    for size in cuts:
        got += state.receive_data(data[pos:pos + size])
        pos += size
    got += state.receive_data(data[pos:])
    assert [t.raw for t in got] == [t.raw for t in expected]
    assert b"".join(t.raw for t in got) == data
    assert {k: e.attributes for k, e in state.elements.items()} == {k: e.attributes for k, e in whole.elements.items()}
    assert state.elements["1005"].name == "ünïcode node"
    assert state.violations == []


def test_tids_are_fresh_while_open():
    state = ClientState()
    a, _ = state.send(CommandId.START_EVENTS)
    b, _ = state.send(CommandId.MODEL_DEF)
    assert a.tid != b.tid
    state._next_tid = a.tid  # wrap-around onto a TID still open
    c, _ = state.send(CommandId.MODEL_DEF)
    assert c.tid not in (a.tid, b.tid)


def test_huge_range_is_refused_without_expanding():
    state = _fresh_state()
    (traffic,) = state.receive_data(NewElements(2, ElementKind.NODE, "1000", [group("1-4000000000")]).encode())
    assert [v.rule for v in traffic.violations] == ["too-many-ids"]
    assert state.by_kind["node"] == {}


# --------------------------------------------------------------------------- against the real agent

from agent_fixtures import BackgroundAgent, agent_argv, agent_present, free_port, stored_jobs, subprocess_env  # noqa: E402

needs_agent = pytest.mark.skipif(not agent_present(), reason="the agent's command line is not there yet")


async def open_session(*agent_args: str, **kwargs) -> AgentClient:
    return await AgentClient.spawn(agent_argv(*agent_args), env=subprocess_env(), **kwargs)


async def handshake(client: AgentClient, **init) -> None:
    await client.init(**init)
    await client.model_def()
    await client.start_events()
    await client.wait_for(lambda: client.queues and client.nodes, scaled(30), description="the initial model")


@needs_agent
async def test_real_local_agent_session(tmp_path):
    async with await open_session() as client:
        await handshake(client)
        (machine,) = client.machines.values()
        assert [q.name for q in client.queues.values()] == ["default"]
        assert client.children(machine, "node")

        job = await client.submit("/bin/sh", ["-c", 'echo "$PROXY_AGENT_PROCESS_INDEX $GREETING"; pwd'],
                                  count=3, env={"GREETING": "hi there"}, cwd=str(tmp_path))
        done = await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert done.get("jobStatus") == "FINISHED"
        assert sorted(client.job_output(job).splitlines()) == sorted(["0 hi there", "1 hi there", "2 hi there"] + [str(tmp_path)] * 3)
        processes = client.children(job, "process")
        assert sorted(p.id for p in processes) == ["0", "1", "2"]
        assert all(p.get("processExitCode") == "0" and p.state == "COMPLETED" for p in processes)

        failing = await client.submit("sh", ["-c", "echo oops >&2; exit 4"])
        failed = await client.wait_job_state(failing, "COMPLETED", scaled(30))
        assert failed.get("jobStatus") == "FAILED"
        assert client.job_output(failing, "stderr") == "oops\n"
        assert client.children(failing, "process")[0].get("processExitCode") == "4"

        with pytest.raises(CommandFailed) as info:
            await client.submit("/nonexistent/program")
        assert info.value.code == ErrorCode.SUBMIT_FAILED and "not found" in info.value.message
        with pytest.raises(CommandFailed, match="no job"):
            await client.terminate("999999")
        with pytest.raises(CommandFailed) as info:
            await client.move_job(job, "default")
        assert info.value.code == ErrorCode.NOT_SUPPORTED

        shutdown = await client.quit()
        assert isinstance(shutdown, Shutdown)
        assert client.violations == []
    assert client.process.returncode == 0


@needs_agent
async def test_real_agent_terminate_suspend_resume():
    async with await open_session() as client:
        await handshake(client)
        job = await client.submit("/bin/sleep", ["30"])
        await client.wait_job_state(job, "RUNNING", scaled(30))
        await client.change_job(job, suspend=True)
        await client.wait_job_state(job, "SUSPENDED", scaled(30))
        await client.change_job(job, suspend=False)
        await client.wait_for(lambda: client.job(job).state == "RUNNING", scaled(30))
        await client.terminate(job)
        ended = await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert ended.get("jobStatus") == "KILLED"
        assert client.children(job, "process")[0].get("processSignalName") == "SIGTERM"
        assert ended.states[-4:] == ["RUNNING", "SUSPENDED", "RUNNING", "COMPLETED"]
        await client.quit()
        assert client.violations == []


@needs_agent
async def test_real_agent_holds_changes_while_events_are_stopped():
    env = subprocess_env()
    async with await AgentClient.spawn(agent_argv(), env=env) as client:
        await handshake(client)
        await client.stop_events()
        script = "for i in 1 2 3 4 5; do echo line$i; done"
        sub_id = await client.submit_nowait("/bin/sh", ["-c", script])
        # the job runs and ends while nothing may be sent
        await wait_until(lambda: any(j["client_ref"] == sub_id and j["ended"] for j in stored_jobs(env)),
                         what="the agent to see the job end")
        assert client.find_job(sub_id) is None
        await client.start_events()
        job = await client.wait_for(lambda: client.find_job(sub_id), scaled(30))
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert client.job_output(job) == "line1\nline2\nline3\nline4\nline5\n"
        await client.quit()
        assert client.violations == []


@needs_agent
async def test_real_agent_answers_bad_commands_with_errors():
    async with await open_session() as client:
        unknown = await client.raw(0x77, [])
        assert isinstance(unknown.completion, Error) and unknown.completion.code == ErrorCode.UNKNOWN_COMMAND
        early = await client.raw(CommandId.SUBMIT_JOB, ["jobSubId=x", "execName=true"])
        assert isinstance(early.completion, Error) and early.completion.code == ErrorCode.ILLEGAL_IN_PHASE
        with pytest.raises(CommandFailed) as info:
            await client.init(version="9.9")
        assert info.value.code == ErrorCode.UNSUPPORTED_VERSION
        await handshake(client, base_id=500)
        assert client.rm.id == "500"
        assert all(int(e.id) > 500 for e in client.state.elements.values() if e.kind not in ("rm", "process"))
        await client.quit()
        assert client.violations == []


@needs_agent
async def test_real_agent_refuses_what_is_not_an_id_and_the_ides_command_7():
    async with await open_session() as client:
        await handshake(client)
        job = await client.submit("/bin/sleep", ["30"])
        await client.wait_job_state(job, "RUNNING", scaled(30))
        arabic = "".join(chr(0x0660 + int(d)) for d in job)  # the job's id in Arabic-Indic digits
        for args in ([f"jobId={arabic}"], ["jobId=" + "_".join(job)], [f"jobId=+{job}"]):
            refused = await client.raw(CommandId.TERMINATE_JOB, args, timeout=scaled(30))
            # a termination is refused the way the IDE matches it: TERMINATEJOB_ERROR naming the jobId
            assert isinstance(refused.completion, TerminateJobError)
            assert refused.completion.code == ErrorCode.BAD_ARGUMENTS
            assert refused.completion.job_id == args[0][len("jobId="):]
        filters = await client.raw(CommandId.MOVE_JOB, ["jobState=RUNNING", "filterChildren=true", f"id={job}"], timeout=scaled(30))
        assert filters.completion.code == ErrorCode.BAD_ARGUMENTS and "command 7" in filters.completion.message
        assert client.job(job).state == "RUNNING"  # none of it touched the job
        await client.terminate(job)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        await client.quit()
        assert client.violations == []


@needs_agent
async def test_real_agent_in_the_default_dialect_answers_stop_events_at_once():
    """The IDE's INIT (extra attributes, no dialect), then two launches while events are stopped."""
    async with await open_session(reference=True) as client:
        await handshake(client, base_id=2**24, extra=["slurmdPath=", "slurmdArgs="])
        stop = await client.stop_events()
        assert stop.ok and client.state.open_command(CommandId.STOP_EVENTS) is None
        subs = [await client.submit_nowait("/bin/true") for _ in range(2)]
        await client.start_events()
        for sub in subs:
            job = await client.wait_for(lambda sub=sub: client.find_job(sub), scaled(30))
            await client.wait_job_state(job, "COMPLETED", scaled(30))
        await client.quit()
        assert client.violations == []


@needs_agent
async def test_real_agent_refuses_a_base_id_the_ide_could_not_hold():
    async with await open_session(dialect="default", strict=False) as client:
        with pytest.raises(CommandFailed, match="at most 2130706432") as info:
            await client.init(base_id=2**31)
        assert info.value.code == ErrorCode.BAD_ARGUMENTS
        await handshake(client, base_id=2130706432)
        await client.quit()


@needs_agent
async def test_real_agent_over_a_unix_socket_serves_sessions_one_after_another(tmp_path):
    path = str(tmp_path / "agent.sock")
    async with BackgroundAgent("--unix", path):
        assert os.stat(path).st_mode & 0o777 == 0o600
        for _ in range(2):
            # The agent refuses (BUSY) while it is still winding the previous session down.
            with trio.fail_after(scaled(30)):
                while True:
                    client = await AgentClient.connect_unix(path)
                    async with client:
                        try:
                            await handshake(client)
                        except CommandFailed as exc:
                            assert exc.code == ErrorCode.BUSY, exc
                            await trio.sleep(0.05)
                            continue
                        job = await client.submit("echo", ["over unix"])
                        await client.wait_job_state(job, "COMPLETED", scaled(30))
                        assert client.job_output(job) == "over unix\n"
                        assert client.violations == []
                        break
            # leaving without QUIT ends the session, not the agent


@needs_agent
async def test_real_agent_over_tcp_checks_the_token():
    port = free_port()
    env = subprocess_env(PROXY_AGENT_TOKEN="correct horse")
    async with BackgroundAgent("--listen", f"127.0.0.1:{port}", env=env):
        async with await AgentClient.connect_tcp("127.0.0.1", port) as client:
            with pytest.raises(TokenRefused, match="wrong token"):
                await client.init(token="battery staple")
            with pytest.raises(ConnectionClosed):
                await client.wait_for(lambda: False, scaled(30))
        async with await AgentClient.connect_tcp("127.0.0.1", port) as client:
            await handshake(client, token="correct horse")
            assert client.violations == []


@needs_agent
async def test_real_agent_connects_back():
    async with await listen_for_agent("127.0.0.1", 0) as listener:
        from proxy_agent.client import AgentProcess

        process = await AgentProcess.start(agent_argv("--connect", listener.address), env=subprocess_env(), stdio=False)
        client = await listener.accept(process=process, timeout=scaled(30))
        async with client:
            await handshake(client)
            await client.quit()
            assert client.violations == []
        assert process.returncode == 0


@needs_agent
async def test_real_sim_agent_under_churn_keeps_the_rules():
    """Two seconds of a churning 50-node cluster, with a stop/start in the middle.

    The checker validates every event against the mirror as it arrives (no NEW
    for a known id, no CHANGE/REMOVE for an unknown one, right parents, right
    TIDs); after the run the mirror must still describe the cluster's shape.
    """
    async with await open_session("--scheduler", "sim", "--sim-nodes", "50", "--sim-jobs", "20", "--sim-churn", "200") as client:
        await handshake(client)
        await client.wait_for(lambda: len(client.nodes) == 50, scaled(30))
        start = client.state.model_events
        await client.wait_for(lambda: client.state.model_events - start > 100, scaled(30), description="churn")
        await client.stop_events()
        # not a wait: the cluster moves on while the client hears nothing, and the agent holds
        # and coalesces what changes (however little that is on a slow machine)
        await trio.sleep(0.4)
        await client.start_events()
        job = await client.submit("lammps", queue="debug", count=4)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        await client.stop_events()
        assert client.state.model_events - start > 100
        assert len(client.nodes) == 50 and len(client.queues) == 3 and len(client.machines) == 1
        assert {n.state for n in client.nodes.values()} <= {"UP", "DOWN"}
        for element in client.jobs.values():
            assert client.element(element.parent).kind == "queue"
        for element in client.processes.values():
            assert element.key in client.element(element.parent).children
        assert len(client.job_output(job).splitlines()) == 4 * 3
        await client.quit()
        assert client.violations == []


async def test_mirror_equals_the_agents_model_under_churn(mock_clock):
    """The strongest check of the mirror: compare it with the agent's own model object.

    The real agent session (protocol, model diffs, simulated scheduler) runs
    in this process on a virtual clock.  Between checks virtual time runs 20
    times faster than real time (a simulated second of churn takes 50 ms).
    For a check the clock is stopped and then moved only in small steps until
    the agent has sent everything it had pending and the client has read it:
    at that instant the client's mirror must equal the agent's model exactly
    -- ids, kinds, parents, attributes -- including after stop/start cycles,
    where the agent sends coalesced differences instead of a stream.
    """
    from agent_fixtures import mirror_view, ptp_view
    from proxy_agent.frontends.ptp import PtpSession
    from proxy_agent.schedulers.sim import SimBackend, SimOptions
    from proxy_agent.service.service import JobService

    service = JobService()
    service.add_backend(SimBackend(service.model, SimOptions(nodes=50, jobs=20, churn=200.0, seed=11), service.context()))
    client_end, agent_end = trio.testing.memory_stream_pair()
    session = PtpSession(agent_end, service)
    # Not autojump: it lands exactly on the simulator's tick deadlines, where its
    # loop can spin without ever waiting (see the report on SimBackend._loop).
    mock_clock.rate = 20.0

    def agent_view():
        return ptp_view(service.model, 1000)

    async def check(client):
        mock_clock.rate = 0.0
        try:
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(100):
                if not session.view.has_pending:
                    break
                mock_clock.jump(0.0031)  # past the agent's 2 ms coalescing window
                await trio.testing.wait_all_tasks_blocked()
            else:
                raise AssertionError("the agent never caught up with its model")
            mirror, agent = mirror_view(client), agent_view()
            different = {k: (mirror.get(k), agent.get(k)) for k in set(mirror) | set(agent) if mirror.get(k) != agent.get(k)}
            assert different == {}, repr(different)
        finally:
            mock_clock.rate = 20.0

    checks = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        nursery.start_soon(session.run)
        async with AgentClient.from_stream(client_end) as client:
            await handshake(client)
            await check(client)
            for round_ in range(12):
                await trio.sleep(0.2)  # 40 churn events
                if round_ == 3:
                    job = await client.submit("wrf", count=3, queue="long")
                if round_ in (5, 8):
                    await client.stop_events()
                    await trio.sleep(0.3)  # the cluster moves on; the agent holds and coalesces
                    await client.start_events()
                await check(client)
                checks += 1
            await client.wait_job_state(job, "COMPLETED", scaled(30))
            changes = client.state.model_events
            await client.quit()
            assert client.violations == []
        nursery.cancel_scope.cancel()
    assert checks == 12 and changes > 200
