"""The runtime protocol's framing, contacts and handles, and the runtime's reading of its
environment and command line (no agent needed)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent import runtime
from proxy_agent.runtime import wire
from proxy_agent.runtime.__main__ import main as runtime_main
from wait_support import scaled

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(objects, min_size=1, max_size=4), st.data())
def test_frames_round_trip_through_any_chunking(messages, data):
    stream = b"".join(wire.encode_frame(message) for message in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = wire.FrameDecoder()
    received = []
    start = 0
    for cut in cuts + [len(stream)]:
        decoder.feed(stream[start:cut])
        start = cut
        while True:
            message = decoder.next()
            if message is None:
                break
            received.append(message)
    assert received == messages
    assert not decoder.inside_frame


@pytest.mark.parametrize(
    "raw, words",
    [
        (struct.pack(">I", 0), "outside 1 to"),
        (struct.pack(">I", wire.MAX_FRAME + 1), "outside 1 to"),
        (struct.pack(">I", 3) + b"[1]", "JSON object"),
        (struct.pack(">I", 2) + b"\xff{", "not UTF-8 JSON"),
        (struct.pack(">I", 4) + b"{,}x", "not UTF-8 JSON"),
    ],
)
def test_bad_frames_are_wire_errors(raw, words):
    decoder = wire.FrameDecoder()
    decoder.feed(raw)
    with pytest.raises(wire.WireError, match=words):
        decoder.next()


def test_a_frame_too_large_to_send_is_refused_before_sending():
    with pytest.raises(wire.WireError, match="larger than"):
        wire.encode_frame({"data": "x" * (wire.MAX_FRAME + 1)})


@pytest.mark.parametrize(
    "kind, address, text",
    [
        ("unix", "/run/agent/rt.sock", "unix:///run/agent/rt.sock"),
        ("tcp", ("login1.cluster", 40123), "tcp://login1.cluster:40123"),
        ("tcp", ("::1", 9), "tcp://[::1]:9"),
    ],
)
def test_contacts(kind, address, text):
    assert wire.format_contact(kind, address) == text
    assert wire.parse_contact(text) == (kind, address)


@pytest.mark.parametrize("text", ["unix://relative", "tcp://host", "tcp://host:0", "tcp://:80", "http://x:1", ""])
def test_bad_contacts(text):
    with pytest.raises(ValueError):
        wire.parse_contact(text)


def test_handles_are_service_url_question_mark_resource_id():
    assert wire.handle("tcp://h:1", "mj-1", 2) == "tcp://h:1?mj-1/2"
    assert wire.split_handle("tcp://h:1?mj-1/2") == ("tcp://h:1", "mj-1", 2)
    assert wire.split_handle("unix:///a/b?mj-1") == ("unix:///a/b", "mj-1", None)
    for bad in ("tcp://h:1", "?x", "tcp://h:1?mj/x"):
        with pytest.raises(ValueError):
            wire.split_handle(bad)


# --------------------------------------------------------------------------- the runtime's environment

BASE = {
    wire.ENV_CONTACT: "unix:///nonexistent/rt.sock",
    wire.ENV_SECRET: "ab" * 32,
    wire.ENV_MULTIJOB: "mj-1",
    wire.ENV_PART: "2",
    wire.ENV_PART_SIZE: "4",
}


def env(**changes):
    result = dict(BASE)
    for name, value in changes.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


def test_the_rank_comes_from_the_first_variable_that_is_set():
    assert runtime.Runtime(env(SLURM_PROCID="3")).rank() == 3
    assert runtime.Runtime(env(SLURM_PROCID="3", PROXY_AGENT_PROCESS_INDEX="1")).rank() == 1
    assert runtime.Runtime(env(SLURM_PROCID="3", PROXY_AGENT_RANK="2", PROXY_AGENT_PROCESS_INDEX="1")).rank() == 2
    single = runtime.Runtime(env(PROXY_AGENT_PART_SIZE="1"))
    assert (single.rank(), single.size(), single.part_id, single.job_id) == (0, 1, 2, "mj-1")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({wire.ENV_CONTACT: None}, "PROXY_AGENT_RUNTIME is not set"),
        ({wire.ENV_CONTACT: "carrier-pigeon"}, "unix:///PATH or tcp://HOST:PORT"),
        ({wire.ENV_SECRET: None}, "PROXY_AGENT_RUNTIME_SECRET is not set"),
        ({wire.ENV_PART: "two"}, "PROXY_AGENT_PART must be a whole number"),
        ({}, "cannot tell this process's rank"),
        ({"PROXY_AGENT_RANK": "4"}, "outside this part's 4 processes"),
        ({"PROXY_AGENT_RANK": "-1"}, "at least 0"),
    ],
)
def test_a_bad_environment_is_named(changes, words):
    with pytest.raises(runtime.NotInMultiJob, match=words):
        runtime.Runtime(env(**changes))


def test_an_agent_that_is_not_there_is_reported():
    unreachable = runtime.Runtime(env(PROXY_AGENT_RANK="0"), connect_timeout=0.2)
    with pytest.raises(runtime.AgentError, match="cannot reach the agent at unix:///nonexistent/rt.sock"):
        unreachable.barrier()
    with pytest.raises(runtime.Timeout):
        unreachable.barrier(timeout=scaled(0.1))


def test_bad_arguments_are_type_errors_before_anything_is_sent():
    process = runtime.Runtime(env(PROXY_AGENT_RANK="0"), connect_timeout=0.1)
    with pytest.raises(TypeError, match="encode text first"):
        process.send(1, "tag", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tag is str"):
        process.receive(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank is an int"):
        process.register(b"x", rank="1")  # type: ignore[arg-type]


def test_command_exit_codes(monkeypatch, capsys):
    for name in list(BASE) + list(wire.RANK_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    assert runtime_main(["rank"]) == 3
    assert "not started as part of a multi-part job" in capsys.readouterr().err
    for name, value in env(PROXY_AGENT_RANK="3").items():
        monkeypatch.setenv(name, value)
    assert runtime_main(["rank"]) == 0 and capsys.readouterr().out == "3\n"
    assert runtime_main(["size"]) == 0 and capsys.readouterr().out == "4\n"
    with pytest.raises(SystemExit) as usage:
        runtime_main(["send", "one", "tag"])
    assert usage.value.code == 2
    with pytest.raises(SystemExit) as usage:
        runtime_main(["teleport"])
    assert usage.value.code == 2
    assert runtime_main(["--timeout", "0.1", "barrier"]) == 6
    assert "barrier:" in capsys.readouterr().err
