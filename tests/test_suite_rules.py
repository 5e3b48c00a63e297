"""The rules every run of the test suite keeps, checked on small runs of their own.

Each check runs pytest in a child process on a test file written for it, with this suite's
conftest (so with its hooks: the cluster setting, the run's area, the check for what a run
leaves behind), and looks at how that run ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_fixtures import ROOT, subprocess_env
from cluster_support import CLUSTERS_VARIABLE
from leftover_support import RUN_VARIABLE, TEST_VARIABLE
from wait_support import SCALE_VARIABLE, scaled, wait_until_blocking

TESTS = Path(__file__).resolve().parent


def run_suite(tmp_path: Path, test_text: str, **env: str) -> subprocess.CompletedProcess:
    """pytest on ``test_text`` (one test module) with this suite's conftest and settings."""
    inner = tmp_path / "inner"
    inner.mkdir(parents=True)
    (inner / "conftest.py").write_text(textwrap.dedent(f"""\
        import importlib.util, sys
        sys.path.insert(0, {str(TESTS)!r})
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        globals().update((name, value) for name, value in vars(suite).items() if name.startswith("pytest_"))
        """))
    (inner / "test_inner.py").write_text(textwrap.dedent(test_text))
    child_env = subprocess_env(**env)
    # a run of its own: not this one's area, nor the test this one is in
    for name in (RUN_VARIABLE, TEST_VARIABLE, "TMPDIR"):
        child_env.pop(name, None)
    child_env["TMPDIR"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--rootdir", str(inner),
         "-c", str(ROOT / "pyproject.toml"), str(inner)],
        capture_output=True, text=True, cwd=str(inner), env=child_env, timeout=scaled(120), stdin=subprocess.DEVNULL,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_run_that_leaves_a_process_behind_fails_names_it_and_ends_it(tmp_path):
    pidfile = tmp_path / "pid"
    run = run_suite(tmp_path, f"""
        import subprocess

        def test_starts_a_process_and_forgets_it():
            process = subprocess.Popen(["sleep", "600"])
            open({str(pidfile)!r}, "w").write(str(process.pid))
        """, **{SCALE_VARIABLE: "0.1"})  # (the run waits a while for its processes to end)
    pid = int(pidfile.read_text())
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed" in run.stdout and "left behind by this run" in run.stdout
    assert f"process {pid}: sleep 600 (started by test_inner.py::test_starts_a_process_and_forgets_it)" in run.stdout
    wait_until_blocking(lambda: not _alive(pid), what="the process to be ended")


def test_a_cluster_daemon_a_test_restarted_is_the_clusters_not_a_leftover(tmp_path):
    daemon = tmp_path / "sge_qmaster"  # named like one: what a test restarting the master leaves running
    shutil.copy("/bin/sleep", daemon)
    pidfile = tmp_path / "pid"
    run = run_suite(tmp_path, f"""
        import subprocess

        def test_restarts_a_daemon():
            process = subprocess.Popen([{str(daemon)!r}, "600"], start_new_session=True)
            open({str(pidfile)!r}, "w").write(str(process.pid))
        """, **{SCALE_VARIABLE: "0.1"})
    pid = int(pidfile.read_text())
    try:
        assert run.returncode == 0 and "left behind" not in run.stdout, run.stdout + run.stderr
        assert _alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_run_keeps_its_files_in_an_area_it_removes(tmp_path):
    seen = tmp_path / "seen"
    run = run_suite(tmp_path, f"""
        import os, tempfile
        from agent_fixtures import subprocess_env

        def test_makes_files(tmp_path):
            env = subprocess_env()
            area = os.environ["{RUN_VARIABLE}"]
            kept = tempfile.mkdtemp()  # never removed by the test
            open({str(seen)!r}, "w").write("\\n".join([area, str(tmp_path), kept, env["XDG_STATE_HOME"], env["HOME"]]))
        """)
    assert run.returncode == 0, run.stdout + run.stderr
    area, *inside = seen.read_text().splitlines()
    assert all(path.startswith(area + "/") for path in inside), (area, inside)
    assert not os.path.exists(area)
    assert "left behind" not in run.stdout


def test_cluster_tests_run_only_when_asked_for_and_then_never_skip(tmp_path):
    # A cluster that seems to be there is not used unless asked for.
    test = """
        import pytest

        @pytest.mark.slurm
        def test_on_slurm():
            pass
        """
    empty = tmp_path / "no-cluster"
    empty.mkdir()
    off = run_suite(tmp_path / "off", test, **{CLUSTERS_VARIABLE: ""})
    assert off.returncode == 0 and "1 skipped" in off.stdout, off.stdout
    assert "SLURM tests are off: set PROXY_AGENT_TEST_CLUSTERS=all (or slurm)" in off.stdout
    # Asked for and not there: the test fails with the reason, it does not skip.
    missing = run_suite(tmp_path / "missing", test, **{CLUSTERS_VARIABLE: "slurm", "SLURM_CONF": str(empty / "slurm.conf"),
                                                       "PROXY_AGENT_SLURM_DIR": str(empty)})
    assert missing.returncode == 1 and "skipped" not in missing.stdout, missing.stdout
    assert "PROXY_AGENT_TEST_CLUSTERS asks for the SLURM tests, but" in missing.stdout
    # A setting that names no known cluster is a usage error.
    wrong = run_suite(tmp_path / "wrong", test, **{CLUSTERS_VARIABLE: "pbs"})
    assert wrong.returncode == 4 and "unknown pbs" in wrong.stderr


@pytest.mark.slurm
def test_a_run_that_leaves_a_slurm_job_behind_fails_and_cancels_it(tmp_path):
    from slurm_support import require_cluster

    conf = require_cluster()
    idfile = tmp_path / "job"
    run = run_suite(tmp_path, f"""
        import subprocess

        def test_submits_and_forgets():
            done = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "pa-left-behind", "-o", "/dev/null",
                                   "--wrap", "true"], capture_output=True, text=True, check=True)
            open({str(idfile)!r}, "w").write(done.stdout.strip().split(";")[0])
        """, **{CLUSTERS_VARIABLE: "slurm", "SLURM_CONF": conf})
    job = idfile.read_text()
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"SLURM job {job}: PENDING, user root, name 'pa-left-behind'" in run.stdout
    shown = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%T", "--jobs", job], capture_output=True,
                           text=True, env=subprocess_env(), timeout=scaled(30))
    assert shown.stdout.strip() in ("", "CANCELLED")


@pytest.mark.sge
def test_a_run_that_leaves_a_grid_engine_job_behind_fails_and_deletes_it(tmp_path):
    import sge_support

    sge_support.require_cell()
    idfile = tmp_path / "job"
    run = run_suite(tmp_path, f"""
        import subprocess

        def test_submits_and_forgets():
            done = subprocess.run(["qsub", "-terse", "-h", "-N", "pa-left-behind", "-o", "/dev/null", "-e", "/dev/null"],
                                  input="#!/bin/sh\\ntrue\\n", capture_output=True, text=True, check=True, cwd="/")
            open({str(idfile)!r}, "w").write(done.stdout.strip())
        """, **{CLUSTERS_VARIABLE: "sge"})
    job = idfile.read_text()
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"Grid Engine job {job}: hqw, user root, name 'pa-left-behind'" in run.stdout
    wait_until_blocking(lambda: sge_support.run(["qstat", "-j", job]).returncode != 0, what=f"job {job} to be deleted")
