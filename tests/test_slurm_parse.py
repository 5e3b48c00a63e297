"""SLURM parsers: every recorded file, the state tables, the argv builders, large listings.

Recorded data lives in tests/data/slurm/<version>/ (see the README there: 22.05.8 is captured
from a real cluster by capture.py, 21.08.5 and 23.11.4 are hand-written reconstructions).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.frontends.ptp import mapping
from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.batch.slurm import system as slurm
from proxy_agent.schedulers.batch.slurm.parse import (
    FIELD_SEP,
    RECORD_SEP,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmPartition,
)

DATA = Path(__file__).parent / "data" / "slurm"
REAL = DATA / "22.05.8"
VERSIONS = sorted(p.name for p in DATA.iterdir() if p.is_dir() and p.name[0].isdigit())


def job_state(raw: str):
    """(PTP jobState, SLURM's long state name) of a job in SLURM state ``raw``, as a client sees it."""
    return (mapping.PTP_JOB_STATE[slurm.STATE_TABLE.map(raw).value], slurm.native_word(raw))


def load_make_large():
    spec = importlib.util.spec_from_file_location("make_large", DATA / "make_large.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_large = load_make_large()


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture
def capture_tz(monkeypatch):
    """Render JSON epochs in the time zone the real capture ran in (its roles.json says)."""
    roles = json.loads(read(REAL / "roles.json"))
    offset = roles.get("utc_offset", "+0000")
    sign = "-" if offset.startswith("+") else "+"  # POSIX TZ offsets are west-positive
    monkeypatch.setenv("TZ", f"CAP{sign}{offset[1:3]}:{offset[3:5]}")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# --------------------------------------------------------------------------------------------
# Every recorded file parses
# --------------------------------------------------------------------------------------------

PARSERS = {
    "squeue.txt": sp.parse_squeue_text,
    "squeue.json": sp.parse_squeue_json,
    "sinfo-nodes.txt": sp.parse_sinfo_nodes_text,
    "sinfo-nodes-drain.txt": sp.parse_sinfo_nodes_text,
    "sinfo.json": sp.parse_nodes_json,
    "sinfo-drain.json": sp.parse_nodes_json,
    "scontrol-nodes.txt": sp.parse_scontrol_nodes,
    "scontrol-nodes-drain.txt": sp.parse_scontrol_nodes,
    "scontrol-nodes.json": sp.parse_nodes_json,
    "scontrol-partitions.txt": sp.parse_scontrol_partitions,
    "scontrol-partitions-down.txt": sp.parse_scontrol_partitions,
    "scontrol-partitions.json": sp.parse_partitions_json,
    "scontrol-jobs.txt": sp.parse_scontrol_jobs,
    "scontrol-job-multiline.txt": sp.parse_scontrol_jobs,
    "scontrol-jobs.json": sp.parse_scontrol_jobs_json,
    "sacct.txt": sp.parse_sacct_text,
    "sacct-completion.txt": sp.parse_sacct_text,
    "sacct.json": sp.parse_sacct_json,
}
RESULT_TYPES = {
    sp.parse_squeue_text: SlurmJob, sp.parse_squeue_json: SlurmJob, sp.parse_scontrol_jobs: SlurmJob,
    sp.parse_scontrol_jobs_json: SlurmJob, sp.parse_sacct_text: SlurmJob, sp.parse_sacct_json: SlurmJob,
    sp.parse_sinfo_nodes_text: SlurmNode, sp.parse_nodes_json: SlurmNode,
    sp.parse_scontrol_nodes: SlurmNode, sp.parse_scontrol_partitions: SlurmPartition,
    sp.parse_partitions_json: SlurmPartition,
}
RECORDED = [
    (version, name)
    for version in VERSIONS
    for name in sorted(os.listdir(DATA / version))
    if name in PARSERS
]


def test_recorded_data_is_there():
    assert "22.05.8" in VERSIONS and len(VERSIONS) >= 3
    assert len(RECORDED) >= 25


@pytest.mark.parametrize("version,name", RECORDED)
def test_every_recorded_file_parses(version, name):
    parser = PARSERS[name]
    records = parser(read(DATA / version / name))
    assert records, f"{version}/{name} gave no records"
    for r in records:
        assert isinstance(r, RESULT_TYPES[parser])
        if isinstance(r, SlurmJob):
            assert r.job_id.isdigit(), r
            assert r.state and r.state == r.state.strip()
            state, status = job_state(r.state)
            assert state in ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED")
            assert status in sp.JOB_STATE_CODES.values(), f"unmapped state {r.state!r}"
            assert ":" in r.exit_code or r.exit_code == ""
        elif isinstance(r, SlurmNode):
            assert r.name and r.state and r.cpus and r.memory_mb
            assert sp.map_node_state(r.state)[0] in ("UP", "DOWN", "ERROR", "UNKNOWN")
        else:
            assert r.name and r.state in ("UP", "DOWN", "DRAIN", "INACTIVE")


def test_unsupported_queries_were_recorded_with_their_errors():
    for name in ("scontrol-jobs.json", "scontrol-nodes.json", "scontrol-partitions.json"):
        text = read(REAL / (name + ".unsupported.txt"))
        assert "unrecognized option '--json'" in text
    assert "accounting storage is disabled" in read(REAL / "sacct.json.unsupported.txt")
    assert "accounting storage is disabled" in read(REAL / "sacct.unsupported.txt")


# --------------------------------------------------------------------------------------------
# The real 22.05.8 capture, job by job
# --------------------------------------------------------------------------------------------

ROLES = json.loads(read(REAL / "roles.json"))


def by_id(jobs):
    return {j.job_id: j for j in jobs}


def role(name):
    return ROLES["jobs"][name]["job_id"]


def test_version_file():
    assert sp.parse_version(read(REAL / "version.txt")) == (22, 5, 8)
    assert sp.json_version(read(REAL / "squeue.json")) == (22, 5, 8)


@pytest.mark.parametrize("source", ["squeue.txt", "squeue.json", "scontrol-jobs.txt"])
def test_real_jobs_reach_their_intended_states(source):
    jobs = by_id(PARSERS[source](read(REAL / source)))
    for name, info in ROLES["jobs"].items():
        assert jobs[info["job_id"]].state == info["expect"], name


def test_real_sacct_completion_has_the_finished_jobs():
    jobs = by_id(sp.parse_sacct_text(read(REAL / "sacct-completion.txt")))
    finished = {n: i for n, i in ROLES["jobs"].items() if i["expect"] not in ("RUNNING", "PENDING", "SUSPENDED")}
    for name, info in finished.items():
        j = jobs[info["job_id"]]
        assert j.state == info["expect"], name
        assert j.user == "root"
    assert jobs[role("failed")].exit_code == "3:0"
    assert jobs[role("cancelled_pending")].nodes == ""
    assert jobs[role("timeout")].time_limit == "1"
    assert sp.duration_seconds(jobs[role("timeout")].time_limit) == 60


@pytest.mark.parametrize("source", ["squeue.txt", "squeue.json", "scontrol-jobs.txt"])
def test_real_job_details(source):
    jobs = by_id(PARSERS[source](read(REAL / source)))
    odd = jobs[role("running_odd_name")]
    assert odd.name == ROLES["odd_name"]
    assert odd.partition == "debug" and odd.nodes == ROLES["node"]
    assert odd.num_nodes == 1 and odd.num_cpus == 1 and odd.num_tasks == 1
    uni = jobs[role("suspended_unicode")]
    assert uni.name == ROLES["unicode_name"]
    assert uni.work_dir.endswith("/dir with space")
    assert uni.partition == "long"
    assert jobs[role("pending_moved")].partition == "long"
    assert jobs[role("pending_resources")].num_cpus == 2
    assert jobs[role("held")].reason == "JobHeldUser"
    assert jobs[role("dependency")].reason == "Dependency"
    arr = jobs[role("held_array")]
    assert (arr.array_job_id, arr.array_task_id) == (role("held_array"), "1-3")
    assert jobs[role("failed")].exit_code == "3:0"
    # srun exits 128+9 when its task is SIGKILLed; the batch shell exits with that.
    assert jobs[role("signaled")].exit_code == "137:0"
    assert jobs[role("completed")].exit_code == "0:0"
    assert jobs[role("held")].start_time == ""
    assert jobs[role("completed")].account == ""
    assert sp.duration_seconds(jobs[role("suspended_unicode")].time_limit) == 3600


def test_real_text_and_json_listings_agree(capture_tz):
    text = by_id(sp.parse_squeue_text(read(REAL / "squeue.txt")))
    js = by_id(sp.parse_squeue_json(read(REAL / "squeue.json")))
    assert text.keys() == js.keys()
    same = ("name", "user", "account", "partition", "state", "reason", "nodes", "num_nodes",
            "num_cpus", "num_tasks", "time_limit", "exit_code", "submit_time", "start_time",
            "end_time", "work_dir", "array_job_id", "array_task_id")
    for job_id, t in text.items():
        j = js[job_id]
        for field in same:
            assert getattr(t, field) == getattr(j, field), (job_id, field)
    # 22.05 JSON leaves an unset StdOut empty where the text shows the default file name.
    uni = js[role("suspended_unicode")]
    assert uni.stdout_path == text[role("suspended_unicode")].stdout_path


def test_real_json_user_filter_and_run_time():
    doc = read(REAL / "squeue.json")
    assert sp.parse_squeue_json(doc, user="nobody") == []
    assert len(sp.parse_squeue_json(doc, user="root")) == len(ROLES["jobs"])
    odd = by_id(sp.parse_squeue_json(doc))[role("running_odd_name")]
    assert odd.time_used == ""
    start = json.loads(doc)
    start = next(j["start_time"] for j in start["jobs"] if str(j["job_id"]) == role("running_odd_name"))
    later = by_id(sp.parse_squeue_json(doc, now=start + 65))[role("running_odd_name")]
    assert later.time_used == "1:05"


def test_real_multiline_scontrol_equals_oneline():
    multi = sp.parse_scontrol_jobs(read(REAL / "scontrol-job-multiline.txt"))
    one = by_id(sp.parse_scontrol_jobs(read(REAL / "scontrol-jobs.txt")))
    assert len(multi) == 1
    # Captured a few seconds apart: only the run time may differ.
    assert attrs.evolve(multi[0], time_used="") == attrs.evolve(one[multi[0].job_id], time_used="")


def test_real_nodes():
    node = ROLES["node"]
    for source in ("sinfo-nodes.txt", "sinfo.json", "scontrol-nodes.txt"):
        (n,) = PARSERS[source](read(REAL / source))
        assert n.name == node and n.partitions == ("debug", "long")
        assert n.cpus >= 2 and n.memory_mb > 0
        assert sp.map_node_state(n.state)[0] == "UP"
    drained = {s: PARSERS[s](read(REAL / s))[0] for s in
               ("sinfo-nodes-drain.txt", "sinfo-drain.json", "scontrol-nodes-drain.txt")}
    for source, n in drained.items():
        assert sp.map_node_state(n.state) == ("DOWN", n.state), source
        assert n.reason.startswith("disk check, ticket #42"), source
    assert drained["sinfo-nodes-drain.txt"].state == "draining"
    assert drained["scontrol-nodes-drain.txt"].state.endswith("+DRAIN")
    assert drained["sinfo-drain.json"].state == drained["scontrol-nodes-drain.txt"].state


def test_real_config():
    config = sp.parse_scontrol_config(read(REAL / "scontrol-config.txt"))
    assert config["ClusterName"] == "proxyagent"
    assert config["AccountingStorageType"] == "accounting_storage/none"
    assert config["JobCompType"] == "jobcomp/filetxt"
    assert config["MinJobAge"] == "300 sec"
    assert config["SLURM_VERSION"] == ROLES["version"]
    assert sp.config_argv() == ["scontrol", "show", "config"]
    assert len(config) > 100


def test_real_partitions():
    parts = {p.name: p for p in sp.parse_scontrol_partitions(read(REAL / "scontrol-partitions.txt"))}
    assert parts["debug"].is_default and not parts["long"].is_default
    assert parts["debug"].max_time == "01:00:00" and parts["long"].max_time == "1-00:00:00"
    assert parts["debug"].default_time == "00:10:00"
    assert parts["debug"].max_nodes is None and parts["debug"].total_nodes == 1
    assert parts["debug"].nodes == ROLES["node"]
    assert [sp.map_partition_state(p.state)[0] for p in parts.values()] == ["NORMAL", "NORMAL"]
    down = {p.name: p for p in sp.parse_scontrol_partitions(read(REAL / "scontrol-partitions-down.txt"))}
    assert down["long"].state == "DOWN"
    assert sp.map_partition_state(down["long"].state) == ("STOPPED", "DOWN")


# --------------------------------------------------------------------------------------------
# Hand-written layouts of other versions
# --------------------------------------------------------------------------------------------


def test_21_08_json_layout():
    jobs = by_id(sp.parse_squeue_json(read(DATA / "21.08.5" / "squeue.json")))
    assert jobs["4101"].state == "RUNNING" and jobs["4101"].nodes == "cn[01-02]"
    assert jobs["4101"].num_cpus == 64 and jobs["4101"].time_limit == "1:00:00"
    assert jobs["4101"].stdout_path == "/home/alice/md-4101.out"
    assert jobs["4102"].time_limit == "UNLIMITED"
    assert (jobs["4110"].array_job_id, jobs["4110"].array_task_id) == ("4107", "3")
    assert (jobs["4107"].array_job_id, jobs["4107"].array_task_id) == ("4107", "4-9%2")
    assert jobs["4111"].exit_code == "2:0"
    assert jobs["4112"].exit_code == "0:9"
    assert jobs["4110"].time_used == "1:00"
    assert job_state(jobs["4113"].state) == ("RUNNING", "COMPLETING")
    assert jobs["4103"].account == "" and jobs["4103"].user == "bob"


def test_21_08_text_and_json_agree():
    text = by_id(sp.parse_squeue_text(read(DATA / "21.08.5" / "squeue.txt")))
    js = by_id(sp.parse_squeue_json(read(DATA / "21.08.5" / "squeue.json")))
    assert text.keys() == js.keys()
    for job_id in text:
        for field in ("name", "user", "account", "partition", "state", "reason", "nodes",
                      "num_cpus", "time_limit", "exit_code", "array_job_id", "array_task_id"):
            assert getattr(text[job_id], field) == getattr(js[job_id], field), (job_id, field)


def test_21_08_nodes_in_all_formats():
    expected = {
        "cn01": "UP", "cn02": "UP", "cn03": "UP", "cn04": "DOWN", "cn05": "DOWN",
        "cn06": "DOWN", "cn07": "ERROR",
    }
    for source in ("sinfo-nodes.txt", "sinfo.json", "scontrol-nodes.txt"):
        nodes = PARSERS[source](read(DATA / "21.08.5" / source))
        assert {n.name: sp.map_node_state(n.state)[0] for n in nodes} == expected, source
        by_name = {n.name: n for n in nodes}
        assert by_name["cn01"].partitions == ("batch", "short")
        assert by_name["cn06"].partitions == ("batch",)
        assert by_name["cn04"].reason.startswith("bad DIMM")
        assert by_name["cn03"].reason == ""
        assert by_name["cn04"].alloc_cpus == 4
    scontrol = {n.name: n for n in sp.parse_scontrol_nodes(read(DATA / "21.08.5" / "scontrol-nodes.txt"))}
    assert scontrol["cn04"].state == "MIXED+DRAIN"
    assert scontrol["cn01"].cpus == 32 and scontrol["cn01"].memory_mb == 128000


def test_21_08_partitions_and_jobs_text():
    parts = {p.name: p for p in sp.parse_scontrol_partitions(read(DATA / "21.08.5" / "scontrol-partitions.txt"))}
    assert parts["batch"].is_default and parts["batch"].max_time == "UNLIMITED"
    assert parts["batch"].default_time == "NONE"
    assert parts["short"].max_nodes == 2 and parts["short"].total_cpus == 160
    assert sp.map_partition_state(parts["old"].state)[0] == "STOPPED"
    jobs = by_id(sp.parse_scontrol_jobs(read(DATA / "21.08.5" / "scontrol-jobs.txt")))
    assert jobs["4101"].name == 'md | run "A"' and jobs["4101"].user == "alice"
    assert (jobs["4110"].array_job_id, jobs["4110"].array_task_id) == ("4107", "3")
    assert jobs["4111"].exit_code == "2:0"
    records = sp.parse_scontrol_records(read(DATA / "21.08.5" / "scontrol-jobs.txt"))
    assert records[2]["Comment"] == "retry with key=value inside"
    assert records[0]["AllocNode:Sid"] == "login1:12345"
    assert records[0]["TRES"] == "cpu=64,node=2,billing=64"


def test_21_08_sacct():
    jobs = by_id(sp.parse_sacct_text(read(DATA / "21.08.5" / "sacct.txt")))
    assert job_state(jobs["4112"].state) == ("COMPLETED", "CANCELLED")
    assert jobs["4112"].exit_code == "0:9"
    assert (jobs["4110"].array_job_id, jobs["4110"].array_task_id) == ("4107", "3")
    assert (jobs["4107"].array_job_id, jobs["4107"].array_task_id) == ("4107", "4-9%2")
    assert jobs["4107"].nodes == ""
    assert jobs["4101"].array_job_id == ""
    assert job_state(jobs["4114"].state)[1] == "OUT_OF_MEMORY"


def test_23_11_json_layouts():
    d = DATA / "23.11.4"
    jobs = by_id(sp.parse_squeue_json(read(d / "squeue.json")))
    assert sp.json_version(read(d / "squeue.json")) == (23, 11, 4)
    j = jobs["801"]
    assert j.state == "RUNNING" and j.name == 'lattice | "qcd" ✓' and j.num_cpus == 16
    assert j.time_limit == "2:00:00" and j.stdout_path == "/home/carol/qcd-801.out"
    assert jobs["802"].time_limit == "UNLIMITED" and jobs["802"].reason == "Dependency"
    assert (jobs["806"].array_job_id, jobs["806"].array_task_id) == ("804", "2")
    assert (jobs["804"].array_job_id, jobs["804"].array_task_id) == ("804", "3-8")
    assert jobs["807"].exit_code == "0:11"
    assert jobs["808"].exit_code == "42:0"
    assert jobs["809"].state == "COMPLETED+COMPLETING"
    assert job_state(jobs["809"].state) == ("RUNNING", "COMPLETING")
    assert job_state(jobs["811"].state) == ("SUSPENDED", "SUSPENDED")
    assert jobs["803"].account == ""
    assert sp.parse_scontrol_jobs_json(read(d / "scontrol-jobs.json")) == [j]

    nodes = {n.name: n for n in sp.parse_nodes_json(read(d / "scontrol-nodes.json"))}
    assert nodes["cpu08"].state == "MIXED+DRAIN"
    assert {k: sp.map_node_state(n.state)[0] for k, n in nodes.items()} == {
        "gpu1": "UP", "gpu2": "UP", "cpu07": "UP", "cpu08": "DOWN", "cpu09": "DOWN",
        "cpu10": "DOWN", "cpu11": "ERROR", "cpu12": "UP", "cpu13": "DOWN", "cpu14": "UNKNOWN",
    }
    assert nodes["cpu07"].partitions == ("compute", "debug")

    parts = {p.name: p for p in sp.parse_partitions_json(read(d / "scontrol-partitions.json"))}
    assert parts["compute"].is_default and parts["compute"].max_time == "UNLIMITED"
    assert parts["compute"].default_time == "" and parts["compute"].max_nodes is None
    assert parts["gpu"].max_time == "2-00:00:00" and parts["gpu"].default_time == "1:00:00"
    assert parts["gpu"].max_nodes == 2 and parts["gpu"].total_nodes == 2
    assert parts["gpu"].nodes == "gpu[1-2]"
    assert [sp.map_partition_state(p.state)[0] for p in parts.values()] == [
        "NORMAL", "NORMAL", "STOPPED", "STOPPED"]

    acct = by_id(sp.parse_sacct_json(read(d / "sacct.json")))
    assert acct["812"].state == "TIMEOUT" and acct["812"].time_used == "30:00"
    assert acct["812"].num_cpus == 4 and acct["812"].exit_code == "0:15"
    assert (acct["806"].array_job_id, acct["806"].array_task_id) == ("804", "2")
    assert acct["813"].nodes == "" and acct["813"].start_time == ""
    assert acct["813"].time_limit == "UNLIMITED"

    agg = {n.name: n for n in sp.parse_nodes_json(read(d / "sinfo.json"))}
    assert agg["cpu07"].partitions == ("compute", "debug")
    assert agg["cpu08"].state == "MIXED+DRAIN" and agg["cpu08"].reason == "ECC memory error"
    assert set(agg) == {"cpu07", "cpu08", "cpu09", "gpu1", "gpu2"}


# --------------------------------------------------------------------------------------------
# State tables
# --------------------------------------------------------------------------------------------

JOB_CASES = {
    "PENDING": ("STARTING", "PENDING"),
    "CONFIGURING": ("STARTING", "CONFIGURING"),
    "REQUEUED": ("STARTING", "REQUEUED"),
    "RUNNING": ("RUNNING", "RUNNING"),
    "COMPLETING": ("RUNNING", "COMPLETING"),
    "SUSPENDED": ("SUSPENDED", "SUSPENDED"),
    "STOPPED": ("SUSPENDED", "STOPPED"),
    "COMPLETED": ("COMPLETED", "COMPLETED"),
    "FAILED": ("COMPLETED", "FAILED"),
    "CANCELLED": ("COMPLETED", "CANCELLED"),
    "CANCELLED by 1000": ("COMPLETED", "CANCELLED"),
    "TIMEOUT": ("COMPLETED", "TIMEOUT"),
    "NODE_FAIL": ("COMPLETED", "NODE_FAIL"),
    "OUT_OF_MEMORY": ("COMPLETED", "OUT_OF_MEMORY"),
    "PREEMPTED": ("COMPLETED", "PREEMPTED"),
    "BOOT_FAIL": ("COMPLETED", "BOOT_FAIL"),
    "DEADLINE": ("COMPLETED", "DEADLINE"),
    "PD": ("STARTING", "PENDING"),
    "CG": ("RUNNING", "COMPLETING"),
    "CA": ("COMPLETED", "CANCELLED"),
    "OOM": ("COMPLETED", "OUT_OF_MEMORY"),
    "running": ("RUNNING", "RUNNING"),
    "COMPLETED+COMPLETING": ("RUNNING", "COMPLETING"),
    "PENDING+REQUEUED": ("STARTING", "REQUEUED"),
    "": ("STARTING", "UNKNOWN"),
    "SOMETHING_NEW": ("STARTING", "SOMETHING_NEW"),
}


@pytest.mark.parametrize("raw,expected", sorted(JOB_CASES.items()))
def test_job_state_mapping(raw, expected):
    assert job_state(raw) == expected


def test_job_states_cover_the_ptp_states():
    assert {job_state(name)[0] for name in sp.JOB_STATE_CODES.values()} == {
        "STARTING", "RUNNING", "SUSPENDED", "COMPLETED"}


NODE_CASES = {
    "IDLE": "UP", "idle": "UP", "MIXED": "UP", "mix": "UP", "ALLOCATED": "UP", "alloc": "UP",
    "COMPLETING": "UP", "comp": "UP", "PLANNED": "UP", "RESERVED": "UP", "MAINT": "UP",
    "IDLE+CLOUD": "UP", "IDLE+POWERED_DOWN": "UP", "idle~": "UP", "idle#": "UP", "mixed-": "UP",
    "DOWN": "DOWN", "down": "DOWN", "down*": "DOWN", "DOWN*": "DOWN", "DOWN+NOT_RESPONDING": "DOWN",
    "DRAIN": "DOWN", "drained": "DOWN", "drained*": "DOWN", "draining": "DOWN", "drng": "DOWN",
    "IDLE+DRAIN": "DOWN", "MIXED+DRAIN": "DOWN", "ALLOCATED+DRAIN": "DOWN", "FUTURE": "DOWN",
    "idle*": "ERROR", "IDLE*": "ERROR", "IDLE+NOT_RESPONDING": "ERROR", "mixed*": "ERROR",
    "FAIL": "ERROR", "fail": "ERROR", "FAILING": "ERROR", "ALLOCATED+FAIL": "ERROR",
    "inval": "ERROR", "DOWN+FAIL": "ERROR",
    "UNKNOWN": "UNKNOWN", "unk": "UNKNOWN", "": "UNKNOWN", "SOMETHING_NEW": "UNKNOWN",
}


@pytest.mark.parametrize("raw,expected", sorted(NODE_CASES.items()))
def test_node_state_mapping(raw, expected):
    assert sp.map_node_state(raw) == (expected, raw)


@pytest.mark.parametrize("raw,expected", [("UP", "NORMAL"), ("up", "NORMAL"), ("DOWN", "STOPPED"),
                                          ("DRAIN", "STOPPED"), ("INACTIVE", "STOPPED"), ("", "STOPPED")])
def test_partition_state_mapping(raw, expected):
    assert sp.map_partition_state(raw) == (expected, raw)


# --------------------------------------------------------------------------------------------
# argv builders
# --------------------------------------------------------------------------------------------


def test_squeue_argv():
    argv = sp.squeue_argv()
    assert argv[:3] == ["squeue", "--noheader", "--states=all"]
    fmt = argv[3]
    assert fmt.startswith("--Format=")
    fields = fmt[len("--Format="):].split(",")
    assert [f.split(":")[0] for f in fields] == [name for name, _ in sp.SQUEUE_FIELDS]
    assert all(f.endswith(":0" + FIELD_SEP) for f in fields[:-1])
    assert fields[-1] == "Name:0" + RECORD_SEP
    assert sp.SQUEUE_FIELDS[-1] == ("Name", "name")
    assert sp.squeue_argv(user="alice")[-1] == "--user=alice"
    assert sp.squeue_argv(user="alice", json=True) == ["squeue", "--json"]


def test_squeue_fields_fill_every_job_attribute_once():
    attrs_filled = [a for _, a in sp.SQUEUE_FIELDS]
    assert sorted(attrs_filled) == sorted(f.name for f in SlurmJob.__attrs_attrs__)


def test_other_argv():
    assert sp.nodes_argv()[:3] == ["sinfo", "--Node", "--noheader"]
    assert sp.nodes_argv(json=True) == ["sinfo", "--json"]
    assert sp.nodes_argv(json=True, version=(22, 5, 8)) == ["sinfo", "--json"]
    assert sp.nodes_argv(json=True, version=(23, 2, 0)) == ["scontrol", "show", "nodes", "--json"]
    assert sp.partitions_argv() == ["scontrol", "--oneliner", "show", "partition"]
    assert sp.scontrol_job_argv("12") == ["scontrol", "--oneliner", "show", "job", "12"]
    assert sp.scontrol_job_argv("12", json=True) == ["scontrol", "show", "job", "12", "--json"]
    assert sp.sacct_argv(["1", "2_3"], completion=True)[:3] == ["sacct", "--allocations", "--completion"]
    assert "--jobs=1,2_3" in sp.sacct_argv(["1", "2_3"])
    assert "--allusers" in sp.sacct_argv() and "--allusers" not in sp.sacct_argv(["1"])
    assert "--user=bob" in sp.sacct_argv(user="bob")
    assert sp.sacct_argv(json=True)[:3] == ["sacct", "--allocations", "--json"]
    assert sp.sacct_argv(start_time="now-1hour")[-1] == "--starttime=now-1hour"
    assert sp.move_job_argv("7", "long") == ["scontrol", "update", "JobId=7", "Partition=long"]
    assert sp.scancel_argv("7_[1-3]") == ["scancel", "7_[1-3]"]
    assert sp.hold_job_argv("7") == ["scontrol", "hold", "7"]
    assert sp.release_job_argv("7") == ["scontrol", "release", "7"]
    assert sp.suspend_job_argv("7") == ["scontrol", "suspend", "7"]
    assert sp.resume_job_argv("7") == ["scontrol", "resume", "7"]
    assert sp.version_argv() == ["sinfo", "--version"]


@pytest.mark.parametrize("bad", ["", "-1", "--all", "1 2", "1,2", "x", "1\n2", "JobId=1"])
def test_job_ids_are_checked(bad):
    with pytest.raises(ValueError):
        sp.scancel_argv(bad)


@pytest.mark.parametrize("bad", ["", "a b", "a=b", "a\n"])
def test_partition_names_are_checked(bad):
    with pytest.raises(ValueError):
        sp.move_job_argv("1", bad)


def test_json_support_table():
    assert sp.json_support((22, 5, 8)) == {
        "squeue": True, "nodes": True, "partitions": False, "job": False, "sacct": True}
    assert all(sp.json_support((23, 11, 4)).values())
    assert not any(sp.json_support((20, 11, 9)).values())
    assert not any(sp.json_support(None).values())


# --------------------------------------------------------------------------------------------
# Small helpers and edge cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("123", "123"), ("123;cluster", "123"), ("  77\n", "77"),
    ("sbatch: warning: something\n99;c1\n", "99"),
])
def test_parse_sbatch_parsable(text, expected):
    assert sp.parse_sbatch_parsable(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "sbatch: error: Batch job submission failed", "abc;x"])
