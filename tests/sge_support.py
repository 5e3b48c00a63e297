"""Finding the Grid Engine cell the Grid Engine tests run against, and saying why they cannot run.

The tests need the one-node cell of ``scripts/sge-up`` (queues ``all.q`` and ``short.q``,
parallel environment ``smp``, resources gpu/exclusive/ssd, root allowed to submit) and root
(they submit as root and, through ``runuser``, as the cell's second user).  ``SGE_ROOT`` and
``SGE_CELL`` are taken from the environment or else Debian's ``/var/lib/gridengine`` and
``default``, and put into ``os.environ`` so that commands the tests run inherit them.

Outside CI a missing cell skips the tests with the reason.  In CI (``CI`` set to
``true``/``1``) they must run: the cell is started with ``scripts/sge-up`` if it does not
answer, and if it still cannot be used the module fails loudly instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("qsub", "qstat", "qhost", "qacct", "qdel", "qhold", "qrls", "qmod", "qalter", "qconf")
QUEUES = ("all.q", "short.q")
OTHER_USER = "sgeuser"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def cell_env() -> dict:
    root = os.environ.get("SGE_ROOT") or "/var/lib/gridengine"
    cell = os.environ.get("SGE_CELL") or "default"
    return {"SGE_ROOT": root, "SGE_CELL": cell}


def run(argv: List[str], timeout: float = 30, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **cell_env())
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


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
        result = run(["qstat", "-f", "-xml"], timeout=15)
    except subprocess.TimeoutExpired:
        return "the Grid Engine master does not answer (qstat -f timed out); run scripts/sge-up"
    if result.returncode != 0:
        return f"the Grid Engine master does not answer: {result.stderr.strip()[:300]}; run scripts/sge-up"
    missing_queues = [q for q in QUEUES if f"<name>{q}@" not in result.stdout]
    if missing_queues:
        return f"the cell lacks queues {', '.join(missing_queues)} (scripts/sge-up makes all.q and short.q)"
    if run(["qconf", "-sp", "smp"], timeout=15).returncode != 0:
        return "the cell lacks the parallel environment smp (scripts/sge-up makes it)"
    return None


def _start_cell() -> str:
    try:
        result = subprocess.run([str(ROOT / "scripts" / "sge-up")], capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "scripts/sge-up did not finish within 600 s"
    return (result.stdout + result.stderr).strip()[-2000:]


def require_cell() -> dict:
    """Call at import time of a Grid Engine test module: returns SGE_ROOT/SGE_CELL (also put
    in ``os.environ``), or skips the module (outside CI) / fails it loudly (in CI)."""
    reason = skip_reason()
    if reason is not None and in_ci() and os.geteuid() == 0:
        output = _start_cell()
        reason = skip_reason()
        if reason is not None:
            reason += f"\nscripts/sge-up said:\n{output}"
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI must run the Grid Engine tests, but: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
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
