"""The service model: keys, parents, ranks, values, and the neutral change stream."""

from __future__ import annotations

from typing import Dict, List, Tuple

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from proxy_agent.service.model import (
    BACKLOG_LIMIT,
    ROOT,
    ChangeSink,
    Element,
    K,
    Kind,
    ServiceModel,
    UnknownElement,
)


def make_model() -> Tuple[ServiceModel, int, int]:
    model = ServiceModel()
    machine = model.add(Kind.MACHINE, None, {K.NAME: "m", K.STATE: "UP"}, owner="sim")
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.STATE: "NORMAL"}, owner="sim")
    return model, machine, queue


class Recorder(ChangeSink):
    """Every call a subscriber hears, in order, with what it could read at that moment."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.calls: List[tuple] = []

    def created(self, element: Element) -> None:
        self.calls.append(("created", element.key, element.kind, element.parent))

    def changed(self, element: Element, slots) -> None:
        names = self.model.schema(element.kind).keys
        self.calls.append(("changed", element.key, sorted(names[i] for i in slots)))

    def removed(self, element: Element) -> None:
        self.calls.append(("removed", element.key))

    def moved(self, element: Element, old_parent: int) -> None:
        self.calls.append(("moved", element.key, old_parent, element.parent))

    def output(self, element: Element, stream: str, text: str, offset=None) -> None:
        self.calls.append(("output", element.key, stream, text))

    def flush(self) -> None:
        self.calls.append(("flush",))

    def take(self) -> List[tuple]:
        calls, self.calls = self.calls, []
        return calls


# --------------------------------------------------------------------------- keys and parents


def test_keys_ascend_from_one_and_are_never_reused():
    model, machine, queue = make_model()
    assert (machine, queue) == (1, 2)
    assert ROOT == 0 and ROOT not in model
    nodes = model.add_many(Kind.NODE, machine, [{K.NAME: f"n{i}"} for i in range(3)])
    assert list(nodes) == [3, 4, 5]
    job = model.add(Kind.JOB, queue, {K.NAME: "j"})
    model.remove(job)
    again = model.add(Kind.JOB, queue, {K.NAME: "j"})
    assert again == job + 1 and job not in model
    assert model.keys(Kind.NODE) == [3, 4, 5] and model.count(Kind.NODE) == 3
    assert model.keys(Kind.JOB) == [again]
    assert len(model) == 2 + 3 + 1
    assert model.ascending()


def test_parents_are_checked():
    model, machine, queue = make_model()
    with pytest.raises(ValueError, match="service root"):
        model.add(Kind.MACHINE, machine, {})
    with pytest.raises(ValueError, match="service root"):
        model.add(Kind.QUEUE, queue, {})
    with pytest.raises(UnknownElement, match="no machine with key 2"):
        model.add(Kind.NODE, queue, {})
    with pytest.raises(UnknownElement, match="no queue with key 1"):
        model.add(Kind.JOB, machine, {})
    with pytest.raises(UnknownElement, match="no job with key 2"):
        model.add_many(Kind.PROCESS, queue, [{}])
    with pytest.raises(UnknownElement, match="no job with key 99"):
        model.add(Kind.PROCESS, 99, {})
    assert len(model) == 2  # nothing half-made


def test_lookups():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {K.NAME: "j"}, owner="local")
    assert model.get(job).kind is Kind.JOB and model.owner(job) == "local"
    assert model.find(job, Kind.JOB).key == job
    with pytest.raises(UnknownElement) as wrong:
        model.find(job, Kind.QUEUE)
    assert str(wrong.value) == f"no queue with key {job}"
    with pytest.raises(UnknownElement, match="no element with key 77"):
        model.get(77)
    with pytest.raises(UnknownElement):
        model.attrs(77)
    assert model.children(queue) == [job] and model.children(queue, Kind.JOB) == [job]
    assert model.children(job) == [] and model.children(queue, Kind.PROCESS) == []


def test_process_ranks_follow_creation_order():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {})
    first = model.add_many(Kind.PROCESS, job, [{K.PID: str(100 + i)} for i in range(3)])
    assert [model.get(p).rank for p in first] == [0, 1, 2]
    later = model.add(Kind.PROCESS, job, {})
    assert model.get(later).rank == 3
    model.remove(first[1])
    last = model.add_many(Kind.PROCESS, job, [{}, {}])
    assert [model.get(p).rank for p in last] == [4, 5]  # a rank is never given twice in a job
    assert model.processes(job) == [first[0], first[2], later, *last]
    assert model.get(job).rank == -1 and model.get(queue).rank == -1
    other = model.add(Kind.JOB, queue, {})
    assert model.get(model.add(Kind.PROCESS, other, {})).rank == 0  # ranks are per job


def test_chosen_keys():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {K.NAME: "adopted"}, key=40)
    assert job == 40 and model.attr(40, K.NAME) == "adopted"
    assert model.add(Kind.JOB, queue, {}) == 41  # keys below a chosen one are not handed out
    with pytest.raises(ValueError, match="in use"):
        model.add(Kind.JOB, queue, {}, key=40)
    with pytest.raises(ValueError):
        model.add(Kind.JOB, queue, {}, key=ROOT)
    assert model.ascending()
    model.add(Kind.JOB, queue, {}, key=10)  # restored below the keys handed out
    assert not model.ascending()
    model.reserve_keys(100)
    assert model.add(Kind.JOB, queue, {}) == 101


# --------------------------------------------------------------------------- values


def test_values_are_stored_as_text_tuples_or_keys():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {
        K.NAME: "j", K.NUM_PROCS: 4, K.HOLD: True, K.ARGUMENTS: ["a", 1], K.QUEUE: queue,
        K.MESSAGE: None,
    })
    assert model.attrs(job) == {K.NAME: "j", K.NUM_PROCS: "4", K.HOLD: "true", K.ARGUMENTS: ("a", "1"),
                                K.QUEUE: queue}
    assert model.attr(job, K.QUEUE).__class__ is int  # a reference stays a key
    assert model.attr(job, K.MESSAGE) is None and model.attr(job, K.MESSAGE, "-") == "-"
    assert model.attr(job, "neverSeen") is None
    node = model.add(Kind.NODE, machine, {K.CPUS: 8})
    process = model.add(Kind.PROCESS, job, {K.NODE: node, K.EXIT_CODE: 0})
    assert model.attrs(process) == {K.NODE: node, K.EXIT_CODE: "0"}
    model.update(job, {K.HOLD: False})
    assert model.attr(job, K.HOLD) == "false"


def test_update_reports_only_differences_and_none_clears():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {K.NAME: "j", K.STATE: "QUEUING"})
    sink = Recorder(model)
    model.subscribe(sink)
    version = model.version
    assert model.update(job, {K.NAME: "j", K.STATE: "QUEUING"}) is False
    assert model.update(job, {K.MESSAGE: None}) is False  # clearing what was never set
    assert sink.take() == [] and model.version == version
    assert model.update(job, {K.NAME: "j", K.STATE: "RUNNING", K.MESSAGE: "started"}) is True
    assert sink.take() == [("changed", job, [K.MESSAGE, K.STATE]), ("flush",)]
    assert model.version > version
    assert model.update(job, {K.MESSAGE: None}) is True
    assert sink.take() == [("changed", job, [K.MESSAGE]), ("flush",)]
    assert K.MESSAGE not in model.attrs(job) and model.attr(job, K.MESSAGE) is None
    with pytest.raises(UnknownElement):
        model.update(999, {K.NAME: "x"})


def test_update_many_is_one_flush():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {})
    procs = model.add_many(Kind.PROCESS, job, [{K.STATE: "QUEUING"}] * 4)
    model.update(procs[0], {K.STATE: "RUNNING"})
    sink = Recorder(model)
    model.subscribe(sink)
    assert model.update_many(procs, {K.STATE: "RUNNING"}) == 3
    calls = sink.take()
    assert [c[0] for c in calls] == ["changed"] * 3 + ["flush"]
    assert [c[1] for c in calls[:3]] == list(procs[1:])


# --------------------------------------------------------------------------- the change stream


def test_subscribers_hear_every_mutation_in_order():
    model, machine, queue = make_model()
    other = model.add(Kind.QUEUE, None, {K.NAME: "other"})
    sink, second = Recorder(model), Recorder(model)
    model.subscribe(sink)
    model.subscribe(second)
    assert model.subscribers == 2
    job = model.add(Kind.JOB, queue, {K.NAME: "j"})
    procs = model.add_many(Kind.PROCESS, job, [{}, {}])
    model.output(procs[1], "stderr", "oops")
    model.move(job, other)
    model.remove(job)
    expected = [
        ("created", job, Kind.JOB, queue), ("flush",),
        ("created", procs[0], Kind.PROCESS, job), ("created", procs[1], Kind.PROCESS, job), ("flush",),
        ("output", procs[1], "stderr", "oops"), ("flush",),
        ("moved", job, queue, other), ("flush",),
        ("removed", procs[0]), ("removed", procs[1]), ("removed", job), ("flush",),  # children first
    ]
    assert sink.take() == expected
    assert second.take() == expected
    model.unsubscribe(second)
    model.unsubscribe(second)  # twice is harmless
    model.update(queue, {K.STATE: "STOPPED"})
    assert second.take() == [] and sink.take() == [("changed", queue, [K.STATE]), ("flush",)]


def test_batch_flushes_once_at_the_end():
    model, machine, queue = make_model()
    sink = Recorder(model)
    model.subscribe(sink)
    with model.batch():
        job = model.add(Kind.JOB, queue, {})
        with model.batch():
            model.add(Kind.PROCESS, job, {})
            model.update(job, {K.STATE: "RUNNING"})
        assert ("flush",) not in sink.calls  # not even when the inner batch ends
    calls = sink.take()
    assert [c[0] for c in calls] == ["created", "created", "changed", "flush"]
    with model.batch():
        model.update(job, {K.STATE: "RUNNING"})  # no change
    assert sink.take() == []  # nothing happened: nothing to flush


def test_remove_takes_the_subtree():
    model, machine, queue = make_model()
    nodes = model.add_many(Kind.NODE, machine, [{}, {}])
    job = model.add(Kind.JOB, queue, {})
    procs = model.add_many(Kind.PROCESS, job, [{}, {}])
    model.remove(job)
    assert job not in model and not any(p in model for p in procs)
    assert model.children(queue) == [] and model.count(Kind.PROCESS) == 0
    model.remove(machine)
    assert model.count(Kind.NODE) == 0 and not any(n in model for n in nodes)
    with pytest.raises(UnknownElement):
        model.remove(job)


def test_move():
    model, machine, queue = make_model()
    other = model.add(Kind.QUEUE, None, {K.NAME: "other"})
    job = model.add(Kind.JOB, queue, {})
    process = model.add(Kind.PROCESS, job, {})
    sink = Recorder(model)
    model.subscribe(sink)
    version = model.version
    model.move(job, queue)  # where it is already: nothing happens
    assert sink.take() == [] and model.version == version
    model.move(job, other)
    assert model.get(job).parent == other
    assert model.children(queue) == [] and model.children(other) == [job]
    assert model.get(process).parent == job and model.get(process).rank == 0
    assert sink.take() == [("moved", job, queue, other), ("flush",)]
    with pytest.raises(ValueError, match="service root"):
        model.move(queue, other)
    with pytest.raises(ValueError, match="service root"):
        model.move(machine, other)
    with pytest.raises(UnknownElement):
        model.move(job, machine)  # a job hangs from a queue
    assert model.get(job).parent == other and sink.take() == []


# --------------------------------------------------------------------------- output


def test_output_goes_to_subscribers_or_waits_for_one():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {})
    a, b = model.add_many(Kind.PROCESS, job, [{}, {}])
    model.output(a, "stdout", "one")
    model.output(b, "stderr", "two")
    with pytest.raises(UnknownElement):
        model.output(job, "stdout", "a job writes nothing itself")
    backlog = model.take_backlog()
    assert list(backlog) == [job]
    assert list(backlog[job].lines) == [(a, "stdout", "one", None), (b, "stderr", "two", None)]
    assert backlog[job].size == len("one") + len("two") + 2 and backlog[job].dropped == {}
    assert model.take_backlog() == {}  # handed over once
    sink = Recorder(model)
    model.subscribe(sink)
    model.output(a, "stdout", "three")
    assert sink.take() == [("output", a, "stdout", "three"), ("flush",)]
    assert model.take_backlog() == {}  # a subscriber heard it: nothing kept


def test_backlog_is_bounded_per_job_and_counts_what_it_dropped():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {})
    a, b = model.add_many(Kind.PROCESS, job, [{}, {}])
    quiet = model.add(Kind.JOB, queue, {})
    (q,) = model.add_many(Kind.PROCESS, quiet, [{}])
    model.output(q, "stdout", "kept")
    line = "x" * 999
    count = 3 * BACKLOG_LIMIT // 1000
    for i in range(count):
        model.output(a if i % 2 else b, "stdout", line)
    backlog = model.take_backlog()
    big = backlog[job]
    assert big.size <= BACKLOG_LIMIT and big.size == 1000 * len(big.lines)
    assert sum(big.dropped.values()) == count - len(big.lines)
    assert set(big.dropped) == {a, b}
    assert big.lines[-1] == (a if (count - 1) % 2 else b, "stdout", line, None)  # the newest stay
    assert list(backlog[quiet].lines) == [(q, "stdout", "kept", None)]  # another job's is its own


def test_a_removed_job_takes_its_backlog_with_it():
    model, machine, queue = make_model()
    job = model.add(Kind.JOB, queue, {})
    (p,) = model.add_many(Kind.PROCESS, job, [{}])
    model.output(p, "stdout", "gone soon")
    model.remove(job)
    assert model.take_backlog() == {}


# --------------------------------------------------------------------------- the stream replays the model


class Replica(ChangeSink):
    """A copy of the model kept from nothing but what a subscriber hears."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.elements: Dict[int, tuple] = {}

    def _attrs(self, element: Element) -> dict:
        names = self.model.schema(element.kind).keys
        return {names[i]: v for i, v in enumerate(element.values) if v is not None}

    def created(self, element: Element) -> None:
        assert element.key not in self.elements
        self.elements[element.key] = (element.kind, element.parent, element.rank, self._attrs(element))

    def changed(self, element: Element, slots) -> None:
        kind, parent, rank, attrs = self.elements[element.key]
        names = self.model.schema(element.kind).keys
        for i in slots:
            value = element.values[i]
            if value is None:
                attrs.pop(names[i], None)
            else:
                attrs[names[i]] = value

    def removed(self, element: Element) -> None:
        assert not any(parent == element.key for _, parent, _, _ in self.elements.values()), "children first"
        del self.elements[element.key]

    def moved(self, element: Element, old_parent: int) -> None:
        kind, parent, rank, attrs = self.elements[element.key]
        assert parent == old_parent
        self.elements[element.key] = (kind, element.parent, rank, attrs)


