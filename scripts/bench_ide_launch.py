#!/usr/bin/env python3
"""How long an IDE launch on the local scheduler takes, alone and beside a slow submission.

The Eclipse PTP 4.0 IDE finishes a launch when a JOB_CHANGE for the submitted job says
``jobState=RUNNING`` (its console opens then), and the user sees the program's first output
line after that.  This measures both, from the moment SUBMIT_JOB is written, for launches of
``/bin/echo`` on ``--scheduler local``, one after the other, in the default dialect as the IDE
speaks it (INIT with its base id, no dialect), through raw frames.

Each launch is timed in two conditions, in the same agent and interleaved in blocks so that
the shared machine's noise falls on both alike:

* alone: no other submission in flight;
* beside a slow submission: another SUBMIT_JOB is in flight the whole time, a new one sent as
  soon as the last is answered.  The slow one goes to the simulated scheduler with
  ``--sim-submit-delay 0.5`` (a submission taking 500 ms), and, when a Grid Engine cell answers
  (``scripts/sge-up``, ``eval "$(scripts/sge-env)"``), in a second agent to Grid Engine itself:
  its qsub (those jobs are submitted held and deleted at the end).

Prints the median and 95th percentile of each, and the ratio of the medians beside / alone.
Targets: median under 50 ms; no more than 2x slower beside a slow submission.  Every launch is
also checked as the IDE needs it: NEW_JOB saying STARTING, then a JOB_CHANGE saying RUNNING.

Usage: scripts/bench_ide_launch.py [--launches N] [--block N] [--no-sge]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from benchlib import RawAgent, median
from proxy_agent.protocol.messages import CommandId, EventId
from proxy_agent.protocol.rangeset import RangeSet

IDE_BASE = 2**24
_ANSWERS = (int(EventId.OK), int(EventId.ERROR), int(EventId.SUBMITJOB_ERROR))


def percentile(values: List[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def groups(args, first: int):
    """(ids, attributes) of the range groups of a NEW/CHANGE event from ``args[first]`` (its count)."""
    pos = first + 1
    for _ in range(int(args[first])):
        ids, count = args[pos], int(args[pos + 1])
        yield RangeSet.parse(ids), args[pos + 2:pos + 2 + count]
        pos += 2 + count


class Bench:
    """One agent, a launch at a time, with or without a slow submission kept in flight."""

    def __init__(self, agent_args: List[str], slow_queue: str, slow_extra: List[str]) -> None:
        self.agent = RawAgent(agent_args)
        self.agent.complete(self.agent.send(CommandId.INIT, "version=2.0", f"baseId={IDE_BASE}"))
        self.agent.complete(self.agent.send(CommandId.MODEL_DEF))
        self.agent.send(CommandId.START_EVENTS)
        self.agent.complete(self.agent.send(CommandId.LIST_FILTERS))  # the initial model is in
        self.slow_queue = slow_queue
        self.slow_extra = slow_extra
        self.slow_tid: Optional[int] = None
        self.slow_jobs: List[int] = []
        self.slow_subs: set = set()
        self.keep_slow = False
        self.count = 0
        self.bad: List[str] = []

    def _see(self, msg: int, tid: int, args) -> None:
        """What every frame may be: the answer to the slow submission in flight (another one is
        sent at once while they are wanted), or a slow submission's job."""
        if tid == self.slow_tid and msg in _ANSWERS:
            if msg != EventId.OK:
                raise RuntimeError(f"the slow submission failed: {args}")
            self.slow_tid = None
            if self.keep_slow:
                self._send_slow()
        elif msg == EventId.NEW_JOB:
            for ids, attrs in groups(args, 1):
                if any(a.startswith("jobSubId=slow-") for a in attrs):
                    self.slow_jobs.extend(ids)

    def _send_slow(self) -> None:
        self.count += 1
        sub = f"slow-{self.count}"
        self.slow_subs.add(sub)
        self.slow_tid = self.agent.send(CommandId.SUBMIT_JOB, f"jobSubId={sub}", "execPath=/bin/true",
                                        f"queueId={self.slow_queue}", *self.slow_extra)

    def launch(self, beside_slow: bool) -> Tuple[float, float]:
        """One launch of /bin/echo: seconds to the JOB_CHANGE saying RUNNING and to its first
        output line (it is waited for to its end)."""
        agent = self.agent
        if beside_slow and self.slow_tid is None:
            self._send_slow()
        self.keep_slow = beside_slow
        self.count += 1
        sub = f"launch-{self.count}"
        began = time.perf_counter()
        agent.send(CommandId.SUBMIT_JOB, f"jobSubId={sub}", "execPath=/bin/echo", "progArgs=hello",
                   "queueId=local:default")
        job: Optional[str] = None
        running = output = None
        completed = False
        for frame in agent.frames():
            now = time.perf_counter()
            msg, args = frame.msg_id, frame.args
            self._see(msg, frame.tid, args)
            if msg == EventId.NEW_JOB and job is None:
                for ids, attrs in groups(args, 1):
                    if f"jobSubId={sub}" in attrs:
                        job = str(ids.first)
                        if "jobState=STARTING" not in attrs:
                            # the IDE's launch would never complete: timed as if it had
                            self.bad.append(f"{sub}: NEW_JOB says {[a for a in attrs if a.startswith('jobState=')]}")
                            running = now
                            completed = "jobState=COMPLETED" in attrs
            elif msg == EventId.JOB_CHANGE and job is not None:
                for ids, attrs in groups(args, 0):
                    if int(job) not in ids:
                        continue
                    if "jobState=RUNNING" in attrs and running is None:
                        running = now
                    if "jobState=COMPLETED" in attrs:
                        if running is None:
                            self.bad.append(f"{sub}: COMPLETED without a JOB_CHANGE saying RUNNING")
                            running = now
                        completed = True
            elif msg == EventId.PROCESS_CHANGE and job is not None and args[0] == job and output is None:
                if any(a.startswith("processStdout=") for _, attrs in groups(args, 1) for a in attrs):
                    output = now
            if completed and running is not None and output is not None:
                return running - began, output - began
        raise RuntimeError("the agent closed its output")

    def settle(self) -> None:
        """Let the slow submission in flight be answered, and its job be told of."""
        self.keep_slow = False
        fence: Optional[int] = None
        while True:
            if self.slow_tid is None and fence is None:
                # the job of an answered submission goes out right behind its OK: before this
                fence = self.agent.send(CommandId.LIST_FILTERS)
            frame = next(self.agent.frames(), None)
            if frame is None:
                raise RuntimeError("the agent closed its output")
            self._see(frame.msg_id, frame.tid, frame.args)
            if frame.tid == fence and frame.msg_id == EventId.OK:
                return

    def close(self) -> None:
        self.settle()
        if "hold=true" in self.slow_extra:  # held jobs: deleted
            for job in self.slow_jobs:
                tid = self.agent.send(CommandId.TERMINATE_JOB, f"jobId={job}")
                self.agent.wait_for(lambda f, tid=tid: f.tid == tid and f.msg_id in (EventId.OK,
                                                                                     EventId.TERMINATEJOB_ERROR))
        self.agent.close()


