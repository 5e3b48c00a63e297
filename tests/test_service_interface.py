"""The service interface on ``STATE_DIR/agent.sock``: local tools in the service's own terms
(JobSpec, JobState, job keys, neutral errors), beside PTP sessions on the same socket, against
the real service process (started as a launch starts it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest
import trio

from wait_support import scaled
from agent_fixtures import agent_argv, console_argv, subprocess_env
from proxy_agent.client import AgentClient
from proxy_agent.frontends.api.client import GoneEvent, JobEvent, OutputEvent, ServiceClient
from proxy_agent.frontends.api.terms import spec_from_dict, spec_to_dict
from proxy_agent.frontends.api.wire import Refused, ask, call, socket_path
from proxy_agent.service.jobs import ErrorKind, JobSpec, JobState, ServiceError

DEADLINE = scaled(60)


async def _events(service: ServiceClient, key: int):
    return [event async for event in service.events(key)]


async def test_a_tool_submits_watches_and_ends_jobs_by_their_keys(tmp_path):
    state = str(tmp_path / "state")
    with trio.fail_after(DEADLINE):
        async with ServiceClient.open(state, options=["--scheduler", "local"]) as service:
            assert service.service["schedulers"] == ["local"] and service.not_applied is None
            spec = JobSpec("/bin/sh", ("-c", 'echo "out $PROXY_AGENT_PROCESS_INDEX"; echo err >&2; '
                                             'test "$PROXY_AGENT_PROCESS_INDEX" = 0 || exit 3'),
                           num_procs=2, working_dir=str(tmp_path), client_ref="mine")
            key = await service.submit(spec, watch=True)
            events = await _events(service, key)
            states = [e.state for e in events if isinstance(e, JobEvent)]
            assert states[-1] is JobState.FAILED and JobState.RUNNING in states
            final = events[-1]
            assert [(p.rank, p.exit_code) for p in final.processes] == [(0, "0"), (1, "3")]
            lines = sorted((e.rank, e.stream, e.text) for e in events if isinstance(e, OutputEvent))
            assert lines == [(0, "stderr", "err"), (0, "stdout", "out 0"), (1, "stderr", "err"), (1, "stdout", "out 1")]
            # all output came before the final state
            assert all(isinstance(e, OutputEvent) or e is final or not e.state.final for e in events)
            # ended by its key
            sleeper = await service.submit(JobSpec("/bin/sleep", ("60",)), watch=True)
            async for event in service.events(sleeper):
                if isinstance(event, JobEvent) and event.state is JobState.RUNNING:
                    break
            await service.terminate(sleeper)
            await service.watch(sleeper)
            assert (await _events(service, sleeper))[-1].state is JobState.KILLED
            await service.terminate(sleeper)  # ended already: no error
            # the store keeps both under the same keys
            rows = {row["key"]: row for row in await service.jobs()}
            assert rows[key]["client_ref"] == "mine" and rows[key]["state"] == "FAILED"
            assert rows[sleeper]["state"] == "KILLED"


async def test_neutral_errors_and_a_tool_hears_only_what_it_watches(tmp_path):
    state = str(tmp_path / "state")
    with trio.fail_after(DEADLINE):
        async with ServiceClient.open(state, options=["--scheduler", "local"]) as service:
            with pytest.raises(ServiceError) as caught:
                await service.request("submit", spec={"executable": "/bin/true", "num_procs": "two"})
            assert caught.value.kind is ErrorKind.BAD_REQUEST and "num_procs" in caught.value.message
            with pytest.raises(ServiceError) as caught:
                await service.request("submit", spec={"executable": "/bin/true", "colour": "blue"})
            assert caught.value.kind is ErrorKind.BAD_REQUEST and "colour" in caught.value.message
            with pytest.raises(ServiceError) as caught:
                await service.submit(JobSpec("/no/such/program"))
            assert caught.value.kind is ErrorKind.SUBMIT_FAILED
            with pytest.raises(ServiceError) as caught:
                await service.watch(999_999)
            assert caught.value.kind is ErrorKind.NO_SUCH_JOB
            with pytest.raises(ServiceError) as caught:
                await service.request("frobnicate")
            assert caught.value.kind is ErrorKind.NOT_SUPPORTED
            # a job it does not watch sends it nothing
            other = await service.submit(JobSpec("/bin/echo", ("not mine",)))
            mine = await service.submit(JobSpec("/bin/sh", ("-c", "sleep 0.5; echo mine")), watch=True)
            events = await _events(service, mine)
            assert [e.text for e in events if isinstance(e, OutputEvent)] == ["mine"]
            assert other not in service._inboxes
            # and it still serves
            assert (await _events(service, await service.submit(JobSpec("/bin/true"), watch=True)))[-1].state \
                is JobState.FINISHED


def test_the_first_request_is_hello_in_a_version_both_speak(tmp_path):
    state = str(tmp_path / "state")
    subprocess.run(agent_argv("--state-dir", state), input=b"", env=subprocess_env(), timeout=DEADLINE, check=True)
    path = socket_path(state)
    with pytest.raises(Refused) as caught:
        call(path, {"op": "jobs"})
    assert caught.value.kind == "BAD_REQUEST" and "hello" in caught.value.message
    with pytest.raises(Refused) as caught:
        call(path, {"op": "hello", "version": 99})
    assert caught.value.kind == "NOT_SUPPORTED" and "version 1" in caught.value.message
    reply, _ = call(path, {"op": "hello", "version": 1})
    assert reply["service"]["pid"] != os.getpid() and reply["service"]["schedulers"] == ["local"]
    # a line that is not JSON ends that connection with a word, and nothing else
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(DEADLINE)
        sock.connect(path)
        sock.sendall(b"{not json\n")
        said = b""
        while True:
            data = sock.recv(4096)
            if not data:
                break
            said += data
    assert json.loads(said)["event"] == "error" and "not JSON" in json.loads(said)["message"]
    assert ask(path, "jobs")["jobs"] == []


async def test_a_ptp_client_and_a_tool_share_the_socket(tmp_path):
    state = tmp_path / "state"
    with trio.fail_after(DEADLINE):
        async with ServiceClient.open(str(state), options=["--scheduler", "local"]) as service:
            ptp = await AgentClient.connect_unix(str(state / "agent.sock"))
            async with ptp:
                await ptp.init(base_id=4000)
                await ptp.model_def()
                await ptp.start_events()
                key = await service.submit(JobSpec("/bin/echo", ("both",), client_ref="tool"), watch=True)
                await _events(service, key)
                job = await ptp.wait_for(lambda: ptp.state.jobs_by_sub.get("tool"), DEADLINE, description="the job")
                assert int(job.id) == 4000 + key  # the PTP id: its base id plus the job's key
                done = await ptp.wait_job_state(job, "COMPLETED", DEADLINE)
                assert ptp.job_output(done) == "both\n"
                await ptp.quit()


async def test_output_from_the_files_then_followed(tmp_path):
    state = str(tmp_path / "state")
    go = tmp_path / "go"
    with trio.fail_after(DEADLINE):
        async with ServiceClient.open(state, options=["--scheduler", "local"]) as service:
            ended = await service.submit(JobSpec("/bin/sh", ("-c", "echo a; echo b; echo c >&2")), watch=True)
            await _events(service, ended)
            listed = [e async for e in service.output(ended, streams=["stdout"])]
            assert [e.text for e in listed if isinstance(e, OutputEvent)] == ["a\nb"]
            assert isinstance(listed[-1], GoneEvent)
            running = await service.submit(
                JobSpec("/bin/sh", ("-c", f'echo before; while [ ! -e "{go}" ]; do sleep 0.05; done; echo after')),
                watch=True)
            async for event in service.events(running):
                if isinstance(event, OutputEvent):
                    break
            followed = []
            async for event in service.output(running, follow=True):
                followed.append(event)
                if isinstance(event, OutputEvent) and event.text == "before":
                    go.touch()
            texts = [e.text for e in followed if isinstance(e, OutputEvent)]
            assert texts == ["before", "after"], followed  # each line once, files first
            assert isinstance(followed[-1], JobEvent) and followed[-1].state is JobState.FINISHED


def test_the_job_list_and_kept_output_are_asked_of_the_running_service(tmp_path):
    state = tmp_path / "state"
    done = subprocess.run(console_argv("-q", "-c", "submit --wait /bin/echo kept-line", "--spawn",
                                       *agent_argv("--state-dir", str(state))),
                          capture_output=True, text=True, env=subprocess_env(), timeout=DEADLINE)
    assert done.returncode == 0, done.stderr
    # the service runs; without its store file a reader of the store finds nothing
    store = state / "jobs.sqlite"
    os.rename(store, state / "aside.sqlite")
    try:
        listed = subprocess.run(agent_argv("jobs", "--state-dir", str(state), "--json"), capture_output=True,
                                text=True, env=subprocess_env(), timeout=DEADLINE)
        assert listed.returncode == 0, listed.stderr
        (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert row["name"] == "echo" and row["state"] == "FINISHED"
        printed = subprocess.run(agent_argv("output", "--state-dir", str(state), str(row["id"])), capture_output=True,
                                 text=True, env=subprocess_env(), timeout=DEADLINE)
        assert (printed.returncode, printed.stdout) == (0, "kept-line\n"), printed.stderr
        unknown = subprocess.run(agent_argv("output", "--state-dir", str(state), "12345"), capture_output=True,
                                 text=True, env=subprocess_env(), timeout=DEADLINE)
        assert unknown.returncode == 1 and "12345" in unknown.stderr and "Traceback" not in unknown.stderr
        forgot = subprocess.run(agent_argv("forget", "--state-dir", str(state), "12345"), capture_output=True,
                                text=True, env=subprocess_env(), timeout=DEADLINE)
        assert forgot.returncode == 1 and "no job 12345 in the list" in forgot.stderr
    finally:
        os.rename(state / "aside.sqlite", store)


def test_job_descriptions_cross_the_wire_unchanged():
    spec = JobSpec("/bin/prog", ("a", "b c"), environment=(("A", "1"),), working_dir="/tmp", num_procs=3,
                   queue="local:default", candidates=("x", "y"), broker="Null", name="n", hold=True,
                   client_ref="r", account="acc", wall_time=60, memory=100, nodes=2, exclusive=True,
                   prologue=("p",), native_options=("--x",), extra=(("k", "v"),))
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec
    assert spec_to_dict(JobSpec("/bin/true")) == {"executable": "/bin/true"}


async def test_following_output_sends_each_line_once_whether_from_the_files_or_kept(tmp_path):
    state = str(tmp_path / "state")
    go = tmp_path / "go"
    script = f'echo x1; while [ ! -e "{go}" ]; do sleep 0.05; done; echo x2'
    with trio.fail_after(DEADLINE):
        async with ServiceClient.open(state, options=["--scheduler", "local"]) as service:
            key = await service.submit(JobSpec("/bin/sh", ("-c", script)))  # nobody watches it
            while True:  # until its first line is in its file (and, soon after, kept by the service)
                listed = [e async for e in service.output(key)]
                if any(isinstance(e, OutputEvent) for e in listed):
                    break
                await trio.sleep(0.05)
            # (by now the service has most likely read it too and keeps it for the next client: either
            # way it must come once)
            await trio.sleep(0.5)
            followed = []
            async for event in service.output(key, follow=True):
                followed.append(event)
                if isinstance(event, OutputEvent):
                    go.touch()
            assert [e.text for e in followed if isinstance(e, OutputEvent)] == ["x1", "x2"], followed
