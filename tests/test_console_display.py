"""What the console shows, and what it refuses: event order and values, hostile text, --json
records, warnings for unknown attributes and states, the agent's log, prompts, a dying agent.

In-process tests play the agent with FakeAgent over a memory stream, so that several events
arrive in one read (the case where the mirror is already ahead of the event being shown).
The rest run the real console against the real agent, as subprocesses or on a terminal.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time

import trio
import trio.testing

from agent_fixtures import FakeAgent, agent_argv, console_argv, ids, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient
from proxy_agent.console import render
from proxy_agent.console.commands import Console
from proxy_agent.console.terminal import Output
from proxy_agent.protocol.messages import ElementChange, ElementGroup, ElementKind, NewElements, ProcessChange
from test_console import Screen

HOSTILE_NAME = "evil\x1b[2J\x1b]0;owned\x07\x1e\x1f\nforged-row  x"


def console(*args: str, timeout: float = scaled(60), env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        console_argv(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout, env=env or subprocess_env(),
    )


def burst(tid: int):
    """One job's whole life, as the agent might send it in a single write."""
    job = ids("1010")
    return [
        NewElements(tid, ElementKind.JOB, "1002", [ElementGroup(job, [
            ("name", HOSTILE_NAME), ("jobSubId", "sub-x"), ("jobState", "STARTING"), ("jobStatus", "QUEUING")])]),
        ElementChange(tid, ElementKind.JOB, [ElementGroup(job, [("jobState", "RUNNING"), ("jobStatus", "RUNNING")])]),
        NewElements(tid, ElementKind.PROCESS, "1010", [ElementGroup(ids("0"), [
            ("processState", "RUNNING")])]),
        ProcessChange(tid, "1010", [ElementGroup(ids("0"), [("processStdout", "first\nsecond\x1b[31m")])]),
        ProcessChange(tid, "1010", [ElementGroup(ids("0"), [("processExitCode", "0"), ("processState", "COMPLETED")])]),
        ElementChange(tid, ElementKind.JOB, [ElementGroup(job, [("jobState", "COMPLETED"), ("jobStatus", "FINISHED")])]),
    ]


async def console_with_burst(json_mode: bool):
    """A console that took in :func:`burst` in one read; returns (console, stdout text)."""
    client_stream, agent_stream = trio.testing.memory_stream_pair()
    fake = FakeAgent(agent_stream)
    stdout, stderr = io.StringIO(), io.StringIO()
    client = AgentClient.from_stream(client_stream)
    async with client:
        shell = Console(client, Output(json_mode=json_mode, stdout=stdout, stderr=stderr))
        tid = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(shell.startup)
            tid = await fake.handshake()
        await fake.send(*burst(tid))
        await client.wait_for(lambda: (client.find_job("1010") or client.rm).state == "COMPLETED", scaled(30))
        await shell.execute(["jobs"])
        await shell.execute(["wait", "10", "FINISHED"])  # job 10: element id 1010 less the base id 1000
        await shell.execute(["wait", "10", "QUEUING"])
    return shell, stdout.getvalue(), stderr.getvalue()


async def test_events_show_in_order_with_the_values_they_carried():
    _, out, _ = await console_with_burst(json_mode=False)
    lines = out.splitlines()
    shown = [i for i, line in enumerate(lines) if line.startswith(("job 10 ", "[10.0]", "process 10.0"))]
    events = [lines[i] for i in shown]
    assert re.match(r"job 10 'evil\\x1b\[2J.*' STARTING QUEUING new \(sub-x\)$", events[0]), events[0]
    assert re.match(r"job 10 .* RUNNING$", events[1]), events[1]  # not COMPLETED: the value it carried
    assert events[2] == "process 10.0 RUNNING new"
    assert events[3:5] == ["[10.0] first", "[10.0] second\\x1b[31m"]  # output where it came
    assert events[5] == "process 10.0 exited with status 0"
    assert re.match(r"job 10 .* COMPLETED FINISHED$", events[6]), events[6]


async def test_hostile_text_cannot_move_the_cursor_or_forge_a_row():
    _, out, _ = await console_with_burst(json_mode=False)
    assert not any(ord(c) < 0x20 and c != "\n" for c in out)  # no raw control character at all
    table = out[out.index("ID "):].splitlines()
    rows = [line for line in table if re.match(r"^\d+ ", line)]
    assert len(rows) == 1 and "forged-row" in rows[0]  # the newline did not start a row
    assert "\\x1b[2J\\x1b]0;owned\\x07\\x1e\\x1f\\nforged-row" in rows[0]
    assert "job 10 reached FINISHED" in out and "job 10 reached QUEUING" in out


