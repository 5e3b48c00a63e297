"""The structure that keeps a big model cheap: shared rows, a snapshot encoded once and streamed
to every client that asks at the same time, a cluster built without keeping INIT waiting, and a
start-up that imports only the backends it runs.  (The figures themselves come from the
benchmark scripts; these tests fail if what makes them possible breaks.)"""

from __future__ import annotations

import functools

import subprocess
import sys

import pytest
import trio

from proxy_agent.frontends.ptp import render as render_module, snapshot as snapshot_module
from proxy_agent.frontends.ptp.view import ModelView
from proxy_agent.protocol.dialect import DEFAULT
from proxy_agent.protocol.messages import EventId, decode_event
from proxy_agent.protocol.wire import Decoder
from proxy_agent.schedulers.sim import SimBackend, SimOptions
from proxy_agent.service.model import K, Kind, ServiceModel

from agent_fixtures import start_up_probe, subprocess_env
from wait_support import scaled


def _cluster(jobs: int = 300) -> ServiceModel:
    model = ServiceModel()
    machine = model.add(Kind.MACHINE, None, {K.NAME: "m", K.STATE: "UP"})
    model.add_many(Kind.NODE, machine, [{K.NAME: f"n{i}", K.STATE: "UP"} for i in range(4)])
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.STATE: "NORMAL"})
    alike = [{K.NAME: f"run-{i % 5}", K.STATE: "QUEUING", K.QUEUE: queue} for i in range(5)]
    model.add_many(Kind.JOB, queue, [alike[i % 5] for i in range(jobs)])
    return model


def _decoded(chunks) -> list:
    decoder = Decoder()
    for chunk in chunks:
        decoder.feed(chunk)
    return [decode_event(frame) for frame in decoder]


def test_elements_made_from_one_mapping_share_one_row_until_one_changes():
    model = ServiceModel()
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q"})
    attrs = {K.NAME: "a", K.STATE: "QUEUING", K.QUEUE: queue}
    first, second, third = model.add_many(Kind.JOB, queue, [attrs, attrs, attrs])
    rows = [model.get(key).values for key in (first, second, third)]
    assert rows[0] is rows[1] is rows[2]
    model.update(second, {K.STATE: "RUNNING"})
    assert model.attr(second, K.STATE) == "RUNNING"
    assert model.attr(first, K.STATE) == model.attr(third, K.STATE) == "QUEUING"  # the others keep theirs
    assert model.get(first).values is model.get(third).values
    # sharing across calls when the caller hands the same table of rows
    shared: dict = {}
    fourth = model.add_many(Kind.JOB, queue, [attrs], rows=shared)[0]
    fifth = model.add_many(Kind.JOB, queue, [attrs], rows=shared)[0]
    assert model.get(fourth).values is model.get(fifth).values


def test_elements_are_found_by_key_in_the_tables_of_each_kind():
    model = _cluster(10)
    for kind in Kind:
        for key in model.keys(kind):
            assert model.find(key, kind).key == key and key in model
    assert len(model) == sum(model.count(kind) for kind in Kind)
    job = model.keys(Kind.JOB)[3]
    model.remove(job)
    assert job not in model and model._elements.get(job) is None


def test_an_element_takes_80_bytes_and_only_a_process_keeps_a_rank():
    # objects are allocated in steps of 16 bytes: a seventh slot would make every element 96
    model = _cluster(3)
    job = model.keys(Kind.JOB)[0]
    processes = model.add_many(Kind.PROCESS, job, [{K.STATE: "RUNNING"}] * 3)
    assert sys.getsizeof(model.get(job)) <= 80
    assert not hasattr(model.get(job), "__dict__")
    assert [model.get(p).rank for p in processes] == [0, 1, 2]
    assert model.get(job).rank == -1
    assert model.processes(job) == list(processes)


