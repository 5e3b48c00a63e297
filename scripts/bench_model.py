#!/usr/bin/env python3
"""Initial-model delivery at cluster scale, and agent start-up latency.

* model: ``--scheduler sim --sim-nodes 10000 --sim-jobs 100000``; time from
  sending START_EVENTS to receiving the last event of the initial model
  (a LIST_FILTERS sent right behind START_EVENTS is answered only after the
  whole initial model, so its OK marks the end).  Also bytes on the wire
  and the agent's peak RSS.  Targets: <= 1.0 s, <= 150 MB.
* start-up: from spawning ``proxy-agent --stdio`` to the OK for INIT,
  median of several runs.  Target: <= 250 ms.

Usage: scripts/bench_model.py [--nodes N] [--jobs N] [--runs N] [--startup-runs N]
"""

from __future__ import annotations

import argparse
import time

from benchlib import RawAgent, median
from proxy_agent.protocol.messages import CommandId, EventId


def bench_model(nodes: int, jobs: int, process_share: float = 0.1) -> dict:
    agent = RawAgent(["--scheduler", "sim", "--sim-nodes", str(nodes), "--sim-jobs", str(jobs),
                      "--sim-process-share", str(process_share)])
    try:
        agent.handshake()
        before = agent.bytes_received
        t0 = time.perf_counter()
        start_tid = agent.send(CommandId.START_EVENTS)
        # The agent answers commands sent after START_EVENTS only once the whole initial
        # model is out, so the reply to this LIST_FILTERS marks its end.
        fence_tid = agent.send(CommandId.LIST_FILTERS)
        counts = {"events": 0}
        first = None
        last_model_event = t0
        for frame in agent.frames():
            if frame.tid == start_tid and EventId.NEW_JOB <= frame.msg_id <= EventId.REMOVE_QUEUE:
                counts["events"] += 1
                last_model_event = time.perf_counter()
                if first is None:
                    first = last_model_event - t0
            elif frame.msg_id == EventId.OK and frame.tid == fence_tid:
                break
            elif frame.msg_id == EventId.ERROR:
                raise RuntimeError(f"agent error: {frame.args}")
        elapsed = last_model_event - t0
        return {
            "seconds": elapsed,
            "first_event": first or 0.0,
            "events": counts["events"],
            "bytes": agent.bytes_received - before,
            "rss_mb": agent.peak_rss_mb(),
        }
    finally:
        agent.close()


def bench_raw_receive(nodes: int, jobs: int, process_share: float) -> float:
    """START_EVENTS to the fence's OK, reading bytes without decoding them (the agent's side alone)."""
    import os

    from proxy_agent.protocol.wire import encode_frame

    agent = RawAgent(["--scheduler", "sim", "--sim-nodes", str(nodes), "--sim-jobs", str(jobs),
                      "--sim-process-share", str(process_share)])
    try:
        agent.handshake()
        t0 = time.perf_counter()
        agent.send(CommandId.START_EVENTS)
        fence = agent.send(CommandId.LIST_FILTERS)
        end = encode_frame(EventId.OK, fence, [])
        tail = b""
        while True:
            data = os.read(agent.proc.stdout.fileno(), 1 << 20)
            if not data or (tail + data).endswith(end):
                break
            tail = data[-len(end):]
        return time.perf_counter() - t0
    finally:
        agent.close()


