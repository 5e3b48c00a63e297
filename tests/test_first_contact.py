"""First contact: text that is not the protocol where the first frame should be.

On the client side, the decoder gives up after the first bytes that cannot
start a frame; the client reads on briefly so that the violation (and so the
console's message) quotes the whole first line of, say, a login banner,
whatever way the bytes were split on the way.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from proxy_agent.client import AgentClient, ProtocolViolationError
from proxy_agent.client.connection import QUOTE_LIMIT, QUOTE_WAIT
from proxy_agent.console.diagnose import garbage_before_first_frame

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
                await client.init(timeout=5)
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
    message = garbage_before_first_frame(violation.raw)
    assert "'Welcome to the cluster login node.\\n'" in message


async def test_a_banner_without_a_newline_is_quoted_as_far_as_it_came_before_the_stream_ended():
    violation, _ = await _violation_for([b"Last login: yesterday"])
    assert violation.raw == b"Last login: yesterday"


async def test_a_long_line_is_quoted_up_to_the_limit():
    violation, _ = await _violation_for([b"x" * (QUOTE_LIMIT * 3)], close=False)
    assert violation.raw == b"x" * QUOTE_LIMIT


async def test_the_client_does_not_wait_long_for_the_rest_of_a_line():
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
            await client.init(timeout=5)
            with pytest.raises(ProtocolViolationError) as caught:
                await client.model_def(timeout=5)
            nursery.cancel_scope.cancel()
    assert caught.value.violation.rule == "framing"
    assert caught.value.violation.raw == b"Welcome "