def _processes_alike(jobs: int) -> ServiceModel:
    """Jobs whose processes have equal rows, each job's its own row object."""
    model = ServiceModel()
    machine = model.add(Kind.MACHINE, None, {K.NAME: "m", K.STATE: "UP"})
    nodes = model.add_many(Kind.NODE, machine, [{K.NAME: f"n{i}", K.STATE: "UP", K.NUMBER: str(i)} for i in range(3)])
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.STATE: "NORMAL"})
    for i, job in enumerate(model.add_many(Kind.JOB, queue, [{K.NAME: f"run-{i}", K.STATE: "RUNNING"} for i in range(jobs)])):
        model.add_many(Kind.PROCESS, job, [{K.STATE: "RUNNING", K.NODE: nodes[i % 3]}] * (1 + i % 2))
    return model


@pytest.mark.parametrize("base", [1000, None])
def test_equal_process_rows_of_many_jobs_are_encoded_once(monkeypatch, base):
    model = _processes_alike(400)
    rows = {id(model.get(p).values) for p in model.keys(Kind.PROCESS)}
    assert len(rows) == 400  # one row object per job, three distinct rows in all
    encoded = []
    original = render_module.Renderer._encoded

    def counting(self, values, parts):
        if self.kind is Kind.PROCESS:
            encoded.append(values)
        return original(self, values, parts)

    monkeypatch.setattr(render_module.Renderer, "_encoded", counting)
    plan = snapshot_module.snapshot_plan(model, render_module.NATIVE_RULES, base)
    events = _decoded(plan.frames(1000, 3))
    assert len(encoded) == len(set(encoded)) == 3
    procs = {}
    for event in events:
        if event.kind.value == "process":
            (group,) = event.groups
            procs[int(event.parent_id) - 1000] = (str(group.ids), dict(group.attributes)["processNodeId"])
    nodes = model.keys(Kind.NODE)
    assert procs == {job: ("0" if i % 2 == 0 else "0-1", str(1000 + nodes[i % 3]))
                     for i, job in enumerate(model.keys(Kind.JOB))}


def test_a_plan_for_any_base_id_works_out_each_group_s_range_set_once(monkeypatch):
    model = _cluster(300)  # five rows, each a group of 60 keys: no two adjacent
    queue = model.keys(Kind.QUEUE)[0]
    model.add_many(Kind.JOB, queue, [{K.NAME: "run", K.STATE: "RUNNING", K.QUEUE: queue}] * 50)  # one run
    expected = {base: _decoded(ModelView(model, base).subscribe_chunks(3)) for base in (1000, 5_000_000)}
    plan = snapshot_module.snapshot_plan(model, render_module.NATIVE_RULES)
    groups = [part for _, _, parts in plan.events for part in parts if isinstance(part, render_module.Ranges)]
    assert len(groups) == 6 and sorted(len(g.numbers) for g in groups) == [2, 60, 60, 60, 60, 60]
    # a client's rendering only adds its base id and formats: no range set is worked out anew
    monkeypatch.setattr(snapshot_module, "ids_bytes", None)
    monkeypatch.setattr(render_module, "ids_bytes", None)
    monkeypatch.setattr(render_module, "_range_layout", None)
    for base, events in expected.items():
        assert _decoded(plan.frames(base, 3)) == events


