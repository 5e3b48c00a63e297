#!/usr/bin/env python3
"""Local launch rate: the same as scripts/bench_launch.py (kept under its earlier name)."""

from bench_launch import main

if __name__ == "__main__":
    main()
