"""Brokers: which of several queues a job goes to.

A submission may name several candidate queues (``JobSpec.candidates``, across backends) or
none (then every queue of every running backend).  The queues that cannot run the job are left
out (:func:`exclusion`: more slots asked than the queue has, a wall time above its maximum, a
stopped queue); a broker ranks the rest and the job goes to the first.  As in the
multi-scheduler client library the service takes its ideas from, brokers are small ranking
classes over what the queues publish.

Brokers
-------
``Null``
    keeps the order given (the first queue that can run the job wins).
``Random`` or ``Random:SEED``
    a random order; with a seed, the same seed and the same submissions give the same choices.
``FastestQueue``
    the fewest waiting jobs per slot (``waitingJobs / totalSlots``) first; among queues with no
    job waiting, the most free slots first.  A queue that publishes no such figures comes last.
``Benchmark`` or ``Benchmark:NAME``
    the highest benchmark figure first (``specint2000`` unless NAME is given), from the queues'
    ``benchmark.NAME`` attributes, which a configuration file provides (:func:`load_benchmarks`).
    A queue without the figure comes last.
``module:Class`` or ``module:Class:ARGUMENT`` (``module`` may be a ``.py`` file's path)
    a user broker (:class:`UserBroker`).

Every broker keeps the given order among queues it ranks equal.  Broker names are matched
without regard to case; a built-in name wins over a module of the same name.

The figures are attributes of each queue in the model (:mod:`.figures` keeps them for backends
that do not report their own); a broker sees them in a :class:`Candidate`.  The chosen queue's
label, the broker and its reason become attributes of the job (:data:`JOB_BROKER`,
:data:`JOB_BROKER_QUEUE`, :data:`JOB_BROKER_REASON`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import math
import os
import random
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import attrs

if TYPE_CHECKING:  # pragma: no cover
    from fractions import Fraction

from .figures import BENCHMARK_PREFIX
from .jobs import ErrorKind, JobSpec, SubmitError
from .model import K, ServiceModel

# What the service needs from the start (it is loaded before any job is brokered) is in
# .brokering; its names are this module's too.
from .broker_names import BUILT_IN_BROKERS

__all__ = [
    "BenchmarkBroker",
    "Broker",
    "BrokerError",
    "Candidate",
    "DEFAULT_BENCHMARK",
    "FastestQueueBroker",
    "KeyedBroker",
    "NullBroker",
    "RandomBroker",
    "UserBroker",
    "exclusion",
    "load_benchmarks",
    "built_in_class",
    "describe_failure",
    "make_broker",
]

#: The benchmark ``Benchmark`` ranks by when none is named.
DEFAULT_BENCHMARK = "specint2000"
#: Seconds a user broker may take to answer before the submission fails.
USER_BROKER_TIMEOUT = 5.0
#: Longest reason text kept from a user broker.
_REASON_LIMIT = 200

class BrokerError(SubmitError):
    """A broker could not be found, loaded, or failed to rank (the submission is refused)."""


# --------------------------------------------------------------------------- candidates


@attrs.frozen(eq=False)
class Candidate:
    """A queue a job may go to, with the figures brokers look at (None: not published).

    ``label`` is ``BACKEND:NAME``; ``attributes`` holds every attribute of the queue;
    ``benchmarks`` maps benchmark names (lower case) to figures.  Candidates compare by
    identity: a broker returns the very objects it was given.
    """

    key: int
    label: str
    backend: str
    name: str
    state: str = "NORMAL"
    waiting: Optional[int] = None
    running: Optional[int] = None
    total_slots: Optional[int] = None
    free_slots: Optional[int] = None
    max_time: Optional[int] = None
    total_nodes: Optional[int] = None
    max_nodes: Optional[int] = None
    benchmarks: Mapping[str, float] = attrs.field(factory=dict)
    attributes: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_model(cls, model: ServiceModel, key: int) -> "Candidate":
        values = model.attrs(key)
        element = model.get(key)
        name = str(values.get(K.NAME, key))
        benchmarks: Dict[str, float] = {}
        for attr, value in values.items():
            if attr.startswith(BENCHMARK_PREFIX):
                figure = _figure(value)
                if figure is not None:
                    benchmarks[attr[len(BENCHMARK_PREFIX):]] = figure
        return cls(
            key=key,
            label=f"{element.owner}:{name}",
            backend=element.owner,
            name=name,
            state=str(values.get(K.STATE, "NORMAL")),
            waiting=_count(values.get(K.WAITING)),
            running=_count(values.get(K.RUNNING)),
            total_slots=_count(values.get(K.TOTAL_SLOTS)),
            free_slots=_count(values.get(K.FREE_SLOTS)),
            max_time=_count(values.get(K.MAX_TIME)),
            total_nodes=_count(values.get(K.TOTAL_NODES)),
            max_nodes=_count(values.get(K.MAX_NODES)),
            benchmarks=benchmarks,
            attributes=values,
        )


def _count(value: Any) -> Optional[int]:
    """A published count, or None when absent or not a whole number >= 0."""
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            return int(text)
    return None


def _figure(value: Any) -> Optional[float]:
    try:
        figure = float(value)
    except (TypeError, ValueError):
        return None
    return figure if math.isfinite(figure) else None


def _duration(seconds: int) -> str:
    """Seconds as ``H:MM:SS``, or ``D-HH:MM:SS`` from a day on (SLURM's way)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}"


def exclusion(job: JobSpec, queue: Candidate) -> Optional[str]:
    """Why ``queue`` cannot run ``job`` (None: it can, as far as its figures tell)."""
    if queue.state == "STOPPED":
        return "the queue is stopped"
    slots = job.num_procs * max(1, job.cpus_per_task or 1)
    if queue.total_slots is not None and slots > queue.total_slots:
        return f"{slots} slots needed, the queue has {queue.total_slots}"
    if job.wall_time is not None and queue.max_time is not None and job.wall_time > queue.max_time:
        return f"wall time {_duration(job.wall_time)} above the queue's maximum {_duration(queue.max_time)}"
    if job.nodes is not None:
        for limit, what in ((queue.max_nodes, "maximum per job"), (queue.total_nodes, "nodes in all")):
            if limit is not None and job.nodes > limit:
                return f"{job.nodes} nodes asked, the queue's {what} is {limit}"
    return None


# --------------------------------------------------------------------------- brokers


class Broker:
    """Ranks candidate queues for a job.  Subclasses give :meth:`rank` and :meth:`reason`."""

    #: how the broker is named in its reasons
    name = "Broker"

    def rank(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Candidate]:
        """The candidates, best first (a permutation of them)."""
        raise NotImplementedError

    def reason(self, job: JobSpec, chosen: Candidate) -> str:
        """Why ``chosen`` came first, in a few words (without the broker's name)."""
        return "ranked first"

    def choose(self, job: JobSpec, candidates: Sequence[Candidate]) -> Tuple[List[Candidate], str]:
        """The ranking and the reason for its first; BrokerError when the broker fails."""
        ranked = self.rank(job, candidates)
        return ranked, f"{self.name}: {self.reason(job, ranked[0])}"


class KeyedBroker(Broker):
    """A broker that gives each candidate a sort key: lower keys rank first, equal keys keep
    the given order.  Keys are totally ordered, so the ranking is a total preorder."""

    def keys(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Any]:
        raise NotImplementedError

    def rank(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Candidate]:
        keys = self.keys(job, candidates)
        order = sorted(range(len(candidates)), key=keys.__getitem__)  # stable: ties keep their order
        return [candidates[i] for i in order]


class NullBroker(KeyedBroker):
    """The order given."""

    name = "Null"

    def keys(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Any]:
        return [0] * len(candidates)

    def reason(self, job: JobSpec, chosen: Candidate) -> str:
        return "first in the order given"


class RandomBroker(KeyedBroker):
    """A random order; reproducible when seeded."""

    name = "Random"

    def __init__(self, seed: Optional[int] = None) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def keys(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Any]:
        return [self._rng.random() for _ in candidates]

    def reason(self, job: JobSpec, chosen: Candidate) -> str:
        return "drawn at random" if self.seed is None else f"drawn at random (seed {self.seed})"


class FastestQueueBroker(KeyedBroker):
    """Fewest waiting jobs per slot first; among queues with none waiting, most free slots first."""

    name = "FastestQueue"

    @staticmethod
    def key(candidate: Candidate) -> Tuple[int, Fraction, int]:
        from fractions import Fraction  # only when this broker ranks (start-up stays lean)

        waiting, total = candidate.waiting, candidate.total_slots
        if waiting is None or not total:
            return (1, Fraction(0), 0)
        if waiting == 0:
            return (0, Fraction(0), -(candidate.free_slots or 0))
        return (0, Fraction(waiting, total), 0)

    def keys(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Any]:
        return [self.key(c) for c in candidates]

    def reason(self, job: JobSpec, chosen: Candidate) -> str:
        if chosen.waiting is None or not chosen.total_slots:
            return f"no load figures for {chosen.label} (such queues rank last)"
        text = f"{chosen.waiting} waiting of {chosen.total_slots} slots"
        if chosen.waiting == 0 and chosen.free_slots is not None:
            text += f", {chosen.free_slots} free"
        return text


class BenchmarkBroker(KeyedBroker):
    """Highest benchmark figure first (the queue's ``benchmark.NAME`` attribute)."""

    name = "Benchmark"

    def __init__(self, benchmark: str = DEFAULT_BENCHMARK) -> None:
        self.benchmark = benchmark.lower()

    def keys(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Any]:
        out = []
        for candidate in candidates:
            figure = candidate.benchmarks.get(self.benchmark)
            out.append((1, 0.0) if figure is None else (0, -figure))
        return out

    def reason(self, job: JobSpec, chosen: Candidate) -> str:
        figure = chosen.benchmarks.get(self.benchmark)
        if figure is None:
            return f"no {self.benchmark} figure for {chosen.label} (such queues rank last)"
        return f"{self.benchmark} {figure:g}"


class UserBroker(Broker):
    """A broker written by a user: a class named ``module:Class`` (see :func:`make_broker`).

    The class is instantiated once, with the text after a second colon if there is one
    (``module:Class:ARGUMENT``), else with no argument.  It offers one of two interfaces:

    ``rank(job, candidates)``
        returns the candidates ranked, best first: the same :class:`Candidate` objects, each
        once.
    ``lessthan(a, b)``
        pairwise, as the Python broker of the multi-scheduler client library: True when
        candidate ``a`` should be tried before ``b``.  If the class also has ``set(job)``, it
        is called first with the job being placed.

    ``rank`` is used when both exist.  An optional ``reason(job, candidate)`` says why the
    first came first (shown in the job's ``brokerReason``).  ``job`` is the
    :class:`~proxy_agent.service.jobs.JobSpec`.  The broker runs in a thread of the agent and
    must answer within :data:`USER_BROKER_TIMEOUT` seconds; one that does not is not called
    again until the agent restarts.  One that raises, or returns anything but a ranking of
    the candidates it was given, fails the submission with a message saying so.
    """

    def __init__(self, name: str, instance: Any, timeout: float = USER_BROKER_TIMEOUT) -> None:
        self.name = name
        self.instance = instance
        self.timeout = timeout
        self.broken: Optional[str] = None
        if callable(getattr(instance, "rank", None)):
            self.interface = "rank"
        elif callable(getattr(instance, "lessthan", None)):
            self.interface = "lessthan"
        else:
            raise BrokerError(
                f"broker {name}: the class has neither rank(job, candidates) nor lessthan(a, b)",
                ErrorKind.BAD_REQUEST,
            )

    def choose(self, job: JobSpec, candidates: Sequence[Candidate]) -> Tuple[List[Candidate], str]:
        if self.broken is not None:
            raise BrokerError(f"broker {self.name} {self.broken}; it is not used until the agent restarts")
        given = list(candidates)
        outcome = _run_bounded(lambda: self._decide(job, given), self.timeout)
        if outcome is _TIMED_OUT:
            self.broken = f"did not answer within {self.timeout:g} s"
            raise BrokerError(f"broker {self.name} {self.broken}")
        ok, value = outcome
        if not ok:
            raise BrokerError(f"broker {self.name} failed: {describe_failure(value)}")
        ranked, reason = value
        return ranked, f"{self.name}: {reason}"

    def rank(self, job: JobSpec, candidates: Sequence[Candidate]) -> List[Candidate]:
        return self.choose(job, candidates)[0]

    def _decide(self, job: JobSpec, given: List[Candidate]) -> Tuple[List[Candidate], str]:
        """Runs in the broker's thread: the ranking, checked, and the reason for its first."""
        instance = self.instance
        if self.interface == "rank":
            result = instance.rank(job, list(given))
            ranked = _check_ranking(self.name, given, result)
        else:
            setter = getattr(instance, "set", None)
            if callable(setter):
                setter(job)

            def compare(a: Candidate, b: Candidate) -> int:
                if _truth(self.name, instance.lessthan(a, b)):
                    return -1
                if _truth(self.name, instance.lessthan(b, a)):
                    return 1
                return 0

            ranked = sorted(given, key=functools.cmp_to_key(compare))
        explain = getattr(instance, "reason", None)
        reason = "ranked first"
        if callable(explain):
            text = explain(job, ranked[0])
            if not isinstance(text, str):
                raise BrokerError(f"reason() returned {type(text).__name__}, not text")
            reason = _one_line(text) or reason
        return ranked, reason


def _truth(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise BrokerError(f"lessthan() must return True or False, got {type(value).__name__} {value!r:.60}")


def _check_ranking(name: str, given: List[Candidate], result: Any) -> List[Candidate]:
    """``result`` as a list if it is a permutation of ``given``; BrokerError saying what is
    wrong otherwise."""
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise BrokerError(f"rank() returned {type(result).__name__}, not a list of the candidates")
    ranked = list(result)
    expected = {id(c): c for c in given}
    seen: Set[int] = set()
    for item in ranked:
        if id(item) not in expected:
            what = f"{item.label} (not one it was given)" if isinstance(item, Candidate) else f"{item!r:.60}"
            raise BrokerError(f"rank() returned {what}; it must return the candidates it was given")
        if id(item) in seen:
            raise BrokerError(f"rank() returned {item.label} twice")
        seen.add(id(item))
    if len(ranked) != len(given):
        missing = ", ".join(c.label for c in given if id(c) not in seen)
        raise BrokerError(f"rank() left out {missing}; it must return every candidate it was given")
    return ranked


def _one_line(text: str) -> str:
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return cleaned[:_REASON_LIMIT]


def describe_failure(exc: BaseException) -> str:
    """What went wrong in a broker, in one line."""
    if isinstance(exc, BrokerError):
        return exc.message
    text = _one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_TIMED_OUT = object()


def _run_bounded(function: Callable[[], Any], timeout: float) -> Any:
    """Run user code in a thread of its own: (True, value), (False, exception), or
    :data:`_TIMED_OUT` (the thread is left to finish on its own)."""
    box: List[Any] = []

    def run() -> None:
        try:
            box.append((True, function()))
        except BaseException as exc:  # noqa: BLE001 - even SystemExit from a broker is its failure
            box.append((False, exc))

    thread = threading.Thread(target=run, name="proxy-agent broker", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or not box:
        return _TIMED_OUT
    return box[0]


# --------------------------------------------------------------------------- naming brokers

#: The built-in brokers' classes by their names in lower case (names match without regard to
#: case), from the one list of them, :data:`.broker_names.BUILT_IN_BROKERS`.
_BUILT_IN: Dict[str, type] = {name.lower(): globals()[entry.class_name] for name, entry in BUILT_IN_BROKERS.items()}


def built_in_class(name: str) -> Optional[type]:
    """The class of the built-in broker called ``name`` (any case; an argument after ``:`` is
    ignored), or None when no built-in broker has that name."""
    return _BUILT_IN.get(name.partition(":")[0].lower())


def make_broker(text: str) -> Broker:
    """The broker a name gives (see the module documentation); BrokerError (BAD_REQUEST)
    naming the problem.  A user broker's module is imported here."""
    name = text.strip()
    if not name:
        raise BrokerError("empty broker name", ErrorKind.BAD_REQUEST)
    head, sep, argument = name.partition(":")
    cls = _BUILT_IN.get(head.lower())
    if cls is not None:
        if cls is RandomBroker:
            if not sep:
                return RandomBroker()
            try:
                return RandomBroker(int(argument))
            except ValueError:
                raise BrokerError(f"broker {name!r}: the seed must be a whole number", ErrorKind.BAD_REQUEST) from None
        if cls is BenchmarkBroker:
            benchmark = argument.strip() if sep else DEFAULT_BENCHMARK
            if not benchmark or not _is_word(benchmark):
                raise BrokerError(f"broker {name!r}: name a benchmark, e.g. Benchmark:{DEFAULT_BENCHMARK}",
                                  ErrorKind.BAD_REQUEST)
            return BenchmarkBroker(benchmark)
        if sep:
            raise BrokerError(f"broker {name!r}: {cls.name} takes no argument", ErrorKind.BAD_REQUEST)
        return cls()
    if not sep:
        raise BrokerError(
            f"unknown broker {name!r}; brokers are {', '.join(BUILT_IN_BROKERS)}, or module:Class for your own",
            ErrorKind.BAD_REQUEST,
        )
    return _load_user_broker(name)


def _is_word(text: str) -> bool:
    return all(ch.isalnum() or ch in "_-." for ch in text)


def _load_user_broker(name: str) -> UserBroker:
    module_name, _, rest = name.partition(":")
    class_name, sep, argument = rest.partition(":")
    if not module_name or not class_name.isidentifier():
        raise BrokerError(f"broker {name!r}: expected module:Class or module:Class:ARGUMENT", ErrorKind.BAD_REQUEST)
    # What the user's code prints goes to stderr: before the agent has set its standard
    # output aside, that still is the protocol's channel.
    try:
        with contextlib.redirect_stdout(sys.stderr):
            module = _import(module_name)
    except BrokerError:
        raise
    except BaseException as exc:  # noqa: BLE001 - a module that fails to import is the user's error
        raise BrokerError(f"broker {name!r}: cannot import {module_name}: {describe_failure(exc)}",
                          ErrorKind.BAD_REQUEST) from None
    cls = getattr(module, class_name, None)
    if not callable(cls):
        raise BrokerError(f"broker {name!r}: {module_name} has no class {class_name}", ErrorKind.BAD_REQUEST)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            instance = cls(argument) if sep else cls()
    except BaseException as exc:  # noqa: BLE001
        raise BrokerError(f"broker {name!r}: creating {class_name} failed: {describe_failure(exc)}",
                          ErrorKind.BAD_REQUEST) from None
    return UserBroker(name, instance)


def _import(module_name: str):
    """A module by dotted name, or from a ``.py`` file's path."""
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            raise BrokerError(f"broker module {module_name}: no such file", ErrorKind.BAD_REQUEST)
        unique = "proxy_agent_user_broker_" + hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(unique, path)
        if spec is None or spec.loader is None:
            raise BrokerError(f"broker module {module_name}: cannot be loaded", ErrorKind.BAD_REQUEST)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(module_name)


# --------------------------------------------------------------------------- benchmark figures


def load_benchmarks(path: str) -> Dict[str, Dict[str, float]]:
    """Benchmark figures from an INI file: one section per queue, named ``[BACKEND:QUEUE]``,
    one ``BENCHMARK = FIGURE`` line per benchmark (figures are finite numbers, higher is
    faster; names are matched without regard to case).  ValueError naming the file and what
    is wrong in it.

    Example::

        [slurm:long]
        specint2000 = 1850
        specfp2000 = 1620

        [local:default]
        specint2000 = 900
    """
    import configparser  # only when there is a configuration to read

    parser = configparser.ConfigParser(interpolation=None, default_section="\0no defaults\0")
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle, source=path)
    except OSError as exc:
        raise ValueError(f"cannot read the broker configuration {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the broker configuration {path} is not UTF-8 text") from None
    except configparser.Error as exc:
        raise ValueError(f"the broker configuration {path} cannot be read: {' '.join(str(exc).split())}") from None
    figures: Dict[str, Dict[str, float]] = {}
    for section in parser.sections():
        backend, sep, queue = section.strip().rpartition(":")
        if not sep or not backend or not queue:
            raise ValueError(f"{path}: section [{section}] must name a queue as [SCHEDULER:QUEUE]")
        values: Dict[str, float] = {}
        for benchmark, text in parser.items(section):
            if not _is_word(benchmark):
                raise ValueError(f"{path}: [{section}] benchmark name {benchmark!r} has characters other than "
                                 "letters, digits, '_', '-' and '.'")
            figure = _figure(text)
            if figure is None:
                raise ValueError(f"{path}: [{section}] {benchmark} = {text!r} is not a finite number")
            values[benchmark.lower()] = figure
        figures[f"{backend.strip()}:{queue.strip()}"] = values
    return figures
