"""Stored local jobs the keeper cannot describe: one whose end was recorded keeps it, one the
keeper never heard of is reported FAILED, saying why."""

from __future__ import annotations

import trio

from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.model import K
from proxy_agent.service.service import JobService
from proxy_agent.service.store import open_store
from wait_support import scaled


async def test_stored_local_jobs_unknown_to_the_keeper(tmp_path):
    state = str(tmp_path)
    store = open_store(state)
    for key in (5, 6):
        store.record_submission(key, "local", "local:default", JobSpec("/bin/true", client_ref=f"s{key}"))
        store.record_native_id(key, "")
    store.note_state(5, "FINISHED", "EXITED", None, True, "0")
    store.flush()
    service = JobService(store=store)
    service.add_backend(LocalBackend(service.model, None, service.context(state_dir=state)))
    model = service.model
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(scaled(30)):
            await service.ready.wait()
        assert {5, 6} <= service.stored
        assert model.attr(5, K.STATE) == "FINISHED" and model.attr(5, K.EXIT_CODE) == "0"
        assert model.attr(5, K.CLIENT_REF) == "s5"
        (process,) = model.processes(5)
        assert model.attr(process, K.EXIT_CODE) == "0"
        assert model.attr(6, K.STATE) == "FAILED" and model.attr(6, K.NATIVE_STATE) == "LOST"
        assert "the keeper has no record of the job" in model.attr(6, K.MESSAGE)
        assert "it never ran" in model.attr(6, K.MESSAGE)  # it was not yet answered when the agent ended
        nursery.cancel_scope.cancel()
    reopened = open_store(state)
    record = reopened.job(6)
    reopened.close()
    assert record.state == "FAILED" and record.ended is not None
