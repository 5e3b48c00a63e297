"""Brokers: which of several queues a job goes to (see :mod:`.ranking` for each broker).

The names users and their brokers import: the brokers and what they rank (:mod:`.ranking`,
loaded with the first brokered submission) and the service's part of brokering
(:mod:`.brokering`, loaded as the service starts), and the built-in brokers' names
(:mod:`.broker_names`).  A user broker subclasses
:class:`Broker` from here.
"""

from __future__ import annotations

from .broker_names import BUILT_IN_BROKERS, BuiltInBroker, broker_choices
from .brokering import ATTRIBUTES, JOB_BROKER, JOB_BROKER_QUEUE, JOB_BROKER_REASON, Brokering, Decision, Placement
from .ranking import (DEFAULT_BENCHMARK, BenchmarkBroker, Broker, BrokerError, Candidate, FastestQueueBroker, KeyedBroker,
                      NullBroker, RandomBroker, UserBroker, built_in_class, exclusion, load_benchmarks, make_broker)

__all__ = [
    "ATTRIBUTES",
    "BUILT_IN_BROKERS",
    "BenchmarkBroker",
    "Broker",
    "BrokerError",
    "Brokering",
    "BuiltInBroker",
    "Candidate",
    "DEFAULT_BENCHMARK",
    "Decision",
    "FastestQueueBroker",
    "JOB_BROKER",
    "JOB_BROKER_QUEUE",
    "JOB_BROKER_REASON",
    "KeyedBroker",
    "NullBroker",
    "Placement",
    "RandomBroker",
    "UserBroker",
    "broker_choices",
    "built_in_class",
    "exclusion",
    "load_benchmarks",
    "make_broker",
]
