"""The built-in brokers' names: the one list of them, light to load.

Whatever shows the brokers' names reads them here: the ``--broker`` help, shell completion, the
console's and the submission attribute's descriptions, and the broker maker of
:mod:`.ranking`, which finds each one's class by the name given here.
"""

from __future__ import annotations

from typing import Dict

import attrs

__all__ = ["BUILT_IN_BROKERS", "BuiltInBroker", "broker_choices"]


@attrs.frozen
class BuiltInBroker:
    """A built-in broker: how its name may go on (``:SEED``) and its class in :mod:`.ranking`."""

    #: what may follow the name, as help texts show it ("" for nothing, ":SEED")
    argument: str
    #: the name of its class in :mod:`.ranking`
    class_name: str


#: The built-in brokers by the name users give: the one list of them.  A new broker is its
#: class in :mod:`.ranking` and a line here; every help text, completion hint and the broker
#: maker take it from this list.
BUILT_IN_BROKERS: Dict[str, BuiltInBroker] = {
    "Null": BuiltInBroker("", "NullBroker"),
    "Random": BuiltInBroker(":SEED", "RandomBroker"),
    "FastestQueue": BuiltInBroker("", "FastestQueueBroker"),
    "Benchmark": BuiltInBroker(":NAME", "BenchmarkBroker"),
}


def broker_choices(*, arguments: bool = False, last: str = ", ") -> str:
    """The brokers one may name, for a help text: ``Null, Random, ..., module:Class``
    (``Random[:SEED]`` with ``arguments``; ``last`` goes before ``module:Class``)."""
    names = [name + (f"[{entry.argument}]" if arguments and entry.argument else "")
             for name, entry in BUILT_IN_BROKERS.items()]
    return ", ".join(names) + last + "module:Class"
