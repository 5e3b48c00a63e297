#!/usr/bin/env python3
"""Grid Engine figures on the cell of scripts/sge-up: what the daemons cost at rest, and what
one status poll costs with many queued jobs.

    .venv/bin/python scripts/bench_sge.py [--jobs 1000] [--window 60] [--polls 10]

1. Idle cost of the daemons: CPU seconds of sge_qmaster and sge_execd (from /proc, by the
   pids in their pid files) over ``--window`` seconds, with no jobs, and their resident size.
2. The same with ``--jobs`` held jobs in the queue (submitted here with qsub -h, one each).
3. One status poll with those jobs queued: wall time and CPU time of the qstat process
   (``sge.status_argv(all_users=True)``, and for comparison the same without ``-r``), the
   size of its answer, and the time ``sge_parse.parse_jobs`` takes to read it (medians of
   ``--polls``).

Every job it submits is deleted at the end.  Needs root (the cell's pid files) and an idle
cell: jobs of others would be counted in the poll.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from proxy_agent.schedulers.batch.sge import directives as sge_script, parse as sge_parse, system as sge  # noqa: E402
from proxy_agent.service.jobs import JobSpec  # noqa: E402

PIDFILES = {
    "sge_qmaster": "/var/spool/gridengine/qmaster/qmaster.pid",
    "sge_execd": "/var/run/gridengine/execd.pid",
}


def daemon_pids() -> dict:
    pids = {}
    for name, path in PIDFILES.items():
        with open(path) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != name:
                raise SystemExit(f"{path} names pid {pid}, which is not {name}; is the cell up?")
        pids[name] = pid
    return pids


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after "pid (comm)" they are 12 and 13.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure_daemons(window: float, label: str) -> None:
    pids = daemon_pids()
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(window)
    for name, pid in pids.items():
        used = cpu_seconds(pid) - before[name]
        print(f"{label}: {name}: {100 * used / window:.3f} % of a core over {window:.0f} s, "
              f"RSS {rss_mb(pid):.1f} MB")


def poll(argv, polls: int, expected: int) -> None:
    walls, cpus, parses = [], [], []
    size = 0
    for _ in range(polls):
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, timeout=60, check=True).stdout
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime)
        size = len(out)
        start = time.perf_counter()
        jobs = sge_parse.parse_jobs(out)
        parses.append(time.perf_counter() - start)
        if len(jobs) < expected:
            raise SystemExit(f"the listing has {len(jobs)} jobs, expected at least {expected}")
    print(f"poll with {expected} queued jobs: {' '.join(argv)}: {size / 1024:.0f} KiB, "
          f"qstat wall {1000 * statistics.median(walls):.0f} ms, qstat CPU {1000 * statistics.median(cpus):.0f} ms, "
          f"parse {1000 * statistics.median(parses):.1f} ms (medians of {polls})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--polls", type=int, default=10)
    args = parser.parse_args()
    measure_daemons(args.window, "idle, no jobs")
    spec = JobSpec("/bin/true", name="bench", hold=True, stdout_path="/dev/null", stderr_path="/dev/null")
    argv, script = sge_script.submit_argv(spec), sge_script.render_script(spec)
    numbers = []
    try:
        start = time.perf_counter()
        for _ in range(args.jobs):
            out = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60, check=True)
            numbers.append(sge_parse.parse_qsub_terse(out.stdout)[0])
        print(f"submitted {args.jobs} held jobs in {time.perf_counter() - start:.1f} s")
        time.sleep(2)
        measure_daemons(args.window, f"idle, {args.jobs} held jobs")
        poll(sge.status_argv(all_users=True), args.polls, args.jobs)
        # Without -r: smaller, but pending jobs lose their requested queue and wall time.
        poll(["qstat", "-xml", "-u", "*"], args.polls, args.jobs)
    finally:
        for i in range(0, len(numbers), 200):
            subprocess.run(["qdel", *numbers[i:i + 200]], capture_output=True, timeout=120)


if __name__ == "__main__":
    main()