def test_parse_sbatch_parsable_errors(text):
    with pytest.raises(SlurmError):
        sp.parse_sbatch_parsable(text)


@pytest.mark.parametrize("text,seconds", [
    ("0:05", 5), ("10:00", 600), ("1:00:00", 3600), ("01:00:00", 3600), ("1-00:00:00", 86400),
    ("2-03", 2 * 86400 + 3 * 3600), ("2-03:04", 2 * 86400 + 3 * 3600 + 240), ("10", 600),
    ("UNLIMITED", None), ("INVALID", None), ("NONE", None), ("N/A", None), ("", None),
    ("1:2:3:4", None), ("a-1", None),
])
def test_duration_seconds(text, seconds):
    assert sp.duration_seconds(text) == seconds


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_format_duration_round_trips(seconds):
    assert sp.duration_seconds(sp.format_duration(seconds)) == seconds


@pytest.mark.parametrize("status,text", [(0, "0:0"), (768, "3:0"), (9, "0:9"), (35072, "137:0"),
                                         (15 | 0x80, "0:15"), (-1, "")])
def test_exit_code_from_status(status, text):
    assert sp.exit_code_from_status(status) == text


def test_parse_version_forms():
    assert sp.parse_version("slurm 23.11.4\n") == (23, 11, 4)
    assert sp.parse_version("slurm-wlm 22.05.8") == (22, 5, 8)
    assert sp.parse_version("slurm 24.05.0-0rc1") == (24, 5, 0)
    assert sp.parse_version("slurm 25.05") == (25, 5, 0)
    with pytest.raises(SlurmError):
        sp.parse_version("no version here")


