"""PBS parsers, probing, state tables and command argv, on the composed outputs in
tests/data/pbs (see its README: no PBS server runs here, the files follow the documented
formats of OpenPBS 20.0 and 23.06, PBS Professional 2024.1 and Torque 4.2 and 6.1)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.schedulers.batch.pbs import parse as P
from proxy_agent.schedulers.batch.pbs.system import (
    OPENPBS_STATES,
    TORQUE_STATES,
    PbsSystem,
    node_state,
    queue_state,
    system_for,
)
from proxy_agent.schedulers.batch.records import NativeJob
from proxy_agent.service.jobs import ErrorKind, JobError, JobState, ServiceError

DATA = Path(__file__).parent / "data" / "pbs"
OPENPBS = PbsSystem("openpbs", (20, 0, 1), "OpenPBS")
TORQUE = PbsSystem("torque", (6, 1, 3), "Torque")
OPENPBS_DIRS = ["openpbs-20.0.1", "openpbs-23.06.06", "pbspro-2024.1", "openpbs-quirks"]
TORQUE_DIRS = ["torque-4.2.10", "torque-6.1.3"]


@pytest.fixture(autouse=True)
def server_time_zone():
    """The recordings' servers run at UTC+1 (see the data README)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "CET-1"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def by_id(jobs):
    result = {job.job_id: job for job in jobs}
    assert len(result) == len(jobs), "a job id was listed twice"
    return result


# ------------------------------------------------------------------------------ every file


def _files(dirs, pattern):
    return [f"{d}/{p.name}" for d in dirs for p in sorted((DATA / d).glob(pattern))]


@pytest.mark.parametrize(
    "name", [n for n in _files(OPENPBS_DIRS, "qstat-*f*.json") if "-Q-" not in n and "-B-" not in n and "truncated" not in n]
)
def test_every_openpbs_job_listing_parses(name):
    jobs = OPENPBS.parse_status(read(name))
    assert jobs
    for job in jobs:
        assert job.job_id and job.native_state
        assert job.user, job
        assert OPENPBS.state_table.map(job.native_state) is not JobState.OTHER
        assert isinstance(OPENPBS.final_state(job), JobState)


@pytest.mark.parametrize("name", _files(TORQUE_DIRS, "qstat-f-x*.xml"))
def test_every_torque_job_listing_parses(name):
    jobs = TORQUE.parse_status(read(name))
    for job in jobs:
        assert job.job_id and job.native_state and job.user
        assert TORQUE.state_table.map(job.native_state) is not JobState.OTHER


@pytest.mark.parametrize("name", _files(OPENPBS_DIRS, "pbsnodes*.json") + _files(TORQUE_DIRS, "pbsnodes*.xml"))
def test_every_node_listing_parses(name):
    system = OPENPBS if name.endswith(".json") else TORQUE
    nodes = system.parse_nodes(read(name))
    assert nodes
    for node in nodes:
        assert node.name and node.native_state
        assert node.state in ("UP", "DOWN", "ERROR", "UNKNOWN")
        assert node.state == node_state(node.native_state)


@pytest.mark.parametrize("name", _files(OPENPBS_DIRS, "qstat-Q-f*.json") + _files(TORQUE_DIRS, "qstat-Q-f*.txt"))
def test_every_queue_listing_parses(name):
    system = OPENPBS if name.endswith(".json") else TORQUE
    queues = system.parse_queues(read(name))
    assert queues
    for queue in queues:
        assert queue.state in ("NORMAL", "STOPPED")
        assert queue.native_state in ("enabled,started", "enabled,stopped", "disabled,started", "disabled,stopped")


@pytest.mark.parametrize("name", _files(OPENPBS_DIRS + TORQUE_DIRS, "tracejob*"))
def test_every_tracejob_output_parses(name):
    family = "torque" if name.startswith("torque") else "openpbs"
    job = P.parse_tracejob(read(name), family)
    if "running" in name or "missing" in name:
        assert job is None
    else:
        assert job is not None and job.job_id and job.end_time


@pytest.mark.parametrize("name", _files(OPENPBS_DIRS + TORQUE_DIRS, "qsub*.stdout"))
def test_every_qsub_output_parses(name):
    job_id = P.parse_qsub_output(read(name))
    assert job_id == read(name).strip()


# ------------------------------------------------------------------------------ OpenPBS jobs


def test_openpbs_running_job_in_detail():
    job = by_id(OPENPBS.parse_status(read("openpbs-20.0.1/qstat-f-t.json")))["1201.pbs-head"]
    assert job == NativeJob(
        job_id="1201.pbs-head",
        name="relax_md",
        user="rhea",
        queue="workq",
        native_state="R",
        reason="Job run at Tue Nov 14 at 07:50 on (cn001:ncpus=4:mem=8388608kb)+(cn002:ncpus=4:mem=8388608kb)",
        account="chem-2024",
        hosts=("cn001", "cn002"),
        num_nodes=2,
        num_procs=8,
        submit_time="2023-11-14T07:49:55",
        start_time="2023-11-14T07:50:58",
        end_time="",
        time_used=4329,
        time_limit=48 * 3600,
        exit_code=None,
        work_dir="/home/rhea/md",
        stdout_path="/home/rhea/md/relax.out",
        stderr_path="/home/rhea/md/relax.out",
        priority=0,
    )