def test_checked_values_of_a_dialect_are_encoded_without_the_general_encoder(monkeypatch):
    # the default dialect checks INTEGER values and escapes text: short ASCII values still
    # go straight to their bytes
    from proxy_agent.frontends.ptp.session import render_rules

    model = ServiceModel()
    backend = SimBackend(model, SimOptions(nodes=0, jobs=0))
    rules = render_rules(DEFAULT, backend.attributes())
    assert rules.integer_ids and rules.text is not None
    machine = model.add(Kind.MACHINE, None, {K.NAME: "m", K.STATE: "UP"})
    names = [f"n{i}" for i in range(50)] + ["n\u00e9", "big"]
    numbers = [str(i) for i in range(50)] + ["7", "99999999999"]
    nodes = model.add_many(Kind.NODE, machine, [{K.NAME: n, K.STATE: "UP", K.NUMBER: c} for n, c in zip(names, numbers)])
    calls = []
    original = snapshot_module.encode_args
    for module in (render_module, snapshot_module):
        monkeypatch.setattr(module, "encode_args", lambda args: calls.append(args) or original(args))
    plan = snapshot_module.snapshot_plan(model, rules, 1000)
    frames = plan.frames(1000, 3)
    assert calls == []
    got = {}
    for event in _decoded(frames):
        for group in event.groups:
            for element_id in group.id_list():
                got[int(element_id) - 1000] = dict(group.attributes)
    assert [got[n]["name"] for n in nodes] == [DEFAULT.escape(n) for n in names]
    assert got[nodes[-2]]["name"] != names[-2] and got[nodes[-2]]["name"].isascii()
    number = next(a for a in got[nodes[0]] if got[nodes[0]][a] == "0")
    assert number in rules.integer_ids
    assert [got[n].get(number) for n in nodes] == numbers[:-1] + [None]  # beyond a Java int: absent


def test_two_clients_asking_at_once_share_one_encoding_streamed_chunk_by_chunk(monkeypatch):
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_CHUNK_BYTES", 1)  # a chunk per frame
    model = _cluster()
    renders = []
    original = snapshot_module.SnapshotPlan._render

    def counting(self, base, tid):
        renders.append((base, tid))
        return original(self, base, tid)

    monkeypatch.setattr(snapshot_module.SnapshotPlan, "_render", counting)
    first, second = ModelView(model, 1000), ModelView(model, 1000)
    one, two = first.subscribe_chunks(7), second.subscribe_chunks(7)
    assert renders == [(1000, 7)]  # one rendering for both
    got_one, got_two = [], []
    for a, b in zip(one, two):  # the two writers take turns, as two sessions' tasks do
        got_one.append(a)
        got_two.append(b)
        assert a is b  # the same bytes object: encoded once for both
    assert list(one) == [] and list(two) == []
    assert renders == [(1000, 7)] and len(got_one) > 3
    plan = snapshot_module.snapshot_plan(model, first.rules, 1000)
    (rendering,) = plan._renderings.values()
    # nothing held once both have it, but the small first chunk
    assert rendering.chunks[0] is got_one[0] and all(chunk is None for chunk in rendering.chunks[1:])
    events = _decoded(got_one)
    jobs = {i for e in events if e.event_id == EventId.NEW_JOB for g in e.groups for i in g.id_list()}
    assert jobs == {str(1000 + key) for key in model.keys(Kind.JOB)}
    # alike jobs travel as one range group per row: 5 groups for 300 jobs
    assert sum(len(e.groups) for e in events if e.event_id == EventId.NEW_JOB) == 5
    # a client coming later gets its own rendering of the same plan, with the same bytes
    late = ModelView(model, 1000)
    assert b"".join(late.subscribe_chunks(7)) == b"".join(got_one)
    assert renders == [(1000, 7), (1000, 7)]


def test_a_plan_for_one_base_id_has_its_ids_written_in_and_its_first_chunks_are_small():
    model = _cluster(3000)
    plan = snapshot_module.snapshot_plan(model, render_module.NATIVE_RULES, 1000)
    # every event one piece of bytes: rendering only frames it, nothing is looked up per id
    assert plan.events and all(len(parts) == 1 and type(parts[0]) is bytes for _, _, parts in plan.events)
    shared = snapshot_module.snapshot_plan(model, render_module.NATIVE_RULES, 2000)
    assert shared.base is None and any(type(part) is not bytes for _, _, parts in shared.events for part in parts)
    assert b"".join(shared.frames(1000, 7)) == b"".join(plan.frames(1000, 7))
    # the first chunk goes out after a few frames, the next ones grow up to the full size:
    # thousands of small frames (a process event per job)
    for job in model.keys(Kind.JOB):
        model.add_many(Kind.PROCESS, job, [{K.STATE: "QUEUING"}])
    sizes = [len(chunk) for chunk in ModelView(model, 1000).subscribe_chunks(7)]
    first = snapshot_module.FIRST_CHUNK_BYTES
    assert len(sizes) >= 3 and first <= sizes[0] < first + 200
    assert 2 * first <= sizes[1] < 2 * first + 200


