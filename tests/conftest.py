"""Settings shared by the whole test suite: reproducible property tests, the test clusters,
deadlines for a busy machine, and a run that leaves nothing behind.

Three environment variables govern a run (README.md, "Tests"):

* ``PROXY_AGENT_TEST_CLUSTERS`` (``all``, or some of ``slurm,sge,ssh``; default none): which
  test clusters the tests marked ``slurm``, ``sge`` and ``ssh`` run against; the others skip.
  See ``cluster_support``.
* ``PROXY_AGENT_TEST_TIMEOUT_SCALE`` (default 1): every deadline of every wait is multiplied
  by it.  See ``wait_support``.
* ``HYPOTHESIS_PROFILE`` (below).

Everything a run makes goes into an area of its own, which is removed at the end; processes
still running, scheduler jobs still queued or running and an area that cannot be removed are
reported as left behind, and fail the run.  See ``leftover_support``.

Property tests (hypothesis) run under one of two profiles, chosen by the
environment variable ``HYPOTHESIS_PROFILE``:

* ``ci`` (the default, so also what ``scripts/test`` and CI run): derandomized.
  Every run draws the same examples, and no example database is read or
  written, so a result never depends on chance or on earlier runs: a run that
  passes once passes again on the same code.
* ``explore``: random examples on every run, ten times as many for tests
  that do not fix their own count, and failures remembered in ``.hypothesis/``
  and replayed first next time.  This is how new counterexamples are found::

      HYPOTHESIS_PROFILE=explore scripts/test -q -k "wire or session or dialect"

  A counterexample found this way belongs in the suite as an explicit example
  (``@example(...)``), so that the ``ci`` profile checks it from then on.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

import cluster_support
import leftover_support
import wait_support

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    deadline=None,
    max_examples=1000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "explore"):
    raise SystemExit(f"HYPOTHESIS_PROFILE must be 'ci' or 'explore', not {_PROFILE!r}")
settings.load_profile(_PROFILE)


@pytest.fixture(autouse=True)
def _no_service_left_behind(request):
    """The services the test's agents started (in the state homes it made, or under its
    tmp_path) are stopped when it ends: a service outlives the launches that started it."""
    from agent_fixtures import STATE_HOMES, stop_services

    made = len(STATE_HOMES)
    yield
    roots = STATE_HOMES[made:]
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp_path is not None:
        roots.append(str(tmp_path))
    stop_services(roots)


# ---------------------------------------------------------------------------- the run's area

_AREA = pytest.StashKey[leftover_support.RunArea]()
_LEFTOVERS = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    try:
        wait_support.timeout_scale()
        cluster_support.wanted()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    area = leftover_support.RunArea.create()
    config.stash[_AREA] = area
    os.environ.update(area.environment())
    tempfile.tempdir = str(area.tmp)
    if not config.option.basetemp:
        config.option.basetemp = str(area.root / "pytest")


def pytest_report_header(config: pytest.Config) -> list:
    wanted = cluster_support.wanted()
    clusters = ", ".join(k for k in cluster_support.KINDS if k in wanted) or "none"
    return [
        f"test clusters: {clusters} ({cluster_support.CLUSTERS_VARIABLE}); "
        f"deadlines x{wait_support.timeout_scale():g} ({wait_support.SCALE_VARIABLE})",
        f"this run's files: {config.stash[_AREA].root} (removed at the end)",
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    wanted = cluster_support.wanted()
    for item in items:
        for kind in cluster_support.KINDS:
            if kind not in wanted and item.get_closest_marker(kind) is not None:
                item.add_marker(pytest.mark.skip(reason=cluster_support.off_reason(kind)))


def _require(kind: str) -> None:
    if kind == "slurm":
        import slurm_support

        slurm_support.require_cluster()
    elif kind == "sge":
        import sge_support

        sge_support.require_cell()
    else:
        import ssh_support

        ssh_support.require_sshd()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Processes the test starts carry its name: a leftover says who started it.
    os.environ[leftover_support.TEST_VARIABLE] = item.nodeid
    for kind in cluster_support.KINDS:
        if item.get_closest_marker(kind) is not None:
            _require(kind)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    area = session.config.stash.get(_AREA, None)
    if area is None:
        return
    os.environ.pop(leftover_support.TEST_VARIABLE, None)
    leftovers = leftover_support.noted()
    processes = leftover_support.wait_for_processes(area, wait_support.scaled(leftover_support.PROCESS_GRACE))
    leftover_support.kill_processes(processes)
    leftovers += processes
    slurm = leftover_support.slurm_jobs(area)
    leftover_support.cancel_slurm_jobs(slurm)
    sge = leftover_support.sge_jobs(area)
    leftover_support.delete_sge_jobs(sge)
    leftovers += slurm + sge + leftover_support.remove_area(area)
    session.config.stash[_LEFTOVERS] = leftovers
    if leftovers and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    leftovers = config.stash.get(_LEFTOVERS, [])
    if leftovers:
        terminalreporter.section("left behind by this run", red=True, bold=True)
        for leftover in leftovers:
            terminalreporter.write_line(leftover.line(), red=True)
        terminalreporter.write_line(f"{len(leftovers)} thing(s) left behind (now removed): the run fails", red=True,
                                    bold=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    area = config.stash.get(_AREA, None)
    if area is not None:
        leftover_support.remove_area(area)  # when no session ran (--help, a usage error)
