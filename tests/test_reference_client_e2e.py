"""The agent as the Eclipse PTP 4.0 IDE meets it, end to end.

Each test spawns the real agent and drives it through ``AgentClient(reference=True)``,
which speaks the default dialect (no ``dialect`` attribute in INIT, the IDE's extra
``key=value`` attributes) and fails on anything the IDE's own client would choke on.
Independently of the client's checks, every byte the agent sent is recorded and
checked here against the default dialect's rules: US-ASCII only, the seven attribute
types, no array values in element events, numbers and ids that fit a Java int,
processes named by rank.  The same launches in ``dialect=native`` show that the design
document's protocol is still there for clients that ask for it.

Local, simulated and PBS sessions (the fake PBS commands replaying recorded outputs)
always run; the SLURM ones (marker ``slurm``) need the cluster of ``scripts/slurm-up``, the
Grid Engine one (marker ``sge``) the cell of ``scripts/sge-up``.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional

import pytest
import trio

from agent_fixtures import agent_argv, stored_jobs, subprocess_env
from slurm_support import other_user_env
from wait_support import scaled, wait_until

from proxy_agent.client import AgentClient, AgentProcess, CommandFailed, listen_for_agent
from proxy_agent.client.state import Traffic
from proxy_agent.protocol.attributes import AttrType
from proxy_agent.protocol.messages import (
    AttrDef,
    CommandId,
    ElementChange,
    ElementKind,
    Error,
    ErrorCode,
    Event,
    NewElements,
    ProcessChange,
    RemoveElements,
    RemoveProcesses,
    TerminateJobError,
    decode_event,
)
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import Frame

#: The base id the IDE asks for (2^24) and the INIT attributes its SLURM resource manager adds.
IDE_BASE = 2**24
IDE_EXTRA = ["slurmdPath=", "slurmdArgs="]
JAVA_INT_MAX = 2**31 - 1
JAVA_INT_MIN = -(2**31)
#: The attribute types the IDE parses.
IDE_TYPES = {
    AttrType.BOOLEAN,
    AttrType.DATE,
    AttrType.DOUBLE,
    AttrType.ENUMERATED,
    AttrType.INTEGER,
    AttrType.BIGINTEGER,
    AttrType.STRING,
}
ELEMENT_EVENTS = (NewElements, ElementChange, ProcessChange)

#: A line with a backslash and characters beyond ASCII (printf's octal escapes keep the
#: test source ASCII): ``Grüße \ ok``.
GREETING = "Gr\u00fc\u00dfe \\ ok"
GREETING_PRINTF = r"printf 'Gr\303\274\303\237e \\ ok\n'"
GREETING_ESCAPED = "Gr\\xfc\\xdfe \\\\ ok"

LOCAL = ("--scheduler", "local")
SIM = ("--scheduler", "sim", "--sim-nodes", "8", "--sim-time-scale", "0.1")


class Wire:
    """Everything the agent sends in one session: the raw bytes and the decoded events
    (texts unescaped, as the client read them)."""

    def __init__(self, client: AgentClient) -> None:
        self.data = bytearray()
        self.events: List[Event] = []
        self.frames: List[Frame] = []
        client.add_listener(self._see)

    def _see(self, traffic: Traffic) -> None:
        if traffic.direction != "in":
            return
        self.data += traffic.raw
        if isinstance(traffic.frame, Frame):
            self.frames.append(traffic.frame)
            self.events.append(decode_event(traffic.frame))

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", "replace")

    def definitions(self) -> Dict[str, object]:
        return {d.id: d for event in self.events if isinstance(event, AttrDef) for d in event.definitions}

    def groups(self, event_type=ELEMENT_EVENTS, kind: Optional[ElementKind] = None):
        """(event, group) for every group of the element events of these types (and kind)."""
        for event in self.events:
            if isinstance(event, event_type) and (kind is None or getattr(event, "kind", ElementKind.PROCESS) == kind):
                for group in event.groups:
                    yield event, group

    def job_attributes(self, job_id: str) -> List[Dict[str, str]]:
        """The attribute groups of every NEW_JOB / JOB_CHANGE naming ``job_id``."""
        found = []
        for event, group in self.groups((NewElements, ElementChange), ElementKind.JOB):
            if int(job_id) in group.ids:
                found.append(dict(group.attributes))
        return found


def check_default_dialect(wire: Wire, client: AgentClient) -> None:
    """Everything the agent sent obeys the default dialect, checked on the bytes themselves."""
    data = bytes(wire.data)
    high = next((i for i, b in enumerate(data) if b >= 0x80), None)
    assert high is None, f"byte {data[high]:#x} at {high}: {data[max(0, high - 60):high + 20]!r}"
    assert client.violations == []

    definitions = wire.definitions()
    assert definitions, "no ATTR_DEF was received"
    types = {d.type for d in definitions.values()}
    assert types <= IDE_TYPES, f"types the IDE cannot parse: {types - IDE_TYPES}"
    integers = {key for key, d in definitions.items() if d.type is AttrType.INTEGER}

    for event, group in wire.groups():
        keys = [key for key, _ in group.attributes]
        assert len(keys) == len(set(keys)), f"a repeated key in {event}"
        assert not {"progArgs", "env"} & set(keys), f"an array attribute in {event}"
        for key, value in group.attributes:
            if key in integers:
                assert JAVA_INT_MIN <= int(value) <= JAVA_INT_MAX, f"{key}={value} does not fit a Java int"
        assert isinstance(group.ids, RangeSet), f"a string element id in {event}"

    for event in wire.events:
        if isinstance(event, (NewElements, ElementChange, RemoveElements)):
            id_sets = [event.ids] if isinstance(event, RemoveElements) else [g.ids for g in event.groups]
            if isinstance(event, NewElements):
                id_sets.append(RangeSet.parse(event.parent_id))
            if getattr(event, "kind", None) == ElementKind.PROCESS:
                continue  # process ids are ranks: checked below
            for ids in id_sets:
                assert isinstance(ids, RangeSet) and ids.last <= JAVA_INT_MAX, f"an id beyond a Java int in {event}"
    check_ranks(wire)


def check_ranks(wire: Wire) -> None:
    """Process events carry the job id, then ranks 0 .. jobNumProcs - 1 of that job, the count
    being the one the job's own events gave before."""
    procs: Dict[str, int] = {}
    for event in wire.events:
        if isinstance(event, (NewElements, ElementChange)) and event.kind == ElementKind.JOB:
            for group in event.groups:
                count = dict(group.attributes).get("jobNumProcs")
                if count is not None:
                    procs.update((str(job), int(count)) for job in group.ids)
            continue
        if isinstance(event, NewElements) and event.kind == ElementKind.PROCESS:
            job, id_sets = event.parent_id, [g.ids for g in event.groups]
        elif isinstance(event, ProcessChange):
            job, id_sets = event.job_id, [g.ids for g in event.groups]
        elif isinstance(event, RemoveProcesses):
            job, id_sets = event.job_id, [event.ids]
        else:
            continue
        assert job in procs, f"{type(event).__name__} for job {job}, whose process count was not sent"
        for ids in id_sets:
            assert isinstance(ids, RangeSet) and ids.first >= 0 and ids.last < procs[job], (
                f"{type(event).__name__} names processes {ids} of job {job} with {procs[job]} processes"
            )


