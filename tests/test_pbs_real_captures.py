"""The PBS parsers on what a real OpenPBS 23.06.06 server printed, byte for byte
(``tests/data/pbs-real``, see its README: a fresh one-node server ``vm``, queues ``workq``
and ``long``).  What the hand-written recordings of ``tests/data/pbs`` had missed is pinned
here: an empty listing has no ``"Jobs"`` member, a fresh server numbers its jobs from 0, a
job deleted while queued has substate 91 and no ``Exit_status``, a queued subjob of an array
carries no ``array_id``."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy_agent.schedulers.batch.pbs import parse as P
from proxy_agent.schedulers.batch.pbs.system import PbsSystem, node_state, system_for
from proxy_agent.service.jobs import JobState

REAL = Path(__file__).parent / "data" / "pbs-real"
OPENPBS = PbsSystem("openpbs", (23, 6, 6), "OpenPBS")


def read(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def by_id(jobs):
    found = {job.job_id: job for job in jobs}
    assert len(found) == len(jobs)
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("qstat-*f*.json")
                                        if "-Q" not in p.name and "-B" not in p.name))
def test_every_real_job_listing_parses(name):
    for job in OPENPBS.parse_status(read(name)):
        assert job.job_id.split(".")[0].rstrip("[]0123456789") == "" and job.job_id.endswith(".vm")
        assert job.user == "pbstest" and job.queue == "workq"
        assert OPENPBS.state_table.map(job.native_state) is not JobState.OTHER


def test_an_empty_listing_has_no_jobs_member():
    assert '"Jobs"' not in read("qstat-f-empty.json")
    assert OPENPBS.parse_status(read("qstat-f-empty.json")) == []


def test_a_fresh_server_numbers_its_jobs_from_zero():
    jobs = by_id(OPENPBS.parse_status(read("qstat-f-json.json")))
    assert set(jobs) == {"0.vm", "1[].vm", "2.vm"}
    running, held = jobs["0.vm"], jobs["2.vm"]
    assert (running.name, running.hosts, OPENPBS.state_table.map(running.native_state)) == ("handjob", ("vm",), JobState.RUNNING)
    assert running.time_limit == 300 and running.num_procs == 1
    assert (held.hosts, OPENPBS.state_table.map(held.native_state)) == ((), JobState.HOLD)
    assert P.parse_tracejob(read("tracejob-0.txt"), P.FAMILY_OPENPBS, "0.vm").hosts == ("vm",)


def test_every_subjob_of_an_array_belongs_to_it_queued_or_running():
    jobs = by_id(OPENPBS.parse_status(read("qstat-ft-json.json")))
    subjobs = {job_id: job for job_id, job in jobs.items() if job_id.startswith("1[") and job_id != "1[].vm"}
    assert set(subjobs) == {"1[1].vm", "1[2].vm", "1[3].vm"}
    assert {job.array_id for job in subjobs.values()} == {"1[].vm"}
    assert sorted(job.array_index for job in subjobs.values()) == ["1", "2", "3"]
    assert [OPENPBS.state_table.map(subjobs[i].native_state) for i in ("1[1].vm", "1[2].vm", "1[3].vm")] == [
        JobState.RUNNING, JobState.QUEUING, JobState.QUEUING]
    assert jobs["1[].vm"].array_id == "1[].vm"


def test_finished_jobs_and_a_job_deleted_while_queued():
    jobs = by_id(OPENPBS.parse_status(read("qstat-x-f-json.json")))
    done = jobs["0.vm"]
    assert (OPENPBS.final_state(done), done.exit_code, done.hosts) == (JobState.FINISHED, 0, ("vm",))
    for job_id in ("3.vm", "4.vm"):  # deleted while queued: substate 91, no Exit_status
        deleted = jobs[job_id]
        assert deleted.exit_code is None and deleted.cancelled
        assert OPENPBS.final_state(deleted) is JobState.KILLED
    assert "and terminated" in jobs["3.vm"].reason


def test_names_that_read_as_numbers_stay_text():
    jobs = OPENPBS.parse_status(read("qstat-f-t-quirks.json"))
    assert [job.name for job in jobs][:8] == ["007", "true", "1e5", "inf", "nan", ".123", "123.", "-00"]


def test_nodes_queues_and_server():
    (node,) = P.parse_openpbs_nodes(read("pbsnodes-av-json.json"), node_state)
    assert (node.name, node.state, node.cpus, node.cpus_used) == ("vm", "UP", 2, 2)
    (queue,) = P.parse_openpbs_queues(read("qstat-Q-f-json.json"))
    assert (queue.name, queue.state, queue.waiting, queue.running) == ("workq", "NORMAL", 0, 0)
    server = P.parse_openpbs_server(read("qstat-B-f-json.json"))
    assert (server.default_queue, server.version_text) == ("workq", "23.06.06")
    assert [name for _kind, name, _ in P.parse_full_text(read("qstat-Bf.txt"))] == ["vm"]
    assert [name for _kind, name, _ in P.parse_full_text(read("qstat-xf.txt"))] == [
        "0.vm", "1[].vm", "2.vm", "3.vm", "4.vm"]


def test_probe_and_unknown_jobs():
    probe = P.detect_family(read("qstat-version.stdout"), read("qstat-version.stderr"), read("qstat-B-f.txt"))
    system = system_for(probe)
    assert system.openpbs and system.version == (23, 6, 6)
    assert P.is_unknown_job_error(read("qstat-unknown.stderr"))
    assert P.is_unknown_job_error(read("qstat-x-unknown.stderr")) and read("qstat-x-unknown.stdout") == ""
