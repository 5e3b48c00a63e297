#!/usr/bin/env python3
"""Agent start-up: from spawning ``proxy-agent --stdio`` to the OK for INIT, next to its floor.

Floor, measured in the same run (runs interleaved): spawning a Python that imports trio and
attrs and exits.  Both with the bytecode cache, and without one (every module compiled from
source: an empty ``PYTHONPYCACHEPREFIX`` and ``PYTHONDONTWRITEBYTECODE``).  Also the OK for
INIT of an agent whose scheduler has a big model to build (``--scheduler sim --sim-jobs
1000000``): INIT must not wait for it.

Target: median <= 1.2x the floor, with and without the cache.
Usage: scripts/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Dict, Tuple

from benchlib import ROOT, RawAgent, median
from proxy_agent.protocol.messages import CommandId


def _env(cached: bool, scratch: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # "with the cache": written by the warm-up run
    env.pop("PYTHONPYCACHEPREFIX", None)
    if not cached:
        prefix = tempfile.mkdtemp(prefix="pycache-", dir=scratch)  # empty: nothing cached
        env["PYTHONPYCACHEPREFIX"] = prefix
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def floor_once(env: Dict[str, str]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds) of a Python that imports trio and attrs."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import trio, attrs"], env=env, cwd=ROOT, check=True)
    return time.perf_counter() - t0, _children_cpu() - cpu0


def agent_once(env: Dict[str, str], args=()) -> Tuple[float, float]:
    """(wall seconds, the agent's CPU seconds) from spawning the agent to its OK for INIT."""
    agent = RawAgent(list(args), env=env)
    try:
        agent.complete(agent.send(CommandId.INIT, "version=2.0", "baseId=100"))
        wall = time.perf_counter() - agent.started
        with open(f"/proc/{agent.proc.pid}/schedstat") as stat:
            cpu = int(stat.read().split()[0]) / 1e9
        return wall, cpu
    finally:
        agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        floor_once(_env(True, scratch))  # warm-up: the cache is written
        agent_once(_env(True, scratch))
        for cached in (True, False):
            floors, agents = [], []
            for _ in range(args.runs):
                floors.append(floor_once(_env(cached, scratch)))
                agents.append(agent_once(_env(cached, scratch)))
            label = "with the bytecode cache" if cached else "without a bytecode cache"
            f, a = median([w for w, _ in floors]), median([w for w, _ in agents])
            fc, ac = median([c for _, c in floors]), median([c for _, c in agents])
            print(f"start-up {label}, {args.runs} runs: spawn -> OK for INIT median {a * 1000:.1f} ms,"
                  f" floor (import trio, attrs) {f * 1000:.1f} ms: x{a / f:.2f} (target <= 1.2);"
                  f" CPU {ac * 1000:.1f} ms against {fc * 1000:.1f} ms: x{ac / fc:.2f}")
        runs = max(3, args.runs // 3)
        times = [agent_once(_env(True, scratch), ["--scheduler", "sim", "--sim-nodes", "10000",
                                                  "--sim-jobs", "1000000"]) for _ in range(runs)]
        print(f"  with --scheduler sim --sim-jobs 1000000: OK for INIT after {median([w for w, _ in times]) * 1000:.1f} ms"
              f" (median of {runs})")


if __name__ == "__main__":
    main()
