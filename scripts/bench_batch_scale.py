#!/usr/bin/env python3
"""An agent following a SLURM queue of 10,000 held jobs: how soon it has them, what it costs
idle, and how soon a job's end reaches its client.

    .venv/bin/python scripts/bench_batch_scale.py [--jobs 10000] [--interval 5] [--window 60]
                                                  [--ends 5] [--job-seconds 15] [--max-job-count N]

1. Submits ``--jobs`` held jobs (``sbatch --hold``, named ``pa-bench-scale-N``) to the
   cluster of scripts/slurm-up.  SLURM keeps at most ``MaxJobCount`` jobs (10,000 by
   default, other users' included): ``--max-job-count N`` raises it for the run (it edits the
   cluster's slurm.conf and restarts slurmctld, and puts both back at the end; running jobs
   survive a restart of the controller).
2. Starts an agent (``--scheduler slurm``, with ``--slurm-poll-interval INTERVAL`` if given:
   without it the agent's default applies, 5 s and idle polls of a long listing spaced to
   take at most 0.8 % of a core) with a client subscribed to its events, and times how long
   after its start the client has every job.
3. Measures, over ``--window`` seconds, the CPU time of the agent process and of the
   commands it ran (squeue and the like), from /proc, each as % of one core, and counts the
   polls (the ``squeue`` children seen); then submits another 10 % held jobs at once and
   times how long after the last one the client has them too, against the poll interval.
4. Submits ``--ends`` jobs through the agent, one after the other, each running
   ``--job-seconds`` (past the quick polls that follow a submission); each writes the time it
   ends as its last act; the latency is from then to the client seeing the job
   COMPLETED.  Prints the median, and the median over the poll interval.

Every job it submitted is cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trio  # noqa: E402

from bench_batch_idle import cpu_seconds, delete_slurm  # noqa: E402
from proxy_agent.client import AgentClient  # noqa: E402


def squeue_children(pid: int) -> set:
    """The pids of the agent's children running squeue now."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read()
        except OSError:
            continue
        name = fields[fields.index("(") + 1:fields.rindex(")")]
        if name == "squeue" and int(fields[fields.rindex(")") + 2:].split()[1]) == pid:
            found.add(int(entry))
    return found


def submit_held(count: int, env: dict, first: int = 0, workers: int = 4) -> list:
    script = "#!/bin/sh\ntrue\n"

    def one(n: int) -> str:
        argv = ["sbatch", "--parsable", "--hold", f"--job-name=pa-bench-scale-{n}", "--output=/dev/null"]
        out = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=120, check=True, env=env)
        return out.stdout.strip().split(";")[0]

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(first, first + count)))


def slurm_config(env: dict) -> dict:
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60, env=env)
    pairs = (line.split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line)
    return {key.strip(): value.strip() for key, value in pairs}


