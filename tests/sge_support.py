"""The Grid Engine cell the Grid Engine tests run against, and why they cannot run.

The tests need the one-node cell of ``scripts/sge-up`` (queues ``all.q`` and ``short.q``,
parallel environment ``smp``, resources gpu/exclusive/ssd, root allowed to submit, the
resource quota set that keeps room in both queues for root's jobs) and root (they submit as
root and, through ``runuser``, as the cell's second user).  They run when
``PROXY_AGENT_TEST_CLUSTERS`` asks for them (see ``cluster_support``); then an unusable cell
fails them, with the reason.  ``SGE_ROOT`` and ``SGE_CELL`` are taken from the environment
or else Debian's ``/var/lib/gridengine`` and ``default``, and put into ``os.environ`` so that
commands the tests run inherit them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from functools import lru_cache
from typing import List, Optional

import cluster_support
from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("qsub", "qstat", "qhost", "qacct", "qdel", "qhold", "qrls", "qmod", "qalter", "qconf")
QUEUES = ("all.q", "short.q")
ROOM = "proxy_agent_tests_room"
OTHER_USER = "sgeuser"


def cell_env() -> dict:
    root = os.environ.get("SGE_ROOT") or "/var/lib/gridengine"
    cell = os.environ.get("SGE_CELL") or "default"
    return {"SGE_ROOT": root, "SGE_CELL": cell}


def run(argv: List[str], timeout: float = 30, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **cell_env())
    return subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout), env=env,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


@lru_cache(maxsize=None)
def skip_reason() -> Optional[str]:
    """Why the Grid Engine tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "the Grid Engine tests need root (they submit as root and as a second user)"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"Grid Engine commands not installed ({', '.join(missing)}); run scripts/sge-up"
    env = cell_env()
    if not os.path.isfile(os.path.join(env["SGE_ROOT"], env["SGE_CELL"], "common", "act_qmaster")):
        return f"no Grid Engine cell at {env['SGE_ROOT']}/{env['SGE_CELL']}; run scripts/sge-up"
    try:
        result = run(["qstat", "-f", "-xml"])
    except subprocess.TimeoutExpired:
        return "the Grid Engine master does not answer (qstat -f timed out); run scripts/sge-up"
    if result.returncode != 0:
        return f"the Grid Engine master does not answer: {result.stderr.strip()[:300]}; run scripts/sge-up"
    missing_queues = [q for q in QUEUES if f"<name>{q}@" not in result.stdout]
    if missing_queues:
        return f"the cell lacks queues {', '.join(missing_queues)} (scripts/sge-up makes all.q and short.q)"
    if run(["qconf", "-sp", "smp"]).returncode != 0:
        return "the cell lacks the parallel environment smp (scripts/sge-up makes it)"
    if not other_user_exists():
        return f"there is no local user {OTHER_USER} for other users' jobs (scripts/sge-up makes one)"
    if run(["qconf", "-srqs", ROOM]).returncode != 0:
        return f"the cell lacks the resource quota set {ROOM}, the tests' room on a busy cell; run scripts/sge-up"
    return None


def require_cell() -> dict:
    """Call at import time of a Grid Engine test module (or in a fixture): returns
    SGE_ROOT/SGE_CELL (also put in ``os.environ``), or skips the module when the Grid Engine
    tests are off and fails it when they are on but the cell is not usable."""
    cluster_support.require("sge", skip_reason)
    env = cell_env()
    os.environ.update(env)
    return env


def other_user_exists() -> bool:
    try:
        import pwd

        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        return False
    return os.path.isdir(entry.pw_dir)
