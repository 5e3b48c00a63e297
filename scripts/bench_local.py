#!/usr/bin/env python3
"""Job throughput of the local scheduler, end to end through the protocol.

Submits N jobs running /bin/true (all frames sent at once, as a busy IDE
would) and waits until every one is reported COMPLETED.  Prints jobs per
second, median of several runs.  Target: >= 250 jobs/s for 1,000 jobs.

Usage: scripts/bench_local.py [--jobs N] [--runs N]
"""

from __future__ import annotations

import argparse
import time

from benchlib import RawAgent, median
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.rangeset import RangeSet
from proxy_agent.protocol.wire import encode_frame


def run_once(jobs: int) -> dict:
    agent = RawAgent()
    try:
        agent.handshake()
        start_tid = agent.send(CommandId.START_EVENTS)
        frames = []
        first_tid = agent.tid + 1
        for n in range(jobs):
            agent.tid += 1
            frames.append(
                encode_frame(
                    CommandId.SUBMIT_JOB,
                    agent.tid,
                    [f"jobSubId=bench-{n}", "execPath=/bin/true", "jobNumProcs=1"],
                )
            )
        t0 = time.perf_counter()
        agent.send_many(frames)
        ok = 0
        failed = 0
        completed_jobs: set = set()
        for frame in agent.frames():
            if frame.msg_id == EventId.OK and frame.tid >= first_tid:
                ok += 1
            elif frame.msg_id in (EventId.SUBMITJOB_ERROR, EventId.ERROR):
                failed += 1
            elif frame.msg_id == EventId.JOB_CHANGE and frame.tid == start_tid:
                # NUM_RANGES { RANGE NUM_ATTRS attrs... }
                args = frame.args
                pos = 1
                for _ in range(int(args[0])):
                    ids, n = args[pos], int(args[pos + 1])
                    if "jobState=COMPLETED" in args[pos + 2:pos + 2 + n]:
                        completed_jobs.update(RangeSet.parse(ids))
                    pos += 2 + n
            if ok + failed >= jobs and len(completed_jobs) >= ok:
                break
        elapsed = time.perf_counter() - t0
        return {"seconds": elapsed, "ok": ok, "failed": failed, "rate": jobs / elapsed}
    finally:
        agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = [run_once(args.jobs) for _ in range(args.runs)]
    print(f"local scheduler: {args.jobs} x /bin/true submitted through the protocol, {args.runs} runs")
    for r in results:
        print(f"  {r['seconds']:.2f} s  {r['rate']:.0f} jobs/s  ({r['ok']} OK, {r['failed']} failed)")
    print(f"  median {median([r['rate'] for r in results]):.0f} jobs/s (target >= 250)")


if __name__ == "__main__":
    main()