async def test_json_escapes_as_json_does_and_keeps_numbers_as_numbers():
    _, out, _ = await console_with_burst(json_mode=True)
    assert "\x1b" not in out and "\x07" not in out and "\\u001b" in out
    records = [json.loads(line) for line in out.splitlines()]
    jobs = next(r for r in records if r.get("command") == "jobs")
    job = jobs["jobs"][0]
    assert job["id"] == 10 and job["parent"] == 1002  # a job by its id, the queue by its element id
    assert job["attributes"]["name"] == HOSTILE_NAME  # exact text back after decoding
    events = [r for r in records if r["type"] == "event"]
    assert [e["event"] for e in events[-6:]] == ["NEW_JOB", "JOB_CHANGE", "NEW_PROCESS", "PROCESS_CHANGE", "PROCESS_CHANGE", "JOB_CHANGE"]
    exit_event = events[-2]
    assert exit_event["job"] == 1010 and exit_event["groups"]  # event records keep the wire's ids[0]["attributes"]["processExitCode"] == 0
    assert events[-6]["groups"][0]["attributes"]["jobState"] == "STARTING"  # carried, not current
    results = [r for r in records if r["type"] == "result"]
    assert [r["command"] for r in results] == ["jobs", "wait", "wait"]


def test_render_visible_escapes_every_control_and_format_character():
    assert render.visible("a\x00b\x7fc\x9bd\u202ee\u2028f\tg") == "a\\x00b\\x7fc\\x9bd\\u202ee\\u2028f\\tg"
    assert render.visible("tab\tkept", keep_tab=True) == "tab\tkept"
    assert render.visible("plain café ü") == "plain café ü"
    assert json.loads(render.json_text({"t": "x\x9b\u2028\U000e0001"})) == {"t": "x\x9b\u2028\U000e0001"}
    assert not any(render.visible(chr(c)) == chr(c) for c in list(range(0x20)) + list(range(0x7F, 0xA0)))


# --------------------------------------------------------------------------- commands, with the real agent


def test_json_has_one_result_per_command_with_numbers():
    run = console("--json", "-q", "-c", "jobs; submit /bin/true --wait; wait .; submit /bin/sh -c 'exit 3' --wait; nodes")
    assert run.returncode == 3  # the failed job's own exit status
    records = [json.loads(line) for line in run.stdout.splitlines()]
    results = [r for r in records if r["type"] == "result"]
    assert [r["command"] for r in results] == ["jobs", "submit", "wait", "submit"]  # 'nodes' never ran
    ok, waited, failed = results[1], results[2], results[3]
    assert ok["ok"] is True and isinstance(ok["job"], int) and ok["exit_codes"] == [0]
    assert waited["job"] == ok["job"] and waited["state"] == "COMPLETED"
    assert failed["ok"] is False and failed["exit_codes"] == [3] and failed["failed"] is True
    assert failed["exit_status"] == 3
    assert "did not succeed" in failed["error"]


def test_unknown_job_attributes_get_a_warning_with_the_nearest_name():
    run = console("-q", "-c", "submit jobNmae=x flavour=big /bin/true --wait")
    assert run.returncode == 0, run.stderr
    assert "warning: submit: unknown job attribute 'jobNmae' (did you mean 'jobName'?)" in run.stderr
    assert "warning: submit: unknown job attribute 'flavour'; sent as given" in run.stderr
    quiet = console("-q", "-c", "submit jobName=x /bin/true --wait")
    assert "warning" not in quiet.stderr


def test_wait_refuses_an_unknown_state_at_once(tmp_path):
    run = console("-q", "-c", "submit /bin/sleep 600; wait . FINSHED; jobs")  # not a wait for the job's end
    assert run.returncode == 1
    assert "wait: unknown state 'FINSHED' (did you mean FINISHED?)" in run.stderr
    for name in ("STARTING", "COMPLETED", "QUEUING", "HOLD", "KILLED"):
        assert name in run.stderr  # the legal names are listed
    # states already passed count: the job runs until it has been seen RUNNING, then ends
    go = tmp_path / "go"
    run = console("-q", "-c", f"submit --sub-id s /bin/sh -c 'while [ ! -e {go} ]; do sleep 0.1; done'; "
                              f"wait s RUNNING; submit /bin/touch {go}; wait s finished; wait s STARTING; wait s RUNNING")
    assert run.returncode == 0, run.stderr
    assert "job" in run.stdout and "reached FINISHED" in run.stdout
    run = console("-q", "-c", f"submit /bin/sh -c 'exit 3'; wait . FINISHED -t {scaled(60):g}")
    assert run.returncode == 1
    assert re.search(r"job \d+ ended without reaching FINISHED \(went .*FAILED\)", run.stderr), run.stderr


