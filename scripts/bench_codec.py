#!/usr/bin/env python3
"""Throughput of the protocol codec, and cost of range sets at a million ids.

Measured in this process, on one core (the codec is single-threaded):

* encode and decode rate, in messages per second, for
  - a small command: SUBMIT_JOB with 3 attributes,
  - a small event: ERROR (3 arguments),
  - NEW_NODE carrying 1,000 nodes as 1,000 groups (each node its own name),
  - NEW_NODE carrying 1,000 nodes as one range with shared attributes;
  each through the raw framing layer (encode_frame / Decoder) and through the
  typed layer (Command / Event .encode(), Decoder + Command.from_frame /
  decode_event).  Decoding is fed 64 KiB chunks, as a socket read would.
* RangeSet: format and parse of a 1,000,000-id set (one range, and 1,000
  blocks of 1,000), and from_ids of 1,000,000 sorted ids.

Every figure is the median of --runs runs (default 5).

Targets: >= 200,000 small messages/s each way through the raw layer; the
range-set operations on 1,000,000 ids under 50 ms.  The exit status is 1 when
a target is missed.

Usage: scripts/bench_codec.py [--runs N] [--quick]
"""

from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VENV_PYTHON = os.path.join(_ROOT, ".venv", "bin", "python")

try:
    import attrs  # noqa: F401  (the project's one hard dependency besides trio)
except ImportError:  # started with a system python: use the project's venv instead
    if os.path.exists(_VENV_PYTHON) and os.path.realpath(sys.executable) != os.path.realpath(_VENV_PYTHON):
        os.execv(_VENV_PYTHON, [_VENV_PYTHON, *sys.argv])
    raise

sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable, List, Tuple  # noqa: E402

from proxy_agent.protocol.messages import (  # noqa: E402
    Command,
    CommandId,
    ElementGroup,
    ElementKind,
    Error,
    ErrorCode,
    NewElements,
    decode_event,
)
from proxy_agent.protocol.rangeset import RangeSet  # noqa: E402
from proxy_agent.protocol.wire import Decoder, Frame, encode_frame  # noqa: E402

SMALL_TARGET = 200_000  # messages/s, each way, raw layer
RANGE_TARGET_MS = 50.0
CHUNK = 64 * 1024


