#!/usr/bin/env python3
"""What keeping every job's output costs: the output path of the service's model with and
without the kept output (``service/history.py``), measured in the same run.

* model: 1 MiB blocks of output (``yes``-like lines, as the local backend hands them over)
  through ``ServiceModel.output`` to one subscribed client, with and without the history
  recording them: the difference is what keeping costs, as a write rate;
* small: the same with one short line per block (a job that writes a line now and then);
* floor: the bytes alone appended to a file with ``os.write`` (the least any keeping costs).

Prints medians of ``--runs`` runs (MB/s) and the ratios.  Usage:
``.venv/bin/python scripts/bench_history.py [--megabytes N] [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchlib import median  # noqa: E402
from proxy_agent.service.history import LIMIT, OutputHistory  # noqa: E402
from proxy_agent.service.model import ChangeSink, K, Kind, ServiceModel  # noqa: E402


class _Reader(ChangeSink):
    """A client that takes every line (and does nothing with it)."""

    def __init__(self) -> None:
        self.lines = 0

    def output(self, element, stream, text, offset=None) -> None:
        self.lines += 1


class _Recorder(ChangeSink):
    takes_output = False

    def __init__(self, history: OutputHistory) -> None:
        self.history = history

    def output(self, element, stream, text, offset=None) -> None:
        self.history.record(element.parent, element.rank, stream, text, offset)


def _model(directory: str, keep: bool, jobs: int):
    model = ServiceModel()
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q"})
    processes = []
    for _ in range(jobs):
        job = model.add(Kind.JOB, queue, {K.NAME: "yes"})
        processes.append(model.add(Kind.PROCESS, job, {K.STATE: "RUNNING"}))
    model.subscribe(_Reader())
    history = OutputHistory(directory, limit=1 << 62) if keep else None
    if history is not None:
        model.record_output(_Recorder(history))
    return model, processes, history


def _through_model(block: str, blocks: int, keep: bool, jobs: int = 8) -> float:
    """Seconds to hand ``blocks`` blocks to the model (spread over ``jobs`` jobs)."""
    with tempfile.TemporaryDirectory(prefix="bench-history-") as directory:
        model, processes, history = _model(directory, keep, jobs)
        size = len(block.encode()) + 1
        offsets = [0] * jobs
        start = time.perf_counter()
        for i in range(blocks):
            which = i % jobs
            offsets[which] += size
            model.output(processes[which], "stdout", block, offsets[which])
        if history is not None:
            history.close()
        return time.perf_counter() - start


def _floor(block: str, blocks: int) -> float:
    data = block.encode() + b"\n"
    with tempfile.TemporaryDirectory(prefix="bench-history-") as directory:
        fd = os.open(os.path.join(directory, "out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        start = time.perf_counter()
        for _ in range(blocks):
            os.write(fd, data)
        os.close(fd)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256, help="output per run")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    big = "\n".join(["y"] * (1 << 19))  # 1 MiB of 'y' lines
    small = "one line of a job that writes a line now and then"
    big_blocks = args.megabytes
    small_blocks = args.megabytes * 2000
    results = {name: [] for name in ("model", "kept", "floor", "small model", "small kept")}
    for _ in range(args.runs):
        results["model"].append(_through_model(big, big_blocks, keep=False))
        results["kept"].append(_through_model(big, big_blocks, keep=True))
        results["floor"].append(_floor(big, big_blocks))
        results["small model"].append(_through_model(small, small_blocks, keep=False))
        results["small kept"].append(_through_model(small, small_blocks, keep=True))
    mb = big_blocks * (len(big) + 1) / 1e6
    small_mb = small_blocks * (len(small) + 1) / 1e6
    for name, seconds in results.items():
        amount = small_mb if name.startswith("small") else mb
        print(f"{name:12} median {median(seconds) * 1000:8.1f} ms  {amount / median(seconds):8.1f} MB/s")
    kept_rate = mb / (median(results["kept"]) - median(results["model"]))
    floor_rate = mb / median(results["floor"])
    print(f"1 MiB blocks: the kept output is written at {kept_rate:.0f} MB/s, {kept_rate / floor_rate:.2f}x the "
          f"os.write floor ({floor_rate:.0f} MB/s)")
    per_block = (median(results["small kept"]) - median(results["small model"])) / small_blocks * 1e6
    print(f"one line per block: {per_block:.1f} us more per block, {median(results['small kept']) / median(results['small model']):.2f}x "
          f"the model path alone; the bound per job is {LIMIT >> 20} MiB")


if __name__ == "__main__":
    main()
