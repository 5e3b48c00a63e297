"""One id per job in every tool: the console, ``proxy-agent jobs``, ``forget``, ``output``, the
Python client, the agent's log and the Invoke Server's log name a job alike and take that name
back.  (The protocol's element ids stay inside PTP sessions.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import trio

from agent_fixtures import agent_argv, console_argv, subprocess_env
from proxy_agent.client.sync import Agent
from test_invoke_server import TIMEOUT, attributes, invoke_server


def _run(argv, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=subprocess_env(),
                          stdin=subprocess.DEVNULL)


def _rows(state: str):
    result = _run(agent_argv("jobs", "--json", "--state-dir", state))
    return {row["id"]: row for row in map(json.loads, result.stdout.splitlines())}


def test_a_job_has_the_same_id_in_every_tool_and_each_takes_it_back(tmp_path):
    state, socket_path, log = str(tmp_path / "state"), str(tmp_path / "agent.sock"), tmp_path / "agent.log"
    agent = subprocess.Popen(agent_argv("--unix", socket_path, "--state-dir", state, "--log-file", str(log), "-v"),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=subprocess_env())
    try:
        for _ in range(600):
            if os.path.exists(socket_path):
                break
            time.sleep(0.05)
        first = _run(console_argv("--unix", socket_path, "-q", "-c", "submit --wait jobName=echoer /bin/echo hello"))
        assert first.returncode == 0, first.stderr
        key = int(re.search(r"submitted job (\d+) \(", first.stdout).group(1))
        assert f"[{key}.0] hello" in first.stdout and f"job {key} echoer COMPLETED" in first.stdout

        for _ in range(100):  # the store has the end within a second
            if _rows(state).get(key, {}).get("ended"):
                break
            time.sleep(0.1)
        row = _rows(state)[key]
        assert row["name"] == "echoer" and row["state"] == "FINISHED"
        assert f"submitted {row['client_ref']} as job {key}" in log.read_text()

        again = _run(console_argv("--unix", socket_path, "-q", "-c", f"show {key}; show echoer; output {key}; wait {key}"))
        assert again.returncode == 0, again.stderr
        shown = [line for line in again.stdout.splitlines() if line.startswith("job ")]
        assert shown[:2] == [f"job {key} echoer COMPLETED FINISHED"] * 2
        assert f"[{key}.0] hello" in again.stdout and f"job {key} reached COMPLETED" in again.stdout

        with Agent.connect_unix(socket_path) as client:
            job = client.job(key)
            assert job.id == key and client.job(str(key)).id == key and client.job("echoer").id == key
            assert job.stdout == "hello\n" and key in [j.id for j in client.jobs()]

        assert _run(agent_argv("output", str(key), "--state-dir", state)).stdout == "hello\n"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    forgotten = _run(agent_argv("forget", str(key), "--state-dir", state))
    assert forgotten.returncode == 0 and forgotten.stdout.strip() == "forgot 1 job", forgotten.stderr
    assert key not in _rows(state)


async def test_the_invoke_servers_log_names_the_agents_job_id(tmp_path):
    state, log = tmp_path / "state", tmp_path / "invoke.log"
    async with invoke_server("-l", str(log), state_dir=state) as invoke:
        job = await invoke.created_job(1, attributes("/bin/echo", ["hi"], workdir=tmp_path))
        await invoke.final_status(job)
        await invoke.send(b"EXIT\r\n")
        assert await invoke.reply() == "S"
        await invoke.wait()
    with trio.fail_after(TIMEOUT):
        while True:
            rows = await trio.to_thread.run_sync(lambda: _rows(str(state)))
            if rows:
                break
            await trio.sleep(0.2)
    (key,) = rows
    text = log.read_text()
    assert f"{job} (job {key}) is in the agent's job list" in text, text
