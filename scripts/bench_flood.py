#!/usr/bin/env python3
"""Output floods: jobs that write as fast as they can, a client that reads or stalls.

* flood: N jobs running ``yes`` (default 50) and a client that reads as fast as it can.
  Every 0.5 s a LIST_FILTERS is sent and the time to its OK measured (the answer waits
  behind whatever output is queued before it); the output reaching the client is counted
  (bytes of PROCESS_CHANGE values per second).  Then QUIT: the time to SHUTDOWN, and
  whether any job process is left.  Targets: command answered within 2 s, >= 5 MB/s,
  QUIT within 2 s, no process left.
* stall: the same jobs; the client stops reading for S seconds (default 20) and the
  agent's memory is watched (peak RSS); then it reads again and a command is timed.
  Targets: <= 400 MB, the command answered within 5 s.

The client reaches the service of its state directory through a launch, as every client does
(the service writes to the client's pipe itself); ``--own-agent`` measures an agent of its own instead (the whole agent in
the launched process), for comparison.

Usage: scripts/bench_flood.py [--jobs N] [--seconds S] [--stall S] [--runs N] [--own-agent]
"""

from __future__ import annotations

import argparse
import os
import select
import time

from benchlib import PRIVATE_AGENT, RawAgent, median
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.wire import Frame


#: how the agent is started (see --own-agent)
COMMAND = [("-m", "proxy_agent")]


def _rss_mb(pid: int, key: str = "VmRSS:") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


def _job_pids(agent_pid: int) -> list:
    """Processes whose environment marks them as jobs of this agent's run (yes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                if cmd.read().split(b"\0")[0] == b"/usr/bin/yes":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _start(agent: RawAgent, jobs: int) -> int:
    agent.handshake()
    events = agent.send(CommandId.START_EVENTS)
    for i in range(jobs):
        agent.send(CommandId.SUBMIT_JOB, f"jobSubId=flood-{i}", "execPath=/usr/bin/yes")
    return events


def _pump(agent: RawAgent, until: float, probes: list, probe_every: float, counter: dict) -> None:
    """Read everything until ``until``; send a probe command now and then, time its answer."""
    next_probe = time.perf_counter()
    outstanding = {}
    fd = agent.proc.stdout.fileno()
    while True:
        now = time.perf_counter()
        if now >= until:
            return
        if now >= next_probe:
            outstanding[agent.send(CommandId.LIST_FILTERS)] = now
            next_probe = now + probe_every
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            continue
        data = os.read(fd, 1 << 20)
        if not data:
            raise RuntimeError("agent closed its output")
        agent.decoder.feed(data)
        for item in agent.decoder:
            if not isinstance(item, Frame):
                raise RuntimeError(f"malformed frame: {item}")
            if item.msg_id == EventId.PROCESS_CHANGE:
                counter["bytes"] += sum(len(a) for a in item.args if a.startswith("processStdout="))
            elif item.msg_id == EventId.OK and item.tid in outstanding:
                probes.append(time.perf_counter() - outstanding.pop(item.tid))


def flood(jobs: int, seconds: float) -> dict:
    agent = RawAgent(command=COMMAND[0])
    try:
        _start(agent, jobs)
        counter = {"bytes": 0}
        probes: list = []
        warm = time.perf_counter() + 1.0
        _pump(agent, warm, [], 10.0, {"bytes": 0})
        t0 = time.perf_counter()
        _pump(agent, t0 + seconds, probes, 0.5, counter)
        rate = counter["bytes"] / (time.perf_counter() - t0) / 1e6
        pids = _job_pids(agent.pid)
        rss = agent.peak_rss_mb()
        t1 = time.perf_counter()
        quit_tid = agent.send(CommandId.QUIT)
        shutdown = None
        for frame in agent.frames():
            if frame.msg_id == EventId.SHUTDOWN and frame.tid == quit_tid:
                shutdown = time.perf_counter() - t1
                break
        agent.proc.wait(timeout=10)
        time.sleep(0.3)
        left = [p for p in pids if os.path.exists(f"/proc/{p}")]
        return {"rate": rate, "probe_max": max(probes), "probe_median": median(probes), "quit": shutdown,
                "left": len(left), "rss": rss}
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()


def stall(jobs: int, pause: float) -> dict:
    agent = RawAgent(command=COMMAND[0])
    try:
        _start(agent, jobs)
        _pump(agent, time.perf_counter() + 2.0, [], 10.0, {"bytes": 0})
        peak = 0.0
        end = time.perf_counter() + pause
        while time.perf_counter() < end:  # not reading at all
            peak = max(peak, _rss_mb(agent.pid))
            time.sleep(0.2)
        t0 = time.perf_counter()
        probes: list = []
        tid = agent.send(CommandId.LIST_FILTERS)
        for frame in agent.frames():
            if frame.msg_id == EventId.OK and frame.tid == tid:
                break
        answered = time.perf_counter() - t0
        _pump(agent, time.perf_counter() + 1.0, probes, 0.25, {"bytes": 0})
        return {"peak_rss": max(peak, agent.peak_rss_mb()), "answered": answered,
                "after": max(probes) if probes else float("nan")}
    finally:
        agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stall", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--own-agent", action="store_true", help="an agent of its own, not a launch joining a service")
    args = parser.parse_args()
    if args.own_agent:
        COMMAND[0] = PRIVATE_AGENT
    floods = [flood(args.jobs, args.seconds) for _ in range(args.runs)]
    print(f"flood: {args.jobs} yes jobs, a client reading as fast as it can, {args.seconds:g} s, {args.runs} runs")
    for r in floods:
        print(f"  output {r['rate']:.1f} MB/s  command answered in median {r['probe_median'] * 1000:.0f} ms,"
              f" max {r['probe_max'] * 1000:.0f} ms  QUIT -> SHUTDOWN {r['quit'] * 1000:.0f} ms"
              f"  processes left {r['left']}  peak RSS {r['rss']:.0f} MB")
    print(f"  median output {median([r['rate'] for r in floods]):.1f} MB/s (target >= 5),"
          f" worst command {max(r['probe_max'] for r in floods) * 1000:.0f} ms (target <= 2000),"
          f" worst QUIT {max(r['quit'] for r in floods) * 1000:.0f} ms (target <= 2000)")
    stalls = [stall(args.jobs, args.stall) for _ in range(args.runs)]
    print(f"stall: the client stops reading for {args.stall:g} s, {args.runs} runs")
    for r in stalls:
        print(f"  peak RSS {r['peak_rss']:.0f} MB  first command after resuming {r['answered'] * 1000:.0f} ms,"
              f" then at most {r['after'] * 1000:.0f} ms")
    print(f"  worst peak RSS {max(r['peak_rss'] for r in stalls):.0f} MB (target <= 400),"
          f" median first answer {median([r['answered'] for r in stalls]) * 1000:.0f} ms (target <= 5000)")


if __name__ == "__main__":
    main()
