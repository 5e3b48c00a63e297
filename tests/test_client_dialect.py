"""The client in the default dialect and in reference mode: plain bytes in, violations and mirror out.

The sans-I/O :class:`ClientState` is fed exactly the bytes an agent would
send; the few tests at the end drive :class:`AgentClient` against the
scripted fake agent to show that a breach fails loudly.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from agent_fixtures import FakeAgent, ids
from wait_support import scaled
from proxy_agent.client import AgentClient, ClientState, ConnectionClosed, ProtocolViolationError
from proxy_agent.protocol.attributes import STANDARD_ATTRIBUTES, AttributeDefinition, AttrType
from proxy_agent.protocol.dialect import DEFAULT, NATIVE
from proxy_agent.protocol.messages import (
    AttrDef,
    CommandId,
    ElementChange,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    FilterDef,
    Message,
    NewElements,
    Ok,
    ProcessChange,
    RemoveProcesses,
    Shutdown,
    SubmitJobError,
)
from proxy_agent.protocol.wire import encode_frame

DEFAULT_INIT = ["version=2.0", "baseId=1000"]
NATIVE_INIT = DEFAULT_INIT + ["dialect=native"]


def group(id_text, *pairs, **attrs):
    numeric = set(id_text) <= set("0123456789,-")
    return ElementGroup(ids(id_text) if numeric else id_text, list(pairs) + list(attrs.items()))


class Session:
    """A ClientState past INIT, MODEL_DEF and START_EVENTS, with one machine, queue and job."""

    def __init__(self, init=DEFAULT_INIT, *, reference=False, procs="2") -> None:
        self.state = ClientState(reference=reference)
        self.dialect = DEFAULT if "dialect=native" not in init else NATIVE
        init_cmd, _ = self.state.send(CommandId.INIT, init)
        model_def, _ = self.state.send(CommandId.MODEL_DEF)
        self.start, _ = self.state.send(CommandId.START_EVENTS)
        self.tid = self.start.tid
        job_attrs = [("name", "a"), ("jobState", "RUNNING")] + ([("jobNumProcs", procs)] if procs else [])
        self.feed(
            Ok(init_cmd.tid),
            AttrDef(model_def.tid, self.dialect.attribute_definitions(STANDARD_ATTRIBUTES)),
            Ok(model_def.tid),
            NewElements(self.tid, ElementKind.MACHINE, "1000", [group("1001", name="m")]),
            NewElements(self.tid, ElementKind.QUEUE, "1000", [group("1002", name="q")]),
            NewElements(self.tid, ElementKind.JOB, "1002", [group("5000", *job_attrs)]),
        )
        assert self.state.violations == [], self.state.violations

    def feed(self, *events):
        """Encode as the agent does in this dialect; return the rules broken."""
        data = b"".join(self.dialect.encode(event) for event in events)
        return self.raw(data)

    def raw(self, data: bytes):
        traffic = self.state.receive_data(data)
        return [v.rule for t in traffic for v in t.violations]


# ----------------------------------------------------------------- the default dialect's text


def test_the_client_asks_for_what_it_gets():
    assert ClientState().dialect is DEFAULT
    assert Session(NATIVE_INIT).state.dialect is NATIVE
    assert Session(DEFAULT_INIT).state.dialect is DEFAULT
    state = ClientState()
    state.send(CommandId.INIT, DEFAULT_INIT + ["dialect=bogus"])
    assert state.dialect is DEFAULT  # the agent refuses that INIT, in the default dialect


def test_escaped_text_reaches_the_mirror_as_it_was():
    s = Session()
    data = DEFAULT.encode(ElementChange(s.tid, ElementKind.JOB, [group("5000", name="Überprüfung \\ 🙂")]))
    assert data.isascii() and b"\\\\" in data
    assert s.raw(data) == []
    assert s.state.elements["5000"].name == "Überprüfung \\ 🙂"
    s.feed(NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0-1", processState="RUNNING")]))
    assert s.feed(ProcessChange(s.tid, "5000", [group("1", processStdout="é\nC:\\dir")])) == []
    assert s.state.process("5000", 1).text() == "é\nC:\\dir\n"


@given(st.lists(st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=())), max_size=5))
def test_any_text_survives_the_default_dialect(names):
    s = Session()
    groups = [group(str(2000 + n), name=name) for n, name in enumerate(names)]
    if groups:
        assert s.feed(NewElements(s.tid, ElementKind.NODE, "1001", groups)) == []
    assert [s.state.elements[str(2000 + n)].name for n in range(len(names))] == names


def test_a_non_ascii_byte_breaks_the_default_dialect():
    s = Session()
    rules = s.raw(ElementChange(s.tid, ElementKind.JOB, [group("5000", name="é")]).encode())
    assert rules == ["non-ascii"]
    assert "0xC3 at offset" in s.state.violations[-1].message


def test_native_dialect_takes_utf8_and_backslashes_as_they_are():
    s = Session(NATIVE_INIT)
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", name="é\\xe9")])) == []
    assert s.state.elements["5000"].name == "é\\xe9"


@pytest.mark.parametrize("text", ["a\\b", "\\u00e9", "\\x41", "trailing \\"])
def test_a_bad_escape_is_a_violation(text):
    s = Session()
    rules = s.raw(encode_frame(0xE6, s.tid, ["1", "5000", "1", f"name={text}"]))
    assert rules == ["bad-escape"]


# ----------------------------------------------------------------- the default dialect's other rules


def test_only_the_seven_attribute_types():
    s = Session()
    model_def, _ = s.state.send(CommandId.MODEL_DEF)
    rules = s.feed(AttrDef(model_def.tid, STANDARD_ATTRIBUTES), Ok(model_def.tid))
    assert rules == ["attr-type", "attr-type"]  # progArgs and env
    native = Session(NATIVE_INIT)
    model_def, _ = native.state.send(CommandId.MODEL_DEF)
    assert native.feed(AttrDef(model_def.tid, STANDARD_ATTRIBUTES), Ok(model_def.tid)) == []


@pytest.mark.parametrize(
    "pairs",
    [
        [("progArgs", "-v")],
        [("env", "A=1")],
        [("name", "a"), ("name", "b")],
    ],
)
def test_no_array_values_in_element_events(pairs):
    s = Session()
    assert s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group("5001", *pairs)])) == ["array-value"]
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5001", *pairs)])) == ["array-value"]
    native = Session(NATIVE_INIT)
    assert native.feed(NewElements(native.tid, ElementKind.JOB, "1002", [group("5001", *pairs)])) == []


def test_repeated_output_in_one_group_is_an_array_value():
    s = Session()
    s.feed(NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0", processState="RUNNING")]))
    rules = s.feed(ProcessChange(s.tid, "5000", [group("0", ("processStdout", "a"), ("processStdout", "b"))]))
    assert rules == ["array-value"]


@pytest.mark.parametrize("value", ["4294967294", "2147483648", "-2147483649", "1_0", "007", "UNLIMITED"])
def test_integer_values_fit_a_java_int(value):
    s = Session()
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobNumProcs=value)])) == ["integer-range"]
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobNumProcs="2147483647")])) == []


def test_element_ids_are_numbers_within_a_java_int():
    s = Session()
    assert s.feed(NewElements(s.tid, ElementKind.NODE, "1001", [group("2147483647")])) == []
    assert s.feed(NewElements(s.tid, ElementKind.NODE, "1001", [group("2147483648")])) == ["element-id"]
    assert s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group("1000:job-7")])) == ["element-id"]
    native = Session(NATIVE_INIT)
    assert native.feed(NewElements(native.tid, ElementKind.JOB, "1002", [group("1000:job-7"), group("2147483648")])) == []


def test_stop_events_is_answered_at_once_in_the_default_dialect():
    s = Session()
    stop, _ = s.state.send(CommandId.STOP_EVENTS)
    assert s.feed(Ok(s.tid), Ok(stop.tid)) == []
    assert stop.ok and s.start.ok
    # late: something else between the two OKs
    s = Session()
    stop, _ = s.state.send(CommandId.STOP_EVENTS)
    submit, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=x"])
    assert s.feed(Ok(s.tid), Ok(submit.tid), Ok(stop.tid)) == ["stop-events-late"]


def test_native_stop_events_waits_for_the_next_start_events():
    s = Session(NATIVE_INIT)
    stop, _ = s.state.send(CommandId.STOP_EVENTS)
    assert s.feed(Ok(s.tid)) == []
    assert s.feed(Ok(stop.tid)) == ["early-ok"]


# ----------------------------------------------------------------- processes by rank


def test_processes_are_keyed_by_job_and_rank():
    s = Session(procs="3")
    s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group("5001", jobNumProcs="3")]))
    assert s.feed(
        NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0-2", processState="RUNNING")]),
        NewElements(s.tid, ElementKind.PROCESS, "5001", [group("0-2", processState="STARTING")]),
        ProcessChange(s.tid, "5001", [group("0", processStdout="from 5001")]),
        RemoveProcesses(s.tid, "5000", ids("2")),
    ) == []
    state = s.state
    assert state.process("5000", 0).state == "RUNNING" and state.process("5001", "0").state == "STARTING"
    assert state.process("5000", 2) is None and state.process("5001", 2) is not None
    assert state.process("5001", 0).text() == "from 5001\n" and state.process("5000", 0).text() == ""
    assert state.elements["5001"].text() == "from 5001\n"
    assert sorted(state.by_kind["process"]) == [("5000", "0"), ("5000", "1"), ("5001", "0"), ("5001", "1"), ("5001", "2")]
    assert state.process("5000", 1).rank == 1 and state.process("5000", 1).parent == "5000"
    # unknown rank, unknown job
    assert s.feed(ProcessChange(s.tid, "5000", [group("2", processState="COMPLETED")])) == ["unknown-element"]
    assert s.feed(RemoveProcesses(s.tid, "5099", ids("0"))) == ["unknown-element"]


def test_removing_a_job_removes_its_processes_only():
    s = Session()
    s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group("5001", jobNumProcs="1")]))
    s.feed(
        NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0")]),
        NewElements(s.tid, ElementKind.PROCESS, "5001", [group("0")]),
    )
    from proxy_agent.protocol.messages import RemoveElements

    assert s.feed(RemoveElements(s.tid, ElementKind.JOB, ids("5000"))) == []
    assert list(s.state.by_kind["process"]) == [("5001", "0")]


# ----------------------------------------------------------------- reference mode


def test_reference_mode_checks_ranks_against_the_process_count():
    s = Session(reference=True, procs="2")
    assert s.feed(NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0-1")])) == []
    assert s.feed(ProcessChange(s.tid, "5000", [group("2", processState="RUNNING")])) == ["process-rank", "unknown-element"]
    # element ids where ranks belong: the mistake the PTP 4.0 client paid 2 MiB per job for
    assert s.feed(NewElements(s.tid, ElementKind.PROCESS, "5000", [group("16485-16486")])) == ["process-rank"]
    assert "rank 16486 of job 5000, which has 2 processes" in s.state.violations[-1].message
    # without a process count the client cannot size its rank table
    s = Session(reference=True, procs=None)
    assert s.feed(NewElements(s.tid, ElementKind.PROCESS, "5000", [group("0")])) == ["process-rank"]
    # the lenient default-dialect client does not know the IDE's indexing
    lenient = Session(procs="1")
    assert lenient.feed(NewElements(lenient.tid, ElementKind.PROCESS, "5000", [group("7")])) == []


def test_reference_mode_wants_errors_not_messages_for_refusals():
    s = Session(reference=True)
    assert s.feed(Message(s.tid, "ERROR", ErrorCode.TID_IN_USE, "refused")) == ["message-refusal"]
    assert s.feed(Message(s.tid, "WARNING", ErrorCode.SCHEDULER, "slow")) == []


def test_reference_mode_knows_no_filter_def_and_checks_enumerated_values():
    s = Session(reference=True)
    filters, _ = s.state.send(CommandId.LIST_FILTERS)
    assert s.feed(FilterDef(filters.tid, ()), Ok(filters.tid)) == ["unknown-event"]
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobState="PENDING")])) == ["enum-value"]
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobState="COMPLETED")])) == []


def test_reference_mode_lists_unanswered_commands():
    s = Session(reference=True)
    submit, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=x"])
    found = s.state.unanswered()
    assert {v.tid for v in found} == {s.tid, submit.tid} and all(v.rule == "unanswered" for v in found)


def test_reference_mode_speaks_the_default_dialect_only():
    with pytest.raises(ValueError, match="default dialect only"):
        ClientState(reference=True).send(CommandId.INIT, NATIVE_INIT)
    with pytest.raises(ValueError, match="default dialect only"):
        AgentClient(trio.testing.memory_stream_pair()[0], reference=True, dialect="native")


def test_fatal_framing_records_the_same_bytes_however_they_arrive():
    data = b"zzzzzzzz and more bytes after the broken length"
    whole = ClientState().receive_data(data)
    state = ClientState()
    pieces = state.receive_data(data[:3]) + state.receive_data(data[3:10]) + state.receive_data(data[10:])
    assert [t.raw for t in whole] == [t.raw for t in pieces] == [b"zzzzzzzz"]


# ----------------------------------------------------------------- AgentClient


@pytest.fixture
async def reference_pair():
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with AgentClient.from_stream(client_end, reference=True) as client:
        yield client, FakeAgent(agent_end, DEFAULT)


async def _started(client, fake):
    tids = []
    async with trio.open_nursery() as nursery:

        async def agent_side():
            tids.append(await fake.handshake())

        nursery.start_soon(agent_side)
        await client.init(extra=["slurmdPath="])
        await client.model_def()
        await client.start_events()
    return tids[0]


async def test_reference_client_session(reference_pair):
    client, fake = reference_pair
    start = await _started(client, fake)
    assert fake.received[0].args == ("version=2.0", "baseId=1000", "slurmdPath=")
    assert "progArgs" not in client.attr_defs
    async with trio.open_nursery() as nursery:

        async def agent_side():
            stop = await fake.expect(CommandId.STOP_EVENTS)
            await fake.send(Ok(start), Ok(stop.tid))
            quit_ = await fake.expect(CommandId.QUIT)
            await fake.send(Shutdown(quit_.tid))

        nursery.start_soon(agent_side)
        stop = await client.stop_events()
        assert stop.ok  # answered at once, and stop_events() waited for it
        await client.quit()
    assert client.violations == []


async def test_reference_client_fails_loudly_on_array_values(reference_pair):
    client, fake = reference_pair
    start = await _started(client, fake)
    await fake.send(NewElements(start, ElementKind.JOB, "1002", [group("5000", ("jobSubId", "s"), ("progArgs", "-v"))]))
    with pytest.raises(ProtocolViolationError, match="progArgs"):
        await client.wait_for(lambda: False, scaled(30))


async def test_reference_client_fails_when_the_agent_leaves_commands_unanswered(reference_pair):
    client, fake = reference_pair
    await _started(client, fake)
    await client.send_command(CommandId.SUBMIT_JOB, ["jobSubId=x"])
    await fake.expect(CommandId.SUBMIT_JOB)
    await fake.stream.aclose()
    with pytest.raises(ProtocolViolationError, match="never got a completing event"):
        await client.wait_for(lambda: False, scaled(30))


async def test_native_client_is_not_held_to_the_reference_rules():
    client_end, agent_end = trio.testing.memory_stream_pair()
    fake = FakeAgent(agent_end)
    async with AgentClient.from_stream(client_end) as client:
        start = await _started(client, fake)
        assert fake.received[0].args[-2:] == ("dialect=native", "slurmdPath=")
        await fake.send(NewElements(start, ElementKind.JOB, "1002", [group("5000", ("name", "é"), ("progArgs", "-v"))]))
        job = await client.wait_for(lambda: client.find_job("5000"), scaled(30))
        assert job.name == "é" and job.get("progArgs") == ["-v"]
        await fake.stream.aclose()
        with pytest.raises(ConnectionClosed):  # no unanswered-command complaint outside reference mode
            await client.wait_for(lambda: False, scaled(30))
        assert client.violations == []


async def test_a_default_dialect_client_undoes_the_escaping():
    client_end, agent_end = trio.testing.memory_stream_pair()
    fake = FakeAgent(agent_end, DEFAULT)
    async with AgentClient.from_stream(client_end, dialect="default") as client:
        start = await _started(client, fake)
        assert not any(a.startswith("dialect=") for a in fake.received[0].args)
        await fake.send(NewElements(start, ElementKind.JOB, "1002", [group("5000", name="ジョブ")]))
        job = await client.wait_for(lambda: client.find_job("5000"), scaled(30))
        assert job.name == "ジョブ" and client.violations == []


def test_the_default_definitions_pass_the_reference_checks():
    s = Session(reference=True)
    model_def, _ = s.state.send(CommandId.MODEL_DEF)
    custom = AttributeDefinition("memory", AttrType.BIGINTEGER, "Memory")
    assert s.feed(AttrDef(model_def.tid, DEFAULT.attribute_definitions([*STANDARD_ATTRIBUTES, custom])), Ok(model_def.tid)) == []


def test_native_an_error_with_tid_in_use_completes_the_reusing_command():
    s = Session(NATIVE_INIT)
    reused, _ = s.state.send(CommandId.LIST_FILTERS, tid=s.tid)
    assert s.feed(Error(s.tid, ErrorCode.TID_IN_USE, "in use")) == []
    assert reused.done and s.start.abandoned and not s.state.events_started
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobState="COMPLETED")])) == ["unknown-tid"]


def test_reference_mode_takes_an_error_with_tid_in_use_for_the_oldest_command_and_fails():
    """The PTP 4.0 client gives every answer to the oldest command on its TID: a refusal of a
    reused TID fails the command that held it (and puts the IDE's resource manager into ERROR)."""
    s = Session(reference=True)
    held, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=b", "execName=true"], tid=7)
    reused, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=d", "execName=true"], tid=7)
    assert s.feed(Error(7, ErrorCode.TID_IN_USE, "in use")) == ["tid-refused"]
    assert held.done and isinstance(held.completion, Error) and not reused.done
    assert not held.abandoned and s.state.open[7] is reused


# ----------------------------------------------------------------- TIDs the reference client reuses


def test_reference_mode_allocates_tids_as_the_ide_does():
    """INIT, MODEL_DEF and the first START_EVENTS on TID 0; then a ring of TIDs, whether or not
    a command still holds one, passing over only a TID that holds the open START_EVENTS."""
    state = ClientState(reference=True, tid_pool=3)
    assert [state.send(c)[0].tid for c in (CommandId.INIT, CommandId.MODEL_DEF, CommandId.START_EVENTS)] == [0, 0, 0]
    tids = [state.send(CommandId.SUBMIT_JOB, [f"jobSubId={n}"])[0].tid for n in range(7)]
    assert tids == [1, 2, 3, 1, 2, 3, 1]  # none answered: every TID reused while open
    assert len(state.open_on(1)) == 3 and len(state.open_commands()) == 3 + 7
    # a later START_EVENTS comes from the ring, and the ring passes over it while it is open
    restart = ClientState(reference=True, tid_pool=2)
    for c in (CommandId.INIT, CommandId.MODEL_DEF, CommandId.START_EVENTS):
        restart.send(c)
    restart.send(CommandId.STOP_EVENTS)  # TID 1
    start, _ = restart.send(CommandId.START_EVENTS)
    assert start.tid == 2
    assert [restart.send(CommandId.TERMINATE_JOB, ["jobId=1"])[0].tid for _ in range(3)] == [1, 1, 1]
    # a client not in reference mode never reuses an open TID
    plain = ClientState()
    assert len({plain.send(CommandId.SUBMIT_JOB, [f"jobSubId={n}"])[0].tid for n in range(5)}) == 5


def test_reference_mode_gives_each_answer_to_the_oldest_command_on_its_tid():
    s = Session(reference=True)
    slow, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=slow", "execName=true"], tid=2)
    fast, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=fast", "execName=true"], tid=2)
    # the agent answers the fast one first: the client takes it for the slow one, then the other
    assert s.feed(Ok(2)) == []
    assert slow.ok and not fast.done
    assert s.feed(Ok(2)) == []
    assert fast.ok and 2 not in s.state.open
    # and an answer with nothing left open on the TID is the agent's fault
    assert s.feed(Ok(2)) == ["unknown-tid"]


def test_default_dialect_client_takes_an_answer_for_the_command_it_can_belong_to():
    """Outside reference mode the client matches answers on a shared TID to the command they
    fit (the agent names no command), so that its mirror stays right."""
    s = Session()
    listed, _ = s.state.send(CommandId.LIST_FILTERS, tid=s.tid)  # on the open START_EVENTS' TID
    assert s.feed(Ok(s.tid)) == []
    assert listed.ok and not s.start.done and s.state.events_started
    assert s.feed(ElementChange(s.tid, ElementKind.JOB, [group("5000", jobState="COMPLETED")])) == []
    first, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=a", "execName=true"], tid=9)
    second, _ = s.state.send(CommandId.SUBMIT_JOB, ["jobSubId=b", "execName=true"], tid=9)
    assert s.feed(SubmitJobError(9, "b", ErrorCode.SUBMIT_FAILED, "no")) == []
    assert second.done and not first.done
    stop = s.state.send(CommandId.STOP_EVENTS, tid=s.tid)[0]
    assert s.feed(Ok(s.tid), Ok(s.tid)) == []
    assert s.start.ok and stop.ok and not s.state.events_started


# ----------------------------------------------------------------- launches, as the IDE counts them


def own_job(s, sub="mine", job="5001", state="STARTING", **attrs):
    s.state.send(CommandId.SUBMIT_JOB, [f"jobSubId={sub}", "execName=true"], tid=9)
    s.feed(Ok(9))
    return s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group(job, jobSubId=sub, jobState=state, **attrs)]))


