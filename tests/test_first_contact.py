"""First contact: text that is not the protocol where the first frame should be.

The decoder gives up at the first bytes that cannot start a frame (often
after 8 of them); both ends then read on briefly so that their message
quotes the whole first line, however the bytes were split on the way.  On
the client side that is a login banner on the agent's output (the console
names the shell start-up file); on the agent's side a person typing at it or
a greeting written into its input: it answers with one ERROR under TID 0,
logs one line, and ends the session.
"""

from __future__ import annotations

import subprocess
import time

import pytest
import trio
import trio.testing

from agent_fixtures import agent_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient, ProtocolViolationError
from proxy_agent.console.diagnose import garbage_before_first_frame
from proxy_agent.protocol import Decoder, Error, ErrorCode, ErrorKind, Frame, FrameError, Phase
from proxy_agent.protocol.dialect import DEFAULT
from proxy_agent.protocol.first_bytes import QUOTE_LIMIT, QUOTE_WAIT, first_line, looks_like_frame_start
from proxy_agent.protocol.messages import decode_event
from proxy_agent.protocol.session import AgentSession

BANNER = b"Welcome to the cluster login node.\nPlease behave.\n"


async def _violation_for(pieces, *, close: bool = True, pause: float = 0.05):
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with AgentClient.from_stream(client_end) as client:
        async with trio.open_nursery() as nursery:

            async def agent():
                for piece in pieces:
                    await agent_end.send_all(piece)
                    await trio.sleep(pause)
                if close:
                    await agent_end.aclose()

            nursery.start_soon(agent)
            with pytest.raises(ProtocolViolationError) as caught:
                await client.init(timeout=scaled(30))
            nursery.cancel_scope.cancel()
    return caught.value.violation, client


@pytest.mark.parametrize(
    "pieces",
    [
        [BANNER],
        [BANNER[:8], BANNER[8:]],
        [BANNER[:3], BANNER[3:12], BANNER[12:20], BANNER[20:]],
        [bytes([b]) for b in BANNER[:40]],
    ],
    ids=["one-chunk", "cut-after-8", "three-cuts", "byte-by-byte"],
)
async def test_a_banner_is_quoted_up_to_the_end_of_its_first_line_however_it_is_split(pieces):
    violation, client = await _violation_for(pieces, pause=0.001)
    assert violation.rule == "framing"
    assert violation.raw == b"Welcome to the cluster login node.\n"
    assert client.state.violations[0].raw == violation.raw
    assert str(violation) == (
        "malformed frame from the agent: its output began with text that is not the protocol: "
        "'Welcome to the cluster login node.\\n'"
    )
    message = garbage_before_first_frame(violation.raw)
    assert "'Welcome to the cluster login node.\\n'" in message


async def test_a_banner_without_a_newline_is_quoted_as_far_as_it_came_before_the_stream_ended():
    violation, _ = await _violation_for([b"Last login: yesterday"])
    assert violation.raw == b"Last login: yesterday"


async def test_a_long_line_is_quoted_up_to_the_limit():
    violation, _ = await _violation_for([b"x" * (QUOTE_LIMIT * 3)], close=False)
    assert violation.raw == b"x" * QUOTE_LIMIT


async def test_the_client_does_not_wait_long_for_the_rest_of_a_line(autojump_clock):
    # virtual time: the client gives up after QUOTE_WAIT, not after the 30 s the rest takes
    start = trio.current_time()
    violation, _ = await _violation_for([b"Welcome to nowhere"], close=False, pause=30)
    assert violation.raw == b"Welcome to nowhere"
    assert trio.current_time() - start < QUOTE_WAIT + 2


async def test_garbage_after_a_frame_is_not_taken_for_a_banner():
    client_end, agent_end = trio.testing.memory_stream_pair()
    async with AgentClient.from_stream(client_end) as client:
        async with trio.open_nursery() as nursery:

            async def agent():
                await agent_end.send_all(b"00000017 0000:00000001:00000000")
                await trio.sleep(0.05)
                await agent_end.send_all(b"Welcome to the node\n")

            nursery.start_soon(agent)
            await client.init(timeout=scaled(30))
            with pytest.raises(ProtocolViolationError) as caught:
                await client.model_def(timeout=scaled(30))
            nursery.cancel_scope.cancel()
    assert caught.value.violation.rule == "framing"
    assert caught.value.violation.raw == b"Welcome "