def model_truth(model: ServiceModel) -> Dict[int, tuple]:
    return {key: (model.get(key).kind, model.get(key).parent, model.get(key).rank, model.attrs(key))
            for kind in Kind for key in model.keys(kind)}


operations = st.lists(
    st.tuples(st.sampled_from(["job", "procs", "update", "clear", "move", "remove", "batch"]),
              st.integers(0, 50), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_the_change_stream_replays_the_model(ops):
    model, machine, queue = make_model()
    other = model.add(Kind.QUEUE, None, {K.NAME: "other"})
    replica = Replica(model)
    for key in [machine, queue, other]:
        replica.created(model.get(key))
    model.subscribe(replica)
    queues = [queue, other]

    def apply(op: str, pick: int, value: int) -> None:
        jobs = model.keys(Kind.JOB)
        if op == "job":
            model.add(Kind.JOB, queues[value % 2], {K.STATE: ["QUEUING", "RUNNING"][value % 2]})
        elif op == "procs" and jobs:
            model.add_many(Kind.PROCESS, jobs[pick % len(jobs)], [{K.PID: str(i)} for i in range(value + 1)])
        elif op in ("update", "clear"):
            keys = jobs + model.keys(Kind.PROCESS)
            if keys:
                model.update(keys[pick % len(keys)], {K.STATE: None if op == "clear" else str(value)})
        elif op == "move" and jobs:
            model.move(jobs[pick % len(jobs)], queues[value % 2])
        elif op == "remove" and jobs:
            model.remove(jobs[pick % len(jobs)])

    for i, (op, pick, value) in enumerate(ops):
        if op == "batch":
            with model.batch():
                for nested in ops[i + 1:i + 1 + value]:
                    apply(*nested)
        else:
            apply(op, pick, value)
    assert replica.elements == model_truth(model)


def test_a_sink_that_leaves_while_a_change_is_told_does_not_keep_the_next_one_from_hearing_it():
    """A connection that stops listening in its flush (its last watched job ended) is taken out
    of the subscribers while they are being told; the one after it must still be flushed."""
    model, _, queue = make_model()

    class LeavesOnFlush(Recorder):
        def flush(self) -> None:
            super().flush()
            model.unsubscribe(self)

    leaving, staying = LeavesOnFlush(model), Recorder(model)
    model.subscribe(leaving)
    model.subscribe(staying)
    job = model.add(Kind.JOB, queue, {K.NAME: "j", K.STATE: "RUNNING"}, owner="sim")
    assert ("flush",) in leaving.take()
    assert staying.take()[-1] == ("flush",)  # told, though the sink before it left meanwhile
    model.update(job, {K.STATE: "COMPLETED"})
    assert leaving.take() == []
    assert ("changed", job, ["state"]) in staying.take()
