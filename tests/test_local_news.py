"""The local backend's reading of the keeper's news, driven message by message."""

from __future__ import annotations

import os
from typing import List, Tuple

import trio

from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.schedulers.local_records import LocalJob
from proxy_agent.service.model import ChangeSink, K, Kind, ServiceModel
from proxy_agent.service.service import JobService


class _Heard(ChangeSink):
    """What a client of the model hears: each output line and each process state, in order."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.heard: List[Tuple[str, str]] = []

    def output(self, element, stream, text, offset=None) -> None:
        self.heard.append(("output", text))

    def changed(self, element, slots) -> None:
        if element.kind is Kind.PROCESS:
            self.heard.append(("state", self.model.attr(element.key, K.STATE)))


async def test_news_that_comes_while_a_submissions_waiting_news_is_handed_on_keeps_its_order(tmp_path):
    """A fast job's keeper news split in two: its spawn and the growth of its output file while
    its submission is being answered (held), its exit and end just after the answer, before
    the held news has gone to the model.  The model must still hear the output before the
    process's end: read at the end with the file's size unknown, the output would be lost."""
    model = ServiceModel()
    service = JobService(model)
    backend = LocalBackend(model, None, service.context(state_dir=str(tmp_path)))
    backend._populate()
    jobs_dir = tmp_path / "jobs"
    key, processes = model.add_job(backend.queue_id, {K.STATE: "STARTING"}, [{K.STATE: "STARTING"}],
                                   owner=backend.name)
    record = LocalJob(key, list(processes), str(jobs_dir))
    backend._jobs[key] = record
    os.makedirs(jobs_dir / str(key))
    (jobs_dir / str(key) / "0.out").write_text("hello\n")
    heard = _Heard(model)
    model.subscribe(heard)
    record.waiting = []  # its submission is being answered
    async with trio.open_nursery() as nursery:
        backend._nursery_for_tasks = nursery
        backend._notices([{"op": "spawned", "key": key, "pids": [os.getpid()]},
                          {"op": "output", "key": key, "rank": 0, "stream": "stdout", "size": 6}])
        assert heard.heard == []  # held while the submission is answered
        backend._answered(record)
        backend._notices([{"op": "exit", "key": key, "rank": 0, "code": 0}, {"op": "done", "key": key}])
        with trio.fail_after(10):
            while ("state", "FINISHED") not in heard.heard:
                await trio.sleep(0)
        nursery.cancel_scope.cancel()
    told = [item for item in heard.heard if item[0] == "output" or item[1] != "STARTING"]  # (its pid came first)
    assert told == [("state", "RUNNING"), ("output", "hello"), ("state", "FINISHED")]
