"""Bad option values stop the agent with one clear line and exit status 2, whichever backend
they belong to (selected or not); --help shows the real defaults and nothing for options
without one."""

from __future__ import annotations

import subprocess

import pytest

from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled


def agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(agent_argv(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=subprocess_env(), timeout=scaled(30))


@pytest.mark.parametrize(
    "args, named",
    [
        (["--log-file", "/nonexistent/dir/agent.log"], "/nonexistent/dir/agent.log"),
        (["--sim-nodes", "-1"], "--sim-nodes"),
        (["--scheduler", "sim", "--sim-nodes", "-1"], "--sim-nodes"),
        (["--poll-interval", "0"], "--slurm-poll-interval"),
        (["--slurm-poll-interval", "abc"], "--slurm-poll-interval"),
        (["--sim-time-scale", "0"], "--sim-time-scale"),
        (["--sim-churn", "-1"], "--sim-churn"),
        (["--sim-process-share", "2"], "--sim-process-share"),
        (["--local-kill-grace", "-1"], "--local-kill-grace"),
        (["--auth-timeout", "0"], "--auth-timeout"),
        (["--scheduler", "bogus"], "bogus"),
        (["--proxy", "tcp"], "--host"),
        (["--proxy", "tcp", "--host", "127.0.0.1", "--port", "99999"], "99999"),
        (["--listen", "70000"], "70000"),
        (["--broker", "Bogus"], "Bogus"),
        (["--broker-config", "/nonexistent/benchmarks.ini"], "/nonexistent/benchmarks.ini"),
        (["--no-such-option"], "--no-such-option"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_bad_option_value_is_one_line_and_status_2(args, named):
    run = agent(*args)
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("proxy-agent: ") and named in lines[0]
    assert run.stdout == ""


def test_help_shows_defaults_only_where_there_is_one():
    text = " ".join(agent("--help").stdout.split())
    assert "(default: 16)" in text  # --sim-nodes
    assert "(default: 5.0)" in text  # --slurm-poll-interval
    assert "(default: local)" in text  # --scheduler
    assert "(default: None)" not in text and "(default: False)" not in text