async def round_trip(client: AgentClient) -> None:
    """A command and its answer: what the agent had to send before it has come."""
    await client.raw(CommandId.LIST_FILTERS, [], timeout=scaled(30))


async def open_ide_session(*agent_args: str, env: Optional[Dict[str, str]] = None,
                           cwd: Optional[str] = None) -> AgentClient:
    """The real agent over stdio, driven by a reference-mode client."""
    return await AgentClient.spawn(agent_argv(*agent_args), env=subprocess_env(**(env or {})), cwd=cwd,
                                   reference=True)


async def ide_handshake(client: AgentClient, base_id: int = IDE_BASE) -> Wire:
    """INIT as the IDE sends it (no dialect, its extra attributes), MODEL_DEF, START_EVENTS."""
    wire = Wire(client)
    await client.init(base_id=base_id, extra=IDE_EXTRA)
    await client.model_def()
    await client.start_events()
    await client.wait_for(lambda: client.queues and client.nodes, scaled(30), description="the initial model")
    return wire


def first_queue(client: AgentClient, name: Optional[str] = None) -> str:
    for queue in client.queues.values():
        if name is None or queue.name == name:
            return queue.id
    raise AssertionError(f"no queue {name}")


async def launch_with_arguments(client: AgentClient, wire: Wire, queue: str, **kwargs) -> str:
    """A launch as the IDE makes it: program arguments and environment.  NEW_JOB must not echo them."""
    job = await client.submit("/bin/sh", ["-c", 'echo a "b c" "$GREETING"'], env={"GREETING": "hi there"},
                              queue=queue, **kwargs)
    done = await client.wait_job_state(job, "COMPLETED", scaled(60))
    assert done.get("jobStatus") == "FINISHED"
    attributes = wire.job_attributes(job)
    assert attributes and attributes[0].get("jobSubId") == done.sub_id
    assert all("progArgs" not in a and "env" not in a for a in attributes)
    return job


