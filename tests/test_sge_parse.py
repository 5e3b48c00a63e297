"""Grid Engine without a cell: parsers on real recordings, the state tables, job commands,
and the qsub options and job script (every hostile value reaches the program verbatim).

The recordings in tests/data/sge/8.1.9 come from a real cell (see the README there);
``roles.json`` says which job is which and in what state it was recorded.  Variants that
the real cell cannot produce (non-ASCII job names, which 8.1.9 refuses) are made here from
a real recording by replacing one value, and say so.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.schedulers.batch.sge import directives as sge_script, parse as sge_parse, system as sge
from proxy_agent.schedulers.batch.sge.parse import SgeParseError
from proxy_agent.service.jobs import ErrorKind, JobError, JobSpec, JobState, SubmitError
from wait_support import scaled

DATA = Path(__file__).parent / "data" / "sge" / "8.1.9"
ROLES = json.loads((DATA / "roles.json").read_text(encoding="utf-8"))
TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\Z")


def data(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def by_id(jobs):
    return {job.job_id: job for job in jobs}


def role_id(role: str) -> str:
    return ROLES[role]["id"].split(".")[0] if role in ("array", "rich") else ROLES[role]["id"]


# --------------------------------------------------------------------------- job listings


def test_all_users_listing_has_every_role_in_its_state():
    jobs = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    for role in ("running", "suspended", "other_running", "odd_name", "pending_pe", "pending_gpu",
                 "held", "moved", "other_held", "long_name", "error"):
        job = jobs[ROLES[role]["id"]]
        assert job.native_state == ROLES[role]["state"], role
    states = {j: sge.STATE_TABLE.map(job.native_state) for j, job in jobs.items()}
    assert states[ROLES["running"]["id"]] is JobState.RUNNING
    assert states[ROLES["suspended"]["id"]] is JobState.SUSPENDED
    assert states[ROLES["held"]["id"]] is JobState.HOLD
    assert states[ROLES["pending_pe"]["id"]] is JobState.QUEUING
    assert states[ROLES["error"]["id"]] is JobState.HOLD
    assert JobState.OTHER not in states.values()


def test_listing_fields():
    jobs = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    host = sge_parse.parse_hosts(data("qhost.xml"))[0].name
    running = jobs[ROLES["running"]["id"]]
    assert (running.queue, running.hosts, running.num_procs, running.user) == ("all.q", (host,), 1, "root")
    assert TIME.match(running.start_time) and running.submit_time == ""
    assert running.name == "running"
    other = jobs[ROLES["other_running"]["id"]]
    assert (other.user, other.queue) == ("sgeuser", "short.q")
    held = jobs[ROLES["held"]["id"]]
    assert held.time_limit == 300 and TIME.match(held.submit_time) and held.hosts == ()
    # A pending job is in no queue; the one it asked for is shown (the move is visible).
    assert jobs[ROLES["moved"]["id"]].queue == "short.q"
    assert jobs[ROLES["pending_pe"]["id"]].num_procs == 8


def test_hostile_and_long_names_come_back_exactly():
    jobs = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    assert jobs[ROLES["odd_name"]["id"]].name == ROLES["names"]["odd"]
    # Grid Engine writes "<" as "%lt;" in its XML; the parser undoes that.
    assert "%lt;" in data("qstat-all-users.xml")
    assert jobs[ROLES["long_name"]["id"]].name == ROLES["names"]["long"]
    assert len(ROLES["names"]["long"]) == 300


def test_array_tasks_and_pending_groups():
    jobs = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    array = ROLES["array"]
    number = role_id("array")
    for task_id in array["running_tasks"]:
        task = jobs[task_id]
        assert (task.native_state, task.array_id, task.array_index) == ("r", number, task_id.split(".")[1])
    pending = jobs[array["pending"]]
    assert pending.native_state == "qw" and pending.array_index == array["pending"].split(".", 1)[1]
    assert jobs[array["held"]].native_state == "hqw"
    rich = jobs[ROLES["rich"]["id"]]
    assert (rich.array_id, rich.array_index, rich.num_procs, rich.time_limit) == (role_id("rich"), "1-3:1", 2, 120)


def test_own_and_other_users_listings():
    own = sge_parse.parse_jobs(data("qstat.xml"))
    assert own and {j.user for j in own} == {"root"}
    other = sge_parse.parse_jobs(data("qstat-user-other.xml"))
    assert {j.job_id for j in other} == {ROLES["other_running"]["id"], ROLES["other_held"]["id"]}
    everyone = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    assert {j.job_id for j in own} | {j.job_id for j in other} == set(everyone)


def test_plain_listing_without_requests():
    jobs = by_id(sge_parse.parse_jobs(data("qstat-plain.xml")))
    held = jobs[ROLES["held"]["id"]]
    assert held.native_state == "hqw" and held.time_limit is None  # no -r: no requests
    assert jobs[ROLES["long_name"]["id"]].name == ROLES["names"]["long"]


def test_full_queue_listing_gives_the_same_jobs():
    nested = by_id(sge_parse.parse_jobs(data("qstat-f-full.xml")))
    flat = by_id(sge_parse.parse_jobs(data("qstat-all-users.xml")))
    assert set(nested) == set(flat)
    for job_id, job in flat.items():
        assert (nested[job_id].native_state, nested[job_id].queue, nested[job_id].hosts) == \
            (job.native_state, job.queue, job.hosts), job_id


def test_passing_states_transfer_deletion_reschedule_queue_suspended():
    transfer = by_id(sge_parse.parse_jobs(data("qstat-transfer.xml")))
    assert transfer[ROLES["transfer"]["id"]].native_state == "t"
    deleting = by_id(sge_parse.parse_jobs(data("qstat-deleting.xml")))
    for role in ("deleted_running", "deleted_suspended", "deleted_transfer"):
        job = deleting[ROLES[role]["id"]]
        assert job.native_state == ROLES[role]["state"]
        assert sge.STATE_TABLE.map(job.native_state) is JobState.FINISHING
    assert sge.STATE_TABLE.map("t") is JobState.RUNNING
    resched = by_id(sge_parse.parse_jobs(data("qstat-rescheduled.xml")))
    assert resched[ROLES["rescheduled_running"]["id"]].native_state == "Rr"
    assert sge.STATE_TABLE.map(ROLES["rescheduled_queued"]["state_seen"]) in (JobState.QUEUING, JobState.RUNNING)
    suspended = by_id(sge_parse.parse_jobs(data("qstat-queue-suspended.xml")))
    job = suspended[ROLES["queue_suspended"]["id"]]
    assert job.native_state == "S" and sge.STATE_TABLE.map("S") is JobState.SUSPENDED


def test_non_ascii_names_from_a_recording_variant():
    # Composed from a real recording: this Grid Engine refuses such names at submission
    # (qsub-unicode-name.unsupported.txt), others accept them and print them as UTF-8.
    assert "Error reading answer list" in data("qsub-unicode-name.unsupported.txt")
    text = data("qstat-all-users.xml").replace("<JB_name>other_held</JB_name>",
                                               "<JB_name>résumé ✓ 名前</JB_name>")
    text = text.replace("<full_job_name>other_held</full_job_name>",
                        "<full_job_name>résumé ✓ 名前</full_job_name>")
    jobs = by_id(sge_parse.parse_jobs(text.encode("utf-8")))
    assert jobs[ROLES["other_held"]["id"]].name == "résumé ✓ 名前"
    # The same bytes cut in the middle of a character, or in Latin-1: replaced, not fatal.
    broken = text.encode("utf-8").replace("名".encode("utf-8"), "名".encode("utf-8")[:2])
    latin = text.replace("résumé ✓ 名前", "résumé").encode("latin-1", errors="replace")
    for raw in (broken, latin):
        name = by_id(sge_parse.parse_jobs(raw))[ROLES["other_held"]["id"]].name
        assert name.startswith("r") and "\ufffd" in name


def test_control_characters_and_odd_entries():
    text = data("qstat.xml").replace("<JB_name>held</JB_name>", "<JB_name>he\x01ld\x1b</JB_name>")
    text = text.replace("<full_job_name>held</full_job_name>", "<full_job_name>he\x01ld\x1b</full_job_name>")
    jobs = by_id(sge_parse.parse_jobs(text))
    assert jobs[ROLES["held"]["id"]].name == "he\ufffdld\ufffd"
    # An entry without a job number is skipped, not fatal.
    text = data("qstat.xml").replace(f"<JB_job_number>{ROLES['held']['id']}</JB_job_number>",
                                     "<JB_job_number></JB_job_number>")
    assert ROLES["held"]["id"] not in by_id(sge_parse.parse_jobs(text))
    empty = "<?xml version='1.0'?>\n<job_info>\n  <queue_info>\n  </queue_info>\n  <job_info>\n  </job_info>\n</job_info>\n"
    assert sge_parse.parse_jobs(empty) == []


@pytest.mark.parametrize("text", [
    "",
    "error: commlib error: got select error (Connection refused)\n",
    data("qstat.xml")[:500],
    "<?xml version='1.0'?><!DOCTYPE x [<!ENTITY a 'aaaa'><!ENTITY b '&a;&a;&a;'>]><job_info>&b;</job_info>",
    '<!DOCTYPE x SYSTEM "file:///etc/passwd"><job_info/>',
])
def test_unreadable_output_raises_a_clear_error(text):
    with pytest.raises(SgeParseError) as err:
        sge_parse.parse_jobs(text)
    assert "qstat -xml" in str(err.value)


PARSERS = [sge_parse.parse_jobs, sge_parse.parse_queues, sge_parse.parse_queue_instances,
           sge_parse.parse_hosts, sge_parse.parse_job_detail, sge_parse.unknown_job_ids,
           sge_parse.parse_qacct, sge_parse.parse_qsub_terse, sge_parse.parse_queue_config]
RECORDINGS = sorted(p.name for p in DATA.iterdir() if p.suffix in (".xml", ".txt"))


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
@settings(max_examples=300)
def test_parsers_never_fail_other_than_clearly_on_noise(noise):
    for parser in PARSERS:
        try:
            parser(noise)
        except SgeParseError:
            pass


@given(st.sampled_from(RECORDINGS), st.integers(min_value=0), st.integers(min_value=0, max_value=400),
       st.text(max_size=20))
@settings(max_examples=300, deadline=None)
def test_parsers_on_damaged_recordings(name, start, length, insert):
    text = data(name)
    start %= max(1, len(text))
    damaged = text[:start] + insert + text[start + length:]
    for parser in PARSERS:
        try:
            parser(damaged)
        except SgeParseError:
            pass


def test_huge_name_does_not_break_parsing():
    name = "x" * 200_000
    text = data("qstat.xml").replace("<full_job_name>held</full_job_name>", f"<full_job_name>{name}</full_job_name>")
    assert by_id(sge_parse.parse_jobs(text))[ROLES["held"]["id"]].name == name


# --------------------------------------------------------------------------- queues and hosts


def test_queues():
    queues = {q.name: q for q in sge_parse.parse_queues(data("qstat-f.xml"))}
    assert (queues["all.q"].total_slots, queues["short.q"].total_slots) == (4, 2)
    assert queues["all.q"].state == queues["short.q"].state == "NORMAL"
    # all.q: running + suspended + two array tasks; short.q: another user's and the odd name.
    assert (queues["all.q"].free_slots, queues["short.q"].free_slots) == (0, 0)
    assert (queues["all.q"].running, queues["short.q"].running) == (4, 2)
    host = sge_parse.parse_hosts(data("qhost.xml"))[0].name
    assert queues["all.q"].hosts == (host,) and queues["all.q"].total_nodes == 1


@pytest.mark.parametrize("name, letter", [
    ("qstat-f-suspended.xml", "s"), ("qstat-f-disabled.xml", "d"), ("qstat-f-host-down.xml", "u"),
])
def test_stopped_queues(name, letter):
    queues = {q.name: q for q in sge_parse.parse_queues(data(name))}
    short = queues["short.q"]
    assert (short.native_state, short.state, short.free_slots) == (letter, "STOPPED", 0)
    if letter == "u":
        assert queues["all.q"].state == "STOPPED"
    else:
        assert queues["all.q"].state == "NORMAL"


def test_queue_instances_keep_job_state_apart_from_queue_state():
    instances = sge_parse.parse_queue_instances(data("qstat-f-disabled.xml"))
    short = [qi for qi in instances if qi.queue == "short.q"][0]
    # The jobs inside show state "r"; the queue instance's own state is "d".
    assert short.state == "d" and short.running_jobs


def test_hosts():
    nodes = sge_parse.parse_hosts(data("qhost.xml"))
    assert [n.name for n in nodes] != ["global"] and len(nodes) == 1
    node = nodes[0]
    assert (node.state, node.native_state, node.queues) == ("UP", "", ("all.q", "short.q"))
    assert node.cpus >= 1 and node.memory_mb > 100 and node.load is not None and node.arch
    assert node.cpus_used == 6  # every slot of both queues is taken in this recording
    plain = sge_parse.parse_hosts(data("qhost-plain.xml"))[0]
    assert (plain.name, plain.cpus, plain.queues, plain.cpus_used) == (node.name, node.cpus, (), None)


def test_host_down_and_suspended_queue():
    down = sge_parse.parse_hosts(data("qhost-host-down.xml"))[0]
    assert (down.state, down.native_state, down.load) == ("DOWN", "u", None)
    assert "execution daemon" in down.reason
    suspended = sge_parse.parse_hosts(data("qhost-suspended.xml"))[0]
    assert (suspended.state, suspended.native_state) == ("UP", "s")


def test_queue_instance_letters():
    assert set(sge.QUEUE_INSTANCE_LETTERS) == set("aAuCsSdDEcoP")
    assert sge.node_state("") == "UP"
    assert sge.node_state("u") == sge.node_state("au") == sge.node_state("Eu") == "DOWN"
    assert sge.node_state("E") == "ERROR" and sge.node_state("dE") == "ERROR"
    assert sge.node_state("c") == sge.node_state("o") == "UNKNOWN"
    assert sge.node_state("Z") == "UNKNOWN"
    for letters in ("a", "A", "C", "s", "S", "d", "D", "P"):
        assert sge.node_state(letters) == "UP", letters
    assert not sge.queue_instance_stopped("")
    for letter in sge.QUEUE_INSTANCE_LETTERS:
        assert sge.queue_instance_stopped(letter), letter
    assert sge.queue_instance_stopped("Z")


# --------------------------------------------------------------------------- detail


def test_error_job_detail_gives_the_reason():
    [job] = sge_parse.parse_job_detail(data("qstat-j-error.xml"))
    assert job.job_id == ROLES["error"]["id"]
    assert job.reason.startswith("can't open output file \"/nonexistent/dir/out\"")
    assert job.stdout_path == "/nonexistent/dir/out"


def test_rich_detail():
    [job] = sge_parse.parse_job_detail(data("qstat-j-rich.xml"))
    assert (job.job_id, job.name, job.account, job.queue, job.num_procs, job.time_limit) == \
        (role_id("rich"), "rich", "acct1", "short.q", 2, 120)
    assert job.work_dir.endswith("/dïr ü")
    assert job.stdout_path.endswith("/out wörld.txt") and job.stderr_path.endswith("/a:b.err")
    assert TIME.match(job.submit_time) and job.start_time == ""
    assert "hold" in job.reason


def test_running_array_and_several_details():
    [running] = sge_parse.parse_job_detail(data("qstat-j-running.xml"))
    assert TIME.match(running.start_time) and running.reason == ""
    [array] = sge_parse.parse_job_detail(data("qstat-j-array.xml"))
    assert array.job_id == role_id("array") and TIME.match(array.start_time)
    two = sge_parse.parse_job_detail(data("qstat-j-two.xml"))
    assert [j.job_id for j in two] == [ROLES["held"]["id"], ROLES["moved"]["id"]]
    # qalter -q rewrote the moved job's queue list (with another wrapping element).
    assert [j.queue for j in two] == ["", "short.q"] and two[0].time_limit == 300


def test_unknown_job_detail():
    assert sge_parse.parse_job_detail(data("qstat-j-unknown.xml")) == []
    assert sge_parse.unknown_job_ids(data("qstat-j-unknown.xml")) == ["999999"]
    assert sge_parse.unknown_job_ids(data("qstat-j-error.xml")) == []


# --------------------------------------------------------------------------- accounting


def test_accounting_exit_codes_and_final_states():
    [ok] = sge_parse.parse_qacct(data("qacct-exit0.txt"))
    assert (ok.job_id, ok.exit_code, ok.signal, ok.native_state) == (ROLES["exit0"]["id"], 0, "", "exited")
    assert sge.accounting_state(ok) is JobState.FINISHED
    assert TIME.match(ok.start_time) and TIME.match(ok.end_time) and ok.queue and ok.hosts
    assert ok.num_procs == 1 and ok.time_used is not None and ok.user == "root"
    [fail] = sge_parse.parse_qacct(data("qacct-exit3.txt"))
    assert fail.exit_code == 3 and sge.accounting_state(fail) is JobState.FAILED
    [limit] = sge_parse.parse_qacct(data("qacct-h_rt.txt"))
    assert (limit.exit_code, limit.signal) == (137, "SIGKILL")
    assert limit.reason.startswith("37") and sge.accounting_state(limit) is JobState.KILLED
    [deleted] = sge_parse.parse_qacct(data("qacct-deleted-running.txt"))
    assert deleted.job_id == ROLES["deleted_running"]["id"]
    assert deleted.reason.startswith("100") and sge.accounting_state(deleted) is JobState.KILLED


def test_rescheduled_job_has_two_records_and_the_last_counts():
    records = sge_parse.parse_qacct(data("qacct-rescheduled.txt"))
    assert len(records) == 2 and {r.job_id for r in records} == {ROLES["rescheduled"]["id"]}
    assert records[0].reason.startswith("25")  # rescheduling
    final = sge.final_record(records)
    assert final is records[1] and sge.accounting_state(final) is JobState.FINISHED
    assert sge.final_record([]) is None


def test_accounting_unknown_and_odd_records():
    assert "not found" in data("qacct-unknown.txt")
    assert sge_parse.parse_qacct(data("qacct-unknown.txt")) == []
    text = data("qacct-exit3.txt")
    odd = text.replace(re.search(r"start_time.*", text).group(0), "start_time   -/-")
    odd = odd.replace(re.search(r"taskid.*", text).group(0), "taskid       7")
    [job] = sge_parse.parse_qacct(odd)
    assert job.start_time == "" and (job.job_id, job.array_index) == (f"{ROLES['exit3']['id']}.7", "7")
    assert sge_parse.parse_qacct("garbage\n\n") == []


# --------------------------------------------------------------------------- submission, config


def test_qsub_terse():
    assert sge_parse.parse_qsub_terse(data("qsub-terse.txt")) == (ROLES["running"]["id"], "")
    number, tasks = sge_parse.parse_qsub_terse(data("qsub-terse-array.txt"))
    assert (number, tasks) == (role_id("array"), "1-6:1")
    assert sge_parse.parse_qsub_terse(b"43.1-5:2\n") == ("43", "1-5:2")
    for bad in ("", "Unable to run job: denied\nExiting.\n", "12\n13\n", "12.1", "-5"):
        with pytest.raises(SgeParseError):
            sge_parse.parse_qsub_terse(bad)


def test_queue_configuration():
    short = sge_parse.parse_queue_config(data("qconf-sq-short.txt"))
    assert short["qname"] == "short.q" and sge_parse.queue_max_time(short) == 600
    assert "smp" in short["pe_list"]
    assert sge_parse.queue_max_time(sge_parse.parse_queue_config(data("qconf-sq-all.txt"))) is None
    assert sge_parse.queue_max_time({"h_rt": "1:0:0,[vm=2:0:0]"}) == 3600


@pytest.mark.parametrize("text, expected", [
    ("2024-05-01T12:00:00", "2024-05-01T12:00:00"),
    ("2024-05-01T12:00:00.123", "2024-05-01T12:00:00"),
    ("2024-05-01 12:00:00,5", "2024-05-01T12:00:00"),
    ("Mon Nov 23 11:51:41 2026", "2026-11-23T11:51:41"),
    ("Tue May  7 08:01:02 2024", "2024-05-07T08:01:02"),
    ("-/-", ""), ("0", ""), ("", ""), (None, ""), ("undefined", ""), ("soon", ""),
])
def test_normalize_time(text, expected):
    assert sge_parse.normalize_time(text) == expected


def test_normalize_epoch_time_is_local():
    stamp = 1795434812
    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))
    assert sge_parse.normalize_time(str(stamp)) == expected
    assert sge_parse.normalize_time(str(stamp * 1000)) == expected


@pytest.mark.parametrize("text, expected", [
    ("300", 300), ("0:5:0", 300), ("1:00:00", 3600), ("12.5s", 12), ("3s", 3), ("2m", 120),
    ("INFINITY", None), ("", None), ("abc", None), ("1:2:3:4", None),
])
def test_parse_duration(text, expected):
    assert sge_parse.parse_duration(text) == expected


# --------------------------------------------------------------------------- state table

OBSERVED = {
    "qw": JobState.QUEUING, "hqw": JobState.HOLD, "hRwq": JobState.HOLD, "t": JobState.RUNNING,
    "r": JobState.RUNNING, "s": JobState.SUSPENDED, "S": JobState.SUSPENDED,
    "T": JobState.SUSPENDED, "Rr": JobState.RUNNING, "Rt": JobState.RUNNING,
    "Rq": JobState.QUEUING, "dr": JobState.FINISHING, "dt": JobState.FINISHING,
    "ds": JobState.FINISHING, "dS": JobState.FINISHING, "dT": JobState.FINISHING,
    "dRr": JobState.FINISHING, "Eqw": JobState.HOLD, "Ehqw": JobState.HOLD,
    "EhRqw": JobState.HOLD, "hr": JobState.RUNNING, "dhr": JobState.FINISHING,
    "Rs": JobState.SUSPENDED, "hs": JobState.SUSPENDED, "x": JobState.FINISHING,
    "dx": JobState.FINISHING, "dqw": JobState.FINISHING, "RS": JobState.SUSPENDED,
    "Ss": JobState.SUSPENDED, "w": JobState.QUEUING, "hRq": JobState.HOLD,
}


@pytest.mark.parametrize("native, expected", sorted(OBSERVED.items()))
def test_state_table_rows(native, expected):
    assert native in sge.STATE_TABLE or sge.normalize_state(native) in sge.STATE_TABLE
    assert sge.STATE_TABLE.map(native) is expected
    assert sge.STATE_TABLE.map(f" {native}\n") is expected


def test_state_table_covers_every_combination():
    marks = "dEhR"
    phases = ["q", "w", "qw", "t", "r", "x", "rx"]
    suspended = ["".join(c) for n in (1, 2, 3) for c in itertools.combinations("sST", n)]
    phases += suspended + ["r" + s for s in suspended]
    count = 0
    for phase in phases:
        for n in range(len(marks) + 1):
            for chosen in itertools.combinations(marks, n):
                letters = "".join(chosen) + phase
                # Any order qstat (or another version of it) might print them in.
                for order in {letters, letters[::-1], "".join(sorted(letters))}:
                    state = sge.STATE_TABLE.map(order)
                    assert state is not JobState.OTHER, order
                count += 1
    assert count == len(sge.STATE_TABLE.table) == 16 * len(phases)
    for key, state in sge.STATE_TABLE:
        assert sge.normalize_state(key) == key and state is not JobState.OTHER


def test_every_recorded_state_has_a_row():
    for name in DATA.glob("qstat*.xml"):
        try:
            jobs = sge_parse.parse_jobs(name.read_text(encoding="utf-8"))
        except SgeParseError:
            continue  # qstat -j documents: not listings
        for job in jobs:
            assert job.native_state in sge.STATE_TABLE, (name.name, job.native_state)


@pytest.mark.parametrize("native", ["", "Z", "rr", "qwq", "running", "r s", "E-qw", "\x00", "🙂"])
def test_unknown_state_texts_are_other(native):
    assert sge.STATE_TABLE.map(native) is JobState.OTHER


@given(st.text(max_size=20))
@settings(max_examples=500)
def test_state_table_never_raises(text):
    state = sge.STATE_TABLE.map(text)
    assert isinstance(state, JobState)
    if any(c not in sge.JOB_STATE_LETTERS for c in text.strip()):
        assert state is JobState.OTHER


@given(st.permutations(list("hRqw")))
def test_letter_order_does_not_matter(letters):
    assert sge.STATE_TABLE.map("".join(letters)) is JobState.HOLD


# --------------------------------------------------------------------------- job commands


def test_job_command_argv():
    assert sge.delete_argv("12") == ["qdel", "12"]
    assert sge.delete_argv("12.3") == ["qdel", "12.3"]
    assert sge.delete_argv("12.1,7") == ["qdel", "12.1", "12.7"]
    assert sge.hold_argv("12.4-9:1") == ["qhold", "12.4-9:1"]
    assert sge.release_argv("12") == ["qrls", "12"]
    assert sge.suspend_argv("12") == ["qmod", "-sj", "12"]
    assert sge.resume_argv("12") == ["qmod", "-usj", "12"]
    assert sge.accounting_argv("12") == ["qacct", "-j", "12"]
    assert sge.accounting_argv("12.3") == ["qacct", "-j", "12", "-t", "3"]
    assert sge.detail_argv(["12", "12.3", "13.1-2:1"]) == ["qstat", "-j", "12,13", "-xml"]
    assert sge.status_argv() == ["qstat", "-xml", "-r"]
    assert sge.status_argv(all_users=True)[-2:] == ["-u", "*"]
    assert sge.status_argv(user="ann")[-2:] == ["-u", "ann"]
    assert sge.queue_config_argv("short.q") == ["qconf", "-sq", "short.q"]


@pytest.mark.parametrize("job_id", ["", "0", "abc", "12;rm -rf /", "12 13", "-12", "12.", "12.0", "$(id)", "12\n"])
def test_bad_job_ids_are_refused(job_id):
    with pytest.raises(JobError) as err:
        sge.delete_argv(job_id)
    assert err.value.kind is ErrorKind.NO_SUCH_JOB


def test_move_only_waiting_whole_jobs():
    assert sge.move_argv("12", "short.q", "hqw") == ["qalter", "-q", "short.q", "12"]
    assert sge.move_argv("12", "short.q", "qw")[-1] == "12"
    for state in ("r", "t", "s", "dr", "Rr"):
        with pytest.raises(JobError) as err:
            sge.move_argv("12", "short.q", state)
        assert "only while it waits" in err.value.message
    with pytest.raises(JobError, match="whole jobs"):
        sge.move_argv("12.3", "short.q", "qw")
    with pytest.raises(JobError) as err:
        sge.move_argv("12", "short q", "qw")
    assert err.value.kind is ErrorKind.NO_SUCH_QUEUE


COMMANDS = json.loads((DATA / "commands.json").read_text(encoding="utf-8")) if (DATA / "commands.json").exists() else []
# What each recorded answer means: None when the command worked.
EXPECTED = {
    "suspend running": None, "suspend suspended": None, "resume suspended": None,
    "resume running": None, "suspend task": None, "hold pending": None, "release held": None,
    "release not held": None, "hold task": None, "hold running": None, "move pending": None,
    "move running (qalter accepts, nothing moves)": None, "delete pending tasks": None,
    "delete running": None, "delete pending": None, "delete array": None,
    "suspend pending": ErrorKind.OPERATION_FAILED, "move task": ErrorKind.OPERATION_FAILED,
    "move to unknown queue": ErrorKind.NO_SUCH_QUEUE, "delete unknown": ErrorKind.NO_SUCH_JOB,
    "hold unknown": ErrorKind.NO_SUCH_JOB, "release unknown": ErrorKind.NO_SUCH_JOB,
    "suspend unknown": ErrorKind.NO_SUCH_JOB, "resume unknown": ErrorKind.NO_SUCH_JOB,
    "move unknown": ErrorKind.NO_SUCH_JOB,
    # Deleted a second time after it had already gone.
    "delete deleting": ErrorKind.NO_SUCH_JOB,
}


@pytest.mark.parametrize("record", COMMANDS, ids=[r["label"] for r in COMMANDS])
def test_job_command_answers(record):
    argv, code, out, err = record["argv"], record["returncode"], record["stdout"], record["stderr"]
    expected = EXPECTED[record["label"]]
    if expected is None:
        sge.check_job_command(argv, code, out, err)
        return
    with pytest.raises(JobError) as exc:
        sge.check_job_command(argv, code, out, err)
    assert exc.value.kind is expected
    assert exc.value.message.startswith(" ".join(argv[:2]))


def test_job_command_answers_are_read_not_trusted():
    assert len(COMMANDS) == len(EXPECTED)
    with pytest.raises(JobError):  # exit 0, but it says it did nothing
        sge.check_job_command(["qmod", "-sj", "5"], 0, "Modify operation can not be applied", "")
    with pytest.raises(JobError):  # exit 0, no answer at all
        sge.check_job_command(["qdel", "5"], 0, "", "")
    with pytest.raises(JobError):  # one of two tasks refused
        sge.check_job_command(["qdel", "5.1", "5.2"], 0,
                              "root has deleted job-array task 5.1\ndenied: job \"5.2\" does not exist", "")


def test_recorded_answers_cover_the_lies():
    labels = {r["label"]: r for r in COMMANDS}
    # Refused, yet exit status 0: why the output is read.
    assert labels["suspend pending"]["returncode"] == 0
    assert labels["move task"]["returncode"] != 0
    assert labels["hold unknown"]["returncode"] not in (0, 1)
    with pytest.raises(ValueError):
        sge.check_job_command(["qstat"], 0, "", "")


# --------------------------------------------------------------------------- qsub and the script

HOSTILE = [
    "plain", "with space", "  padded  ", "single ' quote", 'double " quote', "'\"'\"'",
    "$(touch pwned)", "`touch pwned`", "$HOME", "${PATH}", "line1\nline2", "tab\there",
    "back\\slash", "*", "~", "-n", "--", "--help", "-rf", "", "#$ -o /etc/passwd", "; rm -rf /",
    "&& echo pwned", "| cat", "> /tmp/x", "héllo wörld ✓", "名前", "\u202eevil", "%lt;",
]


def _run_script(spec: JobSpec, tmp_path: Path):
    script = sge_script.render_script(spec)
    path = tmp_path / "job.sh"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(["bash", str(path)], capture_output=True, timeout=scaled(30), cwd=tmp_path)


def test_hostile_arguments_reach_the_program_verbatim(tmp_path):
    spec = JobSpec("printf", ["%s\\0", *HOSTILE], working_dir=str(tmp_path))
    result = _run_script(spec, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode("utf-8").split("\0")[:-1] == HOSTILE
    assert not list(tmp_path.glob("pwned*"))


def test_hostile_environment_and_prologue(tmp_path):
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    spec = JobSpec("env", ["-0"], environment=env, working_dir=str(tmp_path),
                   prologue=("export FROM_PROLOGUE=yes", "cd .", "test \"$V6\" = '$(touch pwned)'"))
    result = _run_script(spec, tmp_path)
    assert result.returncode == 0, result.stderr
    seen = dict(item.split("=", 1) for item in result.stdout.decode("utf-8").split("\0") if "=" in item)
    for name, value in env.items():
        assert seen[name] == value
    assert seen["FROM_PROLOGUE"] == "yes"
    assert not list(tmp_path.glob("pwned*"))


def test_script_shape_and_option_like_executable():
    spec = JobSpec("-weird prog", ["a"], prologue=("module load gcc",), working_dir="/tmp/w d")
    script = sge_script.render_script(spec)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines.index("cd -- '/tmp/w d' || exit 1") < lines.index("module load gcc") < len(lines) - 1
    assert lines[-1] == "exec -- '-weird prog' a"
    assert not any(line.startswith("#$") for line in lines)


def test_submit_argv_maps_every_field():
    spec = JobSpec("/bin/prog", name="run1", stdout_path="/o/out:x", stderr_path="/o/err", working_dir="/w",
                   num_procs=2, cpus_per_task=2, queue="all.q", hold=True, wall_time=3600, account="proj",
                   memory=1000, gpus=1, gres="ssd,lic:2", constraint="ssd&fast", exclusive=True,
                   array="1-10:2%3", begin_time="2030-01-31T18:00", native_options=("-l h_vmem=1G", "-m", "n"))
    argv = sge_script.submit_argv(spec)
    assert argv[:6] == ["qsub", "-terse", "-C", "", "-S", "/bin/bash"]
    text = " ".join(argv)
    for part in ("-N run1", "-wd /w", "-o :/o/out:x", "-e /o/err", "-q all.q", " -h ", "-A proj",
                 "-a 203001311800.00", "-pe smp 4", "-t 1-10:2 -tc 3", "-l h_vmem=1G -m n",
                 "-l h_rt=3600,h_vmem=250M,gpu=1,ssd,lic=2,ssd=TRUE,fast=TRUE,exclusive=TRUE"):
        assert part in text, part
    assert "-cwd" not in argv
    assert "-cwd" in sge_script.submit_argv(JobSpec("/bin/prog"))
    assert "-pe" not in sge_script.submit_argv(JobSpec("/bin/prog", num_procs=1))
    settings_ = sge_script.SgeSettings(pe_name="mpi", memory_resource="mem_free", gpu_resource="gpus")
    text = " ".join(sge_script.submit_argv(JobSpec("/bin/prog", num_procs=3, memory=100, gpus=2), settings_))
    assert "-pe mpi 3" in text and "-l mem_free=34M,gpus=2" in text


def test_implicit_names_are_made_legal():
    for executable, name in (("/bin/my prog", "my_prog"), ("/x/2run", "j2run"), ("/x/a:b@c", "a_b_c"),
                             ("/x/héllo", "h_llo"), ("/", "job")):
        argv = sge_script.submit_argv(JobSpec(executable))
        assert argv[argv.index("-N") + 1] == name


@pytest.mark.parametrize("fields, words", [
    ({"name": "my job"}, "refuses"), ({"name": "héllo"}, "refuses"), ({"name": "a/b"}, "refuses"),
    ({"name": "1abc"}, "digit"), ({"name": ""}, "empty"), ({"name": "a\nb"}, "must not contain"),
    ({"stdout_path": "/a,b"}, "separator"), ({"stderr_path": "/x\n"}, "must not contain"),
    ({"queue": "all.q\n-o /etc"}, "must not contain"), ({"queue": "all q"}, "queue name"),
    ({"queue": "-sync"}, "queue name"),
    ({"account": "my acct"}, "printable ASCII"), ({"account": "prøject"}, "printable ASCII"),
    ({"working_dir": "/a\rb"}, "must not contain"), ({"num_procs": 0}, "at least 1"),
    ({"wall_time": 0}, "at least 1"), ({"memory": 0}, "at least 1"), ({"gpus": -1}, "negative"),
    ({"gres": "gpu:tesla:2"}, "type"), ({"gres": "a b"}, "resource request"),
    ({"constraint": "a|b"}, "alternatives"), ({"constraint": "a&b$c"}, "resource name"), ({"constraint": "a&$(x)"}, "alternatives"),
    ({"array": "1,3,5"}, "not lists"), ({"array": "5-1"}, "ends before"), ({"array": "0-3"}, "not lists"),
    ({"begin_time": "tomorrow"}, "date and time"), ({"executable": ""}, "empty"),
    ({"arguments": ["a\0b"]}, "NUL"), ({"prologue": ["module load x\nrm -rf /"]}, "must not contain"),
    ({"environment": {"A-B": "x"}}, "identifier"), ({"environment": {"A": "x\0"}}, "NUL"),
])
def test_bad_values_are_refused_with_a_clear_error(fields, words):
    fields.setdefault("executable", "/bin/prog")
    spec = JobSpec(**fields)
    with pytest.raises(SubmitError) as err:
        sge_script.submit_argv(spec)
        sge_script.render_script(spec)
    assert err.value.kind is ErrorKind.BAD_REQUEST
    assert words in err.value.message


def test_unsupported_fields():
    for fields, words in (({"qos": "high"}, "quality of service"), ({"nodes": 2}, "one host")):
        with pytest.raises(SubmitError) as err:
            sge_script.submit_argv(JobSpec("/bin/prog", **fields))
        assert err.value.kind is ErrorKind.NOT_SUPPORTED and words in err.value.message
    assert "-pe" not in sge_script.submit_argv(JobSpec("/bin/prog", nodes=1))


@pytest.mark.parametrize("options, words", [
    (["-o", "/tmp/x"], "stdout_path"), (["-N", "x"], "name"), (["-q", "all.q"], "queue"),
    (["-pe", "smp", "2"], "num_procs"), (["-V"], "environment"), (["-sync", "y"], "agent decides"),
    (["-terse"], "agent decides"), (["-jsv", "/tmp/x"], "agent decides"), (["-b", "y"], "agent decides"),
    (["-C", "#"], "agent decides"), (["-@", "/tmp/opts"], "agent decides"), (["-w", "v"], "agent decides"),
    (["-mattr", "queue", "slots", "9", "all.q"], "not a qsub option"), (["-foo"], "not a qsub option"),
    (["h_vmem=1G"], "not an option"), (["-l"], "needs 1"), (["-l h_vmem=1G\n-o /x"], "must not contain"),
])
def test_native_options_are_checked(options, words):
    with pytest.raises(SubmitError) as err:
        sge_script.submit_argv(JobSpec("/bin/prog", native_options=options))
    assert words in err.value.message


def test_native_options_pass_through():
    assert sge_script.check_native_options(["-l h_vmem=1G", "-notify", "-binding", "pe", "linear:1",
                                            "-p", "-100", "-hold_jid", "12"]) == \
        ["-l", "h_vmem=1G", "-notify", "-binding", "pe", "linear:1", "-p", "-100", "-hold_jid", "12"]
    assert set(sge_script.QSUB_OPTIONS).isdisjoint({"-o", "-e", "-j", "-sync", "-terse", "-S", "-C"})


def test_embedded_directives():
    spec = JobSpec("/bin/prog", name="d1", queue="all.q", wall_time=60)
    script = sge_script.render_script(spec, embed_options=True)
    assert "#$ -N d1" in script and "#$ -q all.q" in script and "#$ -l h_rt=60" in script
    assert "-C" not in sge_script.submit_argv(spec, with_options=False)
    with pytest.raises(SubmitError, match="directive"):
        sge_script.render_script(JobSpec("/bin/prog", stdout_path="/a b"), embed_options=True)