def test_openpbs_queued_held_waiting_jobs_have_no_hosts():
    jobs = by_id(OPENPBS.parse_status(read("openpbs-20.0.1/qstat-f-t.json")))
    queued, held, waiting = jobs["1202.pbs-head"], jobs["1203.pbs-head"], jobs["1206.pbs-head"]
    assert queued.hosts == held.hosts == waiting.hosts == ()
    assert queued.reason.startswith("Not Running: Insufficient amount of resource")
    assert queued.time_limit == 120 * 3600  # more than 99 hours
    assert queued.num_procs == 64 and queued.num_nodes == 4
    assert queued.stdout_path == "/scratch/osric/sweep.o1202"
    assert [OPENPBS.state_table.map(j.native_state) for j in (queued, held, waiting)] == [
        JobState.QUEUING, JobState.HOLD, JobState.QUEUING]


def test_openpbs_array_parent_and_sub_jobs():
    jobs = by_id(OPENPBS.parse_status(read("openpbs-20.0.1/qstat-f-t.json")))
    parent = jobs["1204[].pbs-head"]
    assert (parent.native_state, parent.array_id, parent.array_index) == ("B", "1204[].pbs-head", "4-6")
    assert OPENPBS.final_state(parent) is JobState.RUNNING
    subs = [jobs[f"1204[{i}].pbs-head"] for i in range(1, 7)]
    assert [s.array_index for s in subs] == ["1", "2", "3", "4", "5", "6"]
    assert all(s.array_id == "1204[].pbs-head" for s in subs)
    assert [s.native_state for s in subs] == ["X", "R", "R", "Q", "Q", "Q"]
    assert OPENPBS.final_state(subs[0]) is JobState.FINISHED
    assert subs[1].hosts == ("cn003",)
    pending = by_id(OPENPBS.parse_status(read("openpbs-23.06.06/qstat-f-t.json")))["4000000001236[].hpc-pbs"]
    assert pending.array_index == "0-99:3" and pending.native_state == "Q"


def test_openpbs_non_ascii_names_and_paths():
    jobs = by_id(OPENPBS.parse_status(read("openpbs-20.0.1/qstat-f-t.json")))
    job = jobs["1205.pbs-head"]
    assert job.name == "分子動力学_run"
    assert job.stdout_path == "/home/ymori/計算/run.out" and job.work_dir == "/home/ymori/計算"
    assert job.priority == -100 and job.num_procs == 2 and job.hosts == ("cn002",)
    other = by_id(OPENPBS.parse_status(read("openpbs-23.06.06/qstat-f-t.json")))["4000000001235.hpc-pbs"]
    assert other.name == "Ünïcödé-Σ"


def test_openpbs_huge_values_and_64_bit_ids():
    job = by_id(OPENPBS.parse_status(read("openpbs-23.06.06/qstat-f-t.json")))["4000000001234.hpc-pbs"]
    assert job.time_used == 101 * 3600 + 13 * 60 + 9
    assert job.time_limit == 168 * 3600
    assert job.num_procs == 64 and job.hosts == ("node-a17", "node-a18")
    assert job.priority == 512 and job.account == "aero"
    listing = P.load_pbs_json(read("openpbs-23.06.06/qstat-f-t.json"))
    variables = listing["Jobs"]["4000000001234.hpc-pbs"]["Variable_List"]
    assert variables["CASE"] == "a,b,c"


def test_openpbs_finished_jobs_and_their_final_states():
    jobs = by_id(OPENPBS.parse_status(read("openpbs-20.0.1/qstat-x-f.json")))
    expected = {
        "1190.pbs-head": (JobState.FINISHED, 0, ""),
        "1191.pbs-head": (JobState.FAILED, 3, ""),
        "1192.pbs-head": (JobState.KILLED, None, "15"),  # deleted while running
        "1193.pbs-head": (JobState.KILLED, None, ""),  # deleted while queued
        "1194.pbs-head": (JobState.KILLED, -29, ""),  # wall time limit
        "1195.pbs-head": (JobState.FAILED, None, "9"),  # killed by a signal, not deleted
        "1196[].pbs-head": (JobState.FAILED, 1, ""),  # an element failed
        "1196[1].pbs-head": (JobState.FINISHED, 0, ""),
        "1196[2].pbs-head": (JobState.FAILED, 2, ""),
        "1197.pbs-head": (JobState.FAILED, -1, ""),
        "1198.pbs-head": (JobState.DELETED, None, ""),  # moved to another server
    }
    assert {k: (OPENPBS.final_state(j), j.exit_code, j.signal) for k, j in jobs.items()} == expected
    assert jobs["1192.pbs-head"].cancelled and jobs["1193.pbs-head"].cancelled
    assert not jobs["1195.pbs-head"].cancelled
    assert "wall time" in jobs["1194.pbs-head"].reason
    # obittime is the end; before obittime existed, mtime of the finished job is.
    assert jobs["1191.pbs-head"].end_time == "2023-11-13T17:11:04"
    assert jobs["1190.pbs-head"].end_time == "2023-11-13T17:00:35"
    assert jobs["1190.pbs-head"].time_used == 20 * 60 + 31
    killed = by_id(OPENPBS.parse_status(read("openpbs-23.06.06/qstat-x-f.json")))["4000000001200.hpc-pbs"]
    assert OPENPBS.final_state(killed) is JobState.KILLED and "memory" in killed.reason


