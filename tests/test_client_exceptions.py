"""Each exception the client documents is the one raised, with the types its documentation
promises (``proxy_agent.client.errors``, ``proxy_agent.client.sync``), against the real agent
or a real program standing in for a misbehaving one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import trio

from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.client import (
    AgentExited,
    ClientError,
    CommandFailed,
    ConnectError,
    ConnectionClosed,
    ProtocolViolationError,
    TokenRefused,
    UnknownElementError,
    WaitFailed,
    WaitTimeout,
)
from proxy_agent.client.sync import Agent
from wait_support import scaled


def spawn(*args: str) -> Agent:
    return Agent.spawn(agent_argv(*args), env=subprocess_env())


def test_every_client_error_is_a_client_error():
    for cls in (AgentExited, CommandFailed, ConnectError, ConnectionClosed, ProtocolViolationError, TokenRefused,
                UnknownElementError, WaitFailed, WaitTimeout):
        assert issubclass(cls, ClientError)


def test_a_wait_that_runs_out_is_a_timeout_error_as_python_and_trio_know_it():
    with spawn() as agent:
        job = agent.submit("/bin/sleep", ["60"])
        for caught_as in (WaitTimeout, TimeoutError, trio.TooSlowError):
            with pytest.raises(caught_as) as caught:
                job.wait(timeout=scaled(0.2))
            assert "timed out after 0.2 s" in str(caught.value)
        job.cancel()


def test_a_wait_for_a_state_the_job_can_no_longer_reach_fails():
    with spawn() as agent:
        job = agent.submit("/bin/true")
        with pytest.raises(WaitFailed, match="completed without reaching SUSPENDED"):
            job.wait(timeout=scaled(30), state="SUSPENDED")


def test_a_refused_command_is_command_failed_with_the_agents_code():
    with spawn() as agent:
        with pytest.raises(CommandFailed) as caught:
            agent.submit("/bin/true", queue="no-such-queue")
        assert caught.value.code == 15 and "no queue named" in caught.value.message


def test_an_unknown_job_is_a_lookup_error():
    with spawn() as agent:
        with pytest.raises(UnknownElementError):
            agent.job("no-such-job")
        with pytest.raises(LookupError):
            agent.job("no-such-job")


def test_an_agent_that_cannot_be_started_is_a_connect_error():
    with pytest.raises(ConnectError, match="cannot start the agent '/nonexistent/agent'"):
        Agent.spawn(["/nonexistent/agent"])


def test_an_agent_that_exits_before_the_session_starts_is_a_connect_error():
    with pytest.raises(ConnectError, match="exited with status 2") as caught:
        Agent.spawn(agent_argv("--scheduler", "nonsense"), env=subprocess_env())
    assert "unknown scheduler 'nonsense'" in str(caught.value)
    assert isinstance(caught.value.__cause__, AgentExited)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client on this machine")
def test_an_unreachable_ssh_host_is_a_connect_error_saying_why():
    with pytest.raises(ConnectError) as caught:
        Agent.ssh("127.0.0.1", port=1, ssh_options=["StrictHostKeyChecking=no", "ConnectTimeout=10"])
    message = str(caught.value)
    assert message.startswith("ssh to 127.0.0.1 failed:") and "refused" in message.lower(), message


def test_a_wrong_token_is_token_refused(tmp_path):
    env = subprocess_env(PROXY_AGENT_TOKEN="the-right-one")
    agent = subprocess.Popen(agent_argv("--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                             text=True)
    try:
        line = agent.stderr.readline()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))
        with pytest.raises(TokenRefused, match="wrong token") as caught:
            Agent.connect_tcp("127.0.0.1", port, token="a-wrong-one")
        assert isinstance(caught.value, CommandFailed) and caught.value.code == 7
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        agent.stderr.close()


def test_an_agent_that_breaks_the_protocol_is_a_protocol_violation():
    # An OK for a command never sent (TID 0x4D), then silence.
    impostor = [sys.executable, "-c",
                "import os, sys, time; os.write(1, b'00000017 0000:0000004D:00000000'); time.sleep(30)"]
    with pytest.raises(ProtocolViolationError) as caught:
        Agent.spawn(impostor)
    assert "TID" in str(caught.value)


def test_an_agent_that_goes_away_is_connection_closed_saying_how():
    with spawn() as agent:
        job = agent.submit("/bin/sleep", ["60"])
        os.kill(agent._client_now().process.pid, signal.SIGKILL)
        with pytest.raises(ConnectionClosed) as caught:
            job.wait(timeout=scaled(20))
        assert isinstance(caught.value, AgentExited) and "SIGKILL" in str(caught.value)
    with pytest.raises(ConnectError, match="closed"):
        job.state
