"""The single-file agent for tests: built once by scripts/build-pyz and kept while the sources
it holds are unchanged (under build/test-pyz/, keyed by a hash of them).

Import from test modules (``from pyz_support import built_pyz, clean_env``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent
BUILD_PYZ = ROOT / "scripts" / "build-pyz"
#: The interpreter the tests run the file with: the real one behind the venv, so that
#: nothing installed in the venv can help the file along.
SYSTEM_PYTHON = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)

_built: Dict[str, Path] = {}


def _sources_hash() -> str:
    digest = hashlib.sha256()
    files = sorted((ROOT / "proxy_agent").rglob("*.py")) + [ROOT / "pyproject.toml", BUILD_PYZ]
    for path in files:
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def built_pyz() -> Path:
    """The path of an up-to-date proxy-agent.pyz (built now if needed)."""
    key = _sources_hash()
    if key in _built:
        return _built[key]
    target = ROOT / "build" / "test-pyz" / key / "proxy-agent.pyz"
    if not target.exists():
        result = subprocess.run(
            [sys.executable, str(BUILD_PYZ), "--output", str(target)],
            capture_output=True, text=True, timeout=scaled(600),
        )
        if result.returncode != 0:
            # No package index reachable: bundle this environment's packages instead.
            result = subprocess.run(
                [sys.executable, str(BUILD_PYZ), "--offline", "--output", str(target)],
                capture_output=True, text=True, timeout=scaled(600),
            )
        assert result.returncode == 0, f"scripts/build-pyz failed:\n{result.stderr}"
        stale = [p for p in target.parent.parent.iterdir() if p.name != key]
        for old in stale:
            shutil.rmtree(old, ignore_errors=True)
    _built[key] = target
    return target


def clean_env(home: Path, path: Optional[str] = None, **extra: str) -> Dict[str, str]:
    """An environment as a fresh login would have: no PYTHONPATH, no venv, a plain PATH."""
    env = {
        "PATH": path if path is not None else "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


def copy_pyz(directory: Path) -> Path:
    """A copy of the file in ``directory``, as a user would have it after copying it there."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / "proxy-agent.pyz"
    shutil.copy2(built_pyz(), copy)
    return copy