def squeue_line(values):
    return FIELD_SEP.join(values) + RECORD_SEP + "\n"


BASE_FIELDS = ["42", "42", "N/A", "u", "(null)", "p", "RUNNING", "None", "n1", "1", "2", "2",
               "0:01", "10:00", "0", "2024-01-01T00:00:00", "2024-01-01T00:00:01", "N/A", "/w",
               "/w/o", "/w/e"]


def test_squeue_text_robustness():
    odd = "a\nname with \x1f sep | and \x1e too"
    text = squeue_line(BASE_FIELDS + [odd]) + squeue_line(BASE_FIELDS[:5] + ["short"])
    text += FIELD_SEP.join(BASE_FIELDS + ["cut short"])  # no terminator: truncated output
    jobs = sp.parse_squeue_text(text)
    assert len(jobs) == 1
    assert jobs[0].name == odd and jobs[0].nodes == "n1" and jobs[0].num_cpus == 2
    assert jobs[0].end_time == "" and jobs[0].account == ""
    assert sp.parse_squeue_text("") == []


names = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x1e"),
                max_size=30)
plain = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1,
                max_size=20).filter(lambda s: s not in sp._NULLS and s == s.strip())


@settings(max_examples=200)
@given(name=names, user=plain, work=plain, cpus=st.integers(0, 10**6), status=st.integers(0, 255))
def test_squeue_text_round_trip(name, user, work, cpus, status):
    fields = list(BASE_FIELDS)
    fields[3], fields[10], fields[14], fields[18] = user, str(cpus), str(status << 8), work
    (job,) = sp.parse_squeue_text(squeue_line(fields + [name]))
    assert (job.name, job.user, job.num_cpus, job.work_dir) == (name, user, cpus, work)
    assert job.exit_code == f"{status}:0"