def test_parse_final_picks_the_job_only_once_it_ended():
    history = read("openpbs-20.0.1/qstat-x-f.json")
    assert OPENPBS.parse_final(history, "1191.pbs-head").exit_code == 3
    assert OPENPBS.parse_final(history, "1191").exit_code == 3
    assert OPENPBS.parse_final(history, "9999.pbs-head") is None
    running = read("openpbs-20.0.1/qstat-f-t.json")
    assert OPENPBS.parse_final(running, "1201.pbs-head") is None
    completed = read("torque-6.1.3/qstat-f-x-t.xml")
    assert TORQUE.parse_final(completed, "5008.torque-head").exit_code == 2
    assert TORQUE.parse_final(completed, "5001.torque-head") is None
    assert TORQUE.parse_final(read("torque-6.1.3/qstat-f-x-empty.xml"), "5001.torque-head") is None


def test_openpbs_user_filter():
    listing = read("openpbs-20.0.1/qstat-f-t.json")
    mine = OPENPBS.parse_status(listing, user="osric")
    assert sorted(j.job_id for j in mine) == ["1202.pbs-head", "1206.pbs-head"]
    assert OPENPBS.parse_status(listing, user="nobody") == []


def test_cjson_layout_literals_and_escapes():
    jobs = by_id(OPENPBS.parse_status(read("pbspro-2024.1/qstat-f-t.json")))
    assert jobs["813.pbspro01"].name == "true"  # cJSON printed it as a literal
    assert jobs["814.pbspro01"].name == "7"  # a name "007" that cJSON made a number
    assert jobs["815.pbspro01"].name == 'say"hi"'
    variables = P.load_pbs_json(read("pbspro-2024.1/qstat-f-t.json"))["Jobs"]["812.pbspro01"]["Variable_List"]
    assert variables["PROMPT_COLOR"] == "\x1b[1m"
    assert variables["WINPATH"] == "C:\\temp\\x"
    assert variables["QUOTED"] == 'say "hi"'
    queues = {q.name: q for q in OPENPBS.parse_queues(read("pbspro-2024.1/qstat-Q-f.json"), "workq")}
    assert queues["workq"].is_default and queues["workq"].max_time == 96 * 3600  # duplicate keys read


def test_openpbs_hand_written_json_quirks_are_repaired():
    text = read("openpbs-quirks/qstat-f-t.json")
    jobs = by_id(OPENPBS.parse_status(text))
    assert [jobs[f"{n}.quirk-srv"].name for n in (77, 78, 79, 80)] == [
        "inf", "1e5", "nan", "123456789012345678901234567890"]
    variables = P.load_pbs_json(text)["Jobs"]["77.quirk-srv"]["Variable_List"]
    assert variables["foo"] == "005"
    assert [variables[f"FOO{i}"] for i in range(1, 6)] == [".123", "123.", "00", "-00", "00.123"]
    assert variables["MYVAR"] == "'\"asads\"'"
    assert variables["MYVAR2"] == "ab,c"
    assert variables["WINDIR"] == "C:\\data\\x"
    assert variables["BASH_FUNC_ml%%"] == '() {  eval "$($LMOD_DIR/ml_cmd "$@")"\n}'
    assert jobs["77.quirk-srv"].work_dir == "/home/zed/w"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("[1, 2]", "not an object"),
        ("qstat: cannot connect to server pbs-head (errno=15010)", "not readable JSON"),
    ],
)
def test_unreadable_json_is_a_clear_error(text, message):
    with pytest.raises(P.PbsParseError, match=message):
        P.parse_openpbs_jobs(text)


def test_truncated_json_names_the_line():
    with pytest.raises(P.PbsParseError, match=r"not readable JSON at line \d+"):
        P.parse_openpbs_jobs(read("openpbs-quirks/qstat-f-truncated.json"))


def test_no_jobs_member_is_an_empty_listing():
    text = '{\n    "timestamp":1699950188,\n    "pbs_version":"20.0.1",\n    "pbs_server":"pbs-head"\n}\n'
    assert P.parse_openpbs_jobs(text) == []


# ------------------------------------------------------------------------------ Torque jobs


def test_torque_running_job_in_detail():
    job = by_id(TORQUE.parse_status(read("torque-6.1.3/qstat-f-x-t.xml")))["5001.torque-head"]
    assert (job.name, job.user, job.queue, job.native_state) == ("lattice", "kwame", "batch", "R")
    assert job.hosts == ("node01", "node02") and job.num_procs == 8 and job.num_nodes == 2
    assert job.submit_time == "2024-03-05T08:33:20" and job.start_time == "2024-03-05T08:40:00"
    assert job.time_used == 3610 and job.time_limit == 12 * 3600
    assert job.work_dir == "/home/kwame/lattice"
    assert job.stdout_path == "/home/kwame/lattice/lattice.o5001"


def test_torque_completed_jobs_and_their_final_states():
    jobs = by_id(TORQUE.parse_status(read("torque-6.1.3/qstat-f-x-t.xml")))
    expected = {
        "5004.torque-head": (JobState.FINISHED, 0, ""),
        "5005.torque-head": (JobState.KILLED, None, "15"),  # 271: deleted while running
        "5006.torque-head": (JobState.KILLED, None, ""),  # deleted before it ran
        "5007.torque-head": (JobState.KILLED, -11, ""),  # wall time limit
        "5008.torque-head": (JobState.FAILED, 2, ""),
    }
    assert {k: (TORQUE.final_state(jobs[k]), jobs[k].exit_code, jobs[k].signal) for k in expected} == expected
    assert jobs["5006.torque-head"].cancelled and not jobs["5004.torque-head"].cancelled
    assert jobs["5004.torque-head"].end_time == "2024-03-05T07:31:52"