def median_seconds(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up: first-touch allocations and caches are not what we measure
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def chunks_of(stream: bytes) -> List[bytes]:
    return [stream[i:i + CHUNK] for i in range(0, len(stream), CHUNK)]


def decode_raw(chunks: List[bytes], expected: int) -> None:
    decoder = Decoder()
    count = 0
    for chunk in chunks:
        decoder.feed(chunk)
        for item in decoder:
            count += 1
    if count != expected or decoder.failed is not None:
        raise SystemExit(f"decoder produced {count} items, expected {expected} frames")


def decode_typed(chunks: List[bytes], expected: int, interpret: Callable[[Frame], object]) -> None:
    decoder = Decoder()
    count = 0
    for chunk in chunks:
        decoder.feed(chunk)
        for frame in decoder:
            interpret(frame)
            count += 1
    if count != expected:
        raise SystemExit(f"decoder produced {count} frames, expected {expected}")


# --------------------------------------------------------------------------- messages


def message_cases(quick: bool) -> list:
    """(name, how many per run, typed messages, how to interpret a decoded frame)."""
    scale = 10 if quick else 1
    submit = [
        Command(CommandId.SUBMIT_JOB, tid, ("jobSubId=sub-17", "execName=/bin/hostname", "jobNumProcs=4"))
        for tid in range(100_000 // scale)
    ]
    errors = [
        Error(tid, ErrorCode.NO_SUCH_JOB, "no job 12390") for tid in range(100_000 // scale)
    ]
    per_node = NewElements(
        3,
        ElementKind.NODE,
        "101",
        [
            ElementGroup(RangeSet.single(4197 + i), [("name", f"n{i:04d}"), ("nodeState", "UP")])
            for i in range(1000)
        ],
    )
    one_range = NewElements(
        3,
        ElementKind.NODE,
        "101",
        [ElementGroup(RangeSet.from_range(4197, 5196), [("nodeState", "UP"), ("machineState", "UP")])],
    )
    return [
        ("SUBMIT_JOB, 3 attrs", submit, Command.from_frame, True),
        ("ERROR event, 3 args", errors, decode_event, True),
        ("NEW_NODE 1000 groups", [per_node] * (100 // scale), decode_event, False),
        ("NEW_NODE 1 range x1000", [one_range] * (20_000 // scale), decode_event, False),
    ]


def bench_messages(runs: int, quick: bool) -> List[Tuple[str, str, float, float, bool]]:
    rows = []
    for name, messages, interpret, small in message_cases(quick):
        count = len(messages)
        if isinstance(messages[0], Command):
            raw_items = [(int(m.command_id), m.tid, m.args) for m in messages]
        else:
            raw_items = [(int(m.event_id), m.tid, m.to_args()) for m in messages]
        stream = b"".join(encode_frame(*item) for item in raw_items)
        pieces = chunks_of(stream)

        def raw_encode():
            for item in raw_items:
                encode_frame(*item)

        def typed_encode():
            for message in messages:
                message.encode()

        raw_enc = count / median_seconds(raw_encode, runs)
        raw_dec = count / median_seconds(lambda: decode_raw(pieces, count), runs)
        typed_enc = count / median_seconds(typed_encode, runs)
        typed_dec = count / median_seconds(lambda: decode_typed(pieces, count, interpret), runs)
        size = len(stream) // count
        rows.append((f"{name} ({size} B)", "raw", raw_enc, raw_dec, small))
        rows.append((f"{name} ({size} B)", "typed", typed_enc, typed_dec, small))
    return rows


# --------------------------------------------------------------------------- range sets


def bench_range_sets(runs: int) -> List[Tuple[str, float]]:
    contiguous = RangeSet.from_range(1, 1_000_000)
    blocks = RangeSet([(1 + i * 2000, i * 2000 + 1000) for i in range(1000)])
    assert len(contiguous) == len(blocks) == 1_000_000
    contiguous_text, blocks_text = str(contiguous), str(blocks)
    sorted_ids = list(range(1, 1_000_001))
    block_ids = [i for first, last in blocks.intervals for i in range(first, last + 1)]
    shuffled_ids = block_ids[:]
    random.Random(7).shuffle(shuffled_ids)

    def per_op_ms(action: Callable[[], object], repeat: int) -> float:
        def many():
            for _ in range(repeat):
                action()

        return median_seconds(many, runs) / repeat * 1000

    results = [
        ("format, 1 range of 1M ids", per_op_ms(contiguous.__str__, 1000)),
        ("parse, 1 range of 1M ids", per_op_ms(lambda: RangeSet.parse(contiguous_text), 1000)),
        ("format, 1000 blocks of 1000", per_op_ms(blocks.__str__, 20)),
        ("parse, 1000 blocks of 1000", per_op_ms(lambda: RangeSet.parse(blocks_text), 20)),
        ("from_ids, 1M sorted ids, contiguous", per_op_ms(lambda: RangeSet.from_ids(sorted_ids), 1)),
        ("from_ids, 1M sorted ids, 1000 blocks", per_op_ms(lambda: RangeSet.from_ids(block_ids), 1)),
    ]
    assert RangeSet.from_ids(sorted_ids) == contiguous and RangeSet.from_ids(block_ids) == blocks
    assert RangeSet.parse(blocks_text) == blocks
    unsorted = per_op_ms(lambda: RangeSet.from_ids(shuffled_ids), 1)
    return results, unsorted


# --------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per figure; the median is reported")
    parser.add_argument("--quick", action="store_true", help="one tenth of the messages (a smoke test)")
    options = parser.parse_args()

    print(f"python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPUs, "
          f"median of {options.runs} runs\n")
    missed = []

    rows = bench_messages(options.runs, options.quick)
    print(f"{'message':<38} {'layer':<6} {'encode msg/s':>14} {'decode msg/s':>14}  target")
    for name, layer, enc, dec, small in rows:
        verdict = ""
        if small and layer == "raw":
            ok = enc >= SMALL_TARGET and dec >= SMALL_TARGET
            verdict = f">= {SMALL_TARGET:,} each way: {'ok' if ok else 'MISSED'}"
            if not ok:
                missed.append(f"{name} {layer}")
        print(f"{name:<38} {layer:<6} {enc:>14,.0f} {dec:>14,.0f}  {verdict}")
    print("(NEW_NODE rows count events; each event carries 1,000 nodes)")

    ranges, unsorted = bench_range_sets(options.runs)
    print(f"\n{'range set operation':<38} {'ms':>10}  target")
    for name, ms in ranges:
        ok = ms < RANGE_TARGET_MS
        if not ok:
            missed.append(name)
        print(f"{name:<38} {ms:>10.3f}  < {RANGE_TARGET_MS:.0f} ms: {'ok' if ok else 'MISSED'}")
    print(f"{'from_ids, 1M shuffled ids':<38} {unsorted:>10.3f}  (no target: the agent hands ids over sorted)")

    print("\nsummary")
    small = [r for r in rows if r[4] and r[1] == "raw"]
    print(f"  small messages, raw layer: encode >= {min(r[2] for r in small):,.0f} msg/s, "
          f"decode >= {min(r[3] for r in small):,.0f} msg/s (target {SMALL_TARGET:,})")
    typed = [r for r in rows if r[4] and r[1] == "typed"]
    print(f"  small messages, typed layer: encode >= {min(r[2] for r in typed):,.0f} msg/s, "
          f"decode >= {min(r[3] for r in typed):,.0f} msg/s (no target)")
    print(f"  range sets of 1,000,000 ids: slowest {max(ms for _, ms in ranges):.3f} ms "
          f"(target < {RANGE_TARGET_MS:.0f} ms)")
    print("  all targets met" if not missed else "  MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