def test_scontrol_records_tolerate_odd_values():
    text = ("NodeName=n1 State=IDLE+DRAIN OS=Linux 6.1 #1 SMP  RealMemory=100 "
            "Reason=Not responding=maybe [slurm@2024-01-01T00:00:00] \n"
            "   \n"
            "No nodes in the system\n")
    (rec,) = sp.parse_scontrol_records(text)
    assert rec["OS"] == "Linux 6.1 #1 SMP" and rec["RealMemory"] == "100"
    assert rec["Reason"] == "Not responding=maybe [slurm@2024-01-01T00:00:00]"
    assert sp.parse_scontrol_jobs("No jobs in the system\n") == []


def test_json_errors_are_reported():
    with pytest.raises(SlurmError, match="not JSON"):
        sp.parse_squeue_json("squeue: error: something")
    with pytest.raises(SlurmError, match="Invalid user"):
        sp.parse_squeue_json(json.dumps({"errors": [{"description": "Invalid user"}]}))
    with pytest.raises(SlurmError):
        sp.parse_nodes_json("[]")


def test_value_classes_are_frozen():
    job = SlurmJob("1")
    with pytest.raises(Exception):
        job.state = "RUNNING"  # type: ignore[misc]
    assert job == SlurmJob(job_id="1")
    assert SlurmNode("n").partitions == ()
    assert SlurmPartition("p").is_default is False