def test_torque_array_elements_and_derived_parent():
    jobs = by_id(TORQUE.parse_status(read("torque-6.1.3/qstat-f-x-t.xml")))
    elements = [jobs[f"5010[{i}].torque-head"] for i in (1, 2, 3)]
    assert [(e.array_id, e.array_index, e.native_state) for e in elements] == [
        ("5010[].torque-head", "1", "R"), ("5010[].torque-head", "2", "Q"), ("5010[].torque-head", "3", "C")]
    parent = jobs["5010[].torque-head"]
    assert (parent.name, parent.native_state, parent.array_index) == ("scan", "R", "1-3")
    done = by_id(TORQUE.parse_status(read("torque-4.2.10/qstat-f-x-t.xml")))["3005[].torque42.lab"]
    assert (done.name, done.native_state, done.exit_code) == ("arr", "C", 1)
    assert TORQUE.final_state(done) is JobState.FAILED


def test_array_parents_from_element_states():
    def element(index, state, exit_code=None, signal="", cancelled=False):
        return NativeJob(f"7[{index}].s", name=f"a-{index}", native_state=state, exit_code=exit_code,
                         signal=signal, array_id="7[].s", array_index=str(index), cancelled=cancelled)

    def parent(*members):
        (result,) = P.array_parents(list(members))
        return result

    assert parent(element(1, "H"), element(2, "H")).native_state == "H"
    assert parent(element(1, "H"), element(2, "Q")).native_state == "Q"
    assert parent(element(1, "C", 0), element(2, "Q")).native_state == "Q"
    assert parent(element(1, "C", 0), element(2, "S")).native_state == "R"
    all_ok = parent(element(1, "C", 0), element(2, "C", 0))
    assert (all_ok.native_state, all_ok.exit_code, all_ok.name, all_ok.array_index) == ("C", 0, "a", "1-2")
    killed = parent(element(1, "C", None, "15"), element(2, "C", None, cancelled=True))
    assert killed.signal == "15" and killed.cancelled
    assert P.array_parents([element(1, "R"), NativeJob("7[].s", array_id="7[].s")]) == []


def test_torque_entities_non_ascii_and_odd_exec_hosts():
    jobs = by_id(TORQUE.parse_status(read("torque-6.1.3/qstat-f-x-t.xml")))
    assert jobs["5012.torque-head"].name == "R&D<1> été"
    suspended = jobs["5011.torque-head"]
    assert (suspended.name, suspended.user) == ("étude_α", "élodie")
    assert suspended.num_procs == 3 and suspended.hosts == ("node05",)
    maxid = jobs["9223372036854775807.torque-head"]
    assert maxid.num_procs == 4 and maxid.time_limit == 9999 * 3600 + 59 * 60 + 59
    held = jobs["5003.torque-head"]
    assert held.work_dir == "/home/ana/w,x"  # a comma PBS escaped in Variable_List
    assert held.stderr_path == held.stdout_path == "/home/ana/waiting.log"  # Join_Path oe
    old = by_id(TORQUE.parse_status(read("torque-4.2.10/qstat-f-x-t.xml")))["3001.torque42.lab"]
    assert old.hosts == ("node03",) and old.num_procs == 4


def test_torque_xml_odd_inputs():
    assert P.parse_torque_jobs(read("torque-6.1.3/qstat-f-x-empty.xml")) == []
    assert P.parse_torque_jobs("") == []
    assert P.parse_torque_jobs('<?xml version="1.0"?>\n<Data/>\n') == []
    # A bare ampersand and a control character, which Torque writes unescaped.
    text = '<Data><Job><Job_Id>1.h</Job_Id><Job_Name>a&b\x01c</Job_Name><job_state>Q</job_state></Job></Data>'
    (job,) = P.parse_torque_jobs(text)
    assert job.name == "a&b\ufffdc"
    with pytest.raises(P.PbsParseError, match="document type"):
        P.parse_torque_jobs('<!DOCTYPE x [<!ENTITY a "b">]><Data></Data>')
    with pytest.raises(P.PbsParseError, match="not readable XML"):
        P.parse_torque_jobs("<Data><Job>")
    with pytest.raises(P.PbsParseError, match="root"):
        P.parse_torque_jobs("<html></html>")


def test_torque_user_filter():
    listing = read("torque-6.1.3/qstat-f-x-t.xml")
    assert {j.user for j in TORQUE.parse_status(listing, user="ana")} == {"ana"}
    assert "5010[].torque-head" in {j.job_id for j in TORQUE.parse_status(listing, user="kwame")}


# ------------------------------------------------------------------------------ nodes, queues


