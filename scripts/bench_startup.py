#!/usr/bin/env python3
"""Start-up: from spawning a stdio launch to the OK for INIT.

Three ways a launch gets its answer, measured in the same run (runs interleaved):

* **own agent**: the whole agent in the launched process, as every launch was before the
  service of a state directory (``proxy_agent.__main__.run_private``, which a launch still runs
  when its state directory cannot hold a service): the figure to keep to;
* **join**: ``proxy-agent --stdio`` while the state directory's service runs: the launched
  process only passes its client on, and the service answers (target: median <= 1.2x the own agent's);
* **cold**: ``proxy-agent --stdio`` on a state directory no service runs on yet: it starts
  the service (in the background), then passes its client on.

Next to them, the floor of the own agent: spawning a Python that imports trio and attrs and
exits (target for the own agent: median <= 1.2x the floor).  Both with the bytecode cache,
and without one (every module compiled from source: an empty ``PYTHONPYCACHEPREFIX`` and
``PYTHONDONTWRITEBYTECODE``).  Also the OK for INIT of an agent whose scheduler has a big
model to build (``--scheduler sim --sim-jobs 1000000``): INIT must not wait for it.

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
from typing import Dict, Optional, Sequence, Tuple

from benchlib import PRIVATE_AGENT, ROOT, RawAgent, median, stop_service
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


def agent_once(env: Dict[str, str], args: Sequence[str] = (), *, state_home: Optional[str] = None,
               command: Sequence[str] = ("-m", "proxy_agent")) -> Tuple[float, float]:
    """(wall seconds, the launched process's CPU seconds) from spawning it to its OK for INIT."""
    agent = RawAgent(list(args), env=env, state_home=state_home, command=command)
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
        shared = os.path.join(scratch, "shared")  # the state home whose service the joins join
        try:
            floor_once(_env(True, scratch))  # warm-up: the cache is written
            agent_once(_env(True, scratch), command=PRIVATE_AGENT)
            agent_once(_env(True, scratch), state_home=shared)  # starts the shared service
            for cached in (True, False):
                floors, own, joins, colds = [], [], [], []
                for _ in range(args.runs):
                    env = _env(cached, scratch)
                    floors.append(floor_once(env))
                    own.append(agent_once(env, command=PRIVATE_AGENT))
                    joins.append(agent_once(env, state_home=shared))
                    colds.append(agent_once(env))
                label = "with the bytecode cache" if cached else "without a bytecode cache"
                f, a = median([w for w, _ in floors]), median([w for w, _ in own])
                j, c = median([w for w, _ in joins]), median([w for w, _ in colds])
                fc, ac = median([c for _, c in floors]), median([c for _, c in own])
                jc = median([c for _, c in joins])
                print(f"start-up {label}, {args.runs} runs, spawn -> OK for INIT (medians):")
                print(f"  own agent {a * 1000:.1f} ms, floor (import trio, attrs) {f * 1000:.1f} ms: x{a / f:.2f}"
                      f" (target <= 1.2); CPU {ac * 1000:.1f} ms against {fc * 1000:.1f} ms: x{ac / fc:.2f}")
                print(f"  join a running service {j * 1000:.1f} ms: x{j / a:.2f} of the own agent (target <= 1.2);"
                      f" the launched process's CPU {jc * 1000:.1f} ms")
                print(f"  cold (starts the service, then joins) {c * 1000:.1f} ms: x{c / a:.2f} of the own agent")
        finally:
            stop_service(os.path.join(shared, "proxy-agent"))
        runs = max(3, args.runs // 3)
        times = [agent_once(_env(True, scratch), ["--scheduler", "sim", "--sim-nodes", "10000",
                                                  "--sim-jobs", "1000000"], command=PRIVATE_AGENT)
                 for _ in range(runs)]
        print(f"  own agent with --scheduler sim --sim-jobs 1000000: OK for INIT after "
              f"{median([w for w, _ in times]) * 1000:.1f} ms (median of {runs})")


if __name__ == "__main__":
    main()
