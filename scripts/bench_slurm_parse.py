#!/usr/bin/env python3
"""SLURM backend figures: parsing, turning a listing into model differences, idle CPU.

    .venv/bin/python scripts/bench_slurm_parse.py [--jobs 100000] [--runs 5] [--idle-jobs 1000]

1. Median time to parse a synthetic squeue listing into SlurmJob records: ``parse_squeue_text``
   (the fixed text format of ``squeue_argv()``) and ``parse_squeue_json`` for the 22.05 (plain
   numbers) and 23.11 (number objects) JSON layouts.  Listings come from
   tests/data/slurm/make_large.py, so they match what the tests check.
2. Parse plus diff: the text listing parsed and handed to ``JobTable.apply`` as a poll would,
   with 1% of the jobs changed since the previous poll.  Target: at most 1.0 s for 100,000 jobs.
3. Idle CPU on the real cluster (only when one is reachable, see scripts/slurm-up): the agent
   with ``--scheduler slurm`` at the default poll interval, while ``--idle-jobs`` held jobs sit
   in the queue; CPU seconds of the agent over a measuring window.  Target: under 2% of a core.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from proxy_agent.schedulers.batch.engine import JobTable
from proxy_agent.schedulers.batch.slurm.system import native_job  # noqa: E402
from proxy_agent.schedulers.batch.slurm.parse import parse_squeue_json, parse_squeue_text  # noqa: E402


def _make_large():
    path = os.path.join(ROOT, "tests", "data", "slurm", "make_large.py")
    spec = importlib.util.spec_from_file_location("make_large", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_seconds(fn, data, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = fn(data)
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times), len(fn(data))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle-jobs", type=int, default=1000, help="jobs queued for the idle-CPU figure (0: skip it)")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    args = ap.parse_args(argv)
    make_large = _make_large()
    cases = [
        ("text (squeue --Format)", parse_squeue_text, make_large.squeue_text(args.jobs)),
        ("json 22.05 layout", parse_squeue_json, make_large.squeue_json(args.jobs, "22.05")),
        ("json 23.11 layout", parse_squeue_json, make_large.squeue_json(args.jobs, "23.11")),
    ]
    print(f"squeue listing of {args.jobs:,} jobs, median of {args.runs} runs "
          f"(Python {sys.version.split()[0]})")
    for label, fn, data in cases:
        seconds, count = median_seconds(fn, data, args.runs)
        size = len(data.encode("utf-8")) / 1e6
        print(f"  {label:24s} {seconds * 1000:8.1f} ms  ({count:,} records, {size:.1f} MB)")
    bench_parse_and_diff(make_large, args.jobs, args.runs)
    if args.idle_jobs:
        bench_idle_cpu(args.idle_jobs, args.idle_seconds)
    return 0


def _changed_listing(text: str, every: int) -> str:
    """The same listing with every ``every``-th job's state field changed."""
    lines = text.split("\n")
    for i in range(0, len(lines), every):
        if "RUNNING" in lines[i]:
            lines[i] = lines[i].replace("RUNNING", "COMPLETING", 1)
        elif "PENDING" in lines[i]:
            lines[i] = lines[i].replace("PENDING", "RUNNING", 1)
    return "\n".join(lines)


def bench_parse_and_diff(make_large, jobs: int, runs: int) -> None:
    first = make_large.squeue_text(jobs)
    second = _changed_listing(first, 100)
    table = JobTable()
    table.apply([native_job(j) for j in parse_squeue_text(first)], 0)
    totals, parses, diffs = [], [], []
    counts = None
    for n in range(runs):
        text = second if n % 2 == 0 else first
        start = time.perf_counter()
        records = [native_job(j) for j in parse_squeue_text(text)]
        parsed = time.perf_counter()
        changes = table.apply(records, n + 1)
        done = time.perf_counter()
        parses.append(parsed - start)
        diffs.append(done - parsed)
        totals.append(done - start)
        counts = (len(changes.added), len(changes.changed), len(changes.gone))
    print(f"parse + diff of a {jobs:,}-job poll (1% changed), median of {runs} runs:")
    print(f"  parse {statistics.median(parses) * 1000:.1f} ms  diff {statistics.median(diffs) * 1000:.1f} ms"
          f"  total {statistics.median(totals) * 1000:.1f} ms (target <= 1000 ms)"
          f"  last poll: {counts[0]} added, {counts[1]} changed, {counts[2]} gone")


def bench_idle_cpu(jobs: int, seconds: float) -> None:
    import shutil
    import subprocess

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from slurm_support import skip_reason, slurm_conf  # noqa: E402

    reason = skip_reason()
    if reason:
        print(f"idle CPU on a real SLURM: not measured ({reason})")
        return
    env = dict(os.environ, SLURM_CONF=slurm_conf())
    sbatch = shutil.which("sbatch")
    ids = []
    script = "#!/bin/sh\nsleep 600\n"
    try:
        for n in range(jobs):
            out = subprocess.run([sbatch, "--parsable", "--hold", "--job-name", f"idle-{n}", "--output", "/dev/null"],
                                 input=script, capture_output=True, text=True, env=env, check=True)
            ids.append(out.stdout.strip().split(";")[0])
        from benchlib import RawAgent  # noqa: E402
        from proxy_agent.protocol.messages import CommandId, EventId  # noqa: E402

        agent = RawAgent(["--scheduler", "slurm"], env=env)
        try:
            agent.handshake()
            agent.send(CommandId.START_EVENTS)
            fence = agent.send(CommandId.LIST_FILTERS)
            agent.wait_for(lambda f: f.tid == fence and f.msg_id == EventId.OK)
            time.sleep(6)  # let the first polls settle
            cpu0, all0, t0 = agent.cpu_seconds(), agent.cpu_seconds(children=True), time.perf_counter()
            time.sleep(seconds)
            cpu1, all1, t1 = agent.cpu_seconds(), agent.cpu_seconds(children=True), time.perf_counter()
            share = (cpu1 - cpu0) / (t1 - t0) * 100
            with_children = (all1 - all0) / (t1 - t0) * 100
            print(f"idle CPU on the real SLURM, {jobs} jobs queued, default 5 s poll interval:")
            print(f"  agent {cpu1 - cpu0:.2f} CPU s over {t1 - t0:.0f} s = {share:.2f}% of one core (target < 2%);"
                  f" with the squeue/sinfo it ran: {with_children:.2f}%")
        finally:
            agent.close()
    finally:
        for start in range(0, len(ids), 500):
            subprocess.run(["scancel", *ids[start:start + 500]], env=env, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
