"""Every line a job writes is kept in the state directory until the job is forgotten: in order,
up to a bound per job with the count of what was not kept, once even when a later agent reads
a job's files again, and readable whether or not a client saw it live."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import trio

from adoption_support import spawn_agent, start
from agent_fixtures import agent_argv, subprocess_env
from disk_support import fill, small_disk
from proxy_agent.client import AgentClient
from proxy_agent.client.sync import Agent
from proxy_agent.service import history
from proxy_agent.service.history import OutputHistory, read_job_output
from wait_support import scaled


def _lines(prefix: str, first: int, last: int):
    return [f"{prefix} {i}" for i in range(first, last + 1)]


def _source(lines) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _feed(kept: OutputHistory, key: int, lines, start: int, chunks) -> None:
    """Hand ``lines`` to ``kept`` as a backend reading its file from offset ``start`` would:
    in blocks of whole lines, each with the offset where it ends."""
    offset = start
    at = 0
    for size in chunks:
        block = lines[at:at + size]
        if not block:
            break
        at += size
        offset += len(_source(block))
        kept.record(key, 0, "stdout", "\n".join(block), offset)


def test_lines_are_kept_per_process_and_stream_in_order(tmp_path):
    kept = OutputHistory(str(tmp_path))
    kept.record(7, 0, "stdout", "a 1\na 2", None)
    kept.record(7, 1, "stdout", "b 1", None)
    kept.record(7, 0, "stderr", "oops", None)
    kept.record(7, 0, "stdout", "a 3", None)
    kept.close()
    found = read_job_output(str(tmp_path), 7)
    assert [(p.rank, p.stream, p.lines) for p in found.streams] == [
        (0, "stdout", ("a 1", "a 2", "a 3")), (0, "stderr", ("oops",)), (1, "stdout", ("b 1",))]
    assert found.text("stdout") == "a 1\na 2\na 3\nb 1\n" and found.text("stderr", rank=0) == "oops\n"
    later = read_job_output(str(tmp_path), 7, streams=("stdout",), skip={(0, "stdout"): 2})
    assert [(p.rank, p.first, p.lines) for p in later.streams] == [(0, 2, ("a 3",)), (1, 0, ("b 1",))]
    directory = history.job_directory(str(tmp_path), 7)
    assert all(os.stat(os.path.join(directory, name)).st_mode & 0o777 == 0o600 for name in os.listdir(directory))
    assert os.stat(directory).st_mode & 0o777 == 0o700


def test_past_the_bound_lines_are_counted_not_kept(tmp_path):
    kept = OutputHistory(str(tmp_path), limit=100)
    lines = _lines("line", 1, 30)  # 6 or 7 bytes each
    _feed(kept, 3, lines, 0, [4] * 8)
    kept.record(3, 1, "stderr", "a late line", 12)
    kept.close()
    found = read_job_output(str(tmp_path), 3)
    stdout, stderr = found.streams[0], found.streams[1]
    assert stdout.lines == tuple(lines[:len(stdout.lines)])
    assert sum(len(line) + 1 for line in stdout.lines) <= 100 < sum(len(line) + 1 for line in lines[:len(stdout.lines) + 1])
    assert stdout.dropped == 30 - len(stdout.lines) and stderr.dropped == 1 and not stderr.lines
    assert found.dropped() == 31 - len(stdout.lines)


@pytest.mark.parametrize("delivered_lines", [0, 3, 8])
def test_a_later_agent_reading_the_files_again_keeps_each_line_once(tmp_path, delivered_lines):
    lines = _lines("out", 1, 20)
    first = OutputHistory(str(tmp_path))
    _feed(first, 5, lines[:14], 0, [3, 5, 6])  # blocks end after lines 3, 8 and 14
    first.close()  # the agent ends; delivery to a client had reached some block's end
    delivered = len(_source(lines[:delivered_lines]))
    second = OutputHistory(str(tmp_path))
    second.expect_rereading(5, {"0.stdout": delivered})
    _feed(second, 5, lines[delivered_lines:], delivered, [2, 7, 100])  # read again in other blocks
    second.close()
    assert read_job_output(str(tmp_path), 5).text() == "".join(line + "\n" for line in lines)


def test_a_later_agent_past_the_bound_does_not_count_twice(tmp_path):
    lines = _lines("out", 1, 40)
    first = OutputHistory(str(tmp_path), limit=60)
    _feed(first, 9, lines[:30], 0, [5] * 6)
    first.close()
    kept_before = read_job_output(str(tmp_path), 9).streams[0]
    assert kept_before.dropped == 30 - len(kept_before.lines)
    delivered = len(_source(lines[:25]))  # in the part that was only counted
    second = OutputHistory(str(tmp_path), limit=60)
    second.expect_rereading(9, {"0.stdout": delivered})
    _feed(second, 9, lines[25:], delivered, [5, 5, 5])
    second.close()
    after = read_job_output(str(tmp_path), 9).streams[0]
    assert after.lines == kept_before.lines and after.dropped == 40 - len(after.lines)


def test_a_block_the_disk_refuses_is_taken_back_whole_and_counted_with_the_reason(tmp_path):
    """A file size limit refuses writes as a full disk does, part of a block first: what is
    kept stays whole lines, the stream's first ones, and the rest is counted, saying why."""
    import resource

    kept = OutputHistory(str(tmp_path))
    lines = _lines("line", 1, 200_000)
    _feed(kept, 4, lines[:150_000], 0, [5000] * 30)  # about 1.5 MB, before the disk fills
    path = os.path.join(history.job_directory(str(tmp_path), 4), "0.out")
    size = os.path.getsize(path)
    assert size == len(_source(lines[:150_000]))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))  # the next block fits only in part
    try:
        _feed(kept, 4, lines[150_000:160_000], len(_source(lines[:150_000])), [5000] * 2)
        kept.record(4, 0, "stderr", "a warning", None)  # a small file still has room
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    # room again: the stream's kept lines stay its first ones, so the later lines are counted too
    _feed(kept, 4, lines[160_000:], len(_source(lines[:160_000])), [5000] * 8)
    told = kept.dropped(4)
    assert told["0.stdout"][0] == 50_000 and "had no room for them" in told["0.stdout"][2]
    kept.close()
    assert os.path.getsize(path) == size  # nothing of the refused block stayed
    assert os.path.getsize(path + ".at") % 16 == 0
    found = read_job_output(str(tmp_path), 4)
    stdout, stderr = found.streams
    assert stdout.lines == tuple(lines[:150_000])
    assert stdout.dropped == 50_000 and stdout.why_dropped == f"the disk of {tmp_path} had no room for them"
    assert stderr.lines == ("a warning",) and stderr.dropped == 0 and stderr.why_dropped == ""
    # a later agent reading the file again from where delivery stopped counts nothing twice
    again = OutputHistory(str(tmp_path))
    delivered = len(_source(lines[:170_000]))
    again.expect_rereading(4, {"0.stdout": delivered, "0.stderr": 10})
    _feed(again, 4, lines[170_000:], delivered, [10_000] * 3)
    again.close()
    after = read_job_output(str(tmp_path), 4).streams[0]
    assert after.lines == tuple(lines[:150_000]) and after.dropped == 50_000


