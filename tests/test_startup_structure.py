"""What start-up leaves out: the modules an agent does not need to answer INIT are loaded only
when something asks for them (a start-up without a bytecode cache compiles every module it
imports).  The figures come from scripts/bench_startup.py; these tests fail if a module that
waits is imported again before the first client's INIT is answered."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy_agent.__main__ import _SimpleLine, _requested_schedulers, build_parser, parse_arguments
from proxy_agent.protocol.messages import CommandId
from proxy_agent.protocol.wire import Decoder, encode_frame

from agent_fixtures import start_up_probe, subprocess_env
from wait_support import scaled

#: Modules an agent serving one stdio client that only sends INIT never loads.
WAITING = (
    "argparse",  # the command line is read without it when it is simple
    "gettext",
    "secrets",  # only --listen makes a token
    "proxy_agent.service.broker",  # the brokers: for the first brokered submission
    "proxy_agent.service.ranking",
    "proxy_agent.protocol.element_events",  # the model's events as objects: clients only
    "proxy_agent.protocol.notices",  # MESSAGE, SHUTDOWN and the job errors: when they are sent
    "proxy_agent.service.coalloc.running",  # what carries out multi-part jobs: with the first one
)


def test_an_agent_answers_init_without_the_modules_that_wait(tmp_path):
    init = encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"])
    done, loaded = start_up_probe(tmp_path, before=[], after=[
        f"found = sorted(m for m in {WAITING!r} if m in sys.modules)",
        "here = 'proxy_agent.service.brokering' in sys.modules and 'proxy_agent.schedulers.local' in sys.modules",
        "open(OUT, 'w').write(repr((here, found)))",
    ], stdin=init)
    decoder = Decoder()
    decoder.feed(done.stdout)
    assert [(frame.msg_id, frame.tid) for frame in decoder] == [(0, 1)]  # the OK for INIT
    assert loaded == "(True, [])"


SIMPLE = [
    [],
    ["--stdio"],
    ["--stdio", "-v", "-v"],
    ["--stdio", "--verbose", "--all-users", "--state-dir", "/tmp/x y", "--log-file=/tmp/log"],
    ["--debug", "2", "--stdio"],
    ["--proxy=tcp", "--host=h", "--port=4"],
    ["--proxy", "tcp", "--host", "h", "--port", "4"],
    ["--connect", "h:1", "--auth-timeout", "7.5"],
    ["--listen", "9000", "--token-file", "/tmp/t"],
    ["--unix", "/tmp/s", "--runtime-tcp", "none", "--runtime-socket", "/tmp/r", "--runtime-advertise", "n"],
    ["--broker", "Random:3", "--broker-config", "f.ini"],
    ["--stdio", "--stdio"],
    ["--stdio", "--local-kill-grace", "0.5", "--on-disconnect=keep"],
    ["--scheduler", "local", "--stdio"],
    ["--scheduler=sim", "--sim-jobs", "5", "--sim-nodes=3"],
    ["--state-dir", ""],
    ["--log-file="],
    ["--scheduler", "local, sim", "--sim-jobs", "3", "--stdio"],
]

#: Lines read by argparse instead (help, abbreviations, run-together or doubtful values,
#: conflicts, mistakes): the messages and exits stay argparse's.
LEFT_TO_ARGPARSE = [
    ["--std"],
    ["-vv"],
    ["--stdio", "--listen", "1"],
    ["--proxy", "udp"],
    ["--debug", "x"],
    ["--debug", "-1"],
    ["--state-dir"],
    ["--state-dir", "-x"],
    ["--stdio=1"],
    ["--version"],
    ["--on-disconnect", "never"],
    ["--local-kill-grace", "soon"],
    ["stray"],
    ["--sim-nodes", "4"],  # another backend's option
]


@pytest.mark.parametrize("argv", SIMPLE)
def test_a_simple_command_line_is_read_as_argparse_reads_it(argv):
    requested = _requested_schedulers(argv)
    assert requested is not None
    simple = _SimpleLine(requested).parse(argv)
    assert simple is not None
    expected, rest = build_parser(requested).parse_known_args(argv)
    assert rest == []
    assert vars(simple) == vars(expected)
    assert vars(parse_arguments(argv)) == dict(vars(expected), parsed_backends=requested)


@pytest.mark.parametrize("argv", LEFT_TO_ARGPARSE)
def test_anything_else_is_left_to_argparse(argv):
    requested = _requested_schedulers(argv) or ["local"]
    assert _SimpleLine(requested).parse(argv) is None


def test_argparse_still_reads_and_refuses_what_the_simple_reading_leaves():
    args = parse_arguments(["--stdio", "-vv", "--sim-nodes", "4"])
    assert (args.verbose, args.sim_nodes, args.parsed_backends[0]) == (2, 4, "local")
    done = subprocess.run([sys.executable, "-m", "proxy_agent", "--stdio", "--listen", "1"], capture_output=True,
                          text=True, env=subprocess_env(), timeout=scaled(60))
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_the_names_that_moved_are_the_same_objects_under_their_old_names():
    from proxy_agent import protocol
    from proxy_agent.protocol import element_events, messages, notices
    from proxy_agent.service import broker, brokering

    for names, module in ((messages.ELEMENT_EVENT_NAMES, element_events), (messages.NOTICE_NAMES, notices)):
        for name in names:
            assert getattr(messages, name) is getattr(protocol, name) is getattr(module, name)
            assert name in messages.__all__ and name in protocol.__all__
    assert set(messages.LATER_NAMES) == set(messages.ELEMENT_EVENT_NAMES) | set(messages.NOTICE_NAMES)
    for name in ("ATTRIBUTES", "Brokering", "Decision", "Placement", "JOB_BROKER"):
        assert getattr(broker, name) is getattr(brokering, name)
    with pytest.raises(AttributeError):
        messages.NoSuchEvent  # noqa: B018


def test_a_launch_that_joins_a_running_service_loads_only_the_standard_library_and_the_relay(tmp_path):
    """What ``proxy-agent --stdio`` loads to relay a client to the service of its state
    directory: the launch's own modules, none of the agent (no trio, no attrs, no protocol)."""
    state = tmp_path / "state"
    env = subprocess_env()
    started = subprocess.run([sys.executable, "-m", "proxy_agent", "--state-dir", str(state)], input=b"", env=env,
                             capture_output=True, timeout=scaled(60))
    assert started.returncode == 0, started.stderr  # the service now runs, and stays
    out = tmp_path / "loaded"
    probe = "\n".join([
        "import runpy, sys",
        f"sys.argv = ['proxy-agent', '--stdio', '--state-dir', {str(state)!r}]",
        "try:",
        "    runpy.run_module('proxy_agent', run_name='__main__')",
        "except SystemExit:",
        "    pass",
        "ours = sorted(m for m in sys.modules if m.startswith('proxy_agent'))",
        "outside = sorted(m for m in ('trio', 'attrs', 'sqlite3', 'argparse', 'subprocess', 'threading')",
        "                 if m in sys.modules)",
        f"open({str(out)!r}, 'w').write(repr((ours, outside)))",
    ])
    init = encode_frame(int(CommandId.INIT), 1, ["version=2.0", "baseId=100"])
    done = subprocess.run([sys.executable, "-c", probe], input=init, capture_output=True, env=env, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    decoder = Decoder()
    decoder.feed(done.stdout)
    assert [(frame.msg_id, frame.tid) for frame in decoder] == [(0, 1)]  # the service's OK for INIT
    ours, outside = eval(out.read_text())
    assert ours == ["proxy_agent", "proxy_agent.cli", "proxy_agent.config", "proxy_agent.endpoints", "proxy_agent.frontends",
                    "proxy_agent.frontends.api", "proxy_agent.frontends.api.wire", "proxy_agent.launch"]
    assert outside == []
