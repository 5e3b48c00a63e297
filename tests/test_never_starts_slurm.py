"""Against a real SLURM cluster: a job SLURM will never run is reported within seconds.

The test cluster's debug partition allows an hour; a job asking for three is accepted by
sbatch (the cluster does not enforce partition limits at submission) and stays pending for
ever.  ``submit --wait``
must say so at once instead of waiting out its timeout.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from agent_fixtures import agent_argv, console_argv, subprocess_env
from proxy_agent.service.jobs import NEVER_STARTS
from slurm_support import require_cluster
from wait_support import scaled

pytestmark = pytest.mark.slurm

require_cluster()


def test_submit_wait_reports_a_job_that_asks_for_more_time_than_its_partition_allows():
    name = f"pa-h16-never-{os.getpid()}"
    try:
        # (a wait to the end of its --timeout would outlast the run's own deadline)
        run = subprocess.run(
            console_argv("-q", "-c", f"submit --wait --timeout 3600 -q debug jobName={name} timeLimit=3:00:00 /bin/true",
                         "--spawn", *agent_argv("--scheduler", "slurm")),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(150), env=subprocess_env(),
        )
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, timeout=scaled(30))
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert NEVER_STARTS in last and "(reason Partition" in last, last
    assert "terminate" in last and "Traceback" not in run.stderr


def test_a_job_terminated_before_it_starts_is_ended_in_the_job_list_at_once(tmp_path):
    """terminate, then the agent ends at once (a console script does): the job list says the
    job was killed, not that it is still queued, and it can be forgotten."""
    import json

    name = f"pa-h16-cancel-{os.getpid()}"
    state = str(tmp_path / "state")
    try:
        run = subprocess.run(
            console_argv("-q", "-c", f"submit --sub-id never -q debug jobName={name} timeLimit=3:00:00 /bin/true; "
                         "terminate never", "--spawn", *agent_argv("--scheduler", "slurm", "--state-dir", state)),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(150), env=subprocess_env(),
        )
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, timeout=scaled(30))
    assert run.returncode == 0, run.stderr
    listed = subprocess.run(agent_argv("jobs", "--json", "--state-dir", state), capture_output=True, text=True,
                            timeout=scaled(60), env=subprocess_env())
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["state"] == "KILLED" and row["ended"] is not None, row
    forgotten = subprocess.run(agent_argv("forget", str(row["id"]), "--state-dir", state), capture_output=True,
                               text=True, timeout=scaled(60), env=subprocess_env())
    assert forgotten.returncode == 0 and "forgot 1 job" in forgotten.stdout, forgotten.stderr