async def two_launches_while_stopped(client: AgentClient, wire: Wire, queue: str, **kwargs) -> None:
    """STOP_EVENTS is answered at once (OK for START_EVENTS, then right behind it OK for
    STOP_EVENTS); both launches are answered while events are stopped, and their jobs come with
    everything held once events start again."""
    start = client.state.open_command(CommandId.START_EVENTS)
    before = len(wire.frames)
    stop = await client.stop_events()
    assert stop.ok and client.state.open_command(CommandId.STOP_EVENTS) is None
    answers = [(f.msg_id, f.tid) for f in wire.frames[before:]]
    at = answers.index((0, start.tid))
    assert answers[at + 1] == (0, stop.tid)
    with trio.fail_after(scaled(30)):
        subs = [await client.submit_nowait("/bin/echo", [f"held {n}"], queue=queue, **kwargs) for n in range(2)]
    assert all(client.find_job(sub) is None for sub in subs)
    await client.start_events()
    for n, sub in enumerate(subs):
        job = await client.wait_for(lambda sub=sub: client.find_job(sub), scaled(30))
        await client.wait_job_state(job, "COMPLETED", scaled(60))
        assert client.job_output(job) == f"held {n}\n"
        # however much was merged while events were stopped, the launch sees each state
        assert client.job(job).states == ["STARTING", "RUNNING", "COMPLETED"]


# --------------------------------------------------------------------------- local


async def test_ide_session_on_the_local_scheduler(tmp_path):
    async with await open_ide_session(*LOCAL) as client:
        wire = await ide_handshake(client)
        assert client.rm.id == str(IDE_BASE)
        queue = first_queue(client)

        job = await launch_with_arguments(client, wire, queue)
        assert client.job_output(job) == "a b c hi there\n"

        # characters beyond ASCII and a backslash: escaped on the wire, undone by the client
        greeting = await client.submit("/bin/sh", ["-c", GREETING_PRINTF], queue=queue)
        await client.wait_job_state(greeting, "COMPLETED", scaled(30))
        assert client.job_output(greeting) == GREETING + "\n"
        assert GREETING_ESCAPED in wire.text()

        # bytes that are no text at all arrive as the replacement character, escaped, never dropped
        binary = await client.submit("/bin/sh", ["-c", r"printf '\377\n'; echo after"], queue=queue)
        await client.wait_job_state(binary, "COMPLETED", scaled(30))
        assert client.job_output(binary) == "\ufffd\nafter\n"
        assert "\\ufffd" in wire.text()

        # a name of the user's own beyond ASCII (the job's name is its program's name)
        script = tmp_path / "r\u00e9sum\u00e9"
        script.write_text("#!/bin/sh\necho named\n")
        script.chmod(0o755)
        named = await client.submit(str(script), queue=queue)
        await client.wait_job_state(named, "COMPLETED", scaled(30))
        assert client.job(named).name == "r\u00e9sum\u00e9"
        assert "name=r\\xe9sum\\xe9" in wire.text()

        # an error message that names something beyond ASCII
        with pytest.raises(CommandFailed) as refused:
            await client.submit(str(tmp_path / "\u30b8\u30e7\u30d6"), queue=queue)
        assert "\u30b8\u30e7\u30d6" in refused.value.message
        assert "\\u30b8\\u30e7\\u30d6" in wire.text()

        # four processes: ranks 0-3 under the job, changes by rank
        four = await client.submit("/bin/sh", ["-c", 'echo "rank $PROXY_AGENT_PROCESS_INDEX"'], count=4, queue=queue)
        await client.wait_job_state(four, "COMPLETED", scaled(30))
        assert sorted(p.id for p in client.children(four, "process")) == ["0", "1", "2", "3"]
        assert all(client.job_process(four, r).state == "COMPLETED" for r in range(4))
        changed = {r for e, g in wire.groups(ProcessChange) if e.job_id == four for r in g.ids}
        assert changed == {0, 1, 2, 3}
        assert sorted(client.job_output(four).splitlines()) == [f"rank {r}" for r in range(4)]

        await two_launches_while_stopped(client, wire, queue)
        await client.quit()
    check_default_dialect(wire, client)


