"""Brokers and the queue figures they rank by: properties, user brokers, the service's routing."""

from __future__ import annotations

import itertools
import textwrap
from typing import List

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.schedulers.local import LocalBackend
from proxy_agent.schedulers.sim import SimBackend, SimOptions
from proxy_agent.service.broker import (
    BenchmarkBroker,
    BrokerError,
    Brokering,
    Candidate,
    FastestQueueBroker,
    NullBroker,
    RandomBroker,
    UserBroker,
    exclusion,
    load_benchmarks,
    make_broker,
)
from proxy_agent.service.figures import QueueFigures
from proxy_agent.service.jobs import ErrorKind, JobSpec, JobState, ServiceError, SubmitError
from proxy_agent.service.model import ChangeSink, K, Kind, ServiceModel
from proxy_agent.service.service import JobService
from wait_support import scaled

JOB = JobSpec("/bin/true")

# --------------------------------------------------------------------------- strategies


@st.composite
def candidate_lists(draw, max_size: int = 8) -> List[Candidate]:
    """Queues with small figures, so that ties are frequent; some publish nothing."""
    count = draw(st.integers(1, max_size))
    out = []
    for i in range(count):
        total = draw(st.one_of(st.none(), st.integers(0, 12)))
        waiting = draw(st.one_of(st.none(), st.integers(0, 6)))
        free = None if total is None else draw(st.one_of(st.none(), st.integers(0, total)))
        figure = draw(st.one_of(st.none(), st.sampled_from([100.0, 250.5, 900.0, 1200.0])))
        out.append(Candidate(
            key=i + 1, label=f"b{i % 3}:q{i}", backend=f"b{i % 3}", name=f"q{i}",
            waiting=waiting, total_slots=total, free_slots=free,
            benchmarks={} if figure is None else {"specint2000": figure},
        ))
    return out


#: Keyed brokers, as factories: two calls give brokers that draw the same (seeded) numbers.
KEYED = {
    "Null": NullBroker,
    "Random": lambda: RandomBroker(7),
    "FastestQueue": FastestQueueBroker,
    "Benchmark": BenchmarkBroker,
    "Benchmark:specfp2000": lambda: BenchmarkBroker("specfp2000"),
}


# --------------------------------------------------------------------------- rankings


@settings(max_examples=300)
@given(candidate_lists(), st.sampled_from(sorted(KEYED)))
def test_a_ranking_is_a_permutation_ordered_by_a_total_preorder(candidates, name):
    keys = KEYED[name]().keys(JOB, candidates)
    ranked = KEYED[name]().rank(JOB, candidates)
    # a permutation: the very objects given, each once
    assert sorted(map(id, ranked)) == sorted(map(id, candidates))
    # the keys' order is total and transitive on these queues
    n = len(candidates)
    for i, j in itertools.product(range(n), repeat=2):
        assert keys[i] <= keys[j] or keys[j] <= keys[i]
    for i, j, k in itertools.product(range(n), repeat=3):
        if keys[i] <= keys[j] and keys[j] <= keys[k]:
            assert keys[i] <= keys[k]
    # the ranking follows it, and queues ranked equal keep the order they were given in
    position = {id(c): i for i, c in enumerate(candidates)}
    for a, b in zip(ranked, ranked[1:]):
        ka, kb = keys[position[id(a)]], keys[position[id(b)]]
        assert ka <= kb
        if ka == kb:
            assert position[id(a)] < position[id(b)]


@settings(max_examples=200)
@given(candidate_lists(), st.sampled_from(["FastestQueue", "Benchmark", "Null"]), st.randoms(use_true_random=False))
def test_a_deterministic_ranking_depends_on_the_given_order_only_among_equals(candidates, name, rnd):
    shuffled = list(candidates)
    rnd.shuffle(shuffled)
    broker = KEYED[name]()
    first = broker.rank(JOB, candidates)
    second = broker.rank(JOB, shuffled)
    key_of = {id(c): k for c, k in zip(candidates, broker.keys(JOB, candidates))}
    assert [key_of[id(c)] for c in first] == [key_of[id(c)] for c in second]


def fastest_queue_directly(candidates: List[Candidate]) -> List[str]:
    """FastestQueue's order computed another way: insertion into a list by its rules, spelled
    out with exact cross-multiplication instead of sort keys."""

    def published(c: Candidate) -> bool:
        return c.waiting is not None and bool(c.total_slots)

    def before(a: Candidate, b: Candidate) -> bool:
        """a must come strictly before b."""
        if published(a) != published(b):
            return published(a)
        if not published(a):
            return False
        if a.waiting * b.total_slots != b.waiting * a.total_slots:
            return a.waiting * b.total_slots < b.waiting * a.total_slots
        if a.waiting == 0 and b.waiting == 0:
            return (a.free_slots or 0) > (b.free_slots or 0)
        return False

    order: List[Candidate] = []
    for c in candidates:
        # after every queue it does not come strictly before: ties keep the given order
        at = len(order)
        while at > 0 and before(c, order[at - 1]):
            at -= 1
        order.insert(at, c)
    return [c.label for c in order]


