#!/usr/bin/env python3
"""How soon a batch job's end reaches the client, against the poll interval.

    .venv/bin/python scripts/bench_batch_completion.py [--scheduler slurm|sge ...] [--jobs 5]

For each scheduler named (default: those whose commands answer), an agent is started at its
default poll interval and ``--jobs`` jobs are submitted at once, each sleeping a different
time beyond the agent's fast-poll window after a submission (so that what is measured is the
steady poll, not the quick one), then printing the wall-clock time at which it ends. The
latency of a job is the time the client saw its final state less that printed time. The
figures: median and maximum latency, next to the poll interval (the floor is 0; the target is
"within one poll interval").

Needs the clusters of scripts/slurm-up and scripts/sge-up (with their environments:
eval "$(scripts/slurm-env)"; eval "$(scripts/sge-env)"). Jobs are named pa-bench-end-*; any left
are cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from proxy_agent.client import AgentClient  # noqa: E402

#: scheduler: (its poll option, the default interval, the queue, its cancel command)
SCHEDULERS = {
    "slurm": ("--slurm-poll-interval", 5.0, "debug", ["scancel", "--name"]),
    "sge": ("--sge-poll-interval", 15.0, "all.q", ["qdel"]),
}
#: the engine polls quickly for a while after each submission; jobs end after it
FAST_WINDOW = 12.0

JOB = "import sys, time; time.sleep(float(sys.argv[1])); print(repr(time.time()), flush=True)"


def available(name: str) -> bool:
    probe = {"slurm": ["sinfo", "-h"], "sge": ["qstat"]}[name]
    if shutil.which(probe[0]) is None:
        return False
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


async def measure(name: str, jobs: int) -> list:
    option, interval, queue, _ = SCHEDULERS[name]
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT
    env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="bench-completion-")
    argv = [sys.executable, "-m", "proxy_agent", "--scheduler", name, option, str(interval)]
    latencies = []
    async with await AgentClient.spawn(argv, env=env) as client:
        await client.init()
        await client.model_def()
        await client.start_events()
        await client.wait_for(lambda: any(q.name == queue for q in client.queues.values()), 60,
                              description=f"queue {queue}")
        seen = {}

        def note(_traffic) -> None:
            for job_id in pending:
                if job_id not in seen and client.job(job_id).state == "COMPLETED":
                    seen[job_id] = time.time()

        pending = []
        client.add_listener(note)
        for i in range(jobs):
            sleep = FAST_WINDOW + i * interval / max(jobs, 1) * 1.7
            job_id = await client.submit(sys.executable, ["-c", JOB, f"{sleep:.2f}"], queue=queue,
                                         jobName=f"pa-bench-end-{i}")
            pending.append(job_id)
        await client.wait_for(lambda: len(seen) == len(pending), FAST_WINDOW + 3 * interval + 120,
                              description="every job's end")
        for job_id in pending:
            printed = client.job_output(job_id).strip().splitlines()
            if not printed:
                print(f"  job {job_id}: no output", flush=True)
                continue
            latencies.append(seen[job_id] - float(printed[-1]))
        await client.quit()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", action="append", choices=sorted(SCHEDULERS))
    parser.add_argument("--jobs", type=int, default=5)
    args = parser.parse_args()
    names = args.scheduler or [n for n in SCHEDULERS if available(n)]
    if not names:
        print("no batch scheduler answers here (scripts/slurm-up, scripts/sge-up)")
        return 1
    for name in names:
        interval = SCHEDULERS[name][1]
        try:
            latencies = trio.run(measure, name, args.jobs)
        finally:
            cancel = SCHEDULERS[name][3]
            if name == "slurm":
                subprocess.run(cancel + [",".join(f"pa-bench-end-{i}" for i in range(args.jobs))],
                               capture_output=True, timeout=30)
            else:
                for i in range(args.jobs):
                    subprocess.run(cancel + [f"pa-bench-end-{i}"], capture_output=True, timeout=30)
        if not latencies:
            print(f"{name}: no figures")
            continue
        print(f"{name}: poll interval {interval:g} s; end-to-client latency over {len(latencies)} jobs: "
              f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
              f"({max(latencies) / interval:.2f} of the interval); floor 0 s, target within one interval",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
