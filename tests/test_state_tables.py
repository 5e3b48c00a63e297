"""Each backend's table from its native job states into the service's states."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from proxy_agent.frontends.ptp import mapping
from proxy_agent.schedulers import local, sim
from proxy_agent.schedulers.batch.pbs import parse as pbs_parse
from proxy_agent.schedulers.batch.pbs import system as pbs
from proxy_agent.schedulers.batch.sge import system as sge
from proxy_agent.schedulers.batch.slurm import system as slurm
from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.common import state_attrs
from proxy_agent.service.jobs import SERVICE_STATES, JobState, StateTable

TABLES = {"local": local.STATE_TABLE, "sim": sim.STATE_TABLE, "slurm": slurm.STATE_TABLE}

#: What each simple backend produces (its module documentation names them).
PRODUCED = {
    "local": {"PENDING": "QUEUING", "RUNNING": "RUNNING", "STOPPED": "SUSPENDED", "EXITED": "FINISHED",
              "FAILED": "FAILED", "NOT_STARTED": "FAILED", "TERMINATED": "KILLED", "LOST": "FAILED"},
    "sim": {"PD": "QUEUING", "H": "HOLD", "R": "RUNNING", "S": "SUSPENDED", "CD": "FINISHED", "F": "FAILED",
            "CA": "KILLED"},
}

#: Every SLURM job state by its long name, and the PTP ``jobState`` a client must see for it.
SLURM_PTP_STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                     "SPECIAL_EXIT"), "STARTING"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT"), "RUNNING"),
    **dict.fromkeys(("SUSPENDED", "STOPPED"), "SUSPENDED"),
    **dict.fromkeys(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                     "BOOT_FAIL", "DEADLINE", "REVOKED"), "COMPLETED"),
}

native_texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_+ \t\n", max_size=40),
    st.lists(st.sampled_from(sorted({*sp.JOB_STATE_CODES, *sp.JOB_STATE_CODES.values(), "by", "0", "+", " "})),
             max_size=6).map("".join),
    st.lists(st.sampled_from(sorted({*sp.JOB_STATE_CODES.values(), "JUNK"})), min_size=1, max_size=4).map("+".join),
)


@pytest.mark.parametrize("name", sorted(TABLES))
@settings(max_examples=300, deadline=None)
@given(text=native_texts)
def test_any_text_maps_to_a_state_without_raising(name, text):
    table = TABLES[name]
    state = table.map(text)
    assert isinstance(state, JobState)
    assert table.map(text) is state  # the same answer every time (it is cached)
    if name != "slurm" and text not in table:
        assert state is JobState.OTHER
    attrs = state_attrs(table, text)
    assert attrs == {"state": state.value, "nativeState": text}  # the native text is kept as it was
    assert mapping.PTP_JOB_STATE[state.value] in ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED")


@pytest.mark.parametrize("name", sorted(PRODUCED))
def test_simple_backends_place_every_state_they_produce(name):
    table = TABLES[name]
    assert {native: state.value for native, state in table} == PRODUCED[name]
    assert table.map("not a state of " + name) is JobState.OTHER


def test_sim_produces_only_states_of_its_table():
    produced = {native for native, _ in sim._JOB_MIX}
    produced |= {sim.PENDING, sim.HELD, sim.RUNNING, sim.SUSPENDED, sim.COMPLETED, sim.FAILED, sim.CANCELLED}
    assert produced == {native for native, _ in sim.STATE_TABLE}


def test_unknown_text_is_other():
    assert StateTable("x", {"A": JobState.RUNNING}).map("B") is JobState.OTHER

    def broken(text: str) -> str:
        raise RuntimeError("a normaliser that fails")

    assert StateTable("x", {"A": JobState.RUNNING}, broken).map("A") is JobState.OTHER


# --------------------------------------------------------------------------- SLURM


def test_slurm_table_covers_every_state_name_and_code():
    table = slurm.STATE_TABLE
    names = set(SLURM_PTP_STATES) | set(sp.JOB_STATE_CODES.values())
    missing = sorted(name for name in names if name not in table)
    assert not missing, missing
    for code, name in sp.JOB_STATE_CODES.items():
        assert table.map(code) is table.map(name) is not JobState.OTHER, code
        assert table.map(code.lower()) is table.map(name)
    for name in names:
        assert table.map(name) is not JobState.OTHER, name


def test_slurm_flags_are_placed_too():
    table = slurm.STATE_TABLE
    for flag in ("LAUNCH_FAILED", "UPDATE_DB", "RECONFIG_FAIL", "POWER_UP_NODE", "REQUEUE_HOLD", "SPECIAL_EXIT",
                 "RESIZING", "CONFIGURING", "COMPLETING", "STOPPED", "REVOKED", "REQUEUE_FED", "RESV_DEL_HOLD",
                 "SIGNALING", "STAGE_OUT", "REQUEUED"):
        assert flag in table, flag
        assert table.map(flag) is not JobState.OTHER


@pytest.mark.parametrize("name", sorted(SLURM_PTP_STATES))
def test_slurm_states_give_the_ptp_state_slurm_means(name):
    """Each SLURM state reaches a PTP client as the PTP state it stands for."""
    assert mapping.PTP_JOB_STATE[slurm.STATE_TABLE.map(name).value] == SLURM_PTP_STATES[name]


@pytest.mark.parametrize("text, state", [
    ("PENDING+REQUEUE_HOLD", JobState.HOLD),
    ("COMPLETED+COMPLETING", JobState.FINISHING),
    ("RUNNING+STOPPED", JobState.SUSPENDED),
    ("RUNNING+SIGNALING", JobState.RUNNING),
    ("FAILED+LAUNCH_FAILED", JobState.FAILED),
    ("PENDING+CONFIGURING", JobState.PREPARING),
    ("CANCELLED by 1000", JobState.KILLED),
    ("  cd  ", JobState.FINISHED),
    ("OOM", JobState.FAILED),
    ("", JobState.OTHER),
    ("SOMETHING_NEW", JobState.OTHER),
])
def test_slurm_examples(text, state):
    assert slurm.STATE_TABLE.map(text) is state


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(sorted(SLURM_PTP_STATES)),
       junk=st.lists(st.text(alphabet="QWXYZ_", min_size=1, max_size=8), max_size=3),
       words=st.lists(st.text(alphabet="abc 0123456789()", max_size=8), max_size=3))
def test_slurm_unknown_flags_and_trailing_words_do_not_change_a_state(base, junk, words):
    text = "+".join([base, *junk])
    if words:
        text += " " + " ".join(words)
    assert slurm.STATE_TABLE.map(text) is slurm.STATE_TABLE.map(base)


# --------------------------------------------------------------------------- every state placed

#: Every scheduler's table of native states, by the name its jobs carry.
SCHEDULER_TABLES = {
    "local": local.STATE_TABLE,
    "sim": sim.STATE_TABLE,
    "slurm": slurm.STATE_TABLE,
    "sge": sge.STATE_TABLE,
    "pbs": pbs.STATE_TABLES[pbs_parse.FAMILY_OPENPBS],
    "torque": pbs.STATE_TABLES[pbs_parse.FAMILY_TORQUE],
}


@pytest.mark.parametrize("name", sorted(SCHEDULER_TABLES))
def test_each_scheduler_table_gives_every_state_or_says_why_not(name):
    """A state added to the vocabulary must be placed in every scheduler's table: mapped from
    a native state, or named among those the table never gives, with the reason."""
    table = SCHEDULER_TABLES[name]
    assert table.unplaced() == []
    for state in JobState:
        if state in SERVICE_STATES:
            continue
        given = [native for native, mapped in table if mapped is state]
        assert bool(given) != (state in table.not_given), (name, state)
    assert all(reason.strip() for reason in table.not_given.values())


def test_a_table_that_leaves_a_state_out_is_found():
    table = StateTable("x", {"Q": JobState.QUEUING, "R": JobState.RUNNING},
                       not_given={JobState.HOLD: "no holds", JobState.RUNNING: "said twice"})
    missing = set(JobState) - SERVICE_STATES - {JobState.QUEUING, JobState.HOLD}
    assert set(table.unplaced()) == missing  # RUNNING: both given and said not to be


def test_the_console_knows_every_state_as_waiting_under_way_or_ended():
    """The console's words for a job that has not started yet and for one that has ended
    (what ``wait`` stops at) hold every state of the vocabulary in its place."""
    from proxy_agent.console import language

    for state in JobState:
        assert state.value in language.STATUS_NAMES
        assert (state.value in language.FINAL_STATUSES) == state.final, state
        under_way = state.started or state is JobState.FINISHING
        assert (state.value in language.WAITING_STATUSES) == (not state.final and not under_way), state


def test_the_job_list_and_its_completion_take_every_state(tmp_path):
    """``proxy-agent jobs --state`` takes each state's name and finds the jobs in it; shell
    completion offers every name."""
    import os
    import sqlite3
    import subprocess
    import sys

    from agent_fixtures import subprocess_env
    from proxy_agent.completion import programs
    from proxy_agent.service.jobs import JobSpec
    from proxy_agent.service.store import JobStore

    directory = str(tmp_path / "state")
    os.makedirs(directory, mode=0o700)
    store = JobStore(os.path.join(directory, JobStore.FILE))
    states = list(JobState)
    for key, state in enumerate(states, start=1):
        store.note_submission(key, "local", "local:default", JobSpec(executable="/bin/true", name=state.value))
    store.write_submissions()
    store.close()
    with sqlite3.connect(os.path.join(directory, JobStore.FILE)) as db:
        for key, state in enumerate(states, start=1):
            db.execute("UPDATE jobs SET state=? WHERE key=?", (state.value, key))
    names = ",".join(state.value.lower() for state in states)
    listed = subprocess.run([sys.executable, "-m", "proxy_agent", "jobs", "--state-dir", directory, "--state", names,
                             "--format", "id,state", "--no-header"], capture_output=True, text=True,
                            env=subprocess_env(), stdin=subprocess.DEVNULL, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows == [[str(key), state.value] for key, state in enumerate(states, start=1)]
    agent = next(program for program in programs() if program.name == "proxy-agent")
    assert {state.value for state in JobState} <= set(agent.hints["--state"])
