"""The runtime's operations as a job's processes ask for them: hello, the start barrier,
messages between processes and parts, the structure, the rendezvous."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict

from ...runtime import wire
from .state import Refused

if TYPE_CHECKING:  # pragma: no cover
    from .server import RuntimeJob


# --------------------------------------------------------------------------- request fields


def request_field(request: Dict[str, Any], key: str, kind: type, what: str, default: Any = ...) -> Any:
    if key not in request:
        if default is ...:
            raise Refused(f"the request lacks {key!r} ({what})")
        return default
    value = request[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise Refused(f"{key!r} must be a whole number ({what}), not {value!r}"[:300])
    if kind is not int and not isinstance(value, kind):
        raise Refused(f"{key!r} must be {kind.__name__} ({what})"[:300])
    return value


def request_bytes(request: Dict[str, Any], key: str, what: str) -> bytes:
    try:
        return wire.from_b64(request_field(request, key, str, what), key)
    except ValueError as error:
        raise Refused(str(error)) from None


class RuntimeOperations:
    """The operations of a :class:`~.server.RuntimeServer` (see the module documentation)."""

    async def _op_hello(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        view = job.state.view(part, rank)
        return {
            "job": view.job_id,
            "part": view.part_id,
            "part_index": view.part_index,
            "parts": view.parts,
            "label": view.label,
            "rank": view.rank,
            "size": view.size,
            "start_type": view.start_type.value,
            "comms_type": view.comms_type.value,
            "released": view.released,
        }

    async def _op_barrier(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        job.state.check_in(part, rank)
        self._note(job)
        passed = await self._wait_for(job, lambda: job.state.barrier_passed(part, rank))
        return {"part_index": passed.part_index, "parts": passed.parts, "final": passed.final}

    async def _op_send(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        dest = request_field(request, "dest", int, "the destination rank")
        tag = request_field(request, "tag", str, "the message tag")
        job.state.send(part, rank, dest, tag, request_bytes(request, "data", "the message, base64"))
        return {}

    async def _op_receive(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        tag = request_field(request, "tag", str, "the message tag")
        message = await self._wait_for(job, lambda: job.state.take_message(part, rank, tag))
        return {"source": message.source, "tag": message.tag, "data": wire.b64(message.data)}

    async def _op_structure(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        job.state.join(part, rank)
        self._note(job)
        structure = await self._wait_for(job, lambda: job.state.structure(part, rank))
        return {
            "part_index": structure.part_index,
            "parts": [
                {"index": layout.index, "label": layout.label, "size": layout.size, "in_group": layout.in_group}
                for layout in structure.parts
            ],
        }

    async def _op_part_send(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        dest = request_field(request, "dest", int, "the destination part's index")
        tag = request_field(request, "tag", str, "the message tag")
        data = request_bytes(request, "data", "the message, base64")
        job.state.join(part, rank)
        self._note(job)
        await self._wait_for(job, lambda: job.state.structure(part, rank))
        job.state.part_send(part, rank, dest, tag, data)
        return {}

    async def _op_part_receive(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        tag = request_field(request, "tag", str, "the message tag")
        job.state.join(part, rank)
        self._note(job)
        message = await self._wait_for(job, lambda: job.state.take_part_message(part, rank, tag))
        return {"source": message.source, "tag": message.tag, "data": wire.b64(message.data)}

    async def _op_exchange(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        text = request_field(request, "text", str, "this part's text")
        round_number = job.state.contribute(part, rank, text)
        self._note(job)
        result = await self._wait_for(job, lambda: job.state.exchange_result(part, rank, round_number))
        return {"part_index": result.part_index, "indexes": list(result.indexes), "texts": list(result.texts)}

    async def _op_register(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        level = request_field(request, "level", int, "the rendezvous level", 1)
        at_rank = request_field(request, "at_rank", int, "the rendezvous rank, or -1", -1)
        data = request_bytes(request, "data", "the data to register, base64")
        used = await self._wait_for(
            job, lambda: job.state.register(part, rank, data, level=level, at_rank=at_rank)
        )
        return {"rank": used}

    async def _op_forward(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        job.state.forward(part, rank)
        return {}

    async def _op_rendezvous(self, job: RuntimeJob, part: int, rank: int, request: Dict[str, Any]) -> Dict[str, Any]:
        level = request_field(request, "level", int, "the rendezvous level", 1)
        wait = request_field(request, "wait", bool, "whether to wait for completion", True)
        if not wait:
            data = job.state.rendezvous_result(part, rank, level)
            return {"data": None if data is None else wire.b64(data)}
        data = await self._wait_for(job, lambda: job.state.rendezvous_result(part, rank, level))
        return {"data": wire.b64(data)}

    _handlers: Dict[str, Callable[..., Awaitable[Dict[str, Any]]]] = {
        "hello": _op_hello,
        "barrier": _op_barrier,
        "send": _op_send,
        "receive": _op_receive,
        "structure": _op_structure,
        "part_send": _op_part_send,
        "part_receive": _op_part_receive,
        "exchange": _op_exchange,
        "register": _op_register,
        "forward": _op_forward,
        "rendezvous": _op_rendezvous,
    }
    _blocking = frozenset(
        {"barrier", "receive", "structure", "part_send", "part_receive", "exchange", "register", "rendezvous"}
    )