def bench_unique_in_process(jobs: int, nodes: int) -> dict:
    """Worst case for grouping, in process: every job has its own name and id and one process.

    Nothing can share a range group, and every process needs its own NEW_PROCESS event (its
    parent differs).  Times building the snapshot events and encoding them to bytes.
    """
    import gc

    from proxy_agent.model import Model
    from proxy_agent.protocol.ids import IdAllocator
    from proxy_agent.protocol.messages import ElementKind as K
    from proxy_agent.protocol.wire import encode_frame

    model = Model(IdAllocator(100))
    machine = model.add(K.MACHINE, None, {"name": "bench", "machineState": "UP"})
    model.add_many(K.NODE, machine, [{"name": f"n{i:05d}", "nodeState": "UP", "nodeNumber": str(i)} for i in range(nodes)])
    queues = [model.add(K.QUEUE, None, {"name": q, "queueState": "NORMAL"}) for q in ("batch", "debug", "long")]
    for j in range(jobs):
        queue = queues[j % 3]
        job = model.add(K.JOB, queue, {
            "name": f"run-{j}", "jobId": f"bench.{j}", "jobState": "RUNNING", "jobStatus": "RUNNING",
            "queueId": str(queue), "jobNumProcs": "1", "userId": "alice",
        })
        model.add_many(K.PROCESS, job, [{"processState": "RUNNING", "processIndex": "0", "processPID": str(10000 + j)}])
    gc.collect()
    t0 = time.perf_counter()
    size = frames = 0
    for chunk in model.snapshot_wire(5):
        for event_id, args in chunk:
            size += len(encode_frame(event_id, 5, args))
            frames += 1
    return {"seconds": time.perf_counter() - t0, "bytes": size, "frames": frames}


def bench_startup(runs: int) -> list:
    times = []
    for _ in range(runs):
        agent = RawAgent()
        try:
            tid = agent.send(CommandId.INIT, "version=2.0", "baseId=100")
            agent.complete(tid)
            times.append(time.perf_counter() - agent.started)
        finally:
            agent.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=100000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--startup-runs", type=int, default=11)
    args = parser.parse_args()

    results = [bench_model(args.nodes, args.jobs) for _ in range(args.runs)]
    secs = median([r["seconds"] for r in results])
    rss = max(r["rss_mb"] for r in results)
    print(f"initial model, sim {args.nodes} nodes / {args.jobs} jobs, {args.runs} runs:")
    for r in results:
        print(
            f"  START_EVENTS -> last model event {r['seconds'] * 1000:8.1f} ms  (first after {r['first_event'] * 1000:.1f} ms)"
            f"  {r['events']} events  {r['bytes'] / 1e6:.1f} MB on the wire  peak RSS {r['rss_mb']:.1f} MB"
        )
    print(f"  median {secs * 1000:.1f} ms (target <= 1000 ms)   peak RSS max {rss:.1f} MB (target <= 150 MB)")

    every = [bench_model(args.nodes, args.jobs, process_share=1.0) for _ in range(args.runs)]
    raw = [bench_raw_receive(args.nodes, args.jobs, process_share=1.0) for _ in range(args.runs)]
    print("the same with every job listing its processes (--sim-process-share 1):")
    print(
        f"  median {median([r['seconds'] for r in every]) * 1000:.1f} ms with every frame decoded by the client,"
        f" {median(raw) * 1000:.1f} ms for the bytes alone"
        f"  {every[0]['events']} events  {every[0]['bytes'] / 1e6:.1f} MB on the wire"
        f"  peak RSS max {max(r['rss_mb'] for r in every):.1f} MB"
    )

    worst = [bench_unique_in_process(args.jobs, args.nodes) for _ in range(args.runs)]
    print(f"worst case in process: {args.jobs} jobs with unique attributes and one process each, {args.nodes} nodes:")
    print(
        f"  snapshot + encode median {median([w['seconds'] for w in worst]) * 1000:.1f} ms"
        f"  ({worst[0]['frames']} frames, {worst[0]['bytes'] / 1e6:.1f} MB)"
    )

    startup = bench_startup(args.startup_runs)
    print(f"start-up, spawn -> OK for INIT, {len(startup)} runs:")
    print(
        f"  median {median(startup) * 1000:.1f} ms  min {min(startup) * 1000:.1f} ms  max {max(startup) * 1000:.1f} ms"
        " (target: median <= 250 ms)"
    )


if __name__ == "__main__":
    main()
