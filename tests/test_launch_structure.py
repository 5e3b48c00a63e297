"""What keeps local launches cheap: the keeper answers a round of requests in one write and
starts processes without subprocess.Popen, the agent sends the requests made while one
is being written in one write, and submissions that arrive together are committed to the job
store in one transaction.  (The rate itself comes from scripts/bench_launch.py; these
tests fail if what makes it possible is undone.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time

import trio

from proxy_agent.service.backend import Backend, Submitted
from proxy_agent.schedulers.common import state_attrs
from proxy_agent.schedulers.keeper_link import KeeperLink
from proxy_agent.schedulers.local import STATE_TABLE, LocalBackend
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.model import ChangeSink, K, Kind
from proxy_agent.service.service import JobService
from proxy_agent.service.store import JobStore

from agent_fixtures import subprocess_env
from wait_support import scaled

# Runs a keeper in its own process, counting what the test asks about; prints the counts.
_COUNTING_KEEPER = textwrap.dedent("""
    import json, subprocess, sys
    from proxy_agent.schedulers import keeper

    counts = {"messages": 0, "writes": 0, "popen": 0}
    send, writable = keeper.Keeper._send, keeper.Keeper._agent_writable

    def counted_send(self, message):
        counts["messages"] += self.agent is not None
        send(self, message)

    def counted_writable(self):
        counts["writes"] += bool(self.outbox) and self.agent is not None
        writable(self)

    class CountedPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            counts["popen"] += 1
            super().__init__(*args, **kwargs)

    def counted_run(self):  # the keeper is a child of its custodian: it tells its own counts
        try:
            run(self)
        finally:
            print(json.dumps(counts), flush=True)

    run = keeper.Keeper.run
    keeper.Keeper._send, keeper.Keeper._agent_writable = counted_send, counted_writable
    keeper.Keeper.run = counted_run
    keeper.subprocess.Popen = CountedPopen
    keeper.main([sys.argv[1]])
