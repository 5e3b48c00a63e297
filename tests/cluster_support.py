"""Whether the tests that need a test cluster run: one setting decides.

The SLURM, Grid Engine and ssh tests (markers ``slurm``, ``sge``, ``ssh``) need the daemons
of ``scripts/slurm-up``, ``scripts/sge-up`` and ``scripts/sshd-up`` and root.  They run when
the environment variable ``PROXY_AGENT_TEST_CLUSTERS`` names them::

    PROXY_AGENT_TEST_CLUSTERS=all scripts/test          # slurm, sge and ssh
    PROXY_AGENT_TEST_CLUSTERS=slurm,ssh scripts/test    # some of them

and are skipped, saying so, when it does not (unset, empty or ``none``): a cluster that
happens to be running is not used unless asked for.  A cluster that is asked for must be
usable: if it is not, its tests fail with the reason (they never skip), so that a run that
was meant to test against the clusters cannot pass without doing so.  ``.ci/run`` sets
``all`` under CI and brings the clusters up first.
"""

from __future__ import annotations

import os
from typing import Callable, FrozenSet, Optional

import pytest

CLUSTERS_VARIABLE = "PROXY_AGENT_TEST_CLUSTERS"
KINDS = ("slurm", "sge", "ssh")
WHAT = {"slurm": "SLURM", "sge": "Grid Engine", "ssh": "ssh"}


def wanted() -> FrozenSet[str]:
    """The clusters the run is to test against."""
    text = os.environ.get(CLUSTERS_VARIABLE, "").strip().lower()
    if text in ("", "none", "0", "no"):
        return frozenset()
    names = {name.strip() for name in text.split(",") if name.strip()}
    if "all" in names:
        return frozenset(KINDS)
    unknown = sorted(names - set(KINDS))
    if unknown:
        raise ValueError(f"{CLUSTERS_VARIABLE}: unknown {', '.join(unknown)} (give all, none or some of "
                         f"{', '.join(KINDS)})")
    return frozenset(names)


def off_reason(kind: str) -> str:
    return (f"{WHAT[kind]} tests are off: set {CLUSTERS_VARIABLE}=all (or {kind}) to run them "
            f"against scripts/{'sshd' if kind == 'ssh' else kind}-up")


def require(kind: str, unusable: Callable[[], Optional[str]]) -> None:
    """For a test module (at import) or fixture needing ``kind``: skip when its tests are off;
    when they are on, fail with the reason ``unusable()`` gives, if any."""
    if kind not in wanted():
        pytest.skip(off_reason(kind), allow_module_level=True)
    reason = unusable()
    if reason is not None:
        pytest.fail(f"{CLUSTERS_VARIABLE} asks for the {WHAT[kind]} tests, but {reason}", pytrace=False)