@settings(max_examples=500)
@given(candidate_lists(max_size=10))
def test_fastest_queue_orders_as_computed_directly_ties_included(candidates):
    assert [c.label for c in FastestQueueBroker().rank(JOB, candidates)] == fastest_queue_directly(candidates)


def test_fastest_queue_examples_and_reasons():
    a = Candidate(1, "x:a", "x", "a", waiting=4, total_slots=8, free_slots=0)
    b = Candidate(2, "x:b", "x", "b", waiting=0, total_slots=8, free_slots=2)
    c = Candidate(3, "x:c", "x", "c", waiting=0, total_slots=4, free_slots=4)
    d = Candidate(4, "x:d", "x", "d", total_slots=64)  # no waiting figure
    e = Candidate(5, "x:e", "x", "e", waiting=2, total_slots=4, free_slots=0)  # ties with a: 1/2
    broker = FastestQueueBroker()
    assert [q.name for q in broker.rank(JOB, [d, a, e, b, c])] == ["c", "b", "a", "e", "d"]
    assert [q.name for q in broker.rank(JOB, [e, a])] == ["e", "a"]
    assert broker.choose(JOB, [a, b])[1] == "FastestQueue: 0 waiting of 8 slots, 2 free"
    assert broker.choose(JOB, [a])[1] == "FastestQueue: 4 waiting of 8 slots"
    assert broker.choose(JOB, [d])[1] == "FastestQueue: no load figures for x:d (such queues rank last)"


def test_benchmark_ranks_highest_first_and_missing_figures_last():
    slow = Candidate(1, "x:slow", "x", "slow", benchmarks={"specint2000": 300.0, "specfp2000": 900.0})
    none = Candidate(2, "x:none", "x", "none")
    fast = Candidate(3, "x:fast", "x", "fast", benchmarks={"specint2000": 1200.5})
    assert [q.name for q in BenchmarkBroker().rank(JOB, [none, slow, fast])] == ["fast", "slow", "none"]
    assert [q.name for q in BenchmarkBroker("SPECfp2000").rank(JOB, [fast, none, slow])] == ["slow", "fast", "none"]
    assert BenchmarkBroker().choose(JOB, [slow, fast])[1] == "Benchmark: specint2000 1200.5"
    assert BenchmarkBroker().choose(JOB, [none])[1] == "Benchmark: no specint2000 figure for x:none (such queues rank last)"


def test_random_is_reproducible_with_a_seed_and_varies_with_it():
    queues = [Candidate(i, f"x:q{i}", "x", f"q{i}") for i in range(6)]

    def orders(seed):
        broker = RandomBroker(seed)
        return [tuple(q.name for q in broker.rank(JOB, queues)) for _ in range(5)]

    assert orders(3) == orders(3)
    assert len({tuple(orders(seed)) for seed in range(10)}) > 1
    assert len(set(orders(3))) > 1  # successive submissions are drawn anew
    assert RandomBroker(3).choose(JOB, queues)[1] == "Random: drawn at random (seed 3)"


def test_null_keeps_the_order_given():
    queues = [Candidate(i, f"x:q{i}", "x", f"q{i}", waiting=i) for i in (3, 1, 2)]
    assert NullBroker().rank(JOB, queues) == queues
    assert NullBroker().choose(JOB, queues)[1] == "Null: first in the order given"


# --------------------------------------------------------------------------- naming brokers


def test_broker_names():
    assert isinstance(make_broker("fastestqueue"), FastestQueueBroker)
    assert isinstance(make_broker(" FastestQueue "), FastestQueueBroker)
    assert make_broker("Random:42").seed == 42
    assert make_broker("Random").seed is None
    assert make_broker("benchmark").benchmark == "specint2000"
    assert make_broker("Benchmark:SPECfp2000").benchmark == "specfp2000"
    for bad, words in [
        ("", "empty broker name"),
        ("Fastest", "unknown broker 'Fastest'; brokers are Null, Random, FastestQueue, Benchmark"),
        ("Random:x", "the seed must be a whole number"),
        ("Null:1", "Null takes no argument"),
        ("Benchmark:", "name a benchmark"),
        ("Benchmark:a b", "name a benchmark"),
        ("no_such_module_here:Broker", "cannot import no_such_module_here: ModuleNotFoundError"),
        ("json:NoSuchClass", "json has no class NoSuchClass"),
        ("json:not-a-name", "expected module:Class"),
    ]:
        with pytest.raises(BrokerError) as failure:
            make_broker(bad)
        assert words in failure.value.message
        assert failure.value.kind is ErrorKind.BAD_REQUEST


# --------------------------------------------------------------------------- user brokers

