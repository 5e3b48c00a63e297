"""Settings shared by the whole test suite: reproducible property tests.

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

import pytest
from hypothesis import HealthCheck, settings

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
