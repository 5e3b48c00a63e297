"""How the tests wait: for a condition, up to a deadline meant for a busy machine.

No test sleeps for a fixed time and then hopes that something has happened: a machine busy
with other work can take longer than any fixed time.  A test waits for the condition itself
(:func:`wait_until`, the client's ``wait_for``, a reply, a process's exit) and gives up only
after a deadline.  Deadlines are written for a loaded two-core machine, and every one of
them is multiplied by one setting, the environment variable::

    PROXY_AGENT_TEST_TIMEOUT_SCALE=3 scripts/test     # a machine three times slower

(default 1).  A deadline only costs time when a test fails, so it is generous: it tells a
hung wait from a slow one.  The functions of the ``*_support`` modules (here, and
``sge_support.run``, ...) take deadlines in plain seconds and scale them; every other
deadline a test writes is written ``scaled(SECONDS)``: in ``trio.fail_after``, a
client's wait (``client.wait_for(..., scaled(30))``), ``subprocess.run(timeout=...)``, an
agent option that bounds a wait, a test helper's default (a helper passes on what it is given).

A wait that must see that something does *not* happen cannot wait for it; it waits for a
later thing that could only come after it (a reply to a command sent afterwards, a job that
the scheduler handles after the one in question).
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any, Callable, Optional

import trio

SCALE_VARIABLE = "PROXY_AGENT_TEST_TIMEOUT_SCALE"


def timeout_scale() -> float:
    """The factor every deadline is multiplied by (PROXY_AGENT_TEST_TIMEOUT_SCALE, default 1)."""
    text = os.environ.get(SCALE_VARIABLE, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{SCALE_VARIABLE} must be a positive number, not {text!r}")
    return value


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on this machine (times PROXY_AGENT_TEST_TIMEOUT_SCALE)."""
    return seconds * timeout_scale()


def scaled_program(text: str) -> str:
    """A program a test writes for a job to run (it cannot import this module), with every
    deadline written in it as ``timeout=N`` or ``--timeout N`` scaled."""
    scale = timeout_scale()
    if scale == 1:
        return text
    return re.sub(r"(\btimeout=|--timeout[ =])(\d+(?:\.\d*)?)\b",
                  lambda m: f"{m.group(1)}{float(m.group(2)) * scale:g}", text)


def _describe(condition: Callable[[], Any], what: Optional[str]) -> str:
    return what or getattr(condition, "__name__", "a condition")


async def wait_until(condition: Callable[[], Any], timeout: float = 30, *, what: Optional[str] = None,
                     interval: float = 0.02) -> Any:
    """Wait until ``condition()`` is true and return its value, checking every ``interval``
    seconds; fail the test if it is not within ``timeout`` (scaled) seconds."""
    deadline = trio.current_time() + scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if trio.current_time() >= deadline:
            raise AssertionError(f"gave up after {scaled(timeout):g} s waiting for {_describe(condition, what)}")
        await trio.sleep(interval)


async def settle(timeout: float = 30) -> None:
    """For code under test that runs in the test's own trio run: wait until every other task
    is blocked, that is, has done all it can with what it was given (up to ``timeout``
    seconds, scaled)."""
    import trio.testing

    with trio.fail_after(scaled(timeout)):
        await trio.testing.wait_all_tasks_blocked()


def wait_until_blocking(condition: Callable[[], Any], timeout: float = 30, *, what: Optional[str] = None,
                        interval: float = 0.05) -> Any:
    """:func:`wait_until` for code outside trio."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {scaled(timeout):g} s waiting for {_describe(condition, what)}")
        time.sleep(interval)