# --------------------------------------------------------------------------- with the agent


def _agent_command(*args: str, state: str) -> subprocess.CompletedProcess:
    return subprocess.run(agent_argv(*args, "--state-dir", state), capture_output=True, text=True, timeout=scaled(60),
                          env=subprocess_env(), stdin=subprocess.DEVNULL)


async def _rows(state: str):
    result = await trio.to_thread.run_sync(lambda: _agent_command("jobs", "--json", state=state))
    return {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}


async def _until(predicate, what: str, seconds: float = 30):
    with trio.fail_after(seconds):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(0.1)


async def test_a_client_that_comes_back_finds_every_line_kept(tmp_path):
    """A job writes two lines while one client watches and four after it left: the next
    client is handed the four it has not seen; every tool gives all six, in order."""
    state = str(tmp_path / "state")
    go = tmp_path / "go"
    script = (f"echo 'line 1'; echo 'line 2'; while [ ! -e {go} ]; do sleep 0.05; done; "
              "echo 'line 3'; echo 'line 4' >&2; echo 'line 5'; echo 'line 6'")
    socket_path = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(agent_argv("--unix", socket_path, "--state-dir", state), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env())
    try:
        with trio.fail_after(scaled(60)):
            while True:  # the socket's file is there a moment before it is listened on
                line = (await trio.to_thread.run_sync(agent.stderr.readline)).decode()
                assert line, "the agent ended before it listened"
                if "listening on" in line:
                    break
            async with await AgentClient.connect_unix(socket_path) as first:
                await start(first)
                job = await first.submit("/bin/sh", ["-c", script], jobName="six")
                await first.wait_for(lambda: len(first.job(job).output) == 2, 20)
            go.touch()
            rows = await _until(lambda: _rows(state), "the job's end")
            await _until(lambda: _ended(state), "the job's end")
            async with await AgentClient.connect_unix(socket_path) as second:
                await start(second)
                again = second.state.jobs_by_sub[first.job(job).sub_id]
                await second.wait_for(lambda: len(again.output) == 4, scaled(20))
                assert again.text("stdout") == "line 3\nline 5\nline 6\n" and again.text("stderr") == "line 4\n"
        key = str((await _rows(state))["six"]["id"])
        out = await trio.to_thread.run_sync(lambda: _agent_command("output", key, state=state))
        assert out.returncode == 0 and out.stdout == "line 1\nline 2\nline 3\nline 5\nline 6\n", out.stderr
        err = await trio.to_thread.run_sync(lambda: _agent_command("output", "six", "--stderr", state=state))
        assert err.stdout == "line 4\n"
        del rows
        # the console's output, from a session that saw none of it live
        shown = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "proxy_agent.console", "--unix", socket_path, "-q", "-c", f"output {key}"],
            capture_output=True, text=True, timeout=scaled(60), env=subprocess_env(), stdin=subprocess.DEVNULL))
        assert shown.returncode == 0, shown.stderr
        assert [line for line in shown.stdout.splitlines() if line.startswith("[")] == [
            f"[{key}.0] line 1", f"[{key}.0] line 2", f"[{key}.0] line 3", f"[{key}.0] line 5", f"[{key}.0] line 6",
            f"[{key}.0 err] line 4"]

        def from_python() -> tuple:
            with Agent.connect_unix(socket_path) as client:
                job = client.job(int(key))
                return job.stdout, job.stderr

        assert await trio.to_thread.run_sync(from_python) == ("line 1\nline 2\nline 3\nline 5\nline 6\n", "line 4\n")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        agent.stderr.close()
    forgotten = _agent_command("forget", key, state=state)
    assert forgotten.returncode == 0, forgotten.stderr
    assert not os.path.exists(history.job_directory(state, int(key)))
    gone = _agent_command("output", key, state=state)
    assert gone.returncode == 1 and f"no job {key} in the list" in gone.stderr