def test_openpbs_nodes():
    nodes = {n.name: n for n in OPENPBS.parse_nodes(read("openpbs-20.0.1/pbsnodes-a.json"))}
    assert (nodes["cn002"].cpus, nodes["cn002"].cpus_used, nodes["cn002"].memory_mb) == (8, 6, 31744)
    assert [nodes[n].state for n in ("cn001", "cn003", "cn004", "cn005", "gpu01")] == [
        "UP", "UP", "DOWN", "DOWN", "DOWN"]
    assert nodes["gpu01"].memory_mb == 1032192 and nodes["gpu01"].reason.startswith("GPU 2")
    assert nodes["cn005"].cpus is None
    newer = {n.name: n for n in OPENPBS.parse_nodes(read("openpbs-23.06.06/pbsnodes-a.json"))}
    assert newer["node-b02"].state == "ERROR" and newer["node-b03"].state == "DOWN"
    assert newer["node-b01"].queues == ("small",) and newer["ws-12"].memory_mb == 16384
    pro = {n.name: n for n in OPENPBS.parse_nodes(read("pbspro-2024.1/pbsnodes-a.json"))}
    assert pro["c12"].cpus_used == 12 and pro["g01"].cpus_used == 0 and pro["g01"].memory_mb == 1048576
    assert pro["g02"].state == "ERROR"


def test_torque_nodes():
    nodes = {n.name: n for n in TORQUE.parse_nodes(read("torque-6.1.3/pbsnodes-x.xml"))}
    assert (nodes["node01"].cpus, nodes["node01"].cpus_used, nodes["node01"].load) == (4, 4, 3.98)
    assert nodes["node05"].cpus_used == 3  # "0,2-3/5011..."
    assert nodes["node01"].memory_mb == 15884 and nodes["node01"].arch == "linux"
    assert nodes["node06"].reason == "PSU failure & fan - ticket 4411"
    assert [nodes[n].state for n in ("node01", "node03", "node06", "node07", "gpu01")] == [
        "UP", "UP", "DOWN", "DOWN", "DOWN"]
    old = {n.name: n for n in TORQUE.parse_nodes(read("torque-4.2.10/pbsnodes-x.xml"))}
    assert old["node03"].cpus_used == 4 and old["node06"].state == "UNKNOWN"


def test_queues_and_default_queue():
    server = OPENPBS.parse_server(read("openpbs-20.0.1/qstat-B-f.json"))
    assert server == P.ServerInfo("pbs-head", "workq", "20.0.1")
    queues = {q.name: q for q in OPENPBS.parse_queues(read("openpbs-20.0.1/qstat-Q-f.json"), server.default_queue)}
    workq = queues["workq"]
    assert (workq.is_default, workq.state, workq.max_time, workq.default_time) == (True, "NORMAL", 72 * 3600, 3600)
    assert (workq.waiting, workq.running) == (6, 7)
    assert (queues["long"].state, queues["long"].max_nodes, queues["long"].max_time) == ("STOPPED", 8, 336 * 3600)
    assert queues["gpu"].state == "STOPPED" and not queues["gpu"].is_default
    torque_server = TORQUE.parse_server(read("torque-6.1.3/qstat-B-f-1.txt"))
    assert torque_server == P.ServerInfo("torque-head", "batch", "6.1.3")
    tq = {q.name: q for q in TORQUE.parse_queues(read("torque-6.1.3/qstat-Q-f-1.txt"), "batch")}
    assert tq["batch"].is_default and (tq["batch"].waiting, tq["batch"].running) == (5, 3)
    assert tq["short"].max_nodes == 2 and tq["maint"].state == "STOPPED"
    assert P.parse_torque_server(read("openpbs-20.0.1/qstat-B-f.txt")).default_queue == "workq"


def test_full_text_continuation_lines_are_joined():
    (record,) = P.parse_full_text(read("torque-4.2.10/qstat-Q-f.txt"))
    assert record[2]["acl_hosts"].endswith("visual01.lab,visual02.lab")
    (server,) = P.parse_full_text(read("openpbs-20.0.1/qstat-B-f.txt"))
    assert server[2]["license_count"] == "Avail_Global:10000000 Avail_Local:10000000 Used:0 High_Use:0"


@pytest.mark.parametrize(
    "native, state",
    [
        ("free", "UP"), ("job-busy", "UP"), ("job-exclusive", "UP"), ("busy", "UP"),
        ("resv-exclusive", "UP"), ("job-sharing", "UP"), ("time-shared", "UP"),
        ("provisioning", "UP"), ("sleep", "UP"),
        ("offline", "DOWN"), ("down", "DOWN"), ("down,offline", "DOWN"), ("maintenance", "DOWN"),
        ("state-unknown,down", "DOWN"), ("job-busy,offline", "DOWN"),
        ("stale", "ERROR"), ("unresolvable", "ERROR"), ("stale,offline", "ERROR"),
        ("state-unknown", "UNKNOWN"), ("", "UNKNOWN"), ("new-word", "UNKNOWN"), ("free,new-word", "UNKNOWN"),
    ],
)
def test_node_state_words(native, state):
    assert node_state(native) == state


def test_queue_state():
    assert queue_state(True, True) == "NORMAL"
    assert {queue_state(a, b) for a, b in ((True, False), (False, True), (False, False))} == {"STOPPED"}


# ------------------------------------------------------------------------------ small parsers


@pytest.mark.parametrize(
    "text, hosts, slots",
    [
        ("cn001/0*4+cn002/0*4", ("cn001", "cn002"), 8),
        ("node01/0+node01/1+node02/0", ("node01", "node02"), 3),
        ("node01/0-3", ("node01",), 4),
        ("node01/0-3,8-11+node02/0-7", ("node01", "node02"), 16),
        ("node05/0,2-3", ("node05",), 3),
        ("cn01:15002/2", ("cn01",), 1),
        ("bare", ("bare",), 1),
        ("", (), 0),
        (None, (), 0),
    ],
)
def test_exec_host_forms(text, hosts, slots):
    assert P.parse_exec_host(text) == (hosts, slots)


