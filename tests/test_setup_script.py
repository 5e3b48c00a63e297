"""scripts/setup says what it does: one line per step on stderr, pip's progress lines, and
only the venv's python on stdout (scripts/test and scripts/demo read it from there)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from wait_support import scaled

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup"


def test_up_to_date_venv_is_one_line_and_the_path():
    run = subprocess.run([str(SETUP)], capture_output=True, text=True, timeout=scaled(300))
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{ROOT}/.venv/bin/python\n"
    assert run.stderr.splitlines()[-1] == "setup: .venv is up to date"


@pytest.mark.skipif(
    os.environ.get("CI") != "true" and not os.environ.get("PROXY_AGENT_SLOW_TESTS"),
    reason="a fresh venv takes half a minute: runs under CI=true or PROXY_AGENT_SLOW_TESTS=1",
)
def test_first_run_shows_each_step_and_pips_progress(tmp_path):
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "__pycache__", "*.egg-info"))
    run = subprocess.run([str(copy / "scripts" / "setup")], capture_output=True, text=True, timeout=scaled(600), cwd=copy)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{copy}/.venv/bin/python\n"
    lines = run.stderr.splitlines()
    assert lines[0].startswith("setup: creating the virtual environment .venv with ")
    assert any(line.startswith("setup: installing the project") for line in lines)
    assert any(line.startswith("  Collecting ") or line.startswith("  Processing ") for line in lines)
    assert any(line.startswith("  Successfully installed ") for line in lines)
    assert lines[-1].startswith("setup: installed in ")
    assert not any("is ignored" in line for line in lines)