USER_BROKERS = '''
import sys, time

class ByName:
    """The rank interface: alphabetical by queue name, with a reason."""
    def __init__(self, argument=None):
        self.reverse = argument == "reverse"
        self.seen = []
    def rank(self, job, candidates):
        self.seen.append((job.executable, [c.label for c in candidates]))
        return sorted(candidates, key=lambda c: c.name, reverse=self.reverse)
    def reason(self, job, candidate):
        return f"{candidate.name} comes first\\nby name"

class MostFree:
    """The pairwise interface of the seed's Python broker."""
    def __init__(self):
        self.job = None
    def set(self, job):
        self.job = job
    def lessthan(self, a, b):
        return (a.free_slots or 0) > (b.free_slots or 0)

class Raises:
    def rank(self, job, candidates):
        raise RuntimeError("no idea")

class Drops:
    def rank(self, job, candidates):
        return candidates[1:]

class Repeats:
    def rank(self, job, candidates):
        return [candidates[0]] * len(candidates)

class Labels:
    def rank(self, job, candidates):
        return [c.label for c in candidates]

class NotAList:
    def rank(self, job, candidates):
        return 42

class Maybe:
    def lessthan(self, a, b):
        return None

class Exits:
    def rank(self, job, candidates):
        sys.exit(3)

class Hangs:
    def rank(self, job, candidates):
        time.sleep(3)
        return candidates

class Neither:
    pass

class BadInit:
    def __init__(self):
        raise ValueError("cannot start")

class BadReason:
    def rank(self, job, candidates):
        return candidates
    def reason(self, job, candidate):
        return 7
'''


@pytest.fixture
def user_module(tmp_path):
    path = tmp_path / "my_brokers.py"
    path.write_text(USER_BROKERS)
    return str(path)


def _queues():
    return [
        Candidate(1, "sim:long", "sim", "long", free_slots=4),
        Candidate(2, "local:default", "local", "default", free_slots=8),
        Candidate(3, "sim:batch", "sim", "batch", free_slots=2),
    ]


def test_user_broker_with_the_rank_interface(user_module):
    broker = make_broker(f"{user_module}:ByName")
    assert isinstance(broker, UserBroker) and broker.interface == "rank"
    queues = _queues()
    ranked, reason = broker.choose(JOB, queues)
    assert [q.name for q in ranked] == ["batch", "default", "long"]
    assert reason == f"{user_module}:ByName: batch comes first by name"  # one line
    assert broker.instance.seen == [("/bin/true", ["sim:long", "local:default", "sim:batch"])]
    reverse = make_broker(f"{user_module}:ByName:reverse")
    assert [q.name for q in reverse.rank(JOB, queues)] == ["long", "default", "batch"]


def test_user_broker_with_pairwise_comparisons(user_module):
    broker = make_broker(f"{user_module}:MostFree")
    assert broker.interface == "lessthan"
    job = JobSpec("/bin/hostname", num_procs=2)
    ranked, reason = broker.choose(job, _queues())
    assert [q.free_slots for q in ranked] == [8, 4, 2]
    assert broker.instance.job is job  # set(job) came first
    assert reason == f"{user_module}:MostFree: ranked first"