# --------------------------------------------------------------------------- the agent's side


def test_what_can_start_a_frame():
    assert looks_like_frame_start(b"")
    assert looks_like_frame_start(b"0000")
    assert looks_like_frame_start(b"0000002a 0001:")
    assert not looks_like_frame_start(b"Welcome ")
    assert not looks_like_frame_start(b"0000002aX")
    assert first_line(b"one\ntwo\n") == b"one\n"
    assert first_line(b"x" * 500) == b"x" * QUOTE_LIMIT


def test_the_session_answers_text_before_the_first_frame_with_an_error_under_tid_0():
    session = AgentSession()
    r = session.not_the_protocol(b"hello agent\nsecond line\n")
    assert r.close and r.command is None
    (error,) = r.replies
    assert isinstance(error, Error) and error.tid == 0 and error.code == ErrorCode.MALFORMED_FRAME
    assert "'hello agent\\n'" in error.message and "second line" not in error.message
    assert "'hello agent\\n'" in r.log and "session closed" in r.log
    assert session.write(error)  # the reply passes the session's own checks
    assert session.phase is Phase.INITIALIZE


def test_the_session_counts_frames_so_a_later_framing_error_is_not_called_garbage():
    session = AgentSession()
    assert session.frames_received == 0
    session.receive(FrameError(ErrorKind.BAD_HEADER, "header too short"))
    assert session.frames_received == 1
    r = session.receive(FrameError(ErrorKind.BAD_LENGTH, "frame length is not 8 hex digits: b'Welcome '"))
    assert r.close and "framing lost" in r.log and session.frames_received == 1


def _run_agent_with_input(pieces, pause=0.05):
    process = subprocess.Popen(
        agent_argv("--stdio"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    start = time.monotonic()
    try:
        for piece in pieces:
            process.stdin.write(piece)
            process.stdin.flush()
            time.sleep(pause)
        out, err = process.communicate(timeout=scaled(30))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return out, err.decode(), time.monotonic() - start, process.returncode


def _only_event(out: bytes):
    decoder = Decoder()
    decoder.feed(out)
    frames = list(decoder)
    assert len(frames) == 1 and decoder.buffered == 0, out
    frame = frames[0]
    return decode_event(Frame(frame.msg_id, frame.tid, tuple(DEFAULT.unescape(arg) for arg in frame.args)))


@pytest.mark.parametrize(
    "pieces",
    [[b"hello agent\n"], [b"hel", b"lo ag", b"ent\nwhat now?\n"]],
    ids=["one-write", "typed-in-pieces"],
)
def test_the_agent_names_text_typed_at_it_in_one_error_and_one_log_line_and_ends_the_session(pieces):
    # stdin stays open after the text (as with a person at a terminal): the agent ends by itself.
    process = subprocess.Popen(
        agent_argv("--stdio"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    try:
        for piece in pieces:
            process.stdin.write(piece)
            process.stdin.flush()
            time.sleep(0.05)
        out = process.stdout.read()  # until the agent closes its output
        process.wait(timeout=scaled(30))
        err = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
    event = _only_event(out)
    assert isinstance(event, Error) and event.tid == 0 and event.code == ErrorCode.MALFORMED_FRAME
    assert "text that is not the protocol: 'hello agent\\n'" in event.message
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "the input began with text that is not the protocol: 'hello agent\\n'" in lines[0]
    assert "session closed" in lines[0] and "Traceback" not in err


def test_the_agent_names_a_short_greeting_cut_off_by_the_end_of_its_input():
    out, err, _, _ = _run_agent_with_input([b"hi"])
    event = _only_event(out)
    assert isinstance(event, Error) and "'hi'" in event.message
    assert "not the protocol: 'hi'" in err and "Traceback" not in err


def test_a_frame_that_is_too_large_is_still_reported_as_such():
    out, err, _, _ = _run_agent_with_input([b"FFFFFFFF 0001:00000001:00000000"])
    assert out == b""
    assert "exceeds the limit" in err and "framing lost" in err and "not the protocol" not in err
