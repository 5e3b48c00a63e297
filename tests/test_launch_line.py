"""What the launched process reads of its command line by itself (without argparse or the
agent) is what the agent's full reading makes of it, for any command line it accepts; what it
cannot read is left to the full reading."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.__main__ import CommandLineError, check_arguments, parse_arguments
from proxy_agent.launch import LaunchLine, read_command_line

#: Words of command lines: options with their values, as people and the IDE write them.
WORDS = [
    ["--stdio"], ["--connect", "h:1"], ["--connect=h:2"], ["--listen", "9000"], ["--listen=127.0.0.1:0"],
    ["--unix", "/tmp/s"], ["--proxy=tcp", "--host=h", "--port=4"], ["--proxy", "tcp", "--host", "h", "--port", "5"],
    ["--host", "h"], ["--debug", "1"], ["--debug=2"], ["--state-dir", "/tmp/x y"], ["--state-dir="],
    ["--token-file", "/tmp/t"], ["--log-file", "/tmp/log"], ["-v"], ["-vv"], ["--verbose"], ["--idle-exit", "30"],
    ["--idle-exit=never"], ["--all-users"], ["--scheduler", "local,sim"], ["--scheduler=sim"],
    ["--auth-timeout", "7"], ["--broker", "Null"], ["--runtime-tcp", "none"], ["--sim-nodes", "4"],
    ["--sim-nodes=3"], ["--on-disconnect", "keep"], ["--local-kill-grace", "0.5"], ["--slurm-poll-interval", "2"],
    # what the launch leaves to the full reading
    ["--std"], ["--state", "/tmp/z"], ["-h"], ["--version"], ["stray"], ["--"], ["-x"], ["--stdio=1"],
    ["--connect"], ["--log-file", "-v"], ["--proxy", "udp"], ["--debug", "x"],
]


def _full(argv):
    """The full reading's LaunchLine, or None when the full reading refuses the line."""
    try:
        args = parse_arguments(list(argv))
        check_arguments(args)
    except (CommandLineError, ValueError, SystemExit):
        return None
    try:
        return LaunchLine.from_arguments(args)
    except SystemExit:
        return None


def _fields(line: LaunchLine):
    return (line.transport, line.address, line.state_dir, line.token_file, line.log_file, line.verbose,
            line.idle_exit)


@settings(max_examples=400)
@given(st.lists(st.sampled_from(WORDS), max_size=6))
def test_the_launch_reads_its_options_as_the_agent_does(words):
    argv = [word for group in words for word in group]
    try:
        mine = read_command_line(argv)
    except SystemExit:  # --proxy=tcp without --host or --port: one line, status 2
        assert _full(argv) is None
        return
    full = _full(argv)
    if mine is not None and full is not None:
        assert _fields(mine) == _fields(full), argv
    if any(word in ("-h", "--version", "--std", "stray", "--", "-x") for word in argv):
        assert mine is None, argv


def test_the_ides_command_line_is_read_without_the_agent():
    line = read_command_line(["--proxy=tcp", "--host=localhost", "--port=4000", "--debug=1", "--scheduler", "slurm"])
    assert line is not None
    assert _fields(line) == ("connect", "localhost:4000", None, None, None, 1, None)
