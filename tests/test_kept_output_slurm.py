"""Against a real SLURM cluster: a batch job's output is kept in the state directory (the
agent removes its spool files once it has read them) and read again with the job's id."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from agent_fixtures import agent_argv, console_argv, subprocess_env
from slurm_support import require_cluster
from wait_support import scaled

pytestmark = pytest.mark.slurm

require_cluster()


def test_a_slurm_jobs_output_is_kept_and_read_by_its_id(tmp_path):
    state = str(tmp_path / "state")
    name = f"pa-kept-{os.getpid()}"
    script = (f"submit --wait -q debug jobName={name} /bin/sh -c 'echo first; echo oops >&2; echo second'; "
              f"output {name}")
    try:
        run = subprocess.run(console_argv("-q", "-c", script, "--spawn",
                                          *agent_argv("--scheduler", "slurm", "--state-dir", state)),
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(240),
                             env=subprocess_env())
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, timeout=scaled(30))
    assert run.returncode == 0, run.stdout + run.stderr
    key = re.search(r"submitted job (\d+) ", run.stdout).group(1)
    # the console's output, then the job list's, after the spool files are gone
    shown = [line for line in run.stdout.splitlines() if line.startswith(f"[{key}.0")]
    assert shown[-3:] == [f"[{key}.0] first", f"[{key}.0] second", f"[{key}.0 err] oops"], run.stdout
    rows = [json.loads(line) for line in subprocess.run(
        agent_argv("jobs", "--json", "--state-dir", state), capture_output=True, text=True, timeout=scaled(60),
        env=subprocess_env()).stdout.splitlines()]
    assert [(row["id"], row["scheduler"]) for row in rows] == [(int(key), "slurm")] and rows[0]["native_id"]
    out = subprocess.run(agent_argv("output", key, "--state-dir", state), capture_output=True, text=True, timeout=scaled(60),
                         env=subprocess_env())
    assert out.stdout == "first\nsecond\n"  # kept in the state directory, whatever became of the spool files
