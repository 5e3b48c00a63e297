"""The agent launched over real ssh, as an IDE launches it, against the sshd of scripts/sshd-up.

The single file is copied to the test users' home directories with scp, then started with
``ssh ... USER@127.0.0.1 ./proxy-agent.pyz --stdio`` (the protocol on ssh's stdin/stdout) or
with a connect-back option (the agent connects to a port the test listens on).  The
``proxyagent-banner`` account's ~/.bashrc prints a banner on stdout, as many sites' do: the
console must name that as the cause.  ``proxy-console --ssh`` and ``proxy-console deploy``
are run the same way.

Marked ``ssh``: run when PROXY_AGENT_TEST_CLUSTERS asks for them (see ``cluster_support``),
with the test accounts to this run alone while the module runs (``accounts_of_our_own``).
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache

import pytest

from agent_fixtures import agent_argv, console_argv, subprocess_env
from proxy_agent.client import AgentClient, AgentProcess, listen_for_agent
from pyz_support import built_pyz
from ssh_support import accounts_of_our_own, require_sshd
from wait_support import scaled

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def sshd():
    settings = require_sshd()
    with accounts_of_our_own(settings):
        yield settings


@pytest.fixture(scope="module")
def remote_pyz(sshd):
    """The single file, copied with scp into both test users' home directories; the services
    its launches start there (in the users' default state directories) are stopped at the end."""
    pyz = str(built_pyz())
    for user in (sshd.user, sshd.banner_user):
        result = subprocess.run(sshd.ide_scp(pyz, user, "proxy-agent.pyz"), capture_output=True, text=True, timeout=scaled(60))
        assert result.returncode == 0, result.stderr
    yield "./proxy-agent.pyz"
    for user in (sshd.user, sshd.banner_user):
        subprocess.run(sshd.ide_ssh(user, "./proxy-agent.pyz stop --end-jobs"), capture_output=True, timeout=scaled(60))


@lru_cache(maxsize=None)
def agent_help() -> str:
    return subprocess.run(agent_argv("--help"), capture_output=True, text=True, env=subprocess_env(), timeout=scaled(30)).stdout


def console(*args: str, timeout: float = scaled(90)) -> subprocess.CompletedProcess:
    return subprocess.run(
        console_argv(*args), capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, env=subprocess_env(),
    )


# --------------------------------------------------------------------------- as an IDE does


async def test_stdio_session_through_ssh(sshd, remote_pyz):
    argv = sshd.ide_ssh(sshd.user, f"{remote_pyz} --stdio")
    async with await AgentClient.spawn(argv) as client:
        await client.init()
        await client.model_def()
        await client.start_events()
        job = await client.submit("/usr/bin/id", ["-un"])
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert client.job_output(job) == f"{sshd.user}\n"  # the job ran as the ssh user
        await client.quit()
    assert client.violations == []
    assert client.process.returncode == 0


async def _connect_back(sshd, remote_pyz, options_for) -> None:
    async with await listen_for_agent("127.0.0.1", 0) as listener:
        command = f"{remote_pyz} " + " ".join(options_for("127.0.0.1", listener.port))
        process = await AgentProcess.start(sshd.ide_ssh(sshd.user, command), stdio=False)
        async with await listener.accept(process=process, timeout=scaled(30)) as client:
            await client.init()
            await client.model_def()
            await client.start_events()
            job = await client.submit("/bin/echo", ["called", "back"])
            await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
            assert client.job_output(job) == "called back\n"
            await client.quit()
        assert client.violations == []


async def test_connect_back_through_ssh_with_connect(sshd, remote_pyz):
    if "--connect" not in agent_help():
        pytest.skip("the agent has no --connect option")
    await _connect_back(sshd, remote_pyz, lambda host, port: [f"--connect={host}:{port}"])


async def test_connect_back_through_ssh_as_an_ide_starts_it(sshd, remote_pyz):
    # The IDE runs PROGRAM --proxy=tcp --host=HOST --port=PORT and listens on PORT.
    await _connect_back(sshd, remote_pyz, lambda host, port: ["--proxy=tcp", f"--host={host}", f"--port={port}"])


# --------------------------------------------------------------------------- a login banner


def test_banner_before_the_first_frame_is_named_by_the_console(sshd, remote_pyz):
    run = console("--ssh", sshd.banner_host, "--ssh-config", sshd.config, "-c", "jobs")
    assert run.returncode == 4, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    # (how much of the banner is quoted depends on how ssh's reads split it)
    assert last.startswith("proxy-console: the agent's output began with text that is not the protocol: "
                           "'Welcome to the proxy-agent test login node.\\n")
    assert "shell start-up file on proxy-agent-test-banner" in last and "~/.bashrc" in last
    assert "Traceback" not in run.stderr


async def test_banner_seen_by_the_client_library_as_a_framing_violation(sshd, remote_pyz):
    from proxy_agent.client import ProtocolViolationError
    from proxy_agent.console.diagnose import garbage_before_first_frame

    async with await AgentClient.spawn(sshd.ide_ssh(sshd.banner_user, f"{remote_pyz} --stdio")) as client:
        with pytest.raises(ProtocolViolationError) as caught:
            await client.init(timeout=scaled(30))
    violation = caught.value.violation
    assert violation.rule == "framing"
    assert violation.raw.startswith(b"Welcome to the proxy-agent test login node.\n")
    assert "shell start-up file" in garbage_before_first_frame(violation.raw)


def test_text_typed_into_the_agent_over_ssh_is_named_by_the_agent(sshd, remote_pyz):
    # Someone (or a wrapper) writes text where the IDE's INIT should be: the agent says what
    # arrived in one ERROR under TID 0 and one log line, and ends the session.
    run = subprocess.run(
        sshd.ide_ssh(sshd.user, f"{remote_pyz} --stdio"), input=b"hello agent, are you there?\n",
        capture_output=True, timeout=scaled(60),
    )
    out, err = run.stdout, run.stderr.decode("utf-8", "replace")
    assert out.startswith(b"0000") and b" 0005:00000000:" in out  # ERROR, TID 0
    assert b"not the protocol: 'hello agent, are you there?" in out
    assert "the input began with text that is not the protocol: 'hello agent, are you there?" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- proxy-console --ssh


def test_console_over_ssh_finds_the_file_in_the_home_directory(sshd, remote_pyz):
    run = console("--ssh", sshd.host, "--ssh-config", sshd.config, "-c", "submit --wait /usr/bin/id -un; jobs")
    assert run.returncode == 0, run.stderr
    assert re.search(rf"\[\d+\.0\] {sshd.user}$", run.stdout, re.M)
    assert f"connected to agent on {sshd.host}" in run.stderr


def test_console_over_ssh_with_a_remote_agent_command(sshd, remote_pyz):
    run = console(
        "--ssh", sshd.host, "--ssh-config", sshd.config,
        "--remote-agent", "~/proxy-agent.pyz --scheduler sim --sim-nodes 3 -v", "-q", "-c", "nodes",
    )
    assert run.returncode == 0, run.stderr
    assert len(re.findall(r"^\d+ +n\d{5} +(UP|DOWN) ", run.stdout, re.M)) == 3
    # the remote agent's own log (-v) comes back through ssh's stderr, marked with the host
    assert re.search(rf"^{sshd.host}\| .*INFO", run.stderr, re.M)


def test_console_over_ssh_says_what_failed(sshd, remote_pyz):
    run = console("--ssh", f"nobody@{sshd.host}", "--ssh-config", sshd.config, "-c", "jobs")
    assert run.returncode == 3
    assert f"proxy-console: ssh to nobody@{sshd.host} failed: " in run.stderr and "Permission denied" in run.stderr
    run = console("--ssh", sshd.host, "--ssh-config", sshd.config, "--remote-agent", "bin/missing.pyz", "-c", "jobs")
    assert run.returncode == 3
    assert f"proxy-console: no agent found on {sshd.host}" in run.stderr
    run = console("--ssh=-oProxyCommand=evil", "-c", "jobs")
    assert run.returncode == 3 and "bad host" in run.stderr


# --------------------------------------------------------------------------- proxy-console deploy


def test_deploy_copies_finds_python_and_gets_an_answer(sshd):
    run = console("deploy", sshd.host, "--ssh-config", sshd.config, "--pyz", str(built_pyz()), "--remote-path", "deployed.pyz")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3, run.stdout
    assert re.fullmatch(rf"copied \S+proxy-agent\.pyz to {sshd.host}:deployed\.pyz \([\d,]+ bytes\)", lines[0])
    assert re.fullmatch(rf"Python found on {sshd.host}: 3\.\d+\.\d+ \(/\S+\)", lines[1])
    assert lines[2] == f"agent answered INIT on {sshd.host}"
    check = subprocess.run(sshd.ide_ssh(sshd.user, "test -x deployed.pyz && echo executable"), capture_output=True, text=True, timeout=scaled(30))
    assert check.stdout == "executable\n"


def test_deploy_to_an_account_with_a_banner_names_the_cause(sshd):
    run = console("deploy", sshd.banner_host, "--ssh-config", sshd.config, "--pyz", str(built_pyz()))
    assert run.returncode == 3
    assert run.stdout.startswith(f"copied ")  # the copy itself works (scp speaks SFTP, no shell)
    assert "shell start-up file" in run.stderr and "Welcome to the proxy-agent test login node" in run.stderr


def test_deploy_without_a_file_or_host_fails_cleanly(sshd, tmp_path):
    run = console("deploy", sshd.host, "--pyz", str(tmp_path / "none.pyz"))
    assert run.returncode == 2 and "no such file" in run.stderr
    run = console("deploy", "nobody@127.0.0.1", "--ssh-port", str(sshd.port), "--ssh-option", f"UserKnownHostsFile={sshd.known_hosts}",
                  "--ssh-option", f"IdentityFile={sshd.key}", "--pyz", str(built_pyz()))
    assert run.returncode == 3
    assert "copying" in run.stderr and "Permission denied" in run.stderr
    assert "Traceback" not in run.stderr