def restart_controller(conf: str, env: dict) -> None:
    pidfile = slurm_config(env)["SlurmctldPidFile"].strip()
    with open(pidfile) as f:
        pid = int(f.read().strip())
    os.kill(pid, 15)
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    subprocess.run(["slurmctld", "-f", conf, "-i"], check=True, env=env, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if subprocess.run(["scontrol", "ping"], capture_output=True, env=env, timeout=30).returncode == 0:
            return
        time.sleep(0.2)
    raise SystemExit("slurmctld did not answer after its restart")


def set_max_job_count(conf: str, value: str, env: dict) -> str:
    """Set MaxJobCount in slurm.conf and restart the controller; the old text, to restore."""
    with open(conf) as f:
        old = f.read()
    lines = [line for line in old.splitlines() if not re.match(r"\s*MaxJobCount\s*=", line, re.IGNORECASE)]
    with open(conf, "w") as f:
        f.write("\n".join(lines + [f"MaxJobCount={value}"]) + "\n")
    try:
        restart_controller(conf, env)
    except BaseException:
        with open(conf, "w") as f:
            f.write(old)
        raise
    return old


async def measure(args, env: dict, cwd: str, ids: list) -> None:
    interval = args.interval or 5.0
    argv = [sys.executable, "-m", "proxy_agent", "--scheduler", "slurm",
            *(("--slurm-poll-interval", str(args.interval)) if args.interval else ())]
    async with await AgentClient.spawn(argv, env=env, cwd=cwd) as client:
        started = time.perf_counter()
        await client.init()
        await client.model_def()
        await client.start_events()

        def mine() -> int:
            wanted = set(ids)
            return sum(1 for j in client.jobs.values() if j.get("nativeId") in wanted)

        await client.wait_for(lambda: mine() >= len(ids), 600, description=f"{len(ids)} jobs")
        took = time.perf_counter() - started
        print(f"the client had all {len(ids)} jobs {took:.1f} s after the agent started "
              f"(poll interval {interval:g} s; start-up included)")

        await trio.sleep(2 * interval)  # past the first polls
        pid = client.process.pid
        own0, children0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        polls = set()
        while time.perf_counter() - t0 < args.window:
            polls.update(squeue_children(pid))
            await trio.sleep(0.02)
        own1, children1 = cpu_seconds(pid)
        elapsed = time.perf_counter() - t0
        own, children = (own1 - own0) / elapsed * 100, (children1 - children0) / elapsed * 100
        every = elapsed / len(polls) if polls else float("inf")
        print(f"idle, {len(ids)} held jobs, {elapsed:.0f} s window: {len(polls)} polls (one every {every:.1f} s)")
        print(f"  agent process {own:.2f} % of a core, its commands {children:.2f} %, together {own + children:.2f} %")
        interval = every if polls else interval

        more = max(1, len(ids) // 10)
        burst = await trio.to_thread.run_sync(submit_held, more, env, len(ids))
        ids.extend(burst)
        submitted = time.perf_counter()
        await client.wait_for(lambda: mine() >= len(ids), 600, description=f"{len(ids)} jobs")
        lag = time.perf_counter() - submitted
        print(f"{more} more held jobs: the client had them {lag:.2f} s after the last was submitted "
              f"({lag / interval:.2f} poll intervals)")

        latencies = []
        for n in range(args.ends):
            stamp = os.path.join(cwd, f"end-{n}")
            job = await client.submit("/bin/sh", ["-c", f"sleep {args.job_seconds}; date +%s.%N > {stamp}"],
                                      name=f"pa-bench-scale-end-{n}")
            native = client.job(job).get("nativeId")
            if native:
                ids.append(native)
            await client.wait_job_state(job, "COMPLETED", timeout=300)
            seen = time.time()
            with open(stamp) as f:
                ended = float(f.read().strip())
            latencies.append(seen - ended)
        median = statistics.median(latencies)
        print(f"a job's end reached the client after {median:.2f} s (median of {len(latencies)}: "
              + ", ".join(f"{x:.2f}" for x in latencies) + f"), {median / interval:.2f} poll intervals")
        await client.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=None,
                        help="--slurm-poll-interval for the agent (default: none, the agent's own default)")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--ends", type=int, default=5)
    parser.add_argument("--job-seconds", type=float, default=15.0,
                        help="how long each of those jobs runs: longer than the agent's quick polls after a "
                             "submission (ten seconds), so that its end is seen by an idle poll")
    parser.add_argument("--max-job-count", default=None, metavar="N",
                        help="raise SLURM's MaxJobCount to N for the run (restarts slurmctld, twice)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="pa-bench-scale-")
    env = dict(os.environ, PYTHONPATH=ROOT, XDG_STATE_HOME=os.path.join(home, "state"))
    if "SLURM_CONF" not in env:
        env["SLURM_CONF"] = os.path.join(os.environ.get("PROXY_AGENT_SLURM_DIR", "/tmp/proxy-agent-slurm"),
                                         "slurm.conf")
    conf = env["SLURM_CONF"]
    old_conf = None
    ids: list = []
    try:
        if args.max_job_count:
            old_conf = set_max_job_count(conf, args.max_job_count, env)
            print(f"MaxJobCount is now {slurm_config(env).get('MaxJobCount')}")
        start = time.perf_counter()
        ids = submit_held(args.jobs, env)
        print(f"submitted {len(ids)} held jobs in {time.perf_counter() - start:.1f} s")
        trio.run(measure, args, env, home, ids)
    finally:
        delete_slurm(ids, env)
        if old_conf is not None:
            with open(conf, "w") as f:
                f.write(old_conf)
            restart_controller(conf, env)
            print(f"MaxJobCount is back to {slurm_config(env).get('MaxJobCount')}")


if __name__ == "__main__":
    main()
