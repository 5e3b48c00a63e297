"""SLURM jobs an earlier agent submitted, taken back by a new agent from the job store, against
a scripted stand-in for SLURM's commands (``test_slurm_model.FakeSlurm``)."""

from __future__ import annotations

import attrs
import trio

from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.batch.slurm.backend import SlurmBackend, SlurmOptions
from proxy_agent.service.jobs import JobSpec
from proxy_agent.service.model import K, Kind, ServiceModel
from proxy_agent.service.service import JobService
from proxy_agent.service.store import open_store
from test_slurm_model import FakeSlurm, job
from wait_support import scaled


def _store_job(store, key: int, native: str, out_path: str, *, state: str = "RUNNING", delivered: int = 0,
               exit_code: str = "", broker=None) -> None:
    spec = JobSpec("/bin/prog", name=f"job{key}", client_ref=f"sub-{key}", queue="slurm:debug")
    store.record_submission(key, "slurm", "slurm:debug", spec)
    if native:
        extra = {"outputs": {"stdout": out_path}, "spool": []}
        if broker:
            extra["broker"] = broker
        store.record_native_id(key, native, extra)
    final = state in ("FINISHED", "FAILED", "KILLED")
    store.note_state(key, state, {"RUNNING": "RUNNING", "FAILED": "FAILED"}.get(state, state), None, final, exit_code)
    store.flush()
    if delivered:
        store.record_delivered({key: {"0.stdout": delivered}})


def _sacct_line(job_id: str, state: str, exit_code: str) -> str:
    return sp.FIELD_SEP.join([job_id, job_id, "alice(1000)", "", "debug", state, "", "vm", "1", "1", "",
                              "00:00:07", "10", exit_code, "", "", "", "/w", f"job{job_id}"]) + "\n"


async def test_stored_slurm_jobs_are_adopted_by_their_slurm_id(nursery, tmp_path):
    state_dir = str(tmp_path / "state")
    (tmp_path / "state").mkdir()
    outputs = {n: tmp_path / f"{n}.out" for n in ("201", "202", "203")}
    outputs["201"].write_text("a1\na2\na3\n")  # ended while no agent ran; a1 was delivered
    outputs["202"].write_text("b1\nb2\n")  # still running; b1 was delivered
    outputs["203"].write_text("c1\nc2\n")  # its end was recorded; everything delivered but c2
    store = open_store(state_dir)
    _store_job(store, 11, "201", str(outputs["201"]), delivered=3)
    _store_job(store, 12, "202", str(outputs["202"]), delivered=3,
               broker={"broker": "Null", "brokerQueue": "slurm:debug", "brokerReason": "Null: first in the order given"})
    _store_job(store, 13, "203", str(outputs["203"]), state="FAILED", exit_code="3", delivered=3)
    _store_job(store, 14, "", "")  # the agent died before sbatch answered
    store.close()

    fake = FakeSlurm()
    # 202 is listed (and would otherwise show under a key of its own); 201 is gone from the
    # listing and from scontrol, and accounting knows how it ended; 203 is known nowhere.
    fake.jobs = {"202": job("202", "RUNNING"), "999": job("999", "RUNNING")}
    fake.sacct = _sacct_line("201", "COMPLETED", "0:0")
    store = open_store(state_dir)
    service = JobService(ServiceModel(), store)
    backend = SlurmBackend(service.model, SlurmOptions(poll_interval=0.2), service.context(state_dir=state_dir),
                           runner=fake, user="alice", spool_dir=str(tmp_path / "spool"), output_interval=0.02,
                           output_drain_grace=0.1, fast_poll_interval=0.05, retention=600)
    service.add_backend(backend)
    await nursery.start(service.run)
    model = service.model
    with trio.fail_after(scaled(30)):
        await service.ready.wait()
    assert {11, 12, 13, 14} <= service.stored
    for key in (11, 12, 13, 14):
        assert key in model and model.get(key).kind is Kind.JOB
        assert model.attr(key, K.CLIENT_REF) == f"sub-{key}"
    # the listed job took back its stored key: no second element for it
    assert [k for k in model.keys(Kind.JOB) if model.attr(k, K.NATIVE_ID) == "202"] == [12]
    assert model.attr(12, "brokerReason") == "Null: first in the order given"
    assert model.attr(14, K.STATE) == "DELETED" and "before sbatch answered" in model.attr(14, K.MESSAGE)

    output = {}

    @attrs.define
    class Listener:
        takes_output = True
        holds_back = False
        held_output = 0

        def created(self, element): pass
        def changed(self, element, slots): pass
        def removed(self, element): pass
        def moved(self, element, old): pass
        def flush(self): pass

        def output(self, element, stream, text, offset=None):
            output.setdefault(element.parent, []).extend(text.split("\n"))

    model.subscribe(Listener())

    def state(key):
        return model.attr(key, K.STATE)

    with trio.fail_after(scaled(30)):
        while state(11) != "FINISHED" or state(13) != "FAILED":
            await trio.sleep(0.05)
    assert output[11] == ["a2", "a3"] and model.attr(11, K.EXIT_CODE) == "0"
    assert output[13] == ["c2"] and model.attr(13, K.EXIT_CODE) == "3"
    (process,) = model.processes(13)
    assert model.attr(process, K.EXIT_CODE) == "3"
    assert any(argv[0] == "sacct" and "--jobs=201" in argv for _, argv in fake.calls)
    # the running one goes on: its output as it comes, its end when SLURM says
    with trio.fail_after(scaled(30)):
        while output.get(12) != ["b2"]:
            await trio.sleep(0.05)
    with outputs["202"].open("a") as f:
        f.write("b3\n")
    fake.jobs["202"] = job("202", "COMPLETED", exit_code="0:0")
    with trio.fail_after(scaled(30)):
        while state(12) != "FINISHED":
            await trio.sleep(0.05)
    assert output[12] == ["b2", "b3"]
    # and the store has every end
    service._write_store()
    records = {r.key: r for r in store.jobs()}
    assert records[11].state == "FINISHED" and records[11].ended is not None and records[11].exit_code == "0"
    assert records[12].state == "FINISHED" and records[13].state == "FAILED" and records[14].state == "DELETED"
