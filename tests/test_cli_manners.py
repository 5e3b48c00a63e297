"""Every command-line program behaves as a shell user expects: it ends quietly when its
reader goes away (``proxy-agent jobs | head``), an agent started at a terminal says what it is
instead of waiting silently, and a failed connection names its reason."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from agent_fixtures import ROOT, agent_argv, console_argv, subprocess_env
from proxy_agent.cli import BROKEN_PIPE_STATUS
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.store import JobStore
from wait_support import scaled


def _with_closed_stdout(argv, env=None, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` with its stdout a pipe whose reader has already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, input=stdin, timeout=timeout,
                              env=env or subprocess_env(), cwd=str(ROOT))
    finally:
        os.close(write_end)


def _store_with_jobs(state_dir, count: int) -> None:
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    store = JobStore(os.path.join(state_dir, JobStore.FILE))
    for key in range(1, count + 1):
        store.note_submission(key, "local", "local:default", JobSpec(executable="/bin/true", name=f"job{key}"))
    store.write_submissions()
    store.close()


def _quiet_end(result: subprocess.CompletedProcess, statuses=(BROKEN_PIPE_STATUS,)) -> None:
    """No traceback, and the status of a program that ended because its reader went away
    (or, in ``statuses``, of one that finished what it was asked and wrote nowhere)."""
    assert result.returncode in statuses, (result.returncode, result.stderr.decode(errors="replace"))
    assert b"Traceback" not in result.stderr and b"BrokenPipe" not in result.stderr, result.stderr.decode()


def test_the_job_list_ends_quietly_in_a_closed_pipe(tmp_path):
    state = str(tmp_path / "state")
    _store_with_jobs(state, 3000)
    _quiet_end(_with_closed_stdout(agent_argv("jobs", "--state-dir", state)))
    _quiet_end(_with_closed_stdout(agent_argv("jobs", "--state-dir", state, "--json")))


def test_the_console_ends_quietly_in_a_closed_pipe(tmp_path):
    script = "; ".join(["help"] * 20)
    result = _with_closed_stdout(console_argv("-q", "-c", script, "--spawn", *agent_argv("--scheduler", "sim")))
    _quiet_end(result, (0, BROKEN_PIPE_STATUS))


def test_the_runtime_ends_quietly_in_a_closed_pipe():
    env = subprocess_env(PROXY_AGENT_RUNTIME="unix:///nowhere/runtime.sock", PROXY_AGENT_RUNTIME_SECRET="00",
                         PROXY_AGENT_MULTIJOB="mj-000000000000", PROXY_AGENT_PART="0", PROXY_AGENT_PART_SIZE="1")
    _quiet_end(_with_closed_stdout([sys.executable, "-m", "proxy_agent.runtime", "rank"], env=env),
               (0, BROKEN_PIPE_STATUS))


def test_the_invoke_server_ends_quietly_in_a_closed_pipe(tmp_path):
    log = tmp_path / "invoke.log"
    result = _with_closed_stdout([sys.executable, "-m", "proxy_agent.frontends.invoke", "-l", str(log),
                                  "--state-dir", str(tmp_path / "state")],
                                 stdin=b"QUERY_FEATURES\r\nEXIT\r\n")
    assert b"Traceback" not in result.stderr and b"BrokenPipe" not in result.stderr, result.stderr.decode()
    assert "Traceback" not in log.read_text()


# --------------------------------------------------------------------------- a terminal


def _run_on_a_terminal(argv, seconds: float = 30.0):
    """Start ``argv`` with stdin, stdout and stderr on a new pseudo-terminal; returns (exit
    status or None if it still runs after ``seconds``, everything it wrote)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=subprocess_env(),
                               cwd=str(ROOT), close_fds=True)
    os.close(terminal)
    written = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and process.poll() is None:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    written += os.read(controller, 4096)
                except OSError:
                    break
        try:  # the terminal closes as the program ends: its status comes a moment later
            status = process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = None
        try:
            while select.select([controller], [], [], 0.1)[0]:
                chunk = os.read(controller, 4096)
                if not chunk:
                    break
                written += chunk
        except OSError:
            pass
        return status, written.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)


def test_an_agent_typed_at_a_terminal_says_what_it_is_and_points_to_the_console():
    status, text = _run_on_a_terminal(agent_argv())
    assert status == 2, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "proxy-console" in lines[0] and "terminal" in lines[0]


# --------------------------------------------------------------------------- connections


def test_a_failed_connect_back_names_its_reason():
    result = subprocess.run(agent_argv("--connect", "127.0.0.1:1"), capture_output=True, text=True, timeout=scaled(30),
                            env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line
    assert "cannot connect to 127.0.0.1:1" in line and "refused" in line.lower(), line


@pytest.mark.parametrize("address", ["127.0.0.1:1"])
def test_the_console_names_the_reason_of_a_failed_connection(address):
    result = subprocess.run(console_argv("--connect", address, "-c", "jobs"), capture_output=True, text=True,
                            timeout=scaled(30), env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 3
    assert "refused" in result.stderr.lower(), result.stderr
