#!/usr/bin/env python3
"""The initial model at cluster scale: time, memory and bytes, each next to its floor.

* scaling: ``--scheduler sim --sim-nodes 10000 --sim-jobs N`` for N = 10k, 100k and 1M: time
  from sending START_EVENTS to receiving (and decoding) the last event of the initial model (a
  LIST_FILTERS sent right behind START_EVENTS is answered only after the whole initial model,
  so its OK marks the end), the agent's CPU time in that interval, bytes on the wire, the
  agent's peak RSS and the cost per job.  Floor: the same client receiving and decoding the
  very same bytes from a process that only writes them to a pipe.
  Targets: 100k jobs <= 0.12 s and <= 120 MB; 1M jobs <= 1.2 s and <= 400 MB.
* clients: one ``--unix`` agent per measurement with 1, 2 and 10 clients that send
  START_EVENTS at the same instant; time until the last client has the whole model (read as
  bytes, not decoded, so that the benchmark's own decoding does not count).  Same base id for
  every client, then a different one each.  Targets: 2 clients <= 1.3x, 10 clients <= 3x one.
* worst case, in process: every job with its own attributes and one process (nothing shares
  a range group); builds the snapshot plan and renders it to bytes.

Medians of ``--runs`` runs (the 1M model: ``--big-runs``).
``--settle SECONDS``: the stdio client waits that long between the OK of MODEL_DEF and
START_EVENTS (the agent plans the initial model while the model is quiet in between).
Usage: scripts/bench_model.py [--nodes N] [--runs N] [--big-runs N] [--skip-big] [--quick] [--settle S]
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from typing import List

from benchlib import ROOT, RawAgent, median, stop_service
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.wire import Decoder, Frame, encode_frame


def _sim_args(nodes: int, jobs: int, process_share: float) -> List[str]:
    return ["--scheduler", "sim", "--sim-nodes", str(nodes), "--sim-jobs", str(jobs),
            "--sim-process-share", str(process_share)]


def bench_model(nodes: int, jobs: int, process_share: float = 0.1, keep_bytes: bool = False,
                settle: float = 0.0) -> dict:
    """One agent over stdio: START_EVENTS to the last model event, every frame decoded.
    ``settle``: seconds between the OK of MODEL_DEF and START_EVENTS."""
    agent = RawAgent(_sim_args(nodes, jobs, process_share))
    try:
        agent.handshake()
        if settle:
            time.sleep(settle)
        before = agent.bytes_received
        captured: List[bytes] = []
        if keep_bytes:
            agent.capture = captured
        cpu0 = agent.cpu_seconds()
        t0 = time.perf_counter()
        start_tid = agent.send(CommandId.START_EVENTS)
        fence_tid = agent.send(CommandId.LIST_FILTERS)
        events = 0
        first = None
        last_model_event = t0
        for frame in agent.frames():
            if frame.tid == start_tid and EventId.NEW_JOB <= frame.msg_id <= EventId.REMOVE_QUEUE:
                events += 1
                last_model_event = time.perf_counter()
                if first is None:
                    first = last_model_event - t0
            elif frame.msg_id == EventId.OK and frame.tid == fence_tid:
                break
            elif frame.msg_id == EventId.ERROR:
                raise RuntimeError(f"agent error: {frame.args}")
        cpu = agent.cpu_seconds() - cpu0
        agent.capture = None
        return {
            "seconds": last_model_event - t0,
            "first_event": first or 0.0,
            "cpu": cpu,
            "events": events,
            "bytes": agent.bytes_received - before,
            "rss_mb": agent.peak_rss_mb(),
            "wire": b"".join(captured),
        }
    finally:
        agent.close()


# (with the same 1 MB pipe the agent asks for)
_WRITER = (
    "import fcntl, sys; data = open(sys.argv[1], 'rb').read(); out = sys.stdout.buffer;"
    " fcntl.fcntl(1, getattr(fcntl, 'F_SETPIPE_SZ', 1031), 1 << 20);"
    " out.write(b'R'); out.flush(); sys.stdin.buffer.read(1); out.write(data); out.flush()"
)


def bench_floor(wire: bytes, start_tid: int) -> float:
    """The client receiving and decoding the same bytes from a process that only writes them."""
    # The writer has the bytes in memory and says so before the clock starts; it starts
    # writing when told to, so that neither its start-up nor the bytes' way to it counts.
    with tempfile.NamedTemporaryFile(prefix="bench-model-") as saved:
        saved.write(wire)
        saved.flush()
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, saved.name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, bufsize=0)
        try:
            if os.read(writer.stdout.fileno(), 1) != b"R":
                raise RuntimeError("the writer did not start")
            decoder = Decoder(max_frame_size=1 << 30)
            t0 = time.perf_counter()
            writer.stdin.write(b"G")
            writer.stdin.close()
            last = t0
            while True:
                data = os.read(writer.stdout.fileno(), 1 << 20)
                if not data:
                    break
                decoder.feed(data)
                for frame in decoder:
                    if isinstance(frame, Frame) and frame.tid == start_tid and \
                            EventId.NEW_JOB <= frame.msg_id <= EventId.REMOVE_QUEUE:
                        last = time.perf_counter()
            return last - t0
        finally:
            writer.wait()


class _UnixClient:
    """A client of a ``--unix`` agent that reads raw bytes (no decoding)."""

    def __init__(self, path: str, base_id: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
                break
            except ConnectionRefusedError:  # bound, not yet listening
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.base_id = base_id
        self.tid = 0
        self.decoder = Decoder(max_frame_size=1 << 30)
        self.tail = b""
        self.done = False
        self.fence_end = b""

    def send(self, cid: CommandId, *args: str) -> int:
        self.tid += 1
        self.sock.sendall(encode_frame(int(cid), self.tid, list(args)))
        return self.tid

    def complete(self, tid: int) -> None:
        while True:
            for frame in self.decoder:
                if frame.tid == tid and frame.msg_id in (EventId.OK, EventId.ERROR):
                    if frame.msg_id == EventId.ERROR:
                        raise RuntimeError(f"agent error: {frame.args}")
                    return
            data = self.sock.recv(1 << 16)
            if not data:
                raise RuntimeError("agent closed the connection")
            self.decoder.feed(data)

    def handshake(self) -> None:
        self.complete(self.send(CommandId.INIT, "version=2.0", f"baseId={self.base_id}"))
        self.complete(self.send(CommandId.MODEL_DEF))

    def request_model(self) -> bytes:
        """START_EVENTS and a fence behind it, as one write; returns the fence's OK frame."""
        start = encode_frame(int(CommandId.START_EVENTS), self.tid + 1, [])
        fence = encode_frame(int(CommandId.LIST_FILTERS), self.tid + 2, [])
        self.tid += 2
        self.fence_end = encode_frame(int(EventId.OK), self.tid, [])
        return start + fence

    def read_some(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise RuntimeError("agent closed the connection")
        if (self.tail + data[-64:]).endswith(self.fence_end):
            self.done = True
        self.tail = data[-64:]


def bench_clients(nodes: int, jobs: int, clients: int, same_base: bool) -> dict:
    """``clients`` clients of one ``--unix`` agent ask for the initial model at one instant."""
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        path = os.path.join(tmp, "agent.sock")
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy_agent", "--unix", path, "--state-dir", os.path.join(tmp, "state"),
             *_sim_args(nodes, jobs, 0.1)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(path):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the agent did not open its socket")
                time.sleep(0.01)
            conns = [_UnixClient(path, 100 if same_base else 100 + n * 10_000_000) for n in range(clients)]
            for conn in conns:
                conn.handshake()
            requests = [conn.request_model() for conn in conns]
            selector = selectors.DefaultSelector()
            for conn in conns:
                selector.register(conn.sock, selectors.EVENT_READ, conn)
            from proxy_agent.endpoints import lock_holder

            service = (lock_holder(os.path.join(tmp, "state")) or {}).get("pid", proc.pid)
            # the service does the work; the launch passes each client on to it
            cpu0 = _cpu_seconds(service) + _cpu_seconds(proc.pid)
            t0 = time.perf_counter()
            for conn, request in zip(conns, requests):
                conn.sock.sendall(request)
            waiting = clients
            while waiting:
                for key, _ in selector.select(timeout=60):
                    conn = key.data
                    conn.read_some()
                    if conn.done:
                        selector.unregister(conn.sock)
                        waiting -= 1
            elapsed = time.perf_counter() - t0
            cpu = _cpu_seconds(service) + _cpu_seconds(proc.pid) - cpu0
            for conn in conns:
                conn.sock.close()
            return {"seconds": elapsed, "cpu": cpu}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            stop_service(os.path.join(tmp, "state"))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_unique_in_process(jobs: int, nodes: int) -> dict:
    """Worst case for grouping, in process: every job has its own name and id and one process.

    Nothing can share a range group, and every process needs its own NEW_PROCESS event (its
    parent differs).  Times building the snapshot plan and rendering it to frames.
    """
    import gc

    from proxy_agent.frontends.ptp.render import NATIVE_RULES
    from proxy_agent.frontends.ptp.snapshot import snapshot_plan
    from proxy_agent.service.model import K, Kind, ServiceModel

    model = ServiceModel()
    machine = model.add(Kind.MACHINE, None, {K.NAME: "bench", K.STATE: "UP"})
    model.add_many(Kind.NODE, machine, [{K.NAME: f"n{i:05d}", K.STATE: "UP", K.NUMBER: str(i)} for i in range(nodes)])
    queues = [model.add(Kind.QUEUE, None, {K.NAME: q, K.STATE: "NORMAL"}) for q in ("batch", "debug", "long")]
    for j in range(jobs):
        queue = queues[j % 3]
        job = model.add(Kind.JOB, queue, {
            K.NAME: f"run-{j}", K.NATIVE_ID: f"bench.{j}", K.STATE: "RUNNING", K.NATIVE_STATE: "R",
            K.QUEUE: queue, K.NUM_PROCS: "1", K.USER: "alice",
        })
        model.add_many(Kind.PROCESS, job, [{K.STATE: "RUNNING", K.PID: str(10000 + j)}])
    gc.collect()
    t0 = time.perf_counter()
    plan = snapshot_plan(model, NATIVE_RULES)
    t1 = time.perf_counter()
    chunks = plan.frames(100, 5)
    t2 = time.perf_counter()
    return {"plan": t1 - t0, "render": t2 - t1, "seconds": t2 - t0, "bytes": sum(map(len, chunks)),
            "frames": len(plan.events)}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--big-runs", type=int, default=5, help="runs of the 1M-job model")
    parser.add_argument("--skip-big", action="store_true", help="leave out the 1M-job model")
    parser.add_argument("--quick", action="store_true", help="100k jobs only, fewer runs")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long after MODEL_DEF before START_EVENTS (default 0: at once)")
    args = parser.parse_args()

    sizes = [(10_000, args.runs), (100_000, args.runs)]
    if not args.skip_big and not args.quick:
        sizes.append((1_000_000, args.big_runs))
    if args.quick:
        sizes = [(100_000, 3)]
    settled = f", START_EVENTS {args.settle:g} s after MODEL_DEF" if args.settle else ""
    print(f"initial model over stdio, sim {args.nodes} nodes (START_EVENTS -> last model event, decoded{settled}):")
    for jobs, runs in sizes:
        results = [bench_model(args.nodes, jobs, keep_bytes=(n == 0), settle=args.settle) for n in range(runs)]
        floors = [bench_floor(results[0]["wire"], 1 + 2) for _ in range(runs)]  # START_EVENTS is TID 3
        secs = median([r["seconds"] for r in results])
        cpu = median([r["cpu"] for r in results])
        floor = median(floors)
        rss = max(r["rss_mb"] for r in results)
        print(
            f"  {jobs:>9,} jobs: median {_ms(secs)} (first event {_ms(median([r['first_event'] for r in results]))},"
            f" agent CPU {_ms(cpu)}), floor {_ms(floor)} (x{secs / floor:.2f});"
            f" {secs / jobs * 1e6:.2f} us/job; {results[0]['events']} events,"
            f" {results[0]['bytes'] / 1e6:.1f} MB; peak RSS {rss:.0f} MB; {runs} runs"
        )

    jobs = 100_000
    runs = 3 if args.quick else args.runs
    print(f"clients at once, --unix agent, {jobs:,} jobs (until the last client has the model, bytes read raw):")
    for same_base in (True, False):
        one = None
        for count in (1, 2, 10):
            results = [bench_clients(args.nodes, jobs, count, same_base) for _ in range(runs)]
            secs = median([r["seconds"] for r in results])
            cpu = median([r["cpu"] for r in results])
            if one is None:
                one = secs
            label = "same base id" if same_base else "own base ids"
            print(f"  {count:>2} client(s), {label}: median {_ms(secs)} (agent CPU {_ms(cpu)}), x{secs / one:.2f} of one")

    worst = [bench_unique_in_process(jobs, args.nodes) for _ in range(runs)]
    print(f"worst case in process: {jobs:,} jobs with unique attributes and one process each, {args.nodes} nodes:")
    print(
        f"  grouping {_ms(median([w['plan'] for w in worst]))} + encoding and rendering"
        f" {_ms(median([w['render'] for w in worst]))}"
        f" = {_ms(median([w['seconds'] for w in worst]))}  ({worst[0]['frames']} frames, {worst[0]['bytes'] / 1e6:.1f} MB)"
    )


if __name__ == "__main__":
    main()