def test_user_broker_by_module_name(tmp_path, monkeypatch):
    (tmp_path / "site_brokers_for_test.py").write_text(USER_BROKERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    broker = make_broker("site_brokers_for_test:ByName")
    assert [q.name for q in broker.rank(JOB, _queues())][0] == "batch"


@pytest.mark.parametrize("name, words", [
    ("Raises", "failed: RuntimeError: no idea"),
    ("Drops", "rank() left out sim:long; it must return every candidate it was given"),
    ("Repeats", "rank() returned sim:long twice"),
    ("Labels", "rank() returned 'sim:long'; it must return the candidates it was given"),
    ("NotAList", "rank() returned int, not a list of the candidates"),
    ("Maybe", "lessthan() must return True or False, got NoneType None"),
    ("Exits", "failed: SystemExit: 3"),
    ("BadReason", "reason() returned int, not text"),
])
def test_a_broken_user_broker_gets_a_clear_error(user_module, name, words):
    broker = make_broker(f"{user_module}:{name}")
    with pytest.raises(BrokerError) as failure:
        broker.choose(JOB, _queues())
    assert failure.value.message.startswith(f"broker {user_module}:{name} ")
    assert words in failure.value.message
    assert failure.value.kind is ErrorKind.SUBMIT_FAILED


def test_a_user_broker_that_does_not_answer_is_given_up(user_module):
    broker = make_broker(f"{user_module}:Hangs")
    broker.timeout = 0.2
    with pytest.raises(BrokerError, match=r"did not answer within 0\.2 s"):
        broker.choose(JOB, _queues())
    with pytest.raises(BrokerError, match="not used until the agent restarts"):
        broker.choose(JOB, _queues())


@pytest.mark.parametrize("name, words", [
    ("Neither", "has neither rank(job, candidates) nor lessthan(a, b)"),
    ("BadInit", "creating BadInit failed: ValueError: cannot start"),
])
def test_a_user_broker_that_cannot_be_made(user_module, name, words):
    with pytest.raises(BrokerError) as failure:
        make_broker(f"{user_module}:{name}")
    assert words in failure.value.message and failure.value.kind is ErrorKind.BAD_REQUEST


def test_a_missing_broker_file(tmp_path):
    with pytest.raises(BrokerError, match="no such file"):
        make_broker(f"{tmp_path}/nothing.py:X")


# --------------------------------------------------------------------------- the filter


def _model_with_queues(figures):
    """A model with one queue per dict of attributes (owner ``b``), and their keys."""
    model = ServiceModel()
    keys = []
    for i, attrs_ in enumerate(figures):
        keys.append(model.add(Kind.QUEUE, None, {K.NAME: f"q{i}", **attrs_}, owner="b"))
    return model, keys


@st.composite
def queue_figures(draw):
    attrs_ = {K.STATE: draw(st.sampled_from(["NORMAL", "NORMAL", "STOPPED"]))}
    for name, top in ((K.TOTAL_SLOTS, 16), (K.MAX_TIME, 7200), (K.MAX_NODES, 4), (K.TOTAL_NODES, 4)):
        value = draw(st.one_of(st.none(), st.integers(0, top)))
        if value is not None:
            attrs_[name] = str(value)
    return attrs_


@st.composite
def jobs(draw):
    return JobSpec(
        "/bin/true",
        num_procs=draw(st.integers(1, 20)),
        cpus_per_task=draw(st.one_of(st.none(), st.integers(1, 3))),
        wall_time=draw(st.one_of(st.none(), st.integers(1, 9000))),
        nodes=draw(st.one_of(st.none(), st.integers(1, 5))),
    )


def can_run(job: JobSpec, attrs_: dict) -> bool:
    """Whether a queue with these attributes can run the job, spelled out independently."""
    if attrs_.get(K.STATE) == "STOPPED":
        return False
    slots = job.num_procs * (job.cpus_per_task or 1)
    if K.TOTAL_SLOTS in attrs_ and slots > int(attrs_[K.TOTAL_SLOTS]):
        return False
    if job.wall_time is not None and K.MAX_TIME in attrs_ and job.wall_time > int(attrs_[K.MAX_TIME]):
        return False
    for limit in (K.MAX_NODES, K.TOTAL_NODES):
        if job.nodes is not None and limit in attrs_ and job.nodes > int(attrs_[limit]):
            return False
    return True


@settings(max_examples=300)
@given(st.lists(queue_figures(), min_size=1, max_size=6), jobs(), st.randoms(use_true_random=False))
def test_the_filter_never_keeps_a_queue_that_cannot_run_the_job(figures, job, rnd):
    model, keys = _model_with_queues(figures)
    order = keys + [rnd.choice(keys)]  # a repeat is dropped
    kept, left_out = Brokering(model).screen(job, order)
    able = {key for key, attrs_ in zip(keys, figures) if can_run(job, attrs_)}
    assert {c.key for c in kept} == able
    assert [c.key for c in kept] == [k for k in keys if k in able]  # in the order given
    assert [label for label, _ in left_out] == [f"b:q{i}" for i, k in enumerate(keys) if k not in able]
    assert all(why for _, why in left_out)


def test_why_queues_are_left_out():
    assert exclusion(JobSpec("x", num_procs=3, cpus_per_task=2), Candidate(1, "b:q", "b", "q", total_slots=4)) == \
        "6 slots needed, the queue has 4"
    assert exclusion(JobSpec("x", wall_time=7200), Candidate(1, "b:q", "b", "q", max_time=3600)) == \
        "wall time 2:00:00 above the queue's maximum 1:00:00"
    assert exclusion(JobSpec("x", wall_time=90000), Candidate(1, "b:q", "b", "q", max_time=86400)) == \
        "wall time 1-01:00:00 above the queue's maximum 1-00:00:00"
    assert exclusion(JobSpec("x"), Candidate(1, "b:q", "b", "q", state="STOPPED")) == "the queue is stopped"
    assert exclusion(JobSpec("x", nodes=3), Candidate(1, "b:q", "b", "q", max_nodes=2)) == \
        "3 nodes asked, the queue's maximum per job is 2"
    assert exclusion(JobSpec("x", num_procs=2, wall_time=60), Candidate(1, "b:q", "b", "q", total_slots=2, max_time=60)) is None


def test_when_every_queue_is_left_out_the_error_says_why_for_each():
    model, keys = _model_with_queues([{K.TOTAL_SLOTS: "2"}, {K.STATE: "STOPPED"}, {K.MAX_TIME: "60"}])
    with pytest.raises(SubmitError) as failure:
        Brokering(model).decide(JobSpec("x", num_procs=4, wall_time=120), keys, "FastestQueue")
    assert failure.value.message == (
        "no queue can run this job (b:q0: 4 slots needed, the queue has 2; b:q1: the queue is stopped; "
        "b:q2: wall time 0:02:00 above the queue's maximum 0:01:00)"
    )
    assert failure.value.kind is ErrorKind.SUBMIT_FAILED


# --------------------------------------------------------------------------- benchmark files


def test_benchmark_file(tmp_path):
    path = tmp_path / "brokers.ini"
    path.write_text(textwrap.dedent("""\
        # figures per queue
        [slurm:long]
        specint2000 = 1850
        SPECfp2000 = 1620.5

        [local:default]
        specint2000 = 900
    """))
    assert load_benchmarks(str(path)) == {
        "slurm:long": {"specint2000": 1850.0, "specfp2000": 1620.5},
        "local:default": {"specint2000": 900.0},
    }


@pytest.mark.parametrize("text, words", [
    ("[long]\nspecint2000 = 1\n", "section [long] must name a queue as [SCHEDULER:QUEUE]"),
    ("[sim:long]\nspecint2000 = fast\n", "[sim:long] specint2000 = 'fast' is not a finite number"),
    ("[sim:long]\nspecint2000 = nan\n", "is not a finite number"),
    ("[sim:long]\nspecint2000 = inf\n", "is not a finite number"),
    ("[sim:long]\nspec int = 1\n", "has characters other than"),
    ("specint2000 = 1\n", "cannot be read: File contains no section headers"),
    ("[sim:long]\na = 1\n[sim:long]\na = 2\n", "cannot be read"),
])
def test_a_bad_benchmark_file_is_named_with_what_is_wrong(tmp_path, text, words):
    path = tmp_path / "brokers.ini"
    path.write_text(text)
    with pytest.raises(ValueError) as failure:
        load_benchmarks(str(path))
    assert words in str(failure.value) and str(path) in str(failure.value)


def test_an_unreadable_benchmark_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read the broker configuration .*nothing.ini"):
        load_benchmarks(str(tmp_path / "nothing.ini"))
    binary = tmp_path / "binary.ini"
    binary.write_bytes(b"[a:b]\nx = \xff\xfe\n")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_benchmarks(str(binary))


def test_benchmark_figures_become_queue_attributes_also_of_queues_that_appear_later(tmp_path):
    path = tmp_path / "brokers.ini"
    path.write_text("[b:early]\nspecint2000 = 100\n[b:late]\nspecint2000 = 2000.25\nother = 3\n")
    model = ServiceModel()
    early = model.add(Kind.QUEUE, None, {K.NAME: "early"}, owner="b")
    brokering = Brokering(model)
    brokering.configure("Benchmark", str(path))
    assert model.attr(early, "benchmark.specint2000") == "100"
    late = model.add(Kind.QUEUE, None, {K.NAME: "late"}, owner="b")
    unlisted = model.add(Kind.QUEUE, None, {K.NAME: "unlisted"}, owner="b")
    assert model.attr(late, "benchmark.specint2000") == "2000.25" and model.attr(late, "benchmark.other") == "3"
    assert model.attrs(unlisted) == {K.NAME: "unlisted"}
    decision = brokering.decide(JOB, [early, unlisted, late], brokering.default)
    assert (decision.label, decision.broker, decision.reason) == ("b:late", "Benchmark", "Benchmark: specint2000 2000.25")


def test_configure_refuses_a_bad_default_broker():
    with pytest.raises(ValueError, match="--broker: unknown broker 'Quickest'"):
        Brokering(ServiceModel()).configure("Quickest")


# --------------------------------------------------------------------------- queue figures


def direct_figures(model: ServiceModel, queue: int, shared: bool) -> dict:
    """A queue's figures counted from scratch over the model's jobs."""
    waiting = {"ACCEPTED", "PREPARING", "SUBMITTING", "QUEUING"}
    running = {"RUNNING", "FINISHING"}
    owner = model.get(queue).owner
    pool = [q for q in model.keys(Kind.QUEUE) if model.get(q).owner == owner] if shared else [queue]
    counts = {"waiting": 0, "running": 0}
    used = 0
    for job in model.keys(Kind.JOB):
        element = model.get(job)
        state = model.attr(job, K.STATE)
        if element.parent == queue:
            counts["waiting"] += state in waiting
            counts["running"] += state in running
        if element.parent in pool and state in running:
            used += int(model.attr(job, K.NUM_PROCS, "1"))
    total = model.attr(queue, K.TOTAL_SLOTS)
    return {
        K.WAITING: str(counts["waiting"]),
        K.RUNNING: str(counts["running"]),
        K.FREE_SLOTS: None if total is None else str(max(0, int(total) - used)),
    }


STATES = [s.value for s in JobState]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5), st.sampled_from(STATES), st.integers(1, 4)),
        st.tuples(st.just("state"), st.integers(0, 1000), st.sampled_from(STATES)),
        st.tuples(st.just("move"), st.integers(0, 1000), st.integers(0, 5)),
        st.tuples(st.just("remove"), st.integers(0, 1000)),
        st.tuples(st.just("total"), st.integers(0, 5), st.integers(0, 40)),
        st.tuples(st.just("batch"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150)
@given(operations)
def test_queue_figures_equal_a_count_from_scratch_after_any_changes(ops):
    model = ServiceModel()
    figures = QueueFigures(model)
    model.observe(figures)
    queues = [model.add(Kind.QUEUE, None, {K.NAME: f"q{i}", K.TOTAL_SLOTS: "16"}, owner=owner)
              for i, owner in enumerate(["own", "own", "own", "pool", "pool", "other"])]
    figures.track("own", "queue")
    figures.track("pool", "shared")
    jobs_: List[int] = []
    stack = []
    for op in ops:
        kind = op[0]
        if kind == "batch":
            if op[1]:
                cm = model.batch()
                cm.__enter__()
                stack.append(cm)
            elif stack:
                stack.pop().__exit__(None, None, None)
        elif kind == "add":
            queue = queues[op[1]]
            jobs_.append(model.add(Kind.JOB, queue, {K.STATE: op[2], K.NUM_PROCS: str(op[3])},
                                   owner=model.get(queue).owner))
        elif kind == "total":
            model.update(queues[op[1]], {K.TOTAL_SLOTS: str(op[2])})
        elif jobs_:
            job = jobs_[op[1] % len(jobs_)]
            if job not in model:
                continue
            if kind == "state":
                model.update(job, {K.STATE: op[2]})
            elif kind == "move":
                target = queues[op[2]]
                if model.get(target).owner == model.get(job).owner:
                    model.move(job, target)
            elif kind == "remove":
                model.remove(job)
    while stack:
        stack.pop().__exit__(None, None, None)
    for queue in queues:
        owner = model.get(queue).owner
        got = {name: model.attr(queue, name) for name in (K.WAITING, K.RUNNING, K.FREE_SLOTS)}
        if owner == "other":
            assert got == {K.WAITING: None, K.RUNNING: None, K.FREE_SLOTS: None}
        else:
            assert got == direct_figures(model, queue, owner == "pool"), owner


class Recorder(ChangeSink):
    def __init__(self):
        self.seen = []

    def changed(self, element, slots):
        self.seen.append(("changed", element.key))

    def flush(self):
        self.seen.append(("flush",))


def test_figures_reach_subscribers_with_their_cause_in_one_flush_and_output_is_still_kept():
    model = ServiceModel()
    figures = QueueFigures(model)
    model.observe(figures)
    queue = model.add(Kind.QUEUE, None, {K.NAME: "q", K.TOTAL_SLOTS: "4"}, owner="own")
    figures.track("own", "queue")
    job = model.add(Kind.JOB, queue, {K.STATE: "QUEUING", K.NUM_PROCS: "3"}, owner="own")
    process = model.add(Kind.PROCESS, job, {}, owner="own")
    # nobody but the observer listens: output is kept for the next client
    model.output(process, "stdout", "kept")
    assert [line[2] for line in model.take_backlog()[job].lines] == ["kept"]
    recorder = Recorder()
    model.subscribe(recorder)
    model.update(job, {K.STATE: "RUNNING"})
    assert recorder.seen == [("changed", job), ("changed", queue), ("flush",)]
    assert (model.attr(queue, K.WAITING), model.attr(queue, K.RUNNING), model.attr(queue, K.FREE_SLOTS)) == ("0", "1", "1")


def test_a_job_moved_between_queues_takes_its_count_along():
    model = ServiceModel()
    figures = QueueFigures(model)
    model.observe(figures)
    figures.track("own", "queue")
    a = model.add(Kind.QUEUE, None, {K.NAME: "a", K.TOTAL_SLOTS: "8"}, owner="own")
    b = model.add(Kind.QUEUE, None, {K.NAME: "b", K.TOTAL_SLOTS: "8"}, owner="own")
    job = model.add(Kind.JOB, a, {K.STATE: "QUEUING"}, owner="own")
    assert (model.attr(a, K.WAITING), model.attr(b, K.WAITING)) == ("1", "0")
    model.move(job, b)
    assert (model.attr(a, K.WAITING), model.attr(b, K.WAITING)) == ("0", "1")


async def test_sim_figures_follow_churn_and_node_changes(autojump_clock):
    model = ServiceModel()
    service = JobService(model)
    sim = SimBackend(model, SimOptions(nodes=20, jobs=400, churn=500, seed=5, time_scale=0.01), service.context())
    service.add_backend(sim)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await trio.sleep(2.0)  # about a thousand churn events, virtual time
        queues = [sim.queue_ids[name] for name in ("batch", "debug", "long")]
        up_cpus = sum(int(model.attr(n, K.CPUS)) for n in sim.node_ids if model.attr(n, K.STATE) == "UP")
        for queue in queues:
            assert model.attr(queue, K.TOTAL_SLOTS) == str(up_cpus)
            assert {name: model.attr(queue, name) for name in (K.WAITING, K.RUNNING, K.FREE_SLOTS)} == \
                direct_figures(model, queue, shared=True)
        nursery.cancel_scope.cancel()


async def test_local_figures_follow_its_jobs(nursery):
    service = JobService()
    local = LocalBackend(service.model, None, service.context())
    service.add_backend(local)
    await nursery.start(service.run)
    await service.ready.wait()
    model, queue = service.model, local.queue_id
    cpus = local.cpus
    assert (model.attr(queue, K.TOTAL_SLOTS), model.attr(queue, K.FREE_SLOTS)) == (str(cpus), str(cpus))
    job = await service.submit(JobSpec("/bin/sleep", ("30",), num_procs=1))
    with trio.fail_after(scaled(30)):
        while model.attr(job, K.STATE) != "RUNNING":
            await trio.sleep(0.01)
    assert (model.attr(queue, K.WAITING), model.attr(queue, K.RUNNING)) == ("0", "1")
    assert model.attr(queue, K.FREE_SLOTS) == str(max(0, cpus - 1))
    await service.terminate(job)
    with trio.fail_after(scaled(30)):
        while not JobState(model.attr(job, K.STATE)).final:
            await trio.sleep(0.01)
    assert (model.attr(queue, K.RUNNING), model.attr(queue, K.FREE_SLOTS)) == ("0", str(cpus))


# --------------------------------------------------------------------------- routing in the service


async def _service(nursery, jobs=300, **sim):
    service = JobService()
    service.add_backend(LocalBackend(service.model, None, service.context()))
    service.add_backend(SimBackend(service.model, SimOptions(jobs=jobs, time_scale=100.0, **sim), service.context()))
    await nursery.start(service.run)
    await service.ready.wait()
    return service


async def test_the_service_places_jobs_where_the_broker_says(nursery):
    service = await _service(nursery)
    model = service.model
    sim_queues = ["sim:batch", "sim:debug", "sim:long"]
    candidates = [Candidate.from_model(model, service.queue_key(q)) for q in sim_queues]
    expected = fastest_queue_directly(candidates)[0]
    key = await service.submit(JobSpec("/bin/true", candidates=tuple(sim_queues), broker="FastestQueue"))
    assert service.queue_label(model.get(key).parent) == expected
    chosen = next(c for c in candidates if c.label == expected)
    assert model.attr(key, "broker") == "FastestQueue"
    assert model.attr(key, "brokerQueue") == expected
    assert model.attr(key, "brokerReason") == f"FastestQueue: {chosen.waiting} waiting of {chosen.total_slots} slots"
    # several candidates, no broker: Null, the first that can run the job
    too_many = int(model.attr(service.queue_key("local:default"), K.TOTAL_SLOTS)) + 1
    key = await service.submit(JobSpec("/bin/true", candidates=("local:default", "sim:long"), num_procs=too_many))
    assert service.queue_label(model.get(key).parent) == "sim:long"
    assert model.attr(key, "brokerReason") == (
        f"Null: first in the order given; left out local:default ({too_many} slots needed, "
        f"the queue has {too_many - 1})"
    )
    # by key, and repeated: the same queue once
    long_key = service.queue_key("sim:long")
    key = await service.submit(JobSpec("/bin/true", candidates=(long_key, "sim:long"), broker="Random:1"))
    assert model.get(key).parent == long_key
    # one queue named: no broker, no broker attributes
    key = await service.submit(JobSpec("/bin/true", queue="sim:debug", broker="FastestQueue"))
    assert model.attr(key, "broker") is None
    # none named and no broker: the default queue as before
    key = await service.submit(JobSpec("/bin/true"))
    assert service.queue_label(model.get(key).parent) == "local:default" and model.attr(key, "broker") is None


async def test_a_default_broker_places_jobs_that_name_no_queue_among_every_queue(nursery):
    service = await _service(nursery)
    service.brokering.configure("FastestQueue")
    model = service.model
    everything = [Candidate.from_model(model, k) for k in model.keys(Kind.QUEUE)]
    key = await service.submit(JobSpec("/bin/true"))
    assert service.queue_label(model.get(key).parent) == fastest_queue_directly(everything)[0]
    # the submission's own broker wins over the default
    key = await service.submit(JobSpec("/bin/true", broker="Null"))
    assert service.queue_label(model.get(key).parent) == "local:default"
    assert model.attr(key, "broker") == "Null"


async def test_routing_errors(nursery, tmp_path):
    service = await _service(nursery)
    with pytest.raises(ServiceError) as failure:
        await service.submit(JobSpec("/bin/true", candidates=("sim:debug", "sim:nosuch")))
    assert failure.value.kind is ErrorKind.NO_SUCH_QUEUE and "sim:nosuch" in failure.value.message
    with pytest.raises(ServiceError) as failure:
        await service.submit(JobSpec("/bin/true", candidates=("sim:debug", "local:default"), broker="Best"))
    assert failure.value.kind is ErrorKind.BAD_REQUEST and "unknown broker 'Best'" in failure.value.message
    broken = tmp_path / "broken_broker.py"
    broken.write_text(USER_BROKERS)
    with pytest.raises(ServiceError) as failure:
        await service.submit(JobSpec("/bin/true", candidates=("sim:debug", "local:default"),
                                     broker=f"{broken}:Drops"))
    assert failure.value.kind is ErrorKind.SUBMIT_FAILED
    assert "left out sim:debug" in failure.value.message
    # the service goes on serving
    key = await service.submit(JobSpec("/bin/true", candidates=("sim:debug", "local:default"), broker=f"{broken}:ByName"))
    assert service.queue_label(service.model.get(key).parent) == "sim:debug"


async def test_queues_of_a_scheduler_that_failed_are_left_out(nursery):
    service = await _service(nursery)
    service.failures["sim"] = "the sim scheduler failed to start: for this test"
    key = await service.submit(JobSpec("/bin/true", broker="FastestQueue"))
    assert service.model.owner(key) == "local"
    with pytest.raises(SubmitError, match="sim:debug: its scheduler is not running"):
        await service.submit(JobSpec("/bin/true", candidates=("sim:debug", "sim:long")))


def test_the_service_describes_the_broker_attributes():
    service = JobService()
    names = {info.name for info in service.attributes()}
    assert {"broker", "brokerQueue", "brokerReason", K.WAITING, K.FREE_SLOTS} <= names
    assert next(i for i in service.attributes() if i.name == "broker").settable


# --------------------------------------------------------------------------- how PTP clients ask


def test_submit_job_attributes_name_several_queues_and_a_broker():
    from proxy_agent.frontends.ptp import mapping
    from proxy_agent.protocol.attributes import AttributeSet

    def spec(*args):
        return mapping.job_spec(AttributeSet.parse(["jobSubId=s", "execName=true", *args]),
                                lambda text: int(text) - 1000 if text.isdigit() else text)

    several = spec("queueId=1007, sim:debug,,slurm:long ", "broker=FastestQueue")
    assert (several.queue, several.candidates, several.broker) == (None, (7, "sim:debug", "slurm:long"), "FastestQueue")
    one = spec("queueId=1007,", "broker=Random")
    assert (one.queue, one.candidates, one.broker) == (7, (), "Random")
    anywhere = spec("broker=Benchmark:specfp2000")
    assert (anywhere.queue, anywhere.candidates, anywhere.broker) == (None, (), "Benchmark:specfp2000")
    partitions = spec("partition=debug,long")
    assert (partitions.queue, partitions.candidates) == (None, ("debug", "long"))
    assert spec("partition=1007").queue == "1007"  # a partition is a name
    plain = spec()
    assert (plain.queue, plain.candidates, plain.broker) == (None, (), None)


# --------------------------------------------------------------------------- the brokers' names


def test_every_named_broker_is_made_by_its_name():
    from proxy_agent.service.broker_names import BUILT_IN_BROKERS

    for name in BUILT_IN_BROKERS:
        assert make_broker(name).name == name
        assert make_broker(name.upper()).name == name  # names match without regard to case


def test_broker_names_are_shown_from_the_one_list(monkeypatch):
    """The ``--broker`` help, shell completion and the submission attribute's description all
    name the brokers of :data:`BUILT_IN_BROKERS`, and none other."""
    from proxy_agent import completion
    from proxy_agent.__main__ import build_parser
    from proxy_agent.service import broker_names
    from proxy_agent.service.brokering import ATTRIBUTES, JOB_BROKER

    described = next(info for info in ATTRIBUTES if info.name == JOB_BROKER).description
    for name in broker_names.BUILT_IN_BROKERS:
        assert name in described
    extended = dict(broker_names.BUILT_IN_BROKERS, Newest=broker_names.BuiltInBroker(":AGE", "NewestBroker"))
    monkeypatch.setattr(broker_names, "BUILT_IN_BROKERS", extended)
    help_text = " ".join(build_parser().format_help().split())
    assert "Null, Random[:SEED], FastestQueue, Benchmark[:NAME], Newest[:AGE] or module:Class" in help_text
    agent = next(program for program in completion.programs() if program.name == "proxy-agent")
    assert agent.hints["--broker"] == ["Null", "Random", "FastestQueue", "Benchmark", "Newest"]
