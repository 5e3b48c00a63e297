"""proxy-console end to end: the real console driving the real agent.

Scripted runs (-c / --script) against the local and the simulated scheduler,
--json and --trace output, the error lines and exit statuses a person relies
on, and an interactive session typed into a real pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import select
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from agent_fixtures import agent_argv, agent_present, console_argv, free_port, subprocess_env
from wait_support import scaled, wait_until_blocking

if not agent_present():
    pytest.skip("the agent's command line (proxy_agent/__main__.py) is not there yet", allow_module_level=True)

from proxy_agent.console import split_spawn  # noqa: E402
from proxy_agent.console.commands import CommandError, parse_submit, split_commands  # noqa: E402

SIM = ["--spawn", *agent_argv("--scheduler", "sim", "--sim-nodes", "12", "--sim-jobs", "6")]


def console(*args: str, timeout: float = scaled(60), env=None, input_text=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        console_argv(*args),
        input=input_text,
        stdin=None if input_text is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or subprocess_env(),
    )


# --------------------------------------------------------------------------- scripted, local scheduler


def test_submit_wait_shows_output_and_completion():
    run = console("-c", "submit /bin/echo hello --wait")
    assert run.returncode == 0, run.stderr
    job = re.search(r"submitted job (\d+)", run.stdout).group(1)
    assert f"[{job}.0] hello" in run.stdout
    assert f"job {job} echo COMPLETED FINISHED (exit status 0)" in run.stdout
    assert run.stdout.count("hello") == 1  # shown once, live
    assert "connected to agent" in run.stderr and "Traceback" not in run.stderr


def test_a_failing_command_ends_the_script_and_is_named():
    run = console("-c", "jobs; submit -q nosuch /bin/true; queues")
    assert run.returncode == 1
    assert "proxy-console: command 2 failed: submit -q nosuch /bin/true:" in run.stderr
    assert "no queue named 'nosuch'" in run.stderr  # the agent's own words
    assert "default" not in run.stdout.split("no jobs", 1)[1]  # 'queues' never ran
    assert "Traceback" not in run.stderr
    unknown = console("-c", "terminate 999999; queues")
    assert unknown.returncode == 1
    assert "proxy-console: command 1 failed: terminate 999999: no job 999999" in unknown.stderr


def test_a_failing_job_fails_submit_wait():
    run = console("-c", "submit -e CODE=3 /bin/sh -c 'echo to stderr >&2; exit $CODE' --wait")
    assert run.returncode == 3  # the job's own exit status, as sbatch --wait gives it
    assert "err] to stderr" in run.stdout
    assert "COMPLETED FAILED (exit status 3)" in run.stdout
    assert "command 1 failed: submit" in run.stderr


def test_unknown_command_and_bad_usage_fail_cleanly():
    run = console("-c", "frobnicate")
    assert run.returncode == 1
    assert "unknown command 'frobnicate'" in run.stderr
    run = console("-c", "submit -n zero /bin/true")
    assert run.returncode == 1 and "needs a positive number" in run.stderr


def test_script_file_with_comments_and_several_jobs(tmp_path):
    script = tmp_path / "commands.txt"
    script.write_text(
        textwrap.dedent(
            f"""\
            # two jobs, one with three processes
            submit --sub-id first -n 3 -d /tmp /bin/sh -c 'echo "$PROXY_AGENT_PROCESS_INDEX in $(pwd)"' --wait
            submit --sub-id second /bin/sleep 600
            wait second RUNNING -t {scaled(60):g}; terminate second
            wait second KILLED -t {scaled(60):g}
            show second
            output first
            jobs
            """
        )
    )
    run = console("--script", str(script))
    assert run.returncode == 0, run.stderr
    for index in range(3):
        assert re.search(rf"\[\d+\.{index}\] {index} in /tmp", run.stdout)
    assert "COMPLETED KILLED" in run.stdout
    assert "processSignalName = " not in run.stdout  # show lists the job's attributes, not the process's
    assert re.search(r"child: process \d+\.0 COMPLETED", run.stdout)
    table = run.stdout[run.stdout.rindex("ID "):]
    assert "first" in table and "second" in table and "KILLED" in table


def test_stop_and_start_deliver_held_output():
    run = console("-c", "stop; submit --sub-id quiet /bin/echo while stopped; sleep 0.5; jobs; start; wait quiet; output quiet")
    assert run.returncode == 0, run.stderr
    assert "events are stopped, its job id arrives with 'start'" in run.stdout
    assert "events started" in run.stdout
    assert re.search(r"\[\d+\.0\] while stopped", run.stdout)


def test_manual_session_and_raw_commands():
    run = console("--manual", "-c", "raw 0x77; init 500; modeldef; raw 2; start; raw --tid 5 2; machines; raw 4; quit")
    assert run.returncode == 0, run.stderr
    assert "ERROR (TID 1): unknown command id 0x0077 (error 2)" in run.stdout
    assert "INIT OK (base id 500)" in run.stdout
    assert re.search(r"MODEL_DEF OK: \d+ attribute definitions", run.stdout)
    assert "OK (TID 4)" in run.stdout
    # a command on the TID of the open START_EVENTS is refused under that TID, which ends the START_EVENTS
    assert "ERROR (TID 5): MODEL_DEF was refused: TID 5 was still in use by an open START_EVENTS" in run.stdout
    assert re.search(r"^501 ", run.stdout, re.M)  # the machine's id comes from the base id
    assert "sent STOP_EVENTS" in run.stdout and "agent shut down" in run.stdout


# --------------------------------------------------------------------------- scripted, simulated cluster


def test_sim_listings():
    run = console("-c", "nodes; queues; jobs; machines", *SIM)
    assert run.returncode == 0, run.stderr
    nodes = re.findall(r"^\d+ +(n\d{5}) +(UP|DOWN) +sim$", run.stdout, re.M)
    assert [name for name, _ in nodes] == [f"n{i:05d}" for i in range(12)]
    assert re.findall(r"^\d+ +(batch|debug|long) +NORMAL +\d+$", run.stdout, re.M) == ["batch", "debug", "long"]
    header = re.search(r"^ID +SUBID +NAME +STATE +STATUS +QUEUE +PROCS$", run.stdout, re.M)
    assert header is not None
    assert re.search(r"^\d+ +sim +UP +12$", run.stdout, re.M)


def test_sim_hold_release_and_move():
    # Without churn the simulated jobs stay as generated, and the same seed generates the
    # same cluster: find a pending job in one run, work on it in the next.
    listing = console("-q", "-c", "jobs", *SIM)
    pending = re.search(r"^(\d+) +\S+ +STARTING +QUEUING +batch +\d+$", listing.stdout, re.M)
    assert pending is not None, listing.stdout
    job = pending.group(1)
    run = console("-c", f"hold {job}; release {job}; move {job} long; jobs; show {job}", *SIM)
    assert run.returncode == 0, run.stderr
    assert f"hold job {job}: OK" in run.stdout and f"move job {job} to long: OK" in run.stdout
    assert re.search(rf"^job {job} \S+ STARTING HOLD\b", run.stdout, re.M)
    assert re.search(rf"^{job} +\S+ +STARTING +QUEUING +long +\d+$", run.stdout, re.M)
    assert "jobStatus = QUEUING" in run.stdout
    # a job that already runs cannot be held: the agent says why, the console names the command
    running = re.search(r"^(\d+) +\S+ +RUNNING +RUNNING ", listing.stdout, re.M).group(1)
    run = console("-q", "-c", f"hold {running}", *SIM)
    assert run.returncode == 1
    assert f"command 1 failed: hold {running}: CHANGE_JOB failed: the job is RUNNING" in run.stderr


# --------------------------------------------------------------------------- --json and --trace


def test_json_output_is_parseable():
    run = console("--json", "-c", "submit /bin/echo hi --wait; jobs; frobnicate")
    assert run.returncode == 1
    records = [json.loads(line) for line in run.stdout.splitlines()]
    kinds = {r["type"] for r in records}
    assert {"connected", "event", "result"} <= kinds
    submit = next(r for r in records if r["type"] == "result" and r["command"] == "submit")
    assert submit["ok"] and submit["stdout"] == "hi\n" and submit["state"] == "COMPLETED" and submit["exit_codes"] == [0]
    jobs = next(r for r in records if r["type"] == "result" and r["command"] == "jobs")
    assert jobs["jobs"][0]["attributes"]["progArgs"] == ["hi"]
    assert records[-1] == {"type": "result", "command": "frobnicate", "ok": False,
                           "error": "unknown command 'frobnicate' (type 'help' for the list)", "line": "frobnicate"}
    events = [r["event"] for r in records if r["type"] == "event"]
    assert {"NEW_JOB", "PROCESS_CHANGE", "JOB_CHANGE"} <= set(events)
    model = next(r for r in records if r["type"] == "model")  # the model at the start, summed up
    assert model["machines"]["count"] == 1 and model["queues"]["count"] == 1 and model["jobs"]["count"] == 0


def test_trace_shows_every_frame_raw_and_decoded():
    run = console("--trace", "-c", "queues")
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert "-> 00000059 0001:00000001:00000003 0000000B:version=2.0 0000000B:baseId=1000 0000000E:dialect=native" in lines
    assert "   INIT tid=1 version=2.0 baseId=1000 dialect=native" in lines
    assert "<- 00000017 0000:00000001:00000000" in lines
    assert "   OK tid=1" in lines
    assert any(line.startswith("   NEW_QUEUE tid=3 1000 1 ") for line in lines)
    # QUIT at the end: OK for the open START_EVENTS, then SHUTDOWN
    # (TID 4 is the LIST_FILTERS that fences the initial model)
    assert "   LIST_FILTERS tid=4" in lines
    quit_ = lines.index("-> 00000017 0000:00000005:00000000")
    assert lines[quit_ + 1] == "   QUIT tid=5"
    assert lines[quit_ + 2:quit_ + 6] == [
        "<- 00000017 0000:00000003:00000000",
        "   OK tid=3",
        "<- 00000017 0006:00000005:00000000",
        "   SHUTDOWN tid=5",
    ]


def test_trace_with_json_is_json_too():
    run = console("--trace", "--json", "-q", "-c", "nodes")
    records = [json.loads(line) for line in run.stdout.splitlines()]
    traces = [r for r in records if r["type"] == "trace"]
    assert traces[0]["direction"] == "out" and traces[0]["decoded"] == "INIT tid=1 version=2.0 baseId=1000 dialect=native"
    assert not any(r["type"] == "event" for r in records)  # -q


# --------------------------------------------------------------------------- what goes wrong


def test_agent_exiting_shows_the_tail_of_its_stderr():
    script = "import sys; sys.stderr.write('starting\\nno scheduler configured\\n'); sys.exit(5)"
    run = console("-c", "jobs", "--spawn", sys.executable, "-c", script)
    assert run.returncode == 3
    assert "proxy-console: the agent exited with status 5" in run.stderr
    assert "agent| no scheduler configured" in run.stderr
    assert run.stderr.count("no scheduler configured") == 1  # shown as it came, not again with the error
    assert "Traceback" not in run.stderr


def test_agent_that_cannot_be_started():
    run = console("-c", "jobs", "--spawn", "/nonexistent/proxy-agent")
    assert run.returncode == 3
    assert run.stderr.strip() == "proxy-console: cannot start the agent '/nonexistent/proxy-agent': No such file or directory"


def test_cannot_connect_names_the_cause():
    run = console("--connect", f"127.0.0.1:{free_port()}", "-c", "jobs")
    assert run.returncode == 3
    assert "cannot connect to 127.0.0.1:" in run.stderr and "refused" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_protocol_violation_by_the_agent_is_reported():
    # an "agent" that answers INIT, then sends an event under a TID nobody opened
    script = textwrap.dedent(
        """\
        import os, sys
        from proxy_agent.protocol.wire import Decoder, encode_frame
        decoder = Decoder()
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            decoder.feed(data)
            for frame in decoder:
                os.write(1, encode_frame(0, frame.tid))
                os.write(1, encode_frame(0, 4242))
        """
    )
    run = console("-c", "jobs", "--spawn", sys.executable, "-c", script)
    assert run.returncode == 4
    assert "proxy-console: protocol violation by the agent: OK with TID 4242, which matches no open command" in run.stderr


def test_token_refused_and_accepted(tmp_path):
    token_file = tmp_path / "token"
    port = free_port()
    agent = subprocess.Popen(
        agent_argv("--listen", f"127.0.0.1:{port}", "--token-file", str(token_file)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        line = agent.stderr.readline()
        assert "listening on" in line, line
        wait_until_blocking(token_file.exists, what="the token file")
        wrong = tmp_path / "wrong"
        wrong.write_text("not the token\n")
        run = console("--connect", f"127.0.0.1:{port}", "--token-file", str(wrong), "-c", "jobs")
        assert run.returncode == 3
        assert "proxy-console: token refused by the agent: authentication failed: wrong token" in run.stderr
        run = console("--connect", f"127.0.0.1:{port}", "--token-file", str(token_file), "-c", "nodes; quit")
        assert run.returncode == 0, run.stderr
        assert "agent shut down" in run.stdout  # the session's SHUTDOWN; the agent serves on
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(scaled(30)) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


# --------------------------------------------------------------------------- interactive, in a pseudo-terminal


class Screen:
    """The console running on a pseudo-terminal; ``expect`` reads until a string shows up."""

    def __init__(self, tmp_path) -> None:
        self.master, slave = os.openpty()

        def controlling_tty() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = subprocess_env(TERM="dumb", HOME=str(tmp_path), COLUMNS="120", LINES="40")
        self.process = subprocess.Popen(
            console_argv(), stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=controlling_tty, close_fds=True
        )
        os.close(slave)
        self.seen = ""
        self.pending = b""

    def expect(self, text: str, timeout: float = scaled(30)) -> str:
        deadline = time.time() + timeout
        while text not in self.pending.decode("utf-8", "replace"):
            remaining = deadline - time.time()
            if remaining <= 0:
                raise AssertionError(f"{text!r} did not appear; screen so far:\n{self.pending.decode(errors='replace')}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    self.pending += os.read(self.master, 65536)
                except OSError:  # the console exited and the terminal closed
                    break
        decoded = self.pending.decode("utf-8", "replace")
        if text not in decoded:
            raise AssertionError(f"{text!r} did not appear; screen so far:\n{decoded}")
        cut = decoded.index(text) + len(text)
        shown, rest = decoded[:cut], decoded[cut:]
        self.pending = rest.encode()
        self.seen += shown
        return shown

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(scaled(30))
        os.close(self.master)


def test_interactive_session_on_a_terminal(tmp_path):
    screen = Screen(tmp_path)
    try:
        screen.expect("proxy> ")
        screen.type("help\n")
        shown = screen.expect("proxy> ")
        assert "submit [OPTIONS]" in shown and "terminate JOB" in shown
        screen.type("submit /bin/echo hello from a tty --wait\n")
        shown = screen.expect("proxy> ")
        job = re.search(r"submitted job (\d+)", shown).group(1)
        assert f"[{job}.0] hello from a tty" in shown and "COMPLETED FINISHED (exit status 0)" in shown
        screen.type("jo\t\n")  # tab completes the command name
        shown = screen.expect("proxy> ")
        assert re.search(rf"{job} +sub-\d+-1 +echo +COMPLETED", shown)
        screen.type("submit /bin/sh -c 'echo started; sleep 300'\n")
        screen.expect("] started")  # the job's output, shown as it comes
        screen.type("output .\n")
        screen.expect("output .")
        screen.expect("] started")  # shown again by 'output', which now follows the job
        screen.type("\x03")  # Ctrl-C stops following, not the console
        screen.expect("interrupted")
        screen.expect("proxy> ")
        # (events keep arriving and redraw the prompt: wait for the words, not a prompt)
        screen.type("terminate .\n")
        screen.expect("KILLED")
        screen.type("bogus\n")
        screen.expect("unknown command 'bogus'")
        screen.type("quit\n")
        screen.expect("agent shut down")
        assert screen.process.wait(scaled(30)) == 0
    finally:
        screen.close()
    assert "Traceback" not in screen.seen
    assert (tmp_path / ".proxy_console_history").exists()


# --------------------------------------------------------------------------- parsing


def test_command_splitting():
    assert split_commands("jobs; submit /bin/echo 'a;b' c\n# comment\nquit") == [
        ["jobs"],
        ["submit", "/bin/echo", "a;b", "c"],
        ["quit"],
    ]
    with pytest.raises(CommandError):
        split_commands("submit 'unterminated")


def test_submit_parsing():
    request = parse_submit(["-n", "2", "-e", "A=1", "--queue=debug", "jobName=x", "ls", "-d", "/tmp", "--wait"])
    assert (request.executable, request.args, request.count, request.env, request.queue, request.wait) == (
        "ls", ["-d", "/tmp"], 2, ["A=1"], "debug", True
    )
    assert request.attributes == {"jobName": "x"}
    with pytest.raises(CommandError, match="needs an executable"):
        parse_submit(["-n", "2"])


def test_spawn_takes_the_rest_of_the_line():
    assert split_spawn(["-c", "--spawn", "--trace", "--spawn", "ssh", "host", "proxy-agent", "-v"]) == (
        ["-c", "--spawn", "--trace"],
        ["ssh", "host", "proxy-agent", "-v"],
    )


def test_event_lines_find_processes_by_job_and_rank():
    from proxy_agent.client import ClientState
    from proxy_agent.console.render import event_lines
    from proxy_agent.protocol.messages import CommandId, ElementGroup, ElementKind, NewElements, Ok, ProcessChange
    from proxy_agent.protocol.rangeset import RangeSet

    state = ClientState()
    init, _ = state.send(CommandId.INIT, ["version=2.0", "baseId=1000", "dialect=native"])
    start, _ = state.send(CommandId.START_EVENTS)
    events = [
        Ok(init.tid),
        NewElements(start.tid, ElementKind.QUEUE, "1000", [ElementGroup(RangeSet.parse("1002"), [("name", "q")])]),
        NewElements(start.tid, ElementKind.JOB, "1002", [ElementGroup(RangeSet.parse("5000-5001"), [("name", "j")])]),
        # rank 0 of two jobs: two processes
        NewElements(start.tid, ElementKind.PROCESS, "5000", [ElementGroup(RangeSet.parse("0"), [("processState", "RUNNING")])]),
        NewElements(start.tid, ElementKind.PROCESS, "5001", [ElementGroup(RangeSet.parse("0"), [("processIndex", "0")])]),
        ProcessChange(start.tid, "5001", [ElementGroup(RangeSet.parse("0"), [("processExitCode", "3")])]),
    ]
    lines = [line for t in state.receive_data(b"".join(e.encode() for e in events)) if t.message is not None
             for line in event_lines(state, t.message)]
    # a job by its id (element id less the base id), as every other tool names it
    assert lines[-3:] == ["process 4000.0 RUNNING new", "process 4001.0 new", "process 4001.0 exited with status 3"]
    assert state.violations == []


def test_submit_parsing_several_queues_and_a_broker():
    request = parse_submit(["-q", "sim:batch,sim:debug", "--broker", "FastestQueue", "true"])
    assert (request.queue, request.attributes) == ("sim:batch,sim:debug", {"broker": "FastestQueue"})
    request = parse_submit(["--broker=Random:3", "-b", "Null", "true"])
    assert request.attributes == {"broker": "Null"}
    with pytest.raises(CommandError, match="--broker needs a value"):
        parse_submit(["--broker"])