@pytest.mark.parametrize("taken_whole", [True, False])
def test_a_new_plan_s_first_chunks_go_out_before_jobs_and_processes_are_grouped(monkeypatch, taken_whole):
    model = _cluster(3000)
    for job in model.keys(Kind.JOB)[:2000]:
        model.add_many(Kind.PROCESS, job, [{K.STATE: "QUEUING"}])
    # enough nodes for a few chunks of their own
    model.add_many(Kind.NODE, model.keys(Kind.MACHINE)[0],
                   [{K.NAME: f"node-{i}", K.STATE: "UP"} for i in range(6000)])
    expected = b"".join(ModelView(model, 1000).subscribe_chunks(7))
    snapshot_module._PLANS.clear()
    steps = []
    original = snapshot_module._grouped_kind

    def grouping(model_, kind, ascending):
        steps.append(kind)
        return original(model_, kind, ascending)

    monkeypatch.setattr(snapshot_module, "_grouped_kind", grouping)
    early = []

    def write(chunk):
        early.append(chunk)
        steps.append("chunk out")
        return taken_whole  # whether the connection took it all

    view = ModelView(model, 1000)
    rest = view.subscribe_chunks(7, write)
    # a client asking in the same instant still shares the rendering, the first chunks too
    other = ModelView(model, 1000).subscribe_chunks(7)
    if taken_whole:
        # the nodes' chunks go out while the connection takes them, then the chunk in which
        # the jobs and processes get grouped; and no more
        outs = steps.index(Kind.JOB) - 3
        assert outs >= 2 and steps == [Kind.MACHINE, Kind.QUEUE, Kind.NODE, *["chunk out"] * outs,
                                       Kind.JOB, Kind.PROCESS, "chunk out"], steps
    else:
        # a connection that is full takes no more: the rest is grouped at once
        assert steps == [Kind.MACHINE, Kind.QUEUE, Kind.NODE, "chunk out", Kind.JOB, Kind.PROCESS], steps
    # grouped before returning: what happens to the model from now on is not in the snapshot
    # (the view tells it as changes), and the bytes are those of a plan made all at once
    model.update(model.keys(Kind.JOB)[0], {K.STATE: "RUNNING"})
    model.add(Kind.JOB, model.keys(Kind.QUEUE)[0], {K.NAME: "later", K.STATE: "QUEUING"})
    taken = [next(other) for _ in early]
    assert all(a is b for a, b in zip(taken, early))  # the same bytes objects: made once for both
    rest_chunks = []
    for chunk in rest:
        rest_chunks.append(chunk)
        taken.append(next(other))
        assert taken[-1] is chunk
    assert list(other) == [] and rest_chunks
    assert b"".join(early) + b"".join(rest_chunks) == expected