async def test_native_dialect_keeps_the_design_documents_protocol():
    """The same launches asked for in ``dialect=native``: UTF-8, ARRAY, progArgs echoed,
    STOP_EVENTS completed by the next START_EVENTS; processes are ranks here too."""
    async with await AgentClient.spawn(agent_argv(*LOCAL), env=subprocess_env()) as client:
        wire = Wire(client)
        await client.init(base_id=IDE_BASE)
        await client.model_def()
        assert AttrType.ARRAY in {d.type for d in wire.definitions().values()}
        await client.start_events()
        job = await client.submit("/bin/sh", ["-c", GREETING_PRINTF + '; echo "$1"', "sh", "b c"], count=2)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        progargs = [v for e, g in wire.groups(NewElements, ElementKind.JOB) if int(job) in g.ids
                    for k, v in g.attributes if k == "progArgs"]
        assert progargs == ["-c", GREETING_PRINTF + '; echo "$1"', "sh", "b c"]  # one progArgs= per argument
        assert sorted(client.job_output(job).splitlines()) == sorted(2 * [GREETING, "b c"])
        assert GREETING.encode("utf-8") in bytes(wire.data) and b"\\xfc" not in bytes(wire.data)
        assert sorted(p.id for p in client.children(job, "process")) == ["0", "1"]

        start = client.state.open_command(CommandId.START_EVENTS)
        stop = await client.send_command(CommandId.STOP_EVENTS)
        await client.wait_for(lambda: start.done, scaled(30))
        await round_trip(client)  # answered after anything the agent had for STOP_EVENTS
        assert not stop.done  # native: held until the next START_EVENTS
        await client.start_events()
        assert stop.ok
        await client.quit()
        assert client.violations == []


async def test_a_command_on_a_tid_still_open_is_carried_out():
    """The IDE's allocator may hand out a TID a command still holds: the agent carries out
    the new command too and answers it on the same TID, as the reference proxies do; each
    answer completes the oldest open command on the TID for the IDE, and all get their jobs."""
    async with await open_ide_session(*LOCAL) as client:
        wire = await ide_handshake(client)
        # two launches on one TID in one write, and a third on it before either is answered
        first, a = client.state.send(CommandId.SUBMIT_JOB, ["jobSubId=same-tid-1", "execName=echo",
                                                             "progArgs=one", "jobNumProcs=1"], tid=7)
        second, b = client.state.send(CommandId.SUBMIT_JOB, ["jobSubId=same-tid-2", "execName=echo",
                                                              "progArgs=two", "jobNumProcs=1"], tid=7)
        listed, c = client.state.send(CommandId.LIST_FILTERS, [], tid=7)
        await client.stream.send_all(a.raw + b.raw + c.raw)
        await client.wait_for(lambda: first.done and second.done and listed.done, scaled(30))
        assert first.ok and second.ok and listed.ok
        on_tid = [f.msg_id for f in wire.frames if f.tid == 7]
        assert on_tid == [0, 0, 0]  # one OK per command, nothing refused
        for sub, word in (("same-tid-1", "one"), ("same-tid-2", "two")):
            job = await client.wait_for(lambda sub=sub: client.find_job(sub), scaled(30))
            await client.wait_job_state(job, "COMPLETED", scaled(30))
            assert client.job_output(job) == word + "\n"
        # the TID is free again; the session goes on as before
        job = await launch_with_arguments(client, wire, first_queue(client))
        assert client.job_output(job) == "a b c hi there\n"
        await client.quit()
    check_default_dialect(wire, client)


async def test_a_command_on_the_events_tid_leaves_events_flowing():
    """Even the open START_EVENTS' TID: the command is answered, and model events keep coming
    under that TID, which the client holds open until STOP_EVENTS completes the last command
    on it.  (A client that matches answers to the commands they fit keeps its events on.)"""
    async with await AgentClient.spawn(agent_argv(*LOCAL), env=subprocess_env(), dialect="default") as client:
        wire = Wire(client)
        await client.init(base_id=IDE_BASE)
        await client.model_def()
        await client.start_events()
        start = client.state.open_command(CommandId.START_EVENTS)
        listed = await client.raw(CommandId.LIST_FILTERS, [], tid=start.tid, timeout=scaled(30))
        assert listed.ok and not start.done and client.events_started
        job = await client.submit("/bin/echo", ["after"])
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert client.job_output(job) == "after\n"
        stop = await client.stop_events()
        assert start.ok and stop.ok
        await client.quit()
    assert client.violations == [] and not any(isinstance(e, Error) for e in wire.events)