def measure(bench: Bench, launches: int, block: int) -> Dict[str, List[Tuple[float, float]]]:
    results: Dict[str, List[Tuple[float, float]]] = {"alone": [], "beside": []}
    for _ in range(3):  # warm-up: the first jobs pay for imports and caches
        bench.launch(False)
    while len(results["beside"]) < launches:
        for beside in (False, True):
            if not beside:
                bench.settle()
            key = "beside" if beside else "alone"
            for _ in range(min(block, launches - len(results[key]))):
                results[key].append(bench.launch(beside))
    bench.settle()
    return results


def report(label: str, results: Dict[str, List[Tuple[float, float]]]) -> None:
    def row(name: str, values: List[Tuple[float, float]]) -> Tuple[float, float]:
        running = [r * 1000 for r, _ in values]
        output = [o * 1000 for _, o in values]
        print(f"  {name:<38} RUNNING median {median(running):7.1f} ms  p95 {percentile(running, 0.95):7.1f} ms"
              f"   first output median {median(output):7.1f} ms  p95 {percentile(output, 0.95):7.1f} ms"
              f"   ({len(values)} launches)")
        return median(running), median(output)

    print(label)
    alone = row("alone", results["alone"])
    beside = row("beside a slow submission", results["beside"])
    print(f"  {'ratio of medians, beside / alone':<38} RUNNING {beside[0] / alone[0]:.2f}x"
          f"   first output {beside[1] / alone[1]:.2f}x   (targets: median < 50 ms, ratio <= 2x)")


def sge_cell() -> Optional[str]:
    """Why Grid Engine cannot be used here (None when a cell answers)."""
    if shutil.which("qsub") is None or shutil.which("qstat") is None:
        return "no Grid Engine commands"
    env = dict(os.environ)
    env.setdefault("SGE_ROOT", "/var/lib/gridengine")
    env.setdefault("SGE_CELL", "default")
    try:
        result = subprocess.run(["qstat"], capture_output=True, timeout=15, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "the Grid Engine master does not answer"
    if result.returncode != 0:
        return f"qstat failed: {result.stderr.decode(errors='replace').strip()[:200]}"
    os.environ.update(SGE_ROOT=env["SGE_ROOT"], SGE_CELL=env["SGE_CELL"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=200, help="launches in each condition (default 200)")
    parser.add_argument("--block", type=int, default=20, help="launches per block before switching (default 20)")
    parser.add_argument("--no-sge", action="store_true", help="leave out the Grid Engine agent")
    args = parser.parse_args()

    bench = Bench(["--scheduler", "local,sim", "--sim-submit-delay", "0.5", "--sim-time-scale", "0.01"],
                  "sim:debug", [])
    try:
        results = measure(bench, args.launches, args.block)
        slow = len(bench.slow_subs)
        bad = list(bench.bad)
    finally:
        bench.close()
    report(f"IDE launches on the local scheduler, beside submissions that take 500 ms (the test backend; "
           f"{slow} slow submissions):", results)

    why = "left out (--no-sge)" if args.no_sge else sge_cell()
    if why is None:
        bench = Bench(["--scheduler", "local,sge", "--sge-poll-interval", "1"], "sge:all.q", ["hold=true"])
        try:
            results = measure(bench, args.launches, args.block)
            slow = len(bench.slow_subs)
            bad += bench.bad
        finally:
            bench.close()
        report(f"IDE launches on the local scheduler, beside Grid Engine qsubs ({slow} held jobs, deleted):",
               results)
    else:
        print(f"Grid Engine: {why}")
    print(f"launches not told as the IDE needs (NEW_JOB STARTING, then JOB_CHANGE RUNNING): {len(bad)}")
    for line in bad[:10]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