@pytest.mark.parametrize(
    "text, megabytes",
    [("65536000kb", 64000), ("64gb", 65536), ("2tb", 2097152), ("1048576", 1), ("1048576b", 1),
     ("131072kw", 1024), ("1pb", 1024 ** 3), ("512MB", 512), ("0kb", 0), ("lots", None), ("", None),
     ("-5kb", None), ("18446744073709551615b", 17592186044415)],
)
def test_sizes(text, megabytes):
    assert P.size_megabytes(text) == megabytes


@pytest.mark.parametrize(
    "text, seconds",
    [("01:00:00", 3600), ("120:00:00", 432000), ("9999:59:59", 35999999), ("05:07", 307),
     ("3600", 3600), ("3600.7", 3600), ("1:02:03:04", 93784), ("", None), ("-00:01:00", None),
     ("UNLIMITED", None), ("1:xx:00", None), (None, None), ("1:2:3:4:5", None)],
)
def test_durations(text, seconds):
    assert P.duration_seconds(text) == seconds


def test_times():
    assert P.ctime_to_local("Tue Nov 14 07:49:55 2023") == "2023-11-14T07:49:55"
    assert P.ctime_to_local("Fri Mar  1 08:01:02 2024") == "2024-03-01T08:01:02"
    assert P.ctime_to_local("1709624000") == "2024-03-05T08:33:20"
    assert P.ctime_to_local("yesterday") == "" and P.ctime_to_local("Xyz Foo 1 00:00:00 2024") == ""
    assert P.epoch_to_local("0") == "" and P.epoch_to_local("-5") == "" and P.epoch_to_local("x") == ""
    assert P.epoch_to_local(10 ** 30) == ""


def test_exit_status_decoding():
    assert P.decode_exit_status("openpbs", None) == (None, "", "")
    assert P.decode_exit_status("openpbs", "0") == (0, "", "")
    assert P.decode_exit_status("torque", "271") == (None, "15", "ended by signal 15")
    code, signal, reason = P.decode_exit_status("openpbs", "-29")
    assert (code, signal) == (-29, "") and "wall time" in reason
    assert "wall time" in P.decode_exit_status("torque", "-11")[2]
    assert "rerun" in P.decode_exit_status("openpbs", "-11")[2]  # the same code, another meaning
    assert "could not run" in P.decode_exit_status("torque", "-99")[2]


def test_qsub_output_forms():
    assert P.parse_qsub_output("1234.server\n") == "1234.server"
    assert P.parse_qsub_output("note: your job uses the default queue\n77[].srv\n") == "77[].srv"
    assert P.parse_qsub_output("9223372036854775807\n") == "9223372036854775807"
    for bad in ("", "qsub: Unknown queue\n", "1234.server junk\n", "-1.server\n"):
        with pytest.raises(P.PbsParseError):
            P.parse_qsub_output(bad)


def test_unknown_job_messages():
    assert P.is_unknown_job_error(read("openpbs-20.0.1/qstat-x-unknown.stderr"))
    assert P.is_unknown_job_error(read("torque-6.1.3/qstat-unknown.stderr"))
    assert not P.is_unknown_job_error(read("openpbs-20.0.1/qsig-unauthorized.stderr"))


# ------------------------------------------------------------------------------ probing


@pytest.mark.parametrize(
    "directory, family, flavour, version",
    [
        ("openpbs-20.0.1", "openpbs", "OpenPBS", (20, 0, 1)),
        ("openpbs-23.06.06", "openpbs", "OpenPBS", (23, 6, 6)),
        ("pbspro-2024.1", "openpbs", "PBS Professional", (2024, 1, 0, 20240322085327)),
        ("torque-4.2.10", "torque", "Torque", (4, 2, 10)),
        ("torque-6.1.3", "torque", "Torque", (6, 1, 3)),
    ],
)
def test_probe_version_output(directory, family, flavour, version):
    stdout_file = DATA / directory / "qstat-version.stdout"
    stderr_file = DATA / directory / "qstat-version.stderr"
    probe = P.detect_family(
        stdout_file.read_text() if stdout_file.exists() else "",
        stderr_file.read_text() if stderr_file.exists() else "",
    )
    assert (probe.family, probe.flavour, probe.version) == (family, flavour, version)
    system = system_for(probe)
    assert system.family == family and system.version == version


def test_probe_falls_back_to_server_attributes():
    for name, family, version in [
        ("openpbs-20.0.1/qstat-B-f.txt", "openpbs", (20, 0, 1)),
        ("torque-4.2.10/qstat-B-f.txt", "torque", (4, 2, 10)),
        ("torque-6.1.3/qstat-B-f-1.txt", "torque", (6, 1, 3)),
    ]:
        probe = P.detect_family("", "qstat: invalid option -- '-'\n", read(name))
        assert (probe.family, probe.version) == (family, version), name
    bare = "Server: old\n    pbs_version = 13.1.2\n"
    assert P.detect_family("", "", bare).flavour == "PBS Professional"