async def test_the_native_dialect_refuses_a_tid_still_open():
    """The design document's protocol keeps its rule: ERROR TID_IN_USE, and the command that
    held the TID is abandoned (its late answer never reaches the wire)."""
    async with await AgentClient.spawn(agent_argv(*LOCAL), env=subprocess_env()) as client:
        wire = Wire(client)
        await client.init(base_id=IDE_BASE)
        await client.model_def()
        await client.start_events()
        submit, first = client.state.send(CommandId.SUBMIT_JOB, ["jobSubId=abandoned", "execName=echo",
                                                                  "progArgs=abandoned", "jobNumProcs=1"])
        refusal, second = client.state.send(CommandId.LIST_FILTERS, [], tid=submit.tid)
        await client.stream.send_all(first.raw + second.raw)
        await client.wait_for(lambda: refusal.done, scaled(30))
        assert isinstance(refusal.completion, Error) and refusal.completion.code == ErrorCode.TID_IN_USE
        assert submit.abandoned
        job = await client.wait_for(lambda: client.find_job("abandoned"), scaled(30))
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        await client.quit()
    on_tid = [f for f in wire.frames if f.tid == submit.tid]
    assert len(on_tid) == 1 and on_tid[0].msg_id == 5  # the ERROR only, no late OK
    assert client.violations == []


def lower_hex_frame(command_id: int, tid: int, args) -> bytes:
    """A command framed as the IDE writes it: hex digits in lower case."""
    body = f" {command_id:04x}:{tid:08x}:{len(args):08x}".encode()
    for arg in args:
        data = arg.encode()
        body += f" {len(data):08x}:".encode() + data
    return f"{len(body):08x}".encode() + body


async def test_the_ides_handshake_on_tid_0_in_lower_case_hex():
    """The IDE sends INIT, MODEL_DEF and the first START_EVENTS all on TID 0 (each after the
    previous one completed), its hex digits in lower case; then a launch on a TID of its own."""
    async with await open_ide_session(*LOCAL) as client:
        wire = Wire(client)
        for command_id, args in ((CommandId.INIT, ["version=2.0", f"baseId={IDE_BASE}", *IDE_EXTRA]),
                                 (CommandId.MODEL_DEF, []), (CommandId.START_EVENTS, [])):
            command, _ = client.state.send(command_id, args, tid=0)
            await client.stream.send_all(lower_hex_frame(int(command_id), 0, args))
            if command_id is CommandId.START_EVENTS:
                await client.wait_for(lambda: client.nodes and client.queues, scaled(30))
            else:
                await client.wait_for(lambda: command.done, scaled(30))
                assert command.ok
        assert client.events_started and client.state.open_command(CommandId.START_EVENTS).tid == 0
        job = await launch_with_arguments(client, wire, first_queue(client))
        assert client.job_output(job) == "a b c hi there\n"
        await client.quit()
    check_default_dialect(wire, client)


async def test_commands_that_name_no_job_properly_are_refused():
    async with await open_ide_session(*LOCAL) as client:
        wire = await ide_handshake(client)
        job = await client.submit("/bin/sleep", ["30"])
        await client.wait_job_state(job, "RUNNING", scaled(30))
        arabic = "".join(chr(0x0660 + int(d)) for d in job)
        for args in ([f"jobId={arabic}"], ["jobId=" + "_".join(job)]):
            refused = await client.raw(CommandId.TERMINATE_JOB, args, timeout=scaled(30))
            assert isinstance(refused.completion, TerminateJobError)
            assert refused.completion.code == ErrorCode.BAD_ARGUMENTS and "plain decimal digits" in refused.completion.message
        # the IDE's own command 7 (its event filter)
        filters = await client.raw(CommandId.MOVE_JOB, ["jobState=RUNNING", "filterChildren=true", f"id={job}"], timeout=scaled(30))
        assert isinstance(filters.completion, Error)
        assert client.job(job).state == "RUNNING"
        await client.terminate(job)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        await client.quit()
    check_default_dialect(wire, client)