async def _ended(state: str) -> bool:
    return (await _rows(state)).get("six", {}).get("ended") is not None


async def test_output_follow_prints_lines_as_the_job_writes_them_until_it_ends(tmp_path):
    state = str(tmp_path / "state")
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; echo second; echo third"
    with trio.fail_after(scaled(60)):
        async with await spawn_agent(state) as client:
            await start(client)
            job = await client.submit("/bin/sh", ["-c", script], jobName="followed")
            await client.wait_for(lambda: client.job(job).output, scaled(20))
            key = str((await _rows(state))["followed"]["id"])
            follower = await trio.lowlevel.open_process(
                agent_argv("output", key, "--follow", "--state-dir", state), stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL, env=subprocess_env())
            seen = b""
            while b"first\n" not in seen:
                seen += await follower.stdout.receive_some(1024)
            assert follower.returncode is None  # still following: the job has not ended
            go.touch()
            while True:
                chunk = await follower.stdout.receive_some(1024)
                if not chunk:
                    break
                seen += chunk
            assert await follower.wait() == 0
            assert seen == b"first\nsecond\nthird\n"
            await client.quit()


async def test_the_kept_output_survives_a_killed_agent_once_per_line(tmp_path):
    """An agent killed while nobody had seen a job's later lines: the next agent reads the
    job's files again, and the kept output still has each line once."""
    state = str(tmp_path / "state")
    go = tmp_path / "go"
    script = (f"i=1; while [ $i -le 200 ]; do echo \"n $i\"; i=$((i+1)); done; while [ ! -e {go} ]; do sleep 0.05; "
              "done; i=201; while [ $i -le 300 ]; do echo \"n $i\"; i=$((i+1)); done")
    with trio.fail_after(scaled(90)):
        async with await spawn_agent(state, "--on-disconnect", "keep") as client:
            await start(client)
            await client.stop_events()  # nothing reaches a client: every line stays undelivered
            await client.submit_nowait("/bin/sh", ["-c", script], jobName="many")
            await _until(lambda: _kept_lines(state, "many", 200), "the first 200 lines kept")
            os.kill(client.process.pid, signal.SIGKILL)
            with pytest.raises(Exception):
                await client.wait_for(lambda: False, 20)
        go.touch()
        async with await spawn_agent(state) as second:
            await start(second)
            await _until(lambda: _ended_named(state, "many"), "the job's end")
            await second.quit()
    key = str((await _rows(state))["many"]["id"])
    out = _agent_command("output", key, state=state)
    assert out.stdout.splitlines() == [f"n {i}" for i in range(1, 301)]


