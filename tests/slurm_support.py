"""The SLURM cluster the SLURM tests run against, and why they cannot run.

The tests need the one-node cluster of ``scripts/slurm-up`` (partitions ``debug`` and
``long``, the reservation ``proxy-agent-tests``) and root (they drain the node and suspend
jobs). They run when ``PROXY_AGENT_TEST_CLUSTERS`` asks for them (see ``cluster_support``);
then an unusable cluster fails them, with the reason. ``SLURM_CONF`` is taken from the
environment or else from the cluster's state directory (``PROXY_AGENT_SLURM_DIR``, default
``/tmp/proxy-agent-slurm``) and then put into ``os.environ``, so agents the tests spawn
inherit it.

Other users may keep the cluster busy: every job the tests submit goes into the reservation
that ``scripts/slurm-up`` keeps for root (``SBATCH_RESERVATION``, also put into
``os.environ``), so it never waits behind theirs. A job the tests submit as another user
leaves it out (:func:`other_user_env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from functools import lru_cache
from typing import Dict, List, Optional

import cluster_support
from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("PROXY_AGENT_SLURM_DIR", "/tmp/proxy-agent-slurm"))
COMMANDS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")
PARTITIONS = ("debug", "long")
RESERVATION = "proxy-agent-tests"
RESERVATION_VARIABLES = ("SBATCH_RESERVATION", "SALLOC_RESERVATION", "SLURM_RESERVATION")


def slurm_conf() -> Optional[str]:
    """The slurm.conf to use: ``$SLURM_CONF`` if it exists, else the state directory's."""
    given = os.environ.get("SLURM_CONF")
    if given and os.path.isfile(given):
        return given
    candidate = STATE_DIR / "slurm.conf"
    return str(candidate) if candidate.is_file() else None


def _run(argv: List[str], conf: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ, SLURM_CONF=conf)
    return subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout), env=env,
                          stdin=subprocess.DEVNULL)


@lru_cache(maxsize=None)
def skip_reason() -> Optional[str]:
    """Why the SLURM tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "the SLURM tests need root (they drain the node and suspend jobs)"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"SLURM commands not installed ({', '.join(missing)}); run scripts/slurm-up"
    conf = slurm_conf()
    if conf is None:
        return f"no SLURM cluster: no $SLURM_CONF and no {STATE_DIR}/slurm.conf; run scripts/slurm-up"
    try:
        result = _run(["sinfo", "--noheader", "--format=%R %a"], conf)
    except subprocess.TimeoutExpired:
        return f"no SLURM cluster answers (sinfo with SLURM_CONF={conf} timed out); run scripts/slurm-up"
    if result.returncode != 0:
        return f"no SLURM cluster answers (SLURM_CONF={conf}): {result.stderr.strip()[:300]}; run scripts/slurm-up"
    up = {line.split()[0] for line in result.stdout.splitlines() if line.split()[1:] == ["up"]}
    missing_parts = [p for p in PARTITIONS if p not in up]
    if missing_parts:
        return (f"the SLURM cluster at {conf} lacks up partitions {', '.join(missing_parts)} "
                "(scripts/slurm-up makes debug and long)")
    shown = _run(["scontrol", "--oneliner", "show", "reservation", RESERVATION], conf)
    fields = dict(word.split("=", 1) for word in shown.stdout.split() if "=" in word)
    if shown.returncode != 0 or fields.get("State") != "ACTIVE" or "root" not in fields.get("Users", "").split(","):
        return (f"the SLURM cluster at {conf} has no active reservation {RESERVATION} for root, the tests' room "
                "on a busy cluster; run scripts/slurm-up")
    return None


def require_cluster() -> str:
    """Call at import time of a SLURM test module (or in a fixture): returns SLURM_CONF, or
    skips the module when the SLURM tests are off and fails it when they are on but the
    cluster is not usable.  SLURM_CONF and the reservation go into ``os.environ``."""
    cluster_support.require("slurm", skip_reason)
    conf = slurm_conf()
    assert conf is not None
    os.environ["SLURM_CONF"] = conf
    for name in RESERVATION_VARIABLES:
        os.environ[name] = RESERVATION
    return conf


def other_user_env(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` for submitting a job as another user (``sbatch --uid``): the tests' reservation
    is root's, so it is left out."""
    return {key: value for key, value in env.items() if key not in RESERVATION_VARIABLES}


def node_name() -> str:
    """The cluster's (first) node."""
    result = _run(["sinfo", "--noheader", "--Node", "--format=%N"], os.environ["SLURM_CONF"])
    return result.stdout.split()[0]


def scontrol(*args: str) -> subprocess.CompletedProcess:
    return _run(["scontrol", *args], os.environ["SLURM_CONF"])
