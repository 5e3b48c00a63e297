"""The model's snapshot and coalesced change stream."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from proxy_agent.model import HELD_OUTPUT_LIMIT, Model
from proxy_agent.protocol.ids import IdAllocator
from proxy_agent.protocol.messages import (
    ElementChange,
    ElementKind,
    NewElements,
    ProcessChange,
    RemoveElements,
    RemoveProcesses,
)
from proxy_agent.protocol.rangeset import RangeSet

TID = 7


def make_model():
    model = Model(IdAllocator(100))
    machine = model.add(ElementKind.MACHINE, None, {"name": "m", "machineState": "UP"})
    queue = model.add(ElementKind.QUEUE, None, {"name": "q", "queueState": "NORMAL"})
    return model, machine, queue


def apply(events, mirror):
    """Apply events to a {id: (kind, parent, attrs)} mirror, like a client would."""
    for event in events:
        if isinstance(event, NewElements):
            for group in event.groups:
                for eid in group.id_list():
                    assert eid not in mirror, f"NEW for known element {eid}"
                    mirror[eid] = (event.kind, event.parent_id, dict(group.attributes))
        elif isinstance(event, (ElementChange, ProcessChange)):
            for group in event.groups:
                for eid in group.id_list():
                    assert eid in mirror, f"CHANGE for unknown element {eid}"
                    attrs = dict(group.attributes)
                    attrs.pop("processStdout", None)
                    attrs.pop("processStderr", None)
                    mirror[eid][2].update(attrs)
        elif isinstance(event, (RemoveElements, RemoveProcesses)):
            for eid in (str(i) for i in event.ids):
                assert eid in mirror, f"REMOVE for unknown element {eid}"
                del mirror[eid]
        else:  # pragma: no cover
            raise AssertionError(f"unexpected event {event}")


def truth(model):
    out = {}
    for kind in ElementKind:
        for eid in model.ids(kind):
            element = model.get(eid)
            out[str(eid)] = (kind, str(element.parent), {k: v for k, v in model.attrs(eid).items()})
    return out


def test_snapshot_parents_first_and_grouped():
    model, machine, queue = make_model()
    nodes = model.add_many(ElementKind.NODE, machine, [{"nodeState": "UP"}] * 64)
    events = model.snapshot(TID)
    kinds = [e.kind for e in events]
    assert kinds.index(ElementKind.MACHINE) < kinds.index(ElementKind.NODE)
    node_events = [e for e in events if e.kind is ElementKind.NODE]
    assert len(node_events) == 1 and len(node_events[0].groups) == 1
    assert node_events[0].groups[0].ids == RangeSet.from_range(nodes[0], nodes[-1])
    assert node_events[0].parent_id == str(machine)
    assert all(e.tid == TID for e in events)
    assert model.drain(TID) == []


def test_same_change_is_one_event_with_one_range():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "STARTING"})
    procs = model.add_many(ElementKind.PROCESS, job, [{"processIndex": str(i)} for i in range(64)])
    model.snapshot(TID)
    model.update_many(procs, {"processState": "RUNNING"})
    events = model.drain(TID)
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, ProcessChange) and event.job_id == str(job)
    assert len(event.groups) == 1
    assert str(event.groups[0].ids) == f"{procs[0]}-{procs[-1]}"
    assert event.groups[0].attributes == (("processState", "RUNNING"),)


def test_coalescing_latest_wins_and_new_remove_cancel():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "STARTING"})
    model.snapshot(TID)
    for state in ("RUNNING", "SUSPENDED", "RUNNING", "COMPLETED"):
        model.update(job, {"jobState": state})
    temp = model.add(ElementKind.JOB, queue, {"jobState": "STARTING"})
    model.update(temp, {"jobState": "RUNNING"})
    model.remove(temp)
    events = model.drain(TID)
    assert len(events) == 1
    assert isinstance(events[0], ElementChange)
    assert events[0].groups[0].attributes == (("jobState", "COMPLETED"),)


def test_unchanged_value_is_not_a_change():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "RUNNING"})
    model.snapshot(TID)
    assert model.update(job, {"jobState": "RUNNING"}) is False
    assert not model.has_pending
    assert model.drain(TID) == []


def test_remove_job_removes_processes_children_first():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "RUNNING"})
    procs = model.add_many(ElementKind.PROCESS, job, [{"processIndex": "0"}, {"processIndex": "1"}])
    model.snapshot(TID)
    model.remove(job)
    events = model.drain(TID)
    assert [type(e) for e in events] == [RemoveProcesses, RemoveElements]
    assert list(events[0].ids) == list(procs)
    assert list(events[1].ids) == [job]


def test_output_in_order_before_completion():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "RUNNING"})
    (proc,) = model.add_many(ElementKind.PROCESS, job, [{"processIndex": "0"}])
    model.snapshot(TID)
    model.output(proc, "one")
    model.output(proc, "two", "stderr")
    model.update(proc, {"processState": "COMPLETED"})
    model.update(job, {"jobState": "COMPLETED"})
    events = model.drain(TID)
    texts = [e.groups[0].attributes for e in events]
    assert texts[0] == (("processStdout", "one"),)
    assert texts[1] == (("processStderr", "two"),)
    assert texts[2] == (("processState", "COMPLETED"),)
    assert texts[3] == (("jobState", "COMPLETED"),)


def test_held_output_is_bounded():
    model, machine, queue = make_model()
    job = model.add(ElementKind.JOB, queue, {"jobState": "RUNNING"})
    (proc,) = model.add_many(ElementKind.PROCESS, job, [{"processIndex": "0"}])
    model.snapshot(TID)
    line = "x" * 1000
    for _ in range(3 * HELD_OUTPUT_LIMIT // 1000):
        model.output(proc, line)
    events = model.drain(TID)
    total = sum(len(v) for e in events for g in e.groups for _, v in g.attributes)
    assert total <= HELD_OUTPUT_LIMIT + 200
    assert "dropped" in events[0].groups[0].attributes[0][1]


def test_pending_bounded_by_model_size():
    model, machine, queue = make_model()
    jobs = [model.add(ElementKind.JOB, queue, {"jobState": "STARTING"}) for _ in range(10)]
    model.snapshot(TID)
    for round_ in range(1000):
        for job in jobs:
            model.update(job, {"jobState": "RUNNING" if round_ % 2 else "SUSPENDED", "n": str(round_)})
        temp = model.add(ElementKind.JOB, queue, {"jobState": "STARTING"})
        model.remove(temp)
    assert len(model._pending) <= len(model)
    events = model.drain(TID)
    assert sum(len(g.ids) for e in events for g in e.groups) == 10


ops = st.lists(
    st.tuples(st.sampled_from(["add_job", "add_procs", "update", "remove", "drain"]), st.integers(0, 50), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_drained_events_reproduce_the_model(operations):
    """Whatever happens between drains, applying the events gives exactly the model."""
    model, machine, queue = make_model()
    mirror = {}
    apply(model.snapshot(TID), mirror)
    for op, pick, value in operations:
        jobs = model.ids(ElementKind.JOB)
        if op == "add_job":
            model.add(ElementKind.JOB, queue, {"jobState": ["STARTING", "RUNNING"][value % 2]})
        elif op == "add_procs" and jobs:
            job = jobs[pick % len(jobs)]
            model.add_many(ElementKind.PROCESS, job, [{"processIndex": str(i)} for i in range(value + 1)])
        elif op == "update":
            candidates = jobs + model.ids(ElementKind.PROCESS)
            if candidates:
                model.update(candidates[pick % len(candidates)], {"state": str(value)})
        elif op == "remove" and jobs:
            model.remove(jobs[pick % len(jobs)])
        elif op == "drain":
            apply(model.drain(TID), mirror)
    apply(model.drain(TID), mirror)
    assert mirror == truth(model)
