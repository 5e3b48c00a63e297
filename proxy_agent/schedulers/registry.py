"""The registry of backends: each scheduler's name and where its backend class lives.

A new scheduler is one line here (its class is imported only when it is asked for, so an
agent that runs none of the batch systems loads none of them).  The interface the classes
implement is :class:`proxy_agent.service.backend.Backend`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Type

if TYPE_CHECKING:  # pragma: no cover
    from ..service.backend import Backend

__all__ = [
    "BACKENDS",
    "backend_class",
]


#: Backends that work, by name: what ``--scheduler`` offers.
BACKENDS: Dict[str, str] = {
    "local": "proxy_agent.schedulers.local:LocalBackend",
    "sim": "proxy_agent.schedulers.sim:SimBackend",
    "slurm": "proxy_agent.schedulers.batch.slurm.backend:SlurmBackend",
    "sge": "proxy_agent.schedulers.batch.sge.backend:SgeBackend",
    "pbs": "proxy_agent.schedulers.batch.pbs.backend:PbsBackend",
}


def backend_class(name: str) -> Type[Backend]:
    """Import and return the backend registered under ``name``."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(BACKENDS)}") from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
