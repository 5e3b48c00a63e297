"""Finding the SLURM cluster the SLURM tests run against, and saying why they cannot run.

The tests need the one-node cluster of ``scripts/slurm-up`` (partitions ``debug`` and
``long``) and root (they drain the node and suspend jobs). ``SLURM_CONF`` is taken from the
environment or else from the cluster's state directory (``PROXY_AGENT_SLURM_DIR``, default
``/tmp/proxy-agent-slurm``) and then put into ``os.environ``, so agents the tests spawn
inherit it.

Outside CI a missing cluster skips the tests with the reason. In CI (``CI`` set to
``true``/``1``) they must run: the cluster is started with ``scripts/slurm-up`` if it is not
up, and if it still cannot be used the module fails loudly instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("PROXY_AGENT_SLURM_DIR", "/tmp/proxy-agent-slurm"))
COMMANDS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")
PARTITIONS = ("debug", "long")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def slurm_conf() -> Optional[str]:
    """The slurm.conf to use: ``$SLURM_CONF`` if it exists, else the state directory's."""
    given = os.environ.get("SLURM_CONF")
    if given and os.path.isfile(given):
        return given
    candidate = STATE_DIR / "slurm.conf"
    return str(candidate) if candidate.is_file() else None


def _run(argv: List[str], conf: str, timeout: float = 15) -> subprocess.CompletedProcess:
    env = dict(os.environ, SLURM_CONF=conf)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


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
    return None


def _start_cluster() -> str:
    script = ROOT / "scripts" / "slurm-up"
    try:
        result = subprocess.run([str(script)], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "scripts/slurm-up did not finish within 600 s"
    return (result.stdout + result.stderr).strip()[-2000:]


def require_cluster() -> str:
    """Call at import time of a SLURM test module: returns SLURM_CONF (also put in
    ``os.environ``), or skips the module (outside CI) / fails it loudly (in CI)."""
    reason = skip_reason()
    if reason is not None and in_ci() and os.geteuid() == 0:
        output = _start_cluster()
        reason = skip_reason()
        if reason is not None:
            reason += f"\nscripts/slurm-up said:\n{output}"
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI must run the SLURM tests, but: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    conf = slurm_conf()
    assert conf is not None
    os.environ["SLURM_CONF"] = conf
    return conf


def node_name() -> str:
    """The cluster's (first) node."""
    result = _run(["sinfo", "--noheader", "--Node", "--format=%N"], os.environ["SLURM_CONF"])
    return result.stdout.split()[0]


def scontrol(*args: str) -> subprocess.CompletedProcess:
    return _run(["scontrol", *args], os.environ["SLURM_CONF"])
