#!/usr/bin/env python3
"""Median time to parse a synthetic squeue listing into SlurmJob records.

    .venv/bin/python scripts/bench_slurm_parse.py [--jobs 100000] [--runs 5]

Measures ``parse_squeue_text`` (the fixed text format of ``squeue_argv()``) and
``parse_squeue_json`` for the 22.05 (plain numbers) and 23.11 (number objects) JSON layouts.
Listings come from tests/data/slurm/make_large.py, so they match what the tests check.
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

from proxy_agent.schedulers.slurm_parse import parse_squeue_json, parse_squeue_text  # noqa: E402


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
