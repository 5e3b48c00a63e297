#!/usr/bin/env python3
"""What an idle agent costs with many queued batch jobs: CPU % of one core, between polls.

    .venv/bin/python scripts/bench_batch_idle.py [--system sge|pbs|slurm] [--jobs 1000]
                                                 [--interval SECONDS] [--window 60]

1. Submits ``--jobs`` held jobs (named ``pa-bench-idle``): to the Grid Engine cell of
   scripts/sge-up (``--system sge``, needs root), to the SLURM cluster of scripts/slurm-up
   (``--system slurm``, ``sbatch --hold``, named ``pa-bench-idle-N`` or ``--name-prefix``\ N; SLURM_CONF from the
   environment or the cluster's state directory), or to the fake PBS of tests/fake_pbs
   (``--system pbs``, in a temporary directory).
2. Starts an agent (``--scheduler SYSTEM --SYSTEM-poll-interval INTERVAL``; by default the
   backend's own default: 15 s for Grid Engine and PBS, 5 s for SLURM) with a client
   subscribed to its events, and waits until the client has every job.
3. Measures, over ``--window`` seconds, the CPU time of the agent process and of the
   commands it ran (qstat and the like, reaped children), from /proc.

Prints the figure as ``CPU: X % of a core``.  Every job it submitted is deleted at the end.
"""

from __future__ import annotations

import argparse
import getpass
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import trio  # noqa: E402

from proxy_agent.client import AgentClient  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple:
    """(own, children's) CPU seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / TICKS, (cutime + cstime) / TICKS


def submit_sge(count: int, env: dict) -> list:
    script = "#!/bin/sh\ntrue\n"
    argv = ["qsub", "-terse", "-h", "-N", "pa-bench-idle", "-o", "/dev/null", "-e", "/dev/null", "-S", "/bin/sh"]
    ids = []
    for _ in range(count):
        out = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60, check=True, env=env)
        ids.append(out.stdout.strip())
    return ids


def delete_sge(ids: list, env: dict) -> None:
    for i in range(0, len(ids), 200):
        subprocess.run(["qdel", *ids[i:i + 200]], capture_output=True, timeout=120, env=env)


def submit_slurm(count: int, env: dict, prefix: str = "pa-bench-idle-") -> list:
    script = "#!/bin/sh\ntrue\n"
    ids = []
    for n in range(count):
        argv = ["sbatch", "--parsable", "--hold", f"--job-name={prefix}{n}", "--output=/dev/null"]
        out = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60, check=True, env=env)
        ids.append(out.stdout.strip().split(";")[0])
    return ids


def delete_slurm(ids: list, env: dict) -> None:
    for i in range(0, len(ids), 200):
        subprocess.run(["scancel", *ids[i:i + 200]], capture_output=True, timeout=120, env=env)


def submit_pbs(count: int, env: dict) -> list:
    argv = ["qsub", "-h", "-N", "pa-bench-idle", "-o", "/dev/null", "-e", "/dev/null"]
    ids = []
    for _ in range(count):
        out = subprocess.run(argv, input="true\n", capture_output=True, text=True, timeout=60, check=True, env=env)
        ids.append(out.stdout.strip())
    return ids


async def measure(system: str, interval: float, window: float, jobs: int, env: dict, cwd: str,
                  profile: str = "") -> None:
    python = [sys.executable, "-m", "cProfile", "-o", profile] if profile else [sys.executable]
    argv = [*python, "-m", "proxy_agent", "--scheduler", system, f"--{system}-poll-interval", str(interval)]
    async with await AgentClient.spawn(argv, env=env, cwd=cwd) as client:
        started = time.perf_counter()
        await client.init()
        await client.model_def()
        await client.start_events()
        await client.wait_for(lambda: len(client.jobs) >= jobs, 300, description=f"{jobs} jobs")
        print(f"the client had all {len(client.jobs)} jobs {time.perf_counter() - started:.1f} s after start")
        await trio.sleep(2 * interval)  # past the first polls and the queue and host details
        pid = client.process.pid
        own0, children0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        await trio.sleep(window)
        own1, children1 = cpu_seconds(pid)
        elapsed = time.perf_counter() - t0
        own, children = (own1 - own0) / elapsed * 100, (children1 - children0) / elapsed * 100
        print(f"idle agent, {jobs} queued {system} jobs, poll every {interval:g} s, {elapsed:.0f} s window")
        print(f"  agent process {own:.2f} %, its commands {children:.2f} %")
        print(f"CPU: {own + children:.2f} % of a core")
        await client.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=("sge", "pbs", "slurm"), default="sge")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=None,
                        help="seconds between polls (default: 5 for slurm, 15 otherwise)")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="run the agent under cProfile, its statistics written to FILE at the end "
                             "(the figure then includes the profiler's own cost)")
    parser.add_argument("--name-prefix", default="pa-bench-idle-", help="SLURM job names: PREFIX + number")
    args = parser.parse_args()
    if args.interval is None:
        args.interval = 5.0 if args.system == "slurm" else 15.0
    home = tempfile.mkdtemp(prefix="pa-bench-idle-")
    env = dict(os.environ, PYTHONPATH=ROOT, XDG_STATE_HOME=os.path.join(home, "state"))
    if args.system == "pbs":
        env.update(PATH=f"{os.path.join(ROOT, 'tests', 'fake_pbs', 'bin')}:{env.get('PATH', '/usr/bin:/bin')}",
                   FAKE_PBS_STATE=os.path.join(home, "pbs"), FAKE_PBS_USER=getpass.getuser(), HOME=home)
    elif args.system == "slurm":
        if "SLURM_CONF" not in env:
            env["SLURM_CONF"] = os.path.join(os.environ.get("PROXY_AGENT_SLURM_DIR", "/tmp/proxy-agent-slurm"),
                                             "slurm.conf")
    else:
        env.setdefault("SGE_ROOT", "/var/lib/gridengine")
        env.setdefault("SGE_CELL", "default")
    start = time.perf_counter()
    ids = []
    try:
        if args.system == "slurm":
            ids = submit_slurm(args.jobs, env, args.name_prefix)
        else:
            ids = (submit_pbs if args.system == "pbs" else submit_sge)(args.jobs, env)
        print(f"submitted {len(ids)} held jobs in {time.perf_counter() - start:.1f} s")
        trio.run(measure, args.system, args.interval, args.window, args.jobs, env, home,
                 os.path.abspath(args.profile) if args.profile else "")
    finally:
        if args.system == "sge":
            delete_sge(ids, env)
        elif args.system == "slurm":
            delete_slurm(ids, env)


if __name__ == "__main__":
    main()
