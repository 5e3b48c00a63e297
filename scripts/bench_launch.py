#!/usr/bin/env python3
"""Local launch rate, end to end through the protocol, next to what the machine allows.

Submits N jobs running /bin/true to ``--scheduler local`` (all SUBMIT_JOB frames written at
once, as a busy IDE would) and waits until every one is reported COMPLETED (in a JOB_CHANGE,
or already in its NEW_JOB when it ended before the agent first told of it).  Prints jobs per
second, the agent's and the keeper's CPU time per job and the frames the client received per job.

Floor, measured in the same run: ``subprocess.Popen`` of the same N /bin/true processes, all
started, then all waited for.  Targets: a rate >= 0.6x the floor, <= 4 frames per job.

Usage: scripts/bench_launch.py [--jobs N] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from benchlib import RawAgent, median
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import encode_frame


def _completed_in(args, first: int) -> set:
    """Element ids reported COMPLETED in a NEW/CHANGE event's range groups starting at ``first``."""
    found: set = set()
    pos = first
    for _ in range(int(args[first - 1])):
        ids, n = args[pos], int(args[pos + 1])
        if "jobState=COMPLETED" in args[pos + 2:pos + 2 + n]:
            found.update(RangeSet.parse(ids))
        pos += 2 + n
    return found


def _keeper_cpu(agent_pid: int) -> float:
    """CPU seconds of the keeper the agent started: its custodian (the agent's child) and the
    keeper under it (not counting the jobs)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = 0
    pending = [agent_pid]
    seen = set()
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    pids = children.read().split()
            except OSError:
                continue
            for pid in pids:
                if pid in seen:
                    continue
                seen.add(pid)
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        if b"proxy_agent.schedulers.keeper" not in cmdline.read():
                            continue
                    with open(f"/proc/{pid}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                used += int(fields[11]) + int(fields[12])
                pending.append(int(pid))  # the keeper under the custodian
    return used / ticks


def run_agent(jobs: int) -> dict:
    agent = RawAgent()
    try:
        agent.handshake()
        start_tid = agent.send(CommandId.START_EVENTS)
        agent.complete(agent.send(CommandId.LIST_FILTERS))  # the initial model is in
        frames = []
        first_tid = agent.tid + 1
        for n in range(jobs):
            agent.tid += 1
            frames.append(encode_frame(CommandId.SUBMIT_JOB, agent.tid,
                                       [f"jobSubId=bench-{n}", "execPath=/bin/true", "jobNumProcs=1"]))
        cpu0 = agent.cpu_seconds()
        keeper0 = _keeper_cpu(agent.proc.pid)
        received = 0
        t0 = time.perf_counter()
        agent.send_many(frames)
        ok = failed = 0
        completed: set = set()
        for frame in agent.frames():
            received += 1
            if frame.msg_id == EventId.OK and frame.tid >= first_tid:
                ok += 1
            elif frame.msg_id in (EventId.SUBMITJOB_ERROR, EventId.ERROR):
                failed += 1
            elif frame.tid == start_tid:
                if frame.msg_id == EventId.JOB_CHANGE:
                    completed |= _completed_in(frame.args, 1)
                elif frame.msg_id == EventId.NEW_JOB:
                    completed |= _completed_in(frame.args, 2)
            if ok + failed >= jobs and len(completed) >= ok:
                break
        elapsed = time.perf_counter() - t0
        cpu = agent.cpu_seconds() - cpu0
        keeper = _keeper_cpu(agent.proc.pid) - keeper0
        return {"seconds": elapsed, "ok": ok, "failed": failed, "rate": jobs / elapsed,
                "frames": received / jobs, "cpu_ms": cpu / jobs * 1000,
                "keeper_ms": keeper / jobs * 1000}
    finally:
        agent.close()


def run_floor(jobs: int) -> float:
    """Jobs per second of Popen alone: start every /bin/true, then wait for each."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["/bin/true"]) for _ in range(jobs)]
    for proc in procs:
        proc.wait()
    return jobs / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results = []
    floors = []
    for _ in range(args.runs):  # interleaved, so that both see the same load
        floors.append(run_floor(args.jobs))
        results.append(run_agent(args.jobs))
    print(f"local scheduler: {args.jobs} x /bin/true submitted through the protocol, {args.runs} runs")
    for r, floor in zip(results, floors):
        print(f"  {r['seconds']:.2f} s  {r['rate']:.0f} jobs/s  ({r['ok']} OK, {r['failed']} failed)"
              f"  {r['frames']:.2f} frames/job  {r['cpu_ms']:.2f} ms agent CPU/job"
              f"  {r['keeper_ms']:.2f} ms keeper CPU/job   floor {floor:.0f} jobs/s")
    rate = median([r["rate"] for r in results])
    floor = median(floors)
    print(f"  median {rate:.0f} jobs/s, Popen floor {floor:.0f} jobs/s: x{rate / floor:.2f} (target >= 0.6);"
          f" {median([r['frames'] for r in results]):.2f} frames/job (target <= 4);"
          f" {median([r['cpu_ms'] for r in results]):.2f} ms agent CPU/job,"
          f" {median([r['keeper_ms'] for r in results]):.2f} ms keeper CPU/job")


if __name__ == "__main__":
    main()