async def _kept_lines(state: str, name: str, count: int) -> bool:
    rows = await _rows(state)
    if name not in rows:
        return False
    return len(read_job_output(state, rows[name]["id"]).text().splitlines()) >= count


async def _ended_named(state: str, name: str) -> bool:
    return (await _rows(state)).get(name, {}).get("ended") is not None


def test_output_of_a_job_the_list_does_not_know_is_one_line(tmp_path):
    state = str(tmp_path / "state")
    result = subprocess.run([sys.executable, "-m", "proxy_agent", "output", "12", "--state-dir", state],
                            capture_output=True, text=True, timeout=scaled(30), env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "no job store in" in result.stderr


def test_the_consoles_output_follows_a_running_job_printing_each_line_once(tmp_path):
    script = ("submit --sub-id slow /bin/sh -c 'echo a; sleep 0.5; echo b >&2; sleep 0.5; echo c; exit 4'; "
              "output slow")
    run = subprocess.run([sys.executable, "-m", "proxy_agent.console", "-q", "-c", script, "--spawn",
                          *agent_argv("--state-dir", str(tmp_path / "state"))],
                         capture_output=True, text=True, timeout=scaled(60), env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    lines = [line.split("] ", 1)[1] for line in run.stdout.splitlines() if line.startswith("[")]
    assert sorted(lines) == ["a", "b", "c"]
    assert run.stdout.rstrip().endswith("COMPLETED FAILED (exit status 4)")


@pytest.mark.parametrize("dialect", ["native", "default"])
async def test_get_output_gives_any_part_of_the_kept_output_in_either_dialect(tmp_path, dialect):
    from proxy_agent.client import CommandFailed

    state = str(tmp_path / "state")
    script = 'echo "été $PROXY_AGENT_PROCESS_INDEX"; echo "second"; echo "oops" >&2'
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv("--state-dir", state), env=subprocess_env(),
                                           dialect=dialect) as client:
            await start(client)
            job = await client.submit("/bin/sh", ["-c", script], count=2)
            await client.wait_job_state(job, "COMPLETED", scaled(20))
            kept = await client.kept_output(job)
            assert [(p.rank, p.stream, p.lines) for p in kept.streams] == [
                (0, "stdout", ["été 0", "second"]), (0, "stderr", ["oops"]),
                (1, "stdout", ["été 1", "second"]), (1, "stderr", ["oops"])]
            assert kept.key == client.job_key(job) and client.violations == []
            later = await client.kept_output(kept.key, stream="stdout", rank=1, skip={(1, "stdout"): 1})
            assert [(p.rank, p.first, p.lines) for p in later.streams] == [(1, 1, ["second"])]
            with pytest.raises(CommandFailed) as unknown:
                await client.kept_output(kept.key + 1000)
            assert unknown.value.code == 10 and "no output is kept" in unknown.value.message
            bad = await client.raw(0x10, [f"jobId={job}", "skip=stdout"])
            assert bad.completion.code == 4 and "is not RANK.STREAM:LINES" in bad.completion.message
            await client.quit()


async def test_on_a_full_disk_the_kept_output_counts_what_it_has_no_room_for_and_the_agent_runs_on(tmp_path):
    """The disk fills while a job writes: the kept output holds the job's first lines, whole,
    and counts the rest with the reason; every client and tool is told; the agent serves on."""
    from proxy_agent.client import CommandFailed

    total = 400_000  # about 2.7 MB of lines, on a disk with 1.5 MiB free
    with small_disk(tmp_path / "disk", "8m") as disk:
        state = disk / "state"
        filler = None
        try:
            with trio.fail_after(scaled(150)):
                async with await spawn_agent(str(state)) as client:
                    await start(client)
                    warm = await client.submit("/bin/echo", ["ready"])
                    await client.wait_job_state(warm, "COMPLETED", scaled(30))
                    # its first 1,000 lines while there is room, the rest once the disk is nearly full
                    room, gate = tmp_path / "filled", tmp_path / "go-on"
                    script = (f'seq 1 1000; while [ ! -e "{room}" ]; do sleep 0.05; done; seq 1001 {total}; '
                              f'while [ ! -e "{gate}" ]; do sleep 0.05; done; exit 0')
                    job = await client.submit("/bin/sh", ["-c", script], jobName="flood")
                    with trio.fail_after(scaled(60)):
                        while len((await client.kept_output(job, stream="stdout")).text()) < len(_source(
                                map(str, range(1, 1001)))):
                            await trio.sleep(0.1)
                    filler = fill(disk, leave=3 << 19)
                    room.touch()
                    with trio.fail_after(scaled(60)):
                        while not (await client.kept_output(job, stream="stdout")).dropped("stdout"):
                            await trio.sleep(0.2)
                    gate.touch()
                    done = await client.wait_job_state(job, "COMPLETED", scaled(60))
                    assert done.get("jobStatus") == "FINISHED", done.attributes  # it ran on
                    got = [line.text for line in client.job_process(done, 0).output if line.stream == "stdout"]
                    # the disk is still full: the agent tells the counts it holds
                    kept = (await client.kept_output(job, stream="stdout")).streams[0]
                    assert kept.dropped > 0 and kept.lines == got[:len(kept.lines)]
                    assert len(kept.lines) + kept.dropped == len(got)  # every line kept or counted, once
                    assert kept.lines[:1000] == [str(i) for i in range(1, 1001)] and len(kept.lines) < total
                    key = str(client.job_key(job))

                    os.unlink(filler)  # room again: the counts are written for every tool to read
                    filler = None

                    def told() -> subprocess.CompletedProcess:
                        return _agent_command("output", key, state=str(state))

                    with trio.fail_after(scaled(30)):
                        while "were not kept" not in (result := await trio.to_thread.run_sync(told)).stderr:
                            await trio.sleep(0.2)
                    assert result.returncode == 0 and result.stdout.splitlines() == kept.lines
                    assert result.stderr == (f"proxy-agent output: {kept.dropped} further lines process 0 wrote to "
                                             f"stdout were not kept (the disk of {state} had no room for them)\n")
                    after = None
                    with trio.fail_after(scaled(30)):  # refused until the agent sees the room
                        while after is None:
                            try:
                                after = await client.submit("/bin/echo", ["room again"])
                            except CommandFailed:
                                await trio.sleep(0.5)
                    assert (await client.wait_job_state(after, "COMPLETED", scaled(30))).get("jobStatus") == "FINISHED"
                    assert (await client.kept_output(after)).streams[0].lines == ["room again"]
                    assert client.violations == []
                    await client.quit()
        finally:
            if filler is not None and filler.exists():
                filler.unlink()
