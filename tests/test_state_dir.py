"""The agent's state directory end to end: one service per directory, which a second launch
joins, a damaged store or an unusable directory told to the client in one MESSAGE while the
agent serves on, and the job list for people (``proxy-agent jobs`` / ``forget``) beside a
running agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import trio

from proxy_agent.service.journal import JOURNAL, read_journal

from adoption_support import spawn_agent, start
from agent_fixtures import BackgroundAgent, service_pid, subprocess_env
from proxy_agent.client import AgentClient
from wait_support import scaled, wait_until


def _run(*args: str, timeout: float = scaled(30)) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy_agent", *args], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(), stdin=subprocess.DEVNULL)


async def _runs_a_job(client) -> None:
    job = await client.submit("/bin/echo", ["still serving"])
    done = await client.wait_job_state(job, "COMPLETED", scaled(30))
    assert client.job_process(done, 0).text() == "still serving\n"


async def test_a_second_launch_on_the_same_state_dir_joins_the_service_of_the_first(tmp_path):
    state = str(tmp_path / "state")
    path = str(tmp_path / "s")
    with trio.fail_after(scaled(60)):
        async with await spawn_agent(state) as first:
            await start(first)
            service = service_pid(state)
            job = await first.submit("/bin/echo", ["first"], jobName="first")
            await first.wait_job_state(job, "COMPLETED", scaled(20))
            async with BackgroundAgent("--state-dir", state, "--unix", path, env=subprocess_env()):
                async with await AgentClient.connect_unix(path) as second:
                    await start(second)
                    seen = await second.wait_for(lambda: second.state.jobs_by_sub.get(first.job(job).sub_id), 20,
                                                 description="the first launch's job")
                    assert seen.name == "first"
                    await _runs_a_job(second)
                    await second.quit()
            assert service_pid(state) == service
            # the first is not disturbed
            await _runs_a_job(first)
            await first.quit()


async def test_a_damaged_store_is_kept_aside_told_once_and_the_agent_serves_on(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    garbage = b"\x00not sqlite\xff" * 500
    (state / "jobs.sqlite").write_bytes(garbage)
    with trio.fail_after(scaled(30)):
        async with await spawn_agent(str(state)) as client:
            await start(client)
            await _runs_a_job(client)
            texts = [m.text for m in client.messages]
            assert len(texts) == 1, texts
            assert "damaged" in texts[0] and "kept as" in texts[0] and "are not followed" in texts[0]
            (aside,) = [p for p in state.glob("jobs.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
            assert str(aside) in texts[0] and aside.read_bytes() == garbage
            await client.quit()
    # the new store holds the job that ran
    listed = _run("jobs", "--state-dir", str(state), "--json")
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["echo"]


async def test_an_unusable_state_dir_is_told_once_and_the_agent_serves_on(tmp_path):
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "state"  # cannot be made: its parent is a file
    with trio.fail_after(scaled(30)):
        async with await spawn_agent(str(state)) as client:
            await start(client)
            await _runs_a_job(client)
            texts = [(m.level, m.text) for m in client.messages]
            assert len(texts) == 1, texts
            level, text = texts[0]
            assert "WARNING" in str(level)
            assert f"cannot create the state directory {state}" in text
            assert "jobs will not survive a restart" in text
            await client.quit()


async def test_job_list_and_forget_beside_a_running_agent(tmp_path):
    state = str(tmp_path / "state")
    with trio.fail_after(scaled(40)):
        async with await spawn_agent(state) as client:
            await start(client)
            quick = await client.submit("/bin/echo", ["hi"], jobName="quick")
            await client.wait_job_state(quick, "COMPLETED", scaled(30))
            failing = await client.submit("/bin/sh", ["-c", "exit 3"], jobName="failing")
            await client.wait_job_state(failing, "COMPLETED", scaled(30))
            slow = await client.submit("/bin/sleep", ["60"], jobName="slow")
            await client.wait_job_state(slow, "RUNNING", scaled(30))

            def stored_states():
                listed = _run("jobs", "--state-dir", state, "--json").stdout.splitlines()
                return {json.loads(line)["name"]: json.loads(line)["state"] for line in listed}

            # states reach the store within a second, on a machine that is not busy
            await wait_until(lambda: stored_states() == {"quick": "FINISHED", "failing": "FAILED", "slow": "RUNNING"},
                             interval=0.2, what="the jobs' states in the store")

            table = _run("jobs", "--state-dir", state)
            assert table.returncode == 0, table.stderr
            header, *rows = table.stdout.splitlines()
            assert header.split() == ["ID", "NAME", "SCHEDULER", "QUEUE", "NATIVE", "ID", "STATE", "EXIT",
                                      "SUBMITTED", "ENDED"]
            by_name = {json.loads(line)["name"]: json.loads(line)
                       for line in _run("jobs", "--state-dir", state, "--json").stdout.splitlines()}
            assert set(by_name) == {"quick", "failing", "slow"} and len(rows) == 3
            assert by_name["quick"]["state"] == "FINISHED" and by_name["quick"]["ended"]
            assert by_name["failing"]["state"] == "FAILED" and by_name["slow"]["state"] == "RUNNING"
            assert by_name["slow"]["ended"] is None
            assert all(row["scheduler"] == "local" and row["queue"] == "local:default" for row in by_name.values())

            ids = {name: str(row["id"]) for name, row in by_name.items()}
            files = {name: os.path.join(state, "local", "jobs", ident) for name, ident in ids.items()}
            assert os.path.isdir(files["quick"])  # its output is kept until it is forgotten
            kept = _run("forget", "--state-dir", state, ids["slow"], ids["quick"])
            assert kept.returncode == 1
            assert f"job {ids['slow']} has not ended; it is kept" in kept.stderr and "forgot 1 job" in kept.stdout
            gone = _run("forget", "--state-dir", state, "--ended-before", "2999-01-01")
            assert gone.returncode == 0 and "forgot 1 job" in gone.stdout
            left = [json.loads(line)["name"] for line in _run("jobs", "--state-dir", state, "--json").stdout.splitlines()]
            assert left == ["slow"]
            assert not any(os.path.exists(path) for path in files.values())  # the others wrote nothing
            journal = read_journal(os.path.join(state, "local", JOURNAL))
            assert journal[int(ids["quick"])].get("forgotten") and journal[int(ids["failing"])].get("forgotten")
            assert "started" in journal[int(ids["slow"])]  # running: still the keeper's
            bad = _run("forget", "--state-dir", state, "--ended-before", "someday")
            assert bad.returncode == 2 and "is not a time like" in bad.stderr and "Traceback" not in bad.stderr
            await client.terminate(slow)
            await client.wait_job_state(slow, "COMPLETED", scaled(30))
            await client.quit()
    missing = _run("jobs", "--state-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no job store in" in missing.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_by_default_a_clients_departure_ends_its_local_jobs_and_the_next_agent_says_so(tmp_path):
    state = str(tmp_path / "state")
    with trio.fail_after(scaled(40)):
        async with await spawn_agent(state) as first:
            await start(first)
            job = await first.submit("/bin/sleep", ["60"], jobName="sleeper")
            running = await first.wait_job_state(job, "RUNNING", scaled(30))
            pid = int(first.job_process(running, 0).get("processPID"))
            sub = running.get("jobSubId")
            await first.stream.send_stream.aclose()  # the client goes away
            await wait_until(lambda: first.ended is not None, what="the agent to end")
        assert first.process.returncode == 0
        assert not _alive(pid), "the job's process outlived the agent"
        async with await spawn_agent(state) as second:
            await start(second)
            adopted = await second.wait_for(lambda: second.state.jobs_by_sub.get(sub), scaled(30),
                                            description="the ended job in the next agent")
            assert adopted.get("jobState") == "COMPLETED" and adopted.get("jobStatus") == "KILLED"
            await second.quit()


def _shared(directory: str) -> list:
    """Everything under ``directory`` that someone other than its owner may read or use."""
    found = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.lstat(path).st_mode & 0o077:
                found.append(f"{oct(os.lstat(path).st_mode & 0o777)} {os.path.relpath(path, directory)}")
    return found


async def test_every_file_in_the_state_directory_is_the_users_alone(tmp_path):
    state = str(tmp_path / "state")
    old = os.umask(0o022)  # as most users have it
    try:
        with trio.fail_after(scaled(60)):
            async with await spawn_agent(state) as client:
                await start(client)
                for text in ("one", "two"):
                    job = await client.submit("/bin/sh", ["-c", f"echo {text}; echo {text} >&2"])
                    await client.wait_job_state(job, "COMPLETED", scaled(20))
                assert _shared(state) == []  # the store's log, sockets, the keeper's files, kept output
                first = client.job_key(job)
                await client.quit()
            # forgotten: the next keeper writes its journal anew
            assert _run("forget", "--state-dir", state, str(first)).returncode == 0
            async with await spawn_agent(state) as client:
                await start(client)
                job = await client.submit("/bin/echo", ["three"])
                await client.wait_job_state(job, "COMPLETED", scaled(20))
                assert _shared(state) == []
                await client.quit()
    finally:
        os.umask(old)
    assert _shared(state) == []
    assert os.path.exists(os.path.join(state, "local", JOURNAL))