def test_values_that_do_not_recur_are_written_exactly_and_a_node_has_one_marker(monkeypatch):
    # a slot whose values hardly recur stops being remembered: make that happen after a few
    monkeypatch.setattr(render_module, "_CACHE_TRIAL", 8)
    model = ServiceModel()
    machine = model.add(Kind.MACHINE, None, {K.NAME: "m", K.STATE: "UP"})
    nodes = model.add_many(Kind.NODE, machine, [{K.NAME: f"n{i}", K.STATE: "UP"} for i in range(40)])
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.STATE: "NORMAL"})
    names = [f"run-{i}" for i in range(150)]
    names += ["j\u00f6b-\u00e9t\u00e9", "\u8a08\u7b97-1", "\U0001f680-2", "x" * 5000, "\udcff-lone"]
    jobs = model.add_many(Kind.JOB, queue, [{K.NAME: name, K.STATE: "RUNNING", K.QUEUE: queue} for name in names])
    for i, job in enumerate(jobs):  # one process each, on one node of the 40, a pid of its own
        model.add_many(Kind.PROCESS, job, [{K.STATE: "RUNNING", K.PID: str(5000 + i), K.NODE: nodes[i % 40]}])
    plan = snapshot_module.snapshot_plan(model, render_module.NATIVE_RULES)
    markers = [part for _, _, parts in plan.events for part in parts if isinstance(part, render_module.Ref)]
    # every process refers to its node, and every job to its queue: one marker per element
    assert len({id(m) for m in markers}) == len({(m.prefix, m.key) for m in markers}) == 41
    events = _decoded(ModelView(model, 1000).subscribe_chunks(3))
    got_names = {}
    got_procs = {}
    for event in events:
        for group in event.groups:
            values = dict(group.attributes)
            if event.kind.value == "job":
                for element_id in group.id_list():
                    got_names[int(element_id) - 1000] = values["name"]
            elif event.kind.value == "process":
                got_procs[int(event.parent_id) - 1000] = (values["processPID"], values["processNodeId"])
    expected = dict(zip(jobs, names))
    expected[jobs[-1]] = "\ufffd-lone"  # a lone surrogate has no UTF-8 form: it travels as U+FFFD
    assert got_names == expected
    assert got_procs == {job: (str(5000 + i), str(1000 + nodes[i % 40])) for i, job in enumerate(jobs)}


def test_a_plan_and_its_chunks_do_not_leave_young_objects_for_the_collector(monkeypatch):
    import gc

    monkeypatch.setattr(snapshot_module, "SNAPSHOT_CHUNK_BYTES", 4096)
    model = ServiceModel()
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.STATE: "NORMAL"})
    jobs = model.add_many(Kind.JOB, queue, [{K.NAME: f"run-{i}", K.STATE: "RUNNING"} for i in range(3000)])
    for job in jobs:  # a parent each: thousands of groups
        model.add_many(Kind.PROCESS, job, [{K.STATE: "RUNNING"}])
    view = ModelView(model, 1000)
    gc.collect()
    plan = snapshot_module.snapshot_plan(model, view.rules)

    def young() -> int:  # objects the next young collections would walk
        counted = gc.get_count()[0]  # (first: what follows allocates, which may collect)
        return max(counted, len(gc.get_objects(generation=0)) + len(gc.get_objects(generation=1)))

    # thousands of objects were made; none is left young, to be walked again only to be kept
    assert young() < 200
    chunks = plan.chunks(1000, 3)
    assert next(chunks) and young() < 200
    assert next(chunks) and young() < 200
    assert len(_decoded(plan.frames(1000, 3))) > 6


async def test_a_big_simulated_cluster_is_built_in_steps():
    model = ServiceModel()
    sim = SimBackend(model, SimOptions(nodes=100, jobs=60_000, process_share=0.0))
    seen = []

    async def watch():
        while True:
            seen.append(model.count(Kind.JOB))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await nursery.start(sim.run)
        nursery.cancel_scope.cancel()
    assert model.count(Kind.JOB) == 60_000
    # other tasks ran while the jobs were being made, more than once
    assert len([n for n in seen if n < 60_000]) >= 3


def test_start_up_imports_only_the_backends_it_runs():
    probe = (
        "import sys; from proxy_agent.__main__ import parse_arguments; "
        "args = parse_arguments(sys.argv[1:]); "
        "print(sorted(m for m in ('proxy_agent.schedulers.batch.slurm', 'proxy_agent.schedulers.batch.slurm.backend', "
        "'proxy_agent.schedulers.sim', 'proxy_agent.schedulers.local') if m in sys.modules), args.scheduler)"
    )

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                              env=subprocess_env(), timeout=scaled(60))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run("--stdio") == "['proxy_agent.schedulers.local'] local"
    assert run("--scheduler", "sim", "--sim-jobs", "5") == "['proxy_agent.schedulers.sim'] sim"
    # another backend's option is still accepted (the full command line is read then)
    assert "local" in run("--stdio", "--sim-nodes", "4")
    bad = subprocess.run([sys.executable, "-m", "proxy_agent", "--no-such-option"], capture_output=True,
                         text=True, env=subprocess_env(), timeout=scaled(60))
    assert bad.returncode == 2 and "unrecognized arguments: --no-such-option" in bad.stderr


