"""Output files left in the SLURM spool directory by jobs no agent follows any more are
removed by age; files of jobs still followed, fresh files and other files stay."""

from __future__ import annotations

import os
import time

import trio

from proxy_agent.schedulers.common import SPOOL_MAX_AGE, sweep_spool
from proxy_agent.service.model import K
from test_slurm_model import FakeSlurm, job, start

OLD = time.time() - SPOOL_MAX_AGE - 3600


def _file(path, age_from=None):
    path.write_text("output\n")
    if age_from is not None:
        os.utime(path, (age_from, age_from))
    return path


def test_sweep_removes_only_old_output_files_not_kept(tmp_path):
    old_out = _file(tmp_path / "a.1234.out", OLD)
    old_err = _file(tmp_path / "a.1234.err", OLD)
    kept = _file(tmp_path / "b.99.out", OLD)
    fresh = _file(tmp_path / "c.5.out")
    other = _file(tmp_path / "notes.txt", OLD)
    os.symlink("/etc/hostname", tmp_path / "link.out")
    os.utime(tmp_path / "link.out", (OLD, OLD), follow_symlinks=False)
    removed = sweep_spool(str(tmp_path), keep={str(kept)})
    assert sorted(removed) == sorted([str(old_out), str(old_err)])
    assert kept.exists() and fresh.exists() and other.exists() and os.path.islink(tmp_path / "link.out")
    assert sweep_spool(str(tmp_path / "missing"), keep=set()) == []


async def test_the_backend_sweeps_at_start_and_hourly_but_keeps_its_jobs_files(nursery, autojump_clock, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    left = _file(spool / "left.1.out", OLD)
    fake = FakeSlurm()
    slurm = await start(nursery, fake, spool_dir=str(spool))
    await trio.sleep(1)
    assert not left.exists()
    ours = await slurm.submit_ptp(["jobSubId=ours", "execName=prog"])
    slurm_id = slurm.model.attr(ours, K.NATIVE_ID)
    fake.jobs[slurm_id] = job(slurm_id, "RUNNING")
    files = slurm.backend._by_element[ours].spool_files
    for path in files:
        with open(path, "w"):
            pass
        os.utime(path, (OLD, OLD))  # a quiet job: its files look old
    later = _file(spool / "later.2.err", OLD)
    await trio.sleep(3700)
    assert not later.exists()
    assert all(os.path.exists(path) for path in files)

