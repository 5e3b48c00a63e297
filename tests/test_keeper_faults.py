"""The keeper can die, and its disk can fill, without losing a job or stopping the agent.

* The keeper killed while jobs write: its custodian starts a new keeper, which takes the
  running jobs back (their pipes and pids from the custodian); the agent reconnects and goes
  on: every line arrives once, in order, and is kept once, and every exit status is kept.
* The keeper and its custodian both killed: the next keeper cannot take the job back; the job
  is reported FAILED saying why, and its processes are ended.
* The disk fills while a job writes: what does not fit is dropped and counted, the client is
  told how much, the job runs on and ends normally, new jobs are refused saying why, and are
  accepted again once there is room.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import trio

from adoption_support import spawn_agent, start
from disk_support import fill, small_disk
from proxy_agent.service.history import read_job_output
from wait_support import scaled, wait_until


def keeper_pids(state: Path) -> dict:
    try:
        return json.loads((state / "local" / "keeper.lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def lines(client, job, rank: int = 0, stream: str = "stdout") -> list:
    process = client.job_process(job, rank)
    return [line.text for line in process.output if line.stream == stream]


async def test_a_killed_keeper_is_replaced_and_its_jobs_go_on_with_output_and_exit_status(tmp_path):
    state = tmp_path / "state"
    log = tmp_path / "agent.log"
    slow = 'i=1; while [ $i -le 40 ]; do echo "line $i"; i=$((i+1)); sleep 0.05; done; exit 5'
    # 200,000 lines in bursts: some sit in the pipe, not yet read, when the keeper dies
    bursts = 'for i in $(seq 0 19); do seq $((i*10000+1)) $((i*10000+10000)); sleep 0.1; done'
    with trio.fail_after(scaled(90)):
        async with await spawn_agent(str(state), "-v", "--log-file", str(log)) as client:
            await start(client)
            job = await client.submit("/bin/sh", ["-c", slow], count=2)
            flood = await client.submit("/bin/sh", ["-c", bursts])
            await client.wait_for(lambda: len(lines(client, job)) >= 5, scaled(30), description="the first lines")
            before = keeper_pids(state)
            os.kill(before["keeper"], signal.SIGKILL)
            # a new keeper under the same custodian; the agent is connected to it again
            await client.wait_for(lambda: keeper_pids(state).get("keeper") not in (None, before["keeper"]), scaled(30),
                                  description="a new keeper")
            assert keeper_pids(state)["custodian"] == before["custodian"]
            after = await client.submit("/bin/echo", ["after the keeper died"])
            done_after = await client.wait_job_state(after, "COMPLETED", scaled(30))
            assert done_after.get("jobStatus") == "FINISHED"
            assert lines(client, after) == ["after the keeper died"]

            done = await client.wait_job_state(job, "COMPLETED", scaled(60))
            assert done.get("jobStatus") == "FAILED", done.attributes  # exit status 5, kept
            for rank in (0, 1):
                assert client.job_process(done, rank).get("processExitCode") == "5"
                assert lines(client, done, rank) == [f"line {i}" for i in range(1, 41)], rank
            flooded = await client.wait_job_state(flood, "COMPLETED", scaled(60))
            assert flooded.get("jobStatus") == "FINISHED"
            assert lines(client, flooded) == [str(i) for i in range(1, 200001)]
            assert [m.text for m in client.messages] == []  # replaced at once: nothing to tell
            assert client.violations == []
            keys = {"job": client.job_key(job), "flood": client.job_key(flood), "after": client.job_key(after)}
            await client.quit()
    # the kept output too has every line once, in order, though the keeper that read them died
    for rank in (0, 1):
        assert read_job_output(str(state), keys["job"], rank=rank).text() == "".join(
            f"line {i}\n" for i in range(1, 41)), rank
    flooded_kept = read_job_output(str(state), keys["flood"])
    assert flooded_kept.dropped() == 0 and flooded_kept.text() == "".join(f"{i}\n" for i in range(1, 200001))
    assert read_job_output(str(state), keys["after"]).text() == "after the keeper died\n"
    text = log.read_text()
    assert "the keeper of the local jobs ended; reconnecting" in text
    reconnected = [line for line in text.splitlines() if "reconnected to the keeper of the local jobs after" in line]
    assert len(reconnected) == 1, text
    print(reconnected[0])
    keeper_log = (state / "local" / "keeper.log").read_text()
    assert "Traceback" not in keeper_log and "ended (killed by signal 9)" in keeper_log


async def test_a_job_no_keeper_can_take_back_is_reported_failed_with_the_reason(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(scaled(60)):
        async with await spawn_agent(str(state)) as client:
            await start(client)
            job = await client.submit("/bin/sleep", ["300"])
            running = await client.wait_job_state(job, "RUNNING", scaled(30))
            pid = int(client.job_process(running, 0).get("processPID"))
            pids = keeper_pids(state)
            os.kill(pids["custodian"], signal.SIGKILL)  # nothing is left to hold the job...
            while alive(pids["custodian"]):
                await trio.sleep(0.01)
            os.kill(pids["keeper"], signal.SIGKILL)  # ...when its keeper dies
            done = await client.wait_job_state(job, "COMPLETED", scaled(30))
            assert done.get("jobStatus") == "FAILED"
            message = done.get("jobStatusMessage")
            assert "the keeper and the custodian that ran the job both ended" in message, message
            assert "1 of its processes still running were ended" in message, message
            await wait_until(lambda: not alive(pid), what="the job's process, not to be left running")
            # the agent goes on with the new keeper
            later = await client.submit("/bin/echo", ["still serving"])
            assert (await client.wait_job_state(later, "COMPLETED", scaled(30))).get("jobStatus") == "FINISHED"
            await client.quit()


async def test_a_full_disk_drops_output_counted_refuses_new_jobs_and_the_job_runs_on(tmp_path):
    total = 400_000  # about 2.7 MB of lines, on a disk with 1.5 MiB free
    with small_disk(tmp_path / "disk", "8m") as disk:
        state = disk / "state"
        filler = None
        try:
            with trio.fail_after(scaled(120)):
                async with await spawn_agent(str(state)) as client:
                    await start(client)
                    warm = await client.submit("/bin/echo", ["ready"])
                    await client.wait_job_state(warm, "COMPLETED", scaled(30))
                    keeper = keeper_pids(state)
                    filler = fill(disk, leave=3 << 19)
                    # writes its lines, waits to be told the disk is full, then ends normally
                    gate = tmp_path / "go-on"
                    script = f'seq 1 {total}; while [ ! -e "{gate}" ]; do sleep 0.05; done; exit 0'
                    job = await client.submit("/bin/sh", ["-c", script])
                    await client.wait_for(lambda: any("has no room for the output" in m.text for m in client.messages),
                                          scaled(60), description="the notice that output is dropped")
                    refused = None
                    try:
                        await client.submit("/bin/echo", ["refused"])
                    except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
                        refused = str(exc)
                    assert refused is not None and ("space" in refused or "full" in refused), refused
                    gate.touch()
                    done = await client.wait_job_state(job, "COMPLETED", scaled(60))
                    assert done.get("jobStatus") == "FINISHED", done.attributes  # it ran on, unharmed
                    got = lines(client, done)
                    notes = lines(client, done, stream="stderr")
                    assert notes and all("were dropped here" in note for note in notes), notes
                    dropped = sum(int(note.split()[1]) for note in notes)
                    assert 0 < dropped < total
                    # every line either arrived or was counted (a line cut by the gap may be both)
                    assert total - 2 <= len(got) + dropped <= total + 2 * len(notes), (len(got), dropped)
                    # in order, but for the pieces of the lines the gaps cut
                    arrived = [int(line) for line in got if line.isdigit()]
                    out_of_order = sum(1 for a, b in zip(arrived, arrived[1:]) if b <= a)
                    assert arrived[0] == 1 and out_of_order <= 2 * len(notes), arrived

                    os.unlink(filler)  # room again: new jobs are accepted
                    filler = None
                    after = None
                    deadline = trio.current_time() + scaled(30)
                    while after is None:
                        try:
                            after = await client.submit("/bin/echo", ["room again"])
                        except Exception:  # noqa: BLE001 - refused until the agent sees the room
                            assert trio.current_time() < deadline, "new jobs still refused with room on the disk"
                            await trio.sleep(0.5)
                    assert (await client.wait_job_state(after, "COMPLETED", scaled(30))).get("jobStatus") == "FINISHED"
                    assert keeper_pids(state) == keeper  # nothing crashed
                    assert client.violations == []
                    await client.quit()
            # (what the keeper logs while the disk is full is lost with the rest)
            assert "Traceback" not in (state / "local" / "keeper.log").read_text()
        finally:
            if filler is not None and filler.exists():
                filler.unlink()