""")


def test_the_keeper_answers_a_round_in_one_write_and_starts_processes_without_popen(tmp_path):
    jobs = 20
    keeper = subprocess.Popen([sys.executable, "-c", _COUNTING_KEEPER, str(tmp_path)], env=subprocess_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + scaled(30)
        while True:
            sock = socket.socket(socket.AF_UNIX)
            try:
                sock.connect(str(tmp_path / "keeper.sock"))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                assert time.monotonic() < deadline, "the keeper did not open its socket"
                time.sleep(0.01)
        sock.settimeout(scaled(30))
        lines = sock.makefile("rb")
        sock.sendall(b'{"op":"hello"}\n')
        assert json.loads(lines.readline())["op"] == "jobs"
        env = {"PATH": os.defpath}
        sock.sendall(b"".join(
            json.dumps({"op": "spawn", "key": key, "argv": ["/bin/true"], "env": env, "cwd": str(tmp_path),
                        "count": 1}).encode() + b"\n"
            for key in range(1, jobs + 1)))
        done = set()
        while len(done) < jobs:
            message = json.loads(lines.readline())
            assert message["op"] in ("recorded", "spawned", "exit", "done"), message
            if message["op"] == "done":
                done.add(message["key"])
        sock.sendall(b'{"op":"bye","policy":"terminate"}\n')
        while lines.readline():
            pass
        sock.close()
        out, _ = keeper.communicate(timeout=scaled(30))
    finally:
        if keeper.poll() is None:
            os.killpg(keeper.pid, signal.SIGKILL)  # the custodian and its keeper
            keeper.wait()
    counts = json.loads(out.splitlines()[-1])
    assert counts["popen"] == 0  # a program given by its path is started with posix_spawn
    # 20 "spawned", 20 "exit", 20 "done" (and "recorded" for all): the spawns answered
    # together, each exit with its done
    assert counts["messages"] >= 3 * jobs
    assert counts["writes"] <= counts["messages"] // 2, counts


async def test_requests_made_while_one_is_written_go_in_one_write():
    a, b = socket.socketpair()
    writes = []

    class CountingStream:
        def __init__(self, stream: trio.SocketStream) -> None:
            self.stream = stream

        async def send_all(self, data) -> None:
            writes.append(bytes(data))
            await self.stream.send_all(data)

        async def aclose(self) -> None:
            await self.stream.aclose()

    link = KeeperLink(CountingStream(trio.SocketStream(trio.socket.from_stdlib_socket(a))), "test")
    async with trio.open_nursery() as nursery:
        for key in range(20):
            nursery.start_soon(link.send, {"op": "spawn", "key": key})
    received = b""
    b.settimeout(scaled(30))
    while received.count(b"\n") < 20:
        received += b.recv(1 << 16)
    assert sorted(json.loads(line)["key"] for line in received.splitlines()) == list(range(20))
    assert len(writes) <= 3, len(writes)
    await link.aclose()
    b.close()


def test_a_submission_is_written_without_walking_the_spec_with_asdict(monkeypatch):
    import attrs

    from proxy_agent.service import store
    from proxy_agent.service.jobs import JobSpec

    spec = JobSpec(executable="/bin/true", arguments=("a", "b"), environment=(("X", "1"),), extra=(("k", "v"),),
                   num_procs=3, wall_time=5, name="n")
    expected = json.dumps(attrs.asdict(spec, recurse=True), separators=(",", ":"))

    def refuse(*args, **kwargs):
        raise AssertionError("attrs.asdict walks every value of every submission")

    monkeypatch.setattr(attrs, "asdict", refuse)
    assert store.spec_to_json(spec) == expected
    assert store.spec_from_json(store.spec_to_json(spec)) == spec


class _StoreWatchingBackend(Backend):
    """Takes every job at once, noting whether another connection to the store already
    sees its submission when it is called (the job would start there)."""

    name = "watching"

    def __init__(self, model, path: str) -> None:
        super().__init__(model)
        self.path = path
        self.queue = None
        #: client ref -> was its submission committed when the backend was called
        self.committed: dict = {}

    def attributes(self):
        return []

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.queue = self.default_queue = self.model.add(Kind.QUEUE, None, {K.NAME: "default"}, owner=self.name)
        task_status.started()
        await trio.sleep_forever()

    async def submit(self, spec, queue, key=None) -> Submitted:
        reader = sqlite3.connect(self.path)
        try:
            found = reader.execute("SELECT count(*) FROM jobs WHERE key=?", (key,)).fetchone()[0]
        finally:
            reader.close()
        self.committed[spec.client_ref] = found == 1
        job = self.model.add(Kind.JOB, queue, {K.STATE: "QUEUING"}, owner=self.name, key=key)
        await trio.lowlevel.checkpoint()
        return Submitted(job)

    async def terminate(self, job: int) -> None:
        pass


async def test_submissions_that_arrive_together_are_committed_in_one_transaction_before_they_start(tmp_path):
    path = str(tmp_path / JobStore.FILE)
    store = JobStore(path)
    transactions = []
    in_transaction = [False]

    def traced(statement: str) -> None:
        word = statement.split(None, 1)[0].upper()
        if word == "BEGIN":
            in_transaction[0] = True
        elif word in ("COMMIT", "END"):
            in_transaction[0] = False
            transactions.append(statement)
        elif word == "ROLLBACK":
            in_transaction[0] = False
        elif word in ("INSERT", "UPDATE", "DELETE", "REPLACE") and not in_transaction[0]:
            transactions.append(statement)  # a statement of its own is a transaction of its own

    store._db.set_trace_callback(traced)
    service = JobService(store=store)
    backend = _StoreWatchingBackend(service.model, path)
    service.add_backend(backend)
    jobs = 20
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.ready.wait()
        transactions.clear()
        async with trio.open_nursery() as clients:  # a client that sends them all at once
            for n in range(jobs):
                clients.start_soon(service.submit, JobSpec("/bin/true", client_ref=f"s{n}"))
        assert len(service.stored) == jobs
        nursery.cancel_scope.cancel()
    # every submission was in the store before its scheduler was called...
    assert backend.committed == {f"s{n}": True for n in range(jobs)}
    # ...in one transaction for all of them, and none after (no scheduler id to add)
    assert len(transactions) == 1, transactions
    assert len(store.jobs()) == jobs
    store.close()


class _StatesAtFlush(ChangeSink):
    """What a client would see: the state of every changed job at each flush."""

    def __init__(self, model) -> None:
        self.model = model
        self.flushes = 0
        self._changed: set = set()
        self.states: dict = {}

    def changed(self, element, slots) -> None:
        if element.kind is Kind.JOB:
            self._changed.add(element.key)

    def flush(self) -> None:
        self.flushes += 1
        for key in self._changed:
            self.states.setdefault(key, []).append(self.model.attr(key, K.STATE))
        self._changed.clear()


def test_a_round_of_the_keepers_news_is_a_few_changes_of_the_model_that_keep_every_state(tmp_path):
    service = JobService()
    local = LocalBackend(service.model, None, service.context())
    service.add_backend(local)  # the queue's figures follow its jobs
    local._directory = str(tmp_path)
    local._populate()
    model = service.model

    def submit() -> int:
        return local._add_job(JobSpec("/bin/true"), "true", "/bin/true", str(tmp_path), 1,
                              state_attrs(STATE_TABLE, "PENDING"), None)

    jobs = [submit() for _ in range(20)]
    seen = _StatesAtFlush(model)
    model.subscribe(seen)
    local._notices([{"op": "spawned", "key": key, "pids": [10000 + key]} for key in jobs])
    local._notices([message for key in jobs
                    for message in ({"op": "exit", "key": key, "rank": 0, "code": 0}, {"op": "done", "key": key})])
    # the PIDs, the starts, the ends: not a change (and a write of the figures) per message
    assert seen.flushes <= 3, seen.flushes
    assert all(seen.states[key] == ["RUNNING", "FINISHED"] for key in jobs), seen.states
    assert model.attr(local.queue_id, K.RUNNING) == "0"
    # a job that starts and ends within one round is still seen running
    quick = submit()
    local._notices([{"op": "spawned", "key": quick, "pids": [99999]}, {"op": "exit", "key": quick, "rank": 0, "code": 0},
                    {"op": "done", "key": quick}])
    assert seen.states[quick] == ["RUNNING", "FINISHED"], seen.states[quick]