def test_probe_odd_versions_and_failure():
    latest = P.detect_family("pbs_version = latest\n")
    assert (latest.family, latest.version) == ("openpbs", ()) and latest.at_least(99)
    assert P.detect_family("pbs_version = 18.1.4\n").flavour == "PBS Professional"
    assert P.detect_family("", "Version: 7.0.1-rc2\nCommit: abc\n").version == (7, 0, 1)
    assert not P.detect_family("pbs_version = 18.1.4\n").at_least(19)
    with pytest.raises(P.PbsParseError, match="cannot tell which PBS"):
        P.detect_family("", "bash: qstat: command not found\n")
    with pytest.raises(P.PbsParseError, match="printed nothing"):
        P.detect_family("", "", "")
    assert P.VERSION_PROBE_ARGV == ("qstat", "--version")
    assert P.SERVER_PROBE_ARGV == ("qstat", "-B", "-f")


# ------------------------------------------------------------------------------ state tables

OPENPBS_DOCUMENTED = "BEFHMQRSTUWX"
TORQUE_DOCUMENTED = "CEHQRTWS"


def test_every_documented_state_letter_has_a_row():
    assert set(OPENPBS_STATES) == set(OPENPBS_DOCUMENTED)
    assert set(TORQUE_STATES) == set(TORQUE_DOCUMENTED)
    for system, letters in ((OPENPBS, OPENPBS_DOCUMENTED), (TORQUE, TORQUE_DOCUMENTED)):
        for letter in letters:
            assert system.state_table.map(letter) is not JobState.OTHER
            assert system.state_table.map(f" {letter.lower()}\n") is system.state_table.map(letter)
    assert OPENPBS.state_table.map("S") is JobState.SUSPENDED and TORQUE.state_table.map("C") is JobState.FINISHED
    assert OPENPBS.state_table.map("C") is JobState.OTHER  # a Torque letter, not an OpenPBS one
    assert TORQUE.state_table.map("F") is JobState.OTHER


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_state_tables_never_raise(text):
    for system in (OPENPBS, TORQUE):
        assert isinstance(system.state_table.map(text), JobState)
        assert isinstance(system.final_state(NativeJob("1.s", native_state=text)), JobState)
    assert node_state(text) in ("UP", "DOWN", "ERROR", "UNKNOWN")


@settings(max_examples=200, deadline=None)
@given(
    state=st.sampled_from(["F", "X", "C", "R", "Q"]),
    exit_code=st.one_of(st.none(), st.integers(-40, 300)),
    signal=st.sampled_from(["", "9", "15"]),
    cancelled=st.booleans(),
)
def test_final_state_of_any_record_is_consistent(state, exit_code, signal, cancelled):
    job = NativeJob("1.s", native_state=state, exit_code=exit_code, signal=signal, cancelled=cancelled)
    for system in (OPENPBS, TORQUE):
        result = system.final_state(job)
        if system.state_table.map(state) is JobState.FINISHED:
            assert result.final
            if cancelled:
                assert result is JobState.KILLED
            elif exit_code == 0 and not signal:
                assert result is JobState.FINISHED
        else:
            assert result is system.state_table.map(state)


# ------------------------------------------------------------------------------ command argv


def test_status_and_listing_argv():
    assert OPENPBS.status_argv() == ["qstat", "-f", "-F", "json", "-t"]
    assert TORQUE.status_argv() == ["qstat", "-f", "-x", "-t"]
    assert OPENPBS.nodes_argv() == ["pbsnodes", "-a", "-F", "json"]
    assert TORQUE.nodes_argv() == ["pbsnodes", "-x"]
    assert OPENPBS.queues_argv() == ["qstat", "-Q", "-f", "-F", "json"]
    assert TORQUE.queues_argv() == ["qstat", "-Q", "-f", "-1"]
    assert OPENPBS.server_argv() == ["qstat", "-B", "-f", "-F", "json"]
    assert OPENPBS.final_argv("12.s") == ["qstat", "-x", "-f", "-F", "json", "12.s"]
    assert TORQUE.final_argv("12.s") == ["qstat", "-f", "-x", "12.s"]
    assert TORQUE.tracejob_argv("12.s") == ["tracejob", "-n", "2", "12.s"]


@pytest.mark.parametrize("system", [OPENPBS, TORQUE])
def test_job_command_argv(system):
    assert system.delete_argv("12.s") == ["qdel", "12.s"]
    assert system.hold_argv("12[].s") == ["qhold", "12[].s"]
    assert system.release_argv("12[3].s@other") == ["qrls", "12[3].s@other"]
    assert system.suspend_argv("4000000001234.hpc-pbs") == ["qsig", "-s", "suspend", "4000000001234.hpc-pbs"]
    assert system.resume_argv("12") == ["qsig", "-s", "resume", "12"]
    assert system.move_argv("12.s", "long") == ["qmove", "long", "12.s"]


@pytest.mark.parametrize(
    "job_id",
    ["", "-12", "12; rm -rf /", "$(id)", "12 13", "12\n", "abc", "12.s\0", "12[", "`x`", "12.-s", "--help"],
)
def test_hostile_job_ids_are_refused(job_id):
    for system in (OPENPBS, TORQUE):
        for build in (system.delete_argv, system.hold_argv, system.suspend_argv, system.final_argv):
            with pytest.raises(JobError) as caught:
                build(job_id)
            assert caught.value.kind is ErrorKind.BAD_REQUEST


@pytest.mark.parametrize("queue", ["", "-q", "a b", "x\ny", "tab\there", "\0"])
def test_hostile_queue_names_are_refused(queue):
    with pytest.raises(JobError) as caught:
        OPENPBS.move_argv("12.s", queue)
    assert caught.value.kind is ErrorKind.NO_SUCH_QUEUE