async def test_init_takes_unknown_attributes_and_refuses_an_unknown_dialect():
    async with await open_ide_session(*LOCAL) as client:
        refused = await client.raw(CommandId.INIT, ["version=2.0", f"baseId={IDE_BASE}", "dialect=klingon"], timeout=scaled(30))
        assert isinstance(refused.completion, Error) and "klingon" in refused.completion.message
        too_big = await client.raw(CommandId.INIT, ["version=2.0", "baseId=2130706433"], timeout=scaled(30))
        assert isinstance(too_big.completion, Error) and "2130706432" in too_big.completion.message
        # the highest base id the IDE can hold, with attributes the agent does not know
        wire = await ide_handshake(client, base_id=2130706432)
        assert client.rm.id == "2130706432"
        job = await client.submit("/bin/echo", ["high ids"], count=2)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert int(job) <= JAVA_INT_MAX and client.job_output(job) == "high ids\nhigh ids\n"
        await client.quit()
    check_default_dialect(wire, client)


async def test_launched_as_the_ide_launches_it():
    """The IDE's command line: ``--proxy=tcp --host=H --port=P``, ``--debug=N`` when its proxy
    debugging is on, then the options the user configured.  The agent connects back to H:P
    (``localhost`` when the IDE forwards the port) and the session runs as any other."""
    async with await listen_for_agent("127.0.0.1", 0) as listener:
        argv = agent_argv("--proxy=tcp", "--host=localhost", f"--port={listener.port}", "--debug=1", *LOCAL)
        process = await AgentProcess.start(argv, env=subprocess_env(), stdio=False)
        client = await listener.accept(process=process, timeout=scaled(30), reference=True)
        async with client:
            wire = await ide_handshake(client)
            job = await launch_with_arguments(client, wire, first_queue(client))
            assert client.job_output(job) == "a b c hi there\n"
            await client.quit()
        assert process.returncode == 0
        assert "connected to localhost" in process.stderr_tail(200)  # --debug=1 logs as -v
    check_default_dialect(wire, client)