def test_the_agents_log_is_shown_or_written_to_a_named_file(tmp_path):
    run = console("-q", "-c", "submit /bin/true --wait", "--spawn", *agent_argv("-v"))
    assert run.returncode == 0, run.stderr
    assert re.search(r"^agent\| .* INFO ", run.stderr, re.M)
    log = tmp_path / "agent.log"
    run = console("-q", "--agent-log", str(log), "-c", "submit /bin/true --wait", "--spawn", *agent_argv("-v"))
    assert run.returncode == 0, run.stderr
    assert f"the agent's log goes to {log}" in run.stderr
    assert "agent|" not in run.stderr
    assert " INFO " in log.read_text()


def test_version_and_help_with_defaults():
    run = console("--version")
    assert re.fullmatch(r"proxy-console \d+\.\d+\.\d+\n", run.stdout)
    text = console("--help").stdout
    assert "--base-id N" in text and "(default: 1000)" in text
    assert "300 s in scripts" in text
    assert "--ssh [USER@]HOST" in text and "deploy" in text


def test_bad_option_values_give_one_line_and_status_2():
    for args, words in ((["--base-id", "-5"], "--base-id"), (["--timeout", "0"], "--timeout"), (["--ssh-port", "99999"], "--ssh-port"),
                        (["--no-such-option"], "--no-such-option"), (["deploy"], "[USER@]HOST"),
                        (["deploy", "host", "--ssh-port", "0"], "--ssh-port")):
        run = console(*args, "-c", "jobs") if args[0] != "deploy" else console(*args)
        assert run.returncode == 2
        (line,) = run.stderr.splitlines()  # one line, no usage block
        assert line.startswith("proxy-console") and words in line and "--help" in line


# --------------------------------------------------------------------------- on a terminal


def test_prompt_and_escapes_stay_off_a_stdout_that_is_not_a_terminal(tmp_path):
    master, slave = os.openpty()
    out_file = tmp_path / "out.txt"
    with open(out_file, "w") as stdout:
        process = subprocess.Popen(
            console_argv(), stdin=slave, stdout=stdout, stderr=slave,
            env=subprocess_env(TERM="dumb", HOME=str(tmp_path)), close_fds=True, start_new_session=True,
        )
        os.close(slave)
        seen = b""
        try:
            deadline = time.time() + scaled(60)
            while b"proxy> " not in seen and time.time() < deadline:
                seen += os.read(master, 65536)
            os.write(master, b"submit /bin/echo to-a-file --wait\n")
            while seen.count(b"proxy> ") < 2 and time.time() < deadline:
                seen += os.read(master, 65536)
            os.write(master, b"quit\n")
            assert process.wait(scaled(30)) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            os.close(master)
    text = out_file.read_text()
    assert "to-a-file" in text and "agent shut down" in text
    assert "proxy> " not in text and "\x1b" not in text and "\r" not in text
    assert b"proxy> " in seen  # the prompt went to the terminal (stderr)


def test_interactive_console_notices_at_once_when_the_agent_dies(tmp_path):
    screen = Screen(tmp_path)
    try:
        shown = screen.expect("proxy> ")
        pid = int(re.search(r"connected to agent \(pid (\d+)\)", shown).group(1))
        os.kill(pid, signal.SIGKILL)
        screen.expect("proxy-console: the agent was killed by SIGKILL")  # without anything typed
        assert screen.process.wait(scaled(30)) == 3
    finally:
        screen.close()
    assert "Traceback" not in screen.seen


def test_the_opening_model_is_a_few_lines_however_big_the_cluster():
    sim = agent_argv("--scheduler", "sim", "--sim-jobs", "5000", "--sim-nodes", "200", "--sim-time-scale", "1000")
    run = console("-c", "sleep 0", "--spawn", *sim, timeout=scaled(120))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 4, lines[:20]
    assert lines[0] == "machines: 1 (1 UP)" and lines[1].startswith("nodes: 200 (")
    assert lines[2].startswith("queues: ") and re.match(r"jobs: 5000 \(\d+ RUNNING, .*\); \d+ processes$", lines[3])
    as_json = console("--json", "-c", "sleep 0", "--spawn", *sim, timeout=scaled(120))
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    kinds = [r["type"] if r["type"] != "event" else r["event"] for r in records]
    assert kinds == ["ATTR_DEF"] * kinds.count("ATTR_DEF") + ["model", "connected", "result"], kinds
    model = records[kinds.index("model")]
    assert model["jobs"]["count"] == 5000 and model["nodes"]["count"] == 200
