"""``submit --wait``, ``wait`` and ``cosubmit`` end the console with the job's own exit status, as
``sbatch --wait`` and ``srun`` do (128 + N for a job killed by signal N), and a wait that runs
out says the job's state at that moment, not when the wait began."""

from __future__ import annotations

import io
import json
import subprocess

import pytest
import trio

from adoption_support import start
from agent_fixtures import agent_argv, console_argv, subprocess_env
from proxy_agent.client import AgentClient, WaitTimeout
from proxy_agent.console.commands import Console
from proxy_agent.console.terminal import Output
from wait_support import scaled


def _console(script: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(console_argv("-q", "-c", script, "--spawn", *agent_argv("--state-dir", str(tmp_path / "s"))),
                          capture_output=True, text=True, timeout=scaled(120), env=subprocess_env(), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("script, status", [
    ("submit --wait /bin/sh -c 'exit 3'", 3),
    ("submit --wait /bin/sh -c 'kill -TERM $$'", 128 + 15),
    # the highest of its processes' statuses, as srun gives it
    ("submit --wait -n 3 /bin/sh -c 'exit $((PROXY_AGENT_PROCESS_INDEX + 5))'", 7),
    ("submit --sub-id x /bin/sh -c 'exit 9'; wait x", 9),
    ("submit --wait /bin/true; submit --sub-id y /bin/true; wait y; submit --wait /bin/sh -c 'exit 2'", 2),
    ("submit --wait /bin/true", 0),
])
def test_the_console_exits_with_the_jobs_own_status(tmp_path, script, status):
    run = _console(script, tmp_path)
    assert run.returncode == status, run.stdout + run.stderr
    assert "Traceback" not in run.stderr


def test_a_failed_multi_part_job_gives_the_status_of_the_part_that_failed(tmp_path):
    description = tmp_path / "pair.json"
    description.write_text(json.dumps({"parts": [
        {"queue": "local:default", "executable": "/bin/sleep", "arguments": ["30"], "label": "waiting"},
        {"queue": "local:default", "executable": "/bin/sh", "arguments": ["-c", "exit 5"], "label": "bad"},
    ]}))
    run = _console(f"cosubmit {description}", tmp_path)
    assert run.returncode == 5, run.stdout + run.stderr
    assert "did not succeed" in run.stderr


def test_a_json_result_carries_the_exit_status(tmp_path):
    run = subprocess.run(console_argv("--json", "-q", "-c", "submit --wait /bin/sh -c 'exit 6'", "--spawn",
                                      *agent_argv("--state-dir", str(tmp_path / "s"))),
                         capture_output=True, text=True, timeout=scaled(120), env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert run.returncode == 6
    result = [json.loads(line) for line in run.stdout.splitlines() if '"result"' in line][-1]
    assert result["ok"] is False and result["exit_status"] == 6 and result["exit_codes"] == [6]


async def test_a_wait_that_runs_out_says_the_state_at_that_time(tmp_path):
    with trio.fail_after(scaled(90)):
        async with await AgentClient.spawn(agent_argv("--state-dir", str(tmp_path / "s")), env=subprocess_env()) as client:
            await start(client)
            job = await client.submit("/bin/sleep", ["60"])
            await client.wait_job_state(job, "RUNNING", scaled(20))
            key = client.job_key(job)

            async def change_soon(suspended: bool) -> None:
                await trio.sleep(0.5)
                await client.change_job(job, suspend="true" if suspended else "false")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(change_soon, True)
                with pytest.raises(WaitTimeout) as caught:
                    await client.wait_job_state(job, "COMPLETED", timeout=scaled(3))
            assert str(caught.value).endswith(f"job {key} to reach COMPLETED (now SUSPENDED)")

            errors = io.StringIO()
            shell = Console(client, Output(stdout=io.StringIO(), stderr=errors))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(change_soon, False)
                assert await shell.execute(["wait", str(key), "FINISHED", "-t", "3"]) is False
            assert errors.getvalue().strip().endswith(f"job {key} to reach FINISHED (now RUNNING)")
            await client.terminate(job)
            await client.wait_job_state(job, "COMPLETED", scaled(20))
            await client.quit()
