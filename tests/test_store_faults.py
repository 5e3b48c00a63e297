"""A job store that cannot be read, or cannot be written now, never stops the agent.

* Unreadable (damaged, truncated, a newer agent's, a symbolic link, a directory, in a path
  through a file): the agent serves, says so in one MESSAGE to every client (those of
  launches that join its service later too), moves a damaged file aside once (never deleting
  it, never following a link), and keeps new jobs in a new store.  ``proxy-agent jobs`` on it
  prints one line.
* Sound but not writable now (a full disk): kept where it is, not moved aside; the agent
  adopts its jobs, serves, says so (to clients that join later too, while it lasts), refuses
  new jobs (they could not be recorded), retries, and writes what it owes once there is room.

"The agent" is the service of the state directory, which the first launch starts; a second
agent is the service started after the first one was stopped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from adoption_support import spawn_agent, start
from agent_fixtures import agent_argv, subprocess_env
from proxy_agent.endpoints import lock_holder
from proxy_agent.launch import stop_service
from disk_support import fill, small_disk
from proxy_agent.client import CommandFailed
from wait_support import scaled, wait_until
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.store import JobStore, open_store


def jobs_command(state: Path, *more: str, command: str = "jobs") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy_agent", command, "--state-dir", str(state), *more],
                          capture_output=True, text=True, timeout=scaled(60), env=subprocess_env(), stdin=subprocess.DEVNULL)


def a_store_with_jobs(state: Path, count: int = 120) -> Path:
    """A store of ``count`` ended jobs, written by the store itself; its path."""
    store = open_store(str(state))
    for key in range(1, count + 1):
        store.record_submission(key, "local", "local:default", JobSpec("/bin/true", arguments=("x" * 300,)))
        store.note_state(key, "FINISHED", "EXITED", None, True, "0")
    store.close()
    return state / JobStore.FILE


def zero_page_2(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\0" * 4096)


def newer(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()


def _damage(kind: str, state: Path, elsewhere: Path) -> dict:
    """Damage the store of ``state`` in one way; what the checks need to know."""
    path = a_store_with_jobs(state)
    if kind == "page 2 zeroed":
        zero_page_2(path)
    elif kind == "truncated":
        os.truncate(path, 0)
    elif kind == "newer schema":
        newer(path)
    elif kind == "symbolic link":
        target = elsewhere / "somebody-elses.sqlite"
        target.write_bytes(b"")  # empty: a store opened through the link would be written into it
        path.unlink()
        path.symlink_to(target)
        return {"target": target, "content": target.read_bytes()}
    elif kind == "directory":
        path.unlink()
        path.mkdir()
        (path / "inside").write_text("kept")
    else:
        raise AssertionError(kind)
    return {}


KINDS = ["page 2 zeroed", "truncated", "newer schema", "symbolic link", "directory"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_store_that_cannot_be_read_never_stops_the_agent(tmp_path, kind):
    state = tmp_path / "state"
    state.mkdir()
    found = _damage(kind, state, tmp_path)
    for command, more in [("jobs", ()), ("jobs", ("--state", "ended", "--json")), ("output", ("1",)),
                          ("output", ("1", "--follow")), ("output", ("true",)), ("forget", ("1",)),
                          ("forget", ("--ended-before", "1d"))]:
        before = jobs_command(state, *more, command=command)
        assert before.returncode == 2, (command, more, before)
        assert before.stdout == "" and len(before.stderr.strip().splitlines()) == 1, before.stderr
        assert "Traceback" not in before.stderr and f"proxy-agent {command}:" in before.stderr
        assert not list(state.glob("jobs.sqlite.damaged-*"))  # these tools never move anything
    if kind == "symbolic link":
        assert found["target"].read_bytes() == found["content"]  # nor write through a link

    with trio.fail_after(scaled(60)):
        for start_number in (1, 2):  # moved aside once: the second agent finds the new store
            async with await spawn_agent(str(state)) as client:
                await start(client)
                job = await client.submit("/bin/echo", [f"run {start_number}"])
                await client.wait_job_state(job, "COMPLETED", scaled(30))
                texts = [m.text for m in client.messages]
                if start_number == 1:
                    assert len(texts) == 1, texts
                    assert "the job store could not be read" in texts[0] and "kept as" in texts[0], texts
                else:
                    assert texts == []
                await client.quit()
            if start_number == 1:
                # a launch that joins the agent later is told the same, once
                async with await spawn_agent(str(state)) as later:
                    await start(later)
                    await later.wait_for(lambda: later.messages, 10, description="the store's MESSAGE")
                    assert [m.text for m in later.messages] == texts
                    await later.quit()
                assert stop_service(str(state)) is not None
    copies = [p for p in state.glob("jobs.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(copies) == 1, copies
    if kind == "symbolic link":
        assert copies[0].is_symlink() and found["target"].read_bytes() == found["content"]  # not followed
    elif kind == "directory":
        assert (copies[0] / "inside").read_text() == "kept"
    elif kind == "truncated":
        assert copies[0].stat().st_size == 0
    else:
        assert copies[0].stat().st_size > 4096  # the bytes are all there, for the user to look at
    listed = jobs_command(state, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["echo", "echo"]


async def test_a_store_in_a_path_through_a_file_never_stops_the_agent(tmp_path):
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "state"
    listed = jobs_command(state)
    assert listed.returncode == 2 and len(listed.stderr.strip().splitlines()) == 1, listed.stderr
    with trio.fail_after(scaled(60)):
        async with await spawn_agent(str(state)) as client:
            await start(client)
            job = await client.submit("/bin/echo", ["serving"])
            await client.wait_job_state(job, "COMPLETED", scaled(30))
            texts = [m.text for m in client.messages]
            assert len(texts) == 1 and "jobs will not survive a restart" in texts[0], texts
            assert "nor will their output be kept" in texts[0]
            # what the job wrote reached the client live; asked for later, the agent says why it has none
            assert client.job_output(job) == "serving\n"
            with pytest.raises(CommandFailed) as kept:
                await client.kept_output(job)
            assert "keeps no output: its state directory or job store cannot be used" in kept.value.message
            assert client.violations == []
            await client.quit()


async def test_a_full_disk_keeps_a_sound_store_and_what_is_owed_is_written_once_there_is_room(tmp_path):
    with small_disk(tmp_path / "disk", "8m") as disk:
        state = disk / "state"
        filler = None
        try:
            with trio.fail_after(scaled(120)):
                # three running jobs, kept running by an agent that leaves on purpose
                async with await spawn_agent(str(state), "--on-disconnect", "keep") as first:
                    await start(first)
                    subs = [await first.submit_nowait("/bin/sleep", ["120"], jobName=f"sleeper{i}") for i in range(3)]
                    for sub in subs:
                        await first.wait_for(lambda: (first.state.jobs_by_sub.get(sub) is not None and
                                                      first.state.jobs_by_sub[sub].get("jobState") == "RUNNING"),
                                             scaled(30), description="a running job")
                    await first.quit()
                assert stop_service(str(state)) is not None  # the agent leaves; its jobs run on
                assert not (state / "jobs.sqlite-wal").exists()  # closed cleanly: nothing but the file
                filler = fill(disk)

                listed = jobs_command(state, "--json")  # the store is read as it is
                assert listed.returncode == 0, listed.stderr
                assert sorted(json.loads(line)["state"] for line in listed.stdout.splitlines()) == ["RUNNING"] * 3
                first_key = str(json.loads(listed.stdout.splitlines()[0])["id"])
                output = jobs_command(state, first_key, command="output")  # read as it is too
                assert (output.returncode, output.stdout, output.stderr) == (0, "", "")
                refused = jobs_command(state, "--ended-before", "1d", command="forget")  # a write: not now
                assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
                assert "cannot be" in refused.stderr and "Traceback" not in refused.stderr

                async with await spawn_agent(str(state)) as second:
                    await start(second)
                    jobs = {sub: await second.wait_for(lambda: second.state.jobs_by_sub.get(sub), scaled(30),
                                                       description="an adopted job") for sub in subs}
                    assert all(job.get("jobState") == "RUNNING" for job in jobs.values())
                    texts = [m.text for m in second.messages]
                    assert len(texts) == 1 and "cannot be written now" in texts[0], texts
                    assert "new jobs are refused" in texts[0]
                    # a launch that joins the agent meanwhile is told so too
                    async with await spawn_agent(str(state)) as joining:
                        await start(joining)
                        await joining.wait_for(lambda: joining.messages, 10, description="the store's MESSAGE")
                        assert [m.text for m in joining.messages] == texts
                        await joining.quit()
                    with pytest.raises(Exception, match="disk is full|no space left"):
                        await second.submit("/bin/echo", ["not recorded, so not run"])
                    await second.terminate(jobs[subs[0]])  # a change the store owes
                    ended = await second.wait_job_state(jobs[subs[0]], "COMPLETED", scaled(30))
                    assert ended.get("jobStatus") == "KILLED"
                    assert not list(state.glob("jobs.sqlite.damaged-*"))

                    os.unlink(filler)
                    filler = None
                    await second.wait_for(lambda: any("can be written again" in m.text for m in second.messages),
                                          scaled(30), description="the store written again")
                    job = await second.submit("/bin/echo", ["recorded"])
                    await second.wait_job_state(job, "COMPLETED", scaled(30))

                    def stored():
                        return {json.loads(line)["name"]: json.loads(line)["state"]
                                for line in jobs_command(state, "--json").stdout.splitlines()}

                    # states reach the store within a second, on a machine that is not busy
                    await wait_until(lambda: stored() == {"sleeper0": "KILLED", "sleeper1": "RUNNING",
                                                          "sleeper2": "RUNNING", "echo": "FINISHED"},
                                     interval=0.2, what=f"the states in the store (now {stored()})")
                    for sub in subs[1:]:
                        await second.terminate(jobs[sub])
                        await second.wait_job_state(jobs[sub], "COMPLETED", scaled(30))
                    assert second.violations == []
                    await second.quit()
                # one that joins now hears nothing of it: the store is written again
                async with await spawn_agent(str(state)) as after:
                    await start(after)
                    await after.submit("/bin/true", [])
                    assert [m.text for m in after.messages] == []
                    await after.quit()
            assert not list(state.glob("jobs.sqlite.damaged-*"))
        finally:
            if filler is not None and filler.exists():
                filler.unlink()
            if lock_holder(str(state)) is None and (state / "local").exists():
                # (a failure while no service ran: one adopts the sleepers, to end them)
                subprocess.run(agent_argv("--state-dir", str(state)), input=b"", env=subprocess_env(),
                               capture_output=True, timeout=scaled(60))
            stop_service(str(state), end_jobs=True)  # before the disk goes


async def test_a_read_only_store_is_kept_its_writes_owed_and_written_once_it_can_be(tmp_path):
    """(An immutable file, which not even root may write: what a read-only store is to a user.)"""
    from proxy_agent.schedulers.sim import SimBackend
    from proxy_agent.service.jobs import SubmitError
    from proxy_agent.service.service import JobService

    path = a_store_with_jobs(tmp_path, 3)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file immutable (chattr +i)")
    try:
        store = open_store(str(tmp_path))
        assert store.unwritable and "readonly" in store.unwritable
        assert not list(tmp_path.glob("jobs.sqlite.damaged-*"))
        service = JobService(store=store)
        service.add_backend(SimBackend(service.model, None, service.context(state_dir=str(tmp_path))))
        assert [text for _, text in service.standing] == [
            f"{store.unwritable}; new jobs are refused until it can be written, and what the agent owes it is kept "
            "and written then (retrying)"]
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(scaled(30)):
                await service.ready.wait()
            with pytest.raises(SubmitError, match="the job is refused: .*cannot be written now"):
                await service.submit(JobSpec("/bin/true"))
            store.note_state(2, "KILLED", "CANCELLED", "gone", True)  # owed
            service._write_store()
            assert store.owes
            # long-ended jobs are forgotten once the store can be written, and it stays the store
            service.keep_ended = 0.0
            assert service.forget_ended(time.time() + 60) == []
            assert service.store is store and store.job(1) is not None
            forget = jobs_command(tmp_path, "--ended-before", "1d", command="forget")
            assert forget.returncode == 2 and len(forget.stderr.strip().splitlines()) == 1, forget.stderr
            assert "cannot be written now" in forget.stderr and "Traceback" not in forget.stderr
            subprocess.run(["chattr", "-i", str(path)], check=True)
            with trio.fail_after(scaled(30)):
                while store.unwritable is not None:  # the service retries every half second
                    await trio.sleep(0.1)
            assert not store.owes and service.standing == []
            assert store.job(2).state == "KILLED"
            assert sorted(service.forget_ended(time.time() + 60)) == [1, 2, 3]
            assert store.jobs() == []
            await service.submit(JobSpec("/bin/true"))  # accepted again
            nursery.cancel_scope.cancel()
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


async def test_forgetting_through_the_service_on_a_store_it_cannot_write_is_one_line(tmp_path):
    """``proxy-agent forget`` asks the running service, which may hold a store it cannot write
    now (an immutable file here): one line saying so, nothing forgotten; ``jobs`` still lists."""
    state = tmp_path / "state"
    state.mkdir()
    path = a_store_with_jobs(state, 3)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file immutable (chattr +i)")
    try:
        with trio.fail_after(scaled(60)):
            async with await spawn_agent(str(state)) as client:
                await start(client)
                await client.wait_for(lambda: client.messages, 10, description="the store's MESSAGE")
                assert "cannot be written now" in client.messages[0].text
                done = subprocess.run([sys.executable, "-m", "proxy_agent", "forget", "1", "--state-dir", str(state)],
                                      capture_output=True, text=True, timeout=scaled(60), env=subprocess_env(),
                                      stdin=subprocess.DEVNULL)
                assert done.returncode != 0 and done.stdout == "", done
                assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
                assert "cannot be written now" in done.stderr and "nothing was forgotten" in done.stderr, done.stderr
                listed = jobs_command(state, "--json")
                assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 3, listed
                await client.quit()
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        stop_service(str(state))