def test_a_stdio_agent_gives_the_pipe_to_its_client_room_for_a_big_initial_model(tmp_path):
    import fcntl
    import os

    from proxy_agent.protocol.messages import CommandId
    from proxy_agent.protocol.wire import encode_frame

    setsize = getattr(fcntl, "F_GETPIPE_SZ", None)
    if setsize is None:
        pytest.skip("pipe sizes cannot be asked for here")
    env = subprocess_env()
    env["XDG_STATE_HOME"] = str(tmp_path)
    agent = subprocess.Popen([sys.executable, "-m", "proxy_agent", "--stdio"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        before = fcntl.fcntl(agent.stdout.fileno(), setsize)
        agent.stdin.write(encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"]))
        agent.stdin.flush()
        decoder = Decoder()
        while not list(decoder):
            data = os.read(agent.stdout.fileno(), 4096)
            assert data
            decoder.feed(data)
        wanted = min(1 << 20, int(open("/proc/sys/fs/pipe-max-size").read()))
        assert before < wanted <= fcntl.fcntl(agent.stdout.fileno(), setsize)
    finally:
        agent.kill()
        agent.wait()


def test_start_up_leaves_out_what_the_first_frames_do_not_need(tmp_path):
    # the whole start-up of a stdio agent, to the end of its input: what did it load?
    _, loaded = start_up_probe(tmp_path, before=[
        "import inspect",
        "built_in_signatures = []",
        "real = inspect._signature_fromstr",
        "def spy(cls, obj, text, *rest):",
        "    built_in_signatures.append(text)",
        "    return real(cls, obj, text, *rest)",
        "inspect._signature_fromstr = spy",
    ], after=[
        "found = sorted(m for m in ('fractions', 'configparser', 'decimal') if m in sys.modules)",
        "open(OUT, 'w').write(repr((found, built_in_signatures)))",
    ])
    # the broker's number and configuration modules wait for a ranking or a configuration; no
    # attrs converter is a built-in whose signature would make Python compile its tokenizer
    assert loaded == "([], [])"


def test_start_up_leaves_the_multi_part_runtime_for_the_first_multi_part_job(tmp_path):
    # an agent that serves a session to its end without a multi-part job never loads the
    # description, coordination or runtime server modules, and opens no runtime socket
    _, loaded = start_up_probe(tmp_path, before=[], after=[
        "names = ('description', 'state', 'server', 'rendezvous')",
        "found = sorted(m for m in ['proxy_agent.service.coalloc.' + n for n in names] + ['proxy_agent.runtime']",
        "               if m in sys.modules)",
        "open(OUT, 'w').write(repr(('proxy_agent.service.coalloc.manager' in sys.modules, found)))",
    ])
    assert loaded == "(True, [])"
    assert not list(tmp_path.rglob("runtime.sock"))


def test_the_collector_waits_for_the_start_up_imports_and_then_leaves_them_alone():
    probe = (
        "import gc; started = []; "
        "gc.callbacks.append(lambda phase, info: started.append(info['generation']) if phase == 'start' else None); "
        "import proxy_agent.__main__; "
        "print(repr(started).replace(' ', ''), gc.isenabled(), gc.get_freeze_count() > 10000)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=subprocess_env(),
                          timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    started, enabled, frozen = done.stdout.split()
    # No collection ran while trio and the agent's modules were imported (without the pause,
    # about fifty do, some of the middle generation): at most a young one or two while the
    # package's own first module is being loaded, before it can switch the collector off. The
    # collector is on again afterwards, and what the imports made is out of its generations.
    collections = eval(started)
    assert len(collections) <= 3 and set(collections) <= {0}, collections
    assert (enabled, frozen) == ("True", "True")


def test_the_keeper_makes_output_files_only_for_streams_that_wrote(tmp_path):
    import json
    import os
    import signal
    import socket
    import time

    keeper = subprocess.Popen([sys.executable, "-m", "proxy_agent.schedulers.keeper", str(tmp_path)],
                              env=subprocess_env())
    try:
        path = tmp_path / "keeper.sock"
        deadline = time.monotonic() + scaled(30)
        while True:
            sock = socket.socket(socket.AF_UNIX)
            try:
                sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                assert time.monotonic() < deadline, "the keeper did not open its socket"
                time.sleep(0.02)
        lines = sock.makefile("rb")

        def send(message: dict) -> None:
            sock.sendall(json.dumps(message).encode() + b"\n")

        send({"op": "hello"})
        lines.readline()
        env = dict(os.environ)
        send({"op": "spawn", "key": 1, "argv": ["/bin/true"], "env": env, "cwd": str(tmp_path), "count": 1})
        send({"op": "spawn", "key": 2, "argv": ["/bin/sh", "-c", "echo out"], "env": env, "cwd": str(tmp_path),
              "count": 1})
        done, output = set(), []
        while done != {1, 2}:
            message = json.loads(lines.readline())
            if message["op"] == "done":
                done.add(message["key"])
            elif message["op"] == "output":
                output.append((message["key"], message["stream"]))
        assert not (tmp_path / "jobs" / "1").exists()  # silent: no directory, no files
        assert sorted(os.listdir(tmp_path / "jobs" / "2")) == ["0.out"]
        # each job's start and end are lines of the journal, not files of their own
        entries = [json.loads(line) for line in (tmp_path / "jobs.jsonl").read_text().splitlines()]
        assert sorted((e["key"], bool(e.get("done"))) for e in entries) == [(1, False), (1, True), (2, False), (2, True)]
        for key in (1, 2):  # recorded as started before its end
            assert [bool(e.get("done")) for e in entries if e["key"] == key] == [False, True]
        assert all(e["codes"] == [0] for e in entries if e.get("done"))
        assert (tmp_path / "jobs" / "2" / "0.out").read_text() == "out\n"
        assert output == [(2, "stdout")]  # told before its end, which the agent relies on
        send({"op": "bye", "policy": "terminate"})
        sock.close()
    finally:
        try:
            keeper.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            os.killpg(keeper.pid, signal.SIGKILL)  # the custodian and its keeper
            keeper.wait()


def _plans_built(monkeypatch, note) -> list:
    """A list that gets ``note(model, base id)`` of every snapshot plan made from now on."""
    builds = []
    original = snapshot_module.build_plan

    def counting(model_, rules_, base=None, defer=False):
        builds.append(note(model_, base))
        return original(model_, rules_, base, defer)

    monkeypatch.setattr(snapshot_module, "build_plan", counting)
    return builds


async def test_a_quiet_model_is_planned_ahead_and_a_plan_of_an_older_version_is_never_served(monkeypatch, autojump_clock):
    model = _cluster()
    rules = render_module.NATIVE_RULES
    builds = _plans_built(monkeypatch, lambda model_, base: model_.version)
    wanted = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(snapshot_module.prepare_snapshot, model, lambda: rules, lambda: wanted)
        await trio.sleep(1)
        plan = snapshot_module.snapshot_plan(model, rules)
        assert builds == [model.version] and plan.prepared  # every event made before anyone asked
        first = b"".join(ModelView(model, 1000, rules).subscribe_chunks(7))
        assert builds == [model.version]  # the client only had its ids filled in
        # a change: the old plan is not served, whether or not the new one is ready yet
        job = model.keys(Kind.JOB)[0]
        model.update(job, {K.STATE: "RUNNING"})
        changed = _decoded(ModelView(model, 1000, rules).subscribe_chunks(7))
        assert snapshot_module.snapshot_plan(model, rules) is not plan
        states = [e for e in changed if e.event_id == EventId.NEW_JOB]
        assert "RUNNING" in repr(states) and "RUNNING" not in repr(_decoded([first]))
        # and once the model is quiet again, its new version is planned ahead
        model.update(job, {K.STATE: "QUEUING"})
        await trio.sleep(1)
        assert builds[-1] == model.version and snapshot_module.snapshot_plan(model, rules).prepared
        # the same bytes as planned on demand
        ahead = b"".join(ModelView(model, 1000, rules).subscribe_chunks(7))
        snapshot_module._PLANS.clear()
        assert b"".join(ModelView(model, 1000, rules).subscribe_chunks(7)) == ahead
        wanted = False
        await trio.sleep(1)  # the task ends once it is no longer wanted
        assert not nursery.child_tasks


async def test_a_plan_made_ahead_for_a_client_s_base_id_has_its_ids_in_and_is_served_to_it(monkeypatch, autojump_clock):
    model = _cluster()
    rules = render_module.NATIVE_RULES
    builds = _plans_built(monkeypatch, lambda model_, base: base)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(snapshot_module.prepare_snapshot, model, lambda: rules, lambda: True,
                                             base=lambda: 1000))
        await trio.sleep(1)
        plan = snapshot_module.snapshot_plan(model, rules, 1000)
        assert builds == [1000] and plan.prepared and plan.base == 1000
        chunks = b"".join(ModelView(model, 1000, rules).subscribe_chunks(7))
        assert builds == [1000]  # nothing made again: the client's ids were already in
        # another base id gets the plan for every base id, made once, then planned ahead no more
        assert _decoded([b"".join(ModelView(model, 2000, rules).subscribe_chunks(7))])
        await trio.sleep(1)
        assert builds == [1000, None]
        snapshot_module._PLANS.clear()
        assert b"".join(ModelView(model, 1000, rules).subscribe_chunks(7)) == chunks
        nursery.cancel_scope.cancel()


async def test_an_agent_serving_a_socket_plans_the_initial_model_before_a_client_asks(tmp_path):
    from proxy_agent.client import AgentClient

    from agent_fixtures import BackgroundAgent, stderr_so_far

    path = str(tmp_path / "agent.sock")
    async with BackgroundAgent("--unix", path, "-vv", "--scheduler", "sim", "--sim-nodes", "20",
                               "--sim-jobs", "2000") as agent:
        with trio.fail_after(scaled(30)):
            while "initial model planned ahead" not in stderr_so_far(agent.process):
                await trio.sleep(0.05)
        # a client of the default dialect (what the agent plans for before any client came)
        client = await AgentClient.connect_unix(path, dialect=DEFAULT.name)
        async with client:
            await client.init()
            await client.model_def()
            await client.start_events()
            await client.wait_for(lambda: len(client.jobs) == 2000, scaled(30), description="the initial model")
        log = stderr_so_far(agent.process)
        # planned once, before the client came; the client's START_EVENTS only rendered it
        assert log.count("initial model planned (") == 1, log


async def test_a_client_that_waits_after_model_def_gets_the_model_planned_meanwhile():
    from proxy_agent.client import AgentClient

    from agent_fixtures import agent_argv

    argv = agent_argv("-vv", "--scheduler", "sim", "--sim-nodes", "20", "--sim-jobs", "2000")
    with trio.fail_after(scaled(30)):
        async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
            await client.init()
            await client.model_def()
            while "initial model planned ahead" not in client.process.stderr_tail(lines=1000):
                await trio.sleep(0.05)
            await client.start_events()
            await client.wait_for(lambda: len(client.jobs) == 2000, scaled(30), description="the initial model")
            log = client.process.stderr_tail(lines=1000)
            await client.quit()
    assert log.count("initial model planned (") == 1, log