async def test_long_lines_and_output_held_while_events_are_stopped(tmp_path):
    """A line over 64 KiB arrives in pieces of at most 64 KiB; output written while events are
    stopped is kept up to its bound, and the lines given up are counted exactly."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    async with await open_ide_session(*LOCAL, env=env) as client:
        wire = await ide_handshake(client)
        long = await client.submit("/bin/sh", ["-c", "head -c 100000 /dev/zero | tr '\\0' x; echo; echo end"])
        await client.wait_job_state(long, "COMPLETED", scaled(30))
        assert [len(line) for line in client.job_output(long).splitlines()] == [65536, 34464, 3]

        await client.stop_events()
        total = 300_000  # about 2 MB of lines: more than is kept for a process
        sub = await client.submit_nowait("seq", [str(total)])
        await wait_until(lambda: any(j["client_ref"] == sub and j["ended"] for j in stored_jobs(subprocess_env(**env))),
                         what="the job to end while events are stopped")
        await client.start_events()
        job = await client.wait_for(lambda: client.find_job(sub), scaled(30))
        # The job ended while events were stopped: it still goes STARTING, RUNNING, COMPLETED
        # (it is this client's own), and its output follows in the same burst.
        await client.wait_for(lambda: client.job_output(job).endswith(f"\n{total}\n"), scaled(30))
        assert client.job(job).states == ["STARTING", "RUNNING", "COMPLETED"]
        kept = client.job_output(job).splitlines()
        (note,) = client.job_output(job, "stderr").splitlines()
        dropped = int(note.split()[1])
        assert note == f"[proxy-agent: {dropped} earlier lines of output were dropped (events were stopped)]"
        assert dropped > 0 and dropped + len(kept) == total
        assert kept == [str(n) for n in range(dropped + 1, total + 1)]  # the newest, in order
        await client.quit()
    check_default_dialect(wire, client)


# --------------------------------------------------------------------------- simulated


async def test_ide_session_on_the_simulated_scheduler():
    async with await open_ide_session(*SIM, "--sim-jobs", "6") as client:
        wire = await ide_handshake(client)
        queue = first_queue(client, "debug")
        job = await client.submit("/bin/sh", ["-c", "true"], env={"A": "b"}, queue=queue, count=4)
        await client.wait_job_state(job, "COMPLETED", scaled(30))
        assert all("progArgs" not in a and "env" not in a for a in wire.job_attributes(job))
        assert sorted(p.id for p in client.children(job, "process")) == ["0", "1", "2", "3"]

        # the simulated job names itself and its output after the program: beyond ASCII here
        named = await client.submit("/opt/\u30b8\u30e7\u30d6", queue=queue)
        await client.wait_job_state(named, "COMPLETED", scaled(30))
        assert client.job(named).name == "\u30b8\u30e7\u30d6"
        assert "\u30b8\u30e7\u30d6" in client.job_output(named)
        assert "name=\\u30b8\\u30e7\\u30d6" in wire.text()

        stop = await client.stop_events()
        assert stop.ok
        subs = [await client.submit_nowait("lammps", queue=queue) for _ in range(2)]
        await client.start_events()
        for sub in subs:
            held = await client.wait_for(lambda sub=sub: client.find_job(sub), scaled(30))
            await client.wait_job_state(held, "COMPLETED", scaled(30))
        await client.quit()
    check_default_dialect(wire, client)


# --------------------------------------------------------------------------- SLURM


@pytest.fixture
def slurm_cluster():
    from slurm_support import require_cluster

    return require_cluster()


def _slurm(*argv: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=scaled(30), env=env or subprocess_env(),
                          stdin=subprocess.DEVNULL)


@pytest.mark.slurm
async def test_ide_session_on_slurm(slurm_cluster, tmp_path):
    """Another user's job named beyond ASCII, a launch with arguments, output beyond ASCII
    delivered before the final state, no "no value" marker in an INTEGER, two launches while
    events are stopped."""
    other_name = f"\u30b8\u30e7\u30d6-ide-{os.getpid()}"
    ours_name = f"pa-h9-ide-{os.getpid()}"
    other = _slurm("sbatch", "--parsable", "--uid=nobody", "--gid=nogroup", "-J", other_name, "-p", "long",
                   "-D", "/tmp", "-o", "/dev/null", "-e", "/dev/null", "--wrap", "sleep 60",
                   env=other_user_env(subprocess_env()))
    assert other.returncode == 0, f"cannot submit a job as another user: {other.stderr.strip()}"
    other_id = other.stdout.strip().split(";")[0]
    ours: List[str] = []
    try:
        with trio.fail_after(scaled(240)):  # SLURM's queue may hold others' jobs before ours
            async with await open_ide_session("--scheduler", "slurm", "--slurm-poll-interval", "1",
                                              "--all-users") as client:
                wire = await ide_handshake(client)
                theirs = await client.wait_for(
                    lambda: next((j for j in client.jobs.values() if j.get("nativeId") == other_id), None), scaled(30),
                    description="the other user's job")
                assert theirs.name == other_name and theirs.get("userId") == "nobody"
                # while it waits SLURM lists its task count as "no value" (4294967294): the job
                # still has a count its process 0 is within
                assert theirs.get("jobNumProcs") == "1"
                assert "name=\\u30b8\\u30e7\\u30d6-ide-" in wire.text()

                queue = first_queue(client, "debug")
                # two jobs at once (the cluster may be busy): output beyond ASCII, and a launch with arguments
                greeting = await client.submit("/bin/sh", ["-c", GREETING_PRINTF], queue=queue, cwd=str(tmp_path),
                                               jobName=ours_name)
                ours.append(client.job(greeting).get("nativeId"))
                job = await launch_with_arguments(client, wire, queue, cwd=str(tmp_path), jobName=ours_name)
                ours.append(client.job(job).get("nativeId"))
                assert client.job_output(job) == "a b c hi there\n"  # there when COMPLETED came

                await client.wait_job_state(greeting, "COMPLETED", scaled(60))
                assert client.job_output(greeting) == GREETING + "\n"
                assert GREETING_ESCAPED in wire.text()

                # a partition without a node limit: SLURM's "no value" is no number, the key is left out
                debug = client.queue("debug")
                assert "maxNodes" not in debug.attributes
                assert "=4294967294" not in wire.text() and "=4294967295" not in wire.text()
                assert all(not v.isdigit() or int(v) <= JAVA_INT_MAX
                           for e in client.state.elements.values() for v in e.attributes.values() if isinstance(v, str))

                await two_launches_while_stopped(client, wire, queue, cwd=str(tmp_path), jobName=ours_name)
                ours.extend(j.get("nativeId") for j in client.jobs.values()
                            if j.sub_id and j.get("userId") != "nobody")
                await client.quit()
        check_default_dialect(wire, client)
    finally:
        for native in filter(None, [other_id, *ours]):
            _slurm("scancel", native)


# --------------------------------------------------------------------------- Grid Engine


@pytest.mark.sge
async def test_ide_session_on_grid_engine(tmp_path):
    """Another user's job, a launch with arguments, output beyond ASCII delivered before the
    final state, two launches while events are stopped (Grid Engine 8.1.9 itself refuses job
    names beyond ASCII, so the names here are plain)."""
    import sge_support

    sge_support.require_cell()
    other = None
    if sge_support.other_user_exists():
        other = sge_support.run(
            ["runuser", "-u", sge_support.OTHER_USER, "--", "qsub", "-terse", "-h", "-N", "pa-ide-other",
             "-o", "/dev/null", "-e", "/dev/null", "-S", "/bin/sh"], stdin="#!/bin/sh\nsleep 60\n",
        ).stdout.strip()
    ours: List[str] = []
    try:
        with trio.fail_after(scaled(240)):
            async with await open_ide_session("--scheduler", "sge", "--sge-poll-interval", "1", "--all-users",
                                              env=sge_support.cell_env()) as client:
                wire = await ide_handshake(client)
                if other:
                    theirs = await client.wait_for(
                        lambda: next((j for j in client.jobs.values() if j.get("nativeId") == other), None), scaled(30),
                        description="the other user's job")
                    assert theirs.get("jobStatus") == "HOLD"
                queue = first_queue(client, "all.q")
                greeting = await client.submit("/bin/sh", ["-c", GREETING_PRINTF], queue=queue, cwd=str(tmp_path),
                                               jobName="pa-ide-greeting")
                ours.append(client.job(greeting).get("nativeId"))
                job = await launch_with_arguments(client, wire, queue, cwd=str(tmp_path), jobName="pa-ide-args")
                ours.append(client.job(job).get("nativeId"))
                assert client.job_output(job) == "a b c hi there\n"  # there when COMPLETED came
                await client.wait_job_state(greeting, "COMPLETED", scaled(60))
                assert client.job_output(greeting) == GREETING + "\n"
                assert GREETING_ESCAPED in wire.text()
                await two_launches_while_stopped(client, wire, queue, cwd=str(tmp_path), jobName="pa-ide-held")
                ours.extend(j.get("nativeId") for j in client.jobs.values() if j.sub_id)
                await client.quit()
        check_default_dialect(wire, client)
    finally:
        for native in filter(None, [other, *ours]):
            sge_support.run(["qdel", native])


# --------------------------------------------------------------------------- PBS


@pytest.mark.parametrize("family", ["openpbs", "torque"])
async def test_ide_session_on_pbs(tmp_path, family):
    """PBS through the fake commands that replay the real ones' recorded outputs (no PBS server
    is packaged for this system): a launch with arguments, output beyond ASCII, two launches
    while events are stopped."""
    import getpass

    from test_pbs_backend import DEFAULT_QUEUE, FAKE_BIN, stop_leftovers

    env = {"PATH": f"{FAKE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "FAKE_PBS_FAMILY": family,
           "FAKE_PBS_STATE": str(tmp_path / "state"), "FAKE_PBS_QUEUE_SECONDS": "0.3", "HOME": str(tmp_path),
           "FAKE_PBS_USER": getpass.getuser()}
    try:
        with trio.fail_after(scaled(90)):
            async with await open_ide_session("--scheduler", "pbs", "--pbs-poll-interval", "0.5", env=env,
                                              cwd=str(tmp_path)) as client:
                wire = await ide_handshake(client)
                queue = first_queue(client, DEFAULT_QUEUE[family])
                job = await launch_with_arguments(client, wire, queue, cwd=str(tmp_path))
                assert client.job_output(job) == "a b c hi there\n"
                greeting = await client.submit("/bin/sh", ["-c", GREETING_PRINTF], queue=queue, cwd=str(tmp_path))
                await client.wait_job_state(greeting, "COMPLETED", scaled(60))
                assert client.job_output(greeting) == GREETING + "\n"
                assert GREETING_ESCAPED in wire.text()
                await two_launches_while_stopped(client, wire, queue, cwd=str(tmp_path))
                await client.quit()
        check_default_dialect(wire, client)
    finally:
        stop_leftovers(tmp_path / "state")
