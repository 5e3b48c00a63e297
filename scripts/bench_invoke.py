#!/usr/bin/env python3
"""Invoke Server figures on the local scheduler: JOB_CREATE -> CREATE_NOTIFY latency and jobs per second.

Each run starts ``python -m proxy_agent.invoke`` over real pipes on a fresh state directory
(the server starts the agent there; one job, not counted, waits for it to be up) and measures:

* latency: JOB_CREATE requests sent one at a time, each waiting for its CREATE_NOTIFY: the
  time from writing the request to reading the notify (median and 90th percentile);
* throughput: a burst of JOB_CREATE requests in one write: CREATE_NOTIFYs per second until
  the last one, and whole jobs per second (request to final STATUS_NOTIFY) for /bin/true.

Figures are medians over the runs.  Usage: scripts/bench_invoke.py [--runs N] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from proxy_agent.frontends.invoke.protocol import encode_job_create  # noqa: E402


def attributes(workdir: str):
    return [
        ("hostname", "localhost"),
        ("port", "0"),
        ("client_name", "localhost"),
        ("executable_path", "/bin/true"),
        ("backend", "NORMAL"),
        ("count", "1"),
        ("staging", "false"),
        ("argument", "--contextID=1"),
        ("work_directory", workdir),
        ("redirect_enable", "false"),
        ("status_polling", "0"),
        ("refresh_credential", "0"),
    ]


def _final(line: str) -> bool:
    words = line.split()
    return words[0] == "STATUS_NOTIFY" and words[2] in ("DONE", "FAILED")


class Lines:
    """CR LF lines from one pipe."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def next(self) -> str:
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buffer[:end]).decode()
                del self.buffer[: end + 2]
                return line
            data = await self.stream.receive_some(1 << 16)
            if not data:
                raise RuntimeError("the server closed a pipe")
            self.buffer += data


def stop_agent(state_dir: str) -> None:
    """End the agent the server started in ``state_dir`` (its keeper leaves when idle)."""
    try:
        with open(os.path.join(state_dir, "agent.lock")) as f:
            pid = json.load(f)["pid"]
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


async def one_run(jobs: int, workdir: str):
    state_dir = tempfile.mkdtemp(prefix="bench-invoke-")
    try:
        return await _measure(jobs, workdir, state_dir)
    finally:
        stop_agent(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


async def _measure(jobs: int, workdir: str, state_dir: str):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "proxy_agent.invoke", "--state-dir", state_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    replies, notifies = Lines(proc.stdout), Lines(proc.stderr)
    attrs = attributes(workdir)
    try:
        # a first job, not counted: the agent is up once it has ended
        await proc.stdin.send_all(encode_job_create(1, attrs))
        if await replies.next() != "S":
            raise RuntimeError("JOB_CREATE refused")
        while not _final(await notifies.next()):
            pass
        # latency, one request at a time
        latencies = []
        rid = 1
        ended = 0
        for _ in range(jobs):
            rid += 1
            request = encode_job_create(rid, attrs)
            start = time.perf_counter()
            await proc.stdin.send_all(request)
            if await replies.next() != "S":
                raise RuntimeError("JOB_CREATE refused")
            while True:
                line = await notifies.next()
                if line.startswith(f"CREATE_NOTIFY {rid} "):
                    break
                ended += _final(line)
            latencies.append(time.perf_counter() - start)
        # wait for the latency jobs to end, so the burst starts from quiet
        while ended < jobs:
            ended += _final(await notifies.next())
        # throughput, one burst
        burst = b"".join(encode_job_create(rid + i, attrs) for i in range(1, jobs + 1))
        start = time.perf_counter()
        await proc.stdin.send_all(burst)
        created = ended = 0
        created_at = None
        while ended < jobs:
            line = await notifies.next()
            if line.startswith("CREATE_NOTIFY"):
                created += 1
                if created == jobs:
                    created_at = time.perf_counter()
            else:
                ended += _final(line)
        done_at = time.perf_counter()
        for _ in range(jobs):
            await replies.next()
        await proc.stdin.send_all(b"EXIT\r\n")
        await replies.next()
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    latencies.sort()
    return {
        "median": statistics.median(latencies),
        "p90": latencies[int(0.9 * (len(latencies) - 1))],
        "creates_per_s": jobs / (created_at - start),
        "jobs_per_s": jobs / (done_at - start),
    }


async def main_async(runs: int, jobs: int) -> None:
    results = []
    for run in range(runs):
        result = await one_run(jobs, "/tmp")
        results.append(result)
        print(
            f"run {run + 1}: latency median {result['median'] * 1000:.2f} ms, p90 {result['p90'] * 1000:.2f} ms; "
            f"burst of {jobs}: {result['creates_per_s']:.0f} CREATE_NOTIFY/s, {result['jobs_per_s']:.0f} jobs/s"
        )

    def med(key):
        return statistics.median(r[key] for r in results)

    print(
        f"invoke server, agent's local scheduler, /bin/true, {runs} runs of {jobs} jobs (medians over runs):\n"
        f"  JOB_CREATE -> CREATE_NOTIFY latency: median {med('median') * 1000:.2f} ms, p90 {med('p90') * 1000:.2f} ms\n"
        f"  burst: {med('creates_per_s'):.0f} CREATE_NOTIFY per second, {med('jobs_per_s'):.0f} whole jobs per second"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    trio.run(main_async, args.runs, args.jobs)


if __name__ == "__main__":
    main()