def test_running_jobs_do_not_move():
    OPENPBS.check_move(JobState.QUEUING)
    OPENPBS.check_move(JobState.HOLD)
    for state in (JobState.RUNNING, JobState.SUSPENDED, JobState.FINISHED):
        with pytest.raises(JobError, match="cannot move"):
            TORQUE.check_move(state)


def test_command_errors_become_service_errors():
    unauthorized = OPENPBS.command_error("suspend", "1201.pbs-head", read("openpbs-20.0.1/qsig-unauthorized.stderr"))
    assert unauthorized.kind is ErrorKind.OPERATION_FAILED and "operator or manager" in unauthorized.message
    wrong_state = OPENPBS.command_error("move", "1201.pbs-head", read("openpbs-20.0.1/qmove-running.stderr"))
    assert "present state" in wrong_state.message
    unknown = TORQUE.command_error("delete", "2999.torque42.lab", read("torque-4.2.10/qdel-unknown.stderr"))
    assert unknown.kind is ErrorKind.NO_SUCH_JOB
    down = TORQUE.command_error("hold", "1.s", "qhold: cannot connect to server torque-head (errno=111) Connection refused\n")
    assert down.kind is ErrorKind.UNAVAILABLE
    queue = OPENPBS.command_error("move", "1.s", "qmove: Unknown queue  1.s\n")
    assert queue.kind is ErrorKind.NO_SUCH_QUEUE
    other = OPENPBS.command_error("release", "1.s", "")
    assert isinstance(other, ServiceError) and "release" in other.message
    assert OPENPBS.submit_error("qsub: Unknown queue\n").kind is ErrorKind.NO_SUCH_QUEUE
    assert OPENPBS.submit_error("qsub: Job exceeds queue resource limits MSG=walltime\n").kind is ErrorKind.SUBMIT_FAILED
    assert OPENPBS.submit_error("pbs_iff: cannot connect to host\n").kind is ErrorKind.UNAVAILABLE


def test_parse_submit():
    assert OPENPBS.parse_submit(read("openpbs-20.0.1/qsub-array.stdout")) == "1208[].pbs-head"
    with pytest.raises(ServiceError) as caught:
        TORQUE.parse_submit("")
    assert caught.value.kind is ErrorKind.SUBMIT_FAILED


def test_unicode_escapes_and_missing_fields():
    text = (
        '{"pbs_version":"23.06.06","Jobs":{'
        '"5.s":{"Job_Name":"\\u00c9t\\u00e9 \\ud83d\\ude80","job_state":"Q","Job_Owner":"u@h"},'
        '"6.s":{"job_state":"R"},'
        '"7.s":{}}}'
    )
    jobs = by_id(P.parse_openpbs_jobs(text))
    assert jobs["5.s"].name == "Été 🚀"
    bare = jobs["6.s"]
    assert (bare.name, bare.user, bare.hosts, bare.num_procs, bare.time_limit, bare.submit_time) == (
        "", "", (), None, None, "")
    assert OPENPBS.state_table.map(jobs["7.s"].native_state) is JobState.OTHER
    (node,) = P.parse_openpbs_nodes('{"nodes":{"n1":{}}}', node_state)
    assert (node.name, node.state, node.cpus, node.memory_mb) == ("n1", "UNKNOWN", None, None)
    (queue,) = P.parse_openpbs_queues('{"Queue":{"q":{}}}', None, queue_state)
    assert (queue.state, queue.waiting, queue.max_time) == ("STOPPED", None, None)
    (torque_job,) = P.parse_torque_jobs("<Data><Job><Job_Id>8.h</Job_Id></Job></Data>")
    assert torque_job.job_id == "8.h" and torque_job.native_state == ""
    assert P.parse_torque_jobs("<Data><Job><Job_Name>x</Job_Name></Job></Data>") == []  # no id: skipped


_PARSERS = [
    P.parse_openpbs_jobs, P.parse_openpbs_nodes, P.parse_openpbs_queues, P.parse_openpbs_server,
    P.parse_torque_jobs, P.parse_torque_nodes, P.parse_torque_queues, P.parse_torque_server,
    P.parse_full_text, P.parse_qsub_output, lambda t: P.parse_tracejob(t, "openpbs"),
    lambda t: P.detect_family(t, t, t),
]


def _mangled(name: str):
    """Recordings cut, spliced and sprinkled with odd characters."""
    text = read(name)
    return st.tuples(st.integers(0, len(text)), st.integers(0, len(text)), st.text(max_size=8)).map(
        lambda t: text[: t[0]] + t[2] + text[t[1]:]
    )


@settings(max_examples=150, deadline=None)
@given(st.one_of(
    st.text(max_size=200),
    _mangled("openpbs-20.0.1/qstat-f-t.json"),
    _mangled("openpbs-quirks/qstat-f-t.json"),
    _mangled("torque-6.1.3/qstat-f-x-t.xml"),
    _mangled("torque-6.1.3/pbsnodes-x.xml"),
    _mangled("torque-6.1.3/qstat-Q-f-1.txt"),
    _mangled("openpbs-20.0.1/tracejob-finished.txt"),
))
def test_parsers_fail_only_with_their_own_error(text):
    for parse in _PARSERS:
        try:
            parse(text)
        except P.PbsParseError:
            pass