def change(s, job, state, status):
    return s.feed(ElementChange(s.tid, ElementKind.JOB, [group(job, jobState=state, jobStatus=status)]))


def test_reference_mode_wants_a_launch_told_starting_then_running():
    s = Session(reference=True)
    assert own_job(s) == []
    assert change(s, "5001", "RUNNING", "RUNNING") == []
    assert change(s, "5001", "COMPLETED", "FINISHED") == []
    assert s.state.elements["5001"].changed_states == ["RUNNING", "COMPLETED"]
    # a NEW_JOB that says anything but STARTING for a job the client submitted
    s = Session(reference=True)
    assert own_job(s, state="RUNNING", jobStatus="RUNNING") == ["launch-state"]
    # a job that ran and ended without a JOB_CHANGE saying RUNNING
    s = Session(reference=True)
    own_job(s)
    assert change(s, "5001", "COMPLETED", "FINISHED") == ["launch-hangs"]
    s = Session(reference=True)
    own_job(s)
    assert change(s, "5001", "COMPLETED", "FAILED") == ["launch-hangs"]
    # one cancelled while it waited never ran: no RUNNING is owed
    s = Session(reference=True)
    own_job(s)
    assert change(s, "5001", "COMPLETED", "KILLED") == []
    # others' jobs may say anything
    s = Session(reference=True)
    assert s.feed(NewElements(s.tid, ElementKind.JOB, "1002", [group("5002", jobState="COMPLETED")])) == []
    assert change(s, "5000", "COMPLETED", "FINISHED") == []
    # outside reference mode nobody counts launches
    s = Session()
    assert own_job(s, state="COMPLETED", jobStatus="FINISHED") == []
