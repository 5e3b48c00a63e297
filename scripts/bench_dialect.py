#!/usr/bin/env python3
"""What the default dialect's rules cost on a large initial model.

A model of --jobs jobs (default 100,000) is rendered the way the agent sends
an initial model: NEW_JOB events of 2,000 groups, one group per job with eight
attributes (about 800,000 values).  Measured in this process, on one core:

* encode, native dialect (``encode_frame``): the baseline;
* encode, default dialect (``Dialect.encode_frame``), all text ASCII: the fast
  path, one check of each finished frame;
* the same with 1 job in 100 carrying a non-ASCII name (other users' jobs),
  so that those frames take the escaping path;
* ``Dialect.escape`` called on every value, and ``Dialect.escape_all`` on
  every event's arguments: the per-value and bulk paths for a renderer that
  escapes before framing;
* ``Dialect.integer_text`` on every INTEGER value (one per job);
* ``unescape`` of every argument received, as the project's client does.

Every figure is the best of --runs runs (default 9), timed with the cyclic
garbage collector paused: on a machine shared with other work the best run is
the one that measures the code.  Target: the default dialect's fast path adds
at most 15 % to the native encoding time.  The exit status is 1 when the
target is missed.

Usage: scripts/bench_dialect.py [--jobs N] [--runs N]
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VENV_PYTHON = os.path.join(_ROOT, ".venv", "bin", "python")

try:
    import attrs  # noqa: F401
except ImportError:  # started with a system python: use the project's venv instead
    if os.path.exists(_VENV_PYTHON) and os.path.realpath(sys.executable) != os.path.realpath(_VENV_PYTHON):
        os.execv(_VENV_PYTHON, [_VENV_PYTHON, *sys.argv])
    raise

sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import gc  # noqa: E402
import time  # noqa: E402
from typing import Callable, List, Tuple  # noqa: E402

from proxy_agent.protocol.dialect import DEFAULT, NATIVE, unescape  # noqa: E402
from proxy_agent.protocol.messages import EventId  # noqa: E402
from proxy_agent.protocol.wire import Decoder, encode_frame  # noqa: E402

GROUPS_PER_EVENT = 2000
STATES = ("STARTING", "RUNNING", "COMPLETED")


def model_events(jobs: int, foreign_every: int = 0) -> List[Tuple[int, int, List[str]]]:
    """NEW_JOB events for ``jobs`` jobs; every ``foreign_every``-th job has a non-ASCII name."""
    events = []
    args: List[str] = []
    count = 0
    for n in range(jobs):
        job_id = 1_000_000 + n
        name = f"job-{n}" if not foreign_every or n % foreign_every else f"Überprüfung-{n}"
        attrs_ = [
            f"jobSubId=sub-{n}",
            f"name={name}",
            f"jobState={STATES[n % 3]}",
            f"jobStatus={STATES[n % 3]}",
            f"queueId={1000 + n % 4}",
            f"jobNumProcs={1 + n % 64}",
            f"userId=user{n % 50}",
            f"workingDir=/home/user{n % 50}/run/{n}",
        ]
        args.append(str(job_id))
        args.append(str(len(attrs_)))
        args.extend(attrs_)
        count += 1
        if count == GROUPS_PER_EVENT or n == jobs - 1:
            events.append((int(EventId.NEW_JOB), 3, [str(1000 + n % 4), str(count), *args]))
            args, count = [], 0
    return events


def timed(fn: Callable[[], object], runs: int) -> float:
    times = []
    gc.disable()
    try:
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=9)
    options = parser.parse_args()

    plain = model_events(options.jobs)
    foreign = model_events(options.jobs, foreign_every=100)
    values = [arg for _, _, args in plain for arg in args]
    integers = [str(1 + n % 64) for n in range(options.jobs)] + ["4294967294"] * (options.jobs // 100)

    def encode_native(events=plain) -> None:
        for event_id, tid, args in events:
            encode_frame(event_id, tid, args)

    def encode_default(events=plain) -> None:
        encode = DEFAULT.encode_frame
        for event_id, tid, args in events:
            encode(event_id, tid, args)

    def escape_each() -> None:
        escape = DEFAULT.escape
        for value in values:
            escape(value)

    def escape_bulk() -> None:
        escape_all = DEFAULT.escape_all
        for _, _, args in plain:
            escape_all(args)

    def integer_each() -> None:
        integer_text = DEFAULT.integer_text
        for value in integers:
            integer_text(value)

    default_bytes = b"".join(DEFAULT.encode_frame(e, t, a) for e, t, a in foreign)
    decoder = Decoder(max_frame_size=1 << 30)
    decoder.feed(default_bytes)
    received = [arg for frame in decoder for arg in frame.args]

    def unescape_each() -> None:
        for arg in received:
            unescape(arg)

    figures = [
        ("encode, native", timed(encode_native, options.runs), len(values)),
        ("encode, default, all ASCII", timed(encode_default, options.runs), len(values)),
        ("encode, native, 1 % non-ASCII names", timed(lambda: encode_native(foreign), options.runs), len(values)),
        ("encode, default, 1 % non-ASCII names", timed(lambda: encode_default(foreign), options.runs), len(values)),
        ("escape() per value", timed(escape_each, options.runs), len(values)),
        ("escape_all() per event", timed(escape_bulk, options.runs), len(values)),
        ("integer_text() per INTEGER value", timed(integer_each, options.runs), len(integers)),
        ("client unescape() per argument", timed(unescape_each, options.runs), len(received)),
    ]
    print(f"{options.jobs} jobs, {len(plain)} NEW_JOB events, {len(values)} arguments "
          f"({sum(len(v) for v in values) / 1e6:.1f} MB of text); best of {options.runs} runs")
    for label, seconds, count in figures:
        print(f"  {label:40s} {seconds * 1e3:8.1f} ms  {seconds / count * 1e9:6.0f} ns/value")
    native, default = figures[0][1], figures[1][1]
    overhead = default / native - 1
    print(f"  default-dialect fast path adds {overhead * 100:.1f} % to native encoding (target <= 15 %)")
    assert NATIVE.encode_frame(*plain[0]) == DEFAULT.encode_frame(*plain[0])
    return 0 if overhead <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
