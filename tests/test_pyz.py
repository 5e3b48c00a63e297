"""The single-file agent (scripts/build-pyz): it runs from anywhere with no installation, runs
the console too, and copes with a python3 that is too old.

The file is built once (tests/pyz_support.py) and run with the system's interpreter from a
temporary directory with a clean environment (no PYTHONPATH, no venv).  Old interpreters are
played by a ``python3`` shim: the real interpreter, told it is 3.6 before the file's launcher
runs.  The launcher's decision itself is a pure function, checked directly.
"""

from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
import zipfile
from pathlib import Path

from proxy_agent.client import AgentClient
from proxy_agent.console import launcher
from pyz_support import SYSTEM_PYTHON, clean_env, copy_pyz
from wait_support import scaled

LAUNCHER_SOURCE = Path(launcher.__file__).read_text(encoding="utf-8")


def run(argv, cwd, env, timeout=scaled(60), input_text=None):
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL,
    )


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def old_python_shim(directory: Path, name: str = "python3", version: str = "(3, 6, 8, 'final', 0)") -> Path:
    """A ``python3`` that reports an old version to the file it runs (the real interpreter underneath)."""
    code = (
        "import runpy, sys; "
        f"sys.version_info = {version}; "
        "sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    return executable(directory / name, f'#!/bin/sh\nexec {SYSTEM_PYTHON} -c "{code}" "$@"\n')


def logging_python(directory: Path, name: str, log: Path) -> Path:
    """The real interpreter under another name, noting each start in ``log``."""
    return executable(directory / name, f'#!/bin/sh\necho "$0 $*" >> {log}\nexec {SYSTEM_PYTHON} "$@"\n')


# --------------------------------------------------------------------------- the launcher, as code


def test_launcher_parses_as_python_3_6_and_imports_only_os_and_sys_first():
    tree = ast.parse(LAUNCHER_SOURCE, feature_version=(3, 6))
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert sorted(alias.name for node in top_level for alias in node.names) == ["os", "sys"]
    # nothing that needs 3.7+ at run time before the check: no f-strings, no annotations
    assert not any(isinstance(node, ast.JoinedStr) for node in ast.walk(tree))
    assert not any(isinstance(node, ast.AnnAssign) for node in ast.walk(tree))
    assert not any(isinstance(node, ast.FunctionDef) and node.returns is not None for node in ast.walk(tree))


def test_plan_runs_when_new_enough_and_prefers_the_newest_candidate():
    found = [("python3.13", "/opt/py/bin/python3.13"), ("python3.9", "/usr/bin/python3.9")]
    assert launcher.plan((3, 11), (3, 9), found) == (launcher.RUN, None)
    assert launcher.plan((3, 9), (3, 9), []) == (launcher.RUN, None)
    assert launcher.plan((3, 6), (3, 9), found) == (launcher.REEXEC, "/opt/py/bin/python3.13")
    assert launcher.plan((3, 6), (3, 9), found[1:]) == (launcher.REEXEC, "/usr/bin/python3.9")


def test_plan_skips_candidates_that_are_too_old_and_explains_in_one_line():
    action, message = launcher.plan((3, 6), (3, 10), [("python3.9", "/usr/bin/python3.9")], executable="/usr/bin/python3")
    assert action == launcher.FAIL
    assert "\n" not in message
    assert message.startswith("proxy-agent needs Python 3.10 or newer; this is Python 3.6 (/usr/bin/python3)")
    assert "module load python" in message


def test_plan_never_loops_after_a_reexecution():
    found = [("python3.12", "/usr/bin/python3.12")]
    action, message = launcher.plan((3, 8), (3, 9), found, reexecuted_from="/usr/bin/python3 3.6")
    assert action == launcher.FAIL
    assert "started because /usr/bin/python3 3.6 was too old" in message


def test_candidates_are_found_on_path_in_preference_order(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    executable(second / "python3.12", "#!/bin/sh\n")
    executable(first / "python3.10", "#!/bin/sh\n")
    (first / "python3.13").write_text("not executable")
    executable(second / "python3.10", "#!/bin/sh\n")  # shadowed by the one in the first directory
    found = launcher.find_candidates(f"{first}{os.pathsep}{second}")
    assert found == [("python3.12", str(second / "python3.12")), ("python3.10", str(first / "python3.10"))]
    assert launcher.candidate_version("python3.11") == (3, 11)
    assert launcher.candidate_version("python3") is None


def test_the_archive_carries_the_launcher_with_the_computed_minimum(tmp_path):
    pyz = copy_pyz(tmp_path)
    with zipfile.ZipFile(pyz) as archive:
        names = set(archive.namelist())
        main = archive.read("__main__.py").decode()
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(pyz, os.X_OK)
    assert re.search(r"^REQUIRED = \(3, (\d+)\)$", main, re.M)
    for package in ("proxy_agent/__main__.py", "proxy_agent/console/__init__.py", "trio/__init__.py",
                    "attrs/__init__.py", "attr/__init__.py", "sniffio/__init__.py", "outcome/__init__.py",
                    "sortedcontainers/__init__.py", "idna/__init__.py"):
        assert package in names, package
    minimum = int(re.search(r"^REQUIRED = \(3, (\d+)\)$", main, re.M).group(1))
    if minimum < 11:  # trio needs the back-port of exception groups before 3.11
        assert "exceptiongroup/__init__.py" in names
    assert not any(name.endswith((".so", ".pyc")) for name in names)


# --------------------------------------------------------------------------- the file, run from elsewhere


def test_version_and_info_from_another_directory_with_a_clean_environment(tmp_path):
    pyz = copy_pyz(tmp_path / "elsewhere")
    env = clean_env(tmp_path)
    result = run(["./proxy-agent.pyz", "--version"], cwd=pyz.parent, env=env)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"proxy-agent \d+\.\d+\.\d+\n", result.stdout)
    info = run(["./proxy-agent.pyz", "--pyz-info"], cwd=pyz.parent, env=env)
    match = re.fullmatch(r"proxy-agent \S+ python (3\.\d+\.\d+) (\S+) archive (\S+)\n", info.stdout)
    assert match is not None, info.stdout + info.stderr
    assert match.group(3) == str(pyz)
    assert "venv" not in match.group(2)


async def test_a_stdio_session_with_the_file(tmp_path):
    pyz = copy_pyz(tmp_path / "bin")
    client = await AgentClient.spawn([str(pyz), "--stdio"], env=clean_env(tmp_path), cwd=str(tmp_path))
    async with client:
        await client.init()
        assert client.state.initialized
        await client.model_def()
        await client.start_events()
        job = await client.submit("/bin/echo", ["from", "the", "file"])
        await client.wait_job_state(job, "COMPLETED", timeout=scaled(30))
        assert client.job_output(job) == "from the file\n"
        await client.quit()
    assert client.violations == []


def test_the_console_from_the_file_drives_the_agent_in_the_file(tmp_path):
    pyz = copy_pyz(tmp_path / "bin")
    result = run(
        [str(pyz), "console", "-c", "submit /bin/echo hello from one file --wait; jobs"],
        cwd=tmp_path, env=clean_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"\[\d+\.0\] hello from one file", result.stdout)
    assert "COMPLETED" in result.stdout
    assert "Traceback" not in result.stderr
    version = run([str(pyz), "console", "--version"], cwd=tmp_path, env=clean_env(tmp_path))
    assert re.fullmatch(r"proxy-console \d+\.\d+\.\d+\n", version.stdout)


# --------------------------------------------------------------------------- an old python3


def test_too_old_python_and_nothing_newer_says_what_is_needed(tmp_path):
    pyz = copy_pyz(tmp_path / "bin")
    fake = tmp_path / "fake"
    fake.mkdir()
    old_python_shim(fake)
    result = run(["./proxy-agent.pyz", "--version"], cwd=pyz.parent, env=clean_env(tmp_path, path=str(fake)))
    assert result.returncode == launcher.EXIT_NO_PYTHON
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert re.match(r"proxy-agent needs Python 3\.\d+ or newer; this is Python 3\.6 ", lines[0])
    assert "no python3.N >= 3." in lines[0] and "module load python" in lines[0]


def test_too_old_python_reexecutes_a_newer_one_found_on_path(tmp_path):
    pyz = copy_pyz(tmp_path / "bin")
    fake = tmp_path / "fake"
    fake.mkdir()
    old_python_shim(fake)
    log = tmp_path / "started.log"
    logging_python(fake, "python3.10", log)
    env = clean_env(tmp_path, path=str(fake))
    result = run(["./proxy-agent.pyz", "--version"], cwd=pyz.parent, env=env)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"proxy-agent \d+\.\d+\.\d+\n", result.stdout)
    assert log.read_text().split() == [str(fake / "python3.10"), str(pyz), "--version"]
    # A whole session through the re-executed interpreter; the re-execution mark stays out
    # of the jobs' environment.
    log.unlink()
    result = run(["./proxy-agent.pyz", "console", "-c", "submit --wait /usr/bin/env"], cwd=pyz.parent, env=env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"\] HOME=", result.stdout)
    assert launcher.REEXEC_MARK not in result.stdout
    assert log.read_text().startswith(str(fake / "python3.10"))


def test_a_reexecuted_python_that_is_still_too_old_stops_with_one_line(tmp_path):
    pyz = copy_pyz(tmp_path / "bin")
    fake = tmp_path / "fake"
    fake.mkdir()
    old_python_shim(fake)
    old_python_shim(fake, "python3.12", "(3, 8, 0, 'final', 0)")  # its name lies
    result = run(["./proxy-agent.pyz", "--stdio"], cwd=pyz.parent, env=clean_env(tmp_path, path=str(fake)))
    assert result.returncode == launcher.EXIT_NO_PYTHON
    assert len(result.stderr.splitlines()) == 1
    assert "this is Python 3.8" in result.stderr and "was too old" in result.stderr