# --------------------------------------------------------------------------------------------
# Large synthetic listings
# --------------------------------------------------------------------------------------------


def python_lines(call):
    """How many lines of Python ``call()`` runs."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_large_squeue_text_is_parsed_in_one_pass():
    text = make_large.squeue_text(100_000)
    jobs = sp.parse_squeue_text(text)
    assert len(jobs) == 100_000
    assert jobs[13].name == 'job 13 | sweep="13"'
    assert jobs[4].state == "FAILED" and jobs[4].exit_code == "5:0"
    assert jobs[1].start_time == "" and jobs[1].nodes == ""
    # The same work per record whatever the listing's size (how fast: scripts/bench_slurm_parse.py;
    # goal well under 0.5 s for 100,000 records).
    small, large = (python_lines(lambda t=make_large.squeue_text(n): sp.parse_squeue_text(t)) for n in (1000, 10_000))
    assert large <= 10.5 * small, (small, large)


@pytest.mark.parametrize("layout", ["22.05", "23.11"])
def test_large_squeue_json(layout):
    text = make_large.squeue_json(20_000, layout)
    jobs = sp.parse_squeue_json(text)
    assert len(jobs) == 20_000
    ref = sp.parse_squeue_text(make_large.squeue_text(20_000))
    for a, b in zip(jobs[:200], ref[:200]):
        assert (a.job_id, a.name, a.state, a.num_cpus, a.time_limit, a.exit_code, a.nodes) == (
            b.job_id, b.name, b.state, b.num_cpus, b.time_limit, b.exit_code, b.nodes)


def test_large_other_listings():
    assert len(sp.parse_scontrol_jobs(make_large.scontrol_jobs_text(5_000))) == 5_000
    assert len(sp.parse_sacct_text(make_large.sacct_text(20_000))) == 20_000
    for maker, parser in ((make_large.sinfo_nodes_text, sp.parse_sinfo_nodes_text),
                          (make_large.scontrol_nodes_text, sp.parse_scontrol_nodes),
                          (make_large.sinfo_nodes_json, sp.parse_nodes_json)):
        nodes = parser(maker(10_000))
        assert len(nodes) == 10_000, parser
        assert nodes[1].partitions == ("debug", "long") and nodes[0].partitions == ("debug",)
        states = [sp.map_node_state(n.state)[0] for n in nodes[:8]]
        assert states == ["UP", "UP", "UP", "DOWN", "ERROR", "DOWN", "DOWN", "UP"], parser


def test_bulk_parsers_leave_the_garbage_collector_as_they_found_it():
    import gc

    assert gc.isenabled()
    sp.parse_squeue_text(make_large.squeue_text(10))
    assert gc.isenabled()
    gc.disable()
    try:
        sp.parse_squeue_text(make_large.squeue_text(10))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(SlurmError):
        sp.parse_squeue_json("nope")
    assert gc.isenabled()
