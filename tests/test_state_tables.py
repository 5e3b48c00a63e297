"""Each backend's table from its native job states into the service's states."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from proxy_agent.frontends.ptp import mapping
from proxy_agent.schedulers import local, sim
from proxy_agent.schedulers.batch.slurm import system as slurm
from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.common import state_attrs
from proxy_agent.service.jobs import JobState, StateTable

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
